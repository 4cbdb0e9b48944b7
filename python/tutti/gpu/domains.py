"""I/O and compute SM domains (gpu_domains.h): green contexts, or two plain streams where unavailable."""
from __future__ import annotations

import weakref

from ._ffi import check, ffi, lib


class Domains:
    """``io`` and ``compute`` are cudaStream_t handles (ints); ``torch_streams()`` wraps them for PyTorch."""

    def __init__(self, io_sms: int = 16):
        self._d = ffi.new("struct tt_gpu_domains *")
        check(lib().tt_gpu_domains_create(io_sms, self._d), "tt_gpu_domains_create")
        self._finalizer = weakref.finalize(self, lib().tt_gpu_domains_destroy, self._d)
        d = self._d
        self.io = int(ffi.cast("uintptr_t", d.io))
        self.compute = int(ffi.cast("uintptr_t", d.compute))
        self.io_sms, self.compute_sms, self.green = int(d.io_sms), int(d.compute_sms), bool(d.green)
        self.reason = ffi.string(d.reason).decode(errors="replace")

    def torch_streams(self):
        """(io, compute) as torch.cuda.ExternalStream, for ``with torch.cuda.stream(...)``."""
        import torch

        if self._d is None:
            raise ValueError("domains are closed: their streams are destroyed")

        return torch.cuda.ExternalStream(self.io), torch.cuda.ExternalStream(self.compute)

    def describe(self) -> str:
        if self.green:
            return f"green contexts: {self.io_sms} SMs for I/O, {self.compute_sms} for compute"
        return f"plain streams over the whole GPU ({self.reason or 'green contexts unavailable'})"

    def close(self) -> None:
        """Destroy the streams and green contexts.  Idempotent."""
        if self._d is not None:
            self._d = None
            self._finalizer()
