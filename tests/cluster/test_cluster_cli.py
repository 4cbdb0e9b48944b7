"""tutti-admin cluster serve: errors are one line with the documented exit code (the serving itself is
tests/vllm/test_vllm_cluster.py's owner process)."""
import subprocess
import sys

from tutti import Fingerprint, Store

from .conftest import free_port

TINY_FP = Fingerprint(model_id="m1", dtype="float16", n_layers=4, kv_heads=2, head_dim=64, block_size=16)


def _serve(*args):
    return subprocess.run([sys.executable, "-m", "tutti.cli", "cluster", "serve", *args],
                          capture_output=True, text=True, timeout=60)


def test_bad_option_is_a_usage_error(tmp_path):
    path = tmp_path / "s.img"
    Store.format(str(path), TINY_FP, n_slots=8)
    r = _serve(str(path), "-o", "cluster_mastr=x")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "unknown cluster option 'cluster_mastr'" in r.stderr


def test_unreachable_master_is_exit_3(tmp_path):
    path = tmp_path / "s.img"
    Store.format(str(path), TINY_FP, n_slots=8)
    dead = free_port()
    r = _serve(str(path), "--master", f"127.0.0.1:{dead}", "--metadata", f"http://127.0.0.1:{dead}/metadata",
               "--port", str(free_port()), "-o", "cluster_call_timeout_s=1")
    assert r.returncode == 3, r.stderr
    # Mooncake's own log lines (glog) come around it; tutti says it once, in one line.
    ours = [line for line in r.stderr.splitlines() if line.startswith("tutti-admin: error:")]
    assert len(ours) == 1 and ours[0].startswith("tutti-admin: error: cluster serve: "), r.stderr
    assert "did not start" in ours[0] or "refused" in ours[0]
