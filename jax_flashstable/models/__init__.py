"""GPT-2 in flax.nnx (`gpt2`)."""
