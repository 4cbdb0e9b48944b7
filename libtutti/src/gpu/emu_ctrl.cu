// SPDX-License-Identifier: Apache-2.0
//
// emu_ctrl.cu - emulated NVMe controller serving GPU-driven queues (host
// code only; built by nvcc because it calls the CUDA runtime).
//
// Per queue, in order, like a controller's fetch engine: read the SQ tail
// doorbell, fetch every SQE up to it, validate it and resolve its data
// pointer (PRP: PRP1/PRP2/PRP lists with chaining; SGL: data block in
// DPTR or Segment / Last Segment chains), move the data, then post one CQE
// per command with the phase tag, never past the CQ head doorbell.
// A thread serves queues q, q + n_threads, ...
//
// Data movement: what one fetch takes from a queue is a batch. By default
// (EMU_DMA_KERNEL) its moves go on the queue's move ring and the gio kernels
// polling the queue do them (gio_dma_round()): the threads make no CUDA
// call, and the kernels that wait for the data are the ones moving it, so no
// GPU queue can hold it up. TUTTI_EMU_DMA=copy: all its copies go to the
// copy engines in one cudaMemcpyBatchAsync on its thread's stream, followed
// by the batch's event, in the controller's own CUDA context (emu_ctx.cuh);
// TUTTI_EMU_COPY picks "batch" (default), "each" (one cudaMemcpyAsync per
// extent) or "sync" (per extent and a stream sync per batch). Either way a
// thread keeps up to EMU_INFLIGHT batches in flight and posts their CQEs in
// fetch order once their data landed, so it keeps fetching while data moves.
//
// TT_EMU_FILE on tmpfs (a RAM-backed store in /dev/shm): each namespace's
// file is mapped MAP_SHARED and pinned with cudaHostRegister at open, and
// its commands are served like TT_EMU_HOSTMEM, the copy engines moving data
// straight between the file's pages and GPU memory: no pread/pwrite, no
// bounce. TUTTI_EMU_FILE_MAP=0 keeps pread/pwrite through the bounce.
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include "tutti/emu_ctrl.h"
#include "tutti/nvme_queue.h"
#include "tutti/nvme_sgl.h"

#include "pinned.cuh"
#include "emu_dma_ring.h"
#include "emu_impl.cuh"
#include "emu_ctx.cuh"
#include "emu_walk.cuh"
#include "emu_copy.cuh"
#include "emu_serve.cuh"

// Whether some file command may go through a bounce buffer.
static bool emu_need_bounce(const struct tt_emu *e)
{
	if (e->p.backing != TT_EMU_FILE)
		return false;
	for (unsigned i = 0; i < e->p.n_ns; i++)
		if (!e->ns_map[i] || !e->ns_map_wr[i])
			return true;
	return false;
}

static int emu_host_alloc(struct tt_pinned *m, size_t bytes, bool zero);

// Batches' bounce buffers and vectors, in the caller's context (the gio
// kernels move data to and from the bounce buffers in EMU_DMA_KERNEL).
static int emu_worker_alloc(struct tt_emu *e, emu_worker &w)
{
	for (emu_batch &b : w.b) {
		if (emu_need_bounce(e)) {
			if (emu_host_alloc(&b.bounce_mem, EMU_SLOT_BOUNCE, false))
				return -ENOMEM;
			b.bounce = b.bounce_mem.host;
			b.bounce_dev = b.bounce_mem.dev;
		}
		b.cmds.reserve(EMU_MAX_FETCH);
		b.ext.reserve(EMU_MAX_FETCH * 4);
		b.dst.reserve(EMU_MAX_FETCH * 4);
		b.src.reserve(EMU_MAX_FETCH * 4);
		b.len.reserve(EMU_MAX_FETCH * 4);
	}
	return 0;
}

// EMU_DMA_COPY: a thread's stream and its batches' events, in the
// controller's context.
static int emu_worker_init(emu_worker &w)
{
	if (cudaStreamCreateWithFlags(&w.stream, cudaStreamNonBlocking) != cudaSuccess)
		return -EIO;
	for (emu_batch &b : w.b) {
		b.stream = w.stream;
		if (cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming) != cudaSuccess)
			return -EIO;
	}
	return 0;
}

extern "C" void tt_emu_pause(struct tt_emu *c, int on)
{
	int want = on ? EMU_PAUSED : EMU_RUN;
	int cur = on ? EMU_RUN : EMU_PAUSED;

	if (c)	// an abort is never undone
		c->mode.compare_exchange_strong(cur, want, std::memory_order_acq_rel);
}

extern "C" void tt_emu_abort(struct tt_emu *c)
{
	if (c)
		c->mode.store(EMU_ABORTING, std::memory_order_release);
}

extern "C" unsigned tt_emu_busy(const struct tt_emu *c)
{
	return c ? c->busy.load(std::memory_order_acquire) : 0;
}

extern "C" void tt_emu_close(struct tt_emu *c)
{
	unsigned i;

	if (!c)
		return;
	c->stop.store(true);
	for (std::thread &t : c->threads)
		t.join();
	if (emu_ctx_enter(c->ctx)) {
		for (emu_worker &w : c->workers) {
			if (w.stream) {
				cudaStreamSynchronize(w.stream);	// a stop mid-batch
				cudaStreamDestroy(w.stream);
			}
			for (emu_batch &b : w.b)
				if (b.done)
					cudaEventDestroy(b.done);
		}
		emu_ctx_leave(c->ctx);
	}
	for (emu_worker &w : c->workers)
		for (emu_batch &b : w.b)
			tt_pinned_free(&b.bounce_mem);
	for (emu_q *q : c->qs) {
		tt_pinned_free(&q->mem);
		delete q;
	}
	tt_pinned_free(&c->bar_mem);
	for (i = 0; i < TT_EMU_MAX_NS; i++) {
		if (c->ns_mem[i])
			cudaFreeHost(c->ns_mem[i]);
		if (c->ns_map[i]) {
			cudaHostUnregister(c->ns_map[i]);
			munmap(c->ns_map[i], c->ns_map_len[i]);
		}
	}
	if (c->ctx)
		emu_drv.CtxDestroy(c->ctx);
	delete c;
}

// Pinned host memory the GPU can address (m->dev), in every context,
// starting on a page (pinned.cuh: PRP lists must); zeroed when @zero
// (rings, doorbells: a CQ's phase tags start at 0).
static int emu_host_alloc(struct tt_pinned *m, size_t bytes, bool zero)
{
	int rc = tt_pinned_alloc(m, bytes, cudaHostAllocMapped | cudaHostAllocPortable);

	if (!rc && zero)
		std::memset(m->host, 0, bytes);
	return rc;
}

// TT_EMU_FILE: map namespace @i's file and pin it, so its commands skip
// pread/pwrite. Return: NULL when mapped, else why not (it then takes the
// bounce path, as it always could).
//
// Only on tmpfs, where the page cache is the file:
// - A GPU write is a DMA into a pinned page; no CPU store marks the page
//   dirty. On a disk filesystem, once writeback cleaned the page, later
//   DMA writes stay clean to the kernel: fdatasync and O_DIRECT reads miss
//   them. On tmpfs nothing is written back: the data is in the file once
//   the copy landed (before the CQE), which is all fdatasync promises
//   there, so the store's flush ordering holds for writes through the map.
// - The members are O_DIRECT: on a disk filesystem an O_DIRECT write (ours
//   for writes on the bounce path, or the store's engine) drops the page
//   cache pages of its range, and the pinned pages we copy from go stale.
//   tmpfs serves O_DIRECT from the same pages, and pinned shmem pages are
//   neither reclaimed nor migrated; only truncate or hole punching would
//   part them from the file, which the store does not do while open.
// Pinning faults in every page of the range: holes of a sparse file get
// allocated, so require room for them on the tmpfs, or the registration
// would fail halfway with the file grown.
static const char *emu_map_ns(struct tt_emu *c, unsigned i, double *secs)
{
	const char *env = std::getenv("TUTTI_EMU_FILE_MAP");
	uint64_t ns = c->p.ns_bytes, have, room;
	size_t len = (size_t)((ns + EMU_PAGE - 1) / EMU_PAGE * EMU_PAGE);
	int fd = c->fds[i], fl = fcntl(fd, F_GETFL);
	unsigned flags = cudaHostRegisterPortable | cudaHostRegisterMapped;
	struct statfs sf;
	struct stat st;
	cudaError_t r;
	bool wr;
	void *m;

	if (env && !std::strcmp(env, "0"))
		return "TUTTI_EMU_FILE_MAP=0";
	if (fl < 0 || fstat(fd, &st) || fstatfs(fd, &sf))
		return "fcntl/fstat/fstatfs failed";
	if (!S_ISREG(st.st_mode) || sf.f_type != EMU_TMPFS_MAGIC)
		return "not a file on tmpfs";
	if ((uint64_t)st.st_size < ns || ns == 0)
		return "file smaller than the namespace";	// never grow it
	have = (uint64_t)st.st_blocks * 512;
	room = (uint64_t)sf.f_bavail * (uint64_t)sf.f_bsize;
	if (have < ns && ns - have > room)
		return "no room on the tmpfs to fill the file's holes";
	wr = (fl & O_ACCMODE) == O_RDWR;
	if (!wr)	// a read-only store: map for reads, writes fail on pwrite
		flags |= cudaHostRegisterReadOnly;
	m = mmap(nullptr, len, PROT_READ | (wr ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return "mmap failed";
	auto t0 = std::chrono::steady_clock::now();
	r = cudaHostRegister(m, len, flags);
	*secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
	if (r == cudaSuccess) {
		r = cudaHostGetDevicePointer((void **)&c->ns_map_dev[i], m, 0);
		if (r != cudaSuccess)
			cudaHostUnregister(m);
	}
	if (r != cudaSuccess) {
		cudaGetLastError();
		munmap(m, len);
		return cudaGetErrorString(r);
	}
	c->ns_map[i] = (char *)m;
	c->ns_map_len[i] = len;
	c->ns_map_wr[i] = wr;
	return nullptr;
}

extern "C" int tt_emu_open(const struct tt_emu_params *p, struct tt_emu **out)
{
	const char *mode = std::getenv("TUTTI_EMU_COPY");
	const char *map = std::getenv("TUTTI_EMU_FILE_MAP");
	const char *dma = std::getenv("TUTTI_EMU_DMA");
	struct tt_emu *c;
	size_t bar_bytes;
	unsigned i;
	int rc, copy;

	*out = nullptr;
	if (!mode || !std::strcmp(mode, "batch"))
		copy = EMU_COPY_BATCH;
	else if (!std::strcmp(mode, "each"))
		copy = EMU_COPY_EACH;
	else if (!std::strcmp(mode, "sync"))
		copy = EMU_COPY_SYNC;
	else
		return -EINVAL;	// a typo must not measure the wrong path
	if (map && std::strcmp(map, "0") && std::strcmp(map, "1"))
		return -EINVAL;
	if (dma && std::strcmp(dma, "kernel") && std::strcmp(dma, "copy"))
		return -EINVAL;
	if (!p || p->n_queues == 0 || p->n_queues > 1024 || p->depth < 2 ||
	    p->depth > 65536 || p->n_threads == 0 || p->n_ns == 0 ||
	    p->n_ns > TT_EMU_MAX_NS || (p->lba_shift != 9 && p->lba_shift != 12) ||
	    (p->ns_bytes & ((1u << p->lba_shift) - 1)) ||
	    (p->backing == TT_EMU_FILE && !p->fds) ||
	    p->backing < TT_EMU_NULL || p->backing > TT_EMU_FILE)
		return -EINVAL;
	c = new (std::nothrow) tt_emu();
	if (!c)
		return -ENOMEM;
	c->p = *p;
	// The caller's fd array may be gone once we return (the files stay its).
	if (p->backing == TT_EMU_FILE) {
		c->fds.assign(p->fds, p->fds + p->n_ns);
		c->p.fds = c->fds.data();
	}
	c->stop.store(false);
	c->mode.store(EMU_RUN);
	c->busy.store(0);
	c->thread_err.store(0);
	c->cmds = c->errors = c->bytes = c->sq_wraps = c->cq_wraps = c->doorbells = 0;
	c->next_free_ns = 0;
	c->copy.store(copy);
	c->dma = dma && !std::strcmp(dma, "copy") ? EMU_DMA_COPY : EMU_DMA_KERNEL;
	{
		const char *to = std::getenv("TUTTI_GIO_WAIT_TIMEOUT_S");

		c->diag = (to && std::strtod(to, nullptr) > 0) || std::getenv("TUTTI_GIO_DEBUG") ||
			  std::getenv("TUTTI_EMU_DEBUG");
	}
	{
		const char *pn = std::getenv("TUTTI_EMU_POLL_NS");
		const char *sl = std::getenv("TUTTI_EMU_IDLE_SLEEP_US");

		c->poll_ns = pn ? std::strtoull(pn, nullptr, 10) : EMU_POLL_NS;
		c->idle_sleep_us = sl ? (unsigned)std::strtoul(sl, nullptr, 10) : EMU_IDLE_SLEEP_US;
		if (c->idle_sleep_us > 10000)
			c->idle_sleep_us = 10000;
	}
	std::memset(c->ns_mem, 0, sizeof(c->ns_mem));
	std::memset(c->ns_mem_dev, 0, sizeof(c->ns_mem_dev));
	std::memset(c->ns_map_dev, 0, sizeof(c->ns_map_dev));
	std::memset(c->ns_map, 0, sizeof(c->ns_map));
	std::memset(c->ns_map_len, 0, sizeof(c->ns_map_len));
	std::memset(c->ns_map_wr, 0, sizeof(c->ns_map_wr));
	c->bar = nullptr;
	c->ctx = nullptr;
	if (cudaGetDevice(&c->device) != cudaSuccess) {
		delete c;
		return -ENODEV;
	}
	// Only the copy engines need a context of the controller's own.
	rc = c->dma == EMU_DMA_COPY ? emu_ctx_create(c->device, &c->ctx) : 0;
	if (rc) {
		delete c;
		return rc;
	}
	bar_bytes = tt_nvme_db_offset((uint16_t)p->n_queues, true, 0) + 4;
	bar_bytes = (bar_bytes + EMU_PAGE - 1) / EMU_PAGE * EMU_PAGE;
	rc = emu_host_alloc(&c->bar_mem, bar_bytes, true);
	c->bar = c->bar_mem.host;
	c->bar_dev = c->bar_mem.dev;
	if (p->backing == TT_EMU_HOSTMEM)
		for (i = 0; i < p->n_ns && !rc; i++)
			if (cudaHostAlloc(&c->ns_mem[i], p->ns_bytes,
					  cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess ||
			    cudaHostGetDevicePointer((void **)&c->ns_mem_dev[i], c->ns_mem[i], 0) !=
				    cudaSuccess)
				rc = -ENOMEM;
	if (p->backing == TT_EMU_FILE && !rc) {
		bool dbg = std::getenv("TUTTI_EMU_DEBUG") != nullptr;

		for (i = 0; i < p->n_ns; i++) {
			double secs = 0;
			const char *why = emu_map_ns(c, i, &secs);

			if (!dbg)
				continue;
			if (why)
				std::fprintf(stderr, "tutti emu_ctrl: ns %u: pread/pwrite (%s)\n",
					     i + 1, why);
			else
				std::fprintf(stderr, "tutti emu_ctrl: ns %u: mapped, %s, "
					     "%.2f GiB registered in %.3f s\n", i + 1,
					     c->ns_map_wr[i] ? "reads+writes" : "reads only",
					     (double)c->ns_map_len[i] / (1 << 30), secs);
		}
	}
	c->qmem.resize(p->n_queues);
	for (i = 0; i < p->n_queues && !rc; i++) {
		emu_q *q = new (std::nothrow) emu_q();
		size_t sq_b = (size_t)p->depth * 64, cq_b = (size_t)p->depth * 16;
		size_t cq_off = (sq_b + EMU_PAGE - 1) / EMU_PAGE * EMU_PAGE;
		size_t l_off = cq_off + (cq_b + EMU_PAGE - 1) / EMU_PAGE * EMU_PAGE;
		size_t l_b = (size_t)p->depth * p->list_chunks * EMU_PAGE;
		// EMU_DMA_KERNEL: the count (a cache line of its own), then the ring.
		size_t d_off = l_off + l_b;
		size_t d_b = c->dma == EMU_DMA_KERNEL ?
			64 + (size_t)EMU_DMA_ENTRIES * sizeof(struct tt_gio_dma_desc) : 0;
		char *host, *dev;
		struct tt_gio_qmem *m = &c->qmem[i];
		uint16_t qid = (uint16_t)(i + 1);

		if (!q) {
			rc = -ENOMEM;
			break;
		}
		c->qs.push_back(q);
		rc = emu_host_alloc(&q->mem, d_off + d_b, true);
		if (rc)
			break;
		host = q->mem.host;
		dev = q->mem.dev;
		q->qid = qid;
		q->depth = p->depth;
		q->sq = (struct tt_nvme_sqe *)host;
		q->cq = (struct tt_nvme_cqe *)(host + cq_off);
		q->sq_db = (const volatile uint32_t *)(c->bar + tt_nvme_db_offset(qid, false, 0));
		q->cq_db = (const volatile uint32_t *)(c->bar + tt_nvme_db_offset(qid, true, 0));
		q->list = l_b ? host + l_off : nullptr;
		q->list_bytes = l_b;
		q->phase = 1;
		q->cmds = 0;
		m->qid = qid;
		m->depth = p->depth;
		m->sq = (struct tt_nvme_sqe *)dev;
		m->cq = (volatile struct tt_nvme_cqe *)(dev + cq_off);
		m->sq_db = (volatile uint32_t *)(c->bar_dev + tt_nvme_db_offset(qid, false, 0));
		m->cq_db = (volatile uint32_t *)(c->bar_dev + tt_nvme_db_offset(qid, true, 0));
		m->list = l_b ? dev + l_off : nullptr;
		m->list_bus = l_b ? (uint64_t)(uintptr_t)(host + l_off) : 0;
		m->list_chunks = p->list_chunks;
		m->chunk_bytes = EMU_PAGE;
		m->dma = nullptr;
		if (d_b) {
			q->ring.posted = (volatile uint64_t *)(host + d_off);
			q->ring.desc = (struct tt_gio_dma_desc *)(host + d_off + 64);
			q->ring.entries = EMU_DMA_ENTRIES;
			q->dma.posted = (volatile uint64_t *)(dev + d_off);
			q->dma.desc = (struct tt_gio_dma_desc *)(dev + d_off + 64);
			q->dma.entries = EMU_DMA_ENTRIES;
			m->dma = &q->dma;
		}
	}
	if (!rc) {
		c->workers.resize(p->n_threads);
		for (emu_worker &w : c->workers)
			if (!rc)
				rc = emu_worker_alloc(c, w);
	}
	if (!rc && c->dma == EMU_DMA_COPY) {
		if (emu_ctx_enter(c->ctx)) {	// streams and events in its context
			for (emu_worker &w : c->workers)
				if (!rc)
					rc = emu_worker_init(w);
			emu_ctx_leave(c->ctx);
		} else {
			rc = -EIO;
		}
	}
	if (rc) {
		tt_emu_close(c);
		return rc;
	}
	for (i = 0; i < p->n_threads; i++)
		c->threads.emplace_back(emu_thread, c, i);
	*out = c;
	return 0;
}

extern "C" const struct tt_gio_qmem *tt_emu_qmem(const struct tt_emu *c)
{
	return c->qmem.data();
}

extern "C" void tt_emu_caps(const struct tt_emu *c, struct tt_nvme_xfer_caps *caps)
{
	caps->page_size = EMU_PAGE;
	caps->mdts_bytes = c->p.mdts_bytes;
	caps->sgls = c->p.sgls;
	caps->sgl_threshold = 0;
}

extern "C" void *tt_emu_ns_data(const struct tt_emu *c, uint32_t nsid)
{
	if (nsid == 0 || nsid > c->p.n_ns)
		return nullptr;
	return c->ns_mem[nsid - 1];
}

extern "C" int tt_emu_ns_mapped(const struct tt_emu *c, unsigned nsid)
{
	if (c->p.backing != TT_EMU_FILE || nsid == 0 || nsid > c->p.n_ns ||
	    !c->ns_map[nsid - 1])
		return 0;
	return c->ns_map_wr[nsid - 1] ? 3 : 1;
}

extern "C" void tt_emu_get_stats(const struct tt_emu *c, struct tt_emu_stats *st)
{
	st->cmds = c->cmds.load();
	st->errors = c->errors.load();
	st->bytes = c->bytes.load();
	st->sq_wraps = c->sq_wraps.load();
	st->cq_wraps = c->cq_wraps.load();
	st->doorbells = c->doorbells.load();
}

extern "C" uint64_t tt_emu_queue_cmds(const struct tt_emu *c, unsigned q)
{
	return q < c->qs.size() ? c->qs[q]->cmds.load() : 0;
}

extern "C" unsigned tt_emu_n_streams(const struct tt_emu *c)
{
	unsigned n = 0;

	if (c)
		for (const emu_worker &w : c->workers)
			n += w.stream != nullptr;
	return n;
}

#include "emu_dump.cuh"
