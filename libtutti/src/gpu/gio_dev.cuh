/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gio_dev.cuh - device-side state and helpers of gio_uring (not installed)
 *
 * Multi-producer submission on top of nvme_queue.h's plain structs:
 *
 *  - Slot reservation: a warp takes a run of tickets with one atomicAdd on
 *    the queue's 64-bit ticket counter; ticket t owns SQ slot t % depth and
 *    uses it as command identifier. Lock-free: no thread ever waits for a
 *    lock, only for the resource it reserved to become free.
 *  - A slot is free for ticket t when its previous occupant (t - depth)
 *    completed (per-slot generation, bumped by the reaper) and the ring has
 *    room: t - sq_head < depth - 1, sq_head being what the controller
 *    reported in CQEs (the NVMe "full" rule).
 *  - Publication: SQEs are written in any order; doorbells are rung in
 *    ticket order, once per warp: the warp whose run starts at the
 *    published mark rings (tail = end of its run) and moves the mark.
 *  - Reaping: one warp polls a CQ 32 entries at a time (each lane peeks
 *    head + lane with the phase expected there, via tt_cq_peek()), consumes
 *    the leading run of new entries and rings the CQ head doorbell once.
 *    A per-queue try-lock keeps it to a single reaper even when several
 *    kernels (say, the waits of two layers) poll the same queue.
 */
#ifndef TT_GIO_DEV_CUH
#define TT_GIO_DEV_CUH

#include "tutti/gio_uring.h"
#include "tutti/nvme.h"
#include "tutti/nvme_prp.h"
#include "tutti/nvme_queue.h"
#include "tutti/nvme_sgl.h"

#define GIO_FULL_MASK 0xffffffffu
#define GIO_OPC_POISON 0xff /* sent when a command cannot be built */

enum gio_mode {
	GIO_MODE_IOCBS = 0,
	GIO_MODE_LAYER = 1,
};

/* Where the reaper reports a slot's outcome. */
struct gio_slot {
	uint16_t *status;
	unsigned *done;
};

/* One queue pair's GPU-side state (device memory). */
struct gio_q {
	struct tt_nvme_sqe *sq;
	volatile uint32_t *sq_db;
	struct tt_nvme_cq cq;		/* owned by the reaper lock holder */
	uint32_t depth;
	uint16_t qid;
	int reaper_lock;
	unsigned long long ticket;	/* next ticket (atomicAdd) */
	unsigned long long published;	/* tickets covered by a doorbell */
	unsigned long long sq_head;	/* tickets the controller consumed */
	unsigned long long reaped;	/* completions reaped */
	uint32_t *slot_gen;		/* depth entries */
	struct gio_slot *slots;		/* depth entries */
	char *list;			/* depth * list_chunks chunks */
	const uint64_t *list_bus;	/* bus address of every chunk */
	uint32_t list_chunks;
	uint32_t chunk_bytes;
	/* The controller's data moves (tt_gio_qmem.dma), or NULL. */
	const volatile uint64_t *dma_posted;
	struct tt_gio_dma_desc *dma_desc;
	uint32_t dma_mask;		/* entries - 1 */
	unsigned long long dma_claim;	/* descriptors a warp took */
};

/* Everything a kernel needs, passed by value. */
struct gio_kargs {
	struct gio_q *qs;
	unsigned nq;
	uint32_t n;			/* commands in the batch */
	int mode;
	const struct tt_gio_iocb *iocbs;
	struct tt_gio_layer layer;
	struct tt_nvme_xfer_caps caps;
	uint32_t lba_shift;
	uint16_t *status;		/* n entries */
	unsigned *done;			/* completions counter */
	unsigned target;		/* *done value when the batch is complete */
};

static __device__ __forceinline__ unsigned long long
gio_ld64(const unsigned long long *p)
{
	return *(const volatile unsigned long long *)p;
}

static __device__ __forceinline__ void gio_st64(unsigned long long *p,
						 unsigned long long v)
{
	*(volatile unsigned long long *)p = v;
}

static __device__ __forceinline__ uint32_t gio_ld32(const uint32_t *p)
{
	return *(const volatile uint32_t *)p;
}

/* Command @k of the batch as an iocb. */
static __device__ __forceinline__ void gio_iocb(const struct gio_kargs &a,
						uint32_t k,
						struct tt_gio_iocb *io)
{
	const struct tt_gio_layer *l = &a.layer;
	uint32_t blk, span;
	struct tt_extent e;

	if (a.mode == GIO_MODE_IOCBS) {
		*io = a.iocbs[k];
		return;
	}
	blk = k / l->geo.n_spans;
	span = k % l->geo.n_spans;
	e = tt_locate(&l->geo, l->slots[blk], l->layer, span);
	io->lba = e.off >> a.lba_shift;
	io->nsid = l->nsid_base + e.member;
	io->op = l->op;
	io->nseg = 1;
	io->rsvd = 0;
	io->seg[0].addr = l->base + (uint64_t)l->block_ids[blk] * l->block_stride +
			  (uint64_t)span * l->span_stride;
	io->seg[0].len = l->geo.span_bytes;
}

/* Build the SQE for @io using slot @slot's list memory; 0 or -TT_E*. */
static __device__ int gio_build_sqe(const struct gio_kargs &a,
				    const struct gio_q *q, uint32_t slot,
				    const struct tt_gio_iocb *io,
				    struct tt_nvme_sqe *sqe)
{
	struct tt_nvme_list list;
	uint64_t total = 0;
	unsigned i;
	int rc;

	if (io->nseg == 0 || io->nseg > TT_GIO_MAX_SEGS)
		return -TT_EINVAL;
	for (i = 0; i < io->nseg; i++)
		total += io->seg[i].len;
	if (total == 0 || (total & ((1u << a.lba_shift) - 1)))
		return -TT_EINVAL;
	if (io->op == TT_NVME_CMD_READ)
		rc = tt_nvme_cmd_read(sqe, io->nsid, io->lba,
				      (uint32_t)(total >> a.lba_shift));
	else if (io->op == TT_NVME_CMD_WRITE)
		rc = tt_nvme_cmd_write(sqe, io->nsid, io->lba,
				       (uint32_t)(total >> a.lba_shift));
	else
		rc = -TT_EINVAL;
	if (rc)
		return rc;
	list.vaddr = q->list_chunks ?
		q->list + (size_t)slot * q->list_chunks * q->chunk_bytes : NULL;
	list.bus = q->list_chunks ? q->list_bus + (size_t)slot * q->list_chunks : NULL;
	list.nchunks = q->list_chunks;
	list.chunk_bytes = q->chunk_bytes;
	return tt_nvme_map(sqe, q->qid, io->seg, io->nseg, &a.caps,
			   q->list_chunks ? &list : NULL);
}

/* Copy a built SQE into the ring with four 16-byte stores. */
static __device__ __forceinline__ void gio_put_sqe(struct tt_nvme_sqe *dst,
						   const struct tt_nvme_sqe *src)
{
	const uint4 *s = (const uint4 *)src;
	volatile uint4 *d = (volatile uint4 *)dst;
	uint4 v;
	int i;

	for (i = 0; i < 4; i++) {
		v = s[i];
		d[i].x = v.x;
		d[i].y = v.y;
		d[i].z = v.z;
		d[i].w = v.w;
	}
}

/*
 * Submit commands [c * 32, c * 32 + 32) of the batch to queue @q; called by
 * a whole warp.
 */
static __device__ void gio_submit_chunk(const struct gio_kargs &a,
					struct gio_q *q, uint32_t c)
{
	const unsigned lane = threadIdx.x & 31;
	const uint32_t k = c * 32 + lane;
	const uint32_t cnt = a.n - c * 32 < 32 ? a.n - c * 32 : 32;
	unsigned long long base = 0, t;
	struct tt_nvme_sqe sqe;
	struct tt_gio_iocb io;
	struct tt_nvme_sq view;
	uint32_t slot, gen, depth = q->depth;

	if (lane == 0)
		base = atomicAdd(&q->ticket, (unsigned long long)cnt);
	base = __shfl_sync(GIO_FULL_MASK, base, 0);
	if (lane < cnt) {
		t = base + lane;
		slot = (uint32_t)(t % depth);
		gen = (uint32_t)(t / depth);
		while (gio_ld32(&q->slot_gen[slot]) != gen)
			__nanosleep(64);
		while (t - gio_ld64(&q->sq_head) >= depth - 1)
			__nanosleep(64);
		gio_iocb(a, k, &io);
		if (gio_build_sqe(a, q, slot, &io, &sqe)) {
			/* Fail closed: the controller answers Invalid Opcode. */
			tt_nvme_sqe_clear(&sqe);
			sqe.opcode = GIO_OPC_POISON;
			sqe.nsid = io.nsid;
		}
		sqe.cid = (uint16_t)slot;
		a.status[k] = 0xffff; /* not completed (yet) */
		q->slots[slot].status = a.status + k;
		q->slots[slot].done = a.done;
		gio_put_sqe(&q->sq[slot], &sqe);
		tt_wmb();
	}
	__syncwarp();
	if (lane == 0) {
		while (gio_ld64(&q->published) != base)
			;
		view.ring = q->sq;
		view.db = q->sq_db;
		view.depth = depth;
		view.tail = (uint32_t)((base + cnt) % depth);
		view.head = 0;
		view.qid = q->qid;
		tt_sq_ring_doorbell(&view);
		/*
		 * System scope: the next warp rings after it sees @published,
		 * and the controller (a host thread, or the SSD across PCIe)
		 * must see our tail before its larger one, or the older value
		 * could land last and hide the newer commands.
		 */
		__threadfence_system();
		gio_st64(&q->published, base + cnt);
	}
	__syncwarp();
}

#define GIO_DMA_UNROLL 8	/* 16-byte loads in flight per lane */

/* Loads: host memory the controller refilled must not hit a stale line. */
static __device__ __forceinline__ uint4 gio_dma_ld16(const uint4 *p, bool host)
{
	return host ? __ldcv(p) : __ldcg(p);
}

static __device__ __forceinline__ void gio_dma_st16(uint4 *p, uint4 v, bool host)
{
	if (host)
		__stwt(p, v);
	else
		__stcg(p, v);
}

/*
 * Move @len bytes from @src to @dst, a whole warp; @src_host: the source is
 * host memory (else the destination is). 16-byte accesses, several in
 * flight per lane, when both ends and the length allow (LBA-sized moves
 * always do); bytes otherwise.
 */
static __device__ void gio_dma_copy(char *dst, const char *src, uint32_t len, bool src_host)
{
	const unsigned lane = threadIdx.x & 31;
	uint32_t i, k, u;

	if ((((uintptr_t)dst | (uintptr_t)src | len) & 15) == 0) {
		const uint4 *s = (const uint4 *)src;
		uint4 *d = (uint4 *)dst, v[GIO_DMA_UNROLL];
		const uint32_t n = len / 16;

		for (i = 0; i < n; i += 32 * GIO_DMA_UNROLL) {
#pragma unroll
			for (u = 0; u < GIO_DMA_UNROLL; u++) {
				k = i + u * 32 + lane;
				if (k < n)
					v[u] = gio_dma_ld16(s + k, src_host);
			}
#pragma unroll
			for (u = 0; u < GIO_DMA_UNROLL; u++) {
				k = i + u * 32 + lane;
				if (k < n)
					gio_dma_st16(d + k, v[u], !src_host);
			}
		}
		return;
	}
	for (i = lane; i < len; i += 32)
		((volatile char *)dst)[i] = ((const volatile char *)src)[i];
}

/*
 * Do data moves the controller queued on @q (tt_gio_qmem.dma) until none is
 * left unclaimed; called by a whole warp, any number of warps at once.
 * Return: moves done by this warp.
 *
 * A move is claimed with a CAS on a device counter, so each is done once;
 * its "done" word is written after a system-scope fence, so the controller
 * that sees it (and then posts the CQE) sees the bytes.
 */
static __device__ unsigned gio_dma_round(struct gio_q *q)
{
	const unsigned lane = threadIdx.x & 31;
	unsigned long long i = 0, c, prev, posted;
	unsigned done = 0;
	uint64_t dst = 0, src = 0;
	uint32_t len = 0, flags = 0;
	int got;

	if (!q->dma_posted)
		return 0;
	for (;;) {
		got = 0;
		if (lane == 0) {
			posted = *q->dma_posted;
			/* The descriptors behind the count, not older copies. */
			__threadfence_system();
			c = gio_ld64(&q->dma_claim);
			while (c < posted) {
				prev = atomicCAS(&q->dma_claim, c, c + 1);
				if (prev == c) {
					got = 1;
					i = c;
					break;
				}
				c = prev;
			}
			if (got) {
				const struct tt_gio_dma_desc *d = &q->dma_desc[i & q->dma_mask];

				dst = __ldcv((const unsigned long long *)&d->dst);
				src = __ldcv((const unsigned long long *)&d->src);
				len = __ldcv(&d->len);
				flags = __ldcv(&d->flags);
			}
		}
		got = __shfl_sync(GIO_FULL_MASK, got, 0);
		if (!got)
			return done;
		dst = __shfl_sync(GIO_FULL_MASK, dst, 0);
		src = __shfl_sync(GIO_FULL_MASK, src, 0);
		len = __shfl_sync(GIO_FULL_MASK, len, 0);
		flags = __shfl_sync(GIO_FULL_MASK, flags, 0);
		/* Orders every lane's loads after lane 0 saw the count: the data the
		 * controller wrote before publishing, not older bytes. */
		__syncwarp();
		gio_dma_copy((char *)(uintptr_t)dst, (const char *)(uintptr_t)src, len,
			     flags & TT_GIO_DMA_SRC_HOST);
		__threadfence_system();
		__syncwarp();
		if (lane == 0) {
			__threadfence_system();
			*(volatile unsigned long long *)&q->dma_desc[i & q->dma_mask].done = i + 1;
		}
		done++;
	}
}

/*
 * One polling round on @q by a whole warp. Return: completions consumed
 * (0 also when another reaper holds the queue).
 */
static __device__ unsigned gio_reap_round(struct gio_q *q)
{
	const unsigned lane = threadIdx.x & 31;
	struct tt_nvme_cq cq, mine;
	const struct tt_nvme_cqe *e;
	unsigned ball, n, i;
	uint16_t sqh = 0, cid;
	int got = 0;

	if (lane == 0)
		got = atomicCAS(&q->reaper_lock, 0, 1) == 0;
	got = __shfl_sync(GIO_FULL_MASK, got, 0);
	if (!got)
		return 0;
	__threadfence();
	cq.ring = q->cq.ring;
	cq.db = q->cq.db;
	cq.depth = q->cq.depth;
	cq.head = *(volatile uint32_t *)&q->cq.head;
	cq.phase = *(volatile uint8_t *)&q->cq.phase;

	mine = cq;
	mine.head = cq.head + lane;
	if (mine.head >= cq.depth) {
		mine.head -= cq.depth;
		mine.phase ^= 1;
	}
	e = lane < cq.depth ? tt_cq_peek(&mine) : NULL;
	ball = __ballot_sync(GIO_FULL_MASK, e != NULL);
	n = ~ball == 0 ? 32 : __ffs(~ball) - 1;
	if (lane < n) {
		struct gio_slot s;

		/*
		 * Volatile loads throughout: the entry and the slot record were
		 * rewritten since this SM last looked (a lap ago), and L1 is
		 * not coherent.
		 */
		const volatile struct tt_nvme_cqe *ve = e;
		struct tt_nvme_cqe c;

		c.cid = ve->cid;
		c.sq_head = ve->sq_head;
		c.status = ve->status;
		cid = c.cid;
		sqh = c.sq_head;
		if (cid < q->depth) {
			s.status = (uint16_t *)gio_ld64(
				(const unsigned long long *)&q->slots[cid].status);
			s.done = (unsigned *)gio_ld64(
				(const unsigned long long *)&q->slots[cid].done);
			*s.status = tt_nvme_cqe_status(&c);
			__threadfence();
			/* The slot is free for its next ticket from here on. */
			((volatile uint32_t *)q->slot_gen)[cid] =
				gio_ld32(&q->slot_gen[cid]) + 1;
			atomicAdd(s.done, 1u);
		}
	}
	__syncwarp();
	if (n)
		sqh = __shfl_sync(GIO_FULL_MASK, sqh, n - 1);
	if (lane == 0) {
		if (n) {
			unsigned long long h = gio_ld64(&q->sq_head);
			uint32_t d = q->depth;

			if (sqh < d)
				h += (sqh + d - (uint32_t)(h % d)) % d;
			gio_st64(&q->sq_head, h);
			gio_st64(&q->reaped, gio_ld64(&q->reaped) + n);
			for (i = 0; i < n; i++)
				tt_cq_advance(&cq);
			tt_cq_ring_doorbell(&cq);
			*(volatile uint32_t *)&q->cq.head = cq.head;
			*(volatile uint8_t *)&q->cq.phase = cq.phase;
		}
		__threadfence();
		atomicExch(&q->reaper_lock, 0);
	}
	__syncwarp();
	return n;
}

#endif /* TT_GIO_DEV_CUH */
