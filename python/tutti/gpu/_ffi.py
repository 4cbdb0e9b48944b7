"""libtutti_gpu.so through cffi's ABI mode: declarations and loading.

ABI mode needs no compiler where it runs (a GPU machine may have none for Python), so the declarations
must match the library's headers field for field: they are the headers' own cffi sections, read at import
(tutti._cdefs over GPU_HEADERS, from the package's copy of the headers or the checkout's), never restated
here.  tests/test_cdefs.py compares every struct layout and constant with gcc's.
"""
from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

from .. import _cdefs
from ..errors import GpuLibraryMissing
from ..libfile import library_problem

CDEF = _cdefs.build(_cdefs.GPU_HEADERS, "abi")

# The headers' constants the Python side passes on (values from the headers, via CDEF).
_C = CDEF.constants
TT_NVME_CMD_WRITE, TT_NVME_CMD_READ = _C["TT_NVME_CMD_WRITE"], _C["TT_NVME_CMD_READ"]
TT_NVME_SGLS_BYTE_ALIGNED = _C["TT_NVME_SGLS_BYTE_ALIGNED"]
TT_EMU_NULL, TT_EMU_HOSTMEM, TT_EMU_FILE = _C["TT_EMU_NULL"], _C["TT_EMU_HOSTMEM"], _C["TT_EMU_FILE"]
TT_EMU_MAX_NS = _C["TT_EMU_MAX_NS"]
TT_KEY_BYTES, TT_MAX_MEMBERS = _C["TT_KEY_BYTES"], _C["TT_MAX_MEMBERS"]
TT_MODEL_ID_LEN, TT_DTYPE_LEN = _C["TT_MODEL_ID_LEN"], _C["TT_DTYPE_LEN"]
TT_FORMAT_FORCE = _C["TT_FORMAT_FORCE"]
TT_OPEN_RDONLY, TT_OPEN_NO_VERIFY, TT_OPEN_SHARED = _C["TT_OPEN_RDONLY"], _C["TT_OPEN_NO_VERIFY"], _C["TT_OPEN_SHARED"]

ffi = FFI()
ffi.cdef(CDEF.text)

_lib = None


def library_path() -> Path:
    """$TUTTI_GPU_LIB; else the copy installed in this package (``TUTTI_GPU=1 pip install``); else
    build/libtutti_gpu.so of the checkout this package lives in (``make gpu-lib``)."""
    env = os.environ.get("TUTTI_GPU_LIB")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    installed = here / "libtutti_gpu.so"
    if installed.is_file():
        return installed
    return here.parents[2] / "build" / "libtutti_gpu.so"


def lib():
    """The loaded library (loaded once).

    Import torch before the first call: the library links the shared CUDA
    runtime, and one already in the process (PyTorch's) then serves both.
    """
    global _lib
    if _lib is None:
        path = library_path()
        problem = library_problem(str(path))
        if problem:
            raise GpuLibraryMissing(
                f"{problem}; install the package with `TUTTI_GPU=1 pip install .` or "
                "build it with `make gpu-lib` (both need nvcc), or point TUTTI_GPU_LIB at a "
                "libtutti_gpu.so")
        _lib = ffi.dlopen(str(path))
    return _lib


def check(rc: int, what: str, errmsg: bool = False) -> int:
    """Raise OSError for a negative errno return.

    ``errmsg``: the function reports details through tt_seterr() (the store's
    functions do; the GPU ones only return the errno, so a message left by an
    earlier call would mislead).
    """
    if rc < 0:
        msg = ffi.string(lib().tt_errmsg()).decode(errors="replace") if errmsg else ""
        raise OSError(-rc, f"{what}: {os.strerror(-rc)}" + (f" ({msg})" if msg else ""))
    return rc
