"""tutti._cdefs: both cffi bindings take their declarations from the headers' cffi sections, with the
compiler's layouts; one edit of a header reaches both.

The ABI-mode binding (tutti.gpu, no compiler where it runs) is only as good as cffi's reading of the
sections: every struct it declares is compared here, size and every field offset, and every constant, with
what gcc makes of the real headers.  The API-mode extension is checked by the compiler when it is built.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest
from cffi import FFI

from tutti import _cdefs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = os.path.join(ROOT, "libtutti", "include")

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")


def _complete_structs(ffi) -> list:
    """Names of the structs ``ffi`` knows with their fields (not the opaque ones)."""
    out = []
    for name in ffi.list_types()[1]:
        try:
            ffi.sizeof(f"struct {name}")  # first: .fields of an opaque struct aborts in API mode (cffi 2.1)
        except Exception:  # noqa: BLE001 - ffi.error (API mode) or FFIError (ABI mode): opaque
            continue
        out.append(name)
    return sorted(out)


def _compiler_says(tmp_path, include, headers, ffi, constants):
    """(what gcc says, what cffi says): size and field offsets of every complete struct, every constant."""
    lines = ["#include <stdio.h>", "#include <stddef.h>", *(f'#include "tutti/{h}"' for h in headers),
             "int main(void) {"]
    expect = []
    for name, value in sorted(constants.items()):
        if isinstance(value, int):
            lines.append(f'printf("{name} %lld\\n", (long long)({name}));')
        else:
            lines.append(f'printf("{name} %s\\n", {name});')
        expect.append(f"{name} {value}")
    for s in _complete_structs(ffi):
        lines.append(f'printf("sizeof {s} %zu\\n", sizeof(struct {s}));')
        expect.append(f"sizeof {s} {ffi.sizeof(f'struct {s}')}")
        for field, f in ffi.typeof(f"struct {s}").fields:
            lines.append(f'printf("{s}.{field} %zu\\n", offsetof(struct {s}, {field}));')
            expect.append(f"{s}.{field} {f.offset}")
    lines.append("return 0; }")
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines))
    subprocess.run(["gcc", "-std=gnu11", "-D_GNU_SOURCE", "-I", str(include), str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    return got, expect


def _abi_ffi(include=INCLUDE):
    c = _cdefs.build(_cdefs.GPU_HEADERS, "abi", include=include)
    ffi = FFI()
    ffi.cdef(c.text)
    return ffi, c


@needs_gcc
def test_abi_layouts_and_constants_are_the_compilers(tmp_path):
    ffi, c = _abi_ffi()
    structs = _complete_structs(ffi)
    # everything the GPU binding passes by value or reads fields of (the old hand-written list, at least)
    for s in ("tt_nvme_xfer_caps", "tt_geometry", "tt_fingerprint", "tt_format_params", "tt_gio_qmem",
              "tt_gio_params", "tt_gio_layer", "tt_emu_params", "tt_emu_stats", "tt_gpu_domains",
              "tt_engine_params", "tt_engine_stats", "tt_extent", "tt_open_params", "tt_store_stats",
              "tt_store_info", "tt_memmap", "tt_gio_path_params", "tt_file_path_params", "tt_devpath_ops"):
        assert s in structs, s
    got, expect = _compiler_says(tmp_path, INCLUDE, _cdefs.GPU_HEADERS, ffi, c.constants)
    assert got == expect


def test_both_bindings_declare_the_same_structs():
    """The extension (API mode) and libtutti_gpu.so's binding (ABI mode) share one reading of the headers."""
    from tutti._tutti import ffi as api
    from tutti.gpu._ffi import ffi as abi

    shared = _complete_structs(api)
    assert len(shared) >= 15 and set(shared) <= set(_complete_structs(abi))
    for s in shared:
        t_api, t_abi = api.typeof(f"struct {s}"), abi.typeof(f"struct {s}")
        assert api.sizeof(t_api) == abi.sizeof(t_abi), s
        assert [(n, f.offset) for n, f in t_api.fields] == [(n, f.offset) for n, f in t_abi.fields], s


def _scratch_tree(tmp_path):
    """A copy of libtutti whose store.h has one more field in struct tt_store_info: the only edit."""
    root = tmp_path / "tree"
    shutil.copytree(os.path.join(ROOT, "libtutti", "include"), root / "libtutti" / "include")
    shutil.copytree(os.path.join(ROOT, "libtutti", "src"), root / "libtutti" / "src")
    shutil.copy(os.path.join(ROOT, "libtutti", "libtutti.map"), root / "libtutti" / "libtutti.map")
    shutil.copytree(os.path.join(ROOT, "kmod", "include"), root / "kmod" / "include")  # the module's uapi
    h = root / "libtutti" / "include" / "tutti" / "store.h"
    text = h.read_text()
    anchor = "\tuint64_t n_bad_records;\t\t/* found unreadable at open */\n"
    assert text.count(anchor) == 1
    h.write_text(text.replace(anchor, anchor + "\tuint64_t scratch_field;\n"))
    return root


@needs_gcc
def test_a_field_added_to_a_header_reaches_both_bindings(tmp_path, tiny_fp):
    root = _scratch_tree(tmp_path)
    include = root / "libtutti" / "include"
    real, _ = _abi_ffi()

    # ABI mode: the cdef tutti.gpu would read from these headers has the field, laid out as gcc does.
    ffi, c = _abi_ffi(include)
    fields = dict(ffi.typeof("struct tt_store_info").fields)
    assert "scratch_field" in fields
    assert ffi.sizeof("struct tt_store_info") == real.sizeof("struct tt_store_info") + 8
    assert fields["stats"].offset == dict(real.typeof("struct tt_store_info").fields)["stats"].offset + 8
    got, expect = _compiler_says(tmp_path, include, _cdefs.GPU_HEADERS, ffi, c.constants)
    assert got == expect

    # API mode: the extension built from the scratch tree (the compiler checks its cdef) sees it too, and
    # the C library fills the fields after it where Python reads them.
    sys.path.insert(0, os.path.join(ROOT, "python", "tutti"))
    try:
        import _build_ffi
    finally:
        sys.path.pop(0)
    builder = _build_ffi.make_builder(str(root), module="_scratch_tutti", extra_compile_args=["-O0"])
    out = tmp_path / "ext"
    builder.compile(tmpdir=str(out), verbose=False)
    sys.path.insert(0, str(out))
    try:
        import _scratch_tutti
    finally:
        sys.path.pop(0)
    sffi, slib = _scratch_tutti.ffi, _scratch_tutti.lib
    assert "scratch_field" in dict(sffi.typeof("struct tt_store_info").fields)
    assert sffi.sizeof("struct tt_store_info") == ffi.sizeof("struct tt_store_info")

    paths = [str(tmp_path / "m0.img")]
    cpaths = [sffi.new("char[]", p.encode()) for p in paths]
    p = sffi.new("struct tt_format_params *")
    p.fp.model_id, p.fp.dtype = tiny_fp.model_id.encode(), tiny_fp.dtype.encode()
    p.fp.n_layers, p.fp.kv_heads, p.fp.head_dim, p.fp.block_size = 4, 2, 64, 16
    p.fp.tp_size, p.n_slots = 1, 8
    assert slib.tt_store_format(sffi.new("const char *[]", cpaths), 1, p) == 0, sffi.string(slib.tt_errmsg())
    s = sffi.new("struct tt_store **")
    assert slib.tt_store_open(sffi.new("const char *[]", cpaths), 1, sffi.NULL, s) == 0
    keys = sffi.new("uint8_t[]", 3 * 16)
    slots = sffi.new("int64_t[]", 3)
    assert slib.tt_store_lookup(s[0], keys, 3, slots) == 0
    info = sffi.new("struct tt_store_info *")
    info.scratch_field = 0x5eed
    assert slib.tt_store_get_info(s[0], info) == 0
    assert (info.n_committed, info.n_free, info.stats.lookups) == (0, 8, 3)
    assert sffi.string(info.engine) in (b"uring", b"psync")
    slib.tt_store_close(s[0])


def _header(tmp_path, body):
    d = tmp_path / "inc" / "tutti"
    d.mkdir(parents=True)
    (d / "x.h").write_text(body)
    return tmp_path / "inc"


@pytest.mark.parametrize("body, message", [
    ("/* cffi: begin */\n#ifdef X\nint tt_x(void);\n#endif\n/* cffi: end */\n", "x.h:2: only '#define"),
    ("/* cffi: begin */\nint tt_x(void) __attribute__((pure));\n/* cffi: end */\n", "x.h:2: attributes"),
    ("/* cffi: begin */\nint tt_x(void);\n", "without '/* cffi: end */'"),
    ("int tt_x(void);\n/* cffi: end */\n", "without '/* cffi: begin */'"),
    ("int tt_x(void);\n", "no cffi section"),
    ("/* cffi: begin */\n#define TT_A (TT_NOPE << 2)\n/* cffi: end */\n", "TT_NOPE"),
])
def test_a_section_cffi_cannot_take_is_refused_with_where(tmp_path, body, message):
    with pytest.raises(_cdefs.CdefError, match=re.escape(message)):
        _cdefs.build(("x.h",), "abi", include=_header(tmp_path, body))


def test_defines_are_evaluated_and_strings_are_api_only(tmp_path):
    inc = _header(tmp_path, "/* cffi: begin */\n#define TT_A 4u /* a comment */\n#define TT_B (1u << TT_A)\n"
                            "#define TT_C ((TT_B | 0x3) * 2 - TT_A / 3)\n#define TT_S \"tutti\"\n"
                            "enum tt_e { TT_E0, TT_E1 = TT_A + 1, TT_E2 };\n"
                            "extern const int tt_var;\n/* cffi: end */\n")
    c = _cdefs.build(("x.h",), "abi", include=inc)
    assert {k: c.constants[k] for k in ("TT_A", "TT_B", "TT_C", "TT_E0", "TT_E1", "TT_E2")} == \
        {"TT_A": 4, "TT_B": 16, "TT_C": 37, "TT_E0": 0, "TT_E1": 5, "TT_E2": 6}
    assert c.constants["TT_S"] == "tutti" and "TT_S" not in c.text and "extern int tt_var;" in c.text
    assert "static const char *const TT_S;" in _cdefs.build(("x.h",), "api", include=inc).text


def test_python_restates_no_struct_or_prototype():
    """The one place the C ABI is written is the headers: no struct body or tt_ prototype in tutti's Python."""
    body = re.compile(r"struct\s+tt_\w+\s*\{")
    proto = re.compile(r"^\s*(?:const\s+)?(?:struct\s+\w+|unsigned|int|void|u?int\d+_t|char|size_t)[\s*]+"
                       r"tt_\w+\s*\(", re.M)
    for dirpath, _, files in os.walk(os.path.join(ROOT, "python", "tutti")):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(dirpath, f)).read()
                assert not body.search(text) and not proto.search(text), os.path.join(dirpath, f)


def test_the_gpu_binding_reads_the_headers_of_its_install():
    """Installed: the package's copy of the headers (identical to the tree's); from a checkout
    (PYTHONPATH=python, as on the GPU machine): libtutti/include."""
    import tutti

    inc = _cdefs.include_dir()
    pkg = os.path.dirname(os.path.abspath(tutti.__file__))
    if inc == _cdefs.Path(pkg) / "_include":
        for h in os.listdir(os.path.join(INCLUDE, "tutti")):
            with open(os.path.join(INCLUDE, "tutti", h)) as a, open(inc / "tutti" / h) as b:
                assert a.read() == b.read(), f"installed {h} is stale: reinstall the package"
    code = "from tutti import _cdefs; print(_cdefs.include_dir()); import tutti.gpu._ffi"
    r = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == INCLUDE
