"""Issue 6: every malformed input is refused within seconds, before any training starts.

One test id per (estimator, case). Each case builds a tiny DataFrame, calls
``fit`` and checks the exception type and that the message names the column
or param, the offending value and the fix. "Before training" is checked three
ways: ``Engine.fit`` (which starts the shards and the training steps) is
patched to fail if reached, the refusal must come within ``REFUSE_WITHIN_S``
seconds, and the Spark jobs run for it are counted: none for params and
schema problems, at most the one input scan for bad values.

Also here: what is accepted on purpose (negative StradsMF ids, as ALS;
empty LDA documents, skipped and counted).
"""

import time
from typing import Callable, List, NamedTuple

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql import types as T

from pystrads.engine.driver.engine import Engine
from pystrads.errors import ConfigurationError, InputError
from pystrads.ml import StradsLDA, StradsLasso, StradsLogisticRegression, StradsMF
from pystrads.ps import launcher

NAN, INF = float("nan"), float("inf")
INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1
REFUSE_WITHIN_S = 20.0  # generous: the machine is shared; refusals take well under a second
SCAN_JOBS = 1  # a bad value may cost the one validation scan job, nothing more
MF_SCAN_JOBS = 1  # StradsMF's scan: one job that checks the ratings and reduces them to their ids
LDA_SCAN_JOBS = 1  # StradsLDA's scan: one job while its term counts are few (a second sums them past that)


class Case(NamedTuple):
    id: str
    estimator: Callable[[], object]
    data: Callable[[object], object]  # spark -> DataFrame
    exc: type
    expect: List[str]  # substrings the message must contain: name, value, fix
    max_jobs: int  # Spark jobs allowed before the refusal


# ----------------------------------------------------------------------------- data
LIN_SCHEMA = T.StructType([T.StructField("label", T.DoubleType()), T.StructField("w", T.DoubleType()),
                           T.StructField("name", T.StringType()), T.StructField("features", VectorUDT())])
LIN_GOOD = [(0.0, 1.0, "a", Vectors.dense([1.0, 2.0])), (1.0, 2.0, "b", Vectors.sparse(2, [1], [3.0])),
            (1.0, 1.0, "c", Vectors.dense([0.5, -1.0]))]


def lin(*extra, rows=None):
    return lambda spark: spark.createDataFrame(list(rows if rows is not None else LIN_GOOD) + list(extra),
                                               LIN_SCHEMA)


LDA_SCHEMA = T.StructType([T.StructField("features", VectorUDT()), T.StructField("text", T.StringType()),
                           T.StructField("n", T.DoubleType())])
LDA_GOOD = [Vectors.sparse(4, [0, 1], [1.0, 2.0]), Vectors.dense([0.0, 0.0, 3.0, 1.0]),
            Vectors.sparse(4, [2, 3], [1.0, 1.0])]


def docs(*extra, rows=None):
    vecs = list(rows if rows is not None else LDA_GOOD) + list(extra)
    return lambda spark: spark.createDataFrame([(v, "t", 1.0) for v in vecs], LDA_SCHEMA)


MF_GOOD = [(0, 0, 4.0), (0, 1, 2.0), (1, 1, 3.0), (2, 0, 5.0)]
FLOAT_IDS = "user double, item double, rating double"
MF_GOOD_FLOAT_IDS = [(float(u), float(i), r) for u, i, r in MF_GOOD]


def ratings(*extra, ddl="user long, item long, rating double", rows=None):
    return lambda spark: spark.createDataFrame(list(rows if rows is not None else MF_GOOD) + list(extra), ddl)


def empty(make):
    return lambda spark: make(spark).limit(0)


def no_rows(schema):
    return lambda spark: spark.createDataFrame([], schema)  # has partitions, but no rows


# ----------------------------------------------------------------------------- cases
def linear_cases(name, cls) -> List[Case]:
    def est(**params):
        return lambda: cls(**params)

    def p(label, params, expect):  # a param out of range: refused before any job
        return Case(f"{name}-param-{label}", est(**params), lin(), ConfigurationError, expect, 0)

    def s(label, params, expect):  # a missing or wrongly typed column: refused before any job
        return Case(f"{name}-schema-{label}", est(**params), lin(), InputError, expect, 0)

    def v(label, data, expect, params=None):  # a bad value: refused by the input scan
        return Case(f"{name}-value-{label}", est(**(params or {})), data, InputError, expect, SCAN_JOBS)

    cases = [
        p("regParam-negative", {"regParam": -1.0}, ["regParam=-1.0", "must be a finite number >= 0"]),
        p("regParam-nan", {"regParam": NAN}, ["regParam=nan", "must be a finite number >= 0"]),
        p("regParam-inf", {"regParam": INF}, ["regParam=inf", "must be a finite number >= 0"]),
        p("elasticNetParam-high", {"elasticNetParam": 1.5}, ["elasticNetParam=1.5", "must be in [0, 1]"]),
        p("elasticNetParam-nan", {"elasticNetParam": NAN}, ["elasticNetParam=nan", "must be in [0, 1]"]),
        p("maxIter-negative", {"maxIter": -3}, ["maxIter=-3", "must be >= 0"]),
        p("tol-0", {"tol": 0.0}, ["tol=0.0", "> 0"]),
        p("tol-negative", {"tol": -1e-6}, ["tol=-1e-06", "> 0"]),
        p("tol-nan", {"tol": NAN}, ["tol=nan", "> 0"]),
        p("tol-inf", {"tol": INF}, ["tol=inf", "finite"]),
        p("schedule", {"schedule": "random"}, ["schedule='random'", "'dynamic'"]),
        p("priority", {"priority": "size"}, ["priority='size'", "'gradient'"]),
        p("coordinatesPerRound", {"coordinatesPerRound": 0}, ["coordinatesPerRound=0", "must be 'auto' or >= 1"]),
        p("candidatesPerRound", {"coordinatesPerRound": 8, "candidatesPerRound": 4},
          ["candidatesPerRound=4", "must be 'auto' or >= coordinatesPerRound (8)"]),
        p("correlationThreshold-0", {"correlationThreshold": 0.0}, ["correlationThreshold=0.0", "(0, 1]"]),
        p("correlationThreshold-above-1", {"correlationThreshold": 1.5}, ["correlationThreshold=1.5", "(0, 1]"]),
        p("correlationThreshold-nan", {"correlationThreshold": NAN}, ["correlationThreshold=nan", "(0, 1]"]),
        p("correlationSampleSize", {"correlationSampleSize": 0}, ["correlationSampleSize=0", "must be >= 1"]),
        p("workingSetLimit-negative", {"workingSetLimit": -1}, ["workingSetLimit=-1", "[0, 16384]"]),
        p("workingSetLimit-too-big", {"workingSetLimit": 20000}, ["workingSetLimit=20000", "[0, 16384]"]),
        p("numWorkers-negative", {"numWorkers": -1}, ["numWorkers=-1", "must be >= 0"]),
        p("numWorkers-too-many", {"numWorkers": 5}, ["numWorkers=5", "task slots", "lower numWorkers to 2"]),
        s("featuresCol-missing", {"featuresCol": "nope"},
          ["featuresCol 'nope' is not a column", "'features'", "set featuresCol"]),
        s("labelCol-missing", {"labelCol": "nope"}, ["labelCol 'nope' is not a column", "set labelCol"]),
        s("weightCol-missing", {"weightCol": "nope"}, ["weightCol 'nope' is not a column", "set weightCol"]),
        s("featuresCol-string", {"featuresCol": "name"},
          ["featuresCol 'name' has type string", "expected a vector column", "VectorAssembler"]),
        s("featuresCol-double", {"featuresCol": "label"},
          ["featuresCol 'label' has type double", "expected a vector column", "VectorAssembler"]),
        s("labelCol-string", {"labelCol": "name"},
          ["labelCol 'name' has type string", "expected a numeric column", "cast"]),
        s("labelCol-vector", {"labelCol": "features"},
          ["labelCol 'features' has type vector", "expected a numeric column"]),
        s("weightCol-string", {"weightCol": "name"},
          ["weightCol 'name' has type string", "expected a numeric column", "cast"]),
        v("features-nan", lin((1.0, 1.0, "x", Vectors.dense([1.0, NAN]))),
          ["featuresCol 'features' has a value nan", "Imputer"]),
        v("features-inf", lin((1.0, 1.0, "x", Vectors.sparse(2, [0], [INF]))),
          ["featuresCol 'features' has a value inf", "Imputer"]),
        v("features-minus-inf", lin((1.0, 1.0, "x", Vectors.dense([-INF, 1.0]))),
          ["featuresCol 'features' has a value -inf", "Imputer"]),
        v("features-null", lin((1.0, 1.0, "x", None)), ["featuresCol 'features' is null", "drop or fill"]),
        v("label-nan", lin((NAN, 1.0, "x", Vectors.dense([1.0, 2.0]))),
          ["labelCol 'label' has value nan", "drop the rows or fill"]),
        v("label-inf", lin((INF, 1.0, "x", Vectors.dense([1.0, 2.0]))),
          ["labelCol 'label' has value inf", "drop the rows or fill"]),
        v("label-null", lin((None, 1.0, "x", Vectors.dense([1.0, 2.0]))),
          ["labelCol 'label' has value None", "drop the rows or fill"]),
        v("weight-nan", lin((1.0, NAN, "x", Vectors.dense([1.0, 2.0]))),
          ["weightCol 'w' has value nan", "finite and >= 0"], {"weightCol": "w"}),
        v("weight-inf", lin((1.0, INF, "x", Vectors.dense([1.0, 2.0]))),
          ["weightCol 'w' has value inf", "finite and >= 0"], {"weightCol": "w"}),
        v("weight-negative", lin((1.0, -1.0, "x", Vectors.dense([1.0, 2.0]))),
          ["weightCol 'w' has value -1.0", "finite and >= 0"], {"weightCol": "w"}),
        v("weight-null", lin((1.0, None, "x", Vectors.dense([1.0, 2.0]))),
          ["weightCol 'w' has value None", "finite and >= 0"], {"weightCol": "w"}),
        v("weights-all-zero", lin(rows=[r[:1] + (0.0,) + r[2:] for r in LIN_GOOD]),
          ["weightCol 'w'", "sum to 0.0", "positive weight"], {"weightCol": "w"}),
        v("vector-sizes-differ", lin((1.0, 1.0, "x", Vectors.dense([1.0, 2.0, 3.0]))),
          ["featuresCol 'features'", "different sizes [2, 3]", "same number of features"]),
        v("vectors-size-0", lin(rows=[(1.0, 1.0, "x", Vectors.dense([]))]),
          ["featuresCol 'features'", "size 0", "nothing to fit"]),
        v("empty-limit-0", empty(lin()), ["the input has no rows", "at least one (label, features) row"]),
        v("empty-no-rows", no_rows(LIN_SCHEMA), ["the input has no rows", "at least one (label, features) row"]),
    ]
    if cls is StradsLasso:
        cases += [
            p("relaxation-2", {"relaxation": 2.0}, ["relaxation=2.0", "must be in (0, 2)", "1 is plain"]),
            p("relaxation-0", {"relaxation": 0.0}, ["relaxation=0.0", "must be in (0, 2)"]),
            p("relaxation-nan", {"relaxation": NAN}, ["relaxation=nan", "must be in (0, 2)"]),
        ]
    if cls is StradsLogisticRegression:
        cases += [
            p("threshold-negative", {"threshold": -0.1}, ["threshold=-0.1", "[0, 1]"]),
            p("threshold-above-1", {"threshold": 1.5}, ["threshold=1.5", "[0, 1]"]),
            p("family", {"family": "gaussian"}, ["family='gaussian'", "'binomial'", "'multinomial'"]),
            v("label-2-binomial", lin((2.0, 1.0, "x", Vectors.dense([1.0, 2.0]))),
              ["family='binomial' fits two classes", "labelCol 'label' has 3", "family='multinomial'"],
              {"family": "binomial"}),
            v("label-minus-1", lin((-1.0, 1.0, "x", Vectors.dense([1.0, 2.0]))),
              ["labelCol 'label' has value -1.0", "class indices 0, 1, 2", "StringIndexer"]),
            v("label-fractional", lin((0.5, 1.0, "x", Vectors.dense([1.0, 2.0]))),
              ["labelCol 'label' has value 0.5", "class indices 0, 1, 2", "StringIndexer"]),
        ]
    return cases


def lda_cases() -> List[Case]:
    def est(**params):
        return lambda: StradsLDA(**{"maxIter": 1, **params})

    def p(label, params, expect):
        return Case(f"lda-param-{label}", est(**params), docs(), ConfigurationError, expect, 0)

    def s(label, params, expect):
        return Case(f"lda-schema-{label}", est(**params), docs(), InputError, expect, 0)

    def v(label, data, expect):
        return Case(f"lda-value-{label}", est(k=2), data, InputError, expect, LDA_SCAN_JOBS)

    fix = "term counts must be finite non-negative integers (CountVectorizer output)"
    return [
        p("k-1", {"k": 1}, ["k=1", "must be >= 2", "at least 2 topics"]),
        p("k-0", {"k": 0}, ["k=0", "must be >= 2"]),
        p("k-negative", {"k": -3}, ["k=-3", "must be >= 2"]),
        p("maxIter-negative", {"maxIter": -1}, ["maxIter=-1", "must be >= 0"]),
        p("docConcentration-negative", {"docConcentration": [-1.0]},
          ["docConcentration=[-1.0]", "must be finite numbers > 0", "e.g. [5]"]),
        p("docConcentration-0", {"docConcentration": [0.0]}, ["docConcentration=[0.0]", "finite numbers > 0"]),
        p("docConcentration-nan", {"docConcentration": [NAN]}, ["docConcentration=[nan]", "finite numbers > 0"]),
        p("docConcentration-inf", {"docConcentration": [INF]}, ["docConcentration=[inf]", "finite numbers > 0"]),
        p("docConcentration-length-2-for-k-10", {"docConcentration": [0.1, 0.2]},
          ["docConcentration=[0.1, 0.2]", "one value (a symmetric prior", "docConcentration=[5]",
           "or 10 values, one per topic"]),
        p("docConcentration-wrong-length", {"k": 2, "docConcentration": [1.0, 1.0, 1.0]},
          ["docConcentration=[1.0, 1.0, 1.0]", "or 2 values, one per topic"]),
        p("optimizeInterval-0", {"optimizeDocConcentration": True, "optimizeInterval": 0},
          ["optimizeInterval=0", "must be >= 1"]),
        p("optimizeBurnIn-negative", {"optimizeBurnIn": -3}, ["optimizeBurnIn=-3", "must be >= 0"]),
        p("topicConcentration-0", {"topicConcentration": 0.0}, ["topicConcentration=0.0", "finite number > 0"]),
        p("topicConcentration-negative", {"topicConcentration": -1.0},
          ["topicConcentration=-1.0", "finite number > 0", "e.g. 0.1"]),
        p("topicConcentration-nan", {"topicConcentration": NAN}, ["topicConcentration=nan", "finite number > 0"]),
        p("topicConcentration-inf", {"topicConcentration": INF}, ["topicConcentration=inf", "finite number > 0"]),
        p("numWorkers-negative", {"numWorkers": -1}, ["numWorkers=-1", "must be >= 0"]),
        p("numWorkers-too-many", {"numWorkers": 5}, ["numWorkers=5", "task slots", "lower numWorkers to 2"]),
        p("sampler", {"sampler": "magic"}, ["sampler='magic'", "'auto'", "'sparse'"]),
        p("logLikelihoodEvery", {"logLikelihoodEvery": -1}, ["logLikelihoodEvery=-1", "must be >= 0"]),
        p("foldInIterations", {"foldInIterations": 1}, ["foldInIterations=1", "must be >= 2"]),
        p("checkpointInterval-0", {"checkpointInterval": 0}, ["checkpointInterval=0", ">= 1, or -1"]),
        p("checkpointInterval-negative", {"checkpointInterval": -2}, ["checkpointInterval=-2", ">= 1, or -1"]),
        s("featuresCol-missing", {"featuresCol": "nope"},
          ["featuresCol 'nope' is not a column", "'features'", "set featuresCol"]),
        s("featuresCol-string", {"featuresCol": "text"},
          ["featuresCol 'text' has type string", "expected a vector of term counts", "CountVectorizer"]),
        s("featuresCol-double", {"featuresCol": "n"},
          ["featuresCol 'n' has type double", "expected a vector of term counts", "CountVectorizer"]),
        v("count-negative", docs(Vectors.sparse(4, [1], [-1.0])), ["featuresCol 'features'", "count -1.0", fix]),
        v("count-fractional", docs(Vectors.sparse(4, [2], [0.5])), ["featuresCol 'features'", "count 0.5", fix]),
        v("count-nan", docs(Vectors.dense([0.0, NAN, 0.0, 1.0])), ["featuresCol 'features'", "count nan", fix]),
        v("count-inf", docs(Vectors.dense([0.0, INF, 0.0, 1.0])), ["featuresCol 'features'", "count inf", fix]),
        v("count-minus-inf", docs(Vectors.sparse(4, [3], [-INF])), ["featuresCol 'features'", "count -inf", fix]),
        v("vector-sizes-differ", docs(Vectors.sparse(5, [0], [1.0])),
          ["featuresCol 'features'", "different sizes [4, 5]", "one CountVectorizer model"]),
        v("all-documents-empty", docs(rows=[Vectors.sparse(4, [], [])] * 2 + [Vectors.dense([0.0] * 4)]),
          ["featuresCol 'features'", "no document has any term (3 empty", "at least one non-empty document"]),
        v("all-documents-null", docs(rows=[None, None]),
          ["featuresCol 'features'", "no document has any term (0 empty, 2 null rows)"]),
        v("empty-limit-0", empty(docs()), ["featuresCol 'features'", "the input has no rows",
                                           "at least one non-empty document"]),
        v("empty-no-rows", no_rows(LDA_SCHEMA), ["featuresCol 'features'", "the input has no rows",
                                                 "at least one non-empty document"]),
    ]


def mf_cases() -> List[Case]:
    def est(**params):
        return lambda: StradsMF(**{"rank": 2, "maxIter": 1, **params})

    def p(label, params, expect):
        return Case(f"mf-param-{label}", est(**params), ratings(), ConfigurationError, expect, 0)

    def s(label, params, data, expect):
        return Case(f"mf-schema-{label}", est(**params), data, InputError, expect, 0)

    def v(label, data, expect):
        return Case(f"mf-value-{label}", est(), data, InputError, expect, MF_SCAN_JOBS)

    ids = "ids must be integers within int32"
    return [
        p("rank-0", {"rank": 0}, ["rank=0", "must be >= 1"]),
        p("rank-negative", {"rank": -2}, ["rank=-2", "must be >= 1"]),
        p("maxIter-negative", {"maxIter": -1}, ["maxIter=-1", "must be >= 0"]),
        p("regParam-negative", {"regParam": -0.1}, ["regParam=-0.1", "finite", ">= 0"]),
        p("regParam-nan", {"regParam": NAN}, ["regParam=nan", "finite", ">= 0"]),
        p("regParam-inf", {"regParam": INF}, ["regParam=inf", "finite", ">= 0"]),
        p("alpha-negative", {"alpha": -1.0}, ["alpha=-1.0", ">= 0"]),
        p("implicitPrefs-sgd", {"implicitPrefs": True, "algorithm": "sgd"},
          ["implicitPrefs=True with algorithm='sgd'", "explicit ratings only", "algorithm='cd'"]),
        p("innerIterations", {"innerIterations": -1}, ["innerIterations=-1", "must be >= 0 (0 = automatic)"]),
        p("numWorkers-negative", {"numWorkers": -1}, ["numWorkers=-1", "must be >= 0"]),
        p("numWorkers-too-many", {"numWorkers": 5}, ["numWorkers=5", "task slots", "lower numWorkers to 2"]),
        p("checkpointInterval-0", {"checkpointInterval": 0}, ["checkpointInterval=0", ">= 1, or -1"]),
        p("checkpointInterval-negative", {"checkpointInterval": -2}, ["checkpointInterval=-2", ">= 1, or -1"]),
        p("featureBlockSize-negative", {"featureBlockSize": -1}, ["featureBlockSize=-1", "must be >= 0"]),
        p("featureBlockSize-nonnegative", {"featureBlockSize": 2, "nonnegative": True},
          ["featureBlockSize=2 with nonnegative=True", "set featureBlockSize=1"]),
        p("coldStartStrategy", {"coldStartStrategy": "keep"}, ["coldStartStrategy='keep'", "'nan', 'drop'"]),
        p("algorithm", {"algorithm": "als"}, ["algorithm='als'", "'cd'", "'sgd'"]),
        p("stepSize-0", {"algorithm": "sgd", "stepSize": 0.0}, ["stepSize=0.0", "finite number > 0"]),
        p("stepSize-negative", {"algorithm": "sgd", "stepSize": -0.1}, ["stepSize=-0.1", "finite number > 0"]),
        p("stepSize-nan", {"algorithm": "sgd", "stepSize": NAN}, ["stepSize=nan", "finite number > 0"]),
        p("stepSize-inf", {"algorithm": "sgd", "stepSize": INF}, ["stepSize=inf", "finite number > 0"]),
        s("userCol-missing", {"userCol": "nope"}, ratings(), ["userCol 'nope' is not a column", "set userCol"]),
        s("itemCol-missing", {"itemCol": "nope"}, ratings(), ["itemCol 'nope' is not a column", "set itemCol"]),
        s("ratingCol-missing", {"ratingCol": "nope"}, ratings(),
          ["ratingCol 'nope' is not a column", "set ratingCol"]),
        s("userCol-string", {}, ratings(ddl="user string, item long, rating double",
                                        rows=[("a", 0, 1.0)]), ["userCol 'user' has type string", "int32"]),
        s("itemCol-string", {}, ratings(ddl="user long, item string, rating double",
                                        rows=[(0, "a", 1.0)]), ["itemCol 'item' has type string", "int32"]),
        s("ratingCol-string", {}, ratings(ddl="user long, item long, rating string",
                                          rows=[(0, 0, "5")]), ["ratingCol 'rating' has type string", "cast"]),
        v("rating-nan", ratings((1, 0, NAN)), ["ratingCol 'rating' has value nan", "rating=nan", "finite"]),
        v("rating-inf", ratings((1, 0, INF)), ["ratingCol 'rating' has value inf", "finite"]),
        v("rating-minus-inf", ratings((1, 0, -INF)), ["ratingCol 'rating' has value -inf", "finite"]),
        v("rating-null", ratings((1, 0, None)), ["ratingCol 'rating' is null", "filter"]),
        v("user-null", ratings((None, 0, 1.0)), ["userCol 'user' is null", "filter"]),
        v("item-null", ratings((1, None, 1.0)), ["itemCol 'item' is null", "filter"]),
        v("user-fractional", ratings((1.5, 0.0, 1.0), ddl=FLOAT_IDS, rows=MF_GOOD_FLOAT_IDS),
          ["userCol 'user' has value 1.5", ids]),
        v("item-fractional", ratings((1.0, 0.25, 1.0), ddl=FLOAT_IDS, rows=MF_GOOD_FLOAT_IDS),
          ["itemCol 'item' has value 0.25", ids]),
        v("user-nan", ratings((NAN, 0.0, 1.0), ddl=FLOAT_IDS, rows=MF_GOOD_FLOAT_IDS),
          ["userCol 'user' has value nan", ids]),
        v("item-inf", ratings((0.0, INF, 1.0), ddl=FLOAT_IDS, rows=MF_GOOD_FLOAT_IDS),
          ["itemCol 'item' has value inf", ids]),
        v("user-beyond-int32", ratings((INT32_MAX + 1, 0, 1.0)), ["userCol 'user' has value 2147483648", ids]),
        v("item-beyond-int32", ratings((0, 2 ** 40, 1.0)), ["itemCol 'item' has value 1099511627776", ids]),
        v("user-below-int32", ratings((INT32_MIN - 1, 0, 1.0)), ["userCol 'user' has value -2147483649", ids]),
        v("empty-limit-0", empty(ratings()), ["the input has no ratings", "at least one (user, item, rating) row"]),
        v("empty-no-rows", no_rows("user long, item long, rating double"),
          ["the input has no ratings", "at least one (user, item, rating) row"]),
    ]


CASES = (linear_cases("lasso", StradsLasso) + linear_cases("logreg", StradsLogisticRegression) + lda_cases()
         + mf_cases())


# ----------------------------------------------------------------------------- harness
@pytest.fixture
def no_training(monkeypatch):
    """Fails the test if a fit gets as far as the engine (shards, training steps)."""
    reached = []

    def refuse_fit(self, *args, **kwargs):
        reached.append(type(self.program).__name__)
        raise AssertionError(f"training started ({type(self.program).__name__}): validation let the input through")

    def refuse_shards(*args, **kwargs):
        reached.append("get_shards")
        raise AssertionError("shards were started: validation let the input through")

    monkeypatch.setattr(Engine, "fit", refuse_fit)
    monkeypatch.setattr(launcher, "get_shards", refuse_shards)
    yield reached
    assert reached == []


def refusal(spark, estimator, data, exc, group: str):
    """Runs ``fit`` and returns (the exception, seconds, Spark job ids run for it)."""
    sc = spark.sparkContext
    df = data(spark)
    sc.setJobGroup(group, "input validation must refuse before training")
    t0 = time.monotonic()
    try:
        with pytest.raises(exc) as info:
            estimator().fit(df)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    elapsed = time.monotonic() - t0
    return info.value, elapsed, list(sc.statusTracker().getJobIdsForGroup(group))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_input_is_refused_before_training(spark, no_training, case):
    error, elapsed, jobs = refusal(spark, case.estimator, case.data, case.exc, f"validation-{case.id}")
    message = str(error)
    missing = [s for s in case.expect if s not in message]
    assert not missing, f"message {message!r} lacks {missing}"
    assert elapsed < REFUSE_WITHIN_S, f"refused only after {elapsed:.1f} s"
    assert len(jobs) <= case.max_jobs, f"{len(jobs)} Spark jobs ran before the refusal (allowed {case.max_jobs})"


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("make, param, value", [
    (lambda: StradsLasso(maxIter=1.5), "maxIter", "1.5"),
    (lambda: StradsLogisticRegression(fitIntercept="yes"), "fitIntercept", "str"),
    (lambda: StradsLDA(k=2.5), "k", "2.5"),
    (lambda: StradsLDA(docConcentration="x"), "docConcentration", "x"),
    (lambda: StradsMF(rank="ten"), "rank", "ten"),
    (lambda: StradsMF().setMaxIter(0.5), "maxIter", "0.5"),
], ids=["lasso-maxIter-fractional", "logreg-fitIntercept-string", "lda-k-fractional",
        "lda-docConcentration-string", "mf-rank-string", "mf-maxIter-fractional"])
def test_wrongly_typed_params_are_refused_at_set_time(make, param, value):
    with pytest.raises(TypeError) as info:  # by the setter itself: no fit, so no Spark job
        make()
    assert f'param "{param}"' in str(info.value) and value in str(info.value), str(info.value)


# ----------------------------------------------------------------------------- accepted on purpose
def test_mf_negative_and_extreme_int32_ids_are_accepted_as_by_als(spark):
    """ALS accepts any int32 id, negative ones included; StradsMF is a drop-in, so it must too."""
    rows = [(-1, -5, 4.0), (-1, 3, 2.0), (-2, -5, 3.0), (0, 3, 5.0), (INT32_MIN, INT32_MAX, 1.0), (-2, INT32_MAX, 2.0)]
    df = spark.createDataFrame(rows, "user long, item long, rating double")
    model = StradsMF(rank=2, maxIter=1, seed=1).fit(df)
    assert sorted(r.id for r in model.userFactors.collect()) == [INT32_MIN, -2, -1, 0]
    assert sorted(r.id for r in model.itemFactors.collect()) == [-5, 3, INT32_MAX]
    pred = model.transform(df).toPandas()
    assert len(pred) == len(rows) and np.isfinite(pred["prediction"]).all()


def test_lda_empty_and_null_documents_are_skipped_and_counted(spark):
    vecs = LDA_GOOD + [Vectors.sparse(4, [], []), Vectors.dense([0.0] * 4), None]
    df = spark.createDataFrame([(v, "t", 1.0) for v in vecs], LDA_SCHEMA)
    model = StradsLDA(k=2, maxIter=1, seed=1).fit(df)
    s = model.summary
    assert s.numDocuments == 3
    assert s.numEmptyDocuments == 2
    assert s.numNullDocuments == 1
    assert s.numTokens == 9
    assert int(model.topicsMatrix().toArray().sum()) == 9  # no token of a skipped document was sampled
