// SPDX-License-Identifier: Apache-2.0
/* Geometry planning: defaults, validation and capacity arithmetic. */
#include <string.h>
#include <strings.h>

#include "tutti/error.h"
#include "store_impl.h"
#include "../support/util.h"

static const struct {
	const char *name;
	unsigned size;
} dtypes[] = {
	{ "float32", 4 }, { "fp32", 4 }, { "float", 4 },
	{ "bfloat16", 2 }, { "bf16", 2 }, { "float16", 2 }, { "fp16", 2 },
	{ "half", 2 },
	{ "fp8", 1 }, { "fp8_e4m3", 1 }, { "fp8_e5m2", 1 },
	{ "float8_e4m3fn", 1 }, { "float8_e5m2", 1 }, { "int8", 1 },
	{ "uint8", 1 },
};

unsigned tt_dtype_size(const char *dtype)
{
	for (unsigned i = 0; i < TT_ARRAY_SIZE(dtypes); i++)
		if (!strcasecmp(dtype, dtypes[i].name))
			return dtypes[i].size;
	return 0;
}

/* Is @g inside the limits of format.h (the same at format and at open)? */
static int geometry_in_limits(const struct tt_geometry *g)
{
	if (!g->n_layers || g->n_layers > TT_MAX_LAYERS)
		return tt_seterr(-EINVAL, "layers must be 1..%u, got %u", TT_MAX_LAYERS,
				 g->n_layers);
	if (!g->n_spans || g->n_spans > TT_MAX_SPANS)
		return tt_seterr(-EINVAL, "spans must be 1..%u, got %u", TT_MAX_SPANS,
				 g->n_spans);
	if (!g->span_bytes || g->span_bytes > TT_MAX_SPAN_BYTES)
		return tt_seterr(-EINVAL, "span must be 1..%u bytes, got %u",
				 TT_MAX_SPAN_BYTES, g->span_bytes);
	if (g->obj_stride != TT_ALIGN_UP(g->span_bytes, TT_OBJ_ALIGN))
		return tt_seterr(-EINVAL, "object stride %u is not the span %u rounded up to %u",
				 g->obj_stride, g->span_bytes, TT_OBJ_ALIGN);
	if (!g->n_members || g->n_members > TT_MAX_MEMBERS)
		return tt_seterr(-EINVAL, "%u members: a store has 1..%u", g->n_members,
				 TT_MAX_MEMBERS);
	if (!g->stripe_objs)
		return tt_seterr(-EINVAL, "stripe unit of 0 objects");
	if (!g->n_slots || g->n_slots > TT_MAX_SLOTS)
		return tt_seterr(-EINVAL, "slots must be 1..%u, got %llu", TT_MAX_SLOTS,
				 (unsigned long long)g->n_slots);
	return 0;
}

int tt_geometry_check(const struct tt_geometry *g, uint64_t *table_bytes,
		      uint64_t *data_off, uint64_t *need)
{
	uint64_t table, off, objs, data;
	int ret = geometry_in_limits(g);

	if (ret)
		return ret;
	/* Inside the limits, tt_member_objs() cannot overflow (format.h). */
	objs = tt_member_objs(g);
	table = TT_ALIGN_UP(g->n_slots * TT_RECORD_SIZE, TT_OBJ_ALIGN);
	if (tt_align_up_overflows(TT_TABLE_OFF + table, TT_DATA_ALIGN, &off) ||
	    tt_mul_overflows(objs, g->obj_stride, &data) ||
	    tt_add_overflows(off, data, need) || *need > (uint64_t)INT64_MAX)
		return tt_seterr(-EFBIG, "%llu slots of %u x %u objects of %u bytes do not "
				 "fit a file offset",
				 (unsigned long long)g->n_slots, g->n_layers, g->n_spans,
				 g->obj_stride);
	*table_bytes = table;
	*data_off = off;
	return 0;
}

/* Bytes each member needs for @g (sets its data_off); 0 if it cannot exist. */
static uint64_t member_need(struct tt_geometry *g)
{
	uint64_t table, need;

	if (tt_geometry_check(g, &table, &g->data_off, &need))
		return 0;
	return need;
}

int tt_store_plan(struct tt_format_params *p, unsigned n_members,
		  uint64_t member_bytes, struct tt_geometry *geo,
		  uint64_t *need_bytes)
{
	struct tt_fingerprint *fp = &p->fp;
	struct tt_geometry g = { 0 };
	char dtype[TT_DTYPE_LEN + 1];
	uint64_t need, table;
	int ret;

	memcpy(dtype, fp->dtype, TT_DTYPE_LEN);
	dtype[TT_DTYPE_LEN] = '\0';
	if (!n_members || n_members > TT_MAX_MEMBERS)
		return tt_seterr(-EINVAL, "%u members: a store has 1..%u", n_members,
				 TT_MAX_MEMBERS);
	if (!fp->model_id[0])
		return tt_seterr(-EINVAL, "fingerprint needs a model id");
	if (!fp->n_layers || fp->n_layers > TT_MAX_LAYERS)
		return tt_seterr(-EINVAL, "layers must be 1..%u, got %u", TT_MAX_LAYERS,
				 fp->n_layers);
	if (!fp->tp_size)
		fp->tp_size = 1;
	if (fp->tp_rank >= fp->tp_size)
		return tt_seterr(-EINVAL, "tp rank %u is not below tp size %u",
				 fp->tp_rank, fp->tp_size);
	if (!p->n_spans)
		p->n_spans = 2;
	if (p->n_spans > TT_MAX_SPANS)
		return tt_seterr(-EINVAL, "spans must be 1..%u, got %u", TT_MAX_SPANS,
				 p->n_spans);
	if (!p->span_bytes) {
		unsigned dsize = tt_dtype_size(dtype);
		uint64_t b;

		if (!dsize)
			return tt_seterr(-EINVAL, "unknown dtype '%s'", dtype);
		if (!fp->block_size || !fp->kv_heads || !fp->head_dim)
			return tt_seterr(-EINVAL,
					 "block size, kv heads and head dim must be non-zero");
		if (tt_mul_overflows((uint64_t)fp->block_size * fp->kv_heads,
				     (uint64_t)fp->head_dim * dsize, &b) ||
		    b > TT_MAX_SPAN_BYTES)
			return tt_seterr(-EINVAL, "object of %u tokens x %u heads x %u x %u "
					 "bytes is over %u bytes", fp->block_size,
					 fp->kv_heads, fp->head_dim, dsize, TT_MAX_SPAN_BYTES);
		p->span_bytes = (uint32_t)b;
	}
	if (p->span_bytes > TT_MAX_SPAN_BYTES)
		return tt_seterr(-EINVAL, "span of %u bytes is too large", p->span_bytes);

	g.n_layers = fp->n_layers;
	g.n_spans = p->n_spans;
	g.span_bytes = p->span_bytes;
	g.obj_stride = TT_ALIGN_UP(p->span_bytes, TT_OBJ_ALIGN);
	g.n_members = n_members;
	if (!p->stripe_objs)
		p->stripe_objs = TT_MAX(1u, (1u << 20) / g.obj_stride);
	g.stripe_objs = p->stripe_objs;

	if (!p->n_slots) {
		uint64_t lo = 0, hi;

		if (!member_bytes)
			return tt_seterr(-EINVAL, "capacity needed: give a slot count or a size");
		/*
		 * Upper bound: the objects all members hold, over the objects
		 * of a slot (members x objects <= 16 x 2^52: no overflow).
		 * Rounding per member first, as before, lost slots: 16 members
		 * of 4.08 slots' worth each hold 65 slots, not 64.
		 */
		hi = member_bytes / g.obj_stride * n_members / tt_objs_per_slot(&g) + 1;
		hi = TT_MIN(hi, (uint64_t)TT_MAX_SLOTS + 1);
		while (lo + 1 < hi) {	/* largest n whose need fits */
			uint64_t mid = lo + (hi - lo) / 2, n;

			g.n_slots = mid;
			n = member_need(&g);
			if (n && n <= member_bytes)
				lo = mid;
			else
				hi = mid;
		}
		if (!lo)
			return tt_seterr(-ENOSPC,
					 "%llu bytes per member is too small for even one slot",
					 (unsigned long long)member_bytes);
		p->n_slots = lo;
	}
	if (p->n_slots > TT_MAX_SLOTS)
		return tt_seterr(-EINVAL, "%llu slots: at most %u",
				 (unsigned long long)p->n_slots, TT_MAX_SLOTS);
	g.n_slots = p->n_slots;
	ret = tt_geometry_check(&g, &table, &g.data_off, &need);
	if (ret)
		return ret;
	if (member_bytes && need > member_bytes)
		return tt_seterr(-ENOSPC,
				 "too small: %llu slots need %llu bytes per member, %llu available",
				 (unsigned long long)g.n_slots, (unsigned long long)need,
				 (unsigned long long)member_bytes);
	*geo = g;
	*need_bytes = need;
	return 0;
}
