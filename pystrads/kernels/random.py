"""Explicit random state for numba kernels.

Kernels never call ``np.random``: the caller owns a small ``uint64`` state
array and passes it in, the kernel advances it in place (the habit of umap's
``tau_rand``).  Same state in, same numbers out, in any process.

The generator is xoshiro256** (Blackman & Vigna, "Scrambled linear
pseudorandom number generators", 2021) with a 4-word state, seeded through
splitmix64 so that nearby seeds and streams give unrelated states.

Typical use::

    state = new_state(seed, stream=worker_index)   # Python side
    kernel(..., state)                               # kernel draws uniform(state)
"""

import numpy as np
from numba import njit

#: Number of ``uint64`` words in a generator state.
STATE_SIZE = 4

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_STAR = np.uint64(5)
_NINE = np.uint64(9)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53


@njit(cache=True, nogil=True, inline="always")
def _rotl(x, k):
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@njit(cache=True, nogil=True)
def _splitmix64_mix(z):
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def seed_state(state, seed, stream):
    """Fill ``state`` from a seed and a stream number (splitmix64 expansion).

    Parameters
    ----------
    state : ndarray of uint64, shape (STATE_SIZE,)
        Overwritten in place.
    seed, stream : uint64
        Any 64-bit values; ``(seed, stream)`` pairs that differ in either
        part give unrelated states (use ``stream`` for worker / round ids).
    """
    z = _splitmix64_mix(seed + _GOLDEN_GAMMA) ^ _splitmix64_mix(
        stream * _MIX2 + _MIX1
    )
    for i in range(STATE_SIZE):
        z = z + _GOLDEN_GAMMA
        state[i] = _splitmix64_mix(z)
    # xoshiro must not start from the all-zero state.
    if state[0] == 0 and state[1] == 0 and state[2] == 0 and state[3] == 0:
        state[0] = _GOLDEN_GAMMA


@njit(cache=True, nogil=True)
def seed_states(states, seed, streams):
    """Row ``i`` of ``states`` from ``(seed, streams[i])`` (see :func:`seed_state`)."""
    for i in range(states.shape[0]):
        seed_state(states[i], seed, streams[i])


def new_state(seed, stream=0):
    """Return a fresh generator state for ``(seed, stream)``.

    Parameters
    ----------
    seed : int
        Any Python int (reduced modulo 2**64).
    stream : int, default 0
        Independent stream number, e.g. ``worker * 2**32 + round``.

    Returns
    -------
    ndarray of uint64, shape (STATE_SIZE,)
    """
    state = np.zeros(STATE_SIZE, dtype=np.uint64)
    seed_state(state, np.uint64(int(seed) & _MASK64), np.uint64(int(stream) & _MASK64))
    return state


@njit(cache=True, nogil=True, inline="always")
def next_uint64(state):
    """Advance ``state`` in place and return the next 64 random bits (xoshiro256**)."""
    s0 = state[0]
    s1 = state[1]
    s2 = state[2]
    s3 = state[3]
    result = _rotl(s1 * _STAR, 7) * _NINE
    t = s1 << np.uint64(17)
    s2 ^= s0
    s3 ^= s1
    s1 ^= s2
    s0 ^= s3
    s2 ^= t
    s3 = _rotl(s3, 45)
    state[0] = s0
    state[1] = s1
    state[2] = s2
    state[3] = s3
    return result


@njit(cache=True, nogil=True, inline="always")
def uniform(state):
    """Return a float64 uniform on [0, 1) (53 random bits) and advance ``state``."""
    return np.float64(next_uint64(state) >> np.uint64(11)) * _TO_UNIT


@njit(cache=True, nogil=True, inline="always")
def randint(state, n):
    """Return an int64 uniform on [0, n) for ``0 < n < 2**31`` and advance ``state``."""
    k = np.int64(uniform(state) * n)
    if k >= n:  # cannot happen for n < 2**53; kept for safety
        k = n - 1
    return k
