"""Row blocks as their non-zero entries (CSR) and back, for the shards' sparse reads and writes.

:func:`to_csr` turns a ``(n, width)`` block into ``(offsets, cols, vals)``;
:func:`csr_into` writes such entries into a dense block (:func:`csr_gather_into`
some of their rows, anywhere in it), :func:`csr_add` adds
them to rows of a table, :func:`csr_delta` gives a block's change since it held
some entries.  One pass each, in numba: with numpy (``nonzero``,
``bincount``, fancy indexing) encoding a 2 MB block cost 2-3 ms, more than
sending it dense saved.  :func:`row_hashes` gives each CSR row a 128-bit hash of
its content (the linear programs' canonical row order).
"""

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def emit_nonzeros(row, cols, vals, k):
    """Write the non-zero entries of the dense ``row`` at ``cols[k:]`` / ``vals[k:]``, columns
    ascending; returns the next free position."""
    for c in range(row.shape[0]):
        x = row[c]
        if x != 0:
            cols[k] = c
            vals[k] = x
            k += 1
    return k


@njit(cache=True, inline="always")
def grow_pair(a, b, used, size):
    """Two arrays grown to ``size`` entries, their first ``used`` kept (an output of unknown
    length, doubled as it fills)."""
    a2 = np.empty(size, dtype=a.dtype)
    b2 = np.empty(size, dtype=b.dtype)
    a2[:used] = a[:used]
    b2[:used] = b[:used]
    return a2, b2


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
        k = emit_nonzeros(values[r], cols, vals, k)
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
def csr_gather_into(offsets, cols, vals, rows, out, out_rows):
    """``out[out_rows[j]]`` gets the entries of CSR row ``rows[j]`` (its other columns untouched:
    a zeroed ``out`` becomes those rows)."""
    for j in range(rows.shape[0]):
        r = rows[j]
        o = out_rows[j]
        for k in range(offsets[r], offsets[r + 1]):
            out[o, cols[k]] = vals[k]


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


@njit(cache=True, nogil=True)
def csr_delta(values, offsets, cols, vals):
    """What changed in a block since it held the CSR entries ``(offsets, cols, vals)``, in one
    pass over it: ``(rows int64, d_offsets int64, d_cols int32, d_vals)``, the changed rows
    (ascending) and ``values[row] - before[row]`` as their non-zero entries -- a sparse
    write's arguments, without a copy of the block or a dense difference.  Per row the old
    entries are scattered into a zeroed row, the difference is taken in one vectorised pass
    and its non-zeros emitted (a branch on every column of a merge measured 6x slower)."""
    n, width = values.shape
    d_rows = np.empty(n, dtype=np.int64)
    d_offsets = np.zeros(n + 1, dtype=np.int64)
    cap = max(16, 2 * (offsets[n] - offsets[0]))
    d_cols = np.empty(cap, dtype=np.int32)
    d_vals = np.empty(cap, dtype=values.dtype)
    old = np.zeros(width, dtype=values.dtype)
    diff = np.empty(width, dtype=values.dtype)
    m = 0
    k_out = 0
    for r in range(n):
        lo, hi = offsets[r], offsets[r + 1]
        for k in range(lo, hi):
            old[cols[k]] = vals[k]
        changed = 0
        for c in range(width):
            x = values[r, c] - old[c]
            diff[c] = x
            changed += x != 0
        for k in range(lo, hi):
            old[cols[k]] = 0
        if changed == 0:
            continue
        if k_out + changed > d_cols.shape[0]:
            d_cols, d_vals = grow_pair(d_cols, d_vals, k_out, max(2 * d_cols.shape[0], k_out + changed))
        k_out = emit_nonzeros(diff, d_cols, d_vals, k_out)
        d_rows[m] = r
        m += 1
        d_offsets[m] = k_out
    return d_rows[:m].copy(), d_offsets[:m + 1].copy(), d_cols[:k_out].copy(), d_vals[:k_out].copy()


_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)
_M4 = np.uint64(0xD6E8FEB86659FD93)


@njit(cache=True, inline="always")
def _mix(h):
    """splitmix64's finaliser: every input bit reaches every output bit."""
    h = (h ^ (h >> np.uint64(30))) * _M2
    h = (h ^ (h >> np.uint64(27))) * _M3
    return h ^ (h >> np.uint64(31))


@njit(cache=True, nogil=True)
def row_hashes(row_ptr, col_bits, val_bits, y_bits, w_bits):
    """Two independent 64-bit hashes of each CSR row's content -- its label, weight, column
    indices and values, all given as their 64-bit patterns (``.view(np.uint64)``), in order --
    so that equal rows hash equal and distinct rows collide with probability ~2^-128."""
    n = row_ptr.shape[0] - 1
    h1 = np.empty(n, dtype=np.uint64)
    h2 = np.empty(n, dtype=np.uint64)
    for i in range(n):
        a = _mix(y_bits[i] ^ _M1) ^ w_bits[i]
        b = _mix(w_bits[i] ^ _M4) ^ y_bits[i]
        a = _mix(a + np.uint64(row_ptr[i + 1] - row_ptr[i]))
        b = _mix(b ^ np.uint64(row_ptr[i + 1] - row_ptr[i]))
        for k in range(row_ptr[i], row_ptr[i + 1]):
            a = _mix((a ^ col_bits[k]) * _M1 + val_bits[k])
            b = _mix((b + val_bits[k]) * _M4 ^ col_bits[k])
        h1[i] = a
        h2[i] = b
    return h1, h2
