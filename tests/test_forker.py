"""The shard forker of ``pystrads.daemon``: a daemon forks it once numba is loaded, and it forks
shards that are what a new interpreter would be (command line, session, arguments, token),
for its own user, interpreter and pystrads installation only; it goes with its daemon, its
shards do not; and the launcher starts a new interpreter wherever no forker answers.

Here this test process plays the executor JVM: the fake daemon is its child, as Spark's
daemon is the JVM's, and so the forker serves ``os.getpid()``."""

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from pystrads.ps import forker as shard_forker
from pystrads.ps import launcher
from pystrads.ps.client import ShardClient
from pystrads.ps.server import TOKEN_ENV

DAEMON = """
import sys, time
from pystrads import daemon
from pystrads.ps import forker
daemon.preload()
print(forker.start_forker(), forker.start_forker(), flush=True)
time.sleep(600)
"""


@pytest.fixture
def tmp(monkeypatch):
    """A short TMPDIR (a Unix socket's path has ~100 bytes) for this process and the daemon."""
    path = tempfile.mkdtemp(prefix="pf-", dir="/tmp")
    monkeypatch.setenv("TMPDIR", path)
    monkeypatch.setattr(tempfile, "tempdir", None)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_daemon(tmp):
    proc = subprocess.Popen([sys.executable, "-c", DAEMON], stdout=subprocess.PIPE, text=True)
    first, second = (int(x) for x in proc.stdout.readline().split())
    yield proc, first, second
    proc.kill()
    proc.wait()


def _ppid(pid):
    return launcher._proc_stat(pid)[1]


def _wait_gone(pid, seconds):
    deadline = time.time() + seconds
    while launcher._alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    return not launcher._alive(pid)


def _start(tmp, fork, token):
    env = {TOKEN_ENV: token}
    return launcher.start_local_shards("run-" + secrets.token_hex(8), token, 2, "127.0.0.1", 600.0,
                                       os.path.join(tmp, "work"), 60.0, jvm_pid=os.getpid(), extra_env=env,
                                       fork=fork)


def test_a_forked_shard_is_what_a_new_interpreter_would_be(fake_daemon, tmp):
    proc, forker, second = fake_daemon
    assert forker > 0 and _ppid(forker) == proc.pid
    assert second == 0, "one forker per executor JVM: the second start finds the first's lock"
    deadline = time.time() + 10  # it names itself once forked
    while open(f"/proc/{forker}/comm").read().strip() != "pystrads-forker" and time.time() < deadline:
        time.sleep(0.05)
    assert open(f"/proc/{forker}/comm").read().strip() == "pystrads-forker"
    # not taken for Spark's daemon or a Python worker by what looks for them (the fault tests)
    assert open(f"/proc/{forker}/cmdline").read().rstrip("\0") == f"pystrads-forker for the executor JVM {os.getpid()}"
    token = secrets.token_urlsafe(16)
    infos = _start(tmp, True, token)
    try:
        assert [i["started"] for i in infos] == ["forked", "forked"]
        for info in infos:
            pid = info["pid"]
            assert _ppid(pid) == forker
            assert os.getsid(pid) == pid  # its own session, as Popen(start_new_session=True)
            cmdline = open(f"/proc/{pid}/cmdline").read().rstrip("\0")
            assert cmdline.startswith(f"{sys.executable} -m pystrads.ps.server --host 127.0.0.1 "), cmdline
            assert f"--shard-id {info['shard']}" in cmdline and f"--watch-pid {os.getpid()}" in cmdline
            assert ShardClient(f"grpc://127.0.0.1:{info['port']}", token).action("ping")["pid"] == pid
        # the daemon goes (Spark stops it, or the executor dies): its forker within a second or
        # two, its shards stay with their executor (here this process) and their lease
        proc.kill()
        proc.wait()
        assert _wait_gone(forker, 5), "the forker outlived its daemon"
        for info in infos:
            assert ShardClient(f"grpc://127.0.0.1:{info['port']}", token).action("ping")["pid"] == info["pid"]
        # nothing answers on the forker's socket now: new interpreters
        again = _start(tmp, True, token)
        assert [i["started"] for i in again] == ["spawned", "spawned"]
        infos += again
    finally:
        for info in infos:
            os.kill(info["pid"], signal.SIGKILL)


def test_the_forker_declines_another_installation_and_the_launcher_spawns(fake_daemon, tmp, monkeypatch):
    _proc, forker, _ = fake_daemon
    real = shard_forker._identity()
    monkeypatch.setattr(shard_forker, "_identity", lambda: dict(real, pystrads="/elsewhere/pystrads"))
    assert shard_forker.fork_shard(os.getpid(), ["--help"], {}, os.path.join(tmp, "x.log")) is None
    token = secrets.token_urlsafe(16)
    infos = _start(tmp, True, token)
    try:
        assert [i["started"] for i in infos] == ["spawned", "spawned"]
        assert all(_ppid(i["pid"]) == os.getpid() for i in infos)
        monkeypatch.setattr(shard_forker, "_identity", lambda: real)
        forked = _start(tmp, True, token + "-2")  # the same forker still serves its own installation
        infos += forked
        assert [i["started"] for i in forked] == ["forked", "forked"] and _ppid(forked[0]["pid"]) == forker
        off = _start(tmp, False, token + "-3")  # spark.pystrads.shard.fork=false
        infos += off
        assert [i["started"] for i in off] == ["spawned", "spawned"]
    finally:
        for info in infos:
            os.kill(info["pid"], signal.SIGKILL)


def test_a_forked_shard_that_fails_reports_its_log(fake_daemon, tmp):
    """A shard that exits at once (here: no token) fails the start with its log's tail, as a new
    interpreter's does."""
    with pytest.raises(Exception, match="never runs without a run token") as err:
        launcher.start_local_shards("run-" + secrets.token_hex(8), "", 1, "127.0.0.1", 600.0,
                                    os.path.join(tmp, "work"), 20.0, jvm_pid=os.getpid(),
                                    extra_env={TOKEN_ENV: ""})
    assert "exited with code unknown (a forked shard)" in str(err.value)


def test_the_forker_answers_only_its_own_user(fake_daemon, tmp):
    """Its socket is its user's alone (mode 0600 in a 0700 directory); the forker checks the
    peer's uid too."""
    path = shard_forker.forker_path(os.getpid())
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
    if os.getuid() != 0:
        pytest.skip("checking another uid needs root")  # CI runs as root
    # the forker may answer and close before the request is sent: the reply is read all the same
    script = (f"import os, socket; os.setuid(65534); s = socket.socket(socket.AF_UNIX); s.connect({path!r})\n"
              "try:\n    s.sendall(b'{}\\n')\nexcept BrokenPipeError:\n    pass\nprint(s.makefile().readline())")
    os.chmod(path, 0o666)  # let the other user reach the socket: the uid check must stop it
    os.chmod(os.path.dirname(path), 0o755)
    os.chmod(tmp, 0o755)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip(), out  # (no answer at all: the client's error is in out.stderr)
    assert json.loads(out.stdout) == {"error": "this forker serves its own user only"}, out


def _squat(tmp, owner):
    """``<tmp>/pystrads-<uid>`` made before pystrads by somebody else (mode 0777; owned by
    ``owner``), with a listener at the forker's socket path in it: what it receives."""
    import hashlib
    import socket
    import threading

    base = os.path.join(tmp, f"pystrads-{os.getuid()}")
    os.mkdir(base)
    os.chmod(base, 0o777)
    host = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
    path = os.path.join(base, f"forker-{host}-{os.getpid()}.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o777)
    listener.listen(8)
    listener.settimeout(0.2)
    received = []

    def serve():
        while listener.fileno() != -1:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.settimeout(2)
            try:
                received.append(conn.recv(1 << 20))
            except OSError:
                received.append(b"(connected)")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    if owner is not None:
        os.chown(base, owner, owner)
    return base, listener, received


@pytest.mark.parametrize("owner", [None, 65534], ids=["mode-0777", "another-uid"])
def test_a_squatted_work_base_is_passed_over_and_its_listener_gets_nothing(tmp, owner):
    """Somebody pre-creates this user's work base open to all, or owned by another uid, and
    listens at the forker's path: the daemon's forker and the launcher both move to the same
    private fallback (``pystrads-<uid>-1``, mode 0700), the shards fork there, and the listener
    receives nothing -- no token, no connection."""
    if owner is not None and os.getuid() != 0:
        pytest.skip("a directory of another uid needs root")  # CI runs as root
    base, listener, received = _squat(tmp, owner)
    proc = subprocess.Popen([sys.executable, "-c", DAEMON], stdout=subprocess.PIPE, text=True)
    token, admin = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    infos = []
    try:
        forker = int(proc.stdout.readline().split()[0])
        assert forker > 0
        infos = launcher.start_local_shards("run-" + secrets.token_hex(8), token, 2, "127.0.0.1", 600.0, "", 60.0,
                                            jvm_pid=os.getpid(), admin_token=admin)
        assert [i["started"] for i in infos] == ["forked", "forked"] and _ppid(infos[0]["pid"]) == forker
        fallback = base + "-1"
        assert shard_forker.work_base() == fallback and oct(os.lstat(fallback).st_mode & 0o777) == "0o700"
        for info in infos:
            argv = open(f"/proc/{info['pid']}/cmdline").read().replace("\0", " ").split()
            assert argv[argv.index("--info-file") + 1].startswith(fallback + os.sep)
        time.sleep(0.5)
        assert received == [] and os.listdir(base) == [os.path.basename(shard_forker.forker_path(os.getpid()))]
    finally:
        listener.close()
        for info in infos:
            os.kill(info["pid"], signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_a_configured_work_dir_that_others_may_enter_is_refused(tmp):
    work = os.path.join(tmp, "shared-work")
    os.mkdir(work)
    os.chmod(work, 0o1777)
    with pytest.raises(Exception, match=r"spark.pystrads.shard.workDir=.*is not private: its mode is 0o777.*chmod 700"):
        launcher.start_local_shards("run-" + secrets.token_hex(8), "t", 1, "127.0.0.1", 600.0, work, 20.0,
                                    jvm_pid=os.getpid(), fork=False)
    assert os.listdir(work) == []


def test_no_token_in_any_shards_or_the_forkers_environment_or_command_line(fake_daemon, tmp):
    """Forked and spawned shards and the forker: neither token in ``/proc/<pid>/environ`` (which
    every process of the user can read, whatever the process pops later) or the command line."""
    _proc, forker, _ = fake_daemon
    token, admin = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    infos = []
    try:
        for fork in (True, False):
            started = launcher.start_local_shards("run-" + secrets.token_hex(8), token, 1, "127.0.0.1", 600.0, "",
                                                  60.0, jvm_pid=os.getpid(), admin_token=admin, fork=fork)
            infos += started
            assert started[0]["started"] == ("forked" if fork else "spawned")
            # the shard has both: it serves the token and takes the admin's payloads
            client = ShardClient(f"grpc://127.0.0.1:{started[0]['port']}", token, admin_token=admin)
            assert client.action("ping")["pid"] == started[0]["pid"]
        for pid in [i["pid"] for i in infos] + [forker]:
            for part in ("environ", "cmdline"):
                text = open(f"/proc/{pid}/{part}", "rb").read()
                assert token.encode() not in text and admin.encode() not in text, (pid, part)
                assert b"PYSTRADS_SHARD" not in text, (pid, part)
    finally:
        for info in infos:
            os.kill(info["pid"], signal.SIGKILL)


FAILING_FORKER = """
import errno, os, sys
from pystrads.ps import forker
how = sys.argv[1]
if how == "fork":
    def fork():
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
    os.fork = fork
else:  # the lock's path cannot be opened for writing
    lock = forker.forker_path(os.getppid())[: -len(".sock")] + ".lock"
    os.mkdir(lock)
print(forker.start_forker(), flush=True)
print("serving", flush=True)
"""


@pytest.mark.parametrize("how", ["fork", "lock"])
def test_a_forker_that_cannot_start_leaves_the_daemon_serving(tmp, how):
    """``start_forker`` with ``os.fork()`` failing (EAGAIN) or its lock path unwritable returns 0,
    and the daemon goes on to serve Spark's workers."""
    out = subprocess.run([sys.executable, "-c", FAILING_FORKER, how], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["0", "serving"], out
    assert "no shard forker" in out.stderr, out.stderr
