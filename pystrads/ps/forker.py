"""The shard forker: shards forked from the executor's Python daemon instead of new interpreters.

A shard started as a new interpreter pays Python's start and numba's again (~0.6 s of CPU, beside
the fit's first steps).  So Spark's Python daemon, when it is :mod:`pystrads.daemon`, forks a
*forker* once numba is loaded: a single-threaded copy of itself that listens on a Unix socket named after the
executor JVM (:func:`forker_path`, in a directory only this user can enter, answering only this
user's processes) and forks each shard :func:`fork_shard` asks it for, as
``python -m pystrads.ps.server`` with the caller's arguments, environment, import path and
working directory, titled with that command line.  The launcher falls back to a new
interpreter when no forker answers (the daemon has not started yet, or is Spark's own) or when
the forker runs another interpreter or another pystrads installation.  The forker exits
within a second of its daemon; its shards do not (they watch the executor JVM, as ever).
"""

from __future__ import annotations

import sys

#: the module a forked shard runs as ``__main__``
SHARD_MODULE = "pystrads.ps.server"


#: private directories tried after ``<tmp>/pystrads-<uid>`` (``pystrads-<uid>-1`` ..) when another
#: user squats it
WORK_BASE_FALLBACKS = 8


def work_base() -> str:
    """This user's private directory in ``<tmp>``: the forkers' sockets, and the shards' files
    unless ``spark.pystrads.shard.workDir`` names another directory.  ``pystrads-<uid>``, made
    here (mode 0700) if missing; when it is not this user's alone (another owner, a mode that
    lets others in, a symbolic link: squatted), the first of ``pystrads-<uid>-1`` ..
    ``-8`` that is -- the same choice in every process of the user, so the launcher and the
    forker meet.  Raises :class:`PermissionError` naming each candidate's problem when none is."""
    import os
    import tempfile

    base = os.path.join(tempfile.gettempdir(), f"pystrads-{os.getuid()}")
    problems = []
    for candidate in [base] + [f"{base}-{i}" for i in range(1, WORK_BASE_FALLBACKS + 1)]:
        problem = private_dir(candidate)
        if problem is None:
            return candidate
        problems.append(f"{candidate}: {problem}")
    raise PermissionError("no private work directory for pystrads: " + "; ".join(problems))


def forker_path(jvm_pid: int) -> str:
    """The Unix socket of the forker that serves the executor JVM ``jvm_pid`` on this host."""
    import hashlib
    import os
    import socket

    host = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
    return os.path.join(work_base(), f"forker-{host}-{int(jvm_pid)}.sock")


def _peer_uid(conn) -> int:
    """The uid of the process at the other end of the Unix socket ``conn`` (``SO_PEERCRED``)."""
    import socket
    import struct

    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return uid


def _identity() -> dict:
    """What a forked shard shares with the forker: the interpreter and pystrads' location."""
    import os

    from .. import __file__ as package_file

    return {"python": os.path.realpath(sys.executable), "pystrads": os.path.realpath(os.path.dirname(package_file))}


def private_dir(path: str, create: bool = True):
    """None when ``path`` is (made here if missing and ``create``, mode 0700) a directory of this
    user that no other user can enter -- not a symbolic link; else what is wrong with it.  Where
    a socket that starts processes, a run's files and its tokens' users may live."""
    import os
    import stat

    try:
        if create:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot make or read it ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.getuid():
        return f"it belongs to uid {st.st_uid}, not to this process's uid {os.getuid()}"
    if st.st_mode & 0o077:
        return f"its mode is {oct(st.st_mode & 0o777)}: other users may enter it (it must be 0700)"
    return None


def start_forker() -> int:
    """Fork the forker for the JVM that started this daemon (its parent); 0 when none was
    started: another daemon of the same JVM serves it, or the socket cannot be made safely."""
    import fcntl
    import os
    import socket

    lock = listener = None
    try:
        jvm = os.getppid()
        path = forker_path(jvm)  # in work_base(): this user's private directory
        if len(path.encode()) > 100:
            return 0
        fd = os.open(path[: -len(".sock")] + ".lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        lock = os.fdopen(fd, "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by the forker while it lives
        except BlockingIOError:  # held: another daemon's forker serves this JVM
            lock.close()
            return 0
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.lexists(path):
            os.unlink(path)  # a forker that died left it: the lock says none serves it now
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(64)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except Exception as exc:  # noqa: BLE001 -- no forker (shards start as new interpreters); the daemon serves on
        for held in (listener, lock):
            if held is not None:
                held.close()
        print(f"pystrads.daemon: no shard forker ({exc!r}); shards start as new interpreters", file=sys.stderr,
              flush=True)
        return 0
    if pid:
        listener.close()  # the daemon keeps neither: its workers must not inherit them
        lock.close()
        return pid
    code = 0
    try:
        _serve_forks(listener, lock, daemon=os.getppid(), jvm=jvm)
    except BaseException:  # noqa: BLE001 - the forker only ever ends here
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _serve_forks(listener, lock, daemon: int, jvm: int) -> None:
    import os
    import signal
    import socket

    os.setpgid(0, 0)  # out of the JVM's process group, as the daemon is: a terminal's ^C is not for it
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the shards that exit
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # the daemon's stdout is its pipe to the JVM: never written from here
    os.close(null)
    try:
        from setproctitle import setproctitle, setthreadtitle

        # not the daemon's command line: tools that look for Spark's daemon and its workers by it
        # must not take the forker for one
        setproctitle(f"pystrads-forker for the executor JVM {jvm}")
        setthreadtitle("pystrads-forker")
    except ImportError:
        pass
    listener.settimeout(1.0)
    while os.getppid() == daemon:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        try:
            _answer(conn, listener, lock)
        except Exception as exc:  # noqa: BLE001 - one bad request never stops the forker
            print(f"pystrads.daemon: shard forker: {exc!r}", file=sys.stderr, flush=True)
        finally:
            conn.close()


def _answer(conn, listener, lock) -> None:
    import json
    import os

    conn.settimeout(10.0)
    if _peer_uid(conn) != os.getuid():
        conn.sendall(b'{"error": "this forker serves its own user only"}\n')
        return
    request = json.loads(conn.makefile("rb").readline(1 << 20))
    mine = _identity()
    theirs = request.get("identity") or {}
    if theirs != mine:
        conn.sendall(json.dumps({"error": f"the forker runs {mine}, the caller {theirs}"}).encode() + b"\n")
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_shard(request, (conn, listener, lock))
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _become_shard(request: dict, inherited) -> None:
    """In the forked child: what ``subprocess.Popen([python, "-m", SHARD_MODULE, *argv], env=env,
    cwd=cwd, stdout=log, stderr=log, stdin=DEVNULL, start_new_session=True, close_fds=True)``
    gives a new interpreter, then the shard's main.  Never returns."""
    import os
    import runpy
    import signal

    code = 1
    try:
        for item in inherited:
            item.close()
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 1 << 16)
        argv = [str(a) for a in request["argv"]]
        try:
            from setproctitle import setproctitle, setthreadtitle

            # ps, pgrep -f and /proc/<pid>/cmdline show the command a new interpreter would have
            # (set before the environment changes: setproctitle moves it to make room)
            setproctitle(" ".join([sys.executable, "-m", SHARD_MODULE, *argv]))
            setthreadtitle(os.path.basename(sys.executable))
        except ImportError:
            pass
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:0] = [p for p in request["path"] if p not in sys.path]
        sys.argv = [SHARD_MODULE, *argv]
        runpy.run_module(SHARD_MODULE, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported in the shard's log, as a new interpreter would
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def fork_shard(jvm_pid: int, argv, env, log_file: str, timeout: float = 10.0):
    """The pid of a shard (``python -m pystrads.ps.server *argv``) forked by the forker of the
    executor JVM ``jvm_pid``, with environment ``env``, this process's import path and working
    directory, output to ``log_file``; ``None`` when no forker of the same interpreter and
    pystrads installation answers (start the shard as a new interpreter then)."""
    import json
    import os
    import socket

    import logging

    try:
        path = forker_path(jvm_pid)  # in this user's private directory (work_base)
    except PermissionError as exc:
        logging.getLogger(__name__).warning("no shard forker: %s", exc)
        return None
    if not os.path.exists(path):
        return None
    request = {"argv": [str(a) for a in argv], "env": dict(env), "log": log_file, "cwd": os.getcwd(),
               "path": [p for p in sys.path if p], "identity": _identity()}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(path)
            # the environment carries the run's tokens: only for a forker of this very user
            uid = _peer_uid(conn)
            if uid != os.getuid():
                logging.getLogger(__name__).warning(
                    "the process at the shard forker's socket %s runs as uid %d, not %d: not asked", path, uid,
                    os.getuid())
                return None
            conn.sendall(json.dumps(request).encode() + b"\n")
            reply = json.loads(conn.makefile("rb").readline(1 << 20) or b"{}")
    except (OSError, ValueError):
        return None  # a forker that died (its socket stays until the next one replaces it)
    if "pid" not in reply:
        logging.getLogger(__name__).info("the shard forker declined (%s): starting a new interpreter",
                                         reply.get("error", reply))
        return None
    return int(reply["pid"])
