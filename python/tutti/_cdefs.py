"""The C declarations of both cffi bindings, read from libtutti's public headers.

The headers are the one place the C ABI is written.  Each public header marks what Python sees::

    /* cffi: begin */
    ... structs, enums, prototypes, extern variables, #define NAME <integer expression> ...
    /* cffi: end */

and this module copies those sections, in header order, into one cdef:

- ``tutti._tutti`` (API mode, ``_build_ffi.py``) takes it at build time over ``API_HEADERS``; the compiler
  then checks every struct layout and constant of the cdef against the real headers, so a wrong section fails
  the build.
- ``tutti.gpu`` (ABI mode, ``gpu/_ffi.py``) takes it at import over ``GPU_HEADERS``, with no compiler: the
  layouts are the headers' own field lists, laid out by cffi as the C compiler does (tests/test_cdefs.py
  compares every struct's size and offsets and every constant with gcc's).

What a section may hold is what cffi's parser takes: no other preprocessor directive, no attribute, no
inline function (those stay outside the markers).  ``#define`` values are integer constant expressions over
earlier constants (evaluated here, since cffi takes only literals) or string literals (API mode only).

The headers come from the package (``tutti/_include``, copied there by setup.py, so an installed
``tutti.gpu`` needs nothing else) or, in a checkout, from ``libtutti/include``.
"""
from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path


def _errors_module():
    """tutti.errors, also when this file is loaded by path (``_build_ffi.py`` at build time, outside the
    package): errors.py imports nothing of the package at import."""
    if __package__:
        from . import errors
        return errors
    spec = importlib.util.spec_from_file_location("_tutti_errors", Path(__file__).with_name("errors.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CdefError = _errors_module().CdefError

# Headers in dependency order: a section may use what earlier sections declare.
API_HEADERS = ("tutti.h", "error.h", "format.h", "layout.h", "engine.h", "store.h", "devpath.h", "kqueue.h",
               "fault.h")
GPU_HEADERS = API_HEADERS + ("nvme.h", "gio_uring.h", "emu_ctrl.h", "gpu_sum.h", "gpu_domains.h",
                             "gio_path.h", "staged_path.h", "gds_path.h")

BEGIN, END = "/* cffi: begin */", "/* cffi: end */"
MODES = ("api", "abi")


@dataclass
class Cdef:
    """A cdef for one binding: ``text`` for ``FFI.cdef()`` and the integer and string constants it defines."""

    text: str
    constants: dict = field(default_factory=dict)
    headers: tuple = ()


def include_dir() -> Path:
    """Where the public headers are: the package's copy, else the checkout's libtutti/include."""
    here = Path(__file__).resolve().parent
    for d in (here / "_include", here.parents[1] / "libtutti" / "include"):
        if (d / "tutti" / "store.h").is_file():
            return d
    raise FileNotFoundError(f"libtutti's headers are neither in {here / '_include'} (an installed package) "
                            f"nor in {here.parents[1] / 'libtutti' / 'include'} (a checkout)")


_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_DEFINE = re.compile(r"#\s*define\s+([A-Za-z_]\w*)\s+(.+)$")
_INT = re.compile(r"(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b")
_TOKEN = re.compile(r"\s*(0[xX][0-9a-fA-F]+|\d+|[A-Za-z_]\w*|<<|>>|[-+*/%|&^~()])")


def sections(header: Path) -> list:
    """The cffi sections of ``header``: [(first line number, text)]."""
    text = header.read_text()
    out, pos = [], 0
    while True:
        b = text.find(BEGIN, pos)
        if b < 0:
            break
        e = text.find(END, b)
        if e < 0:
            raise CdefError(f"{header}:{text.count(chr(10), 0, b) + 1}: '{BEGIN}' without '{END}'")
        start = b + len(BEGIN)
        out.append((text.count("\n", 0, start) + 1, text[start:e]))
        pos = e + len(END)
    if text.find(END, pos) >= 0:
        raise CdefError(f"{header}: '{END}' without '{BEGIN}'")
    return out


# <stdint.h>'s limits, which the headers may use in their constants.
_STDINT = {"UINT8_MAX": 0xff, "UINT16_MAX": 0xffff, "UINT32_MAX": 0xffffffff, "UINT64_MAX": 0xffffffffffffffff,
           "INT8_MAX": 0x7f, "INT16_MAX": 0x7fff, "INT32_MAX": 0x7fffffff, "INT64_MAX": 0x7fffffffffffffff}


def _eval_int(expr: str, known: dict, where: str) -> int:
    """An integer constant expression of literals and ``known`` names, as C evaluates it for our macros."""
    expr = expr.strip()
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise CdefError(f"{where}: cannot evaluate {expr!r} (only integers, earlier constants and "
                            "+ - * / % << >> | & ^ ~ ( ))")
        tok = m.group(1)
        pos = m.end()
        if tok[0].isdigit():
            octal = tok[0] == "0" and tok[:2].lower() != "0x" and tok != "0"
            out.append(str(int(tok, 8) if octal else int(tok, 0)))
            while pos < len(expr) and expr[pos] in "uUlL":
                pos += 1
        elif tok in _STDINT:
            out.append(str(_STDINT[tok]))
        elif tok[0].isalpha() or tok[0] == "_":
            if tok not in known or not isinstance(known[tok], int):
                raise CdefError(f"{where}: {tok} in {expr!r} is not an integer constant of an earlier section")
            out.append(str(known[tok]))
        else:
            out.append("//" if tok == "/" else tok)
    try:
        value = eval(" ".join(out), {"__builtins__": {}}, {})  # noqa: S307 - digits and operators only
    except (SyntaxError, ZeroDivisionError) as e:
        raise CdefError(f"{where}: cannot evaluate {expr!r}: {e}") from None
    return int(value)


def _enum_constants(text: str, known: dict, where: str) -> None:
    """Add the values of every enum defined in ``text`` to ``known``."""
    for body in re.findall(r"\benum\s+\w*\s*\{(.*?)\}", text, re.S):
        value = -1
        for item in filter(None, (x.strip() for x in body.split(","))):
            name, _, expr = item.partition("=")
            value = _eval_int(expr, known, where) if expr.strip() else value + 1
            known[name.strip()] = value


def _section_text(header: str, first_line: int, text: str, mode: str, constants: dict) -> str:
    """One section as cdef text: comments gone, #defines evaluated, extern globals without const."""
    text = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    lines = []
    for i, line in enumerate(text.split("\n")):
        where = f"{header}:{first_line + i}"
        stripped = line.strip()
        if stripped.startswith("#"):
            m = _DEFINE.match(stripped)
            if not m:
                raise CdefError(f"{where}: only '#define NAME VALUE' may stand in a cffi section: {stripped!r}")
            name, value = m.group(1), m.group(2).strip()
            if value.startswith('"'):
                constants[name] = value.strip('"')
                if mode == "api":
                    lines.append(f"static const char *const {name};")
                continue
            constants[name] = _eval_int(value, constants, where)
            lines.append(f"#define {name} {constants[name]}")
            continue
        if "__attribute__" in line or re.search(r"\binline\b", line):
            raise CdefError(f"{where}: attributes and inline functions stay outside the cffi section")
        # cffi gives the address of non-const globals only (ffi.addressof: a data path's ops);
        # the layout is the same. (API mode: the extension's compile allows the dropped qualifier.)
        line = re.sub(r"^(\s*extern\s+)const\s+", r"\1", line)
        lines.append(line.rstrip())
    body = "\n".join(lines)
    _enum_constants(body, constants, header)
    return body


def build(headers=GPU_HEADERS, mode: str = "abi", include: Path | None = None) -> Cdef:
    """The cdef of ``headers`` (names in include/tutti/) for ``mode`` "api" or "abi"."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    root = Path(include) if include is not None else include_dir()
    constants: dict = {}
    parts = []
    for name in headers:
        path = root / "tutti" / name
        found = sections(path)
        if not found:
            raise CdefError(f"{path}: no cffi section ('{BEGIN}' ... '{END}')")
        for first_line, text in found:
            parts.append(f"/* {name}:{first_line} */\n" + _section_text(name, first_line, text, mode, constants))
    cdef_text = "\n".join(parts)
    cdef_text = re.sub(r"\n\s*\n+", "\n", cdef_text)
    return Cdef(text=cdef_text, constants=constants, headers=tuple(headers))


def _main(argv=None) -> int:
    """``python -m tutti._cdefs [api|abi]``: print the cdef (what the bindings see)."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    mode = argv[0] if argv else "abi"
    c = build(API_HEADERS if mode == "api" else GPU_HEADERS, mode)
    print(c.text)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
