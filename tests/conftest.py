import os
import sys
import tempfile

import pytest

from pystrads.engine import check_java
from pystrads.errors import ConfigurationError


#: no test takes more than a few minutes; one that hangs fails after this long (with the
#: stacks of its threads) instead of stalling the run until CI's limit
TEST_TIMEOUT_SECONDS = 900


#: test modules that start Spark without the session fixtures (subprocess drivers, clusters, a
#: kernel): all their tests count as ``spark``
SPARK_MODULES = {"test_checkpoints", "test_cluster", "test_connect_remote", "test_faults", "test_freeze",
                 "test_jobs", "test_lda_scan_memory", "test_lifecycle", "test_loop_faults", "test_notebook",
                 "test_phases", "test_tls", "test_worker_shape"}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a scenario the README's test command leaves to the second step of .ci/run, `pytest -m slow`: fault injection, clusters, jobs, conformance, and end-to-end checks of several seconds each whose kind a faster test covers in the README's run")
    config.addinivalue_line("markers", "spark: the test starts Spark (set on every test that uses the spark or sc fixture, and on the modules in conftest.SPARK_MODULES); `pytest -m 'not spark and not slow'` is the quick tier for day-to-day work")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if {"spark", "sc"} & set(getattr(item, "fixturenames", ())) or item.module.__name__ in SPARK_MODULES:
            item.add_marker(pytest.mark.spark)
    # the tests that start no Spark first (in their order), while the Spark JVMs' class-data
    # archive is built beside them (pytest_collection_finish); then those that start Spark
    items.sort(key=lambda item: item.get_closest_marker("spark") is not None)
    if not config.pluginmanager.hasplugin("timeout"):
        return
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_SECONDS, method="signal"))


def _shard_processes(run_ids=None):
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = open(f"/proc/{entry}/cmdline").read()
            except OSError:
                continue
            if "pystrads.ps.server" in cmd and (run_ids is None or any(r in cmd for r in run_ids)) \
                    and _of_this_session(entry, cmd):
                pids.append(int(entry))
    return pids


#: set in this test session's environment before any Spark process starts; every process the session
#: starts (JVMs, executors, subprocess drivers, standalone workers, and so shards) inherits it, so the
#: leak check below counts this session's shards only -- not those of another run on the same machine
SESSION_MARKER = f"PYSTRADS_TEST_SESSION={os.getpid()}-{os.urandom(6).hex()}"

#: this session's TMPDIR, inherited the same way: shards keep their port and log files under it, so
#: their command lines name it -- also those forked from a Python daemon, whose /proc/<pid>/environ
#: setproctitle has overwritten with their title
SESSION_TMP = tempfile.mkdtemp(prefix="pystrads-tests-")


def _of_this_session(pid: str, cmd: str = "") -> bool:
    if SESSION_TMP + os.sep in cmd:
        return True
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return SESSION_MARKER.encode() in fh.read().split(b"\0")
    except OSError:
        return False


@pytest.fixture(scope="session", autouse=True)
def no_processes_left_behind():
    """Fails the run if a shard outlives it: those this session's driver started must be gone
    at once (after shutdown), and any other shard that appeared during the session -- started
    by a subprocess driver, killed or not -- within the default 30 s lease."""
    import time

    before = set(_shard_processes())
    yield
    from pystrads.ps import launcher

    launcher.shutdown()
    deadline = time.time() + 15
    left = _shard_processes(launcher.STARTED_RUN_IDS)
    while left and time.time() < deadline:
        time.sleep(0.2)
        left = _shard_processes(launcher.STARTED_RUN_IDS)
    assert not left, f"shard processes left behind: {sorted(left)}"
    deadline = time.time() + 40
    others = set(_shard_processes()) - before
    while others and time.time() < deadline:
        time.sleep(0.5)
        others = set(_shard_processes()) - before
    assert not others, f"shard processes of subprocess drivers left behind: {sorted(others)}"


def pytest_sessionstart(session):
    try:
        check_java()
    except ConfigurationError as exc:
        pytest.exit(f"cannot run the Spark tests: {exc}", returncode=3)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    key, value = SESSION_MARKER.split("=", 1)
    os.environ[key] = value  # before any Spark process: see _of_this_session
    os.environ["TMPDIR"] = SESSION_TMP
    tempfile.tempdir = None  # this process's tempfile reads TMPDIR again
    # the Spark JVMs' threads get a 16 MB stack: MLlib's ALS (the reference several tests fit)
    # serialises a lineage as deep as its iterations, and Java's recursive serialisation of it
    # overflowed the default stack now and then (a StackOverflowError in a task)
    os.environ["SPARK_SUBMIT_OPTS"] = (os.environ.get("SPARK_SUBMIT_OPTS", "") + " -Xss16m").strip()


def pytest_collection_finish(session):
    """The Spark JVMs' shared class-data archive, when a selected test starts Spark (the quick
    tier starts none): its options are set before any Spark process starts (they all inherit
    them), and it is built in the background while the tests that start no Spark run."""
    if not session.config.option.collectonly and any(item.get_closest_marker("spark") for item in session.items):
        from jvm_archive import share_spark_classes

        share_spark_classes()


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


def pytest_terminal_summary(terminalreporter):
    from jvm_archive import REPORT

    for line in REPORT:
        terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0:  # a failed run keeps the shards' logs under it
        import shutil

        shutil.rmtree(SESSION_TMP, ignore_errors=True)
