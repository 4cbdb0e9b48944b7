/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/staged_path.h - the "staged" data path: store files <-> GPU memory
 * through pinned host buffers, for machines without peer-to-peer NVMe
 *
 * Per layer, the layer's objects are sorted in disk order and cut into runs
 * of objects adjacent on one member (a layer of consecutive slots is one
 * contiguous region, tt_locate()), so a prefix becomes a few large reads.
 * Host threads pread each run into a pinned chunk; the chunk is copied to a
 * device chunk with one cudaMemcpyAsync and a kernel scatters its objects
 * into the paged blocks. Every thread keeps several chunks in flight, so
 * reading the next run overlaps the copy of the last. Writes go the other
 * way: a gather kernel, one D2H copy, one pwrite per run. Files opened with
 * O_DIRECT are read straight into the pinned chunks; buffered files (page
 * cache, tmpfs) work too. Objects are hashed on the GPU (gpu_sum.h).
 *
 *   struct tt_staged *sp;
 *   tt_staged_open(NULL, &sp);
 *   tt_store_set_devpath(store, &tt_staged_ops, sp);
 *   ...
 *   tt_store_set_devpath(store, NULL, NULL);
 *   tt_staged_close(sp);
 *
 * The device memory of a write layer must hold its final bytes when the
 * layer is submitted (the path's streams do not wait for the caller's).
 */
#ifndef TUTTI_STAGED_PATH_H
#define TUTTI_STAGED_PATH_H

#include <stdint.h>

#include "devpath.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * struct tt_file_path_params - tuning shared by the file-based data paths
 * @n_threads: host I/O threads; 0: one per CPU, at most 16
 * @chunk_bytes: largest run moved at once (staging chunk); 0: 4 MiB
 * @depth: chunks in flight per thread; 0: 3
 * @device: CUDA device; < 0: the calling thread's current device
 */
struct tt_file_path_params {
	unsigned n_threads;
	uint32_t chunk_bytes;
	unsigned depth;
	int device;
};

struct tt_file_path;

/**
 * tt_staged_open() - start a staged data path
 * @p: tuning, or NULL for the defaults
 * @out: the path, the context for tt_staged_ops
 *
 * Allocates the pinned and device chunks and starts the I/O threads.
 * Return: 0, -EINVAL, -ENOMEM or -EIO (CUDA failure).
 */
int tt_staged_open(const struct tt_file_path_params *p, struct tt_file_path **out);

/** tt_file_path_close() - stop a staged or GDS path (no transaction open). */
void tt_file_path_close(struct tt_file_path *fp);

extern const struct tt_devpath_ops tt_staged_ops;

#ifdef __cplusplus
}
#endif
#endif /* TUTTI_STAGED_PATH_H */
