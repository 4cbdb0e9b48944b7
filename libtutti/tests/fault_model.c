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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "fault_model.h"

#define FM_KEYS		256u	/* at most; a schedule uses 5/3 of its slots */
#define FM_SLOTS	256u
#define FM_L		4u
#define FM_S		2u
#define FM_SPAN		4096u
#define FM_BLOCK	(FM_L * FM_S * FM_SPAN)
#define FM_MEMB		8u	/* memory blocks a transaction can use */
#define FM_TXN_MAX	6u
#define FM_HITS		4096u

struct fm {
	const struct fm_config *c;
	struct fm_stats *st;
	char *why;
	size_t why_len;
	int broken;
	uint64_t rng;
	unsigned step;
	const char *op;
	char eng[40];
	uint32_t flags;			/* the live handle's open flags */
	struct tt_store *s;
	const struct tt_geometry *g;
	uint8_t keys[FM_KEYS][TT_KEY_BYTES];
	uint8_t in[FM_KEYS];		/* in the live index after the last step */
	int64_t slot[FM_KEYS];
	uint8_t durable[FM_KEYS];	/* committed with its record on disk */
	uint8_t gone[FM_KEYS];		/* removed with its EMPTY record on disk */
	uint8_t ever[FM_KEYS];		/* committed at some point */
	unsigned n_keys;
	struct tt_store_stats stats;	/* the live handle's, after the last step */
	struct tt_fault_hit hits[FM_HITS];
	int n_hits;
	uint8_t *mem;
	uint64_t base[FM_L * FM_S], stride[FM_L * FM_S];
	uint8_t val[FM_BLOCK], buf[FM_BLOCK];
};

/* --- small helpers -------------------------------------------------------- */

static uint64_t rnd(struct fm *m, uint64_t n)
{
	uint64_t z = (m->rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return n ? (z ^ (z >> 31)) % n : 0;
}

__attribute__((format(printf, 2, 3)))
static int broke(struct fm *m, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (m->broken)
		return 1;
	m->broken = 1;
	n = snprintf(m->why, m->why_len, "step %u (%s): ", m->step, m->op);
	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < m->why_len)
		vsnprintf(m->why + n, m->why_len - (size_t)n, fmt, ap);
	va_end(ap);
	return 1;
}

/* The bytes of key @k, objects in (layer, span) order. */
static void value_of(unsigned k, uint8_t *out)
{
	uint64_t x = k * 0x9e3779b97f4a7c15ull + 0x1234567;

	for (size_t i = 0; i < FM_BLOCK; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(out + i, &x, 8);
	}
}

/* Memory: one area per object index, FM_MEMB blocks each; @shift breaks alignment. */
static struct tt_memmap mem_map(struct fm *m, unsigned shift)
{
	for (unsigned o = 0; o < FM_L * FM_S; o++) {
		m->base[o] = (uint64_t)(uintptr_t)(m->mem + shift + (size_t)o * FM_MEMB * FM_SPAN);
		m->stride[o] = FM_SPAN;
	}
	return (struct tt_memmap){ FM_L, FM_S, m->base, m->stride };
}

static uint8_t *mem_obj(struct fm *m, unsigned id, unsigned o)
{
	return (uint8_t *)(uintptr_t)(m->base[o] + (uint64_t)id * FM_SPAN);
}

static void mem_put(struct fm *m, unsigned id, unsigned k)
{
	value_of(k, m->val);
	for (unsigned o = 0; o < FM_L * FM_S; o++)
		memcpy(mem_obj(m, id, o), m->val + (size_t)o * FM_SPAN, FM_SPAN);
}

static int mem_is(struct fm *m, unsigned id, unsigned k)
{
	value_of(k, m->val);
	for (unsigned o = 0; o < FM_L * FM_S; o++)
		if (memcmp(mem_obj(m, id, o), m->val + (size_t)o * FM_SPAN, FM_SPAN))
			return 0;
	return 1;
}

/* Distinct memory block ids for @n blocks. */
static void pick_ids(struct fm *m, uint32_t *ids, unsigned n)
{
	uint32_t all[FM_MEMB];

	for (unsigned i = 0; i < FM_MEMB; i++)
		all[i] = i;
	for (unsigned i = 0; i < n; i++) {
		unsigned j = i + (unsigned)rnd(m, FM_MEMB - i);
		uint32_t x = all[i];

		all[i] = all[j];
		all[j] = x;
		ids[i] = all[i];
	}
}

/* --- faults ---------------------------------------------------------------- */

static void arm_random(struct fm *m)
{
	static const int errs[] = { -EIO, -EIO, -ENOSPC, -EAGAIN, -ETIMEDOUT };
	struct tt_fault r[3];
	unsigned n = rnd(m, 100) < 30 ? 0 : 1 + (unsigned)rnd(m, 3);

	for (unsigned i = 0; i < n; i++) {
		unsigned w = (unsigned)rnd(m, 100), op = (unsigned)rnd(m, 10);

		memset(&r[i], 0, sizeof(r[i]));
		r[i].kind = w < 30 ? TT_FAULT_IO : w < 45 ? TT_FAULT_SUBMIT : w < 60 ? TT_FAULT_SHORT :
			    w < 75 ? TT_FAULT_DELAY : w < 90 ? TT_FAULT_FLUSH : TT_FAULT_FULL;
		r[i].op = op < 4 ? TT_FAULT_ANY_OP : op < 7 ? TT_OP_READ : TT_OP_WRITE;
		/* Mostly within one operation's reach: a few batches, a few dozen ios. */
		r[i].nth = r[i].kind == TT_FAULT_SUBMIT ? rnd(m, 6) :
			   r[i].kind == TT_FAULT_FLUSH || r[i].kind == TT_FAULT_FULL ? rnd(m, 3) :
			   rnd(m, 2) ? rnd(m, 3) : rnd(m, 24);
		r[i].count = rnd(m, 10) ? 1 + rnd(m, 3) : 0;
		r[i].err = errs[rnd(m, 5)];
		if (r[i].kind == TT_FAULT_SUBMIT)
			r[i].arg = (uint32_t)rnd(m, 12);
		else if (r[i].kind == TT_FAULT_SHORT)
			r[i].arg = (uint32_t)rnd(m, 2) * FM_SPAN;
		else if (r[i].kind == TT_FAULT_DELAY)
			r[i].arg = 1 + (uint32_t)rnd(m, 4);
		else if (r[i].kind == TT_FAULT_FULL)
			r[i].arg = (uint32_t)rnd(m, 3) * FM_BLOCK / 2;
	}
	tt_engine_fault_arm(tt_store_engine(m->s), r, n);
}

/* Take what fired so far (the rules stay armed). */
static void drain(struct fm *m)
{
	m->n_hits = tt_engine_fault_hits(tt_store_engine(m->s), m->hits, FM_HITS);
	if (m->n_hits < 0) {
		broke(m, "fault hits lost");
		m->n_hits = 0;
	}
	for (int h = 0; h < m->n_hits; h++)
		m->st->faults += m->hits[h].err != 0;
}

/* Stop injecting; take what fired. */
static void disarm(struct fm *m)
{
	tt_engine_fault_arm(tt_store_engine(m->s), NULL, 0);
	drain(m);
}

static int hit_failed(const struct tt_fault_hit *h, unsigned op, unsigned kind)
{
	return h->err && (op == TT_FAULT_ANY_OP || h->op == op) && (!kind || h->kind == kind);
}

/* Did a failed @op hit (with error @err, 0: any) touch a data object of @slot? */
static int slot_hit_err(struct fm *m, int64_t slot, unsigned op, int err)
{
	for (int h = 0; h < m->n_hits; h++) {
		const struct tt_fault_hit *x = &m->hits[h];

		if (!hit_failed(x, op, 0) || x->off < m->g->data_off || (err && x->err != err))
			continue;
		for (uint32_t l = 0; l < FM_L; l++)
			for (uint32_t k = 0; k < FM_S; k++) {
				struct tt_extent e;

				tt_store_locate(m->s, (uint64_t)slot, l, k, &e);
				if (x->member == e.member && x->off < e.off + e.len &&
				    e.off < x->off + x->len)
					return 1;
			}
	}
	return 0;
}

static int slot_hit(struct fm *m, int64_t slot, unsigned op)
{
	return slot_hit_err(m, slot, op, 0);
}

/*
 * Is @err, the status of the block in @slot, the error of a fault that
 * failed it: one that touched it, a refused submit of its data, a flush?
 * (An I/O error keeps its errno.)
 */
static int err_explained(struct fm *m, int64_t slot, unsigned op, int err)
{
	if (slot_hit_err(m, slot, op, err))
		return 1;
	for (int h = 0; h < m->n_hits; h++) {
		const struct tt_fault_hit *x = &m->hits[h];

		if (x->err == err && ((x->kind == TT_FAULT_SUBMIT && x->op == op &&
				       x->off >= m->g->data_off) || x->kind == TT_FAULT_FLUSH))
			return 1;
	}
	return 0;
}

/* Did any failed hit of @op and @kind (0: any) touch the data region? */
static int data_hit(struct fm *m, unsigned op, unsigned kind)
{
	for (int h = 0; h < m->n_hits; h++)
		if (hit_failed(&m->hits[h], op, kind) && m->hits[h].off >= m->g->data_off)
			return 1;
	return 0;
}

static int flush_hit(struct fm *m)
{
	for (int h = 0; h < m->n_hits; h++)
		if (m->hits[h].kind == TT_FAULT_FLUSH)
			return 1;
	return 0;
}

/* --- the model ---------------------------------------------------------- */

/* Which model keys store @s holds now (and where); 0, or 1 on a foreign key. */
static int index_of(struct fm *m, struct tt_store *s, uint8_t *in, int64_t *slot)
{
	uint64_t n = m->g->n_slots;
	uint8_t keys[FM_SLOTS * TT_KEY_BYTES];
	int64_t slots[FM_SLOTS];
	int found = tt_store_list(s, 0, n, keys, slots, FM_SLOTS);

	memset(in, 0, FM_KEYS);
	for (int i = 0; i < found && i < (int)FM_SLOTS; i++) {
		unsigned k = 0;

		while (k < m->n_keys && memcmp(m->keys[k], keys + (size_t)i * TT_KEY_BYTES, TT_KEY_BYTES))
			k++;
		if (k == m->n_keys)
			return broke(m, "the store holds a key nobody stored");
		if (in[k])
			return broke(m, "key %u is indexed twice", k);
		in[k] = 1;
		if (slot)
			slot[k] = slots[i];
	}
	return 0;
}

/*
 * After a step: what changed in the index must be allowed.  Keys may vanish
 * only by eviction (at most as many as were counted) or when @dropped allows
 * them; only keys @may_add allows may appear.
 */
static void after_step(struct fm *m, const uint8_t *dropped, const uint8_t *may_add,
		       int durable_ok)
{
	uint8_t now[FM_KEYS];
	int64_t slot[FM_KEYS];
	struct tt_store_info info;
	uint64_t vanished = 0, evicted;

	index_of(m, m->s, now, slot);
	tt_store_get_info(m->s, &info);
	evicted = info.stats.evictions - m->stats.evictions;
	if (info.stats.corrupt_blocks != m->stats.corrupt_blocks)
		broke(m, "%llu block(s) taken for corrupt (no corruption was injected)",
		      (unsigned long long)(info.stats.corrupt_blocks - m->stats.corrupt_blocks));
	for (unsigned k = 0; k < m->n_keys; k++) {
		if (m->in[k] && !now[k]) {
			if (!(dropped && dropped[k]))
				vanished++;
			m->durable[k] = 0;
			/* Its removal is on disk if the step succeeded. */
			m->gone[k] = durable_ok;
		}
		if (!m->in[k] && now[k]) {
			if (!(may_add && may_add[k]))
				broke(m, "key %u appeared", k);
			m->ever[k] = 1;
			m->gone[k] = 0;
		}
		m->in[k] = now[k];
		m->slot[k] = now[k] ? slot[k] : -1;
	}
	if (vanished > evicted)
		broke(m, "%llu key(s) vanished, %llu eviction(s) counted",
		      (unsigned long long)vanished, (unsigned long long)evicted);
	m->stats = info.stats;
}

/*
 * The slot table was written and flushed whole (a put or a write's finish
 * succeeded): every key the live index holds is on disk.
 */
static void table_synced(struct fm *m)
{
	memcpy(m->durable, m->in, FM_KEYS);
}

/*
 * A write failed: a victim of its eviction may be back in the index while
 * its EMPTY record reached the disk, so no key is known to be on disk until
 * the table is written whole again.
 */
static void table_unsure(struct fm *m)
{
	memset(m->durable, 0, FM_KEYS);
}

/*
 * What a restart would find now: a second, read-only handle on the members
 * (its reads unverified) must open, check clean, hold every durable key and
 * no removed one, and return exactly each key's bytes.
 */
static void check_disk(struct fm *m)
{
	struct tt_open_params op = { .engine = m->c->engine,
				     .flags = TT_OPEN_RDONLY | TT_OPEN_SHARED | TT_OPEN_NO_VERIFY };
	struct tt_check_result r = { 0 };
	struct tt_store *v;
	uint8_t in[FM_KEYS];
	int ret;

	m->st->disk_checks++;
	ret = tt_store_open(m->c->paths, m->c->n_paths, &op, &v);
	if (ret) {
		broke(m, "the store as on disk does not open: %s", tt_errmsg());
		return;
	}
	ret = tt_store_check(v, 0, UINT64_MAX, 0, &r, NULL, 0);
	if (ret || r.bad || r.bad_records || r.unreadable)
		broke(m, "the store as on disk does not check clean: %d, %llu bad, %llu bad records, "
		      "%llu unreadable", ret, (unsigned long long)r.bad,
		      (unsigned long long)r.bad_records, (unsigned long long)r.unreadable);
	index_of(m, v, in, NULL);
	for (unsigned k = 0; k < m->n_keys && !m->broken; k++) {
		if (m->durable[k] && !in[k])
			broke(m, "key %u was committed durably but is not on disk", k);
		if (in[k] && (m->gone[k] || !m->ever[k]))
			broke(m, "key %u is on disk though %s", k,
			      m->gone[k] ? "its removal was" : "it never was committed");
		if (!in[k])
			continue;
		ret = tt_store_get(v, m->keys[k], m->buf, FM_BLOCK);
		value_of(k, m->val);
		if (ret || memcmp(m->buf, m->val, FM_BLOCK))
			broke(m, "after a crash now key %u would read %s", k,
			      ret ? tt_errmsg() : "wrong bytes (verification off)");
		m->st->blocks_compared++;
		m->st->unverified_reads++;
	}
	tt_store_close(v);
}

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
	if (!m->mem || format_fresh(m) || open_live(m)) {
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
