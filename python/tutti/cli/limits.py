"""What libtutti can take, read from the binding instead of restated by hand.

An option that ends up in a C struct field or a C argument is bounded by that
field's type (a ``uint32_t`` layer count, a ``uint64_t`` slot count); string
fields by their array length (format.h's TT_MODEL_ID_LEN, TT_DTYPE_LEN); the
member count by TT_MAX_MEMBERS.
Semantic limits that libtutti keeps to itself (at most 4096 layers, 64 spans,
256 MiB objects, a dtype it knows the size of) are left to ``tt_store_plan()``,
whose reason the CLI prints.

The binding is imported on first use, so ``tutti-admin --help`` and the
commands that never touch a store do not load it.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def _binding():
    from .._tutti import ffi, lib

    return ffi, lib


def _unsigned_max(ctype) -> int:
    ffi, _ = _binding()
    if ctype.kind != "primitive" or int(ffi.cast(ctype, -1)) < 0:
        raise TypeError(f"{ctype.cname} is not an unsigned integer type")
    return int(ffi.cast(ctype, -1))


@functools.lru_cache(maxsize=None)
def field_max(struct: str, field: str) -> int:
    """Largest value of unsigned integer field ``field`` of ``struct <struct>``."""
    ffi, _ = _binding()
    fields = dict(ffi.typeof(f"struct {struct}").fields)
    return _unsigned_max(fields[field].type)


@functools.lru_cache(maxsize=None)
def arg_max(function: str, index: int) -> int:
    """Largest value of unsigned integer argument ``index`` (from 0) of libtutti's ``function``."""
    ffi, lib = _binding()
    return _unsigned_max(ffi.typeof(getattr(lib, function)).args[index])


def field_ctype(struct: str, field: str) -> str:
    """The C type of a field, for messages ("uint32_t")."""
    ffi, _ = _binding()
    return dict(ffi.typeof(f"struct {struct}").fields)[field].type.cname


def arg_ctype(function: str, index: int) -> str:
    """The C type of argument ``index`` of ``function``, for messages ("unsigned int")."""
    ffi, lib = _binding()
    return ffi.typeof(getattr(lib, function)).args[index].cname


def model_id_bytes() -> int:
    """Longest model id a fingerprint holds, in UTF-8 bytes (NUL-terminated field)."""
    return _binding()[1].TT_MODEL_ID_LEN - 1


def dtype_bytes() -> int:
    """Longest dtype name a fingerprint holds, in bytes."""
    return _binding()[1].TT_DTYPE_LEN - 1


def max_members() -> int:
    """Members (files or devices) a store may have."""
    return _binding()[1].TT_MAX_MEMBERS

