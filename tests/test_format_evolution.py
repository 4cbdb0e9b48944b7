"""Format evolution (docs/format.md): stores of another version and unknown feature bits.

Each kind of store is made by editing a freshly formatted one and resealing its superblock
checksums (XXH3-64, through the system's libxxhash, as libtutti computes them), then used
as a user would: tutti.Store.open / probe, and tutti-admin info, check and format.

  another format version, unknown incompat bit   no open at all (EOPNOTSUPP), exit 3
  unknown ro_compat bit                          read-only only (EROFS when writable)
  unknown compat bit                             ignored: opens and works normally
  any of them                                    format refuses without --force, exit 2
"""
import ctypes
import ctypes.util
import errno
import json

import pytest
from click.testing import CliRunner

from tutti import Store, TuttiError
from tutti._tutti import ffi, lib
from tutti.cli import EXIT_STORE, EXIT_USAGE, main

SMALL = ["--layers", "4", "--kv-heads", "2", "--head-dim", "64", "--dtype", "bfloat16", "--model-id", "test/tiny"]

# Superblock layout (libtutti/include/tutti/format.h): the feature masks follow fp_hash.
SB_SIZE = lib.TT_SB_SIZE
OFF_VERSION = ffi.offsetof("struct tt_superblock", "version")
OFF_FLAGS = ffi.offsetof("struct tt_superblock", "flags")
OFF_FEAT = ffi.offsetof("struct tt_superblock", "fp_hash") + 8
OFF_SUM = ffi.offsetof("struct tt_superblock", "sb_sum")
FEAT = {"compat": OFF_FEAT, "ro_compat": OFF_FEAT + 8, "incompat": OFF_FEAT + 16}


def _xxh3():
    name = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
    try:
        xx = ctypes.CDLL(name)
        fn = xx.XXH3_64bits
    except (OSError, AttributeError):
        pytest.skip("libxxhash with XXH3_64bits is needed to reseal superblocks")
    fn.restype = ctypes.c_uint64
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return fn


def edit_superblocks(path, **fields):
    """Set superblock fields in both copies (version, flags, compat, ro_compat, incompat) and reseal."""
    xxh3 = _xxh3()
    with open(path, "r+b") as f:
        for copy in range(lib.TT_SB_COPIES):
            f.seek(copy * SB_SIZE)
            sb = bytearray(f.read(SB_SIZE))
            for name, value in fields.items():
                if name == "magic":
                    sb[0:8] = value
                elif name in FEAT:
                    sb[FEAT[name]:FEAT[name] + 8] = value.to_bytes(8, "little")
                else:
                    off = {"version": OFF_VERSION, "flags": OFF_FLAGS}[name]
                    sb[off:off + 4] = value.to_bytes(4, "little")
            sb[OFF_SUM:OFF_SUM + 8] = xxh3(bytes(sb[:OFF_SUM]), OFF_SUM).to_bytes(8, "little")
            f.seek(copy * SB_SIZE)
            f.write(sb)


def cli(args, expect):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == expect, f"exit {res.exit_code} != {expect}\n{res.output}"
    assert "Traceback" not in res.output
    return res.output


@pytest.fixture
def store_with(make_store, tiny_fp):
    """A one-member store holding one block, with the given superblock edits."""

    def make(**fields):
        (path,) = make_store(tiny_fp, n_slots=8)
        with Store.open([path]) as s:
            s.put("kept", bytes(range(256)) * (s.block_bytes // 256))
        edit_superblocks(path, **fields)
        return path

    return make


REFUSED = {
    "version 2": ({"version": 2}, "format version 2"),
    "magic TUTTIKV2": ({"magic": b"TUTTIKV2", "version": 2}, "magic 'TUTTIKV2'"),
    "incompat bit": ({"incompat": 1 << 4}, "incompatible features 0x10"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_store_does_not_open(store_with, file_digest, case):
    fields, words = REFUSED[case]
    path = store_with(**fields)
    before = file_digest(path)
    for readonly in (False, True):
        with pytest.raises(TuttiError) as exc:
            Store.open([path], readonly=readonly)
        assert exc.value.errno == errno.EOPNOTSUPP
        assert words in exc.value.strerror and "upgrade tutti" in exc.value.strerror
    out = cli(["info", path], EXIT_STORE)
    assert words in out
    out = cli(["check", path], EXIT_STORE)
    assert words in out
    assert file_digest(path) == before
    assert Store.probe(path)["kind"] == ("store" if case == "incompat bit" else "other_version")


@pytest.mark.parametrize("case", list(REFUSED) + ["ro_compat bit", "compat bit"])
def test_format_refuses_without_force(store_with, file_digest, tiny_fp, case):
    fields = REFUSED[case][0] if case in REFUSED else {case.split()[0]: 1 << 2}
    path = store_with(**fields)
    before = file_digest(path)
    out = cli(["format", path, "--slots", "8", "--yes", *SMALL], EXIT_USAGE)
    assert "already holds a Tutti store" in out and "--force" in out
    if case.startswith("version") or case.startswith("magic"):
        assert "format version 2" in out
    assert file_digest(path) == before
    with pytest.raises(TuttiError) as exc:  # the library refuses on its own too
        Store.format([path], tiny_fp, n_slots=8)
    assert exc.value.errno == errno.EEXIST
    assert file_digest(path) == before
    cli(["format", path, "--slots", "8", "--yes", "--force", *SMALL], 0)
    with Store.open([path]) as s:
        assert s.info()["n_committed"] == 0


def test_unknown_ro_compat_opens_read_only_only(store_with, file_digest):
    path = store_with(ro_compat=1 << 2)
    before = file_digest(path)
    with pytest.raises(TuttiError) as exc:
        Store.open([path])
    assert exc.value.errno == errno.EROFS
    assert "read-only" in exc.value.strerror and "0x4" in exc.value.strerror
    with Store.open([path], readonly=True) as s:
        assert s.features()["unknown_ro_compat"] == 1 << 2
        assert s.get("kept") == bytes(range(256)) * (s.block_bytes // 256)
        with pytest.raises(TuttiError):
            s.put("new", bytes(s.block_bytes))
    info = json.loads(cli(["info", path, "--json"], 0))
    assert info["features"]["ro_compat"] == 1 << 2
    cli(["check", path], 0)
    out = cli(["check", path, "--repair"], EXIT_STORE)
    assert "read-only" in out
    assert file_digest(path) == before


def test_unknown_compat_is_ignored(store_with):
    path = store_with(compat=1 << 9)
    with Store.open([path]) as s:
        assert s.features()["unknown_compat"] == 1 << 9
        assert s.get("kept") == bytes(range(256)) * (s.block_bytes // 256)
        s.put("new", b"\x5a" * s.block_bytes)
    with Store.open([path]) as s:
        assert s.get("new") == b"\x5a" * s.block_bytes
        assert s.features()["compat"] == 1 << 9  # use never clears it
    info = json.loads(cli(["info", path, "--json"], 0))
    assert info["features"]["unknown_compat"] == 1 << 9 and info["n_committed"] == 2
    cli(["check", path, "--repair"], 0)


def test_reserved_field_without_a_feature_is_damage(store_with):
    path = store_with(flags=1)
    with pytest.raises(TuttiError) as exc:
        Store.open([path], readonly=True)
    assert exc.value.errno == errno.EINVAL and "reserved fields" in exc.value.strerror
    assert "reserved fields are not zero" in cli(["info", path], EXIT_STORE)
    # An unknown compat bit may give the field a meaning: then it opens (bit 0, the bytes-written counter, is
    # known: it explains only the count's own bytes).
    edit_superblocks(path, compat=1 | 1 << 9)
    with Store.open([path], readonly=True) as s:
        assert s.features()["compat"] == 1 | 1 << 9 and s.features()["unknown_compat"] == 1 << 9


def test_probe_kinds(tmp_path, make_store, tiny_fp):
    (path,) = make_store(tiny_fp, n_slots=8)
    pr = Store.probe(path)
    assert pr["kind"] == "store" and pr["version"] == lib.TT_FORMAT_VERSION and pr["n_members"] == 1
    # new stores carry one known compat feature: the bytes-written counter in superblock copy B
    assert lib.TT_FEAT_COMPAT_WRITTEN == 1 and lib.TT_FEAT_COMPAT_KNOWN == lib.TT_FEAT_COMPAT_WRITTEN
    assert pr["features"] == {"compat": lib.TT_FEAT_COMPAT_WRITTEN, "ro_compat": 0, "incompat": 0,
                              "unknown_compat": 0, "unknown_ro_compat": 0}
    with open(path, "r+b") as f:  # copy A gone, copy B damaged: still "a store was here"
        f.write(bytes(SB_SIZE))
        f.seek(SB_SIZE + 200)
        f.write(b"\xff")
    assert Store.probe(path)["kind"] == "damaged"
    other = tmp_path / "other.bin"
    other.write_bytes(b"hello" * 1000)
    assert Store.probe(other)["kind"] == "none"
    with pytest.raises(TuttiError) as exc:
        Store.probe(tmp_path / "missing")
    assert exc.value.errno == errno.ENOENT
