"""A real mooncake_master (with its HTTP metadata server) on loopback, and cluster nodes as separate
processes, each with its own file-backed store (tests/helpers/cluster_node.py)."""
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mooncake.store", reason="Mooncake is not installed (pip install 'tutti[cluster]')")

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "tests" / "helpers" / "cluster_node.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master_binary() -> str:
    exe = shutil.which("mooncake_master", path=os.path.dirname(sys.executable) + os.pathsep +
                       os.environ.get("PATH", ""))
    if exe is None:
        pytest.skip("mooncake_master not found next to this Python or on PATH")
    return exe


class Master:
    """mooncake_master on free loopback ports; kill() and start() again on the same ports."""

    def __init__(self, log_dir: Path, client_ttl: int = 2):
        self.rpc, self.http, self.metrics = free_port(), free_port(), free_port()
        self.client_ttl, self.log_dir, self.proc = client_ttl, log_dir, None
        self.starts = 0

    @property
    def address(self):
        return f"127.0.0.1:{self.rpc}"

    @property
    def metadata(self):
        return f"http://127.0.0.1:{self.http}/metadata"

    def start(self):
        self.starts += 1
        log = open(self.log_dir / f"master{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [master_binary(), f"--rpc_port={self.rpc}", "--rpc_address=127.0.0.1",
             "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
             f"--http_metadata_server_port={self.http}", "--metrics_host=127.0.0.1",
             f"--metrics_port={self.metrics}", f"--client_ttl={self.client_ttl}"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited {self.proc.returncode}: see {log.name}")
            try:
                with socket.create_connection(("127.0.0.1", self.http), timeout=0.2), \
                        socket.create_connection(("127.0.0.1", self.rpc), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("mooncake_master did not listen within 15 s")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Node:
    """A cluster node process; ``cmd`` sends one command and waits (bounded) for its answer."""

    def __init__(self, tmp: Path, name: str, master: Master, model="m1", env=None):
        self.name, self.port = name, free_port()
        self.err = open(tmp / f"{name}.err", "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPER), str(tmp / f"{name}.img"), model, str(self.port), master.address,
             master.metadata],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
            env={**os.environ, **(env or {})})
        ready = self.read(30)
        assert ready["ok"] == "ready", ready
        self.block_bytes = ready["block_bytes"]

    def send(self, op, **kw):
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout=30):
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise TimeoutError(f"node {self.name}: no answer in {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"node {self.name} exited {self.proc.poll()}: see {self.err.name}")
        return json.loads(line)

    def cmd(self, op, timeout=30, **kw):
        self.send(op, **kw)
        out = self.read(timeout)
        assert "error" not in out, f"{self.name} {op}: {out['error']}"
        return out["ok"]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.cmd("close", timeout=20)
            except (TimeoutError, RuntimeError, OSError, AssertionError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    m = Master(tmp_path_factory.mktemp("master")).start()
    yield m
    m.kill()


@pytest.fixture
def nodes(tmp_path, master):
    """Start nodes on the module's master: ``nodes("a", env=..., model=...)``; all stopped at the end."""
    made = []

    def start(name, **kw):
        n = Node(tmp_path, name, master, **kw)
        made.append(n)
        return n

    yield start
    for n in made:
        n.close()
