# Databricks notebook source
# MAGIC %md
# MAGIC # pystrads tour: topics, recommendations and sparse coefficients
# MAGIC
# MAGIC Trains the three pystrads programs through their `pyspark.ml` estimators on data that ships
# MAGIC with the package: **StradsLDA** on the bundled Debian package descriptions, **StradsMF** on
# MAGIC synthetic ratings with a known low-rank structure, and **StradsLogisticRegression** /
# MAGIC **StradsLasso** (L1) on the Debian words and on the STRADS paper's synthetic Lasso problem.
# MAGIC
# MAGIC It uses the notebook's existing `spark` session (Databricks, classic or Spark Connect -- serverless
# MAGIC included --, or a Jupyter kernel started with pyspark) and creates a local one only when there is none. The executors need pystrads installed
# MAGIC (a cluster library) -- see docs/deployment.md (*Installing* and *Databricks*).
# MAGIC This file is the source of `pystrads_tour.ipynb` (`python jobs/notebooks/build.py` regenerates it).

# COMMAND ----------

try:
    spark  # noqa: F821 -- provided by Databricks / a pyspark kernel
except NameError:
    from pystrads.session import spark_session

    spark = spark_session("local[2]", "pystrads-tour", {"spark.ui.enabled": "false"})
import matplotlib.pyplot as plt
import numpy as np

import pystrads

try:
    where = spark.conf.get("spark.master")  # classic and Spark Connect sessions alike
except Exception:  # noqa: BLE001 -- a Connect service that does not expose it
    where = "a Spark Connect service"
print(f"pystrads {pystrads.__version__} on Spark {spark.version}, master {where}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. Topics: StradsLDA on 2,500 Debian package descriptions
# MAGIC The text pipeline is MLlib's; `StradsLDA` takes the `features` column exactly as
# MAGIC `CountVectorizer` makes it and is a drop-in for `pyspark.ml.clustering.LDA`.

# COMMAND ----------

from pyspark.ml import Pipeline
from pyspark.ml.feature import CountVectorizer, RegexTokenizer, StopWordsRemover

from pystrads.datasets import load_debian_sample
from pystrads.ml import StradsLDA

docs = load_debian_sample(spark).cache()
text_stages = [RegexTokenizer(inputCol="text", outputCol="tokens", pattern="[^a-zA-Z]+", minTokenLength=3),
               StopWordsRemover(inputCol="tokens", outputCol="words"),
               CountVectorizer(inputCol="words", outputCol="features", minDF=3)]
lda_pipeline = Pipeline(stages=text_stages + [StradsLDA(k=8, maxIter=60, seed=1)]).fit(docs)
vocab = lda_pipeline.stages[2].vocabulary
lda_model = lda_pipeline.stages[-1]
print(f"{docs.count()} documents, {len(vocab)} words, {lda_model.summary.numTokens} tokens, "
      f"{lda_model.summary.tokensPerSecond:,.0f} tokens/s")
for row in lda_model.describeTopics(8).collect():
    print(f"topic {row.topic}: " + " ".join(vocab[i] for i in row.termIndices))

# COMMAND ----------

ax = lda_model.summary.plot()
ax.figure.tight_layout()
plt.show()
print("held-out style check, log-perplexity on the training documents:",
      round(lda_model.logPerplexity(lda_pipeline.transform(docs)), 3))

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. Recommendations: StradsMF, a drop-in for ALS
# MAGIC Ratings from a known rank-4 model (`pystrads.datasets.synthetic.low_rank_ratings`), split 90/10.

# COMMAND ----------

from pyspark.ml.evaluation import RegressionEvaluator
from pyspark.sql import functions as F

from pystrads.datasets.synthetic import low_rank_ratings
from pystrads.ml import StradsMF

ratings = spark.createDataFrame(low_rank_ratings(num_users=300, num_items=200, rank=4, seed=7))
train, test = ratings.randomSplit([0.9, 0.1], seed=42)
mf_model = StradsMF(rank=4, maxIter=10, regParam=0.05, userCol="userId", itemCol="movieId",
                    ratingCol="rating", coldStartStrategy="drop", seed=1).fit(train)
rmse = RegressionEvaluator(metricName="rmse", labelCol="rating").evaluate(mf_model.transform(test))
baseline = test.select(F.stddev_pop("rating")).first()[0]
print(f"{ratings.count()} ratings; test RMSE {rmse:.3f} (predicting the mean: {baseline:.3f})")
mf_model.recommendForAllUsers(3).orderBy("userId").show(5, truncate=False)
print(mf_model.summary.to_pandas()[["iteration", "train_rmse"]].tail(3).to_string(index=False))

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. Sparse coefficients: L1 logistic regression on the Debian words
# MAGIC Which words say "this package is a library" (its name starts with `lib`)? The L1 penalty keeps
# MAGIC a few words and sets the rest of the vocabulary to exactly zero.

# COMMAND ----------

from pyspark.ml.evaluation import BinaryClassificationEvaluator

from pystrads.ml import StradsLogisticRegression

labelled = lda_pipeline.transform(docs).withColumn("label", F.col("package").startswith("lib").cast("double"))
clf = StradsLogisticRegression(regParam=0.01, elasticNetParam=1.0, maxIter=50, tol=1e-4, seed=1).fit(labelled)
coef = clf.coefficients.toArray()
order = np.argsort(coef)
print(f"{int(np.count_nonzero(coef))} of {len(coef)} words have a non-zero coefficient; "
      f"training AUC {BinaryClassificationEvaluator().evaluate(clf.transform(labelled)):.3f}")
print("library words:    ", ", ".join(f"{vocab[i]} ({coef[i]:+.2f})" for i in order[::-1][:8] if coef[i] > 0))
print("non-library words:", ", ".join(f"{vocab[i]} ({coef[i]:+.2f})" for i in order[:8] if coef[i] < 0))

# COMMAND ----------

# MAGIC %md
# MAGIC ## 4. Lasso with a known answer: the STRADS paper's synthetic problem
# MAGIC 2,000 samples, 5,000 features, 40 true non-zeros; STRADS's dynamic schedule with the
# MAGIC dependency check, then the driver's working-set solver once the support is small.

# COMMAND ----------

from pystrads.datasets.synthetic import lambda_max, strads_lasso_problem
from pystrads.ml import StradsLasso

problem = strads_lasso_problem(2000, 5000, nnz_per_col=30, support=40, seed=3)
lasso_df = problem.to_dataframe(spark)
reg = 0.05 * lambda_max(problem, fit_intercept=True)
lasso = StradsLasso(regParam=reg, standardization=False, seed=1).fit(lasso_df)
beta = lasso.coefficients.toArray()
true = np.flatnonzero(problem.beta_true)
found = np.flatnonzero(beta)
print(f"stop: {lasso.summary.stopReason} after {lasso.summary.totalIterations} iterations; "
      f"{len(found)} non-zeros, {len(np.intersect1d(true, found))} of the {len(true)} true ones among them")
ax = lasso.summary.plot()
ax.set_title("StradsLasso: objective - final vs coordinate updates")
ax.figure.tight_layout()
plt.show()
