"""Storage checks: the store's paths (O_DIRECT, file system, the device under them) and the NVMe controllers.

A path is a store member (file, block device, tutti.ko namespace node) or the directory a store will be
made in.  Without paths, the machine's NVMe controllers are still listed: driver (nvme or tutti.ko),
namespaces, MDTS, SGL support, and what uses them.
"""
from __future__ import annotations

import os
import stat

from . import DEGRADED, NA, OK, UNUSABLE, Check, Machine

_ODIRECT_FIX = ("put the store on a file system that takes O_DIRECT (ext4, xfs, btrfs; tmpfs from Linux 6.6) "
                "or on the NVMe namespace itself")


def _sysfs(m: Machine):
    from ..devices import Sysfs

    return Sysfs(m.sysfs, m.dev)


def mounts(m: Machine) -> list[tuple[str, str, str]]:
    """(device, mount point, file system type) of every mount, read by psutil from the machine's procfs."""
    import psutil

    old = psutil.PROCFS_PATH
    psutil.PROCFS_PATH = m.procfs
    try:
        return [(p.device, p.mountpoint, p.fstype) for p in psutil.disk_partitions(all=True)]
    except OSError:
        return []
    finally:
        psutil.PROCFS_PATH = old


def swaps(m: Machine) -> list[str]:
    lines = (m.read(m.proc("swaps")) or "").splitlines()[1:]
    return [line.split()[0] for line in lines if line.split()]


def mount_of(path: str, table) -> tuple[str, str, str] | None:
    """The mount holding ``path`` (the longest mount point that is a prefix of its real path)."""
    real = os.path.realpath(path)
    best = None
    for dev, mnt, fstype in table:
        if real == mnt or real.startswith(mnt.rstrip("/") + "/"):
            if best is None or len(mnt) >= len(best[1]):
                best = (dev, mnt, fstype)
    return best


def _size(n: int | None) -> str:
    from ..cli.common import format_size

    return "?" if n is None else format_size(n)


def controller_facts(m: Machine, bdf: str, table) -> tuple[str, str, str, dict]:
    """(status, detail, fix, description) of one NVMe controller."""
    from ..devices import describe_controller, namespace_users

    sysfs = _sysfs(m)
    ctl = describe_controller(bdf, sysfs, probe=False)
    drv = ctl["driver"]
    parts = [f"{bdf} {ctl['model'] or ''}".strip()]
    owner = {"nvme": "driver nvme (block devices, io_uring engine)",
             "tutti": "driver tutti.ko (its nodes, kqueue engine)"}.get(drv, f"driver {drv}")
    parts.append(owner)
    ident = m.id_ctrl(drv, ctl["device"]) if ctl["device"] else None
    ns = [f"{n['name']} {_size(n['size_bytes'])}" for n in ctl["namespaces"]]
    nn = f" of {ident['nn']}" if ident and ident.get("nn") else ""
    parts.append(f"namespaces{nn}: {', '.join(ns) if ns else 'none'}")
    if ident:
        mdts = ident["mdts_bytes"]
        parts.append(f"MDTS {_size(mdts)}" if mdts else "no MDTS limit")
        sgl = ident["sgls"] & 3
        parts.append({0: "SGL no (PRP lists)", 1: "SGL yes", 2: "SGL yes (dword-aligned)"}.get(sgl, "SGL ?"))
    elif drv == "nvme" and ctl["namespaces"]:
        kb = m.read(sysfs.block(ctl["namespaces"][0]["name"], "queue", "max_hw_sectors_kb"))
        parts.append(f"max I/O {kb} KiB (from MDTS; SGL unknown: Identify needs root)" if kb else
                     "MDTS and SGL unknown (Identify needs root)")
    else:
        parts.append("MDTS and SGL unknown")
    users = namespace_users(ctl, sysfs, mounts=[(d, p) for d, p, _ in table], swaps=swaps(m), exclusive=False)
    if users:
        parts.append("in use: " + "; ".join(users))
    detail = ", ".join(parts)
    if drv == "none":
        return DEGRADED, detail + ": no driver serves it", (
            f"tutti-admin attach {bdf} (to tutti.ko) or tutti-admin detach {bdf} (to nvme)"), ctl
    if drv not in ("nvme", "tutti"):
        return NA, detail + ": another driver's, not Tutti's", "", ctl
    return OK, detail, "", ctl


def check_controllers(m: Machine, table) -> list[Check]:
    from ..devices import Sysfs, nvme_controllers

    bdfs = nvme_controllers(Sysfs(m.sysfs, m.dev))
    if not bdfs:
        return [Check("storage", "nvme", NA, "no NVMe controller on the PCI bus: stores live on files or other "
                      "block devices (io_uring / psync engines)")]
    out = []
    for bdf in bdfs:
        status, detail, fix, _ = controller_facts(m, bdf, table)
        out.append(Check("storage", f"nvme {bdf}", status, detail, fix))
    return out


def _device_under(m: Machine, path: str) -> tuple[str | None, str | None, bool]:
    """(block or node name, PCI address of its NVMe controller or None, is a raw device) of ``path``."""
    from ..devices import DeviceError, bdf_of_sysfs_path

    sysfs = _sysfs(m)
    target = path if os.path.lexists(path) else os.path.dirname(os.path.abspath(path))
    st = os.stat(target)
    raw = stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode)
    kind = "char" if stat.S_ISCHR(st.st_mode) else "block"
    num = st.st_rdev if raw else st.st_dev
    node = m.sys("dev", kind, f"{os.major(num)}:{os.minor(num)}")
    if not os.path.exists(node):
        return None, None, raw
    real = os.path.realpath(node)
    name = os.path.basename(real)
    try:
        bdf = bdf_of_sysfs_path(real, sysfs)
    except DeviceError:
        bdf = None
    return name, (bdf if bdf and sysfs.is_nvme(bdf) else None), raw


def check_path(m: Machine, path: str, table) -> list[Check]:
    out = []
    exists = os.path.lexists(path)
    mnt = mount_of(path if exists else os.path.dirname(os.path.abspath(path)), table)
    fs = f"{mnt[2]} ({mnt[0] or 'no device'} on {mnt[1]})" if mnt else "an unknown file system"
    try:
        st = os.stat(path) if exists else None
    except OSError as e:
        return [Check("storage", f"path {path}", UNUSABLE, f"cannot be looked at: {e.strerror}",
                      "run doctor as the user that serves the store, with access to the path")]
    raw = st is not None and (stat.S_ISBLK(st.st_mode) or stat.S_ISCHR(st.st_mode))
    if st is None:
        what = f"does not exist yet: format makes it in a directory on {fs}"
    elif stat.S_ISDIR(st.st_mode):
        what = f"directory on {fs}"
    elif raw:
        what = "block device" if stat.S_ISBLK(st.st_mode) else "tutti.ko namespace node"
    else:
        what = f"regular file on {fs}"
    name, bdf, _ = _device_under(m, path)
    if raw:
        in_use = [mp for d, mp, _ in table if d and _same(d, path, name)]
        if in_use:
            return [Check("storage", f"path {path}", UNUSABLE, f"{what}, mounted on {', '.join(in_use)}: a store on "
                          "the device would overwrite that file system, and libtutti refuses it",
                          "umount it (and remove it from /etc/fstab), or give a file on that file system instead")]
    out.append(Check("storage", f"path {path}", OK, what))
    od = m.odirect(path)
    if od is None:
        out.append(Check("storage", f"O_DIRECT {path}", OK, f"works on {fs if not raw else 'the ' + what}"))
    elif od[0] == "unsupported":
        out.append(Check("storage", f"O_DIRECT {path}", DEGRADED, f"{od[1]}: libtutti falls back to buffered I/O "
                         "with fdatasync (the page cache keeps a second copy of every block it moves)", _ODIRECT_FIX))
    else:
        out.append(Check("storage", f"O_DIRECT {path}", UNUSABLE, f"{od[1]}",
                         "give the serving user read and write access (root, or group disk for block devices), "
                         "or check dmesg for I/O errors"))
    if st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        out += _store_check(m, path)
    out.append(_device_check(m, path, name, bdf, table))
    return out


def _store_check(m: Machine, path: str) -> list[Check]:
    """What an existing member holds: a server opens it as a store (only a member that does not exist
    is created), so anything but a store this tutti reads cannot serve."""
    label = f"store {path}"
    p = m.store_kind(path)
    if p is None:
        return []   # unreadable: the O_DIRECT line says why (or the libtutti line, without the binding)
    kind = p.get("kind")
    if kind == "store":
        return [Check("storage", label, OK, f"a Tutti store's member {p.get('member_index', 0) + 1} of "
                      f"{p.get('n_members', 1)} (format version {p.get('version')})")]
    if kind == "other_version":
        return [Check("storage", label, UNUSABLE, f"a Tutti store of format version {p.get('version')}, which "
                      "this tutti does not open", "run the tutti that made it (docs/format.md says how a store "
                      "is upgraded), or reformat: tutti-admin format --force (its KV is lost)")]
    if kind == "damaged":
        return [Check("storage", label, UNUSABLE, "Tutti superblock magic but no valid superblock copy",
                      "tutti-admin check shows what is left; tutti-admin format --force makes a new store")]
    return [Check("storage", label, UNUSABLE, "holds no Tutti store: a server given it cannot open it (only a "
                  "member that does not exist yet is created)", "tutti-admin format PATH... (overwrites it), "
                  "or name a path that does not exist yet")]


def _same(mount_dev: str, path: str, name: str | None) -> bool:
    try:
        a, b = os.stat(mount_dev), os.stat(path)
        return stat.S_ISBLK(a.st_mode) and a.st_rdev == b.st_rdev
    except OSError:
        return bool(name) and os.path.basename(mount_dev) == name


def _device_check(m: Machine, path: str, name: str | None, bdf: str | None, table) -> Check:
    label = f"device {path}"
    if name is None:
        return Check("storage", label, OK, "no block device under it (tmpfs or another RAM or network file "
                     "system): the file engines serve it; tutti.ko and GPU-initiated I/O need an NVMe namespace")
    if bdf is None:
        return Check("storage", label, OK, f"on {name}, not NVMe: the file engines (io_uring, psync) serve it; "
                     "tutti.ko's queues and GPU-initiated I/O need an NVMe namespace")
    status, detail, fix, _ = controller_facts(m, bdf, table)
    return Check("storage", label, status, f"on {name}: {detail}", fix)


def checks(m: Machine, paths: tuple[str, ...]) -> list[Check]:
    table = mounts(m)
    out = check_controllers(m, table)
    if not paths:
        out.append(Check("storage", "store paths", NA, "none given: tutti-admin doctor PATH... checks O_DIRECT and "
                         "the device under a store's members (or the directory it will be made in)"))
    for p in paths:
        out += check_path(m, p, table)
    return out
