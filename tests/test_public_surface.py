"""The libraries export the documented API and nothing else.

libtutti/libtutti.map lists, under each public header's name, every function and variable that header
declares; the extension (tutti._tutti) and libtutti_gpu.so are built with -fvisibility=hidden and that
list, so ``nm -D`` shows exactly it: all of it for libtutti_gpu.so, the headers it compiles for the
extension (no GPU code there).  Before, both exported every tt_ symbol, internals included.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "libtutti" / "include"
MAP = ROOT / "libtutti" / "libtutti.map"
# What the extension compiles: libtutti/src/*/*.c, no CUDA (the GPU headers' functions are in .cu files).
EXTENSION_HEADERS = ("error.h", "engine.h", "store.h", "devpath.h", "kqueue.h", "fault.h")

needs_tools = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None,
                                 reason="needs gcc and nm (binutils)")


def map_by_header() -> dict:
    """{header: [symbols]} from libtutti.map's global list (each group starts with a /* header.h */ line)."""
    text = MAP.read_text()
    body = text[text.index("global:"):text.index("local:")]
    out, header = {}, None
    for line in body.splitlines()[1:]:
        line = line.strip()
        m = re.fullmatch(r"/\* (\w+\.h) \*/", line)
        if m:
            header = m.group(1)
            out.setdefault(header, [])
        elif line:
            assert header and line.endswith(";"), f"libtutti.map: {line!r} outside a /* header.h */ group"
            out[header].append(line[:-1])
    return out


def header_declarations(tmp_path) -> dict:
    """{header: {names}}: the non-inline functions (gcc -aux-info) and extern variables each public header declares."""
    src = tmp_path / "all.c"
    src.write_text("#include <stdio.h>\n" + "".join(f'#include "tutti/{h.name}"\n'
                                                    for h in sorted((INCLUDE / "tutti").glob("*.h"))))
    aux = tmp_path / "aux.txt"
    subprocess.run(["gcc", "-std=gnu11", "-D_GNU_SOURCE", "-I", str(INCLUDE), "-fsyntax-only", "-aux-info",
                    str(aux), str(src)], check=True, capture_output=True, text=True)
    out: dict = {}
    for line in aux.read_text().splitlines():
        m = re.match(r"/\* (\S+?):\d+:\w+ \*/ (.*)", line)
        if not m or "/libtutti/include/tutti/" not in "/" + m.group(1) or re.match(r"static\b", m.group(2)):
            continue
        name = re.search(r"\b(tt_\w+) \(", m.group(2)).group(1)
        out.setdefault(Path(m.group(1)).name, set()).add(name)
    for h in (INCLUDE / "tutti").glob("*.h"):
        for name in re.findall(r"^extern\s+(?:const\s+)?[\w\s]+?\b(tt_\w+)\s*;", h.read_text(), re.M):
            out.setdefault(h.name, set()).add(name)
    return out


def exports(so) -> set:
    """Defined dynamic symbols of ``so`` (versions stripped), without the version node itself."""
    r = subprocess.run(["nm", "-D", "--defined-only", str(so)], check=True, capture_output=True, text=True)
    names = {line.split()[-1].split("@")[0] for line in r.stdout.splitlines() if line.strip()}
    return {n for n in names if not n.startswith("LIBTUTTI_")}


@needs_tools
def test_the_map_lists_what_the_public_headers_declare(tmp_path):
    listed = {h: set(names) for h, names in map_by_header().items()}
    declared = header_declarations(tmp_path)
    assert listed == declared
    assert sum(len(v) for v in listed.values()) == len(set().union(*listed.values()))  # no name twice


@needs_tools
def test_the_extension_exports_the_documented_api_only():
    import tutti._tutti

    groups = map_by_header()
    want = {n for h in EXTENSION_HEADERS for n in groups[h]} | {"PyInit__tutti"}
    got = exports(tutti._tutti.__file__)
    assert got == want
    for internal in ("tt_next_req", "tt_slots_alloc", "tt_sb_write", "tt_engine_add"):
        assert internal not in got


def _gpu_library():
    for p in (os.environ.get("TUTTI_GPU_LIB"), ROOT / "build" / "gpu" / "libtutti_gpu.so",
              ROOT / "build" / "libtutti_gpu.so"):
        if p and Path(p).is_file():
            return Path(p)
    pytest.skip("libtutti_gpu.so is not built (make gpu-lib; make test builds build/gpu/)")


@needs_tools
def test_the_gpu_library_exports_the_documented_api_only():
    got = exports(_gpu_library())
    want = set().union(*map_by_header().values())
    assert got == want, (sorted(got - want)[:20], sorted(want - got))
