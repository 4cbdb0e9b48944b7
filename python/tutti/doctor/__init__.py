"""tutti-admin doctor: what this machine can run of Tutti, and for each thing it cannot, why and the fix.

Each probe answers one question ("is io_uring usable by this process?", "does the store's file system
take O_DIRECT?") with one :class:`Check`: a status, what was found, and the fix when it is not ``ok``.

- ``ok``: this part is there and works;
- ``degraded``: Tutti runs, but a faster or safer path is missing (psync instead of io_uring, no GPU
  peer-to-peer, an untested vLLM);
- ``unusable``: the store cannot run here as asked (libtutti does not load, a store member is mounted or
  cannot be opened);
- ``n/a``: does not apply to this machine (GPU checks without an NVIDIA GPU, device checks without a path).

The verdict is the worst status: ready (exit 0), degraded (exit 1), unusable (exit 3).

Every probe reads what it looks at from a :class:`Machine`: the roots of sysfs, procfs, /dev and /etc,
the environment, and a few live calls that cannot be files (io_uring_setup, an O_DIRECT open, NVMe
Identify, CUDA, imports).  Tests point the roots at fake trees and replace the live calls.
"""
from __future__ import annotations

import dataclasses
import os
import stat
from typing import Callable, Mapping

OK, DEGRADED, UNUSABLE, NA = "ok", "degraded", "unusable", "n/a"
STATUSES = (OK, DEGRADED, UNUSABLE, NA)
_RANK = {NA: 0, OK: 0, DEGRADED: 1, UNUSABLE: 2}
VERDICTS = {0: "ready", 1: "degraded", 2: "unusable"}


@dataclasses.dataclass
class Check:
    """One line of the report: ``fix`` is set whenever ``status`` is degraded or unusable."""

    area: str       # host, storage, gpu, vllm
    name: str       # short label, e.g. "io_uring"
    status: str     # one of STATUSES
    detail: str     # what was found, in words
    fix: str = ""   # what to do about it (empty when ok / n/a)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"bad status {self.status!r}")
        if self.status in (DEGRADED, UNUSABLE) and not self.fix:
            raise ValueError(f"{self.name}: a {self.status} check needs a fix")


@dataclasses.dataclass
class Machine:
    """Where the probes look.  The defaults are this machine; tests give fake roots and live calls."""

    sysfs: str = "/sys"
    procfs: str = "/proc"
    dev: str = "/dev"
    etc: str = "/etc"
    environ: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))
    # live calls (see live.py for what each returns)
    uring_setup: Callable[[], int] = None  # type: ignore[assignment]  # 0 or the errno of io_uring_setup(2)
    odirect: Callable[[str], tuple | None] = None  # type: ignore[assignment]  # None if O_DIRECT works on the path, else (kind, why)
    id_ctrl: Callable[[str, str], dict | None] = None  # type: ignore[assignment]  # (driver, controller node) -> identify facts
    cuda: Callable[[], dict] = None  # type: ignore[assignment]  # {"ok", "devices", "detail"}
    green: Callable[[], dict] = None  # type: ignore[assignment]  # {"ok", "detail"}
    cufile_lib: Callable[[], dict] = None  # type: ignore[assignment]  # {"ok", "detail"}
    libtutti: Callable[[], str | None] = None  # type: ignore[assignment]  # None if the binding loads, else why
    store_kind: Callable[[str], dict | None] = None  # type: ignore[assignment]  # Store.probe of a member, None if unreadable
    version_of: Callable[[str], str | None] = None  # type: ignore[assignment]  # installed version of a distribution
    uname: Callable[[], str] = None  # type: ignore[assignment]  # kernel release

    def __post_init__(self):
        from . import live

        for name in ("uring_setup", "odirect", "id_ctrl", "cuda", "green", "cufile_lib", "libtutti",
                     "store_kind", "version_of", "uname"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(live, name))

    def sys(self, *parts: str) -> str:
        return os.path.join(self.sysfs, *parts)

    def proc(self, *parts: str) -> str:
        return os.path.join(self.procfs, *parts)

    def read(self, path: str) -> str | None:
        """A small text file's contents, stripped; None when it cannot be read (or is no regular file:
        opening a FIFO, e.g. CUFILE_ENV_PATH_JSON naming one, would block)."""
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                return None
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read().strip()
        except OSError:
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []


def verdict(checks: list[Check]) -> str:
    """ready / degraded / unusable: the worst status of the checks."""
    return VERDICTS[max((_RANK[c.status] for c in checks), default=0)]


def run(machine: Machine | None = None, paths: tuple[str, ...] = ()) -> list[Check]:
    """Every check, in report order: the host, the store's paths and devices, the GPU, vLLM."""
    from . import gpu, host, storage

    m = machine or Machine()
    checks = host.checks(m)
    checks += storage.checks(m, paths)
    checks += gpu.checks(m)
    return checks


def report(checks: list[Check]) -> dict:
    """The JSON document of ``tutti-admin doctor --json``."""
    return {"verdict": verdict(checks), "checks": [dataclasses.asdict(c) for c in checks]}
