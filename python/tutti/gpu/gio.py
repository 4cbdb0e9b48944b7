"""GPU-driven NVMe queues (gio_uring.h): the GPU builds, submits and reaps the commands of a layer."""
from __future__ import annotations

import errno
import weakref

from ..model import Geometry
from ._ffi import TT_NVME_CMD_READ, TT_NVME_CMD_WRITE, check, ffi, lib
from .layout import c_geometry
from .streams import stream_ptr

OPS = {"read": TT_NVME_CMD_READ, "write": TT_NVME_CMD_WRITE}


def device_ptr(x) -> int:
    """GPU address of a tensor (``data_ptr()``) or an int address."""
    return x.data_ptr() if hasattr(x, "data_ptr") else int(x)


class GioBatch:
    """A reusable batch: one layer of a layer-wise transfer at a time."""

    def __init__(self, gio: "Gio", max_cmds: int):
        out = ffi.new("struct tt_gio_batch **")
        check(lib().tt_gio_batch_create(gio.handle, max_cmds, out), "tt_gio_batch_create")
        self._b, self.gio, self.max_cmds = out[0], gio, max_cmds
        self._keep: tuple = ()  # device arrays the prepared descriptor points at
        self._finalizer = weakref.finalize(self, lib().tt_gio_batch_destroy, self._b)

    @property
    def handle(self):
        if self._b is None:
            raise ValueError("gio batch is closed")
        return self._b

    def prep_layer(self, geo: Geometry, layer: int, slots, block_ids, *, base: int, block_stride: int,
                   span_stride: int, op: str = "read", nsid_base: int = 1) -> int:
        """Describe layer ``layer`` of every block: ``n_blocks * n_spans`` commands, built on the GPU.

        ``slots``: int64 GPU tensor, store slot of each block; ``block_ids``:
        int32 GPU tensor, paged-cache block of each.  Object (block i, span k)
        is at ``base + block_ids[i] * block_stride + k * span_stride`` in GPU
        memory and at ``tt_locate(geo, slots[i], layer, k)`` on member m =
        namespace ``nsid_base + m``.  Returns the number of commands.
        """
        n = len(slots)
        if len(block_ids) != n:
            raise ValueError(f"{n} slots but {len(block_ids)} block ids")
        for t, dt in ((slots, "int64"), (block_ids, "int32")):
            if hasattr(t, "dtype") and (str(t.dtype) != f"torch.{dt}" or not t.is_cuda or not t.is_contiguous()):
                raise TypeError(f"expected a contiguous CUDA {dt} tensor, got {t.dtype} on {t.device}")
        d = ffi.new("struct tt_gio_layer *")
        d.geo = c_geometry(geo)[0]
        d.layer, d.n_blocks = layer, n
        d.slots = ffi.cast("const uint64_t *", device_ptr(slots))
        d.block_ids = ffi.cast("const uint32_t *", device_ptr(block_ids))
        d.base, d.block_stride, d.span_stride = base, block_stride, span_stride
        d.nsid_base, d.op = nsid_base, OPS[op]
        check(lib().tt_gio_prep_layer(self.handle, d), f"tt_gio_prep_layer(layer {layer}, {n} blocks)")
        self._keep = (slots, block_ids)
        return self.size

    @property
    def size(self) -> int:
        return int(lib().tt_gio_batch_size(self.handle))

    def result(self) -> tuple[int, list[int]]:
        """(failed commands, NVMe status of each command); synchronises with the batch."""
        n_err = ffi.new("uint32_t *")
        status = ffi.new("uint16_t[]", max(self.size, 1))
        self._result(n_err, status)
        return int(n_err[0]), list(status)[: self.size]

    def errors(self) -> int:
        """Failed commands of the last completed use (synchronises)."""
        n_err = ffi.new("uint32_t *")
        self._result(n_err, ffi.NULL)
        return int(n_err[0])

    def _result(self, n_err, status) -> None:
        rc = lib().tt_gio_batch_result(self.handle, n_err, status)
        if rc != -errno.EIO:  # -EIO: some commands failed, n_err says how many
            check(rc, "tt_gio_batch_result (was the batch reaped: submit_wait or wait_cqe?)")

    def close(self) -> None:
        """Free the batch (not in flight).  Idempotent."""
        if self._b is not None:
            self._b = None
            self._keep = ()
            self._finalizer()


class Gio:
    """GPU-side state over a transport's queue pairs (today: an EmulatedController)."""

    def __init__(self, ctrl, *, warps_per_queue: int = 0):
        p = ffi.new("struct tt_gio_params *")
        p.n_queues, p.qmem, p.caps = ctrl.n_queues, ctrl.qmem(), ctrl.caps()[0]
        p.lba_shift, p.warps_per_queue = ctrl.lba_shift, warps_per_queue
        out = ffi.new("struct tt_gio **")
        check(lib().tt_gio_open(p, out), "tt_gio_open")
        self._g, self.ctrl = out[0], ctrl  # the controller outlives this handle
        self._finalizer = weakref.finalize(self, lib().tt_gio_close, self._g)

    @property
    def handle(self):
        if self._g is None:
            raise ValueError("gio handle is closed")
        return self._g

    def batch(self, max_cmds: int) -> GioBatch:
        return GioBatch(self, max_cmds)

    def submit_wait(self, batch: GioBatch, stream=None) -> None:
        """Enqueue one kernel on ``stream`` that submits every command of ``batch`` and reaps them."""
        check(lib().tt_gio_submit_wait(self.handle, batch.handle, stream_ptr(stream)), "tt_gio_submit_wait")

    def issue(self, batch: GioBatch, stream=None) -> None:
        """Submit only; pair with wait_cqe() on another stream when the batch exceeds the rings."""
        check(lib().tt_gio_issue(self.handle, batch.handle, stream_ptr(stream)), "tt_gio_issue")

    def wait_cqe(self, batch: GioBatch, stream=None) -> None:
        check(lib().tt_gio_wait_cqe(self.handle, batch.handle, stream_ptr(stream)), "tt_gio_wait_cqe")

    def close(self) -> None:
        """Free the GPU-side state (queues idle: synchronise the streams first).  Idempotent."""
        if self._g is not None:
            self._g = None
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
