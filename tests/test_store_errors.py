"""Bad input gets a clear error and changes nothing on disk."""
import errno
import os
from dataclasses import replace

import pytest

from tutti import FingerprintMismatch, PagedBuffer, Store, StoreBusyError, TuttiError


def test_device_too_small(loop_device, file_digest, tiny_fp):
    dev = loop_device(4 << 20)
    before = file_digest(dev)
    with pytest.raises(TuttiError) as exc:
        Store.format([dev], tiny_fp, n_slots=1000)
    assert exc.value.errno == errno.ENOSPC
    assert "too small" in exc.value.strerror
    assert file_digest(dev) == before


def test_block_device_fills_itself(loop_device, tiny_fp, rng):
    """Without a size a device gets as many slots as fit, and works."""
    dev = loop_device(8 << 20)
    Store.format([dev], tiny_fp)
    with Store.open([dev]) as s:
        g = s.geometry
        assert g.n_slots > 0
        assert g.data_off + g.n_slots * g.slot_bytes <= 8 << 20
        data = rng.randbytes(s.block_bytes)
        s.put("k", data)
        assert s.get("k") == data


def test_file_needs_a_size_and_is_not_left_behind(tmp_path, tiny_fp):
    path = tmp_path / "new.img"
    with pytest.raises(TuttiError) as exc:
        Store.format([str(path)], tiny_fp)
    assert exc.value.errno == errno.EINVAL
    assert not path.exists()


@pytest.mark.parametrize("content", ["random", "zeros", "short"])
def test_not_a_store(tmp_path, file_digest, tiny_fp, content):
    path = tmp_path / "junk.img"
    data = {"random": os.urandom(4 << 20), "zeros": bytes(4 << 20), "short": b"TUTTIKV1"}[content]
    path.write_bytes(data)
    before = file_digest(path)
    with pytest.raises(TuttiError) as exc:
        Store.open([str(path)])
    assert exc.value.errno == errno.EINVAL
    assert "not a Tutti store" in exc.value.strerror
    assert file_digest(path) == before


def test_one_damaged_superblock_copy_is_tolerated(make_store, flip_byte):
    paths = make_store()
    flip_byte(paths[0], 100)  # inside copy A
    with Store.open(paths) as s:
        assert s.geometry.n_slots == 16


def test_both_superblock_copies_damaged(make_store, flip_byte, file_digest):
    paths = make_store()
    flip_byte(paths[0], 100)
    flip_byte(paths[0], 4096 + 100)
    before = file_digest(paths[0])
    with pytest.raises(TuttiError) as exc:
        Store.open(paths)
    assert exc.value.errno == errno.EINVAL
    assert "damaged" in exc.value.strerror
    assert file_digest(paths[0]) == before


def test_truncated_member(make_store, file_digest):
    paths = make_store(n_slots=64)
    size = os.path.getsize(paths[0])
    os.truncate(paths[0], size // 2)
    before = file_digest(paths[0])
    with pytest.raises(TuttiError) as exc:
        Store.open(paths)
    assert exc.value.errno == errno.EFBIG
    assert "truncated" in exc.value.strerror
    assert file_digest(paths[0]) == before


def test_missing_or_repeated_member(make_store):
    paths = make_store(n_members=2)
    with pytest.raises(TuttiError) as exc:
        Store.open(paths[:1])
    assert exc.value.errno == errno.ENODEV
    with pytest.raises(TuttiError) as exc:
        Store.open(paths + paths[:1])
    assert exc.value.errno == errno.EINVAL and "same file" in exc.value.strerror
    # The same file under another name is caught too, not mistaken for "busy".
    alias = os.path.join(os.path.dirname(paths[0]), ".", os.path.basename(paths[0]))
    assert alias != paths[0]
    with pytest.raises(TuttiError) as exc:
        Store.open([paths[0], alias])
    assert exc.value.errno == errno.EINVAL and "same file" in exc.value.strerror


@pytest.mark.parametrize("change", [dict(model_id="other/model"), dict(n_layers=5),
                                    dict(dtype="bfloat16"), dict(tp_rank=1, tp_size=2)],
                         ids=["model", "layers", "dtype", "tp"])
def test_fingerprint_mismatch(make_store, tiny_fp, change):
    paths = make_store(tiny_fp)
    with pytest.raises(FingerprintMismatch) as exc:
        Store.open(paths, expect=replace(tiny_fp, **change))
    assert exc.value.errno == errno.EMEDIUMTYPE
    with Store.open(paths, expect=tiny_fp) as s:
        assert s.fingerprint == tiny_fp


def test_missing_key(make_store):
    with Store.open(make_store()) as s:
        with pytest.raises(KeyError):
            s.get("never stored")
        assert "never stored" not in s
        assert s.lookup(["never stored"]) == [None]


def test_out_of_range_slot(make_store):
    with Store.open(make_store(n_slots=16)) as s:
        for bad in (16, 1 << 40, -2):
            with pytest.raises(TuttiError) as exc:
                s.invalidate([bad])
            assert exc.value.errno == errno.ERANGE
            with pytest.raises(TuttiError) as exc:
                s.read([bad])
            assert exc.value.errno == errno.ERANGE
        with pytest.raises(TuttiError) as exc:
            s.read([3])  # in range but empty
        assert exc.value.errno == errno.ENOENT
        with pytest.raises(TypeError):
            s.read(s.lookup(["missing"]))
        with pytest.raises(IndexError):
            s.locate(16, 0, 0)


def test_wrong_data_length(make_store, file_digest, rng):
    paths = make_store()
    before = file_digest(paths[0])
    with Store.open(paths) as s:
        for size in (0, s.block_bytes - 1, s.block_bytes + 4096):
            with pytest.raises(ValueError, match="bytes"):
                s.put("k", rng.randbytes(size))
        with pytest.raises(TypeError):
            s.put("k", "not a buffer")
        with pytest.raises(ValueError):
            s.readinto("k", bytearray(s.block_bytes // 2))
        with pytest.raises(TypeError):
            s.readinto("k", bytes(s.block_bytes))  # read-only
        assert "k" not in s
        assert s.info()["n_committed"] == 0
    assert file_digest(paths[0]) == before


def test_bad_key_type(make_store):
    with Store.open(make_store()) as s:
        with pytest.raises(TypeError, match="key"):
            s.lookup([42])


def test_mounted_block_device_is_refused(mounted_device, file_digest, tiny_fp):
    before = file_digest(mounted_device)
    with pytest.raises(StoreBusyError) as exc:
        Store.format([mounted_device], tiny_fp, force=True)
    assert "mounted" in exc.value.strerror
    assert file_digest(mounted_device) == before


def test_member_in_use_by_another_store(make_store, file_digest, tiny_fp):
    paths = make_store(tiny_fp)
    with Store.open(paths):
        before = file_digest(paths[0])
        with pytest.raises(StoreBusyError, match=r"in use \(open in another process, or in this one\)"):
            Store.open(paths)  # flock conflicts per open file: this process's own second open is refused too
        with pytest.raises(StoreBusyError):
            Store.open(paths, readonly=True)
        with pytest.raises(StoreBusyError):
            Store.format(paths, replace(tiny_fp, model_id="other/model"), n_slots=4, force=True)
        assert file_digest(paths[0]) == before


def test_format_over_existing_store_refuses(make_store, file_digest, tiny_fp, rng):
    paths = make_store(tiny_fp)
    data = rng.randbytes(32 << 10)
    with Store.open(paths) as s:
        s.put("kept", data)
        uuid = s.uuid
    before = file_digest(paths[0])
    with pytest.raises(TuttiError) as exc:
        Store.format(paths, tiny_fp, n_slots=8)
    assert exc.value.errno == errno.EEXIST
    assert "force" in exc.value.strerror
    assert file_digest(paths[0]) == before
    with Store.open(paths) as s:
        assert s.get("kept") == data

    Store.format(paths, tiny_fp, n_slots=8, force=True)
    with Store.open(paths) as s:
        assert s.uuid != uuid
        assert "kept" not in s and s.geometry.n_slots == 8


def test_readonly_store_refuses_writes(make_store, rng):
    paths = make_store()
    with Store.open(paths, readonly=True) as s:
        with pytest.raises(TuttiError) as exc:
            s.put("k", rng.randbytes(s.block_bytes))
        assert exc.value.errno == errno.EROFS
        with pytest.raises(TuttiError):
            s.write(["k"])


def test_closed_store_and_finished_txn(make_store, rng):
    s = Store.open(make_store())
    txn = s.write(["k"])
    s.close()
    s.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        s.get("k")
    with pytest.raises(ValueError, match="store closed"):
        txn.finish()


def test_bad_transfer_arguments(make_store, tiny_fp):
    with Store.open(make_store(tiny_fp)) as s, PagedBuffer.for_geometry(s.geometry, 2) as buf, \
            PagedBuffer(tiny_fp.n_layers + 1, 2, 2, s.geometry.span_bytes) as wrong_shape:
        with s.write(["a", "b"]) as txn:
            with pytest.raises(IndexError, match="outside the buffer"):
                txn.layer(0, buf, [0, 2])  # would run past the buffer
            with pytest.raises(ValueError, match="block ids"):
                txn.layer(0, buf, [0])
            with pytest.raises(TuttiError) as exc:
                txn.layer(s.geometry.n_layers, buf, [0, 1])
            assert exc.value.errno == errno.ERANGE
            with pytest.raises(TuttiError) as exc:
                txn.layer(0, wrong_shape, [0, 1])
            assert exc.value.errno == errno.EINVAL and "memory map" in exc.value.strerror
            txn.abort()
        assert s.lookup(["a", "b"]) == [None, None]


# ---------------------------------------------------------------- hostile use of the Python API


def test_a_buffer_of_smaller_objects_is_refused_not_overrun(make_store, tiny_fp):
    """The C memory map has no object size: a PagedBuffer of smaller objects would be written past its end."""
    with Store.open(make_store(tiny_fp)) as s:
        s.put("a", bytes(s.block_bytes))
        g = s.geometry
        with PagedBuffer(g.n_layers, g.n_spans, 64, 64) as small, s.read(s.lookup(["a"])) as txn:
            with pytest.raises(ValueError, match=f"objects are 64 bytes, the store's {g.span_bytes}"):
                txn.layer(0, small, [63])
            txn.abort()
        with s.write(["b"]) as txn:
            with pytest.raises(TypeError, match="PagedBuffer or a struct tt_memmap"):
                txn.layer(0, b"not a map", [0])
            txn.abort()


@pytest.mark.parametrize("call", ["lookup", "write"])
def test_one_key_where_a_list_of_keys_is_wanted_is_refused(make_store, call):
    """write("abc") used to store three blocks, "a", "b" and "c"."""
    with Store.open(make_store()) as s:
        for one in ("abc", b"abc"):
            with pytest.raises(TypeError, match=r"a list of keys, not one .*wrap it"):
                getattr(s, call)(one)
        with pytest.raises(TypeError, match="a list of keys, not NoneType"):
            getattr(s, call)(None)
        assert s.lookup(["a", "b", "c"]) == [None] * 3


def test_numbers_the_c_calls_cannot_hold_are_named_errors(make_store):
    """Not cffi's nameless OverflowError ("int too big to convert", "can't convert negative number")."""
    with Store.open(make_store(n_slots=16)) as s, PagedBuffer.for_geometry(s.geometry, 2) as buf:
        for bad in (10**30, -(10**30)):
            for call in (s.read, s.invalidate):
                with pytest.raises(TuttiError, match="out of range") as exc:
                    call([bad])
                assert exc.value.errno == errno.ERANGE
        with pytest.raises(TypeError, match="slots must be ints, got bool"):
            s.read([True])
        with s.write(["a"]) as txn:
            for layer in (-1, 1 << 40):
                for call in (lambda n=layer: txn.layer(n, buf, [0]), lambda n=layer: txn.wait_layer(n)):
                    with pytest.raises(TuttiError, match=f"layer {layer} out of range") as exc:
                        call()
                    assert exc.value.errno == errno.ERANGE
            with pytest.raises(TypeError, match="layer must be an int, not str"):
                txn.layer("0", buf, [0])
            with pytest.raises(TuttiError, match="block -1 out of range") as exc:
                txn.veto(-1)
            assert exc.value.errno == errno.EINVAL
            txn.abort()
        for kw, match in (({"first": "0"}, "first must be an int"), ({"count": -5}, "count must be >= 0"),
                          ({"chunk": 0}, "chunk must be >= 1")):
            with pytest.raises((TypeError, ValueError), match=match):
                s.check(**kw)
        assert s.check(chunk=10**12)["checked"] == 0  # a huge chunk is no huge buffer
        with pytest.raises(ValueError, match="chunk must be >= 1"):
            s.committed(chunk=0)
        with pytest.raises(TypeError, match="fault rules must be a str"):
            s.set_faults(None)


def test_bad_format_and_open_arguments_are_named(tmp_path, make_store, tiny_fp):
    p = str(tmp_path / "s.img")
    for kw, err, match in (
            ({"n_slots": -1}, ValueError, "n_slots -1 is out of range"),
            ({"n_slots": 1 << 70}, ValueError, "n_slots .* is out of range"),
            ({"n_slots": "4"}, TypeError, "n_slots must be an int"),
            ({"capacity_bytes": -1}, ValueError, "capacity_bytes -1 is out of range"),
            ({"capacity_bytes": float("nan")}, TypeError, "capacity_bytes must be an int"),
            ({"n_slots": 4, "n_spans": -1}, ValueError, "n_spans -1 is out of range")):
        with pytest.raises(err, match=match):
            Store.format([p], tiny_fp, **kw)
    with pytest.raises(TypeError, match="must be a tutti.Fingerprint, not dict"):
        Store.format([p], tiny_fp.to_dict(), n_slots=4)
    with pytest.raises(TypeError, match="member paths"):
        Store.format([None], tiny_fp, n_slots=4)
    assert not os.path.exists(p)
    paths = make_store(tiny_fp)
    with pytest.raises(TypeError, match="engine must be a str"):
        Store.open(paths, engine=None)
    with pytest.raises(ValueError, match="queue_depth -1 is out of range"):
        Store.open(paths, queue_depth=-1)
    with pytest.raises(TypeError, match="must be a tutti.Fingerprint"):
        Store.open(paths, expect={"n_layers": 4})
    with pytest.raises(TypeError, match="path must be"):
        Store.probe(None)
    assert Store.probe(os.fsencode(paths[0]))["path"] == paths[0]


@pytest.mark.parametrize("field,value,err", [
    ("model_id", 5, TypeError), ("dtype", None, TypeError), ("n_layers", 2.0, TypeError),
    ("n_layers", float("nan"), TypeError), ("head_dim", "64", TypeError), ("kv_heads", True, TypeError),
    ("model_id", "a\0b", ValueError), ("dtype", "float16\0x", ValueError),
])
def test_fingerprint_refuses_values_it_cannot_keep(tiny_fp, field, value, err):
    """A NUL would end the C string: "a\\0b" would be kept as "a", one identity for two models."""
    with pytest.raises(err, match=f"fingerprint: {field}"):
        replace(tiny_fp, **{field: value})


def test_a_store_shared_by_threads_is_serialised_not_a_crash(make_store):
    """The C handle is not thread-safe: two threads in it at once crashed the process (SIGSEGV) or hung it."""
    import subprocess
    import sys

    paths = make_store(n_slots=32)
    code = f"""
import threading
from tutti import Store
s = Store.open({paths!r})
bad = []
def worker(t):
    for i in range(150):
        k = f"{{t}}-{{i % 40}}".encode()
        d = (k * s.block_bytes)[:s.block_bytes]
        s.put(k, d)
        try:
            if s.get(k) != d:
                bad.append(k)
        except KeyError:
            pass  # evicted by another thread's put
        with s.read([x for x in s.lookup([k]) if x is not None]) as txn:
            txn.finish()
ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
assert not bad, bad
assert s.check()["bad"] == 0
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])
