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


def check_ratings(triples, ucol: str, icol: str, rcol: str) -> None:
    """One Spark job over ``triples`` (columns u, i, r as double): refuses empty input, null ids or
    ratings, ids that are not integers within int32 (ALS's rule; negative ids are fine, as in ALS)
    and ratings that are not finite, naming the column, the value and the row."""
    from pyspark.sql import functions as F

    def bad_id(c):  # null, NaN, infinite, out of int32, fractional (floor only inside int32: ANSI mode overflows)
        return F.when((c >= INT32_MIN) & (c <= INT32_MAX), c != F.floor(c)).otherwise(F.lit(True))

    r = F.col("r")
    bad = bad_id(F.col("u")) | bad_id(F.col("i")) | r.isNull() | F.isnan(r) | (F.abs(r) == float("inf"))
    row = triples.agg(F.count(F.lit(1)).alias("n"),
                      F.first(F.when(bad, F.struct("u", "i", "r")), ignorenulls=True).alias("bad")).collect()[0]
    if row["n"] == 0:
        raise InputError("the input has no ratings; StradsMF needs at least one (user, item, rating) row")
    if row["bad"] is None:
        return
    u, i, rating = row["bad"]
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
