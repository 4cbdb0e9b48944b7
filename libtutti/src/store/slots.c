// SPDX-License-Identifier: Apache-2.0
/*
 * The slot table: on-disk records mirrored in memory, a key index (open
 * addressing, linear probing, backward-shift deletion), an LRU list of
 * committed slots and a stack of free ones.  All O(1) per operation.
 */
#include <stdlib.h>
#include <string.h>

#include "tutti/error.h"
#include "store_impl.h"
#include "../support/util.h"

#define RECS_PER_PAGE (TT_OBJ_ALIGN / TT_RECORD_SIZE)
/* After a full filesystem, every this many allocations try a free slot again. */
#define NOSPACE_RETRY 64u

static void write_record(struct tt_store *s, uint64_t slot);

static uint64_t key_hash(const uint8_t *key)
{
	uint64_t h;

	memcpy(&h, key, sizeof(h));	/* keys are already hashes */
	return h;
}

static void ht_insert(struct tt_slots *t, uint64_t slot)
{
	uint64_t i = key_hash(t->rec[slot].key) & t->ht_mask;

	while (t->ht[i])
		i = (i + 1) & t->ht_mask;
	t->ht[i] = (uint32_t)slot + 1;
}

int64_t tt_slots_find(struct tt_slots *t, const uint8_t *key)
{
	uint64_t i = key_hash(key) & t->ht_mask;

	for (; t->ht[i]; i = (i + 1) & t->ht_mask) {
		uint32_t slot = t->ht[i] - 1;

		if (!memcmp(t->rec[slot].key, key, TT_KEY_BYTES))
			return slot;
	}
	return -1;
}

static void ht_remove(struct tt_slots *t, uint64_t slot)
{
	uint64_t i = key_hash(t->rec[slot].key) & t->ht_mask, j;

	while (t->ht[i] != slot + 1) {
		if (!t->ht[i])
			return;
		i = (i + 1) & t->ht_mask;
	}
	/* Backward shift: keep every later entry reachable from its home. */
	for (j = i;;) {
		uint64_t home;

		t->ht[i] = 0;
		for (;;) {
			j = (j + 1) & t->ht_mask;
			if (!t->ht[j])
				return;
			home = key_hash(t->rec[t->ht[j] - 1].key) & t->ht_mask;
			if (i <= j ? (home <= i || home > j) : (home <= i && home > j))
				break;
		}
		t->ht[i] = t->ht[j];
		i = j;
	}
}

static void lru_unlink(struct tt_slots *t, uint32_t s)
{
	if (t->prev[s] != TT_NIL)
		t->next[t->prev[s]] = t->next[s];
	else
		t->lru_head = t->next[s];
	if (t->next[s] != TT_NIL)
		t->prev[t->next[s]] = t->prev[s];
	else
		t->lru_tail = t->prev[s];
	t->prev[s] = t->next[s] = TT_NIL;
}

static void lru_push_tail(struct tt_slots *t, uint32_t s)
{
	t->prev[s] = t->lru_tail;
	t->next[s] = TT_NIL;
	if (t->lru_tail != TT_NIL)
		t->next[t->lru_tail] = s;
	else
		t->lru_head = s;
	t->lru_tail = s;
}

static void lru_push_head(struct tt_slots *t, uint32_t s)
{
	t->prev[s] = TT_NIL;
	t->next[s] = t->lru_head;
	if (t->lru_head != TT_NIL)
		t->prev[t->lru_head] = s;
	else
		t->lru_tail = s;
	t->lru_head = s;
}

void tt_slots_touch(struct tt_slots *t, uint64_t slot)
{
	if (t->state[slot] != TT_MS_COMMITTED || t->lru_tail == slot)
		return;
	lru_unlink(t, (uint32_t)slot);
	lru_push_tail(t, (uint32_t)slot);
}

void tt_slots_free(struct tt_slots *t)
{
	free(t->rec);
	free(t->state);
	free(t->pins);
	free(t->prev);
	free(t->next);
	free(t->free);
	free(t->clearing);
	free(t->ht);
	free(t->dirty);
	memset(t, 0, sizeof(*t));
}

int tt_slot_record_ok(const struct tt_store *s, uint64_t slot)
{
	const struct tt_slot_record *r = &s->slots.rec[slot];

	return r->rec_sum == tt_sum_record(r, slot) &&
	       (r->state == TT_SLOT_EMPTY ||
		(r->state == TT_SLOT_COMMITTED && r->span_bytes == s->geo.span_bytes));
}

static int is_zero(const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

/* Wait with reusing @slot until its (now EMPTY) record is on disk. */
static void wait_for_clear(struct tt_slots *t, uint64_t slot)
{
	t->state[slot] = TT_MS_CLEARING;
	t->clearing[t->n_clearing++] = (uint32_t)slot;
}

/*
 * An older commit of a key committed again in another slot (its EMPTY record
 * never reached the disk): cleared now, reused once that is on disk.
 */
static void clear_stale(struct tt_store *s, uint64_t slot)
{
	struct tt_slot_record *r = &s->slots.rec[slot];
	uint64_t gen = r->gen;

	memset(r, 0, sizeof(*r));
	r->gen = gen + 1;
	r->state = TT_SLOT_EMPTY;
	write_record(s, slot);
	wait_for_clear(&s->slots, slot);
}

/* Index the committed record of @slot; of two records of one key the newest wins. */
static void load_committed(struct tt_store *s, uint64_t slot)
{
	struct tt_slots *t = &s->slots;
	const struct tt_slot_record *r = &t->rec[slot];
	int64_t prev = tt_slots_find(t, r->key);

	if (r->commit_seq >= t->next_seq)
		t->next_seq = r->commit_seq + 1;
	if (prev >= 0 && t->rec[prev].commit_seq >= r->commit_seq) {
		clear_stale(s, slot);
		return;
	}
	if (prev >= 0) {
		ht_remove(t, (uint64_t)prev);
		clear_stale(s, (uint64_t)prev);
	}
	t->state[slot] = TT_MS_COMMITTED;
	ht_insert(t, slot);
}

static int cmp_seq(const void *a, const void *b, void *arg)
{
	const struct tt_slot_record *rec = arg;
	uint64_t x = rec[*(const uint32_t *)a].commit_seq;
	uint64_t y = rec[*(const uint32_t *)b].commit_seq;

	return x < y ? -1 : x > y;
}

int tt_slots_load(struct tt_store *s)
{
	struct tt_slots *t = &s->slots;
	uint64_t n = s->geo.n_slots, ht_size = 1, n_commit = 0;
	uint64_t pages = s->sb.table_bytes / TT_OBJ_ALIGN;
	uint32_t *order;
	int ret;

	memset(t, 0, sizeof(*t));
	t->n = n;
	while (ht_size < 2 * n)
		ht_size <<= 1;
	t->ht_mask = ht_size - 1;
	t->rec = tt_alloc_aligned(s->sb.table_bytes);
	t->state = calloc(n, 1);
	t->pins = calloc(n, sizeof(*t->pins));
	t->prev = malloc(n * sizeof(*t->prev));
	t->next = malloc(n * sizeof(*t->next));
	t->free = malloc(n * sizeof(*t->free));
	t->clearing = malloc(n * sizeof(*t->clearing));
	t->ht = calloc(ht_size, sizeof(*t->ht));
	t->dirty = calloc(pages, 1);
	order = malloc(n * sizeof(*order));
	if (!t->rec || !t->state || !t->pins || !t->prev || !t->next || !t->free ||
	    !t->clearing || !t->ht || !t->dirty || !order) {
		free(order);
		tt_slots_free(t);
		return tt_seterr(-ENOMEM, "out of memory for %llu slots",
				 (unsigned long long)n);
	}
	ret = tt_member_pread(&s->members[0], t->rec, s->sb.table_bytes,
			      s->sb.table_off);
	if (ret) {
		free(order);
		tt_slots_free(t);
		return ret;
	}
	t->lru_head = t->lru_tail = TT_NIL;
	for (uint64_t i = 0; i < n; i++) {
		const struct tt_slot_record *r = &t->rec[i];

		t->prev[i] = t->next[i] = TT_NIL;
		if (is_zero(r, sizeof(*r)))
			continue;	/* never written: free */
		if (!tt_slot_record_ok(s, i)) {
			t->state[i] = TT_MS_BAD;
			t->n_bad++;
		} else if (r->state == TT_SLOT_COMMITTED) {
			load_committed(s, i);
		}
	}
	for (uint64_t i = 0; i < n; i++)
		if (t->state[i] == TT_MS_COMMITTED)
			order[n_commit++] = (uint32_t)i;
	/* LRU order across restarts: commit order. */
	qsort_r(order, n_commit, sizeof(*order), cmp_seq, t->rec);
	for (uint64_t i = 0; i < n_commit; i++)
		lru_push_tail(t, order[i]);
	t->n_committed = n_commit;
	/* Low slots first, so fresh stores fill from the start. */
	for (uint64_t i = n; i-- > 0;)
		if (t->state[i] == TT_MS_FREE)
			t->free[t->n_free++] = (uint32_t)i;
	free(order);
	/* Stale duplicates: their EMPTY records now (a failure: at a later sync). */
	if (t->n_clearing && !(s->flags & TT_OPEN_RDONLY) && tt_slots_sync(s, 1))
		tt_clearerr();
	return 0;
}

static void mark_dirty(struct tt_store *s, uint64_t slot)
{
	s->slots.dirty[slot / RECS_PER_PAGE] = 1;
}

static void write_record(struct tt_store *s, uint64_t slot)
{
	struct tt_slot_record *r = &s->slots.rec[slot];

	r->rec_sum = tt_sum_record(r, slot);
	mark_dirty(s, slot);
}

/* The least recently used committed slot no transaction pins, or TT_NIL. */
static uint32_t lru_victim(const struct tt_slots *t)
{
	uint32_t v;

	for (v = t->lru_head; v != TT_NIL; v = t->next[v])
		if (!t->pins[v])
			break;
	return v;
}

/*
 * After a write met a full filesystem: a slot that held data has space
 * behind it, a free one may not (a sparse member file), so evict first.
 * Now and then a free slot is tried again: the space may be back.
 */
static int evict_first(struct tt_slots *t)
{
	return t->nospace && ++t->nospace_allocs % NOSPACE_RETRY != 0;
}

int64_t tt_slots_alloc(struct tt_store *s, int *evicted, struct tt_slot_record *old)
{
	struct tt_slots *t = &s->slots;
	uint32_t v = TT_NIL;

	*evicted = 0;
	if (t->n_free && !(evict_first(t) && (v = lru_victim(t)) != TT_NIL)) {
		v = t->free[--t->n_free];
		t->state[v] = TT_MS_WRITING;
		return v;
	}
	if (v == TT_NIL)
		v = lru_victim(t);
	if (v == TT_NIL)
		return -1;
	*old = t->rec[v];
	tt_slots_set_empty(s, v, TT_MS_WRITING);
	s->st.evictions++;
	*evicted = 1;
	return v;
}

uint64_t tt_slots_can_take(struct tt_store *s, uint64_t need)
{
	struct tt_slots *t = &s->slots;
	uint64_t can;

	/* Slots waiting for their EMPTY record come before evicting good blocks. */
	if (t->n_free < need && t->n_clearing)
		tt_slots_sync(s, 1);
	can = t->n_free;
	for (uint32_t v = t->lru_head; v != TT_NIL && can < need; v = t->next[v])
		can += !t->pins[v];
	return can;
}

void tt_slots_unevict(struct tt_store *s, uint64_t slot, const struct tt_slot_record *old)
{
	struct tt_slots *t = &s->slots;

	t->rec[slot] = *old;
	mark_dirty(s, slot);	/* the disk may hold the EMPTY one: write it back */
	t->state[slot] = TT_MS_COMMITTED;
	ht_insert(t, slot);
	lru_push_head(t, (uint32_t)slot);
	t->n_committed++;
	s->st.evictions--;
}

void tt_slots_note_nospace(struct tt_slots *t)
{
	t->nospace = 1;
	t->nospace_allocs = 0;
}

void tt_slots_note_space(struct tt_slots *t)
{
	t->nospace = 0;
}

void tt_slots_release(struct tt_slots *t, uint64_t slot)
{
	/* Its record may still say COMMITTED on disk: reuse waits for the EMPTY one. */
	if (t->dirty[slot / RECS_PER_PAGE]) {
		wait_for_clear(t, slot);
		return;
	}
	t->state[slot] = TT_MS_FREE;
	t->free[t->n_free++] = (uint32_t)slot;
}

uint64_t tt_slots_clearing(const struct tt_slots *t)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < t->n_clearing; i++)
		n += t->state[t->clearing[i]] == TT_MS_CLEARING;
	return n;
}

/* Every record is on disk: slots waiting for theirs become free. */
static void clearing_done(struct tt_slots *t)
{
	for (uint64_t i = 0; i < t->n_clearing; i++) {
		uint32_t slot = t->clearing[i];

		if (t->state[slot] != TT_MS_CLEARING)
			continue;
		t->state[slot] = TT_MS_FREE;
		t->free[t->n_free++] = slot;
	}
	t->n_clearing = 0;
}

void tt_slots_unpin(struct tt_slots *t, uint64_t slot)
{
	if (t->pins[slot] && !--t->pins[slot] && t->state[slot] == TT_MS_DROPPED)
		tt_slots_release(t, slot);
}

/* Drop a slot's content: record becomes EMPTY (dirty); memory state @st. */
void tt_slots_set_empty(struct tt_store *s, uint64_t slot, enum tt_slot_state st)
{
	struct tt_slots *t = &s->slots;
	struct tt_slot_record *r = &t->rec[slot];
	uint64_t gen = r->gen;

	if (t->state[slot] == TT_MS_COMMITTED) {
		ht_remove(t, slot);
		lru_unlink(t, (uint32_t)slot);
		t->n_committed--;
	} else if (t->state[slot] == TT_MS_BAD) {
		t->n_bad--;
		gen = 0;	/* damaged record: nothing in it can be trusted */
	}
	memset(r, 0, sizeof(*r));
	r->gen = gen + 1;
	r->state = TT_SLOT_EMPTY;
	write_record(s, slot);
	t->state[slot] = (uint8_t)st;
	if (st == TT_MS_DROPPED && !t->pins[slot])
		st = TT_MS_FREE;
	if (st == TT_MS_FREE)
		tt_slots_release(t, slot);
}

void tt_slots_commit(struct tt_store *s, uint64_t slot, const uint8_t *key,
		     uint64_t data_sum)
{
	struct tt_slots *t = &s->slots;
	struct tt_slot_record *r = &t->rec[slot];

	memcpy(r->key, key, TT_KEY_BYTES);
	r->gen++;
	r->data_sum = data_sum;
	r->commit_seq = t->next_seq++;
	r->state = TT_SLOT_COMMITTED;
	r->span_bytes = s->geo.span_bytes;
	r->reserved = 0;
	write_record(s, slot);
	t->state[slot] = TT_MS_COMMITTED;
	ht_insert(t, slot);
	lru_push_tail(t, (uint32_t)slot);
	t->n_committed++;
}

/* Write every dirty table page (one batch), then optionally flush. */
int tt_slots_sync(struct tt_store *s, int flush)
{
	struct tt_slots *t = &s->slots;
	uint64_t pages = s->sb.table_bytes / TT_OBJ_ALIGN, n = 0;
	struct tt_batch b = { 0 };
	struct tt_io *ios;
	int ret, wret;

	for (uint64_t p = 0; p < pages; p++)
		n += t->dirty[p];
	if (!n) {
		clearing_done(t);
		return 0;
	}
	ios = calloc(n, sizeof(*ios));
	if (!ios)
		return tt_seterr(-ENOMEM, "out of memory");
	n = 0;
	for (uint64_t p = 0; p < pages; p++) {
		if (!t->dirty[p])
			continue;
		ios[n].buf = (char *)t->rec + p * TT_OBJ_ALIGN;
		ios[n].off = s->sb.table_off + p * TT_OBJ_ALIGN;
		ios[n].len = TT_OBJ_ALIGN;
		ios[n].member = 0;
		ios[n].op = TT_OP_WRITE;
		n++;
	}
	b.ios = ios;
	b.n = (uint32_t)n;
	ret = tt_engine_submit(s->eng, &b);
	/* Even a refused batch: what of it started must land before @ios goes. */
	wret = tt_engine_wait(s->eng, &b);
	tt_written_add_ios(s, ios, b.n, ret != 0);	/* refused: what of it moved */
	if (!ret)
		ret = wret;
	free(ios);
	if (ret)
		return tt_seterr(ret, "writing the slot table failed: %s", strerror(-ret));
	if (!flush)
		return 0;	/* written, not yet durable: still dirty */
	ret = tt_engine_flush(s->eng);
	if (ret)
		return tt_seterr(ret, "flushing the slot table failed: %s", strerror(-ret));
	/* Only records on disk make their pages clean. */
	memset(t->dirty, 0, pages);
	clearing_done(t);
	return 0;
}
