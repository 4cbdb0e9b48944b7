"""tutti-admin bench --compare lmcache: Tutti beside LMCache's disk engines (tutti.bench.lmcache_compare).

Checked here, on small prefixes (a 2-layer model, 2 KiB objects, 256-token chunks of 128 KiB):

- the byte layouts: what each engine leaves on disk is LMCache's layout (raw-block: metadata region, then per
  chunk a 4 KiB header with magic, identity and payload length, then the chunk; local disk: one file per
  chunk holding exactly the chunk), Tutti's paged view of a chunk area addresses the KV_2LTD positions, and
  what each engine reads back equals what it wrote (a damaged payload is caught);
- the missing-package path: one line, exit 2, nothing created;
- the report: every rate and ratio is computed from the runs' measurements.

Tests needing lmcache-rust-raw-block-io skip without it (it is in the [test] extra on Linux x86-64).  lmcache
itself is used only when TUTTI_LMCACHE_PYTHON names an interpreter that has it.
"""
import dataclasses
import json
import os
import statistics
import sys

import pytest
from click.testing import CliRunner

from tutti.bench import BenchError
from tutti.bench import lmcache_compare as lc
from tutti.bench import lmcache_engines as le
from tutti.bench import lmcache_layout as ll
from tutti.bench import lmcache_report as lr
from tutti.cli import EXIT_USAGE, main
from tutti.model import Fingerprint

SMALL = Fingerprint(model_id="test/small", dtype="bfloat16", n_layers=2, kv_heads=1, head_dim=64, block_size=16)
CFG = {"_name_or_path": "test/small", "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1,
       "head_dim": 64, "torch_dtype": "bfloat16"}
TOKENS = 512  # 2 chunks

try:
    import lmcache_rust_raw_block_io  # noqa: F401
    HAVE_RAW = True
except ImportError:
    HAVE_RAW = False
needs_raw = pytest.mark.skipif(not HAVE_RAW, reason="lmcache-rust-raw-block-io is not installed "
                                                     "(pip install 'tutti[lmcache-bench]')")
LMCACHE_PY = os.environ.get("TUTTI_LMCACHE_PYTHON")


def _cfg(tmp_path, **kw):
    kw = {"path": str(tmp_path / "s.img"), "prefix_tokens": TOKENS, "runs": 1, "fp": SMALL, "fio": False,
          "drop_cache": False, "command": "test", **kw}
    return lc.CompareConfig(**kw)


def _ctx(tmp_path, cfg=None):
    """The shared state of a comparison, as run_compare builds it, for driving one engine."""
    from tutti.bench.run import BENCH_MODEL_PREFIX
    from tutti.store import Store

    cfg = cfg or _cfg(tmp_path)
    fp = dataclasses.replace(SMALL, model_id=BENCH_MODEL_PREFIX + SMALL.model_id)
    geo, _ = Store.plan(1, fp, n_slots=TOKENS // 16)
    layout = ll.ChunkLayout.for_geometry(geo, 16, TOKENS)
    src, dst = ll.SharedArea(layout.total_bytes, "t-src"), ll.SharedArea(layout.total_bytes, "t-dst")
    src.fill_random(7)
    return le.RunContext(cfg, layout, geo, fp, src, dst, tmpfs=False, log=lambda m: None)


def _chunk(area, layout, c):
    return bytes(area.mm[c * layout.chunk_bytes:(c + 1) * layout.chunk_bytes])


# ------------------------------------------------------------------ layouts


def test_chunk_layout_numbers():
    lay = ll.ChunkLayout(n_layers=32, n_spans=2, span_bytes=32768, block_tokens=16, prefix_tokens=32768)
    assert lay.n_chunks == 128 and lay.chunk_bytes == 32 << 20  # Llama-3-8B: 2 x 32 x 256 x 8 x 128 x 2 bytes
    assert lay.total_bytes == lay.n_blocks * 32 * 2 * 32768 == 4 << 30
    assert lay.slot_bytes == 4096 + (32 << 20) and lay.slot_offset(1) == (128 << 20) + lay.slot_bytes
    with pytest.raises(BenchError) as e:
        ll.ChunkLayout.for_geometry(type("G", (), {"n_layers": 2, "n_spans": 2, "span_bytes": 2048})(), 16, 300)
    assert e.value.code == 2 and "multiple of" in str(e.value)


def test_tutti_view_of_a_chunk_area_is_kv_2ltd(tmp_path):
    """Block id c*ids_per_chunk+j, layer l, span s of the paged view is tokens 16j.. of (s, l) in chunk c."""
    ctx = _ctx(tmp_path)
    lay = ctx.layout
    pb = ll.ChunkPagedBuffer(ctx.src, lay)
    try:
        ids = lay.block_ids()
        assert len(ids) == lay.n_blocks == len(set(ids)) and max(ids) < pb.n_blocks
        for c in range(lay.n_chunks):
            chunk = _chunk(ctx.src, lay, c)
            for layer in range(lay.n_layers):
                for span in range(lay.n_spans):
                    for j in range(lay.blocks_per_chunk):
                        off = (span * lay.n_layers + layer) * lay.part_bytes + j * lay.span_bytes
                        got = bytes(pb.block_view(layer, span, c * lay.ids_per_chunk + j))
                        assert got == chunk[off:off + lay.span_bytes]
        # every object is distinct (stamped pages): a read landing elsewhere cannot pass verification
        objs = {bytes(pb.block_view(l, s, b)) for l in range(lay.n_layers) for s in range(lay.n_spans) for b in ids}
        assert len(objs) == lay.n_blocks * lay.n_layers * lay.n_spans
    finally:
        pb.close()
        ctx.src.close()
        ctx.dst.close()


@needs_raw
def test_raw_block_file_is_lmcache_layout_and_round_trips(tmp_path):
    ctx = _ctx(tmp_path)
    lay = ctx.layout
    eng = le.RawBlockEngine(ctx, str(tmp_path / "s.img.lmcache-raw"))
    try:
        out = eng.run(3)["raw_block"]  # store, fdatasync, read back, compare: raises on a difference
        with open(eng.path, "rb") as f:
            data = f.read()
        assert len(data) == lay.raw_file_bytes == ll.RB_META + lay.n_chunks * lay.slot_bytes
        for c in range(lay.n_chunks):
            slot = lay.slot_offset(c)
            hdr = data[slot:slot + ll.RB_HEADER]
            assert hdr[:8] == b"LMCBLK01"
            assert int.from_bytes(hdr[8:16], "little") == ll.chunk_identity(3, c)
            assert int.from_bytes(hdr[16:24], "little") == lay.chunk_bytes
            assert hdr[24:] == bytes(ll.RB_HEADER - 24)
            assert data[slot + ll.RB_HEADER:slot + ll.RB_HEADER + lay.chunk_bytes] == _chunk(ctx.src, lay, c)
        assert _chunk(ctx.dst, lay, 1) == _chunk(ctx.src, lay, 1)
        for m in ("store", "store_durable", "retrieve"):
            assert out[m]["bytes"] == lay.total_bytes and out[m]["gbps"] > 0 and out[m]["cpu_seconds"] >= 0
        assert out["store_durable"]["seconds"] >= out["store"]["seconds"]
        assert eng.fixed is True  # the chunk areas registered as fixed buffers, as LMCache does
    finally:
        eng.close()
        ctx.src.close()
        ctx.dst.close()
    assert not os.path.exists(eng.path)


@needs_raw
def test_damaged_payload_fails_the_comparison(tmp_path):
    """The read-back check can fail: a payload byte changed on disk between store and read is caught."""
    ctx = _ctx(tmp_path)
    eng = le.RawBlockEngine(ctx, str(tmp_path / "raw"))
    real_before_read = ctx.before_read

    def damage(byte):
        real_before_read(byte)
        with open(eng.path, "r+b") as f:
            f.seek(ctx.layout.slot_offset(1) + ll.RB_HEADER + 12345)
            old = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([old[0] ^ 0xFF]))
    ctx.before_read = damage
    try:
        with pytest.raises(BenchError) as e:
            eng.run(0)
        assert e.value.code == 1 and "chunk 1" in str(e.value)
    finally:
        eng.close()
        ctx.src.close()
        ctx.dst.close()


@pytest.mark.parametrize("odirect", [False, True])
def test_local_disk_files_are_one_chunk_each(tmp_path, odirect):
    ctx = _ctx(tmp_path)
    lay = ctx.layout
    d = tmp_path / "s.img.lmcache-disk"
    eng = le.LocalDiskEngine(ctx, str(d), odirect=odirect)
    try:
        out = eng.run(5)[eng.names[0]]
        files = sorted(d.iterdir())
        assert len(files) == lay.n_chunks
        want = {eng._path(5, c): _chunk(ctx.src, lay, c) for c in range(lay.n_chunks)}
        for f in files:
            assert f.read_bytes() == want[str(f)]
        assert _chunk(ctx.dst, lay, 0) == _chunk(ctx.src, lay, 0)
        assert out["retrieve"]["bytes"] == lay.total_bytes and out["retrieve"]["gbps"] > 0
    finally:
        eng.close()
        ctx.src.close()
        ctx.dst.close()
    assert not d.exists()


# ------------------------------------------------------------ whole runs


@needs_raw
def test_report_is_computed_from_the_runs(tmp_path):
    res = lc.run_compare(_cfg(tmp_path, runs=3))
    lay_bytes = res["layout"]["chunks"] * res["layout"]["chunk_bytes"]
    assert lay_bytes == res["workload"]["bytes"] == TOKENS * 2 * 2 * 2048 // 16
    assert len(res["runs"]) == 3
    engines = {"tutti", "tutti_one_thread", "tutti_all_layers", "tutti_unverified", "raw_block", "local_disk",
               "local_disk_odirect"}
    assert set(res["median"]) == engines and "fio" not in res["median"]  # fio off: no row, no ratio
    for run in res["runs"]:
        assert set(run) - {"order"} == engines
        assert sorted(run["order"]) == sorted(engines)
        for name in engines:
            for rate in run[name].values():
                assert rate["bytes"] == lay_bytes
                assert rate["gbps"] == pytest.approx(rate["bytes"] / rate["seconds"] / 1e9)
                assert rate["cpu_s_per_gb"] == pytest.approx(rate["cpu_seconds"] / (rate["bytes"] / 1e9))
                assert rate["seconds"] > 0 and rate["gbps"] > 0 and rate["cpu_seconds"] >= 0
    for name in engines:
        for m, med in res["median"][name].items():
            runs = [run[name][m]["gbps"] for run in res["runs"]]
            assert med["runs_gbps"] == runs and med["gbps"] == statistics.median(runs)
    best = res["best_lmcache"]
    assert best == max(lc.LMCACHE_ENGINES[:3], key=lambda n: res["median"][n]["retrieve"]["gbps"])
    want = statistics.median(r["tutti"]["retrieve"]["gbps"] / r[best]["retrieve"]["gbps"] for r in res["runs"])
    assert res["ratios"]["tutti/best_lmcache_retrieve"] == pytest.approx(want)
    assert res["met"]["tutti/best_lmcache_retrieve"] == (want >= lc.TARGET)
    assert res["engines"]["tutti"]["verifies"].startswith("XXH3")
    verifying = {"tutti", "tutti_one_thread", "tutti_all_layers"}
    assert all(res["engines"][n]["verifies"].startswith("XXH3") for n in verifying)
    assert all(res["engines"][n]["verifies"].startswith("nothing") for n in engines - verifying)
    one = statistics.median(r["tutti"]["retrieve"]["gbps"] / r["tutti_one_thread"]["retrieve"]["gbps"]
                            for r in res["runs"])
    assert res["ratios"]["tutti/tutti_one_thread_retrieve"] == pytest.approx(one)
    assert not os.listdir(tmp_path)  # every file of the comparison removed
    md = lr.markdown_section([res], "tutti-admin bench --compare lmcache")
    assert md.startswith(f"## {lc.COMPARE_TITLE}\n") and "| disk | 512 |" in md
    assert f"**{res['median']['tutti']['retrieve']['gbps']:.2f}**" in md
    json.dumps(res)


def test_summarize_pairs_runs_and_picks_the_best_engine():
    def rate(g):
        return {"gbps": g, "cpu_s_per_gb": 0.1, "bytes": 10**9, "seconds": 1 / g, "cpu_seconds": 0.1}

    def run(t, tv, rb, ld, f):
        return {"tutti": {"store": rate(1.0), "store_durable": rate(1.0), "retrieve": rate(t)},
                "tutti_unverified": {"retrieve": rate(tv)},
                "raw_block": {"store": rate(2.0), "store_durable": rate(1.0), "retrieve": rate(rb)},
                "local_disk": {"store": rate(4.0), "store_durable": rate(0.5), "retrieve": rate(ld)},
                "fio": {"retrieve": rate(f)}}

    runs = [run(3.0, 4.0, 1.0, 2.0, 2.0), run(3.0, 4.0, 2.0, 1.0, 3.0), run(6.0, 6.0, 1.5, 1.4, 3.0)]
    res = lc.summarize(runs, {})
    assert res["best_lmcache"] == "raw_block"  # median 1.5 against local_disk's 1.4
    assert res["ratios"]["tutti/best_lmcache_retrieve"] == pytest.approx(3.0)  # runs: 3, 1.5, 4
    assert res["ratios"]["tutti_unverified/best_lmcache_retrieve"] == pytest.approx(4.0)  # 4, 2, 4
    assert res["met"] == {"tutti/best_lmcache_retrieve": True, "tutti_unverified/best_lmcache_retrieve": True}
    assert res["ratios"]["vs_fio"]["tutti"] == pytest.approx(1.5)  # 1.5, 1, 2
    assert res["best_lmcache_store"] == "raw_block"
    assert res["ratios"]["tutti/best_lmcache_store_durable"] == pytest.approx(1.0)
    assert res["ratios"]["tutti/best_lmcache_store_own"] == pytest.approx(0.5)


@needs_raw
def test_cli_compare_json(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(CFG))
    md = tmp_path / "b.md"
    res = CliRunner().invoke(main, ["bench", str(tmp_path / "s.img"), "--compare", "lmcache", "--model-config",
                                    str(cfg), "--prefix-tokens", str(TOKENS), "--runs", "1", "--no-fio", "--json",
                                    "--cpu-threads", "2", "--output", str(md)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["title"] == lc.COMPARE_TITLE and out["workload"]["prefix_tokens"] == TOKENS
    assert out["tutti"]["cpu_threads"] == 2
    assert out["median"]["raw_block"]["retrieve"]["gbps"] > 0
    assert md.read_text().count(f"## {lc.COMPARE_TITLE}") == 1
    assert sorted(os.listdir(tmp_path)) == ["b.md", "cfg.json"]


# ------------------------------------------------------------ error paths


def test_missing_package_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, le.RAW_BLOCK_MODULE, None)  # import raises ImportError
    res = CliRunner().invoke(main, ["bench", str(tmp_path / "s.img"), "--compare", "lmcache", "--runs", "1"])
    assert res.exit_code == EXIT_USAGE
    assert res.stderr == ("tutti-admin: error: bench: --compare lmcache needs the Python package "
                          "lmcache-rust-raw-block-io (pip install 'tutti[lmcache-bench]')\n")
    assert "Traceback" not in res.output
    assert not os.listdir(tmp_path)  # nothing created
    with pytest.raises(BenchError) as e:
        lc.run_compare(_cfg(tmp_path))
    assert e.value.code == 2


@needs_raw
def test_refuses_existing_lmcache_files(tmp_path):
    raw, _ = lc.lmcache_paths(str(tmp_path / "s.img"))
    with open(raw, "wb") as f:
        f.write(b"keep")
    with pytest.raises(BenchError) as e:
        lc.run_compare(_cfg(tmp_path))
    assert e.value.code == 2 and "exists" in str(e.value)
    assert open(raw, "rb").read() == b"keep" and sorted(os.listdir(tmp_path)) == ["s.img.lmcache-raw"]


@needs_raw
def test_lmcache_python_without_lmcache_is_one_line(tmp_path):
    """An interpreter that lacks lmcache: exit 2 before anything is written, the child's reason in one line."""
    try:
        import lmcache  # noqa: F401
        pytest.skip("this interpreter has lmcache")
    except ImportError:
        pass
    with pytest.raises(BenchError) as e:
        lc.run_compare(_cfg(tmp_path, lmcache_python=sys.executable))
    assert e.value.code == 2 and "cannot import lmcache" in str(e.value) and "\n" not in str(e.value)
    assert not os.listdir(tmp_path)


@needs_raw
@pytest.mark.skipif(not LMCACHE_PY, reason="TUTTI_LMCACHE_PYTHON (an interpreter with lmcache) is not set")
def test_lmcache_core_round_trips(tmp_path):
    res = lc.run_compare(_cfg(tmp_path, lmcache_python=LMCACHE_PY))
    assert res["lmcache"]["version"] and res["median"]["lmcache"]["retrieve"]["gbps"] > 0
    assert "lmcache" in res["runs"][0]["order"]
