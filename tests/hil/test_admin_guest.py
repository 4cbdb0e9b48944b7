"""tutti-admin list / attach / detach / health against QEMU's emulated NVMe (inside the HIL guest).

Run by tests/hil/run-guest.sh as root in the guest, after its own tests, with
tutti.ko loaded and both controllers (TUTTI_NVME_BDFS: A plain, B with a CMB)
bound to it.  Skipped on the host (tests/hil/conftest.py).  The tests run in
order on controller A:

    list (both on tutti) -> detach A to nvme -> health through nvme ->
    mkfs.ext4 + mount: attach refused (exit 3, A stays with nvme) -> umount,
    format a store through nvme: list sees it -> 32 MiB put through nvme: the
    store's bytes-written counter grows as SMART's data units written -> attach
    by block device path: list shows tutti and the store through the tutti.ko
    node -> health through tutti.ko -> 32 MiB put through tutti.ko's kernel
    queues: the same count against SMART -> detach: back on nvme, store still
    there

and leave A attached to tutti.ko again, as run-guest.sh expects.
Drives the installed console script (the .venv-hil one) in subprocesses.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

BDFS = os.environ.get("TUTTI_NVME_BDFS", "0000:00:04.0 0000:00:05.0").split()
A, B = (BDFS + ["", ""])[:2]
SERIALS = {A: "tuttiA", B: "tuttiB"}  # scripts/hil/run-qemu.sh: nvme,serial=tuttiA / tuttiB
SEEN = {}  # values carried from one test to the next (they run in file order)


def admin_cmd():
    exe = Path(sys.executable).with_name("tutti-admin")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tutti.cli"]


def admin(*args, expect=0):
    p = subprocess.run(admin_cmd() + [str(a) for a in args], capture_output=True, text=True, timeout=300)
    assert p.returncode == expect, (f"tutti-admin {' '.join(map(str, args))}: exit {p.returncode} != {expect}\n"
                                    f"stdout: {p.stdout}\nstderr: {p.stderr}")
    return p


def driver(bdf):
    link = f"/sys/bus/pci/devices/{bdf}/driver"
    return os.path.basename(os.readlink(link)) if os.path.islink(link) else "none"


def listing():
    return {c["pci_address"]: c for c in json.loads(admin("list", "--json").stdout)}


def wait_for(path, timeout=10.0):
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check)


def loaded(mod):
    return os.path.isdir(f"/sys/module/{mod.replace('-', '_')}")


def insmod_tree(ko):
    """insmod a module file after its dependencies from the same unpacked tree (as run-guest.sh's load_ko)."""
    tree = ko.split("/kernel/")[0]
    for dep in filter(None, sh("modinfo", "-F", "depends", ko).stdout.strip().split(",")):
        if not loaded(dep):
            found = glob.glob(f"{tree}/**/{dep}.ko*", recursive=True) or \
                glob.glob(f"{tree}/**/{dep.replace('_', '-')}.ko*", recursive=True)
            assert found, f"{dep} (needed by {ko}) not found under {tree}"
            insmod_tree(found[0])
    name = os.path.basename(ko).split(".ko")[0]
    if not loaded(name):
        sh("insmod", ko)


def load_module(name):
    """Load a module of the guest's kernel: modprobe -d TUTTI_MODULES_ROOT, else by path beside TUTTI_NVME_KO."""
    if loaded(name):
        return True
    root = os.environ.get("TUTTI_MODULES_ROOT")
    if root and sh("modprobe", "-d", root, name, check=False).returncode == 0:
        return True
    ko = os.environ.get("TUTTI_NVME_KO")
    if ko:
        found = glob.glob(f"{ko.split('/kernel/')[0]}/**/{name}.ko*", recursive=True)
        if found:
            insmod_tree(found[0])
            return True
    return False


@pytest.fixture(scope="module", autouse=True)
def guest():
    if os.geteuid() != 0:
        pytest.skip("needs root (attach/detach write sysfs)")
    if not (A and B and os.path.isdir(f"/sys/bus/pci/devices/{A}")):
        pytest.skip(f"the two emulated controllers are not there (TUTTI_NVME_BDFS={BDFS})")
    if not os.path.isdir("/sys/bus/pci/drivers/tutti"):
        ko = os.environ.get("TUTTI_KO")
        if not ko:
            pytest.skip("tutti.ko is not loaded and TUTTI_KO is not set")
        sh("insmod", ko)
    yield
    # leave A where run-guest.sh expects it: on tutti.ko, nothing mounted, nvme unloaded
    for m in SEEN.get("mounts", []):
        sh("umount", m, check=False)
    if driver(A) != "tutti":
        subprocess.run(admin_cmd() + ["attach", A], check=False)
    sh("rmmod", "nvme", check=False)
    sh("rmmod", "nvme_core", check=False)


def need(key):
    """A value an earlier test found (skip when that test could not run)."""
    if key not in SEEN:
        pytest.skip(f"an earlier step did not run (no {key})")
    return SEEN[key]


def nvme_namespace(ctl):
    assert ctl["driver"] == "nvme" and ctl["namespaces"], ctl
    return ctl["namespaces"][0]["device"]


def test_list_shows_both_controllers():
    ctls = listing()
    assert A in ctls and B in ctls, sorted(ctls)
    for bdf in (A, B):
        c = ctls[bdf]
        assert c["driver"] == driver(bdf) and c["driver"] in ("tutti", "nvme"), c
        assert c["vendor_id"] == "0x1b36"  # QEMU's PCI vendor id (Red Hat)
        assert c["serial"] == SERIALS[bdf] and c["model"], c  # tutti: INFO ioctl; nvme: sysfs
        assert len(c["namespaces"]) == 1, c
        ns = c["namespaces"][0]
        assert os.path.exists(ns["device"]) and ns["size_bytes"] and ns["size_bytes"] % 512 == 0, ns
        assert ns["tutti_store"] in (True, False), ns  # readable as root
    table = admin("list").stdout
    assert A in table and B in table and SERIALS[A] in table and SERIALS[B] in table


def test_detach_hands_a_to_nvme():
    if not os.path.isdir("/sys/bus/pci/drivers/nvme"):
        kos = os.environ.get("TUTTI_NVME_KOS", "").split()
        if kos:
            for ko in kos:
                if not loaded(os.path.basename(ko).split(".ko")[0]):
                    sh("insmod", ko)
        elif not load_module("nvme"):
            pytest.skip("the kernel's nvme driver cannot be loaded "
                        "(no TUTTI_NVME_KOS/TUTTI_MODULES_ROOT/TUTTI_NVME_KO)")
    assert driver(B) == "tutti" or driver(B) == "nvme"
    p = admin("detach", A)
    assert f"{A}: handed back to nvme" in p.stdout or f"{A}: already bound to nvme" in p.stdout, p.stdout
    assert driver(A) == "nvme"
    c = listing()[A]
    dev = nvme_namespace(c)
    assert wait_for(dev), dev
    assert c["controller"].startswith("nvme") and os.path.exists(c["device"])
    assert c["serial"] == SERIALS[A] and c["model"] == "QEMU NVMe Ctrl" and c["firmware"], c
    SEEN["ns"] = dev


def test_health_through_nvme():
    need("ns")
    assert driver(A) == "nvme"
    d = json.loads(admin("health", A, "--json").stdout)
    assert d["driver"] == "nvme" and d["device"].startswith("/dev/nvme"), d
    assert d["critical_warning"] == 0, d
    assert 273 < d["temperature_k"] < 373, d  # QEMU reports 323 K
    assert 0 <= d["percent_used"] <= 255 and 0 <= d["avail_spare"] <= 100
    assert d["host_read_commands"] > 0, d  # the kernel read the partition table through this controller
    SEEN["temperature_k"] = d["temperature_k"]
    # the same log by namespace block device, and the table for people
    assert json.loads(admin("health", need("ns"), "--json").stdout)["temperature_k"] == d["temperature_k"]
    table = admin("health", need("ns")).stdout
    assert "critical warning" in table and "0x00 (none)" in table and f"({d['temperature_k']} K)" in table


def test_attach_refuses_a_mounted_namespace():
    dev = need("ns")
    if not (load_module("ext4") or "ext4" in Path("/proc/filesystems").read_text()):
        pytest.skip("ext4 cannot be loaded in this guest")
    sh("mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=1", dev)
    mnt = tempfile.mkdtemp(prefix="tutti-admin-mnt-")
    sh("mount", dev, mnt)
    SEEN.setdefault("mounts", []).append(mnt)
    try:
        p = admin("attach", A, expect=3)
        assert f"attach: {A}: refusing to attach: {dev} is mounted on {mnt}" in p.stderr, p.stderr
        assert driver(A) == "nvme" and os.path.exists(dev)  # nothing changed
        p = admin("attach", dev, expect=3)  # named by its block device: the same refusal
        assert "is mounted on" in p.stderr
        assert driver(A) == "nvme"
    finally:
        sh("umount", mnt)
        SEEN["mounts"].remove(mnt)


def test_store_on_the_nvme_block_device_is_listed():
    dev = need("ns")
    # 256 KiB blocks (4 layers x K/V x 32 KiB objects): the endurance tests below write 32 MiB twice
    admin("format", dev, "--layers", "4", "--kv-heads", "8", "--head-dim", "128", "--slots", "320",
          "--model-id", "hil/admin", "--yes", "--json")
    [ns] = listing()[A]["namespaces"]
    assert ns["device"] == dev and ns["tutti_store"] is True, ns


WRITE_BLOCKS = 128
DATA_UNIT = 512_000  # SMART data units: thousands of 512-byte sectors

# Put WRITE_BLOCKS new blocks through a writable open and print what the store and its engine counted before
# close (the close then saves the count: 4 KiB of superblock copy B per member).
WRITER = """
import json, os, sys
from tutti import Store
dev, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Store.open([dev]) as s:
    for i in range(n):
        s.put(f"{tag}/{i}".encode(), os.urandom(s.block_bytes))
    print(json.dumps({"engine": s.engine, "stats": s.stats(), "written": s.written(), "block_bytes": s.block_bytes}))
"""


def health_with_store(ctl, ns):
    d = json.loads(admin("health", ctl, "--store", ns, "--json").stdout)
    assert d["store"]["counter"] == "kept", d["store"]
    return d


def written_vs_smart(ctl, ns, tag, engines):
    """The store's bytes-written counter against the drive's SMART data units written, over one writer."""
    before = health_with_store(ctl, ns)
    p = subprocess.run([sys.executable, "-c", WRITER, ns, tag, str(WRITE_BLOCKS)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    w = json.loads(p.stdout)
    after = health_with_store(ctl, ns)
    assert w["engine"] in engines, w["engine"]
    assert w["stats"]["blocks_written"] == WRITE_BLOCKS and w["stats"]["commits"] >= 1, w["stats"]
    # what the store counted since open is what its engine wrote (the counter's own saves come at close)
    assert w["written"]["since_open_bytes"] == w["stats"]["engine"]["bytes_written"], w
    assert w["written"]["since_open_bytes"] >= WRITE_BLOCKS * w["block_bytes"], w
    store_delta = after["store"]["bytes"] - before["store"]["bytes"]
    assert store_delta >= w["written"]["since_open_bytes"], (before["store"], after["store"])
    assert store_delta - w["written"]["since_open_bytes"] <= 4096, (before["store"], after["store"])  # the close
    # the drive saw the same bytes: SMART rounds each reading up to a data unit, so a delta is within one unit
    smart_delta = after["data_written_bytes"] - before["data_written_bytes"]
    assert abs(smart_delta - store_delta) <= DATA_UNIT, (smart_delta, store_delta)
    # run-guest.sh copies this line into the TAP log (pytest -rP shows a passed test's output)
    print(f"ENDURANCE {ctl} engine {w['engine']}: {WRITE_BLOCKS} blocks of {w['block_bytes']} B; store counter "
          f"+{store_delta} B (engine wrote {w['stats']['engine']['bytes_written']} B before close); SMART data "
          f"units written +{smart_delta // DATA_UNIT} (+{smart_delta} B)")
    return store_delta, smart_delta


def test_store_written_matches_smart_through_nvme():
    dev = need("ns")
    assert driver(A) == "nvme"
    written_vs_smart(A, dev, "nvme", ("uring", "psync"))


def test_attach_after_unmount():
    dev = need("ns")
    p = admin("attach", dev)  # by block device path this time
    assert f"{A}: attached to tutti.ko" in p.stdout, p.stdout
    assert driver(A) == "tutti"
    c = listing()[A]
    assert c["driver"] == "tutti" and c["controller"].startswith("tutti") and os.path.exists(c["device"]), c
    [ns] = c["namespaces"]
    assert ns["device"] == c["device"] + "n1" and os.path.exists(ns["device"]), ns
    assert ns["tutti_store"] is True, ns  # the superblock read through the tutti.ko node
    assert c["serial"] == SERIALS[A], c
    assert not os.path.exists(dev), f"{dev} still exists after the nvme driver let go"
    SEEN["tnode"] = c["device"]
    p = admin("attach", A)  # again: nothing to do
    assert "already bound to tutti.ko" in p.stdout


def test_health_through_tutti():
    tnode = need("tnode")
    d = json.loads(admin("health", tnode, "--json").stdout)
    assert d["driver"] == "tutti" and d["device"] == tnode, d
    assert d["critical_warning"] == 0, d
    assert d["temperature_k"] == need("temperature_k"), d  # same controller, same reading as through nvme
    assert d["power_cycles"] >= 0 and d["host_read_commands"] > 0, d


def test_store_written_matches_smart_through_tutti():
    tnode = need("tnode")
    written_vs_smart(tnode, tnode + "n1", "tutti", ("kqueue",))


def test_detach_hands_it_back():
    p = admin("detach", need("tnode"), "--json")
    d = json.loads(p.stdout)
    assert d["changed"] is True and d["driver"] == "nvme", d
    assert driver(A) == "nvme"
    [ns] = d["namespaces"]
    assert wait_for(ns["device"]), ns
    assert listing()[A]["namespaces"][0]["tutti_store"] is True  # the store survived both drivers
    assert json.loads(admin("health", A, "--json").stdout)["driver"] == "nvme"
