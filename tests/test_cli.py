"""tutti-admin: size parsing, exit codes, and full format/info/bench/check flows.

The flows run through click's CliRunner and through the installed console
script, on a regular file and on a loop block device (root only).
"""
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tutti import Store
from tutti import bench as tbench
from tutti.cli import EXIT_MISMATCH, EXIT_PROBLEMS, EXIT_STORE, EXIT_USAGE, main, parse_size

# A small model: 2 layers x 2 spans x 2 KiB objects (padded to 4 KiB on disk).
SMALL = ["--layers", "2", "--kv-heads", "1", "--head-dim", "64", "--dtype", "bfloat16", "--model-id", "test/small"]
BENCH_TINY = ["--prefix-tokens", "256", "--runs", "1", "--sweep", "4,8"]


def run(args, expect=0):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == expect, f"exit {res.exit_code} != {expect}\n{res.output}"
    return res


def stdout_of(res):
    return getattr(res, "stdout", res.output)


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def script():
    exe = Path(sys.executable).with_name("tutti-admin")
    if exe.exists():
        return str(exe)
    found = shutil.which("tutti-admin")
    if not found:
        pytest.skip("tutti-admin console script is not installed (pip install . first)")
    return found


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize("text,value", [
    ("4096", 4096), ("0", 0), ("512MiB", 512 << 20), ("2GiB", 2 << 30), ("2gib", 2 << 30), ("1TB", 10**12),
    ("1tb", 10**12), ("3KB", 3000), ("8k", 8192), ("16M", 16 << 20), ("1G", 1 << 30), ("1T", 1 << 40),
    ("1.5GiB", 3 << 29), (" 64 MiB ", 64 << 20), ("7B", 7), ("1PiB", 1 << 50), (123, 123),
    ("1EiB", 1 << 60), ("2e", 2 << 60), ("3EB", 3 * 10**18),
])
def test_parse_size_accepts(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text,why", [
    ("", "not a size"), ("GiB", "not a size"), ("-1GiB", "negative"), ("2XB", "unknown unit"),
    ("1.5B", "whole number"), ("1e9", "not a size"), ("0x10", "not a size"), ("5 parsecs", "unknown unit"),
    ("2 G iB", "not a size"),
    ("1,5GiB", "not a size"),
])
def test_parse_size_rejects(text, why):
    with pytest.raises(ValueError, match=why):
        parse_size(text)


def test_huge_sizes_get_the_real_reason(tmp_path):
    """1 EiB is a size (too many slots for libtutti), not an "unknown unit"; past 2^64 - 1 bytes, too large."""
    res = run(["format", tmp_path / "s.img", *SMALL, "--capacity", "1EiB"], expect=EXIT_USAGE)
    assert "slots: at most" in res.output and "unknown unit" not in res.output
    res = run(["format", tmp_path / "s.img", *SMALL, "--capacity", "16EiB"], expect=EXIT_USAGE)
    assert "too large" in res.output
    assert not (tmp_path / "s.img").exists()


def test_a_tp_store_path_names_its_shards(tmp_path):
    """The connector keeps a TP engine's store as PATH.rank0, PATH.rank1: given PATH, the error says so."""
    base = tmp_path / "kv.tutti"
    for r in range(2):
        run(["format", f"{base}.rank{r}", *SMALL, "--slots", "4"])
    for cmd in ("info", "check"):
        res = run([cmd, base], expect=EXIT_STORE)
        assert "tensor-parallel store of 2 shard(s)" in res.output and ".rank0 ... .rank1" in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1
    res = run(["info", tmp_path / "nothing.tutti"], expect=EXIT_STORE)
    assert "tensor-parallel" not in res.output


def test_an_os_error_names_its_file():
    """Python's own OSError keeps the path apart from its reason: "bench: Permission denied" named nothing."""
    from tutti.cli.common import _store_error

    e = _store_error(PermissionError(errno.EACCES, "Permission denied", "/srv/kv/b.img"), "bench")
    assert e.exit_code == EXIT_STORE and e.message == "bench: '/srv/kv/b.img': Permission denied"
    e = _store_error(OSError(errno.EIO, "/srv/kv/b.img: Input/output error", "/srv/kv/b.img"), "check")
    assert e.message == "check: /srv/kv/b.img: Input/output error"  # libtutti's reasons name it already


@pytest.mark.parametrize("config,why", [
    ({"num_attention_heads": 3, "hidden_size": 2}, "'hidden_size' 2 / 'num_attention_heads' 3 gives head_dim 0"),
    ({"num_attention_heads": 2, "hidden_size": 128, "_name_or_path": "a\u0000b"}, "holds a NUL character"),
])
def test_model_config_values_a_store_cannot_keep(tmp_path, config, why):
    """A NUL in the model's name would be cut there in the superblock: two models, one identity."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 2, "torch_dtype": "bfloat16", **config}))
    res = run(["format", tmp_path / "s.img", "--model-config", cfg, "--slots", "4"], expect=EXIT_USAGE)
    assert why in res.output and "config.json" in res.output
    assert not (tmp_path / "s.img").exists()


def test_bad_size_option_is_usage_error(tmp_path):
    res = run(["format", tmp_path / "s.img", *SMALL, "--capacity", "12 bananas"], expect=EXIT_USAGE)
    assert "unknown unit" in res.output and "--capacity" in res.output
    res = run(["format", tmp_path / "s.img", *SMALL, "--capacity", "0"], expect=EXIT_USAGE)
    assert "greater than zero" in res.output
    assert not (tmp_path / "s.img").exists()


# ------------------------------------------------------------------ fio


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
@pytest.mark.parametrize("rw", ["write", "read"])
def test_fio_json_from_a_real_run(tmp_path, rw):
    f = tmp_path / "fio.img"
    with open(f, "wb") as fh:
        fh.truncate(8 << 20)
    cmd = tbench.fio_command([str(f)], rw, 1 << 20, 4 << 20)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    r = tbench.parse_fio_json(out.stdout, rw)
    assert r["bytes"] == 4 << 20
    assert r["seconds"] > 0 and r["gbps"] > 0
    assert r["version"].startswith("fio-")


def test_fio_json_errors():
    with pytest.raises(ValueError, match="no JSON"):
        tbench.parse_fio_json("fio: something went wrong", "read")
    with pytest.raises(ValueError, match="failed"):
        tbench.parse_fio_json(json.dumps({"jobs": [{"jobname": "m0", "error": 5, "read": {}}]}), "read")


# ------------------------------------------------------------- format


def test_format_regular_file_needs_a_size(tmp_path):
    res = run(["format", tmp_path / "s.img", *SMALL], expect=EXIT_USAGE)
    assert "a regular file needs --capacity or --slots" in res.output
    assert not (tmp_path / "s.img").exists()


def test_format_needs_a_model(tmp_path):
    res = run(["format", tmp_path / "s.img", "--slots", "8"], expect=EXIT_USAGE)
    assert "--model-config" in res.output


def test_format_from_model_config(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"_name_or_path": "test/cfg", "num_hidden_layers": 3, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "hidden_size": 256, "torch_dtype": "float16"}))
    res = run(["format", tmp_path / "s.img", "--model-config", cfg, "--slots", "5", "--json"])
    info = json.loads(stdout_of(res))
    assert info["fingerprint"]["model_id"] == "test/cfg"
    assert info["fingerprint"]["n_layers"] == 3 and info["fingerprint"]["kv_heads"] == 2
    assert info["geometry"]["span_bytes"] == 16 * 2 * 64 * 2
    assert info["geometry"]["n_slots"] == 5


def test_format_refuses_existing_store(tmp_path):
    img = tmp_path / "s.img"
    run(["format", img, *SMALL, "--slots", "8"])
    before = sha(img)
    res = run(["format", img, *SMALL, "--slots", "16"], expect=EXIT_USAGE)
    assert "already holds a Tutti store" in res.output and "--force" in res.output
    assert sha(img) == before
    # --force alone cannot confirm without a terminal; with --yes it overwrites.
    res = run(["format", img, *SMALL, "--slots", "16", "--force"], expect=EXIT_USAGE)
    assert "--yes" in res.output
    assert sha(img) == before
    res = run(["format", img, *SMALL, "--slots", "16", "--force", "--yes", "--json"])
    assert json.loads(stdout_of(res))["geometry"]["n_slots"] == 16


def test_format_prints_geometry(tmp_path):
    res = run(["format", tmp_path / "s.img", *SMALL, "--capacity", "1MiB"])
    for word in ("n slots", "span bytes", "data off", "test/small"):
        assert word in res.output


def test_format_reserves_the_space_unless_sparse(tmp_path):
    """A file's whole size is held from format on (st_blocks), or only what format wrote with --sparse."""
    full, thin = tmp_path / "full.img", tmp_path / "thin.img"
    res = run(["format", full, *SMALL, "--capacity", "8MiB", "--json"])
    info = json.loads(stdout_of(res))
    size = full.stat().st_size
    assert size >= 8 << 20 and info["allocated_bytes"] == {str(full): full.stat().st_blocks * 512}
    assert info["allocated_bytes"][str(full)] >= size
    res = run(["format", thin, *SMALL, "--capacity", "8MiB", "--sparse", "--json"])
    held = json.loads(stdout_of(res))["allocated_bytes"][str(thin)]
    assert thin.stat().st_size == size and held < size // 2, held
    with Store.open([str(full)]) as s, Store.open([str(thin)]) as t:
        assert s.geometry.n_slots == t.geometry.n_slots


def test_format_larger_than_the_file_system_is_refused(tmp_path):
    """The planned size against the free space, before anything is written, sparse or not."""
    free = shutil.disk_usage(tmp_path).free
    img = tmp_path / "big.img"
    for extra in ([], ["--sparse"]):
        res = run(["format", img, *SMALL, "--capacity", str(free + (1 << 30)), *extra], expect=EXIT_USAGE)
        assert "room for" in res.output and not img.exists(), res.output


# ------------------------------------------------------- info / errors


def test_info_on_garbage_file_is_exit_3(tmp_path):
    junk = tmp_path / "junk.img"
    junk.write_bytes(os.urandom(1 << 20))
    res = run(["info", junk], expect=EXIT_STORE)
    assert res.output.startswith("tutti-admin: error: info: ")
    assert "Tutti store" in res.output or "not" in res.output
    res = run(["info", tmp_path / "missing.img"], expect=EXIT_STORE)
    assert "missing.img" in res.output


def test_info_fingerprint_mismatch_is_exit_4(tmp_path):
    img = tmp_path / "s.img"
    run(["format", img, *SMALL, "--slots", "4"])
    run(["info", img, *SMALL])
    other = ["--layers", "3", "--kv-heads", "1", "--head-dim", "64", "--model-id", "test/small"]
    res = run(["info", img, *other], expect=EXIT_MISMATCH)
    assert "fingerprint mismatch" in res.output


def test_help_documents_exit_codes():
    res = run(["--help"])
    assert "Exit codes" in res.output and "fingerprint mismatch" in res.output
    for cmd in ("format", "info", "check", "bench"):
        assert "Exit codes" in run([cmd, "--help"]).output


# ---------------------------------------------------------------- check


def _fill(img, n):
    """Store n blocks of random bytes in a SMALL store; returns {key: data}."""
    blocks = {}
    with Store.open([str(img)]) as s:
        for i in range(n):
            key, data = f"block-{i}".encode(), os.urandom(s.block_bytes)
            s.put(key, data)
            blocks[key] = data
    return blocks


def test_check_finds_corruption_and_repairs(tmp_path):
    img = tmp_path / "s.img"
    run(["format", img, *SMALL, "--slots", "8"])
    blocks = _fill(img, 4)
    res = run(["check", img, "--json"])
    out = json.loads(stdout_of(res))
    assert out["checked"] == 4 and out["ok"] == 4 and out["bad"] == 0

    with Store.open([str(img)], readonly=True) as s:
        geo = s.geometry
        assert geo.n_members == 1
        slot = s.lookup([b"block-2"])[0]
        layer, span = 1, 0
        off = geo.data_off + ((layer * geo.n_spans + span) * geo.n_slots + slot) * geo.obj_stride
        assert s.locate(slot, layer, span) == (0, off)
    with open(img, "r+b") as f:
        f.seek(off + 100)
        f.write(b"\xff" * 64)
        os.fsync(f.fileno())

    res = run(["check", img, "--json"], expect=EXIT_PROBLEMS)
    out = json.loads(stdout_of(res))
    assert out["bad"] == 1 and out["ok"] == 3 and out["bad_slots"] == [slot]
    res = run(["check", img], expect=EXIT_PROBLEMS)
    assert "problem(s) remain" in res.output

    res = run(["check", img, "--repair", "--json"])
    out = json.loads(stdout_of(res))
    assert out["repaired"] >= 1 and out["remaining_problems"] == 0
    res = run(["check", img])
    assert "store is clean" in res.output
    with Store.open([str(img)], readonly=True) as s:
        with pytest.raises(KeyError):
            s.get(b"block-2")
        for key in (b"block-0", b"block-1", b"block-3"):
            assert s.get(key) == blocks[key]


# ----------------------------------------------------------------- flows


def _check_bench_json(res, n_blocks=16):
    assert res["verified"] is True
    assert res["workload"]["blocks"] == n_blocks
    med = res["median"]
    for k in ("store_gbps", "retrieve_gbps", "naive_gbps", "retrieve_cpu_us_per_layer"):
        assert med[k] > 0, k
    assert med["retrieve_syscalls_per_layer"] is not None
    assert [row["blocks"] for row in res["sweep"]] == [4, 8, n_blocks]
    if res["fio"]["used"]:
        assert med["fio_read_gbps"] > 0 and med["fio_write_gbps"] > 0
        assert res["ratios"]["retrieve/fio_read"]["value"] > 0


def _flow_runner(member, size_args, bench_args, tmp_path):
    res = run(["format", member, *SMALL, *size_args])
    assert "test/small" in res.output
    info = json.loads(stdout_of(run(["info", member, "--json"])))
    assert info["fingerprint"]["model_id"] == "test/small"
    assert info["n_committed"] == 0
    # A user's store is not the benchmark's: bench refuses it unless forced.
    res = run(["bench", member, *BENCH_TINY, "--no-fio"], expect=EXIT_USAGE)
    assert "--force" in res.output
    md = tmp_path / "bench.md"
    res = run(["bench", member, *BENCH_TINY, *bench_args, "--force", "--json", "--output", md])
    _check_bench_json(json.loads(stdout_of(res)))
    assert "## Store: layer-wise retrieve (file engine)" in md.read_text()
    info = json.loads(stdout_of(run(["info", member, "--json"])))
    assert info["n_committed"] == 16
    out = json.loads(stdout_of(run(["check", member, "--json"])))
    assert out["checked"] == 16 and out["ok"] == 16 and out["bad"] == 0


def test_flow_regular_file_clirunner(tmp_path):
    fio = [] if shutil.which("fio") else ["--no-fio"]
    _flow_runner(tmp_path / "s.img", ["--capacity", "1MiB"], fio, tmp_path)


def test_flow_regular_file_console_script(tmp_path):
    exe = script()
    img = str(tmp_path / "s.img")

    def sh(*args, expect=0):
        p = subprocess.run([exe, *map(str, args)], capture_output=True, text=True)
        assert p.returncode == expect, f"{args}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
        return p

    sh("format", img, *SMALL, "--slots", "32")
    info = json.loads(sh("info", img, "--json").stdout)
    assert info["geometry"]["n_slots"] == 32
    fio = [] if shutil.which("fio") else ["--no-fio"]
    p = sh("bench", img, *BENCH_TINY, *fio, "--force", "--json")
    _check_bench_json(json.loads(p.stdout))
    p = sh("bench", img, *BENCH_TINY, "--no-fio")  # now a benchmark store: no --force needed
    assert "verified byte for byte" in p.stdout
    out = json.loads(sh("check", img, "--json").stdout)
    assert out["ok"] == 16 and out["bad"] == 0
    p = sh("info", str(tmp_path / "nothing.img"), expect=EXIT_STORE)
    assert "tutti-admin: error" in p.stderr
    sh("format", img, *SMALL, "--slots", "8", expect=EXIT_USAGE)


@pytest.fixture
def loop_device(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("loop devices need root")
    if shutil.which("losetup") is None:
        pytest.skip("losetup is not installed")
    backing = tmp_path / "loop.img"
    with open(backing, "wb") as f:
        f.truncate(96 << 20)
    p = subprocess.run(["losetup", "-f", "--show", str(backing)], capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        pytest.skip(f"losetup failed: {p.stderr.strip()}")
    dev = p.stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def test_flow_loop_device(loop_device, tmp_path):
    dev = loop_device
    # A block device is formatted only with --yes (no terminal to ask here).
    res = run(["format", dev, *SMALL], expect=EXIT_USAGE)
    assert "--yes" in res.output
    res = run(["format", dev, *SMALL, "--yes", "--json"])
    info = json.loads(stdout_of(res))
    assert info["geometry"]["n_slots"] > 0 and info["n_free"] == info["geometry"]["n_slots"]
    fio = [] if shutil.which("fio") else ["--no-fio"]
    res = run(["bench", dev, *BENCH_TINY, *fio, "--json"], expect=EXIT_USAGE)  # device: needs --force
    res = run(["bench", dev, *BENCH_TINY, *fio, "--force", "--json"])
    _check_bench_json(json.loads(stdout_of(res)))
    out = json.loads(stdout_of(run(["check", dev, "--json"])))
    assert out["ok"] == 16 and out["bad"] == 0
    res = run(["info", dev])
    assert "test/small" not in res.output  # bench reformatted it for its own model
    assert "Meta-Llama-3-8B" in res.output


def test_bench_markdown_section_is_replaced(tmp_path):
    img = tmp_path / "b.img"
    md = tmp_path / "benchmarks.md"
    md.write_text("# Benchmarks\n\n## Other\n\nkeep me\n")
    cfg = tbench.BenchConfig(paths=[str(img)], prefix_tokens=128, runs=1, fio=False, sweep=(2,),
                             command="test")
    res = tbench.run_bench(cfg)
    tbench.write_markdown(md, res)
    tbench.write_markdown(md, res)
    text = md.read_text()
    assert text.count("## Store: layer-wise retrieve (file engine)") == 1
    assert "keep me" in text and "| retrieve/naive |" in text
    assert f"{res['median']['retrieve_gbps']:.2f} GB/s" in text


def test_bench_refuses_foreign_data(tmp_path):
    img = tmp_path / "data.img"
    img.write_bytes(b"precious" * 4096)
    before = sha(img)
    res = run(["bench", img, *BENCH_TINY, "--no-fio"], expect=EXIT_USAGE)
    assert "not a Tutti store" in res.output
    assert sha(img) == before


def test_errno_mapping_of_open_failures(tmp_path):
    from tutti.cli import _store_error

    assert _store_error(OSError(errno.EMEDIUMTYPE, "x"), "info").exit_code == EXIT_MISMATCH
    assert _store_error(OSError(errno.EBUSY, "x"), "info").exit_code == EXIT_STORE
    assert _store_error(OSError(errno.EINVAL, "x"), "info").exit_code == EXIT_STORE
