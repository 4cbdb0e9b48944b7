"""The store under I/O faults, from Python and tutti-admin (issue 12).

An I/O error fails the blocks it touched and is reported as an I/O error
(never as corruption, never silently with verification off), a stored block is
never dropped or repaired away because of one, and a full filesystem says
ENOSPC and the store keeps working by evicting.  Faults come from libtutti's
fault engine (``fault:psync`` / ``fault:uring``, or TUTTI_FAULTS for any engine)
and, for ENOSPC, from a real full tmpfs.
"""
import errno
import json
import os
import subprocess

import pytest
from click.testing import CliRunner

from tutti import CorruptBlockError, PagedBuffer, Store, TuttiError
from tutti.cli import EXIT_PROBLEMS, main

ENGINES = ["fault:psync", "fault:uring"]


def value(key: str, n: int) -> bytes:
    """The ground-truth bytes of ``key``: what a read must return exactly."""
    seed = key.encode() * (n // len(key) + 1)
    return bytes((b * 31 + i) & 0xFF for i, b in enumerate(seed[:n]))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("verify", [True, False], ids=["verify", "noverify"])
def test_failed_read_is_an_io_error_and_keeps_the_block(make_store, engine, verify):
    paths = make_store()
    with Store.open(paths, engine=engine, verify=verify) as s:
        data = value("k", s.block_bytes)
        s.put("k", data)
        s.set_faults("submit:read:nth=1:after=1")  # layer 1's submit fails
        with pytest.raises(TuttiError) as exc:
            s.get("k")
        assert exc.value.errno == errno.EIO
        assert not isinstance(exc.value, CorruptBlockError)
        assert "submit failed" in exc.value.strerror
        assert s.get("k") == data  # still stored, exact
        assert s.stats()["corrupt_blocks"] == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_layerwise_read_reports_exactly_the_failed_block(make_store, engine):
    paths = make_store()
    with Store.open(paths, engine=engine, verify=False) as s:
        g = s.geometry
        for k in ("a", "b", "c"):
            s.put(k, value(k, s.block_bytes))
        slots = s.lookup(["a", "b", "c"])
        buf = PagedBuffer.for_geometry(g, 4)
        # Every read io of block "b" fails (its extents, whatever the engine's order).
        rules = []
        per_layer = []
        for layer in range(g.n_layers):
            offs = sorted(s.locate(sl, layer, sp)[1] for sl in slots for sp in range(g.n_spans))
            per_layer.append(offs)
        n = 0
        for layer in range(g.n_layers):
            for off in per_layer[layer]:
                if any(s.locate(slots[1], layer, sp)[1] == off for sp in range(g.n_spans)):
                    rules.append(f"io:read:nth={n}")
                n += 1
        s.set_faults(";".join(rules))
        with s.read(slots) as t:
            for layer in range(g.n_layers):
                try:
                    t.layer(layer, buf, [0, 1, 2])
                except TuttiError:
                    pass
            status = t.finish()
        assert status[0] == 0 and status[2] == 0
        assert status[1] == -errno.EIO  # reported with verification off
        assert buf.contiguous_block(0) == value("a", s.block_bytes)
        assert buf.contiguous_block(2) == value("c", s.block_bytes)
        s.set_faults("")
        assert s.get("b") == value("b", s.block_bytes)
        buf.close()


def test_set_faults_needs_a_fault_engine(make_store):
    paths = make_store()
    with Store.open(paths, engine="psync") as s:
        with pytest.raises(TuttiError) as exc:
            s.set_faults("io")
        assert exc.value.errno == errno.EOPNOTSUPP
    with Store.open(paths, engine="fault:psync") as s:
        with pytest.raises(TuttiError) as exc:
            s.set_faults("melt")
        assert exc.value.errno == errno.EINVAL and "unknown kind" in exc.value.strerror


def test_check_repair_never_clears_what_it_could_not_read(tmp_path, monkeypatch):
    img = tmp_path / "s.img"
    small = ["--layers", "2", "--kv-heads", "1", "--head-dim", "64", "--dtype", "bfloat16",
             "--model-id", "test/small"]
    runner = CliRunner()
    assert runner.invoke(main, ["format", str(img), *small, "--slots", "8"]).exit_code == 0
    with Store.open([str(img)]) as s:
        blocks = {f"b{i}": value(f"b{i}", s.block_bytes) for i in range(4)}
        for k, v in blocks.items():
            s.put(k, v)
    monkeypatch.setenv("TUTTI_FAULTS", "io:read:count=0")  # every read fails
    res = runner.invoke(main, ["check", str(img), "--repair", "--json"], catch_exceptions=False)
    assert res.exit_code == EXIT_PROBLEMS, res.output
    out = json.loads(res.stdout)
    assert out["unreadable"] == 4 and out["bad"] == 0 and out["repaired"] == 0
    assert out["remaining_problems"] == 4
    res = runner.invoke(main, ["check", str(img), "--repair"], catch_exceptions=False)
    assert res.exit_code == EXIT_PROBLEMS and "could not be read" in res.output
    monkeypatch.delenv("TUTTI_FAULTS")
    with Store.open([str(img)]) as s:
        for k, v in blocks.items():
            assert s.get(k) == v
    res = runner.invoke(main, ["check", str(img)], catch_exceptions=False)
    assert res.exit_code == 0 and "store is clean" in res.output


@pytest.fixture
def small_tmpfs(tmp_path):
    """A tmpfs of 320 KiB (root only): a filesystem that really fills up."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "full"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=320k", "tutti-test", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.parametrize("engine", ["psync", "uring"])
def test_full_filesystem_says_enospc_and_recovers_by_evicting(small_tmpfs, tiny_fp, engine):
    path = str(small_tmpfs / "kv.img")
    with pytest.raises(TuttiError) as refused:  # reserved at format (the default): refused there
        Store.format([path], tiny_fp, n_slots=32)
    assert refused.value.errno == errno.ENOSPC and "not enough space" in str(refused.value)
    assert not os.path.exists(path)
    Store.format([path], tiny_fp, n_slots=32, preallocate=False)  # sparse: 1 MiB of blocks on 320 KiB
    stored, failures = {}, []
    with Store.open([path], engine=engine) as s:
        for i in range(40):
            key = f"k{i}"
            try:
                s.put(key, value(key, s.block_bytes))
                stored[key] = True
            except TuttiError as e:
                failures.append((i, e))
        assert failures, "the filesystem never filled up"
        first, err = failures[0]
        assert err.errno == errno.ENOSPC and "no space left" in err.strerror
        # One failure tells the store; from then on it evicts instead (a retry of a
        # free slot now and then may fail again).
        assert len(failures) <= 2, [(i, str(e)) for i, e in failures]
        assert first < 20
        assert s.stats()["evictions"] > 0
        for key in [f"k{i}" for i in range(35, 40)]:
            assert s.get(key) == value(key, s.block_bytes)
        served = 0
        for key in stored:
            try:
                assert s.get(key) == value(key, s.block_bytes)
                served += 1
            except KeyError:
                pass  # evicted
        assert served >= 5
    with Store.open([path], engine=engine) as s:
        res = s.check()
        assert res["bad"] == 0 and res["bad_records"] == 0 and res["unreadable"] == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_rate_rule_slows_writes_only_and_keeps_bytes_exact(make_store, engine):
    """``rate:write:mbps=N`` (the serving benchmark's throttled store) holds a store's writes to N MB/s
    at most and changes no byte; ``rate:read`` does the same to reads."""
    import time
    paths = make_store(n_slots=8)
    with Store.open(paths, engine=engine) as s:
        s.set_faults("rate:write:mbps=2")
        data = [value(f"k{i}", s.block_bytes) for i in range(4)]
        t0 = time.perf_counter()
        for i, d in enumerate(data):
            s.put(f"k{i}", d)
        took = time.perf_counter() - t0
        assert took >= 4 * s.block_bytes / 2e6, (took, s.block_bytes)
        assert [s.get(f"k{i}") for i in range(4)] == data
        s.set_faults("rate:read:mbps=1")  # reads too, once asked for
        t0 = time.perf_counter()
        assert s.get("k0") == data[0]
        assert time.perf_counter() - t0 >= s.block_bytes / 1e6
