"""StradsLogisticRegression's multinomial family against pyspark.ml's LogisticRegression and scikit-learn."""

import os
import tempfile

import numpy as np
import pytest
from pyspark.ml.classification import LogisticRegression, LogisticRegressionModel
from pyspark.ml.feature import StringIndexer
from pyspark.ml.linalg import Vectors

from pystrads.errors import InputError
from pystrads.ml import StradsLogisticRegression, StradsLogisticRegressionModel
from pystrads.ml.classification import LogisticEvaluation

CLASSES = 10


def class_problem(n, features, classes, seed, density=0.3):
    """A sparse problem whose labels are the argmax of noisy linear class scores: ``(x, y, w)``; one
    feature is constant (zero variance) and one is never set."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features)) * (rng.random((n, features)) < density)
    x[:, 1:3] = 0.0
    scores = x @ rng.standard_normal((features, classes)) + 1.5 * rng.standard_normal((n, classes))
    x[:, 1] = 2.0  # constant: MLlib keeps its coefficients at 0
    y = scores.argmax(axis=1).astype(float)
    w = rng.uniform(0.5, 2.0, n)
    return x, y, w


def frame(spark, x, y, w):
    rows = [(float(y[i]), float(w[i]), Vectors.sparse(x.shape[1], np.flatnonzero(x[i]).tolist(),
                                                     x[i][x[i] != 0].tolist())) for i in range(len(y))]
    return spark.createDataFrame(rows, ["label", "w", "features"]).repartition(2).cache()


@pytest.fixture(scope="module")
def problem(spark):
    x, y, w = class_problem(500, 24, CLASSES, seed=7)
    return x, y, w, frame(spark, x, y, w)


def weighted_std(v, w):
    W = w.sum()
    mu = w @ v / W
    return np.sqrt(w @ (v - mu) ** 2 / (W - w @ w / W))


def objective(x, y, w, matrix, intercepts, lam, alpha, standardization):
    """MLlib's multinomial objective: the weighted mean softmax loss and the elastic net on the
    (standardised) coefficients; intercepts unpenalised."""
    m = x @ matrix.T + intercepts
    loss = w @ (np.logaddexp.reduce(m, axis=1) - m[np.arange(len(y)), y.astype(int)]) / w.sum()
    s = weighted_std(x, w) if standardization else np.ones(x.shape[1])
    s = np.where(np.isfinite(s), s, 0.0)
    return loss + lam * (alpha * (np.abs(matrix) * s).sum() + (1 - alpha) / 2 * ((matrix * s) ** 2).sum())


@pytest.mark.parametrize("fit_intercept,standardization", [  # one in the quick run, the rest with the slow ones
    pytest.param(True, True, marks=pytest.mark.slow), (True, False), pytest.param(False, True, marks=pytest.mark.slow),
    pytest.param(False, False, marks=pytest.mark.slow)])
def test_objective_equals_mllib_converged_optimum(problem, fit_intercept, standardization):
    """Ridge, elastic net and lasso over 10 classes, with weights: the objective at MLlib's optimum
    (L-BFGS / OWL-QN run to tol 1e-12) within 1e-6, and MLlib's conventions for the result."""
    x, y, w, df = problem
    lam = 0.01
    for alpha in (0.0, 0.5, 1.0):
        model = StradsLogisticRegression(regParam=lam, elasticNetParam=alpha, fitIntercept=fit_intercept,
                                         standardization=standardization, weightCol="w", tol=1e-10,
                                         maxIter=300).fit(df)
        ref = LogisticRegression(regParam=lam, elasticNetParam=alpha, fitIntercept=fit_intercept,
                                 standardization=standardization, weightCol="w", tol=1e-12, maxIter=1000).fit(df)
        assert model.isMultinomial and model.numClasses == CLASSES and ref.numClasses == CLASSES
        ours_m, ours_b = model.coefficientMatrix.toArray(), model.interceptVector.toArray()
        ref_m, ref_b = ref.coefficientMatrix.toArray(), ref.interceptVector.toArray()
        ours = objective(x, y, w, ours_m, ours_b, lam, alpha, standardization)
        theirs = objective(x, y, w, ref_m, ref_b, lam, alpha, standardization)
        assert ours <= theirs * (1 + 1e-8), (alpha, ours, theirs)
        assert abs(ours - theirs) <= 1e-6 * theirs, (alpha, ours, theirs)
        assert abs(model.summary.objectiveHistory[-1] - ours) <= 1e-9 * ours  # the summary's objective is it
        assert np.all(ours_m[:, 1] == 0) and np.all(ours_m[:, 2] == 0)  # zero variance, as MLlib
        if fit_intercept:
            assert abs(ours_b.sum()) < 1e-12 and np.abs(ours_b).max() > 0  # centred, as MLlib's
        else:
            assert np.all(ours_b == 0)
        np.testing.assert_allclose(ours_m, ref_m, atol=2e-3 * np.abs(ours_m).max())
        if alpha == 1.0:  # the same support, up to MLlib's own convergence
            assert abs(np.count_nonzero(ours_m) - np.count_nonzero(ref_m)) <= 2


def test_matches_scikit_learn_without_standardization(problem):
    """scikit-learn's multinomial elastic net (saga) minimises the same objective when the features are
    not standardised: C = 1 / (regParam * sum w)."""
    import sklearn.linear_model as sklearn

    x, y, w, df = problem
    lam, alpha = 0.01, 0.5
    model = StradsLogisticRegression(regParam=lam, elasticNetParam=alpha, standardization=False, weightCol="w",
                                     tol=1e-10, maxIter=300).fit(df)
    sk = sklearn.LogisticRegression(C=1.0 / (lam * w.sum()), l1_ratio=alpha, penalty="elasticnet", solver="saga",
                                    tol=1e-12, max_iter=100_000).fit(x, y, sample_weight=w)
    ours = objective(x, y, w, model.coefficientMatrix.toArray(), model.interceptVector.toArray(), lam, alpha, False)
    theirs = objective(x, y, w, sk.coef_, sk.intercept_, lam, alpha, False)
    assert abs(ours - theirs) <= 1e-6 * theirs, (ours, theirs)


def test_outputs_summary_persistence_and_arrow_scoring(problem, spark):
    """transform (MLlib's JVM model), the Arrow scoring used under Spark Connect, predict*, evaluate,
    save / load and the binomial-only accessors."""
    x, y, w, df = problem
    model = StradsLogisticRegression(regParam=0.02, elasticNetParam=1.0, seed=3).fit(df)
    out = model.transform(df).select("label", "rawPrediction", "probability", "prediction").collect()
    matrix, b = model.coefficientMatrix.toArray(), model.interceptVector.toArray()
    vectors = [r.features for r in df.select("features").collect()]
    rows = np.array([v.toArray() for v in vectors])
    margins = rows @ matrix.T + b
    p = np.exp(margins - margins.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(np.array([r.rawPrediction.toArray() for r in out]), margins, atol=1e-9)
    np.testing.assert_allclose(np.array([r.probability.toArray() for r in out]), p, atol=1e-9)
    assert [r.prediction for r in out] == p.argmax(axis=1).astype(float).tolist()
    arrow = model._transform_classes(df).select("rawPrediction", "probability", "prediction").collect()
    np.testing.assert_allclose(np.array([r.probability.toArray() for r in arrow]), p, atol=1e-12)
    assert [r.prediction for r in arrow] == [r.prediction for r in out]
    v = vectors[0]
    np.testing.assert_allclose(model.predictRaw(v).toArray(), margins[0], atol=1e-12)
    np.testing.assert_allclose(model.predictProbability(v).toArray(), p[0], atol=1e-12)
    assert model.predict(v) == float(p[0].argmax())
    # thresholds: MLlib's rule (largest p_k / t_k), in the JVM and in Arrow alike
    t = [1.0] * CLASSES
    t[3] = 0.05
    model.setThresholds(t)
    jvm_pred = [r.prediction for r in model.transform(df).select("prediction").collect()]
    arrow_pred = [r.prediction for r in model._transform_classes(df).select("prediction").collect()]
    assert jvm_pred == arrow_pred == (p / np.array(t)).argmax(axis=1).astype(float).tolist()
    assert jvm_pred.count(3.0) > [r.prediction for r in out].count(3.0)  # the low threshold moved rows to 3
    model.setThresholds([1.0, 1.0])
    with pytest.raises(Exception, match="thresholds=.*2 values for a model of 10 classes"):
        model.transform(df)
    model.clear(model.thresholds)
    with pytest.raises(ValueError, match="use coefficientMatrix instead"):
        model.coefficients
    with pytest.raises(ValueError, match="use interceptVector instead"):
        model.intercept
    summary = model.evaluate(df)  # MLlib's multiclass LogisticRegressionSummary
    labels = np.array([r.label for r in out])
    assert summary.accuracy == pytest.approx(np.mean(p.argmax(axis=1) == labels))
    assert model.summary.accuracy == pytest.approx(summary.accuracy)
    connect = LogisticEvaluation(model.transform(df), "label", "prediction", "rawPrediction", "probability",
                                 num_classes=CLASSES)
    assert connect.labels == summary.labels and connect.accuracy == pytest.approx(summary.accuracy)
    assert connect.precisionByLabel == pytest.approx(summary.precisionByLabel)
    with tempfile.TemporaryDirectory() as d:
        model.save(os.path.join(d, "m"))
        back = StradsLogisticRegressionModel.load(os.path.join(d, "m"))
        assert back.isMultinomial and back.numClasses == CLASSES and back.numFeatures == x.shape[1]
        np.testing.assert_array_equal(back.coefficientMatrix.toArray(), matrix)
        np.testing.assert_array_equal(back.interceptVector.toArray(), b)
        assert [r.prediction for r in back.transform(df).select("prediction").collect()] == \
            [r.prediction for r in out]
    assert isinstance(model._mllib_model(df), LogisticRegressionModel)


def test_family_rules_and_label_metadata(spark):
    """family='auto' is binomial for two classes and multinomial beyond, 'multinomial' fits K rows even
    for two classes (MLlib's model shape), the label column's metadata sets K, and bad labels or a
    binomial family on many classes are refused before training, naming the column and the fix."""
    x, y, w = class_problem(200, 6, 3, seed=2)
    df = frame(spark, x, y, w)
    two = df.filter("label < 2")
    binary = StradsLogisticRegression(regParam=0.01).fit(two)
    assert not binary.isMultinomial and binary.numClasses == 2 and binary.coefficientMatrix.numRows == 1
    pair = StradsLogisticRegression(regParam=0.01, family="multinomial").fit(two)
    ref = LogisticRegression(regParam=0.01, family="multinomial", tol=1e-12, maxIter=1000).fit(two)
    assert pair.isMultinomial and pair.coefficientMatrix.numRows == 2 == ref.coefficientMatrix.numRows
    np.testing.assert_allclose(pair.coefficientMatrix.toArray(), ref.coefficientMatrix.toArray(), atol=1e-3)
    # StringIndexer's metadata declares 4 classes although the data holds labels 0 .. 2 only
    names = spark.createDataFrame([(n,) for n in ("a", "b", "c", "d")], ["name"])
    indexer = StringIndexer(inputCol="name", outputCol="label").fit(names)
    rows = [(["a", "b", "c"][int(v)], f) for v, f in zip(y, df.select("features").toPandas()["features"])]
    indexed = indexer.transform(spark.createDataFrame(rows, ["name", "features"]))
    assert StradsLogisticRegression(regParam=0.01, maxIter=5).fit(indexed).numClasses == 4
    with pytest.raises(InputError, match="family='binomial' fits two classes, but labelCol 'label' has 3"):
        StradsLogisticRegression(family="binomial").fit(df)
    with pytest.raises(InputError, match=r"labelCol 'label' has value \d.5; logistic regression needs class indices"):
        StradsLogisticRegression().fit(df.selectExpr("label + 0.5 as label", "features"))
    with pytest.raises(InputError, match="thresholds=.*has 2 values, but labelCol 'label' has 3 classes"):
        StradsLogisticRegression(thresholds=[0.5, 0.5]).fit(df)


def test_kernels_curvature_bound_line_sums_and_class_shift():
    """The softmax kernels: the per-row curvature dominates the Hessian block (a feature's K classes
    may move together), the line search's sums are the loss's exact first and second derivatives
    along a direction, and the class shift is the penalty's exact minimiser (its kinks exactly)."""
    from pystrads.kernels import cd as K

    rng = np.random.default_rng(0)
    n, k_all = 400, 6
    m = rng.standard_normal((n, k_all)) * rng.uniform(0, 5, (n, 1))
    y = rng.integers(0, k_all, n).astype(float)
    w = rng.uniform(0.5, 2.0, n)
    u, h = np.empty_like(m), np.empty_like(m)
    loss = K.softmax_terms(m, y, w, u, h)

    def f(margins):
        return float(w @ (np.logaddexp.reduce(margins, axis=1) - margins[np.arange(n), y.astype(int)]))

    assert loss == pytest.approx(f(m), rel=1e-12)
    p = np.exp(m - m.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    for i in range(n):  # diag(h / w) - (diag(p) - p p') is positive semi-definite
        assert np.linalg.eigvalsh(np.diag(h[i] / w[i]) - np.diag(p[i]) + np.outer(p[i], p[i])).min() > -1e-12
    dm = rng.standard_normal((n, k_all))
    slope, curvature = K.softmax_line_sums(u, y, w, dm)
    e = 1e-4
    assert slope == pytest.approx((f(m + e * dm) - f(m - e * dm)) / (2 * e), rel=1e-6)
    assert curvature == pytest.approx((f(m + e * dm) - 2 * f(m) + f(m - e * dm)) / e ** 2, rel=1e-4)

    beta = rng.standard_normal((50, 5))
    beta[:10, 2:] = 0.0
    pen, l2 = rng.uniform(0, 1, 50), rng.uniform(0, 1, 50)
    pen[:5], l2[5:10] = 0.0, 0.0  # ridge only (the mean), lasso only (a median)
    pen[10] = -1.0  # frozen: no shift
    shift = np.empty(50)
    K.class_shift(beta, pen, l2, shift)
    grid = np.linspace(-4, 4, 80001)
    for j in range(50):
        moved = beta[j][:, None] + grid
        value = pen[j] * np.abs(moved).sum(0) + 0.5 * l2[j] * (moved ** 2).sum(0)
        at = pen[j] * np.abs(beta[j] + shift[j]).sum() + 0.5 * l2[j] * ((beta[j] + shift[j]) ** 2).sum()
        if pen[j] < 0:
            assert shift[j] == 0.0
            continue
        assert at <= value.min() + 1e-9, j
    np.testing.assert_allclose(shift[:5], -beta[:5].mean(axis=1), atol=1e-12)
    lasso_only = beta[5:10] + shift[5:10, None]
    assert all(np.any(row == 0.0) for row in lasso_only)  # a median: one coefficient exactly 0


def test_wide_rounds_by_default_with_the_intercepts_in_each():
    """The multinomial schedule: wide rounds unless the params are set, the intercepts in every
    round, and the narrow trailing rounds that only repeat updated features dropped."""
    from types import SimpleNamespace

    from pystrads.programs.multinomial import MultinomialProgram

    fit = SimpleNamespace(stats={"multinomial": True, "num_classes": 3})
    _, extra = StradsLogisticRegression()._program_kind(fit)
    assert (extra["coords_per_round"], extra["candidates_per_round"], extra["rho"]) == (4096, 8192, 0.9)
    _, extra = StradsLogisticRegression(coordinatesPerRound=64, correlationThreshold=0.5)._program_kind(fit)
    assert "coords_per_round" not in extra and "rho" not in extra and extra["candidates_per_round"] == 8192
    _, extra = StradsLogisticRegression()._program_kind(SimpleNamespace(stats={"multinomial": False}))
    assert extra == {}

    program = MultinomialProgram(40, 0.1, num_classes=3)
    J = 40
    rounds = [np.arange(0, 24), np.arange(0, 24), np.array([24, 3]), np.array([25]), np.array([25]),
              np.array([3, 5])]
    out = program._with_intercept_rounds(rounds)  # rounds under an eighth of 24 keep only new features
    assert [r.tolist() for r in out] == [list(range(24)) + [J]] * 2 + [[24, J], [25, J]]
    program = MultinomialProgram(40, 0.1, num_classes=3, fit_intercept=False, damping="eso")
    assert [len(r) for r in program._with_intercept_rounds(rounds)] == [24, 24, 2, 1, 1, 2]


@pytest.mark.parametrize("parts", [1, 3])
def test_kernels_by_row_equal_the_column_sums(parts):
    """The round's sums and margins' change, computed row by row from the columns by row, equal
    the matrix products (the intercept's column of ones included, the threads' parts exact)."""
    import scipy.sparse
    from pystrads.kernels import cd as K

    rng = np.random.default_rng(3)
    n, J, k_all = 300, 40, 4
    X = scipy.sparse.random(n, J, density=0.2, random_state=4, format="csc")
    X = scipy.sparse.hstack([X, np.ones((n, 1))]).tocsc()  # column J: the intercept's ones
    u, h = rng.standard_normal((n, k_all)), rng.uniform(0, 1, (n, k_all))
    cp, ri, vals = X.indptr[:J + 1].astype(np.int64), X.indices.astype(np.int64), X.data
    features = np.array(sorted(rng.choice(J, 25, replace=False)) + [J], dtype=np.int64)
    cuts = np.linspace(0, len(features), parts + 1).astype(np.int64)
    ptr, pos, val = K.columns_by_row(cp, ri, vals, features, cuts, n)
    assert np.all(np.diff(ptr, axis=1) >= 0) and np.array_equal(ptr[1:, 0], ptr[:-1, -1])
    out = [np.full((len(features), k_all), np.nan) for _ in range(3)]
    for p in range(parts):
        K.class_row_dots(ptr, pos, val, p, cuts[p], cuts[p + 1], len(features) - 1, u, h, *out)
    Xf = X[:, features].toarray()
    np.testing.assert_allclose(out[0], Xf.T @ u, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[1], (Xf ** 2).T @ h, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[2], Xf.T @ h, rtol=1e-12, atol=1e-12)
    delta, shift = rng.standard_normal((len(features), k_all)), rng.standard_normal(k_all)
    dm = np.full((n, k_all), np.nan)
    for lo, hi in ((0, 120), (120, n)):
        K.class_row_direction(ptr, pos, val, len(features) - 1, delta, shift, dm, lo, hi)
    np.testing.assert_allclose(dm, Xf @ delta - shift, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("damping", ["line", "eso", "none"])
def test_program_dampings_on_correlated_columns(spark, damping):
    """Rounds that update every feature at once on strongly correlated columns (each feature five
    times, with a little noise; the dependency check off): with the line search along the round's
    direction, and with the ESO overlap bound, the objective never rises; undamped steps overshoot."""
    from pystrads.engine import Engine
    from pystrads.programs.multinomial import MultinomialProgram

    base, y, w = class_problem(300, 6, 3, seed=4, density=0.8)
    rng = np.random.default_rng(5)
    x = np.hstack([base * (1 + 0.05 * rng.standard_normal(base.shape)) for _ in range(5)])
    rows = [(float(y[i]), float(w[i]), np.flatnonzero(x[i]).astype(np.int64), x[i][x[i] != 0])
            for i in range(len(y))]
    rdd = spark.sparkContext.parallelize(rows, 2)
    J = x.shape[1]
    prog = MultinomialProgram(J, 0.001, num_classes=3, elastic_net=0.5, damping=damping, tol=1e-12, max_iter=12,
                              coords_per_round=J, candidates_per_round=2 * J, rho=0.0)
    with Engine(prog, rdd, num_workers=2, seed=1).fit() as res:
        history = [r["objective"] for r in res.summary.iterations]
    rises = [b > a * (1 + 1e-12) for a, b in zip(history[1:], history[2:])]
    if damping == "none":
        assert any(rises) or not np.isfinite(history[-1]), history
    else:
        assert not any(rises) and history[-1] < 0.9 * history[0], (damping, history)


def test_early_stopping_scores_the_held_out_rows(problem):
    """validationIndicatorCol: the held-out rows are never trained on, and the history's validation
    loss is their weighted mean softmax loss at the iteration's coefficients (the last one recomputed
    here from the model)."""
    from pyspark.sql import functions as F

    x, y, w, df = problem
    flagged = df.withColumn("held", F.rand(seed=3) < 0.25)
    model = StradsLogisticRegression(regParam=0.01, elasticNetParam=0.5, weightCol="w", tol=1e-10, maxIter=30,
                                     validationIndicatorCol="held", earlyStoppingRounds=0).fit(flagged)
    held = flagged.filter("held").select("label", "w", "features").collect()
    xh = np.array([r.features.toArray() for r in held])
    yh, wh = np.array([r.label for r in held]), np.array([r.w for r in held])
    m = xh @ model.coefficientMatrix.toArray().T + model.interceptVector.toArray()
    loss = wh @ (np.logaddexp.reduce(m, axis=1) - m[np.arange(len(yh)), yh.astype(int)]) / wh.sum()
    history = model.summary.validationHistory
    assert model.summary.numValidationInstances == len(held) and model.summary.numInstances == 500 - len(held)
    assert history[-1] == pytest.approx(loss, rel=1e-9)
    assert history[-1] < history[0] < np.log(CLASSES)
