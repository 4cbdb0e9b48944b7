"""The Tutti object store: one Python class over libtutti's tt_store_* API, whichever library serves it.

A store keeps KV blocks on 1..16 files or block devices.  Keys are hashed to 16 bytes (XXH3-128) exactly as
the C library does, so every process that names a block the same way finds the same slot.

``Store`` is bound to one libtutti (``_binding``: the compiled extension for ``tutti.Store``, libtutti_gpu.so
for ``tutti.gpu.GpuStore``) and moves blocks through pluggable data paths:

  host memory     ``read(slots)`` / ``write(keys)``: a Txn, one ``layer(l, memmap, block_ids)`` per layer,
                  through the store's CPU engine (uring, psync, kqueue); whole blocks with put/get/readinto
  device memory   ``attach(path)`` then ``read(slots, kv, block_ids)`` / ``write(keys, kv, block_ids)``:
                  a DeviceTxn through the data path ("host": the C reference path over host memory, in both
                  libraries; "gio", "staged", "gds": GPU memory, libtutti_gpu.so only); tutti._devpath

Ownership: what a store owns in C (the handle, its open transactions, its data path) is held by an
``_Owned`` that the Store's finalizer closes, so a Store dropped without close() still releases its members'
locks; a transaction dropped unfinished is aborted at the store's next call (tutti/_txn.py).  Every method of
a closed store or finished transaction raises ValueError.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import os
import threading
import uuid as _uuid
import weakref

from . import _binding
from ._cconv import (
    _features_dict,
    _format_params,
    _fp_from_c,
    _fp_to_c,
    _geometry,
    _keys_array,
    _member_paths,
    _plan,
    _stats_dict,
    _struct_dict,
    _written_dict,
    c_count,
    int_list,
    key_from_bytes,
    slot_list,
    whole,
)
from ._txn import ReadTxn, Txn, WriteTxn
from .model import Fingerprint, Geometry

# ---------------------------------------------------------------- what a store owns in C


class _Owned:
    """The C objects of one open store, closed by Store.close() or the Store's finalizer (which holds this,
    never the Store): the handle, its open transactions, its data path, its registered buffers."""

    def __init__(self, binding, h):
        self.binding, self.h = binding, h
        self.txns: set = set()  # _TxnRef of the open transactions
        self.dropped: list = []  # _TxnRef of transactions dropped unfinished
        self.path = None  # the attached data path (tutti._devpath.Attached)
        self.registered: list = []  # buffers libtutti holds pinned until close
        # The C handle is not thread-safe: two threads in it at once crash the process or hang it.  Every
        # call into the store (and its transactions) holds this, so a Store shared by threads is serialised
        # instead; re-entrant, since a call may reap or abort transactions.
        self.lock = threading.RLock()

    def on_device(self):
        """The data path's CUDA device current for a call (a launch on another device's stream would fail)."""
        return self.path.on_device() if self.path is not None else contextlib.nullcontext()

    def reap(self) -> None:
        """Abort the transactions dropped unfinished since the last call."""
        dropped, self.dropped = self.dropped, []
        for ref in dropped:
            ref.abort()

    def close(self) -> None:
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.h is None:
            return
        for ref in list(self.txns):
            ref.abort()
        self.dropped.clear()
        if self.path is not None:
            path, self.path = self.path, None
            path.close(self)
        h, self.h = self.h, None
        self.binding.lib.tt_store_close(h)
        ffi = self.binding.ffi
        for buf in self.registered:
            ffi.release(buf)
        self.registered.clear()


def _serial(method):
    """Run ``method`` holding its store's lock (``_Owned.lock``): one thread in the C handle at a time."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._owned.lock:
            return method(self, *args, **kwargs)
    return locked


# ---------------------------------------------------------------- the store


class Store:
    """An open Tutti store (``Store.open``); a context manager that closes it.

    The C handle is not thread-safe; this class serialises its calls (and its transactions'), so threads
    sharing a Store take turns instead of crashing the process.  Host memory: read()/write()
    transactions, put()/get()/readinto() of whole blocks; device memory: attach() a data path, then
    read()/write() with a DeviceKV (tutti._devpath).
    """

    _binding = _binding.EXTENSION  # the library serving this class's stores (tutti.gpu.GpuStore: GPU)
    _public_name = "tutti.Store"

    def __init__(self, handle, paths):
        self._owned = _Owned(type(self)._binding, handle)
        self._finalizer = weakref.finalize(self, self._owned.close)
        self.paths = paths
        self._by_index: list | None = None
        info = self._info()
        self._geometry = _geometry(info.geo)
        self._fingerprint = _fp_from_c(self._ffi, info.fp)
        self._uuid = str(_uuid.UUID(bytes=bytes(info.uuid)))
        self._engine = self._ffi.string(info.engine).decode()

    @property
    def _ffi(self):
        return self._owned.binding.ffi

    def _lib(self):
        return self._owned.binding.lib

    def _ok(self, rc, what=""):
        return self._owned.binding.check(rc, what)

    # --- creating and opening ------------------------------------------------

    @classmethod
    def plan(cls, n_members, fingerprint, *, n_slots=None, capacity_bytes=None, member_bytes=None,
             n_spans=2, span_bytes=None, stripe_objs=None):
        """Geometry of a store and the bytes each member needs, without touching any disk.

        Size it by ``n_slots``, by ``capacity_bytes`` (data over all members), or leave both out to fill
        ``member_bytes`` per member.
        """
        if n_slots is None and capacity_bytes is None and not member_bytes:
            raise ValueError("give n_slots, capacity_bytes or member_bytes")
        b = cls._binding
        p = _format_params(b, fingerprint, n_spans, span_bytes, stripe_objs)
        return _plan(b, p, n_members, n_slots, capacity_bytes, member_bytes)

    @classmethod
    def format(cls, paths, fingerprint, *, n_slots=None, capacity_bytes=None, n_spans=2,
               span_bytes=None, stripe_objs=None, force=False, preallocate=True) -> None:
        """Write a new, empty store over ``paths`` (files are created or extended).

        Without a size the store fills the smallest member.  Everything is checked before anything is
        written; an existing store is kept unless ``force``.  ``preallocate``: a file member's whole
        size is reserved now (fallocate: the extent pool, no allocation on the I/O path, ENOSPC here
        rather than at a save; on tmpfs its RAM is taken and zeroed now, not at each first write);
        False leaves holes, filled as blocks are first written.
        """
        b = cls._binding
        paths, cpaths, keep = _member_paths(b.ffi, paths)
        p = _format_params(b, fingerprint, n_spans, span_bytes, stripe_objs)
        if n_slots is not None or capacity_bytes is not None:
            _plan(b, p, len(paths), n_slots, capacity_bytes, None)
        p.flags = (b.lib.TT_FORMAT_FORCE if force else 0) | (b.lib.TT_FORMAT_PREALLOC if preallocate else 0)
        b.check(b.lib.tt_store_format(cpaths, len(paths), p), "format " + ", ".join(paths))
        del keep  # the C strings must live until here

    @classmethod
    def probe(cls, path) -> dict:
        """What ``path``'s two superblock copies hold, without opening it as a store.

        ``kind``: "none" (no Tutti superblock), "store" (one this tutti reads), "other_version"
        (a Tutti store of another format version) or "damaged" (Tutti magic, no valid copy).
        The same check format makes before it overwrites anything: any kind but "none" needs
        ``force``.  Never blocks on a FIFO (refused) and takes no lock.  Raises TuttiError
        (e.g. errno ENOENT) when ``path`` cannot be read.
        """
        b = cls._binding
        ffi, lib = b.ffi, b.lib
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise TypeError(f"path must be str, bytes or os.PathLike, not {type(path).__name__}")
        path = os.fsdecode(path)  # bytes too: a member's name, never "b'...'" in messages
        kinds = {lib.TT_PROBE_NONE: "none", lib.TT_PROBE_STORE: "store",
                 lib.TT_PROBE_OTHER_VERSION: "other_version", lib.TT_PROBE_DAMAGED: "damaged"}
        out = ffi.new("struct tt_probe *")
        b.check(lib.tt_store_probe(os.fsencode(path), out), f"probe {path}")
        kind = kinds.get(out.kind, "damaged")
        d: dict = {"path": str(path), "kind": kind}
        if kind in ("store", "other_version"):
            d["version"] = out.version
            d["magic"] = bytes(ffi.buffer(out.magic)).decode("ascii", "replace")
        if kind == "store":
            d["features"] = _features_dict(lib, out.feat)
            d["uuid"] = str(_uuid.UUID(bytes=bytes(out.uuid)))
            d["member_index"] = out.member_index
            d["n_members"] = out.n_members
        return d

    @classmethod
    def open(cls, paths, *, expect=None, readonly=False, verify=True, engine="auto", shared=False,
             queue_depth=0, cpu_threads=0) -> "Store":
        """Open a formatted store (members in any order).

        ``expect``: refuse (FingerprintMismatch) a store of another model.  ``verify=False`` skips read
        checksums (unsafe); ``shared`` takes no exclusive lock, for several cooperating processes.
        ``cpu_threads``: threads for the CPU's share of a transfer (the copies when the members are in the page
        cache or on tmpfs — reads of large layers, and on tmpfs their writes too, copied and hashed by these
        threads; each layer's checksums when host memory is moved); 0 = the CPUs the process may run on, at
        most 8; 1 = the calling thread only.  A store
        of another format version, or with incompatible features this tutti does not know, is refused
        (errno EOPNOTSUPP); one with unknown read-only-compatible features opens only with
        ``readonly=True`` (else EROFS).
        """
        b = cls._binding
        ffi, lib = b.ffi, b.lib
        if not isinstance(engine, str):
            raise TypeError(f"engine must be a str (auto, uring, psync, kqueue), not {type(engine).__name__}")
        queue_depth = c_count(queue_depth, "queue_depth", (1 << 32) - 1)
        cpu_threads = c_count(cpu_threads, "cpu_threads", 1024)
        paths, cpaths, keep = _member_paths(ffi, paths)
        p = ffi.new("struct tt_open_params *")
        p.flags = ((lib.TT_OPEN_RDONLY if readonly else 0)
                   | (0 if verify else lib.TT_OPEN_NO_VERIFY)
                   | (lib.TT_OPEN_SHARED if shared else 0))
        fp = None
        if expect is not None:
            fp = ffi.new("struct tt_fingerprint *")
            _fp_to_c(lib, expect, fp)
            p.expect = fp
        engine_c = ffi.new("char[]", engine.encode())
        p.engine = engine_c
        p.engine_params.queue_depth = queue_depth
        p.engine_params.copy_threads = cpu_threads
        p.cpu_threads = cpu_threads
        out = ffi.new("struct tt_store **")
        b.check(lib.tt_store_open(cpaths, len(paths), p, out), "open " + ", ".join(paths))
        del keep, fp, engine_c  # borrowed by p until here
        return cls(out[0], paths)

    def close(self) -> None:
        """Abort open transactions, detach the data path, release the store.  Idempotent."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._owned.h is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.closed:
            state = "closed"
        else:
            state = f"{self._geometry.n_slots} slots" + (f", path {self.path}" if self.path else "")
        return f"<{self._public_name} {self._uuid} {self._fingerprint.model_id} {state}>"

    def _handle(self):
        o = self._owned
        if o.h is None:
            raise ValueError("store is closed")
        if o.dropped:
            o.reap()
        return o.h

    # --- description -----------------------------------------------------------

    @property
    def geometry(self) -> Geometry:
        return self._geometry

    @property
    def fingerprint(self) -> Fingerprint:
        return self._fingerprint

    @property
    def uuid(self) -> str:
        return self._uuid

    @property
    def engine(self) -> str:
        """I/O engine in use: "uring", "psync", "kqueue", or "fault:..." (fault injection, for tests)."""
        return self._engine

    @property
    def block_bytes(self) -> int:
        return self._geometry.block_bytes

    def _info(self):
        info = self._ffi.new("struct tt_store_info *")
        self._ok(self._lib().tt_store_get_info(self._handle(), info), "info")
        return info

    @_serial
    def info(self) -> dict:
        """Geometry, fingerprint, occupancy and counters, JSON-serialisable (and the data path, if attached)."""
        info = self._info()
        out = {
            "uuid": self._uuid,
            "paths": list(self.paths),
            "geometry": self._geometry.to_dict(),
            "fingerprint": self._fingerprint.to_dict(),
            "member_bytes": info.member_bytes,
            "table_bytes": info.table_bytes,
            "created_ns": info.created_ns,
            "n_committed": info.n_committed,
            "n_free": info.n_free,
            "n_bad_records": info.n_bad_records,
            "n_clearing": info.n_clearing,
            "features": self.features(),
            "engine": self._engine,
            "stats": _stats_dict(info.stats),
            "written": self.written(),
        }
        if self.path is not None:
            out.update(path=self.path, device=self.device)
        return out

    @_serial
    def features(self) -> dict:
        """The store's feature masks (see ``_features_dict``)."""
        f = self._ffi.new("struct tt_features *")
        self._lib().tt_store_get_features(self._handle(), f)
        return _features_dict(self._lib(), f)

    @_serial
    def stats(self) -> dict:
        """Counters since open (store and I/O engine)."""
        return _stats_dict(self._info().stats)

    @_serial
    def occupancy(self) -> dict:
        """``committed`` blocks of ``slots``, and ``evictions`` since open: one call, no I/O (cheap enough
        for every step's metrics)."""
        info = self._info()
        return {"committed": int(info.n_committed), "slots": self._geometry.n_slots,
                "evictions": int(info.stats.evictions)}

    @_serial
    def written(self) -> dict:
        """Bytes the store wrote to each member, kept across restarts in the store itself (``_written_dict``).

        Saved at close and every ``save_every_bytes`` written to a member; a process that dies loses at most
        what was counted since the last save (``bytes - saved_bytes`` of each member).  A read-only open sees
        the counts as last saved.
        """
        w = self._ffi.new("struct tt_written *")
        self._ok(self._lib().tt_store_get_written(self._handle(), w), "written")
        return _written_dict(self._lib(), w, self._member_paths())

    def _member_paths(self) -> list:
        """The paths this store was opened with, in member-index order (matched by device and inode)."""
        if self._by_index is None:
            fds = self._ffi.new(f"int[{self._lib().TT_MAX_MEMBERS}]")
            n = self._lib().tt_store_member_fds(self._handle(), fds, self._ffi.NULL)
            ids = {}
            for p in self.paths:
                try:
                    st = os.stat(p)
                    ids[(st.st_dev, st.st_ino)] = p
                except OSError:
                    continue
            out = []
            for i in range(n):
                st = os.fstat(fds[i])
                out.append(ids.get((st.st_dev, st.st_ino)))
            self._by_index = out
        return self._by_index

    # --- whole blocks through host memory and the key index ----------------------

    def _block_buffer(self, data, writable=False):
        self._handle()  # a closed store says so first
        try:
            buf = self._ffi.from_buffer(data, require_writable=writable)
        except (TypeError, BufferError):
            kind = "a writable buffer" if writable else "a bytes-like buffer"
            raise TypeError(f"block data must be {kind}, not {type(data).__name__}") from None
        if len(buf) != self.block_bytes:
            raise ValueError(f"block data is {len(buf)} bytes; this store's blocks are "
                             f"{self.block_bytes} bytes")
        return buf

    def _key(self, key) -> bytes:
        return key_from_bytes(self._owned.binding, key)

    @_serial
    def put(self, key, data) -> None:
        """Store one block held in host memory, objects in (layer, span) order (the store's CPU engine);
        a stored key is left as is."""
        buf = self._block_buffer(data)
        self._ok(self._lib().tt_store_put(self._handle(), self._key(key), buf, len(buf)), "put")

    @_serial
    def readinto(self, key, buf) -> None:
        """Load the block of ``key`` into writable ``buf``: KeyError on a miss,
        CorruptBlockError (and the slot is dropped) if it fails its checksum."""
        cbuf = self._block_buffer(buf, writable=True)
        L = self._lib()
        rc = L.tt_store_get(self._handle(), self._key(key), cbuf, len(cbuf))
        if rc == -errno.ENOENT:
            L.tt_clearerr()
            raise KeyError(key)
        self._ok(rc, "get")

    def get(self, key) -> bytes:
        """The block stored under ``key`` (see readinto())."""
        buf = bytearray(self.block_bytes)
        self.readinto(key, buf)
        return bytes(buf)

    @_serial
    def lookup(self, keys) -> list:
        """Slot of each key, or None for a miss; hits become most recently used."""
        arr, n = _keys_array(self._owned.binding, keys)
        slots = self._ffi.new("int64_t[]", max(n, 1))
        self._ok(self._lib().tt_store_lookup(self._handle(), arr, n, slots), "lookup")
        return [int(s) if s >= 0 else None for s in slots[0:n]]

    def __contains__(self, key) -> bool:
        return self.lookup([key])[0] is not None

    @_serial
    def invalidate(self, slots) -> int:
        """Drop committed slots durably; returns how many were dropped."""
        slots = slot_list(slots, self._geometry.n_slots)
        arr = self._ffi.new("int64_t[]", slots or [0])
        return self._ok(self._lib().tt_store_invalidate(self._handle(), arr, len(slots)), "invalidate")

    @_serial
    def locate(self, slot: int, layer: int, span: int) -> tuple:
        """``(member, byte offset)`` of object (slot, layer, span) on disk (tt_store_locate())."""
        g = self._geometry
        slot, layer, span = whole(slot, "slot"), whole(layer, "layer"), whole(span, "span")
        if not (0 <= slot < g.n_slots and 0 <= layer < g.n_layers and 0 <= span < g.n_spans):
            raise IndexError(f"object ({slot}, {layer}, {span}) outside {g.n_slots} slots x "
                             f"{g.n_layers} layers x {g.n_spans} spans")
        e = self._ffi.new("struct tt_extent *")
        self._ok(self._lib().tt_store_locate(self._handle(), slot, layer, span, e), "locate")
        return int(e.member), int(e.off)

    @_serial
    def committed(self, chunk: int = 4096) -> dict:
        """Every committed block: {16-byte store key: slot}, from the in-memory index (no I/O)."""
        chunk = whole(chunk, "chunk")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        chunk = min(chunk, max(self._geometry.n_slots, 1))  # never a buffer larger than the store's slots
        ffi, L = self._ffi, self._lib()
        K = L.TT_KEY_BYTES
        keys = ffi.new("uint8_t[]", chunk * K)
        slots = ffi.new("int64_t[]", chunk)
        out = {}
        for first in range(0, self._geometry.n_slots, chunk):
            # A range of `chunk` slots holds at most `chunk` committed ones.
            found = self._ok(L.tt_store_list(self._handle(), first, chunk, keys, slots, chunk), "list")
            raw = ffi.buffer(keys, found * K)[:]
            for i in range(found):
                out[raw[i * K:(i + 1) * K]] = int(slots[i])
        return out

    @_serial
    def slot_record(self, slot: int) -> dict:
        """The committed record of ``slot`` (no I/O): {"key": 16-byte store key, "gen", "data_sum"}.

        What a cluster peer is told it will get and checks it got; KeyError if the slot is not committed.
        """
        slot = whole(slot, "slot")
        if not 0 <= slot < self._geometry.n_slots:
            raise IndexError(f"slot {slot} outside the store's {self._geometry.n_slots} slots")
        rec = self._ffi.new("struct tt_slot_record *")
        L = self._lib()
        rc = L.tt_store_slot_record(self._handle(), slot, rec)
        if rc == -errno.ENOENT:
            L.tt_clearerr()
            raise KeyError(slot)
        self._ok(rc, "slot record")
        return {"key": bytes(self._ffi.buffer(rec.key)), "gen": int(rec.gen), "data_sum": int(rec.data_sum)}

    # block_sum and copy_block_sum use no handle: they never wait for another thread's store call (a
    # cluster fetch checks received blocks while a serve thread reads the store).
    def block_sum(self, data) -> int:
        """The data checksum a commit of ``data`` (one whole block, put()'s layout) records: libtutti's
        own rule (tt_sum_block), to compare with slot_record()'s data_sum."""
        buf = self._block_buffer(data)
        g = self._geometry
        out = self._ffi.new("uint64_t *")
        self._ok(self._lib().tt_sum_block(buf, g.span_bytes, g.n_layers * g.n_spans, out), "block sum")
        return int(out[0])

    def copy_block_sum(self, dst, src) -> int:
        """Copy one whole block from ``src`` into writable ``dst`` and return the block_sum() of the copy:
        one pass over memory (tt_copy_sum_block hashes each object from ``dst`` right after copying it), and
        the sum vouches for what ``dst`` holds even if ``src`` changes meanwhile."""
        out_buf = self._block_buffer(dst, writable=True)
        in_buf = self._block_buffer(src)
        g = self._geometry
        out = self._ffi.new("uint64_t *")
        self._ok(self._lib().tt_copy_sum_block(out_buf, in_buf, g.span_bytes, g.n_layers * g.n_spans, out),
                 "copy and sum a block")
        return int(out[0])

    # --- layer-wise transfers --------------------------------------------------

    @_serial
    def write(self, keys, kv=None, block_ids=None):
        """Begin storing one block per key (slots: free first, else least recently used).

        Host memory: a WriteTxn (each ``layer()`` names its memory).  With ``kv`` (a DeviceKV) and
        ``block_ids``: a DeviceTxn through the attached data path.
        """
        if kv is not None or block_ids is not None:
            from . import _devpath

            return _devpath.begin(self, keys, kv, block_ids, write=True)
        arr, n = _keys_array(self._owned.binding, keys)
        out = self._ffi.new("struct tt_txn **")
        self._ok(self._lib().tt_store_write_begin(self._handle(), arr, n, out), f"write {n} blocks")
        return WriteTxn(self, out[0], n)

    @_serial
    def read(self, slots, kv=None, block_ids=None):
        """Begin loading committed ``slots`` (from lookup()); they stay pinned until finish.

        Host memory: a ReadTxn; with ``kv`` and ``block_ids``: a DeviceTxn through the data path.
        """
        if kv is not None or block_ids is not None:
            from . import _devpath

            return _devpath.begin(self, slots, kv, block_ids, write=False)
        slots = slot_list(slots, self._geometry.n_slots)
        arr = self._ffi.new("int64_t[]", slots or [0])
        out = self._ffi.new("struct tt_txn **")
        self._ok(self._lib().tt_store_read_begin(self._handle(), arr, len(slots), out),
                 f"read {len(slots)} blocks")
        return ReadTxn(self, out[0], len(slots))

    @_serial
    def register_memory(self, buffer) -> None:
        """Register a long-lived buffer for fixed-buffer I/O (optional, saves page pinning).

        The store keeps the buffer exported (an mmap cannot be closed) until it closes: libtutti has no
        unregister, and memory mapped later at the same address must never be taken for the pinned pages.
        """
        try:
            buf = self._ffi.from_buffer(buffer)
        except TypeError:
            raise TypeError(f"memory to register must be a bytes-like buffer, not {type(buffer).__name__}") from None
        self._ok(self._lib().tt_store_register_memory(self._handle(), buf, len(buf)), "register memory")
        self._owned.registered.append(buf)

    # --- data paths into device memory (tutti._devpath) -----------------------------

    @property
    def path(self) -> str | None:
        """Name of the attached data path, or None."""
        return self._owned.path.name if self._owned.path is not None else None

    @property
    def device(self) -> int | None:
        """CUDA device of the attached data path (None: none attached, or the "host" path)."""
        return self._owned.path.device if self._owned.path is not None else None

    def _on_device(self):
        return self._owned.on_device()

    @_serial
    def attach(self, path: str = "gio", **params) -> "Store":
        """Give the store a data path for device memory (replacing any); returns self.

        "host" (C reference path over host memory, any library) or "gio" / "staged" / "gds" (GPU memory,
        libtutti_gpu.so: tutti.gpu.GpuStore); parameters: tutti._devpath.attach.
        """
        from . import _devpath

        _devpath.attach(self, path, **params)
        return self

    @_serial
    def detach(self) -> None:
        """Remove the data path (no transaction may be open).  Idempotent."""
        from . import _devpath

        _devpath.detach(self)

    @_serial
    def emulator_stats(self) -> dict:
        """The gio path's emulated controller: commands, errors, bytes, ring wraps, doorbells."""
        from . import _devpath

        return _devpath.emulator_stats(self)

    # --- maintenance -------------------------------------------------------------

    def check(self, first=0, count=None, repair=False, chunk=64, progress=None) -> dict:
        """Verify committed slots in [first, first + count), ``chunk`` slots per C call.

        ``progress(done_slots)`` is called after each chunk.  ``repair`` clears bad slots (read, but failing
        their checksum) and damaged records durably; slots that could not be read (an I/O error) are counted
        ``unreadable`` and kept.  Returns the totals and the list of bad slots.
        """
        n_slots = self._geometry.n_slots
        first, chunk = whole(first, "first"), whole(chunk, "chunk")
        if not 0 <= first <= n_slots:
            raise ValueError(f"first slot {first} outside the store's {n_slots} slots")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        if count is not None and whole(count, "count") < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        end = n_slots if count is None else min(n_slots, first + count)
        chunk = min(chunk, max(end - first, 1), (1 << 32) - 1)  # its bad-slot buffer: no larger than the slots checked
        ffi, L = self._ffi, self._lib()
        res = ffi.new("struct tt_check_result *")
        bad = ffi.new("int64_t[]", chunk)
        bad_slots = []
        pos = first
        while pos < end:
            n = min(chunk, end - pos)
            with self._owned.lock:  # per chunk: progress() below runs unlocked
                found = self._ok(L.tt_store_check(self._handle(), pos, n, int(repair), res, bad, chunk), "check")
            bad_slots.extend(bad[0:min(found, chunk)])
            pos += n
            if progress is not None:
                progress(pos - first)
        return {**_struct_dict(res, ("checked", "ok", "bad", "bad_records", "repaired", "unreadable")),
                "bad_slots": bad_slots}

    @_serial
    def set_faults(self, spec: str) -> None:
        """Arm fault-injection rules (libtutti's fault.h text form; "" disarms), for tests.

        Only a store opened with a ``fault:...`` engine (or with TUTTI_FAULTS set) injects faults; on any
        other the call fails (EOPNOTSUPP).  Rules count I/O from now on.
        """
        if not isinstance(spec, str):
            raise TypeError(f"fault rules must be a str, not {type(spec).__name__}")
        self._ok(self._lib().tt_store_set_faults(self._handle(), spec.encode()), "set faults")


__all__ = ["Store", "Txn", "WriteTxn", "ReadTxn", "key_from_bytes", "int_list"]  # the Txn classes: _txn.py
