"""Coordinate-descent kernels for sparse linear models (Lasso, L1 logistic regression).

A worker's rows of X are stored column-wise (CSC) so one coefficient's
partial sums touch only its column's non-zeros:

``col_ptr`` int64[J + 1], ``row_idx`` int32[nnz], ``vals`` float64[nnz]
    the non-zeros of column j are ``row_idx/vals[col_ptr[j]:col_ptr[j+1]]``.

A coordinate index equal to ``J`` (one past the last column) stands for
the intercept: an implicit column of ones over every row.

The scheduler's dependency check (STRADS Lasso: no two coefficients whose
columns correlate by ``|x_j^T x_k| >= rho`` in the same round) runs on a
row sample stored the same way, with columns scaled to unit norm.

Kernels never validate input.
"""

import numpy as np
from numba import njit

from .offsets import bucket_offsets
from .rows import grow_pair


@njit(cache=True, nogil=True)
def rows_to_csc(row_ptr, col_idx, vals, num_cols):
    """CSR rows (``row_ptr``, ``col_idx``, ``vals``) -> CSC (``col_ptr``, ``row_idx``, ``vals``).

    Duplicate (row, column) entries are kept (their products add up, as a sum
    of vectors would)."""
    nnz = col_idx.shape[0]
    col_ptr = bucket_offsets(col_idx, num_cols)
    pos = col_ptr[:-1].copy()
    out_rows = np.empty(nnz, dtype=np.int32)
    out_vals = np.empty(nnz, dtype=np.float64)
    for i in range(row_ptr.shape[0] - 1):
        for k in range(row_ptr[i], row_ptr[i + 1]):
            j = col_idx[k]
            p = pos[j]
            out_rows[p] = i
            out_vals[p] = vals[k]
            pos[j] = p + 1
    return col_ptr, out_rows, out_vals


@njit(cache=True, nogil=True)
def ordered_rows_to_csc(row_ptr, col_idx, vals, order, num_cols):
    """:func:`rows_to_csc` of the CSR rows taken in the order ``order`` (row ``i`` of the result is
    row ``order[i]`` of the input), without building the reordered CSR arrays first."""
    nnz = col_idx.shape[0]
    col_ptr = bucket_offsets(col_idx, num_cols)
    pos = col_ptr[:-1].copy()
    out_rows = np.empty(nnz, dtype=np.int32)
    out_vals = np.empty(nnz, dtype=np.float64)
    for i in range(order.shape[0]):
        r = order[i]
        for k in range(row_ptr[r], row_ptr[r + 1]):
            j = col_idx[k]
            p = pos[j]
            out_rows[p] = i
            out_vals[p] = vals[k]
            pos[j] = p + 1
    return col_ptr, out_rows, out_vals


@njit(cache=True, nogil=True)
def csc_row_subset(col_ptr, row_idx, vals, new_row):
    """The CSC columns restricted to the rows with ``new_row[i] >= 0``, renumbered ``new_row[i]``:
    ``(col_ptr, row_idx (int32), vals)`` of the subset, entries in their original order."""
    num_cols = col_ptr.shape[0] - 1
    sub_ptr = np.zeros(num_cols + 1, dtype=np.int64)
    for j in range(num_cols):
        c = 0
        for p in range(col_ptr[j], col_ptr[j + 1]):
            if new_row[row_idx[p]] >= 0:
                c += 1
        sub_ptr[j + 1] = sub_ptr[j] + c
    out_rows = np.empty(sub_ptr[num_cols], dtype=np.int32)
    out_vals = np.empty(sub_ptr[num_cols], dtype=np.float64)
    q = 0
    for j in range(num_cols):
        for p in range(col_ptr[j], col_ptr[j + 1]):
            r = new_row[row_idx[p]]
            if r >= 0:
                out_rows[q] = r
                out_vals[q] = vals[p]
                q += 1
    return sub_ptr, out_rows, out_vals


@njit(cache=True, nogil=True)
def column_sums(col_ptr, row_idx, vals, w, sum_x, sum_xx):
    """``sum_x[j] += sum_i w_i x_ij``, ``sum_xx[j] += sum_i w_i x_ij^2`` for every column."""
    for j in range(col_ptr.shape[0] - 1):
        a = 0.0
        b = 0.0
        for p in range(col_ptr[j], col_ptr[j + 1]):
            wx = w[row_idx[p]] * vals[p]
            a += wx
            b += wx * vals[p]
        sum_x[j] += a
        sum_xx[j] += b


@njit(cache=True, nogil=True)
def column_dots(col_ptr, row_idx, vals, coords, v, out):
    """``out[k] = sum_i x_i,coords[k] * v_i`` (coordinate ``J`` = the intercept: ``sum v``)."""
    J = col_ptr.shape[0] - 1
    for k in range(coords.shape[0]):
        j = coords[k]
        acc = 0.0
        if j == J:
            for i in range(v.shape[0]):
                acc += v[i]
        else:
            for p in range(col_ptr[j], col_ptr[j + 1]):
                acc += vals[p] * v[row_idx[p]]
        out[k] = acc


@njit(cache=True, nogil=True)
def column_dots2(col_ptr, row_idx, vals, coords, u, h, out_u, out_h):
    """``out_u[k] = sum x u``, ``out_h[k] = sum x^2 h`` over column ``coords[k]`` (``J``: intercept)."""
    J = col_ptr.shape[0] - 1
    for k in range(coords.shape[0]):
        j = coords[k]
        a = 0.0
        b = 0.0
        if j == J:
            for i in range(u.shape[0]):
                a += u[i]
                b += h[i]
        else:
            for p in range(col_ptr[j], col_ptr[j + 1]):
                i = row_idx[p]
                x = vals[p]
                a += x * u[i]
                b += x * x * h[i]
        out_u[k] = a
        out_h[k] = b


@njit(cache=True, nogil=True)
def all_column_dots(col_ptr, row_idx, vals, v, out):
    """``out[j] = sum_i x_ij v_i`` for every column j (``out`` has J entries)."""
    for j in range(col_ptr.shape[0] - 1):
        acc = 0.0
        for p in range(col_ptr[j], col_ptr[j + 1]):
            acc += vals[p] * v[row_idx[p]]
        out[j] = acc


@njit(cache=True, nogil=True)
def add_columns(col_ptr, row_idx, vals, coords, delta, target, sign):
    """``target += sign * X[:, coords] @ delta`` (coordinate ``J``: every row); zero deltas skipped."""
    J = col_ptr.shape[0] - 1
    for k in range(coords.shape[0]):
        d = delta[k]
        if d == 0.0:
            continue
        j = coords[k]
        s = sign * d
        if j == J:
            for i in range(target.shape[0]):
                target[i] += s
        else:
            for p in range(col_ptr[j], col_ptr[j + 1]):
                target[row_idx[p]] += s * vals[p]


@njit(cache=True, nogil=True)
def logistic_terms(margin, y, w, u, h):
    """For labels y in {0, 1}: ``u = w (sigmoid(m) - y)`` and ``h = w s (1 - s)``;
    returns the weighted log-loss ``sum w (log(1 + e^m) - y m)``."""
    loss = 0.0
    for i in range(margin.shape[0]):
        m = margin[i]
        if m >= 0:
            e = np.exp(-m)
            s = 1.0 / (1.0 + e)
            softplus = m + np.log1p(e)
        else:
            e = np.exp(m)
            s = e / (1.0 + e)
            softplus = np.log1p(e)
        u[i] = w[i] * (s - y[i])
        h[i] = w[i] * s * (1.0 - s)
        loss += w[i] * (softplus - y[i] * m)
    return loss


def plan_rounds(stream, max_per_round, max_examined, max_rounds, num_cols, s_ptr, s_rows, s_vals, rho, max_row,
                method: str = "auto"):
    """Cut a stream of candidate coordinates into rounds (STRADS Lasso's correlation checker):
    see :func:`_plan_rounds`.  The check runs one of two ways, with the same rounds:

    - ``"lists"``: each candidate's sampled rows are matched against the columns the round has
      kept so far (row by row, linked lists): a candidate costs its sampled non-zeros times the
      kept columns per sampled row, i.e. grows with the round's width;
    - ``"graph"``: the pairs of the stream's distinct columns that correlate by ``>= rho`` are
      found once (:func:`conflict_graph`, a sparse product over the sample's rows), and a
      candidate costs its few conflicts.  It pays when few distinct columns recur in many
      rounds (a working set, many passes a step): the pairs cost ``sum_r c_r^2`` over the
      sample's rows (``c_r``: the distinct columns on row r), far below the lists' cost there
      (a 2 000-column working set in 100 passes: 0.02 s against 0.28 s), and far above it
      when every column comes once (200 000 columns: 14 s against 0.4 s).

    ``"auto"`` takes the cheaper by those estimates."""
    stream = np.asarray(stream, dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    if rho > 0 and method != "lists" and len(stream):
        cols = np.unique(stream)
        cols = cols[cols < num_cols]
        sampled = s_ptr[cols + 1] - s_ptr[cols]
        if len(cols) and sampled.sum():
            per_row = np.bincount(_sampled_rows(s_ptr, s_rows, cols), minlength=max_row).astype(np.float64)
            pairs = float(per_row @ per_row)
            nnz_per_col = sampled.sum() / len(cols)
            kept = min(max_per_round, len(cols)) * nnz_per_col / max(max_row, 1) / 2.0  # kept per sampled row
            lists = len(stream) * nnz_per_col * max(kept, 1.0)
            if method == "graph" or pairs < 2.0 * lists:  # measured: ~30 ns a pair, ~60 ns a list visit
                pos = np.full(num_cols + 1, -1, dtype=np.int64)
                pos[cols] = np.arange(len(cols))
                conf_ptr, conf_idx = conflict_graph(cols, s_ptr, s_rows, s_vals, rho, max_row)
                return _plan_rounds(stream, max_per_round, max_examined, max_rounds, num_cols, s_ptr, s_rows,
                                    s_vals, rho, max_row, pos, conf_ptr, conf_idx)
    return _plan_rounds(stream, max_per_round, max_examined, max_rounds, num_cols, s_ptr, s_rows, s_vals, rho,
                        max_row, none, none, none)


def _sampled_rows(s_ptr, s_rows, cols):
    """The sample's row indices of columns ``cols``, concatenated."""
    starts, stops = s_ptr[cols], s_ptr[cols + 1]
    lengths = stops - starts
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return s_rows[offsets + np.arange(lengths.sum())]


@njit(cache=True, nogil=True)
def _rows_of_columns(col_ptr, row_idx, vals, coords, num_rows):
    """The rows of the columns ``coords`` (CSR over their positions a): row i holds the
    positions ``which[count[i]:count[i + 1]]`` with their values ``value[...]``."""
    m = coords.shape[0]
    count = np.zeros(num_rows + 1, dtype=np.int64)
    for a in range(m):
        j = coords[a]
        for p in range(col_ptr[j], col_ptr[j + 1]):
            count[row_idx[p] + 1] += 1
    for i in range(num_rows):
        count[i + 1] += count[i]
    fill = count[:-1].copy()
    which = np.empty(count[num_rows], dtype=np.int64)
    value = np.empty(count[num_rows], dtype=np.float64)
    for a in range(m):
        j = coords[a]
        for p in range(col_ptr[j], col_ptr[j + 1]):
            i = row_idx[p]
            which[fill[i]] = a
            value[fill[i]] = vals[p]
            fill[i] += 1
    return count, which, value


@njit(cache=True, nogil=True)
def conflict_graph(cols, s_ptr, s_rows, s_vals, rho, num_rows):
    """The pairs of columns ``cols`` (distinct, each ``< J``) whose sampled columns correlate by
    ``|x_a' x_b| >= rho``, as CSR by position in ``cols``: the columns (ids) that conflict with
    ``cols[a]`` are ``conf_idx[conf_ptr[a]:conf_ptr[a + 1]]``.  A sparse product over the
    sample's rows restricted to ``cols`` (Gustavson's, as :func:`gram_entries`): one
    multiply-add per pair of the columns' non-zeros sharing a row."""
    m = cols.shape[0]
    count, which, value = _rows_of_columns(s_ptr, s_rows, s_vals, cols, num_rows)
    acc = np.zeros(m, dtype=np.float64)
    stamp = np.full(m, -1, dtype=np.int64)
    touched = np.empty(m, dtype=np.int64)
    first = np.empty(16, dtype=np.int64)
    second = np.empty(16, dtype=np.int64)
    n_pairs = 0
    for a in range(m):
        j = cols[a]
        n_touched = 0
        for p in range(s_ptr[j], s_ptr[j + 1]):
            i = s_rows[p]
            v = s_vals[p]
            for q in range(count[i], count[i + 1]):
                b = which[q]
                if b <= a:
                    continue
                if stamp[b] != a:
                    stamp[b] = a
                    acc[b] = 0.0
                    touched[n_touched] = b
                    n_touched += 1
                acc[b] += v * value[q]
        for t in range(n_touched):
            b = touched[t]
            if abs(acc[b]) >= rho:
                if n_pairs == first.shape[0]:
                    first, second = grow_pair(first, second, n_pairs, 2 * n_pairs)
                first[n_pairs] = a
                second[n_pairs] = b
                n_pairs += 1
    conf_ptr = np.zeros(m + 1, dtype=np.int64)
    for k in range(n_pairs):
        conf_ptr[first[k] + 1] += 1
        conf_ptr[second[k] + 1] += 1
    for a in range(m):
        conf_ptr[a + 1] += conf_ptr[a]
    at = conf_ptr[:-1].copy()
    conf_idx = np.empty(conf_ptr[m], dtype=np.int64)
    for k in range(n_pairs):
        conf_idx[at[first[k]]] = cols[second[k]]
        at[first[k]] += 1
        conf_idx[at[second[k]]] = cols[first[k]]
        at[second[k]] += 1
    return conf_ptr, conf_idx


@njit(cache=True, nogil=True)
def _plan_rounds(stream, max_per_round, max_examined, max_rounds, num_cols, s_ptr, s_rows, s_vals, rho,
                 max_row, conf_pos, conf_ptr, conf_idx):
    """Cut a stream of candidate coordinates into rounds (STRADS Lasso's correlation checker).

    Each round examines up to ``max_examined`` candidates (L') -- first those
    deferred by earlier rounds, then new ones from ``stream`` -- and keeps up
    to ``max_per_round`` (L) whose sampled columns have ``|x_j^T x_k| < rho``
    with every coordinate already kept in the round (columns of the sample
    ``s_ptr/s_rows/s_vals`` are unit-norm, so the dot is a correlation).
    Rejected candidates wait for a later round; a repeat of a coordinate
    already in the round waits too. ``rho <= 0`` turns the check off.
    Coordinates ``>= num_cols`` (the intercept) are never checked.  With a conflict graph
    (``conf_ptr`` not empty; ``conf_pos``: a column's position in it) a candidate is checked
    against its conflicts instead of the kept columns' sampled rows.

    Returns ``(round_ptr, coords, consumed)``: round r updates
    ``coords[round_ptr[r]:round_ptr[r+1]]``; ``consumed`` stream entries were used.
    """
    n = stream.shape[0]
    out = np.empty(max_rounds * max_per_round, dtype=np.int64)
    round_ptr = np.zeros(max_rounds + 1, dtype=np.int64)
    deferred = np.empty(n + 1, dtype=np.int64)
    next_deferred = np.empty(n + 1, dtype=np.int64)
    n_def = 0
    in_round = np.zeros(num_cols + 1, dtype=np.bool_)
    # accepted columns per sample row, as linked lists
    row_head = np.full(max_row + 1, -1, dtype=np.int64)
    longest = 1
    for c in range(s_ptr.shape[0] - 1):
        longest = max(longest, s_ptr[c + 1] - s_ptr[c])
    cap = max_per_round * longest + 16
    node_col = np.empty(cap, dtype=np.int64)
    node_val = np.empty(cap, dtype=np.float64)
    node_next = np.empty(cap, dtype=np.int64)
    touched_rows = np.empty(cap, dtype=np.int64)
    dots = np.zeros(max_per_round, dtype=np.float64)
    # the kept columns a candidate's sampled rows reach (so the check costs what it touches, not
    # O(kept) per candidate: O(L^2) a round was most of a wide schedule's time)
    reached = np.empty(max_per_round, dtype=np.int64)
    stamp = np.full(max_per_round, -1, dtype=np.int64)
    cand = 0
    pos = 0
    r = 0
    total = 0
    check = rho > 0
    graph = conf_ptr.shape[0] > 0
    while r < max_rounds and (pos < n or n_def > 0):
        kept = 0
        examined = 0
        n_nodes = 0
        n_touched = 0
        n_next = 0
        start = total
        d = 0
        while kept < max_per_round and examined < max_examined and (d < n_def or pos < n):
            if d < n_def:
                j = deferred[d]
                d += 1
            else:
                j = stream[pos]
                pos += 1
            examined += 1
            if in_round[j]:
                next_deferred[n_next] = j
                n_next += 1
                continue
            ok = True
            if check and graph and j < num_cols and kept > 0:
                a = conf_pos[j]
                for q in range(conf_ptr[a], conf_ptr[a + 1]):
                    if in_round[conf_idx[q]]:
                        ok = False
                        break
            elif check and j < num_cols and kept > 0:
                cand += 1
                n_reached = 0
                for p in range(s_ptr[j], s_ptr[j + 1]):
                    node = row_head[s_rows[p]]
                    while node >= 0:
                        q = node_col[node]
                        if stamp[q] != cand:
                            stamp[q] = cand
                            dots[q] = 0.0
                            reached[n_reached] = q
                            n_reached += 1
                        dots[q] += s_vals[p] * node_val[node]
                        node = node_next[node]
                for i in range(n_reached):
                    if abs(dots[reached[i]]) >= rho:
                        ok = False
            if not ok:
                next_deferred[n_next] = j
                n_next += 1
                continue
            in_round[j] = True
            out[total] = j
            total += 1
            if check and not graph and j < num_cols:
                for p in range(s_ptr[j], s_ptr[j + 1]):
                    row = s_rows[p]
                    if row_head[row] < 0:
                        touched_rows[n_touched] = row
                        n_touched += 1
                    node_col[n_nodes] = kept
                    node_val[n_nodes] = s_vals[p]
                    node_next[n_nodes] = row_head[row]
                    row_head[row] = n_nodes
                    n_nodes += 1
            kept += 1
        # leftovers of the deferred queue come first next round
        for q in range(d, n_def):
            next_deferred[n_next] = deferred[q]
            n_next += 1
        for q in range(n_next):
            deferred[q] = next_deferred[q]
        n_def = n_next
        for q in range(start, total):
            in_round[out[q]] = False
        for q in range(n_touched):
            row_head[touched_rows[q]] = -1
        if total == start:
            break
        r += 1
        round_ptr[r] = total
    return round_ptr[:r + 1], out[:total], pos


@njit(cache=True, nogil=True)
def gram_entries(col_ptr, row_idx, vals, coords, w, num_rows):
    """The weighted Gram matrix ``X_A' diag(w) X_A`` of columns ``A = coords`` over this
    worker's rows as merged entries ``(a * m + b, value)``, ``m = len(coords)``: one entry
    per structurally non-zero pair, keys sorted and unique.

    Row by row of the Gram (Gustavson's sparse product): for column ``a`` the rows it
    touches scatter ``w_i x_ia x_ib`` into a dense length-``m`` accumulator, which one
    scan empties in key order, so the work is one multiply-add per pair of non-zeros
    sharing a row plus ``m * m`` flag reads, the scratch memory O(m + nnz(X_A)) and
    the output at most ``m * m`` entries (entries that sum to exactly 0 are left out)
    -- never the unmerged sum over rows of (non-zeros in the row)^2."""
    m = coords.shape[0]
    count, which, value = _rows_of_columns(col_ptr, row_idx, vals, coords, num_rows)
    acc = np.zeros(m, dtype=np.float64)
    cap = max(16, min(m * m, 4 * count[num_rows]))
    keys = np.empty(cap, dtype=np.int64)
    out = np.empty(cap, dtype=np.float64)
    e = 0
    for a in range(m):
        j = coords[a]
        for p in range(col_ptr[j], col_ptr[j + 1]):
            i = row_idx[p]
            vp = w[i] * vals[p]
            for q in range(count[i], count[i + 1]):
                acc[which[q]] += vp * value[q]
        if e + m > cap:  # grow the output (at most m * m entries in all)
            cap = min(m * m, max(2 * cap, e + m))
            keys, out = grow_pair(keys, out, e, cap)
        # emit Gram row a in key order by one scan (branch-predictable, O(m): cheaper than
        # tracking and sorting the touched columns); exact zeros need not travel
        for b in range(m):
            if acc[b] != 0.0:
                keys[e] = a * m + b
                out[e] = acc[b]
                e += 1
                acc[b] = 0.0
    return keys[:e].copy(), out[:e].copy()


@njit(cache=True, nogil=True)
def working_set_columns(col_ptr, row_idx, vals, coords, out, row_values, every_row):
    """Columns ``coords`` of this worker's rows, packed into ``out`` (float64) for the driver's
    working-set solver: the rows' count ``R`` and the non-zeros' ``nnz``, then per row the
    columns touch (every row with ``every_row``; in row order) its ``row_values`` (``c`` floats:
    weight and residual, or weight, margin and label), then the columns' lengths
    (``len(coords)`` of them), then per non-zero its row's number and value, column by column.
    Returns the floats used (``2 + c R + len(coords) + 2 nnz``)."""
    m = coords.shape[0]
    num_rows, c = row_values.shape[0], row_values.shape[1]
    pos = np.full(num_rows, 0 if every_row else -1, dtype=np.int64)
    for k in range(m):  # the touched rows, numbered in row order
        j = coords[k]
        for p in range(col_ptr[j], col_ptr[j + 1]):
            pos[row_idx[p]] = 0
    R = 0
    for i in range(num_rows):
        if pos[i] >= 0:
            pos[i] = R
            for q in range(c):
                out[2 + c * R + q] = row_values[i, q]
            R += 1
    base = 2 + c * R
    e = base + m
    for k in range(m):
        j = coords[k]
        out[base + k] = col_ptr[j + 1] - col_ptr[j]
        for p in range(col_ptr[j], col_ptr[j + 1]):
            out[e] = pos[row_idx[p]]
            out[e + 1] = vals[p]
            e += 2
    out[0] = R
    out[1] = (e - base - m) // 2
    return e


@njit(cache=True, nogil=True)
def working_set_floats(col_ptr, coords, num_rows, c, every_row):
    """An upper bound of :func:`working_set_columns`' floats for ``coords`` (``c`` values a row)."""
    nnz = 0
    for k in range(coords.shape[0]):
        nnz += col_ptr[coords[k] + 1] - col_ptr[coords[k]]
    rows = num_rows if every_row else min(nnz, num_rows)
    return 2 + c * rows + coords.shape[0] + 2 * nnz


@njit(cache=True, nogil=True)
def _softplus(x) -> float:
    """``log(1 + e^x)`` without overflow."""
    return x + np.log1p(np.exp(-x)) if x > 0 else np.log1p(np.exp(x))


@njit(cache=True, nogil=True)
def data_logistic(col_ptr, rows, vals, w, margin, y, pen, l2, beta, intercept, b, total_w, max_passes, tol):
    """Cyclic coordinate descent on the L1 (elastic-net) logistic loss restricted to a working set,
    on its columns over the rows they touch (every row with an ``intercept``): a coordinate takes
    the soft-thresholded Newton step of its own curvature, halved until the objective falls
    (glmnet's / CDN's coordinate step), and moves the margins ``margin`` of its rows.  Labels
    ``y`` in {0, 1}; the loss ``1/W sum w (log(1 + e^m) - y m)``.  With ``intercept`` the
    unpenalised offset ``b`` (uncentred: every row's margin holds it) takes its Newton step once
    a pass.  After a pass over every coefficient, passes over the non-zeros alone until they
    settle (glmnet's active set: an L1 solution has few); it stops when a pass over every
    coefficient moves none by more than ``tol`` (scaled by the square root of its curvature).  Updates ``beta`` and ``margin`` in place; returns
    ``(coordinate updates, b)``."""
    m = beta.shape[0]
    n = margin.shape[0]
    inv_w = 1.0 / total_w
    updates = 0
    change = 0.0
    every = np.arange(-1 if intercept else 0, m)
    order = every
    full = True  # a pass over every coefficient; between two, passes over the non-zeros only
    passes = 0
    while passes < max_passes:
        passes += 1
        biggest = 0.0
        for k in order:
            g = 0.0
            h = 0.0
            if k < 0:  # the offset: every row
                for i in range(n):
                    s = 1.0 / (1.0 + np.exp(-margin[i]))
                    g += w[i] * (s - y[i])
                    h += w[i] * s * (1.0 - s)
                g *= inv_w
                h = max(h * inv_w, 1e-12)
                d = -g / h
                for _t in range(30):  # halved until the loss falls
                    change = 0.0
                    for i in range(n):
                        change += w[i] * (_softplus(margin[i] + d) - _softplus(margin[i]) - y[i] * d)
                    if change * inv_w <= 0.0 or abs(d) < 1e-300:
                        break
                    d *= 0.5
                updates += 1
                if change * inv_w < 0.0:
                    b += d
                    for i in range(n):
                        margin[i] += d
                    s = abs(d) * np.sqrt(h)
                    if s > biggest:
                        biggest = s
                continue
            if pen[k] < 0:
                continue
            for p in range(col_ptr[k], col_ptr[k + 1]):
                i = rows[p]
                s = 1.0 / (1.0 + np.exp(-margin[i]))
                g += w[i] * vals[p] * (s - y[i])
                h += w[i] * vals[p] * vals[p] * s * (1.0 - s)
            h = max(h * inv_w, 1e-12) + l2[k]
            d = _soft_coordinate(h, beta[k], g * inv_w + l2[k] * beta[k], pen[k]) - beta[k]
            updates += 1
            if d == 0.0:
                continue
            accepted = False
            for _t in range(30):  # the objective's exact change along the column, halved until it falls
                change = 0.0
                for p in range(col_ptr[k], col_ptr[k + 1]):
                    i = rows[p]
                    step = vals[p] * d
                    change += w[i] * (_softplus(margin[i] + step) - _softplus(margin[i]) - y[i] * step)
                nb = beta[k] + d
                change = change * inv_w + pen[k] * (abs(nb) - abs(beta[k])) + 0.5 * l2[k] * (nb * nb - beta[k] * beta[k])
                if change < 0.0:
                    accepted = True
                    break
                d *= 0.5
            if not accepted:
                continue
            beta[k] += d
            for p in range(col_ptr[k], col_ptr[k + 1]):
                margin[rows[p]] += vals[p] * d
            s = abs(d) * np.sqrt(h)
            if s > biggest:
                biggest = s
        if biggest <= tol:
            if full:
                break
            full, order = True, every  # the non-zeros settled: check every coefficient again
        elif full:  # cycle over the non-zeros (and the offset) until they settle (glmnet's active set)
            count = 1 if intercept else 0
            for q in range(m):
                if beta[q] != 0.0:
                    count += 1
            order = np.empty(count, dtype=np.int64)
            c = 0
            if intercept:
                order[0] = -1
                c = 1
            for q in range(m):
                if beta[q] != 0.0:
                    order[c] = q
                    c += 1
            full = False
    return updates, b


@njit(cache=True, nogil=True)
def data_lasso(col_ptr, rows, vals, w, r, curv, mean, pen, l2, beta, sum_wr, total_w, max_passes, tol):
    """Cyclic coordinate descent on the Lasso (elastic net) restricted to a working set, on its
    columns (CSC over the rows they touch, ``w`` and the residual ``r = y - X beta`` on those
    rows), as scikit-learn's, celer's and skglm's inner solvers run: a coordinate's step reads
    its column and moves the residual, so a pass costs the working set's non-zeros (the Gram
    matrix's rows, :func:`gram_lasso`, are denser than the columns on sparse data).  The
    smooth part's gradient is ``-(x_j' W r - mean_j sum w r) / W + l2_j beta_j`` (the intercept
    implicit, as the parallel rounds have it); ``sum_wr``: ``sum w r`` over every row.  Same
    stopping rule and Anderson extrapolation as :func:`gram_lasso`, but the step to the
    extrapolated point is taken as far as it lowers the objective most (an exact line search,
    :func:`_line_search`, on the touched rows: the others do not move), not all or nothing: on
    the STRADS generator's ill-conditioned working sets (a pass contracts the error by ~0.996)
    the extrapolation points the right way and overshoots, and the search cut the passes of a
    tight solve ~3x.  Updates ``beta`` and ``r`` in place; returns ``(coordinate updates,
    sum_wr)``."""
    m = beta.shape[0]
    n = r.shape[0]
    inv_w = 1.0 / total_w
    updates = 0
    K = ANDERSON_K
    hist, weights, ext = _anderson_buffers(beta)
    filled = 1
    r_ext = np.empty(n)
    for _ in range(max_passes):
        biggest = 0.0
        for k in range(m):
            c = curv[k]
            if c <= 0 or pen[k] < 0:
                continue
            dot = 0.0
            for p in range(col_ptr[k], col_ptr[k + 1]):
                i = rows[p]
                dot += vals[p] * w[i] * r[i]
            new = _soft_coordinate(c, beta[k], -(dot - mean[k] * sum_wr) * inv_w + l2[k] * beta[k], pen[k])
            d = new - beta[k]
            updates += 1
            if d != 0.0:
                beta[k] = new
                for p in range(col_ptr[k], col_ptr[k + 1]):
                    r[rows[p]] -= vals[p] * d
                sum_wr -= d * total_w * mean[k]
                s = abs(d) * np.sqrt(c)
                if s > biggest:
                    biggest = s
        if biggest <= tol:
            break
        hist[filled] = beta
        filled += 1
        if filled <= K:
            continue
        filled = 1
        if _extrapolation(hist, weights, curv, pen, beta, ext):
            t = _line_search(col_ptr, rows, vals, w, r, mean, pen, l2, beta, ext, r_ext, sum_wr, total_w)
            if t > 0.0:
                for j in range(m):
                    if ext[j] != 0.0:
                        beta[j] += t * ext[j]
                        sum_wr -= t * ext[j] * total_w * mean[j]
                for i in range(n):
                    r[i] -= t * r_ext[i]
        hist[0] = beta
    return updates, sum_wr


@njit(cache=True, nogil=True)
def _line_search(col_ptr, rows, vals, w, r, mean, pen, l2, beta, ext, xe, sum_wr, total_w) -> float:
    """The step ``t >= 0`` along ``ext`` that minimises the working set's objective (convex and
    piecewise quadratic in ``t``: bisection on its right derivative), 0 when no step lowers it.
    Leaves ``X ext`` on the touched rows in ``xe``."""
    n = r.shape[0]
    m = beta.shape[0]
    inv_w = 1.0 / total_w
    for i in range(n):
        xe[i] = 0.0
    moved = 0.0  # sum w x ext over every row: the change of sum w r per unit step (the intercept's share)
    for j in range(m):
        if ext[j] != 0.0:
            moved += total_w * mean[j] * ext[j]
            for p in range(col_ptr[j], col_ptr[j + 1]):
                xe[rows[p]] += vals[p] * ext[j]
    A = 0.0
    B = 0.0
    for i in range(n):
        A += w[i] * xe[i] * xe[i]
        B += w[i] * xe[i] * r[i]

    def slope(t):  # the right derivative at t
        g = inv_w * (t * A - B) + inv_w * inv_w * moved * (sum_wr - t * moved)
        for j in range(m):
            e = ext[j]
            if e != 0.0:
                v = beta[j] + t * e
                g += pen[j] * e * (1.0 if v > 0 or (v == 0 and e > 0) else -1.0) + l2[j] * e * v
        return g

    def change(t):  # F(beta + t ext) - F(beta)
        c = inv_w * (0.5 * t * t * A - t * B) - 0.5 * inv_w * inv_w * ((sum_wr - t * moved) ** 2 - sum_wr ** 2)
        for j in range(m):
            e = ext[j]
            if e != 0.0:
                v = beta[j] + t * e
                c += pen[j] * (abs(v) - abs(beta[j])) + 0.5 * l2[j] * (v * v - beta[j] * beta[j])
        return c

    if not slope(0.0) < 0.0:
        return 0.0
    hi = 1.0
    while slope(hi) < 0.0 and hi < 1e6:
        hi *= 2.0
    lo = 0.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if slope(mid) < 0.0:
            lo = mid
        else:
            hi = mid
    return hi if change(hi) < 0.0 else 0.0


#: passes between two Anderson extrapolations of :func:`gram_lasso` (celer's and skglm's choice)
ANDERSON_K = 5


@njit(cache=True, nogil=True)
def _gram_times(indptr, indices, data, l2, d, out):
    """``out = (G + diag(l2)) d`` for the symmetric CSR Gram ``G`` (the raw, uncentred one)."""
    for k in range(d.shape[0]):
        acc = l2[k] * d[k]
        for p in range(indptr[k], indptr[k + 1]):
            acc += data[p] * d[indices[p]]
        out[k] = acc


@njit(cache=True, nogil=True)
def _anderson_weights(hist, out) -> bool:
    """Anderson mixing weights ``c`` (summing to 1) of the iterates ``hist[1:]``: ``c``
    minimises ``|U c|`` for ``U`` the successive differences of ``hist`` (Bertrand & Massias,
    *Anderson acceleration of coordinate descent*, 2021).  False where ``U'U`` is singular."""
    K, m = hist.shape[0] - 1, hist.shape[1]
    C = np.empty((K, K))
    for i in range(K):
        for j in range(i, K):
            s = 0.0
            for q in range(m):
                s += (hist[i + 1, q] - hist[i, q]) * (hist[j + 1, q] - hist[j, q])
            C[i, j] = s
            C[j, i] = s
    scale = 0.0
    for i in range(K):
        scale = max(scale, C[i, i])
    if not scale > 0.0:
        return False
    z = np.ones(K)
    for i in range(K):
        C[i, i] += 1e-10 * scale
    for col in range(K):  # Gaussian elimination with partial pivoting: C z = 1
        piv = col
        for r in range(col + 1, K):
            if abs(C[r, col]) > abs(C[piv, col]):
                piv = r
        if abs(C[piv, col]) <= 1e-14 * scale:
            return False
        if piv != col:
            for q in range(K):
                C[col, q], C[piv, q] = C[piv, q], C[col, q]
            z[col], z[piv] = z[piv], z[col]
        for r in range(col + 1, K):
            f = C[r, col] / C[col, col]
            for q in range(col, K):
                C[r, q] -= f * C[col, q]
            z[r] -= f * z[col]
    for col in range(K - 1, -1, -1):
        s = z[col]
        for q in range(col + 1, K):
            s -= C[col, q] * z[q]
        z[col] = s / C[col, col]
    total = z.sum()
    if total == 0.0 or not np.isfinite(total):
        return False
    for i in range(K):
        out[i] = z[i] / total
    return True


@njit(cache=True, nogil=True)
def _soft_coordinate(c, beta, g, pen) -> float:
    """The coordinate minimiser ``S(c beta - g, pen) / c`` (curvature ``c``, gradient ``g``)."""
    z = c * beta - g
    a = abs(z) - pen
    if a > 0:
        return a / c if z > 0 else -a / c
    return 0.0


@njit(cache=True, nogil=True)
def _anderson_buffers(beta):
    """Scratch for Anderson's extrapolation: the iterates (``beta`` first), the mixing weights
    and the step."""
    hist = np.empty((ANDERSON_K + 1, beta.shape[0]))
    hist[0] = beta
    return hist, np.empty(ANDERSON_K), np.empty(beta.shape[0])


@njit(cache=True, nogil=True)
def _extrapolation(hist, weights, curv, pen, beta, ext) -> bool:
    """Anderson's step ``ext`` from ``beta`` to the mix of the iterates ``hist[1:]`` (frozen
    coefficients stay); False where the mix is undefined (:func:`_anderson_weights`)."""
    if not _anderson_weights(hist, weights):
        return False
    K = weights.shape[0]
    for j in range(beta.shape[0]):
        s = 0.0
        if curv[j] > 0 and pen[j] >= 0:
            for i in range(K):
                s += weights[i] * hist[i + 1, j]
            s -= beta[j]
        ext[j] = s
    return True


@njit(cache=True, nogil=True)
def gram_lasso(indptr, indices, data, curv, mean, grad, beta, pen, l2, max_passes, tol):
    """Cyclic coordinate descent on the Lasso (elastic net) restricted to a working set,
    exact for squared loss (glmnet's covariance updates), with the sparse Gram matrix
    ``G`` (CSR) of the raw columns: the centred Gram is ``G - mean mean'``,
    applied implicitly so G stays sparse; the ridge part adds ``diag(l2)``.
    ``grad`` is the gradient of the smooth part (L2 included) at the starting
    ``beta``; ``curv`` the centred diagonal plus ``l2``.  Updates ``beta`` in place;
    stops when a pass moves no coefficient by more than ``tol`` (scaled by
    sqrt(curv)).  Every ``ANDERSON_K`` passes the last iterates are extrapolated
    (Anderson acceleration, as celer and skglm do) and the extrapolated point is kept
    when it lowers the objective -- computed exactly, the problem being quadratic plus
    L1; on correlated columns it cuts the slow linear tail of plain CD (a tight solve
    took 2 807 passes on the STRADS generator's working set, 68 with it).  Returns the
    coordinate updates done (coefficients visited)."""
    m = beta.shape[0]
    base = grad.copy()
    t = 0.0
    updates = 0
    K = ANDERSON_K
    hist, weights, ext = _anderson_buffers(beta)
    filled = 1
    h_ext = np.empty(m)
    for _ in range(max_passes):
        biggest = 0.0
        for k in range(m):
            c = curv[k]
            if c <= 0 or pen[k] < 0:
                continue
            new = _soft_coordinate(c, beta[k], base[k] - mean[k] * t, pen[k])
            d = new - beta[k]
            updates += 1
            if d != 0.0:
                beta[k] = new
                for p in range(indptr[k], indptr[k + 1]):
                    base[indices[p]] += data[p] * d
                base[k] += l2[k] * d
                t += mean[k] * d
                s = abs(d) * np.sqrt(c)
                if s > biggest:
                    biggest = s
        if biggest <= tol:
            break
        hist[filled] = beta
        filled += 1
        if filled <= K:
            continue
        filled = 1
        if _extrapolation(hist, weights, curv, pen, beta, ext):
            _gram_times(indptr, indices, data, l2, ext, h_ext)
            m_ext = 0.0
            for j in range(m):
                m_ext += mean[j] * ext[j]
            change = 0.0  # F(beta + ext) - F(beta): exact, the smooth part being quadratic
            for j in range(m):
                if ext[j] != 0.0:
                    g = base[j] - mean[j] * t
                    change += ext[j] * (g + 0.5 * (h_ext[j] - mean[j] * m_ext)) \
                        + pen[j] * (abs(beta[j] + ext[j]) - abs(beta[j]))
            if change < 0.0:
                for j in range(m):
                    beta[j] += ext[j]
                    base[j] += h_ext[j]
                t += m_ext
        hist[0] = beta
    return updates


@njit(cache=True, nogil=True)
def row_overlap(col_ptr, row_idx, coords, num_rows):
    """``omega[i]`` = how many of the columns ``coords`` have a non-zero in row i
    (coordinate ``J``, the intercept, counts in every row): the ESO weights of a
    parallel round (Richtarik & Takac 2016)."""
    J = col_ptr.shape[0] - 1
    omega = np.zeros(num_rows, dtype=np.float64)
    for k in range(coords.shape[0]):
        j = coords[k]
        if j == J:
            for i in range(num_rows):
                omega[i] += 1.0
        else:
            for p in range(col_ptr[j], col_ptr[j + 1]):
                omega[row_idx[p]] += 1.0
    return omega


# ---------------------------------------------------------------- the multinomial (softmax) loss
# Margins, gradients and curvatures are (rows, classes) arrays, C-ordered: a row's classes sit
# together, so a column's non-zeros read each row's K values in one cache line or two.

@njit(cache=True, nogil=True)
def softmax_terms(margin, y, w, u, h):
    """For class labels ``y`` (0 .. K-1, as floats) and margins ``(n, K)``: ``u = w (p - onehot(y))``
    with ``p`` the softmax, and ``h`` a diagonal bound of the row's Hessian ``diag(p) - p p'``
    (``w p`` when every ``p_k <= 1/2``, else ``w 2 p (1 - p)``: both dominate it, so the K classes
    of one feature can move in one round); returns ``sum w (logsumexp(m) - m_y)``."""
    n, k_all = margin.shape
    p = np.empty(k_all)
    loss = 0.0
    for i in range(n):
        top = margin[i, 0]
        for k in range(1, k_all):
            if margin[i, k] > top:
                top = margin[i, k]
        total = 0.0
        for k in range(k_all):
            p[k] = np.exp(margin[i, k] - top)
            total += p[k]
        biggest = 0.0
        for k in range(k_all):
            p[k] /= total
            if p[k] > biggest:
                biggest = p[k]
        label = int(y[i])
        wi = w[i]
        for k in range(k_all):
            u[i, k] = wi * p[k]
            h[i, k] = wi * p[k] if biggest <= 0.5 else 2.0 * wi * p[k] * (1.0 - p[k])
        u[i, label] -= wi
        loss += wi * (top + np.log(total) - margin[i, label])
    return loss


@njit(cache=True, nogil=True)
def add_class_columns(col_ptr, row_idx, vals, features, delta, margin):
    """``margin[:, k] += X[:, features] @ delta[:, k]`` for every class (feature ``J``: every row);
    features whose deltas are all zero are skipped."""
    J = col_ptr.shape[0] - 1
    k_all = margin.shape[1]
    for a in range(features.shape[0]):
        moved = False
        for k in range(k_all):
            if delta[a, k] != 0.0:
                moved = True
        if not moved:
            continue
        f = features[a]
        if f == J:
            for i in range(margin.shape[0]):
                for k in range(k_all):
                    margin[i, k] += delta[a, k]
        else:
            for q in range(col_ptr[f], col_ptr[f + 1]):
                i = row_idx[q]
                x = vals[q]
                for k in range(k_all):
                    margin[i, k] += x * delta[a, k]


@njit(cache=True, nogil=True)
def class_shift(beta, pen, l2, out):
    """Per feature f: the shift ``c`` that minimises ``sum_k pen_f |beta_fk + c| + l2_f / 2 (beta_fk + c)^2``
    (softmax margins do not move when every class's coefficient of a feature moves by the same ``c``:
    glmnet's ``elc``).  0 where 0 is a minimiser (and for frozen features, ``pen < 0``); a minimiser
    at a kink is exact, so the coefficient it zeroes is exactly 0."""
    n_f, k_all = beta.shape
    cands = np.empty(2 * k_all + 2)
    for f in range(n_f):
        out[f] = 0.0
        a, b = pen[f], l2[f]
        if a < 0.0 or (a == 0.0 and b == 0.0):
            continue
        row = np.sort(beta[f])
        if row[0] == 0.0 and row[k_all - 1] == 0.0:
            continue
        total = 0.0
        for k in range(k_all):
            total += row[k]
        m = 0
        for k in range(k_all):  # the kinks, ascending in c
            cands[m] = -row[k_all - 1 - k]
            m += 1
        if b > 0.0:  # each piece's stationary point, clipped into the piece
            for s in range(k_all + 1):  # s kinks lie below the piece: s coefficients are positive there
                lo = -np.inf if s == 0 else -row[k_all - s]
                hi = np.inf if s == k_all else -row[k_all - 1 - s]
                c = -(a * (2 * s - k_all) + b * total) / (b * k_all)
                cands[m] = min(max(c, lo), hi)
                m += 1
        best_c, best = 0.0, 0.0
        for k in range(k_all):
            best += a * abs(row[k]) + 0.5 * b * row[k] * row[k]
        for t in range(m):
            c = cands[t]
            value = 0.0
            for k in range(k_all):
                v = row[k] + c
                value += a * abs(v) + 0.5 * b * v * v
            if value < best * (1.0 - 1e-14):
                best, best_c = value, c
        out[f] = best_c


@njit(cache=True, nogil=True)
def softmax_line_sums(u, y, w, dm):
    """Along a change ``dm`` of the margins: the loss's slope ``sum u . dm`` and its exact curvature
    ``sum_i w_i (p_i . dm_i^2 - (p_i . dm_i)^2)``, with ``u = w (p - onehot(y))`` as
    :func:`softmax_terms` left it (``w p`` is ``u`` plus ``w`` at the label)."""
    slope = 0.0
    curvature = 0.0
    for i in range(u.shape[0]):
        wi = w[i]
        if wi <= 0.0:
            continue
        label = int(y[i])
        first = 0.0
        second = 0.0
        for k in range(u.shape[1]):
            d = dm[i, k]
            slope += u[i, k] * d
            wp = u[i, k] + (wi if k == label else 0.0)
            first += wp * d
            second += wp * d * d
        curvature += second - first * first / wi
    return slope, curvature


@njit(cache=True, nogil=True)
def columns_by_row(col_ptr, row_idx, vals, features, cuts, n):
    """Columns ``features`` of a CSC matrix of ``n`` rows, by row: ``(ptr, pos, val)``.

    Row ``i``'s entries are ``ptr[i, 0] .. ptr[i, P]`` (``P = len(cuts) - 1``), ``pos`` the index
    into ``features`` (ascending within a row) and ``val`` the value; ``ptr[i, p]`` is where its
    entries of positions ``>= cuts[p]`` begin (``cuts``: ascending part starts, from 0 to
    ``len(features)``).  Feature ``J`` (the intercept's column of ones) has no entries: the
    kernels below take its position apart.  Column-at-a-time kernels jump between rows of the
    ``(n, K)`` class arrays; these pass over them in order."""
    J = col_ptr.shape[0] - 1
    parts = cuts.shape[0] - 1
    sub_ptr = np.zeros(features.shape[0] + 1, dtype=np.int64)  # the columns, one after another
    for a in range(features.shape[0]):
        f = features[a]
        sub_ptr[a + 1] = sub_ptr[a] + (col_ptr[f + 1] - col_ptr[f] if f < J else 0)
    sub_rows = np.empty(sub_ptr[-1], dtype=np.int64)
    sub_vals = np.empty(sub_ptr[-1])
    for a in range(features.shape[0]):
        f = features[a]
        if f < J:
            lo = col_ptr[f]
            for q in range(sub_ptr[a], sub_ptr[a + 1]):
                sub_rows[q] = row_idx[lo + q - sub_ptr[a]]
                sub_vals[q] = vals[lo + q - sub_ptr[a]]
    start, pos, val = rows_to_csc(sub_ptr, sub_rows, sub_vals, n)  # by row, positions ascending in each
    ptr = np.empty((n, parts + 1), dtype=np.int64)
    for i in range(n):
        q = start[i]
        for p in range(parts + 1):
            while q < start[i + 1] and pos[q] < cuts[p]:
                q += 1
            ptr[i, p] = q if p < parts else start[i + 1]
    return ptr, pos, val


@njit(cache=True, nogil=True)
def class_row_dots(ptr, pos, val, part, lo, hi, intercept, u, h, out_u, out_h2, out_h1):
    """Per position ``a`` (feature ``features[a]`` of :func:`columns_by_row`) in ``lo .. hi - 1``
    (part ``part`` of its ``ptr``) and class k: ``out_u[a, k] = sum_i x_ia u_ik``,
    ``out_h2[a, k] = sum x^2 h_ik`` and ``out_h1[a, k] = sum x h_ik``, passing over the rows in
    order (``intercept``: the position of the column of ones, or -1; ``out_h1`` may have no rows:
    then it is not computed)."""
    k_all = u.shape[1]
    with_h1 = out_h1.shape[0] > 0
    for a in range(lo, hi):
        for k in range(k_all):
            out_u[a, k] = 0.0
            out_h2[a, k] = 0.0
            if with_h1:
                out_h1[a, k] = 0.0
    for i in range(ptr.shape[0]):
        for q in range(ptr[i, part], ptr[i, part + 1]):
            a = pos[q]
            x = val[q]
            xx = x * x
            for k in range(k_all):
                hk = h[i, k]
                out_u[a, k] += x * u[i, k]
                out_h2[a, k] += xx * hk
                if with_h1:
                    out_h1[a, k] += x * hk
    if lo <= intercept < hi:
        for i in range(u.shape[0]):
            for k in range(k_all):
                out_u[intercept, k] += u[i, k]
                out_h2[intercept, k] += h[i, k]
                if with_h1:
                    out_h1[intercept, k] += h[i, k]


@njit(cache=True, nogil=True)
def class_row_direction(ptr, pos, val, intercept, delta, shift, out, lo, hi):
    """``out[i] = X[i, features] @ delta - shift`` for rows ``lo .. hi - 1``, from
    :func:`columns_by_row`'s arrays (``intercept``: the position of the column of ones, or -1)."""
    k_all = out.shape[1]
    parts = ptr.shape[1] - 1
    for i in range(lo, hi):
        for k in range(k_all):
            out[i, k] = -shift[k]
            if intercept >= 0:
                out[i, k] += delta[intercept, k]
        for q in range(ptr[i, 0], ptr[i, parts]):
            a = pos[q]
            x = val[q]
            for k in range(k_all):
                out[i, k] += x * delta[a, k]
