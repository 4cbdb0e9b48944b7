"""What the two cffi bindings of libtutti's store share.

``tutti.store`` binds the library compiled into the ``tutti._tutti`` extension
(API mode); ``tutti.gpu.store`` dlopens libtutti_gpu.so (ABI mode) on machines
with a GPU. Both speak the same C structs, so converting keys, member paths,
fingerprints and geometries is the same code, handed each binding's ``ffi``
and ``lib``. Nothing here imports a binding.
"""
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
    """Fill struct tt_fingerprint ``out`` from ``fp``; ValueError if a string does not fit."""
    model_id, dtype = fp.model_id.encode(), fp.dtype.encode()
    if len(model_id) >= model_id_len:
        raise ValueError(f"model_id longer than {model_id_len - 1} bytes: {fp.model_id!r}")
    if len(dtype) >= dtype_len:
        raise ValueError(f"dtype longer than {dtype_len - 1} bytes: {fp.dtype!r}")
    out.model_id = model_id
    out.dtype = dtype
    for name in ("n_layers", "kv_heads", "head_dim", "block_size", "tp_rank", "tp_size"):
        setattr(out, name, getattr(fp, name))


def fp_from_c(ffi, c) -> Fingerprint:
    return Fingerprint(model_id=ffi.string(c.model_id).decode(errors="replace"),
                       dtype=ffi.string(c.dtype).decode(errors="replace"),
                       n_layers=c.n_layers, kv_heads=c.kv_heads, head_dim=c.head_dim,
                       block_size=c.block_size, tp_rank=c.tp_rank, tp_size=c.tp_size)


def geometry_from_c(g) -> Geometry:
    return Geometry(n_layers=g.n_layers, n_spans=g.n_spans, span_bytes=g.span_bytes,
                    obj_stride=g.obj_stride, n_members=g.n_members, stripe_objs=g.stripe_objs,
                    n_slots=g.n_slots, data_off=g.data_off)
