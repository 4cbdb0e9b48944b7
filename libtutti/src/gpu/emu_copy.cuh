// SPDX-License-Identifier: Apache-2.0
//
// emu_copy.cuh - moving a batch's data: batched or per-extent copies, bounce for files, the rate cap
// Included once, by emu_ctrl.cu (one translation unit, so everything stays
// static); split out to keep each part readable on its own.
#ifndef TT_EMU_COPY_CUH
#define TT_EMU_COPY_CUH

// ---- EMU_DMA_KERNEL: the GPU's polling warps move the data (gio_dma_round)

// Publish what is left of @b's copies, as far as the ring has room.
// Return: true once every copy is published.
static bool emu_dma_post(emu_batch &b)
{
	return emu_ring_post(&b.q->ring, &b.dma, b.dst.data(), b.src.data(), b.len.data(),
			     b.len.size(), b.n_rd, EMU_DMA_CHUNK);
}

// Whether all of @b's data landed (publishing the rest first).
static bool emu_dma_landed(emu_batch &b)
{
	return emu_ring_landed(&b.q->ring, &b.dma, b.dst.data(), b.src.data(), b.len.data(),
			       b.len.size(), b.n_rd, EMU_DMA_CHUNK);
}

// Move @len bytes through @q's ring and wait until they landed (the rare
// oversized file command). Return: false when stopping.
static bool emu_dma_sync(struct tt_emu *e, emu_q *q, uint64_t dst, uint64_t src, uint64_t len,
			 uint32_t flags)
{
	struct emu_ring *r = &q->ring;
	uint64_t off = 0;

	while (off < len) {
		uint32_t n = len - off < EMU_DMA_CHUNK ? (uint32_t)(len - off) : EMU_DMA_CHUNK;

		if (emu_ring_put(r, dst + off, src + off, n, flags)) {
			off += n;
			continue;
		}
		emu_ring_publish(r);
		if (e->stop.load(std::memory_order_relaxed))
			return false;
		emu_relax();
	}
	emu_ring_publish(r);
	for (;;) {
		emu_ring_retire(r);
		if (r->tail == r->head)
			return true;
		if (e->stop.load(std::memory_order_relaxed))
			return false;
		emu_relax();
	}
}

// ---- EMU_DMA_COPY: the copy engines, from the controller's context

#if CUDART_VERSION >= 12080
// Copy attributes for one direction. Stream order for the source: a
// reused bounce buffer must not be read before the batch that filled it.
// The location hints only matter for managed or pageable memory, but they
// say what the copies are (pinned host <-> HBM), and overlap with compute
// is what a controller's DMA should do.
static struct cudaMemcpyAttributes emu_attr(int device, bool to_gpu)
{
	struct cudaMemcpyAttributes a;

	std::memset(&a, 0, sizeof(a));
	a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
	a.srcLocHint.type = to_gpu ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
	a.srcLocHint.id = to_gpu ? 0 : device;
	a.dstLocHint.type = to_gpu ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
	a.dstLocHint.id = to_gpu ? device : 0;
	a.flags = cudaMemcpyFlagPreferOverlapWithCompute;
	return a;
}
#endif

// All of @b's copies in one call; the first b.n_rd go to the GPU.
static cudaError_t emu_copy_batch(const struct tt_emu *e, emu_batch &b)
{
#if CUDART_VERSION >= 12080
	struct cudaMemcpyAttributes a[2];
	size_t idx[2], na = 0, n = b.len.size(), n_rd = b.n_rd;

	if (n_rd) {
		a[na] = emu_attr(e->device, true);
		idx[na++] = 0;
	}
	if (n_rd < n) {
		a[na] = emu_attr(e->device, false);
		idx[na++] = n_rd;
	}
#if CUDART_VERSION >= 13000
	return cudaMemcpyBatchAsync(b.dst.data(), b.src.data(), b.len.data(), n, a, idx, na,
				    b.stream);
#else
	size_t fail = 0;	// 12.8/12.9: which copy failed; we retry per extent anyway

	return cudaMemcpyBatchAsync(b.dst.data(), b.src.data(), b.len.data(), n, a, idx, na,
				    &fail, b.stream);
#endif
#else
	(void)e;
	(void)b;
	return cudaErrorNotSupported;
#endif
}

// One cudaMemcpyAsync per extent; a failed copy fails its command alone.
// Return: commands failed.
static unsigned emu_copy_each(emu_batch &b)
{
	unsigned bad = 0;

	for (emu_cmd &c : b.cmds) {
		char *h = c.host;

		if (!c.moving)
			continue;
		for (uint32_t i = 0; i < c.ext_n; i++) {
			const emu_ext &x = b.ext[c.ext_first + i];
			void *gpu = (void *)(uintptr_t)x.addr;
			cudaError_t r = c.opcode == TT_NVME_CMD_READ ?
				cudaMemcpyAsync(gpu, h, x.len, cudaMemcpyDefault, b.stream) :
				cudaMemcpyAsync(h, gpu, x.len, cudaMemcpyDefault, b.stream);

			if (r != cudaSuccess) {
				cudaGetLastError();
				c.status = TT_NVME_SC_DATA_XFER_ERROR;
				c.moving = false;
				bad++;
				break;
			}
			h += x.len;
		}
	}
	return bad;
}

// Append the copies of @b's moving @op commands, merging a copy into the
// previous one when both ends continue it (one DMA descriptor, not two).
// @dev: the host end as the GPU addresses it (EMU_DMA_KERNEL).
static void emu_add_copies(emu_batch &b, uint8_t op, bool dev)
{
	size_t first = b.len.size();

	for (const emu_cmd &c : b.cmds) {
		char *h = dev ? c.dev : c.host;

		if (!c.moving || c.opcode != op)
			continue;
		for (uint32_t i = 0; i < c.ext_n; i++) {
			const emu_ext &x = b.ext[c.ext_first + i];
			char *gpu = (char *)(uintptr_t)x.addr;
			char *d = op == TT_NVME_CMD_READ ? gpu : h;
			char *s = op == TT_NVME_CMD_READ ? h : gpu;
			size_t k = b.len.size();

			if (k > first && (char *)b.dst[k - 1] + b.len[k - 1] == d &&
			    (char *)b.src[k - 1] + b.len[k - 1] == s) {
				b.len[k - 1] += x.len;
			} else {
				b.dst.push_back(d);
				b.src.push_back(s);
				b.len.push_back(x.len);
			}
			h += x.len;
		}
	}
}

static void emu_fail_moving(emu_batch &b)
{
	for (emu_cmd &c : b.cmds)
		if (c.moving) {
			c.status = TT_NVME_SC_DATA_XFER_ERROR;
			c.moving = false;
		}
}

// A file command larger than the bounce buffer: chunk by chunk, waiting for
// each. Rare (only with a large or no MDTS), so kept simple.
static uint16_t emu_data_chunked(struct tt_emu *e, emu_batch &b, const emu_cmd &c)
{
	int fd = e->p.fds[c.nsid - 1];
	uint64_t done = 0, chunk, in_ext = 0;
	uint32_t i = 0;
	bool kernel = e->dma == EMU_DMA_KERNEL;

	while (done < c.bytes) {
		chunk = c.bytes - done < EMU_SLOT_BOUNCE ? c.bytes - done : EMU_SLOT_BOUNCE;
		if (c.opcode == TT_NVME_CMD_READ &&
		    pread(fd, b.bounce, chunk, (off_t)(c.off + done)) != (ssize_t)chunk)
			return TT_NVME_SC_READ_ERROR;
		// Copy the chunk between the bounce buffer and the extents.
		for (uint64_t o = 0; o < chunk;) {
			const emu_ext &x = b.ext[c.ext_first + i];
			uint64_t n = x.len - in_ext < chunk - o ? x.len - in_ext : chunk - o;
			void *gpu = (void *)(uintptr_t)(x.addr + in_ext);
			uint64_t hd = (uint64_t)(uintptr_t)(b.bounce_dev + o);
			bool rd = c.opcode == TT_NVME_CMD_READ;

			if (kernel) {
				if (!emu_dma_sync(e, b.q, rd ? x.addr + in_ext : hd,
						  rd ? hd : x.addr + in_ext, n,
						  rd ? TT_GIO_DMA_SRC_HOST : 0))
					return TT_NVME_SC_DATA_XFER_ERROR;
			} else if ((rd ? cudaMemcpyAsync(gpu, b.bounce + o, n, cudaMemcpyDefault,
							 b.stream) :
					 cudaMemcpyAsync(b.bounce + o, gpu, n, cudaMemcpyDefault,
							 b.stream)) != cudaSuccess) {
				cudaGetLastError();
				return TT_NVME_SC_DATA_XFER_ERROR;
			}
			o += n;
			in_ext += n;
			if (in_ext == x.len) {
				i++;
				in_ext = 0;
			}
		}
		if (!kernel && cudaStreamSynchronize(b.stream) != cudaSuccess) {
			cudaGetLastError();
			return TT_NVME_SC_DATA_XFER_ERROR;
		}
		if (c.opcode == TT_NVME_CMD_WRITE &&
		    pwrite(fd, b.bounce, chunk, (off_t)(c.off + done)) != (ssize_t)chunk)
			return TT_NVME_SC_WRITE_FAULT;
		done += chunk;
	}
	return TT_NVME_SC_SUCCESS;
}

// Reserve @bytes on the shared token clock of the bandwidth cap. Return:
// when the batch may complete, 0 for now. Reserved when the copies are
// issued, so the DMA runs while the clock runs, and batches queued ahead
// keep the clock busy: the rate holds at the cap.
static uint64_t emu_reserve(struct tt_emu *e, uint64_t bytes)
{
	uint64_t now, start, cost, cur;

	if (e->p.rate_gbps <= 0 || bytes == 0)
		return 0;
	cost = (uint64_t)((double)bytes / e->p.rate_gbps); // ns at rate GB/s
	now = emu_now_ns();
	cur = e->next_free_ns.load(std::memory_order_relaxed);
	do {
		start = cur > now ? cur : now;
	} while (!e->next_free_ns.compare_exchange_weak(cur, start + cost));
	return start + cost;
}

// The data of @b landed: file writes go out of the bounce buffer now.
static void emu_landed(struct tt_emu *e, emu_batch &b)
{
	if (e->p.backing != TT_EMU_FILE)
		return;
	for (emu_cmd &c : b.cmds)
		if (c.moving && !c.direct && c.opcode == TT_NVME_CMD_WRITE &&
		    pwrite(e->p.fds[c.nsid - 1], c.host, c.bytes, (off_t)c.off) !=
			    (ssize_t)c.bytes)
			c.status = TT_NVME_SC_WRITE_FAULT;
}

// Start moving @b's data: file reads into the bounce buffer, then every
// copy, then the event that says they landed.
static void emu_issue(struct tt_emu *e, emu_batch &b)
{
	int mode = e->copy.load(std::memory_order_relaxed);
	uint64_t bytes = 0;

	b.pending = false;
	b.deadline_ns = 0;
	b.dst.clear();
	b.src.clear();
	b.len.clear();
	if (e->p.backing == TT_EMU_NULL)
		return;
	for (emu_cmd &c : b.cmds) {
		if (c.status != TT_NVME_SC_SUCCESS || c.bytes == 0)
			continue;
		if (!c.host)
			c.status = emu_data_chunked(e, b, c);
		else if (!c.direct && c.opcode == TT_NVME_CMD_READ &&
			 pread(e->p.fds[c.nsid - 1], c.host, c.bytes, (off_t)c.off) !=
				 (ssize_t)c.bytes)
			c.status = TT_NVME_SC_READ_ERROR;
		else
			c.moving = true;
		if (c.status == TT_NVME_SC_SUCCESS)
			bytes += c.bytes;
	}
	emu_add_copies(b, TT_NVME_CMD_READ, e->dma == EMU_DMA_KERNEL);
	b.n_rd = b.len.size();
	emu_add_copies(b, TT_NVME_CMD_WRITE, e->dma == EMU_DMA_KERNEL);
	if (!b.len.empty() && e->dma == EMU_DMA_KERNEL) {
		emu_ring_begin(&b.q->ring, &b.dma);
		b.pending = true;
		emu_dma_post(b);
	} else if (!b.len.empty()) {
		cudaError_t r = cudaSuccess;

		if (mode == EMU_COPY_BATCH)
			r = emu_copy_batch(e, b);
		if (mode != EMU_COPY_BATCH) {
			emu_copy_each(b);
		} else if (r != cudaSuccess) {
			cudaGetLastError();
			// Per extent, a bad address fails its command alone. If
			// that moves everything, the batch API cannot do here
			// what cudaMemcpyAsync can (old driver): stop using it.
			if (emu_copy_each(b) == 0 &&
			    e->copy.exchange(EMU_COPY_EACH) == EMU_COPY_BATCH)
				std::fprintf(stderr, "tutti emu_ctrl: cudaMemcpyBatchAsync: %s; "
					     "copying per extent\n", cudaGetErrorString(r));
		}
		if (mode == EMU_COPY_SYNC) {
			if (cudaStreamSynchronize(b.stream) != cudaSuccess) {
				cudaGetLastError();
				emu_fail_moving(b);
			}
		} else if (cudaEventRecord(b.done, b.stream) != cudaSuccess) {
			cudaGetLastError();
			cudaStreamSynchronize(b.stream);	// the bounce is reused next
			emu_fail_moving(b);
		} else {
			b.pending = true;
		}
	}
	if (!b.pending)
		emu_landed(e, b);
	b.deadline_ns = emu_reserve(e, bytes);
}

#endif /* TT_EMU_COPY_CUH */
