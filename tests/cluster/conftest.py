"""A real mooncake_master (with its HTTP metadata server) on loopback, and cluster nodes as separate
processes, each with its own file-backed store (tests/helpers/cluster_node.py)."""
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mooncake.store", reason="Mooncake is not installed (pip install 'tutti[cluster]')")

from helpers.mooncake_master import Master, free_port

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "tests" / "helpers" / "cluster_node.py"


class Node:
    """A cluster node process; ``cmd`` sends one command and waits (bounded) for its answer."""

    def __init__(self, tmp: Path, name: str, master: Master, model="m1", env=None, port=None):
        self.name, self.port = name, port or free_port()
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

    def served(self, key, want, timeout=5.0):
        """A serving-side counter (``blocks_served``, ``bytes_served``): the owner counts a batch once its
        send returned, so the requester may hold the blocks a moment earlier.  Waits, bounded, until the
        counter reaches ``want``; returns its last value either way."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.cmd("info")["stats"].get(key, 0)
            if got == want or time.monotonic() >= deadline:
                return got
            time.sleep(0.05)

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
