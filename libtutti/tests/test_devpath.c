// SPDX-License-Identifier: Apache-2.0
/*
 * Transactions bound to a data path (devpath.h), through the host reference
 * path: blocks written through the path read back by the CPU path and the
 * other way round, over two members and shuffled paged memory; a corrupt
 * object is caught (-EBADMSG, slot dropped); failed I/O commits nothing;
 * abort releases everything; misuse is refused with the documented errors.
 * Failures are injected by wrapping the host path's operations.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tutti/devpath.h"
#include "tutti/tutti.h"
#include "tap.h"
#include "testutil.h"

#define L 4
#define S 2
#define SPAN 4096u
#define NSLOTS 32
#define NMEM 16		/* memory blocks of the paged buffer */
#define BLK (L * S * SPAN)

static char dir[] = "/tmp/tutti-devpath-XXXXXX";
static char path0[256], path1[256];
static const char *paths[2] = { path0, path1 };

static uint8_t *mem;	/* [L][S][NMEM][SPAN] */
static uint64_t base[L * S], stride[L * S];
static struct tt_memmap map = { L, S, base, stride };

static void keys_of(const unsigned *ids, unsigned n, uint8_t *keys)
{
	for (unsigned i = 0; i < n; i++)
		key_of(ids[i], keys + (size_t)i * TT_KEY_BYTES);
}

static uint8_t *obj(uint32_t layer, uint32_t span, uint32_t mblock)
{
	return mem + ((size_t)(layer * S + span) * NMEM + mblock) * SPAN;
}

/* Block contents, (layer, span) order, into/out of paged memory block @mb. */
static void scatter(const uint8_t *blk, uint32_t mb)
{
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t k = 0; k < S; k++)
			memcpy(obj(l, k, mb), blk + (l * S + k) * SPAN, SPAN);
}

static int same_as_paged(const uint8_t *blk, uint32_t mb)
{
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t k = 0; k < S; k++)
			if (memcmp(obj(l, k, mb), blk + (l * S + k) * SPAN, SPAN))
				return 0;
	return 1;
}

/* Run every layer of a bound transaction and finish it. */
static int run_all(struct tt_txn *t, int32_t *status)
{
	for (uint32_t l = 0; l < L; l++)
		if (tt_txn_layer(t, l, &map, NULL))
			break;
	for (uint32_t l = 0; l < L; l++)
		tt_txn_wait_layer(t, l);
	return tt_txn_finish(t, status);
}

/* --- a wrapper of the host path that records and injects failures --- */
static struct {
	int64_t slots[64];
	unsigned n;
	int fail_layer;		/* @layer fails for this layer */
	int eio_layer;		/* @wait fails for this layer ... */
	unsigned eio_block;	/* ... and this block is reported failed (>= n: none) */
	unsigned begins, ends;
} w;

static int w_begin(void *ctx, const struct tt_devpath_txn *ti, void **txn)
{
	w.n = ti->n;
	memcpy(w.slots, ti->slots, ti->n * sizeof(*ti->slots));
	w.begins++;
	return tt_devpath_host.begin(ctx, ti, txn);
}

static int w_layer(void *txn, uint32_t layer, const struct tt_memmap *m)
{
	if ((int)layer == w.fail_layer)
		return -EIO;
	return tt_devpath_host.layer(txn, layer, m);
}

static int w_wait(void *txn, uint32_t layer)
{
	int ret = tt_devpath_host.wait(txn, layer);

	return (int)layer == w.eio_layer ? -EIO : ret;
}

static int w_collect(void *txn, int32_t *status, uint64_t *sums)
{
	int ret = tt_devpath_host.collect(txn, status, sums);

	if (w.eio_layer >= 0 && w.eio_block < w.n)
		status[w.eio_block] = -EIO;
	return ret;
}

static void w_end(void *txn)
{
	w.ends++;
	tt_devpath_host.end(txn);
}

static const struct tt_devpath_ops wrapped = {
	.name = "wrapped-host", .begin = w_begin, .layer = w_layer, .wait = w_wait,
	.collect = w_collect, .end = w_end,
};

static void w_reset(void)
{
	w.fail_layer = -1;
	w.eio_layer = -1;
}

static struct tt_format_params params(void)
{
	struct tt_format_params p;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "test/devpath");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = L;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;	/* span 4 KiB */
	p.n_slots = NSLOTS;
	p.stripe_objs = 3;	/* objects of one layer spread over both members */
	return p;
}

static uint64_t n_free(struct tt_store *s)
{
	struct tt_store_info info;

	tt_store_get_info(s, &info);
	return info.n_free;
}

static void test_misuse(struct tt_store *s)
{
	uint8_t keys[2 * TT_KEY_BYTES];
	uint32_t ids[2] = { 0, 1 };
	unsigned kid[2] = { 900, 901 };
	struct tt_devpath_ops broken = wrapped;
	struct tt_txn *t;

	keys_of(kid, 2, keys);
	tap_eq(tt_store_write_begin(s, keys, 2, &t), 0, "write begin");
	tap_eq(tt_txn_bind_device(t, ids), (unsigned long long)-ENODEV,
	       "bind without a data path: -ENODEV");
	tap_eq(tt_store_set_devpath(s, &tt_devpath_host, NULL), (unsigned long long)-EBUSY,
	       "set a data path while a transaction is open: -EBUSY");
	tt_txn_abort(t);
	broken.collect = NULL;
	tap_eq(tt_store_set_devpath(s, &broken, NULL), (unsigned long long)-EINVAL,
	       "a path without collect is refused");
	tap_eq(tt_store_set_devpath(s, &wrapped, NULL), 0, "set the wrapped host path");

	tt_store_write_begin(s, keys, 2, &t);
	tap_eq(tt_txn_layer_order(t, 0, NULL), (unsigned long long)-EINVAL,
	       "order on an unbound transaction: -EINVAL");
	tap_eq(tt_txn_bind_device(t, ids), 0, "bind");
	tap_eq(tt_txn_bind_device(t, ids), (unsigned long long)-EALREADY,
	       "bind twice: -EALREADY");
	tap_eq(tt_txn_layer_order(t, 1, NULL), (unsigned long long)-EINVAL,
	       "order on a layer not submitted: -EINVAL");
	tap_eq(tt_txn_wait_layer(t, 1), (unsigned long long)-EINVAL,
	       "wait on a layer not submitted: -EINVAL");
	tap_eq(tt_txn_layer(t, 1, &map, NULL), 0, "layer 1 through the path");
	tap_eq(tt_txn_layer(t, 1, &map, NULL), (unsigned long long)-EALREADY,
	       "layer 1 again: -EALREADY");
	tap_eq(tt_txn_layer(t, L, &map, NULL), (unsigned long long)-ERANGE,
	       "layer out of range: -ERANGE");
	tap_eq(tt_txn_layer_order(t, 1, NULL), (unsigned long long)-EOPNOTSUPP,
	       "order through a path without it: -EOPNOTSUPP");
	tap_eq(tt_txn_wait_layer(t, 1), 0, "wait layer 1");
	{
		int32_t st[2] = { 1, 1 };

		tap_eq(tt_txn_finish(t, st), 0, "layers missing: nothing committed");
		tap_ok(st[0] == -ENODATA && st[1] == -ENODATA, "both blocks -ENODATA");
	}
	tap_eq(tt_store_lookup(s, keys, 2, (int64_t[2]){ 0 }), 0, "keys are misses");

	tt_store_write_begin(s, keys, 2, &t);
	fill(obj(0, 0, 0), SPAN, 1);
	tap_eq(tt_txn_layer(t, 0, &map, ids), 0, "layer 0 through host memory");
	tap_eq(tt_txn_bind_device(t, ids), (unsigned long long)-EINVAL,
	       "bind after a host-memory layer: -EINVAL");
	tt_txn_abort(t);
}

static void test_round_trips(struct tt_store *s)
{
	enum { NB = 6 };
	unsigned kid[NB] = { 10, 11, 12, 13, 14, 15 };
	uint32_t ids[NB] = { 9, 2, 14, 0, 7, 11 };	/* shuffled paged blocks */
	uint8_t keys[NB * TT_KEY_BYTES], *blk = aligned_alloc(4096, BLK);
	uint8_t *back = aligned_alloc(4096, BLK);
	int32_t st[NB];
	int64_t slots[NB];
	struct tt_txn *t;
	unsigned bad = 0;
	int ret;

	/* Device path write, CPU path read. */
	keys_of(kid, NB, keys);
	for (unsigned i = 0; i < NB; i++) {
		fill(blk, BLK, kid[i]);
		scatter(blk, ids[i]);
	}
	tap_eq(tt_store_write_begin(s, keys, NB, &t), 0, "write %u blocks", NB);
	tap_eq(tt_txn_bind_device(t, ids), 0, "bind to the data path");
	ret = run_all(t, st);
	tap_eq(ret, NB, "all %u committed through the path", NB);
	for (unsigned i = 0; i < NB; i++)
		bad += st[i] != 0;
	tap_eq(bad, 0, "no block failed");
	tap_eq(w.ends, w.begins, "the path's transaction ended");
	bad = 0;
	for (unsigned i = 0; i < NB; i++) {
		fill(blk, BLK, kid[i]);
		memset(back, 0, BLK);
		if (tt_store_get(s, keys + i * TT_KEY_BYTES, back, BLK) || memcmp(back, blk, BLK))
			bad++;
	}
	tap_eq(bad, 0, "CPU path reads back what the data path wrote (checksums agree)");

	/* CPU path write, device path read into other paged blocks. */
	unsigned kid2[4] = { 20, 21, 22, 23 };
	uint32_t ids2[4] = { 5, 15, 1, 8 };
	uint8_t keys2[4 * TT_KEY_BYTES];

	keys_of(kid2, 4, keys2);
	bad = 0;
	for (unsigned i = 0; i < 4; i++) {
		fill(blk, BLK, kid2[i]);
		bad += tt_store_put(s, keys2 + i * TT_KEY_BYTES, blk, BLK) != 0;
	}
	tap_eq(bad, 0, "4 blocks stored through the CPU path");
	tap_eq(tt_store_lookup(s, keys2, 4, slots), 4, "all 4 found");
	memset(mem, 0, (size_t)L * S * NMEM * SPAN);
	tap_eq(tt_store_read_begin(s, slots, 4, &t), 0, "read begin");
	tap_eq(tt_txn_bind_device(t, ids2), 0, "bind the read");
	tap_eq(run_all(t, st), 4, "4 blocks read through the path");
	bad = 0;
	for (unsigned i = 0; i < 4; i++) {
		fill(blk, BLK, kid2[i]);
		bad += !same_as_paged(blk, ids2[i]) || st[i];
	}
	tap_eq(bad, 0, "paged memory holds what the CPU path stored");

	/* A write with a key already stored and a key given twice. */
	unsigned kid3[3] = { 20, 30, 30 };
	uint32_t ids3[3] = { 3, 4, 6 };
	uint8_t keys3[3 * TT_KEY_BYTES];

	keys_of(kid3, 3, keys3);
	fill(blk, BLK, 30);
	scatter(blk, 4);
	tt_store_write_begin(s, keys3, 3, &t);
	tap_eq(tt_txn_bind_device(t, ids3), 0, "bind a write with present keys");
	tap_ok(w.n == 3 && w.slots[0] == -1 && w.slots[1] >= 0 && w.slots[2] == -1,
	       "the path sees -1 for present blocks (%lld %lld %lld)", (long long)w.slots[0],
	       (long long)w.slots[1], (long long)w.slots[2]);
	tap_eq(run_all(t, st), 3, "3 ok (1 written, 2 present)");
	memset(back, 0, BLK);
	tap_ok(!tt_store_get(s, keys3 + TT_KEY_BYTES, back, BLK) && !memcmp(back, blk, BLK),
	       "the new block reads back");

	free(blk);
	free(back);
}

static void test_corrupt(struct tt_store *s)
{
	unsigned kid[3] = { 10, 11, 12 };
	uint32_t ids[3] = { 0, 1, 2 };
	uint8_t keys[3 * TT_KEY_BYTES], b;
	int64_t slots[3];
	int32_t st[3];
	struct tt_store_info info;
	const struct tt_geometry *g = tt_store_geometry(s);
	struct tt_extent e;
	struct tt_txn *t;
	int fd;

	keys_of(kid, 3, keys);
	tap_eq(tt_store_lookup(s, keys, 3, slots), 3, "3 blocks to read");
	e = tt_locate(g, (uint64_t)slots[1], 3, 1);
	fd = open(paths[e.member], O_RDWR);
	tap_ok(fd >= 0 && pread(fd, &b, 1, (off_t)e.off + 777) == 1, "read a byte of slot %lld "
	       "(member %u)", (long long)slots[1], e.member);
	b ^= 0x01;
	tap_ok(pwrite(fd, &b, 1, (off_t)e.off + 777) == 1, "flip one bit of layer 3 span 1");
	fsync(fd);
	close(fd);
	tt_store_read_begin(s, slots, 3, &t);
	tt_txn_bind_device(t, ids);
	tap_eq(run_all(t, st), 2, "2 of 3 ok");
	tap_ok(st[0] == 0 && st[1] == -EBADMSG && st[2] == 0, "the corrupt block is -EBADMSG "
	       "(%d %d %d)", st[0], st[1], st[2]);
	tap_eq(tt_store_lookup(s, keys, 3, slots), 2, "it was dropped");
	tt_store_get_info(s, &info);
	tap_eq(info.stats.corrupt_blocks, 1, "counted as corrupt");
}

static void test_failures(struct tt_store *s)
{
	unsigned kid[3] = { 40, 41, 42 };
	uint32_t ids[3] = { 0, 1, 2 };
	uint8_t keys[3 * TT_KEY_BYTES];
	int64_t slots[3];
	int32_t st[3];
	uint64_t free0 = n_free(s);
	struct tt_txn *t;

	keys_of(kid, 3, keys);
	for (unsigned i = 0; i < 3; i++) {
		uint8_t blk[BLK];

		fill(blk, BLK, kid[i]);
		scatter(blk, ids[i]);
	}
	/* A command of layer 1 failed for block 1. */
	w.eio_layer = 1;
	w.eio_block = 1;
	tt_store_write_begin(s, keys, 3, &t);
	tt_txn_bind_device(t, ids);
	for (uint32_t l = 0; l < L; l++)
		tt_txn_layer(t, l, &map, NULL);
	tap_eq(tt_txn_wait_layer(t, 1), (unsigned long long)-EIO, "wait reports the layer's -EIO");
	tap_eq(tt_txn_layer_order(t, 1, NULL), (unsigned long long)-EIO,
	       "order on a failed layer: -EIO");
	tap_eq(tt_txn_finish(t, st), 2, "2 of 3 committed");
	tap_ok(st[0] == 0 && st[1] == -EIO && st[2] == 0, "block 1 -EIO (%d %d %d)", st[0],
	       st[1], st[2]);
	tap_eq(tt_store_lookup(s, keys, 3, slots), 2, "the failed block was not committed");
	tap_eq(slots[1], (unsigned long long)-1, "its key is a miss");
	tap_eq(n_free(s), free0 - 2, "its slot went back to the free list");
	w_reset();

	/*
	 * Layer 1's wait failed but the path names no block (it knew only the
	 * layer): every block fails, a write commits nothing, a read of
	 * intact blocks reports -EIO and drops nothing.
	 */
	kid[0] = 45, kid[1] = 46, kid[2] = 47;
	keys_of(kid, 3, keys);
	free0 = n_free(s);
	w.eio_layer = 1;
	w.eio_block = 99;
	tt_store_write_begin(s, keys, 3, &t);
	tt_txn_bind_device(t, ids);
	tap_eq(run_all(t, st), 0, "layer failure naming no block: nothing committed");
	tap_ok(st[0] == -EIO && st[1] == -EIO && st[2] == -EIO, "every block -EIO (%d %d %d)",
	       st[0], st[1], st[2]);
	tap_eq(n_free(s), free0, "every slot free again");
	kid[0] = 40, kid[1] = 42, kid[2] = 40;
	keys_of(kid, 3, keys);
	tap_eq(tt_store_lookup(s, keys, 2, slots), 2, "2 stored blocks");
	tt_store_read_begin(s, slots, 2, &t);
	tt_txn_bind_device(t, ids);
	tap_eq(run_all(t, st), 0, "read, layer failure naming no block: no block ok");
	tap_ok(st[0] == -EIO && st[1] == -EIO, "both -EIO, not fine and not corrupt (%d %d)",
	       st[0], st[1]);
	tap_eq(tt_store_lookup(s, keys, 2, slots), 2, "both still stored");
	w_reset();

	/* Submission of layer 2 failed: nothing of the transaction commits. */
	kid[0] = 50, kid[1] = 51, kid[2] = 52;
	keys_of(kid, 3, keys);
	free0 = n_free(s);
	w.fail_layer = 2;
	tt_store_write_begin(s, keys, 3, &t);
	tt_txn_bind_device(t, ids);
	tap_eq(tt_txn_layer(t, 0, &map, NULL), 0, "layer 0 submitted");
	tap_eq(tt_txn_layer(t, 2, &map, NULL), (unsigned long long)-EIO, "layer 2 fails to submit");
	tap_eq(tt_txn_layer(t, 1, &map, NULL), 0, "layer 1 submitted");
	tap_eq(tt_txn_layer(t, 3, &map, NULL), 0, "layer 3 submitted");
	tap_eq(tt_txn_finish(t, st), 0, "nothing committed");
	tap_ok(st[0] == -EIO && st[1] == -EIO && st[2] == -EIO, "every block -EIO");
	tap_eq(tt_store_lookup(s, keys, 3, slots), 0, "all misses");
	tap_eq(n_free(s), free0, "every slot free again");
	w_reset();

	/* Abort with layers in flight: nothing committed, slots and pins back. */
	kid[0] = 60, kid[1] = 61, kid[2] = 62;
	keys_of(kid, 3, keys);
	free0 = n_free(s);
	tt_store_write_begin(s, keys, 3, &t);
	tt_txn_bind_device(t, ids);
	tt_txn_layer(t, 0, &map, NULL);
	tt_txn_layer(t, 1, &map, NULL);
	tt_txn_abort(t);
	tap_eq(tt_store_lookup(s, keys, 3, slots), 0, "aborted write: all misses");
	tap_eq(n_free(s), free0, "aborted write: slots free again");
	tap_eq(w.ends, w.begins, "aborted write: the path's transaction ended");

	kid[0] = 10, kid[1] = 12, kid[2] = 20;
	keys_of(kid, 3, keys);
	tap_eq(tt_store_lookup(s, keys, 3, slots), 3, "3 stored blocks");
	tt_store_read_begin(s, slots, 3, &t);
	tt_txn_bind_device(t, ids);
	tt_txn_layer(t, 0, &map, NULL);
	tt_txn_abort(t);
	tap_eq(w.ends, w.begins, "aborted read: the path's transaction ended");
	memset(mem, 0, (size_t)L * S * NMEM * SPAN);
	tt_store_read_begin(s, slots, 3, &t);
	tt_txn_bind_device(t, ids);
	tap_eq(run_all(t, st), 3, "the same blocks read again after the abort");
	{
		uint8_t blk[BLK];
		unsigned bad = 0;

		for (unsigned i = 0; i < 3; i++) {
			fill(blk, BLK, kid[i]);
			bad += !same_as_paged(blk, ids[i]);
		}
		tap_eq(bad, 0, "and hold the stored bytes");
	}
}

int main(void)
{
	struct tt_format_params p = params();
	struct tt_store *s;
	int ret;

	w_reset();
	if (!mkdtemp(dir))
		return 1;
	snprintf(path0, sizeof(path0), "%s/m0", dir);
	snprintf(path1, sizeof(path1), "%s/m1", dir);
	mem = aligned_alloc(4096, (size_t)L * S * NMEM * SPAN);
	for (unsigned m = 0; m < L * S; m++) {
		base[m] = (uint64_t)(uintptr_t)obj(m / S, m % S, 0);
		stride[m] = SPAN;
	}
	tap_eq(tt_store_format(paths, 2, &p), 0, "format 2 members");
	ret = tt_store_open(paths, 2, NULL, &s);
	tap_eq(ret, 0, "open: %s", ret ? tt_errmsg() : "ok");
	if (ret)
		return tap_done();

	test_misuse(s);
	test_round_trips(s);
	test_corrupt(s);
	test_failures(s);

	/* Two-phase write through the path: prepare collects, finish commits. */
	{
		unsigned kid[2] = { 80, 81 };
		uint32_t ids[2] = { 4, 5 };
		uint8_t keys[2 * TT_KEY_BYTES];
		int32_t st[2];
		struct tt_txn *t;

		keys_of(kid, 2, keys);
		tt_store_write_begin(s, keys, 2, &t);
		tt_txn_bind_device(t, ids);
		for (uint32_t l = 0; l < L - 1; l++)
			tt_txn_layer(t, l, &map, NULL);
		tap_eq(tt_txn_prepare(t, st), 0, "prepare with a layer missing: 0 durable");
		tap_eq(tt_txn_layer(t, L - 1, &map, NULL), (unsigned long long)-EINVAL,
		       "a layer after prepare is refused (the path is done)");
		tap_eq(tt_txn_finish(t, st), 0, "nothing committed");
		tap_eq(w.ends, w.begins, "the path's transaction ended once");
		tt_store_write_begin(s, keys, 2, &t);
		tt_txn_bind_device(t, ids);
		for (uint32_t l = 0; l < L; l++)
			tt_txn_layer(t, l, &map, NULL);
		tap_eq(tt_txn_prepare(t, st), 2, "prepare: 2 blocks durable");
		tap_eq(tt_txn_finish(t, st), 2, "finish after prepare commits both");
		tap_eq(tt_store_lookup(s, keys, 2, (int64_t[2]){ 0 }), 2, "both found");
	}
	tap_eq(tt_store_set_devpath(s, NULL, NULL), 0, "remove the data path");
	{
		struct tt_txn *t;
		uint8_t key[TT_KEY_BYTES];
		uint32_t id = 0;

		key_of(70, key);
		tt_store_write_begin(s, key, 1, &t);
		tap_eq(tt_txn_bind_device(t, &id), (unsigned long long)-ENODEV,
		       "bind after removal: -ENODEV");
		tt_txn_abort(t);
	}
	tt_store_close(s);

	/* Durable: reopened, the blocks written through the path read back. */
	ret = tt_store_open(paths, 2, NULL, &s);
	tap_eq(ret, 0, "reopen");
	if (!ret) {
		unsigned kid[3] = { 13, 14, 15 };
		uint8_t keys[3 * TT_KEY_BYTES];
		uint8_t *blk = aligned_alloc(4096, BLK), *back = aligned_alloc(4096, BLK);
		struct tt_check_result res = { 0 };
		unsigned bad = 0;

		keys_of(kid, 3, keys);
		for (unsigned i = 0; i < 3; i++) {
			fill(blk, BLK, kid[i]);
			if (tt_store_get(s, keys + i * TT_KEY_BYTES, back, BLK) ||
			    memcmp(back, blk, BLK))
				bad++;
		}
		tap_eq(bad, 0, "after reopen, path-written blocks read back through the CPU");
		tap_eq(tt_store_check(s, 0, UINT64_MAX, 0, &res, NULL, 0), 0, "check: clean");
		tap_ok(res.checked > 0 && res.ok == res.checked, "check: %llu slots ok",
		       (unsigned long long)res.ok);
		free(blk);
		free(back);
		tt_store_close(s);
	}
	unlink(path0);
	unlink(path1);
	rmdir(dir);
	free(mem);
	return tap_done();
}
