/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/gio_path.h - the "gio" data path: store transactions straight
 * between the store's members and GPU memory over GPU-driven NVMe queues
 *
 * Namespace nsid_base + m is the store's member m. Per transaction the
 * moving blocks' slots and memory block ids go to the GPU once (begin);
 * per layer the CPU describes the layer in one descriptor
 * (tt_gio_prep_layer()) and launches a few kernels, whatever the number of
 * blocks. Writes are hashed on the GPU (tt_gpu_sum_layer()) before their
 * commands are built; reads are hashed on the GPU after the layer's
 * completions, on a second stream, so layer l is hashed while layer l + 1
 * moves. tt_txn_layer_order() makes a compute stream wait for the hashed
 * layer with a CUDA event, no host round trip.
 *
 * A layer's memory must be one base, one block stride and one span
 * stride: base[m(layer, k)] = base[m(layer, 0)] + k * span_stride, the
 * same stride for every span (vLLM's per-layer KV tensors are). Objects
 * must be whole LBAs (span_bytes a multiple of 512). Memory to write must
 * be complete when tt_txn_layer() is called: the path's streams do not
 * wait for the caller's.
 *
 * Example: the path over an emulated controller serving the store's own
 * member files (compiled by make ctest):
 *
 *	int with_gio_path(struct tt_store *s)
 *	{
 *		struct tt_gio_path_params p = { .n_queues = 8, .rate_gbps = 28.0 };
 *		struct tt_gio_path *gp;
 *		int ret = tt_gio_path_open_emu(s, &p, &gp);	// set as the data path
 *
 *		if (ret)
 *			return ret;
 *		// transactions as in devpath.h
 *		tt_gio_path_close(gp);	// removes it from the store first
 *		return 0;
 *	}
 *
 * Compiles as C11 or C++ without CUDA headers.
 */
#ifndef TUTTI_GIO_PATH_H
#define TUTTI_GIO_PATH_H

#include <stdint.h>

#include "devpath.h"
#include "gio_uring.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

struct tt_emu;
struct tt_gio_path;

/**
 * struct tt_gio_path_params - shape of the path (zero fields: defaults)
 * @n_queues: queue pairs of the emulated controller (8)
 * @depth: ring entries, >= 64 (256)
 * @n_threads: emulated controller threads (4)
 * @prp_only: the emulated controller advertises no SGL support, so
 *            commands use PRPs
 * @warps_per_queue: submitting warps per queue (gio_uring's default)
 * @rate_gbps: emulated bandwidth cap, 0 = none
 */
struct tt_gio_path_params {
	unsigned n_queues;
	uint32_t depth;
	unsigned n_threads;
	int prp_only;
	unsigned warps_per_queue;
	double rate_gbps;
};

/* The path's operations; ctx is a struct tt_gio_path. */
extern const struct tt_devpath_ops tt_devpath_gio;

/**
 * tt_gio_path_open() - a data path over an open gio_uring handle
 * @g: queues whose namespaces @nsid_base.. are the store's members (kept,
 *     not owned)
 * @nsid_base: namespace of member 0
 * @lba_shift: the namespaces' LBA size (9 or 12)
 * @out: the path; hand it to tt_store_set_devpath() with tt_devpath_gio
 *
 * Uses the current CUDA device. Return: 0, -EINVAL, -ENOMEM or -EIO.
 */
int tt_gio_path_open(struct tt_gio *g, uint32_t nsid_base, uint32_t lba_shift,
		     struct tt_gio_path **out);

/**
 * tt_gio_path_open_emu() - an emulated controller over a store's members,
 * a gio_uring handle over its queues, and the path, set as @s's data path
 * @s: open store, no transaction open
 * @p: parameters, or NULL for the defaults
 * @out: the path (owns the controller and the handle)
 *
 * The controller reads and writes the store's own member files, so the
 * store's flush covers the path's writes. Return: 0, -EINVAL (geometry the
 * path cannot move: span_bytes not whole LBAs, too many spans), -ENODEV
 * (no CUDA device), -EBUSY, -ENOMEM or -EIO.
 */
int tt_gio_path_open_emu(struct tt_store *s, const struct tt_gio_path_params *p,
			 struct tt_gio_path **out);

/**
 * tt_gio_path_close() - free the path (and what it owns); a path made by
 * tt_gio_path_open_emu() is first removed from its store. No transaction
 * may be open on it.
 */
void tt_gio_path_close(struct tt_gio_path *gp);

/** tt_gio_path_emu() - the emulated controller (NULL if not owned). */
struct tt_emu *tt_gio_path_emu(const struct tt_gio_path *gp);

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif /* TUTTI_GIO_PATH_H */
