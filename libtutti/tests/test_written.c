// SPDX-License-Identifier: Apache-2.0
/*
 * Description: the store's own bytes-written counter (TT_FEAT_COMPAT_WRITTEN,
 * docs/format.md and docs/operations.md): format sets the feature and starts
 * each member's count with its own writes; every block put adds its objects
 * (at their stride, on the member tt_locate() names) and its slot-table page;
 * the count survives close/reopen (plus the save at close), is saved every
 * save_every bytes, survives a SIGKILL losing at most what was counted since
 * the last save; a damaged copy B costs only its member's count (restarted,
 * and rewritten by a writable open); a damaged copy A freezes that member's
 * copy B; a store without the feature is never written a superblock; copy A
 * never changes after format.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "../src/store/store_impl.h"
#include "../src/support/util.h"
#include "tap.h"
#include "testutil.h"

#define N_LAYERS 2u
#define OBJ 4096u			/* span bytes = stride: 16 tokens x 2 heads x 64 x 2 B */
#define BLOCK (N_LAYERS * 2u * OBJ)	/* one block's bytes on disk (2 spans) */
#define PAGE 4096u			/* one slot-table page per commit */

static char dir[] = "/tmp/tutti-written-XXXXXX";
static char path0[256], path1[256];
static const char *paths[2] = { path0, path1 };
static uint8_t blk[BLOCK] __attribute__((aligned(4096)));

static struct tt_format_params params(void)
{
	struct tt_format_params p;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "test/written");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = N_LAYERS;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;
	p.n_slots = 8;
	p.stripe_objs = 2;	/* objects alternate over both members */
	return p;
}

static void fresh(void)
{
	struct tt_format_params p = params();

	unlink(path0);
	unlink(path1);
	if (tt_store_format(paths, 2, &p))
		tap_ok(0, "format: %s", tt_errmsg());
}

static struct tt_store *open2(uint32_t flags, const char *engine)
{
	struct tt_open_params op = { .flags = flags, .engine = engine ? engine : "psync" };
	struct tt_store *s = NULL;

	if (tt_store_open(paths, 2, &op, &s)) {
		tap_ok(0, "open: %s", tt_errmsg());
		return NULL;
	}
	return s;
}

static struct tt_written written(struct tt_store *s)
{
	struct tt_written w;

	tt_store_get_written(s, &w);
	return w;
}

static void read_copy(const char *path, unsigned copy, struct tt_superblock *sb)
{
	int fd = open(path, O_RDONLY);

	if (fd < 0 || pread(fd, sb, sizeof(*sb), (off_t)copy * TT_SB_SIZE) != sizeof(*sb))
		tap_ok(0, "read %s copy %u", path, copy);
	close(fd);
}

static void write_copy(const char *path, unsigned copy, const struct tt_superblock *sb)
{
	int fd = open(path, O_WRONLY);

	if (fd < 0 || pwrite(fd, sb, sizeof(*sb), (off_t)copy * TT_SB_SIZE) != sizeof(*sb))
		tap_ok(0, "write %s copy %u", path, copy);
	close(fd);
}

/* Flip one byte of @path at @off (a damaged copy: its checksum fails). */
static void flip(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	if (fd < 0 || pread(fd, &b, 1, off) != 1)
		tap_ok(0, "read %s", path);
	b ^= 0x40;
	if (pwrite(fd, &b, 1, off) != 1)
		tap_ok(0, "write %s", path);
	close(fd);
}

/* Put blocks @from..@to-1 (keys key_of(i)); adds each block's bytes per member to @want. */
static int put_range(struct tt_store *s, unsigned from, unsigned to, uint64_t *want)
{
	for (unsigned i = from; i < to; i++) {
		uint8_t key[TT_KEY_BYTES];
		int64_t slot;

		key_of(i, key);
		fill(blk, sizeof(blk), i);
		if (tt_store_put(s, key, blk, sizeof(blk)))
			return -1;
		if (!want)
			continue;
		tt_store_lookup(s, key, 1, &slot);
		for (uint32_t l = 0; l < N_LAYERS; l++)
			for (uint32_t k = 0; k < 2; k++) {
				struct tt_extent e;

				tt_store_locate(s, (uint64_t)slot, l, k, &e);
				want[e.member] += e.len;
			}
		want[0] += PAGE;	/* the commit's slot-table page */
	}
	return 0;
}

static int check_clean(struct tt_store *s)
{
	struct tt_check_result res = { 0 };
	int ret = tt_store_check(s, 0, 8, 0, &res, NULL, 0);

	return ret == 0 && !res.bad && !res.bad_records && !res.unreadable;
}

static void test_count_and_reopen(void)
{
	struct tt_superblock a0, a1, a_after, b, sb_before[2];
	uint64_t want[2], table;
	struct tt_written w;
	struct tt_store *s;

	fresh();
	read_copy(path0, 0, &a0);
	read_copy(path1, 0, &a1);
	table = a0.table_bytes;
	tap_eq(a0.feat.compat, TT_FEAT_COMPAT_WRITTEN, "format sets the compat feature in copy A");
	read_copy(path0, 1, &b);
	tap_eq(b.feat.compat, TT_FEAT_COMPAT_WRITTEN, "and in copy B");
	tap_eq(b.written.bytes, 2 * TT_TABLE_OFF + table,
	       "member 0's copy B counts format's writes: headers, table, superblocks");
	tap_ok(b.written.since_ns == a0.created_ns && b.written.saved_ns == a0.created_ns,
	       "counting since format");
	tap_ok(a0.written.bytes == 0 && a0.written.since_ns == 0, "copy A holds no count");

	s = open2(0, NULL);
	if (!s)
		return;
	w = written(s);
	tap_eq(w.state, TT_WRITTEN_KEPT, "state kept");
	tap_eq(w.not_saving, TT_WRITTEN_SAVING, "a writable open saves");
	tap_eq(w.save_every, TT_WRITTEN_SAVE_BYTES, "default save interval");
	tap_eq(w.n_members, 2, "two members");
	want[0] = 2 * TT_TABLE_OFF + table;
	want[1] = 2 * TT_TABLE_OFF;
	tap_ok(w.member[0].bytes == want[0] && w.member[1].bytes == want[1],
	       "open reads each member's count");
	tap_eq(w.since_open, 0, "nothing written by this handle yet");

	tap_eq(put_range(s, 0, 6, want), 0, "put 6 blocks");
	w = written(s);
	tap_eq(w.member[0].bytes, want[0], "member 0: + its objects at their stride + a table page per commit");
	tap_eq(w.member[1].bytes, want[1], "member 1: + its objects");
	tap_ok(want[1] > 2 * TT_TABLE_OFF && want[0] > 2 * TT_TABLE_OFF + table + 6 * PAGE,
	       "both members took data");
	tap_eq(w.since_open, 6 * (BLOCK + PAGE), "since open: 6 x (block bytes + one table page)");
	tap_eq(w.bytes, want[0] + want[1], "total is the members' sum");
	tap_eq(w.member[0].saved, 2 * TT_TABLE_OFF + table, "nothing saved yet (1 GiB interval)");
	{
		/* The same key again is not written again. */
		uint8_t key[TT_KEY_BYTES];

		key_of(2, key);
		fill(blk, sizeof(blk), 2);
		tt_store_put(s, key, blk, sizeof(blk));
		tap_eq(written(s).bytes, want[0] + want[1], "a block already stored adds nothing");
	}
	/* Reads write nothing. */
	{
		uint8_t key[TT_KEY_BYTES];

		key_of(1, key);
		tt_store_get(s, key, blk, sizeof(blk));
		tap_eq(written(s).bytes, want[0] + want[1], "a read adds nothing");
	}
	tt_store_close(s);

	read_copy(path0, 0, &a_after);
	tap_ok(!memcmp(&a_after, &a0, sizeof(a0)), "copy A of member 0 unchanged by use");
	read_copy(path1, 0, &a_after);
	tap_ok(!memcmp(&a_after, &a1, sizeof(a1)), "copy A of member 1 unchanged by use");
	read_copy(path0, 1, &sb_before[0]);
	read_copy(path1, 1, &sb_before[1]);
	tap_eq(sb_before[0].written.bytes, want[0] + TT_SB_SIZE, "close saved member 0 (+ the save itself)");
	tap_eq(sb_before[1].written.bytes, want[1] + TT_SB_SIZE, "close saved member 1");

	s = open2(TT_OPEN_RDONLY, NULL);
	if (!s)
		return;
	w = written(s);
	tap_eq(w.member[0].bytes, want[0] + TT_SB_SIZE, "reopen: member 0's count survived");
	tap_eq(w.member[1].bytes, want[1] + TT_SB_SIZE, "reopen: member 1's count survived");
	tap_eq(w.not_saving, TT_WRITTEN_READ_ONLY, "a read-only open does not save");
	tap_ok(w.member[0].since_ns == a0.created_ns, "still counting since format");
	tap_ok(check_clean(s), "check clean");
	tt_store_close(s);
	read_copy(path0, 1, &b);
	tap_ok(!memcmp(&b, &sb_before[0], sizeof(b)), "a read-only open writes nothing");

	/* A writable open that writes nothing writes no superblock either. */
	s = open2(0, NULL);
	tt_store_close(s);
	read_copy(path0, 1, &b);
	tap_ok(!memcmp(&b, &sb_before[0], sizeof(b)), "an idle writable open leaves copy B alone");
}

static void test_periodic_save(void)
{
	struct tt_written w;
	struct tt_store *s;
	uint64_t want[2] = { 0, 0 };

	fresh();
	setenv("TUTTI_WRITTEN_SAVE_BYTES", "1", 1);
	s = open2(0, NULL);
	unsetenv("TUTTI_WRITTEN_SAVE_BYTES");
	if (!s)
		return;
	w = written(s);
	tap_eq(w.save_every, 1, "TUTTI_WRITTEN_SAVE_BYTES sets the interval");
	want[0] = w.member[0].bytes;
	want[1] = w.member[1].bytes;
	put_range(s, 0, 3, want);
	w = written(s);
	tap_eq(w.saves, 3, "one save per commit at a 1-byte interval");
	tap_eq(w.member[0].saved, w.member[0].bytes, "member 0 saved up to date");
	tap_eq(w.member[1].saved, w.member[1].bytes, "member 1 saved up to date");
	tap_eq(w.member[0].bytes, want[0] + 3 * TT_SB_SIZE, "each save counts its own 4 KiB");
	tt_store_close(s);

	setenv("TUTTI_WRITTEN_SAVE_BYTES", "12x", 1);
	{
		struct tt_open_params op = { .engine = "psync" };

		tap_eq((unsigned long long)-tt_store_open(paths, 2, &op, &s), EINVAL,
		       "a bad TUTTI_WRITTEN_SAVE_BYTES is refused: %s", tt_errmsg());
	}
	unsetenv("TUTTI_WRITTEN_SAVE_BYTES");
}

/* A writer killed (SIGKILL) mid-way: at most what it counted since its last save is lost. */
static void test_sigkill(void)
{
	const uint64_t every = 3 * BLOCK;
	struct tt_written last, w;
	struct tt_store *s;
	int pfd[2], status;
	pid_t pid;
	ssize_t n;

	fresh();
	if (pipe(pfd)) {
		tap_ok(0, "pipe");
		return;
	}
	pid = fork();
	if (pid == 0) {
		char every_s[32];

		close(pfd[0]);
		snprintf(every_s, sizeof(every_s), "%llu", (unsigned long long)every);
		setenv("TUTTI_WRITTEN_SAVE_BYTES", every_s, 1);
		s = open2(0, NULL);
		if (!s)
			_exit(1);
		for (unsigned i = 0; i < 11; i++) {	/* evicts too: 8 slots */
			if (put_range(s, i, i + 1, NULL))
				_exit(1);
			w = written(s);
			if (write(pfd[1], &w, sizeof(w)) != sizeof(w))
				_exit(1);
		}
		raise(SIGKILL);
		_exit(1);
	}
	close(pfd[1]);
	memset(&last, 0, sizeof(last));
	while ((n = read(pfd[0], &w, sizeof(w))) == sizeof(w))
		last = w;
	close(pfd[0]);
	waitpid(pid, &status, 0);
	tap_ok(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "writer killed by SIGKILL");
	tap_ok(last.saves > 0 && last.member[0].saved < last.member[0].bytes,
	       "it had saved, and had counted more since");
	s = open2(TT_OPEN_RDONLY, NULL);
	if (!s)
		return;
	w = written(s);
	tap_eq(w.state, TT_WRITTEN_KEPT, "after the kill: counts kept");
	for (unsigned i = 0; i < 2; i++) {
		tap_eq(w.member[i].bytes, last.member[i].saved,
		       "member %u: the last saved count (never more than written)", i);
		tap_ok(last.member[i].bytes - w.member[i].bytes < every,
		       "member %u: lost %llu bytes, under save_every", i,
		       (unsigned long long)(last.member[i].bytes - w.member[i].bytes));
	}
	tap_ok(check_clean(s), "check clean after the kill");
	tt_store_close(s);
}

static void test_damaged_copy_b(void)
{
	struct tt_superblock a_before, a_after, b;
	struct tt_written w;
	struct tt_store *s;
	uint64_t t0;

	fresh();
	s = open2(0, NULL);
	put_range(s, 0, 4, NULL);
	tt_store_close(s);
	read_copy(path1, 0, &a_before);
	flip(path1, TT_SB_SIZE + 330);	/* inside copy B's count: a torn save */

	t0 = tt_now_ns();
	s = open2(TT_OPEN_RDONLY, NULL);
	if (!s)
		return;
	w = written(s);
	tap_eq(w.state, TT_WRITTEN_RESTARTED, "damaged copy B: the store opens, count restarted");
	tap_ok(w.member[1].restarted && w.member[1].bytes == 0 && w.member[1].since_ns >= t0,
	       "member 1 counts from 0, since this open");
	tap_ok(!w.member[0].restarted && w.member[0].bytes > 0, "member 0 keeps its count");
	tap_ok(check_clean(s), "check clean");
	tt_store_close(s);

	s = open2(0, NULL);
	if (!s)
		return;
	w = written(s);
	tap_eq(w.saves, 1, "a writable open rewrites the damaged copy B at once");
	tap_eq(w.member[1].saved, TT_SB_SIZE, "saved: the rewrite itself");
	t0 = w.member[1].since_ns;
	tt_store_close(s);
	read_copy(path1, 0, &a_after);
	tap_ok(!memcmp(&a_before, &a_after, sizeof(a_after)), "copy A untouched");
	s = open2(TT_OPEN_RDONLY, NULL);
	if (!s)
		return;
	w = written(s);
	tap_eq(w.state, TT_WRITTEN_KEPT, "reopened: kept again");
	tap_ok(w.member[1].since_ns == t0 && w.member[1].since_ns > a_after.created_ns,
	       "member 1 counts since the restart, not since format");
	tt_store_close(s);

	/* A valid copy B that is not this member's superblock plus a count: not taken. */
	read_copy(path1, 1, &b);
	b.created_ns++;
	b.sb_sum = tt_sum_superblock(&b);
	write_copy(path1, 1, &b);
	s = open2(TT_OPEN_RDONLY, NULL);
	if (!s)
		return;
	tap_ok(written(s).member[1].restarted, "a copy B disagreeing with copy A: count not taken");
	tt_store_close(s);
}

static void test_damaged_copy_a(void)
{
	struct tt_superblock b0, b1;
	struct tt_written w;
	struct tt_store *s;

	fresh();
	flip(path0, 100);	/* copy A of member 0 */
	read_copy(path0, 1, &b0);
	read_copy(path1, 1, &b1);
	s = open2(0, NULL);
	if (!s)
		return;
	w = written(s);
	tap_eq(w.state, TT_WRITTEN_KEPT, "damaged copy A: counts read (from copy B)");
	tap_eq(w.not_saving, TT_WRITTEN_COPY_A_DAMAGED, "reported");
	tap_ok(!w.member[0].saving && w.member[1].saving, "member 0 is not saved, member 1 is");
	put_range(s, 0, 3, NULL);
	tt_store_close(s);
	{
		struct tt_superblock b;

		read_copy(path0, 1, &b);
		tap_ok(!memcmp(&b, &b0, sizeof(b)), "member 0's copy B (its only good one) untouched");
		read_copy(path1, 1, &b);
		tap_ok(b.written.bytes > b1.written.bytes, "member 1's copy B saved");
	}
	s = open2(0, NULL);
	tap_ok(s != NULL, "still opens");
	tt_store_close(s);
}

/* A store without the feature: counted since open, never a superblock written. */
static void test_store_without_the_feature(void)
{
	struct tt_superblock sb, before[2][2], after;
	struct tt_written w;
	struct tt_store *s;

	fresh();
	for (unsigned m = 0; m < 2; m++) {
		read_copy(paths[m], 0, &sb);	/* as format wrote it before the feature */
		sb.feat.compat = 0;
		sb.sb_sum = tt_sum_superblock(&sb);
		write_copy(paths[m], 0, &sb);
		write_copy(paths[m], 1, &sb);
		before[m][0] = before[m][1] = sb;
	}
	s = open2(0, NULL);
	if (!s)
		return;
	w = written(s);
	tap_eq(w.state, TT_WRITTEN_NONE, "no feature: no count on disk");
	tap_eq(w.not_saving, TT_WRITTEN_NO_COUNTER, "nothing saved");
	tap_ok(w.member[0].bytes == 0 && w.member[0].since_ns > sb.created_ns, "counts from this open");
	put_range(s, 0, 2, NULL);
	w = written(s);
	tap_eq(w.since_open, 2 * (BLOCK + PAGE), "still counted in memory");
	tap_eq(w.bytes, w.since_open, "the total is what this open wrote");
	tt_store_close(s);
	for (unsigned m = 0; m < 2; m++)
		for (unsigned c = 0; c < 2; c++) {
			read_copy(paths[m], c, &after);
			tap_ok(!memcmp(&after, &before[m][c], sizeof(after)),
			       "member %u copy %u never rewritten", m, c);
		}

	/* Without the feature, the count's bytes are reserved: nonzero is damage. */
	read_copy(path0, 0, &sb);
	sb.written.bytes = 5;
	sb.sb_sum = tt_sum_superblock(&sb);
	write_copy(path0, 0, &sb);
	write_copy(path0, 1, &sb);
	{
		struct tt_open_params op = { .engine = "psync", .flags = TT_OPEN_RDONLY };

		tap_eq((unsigned long long)-tt_store_open(paths, 2, &op, &s), EINVAL,
		       "a count without the feature is damage: %s", tt_errmsg());
	}
}

/* A newer libtutti's compat bit: its copy B is not rewritten. */
static void test_unknown_feature_freezes(void)
{
	struct tt_superblock sb, b_before, b_after;
	struct tt_written w;
	struct tt_store *s;

	fresh();
	for (unsigned m = 0; m < 2; m++)
		for (unsigned c = 0; c < 2; c++) {
			read_copy(paths[m], c, &sb);
			sb.feat.compat |= 1ull << 9;
			sb.sb_sum = tt_sum_superblock(&sb);
			write_copy(paths[m], c, &sb);
		}
	read_copy(path0, 1, &b_before);
	s = open2(0, NULL);
	if (!s)
		return;
	w = written(s);
	tap_eq(w.state, TT_WRITTEN_KEPT, "unknown compat bit: counts read");
	tap_eq(w.not_saving, TT_WRITTEN_UNKNOWN_FEATURES, "but not saved");
	put_range(s, 0, 2, NULL);
	tt_store_close(s);
	read_copy(path0, 1, &b_after);
	tap_ok(!memcmp(&b_before, &b_after, sizeof(b_after)), "copy B untouched");
}

/* Writes through a data path (devpath.h) count as the host path's do. */
static void test_data_path(void)
{
	uint64_t base[N_LAYERS * 2], stride[N_LAYERS * 2];
	struct tt_memmap map = { N_LAYERS, 2, base, stride };
	uint8_t keys[2 * TT_KEY_BYTES], *mem = aligned_alloc(4096, 2 * BLOCK);
	uint32_t ids[2] = { 1, 0 };
	uint64_t before, want[2] = { 0, 0 };
	struct tt_written w0, w;
	struct tt_store *s;
	struct tt_txn *t;

	fresh();
	s = open2(0, NULL);
	if (!s || !mem)
		return;
	for (unsigned m = 0; m < N_LAYERS * 2; m++) {
		base[m] = (uint64_t)(uintptr_t)mem + (uint64_t)m * OBJ;
		stride[m] = BLOCK;
	}
	fill(mem, 2 * BLOCK, 7);
	key_of(100, keys);
	key_of(101, keys + TT_KEY_BYTES);
	w0 = written(s);
	before = w0.bytes;
	tap_eq(tt_store_set_devpath(s, &tt_devpath_host, NULL), 0, "the host reference data path");
	tap_eq(tt_store_write_begin(s, keys, 2, &t), 0, "write 2 blocks");
	tap_eq(tt_txn_bind_device(t, ids), 0, "bound to the data path");
	for (uint32_t l = 0; l < N_LAYERS; l++)
		tt_txn_layer(t, l, &map, NULL);
	tap_eq(tt_txn_finish(t, NULL), 2, "both committed");
	for (unsigned i = 0; i < 2; i++) {
		int64_t slot;

		tt_store_lookup(s, keys + i * TT_KEY_BYTES, 1, &slot);
		for (uint32_t l = 0; l < N_LAYERS; l++)
			for (uint32_t k = 0; k < 2; k++) {
				struct tt_extent e;

				tt_store_locate(s, (uint64_t)slot, l, k, &e);
				want[e.member] += e.len;
			}
	}
	w = written(s);
	tap_eq(w.bytes - before, 2 * BLOCK + PAGE, "2 blocks and one table page counted");
	tap_eq(w.member[1].bytes - w0.member[1].bytes, want[1], "member 1: its objects");
	tap_eq(w.member[0].bytes - w0.member[0].bytes, want[0] + PAGE, "member 0: its objects + the page");
	tt_store_close(s);
	free(mem);
}

/* A save that fails costs nothing but the save. */
static void test_failed_save(void)
{
	struct tt_written w;
	struct tt_store *s;
	uint64_t saved0;

	fresh();
	setenv("TUTTI_WRITTEN_SAVE_BYTES", "1", 1);
	s = open2(0, "fault:psync");
	unsetenv("TUTTI_WRITTEN_SAVE_BYTES");
	if (!s)
		return;
	saved0 = written(s).member[0].saved;
	/* One put flushes its data, its record, then the save's copy-B writes. */
	tap_eq(tt_store_set_faults(s, "flush:nth=2"), 0, "arm: fail the save's flush");
	tap_eq(put_range(s, 0, 1, NULL), 0, "the put succeeds");
	w = written(s);
	tap_ok(w.save_errors == 1 && w.saves == 0, "the save failed, counted");
	tap_eq(w.member[0].saved, saved0, "saved count unchanged");
	tap_ok(w.member[0].bytes > w.member[0].saved, "the count stays in memory");
	tt_store_set_faults(s, "");
	put_range(s, 1, 2, NULL);
	w = written(s);
	tap_ok(w.saves == 1 && w.member[0].saved == w.member[0].bytes, "the next save catches up");
	tap_ok(check_clean(s), "check clean");
	tt_store_close(s);
}

int main(void)
{
	if (!mkdtemp(dir))
		return 1;
	snprintf(path0, sizeof(path0), "%s/m0.img", dir);
	snprintf(path1, sizeof(path1), "%s/m1.img", dir);
	unsetenv("TUTTI_WRITTEN_SAVE_BYTES");
	unsetenv("TUTTI_FAULTS");

	test_count_and_reopen();
	test_periodic_save();
	test_sigkill();
	test_damaged_copy_b();
	test_damaged_copy_a();
	test_store_without_the_feature();
	test_unknown_feature_freezes();
	test_data_path();
	test_failed_save();

	unlink(path0);
	unlink(path1);
	rmdir(dir);
	return tap_done();
}
