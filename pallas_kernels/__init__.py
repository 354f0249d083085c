"""Pallas flash-attention kernels (Triton on GPU, interpret mode on CPU) and their references."""
