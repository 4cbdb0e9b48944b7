// SPDX-License-Identifier: Apache-2.0
/*
 * Description: store round trips on both engines: single blocks, layer-wise
 * transactions into scattered (paged) memory, unaligned memory through
 * bounce buffers, 2-way striping, LRU eviction, reopen, corruption
 * detection and check/repair.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "tap.h"
#include "testutil.h"

static char dir[] = "/tmp/tutti-test-XXXXXX";
static char path0[256], path1[256];

static struct tt_format_params small_params(uint64_t slots)
{
	struct tt_format_params p;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "test/small");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = 4;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;	/* span 4 KiB */
	p.n_slots = slots;
	return p;
}

static void test_engine(const char *engine)
{
	const char *paths[2] = { path0, path1 };
	struct tt_format_params p = small_params(8);
	struct tt_open_params op = { .engine = engine };
	struct tt_store *s;
	size_t bb = 4 * 2 * 4096;
	uint8_t key[TT_KEY_BYTES], *in, *out;
	int ret;

	unlink(path0);
	unlink(path1);
	tap_eq(tt_store_format(paths, 2, &p), 0, "[%s] format 2 members", engine);
	ret = tt_store_open(paths, 2, &op, &s);
	tap_eq(ret, 0, "[%s] open: %s", engine, tt_errmsg());
	if (ret)
		return;
	in = aligned_alloc(4096, bb);
	out = aligned_alloc(4096, bb);
	for (unsigned i = 0; i < 8; i++) {
		key_of(i, key);
		fill(in, bb, i);
		if (tt_store_put(s, key, in, bb))
			break;
	}
	key_of(3, key);
	fill(in, bb, 3);
	memset(out, 0, bb);
	tap_eq(tt_store_get(s, key, out, bb), 0, "[%s] get key 3", engine);
	tap_ok(!memcmp(in, out, bb), "[%s] bit-exact", engine);

	/* Unaligned caller memory goes through a bounce buffer. */
	key_of(5, key);
	fill(in, bb, 5);
	{
		uint8_t *odd = malloc(bb + 1);

		tap_eq(tt_store_get(s, key, odd + 1, bb), 0, "[%s] get into unaligned memory",
		       engine);
		tap_ok(!memcmp(in, odd + 1, bb), "[%s] unaligned bit-exact", engine);
		free(odd);
	}

	/* Full store: the next put evicts the least recently used (key 0)... */
	key_of(1, key);
	tt_store_get(s, key, out, bb);	/* key 1 becomes recent */
	key_of(100, key);
	fill(in, bb, 100);
	tap_eq(tt_store_put(s, key, in, bb), 0, "[%s] put into a full store", engine);
	key_of(0, key);
	tap_eq(tt_store_get(s, key, out, bb), (unsigned long long)-ENOENT,
	       "[%s] LRU victim is gone", engine);
	key_of(1, key);
	fill(in, bb, 1);
	tap_ok(!tt_store_get(s, key, out, bb) && !memcmp(in, out, bb),
	       "[%s] recently used key survives", engine);
	tt_store_close(s);

	/* Reopen: everything still there. */
	tap_eq(tt_store_open(paths, 2, &op, &s), 0, "[%s] reopen", engine);
	key_of(100, key);
	fill(in, bb, 100);
	tap_ok(!tt_store_get(s, key, out, bb) && !memcmp(in, out, bb),
	       "[%s] reopened store serves the block", engine);
	{
		struct tt_store_info info;

		tt_store_get_info(s, &info);
		tap_eq(info.n_committed, 8, "[%s] 8 committed after reopen", engine);
		tap_ok(!strcmp(info.engine, engine), "[%s] engine in use: %s", engine,
		       info.engine);
	}
	{
		/* A slot's record carries the checksum tt_sum_block() computes
		 * over the block's bytes: what a cluster peer checks. */
		struct tt_slot_record rec;
		int64_t slot;
		uint64_t sum = 0;

		key_of(100, key);
		tt_store_lookup(s, key, 1, &slot);
		tap_eq(tt_store_slot_record(s, (uint64_t)slot, &rec), 0, "[%s] slot record", engine);
		tap_ok(!memcmp(rec.key, key, TT_KEY_BYTES) && rec.gen > 0,
		       "[%s] record: the key, a generation", engine);
		tap_eq(tt_sum_block(in, 4096, 4 * 2, &sum), 0, "[%s] block sum", engine);
		tap_ok(sum == rec.data_sum, "[%s] block sum == committed data_sum", engine);
		{
			uint8_t *cp = malloc(4096 * 4 * 2);
			uint64_t csum = 0;

			memset(cp, 0, 4096 * 4 * 2);
			tap_eq(tt_copy_sum_block(cp, in, 4096, 4 * 2, &csum), 0,
			       "[%s] copy and sum", engine);
			tap_ok(csum == rec.data_sum && !memcmp(cp, in, 4096 * 4 * 2),
			       "[%s] copy and sum: the bytes, the committed data_sum", engine);
			tap_eq(tt_copy_sum_block(cp, in, 4096, 0, &csum), (unsigned long long)-EINVAL,
			       "[%s] copy and sum of no object", engine);
			free(cp);
		}
		in[5] ^= 1;
		tt_sum_block(in, 4096, 4 * 2, &sum);
		tap_ok(sum != rec.data_sum, "[%s] one flipped bit: another sum", engine);
		tap_eq(tt_store_slot_record(s, 8, &rec), (unsigned long long)-ERANGE,
		       "[%s] record past the end: %s", engine, tt_errmsg());
		tap_eq(tt_sum_block(in, 4096, 0, &sum), (unsigned long long)-EINVAL,
		       "[%s] block of no object", engine);
	}
	{
		/* An empty slot has no record to give. */
		int64_t victim[1];

		key_of(1, key);
		tt_store_lookup(s, key, 1, victim);
		tt_store_invalidate(s, victim, 1);
		struct tt_slot_record rec;

		tap_eq(tt_store_slot_record(s, (uint64_t)victim[0], &rec),
		       (unsigned long long)-ENOENT, "[%s] record of an empty slot", engine);
	}
	tt_store_close(s);
	free(in);
	free(out);
}

/* Layer-wise transactions between the store and a paged buffer. */
static void test_paged(void)
{
	const char *paths[1] = { path0 };
	struct tt_format_params p = small_params(64);
	enum { NB = 40, L = 4, S = 2, SPAN = 4096, MEMB = 64 };
	uint64_t base[L * S], stride[L * S];
	uint32_t ids[NB], ids2[NB];
	uint8_t keys[NB * TT_KEY_BYTES];
	int64_t slots[NB];
	int32_t status[NB];
	struct tt_memmap map = { L, S, base, stride };
	struct tt_txn *t;
	struct tt_store *s;
	uint8_t *mem = aligned_alloc(4096, (size_t)L * S * MEMB * SPAN);
	uint8_t *mem2 = aligned_alloc(4096, (size_t)L * S * MEMB * SPAN);
	int ok = 1;

	unlink(path0);
	tt_store_format(paths, 1, &p);
	tap_eq(tt_store_open(paths, 1, NULL, &s), 0, "paged: open");
	for (unsigned m = 0; m < L * S; m++) {
		base[m] = (uint64_t)(uintptr_t)(mem + (size_t)m * MEMB * SPAN);
		stride[m] = SPAN;
	}
	fill(mem, (size_t)L * S * MEMB * SPAN, 42);
	for (unsigned i = 0; i < NB; i++) {
		ids[i] = (i * 37 + 11) % MEMB;	/* shuffled block ids */
		key_of(1000 + i, keys + i * TT_KEY_BYTES);
	}
	tap_eq(tt_store_write_begin(s, keys, NB, &t), 0, "paged: write begin");
	for (unsigned l = 0; l < L; l++)
		tt_txn_layer(t, l, &map, ids);
	tap_eq(tt_txn_finish(t, status), NB, "paged: %d blocks committed", NB);

	tap_eq(tt_store_lookup(s, keys, NB, slots), NB, "paged: all keys found");
	tap_eq(tt_store_read_begin(s, slots, NB, &t), 0, "paged: read begin");
	for (unsigned m = 0; m < L * S; m++)
		base[m] = (uint64_t)(uintptr_t)(mem2 + (size_t)m * MEMB * SPAN);
	for (unsigned i = 0; i < NB; i++)
		ids2[i] = (i * 13 + 5) % MEMB;	/* other placement */
	for (unsigned l = 0; l < L; l++) {
		tt_txn_layer(t, l, &map, ids2);
		if (l > 0)
			tt_txn_wait_layer(t, l - 1);	/* pipelined */
	}
	tap_eq(tt_txn_finish(t, status), NB, "paged: %d blocks read and verified", NB);
	for (unsigned i = 0; i < NB; i++)
		for (unsigned m = 0; m < L * S; m++)
			if (memcmp(mem + ((size_t)m * MEMB + ids[i]) * SPAN,
				   mem2 + ((size_t)m * MEMB + ids2[i]) * SPAN, SPAN))
				ok = 0;
	tap_ok(ok, "paged: every object landed in its block, bit-exact");

	/* Rewriting present keys writes nothing. */
	tap_eq(tt_store_write_begin(s, keys, 3, &t), 0, "present: begin");
	{
		int present = 0;

		tt_txn_slot(t, 1, &present);
		tap_ok(present, "present: key already stored is reported");
	}
	tt_txn_abort(t);

	/* A layer never submitted: nothing committed. */
	key_of(5000, keys);
	tt_store_write_begin(s, keys, 1, &t);
	tt_txn_layer(t, 0, &map, ids);
	tap_eq(tt_txn_finish(t, status), 0, "partial write commits nothing");
	tap_eq(status[0], (unsigned long long)-ENODATA, "partial write: -ENODATA");
	tap_eq(tt_store_lookup(s, keys, 1, slots), 0, "partial write: key is a miss");

	/* Corrupt one object on disk: detected, dropped, reported by check. */
	key_of(1000 + 7, keys);
	tt_store_lookup(s, keys, 1, slots);
	{
		const struct tt_geometry *g = tt_store_geometry(s);
		struct tt_extent e = tt_locate(g, (uint64_t)slots[0], 2, 1), e2;
		int fd = open(path0, O_RDWR);
		uint8_t b;
		struct tt_check_result res = { 0 };
		int64_t bad[4];

		tap_ok(tt_store_locate(s, (uint64_t)slots[0], 2, 1, &e2) == 0 &&
		       e2.member == e.member && e2.off == e.off, "tt_store_locate = tt_locate");
		tap_eq(tt_store_locate(s, g->n_slots, 0, 0, &e2), (unsigned long long)-EINVAL,
		       "tt_store_locate: slot out of range");
		tap_eq(tt_store_locate(s, 0, g->n_layers, 0, &e2), (unsigned long long)-EINVAL,
		       "tt_store_locate: layer out of range");

		tap_eq(pread(fd, &b, 1, (off_t)e.off + 100), 1, "read a byte of slot %lld at %llu",
		       (long long)slots[0], (unsigned long long)e.off);
		b ^= 0x5a;
		tap_eq(pwrite(fd, &b, 1, (off_t)e.off + 100), 1, "flip it");
		fsync(fd);
		close(fd);
		tap_eq(tt_store_check(s, 0, UINT64_MAX, 0, &res, bad, 4), 1,
		       "check finds the corrupt slot");
		tap_ok(res.bad == 1 && bad[0] == slots[0] && res.ok == NB - 1,
		       "check reports slot %lld, %llu ok", (long long)bad[0],
		       (unsigned long long)res.ok);
		{
			uint8_t *blk = aligned_alloc(4096, L * S * SPAN);

			tap_eq(tt_store_get(s, keys, blk, L * S * SPAN),
			       (unsigned long long)-EBADMSG, "get of corrupt block: -EBADMSG");
			tap_eq(tt_store_get(s, keys, blk, L * S * SPAN),
			       (unsigned long long)-ENOENT, "corrupt block was dropped");
			free(blk);
		}
		memset(&res, 0, sizeof(res));
		tap_eq(tt_store_check(s, 0, UINT64_MAX, 0, &res, NULL, 0), 0,
		       "check clean after drop");
	}
	tt_store_close(s);
	free(mem);
	free(mem2);
}

static void test_errors(void)
{
	const char *paths[1] = { path0 };
	struct tt_format_params p = small_params(4);
	struct tt_open_params op = { 0 };
	struct tt_fingerprint other;
	struct tt_store *s, *s2;
	int fd;

	unlink(path0);
	tt_store_format(paths, 1, &p);
	tap_eq(tt_store_format(paths, 1, &p), (unsigned long long)-EEXIST,
	       "format refuses an existing store: %s", tt_errmsg());
	other = p.fp;
	strcpy(other.model_id, "other/model");
	op.expect = &other;
	tap_eq(tt_store_open(paths, 1, &op, &s), (unsigned long long)-EMEDIUMTYPE,
	       "fingerprint mismatch: %s", tt_errmsg());
	op.expect = &p.fp;
	tap_eq(tt_store_open(paths, 1, &op, &s), 0, "matching fingerprint opens");
	tap_eq(tt_store_open(paths, 1, NULL, &s2), (unsigned long long)-EBUSY,
	       "second writer refused: %s", tt_errmsg());
	tt_store_close(s);

	fd = open(path0, O_RDWR);
	tap_eq(ftruncate(fd, 1 << 20), 0, "truncate");
	close(fd);
	tap_eq(tt_store_open(paths, 1, NULL, &s), (unsigned long long)-EFBIG,
	       "truncated member: %s", tt_errmsg());

	fd = open(path0, O_RDWR | O_TRUNC);
	{
		char junk[16384];

		fill(junk, sizeof(junk), 9);
		write(fd, junk, sizeof(junk));
	}
	close(fd);
	tap_eq(tt_store_open(paths, 1, NULL, &s), (unsigned long long)-EINVAL,
	       "garbage: %s", tt_errmsg());
}

int main(void)
{
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(path0, sizeof(path0), "%s/m0", dir);
	snprintf(path1, sizeof(path1), "%s/m1", dir);
	test_engine("uring");
	test_engine("psync");
	test_paged();
	test_errors();
	unlink(path0);
	unlink(path1);
	rmdir(dir);
	return tap_done();
}
