"""The Tutti store through libtutti_gpu.so, with layer-wise transactions into GPU memory.

``GpuStore`` is tutti.Store (one class, tutti/_store.py) bound to libtutti_gpu.so instead of the compiled
extension: same on-disk format and the same C code, so a block written here reads back there and the other
way round; the two must not hold one store at once (the members' lock refuses the second with
StoreBusyError).  What the GPU library adds are the data paths into GPU memory (tutti/_devpath.py: gio,
staged, gds, and the C reference path "host"), which move a transaction's objects between the members and
GPU memory and hash them on the GPU:

    import torch
    from tutti.gpu.store import GpuStore, DeviceKV

    with GpuStore.open(paths, expect=fp) as s:
        s.attach("gio", rate_gbps=28.0, n_queues=24, n_threads=12)   # or "staged"
        kv = DeviceKV.from_tensor(cache)          # [layers, 2, blocks, ...] CUDA tensor(s)
        with s.read(s.lookup(keys), kv, block_ids) as t:
            for l in range(s.geometry.n_layers):
                t.layer(l)                        # O(1) CPU work in blocks
                t.order(l, compute_stream)        # compute waits on the GPU, not the host
                ...                               # launch layer l's compute
            status = t.finish()                   # per block 0, or -EBADMSG (corrupt, dropped)

Everything is per process and per CUDA device: the path is opened on the device
current at attach() (or ``device=``), and every later call runs with that device
current, so one process per GPU (tensor parallel ranks) each opens its own store.
"""
from __future__ import annotations

from .. import _binding, _cconv
from .._devpath import PATHS, DeviceKV, DeviceTxn, GdsUnavailable
from .._store import Store
from ..errors import CorruptBlockError, FingerprintMismatch, StoreBusyError, TuttiError

# tutti.errors' classes (importable without the CPU extension): one hierarchy for both bindings.
StoreError = TuttiError


def key_from_bytes(key) -> bytes:
    """The 16-byte store key of ``key`` (str as UTF-8, or bytes-like): tutti.key_from_bytes, same hash."""
    return _cconv.key_from_bytes(_binding.GPU, key)


class GpuStore(Store):
    """tutti.Store through libtutti_gpu.so: ``attach()`` a data path, then read()/write() GPU memory.

    put()/get()/readinto() move whole blocks through host memory with the store's CPU engine.
    """

    _binding = _binding.GPU
    _public_name = "tutti.gpu.GpuStore"

    def info(self) -> dict:
        """As tutti.Store.info(), and always the data path and its device (None when detached)."""
        return {**super().info(), "path": self.path, "device": self.device}


__all__ = ["GpuStore", "DeviceKV", "DeviceTxn", "StoreError", "FingerprintMismatch", "CorruptBlockError",
           "StoreBusyError", "GdsUnavailable", "key_from_bytes", "PATHS"]
