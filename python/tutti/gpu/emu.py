"""The emulated NVMe controller (emu_ctrl.h): host threads serving GPU-built commands."""
from __future__ import annotations

import weakref

from .._devpath import emu_env_problem
from ._ffi import TT_EMU_FILE, TT_EMU_HOSTMEM, TT_EMU_MAX_NS, TT_EMU_NULL, TT_NVME_SGLS_BYTE_ALIGNED, check, ffi, lib

BACKINGS = {"null": TT_EMU_NULL, "hostmem": TT_EMU_HOSTMEM, "file": TT_EMU_FILE}


class EmulatedController:
    """Controller with ``n_ns`` namespaces of ``ns_bytes`` each, optionally capped at ``rate_gbps`` (1e9 B/s) in total.

    Uses the current CUDA device.  Commands carry one SGL data block (byte
    aligned), so every object is one command with no list memory.
    """

    def __init__(self, *, n_ns: int, ns_bytes: int, n_queues: int = 16, depth: int = 1024, n_threads: int = 8,
                 backing: str = "hostmem", rate_gbps: float = 0.0, lba_shift: int = 12, fds=None):
        if backing not in BACKINGS:
            raise ValueError(f"backing {backing!r}: one of {', '.join(BACKINGS)}")
        if not 1 <= n_ns <= TT_EMU_MAX_NS:
            raise ValueError(f"{n_ns} namespaces: 1..{TT_EMU_MAX_NS}")
        why = emu_env_problem()
        if why:
            raise ValueError(f"emulated controller: {why}")
        self.n_ns, self.ns_bytes, self.n_queues, self.lba_shift = n_ns, ns_bytes, n_queues, lba_shift
        self.rate_gbps = rate_gbps
        p = ffi.new("struct tt_emu_params *")
        p.n_queues, p.depth, p.n_threads = n_queues, depth, n_threads
        p.backing, p.n_ns, p.ns_bytes, p.lba_shift = BACKINGS[backing], n_ns, ns_bytes, lba_shift
        self._fds = ffi.new("int[]", list(fds)) if fds is not None else ffi.NULL
        p.fds = self._fds
        p.sgls = TT_NVME_SGLS_BYTE_ALIGNED
        p.list_chunks = 0
        p.rate_gbps = rate_gbps
        out = ffi.new("struct tt_emu **")
        check(lib().tt_emu_open(p, out), "tt_emu_open")
        self._c = out[0]
        # Dropped without close(): the threads stop and the memory is freed all the same.
        self._finalizer = weakref.finalize(self, lib().tt_emu_close, self._c)

    @property
    def handle(self):
        if self._c is None:
            raise ValueError("controller is closed")
        return self._c

    def qmem(self):
        return lib().tt_emu_qmem(self.handle)

    def caps(self):
        caps = ffi.new("struct tt_nvme_xfer_caps *")
        lib().tt_emu_caps(self.handle, caps)
        return caps

    def ns_data(self, nsid: int) -> memoryview:
        """Namespace ``nsid``'s backing memory (hostmem backing), writable."""
        p = lib().tt_emu_ns_data(self.handle, nsid)
        if p == ffi.NULL:
            raise ValueError(f"namespace {nsid}: no host memory (backing is not hostmem, or no such namespace)")
        return memoryview(ffi.buffer(p, self.ns_bytes))

    def stats(self) -> dict:
        st = ffi.new("struct tt_emu_stats *")
        lib().tt_emu_get_stats(self.handle, st)
        return {k: int(getattr(st, k)) for k in ("cmds", "errors", "bytes", "sq_wraps", "cq_wraps", "doorbells")}

    def close(self) -> None:
        """Stop the threads and free the memory (every queue must be idle).  Idempotent."""
        if self._c is not None:
            self._c = None
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
