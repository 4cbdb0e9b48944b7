"""A Store's data paths into device memory (devpath.h): attach, DeviceKV, DeviceTxn.

A data path moves a transaction's objects between the members and (GPU) memory itself and hashes them where
they land, so every load is verified against the store's checksums without KV bytes passing through the CPU:

  gio      GPU threads build NVMe commands for an emulated controller serving the store's member files
           (tt_gio_path_open_emu)
  staged   file -> pinned host chunks -> HBM (tt_file_path_open_staged), needs no emulator
  gds      cuFile (tt_file_path_open_gds); GdsUnavailable where cuFile cannot run
  host     the C reference path over host memory (tt_devpath_host): the same transactions on CPU tensors,
           for tests on machines without a GPU

gio, staged and gds are in libtutti_gpu.so only (a store opened through tutti.gpu.GpuStore); "host" is in
both libraries.  Everything is per process and per CUDA device: the path is opened on the device current at
attach() (or ``device=``), and every later call runs with that device current.
"""
from __future__ import annotations

import contextlib
import errno
import os

from ._cconv import _keys_array, int_list
from ._txn import _Txn, _WriteOps
from .errors import GdsUnavailable, TuttiError
from .model import Geometry

PATHS = ("gio", "staged", "gds", "host")
GPU_PATHS = ("gio", "staged", "gds")
# What the emulated controller reads from the environment when it opens, and the values it takes
# (emu_ctrl.h): any other value makes it refuse to open, so that a typo never measures the wrong path.
EMU_ENV = {"TUTTI_EMU_DMA": ("kernel", "copy"), "TUTTI_EMU_COPY": ("batch", "each", "sync"),
           "TUTTI_EMU_FILE_MAP": ("0", "1")}


def emu_env_problem(environ=None) -> str | None:
    """Why the emulated controller would refuse to open with this environment, or None."""
    env = os.environ if environ is None else environ
    for name, values in EMU_ENV.items():
        v = env.get(name)
        if v is not None and v not in values:
            return f"{name}={v!r}: one of {', '.join(values)}, or unset"
    return None


def _memmap(ffi, n_layers, n_spans, bases, strides):
    """A ``struct tt_memmap`` of ``ffi`` and the arrays it points into (keep both alive together)."""
    base = ffi.new("uint64_t[]", list(bases))
    stride = ffi.new("uint64_t[]", list(strides))
    m = ffi.new("struct tt_memmap *")
    m.n_layers, m.n_spans = n_layers, n_spans
    m.base, m.stride = base, stride
    return m, (base, stride)


def stream_ptr_of(ffi, stream):
    """``cudaStream_t`` of ``ffi`` (a binding) for None (legacy default stream), an int handle, or a torch
    stream (``.cuda_stream``)."""
    if stream is None:
        return ffi.NULL
    handle = getattr(stream, "cuda_stream", stream)
    if not isinstance(handle, int):
        raise TypeError(f"not a CUDA stream: {stream!r}")
    return ffi.cast("void *", handle)


# ---------------------------------------------------------------- device memory


class DeviceKV:
    """Where KV blocks live in GPU memory: per (layer, span) a base address and a block stride (tt_memmap).

    Object (block b, layer l, span k) is at ``base[l * n_spans + k] + b * stride[l * n_spans + k]``; each
    object must be contiguous.  Build it from torch CUDA tensors with ``from_tensor``; it keeps them
    alive.  ``num_blocks`` bounds the block ids a transaction may use.
    """

    def __init__(self, bases, strides, *, n_layers: int, n_spans: int, num_blocks: int, obj_bytes: int,
                 device: int | None, keep=()):
        if len(bases) != n_layers * n_spans or len(strides) != len(bases):
            raise ValueError(f"{len(bases)} bases / {len(strides)} strides for {n_layers} x {n_spans} objects")
        self.n_layers, self.n_spans, self.num_blocks, self.obj_bytes = n_layers, n_spans, num_blocks, obj_bytes
        self.device = device
        self.bases, self.strides = list(bases), list(strides)
        self._keep = keep
        self._maps: dict = {}  # id(ffi) -> (ffi, memmap, arrays): one per binding that moved this memory

    def memmap_for(self, ffi):
        """This memory as a ``struct tt_memmap *`` of ``ffi`` (the store's binding)."""
        got = self._maps.get(id(ffi))
        if got is None:
            m, arrays = _memmap(ffi, self.n_layers, self.n_spans, self.bases, self.strides)
            got = self._maps[id(ffi)] = (ffi, m, arrays)
        return got[1]

    @property
    def memmap(self):
        """The ``struct tt_memmap *`` of libtutti_gpu.so's binding."""
        from .gpu._ffi import ffi

        return self.memmap_for(ffi)

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
        """None if every layer is one base + one block stride + one span stride (what the gio path needs),
        else why not."""
        S = self.n_spans
        for l in range(self.n_layers):
            b, s = self.bases[l * S:(l + 1) * S], self.strides[l * S:(l + 1) * S]
            ss = b[1] - b[0] if S > 1 else 0
            if any(x != s[0] for x in s) or any(b[k] != b[0] + k * ss for k in range(S)):
                return f"layer {l}: its spans do not share one block stride and one span stride"
        return None

    def block_ids(self, block_ids, *, unique: bool) -> list:
        ids = int_list(block_ids, "block ids")
        bad = [b for b in ids if not 0 <= b < self.num_blocks]
        if bad:
            raise IndexError(f"block ids {bad[:8]} outside the memory's {self.num_blocks} blocks")
        if unique and len(set(ids)) != len(ids):
            raise ValueError("a read names one memory block twice")
        return ids


# ---------------------------------------------------------------- transactions


class DeviceTxn(_WriteOps, _Txn):
    """A layer-wise transfer between the store and GPU memory, bound to the store's data path.

    Per layer: ``layer(l)`` submits it (asynchronous), ``order(l, stream)`` makes a CUDA stream wait for
    it on the GPU, ``wait_layer(l)`` waits on the host.  ``finish()`` returns per-block status: 0, or for
    reads -EBADMSG (checksum mismatch: the slot was dropped, discard what was computed from the block)
    or -EIO; for writes -EIO / -ENODATA (a layer never submitted) / -ECANCELED (vetoed).  As a context
    manager it finishes on a clean exit and aborts on an exception.  prepare() and veto(): writes.
    """

    def __init__(self, store, handle, n: int, write: bool, kv: DeviceKV, ids: list):
        super().__init__(store, handle, n)
        self.write, self.kv = write, kv
        self._ids = store._owned.binding.ffi.new("uint32_t[]", ids or [0])
        self._keep.append((kv, self._ids))  # alive until the C transaction ends, even if this object does not
        self.block_ids = ids
        self.submitted: set[int] = set()

    def layer(self, layer: int, *, ready="current") -> None:
        """Submit ``layer`` of every block.

        The path's streams do not wait for the caller's.  Writes: the memory must hold its final bytes
        now, so ``ready`` is honoured before every layer.  Reads: the blocks' memory must be free of the
        caller's queued work (an attention still reading the old contents), so ``ready`` is honoured once,
        before the transaction's first layer; later layers only queue (the overlap with compute).
        ``ready``: "current" (default) synchronises the device's current torch stream; a torch Event or
        Stream is synchronised; None: the caller vouches.
        """
        self._handle()
        if not 0 <= layer < self.kv.n_layers:
            raise IndexError(f"layer {layer} outside the store's {self.kv.n_layers} layers")
        if layer in self.submitted:
            raise ValueError(f"layer {layer} already submitted")
        store = self._store
        with store._on_device():
            first = not self.submitted
            if (self.write or first) and ready is not None and store.device is not None:
                if ready == "current":
                    store._owned.path.torch.cuda.current_stream().synchronize()
                else:
                    ready.synchronize()
            self.submitted.add(layer)
            ffi = store._owned.binding.ffi
            self._call("tt_txn_layer", layer, self.kv.memmap_for(ffi), ffi.NULL, what=f"layer {layer}")

    def order(self, layer: int, stream=None) -> None:
        """Make ``stream`` (torch stream or cudaStream_t int; default: the current torch stream) wait on the
        GPU until ``layer`` has landed and been hashed.  Corruption is still judged at finish()."""
        self._handle()
        store = self._store
        with store._on_device():
            if stream is None:
                path = store._owned.path
                if path is None or path.torch is None:
                    raise RuntimeError("no CUDA stream to order: pass one (the host path has none)")
                stream = path.torch.cuda.current_stream()
            ffi = store._owned.binding.ffi
            self._call("tt_txn_layer_order", layer, stream_ptr_of(ffi, stream), what=f"order layer {layer}")

    def transfer(self, *, ready="current") -> list:
        """Every layer not yet submitted, then wait for all and finish(): the per-block status."""
        for l in range(self.kv.n_layers):
            if l not in self.submitted:
                self.layer(l, ready=ready)
                ready = None  # one synchronisation covers the rest
        for l in sorted(self.submitted):
            try:
                self.wait_layer(l)
            except TuttiError:
                pass  # the failed blocks show in finish()'s status
        return self.finish()


def begin(store, keys_or_slots, kv: DeviceKV, block_ids, *, write: bool) -> DeviceTxn:
    """Store.read()/write() into device memory: checks, begin, bind to the data path."""
    owned = store._owned
    if owned.path is None:
        raise RuntimeError("no data path attached: call attach('gio' | 'staged' | 'gds') first")
    if not isinstance(kv, DeviceKV):
        raise TypeError(f"kv must be a DeviceKV (DeviceKV.from_tensor(...)), not {type(kv).__name__}")
    kv.check_geometry(store.geometry)
    if kv.device != store.device:
        def name(d):
            return "host memory" if d is None else f"cuda:{d}"
        raise ValueError(f"memory is in {name(kv.device)}, the {store.path} path on {name(store.device)}")
    if store.path == "gio":
        why = kv.uniform_layers()
        if why:
            raise ValueError(f"the gio path needs per layer one base, block stride and span stride: {why}")
    b = owned.binding
    ffi, lib = b.ffi, b.lib
    out = ffi.new("struct tt_txn **")
    if write:
        keys = list(keys_or_slots)
        ids = kv.block_ids(block_ids, unique=False)
        if len(ids) != len(keys):
            raise ValueError(f"{len(ids)} block ids for {len(keys)} blocks")
        arr, n = _keys_array(b, keys)
        b.check(lib.tt_store_write_begin(store._handle(), arr, n, out), f"write {n} blocks")
    else:
        slots = int_list(keys_or_slots, "slots")
        ids = kv.block_ids(block_ids, unique=True)
        if len(ids) != len(slots):
            raise ValueError(f"{len(ids)} block ids for {len(slots)} blocks")
        n = len(slots)
        arr = ffi.new("int64_t[]", slots or [0])
        b.check(lib.tt_store_read_begin(store._handle(), arr, n, out), f"read {n} blocks")
    t = DeviceTxn(store, out[0], n, write, kv, ids)
    with owned.on_device():
        rc = lib.tt_txn_bind_device(out[0], t._ids)
    if rc < 0:
        t.abort()
        b.check(rc, f"{'write' if write else 'read'}: bind to the {store.path} path")
    return t


# ---------------------------------------------------------------- attaching a path


class Attached:
    """The store's attached data path: its name, CUDA device, C context and how it is removed."""

    def __init__(self, name: str, device, torch, ctx, remove):
        self.name, self.device, self.torch, self.ctx = name, device, torch, ctx
        self._remove = remove  # (owned) -> None, with the device current

    def on_device(self):
        if self.device is None or self.torch is None:
            return contextlib.nullcontext()
        return self.torch.cuda.device(self.device)

    def close(self, owned) -> None:
        with self.on_device():
            self._remove(owned)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _check_params(path, backing, n_queues, depth, n_threads, prp_only, warps_per_queue, rate_gbps, chunk_bytes):
    if path not in PATHS:
        raise ValueError(f"data path {path!r}: one of {', '.join(PATHS)}")
    if path == "gio":
        if backing != "file":
            raise ValueError(f"gio backing {backing!r}: only 'file' (the emulated controller serves the "
                             "store's member files; put them on /dev/shm for a RAM-speed store)")
        if depth and depth < 64:
            raise ValueError(f"gio depth {depth}: at least 64 ring entries")
        if rate_gbps < 0:
            raise ValueError(f"rate_gbps {rate_gbps} < 0")
        why = emu_env_problem()
        if why:
            raise ValueError(f"data path gio: {why}")
    elif path != "host" and (backing != "file" or prp_only or warps_per_queue or rate_gbps):
        raise ValueError(f"backing, prp_only, warps_per_queue and rate_gbps are gio parameters, not {path}'s")
    if min(n_queues, depth, n_threads, chunk_bytes, warps_per_queue) < 0:
        raise ValueError("path parameters must be >= 0")


def _unset(owned) -> None:
    owned.binding.lib.tt_store_set_devpath(owned.h, owned.binding.ffi.NULL, owned.binding.ffi.NULL)


def _attach_host(store) -> Attached:
    owned = store._owned
    b = owned.binding
    b.check(b.lib.tt_store_set_devpath(owned.h, b.ffi.addressof(b.lib, "tt_devpath_host"), b.ffi.NULL),
            "set data path host")
    return Attached("host", None, None, None, _unset)


def _attach_gio(store, torch, dev, n_queues, depth, n_threads, prp_only, warps_per_queue, rate_gbps):
    owned = store._owned
    b = owned.binding
    p = b.ffi.new("struct tt_gio_path_params *")
    p.n_queues, p.depth, p.n_threads = n_queues, depth, n_threads
    p.prp_only, p.warps_per_queue, p.rate_gbps = int(prp_only), warps_per_queue, rate_gbps
    out = b.ffi.new("struct tt_gio_path **")
    b.check(b.lib.tt_gio_path_open_emu(owned.h, p, out), "data path gio")
    gp = out[0]
    return Attached("gio", dev, torch, gp, lambda o: o.binding.lib.tt_gio_path_close(gp))  # removes it first


def _attach_file(store, path, torch, dev, n_threads, depth, chunk_bytes):
    owned = store._owned
    b = owned.binding
    ffi, L = b.ffi, b.lib
    p = ffi.new("struct tt_file_path_params *")
    p.n_threads, p.chunk_bytes, p.depth, p.device = n_threads, chunk_bytes, depth, dev
    out = ffi.new("struct tt_file_path **")
    if path == "staged":
        b.check(L.tt_file_path_open_staged(p, out), "data path staged")
    else:
        from .libfile import library_problem

        env = os.environ.get("TUTTI_CUFILE")
        if env and library_problem(env):  # libtutti would dlopen it: a FIFO blocks that for good
            raise GdsUnavailable(errno.ENOENT, f"data path gds: TUTTI_CUFILE: {library_problem(env)}")
        rc = L.tt_file_path_open_gds(p, out)
        if rc == -errno.ENOSYS:
            L.tt_clearerr()
            raise GdsUnavailable(errno.ENOSYS, "data path gds: cuFile (libcufile.so.0) is missing or "
                                               "incomplete here; use attach('staged')")
        b.check(rc, "data path gds (cuFile driver; attach('staged') needs none)", GdsUnavailable)
    fp = out[0]
    rc = L.tt_store_set_devpath(owned.h, ffi.addressof(L, f"tt_devpath_{path}"), fp)
    if rc < 0:
        L.tt_file_path_close(fp)
        b.check(rc, f"set data path {path}")
    if path == "staged":
        # Map and pin the RAM-backed members now: the first read would otherwise pay it, a cost that grows
        # with the store's size, not the transfer's.  A member that cannot be mapped is read with pread
        # (the path's stats say why); nothing here can fail the attach.
        L.tt_file_path_map_store(fp, owned.h)
        L.tt_clearerr()

    def remove(o):
        _unset(o)
        o.binding.lib.tt_file_path_close(fp)
    return Attached(path, dev, torch, fp, remove)


def attach(store, path: str = "gio", *, device=None, backing: str = "file", n_queues: int = 0, depth: int = 0,
           n_threads: int = 0, prp_only: bool = False, warps_per_queue: int = 0, rate_gbps: float = 0.0,
           chunk_bytes: int = 0) -> None:
    """Give ``store`` a data path for device memory (replacing any).

    ``device``: CUDA device (int or torch.device); default the current one.  Zero parameters take the
    C defaults.
    gio: an emulated NVMe controller over the store's own member files (``backing`` "file", the only
    one that keeps the store's format) with ``n_queues`` queue pairs of ``depth`` entries served by
    ``n_threads`` host threads, capped at ``rate_gbps`` (1e9 B/s, 0 = no cap); ``prp_only``: PRPs
    instead of SGLs; ``warps_per_queue``: submitting warps per queue.
    staged / gds: ``n_threads`` I/O threads (default one per CPU, at most 16; a staged transfer whose
    members are all mapped, RAM-backed, uses 2 of them unless ``n_threads`` is given), ``chunk_bytes``
    staging chunk, ``depth`` chunks in flight per thread.
    host: no parameters (the C reference path over host memory).
    """
    _check_params(path, backing, n_queues, depth, n_threads, prp_only, warps_per_queue, rate_gbps, chunk_bytes)
    owned = store._owned
    if path in GPU_PATHS:
        if not owned.binding.gpu_paths:
            raise RuntimeError(f"data path {path}: only libtutti_gpu.so has it; open the store with "
                               "tutti.gpu.GpuStore")
        torch = _torch()
        if torch is None or not torch.cuda.is_available():
            raise RuntimeError(f"data path {path}: no CUDA device (torch with CUDA is needed)")
    if owned.txns:
        raise RuntimeError(f"{len(owned.txns)} transactions are open: finish them before changing the path")
    store._handle()
    detach(store)
    if path == "host":
        owned.path = _attach_host(store)
        return
    dev = torch.cuda.current_device() if device is None else torch.device("cuda", device).index
    if dev is None:
        dev = torch.cuda.current_device()
    if not 0 <= dev < torch.cuda.device_count():
        raise ValueError(f"CUDA device {dev}: this process sees {torch.cuda.device_count()}")
    with torch.cuda.device(dev):
        torch.cuda.init()
        if path == "gio":
            owned.path = _attach_gio(store, torch, dev, n_queues, depth, n_threads, prp_only, warps_per_queue,
                                     rate_gbps)
        else:
            owned.path = _attach_file(store, path, torch, dev, n_threads, depth, chunk_bytes)


def detach(store) -> None:
    """Remove ``store``'s data path (no transaction may be open).  Idempotent."""
    owned = store._owned
    if owned.path is None:
        return
    if owned.txns:
        raise RuntimeError(f"{len(owned.txns)} transactions are open: finish them before detaching")
    store._handle()
    path, owned.path = owned.path, None
    path.close(owned)


def emulator_stats(store) -> dict:
    """The gio path's emulated controller: commands, errors, bytes, ring wraps, doorbells."""
    owned = store._owned
    if owned.path is None or owned.path.name != "gio":
        raise ValueError("no gio path attached")
    store._handle()
    b = owned.binding
    st = b.ffi.new("struct tt_emu_stats *")
    b.lib.tt_emu_get_stats(b.lib.tt_gio_path_emu(owned.path.ctx), st)
    return {k: int(getattr(st, k)) for k in ("cmds", "errors", "bytes", "sq_wraps", "cq_wraps", "doorbells")}
