"""A mooncake_master with its HTTP metadata server on free loopback ports: one machine's cluster for
tests, benchmarks and trying the tier out (docs/cluster.md).  Production runs the master as its own
service (see docs/cluster.md for its flags); nothing in the connector starts one."""
from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .errors import ClusterError

_HANDED_OUT: set[int] = set()
_HANDED_LOCK = threading.Lock()


def free_port() -> int:
    """A free loopback port this process has not handed out before: a port a killed node used is free
    again at once, but the master may still hold that node's registration under it (until its
    client_ttl), and a new node named by it would be refused."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        with _HANDED_LOCK:
            if p not in _HANDED_OUT:
                _HANDED_OUT.add(p)
                return p
    raise ClusterError("no free loopback port this process has not used before")


def free_port_pair(offset: int, run: int = 1) -> int:
    """A free loopback port ``p`` with ``p + offset`` free too (a vLLM node uses its cluster_port and
    cluster_port + 1000 for its scheduler: tutti.vllm.cluster.SCHEDULER_PORT_OFFSET), and with ``run``
    > 1 also p + 1 ... p + run - 1 (a TP engine's rank r listens on cluster_port + r)."""
    for _ in range(50):
        p = free_port()
        if p + max(offset, run - 1) > 65535:
            continue
        more = [p + offset, *range(p + 1, p + run)]
        try:
            for q in more:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
        except OSError:
            continue
        with _HANDED_LOCK:
            if _HANDED_OUT.intersection(more):
                continue
            _HANDED_OUT.update(more)
        return p
    raise ClusterError("no free pair of loopback ports")


def master_binary() -> str | None:
    """mooncake_master next to this Python, in the environment Mooncake is installed in, or on PATH."""
    where = [os.path.dirname(sys.executable), os.environ.get("PATH", "")]
    try:  # a venv that borrows its packages from another keeps the scripts in that one's bin/
        import mooncake
        where.insert(1, str(Path(mooncake.__file__).resolve().parents[4] / "bin"))
    except (ImportError, IndexError):
        pass
    return shutil.which("mooncake_master", path=os.pathsep.join(where))


class LocalMaster:
    """mooncake_master on free loopback ports; kill() and start() again keep the same ports."""

    START_TIMEOUT_S = 15

    def __init__(self, log_dir, client_ttl: int = 2):
        self.rpc, self.http, self.metrics = free_port(), free_port(), free_port()
        self.client_ttl, self.log_dir = client_ttl, Path(log_dir)
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.rpc}"

    @property
    def metadata(self) -> str:
        return f"http://127.0.0.1:{self.http}/metadata"

    def start(self) -> LocalMaster:
        exe = master_binary()
        if exe is None:
            raise ClusterError("mooncake_master not found next to this Python or on PATH "
                               "(pip install 'tutti[cluster]')")
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"master{self.starts}.log", "w")
        proc = self.proc = subprocess.Popen(
            [exe, f"--rpc_port={self.rpc}", "--rpc_address=127.0.0.1",
             "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
             f"--http_metadata_server_port={self.http}", "--metrics_host=127.0.0.1",
             f"--metrics_port={self.metrics}", f"--client_ttl={self.client_ttl}"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterError(f"mooncake_master exited {proc.returncode}: see {log.name}")
            try:
                with socket.create_connection(("127.0.0.1", self.http), timeout=0.2), \
                        socket.create_connection(("127.0.0.1", self.rpc), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.1)
        self.kill()
        raise ClusterError(f"mooncake_master did not listen within {self.START_TIMEOUT_S} s: see {log.name}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> LocalMaster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()


class StoreOwner:
    """``tutti-admin cluster serve PATH`` in a process of its own: keeps a store reachable by peers once
    the engine that wrote it has exited (tests, benchmarks).  Ready when constructed (it has said
    ``serving N``: ``blocks``); ``env`` adds to its environment (e.g. TUTTI_CLUSTER_FAULTS), ``options``
    are ``-o key=value`` cluster options."""

    START_TIMEOUT_S = 120

    def __init__(self, log_dir, path, master, *, env=None, options=()):
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.err = open(log_dir / f"owner-{os.getpid()}-{id(self)}.err", "w")
        cmd = [sys.executable, "-m", "tutti.cli", "cluster", "serve", str(path), "--master", master.address,
               "--metadata", master.metadata, "--port", str(free_port())]
        for o in options:
            cmd += ["-o", o]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env={**os.environ, **(env or {})})
        r, _, _ = select.select([self.proc.stdout], [], [], self.START_TIMEOUT_S)
        line = self.proc.stdout.readline() if r else ""
        if not line.startswith("serving "):
            self.kill()
            raise ClusterError(f"the store owner did not start (exit {self.proc.returncode}): see {self.err.name}")
        self.blocks = int(line.split()[1])

    def stop(self) -> int:
        """SIGTERM (it withdraws its entries and exits 0); its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        rc = self.proc.wait(10)
        self.err.close()
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.err.close()
