"""KV blocks go in and come back bit-exact, in the Llama-3-8B geometry.

Llama-3-8B with 16-token bf16 blocks: 32 layers x 2 spans (K, V) of
16 * 8 * 128 * 2 = 32 KiB, so one block is 2 MiB.
"""
import errno
import json
import mmap
import os

import pytest

from tutti import PagedBuffer, Store

N_SLOTS = 24


@pytest.fixture(params=[1, 2], ids=["1-member", "2-members"])
def llama_store(request, make_store, llama_fp):
    """Paths of an empty Llama-3-8B store of 1 member or striped over 2 files."""
    return make_store(llama_fp, n_slots=N_SLOTS, n_members=request.param)


def test_llama3_8b_geometry(llama_store):
    with Store.open(llama_store) as s:
        g = s.geometry
        assert (g.n_layers, g.n_spans, g.span_bytes) == (32, 2, 32 << 10)
        assert g.obj_stride == 32 << 10
        assert s.block_bytes == 2 << 20
        assert g.n_slots == N_SLOTS and g.n_members == len(llama_store)
        info = s.info()
        assert json.loads(json.dumps(info)) == info
        assert info["n_committed"] == 0 and info["n_free"] == N_SLOTS


def test_put_get_roundtrip(llama_store, rng):
    blocks = {f"prefix-{i}": rng.randbytes(2 << 20) for i in range(12)}
    with Store.open(llama_store) as s:
        for key, data in blocks.items():
            s.put(key, data)
        slots = s.lookup(blocks)
        assert None not in slots and len(set(slots)) == len(blocks)
        for key, data in blocks.items():
            assert s.get(key) == data
        assert s.info()["n_committed"] == len(blocks)
        st = s.stats()
        assert st["commits"] == len(blocks) and st["blocks_written"] == len(blocks)


def test_block_sums_match_the_committed_record(make_store, llama_fp, rng):
    """What a cluster peer checks received bytes with: block_sum() and copy_block_sum() (which also copies)
    give the data_sum the commit recorded; one flipped bit gives another; wrong sizes and a read-only
    destination are refused."""
    paths = make_store(llama_fp, n_slots=4)
    data = bytearray(rng.randbytes(2 << 20))
    with Store.open(paths) as s:
        s.put("k", data)
        want = s.slot_record(s.lookup(["k"])[0])["data_sum"]
        assert s.block_sum(data) == want
        dst = bytearray(len(data))
        assert s.copy_block_sum(dst, memoryview(data)) == want and dst == data
        data[12345] ^= 0x10
        assert s.copy_block_sum(dst, data) != want and dst == data
        with pytest.raises(ValueError, match="bytes"):
            s.copy_block_sum(bytearray(len(data) - 1), data)
        with pytest.raises(TypeError, match="writable"):
            s.copy_block_sum(bytes(len(data)), data)


def test_put_accepts_any_buffer(make_store, llama_fp, rng):
    """bytes, bytearray, an unaligned memoryview and an mmap are all stored exactly."""
    paths = make_store(llama_fp, n_slots=8)
    size = 2 << 20
    raw = bytearray(rng.randbytes(size + 1))
    anon = mmap.mmap(-1, size)
    anon[:] = rng.randbytes(size)
    buffers = {
        "bytes": rng.randbytes(size),
        "bytearray": bytearray(rng.randbytes(size)),
        "unaligned-memoryview": memoryview(raw)[1:],
        "mmap": anon,
    }
    with Store.open(paths) as s:
        for key, buf in buffers.items():
            s.put(key, buf)
        for key, buf in buffers.items():
            assert s.get(key) == bytes(buf), key
        out = bytearray(size)
        s.readinto("mmap", out)
        assert out == anon[:]
    anon.close()


@pytest.mark.parametrize("engine", ["uring", "psync"])
def test_layerwise_roundtrip(llama_store, rng, engine):
    """Write from, and read into, a paged buffer with shuffled block ids."""
    n_keys, n_blocks = 8, 12
    keys = [f"req-{i}" for i in range(n_keys)]
    with Store.open(llama_store, engine=engine) as s, \
            PagedBuffer.for_geometry(s.geometry, n_blocks) as src, \
            PagedBuffer.for_geometry(s.geometry, n_blocks) as dst:
        assert s.engine == engine
        assert src.register(s) == s.geometry.n_layers * s.geometry.n_spans
        ids = rng.sample(range(n_blocks), n_keys)
        src.fill_random(ids, seed=rng.random())
        with s.write(keys) as txn:
            assert txn.present == [False] * n_keys
            assert len(set(txn.slots)) == n_keys
            for layer in range(s.geometry.n_layers):
                txn.layer(layer, src, ids)
            for layer in range(s.geometry.n_layers):
                txn.wait_layer(layer)
            assert txn.finish() == [0] * n_keys
        assert s.lookup(keys) == txn.slots

        for key, b in zip(keys, ids):
            assert s.get(key) == src.contiguous_block(b), key

        out_ids = rng.sample(range(n_blocks), n_keys)
        with s.read(s.lookup(keys)) as rd:
            for layer in range(s.geometry.n_layers):
                rd.layer(layer, dst, out_ids)
                rd.wait_layer(layer)
            assert rd.finish() == [0] * n_keys
        for b_in, b_out in zip(ids, out_ids):
            assert dst.contiguous_block(b_out) == src.contiguous_block(b_in)


def test_layerwise_strided_memory(make_store, tiny_fp, rng):
    """Blocks need not be packed: a block stride larger than the object works both ways."""
    paths = make_store(tiny_fp, n_slots=8)
    with Store.open(paths) as s:
        g = s.geometry
        stride = g.span_bytes * 3 + 512
        with PagedBuffer.for_geometry(g, 5, block_stride=stride) as src, \
                PagedBuffer.for_geometry(g, 5, block_stride=stride) as dst:
            src.fill_random(range(5), seed=3)
            with s.write(["a", "b", "c"]) as txn:
                for layer in range(g.n_layers):
                    txn.layer(layer, src, [4, 0, 2])
            assert [s.get(k) for k in ("a", "b", "c")] == [src.contiguous_block(b) for b in (4, 0, 2)]
            with s.read(s.lookup(["a", "b", "c"])) as txn:
                for layer in range(g.n_layers):
                    txn.layer(layer, dst.memmap, [1, 3, 0])
            assert [dst.contiguous_block(b) for b in (1, 3, 0)] == [s.get(k) for k in ("a", "b", "c")]


def test_reopen_keeps_everything(llama_store, llama_fp, rng):
    blocks = {os.urandom(16): rng.randbytes(2 << 20) for _ in range(6)}
    with Store.open(llama_store) as s:
        for key, data in blocks.items():
            s.put(key, data)
        uuid, slots = s.uuid, s.lookup(blocks)
    with Store.open(list(reversed(llama_store)), expect=llama_fp) as s:
        assert s.uuid == uuid
        assert s.fingerprint == llama_fp
        assert s.info()["n_committed"] == len(blocks)
        assert s.lookup(blocks) == slots
        for key, data in blocks.items():
            assert s.get(key) == data


def test_lru_eviction_when_full(make_store, llama_fp, rng):
    """A full store evicts its least recently used block; lookups refresh recency."""
    paths = make_store(llama_fp, n_slots=8)
    data = {f"k{i}": rng.randbytes(2 << 20) for i in range(10)}
    with Store.open(paths) as s:
        for i in range(8):
            s.put(f"k{i}", data[f"k{i}"])
        s.put("k8", data["k8"])
        assert "k0" not in s  # oldest
        assert s.get("k8") == data["k8"]  # newest
        assert s.stats()["evictions"] == 1

        assert s.lookup(["k1"]) != [None]  # k1 becomes most recently used
        s.put("k9", data["k9"])
        assert "k2" not in s and "k1" in s
        for i in [1, 3, 4, 5, 6, 7, 8, 9]:
            assert s.get(f"k{i}") == data[f"k{i}"], i

    with Store.open(paths) as s:  # recency restarts from commit order at open
        s.put("k0", data["k0"])
        assert "k1" not in s
        assert s.get("k0") == data["k0"] and s.get("k3") == data["k3"]


def test_present_keys_are_skipped(make_store, llama_fp, rng):
    paths = make_store(llama_fp, n_slots=8)
    old = rng.randbytes(2 << 20)
    with Store.open(paths) as s, PagedBuffer.for_geometry(s.geometry, 2) as buf:
        s.put("stored", old)
        s.put("stored", rng.randbytes(2 << 20))  # no error, no change
        assert s.get("stored") == old
        written = s.stats()["blocks_written"]

        buf.fill_random([0, 1], seed=7)
        with s.write(["stored", "new"]) as txn:
            assert txn.present == [True, False]
            assert txn.slots[0] == s.lookup(["stored"])[0]
            for layer in range(s.geometry.n_layers):
                txn.layer(layer, buf, [0, 1])
            statuses = txn.finish()
        assert statuses == [0, 0]
        assert s.get("stored") == old
        assert s.get("new") == buf.contiguous_block(1)
        assert s.stats()["blocks_written"] == written + 1


def test_aborted_write_commits_nothing(make_store, tiny_fp):
    paths = make_store(tiny_fp, n_slots=4)
    with Store.open(paths) as s, PagedBuffer.for_geometry(s.geometry, 1) as buf:
        with pytest.raises(RuntimeError):
            with s.write(["k"]) as txn:
                txn.layer(0, buf, [0])
                raise RuntimeError("caller failed mid-transfer")
        assert "k" not in s
        with s.write(["k"]) as txn:  # finished on a clean exit
            for layer in range(s.geometry.n_layers):
                txn.layer(layer, buf, [0])
        assert s.get("k") == buf.contiguous_block(0)


def test_unsubmitted_layer_is_not_committed(make_store, tiny_fp):
    paths = make_store(tiny_fp, n_slots=4)
    with Store.open(paths) as s, PagedBuffer.for_geometry(s.geometry, 1) as buf:
        txn = s.write(["partial"])
        txn.layer(0, buf, [0])
        assert txn.finish() == [-errno.ENODATA]
        assert "partial" not in s
        assert s.info()["n_free"] == 4
