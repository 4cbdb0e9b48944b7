// SPDX-License-Identifier: Apache-2.0
//
// emu_serve.cuh - the emulated controller's service threads: fetch a batch
// from a queue, move its data, post its CQEs in fetch order.
// Included once, by emu_ctrl.cu (one translation unit, so everything stays
// static); emu_ctrl.cu keeps the controller's lifetime (open, map, close).
#ifndef TT_EMU_SERVE_CUH
#define TT_EMU_SERVE_CUH

// Post one CQE; waits for CQ room. Return: false when stopping.
static bool emu_post(struct tt_emu *e, emu_q *q, uint16_t cid, uint16_t status)
{
	struct tt_nvme_cqe *x;
	uint32_t next = q->cq_tail + 1 == q->depth ? 0 : q->cq_tail + 1;
	uint32_t w2, w3;

	while (next == __atomic_load_n((const uint32_t *)q->cq_db, __ATOMIC_ACQUIRE)) {
		if (e->stop.load(std::memory_order_relaxed))
			return false;
		emu_relax();
	}
	x = &q->cq[q->cq_tail];
	w2 = (uint32_t)q->sq_head | ((uint32_t)q->qid << 16);
	w3 = (uint32_t)cid | ((uint32_t)((status << 1) | q->phase) << 16);
	__atomic_store_n(&x->result, 0u, __ATOMIC_RELAXED);
	__atomic_store_n(&x->dw1, 0u, __ATOMIC_RELAXED);
	__atomic_store_n((uint32_t *)&x->sq_head, w2, __ATOMIC_RELAXED);
	// The phase tag goes last: the entry is whole once it flips.
	__atomic_store_n((uint32_t *)&x->cid, w3, __ATOMIC_RELEASE);
	q->cq_tail = next;
	if (next == 0) {
		q->phase ^= 1;
		e->cq_wraps.fetch_add(1, std::memory_order_relaxed);
	}
	return true;
}

// Namespace memory that @op commands on @nsid use in place, or NULL for
// the bounce (file backing not mapped, or mapped read-only and a write);
// @dev: the same memory as the GPU addresses it.
static char *emu_ns_direct(const struct tt_emu *e, uint32_t nsid, uint8_t op, char **dev)
{
	if (e->p.backing == TT_EMU_HOSTMEM) {
		*dev = e->ns_mem_dev[nsid - 1];
		return e->ns_mem[nsid - 1];
	}
	if (op == TT_NVME_CMD_READ || e->ns_map_wr[nsid - 1]) {
		*dev = e->ns_map_dev[nsid - 1];
		return e->ns_map[nsid - 1];
	}
	return nullptr;
}

// Fetch what queue @q's doorbell offers into @b. Return: commands fetched.
static unsigned emu_fetch(struct tt_emu *e, emu_q *q, emu_batch &b)
{
	uint32_t tail = __atomic_load_n((const uint32_t *)q->sq_db, __ATOMIC_ACQUIRE);
	uint64_t used = 0;
	unsigned n = 0;

	if (tail >= q->depth || tail == q->sq_head)
		return 0;
	if (tail != q->last_db) {
		q->last_db = tail;
		e->doorbells.fetch_add(1, std::memory_order_relaxed);
	}
	b.q = q;
	b.cmds.clear();
	b.ext.clear();
	while (q->sq_head != tail && n < EMU_MAX_FETCH) {
		struct tt_nvme_sqe s;
		emu_cmd c;
		bool alone = false;

		std::memcpy(&s, &q->sq[q->sq_head], sizeof(s));
		emu_parse(e, q, &s, c, b.ext);
		c.moving = false;
		c.direct = false;
		c.host = nullptr;
		c.dev = nullptr;
		if (c.status == TT_NVME_SC_SUCCESS && c.bytes && e->p.backing != TT_EMU_NULL) {
			char *md = nullptr, *m = emu_ns_direct(e, c.nsid, c.opcode, &md);

			if (m) {
				c.host = m + c.off;
				c.dev = md + c.off;
				c.direct = true;
			} else if (used + c.bytes <= EMU_SLOT_BOUNCE) {
				c.host = b.bounce + used;
				c.dev = b.bounce_dev + used;
				// Page aligned for O_DIRECT files.
				used += (c.bytes + EMU_PAGE - 1) / EMU_PAGE * EMU_PAGE;
			} else if (n) {
				// The bounce buffer is full: leave it in the SQ for
				// the next batch.
				b.ext.resize(c.ext_first);
				break;
			} else {
				alone = true;	// larger than the bounce: chunked
			}
		}
		b.cmds.push_back(c);
		if (++q->sq_head == q->depth) {
			q->sq_head = 0;
			e->sq_wraps.fetch_add(1, std::memory_order_relaxed);
		}
		n++;
		if (alone)
			break;
	}
	return n;
}

// After tt_emu_abort(): the batch moves nothing and every command in it
// completes aborted (its own error status if it already had one).
static void emu_abort_batch(emu_batch &b)
{
	b.pending = false;
	b.deadline_ns = 0;
	for (emu_cmd &c : b.cmds) {
		c.moving = false;
		if (c.status == TT_NVME_SC_SUCCESS)
			c.status = TT_NVME_SC_ABORT_SQ_DELETED;
	}
}

// Post @b's CQEs once its data landed and the cap allows.
// Return: 1 posted, 0 not yet, -1 stopping.
static int emu_complete(struct tt_emu *e, emu_worker &w, emu_batch &b)
{
	uint64_t bytes = 0;
	unsigned n = 0;

	if (b.pending && e->dma == EMU_DMA_KERNEL) {
		// Host memory the GPU writes: no driver call, no rate limit.
		if (!emu_dma_landed(b))
			return 0;
		b.pending = false;
		emu_landed(e, b);
	} else if (b.pending) {
		// Rate-limited: the query enters the runtime, which the
		// application's launching thread needs too.
		uint64_t now = emu_now_ns();
		cudaError_t r;

		if (now < w.next_poll_ns)
			return 0;
		w.next_poll_ns = now + e->poll_ns;
		emu_at(e, w, EMU_AT_QUERY);
		r = cudaEventQuery(b.done);
		if (r == cudaErrorNotReady)
			return 0;
		if (r != cudaSuccess) {
			cudaGetLastError();
			emu_fail_moving(b);
		}
		b.pending = false;
		emu_landed(e, b);
	}
	if (b.deadline_ns && emu_now_ns() < b.deadline_ns)
		return 0;
	emu_at(e, w, EMU_AT_POST);	// emu_post() waits for CQ room
	for (const emu_cmd &c : b.cmds) {
		if (!emu_post(e, b.q, c.cid, c.status))
			return -1;
		if (c.status)
			e->errors.fetch_add(1, std::memory_order_relaxed);
		else if (e->p.backing != TT_EMU_NULL)
			bytes += c.bytes;
		n++;
	}
	e->bytes.fetch_add(bytes, std::memory_order_relaxed);
	e->cmds.fetch_add(n, std::memory_order_relaxed);
	b.q->cmds.fetch_add(n, std::memory_order_relaxed);
	return 1;
}

// Post every batch at the head of @w's FIFO that is done.
// Return: batches posted, -1 when stopping.
static int emu_reap(struct tt_emu *e, emu_worker &w)
{
	int got = 0, r;

	while (w.n) {
		r = emu_complete(e, w, w.b[w.head]);
		if (r <= 0)
			return r < 0 ? -1 : got;
		w.head = (w.head + 1) % EMU_INFLIGHT;
		w.n--;
		e->busy.fetch_sub(1, std::memory_order_release);
		got++;
	}
	return got;
}

// EMU_DMA_KERNEL: a controller thread makes no CUDA call. EMU_DMA_COPY: the
// CUDA calls it makes once running are only these:
// cudaMemcpyBatchAsync / cudaMemcpyAsync and cudaEventRecord on its own
// non-blocking stream, and rate-limited cudaEventQuery (cudaStreamSynchronize
// on such a stream in the "sync" mode and for oversized file commands).
// Streams, events and bounce buffers are made in tt_emu_open(): no
// allocation, no legacy-stream call, nothing that waits for the device,
// while GPU kernels spin on our completions.
static void emu_thread_run(struct tt_emu *e, unsigned id)
{
	emu_worker &w = e->workers[id];
	std::vector<emu_q *> mine;
	unsigned idle = 0;
	int r;

	for (size_t q = id; q < e->qs.size(); q += e->p.n_threads)
		mine.push_back(e->qs[q]);
	if (e->dma == EMU_DMA_COPY &&
	    (e->ctx ? emu_drv.CtxSetCurrent(e->ctx) != CUDA_SUCCESS :
		      cudaSetDevice(e->device) != cudaSuccess)) {
		e->thread_err.store(-EIO);
		return;
	}
	while (!e->stop.load(std::memory_order_relaxed)) {
		unsigned got = 0;

		emu_at(e, w, EMU_AT_LOOP);
		if (e->mode.load(std::memory_order_acquire) == EMU_PAUSED) {
			std::this_thread::sleep_for(std::chrono::microseconds(100));
			continue;
		}
		// Each queue in turn gets a free batch, starting one further
		// each round so no queue always comes last.
		for (size_t k = 0; k < mine.size(); k++) {
			emu_q *q = mine[(w.rr + k) % mine.size()];

			if ((r = emu_reap(e, w)) < 0)
				return;
			got += r;
			if (w.n < EMU_INFLIGHT) {
				emu_batch &b = w.b[(w.head + w.n) % EMU_INFLIGHT];

				if (emu_fetch(e, q, b)) {
					if (e->diag) {
						b.issued_ns = emu_now_ns();
						emu_at(e, w, EMU_AT_ISSUE);
					}
					e->busy.fetch_add(1, std::memory_order_relaxed);
					if (e->mode.load(std::memory_order_acquire) == EMU_ABORTING)
						emu_abort_batch(b);
					else
						emu_issue(e, b);
					w.n++;
					got++;
				}
			}
		}
		if (!mine.empty())
			w.rr = (w.rr + 1) % mine.size();
		if ((r = emu_reap(e, w)) < 0)
			return;
		got += r;
		if (got) {
			idle = 0;
		} else if (w.n == EMU_INFLIGHT && !w.b[w.head].pending &&
			   w.b[w.head].deadline_ns > emu_now_ns() + 200000) {
			// Held back by the cap, with nothing free to fetch into.
			std::this_thread::sleep_for(std::chrono::microseconds(100));
		} else if (++idle > 4096) {
			if (e->idle_sleep_us)
				std::this_thread::sleep_for(std::chrono::microseconds(e->idle_sleep_us));
			else
				sched_yield();
		} else {
			emu_relax();
		}
	}
}

static void emu_thread(struct tt_emu *e, unsigned id)
{
	emu_thread_run(e, id);
	emu_at(e, e->workers[id], EMU_AT_EXITED);
}

#endif
