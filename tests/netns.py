"""A multi-host Spark cluster on one machine, out of Linux network namespaces.

Each *host* is a network namespace with its own address on a private bridge
(``10.231.<n>.0/24``), its own loopback, its own host name (a UTS namespace
per process tree) and its own ``/etc/hosts`` (``ip netns exec`` mounts
``/etc/netns/<ns>/hosts`` over it): so executors, shards and the driver can
only meet over the bridge, as on separate machines, and a host may resolve
its own name to 127.0.1.1 as Debian/Ubuntu installs do.

Needs root and iproute2 (``ip``); :func:`available` says whether this machine
can.  Only the hosts created here are contacted, and :class:`NetnsHosts`
removes everything it created (processes, namespaces, links, hosts files)
on exit, even after a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterable, List, Optional

import pyspark

NETNS_ETC = "/etc/netns"


def available() -> Optional[str]:
    """None when namespaces can be built here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and util-linux (unshare)"
    probe = f"psp{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


class NetnsHosts:
    """``with NetnsHosts(["driver", "w1", "w2"]) as hosts: hosts.popen("w1", [...])``.

    ``loopback_names``: hosts whose ``/etc/hosts`` maps their own name to 127.0.1.1 (and
    nothing else to their address): name-based address discovery on them finds a loopback.
    """

    def __init__(self, names: Iterable[str], loopback_names: Iterable[str] = ()):
        self.names = list(names)
        self.loopback_names = set(loopback_names)
        tag = f"{os.getpid() % 10000:04d}"
        self.tag = tag
        self.bridge = f"pst{tag}br"
        self.subnet = f"10.231.{os.getpid() % 250 + 1}"
        self.gateway = f"{self.subnet}.1"
        self.address: Dict[str, str] = {n: f"{self.subnet}.{i + 2}" for i, n in enumerate(self.names)}
        self.netns: Dict[str, str] = {n: f"pst{tag}{n}" for n in self.names}
        self.hostname: Dict[str, str] = {n: f"pst-{n}" for n in self.names}
        self._procs: List[subprocess.Popen] = []
        self._made_ns: List[str] = []
        self._made_bridge = False
        self.work = tempfile.mkdtemp(prefix="pystrads-netns-")

    # ------------------------------------------------------------------ build / tear down
    def __enter__(self) -> "NetnsHosts":
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made_bridge = True
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            ns = self.netns[name]
            _ip("netns", "add", ns)
            self._made_ns.append(ns)
            outer, inner = f"pst{self.tag}{i}a", f"pst{self.tag}{i}b"
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("link", "set", inner, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
            lines = ["127.0.0.1 localhost"]
            if name in self.loopback_names:
                lines.append(f"127.0.1.1 {self.hostname[name]}")
            for other in self.names:
                if other != name or name not in self.loopback_names:
                    lines.append(f"{self.address[other]} {self.hostname[other]}")
            with open(os.path.join(NETNS_ETC, ns, "hosts"), "w") as fh:
                fh.write("\n".join(lines) + "\n")

    def close(self) -> None:
        for proc in self._procs:  # each in its own process group, children included
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self._procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        for ns in self._made_ns:
            # anything still running inside (a shard that outlived its executor) dies with it
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
        self._made_ns = []
        if self._made_bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            self._made_bridge = False
        try:
            os.rmdir(NETNS_ETC)  # only if empty: other users' namespaces stay untouched
        except OSError:
            pass

    # ------------------------------------------------------------------ processes
    def command(self, host: str, args: List[str]) -> List[str]:
        """``args`` run on ``host``: its network namespace, its own host name."""
        return ["ip", "netns", "exec", self.netns[host], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.hostname[host], *args]

    def popen(self, host: str, args: List[str], log: str, env: Optional[Dict[str, str]] = None,
              **kwargs) -> subprocess.Popen:
        path = os.path.join(self.work, log)
        proc = subprocess.Popen(self.command(host, args), env=env, stdout=open(path, "w"),
                                stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
        proc.log_path = path  # type: ignore[attr-defined]
        self._procs.append(proc)
        return proc

    def run(self, host: str, args: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 900,
            **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, args), env=env, capture_output=True, text=True, timeout=timeout,
                              **kwargs)

    def pids(self, host: str) -> List[int]:
        out = subprocess.run(["ip", "netns", "pids", self.netns[host]], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]


def wait_for(path: str, text: str, proc, timeout: float) -> None:
    """Wait until ``text`` appears in the log ``path`` of ``proc`` (raise if it exits first)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{path}: process exited with {proc.returncode}:\n{open(path).read()[-3000:]}")
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return
        time.sleep(0.3)
    raise TimeoutError(f"{path}: no {text!r} within {timeout} s:\n{open(path).read()[-3000:]}")


def wait_for_log(proc, text: str, timeout: float) -> None:
    wait_for(proc.log_path, text, proc, timeout)


class NetnsSparkCluster(NetnsHosts):
    """A Spark standalone master on ``driver`` and one one-core worker on each other host.

    Workers in ``loopback_names`` get no ``SPARK_LOCAL_IP``: they are told their address only
    through ``--host`` (as a cluster manager does), so code that looks the host name up finds
    127.0.1.1 there.  ``env(host)`` is the environment for a driver or worker on ``host``.
    """

    MASTER_PORT = 7077

    def __init__(self, workers: int = 2, loopback_workers: Iterable[int] = (), secure: bool = False):
        names = ["driver"] + [f"w{i + 1}" for i in range(workers)]
        super().__init__(names, [f"w{i + 1}" for i in loopback_workers])
        self.worker_names = names[1:]
        # secure: Spark's own traffic (which carries the tasks, and so the run token) authenticated
        # and encrypted, as a cluster on an untrusted network must run it
        self.spark_conf: Dict[str, str] = {}
        if secure:
            import secrets

            self.spark_conf = {"spark.authenticate": "true", "spark.authenticate.secret": secrets.token_hex(16),
                               "spark.network.crypto.enabled": "true"}
        self.spark_home = os.path.dirname(pyspark.__file__)
        self.url = f"spark://{self.address['driver']}:{self.MASTER_PORT}"

    def env(self, host: str) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME")}
        env.update(SPARK_HOME=self.spark_home, PYSPARK_PYTHON=sys.executable, SPARK_LOG_DIR=self.work,
                   SPARK_WORKER_DIR=os.path.join(self.work, host), NO_PROXY="*", no_proxy="*")
        if host not in self.loopback_names:
            env["SPARK_LOCAL_IP"] = self.address[host]
        if self.spark_conf:
            opts = " ".join(f"-D{k}={v}" for k, v in self.spark_conf.items())
            env.update(SPARK_MASTER_OPTS=opts, SPARK_WORKER_OPTS=opts)
        return env

    def __enter__(self) -> "NetnsSparkCluster":
        super().__enter__()
        try:
            spark_class = os.path.join(self.spark_home, "bin", "spark-class")
            master = self.popen("driver", [spark_class, "org.apache.spark.deploy.master.Master", "--host",
                                           self.address["driver"], "--port", str(self.MASTER_PORT),
                                           "--webui-port", "8080"], "master.log", env=self.env("driver"))
            wait_for_log(master, "I have been elected leader", 120)
            workers = [self.popen(w, [spark_class, "org.apache.spark.deploy.worker.Worker", self.url, "--host",
                                      self.address[w], "--cores", "1", "--memory", "2g", "--webui-port", "8081",
                                      "--work-dir", os.path.join(self.work, w)], f"{w}.log", env=self.env(w))
                       for w in self.worker_names]
            for proc in workers:
                wait_for_log(proc, "Successfully registered with master", 120)
            self.workers = dict(zip(self.worker_names, workers))
        except BaseException:
            self.close()
            raise
        return self


class Capture:
    """Every frame that crosses the bridge of ``hosts`` while the ``with`` block runs, read with a
    raw ``AF_PACKET`` socket on the hosts' veth ends (no tcpdump needed; root only).

    ``payloads(ports)`` is the TCP payload bytes of the frames from or to any of ``ports``
    (all TCP frames when ``ports`` is None), in capture order."""

    def __init__(self, hosts: NetnsHosts, limit_bytes: int = 1 << 30):
        import socket
        import threading

        self._ifnames = {f"pst{hosts.tag}{i}a" for i in range(len(hosts.names))}
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL
        self._sock.settimeout(0.2)
        self._frames: List[tuple] = []  # (src port, dst port, payload)
        self._stored = 0
        self._limit = limit_bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.frames_seen = 0

    def __enter__(self) -> "Capture":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sock.close()

    def _run(self) -> None:
        import socket

        while not self._stop.is_set():
            try:
                frame, addr = self._sock.recvfrom(262144)
            except socket.timeout:
                continue
            except OSError:
                return
            if addr[0] not in self._ifnames or len(frame) < 34 or frame[12:14] != b"\x08\x00":
                continue  # not the fixture's, or not IPv4
            self.frames_seen += 1
            ip = frame[14:]
            ihl = (ip[0] & 0x0F) * 4
            total = int.from_bytes(ip[2:4], "big")
            if ip[9] != 6 or len(ip) < ihl + 20:
                continue  # not TCP
            tcp = ip[ihl:total]
            offset = (tcp[12] >> 4) * 4
            payload = bytes(tcp[offset:])
            if payload and self._stored < self._limit:
                self._frames.append((int.from_bytes(tcp[0:2], "big"), int.from_bytes(tcp[2:4], "big"), payload))
                self._stored += len(payload)

    def payloads(self, ports: Optional[Iterable[int]] = None) -> bytes:
        wanted = None if ports is None else set(ports)
        return b"".join(p for src, dst, p in list(self._frames)
                        if wanted is None or src in wanted or dst in wanted)
