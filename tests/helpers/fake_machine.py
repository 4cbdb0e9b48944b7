"""Fake sysfs / procfs / etc trees for tutti-admin doctor, in three shapes: ready, degraded, unusable.

``build(tmp_path, **knobs)`` lays out a machine and returns ``(roots, live)``: the four roots (for
``doctor.Machine`` or the CLI's hidden --*-root options) and the live calls a test hands to Machine
(or patches into tutti.doctor.live for the CLI).  Knobs turn single facts bad, one at a time.

The machine: a root port 00:01.0 above a switch (upstream port 01:00.0, downstream ports 02:01.0 and
02:02.0), an NVIDIA GPU 03:00.0 below one downstream port and an NVMe controller 04:00.0 (bound to
tutti.ko, namespace tutti0n1) below the other.
"""
import os
import stat
import struct
from pathlib import Path

from helpers.fake_sysfs import _ln, _w

ROOT_PORT, SW_UP, SW_DOWN_GPU, SW_DOWN_SSD = "0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:02:02.0"
GPU, SSD = "0000:03:00.0", "0000:04:00.0"
FAKE_BLOCK = (259, 4000)  # the fake namespace's block device number (nothing has it on a test machine)


def config_space(acs_control=None) -> bytes:
    """A 4 KiB config space: an AER capability at 0x100, then ACS at 0x140 (when ``acs_control`` is given)."""
    c = bytearray(4096)
    struct.pack_into("<HH", c, 0, 0x10DE, 0x1234)
    nxt = 0x140 if acs_control is not None else 0
    struct.pack_into("<I", c, 0x100, 0x0001 | (1 << 16) | (nxt << 20))  # AER, version 1
    if acs_control is not None:
        struct.pack_into("<I", c, 0x140, 0x000D | (1 << 16))
        struct.pack_into("<HH", c, 0x144, 0x005F, acs_control)  # capability, control
    return bytes(c)


def build(tmp_path: Path, *, tutti_loaded=True, ssd=True, ssd_driver="tutti", gpu=True, acs_control=0x0000,
          short_config=False, iommu=None, bar1=64 << 30, p2p=True, nvidia_fs=True, io_uring_disabled="0",
          memlock="unlimited", uid=0, cap_eff=0x000001FFFFFFFFFF, groups="0", tutti_group=True,
          store_on_ssd_mounted=False, block_node=False):
    sys_, proc, dev, etc = (tmp_path / n for n in ("sys", "proc", "dev", "etc"))
    for d in (sys_, proc, dev, etc):
        d.mkdir(parents=True, exist_ok=True)
    drivers = sys_ / "bus" / "pci" / "drivers"
    for d in ("nvme", "tutti", "nvidia"):
        (drivers / d).mkdir(parents=True, exist_ok=True)
    chain = sys_ / "devices" / "pci0000:00"

    def fn(path, bdf, vendor, cls, driver=None, config=None):
        d = path / bdf
        _w(d / "vendor", vendor)
        _w(d / "class", cls)
        _w(d / "device", "0x0001")
        if config is not None:
            (d / "config").write_bytes(config)
        if driver:
            _ln(d / "driver", drivers / driver)
            _ln(drivers / driver / bdf, d)
        _ln(sys_ / "bus" / "pci" / "devices" / bdf, d)
        return d

    cfg = (lambda acs: config_space(acs)[:64]) if short_config else config_space
    rp = fn(chain, ROOT_PORT, "0x8086", "0x060400", config=cfg(None))
    up = fn(rp, SW_UP, "0x10b5", "0x060400", config=cfg(None))
    down_gpu = fn(up, SW_DOWN_GPU, "0x10b5", "0x060400", config=cfg(acs_control))
    down_ssd = fn(up, SW_DOWN_SSD, "0x10b5", "0x060400", config=cfg(acs_control))
    if gpu:
        g = fn(down_gpu, GPU, "0x10de", "0x030200", "nvidia", config=cfg(None))
        _w(g / "resource", "\n".join([
            "0x00000000fa000000 0x00000000faffffff 0x0000000000040200",
            f"0x0000380000000000 0x{0x380000000000 + bar1 - 1:016x} 0x000000000014220c" if bar1 else
            "0x0000000000000000 0x0000000000000000 0x0000000000000000",
            "0x0000000000000000 0x0000000000000000 0x0000000000000000"]))
    s = fn(down_ssd, SSD, "0x1b36", "0x010802", ssd_driver, config=cfg(None)) if ssd else None
    if ssd and ssd_driver == "tutti":
        for n in ("tutti0", "tutti0n1"):
            (s / "misc" / n).mkdir(parents=True)
        (dev / "tutti0").write_bytes(b"")
        (dev / "tutti0n1").write_bytes(b"\0" * 8192)
    elif ssd and ssd_driver == "nvme":
        c0 = s / "nvme" / "nvme0"
        for k, v in (("model", "Fake SSD"), ("serial", "S1"), ("firmware_rev", "1.0"), ("state", "live")):
            _w(c0 / k, v)
        ns = c0 / "nvme0n1"
        _w(ns / "dev", "259:0")
        _w(ns / "size", "2097152")
        _w(ns / "nsid", "1")
        _w(ns / "queue" / "logical_block_size", "512")
        _w(ns / "queue" / "max_hw_sectors_kb", "512")
        (ns / "holders").mkdir(parents=True)
        _ln(sys_ / "class" / "block" / "nvme0n1", ns)
        (dev / "nvme0").write_bytes(b"")
        if block_node:  # a real block device node (root only) with a number no driver has here
            os.mknod(dev / "nvme0n1", 0o600 | stat.S_IFBLK, os.makedev(*FAKE_BLOCK))
            _ln(sys_ / "dev" / "block" / f"{FAKE_BLOCK[0]}:{FAKE_BLOCK[1]}", ns)
        else:
            (dev / "nvme0n1").write_bytes(b"\0" * 8192)
    if iommu:
        (sys_ / "class" / "iommu" / "dmar0").mkdir(parents=True)
        for d in ((g,) if gpu else ()) + ((s,) if ssd else ()):
            grp = sys_ / "kernel" / "iommu_groups" / str(len(list((sys_ / "kernel").glob("iommu_groups/*"))))
            _w(grp / "type", iommu)
            _ln(d / "iommu_group", grp)
    else:
        (sys_ / "class" / "iommu").mkdir(parents=True)
    for mod, on in (("tutti", tutti_loaded), ("nvidia", gpu), ("nvidia_fs", gpu and nvidia_fs)):
        if on:
            (sys_ / "module" / mod).mkdir(parents=True)
    if tutti_loaded:
        _w(sys_ / "module" / "tutti" / "version", "0.1.0")

    _w(proc / "sys" / "kernel" / "io_uring_disabled", io_uring_disabled)
    _w(proc / "sys" / "kernel" / "io_uring_group", "1234")
    _w(proc / "self" / "status", f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGroups:\t{groups}\n"
                                 f"CapEff:\t{cap_eff:016x}\n")
    _w(proc / "self" / "limits", "Limit                     Soft Limit           Hard Limit           Units\n"
                                 f"Max locked memory         {memlock}            {memlock}            bytes")
    mounts = [f"/dev/vda1 {tmp_path} ext4 rw,relatime 0 0"]
    if store_on_ssd_mounted:
        mounts.append(f"{dev / 'nvme0n1'} /data xfs rw 0 0")
    _w(proc / "self" / "mounts", "\n".join(mounts))
    _w(proc / "swaps", "Filename\tType\tSize\tUsed\tPriority")
    _w(proc / "cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/vda1" + (" intel_iommu=on" if iommu else ""))
    syms = ["ffffffffc0000000 t tutti_p2p_map\t[tutti]"] if tutti_loaded else []
    if gpu and p2p:
        syms.append("ffffffffc1000000 T nvidia_p2p_get_pages\t[nvidia]")
    _w(proc / "kallsyms", "\n".join(["ffffffff81000000 T _stext"] + syms))
    _w(etc / "group", "root:x:0:\n" + ("tutti:x:990:\n" if tutti_group else ""))
    _w(etc / "cufile.json", '{\n  // comment\n  "properties": {"allow_compat_mode": true}\n}')

    roots = {"sysfs": str(sys_), "procfs": str(proc), "dev": str(dev), "etc": str(etc)}
    return roots, good_live()


def good_live() -> dict:
    """Live calls of a machine where everything works."""
    return {
        "uring_setup": lambda: 0,
        "odirect": lambda path: None,
        "id_ctrl": lambda driver, node: {"mdts_bytes": 512 << 10, "sgls": 1, "nn": 1},
        "cuda": lambda: {"ok": True, "detail": "1 device(s), CUDA 13.0",
                         "devices": [{"index": 0, "name": "NVIDIA H200", "memory_gib": 139.8, "sms": 132}]},
        "green": lambda: {"ok": True, "detail": "cuda-bindings with cuGreenCtxCreate"},
        "cufile_lib": lambda: {"ok": True, "detail": "libcufile.so.0 loads"},
        "libtutti": lambda: None,
        "store_kind": lambda path: {"kind": "store", "version": 1, "member_index": 0, "n_members": 1},
        "version_of": lambda dist: "0.32.0" if dist == "vllm" else None,
        "uname": lambda: "6.12.0-1-amd64",
    }


def file_on_ssd(tmp_path: Path, roots: dict, name="kv.img") -> str:
    """A real file whose device number the fake sysfs maps to the fake SSD's namespace."""
    path = tmp_path / name
    path.write_bytes(b"")
    st = os.stat(path)
    sys_ = Path(roots["sysfs"])
    ns = sys_ / "devices" / "pci0000:00" / ROOT_PORT / SW_UP / SW_DOWN_SSD / SSD / "misc" / "tutti0n1"
    nvme = sys_ / "class" / "block" / "nvme0n1"
    target = nvme.resolve() if nvme.exists() else ns
    _ln(sys_ / "dev" / "block" / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", target)
    return str(path)
