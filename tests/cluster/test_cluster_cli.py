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


def _status(*args):
    return subprocess.run([sys.executable, "-m", "tutti.cli", "cluster", "status", *args],
                          capture_output=True, text=True, timeout=60)


def test_status_lists_every_node_with_its_blocks_and_counters(nodes, master):
    import json

    a, b = nodes("a"), nodes("b")
    other = nodes("other", model="m2")
    assert a.cmd("put", seeds=[7201, 7202, 7203]) == 3
    assert other.cmd("put", seeds=[7301]) == 1
    assert b.cmd("fetch", seeds=[7201, 7202])["ok"] == [True, True]
    assert a.served("blocks_served", 2) == 2      # counted once A's send returned: settle before recording
    for n in (a, b, other):
        n.cmd("record")
    admin = f"http://127.0.0.1:{master.metrics}"
    r = _status("--master", master.address, "--metadata", master.metadata, "--admin", admin, "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["master"]["status"] == "ok"
    by_model = {m["model"]: m for m in st["models"]}
    assert set(by_model) >= {"m1", "m2"}
    m1 = {n["endpoint"]: n for n in by_model["m1"]["nodes"]}
    na, nb = m1[f"127.0.0.1:{a.port}"], m1[f"127.0.0.1:{b.port}"]
    assert na["blocks"] == 3 and na["stats"]["blocks_served"] == 2 and na["stats"]["bytes_served"] == 2 * a.block_bytes
    assert nb["stats"]["remote_hits"] == 2 and nb["stats"]["bytes_fetched"] == 2 * b.block_bytes
    assert by_model["m1"]["descriptors"] >= 3 and [n["blocks"] for n in by_model["m2"]["nodes"]] == [1]
    text = _status("--master", master.address, "--metadata", master.metadata, "--admin", admin)
    assert text.returncode == 0, text.stderr
    assert f"127.0.0.1:{a.port}: 3/64 blocks held" in text.stdout and "model m2" in text.stdout
    names = _status("--admin", admin, "--names-only", "--json")
    assert names.returncode == 0 and all(n.get("unread") for m in json.loads(names.stdout)["models"]
                                         for n in m["nodes"])


def test_status_without_the_admin_service_is_exit_3():
    dead = free_port()
    r = _status("--admin", f"http://127.0.0.1:{dead}", "--names-only")
    assert r.returncode == 3, r.stderr
    assert r.stderr.count("\n") == 1 and "admin HTTP service" in r.stderr, r.stderr
