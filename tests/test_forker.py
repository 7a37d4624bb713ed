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

from pystrads import daemon
from pystrads.ps import launcher
from pystrads.ps.client import ShardClient
from pystrads.ps.server import TOKEN_ENV

DAEMON = """
import sys, time
from pystrads import daemon
daemon.preload()
print(daemon.start_forker(), daemon.start_forker(), flush=True)
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
    real = daemon._identity()
    monkeypatch.setattr(daemon, "_identity", lambda: dict(real, pystrads="/elsewhere/pystrads"))
    assert daemon.fork_shard(os.getpid(), ["--help"], {}, os.path.join(tmp, "x.log")) is None
    token = secrets.token_urlsafe(16)
    infos = _start(tmp, True, token)
    try:
        assert [i["started"] for i in infos] == ["spawned", "spawned"]
        assert all(_ppid(i["pid"]) == os.getpid() for i in infos)
        monkeypatch.setattr(daemon, "_identity", lambda: real)
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
    path = daemon.forker_path(os.getpid())
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
    if os.getuid() != 0:
        pytest.skip("checking another uid needs root")  # CI runs as root
    script = (f"import os, socket; os.setuid(65534); s = socket.socket(socket.AF_UNIX); s.connect({path!r}); "
              "s.sendall(b'{}\\n'); print(s.makefile().readline())")
    os.chmod(path, 0o666)  # let the other user reach the socket: the uid check must stop it
    os.chmod(os.path.dirname(path), 0o755)
    os.chmod(tmp, 0o755)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert json.loads(out.stdout) == {"error": "this forker serves its own user only"}, out
