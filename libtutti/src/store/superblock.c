// SPDX-License-Identifier: Apache-2.0
/* Superblock encode, read (either copy) and fingerprint comparison. */
#include <stdio.h>
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
	sb->feat.compat = TT_FEAT_COMPAT_WRITTEN;
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

void tt_sb_seal_copy(struct tt_superblock *out, const struct tt_superblock *sb,
		     unsigned copy, const struct tt_sb_written *w)
{
	*out = *sb;
	memset(&out->written, 0, sizeof(out->written));
	if (copy == 1 && w && (sb->feat.compat & TT_FEAT_COMPAT_WRITTEN))
		out->written = *w;
	out->sb_sum = tt_sum_superblock(out);
}

int tt_sb_write(struct tt_member *m, const struct tt_superblock *sb,
		const struct tt_sb_written *w)
{
	struct tt_superblock *buf = tt_alloc_aligned(sizeof(*buf));
	int ret = 0;

	if (!buf)
		return tt_seterr(-ENOMEM, "out of memory");
	for (unsigned c = 0; c < TT_SB_COPIES && !ret; c++) {
		tt_sb_seal_copy(buf, sb, c, w);
		ret = tt_member_pwrite(m, buf, TT_SB_SIZE, (uint64_t)c * TT_SB_SIZE);
	}
	free(buf);
	return ret;
}

/* Does @c start with the magic of some Tutti format version? */
static bool magic_like(const struct tt_superblock *c)
{
	return !memcmp(c->magic, TT_SB_MAGIC, TT_SB_MAGIC_STEM_LEN);
}

/* What one copy holds (TT_PROBE_*); @avail: bytes of it actually present. */
static uint32_t copy_kind(const struct tt_superblock *c, size_t avail)
{
	if (avail < TT_SB_MAGIC_STEM_LEN || !magic_like(c))
		return TT_PROBE_NONE;
	/* Bytes 0..15 and the checksum rule are the same in every version. */
	if (avail < TT_SB_SIZE || c->sb_sum != tt_sum_superblock(c))
		return TT_PROBE_DAMAGED;
	if (memcmp(c->magic, TT_SB_MAGIC, sizeof(c->magic)) ||
	    c->version != TT_FORMAT_VERSION)
		return c->version ? TT_PROBE_OTHER_VERSION : TT_PROBE_DAMAGED;
	return TT_PROBE_STORE;
}

/*
 * Which outcome wins across the copies: another version over this one (a
 * half-done upgrade must not be read by the old rules), a valid copy over
 * damage, damage over nothing.
 */
static int kind_rank(uint32_t kind)
{
	static const int rank[] = {
		[TT_PROBE_NONE] = 0, [TT_PROBE_DAMAGED] = 1,
		[TT_PROBE_STORE] = 2, [TT_PROBE_OTHER_VERSION] = 3,
	};

	return rank[kind];
}

void tt_sb_probe(const void *buf, size_t len, struct tt_probe *out,
		 struct tt_superblock *sb)
{
	memset(out, 0, sizeof(*out));
	for (unsigned c = 0; c < TT_SB_COPIES; c++) {
		size_t at = (size_t)c * TT_SB_SIZE;
		struct tt_superblock cand;
		size_t avail;
		uint32_t kind;

		if (len <= at)
			break;
		avail = TT_MIN(len - at, (size_t)TT_SB_SIZE);
		memset(&cand, 0, sizeof(cand));
		memcpy(&cand, (const uint8_t *)buf + at, avail);
		kind = copy_kind(&cand, avail);
		if (kind == TT_PROBE_STORE && out->kind == TT_PROBE_STORE) {
			/* Both valid: the strictest features of the two count. */
			out->feat.compat |= cand.feat.compat;
			out->feat.ro_compat |= cand.feat.ro_compat;
			out->feat.incompat |= cand.feat.incompat;
			continue;
		}
		if (kind_rank(kind) <= kind_rank(out->kind))
			continue;
		out->kind = kind;
		out->version = kind == TT_PROBE_DAMAGED ? 0 : cand.version;
		if (kind != TT_PROBE_DAMAGED)
			memcpy(out->magic, cand.magic, sizeof(out->magic));
		if (kind != TT_PROBE_STORE)
			continue;
		out->feat = cand.feat;
		memcpy(out->uuid, cand.uuid, sizeof(out->uuid));
		out->member_index = cand.member_index;
		out->n_members = cand.n_members;
		if (sb)
			*sb = cand;
	}
}

const char *tt_probe_describe(const struct tt_probe *pr, char *buf, size_t len)
{
	char magic[sizeof(pr->magic) + 1];

	for (unsigned i = 0; i < sizeof(pr->magic); i++)
		magic[i] = pr->magic[i] >= 0x20 && pr->magic[i] < 0x7f ? pr->magic[i] : '?';
	magic[sizeof(pr->magic)] = '\0';
	if (memcmp(pr->magic, TT_SB_MAGIC, sizeof(pr->magic)))
		snprintf(buf, len, "format version %u (magic '%s')", pr->version, magic);
	else
		snprintf(buf, len, "format version %u", pr->version);
	return buf;
}

static bool all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		if (b[i])
			return false;
	return true;
}

static bool has_unknown_features(const struct tt_features *f)
{
	return (f->compat & ~TT_FEAT_COMPAT_KNOWN) ||
	       (f->ro_compat & ~TT_FEAT_RO_COMPAT_KNOWN) ||
	       (f->incompat & ~TT_FEAT_INCOMPAT_KNOWN);
}

/*
 * Fields this version defines as zero: zero, unless a feature unknown to
 * this libtutti may have given them a meaning.
 */
static bool reserved_clear(const struct tt_superblock *sb, const struct tt_features *f)
{
	if (has_unknown_features(f))
		return true;
	if (!(f->compat & TT_FEAT_COMPAT_WRITTEN) &&
	    !all_zero(&sb->written, sizeof(sb->written)))
		return false;
	return !sb->flags && all_zero(sb->fp.reserved, sizeof(sb->fp.reserved)) &&
	       all_zero(sb->pad, sizeof(sb->pad));
}

/*
 * Self-consistency of a superblock whose checksum is right: the geometry
 * inside the limits format enforces, every derived size exactly what
 * format computes for it (no arithmetic wraps).  tt_sb_parse() then checks
 * that the member really holds member_bytes.
 */
static int sb_sane(const char *path, const struct tt_superblock *sb,
		   const struct tt_features *f)
{
	uint64_t table, data_off, need;
	struct tt_geometry g;
	char why[256];
	int ret;

	tt_sb_geometry(sb, &g);
	ret = tt_geometry_check(&g, &table, &data_off, &need);
	if (ret) {
		snprintf(why, sizeof(why), "%s", tt_errmsg());
		return tt_seterr(-EINVAL, "%s: superblock is inconsistent (damaged store): %s",
				 path, why);
	}
	if (sb->sb_size != TT_SB_SIZE || sb->member_index >= sb->n_members)
		return tt_seterr(-EINVAL, "%s: superblock is inconsistent (damaged store): "
				 "size %u, member %u of %u", path, sb->sb_size,
				 sb->member_index, sb->n_members);
	if (sb->table_off != TT_TABLE_OFF || sb->table_bytes != table ||
	    sb->data_off != data_off || sb->member_bytes != need)
		return tt_seterr(-EINVAL, "%s: superblock is inconsistent (damaged store): "
				 "its sizes are not those of its geometry", path);
	if (sb->fp.n_layers != sb->n_layers || sb->fp_hash != tt_sum_fingerprint(&sb->fp))
		return tt_seterr(-EINVAL, "%s: superblock is inconsistent (damaged store): "
				 "fingerprint", path);
	if (!reserved_clear(sb, f))
		return tt_seterr(-EINVAL, "%s: superblock is inconsistent (damaged store): "
				 "reserved fields are not zero and no feature bit explains them",
				 path);
	return 0;
}

/* May this libtutti open a store with features @f, for writing if @writable? */
static int features_allow(const char *path, const struct tt_features *f,
			  bool writable)
{
	uint64_t incompat = f->incompat & ~TT_FEAT_INCOMPAT_KNOWN;
	uint64_t ro = f->ro_compat & ~TT_FEAT_RO_COMPAT_KNOWN;

	if (incompat)
		return tt_seterr(-EOPNOTSUPP,
				 "%s: the store uses incompatible features 0x%llx that this "
				 "libtutti does not know: upgrade tutti to open it, or "
				 "reformat it (format --force; the cache is rebuilt)",
				 path, (unsigned long long)incompat);
	if (ro && writable)
		return tt_seterr(-EROFS,
				 "%s: the store uses read-only-compatible features 0x%llx that "
				 "this libtutti does not know: open it read-only, or upgrade "
				 "tutti to write it", path, (unsigned long long)ro);
	return 0;
}

int tt_sb_parse(const char *path, const void *buf, size_t len, uint64_t size,
		unsigned flags, struct tt_superblock *sb)
{
	struct tt_probe pr;
	char why[64];
	int ret;

	if (size < TT_TABLE_OFF || len < TT_TABLE_OFF)
		return tt_seterr(-EINVAL, "%s: not a Tutti store (%llu bytes, too small)",
				 path, (unsigned long long)size);
	tt_sb_probe(buf, TT_TABLE_OFF, &pr, sb);
	switch (pr.kind) {
	case TT_PROBE_NONE:
		return tt_seterr(-EINVAL, "%s: not a Tutti store (no superblock)", path);
	case TT_PROBE_DAMAGED:
		return tt_seterr(-EINVAL, "%s: both superblock copies are damaged", path);
	case TT_PROBE_OTHER_VERSION:
		return tt_seterr(-EOPNOTSUPP,
				 "%s: Tutti store of %s; this libtutti reads format version "
				 "%u: upgrade tutti to open it, or reformat it (format "
				 "--force; the cache is rebuilt)",
				 path, tt_probe_describe(&pr, why, sizeof(why)),
				 TT_FORMAT_VERSION);
	}
	ret = features_allow(path, &pr.feat, flags & TT_SB_WRITABLE);
	if (!ret)
		ret = sb_sane(path, sb, &pr.feat);
	if (!ret && sb->member_bytes > size)
		ret = tt_seterr(-EFBIG, "%s is truncated: %llu bytes, store needs %llu",
				path, (unsigned long long)size,
				(unsigned long long)sb->member_bytes);
	if (!ret) {
		sb->feat = pr.feat;
		/* The count is not part of the store's description (same_store()). */
		memset(&sb->written, 0, sizeof(sb->written));
	}
	return ret;
}

void tt_sb_parse_extra(const void *buf, size_t len, const struct tt_superblock *sb,
		       struct tt_sb_extra *x)
{
	struct tt_superblock a, b;

	memset(x, 0, sizeof(*x));
	if (len < TT_TABLE_OFF)
		return;
	memcpy(&a, buf, sizeof(a));
	memcpy(&b, (const uint8_t *)buf + TT_SB_SIZE, sizeof(b));
	x->copy_a_ok = copy_kind(&a, TT_SB_SIZE) == TT_PROBE_STORE;
	if (!(sb->feat.compat & TT_FEAT_COMPAT_WRITTEN) ||
	    copy_kind(&b, TT_SB_SIZE) != TT_PROBE_STORE ||
	    !(b.feat.compat & TT_FEAT_COMPAT_WRITTEN))
		return;
	x->written = b.written;
	/*
	 * Copy B counts for this member only if it is the selected superblock
	 * but for the count (and the feature bits, which are combined).
	 */
	a = *sb;
	a.sb_sum = 0;
	memset(&b.written, 0, sizeof(b.written));
	b.feat = sb->feat;
	b.sb_sum = 0;
	x->written_ok = !memcmp(&a, &b, sizeof(b));
	if (!x->written_ok)
		memset(&x->written, 0, sizeof(x->written));
}

int tt_sb_read(struct tt_member *m, struct tt_superblock *sb, unsigned flags,
	       struct tt_sb_extra *x)
{
	struct tt_superblock *buf;
	int ret;

	if (m->size < TT_TABLE_OFF)
		return tt_seterr(-EINVAL, "%s: not a Tutti store (%llu bytes, too small)",
				 m->path, (unsigned long long)m->size);
	buf = tt_alloc_aligned(TT_TABLE_OFF);
	if (!buf)
		return tt_seterr(-ENOMEM, "out of memory");
	ret = tt_member_pread(m, buf, TT_TABLE_OFF, 0);
	if (!ret)
		ret = tt_sb_parse(m->path, buf, TT_TABLE_OFF, m->size, flags, sb);
	if (!ret && x)
		tt_sb_parse_extra(buf, TT_TABLE_OFF, sb, x);
	free(buf);
	return ret;
}

int tt_sb_probe_member(struct tt_member *m, struct tt_probe *out)
{
	void *buf = tt_alloc_aligned(TT_TABLE_OFF);
	uint64_t got = 0;
	int ret;

	if (!buf)
		return tt_seterr(-ENOMEM, "out of memory");
	ret = tt_member_read_head(m, buf, TT_TABLE_OFF, &got);
	if (!ret)
		tt_sb_probe(buf, got, out, NULL);
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
