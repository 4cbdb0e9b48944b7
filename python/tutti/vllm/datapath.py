"""How the worker moves KV blocks between its store and vLLM's cache: one interface, two data paths.

  host memory   KV cache on the CPU: tutti.Store (the CPU binding), its engine reads into the cache
  GPU memory    KV cache on a CUDA device: tutti.gpu.GpuStore with a data path into HBM
                ("staged": file -> pinned chunks -> HBM, the default; "gds": cuFile; "gio": GPU-built
                NVMe commands against an emulated controller over the members), every loaded object
                hashed on the GPU and checked against the store's checksums

Both bind the layout and the step's block ids into the transaction, so the worker calls
``layer(l)`` / ``wait_layer(l)`` / ``finish()`` alike.  What differs is ordering:

- ``loaded(txn, l)``: host memory waits on the CPU; GPU memory makes the current CUDA stream wait
  for the layer on the GPU (the model's launches keep going; a failed layer is reported by
  ``finish()`` and vLLM recomputes its blocks).
- ``mark()`` / ``ready(mark)``: a layer's KV is written by the model's kernels, which may not have
  run yet when vLLM hands the layer over.  GPU memory records an event then, and the layer's write
  goes out once the event has completed (``ready``, polled without blocking), at the latest at the
  step's end (``block=True``).  Host memory is always ready.
- The "host" data path of GpuStore runs the GPU-memory code on CPU tensors (the C reference path):
  CI uses it to run this worker path, including real vLLM on CPU, without a GPU.
"""
import errno
import os

from ..errors import DataPathError, StoreMismatchError, TuttiError

DATA_PATHS = ("auto", "cpu", "staged", "gds", "gio", "host")


class _Bound:
    """A transaction whose ``layer(l)`` passes the same extra arguments every time (the rest as is)."""

    def __init__(self, txn, *args, **kw):
        self._t, self._args, self._kw = txn, args, kw

    def __getattr__(self, name):
        return getattr(self._t, name)

    def __len__(self):
        return len(self._t)

    def layer(self, layer):
        return self._t.layer(layer, *self._args, **self._kw)


class HostIO:
    """KV cache in host memory, tutti.Store."""

    on_gpu = False

    def __init__(self, store, layout):
        from .layout import MemMap
        self.store = store
        self.mm = MemMap(layout)
        self.name = f"host memory, engine {store.engine}"

    def read(self, slots, ids):
        return _Bound(self.store.read(slots), self.mm.memmap, ids)

    def write(self, keys, ids):
        return _Bound(self.store.write(keys), self.mm.memmap, ids)

    def loaded(self, txn, layer):
        txn.wait_layer(layer)

    def mark(self):
        return None

    def ready(self, mark, block=False):
        return True

    def close(self):
        self.store.close()


class DeviceIO:
    """KV cache in GPU memory (or CPU tensors on the "host" path), tutti.gpu.GpuStore."""

    def __init__(self, store, layout, path):
        import torch

        from ..gpu.store import DeviceKV
        self.store, self.path, self._torch = store, path, torch
        self.on_gpu = path != "host"
        bases, strides = layout.object_map()
        dev = torch.device(layout.device)
        self.kv = DeviceKV(bases, strides, n_layers=layout.n_layers, n_spans=layout.n_spans,
                           num_blocks=layout.num_blocks, obj_bytes=layout.span_bytes,
                           device=(dev.index or 0) if dev.type == "cuda" else None,
                           keep=layout.owners)
        self.name = f"{layout.device}, data path {path}"

    def read(self, slots, ids):
        # The transaction's first layer synchronises the current stream once: the blocks'
        # memory is then free of the model's earlier work.
        return self.store.read(slots, self.kv, ids)

    def write(self, keys, ids):
        # ready=None: the worker submits a layer only once its mark (the model's kernels) completed.
        return _Bound(self.store.write(keys, self.kv, ids), ready=None)

    def loaded(self, txn, layer):
        if self.on_gpu:
            txn.order(layer)  # the current stream waits on the GPU; no host wait
        else:
            txn.wait_layer(layer)

    def mark(self):
        if not self.on_gpu:
            return None
        ev = self._torch.cuda.Event()
        ev.record()
        return ev

    def ready(self, mark, block=False):
        if mark is None or mark.query():
            return True
        if block:
            mark.synchronize()
            return True
        return False

    def close(self):
        self.store.close()


def choose(cfg, layout) -> str:
    """The data path for a KV cache on ``layout.device``: cfg.data_path, or what auto picks."""
    on_cuda = layout.device.startswith("cuda")
    want = cfg.data_path
    if want == "auto":
        return "staged" if on_cuda else "cpu"
    if on_cuda and want in ("cpu", "host"):
        raise DataPathError(f"tutti: data_path {want!r} moves blocks through host memory, but the KV "
                            f"cache is on {layout.device}: use 'auto', 'staged', 'gds' or 'gio'")
    if not on_cuda and want in ("staged", "gds", "gio"):
        raise DataPathError(f"tutti: data_path {want!r} moves blocks into GPU memory, but the KV "
                            f"cache is on {layout.device}: use 'auto', 'cpu' or 'host'")
    return want


def _mismatch(paths, fp, have):
    return StoreMismatchError(
        f"tutti: store {paths} was made for another model or KV layout and is refused "
        f"(never serving another model's KV).\n  store holds: {have}\n  this server:  {fp}\n"
        "Use another 'path' in kv_connector_extra_config, or reformat it with "
        "`tutti-admin format --force`.")


def _held_fingerprint(paths):
    from ..store import Store
    try:
        with Store.open(paths, readonly=True, shared=True, engine="psync") as other:
            return other.fingerprint
    except Exception:  # noqa: BLE001 - only a hint for the refusal message: any failure means unreadable
        return "unreadable"


def _create_if_missing(cfg, paths, fp, layout, log):
    from ..store import Store
    missing = [p for p in paths if not os.path.exists(p)]
    if not missing:
        return
    if not cfg.create:
        raise FileNotFoundError(f"tutti: store member(s) {missing} do not exist and 'create' is false")
    for p in paths:
        os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    try:
        Store.format(paths, fp, capacity_bytes=cfg.capacity, n_spans=layout.n_spans,
                     span_bytes=layout.span_bytes, preallocate=cfg.preallocate)
    except TuttiError as e:
        if e.errno in (errno.ENOSPC, errno.EOPNOTSUPP) and cfg.preallocate:
            raise TuttiError(e.errno, f"tutti: cannot create the store: {e.strerror} (the 'capacity' "
                             "key, or \"preallocate\": false)") from None
        raise
    log.info("tutti: created store %s (%d bytes of KV, %d x %d spans of %d bytes per block, %s)",
             paths, cfg.capacity, layout.n_layers, layout.n_spans, layout.span_bytes,
             "space reserved" if cfg.preallocate else "sparse")


def _check_geometry(store, paths, layout):
    g = store.geometry
    if (g.n_layers, g.n_spans, g.span_bytes) != (layout.n_layers, layout.n_spans, layout.span_bytes):
        store.close()
        raise StoreMismatchError(
            f"tutti: store {paths} holds blocks of {g.n_layers} layers x {g.n_spans} spans x "
            f"{g.span_bytes} bytes, but this server's KV cache has {layout.n_layers} x "
            f"{layout.n_spans} x {layout.span_bytes}: refused")


def open_io(cfg, shape, rank, layout, log):
    """This rank's store (created if allowed; another model's is refused) behind its data path."""
    path = choose(cfg, layout)
    paths = cfg.member_paths(shape.model_id, rank, shape.tp_size)
    fp = shape.fingerprint(rank)
    _create_if_missing(cfg, paths, fp, layout, log)
    from ..errors import FingerprintMismatch  # raised by both bindings
    if path == "cpu":
        from ..store import Store
        try:
            store = Store.open(paths, expect=fp, engine=cfg.engine, verify=cfg.verify, cpu_threads=cfg.cpu_threads)
        except FingerprintMismatch as e:
            raise _mismatch(paths, fp, _held_fingerprint(paths)) from e
        _check_geometry(store, paths, layout)
        return HostIO(store, layout)

    try:
        import torch  # first: libtutti_gpu.so then shares PyTorch's CUDA runtime

        from ..gpu._ffi import lib
        from ..gpu.store import GpuStore
        lib()  # importing does not load libtutti_gpu.so: fail here, with how to get it
    except ImportError as e:
        raise DataPathError(f"tutti: data path {path!r} needs libtutti_gpu.so: build it with "
                            f"`make gpu-lib` (nvcc) and point TUTTI_GPU_LIB at it ({e})") from e
    try:
        store = GpuStore.open(paths, expect=fp, engine=cfg.engine, verify=cfg.verify,
                                 cpu_threads=cfg.cpu_threads)
    except FingerprintMismatch as e:
        raise _mismatch(paths, fp, _held_fingerprint(paths)) from e
    _check_geometry(store, paths, layout)
    try:
        if path == "host":
            store.attach("host")
        else:
            store.attach(path, device=torch.device(layout.device).index)
        return DeviceIO(store, layout, path)
    except BaseException:
        store.close()
        raise
