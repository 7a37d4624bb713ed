import os
import sys

import pytest

from pystrads.engine.driver import check_java
from pystrads.errors import ConfigurationError


def pytest_sessionstart(session):
    try:
        check_java()
    except ConfigurationError as exc:
        pytest.exit(f"cannot run the Spark tests: {exc}", returncode=3)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark():
    from pystrads.session import spark_session

    session = spark_session("local[2]", "pystrads-tests", {
        "spark.ui.enabled": "false",
        "spark.default.parallelism": "2",
    })
    session.sparkContext.setLogLevel("ERROR")
    yield session
    from pystrads.ps import launcher

    launcher.shutdown()
    session.stop()


@pytest.fixture(scope="session")
def sc(spark):
    return spark.sparkContext
