/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tensor-stripe layout: where every object lives, by arithmetic alone.
 *
 * A slot holds one KV block: n_layers * n_spans objects ("a GPU file").
 * Objects are grouped by (layer, span) into regions, and inside a region
 * ordered by slot, so a layer of consecutive slots is one contiguous run on
 * disk: the layer-wise retrieve of a prefix becomes a few large I/Os.  The
 * global object sequence is striped over the members in units of
 * stripe_objs objects (RAID-0 over objects, never splitting one).
 *
 * Nothing is allocated on the I/O path: the address of (slot, layer, span)
 * is a handful of integer operations, and the same inline functions serve
 * the CPU engines and GPU kernels.
 *
 * No function here checks for overflow: each takes a geometry inside the
 * limits of format.h, which format enforces and open re-checks against the
 * member's real size (tt_geometry_check(), with checked arithmetic).  Inside
 * them no product below wraps and every tt_locate() offset lies in
 * [data_off, member_bytes).  A geometry that did not come from an open store
 * or tt_store_plan() must not be passed in.
 */
#ifndef TUTTI_LAYOUT_H
#define TUTTI_LAYOUT_H

#include <stdint.h>

#if defined(__CUDACC__)
#define TT_LAYOUT_HD __host__ __device__
#else
#define TT_LAYOUT_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* cffi: begin */
struct tt_geometry {
	uint32_t n_layers;
	uint32_t n_spans;	/* objects per layer per block (2: K and V) */
	uint32_t span_bytes;	/* payload of one object */
	uint32_t obj_stride;	/* span_bytes rounded up to TT_OBJ_ALIGN */
	uint32_t n_members;	/* stripe width, >= 1 */
	uint32_t stripe_objs;	/* stripe unit in objects, >= 1 */
	uint64_t n_slots;
	uint64_t data_off;	/* start of the data region on each member */
};

/* Where one object lives. */
struct tt_extent {
	uint32_t member;
	uint32_t len;		/* obj_stride */
	uint64_t off;		/* byte offset on that member */
};

/* cffi: end */
static inline TT_LAYOUT_HD uint32_t tt_objs_per_slot(const struct tt_geometry *g)
{
	return g->n_layers * g->n_spans;
}

/* Index of (layer, span) inside a slot; also the object's checksum seed. */
static inline TT_LAYOUT_HD uint32_t tt_obj_index(const struct tt_geometry *g,
						 uint32_t layer, uint32_t span)
{
	return layer * g->n_spans + span;
}

/* Objects each member holds (the data region is the same on all). */
static inline TT_LAYOUT_HD uint64_t tt_member_objs(const struct tt_geometry *g)
{
	uint64_t total = g->n_slots * tt_objs_per_slot(g);
	uint64_t unit = (uint64_t)g->stripe_objs * g->n_members;

	return (total + unit - 1) / unit * g->stripe_objs;
}

/**
 * tt_locate() - extent of object (slot, layer, span)
 * @g: geometry of the store
 * @slot: slot index, < n_slots
 * @layer: layer index, < n_layers
 * @span: span index, < n_spans
 *
 * Return: the member and byte offset; the caller checks the bounds.
 */
static inline TT_LAYOUT_HD struct tt_extent
tt_locate(const struct tt_geometry *g, uint64_t slot, uint32_t layer,
	  uint32_t span)
{
	uint64_t seq = (uint64_t)tt_obj_index(g, layer, span) * g->n_slots + slot;
	uint64_t unit = seq / g->stripe_objs;
	uint64_t row = unit / g->n_members;
	struct tt_extent e;

	e.member = (uint32_t)(unit % g->n_members);
	e.len = g->obj_stride;
	e.off = g->data_off +
		(row * g->stripe_objs + seq % g->stripe_objs) * g->obj_stride;
	return e;
}

#ifdef __cplusplus
}
#endif
#endif
