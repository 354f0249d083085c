"""jax-flashstable: the numerics of BF16 flash attention, visible and verifiable."""
from jax_flashstable.attention import (AttentionStats, flash_attention, reference_attention,
                                       reference_attention_vjp)

__all__ = ["AttentionStats", "flash_attention", "reference_attention", "reference_attention_vjp"]
