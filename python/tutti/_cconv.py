"""Python values to and from libtutti's C structs, for both bindings (the extension and libtutti_gpu.so): keys,
member paths, fingerprints, geometry, feature masks, the bytes-written counter, statistics, format plans."""
from __future__ import annotations

import errno
import operator
import os

from .errors import TuttiError
from .model import Fingerprint, Geometry

INT64_MAX = (1 << 63) - 1
UINT32_MAX = (1 << 32) - 1
UINT64_MAX = (1 << 64) - 1


def whole(value, what: str) -> int:
    """``value`` as an int (numpy and torch integers too); TypeError naming ``what`` for anything else
    (a bool, a float, None), rather than cffi's nameless "an integer is required"."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


def c_count(value, what: str, top: int, low: int = 0) -> int:
    """``value`` as an int in [low, top] for a C field; ValueError naming ``what`` otherwise (cffi says
    only "can't convert negative number to unsigned" or "int too big to convert")."""
    v = whole(value, what)
    if not low <= v <= top:
        raise ValueError(f"{what} {v if abs(v) < 10**40 else 'of over 40 digits'} is out of range: "
                         f"{low}..{top}")
    return v


def index_in(value, what: str, n: int, code: int = errno.ERANGE, of: str = "store has") -> int:
    """``value`` as an index below ``n`` (a slot, a layer): out of range is the TuttiError libtutti itself
    raises for one (ERANGE), also where the value would not even fit the C argument (negative, huge)."""
    v = whole(value, what)
    if not 0 <= v < n:
        shown = v if abs(v) < 10**40 else "of over 40 digits"
        raise TuttiError(code, f"{what} {shown} out of range ({of} {n})")
    return v


def _key_source(ffi, key):
    """``key`` (str as UTF-8, or bytes-like) as a C buffer; TypeError otherwise."""
    if isinstance(key, str):
        try:
            key = key.encode()
        except UnicodeEncodeError:  # a lone surrogate: no UTF-8 bytes to hash
            raise ValueError(f"key {key[:40]!r} is not UTF-8 text (it holds a lone surrogate)") from None
    try:
        return ffi.from_buffer(key)
    except TypeError:
        raise TypeError(f"key must be str or bytes-like, not {type(key).__name__}") from None


def key_list(keys) -> list:
    """``keys`` as a list; a lone str or bytes-like is refused, not taken as a sequence of one-character
    keys (``write("abc")`` would otherwise store three blocks, "a", "b" and "c")."""
    if isinstance(keys, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"keys must be a list of keys, not one {type(keys).__name__} (wrap it: [key])")
    try:
        return list(keys)
    except TypeError:
        raise TypeError(f"keys must be a list of keys, not {type(keys).__name__}") from None


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
    keys = key_list(keys)
    arr = ffi.new("uint8_t[]", max(len(keys), 1) * K)
    for i, key in enumerate(keys):
        data = _key_source(ffi, key)
        lib.tt_key_from_bytes(data, len(data), arr + i * K)
    return arr, len(keys)


def _member_paths(ffi, paths):
    """Member paths as str (a single path is a one-member store), as a C array, and the strings it borrows."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    try:
        paths = [os.fsdecode(p) for p in paths]
    except TypeError:
        raise TypeError(f"member paths must be str, bytes or os.PathLike, not {paths!r:.60}") from None
    if not paths:
        raise ValueError("a store needs at least one member path")
    keep = [ffi.new("char[]", os.fsencode(p)) for p in paths]
    return paths, ffi.new("const char *[]", keep), keep


def _fp_to_c(lib, fp: Fingerprint, out) -> None:
    """Fill struct tt_fingerprint ``out`` from ``fp``; ValueError if a value does not fit its C field."""
    if not isinstance(fp, Fingerprint):
        raise TypeError(f"a fingerprint must be a tutti.Fingerprint, not {type(fp).__name__}")
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
    try:
        xs = list(xs)
    except TypeError:
        raise TypeError(f"{what} must be a list of ints, not {type(xs).__name__}") from None
    for x in xs:
        if not isinstance(x, int) or isinstance(x, bool):
            raise TypeError(f"{what} must be ints, got {type(x).__name__} ({x!r}; a lookup miss?)")
    return xs


def slot_list(slots, n_slots: int) -> list:
    """Slots for an int64_t array: ints (a lookup's None is refused by name); one that cannot be a slot
    even as int64 is out of range as libtutti says it for any other (ERANGE)."""
    slots = int_list(slots, "slots")
    for s in slots:
        if not -INT64_MAX - 1 <= s <= INT64_MAX:
            index_in(s, "slot", n_slots)
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
    p.n_spans = c_count(n_spans or 0, "n_spans", UINT32_MAX)
    p.span_bytes = c_count(span_bytes or 0, "span_bytes", UINT32_MAX)
    p.stripe_objs = c_count(stripe_objs or 0, "stripe_objs", UINT32_MAX)
    return p


def _plan(binding, p, n_members, n_slots, capacity_bytes, member_bytes):
    """Size ``p`` by slots or data capacity and run tt_store_plan(): (geometry, need_bytes)."""
    if n_slots is not None and capacity_bytes is not None:
        raise ValueError("give n_slots or capacity_bytes, not both")
    ffi, lib = binding.ffi, binding.lib
    n_members = c_count(n_members, "n_members", UINT32_MAX)
    member_bytes = c_count(member_bytes or 0, "member_bytes", UINT64_MAX)
    n_slots = None if n_slots is None else c_count(n_slots, "n_slots", UINT64_MAX)
    geo = ffi.new("struct tt_geometry *")
    need = ffi.new("uint64_t *")
    if capacity_bytes is not None:
        capacity_bytes = c_count(capacity_bytes, "capacity_bytes", UINT64_MAX)
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
