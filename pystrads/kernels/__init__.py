"""Numba kernels (numpy and numba only; no Spark, no Arrow)."""
