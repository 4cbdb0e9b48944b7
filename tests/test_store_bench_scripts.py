"""benchmarks/store_prealloc.py, tmpfs_first_read.py and store_first_read.py in a short run: each measures what
it says (the first two also write their raw JSON and their section of the markdown) and leaves no file behind
in the directory it used."""
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def _run(script, *args):
    res = subprocess.run([sys.executable, os.path.join(BENCH, script), *args], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_store_prealloc_benchmark_runs(tmp_path):
    d = tmp_path / "store"
    out, md = tmp_path / "res.json", tmp_path / "b.md"
    _run("store_prealloc.py", "--dirs", str(d), "--tokens", "64", "--runs", "2", "--json", str(out),
         "--output", str(md))
    r = json.loads(out.read_text())
    assert r["tokens"] == 64 and len(r["rows"]) == 4
    by = {m: [x for x in r["rows"] if x["mode"] == m] for m in ("sparse", "preallocated")}
    assert all(x["first_gbps"] > 0 and x["overwrite_gbps"] > 0 for x in r["rows"])
    assert all(x["allocated_bytes"] >= x["size"] for x in by["preallocated"])   # the whole size held at format
    assert all(x["allocated_bytes"] < x["size"] for x in by["sparse"])
    assert "## Store: space reserved at format" in md.read_text()
    assert os.listdir(d) == []


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a tmpfs at /dev/shm")
def test_tmpfs_first_read_benchmark_runs(tmp_path):
    out, md = tmp_path / "res.json", tmp_path / "b.md"
    _run("tmpfs_first_read.py", "--mib", "16", "--runs", "3", "--json", str(out), "--output", str(md))
    r = json.loads(out.read_text())
    assert r["bytes"] == 16 << 20 and len(r["rows"]) == 18       # 3 writers x touch or not x 3 runs
    assert {(x["writer"], x["touch"]) for x in r["rows"]} == {
        (w, t) for w in ("pwrite", "mapped", "mapped, kept") for t in (False, True)}
    for x in r["rows"]:
        assert len(x["read_gbps"]) == 3 and min(x["read_gbps"]) > 0
        assert (x["touch_s"] > 0) == x["touch"]
    text = md.read_text()
    assert "## tmpfs: the first read of freshly written pages" in text and text.count("| mapped, kept |") == 2
    assert not os.path.exists("/dev/shm/tutti-first-read.img")


def test_tmpfs_first_read_refuses_bad_sizes(tmp_path):
    res = subprocess.run([sys.executable, os.path.join(BENCH, "tmpfs_first_read.py"), "--mib", "1",
                          "--json", str(tmp_path / "r.json"), "--output", str(tmp_path / "b.md")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--mib must be at least 8" in res.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a tmpfs at /dev/shm")
def test_store_first_read_benchmark_runs(tmp_path):
    """benchmarks/store_first_read.py: a save and its checked retrieves, the environment's TUTTI_ knobs echoed,
    nothing left in the directory (the retrieves are verified byte for byte inside the script)."""
    d = tmp_path / "shm"
    d.mkdir()
    env = {**os.environ, "TUTTI_TMPFS_POPULATE": "1"}
    res = subprocess.run([sys.executable, os.path.join(BENCH, "store_first_read.py"), "--blocks", "64", "--dir",
                          str(d), "--reads", "2", "--tag", "t"], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert r["tag"] == "t" and r["blocks"] == 64 and r["env"]["TUTTI_TMPFS_POPULATE"] == "1"
    assert r["store_gbps"] > 0 and len(r["retrieve_gbps"]) == 2 and min(r["retrieve_gbps"]) > 0
    assert os.listdir(d) == []
