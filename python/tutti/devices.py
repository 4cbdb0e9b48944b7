"""NVMe controllers on this machine and handing them to tutti.ko and back.

What ``tutti-admin list | attach | detach | health`` stand on:

- naming: a controller is named by its PCI address (``0000:00:04.0``) or by any
  of its device nodes (``/dev/nvme0``, ``/dev/nvme0n1``, ``/dev/nvme0n1p2``,
  ``/dev/tutti0``, ``/dev/tutti0n1``, udev links to them); see
  :func:`resolve_controller`;
- discovery: PCI functions of class 010802 (NVM Express) through pyudev, then
  each controller's driver, identity, namespaces and their block devices or
  tutti.ko nodes from sysfs (:func:`list_controllers`);
- use checks: a namespace (or a partition on it) that is mounted, swapped on,
  held by another block device (dm, md, ...) or opened exclusively
  (:func:`namespace_users`);
- attach/detach: libtutti's ``tt_kmod_attach()`` / ``tt_kmod_detach()``
  (libtutti/src/kmod/attach.c: sysfs unbind, driver_override, bind, with its
  own refusal of mounted / swapped / held devices), called through cffi.

Every failure is a :class:`DeviceError` whose ``usage`` flag says whether the
input itself was wrong (exit 2) or the device cannot be used (exit 3).
"""
from __future__ import annotations

import errno
import os
import re
import stat
import time
from typing import Any

from .errors import DeviceError

PCI_CLASS_NVME = 0x010802

_BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-9a-fA-F]+)$")
_BDF_COMPONENT = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_NVME_NS = re.compile(r"^nvme(\d+)n(\d+)$")
_NVME_PATH = re.compile(r"^nvme(\d+)c(\d+)n(\d+)$")  # hidden per-path device of a multipath namespace
_NVME_CTRL = re.compile(r"^nvme(\d+)$")
_TUTTI_CTRL = re.compile(r"^tutti(\d+)$")
_TUTTI_NS = re.compile(r"^tutti(\d+)n(\d+)$")
_DEV_NAME = re.compile(r"^(nvme\d+(c\d+)?(n\d+(p\d+)?)?|ng\d+n\d+|tutti\d+(n\d+)?)$")

DEVICE_HELP = ("give a PCI address (0000:00:04.0) or a device: /dev/nvmeX, /dev/nvmeXnY, "
               "/dev/tuttiN, /dev/tuttiNnM")


# --------------------------------------------------------------- names


def parse_pci_address(text: str) -> str:
    """``'00:04.0'`` or ``'0000:00:04.0'`` -> ``'0000:00:04.0'`` (domain 0000 by default, lower case).

    Raises DeviceError(usage=True) with the reason for anything else.
    """
    if not isinstance(text, str):
        raise DeviceError(f"{text!r} is not a PCI address", usage=True)
    m = _BDF_RE.match(text.strip())
    if not m:
        raise DeviceError(f"{text!r} is not a PCI address: use DOMAIN:BUS:DEVICE.FUNCTION in hex, e.g. 0000:00:04.0",
                          usage=True)
    domain, bus, dev, fn = m.groups()
    domain = int(domain, 16) if domain else 0
    bus, dev, fn = int(bus, 16), int(dev, 16), int(fn, 16)
    if dev > 0x1F:
        raise DeviceError(f"{text!r}: device number {dev:#04x} is out of range (00..1f)", usage=True)
    if fn > 7:
        raise DeviceError(f"{text!r}: function number {fn} is out of range (0..7)", usage=True)
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../")) or bool(_DEV_NAME.match(text))


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _link_name(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _natural(name: str):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


class Sysfs:
    """Where sysfs and /dev are (tests point these at a fake tree)."""

    def __init__(self, root: str = "/sys", dev: str = "/dev"):
        self.root = root
        self.dev = dev

    def pci(self, bdf: str, *parts: str) -> str:
        return os.path.join(self.root, "bus", "pci", "devices", bdf, *parts)

    def block(self, name: str, *parts: str) -> str:
        return os.path.join(self.root, "class", "block", name, *parts)

    def is_nvme(self, bdf: str) -> bool:
        cls = _read(self.pci(bdf, "class"))
        try:
            return cls is not None and int(cls, 16) == PCI_CLASS_NVME
        except ValueError:
            return False

    def driver(self, bdf: str) -> str:
        return _link_name(self.pci(bdf, "driver")) or "none"


SYS = Sysfs()


def bdf_of_sysfs_path(real: str, sysfs: Sysfs | None = None) -> str | None:
    """The PCI function a resolved sysfs device path lies below (the deepest PCI address in it).

    A multipath namespace head (``.../virtual/nvme-subsystem/nvme-subsys0/nvme0n1``)
    has none in its path; its controllers are found through its ``multipath/``
    directory.  Returns None when the path is not below any PCI device.
    Raises DeviceError when a shared namespace is reachable through several controllers.
    """
    sysfs = sysfs or SYS
    parts = real.split("/")
    bdfs = [p for p in parts if _BDF_COMPONENT.match(p)]
    if bdfs:
        return bdfs[-1]
    # multipath head: the first nvmeXnY component is the head (a partition is below it)
    for i, p in enumerate(parts):
        if _NVME_NS.match(p):
            mp = os.path.join("/".join(parts[: i + 1]), "multipath")
            found = sorted({b for e in _listdir(mp)
                            for b in [bdf_of_sysfs_path(os.path.realpath(os.path.join(mp, e)), sysfs)] if b})
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise DeviceError(f"{p} is a shared namespace reachable through {', '.join(found)}: "
                                  "give the PCI address of one controller", usage=True)
            return None
    return None


def resolve_controller(arg: str, sysfs: Sysfs | None = None) -> str:
    """The PCI address of the NVMe controller named by ``arg`` (a PCI address or a device node).

    Raises DeviceError: usage=True for text that is neither, or a file that is not an
    NVMe device; usage=False when the named device does not exist.
    """
    sysfs = sysfs or SYS
    text = (arg or "").strip()
    if not text:
        raise DeviceError(f"no device given: {DEVICE_HELP}", usage=True)
    if not _looks_like_path(text):
        try:
            bdf = parse_pci_address(text)
        except DeviceError:
            if re.match(r"^[0-9a-fA-F]*:[0-9a-fA-F:]*\.[0-9a-fA-F]+$", text):
                raise  # meant as a PCI address: say what is wrong with it
            raise DeviceError(f"{text!r} is neither a PCI address nor a device path: {DEVICE_HELP}",
                              usage=True) from None
        if not os.path.exists(sysfs.pci(bdf)):
            raise DeviceError(f"{bdf}: no such PCI device")
        if not sysfs.is_nvme(bdf):
            cls = _read(sysfs.pci(bdf, "class")) or "unknown"
            raise DeviceError(f"{bdf}: not an NVMe controller (PCI class {cls}, NVMe is 0x010802)", usage=True)
        return bdf
    path = text if "/" in text else os.path.join(sysfs.dev, text)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DeviceError(f"{path}: no such device") from None
    except OSError as e:  # a malformed path is bad input; not permitted and the like: the device cannot be used
        raise DeviceError(f"{path}: {e.strerror}",
                          usage=e.errno in (errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP)) from None
    if stat.S_ISBLK(st.st_mode):
        kind = "block"
    elif stat.S_ISCHR(st.st_mode):
        kind = "char"
    else:
        raise DeviceError(f"{path} is not a device node: {DEVICE_HELP}", usage=True)
    node = os.path.join(sysfs.root, "dev", kind, f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
    if not os.path.exists(node):
        raise DeviceError(f"{path}: no such device (no {node})")
    real = os.path.realpath(node)
    found = bdf_of_sysfs_path(real, sysfs)
    name = os.path.basename(real)
    if found is None or not sysfs.is_nvme(found) or not (_DEV_NAME.match(name) or _BDF_COMPONENT.match(name)):
        raise DeviceError(f"{path} ({name}) is not an NVMe controller or namespace: {DEVICE_HELP}", usage=True)
    return found


def _nsid_of_name(name: str) -> int:
    """The namespace id in a kernel namespace name (nvme0n3: 3), when sysfs does not say it."""
    m = _NVME_NS.match(name)
    if not m:
        raise DeviceError(f"{name}: no namespace id in sysfs, none in its name")
    return int(m.group(2))


def is_tutti_namespace_node(rdev: int, sysfs: Sysfs | None = None) -> bool:
    """Is character device number ``rdev`` a tutti.ko namespace node (``tuttiNnM``)?

    Answered from sysfs (/sys/dev/char/MAJ:MIN), without opening the node: opening
    some character devices has effects of its own, and a store member is either a
    file, a block device or one of these.
    """
    sysfs = sysfs or SYS
    node = os.path.join(sysfs.root, "dev", "char", f"{os.major(rdev)}:{os.minor(rdev)}")
    return os.path.exists(node) and bool(_TUTTI_NS.match(os.path.basename(os.path.realpath(node))))


# ----------------------------------------------------------- discovery


def nvme_controllers(sysfs: Sysfs | None = None) -> list[str]:
    """PCI addresses of every NVMe controller (class 010802), whatever its driver."""
    sysfs = sysfs or SYS
    if sysfs.root == "/sys":
        try:
            import pyudev

            found = []
            for d in pyudev.Context().list_devices(subsystem="pci"):
                cls = d.properties.get("PCI_CLASS")
                try:
                    if cls is not None and int(cls, 16) == PCI_CLASS_NVME:
                        found.append(d.sys_name)
                except ValueError:
                    continue
            return sorted(found)
        except (ImportError, OSError):  # no libudev: plain sysfs below
            pass
    base = os.path.join(sysfs.root, "bus", "pci", "devices")
    return sorted(b for b in _listdir(base) if sysfs.is_nvme(b))


def _multipath_heads(sysfs: Sysfs) -> dict[str, str]:
    """Hidden path device (nvme0c0n1) -> its namespace head block device (nvme0n1)."""
    heads = {}
    base = os.path.join(sysfs.root, "class", "block")
    for name in _listdir(base):
        if _NVME_NS.match(name):
            for path in _listdir(os.path.join(base, name, "multipath")):
                heads[path] = name
    return heads


def store_probe(path: str) -> dict | None:
    """libtutti's probe of ``path``'s superblock copies (Store.probe: kind none / store / other_version /
    damaged, the check format applies); None if it cannot be read (or the extension is missing)."""
    try:
        from .errors import TuttiError
        from .store import Store
    except ImportError:
        return None
    try:
        return Store.probe(path)
    except (TuttiError, OSError, TypeError):  # what doctor's own copy caught: never a traceback there
        return None


def store_magic(path: str) -> bool | None:
    """Does either superblock copy of ``path`` hold a Tutti superblock (any version, even damaged)?
    None if it cannot be read (store_probe)."""
    p = store_probe(path)
    return None if p is None else p["kind"] != "none"


def _kinfo(path: str):
    """tt_kdev_info() of a tutti.ko node as a dict, None when it cannot be opened."""
    try:
        from ._tutti import ffi, lib
    except ImportError:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = ffi.new("struct tt_kinfo *")
        if lib.tt_kdev_info(fd, info) < 0:
            return None
        return {
            "nsid": info.nsid, "lba_bytes": 1 << info.lba_shift if info.nsid else None,
            "size_bytes": (info.nsze << info.lba_shift) if info.nsid else None,
            "model": ffi.string(info.mn).decode(errors="replace").strip(),
            "serial": ffi.string(info.sn).decode(errors="replace").strip(),
            "firmware": ffi.string(info.fr).decode(errors="replace").strip(),
            "mdts_bytes": info.mdts_bytes, "sgls": info.sgls, "nn": info.nn,
        }
    finally:
        os.close(fd)


def _partitions(name: str, sysfs: Sysfs) -> list[str]:
    return sorted((p for p in _listdir(sysfs.block(name))
                   if os.path.exists(sysfs.block(name, p, "partition"))), key=_natural)


def describe_controller(bdf: str, sysfs: Sysfs | None = None, probe: bool = True) -> dict:
    """One controller: driver, identity, namespaces with their device nodes and sizes.

    ``probe`` reads the devices themselves (superblock magic; tutti.ko nodes'
    INFO ioctl), which needs read access (root); what cannot be read is None.
    """
    sysfs = sysfs or SYS
    driver = sysfs.driver(bdf)
    ctl: dict[str, Any] = {
        "pci_address": bdf,
        "vendor_id": _read(sysfs.pci(bdf, "vendor")),
        "device_id": _read(sysfs.pci(bdf, "device")),
        "driver": driver,
        "controller": None,
        "device": None,
        "model": None,
        "serial": None,
        "firmware": None,
        "namespaces": [],
    }
    if driver == "nvme":
        ctrls = sorted((c for c in _listdir(sysfs.pci(bdf, "nvme")) if _NVME_CTRL.match(c)), key=_natural)
        if ctrls:
            c = ctrls[0]
            cdir = sysfs.pci(bdf, "nvme", c)
            ctl.update(controller=c, device=os.path.join(sysfs.dev, c), model=_read(os.path.join(cdir, "model")),
                       serial=_read(os.path.join(cdir, "serial")),
                       firmware=_read(os.path.join(cdir, "firmware_rev")))
            heads = None
            names = []
            for e in _listdir(cdir):
                if _NVME_NS.match(e):
                    names.append(e)
                elif _NVME_PATH.match(e):
                    heads = _multipath_heads(sysfs) if heads is None else heads
                    if e in heads:
                        names.append(heads[e])
            for name in sorted(set(names), key=_natural):
                nsid = _read(sysfs.block(name, "nsid"))
                size = _read(sysfs.block(name, "size"))
                lba = _read(sysfs.block(name, "queue", "logical_block_size"))
                dev = os.path.join(sysfs.dev, name)
                ctl["namespaces"].append({
                    "nsid": int(nsid) if nsid and nsid.isdigit() else _nsid_of_name(name),
                    "name": name,
                    "device": dev,
                    "size_bytes": int(size) * 512 if size and size.isdigit() else None,
                    "lba_bytes": int(lba) if lba and lba.isdigit() else None,
                    "partitions": _partitions(name, sysfs),
                    "tutti_store": store_magic(dev) if probe else None,
                })
    elif driver == "tutti":
        nodes = _listdir(sysfs.pci(bdf, "misc"))
        for n in sorted(nodes, key=_natural):
            if _TUTTI_CTRL.match(n):
                dev = os.path.join(sysfs.dev, n)
                ctl.update(controller=n, device=dev)
                info = _kinfo(dev) if probe else None
                if info:
                    ctl.update(model=info["model"], serial=info["serial"], firmware=info["firmware"])
        for n in sorted(nodes, key=_natural):
            m = _TUTTI_NS.match(n)
            if m:
                dev = os.path.join(sysfs.dev, n)
                info = _kinfo(dev) if probe else None
                ctl["namespaces"].append({
                    "nsid": info["nsid"] if info else int(m.group(2)),
                    "name": n,
                    "device": dev,
                    "size_bytes": info["size_bytes"] if info else None,
                    "lba_bytes": info["lba_bytes"] if info else None,
                    "partitions": [],
                    "tutti_store": store_magic(dev) if probe else None,
                })
    return ctl


def list_controllers(sysfs: Sysfs | None = None, probe: bool = True) -> list[dict]:
    """Every NVMe controller of the machine, described (see describe_controller)."""
    sysfs = sysfs or SYS
    return [describe_controller(b, sysfs, probe) for b in nvme_controllers(sysfs)]


# ------------------------------------------------------------- in use


def _mounts() -> list[tuple[str, str]]:
    import psutil

    return [(p.device, p.mountpoint) for p in psutil.disk_partitions(all=True)]


def _swaps() -> list[str]:
    try:
        with open("/proc/swaps", encoding="utf-8") as f:
            return [line.split()[0] for line in f.read().splitlines()[1:] if line.split()]
    except OSError:
        return []


def _same_device(path: str, name: str, majmin: str | None) -> bool:
    """Is ``path`` (a mount or swap source) the block device ``name`` (dev number ``majmin``)?"""
    if not path.startswith("/"):
        return False
    try:
        st = os.stat(path)
        if stat.S_ISBLK(st.st_mode) and majmin:
            return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" == majmin
    except OSError:
        pass
    return os.path.basename(os.path.realpath(path)) == name


def namespace_users(ctl: dict, sysfs: Sysfs | None = None, mounts=None, swaps=None,
                    exclusive: bool = True) -> list[str]:
    """Why the controller's namespaces cannot be taken away: each user, in words ([] if none).

    Checks each namespace block device and each partition on it: mounted
    (``mounts``: (device, mountpoint) pairs, default psutil.disk_partitions),
    swap (``swaps``, default /proc/swaps), holders (/sys/class/block/*/holders),
    and, with ``exclusive``, an O_EXCL open that fails with EBUSY (claimed by
    another user, e.g. a file system, LVM, md or a running store).
    """
    sysfs = sysfs or SYS
    mounts = _mounts() if mounts is None else mounts
    swaps = _swaps() if swaps is None else swaps
    reasons = []
    for ns in ctl.get("namespaces", []):
        if not _NVME_NS.match(ns["name"]):
            continue  # tutti.ko nodes: no block devices
        for name in [ns["name"], *ns.get("partitions", [])]:
            dev = os.path.join(sysfs.dev, name)
            majmin = _read(sysfs.block(name, "dev"))
            found = []
            for src, mnt in mounts:
                if _same_device(src, name, majmin):
                    found.append(f"{dev} is mounted on {mnt}")
            for src in swaps:
                if _same_device(src, name, majmin):
                    found.append(f"{dev} is in use as swap")
            for h in _listdir(sysfs.block(name, "holders")):
                found.append(f"{dev} is held by {h}")
            if not found and exclusive:
                try:
                    if stat.S_ISBLK(os.stat(dev).st_mode):
                        fd = os.open(dev, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
                        os.close(fd)
                except OSError as e:
                    if e.errno == errno.EBUSY:
                        found.append(f"{dev} is in use (opened exclusively by another program)")
            reasons += found
    return reasons


# ------------------------------------------------------ attach / detach


def _lib():
    from ._tutti import ffi, lib

    return ffi, lib


def _c_error(rc: int, bdf: str) -> DeviceError:
    """libtutti's reason for a failed tt_kmod_attach/detach, naming the controller once."""
    ffi, lib = _lib()
    reason = ffi.string(lib.tt_errmsg()).decode(errors="replace") or os.strerror(-rc)
    lib.tt_clearerr()
    if -rc in (errno.EACCES, errno.EPERM):
        reason += " (needs root)"
    return DeviceError(reason if bdf in reason else f"{bdf}: {reason}", errno_=-rc)


def _wait(cond, timeout: float, step: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(step)


def attach(bdf: str, sysfs: Sysfs | None = None, timeout: float = 10.0) -> tuple[dict, bool]:
    """Hand controller ``bdf`` to tutti.ko.  Returns (its description afterwards, changed).

    Refuses (DeviceError, nothing changed) while a namespace or partition of it
    is in use (namespace_users(), then libtutti's own check), when it is bound to
    a driver other than nvme, or when tutti.ko is not loaded.
    """
    sysfs = sysfs or SYS
    ctl = describe_controller(bdf, sysfs, probe=False)
    if ctl["driver"] == "tutti":
        return describe_controller(bdf, sysfs), False
    if ctl["driver"] not in ("nvme", "none"):
        raise DeviceError(f"{bdf}: bound to {ctl['driver']}, not nvme: unbind it from {ctl['driver']} first")
    users = namespace_users(ctl, sysfs)
    if users:
        raise DeviceError(f"{bdf}: refusing to attach: " + "; ".join(users), errno_=errno.EBUSY)
    _, lib = _lib()
    rc = lib.tt_kmod_attach(bdf.encode())
    if rc < 0:
        raise _c_error(rc, bdf)
    # tutti.ko registers /dev/tuttiN (and one node per namespace) while it probes
    _wait(lambda: any(_TUTTI_CTRL.match(n) and os.path.exists(os.path.join(sysfs.dev, n))
                      for n in _listdir(sysfs.pci(bdf, "misc"))), timeout)
    return describe_controller(bdf, sysfs), True


def detach(bdf: str, sysfs: Sysfs | None = None, timeout: float = 30.0) -> tuple[dict, bool]:
    """Give controller ``bdf`` back to the kernel's nvme driver.  Returns (description, changed).

    Waits for the nvme driver to bring the controller up ('live') and for its
    namespaces' block devices.  DeviceError when it ends up with no driver
    (the nvme driver is not loaded) or the controller does not come up.
    """
    sysfs = sysfs or SYS
    before = sysfs.driver(bdf)
    if before == "nvme":
        return describe_controller(bdf, sysfs), False
    if before not in ("tutti", "none"):
        raise DeviceError(f"{bdf}: bound to {before}, not tutti: nothing to detach")
    _, lib = _lib()
    rc = lib.tt_kmod_detach(bdf.encode())
    if rc < 0:
        raise _c_error(rc, bdf)
    if sysfs.driver(bdf) != "nvme":
        raise DeviceError(f"{bdf}: released by tutti.ko, but the nvme driver did not bind it (now: "
                          f"{sysfs.driver(bdf)}): load it (modprobe nvme) and run detach again")

    def live():
        ctrls = [c for c in _listdir(sysfs.pci(bdf, "nvme")) if _NVME_CTRL.match(c)]
        return bool(ctrls) and _read(sysfs.pci(bdf, "nvme", ctrls[0], "state")) == "live"

    if not _wait(live, timeout):
        raise DeviceError(f"{bdf}: bound to nvme, but the controller did not come up within {timeout:g} s "
                          "(see dmesg)")

    def namespaces_ready():
        d = describe_controller(bdf, sysfs, probe=False)
        return bool(d["namespaces"]) and all(os.path.exists(ns["device"]) for ns in d["namespaces"])

    _wait(namespaces_ready, min(timeout, 5.0))  # a controller may have no namespace: not an error
    return describe_controller(bdf, sysfs), True


def smart_log(bdf: str, sysfs: Sysfs | None = None) -> tuple[dict, bytes]:
    """The SMART / health log page of controller ``bdf``: (its description, the 512-byte page).

    Read through the controller node of the driver it is bound to: /dev/nvmeX
    (NVME_IOCTL_ADMIN_CMD) or /dev/tuttiN (tutti.ko's admin passthrough).
    """
    sysfs = sysfs or SYS
    from . import smart

    ctl = describe_controller(bdf, sysfs, probe=False)
    drv = ctl["driver"]
    if drv not in ("nvme", "tutti"):
        raise DeviceError(f"{bdf}: bound to {'no driver' if drv == 'none' else drv}: the SMART log needs the nvme "
                          "driver or tutti.ko (tutti-admin attach / detach)")
    if not ctl["device"] or not os.path.exists(ctl["device"]):
        raise DeviceError(f"{bdf}: bound to {drv} but its controller node "
                          f"{ctl['device'] or '(none in sysfs)'} does not exist")
    try:
        page = smart.read_smart_nvme(ctl["device"]) if drv == "nvme" else smart.read_smart_tutti(ctl["device"])
    except smart.SmartError as e:
        hint = " (needs root)" if e.errno in (errno.EACCES, errno.EPERM) else ""
        raise DeviceError(f"{e.strerror}{hint}", errno_=e.errno or 0) from None
    return ctl, page


# ------------------------------------------------------------------ hotplug

DEFAULT_ATTACH_CONFIG = "/etc/tutti/attach.conf"


def read_attach_config(path: str) -> tuple[set[str], list[str]]:
    """Controllers to hand to tutti.ko when they appear: ({PCI addresses and serials}, [problems]).

    One entry a line: a PCI address (``0000:00:04.0`` or ``00:04.0``) or a controller
    serial number; ``#`` starts a comment.  A missing file means no entries.
    """
    entries: set[str] = set()
    problems: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return entries, problems
    except OSError as e:
        raise DeviceError(f"{path}: {e.strerror or e}", usage=True) from None
    for n, line in enumerate(text.splitlines(), 1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        if " " in item or "\t" in item:
            problems.append(f"{path}:{n}: one PCI address or serial per line, got {item!r}")
            continue
        try:
            entries.add(parse_pci_address(item))
        except DeviceError:
            entries.add(item)  # a serial number
    return entries, problems


def hotplug_wanted(bdf: str, entries: set[str], sysfs: Sysfs | None = None) -> bool:
    """Is the controller at ``bdf`` listed, by address or by serial?"""
    if bdf in entries:
        return True
    serial = describe_controller(bdf, sysfs, probe=True).get("serial")
    return bool(serial) and serial in entries
