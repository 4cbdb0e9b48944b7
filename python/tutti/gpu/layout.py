"""Store geometry from libtutti's own planner, as the GPU descriptors need it."""
from __future__ import annotations

from ..model import Geometry
from ._ffi import check, ffi, lib


def plan_geometry(*, n_layers: int, kv_heads: int, head_dim: int, block_size: int, dtype: str,
                  n_members: int, n_slots: int, model_id: str = "tutti/prefill") -> tuple[Geometry, int]:
    """Geometry of a store of ``n_slots`` KV blocks striped over ``n_members``, and the bytes each member needs.

    tt_store_plan() fills in what format would (object size from the shape,
    4 KiB object stride, 1 MiB stripe unit, data region offset), so objects
    sit exactly where a formatted store would put them.
    """
    p = ffi.new("struct tt_format_params *")
    fp = p.fp
    fp.model_id = model_id.encode()[:127]
    fp.dtype = dtype.encode()[:15]
    fp.n_layers, fp.kv_heads, fp.head_dim, fp.block_size = n_layers, kv_heads, head_dim, block_size
    fp.tp_size = 1
    p.n_slots = n_slots
    geo = ffi.new("struct tt_geometry *")
    need = ffi.new("uint64_t *")
    check(lib().tt_store_plan(p, n_members, 0, geo, need), "tt_store_plan", errmsg=True)
    return Geometry(n_layers=geo.n_layers, n_spans=geo.n_spans, span_bytes=geo.span_bytes,
                    obj_stride=geo.obj_stride, n_members=geo.n_members, stripe_objs=geo.stripe_objs,
                    n_slots=geo.n_slots, data_off=geo.data_off), int(need[0])


def c_geometry(g: Geometry):
    """A ``struct tt_geometry`` (cffi, owned) with the fields of ``g``."""
    c = ffi.new("struct tt_geometry *")
    for k, v in g.to_dict().items():
        setattr(c, k, v)
    return c
