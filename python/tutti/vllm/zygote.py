"""Start runner engines by forking a process that has already imported vLLM.

    python -m tutti.vllm.zygote SOCKET

Importing vLLM takes ~11 s of CPU on a 2-core machine, longer than most engine runs in the tests, and
the connector's tests start dozens of engines.  The zygote imports it once; every run is a fork of it,
so each run is still a process of its own (its own store handles, its own engine, its own log) and
nothing but the store survives between two runs, as with a fresh interpreter.

``runner.launch`` uses it when ``TUTTI_RUNNER_ZYGOTE`` names its socket (the test session starts one)
and falls back to a fresh interpreter when it cannot be reached; so do the tests' TP rank processes
(a script: ``call`` with ``argv``).  One connection per run: the client sends one JSON line (a runner
spec, out and log paths, or a script's argv with stdout and log paths; the environment; cwd); the
zygote answers ``{"pid": N}`` once forked and ``{"rc": N}`` (N < 0: killed by signal -N) when the run
exits.  A client that goes away first (its timeout) has the run's whole process group killed.  The
zygote stays single-threaded (it forks), and exits when its parent does.
"""
from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys


def _preload() -> None:
    """What every run imports before its first line of work (runner.run's own imports)."""
    import torch.distributed  # noqa: F401  the TP rank scripts
    from vllm.config import KVTransferConfig  # noqa: F401

    import tutti.vllm  # noqa: F401  the connector module vLLM loads by path
    import tutti.vllm.worker  # noqa: F401
    from vllm import LLM, SamplingParams  # noqa: F401


def _send(conn: socket.socket, msg: dict) -> None:
    try:
        conn.sendall((json.dumps(msg) + "\n").encode())
    except OSError:
        pass  # the client is gone: its run is killed below


def _read_request(conn: socket.socket) -> dict | None:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    try:
        req = json.loads(buf)
    except ValueError:
        return None
    if not isinstance(req, dict) or not {"log", "env", "cwd"} <= req.keys():
        return None
    return req if {"spec", "out"} <= req.keys() or {"argv", "stdout"} <= req.keys() else None


def serve(path: str):
    """Accept runs until the parent exits.  Returns (in a forked child only) the request it is to run."""
    parent = os.getppid()
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(64)
    _preload()  # clients that connected meanwhile wait in the backlog
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ)
    runs: dict = {}  # pid -> client socket
    while os.getppid() == parent:
        for key, _ in sel.select(timeout=0.2):
            if key.fileobj is lsock:
                conn, _ = lsock.accept()
                conn.settimeout(10)
                try:
                    req = _read_request(conn)
                except OSError:
                    req = None
                if req is None:
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    lsock.close()
                    conn.close()
                    for c in runs.values():
                        c.close()
                    return req
                runs[pid] = conn
                _send(conn, {"pid": pid})
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, pid)
            else:  # a client sent more or went away: only a close is expected, so the run is killed
                pid = key.data
                try:
                    more = runs[pid].recv(1) if pid in runs else b""
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    more = b""
                if not more and pid in runs:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = runs.pop(pid, None)
            if conn is not None:
                sel.unregister(conn)
                conn.setblocking(True)
                _send(conn, {"rc": os.waitstatus_to_exitcode(status)})
                conn.close()
    for pid in runs:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return None


def _run_child(req: dict) -> int:
    """In the fork: become the run's own process (group, environment, cwd, log) and run it."""
    # A process group of its own, so that a kill of the group reaches the engine's own children; not a
    # session of its own: Linux makes each session a scheduling group (autogroup), and on a small machine
    # an engine's polling threads (vLLM's queue readers spin between steps) then starved the peers and
    # mooncake_master the tests run beside it for seconds (docs/cluster.md#first-fetch).
    os.setpgid(0, 0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if "argv" in req else log
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(log, 2)
    for fd in {log, out, null}:
        os.close(fd)
    if "argv" in req:  # a script, as `python SCRIPT ARGS` would run it
        import runpy
        argv = [str(a) for a in req["argv"]]
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [os.path.dirname(os.path.abspath(argv[0]))] + extra
        sys.argv = argv
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        return 0
    from . import runner
    sys.argv = [runner.__file__, req["spec"], req["out"]]
    return runner.main([req["spec"], req["out"]])


@contextlib.contextmanager
def running(sock: str, log_path: str, wait_s: float = 0.0):
    """A zygote serving at ``sock`` (its output to ``log_path``) for the block, ``runner.launch`` forking
    engines from it (TUTTI_RUNNER_ZYGOTE); killed after.  It binds the socket first and clients queue in
    the backlog while it imports; a run that finds no socket yet starts a fresh interpreter instead,
    unless ``wait_s`` waits (at most that long) for the socket to be there."""
    import subprocess
    import time
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tutti.vllm.zygote", sock],
                                env=dict(os.environ, TOKENIZERS_PARALLELISM="false"),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + wait_s
    while not os.path.exists(sock) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.environ["TUTTI_RUNNER_ZYGOTE"] = sock
    try:
        yield sock
    finally:
        os.environ.pop("TUTTI_RUNNER_ZYGOTE", None)
        proc.kill()
        proc.wait()


class ZygoteGone(RuntimeError):
    """The zygote went away after it forked the run: its outcome is unknown."""


def call(path, req: dict, timeout):
    """Ask the zygote at ``path`` to run ``req`` and wait: the run's exit code, or None when there is no
    zygote to ask (the caller then starts a fresh interpreter).  Past ``timeout`` (seconds, None: no
    limit) the run is killed (closing this end does it) and subprocess.TimeoutExpired raised."""
    import subprocess
    import time

    if not path:
        return None
    what = req.get("argv") or ["tutti.vllm.runner", req.get("spec")]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5)
        try:
            sock.connect(path)
            sock.sendall((json.dumps(req) + "\n").encode())
        except OSError:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        buf, pid = b"", None
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(what, timeout)
            sock.settimeout(left)  # the first answer ("pid") comes after the zygote's own import
            try:
                chunk = sock.recv(4096)
            except socket.timeout:
                raise subprocess.TimeoutExpired(what, timeout) from None
            except OSError:
                chunk = b""
            if not chunk:
                if pid is None:
                    return None  # the zygote went away before forking: run it elsewhere
                raise ZygoteGone(f"the zygote running {what} went away")
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if "pid" in msg:
                    pid = msg["pid"]
                elif "rc" in msg:
                    return msg["rc"]
    finally:
        sock.close()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    req = serve(argv[0])
    if req is None:
        return 0
    return _run_child(req)  # returned through sys.exit: atexit and thread joins run as in any process


if __name__ == "__main__":
    sys.exit(main())
