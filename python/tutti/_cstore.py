"""What the two cffi bindings of libtutti's store share.

``tutti.store`` binds the library compiled into the ``tutti._tutti`` extension
(API mode); ``tutti.gpu.store`` dlopens libtutti_gpu.so (ABI mode) on machines
with a GPU. Both speak the same C structs, so converting keys, member paths,
fingerprints and geometries is the same code, handed each binding's ``ffi``
and ``lib``. Nothing here imports a binding.
"""
import errno
import os

from .model import Fingerprint, Geometry


def key_source(ffi, key):
    """``key`` (str as UTF-8, or bytes-like) as a C buffer; TypeError otherwise."""
    if isinstance(key, str):
        key = key.encode()
    try:
        return ffi.from_buffer(key)
    except TypeError:
        raise TypeError(f"key must be str or bytes-like, not {type(key).__name__}") from None


def key_from_bytes(ffi, lib, key_bytes: int, key) -> bytes:
    """The ``key_bytes``-byte store key of ``key`` (the library's hash: every key is hashed)."""
    data = key_source(ffi, key)
    out = ffi.new("uint8_t[]", key_bytes)
    lib.tt_key_from_bytes(data, len(data), out)
    return bytes(ffi.buffer(out))


def keys_array(ffi, lib, key_bytes: int, keys):
    """Hash ``keys`` into one C array of back-to-back keys: (array, count)."""
    keys = list(keys)
    arr = ffi.new("uint8_t[]", max(len(keys), 1) * key_bytes)
    for i, key in enumerate(keys):
        data = key_source(ffi, key)
        lib.tt_key_from_bytes(data, len(data), arr + i * key_bytes)
    return arr, len(keys)


def member_paths(ffi, paths):
    """Member paths as str (a single path is a one-member store) and as a C array.

    The C array borrows the strings in the returned keep-alive list.
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    paths = [os.fsdecode(p) for p in paths]
    if not paths:
        raise ValueError("a store needs at least one member path")
    keep = [ffi.new("char[]", os.fsencode(p)) for p in paths]
    return paths, ffi.new("const char *[]", keep), keep


def fp_to_c(fp: Fingerprint, out, model_id_len: int, dtype_len: int) -> None:
    """Fill struct tt_fingerprint ``out`` from ``fp``; ValueError if a value does not fit its C field."""
    try:
        model_id, dtype = fp.model_id.encode(), fp.dtype.encode()
    except UnicodeEncodeError:
        raise ValueError(f"model_id and dtype must be UTF-8 text: {fp.model_id!r}, {fp.dtype!r}") from None
    if len(model_id) >= model_id_len:
        raise ValueError(f"model_id longer than {model_id_len - 1} bytes: {fp.model_id[:40]!r}...")
    if len(dtype) >= dtype_len:
        raise ValueError(f"dtype longer than {dtype_len - 1} bytes: {fp.dtype[:40]!r}")
    out.model_id = model_id
    out.dtype = dtype
    for name in ("n_layers", "kv_heads", "head_dim", "block_size", "tp_rank", "tp_size"):
        value = getattr(fp, name)
        try:
            setattr(out, name, value)
        except (OverflowError, TypeError):
            raise ValueError(f"fingerprint {name} {value!r} does not fit libtutti's field") from None


def fp_from_c(ffi, c) -> Fingerprint:
    return Fingerprint(model_id=ffi.string(c.model_id).decode(errors="replace"),
                       dtype=ffi.string(c.dtype).decode(errors="replace"),
                       n_layers=c.n_layers, kv_heads=c.kv_heads, head_dim=c.head_dim,
                       block_size=c.block_size, tp_rank=c.tp_rank, tp_size=c.tp_size)


def geometry_from_c(g) -> Geometry:
    return Geometry(n_layers=g.n_layers, n_spans=g.n_spans, span_bytes=g.span_bytes,
                    obj_stride=g.obj_stride, n_members=g.n_members, stripe_objs=g.stripe_objs,
                    n_slots=g.n_slots, data_off=g.data_off)


def int_list(xs, what: str) -> list:
    """``xs`` (any iterable, a torch tensor, a numpy array) as a list of ints; TypeError names a miss."""
    if hasattr(xs, "tolist"):
        xs = xs.tolist()
    xs = list(xs)
    for x in xs:
        if not isinstance(x, int) or isinstance(x, bool):
            raise TypeError(f"{what} must be ints, got {type(x).__name__} ({x!r}; a lookup miss?)")
    return xs


class BlockMethods:
    """Whole blocks through host memory and the key index: the same C calls in both bindings.

    The store class provides ``_ffi``, ``_clib()`` (the loaded library), ``_key_bytes``,
    ``_handle()``, ``geometry`` and ``_ok(rc, what)`` (rc, or raise tutti.errors' class).
    """

    @property
    def block_bytes(self) -> int:
        return self.geometry.block_bytes

    def _block_buffer(self, data, writable=False):
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
        return key_from_bytes(self._ffi, self._clib(), self._key_bytes, key)

    def put(self, key, data) -> None:
        """Store one block held in host memory, objects in (layer, span) order (the store's CPU engine);
        a stored key is left as is."""
        buf = self._block_buffer(data)
        self._ok(self._clib().tt_store_put(self._handle(), self._key(key), buf, len(buf)), "put")

    def readinto(self, key, buf) -> None:
        """Load the block of ``key`` into writable ``buf``: KeyError on a miss,
        CorruptBlockError (and the slot is dropped) if it fails its checksum."""
        cbuf = self._block_buffer(buf, writable=True)
        L = self._clib()
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

    def lookup(self, keys) -> list:
        """Slot of each key, or None for a miss; hits become most recently used."""
        arr, n = keys_array(self._ffi, self._clib(), self._key_bytes, keys)
        slots = self._ffi.new("int64_t[]", max(n, 1))
        self._ok(self._clib().tt_store_lookup(self._handle(), arr, n, slots), "lookup")
        return [int(s) if s >= 0 else None for s in slots[0:n]]

    def __contains__(self, key) -> bool:
        return self.lookup([key])[0] is not None

    def invalidate(self, slots) -> int:
        """Drop committed slots durably; returns how many were dropped."""
        slots = int_list(slots, "slots")
        arr = self._ffi.new("int64_t[]", slots or [0])
        return self._ok(self._clib().tt_store_invalidate(self._handle(), arr, len(slots)), "invalidate")

    def locate(self, slot: int, layer: int, span: int) -> tuple:
        """``(member, byte offset)`` of object (slot, layer, span) on disk (tt_store_locate())."""
        g = self.geometry
        if not (0 <= slot < g.n_slots and 0 <= layer < g.n_layers and 0 <= span < g.n_spans):
            raise IndexError(f"object ({slot}, {layer}, {span}) outside {g.n_slots} slots x "
                             f"{g.n_layers} layers x {g.n_spans} spans")
        e = self._ffi.new("struct tt_extent *")
        self._ok(self._clib().tt_store_locate(self._handle(), slot, layer, span, e), "locate")
        return int(e.member), int(e.off)

    def committed(self, chunk: int = 4096) -> dict:
        """Every committed block: {16-byte store key: slot}, from the in-memory index (no I/O)."""
        K, ffi = self._key_bytes, self._ffi
        keys = ffi.new("uint8_t[]", chunk * K)
        slots = ffi.new("int64_t[]", chunk)
        out = {}
        for first in range(0, self.geometry.n_slots, chunk):
            # A range of `chunk` slots holds at most `chunk` committed ones.
            found = self._ok(self._clib().tt_store_list(self._handle(), first, chunk, keys, slots, chunk),
                             "list")
            raw = ffi.buffer(keys, found * K)[:]
            for i in range(found):
                out[raw[i * K:(i + 1) * K]] = int(slots[i])
        return out
