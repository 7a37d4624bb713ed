"""One class-data-sharing archive of Spark's classes for every JVM the test session starts.

The suite starts some forty Spark JVMs (subprocess drivers of the fault, lifecycle and job tests,
standalone masters and workers, the Spark Connect server).  Each spends ~1.8 s of a ~5 s start
loading and verifying the same few thousand classes from Spark's jars.  Java (13+) can dump the
classes a run loaded into an archive (``-XX:ArchiveClassesAtExit``) that later JVMs with the same
class path map instead (``-XX:SharedArchiveFile``): a session's start falls from ~5.0 s to ~3.3 s.

:func:`share_spark_classes` builds the archive once per test session, from one small local-mode
run in a fresh temporary directory (an archive outlives neither its JDK nor its pyspark), in the
background while the tests that start no Spark run, and hands it to the session's JVMs through
the environment they all inherit: ``SPARK_SUBMIT_OPTS``
(every ``spark-submit``, and so every PySpark driver and the Connect server) and
``SPARK_DAEMON_JAVA_OPTS`` (standalone masters and workers).  Executors and the product itself
never see it.  Where the dump fails (an older JDK), the tests run without it; where an archive
cannot be mapped, the JVM runs without it (``-Xshare:auto``) and logs nothing about it.
``PYSTRADS_TEST_CDS=0`` turns it off.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

_DUMP_RUN = r"""
import pyarrow as pa
from pystrads.session import spark_session

spark = spark_session("local[2]", "pystrads-class-archive", {"spark.ui.enabled": "false"})
spark.sparkContext.parallelize(range(100), 2).map(lambda x: (x % 3, x)).reduceByKey(lambda a, b: a + b).collect()
frame = spark.range(1000).selectExpr("id", "cast(id as double) as x")
frame.mapInArrow(lambda batches: (b for b in batches), frame.schema).count()
frame.groupBy((frame.id % 5).alias("k")).count().toPandas()
spark.stop()
"""

#: what became of the archive, for the session's summary (the build ends while tests run, whose
#: output pytest captures)
REPORT = []

#: JVM options that keep CDS quiet: a JVM that cannot map the archive says so on stdout otherwise
_QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def _add(var: str, options: str) -> None:
    os.environ[var] = (os.environ.get(var, "") + " " + options).strip()


def share_spark_classes() -> str:
    """Point the session's JVMs at the archive and start building it in the background; returns
    its path ('' when off).

    The dump runs beside the tests that start no Spark (the session runs those first): a JVM that
    starts before the archive is in place finds no file at the path and runs without it
    (``-Xshare:auto``), one that starts later maps it.  The dump writes to another name and the
    archive appears at its path by a rename, so no JVM ever maps a half-written file."""
    if os.environ.get("PYSTRADS_TEST_CDS", "1") == "0":
        return ""
    work = tempfile.mkdtemp(prefix="pystrads-cds-")
    atexit.register(shutil.rmtree, work, True)
    archive = os.path.join(work, "spark-classes.jsa")
    env = dict(os.environ, SPARK_SUBMIT_OPTS=(os.environ.get("SPARK_SUBMIT_OPTS", "") +
                                              f" -XX:ArchiveClassesAtExit={archive}.dump {_QUIET}").strip())
    options = f"-XX:SharedArchiveFile={archive} {_QUIET}"
    _add("SPARK_SUBMIT_OPTS", options)
    _add("SPARK_DAEMON_JAVA_OPTS", options)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _DUMP_RUN], env=env, cwd=work, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    atexit.register(_stop, proc)

    def finish() -> None:
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            REPORT.append("tests: no class-data archive for the Spark JVMs (they started without one): "
                          "the dump run timed out")
            return
        if proc.returncode != 0 or not os.path.exists(archive + ".dump"):
            REPORT.append("tests: no class-data archive for the Spark JVMs (they started without one): "
                          f"{(err or '')[-500:]}")
            return
        os.replace(archive + ".dump", archive)
        REPORT.append(f"tests: Spark JVMs shared the class-data archive {archive} "
                      f"(built in {time.monotonic() - t0:.1f} s, beside the tests that start no Spark)")

    threading.Thread(target=finish, name="class-data-archive", daemon=True).start()
    return archive


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
