/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/gio_uring.h - GPU-driven NVMe queues ("GPU io_uring")
 *
 * The GPU itself builds NVMe commands, reserves submission slots, rings
 * doorbells and polls completions; the CPU only describes a batch (one
 * small descriptor per layer) and launches a kernel. Everything that
 * touches the rings is the protocol code of nvme.h / nvme_prp.h /
 * nvme_sgl.h / nvme_queue.h, compiled for the device.
 *
 * Transport and protocol are apart: gio_uring does not allocate rings or
 * map doorbells. A transport hands it one struct tt_gio_qmem per queue
 * pair (rings, doorbells, PRP/SGL list memory, all as addresses the GPU
 * can use plus the bus addresses the controller uses). Today the transport
 * is the emulated controller (emu_ctrl.h); a kernel module exposing a real
 * SSD's BAR0 and queue memory to the GPU fills the same struct.
 *
 * Order of use:
 *   tt_gio_open()                     once, over the transport's queues
 *   tt_gio_batch_create()             once per in-flight batch (reused)
 *   tt_gio_prep_iocbs() or
 *   tt_gio_prep_layer()               CPU, O(1): describe the batch
 *   tt_gio_submit_wait()              one kernel: submit + reap, or
 *   tt_gio_issue() + tt_gio_wait_cqe() two kernels on two streams
 *   tt_gio_batch_result()             (optional) per-command status
 *
 * All functions return 0 or a negative errno; host only. Compile this
 * header with nvcc or a C/C++ compiler: it needs no CUDA header.
 */
#ifndef TUTTI_GIO_URING_H
#define TUTTI_GIO_URING_H

#include <stdint.h>
#include <stdio.h>

#include "layout.h"
#include "nvme.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

struct CUstream_st; /* cudaStream_t is struct CUstream_st * */

#define TT_GIO_MAX_SEGS 4u	/* memory segments of one iocb */

/**
 * struct tt_gio_qmem - one queue pair, as a transport provides it
 * @qid: NVMe queue identifier (1 or more)
 * @depth: entries in each ring (SQ and CQ have the same depth)
 * @sq: SQ ring, @depth entries, GPU-usable address
 * @cq: CQ ring, @depth entries, zeroed, GPU-usable address
 * @sq_db: SQ tail doorbell, GPU-usable address (BAR0 or its emulation)
 * @cq_db: CQ head doorbell, GPU-usable address
 * @list: list memory, @depth * @list_chunks chunks of @chunk_bytes, one
 *        group of @list_chunks per SQ slot, GPU-usable address
 * @list_bus: bus address of @list (chunks are contiguous on the bus)
 * @list_chunks: chunks per slot; 0 when no PRP list/SGL segment is needed
 * @chunk_bytes: chunk size: the controller page size (PRP lists)
 * @dma: NULL for a controller that moves its own data (a real SSD DMAs
 *       into GPU memory across PCIe); a controller without a DMA engine
 *       (the emulated one, emu_ctrl.h) queues its commands' data moves
 *       here and the kernels that poll this queue's completions do them
 */
struct tt_gio_qmem {
	uint16_t qid;
	uint32_t depth;
	struct tt_nvme_sqe *sq;
	volatile struct tt_nvme_cqe *cq;
	volatile uint32_t *sq_db;
	volatile uint32_t *cq_db;
	void *list;
	uint64_t list_bus;
	uint32_t list_chunks;
	uint32_t chunk_bytes;
	const struct tt_gio_dma *dma;
};

/* tt_gio_dma_desc.flags */
#define TT_GIO_DMA_SRC_HOST 1u	/* source is host memory (a read command) */

/**
 * struct tt_gio_dma_desc - one data move a controller asks the GPU to do
 * @dst: destination, a GPU-usable address
 * @src: source, a GPU-usable address
 * @len: bytes
 * @flags: TT_GIO_DMA_SRC_HOST when @src is host memory, else @dst is
 * @done: written by the GPU once the bytes landed: the descriptor's
 *        sequence number + 1
 *
 * Host memory the GPU reads and writes (pinned and mapped); the controller
 * fills a descriptor, then publishes it by raising tt_gio_dma.posted.
 */
struct tt_gio_dma_desc {
	uint64_t dst;
	uint64_t src;
	uint32_t len;
	uint32_t flags;
	uint64_t done;
};

/**
 * struct tt_gio_dma - a queue's ring of data moves (see tt_gio_qmem.dma)
 * @posted: GPU-usable address of the count of descriptors published;
 *          descriptor i lives at @desc[i % @entries]
 * @desc: GPU-usable address of the ring
 * @entries: ring entries, a power of two
 */
struct tt_gio_dma {
	volatile uint64_t *posted;
	struct tt_gio_dma_desc *desc;
	uint32_t entries;
};

/**
 * struct tt_gio_params - what tt_gio_open() needs
 * @n_queues: queue pairs in @qmem, 1 to 1024
 * @qmem: the transport's queues
 * @caps: controller limits; @caps.sgls == 0 forces PRPs
 * @lba_shift: log2 of the namespace's LBA size (9 or 12)
 * @warps_per_queue: submitting warps per queue in a kernel; 0 = 4
 */
struct tt_gio_params {
	unsigned n_queues;
	const struct tt_gio_qmem *qmem;
	struct tt_nvme_xfer_caps caps;
	uint32_t lba_shift;
	unsigned warps_per_queue;
};

/**
 * struct tt_gio_iocb - one I/O control block (one NVMe command)
 * @lba: first logical block
 * @nsid: namespace
 * @op: TT_NVME_CMD_READ or TT_NVME_CMD_WRITE
 * @nseg: segments in @seg, 1 to TT_GIO_MAX_SEGS
 * @seg: GPU memory, in transfer order; lengths add up to whole LBAs
 */
struct tt_gio_iocb {
	uint64_t lba;
	uint32_t nsid;
	uint8_t op;
	uint8_t nseg;
	uint16_t rsvd;
	struct tt_dma_seg seg[TT_GIO_MAX_SEGS];
};

/**
 * struct tt_gio_layer - one layer of a layer-wise transfer, in one descriptor
 * @geo: store geometry; object (slot, layer, span) lives where tt_locate()
 *       says; member m is namespace @nsid_base + m
 * @layer: layer index
 * @n_blocks: entries in @slots and @block_ids
 * @slots: store slot of each block (device memory)
 * @block_ids: paged-buffer block of each block (device memory)
 * @base: GPU address of block 0, span 0 of this layer
 * @block_stride: bytes between paged-buffer blocks
 * @span_stride: bytes between a block's spans (K and V)
 * @nsid_base: namespace of member 0
 * @op: TT_NVME_CMD_READ or TT_NVME_CMD_WRITE
 *
 * The batch is n_blocks * n_spans commands, one per object; GPU threads
 * compute each command's LBA and memory address, so preparing it costs
 * the CPU the same for 1 block or 64K.
 */
struct tt_gio_layer {
	struct tt_geometry geo;
	uint32_t layer;
	uint32_t n_blocks;
	const uint64_t *slots;
	const uint32_t *block_ids;
	uint64_t base;
	uint64_t block_stride;
	uint64_t span_stride;
	uint32_t nsid_base;
	uint8_t op;
};

struct tt_gio;
struct tt_gio_batch;

/**
 * tt_gio_open() - set up GPU-side state for a transport's queue pairs
 * @p: parameters
 * @out: the handle
 *
 * Uses the current CUDA device. Return: 0, -EINVAL, -ENOMEM or -EIO.
 */
int tt_gio_open(const struct tt_gio_params *p, struct tt_gio **out);

/** tt_gio_close() - free GPU-side state (the queues must be idle). */
void tt_gio_close(struct tt_gio *g);

/**
 * tt_gio_batch_create() - allocate a reusable batch
 * @g: handle
 * @max_cmds: largest number of commands it will hold
 * @out: the batch
 *
 * Return: 0, -EINVAL or -ENOMEM.
 */
int tt_gio_batch_create(struct tt_gio *g, uint32_t max_cmds,
			struct tt_gio_batch **out);

/** tt_gio_batch_destroy() - free a batch that is not in flight. */
void tt_gio_batch_destroy(struct tt_gio_batch *b);

/**
 * tt_gio_prep_iocbs() - describe a batch as an array of iocbs (get_iocb)
 * @b: batch, not in flight
 * @iocbs: @n iocbs in device memory (or mapped host memory)
 * @n: commands
 *
 * Return: 0, or -EINVAL if @n is 0 or above the batch's capacity.
 */
int tt_gio_prep_iocbs(struct tt_gio_batch *b, const struct tt_gio_iocb *iocbs,
		      uint32_t n);

/**
 * tt_gio_prep_layer() - describe a batch as one layer of a layer-wise I/O
 * @b: batch, not in flight
 * @l: layer descriptor (copied)
 *
 * Return: 0, or -EINVAL if the objects are not whole LBAs or the batch is
 * too small.
 */
int tt_gio_prep_layer(struct tt_gio_batch *b, const struct tt_gio_layer *l);

/**
 * tt_gio_submit_wait() - submit a batch and reap it, in one kernel
 * @g: handle
 * @b: prepared batch
 * @stream: CUDA stream (NULL: the legacy default stream)
 *
 * One block per queue pair: its submitting warps reserve SQ slots with
 * atomics, write SQEs and ring the SQ doorbell once per warp; one warp
 * polls the CQ. The kernel ends when every command of @b completed.
 * Return: 0 or -EIO (launch failure).
 */
int tt_gio_submit_wait(struct tt_gio *g, struct tt_gio_batch *b,
		       struct CUstream_st *stream);

/**
 * tt_gio_issue() - submit a batch (GPU writes SQEs, rings doorbells)
 * @g: handle
 * @b: prepared batch
 * @stream: CUDA stream
 *
 * When @b holds more commands than the rings have free, tt_gio_wait_cqe()
 * must run concurrently on another stream, or this kernel waits forever.
 * Return: 0 or -EIO.
 */
int tt_gio_issue(struct tt_gio *g, struct tt_gio_batch *b,
		 struct CUstream_st *stream);

/**
 * tt_gio_wait_cqe() - reap completions until every command of @b is done
 * @g: handle
 * @b: batch given to tt_gio_issue()
 * @stream: CUDA stream; record an event after it to order compute on it
 *
 * Return: 0 or -EIO.
 */
int tt_gio_wait_cqe(struct tt_gio *g, struct tt_gio_batch *b,
		    struct CUstream_st *stream);

/**
 * tt_gio_batch_result() - outcome of a batch once it is reaped
 * @b: batch
 * @n_err: out, commands that failed (may be NULL); every command of the
 *         batch when the call cannot tell
 * @status: out, @b's commands' NVMe status (tt_nvme_cqe_status() values),
 *          host memory for as many entries as the batch had (may be NULL)
 *
 * Waits for the last kernel that reaped @b (tt_gio_submit_wait() or
 * tt_gio_wait_cqe() since the last prep), nothing else: other streams may
 * hold compute that waits on the caller.
 *
 * Return: 0 if every command succeeded, -EIO otherwise (or the wait
 * failed), -EINVAL if no reaping kernel was launched since the last prep.
 */
int tt_gio_batch_result(struct tt_gio_batch *b, uint32_t *n_err,
			uint16_t *status);

/**
 * tt_gio_batch_status() - the batch's per-command NVMe status, on the GPU
 * @b: batch
 *
 * Device array, one entry per command of the prepared batch, valid once
 * the kernels that reap it completed (stream order): lets a kernel judge
 * a batch without a host synchronisation. Return: the array.
 */
const uint16_t *tt_gio_batch_status(const struct tt_gio_batch *b);

/** tt_gio_batch_size() - commands in the prepared batch. */
uint32_t tt_gio_batch_size(const struct tt_gio_batch *b);

/*
 * Diagnostics (for a hang: a batch that never completes). They only read
 * state, racing with the kernels and the controller by design; a host
 * thread may call them while gio kernels spin.
 */

/**
 * tt_gio_dump_prepare() - allocate what tt_gio_dump() needs (pinned memory)
 *
 * Optional: the first dump does it otherwise. Call it early (say, when a
 * wait with a timeout is configured) so a dump during a hang allocates
 * nothing. Return: 0 or -ENOMEM.
 */
int tt_gio_dump_prepare(void);

/**
 * tt_gio_dump() - print every queue's GPU-side state
 * @g: handle
 * @f: where to print
 *
 * Copies the device queue array to the host on a new non-blocking stream
 * and waits at most 2 s for it (polling; says so and returns if the copy
 * does not finish). Per queue: ticket, published, sq_head, reaped, the
 * CQ head and phase, the reaper lock, and, where the doorbells and the CQ
 * are host memory (the emulated controller), the SQ tail and CQ head
 * doorbell values and the phase tag of the CQE at the head.
 */
void tt_gio_dump(struct tt_gio *g, FILE *f);

/**
 * tt_gio_batch_dump() - print a batch's size, completion target and counter
 * @b: batch
 * @f: where to print
 *
 * Same device read as tt_gio_dump() (at most 2 s). The batch's kernels are
 * done once the counter reached the target.
 */
void tt_gio_batch_dump(const struct tt_gio_batch *b, FILE *f);

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif /* TUTTI_GIO_URING_H */
