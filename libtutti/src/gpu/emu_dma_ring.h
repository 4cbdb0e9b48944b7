/* SPDX-License-Identifier: Apache-2.0 */
/*
 * emu_dma_ring.h - the emulated controller's side of a queue's move ring
 * (tt_gio_qmem.dma, gio_uring.h)
 *
 * The controller has no DMA engine: one thread per queue fills descriptors
 * of data moves and publishes them by raising *posted; the gio kernels
 * polling the queue claim each one once (CAS on a device counter), do the
 * move and write its done word, sequence + 1 (gio_dma_round(), gio_dev.cuh).
 * The controller frees entries oldest first as their done words come back,
 * and a batch has landed once every descriptor it published is freed.
 *
 * Plain C, host only, so that the protocol also runs in CI on the CPU
 * (libtutti/tests/test_emu_ring.c: threads stand in for the warps).
 */
#ifndef TT_EMU_DMA_RING_H
#define TT_EMU_DMA_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tutti/gio_uring.h"

struct emu_ring {
	struct tt_gio_dma_desc *desc;	/* host view of the ring */
	volatile uint64_t *posted;	/* host view of the published count */
	uint32_t entries;		/* a power of two */
	uint64_t head;			/* descriptors filled */
	uint64_t tail;			/* the oldest not yet seen done */
};

/* Where the publishing of one batch's copies is. */
struct emu_ring_cursor {
	size_t copy;			/* next copy to publish */
	uint64_t off;			/* how far into it */
	uint64_t end;			/* head after the batch's last descriptor */
};

/* Free the entries whose moves are done, oldest first. */
static inline void emu_ring_retire(struct emu_ring *r)
{
	while (r->tail < r->head &&
	       __atomic_load_n(&r->desc[r->tail & (r->entries - 1)].done, __ATOMIC_ACQUIRE) ==
		       r->tail + 1)
		r->tail++;
}

/* Fill the next descriptor (published by emu_ring_publish()). Return: false when full. */
static inline bool emu_ring_put(struct emu_ring *r, uint64_t dst, uint64_t src, uint32_t len,
				uint32_t flags)
{
	struct tt_gio_dma_desc *d;

	if (r->head - r->tail == r->entries) {
		emu_ring_retire(r);
		if (r->head - r->tail == r->entries)
			return false;
	}
	d = &r->desc[r->head & (r->entries - 1)];
	/* Its done word still holds the last lap's number, never head + 1. */
	d->dst = dst;
	d->src = src;
	d->len = len;
	d->flags = flags;
	r->head++;
	return true;
}

static inline void emu_ring_publish(struct emu_ring *r)
{
	__atomic_store_n(r->posted, r->head, __ATOMIC_RELEASE);
}

/* Start publishing a batch (nothing of it published yet). */
static inline void emu_ring_begin(const struct emu_ring *r, struct emu_ring_cursor *c)
{
	c->copy = 0;
	c->off = 0;
	c->end = r->head;
}

/*
 * Publish what is left of copies [0, @n) (@dst, @src, @len; the first @n_rd
 * move host memory to the GPU), as far as the ring has room, in pieces of at
 * most @chunk bytes so several warps share a long copy. Return: true once
 * every copy is published.
 */
static inline bool emu_ring_post(struct emu_ring *r, struct emu_ring_cursor *c,
				 void *const *dst, void *const *src, const size_t *len, size_t n,
				 size_t n_rd, uint32_t chunk)
{
	bool any = false;

	while (c->copy < n) {
		size_t k = c->copy;
		uint64_t left = len[k] - c->off;
		uint32_t piece = left < chunk ? (uint32_t)left : chunk;

		if (!emu_ring_put(r, (uint64_t)(uintptr_t)dst[k] + c->off,
				  (uint64_t)(uintptr_t)src[k] + c->off, piece,
				  k < n_rd ? TT_GIO_DMA_SRC_HOST : 0))
			break;
		any = true;
		c->off += piece;
		if (c->off == len[k]) {
			c->copy++;
			c->off = 0;
		}
	}
	if (any) {
		c->end = r->head;
		emu_ring_publish(r);
	}
	return c->copy == n;
}

/* Whether the batch's moves all landed (publishing the rest first). */
static inline bool emu_ring_landed(struct emu_ring *r, struct emu_ring_cursor *c,
				   void *const *dst, void *const *src, const size_t *len, size_t n,
				   size_t n_rd, uint32_t chunk)
{
	if (!emu_ring_post(r, c, dst, src, len, n, n_rd, chunk))
		return false;
	emu_ring_retire(r);
	return r->tail >= c->end;
}

#endif /* TT_EMU_DMA_RING_H */
