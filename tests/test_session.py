"""Session helpers: Spark Connect sessions are refused with the way out named."""

import pytest

from pystrads.errors import ConfigurationError
from pystrads.session import spark_context_of


def test_classic_sessions_give_their_context(spark):
    assert spark_context_of(spark.range(1)) is spark.sparkContext


def test_spark_connect_sessions_are_refused_clearly():
    ConnectSession = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
    frame = type("DataFrame", (), {"sparkSession": ConnectSession()})()
    with pytest.raises(ConfigurationError, match="Spark Connect session.*single-user \\(assigned\\) cluster"):
        spark_context_of(frame)
