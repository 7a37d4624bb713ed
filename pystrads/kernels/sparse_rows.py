"""A table whose rows are stored by how full they are: as (column, value) pairs, or dense.

The store behind the shards' ``sparse`` tables (:class:`pystrads.ps.table.SparseShardTable`),
as flat numpy arrays and numba kernels over them (LightLDA's hybrid rows: a row is
dense once more than a fraction of its width is non-zero, pairs below):

``slot`` int32[n]
    -1 for a row kept as pairs, else its row in ``dense`` (width columns).
``pos`` int64[n], ``cap`` int32[n]
    where a pair row's entries start in the pool, and how many fit there.
``nnz`` int32[n]
    non-zero entries of every row (pair rows hold exactly these, columns ascending,
    no zero values; dense rows count theirs as writes change them).
``pcols`` int32[P], ``pvals``[P]
    the pool of pair entries; ``meta[0]`` entries used, ``meta[1]`` of them garbage
    (left behind when a row moved or became dense), ``meta[2]`` dense rows used.

A write (:func:`merge_rows`) merges each row's sorted incoming entries with its
pairs (zero sums vanish, so memory follows the non-zeros); a row that outgrows its
capacity moves to the pool's end with twice the room, a row past ``max_pairs``
entries becomes dense.  The caller makes room first (:func:`room_needed`, then
:func:`compact` or a larger pool): a kernel never reallocates.
"""

import numpy as np
from numba import njit

from .rows import emit_nonzeros

#: meta entries: pool entries used, pool entries that are garbage, dense rows used
USED, GARBAGE, DENSE_USED = 0, 1, 2


@njit(cache=True, inline="always")
def _grown(n):
    """Capacity for a pair row of ``n`` entries: room to double before it moves again."""
    return max(4, 2 * n)


@njit(cache=True, nogil=True)
def csr_is_canonical(offsets, cols):
    """Whether every row's columns are strictly increasing (sorted, each once)."""
    for r in range(offsets.shape[0] - 1):
        for k in range(offsets[r] + 1, offsets[r + 1]):
            if cols[k] <= cols[k - 1]:
                return False
    return True


@njit(cache=True, nogil=True)
def room_needed(slot, nnz, cap, rows, offsets, replace, max_pairs):
    """``(pool entries, dense rows)`` a :func:`merge_rows` of these rows may take at most
    (``rows`` each once)."""
    pool = 0
    dense = 0
    for r in range(rows.shape[0]):
        row = rows[r]
        if slot[row] >= 0:
            continue
        m = offsets[r + 1] - offsets[r]
        bound = m if replace else nnz[row] + m
        if bound > max_pairs:  # may end dense, or (entries cancelling) as pairs up to the limit
            dense += 1
            bound = max_pairs
        if bound > cap[row]:
            pool += _grown(bound)
    return pool, dense


@njit(cache=True, nogil=True)
def merge_rows(slot, pos, cap, nnz, pcols, pvals, dense, meta, rows, offsets, cols, vals, replace, max_pairs):
    """``row[rows[r]][cols[k]] += vals[k]`` for row r's entries k (``replace``: the rows become
    the entries, a put).  ``rows`` each once, each row's ``cols`` strictly increasing; the room
    :func:`room_needed` named must be free."""
    width = dense.shape[1]
    s_cols = np.empty(width, dtype=np.int32)
    s_vals = np.empty(width, dtype=pvals.dtype)
    for r in range(rows.shape[0]):
        row = rows[r]
        lo, hi = offsets[r], offsets[r + 1]
        d = slot[row]
        if d >= 0:  # a dense row: add in place, counting the entries that appear and vanish
            count = nnz[row]
            if replace:
                for c in range(width):
                    dense[d, c] = 0
                count = 0
            for k in range(lo, hi):
                c = cols[k]
                before = dense[d, c]
                after = before + vals[k]
                dense[d, c] = after
                if before == 0 and after != 0:
                    count += 1
                elif before != 0 and after == 0:
                    count -= 1
            nnz[row] = count
            continue
        # a pair row: merge its entries (none with replace) with the incoming ones
        p, n = pos[row], nnz[row]
        if replace:
            n = 0
        i, k, out = 0, lo, 0
        while i < n or k < hi:
            if k >= hi or (i < n and pcols[p + i] < cols[k]):
                s_cols[out] = pcols[p + i]
                s_vals[out] = pvals[p + i]
                i += 1
                out += 1
            elif i >= n or cols[k] < pcols[p + i]:
                if vals[k] != 0:
                    s_cols[out] = cols[k]
                    s_vals[out] = vals[k]
                    out += 1
                k += 1
            else:
                x = pvals[p + i] + vals[k]
                if x != 0:
                    s_cols[out] = cols[k]
                    s_vals[out] = x
                    out += 1
                i += 1
                k += 1
        if out > max_pairs:  # too full for pairs: the row becomes dense
            d = meta[DENSE_USED]
            if d >= dense.shape[0]:
                raise IndexError("sparse rows: no free dense row (room_needed undercounted)")
            meta[DENSE_USED] = d + 1
            for c in range(width):
                dense[d, c] = 0
            for j in range(out):
                dense[d, s_cols[j]] = s_vals[j]
            slot[row] = d
            meta[GARBAGE] += cap[row]
            cap[row] = 0
            pos[row] = 0
            nnz[row] = out
            continue
        if out > cap[row]:  # move to the pool's end with room to grow
            p = meta[USED]
            if p + _grown(out) > pcols.shape[0]:
                raise IndexError("sparse rows: the pool is full (room_needed undercounted)")
            meta[GARBAGE] += cap[row]
            cap[row] = _grown(out)
            meta[USED] = p + cap[row]
            pos[row] = p
        for j in range(out):
            pcols[p + j] = s_cols[j]
            pvals[p + j] = s_vals[j]
        nnz[row] = out


@njit(cache=True, nogil=True)
def read_dense(slot, pos, nnz, pcols, pvals, dense, rows, out):
    """``out[r] = row[rows[r]]`` as dense values."""
    width = out.shape[1]
    for r in range(rows.shape[0]):
        row = rows[r]
        d = slot[row]
        if d >= 0:
            for c in range(width):
                out[r, c] = dense[d, c]
        else:
            for c in range(width):
                out[r, c] = 0
            p = pos[row]
            for j in range(nnz[row]):
                out[r, pcols[p + j]] = pvals[p + j]


@njit(cache=True, nogil=True)
def read_csr(slot, pos, nnz, pcols, pvals, dense, rows):
    """``(offsets int32[n + 1], cols int32, vals)``: the non-zero entries of the rows, columns
    ascending (the wire's sparse rows)."""
    n = rows.shape[0]
    offsets = np.zeros(n + 1, dtype=np.int32)
    for r in range(n):
        offsets[r + 1] = offsets[r] + nnz[rows[r]]
    cols = np.empty(offsets[n], dtype=np.int32)
    vals = np.empty(offsets[n], dtype=pvals.dtype)
    for r in range(n):
        row = rows[r]
        k = offsets[r]
        d = slot[row]
        if d >= 0:
            k = emit_nonzeros(dense[d], cols, vals, k)
        else:
            p = pos[row]
            for j in range(nnz[row]):
                cols[k] = pcols[p + j]
                vals[k] = pvals[p + j]
                k += 1
    return offsets, cols, vals


@njit(cache=True, nogil=True)
def compact(slot, pos, cap, nnz, pcols, pvals, dense, pool_size, dense_size, min_pairs):
    """A fresh pool of ``pool_size`` entries holding the live pair rows back to back (each with
    the room :func:`_grown` gives), and a fresh dense block of ``dense_size`` rows holding the
    dense rows; dense rows with at most ``min_pairs`` entries become pairs again.  Updates
    ``slot``, ``pos`` and ``cap`` in place; returns ``(pcols, pvals, dense, used, dense_used)``."""
    n = slot.shape[0]
    width = dense.shape[1]
    new_cols = np.empty(pool_size, dtype=np.int32)
    new_vals = np.empty(pool_size, dtype=pvals.dtype)
    new_dense = np.empty((dense_size, width), dtype=dense.dtype)
    used = 0
    dused = 0
    for row in range(n):
        d = slot[row]
        if d >= 0 and nnz[row] > min_pairs:
            for c in range(width):
                new_dense[dused, c] = dense[d, c]
            slot[row] = dused
            dused += 1
            continue
        room = _grown(nnz[row]) if nnz[row] else 0
        if d >= 0:  # back to pairs
            emit_nonzeros(dense[d], new_cols, new_vals, used)
            slot[row] = -1
        else:
            p = pos[row]
            for j in range(nnz[row]):
                new_cols[used + j] = pcols[p + j]
                new_vals[used + j] = pvals[p + j]
        pos[row] = used
        cap[row] = room
        used += room
    return new_cols, new_vals, new_dense, used, dused


@njit(cache=True, nogil=True)
def live_room(slot, nnz, min_pairs):
    """``(pool entries, dense rows)`` the live rows take after :func:`compact`."""
    pool = 0
    dense = 0
    for row in range(slot.shape[0]):
        if slot[row] >= 0 and nnz[row] > min_pairs:
            dense += 1
        elif nnz[row]:
            pool += _grown(nnz[row])
    return pool, dense


@njit(cache=True, nogil=True)
def rows_with_entries(nnz, lo, hi):
    """The rows of ``[lo, hi)`` that hold a non-zero value (local indexes)."""
    count = 0
    for row in range(lo, hi):
        if nnz[row]:
            count += 1
    out = np.empty(count, dtype=np.int64)
    k = 0
    for row in range(lo, hi):
        if nnz[row]:
            out[k] = row
            k += 1
    return out
