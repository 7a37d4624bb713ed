"""Coordinate-descent kernels for matrix factorisation (CCD++ rank-one updates).

Ratings of one worker are stored once, indexed two ways:

``rating_user`` int32[n], ``rating_item`` int32[n]
    local user index and local item index of each rating;
``user_ptr`` int64[n_users + 1], ``user_ratings`` int32[n]
    ratings of each local user (CSR);
``item_ptr`` int64[n_items + 1], ``item_ratings`` int32[n]
    ratings of each local item (CSC).

The STRADS MF supplement (eq. 3-5) updates one coordinate of W or H from
sums over the ratings; CCD++ (Yu et al. 2012) orders those updates by
feature: for feature k, with ``rhat = r + w_k h_k`` (the residual with
feature k added back)::

    h_jk = sum_i rhat_ij w_ik / (lambda_j + sum_i w_ik^2)     (items, summed over workers)
    w_ik = sum_j rhat_ij h_jk / (lambda_i + sum_j h_jk^2)     (users, local)

and finally ``r = rhat - w_k h_k``.  Kernels never validate input.
"""

import numpy as np
from numba import njit


@njit(cache=True)
def add_rank_one(residual, rating_user, rating_item, u, v, sign, out):
    """``out[n] = residual[n] + sign * u[user(n)] * v[item(n)]`` for every rating."""
    for n in range(residual.shape[0]):
        out[n] = residual[n] + sign * u[rating_user[n]] * v[rating_item[n]]


@njit(cache=True)
def item_partials(item_ptr, item_ratings, rating_user, rhat, u, num, den):
    """Per local item j: ``num[j] = sum rhat * u_i``, ``den[j] = sum u_i^2`` over its ratings."""
    for j in range(item_ptr.shape[0] - 1):
        a = 0.0
        b = 0.0
        for p in range(item_ptr[j], item_ptr[j + 1]):
            n = item_ratings[p]
            ui = u[rating_user[n]]
            a += rhat[n] * ui
            b += ui * ui
        num[j] = a
        den[j] = b


@njit(cache=True)
def user_update(user_ptr, user_ratings, rating_item, rhat, v, reg, u):
    """Per local user i: ``u[i] = sum rhat * v_j / (reg[i] + sum v_j^2)`` over its ratings
    (``reg[i]`` = lambda times the user's number of ratings, as ALS scales it)."""
    for i in range(user_ptr.shape[0] - 1):
        a = 0.0
        b = reg[i]
        for p in range(user_ptr[i], user_ptr[i + 1]):
            n = user_ratings[p]
            vj = v[rating_item[n]]
            a += rhat[n] * vj
            b += vj * vj
        u[i] = a / b if b > 0.0 else 0.0


@njit(cache=True)
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
