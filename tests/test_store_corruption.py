"""Damaged bytes on disk are detected, never served, reported by check() and repaired."""
import errno

import pytest

from tutti import CorruptBlockError, PagedBuffer, Store
from tutti._tutti import ffi, lib


def _fill(store, rng, n):
    blocks = {f"block-{i}": rng.randbytes(store.block_bytes) for i in range(n)}
    for key, data in blocks.items():
        store.put(key, data)
    return blocks


def _corrupt_object(store, flip_byte, slot, layer, span, delta=123):
    member, off = store.locate(slot, layer, span)
    flip_byte(store.paths[member], off + delta)


def _record_offset(path, slot):
    """Byte offset of slot's record, from the superblock's table_off."""
    with open(path, "rb") as f:
        raw = f.read(lib.TT_SB_SIZE)
    sb = ffi.from_buffer("struct tt_superblock *", raw)
    return sb.table_off + slot * lib.TT_RECORD_SIZE


@pytest.mark.parametrize("n_members", [1, 2])
def test_locate_matches_bytes_on_disk(make_store, tiny_fp, rng, n_members):
    paths = make_store(tiny_fp, n_slots=16, n_members=n_members, stripe_objs=4)
    with Store.open(paths) as s:
        blocks = _fill(s, rng, 5)
        g = s.geometry
        located = {s.locate(slot, layer, span) for slot in range(g.n_slots)
                   for layer in range(g.n_layers) for span in range(g.n_spans)}
        # Every object has its own place, and striping spreads them over all members.
        assert len(located) == g.n_slots * g.n_layers * g.n_spans
        assert {member for member, _ in located} == set(range(n_members))
        files = [open(p, "rb").read() for p in paths]
        for key, slot in zip(blocks, s.lookup(blocks)):
            for layer in range(g.n_layers):
                for span in range(g.n_spans):
                    idx = layer * g.n_spans + span
                    # RAID-0 over the object sequence ordered (layer, span, slot).
                    seq = idx * g.n_slots + slot
                    unit = seq // g.stripe_objs
                    member = unit % g.n_members
                    off = g.data_off + ((unit // g.n_members) * g.stripe_objs
                                        + seq % g.stripe_objs) * g.obj_stride
                    assert s.locate(slot, layer, span) == (member, off)
                    expect = blocks[key][idx * g.span_bytes:(idx + 1) * g.span_bytes]
                    assert files[member][off:off + g.span_bytes] == expect, (key, layer, span)


def test_locate_single_member_default_stripe(make_store, llama_fp):
    with Store.open(make_store(llama_fp, n_slots=8)) as s:
        g = s.geometry
        for slot, layer, span in [(0, 0, 0), (7, 0, 1), (3, 31, 1), (5, 12, 0)]:
            off = g.data_off + ((layer * g.n_spans + span) * g.n_slots + slot) * g.obj_stride
            assert s.locate(slot, layer, span) == (0, off)


def test_corrupt_block_is_never_served(make_store, tiny_fp, flip_byte, rng):
    with Store.open(make_store(tiny_fp, n_slots=16)) as s:
        blocks = _fill(s, rng, 4)
        slot = s.lookup(["block-2"])[0]
        _corrupt_object(s, flip_byte, slot, layer=3, span=1)
        with pytest.raises(CorruptBlockError) as exc:
            s.get("block-2")
        assert exc.value.errno == errno.EBADMSG
        with pytest.raises(KeyError):
            s.get("block-2")  # dropped
        assert s.stats()["corrupt_blocks"] == 1
        assert s.info()["n_committed"] == 3
        for key in ("block-0", "block-1", "block-3"):
            assert s.get(key) == blocks[key]
        s.put("block-2", blocks["block-2"])  # the key can be stored again
        assert s.get("block-2") == blocks["block-2"]


def test_layerwise_read_reports_corrupt_block(make_store, tiny_fp, flip_byte, rng):
    with Store.open(make_store(tiny_fp, n_slots=16)) as s, \
            PagedBuffer.for_geometry(s.geometry, 3) as buf:
        blocks = _fill(s, rng, 3)
        slots = s.lookup(blocks)
        _corrupt_object(s, flip_byte, slots[1], layer=0, span=0, delta=0)
        with s.read(slots) as txn:
            for layer in range(s.geometry.n_layers):
                txn.layer(layer, buf, [2, 1, 0])
            statuses = txn.finish()
        assert statuses == [0, -errno.EBADMSG, 0]
        assert buf.contiguous_block(2) == blocks["block-0"]
        assert buf.contiguous_block(0) == blocks["block-2"]
        assert s.lookup(blocks) == [slots[0], None, slots[2]]


def test_check_reports_and_repairs_bad_slots(make_store, tiny_fp, flip_byte, rng):
    with Store.open(make_store(tiny_fp, n_slots=16)) as s:
        blocks = _fill(s, rng, 6)
        slots = dict(zip(blocks, s.lookup(blocks)))
        bad = sorted([slots["block-1"], slots["block-4"]])
        _corrupt_object(s, flip_byte, slots["block-1"], layer=2, span=0)
        _corrupt_object(s, flip_byte, slots["block-4"], layer=0, span=1, delta=4095)

        done = []
        res = s.check(chunk=4, progress=done.append)
        assert done == [4, 8, 12, 16]
        assert (res["checked"], res["ok"], res["bad"], res["bad_records"]) == (6, 4, 2, 0)
        assert sorted(res["bad_slots"]) == bad
        assert res["repaired"] == 0
        assert s.check(first=bad[0], count=1)["bad_slots"] == [bad[0]]

        res = s.check(repair=True)
        assert res["bad"] == 2 and res["repaired"] == 2
        res = s.check()
        assert (res["checked"], res["bad"], res["bad_slots"]) == (4, 0, [])
        assert "block-1" not in s and "block-4" not in s
        for key in ("block-0", "block-2", "block-3", "block-5"):
            assert s.get(key) == blocks[key]


def test_damaged_record_is_reported_and_repaired(make_store, tiny_fp, flip_byte, rng):
    paths = make_store(tiny_fp, n_slots=16)
    with Store.open(paths) as s:
        blocks = _fill(s, rng, 4)
        slot = s.lookup(["block-3"])[0]
    flip_byte(paths[0], _record_offset(paths[0], slot) + 20)

    with Store.open(paths) as s:
        info = s.info()
        assert info["n_bad_records"] == 1
        assert info["n_committed"] == 3
        assert "block-3" not in s
        res = s.check()
        assert res["bad_records"] == 1
        res = s.check(repair=True)
        assert res["repaired"] >= 1
        for key in ("block-0", "block-1", "block-2"):
            assert s.get(key) == blocks[key]

    with Store.open(paths) as s:
        assert s.info()["n_bad_records"] == 0
        res = s.check()
        assert (res["bad"], res["bad_records"]) == (0, 0)
        assert s.info()["n_free"] == 13


@pytest.mark.parametrize("where", ["tmp", "shm"])
@pytest.mark.parametrize("cpu_threads", [1, 4])
def test_checksums_on_several_threads(make_store, tmp_path, llama_fp, flip_byte, rng, where, cpu_threads):
    """Layers of 1 MiB and more are hashed by the store's threads (and, on tmpfs or in the page cache, read by
    io_uring's workers): the sums committed match a whole-store check's, and a damaged object fails exactly
    its block, whichever thread hashed it."""
    import os
    import shutil
    import tempfile

    if where == "shm":
        if not os.path.isdir("/dev/shm"):
            pytest.skip("no /dev/shm on this machine")
        d = tempfile.mkdtemp(dir="/dev/shm", prefix="tutti-test-")
        paths = [os.path.join(d, "s.img")]
        Store.format(paths, llama_fp, n_slots=32)
    else:
        d, paths = None, make_store(llama_fp, n_slots=32)
    n = 24  # 24 blocks x 2 spans x 32 KiB = 1.5 MiB a layer
    keys = [f"req-{i}" for i in range(n)]
    try:
        with Store.open(paths, cpu_threads=cpu_threads) as s, \
                PagedBuffer.for_geometry(s.geometry, n) as src, PagedBuffer.for_geometry(s.geometry, n) as dst:
            ids = rng.sample(range(n), n)
            src.fill_random(ids, seed=rng.random())
            with s.write(keys) as txn:
                for layer in range(s.geometry.n_layers):
                    txn.layer(layer, src, ids)
                assert txn.finish() == [0] * n
            res = s.check()
            assert (res["checked"], res["bad"]) == (n, 0)  # every committed sum is the bytes' own
            slots = s.lookup(keys)
            _corrupt_object(s, flip_byte, slots[3], layer=5, span=1)
            _corrupt_object(s, flip_byte, slots[17], layer=31, span=0, delta=32767)
            out = rng.sample(range(n), n)
            with s.read(slots) as rd:
                for layer in range(s.geometry.n_layers):
                    rd.layer(layer, dst, out)
                    if layer:
                        rd.wait_layer(layer - 1)
                statuses = rd.finish()
            want = [-errno.EBADMSG if i in (3, 17) else 0 for i in range(n)]
            assert statuses == want
            for i in range(n):
                if i not in (3, 17):
                    assert dst.contiguous_block(out[i]) == src.contiguous_block(ids[i]), i
            assert s.lookup([keys[3], keys[17], keys[0]]) == [None, None, slots[0]]
    finally:
        if d:
            shutil.rmtree(d, ignore_errors=True)
