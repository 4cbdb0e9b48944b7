"""Start runner engines by forking a process that has already imported vLLM.

    python -m tutti.vllm.zygote SOCKET

Importing vLLM takes ~11 s of CPU on a 2-core machine, longer than most engine runs in the tests, and
the connector's tests start dozens of engines.  The zygote imports it once; every run is a fork of it,
so each run is still a process of its own (its own store handles, its own engine, its own log) and
nothing but the store survives between two runs, as with a fresh interpreter.

``runner.launch`` uses it when ``TUTTI_RUNNER_ZYGOTE`` names its socket (the test session starts one)
and falls back to a fresh interpreter when it cannot be reached.  One connection per run: the client
sends one JSON line (spec, out and log paths, environment, cwd); the zygote answers ``{"pid": N}`` once
forked and ``{"rc": N}`` (N < 0: killed by signal -N) when the run exits.  A client that goes away first
(its timeout) has the run's whole process group killed.  The zygote stays single-threaded (it forks),
and exits when its parent does.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys


def _preload() -> None:
    """What every run imports before its first line of work (runner.run's own imports)."""
    from vllm.config import KVTransferConfig  # noqa: F401

    import tutti.vllm  # noqa: F401  the connector module vLLM loads by path
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
    return req if isinstance(req, dict) and {"spec", "out", "log", "env", "cwd"} <= req.keys() else None


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
    os.setsid()  # a kill of the group reaches the engine's own children
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    from . import runner
    sys.argv = [runner.__file__, req["spec"], req["out"]]
    return runner.main([req["spec"], req["out"]])


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
