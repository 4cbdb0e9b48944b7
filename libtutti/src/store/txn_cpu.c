// SPDX-License-Identifier: Apache-2.0
/*
 * The CPU's share of a host-memory transaction: each object's checksum, the
 * copy out of a bounce buffer, and the moves of large layers the CPU copies
 * itself (tmpfs, the page cache), spread over the store's threads.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"
#include "txn_impl.h"
#include "../support/stream_copy.h"
#include "../support/util.h"
#include "../support/workers.h"

/*
 * One layer's objects hashed (and, on read, copied out of a bounce buffer;
 * with @runs, moved by the hashing thread run by run: the hash then finds
 * each object in that thread's cache instead of memory).
 */
struct layer_sums {
	struct tt_txn *t;
	struct tt_io *ios;
	char **dst;
	uint32_t layer;
	int read;
	const uint32_t *runs;	/* moved now: run r is ios runs[r] .. runs[r + 1] - 1 */
};

/* The checksum of the object of io tag @tag (block, span) of the layer, whose bytes are at @obj. */
static void sum_obj(const struct layer_sums *ls, uint32_t tag, const char *obj)
{
	const struct tt_geometry *g = &ls->t->s->geo;
	unsigned i = tag / g->n_spans, k = tag % g->n_spans;
	uint32_t m = tt_obj_index(g, ls->layer, k);

	ls->t->sums[(size_t)i * tt_objs_per_slot(g) + m] = tt_sum_object(obj, g->span_bytes, m);
}

static void layer_sum_one(void *arg, unsigned j)
{
	const struct layer_sums *ls = arg;
	struct tt_io *io = &ls->ios[j];
	char *mp = ls->dst[io->tag];

	if (ls->read) {
		if (txn_io_error(io))
			return;	/* its bytes are not the block's: never copied, never hashed */
		if (io->buf != mp)
			memcpy(mp, io->buf, ls->t->s->geo.span_bytes);
		if (!txn_reads_verified(ls->t))
			return;
	}
	sum_obj(ls, io->tag, mp);
}

/*
 * Hashing, not the copies, limits a store the CPU reads or writes through
 * the page cache: large layers are spread over the store's threads.
 */
#define TXN_PARALLEL_BYTES	(1u << 20)

/* The store's threads for a layer of @n_io objects, NULL: the caller's alone. */
static struct tt_workers *layer_workers(struct tt_store *s, unsigned n_io)
{
	if ((uint64_t)n_io * s->geo.span_bytes < TXN_PARALLEL_BYTES || s->cpu_threads < 2)
		return NULL;
	if (!s->cpu) {
		s->cpu = tt_workers_start(s->cpu_threads, &s->cpus);
		if (!s->cpu)
			s->cpu_threads = 1;	/* no thread to be had: stop asking */
	}
	return s->cpu;
}

void txn_layer_sums(struct tt_txn *t, uint32_t layer, struct tt_io *ios,
		       unsigned n_io, char **dst, int read)
{
	struct layer_sums ls = { t, ios, dst, layer, read, NULL };

	tt_workers_for(layer_workers(t->s, n_io), n_io, layer_sum_one, &ls);
}

/*
 * A read run the engine has mapped: each object hashed where it lies (read
 * from memory once, into this core's cache), then streamed from there to its
 * destination, which nothing on the CPU reads next.
 */
static void layer_copy_mapped(const struct layer_sums *ls, uint32_t a, uint32_t b, const char *src)
{
	uint32_t span = ls->t->s->geo.span_bytes;
	int verify = txn_reads_verified(ls->t);

	for (uint32_t j = a; j < b; j++) {
		const struct tt_io *io = &ls->ios[j];
		const char *p = src + (io->off - ls->ios[a].off);

		if (verify)
			sum_obj(ls, io->tag, p);
		tt_copy_stream(ls->dst[io->tag], p, span);
	}
	tt_copy_stream_end();
}

/*
 * Move one run of objects adjacent on disk, each hashed where it is in this
 * thread's cache: a read after its copy, a write before.
 */
static void layer_move_run(void *arg, unsigned r)
{
	const struct layer_sums *ls = arg;
	uint32_t a = ls->runs[r], b = ls->runs[r + 1];

	if (ls->read) {
		const char *src = tt_engine_map_read(ls->t->s->eng, &ls->ios[a], b - a);

		if (src) {
			layer_copy_mapped(ls, a, b, src);
			return;
		}
	} else {
		for (uint32_t j = a; j < b; j++)
			layer_sum_one(arg, j);
	}
	tt_engine_move_now(ls->t->s->eng, &ls->ios[a], b - a);
	if (ls->read)
		for (uint32_t j = a; j < b; j++)
			layer_sum_one(arg, j);
}

#define TXN_RUN_BYTES	(256u << 10)	/* a run still in a core's cache when hashed */
#define TXN_RUN_IOS	256u		/* tt_engine_move_now()'s most ios */

/* txn_cpu_layer()'s layer, moved and hashed on the store's threads. */
int txn_layer_move_now(struct tt_txn *t, uint32_t layer, struct tt_io *ios, unsigned n_io,
		       char **dst)
{
	uint32_t *runs = malloc(((size_t)n_io + 1) * sizeof(*runs));
	struct layer_sums ls = { t, ios, dst, layer, !t->write, runs };
	unsigned n = 0;
	uint64_t bytes = 0;

	if (!runs)
		return -ENOMEM;
	/* ios are in disk order: runs of adjacent ones, as the engine would merge them. */
	for (unsigned j = 0; j < n_io; j++) {
		if (!j || ios[j].member != ios[j - 1].member ||
		    ios[j].off != ios[j - 1].off + ios[j - 1].len ||
		    j - runs[n - 1] >= TXN_RUN_IOS || bytes + ios[j].len > TXN_RUN_BYTES) {
			runs[n++] = j;
			bytes = 0;
		}
		bytes += ios[j].len;
	}
	runs[n] = n_io;
	tt_workers_for(layer_workers(t->s, n_io), n, layer_move_run, &ls);
	free(runs);
	return 0;
}

/*
 * A large layer whose every object the CPU copies is moved by the store's
 * threads, each hashing what it copies while it is in its cache: one pass
 * over memory less than copies by io_uring's workers (or inline, one thread)
 * followed by the hash.  Reads: any member the CPU copies (tmpfs, the page
 * cache), at wait.  Writes: only members written without a lock
 * (tmpfs, mapped), at submit, as io_uring's inline writes were.
 */
int txn_cpu_layer(struct tt_txn *t, const struct tt_io *ios, unsigned n_io)
{
	struct tt_store *s = t->s;

	if (!layer_workers(s, n_io))
		return 0;
	for (unsigned j = 0; j < n_io; j++)
		if (t->write ? !tt_engine_cpu_writes(s->eng, ios[j].member) :
			       !tt_engine_cpu_reads(s->eng, ios[j].member))
			return 0;
	return 1;
}
