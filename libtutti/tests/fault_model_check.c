// SPDX-License-Identifier: Apache-2.0
/*
 * The fault-model driver's helpers, its view of the faults that fired, and
 * the model: what each step may change in the store's index, and the crash
 * view checked after every step (fault_model_impl.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fault_model_impl.h"

/* --- small helpers -------------------------------------------------------- */

uint64_t rnd(struct fm *m, uint64_t n)
{
	uint64_t z = (m->rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return n ? (z ^ (z >> 31)) % n : 0;
}

__attribute__((format(printf, 2, 3)))
int broke(struct fm *m, const char *fmt, ...)
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
void value_of(unsigned k, uint8_t *out)
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
struct tt_memmap mem_map(struct fm *m, unsigned shift)
{
	for (unsigned o = 0; o < FM_L * FM_S; o++) {
		m->base[o] = (uint64_t)(uintptr_t)(m->mem + shift + (size_t)o * FM_MEMB * FM_SPAN);
		m->stride[o] = FM_SPAN;
	}
	return (struct tt_memmap){ FM_L, FM_S, m->base, m->stride };
}

uint8_t *mem_obj(struct fm *m, unsigned id, unsigned o)
{
	return (uint8_t *)(uintptr_t)(m->base[o] + (uint64_t)id * FM_SPAN);
}

void mem_put(struct fm *m, unsigned id, unsigned k)
{
	value_of(k, m->val);
	for (unsigned o = 0; o < FM_L * FM_S; o++)
		memcpy(mem_obj(m, id, o), m->val + (size_t)o * FM_SPAN, FM_SPAN);
}

int mem_is(struct fm *m, unsigned id, unsigned k)
{
	value_of(k, m->val);
	for (unsigned o = 0; o < FM_L * FM_S; o++)
		if (memcmp(mem_obj(m, id, o), m->val + (size_t)o * FM_SPAN, FM_SPAN))
			return 0;
	return 1;
}

/* Distinct memory block ids for @n blocks. */
void pick_ids(struct fm *m, uint32_t *ids, unsigned n)
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

void arm_random(struct fm *m)
{
	static const int errs[] = { -EIO, -EIO, -ENOSPC, -EAGAIN, -ETIMEDOUT };
	struct tt_fault r[3];
	unsigned n = rnd(m, 100) < 30 ? 0 : 1 + (unsigned)rnd(m, 3), kept = 0;

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
		/*
		 * A full filesystem is a rule about sparse files: devices and
		 * tutti.ko nodes (kqueue) have no holes to fill, so it is
		 * not armed there.  Drawn all the same, so a seed makes the
		 * same schedule on every engine.
		 */
		if (r[i].kind != TT_FAULT_FULL || m->files)
			r[kept++] = r[i];
	}
	tt_engine_fault_arm(tt_store_engine(m->s), r, kept);
}

/* Take what fired so far (the rules stay armed). */
void drain(struct fm *m)
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
void disarm(struct fm *m)
{
	tt_engine_fault_arm(tt_store_engine(m->s), NULL, 0);
	drain(m);
}

int hit_failed(const struct tt_fault_hit *h, unsigned op, unsigned kind)
{
	return h->err && (op == TT_FAULT_ANY_OP || h->op == op) && (!kind || h->kind == kind);
}

/* Did a failed @op hit (with error @err, 0: any) touch a data object of @slot? */
int slot_hit_err(struct fm *m, int64_t slot, unsigned op, int err)
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

int slot_hit(struct fm *m, int64_t slot, unsigned op)
{
	return slot_hit_err(m, slot, op, 0);
}

/*
 * Is @err, the status of the block in @slot, the error of a fault that
 * failed it: one that touched it, a refused submit of its data, a flush?
 * (An I/O error keeps its errno.)
 */
int err_explained(struct fm *m, int64_t slot, unsigned op, int err)
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
int data_hit(struct fm *m, unsigned op, unsigned kind)
{
	for (int h = 0; h < m->n_hits; h++)
		if (hit_failed(&m->hits[h], op, kind) && m->hits[h].off >= m->g->data_off)
			return 1;
	return 0;
}

int flush_hit(struct fm *m)
{
	for (int h = 0; h < m->n_hits; h++)
		if (m->hits[h].kind == TT_FAULT_FLUSH)
			return 1;
	return 0;
}

/* --- the model ---------------------------------------------------------- */

/* Which model keys store @s holds now (and where); 0, or 1 on a foreign key. */
int index_of(struct fm *m, struct tt_store *s, uint8_t *in, int64_t *slot)
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
void after_step(struct fm *m, const uint8_t *dropped, const uint8_t *may_add,
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
void table_synced(struct fm *m)
{
	memcpy(m->durable, m->in, FM_KEYS);
}

/*
 * A write failed: a victim of its eviction may be back in the index while
 * its EMPTY record reached the disk, so no key is known to be on disk until
 * the table is written whole again.
 */
void table_unsure(struct fm *m)
{
	memset(m->durable, 0, FM_KEYS);
}

/*
 * What a restart would find now: a second, read-only handle on the members
 * (its reads unverified) must open, check clean, hold every durable key and
 * no removed one, and return exactly each key's bytes.
 */
void check_disk(struct fm *m)
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
