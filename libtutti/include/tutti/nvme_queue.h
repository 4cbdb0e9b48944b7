/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/nvme_queue.h - submission/completion ring logic for one submitter
 *
 * The same code runs on the CPU and inside a GPU kernel: the rings and
 * doorbells are plain pointers, valid in whichever address space the
 * submitter runs (host memory, GPU memory, a mapped BAR). These functions
 * assume a single submitter per SQ and a single reaper per CQ; they take
 * no locks. A multi-producer variant for many GPU threads (slot
 * reservation with atomics) is meant to wrap these structs from a CUDA
 * file, which is why they stay plain data with no hidden state.
 *
 * Ring rules (NVMe 1.4, 4.1): a queue of depth N holds at most N - 1
 * entries (full when tail + 1 == head); the controller starts writing
 * completions with phase tag 1 and inverts it each time it wraps.
 */
#ifndef TUTTI_NVME_QUEUE_H
#define TUTTI_NVME_QUEUE_H

#include "nvme.h"

/**
 * struct tt_nvme_sq - submission queue state
 * @ring: @depth entries
 * @db: SQ tail doorbell
 * @depth: number of entries in @ring, 2 to 65536
 * @tail: next slot the host fills
 * @head: last SQ head the controller reported in a completion
 * @qid: queue identifier (0 is the admin queue)
 */
struct tt_nvme_sq {
	struct tt_nvme_sqe *ring;
	volatile uint32_t *db;
	uint32_t depth;
	uint32_t tail;
	uint32_t head;
	uint16_t qid;
};

/**
 * struct tt_nvme_cq - completion queue state
 * @ring: @depth entries written by the controller
 * @db: CQ head doorbell
 * @depth: number of entries in @ring, 2 to 65536
 * @head: next entry to look at
 * @phase: phase tag that marks a new entry at @head
 */
struct tt_nvme_cq {
	volatile struct tt_nvme_cqe *ring;
	volatile uint32_t *db;
	uint32_t depth;
	uint32_t head;
	uint8_t phase;
};

/**
 * tt_nvme_db_offset() - offset of a doorbell in BAR0
 * @qid: queue identifier
 * @is_cq: true for the CQ head doorbell, false for the SQ tail doorbell
 * @dstrd: CAP.DSTRD doorbell stride
 *
 * Return: byte offset, 0x1000 + (2 * @qid + @is_cq) * (4 << @dstrd).
 */
TT_INLINE uint32_t tt_nvme_db_offset(uint16_t qid, bool is_cq, uint8_t dstrd)
{
	return 0x1000u + (2u * qid + (is_cq ? 1u : 0u)) * (4u << dstrd);
}

/**
 * tt_sq_init() - set up an empty submission queue
 * @sq: queue state
 * @ring: ring memory, @depth entries
 * @db: SQ tail doorbell
 * @depth: number of entries
 * @qid: queue identifier
 */
TT_INLINE void tt_sq_init(struct tt_nvme_sq *sq, struct tt_nvme_sqe *ring,
			  volatile uint32_t *db, uint32_t depth, uint16_t qid)
{
	sq->ring = ring;
	sq->db = db;
	sq->depth = depth;
	sq->tail = 0;
	sq->head = 0;
	sq->qid = qid;
}

/**
 * tt_cq_init() - set up an empty completion queue
 * @cq: queue state
 * @ring: ring memory, @depth entries, zeroed before the queue is created
 * @db: CQ head doorbell
 * @depth: number of entries
 */
TT_INLINE void tt_cq_init(struct tt_nvme_cq *cq, volatile struct tt_nvme_cqe *ring,
			  volatile uint32_t *db, uint32_t depth)
{
	cq->ring = ring;
	cq->db = db;
	cq->depth = depth;
	cq->head = 0;
	cq->phase = 1;
}

/**
 * tt_sq_space() - free submission slots
 * @sq: queue state
 *
 * Return: entries that can be pushed before the queue is full, as far as
 * the last reported head tells.
 */
TT_INLINE uint32_t tt_sq_space(const struct tt_nvme_sq *sq)
{
	uint32_t used = (sq->tail + sq->depth - sq->head) % sq->depth;

	return sq->depth - 1 - used;
}

/**
 * tt_sq_push() - copy a command into the next free slot
 * @sq: queue state
 * @sqe: command to copy
 *
 * The controller sees it only after tt_sq_ring_doorbell().
 *
 * Return: the slot used, or -TT_ENOSPC when the queue is full.
 */
TT_INLINE int tt_sq_push(struct tt_nvme_sq *sq, const struct tt_nvme_sqe *sqe)
{
	uint32_t slot = sq->tail;

	if (tt_sq_space(sq) == 0)
		return -TT_ENOSPC;
	sq->ring[slot] = *sqe;
	sq->tail = slot + 1 == sq->depth ? 0 : slot + 1;
	return (int)slot;
}

/**
 * tt_sq_ring_doorbell() - publish pushed commands to the controller
 * @sq: queue state
 */
TT_INLINE void tt_sq_ring_doorbell(struct tt_nvme_sq *sq)
{
	tt_wmb();
	tt_mmio_write32(sq->db, sq->tail);
}

/**
 * tt_sq_update_head() - record how far the controller has consumed
 * @sq: queue state
 * @sq_head: SQ head pointer from a completion entry
 *
 * Return: 0, or -TT_EINVAL if @sq_head is outside the ring (ignored).
 */
TT_INLINE int tt_sq_update_head(struct tt_nvme_sq *sq, uint16_t sq_head)
{
	if (sq_head >= sq->depth)
		return -TT_EINVAL;
	sq->head = sq_head;
	return 0;
}

/**
 * tt_cq_peek() - look at the next completion, if the controller posted one
 * @cq: queue state
 *
 * The entry stays valid until tt_cq_advance() and tt_cq_ring_doorbell()
 * hand the slot back to the controller.
 *
 * Return: the entry, or NULL if its phase tag is not the expected one.
 */
TT_INLINE const struct tt_nvme_cqe *tt_cq_peek(const struct tt_nvme_cq *cq)
{
	volatile struct tt_nvme_cqe *cqe = &cq->ring[cq->head];

	if ((tt_read_once_u16(&cqe->status) & TT_NVME_STATUS_PHASE) != cq->phase)
		return NULL;
	tt_rmb();
	/* Stable from here on: the controller does not rewrite it. */
	return (const struct tt_nvme_cqe *)(uintptr_t)cqe;
}

/**
 * tt_cq_advance() - consume the entry at the head
 * @cq: queue state
 *
 * Flips the expected phase tag when the head wraps.
 */
TT_INLINE void tt_cq_advance(struct tt_nvme_cq *cq)
{
	if (++cq->head == cq->depth) {
		cq->head = 0;
		cq->phase ^= 1;
	}
}

/**
 * tt_cq_ring_doorbell() - return consumed completion slots to the controller
 * @cq: queue state
 */
TT_INLINE void tt_cq_ring_doorbell(struct tt_nvme_cq *cq)
{
	tt_wmb();
	tt_mmio_write32(cq->db, cq->head);
}

#endif /* TUTTI_NVME_QUEUE_H */
