"""The F+ tree: a complete binary sum tree over the K topics (Yu et al., F+LDA, WWW 2015).

Leaf ``t`` sits at ``tree[offset + t]`` (``offset`` the smallest power of two
>= K, padding leaves zero) and node ``n`` holds the sum of its children
``2n`` and ``2n + 1``, so ``tree[1]`` is the total.  Setting a leaf and
drawing a leaf in proportion to its weight both cost O(log K).
``_tree_switch_word`` points the tree at another word's leaves
``(n_wt + β) f_t`` (the samplers pass ``f_t = α_t / (n_t + Vβ)``) touching
only the two words' non-zero topics.  Inline helpers of the ``"fplus"`` and ``"mh"`` samplers
(:mod:`.samplers`); no public kernel.
"""

from numba import njit

from .counts import _word_nz_scan


@njit(cache=True, nogil=True, inline="always")
def _tree_leaf_offset(n_topics):
    offset = 1
    while offset < n_topics:
        offset <<= 1
    return offset


@njit(cache=True, nogil=True, inline="always")
def _tree_rebuild(tree, offset):
    # Leaves live at tree[offset + t]; padding leaves are zero.
    for node in range(offset - 1, 0, -1):
        tree[node] = tree[2 * node] + tree[2 * node + 1]


@njit(cache=True, nogil=True, inline="always")
def _tree_set(tree, offset, t, value):
    # Recompute ancestors from their children (no accumulated rounding drift).
    node = offset + t
    tree[node] = value
    node >>= 1
    while node >= 1:
        tree[node] = tree[2 * node] + tree[2 * node + 1]
        node >>= 1


@njit(cache=True, nogil=True, inline="always")
def _tree_sample(tree, offset, n_topics, u):
    # Leaf t with prefix(t) <= u < prefix(t) + leaf(t), for u in [0, tree[1]).
    node = 1
    while node < offset:
        left = 2 * node
        if u < tree[left]:
            node = left
        else:
            u -= tree[left]
            node = left + 1
    t = node - offset
    if t >= n_topics:  # rounding walked into the zero padding
        t = n_topics - 1
    return t


@njit(cache=True, nogil=True, inline="always")
def _tree_depth(offset):
    depth = 0
    while (1 << depth) < offset:
        depth += 1
    return depth


@njit(cache=True, nogil=True, inline="always")
def _tree_switch_word(tree, offset, depth, row, beta, inv_denom,
                      word_nz_topics, word_nz_pos, word_nz_count):
    # The tree holds (n_wt + β) inv_denom[t] for the current word (the samplers
    # pass inv_denom[t] = α_t / (n_t + Vβ)).
    # Outside the word's non-zero topics a leaf is β inv_denom[t], whatever
    # the word, so switching words only touches the leaves of the old and the
    # new word's non-zero topics: O((K_w_old + K_w_new) log K) instead of an
    # O(K) rebuild, which matters for the many rare words of a Zipf corpus.
    # Returns the new word's number of non-zero topics.
    n_topics = row.shape[0]
    full = word_nz_count * depth >= n_topics
    if not full:
        for j in range(word_nz_count):
            t = word_nz_topics[j]
            _tree_set(tree, offset, t, beta * inv_denom[t])
    count = _word_nz_scan(row, word_nz_topics, word_nz_pos, word_nz_count)
    if full or count * depth >= n_topics:
        for t in range(n_topics):
            tree[offset + t] = (row[t] + beta) * inv_denom[t]
        _tree_rebuild(tree, offset)
    else:
        for j in range(count):
            t = word_nz_topics[j]
            _tree_set(tree, offset, t, (row[t] + beta) * inv_denom[t])
    return count
