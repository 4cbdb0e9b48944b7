// SPDX-License-Identifier: Apache-2.0
/*
 * Transactions bound to a data path (devpath.h): the path moves and hashes a
 * transaction's objects between the members and device memory; txn.c keeps
 * slots, flushes, commit records and verification, the same for both.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tutti/error.h"
#include "store_impl.h"
#include "txn_impl.h"

/* A data path's failure, keeping its own reason (cuFile's code, ...) when it gave one. */
static int dp_err(int ret, const char *path, const char *what)
{
	char why[256];

	snprintf(why, sizeof(why), "%s", *tt_errmsg() ? tt_errmsg() : strerror(-ret));
	return tt_seterr(ret, "data path %s: %s%s", path, what, why);
}

int tt_txn_bind_device(struct tt_txn *t, const uint32_t *block_ids)
{
	struct tt_store *s = t->s;
	struct tt_devpath_txn ti;
	int fds[TT_MAX_MEMBERS];
	int64_t *slots;
	int ret;

	if (!s->dp_ops)
		return tt_seterr(-ENODEV, "the store has no data path for device memory");
	if (t->dpo)
		return tt_seterr(-EALREADY, "transaction already bound to device memory");
	if (t->prepared)
		return tt_seterr(-EINVAL, "transaction already prepared");
	for (uint32_t l = 0; l < s->geo.n_layers; l++)
		if (t->layer_state[l] != LAYER_IDLE)
			return tt_seterr(-EINVAL, "layer %u already moved through host memory", l);
	if (t->n && !block_ids)
		return tt_seterr(-EINVAL, "no block ids");
	slots = malloc((t->n ? t->n : 1) * sizeof(*slots));
	if (!slots)
		return tt_seterr(-ENOMEM, "out of memory");
	/* Blocks already stored are not written again: nothing to move. */
	for (unsigned i = 0; i < t->n; i++)
		slots[i] = t->write && t->present[i] ? -1 : t->slot[i];
	tt_store_member_fds(s, fds, NULL);
	ti = (struct tt_devpath_txn){ .geo = &s->geo, .write = t->write, .n = t->n,
				      .slots = slots, .block_ids = block_ids, .fds = fds };
	tt_clearerr();
	ret = s->dp_ops->begin(s->dp_ctx, &ti, &t->dp);
	free(slots);
	if (ret)
		return dp_err(ret, s->dp_ops->name, "");
	t->dpo = s->dp_ops;
	t->dp_live = 1;
	return 0;
}

/* A write layer handed to the data path: its objects' extents, as written. */
static void count_layer(struct tt_txn *t, uint32_t layer)
{
	const struct tt_geometry *g = &t->s->geo;

	for (unsigned i = 0; t->write && i < t->n; i++) {
		if (t->present[i] || t->slot[i] < 0)
			continue;
		for (uint32_t k = 0; k < g->n_spans; k++) {
			struct tt_extent e = tt_locate(g, (uint64_t)t->slot[i], layer, k);

			tt_written_add(t->s, e.member, e.len);
		}
	}
}

int txn_dev_layer(struct tt_txn *t, uint32_t layer, const struct tt_memmap *mem)
{
	char what[32];
	int ret;

	tt_clearerr();
	ret = t->dpo->layer(t->dp, layer, mem);
	t->layer_state[layer] = ret ? LAYER_DONE : LAYER_SUBMITTED;
	if (!ret) {
		count_layer(t, layer);
		return 0;
	}
	/* Whatever of this layer moved must not count (the layer keeps the path's errno). */
	t->layer_ret[layer] = ret;
	txn_fail_layer(t, layer, -EIO);
	snprintf(what, sizeof(what), "layer %u: ", layer);
	return dp_err(ret, t->dpo->name, what);
}

int txn_dev_wait(struct tt_txn *t, uint32_t layer)
{
	char what[32];

	tt_clearerr();	/* a layer waited for earlier: no reason of the path's left */
	if (t->layer_state[layer] == LAYER_SUBMITTED) {
		t->layer_ret[layer] = t->dpo->wait(t->dp, layer);
		t->layer_state[layer] = LAYER_DONE;
	}
	if (t->layer_ret[layer]) {
		snprintf(what, sizeof(what), "layer %u: ", layer);
		return dp_err(t->layer_ret[layer], t->dpo->name, what);
	}
	return 0;
}

/*
 * Every layer waited for: take the path's per-block status and sums.  A
 * layer whose wait failed while the path names no failed block (it knew only
 * that the layer failed) fails every block it moved: never reported fine.
 */
void txn_dev_collect(struct tt_txn *t)
{
	int32_t *st = calloc(t->n ? t->n : 1, sizeof(*st));
	int ret = st ? t->dpo->collect(t->dp, st, t->sums) : -ENOMEM;
	int named = 0;

	if (ret)
		txn_fail_moved(t, ret);
	for (unsigned i = 0; st && i < t->n; i++) {
		if (st[i] && txn_block_moves(t, i)) {
			txn_fail_block(t, i, st[i]);
			named = 1;
		}
	}
	for (uint32_t l = 0; !named && l < t->s->geo.n_layers; l++)
		if (t->layer_ret[l])
			txn_fail_moved(t, t->layer_ret[l]);
	free(st);
	txn_dev_end(t);
}

int tt_txn_layer_order(struct tt_txn *t, uint32_t layer, struct CUstream_st *stream)
{
	if (!t->dp_live)
		return tt_seterr(-EINVAL, "transaction is not bound to device memory");
	if (layer >= t->s->geo.n_layers || t->layer_state[layer] == LAYER_IDLE)
		return tt_seterr(-EINVAL, "layer %u was not submitted", layer);
	if (t->layer_state[layer] == LAYER_DONE && t->layer_ret[layer])
		return tt_seterr(-EIO, "layer %u failed", layer);
	if (!t->dpo->order)
		return tt_seterr(-EOPNOTSUPP, "data path %s cannot order a stream",
				 t->dpo->name);
	return t->dpo->order(t->dp, layer, stream);
}

/* Let the data path finish with the transaction (waits for its I/O). */
void txn_dev_end(struct tt_txn *t)
{
	if (t->dp_live)
		t->dpo->end(t->dp);
	t->dp_live = 0;
}
