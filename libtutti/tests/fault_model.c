// SPDX-License-Identifier: Apache-2.0
/*
 * A randomized driver of the store under I/O faults, with a ground-truth
 * model (fault_model.h).  The value of key k is a fixed function of k (the
 * store is content-addressed, as vLLM uses it), so every byte a read returns
 * can be judged; which keys the store holds is tracked from its own index
 * and checked against what each operation was allowed to change.
 *
 * One schedule: a fresh store, then a random sequence of put, get, layer-wise
 * write and read transactions (random layer order, waits, aborts, prepare and
 * veto, memory that needs bounce buffers), invalidate, check (with repair)
 * and reopen, each under a random set of fault rules (fault.h).  After each
 * step a second, read-only handle opens what is on disk now, as a restart
 * after a crash would, and checks it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fault_model_impl.h"

/* --- operations --------------------------------------------------------- */

static unsigned pick_key(struct fm *m, int stored)
{
	unsigned k = (unsigned)rnd(m, m->n_keys);

	for (unsigned i = 0; stored && i < m->n_keys; i++)
		if (m->in[(k + i) % m->n_keys])
			return (k + i) % m->n_keys;
	return k;
}

static void op_put(struct fm *m)
{
	unsigned k = pick_key(m, rnd(m, 4) == 0);
	uint8_t add[FM_KEYS] = { 0 };
	int ret, was = m->in[k];

	m->op = "put";
	value_of(k, m->buf);
	arm_random(m);
	ret = tt_store_put(m->s, m->keys[k], m->buf, FM_BLOCK);
	disarm(m);
	if (ret == -EBADMSG)
		broke(m, "put reported corruption");
	if (!ret && !was && data_hit(m, TT_OP_WRITE, 0))
		broke(m, "put returned 0 though a write of its data failed");
	add[k] = 1;
	after_step(m, NULL, add, ret == 0);
	if (!ret && !m->in[k])
		broke(m, "put returned 0 but key %u is not stored", k);
	if (ret)
		table_unsure(m);
	else
		table_synced(m);
}

static void op_get(struct fm *m)
{
	unsigned k = pick_key(m, rnd(m, 5) != 0);
	int ret;

	m->op = "get";
	memset(m->buf, 0, FM_BLOCK);
	arm_random(m);
	ret = tt_store_get(m->s, m->keys[k], m->buf, FM_BLOCK);
	disarm(m);
	value_of(k, m->val);
	if (!ret && memcmp(m->buf, m->val, FM_BLOCK))
		broke(m, "get of key %u returned wrong bytes (verification %s)", k,
		      m->flags & TT_OPEN_NO_VERIFY ? "off" : "on");
	if (!ret && data_hit(m, TT_OP_READ, 0))
		broke(m, "get returned 0 though a read of its data failed");
	if (ret == -EBADMSG)
		broke(m, "get took an I/O error for corruption");
	if (ret == -ENOENT && m->in[k])
		broke(m, "get of stored key %u: a miss", k);
	if (!ret) {
		m->st->blocks_compared++;
		m->st->unverified_reads += !!(m->flags & TT_OPEN_NO_VERIFY);
	} else if (m->in[k]) {
		m->st->failed_blocks++;
	}
	after_step(m, NULL, NULL, 1);
}

/* Submit the layers in a random order, some waited for in between. */
static void run_layers(struct fm *m, struct tt_txn *t, const struct tt_memmap *map,
		       const uint32_t *ids, int skip)
{
	uint32_t order[FM_L];

	for (unsigned l = 0; l < FM_L; l++)
		order[l] = l;
	for (unsigned l = 0; l < FM_L; l++) {
		unsigned j = l + (unsigned)rnd(m, FM_L - l);
		uint32_t x = order[l];

		order[l] = order[j];
		order[j] = x;
	}
	for (unsigned l = 0; l < FM_L; l++) {
		if ((int)order[l] == skip)
			continue;
		tt_txn_layer(t, order[l], map, ids);
		if (rnd(m, 3) == 0)
			tt_txn_wait_layer(t, order[l]);
	}
}

static void op_write(struct fm *m)
{
	unsigned n = 1 + (unsigned)rnd(m, FM_TXN_MAX), k[FM_TXN_MAX], end = (unsigned)rnd(m, 10);
	uint8_t keys[FM_TXN_MAX * TT_KEY_BYTES], add[FM_KEYS] = { 0 }, before[FM_KEYS];
	int64_t slot[FM_TXN_MAX];
	int present[FM_TXN_MAX], skip = rnd(m, 12) ? -1 : (int)rnd(m, FM_L);
	int32_t st[FM_TXN_MAX];
	uint32_t ids[FM_TXN_MAX];
	struct tt_memmap map = mem_map(m, rnd(m, 4) ? 0 : 8);
	struct tt_txn *t;
	int ret;

	m->op = "write";
	memcpy(before, m->in, FM_KEYS);
	pick_ids(m, ids, n);
	for (unsigned i = 0; i < n; i++) {
		k[i] = i && rnd(m, 8) == 0 ? k[i - 1] : pick_key(m, rnd(m, 4) == 0);
		memcpy(keys + (size_t)i * TT_KEY_BYTES, m->keys[k[i]], TT_KEY_BYTES);
		mem_put(m, ids[i], k[i]);
		add[k[i]] = 1;
	}
	arm_random(m);
	ret = tt_store_write_begin(m->s, keys, n, &t);
	if (ret) {
		disarm(m);
		after_step(m, NULL, NULL, 0);
		if (memcmp(before, m->in, FM_KEYS))
			broke(m, "a refused write changed what is stored");
		table_unsure(m);
		return;
	}
	drain(m);	/* begin's own table writes are not the blocks' */
	after_step(m, NULL, NULL, 1);	/* its evictions are on disk */
	for (unsigned i = 0; i < n; i++)
		slot[i] = tt_txn_slot(t, i, &present[i]);
	run_layers(m, t, &map, ids, skip);
	if (rnd(m, 2)) {
		/* A crash now: data written, no record yet. */
		for (unsigned l = 0; l < FM_L; l++)
			if ((int)l != skip)
				tt_txn_wait_layer(t, l);
		check_disk(m);
	}
	if (end == 0) {
		tt_txn_abort(t);
		disarm(m);
		after_step(m, NULL, NULL, 1);
		return;
	}
	if (end == 1) {
		tt_txn_prepare(t, st);
		tt_txn_veto(t, (unsigned)rnd(m, n));
	}
	ret = tt_txn_finish(t, st);
	disarm(m);
	after_step(m, NULL, add, 1);
	if (flush_hit(m) && ret >= 0)
		for (unsigned i = 0; i < n; i++)
			if (!present[i] && !st[i])
				broke(m, "a flush failed, yet block %u committed and finish returned %d",
				      i, ret);
	for (unsigned i = 0; i < n; i++) {
		if (st[i] == -EBADMSG)
			broke(m, "write reported corruption");
		if (present[i])
			continue;
		if (st[i]) {
			m->st->failed_blocks++;
			if (st[i] != -ECANCELED && st[i] != -ENODATA &&
			    !err_explained(m, slot[i], TT_OP_WRITE, st[i]))
				broke(m, "block %u failed with %d, the error of no fault", i, st[i]);
			continue;
		}
		if (slot_hit(m, slot[i], TT_OP_WRITE) || data_hit(m, TT_OP_WRITE, TT_FAULT_SUBMIT))
			broke(m, "block %u committed though a write of its data failed", i);
		if (skip >= 0)
			broke(m, "block %u committed though layer %d was never written", i, skip);
		if (!m->in[k[i]] || m->slot[k[i]] != slot[i])
			broke(m, "block %u (key %u) reported ok but not stored in slot %lld", i, k[i],
			      (long long)slot[i]);
	}
	if (ret < 0)
		table_unsure(m);
	else
		table_synced(m);
}

static void op_read(struct fm *m)
{
	unsigned n = 0, want = 1 + (unsigned)rnd(m, FM_TXN_MAX), k[FM_TXN_MAX];
	int64_t slot[FM_TXN_MAX];
	int32_t st[FM_TXN_MAX];
	uint32_t ids[FM_TXN_MAX];
	struct tt_memmap map = mem_map(m, rnd(m, 4) ? 0 : 8);
	struct tt_txn *t;
	int ret, any_submit;

	m->op = "read";
	/* Distinct stored keys: one block per slot, so a fault maps to one block. */
	for (unsigned i = (unsigned)rnd(m, m->n_keys), j = 0; j < m->n_keys && n < want; j++)
		if (m->in[(i + j) % m->n_keys])
			k[n++] = (i + j) % m->n_keys;
	if (!n)
		return op_put(m);
	pick_ids(m, ids, n);
	for (unsigned i = 0; i < n; i++) {
		slot[i] = m->slot[k[i]];
		for (unsigned o = 0; o < FM_L * FM_S; o++)
			memset(mem_obj(m, ids[i], o), 0x5a, FM_SPAN);
	}
	arm_random(m);
	ret = tt_store_read_begin(m->s, slot, n, &t);
	if (ret) {
		disarm(m);
		broke(m, "read of stored slots refused: %s", tt_errmsg());
		return;
	}
	run_layers(m, t, &map, ids, -1);
	if (rnd(m, 10) == 0) {
		tt_txn_abort(t);
		disarm(m);
		after_step(m, NULL, NULL, 1);
		return;
	}
	ret = tt_txn_finish(t, st);
	disarm(m);
	any_submit = data_hit(m, TT_OP_READ, TT_FAULT_SUBMIT);
	for (unsigned i = 0; i < n; i++) {
		int hit = slot_hit(m, slot[i], TT_OP_READ);

		if (st[i] == -EBADMSG)
			broke(m, "read took an I/O error for corruption (block %u)", i);
		if (!st[i] && !mem_is(m, ids[i], k[i]))
			broke(m, "read of key %u returned status 0 with wrong bytes (verification %s)",
			      k[i], m->flags & TT_OPEN_NO_VERIFY ? "off" : "on");
		if (!st[i] && hit)
			broke(m, "block %u reported ok though a read of its data failed", i);
		if (st[i] && !hit && !any_submit)
			broke(m, "block %u failed (%d) though no fault touched it", i, st[i]);
		if (st[i] && !err_explained(m, slot[i], TT_OP_READ, st[i]))
			broke(m, "block %u failed with %d, the error of no fault", i, st[i]);
		if (!st[i]) {
			m->st->blocks_compared++;
			m->st->unverified_reads += !!(m->flags & TT_OPEN_NO_VERIFY);
		} else {
			m->st->failed_blocks++;
		}
	}
	if (ret < 0)
		broke(m, "read finish failed: %s", tt_errmsg());
	after_step(m, NULL, NULL, 1);
}

static void op_invalidate(struct fm *m)
{
	uint8_t drop[FM_KEYS] = { 0 };
	int64_t slots[3];
	unsigned n = 0;
	int ret;

	m->op = "invalidate";
	for (unsigned i = 0; i < 1 + rnd(m, 3); i++) {
		unsigned k = pick_key(m, 1);

		if (m->in[k] && !drop[k]) {
			drop[k] = 1;
			slots[n++] = m->slot[k];
		}
	}
	arm_random(m);
	ret = tt_store_invalidate(m->s, slots, n);
	disarm(m);
	after_step(m, drop, NULL, ret >= 0);
	for (unsigned k = 0; k < m->n_keys; k++)
		if (drop[k] && m->in[k])
			broke(m, "invalidated key %u is still served", k);
}

static void op_check(struct fm *m)
{
	struct tt_check_result r = { 0 };
	int repair = (int)rnd(m, 2), ret;

	m->op = repair ? "check --repair" : "check";
	arm_random(m);
	ret = tt_store_check(m->s, 0, UINT64_MAX, repair, &r, NULL, 0);
	disarm(m);
	if (ret < 0)
		broke(m, "check failed: %s", tt_errmsg());
	if (r.bad || r.bad_records || r.repaired)
		broke(m, "check found %llu bad, %llu bad records, repaired %llu: I/O errors taken "
		      "for corruption", (unsigned long long)r.bad, (unsigned long long)r.bad_records,
		      (unsigned long long)r.repaired);
	if (r.unreadable && !data_hit(m, TT_OP_READ, 0))
		broke(m, "check: %llu unreadable without a fault", (unsigned long long)r.unreadable);
	after_step(m, NULL, NULL, 1);
}

static int open_live(struct fm *m)
{
	struct tt_open_params op = { .engine = m->eng, .flags = m->flags };
	int ret = tt_store_open(m->c->paths, m->c->n_paths, &op, &m->s);

	if (ret)
		return ret;
	m->g = tt_store_geometry(m->s);
	return 0;
}

static void op_reopen(struct fm *m)
{
	uint8_t now[FM_KEYS];

	m->op = "reopen";
	m->st->reopens++;
	arm_random(m);	/* the close's table write may fail */
	tt_store_close(m->s);
	m->s = NULL;
	if (open_live(m)) {
		broke(m, "the store does not reopen: %s", tt_errmsg());
		return;
	}
	index_of(m, m->s, now, m->slot);
	for (unsigned k = 0; k < m->n_keys; k++) {
		if (m->durable[k] && !now[k])
			broke(m, "key %u was committed durably and is lost at reopen", k);
		if (now[k] && (m->gone[k] || !m->ever[k]))
			broke(m, "key %u is back after reopen", k);
		m->in[k] = now[k];
		m->durable[k] = now[k];	/* what open found is on disk */
		if (!now[k])
			m->slot[k] = -1;
	}
	{
		struct tt_store_info info;

		tt_store_get_info(m->s, &info);
		m->stats = info.stats;
	}
}

/* --- a schedule --------------------------------------------------------- */

static int format_fresh(struct fm *m)
{
	struct tt_format_params p;
	struct stat st;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "test/fault-model");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = FM_L;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;	/* span 4 KiB */
	p.n_slots = m->n_keys * 3 / 5;
	p.stripe_objs = 5;	/* a block's objects spread over every member */
	p.flags = TT_FORMAT_FORCE;
	/* Regular files are recreated: sparse again, so a full filesystem can bite. */
	for (unsigned i = 0; i < m->c->n_paths; i++)
		if (!stat(m->c->paths[i], &st) && S_ISREG(st.st_mode))
			unlink(m->c->paths[i]);
	return tt_store_format(m->c->paths, m->c->n_paths, &p);
}

/* Are the members regular files?  (Sets m->files; 0, or -1 if one cannot be looked at.) */
static int members_are_files(struct fm *m)
{
	struct stat st;

	m->files = 1;
	for (unsigned i = 0; i < m->c->n_paths; i++) {
		if (stat(m->c->paths[i], &st))
			return tt_seterr(-errno, "%s: %s", m->c->paths[i], strerror(errno));
		m->files &= S_ISREG(st.st_mode);
	}
	return 0;
}

int fm_run(const struct fm_config *c, uint64_t seed, struct fm_stats *st, char *why,
	   size_t why_len)
{
	struct fm *m = calloc(1, sizeof(*m));
	unsigned steps = c->steps ? c->steps : 16;
	int ret = 0;

	if (!m) {
		snprintf(why, why_len, "out of memory");
		return -1;
	}
	m->c = c;
	m->st = st;
	m->why = why;
	m->why_len = why_len;
	m->rng = seed;
	m->op = "setup";
	snprintf(m->eng, sizeof(m->eng), "fault:%s", c->engine);
	m->flags = rnd(m, 2) ? TT_OPEN_NO_VERIFY : 0;
	/* More keys than slots, so the store evicts. */
	m->n_keys = (unsigned)((c->n_slots ? c->n_slots : 24) * 5 / 3);
	if (m->n_keys > FM_KEYS)
		m->n_keys = FM_KEYS;
	if (m->n_keys < 5)
		m->n_keys = 5;
	for (unsigned k = 0; k < m->n_keys; k++) {
		tt_key_from_bytes(&k, sizeof(k), m->keys[k]);
		m->slot[k] = -1;
	}
	m->mem = aligned_alloc(4096, (size_t)FM_L * FM_S * FM_MEMB * FM_SPAN + 4096);
	if (!m->mem || format_fresh(m) || open_live(m) || members_are_files(m)) {
		snprintf(why, why_len, "setup: %s", m->mem ? tt_errmsg() : "out of memory");
		free(m->mem);
		free(m);
		return -1;
	}
	st->schedules++;
	for (m->step = 0; m->step < steps && !m->broken; m->step++) {
		unsigned w = (unsigned)rnd(m, 100);

		st->steps++;
		if (w < 25)
			op_put(m);
		else if (w < 45)
			op_write(m);
		else if (w < 60)
			op_get(m);
		else if (w < 78)
			op_read(m);
		else if (w < 86)
			op_invalidate(m);
		else if (w < 93)
			op_check(m);
		else
			op_reopen(m);
		if (!m->s)
			break;
		if (!m->broken)
			check_disk(m);
	}
	/* At the end, a clean close and reopen holds every durable key, exactly. */
	if (!m->broken && m->s) {
		uint8_t now[FM_KEYS];

		m->step = steps;
		m->op = "final reopen";
		tt_store_close(m->s);
		m->s = NULL;
		if (open_live(m)) {
			broke(m, "the store does not reopen: %s", tt_errmsg());
		} else {
			index_of(m, m->s, now, NULL);
			for (unsigned k = 0; k < m->n_keys; k++)
				if (now[k] != m->in[k])
					broke(m, "key %u %s by a clean close and reopen", k,
					      now[k] ? "came back" : "was lost");
			check_disk(m);
		}
	}
	if (m->s)
		tt_store_close(m->s);
	ret = m->broken;
	free(m->mem);
	free(m);
	return ret;
}
