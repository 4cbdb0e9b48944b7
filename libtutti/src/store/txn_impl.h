/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A transaction's state, shared by txn.c (slots, commit, verification, the
 * host-memory path) and txn_dev.c (transactions bound to a data path).
 */
#ifndef TUTTI_TXN_IMPL_H
#define TUTTI_TXN_IMPL_H

#include <stdint.h>

#include "tutti/devpath.h"
#include "tutti/engine.h"

enum { LAYER_IDLE = 0, LAYER_SUBMITTED, LAYER_DONE };

struct tt_txn {
	struct tt_store *s;
	struct tt_txn *next;		/* store's list of open transactions */
	int write;
	int keep_bad;			/* check: report, do not drop */
	unsigned n;
	int64_t *slot;
	uint8_t *present;		/* write: already stored, skipped */
	uint8_t *keys;			/* write: n * TT_KEY_BYTES */
	int32_t *status;
	uint64_t *sums;			/* n * objs_per_slot object checksums */
	uint64_t *expect;		/* read: record checksums at begin */
	uint8_t *layer_state;
	uint8_t *cpu_read;		/* per layer: read by the store's threads at wait */
	struct tt_batch *batch;		/* one per layer */
	struct tt_io **ios;		/* per layer, n * n_spans */
	uint8_t **stage;		/* per layer bounce area, if needed */
	char ***dst;			/* per layer: final memory of each io */
	const struct tt_devpath_ops *dpo;	/* bound to a data path */
	void *dp;			/* the path's handle */
	int dp_live;			/* dp not ended yet */
	int32_t *layer_ret;		/* each layer's failure as a whole, 0 if none */
	uint8_t *fresh;			/* write: slot came from the free list */
	int prepared;			/* write: data flushed by tt_txn_prepare */
};

/* txn_status.c: the per-block status rule every path follows. */
int txn_block_moves(const struct tt_txn *t, unsigned i);
void txn_fail_block(struct tt_txn *t, unsigned i, int err);
void txn_fail_moved(struct tt_txn *t, int err);
void txn_fail_layer(struct tt_txn *t, uint32_t layer, int err);
int txn_io_error(const struct tt_io *io);
/* Fail the block of every io of a layer that did not complete; the first error, 0 if none. */
int txn_fail_ios(struct tt_txn *t, const struct tt_io *ios, uint32_t n);
/* Are a read's bytes hashed and judged (verify on, or check() keeping bad blocks)? */
int txn_reads_verified(const struct tt_txn *t);

/* txn_cpu.c: the CPU's share of a host-memory layer, on the store's threads. */
void txn_layer_sums(struct tt_txn *t, uint32_t layer, struct tt_io *ios, unsigned n_io,
		    char **dst, int read);
int txn_cpu_layer(struct tt_txn *t, const struct tt_io *ios, unsigned n_io);
int txn_layer_move_now(struct tt_txn *t, uint32_t layer, struct tt_io *ios, unsigned n_io,
		       char **dst);

/* txn_dev.c: the bound transaction's steps (txn.c calls them when t->dpo). */
int txn_dev_layer(struct tt_txn *t, uint32_t layer, const struct tt_memmap *mem);
int txn_dev_wait(struct tt_txn *t, uint32_t layer);
void txn_dev_collect(struct tt_txn *t);
void txn_dev_end(struct tt_txn *t);

#endif
