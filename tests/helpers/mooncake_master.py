"""A real mooncake_master (with its HTTP metadata server) on free loopback ports, for tests/cluster and
the connector's cluster tests (tests/vllm/test_vllm_cluster.py)."""
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master_binary() -> str:
    where = [os.path.dirname(sys.executable), os.environ.get("PATH", "")]
    try:  # the scripts of the environment Mooncake is installed in (a venv that borrows its packages)
        import mooncake
        where.insert(1, str(Path(mooncake.__file__).resolve().parents[4] / "bin"))
    except (ImportError, IndexError):
        pass
    exe = shutil.which("mooncake_master", path=os.pathsep.join(where))
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
