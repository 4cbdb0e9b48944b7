// SPDX-License-Identifier: Apache-2.0
/*
 * Description: real device errors under the store on the kqueue engine.
 * QEMU's blkdebug driver under one drive (run-qemu.sh --media-errors) fails
 * reads of some sectors and writes of others with EIO, which its NVMe
 * controller returns as an error status; the rules sleep until a
 * write-zeroes reaches the drive, which this program asks the host for
 * through QMP once its store is written.  Then: exactly the blocks whose
 * objects cover a bad sector fail, with -EIO, through get and through
 * read transactions over all slots (adjacent objects of other blocks
 * merged into one command with the bad one), with verification on and
 * off; none is taken for corrupt, dropped or repaired away; check counts
 * them unreadable; a write over a bad sector fails that block and commits
 * nothing; and a reopened store still holds every block.
 *
 *   kq_media NODE_A NODE_B DRIVE MEMBER READ_SECTORS WRITE_SECTORS
 *
 * MEMBER: the store member (0: NODE_A, 1: NODE_B) on DRIVE (QEMU's drive
 * id); SECTORS: comma-separated 512-byte sectors of it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "tutti/error.h"
#include "tutti/store.h"
#include "hil.h"

#define L		4u
#define S		2u
#define SPAN		4096u
#define OBJS		(L * S)
#define BLOCK		(OBJS * SPAN)
#define SLOTS		256u
#define MAX_BAD		8u
#define BATCH		64u	/* blocks per read transaction */
#define KEYS		(SLOTS + 16u)	/* the first SLOTS fill the store; more are written later */

struct media {
	const char *paths[2];
	unsigned member;		/* the member on the failing drive */
	uint64_t rd[MAX_BAD], wr[MAX_BAD];	/* bad byte offsets on it */
	unsigned n_rd, n_wr;
	struct tt_store *s;
	int64_t slot_of[KEYS];		/* key -> slot, -1 */
	int key_at[SLOTS];		/* slot -> key, -1 */
	uint8_t bad[SLOTS];		/* slot covers a bad read sector */
	unsigned n_bad;
	uint8_t *mem;			/* BATCH blocks, object-major */
	uint8_t val[BLOCK], buf[BLOCK];
};

static void media_key(unsigned k, uint8_t key[TT_KEY_BYTES])
{
	uint64_t x = 0x6d656469610000ull + k;	/* not the fault model's keys */

	tt_key_from_bytes(&x, sizeof(x), key);
}

static void value_of(unsigned k, uint8_t *out)
{
	uint64_t x = k * 0x9e3779b97f4a7c15ull + 0x5eed;

	for (size_t i = 0; i < BLOCK; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(out + i, &x, 8);
	}
}

static unsigned parse_sectors(const char *list, uint64_t *out)
{
	char *copy = strdup(list), *save = NULL;
	unsigned n = 0;

	for (char *p = strtok_r(copy, ",", &save); p && n < MAX_BAD; p = strtok_r(NULL, ",", &save))
		out[n++] = strtoull(p, NULL, 0) * 512;
	free(copy);
	return n;
}

static struct tt_store *open_store(struct media *m, uint32_t flags)
{
	struct tt_open_params op = { .engine = "kqueue", .flags = flags };
	struct tt_store *s = NULL;

	if (tt_store_open(m->paths, 2, &op, &s))
		bail("open the store (%s): %s", flags & TT_OPEN_NO_VERIFY ? "verification off" :
		     "verification on", tt_errmsg());
	return s;
}

/* The slot whose object covers byte @off of the failing member, or -1. */
static int64_t slot_covering(struct media *m, uint64_t off)
{
	for (uint64_t slot = 0; slot < SLOTS; slot++)
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t k = 0; k < S; k++) {
				struct tt_extent e;

				tt_store_locate(m->s, slot, l, k, &e);
				if (e.member == m->member && off >= e.off && off < e.off + e.len)
					return (int64_t)slot;
			}
	return -1;
}

static void setup(struct media *m)
{
	struct tt_format_params p;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "hil/media-errors");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = L;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;	/* span 4 KiB */
	p.n_slots = SLOTS;
	p.stripe_objs = 8;
	p.flags = TT_FORMAT_FORCE;
	if (tt_store_format(m->paths, 2, &p))
		bail("format %s %s: %s", m->paths[0], m->paths[1], tt_errmsg());
	m->s = open_store(m, 0);
	for (unsigned k = 0; k < SLOTS; k++) {
		uint8_t key[TT_KEY_BYTES];

		media_key(k, key);
		value_of(k, m->val);
		if (tt_store_put(m->s, key, m->val, BLOCK))
			bail("put block %u (before the errors are live): %s", k, tt_errmsg());
		if (tt_store_lookup(m->s, key, 1, &m->slot_of[k]) != 1 && m->slot_of[k] < 0)
			bail("block %u not found after its put", k);
	}
	memset(m->key_at, 0xff, sizeof(m->key_at));
	for (unsigned k = 0; k < SLOTS; k++)
		m->key_at[m->slot_of[k]] = (int)k;
	for (unsigned k = SLOTS; k < KEYS; k++)
		m->slot_of[k] = -1;
	for (unsigned i = 0; i < m->n_rd; i++) {
		int64_t slot = slot_covering(m, m->rd[i]);

		if (slot < 0)
			bail("bad read sector at byte %llu of member %u lies outside the store's data",
			     (unsigned long long)m->rd[i], m->member);
		m->n_bad += !m->bad[slot];
		m->bad[slot] = 1;
	}
	check(m->n_bad == m->n_rd, "%u blocks written; the %u bad read sectors lie in %u distinct "
	      "blocks", SLOTS, m->n_rd, m->n_bad);
}

/* Ask the host to wake the drive's error rules; wait until a read of one fails. */
static void errors_on(struct media *m, const char *drive)
{
	int fd = open(m->paths[m->member], O_RDONLY);
	char sec[512];
	int live = 0;

	if (fd < 0)
		bail("open %s: %s", m->paths[m->member], strerror(errno));
	check(pread(fd, sec, 512, (off_t)(m->rd[0] & ~511ull)) == 512,
	      "a read of a bad sector succeeds while the rules sleep");
	printf("HIL-QMP {\"execute\":\"human-monitor-command\",\"arguments\":{\"command-line\":"
	       "\"qemu-io %s \\\"write -z 400M 4k\\\"\"}}\n", drive);
	fflush(stdout);
	for (int i = 0; i < 200 && !live; i++) {
		usleep(100000);
		live = pread(fd, sec, 512, (off_t)(m->rd[0] & ~511ull)) < 0 && errno == EIO;
	}
	close(fd);
	if (!live)
		bail("the media errors never went live (QMP qemu-io write -z on drive %s)", drive);
	check(1, "the media errors are live (the module's read of a bad sector fails with EIO)");
}

/* Every key through get: -EIO exactly for the bad blocks, else the exact bytes. */
static void t_gets(struct media *m, const char *how)
{
	unsigned wrong = 0, failed = 0, bad_ok = 0, other = 0;

	for (unsigned k = 0; k < KEYS; k++) {
		uint8_t key[TT_KEY_BYTES];
		int ret;

		if (m->slot_of[k] < 0)
			continue;
		media_key(k, key);
		value_of(k, m->val);
		ret = tt_store_get(m->s, key, m->buf, BLOCK);
		if (m->bad[m->slot_of[k]]) {
			failed += ret == -EIO;
			bad_ok += ret == 0;
			other += ret && ret != -EIO;
		} else {
			wrong += !ret && memcmp(m->buf, m->val, BLOCK);
			other += ret != 0;
		}
	}
	check(failed == m->n_bad && !bad_ok && !other && !wrong,
	      "get (%s): the %u blocks over a bad sector fail with -EIO (%u did), every other "
	      "block reads its exact bytes (%u wrong, %u other errors)", how, m->n_bad, failed,
	      wrong, other);
}

/* Read transactions over all slots, in slot order: neighbours share commands. */
static void t_reads(struct media *m, const char *how)
{
	uint64_t base[OBJS], stride[OBJS];
	struct tt_memmap map = { L, S, base, stride };
	unsigned failed = 0, wrong = 0, other = 0;

	for (unsigned o = 0; o < OBJS; o++) {
		base[o] = (uint64_t)(uintptr_t)(m->mem + (size_t)o * BATCH * SPAN);
		stride[o] = SPAN;
	}
	for (unsigned first = 0; first < SLOTS; first += BATCH) {
		int64_t slots[BATCH];
		uint32_t ids[BATCH];
		int32_t st[BATCH];
		unsigned n = 0;
		struct tt_txn *t;

		for (unsigned s = first; s < first + BATCH && s < SLOTS; s++)
			if (m->key_at[s] >= 0) {
				ids[n] = n;
				slots[n++] = s;
			}
		memset(m->mem, 0x5a, (size_t)OBJS * BATCH * SPAN);
		if (tt_store_read_begin(m->s, slots, n, &t))
			bail("read_begin of slots %u..: %s", first, tt_errmsg());
		for (uint32_t l = 0; l < L; l++)
			tt_txn_layer(t, l, &map, ids);
		tt_txn_finish(t, st);
		for (unsigned i = 0; i < n; i++) {
			int bad = m->bad[slots[i]];

			failed += bad && st[i] == -EIO;
			other += bad ? st[i] != -EIO : st[i] != 0;
			if (bad || st[i])
				continue;
			value_of((unsigned)m->key_at[slots[i]], m->val);
			for (unsigned o = 0; o < OBJS; o++)
				wrong += !!memcmp(m->mem + (size_t)o * BATCH * SPAN + (size_t)i * SPAN,
						  m->val + (size_t)o * SPAN, SPAN);
		}
	}
	check(failed == m->n_bad && !other && !wrong,
	      "read transactions over every slot (%s): exactly the %u blocks over a bad sector "
	      "fail with -EIO (%u did; %u other blocks with a wrong status), the rest read exact "
	      "(%u objects wrong)", how, m->n_bad, failed, other, wrong);
}

/* Nothing taken for corrupt or dropped: every block still indexed where it was. */
static void t_kept(struct media *m, const char *when)
{
	struct tt_store_info info;
	unsigned moved = 0, n = 0;

	for (unsigned k = 0; k < KEYS; k++) {
		uint8_t key[TT_KEY_BYTES];
		int64_t slot = -1;

		if (m->slot_of[k] < 0)
			continue;
		n++;
		media_key(k, key);
		tt_store_lookup(m->s, key, 1, &slot);
		moved += slot != m->slot_of[k];
	}
	tt_store_get_info(m->s, &info);
	check(!moved && !info.stats.corrupt_blocks && info.n_committed == n,
	      "%s: all %u blocks still stored where they were (%u missing or moved, %llu taken "
	      "for corrupt, %llu committed)", when, n, moved,
	      (unsigned long long)info.stats.corrupt_blocks, (unsigned long long)info.n_committed);
}

static void t_check(struct media *m)
{
	struct tt_check_result r = { 0 }, rr = { 0 };
	int ret = tt_store_check(m->s, 0, UINT64_MAX, 0, &r, NULL, 0);

	check(ret == 0 && r.unreadable == m->n_bad && !r.bad && !r.bad_records,
	      "check: %llu unreadable (the %u bad blocks), %llu bad, %llu bad records (ret %d)",
	      (unsigned long long)r.unreadable, m->n_bad, (unsigned long long)r.bad,
	      (unsigned long long)r.bad_records, ret);
	ret = tt_store_check(m->s, 0, UINT64_MAX, 1, &rr, NULL, 0);
	check(ret == 0 && rr.unreadable == m->n_bad && !rr.repaired,
	      "check --repair: %llu unreadable, %llu repaired (an I/O error is never repaired "
	      "away)", (unsigned long long)rr.unreadable, (unsigned long long)rr.repaired);
	t_kept(m, "after check --repair");
}

/* Free slot @slot (its key forgotten): the store, full otherwise, reuses it. */
static void free_slot(struct media *m, int64_t slot)
{
	int k = m->key_at[slot];

	if (k < 0)
		return;
	if (tt_store_invalidate(m->s, &slot, 1) != 1)
		bail("invalidate slot %lld: %s", (long long)slot, tt_errmsg());
	m->slot_of[k] = -1;
	m->key_at[slot] = -1;
}

/*
 * Writes over a bad sector: a transaction of three blocks into the bad
 * block's slot and its two neighbours (their objects adjacent on disk, so
 * written by shared commands) fails exactly the one over the bad sector and
 * commits the other two; a put into that slot fails and stores nothing.
 */
static void t_write(struct media *m)
{
	int64_t slot = slot_covering(m, m->wr[0]), want[3], got;
	uint64_t base[OBJS], stride[OBJS];
	struct tt_memmap map = { L, S, base, stride };
	uint8_t keys[3 * TT_KEY_BYTES], key[TT_KEY_BYTES];
	uint32_t ids[3] = { 0, 1, 2 };
	unsigned fail = 0, ok = 0, stored = 0, wrong = 0;
	int32_t st[3];
	struct tt_txn *t;
	int ret;

	if (slot < 1 || slot + 1 >= SLOTS)
		bail("the bad write sector is in no inner slot (%lld)", (long long)slot);
	for (int i = 0; i < 3; i++) {
		want[i] = slot - 1 + i;
		if (m->bad[want[i]])
			bail("the bad write sector's neighbourhood holds a bad read sector");
		free_slot(m, want[i]);
		media_key(SLOTS + 1 + (unsigned)i, keys + i * TT_KEY_BYTES);
	}
	for (unsigned o = 0; o < OBJS; o++) {
		base[o] = (uint64_t)(uintptr_t)(m->mem + (size_t)o * BATCH * SPAN);
		stride[o] = SPAN;
		for (unsigned i = 0; i < 3; i++) {
			value_of(SLOTS + 1 + i, m->val);
			memcpy(m->mem + (size_t)o * BATCH * SPAN + (size_t)i * SPAN,
			       m->val + (size_t)o * SPAN, SPAN);
		}
	}
	if (tt_store_write_begin(m->s, keys, 3, &t))
		bail("write_begin of 3 blocks: %s", tt_errmsg());
	for (unsigned i = 0; i < 3; i++) {
		int present;
		int64_t at = tt_txn_slot(t, i, &present);

		if (at < slot - 1 || at > slot + 1)
			bail("block %u of the write went to slot %lld, not next to slot %lld", i,
			     (long long)at, (long long)slot);
		want[i] = at;
	}
	for (uint32_t l = 0; l < L; l++)
		tt_txn_layer(t, l, &map, ids);
	tt_txn_finish(t, st);
	for (unsigned i = 0; i < 3; i++) {
		int64_t at = -1;

		tt_store_lookup(m->s, keys + i * TT_KEY_BYTES, 1, &at);
		if (want[i] == slot) {
			fail += st[i] == -EIO && at < 0;
			continue;
		}
		ok += st[i] == 0;
		stored += at == want[i];
		if (at == want[i]) {
			value_of(SLOTS + 1 + i, m->val);
			wrong += tt_store_get(m->s, keys + i * TT_KEY_BYTES, m->buf, BLOCK) ||
				 memcmp(m->buf, m->val, BLOCK);
			m->slot_of[SLOTS + 1 + i] = at;
			m->key_at[at] = (int)(SLOTS + 1 + i);
		}
	}
	check(fail == 1 && ok == 2 && stored == 2 && !wrong,
	      "a write of 3 blocks into slots %lld..%lld (adjacent objects: shared commands) over "
	      "a bad sector in slot %lld: that block fails with -EIO and is not stored (%u), the "
	      "other two commit and read back exact (%u ok, %u stored, %u wrong)",
	      (long long)slot - 1, (long long)slot + 1, (long long)slot, fail, ok, stored, wrong);
	/* The one free slot left is the bad one. */
	media_key(SLOTS + 9, key);
	value_of(SLOTS + 9, m->val);
	ret = tt_store_put(m->s, key, m->val, BLOCK);
	tt_store_lookup(m->s, key, 1, &got);
	check(ret == -EIO && got < 0, "put over the bad write sector: %d (-EIO), not stored "
	      "(slot %lld)", ret, (long long)got);
	t_kept(m, "after the failed writes");
}

int main(int argc, char **argv)
{
	struct media *m = calloc(1, sizeof(*m));

	if (argc != 7 || !m)
		bail("usage: kq_media NODE_A NODE_B DRIVE MEMBER READ_SECTORS WRITE_SECTORS");
	m->paths[0] = argv[1];
	m->paths[1] = argv[2];
	m->member = (unsigned)atoi(argv[4]);
	m->n_rd = parse_sectors(argv[5], m->rd);
	m->n_wr = parse_sectors(argv[6], m->wr);
	if (m->member > 1 || !m->n_rd || !m->n_wr)
		bail("kq_media: MEMBER 0 or 1, at least one read and one write sector");
	m->mem = hil_pages((size_t)OBJS * BATCH * SPAN);
	setup(m);
	errors_on(m, argv[3]);
	t_gets(m, "verification on");
	t_reads(m, "verification on");
	t_kept(m, "after the reads");
	t_check(m);
	t_write(m);
	tt_store_close(m->s);
	m->s = open_store(m, TT_OPEN_NO_VERIFY);
	t_kept(m, "reopened");
	t_gets(m, "reopened, verification off");
	t_reads(m, "reopened, verification off");
	tt_store_close(m->s);
	return tap_failed != 0;
}
