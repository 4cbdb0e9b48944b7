// SPDX-License-Identifier: Apache-2.0
//
// emu_dump.cuh - tt_emu_dump(): the controller's queues, heads, doorbells and
// each thread's batches in flight, for the gio hang diagnosis (docs/gpu.md,
// Known issues). Included once, at the end of emu_ctrl.cu.
#ifndef TT_EMU_DUMP_CUH
#define TT_EMU_DUMP_CUH

#include "cuda_query.cuh"

static const char *emu_where_str(int w)
{
	switch (w) {
	case EMU_AT_START: return "starting";
	case EMU_AT_LOOP: return "polling loop";
	case EMU_AT_QUERY: return "in cudaEventQuery";
	case EMU_AT_ISSUE: return "issuing copies (fetch, pread, cudaMemcpy*Async, cudaEventRecord)";
	case EMU_AT_POST: return "posting CQEs (waits for CQ room)";
	case EMU_AT_EXITED: return "exited";
	}
	return "?";
}

// The batch's event lives in the controller's context: ask it there.
static const char *emu_query_str(const struct tt_emu *c, cudaEvent_t ev)
{
	const char *s;

	if (!ev)
		return "no event";
	if (!emu_ctx_enter(c->ctx))
		return "controller context unavailable";
	s = tt_cuda_query_name(cudaEventQuery(ev), "cudaSuccess", "cudaErrorNotReady");
	emu_ctx_leave(c->ctx);
	return s;
}

// Relaxed loads of fields the threads own (racy by design: a diagnostic).
template <typename T>
static T emu_peek(const T &v)
{
	return __atomic_load_n(&v, __ATOMIC_RELAXED);
}

extern "C" void tt_emu_dump(const struct tt_emu *c, FILE *f)
{
	uint64_t now = emu_now_ns();
	struct tt_emu_stats st;
	int copy;

	if (!c || !f)
		return;
	copy = c->copy.load(std::memory_order_relaxed);
	std::fprintf(f, "emu: %u queues of depth %u, %u threads x %u batches (%u streams), data "
		     "moved by %s, backing %d, cap %.2f GB/s, stop %d, diag %s\n", c->p.n_queues,
		     c->p.depth, c->p.n_threads, EMU_INFLIGHT, tt_emu_n_streams(c),
		     c->dma == EMU_DMA_KERNEL ? "the gio kernels" :
		     copy == 0 ? "copy engines (batch)" : copy == 1 ? "copy engines (each)" :
		     copy == 2 ? "copy engines (sync)" : "?", c->p.backing, c->p.rate_gbps,
		     (int)c->stop.load(std::memory_order_relaxed),
		     c->diag ? "on" : "off (no thread positions or batch ages)");
	for (size_t i = 0; i < c->qs.size(); i++) {
		const emu_q *q = c->qs[i];
		uint32_t d = q->depth;
		uint32_t sdb = *q->sq_db, cdb = *q->cq_db;
		uint32_t sh = emu_peek(q->sq_head), ct = emu_peek(q->cq_tail);
		uint32_t ph = emu_peek(q->phase), ldb = emu_peek(q->last_db);

		std::fprintf(f, "emu q%zu (qid %u, thread %zu): sq_db %u sq_head %u (unfetched %u) "
			     "last_db %u | cq_tail %u phase %u cq_db %u (posted, not freed by the GPU "
			     "%u%s) | cmds %llu\n", i, (unsigned)q->qid, i % c->p.n_threads, sdb, sh,
			     sdb < d && sh < d ? (sdb + d - sh) % d : 0u, ldb, ct, ph, cdb,
			     cdb < d && ct < d ? (ct + d - cdb) % d : 0u,
			     cdb < d && ct < d && (ct + 1) % d == cdb ? ", CQ FULL" : "",
			     (unsigned long long)q->cmds.load(std::memory_order_relaxed));
		if (q->ring.desc)
			std::fprintf(f, "emu q%zu data moves: %llu posted, %llu seen done by the GPU "
				     "(published %llu)\n", i, (unsigned long long)emu_peek(q->ring.head),
				     (unsigned long long)emu_peek(q->ring.tail),
				     (unsigned long long)*q->ring.posted);
	}
	for (size_t t = 0; t < c->workers.size(); t++) {
		const emu_worker &w = c->workers[t];
		unsigned head = emu_peek(w.head), n = emu_peek(w.n);
		uint64_t beat = emu_peek(w.beat_ns);

		std::fprintf(f, "emu thread %zu: %u batches in flight (head %u)", t, n, head);
		if (c->diag)
			std::fprintf(f, ", %s, got there %.1f ms ago",
				     emu_where_str(emu_peek(w.where)),
				     beat && now > beat ? (double)(now - beat) / 1e6 : 0.0);
		std::fprintf(f, "\n");
		for (unsigned k = 0; k < EMU_INFLIGHT; k++) {
			const emu_batch &b = w.b[(head + k) % EMU_INFLIGHT];
			const emu_q *bq = emu_peek(b.q);
			uint64_t iss = emu_peek(b.issued_ns), dl = emu_peek(b.deadline_ns);

			if (k >= n)
				break;
			std::fprintf(f, "  batch %u: q%d, %zu cmds, pending %d", (head + k) % EMU_INFLIGHT,
				     bq ? (int)bq->qid - 1 : -1, b.cmds.size(),
				     (int)emu_peek(b.pending));
			if (iss && now > iss)
				std::fprintf(f, ", age %.1f ms", (double)(now - iss) / 1e6);
			else
				std::fprintf(f, ", age ?");
			if (dl > now)
				std::fprintf(f, ", held by the cap %.1f ms more", (double)(dl - now) / 1e6);
			if (c->dma == EMU_DMA_KERNEL)
				std::fprintf(f, ", data moves up to %llu\n",
					     (unsigned long long)emu_peek(b.dma.end));
			else
				std::fprintf(f, ", event %s\n", emu_query_str(c, b.done));
		}
	}
	tt_emu_get_stats(c, &st);
	std::fprintf(f, "emu: thread_err %d | cmds %llu errors %llu bytes %llu sq_wraps %llu "
		     "cq_wraps %llu doorbells %llu\n", c->thread_err.load(),
		     (unsigned long long)st.cmds, (unsigned long long)st.errors,
		     (unsigned long long)st.bytes, (unsigned long long)st.sq_wraps,
		     (unsigned long long)st.cq_wraps, (unsigned long long)st.doorbells);
	std::fflush(f);
}

#endif /* TT_EMU_DUMP_CUH */
