"""Build glue that pyproject.toml cannot express: the cffi extension, the version, and (opt-in) the
GPU library.

The version comes from libtutti's header so the C library and the Python
package can never disagree; the public headers are installed in the package
(tutti/_include), where tutti.gpu reads the declarations of its ABI-mode
binding.  ``TUTTI_GPU=1 pip install .`` also builds
libtutti_gpu.so (the store + GPU data paths, loaded by tutti.gpu in cffi ABI
mode) with the Makefile and installs it inside the package, where tutti.gpu
finds it; it needs nvcc.  Off by default: most installs (and CI's venvs) do
not want a CUDA build.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _version():
    header = (HERE / "libtutti/include/tutti/tutti.h").read_text()
    return re.search(r'#define TUTTI_VERSION_STRING "([^"]+)"', header).group(1)


def _want_gpu():
    v = os.environ.get("TUTTI_GPU", "0").strip().lower()
    if v in ("", "0", "no", "off", "false"):
        return False
    if v in ("1", "yes", "on", "true"):
        return True
    raise SystemExit(f"TUTTI_GPU={v!r}: expected 1 or 0")


class BuildPyWithGpu(build_py):
    """build_py, plus libtutti's public headers into tutti/_include/ (tutti.gpu reads its cdef from them at
    import: tutti/_cdefs.py), plus libtutti_gpu.so into tutti/gpu/ when TUTTI_GPU=1."""

    def run(self):
        super().run()
        include = Path(self.build_lib) / "tutti" / "_include" / "tutti"
        include.mkdir(parents=True, exist_ok=True)
        for h in sorted((HERE / "libtutti" / "include" / "tutti").glob("*.h")):
            shutil.copy2(h, include / h.name)
        if not _want_gpu():
            return
        nvcc = os.environ.get("NVCC", "nvcc")
        if not shutil.which(nvcc):
            raise SystemExit(f"TUTTI_GPU=1: {nvcc} not found (install the CUDA toolkit or set NVCC)")
        out = HERE / "build" / "pip-gpu"
        subprocess.run(["make", "-C", str(HERE), "-s", f"-j{os.cpu_count() or 2}", f"BUILD={out}",
                        f"NVCC={nvcc}", "gpu-lib"], check=True)
        dest = Path(self.build_lib) / "tutti" / "gpu" / "libtutti_gpu.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out / "libtutti_gpu.so", dest)


setup(
    version=_version(),
    cffi_modules=["python/tutti/_build_ffi.py:ffibuilder"],
    cmdclass={"build_py": BuildPyWithGpu},
)
