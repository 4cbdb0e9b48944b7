// SPDX-License-Identifier: Apache-2.0
/*
 * Description: the store under I/O faults (issue 12, items 1, 2, 4, 5), on
 * the fault engine over psync and uring.  A failed layer submit fails its
 * blocks (writes commit nothing, reads report -EIO also with verification
 * off, and an intact block is never dropped as corrupt); an I/O error fails
 * exactly the blocks it touched; check --repair never clears a slot it could
 * not read; a full filesystem says ENOSPC and the store recovers by evicting;
 * a write wanting more slots than can be had is refused before anything is
 * evicted; a slot whose EMPTY record is not on disk is never reused, an
 * eviction that could not be recorded evicts nothing, and duplicate records
 * resolve to the newest commit at open.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "tap.h"
#include "testutil.h"

#define L 4
#define S 2
#define SPAN 4096
#define BLOCK (L * S * SPAN)

static char dir[] = "/tmp/tutti-faults-XXXXXX";
static char path[256];
static const char *paths[1] = { path };
static const char *eng;		/* "fault:psync" or "fault:uring" */

/* The bytes of key @k: the ground truth every read is compared with. */
static void value_of(unsigned k, uint8_t *buf)
{
	uint64_t x = k * 0x9e3779b97f4a7c15ull + 7;

	for (size_t i = 0; i < BLOCK; i++)
		buf[i] = (uint8_t)xorshift64(&x);
}

static struct tt_store *fresh(uint64_t slots, uint32_t flags)
{
	struct tt_format_params p;
	struct tt_open_params op = { .engine = eng, .flags = flags };
	struct tt_store *s = NULL;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "test/faults");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = L;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;	/* span 4 KiB */
	p.n_slots = slots;
	unlink(path);
	if (tt_store_format(paths, 1, &p) || tt_store_open(paths, 1, &op, &s))
		tap_ok(0, "[%s] format and open: %s", eng, tt_errmsg());
	return s;
}

static struct tt_store *reopen(struct tt_store *s, uint32_t flags, const char *engine)
{
	struct tt_open_params op = { .engine = engine, .flags = flags };
	struct tt_store *n = NULL;

	tt_store_close(s);
	if (tt_store_open(paths, 1, &op, &n))
		tap_ok(0, "[%s] reopen: %s", eng, tt_errmsg());
	return n;
}

/* A second, read-only view of what is on disk now (as after a crash). */
static struct tt_store *disk_view(uint32_t flags)
{
	struct tt_open_params op = { .engine = "psync",
				     .flags = TT_OPEN_RDONLY | TT_OPEN_SHARED | flags };
	struct tt_store *v = NULL;

	if (tt_store_open(paths, 1, &op, &v))
		tap_ok(0, "[%s] disk view: %s", eng, tt_errmsg());
	return v;
}

static int arm(struct tt_store *s, const char *spec)
{
	return tt_store_set_faults(s, spec);
}

static int put(struct tt_store *s, unsigned k)
{
	uint8_t key[TT_KEY_BYTES], *buf = aligned_alloc(4096, BLOCK);
	int ret;

	key_of(k, key);
	value_of(k, buf);
	ret = tt_store_put(s, key, buf, BLOCK);
	free(buf);
	return ret;
}

/* get key @k: 0 only if the bytes are exactly its value; -EILSEQ if they differ. */
static int get(struct tt_store *s, unsigned k)
{
	uint8_t key[TT_KEY_BYTES], *buf = aligned_alloc(4096, BLOCK);
	uint8_t *want = aligned_alloc(4096, BLOCK);
	int ret;

	key_of(k, key);
	value_of(k, want);
	ret = tt_store_get(s, key, buf, BLOCK);
	if (!ret && memcmp(buf, want, BLOCK))
		ret = -EILSEQ;
	free(buf);
	free(want);
	return ret;
}

static int64_t slot_of(struct tt_store *s, unsigned k)
{
	uint8_t key[TT_KEY_BYTES];
	int64_t slot;

	key_of(k, key);
	tt_store_lookup(s, key, 1, &slot);
	return slot;
}

static struct tt_store_info info_of(struct tt_store *s)
{
	struct tt_store_info info;

	tt_store_get_info(s, &info);
	return info;
}

/* Blocks k0.. back to back in memory, objects in (layer, span) order. */
struct mem {
	uint8_t *buf;
	uint64_t base[L * S], stride[L * S];
	struct tt_memmap mm;
	uint32_t ids[16];
};

static void mem_init(struct mem *m, unsigned n, unsigned k0, int fill)
{
	m->buf = aligned_alloc(4096, (size_t)n * BLOCK);
	memset(m->buf, 0, (size_t)n * BLOCK);
	for (unsigned i = 0; fill && i < n; i++)
		value_of(k0 + i, m->buf + (size_t)i * BLOCK);
	for (unsigned o = 0; o < L * S; o++) {
		m->base[o] = (uint64_t)(uintptr_t)(m->buf + (size_t)o * SPAN);
		m->stride[o] = BLOCK;
	}
	for (unsigned i = 0; i < 16; i++)
		m->ids[i] = i;
	m->mm = (struct tt_memmap){ L, S, m->base, m->stride };
}

/* Every layer submitted (failures noted, not stopped at), waited, finished. */
static int run_txn(struct tt_txn *t, struct mem *m, int32_t *status, int *layer_err)
{
	*layer_err = 0;
	for (unsigned l = 0; l < L; l++)
		if (tt_txn_layer(t, l, &m->mm, m->ids))
			*layer_err = 1;
	for (unsigned l = 0; l < L; l++)
		if (tt_txn_wait_layer(t, l))
			*layer_err = 1;
	return tt_txn_finish(t, status);
}

/* Item 1: a write whose layer 2 submit fails commits nothing of it. */
static void test_write_submit_fails(void)
{
	struct tt_store *s = fresh(16, 0);
	uint8_t keys[3 * TT_KEY_BYTES];
	int32_t st[3];
	struct mem m;
	struct tt_txn *t;
	int lerr, ret;

	mem_init(&m, 3, 10, 1);
	for (unsigned i = 0; i < 3; i++)
		key_of(10 + i, keys + i * TT_KEY_BYTES);
	tt_store_write_begin(s, keys, 3, &t);
	arm(s, "submit:write:nth=2:after=1");
	ret = run_txn(t, &m, st, &lerr);
	tap_ok(lerr, "[%s] write, layer 2 submit fails: the layer call reports it", eng);
	tap_eq(ret, 0, "[%s] write, submit fails: no block ok", eng);
	tap_ok(st[0] && st[1] && st[2], "[%s] write, submit fails: every block failed (%d %d %d)",
	       eng, st[0], st[1], st[2]);
	tap_ok(slot_of(s, 10) < 0 && slot_of(s, 11) < 0 && slot_of(s, 12) < 0,
	       "[%s] write, submit fails: nothing committed", eng);
	s = reopen(s, 0, eng);
	tap_eq(info_of(s).n_committed, 0, "[%s] write, submit fails: nothing on disk either", eng);
	tt_store_close(s);
	free(m.buf);
}

/* Item 1: a read whose layer 1 submit fails: -EIO, never dropped as corrupt. */
static void test_read_submit_fails(uint32_t flags)
{
	const char *how = flags & TT_OPEN_NO_VERIFY ? "verify off" : "verify on";
	struct tt_store *s = fresh(16, flags);
	int64_t slots[2];
	int32_t st[2];
	struct mem m;
	struct tt_txn *t;
	int lerr, ret;

	put(s, 20);
	put(s, 21);
	slots[0] = slot_of(s, 20);
	slots[1] = slot_of(s, 21);
	mem_init(&m, 2, 0, 0);
	tt_store_read_begin(s, slots, 2, &t);
	arm(s, "submit:read:nth=1:after=1");
	ret = run_txn(t, &m, st, &lerr);
	tap_eq(ret, 0, "[%s] read (%s), submit fails: no block ok", eng, how);
	tap_ok(st[0] == -EIO && st[1] == -EIO, "[%s] read (%s), submit fails: both -EIO (%d %d)",
	       eng, how, st[0], st[1]);
	tap_eq(info_of(s).stats.corrupt_blocks, 0, "[%s] read (%s): nothing taken for corrupt", eng,
	       how);
	tap_ok(get(s, 20) == 0 && get(s, 21) == 0,
	       "[%s] read (%s): both blocks still stored and exact", eng, how);
	/* The same through tt_store_get(). */
	arm(s, "submit:read:nth=3");
	ret = get(s, 20);
	tap_eq(ret, (unsigned long long)-EIO, "[%s] get (%s), submit fails: -EIO (%s)", eng, how,
	       tt_errmsg());
	tap_eq(get(s, 20), 0, "[%s] get (%s): the block is still there", eng, how);
	tt_store_close(s);
	free(m.buf);
}

/* An I/O error fails exactly the block it touched; its bytes are not served. */
static void test_io_error_is_per_block(uint32_t flags)
{
	const char *how = flags & TT_OPEN_NO_VERIFY ? "verify off" : "verify on";
	struct tt_store *s = fresh(16, flags);
	struct tt_extent e;
	int64_t slots[3];
	int32_t st[3];
	struct mem m;
	struct tt_txn *t;
	char spec[96];
	int lerr;

	for (unsigned i = 0; i < 3; i++) {
		put(s, 30 + i);
		slots[i] = slot_of(s, 30 + i);
	}
	/* Fail the object (layer 2, span 1) of block 1 wherever it lies. */
	tt_store_locate(s, (uint64_t)slots[1], 2, 1, &e);
	mem_init(&m, 3, 0, 0);
	tt_store_read_begin(s, slots, 3, &t);
	/* Read ios per layer are sorted by disk offset: count those before it. */
	{
		unsigned before = 2 * 3 * S;

		for (unsigned i = 0; i < 3; i++)
			for (unsigned k = 0; k < S; k++) {
				struct tt_extent x;

				tt_store_locate(s, (uint64_t)slots[i], 2, k, &x);
				before += x.off < e.off;
			}
		snprintf(spec, sizeof(spec), "io:read:nth=%u", before);
	}
	arm(s, spec);
	tap_eq(run_txn(t, &m, st, &lerr), 2, "[%s] read (%s), one object fails: 2 blocks ok", eng,
	       how);
	tap_ok(st[0] == 0 && st[1] == -EIO && st[2] == 0,
	       "[%s] read (%s): exactly block 1 failed, -EIO (%d %d %d)", eng, how, st[0], st[1],
	       st[2]);
	{
		uint8_t *want = aligned_alloc(4096, BLOCK);

		value_of(30, want);
		tap_ok(!memcmp(m.buf, want, BLOCK), "[%s] read (%s): block 0 exact", eng, how);
		free(want);
	}
	tap_eq(get(s, 31), 0, "[%s] read (%s): block 1 still stored and exact", eng, how);
	tt_store_close(s);
	free(m.buf);
}

/* A failed data flush commits nothing. */
static void test_flush_fails(void)
{
	struct tt_store *s = fresh(16, 0);

	arm(s, "flush:nth=0");
	tap_ok(put(s, 40) < 0, "[%s] put, data flush fails: %s", eng, tt_errmsg());
	tap_ok(slot_of(s, 40) < 0, "[%s] put, data flush fails: not committed", eng);
	tap_eq(put(s, 40), 0, "[%s] put again: works", eng);
	tt_store_close(s);
}

/* check --repair never clears what it could not read. */
static void test_check_io_errors(void)
{
	struct tt_store *s = fresh(16, 0);
	struct tt_check_result r = { 0 };
	int64_t bad[8];
	int ret;

	for (unsigned k = 0; k < 5; k++)
		put(s, 50 + k);
	arm(s, "io:read:nth=9:count=3");
	ret = tt_store_check(s, 0, UINT64_MAX, 1, &r, bad, 8);
	tap_eq(ret, 0, "[%s] check --repair with read errors: no bad slot", eng);
	tap_ok(r.bad == 0 && r.repaired == 0 && r.unreadable >= 1 && r.unreadable <= 3 &&
	       r.ok + r.unreadable == 5, "[%s] check: %llu unreadable, %llu ok, nothing repaired",
	       eng, (unsigned long long)r.unreadable, (unsigned long long)r.ok);
	memset(&r, 0, sizeof(r));
	arm(s, "submit:read:nth=3:after=2");
	ret = tt_store_check(s, 0, UINT64_MAX, 1, &r, bad, 8);
	tap_ok(ret == 0 && r.unreadable == 5 && r.bad == 0 && r.repaired == 0,
	       "[%s] check --repair, a layer's submit fails: %d, 5 unreadable (%llu), none "
	       "repaired (%llu)", eng, ret, (unsigned long long)r.unreadable,
	       (unsigned long long)r.repaired);
	arm(s, "");
	for (unsigned k = 0; k < 5; k++)
		tap_eq(get(s, 50 + k), 0, "[%s] check: key %u still stored and exact", eng, 50 + k);
	tt_store_close(s);
}

/* Item 4: a full filesystem is ENOSPC, and the store recovers by evicting. */
static void test_enospc(void)
{
	struct tt_store *s = fresh(16, 0);
	unsigned failed = 0;
	int ret;

	arm(s, "io:write:nth=3:err=ENOSPC");
	ret = put(s, 60);
	tap_eq(ret, (unsigned long long)-ENOSPC, "[%s] put on a full filesystem: -ENOSPC", eng);
	tap_ok(strstr(tt_errmsg(), "space") != NULL, "[%s] ... and says so: %s", eng, tt_errmsg());
	arm(s, "");
	for (unsigned k = 0; k < 6; k++)
		put(s, 61 + k);	/* these slots are now allocated on disk */
	/* Full from now on: writes into unallocated space fail. */
	arm(s, "full");
	for (unsigned k = 0; k < 20; k++)
		failed += put(s, 100 + k) != 0;
	tap_ok(failed <= 1, "[%s] full filesystem: %u of 20 puts failed (then it evicts)", eng,
	       failed);
	tap_eq(get(s, 119), 0, "[%s] full filesystem: the last put is stored", eng);
	tt_store_close(s);
}

/* Item 5: more new blocks than slots to be had: refused, nothing evicted. */
static void test_too_many_blocks(void)
{
	struct tt_store *s = fresh(8, 0);
	uint8_t keys[8 * TT_KEY_BYTES];
	int64_t pinned;
	struct tt_txn *r, *t = NULL;
	int ret;

	for (unsigned k = 0; k < 6; k++)
		put(s, 70 + k);
	pinned = slot_of(s, 70);
	tt_store_read_begin(s, &pinned, 1, &r);	/* pins one slot */
	for (unsigned i = 0; i < 8; i++)
		key_of(200 + i, keys + i * TT_KEY_BYTES);
	ret = tt_store_write_begin(s, keys, 8, &t);
	tap_eq(ret, (unsigned long long)-ENOSPC, "[%s] 8 new blocks, 7 slots to be had: -ENOSPC: %s",
	       eng, tt_errmsg());
	tap_ok(!strstr(tt_errmsg(), "in use by open transactions"),
	       "[%s] ... not blamed on open transactions", eng);
	tap_eq(info_of(s).n_committed, 6, "[%s] ... and nothing was evicted", eng);
	tap_eq(info_of(s).stats.evictions, 0, "[%s] ... no eviction counted", eng);
	tt_txn_abort(r);
	for (unsigned i = 0; i < 7; i++)
		key_of(300 + i, keys + i * TT_KEY_BYTES);
	tap_eq(tt_store_write_begin(s, keys, 7, &t), 0, "[%s] 7 new blocks fit by evicting", eng);
	tt_txn_abort(t);
	tt_store_close(s);
}

/* Item 2: a slot whose EMPTY record is not on disk is not reused. */
static void test_no_reuse_before_record(void)
{
	struct tt_store *s = fresh(80, 0), *v;
	int64_t k_slot;
	int ret;

	tap_eq(put(s, 80), 0, "[%s] put K", eng);
	k_slot = slot_of(s, 80);
	arm(s, "io:write:count=0");	/* every write fails */
	tap_ok(tt_store_invalidate(s, &k_slot, 1) < 0, "[%s] invalidate K, table write fails", eng);
	/* Data writes work, the table write fails. */
	arm(s, "io:write:nth=8:count=0");
	ret = put(s, 81);
	tap_ok(ret < 0, "[%s] put Z, its commit record fails: %d", eng, ret);
	tap_ok(slot_of(s, 81) != k_slot, "[%s] Z was not put in K's old slot", eng);
	/* What a crash now would leave: K intact or gone, never Z's bytes as K. */
	v = disk_view(0);
	ret = get(v, 80);
	tap_ok(ret == 0 || ret == -ENOENT, "[%s] after a crash K is exact or absent (%d)", eng, ret);
	tt_store_close(v);
	v = disk_view(TT_OPEN_NO_VERIFY);
	ret = get(v, 80);
	tap_ok(ret == 0 || ret == -ENOENT, "[%s] ... also with verification off (%d)", eng, ret);
	tt_store_close(v);
	arm(s, "");
	tap_eq(put(s, 82), 0, "[%s] with the table writable again, puts work", eng);
	tap_eq(info_of(s).n_free, 80 - 2, "[%s] and K's old slot is free again", eng);
	tt_store_close(s);
}

/* Item 2: an eviction that could not be recorded evicts nothing. */
static void test_failed_eviction_keeps_blocks(void)
{
	struct tt_store *s = fresh(4, 0);
	int ok = 1;

	for (unsigned k = 0; k < 4; k++)
		put(s, 90 + k);
	arm(s, "io:write:count=0");
	tap_ok(put(s, 99) < 0, "[%s] put into a full store, eviction record fails", eng);
	arm(s, "");
	for (unsigned k = 0; k < 4; k++)
		ok &= get(s, 90 + k) == 0;
	tap_ok(ok, "[%s] every stored block is still served, exact", eng);
	tap_eq(info_of(s).stats.evictions, 0, "[%s] no eviction counted", eng);
	s = reopen(s, 0, eng);
	ok = 1;
	for (unsigned k = 0; k < 4; k++)
		ok &= get(s, 90 + k) == 0;
	tap_ok(ok, "[%s] ... and after reopening", eng);
	tt_store_close(s);
}

/* Item 2: duplicate records of a key resolve to the newest commit. */
static void test_duplicates_newest_wins(void)
{
	struct tt_store *s = fresh(80, 0);
	int64_t old, fresh_slot;
	struct tt_check_result r = { 0 };

	for (unsigned k = 0; k < 64; k++)
		put(s, 400 + k);	/* table page 0 full */
	old = slot_of(s, 400);
	arm(s, "io:write:count=0");
	tt_store_invalidate(s, &old, 1);	/* EMPTY record not written */
	/* Re-put: data ok, the table page of the new slot written, page 0 not. */
	arm(s, "io:write:nth=8");
	put(s, 400);
	fresh_slot = slot_of(s, 400);
	tap_ok(fresh_slot >= 64, "[%s] key re-put into slot %lld (other table page)", eng,
	       (long long)fresh_slot);
	arm(s, "io:write:count=0");	/* close cannot write the table either */
	s = reopen(s, 0, "psync");
	tap_eq(slot_of(s, 400), (unsigned long long)fresh_slot,
	       "[%s] at open the newest of two records wins", eng);
	tap_eq(info_of(s).n_committed, 64, "[%s] the key counts once", eng);
	tap_eq(get(s, 400), 0, "[%s] and reads exact", eng);
	s = reopen(s, 0, "psync");
	tap_eq(tt_store_check(s, 0, UINT64_MAX, 0, &r, NULL, 0), 0,
	       "[%s] the stale record was cleared: check clean", eng);
	tap_eq(tt_store_list(s, 0, UINT64_MAX, NULL, NULL, 0), 64, "[%s] 64 committed", eng);
	tt_store_close(s);
}

static void run(const char *engine)
{
	eng = engine;
	test_write_submit_fails();
	test_read_submit_fails(0);
	test_read_submit_fails(TT_OPEN_NO_VERIFY);
	test_io_error_is_per_block(0);
	test_io_error_is_per_block(TT_OPEN_NO_VERIFY);
	test_flush_fails();
	test_check_io_errors();
	test_enospc();
	test_too_many_blocks();
	test_no_reuse_before_record();
	test_failed_eviction_keeps_blocks();
	test_duplicates_newest_wins();
}

int main(void)
{
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(path, sizeof(path), "%s/m0", dir);
	run("fault:psync");
	run("fault:uring");
	unlink(path);
	rmdir(dir);
	return tap_done();
}
