"""Helpers the benchmark's modules share: units, errors, statistics, CPU time, members on disk."""
from __future__ import annotations

import contextlib
import os
import resource
import shutil
import stat
import statistics
import tempfile
from typing import Iterable, Iterator

from ..errors import BenchError as BenchError  # its old home: bench modules import it from here

GB = 1e9


def human_bytes(n: float) -> str:
    """1073741824 -> '1.00 GiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None; None if there are none."""
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is not positive."""
    if a is None or b is None or b <= 0:
        return None
    return a / b


def cpu_seconds() -> float:
    """User plus system CPU time of this process."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def drop_page_cache() -> bool:
    """Write back and drop clean pages (needs root); False if not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def member_bytes(path: str) -> int | None:
    """Size of an existing file or block device, None if it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a probe: never wait on open
    except FileNotFoundError:
        return None
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def has_store_magic(path: str) -> bool:
    """Does either superblock copy of ``path`` hold a Tutti superblock, of any version, even damaged?

    libtutti's own check (Store.probe, the one format applies); False when ``path`` cannot be read.
    """
    from ..errors import TuttiError
    from ..store import Store

    try:
        return Store.probe(path)["kind"] != "none"
    except TuttiError:
        return False


def is_block_device(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def room_for(path: str) -> int | None:
    """Bytes a regular-file member at ``path`` can grow to: the file system's free space plus what the
    file already takes.  None for a device (libtutti checks its size) or when it cannot be told."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError:
        return None
    if st is not None and not stat.S_ISREG(st.st_mode):
        return None
    where = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(where) and where != os.path.dirname(where):
        where = os.path.dirname(where)  # bench makes the directories it needs
    try:
        fs = os.statvfs(where)
    except OSError:
        return None
    return fs.f_bavail * fs.f_frsize + (st.st_blocks * 512 if st is not None else 0)


def host_memory_available() -> int:
    """Bytes of memory the system could give this process now (MemAvailable)."""
    import psutil

    return psutil.virtual_memory().available


@contextlib.contextmanager
def scratch_dir(workdir: str | None, prefix: str) -> Iterator[str]:
    """A benchmark's working directory: ``workdir`` (made if missing, kept after) or a new temporary one
    under /var/tmp (not tmpfs: stores and models go there), removed after, whatever happened."""
    path = workdir or tempfile.mkdtemp(prefix=prefix, dir="/var/tmp")
    os.makedirs(path, exist_ok=True)
    try:
        yield path
    finally:
        if workdir is None:
            shutil.rmtree(path, ignore_errors=True)
