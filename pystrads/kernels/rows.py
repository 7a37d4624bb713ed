"""Row blocks as their non-zero entries (CSR) and back, for the shards' sparse reads and writes.

:func:`to_csr` turns a ``(n, width)`` block into ``(offsets, cols, vals)``;
:func:`csr_into` writes such entries into a dense block, :func:`csr_add` adds
them to rows of a table.  One pass each, in numba: with numpy (``nonzero``,
``bincount``, fancy indexing) encoding a 2 MB block cost 2-3 ms, more than
sending it dense saved.
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def to_csr(values):
    """``(offsets int32[n + 1], cols int32[nnz], vals[nnz])``: the non-zero entries of each row
    of ``values`` (n, width), columns ascending within a row."""
    n, width = values.shape
    offsets = np.zeros(n + 1, dtype=np.int32)
    nnz = 0
    for r in range(n):
        for c in range(width):
            if values[r, c] != 0:
                nnz += 1
        offsets[r + 1] = nnz
    cols = np.empty(nnz, dtype=np.int32)
    vals = np.empty(nnz, dtype=values.dtype)
    k = 0
    for r in range(n):
        for c in range(width):
            x = values[r, c]
            if x != 0:
                cols[k] = c
                vals[k] = x
                k += 1
    return offsets, cols, vals


@njit(cache=True, nogil=True)
def csr_into(offsets, cols, vals, out, row0):
    """Rows ``row0, row0 + 1, ...`` of ``out`` become the CSR rows (zero elsewhere)."""
    n = offsets.shape[0] - 1
    width = out.shape[1]
    for r in range(n):
        for c in range(width):
            out[row0 + r, c] = 0
        for k in range(offsets[r], offsets[r + 1]):
            out[row0 + r, cols[k]] = vals[k]


@njit(cache=True, nogil=True)
def csr_add(values, index, offsets, cols, vals, replace):
    """``values[index[r], cols[k]] += vals[k]`` for row r's entries k (``replace``: the rows are
    zeroed first, so they become the entries: a put).  Repeated rows add up."""
    n = offsets.shape[0] - 1
    width = values.shape[1]
    if replace:
        for r in range(n):
            for c in range(width):
                values[index[r], c] = 0
    for r in range(n):
        row = index[r]
        for k in range(offsets[r], offsets[r + 1]):
            values[row, cols[k]] += vals[k]
