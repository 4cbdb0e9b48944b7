"""Python values to and from libtutti's C structs, for both bindings (the extension and libtutti_gpu.so): keys,
member paths, fingerprints, geometry, feature masks, the bytes-written counter, statistics, format plans."""
from __future__ import annotations

import os

from .model import Fingerprint, Geometry


def _key_source(ffi, key):
    """``key`` (str as UTF-8, or bytes-like) as a C buffer; TypeError otherwise."""
    if isinstance(key, str):
        key = key.encode()
    try:
        return ffi.from_buffer(key)
    except TypeError:
        raise TypeError(f"key must be str or bytes-like, not {type(key).__name__}") from None


def key_from_bytes(binding, key) -> bytes:
    """The 16-byte store key of ``key`` through ``binding``'s library (every key is hashed, a 16-byte one too,
    so one name always maps to one key)."""
    ffi, lib = binding.ffi, binding.lib
    data = _key_source(ffi, key)
    out = ffi.new("uint8_t[]", lib.TT_KEY_BYTES)
    lib.tt_key_from_bytes(data, len(data), out)
    return bytes(ffi.buffer(out))


def _keys_array(binding, keys):
    """Hash ``keys`` into one C array of back-to-back keys: (array, count)."""
    ffi, lib = binding.ffi, binding.lib
    K = lib.TT_KEY_BYTES
    keys = list(keys)
    arr = ffi.new("uint8_t[]", max(len(keys), 1) * K)
    for i, key in enumerate(keys):
        data = _key_source(ffi, key)
        lib.tt_key_from_bytes(data, len(data), arr + i * K)
    return arr, len(keys)


def _member_paths(ffi, paths):
    """Member paths as str (a single path is a one-member store), as a C array, and the strings it borrows."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    paths = [os.fsdecode(p) for p in paths]
    if not paths:
        raise ValueError("a store needs at least one member path")
    keep = [ffi.new("char[]", os.fsencode(p)) for p in paths]
    return paths, ffi.new("const char *[]", keep), keep


def _fp_to_c(lib, fp: Fingerprint, out) -> None:
    """Fill struct tt_fingerprint ``out`` from ``fp``; ValueError if a value does not fit its C field."""
    try:
        model_id, dtype = fp.model_id.encode(), fp.dtype.encode()
    except UnicodeEncodeError:
        raise ValueError(f"model_id and dtype must be UTF-8 text: {fp.model_id!r}, {fp.dtype!r}") from None
    if len(model_id) >= lib.TT_MODEL_ID_LEN:
        raise ValueError(f"model_id longer than {lib.TT_MODEL_ID_LEN - 1} bytes: {fp.model_id[:40]!r}...")
    if len(dtype) >= lib.TT_DTYPE_LEN:
        raise ValueError(f"dtype longer than {lib.TT_DTYPE_LEN - 1} bytes: {fp.dtype[:40]!r}")
    out.model_id = model_id
    out.dtype = dtype
    for name in ("n_layers", "kv_heads", "head_dim", "block_size", "tp_rank", "tp_size"):
        value = getattr(fp, name)
        try:
            setattr(out, name, value)
        except (OverflowError, TypeError):
            raise ValueError(f"fingerprint {name} {value!r} does not fit libtutti's field") from None


def _features_dict(lib, f) -> dict:
    """Feature masks and the bits of them this libtutti does not know (docs/format.md).

    Unknown compat bits are ignored; unknown ro_compat bits mean the store could only
    be opened read-only; a store with unknown incompat bits does not open at all.
    """
    return {
        "compat": f.compat, "ro_compat": f.ro_compat, "incompat": f.incompat,
        "unknown_compat": f.compat & ~lib.TT_FEAT_COMPAT_KNOWN,
        "unknown_ro_compat": f.ro_compat & ~lib.TT_FEAT_RO_COMPAT_KNOWN,
    }


def _written_dict(lib, w, paths) -> dict:
    """struct tt_written as JSON-able data (store.h, docs/operations.md "The store's bytes-written counter").

    ``counter``: "kept" (every member's count read from its superblock copy B), "restarted" (some member's copy
    B was unreadable at open: that member counts from 0 since that open, ``restarted`` in its row) or "none" (the
    store was formatted before the counter: members count from this open and nothing is kept).  ``bytes``: the
    members' sum; each member counts since its own ``since_ns``.  ``paths``: member paths by member index.
    """
    states = {lib.TT_WRITTEN_NONE: "none", lib.TT_WRITTEN_KEPT: "kept", lib.TT_WRITTEN_RESTARTED: "restarted"}
    why = {lib.TT_WRITTEN_NO_COUNTER: "the store was formatted before the counter (reformat to get it)",
           lib.TT_WRITTEN_READ_ONLY: "opened read-only",
           lib.TT_WRITTEN_UNKNOWN_FEATURES: "the store has features of a newer tutti",
           lib.TT_WRITTEN_COPY_A_DAMAGED: "a member's superblock copy A is damaged (its count is not saved; "
                                          "the others' are)"}
    members = []
    for i in range(w.n_members):
        m = w.member[i]
        members.append({"index": i, "path": paths[i] if i < len(paths) else None, "bytes": m.bytes,
                        "saved_bytes": m.saved, "since_ns": m.since_ns, "saved_ns": m.saved_ns,
                        "restarted": bool(m.restarted), "saving": bool(m.saving)})
    return {
        "counter": states.get(w.state, f"unknown ({w.state})"),
        "bytes": w.bytes,
        "since_ns": min((m["since_ns"] for m in members), default=0),
        "since_open_bytes": w.since_open,
        "saving": w.not_saving == lib.TT_WRITTEN_SAVING,
        "not_saving_why": why.get(w.not_saving) if w.not_saving != lib.TT_WRITTEN_SAVING else None,
        "save_every_bytes": w.save_every,
        "saves": w.saves,
        "save_errors": w.save_errors,
        "members": members,
    }


def _fp_from_c(ffi, c) -> Fingerprint:
    return Fingerprint(model_id=ffi.string(c.model_id).decode(errors="replace"),
                       dtype=ffi.string(c.dtype).decode(errors="replace"),
                       n_layers=c.n_layers, kv_heads=c.kv_heads, head_dim=c.head_dim,
                       block_size=c.block_size, tp_rank=c.tp_rank, tp_size=c.tp_size)


def _geometry(g) -> Geometry:
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


def _slot_list(slots) -> list:
    slots = list(slots)
    for s in slots:
        if not isinstance(s, int):
            raise TypeError(f"slot must be an int, not {type(s).__name__} (a lookup miss?)")
    return slots


def _struct_dict(c, fields) -> dict:
    return {name: getattr(c, name) for name in fields}


_ENGINE_STATS = ("ios", "reqs", "bytes_read", "bytes_written", "syscalls", "flushes")
_STORE_STATS = ("lookups", "hits", "blocks_read", "blocks_written", "commits", "evictions",
                "corrupt_blocks")


def _stats_dict(st) -> dict:
    return {**_struct_dict(st, _STORE_STATS), "engine": _struct_dict(st.engine, _ENGINE_STATS)}


def _format_params(binding, fingerprint, n_spans, span_bytes, stripe_objs):
    """tt_format_params with the size left out (0: fill the smallest member)."""
    p = binding.ffi.new("struct tt_format_params *")
    _fp_to_c(binding.lib, fingerprint, p.fp)
    p.n_spans = n_spans or 0
    p.span_bytes = span_bytes or 0
    p.stripe_objs = stripe_objs or 0
    return p


def _plan(binding, p, n_members, n_slots, capacity_bytes, member_bytes):
    """Size ``p`` by slots or data capacity and run tt_store_plan(): (geometry, need_bytes)."""
    if n_slots is not None and capacity_bytes is not None:
        raise ValueError("give n_slots or capacity_bytes, not both")
    ffi, lib = binding.ffi, binding.lib
    geo = ffi.new("struct tt_geometry *")
    need = ffi.new("uint64_t *")
    if capacity_bytes is not None:
        # One slot's disk footprint (objects padded to 4 KiB) sets the slot count.
        p.n_slots = 1
        binding.check(lib.tt_store_plan(p, n_members, 0, geo, need), "plan")
        slot_bytes = _geometry(geo).slot_bytes
        if capacity_bytes < slot_bytes:
            raise ValueError(f"capacity of {capacity_bytes} bytes holds no block "
                             f"(one block takes {slot_bytes} bytes)")
        n_slots = capacity_bytes // slot_bytes
    p.n_slots = n_slots or 0
    binding.check(lib.tt_store_plan(p, n_members, member_bytes or 0, geo, need), "plan")
    return _geometry(geo), need[0]
