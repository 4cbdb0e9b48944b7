// SPDX-License-Identifier: Apache-2.0
/*
 * Description: the two-phase write used across tensor-parallel ranks
 * (tt_txn_prepare, tt_txn_veto) and tt_store_list: prepared data is durable
 * but invisible until finish, a vetoed block is never committed and its slot
 * is reused, a prepared transaction that is aborted or closed leaves nothing,
 * and the listing matches what is committed.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "tap.h"
#include "testutil.h"

#define N_LAYERS 3
#define SPAN 4096
#define BLOCK (N_LAYERS * 2 * SPAN)

static char dir[] = "/tmp/tutti-prep-XXXXXX";
static char path[256];

/* Blocks back to back in memory, objects in (layer, span) order. */
struct mem {
	uint8_t *buf;
	uint64_t base[N_LAYERS * 2], stride[N_LAYERS * 2];
	struct tt_memmap mm;
};

static void mem_init(struct mem *m, unsigned n_blocks, unsigned seed)
{
	m->buf = aligned_alloc(4096, (size_t)n_blocks * BLOCK);
	for (size_t i = 0; i < (size_t)n_blocks * BLOCK; i++)
		m->buf[i] = (uint8_t)(i * 31 + seed);
	for (unsigned o = 0; o < N_LAYERS * 2; o++) {
		m->base[o] = (uint64_t)(uintptr_t)(m->buf + (size_t)o * SPAN);
		m->stride[o] = BLOCK;
	}
	m->mm = (struct tt_memmap){ N_LAYERS, 2, m->base, m->stride };
}

static int write_layers(struct tt_txn *t, struct mem *m, const uint32_t *ids, unsigned upto)
{
	for (unsigned l = 0; l < upto; l++)
		if (tt_txn_layer(t, l, &m->mm, ids))
			return -1;
	return 0;
}

static int has(struct tt_store *s, unsigned k)
{
	uint8_t key[TT_KEY_BYTES];
	int64_t slot;

	key_of(k, key);
	tt_store_lookup(s, key, 1, &slot);
	return slot >= 0;
}

int main(void)
{
	const char *paths[1] = { path };
	struct tt_format_params p;
	struct tt_store *s;
	struct tt_txn *t;
	struct mem m;
	uint8_t keys[4 * TT_KEY_BYTES], got[8 * TT_KEY_BYTES], out[BLOCK];
	uint32_t ids[4] = { 0, 1, 2, 3 };
	int32_t st[4];
	int64_t slots[8];
	int ret;

	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/s.img", dir);
	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "test/prepare");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = N_LAYERS;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;
	p.n_slots = 4;
	tap_eq(tt_store_format(paths, 1, &p), 0, "format");
	tap_eq(tt_store_open(paths, 1, NULL, &s), 0, "open: %s", tt_errmsg());
	mem_init(&m, 4, 7);
	for (unsigned i = 0; i < 4; i++)
		key_of(i, keys + i * TT_KEY_BYTES);

	/* Prepared: durable, not visible; veto block 1; finish commits 0, 2, 3. */
	tap_eq(tt_store_write_begin(s, keys, 4, &t), 0, "write_begin 4 blocks");
	tap_eq(write_layers(t, &m, ids, N_LAYERS), 0, "all layers submitted");
	tap_eq(tt_txn_prepare(t, st), 4, "prepare: 4 blocks durable");
	tap_ok(st[0] == 0 && st[1] == 0 && st[2] == 0 && st[3] == 0, "prepare status all 0");
	tap_ok(!has(s, 0), "prepared block is not visible before finish");
	tap_eq(tt_store_list(s, 0, 4, NULL, NULL, 0), 0, "nothing listed before finish");
	tap_eq(tt_txn_veto(t, 1), 0, "veto block 1");
	tap_eq(tt_txn_veto(t, 9), (unsigned long long)-EINVAL, "veto out of range refused");
	ret = tt_txn_finish(t, st);
	tap_eq(ret, 3, "finish commits 3");
	tap_eq(st[1], (unsigned long long)-ECANCELED, "vetoed block reports -ECANCELED");
	tap_ok(has(s, 0) && !has(s, 1) && has(s, 2) && has(s, 3), "vetoed key absent, others present");
	ret = tt_store_list(s, 0, 100, got, slots, 8);
	tap_eq(ret, 3, "list: 3 committed");
	{
		int match = 0;

		for (int i = 0; i < ret && i < 8; i++)
			for (unsigned k = 0; k < 4; k++)
				if (!memcmp(got + i * TT_KEY_BYTES, keys + k * TT_KEY_BYTES, TT_KEY_BYTES))
					match |= 1 << k;
		tap_eq(match, 0xd, "list returns keys 0, 2, 3");
	}
	tap_eq(tt_store_list(s, 0, 100, got, slots, 1), 3, "list counts beyond cap");
	tap_eq(tt_store_list(s, 100, 5, NULL, NULL, 0), 0, "list past the end: nothing");

	/* The vetoed slot is free again: block 1 fits in the 4-slot store without eviction. */
	tap_eq(tt_store_write_begin(s, keys + TT_KEY_BYTES, 1, &t), 0, "write_begin key 1 again");
	tap_eq(write_layers(t, &m, ids + 1, N_LAYERS), 0, "layers of key 1");
	tap_eq(tt_txn_prepare(t, NULL), 1, "prepare key 1");
	tap_eq(tt_txn_prepare(t, NULL), 1, "prepare twice is harmless");
	tap_eq(tt_txn_finish(t, NULL), 1, "commit key 1");
	tap_ok(has(s, 0) && has(s, 1) && has(s, 2) && has(s, 3), "all 4 stored, none evicted");

	/* Veto of a block already stored keeps it. */
	tap_eq(tt_store_write_begin(s, keys, 1, &t), 0, "write_begin a stored key");
	tap_eq(tt_txn_prepare(t, st), 1, "prepare: present block counts ok");
	tt_txn_veto(t, 0);
	tap_eq(tt_txn_finish(t, st), 1, "finish");
	tap_ok(has(s, 0), "vetoed present block is still stored");

	/* A layer never submitted: -ENODATA at prepare, nothing committed. */
	key_of(10, keys);
	tap_eq(tt_store_write_begin(s, keys, 1, &t), 0, "write_begin key 10 (evicts)");
	tap_eq(write_layers(t, &m, ids, N_LAYERS - 1), 0, "all but the last layer");
	tap_eq(tt_txn_prepare(t, st), 0, "prepare: 0 ok");
	tap_eq(st[0], (unsigned long long)-ENODATA, "missing layer: -ENODATA");
	tap_eq(tt_txn_finish(t, st), 0, "finish commits nothing");
	tap_ok(!has(s, 10), "key 10 absent");

	/* Prepared and abandoned (closed without finish): nothing after reopen. */
	key_of(11, keys);
	tap_eq(tt_store_write_begin(s, keys, 1, &t), 0, "write_begin key 11");
	tap_eq(write_layers(t, &m, ids, N_LAYERS), 0, "layers of key 11");
	tap_eq(tt_txn_prepare(t, NULL), 1, "prepare key 11");
	tt_store_close(s);
	tap_eq(tt_store_open(paths, 1, NULL, &s), 0, "reopen");
	tap_ok(!has(s, 11), "prepared, never finished: absent after reopen");
	/* Key 10's write evicted key 1 (least recently used); 0, 2, 3 remain. */
	tap_ok(has(s, 0) && !has(s, 1) && has(s, 2) && has(s, 3), "committed keys survive reopen");
	key_of(2, keys);
	tap_eq(tt_store_get(s, keys, out, BLOCK), 0, "get key 2");
	tap_ok(!memcmp(out, m.buf + 2 * BLOCK, BLOCK), "key 2 bit-exact");
	{
		struct tt_check_result r = { 0 };

		tap_eq(tt_store_check(s, 0, 4, 0, &r, NULL, 0), 0, "check clean");
	}

	/* Reads cannot be prepared. */
	tt_store_lookup(s, keys, 1, slots);
	tap_eq(tt_store_read_begin(s, slots, 1, &t), 0, "read_begin");
	tap_eq(tt_txn_prepare(t, NULL), (unsigned long long)-EINVAL, "prepare of a read refused");
	tap_eq(tt_txn_veto(t, 0), (unsigned long long)-EINVAL, "veto of a read refused");
	tt_txn_abort(t);
	tt_store_close(s);
	free(m.buf);
	unlink(path);
	rmdir(dir);
	return tap_done();
}
