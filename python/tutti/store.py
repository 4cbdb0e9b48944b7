"""The Tutti object store: Python face of libtutti's tt_store_* API.

A store keeps KV blocks on 1..16 files or block devices.  Keys are hashed to
16 bytes (XXH3-128) exactly as the C library does, so every process that
names a block the same way finds the same slot.
"""
import os
import uuid as _uuid

from . import _cstore
from ._tutti import ffi, lib
from .errors import check
from .memory import PagedBuffer
from .model import Fingerprint, Geometry

_KEY = lib.TT_KEY_BYTES


def key_from_bytes(key) -> bytes:
    """The 16-byte store key of ``key`` (bytes-like, or str as UTF-8).

    Every key is hashed, a 16-byte one too, so one name always maps to one key.
    """
    return _cstore.key_from_bytes(ffi, lib, _KEY, key)


def _keys(keys):
    """Hash ``keys`` into one C array of back-to-back 16-byte keys."""
    return _cstore.keys_array(ffi, lib, _KEY, keys)


def _slots(slots):
    slots = list(slots)
    for s in slots:
        if not isinstance(s, int):
            raise TypeError(f"slot must be an int, not {type(s).__name__} (a lookup miss?)")
    return ffi.new("int64_t[]", slots or [0]), len(slots)


def _member_paths(paths):
    return _cstore.member_paths(ffi, paths)


def _fp_to_c(fp: Fingerprint, out):
    _cstore.fp_to_c(fp, out, lib.TT_MODEL_ID_LEN, lib.TT_DTYPE_LEN)


def _fp_from_c(c) -> Fingerprint:
    return _cstore.fp_from_c(ffi, c)


_geometry = _cstore.geometry_from_c


def _struct_dict(c, fields) -> dict:
    return {name: getattr(c, name) for name in fields}


_ENGINE_STATS = ("ios", "reqs", "bytes_read", "bytes_written", "syscalls", "flushes")
_STORE_STATS = ("lookups", "hits", "blocks_read", "blocks_written", "commits", "evictions",
                "corrupt_blocks")


def _stats_dict(st) -> dict:
    return {**_struct_dict(st, _STORE_STATS), "engine": _struct_dict(st.engine, _ENGINE_STATS)}


_PROBE_KINDS = {
    lib.TT_PROBE_NONE: "none", lib.TT_PROBE_STORE: "store",
    lib.TT_PROBE_OTHER_VERSION: "other_version", lib.TT_PROBE_DAMAGED: "damaged",
}


def _features_dict(f) -> dict:
    """Feature masks and the bits of them this libtutti does not know (docs/format.md).

    Unknown compat bits are ignored; unknown ro_compat bits mean the store could only
    be opened read-only; a store with unknown incompat bits does not open at all.
    """
    return {
        "compat": f.compat, "ro_compat": f.ro_compat, "incompat": f.incompat,
        "unknown_compat": f.compat & ~lib.TT_FEAT_COMPAT_KNOWN,
        "unknown_ro_compat": f.ro_compat & ~lib.TT_FEAT_RO_COMPAT_KNOWN,
    }


def _format_params(fingerprint, n_spans, span_bytes, stripe_objs):
    """tt_format_params with the size left out (0: fill the smallest member)."""
    p = ffi.new("struct tt_format_params *")
    _fp_to_c(fingerprint, p.fp)
    p.n_spans = n_spans or 0
    p.span_bytes = span_bytes or 0
    p.stripe_objs = stripe_objs or 0
    return p


def _plan(p, n_members, n_slots, capacity_bytes, member_bytes):
    """Size ``p`` by slots or data capacity and run tt_store_plan(): (geometry, need_bytes)."""
    if n_slots is not None and capacity_bytes is not None:
        raise ValueError("give n_slots or capacity_bytes, not both")
    geo = ffi.new("struct tt_geometry *")
    need = ffi.new("uint64_t *")
    if capacity_bytes is not None:
        # One slot's disk footprint (objects padded to 4 KiB) sets the slot count.
        p.n_slots = 1
        check(lib.tt_store_plan(p, n_members, 0, geo, need))
        slot_bytes = _geometry(geo).slot_bytes
        if capacity_bytes < slot_bytes:
            raise ValueError(f"capacity of {capacity_bytes} bytes holds no block "
                             f"(one block takes {slot_bytes} bytes)")
        n_slots = capacity_bytes // slot_bytes
    p.n_slots = n_slots or 0
    check(lib.tt_store_plan(p, n_members, member_bytes or 0, geo, need))
    return _geometry(geo), need[0]


class Txn:
    """A layer-wise transfer of a batch of blocks (tt_txn_*).

    Submit every layer with ``layer()``, wait with ``wait_layer()``, then
    ``finish()``.  As a context manager it finishes on a clean exit (if not done
    already) and aborts on an exception, so nothing half-written is committed.
    """

    def __init__(self, store, handle, n):
        self._store = store
        self._h = handle
        self._n = n
        self._keep = []  # memory maps and block id arrays in flight
        present = ffi.new("int *")
        self.slots = []
        self.present = []
        for i in range(n):
            self.slots.append(lib.tt_txn_slot(handle, i, present))
            self.present.append(bool(present[0]))

    def __len__(self):
        return self._n

    def _handle(self):
        if self._h is None:
            raise ValueError("transaction is finished, aborted or its store closed")
        return self._h

    def layer(self, layer: int, memmap, block_ids) -> None:
        """Submit ``layer`` of every block; block i lives at memory block ``block_ids[i]``.

        ``memmap`` is a PagedBuffer (block ids are checked against it) or a raw
        ``struct tt_memmap *`` (the caller vouches for the ids).
        """
        block_ids = list(block_ids)
        if len(block_ids) != self._n:
            raise ValueError(f"{len(block_ids)} block ids for a transaction of {self._n} blocks")
        if isinstance(memmap, PagedBuffer):
            bad = [b for b in block_ids if not 0 <= b < memmap.n_blocks]
            if bad:
                raise IndexError(f"block ids {bad} outside the buffer's {memmap.n_blocks} blocks")
            cmap = memmap.memmap
        else:
            cmap = memmap
        ids = ffi.new("uint32_t[]", block_ids or [0])
        self._keep.append((memmap, ids))
        check(lib.tt_txn_layer(self._handle(), layer, cmap, ids))

    def wait_layer(self, layer: int) -> None:
        """Wait until ``layer`` has moved; reads are verified as they land."""
        check(lib.tt_txn_wait_layer(self._handle(), layer))

    def finish(self) -> list:
        """Complete the transaction; per block 0 or a negative errno (-EBADMSG, -EIO, -ENODATA)."""
        status = ffi.new("int32_t[]", max(self._n, 1))
        rc = lib.tt_txn_finish(self._handle(), status)
        self._detach()
        check(rc)
        return list(status)[: self._n]

    def abort(self) -> None:
        """Drop the transaction; nothing of it is committed.  Idempotent."""
        if self._h is not None:
            lib.tt_txn_abort(self._h)
            self._detach()

    def _detach(self):
        self._h = None
        self._keep.clear()
        self._store._txns.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        elif self._h is not None:
            self.finish()


class WriteTxn(Txn):
    """Stores blocks under keys; ``present[i]`` blocks are already stored and are skipped."""

    def prepare(self) -> list:
        """Make the data durable without committing; per block 0 or a negative errno.

        ``finish()`` then commits the blocks that are 0 here and were not
        vetoed.  Used to commit across stores (tutti.tp): every store prepares,
        the group agrees, then each finishes.
        """
        status = ffi.new("int32_t[]", max(self._n, 1))
        check(lib.tt_txn_prepare(self._handle(), status))
        return list(status)[: self._n]

    def veto(self, i: int) -> None:
        """Block ``i`` will not be committed (a block already stored stays)."""
        check(lib.tt_txn_veto(self._handle(), i))


class ReadTxn(Txn):
    """Loads committed slots; a block failing its checksum finishes with -EBADMSG."""


class Store(_cstore.BlockMethods):
    """An open Tutti store (use ``Store.open``); a context manager that closes it.

    Not thread-safe, like the C handle: use it from one thread at a time.  Whole blocks
    (put/get/readinto), lookup, committed and invalidate: _cstore.BlockMethods.
    """

    _ffi = ffi
    _key_bytes = _KEY

    @staticmethod
    def _clib():
        return lib

    @staticmethod
    def _ok(rc, what):
        return check(rc)  # the CPU binding's messages carry the reason alone

    def __init__(self, handle, paths):
        self._h = ffi.gc(handle, lib.tt_store_close)
        self.paths = paths
        self._txns = set()
        self._registered = []  # buffers libtutti holds pinned
        info = self._info()
        self._geometry = _geometry(info.geo)
        self._fingerprint = _fp_from_c(info.fp)
        self._uuid = str(_uuid.UUID(bytes=bytes(info.uuid)))
        self._engine = ffi.string(info.engine).decode()

    # --- creating and opening ------------------------------------------------

    @staticmethod
    def plan(n_members, fingerprint, *, n_slots=None, capacity_bytes=None, member_bytes=None,
             n_spans=2, span_bytes=None, stripe_objs=None):
        """Geometry of a store and the bytes each member needs, without touching any disk.

        Size it by ``n_slots``, by ``capacity_bytes`` (data over all members), or
        leave both out to fill ``member_bytes`` per member.
        """
        if n_slots is None and capacity_bytes is None and not member_bytes:
            raise ValueError("give n_slots, capacity_bytes or member_bytes")
        p = _format_params(fingerprint, n_spans, span_bytes, stripe_objs)
        return _plan(p, n_members, n_slots, capacity_bytes, member_bytes)

    @staticmethod
    def format(paths, fingerprint, *, n_slots=None, capacity_bytes=None, n_spans=2,
               span_bytes=None, stripe_objs=None, force=False) -> None:
        """Write a new, empty store over ``paths`` (files are created or extended).

        Without a size the store fills the smallest member.  Everything is checked
        before anything is written; an existing store is kept unless ``force``.
        """
        paths, cpaths, keep = _member_paths(paths)
        p = _format_params(fingerprint, n_spans, span_bytes, stripe_objs)
        if n_slots is not None or capacity_bytes is not None:
            _plan(p, len(paths), n_slots, capacity_bytes, None)
        p.flags = lib.TT_FORMAT_FORCE if force else 0
        check(lib.tt_store_format(cpaths, len(paths), p))
        del keep  # the C strings must live until here

    @staticmethod
    def probe(path) -> dict:
        """What ``path``'s two superblock copies hold, without opening it as a store.

        ``kind``: "none" (no Tutti superblock), "store" (one this tutti reads), "other_version"
        (a Tutti store of another format version) or "damaged" (Tutti magic, no valid copy).
        The same check format makes before it overwrites anything: any kind but "none" needs
        ``force``.  Never blocks on a FIFO (refused) and takes no lock.  Raises TuttiError
        (e.g. FileNotFoundError's errno ENOENT) when ``path`` cannot be read.
        """
        out = ffi.new("struct tt_probe *")
        check(lib.tt_store_probe(os.fsencode(path), out))
        kind = _PROBE_KINDS.get(out.kind, "damaged")
        d = {"path": str(path), "kind": kind}
        if kind in ("store", "other_version"):
            d["version"] = out.version
            d["magic"] = bytes(ffi.buffer(out.magic)).decode("ascii", "replace")
        if kind == "store":
            d["features"] = _features_dict(out.feat)
            d["uuid"] = str(_uuid.UUID(bytes=bytes(out.uuid)))
            d["member_index"] = out.member_index
            d["n_members"] = out.n_members
        return d

    @classmethod
    def open(cls, paths, *, expect=None, readonly=False, verify=True, engine="auto",
             shared=False, queue_depth=0) -> "Store":
        """Open a formatted store (members in any order).

        ``expect``: refuse (FingerprintMismatch) a store of another model.
        ``verify=False`` skips read checksums (unsafe); ``shared`` takes no
        exclusive lock, for several cooperating processes.  A store of another
        format version, or with incompatible features this tutti does not know,
        is refused (errno EOPNOTSUPP); one with unknown read-only-compatible
        features opens only with ``readonly=True`` (else EROFS).
        """
        paths, cpaths, keep = _member_paths(paths)
        p = ffi.new("struct tt_open_params *")
        p.flags = ((lib.TT_OPEN_RDONLY if readonly else 0)
                   | (0 if verify else lib.TT_OPEN_NO_VERIFY)
                   | (lib.TT_OPEN_SHARED if shared else 0))
        fp = None
        if expect is not None:
            fp = ffi.new("struct tt_fingerprint *")
            _fp_to_c(expect, fp)
            p.expect = fp
        engine_c = ffi.new("char[]", engine.encode())
        p.engine = engine_c
        p.engine_params.queue_depth = queue_depth
        out = ffi.new("struct tt_store **")
        check(lib.tt_store_open(cpaths, len(paths), p, out))
        del keep, fp, engine_c  # borrowed by p until here
        return cls(out[0], paths)

    def close(self) -> None:
        """Abort open transactions and release the store.  Idempotent."""
        if self._h is None:
            return
        for txn in list(self._txns):
            txn._h = None  # tt_store_close() aborts and frees them
            txn._keep.clear()
        self._txns.clear()
        h, self._h = self._h, None
        ffi.release(h)
        for buf in self._registered:
            ffi.release(buf)
        self._registered.clear()

    @property
    def closed(self) -> bool:
        return self._h is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._h is None else f"{self._geometry.n_slots} slots"
        return f"<tutti.Store {self._uuid} {self._fingerprint.model_id} {state}>"

    def _handle(self):
        if self._h is None:
            raise ValueError("store is closed")
        return self._h

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

    def _info(self):
        info = ffi.new("struct tt_store_info *")
        check(lib.tt_store_get_info(self._handle(), info))
        return info

    def info(self) -> dict:
        """Geometry, fingerprint, occupancy and counters, JSON-serialisable."""
        info = self._info()
        return {
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
            "features": self.features(),
            "engine": self._engine,
            "stats": _stats_dict(info.stats),
        }

    def features(self) -> dict:
        """The store's feature masks (see ``_features_dict``)."""
        f = ffi.new("struct tt_features *")
        lib.tt_store_get_features(self._handle(), f)
        return _features_dict(f)

    def stats(self) -> dict:
        """Counters since open (store and I/O engine)."""
        return _stats_dict(self._info().stats)

    # --- layer-wise transfers --------------------------------------------------

    def write(self, keys) -> WriteTxn:
        """Begin storing one block per key (slots: free first, else least recently used)."""
        arr, n = _keys(keys)
        out = ffi.new("struct tt_txn **")
        check(lib.tt_store_write_begin(self._handle(), arr, n, out))
        return self._track(WriteTxn(self, out[0], n))

    def read(self, slots) -> ReadTxn:
        """Begin loading committed ``slots`` (from lookup()); they stay pinned until finish."""
        arr, n = _slots(slots)
        out = ffi.new("struct tt_txn **")
        check(lib.tt_store_read_begin(self._handle(), arr, n, out))
        return self._track(ReadTxn(self, out[0], n))

    def _track(self, txn):
        self._txns.add(txn)
        return txn

    def register_memory(self, buffer) -> None:
        """Register a long-lived buffer for fixed-buffer I/O (optional, saves page pinning).

        The store keeps the buffer exported (an mmap cannot be closed) until it
        closes: libtutti has no unregister, and memory mapped later at the same
        address must never be taken for the pinned pages.
        """
        buf = ffi.from_buffer(buffer)
        check(lib.tt_store_register_memory(self._handle(), buf, len(buf)))
        self._registered.append(buf)

    # --- maintenance -------------------------------------------------------------

    def check(self, first=0, count=None, repair=False, chunk=64, progress=None) -> dict:
        """Verify committed slots in [first, first + count), ``chunk`` slots per C call.

        ``progress(done_slots)`` is called after each chunk.  ``repair`` clears
        bad slots (read, but failing their checksum) and damaged records durably;
        slots that could not be read (an I/O error) are counted ``unreadable`` and
        kept.  Returns the totals and the list of bad slots.
        """
        n_slots = self._geometry.n_slots
        if not 0 <= first <= n_slots:
            raise ValueError(f"first slot {first} outside the store's {n_slots} slots")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        end = n_slots if count is None else min(n_slots, first + count)
        res = ffi.new("struct tt_check_result *")
        bad = ffi.new("int64_t[]", chunk)
        bad_slots = []
        pos = first
        while pos < end:
            n = min(chunk, end - pos)
            found = check(lib.tt_store_check(self._handle(), pos, n, int(repair), res, bad, chunk))
            bad_slots.extend(bad[0:min(found, chunk)])
            pos += n
            if progress is not None:
                progress(pos - first)
        return {**_struct_dict(res, ("checked", "ok", "bad", "bad_records", "repaired", "unreadable")),
                "bad_slots": bad_slots}

    def set_faults(self, spec: str) -> None:
        """Arm fault-injection rules (libtutti's fault.h text form; "" disarms), for tests.

        Only a store opened with a ``fault:...`` engine (or with TUTTI_FAULTS set) injects
        faults; on any other the call fails (EOPNOTSUPP).  Rules count I/O from now on.
        """
        check(lib.tt_store_set_faults(self._handle(), spec.encode()))


__all__ = ["Store", "Txn", "WriteTxn", "ReadTxn", "key_from_bytes"]
