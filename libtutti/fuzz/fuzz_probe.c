// SPDX-License-Identifier: Apache-2.0
/*
 * Description: the superblock parsers on raw bytes: tt_sb_probe() (what
 * either copy holds), tt_sb_parse() (every check open makes on it, for a
 * member of a chosen size), tt_sb_parse_extra() (copy B's bytes-written
 * count), tt_store_probe() through a file, and format's
 * refusal: format must refuse, and leave untouched, exactly the members the
 * probe finds a Tutti superblock in, and a store it makes must open.
 *
 * Input: a control byte (fuzz.h; its size bits pick the member size the
 * parser is told: member_bytes, the input's length, one byte short, or
 * 2^64 - 1), then a member's first bytes.
 */
#include "fuzz.h"

static uint64_t told_size(const uint8_t *buf, size_t len, unsigned ctl)
{
	const struct tt_superblock *sb = fuzz_main_copy(buf, len);

	switch (CTL_SIZE(ctl)) {
	case 0:
		return sb ? sb->member_bytes : len;
	case 1:
		return len;
	case 2:
		return sb && sb->member_bytes ? sb->member_bytes - 1 : 0;
	}
	return UINT64_MAX;
}

/* A store tt_sb_parse() accepted: its every object lies inside its member. */
static void accepted_is_sound(const struct tt_superblock *sb, const struct tt_probe *pr,
			      uint64_t size, unsigned flags)
{
	uint64_t table, data_off, need;
	struct tt_geometry g;
	struct tt_extent e;

	FUZZ_ASSERT(pr->kind == TT_PROBE_STORE && pr->version == TT_FORMAT_VERSION);
	FUZZ_ASSERT(!(pr->feat.incompat & ~TT_FEAT_INCOMPAT_KNOWN));
	if (flags & TT_SB_WRITABLE)
		FUZZ_ASSERT(!(pr->feat.ro_compat & ~TT_FEAT_RO_COMPAT_KNOWN));
	tt_sb_geometry(sb, &g);
	FUZZ_ASSERT(!tt_geometry_check(&g, &table, &data_off, &need));
	FUZZ_ASSERT(need == sb->member_bytes && need <= size);
	FUZZ_ASSERT(data_off == sb->data_off && table == sb->table_bytes);
	FUZZ_ASSERT(sb->table_off + sb->table_bytes <= sb->data_off);
	FUZZ_ASSERT(sb->member_index < sb->n_members);
	e = tt_locate(&g, g.n_slots - 1, g.n_layers - 1, g.n_spans - 1);
	FUZZ_ASSERT(e.member < g.n_members && e.off >= data_off);
	FUZZ_ASSERT(e.off <= need && need - e.off >= e.len);
}

/*
 * Copy B's count (TT_FEAT_COMPAT_WRITTEN) of a superblock tt_sb_parse()
 * accepted: never part of the superblock open compares across members, and
 * taken only from a valid copy B that is, but for the count and the feature
 * bits, that superblock.
 */
static void written_is_sound(const uint8_t *buf, size_t len, const struct tt_superblock *sb)
{
	static const struct tt_sb_written zero;
	const struct tt_superblock *b = (const struct tt_superblock *)(buf + TT_SB_SIZE);
	struct tt_sb_extra x;

	FUZZ_ASSERT(!memcmp(&sb->written, &zero, sizeof(zero)));
	tt_sb_parse_extra(buf, len, sb, &x);
	FUZZ_ASSERT(x.copy_a_ok == 0 || x.copy_a_ok == 1);
	if (x.copy_a_ok)
		FUZZ_ASSERT(len >= TT_SB_SIZE && ((const struct tt_superblock *)buf)->sb_sum ==
			    tt_sum_superblock((const struct tt_superblock *)buf));
	if (!x.written_ok) {
		FUZZ_ASSERT(!memcmp(&x.written, &zero, sizeof(zero)));
		return;
	}
	FUZZ_ASSERT(sb->feat.compat & TT_FEAT_COMPAT_WRITTEN);
	FUZZ_ASSERT(len >= TT_TABLE_OFF && b->sb_sum == tt_sum_superblock(b));
	FUZZ_ASSERT(b->feat.compat & TT_FEAT_COMPAT_WRITTEN);
	FUZZ_ASSERT(!memcmp(&x.written, &b->written, sizeof(x.written)));
	FUZZ_ASSERT(b->member_index == sb->member_index && !memcmp(b->uuid, sb->uuid, 16));
}

static struct tt_format_params small_params(void)
{
	struct tt_format_params p;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "fuzz/probe");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = 2;
	p.fp.kv_heads = 1;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;
	p.n_slots = 2;
	return p;
}

/* format without force refuses exactly what the probe calls a store. */
static void format_obeys_probe(const uint8_t *buf, size_t len, const struct tt_probe *pr)
{
	struct tt_format_params p = small_params();
	struct tt_open_params op = { .engine = "psync", .flags = TT_OPEN_RDONLY };
	struct tt_probe after;
	struct tt_store *s;
	char path[32];
	const char *paths[1] = { path };
	int fd = fuzz_memfd(0), rc;

	fuzz_path(0, path, sizeof(path));
	rc = tt_store_format(paths, 1, &p);
	if (pr->kind != TT_PROBE_NONE) {
		uint8_t *back = malloc(len + 1);

		FUZZ_ASSERT(rc == -EEXIST);
		FUZZ_ASSERT(back && lseek(fd, 0, SEEK_END) == (off_t)len);
		FUZZ_ASSERT(pread(fd, back, len + 1, 0) == (ssize_t)len);
		FUZZ_ASSERT(!memcmp(back, buf, len));
		free(back);
		return;
	}
	FUZZ_ASSERT(rc == 0);
	FUZZ_ASSERT(!tt_store_probe(path, &after) && after.kind == TT_PROBE_STORE);
	FUZZ_ASSERT(!tt_store_open(paths, 1, &op, &s));
	tt_store_close(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tt_superblock sb;
	struct tt_probe pr, pf;
	unsigned ctl, flags;
	uint64_t told;
	uint8_t *buf;
	char path[32];
	size_t len;
	int rc;

	if (size < 1)
		return 0;
	ctl = data[0];
	len = size - 1;
	buf = fuzz_copy(data + 1, len);
	fuzz_seal(buf, len, ctl);

	tt_sb_probe(buf, len, &pr, NULL);
	FUZZ_ASSERT(pr.kind <= TT_PROBE_DAMAGED);
	told = told_size(buf, len, ctl);
	flags = (ctl & CTL_RDONLY) ? 0 : TT_SB_WRITABLE;
	rc = tt_sb_parse("fuzz", buf, len, told, flags, &sb);
	FUZZ_ASSERT(rc <= 0);
	if (!rc) {
		accepted_is_sound(&sb, &pr, told, flags);
		written_is_sound(buf, len, &sb);
	}

	fuzz_fill_member(0, buf, len, len);
	fuzz_path(0, path, sizeof(path));
	FUZZ_ASSERT(!tt_store_probe(path, &pf));
	FUZZ_ASSERT(pf.kind == pr.kind && pf.version == pr.version);
	FUZZ_ASSERT(!memcmp(&pf.feat, &pr.feat, sizeof(pf.feat)));
	format_obeys_probe(buf, len, &pr);
	free(buf);
	return 0;
}
