"""Lowerings of a checked program: numba and CUDA kernels, command programs, control-VM code."""
