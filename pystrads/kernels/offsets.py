"""Bucket offsets of a counting sort, shared by the kernels that regroup entries by a key
(tokens by document in :mod:`pystrads.kernels.lda.counts`, non-zeros by column in
:mod:`pystrads.kernels.cd`).  No Spark, no validation."""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def bucket_offsets(keys, num_buckets):
    """``ptr`` (int64[num_buckets + 1]): bucket ``b`` holds ``ptr[b]:ptr[b + 1]`` once the entries
    are grouped by key (keys in ``[0, num_buckets)``)."""
    ptr = np.zeros(num_buckets + 1, dtype=np.int64)
    for i in range(keys.shape[0]):
        ptr[keys[i] + 1] += 1
    for b in range(num_buckets):
        ptr[b + 1] += ptr[b]
    return ptr
