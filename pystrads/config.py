"""Runtime settings: ``spark.pystrads.*`` keys with their defaults.

The reference file with every key commented is ``conf/pystrads-defaults.conf``;
``tests/test_config.py`` checks that it and :data:`DEFAULTS` agree.  Values
come from (later wins): the defaults here, the Spark configuration
(``--conf spark.pystrads.x=y`` or ``spark-defaults.conf``), and the
``config`` mapping passed to :class:`pystrads.engine.Engine`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from .errors import ConfigurationError
from .ps.protocol import CHUNK_BYTES

PREFIX = "spark.pystrads."


@dataclasses.dataclass(frozen=True)
class Setting:
    key: str  # without the prefix
    default: Any
    kind: type
    doc: str
    minimum: Optional[float] = None
    choices: Optional[tuple] = None


_SETTINGS = [
    Setting("shard.perExecutor", 1, int, "shard processes started on each executor", 1),
    Setting("shard.bindHost", "", str,
            "address shards listen on; empty = 127.0.0.1 in local mode, on clusters the executor's "
            "SPARK_LOCAL_IP, else the address its host reaches the driver from (never a loopback address "
            "when the driver is on another host, never 0.0.0.0); 0.0.0.0 here binds every interface and "
            "still advertises that routable address"),
    Setting("shard.port", 0, int,
            "first port a shard tries (for firewalls); 0 = any free port", 0),
    Setting("shard.portRange", 16, int,
            "with shard.port set: ports tried from it upwards (shard.port .. shard.port + portRange - 1), "
            "enough for shard.perExecutor shards per host", 1),
    Setting("shard.leaseSeconds", 30.0, float,
            "seconds a shard lives without a driver heartbeat before it exits", 1.0),
    Setting("shard.heartbeatSeconds", 0.0, float,
            "seconds between driver heartbeats; 0 = automatic (leaseSeconds / 5, at most 3); "
            "keep it well under leaseSeconds / 2", 0.0),
    Setting("shard.startTimeoutSeconds", 60.0, float,
            "seconds to wait for a shard process to report its port", 1.0),
    Setting("shard.fork", True, bool,
            "fork shards from the executor's pystrads Python daemon (spark.python.daemon.module="
            "pystrads.daemon), which has numpy and numba loaded, instead of starting a new interpreter "
            "for each (~0.6 s of CPU each, and ~0.4 s of a small first fit on 2 cores); a new interpreter where "
            "no such daemon runs yet, or it runs another Python or pystrads installation"),
    Setting("shard.workDir", "", str,
            "local directory on each executor for shard logs and port files, which must be the executors' "
            "user's alone (mode 0700, not a symbolic link) or the shards do not start; "
            "empty = <tmp>/pystrads-<uid> (made private; a squatted one is passed over)"),
    Setting("shard.mallocRetainBytes", 256 * 1024 * 1024, int,
            "glibc only: freed heap memory a shard keeps mapped instead of returning it to the OS, "
            "with blocks under 32 MiB served from the heap; received batches then land on warm "
            "pages (16 MiB puts measured 1.0 -> 1.7 GB/s); 0 = glibc's defaults", 0),
    Setting("shard.tls.certFile", "", str,
            "PEM certificate the shards serve TLS (grpc+tls) with; the path must exist on every executor; it "
            "must name the shards' addresses (e.g. a SAN per host / IP, or a wildcard). Empty = shards off the "
            "loopback make their own per-run key pair and certificate (the driver trusts exactly those), "
            "shards on the loopback (local mode) serve plain gRPC. Either way TLS shards ask every client for "
            "the run's own client certificate (mutual TLS)"),
    Setting("shard.tls.keyFile", "", str, "PEM private key of shard.tls.certFile"),
    Setting("shard.tls.caFile", "", str,
            "PEM certificate(s) the driver and workers trust for the shards; empty = certFile itself "
            "(a self-signed certificate)"),
    Setting("shard.tls.plaintext", False, bool,
            "allow plain gRPC off the loopback when no certificate is configured (logs a warning: the run "
            "token and program payloads then cross the network in clear); false = per-run TLS"),
    Setting("shard.tls.lifetimeSeconds", 7 * 86400.0, float,
            "seconds the certificate each shard makes for itself, and the run's client certificate, are valid "
            "(valid from a day before they were made: "
            "clocks may disagree by up to a day); once half of it has passed, the next fit gets new shards, so "
            "a fit always starts with at least half the lifetime ahead", 10.0),
    Setting("table.sparseRowMaxFill", 0.25, float,
            "tables a program declares sparse (Table(storage='sparse')): a row is stored as (column, value) "
            "pairs while at most this fraction of its width is non-zero, dense above (LightLDA's K / 4; "
            "a pair costs 4 bytes more than a dense cell, and a row keeps room to double); 0 = every "
            "non-empty row dense, 1 = every row as pairs", 0.0),
    Setting("rpc.chunkBytes", CHUNK_BYTES, int,
            "bytes per Arrow record batch in a get or put stream (kept under gRPC's "
            "4 MiB message limit)", 4096),
    Setting("rpc.timeoutSeconds", 10.0, float,
            "deadline of a control call to a shard (a step action, a ping, a post); long polls add the wait they "
            "ask for, reads and writes a second per 8 MiB they move, checkpoint and table actions 60 times it. "
            "A shard that misses a deadline is taken for lost, as if killed: its fit recovers or fails naming "
            "it (a paused host, a frozen process, a network that drops packets)", 1.0),
    Setting("rpc.maxKeysPerRequest", 262144, int,
            "keys sent in one get request; larger key sets are split", 1),
    Setting("worker.threads", 0, int,
            "threads each worker (one barrier task) computes with, sharing its data and its block of the "
            "model in memory; 0 = the executor's cores when the fit picks its workers (one per executor), else "
            "spark.task.cpus, so one task with every core of an executor is one worker that talks to the "
            "shards once per round for all of them", 0),
    Setting("round.timeoutSeconds", 600.0, float,
            "seconds a worker waits for the others to finish a round before failing the step", 1.0),
    Setting("step.targetSeconds", 5.0, float,
            "wall time a step aims for; more rounds per step amortise the per-step cost (the command reaching the workers, their state snapshots, the commit)", 0.01),
    Setting("step.maxRounds", 100000, int, "upper bound on the rounds of one step", 1),
    Setting("scheduler.location", "auto", str,
            "where a fit's scheduler (the program's schedule, the step loop, checkpoints) runs: driver = in the "
            "process that calls fit, talking to the shards directly; job = in the first task of the fit's barrier "
            "job, for clients that reach only Spark (the client then submits jobs and reads their results, and "
            "opens no connection to an executor); auto = job under Spark Connect, else driver", None,
            ("auto", "driver", "job")),
    Setting("scheduler.planAhead", True, bool,
            "pipelined schedules: while a step runs, the scheduler plans the next one from the values committed "
            "before it (programs that allow it: Program.plans_ahead; the rounds-only linear models), so the "
            "workers do not wait on the schedule between steps; false plans each step after the one before"),
    Setting("debug.serial", False, bool,
            "serial mode, for program authors: the fit runs on one worker holding all the data, and each round "
            "of the schedule runs as the program's serial_rounds of it, one after another (e.g. a coordinate "
            "round as one coordinate at a time): compare a parallel program's result with it"),
    Setting("progress", "auto", str,
            "fit progress (step i/N, objective, throughput, ETA): auto = log lines, plus a live bar in "
            "Jupyter/Databricks notebooks; log; bar; both; off", None, ("auto", "log", "bar", "both", "off")),
    Setting("progress.pollSeconds", 3.0, float,
            "with the scheduler in the fit's job (scheduler.location): seconds between the client's reads of the "
            "fit's progress, each a one-task Spark job that needs a task slot beside the fit's workers (with "
            "none free the progress shows when the fit ends); 0 = no reads", 0.0),
    Setting("checkpoint.dir", "", str,
            "directory for fit checkpoints (tables, worker states, driver state): a local or shared path or "
            "any pyarrow filesystem URI (hdfs://, s3://, a /dbfs mount); empty = the SparkContext's checkpoint "
            "directory (sc.setCheckpointDir) if set, else no checkpoints. On a cluster it must be reachable "
            "from the driver and every executor"),
    Setting("checkpoint.interval", 0, int,
            "steps between checkpoints; 0 = none (the estimators pass their checkpointInterval param); a fit "
            "started again with the same program, data, workers and seed resumes from the latest one", 0),
    Setting("model.dir", "", str,
            "directory where a fitted model's distributed tables (e.g. StradsMF's factors) are written as "
            "Parquet by the executors before the shards drop them: a shared path or pyarrow filesystem URI, "
            "one folder per fit, deleted by model.close() or by you; empty = Spark local checkpoints (executor "
            "memory and disk, lost with an executor after the fit, freed by model.close())"),
    Setting("mf.localModelBytes", 32 * 1024 * 1024, int,
            "StradsMF models up to this size as float64 ((users + items) x rank x 8 bytes) are read onto the "
            "driver when the fit ends (one read of the shards, no Spark job) and their userFactors / itemFactors "
            "become DataFrames from that copy; larger ones are made by executor tasks reading the shards and "
            "kept on the executors, never on the driver; 0 = always on the executors", 0),
    Setting("lda.localModelBytes", 32 * 1024 * 1024, int,
            "StradsLDA models up to this size as int32 (vocabSize x k x 4 bytes) are read onto the driver when "
            "the fit ends (one read of the shards, no Spark job) and applied (transform, logLikelihood, "
            "logPerplexity) by shipping p(word | topic) with the tasks (the driver then holds about 3 x this); "
            "larger ones are kept on the executors and applied by a join that "
            "gives each task only the rows of the words its documents use (no copy on the driver, a shuffle of "
            "the documents per call); 0 = always the join", 0),
    Setting("recovery.maxAttempts", 3, int,
            "times a fit restarts lost shards or lost worker states (from the latest checkpoint, or from the "
            "start without one) before it fails", 0),
    Setting("executor.waitSeconds", 120.0, float,
            "seconds to wait for enough executors to register before the first step", 0.0),
]

DEFAULTS = {s.key: s.default for s in _SETTINGS}
_BY_KEY = {s.key: s for s in _SETTINGS}


def _coerce(setting: Setting, value: Any) -> Any:
    try:
        if setting.kind is bool:
            out = value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")
        else:
            out = setting.kind(value)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"{PREFIX}{setting.key}={value!r} is not a valid {setting.kind.__name__} "
            f"({setting.doc}); use e.g. {setting.default!r}") from None
    if setting.minimum is not None and out < setting.minimum:
        raise ConfigurationError(
            f"{PREFIX}{setting.key}={value!r} is below its minimum {setting.minimum} "
            f"({setting.doc}); use e.g. {setting.default!r}")
    if setting.choices is not None and out not in setting.choices:
        raise ConfigurationError(
            f"{PREFIX}{setting.key}={value!r} is not one of {', '.join(setting.choices)}")
    return out


class Config(dict):
    """A resolved settings mapping ``key -> value`` (keys without the prefix)."""

    @classmethod
    def resolve(cls, spark_conf: Optional[Mapping[str, str]] = None,
                overrides: Optional[Mapping[str, Any]] = None) -> "Config":
        values = dict(DEFAULTS)
        for source in (spark_conf or {}, overrides or {}):
            for key, value in source.items():
                short = key[len(PREFIX):] if key.startswith(PREFIX) else key
                if short not in _BY_KEY:
                    if key.startswith(PREFIX) or source is overrides:
                        raise ConfigurationError(
                            f"unknown setting {PREFIX}{short}; known settings: "
                            + ", ".join(PREFIX + k for k in sorted(_BY_KEY)))
                    continue
                values[short] = _coerce(_BY_KEY[short], value)
        out = cls(values)
        if out["shard.heartbeatSeconds"] == 0:
            out["shard.heartbeatSeconds"] = min(3.0, out["shard.leaseSeconds"] / 5)
        elif out["shard.heartbeatSeconds"] * 2 > out["shard.leaseSeconds"]:
            raise ConfigurationError(
                f"{PREFIX}shard.heartbeatSeconds={out['shard.heartbeatSeconds']} must be at most half "
                f"of {PREFIX}shard.leaseSeconds={out['shard.leaseSeconds']}; lower the heartbeat "
                "or raise the lease")
        return out

    @classmethod
    def from_spark(cls, spark, overrides: Optional[Mapping[str, Any]] = None) -> "Config":
        """Settings from a Spark application's configuration (a SparkContext, a classic or
        Spark Connect session, or their handle), then ``overrides``."""
        from .spark import handle_of

        return cls.resolve(handle_of(spark).conf_items(PREFIX), overrides)


def settings():
    """All known settings (for docs and the reference-file test)."""
    return list(_SETTINGS)
