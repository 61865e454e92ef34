"""Attention and fp8 kernels: Triton where CUDA and Triton are present, each beside its torch reference."""
