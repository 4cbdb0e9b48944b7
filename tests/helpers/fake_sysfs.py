"""A fake sysfs and /dev for tutti-admin's controller commands (no NVMe hardware needed).

Real character devices stand for NVMe nodes: the fake /sys/dev/char maps /dev/null's numbers
(1:3) to nvme0, /dev/zero's (1:5) to the tutti.ko namespace node tutti1n1, /dev/full's (1:7)
to a multipath namespace head, and /dev/random's (1:8) to something that is not NVMe.
"""
import os
from pathlib import Path

from tutti.devices import Sysfs


def _w(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _ln(link: Path, target: Path):
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def build(tmp_path: Path) -> Sysfs:
    """A sysfs + /dev under ``tmp_path`` with: 04.0 on nvme (nvme0n1 + partition p1, store in copy B), 05.0 on tutti
    (tutti1, tutti1n1 with a store), 06.0 with no driver, 07.0 on nvme with a multipath namespace
    head nvme2n1, and 03.0 a network card."""
    sys_, dev = tmp_path / "sys", tmp_path / "dev"
    pci = sys_ / "devices" / "pci0000:00"
    drivers = sys_ / "bus" / "pci" / "drivers"
    for d in ("nvme", "tutti", "e1000"):
        (drivers / d).mkdir(parents=True)

    def fn(bdf, cls, driver=None):
        d = pci / bdf
        _w(d / "class", cls)
        _w(d / "vendor", "0x1b36")
        _w(d / "device", "0x0010")
        if driver:
            _ln(d / "driver", drivers / driver)
        _ln(sys_ / "bus" / "pci" / "devices" / bdf, d)
        return d

    def blockdev(path, name, majmin, size=None, nsid=None, part=None):
        _w(path / "dev", majmin)
        (path / "holders").mkdir(parents=True)
        if size is not None:
            _w(path / "size", str(size))
            _w(path / "queue" / "logical_block_size", "512")
        if nsid is not None:
            _w(path / "nsid", str(nsid))
        if part is not None:
            _w(path / "partition", str(part))
        _ln(sys_ / "class" / "block" / name, path)

    a = fn("0000:00:04.0", "0x010802", "nvme")
    c0 = a / "nvme" / "nvme0"
    for k, v in (("model", "QEMU NVMe Ctrl"), ("serial", "tuttiA"), ("firmware_rev", "7.2.0"), ("state", "live")):
        _w(c0 / k, v)
    blockdev(c0 / "nvme0n1", "nvme0n1", "259:0", size=1048576, nsid=1)
    blockdev(c0 / "nvme0n1" / "nvme0n1p1", "nvme0n1p1", "259:1", part=1)
    _ln(sys_ / "dev" / "char" / "1:3", c0)  # /dev/null's numbers stand for /dev/nvme0 ...
    b = fn("0000:00:05.0", "0x010802", "tutti")
    (b / "misc" / "tutti1").mkdir(parents=True)
    (b / "misc" / "tutti1n1").mkdir(parents=True)
    _ln(sys_ / "dev" / "char" / "1:5", b / "misc" / "tutti1n1")  # ... /dev/zero's for /dev/tutti1n1
    fn("0000:00:06.0", "0x010802")
    m = fn("0000:00:07.0", "0x010802", "nvme")
    c2 = m / "nvme" / "nvme2"
    _w(c2 / "model", "shared")
    (c2 / "nvme2c2n1").mkdir(parents=True)
    head = sys_ / "devices" / "virtual" / "nvme-subsystem" / "nvme-subsys2" / "nvme2n1"
    blockdev(head, "nvme2n1", "259:5", size=2048, nsid=1)
    _ln(head / "multipath" / "nvme2c2n1", c2 / "nvme2c2n1")
    _ln(sys_ / "dev" / "char" / "1:7", head)  # /dev/full's numbers stand for the head
    fn("0000:00:03.0", "0x020000", "e1000")
    (sys_ / "devices" / "virtual" / "mem" / "random").mkdir(parents=True)
    _ln(sys_ / "dev" / "char" / "1:8", sys_ / "devices" / "virtual" / "mem" / "random")  # /dev/random: not NVMe

    dev.mkdir()
    (dev / "nvme0n1").write_bytes(b"\0" * 4096 + b"TUTTIKV1" + b"\0" * 4088)  # copy A lost, copy B there
    (dev / "nvme0n1p1").write_bytes(b"\0" * 8192)
    (dev / "tutti1n1").write_bytes(b"TUTTIKV1" + b"\0" * 8184)
    (dev / "nvme2n1").write_bytes(b"\0" * 100)  # shorter than a superblock: no store
    return Sysfs(str(sys_), str(dev))
