// SPDX-License-Identifier: Apache-2.0
//
// gio_uring.cu - GPU-driven NVMe submission and completion (host API and
// kernels). The ring protocol is nvme_queue.h / nvme_prp.h / nvme_sgl.h,
// compiled for the device; gio_dev.cuh adds the multi-producer parts.
//
// Work split: command k of a batch belongs to chunk k / 32 (one warp's
// worth) and chunk c goes to queue c % nq, so consecutive commands spread
// over the queues and a warp rings one doorbell for up to 32 commands.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_query.cuh"
#include "gio_dev.cuh"
#include "gpu_launch.cuh"

struct tt_gio {
	struct gio_q *qs;		// device array
	unsigned nq;
	unsigned warps;
	uint32_t max_depth;
	struct tt_nvme_xfer_caps caps;
	uint32_t lba_shift;
	std::vector<void *> allocs;	// device allocations to free
	// Set-up copies and zeroing, never on the legacy default stream: work
	// there runs whenever the caller's queued work (a framework's compute
	// on stream 0) lets it, unordered against the I/O streams, and a
	// counter zeroed late resets under a running batch, which then spins
	// forever.
	cudaStream_t ctl;
	// Fault injection for tests (TUTTI_GIO_FAULT_LAUNCH=N at open): the
	// first N launches fail without running, as a launch the driver refuses
	// would. Destroying the caller's stream to get one is undefined (it
	// crashed the test on the H200).
	unsigned fault_launches;
	bool dma;	// the controller has us move its data (tt_gio_qmem.dma)
};

struct tt_gio_batch {
	struct tt_gio *g;
	uint32_t max;
	uint32_t n;
	int mode;
	const struct tt_gio_iocb *iocbs;
	struct tt_gio_layer layer;
	// Host memory the GPU writes through (mapped): the result is read
	// without a copy, which no stream of the caller's context could be
	// trusted to run (its hardware queues may all be held by compute
	// waiting for this very I/O).
	uint16_t *hstatus;
	uint16_t *status;		// hstatus's device address, max entries
	unsigned *done;			// device counter, never reset
	unsigned target;
	// Recorded after each kernel that reaps the batch to its end
	// (tt_gio_submit_wait, tt_gio_wait_cqe): what tt_gio_batch_result
	// waits for, instead of every stream of the device.
	cudaEvent_t reaped;
	bool reap_launched;
};

// Submitting warps of block q take chunks q, q + nq, ... in turn.
static __device__ void gio_submit_queue(const struct gio_kargs &a, unsigned q,
					unsigned warp, unsigned nwarps)
{
	const uint32_t nchunks = (a.n + 31) / 32;
	uint32_t c;

	for (c = q + warp * a.nq; c < nchunks; c += nwarps * a.nq)
		gio_submit_chunk(a, &a.qs[q], c);
}

static __device__ __forceinline__ bool gio_batch_done(const struct gio_kargs &a)
{
	return (int)(*(volatile unsigned *)a.done - a.target) >= 0;
}

// issue_io: blockIdx.x = queue, every warp submits.
__global__ void gio_issue_kernel(struct gio_kargs a)
{
	gio_submit_queue(a, blockIdx.x, threadIdx.x / 32, blockDim.x / 32);
}

// wait_cqe: blockIdx.x = queue, warp 0 polls until the batch is done; with
// a controller that has no DMA engine, every warp does its data moves.
__global__ void gio_wait_kernel(struct gio_kargs a)
{
	struct gio_q *q = &a.qs[blockIdx.x];
	const bool reaper = threadIdx.x < 32;

	while (!gio_batch_done(a))
		if (!gio_dma_round(q) && !(reaper && gio_reap_round(q)))
			__nanosleep(128);
}

// Both in one launch: warp 0 of block q reaps queue q, the others submit.
// The reaper leaves once its submitters are finished and the queue has
// nothing outstanding, so blocks never wait on one another.
__global__ void gio_submit_wait_kernel(struct gio_kargs a)
{
	__shared__ unsigned submitters_left;
	const unsigned warp = threadIdx.x / 32, nw = blockDim.x / 32;
	struct gio_q *q = &a.qs[blockIdx.x];

	if (threadIdx.x == 0)
		submitters_left = nw - 1;
	__syncthreads();
	if (warp > 0) {
		gio_submit_queue(a, blockIdx.x, warp - 1, nw - 1);
		if ((threadIdx.x & 31) == 0)
			atomicSub(&submitters_left, 1u);
		// Then help with the controller's data moves, if it has us do them.
		while (q->dma_posted && !(*(volatile unsigned *)&submitters_left == 0 &&
					  gio_ld64(&q->reaped) == gio_ld64(&q->ticket)))
			if (!gio_dma_round(q))
				__nanosleep(64);
		return;
	}
	for (;;) {
		if (!gio_dma_round(q) && !gio_reap_round(q)) {
			if (*(volatile unsigned *)&submitters_left == 0 &&
			    gio_ld64(&q->reaped) == gio_ld64(&q->ticket))
				break;
			__nanosleep(64);
		}
	}
}

static int gio_cuda_err(cudaError_t e)
{
	return e == cudaSuccess ? 0 : (e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO);
}

template <typename T>
static int gio_dalloc(struct tt_gio *g, T **p, size_t n)
{
	void *v = nullptr;
	cudaError_t e = cudaMalloc(&v, n > 0 ? n * sizeof(T) : 1);

	if (e != cudaSuccess)
		return gio_cuda_err(e);
	g->allocs.push_back(v);
	*p = (T *)v;
	return gio_cuda_err(cudaMemsetAsync(v, 0, n * sizeof(T), g->ctl));
}

// Load every kernel now. With CUDA's lazy module loading (the default) the
// first launch of a kernel loads it, which waits for the device to go idle:
// a wait_cqe launched for the first time while an issue kernel spins for
// ring space would then never start.
static int gio_preload(void)
{
	struct cudaFuncAttributes fa;

	if (cudaFuncGetAttributes(&fa, gio_issue_kernel) != cudaSuccess ||
	    cudaFuncGetAttributes(&fa, gio_wait_kernel) != cudaSuccess ||
	    cudaFuncGetAttributes(&fa, gio_submit_wait_kernel) != cudaSuccess)
		return -EIO;
	return 0;
}

extern "C" void tt_gio_close(struct tt_gio *g)
{
	if (!g)
		return;
	if (g->ctl)
		cudaStreamSynchronize(g->ctl);
	for (void *p : g->allocs)
		cudaFree(p);
	if (g->ctl)
		cudaStreamDestroy(g->ctl);
	delete g;
}

extern "C" int tt_gio_open(const struct tt_gio_params *p, struct tt_gio **out)
{
	std::vector<struct gio_q> hq;
	struct tt_gio *g;
	unsigned i;
	int rc = 0;

	*out = nullptr;
	if (!p || !p->qmem || p->n_queues == 0 || p->n_queues > 1024 ||
	    (p->lba_shift != 9 && p->lba_shift != 12))
		return -EINVAL;
	g = new (std::nothrow) tt_gio();
	if (!g)
		return -ENOMEM;
	g->nq = p->n_queues;
	g->warps = p->warps_per_queue ? p->warps_per_queue : 4;
	g->caps = p->caps;
	g->lba_shift = p->lba_shift;
	if (const char *f = std::getenv("TUTTI_GIO_FAULT_LAUNCH"))
		g->fault_launches = (unsigned)std::strtoul(f, nullptr, 10);
	if (g->warps > 31) {
		tt_gio_close(g);
		return -EINVAL;
	}
	if (cudaStreamCreateWithFlags(&g->ctl, cudaStreamNonBlocking) != cudaSuccess) {
		cudaGetLastError();
		g->ctl = nullptr;
		tt_gio_close(g);
		return -EIO;
	}
	hq.resize(g->nq);
	for (i = 0; i < g->nq && !rc; i++) {
		const struct tt_gio_qmem *m = &p->qmem[i];
		struct gio_q *q = &hq[i];
		std::vector<uint64_t> bus;
		uint64_t *dbus = nullptr;

		// 64 entries at least: a warp's 32 tickets must fit below the
		// "full" rule behind the commands before them.
		if (m->depth < 64 || m->depth > 65536 || !m->sq || !m->cq ||
		    !m->sq_db || !m->cq_db || m->qid == 0 ||
		    (m->list_chunks && (!m->list || m->chunk_bytes < 64))) {
			rc = -EINVAL;
			break;
		}
		std::memset(q, 0, sizeof(*q));
		q->sq = m->sq;
		q->sq_db = m->sq_db;
		tt_cq_init(&q->cq, m->cq, m->cq_db, m->depth);
		q->depth = m->depth;
		q->qid = m->qid;
		q->list = (char *)m->list;
		q->list_chunks = m->list_chunks;
		q->chunk_bytes = m->chunk_bytes;
		if (m->dma) {
			uint32_t ne = m->dma->entries;

			if (!m->dma->posted || !m->dma->desc || ne == 0 || (ne & (ne - 1))) {
				rc = -EINVAL;
				break;
			}
			q->dma_posted = m->dma->posted;
			q->dma_desc = m->dma->desc;
			q->dma_mask = ne - 1;
			g->dma = true;
		}
		rc = gio_dalloc(g, &q->slot_gen, m->depth);
		if (!rc)
			rc = gio_dalloc(g, &q->slots, m->depth);
		if (!rc && m->list_chunks) {
			size_t nc = (size_t)m->depth * m->list_chunks;

			bus.resize(nc);
			for (size_t c = 0; c < nc; c++)
				bus[c] = m->list_bus + c * m->chunk_bytes;
			rc = gio_dalloc(g, &dbus, nc);
			if (!rc)
				rc = gio_cuda_err(cudaMemcpyAsync(dbus, bus.data(), nc * 8,
								  cudaMemcpyHostToDevice, g->ctl));
			// bus is pageable and goes out of scope
			if (!rc)
				rc = gio_cuda_err(cudaStreamSynchronize(g->ctl));
			q->list_bus = dbus;
		}
		if (m->depth > g->max_depth)
			g->max_depth = m->depth;
	}
	if (!rc)
		rc = gio_preload();
	if (!rc)
		rc = gio_dalloc(g, &g->qs, g->nq);
	if (!rc)
		rc = gio_cuda_err(cudaMemcpyAsync(g->qs, hq.data(), g->nq * sizeof(hq[0]),
						  cudaMemcpyHostToDevice, g->ctl));
	if (!rc)
		rc = gio_cuda_err(cudaStreamSynchronize(g->ctl));
	if (rc) {
		tt_gio_close(g);
		return rc;
	}
	*out = g;
	return 0;
}

extern "C" int tt_gio_batch_create(struct tt_gio *g, uint32_t max_cmds,
				   struct tt_gio_batch **out)
{
	struct tt_gio_batch *b;

	*out = nullptr;
	if (!g || max_cmds == 0)
		return -EINVAL;
	b = new (std::nothrow) tt_gio_batch();
	if (!b)
		return -ENOMEM;
	b->g = g;
	b->max = max_cmds;
	if (cudaHostAlloc(&b->hstatus, max_cmds * sizeof(uint16_t), cudaHostAllocMapped) != cudaSuccess ||
	    cudaHostGetDevicePointer(&b->status, b->hstatus, 0) != cudaSuccess ||
	    cudaEventCreateWithFlags(&b->reaped, cudaEventDisableTiming) != cudaSuccess) {
		cudaGetLastError();
		cudaFreeHost(b->hstatus);
		delete b;
		return -ENOMEM;
	}
	// Zeroed before any kernel can see the batch (see tt_gio.ctl).
	if (cudaMalloc(&b->done, sizeof(unsigned)) != cudaSuccess ||
	    cudaMemsetAsync(b->done, 0, sizeof(unsigned), g->ctl) != cudaSuccess ||
	    cudaStreamSynchronize(g->ctl) != cudaSuccess) {
		cudaGetLastError();
		cudaFree(b->done);
		cudaEventDestroy(b->reaped);
		cudaFreeHost(b->hstatus);
		delete b;
		return -ENOMEM;
	}
	*out = b;
	return 0;
}

extern "C" void tt_gio_batch_destroy(struct tt_gio_batch *b)
{
	if (!b)
		return;
	cudaEventDestroy(b->reaped);
	cudaFreeHost(b->hstatus);
	cudaFree(b->done);
	delete b;
}

extern "C" int tt_gio_prep_iocbs(struct tt_gio_batch *b,
				 const struct tt_gio_iocb *iocbs, uint32_t n)
{
	if (!b || !iocbs || n == 0 || n > b->max)
		return -EINVAL;
	b->mode = GIO_MODE_IOCBS;
	b->iocbs = iocbs;
	b->n = n;
	b->reap_launched = false;
	return 0;
}

extern "C" int tt_gio_prep_layer(struct tt_gio_batch *b,
				 const struct tt_gio_layer *l)
{
	uint64_t n;

	if (!b || !l || !l->slots || !l->block_ids || l->n_blocks == 0 ||
	    l->geo.n_spans == 0 || l->layer >= l->geo.n_layers ||
	    l->geo.n_members == 0 || l->geo.stripe_objs == 0)
		return -EINVAL;
	if (l->geo.span_bytes == 0 ||
	    (l->geo.span_bytes & ((1u << b->g->lba_shift) - 1)) ||
	    (l->op != TT_NVME_CMD_READ && l->op != TT_NVME_CMD_WRITE))
		return -EINVAL;
	n = (uint64_t)l->n_blocks * l->geo.n_spans;
	if (n > b->max)
		return -EINVAL;
	b->mode = GIO_MODE_LAYER;
	b->layer = *l;
	b->iocbs = nullptr;
	b->n = (uint32_t)n;
	b->reap_launched = false;
	return 0;
}

static void gio_args(const struct tt_gio_batch *b, struct gio_kargs *a)
{
	const struct tt_gio *g = b->g;

	std::memset(a, 0, sizeof(*a));
	a->qs = g->qs;
	a->nq = g->nq;
	a->n = b->n;
	a->mode = b->mode;
	a->iocbs = b->iocbs;
	if (b->mode == GIO_MODE_LAYER)
		a->layer = b->layer;
	a->caps = g->caps;
	a->lba_shift = g->lba_shift;
	a->status = b->status;
	a->done = b->done;
	a->target = b->target;
}

// Launch a kernel that submits @b's commands: the kernel waits for the batch's
// counter to reach target + n, and only a launch that happened may move the
// target (a target left ahead of the counter makes the next use of the
// pooled batch wait forever).
static int gio_launch(void (*kernel)(struct gio_kargs), struct tt_gio *g, struct tt_gio_batch *b,
		      unsigned threads, struct CUstream_st *stream)
{
	struct gio_kargs a;
	int rc;

	gio_args(b, &a);
	a.target = b->target + b->n;
	if (g->fault_launches) {
		g->fault_launches--;
		return gio_cuda_err(cudaErrorLaunchFailure);
	}
	rc = gio_cuda_err(tt_launch(kernel, g->nq, threads, (cudaStream_t)stream, a));
	if (!rc)
		b->target = a.target;
	return rc;
}

// After a launch (@rc) of a kernel that reaps @b to its end on @stream.
static int gio_reaped_on(struct tt_gio_batch *b, struct CUstream_st *stream, int rc)
{
	if (rc)
		return rc;
	if (cudaEventRecord(b->reaped, (cudaStream_t)stream) != cudaSuccess) {
		cudaGetLastError();
		b->reap_launched = false;
		return -EIO;
	}
	b->reap_launched = true;
	return 0;
}

extern "C" int tt_gio_submit_wait(struct tt_gio *g, struct tt_gio_batch *b,
				  struct CUstream_st *stream)
{
	if (!g || !b || b->g != g || b->n == 0)
		return -EINVAL;
	return gio_reaped_on(b, stream,
			     gio_launch(gio_submit_wait_kernel, g, b, 32 * (g->warps + 1), stream));
}

extern "C" int tt_gio_issue(struct tt_gio *g, struct tt_gio_batch *b,
			    struct CUstream_st *stream)
{
	if (!g || !b || b->g != g || b->n == 0)
		return -EINVAL;
	return gio_launch(gio_issue_kernel, g, b, 32 * g->warps, stream);
}

extern "C" int tt_gio_wait_cqe(struct tt_gio *g, struct tt_gio_batch *b,
			       struct CUstream_st *stream)
{
	struct gio_kargs a;

	if (!g || !b || b->g != g || b->n == 0)
		return -EINVAL;
	gio_args(b, &a);
	return gio_reaped_on(b, stream,
			     gio_cuda_err(tt_launch(gio_wait_kernel, g->nq, g->dma ? 32 * g->warps : 32,
						    (cudaStream_t)stream, a)));
}

extern "C" int tt_gio_batch_result(struct tt_gio_batch *b, uint32_t *n_err,
				   uint16_t *status)
{
	uint32_t i, bad = 0;

	if (n_err && b)
		*n_err = b->n;	// all failed, unless we get to know better
	if (!b || !b->reap_launched)
		return -EINVAL;
	// Only the kernel that reaped the batch: a device-wide wait would also
	// wait for compute that is itself waiting (an event, a flag) for the
	// caller's next step, and never return.
	if (cudaEventSynchronize(b->reaped) != cudaSuccess) {
		cudaGetLastError();
		return -EIO;
	}
	for (i = 0; i < b->n; i++) {
		uint16_t v = ((volatile uint16_t *)b->hstatus)[i];

		if (status)
			status[i] = v;
		bad += v != 0;
	}
	if (n_err)
		*n_err = bad;
	return bad ? -EIO : 0;
}

extern "C" const uint16_t *tt_gio_batch_status(const struct tt_gio_batch *b)
{
	return b->status;
}

extern "C" uint32_t tt_gio_batch_size(const struct tt_gio_batch *b)
{
	return b ? b->n : 0;
}

// ---- Diagnostics (a hang: a batch that never completes) -------------------
//
// Only reads. The device state comes up through one pinned buffer, kept for
// the life of the process (freeing pinned memory may wait for the device,
// which a spinning kernel never lets go idle), on a new non-blocking stream,
// waited for by polling with a 2 s limit: a dump must never be the next
// thing that hangs. A copy that did not finish leaves the buffer to the
// copy (a later dump allocates another).

#define GIO_DUMP_BYTES (1024u * sizeof(struct gio_q) + 4096u)
#define GIO_DUMP_WAIT_S 2.0

static std::mutex gio_dump_mu;
static char *gio_dump_buf;	// pinned, GIO_DUMP_BYTES
static cudaStream_t gio_dump_stuck;	// the stream of a copy that did not finish

static int gio_dump_prepare_locked(void)
{
	if (gio_dump_buf)
		return 0;
	if (cudaHostAlloc((void **)&gio_dump_buf, GIO_DUMP_BYTES, cudaHostAllocDefault) !=
	    cudaSuccess) {
		cudaGetLastError();
		gio_dump_buf = nullptr;
		return -ENOMEM;
	}
	return 0;
}

extern "C" int tt_gio_dump_prepare(void)
{
	std::lock_guard<std::mutex> lk(gio_dump_mu);

	return gio_dump_prepare_locked();
}

// Copy @bytes of device memory at @src into the pinned buffer (lock held).
// Return: the host copy, or NULL (said why on @f).
static const void *gio_dump_read(const void *src, size_t bytes, FILE *f)
{
	cudaStream_t s = nullptr;
	cudaError_t e;
	auto t0 = std::chrono::steady_clock::now();

	if (gio_dump_stuck) {
		if (!tt_cuda_reached(cudaStreamQuery(gio_dump_stuck))) {
			std::fprintf(f, "  device copy skipped: an earlier dump's copy has still "
				     "not finished\n");
			return nullptr;
		}
		cudaStreamDestroy(gio_dump_stuck);
		gio_dump_stuck = nullptr;
	}
	if (bytes > GIO_DUMP_BYTES || gio_dump_prepare_locked()) {
		std::fprintf(f, "  device copy: no pinned buffer for %zu bytes\n", bytes);
		return nullptr;
	}
	e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(gio_dump_buf, src, bytes, cudaMemcpyDeviceToHost, s);
	if (e != cudaSuccess) {
		std::fprintf(f, "  device copy failed to start: %s\n", cudaGetErrorString(e));
		cudaGetLastError();
		if (s)
			cudaStreamDestroy(s);
		return nullptr;
	}
	while ((e = cudaStreamQuery(s)) == cudaErrorNotReady) {
		std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0;

		if (d.count() > GIO_DUMP_WAIT_S) {
			std::fprintf(f, "device copy did not finish in 2 s: the copy engine / "
				     "runtime is stuck\n");
			std::fprintf(f, "  (a new stream's copy queued behind a blocked CUDA "
				     "hardware queue looks the same)\n");
			gio_dump_buf = nullptr;	// the copy may still land in it
			gio_dump_stuck = s;
			return nullptr;
		}
		std::this_thread::sleep_for(std::chrono::microseconds(500));
	}
	cudaStreamDestroy(s);
	if (e != cudaSuccess) {
		std::fprintf(f, "  device copy failed: %s\n", cudaGetErrorString(e));
		cudaGetLastError();
		return nullptr;
	}
	return gio_dump_buf;
}

// Host view of a GPU-usable address, if it is host memory (the emulated
// controller's doorbell page and rings), else NULL (a real BAR, HBM).
static const volatile void *gio_host_view(const volatile void *p)
{
	struct cudaPointerAttributes a;

	if (!p)
		return nullptr;
	if (cudaPointerGetAttributes(&a, (const void *)p) != cudaSuccess) {
		cudaGetLastError();
		return nullptr;
	}
	if (a.type != cudaMemoryTypeHost || !a.hostPointer || !a.devicePointer)
		return nullptr;
	// The same offset into the allocation, through its host mapping.
	return (const volatile char *)a.hostPointer +
	       ((const char *)(uintptr_t)p - (const char *)a.devicePointer);
}

extern "C" void tt_gio_dump(struct tt_gio *g, FILE *f)
{
	std::lock_guard<std::mutex> lk(gio_dump_mu);
	std::vector<struct gio_q> q;
	const void *h;

	if (!g || !f)
		return;
	std::fprintf(f, "gio: %u queues, %u submitting warps per queue; copying the device "
		     "queue state...\n", g->nq, g->warps);
	std::fflush(f);
	h = gio_dump_read(g->qs, g->nq * sizeof(struct gio_q), f);
	if (!h) {
		std::fflush(f);
		return;
	}
	q.resize(g->nq);
	std::memcpy(q.data(), h, g->nq * sizeof(struct gio_q));
	for (unsigned i = 0; i < g->nq; i++) {
		const struct gio_q *x = &q[i];
		const volatile uint32_t *sdb = (const volatile uint32_t *)gio_host_view(x->sq_db);
		const volatile uint32_t *cdb = (const volatile uint32_t *)gio_host_view(x->cq.db);
		const volatile struct tt_nvme_cqe *ring =
			(const volatile struct tt_nvme_cqe *)gio_host_view(x->cq.ring);

		std::fprintf(f, "gio q%u (qid %u, depth %u): ticket %llu published %llu sq_head %llu "
			     "reaped %llu | cq.head %u cq.phase %u reaper_lock %d", i,
			     (unsigned)x->qid, x->depth, x->ticket, x->published, x->sq_head,
			     x->reaped, x->cq.head, (unsigned)x->cq.phase, x->reaper_lock);
		if (sdb)
			std::fprintf(f, " | sq_db %u (published %% depth %llu%s)", *sdb,
				     x->depth ? x->published % x->depth : 0ull,
				     x->depth && *sdb == x->published % x->depth ? "" : ": DIFFERS");
		else
			std::fprintf(f, " | sq_db not host-visible");
		if (cdb)
			std::fprintf(f, " cq_db %u", *cdb);
		if (x->dma_posted) {
			const volatile uint64_t *posted =
				(const volatile uint64_t *)gio_host_view(x->dma_posted);

			std::fprintf(f, " | data moves claimed %llu", x->dma_claim);
			if (posted)
				std::fprintf(f, " of %llu posted", (unsigned long long)*posted);
		}
		if (ring && x->cq.head < x->depth) {
			unsigned ph = ring[x->cq.head].status & TT_NVME_STATUS_PHASE;

			std::fprintf(f, " cqe[head].phase %u%s", ph,
				     ph == x->cq.phase ? " (NEW ENTRY NOT REAPED)" : "");
		}
		std::fprintf(f, "\n");
	}
	std::fflush(f);
}

extern "C" void tt_gio_batch_dump(const struct tt_gio_batch *b, FILE *f)
{
	std::lock_guard<std::mutex> lk(gio_dump_mu);
	const void *h;
	unsigned done;

	if (!b || !f)
		return;
	std::fprintf(f, " batch: %u commands, target %u, ", b->n, b->target);
	h = gio_dump_read(b->done, sizeof(unsigned), f);
	if (!h) {
		std::fflush(f);
		return;
	}
	std::memcpy(&done, h, sizeof(done));
	std::fprintf(f, "done counter %u (%s)\n", done,
		     (int)(done - b->target) >= 0 ? "all reaped" : "missing completions");
	std::fflush(f);
}
