"""Topic models with StradsLDA: raw text (or term-count vectors) in; model, metrics, plot and topics out.

    spark-submit jobs/lda.py                         # bundled sample, 20 topics, Spark local mode
    spark-submit jobs/lda.py --input docs.txt -k 50 --max-iter 200 --output out/lda
    spark-submit jobs/lda.py --input corpus.parquet --text-col body
    spark-submit jobs/lda.py --input counts.parquet --features-col features   # pre-vectorised

Text goes through RegexTokenizer -> StopWordsRemover -> CountVectorizer ->
StradsLDA; the fitted PipelineModel is saved to ``<output>/model``, the
training history and top words to ``<output>/metrics.json``, the convergence
plot to ``<output>/convergence.png`` (with matplotlib) and the top words per
topic to ``<output>/topics.txt``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pystrads.session import spark_session  # noqa: E402

log = logging.getLogger("pystrads.jobs.lda")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Fit an LDA topic model with StradsLDA.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--input", default=None,
                   help="text file (one document per line), .jsonl/.csv/.parquet with a text column, or parquet "
                        "with a term-count vector column (--features-col); default: the bundled Debian sample")
    p.add_argument("--format", choices=["text", "jsonl", "csv", "parquet"], default=None,
                   help="input format (default: from the file name)")
    p.add_argument("--text-col", default="text", help="column holding the document text")
    p.add_argument("--features-col", default=None, help="use this term-count vector column (no text pipeline)")
    p.add_argument("-k", "--topics", type=int, default=20, help="number of topics")
    p.add_argument("--max-iter", type=int, default=100, help="Gibbs iterations")
    p.add_argument("--alpha", type=float, default=None,
                   help="doc concentration (default 50/k); learned from there unless --fixed-alpha")
    p.add_argument("--fixed-alpha", action="store_true",
                   help="keep the doc concentration fixed (default: learned every 10 iterations, as MLlib online)")
    p.add_argument("--beta", type=float, default=None, help="topic concentration (default 0.1)")
    p.add_argument("--vocab-size", type=int, default=50000, help="CountVectorizer vocabSize")
    p.add_argument("--min-df", type=float, default=2.0, help="CountVectorizer minDF")
    p.add_argument("--workers", type=int, default=0, help="parallel workers (0 = one per executor, with its cores)")
    p.add_argument("--sampler", default="auto", help="auto, dense, sparse, fplus or mh")
    p.add_argument("--log-likelihood-every", type=int, default=1,
                   help="training log-likelihood every this many iterations, for the convergence table and "
                        "plot (StradsLDA's default is 10: it costs the shards a pass over the model)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--top-words", type=int, default=10)
    p.add_argument("--output", default="out/lda", help="output directory (local path or any Hadoop FS URI)")
    p.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[2])")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import CountVectorizer, RegexTokenizer, StopWordsRemover

    from pystrads.datasets import load_debian_sample, read_text_corpus
    from pystrads.ml import StradsLDA

    from pyspark.sql import SparkSession

    owned = SparkSession.getActiveSession() is None  # else a notebook's or a caller's: left running
    spark = spark_session(args.master, "pystrads-lda")
    spark.sparkContext.setLogLevel("WARN")
    t0 = time.perf_counter()
    lda = StradsLDA(k=args.topics, maxIter=args.max_iter, seed=args.seed, numWorkers=args.workers,
                    sampler=args.sampler, optimizeDocConcentration=not args.fixed_alpha,
                    logLikelihoodEvery=args.log_likelihood_every)
    if args.alpha is not None:
        lda.setDocConcentration([args.alpha])
    if args.beta is not None:
        lda.setTopicConcentration(args.beta)
    if args.features_col:
        df = spark.read.parquet(args.input)
        lda.setFeaturesCol(args.features_col)
        stages, vocabulary = [lda], None
    else:
        df = load_debian_sample(spark) if args.input is None else read_text_corpus(
            spark, args.input, args.format, args.text_col)
        cv = CountVectorizer(inputCol="words", outputCol="features", vocabSize=args.vocab_size, minDF=args.min_df)
        stages = [RegexTokenizer(inputCol="text", outputCol="tokens", pattern="[^\\w]+", minTokenLength=2),
                  StopWordsRemover(inputCol="tokens", outputCol="words"), cv, lda]
    source = args.input or "bundled Debian sample"
    log.info("fitting %d topics on %s", args.topics, source)
    model = Pipeline(stages=stages).fit(df)
    fit_s = time.perf_counter() - t0
    lda_model = model.stages[-1]
    if not args.features_col:
        vocabulary = model.stages[-2].vocabulary
    summary = lda_model.summary
    its = summary.iterations
    print(f"\n{len(its)} iterations, {summary.numTokens} tokens in {summary.numDocuments} documents "
          f"({summary.numEmptyDocuments} empty skipped), {summary.numWorkers} workers, sampler {summary.sampler}")
    step = max(1, len(its) // 10)
    print("iteration  log p(w,z)        log-perplexity  s-error")
    for _, row in its.iloc[list(range(0, len(its), step)) + [len(its) - 1]].drop_duplicates("iteration").iterrows():
        print(f"{int(row['iteration']):>9}  {row.get('log_likelihood', float('nan')):>15.1f}  "
              f"{row.get('log_perplexity', float('nan')):>14.4f}  {row.get('s_error', float('nan')):.2e}")
    print(f"throughput {summary.tokensPerSecond / 1e6:.2f} M tokens/s over the steps; fit {fit_s:.1f} s "
          f"(fixed costs: " + ", ".join(f"{k} {v:.2f} s" for k, v in summary.fixed.items()) + ")\n")
    alpha = lda_model.estimatedDocConcentration().toArray()
    print(f"docConcentration ({'fixed' if args.fixed_alpha else 'learned'}): sum {alpha.sum():.3f}, "
          f"{alpha.min():.4f} .. {alpha.max():.4f}\n")
    topics = []
    for row in lda_model.describeTopics(args.top_words).collect():
        words = [vocabulary[i] if vocabulary else str(i) for i in row.termIndices]
        topics.append({"topic": row.topic, "words": words, "weights": [round(w, 5) for w in row.termWeights]})
        print(f"topic {row.topic:>3}: {' '.join(words)}")
    out = args.output
    model.write().overwrite().save(os.path.join(out, "model"))
    local = "://" not in out
    if local:
        os.makedirs(out, exist_ok=True)
    metrics = {"input": source, "k": args.topics, "iterations": its.to_dict(orient="records"),
               "steps": summary.steps.to_dict(orient="records"), "fixed_s": summary.fixed,
               "tokens": summary.numTokens, "documents": summary.numDocuments,
               "empty_documents": summary.numEmptyDocuments, "tokens_per_s": summary.tokensPerSecond,
               "fit_s": fit_s, "doc_concentration": alpha.tolist(), "topics": topics}
    if local:
        with open(os.path.join(out, "metrics.json"), "w") as fh:
            json.dump(metrics, fh, indent=2, default=float)
        with open(os.path.join(out, "topics.txt"), "w") as fh:
            for t in topics:
                fh.write(f"{t['topic']}\t{' '.join(t['words'])}\n")
        try:
            from matplotlib.figure import Figure  # no pyplot: no backend switch, no figure left open in a caller

            fig = Figure(figsize=(6, 4))
            ax = fig.subplots()
            summary.plot(ax)
            ax.set_title(f"StradsLDA, k={args.topics}: training log-likelihood")
            fig.tight_layout()
            fig.savefig(os.path.join(out, "convergence.png"), dpi=100)
            print(f"wrote {out}/model, metrics.json, topics.txt, convergence.png")
        except ImportError:
            print(f"wrote {out}/model, metrics.json, topics.txt (no plot: pip install 'pystrads[plot]')")
    else:
        spark.createDataFrame([(json.dumps(metrics, default=float),)], ["value"]).coalesce(1).write.mode(
            "overwrite").text(os.path.join(out, "metrics.json"))
        print(f"wrote {out}/model and {out}/metrics.json")
    if owned:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
