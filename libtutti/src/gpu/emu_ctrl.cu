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
// Data movement: what one fetch takes from a queue is a batch; all its
// copies go to the copy engines in one cudaMemcpyBatchAsync on the batch's
// own stream, followed by an event. A thread keeps up to EMU_INFLIGHT
// batches in flight and posts their CQEs in fetch order once the event says
// the data landed, so it keeps fetching while the DMA runs. TUTTI_EMU_COPY
// picks the copy path: "batch" (default), "each" (one cudaMemcpyAsync per
// extent) or "sync" (per extent and a stream sync per batch, the original
// path), so one benchmark can compare them.
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

#include <cuda_runtime.h>

#include "tutti/emu_ctrl.h"
#include "tutti/nvme_queue.h"
#include "tutti/nvme_sgl.h"

#define EMU_PAGE 4096u
#define EMU_MAX_FETCH 256u	// SQEs fetched into one batch
#define EMU_MAX_SGL_SEGS 64u	// SGL segments followed per command
#define EMU_INFLIGHT 4u		// batches in flight per thread
#define EMU_SLOT_BOUNCE (4u << 20)	// file mode bounce buffer per batch
#define EMU_POLL_NS 2000u	// least time between two event queries
#define EMU_TMPFS_MAGIC 0x01021994	// TMPFS_MAGIC, linux/magic.h

enum emu_copy_mode { EMU_COPY_BATCH, EMU_COPY_EACH, EMU_COPY_SYNC };

namespace {

struct emu_ext {
	uint64_t addr;	// GPU virtual address
	uint64_t len;
};

struct emu_q {
	uint16_t qid;
	uint32_t depth;
	struct tt_nvme_sqe *sq;		// host view of the rings
	struct tt_nvme_cqe *cq;
	const volatile uint32_t *sq_db;	// host view of the doorbells
	const volatile uint32_t *cq_db;
	char *list;			// host view of list memory
	size_t list_bytes;
	uint32_t sq_head;
	uint32_t cq_tail;
	uint8_t phase;
	uint32_t last_db;
	std::atomic<uint64_t> cmds;
	void *mem;			// the cudaHostAlloc block
};

// One fetched command, between fetch and completion.
struct emu_cmd {
	uint16_t cid;
	uint16_t status;
	uint8_t opcode;
	bool moving;			// its data is in the batch's copies
	uint32_t nsid;
	uint64_t off;			// byte offset in the namespace
	uint64_t bytes;
	uint32_t ext_first;
	uint32_t ext_n;
	bool direct;			// host is namespace memory: no pread/pwrite
	char *host;			// namespace memory or bounce buffer;
					// NULL: file command larger than the bounce
};

// What one fetch took from one queue, from fetch until its CQEs are posted.
struct emu_batch {
	emu_q *q = nullptr;
	std::vector<emu_cmd> cmds;
	std::vector<emu_ext> ext;
	std::vector<void *> dst, src;	// the copies, reads (to the GPU) first
	std::vector<size_t> len;
	cudaStream_t stream = nullptr;	// own stream: batches overlap on the CEs
	cudaEvent_t done = nullptr;
	char *bounce = nullptr;		// TT_EMU_FILE: EMU_SLOT_BOUNCE bytes
	bool pending = false;		// done recorded, not yet seen complete
	uint64_t deadline_ns = 0;	// bandwidth cap: post no earlier
};

// A controller thread's batches, a FIFO so CQEs go out in fetch order.
struct emu_worker {
	emu_batch b[EMU_INFLIGHT];
	unsigned head = 0, n = 0;
	unsigned rr = 0;		// queue to look at first next round
	uint64_t next_poll_ns = 0;
};

}  // namespace

struct tt_emu {
	struct tt_emu_params p;
	std::vector<int> fds;		// TT_EMU_FILE: our copy of p.fds
	int device;
	std::vector<emu_q *> qs;
	std::vector<struct tt_gio_qmem> qmem;
	char *bar;			// emulated BAR0 (doorbells), host view
	char *bar_dev;
	char *ns_mem[TT_EMU_MAX_NS];
	// TT_EMU_FILE on tmpfs: the file mapped and registered, or NULL;
	// ns_map_wr: writes go through it too (the fd is open for writing).
	char *ns_map[TT_EMU_MAX_NS];
	size_t ns_map_len[TT_EMU_MAX_NS];
	bool ns_map_wr[TT_EMU_MAX_NS];
	std::vector<std::thread> threads;
	std::atomic<bool> stop;
	std::atomic<int> thread_err;
	std::atomic<uint64_t> cmds, errors, bytes, sq_wraps, cq_wraps, doorbells;
	std::atomic<uint64_t> next_free_ns;	// bandwidth cap: token time
	std::atomic<int> copy;			// enum emu_copy_mode
	std::vector<emu_worker> workers;	// one per thread, made at open
};

static uint64_t emu_now_ns()
{
	return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
		       std::chrono::steady_clock::now().time_since_epoch())
		.count();
}

static inline void emu_relax()
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static void emu_add_ext(std::vector<emu_ext> &ext, uint32_t first, uint64_t addr,
			uint64_t len)
{
	if (ext.size() > first && ext.back().addr + ext.back().len == addr)
		ext.back().len += len;
	else
		ext.push_back({addr, len});
}

// Host pointer for list memory at bus address @bus, or NULL if outside it.
static const void *emu_list_ptr(const emu_q *q, uint64_t bus, uint64_t len)
{
	uint64_t base = (uint64_t)(uintptr_t)q->list;

	if (!q->list || bus < base || bus + len > base + q->list_bytes || bus + len < bus)
		return nullptr;
	return (const void *)(uintptr_t)bus;
}

// Resolve a PRP data pointer into extents (NVMe 1.4, 4.3).
static uint16_t emu_walk_prp(const emu_q *q, const struct tt_nvme_sqe *s,
			     uint64_t bytes, std::vector<emu_ext> &ext, uint32_t first)
{
	uint64_t prp1 = s->dptr.prp.prp1, prp2 = s->dptr.prp.prp2;
	uint64_t off = prp1 & (EMU_PAGE - 1), len, left;
	const uint64_t *list;
	unsigned epp, i;

	if (off & 3)
		return TT_NVME_SC_PRP_INVALID_OFFSET;
	len = EMU_PAGE - off < bytes ? EMU_PAGE - off : bytes;
	emu_add_ext(ext, first, prp1, len);
	left = bytes - len;
	if (left == 0)
		return TT_NVME_SC_SUCCESS;
	if (left <= EMU_PAGE) {
		if (prp2 & (EMU_PAGE - 1))
			return TT_NVME_SC_PRP_INVALID_OFFSET;
		emu_add_ext(ext, first, prp2, left);
		return TT_NVME_SC_SUCCESS;
	}
	// PRP2 is a list pointer: qword aligned, entries up to the page end.
	if (prp2 & 7)
		return TT_NVME_SC_PRP_INVALID_OFFSET;
	for (;;) {
		epp = (unsigned)((EMU_PAGE - (prp2 & (EMU_PAGE - 1))) / 8);
		list = (const uint64_t *)emu_list_ptr(q, prp2, (uint64_t)epp * 8);
		if (!list)
			return TT_NVME_SC_DATA_XFER_ERROR;
		for (i = 0; i < epp && left; i++) {
			uint64_t e = list[i];

			// Last entry of a full page with more than a page left: a link.
			if (i == epp - 1 && left > EMU_PAGE) {
				if (e & 7)
					return TT_NVME_SC_PRP_INVALID_OFFSET;
				prp2 = e;
				break;
			}
			if (e & (EMU_PAGE - 1))
				return TT_NVME_SC_PRP_INVALID_OFFSET;
			len = left < EMU_PAGE ? left : EMU_PAGE;
			emu_add_ext(ext, first, e, len);
			left -= len;
		}
		if (left == 0)
			return TT_NVME_SC_SUCCESS;
		if (i < epp - 1)
			return TT_NVME_SC_DATA_XFER_ERROR;
	}
}

// Resolve an SGL data pointer into extents (NVMe 1.4, 4.4).
static uint16_t emu_walk_sgl(const emu_q *q, const struct tt_nvme_sqe *s,
			     uint64_t bytes, std::vector<emu_ext> &ext, uint32_t first)
{
	struct tt_nvme_sgl_desc d = s->dptr.sgl;
	const struct tt_nvme_sgl_desc *seg;
	uint64_t total = 0;
	unsigned nsegs = 0, n, i;
	uint8_t type = tt_nvme_sgl_desc_type(&d);

	if ((d.type & 0xf) != TT_NVME_SGL_SUBTYPE_ADDRESS)
		return TT_NVME_SC_SGL_INVALID_TYPE;
	if (type == TT_NVME_SGL_TYPE_DATA_BLOCK) {
		if (d.len != bytes)
			return TT_NVME_SC_SGL_INVALID_DATA;
		emu_add_ext(ext, first, d.addr, d.len);
		return TT_NVME_SC_SUCCESS;
	}
	while (type == TT_NVME_SGL_TYPE_SEGMENT || type == TT_NVME_SGL_TYPE_LAST_SEGMENT) {
		bool last = type == TT_NVME_SGL_TYPE_LAST_SEGMENT;

		if (++nsegs > EMU_MAX_SGL_SEGS || d.len == 0 || (d.len & 15) || (d.addr & 7))
			return TT_NVME_SC_SGL_INVALID_SEG;
		seg = (const struct tt_nvme_sgl_desc *)emu_list_ptr(q, d.addr, d.len);
		if (!seg)
			return TT_NVME_SC_DATA_XFER_ERROR;
		n = d.len / 16;
		type = 0xff;
		for (i = 0; i < n; i++) {
			uint8_t t = tt_nvme_sgl_desc_type(&seg[i]);

			if ((seg[i].type & 0xf) != TT_NVME_SGL_SUBTYPE_ADDRESS)
				return TT_NVME_SC_SGL_INVALID_TYPE;
			if (t == TT_NVME_SGL_TYPE_DATA_BLOCK) {
				total += seg[i].len;
				if (total > bytes)
					return TT_NVME_SC_SGL_INVALID_DATA;
				if (seg[i].len)
					emu_add_ext(ext, first, seg[i].addr, seg[i].len);
			} else if ((t == TT_NVME_SGL_TYPE_SEGMENT ||
				    t == TT_NVME_SGL_TYPE_LAST_SEGMENT) &&
				   !last && i == n - 1) {
				d = seg[i];
				type = t;
			} else {
				return last ? TT_NVME_SC_SGL_INVALID_SEG :
					      TT_NVME_SC_SGL_INVALID_TYPE;
			}
		}
		if (last)
			break;
		if (type == 0xff)	// a Segment must end with a link
			return TT_NVME_SC_SGL_INVALID_SEG;
	}
	if (type != 0xff && type != TT_NVME_SGL_TYPE_LAST_SEGMENT &&
	    type != TT_NVME_SGL_TYPE_SEGMENT)
		return TT_NVME_SC_SGL_INVALID_TYPE;
	return total == bytes ? TT_NVME_SC_SUCCESS : TT_NVME_SC_SGL_INVALID_DATA;
}

// Validate @s and resolve its data; fills @c (status set on error).
static void emu_parse(const struct tt_emu *e, const emu_q *q,
		      const struct tt_nvme_sqe *s, emu_cmd &c,
		      std::vector<emu_ext> &ext)
{
	const struct tt_emu_params *p = &e->p;
	uint64_t slba, nlb;
	uint8_t psdt = s->flags & TT_NVME_FLAG_PSDT_MASK;

	c.cid = s->cid;
	c.opcode = s->opcode;
	c.nsid = s->nsid;
	c.bytes = 0;
	c.off = 0;
	c.ext_first = (uint32_t)ext.size();
	c.ext_n = 0;
	c.status = TT_NVME_SC_SUCCESS;
	if (s->opcode == TT_NVME_CMD_FLUSH)
		return;
	if (s->opcode != TT_NVME_CMD_READ && s->opcode != TT_NVME_CMD_WRITE) {
		c.status = TT_NVME_SC_INVALID_OPCODE;
		return;
	}
	if (s->nsid == 0 || s->nsid > p->n_ns) {
		c.status = TT_NVME_SC_INVALID_NS;
		return;
	}
	slba = s->cdw10 | ((uint64_t)s->cdw11 << 32);
	nlb = (s->cdw12 & 0xffff) + 1;
	if (slba + nlb > (p->ns_bytes >> p->lba_shift)) {
		c.status = TT_NVME_SC_LBA_RANGE;
		return;
	}
	c.off = slba << p->lba_shift;
	c.bytes = nlb << p->lba_shift;
	if (p->mdts_bytes && c.bytes > p->mdts_bytes) {
		c.status = TT_NVME_SC_INVALID_FIELD;
		return;
	}
	if (psdt == TT_NVME_FLAG_PSDT_PRP)
		c.status = emu_walk_prp(q, s, c.bytes, ext, c.ext_first);
	else if (psdt == TT_NVME_FLAG_PSDT_SGL && tt_nvme_sgl_supported(p->sgls))
		c.status = emu_walk_sgl(q, s, c.bytes, ext, c.ext_first);
	else
		c.status = TT_NVME_SC_INVALID_FIELD;
	if (c.status != TT_NVME_SC_SUCCESS)
		ext.resize(c.ext_first);
	c.ext_n = (uint32_t)ext.size() - c.ext_first;
}

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

// All of @b's copies in one call; the first @n_rd go to the GPU.
static cudaError_t emu_copy_batch(const struct tt_emu *e, emu_batch &b, size_t n_rd)
{
#if CUDART_VERSION >= 12080
	struct cudaMemcpyAttributes a[2];
	size_t idx[2], na = 0, n = b.len.size();

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
	(void)n_rd;
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
static void emu_add_copies(emu_batch &b, uint8_t op)
{
	size_t first = b.len.size();

	for (const emu_cmd &c : b.cmds) {
		char *h = c.host;

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
			cudaError_t r = c.opcode == TT_NVME_CMD_READ ?
				cudaMemcpyAsync(gpu, b.bounce + o, n, cudaMemcpyDefault, b.stream) :
				cudaMemcpyAsync(b.bounce + o, gpu, n, cudaMemcpyDefault, b.stream);

			if (r != cudaSuccess) {
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
		if (cudaStreamSynchronize(b.stream) != cudaSuccess) {
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
	size_t n_rd;

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
	emu_add_copies(b, TT_NVME_CMD_READ);
	n_rd = b.len.size();
	emu_add_copies(b, TT_NVME_CMD_WRITE);
	if (!b.len.empty()) {
		cudaError_t r = cudaSuccess;

		if (mode == EMU_COPY_BATCH)
			r = emu_copy_batch(e, b, n_rd);
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
// the bounce (file backing not mapped, or mapped read-only and a write).
static char *emu_ns_direct(const struct tt_emu *e, uint32_t nsid, uint8_t op)
{
	if (e->p.backing == TT_EMU_HOSTMEM)
		return e->ns_mem[nsid - 1];
	if (op == TT_NVME_CMD_READ || e->ns_map_wr[nsid - 1])
		return e->ns_map[nsid - 1];
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
		if (c.status == TT_NVME_SC_SUCCESS && c.bytes && e->p.backing != TT_EMU_NULL) {
			char *m = emu_ns_direct(e, c.nsid, c.opcode);

			if (m) {
				c.host = m + c.off;
				c.direct = true;
			} else if (used + c.bytes <= EMU_SLOT_BOUNCE) {
				c.host = b.bounce + used;
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

// Post @b's CQEs once its data landed and the cap allows.
// Return: 1 posted, 0 not yet, -1 stopping.
static int emu_complete(struct tt_emu *e, emu_worker &w, emu_batch &b)
{
	uint64_t bytes = 0;
	unsigned n = 0;

	if (b.pending) {
		// Rate-limited: the query enters the runtime, which the
		// application's launching thread needs too.
		uint64_t now = emu_now_ns();
		cudaError_t r;

		if (now < w.next_poll_ns)
			return 0;
		w.next_poll_ns = now + EMU_POLL_NS;
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
		got++;
	}
	return got;
}

// The CUDA calls a controller thread makes once running are only these:
// cudaMemcpyBatchAsync / cudaMemcpyAsync and cudaEventRecord on its own
// non-blocking streams, and rate-limited cudaEventQuery (cudaStreamSynchronize
// on such a stream in the "sync" mode and for oversized file commands).
// Streams, events and bounce buffers are made in tt_emu_open(): no
// allocation, no legacy-stream call, nothing that waits for the device,
// while GPU kernels spin on our completions.
static void emu_thread(struct tt_emu *e, unsigned id)
{
	emu_worker &w = e->workers[id];
	std::vector<emu_q *> mine;
	unsigned idle = 0;
	int r;

	for (size_t q = id; q < e->qs.size(); q += e->p.n_threads)
		mine.push_back(e->qs[q]);
	if (cudaSetDevice(e->device) != cudaSuccess) {
		e->thread_err.store(-EIO);
		return;
	}
	while (!e->stop.load(std::memory_order_relaxed)) {
		unsigned got = 0;

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
			sched_yield();
		} else {
			emu_relax();
		}
	}
}

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

static int emu_worker_init(struct tt_emu *e, emu_worker &w)
{
	for (emu_batch &b : w.b) {
		if (cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking) != cudaSuccess ||
		    cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming) != cudaSuccess)
			return -EIO;
		if (emu_need_bounce(e) &&
		    cudaHostAlloc((void **)&b.bounce, EMU_SLOT_BOUNCE, cudaHostAllocDefault) !=
			    cudaSuccess)
			return -ENOMEM;
		b.cmds.reserve(EMU_MAX_FETCH);
		b.ext.reserve(EMU_MAX_FETCH * 4);
		b.dst.reserve(EMU_MAX_FETCH * 4);
		b.src.reserve(EMU_MAX_FETCH * 4);
		b.len.reserve(EMU_MAX_FETCH * 4);
	}
	return 0;
}

extern "C" void tt_emu_close(struct tt_emu *c)
{
	unsigned i;

	if (!c)
		return;
	c->stop.store(true);
	for (std::thread &t : c->threads)
		t.join();
	for (emu_worker &w : c->workers)
		for (emu_batch &b : w.b) {
			if (b.stream) {
				cudaStreamSynchronize(b.stream);	// a stop mid-batch
				cudaStreamDestroy(b.stream);
			}
			if (b.done)
				cudaEventDestroy(b.done);
			if (b.bounce)
				cudaFreeHost(b.bounce);
		}
	for (emu_q *q : c->qs) {
		if (q->mem)
			cudaFreeHost(q->mem);
		delete q;
	}
	if (c->bar)
		cudaFreeHost(c->bar);
	for (i = 0; i < TT_EMU_MAX_NS; i++) {
		if (c->ns_mem[i])
			cudaFreeHost(c->ns_mem[i]);
		if (c->ns_map[i]) {
			cudaHostUnregister(c->ns_map[i]);
			munmap(c->ns_map[i], c->ns_map_len[i]);
		}
	}
	delete c;
}

static int emu_host_alloc(void **host, void **dev, size_t bytes)
{
	if (cudaHostAlloc(host, bytes, cudaHostAllocMapped | cudaHostAllocPortable) !=
	    cudaSuccess)
		return -ENOMEM;
	std::memset(*host, 0, bytes);
	if (cudaHostGetDevicePointer(dev, *host, 0) != cudaSuccess)
		return -EIO;
	return 0;
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
	unsigned flags = cudaHostRegisterPortable;
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
	c->thread_err.store(0);
	c->cmds = c->errors = c->bytes = c->sq_wraps = c->cq_wraps = c->doorbells = 0;
	c->next_free_ns = 0;
	c->copy.store(copy);
	std::memset(c->ns_mem, 0, sizeof(c->ns_mem));
	std::memset(c->ns_map, 0, sizeof(c->ns_map));
	std::memset(c->ns_map_len, 0, sizeof(c->ns_map_len));
	std::memset(c->ns_map_wr, 0, sizeof(c->ns_map_wr));
	c->bar = nullptr;
	if (cudaGetDevice(&c->device) != cudaSuccess) {
		delete c;
		return -ENODEV;
	}
	bar_bytes = tt_nvme_db_offset((uint16_t)p->n_queues, true, 0) + 4;
	bar_bytes = (bar_bytes + EMU_PAGE - 1) / EMU_PAGE * EMU_PAGE;
	rc = emu_host_alloc((void **)&c->bar, (void **)&c->bar_dev, bar_bytes);
	if (p->backing == TT_EMU_HOSTMEM)
		for (i = 0; i < p->n_ns && !rc; i++)
			if (cudaHostAlloc(&c->ns_mem[i], p->ns_bytes, cudaHostAllocPortable) !=
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
		char *host, *dev;
		struct tt_gio_qmem *m = &c->qmem[i];
		uint16_t qid = (uint16_t)(i + 1);

		if (!q) {
			rc = -ENOMEM;
			break;
		}
		c->qs.push_back(q);
		rc = emu_host_alloc(&q->mem, (void **)&dev, l_off + l_b);
		if (rc)
			break;
		host = (char *)q->mem;
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
	}
	if (!rc) {
		c->workers.resize(p->n_threads);
		for (emu_worker &w : c->workers)
			if (!rc)
				rc = emu_worker_init(c, w);
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
