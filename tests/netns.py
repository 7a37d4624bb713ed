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

    def __init__(self, names: Iterable[str], loopback_names: Iterable[str] = (),
                 networks: Optional[Dict[str, int]] = None):
        self.names = list(names)
        self.loopback_names = set(loopback_names)
        tag = f"{os.getpid() % 10000:04d}"
        self.tag = tag
        # networks: host -> its network (0 by default); each network is a bridge and a /24 of its
        # own, and this machine does not forward between them, so hosts on different networks
        # cannot reach each other (only the root namespace reaches both)
        self.network: Dict[str, int] = {n: int((networks or {}).get(n, 0)) for n in self.names}
        self.bridges = {j: f"pst{tag}br{j or ''}" for j in sorted(set(self.network.values()))}
        self.subnets = {j: f"10.{231 + j}.{os.getpid() % 250 + 1}" for j in self.bridges}
        self.gateways = {j: f"{sub}.1" for j, sub in self.subnets.items()}
        self.bridge, self.subnet, self.gateway = self.bridges[0] if 0 in self.bridges else None, \
            self.subnets.get(0), self.gateways.get(0)
        self.address: Dict[str, str] = {n: f"{self.subnets[self.network[n]]}.{i + 2}"
                                        for i, n in enumerate(self.names)}
        self.netns: Dict[str, str] = {n: f"pst{tag}{n}" for n in self.names}
        self.hostname: Dict[str, str] = {n: f"pst-{n}" for n in self.names}
        self._procs: List[subprocess.Popen] = []
        self._made_ns: List[str] = []
        self._made_bridges: List[str] = []
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
        for j, bridge in self.bridges.items():
            _ip("link", "add", bridge, "type", "bridge")
            self._made_bridges.append(bridge)
            _ip("addr", "add", f"{self.gateways[j]}/24", "dev", bridge)
            _ip("link", "set", bridge, "up")
        for i, name in enumerate(self.names):
            ns = self.netns[name]
            _ip("netns", "add", ns)
            self._made_ns.append(ns)
            outer, inner = f"pst{self.tag}{i}a", f"pst{self.tag}{i}b"
            # a pair an earlier set of hosts of this process left (its namespace outlived ``ip netns
            # del`` while a killed process in it was not yet reaped) goes first: deleting one end
            # deletes both
            subprocess.run(["ip", "link", "del", outer], capture_output=True)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", outer, "master", self.bridges[self.network[name]])
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
                if self.network[other] != self.network[name]:
                    continue  # not reachable from here: not named either
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
        for bridge in self._made_bridges:
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        self._made_bridges = []
        try:
            os.rmdir(NETNS_ETC)  # only if empty: other users' namespaces stay untouched
        except OSError:
            pass

    def link_command(self, host: str, up: bool) -> List[str]:
        """The ``ip`` command that plugs ``host`` back in (``up``) or cuts it off from every other
        host (its link down: frames to and from it are dropped, connections stall, nothing is
        refused), as a network partition does; processes on it keep running."""
        i = self.names.index(host)
        return ["ip", "-n", self.netns[host], "link", "set", f"pst{self.tag}{i}b", "up" if up else "down"]

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


class Relay:
    """Forwards one TCP port from this process (the root namespace, which reaches every
    network): connections to ``listen`` go on to ``target``, byte for byte, both ways."""

    def __init__(self, listen: tuple, target: tuple):
        import socket
        import threading

        self.target = target
        self._server = socket.create_server(listen, reuse_port=False)
        self._server.settimeout(0.5)
        self._stop = threading.Event()
        self._socks: List = []
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                conn.close()
                continue
            upstream.settimeout(None)
            conn.settimeout(None)
            self.connections += 1
            self._socks += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        import socket

        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass
        self._thread.join(5)


class NetnsConnectServer(NetnsHosts):
    """A Spark Connect server (``local[2]``: its executors, Python workers and shards) on host
    ``server``, and a host ``client`` on a network of its own: the client reaches nothing of the
    server's network but its Connect port, which a :class:`Relay` in the root namespace forwards
    (``remote``: the ``sc://`` address the client dials)."""

    PORT = 15002

    def __init__(self, conf: Optional[Dict[str, str]] = None):
        super().__init__(["server", "client"], networks={"server": 0, "client": 1})
        self.conf = dict(conf or {})
        self.spark_home = os.path.dirname(pyspark.__file__)
        self.remote = f"sc://{self.gateways[1]}:{self.PORT}"
        self.relay: Optional[Relay] = None

    def env(self) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_LOCAL_IP", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
        env.update(SPARK_HOME=self.spark_home, PYSPARK_PYTHON=sys.executable, NO_PROXY="*", no_proxy="*")
        return env

    def __enter__(self) -> "NetnsConnectServer":
        super().__enter__()
        try:
            submit = os.path.join(self.spark_home, "bin", "spark-submit")
            conf = {"spark.connect.grpc.binding.port": str(self.PORT), "spark.ui.enabled": "false",
                    "spark.driver.host": "127.0.0.1", **self.conf}
            args = [submit, "--master", "local[2]", "--class",
                    "org.apache.spark.sql.connect.service.SparkConnectServer"]
            for k, v in conf.items():
                args += ["--conf", f"{k}={v}"]
            server = self.popen("server", args + ["spark-internal"], "connect-server.log", env=self.env())
            wait_for_log(server, "Spark Connect server started", 180)
            self.server = server
            self.relay = Relay((self.gateways[1], self.PORT), (self.address["server"], self.PORT))
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        super().close()
