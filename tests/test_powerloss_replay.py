"""The power-loss replay harness (tests/hil/powerloss/) on the host, without a guest.

The HIL runs it for real (scripts/hil/powerloss.sh: the guest's kernel-queue and file engines on NVMe
drives behind QEMU's blklogwrites). Here: the log reader against logs QEMU itself wrote (qemu-io), the
crash-state enumeration, and the whole replay on a store written through a FUSE export of a
blklogwrites node (qemu-storage-daemon), including that it finds the ordering bugs it exists for: the
same log with the data flush, or the eviction flush, taken out must show wrong bytes.
"""
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "hil", "powerloss"))

import replay
from dmlog import LOG_FLUSH, LOG_FUA, SECTOR, Entry, Image, Log, LogError, epoch_states


def _qemu_io(tmp_path, *cmds):
    if not shutil.which("qemu-io"):
        pytest.skip("qemu-io not installed (qemu-utils)")
    img, log = tmp_path / "d.img", tmp_path / "d.log"
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(img), "4M"], check=True)
    log.write_bytes(b"")
    args = ["qemu-io", "--image-opts",
            f"driver=blklogwrites,file.driver=file,file.filename={img},log.driver=file,log.filename={log}"]
    for c in cmds:
        args += ["-c", c]
    subprocess.run(args, check=True, capture_output=True)
    return img, log


def test_log_reader_reads_what_qemu_logged(tmp_path):
    img, log = _qemu_io(tmp_path, "write -P 0xab 4096 8192", "flush", "write -P 0xcd 512 512",
                        "write -z 65536 4096", "flush", "write -P 0x11 0 512")
    lg = Log(str(log))
    # qemu-io adds flushes of its own (at the end, after write -z): compare the writes and epochs
    writes = [e for e in lg.entries if e.is_write]
    assert [(e.sector, e.nr) for e in writes] == [(8, 16), (1, 1), (128, 8), (0, 1)]
    assert lg.data(writes[0]) == b"\xab" * 8192 and lg.data(writes[1]) == b"\xcd" * 512
    assert lg.data(writes[2]) == bytes(4096)
    assert [[e.sector for e in ws] for ws, _ in lg.epochs() if ws] == [[8], [1, 128], [0]]
    assert all(lg.entries[f].is_flush for _, f in lg.epochs() if f is not None)
    # Replaying everything gives the drive QEMU wrote.
    im = Image(str(tmp_path / "r.img"), 4 << 20, lg)
    for e in lg.entries:
        if e.is_write:
            im.apply(e)
    assert im.read(0, 4 << 20) == img.read_bytes()


def test_log_reader_refuses_what_it_cannot_replay(tmp_path):
    bad = tmp_path / "bad.log"
    bad.write_bytes(b"\0" * 1024)
    with pytest.raises(LogError, match="not a dm-log-writes log"):
        Log(str(bad))
    _, log = _qemu_io(tmp_path, "write -P 1 0 4096", "flush")
    raw = log.read_bytes()
    (tmp_path / "cut.log").write_bytes(raw[:-SECTOR])
    with pytest.raises(LogError, match="cut short|superblock counts"):
        Log(str(tmp_path / "cut.log"))


def _ws(*specs):
    return [Entry(i, sector, nr, flags, -1) for i, (sector, nr, flags) in enumerate(specs)]


def test_epoch_states_leave_out_the_flush_points_and_keep_fua():
    ws = _ws((0, 8, 0), (100, 8, LOG_FUA), (200, 8, 0), (300, 1, 0))
    states = epoch_states(ws, random.Random(3), n_random=40)
    full = tuple((i, None) for i in range(4))
    assert states and len(states) == len(set(states))
    assert () not in states and full not in states
    for st in states:
        have = {p for p, _ in st}
        # a write after the FUA write landed: the FUA write (durable when it completed) did too
        if any(p > 1 for p in have):
            assert (1, None) in st
        for p, m in st:
            if m is not None:
                assert 0 < len(m) < ws[p].nr     # torn: some sectors, never all or none
    assert any(m is not None for st in states for _, m in st)
    # a write that is alone in its epoch still gets its torn states
    assert len(epoch_states(_ws((16, 8, 0)), random.Random(1))) == 3


def test_overlapping_writes_keep_their_landing_order():
    ws = _ws((0, 8, 0), (4, 8, 0))
    states = epoch_states(ws, random.Random(5), n_random=60)
    assert ((1, None), (0, None)) in states      # the later write overwritten by the earlier one


def test_image_undo_restores_the_flush_point(tmp_path):
    _, log = _qemu_io(tmp_path, "write -P 0x22 0 4096", "write -P 0x33 2048 4096")
    lg = Log(str(log))
    im = Image(str(tmp_path / "i.img"), 1 << 20, lg)
    before = im.read(0, 8192)
    im.apply_state(lg.entries, ((1, None), (0, frozenset({0, 2}))))
    assert im.read(0, 512) == b"\x22" * 512 and im.read(2048, 512) == b"\x33" * 512
    im.undo()
    assert im.read(0, 8192) == before


# --- the whole replay on a store written through a logged FUSE export ---------------------------

@pytest.fixture(scope="module")
def pl_writer(tmp_path_factory):
    subprocess.run(["make", "-s", "-C", REPO, "lib"], check=True, capture_output=True)
    out = tmp_path_factory.mktemp("plw") / "pl_writer"
    subprocess.run(["gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE",
                    "-I", os.path.join(REPO, "libtutti", "include"),
                    os.path.join(REPO, "tests", "hil", "powerloss", "pl_writer.c"), "-o", str(out),
                    os.path.join(REPO, "build", "libtutti.a"), "-luring", "-lxxhash", "-lpthread"], check=True)
    return str(out)


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, pl_writer):
    """pl_writer (psync) on a file that qemu-storage-daemon exports through FUSE from a blklogwrites
    node: (log path, drive image path, journal)."""
    qsd = shutil.which("qemu-storage-daemon")
    if not qsd or not os.access("/dev/fuse", os.R_OK | os.W_OK):
        pytest.skip("needs qemu-storage-daemon (qemu-system-common) and /dev/fuse")
    d = tmp_path_factory.mktemp("plfuse")
    img, log, mnt = d / "drive.img", d / "drive.log", d / "export"
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(img), "80M"], check=True)
    log.write_bytes(b"")
    mnt.write_bytes(b"")
    p = subprocess.Popen([qsd, "--blockdev", f"driver=file,filename={img},node-name=img",
                          "--blockdev", f"driver=file,filename={log},node-name=log",
                          "--blockdev", "driver=blklogwrites,file=img,log=log,log-sector-size=512,node-name=bl",
                          "--export", f"type=fuse,id=e,node-name=bl,mountpoint={mnt},writable=on"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(100):
            with open("/proc/mounts") as f:
                if str(mnt) in f.read():
                    break
            if p.poll() is not None:
                pytest.skip(f"qemu-storage-daemon cannot export through FUSE here: {p.stdout.read()[-300:]}")
            time.sleep(0.05)
        else:
            pytest.skip("the FUSE export did not appear")
        r = subprocess.run([pl_writer, "psync", str(mnt), "7", "60"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    finally:
        p.terminate()
        p.wait(timeout=30)
    return str(log), str(img), replay.parse_journal(r.stdout.splitlines(), "psync")


def test_replay_of_a_real_store_log_is_clean(logged_run):
    log, img, journal = logged_run
    tap, summary, failures = replay.replay(Log(log), journal, "psync", crash_states=600, disk=img)
    assert all(ok for ok, _ in tap), [t for t in tap if not t[0]] + failures
    assert summary["flush_points"] > 100 and summary["crash_states"] >= 600
    assert summary["recovered"] > 0 and summary["keys_required"] > 0


def _drop_flushes(lg: Log, first_is, then_is) -> int:
    """Take out every flush that separates an epoch matching first_is from one matching then_is
    (what a store that skipped that flush would have left); returns how many."""
    eps = lg.epochs()
    drop = {f for (a, f), (b, _) in zip(eps, eps[1:]) if a and b and first_is(a) and then_is(b)}
    lg.entries = [e for e in lg.entries if e.idx not in drop]
    return len(drop)


def _is_records(ws):
    return all(16 <= e.sector < 2048 for e in ws)       # the slot table (data starts at 1 MiB)


def _is_data(ws):
    return all(2048 <= e.sector < (64 << 20) // SECTOR for e in ws)


@pytest.mark.parametrize("flush,first_is,then_is", [
    ("data before the commit records", _is_data, _is_records),
    ("evicted slots' empty records before their new data", _is_records, _is_data),
])
def test_replay_finds_a_missing_flush(logged_run, flush, first_is, then_is):
    log, _, journal = logged_run
    lg = Log(log)
    assert LOG_FLUSH and _drop_flushes(lg, first_is, then_is) > 5, f"no flush of {flush} in the log"
    tap, summary, failures = replay.replay(lg, journal, "psync", crash_states=500, recover_every=0)
    assert summary["wrong"] + summary["stale"] > 0 and summary["unclean"] > 0, (flush, summary)
    assert not all(ok for ok, _ in tap) and failures
