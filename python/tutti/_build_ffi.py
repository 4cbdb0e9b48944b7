"""cffi (API mode) build of ``tutti._tutti``: libtutti compiled straight into the extension.

The cdef is what the public headers mark for Python (``_cdefs.py``: their "cffi: begin/end" sections), with
every struct written out: API mode makes the compiler check each layout and constant against the real
headers, so a section that drifts from the C around it fails the build rather than corrupting memory.

Like libtutti_gpu.so, the extension is built with -fvisibility=hidden and libtutti.map: it exports the
documented tt_ API and its module init, nothing else (tests/test_public_surface.py).
"""
import glob
import importlib.util
import os
import sys

from cffi import FFI

# Paths relative to the project root (setuptools runs the build from there),
# so `pip install .` works from the temporary copy pip makes.
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.relpath(os.path.join(_HERE, "..", ".."))


def _load_cdefs():
    """tutti/_cdefs.py by path: cffi runs this file outside the package (``__name__ == "__cffi__"``)."""
    spec = importlib.util.spec_from_file_location("_tutti_cdefs", os.path.join(_HERE, "_cdefs.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _version_script(root: str, module: str) -> str:
    """libtutti.map plus the module's init function: the extension's exports."""
    src = os.path.join(root, "libtutti", "libtutti.map")
    with open(src) as f:
        text = f.read()
    if "\tglobal:\n" not in text:
        raise RuntimeError(f"{src}: no 'global:' list")
    init = "PyInit_" + module.rpartition(".")[2]
    path = os.path.join(root, "build", f"{init}.map")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text.replace("\tglobal:\n", f"\tglobal:\n\t\t{init};\n", 1))
    return path


def make_builder(root: str = _ROOT, module: str = "tutti._tutti", extra_compile_args=()) -> FFI:
    """The API-mode builder of libtutti under ``root`` (a checkout, or a scratch copy in tests/test_cdefs.py)."""
    include = os.path.join(root, "libtutti", "include")
    cdefs = _load_cdefs()
    builder = FFI()
    builder.cdef(cdefs.build(cdefs.API_HEADERS, "api", include=include).text)
    builder.set_source(
        module,
        "".join(f'#include "tutti/{h}"\n' for h in cdefs.API_HEADERS)
        # The cdef drops const from extern globals (a data path's ops) so that cffi gives their address.
        + '#pragma GCC diagnostic ignored "-Wdiscarded-qualifiers"\n',
        sources=sorted(glob.glob(os.path.join(root, "libtutti", "src", "**", "*.c"), recursive=True)),
        include_dirs=[include],
        # Headers and the export list as dependencies: rebuilds notice their edits and an sdist carries them.
        depends=sorted(glob.glob(os.path.join(root, "libtutti", "**", "*.h"), recursive=True))
        + [os.path.join(root, "libtutti", "libtutti.map")],
        libraries=["uring", "xxhash", "pthread"],
        extra_compile_args=["-std=gnu11", "-D_GNU_SOURCE", "-O2", "-fvisibility=hidden", *extra_compile_args],
        extra_link_args=[f"-Wl,--version-script={_version_script(root, module)}"],
    )
    return builder


ffibuilder = make_builder()
