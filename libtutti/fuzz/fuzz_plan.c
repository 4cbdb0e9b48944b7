// SPDX-License-Identifier: Apache-2.0
/*
 * Description: format's size arithmetic (tt_store_plan) on any parameters:
 * a plan it accepts has a geometry inside the limits whose every object
 * lies inside what each member must hold, fits the member it was sized
 * for (and, when it filled the member, one slot more would not), and its
 * superblock is accepted by the checks open makes.
 *
 * Input: the raw fields of struct plan_input (fuzz.h), zero-padded.
 */
#include "fuzz.h"

static const char *const dtypes[] = { "bfloat16", "float32", "fp8", "int8", "bogus" };

static void extent_inside(const struct tt_geometry *g, uint64_t need, uint64_t slot,
			  uint32_t layer, uint32_t span)
{
	struct tt_extent e = tt_locate(g, slot, layer, span);

	FUZZ_ASSERT(e.member < g->n_members && e.len == g->obj_stride);
	FUZZ_ASSERT(e.off >= g->data_off && e.off % TT_OBJ_ALIGN == 0);
	FUZZ_ASSERT(e.off <= need && need - e.off >= e.len);
}

/* The superblock format would write for this plan passes open's checks. */
static void superblock_opens(const struct tt_format_params *p, const struct tt_geometry *g,
			     uint64_t need)
{
	static const uint8_t uuid[16] = { 1 };
	struct tt_superblock *two = aligned_alloc(4096, TT_TABLE_OFF), back;

	FUZZ_ASSERT(two);
	tt_sb_fill(&two[0], p, g, need, uuid);
	two[0].sb_sum = tt_sum_superblock(&two[0]);
	two[1] = two[0];
	FUZZ_ASSERT(!tt_sb_parse("fuzz", two, TT_TABLE_OFF, need, TT_SB_WRITABLE, &back));
	FUZZ_ASSERT(back.member_bytes == need && back.n_slots == g->n_slots);
	free(two);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tt_format_params p;
	struct plan_input in;
	struct tt_geometry g, more;
	uint64_t need, table, off, more_need;
	int rc;

	memset(&in, 0, sizeof(in));
	memcpy(&in, data, size < sizeof(in) ? size : sizeof(in));
	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "fuzz/plan");
	strcpy(p.fp.dtype, dtypes[in.dtype % TT_ARRAY_SIZE(dtypes)]);
	p.fp.n_layers = in.n_layers;
	p.fp.kv_heads = in.kv_heads;
	p.fp.head_dim = in.head_dim;
	p.fp.block_size = in.block_size;
	p.n_spans = in.n_spans;
	p.span_bytes = in.span_bytes;
	p.stripe_objs = in.stripe_objs;
	p.n_slots = in.n_slots;

	rc = tt_store_plan(&p, in.n_members, in.member_bytes, &g, &need);
	FUZZ_ASSERT(rc <= 0);
	if (rc)
		return 0;
	FUZZ_ASSERT(!tt_geometry_check(&g, &table, &off, &need));
	FUZZ_ASSERT(off == g.data_off && g.n_slots == p.n_slots);
	FUZZ_ASSERT(!in.member_bytes || need <= in.member_bytes);
	extent_inside(&g, need, g.n_slots - 1, g.n_layers - 1, g.n_spans - 1);
	extent_inside(&g, need, in.probe_slot % g.n_slots, in.probe_layer % g.n_layers,
		      in.probe_span % g.n_spans);
	if (!in.n_slots && g.n_slots < TT_MAX_SLOTS) {
		/* It filled the member: the largest slot count that fits. */
		more = g;
		more.n_slots++;
		FUZZ_ASSERT(tt_geometry_check(&more, &table, &off, &more_need) ||
			    more_need > in.member_bytes);
	}
	superblock_opens(&p, &g, need);
	return 0;
}
