"""The Tutti object store: Python face of libtutti's tt_store_* API, through the compiled extension.

A store keeps KV blocks on 1..16 files or block devices.  Keys are hashed to
16 bytes (XXH3-128) exactly as the C library does, so every process that
names a block the same way finds the same slot.

The class is tutti._store.Store (one class for both libraries; tutti.gpu.GpuStore
is the same class bound to libtutti_gpu.so); importing this module needs the
extension, as it always has.
"""
from . import _binding, _cconv
from ._store import ReadTxn, Store, Txn, WriteTxn
from ._tutti import ffi, lib  # noqa: F401 - this module is the extension's store


def key_from_bytes(key) -> bytes:
    """The 16-byte store key of ``key`` (bytes-like, or str as UTF-8).

    Every key is hashed, a 16-byte one too, so one name always maps to one key.
    """
    return _cconv.key_from_bytes(_binding.EXTENSION, key)


__all__ = ["Store", "Txn", "WriteTxn", "ReadTxn", "key_from_bytes"]
