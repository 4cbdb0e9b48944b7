"""Tutti: an SSD-backed KV cache for vLLM.

``Store`` is the object store (libtutti through cffi); ``Fingerprint`` and
``Geometry`` describe what it holds; ``PagedBuffer`` is host memory laid out
like vLLM's paged KV cache for layer-wise transfers.
"""
from ._tutti import ffi as _ffi, lib as _lib
from .errors import CorruptBlockError, FingerprintMismatch, StoreBusyError, TuttiError
from .memory import PagedBuffer
from .model import LLAMA3_8B, Fingerprint, Geometry
from .store import ReadTxn, Store, Txn, WriteTxn, key_from_bytes

__version__ = _ffi.string(_lib.TUTTI_VERSION_STRING).decode()

__all__ = [
    "Store", "Txn", "WriteTxn", "ReadTxn", "Fingerprint", "Geometry", "LLAMA3_8B", "PagedBuffer",
    "TuttiError", "FingerprintMismatch", "CorruptBlockError", "StoreBusyError", "key_from_bytes",
    "__version__",
]
