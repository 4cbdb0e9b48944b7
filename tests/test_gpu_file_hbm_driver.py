"""benchmarks/gpu_file_hbm.py's driver: which configurations it runs and how (no GPU: the program is /bin/true)."""
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DRIVER = os.path.join(ROOT, "benchmarks", "gpu_file_hbm.py")


def drive(tmp_path, *args):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, DRIVER, "run", "--bin", "/bin/true", "--out", str(out),
                        "--disk-dir", str(tmp_path / "d"), "--budget", "60", *args],
                       capture_output=True, text=True, timeout=60)
    return r, (json.loads(out.read_text()) if out.exists() else None)


def test_disk_only_interleaved_rounds(tmp_path):
    r, data = drive(tmp_path, "--kinds", "disk", "--runs", "1", "--rounds", "5")
    assert r.returncode == 0, r.stderr
    cmds = data["meta"]["logs"]
    assert len(cmds) == 2 and all("/d/tt_file_hbm.img" in c for c in cmds)  # no /dev/shm store
    assert all("--runs 1 --rounds 5 --drop" in c for c in cmds)
    assert data["meta"]["command"].endswith("--kinds disk --runs 1 --rounds 5")
    assert "## File store into HBM (H200)" in r.stdout  # renders with nothing measured


def test_unknown_kind_is_refused(tmp_path):
    r, _ = drive(tmp_path, "--kinds", "nvme")
    assert r.returncode != 0 and "--kinds nvme: ram, disk or both" in r.stderr
