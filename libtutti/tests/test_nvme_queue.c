/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Description: SQ/CQ ring logic of tutti/nvme_queue.h against a simulated
 * controller that consumes submission entries from the ring up to the tail
 * doorbell and posts completions with the phase tag NVMe 1.4 prescribes.
 */
#include <stdint.h>
#include <string.h>

#include <tutti/nvme_queue.h>

#include "tap.h"

/* A simulated controller for one SQ/CQ pair, in host memory. */
struct sim_ctrl {
	const struct tt_nvme_sqe *sq_ring;
	uint32_t sq_depth;
	uint32_t sq_head;
	const volatile uint32_t *sq_tail_db;
	struct tt_nvme_cqe *cq_ring;
	uint32_t cq_depth;
	uint32_t cq_tail;
	uint8_t phase;
	const volatile uint32_t *cq_head_db;
	uint16_t sqid;
	uint16_t status; /* status code to post, without phase */
};

static void sim_init(struct sim_ctrl *c, const struct tt_nvme_sq *sq, const struct tt_nvme_cq *cq)
{
	c->sq_ring = sq->ring;
	c->sq_depth = sq->depth;
	c->sq_head = 0;
	c->sq_tail_db = sq->db;
	c->cq_ring = (struct tt_nvme_cqe *)(uintptr_t)cq->ring;
	c->cq_depth = cq->depth;
	c->cq_tail = 0;
	c->phase = 1;
	c->cq_head_db = cq->db;
	c->sqid = sq->qid;
	c->status = 0;
}

/* Execute up to @max commands; stops when the SQ is empty or the CQ full. */
static unsigned sim_run(struct sim_ctrl *c, unsigned max)
{
	unsigned done = 0;

	while (done < max && c->sq_head != *c->sq_tail_db) {
		uint32_t next = (c->cq_tail + 1) % c->cq_depth;
		const struct tt_nvme_sqe *sqe;
		struct tt_nvme_cqe *cqe;

		if (next == *c->cq_head_db)
			break; /* CQ full: depth - 1 entries outstanding */
		sqe = &c->sq_ring[c->sq_head];
		c->sq_head = (c->sq_head + 1) % c->sq_depth;
		cqe = &c->cq_ring[c->cq_tail];
		cqe->result = sqe->cdw10; /* echo, so the host can check the copy */
		cqe->dw1 = 0;
		cqe->sq_head = (uint16_t)c->sq_head;
		cqe->sq_id = c->sqid;
		cqe->cid = sqe->cid;
		__atomic_store_n(&cqe->status, (uint16_t)(c->status << 1 | c->phase),
				 __ATOMIC_RELEASE);
		c->cq_tail = next;
		if (c->cq_tail == 0)
			c->phase ^= 1;
		done++;
	}
	return done;
}

static long ret_of(int r)
{
	return r;
}

static void cmd(struct tt_nvme_sqe *sqe, uint16_t cid)
{
	tt_nvme_cmd_read(sqe, 1, 1000u + cid, 1);
	sqe->cid = cid;
}

static void test_doorbell_offsets(void)
{
	uint32_t bar[0x1100 / 4 + 64];
	volatile uint32_t *db;
	struct tt_nvme_sq sq;
	struct tt_nvme_sqe ring[4], sqe;
	int changed = 0;

	tap_eq(tt_nvme_db_offset(0, false, 0), 0x1000, "dstrd 0: admin SQ tail doorbell at 1000h");
	tap_eq(tt_nvme_db_offset(0, true, 0), 0x1004, "dstrd 0: admin CQ head doorbell at 1004h");
	tap_eq(tt_nvme_db_offset(1, false, 0), 0x1008, "dstrd 0: SQ 1 at 1008h");
	tap_eq(tt_nvme_db_offset(1, true, 0), 0x100c, "dstrd 0: CQ 1 at 100Ch");
	tap_eq(tt_nvme_db_offset(7, true, 0), 0x103c, "dstrd 0: CQ 7 at 103Ch");
	tap_eq(tt_nvme_db_offset(0, true, 2), 0x1010, "dstrd 2: admin CQ at 1010h (16-byte stride)");
	tap_eq(tt_nvme_db_offset(1, false, 2), 0x1020, "dstrd 2: SQ 1 at 1020h");
	tap_eq(tt_nvme_db_offset(1, true, 2), 0x1030, "dstrd 2: CQ 1 at 1030h");
	tap_eq(tt_nvme_db_offset(65535, true, 2), 0x1000u + 131071u * 16,
	       "dstrd 2: CQ 65535, no overflow");

	/* A fake BAR0: ringing SQ 2's doorbell (dstrd 0) writes only that word. */
	memset(bar, 0, sizeof(bar));
	db = &bar[tt_nvme_db_offset(2, false, 0) / 4];
	tt_sq_init(&sq, ring, db, 4, 2);
	cmd(&sqe, 1);
	tt_sq_push(&sq, &sqe);
	tt_sq_push(&sq, &sqe);
	tt_sq_ring_doorbell(&sq);
	for (unsigned i = 0; i < sizeof(bar) / 4; i++)
		if (bar[i] && &bar[i] != (uint32_t *)(uintptr_t)db)
			changed++;
	tap_eq(bar[0x1010 / 4], 2, "SQ 2 tail doorbell at 1010h holds the tail (2)");
	tap_eq(changed, 0, "no other BAR word written");
}

static void test_fill(void)
{
	struct tt_nvme_sqe ring[8], sqe;
	struct tt_nvme_cqe cring[8];
	uint32_t sq_db = 0xffffffff, cq_db = 0xffffffff;
	struct tt_nvme_sq sq;
	struct tt_nvme_cq cq;
	struct sim_ctrl ctrl;
	const struct tt_nvme_cqe *cqe;
	int slot, ok = 1;

	memset(ring, 0, sizeof(ring));
	memset(cring, 0, sizeof(cring));
	tt_sq_init(&sq, ring, &sq_db, 8, 1);
	tt_cq_init(&cq, cring, &cq_db, 8);
	sq_db = 0;
	cq_db = 0;
	sim_init(&ctrl, &sq, &cq);

	tap_eq(tt_sq_space(&sq), 7, "empty SQ of depth 8 has 7 free slots");
	tap_ok(tt_cq_peek(&cq) == NULL, "zeroed CQ: nothing to peek (phase 0 != expected 1)");
	for (uint16_t i = 0; i < 7; i++) {
		cmd(&sqe, i);
		slot = tt_sq_push(&sq, &sqe);
		ok &= slot == i && !memcmp(&ring[i], &sqe, sizeof(sqe));
	}
	tap_ok(ok, "7 pushes fill slots 0..6 with exact copies");
	tap_eq(tt_sq_space(&sq), 0, "SQ full after depth - 1 entries");
	cmd(&sqe, 99);
	tap_eq((uint64_t)ret_of(tt_sq_push(&sq, &sqe)), (uint64_t)-TT_ENOSPC, "8th push: -ENOSPC");
	tap_eq(sq.tail, 7, "tail stays at 7 after the refused push");
	tap_eq(sq_db, 0, "nothing visible before the doorbell");
	tap_eq(sim_run(&ctrl, 100), 0, "controller sees nothing before the doorbell");
	tt_sq_ring_doorbell(&sq);
	tap_eq(sq_db, 7, "SQ doorbell written with tail 7");

	tap_eq(sim_run(&ctrl, 3), 3, "controller completes 3 commands");
	ok = 1;
	for (uint16_t i = 0; i < 3; i++) {
		cqe = tt_cq_peek(&cq);
		ok &= cqe && cqe->cid == i && cqe->result == 1000u + i &&
		      tt_nvme_cqe_phase(cqe) == 1 && cqe->sq_id == 1;
		if (cqe) {
			tt_sq_update_head(&sq, cqe->sq_head);
			tt_cq_advance(&cq);
		}
	}
	tap_ok(ok, "host reaps cids 0, 1, 2 in order with phase 1");
	tap_ok(tt_cq_peek(&cq) == NULL, "no fourth completion yet");
	tap_eq(sq.head, 3, "SQ head from the last completion: 3");
	tap_eq(tt_sq_space(&sq), 3, "3 slots free again");
	tap_eq(cq_db, 0, "CQ doorbell untouched until rung");
	tt_cq_ring_doorbell(&cq);
	tap_eq(cq_db, 3, "CQ head doorbell written with head 3");

	ok = 1;
	for (uint16_t i = 7; i < 10; i++) {
		cmd(&sqe, i);
		slot = tt_sq_push(&sq, &sqe);
		ok &= slot == (int)(i % 8);
	}
	tap_ok(ok, "next pushes wrap: slots 7, 0, 1");
	tap_eq(sq.tail, 2, "tail wrapped to 2");
	tap_eq(tt_sq_space(&sq), 0, "full again");
	tt_sq_ring_doorbell(&sq);
	tap_eq(sq_db, 2, "doorbell carries the wrapped tail");

	tap_eq((uint64_t)ret_of(tt_sq_update_head(&sq, 8)), (uint64_t)-TT_EINVAL,
	       "SQ head beyond the ring rejected");
	tap_eq(sq.head, 3, "rejected head leaves state alone");
}

/* Phase flip: after the CQ wraps, stale entries of the old phase are not new. */
static void test_phase(void)
{
	struct tt_nvme_sqe ring[16], sqe;
	struct tt_nvme_cqe cring[4];
	uint32_t sq_db = 0, cq_db = 0;
	struct tt_nvme_sq sq;
	struct tt_nvme_cq cq;
	struct sim_ctrl ctrl;
	const struct tt_nvme_cqe *cqe;

	memset(cring, 0, sizeof(cring));
	tt_sq_init(&sq, ring, &sq_db, 16, 1);
	tt_cq_init(&cq, cring, &cq_db, 4);
	sim_init(&ctrl, &sq, &cq);
	for (uint16_t i = 0; i < 6; i++) {
		cmd(&sqe, i);
		tt_sq_push(&sq, &sqe);
	}
	tt_sq_ring_doorbell(&sq);
	tap_eq(sim_run(&ctrl, 100), 3, "CQ of depth 4 takes 3 completions, then is full");
	for (int i = 0; i < 3; i++) {
		tt_cq_advance(&cq);
	}
	tt_cq_ring_doorbell(&cq);
	tap_eq(cq.head, 3, "host consumed 3");
	tap_eq(sim_run(&ctrl, 1), 1, "controller posts the 4th into slot 3");
	cqe = tt_cq_peek(&cq);
	tap_ok(cqe && cqe->cid == 3 && tt_nvme_cqe_phase(cqe) == 1, "slot 3: cid 3, phase 1");
	tt_cq_advance(&cq);
	tap_ok(cq.head == 0 && cq.phase == 0, "head wraps to 0 and the expected phase flips to 0");
	tap_ok(tt_cq_peek(&cq) == NULL, "slot 0 still holds cid 0 with phase 1: stale, not returned");
	tt_cq_ring_doorbell(&cq);
	tap_eq(sim_run(&ctrl, 1), 1, "controller posts the 5th into slot 0 with phase 0");
	cqe = tt_cq_peek(&cq);
	tap_ok(cqe && cqe->cid == 4 && tt_nvme_cqe_phase(cqe) == 0, "slot 0: cid 4, phase 0 accepted");
	tap_eq(cring[0].status & 1, 0, "the entry in memory carries phase 0");

	ctrl.status = TT_NVME_SC_LBA_RANGE;
	tt_cq_advance(&cq);
	tt_cq_ring_doorbell(&cq);
	sim_run(&ctrl, 1);
	cqe = tt_cq_peek(&cq);
	tap_ok(cqe && cqe->cid == 5 && tt_nvme_cqe_status(cqe) == TT_NVME_SC_LBA_RANGE,
	       "error status read without the phase bit");
}

/* Many commands through small rings: every completion once, in order. */
static void test_stream(uint32_t sq_depth, uint32_t cq_depth)
{
	struct tt_nvme_sqe ring[64], sqe;
	struct tt_nvme_cqe cring[64];
	uint32_t sq_db = 0, cq_db = 0;
	struct tt_nvme_sq sq;
	struct tt_nvme_cq cq;
	struct sim_ctrl ctrl;
	const struct tt_nvme_cqe *cqe;
	uint64_t seed = sq_depth * 7919u + cq_depth;
	unsigned submitted = 0, reaped = 0, wraps = 0, bad = 0, rounds = 0;
	const unsigned total = 5000;

	memset(cring, 0, sizeof(cring));
	tt_sq_init(&sq, ring, &sq_db, sq_depth, 3);
	tt_cq_init(&cq, cring, &cq_db, cq_depth);
	sim_init(&ctrl, &sq, &cq);
	while (reaped < total) {
		unsigned burst;

		if (++rounds > 20 * total) {
			bad++; /* no progress: a stuck ring must fail, not hang */
			tap_diag("stuck after %u of %u completions", reaped, total);
			break;
		}

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		burst = 1 + (unsigned)(seed >> 60);
		while (burst-- && submitted < total) {
			uint32_t space = tt_sq_space(&sq);

			cmd(&sqe, (uint16_t)submitted);
			if (tt_sq_push(&sq, &sqe) < 0) {
				if (space != 0)
					bad++;
				break;
			}
			submitted++;
		}
		tt_sq_ring_doorbell(&sq);
		if (sq_db != sq.tail)
			bad++;
		sim_run(&ctrl, 1 + (unsigned)(seed >> 58) % 8);
		burst = 1 + (unsigned)(seed >> 50) % 8;
		while (burst-- && (cqe = tt_cq_peek(&cq)) != NULL) {
			if (cqe->cid != (uint16_t)reaped || cqe->result != 1000u + (uint16_t)reaped ||
			    tt_sq_update_head(&sq, cqe->sq_head))
				bad++;
			reaped++;
			tt_cq_advance(&cq);
			if (cq.head == 0)
				wraps++;
		}
		tt_cq_ring_doorbell(&cq);
		if (submitted - reaped > sq_depth - 1 + cq_depth - 1)
			bad++; /* more in flight than the two rings can hold */
	}
	tap_ok(bad == 0 && wraps == total / cq_depth && tt_cq_peek(&cq) == NULL,
	       "SQ %u / CQ %u: %u commands reaped once, in order, across %u CQ wraps",
	       sq_depth, cq_depth, total, wraps);
}

static void test_depth2(void)
{
	struct tt_nvme_sqe ring[2], sqe;
	uint32_t db = 0;
	struct tt_nvme_sq sq;

	tt_sq_init(&sq, ring, &db, 2, 1);
	cmd(&sqe, 1);
	tap_eq(ret_of(tt_sq_push(&sq, &sqe)), 0, "depth 2: first push in slot 0");
	tap_eq((uint64_t)ret_of(tt_sq_push(&sq, &sqe)), (uint64_t)-TT_ENOSPC,
	       "depth 2 holds a single entry");
	tt_sq_update_head(&sq, 1);
	tap_eq(ret_of(tt_sq_push(&sq, &sqe)), 1, "after head moves: slot 1");
	tap_eq(sq.tail, 0, "tail wraps to 0");
}

int main(void)
{
	test_doorbell_offsets();
	test_fill();
	test_phase();
	test_stream(8, 5);
	test_stream(2, 2);
	test_stream(64, 3);
	test_stream(5, 64);
	test_depth2();
	return tap_done();
}
