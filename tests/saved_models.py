"""Tiny models of the four estimators, their inputs and their outputs, for the test that models
saved by an earlier pystrads still load (tests/test_ml_saved_models.py).

``python tests/saved_models.py DIR`` fits and saves them to ``DIR`` with the pystrads on the
path, plus ``outputs.json`` (each model's transform of its input).  The models in
``tests/data/saved_models/`` were made this way by the code before the estimator base (commit
61c35fb, ``PYTHONPATH=<that checkout> python tests/saved_models.py tests/data/saved_models``).
"""

import json
import os
import sys

#: name -> (model class name, estimator params, input maker name, output columns)
MODELS = {
    "lda": ("StradsLDA", dict(k=2, maxIter=3, seed=1, numWorkers=1), "documents", ["topicDistribution"]),
    "mf": ("StradsMF", dict(rank=2, maxIter=2, seed=1, numWorkers=1), "ratings", ["prediction"]),
    "lasso": ("StradsLasso", dict(regParam=0.01, maxIter=5, seed=1, numWorkers=1), "rows", ["prediction"]),
    "logreg": ("StradsLogisticRegression", dict(regParam=0.01, maxIter=5, seed=1, numWorkers=1), "rows",
               ["rawPrediction", "probability", "prediction"]),
}


def inputs(spark):
    from pyspark.ml.linalg import Vectors

    return {
        "documents": spark.createDataFrame(
            [(i, Vectors.sparse(4, sorted([i % 4, (i + 1) % 4]), [1.0 + i % 2, 2.0])) for i in range(8)],
            ["id", "features"]),
        "ratings": spark.createDataFrame([(u * 10 + i, u, i, float(1 + (u * i) % 5)) for u in range(4)
                                          for i in range(3)], ["id", "user", "item", "rating"]),
        "rows": spark.createDataFrame([(i, float(i % 2), Vectors.dense([float(i % 3), float(i % 2) - 0.5]))
                                       for i in range(12)], ["id", "label", "features"]),
    }


def outputs(model, df, columns):
    """``[[id, [output values...]], ...]`` sorted by id (vectors as lists)."""
    rows = model.transform(df).select("id", *columns).collect()
    return sorted([r[0], [list(map(float, v.toArray())) if hasattr(v, "toArray") else float(v) for v in r[1:]]]
                  for r in rows)


def main(out_dir):
    import pystrads.ml as ml
    from pystrads.session import spark_session

    spark = spark_session("local[2]", "saved-models", {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    data = inputs(spark)
    results = {}
    for name, (cls, params, source, columns) in MODELS.items():
        model = getattr(ml, cls)(**params).fit(data[source])
        model.save(os.path.join(out_dir, name))
        results[name] = outputs(model, data[source], columns)
    with open(os.path.join(out_dir, "outputs.json"), "w") as f:
        json.dump(results, f, indent=1)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
