"""Transactions of a Store (tt_txn_*): what every kind shares, and the host-memory kind.

A transaction moves a batch of blocks layer by layer: ``layer()`` per layer, ``wait_layer()``, then
``finish()`` (per-block status) or ``abort()``.  Its C handle and the memory it moves are held by a
``_TxnRef`` that the store also holds: a transaction dropped unfinished is aborted at its store's next call
(its finalizer may run on any thread, and a store is used from one thread at a time), and its memory lives
until then, since the library may still be moving bytes into it.  Device-memory transactions: tutti._devpath.
"""
from __future__ import annotations

import errno
import weakref
from typing import Any, Callable

from ._cconv import index_in, int_list


class _TxnRef:
    """A transaction's C handle and the memory it moves, abortable without the transaction object (its
    finalizer holds this): memory of a transaction dropped while its I/O is in flight stays alive until
    the abort has waited for that I/O."""

    __slots__ = ("owned", "h", "keep", "__weakref__")

    def __init__(self, owned, h):
        self.owned, self.h, self.keep = owned, h, []
        owned.txns.add(self)

    def detach(self) -> None:
        """The handle is gone (finished, or freed by the store's close)."""
        self.h = None
        self.keep = []
        self.owned.txns.discard(self)

    def abort(self) -> None:
        """tt_txn_abort() (it waits for the I/O in flight), then let go of the memory."""
        with self.owned.lock:
            if self.h is not None and self.owned.h is not None:
                with self.owned.on_device():
                    self.owned.binding.lib.tt_txn_abort(self.h)
            self.detach()

    def dropped(self) -> None:
        """Finalizer of an unfinished transaction: its store aborts it at its next call (any thread may run this)."""
        if self.h is not None:
            self.owned.dropped.append(self)


class _Txn:
    """What every transaction shares: its slots, per-layer waits, finish and abort, context manager."""

    def __init__(self, store, handle, n):
        self._store = store
        self._ref = _TxnRef(store._owned, handle)
        weakref.finalize(self, self._ref.dropped)
        self._n = n
        b = store._owned.binding
        present = b.ffi.new("int *")
        self.slots, self.present = [], []
        for i in range(n):
            self.slots.append(int(b.lib.tt_txn_slot(handle, i, present)))
            self.present.append(bool(present[0]))

    @property
    def _h(self):
        return self._ref.h

    @property
    def _keep(self) -> list:
        """Memory maps, block id arrays and buffers in flight (held by the handle: see _TxnRef)."""
        return self._ref.keep

    def __len__(self):
        return self._n

    def _handle(self):
        if self._ref.h is None:
            raise ValueError("transaction is finished, aborted or its store closed")
        return self._ref.h

    def _call(self, fn, *args, what: str):
        """``fn(handle, *args)`` of the store's library with the data path's device current, checked."""
        owned = self._store._owned
        with owned.lock:
            h = self._handle()
            with owned.on_device():
                rc = getattr(owned.binding.lib, fn)(h, *args)
            return owned.binding.check(rc, what)

    def _layer_index(self, layer) -> int:
        """``layer`` as the C call takes it: out of range (negative too) is libtutti's ERANGE."""
        return index_in(layer, "layer", self._store.geometry.n_layers)

    def wait_layer(self, layer: int) -> None:
        """Wait until ``layer`` has moved; reads are verified as they land (raises on an I/O error of the layer)."""
        layer = self._layer_index(layer)
        self._call("tt_txn_wait_layer", layer, what=f"wait layer {layer}")

    def poll(self) -> bool:
        """Whether every submitted layer's I/O has completed, without waiting: once True, ``finish()`` waits
        for no data I/O (a write's finish still flushes and writes its records).  A failed layer counts as
        completed (``finish()`` reports it); so does a data path that cannot tell."""
        owned = self._store._owned
        with owned.lock:
            h = self._handle()
            with owned.on_device():
                return bool(owned.binding.lib.tt_txn_poll(h))

    def finish(self) -> list:
        """Complete the transaction (writes: flush and commit; reads: verify); per block 0 or a negative errno
        (-EBADMSG, -EIO, -ENODATA, -ECANCELED)."""
        owned = self._store._owned
        with owned.lock:
            h = self._handle()
            status = owned.binding.ffi.new("int32_t[]", max(self._n, 1))
            with owned.on_device():
                rc = owned.binding.lib.tt_txn_finish(h, status)
            self._detach()
            owned.binding.check(rc, "finish")
        return list(status)[: self._n]

    def abort(self) -> None:
        """Drop the transaction (waits for a data path's I/O in flight); nothing of it is committed.  Idempotent."""
        self._ref.abort()

    def _detach(self):
        self._ref.detach()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        elif self._ref.h is not None:
            self.finish()


class _WriteOps:
    """prepare() and veto() of write transactions (the TP commit, tutti.tp.commit)."""

    # provided by _Txn, which every user of this mixin also derives from
    _store: Any
    _n: int
    _call: Callable[..., Any]

    def prepare(self) -> list:
        """Make the data durable without committing; per block 0 or a negative errno.

        ``finish()`` then commits the blocks that are 0 here and were not vetoed: every store of a TP group
        prepares, the group agrees, then each finishes.
        """
        status = self._store._owned.binding.ffi.new("int32_t[]", max(self._n, 1))
        self._call("tt_txn_prepare", status, what="prepare")
        return list(status)[: self._n]

    def veto(self, i: int) -> None:
        """Block ``i`` will not be committed (a block already stored stays)."""
        i = index_in(i, "block", self._n, errno.EINVAL, of="the transaction has")
        self._call("tt_txn_veto", i, what=f"veto block {i}")


class Txn(_Txn):
    """A layer-wise transfer of a batch of blocks through host memory (tt_txn_*).

    Submit every layer with ``layer()``, wait with ``wait_layer()``, then ``finish()``.  As a context manager
    it finishes on a clean exit (if not done already) and aborts on an exception, so nothing half-written is
    committed.
    """

    def layer(self, layer: int, memmap, block_ids) -> None:
        """Submit ``layer`` of every block; block i lives at memory block ``block_ids[i]``.

        ``memmap`` is a PagedBuffer (block ids are checked against it; it must stay open until the
        transaction ends) or a raw ``struct tt_memmap *`` of this store's library (the caller vouches).
        """
        paged: tuple = ()  # a GPU machine without the extension: no PagedBuffer either
        try:
            from .memory import PagedBuffer  # memory.py needs the extension
            paged = (PagedBuffer,)
        except ImportError:
            pass

        self._handle()
        layer = self._layer_index(layer)
        block_ids = int_list(block_ids, "block ids")
        if len(block_ids) != self._n:
            raise ValueError(f"{len(block_ids)} block ids for a transaction of {self._n} blocks")
        b = self._store._owned.binding
        if isinstance(memmap, paged):
            bad = [x for x in block_ids if not 0 <= x < memmap.n_blocks]
            if bad:
                raise IndexError(f"block ids {bad} outside the buffer's {memmap.n_blocks} blocks")
            # The C memory map has no object size: libtutti moves the store's span_bytes per object, so a
            # buffer of smaller objects would be overrun (reads) or read past (writes).
            g = self._store.geometry
            if memmap.span_bytes != g.span_bytes:
                raise ValueError(f"the buffer's objects are {memmap.span_bytes} bytes, the store's "
                                 f"{g.span_bytes}: make it with PagedBuffer.for_geometry(store.geometry, ...)")
            cmap = memmap.memmap_for(b.ffi, user=self)
        elif isinstance(memmap, b.ffi.CData) and b.ffi.typeof(memmap) is b.ffi.typeof("struct tt_memmap *"):
            cmap = memmap
        else:
            raise TypeError(f"memory must be a PagedBuffer or a struct tt_memmap * of this store's library, "
                            f"not {type(memmap).__name__}")
        ids = b.ffi.new("uint32_t[]", block_ids or [0])
        with self._store._owned.lock:
            h = self._handle()
            self._keep.append((memmap, cmap, ids))
            b.check(b.lib.tt_txn_layer(h, layer, cmap, ids), f"layer {layer}")


class WriteTxn(_WriteOps, Txn):
    """Stores blocks under keys; ``present[i]`` blocks are already stored and are skipped."""


class ReadTxn(Txn):
    """Loads committed slots; a block failing its checksum finishes with -EBADMSG."""


