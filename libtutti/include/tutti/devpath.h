/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/devpath.h - data paths that move a transaction's objects between
 * the store's members and device (GPU) memory themselves
 *
 * The store keeps everything that makes it safe: slot choice, eviction,
 * the ordered commit (data durable before its record), record checksums.
 * A data path only moves objects and hashes them where they land, so KV
 * bytes never pass through the CPU's hands and, for the GPU-driven path,
 * the CPU's cost per layer does not grow with the number of blocks: the
 * slot and block lists are handed over once per transaction.
 *
 * Implementations (each in its own file under src/gpu/):
 *   gio     GPU threads build the NVMe commands (gio_uring.h, gio_path.h)
 *   staged  file -> pinned staging buffers -> HBM, pipelined
 *   gds     cuFile (GPUDirect Storage, or its compatibility mode)
 * and tt_devpath_host below (src/store/devpath_host.c): the reference path
 * over host memory, so the store's side is tested without a GPU.
 *
 * Use:
 *   tt_store_set_devpath(s, ops, ctx)        once per store
 *   tt_store_read_begin() / write_begin()    as for host memory
 *   tt_txn_bind_device(t, block_ids)         device memory from now on
 *   tt_txn_layer(t, l, mem, NULL)            mem holds device addresses
 *   tt_txn_layer_order(t, l, stream)         optional: @stream waits on the
 *                                            GPU for layer l, not the CPU
 *   tt_txn_wait_layer() / tt_txn_finish()    as for host memory
 *
 * Example: load @n committed slots into the paged GPU blocks @ids of @mem
 * (device addresses), compute waiting for each layer on the GPU; the store
 * has a data path (staged_path.h shows how). Compiled by
 * make ctest:
 *
 *	int load(struct tt_store *s, const int64_t *slots, const uint32_t *ids,
 *		 unsigned n, const struct tt_memmap *mem,
 *		 struct CUstream_st *compute, int32_t *status)
 *	{
 *		struct tt_txn *t;
 *		int ret = tt_store_read_begin(s, slots, n, &t);
 *
 *		if (ret)
 *			return ret;
 *		ret = tt_txn_bind_device(t, ids);
 *		for (uint32_t l = 0; !ret && l < mem->n_layers; l++) {
 *			ret = tt_txn_layer(t, l, mem, NULL);
 *			if (!ret)
 *				ret = tt_txn_layer_order(t, l, compute);
 *			// then launch layer l's compute on @compute
 *		}
 *		if (ret) {
 *			tt_txn_abort(t);
 *			return ret;
 *		}
 *		return tt_txn_finish(t, status);	// -EBADMSG: discard what used it
 *	}
 *
 * Checksums are the store's own (per-object XXH3-64 seeded with the object
 * index, combined per slot), computed on the GPU by tt_gpu_sum_layer()
 * (gpu_sum.h), so a slot written through a data path reads back through
 * the CPU path and vice versa.
 */
#ifndef TUTTI_DEVPATH_H
#define TUTTI_DEVPATH_H

#include <stdint.h>

#include "layout.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

struct CUstream_st;

/**
 * struct tt_devpath_txn - what a data path learns of a transaction
 * @geo: store geometry
 * @write: 1 for a write (store) transaction, 0 for a read
 * @n: blocks
 * @slots: slot of each block; < 0: nothing to move for this block
 * @block_ids: memory block of each block (host array, copied)
 * @fds: the store's member files (O_DIRECT), @geo->n_members of them
 */
struct tt_devpath_txn {
	const struct tt_geometry *geo;
	int write;
	unsigned n;
	const int64_t *slots;
	const uint32_t *block_ids;
	const int *fds;
};

/**
 * struct tt_devpath_ops - a data path
 * @name: "gio", "staged", "gds"
 * @begin: set up a transaction (copy its lists to the device); *@txn is
 *         the path's handle for it
 * @layer: start moving layer @layer; object (i, span k) of block i is at
 *         mem->base[m] + block_ids[i] * mem->stride[m] in device memory,
 *         m = tt_obj_index(geo, layer, k), on disk at tt_locate(); writes
 *         hash their objects before they move; asynchronous. On error the
 *         store counts nothing of the layer (its blocks fail with -EIO)
 *         and does not call @wait for it; @end still waits for anything
 *         the path had started
 * @order: make CUDA stream @stream wait (on the GPU) until layer @layer
 *         has landed and been hashed; NULL if the path cannot
 * @wait: block until layer @layer completed; reads hash what arrived;
 *        0, or -EIO when a command of the layer failed
 * @collect: after every submitted layer was waited for: per-block status
 *           (0 or -EIO) and sums[i * R + m] of every object moved
 *           (R = tt_objs_per_slot()); entries not moved are left alone
 * @end: free the transaction's state; waits for anything in flight
 * @flush: make completed writes durable; NULL: the store's own flush of
 *         its member files covers them
 * @poll: without waiting, has layer @layer completed (1) or not (0)? A
 *        failed layer has completed. NULL: the path cannot tell (the store
 *        reports it completed; @wait then waits as before)
 */
struct tt_devpath_ops {
	const char *name;
	int (*begin)(void *ctx, const struct tt_devpath_txn *ti, void **txn);
	int (*layer)(void *txn, uint32_t layer, const struct tt_memmap *mem);
	int (*order)(void *txn, uint32_t layer, struct CUstream_st *stream);
	int (*wait)(void *txn, uint32_t layer);
	int (*collect)(void *txn, int32_t *status, uint64_t *sums);
	void (*end)(void *txn);
	int (*flush)(void *ctx);
	int (*poll)(void *txn, uint32_t layer);
};

/**
 * tt_store_set_devpath() - give a store a data path for device memory
 * @s: store
 * @ops: the path (must outlive the store), or NULL to remove it
 * @ctx: the path's context, passed to @ops->begin and @ops->flush
 *
 * Return: 0, or -EBUSY while transactions are open.
 */
int tt_store_set_devpath(struct tt_store *s, const struct tt_devpath_ops *ops,
			 void *ctx);

/**
 * tt_txn_bind_device() - move this transaction's data through the data path
 * @t: transaction, no layer submitted yet
 * @block_ids: memory block of each of the transaction's blocks
 *
 * After this, tt_txn_layer() takes device addresses and ignores its
 * block_ids argument. Return: 0, -ENODEV (no data path), -EALREADY (bound
 * already), -EINVAL (a layer was already moved through host memory), or
 * the path's error.
 */
int tt_txn_bind_device(struct tt_txn *t, const uint32_t *block_ids);

/**
 * tt_txn_layer_order() - make @stream wait for layer @layer on the GPU
 * @t: transaction bound to a device
 * @layer: a submitted layer
 * @stream: CUDA stream (compute)
 *
 * Lets compute consume layer @layer as soon as it lands, with no CPU
 * round trip. Corruption is still judged at tt_txn_finish(): a caller
 * that used the bytes must discard what it computed from a block whose
 * status is -EBADMSG. Return: 0, -EINVAL (not bound, layer not submitted),
 * -EOPNOTSUPP (the path cannot), -EIO (the layer failed), or the path's
 * error.
 */
int tt_txn_layer_order(struct tt_txn *t, uint32_t layer, struct CUstream_st *stream);

/*
 * tt_devpath_host - the reference data path: "device" addresses are host
 * addresses, objects move with pread/pwrite through an aligned bounce
 * buffer and are hashed by the CPU (tt_sum_object()), synchronously in
 * @layer. No @order, no @flush; @ctx is unused (NULL). For tests and
 * machines without a GPU.
 */
extern const struct tt_devpath_ops tt_devpath_host;

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif /* TUTTI_DEVPATH_H */
