"""The store's own bytes-written counter (issue 15; docs/operations.md, docs/format.md "Bytes written").

Through the Python API and tutti-admin, on real files:

- after N blocks each member's count is what format wrote plus every object of those blocks at its stride on
  the member tt_locate names, plus one slot-table page per commit (the documented metadata);
- the count survives close/reopen (plus the save at close) and a SIGKILL, losing at most what was counted
  since the last save (never more than was written);
- a damaged copy B restarts only that member's count (the store opens and checks clean);
- a store formatted before the counter opens, counts from open and is never given a superblock write;
- an older libtutti (built from this repository's history: 316a193, the last commit before the counter, and
  f01e365, the first format v1 before feature masks) opens, writes, reads and checks a store with the
  counter, multi-member, also with a torn copy B; 316a193 refuses it with a count in copy A (the control) and
  with a damaged copy A on one member (the documented limit).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from test_format_evolution import _xxh3
from tutti import Store
from tutti._tutti import ffi, lib
from tutti.cli import EXIT_OK, main

ROOT = Path(__file__).resolve().parents[1]
SB = lib.TT_SB_SIZE
OFF_WRITTEN = ffi.offsetof("struct tt_superblock", "written")
OFF_SUM = ffi.offsetof("struct tt_superblock", "sb_sum")
PAGE = 4096


def cli(args, expect=EXIT_OK):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == expect, res.output
    assert "Traceback" not in res.output
    return res.output


def copies(path):
    """Both superblock copies of a member, as bytes."""
    with open(path, "rb") as f:
        return f.read(SB), f.read(SB)


def block_disk_bytes(s) -> int:
    g = s.geometry
    return g.n_layers * g.n_spans * g.obj_stride


def per_member(s, key) -> list:
    """Bytes of block ``key``'s objects on each member (their stride, where tt_locate puts them)."""
    out = [0] * s.geometry.n_members
    (slot,) = s.lookup([key])
    for layer in range(s.geometry.n_layers):
        for span in range(s.geometry.n_spans):
            member, _ = s.locate(slot, layer, span)
            out[member] += s.geometry.obj_stride
    return out


def make_old_store(path):
    """Copy A without the feature bit over both copies: a member as format wrote it before the counter."""
    xxh3 = _xxh3()
    a, _ = copies(path)
    sb = bytearray(a)
    feat = ffi.offsetof("struct tt_superblock", "feat")
    sb[feat:feat + 8] = (0).to_bytes(8, "little")
    sb[OFF_SUM:OFF_SUM + 8] = xxh3(bytes(sb[:OFF_SUM]), OFF_SUM).to_bytes(8, "little")
    with open(path, "r+b") as f:
        f.write(sb)
        f.write(sb)
        f.flush()
        os.fsync(f.fileno())


def test_count_is_format_plus_blocks_plus_table_pages(make_store, tiny_fp):
    paths = make_store(tiny_fp, n_slots=16, n_members=2, stripe_objs=2)
    with Store.open(paths) as s:
        w = s.written()
        assert w["counter"] == "kept" and w["saving"] and w["not_saving_why"] is None
        table = s.info()["table_bytes"]
        fmt = [2 * 2 * SB + table, 2 * 2 * SB]  # headers zeroed + superblocks; the table on member 0
        assert [m["bytes"] for m in w["members"]] == fmt
        assert w["members"][0]["since_ns"] == s.info()["created_ns"]
        assert [m["path"] for m in w["members"]] == paths
        want = list(fmt)
        n = 5
        for i in range(n):
            key = f"block{i}".encode()
            s.put(key, os.urandom(s.block_bytes))
            for m, b in enumerate(per_member(s, key)):
                want[m] += b
            want[0] += PAGE  # the commit's slot-table page
        w = s.written()
        assert [m["bytes"] for m in w["members"]] == want
        assert w["since_open_bytes"] == n * (block_disk_bytes(s) + PAGE)
        assert w["bytes"] == sum(want)
        assert all(b > f for b, f in zip(want, fmt))  # both members took data
        s.put(b"block0", os.urandom(s.block_bytes))  # already stored: not written again
        s.get(b"block1")
        assert s.written()["bytes"] == sum(want)
    with Store.open(paths, readonly=True) as s:
        w = s.written()
        assert [m["bytes"] for m in w["members"]] == [b + SB for b in want]  # + the save at close
        assert [m["saved_bytes"] for m in w["members"]] == [b + SB for b in want]
        assert w["not_saving_why"] == "opened read-only"


def test_info_json_text_and_prometheus(make_store, tiny_fp):
    paths = make_store(tiny_fp, n_slots=8)
    with Store.open(paths) as s:
        s.put(b"k", bytes(s.block_bytes))
    info = json.loads(cli(["info", *paths, "--json"]))
    w = info["written"]
    assert w["counter"] == "kept" and w["bytes"] == w["members"][0]["bytes"] > block_disk_bytes_of(info)
    text = cli(["info", *paths])
    assert "Written" in text and "Written / member 0 (" in text and "since ns" in text
    prom = cli(["info", *paths, "--prometheus"])
    line = next(ln for ln in prom.splitlines() if ln.startswith("tutti_store_bytes_written_total{"))
    assert 'member="0"' in line and f'path="{paths[0]}"' in line and line.endswith(f" {w['bytes']}")
    assert "# TYPE tutti_store_bytes_written_total counter" in prom


def block_disk_bytes_of(info) -> int:
    g = info["geometry"]
    return g["n_layers"] * g["n_spans"] * g["obj_stride"]


CHILD = textwrap.dedent("""
    import json, os, signal, sys
    from tutti import Store
    paths = sys.argv[1:]
    with Store.open(paths) as s:
        for i in range(40):
            s.put(f"kill{i}".encode(), os.urandom(s.block_bytes))
            w = s.written()
            print(json.dumps([[m["bytes"], m["saved_bytes"]] for m in w["members"]]) + " " + str(w["saves"]),
                  flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
""")


def test_sigkill_loses_at_most_the_unsaved_part(make_store, tiny_fp):
    paths = make_store(tiny_fp, n_slots=16, n_members=2, stripe_objs=2)
    with Store.open(paths) as s:
        every = 3 * block_disk_bytes(s)
    env = {**os.environ, "TUTTI_WRITTEN_SAVE_BYTES": str(every)}
    res = subprocess.run([sys.executable, "-c", CHILD, *paths], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == -signal.SIGKILL, res.stderr
    lines = res.stdout.split("\n")[:-1]
    assert len(lines) == 40
    last, saves = lines[-1].rsplit(" ", 1)
    counted = json.loads(last)
    assert int(saves) >= 5  # it saved on its way (40 blocks, every 3 blocks' worth per member)
    assert any(b > saved for b, saved in counted)  # and had counted more since
    with Store.open(paths, readonly=True) as s:
        w = s.written()
        assert w["counter"] == "kept"
        for m, (b, saved) in zip(w["members"], counted):
            assert m["bytes"] == saved  # the last save: never more than was written
            assert 0 <= b - m["bytes"] < every  # lost: what was counted since, under one interval
    assert '"bad": 0' in cli(["check", *paths, "--json", "--no-progress"])


def test_damaged_copy_b_costs_the_count_only(make_store, tiny_fp, flip_byte):
    paths = make_store(tiny_fp, n_slots=8, n_members=2, stripe_objs=2)
    with Store.open(paths) as s:
        for i in range(4):
            s.put(f"b{i}".encode(), os.urandom(s.block_bytes))
    a_before = copies(paths[1])[0]
    flip_byte(paths[1], SB + OFF_WRITTEN + 2)  # inside member 1's count: a torn save
    out = json.loads(cli(["check", *paths, "--json", "--no-progress"]))
    assert out["bad"] == 0 and out["bad_records"] == 0 and out["ok"] == 4
    info = json.loads(cli(["info", *paths, "--json"]))
    w = info["written"]
    assert w["counter"] == "restarted"
    m0, m1 = w["members"]
    assert m1["restarted"] and m1["bytes"] == 0 and m1["since_ns"] > info["created_ns"]
    assert not m0["restarted"] and m0["bytes"] > 0
    assert "restarted at 0" in cli(["info", *paths, "--prometheus"])
    text = cli(["health", "--store", paths[0], "--store", paths[1]])
    assert "member(s) 1 restarted at 0" in text
    with Store.open(paths) as s:  # a writable open rewrites copy B at once
        w = s.written()
        assert w["saves"] == 1 and w["members"][1]["saved_bytes"] == SB
        since = w["members"][1]["since_ns"]
        assert s.get("b2")
    assert copies(paths[1])[0] == a_before  # copy A never changes
    with Store.open(paths, readonly=True) as s:
        w = s.written()
        assert w["counter"] == "kept" and w["members"][1]["since_ns"] == since


def test_store_without_the_counter(make_store, tiny_fp, file_digest):
    paths = make_store(tiny_fp, n_slots=8, n_members=2)
    for p in paths:
        make_old_store(p)
    heads = [copies(p) for p in paths]
    with Store.open(paths) as s:
        assert s.features()["compat"] == 0
        w = s.written()
        assert w["counter"] == "none" and not w["saving"] and "before the counter" in w["not_saving_why"]
        s.put(b"x", os.urandom(s.block_bytes))
        w = s.written()
        assert w["since_open_bytes"] == block_disk_bytes(s) + PAGE == w["bytes"]  # counted in memory
    assert [copies(p) for p in paths] == heads  # never given a superblock write
    info = json.loads(cli(["info", *paths, "--json"]))
    assert info["written"]["counter"] == "none"
    prom = cli(["info", *paths, "--prometheus"])
    assert "\ntutti_store_bytes_written_total{" not in prom and "# TYPE tutti_store_bytes_written" not in prom
    assert "formatted before its bytes-written counter" in prom
    assert "not kept" in cli(["health", "--store", paths[0], "--store", paths[1]])


# ----------------------------------------------------------------- older libtutti

OLD_READER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tutti/tutti.h"

/* old_reader rw|ro KEY PATH...: open, (rw: put KEY), get KEY back, check every slot (rw: repair), close. */
int main(int argc, char **argv)
{
	int rw = !strcmp(argv[1], "rw");
	struct tt_open_params op = { .flags = rw ? 0 : TT_OPEN_RDONLY, .engine = "psync" };
	struct tt_check_result res = { 0 };
	struct tt_store_info info;
	uint8_t key[TT_KEY_BYTES];
	struct tt_store *s;
	size_t bb;
	uint8_t *in, *out;
	int ret = tt_store_open((const char *const *)argv + 3, (unsigned)(argc - 3), &op, &s);

	if (ret) {
		printf("open: %d %s\n", ret, tt_errmsg());
		return 2;
	}
	tt_store_get_info(s, &info);
	bb = (size_t)info.geo.n_layers * info.geo.n_spans * info.geo.span_bytes;
	in = malloc(bb);
	out = malloc(bb);
	for (size_t i = 0; i < bb; i++)
		in[i] = (uint8_t)(i * 7 + argv[2][0]);
	tt_key_from_bytes(argv[2], strlen(argv[2]), key);
	if (rw && (ret = tt_store_put(s, key, in, bb))) {
		printf("put: %d %s\n", ret, tt_errmsg());
		return 3;
	}
	if ((ret = tt_store_get(s, key, out, bb)) || memcmp(in, out, bb)) {
		printf("get: %d %s\n", ret, tt_errmsg());
		return 4;
	}
	ret = tt_store_check(s, 0, info.geo.n_slots, rw, &res, NULL, 0);
	if (ret || res.ok != res.checked || res.bad || res.bad_records) {	/* every slot read and ok */
		printf("check: %d bad %llu\n", ret, (unsigned long long)(res.bad + res.bad_records));
		return 5;
	}
	printf("ok %llu committed\n", (unsigned long long)info.n_committed);
	tt_store_close(s);
	return 0;
}
"""


def _old_reader(commit: str) -> Path:
    """old_reader built against libtutti at ``commit`` (cached under build/old-libtutti/)."""
    for tool in ("git", "make", "gcc", "tar"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is needed to build an older libtutti")
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                      capture_output=True).returncode:
        pytest.skip(f"commit {commit} is not in this checkout's history (a shallow clone?)")
    where = ROOT / "build" / "old-libtutti" / commit
    exe, prog, src = where / "old_reader", where / "old_reader.c", where / "src"
    lib_a = src / "build" / "libtutti.a"
    if exe.is_file() and prog.is_file() and prog.read_text() == OLD_READER:
        return exe
    if not lib_a.is_file():
        shutil.rmtree(where, ignore_errors=True)
        src.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        r = subprocess.run(["make", "-C", str(src), "-j2", "lib", "BUILD=build", "CFLAGS_EXTRA=-O0"],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    prog.write_text(OLD_READER)
    r = subprocess.run(["gcc", "-std=gnu11", "-D_GNU_SOURCE", "-I", str(src / "libtutti" / "include"),
                        str(prog), "-o", str(exe), str(lib_a),
                        "-luring", "-lxxhash", "-lpthread"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return exe


def _run_old(exe, mode, key, paths):
    r = subprocess.run([str(exe), mode, key, *paths], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"older libtutti refused the store ({mode}): {r.stdout}{r.stderr}"
    return r.stdout


@pytest.mark.parametrize("commit", ["316a193", "f01e365"])
def test_an_older_libtutti_opens_a_store_with_the_counter(make_store, tiny_fp, flip_byte, commit):
    exe = _old_reader(commit)
    paths = make_store(tiny_fp, n_slots=16, n_members=2, stripe_objs=2)
    with Store.open(paths) as s:
        for i in range(3):
            s.put(f"new{i}".encode(), os.urandom(s.block_bytes))
    with Store.open(paths, readonly=True) as s:
        before = [m["bytes"] for m in s.written()["members"]]
        assert s.features()["compat"] == lib.TT_FEAT_COMPAT_WRITTEN
    heads = [copies(p) for p in paths]
    assert all(b[1] != b[0] for b in heads)  # copy B holds a count copy A does not
    assert "ok" in _run_old(exe, "rw", "old1", paths)  # writable: put, get, check --repair
    assert "ok" in _run_old(exe, "ro", "old1", list(reversed(paths)))
    assert [copies(p) for p in paths] == heads  # it rewrote no superblock
    with Store.open(paths) as s:
        w = s.written()
        assert w["counter"] == "kept"
        assert [m["bytes"] for m in w["members"]] == before  # its writes are not counted (it keeps no count)
        assert s.get("old1") and s.get("new2")
        s.put(b"new3", os.urandom(s.block_bytes))
    # A torn copy B (member 1): the older reader still opens the store.
    flip_byte(paths[1], SB + OFF_WRITTEN + 1)
    assert "ok" in _run_old(exe, "rw", "old2", paths)
    with Store.open(paths) as s:
        assert s.written()["members"][1]["restarted"]
        assert s.get("old2") and s.get("new3")
    assert "ok" in _run_old(exe, "ro", "old2", paths)
    if commit == "f01e365":
        return  # it compares only member_bytes and the member count across members: the control below needs more
    # The control: a count in copy A of one member (the rejected design) makes the same reader refuse.
    xxh3 = _xxh3()
    a = bytearray(copies(paths[1])[0])
    a[OFF_WRITTEN:OFF_WRITTEN + 8] = (12345).to_bytes(8, "little")
    a[OFF_SUM:OFF_SUM + 8] = xxh3(bytes(a[:OFF_SUM]), OFF_SUM).to_bytes(8, "little")
    with open(paths[1], "r+b") as f:
        f.write(a)
    r = subprocess.run([str(exe), "ro", "old2", *paths], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "disagrees" in r.stdout, r.stdout
    # The limit docs/format.md states: a member whose copy A is damaged is read from its copy B, which differs
    # from the other members' copy A by the count: this older libtutti refuses the store, this one opens it.
    flip_byte(paths[1], 100)
    r = subprocess.run([str(exe), "ro", "old2", *paths], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "disagrees" in r.stdout, r.stdout
    with Store.open(paths, readonly=True) as s:
        assert s.get("old2") and s.written()["counter"] == "kept"
