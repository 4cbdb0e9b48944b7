// SPDX-License-Identifier: Apache-2.0
/*
 * Description: tensor-stripe layout arithmetic: every object of every slot
 * gets its own aligned extent inside the data region, a layer of
 * consecutive slots is contiguous within a stripe unit, and units rotate
 * over the members.
 */
#include <stdlib.h>
#include <errno.h>
#include <string.h>

#include "tutti/tutti.h"
#include "tap.h"
#include "tutti/error.h"

static int check_bijective(const struct tt_geometry *g)
{
	uint64_t per_member = tt_member_objs(g);
	uint64_t total = per_member * g->n_members;
	uint8_t *used = calloc(total, 1);
	int ok = 1;

	for (uint64_t s = 0; s < g->n_slots; s++)
		for (uint32_t l = 0; l < g->n_layers; l++)
			for (uint32_t k = 0; k < g->n_spans; k++) {
				struct tt_extent e = tt_locate(g, s, l, k);
				uint64_t rel = e.off - g->data_off, idx;

				if (e.off < g->data_off || rel % g->obj_stride ||
				    e.member >= g->n_members || e.len != g->obj_stride ||
				    e.off % TT_OBJ_ALIGN) {
					ok = 0;
					continue;
				}
				idx = e.member * per_member + rel / g->obj_stride;
				if (idx >= total || used[idx]++)
					ok = 0;
			}
	free(used);
	return ok;
}

/* A caller that prefixes the reason it got keeps it whole (tt_seterr reads tt_errmsg()). */
static void test_error_prefix(void)
{
	tt_seterr(-EIO, "inner reason %d", 42);
	tt_seterr(-EIO, "outer: %s", tt_errmsg());
	tap_ok(!strcmp(tt_errmsg(), "outer: inner reason 42"), "a reason prefixed with itself: '%s'",
	       tt_errmsg());
}

int main(void)
{
	struct tt_format_params p;
	struct tt_geometry g;
	uint64_t need;

	test_error_prefix();
	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "test/llama3-8b");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = 32;
	p.fp.kv_heads = 8;
	p.fp.head_dim = 128;
	p.fp.block_size = 16;
	p.n_slots = 100;
	tap_eq(tt_store_plan(&p, 1, 0, &g, &need), 0, "plan Llama-3-8B, 100 slots");
	tap_eq(g.span_bytes, 32768, "span = 16 tokens * 8 heads * 128 * 2 bytes");
	tap_eq(g.obj_stride, 32768, "aligned span needs no padding");
	tap_eq(g.stripe_objs, 32, "stripe unit defaults to 1 MiB of objects");
	tap_eq(g.data_off % TT_DATA_ALIGN, 0, "data region 1 MiB aligned");
	tap_ok(need >= g.data_off + 100ull * 64 * 32768, "member holds all objects");
	tap_ok(check_bijective(&g), "1 member: every object has its own extent");

	/* A layer of consecutive slots is one run inside a stripe unit. */
	{
		struct tt_extent a = tt_locate(&g, 10, 5, 1), b = tt_locate(&g, 11, 5, 1);

		tap_eq(b.off - a.off, g.obj_stride, "adjacent slots adjacent on disk");
	}

	p.n_slots = 77;
	p.stripe_objs = 3;
	tap_eq(tt_store_plan(&p, 3, 0, &g, &need), 0, "plan 3-way stripe, odd unit");
	tap_ok(check_bijective(&g), "3 members: every object has its own extent");
	{
		struct tt_extent a = tt_locate(&g, 0, 0, 0), b = tt_locate(&g, 3, 0, 0);
		struct tt_extent c = tt_locate(&g, 6, 0, 0), d = tt_locate(&g, 9, 0, 0);

		tap_ok(a.member == 0 && b.member == 1 && c.member == 2 && d.member == 0,
		       "stripe units rotate over members");
		tap_eq(d.off - a.off, 3ull * g.obj_stride, "second row follows the first");
	}

	/* Unaligned spans are padded to 4 KiB extents. */
	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "tiny");
	strcpy(p.fp.dtype, "float16");
	p.fp.n_layers = 3;
	p.fp.kv_heads = 3;
	p.fp.head_dim = 10;
	p.fp.block_size = 16;
	p.n_slots = 5;
	tap_eq(tt_store_plan(&p, 2, 0, &g, &need), 0, "plan odd geometry");
	tap_eq(g.span_bytes, 960, "odd span");
	tap_eq(g.obj_stride, 4096, "padded to 4 KiB");
	tap_ok(check_bijective(&g), "odd geometry, 2 members: bijective");

	/* Capacity from member size: the largest slot count that fits. */
	p.n_slots = 0;
	p.stripe_objs = 0;
	tap_eq(tt_store_plan(&p, 1, 64ull << 20, &g, &need), 0, "plan from 64 MiB");
	tap_ok(need <= (64ull << 20), "fits");
	{
		struct tt_format_params q = p;
		struct tt_geometry g2;
		uint64_t need2;

		q.n_slots = g.n_slots + 1;
		tap_eq(tt_store_plan(&q, 1, 64ull << 20, &g2, &need2), (unsigned long long)-ENOSPC,
		       "one more slot does not fit");
	}
	p.n_slots = 0;
	tap_eq(tt_store_plan(&p, 1, 4096, &g, &need), (unsigned long long)-ENOSPC,
	       "4 KiB member is too small");

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "x");
	strcpy(p.fp.dtype, "nosuchtype");
	p.fp.n_layers = 1;
	p.fp.kv_heads = 1;
	p.fp.head_dim = 1;
	p.fp.block_size = 1;
	p.n_slots = 1;
	tap_eq(tt_store_plan(&p, 1, 0, &g, &need), (unsigned long long)-EINVAL,
	       "unknown dtype rejected: %s", tt_errmsg());
	strcpy(p.fp.dtype, "fp8");
	p.fp.tp_rank = 2;
	p.fp.tp_size = 2;
	tap_eq(tt_store_plan(&p, 1, 0, &g, &need), (unsigned long long)-EINVAL,
	       "tp rank >= tp size rejected");
	return tap_done();
}
