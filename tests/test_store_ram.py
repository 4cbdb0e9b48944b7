"""A store on tmpfs: its members are mapped and large layers are copied by the store's threads with memcpy.

What must hold there as anywhere: bytes exact in both directions, counted, and a tmpfs that runs out of
space fails the saves that needed it with ENOSPC (a page tmpfs cannot supply must be an error, never a
SIGBUS that kills the serving process), the store opening and checking clean afterwards.
"""
import errno
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from tutti import PagedBuffer, Store


@pytest.fixture
def shm_dir():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this machine")
    d = tempfile.mkdtemp(dir="/dev/shm", prefix="tutti-test-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _layers(s, txn, buf, ids, wait=False):
    for layer in range(s.geometry.n_layers):
        txn.layer(layer, buf, ids)
        if wait and layer:
            txn.wait_layer(layer - 1)


@pytest.mark.parametrize("n_members", [1, 2])
def test_ram_members_exact_and_counted(shm_dir, llama_fp, rng, n_members):
    paths = [os.path.join(shm_dir, f"m{i}.img") for i in range(n_members)]
    Store.format(paths, llama_fp, n_slots=48)
    n = 24  # 24 blocks x 2 spans x 32 KiB = 1.5 MiB a layer: the store's threads move it
    keys = [f"ram-{i}" for i in range(n)]
    with Store.open(paths, cpu_threads=4) as s, \
            PagedBuffer.for_geometry(s.geometry, n) as src, PagedBuffer.for_geometry(s.geometry, n) as dst:
        before = s.stats()
        ids = rng.sample(range(n), n)
        src.fill_random(ids, seed=rng.random())
        with s.write(keys) as txn:
            _layers(s, txn, src, ids)
            assert txn.finish() == [0] * n
        after = s.stats()
        moved = n * s.block_bytes
        wrote = after["engine"]["bytes_written"] - before["engine"]["bytes_written"]
        assert moved <= wrote <= moved + (1 << 20)  # the data, then the slot table's pages
        # What the map wrote is what the file holds: a check reads every object with pread.
        res = s.check()
        assert (res["checked"], res["bad"]) == (n, 0)
        out = rng.sample(range(n), n)
        with s.read(s.lookup(keys)) as rd:
            _layers(s, rd, dst, out, wait=True)
            assert rd.finish() == [0] * n
        for i in range(n):
            assert dst.contiguous_block(out[i]) == src.contiguous_block(ids[i]), i
        assert s.stats()["engine"]["bytes_read"] - after["engine"]["bytes_read"] >= moved
        want = src.contiguous_block(ids[5])
    with Store.open(paths) as s:  # and after a reopen
        assert s.check()["bad"] == 0
        assert s.get(keys[5]) == want


@pytest.mark.parametrize("stream", ["", "0"])
def test_own_pages_read_through_the_map_are_still_checked(shm_dir, llama_fp, rng, flip_byte, monkeypatch, stream):
    """Reads of the pages this process's writes mapped are hashed where they lie and streamed to the
    buffer (TUTTI_TMPFS_NT, default on) or memcpy'd then hashed (=0): a byte changed in the file since
    is caught either way, and only that block fails."""
    monkeypatch.setenv("TUTTI_TMPFS_NT", stream)
    paths = [os.path.join(shm_dir, "s.img")]
    Store.format(paths, llama_fp, n_slots=48)
    n = 24  # 1.5 MiB a layer: the store's threads read it
    keys = [f"own-{i}" for i in range(n)]
    with Store.open(paths, cpu_threads=4) as s, \
            PagedBuffer.for_geometry(s.geometry, n) as src, PagedBuffer.for_geometry(s.geometry, n) as dst:
        ids = rng.sample(range(n), n)
        src.fill_random(ids, seed=rng.random())
        with s.write(keys) as txn:
            _layers(s, txn, src, ids)
            assert txn.finish() == [0] * n
        slots = s.lookup(keys)
        member, off = s.locate(slots[5], 17, 1)
        flip_byte(paths[member], off + 4099)
        out = rng.sample(range(n), n)
        dst.fill_random(out, seed=1.5)
        with s.read(slots) as rd:
            _layers(s, rd, dst, out, wait=True)
            statuses = rd.finish()
        assert statuses == [0] * 5 + [-errno.EBADMSG] + [0] * (n - 6)
        for i in range(n):
            if i != 5:
                assert dst.contiguous_block(out[i]) == src.contiguous_block(ids[i]), i
        assert s.lookup(keys)[5] is None and s.stats()["corrupt_blocks"] == 1


def _swap_on() -> bool:
    with open("/proc/swaps") as f:
        return len(f.read().splitlines()) > 1


def _own_pages_calls(shm_dir, llama_fp, rng, monkeypatch, populate):
    """System calls of: a save to a store exactly its size, its retrieve, a second save of other keys (the LRU
    gives it the same slots, so the same pages), its retrieve. Bytes checked after each retrieve."""
    monkeypatch.setenv("TUTTI_TMPFS_POPULATE", populate)
    paths = [os.path.join(shm_dir, f"s{populate or 0}.img")]
    n = 24  # 24 blocks x 2 spans x 32 KiB = 1.5 MiB a layer: the store's threads move it
    Store.format(paths, llama_fp, n_slots=n)
    calls = []
    with Store.open(paths, cpu_threads=4) as s, \
            PagedBuffer.for_geometry(s.geometry, n) as src, PagedBuffer.for_geometry(s.geometry, n) as dst:
        slots_seen = []
        for round_ in range(2):
            keys = [f"pop-{round_}-{i}" for i in range(n)]
            ids = rng.sample(range(n), n)
            src.fill_random(ids, seed=rng.random())
            before = s.stats()["engine"]["syscalls"]
            with s.write(keys) as txn:
                _layers(s, txn, src, ids)
                assert txn.finish() == [0] * n
            calls.append(s.stats()["engine"]["syscalls"] - before)
            slots = s.lookup(keys)
            slots_seen.append(sorted(slots))
            out = rng.sample(range(n), n)
            dst.fill_random(out, seed=round_ + 0.5)
            before = s.stats()["engine"]["syscalls"]
            with s.read(slots) as rd:
                _layers(s, rd, dst, out, wait=True)
                assert rd.finish() == [0] * n
            calls.append(s.stats()["engine"]["syscalls"] - before)
            for i in range(n):
                assert dst.contiguous_block(out[i]) == src.contiguous_block(ids[i]), (round_, i)
        assert slots_seen[0] == slots_seen[1]  # the second save rewrote the first one's pages
    shutil.rmtree(shm_dir, ignore_errors=True)
    os.makedirs(shm_dir)
    return calls


def test_own_pages_need_no_populate_without_swap(shm_dir, llama_fp, rng, monkeypatch):
    """Without swap a page this process's writes made present stays in memory and mapped: its reads and
    rewrites through the mapping skip MADV_POPULATE_* (the populate's page walk marked every page accessed,
    which made the first read of freshly written pages ~0.8x later ones). TUTTI_TMPFS_POPULATE=1 keeps it.
    Bytes exact either way."""
    if _swap_on():
        pytest.skip("this machine has swap: the engine populates every run (the rule under test is for no swap)")
    w1, r1, w2, r2 = _own_pages_calls(shm_dir, llama_fp, rng, monkeypatch, "")
    kw1, kr1, kw2, kr2 = _own_pages_calls(shm_dir, llama_fp, rng, monkeypatch, "1")
    assert r1 == 0 and r2 == 0, (r1, r2)       # reads of own pages: no call at all
    assert kr1 > 0 and kr2 > 0, (kr1, kr2)     # kept: a populate a run
    assert w1 == kw1                           # first save: pages not yet this process's, populated either way
    assert w2 < kw2, (w2, kw2)                 # the rewrite of own pages skips it; kept, it does not
    assert kw2 - w2 == kr2                     # as many populates as the reads had runs


CHILD = textwrap.dedent("""
    import errno, json, os, random, sys
    from tutti import LLAMA3_8B, PagedBuffer, Store

    d = sys.argv[1]
    paths = [os.path.join(d, "s.img")]
    try:                                                # 128 MiB of slots on an 8 MiB tmpfs
        Store.format(paths, LLAMA3_8B, n_slots=64)
        out = {"prealloc": "formatted"}
    except OSError as e:
        out = {"prealloc": [e.errno, "not enough space" in str(e), os.path.exists(paths[0])]}
    Store.format(paths, LLAMA3_8B, n_slots=64, preallocate=False)  # sparse: the space is found short at saves
    n = 24
    with Store.open(paths, cpu_threads=4) as s, PagedBuffer.for_geometry(s.geometry, n) as src:
        ids = list(range(n))
        src.fill_random(ids, seed=1)
        with s.write([f"k{i}" for i in range(n)]) as txn:
            for layer in range(s.geometry.n_layers):
                txn.layer(layer, src, ids)
            out["statuses"] = txn.finish()
        out["committed"] = s.info()["n_committed"]
    with Store.open(paths) as s:
        res = s.check()
        out["check"] = [res["checked"], res["bad"], res["bad_records"]]
    print("RESULT " + json.dumps(out))
""")


def test_full_tmpfs_fails_saves_not_the_process(tmp_path):
    """A store on a tmpfs smaller than the store: format refuses it (the default reserves the space);
    formatted sparse, the save that finds no space fails with ENOSPC."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to mount a small tmpfs of its own")
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=8m tmpfs {mnt}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()}")
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size=8m tmpfs "{mnt}" && exec "{sys.executable}" '
         f'"{script}" "{mnt}"'], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])  # -7 would be SIGBUS
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout
    import json
    out = json.loads(line[0][len("RESULT "):])
    # Reserved at format: refused there, with the reason, and the file it created is gone.
    assert out["prealloc"] == [errno.ENOSPC, True, False], out
    # 24 blocks of 2 MiB cannot fit in 8 MiB: every block has a layer that found no space.
    assert set(out["statuses"]) == {-errno.ENOSPC}, out
    assert out["committed"] == 0
    assert out["check"] == [0, 0, 0]
