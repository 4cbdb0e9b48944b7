// SPDX-License-Identifier: Apache-2.0
/*
 * Description: format evolution and on-disk limits (docs/format.md): format
 * refuses, and leaves untouched, any member holding a Tutti superblock of
 * any version in either copy; a store of another version or with unknown
 * incompatible features does not open, one with unknown read-only-compatible
 * features opens read-only only, unknown compatible features are ignored;
 * reserved fields must be zero; a superblock whose sizes wrap or disagree
 * with its geometry is refused; format's arithmetic never wraps.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "../src/store/store_impl.h"
#include "../src/support/util.h"
#include "tap.h"

static char dir[] = "/tmp/tutti-format-XXXXXX";
static char path[256], path2[256];
static const char *paths[2] = { path, path2 };

static struct tt_format_params small_params(void)
{
	struct tt_format_params p;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "test/format");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = 2;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;	/* span 4 KiB */
	p.n_slots = 8;
	return p;
}

static void fresh_store(void)
{
	struct tt_format_params p = small_params();

	unlink(path);
	if (tt_store_format(paths, 1, &p))
		tap_ok(0, "format: %s", tt_errmsg());
}

static void read_sb(unsigned copy, struct tt_superblock *sb)
{
	int fd = open(path, O_RDONLY);

	if (pread(fd, sb, sizeof(*sb), (off_t)copy * TT_SB_SIZE) != sizeof(*sb))
		tap_ok(0, "read superblock %u", copy);
	close(fd);
}

/* Write @sb into copy @copy (resealed if @seal). */
static void write_sb(unsigned copy, struct tt_superblock *sb, int seal)
{
	int fd = open(path, O_WRONLY);

	if (seal) {
		sb->fp_hash = tt_sum_fingerprint(&sb->fp);
		sb->sb_sum = tt_sum_superblock(sb);
	}
	if (pwrite(fd, sb, sizeof(*sb), (off_t)copy * TT_SB_SIZE) != sizeof(*sb))
		tap_ok(0, "write superblock %u", copy);
	close(fd);
}

/* Edit both copies of a fresh store and reseal them. */
static void edit_store(void (*edit)(struct tt_superblock *))
{
	struct tt_superblock sb;

	fresh_store();
	for (unsigned c = 0; c < TT_SB_COPIES; c++) {
		read_sb(c, &sb);
		edit(&sb);
		write_sb(c, &sb, 1);
	}
}

static int open_store(uint32_t flags, struct tt_store **s)
{
	struct tt_open_params op = { .flags = flags, .engine = "psync" };

	*s = NULL;
	return tt_store_open(paths, 1, &op, s);
}

static uint64_t file_sum(void)
{
	int fd = open(path, O_RDONLY);
	uint8_t buf[4096];
	uint64_t h = 1469598103934665603ull;
	ssize_t n;

	while ((n = read(fd, buf, sizeof(buf))) > 0)
		for (ssize_t i = 0; i < n; i++)
			h = (h ^ buf[i]) * 1099511628211ull;
	close(fd);
	return h;
}

/* format (without force) refuses @what and changes no byte; force formats. */
static void format_refuses(const char *what)
{
	struct tt_format_params p = small_params();
	struct tt_probe pr;
	uint64_t before = file_sum();
	int ret = tt_store_format(paths, 1, &p);

	tap_eq((unsigned long long)-ret, EEXIST, "format refuses %s: %s", what, tt_errmsg());
	tap_ok(file_sum() == before, "format left %s untouched", what);
	tap_ok(!tt_store_probe(path, &pr) && pr.kind != TT_PROBE_NONE, "probe: %s holds a store (%u)",
	       what, pr.kind);
	p.flags = TT_FORMAT_FORCE;
	tap_eq(tt_store_format(paths, 1, &p), 0, "format --force over %s", what);
	tap_ok(!tt_store_probe(path, &pr) && pr.kind == TT_PROBE_STORE, "probe after force: store");
}

static void e_version2(struct tt_superblock *sb) { sb->version = 2; }
static void e_incompat(struct tt_superblock *sb) { sb->feat.incompat = 1ull << 3; }
static void e_ro_compat(struct tt_superblock *sb) { sb->feat.ro_compat = 1ull << 1; }
static void e_compat(struct tt_superblock *sb) { sb->feat.compat = 1ull << 7; sb->pad[10] = 9; }
static void e_flags(struct tt_superblock *sb) { sb->flags = 4; }
static void e_pad(struct tt_superblock *sb) { sb->pad[3000] = 1; }
static void e_fp_reserved(struct tt_superblock *sb) { sb->fp.reserved[0] = 1; }
static void e_wrap_objs(struct tt_superblock *sb)
{
	sb->n_layers = sb->fp.n_layers = 1u << 16;
	sb->n_spans = 1u << 16;	/* n_layers * n_spans == 0 in 32 bits */
}
static void e_wrap_stride(struct tt_superblock *sb)
{
	sb->span_bytes = 0xfffff001u;	/* rounds up to 0 in 32 bits */
	sb->obj_stride = 0;
}
static void e_wrap_table(struct tt_superblock *sb)
{
	sb->n_slots = (1ull << 58) + 8;	/* n_slots * 64 wraps to 512 */
}
static void e_member_bytes(struct tt_superblock *sb) { sb->member_bytes += 4096; }
static void e_stripe0(struct tt_superblock *sb) { sb->stripe_objs = 0; }
static void e_sb_size(struct tt_superblock *sb) { sb->sb_size = 8192; }

static void test_refusals_at_open(void)
{
	static const struct {
		const char *what;
		void (*edit)(struct tt_superblock *);
		int err;
	} cases[] = {
		{ "format version 2", e_version2, -EOPNOTSUPP },
		{ "unknown incompat feature", e_incompat, -EOPNOTSUPP },
		{ "nonzero flags", e_flags, -EINVAL },
		{ "nonzero padding", e_pad, -EINVAL },
		{ "nonzero fingerprint reserved", e_fp_reserved, -EINVAL },
		{ "layers x spans wrapping 32 bits", e_wrap_objs, -EINVAL },
		{ "span rounding up past 32 bits", e_wrap_stride, -EINVAL },
		{ "table size wrapping 64 bits", e_wrap_table, -EINVAL },
		{ "member_bytes not what the geometry needs", e_member_bytes, -EINVAL },
		{ "stripe unit 0", e_stripe0, -EINVAL },
		{ "sb_size 8192", e_sb_size, -EINVAL },
	};
	struct tt_store *s;

	for (unsigned i = 0; i < TT_ARRAY_SIZE(cases); i++) {
		edit_store(cases[i].edit);
		tap_eq((unsigned long long)-open_store(TT_OPEN_RDONLY, &s),
		       (unsigned long long)-cases[i].err, "%s: refused read-only: %s",
		       cases[i].what, tt_errmsg());
		tt_store_close(s);
		tap_eq((unsigned long long)-open_store(0, &s), (unsigned long long)-cases[i].err,
		       "%s: refused writable", cases[i].what);
		tt_store_close(s);
		format_refuses(cases[i].what);
	}
	edit_store(e_version2);
	open_store(0, &s);
	tap_ok(strstr(tt_errmsg(), "format version 2") && strstr(tt_errmsg(), "upgrade"),
	       "version message names the version and the way out: %s", tt_errmsg());
	edit_store(e_incompat);
	open_store(0, &s);
	tap_ok(strstr(tt_errmsg(), "incompatible features 0x8") != NULL,
	       "incompat message names the bits: %s", tt_errmsg());
}

static void test_ro_compat(void)
{
	struct tt_features f;
	struct tt_store *s;
	uint8_t key[TT_KEY_BYTES] = { 1 }, blk[2 * 2 * 4096] = { 0 };

	edit_store(e_ro_compat);
	tap_eq((unsigned long long)-open_store(0, &s), EROFS,
	       "unknown ro_compat: writable open refused: %s", tt_errmsg());
	tap_ok(strstr(tt_errmsg(), "read-only") != NULL, "message says read-only works");
	tap_eq(open_store(TT_OPEN_RDONLY, &s), 0, "unknown ro_compat: read-only open works");
	if (s) {
		tt_store_get_features(s, &f);
		tap_eq(f.ro_compat, 1ull << 1, "features report the ro_compat bit");
		tap_ok(tt_store_put(s, key, blk, sizeof(blk)) < 0, "no write through it");
		tt_store_close(s);
	}
	format_refuses("a store with an unknown ro_compat feature");
}

static void test_compat(void)
{
	struct tt_features f;
	struct tt_store *s;
	uint8_t key[TT_KEY_BYTES] = { 2 }, in[2 * 2 * 4096], out[sizeof(in)];

	edit_store(e_compat);	/* the bit may explain the nonzero padding */
	tap_eq(open_store(0, &s), 0, "unknown compat: opens writable: %s", tt_errmsg());
	if (!s)
		return;
	tt_store_get_features(s, &f);
	tap_eq(f.compat, 1ull << 7, "features report the compat bit");
	memset(in, 0x5a, sizeof(in));
	tap_eq(tt_store_put(s, key, in, sizeof(in)), 0, "put into it");
	tap_eq(tt_store_get(s, key, out, sizeof(out)), 0, "get back");
	tap_ok(!memcmp(in, out, sizeof(in)), "same bytes");
	tt_store_close(s);
	tap_eq(open_store(0, &s), 0, "reopens: the compat bit survives use");
	if (s) {
		tt_store_get_features(s, &f);
		tap_eq(f.compat, 1ull << 7, "still set");
		tt_store_close(s);
	}
	format_refuses("a store with an unknown compat feature");
}

/* A superblock of any version, valid or damaged, in either copy stops format. */
static void test_format_detection(void)
{
	struct tt_superblock sb;
	struct tt_probe pr;
	uint8_t zero[TT_SB_SIZE] = { 0 };
	int fd;

	fresh_store();
	format_refuses("a valid store");

	fresh_store();
	read_sb(0, &sb);
	memcpy(sb.magic, "TUTTIKV2", 8);
	sb.version = 2;
	write_sb(0, &sb, 1);
	write_sb(1, &sb, 1);
	tap_ok(!tt_store_probe(path, &pr) && pr.kind == TT_PROBE_OTHER_VERSION &&
	       pr.version == 2, "probe: TUTTIKV2 is another version");
	format_refuses("a store with magic TUTTIKV2");

	fresh_store();
	fd = open(path, O_WRONLY);
	tap_ok(pwrite(fd, zero, sizeof(zero), 0) == sizeof(zero), "copy A zeroed");
	close(fd);
	format_refuses("a store with copy B only");

	fresh_store();
	read_sb(1, &sb);
	sb.version = 2;
	write_sb(1, &sb, 1);
	tap_ok(!tt_store_probe(path, &pr) && pr.kind == TT_PROBE_OTHER_VERSION,
	       "probe: a copy of a newer version wins over a valid one (half-done upgrade)");
	{
		struct tt_store *s;

		tap_eq((unsigned long long)-open_store(TT_OPEN_RDONLY, &s), EOPNOTSUPP,
		       "open refuses it");
	}
	format_refuses("a store whose copy B is version 2");

	fresh_store();
	read_sb(0, &sb);
	sb.n_slots ^= 1;	/* checksum now wrong */
	write_sb(0, &sb, 0);
	write_sb(1, &sb, 0);
	tap_ok(!tt_store_probe(path, &pr) && pr.kind == TT_PROBE_DAMAGED, "probe: damaged");
	format_refuses("a store whose both copies are damaged");

	/* Short files: probed on what they hold. */
	unlink(path);
	fd = open(path, O_CREAT | O_WRONLY, 0644);
	tap_ok(write(fd, "TUTTIKV1", 8) == 8, "8-byte file with the magic");
	close(fd);
	tap_ok(!tt_store_probe(path, &pr) && pr.kind == TT_PROBE_DAMAGED, "probe: damaged");
	format_refuses("an 8-byte file with the magic");

	unlink(path);
	fd = open(path, O_CREAT | O_WRONLY, 0644);
	tap_ok(write(fd, "not a store", 11) == 11, "a file of other bytes");
	close(fd);
	tap_ok(!tt_store_probe(path, &pr) && pr.kind == TT_PROBE_NONE, "probe: none");
	{
		struct tt_format_params p = small_params();

		tap_eq(tt_store_format(paths, 1, &p), 0, "format over other bytes (no store there)");
	}
	tap_eq((unsigned long long)-tt_store_probe("/nonexistent/x", &pr), ENOENT,
	       "probe of a missing path: ENOENT");
	tap_ok(!mkfifo(path2, 0644), "a FIFO");
	tap_ok(tt_store_probe(path2, &pr) < 0, "probe refuses a FIFO (without blocking): %s",
	       tt_errmsg());
	unlink(path2);
}

/* All members' superblocks must agree but for their index. */
static void test_members_agree(void)
{
	struct tt_format_params p = small_params();
	struct tt_open_params op = { .engine = "psync" };
	struct tt_superblock sb;
	struct tt_store *s = NULL;
	int fd;

	unlink(path);
	unlink(path2);
	tap_eq(tt_store_format(paths, 2, &p), 0, "format 2 members");
	fd = open(path2, O_RDWR);
	for (unsigned c = 0; c < TT_SB_COPIES; c++) {
		tap_ok(pread(fd, &sb, sizeof(sb), c * TT_SB_SIZE) == sizeof(sb), "read member 1");
		sb.created_ns++;
		sb.sb_sum = tt_sum_superblock(&sb);
		tap_ok(pwrite(fd, &sb, sizeof(sb), c * TT_SB_SIZE) == sizeof(sb), "write member 1");
	}
	close(fd);
	tap_eq((unsigned long long)-tt_store_open(paths, 2, &op, &s), EINVAL,
	       "a member whose superblock differs is refused: %s", tt_errmsg());
	tt_store_close(s);
	unlink(path2);
}

static void test_plan_arithmetic(void)
{
	struct tt_format_params p = small_params();
	struct tt_geometry g;
	uint64_t need;

	/* Largest everything: 2^32 slots of 2^18 objects of 2^28 bytes = 2^78. */
	p.fp.n_layers = TT_MAX_LAYERS;
	p.n_spans = TT_MAX_SPANS;
	p.span_bytes = TT_MAX_SPAN_BYTES;
	p.n_slots = TT_MAX_SLOTS;
	tap_eq((unsigned long long)-tt_store_plan(&p, 1, 0, &g, &need), EFBIG,
	       "a store past 2^63 bytes is refused, not wrapped: %s", tt_errmsg());

	p = small_params();
	p.fp.block_size = p.fp.kv_heads = p.fp.head_dim = UINT32_MAX;
	tap_eq((unsigned long long)-tt_store_plan(&p, 1, 0, &g, &need), EINVAL,
	       "block x heads x dim overflowing 64 bits is refused: %s", tt_errmsg());

	p = small_params();
	p.n_slots = (uint64_t)TT_MAX_SLOTS + 1;
	tap_eq((unsigned long long)-tt_store_plan(&p, 1, 0, &g, &need), EINVAL,
	       "more slots than a u32 numbers");

	/* Filling members: 16 members of 4.08 slots' worth hold 65 slots. */
	p = small_params();
	p.n_slots = 0;
	p.fp.n_layers = 32;
	p.fp.kv_heads = 8;
	p.fp.head_dim = 64128;
	tap_eq(tt_store_plan(&p, 16, 4ull << 30, &g, &need), 0, "plan fills 16 members");
	tap_eq(g.n_slots, 65, "every slot that fits (fuzz_plan's regression)");
	tap_ok(need <= 4ull << 30, "and it fits");

	/* A huge device: capped at the slot limit, not wrapped. */
	p = small_params();
	p.n_slots = 0;
	p.fp.n_layers = 1;
	p.n_spans = 1;
	tap_eq(tt_store_plan(&p, 16, 1ull << 62, &g, &need), 0, "plan a 2^62-byte device");
	tap_eq(g.n_slots, TT_MAX_SLOTS, "slots capped at the limit");
}

static uint64_t allocated(const char *p)
{
	struct stat st;

	return stat(p, &st) ? 0 : (uint64_t)st.st_blocks * 512;
}

/* TT_FORMAT_PREALLOC: the space is held at format, and a store that cannot fit changes nothing. */
static void test_preallocate(void)
{
	struct tt_format_params p = small_params();
	struct tt_open_params op = { .engine = "psync" };
	struct tt_geometry g;
	struct tt_store *s = NULL;
	struct statvfs vfs;
	struct stat st;
	uint64_t need;

	p.n_slots = 64;
	tap_eq(tt_store_plan(&p, 2, 0, &g, &need), 0, "plan 64 slots on 2 members");
	unlink(path);
	unlink(path2);
	tap_eq(tt_store_format(paths, 2, &p), 0, "format sparse");
	tap_ok(allocated(path2) < need, "sparse: member 1 holds %llu of %llu bytes",
	       (unsigned long long)allocated(path2), (unsigned long long)need);
	p.flags = TT_FORMAT_FORCE | TT_FORMAT_PREALLOC;
	tap_eq(tt_store_format(paths, 2, &p), 0, "format --force, preallocated");
	tap_ok(allocated(path) >= need && allocated(path2) >= need,
	       "both members hold their whole size (%llu, %llu of %llu bytes)",
	       (unsigned long long)allocated(path), (unsigned long long)allocated(path2),
	       (unsigned long long)need);
	tap_eq(tt_store_open(paths, 2, &op, &s), 0, "the preallocated store opens");
	tt_store_close(s);

	/* More than the file system has: refused before a byte is written or reserved. */
	if (statvfs(dir, &vfs) || (uint64_t)vfs.f_bavail * vfs.f_frsize > (1ull << 43)) {
		tap_skip("file system free space unknown or above 8 TiB");
		return;
	}
	p = small_params();
	p.flags = TT_FORMAT_FORCE | TT_FORMAT_PREALLOC;
	p.n_slots = (uint64_t)vfs.f_bavail * vfs.f_frsize / (2 * 2 * 4096) + 1024;
	tap_eq((unsigned long long)-tt_store_format(paths, 1, &p), ENOSPC,
	       "a store larger than the free space: -ENOSPC (%s)", tt_errmsg());
	if (stat(path, &st))
		st.st_size = -1;
	tap_ok(st.st_size >= 0 && (uint64_t)st.st_size < (1ull << 30),
	       "the member kept its size (%lld bytes)", (long long)st.st_size);
	tap_eq(tt_store_open(paths, 2, &op, &s), 0, "the store that was there still opens");
	tt_store_close(s);
}

int main(void)
{
	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/m0.img", dir);
	snprintf(path2, sizeof(path2), "%s/m1.img", dir);

	test_format_detection();
	test_refusals_at_open();
	test_ro_compat();
	test_compat();
	test_members_agree();
	test_plan_arithmetic();
	test_preallocate();

	unlink(path);
	unlink(path2);
	rmdir(dir);
	return tap_done();
}
