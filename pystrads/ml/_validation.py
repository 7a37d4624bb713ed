"""Input checks shared by the estimators: each refuses before any training starts and
names the param or column, the offending value and the fix."""

from __future__ import annotations

import math
from ..errors import InputError

INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1


def _fmt(x, integral: bool = True) -> str:
    if x is None:
        return "null"
    if integral and isinstance(x, float) and math.isfinite(x) and x == int(x) and abs(x) < 1e18:
        return str(int(x))
    return repr(float(x)) if isinstance(x, float) else repr(x)


def bad_rating_rows(u, i, r) -> "np.ndarray":
    """Positions of the ratings StradsMF refuses, from numpy columns (nulls as NaN): ids that are
    not integers within int32 (ALS's rule; negative ids are fine, as in ALS), ratings that are not
    finite."""
    import numpy as np

    def bad_id(x):
        with np.errstate(invalid="ignore"):
            return ~np.isfinite(x) | (x < INT32_MIN) | (x > INT32_MAX) | (x != np.floor(x))

    return np.flatnonzero(bad_id(u) | bad_id(i) | ~np.isfinite(r))


def refuse_ratings(n: int, bad, ucol: str, icol: str, rcol: str) -> None:
    """Refuse ``n`` ratings of which ``bad`` (a row ``(u, i, r)``, nulls as None; see
    :func:`bad_rating_rows`) is refused, if any, or none at all, naming the column, the value
    and the row."""
    if n == 0:
        raise InputError("the input has no ratings; StradsMF needs at least one (user, item, rating) row")
    if bad is None:
        return
    u, i, rating = bad
    where = f"(row {ucol}={_fmt(u)}, {icol}={_fmt(i)}, {rcol}={_fmt(rating, False)})"
    for param, col, value in (("userCol", ucol, u), ("itemCol", icol, i)):
        if value is None:
            raise InputError(f"{param} {col!r} is null in a row {where}: ids must be integers within int32, as ALS "
                             f"requires; filter these rows (e.g. df.dropna(subset=[{col!r}]))")
        if not (math.isfinite(value) and value == math.floor(value) and INT32_MIN <= value <= INT32_MAX):
            raise InputError(f"{param} {col!r} has value {_fmt(value)} {where}: ids must be integers within int32 "
                             f"[{INT32_MIN}, {INT32_MAX}], as ALS requires; re-index the ids (e.g. StringIndexer) "
                             "or filter these rows")
    if rating is None:
        raise InputError(f"ratingCol {rcol!r} is null in a row {where}: ratings must be finite numbers; filter these "
                         f"rows (e.g. df.dropna(subset=[{rcol!r}]))")
    raise InputError(f"ratingCol {rcol!r} has value {_fmt(rating, False)} {where}: ratings must be finite numbers; "
                     "filter or impute these rows")
