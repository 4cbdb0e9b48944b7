// SPDX-License-Identifier: Apache-2.0
/* Offline verification: re-read committed slots and compare checksums. */
#include <stdlib.h>
#include <string.h>

#include "tutti/error.h"
#include "store_impl.h"
#include "../support/util.h"

#define CHECK_BATCH 32u

static void note_bad(int64_t slot, int64_t *bad, unsigned bad_cap, unsigned *n_bad)
{
	if (bad && *n_bad < bad_cap)
		bad[*n_bad] = slot;
	(*n_bad)++;
}

/*
 * Verify up to CHECK_BATCH committed slots; returns bad count or -errno.
 * A slot is bad only if its bytes were read and fail their checksum; one
 * that could not be read (an I/O error) is counted unreadable and kept:
 * repair must never clear a slot because of an I/O error.
 */
static int check_batch(struct tt_store *s, const int64_t *slots, unsigned n,
		       const struct tt_memmap *map, int repair,
		       struct tt_check_result *res, int64_t *bad, unsigned bad_cap,
		       unsigned *n_bad)
{
	uint32_t ids[CHECK_BATCH];
	int32_t status[CHECK_BATCH];
	struct tt_txn *t;
	int ret, found = 0;

	for (unsigned i = 0; i < n; i++)
		ids[i] = i;
	ret = tt_store_read_begin(s, slots, n, &t);
	if (ret)
		return ret;
	tt_txn_keep_bad(t);
	/* A layer that fails fails its blocks (unreadable): go on with the rest. */
	for (uint32_t l = 0; l < s->geo.n_layers; l++)
		tt_txn_layer(t, l, map, ids);
	ret = tt_txn_finish(t, status);
	if (ret < 0)
		return ret;
	for (unsigned i = 0; i < n; i++) {
		res->checked++;
		if (!status[i]) {
			res->ok++;
			continue;
		}
		if (status[i] != -EBADMSG) {
			res->unreadable++;
			continue;
		}
		res->bad++;
		found++;
		note_bad(slots[i], bad, bad_cap, n_bad);
		if (repair) {
			ret = tt_store_invalidate(s, &slots[i], 1);
			if (ret < 0)
				return ret;
			res->repaired++;
		}
	}
	return found;
}

int tt_store_check(struct tt_store *s, uint64_t first, uint64_t count,
		   int repair, struct tt_check_result *res, int64_t *bad,
		   unsigned bad_cap)
{
	const struct tt_geometry *g = &s->geo;
	uint32_t R = tt_objs_per_slot(g);
	struct tt_slots *sl = &s->slots;
	uint64_t *base = NULL, *stride = NULL, end;
	struct tt_memmap map;
	int64_t batch[CHECK_BATCH];
	unsigned nb = 0, n_bad = 0;
	void *scratch = NULL;
	int ret = 0, found = 0;

	tt_clearerr();
	if (repair && (s->flags & TT_OPEN_RDONLY))
		return tt_seterr(-EROFS, "repair needs the store open for writing");
	if (first > sl->n)
		return tt_seterr(-ERANGE, "slot %llu out of range (store has %llu)",
				 (unsigned long long)first, (unsigned long long)sl->n);
	end = count > sl->n - first ? sl->n : first + count;

	/* Scratch: CHECK_BATCH blocks, each (layer, span) object back to back. */
	scratch = tt_alloc_aligned((size_t)CHECK_BATCH * R * g->obj_stride);
	base = malloc(R * sizeof(*base));
	stride = malloc(R * sizeof(*stride));
	if (!scratch || !base || !stride) {
		ret = tt_seterr(-ENOMEM, "out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < R; i++) {
		base[i] = (uint64_t)(uintptr_t)scratch + (uint64_t)i * g->obj_stride;
		stride[i] = (uint64_t)R * g->obj_stride;
	}
	map.n_layers = g->n_layers;
	map.n_spans = g->n_spans;
	map.base = base;
	map.stride = stride;

	for (uint64_t slot = first; slot < end; slot++) {
		if (sl->state[slot] == TT_MS_BAD) {
			int64_t sn = (int64_t)slot;

			res->bad_records++;
			found++;
			note_bad(sn, bad, bad_cap, &n_bad);
			if (repair) {
				ret = tt_store_invalidate(s, &sn, 1);
				if (ret < 0)
					goto out;
				res->repaired++;
			}
			continue;
		}
		if (sl->state[slot] != TT_MS_COMMITTED)
			continue;
		batch[nb++] = (int64_t)slot;
		if (nb == CHECK_BATCH || slot + 1 == end) {
			ret = check_batch(s, batch, nb, &map, repair, res, bad,
					  bad_cap, &n_bad);
			if (ret < 0)
				goto out;
			found += ret;
			nb = 0;
		}
	}
	if (nb) {
		ret = check_batch(s, batch, nb, &map, repair, res, bad, bad_cap,
				  &n_bad);
		if (ret < 0)
			goto out;
		found += ret;
	}
	ret = found;
out:
	free(scratch);
	free(base);
	free(stride);
	return ret;
}
