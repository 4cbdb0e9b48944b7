// SPDX-License-Identifier: Apache-2.0
//
// emu_impl.cuh - the emulated controller's state: queues, commands, batches, workers
// Included once, by emu_ctrl.cu (one translation unit, so everything stays
// static); split out to keep each part readable on its own.
#ifndef TT_EMU_IMPL_CUH
#define TT_EMU_IMPL_CUH

#define EMU_PAGE 4096u
#define EMU_MAX_FETCH 256u	// SQEs fetched into one batch
#define EMU_MAX_SGL_SEGS 64u	// SGL segments followed per command
#define EMU_INFLIGHT 4u		// batches in flight per thread
#define EMU_SLOT_BOUNCE (4u << 20)	// file mode bounce buffer per batch
// The application's launching thread shares the CUDA driver and the CPU with
// these threads: an event query every 2 us and idle threads that only
// yield made a 2K-token prefill's launches 1.5x slower on the H200
// (docs/benchmarks.md, "Saving on the GPU"). A real controller takes none.
#define EMU_POLL_NS 20000u	// least time between two event queries
#define EMU_IDLE_SLEEP_US 50u	// an idle thread's sleep (0: sched_yield)
#define EMU_TMPFS_MAGIC 0x01021994	// TMPFS_MAGIC, linux/magic.h
// Data moves the GPU does for us (EMU_DMA_KERNEL): ring entries per queue
// and the largest move in one descriptor, so several warps share a long
// extent.
#define EMU_DMA_ENTRIES 4096u
#define EMU_DMA_CHUNK (64u << 10)

// Who moves a command's data between GPU memory and the host:
// EMU_DMA_KERNEL: the gio kernels polling the queue (tt_gio_qmem.dma), so
//   the controller's threads make no CUDA call at all and no GPU queue can
//   hold its data up (the copy-engine mode stalled: docs/gpu.md);
// EMU_DMA_COPY: the copy engines, from the controller's own CUDA context
//   (emu_ctx.cuh), in one of the emu_copy_mode ways.
enum emu_dma_mode { EMU_DMA_KERNEL, EMU_DMA_COPY };
enum emu_copy_mode { EMU_COPY_BATCH, EMU_COPY_EACH, EMU_COPY_SYNC };

// tt_emu_pause(), tt_emu_abort().
enum emu_mode { EMU_RUN, EMU_PAUSED, EMU_ABORTING };

// Where a controller thread is (tt_emu_dump(); kept only with e->diag).
enum emu_where { EMU_AT_START, EMU_AT_LOOP, EMU_AT_QUERY, EMU_AT_ISSUE, EMU_AT_POST, EMU_AT_EXITED };

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
	struct tt_pinned mem;		// rings, lists, data moves
	// EMU_DMA_KERNEL: the ring of data moves (emu_dma_ring.h; its
	// desc is NULL otherwise) and what the GPU is told of it.
	struct emu_ring ring;
	struct tt_gio_dma dma;
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
	char *dev;			// @host as the GPU addresses it
};

// What one fetch took from one queue, from fetch until its CQEs are posted.
struct emu_batch {
	emu_q *q = nullptr;
	std::vector<emu_cmd> cmds;
	std::vector<emu_ext> ext;
	std::vector<void *> dst, src;	// the copies, reads (to the GPU) first
	std::vector<size_t> len;
	cudaStream_t stream = nullptr;	// its thread's stream (emu_worker::stream)
	cudaEvent_t done = nullptr;
	struct tt_pinned bounce_mem = {};
	char *bounce = nullptr;		// TT_EMU_FILE: EMU_SLOT_BOUNCE bytes
	char *bounce_dev = nullptr;	// the GPU's address of it
	size_t n_rd = 0;		// copies to the GPU, first in dst/src/len
	// EMU_DMA_KERNEL: how far its copies are published on the ring.
	struct emu_ring_cursor dma = {};
	bool pending = false;		// done recorded, not yet seen complete
	uint64_t deadline_ns = 0;	// bandwidth cap: post no earlier
	uint64_t issued_ns = 0;		// e->diag: when it was fetched
};

// A controller thread's batches, a FIFO so CQEs go out in fetch order.
struct emu_worker {
	emu_batch b[EMU_INFLIGHT];
	// One stream for all its batches, in the controller's context
	// (emu_ctx.cuh); batches still overlap the thread's fetching, and the
	// threads' streams the copy engines.
	cudaStream_t stream = nullptr;
	unsigned head = 0, n = 0;
	unsigned rr = 0;		// queue to look at first next round
	uint64_t next_poll_ns = 0;
	// e->diag only, read by tt_emu_dump() (__atomic, relaxed):
	int where = EMU_AT_START;	// enum emu_where
	uint64_t beat_ns = 0;		// when it last got there
};

}  // namespace

struct tt_emu {
	struct tt_emu_params p;
	std::vector<int> fds;		// TT_EMU_FILE: our copy of p.fds
	int device;
	CUcontext ctx;			// the controller's own (emu_ctx.cuh)
	std::vector<emu_q *> qs;
	std::vector<struct tt_gio_qmem> qmem;
	struct tt_pinned bar_mem;
	char *bar;			// emulated BAR0 (doorbells), host view
	char *bar_dev;
	char *ns_mem[TT_EMU_MAX_NS];
	char *ns_mem_dev[TT_EMU_MAX_NS];	// the GPU's addresses of them
	// TT_EMU_FILE on tmpfs: the file mapped and registered, or NULL;
	// ns_map_wr: writes go through it too (the fd is open for writing).
	char *ns_map[TT_EMU_MAX_NS];
	size_t ns_map_len[TT_EMU_MAX_NS];
	bool ns_map_wr[TT_EMU_MAX_NS];
	char *ns_map_dev[TT_EMU_MAX_NS];
	int dma;			// enum emu_dma_mode (TUTTI_EMU_DMA)
	std::vector<std::thread> threads;
	std::atomic<bool> stop;
	std::atomic<int> thread_err;
	std::atomic<uint64_t> cmds, errors, bytes, sq_wraps, cq_wraps, doorbells;
	std::atomic<uint64_t> next_free_ns;	// bandwidth cap: token time
	std::atomic<int> copy;			// enum emu_copy_mode
	std::atomic<int> mode;			// enum emu_mode
	std::atomic<unsigned> busy;		// batches fetched, CQEs not posted
	std::vector<emu_worker> workers;	// one per thread, made at open
	// TUTTI_GIO_WAIT_TIMEOUT_S, TUTTI_GIO_DEBUG or TUTTI_EMU_DEBUG set at
	// open: the threads note where they are and batches their age.
	bool diag;
	// Pacing of the threads (TUTTI_EMU_POLL_NS, TUTTI_EMU_IDLE_SLEEP_US):
	// least time between two queries of a batch's copies, and the sleep
	// of a thread that found nothing to do for a while (0: yield).
	uint64_t poll_ns;
	unsigned idle_sleep_us;
};

static uint64_t emu_now_ns()
{
	return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
		       std::chrono::steady_clock::now().time_since_epoch())
		.count();
}

// e->diag: note that thread @w is at @where, now.
static inline void emu_at(const struct tt_emu *e, emu_worker &w, int where)
{
	if (e->diag) {
		__atomic_store_n(&w.where, where, __ATOMIC_RELAXED);
		__atomic_store_n(&w.beat_ns, emu_now_ns(), __ATOMIC_RELAXED);
	}
}

static inline void emu_relax()
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

#endif /* TT_EMU_IMPL_CUH */
