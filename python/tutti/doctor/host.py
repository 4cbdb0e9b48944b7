"""Host checks: libtutti's binding, io_uring, the memlock limit, tutti.ko, and the caller's rights."""
from __future__ import annotations

import errno
import os
import re

from . import DEGRADED, NA, OK, UNUSABLE, Check, Machine

CAP_IPC_LOCK, CAP_SYS_RAWIO, CAP_SYS_ADMIN = 14, 17, 21
MEMLOCK_WANTED = 1 << 30  # below this, tutti.ko cannot pin a serving KV cache's pages for its queues
_KQ_FIX_DOC = "docs/kmod.md"


def _kernel(release: str) -> tuple[int, int]:
    m = re.match(r"^(\d+)\.(\d+)", release or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def status_fields(m: Machine) -> dict[str, str]:
    """/proc/self/status as a dict (Uid, Groups, CapEff, ...)."""
    text = m.read(m.proc("self", "status")) or ""
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        out[k.strip()] = v.strip()
    return out


def capabilities(m: Machine) -> int:
    try:
        return int(status_fields(m).get("CapEff", "0"), 16)
    except ValueError:
        return 0


def has_cap(m: Machine, cap: int) -> bool:
    return bool(capabilities(m) >> cap & 1)


def memlock_limit(m: Machine) -> int | None:
    """The soft RLIMIT_MEMLOCK of this process in bytes (-1: unlimited), None when unknown."""
    for line in (m.read(m.proc("self", "limits")) or "").splitlines():
        if line.startswith("Max locked memory"):
            soft = line[len("Max locked memory"):].split()[0]
            return -1 if soft == "unlimited" else int(soft) if soft.isdigit() else None
    return None


def module_loaded(m: Machine, name: str) -> bool:
    return os.path.isdir(m.sys("module", name))


def nvme_controllers(m: Machine) -> list[str]:
    from ..devices import Sysfs
    from ..devices import nvme_controllers as found

    return found(Sysfs(m.sysfs, m.dev))


def kq_relevant(m: Machine) -> bool:
    """Would tutti.ko's queues matter here: the module is loaded or an NVMe controller exists."""
    return module_loaded(m, "tutti") or bool(nvme_controllers(m))


def check_libtutti(m: Machine) -> Check:
    why = m.libtutti()
    if why is None:
        return Check("host", "libtutti", OK, "the binding (tutti._tutti) loads")
    return Check("host", "libtutti", UNUSABLE, f"the binding does not load: {why}",
                 "reinstall tutti from the checkout (pip install . builds libtutti and its binding; "
                 "the build needs liburing-dev and a C compiler: scripts/bootstrap.sh)")


def check_io_uring(m: Machine) -> Check:
    disabled = m.read(m.proc("sys", "kernel", "io_uring_disabled"))
    rc = m.uring_setup()
    name = "io_uring"
    fallback = "libtutti's psync engine serves files and block devices instead (one thread, one syscall per I/O)"
    if rc == 0:
        extra = f", kernel.io_uring_disabled={disabled}" if disabled is not None else ""
        return Check("host", name, OK, f"io_uring_setup works for this process{extra}")
    if rc == errno.ENOSYS:
        return Check("host", name, DEGRADED, f"the kernel has no io_uring (ENOSYS): {fallback}",
                     "run a kernel built with CONFIG_IO_URING=y (Linux 5.6 or later)")
    if rc == errno.EPERM:
        if disabled == "2":
            return Check("host", name, DEGRADED, f"disabled for every process (kernel.io_uring_disabled=2): "
                         f"{fallback}", "sysctl -w kernel.io_uring_disabled=0 (or 1, with the serving user in "
                         "kernel.io_uring_group); persist it in /etc/sysctl.d/")
        if disabled == "1":
            gid = m.read(m.proc("sys", "kernel", "io_uring_group")) or "-1"
            return Check("host", name, DEGRADED, f"only for processes in kernel.io_uring_group (gid {gid}) or "
                         f"with CAP_SYS_ADMIN (kernel.io_uring_disabled=1): {fallback}",
                         f"add the serving user to group {gid} (sysctl kernel.io_uring_group), or "
                         "sysctl -w kernel.io_uring_disabled=0")
        return Check("host", name, DEGRADED, f"io_uring_setup refused (EPERM) although the kernel allows it: "
                     f"a seccomp filter (container runtime) blocks it: {fallback}",
                     "allow io_uring_setup, io_uring_enter and io_uring_register in the container's seccomp "
                     "profile (Docker's default profile blocks them)")
    if rc == errno.ENOMEM:
        return Check("host", name, DEGRADED, "io_uring_setup failed with ENOMEM: before Linux 5.12 rings are "
                     f"charged to RLIMIT_MEMLOCK, which is too low: {fallback}",
                     "raise the memlock limit (LimitMEMLOCK=infinity in the service unit, or ulimit -l unlimited)")
    return Check("host", name, DEGRADED, f"io_uring_setup failed: {os.strerror(rc)}: {fallback}",
                 "check dmesg and the kernel's io_uring settings (sysctl kernel.io_uring_disabled)")


def check_memlock(m: Machine) -> Check:
    limit = memlock_limit(m)
    name = "memlock"
    if limit is None:
        return Check("host", name, NA, "RLIMIT_MEMLOCK unknown (no /proc/self/limits)")
    if limit < 0:
        return Check("host", name, OK, "RLIMIT_MEMLOCK unlimited")
    shown = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
    if has_cap(m, CAP_IPC_LOCK):
        return Check("host", name, OK, f"RLIMIT_MEMLOCK {shown}, but CAP_IPC_LOCK lifts it")
    fix = ("LimitMEMLOCK=infinity in the serving unit, or 'memlock unlimited' for its user in "
           "/etc/security/limits.conf, or grant CAP_IPC_LOCK")
    if _kernel(m.uname()) < (5, 12) and limit < 1 << 20:
        return Check("host", name, DEGRADED, f"RLIMIT_MEMLOCK {shown}: io_uring rings count against it before "
                     "Linux 5.12", fix)
    if limit < MEMLOCK_WANTED and kq_relevant(m):
        return Check("host", name, DEGRADED, f"RLIMIT_MEMLOCK {shown}: tutti.ko counts the host memory it pins "
                     "for its queues (the KV cache's pages, the bounce buffers) against it, so it can pin at "
                     "most that much", fix)
    return Check("host", name, OK, f"RLIMIT_MEMLOCK {shown} (io_uring does not use it on this kernel; tutti.ko "
                 "would: no NVMe controller or tutti.ko here)")


def check_tutti_ko(m: Machine) -> Check:
    name = "tutti.ko"
    if module_loaded(m, "tutti"):
        version = m.read(m.sys("module", "tutti", "version"))
        src = m.read(m.sys("module", "tutti", "srcversion"))
        bound = [b for b in m.listdir(m.sys("bus", "pci", "drivers", "tutti")) if re.match(r"^[0-9a-f]{4}:", b)]
        ver = f"version {version}" if version else (f"srcversion {src}" if src else "no version")
        p2p = "with nvidia-p2p" if _module_symbol(m, "tutti_p2p_", "tutti") else "without nvidia-p2p"
        ctl = f"{len(bound)} controller(s): {', '.join(bound)}" if bound else "no controller attached"
        return Check("host", name, OK, f"loaded, {ver}, {p2p}, {ctl}")
    ctls = nvme_controllers(m)
    if not ctls:
        return Check("host", name, NA, "not loaded; no NVMe controller here for it to drive")
    return Check("host", name, DEGRADED, f"not loaded: the kqueue engine (the module's own NVMe queues, and the "
                 f"GPU's doorbell path) is unavailable for {len(ctls)} NVMe controller(s); stores on their block "
                 "devices use io_uring through the nvme driver",
                 f"build and load it: make -C kmod && insmod kmod/tutti.ko (or dkms install: kmod/dkms.conf); "
                 f"then tutti-admin attach PCI_ADDR ({_KQ_FIX_DOC})")


def _module_symbol(m: Machine, prefix: str, module: str) -> bool:
    """Does /proc/kallsyms hold a symbol starting with ``prefix`` of ``module`` (or of the kernel: '')?"""
    tag = f"[{module}]" if module else None
    try:
        with open(m.proc("kallsyms"), encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2].startswith(prefix):
                    if tag is None or (len(parts) > 3 and parts[3] == tag):
                        return True
    except OSError:
        return False
    return False


def kallsyms_has(m: Machine, symbol: str) -> bool:
    try:
        with open(m.proc("kallsyms"), encoding="ascii", errors="replace") as f:
            return any(len(p := line.split()) >= 3 and p[2] == symbol for line in f)
    except OSError:
        return False


def _group_gid(m: Machine, group: str) -> int | None:
    for line in (m.read(os.path.join(m.etc, "group")) or "").splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[0] == group and parts[2].isdigit():
            return int(parts[2])
    return None


def check_rights(m: Machine) -> Check:
    name = "rights"
    st = status_fields(m)
    ids = st.get("Uid", "").split()  # real, effective, saved, file system
    uid = ids[1] if len(ids) > 1 else (ids[0] if ids else "?")
    groups = {int(g) for g in st.get("Groups", "").split() if g.isdigit()}
    gid = _group_gid(m, "tutti")
    rawio = has_cap(m, CAP_SYS_RAWIO)
    have = f"uid {uid}, CAP_SYS_RAWIO {'yes' if rawio else 'no'}, group tutti " + (
        "missing" if gid is None else ("yes" if gid in groups else "no"))
    if not kq_relevant(m):
        return Check("host", name, NA, f"{have}: only tutti.ko's nodes need more than file access, and there is "
                     "neither tutti.ko nor an NVMe controller here")
    if uid == "0" and rawio:
        return Check("host", name, OK, f"{have}: root opens tutti.ko's nodes and makes queues")
    missing = []
    if not rawio:
        missing.append("CAP_SYS_RAWIO (queues, pinning, admin passthrough)")
    if gid is None or gid not in groups:
        missing.append("group tutti (opening /dev/tutti*, root:tutti 0660 from udev/99-tutti.rules)")
    if not missing:
        return Check("host", name, OK, f"{have}: enough for tutti.ko's nodes")
    fix = []
    if gid is None:
        fix.append("groupadd --system tutti and install udev/99-tutti.rules")
    if gid is None or gid not in groups:
        fix.append("add the serving user to group tutti")
    if not rawio:
        fix.append("AmbientCapabilities=CAP_SYS_RAWIO in its service unit")
    return Check("host", name, DEGRADED, f"{have}: missing " + "; ".join(missing) +
                 ": this process cannot use tutti.ko's queues (the kqueue engine)", "; ".join(fix))


def checks(m: Machine) -> list[Check]:
    return [check_libtutti(m), check_io_uring(m), check_memlock(m), check_tutti_ko(m), check_rights(m)]
