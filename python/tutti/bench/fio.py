"""The fio baseline: sequential O_DIRECT reads and writes of the store's data region."""
from __future__ import annotations

import json
import resource
import shutil
import subprocess
from typing import Sequence

from .common import GB, BenchError, drop_page_cache


def fio_available() -> str | None:
    """fio's version string, or None when fio is not installed or does not run."""
    exe = shutil.which("fio")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


# fio settings (block size, queue depth) tried for the raw-device baseline.
# Virtual and real disks peak at different points (seen on the CI VM:
# 1M/QD32 1.3 GB/s, 4M/QD128 1.8 GB/s, 128k/QD256 1.9 GB/s), and a baseline
# must not be a weak one.  The fastest is picked once, in a calibration pass
# that is not counted; every run then measures that one setting, so the
# baseline is not the maximum of several noisy samples against one of ours.
FIO_CONFIGS = (("1M", 32), ("4M", 128), ("128k", 256))

FIO_SETTINGS = ("sequential, O_DIRECT, io_uring, the fastest of bs/iodepth "
                + ", ".join(f"{b}/{q}" for b, q in FIO_CONFIGS)
                + " in an uncounted calibration pass, write with end_fsync=1")


def fio_command(paths: Sequence[str], rw: str, offset: int, size: int, bs: str = "1M",
                iodepth: int = 32) -> list[str]:
    """fio over [offset, offset+size) of every path, one job per path, run together."""
    cmd = [
        "fio", "--output-format=json", f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}",
        "--direct=1", "--ioengine=io_uring", f"--offset={offset}", f"--size={size}",
        "--invalidate=1", "--thread",
    ]
    if rw == "write":
        cmd.append("--end_fsync=1")
    for i, p in enumerate(paths):
        cmd += [f"--name=m{i}", "--filename=" + p.replace(":", "\\:")]
    return cmd


def parse_fio_json(text: str, rw: str) -> dict:
    """Aggregate bandwidth of fio's JSON output: all jobs' bytes over the longest job's runtime."""
    # fio may print warnings before the JSON document.
    start = text.find("{")
    if start < 0:
        raise ValueError("fio printed no JSON")
    doc = json.loads(text[start:])
    jobs = doc.get("jobs") or []
    if not jobs:
        raise ValueError("fio reported no jobs")
    total, runtime_ms = 0, 0
    for job in jobs:
        if job.get("error"):
            raise ValueError(f"fio job {job.get('jobname')} failed: error {job['error']}")
        part = job[rw]
        total += int(part["io_bytes"])
        runtime_ms = max(runtime_ms, int(part["runtime"]))
    if total <= 0 or runtime_ms <= 0:
        raise ValueError("fio moved no data")
    return {
        "bytes": total,
        "seconds": runtime_ms / 1000.0,
        "gbps": total / (runtime_ms / 1000.0) / GB,
        "version": doc.get("fio version", ""),
    }


def run_fio(paths: Sequence[str], rw: str, offset: int, size: int,
            config: tuple[str, int] = FIO_CONFIGS[0]) -> dict:
    """One fio run with ``config`` = (block size, queue depth).

    ``cpu_seconds``: user+sys CPU time of the fio process (getrusage of the waited-for child).
    """
    bs, iodepth = config
    if rw == "read":
        drop_page_cache()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(fio_command(paths, rw, offset, size, bs, iodepth), capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise BenchError(f"fio {rw} failed (exit {out.returncode}): {out.stderr.strip() or out.stdout[-400:]}")
    try:
        res = parse_fio_json(out.stdout, rw)
    except (ValueError, KeyError) as e:
        raise BenchError(f"cannot read fio's {rw} output: {e}") from None
    res["bs"], res["iodepth"] = bs, iodepth
    res["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def pick_fio_config(paths: Sequence[str], rw: str, offset: int, size: int,
                    configs: Sequence[tuple[str, int]] = FIO_CONFIGS) -> tuple[str, int]:
    """The fastest of ``configs`` on ``paths`` (calibration: not a measurement)."""
    return max(configs, key=lambda c: run_fio(paths, rw, offset, size, c)["gbps"])
