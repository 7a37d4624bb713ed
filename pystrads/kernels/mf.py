"""Kernels for matrix factorisation: block coordinate descent, SGD and implicit feedback.

Ratings of one worker are stored once, indexed two ways:

``rating_user`` int32[n], ``rating_item`` int32[n]
    local user index and local item index of each rating;
``user_ptr`` int64[n_users + 1], ``user_ratings`` int32[n]
    ratings of each local user (CSR, built by :func:`build_index`);
``item_ptr`` int64[n_items + 1], ``item_ratings`` int32[n]
    ratings of each local item (CSC, built by :func:`build_index`).

Factors are float64 matrices with one row per local user (``w``) or item (``h``) and one
column per feature being updated; ``residual`` float64[n] is rating minus prediction.

Three families, each introduced by a comment giving its equations:

* block coordinate descent (:func:`add_block`, :func:`item_block_partials`,
  :func:`solve_item_blocks`, :func:`user_block_update`), the STRADS MF supplement's
  coordinate updates (eq. 3-5) ordered by feature as CCD++ does (Yu et al. 2012), b features
  per round;
* SGD with block rotation (:func:`sgd_block`);
* implicit feedback by feature-block coordinate descent (``implicit_*``).

Kernels never validate input.
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def squared_error(residual):
    s = 0.0
    for n in range(residual.shape[0]):
        s += residual[n] * residual[n]
    return s


def build_index(rating_local, n_groups):
    """CSR pointers and rating order for a local index (users or items)."""
    order = np.argsort(rating_local, kind="stable").astype(np.int32)
    counts = np.bincount(rating_local, minlength=n_groups)
    ptr = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, order


# ---------------------------------------------------------------------------------------------
# Block coordinate descent: a block B of b features per round (b = 1 is CCD++, one feature
# per round).  With rhat = r + W_B H_B' (the residual with the block added back), the exact
# block minimisers are, per item and per user, b x b ridge solves:
#
#     h_jB = (lambda_j I + sum_i w_iB w_iB')^-1 sum_i rhat_ij w_iB     (items, summed over workers)
#     w_iB = (lambda_i I + sum_j h_jB h_jB')^-1 sum_j rhat_ij h_jB     (users, local)
#
# and finally r = rhat - W_B H_B'.
# Items need b(b+1)/2 + b partial sums from every worker, one round per block and inner
# iteration instead of one per feature: the Gram's lower triangle packed row by row (entry
# (c, d), d <= c, at c(c+1)/2 + d: the same place whatever b), then the right-hand side
# (:func:`packed_width`, :func:`unpack`).


def packed_width(b):
    """Numbers per item in a block's partial sums: the packed lower triangle, then ``b``."""
    return b * (b + 1) // 2 + b


def pack(gram, rhs):
    """Rows of packed partial sums from ``gram`` (n x b x b, symmetric) and ``rhs`` (n x b)."""
    b = rhs.shape[1]
    rows, cols = np.tril_indices(b)
    return np.concatenate([gram[:, rows, cols], rhs], axis=1)


def unpack(partials, b):
    """``(gram, rhs)`` (n x b x b symmetric, n x b) from rows of packed partial sums."""
    t = b * (b + 1) // 2
    rows, cols = np.tril_indices(b)
    gram = np.zeros((len(partials), b, b))
    gram[:, rows, cols] = partials[:, :t]
    gram[:, cols, rows] = partials[:, :t]
    return gram, np.array(partials[:, t:t + b])


@njit(cache=True, nogil=True)
def add_block(residual, rating_user, rating_item, w, h, sign, out):
    """``out[n] = residual[n] + sign * w[user(n)] . h[item(n)]`` (w: users x b, h: items x b)."""
    b = w.shape[1]
    for n in range(residual.shape[0]):
        s = 0.0
        wi = rating_user[n]
        hj = rating_item[n]
        for c in range(b):
            s += w[wi, c] * h[hj, c]
        out[n] = residual[n] + sign * s


@njit(cache=True, nogil=True, inline="always")
def _add_partial(out, j, w, i, weight, r, b):
    """``out[j]``'s packed Gram ``+= weight w_i w_i'`` and its right-hand side ``+= r w_i``."""
    t = b * (b + 1) // 2
    for c in range(b):
        wc = w[i, c]
        out[j, t + c] += r * wc
        ww = weight * wc
        row = c * (c + 1) // 2
        for d in range(c + 1):
            out[j, row + d] += ww * w[i, d]


@njit(cache=True, nogil=True)
def item_block_partials(item_ptr, item_ratings, rating_user, rhat, w, out):
    """Per local item j, packed (:func:`pack`): ``sum w_i w_i'`` and ``sum rhat w_i`` over its ratings."""
    b = w.shape[1]
    for j in range(item_ptr.shape[0] - 1):
        out[j, :] = 0.0
        for p in range(item_ptr[j], item_ptr[j + 1]):
            n = item_ratings[p]
            _add_partial(out, j, w, rating_user[n], 1.0, rhat[n], b)


@njit(cache=True, nogil=True)
def _cholesky_solve(a, x, b, tiny):
    """Solve ``a x = rhs`` in place (a: b x b SPD, its lower triangle read and overwritten by its
    factor; x holds rhs).  False (x zeroed) when a pivot is ``<= tiny``: ``a`` is not (numerically)
    positive definite."""
    for c in range(b):
        s = a[c, c]
        for k in range(c):
            s -= a[c, k] * a[c, k]
        if s <= tiny:
            for k in range(b):
                x[k] = 0.0
            return False
        a[c, c] = np.sqrt(s)
        for r in range(c + 1, b):
            s = a[r, c]
            for k in range(c):
                s -= a[r, k] * a[c, k]
            a[r, c] = s / a[c, c]
    for c in range(b):  # L y = rhs
        s = x[c]
        for k in range(c):
            s -= a[c, k] * x[k]
        x[c] = s / a[c, c]
    for c in range(b - 1, -1, -1):  # L' x = y
        s = x[c]
        for k in range(c + 1, b):
            s -= a[k, c] * x[k]
        x[c] = s / a[c, c]
    return True


@njit(cache=True, nogil=True)
def solve_item_blocks(partials, reg, features, out):
    """The shard's exact block solve per row n (an item's feature block): ``partials[n]`` holds the
    summed Gram matrix and right-hand side, packed (:func:`pack`); ``out[n] = (G + reg[n] I)^-1
    rhs`` over the first ``features[n]`` features, 0 beyond them (a last block narrower than b).
    Returns per row whether the matrix was positive definite (where not, ``out[n]`` is 0 and the
    caller solves that row another way)."""
    n, b = out.shape
    t = b * (b + 1) // 2
    a = np.empty((b, b))
    x = np.empty(b)
    ok = np.ones(n, dtype=np.bool_)
    for i in range(n):
        f = features[i]
        if b == 1:  # CCD++: one division (bit for bit the serial update)
            den = partials[i, 0] + reg[i]
            ok[i] = f == 0 or den > 0.0
            out[i, 0] = partials[i, 1] / den if f == 1 and den > 0.0 else 0.0
            continue
        scale = 0.0
        for c in range(b):
            row = c * (c + 1) // 2
            x[c] = partials[i, t + c] if c < f else 0.0
            for d in range(c):
                a[c, d] = partials[i, row + d] if c < f and d < f else 0.0
            a[c, c] = partials[i, row + c] + reg[i] if c < f else 1.0
            scale = max(scale, abs(a[c, c]))
        # a pivot lost to rounding (a singular G + reg I) fails rather than blow up the solution
        ok[i] = _cholesky_solve(a, x, b, 1e-10 * scale)
        for c in range(b):
            out[i, c] = x[c]
    return ok


@njit(cache=True, nogil=True)
def user_block_update(user_ptr, user_ratings, rating_item, rhat, h, reg, w):
    """Per local user i: ``w[i] = (reg[i] I + sum h_j h_j')^-1 sum rhat h_j`` over its ratings."""
    b = h.shape[1]
    a = np.empty((b, b))
    x = np.empty(b)
    for i in range(user_ptr.shape[0] - 1):
        for c in range(b):
            x[c] = 0.0
            for d in range(b):
                a[c, d] = 0.0
            a[c, c] = reg[i]
        for p in range(user_ptr[i], user_ptr[i + 1]):
            n = user_ratings[p]
            j = rating_item[n]
            r = rhat[n]
            for c in range(b):
                hc = h[j, c]
                x[c] += r * hc
                for d in range(c + 1):
                    a[c, d] += hc * h[j, d]
        if user_ptr[i + 1] == user_ptr[i]:
            for c in range(b):
                w[i, c] = 0.0
            continue
        _cholesky_solve(a, x, b, 0.0)
        for c in range(b):
            w[i, c] = x[c]


# ---------------------------------------------------------------------------------------------
# SGD with block rotation (STRADS thesis, static schedule; Gemulla et al.'s DSGD strata).
# Per rating (i, j), with e = a_ij - w_i . h_j and the ALS-scaled objective
# sum e^2 + lambda (sum_i n_i |w_i|^2 + sum_j m_j |h_j|^2) spread over the ratings
# (each rating carries lambda |w_i|^2 + lambda |h_j|^2):
#
#     w_i <- w_i + eta (e h_j - lambda w_i),   h_j <- h_j + eta (e w_i - lambda h_j)


@njit(cache=True, nogil=True)
def sgd_block(order, rating_user, rating_row, ratings, w, h, eta, reg, nonnegative):
    """One SGD pass over the ratings ``order`` (in that order); ``w``: local users x rank,
    ``h``: the rows of the block's items (``rating_row`` indexes them).  Returns the sum of
    squared errors seen before each update (the sweep's training error)."""
    k = w.shape[1]
    sse = 0.0
    for t in range(order.shape[0]):
        n = order[t]
        i = rating_user[n]
        j = rating_row[n]
        e = ratings[n]
        for c in range(k):
            e -= w[i, c] * h[j, c]
        sse += e * e
        for c in range(k):
            wc = w[i, c]
            hc = h[j, c]
            nw = wc + eta * (e * hc - reg * wc)
            nh = hc + eta * (e * wc - reg * hc)
            if nonnegative:
                nw = max(nw, 0.0)
                nh = max(nh, 0.0)
            w[i, c] = nw
            h[j, c] = nh
    return sse


# ---------------------------------------------------------------------------------------------
# Implicit feedback (Hu, Koren & Volinsky 2008, as Spark's ALS states it), solved by feature-block
# coordinate descent (iALS++, Rendle et al. 2021).  Per observation n: c1[n] = alpha |r|
# (confidence - 1) and target[n] = (1 + c1[n]) if r > 0 else 0 (confidence times preference);
# pred[n] = x_u . y_j.  For a block B of features, with the other features fixed and
# s[n] = pred[n] - x_uB . y_jB, the exact block minimiser of a user is
#
#     (G[B,B] + sum c1 y_jB y_jB' + lambda_u I) x_uB = sum (target - c1 s) y_jB - G[B,-B] x_u,-B
#
# (G = Y'Y, the Gramian over every item: the unobserved pairs' part), and symmetrically for items
# with G = W'W.  The observed sums are the kernels' job; the Gramian terms are added by the caller.


@njit(cache=True, nogil=True, inline="always")
def _add_observation(z, own, pred, c1, target, acc, rhs, b):
    """One observation into a block's normal equations: ``z`` the other side's block, ``own`` the
    current block of the side being solved, ``pred`` the full prediction; ``acc += c1 z z'``,
    ``rhs += (target - c1 s) z`` with ``s = pred - z . own`` (the prediction without the block)."""
    s = pred
    for c in range(b):
        s -= z[c] * own[c]
    r = target - c1 * s
    for c in range(b):
        rhs[c] += r * z[c]
        x = c1 * z[c]
        for d in range(b):
            acc[c, d] += x * z[d]


@njit(cache=True, nogil=True)
def implicit_item_partials(item_ptr, item_user, c1, target, pred, w, v, out):
    """Per local item j, packed (:func:`pack`): ``sum c1 w_i w_i'`` and ``sum (target - c1 s) w_i``
    over its observations.  Every per-observation array
    is in *item-major* order (position p of ``item_ptr``'s ranges): ``item_user[p]`` the local user,
    ``c1``, ``target``, ``pred`` its values -- read in sequence, not gathered at random; ``w``:
    local users x b, ``v``: the block at the local items.  The sums build in small local arrays."""
    b = w.shape[1]
    acc = np.empty((b, b))
    rhs = np.empty(b)
    wi = np.empty(b)
    for j in range(item_ptr.shape[0] - 1):
        acc[:, :] = 0.0
        rhs[:] = 0.0
        for p in range(item_ptr[j], item_ptr[j + 1]):
            i = item_user[p]
            for c in range(b):
                wi[c] = w[i, c]
            _add_observation(wi, v[j], pred[p], c1[p], target[p], acc, rhs, b)
        t = b * (b + 1) // 2
        for c in range(b):
            row = c * (c + 1) // 2
            for d in range(c + 1):
                out[j, row + d] = acc[c, d]
            out[j, t + c] = rhs[c]


@njit(cache=True, nogil=True)
def implicit_add_block_items(item_ptr, item_user, u, change, pred):
    """``pred[p] += u[item_user[p]] . change[j]`` for every observation p of local item j (item-major
    order, as :func:`implicit_item_partials`): the new block of H folded into the predictions."""
    b = u.shape[1]
    for j in range(item_ptr.shape[0] - 1):
        for p in range(item_ptr[j], item_ptr[j + 1]):
            i = item_user[p]
            s = 0.0
            for c in range(b):
                s += u[i, c] * change[j, c]
            pred[p] += s


@njit(cache=True, nogil=True)
def implicit_user_block_update(user_ptr, rating_item, c1, target, h, gram, cross, reg, nonnegative, w, pred):
    """Per local user i, the exact block minimiser (module comment above) with ``gram`` =
    G[B,B] and ``cross[i]`` = G[B,-B] x_i,-B; updates ``w[i]`` (the block) and the
    predictions of the user's observations, which are *user-major*: user i's are positions
    ``user_ptr[i] .. user_ptr[i+1]`` of ``rating_item``, ``c1``, ``target`` and ``pred``.
    ``nonnegative`` projects (exact for b = 1)."""
    b = h.shape[1]
    a = np.empty((b, b))
    x = np.empty(b)
    wi = np.empty(b)
    hj = np.empty(b)
    for i in range(user_ptr.shape[0] - 1):
        for c in range(b):
            wi[c] = w[i, c]
            x[c] = -cross[i, c]
            for d in range(b):
                a[c, d] = gram[c, d]
            a[c, c] += reg[i]
        for p in range(user_ptr[i], user_ptr[i + 1]):
            j = rating_item[p]
            for c in range(b):
                hj[c] = h[j, c]
            _add_observation(hj, wi, pred[p], c1[p], target[p], a, x, b)
        _cholesky_solve(a, x, b, 0.0)
        if nonnegative:
            for c in range(b):
                x[c] = max(x[c], 0.0)
        for p in range(user_ptr[i], user_ptr[i + 1]):
            j = rating_item[p]
            s = 0.0
            for c in range(b):
                s += (x[c] - wi[c]) * h[j, c]
            pred[p] += s
        for c in range(b):
            w[i, c] = x[c]


@njit(cache=True, nogil=True)
def implicit_observed_loss(c1, target, pred):
    """``sum (1 + c1) (p - pred)^2 - pred^2`` over the observations (p = 1 where target > 0):
    the observed pairs' part of the implicit objective, beyond the all-pairs ``sum pred^2``."""
    s = 0.0
    for n in range(pred.shape[0]):
        q = pred[n]
        p = 1.0 if target[n] > 0.0 else 0.0
        e = p - q
        s += (1.0 + c1[n]) * e * e - q * q
    return s
