"""Every tutti-admin command given every bad value of every option and argument.

The click command tree is walked: every parameter of every command must have a
row in OPTIONS (its kind of value), so an option added later without bad-value
coverage fails test_every_parameter_has_bad_values.  Each kind has a catalogue of
bad values (empty, negative, zero, one past the C field's limit read from the
binding, 2**64, 10**30, 5000 digits, NaN/inf, wrong units, non-UTF-8, control
characters, overlong text, missing files, directories, FIFOs, sockets, character
devices, files that are not stores, a store of another model, malformed configs).

Each bad value is put into a command line that is otherwise valid (BASE; each base
is run once and must succeed, test_base_command_lines_work) and asserted to end with:
the documented exit code, exactly one line on stderr starting with
``tutti-admin: error: <command>:``, no traceback, and every file of the scratch
directory byte-identical, with none added or removed (format and bench bases carry
--force --yes or a bench store, so a bad value that got through would rewrite it).
Controller commands run against the fake sysfs of tests/helpers/fake_sysfs.py.
"""
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from helpers import fake_sysfs
from tutti import Store, devices
from tutti.bench import BenchConfig, run_bench
from tutti.cli import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_MISMATCH, EXIT_STORE, EXIT_USAGE, limits, main
from tutti.sched import LLAMA3_8B as LLAMA_SHAPE

U, S, M = EXIT_USAGE, EXIT_STORE, EXIT_MISMATCH
NOT_UTF8 = "\udcff"  # how Python hands over an argument holding the byte 0xff
DOCS = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


class E:
    """A path in the scratch environment, resolved when the command line is built."""

    def __init__(self, name):
        self.name = name


SMALL = {"--layers": "2", "--kv-heads": "1", "--head-dim": "64", "--dtype": "bfloat16", "--model-id": "test/small"}


def _fake_admin() -> str:
    """A stand-in for mooncake_master's admin HTTP service (an empty cluster), so that `cluster status
    --names-only` has a line that succeeds without a master."""
    import http.server
    import threading

    class Admin(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            body = b'{"status":"ok","role":"leader"}' if self.path == "/health" else b""
            self.send_response(200 if self.path in ("/health", "/get_all_keys") else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Admin)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}"


FAKE_ADMIN = _fake_admin()

# Valid command lines: (arguments, options); a None option value is a flag.
BASE = {
    "format": ([E("store.img")], {**SMALL, "--slots": "4", "--force": None, "--yes": None}),
    "info": ([E("store.img")], dict(SMALL)),
    "check": ([E("store.img")], {**SMALL, "--first": "0", "--count": "4", "--chunk": "2", "--no-progress": None}),
    "bench": ([E("bench.img")], {"--model-config": E("cfg-small.json"), "--prefix-tokens": "32", "--runs": "1",
                                 "--sweep": "1", "--no-fio": None}),
    "list": ([], {}),
    "attach": (["0000:00:05.0"], {}),   # already on tutti.ko in the fake tree: nothing to do
    "detach": (["0000:00:04.0"], {}),   # already on nvme
    "health": (["0000:00:04.0"], {}),
    "hotplug": (["0000:00:04.0"], {"--config": E("attach.conf")}),  # lists another controller: left alone
    "profile": ([], {"--out": E("profile-out.json"), "--device": "cpu", "--tiny": None, "--grid": "16:0",
                     "--repeats": "1"}),
    "plan": ([], {"--model": "llama3-8b", "--tokens": "32K", "--hit-rates": "0.5"}),
    "gpu": ([], {}),
    # fake roots (an empty directory): no GPU, no NVMe, nothing in procfs to judge: ready
    "doctor": ([], {"--sysfs-root": E("dir"), "--procfs-root": E("dir"), "--dev-root": E("dir"),
                    "--etc-root": E("dir")}),
    # a group: only its own options (--help) are tried on it; its commands have lines of their own
    "cluster": ([], {}),
    "cluster serve": ([E("store.img")], {"--check": None}),  # options and store checked, no cluster joined
    "cluster status": ([], {"--admin": FAKE_ADMIN, "--names-only": None}),  # the master's view only
}
# Options a tested option cannot be given with: dropped from the base line first.
DROPS = {"model_config": ("--layers", "--kv-heads", "--head-dim"), "capacity": ("--slots",),
         "profile_path": ("--model",)}

# --------------------------------------------------------------- catalogues


def _words(*extra):
    return [("empty", "", U), ("word", "abc", U), ("not UTF-8", NOT_UTF8, U), *extra]


def whole(lo=1, top=None, other=(), library=()):
    """Whole numbers >= lo, at most ``top()`` (a limit read from the binding).  ``other``: values of
    another model (info/check: exit 4); ``library``: values the type takes but libtutti (or the room the
    machine has) refuses (format, bench)."""
    def bad(cmd):
        out = _words(("negative", "-1", U), ("fraction", "1.5", U), ("NaN", "nan", U), ("inf", "inf", U),
                     ("unit", "1GiB", U), ("hex", "0x10", U), ("2**64", str(2**64), U), ("10**30", str(10**30), U),
                     ("5000 digits", "9" * 5000, U))
        if lo >= 1:
            out.append(("zero", "0", U))
        if top is not None:
            out.append(("limit+1", str(top() + 1), U))
        if cmd in ("info", "check"):
            out += [(f"another model {v}", v() if callable(v) else v, M) for v in other]
        if cmd in ("format", "bench"):
            out += [(f"refused by libtutti {v}", v() if callable(v) else v, U) for v in library]
        return out
    return bad


def field(struct, name, lo=1, **kw):
    return whole(lo, lambda: limits.field_max(struct, name), **kw)


def arg(function, index, lo=1):
    return whole(lo, lambda: limits.arg_max(function, index))


def fp_field(name, lo=1, other=(), library=True):
    top = lambda: limits.field_max("tt_fingerprint", name)
    return whole(lo, top, other=other, library=[top] if library else ())


def finite(lo_bad=("0", "-1")):
    return lambda cmd: _words(("NaN", "nan", U), ("inf", "inf", U), ("-inf", "-inf", U), ("1e400", "1e400", U),
                              ("units", "7GB", U), ("10**30", str(10**30), U),
                              *[(f"below range {v}", v, U) for v in lo_bad])


def size(library=()):
    return lambda cmd: _words(("negative", "-1", U), ("zero", "0", U), ("unknown unit", "12 bananas", U),
                              ("exponent", "1e30", U), ("NaN", "nan", U), ("inf", "inf", U),
                              ("half a byte", "0.5", U), ("2**64 bytes", str(2**64), U),
                              ("5000 digits", "9" * 5000, U), *[(f"refused: {v}", v, U) for v in library])


def text(limit=None, other=(), library=()):
    def bad(cmd):
        out = _words(("blank", "   ", U), ("newline", "a\nb", U), ("tab", "a\tb", U))
        out = [b for b in out if b[0] != "word"]
        if limit is not None:
            out += [("limit+1 bytes", "x" * (limit() + 1), U), ("10000 chars", "é" * 10000, U)]
        if cmd in ("info", "check"):
            out += [(f"another model {v}", v, M) for v in other]
        if cmd in ("format", "bench"):
            out += [(f"refused by libtutti {v}", v, U) for v in library]
        return out
    return bad


def choice(*extra):
    return lambda cmd: _words(("case or typo", "banana", U), *[(v, v, U) for v in extra])


def flag(cmd):
    return [("a value", "=x", U)]


def words_list(*extra):
    return lambda cmd: _words(("zero", "0", U), ("negative", "-1", U), ("NaN", "nan", U), ("empty item", "1,,x", U),
                              ("5000 digits", "9" * 5000, U), *[(v, v, U) for v in extra])


def _members():
    return [("empty", "", U), ("directory", E("dir"), U), ("FIFO", E("fifo"), U), ("socket", E("sock"), U),
              ("character device", "/dev/null", U), ("under a file", E("notstore.img/x"), U),
              ("overlong", "/tmp/" + "x" * 5000, U), ("named twice", [E("store.img"), E("store.img")], U),
              ("too many members", lambda: [E(f"m{i}.img") for i in range(limits.max_members() + 1)], U)]


def members(cmd):
    out = _members()
    if cmd == "format":
        out += [("no such directory", E("nodir/s.img"), U), ("fake tutti.ko node", "/dev/zero", U)]
    elif cmd == "bench":
        out += [("not a store", E("notstore.img"), U), ("a user's store", E("store.img"), U)]
    else:
        out += [("missing", E("missing.img"), S), ("missing, not UTF-8", E(f"{NOT_UTF8}.img"), S),
                ("not a store", E("notstore.img"), S), ("empty file", E("empty.img"), S),
                ("fake tutti.ko node", "/dev/zero", S)]
    return out


def _inputs(missing=True):
    out = [("empty", "", U), ("directory", E("dir"), U), ("FIFO", E("fifo"), U), ("socket", E("sock"), U),
           ("character device", "/dev/null", U), ("under a file", E("notstore.img/x"), U),
           ("overlong", "/tmp/" + "x" * 5000, U)]
    if missing:
        out += [("missing", E("missing.json"), U), ("missing, not UTF-8", E(f"{NOT_UTF8}.json"), U)]
    return out


def model_config(cmd):
    out = _inputs() + [(f"config {n}", E(f"cfg-{n}.json"), U) for n in BAD_CONFIGS]
    if cmd in ("info", "check"):
        out.append(("another model", E("cfg-other.json"), M))
    return out


def output_file(cmd):
    return [("empty", "", U), ("directory", E("dir"), U), ("FIFO", E("fifo"), U), ("socket", E("sock"), U),
            ("character device", "/dev/null", U), ("no such directory", E("nodir/out"), U),
            ("under a file", E("notstore.img/x"), U), ("overlong", "/tmp/" + "x" * 5000, U)]


def device(cmd):
    return [("empty", "", U), ("word", "banana", U), ("not UTF-8", NOT_UTF8, U),
            ("bad device number", "0000:00:20.0", U), ("bad function", "00:04.8", U),
            ("network card", "0000:00:03.0", U), ("not NVMe", "/dev/random", U),
            ("regular file", E("notstore.img"), U), ("directory", E("dir"), U), ("FIFO", E("fifo"), U),
            ("socket", E("sock"), U), ("overlong", "/tmp/" + "x" * 5000, U),
            ("no such PCI device", "0000:00:09.0", S), ("no such node", "/dev/nvme97n3", S)]


BAD_CONFIGS = {
    "array": "[1, 2]", "string": '"llama"', "not-json": "{layers: 2", "float-layers": None, "zero-layers": None,
    "huge-layers": None, "string-layers": None, "bool-layers": None, "nan-layers": None, "zero-heads": None,
    "not-utf8": b"\xff\xfe{}", "deep": "[" * 100000, "empty": "",
}
_CFG = {"_name_or_path": "test/small", "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1,
        "head_dim": 64, "torch_dtype": "bfloat16"}
_CFG_CHANGES = {"float-layers": {"num_hidden_layers": 2.5}, "zero-layers": {"num_hidden_layers": 0},
                "huge-layers": {"num_hidden_layers": 2**64}, "string-layers": {"num_hidden_layers": "2"},
                "bool-layers": {"num_hidden_layers": True}, "nan-layers": {"num_hidden_layers": float("nan")},
                "zero-heads": {"num_attention_heads": 0, "num_key_value_heads": None, "head_dim": None,
                               "hidden_size": 64}}
BAD_PROFILES = {"not-json": "{", "array": "[]", "not-utf8": b"\xff", "version": '{"version": 99}',
                "nan": None, "deep": "[" * 100000}

FP = "tt_fingerprint"
OPTIONS = {  # parameter name -> the catalogue of its bad values (the kind of value it takes)
    "version": flag, "as_json": flag, "force": flag, "yes": flag, "repair": flag, "progress": flag,
    "no_fio": flag, "tiny": flag, "with_io": flag, "sparse": flag,
    "paths": members, "extra_paths": members, "store_paths": members, "model_config": model_config,
    "layers": fp_field("n_layers", other=("3", lambda: str(limits.field_max(FP, "n_layers")))),
    "kv_heads": fp_field("kv_heads", other=("2",)),
    "head_dim": fp_field("head_dim", other=("128",)),
    "block_size": fp_field("block_size", other=("32",)),
    "tp_rank": fp_field("tp_rank", lo=0, other=()),
    "tp_size": fp_field("tp_size", other=("2",), library=False),
    "dtype": text(limits.dtype_bytes, other=("float16",), library=("banana",)),
    "model_id": text(limits.model_id_bytes, other=("other/model",)),
    "capacity": size(library=("4096", "1PiB")),
    "size": size(library=("4096", "1PiB")),
    "slots": field("tt_format_params", "n_slots", library=(lambda: str(limits.field_max("tt_format_params",
                                                                                        "n_slots")),)),
    "spans": field("tt_format_params", "n_spans", library=("100000",)),
    "span_bytes": field("tt_format_params", "span_bytes", library=("3000000000",)),
    "stripe_objs": field("tt_format_params", "stripe_objs"),
    "first": arg("tt_store_check", 1, lo=0),
    "count": arg("tt_store_check", 2),
    "chunk": arg("tt_store_check", 6),
    "prefix_tokens": whole(1, lambda: limits.field_max("tt_format_params", "n_slots"),
                           library=("8", str(10**15))),  # less than a block; more than memory holds
    "runs": whole(1, lambda: 100),
    "repeats": whole(1, lambda: 100),
    "cpu_threads": whole(0, lambda: 1024),
    "sweep": words_list("x,1"),
    "engine": choice("kqueue", "AUTO"),
    "output": output_file, "out": output_file,
    "section": text(),
    "seed": lambda cmd: _words(("fraction", "1.5", U), ("NaN", "nan", U), ("5000 digits", "9" * 5000, U)),
    "device": device,
    "config": lambda cmd: _inputs(missing=False),
    "require": choice("STAGED"),
    "model_name": choice("gpt-5"),
    "profile_path": lambda cmd: _inputs() + [(f"profile {n}", E(f"prof-{n}.json"), U) for n in BAD_PROFILES],
    "ssd_gbps": finite(), "ssd_write_gbps": finite(), "pcie_gbps": finite(), "tflops": finite(),
    "hbm_gbps": finite(), "mfu": finite(("0", "-1", "1.5")), "io_rate_gbps": finite(("-1",)),
    "n_ssd": whole(1, limits.max_members), "io_namespaces": whole(1, limits.max_members),
    "io_blocks": field("tt_format_params", "n_slots"),
    "prefetch_depth": field(FP, "n_layers"),
    "tokens": words_list("32X", "1.5K", "9" * 40, str(10**20)),
    "rates": lambda cmd: _words(("NaN", "nan", U), ("inf", "inf", U), ("above 1", "1.5", U), ("negative", "-0.1", U),
                                ("150%", "150%", U), ("empty item", "0.5,,", U)),
    "preset": choice("gpt-5"),
    "grid": lambda cmd: _words(("zero new", "0:0", U), ("negative", "1:-1", U), ("no prefix", "16", U),
                               ("three parts", "16:0:0", U), ("too long for memory", "99999999999999:0", U),
                               ("40 digits", "9" * 40 + ":0", U)),
}
OPTIONS.update({
    "master": text(), "metadata": text(), "host": text(), "port": whole(1, lambda: 65535), "check_only": flag,
    "options": lambda cmd: _words(("no value", "cluster_port", U), ("not a cluster key", "x=1", U),
                                  ("unknown key", "cluster_nope=1", U), ("not a number", "cluster_port=x", U),
                                  ("unbounded wait", "cluster_call_timeout_s=inf", U),
                                  ("control character", "cluster_host=a\nb", U)),
    "admin": lambda cmd: [("empty", "", U), ("no scheme", "127.0.0.1:9003", U), ("a file", "file:///etc/passwd", U),
                          ("space", "http://a b", U), ("newline", "http://a\nb", U), ("not UTF-8", NOT_UTF8, U),
                          ("nothing there", "http://127.0.0.1:1", S)],
    "names_only": flag,
    "compare": choice("LMCACHE", "mooncake"),
    "lmcache_python": lambda cmd: _inputs(),
    "prometheus": flag, "rated_tbw": finite(), "dwpd": finite(), "warranty_years": finite(),
    **{f"{r}_root": lambda cmd: [("empty", "", U), ("missing", E("missing-dir"), U), ("a file", E("notstore.img"), U),
                                 ("FIFO", E("fifo"), U)] for r in ("sysfs", "procfs", "dev", "etc")},
})


def store_places(cmd):
    """doctor's PATH...: a member (existing or not) or a directory; never a FIFO, socket or char device."""
    return [("empty", "", U), ("FIFO", E("fifo"), U), ("socket", E("sock"), U), ("character device", "/dev/null", U),
            ("under a file", E("notstore.img/x"), U), ("no such directory", E("nodir/s.img"), U),
            ("overlong", "/tmp/" + "x" * 5000, U)]


# Catalogue entries keyed by (command, parameter) where one parameter name means different things.
OPTIONS_BY_COMMAND = {("profile", "device"): choice("cpu:1", "meta", "cuda:99"), ("doctor", "paths"): store_places,
                      ("cluster status", "port"): whole(0, lambda: 65535)}  # 0: a free port


# ------------------------------------------------------------ the tree


_CTX = main.make_context("tutti-admin", ["list"], resilient_parsing=True)
HELP = "help"  # click names its help option by version ("help", "_click_default_help"): found by its flags


def _name(param) -> str:
    return HELP if "--help" in param.opts else param.name


def _catalogue(cmd: str, pname: str):
    if pname == HELP:
        return flag
    return OPTIONS_BY_COMMAND.get((cmd, pname)) or OPTIONS.get(pname)


def _command(path: str):
    """The click command of ``path`` ("info", "cluster serve")."""
    cmd = main
    for word in path.split():
        cmd = cmd.get_command(_CTX, word)
    return cmd


def _is_group(path: str) -> bool:
    return isinstance(_command(path), click.Group)


def _command_paths() -> list:
    """Every command, and every command of a group ("cluster serve")."""
    out = []
    for name in main.list_commands(_CTX):
        out.append(name)
        sub = main.get_command(_CTX, name)
        if isinstance(sub, click.Group):
            out += [f"{name} {n}" for n in sub.list_commands(_CTX)]
    return out


def _tree():
    """(command path or None for tutti-admin itself, parameter) for every parameter of the command tree."""
    out = [(None, p) for p in main.get_params(_CTX)]
    for path in _command_paths():
        out += [(path, p) for p in _command(path).get_params(_CTX)]
    return out


def _cases():
    cases = []
    for cmd, param in _tree():
        cat = _catalogue(cmd or "", _name(param))
        if cat is None:
            continue  # test_every_parameter_has_bad_values reports it
        for label, value, code in cat(cmd or ""):
            cases.append(pytest.param(cmd, _name(param), value, code,
                                      id=f"{cmd or 'tutti-admin'}-{_name(param)}-{label}"))
    return cases


def test_every_parameter_has_bad_values():
    """A parameter added without a catalogue row (its kind of value) fails here, until it is covered."""
    missing = [f"{cmd or 'tutti-admin'} {param.opts[0] if param.opts else param.name}" for cmd, param in _tree()
               if _catalogue(cmd or "", _name(param)) is None]
    assert not missing, "no bad-value coverage for: " + ", ".join(missing)
    unused = set(OPTIONS) - {_name(p) for _, p in _tree()}
    assert not unused, f"catalogue rows for parameters that no longer exist: {sorted(unused)}"
    assert set(BASE) == set(_command_paths()), "every command needs a valid base command line"


def test_exit_codes_used_here_are_the_documented_ones():
    table = re.findall(r"^\| (\d+) \|", DOCS.read_text(), re.M)
    documented = {int(c) for c in table}
    from tutti.cli import common

    constants = {v for k, v in vars(common).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert documented == constants, f"docs/cli.md's exit-code table {sorted(documented)} != {sorted(constants)}"
    used = {c.values[3] for c in _cases()}
    assert used <= documented


# ---------------------------------------------------------- environment


def _write_json(path: Path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A scratch directory with a store, a benchmark store, bad files of every kind, and the fake sysfs."""
    d = tmp_path_factory.mktemp("bad")
    run_ok(["format", str(d / "store.img"), *_flat(SMALL), "--slots", "4"])
    with Store.open([str(d / "store.img")]) as s:
        s.put(b"block-0", os.urandom(s.block_bytes))
    (d / "notstore.img").write_bytes(os.urandom(1 << 16))
    (d / "empty.img").write_bytes(b"")
    (d / "dir").mkdir()
    os.mkfifo(d / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock"))
    _write_json(d / "cfg-small.json", _CFG)
    _write_json(d / "cfg-other.json", {**_CFG, "num_hidden_layers": 3})
    for name, content in BAD_CONFIGS.items():
        if content is None:
            content = {k: v for k, v in {**_CFG, **_CFG_CHANGES[name]}.items() if v is not None}
        _write_json(d / f"cfg-{name}.json", content)
    good = {"version": 1, "device": "cpu", "date": "2026-01-01", "model": LLAMA_SHAPE.to_dict(),
            "compute": [{"new_tokens": n, "prefix_tokens": 0, "layer_s": 1e-3 * n} for n in (16, 64, 256)]}
    for name, content in BAD_PROFILES.items():
        if content is None:
            content = json.dumps(good).replace('"layer_s": 0.016', '"layer_s": NaN')
        _write_json(d / f"prof-{name}.json", content)
    (d / "attach.conf").write_text("0000:00:06.0\n")
    res = run_bench(BenchConfig(paths=[str(d / "bench.img")], prefix_tokens=32, runs=1, fio=False, sweep=(1,),
                                fp=_small_fp(d)))
    assert res["verified"]
    fake = fake_sysfs.build(tmp_path_factory.mktemp("fake"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(devices, "SYS", fake)
        mp.setattr(devices, "smart_log",
                   lambda bdf, sysfs=None: (devices.describe_controller(bdf, fake, probe=False), bytes(512)))
        mp.setattr(devices, "_lib", lambda: pytest.fail("libtutti's attach/detach must not be reached"))
        before = hashes(d)
        yield d
        assert hashes(d) == before, "a file's bytes changed during the bad-input tests"
    sock.close()


def _small_fp(d):
    from tutti import Fingerprint

    return Fingerprint.from_config(str(d / "cfg-small.json"))


def _flat(opts: dict) -> list:
    out = []
    for k, v in opts.items():
        out += [k] if v is None else [k, v]
    return out


def _resolve(v, d: Path, rename=None):
    if callable(v) and not isinstance(v, E):
        v = v()
    if isinstance(v, list):
        return [_resolve(x, d, rename) for x in v]
    if isinstance(v, E):
        return str(d / (rename or {}).get(v.name, v.name))
    return v


def _option_name(param) -> str:
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def command_line(cmd, pname, value, d: Path) -> list:
    """BASE[cmd] with parameter ``pname`` given ``value`` (a flag: given '=x')."""
    if cmd is None:
        return [f"--{pname}{value}"]
    if callable(value) and not isinstance(value, E):
        value = value()
    args, opts = BASE[cmd]
    opts = {k: v for k, v in opts.items() if k not in DROPS.get(pname, ())}
    param = next(p for p in _command(cmd).get_params(_CTX) if _name(p) == pname)
    extra = []
    if param.param_type_name == "argument":
        args = value if isinstance(value, list) else [value]
    else:
        name = _option_name(param)
        for o in (*param.opts, *param.secondary_opts):
            opts.pop(o, None)
        if _catalogue(cmd, pname) is flag:
            extra = [f"{name}{value}"]
        else:
            for v in (value if isinstance(value, list) else [value]):
                extra += [name, v]
    return [*cmd.split(), *[_resolve(a, d) for a in args], *_resolve(_flat(opts), d), *_resolve(extra, d)]


def snapshot(d: Path) -> dict:
    """Every entry of the scratch directory with its size, inode and change times: any write to a file
    changes its mtime and ctime, so this tells after each command whether anything was touched."""
    return {name: (st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            for name in sorted(os.listdir(d)) for st in [os.lstat(d / name)]}


def hashes(d: Path) -> dict:
    """The contents' hash of every regular file of the scratch directory."""
    return {name: hashlib.sha256((d / name).read_bytes()).hexdigest()
            for name in sorted(os.listdir(d)) if (d / name).is_file() and not (d / name).is_symlink()}


def run_cli(argv) -> "CliRunner.Result":
    return CliRunner().invoke(main, argv)


def run_ok(argv):
    res = run_cli(argv)
    assert res.exit_code == 0, f"{argv}: exit {res.exit_code}\n{res.output}"
    return res


def assert_one_error_line(res, cmd, code):
    err = res.stderr
    assert res.exit_code == code, f"exit {res.exit_code}, documented {code}\n{res.output}"
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    lines = err.splitlines()
    assert len(lines) == 1, f"stderr is not one line:\n{err}"
    assert lines[0].startswith("tutti-admin: error: " + (f"{cmd}: " if cmd else "")), lines[0]
    assert "a bug in tutti-admin" not in lines[0], lines[0]  # the guard: the bad value was not recognised


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("cmd", sorted(c for c in BASE if not _is_group(c)))
def test_base_command_lines_work(env, cmd, tmp_path):
    """Each base line succeeds, so a bad value put into it is what makes it fail."""
    for name in ("store.img", "bench.img"):
        shutil.copy(env / name, tmp_path / name)
    rename = {"store.img": str(tmp_path / "store.img"), "bench.img": str(tmp_path / "bench.img"),
              "profile-out.json": str(tmp_path / "profile-out.json")}
    args, opts = BASE[cmd]
    run_ok([*cmd.split(), *_resolve(args, env, rename), *_resolve(_flat(opts), env, rename)])


@pytest.mark.parametrize("cmd,pname,value,code", _cases())
def test_bad_value(env, cmd, pname, value, code):
    before = snapshot(env)
    res = run_cli(command_line(cmd, pname, value, env))
    assert_one_error_line(res, cmd, code)
    assert snapshot(env) == before, "a file was changed, created or removed"


@pytest.mark.parametrize("cmd", sorted(BASE))
def test_unknown_option_and_extra_argument(env, cmd):
    assert_one_error_line(run_cli([*cmd.split(), "--no-such-option"]), cmd, U)
    params = _command(cmd).params
    if not any(p.param_type_name == "argument" and p.nargs == -1 for p in params):
        args, opts = BASE[cmd]
        assert_one_error_line(run_cli([*cmd.split(), *_resolve(args, env), "extra", *_resolve(_flat(opts), env)]),
                              cmd, U)


@pytest.mark.parametrize("argv,cmd", [
    (["format", E("store.img"), *_flat(SMALL), "--slots", "4", "--capacity", "1MiB", "--force", "--yes"], "format"),
    (["format", E("store.img"), *_flat(SMALL), "--model-config", E("cfg-small.json"), "--slots", "4"], "format"),
    (["format", E("store.img"), "--layers", "2", "--slots", "4", "--force", "--yes"], "format"),
    (["format", E("new.img"), *_flat(SMALL)], "format"),  # a regular file needs a size
    (["format", E("store.img"), *_flat(SMALL), "--slots", "8"], "format"),  # a store there, no --force
    (["format", E("store.img"), *_flat(SMALL), "--slots", "8", "--force"], "format"),  # no terminal, no --yes
    (["info", E("store.img"), *_flat(SMALL), "--tp-rank", "2", "--tp-size", "2"], "info"),
    (["info", E("store.img"), "--model-id", "other/model"], "info"),  # an expectation with no geometry
    (["check", E("store.img"), "--dtype", "float16"], "check"),
    (["check", E("store.img"), "--first", "4"], "check"),  # beyond the last slot
    (["bench", E("store.img"), "--prefix-tokens", "32", "--no-fio"], "bench"),  # a user's store
    (["bench", "--prefix-tokens", "32"], "bench"),  # no path
    (["plan", "--model", "llama3-8b", "--profile", E("cfg-small.json")], "plan"),
    (["plan"], "plan"),
], ids=lambda v: None)
def test_bad_combinations(env, argv, cmd):
    """Values each fine alone that do not go together: exit 2, one line, nothing written."""
    before = snapshot(env)
    assert_one_error_line(run_cli(_resolve(argv, env)), cmd, U)
    assert snapshot(env) == before


@pytest.mark.parametrize("argv", [[], ["formatt"], ["--no-such-option"]], ids=["none", "typo", "option"])
def test_group_usage_errors(argv):
    assert_one_error_line(run_cli(argv), None, U)


def test_unexpected_failure_is_one_line_and_debuggable(env, monkeypatch):
    """The guard: an exception no command expects is one line and exit 5; TUTTI_ADMIN_DEBUG=1 shows it."""
    from tutti.cli import store_cmds

    monkeypatch.setattr(store_cmds, "_store_summary", lambda s: 1 / 0)
    res = run_cli(["info", str(env / "store.img")])
    assert res.exit_code == EXIT_INTERNAL and res.stderr.count("\n") == 1
    assert "unexpected ZeroDivisionError" in res.stderr and "TUTTI_ADMIN_DEBUG=1" in res.stderr
    monkeypatch.setenv("TUTTI_ADMIN_DEBUG", "1")
    res = run_cli(["info", str(env / "store.img")])
    assert isinstance(res.exception, ZeroDivisionError)


def test_interrupt_is_one_line(env, monkeypatch):
    from tutti.cli import store_cmds

    def interrupted(s):
        raise KeyboardInterrupt

    monkeypatch.setattr(store_cmds, "_store_summary", interrupted)
    assert_one_error_line(run_cli(["info", str(env / "store.img")]), "info", EXIT_INTERRUPTED)


def test_fingerprint_mismatch_is_said_once(env):
    res = run_cli(["info", str(env / "store.img"), *_flat({**SMALL, "--layers": "3"})])
    assert_one_error_line(res, "info", M)
    assert res.stderr.count("fingerprint mismatch") == 1, res.stderr


def _script():
    exe = Path(sys.executable).with_name("tutti-admin")
    if not exe.exists():
        pytest.skip("tutti-admin console script is not installed")
    return str(exe)


def test_console_script_sample_has_no_traceback(env):
    """End to end through the installed script and a real argv (bytes that are not UTF-8 included):
    a sample of the bad inputs, each bounded in time (format on a FIFO used to block forever)."""
    exe, d = _script(), os.fsencode(env)
    small = [os.fsencode(x) for x in _flat(SMALL)]
    sample = [
        ([b"format", d + b"/fifo", *small, b"--slots", b"4"], U),
        ([b"format", d + b"/new.img", *small, b"--slots", str(2**64).encode()], U),
        ([b"format", d + b"/new.img", *small, b"--capacity", b"4096"], U),
        ([b"format", d + b"/new.img", b"--model-config", d + b"/cfg-array.json", b"--slots", b"4"], U),
        ([b"format", d + b"/new.img", *small, b"--model-id", b"\xff\xfe", b"--slots", b"4"], U),
        ([b"info", d + b"/\xff.img"], S),
        ([b"info", d + b"/store.img", *small[:-2], b"--model-id", b"other/model"], M),
        ([b"check", d + b"/store.img", b"--chunk", str(2**40).encode()], U),
        ([b"attach", b"\xff"], U),
        ([], U),
    ]
    before = snapshot(env)
    for argv, code in sample:
        p = subprocess.run([exe, *argv], capture_output=True, timeout=60)
        err = p.stderr.decode("utf-8", "replace")
        assert p.returncode == code, f"{argv}: exit {p.returncode}\n{err}"
        assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("tutti-admin: error: "), err
    assert snapshot(env) == before
