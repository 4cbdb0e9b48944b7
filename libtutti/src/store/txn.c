// SPDX-License-Identifier: Apache-2.0
/*
 * Transactions: blocks moving layer by layer between memory and the store.
 *
 * Write order (what makes a crash at any point safe):
 *   1. victims of eviction get an EMPTY record, flushed, before any of their
 *      bytes change (write_begin);
 *   2. data objects are written (one batch per layer), then flushed;
 *   3. commit records (key, generation, checksum) are written and flushed.
 * A crash before 3 leaves the slot EMPTY or still holding the old, intact
 * block; a record is only ever written for data already durable.
 *
 * A transaction bound to a data path (devpath.h, txn_dev.c) hands step 2's
 * moving and hashing to the path; slots, flushes, records and verification
 * stay here, the same code for both.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tutti/error.h"
#include "store_impl.h"
#include "txn_impl.h"
#include "../support/util.h"

static void txn_unlink(struct tt_txn *t)
{
	struct tt_txn **pp = &t->s->txns;

	while (*pp && *pp != t)
		pp = &(*pp)->next;
	if (*pp)
		*pp = t->next;
}

static void txn_free(struct tt_txn *t)
{
	uint32_t L = t->s->geo.n_layers;

	txn_dev_end(t);
	free(t->layer_ret);

	for (uint32_t l = 0; l < L; l++) {
		if (t->ios)
			free(t->ios[l]);
		if (t->stage)
			free(t->stage[l]);
		if (t->dst)
			free(t->dst[l]);
	}
	free(t->ios);
	free(t->stage);
	free(t->dst);
	free(t->batch);
	free(t->layer_state);
	free(t->cpu_read);
	free(t->sums);
	free(t->expect);
	free(t->status);
	free(t->keys);
	free(t->present);
	free(t->fresh);
	free(t->slot);
	free(t);
}

static struct tt_txn *txn_new(struct tt_store *s, unsigned n, int write)
{
	uint32_t L = s->geo.n_layers;
	struct tt_txn *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->s = s;
	t->n = n;
	t->write = write;
	t->slot = calloc(n ? n : 1, sizeof(*t->slot));
	t->present = calloc(n ? n : 1, 1);
	t->status = calloc(n ? n : 1, sizeof(*t->status));
	t->sums = calloc((size_t)(n ? n : 1) * tt_objs_per_slot(&s->geo), sizeof(*t->sums));
	t->layer_state = calloc(L, 1);
	t->cpu_read = calloc(L, 1);
	t->batch = calloc(L, sizeof(*t->batch));
	t->ios = calloc(L, sizeof(*t->ios));
	t->stage = calloc(L, sizeof(*t->stage));
	t->dst = calloc(L, sizeof(*t->dst));
	t->layer_ret = calloc(L, sizeof(*t->layer_ret));
	t->fresh = calloc(n ? n : 1, 1);
	if (write)
		t->keys = malloc((size_t)(n ? n : 1) * TT_KEY_BYTES);
	else
		t->expect = calloc(n ? n : 1, sizeof(*t->expect));
	if ((!write && !t->expect) || !t->slot || !t->present || !t->status || !t->sums || !t->layer_state ||
	    !t->cpu_read ||
	    !t->batch || !t->ios || !t->stage || !t->dst || !t->layer_ret || !t->fresh ||
	    (write && !t->keys)) {
		txn_free(t);
		return NULL;
	}
	return t;
}

static void txn_register(struct tt_txn *t)
{
	t->next = t->s->txns;
	t->s->txns = t;
}

/* Undo what a write transaction holds: slots back to free, pins dropped. */
static void txn_release(struct tt_txn *t)
{
	struct tt_slots *sl = &t->s->slots;

	for (unsigned i = 0; i < t->n; i++) {
		int64_t slot = t->slot[i];

		if (slot < 0)
			continue;
		if (t->write && !t->present[i])
			tt_slots_release(sl, (uint64_t)slot);
		else
			tt_slots_unpin(sl, (uint64_t)slot);
		t->slot[i] = -1;
	}
}

/* Is key @i of @t the same as an earlier key of it?  Its index, or -1. */
static int same_key_before(const struct tt_txn *t, unsigned i)
{
	const uint8_t *key = t->keys + (size_t)i * TT_KEY_BYTES;

	for (unsigned j = 0; j < i; j++)
		if (!memcmp(t->keys + (size_t)j * TT_KEY_BYTES, key, TT_KEY_BYTES))
			return (int)j;
	return -1;
}

/*
 * Eviction could not be recorded (the victims' EMPTY records did not reach
 * the disk): nothing of theirs changed, so they stay stored, as they were.
 */
static void undo_evictions(struct tt_txn *t, const struct tt_slot_record *old)
{
	for (unsigned i = 0; i < t->n; i++) {
		if (t->slot[i] < 0 || t->present[i] || t->fresh[i])
			continue;
		tt_slots_unevict(t->s, (uint64_t)t->slot[i], &old[i]);
		t->slot[i] = -1;
	}
}

int tt_store_write_begin(struct tt_store *s, const uint8_t *keys, unsigned n,
			 struct tt_txn **out)
{
	struct tt_slots *sl = &s->slots;
	struct tt_slot_record *old = NULL;
	struct tt_txn *t;
	int any_evicted = 0, ret;
	int *dup = NULL;
	uint64_t need = 0, can;

	if (s->flags & TT_OPEN_RDONLY)
		return tt_seterr(-EROFS, "store is open read-only");
	t = txn_new(s, n, 1);
	old = calloc(n ? n : 1, sizeof(*old));
	dup = calloc(n ? n : 1, sizeof(*dup));
	if (!t || !old || !dup) {
		ret = tt_seterr(-ENOMEM, "out of memory");
		goto out_free;
	}
	memcpy(t->keys, keys, (size_t)n * TT_KEY_BYTES);
	/* Keys already stored are pinned and skipped; the others need a slot. */
	for (unsigned i = 0; i < n; i++) {
		int64_t slot = tt_slots_find(sl, keys + (size_t)i * TT_KEY_BYTES);

		t->slot[i] = -1;
		dup[i] = slot < 0 ? same_key_before(t, i) : -1;
		if (slot >= 0) {
			t->present[i] = 1;
			t->slot[i] = slot;
			sl->pins[slot]++;
			tt_slots_touch(sl, (uint64_t)slot);
		} else if (dup[i] < 0) {
			need++;
		}
	}
	/* Refuse before anything is evicted. */
	can = tt_slots_can_take(s, need);
	if (can < need) {
		ret = tt_seterr(-ENOSPC, "%llu new blocks need a slot each, but only %llu can be "
				"had (%llu free, the others pinned by open transactions or not "
				"yet cleared on disk; the store has %llu slots)",
				(unsigned long long)need, (unsigned long long)can,
				(unsigned long long)sl->n_free, (unsigned long long)sl->n);
		goto fail;
	}
	for (unsigned i = 0; i < n; i++) {
		int64_t slot;
		int evicted;

		if (t->present[i] || dup[i] >= 0)
			continue;
		slot = tt_slots_alloc(s, &evicted, &old[i]);
		if (slot < 0) {	/* tt_slots_can_take() said it would not happen */
			ret = tt_seterr(-ENOSPC, "no slot free");
			goto fail;
		}
		any_evicted |= evicted;
		t->fresh[i] = !evicted;
		t->slot[i] = slot;
	}
	/* The same key twice: the second rides on the first's slot. */
	for (unsigned i = 0; i < n; i++) {
		if (dup[i] < 0)
			continue;
		t->present[i] = 1;
		t->slot[i] = t->slot[dup[i]];
		sl->pins[t->slot[i]]++;
	}
	/* Victims must be EMPTY on disk before their bytes are overwritten. */
	if (any_evicted) {
		ret = tt_slots_sync(s, 1);
		if (ret)
			goto fail;
	}
	free(old);
	free(dup);
	txn_register(t);
	*out = t;
	return 0;
fail:
	undo_evictions(t, old);
	txn_release(t);
out_free:
	if (t)
		txn_free(t);
	free(old);
	free(dup);
	return ret;
}

int tt_store_read_begin(struct tt_store *s, const int64_t *slots, unsigned n,
			struct tt_txn **out)
{
	struct tt_slots *sl = &s->slots;
	struct tt_txn *t;

	for (unsigned i = 0; i < n; i++) {
		if (slots[i] < 0 || (uint64_t)slots[i] >= sl->n)
			return tt_seterr(-ERANGE, "slot %lld out of range (store has %llu)",
					 (long long)slots[i], (unsigned long long)sl->n);
		if (sl->state[slots[i]] != TT_MS_COMMITTED)
			return tt_seterr(-ENOENT, "slot %lld holds no block",
					 (long long)slots[i]);
	}
	t = txn_new(s, n, 0);
	if (!t)
		return tt_seterr(-ENOMEM, "out of memory");
	for (unsigned i = 0; i < n; i++) {
		t->slot[i] = slots[i];
		/* Judge the bytes against the record they were asked for. */
		t->expect[i] = sl->rec[slots[i]].data_sum;
		sl->pins[slots[i]]++;
	}
	txn_register(t);
	*out = t;
	return 0;
}

int64_t tt_txn_slot(const struct tt_txn *t, unsigned i, int *present)
{
	if (i >= t->n)
		return -1;
	if (present)
		*present = t->present[i];
	return t->slot[i];
}

/* Can the engine move this object straight from/to @addr? */
static int direct_ok(const struct tt_store *s, uint64_t addr, uint64_t stride)
{
	uint32_t a = s->mem_align;

	return s->geo.span_bytes == s->geo.obj_stride && addr % a == 0 && stride % a == 0;
}

static int cmp_io(const void *x, const void *y)
{
	const struct tt_io *a = x, *b = y;

	if (a->member != b->member)
		return a->member < b->member ? -1 : 1;
	return a->off < b->off ? -1 : a->off > b->off;
}

/*
 * A write layer the store's threads hash and copy now (txn_cpu_layer): done
 * when this returns, its I/O errors waiting for tt_txn_wait_layer() as an
 * engine's would.
 */
static int txn_cpu_write_layer(struct tt_txn *t, uint32_t layer)
{
	struct tt_batch *b = &t->batch[layer];
	int ret = txn_layer_move_now(t, layer, b->ios, b->n, t->dst[layer]);

	if (ret) {
		t->layer_state[layer] = LAYER_DONE;
		txn_fail_layer(t, layer, ret);
		return tt_seterr(ret, "layer %u: %s", layer, strerror(-ret));
	}
	tt_written_add_ios(t->s, b->ios, b->n, 1);
	t->layer_state[layer] = LAYER_DONE;
	t->layer_ret[layer] = txn_fail_ios(t, b->ios, b->n);
	return 0;
}

int tt_txn_layer(struct tt_txn *t, uint32_t layer, const struct tt_memmap *mem,
		 const uint32_t *block_ids)
{
	struct tt_store *s = t->s;
	const struct tt_geometry *g = &s->geo;
	uint32_t S = g->n_spans;
	unsigned n_io = 0, bounce = 0;
	struct tt_io *ios;
	char **dst;
	int ret;

	if (layer >= g->n_layers)
		return tt_seterr(-ERANGE, "layer %u out of range (store has %u)", layer,
				 g->n_layers);
	if (t->layer_state[layer] != LAYER_IDLE)
		return tt_seterr(-EALREADY, "layer %u already submitted", layer);
	if (mem->n_layers != g->n_layers || mem->n_spans != S)
		return tt_seterr(-EINVAL, "memory map has %u layers x %u spans, store %u x %u",
				 mem->n_layers, mem->n_spans, g->n_layers, S);
	if (t->dpo && !t->dp_live)
		return tt_seterr(-EINVAL, "the data path is done with this transaction");
	if (t->dpo)
		return txn_dev_layer(t, layer, mem);
	for (uint32_t k = 0; k < S; k++) {
		uint32_t m = tt_obj_index(g, layer, k);

		if (!direct_ok(s, mem->base[m], mem->stride[m]))
			bounce = 1;
	}
	ios = calloc((size_t)t->n * S + 1, sizeof(*ios));
	dst = calloc((size_t)t->n * S + 1, sizeof(*dst));
	if (!ios || !dst) {
		free(ios);
		free(dst);
		return tt_seterr(-ENOMEM, "out of memory");
	}
	if (bounce) {
		t->stage[layer] = tt_alloc_aligned((size_t)t->n * S * g->obj_stride);
		if (!t->stage[layer]) {
			free(ios);
			free(dst);
			return tt_seterr(-ENOMEM, "out of memory for a bounce buffer");
		}
	}
	for (unsigned i = 0; i < t->n; i++) {
		if (t->present[i])
			continue;
		for (uint32_t k = 0; k < S; k++) {
			uint32_t m = tt_obj_index(g, layer, k);
			char *mp = (char *)(uintptr_t)(mem->base[m] + block_ids[i] * mem->stride[m]);
			struct tt_extent e = tt_locate(g, (uint64_t)t->slot[i], layer, k);
			struct tt_io *io = &ios[n_io];
			char *buf = mp;

			if (bounce)
				buf = (char *)t->stage[layer] + ((size_t)i * S + k) * g->obj_stride;
			if (t->write && bounce)
				memcpy(buf, mp, g->span_bytes);
			io->buf = buf;
			io->off = e.off;
			io->len = bounce ? g->obj_stride : g->span_bytes;
			io->member = (uint16_t)e.member;
			io->op = t->write ? TT_OP_WRITE : TT_OP_READ;
			io->tag = i * S + k;
			dst[io->tag] = mp;
			n_io++;
		}
	}
	/* Disk order: adjacent objects merge into large requests. */
	qsort(ios, n_io, sizeof(*ios), cmp_io);
	t->ios[layer] = ios;
	t->dst[layer] = dst;
	t->batch[layer].ios = ios;
	t->batch[layer].n = n_io;
	t->layer_state[layer] = LAYER_SUBMITTED;
	if (txn_cpu_layer(t, ios, n_io)) {
		for (unsigned j = 0; j < n_io; j++)
			ios[j].res = 1;	/* pending */
		t->cpu_read[layer] = !t->write;
		if (t->write)
			return txn_cpu_write_layer(t, layer);
		return 0;
	}
	ret = tt_engine_submit(s->eng, &t->batch[layer]);
	if (!ret)
		tt_written_add_ios(s, ios, n_io, 0);	/* handed to the device */
	/* Hash what is being written while the device moves it (both only read). */
	if (t->write)
		txn_layer_sums(t, layer, ios, n_io, dst, 0);
	if (ret) {
		char why[256];

		/*
		 * Nothing of this layer may count as moved, whatever of it the
		 * engine did start; that must land before the memory is reused.
		 */
		snprintf(why, sizeof(why), "%s", *tt_errmsg() ? tt_errmsg() : strerror(-ret));
		tt_engine_wait(s->eng, &t->batch[layer]);
		tt_written_add_ios(s, ios, n_io, 1);	/* refused: what of it moved */
		t->layer_state[layer] = LAYER_DONE;
		txn_fail_layer(t, layer, ret);
		return tt_seterr(ret, "layer %u: submit failed: %s", layer, why);
	}
	return 0;
}

int tt_txn_wait_layer(struct tt_txn *t, uint32_t layer)
{
	struct tt_store *s = t->s;
	const struct tt_geometry *g = &s->geo;
	struct tt_batch *b;
	int ret, err;

	if (layer >= g->n_layers)
		return tt_seterr(-ERANGE, "layer %u out of range", layer);
	if (t->layer_state[layer] == LAYER_IDLE)
		return tt_seterr(-EINVAL, "layer %u was not submitted", layer);
	if (t->dpo)
		return txn_dev_wait(t, layer);
	b = &t->batch[layer];
	if (t->layer_state[layer] == LAYER_DONE) {
		ret = t->layer_ret[layer];
		return ret ? tt_seterr(ret, "layer %u failed: %s", layer, strerror(-ret)) : 0;
	}
	if (t->cpu_read[layer]) {
		ret = txn_layer_move_now(t, layer, b->ios, b->n, t->dst[layer]);
		if (ret)
			for (uint32_t j = 0; j < b->n; j++)
				b->ios[j].res = ret;	/* none read: every block fails */
	} else {
		ret = tt_engine_wait(s->eng, b);
	}
	t->layer_state[layer] = LAYER_DONE;
	err = txn_fail_ios(t, b->ios, b->n);
	if (!ret)
		ret = err;
	if (!t->write && !t->cpu_read[layer])
		txn_layer_sums(t, layer, b->ios, b->n, t->dst[layer], 1);
	if (ret) {
		t->layer_ret[layer] = ret;
		tt_seterr(ret, "I/O error in layer %u: %s", layer, strerror(-ret));
	}
	return ret;
}

int tt_txn_poll(struct tt_txn *t)
{
	for (uint32_t l = 0; l < t->s->geo.n_layers; l++) {
		if (t->layer_state[l] != LAYER_SUBMITTED)
			continue;
		if (t->dpo) {
			if (t->dpo->poll && !t->dpo->poll(t->dp, l))
				return 0;
		} else if (!tt_engine_done(t->s->eng, &t->batch[l])) {
			return 0;
		}
	}
	return 1;
}

/* Per block: did every layer complete without an I/O error? */
static void txn_collect(struct tt_txn *t)
{
	for (uint32_t l = 0; l < t->s->geo.n_layers; l++) {
		if (t->layer_state[l] == LAYER_SUBMITTED)
			tt_txn_wait_layer(t, l);
		if (t->layer_state[l] == LAYER_IDLE)
			for (unsigned i = 0; i < t->n; i++)
				if (!t->status[i] && !t->present[i])
					t->status[i] = -ENODATA;
	}
	if (t->dp_live)
		txn_dev_collect(t);
}

/* Data durable: the members' files, and what the data path keeps itself. */
static int txn_flush(struct tt_txn *t)
{
	int ret = tt_engine_flush(t->s->eng);

	if (!ret && t->dpo && t->dpo->flush)
		ret = t->dpo->flush(t->s->dp_ctx);
	return ret;
}

static int finish_write(struct tt_txn *t)
{
	struct tt_store *s = t->s;
	struct tt_slots *sl = &s->slots;
	uint32_t R = tt_objs_per_slot(&s->geo);
	int ret, ok = 0, to_commit = 0;

	for (unsigned i = 0; i < t->n; i++)
		to_commit += !t->present[i] && !t->status[i];
	/* Data durable before any record points at it. */
	ret = to_commit && !t->prepared ? txn_flush(t) : 0;
	for (unsigned i = 0; i < t->n; i++) {
		const uint8_t *key = t->keys + (size_t)i * TT_KEY_BYTES;
		uint64_t slot = (uint64_t)t->slot[i];

		if (t->present[i]) {
			tt_slots_unpin(sl, slot);
			ok++;
			continue;
		}
		if (ret && !t->status[i])
			t->status[i] = ret;
		/* Another transaction committed the same key meanwhile. */
		if (!t->status[i] && tt_slots_find(sl, key) >= 0) {
			t->present[i] = 1;
			tt_slots_release(sl, slot);
			ok++;
			continue;
		}
		if (t->status[i]) {
			if (t->status[i] == -ENOSPC)
				tt_slots_note_nospace(sl);
			tt_slots_release(sl, slot);
			continue;
		}
		if (t->fresh[i])
			tt_slots_note_space(sl);	/* a free slot took data: space again */
		tt_slots_commit(s, slot, key, tt_sum_combine(&t->sums[(size_t)i * R], R));
		s->st.commits++;
		s->st.blocks_written++;
		ok++;
	}
	t->n = 0;	/* slots now belong to the table */
	if (ret)
		return ret;
	ret = tt_slots_sync(s, 1);
	tt_written_save(s, 0);	/* every save_every bytes a member took */
	return ret ? ret : ok;
}

static int finish_read(struct tt_txn *t)
{
	struct tt_store *s = t->s;
	struct tt_slots *sl = &s->slots;
	uint32_t R = tt_objs_per_slot(&s->geo);
	int verify = txn_reads_verified(t);
	int ok = 0, dropped = 0;

	for (unsigned i = 0; i < t->n; i++) {
		uint64_t slot = (uint64_t)t->slot[i];

		if (!t->status[i] && verify &&
		    tt_sum_combine(&t->sums[(size_t)i * R], R) != t->expect[i])
			t->status[i] = -EBADMSG;
		if (t->status[i] == -EBADMSG) {
			s->st.corrupt_blocks++;
			if (!t->keep_bad && sl->state[slot] == TT_MS_COMMITTED &&
			    sl->rec[slot].data_sum == t->expect[i]) {
				/* Never serve it again; durable unless read-only. */
				tt_slots_set_empty(s, slot, TT_MS_DROPPED);
				dropped++;
			}
		}
		tt_slots_unpin(sl, slot);
		if (!t->status[i]) {
			s->st.blocks_read++;
			ok++;
		}
	}
	t->n = 0;
	if (dropped && !(s->flags & TT_OPEN_RDONLY))
		tt_slots_sync(s, 1);
	return ok;
}

/*
 * Two-phase commit across stores (one per tensor-parallel rank): each store
 * makes its blocks' data durable, the group agrees, then each commits only the
 * blocks every store holds durably (the others are vetoed).
 */
int tt_txn_prepare(struct tt_txn *t, int32_t *status)
{
	int ret = 0, ok = 0, to_flush = 0;

	if (!t->write)
		return tt_seterr(-EINVAL, "only a write transaction can be prepared");
	txn_collect(t);
	for (unsigned i = 0; i < t->n; i++)
		to_flush += !t->present[i] && !t->status[i];
	if (to_flush && !t->prepared)
		ret = txn_flush(t);
	t->prepared = 1;
	for (unsigned i = 0; i < t->n; i++) {
		if (ret && !t->present[i] && !t->status[i])
			t->status[i] = ret;
		ok += !t->status[i];
	}
	if (status)
		memcpy(status, t->status, (size_t)t->n * sizeof(*status));
	if (ret)
		return tt_seterr(ret, "flushing the data failed: %s", strerror(-ret));
	return ok;
}

int tt_txn_veto(struct tt_txn *t, unsigned i)
{
	if (!t->write || i >= t->n)
		return tt_seterr(-EINVAL, "block %u is not in this write transaction", i);
	/* A block stored before this transaction stays: it was never this one's. */
	if (!t->present[i] && !t->status[i])
		t->status[i] = -ECANCELED;
	return 0;
}

int tt_txn_finish(struct tt_txn *t, int32_t *status)
{
	unsigned n = t->n;
	int ret;

	txn_collect(t);
	ret = t->write ? finish_write(t) : finish_read(t);
	if (status)
		memcpy(status, t->status, (size_t)n * sizeof(*status));
	txn_unlink(t);
	txn_free(t);
	return ret;
}

void tt_txn_abort(struct tt_txn *t)
{
	/* In-flight I/O must land before its memory and slots are reused. */
	for (uint32_t l = 0; !t->dpo && l < t->s->geo.n_layers; l++)
		if (t->layer_state[l] == LAYER_SUBMITTED)
			tt_engine_wait(t->s->eng, &t->batch[l]);
	txn_dev_end(t);
	txn_release(t);
	txn_unlink(t);
	txn_free(t);
}

void tt_txn_abort_all(struct tt_store *s)
{
	while (s->txns)
		tt_txn_abort(s->txns);
}

void tt_txn_keep_bad(struct tt_txn *t)
{
	t->keep_bad = 1;
}

int txn_reads_verified(const struct tt_txn *t)
{
	return !(t->s->flags & TT_OPEN_NO_VERIFY) || t->keep_bad;
}
