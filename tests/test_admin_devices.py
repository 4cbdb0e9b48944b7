"""tutti-admin list / attach / detach / health: everything that runs without NVMe hardware.

- the SMART / health page decoder against a constructed 512-byte page, and the
  NVME_IOCTL_ADMIN_CMD layout (checked against the kernel's header when a C
  compiler and linux/nvme_ioctl.h are present);
- PCI address and device path parsing with its errors and exit codes;
- discovery, use checks and refusals against a fake sysfs tree (nvme-bound,
  tutti-bound, unbound and multipath controllers);
- the real commands on this machine (no NVMe in CI: an empty list) and the real
  libtutti attach/detach/admin calls refusing what is not there.

The same flow against QEMU's emulated controllers is tests/hil/test_admin_guest.py.
"""
import errno
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import fake_sysfs
from helpers.fake_sysfs import _ln, _w
from tutti import devices, smart
from tutti.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_STORE, EXIT_USAGE, main
from tutti.devices import DeviceError


def run(args, expect=0):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == expect, f"exit {res.exit_code} != {expect}\n{res.output}"
    return res


def out_of(res):
    return getattr(res, "stdout", res.output)


def err_of(res):
    try:
        return res.stderr
    except ValueError:  # click < 8.2 without mix_stderr=False
        return res.output


# ----------------------------------------------------------- SMART page

def u128(v):
    return v.to_bytes(16, "little")


def make_page(**over):
    """A SMART / health page with a distinct value in every field (offsets from the NVMe spec)."""
    v = dict(cw=0, temp=323, spare=100, thresh=10, used=3, egcws=0, dur=(1 << 70) + 5, duw=123456,
             hr=1 << 64, hw=987654321, busy=42, pc=7, poh=(1 << 100) + 1, us=2, me=0, errs=9,
             wtt=11, cct=12, sensors=(300, 301, 0, 0, 0, 0, 0, 310), thm=(1, 2, 3, 4))
    v.update(over)
    p = bytearray(512)
    p[0] = v["cw"]
    p[1:3] = struct.pack("<H", v["temp"])
    p[3], p[4], p[5], p[6] = v["spare"], v["thresh"], v["used"], v["egcws"]
    for off, key in ((32, "dur"), (48, "duw"), (64, "hr"), (80, "hw"), (96, "busy"), (112, "pc"),
                     (128, "poh"), (144, "us"), (160, "me"), (176, "errs")):
        p[off:off + 16] = u128(v[key])
    p[192:200] = struct.pack("<II", v["wtt"], v["cct"])
    p[200:216] = struct.pack("<8H", *v["sensors"])
    p[216:232] = struct.pack("<4I", *v["thm"])
    p[232:512] = b"\xee" * 280  # reserved: must not leak into any field
    return bytes(p)


def test_smart_page_fields():
    log = smart.parse_smart_log(make_page())
    assert log.critical_warning == 0 and log.warnings == []
    assert log.temperature_k == 323 and log.temperature_c == 50
    assert (log.avail_spare, log.spare_thresh, log.percent_used) == (100, 10, 3)
    assert log.endurance_grp_critical_warning_summary == 0
    assert log.data_units_read == (1 << 70) + 5  # 128-bit counters are read whole
    assert log.data_units_written == 123456
    assert log.host_read_commands == 1 << 64
    assert log.host_write_commands == 987654321
    assert log.controller_busy_time == 42
    assert log.power_cycles == 7
    assert log.power_on_hours == (1 << 100) + 1
    assert log.unsafe_shutdowns == 2
    assert log.media_errors == 0
    assert log.num_err_log_entries == 9
    assert (log.warning_temp_time, log.critical_comp_time) == (11, 12)
    assert log.temperature_sensors_k == (300, 301, 0, 0, 0, 0, 0, 310)
    assert (log.thm_temp1_trans_count, log.thm_temp2_trans_count,
            log.thm_temp1_total_time, log.thm_temp2_total_time) == (1, 2, 3, 4)
    d = log.to_dict()
    assert d["data_written_bytes"] == 123456 * 512000
    assert d["temperature_c"] == 50 and d["temperature_sensors_k"][7] == 310
    json.dumps(d)  # JSON-serialisable as it is


def test_smart_critical_warning_bits():
    log = smart.parse_smart_log(make_page(cw=0b0000_1101))
    assert log.warnings == ["available spare below threshold", "NVM subsystem reliability degraded",
                            "media placed in read-only mode"]
    assert smart.parse_smart_log(make_page(cw=0x80)).warnings == ["bit 7"]


def test_smart_page_too_short():
    with pytest.raises(ValueError, match="512 bytes, got 100"):
        smart.parse_smart_log(b"\0" * 100)
    # a longer buffer (a 4 KiB read) decodes its first 512 bytes
    assert smart.parse_smart_log(make_page() + b"\xff" * 3584).temperature_k == 323


def test_admin_cmd_layout():
    assert smart.PASSTHRU_BYTES == 72
    assert smart.NVME_IOCTL_ADMIN_CMD == 0xC0484E41  # _IOWR('N', 0x41, struct nvme_passthru_cmd)
    assert smart.get_log_cdw10(2, 512) == 0x007F0002  # NUMDL = 127 dwords - 1, LID 02h
    assert smart.get_log_cdw10(1, 64) == 0x000F0001
    with pytest.raises(ValueError):
        smart.get_log_cdw10(2, 510)
    cmd = smart.pack_admin_cmd(0x02, 0xFFFFFFFF, 0x1122334455667788, 512, 0x007F0002)
    assert len(cmd) == 72 and cmd[0] == 0x02
    assert struct.unpack_from("<I", cmd, 4)[0] == 0xFFFFFFFF      # nsid
    assert struct.unpack_from("<Q", cmd, 24)[0] == 0x1122334455667788  # addr
    assert struct.unpack_from("<I", cmd, 36)[0] == 512              # data_len
    assert struct.unpack_from("<I", cmd, 40)[0] == 0x007F0002       # cdw10


def test_admin_cmd_matches_kernel_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc or not Path("/usr/include/linux/nvme_ioctl.h").exists():
        pytest.skip("no C compiler or linux/nvme_ioctl.h")
    src = tmp_path / "n.c"
    src.write_text('#include <stdio.h>\n#include <stddef.h>\n#include <sys/ioctl.h>\n#include <linux/nvme_ioctl.h>\n'
                   'int main(void){printf("%lu %zu %zu %zu %zu\\n", (unsigned long)NVME_IOCTL_ADMIN_CMD,'
                   ' sizeof(struct nvme_passthru_cmd), offsetof(struct nvme_passthru_cmd, addr),'
                   ' offsetof(struct nvme_passthru_cmd, data_len), offsetof(struct nvme_passthru_cmd, cdw10));}\n')
    subprocess.run([cc, str(src), "-o", str(tmp_path / "n")], check=True)
    got = subprocess.run([str(tmp_path / "n")], check=True, capture_output=True, text=True).stdout.split()
    assert [int(x) for x in got] == [smart.NVME_IOCTL_ADMIN_CMD, 72, 24, 36, 40]


def test_smart_readers_refuse_a_non_nvme_file():
    with pytest.raises(smart.SmartError) as e:
        smart.read_smart_nvme("/dev/null")  # the ioctl path runs and the kernel says ENOTTY
    assert e.value.errno == errno.ENOTTY and "NVME_IOCTL_ADMIN_CMD" in str(e.value)
    with pytest.raises(smart.SmartError) as e:
        smart.read_smart_tutti("/dev/null")  # libtutti's tt_kdev_admin through cffi
    assert e.value.errno == errno.ENOTTY and "tutti admin" in str(e.value)
    with pytest.raises(smart.SmartError) as e:
        smart.read_smart_nvme("/nonexistent/nvme0")
    assert e.value.errno == errno.ENOENT


# --------------------------------------------------------- names

@pytest.mark.parametrize("text,bdf", [
    ("0000:00:04.0", "0000:00:04.0"), ("00:04.0", "0000:00:04.0"), ("0000:AF:1F.7", "0000:af:1f.7"),
    (" 0000:3b:00.1 ", "0000:3b:00.1"), ("10000:01:00.0", "10000:01:00.0"), ("1:2:3.4", "0001:02:03.4"),
])
def test_parse_pci_address(text, bdf):
    assert devices.parse_pci_address(text) == bdf


@pytest.mark.parametrize("text,why", [
    ("", "not a PCI address"), ("nvme0", "not a PCI address"), ("0000:00:04", "not a PCI address"),
    ("0000:00:20.0", "device number 0x20 is out of range"), ("0000:00:04.8", "function number 8 is out of range"),
    ("0000:000:04.0", "not a PCI address"), ("g000:00:04.0", "not a PCI address"),
])
def test_parse_pci_address_rejects(text, why):
    with pytest.raises(DeviceError, match=why) as e:
        devices.parse_pci_address(text)
    assert e.value.usage


# ------------------------------------------------------ fake sysfs

@pytest.fixture
def fake(tmp_path):
    """The fake sysfs + /dev of tests/helpers/fake_sysfs.py."""
    return fake_sysfs.build(tmp_path)


def test_discovery_finds_every_nvme_controller(fake):
    assert devices.nvme_controllers(fake) == ["0000:00:04.0", "0000:00:05.0", "0000:00:06.0", "0000:00:07.0"]
    ctls = {c["pci_address"]: c for c in devices.list_controllers(fake)}
    a = ctls["0000:00:04.0"]
    assert (a["driver"], a["controller"], a["model"], a["serial"], a["firmware"]) == \
        ("nvme", "nvme0", "QEMU NVMe Ctrl", "tuttiA", "7.2.0")
    assert a["device"] == os.path.join(fake.dev, "nvme0")
    [ns] = a["namespaces"]
    assert (ns["name"], ns["nsid"], ns["size_bytes"], ns["lba_bytes"], ns["partitions"], ns["tutti_store"]) == \
        ("nvme0n1", 1, 1048576 * 512, 512, ["nvme0n1p1"], True)
    b = ctls["0000:00:05.0"]
    assert (b["driver"], b["controller"]) == ("tutti", "tutti1")
    [ns] = b["namespaces"]
    # a regular file answers no INFO ioctl: size unknown; the store magic is read all the same
    assert (ns["name"], ns["nsid"], ns["size_bytes"], ns["tutti_store"]) == ("tutti1n1", 1, None, True)
    assert ctls["0000:00:06.0"]["driver"] == "none" and ctls["0000:00:06.0"]["namespaces"] == []
    [ns] = ctls["0000:00:07.0"]["namespaces"]  # found through the multipath head
    assert (ns["name"], ns["size_bytes"], ns["tutti_store"]) == ("nvme2n1", 2048 * 512, False)
    assert devices.list_controllers(fake, probe=False)[0]["namespaces"][0]["tutti_store"] is None


def test_store_magic_unreadable_is_unknown(tmp_path):
    assert devices.store_magic(str(tmp_path / "missing")) is None


def test_resolve_by_pci_address(fake):
    assert devices.resolve_controller("00:04.0", fake) == "0000:00:04.0"
    with pytest.raises(DeviceError, match="0000:00:09.0: no such PCI device") as e:
        devices.resolve_controller("0000:00:09.0", fake)
    assert not e.value.usage
    with pytest.raises(DeviceError, match=r"not an NVMe controller \(PCI class 0x020000") as e:
        devices.resolve_controller("0000:00:03.0", fake)
    assert e.value.usage


def test_resolve_by_device_node(fake):
    # real character devices whose numbers the fake sysfs maps to NVMe nodes
    assert devices.resolve_controller("/dev/null", fake) == "0000:00:04.0"   # "nvme0"
    assert devices.resolve_controller("/dev/zero", fake) == "0000:00:05.0"   # "tutti1n1"
    assert devices.resolve_controller("/dev/full", fake) == "0000:00:07.0"   # multipath head "nvme2n1"
    with pytest.raises(DeviceError, match="is not an NVMe controller or namespace") as e:
        devices.resolve_controller("/dev/random", fake)
    assert e.value.usage
    with pytest.raises(DeviceError, match="no such device") as e:
        devices.resolve_controller("nvme7", fake)  # a bare name is looked up in the fake /dev
    assert not e.value.usage
    with pytest.raises(DeviceError, match="is not a device node") as e:
        devices.resolve_controller(str(Path(fake.dev) / "nvme0n1"), fake)  # a regular file
    assert e.value.usage
    with pytest.raises(DeviceError, match="neither a PCI address nor a device path") as e:
        devices.resolve_controller("ssd-one", fake)
    assert e.value.usage


def test_shared_namespace_needs_a_pci_address(fake):
    head = Path(fake.root) / "devices" / "virtual" / "nvme-subsystem" / "nvme-subsys2" / "nvme2n1"
    other = Path(fake.root) / "devices" / "pci0000:00" / "0000:00:04.0" / "nvme" / "nvme0" / "nvme0c0n1"
    other.mkdir()
    _ln(head / "multipath" / "nvme0c0n1", other)
    with pytest.raises(DeviceError, match="reachable through 0000:00:04.0, 0000:00:07.0") as e:
        devices.bdf_of_sysfs_path(str(head), fake)
    assert e.value.usage


def test_namespace_users(fake):
    ctl = devices.describe_controller("0000:00:04.0", fake, probe=False)
    assert devices.namespace_users(ctl, fake, mounts=[("proc", "/proc"), ("/dev/sda1", "/")], swaps=[]) == []
    p1 = os.path.join(fake.dev, "nvme0n1p1")
    assert devices.namespace_users(ctl, fake, mounts=[(p1, "/mnt/data")], swaps=[]) == \
        [f"{p1} is mounted on /mnt/data"]
    n1 = os.path.join(fake.dev, "nvme0n1")
    assert devices.namespace_users(ctl, fake, mounts=[], swaps=[n1]) == [f"{n1} is in use as swap"]
    (Path(fake.root) / "class" / "block" / "nvme0n1p1" / "holders" / "dm-0").mkdir()
    assert devices.namespace_users(ctl, fake, mounts=[], swaps=[]) == [f"{p1} is held by dm-0"]


# ---------------------------------------------------- CLI on the fake tree

@pytest.fixture
def fake_cli(fake, monkeypatch):
    monkeypatch.setattr(devices, "SYS", fake)
    return fake


def test_list_json_and_table(fake_cli):
    ctls = json.loads(out_of(run(["list", "--json"])))
    assert [c["pci_address"] for c in ctls] == ["0000:00:04.0", "0000:00:05.0", "0000:00:06.0", "0000:00:07.0"]
    assert [c["driver"] for c in ctls] == ["nvme", "tutti", "none", "nvme"]
    assert ctls[0]["namespaces"][0]["tutti_store"] is True
    table = out_of(run(["list"]))
    for text in ("0000:00:04.0", "QEMU NVMe Ctrl", "tuttiA", "nvme0n1 (1 partition)", "512 MiB", "tutti1n1",
                 "none", "nvme2n1"):
        assert text in table, text


def test_attach_refuses_a_mounted_namespace_before_touching_sysfs(fake_cli, monkeypatch):
    def no_c():
        raise AssertionError("libtutti must not be called for a device in use")

    monkeypatch.setattr(devices, "_lib", no_c)
    p1 = os.path.join(fake_cli.dev, "nvme0n1p1")
    monkeypatch.setattr(devices, "_mounts", lambda: [(p1, "/srv")])
    res = run(["attach", "0000:00:04.0"], expect=EXIT_STORE)
    assert f"attach: 0000:00:04.0: refusing to attach: {p1} is mounted on /srv" in err_of(res)


def test_attach_refuses_a_foreign_driver(fake_cli, monkeypatch):
    d = Path(fake_cli.root) / "devices" / "pci0000:00" / "0000:00:06.0"
    (Path(fake_cli.root) / "bus" / "pci" / "drivers" / "vfio-pci").mkdir()
    _ln(d / "driver", Path(fake_cli.root) / "bus" / "pci" / "drivers" / "vfio-pci")
    res = run(["attach", "00:06.0"], expect=EXIT_STORE)
    assert "bound to vfio-pci, not nvme" in err_of(res)


def test_attach_and_detach_when_already_there(fake_cli, monkeypatch):
    monkeypatch.setattr(devices, "_lib", lambda: (_ for _ in ()).throw(AssertionError("no sysfs writes")))
    res = run(["attach", "0000:00:05.0", "--json"])
    d = json.loads(out_of(res))
    assert d["changed"] is False and d["driver"] == "tutti"
    assert "already bound to nvme" in out_of(run(["detach", "0000:00:04.0"]))


def test_attach_of_unused_fake_device_reaches_libtutti(fake_cli):
    # a free controller in the fake tree at an address no machine has (bus 7e, device 1f, function 6),
    # so the real tt_kmod_attach() runs against the real /sys and refuses with its own reason
    d = Path(fake_cli.root) / "devices" / "pci0000:7e" / "0000:7e:1f.6"
    _w(d / "class", "0x010802")
    _ln(Path(fake_cli.root) / "bus" / "pci" / "devices" / "0000:7e:1f.6", d)
    res = run(["attach", "0000:7e:1f.6"], expect=EXIT_STORE)
    assert "attach: 0000:7e:1f.6: no such PCI device" in err_of(res)


def test_health_table_and_json(fake_cli, monkeypatch):
    ctl = devices.describe_controller("0000:00:04.0", fake_cli, probe=False)
    monkeypatch.setattr(devices, "smart_log", lambda bdf, sysfs=None: (ctl, make_page()))
    d = json.loads(out_of(run(["health", "0000:00:04.0", "--json"])))
    assert (d["pci_address"], d["driver"], d["critical_warning"], d["temperature_c"]) == \
        ("0000:00:04.0", "nvme", 0, 50)
    assert d["power_on_hours"] == (1 << 100) + 1 and d["num_err_log_entries"] == 9
    text = out_of(run(["health", "0000:00:04.0"]))
    for line in ("critical warning", "0x00 (none)", "50 °C (323 K)", "available spare threshold", "10%",
                 "data units written", "123,456 (63.21 GB)", "power on hours", "unsafe shutdowns",
                 "error information log entries", "temperature sensor 8"):
        assert line in text, line
    assert "temperature sensor 3" not in text  # sensors reading 0 are not reported


def test_health_exit_1_on_critical_warning(fake_cli, monkeypatch):
    ctl = devices.describe_controller("0000:00:04.0", fake_cli, probe=False)
    monkeypatch.setattr(devices, "smart_log", lambda bdf, sysfs=None: (ctl, make_page(cw=0x02)))
    res = run(["health", "0000:00:04.0"], expect=EXIT_PROBLEMS)
    assert "temperature outside its thresholds" in out_of(res)
    assert json.loads(out_of(run(["health", "00:04.0", "--json"], expect=EXIT_PROBLEMS)))["critical_warning"] == 2


def test_health_needs_a_driver(fake_cli):
    res = run(["health", "0000:00:06.0"], expect=EXIT_STORE)
    assert "bound to no driver" in err_of(res)
    res = run(["health", "0000:00:04.0"], expect=EXIT_STORE)  # nvme-bound, but the fake /dev has no nvme0
    assert "does not exist" in err_of(res)


# ------------------------------------------------- this machine, for real

def _nvme_here():
    base = "/sys/bus/pci/devices"
    n = 0
    for b in os.listdir(base) if os.path.isdir(base) else []:
        try:
            n += int(Path(base, b, "class").read_text(), 16) == 0x010802
        except (OSError, ValueError):
            pass
    return n


def test_list_on_this_machine():
    ctls = json.loads(out_of(run(["list", "--json"])))
    assert len(ctls) == _nvme_here()
    if ctls:
        pytest.skip("this machine has NVMe controllers: the empty listing is not checked")
    assert ctls == []
    res = run(["list"])
    assert "PCI address" in out_of(res) and "tutti store" in out_of(res)  # the header of an empty table
    assert "no NVMe controller found" in err_of(res)


def test_list_via_console_script():
    exe = Path(sys.executable).with_name("tutti-admin")
    if not exe.exists():
        pytest.skip("tutti-admin console script is not installed")
    p = subprocess.run([str(exe), "list", "--json"], capture_output=True, text=True)
    assert p.returncode == EXIT_OK and len(json.loads(p.stdout)) == _nvme_here()


@pytest.mark.parametrize("cmd", ["attach", "detach", "health"])
def test_nonexistent_devices_exit_3(cmd):
    res = run([cmd, "0000:7f:1f.7"], expect=EXIT_STORE)
    assert f"{cmd}: 0000:7f:1f.7: no such PCI device" in err_of(res)
    res = run([cmd, "/dev/nvme97n3"], expect=EXIT_STORE)
    assert "/dev/nvme97n3: no such device" in err_of(res)


@pytest.mark.parametrize("arg,why", [
    ("banana", "neither a PCI address nor a device path"),
    ("0000:00:1f.9", "function number 9 is out of range"),
    ("/dev/null", "is not an NVMe controller or namespace"),
    ("/etc/hostname", "is not a device node"),
])
def test_bad_device_arguments_exit_2(arg, why):
    if arg.startswith("/") and not os.path.exists(arg):
        pytest.skip(f"{arg} does not exist here")
    res = run(["attach", arg], expect=EXIT_USAGE)
    assert why in err_of(res) and err_of(res).startswith("tutti-admin: error: attach: ")


def test_libtutti_attach_detach_refuse_through_cffi():
    from tutti._tutti import ffi, lib

    for fn in (lib.tt_kmod_attach, lib.tt_kmod_detach):
        assert fn(b"0000:7f:1f.7") == -errno.ENODEV
        assert "no such PCI device" in ffi.string(lib.tt_errmsg()).decode()
        assert fn(b"../../etc") == -errno.EINVAL
        assert "is not a PCI address" in ffi.string(lib.tt_errmsg()).decode()
    lib.tt_clearerr()
    info = ffi.new("struct tt_kinfo *")
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        assert lib.tt_kdev_info(fd, info) == -errno.ENOTTY
    finally:
        os.close(fd)


# ------------------------------------------------------------------ hotplug

def test_attach_config_parsing(tmp_path):
    conf = tmp_path / "attach.conf"
    conf.write_text("# controllers for tutti.ko\n00:04.0   # by address\nS123ABC\n\nbad line here\n")
    entries, problems = devices.read_attach_config(str(conf))
    assert entries == {"0000:00:04.0", "S123ABC"}
    assert len(problems) == 1 and "attach.conf:5" in problems[0]
    assert devices.read_attach_config(str(tmp_path / "missing.conf")) == (set(), [])


def test_hotplug_report_lines_are_never_wrapped(fake_cli, monkeypatch, tmp_path):
    """udev logs each line of hotplug's stderr as one journal entry: a problem naming a long config path
    must stay one line (rich wrapped it at 120 columns)."""
    d = tmp_path / ("d" * 150)
    d.mkdir()
    conf = d / "attach.conf"
    conf.write_text("0000:00:04.0\nnot an address or serial\n")
    monkeypatch.setattr(devices, "attach", lambda bdf, *a, **k: ({}, True))
    lines = [ln for ln in err_of(run(["hotplug", "0000:00:04.0", "--config", str(conf)])).splitlines() if ln]
    assert len(lines) == 2, lines
    assert str(conf) + ":2" in lines[0] and lines[1].endswith("attached to tutti.ko")


@pytest.mark.parametrize("line", ["0000:00:04.0", "tuttiA"], ids=["address", "serial"])
def test_hotplug_attaches_a_listed_controller(fake_cli, monkeypatch, tmp_path, line):
    conf = tmp_path / "attach.conf"
    conf.write_text(line + "\n")
    calls = []
    monkeypatch.setattr(devices, "attach", lambda bdf, *a, **k: (calls.append(bdf), ({}, True))[1])
    res = run(["hotplug", "0000:00:04.0", "--config", str(conf)])
    assert calls == ["0000:00:04.0"]
    assert "0000:00:04.0 attached to tutti.ko" in err_of(res)


def test_hotplug_leaves_other_controllers_alone(fake_cli, monkeypatch, tmp_path):
    conf = tmp_path / "attach.conf"
    conf.write_text("0000:00:05.0\nsomeone-else\n")
    monkeypatch.setattr(devices, "attach", lambda *a, **k: pytest.fail("must not attach an unlisted controller"))
    run(["hotplug", "0000:00:04.0", "--config", str(conf)])
    run(["hotplug", "0000:00:04.0", "--config", str(tmp_path / "none.conf")])


def test_hotplug_keeps_the_attach_refusals(fake_cli, monkeypatch, tmp_path):
    conf = tmp_path / "attach.conf"
    conf.write_text("00:04.0\n")
    monkeypatch.setattr(devices, "_lib", lambda: pytest.fail("libtutti must not be called for a device in use"))
    p1 = os.path.join(fake_cli.dev, "nvme0n1p1")
    monkeypatch.setattr(devices, "_mounts", lambda: [(p1, "/srv")])
    res = run(["hotplug", "0000:00:04.0", "--config", str(conf)], expect=EXIT_STORE)
    assert "refusing to attach" in err_of(res)


def test_udev_rules_offer_nvme_controllers_to_hotplug():
    rules = (Path(__file__).resolve().parent.parent / "udev" / "99-tutti.rules").read_text()
    logical = rules.replace("\\\n", " ")
    [hotplug] = [ln for ln in logical.splitlines() if "hotplug" in ln and not ln.lstrip().startswith("#")]
    for key in ('ACTION=="add"', 'SUBSYSTEM=="pci"', 'ATTR{class}=="0x010802"', "tutti-admin hotplug %k"):
        assert key in hotplug, key
    assert 'MODE="0660"' in rules and 'GROUP="tutti"' in rules
