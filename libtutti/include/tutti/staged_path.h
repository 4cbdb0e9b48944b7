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
 * Mapped reads: a member on a RAM-backed file system (tmpfs, hugetlbfs,
 * ramfs) is mapped read-only once and registered with CUDA
 * (cudaHostRegister), so a run is copied by DMA straight from the page
 * cache to the device chunk, with no pread. The mapping is made at the
 * first read transaction on the file, or ahead by tt_file_path_map_store(),
 * and kept (its pages pinned) until tt_file_path_close(). Writes still
 * pwrite, into the same pages. Where a file cannot be mapped or registered
 * it is read with pread, and tt_file_path_get_stats() says why.
 *
 * Example (compiled by make ctest):
 *
 *	int with_staged_path(struct tt_store *s)
 *	{
 *		struct tt_file_path *fp;
 *		int ret = tt_file_path_open_staged(NULL, &fp);	// NULL: defaults
 *
 *		if (ret)
 *			return ret;
 *		ret = tt_store_set_devpath(s, &tt_devpath_staged, fp);
 *		if (!ret) {
 *			tt_file_path_map_store(fp, s);	// optional: pin tmpfs members now
 *			// transactions as in devpath.h
 *			tt_store_set_devpath(s, NULL, NULL);
 *		}
 *		tt_file_path_close(fp);
 *		return ret;
 *	}
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
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

/* How the staged path reads a member file (tt_file_path_params.map). */
enum tt_file_map {
	TT_FILE_MAP_AUTO = 0,	/* map files on RAM-backed file systems */
	TT_FILE_MAP_OFF = 1,	/* never: pread into pinned chunks */
	TT_FILE_MAP_ANY = 2,	/* try any file system: pins the whole file's page cache */
};

/**
 * struct tt_file_path_params - tuning shared by the file-based data paths
 * @n_threads: host I/O threads; 0: one per CPU, at most 16, of which a
 *             staged transaction whose members are all mapped uses 2 (its
 *             runs are DMA; more threads only slow the caller's launches)
 * @chunk_bytes: largest run moved at once (staging chunk); 0: 4 MiB, and
 *               runs read with buffered pread are kept to 1 MiB (the copy
 *               stays in the CPU's cache for the DMA that follows)
 * @depth: chunks in flight per thread; 0: 3
 * @device: CUDA device; < 0: the calling thread's current device
 * @map: staged path, enum tt_file_map; the environment variable
 *       TUTTI_STAGED_MAP=auto|off|any overrides it
 */
struct tt_file_path_params {
	unsigned n_threads;
	uint32_t chunk_bytes;
	unsigned depth;
	int device;
	unsigned map;
};

/**
 * struct tt_file_path_stats - what a file path did, for benchmarks
 *
 * Times are seconds summed over the I/O threads (divide by @n_threads for
 * a share of the wall time), since the path was opened or last reset.
 * @runs: runs moved (reads and writes)
 * @bytes: their bytes
 * @mapped_runs: runs copied straight from (reads) or into (writes, RAM-backed
 *	files) a registered mapping
 * @get_s: file -> chunk (pread, cuFileRead); mapped runs take none
 * @put_s: chunk -> file (pwrite, cuFileWrite)
 * @chunk_wait_s: waiting for a chunk's previous copy and kernel (GPU side)
 * @queue_s: queuing copies, kernels and events
 * @idle_s: waiting for a layer to be submitted
 * @begin_s: caller's time in setting up transactions (planning, lists)
 * @layer_wait_s: caller's time blocked waiting for layers
 * @n_threads: I/O threads
 * @threads_busy: of them, those that moved a run
 * @n_mapped: member files mapped and registered (staged)
 * @mapped_bytes: their bytes
 * @map_s: time spent mapping and registering them
 * @files: one line per file seen: how it is read, and why
 */
struct tt_file_path_stats {
	uint64_t runs;
	uint64_t bytes;
	uint64_t mapped_runs;
	double get_s;
	double put_s;
	double chunk_wait_s;
	double queue_s;
	double idle_s;
	double begin_s;
	double layer_wait_s;
	unsigned n_threads;
	unsigned threads_busy;
	unsigned n_mapped;
	uint64_t mapped_bytes;
	double map_s;
	char files[1024];
};

struct tt_file_path;

/**
 * tt_file_path_open_staged() - start a staged data path
 * @p: tuning, or NULL for the defaults
 * @out: the path, the context for tt_devpath_staged; close it with
 *       tt_file_path_close()
 *
 * Allocates the pinned and device chunks and starts the I/O threads.
 * Return: 0, -EINVAL, -ENOMEM or -EIO (CUDA failure).
 */
int tt_file_path_open_staged(const struct tt_file_path_params *p, struct tt_file_path **out);

/**
 * tt_file_path_map_store() - map and register a store's members now
 * @fp: a staged path
 * @s: the store it serves (or will)
 *
 * Does what the first read transaction would otherwise do, so its cost
 * (pinning every page of the files: about a second per few GiB) is paid
 * here. Return: the number of members mapped (0 if none can be; see
 * tt_file_path_get_stats()), or -EINVAL if @fp is not a staged path.
 */
int tt_file_path_map_store(struct tt_file_path *fp, const struct tt_store *s);

/**
 * tt_file_path_get_stats() - counters and per-file modes of a path
 * @fp: a staged or GDS path
 * @st: filled in
 * @reset: then zero the counters (not the mapping fields)
 */
void tt_file_path_get_stats(struct tt_file_path *fp, struct tt_file_path_stats *st, int reset);

/** tt_file_path_close() - stop a staged or GDS path (no transaction open). */
void tt_file_path_close(struct tt_file_path *fp);

extern const struct tt_devpath_ops tt_devpath_staged;

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif /* TUTTI_STAGED_PATH_H */
