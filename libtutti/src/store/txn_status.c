// SPDX-License-Identifier: Apache-2.0
/*
 * A transaction's per-block status: one rule for every path (host memory
 * through an engine, device memory through a data path).
 *
 *   - A block fails with the error of the first thing that went wrong with
 *     its bytes; a later outcome (a completion, a checksum) never clears or
 *     replaces it.
 *   - An I/O error (-EIO, or the engine's errno: -ENOSPC, -ETIMEDOUT, ...)
 *     fails the blocks it touched; when only a whole layer is known to have
 *     failed (a refused submit, a data path's layer error), every block of
 *     that layer fails.
 *   - Only a block whose bytes were all read without an I/O error can be
 *     judged corrupt (-EBADMSG), and only a corrupt block is ever dropped.
 */
#include <errno.h>

#include "store_impl.h"
#include "txn_impl.h"

int txn_block_moves(const struct tt_txn *t, unsigned i)
{
	return !(t->write && t->present[i]);
}

void txn_fail_block(struct tt_txn *t, unsigned i, int err)
{
	if (!t->status[i])
		t->status[i] = err < 0 ? err : -EIO;
}

void txn_fail_moved(struct tt_txn *t, int err)
{
	for (unsigned i = 0; i < t->n; i++)
		if (txn_block_moves(t, i))
			txn_fail_block(t, i, err);
}

void txn_fail_layer(struct tt_txn *t, uint32_t layer, int err)
{
	if (!t->layer_ret[layer])
		t->layer_ret[layer] = err < 0 ? err : -EIO;
	txn_fail_moved(t, err);
}

int txn_io_error(const struct tt_io *io)
{
	if (!io->res)
		return 0;
	return io->res < 0 ? io->res : -EIO;	/* > 0: never completed */
}

int txn_fail_ios(struct tt_txn *t, const struct tt_io *ios, uint32_t n)
{
	uint32_t S = t->s->geo.n_spans;
	int first = 0;

	for (uint32_t j = 0; j < n; j++) {
		int err = txn_io_error(&ios[j]);

		if (err) {
			txn_fail_block(t, ios[j].tag / S, err);
			if (!first)
				first = err;
		}
	}
	return first;
}
