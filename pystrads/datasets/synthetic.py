"""Synthetic sparse regression problems (benchmarks and tests).

:func:`strads_lasso_problem` is the STRADS paper's Lasso generator (NIPS'14
§5.1): every column has ``nnz_per_col`` non-zeros ~ U(0, 1) at random rows;
with probability ``corr_prob`` a column copies the previous column's rows
with values ``0.9 x_{j-1} + 0.1 U(0, 1)`` (adjacent correlated features).
:func:`uniform_sparse_problem` scatters ``nnz`` non-zeros uniformly.

Both return a :class:`SparseProblem`: the rows of X in CSR form, the label
and the true coefficients (``support`` non-zeros ~ N(0, 1)); ``y = X beta* +
noise * N(0, 1)``.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Tuple

import numpy as np


@dataclasses.dataclass
class SparseProblem:
    row_ptr: np.ndarray
    col_idx: np.ndarray
    vals: np.ndarray
    y: np.ndarray
    beta_true: np.ndarray

    @property
    def shape(self) -> Tuple[int, int]:
        return len(self.row_ptr) - 1, len(self.beta_true)

    @property
    def nnz(self) -> int:
        return len(self.vals)

    def rows(self) -> Iterator[Tuple[float, np.ndarray, np.ndarray]]:
        """``(label, indices, values)`` per row."""
        for i in range(self.shape[0]):
            a, b = self.row_ptr[i], self.row_ptr[i + 1]
            yield float(self.y[i]), self.col_idx[a:b], self.vals[a:b]

    def dense(self) -> np.ndarray:
        """X as a dense array (small problems only)."""
        n, J = self.shape
        x = np.zeros((n, J))
        for i in range(n):
            a, b = self.row_ptr[i], self.row_ptr[i + 1]
            np.add.at(x[i], self.col_idx[a:b], self.vals[a:b])
        return x

    def to_dataframe(self, spark, num_partitions: int = 2, label: str = "label", features: str = "features"):
        """A DataFrame ``(label double, features vector)`` with sparse vectors."""
        from pyspark.ml.linalg import SparseVector, VectorUDT
        from pyspark.sql import types as T

        n, J = self.shape
        schema = T.StructType([T.StructField(label, T.DoubleType(), False),
                               T.StructField(features, VectorUDT(), False)])
        rows = []
        for y, idx, val in self.rows():  # vectors need sorted unique indices: repeated positions add up
            uniq, inverse = np.unique(idx, return_inverse=True)
            rows.append((y, SparseVector(J, uniq.tolist(), np.bincount(inverse, weights=val).tolist())))
        return spark.createDataFrame(rows, schema).repartition(num_partitions)


def _from_columns(n: int, J: int, col_ptr: np.ndarray, rows: np.ndarray, vals: np.ndarray,
                  rng: np.random.Generator, support: int, noise: float) -> SparseProblem:
    from ..kernels.cd import rows_to_csc

    # the CSC -> CSR transpose is the same permutation as CSR -> CSC
    row_ptr, col_idx, row_vals = rows_to_csc(col_ptr, rows.astype(np.int64), vals, n)
    beta = np.zeros(J)
    chosen = rng.choice(J, size=min(support, J), replace=False)
    beta[chosen] = rng.standard_normal(len(chosen))
    y = np.zeros(n)
    for i in range(n):  # X beta row by row
        a, b = row_ptr[i], row_ptr[i + 1]
        y[i] = row_vals[a:b] @ beta[col_idx[a:b]]
    y += noise * rng.standard_normal(n)
    return SparseProblem(row_ptr, col_idx.astype(np.int64), row_vals, y, beta)


def strads_lasso_problem(n: int, J: int, nnz_per_col: int = 25, corr_prob: float = 0.1, support: int = 0,
                         noise: float = 0.1, seed: int = 0) -> SparseProblem:
    """The STRADS Lasso generator; ``support`` defaults to ``J // 100`` true non-zeros."""
    rng = np.random.default_rng(seed)
    k = min(nnz_per_col, n)
    rows = np.empty((J, k), dtype=np.int64)
    vals = rng.random((J, k))
    for j in range(J):
        if j > 0 and rng.random() < corr_prob:
            rows[j] = rows[j - 1]
            vals[j] = 0.9 * vals[j - 1] + 0.1 * vals[j]
        else:
            rows[j] = np.sort(rng.choice(n, size=k, replace=False))
    col_ptr = np.arange(J + 1, dtype=np.int64) * k
    return _from_columns(n, J, col_ptr, rows.ravel(), vals.ravel(), rng, support or max(1, J // 100), noise)


def uniform_sparse_problem(n: int, J: int, nnz: int, support: int = 0, noise: float = 0.1,
                           seed: int = 0) -> SparseProblem:
    """``nnz`` non-zeros ~ U(0, 1) at uniformly random (row, column) positions."""
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.integers(0, J, size=nnz))
    rows = rng.integers(0, n, size=nnz)
    col_ptr = np.zeros(J + 1, dtype=np.int64)
    np.cumsum(np.bincount(cols, minlength=J), out=col_ptr[1:])
    return _from_columns(n, J, col_ptr, rows, rng.random(nnz), rng, support or max(1, J // 100), noise)


def lambda_max(problem: SparseProblem, fit_intercept: bool = False) -> float:
    """Smallest ``regParam`` (sklearn's ``alpha``, no standardisation) with an all-zero solution."""
    n, J = problem.shape
    y = problem.y - (problem.y.mean() if fit_intercept else 0.0)
    g = np.zeros(J)
    for i in range(n):
        a, b = problem.row_ptr[i], problem.row_ptr[i + 1]
        g[problem.col_idx[a:b]] += problem.vals[a:b] * y[i]
    if fit_intercept:
        colsum = np.bincount(problem.col_idx, weights=problem.vals, minlength=J)
        g -= colsum * y.sum() / n
    return float(np.abs(g).max() / n)


def low_rank_ratings(num_users: int = 300, num_items: int = 200, rank: int = 4, density: float = 0.15,
                     noise: float = 0.25, seed: int = 0):
    """Explicit ratings from a known low-rank model: ``pandas.DataFrame(userId, movieId, rating)``.

    ``rating = 1 + 4 * sigmoid(u . v) + noise`` clipped to [0.5, 5], observed with
    probability ``density``; popular items are seen more often (item propensity
    ~ Zipf-like), like real ratings.  Ids are int32 and not contiguous
    (``userId = 10 * u + 1``) so code cannot rely on dense ids.
    """
    import pandas as pd

    rng = np.random.default_rng(seed)
    u = rng.normal(0, 1.0, (num_users, rank))
    v = rng.normal(0, 1.0, (num_items, rank))
    scores = 1.0 + 4.0 / (1.0 + np.exp(-(u @ v.T) / np.sqrt(rank)))
    propensity = 1.0 / np.arange(1, num_items + 1) ** 0.5
    propensity *= density * num_items / propensity.sum()
    seen = rng.random((num_users, num_items)) < np.minimum(propensity, 1.0)[None, :]
    uu, ii = np.nonzero(seen)
    ratings = np.clip(scores[uu, ii] + noise * rng.standard_normal(len(uu)), 0.5, 5.0)
    return pd.DataFrame({"userId": (10 * uu + 1).astype(np.int32), "movieId": (7 * ii + 3).astype(np.int32),
                         "rating": np.round(ratings * 2) / 2})
