"""Data readers on small fixtures: the shapes the estimators take, and clear refusals."""

import gzip

import numpy as np
import pytest

from pystrads.datasets import (read_count_vectors, read_libsvm, read_movielens, read_text_corpus,
                               read_uci_bow)
from pystrads.errors import InputError


def test_uci_bag_of_words(spark, tmp_path):
    docword = tmp_path / "docword.tiny.txt.gz"
    with gzip.open(docword, "wt") as fh:  # 3 docs (doc 2 empty), 4 words; doc 3 repeats word 4
        fh.write("3\n4\n5\n1 1 2\n1 3 1\n3 4 5\n3 2 1\n3 4 1\n")
    vocab = tmp_path / "vocab.tiny.txt"
    vocab.write_text("apple\nbread\ncheese\ndough\n")
    df, words = read_uci_bow(spark, str(docword), str(vocab))
    rows = {r.docId: r.features for r in df.collect()}
    assert words == ["apple", "bread", "cheese", "dough"]
    assert set(rows) == {1, 3} and rows[1].size == 4
    assert rows[1].toArray().tolist() == [2, 0, 1, 0] and rows[3].toArray().tolist() == [0, 1, 0, 6]
    bad = tmp_path / "docword.bad.txt"
    bad.write_text("2\n4\n1\n1 9 2\n")
    with pytest.raises(InputError, match=r"word=9.*1\.\.W=4"):
        read_uci_bow(spark, str(bad))
    with pytest.raises(InputError, match="has 4 words but .* says W=5"):
        (tmp_path / "d5.txt").write_text("1\n5\n1\n1 1 1\n")
        read_uci_bow(spark, str(tmp_path / "d5.txt"), str(vocab))
    with pytest.raises(InputError, match="first three lines must be D, W and NNZ"):
        (tmp_path / "text.txt").write_text("hello world\nfoo\nbar\n")
        read_uci_bow(spark, str(tmp_path / "text.txt"))


def test_count_vectors_with_their_vocabulary(spark, tmp_path):
    from pyspark.ml.feature import CountVectorizer

    texts = spark.createDataFrame([(["a", "b", "a"],), (["c", "b"],), (["a"],)], ["words"])
    cv = CountVectorizer(inputCol="words", outputCol="features").fit(texts)
    cv.transform(texts).write.parquet(str(tmp_path / "vectors"))
    cv.save(str(tmp_path / "cv"))
    df, vocab = read_count_vectors(spark, str(tmp_path / "vectors"), model_path=str(tmp_path / "cv"))
    assert vocab == cv.vocabulary and df.count() == 3
    total = sum(r.features.toArray().sum() for r in df.collect())
    assert total == 6
    with pytest.raises(InputError, match="no column 'counts'"):
        read_count_vectors(spark, str(tmp_path / "vectors"), features_col="counts")
    with pytest.raises(InputError, match="column 'words' is array<string>, not a vector"):
        read_count_vectors(spark, str(tmp_path / "vectors"), features_col="words")


@pytest.mark.parametrize("fmt", ["csv", "dat", "udata"])
def test_movielens_formats(spark, tmp_path, fmt):
    rows = [(1, 10, 4.0, 964982703), (1, 20, 3.5, 964981247), (7, 10, 5.0, 964982224)]
    if fmt == "csv":
        path = tmp_path / "ratings.csv"
        path.write_text("userId,movieId,rating,timestamp\n" + "".join(f"{u},{m},{r},{t}\n" for u, m, r, t in rows))
        target = str(tmp_path)  # a directory holding ratings.csv
    elif fmt == "dat":
        path = tmp_path / "ratings.dat"
        path.write_text("".join(f"{u}::{m}::{int(r) if r == int(r) else r}::{t}\n" for u, m, r, t in rows))
        target = str(path)
    else:
        path = tmp_path / "u.data"
        path.write_text("".join(f"{u}\t{m}\t{r}\t{t}\n" for u, m, r, t in rows))
        target = str(path)
    df = read_movielens(spark, target)
    assert [f.dataType.simpleString() for f in df.schema.fields] == ["int", "int", "float", "bigint"]
    assert sorted(tuple(r) for r in df.collect()) == sorted(rows)


def test_movielens_refuses_bad_ids(spark, tmp_path):
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n1,10,4.0,1\n3000000000,2,1.0,1\n")
    with pytest.raises(InputError, match=r"out-of-range rating row .*3000000000"):
        read_movielens(spark, str(path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no ratings.csv"):
        read_movielens(spark, str(tmp_path / "empty"))
    with pytest.raises(InputError, match="does not exist"):
        read_movielens(spark, str(tmp_path / "nowhere"))


def test_libsvm(spark, tmp_path):
    path = tmp_path / "tiny.libsvm"
    path.write_text("1 1:0.5 3:2.0\n0 2:1.0\n1 1:1.5 4:-1\n")
    df = read_libsvm(spark, str(path), num_features=5)
    rows = df.collect()
    assert [r.label for r in rows] == [1.0, 0.0, 1.0] and rows[0].features.size == 5
    assert rows[2].features.toArray().tolist() == [1.5, 0, 0, -1, 0]
    with pytest.raises(InputError, match="does not exist"):
        read_libsvm(spark, str(tmp_path / "missing.libsvm"))


def test_text_corpus_skips_blank_lines(spark, tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("first document\n\n   \nsecond one\n")
    assert [r.text for r in read_text_corpus(spark, str(path)).collect()] == ["first document", "second one"]
