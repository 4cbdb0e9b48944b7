"""The Tutti store through libtutti_gpu.so, with layer-wise transactions into GPU memory.

Same on-disk format and the same C code as ``tutti.Store`` (the CPU binding), so
a block written here reads back there and the other way round; the two must not
hold one store at once (the members' lock refuses the second with StoreBusyError).
What this adds is a *data path* (devpath.h) that moves a transaction's objects
between the members and GPU memory itself, hashing them on the GPU, so every
load is verified against the store's checksums without KV bytes passing through
the CPU:

  gio      GPU threads build NVMe commands for an emulated controller serving the
           store's member files (tt_gio_path_open_emu)
  staged   file -> pinned host chunks -> HBM (tt_file_path_open_staged), needs no emulator
  gds      cuFile (tt_file_path_open_gds); GdsUnavailable where cuFile cannot run
  host     the C reference path over host memory (tt_devpath_host): the same
           transactions on CPU tensors, for tests on machines without a GPU

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

import errno
import uuid as _uuid

from .. import _cstore
from ..errors import CorruptBlockError, FingerprintMismatch, StoreBusyError, TuttiError, error_for  # noqa: F401
from ..model import Fingerprint, Geometry
from ._ffi import (TT_DTYPE_LEN, TT_FORMAT_FORCE, TT_KEY_BYTES, TT_MODEL_ID_LEN, TT_OPEN_NO_VERIFY, TT_OPEN_RDONLY,
                   TT_OPEN_SHARED, ffi, lib)
from .streams import stream_ptr

PATHS = ("gio", "staged", "gds", "host")


# ---------------------------------------------------------------- errors
# tutti.errors' classes (importable without the CPU extension): one hierarchy for both bindings.

StoreError = TuttiError


class GdsUnavailable(TuttiError):
    """cuFile is missing or its driver would not open here; use the staged path."""


def _check(rc: int, what: str, cls=None) -> int:
    if rc >= 0:
        return rc
    raise error_for(rc, what, ffi=ffi, lib=lib(), cls=cls)


# ---------------------------------------------------------------- keys and helpers


def key_from_bytes(key) -> bytes:
    """The 16-byte store key of ``key`` (str as UTF-8, or bytes-like): tutti.key_from_bytes, same hash."""
    return _cstore.key_from_bytes(ffi, lib(), TT_KEY_BYTES, key)


def _keys(keys):
    return _cstore.keys_array(ffi, lib(), TT_KEY_BYTES, keys)


_int_list = _cstore.int_list


def _member_paths(paths):
    return _cstore.member_paths(ffi, paths)


def _fp_to_c(fp: Fingerprint, out) -> None:
    _cstore.fp_to_c(fp, out, TT_MODEL_ID_LEN, TT_DTYPE_LEN)


def _fp_from_c(c) -> Fingerprint:
    return _cstore.fp_from_c(ffi, c)


_geometry = _cstore.geometry_from_c


def _torch():
    """torch, imported before the library's first CUDA call (one CUDA runtime in the process), or None."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    return torch


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---------------------------------------------------------------- GPU memory


class DeviceKV:
    """Where KV blocks live in GPU memory: per (layer, span) a base address and a block stride (tt_memmap).

    Object (block b, layer l, span k) is at ``base[l * n_spans + k] + b * stride[l * n_spans + k]``; each
    object must be contiguous.  Build it from torch CUDA tensors with ``from_tensor``; it keeps them
    alive.  ``num_blocks`` bounds the block ids a transaction may use.
    """

    def __init__(self, bases, strides, *, n_layers: int, n_spans: int, num_blocks: int, obj_bytes: int,
                 device: int, keep=()):
        if len(bases) != n_layers * n_spans or len(strides) != len(bases):
            raise ValueError(f"{len(bases)} bases / {len(strides)} strides for {n_layers} x {n_spans} objects")
        self.n_layers, self.n_spans, self.num_blocks, self.obj_bytes = n_layers, n_spans, num_blocks, obj_bytes
        self.device = device
        self.bases, self.strides = list(bases), list(strides)
        self._base = ffi.new("uint64_t[]", self.bases)
        self._stride = ffi.new("uint64_t[]", self.strides)
        self.memmap = ffi.new("struct tt_memmap *")
        self.memmap.n_layers, self.memmap.n_spans = n_layers, n_spans
        self.memmap.base, self.memmap.stride = self._base, self._stride
        self._keep = keep

    @classmethod
    def from_tensor(cls, kv) -> "DeviceKV":
        """From torch tensors (CUDA; CPU ones only for the "host" path), in any of these forms:

        - one tensor ``[n_layers, n_spans, num_blocks, ...]`` (tutti.prefill.PagedKVCache.kv)
        - a list over layers of ``[n_spans, num_blocks, ...]`` tensors (vLLM's flash layout per layer)
        - a list over layers of (K, V, ...) tuples of ``[num_blocks, ...]`` tensors
        """
        layers = list(kv) if not hasattr(kv, "dim") else [kv[l] for l in range(kv.shape[0])]
        if not layers:
            raise ValueError("no layers")
        objs = []
        for l, layer in enumerate(layers):
            spans = [layer[k] for k in range(layer.shape[0])] if hasattr(layer, "dim") else list(layer)
            if not spans:
                raise ValueError(f"layer {l}: no spans")
            objs.append(spans)
        n_spans = len(objs[0])
        if any(len(s) != n_spans for s in objs):
            raise ValueError(f"layers have different numbers of spans: {[len(s) for s in objs]}")
        first = objs[0][0]
        if not hasattr(first, "data_ptr") or not hasattr(first, "device"):
            raise TypeError(f"expected torch tensors, got {type(first).__name__}")
        num_blocks, dev = int(first.shape[0]), first.device
        obj_bytes = first[0].numel() * first.element_size()
        bases, strides = [], []
        for l, spans in enumerate(objs):
            for k, t in enumerate(spans):
                where = f"layer {l} span {k}"
                if t.device != dev:
                    raise ValueError(f"{where} is on {t.device}, layer 0 span 0 on {dev}")
                if t.dim() < 1 or int(t.shape[0]) != num_blocks:
                    raise ValueError(f"{where}: {tuple(t.shape)}, expected [{num_blocks} blocks, ...]")
                if t[0].numel() * t.element_size() != obj_bytes or not t[0].is_contiguous():
                    raise ValueError(f"{where}: a block's object must be {obj_bytes} contiguous bytes")
                stride = t.stride(0) * t.element_size()
                if num_blocks > 1 and stride < obj_bytes:
                    raise ValueError(f"{where}: block stride {stride} B < object size {obj_bytes} B (overlap)")
                bases.append(t.data_ptr())
                strides.append(stride)
        return cls(bases, strides, n_layers=len(objs), n_spans=n_spans, num_blocks=num_blocks, obj_bytes=obj_bytes,
                   device=(dev.index or 0) if dev.type == "cuda" else None, keep=(kv,))

    def check_geometry(self, geo: Geometry) -> None:
        if (self.n_layers, self.n_spans) != (geo.n_layers, geo.n_spans):
            raise ValueError(f"memory holds {self.n_layers} layers x {self.n_spans} spans, "
                             f"the store {geo.n_layers} x {geo.n_spans}")
        if self.obj_bytes != geo.span_bytes:
            raise ValueError(f"memory objects are {self.obj_bytes} B, the store's {geo.span_bytes} B")

    def uniform_layers(self) -> str | None:
        """None if every layer is one base + one block stride + one span stride (what the gio path needs), else why not."""
        S = self.n_spans
        for l in range(self.n_layers):
            b, s = self.bases[l * S:(l + 1) * S], self.strides[l * S:(l + 1) * S]
            ss = b[1] - b[0] if S > 1 else 0
            if any(x != s[0] for x in s) or any(b[k] != b[0] + k * ss for k in range(S)):
                return f"layer {l}: its spans do not share one block stride and one span stride"
        return None

    def block_ids(self, block_ids, *, unique: bool) -> list:
        ids = _int_list(block_ids, "block ids")
        bad = [b for b in ids if not 0 <= b < self.num_blocks]
        if bad:
            raise IndexError(f"block ids {bad[:8]} outside the memory's {self.num_blocks} blocks")
        if unique and len(set(ids)) != len(ids):
            raise ValueError("a read names one memory block twice")
        return ids


# ---------------------------------------------------------------- transactions


class DeviceTxn:
    """A layer-wise transfer between the store and GPU memory, bound to the store's data path.

    Per layer: ``layer(l)`` submits it (asynchronous), ``order(l, stream)`` makes a CUDA stream wait for
    it on the GPU, ``wait_layer(l)`` waits on the host.  ``finish()`` returns per-block status: 0, or for
    reads -EBADMSG (checksum mismatch: the slot was dropped, discard what was computed from the block)
    or -EIO; for writes -EIO / -ENODATA (a layer never submitted) / -ECANCELED (vetoed).  As a context
    manager it finishes on a clean exit and aborts on an exception.
    """

    def __init__(self, store: "GpuStore", handle, n: int, write: bool, kv: DeviceKV, ids: list):
        self._store, self._h, self._n, self.write, self.kv = store, handle, n, write, kv
        self._ids = ffi.new("uint32_t[]", ids or [0])
        present = ffi.new("int *")
        self.slots, self.present = [], []
        L = lib()
        for i in range(n):
            self.slots.append(int(L.tt_txn_slot(handle, i, present)))
            self.present.append(bool(present[0]))
        self.block_ids = ids
        self.submitted: set[int] = set()

    def __len__(self):
        return self._n

    def _handle(self):
        if self._h is None:
            raise ValueError("transaction is finished, aborted or its store closed")
        return self._h

    def layer(self, layer: int, *, ready="current") -> None:
        """Submit ``layer`` of every block.

        The path's streams do not wait for the caller's.  Writes: the memory must hold its final bytes
        now, so ``ready`` is honoured before every layer.  Reads: the blocks' memory must be free of the
        caller's queued work (an attention still reading the old contents), so ``ready`` is honoured once,
        before the transaction's first layer; later layers only queue (the overlap with compute).
        ``ready``: "current" (default) synchronises the device's current torch stream; a torch Event or
        Stream is synchronised; None: the caller vouches.
        """
        h = self._handle()
        if not 0 <= layer < self.kv.n_layers:
            raise IndexError(f"layer {layer} outside the store's {self.kv.n_layers} layers")
        if layer in self.submitted:
            raise ValueError(f"layer {layer} already submitted")
        with self._store._on_device():
            first = not self.submitted
            if (self.write or first) and ready is not None and self._store.device is not None:
                if ready == "current":
                    self._store._torch.cuda.current_stream().synchronize()
                else:
                    ready.synchronize()
            self.submitted.add(layer)
            _check(lib().tt_txn_layer(h, layer, self.kv.memmap, ffi.NULL), f"layer {layer}")

    def order(self, layer: int, stream=None) -> None:
        """Make ``stream`` (torch stream or cudaStream_t int; default: the current torch stream) wait on the
        GPU until ``layer`` has landed and been hashed.  Corruption is still judged at finish()."""
        h = self._handle()
        with self._store._on_device():
            if stream is None:
                stream = self._store._torch.cuda.current_stream()
            _check(lib().tt_txn_layer_order(h, layer, stream_ptr(stream)), f"order layer {layer}")

    def wait_layer(self, layer: int) -> None:
        """Block until ``layer`` moved (reads: and were hashed); raises StoreError (-EIO) if a command failed."""
        h = self._handle()
        with self._store._on_device():
            _check(lib().tt_txn_wait_layer(h, layer), f"wait layer {layer}")

    def transfer(self, *, ready="current") -> list:
        """Every layer not yet submitted, then wait for all and finish(): the per-block status."""
        for l in range(self.kv.n_layers):
            if l not in self.submitted:
                self.layer(l, ready=ready)
                ready = None  # one synchronisation covers the rest
        for l in sorted(self.submitted):
            try:
                self.wait_layer(l)
            except StoreError:
                pass  # the failed blocks show in finish()'s status
        return self.finish()

    def finish(self) -> list:
        """Complete the transaction (writes: flush and commit; reads: verify); per-block status."""
        h = self._handle()
        status = ffi.new("int32_t[]", max(self._n, 1))
        with self._store._on_device():
            rc = lib().tt_txn_finish(h, status)
        self._detach()
        _check(rc, "finish")
        return list(status)[:self._n]

    def prepare(self) -> list:
        """Writes: make the data durable, commit nothing (TP commit, tutti.tp.commit); per-block status."""
        status = ffi.new("int32_t[]", max(self._n, 1))
        with self._store._on_device():
            _check(lib().tt_txn_prepare(self._handle(), status), "prepare")
        return list(status)[:self._n]

    def veto(self, i: int) -> None:
        """Writes: block ``i`` will not be committed."""
        _check(lib().tt_txn_veto(self._handle(), i), f"veto block {i}")

    def abort(self) -> None:
        """Drop the transaction (waits for the path's I/O in flight); nothing is committed.  Idempotent."""
        if self._h is not None:
            with self._store._on_device():
                lib().tt_txn_abort(self._h)
            self._detach()

    def _detach(self):
        self._h = None
        self._store._txns.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        elif self._h is not None:
            self.finish()


# ---------------------------------------------------------------- the store


class GpuStore(_cstore.BlockMethods):
    """An open store (``GpuStore.open``) in this process; a context manager that closes it.

    Not thread-safe (like the C handle).  ``attach()`` a data path before read()/write() into GPU memory;
    put()/get()/readinto() move whole blocks through host memory with the store's CPU engine; lookup,
    committed and invalidate as tutti.Store (_cstore.BlockMethods).
    """

    _ffi = ffi
    _key_bytes = TT_KEY_BYTES

    @staticmethod
    def _clib():
        return lib()

    @staticmethod
    def _ok(rc, what):
        return _check(rc, what)

    def __init__(self, handle, paths):
        self._h, self.paths = handle, paths
        self._txns: set[DeviceTxn] = set()
        self._path = None  # (name, handle)
        self.device = None
        self._torch = _torch()
        info = self._info()
        self.geometry = _geometry(info.geo)
        self.fingerprint = _fp_from_c(info.fp)
        self.uuid = str(_uuid.UUID(bytes=bytes(info.uuid)))
        self.engine = ffi.string(info.engine).decode()

    # --- creating and opening

    @staticmethod
    def format(paths, fingerprint: Fingerprint, *, n_slots: int | None = None, n_spans: int = 2,
               span_bytes: int | None = None, stripe_objs: int | None = None, force: bool = False) -> None:
        """Write a new, empty store over ``paths`` (as tutti.Store.format; without n_slots it fills the smallest member)."""
        paths, cpaths, keep = _member_paths(paths)
        p = ffi.new("struct tt_format_params *")
        _fp_to_c(fingerprint, p.fp)
        p.n_spans, p.span_bytes, p.stripe_objs = n_spans or 0, span_bytes or 0, stripe_objs or 0
        p.n_slots = n_slots or 0
        p.flags = TT_FORMAT_FORCE if force else 0
        _check(lib().tt_store_format(cpaths, len(paths), p), "format " + ", ".join(paths))
        del keep

    @classmethod
    def open(cls, paths, *, expect: Fingerprint | None = None, readonly: bool = False, verify: bool = True,
             engine: str = "auto", shared: bool = False) -> "GpuStore":
        """Open a formatted store; ``expect`` refuses (FingerprintMismatch) another model's store."""
        _torch()  # before the library loads: its CUDA runtime must be PyTorch's
        paths, cpaths, keep = _member_paths(paths)
        p = ffi.new("struct tt_open_params *")
        p.flags = ((TT_OPEN_RDONLY if readonly else 0) | (0 if verify else TT_OPEN_NO_VERIFY)
                   | (TT_OPEN_SHARED if shared else 0))
        fp = None
        if expect is not None:
            fp = ffi.new("struct tt_fingerprint *")
            _fp_to_c(expect, fp)
            p.expect = fp
        engine_c = ffi.new("char[]", engine.encode())
        p.engine = engine_c
        out = ffi.new("struct tt_store **")
        _check(lib().tt_store_open(cpaths, len(paths), p, out), "open " + ", ".join(paths))
        del keep, fp, engine_c
        return cls(out[0], paths)

    def close(self) -> None:
        """Abort open transactions, detach the data path, close the store.  Idempotent."""
        if self._h is None:
            return
        for t in list(self._txns):
            t.abort()
        self.detach()
        lib().tt_store_close(self._h)
        self._h = None

    @property
    def closed(self) -> bool:
        return self._h is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._h is None else f"{self.geometry.n_slots} slots, path {self.path}"
        return f"<tutti.gpu.GpuStore {self.uuid} {self.fingerprint.model_id} {state}>"

    def _handle(self):
        if self._h is None:
            raise ValueError("store is closed")
        return self._h

    def _on_device(self):
        """The path's CUDA device current for a call (a launch on another device's stream would fail)."""
        if self.device is None or self._torch is None:
            return _Null()
        return self._torch.cuda.device(self.device)

    # --- data paths

    @property
    def path(self) -> str | None:
        """Name of the attached data path, or None."""
        return self._path[0] if self._path else None

    def attach(self, path: str = "gio", *, device=None, backing: str = "file", n_queues: int = 0, depth: int = 0,
               n_threads: int = 0, prp_only: bool = False, warps_per_queue: int = 0, rate_gbps: float = 0.0,
               chunk_bytes: int = 0) -> "GpuStore":
        """Give the store a data path for GPU memory (replacing any); returns self.

        ``device``: CUDA device (int or torch.device); default the current one.  Zero parameters take the
        C defaults.
        gio: an emulated NVMe controller over the store's own member files (``backing`` "file", the only
        one that keeps the store's format) with ``n_queues`` queue pairs of ``depth`` entries served by
        ``n_threads`` host threads, capped at ``rate_gbps`` (1e9 B/s, 0 = no cap); ``prp_only``: PRPs
        instead of SGLs; ``warps_per_queue``: submitting warps per queue.
        staged / gds: ``n_threads`` I/O threads, ``chunk_bytes`` staging chunk, ``depth`` chunks in flight
        per thread.
        """
        if path not in PATHS:
            raise ValueError(f"data path {path!r}: one of {', '.join(PATHS)}")
        if path == "host":
            if self._txns:
                raise RuntimeError(f"{len(self._txns)} transactions are open: finish them before changing the path")
            self._handle()
            self.detach()
            _check(lib().tt_store_set_devpath(self._h, ffi.addressof(lib(), "tt_devpath_host"), ffi.NULL),
                   "set data path host")
            self._path = ("host", None)
            return self
        if path == "gio":
            if backing != "file":
                raise ValueError(f"gio backing {backing!r}: only 'file' (the emulated controller serves the "
                                 "store's member files; put them on /dev/shm for a RAM-speed store)")
            if depth and depth < 64:
                raise ValueError(f"gio depth {depth}: at least 64 ring entries")
            if rate_gbps < 0:
                raise ValueError(f"rate_gbps {rate_gbps} < 0")
        elif backing != "file" or prp_only or warps_per_queue or rate_gbps:
            raise ValueError(f"backing, prp_only, warps_per_queue and rate_gbps are gio parameters, not {path}'s")
        if min(n_queues, depth, n_threads, chunk_bytes, warps_per_queue) < 0:
            raise ValueError("path parameters must be >= 0")
        torch = self._torch
        if torch is None or not torch.cuda.is_available():
            raise RuntimeError(f"data path {path}: no CUDA device (torch with CUDA is needed)")
        if self._txns:
            raise RuntimeError(f"{len(self._txns)} transactions are open: finish them before changing the path")
        self._handle()
        self.detach()
        dev = torch.cuda.current_device() if device is None else torch.device("cuda", device).index
        if dev is None:
            dev = torch.cuda.current_device()
        if not 0 <= dev < torch.cuda.device_count():
            raise ValueError(f"CUDA device {dev}: this process sees {torch.cuda.device_count()}")
        with torch.cuda.device(dev):
            torch.cuda.init()
            if path == "gio":
                p = ffi.new("struct tt_gio_path_params *")
                p.n_queues, p.depth, p.n_threads = n_queues, depth, n_threads
                p.prp_only, p.warps_per_queue, p.rate_gbps = int(prp_only), warps_per_queue, rate_gbps
                out = ffi.new("struct tt_gio_path **")
                _check(lib().tt_emu_check_hw_queues(), "data path gio")
                _check(lib().tt_gio_path_open_emu(self._h, p, out), "data path gio")
                self._path = ("gio", out[0])
            else:
                p = ffi.new("struct tt_file_path_params *")
                p.n_threads, p.chunk_bytes, p.depth, p.device = n_threads, chunk_bytes, depth, dev
                out = ffi.new("struct tt_file_path **")
                L = lib()
                if path == "staged":
                    _check(L.tt_file_path_open_staged(p, out), "data path staged")
                    ops = ffi.addressof(L, "tt_devpath_staged")
                else:
                    rc = L.tt_file_path_open_gds(p, out)
                    if rc == -errno.ENOSYS:
                        L.tt_clearerr()
                        raise GdsUnavailable(errno.ENOSYS, "data path gds: cuFile (libcufile.so.0) is missing or "
                                                           "incomplete here; use attach('staged')")
                    _check(rc, "data path gds (cuFile driver; attach('staged') needs none)", GdsUnavailable)
                    ops = ffi.addressof(L, "tt_devpath_gds")
                rc = L.tt_store_set_devpath(self._h, ops, out[0])
                if rc < 0:
                    L.tt_file_path_close(out[0])
                    _check(rc, f"set data path {path}")
                self._path = (path, out[0])
        self.device = dev
        return self

    def detach(self) -> None:
        """Remove the data path (no transaction may be open).  Idempotent."""
        if self._path is None:
            return
        if self._txns:
            raise RuntimeError(f"{len(self._txns)} transactions are open: finish them before detaching")
        name, h = self._path
        self._path = None
        L = lib()
        with self._on_device():
            if name == "gio":
                L.tt_gio_path_close(h)  # also removes it from the store
            elif name == "host":
                L.tt_store_set_devpath(self._h, ffi.NULL, ffi.NULL)
            else:
                L.tt_store_set_devpath(self._h, ffi.NULL, ffi.NULL)
                L.tt_file_path_close(h)
        self.device = None

    def emulator_stats(self) -> dict:
        """The gio path's emulated controller: commands, errors, bytes, ring wraps, doorbells."""
        if self.path != "gio":
            raise ValueError("no gio path attached")
        st = ffi.new("struct tt_emu_stats *")
        lib().tt_emu_get_stats(lib().tt_gio_path_emu(self._path[1]), st)
        return {k: int(getattr(st, k)) for k in ("cmds", "errors", "bytes", "sq_wraps", "cq_wraps", "doorbells")}

    # --- transactions into GPU memory

    def _begin(self, kv: DeviceKV, block_ids, n: int, write: bool):
        if self._path is None:
            raise RuntimeError("no data path attached: call attach('gio' | 'staged' | 'gds') first")
        if not isinstance(kv, DeviceKV):
            raise TypeError(f"kv must be a DeviceKV (DeviceKV.from_tensor(...)), not {type(kv).__name__}")
        kv.check_geometry(self.geometry)
        if kv.device != self.device:
            def name(d):
                return "host memory" if d is None else f"cuda:{d}"
            raise ValueError(f"memory is in {name(kv.device)}, the {self.path} path on {name(self.device)}")
        if self.path == "gio":
            why = kv.uniform_layers()
            if why:
                raise ValueError(f"the gio path needs per layer one base, block stride and span stride: {why}")
        ids = kv.block_ids(block_ids, unique=not write)
        if len(ids) != n:
            raise ValueError(f"{len(ids)} block ids for {n} blocks")
        return ids

    def _bind(self, out, n, write, kv, ids, what) -> DeviceTxn:
        t = DeviceTxn(self, out, n, write, kv, ids)
        with self._on_device():
            rc = lib().tt_txn_bind_device(out, t._ids)
        if rc < 0:
            lib().tt_txn_abort(out)
            _check(rc, f"{what}: bind to the {self.path} path")
        self._txns.add(t)
        return t

    def read(self, slots, kv: DeviceKV, block_ids) -> DeviceTxn:
        """Load committed ``slots`` (from lookup()) into GPU blocks ``block_ids`` of ``kv``; pinned until finish."""
        slots = _int_list(slots, "slots")
        ids = self._begin(kv, block_ids, len(slots), write=False)
        arr = ffi.new("int64_t[]", slots or [0])
        out = ffi.new("struct tt_txn **")
        _check(lib().tt_store_read_begin(self._handle(), arr, len(slots), out), f"read {len(slots)} blocks")
        return self._bind(out[0], len(slots), False, kv, ids, "read")

    def write(self, keys, kv: DeviceKV, block_ids) -> DeviceTxn:
        """Store GPU blocks ``block_ids`` of ``kv`` under ``keys``; ``present[i]``: already stored, skipped."""
        keys = list(keys)
        ids = self._begin(kv, block_ids, len(keys), write=True)
        arr, n = _keys(keys)
        out = ffi.new("struct tt_txn **")
        _check(lib().tt_store_write_begin(self._handle(), arr, n, out), f"write {n} blocks")
        return self._bind(out[0], n, True, kv, ids, "write")

    def _info(self):
        info = ffi.new("struct tt_store_info *")
        _check(lib().tt_store_get_info(self._handle(), info), "info")
        return info

    def stats(self) -> dict:
        """Counters since open: lookups, hits, blocks read/written, commits, evictions, corrupt blocks."""
        st = self._info().stats
        return {k: int(getattr(st, k)) for k in ("lookups", "hits", "blocks_read", "blocks_written", "commits",
                                                   "evictions", "corrupt_blocks")}

    def info(self) -> dict:
        i = self._info()
        return {"uuid": self.uuid, "paths": list(self.paths), "geometry": self.geometry.to_dict(),
                "fingerprint": self.fingerprint.to_dict(), "n_committed": int(i.n_committed), "n_free": int(i.n_free),
                "engine": self.engine, "path": self.path, "device": self.device, "stats": self.stats()}


__all__ = ["GpuStore", "DeviceKV", "DeviceTxn", "StoreError", "FingerprintMismatch", "CorruptBlockError",
           "StoreBusyError", "GdsUnavailable", "key_from_bytes", "PATHS"]
