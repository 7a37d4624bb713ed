"""Starting, watching and stopping the shard processes of a Spark application.

A small Spark job runs a task on every executor; each task starts (once per
executor, guarded by a file lock) ``spark.pystrads.shard.perExecutor``
detached shard processes with the executor's own Python (``sys.executable``,
which is ``PYSPARK_PYTHON``), waits until each reports its port, and returns
``(executor, host, port, pid)``.  Shards hold no Spark task slot.  The
driver then keeps a heartbeat thread running; shards exit when the driver
calls ``shutdown`` (at exit, or :func:`shutdown`) or, if the driver dies,
when their lease lapses.
"""

from __future__ import annotations

import atexit
import fcntl
import ipaddress
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Dict, List, Optional

from .forker import SHARD_MODULE, fork_shard, work_base
from ..errors import ConfigurationError, PystradsError, ShardStartError, ShardUnavailableError
from .client import ShardGroup, ShardInfo, fan_out
from .protocol import Action
from .server import ADMIN_TOKEN_ENV, CLIENT_CERT_ENV, TOKEN_ENV
from .tls import trust_bundle

log = logging.getLogger(__name__)


# --------------------------------------------------------------------- executor side
def _proc_stat(pid: int):
    """(name, parent pid, state letter) of ``pid`` from /proc; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            raw = fh.read()
    except OSError:
        return None
    name = raw[raw.index("(") + 1:raw.rindex(")")]
    state, ppid = raw[raw.rindex(")") + 2:].split()[:2]
    return name, int(ppid), state


def executor_pid() -> int:
    """Pid of the JVM this Python worker serves (one per executor; the driver's in local mode)."""
    pid = os.getpid()
    for _ in range(6):
        stat = _proc_stat(pid)
        if stat is None:
            break
        name, ppid, _state = stat
        if name == "java":
            return pid
        if ppid <= 1:
            break
        pid = ppid
    return os.getppid()


def executors_python(sc) -> str:
    """The interpreter a classic SparkContext's executors run (PYSPARK_PYTHON, else this one)."""
    return getattr(sc, "pythonExec", None) or sys.executable


def executors_run_this_python(sc) -> bool:
    """Whether that interpreter is this process's own (paths resolved)."""
    import shutil

    python = executors_python(sc)
    return os.path.realpath(shutil.which(python) or python) == os.path.realpath(sys.executable)


def executor_identity() -> str:
    """``host:pid`` of the JVM this Python worker serves (one per executor)."""
    return f"{socket.gethostname()}:{executor_pid()}"


WILDCARDS = ("0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name, resolved) is on the loopback."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def auto_tls(configured_cert: str, plaintext: bool, bind: str, advertise: str) -> bool:
    """Whether shards make their own key pairs and serve TLS: off the loopback -- advertised
    there, or listening on every interface (``shard.bindHost=0.0.0.0`` in local mode advertises
    the loopback but listens on all) -- unless a certificate is configured or plaintext allowed."""
    return not configured_cert and not plaintext and not (is_loopback(advertise) and is_loopback(bind))


def address_toward(peer: str) -> Optional[str]:
    """The local address this host reaches ``peer`` from (the kernel's route choice: a UDP
    socket's ``connect`` sends no packet), or None."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(peer, 9, socket.AF_INET, socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return s.getsockname()[0]
    except OSError:
        return None


def shard_addresses(local_mode: bool, configured: str, driver_host: str = "") -> tuple:
    """``(bind, advertise)``: the address a shard listens on and the one clients dial.

    ``spark.pystrads.shard.bindHost`` wins; a wildcard there (``0.0.0.0``) binds every
    interface but still advertises a routable address.  Otherwise: the loopback in local
    mode; on a cluster the executor's ``SPARK_LOCAL_IP``, else the address through which
    this host reaches the driver (the route Spark's own traffic takes), else the host
    name's address -- never a loopback address when the driver is elsewhere (Debian and
    Ubuntu map the host name to 127.0.1.1)."""
    if configured and configured not in WILDCARDS:
        return configured, configured
    wildcard = configured if configured in WILDCARDS else ""
    if local_mode:
        return wildcard or "127.0.0.1", "127.0.0.1"
    spark_local_ip = os.environ.get("SPARK_LOCAL_IP")
    if spark_local_ip:  # the address Spark itself binds this executor to: the operator's choice
        return wildcard or spark_local_ip, spark_local_ip
    addr = None
    remote_driver = bool(driver_host) and not is_loopback(driver_host)
    tried = []
    if driver_host:
        addr = address_toward(driver_host)
        tried.append(f"the route to the driver at {driver_host} gave {addr}")
    if addr is None or (remote_driver and is_loopback(addr)):
        try:
            by_name = socket.gethostbyname(socket.getfqdn())
        except OSError:
            by_name = None
        tried.append(f"host name {socket.getfqdn()!r} resolves to {by_name}")
        if by_name and not (remote_driver and is_loopback(by_name)):
            addr = by_name
        elif not remote_driver:
            addr = addr or by_name
        else:
            addr = None
    if addr is None:
        raise ShardStartError(
            f"no address of host {socket.gethostname()} that the driver at {driver_host or '?'} can reach "
            f"({'; '.join(tried)}); set SPARK_LOCAL_IP on the executors or "
            "spark.pystrads.shard.bindHost to this host's address on the cluster network")
    return wildcard or addr, addr


def _alive(pid: int) -> bool:
    """``pid`` runs: exists and is not a zombie (a forked shard's parent is the daemon's forker,
    or init once the forker is gone: not this process, which so cannot reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _proc_stat(pid)
    return stat is None or stat[2] != "Z"


class _Forked:
    """A shard the daemon's forker started: not this process's child, so not waited for here
    (the forker, or init once the forker is gone, reaps it); its exit code is not known."""

    returncode = "unknown (a forked shard)"

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self) -> Optional[int]:
        return None if _alive(self.pid) else -1

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass


def _run_dir(work_dir: str, run_id: str) -> str:
    """The run's directory of shard files on this host: in this user's private work base
    (:func:`~pystrads.ps.forker.work_base`) or in ``spark.pystrads.shard.workDir``, which must be
    private too; made mode 0700 and checked (owner, mode, no symbolic link) either way."""
    from .forker import private_dir

    if work_dir:
        problem = private_dir(work_dir)
        if problem:
            raise ShardStartError(
                f"spark.pystrads.shard.workDir={work_dir!r} on host {socket.gethostname()} is not private: {problem}. "
                "The shards' files live there; give the setting a directory of the executors' user alone "
                "(chmod 700), or leave it empty for a private directory in the temporary directory")
        base = work_dir
    else:
        try:
            base = work_base()
        except PermissionError as exc:
            raise ShardStartError(f"on host {socket.gethostname()}: {exc}; set spark.pystrads.shard.workDir to a "
                                  "directory of the executors' user alone (chmod 700)") from None
    run_dir = os.path.join(base, run_id)
    problem = private_dir(run_dir)
    if problem:
        raise ShardStartError(f"the shards' run directory {run_dir} on host {socket.gethostname()} is not private: "
                              f"{problem}")
    return run_dir


def _open_private(path: str, flags: int) -> int:
    """A file descriptor of ``path`` (made mode 0600 when it is written), never through a
    symbolic link."""
    if flags & (os.O_WRONLY | os.O_RDWR):
        flags |= os.O_CREAT
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def start_local_shards(run_id: str, token: str, count: int, bind_host: str, lease: float,
                       work_dir: str, start_timeout: float, malloc_retain: int = 0, tls_cert: str = "",
                       tls_key: str = "", advertise: str = "", port: int = 0,
                       port_range: int = 1, tls_auto: bool = False, admin_token: str = "",
                       jvm_pid: Optional[int] = None, extra_env: Optional[Dict[str, str]] = None,
                       fork: bool = True, tls_lifetime: float = 0.0,
                       client_cert: Optional[bytes] = None) -> List[Dict[str, Any]]:
    """Start ``count`` shards for ``run_id`` on this executor unless already running
    (listening on ``bind_host``, dialled at ``advertise``; ports ``port`` ..
    ``port + port_range - 1``, or any free port when ``port`` is 0).  TLS with the
    operator's ``tls_cert`` / ``tls_key``, or with ``tls_auto`` each shard's own key pair; a
    TLS shard serves only clients that present ``client_cert`` (the run's, PEM).  Called in a Python worker, the executor is the JVM it serves; called elsewhere (the
    driver of a local-mode application), ``jvm_pid`` names it.  ``extra_env``: variables the
    shards get beside this process's (the executors' ``spark.executorEnv.*``).  ``fork``: ask
    the executor's pystrads daemon to fork the shards (:func:`pystrads.ps.forker.fork_shard`: no
    second start of Python and numba) and start new interpreters only where it does not."""
    watched = jvm_pid if jvm_pid is not None else executor_pid()
    executor = f"{socket.gethostname()}:{watched}"
    run_dir = _run_dir(work_dir, run_id)
    safe = executor.replace(":", "_").replace("/", "_")
    with os.fdopen(_open_private(os.path.join(run_dir, f"{safe}.lock"), os.O_WRONLY), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        registry = os.path.join(run_dir, f"{safe}.json")
        if os.path.exists(registry):
            with os.fdopen(_open_private(registry, os.O_RDONLY), "r") as fh:
                infos = json.load(fh)
            if all(_alive(i["pid"]) for i in infos):
                return infos
        infos, procs = [], []
        env = dict(os.environ, **(extra_env or {}))
        env[TOKEN_ENV] = token
        if admin_token:
            env[ADMIN_TOKEN_ENV] = admin_token
        if client_cert:
            env[CLIENT_CERT_ENV] = client_cert.decode()  # a certificate, public: the key stays with the clients
        # Spark's Python worker adds --py-files / addPyFile entries to sys.path, not to
        # PYTHONPATH: hand the worker's import path on so the shard finds the same pystrads.
        inherited = [str(p) for p in sys.path if p] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(inherited)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
            env.setdefault(var, "1")
        spawn_env = {k: v for k, v in env.items() if k not in (TOKEN_ENV, ADMIN_TOKEN_ENV)}
        for i in range(count):
            shard_id = f"{executor}#{i}"
            info_file = os.path.join(run_dir, f"{safe}-{i}.port")
            log_file = os.path.join(run_dir, f"{safe}-{i}.log")
            if os.path.lexists(info_file):
                os.remove(info_file)
            argv = (["--host", bind_host, "--port", str(int(port)),
                     "--port-range", str(int(port_range)), "--advertise", advertise or bind_host,
                     "--watch-pid", str(watched),
                     "--lease", str(lease), "--info-file", info_file, "--shard-id", shard_id,
                     "--malloc-retain", str(int(malloc_retain))]
                    + (["--tls-cert", tls_cert, "--tls-key", tls_key] if tls_cert else
                       ["--tls-auto"] + (["--tls-lifetime", str(float(tls_lifetime))] if tls_lifetime else [])
                       if tls_auto else []))
            forked = fork_shard(watched, argv, env, log_file) if fork else None
            if forked is not None:
                proc = _Forked(forked)
            else:
                # the tokens through a pipe: a process's initial environment stays readable in
                # /proc/<pid>/environ by every process of the user, whatever it pops later
                with os.fdopen(_open_private(log_file, os.O_WRONLY | os.O_APPEND), "ab") as out:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", SHARD_MODULE, *argv, "--secrets-stdin"],
                        stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=spawn_env,
                        start_new_session=True, close_fds=True)
                try:
                    proc.stdin.write(json.dumps({"token": token, "admin": admin_token or ""}).encode() + b"\n")
                    proc.stdin.close()
                except OSError:
                    pass  # it died at once: reported with its log below
                if jvm_pid is not None:  # a long-lived parent (the driver) reaps its shards when they exit
                    threading.Thread(target=proc.wait, name=f"pystrads-reap-{shard_id}", daemon=True).start()
            procs.append((proc, info_file, log_file, shard_id))
        deadline = time.monotonic() + start_timeout
        for proc, info_file, log_file, shard_id in procs:
            while not os.path.exists(info_file):
                code = proc.poll()
                if code is not None or time.monotonic() > deadline:
                    for other, *_ in procs:
                        if other.poll() is None:
                            other.kill()
                    tail = ""
                    try:
                        with open(log_file, errors="replace") as fh:
                            tail = fh.read()[-2000:]
                    except OSError:
                        pass
                    why = (f"exited with code {proc.returncode}" if code is not None
                           else f"did not report a port within {start_timeout:.0f} s "
                                "(spark.pystrads.shard.startTimeoutSeconds)")
                    raise ShardStartError(
                        f"shard {shard_id} on executor {executor} (host {socket.gethostname()}, "
                        f"python {sys.executable}) {why}. Its log {log_file} ends with:\n{tail}")
                time.sleep(0.02)
            with open(info_file) as fh:
                info = json.load(fh)
            info["executor"] = executor
            info["started"] = "forked" if isinstance(proc, _Forked) else "spawned"
            infos.append(info)
        with os.fdopen(_open_private(registry + ".tmp", os.O_WRONLY | os.O_TRUNC), "w") as fh:
            json.dump(infos, fh)
        os.replace(registry + ".tmp", registry)
        return infos


# --------------------------------------------------------------------- driver side
def _count_executors(sc) -> int:
    """Executors registered now (the driver counts as one in local mode)."""
    status = sc._jsc.sc().getExecutorMemoryStatus()
    n = status.size()
    return 1 if sc.master.startswith("local[") or sc.master == "local" else max(0, n - 1)


def tls_files(cfg) -> tuple:
    """``(cert path, key path, trusted root PEM bytes)`` from ``spark.pystrads.shard.tls.*``, checked
    on the driver before any shard starts (paths must also exist on every executor)."""
    cert, key, ca = cfg["shard.tls.certFile"], cfg["shard.tls.keyFile"], cfg["shard.tls.caFile"]
    if not (cert or key or ca):
        return "", "", None
    if not (cert and key):
        raise ConfigurationError(
            "spark.pystrads.shard.tls.certFile and spark.pystrads.shard.tls.keyFile go together (got "
            f"certFile={cert!r}, keyFile={key!r}); set both to PEM files present on every executor")
    for name, path in (("certFile", cert), ("keyFile", key), ("caFile", ca)):
        if path and not os.path.isfile(path):
            raise ConfigurationError(f"spark.pystrads.shard.tls.{name}={path!r} is not a readable file on the "
                                     "driver; the same path must exist on every executor")
    with open(ca or cert, "rb") as fh:
        roots = fh.read()
    return os.path.abspath(cert), os.path.abspath(key), roots


class ShardManager:
    """Owns the shard group of one Spark application: launch, heartbeat, shutdown."""

    def __init__(self, spark, config, reachable: bool = True):
        from ..spark import handle_of

        self.spark = handle_of(spark)  # a SparkContext's or a Spark Connect session's
        self.config = config
        self.run_id = "run-" + secrets.token_hex(8)
        self.token = secrets.token_urlsafe(32)  # every task holds it
        self.admin_token = secrets.token_urlsafe(32)  # only this driver: program payloads
        self.group: Optional[ShardGroup] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # one shutdown at a time (the heartbeat thread's, when the application stops, and the
        # interpreter's exit may meet): a second caller waits for the first to finish
        self._shutdown_lock = threading.Lock()
        self.heartbeat_failures = 0
        # when the shards' own certificates are past half their life (None: none of their own)
        self.renew_at: Optional[float] = None
        # the fits that use these shards (get_shards' holders): shards another live fit uses are
        # never shut down because this one found one of them gone
        self.holders: "weakref.WeakSet[Any]" = weakref.WeakSet()
        # False: this process cannot reach the executors (the scheduler runs in the fit's job): no
        # heartbeat from here, and anything said to the shards goes through a Spark task
        self.reachable = reachable

    def start(self, expected_executors: int) -> ShardGroup:
        cfg = self.config
        local_mode = self.spark.local_mode()
        run_id, token = self.run_id, self.token
        count = cfg["shard.perExecutor"]
        bind = cfg["shard.bindHost"]
        port, port_range = cfg["shard.port"], cfg["shard.portRange"]
        driver_host = self.spark.conf("spark.driver.host", "") or ""
        lease = cfg["shard.leaseSeconds"]
        work_dir = cfg["shard.workDir"]
        start_timeout = cfg["shard.startTimeoutSeconds"]
        malloc_retain = cfg["shard.mallocRetainBytes"]
        tls_cert, tls_key, tls_roots = tls_files(cfg)
        plaintext = cfg["shard.tls.plaintext"]
        admin_token = self.admin_token
        fork = cfg["shard.fork"]
        lifetime = cfg["shard.tls.lifetimeSeconds"]
        # the run's client certificate for shards that serve TLS (mutual TLS): made here, when
        # any shard may serve TLS (in local mode that is known here; on a cluster each executor
        # decides from its own address)
        may_tls = bool(tls_cert) or (not plaintext and (not local_mode or auto_tls(
            tls_cert, plaintext, *shard_addresses(local_mode, bind, driver_host))))
        client_cert = None
        if may_tls:
            from .tls import client_identity

            client_cert = client_identity(lifetime)
        client_pem = client_cert[0] if client_cert else None

        def launch(_index, jvm_pid=None, extra_env=None):
            host, advertise = shard_addresses(local_mode, bind, driver_host)
            auto = auto_tls(tls_cert, plaintext, host, advertise)
            infos = start_local_shards(run_id, token, count, host, lease, work_dir, start_timeout,
                                       malloc_retain, tls_cert, tls_key, advertise, port, port_range, auto,
                                       admin_token, jvm_pid, extra_env, fork, lifetime, client_pem)
            return [(i, sys.version_info[:2]) for i in infos]

        found: Dict[str, Dict[str, Any]] = {}
        versions = set()
        tasks = max(1, expected_executors) * (1 if local_mode else 4)
        t0 = time.monotonic()
        jvm = self._executor_jvm_here()
        for attempt in range(8):
            # plain local mode: the executor is this driver's JVM, on this machine -- start its
            # shards from here (no Spark job, no Python worker started for it)
            started = launch(0, jvm, self.spark.sc.environment) if jvm is not None else \
                self.spark.run_tasks(launch, tasks)
            for info, version in started:
                found[f"{info['executor']}#{info['shard']}"] = info
                versions.add(tuple(version))
            executors = {i["executor"] for i in found.values()}
            if len(executors) >= expected_executors:
                break
            tasks *= 2
        if len(executors) < expected_executors:
            raise ShardStartError(
                f"shards started on {len(executors)} of the {expected_executors} executors expected "
                f"({sorted(executors)}); {self._missing_executors(found)}. Check those executors' logs, or "
                "lower spark.executor.instances to the executors the cluster really gives")
        driver_version = tuple(sys.version_info[:2])
        if versions and versions != {driver_version}:
            raise ConfigurationError(
                f"executors run Python {sorted(versions)} but the driver runs {driver_version}; "
                f"set PYSPARK_PYTHON (or spark.pyspark.python) to the driver's interpreter {sys.executable}")
        shards = sorted(found.values(), key=lambda i: (i["executor"], i["shard"]))
        # plaintext listeners off the loopback: advertised there, or bound to every interface
        # (shard.bindHost=0.0.0.0 in local mode advertises the loopback but listens on all)
        exposed = sorted({i["host"] if not is_loopback(i["host"]) else f"{i['bind']} (all interfaces)"
                          for i in shards if not i.get("tls") and
                          not (is_loopback(i["host"]) and is_loopback(i.get("bind") or i["host"]))})
        if exposed:
            log.warning("shards on %s serve plaintext gRPC off the loopback (spark.pystrads.shard.tls.plaintext="
                        "true): the run token and program payloads cross the network in clear; anyone who "
                        "reads them can run code on the executors", ", ".join(exposed))
        if any(i.get("cert") for i in shards) or any(i.get("mutual") for i in shards):
            # their own certificates, or the run's client certificate, made just now
            self.renew_at = time.time() + lifetime / 2
        tls_used = any(i.get("tls") for i in shards)
        self.group = ShardGroup(
            [ShardInfo(i["host"], int(i["port"]), int(i["pid"]), i["executor"], i["shard"], i.get("python", ""),
                       bool(i.get("tls")))
             for i in shards], token, cfg["rpc.chunkBytes"], cfg["rpc.maxKeysPerRequest"],
            trust_bundle([i.get("cert") for i in shards], tls_roots), admin_token, cfg["rpc.timeoutSeconds"],
            client_cert if tls_used else None)
        if self.reachable:
            # The first heartbeat also proves every shard is reachable from the driver.
            self._beat(raise_errors=True)
            self._thread = threading.Thread(target=self._heartbeat_loop, name="pystrads-heartbeat", daemon=True)
            self._thread.start()
            _BEATING.add(self)
        log.info("started %d shard(s) on %d executor(s) in %.1f s: %s", len(shards),
                 len({i['executor'] for i in shards}), time.monotonic() - t0,
                 ", ".join(s.uri for s in self.group.shards))
        return self.group

    def _executor_jvm_here(self) -> Optional[int]:
        """The pid of the JVM that is both the driver and the only executor (a classic session on
        ``local`` / ``local[N]`` whose executors run this interpreter), else None."""
        import re

        sc = getattr(self.spark, "sc", None)
        if sc is None or not re.fullmatch(r"local(\[[^\]]*\])?", sc.master or ""):
            return None
        if not executors_run_this_python(sc):
            return None
        try:
            return int(sc._jvm.java.lang.ProcessHandle.current().pid())
        except Exception:  # noqa: BLE001 - a gateway without it: start them through a Spark job
            return None

    def _missing_executors(self, found: Dict[str, Dict[str, Any]]) -> str:
        """Which executors ran no shard, as far as Spark lists them (classic sessions)."""
        sc = getattr(self.spark, "sc", None)
        if sc is None:
            return "Spark Connect does not list executors; the others ran no launch task"
        try:
            infos = sc._jsc.sc().statusTracker().getExecutorInfos()
            listed = [f"{i.host()}:{i.port()}" for i in infos]
        except Exception:  # noqa: BLE001 - best effort, for the message only
            return "the others ran no launch task"
        hosts = {i["host"] for i in found.values()}
        driver = self.spark.conf("spark.driver.host", "")
        missing = [e for e in listed if e.rsplit(":", 1)[0] not in hosts and e.rsplit(":", 1)[0] != driver]
        return (f"executors without a shard: {missing}" if missing else
                f"Spark lists the executors {listed}; the others ran no launch task")

    def _beat(self, raise_errors: bool = False) -> None:
        """Renew every shard's lease, all at once, each call bounded by a heartbeat period (so a
        shard that does not answer never makes the others' leases lapse)."""
        if raise_errors:  # the first beat proves every shard is reachable: a control call's deadline
            self.group.broadcast(Action.HEARTBEAT)
            return
        missed = self.group.heartbeat(self._beat_deadline())
        if missed:
            self.heartbeat_failures += len(missed)
            log.warning("shards %s of %s missed a heartbeat", [self.group.shards[i].uri for i in missed],
                        self.run_id)

    def _beat_deadline(self) -> float:
        """How long one heartbeat (or the shutdown's stop call) waits for a shard."""
        return max(0.5, float(self.config["shard.heartbeatSeconds"]))

    def _heartbeat_loop(self) -> None:
        period = self.config["shard.heartbeatSeconds"]
        while not self._stop.wait(period):
            if not self.spark.alive():
                # spark.stop() in a driver that lives on (a notebook): the shards go with the
                # SparkContext, at once (those that cannot be told exit when their lease lapses)
                log.info("the Spark application of %s stopped; shutting its shards down", self.run_id)
                with _LOCK:
                    for key, manager in list(_MANAGERS.items()):
                        if manager is self:
                            del _MANAGERS[key]
                self.shutdown()
                return
            try:
                self._beat()
            except Exception:  # never let the heartbeat thread die silently
                log.exception("heartbeat failed")

    def renewal_due(self) -> bool:
        """The shards' own certificates, or the run's client certificate, are past half their
        life (``spark.pystrads.shard.tls.lifetimeSeconds``): a new fit gets a new group, so it starts
        with at least half the lifetime ahead."""
        return self.renew_at is not None and time.time() >= self.renew_at

    def alive(self) -> bool:
        """Whether every shard answers a ping (:meth:`ShardGroup.unreachable`: a failed
        connection is retried before a shard counts as gone)."""
        if self.group is None:
            return False
        if not self.reachable:
            from .relay import through_spark

            return through_spark(self.spark, self.group, _all_alive)
        gone = self.group.unreachable()
        if gone:
            log.warning("shards %s of %s do not answer", [self.group.shards[i].uri for i in gone], self.run_id)
        return not gone

    def shutdown(self) -> None:
        """Stop the heartbeat and the shards, and return once the heartbeat thread has made its
        last call: no Flight call of this manager's is left running behind the caller (at the
        interpreter's exit, a daemon thread inside a call as the interpreter tears down aborts
        the process).  Each shard is told at once, within a heartbeat's deadline; a shard that
        cannot be told exits when its lease lapses."""
        self._stop.set()
        with self._shutdown_lock:
            group, self.group = self.group, None
            if group is not None:
                self._stop_shards(group)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # its beat ends within the heartbeat deadline; a shutdown it began is done (the lock)
            thread.join(self._beat_deadline() + 1.0)
        _BEATING.discard(self)

    def _stop_shards(self, group: ShardGroup) -> None:
        if not self.reachable:
            from .relay import through_spark

            try:
                through_spark(self.spark, group, _shutdown_all)
            except Exception as exc:  # noqa: BLE001 -- they exit when their lease lapses
                log.info("could not tell the shards of %s to stop (%s); they exit when their lease lapses",
                         self.run_id, exc)
            return
        _shutdown_all(group, self._beat_deadline())


def _all_alive(group: ShardGroup) -> bool:
    return not group.unreachable()


def _shutdown_all(group: ShardGroup, deadline: Optional[float] = None) -> None:
    """Tell every shard of ``group`` to stop, all at once, each call within ``deadline`` seconds
    (None: a control call's); a shard that is gone or does not answer in time exits when its
    lease lapses."""
    def stop(i):
        try:
            group.client(i).action(Action.SHUTDOWN, deadline=deadline)
        except PystradsError:
            pass

    fan_out([lambda i=i: stop(i) for i in range(len(group.shards))])


def start_for_fit(spark, config, expected_executors: int) -> ShardManager:
    """Shards of their own for one fit whose scheduler runs in its job: started through a Spark
    job as usual, but never contacted from this process; the fit's coordinator keeps their lease
    while the job runs, and :meth:`ShardManager.shutdown` (the fit's release) stops them through a
    Spark task, else they exit when their lease lapses."""
    from ..spark import handle_of

    manager = ShardManager(handle_of(spark), config, reachable=False)
    STARTED_RUN_IDS.append(manager.run_id)
    manager.start(expected_executors)
    return manager


_MANAGERS: Dict[int, ShardManager] = {}
# managers whose heartbeat thread runs, also once they left _MANAGERS (the thread holds them)
_BEATING: "weakref.WeakSet[ShardManager]" = weakref.WeakSet()
# managers replaced in _MANAGERS (one of their shards was gone) while fits still held them: they
# keep beating for those fits' live shards and stop when the last of them lets go
_RETIRED: List[ShardManager] = []
_LOCK = threading.Lock()
STARTED_RUN_IDS: List[str] = []  # every run this driver process started shards for


def get_shards(spark, config, expected_executors: int, holder: Any = None) -> ShardManager:
    """The running shard manager of a Spark application (a SparkContext, a session or their
    handle), started on first use; ``holder`` (a fit) uses it until :func:`release_shards`.
    When one of its shards is gone, new shards replace the group for every later fit, and the
    old group stops once no fit holds it: a fit that finds a shard gone never stops the shards
    of another fit that still runs on them."""
    from ..spark import handle_of

    spark = handle_of(spark)
    with _LOCK:
        key = spark.key
        manager = _MANAGERS.get(key)
        renew = manager is not None and manager.renewal_due()
        if manager is not None and not renew and manager.alive():
            if holder is not None:
                manager.holders.add(holder)
            return manager
        if manager is not None:
            del _MANAGERS[key]
            manager.holders.discard(holder)
            why = "their certificates are past half their life" if renew else "some are gone"
            if len(manager.holders):
                log.warning("shards of %s: %s; starting new ones (the old ones stay for the %d fit(s) "
                            "that use them)", manager.run_id, why, len(manager.holders))
                _RETIRED.append(manager)
            else:
                log.warning("shards of %s: %s; starting new ones", manager.run_id, why)
                manager.shutdown()
        manager = ShardManager(spark, config)
        STARTED_RUN_IDS.append(manager.run_id)
        manager.start(expected_executors)
        if holder is not None:
            manager.holders.add(holder)
        _MANAGERS[key] = manager
        return manager


def drop_stopped() -> None:
    """Stop and forget the shard managers whose SparkContext or session was stopped."""
    with _LOCK:
        stopped = [_MANAGERS.pop(key) for key, manager in list(_MANAGERS.items()) if not manager.spark.alive()]
    for manager in stopped:  # outside the lock: shutdown waits for the heartbeat thread, which may want it
        manager.shutdown()


def release_shards(manager: ShardManager, holder: Any) -> None:
    """``holder`` no longer uses ``manager``'s shards: a replaced group stops with its last holder."""
    with _LOCK:
        manager.holders.discard(holder)
        last = manager in _RETIRED and not len(manager.holders)
        if last:
            _RETIRED.remove(manager)
    if last:
        manager.shutdown()


def shutdown() -> None:
    """Stop every shard this driver started (also runs at interpreter exit), and every
    heartbeat thread: one that was stopping its shards itself (its application stopped) is
    waited for."""
    with _LOCK:
        managers = list(_MANAGERS.values()) + _RETIRED
        _MANAGERS.clear()
        _RETIRED.clear()
    for manager in set(managers) | set(_BEATING):
        manager.shutdown()


atexit.register(shutdown)
