// SPDX-License-Identifier: Apache-2.0
/* Superblock encode, read (either copy) and fingerprint comparison. */
#include <stdlib.h>
#include <string.h>

#include "tutti/error.h"
#include "store_impl.h"
#include "../support/util.h"

void tt_sb_fill(struct tt_superblock *sb, const struct tt_format_params *p,
		const struct tt_geometry *g, uint64_t need, const uint8_t uuid[16])
{
	memset(sb, 0, sizeof(*sb));
	memcpy(sb->magic, TT_SB_MAGIC, sizeof(sb->magic));
	sb->version = TT_FORMAT_VERSION;
	sb->sb_size = TT_SB_SIZE;
	memcpy(sb->uuid, uuid, sizeof(sb->uuid));
	sb->n_members = g->n_members;
	sb->n_layers = g->n_layers;
	sb->n_spans = g->n_spans;
	sb->span_bytes = g->span_bytes;
	sb->obj_stride = g->obj_stride;
	sb->stripe_objs = g->stripe_objs;
	sb->n_slots = g->n_slots;
	sb->table_off = TT_TABLE_OFF;
	sb->table_bytes = TT_ALIGN_UP(g->n_slots * TT_RECORD_SIZE, TT_OBJ_ALIGN);
	sb->data_off = g->data_off;
	sb->member_bytes = need;
	sb->created_ns = tt_now_ns();
	sb->fp = p->fp;
	sb->fp_hash = tt_sum_fingerprint(&sb->fp);
}

void tt_sb_geometry(const struct tt_superblock *sb, struct tt_geometry *g)
{
	g->n_layers = sb->n_layers;
	g->n_spans = sb->n_spans;
	g->span_bytes = sb->span_bytes;
	g->obj_stride = sb->obj_stride;
	g->n_members = sb->n_members;
	g->stripe_objs = sb->stripe_objs;
	g->n_slots = sb->n_slots;
	g->data_off = sb->data_off;
}

int tt_sb_write(struct tt_member *m, const struct tt_superblock *sb)
{
	struct tt_superblock *buf = tt_alloc_aligned(sizeof(*buf));
	int ret = 0;

	if (!buf)
		return tt_seterr(-ENOMEM, "out of memory");
	*buf = *sb;
	buf->sb_sum = tt_sum_superblock(buf);
	for (unsigned c = 0; c < TT_SB_COPIES && !ret; c++)
		ret = tt_member_pwrite(m, buf, TT_SB_SIZE, (uint64_t)c * TT_SB_SIZE);
	free(buf);
	return ret;
}

/* Self-consistency of a superblock whose checksum is right. */
static int sb_sane(const struct tt_member *m, const struct tt_superblock *sb)
{
	uint64_t objs;
	struct tt_geometry g;

	tt_sb_geometry(sb, &g);
	objs = tt_member_objs(&g);
	if (!sb->n_layers || !sb->n_spans || !sb->span_bytes || !sb->n_slots ||
	    !sb->n_members || sb->n_members > TT_MAX_MEMBERS || !sb->stripe_objs ||
	    sb->member_index >= sb->n_members ||
	    sb->obj_stride != TT_ALIGN_UP(sb->span_bytes, TT_OBJ_ALIGN) ||
	    sb->table_off != TT_TABLE_OFF ||
	    sb->table_bytes < sb->n_slots * TT_RECORD_SIZE ||
	    sb->data_off < sb->table_off + sb->table_bytes ||
	    sb->member_bytes < sb->data_off + objs * sb->obj_stride ||
	    sb->fp_hash != tt_sum_fingerprint(&sb->fp))
		return tt_seterr(-EINVAL, "%s: superblock is inconsistent (damaged store)",
				 m->path);
	return 0;
}

int tt_sb_read(struct tt_member *m, struct tt_superblock *sb)
{
	struct tt_superblock *buf;
	int magic_seen = 0, ret = -EINVAL;

	if (m->size < TT_TABLE_OFF)
		return tt_seterr(-EINVAL, "%s: not a Tutti store (%llu bytes, too small)",
				 m->path, (unsigned long long)m->size);
	buf = tt_alloc_aligned(TT_SB_SIZE * TT_SB_COPIES);
	if (!buf)
		return tt_seterr(-ENOMEM, "out of memory");
	ret = tt_member_pread(m, buf, TT_SB_SIZE * TT_SB_COPIES, 0);
	if (ret)
		goto out;
	ret = -EINVAL;
	for (unsigned c = 0; c < TT_SB_COPIES; c++) {
		const struct tt_superblock *cand = &buf[c];

		if (memcmp(cand->magic, TT_SB_MAGIC, sizeof(cand->magic)))
			continue;
		magic_seen = 1;
		if (cand->sb_sum != tt_sum_superblock(cand))
			continue;
		if (cand->version != TT_FORMAT_VERSION) {
			ret = tt_seterr(-EINVAL, "%s: format version %u, this libtutti reads %u",
					m->path, cand->version, TT_FORMAT_VERSION);
			goto out;
		}
		ret = sb_sane(m, cand);
		if (ret)
			goto out;
		*sb = *cand;
		ret = 0;
		goto out;
	}
	if (magic_seen)
		tt_seterr(-EINVAL, "%s: both superblock copies are damaged", m->path);
	else
		tt_seterr(-EINVAL, "%s: not a Tutti store (no superblock)", m->path);
out:
	free(buf);
	return ret;
}

static const char *fp_str(const char *s, size_t cap, char *out)
{
	size_t n = strnlen(s, cap);

	memcpy(out, s, n);
	out[n] = '\0';
	return out;
}

int tt_fp_compare(const struct tt_fingerprint *have, const struct tt_fingerprint *wanted)
{
	char a[TT_MODEL_ID_LEN + 1], b[TT_MODEL_ID_LEN + 1];
	struct tt_fingerprint w = *wanted, *want = &w;

	if (!w.tp_size)
		w.tp_size = 1;	/* as tt_store_plan() normalises it */

#define FP_FIELD(f)							\
	if (have->f != want->f)						\
		return tt_seterr(-EMEDIUMTYPE,				\
			"fingerprint mismatch: store has " #f "=%u, expected %u", \
			have->f, want->f);
	if (strncmp(have->model_id, want->model_id, TT_MODEL_ID_LEN))
		return tt_seterr(-EMEDIUMTYPE,
				 "fingerprint mismatch: store holds model '%s', expected '%s'",
				 fp_str(have->model_id, TT_MODEL_ID_LEN, a),
				 fp_str(want->model_id, TT_MODEL_ID_LEN, b));
	if (strncmp(have->dtype, want->dtype, TT_DTYPE_LEN))
		return tt_seterr(-EMEDIUMTYPE,
				 "fingerprint mismatch: store has dtype '%s', expected '%s'",
				 fp_str(have->dtype, TT_DTYPE_LEN, a),
				 fp_str(want->dtype, TT_DTYPE_LEN, b));
	FP_FIELD(n_layers)
	FP_FIELD(kv_heads)
	FP_FIELD(head_dim)
	FP_FIELD(block_size)
	FP_FIELD(tp_rank)
	FP_FIELD(tp_size)
#undef FP_FIELD
	return 0;
}
