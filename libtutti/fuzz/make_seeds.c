// SPDX-License-Identifier: Apache-2.0
/*
 * Description: writes the fuzzers' seed corpus (libtutti/fuzz/corpus/):
 * the header bytes of real stores formatted and filled through the public
 * API, and crafted edge cases made from them (another version, unknown
 * feature bits, wrapping geometry, damaged copies and records, members of
 * another store...).  `make fuzz-seeds` runs it; the corpus is committed.
 *
 * Usage: make_seeds CORPUS_DIR
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

static char tmpdir[] = "/tmp/tutti-seeds-XXXXXX";
static const char *corpus;

static void die(const char *what)
{
	fprintf(stderr, "make_seeds: %s: %s\n", what, tt_errmsg()[0] ? tt_errmsg() : strerror(errno));
	exit(1);
}

/* A store's member header: both copies and the table (head_len bytes). */
struct head {
	uint8_t *b;
	size_t len;
};

static struct tt_format_params params(uint32_t layers, uint32_t spans, uint32_t span_bytes,
				      uint32_t stripe, uint64_t slots)
{
	struct tt_format_params p;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "seed/model");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = layers;
	p.fp.kv_heads = 1;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;
	p.n_spans = spans;
	p.span_bytes = span_bytes;
	p.stripe_objs = stripe;
	p.n_slots = slots;
	return p;
}

/* Format @n members, put @puts blocks (keys "k0".. ), return each member's head. */
static void make_store(const char *name, unsigned n, struct tt_format_params p, unsigned puts,
		       struct head *heads)
{
	char files[FUZZ_MAX_MEMBERS][256];
	const char *paths[FUZZ_MAX_MEMBERS];
	struct tt_open_params op = { .engine = "psync" };
	struct tt_superblock sb;
	struct tt_store *s;
	size_t bb;
	uint8_t *blk;

	for (unsigned i = 0; i < n; i++) {
		snprintf(files[i], sizeof(files[i]), "%s/%s.%u", tmpdir, name, i);
		unlink(files[i]);
		paths[i] = files[i];
	}
	if (tt_store_format(paths, n, &p))
		die("format");
	if (tt_store_open(paths, n, &op, &s))
		die("open");
	bb = (size_t)tt_objs_per_slot(tt_store_geometry(s)) * tt_store_geometry(s)->span_bytes;
	blk = malloc(bb);
	for (unsigned k = 0; k < puts; k++) {
		uint8_t key[TT_KEY_BYTES];
		char kname[16];

		snprintf(kname, sizeof(kname), "k%u", k);
		tt_key_from_bytes(kname, strlen(kname), key);
		fuzz_fill_pattern(blk, bb, k);
		if (tt_store_put(s, key, blk, bb))
			die("put");
	}
	free(blk);
	tt_store_close(s);
	for (unsigned i = 0; i < n; i++) {
		FILE *f = fopen(files[i], "rb");

		if (!f || fread(&sb, sizeof(sb), 1, f) != 1)
			die(files[i]);
		heads[i].len = TT_TABLE_OFF + sb.table_bytes;
		heads[i].b = calloc(1, heads[i].len);
		rewind(f);
		if (fread(heads[i].b, 1, heads[i].len, f) != heads[i].len)
			die(files[i]);
		fclose(f);
		unlink(files[i]);
	}
}

static void write_seed(const char *target, const char *name, const void *pre, size_t pre_len,
		       const struct head *parts, unsigned n)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", corpus, target);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/seed-%s", corpus, target, name);
	f = fopen(path, "wb");
	if (!f || fwrite(pre, 1, pre_len, f) != pre_len)
		die(path);
	for (unsigned i = 0; i < n; i++)
		if (fwrite(parts[i].b, 1, parts[i].len, f) != parts[i].len)
			die(path);
	fclose(f);
}

static struct head dup_head(const struct head *h)
{
	struct head d = { malloc(h->len), h->len };

	memcpy(d.b, h->b, h->len);
	return d;
}

static struct tt_superblock *copy(struct head *h, unsigned c)
{
	return (struct tt_superblock *)(h->b + c * TT_SB_SIZE);
}

/* Apply @edit to both copies, reseal them (fuzz_seal would too: ctl says). */
static struct head crafted(const struct head *base, void (*edit)(struct tt_superblock *))
{
	struct head h = dup_head(base);

	for (unsigned c = 0; c < TT_SB_COPIES; c++) {
		edit(copy(&h, c));
		copy(&h, c)->fp_hash = tt_sum_fingerprint(&copy(&h, c)->fp);
		copy(&h, c)->sb_sum = tt_sum_superblock(copy(&h, c));
	}
	return h;
}

static void e_version2(struct tt_superblock *sb) { sb->version = 2; }
static void e_magic2(struct tt_superblock *sb) { memcpy(sb->magic, "TUTTIKV2", 8); sb->version = 2; }
static void e_incompat(struct tt_superblock *sb) { sb->feat.incompat = 1; }
static void e_ro_compat(struct tt_superblock *sb) { sb->feat.ro_compat = 1; }
static void e_compat(struct tt_superblock *sb) { sb->feat.compat = 1ull << 5; sb->pad[100] = 7; }
static void e_flags(struct tt_superblock *sb) { sb->flags = 1; }
static void e_pad(struct tt_superblock *sb) { sb->pad[0] = 1; }
static void e_fp_reserved(struct tt_superblock *sb) { sb->fp.reserved[1] = 3; }

/* R = n_layers * n_spans wraps a u32 to 0: no data region at all. */
static void e_wrap_objs(struct tt_superblock *sb)
{
	sb->n_layers = sb->fp.n_layers = 1u << 16;
	sb->n_spans = 1u << 16;
}

/* span_bytes rounds up to a stride that wraps a u32 to 0. */
static void e_wrap_stride(struct tt_superblock *sb)
{
	sb->span_bytes = 0xfffff001u;
	sb->obj_stride = 0;
}

/* n_slots * 64 wraps: a table "smaller" than its records. */
static void e_wrap_table(struct tt_superblock *sb)
{
	sb->n_slots = (1ull << 58) + 16;
}

static void e_member_bytes_wrap(struct tt_superblock *sb)
{
	sb->member_bytes = UINT64_MAX - 4095;
}

/* A store formatted before the bytes-written counter. */
static void e_no_written(struct tt_superblock *sb)
{
	sb->feat.compat = 0;
	memset(&sb->written, 0, sizeof(sb->written));
}
/* A count without the feature: reserved bytes, so damage. */
static void e_written_no_feature(struct tt_superblock *sb)
{
	sb->feat.compat = 0;
	sb->written.bytes = 5;
}
static void e_stripe0(struct tt_superblock *sb) { sb->stripe_objs = 0; }
static void e_index_out(struct tt_superblock *sb) { sb->member_index = 7; }

static struct tt_slot_record *rec(struct head *h, unsigned i)
{
	return (struct tt_slot_record *)(h->b + TT_TABLE_OFF) + i;
}

int main(int argc, char **argv)
{
	struct head small[1], odd[1], evicted[1], two[2], two_b[2], three[3], four[4], h, m[3];
	const uint8_t all = CTL_SEAL_ALL;
	uint8_t pre[2];

	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	corpus = argv[1];
	mkdir(corpus, 0755);
	if (!mkdtemp(tmpdir))
		die("mkdtemp");

	make_store("small", 1, params(4, 2, 0, 0, 16), 3, small);
	make_store("odd", 1, params(3, 1, 5000, 3, 70), 10, odd);
	make_store("evicted", 1, params(2, 2, 0, 0, 4), 7, evicted);
	make_store("two", 2, params(4, 2, 0, 2, 16), 5, two);
	make_store("two_b", 2, params(4, 2, 0, 2, 16), 1, two_b);
	make_store("three", 3, params(2, 2, 0, 1, 12), 6, three);
	make_store("four", 4, params(2, 1, 0, 3, 8), 4, four);

	/* fuzz_open: ctl, one member's head */
	pre[0] = all;
	write_seed("fuzz_open", "small", pre, 1, small, 1);
	write_seed("fuzz_open", "two-member0", pre, 1, two, 1);
	pre[0] = all | CTL_RDONLY;
	write_seed("fuzz_open", "odd-rdonly", pre, 1, odd, 1);
	pre[0] = all | CTL_REPAIR;
	write_seed("fuzz_open", "evicted-repair", pre, 1, evicted, 1);
	pre[0] = all | (2 << 4);
	write_seed("fuzz_open", "truncated", pre, 1, small, 1);
	pre[0] = all | (3 << 4);
	write_seed("fuzz_open", "bigger", pre, 1, small, 1);
	pre[0] = all | (1 << 4);
	write_seed("fuzz_open", "input-size", pre, 1, small, 1);

	static const struct {
		const char *name;
		void (*edit)(struct tt_superblock *);
	} edits[] = {
		{ "version2", e_version2 }, { "magic2", e_magic2 },
		{ "incompat", e_incompat }, { "ro-compat", e_ro_compat },
		{ "compat", e_compat }, { "flags", e_flags }, { "pad", e_pad },
		{ "fp-reserved", e_fp_reserved }, { "wrap-objs", e_wrap_objs },
		{ "wrap-stride", e_wrap_stride }, { "wrap-table", e_wrap_table },
		{ "member-bytes-wrap", e_member_bytes_wrap }, { "stripe0", e_stripe0 },
		{ "index-out", e_index_out }, { "no-written", e_no_written },
		{ "written-no-feature", e_written_no_feature },
	};
	for (unsigned i = 0; i < TT_ARRAY_SIZE(edits); i++) {
		char name[64];

		h = crafted(&small[0], edits[i].edit);
		pre[0] = all;
		write_seed("fuzz_open", edits[i].name, pre, 1, &h, 1);
		pre[0] = all | CTL_RDONLY;
		snprintf(name, sizeof(name), "%s-rdonly", edits[i].name);
		write_seed("fuzz_open", name, pre, 1, &h, 1);
		pre[0] = all;
		h.len = TT_TABLE_OFF;
		write_seed("fuzz_probe", edits[i].name, pre, 1, &h, 1);
		free(h.b);
	}

	/* Records: a damaged one, a duplicate key, a span mismatch. */
	h = dup_head(&small[0]);
	rec(&h, 1)->data_sum ^= 1;	/* rec_sum now wrong */
	pre[0] = CTL_SEAL_FP | CTL_SEAL_A | CTL_SEAL_B;
	write_seed("fuzz_open", "bad-record", pre, 1, &h, 1);
	pre[0] = CTL_SEAL_FP | CTL_SEAL_A | CTL_SEAL_B | CTL_REPAIR;
	write_seed("fuzz_open", "bad-record-repair", pre, 1, &h, 1);
	free(h.b);
	h = dup_head(&small[0]);
	memcpy(rec(&h, 2)->key, rec(&h, 0)->key, TT_KEY_BYTES);
	rec(&h, 2)->commit_seq = rec(&h, 0)->commit_seq + 10;
	pre[0] = all;
	write_seed("fuzz_open", "duplicate-key", pre, 1, &h, 1);
	free(h.b);
	h = dup_head(&small[0]);
	rec(&h, 0)->span_bytes += 1;
	write_seed("fuzz_open", "span-mismatch", pre, 1, &h, 1);
	free(h.b);
	h = dup_head(&small[0]);
	h.b[100] ^= 0x40;	/* copy A damaged, B intact */
	pre[0] = CTL_SEAL_FP | CTL_SEAL_B | CTL_SEAL_RECS;
	write_seed("fuzz_open", "copy-a-damaged", pre, 1, &h, 1);
	h.b[TT_SB_SIZE + 100] ^= 0x40;
	pre[0] = CTL_SEAL_FP | CTL_SEAL_RECS;
	write_seed("fuzz_open", "both-damaged", pre, 1, &h, 1);
	free(h.b);

	/* Copy B's count: torn (checksum fails), disagreeing with copy A, near 2^64. */
	h = dup_head(&small[0]);
	copy(&h, 1)->written.bytes ^= 1;
	pre[0] = CTL_SEAL_FP | CTL_SEAL_A | CTL_SEAL_RECS;
	write_seed("fuzz_open", "written-b-torn", pre, 1, &h, 1);
	h.len = TT_TABLE_OFF;
	write_seed("fuzz_probe", "written-b-torn", pre, 1, &h, 1);
	free(h.b);
	h = dup_head(&small[0]);
	copy(&h, 1)->created_ns++;
	pre[0] = all;
	write_seed("fuzz_open", "written-b-disagrees", pre, 1, &h, 1);
	h.len = TT_TABLE_OFF;
	write_seed("fuzz_probe", "written-b-disagrees", pre, 1, &h, 1);
	free(h.b);
	h = dup_head(&small[0]);
	copy(&h, 1)->written.bytes = UINT64_MAX - 100;
	write_seed("fuzz_open", "written-huge", pre, 1, &h, 1);
	free(h.b);

	/* fuzz_members: ctl, count/order byte, members' heads back to back */
	pre[0] = all;
	pre[1] = 1;
	write_seed("fuzz_members", "two-in-order", pre, 2, two, 2);
	pre[1] = 1 | (1 << 2);
	write_seed("fuzz_members", "two-reversed", pre, 2, two, 2);
	pre[1] = 2 | (4 << 2);
	write_seed("fuzz_members", "three-shuffled", pre, 2, three, 3);
	pre[1] = 3 | (17 << 2);
	write_seed("fuzz_members", "four-shuffled", pre, 2, four, 4);
	pre[1] = 0;
	write_seed("fuzz_members", "one", pre, 2, small, 1);
	m[0] = two[0];
	m[1] = two_b[1];
	pre[1] = 1;
	write_seed("fuzz_members", "foreign-member", pre, 2, m, 2);
	m[1] = two[0];
	write_seed("fuzz_members", "same-member-twice", pre, 2, m, 2);
	write_seed("fuzz_members", "three-given-two", pre, 2, three, 2);
	m[0] = two[0];
	m[1] = dup_head(&two[1]);
	copy(&m[1], 1)->written.since_ns ^= 1;	/* member 1's copy B torn */
	pre[0] = CTL_SEAL_FP | CTL_SEAL_A | CTL_SEAL_RECS;
	write_seed("fuzz_members", "two-copy-b-torn", pre, 2, m, 2);
	free(m[1].b);
	pre[0] = all | CTL_RDONLY;
	pre[1] = 2 | (3 << 2);
	write_seed("fuzz_members", "three-rdonly", pre, 2, three, 3);

	/* fuzz_probe: ctl, a member's first bytes */
	pre[0] = all;
	h = dup_head(&small[0]);
	h.len = TT_TABLE_OFF;
	write_seed("fuzz_probe", "small", pre, 1, &h, 1);
	h.len = TT_SB_SIZE;
	write_seed("fuzz_probe", "copy-a-only", pre, 1, &h, 1);
	h.len = 8;
	write_seed("fuzz_probe", "magic-only", pre, 1, &h, 1);
	memset(h.b, 0, TT_SB_SIZE);
	h.len = TT_TABLE_OFF;
	pre[0] = 0;
	write_seed("fuzz_probe", "copy-b-only", pre, 1, &h, 1);
	write_seed("fuzz_probe", "empty", pre, 1, &h, 0);
	free(h.b);

	/* fuzz_plan: struct plan_input */
	{
		struct plan_input pi;
		const struct head one = { (uint8_t *)&pi, sizeof(pi) };

		memset(&pi, 0, sizeof(pi));
		pi = (struct plan_input){ .n_layers = 32, .kv_heads = 8, .head_dim = 128,
					  .block_size = 16, .member_bytes = 64ull << 30,
					  .n_members = 1 };
		write_seed("fuzz_plan", "llama3-8b-fill", NULL, 0, &one, 1);
		pi = (struct plan_input){ .n_layers = 2, .kv_heads = 1, .head_dim = 64,
					  .block_size = 16, .n_slots = 16, .stripe_objs = 3,
					  .n_members = 2, .probe_slot = 5, .probe_layer = 1 };
		write_seed("fuzz_plan", "tiny-two", NULL, 0, &one, 1);
		pi = (struct plan_input){ .n_layers = TT_MAX_LAYERS, .n_spans = TT_MAX_SPANS,
					  .span_bytes = TT_MAX_SPAN_BYTES, .n_slots = TT_MAX_SLOTS,
					  .n_members = 1 };
		write_seed("fuzz_plan", "overflow", NULL, 0, &one, 1);
		pi = (struct plan_input){ .n_layers = 1, .kv_heads = 1, .head_dim = 1,
					  .block_size = 1, .dtype = 3, .member_bytes = 1ull << 63,
					  .n_members = 16, .stripe_objs = 1 };
		write_seed("fuzz_plan", "huge-device", NULL, 0, &one, 1);
		pi = (struct plan_input){ .n_layers = 1, .kv_heads = UINT32_MAX,
					  .head_dim = UINT32_MAX, .block_size = UINT32_MAX,
					  .n_slots = 1, .n_members = 1 };
		write_seed("fuzz_plan", "dims-overflow", NULL, 0, &one, 1);
	}
	rmdir(tmpdir);
	return 0;
}
