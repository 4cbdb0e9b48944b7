// SPDX-License-Identifier: Apache-2.0
//
// file_pipe.cuh - the pipeline shared by the staged and GDS data paths
// (not installed). A backend only moves one run between a member file and
// a chunk; everything else (runs, threads, scatter/gather kernels, hashing,
// per-layer completion) is here.
#ifndef TT_FILE_PIPE_CUH
#define TT_FILE_PIPE_CUH

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <time.h>

#include <cuda_runtime.h>

#include "tutti/devpath.h"
#include "tutti/gpu_sum.h"
#include "tutti/staged_path.h"
#include "pinned.cuh"

#define FP_RING		1024u	// layers queued to the threads, all transactions
#define FP_SUM_STREAMS	8u	// layer q completes on stream q % 8
#define FP_MIN_RUN	(256u << 10)
// Threads that move a transaction whose members are all mapped: its runs are
// DMA between HBM and the mapping, the threads only queue them, and each
// extra thread's CUDA calls contend with the caller's own launches (H200,
// 2K-token prefill with saves: 16 threads made the model's launches 1.9x
// slower, 2 threads moved 4 GiB faster than 16; docs/benchmarks.md).
#define FP_MAPPED_WORKERS 2u
// Runs a writing thread keeps in flight beyond the oldest (depth - 1 at most).
#define FP_MAX_AHEAD	7u

struct fp_txn;

// One staging unit: pinned host memory (staged) and device memory.
struct fp_chunk {
	struct tt_pinned host_mem;	// O_DIRECT: page aligned (pinned.cuh)
	void *host;
	void *dev;
	const void *src;	// what to_dev copies: host, or a mapped file's bytes
	void *dst;		// where from_dev copied: host, or a mapped file's bytes
	cudaEvent_t ev;		// recorded after the chunk's last copy/kernel
	int registered;		// with the backend (cuFileBufRegister)
};

// A run of objects adjacent on one member: one read or write.
struct fp_job {
	uint32_t first;		// into the layer's sorted tags
	uint32_t count;
	uint32_t member;
	uint32_t len;
	uint64_t off;
};

struct fp_layer {
	struct fp_txn *t;
	uint32_t layer;
	int submitted;
	std::atomic<uint32_t> next_job;
	uint32_t n_jobs;
	const struct fp_job *jobs;
	const uint32_t *tags;		// host: block * n_spans + span, disk order
	const uint32_t *dtags;		// the same on the device
	uint32_t n_objs;
	uint64_t base[TT_GPU_SUM_MAX_SPANS];
	uint64_t stride[TT_GPU_SUM_MAX_SPANS];
	unsigned passed;		// threads done with it (under fp->mu)
	int done;			// every run moved and queued (under fp->mu)
	int err;			// first failure (atomic)
	cudaStream_t sum;		// completes here: hash, then ev
	cudaEvent_t ev;
	uint64_t tr_sub, tr_start;		// TUTTI_FP_TRACE (ns)
	uint64_t tr_queue, tr_wait;		// the same, atomic adds
};

struct fp_txn {
	struct tt_file_path *fp;
	struct tt_geometry geo;
	int write;
	unsigned n;
	unsigned workers;			// threads that move it; 0: all
	int fds[TT_MAX_ENGINE_MEMBERS];
	void *fh[TT_MAX_ENGINE_MEMBERS];	// backend's per-member handle
	std::vector<int64_t> slots;
	std::vector<int32_t> status;		// per block (atomic stores)
	std::vector<uint32_t> tags;		// all layers, n * n_spans each
	std::vector<struct fp_job> jobs;
	std::vector<struct fp_layer> layers;
	void *dmem;				// one device allocation:
	uint32_t *d_ids;
	uint8_t *d_skip;
	uint32_t *d_tags;
	uint64_t *d_sums;
};

// Per-phase time of a worker (ns, atomic adds: read and reset by others).
enum { FP_T_GET, FP_T_PUT, FP_T_WAIT, FP_T_QUEUE, FP_T_IDLE, FP_T_N };

struct fp_worker {
	std::thread th;
	uint64_t ns[FP_T_N] = {};
	uint64_t runs = 0, bytes = 0;
	cudaStream_t s;
	cudaEvent_t ev;
	std::vector<struct fp_chunk> chunks;
	unsigned next;			// chunk to use next
	uint64_t cursor;		// ring entry it works on (under fp->mu)
};

struct fp_backend {
	const char *name;
	int host_chunks;		// needs pinned chunks
	int (*init)(struct tt_file_path *fp);	// after the chunks exist
	void (*fini)(struct tt_file_path *fp);
	int (*txn_open)(struct fp_txn *t);
	void (*txn_close)(struct fp_txn *t);
	// file -> chunk (synchronous); then chunk -> device on @s, may be NULL
	int (*get)(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j);
	int (*to_dev)(struct fp_chunk *c, uint32_t len, cudaStream_t s);
	// device -> chunk (or straight into a mapped file) on @s, may be NULL;
	// then chunk -> file (synchronous)
	int (*from_dev)(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j,
			cudaStream_t s);
	int (*put)(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j);
	// Before the runs are planned (t->fds set), may be NULL: attach
	// per-member state, may set t->workers; returns the largest run,
	// 0: chunk_bytes.
	uint32_t (*txn_plan)(struct fp_txn *t);
	void (*stats)(struct tt_file_path *fp, struct tt_file_path_stats *st, int reset);
};

struct tt_file_path {
	const struct fp_backend *be;
	int device;
	unsigned n_workers;
	unsigned depth;
	unsigned write_ahead;		// write_layer: runs ahead of the oldest put
	unsigned mapped_workers;	// threads of an all-mapped transaction
	uint32_t chunk_bytes;
	int chunk_set;			// chunk_bytes given by the caller
	int threads_set;		// n_threads given by the caller
	unsigned map;			// enum tt_file_map (staged)
	uint64_t begin_ns, layer_wait_ns;	// caller's time (atomic adds)
	uint64_t reset_ns;		// counters zeroed then
	std::vector<struct fp_worker> w;
	std::mutex mu;
	std::condition_variable cv_work, cv_done;
	struct fp_layer *ring[FP_RING];
	uint64_t tail;
	int stop;
	cudaStream_t sum[FP_SUM_STREAMS];
	cudaStream_t ctl;
	// The transactions' small device arrays: a pool of the path's own that
	// keeps what it had (the device's default pool returns every free to
	// the driver at the next synchronisation, and maps it again next time).
	cudaMemPool_t pool;
	void *priv;			// backend's
	int trace;			// TUTTI_FP_TRACE: a line per layer on stderr
	uint64_t tr_origin;
	unsigned sum_next;		// completion stream of the next layer (atomic)
};

static inline uint64_t fp_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void fp_count(uint64_t *ctr, uint64_t v)
{
	__atomic_fetch_add(ctr, v, __ATOMIC_RELAXED);
}

// Waiting threads sleep: a spinning one would take a core from the preads.
#define FP_EVENT	(cudaEventDisableTiming | cudaEventBlockingSync)

// First error wins.
static inline void fp_set_err(int *p, int err)
{
	int zero = 0;

	__atomic_compare_exchange_n(p, &zero, err, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

int fp_open(const struct tt_file_path_params *p, const struct fp_backend *be,
	    void *priv, struct tt_file_path **out);
// Hash a layer's objects on its completion stream (file_pipe.cu).
int fp_layer_sum(struct fp_layer *ly);

// The devpath ops, the same for every backend.
int fp_begin(void *ctx, const struct tt_devpath_txn *ti, void **txn);
int fp_layer(void *txn, uint32_t layer, const struct tt_memmap *mem);
int fp_order(void *txn, uint32_t layer, struct CUstream_st *stream);
int fp_wait(void *txn, uint32_t layer);
int fp_poll(void *txn, uint32_t layer);
int fp_collect(void *txn, int32_t *status, uint64_t *sums);
void fp_end(void *txn);

#endif /* TT_FILE_PIPE_CUH */
