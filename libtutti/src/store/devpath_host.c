// SPDX-License-Identifier: Apache-2.0
/*
 * The reference data path (devpath.h): host addresses stand in for device
 * addresses, each object moves with one pread/pwrite through an aligned
 * bounce buffer (the members are O_DIRECT; the caller's memory need not be
 * aligned) and the CPU hashes it where a GPU path would. Everything happens
 * inside @layer; it exists so the store's side of data paths (binding,
 * status and sums, commit and verification) is exercised without a GPU.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store_impl.h"
#include "../support/util.h"

struct dh_txn {
	struct tt_geometry geo;
	int write;
	unsigned n;
	int64_t *slots;
	uint32_t *ids;
	int fds[TT_MAX_MEMBERS];
	int32_t *status;
	uint64_t *sums;		/* n * objs_per_slot */
	int *layer_ret;
	uint8_t *bounce;	/* one object, obj_stride bytes */
};

static void dh_end(void *txn)
{
	struct dh_txn *d = txn;

	if (!d)
		return;
	free(d->slots);
	free(d->ids);
	free(d->status);
	free(d->sums);
	free(d->layer_ret);
	free(d->bounce);
	free(d);
}

static int dh_begin(void *ctx, const struct tt_devpath_txn *ti, void **txn)
{
	struct dh_txn *d = calloc(1, sizeof(*d));
	size_t n = ti->n ? ti->n : 1;

	(void)ctx;
	if (!d)
		return -ENOMEM;
	d->geo = *ti->geo;
	d->write = ti->write;
	d->n = ti->n;
	d->slots = malloc(n * sizeof(*d->slots));
	d->ids = malloc(n * sizeof(*d->ids));
	d->status = calloc(n, sizeof(*d->status));
	d->sums = calloc(n * tt_objs_per_slot(&d->geo), sizeof(*d->sums));
	d->layer_ret = calloc(d->geo.n_layers, sizeof(*d->layer_ret));
	d->bounce = tt_alloc_aligned(d->geo.obj_stride);
	if (!d->slots || !d->ids || !d->status || !d->sums || !d->layer_ret || !d->bounce) {
		dh_end(d);
		return -ENOMEM;
	}
	memcpy(d->slots, ti->slots, ti->n * sizeof(*d->slots));
	memcpy(d->ids, ti->block_ids, ti->n * sizeof(*d->ids));
	memcpy(d->fds, ti->fds, d->geo.n_members * sizeof(*d->fds));
	*txn = d;
	return 0;
}

static int dh_io(int fd, int write, void *buf, size_t len, uint64_t off)
{
	for (size_t done = 0; done < len;) {
		ssize_t r = write ? pwrite(fd, (char *)buf + done, len - done, (off_t)(off + done)) :
				    pread(fd, (char *)buf + done, len - done, (off_t)(off + done));

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;	/* the engine's errno, as on the host path */
		if (r == 0)
			return -EIO;
		done += (size_t)r;
	}
	return 0;
}

/* Move one object between memory at @mp and the store. */
static int dh_object(struct dh_txn *d, unsigned i, uint32_t layer, uint32_t k, char *mp)
{
	const struct tt_geometry *g = &d->geo;
	uint32_t m = tt_obj_index(g, layer, k);
	struct tt_extent e = tt_locate(g, (uint64_t)d->slots[i], layer, k);
	uint64_t *sum = &d->sums[(size_t)i * tt_objs_per_slot(g) + m];
	int ret;

	if (d->write) {
		*sum = tt_sum_object(mp, g->span_bytes, m);
		memcpy(d->bounce, mp, g->span_bytes);
		memset(d->bounce + g->span_bytes, 0, g->obj_stride - g->span_bytes);
		return dh_io(d->fds[e.member], 1, d->bounce, g->obj_stride, e.off);
	}
	ret = dh_io(d->fds[e.member], 0, d->bounce, g->obj_stride, e.off);
	if (ret)
		return ret;
	memcpy(mp, d->bounce, g->span_bytes);
	*sum = tt_sum_object(mp, g->span_bytes, m);
	return 0;
}

static int dh_layer(void *txn, uint32_t layer, const struct tt_memmap *mem)
{
	struct dh_txn *d = txn;
	const struct tt_geometry *g = &d->geo;

	if (layer >= g->n_layers || mem->n_spans != g->n_spans)
		return -EINVAL;
	for (unsigned i = 0; i < d->n; i++) {
		if (d->slots[i] < 0)
			continue;
		for (uint32_t k = 0; k < g->n_spans; k++) {
			uint32_t m = tt_obj_index(g, layer, k);
			char *mp = (char *)(uintptr_t)(mem->base[m] +
						       (uint64_t)d->ids[i] * mem->stride[m]);

			int err = dh_object(d, i, layer, k, mp);

			if (err) {
				if (!d->status[i])
					d->status[i] = err;
				d->layer_ret[layer] = err;
			}
		}
	}
	return 0;
}

static int dh_wait(void *txn, uint32_t layer)
{
	struct dh_txn *d = txn;

	return layer < d->geo.n_layers ? d->layer_ret[layer] : -EINVAL;
}

/* Every layer moves inside dh_layer(): nothing is ever in flight. */
static int dh_poll(void *txn, uint32_t layer)
{
	(void)txn;
	(void)layer;
	return 1;
}

static int dh_collect(void *txn, int32_t *status, uint64_t *sums)
{
	struct dh_txn *d = txn;
	uint32_t R = tt_objs_per_slot(&d->geo);

	for (unsigned i = 0; i < d->n; i++) {
		status[i] = d->status[i];
		if (d->slots[i] >= 0)
			memcpy(&sums[(size_t)i * R], &d->sums[(size_t)i * R], R * sizeof(*sums));
	}
	return 0;
}

const struct tt_devpath_ops tt_devpath_host = {
	.name = "host",
	.begin = dh_begin,
	.layer = dh_layer,
	.order = NULL,
	.wait = dh_wait,
	.collect = dh_collect,
	.end = dh_end,
	.flush = NULL,
	.poll = dh_poll,
};
