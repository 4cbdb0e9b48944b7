/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/emu_ctrl.h - an emulated NVMe controller for GPU-driven queues
 *
 * Host threads play the controller: they watch the SQ tail doorbells (a
 * host page the GPU writes with tt_mmio_write32(), as it would write a real
 * BAR0), fetch SQEs from the rings in order, resolve PRP and SGL data
 * pointers exactly as a controller must (rejecting what the spec rejects),
 * move the data between GPU memory and a backing store, and post CQEs with
 * the phase tag, honouring the CQ head doorbell. Rings, doorbells and list
 * memory are pinned host memory mapped into the GPU.
 *
 * Bus addresses seen by the emulated controller: data pointers are GPU
 * virtual addresses; list memory is addressed by its host address.
 *
 * Its "DMA" (TUTTI_EMU_DMA, read at open): "kernel" (default) queues each
 * command's data moves on the queue's move ring (tt_gio_qmem.dma) and the
 * gio kernels polling that queue do them, so the controller's threads make
 * no CUDA call and nothing queued on the GPU can hold its data up; "copy"
 * uses the copy engines from a CUDA context of its own (TUTTI_EMU_COPY:
 * batch, each, sync), which stalled now and then (docs/gpu.md).
 *
 * Backing stores:
 *   TT_EMU_NULL     completes at once, no data moved (measures the GPU side)
 *   TT_EMU_HOSTMEM  pinned host memory, one area per namespace
 *   TT_EMU_FILE     one file per namespace (pread/pwrite via a bounce buffer;
 *                   a file on tmpfs is mapped and pinned instead, and served
 *                   like TT_EMU_HOSTMEM, unless TUTTI_EMU_FILE_MAP=0)
 * and an optional bandwidth cap (GB/s over all queues) to behave like an
 * SSD array of a chosen speed.
 */
#ifndef TUTTI_EMU_CTRL_H
#define TUTTI_EMU_CTRL_H

#include <stdint.h>

#include "gio_uring.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

enum tt_emu_backing {
	TT_EMU_NULL = 0,
	TT_EMU_HOSTMEM = 1,
	TT_EMU_FILE = 2,
};

#define TT_EMU_MAX_NS 16u

/**
 * struct tt_emu_params - the emulated controller's shape
 * @n_queues: I/O queue pairs (qid 1..n_queues)
 * @depth: ring entries, 2 to 65536
 * @n_threads: controller threads; queue q is served by thread q % n_threads
 * @backing: enum tt_emu_backing
 * @n_ns: namespaces, 1 to TT_EMU_MAX_NS
 * @ns_bytes: capacity of each namespace, a multiple of the LBA size
 * @lba_shift: log2 of the LBA size (9 or 12)
 * @fds: TT_EMU_FILE: one open file per namespace (not owned; the array
 *       is copied, the files must stay open)
 * @sgls: Identify Controller SGLS value advertised (0: PRP only)
 * @mdts_bytes: largest transfer, 0 for no limit
 * @list_chunks: PRP list pages / SGL segments available per SQ slot
 * @rate_gbps: bandwidth cap over all queues in GB/s (1e9 B/s), 0 = none
 */
struct tt_emu_params {
	unsigned n_queues;
	uint32_t depth;
	unsigned n_threads;
	int backing;
	unsigned n_ns;
	uint64_t ns_bytes;
	uint32_t lba_shift;
	const int *fds;
	uint32_t sgls;
	uint32_t mdts_bytes;
	uint32_t list_chunks;
	double rate_gbps;
};

/**
 * struct tt_emu_stats - counters since open
 * @cmds: commands completed
 * @errors: commands completed with a non-zero status
 * @bytes: data bytes moved
 * @sq_wraps: times an SQ head wrapped past the ring's end
 * @cq_wraps: times a CQ tail wrapped (phase tag flips)
 * @doorbells: SQ doorbell values seen change
 */
struct tt_emu_stats {
	uint64_t cmds;
	uint64_t errors;
	uint64_t bytes;
	uint64_t sq_wraps;
	uint64_t cq_wraps;
	uint64_t doorbells;
};

struct tt_emu;

/**
 * tt_emu_open() - create the controller and start its threads
 * @p: parameters
 * @out: the controller
 *
 * Uses the current CUDA device. With TUTTI_EMU_DMA=copy the controller's
 * copies run in a CUDA context of its own (emu_ctx.cuh). Return: 0 or a
 * negative errno (-EINVAL: bad parameters or environment value; -ENOSYS:
 * the driver lacks cuCtxCreate).
 */
int tt_emu_open(const struct tt_emu_params *p, struct tt_emu **out);

/** tt_emu_close() - stop the threads and free everything. */
void tt_emu_close(struct tt_emu *c);

/**
 * tt_emu_qmem() - the queue pairs, ready for tt_gio_open()
 * @c: controller
 *
 * Return: an array of n_queues entries owned by @c.
 */
const struct tt_gio_qmem *tt_emu_qmem(const struct tt_emu *c);

/**
 * tt_emu_caps() - transfer limits to hand to tt_gio_open()
 * @c: controller
 * @caps: out
 */
void tt_emu_caps(const struct tt_emu *c, struct tt_nvme_xfer_caps *caps);

/**
 * tt_emu_ns_data() - a namespace's backing memory (TT_EMU_HOSTMEM)
 * @c: controller
 * @nsid: namespace, 1..n_ns
 *
 * Return: host pointer to ns_bytes bytes, or NULL.
 */
void *tt_emu_ns_data(const struct tt_emu *c, uint32_t nsid);

/**
 * tt_emu_ns_mapped() - how a TT_EMU_FILE namespace moves its data
 * @c: controller
 * @nsid: namespace, 1..n_ns
 *
 * Return: 0 pread/pwrite through a bounce buffer (or not TT_EMU_FILE, or
 * no such namespace); 1 reads straight from the pinned file mapping,
 * writes by pwrite (file open read-only); 3 reads and writes through the
 * mapping. TUTTI_EMU_DEBUG set: tt_emu_open() says so, and why, on stderr.
 */
int tt_emu_ns_mapped(const struct tt_emu *c, unsigned nsid);

/** tt_emu_get_stats() - read the counters (a consistent-enough snapshot). */
void tt_emu_get_stats(const struct tt_emu *c, struct tt_emu_stats *st);

/**
 * tt_emu_queue_cmds() - commands one queue completed since open
 * @c: controller
 * @q: queue index, 0..n_queues-1
 */
uint64_t tt_emu_queue_cmds(const struct tt_emu *c, unsigned q);

/**
 * tt_emu_n_streams() - CUDA streams the controller created (one per
 * thread)
 * @c: controller
 */
unsigned tt_emu_n_streams(const struct tt_emu *c);

/**
 * tt_emu_pause() - stop answering, or answer again (a test's dead device)
 * @c: controller
 * @on: nonzero: fetch nothing and post nothing from now on (copies already
 *	handed to the copy engines still land); 0: go on as before
 *
 * Models an SSD that stopped answering, so the bounded waits and the fence
 * of the gio path (tt_emu_abort()) can be tested.
 */
void tt_emu_pause(struct tt_emu *c, int on);

/**
 * tt_emu_abort() - abort every command from now on (the fence of a hang)
 * @c: controller
 *
 * What a real controller does for the commands of a deleted submission
 * queue: batches whose data is already moving complete when it landed, with
 * their own status; every command fetched from now on moves no data and
 * completes with "Command Aborted due to SQ Deletion". So the GPU kernels
 * waiting for completions finish, and once they did, nothing the controller
 * does touches the transactions' memory again. Not undone; also ends a
 * pause. Returns at once.
 */
void tt_emu_abort(struct tt_emu *c);

/**
 * tt_emu_busy() - batches fetched whose completions are not posted yet
 * @c: controller
 *
 * 0 after tt_emu_abort() means nothing of the controller moves any more.
 */
unsigned tt_emu_busy(const struct tt_emu *c);

/**
 * tt_emu_dump() - print the controller's state (for a hang)
 * @c: controller
 * @f: where to print
 *
 * Per queue: SQ tail doorbell, the controller's SQ head, CQ tail and phase,
 * CQ head doorbell, commands completed. Per thread: batches in flight
 * (queue, commands, pending, age, cudaEventQuery of the batch's event)
 * and, when the controller was opened with TUTTI_GIO_WAIT_TIMEOUT_S,
 * TUTTI_GIO_DEBUG or TUTTI_EMU_DEBUG set, where the thread is and when it
 * last moved. Then thread_err and the counters. Reads race with the
 * threads (a diagnostic); it makes no CUDA call but cudaEventQuery.
 */
void tt_emu_dump(const struct tt_emu *c, FILE *f);

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif /* TUTTI_EMU_CTRL_H */
