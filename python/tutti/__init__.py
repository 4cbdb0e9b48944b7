"""Tutti: an SSD-backed KV cache for vLLM.

``Store`` is the object store (libtutti through cffi); ``Fingerprint`` and
``Geometry`` describe what it holds; ``PagedBuffer`` is host memory laid out
like vLLM's paged KV cache for layer-wise transfers.

The names backed by the compiled extension (``tutti._tutti``) are loaded on
first use, so ``tutti.gpu`` (libtutti_gpu.so through cffi's ABI mode) and
``tutti.prefill`` work where the extension is not built, e.g. on a GPU machine
that only has the shared library.
"""
import importlib

from .model import LLAMA3_8B, Fingerprint, Geometry

# name -> module that defines it (each of these modules imports tutti._tutti)
_LAZY = {
    "Store": ".store", "Txn": ".store", "WriteTxn": ".store", "ReadTxn": ".store", "key_from_bytes": ".store",
    "PagedBuffer": ".memory",
    "TuttiError": ".errors", "FingerprintMismatch": ".errors", "CorruptBlockError": ".errors",
    "StoreBusyError": ".errors", "TuttiBaseError": ".errors",
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif name == "__version__":
        from ._tutti import ffi, lib

        value = ffi.string(lib.TUTTI_VERSION_STRING).decode()
    else:
        raise AttributeError(f"module 'tutti' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "Store", "Txn", "WriteTxn", "ReadTxn", "Fingerprint", "Geometry", "LLAMA3_8B", "PagedBuffer",
    "TuttiBaseError", "TuttiError", "FingerprintMismatch", "CorruptBlockError", "StoreBusyError", "key_from_bytes",
    "__version__",
]
