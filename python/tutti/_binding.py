"""Which libtutti a Store talks to: the compiled extension, or libtutti_gpu.so.

Both are the same C library with the same declarations (tutti._cdefs reads them from the headers):

  extension   tutti._tutti, cffi API mode, libtutti compiled in: host memory through the CPU engines, and
              the C reference data path ("host") for device-memory code run on CPU tensors
  gpu         libtutti_gpu.so, cffi ABI mode (tutti.gpu._ffi): the same, plus the GPU data paths
              (gio, staged, gds); needs no compiler and no extension where it runs

Each is one copy of libtutti with its own thread-local error reason, so a store opened through one is only
ever handed to that one's functions; a Store keeps its Binding for that.  Nothing here loads a library
before it is first used, so importing tutti never fails for want of either.
"""
from __future__ import annotations

from .errors import error_for


class Binding:
    """One loaded libtutti: ``ffi``, ``lib`` and how its failures become tutti.errors' exceptions."""

    def __init__(self, name: str, load, *, gpu_paths: bool, prefix_what: bool):
        self.name = name
        self._load = load  # () -> (ffi, lib); raises ImportError when the library is not here
        self.gpu_paths = gpu_paths  # has the GPU data paths (gio, staged, gds)
        # tutti.Store's messages have always been libtutti's reason alone (tutti-admin prints them as they
        # are); GpuStore's name the call ("open /path: reason").
        self.prefix_what = prefix_what

    @property
    def ffi(self):
        return self._load()[0]

    @property
    def lib(self):
        return self._load()[1]

    def check(self, rc: int, what: str = "", cls=None) -> int:
        """``rc`` if not negative, else raise the TuttiError (or ``cls``) for it with libtutti's reason."""
        if rc >= 0:
            return rc
        ffi, lib = self._load()
        raise error_for(rc, what if self.prefix_what else "", ffi=ffi, lib=lib, cls=cls)

    def __repr__(self):
        return f"<tutti binding {self.name}>"


def _load_extension():
    from ._tutti import ffi, lib  # the extension may not be built (GPU machines)

    return ffi, lib


_torch_tried = False


def _load_gpu():
    global _torch_tried
    if not _torch_tried:  # torch first: libtutti_gpu.so then shares PyTorch's CUDA runtime
        _torch_tried = True
        try:
            import torch  # noqa: F401 - loaded for its CUDA runtime (above)
        except ImportError:
            pass
    from .gpu import _ffi

    return _ffi.ffi, _ffi.lib()


EXTENSION = Binding("tutti._tutti", _load_extension, gpu_paths=False, prefix_what=False)
GPU = Binding("libtutti_gpu.so", _load_gpu, gpu_paths=True, prefix_what=True)
