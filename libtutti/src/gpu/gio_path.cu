// SPDX-License-Identifier: Apache-2.0
//
// gio_path.cu - the "gio" data path (gio_path.h): a store transaction's
// objects move between the members and GPU memory over gio_uring, hashed
// on the GPU. The store keeps slots, ordering and verification; this file
// only moves bytes and reports per-block status and object sums.
//
// Per transaction (begin): the moving blocks' slots and memory block ids
// go to the GPU once. Per layer, on the I/O stream: [writes: hash] ->
// prep_layer (96-byte copy) + submit_wait (one kernel) -> a status kernel
// folds command status into per-block flags and a per-layer count;
// reads then hash on the sum stream, so layer l is hashed while l + 1
// moves. ev_done[l] marks "landed and hashed": wait() sleeps on it and
// order() makes a compute stream wait on it. Transaction states (device
// lists, batches, events) are pooled, so a steady workload allocates
// nothing per transaction.
#include <cerrno>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "tutti/emu_ctrl.h"
#include "tutti/error.h"
#include "tutti/gio_path.h"
#include "gpu_launch.cuh"
#include "tutti/gpu_sum.h"

enum { GP_IDLE = 0, GP_SUBMITTED, GP_FAILED };

struct tt_gio_path;

struct gp_txn {
	struct tt_gio_path *p;
	struct gp_txn *next;		// pool
	struct tt_geometry geo;
	int write;
	unsigned n;			// blocks of the transaction
	unsigned nm;			// blocks that move
	unsigned cap;			// capacity of the device lists
	std::vector<unsigned> moved;	// transaction index of moving block j
	uint64_t *d_slots;
	uint32_t *d_ids;
	uint64_t *d_sums;		// cap * objs_per_slot
	unsigned *d_err;		// cap block flags, then one count per layer
	char *h_stage;			// pinned: the lists on their way up
	unsigned *h_lerr;		// pinned: failed commands per layer
	std::vector<struct tt_gio_batch *> b;
	std::vector<cudaEvent_t> ev_io, ev_done;
	cudaEvent_t ev_begin;		// the lists' upload (h_stage reusable)
	std::vector<uint8_t> st;
	unsigned hung;			// hang reports made for it
	bool fenced;			// the watchdog fenced the path for it (wd_mu)
};

// Work in flight on the GPU (the lists' upload, a layer), watched until its
// event completes: a hang is caught whoever waits for it, the store (wait,
// finish) or only a compute stream ordered after it (order()).
struct gp_flight {
	struct gp_txn *t;
	uint32_t layer;
	cudaEvent_t ev;
	const char *what;
	std::chrono::steady_clock::time_point since;
	bool fenced;			// the watchdog fenced the path for it
	bool stuck_said;		// ... and said the fence did not bring it back
};

struct tt_gio_path {
	struct tt_gio *g;
	struct tt_emu *emu;		// owned when set
	int own_gio;
	struct tt_store *store;		// set as this store's data path
	uint32_t nsid_base;
	uint32_t lba_shift;
	cudaStream_t io, sum;
	struct gp_txn *pool;
	// A wait longer than this (TUTTI_GIO_WAIT_TIMEOUT_S, default
	// GP_WAIT_TIMEOUT_S) makes the watchdog dump the state on stderr and
	// fence the path (gio_path_hang.cuh).
	double wait_timeout_s;
	int device;
	std::atomic<bool> dead;		// fenced: refuses new transactions
	std::mutex wd_mu;		// the watchdog's state below
	std::condition_variable wd_cv;
	std::vector<struct gp_flight> flights;
	bool wd_stop;
	std::thread watchdog;
};

#define GP_WAIT_TIMEOUT_S 60.0	// a healthy layer takes milliseconds
#define GP_DRAIN_S 10.0		// for the aborted commands to come back

// Fold a layer's command status into per-block flags and a layer count.
// Command k of a layer batch is (block k / n_spans, span k % n_spans).
__global__ void gp_status_kernel(const uint16_t *st, uint32_t ncmd, uint32_t spans,
				 unsigned *blk_err, unsigned *layer_err)
{
	for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < ncmd;
	     k += gridDim.x * blockDim.x) {
		if (st[k]) {
			atomicOr(&blk_err[k / spans], 1u);
			atomicAdd(layer_err, 1u);
		}
	}
}

static int gp_err(cudaError_t e)
{
	if (e == cudaSuccess)
		return 0;
	cudaGetLastError();
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

static void gp_txn_destroy(struct gp_txn *t)
{
	for (struct tt_gio_batch *b : t->b)
		tt_gio_batch_destroy(b);
	for (cudaEvent_t e : t->ev_io)
		cudaEventDestroy(e);
	for (cudaEvent_t e : t->ev_done)
		cudaEventDestroy(e);
	if (t->ev_begin)
		cudaEventDestroy(t->ev_begin);
	cudaFree(t->d_slots);
	cudaFree(t->d_ids);
	cudaFree(t->d_sums);
	cudaFree(t->d_err);
	cudaFreeHost(t->h_stage);
	cudaFreeHost(t->h_lerr);
	delete t;
}

static int gp_txn_alloc(struct tt_gio_path *p, const struct tt_geometry *geo,
			unsigned cap, struct gp_txn **out)
{
	struct gp_txn *t = new (std::nothrow) gp_txn();
	uint32_t L = geo->n_layers, R = tt_objs_per_slot(geo);
	int rc;

	if (!t)
		return -ENOMEM;
	t->p = p;
	t->geo = *geo;
	t->cap = cap;
	t->b.assign(L, nullptr);
	t->ev_io.assign(L, nullptr);
	t->ev_done.assign(L, nullptr);
	t->st.assign(L, GP_IDLE);
	rc = gp_err(cudaMalloc(&t->d_slots, (size_t)cap * sizeof(uint64_t)));
	if (!rc)
		rc = gp_err(cudaMalloc(&t->d_ids, (size_t)cap * sizeof(uint32_t)));
	if (!rc)
		rc = gp_err(cudaMalloc(&t->d_sums, (size_t)cap * R * sizeof(uint64_t)));
	if (!rc)
		rc = gp_err(cudaMalloc(&t->d_err, ((size_t)cap + L) * sizeof(unsigned)));
	if (!rc)
		rc = gp_err(cudaHostAlloc(&t->h_stage, (size_t)cap * 12, cudaHostAllocDefault));
	if (!rc)
		rc = gp_err(cudaHostAlloc(&t->h_lerr, L * sizeof(unsigned), cudaHostAllocDefault));
	if (!rc)
		rc = gp_err(cudaEventCreateWithFlags(&t->ev_begin, cudaEventDisableTiming));
	for (uint32_t l = 0; l < L && !rc; l++) {
		rc = tt_gio_batch_create(p->g, cap * geo->n_spans, &t->b[l]);
		if (!rc)
			rc = gp_err(cudaEventCreateWithFlags(&t->ev_io[l], cudaEventDisableTiming));
		if (!rc)
			rc = gp_err(cudaEventCreateWithFlags(&t->ev_done[l], cudaEventDisableTiming));
	}
	if (rc) {
		gp_txn_destroy(t);
		return rc;
	}
	*out = t;
	return 0;
}

// A pooled state that fits @nm moving blocks of @geo, or a new one.
// Bounded waits: the watchdog, the report and the fence of a hang.
#include "gio_path_hang.cuh"

static int gp_txn_get(struct tt_gio_path *p, const struct tt_geometry *geo, unsigned nm,
		      struct gp_txn **out)
{
	unsigned want = nm ? nm : 1;

	for (struct gp_txn **pp = &p->pool; *pp; pp = &(*pp)->next) {
		struct gp_txn *t = *pp;

		if (t->cap >= want && !std::memcmp(&t->geo, geo, sizeof(*geo))) {
			*pp = t->next;
			*out = t;
			return 0;
		}
	}
	// Round up so a workload of varying sizes settles on a few states.
	unsigned cap = 64;

	while (cap < want)
		cap *= 2;
	return gp_txn_alloc(p, geo, cap, out);
}

static int gp_begin(void *ctx, const struct tt_devpath_txn *ti, void **txn)
{
	struct tt_gio_path *p = (struct tt_gio_path *)ctx;
	const struct tt_geometry *g = ti->geo;
	struct gp_txn *t;
	unsigned nm = 0;
	uint64_t *hs;
	uint32_t *hi;
	int rc;

	if (p->dead.load())
		return tt_seterr(-EIO, "gio path: fenced after a transaction hung (report on "
				 "stderr); close the store's GPU path and open it again");
	if (g->n_spans == 0 || g->n_spans > TT_GPU_SUM_MAX_SPANS ||
	    (g->span_bytes & ((1u << p->lba_shift) - 1)))
		return -EINVAL;
	for (unsigned i = 0; i < ti->n; i++)
		nm += ti->slots[i] >= 0;
	rc = gp_txn_get(p, g, nm, &t);
	if (rc)
		return rc;
	t->write = ti->write;
	t->hung = 0;
	t->fenced = false;
	t->n = ti->n;
	t->nm = nm;
	t->moved.clear();
	t->st.assign(g->n_layers, GP_IDLE);
	hs = (uint64_t *)t->h_stage;
	hi = (uint32_t *)(t->h_stage + (size_t)t->cap * 8);
	for (unsigned i = 0; i < ti->n; i++) {
		if (ti->slots[i] < 0)
			continue;
		hs[t->moved.size()] = (uint64_t)ti->slots[i];
		hi[t->moved.size()] = ti->block_ids[i];
		t->moved.push_back(i);
	}
	std::memset(t->h_lerr, 0, g->n_layers * sizeof(unsigned));
	// The lists go up once; every layer of the transaction reuses them.
	rc = gp_err(cudaMemcpyAsync(t->d_slots, hs, (size_t)nm * 8, cudaMemcpyHostToDevice, p->io));
	if (!rc)
		rc = gp_err(cudaMemcpyAsync(t->d_ids, hi, (size_t)nm * 4, cudaMemcpyHostToDevice,
					    p->io));
	if (!rc)
		rc = gp_err(cudaMemsetAsync(t->d_err, 0, ((size_t)t->cap + g->n_layers) * 4, p->io));
	if (!rc)
		rc = gp_err(cudaEventRecord(t->ev_begin, p->io));
	if (rc) {
		cudaStreamSynchronize(p->io);
		t->next = p->pool;
		p->pool = t;
		return rc;
	}
	gp_fly(t, 0, t->ev_begin, "the lists' upload (begin)");
	*txn = t;
	return 0;
}

// The layer's memory as gio_uring's one base + block stride + span stride.
static int gp_layer_shape(const struct gp_txn *t, uint32_t layer, const struct tt_memmap *mem,
			  struct tt_gio_layer *gl, struct tt_gpu_sum_layer *sd)
{
	const struct tt_geometry *g = &t->geo;
	uint32_t m0 = tt_obj_index(g, layer, 0);
	uint64_t b0 = mem->base[m0], bs = mem->stride[m0];
	uint64_t ss = g->n_spans > 1 ? mem->base[m0 + 1] - b0 : 0;

	std::memset(sd, 0, sizeof(*sd));
	for (uint32_t k = 0; k < g->n_spans; k++) {
		uint32_t m = tt_obj_index(g, layer, k);

		if (mem->stride[m] != bs || mem->base[m] != b0 + k * ss)
			return -EINVAL;
		sd->base[k] = mem->base[m];
		sd->stride[k] = mem->stride[m];
	}
	sd->geo = *g;
	sd->layer = layer;
	sd->n_blocks = t->nm;
	sd->block_ids = t->d_ids;
	sd->skip = nullptr;
	sd->sums = t->d_sums;

	std::memset(gl, 0, sizeof(*gl));
	gl->geo = *g;
	gl->layer = layer;
	gl->n_blocks = t->nm;
	gl->slots = t->d_slots;
	gl->block_ids = t->d_ids;
	gl->base = b0;
	gl->block_stride = bs;
	gl->span_stride = ss;
	gl->nsid_base = t->p->nsid_base;
	gl->op = t->write ? TT_NVME_CMD_WRITE : TT_NVME_CMD_READ;
	return 0;
}

// Command status -> block flags and layer count, then the count to the host.
static int gp_judge(struct gp_txn *t, uint32_t layer, cudaStream_t s)
{
	uint32_t ncmd = t->nm * t->geo.n_spans;
	unsigned grid = (ncmd + 255) / 256 < 1024 ? (ncmd + 255) / 256 : 1024;
	unsigned *lerr = t->d_err + t->cap + layer;

	return gp_err(tt_launch(gp_status_kernel, grid, 256, s, tt_gio_batch_status(t->b[layer]), ncmd,
				t->geo.n_spans, t->d_err, lerr));
}

static int gp_layer(void *txn, uint32_t layer, const struct tt_memmap *mem)
{
	struct gp_txn *t = (struct gp_txn *)txn;
	struct tt_gio_path *p = t->p;
	struct tt_gio_layer gl;
	struct tt_gpu_sum_layer sd;
	cudaStream_t done_on = p->io;
	int rc;

	if (layer >= t->geo.n_layers || t->st[layer] != GP_IDLE)
		return -EINVAL;
	if (t->nm == 0) {
		t->st[layer] = GP_SUBMITTED;
		return gp_err(cudaEventRecord(t->ev_done[layer], p->io));	// nothing to watch
	}
	rc = gp_layer_shape(t, layer, mem, &gl, &sd);
	if (!rc)
		rc = tt_gio_prep_layer(t->b[layer], &gl);
	if (rc)
		return rc;
	// Writes: hashed before any command is built (both only read memory).
	if (t->write)
		rc = tt_gpu_sum_layer(&sd, p->io);
	if (!rc)
		rc = tt_gio_submit_wait(p->g, t->b[layer], p->io);
	if (!rc)
		rc = gp_judge(t, layer, p->io);
	if (!rc && !t->write) {
		rc = gp_err(cudaEventRecord(t->ev_io[layer], p->io));
		if (!rc)
			rc = gp_err(cudaStreamWaitEvent(p->sum, t->ev_io[layer], 0));
		if (!rc) {
			done_on = p->sum;
			rc = tt_gpu_sum_layer(&sd, p->sum);
		}
	}
	if (!rc)
		rc = gp_err(cudaMemcpyAsync(&t->h_lerr[layer], t->d_err + t->cap + layer,
					    sizeof(unsigned), cudaMemcpyDeviceToHost, done_on));
	// Even a failed layer gets its event: end() waits for what did start.
	cudaEventRecord(t->ev_done[layer], done_on);
	gp_fly(t, layer, t->ev_done[layer], "layer");
	t->st[layer] = rc ? GP_FAILED : GP_SUBMITTED;
	return rc;
}

static int gp_order(void *txn, uint32_t layer, struct CUstream_st *stream)
{
	struct gp_txn *t = (struct gp_txn *)txn;

	if (layer >= t->geo.n_layers || t->st[layer] != GP_SUBMITTED)
		return -EINVAL;
	return gp_err(cudaStreamWaitEvent((cudaStream_t)stream, t->ev_done[layer], 0));
}

static int gp_wait(void *txn, uint32_t layer)
{
	struct gp_txn *t = (struct gp_txn *)txn;
	int rc;

	if (layer >= t->geo.n_layers || t->st[layer] == GP_IDLE)
		return -EINVAL;
	rc = gp_block(t, t->ev_done[layer], layer, "wait");
	if (rc == -ETIMEDOUT)
		return rc;
	if (rc || t->st[layer] == GP_FAILED)
		return -EIO;
	return t->h_lerr[layer] ? -EIO : 0;
}

// Every event of the transaction done: 0, -EIO, or -ETIMEDOUT when the
// watchdog fenced one of its waits.
static int gp_sync_all(struct gp_txn *t)
{
	int rc = gp_block(t, t->ev_begin, 0, "the lists' upload (begin)");

	if (rc == -ETIMEDOUT)
		return rc;
	for (uint32_t l = 0; l < t->geo.n_layers; l++) {
		int r;

		if (t->st[l] == GP_IDLE)
			continue;
		r = gp_block(t, t->ev_done[l], l, "finish/abort");
		if (r == -ETIMEDOUT)
			return r;
		if (r)
			rc = -EIO;
	}
	return rc;
}

static int gp_collect(void *txn, int32_t *status, uint64_t *sums)
{
	struct gp_txn *t = (struct gp_txn *)txn;
	const struct tt_geometry *g = &t->geo;
	uint32_t R = tt_objs_per_slot(g);
	std::vector<unsigned> err(t->nm ? t->nm : 1);
	std::vector<uint64_t> hs((size_t)(t->nm ? t->nm : 1) * R);
	int rc = gp_sync_all(t);

	if (!rc && t->nm)
		rc = gp_err(cudaMemcpyAsync(err.data(), t->d_err, (size_t)t->nm * 4,
					    cudaMemcpyDeviceToHost, t->p->io));
	if (!rc && t->nm)
		rc = gp_err(cudaMemcpyAsync(hs.data(), t->d_sums, (size_t)t->nm * R * 8,
					    cudaMemcpyDeviceToHost, t->p->io));
	if (!rc)
		rc = gp_err(cudaStreamSynchronize(t->p->io));
	if (rc)
		return rc;
	bool layer_failed = false;

	// A layer that failed as a whole moved none of its objects: every block
	// has one there, so each fails (an I/O error, never a checksum mismatch).
	for (uint32_t l = 0; l < g->n_layers; l++)
		layer_failed |= t->st[l] == GP_FAILED;
	for (unsigned i = 0; i < t->n; i++)
		status[i] = 0;
	for (unsigned j = 0; j < t->nm; j++) {
		unsigned i = t->moved[j];

		status[i] = err[j] || layer_failed ? -EIO : 0;
		for (uint32_t l = 0; l < g->n_layers; l++) {
			if (t->st[l] != GP_SUBMITTED)
				continue;
			for (uint32_t k = 0; k < g->n_spans; k++) {
				uint32_t m = tt_obj_index(g, l, k);

				sums[(size_t)i * R + m] = hs[(size_t)j * R + m];
			}
		}
	}
	return 0;
}

static void gp_end(void *txn)
{
	struct gp_txn *t = (struct gp_txn *)txn;

	// Returns once every event is done: after a fence, the aborted
	// commands came back and nothing moves into its memory any more.
	gp_sync_all(t);
	gp_land(t);
	t->next = t->p->pool;
	t->p->pool = t;
}

// Without waiting: has the layer's kernel finished (its hashes too)? A
// failed query counts as finished: gp_wait judges it, with the watchdog.
static int gp_poll(void *txn, uint32_t layer)
{
	struct gp_txn *t = (struct gp_txn *)txn;

	if (layer >= t->geo.n_layers || t->st[layer] != GP_SUBMITTED)
		return 1;
	return tt_cuda_reached(cudaEventQuery(t->ev_done[layer]));
}

extern "C" const struct tt_devpath_ops tt_devpath_gio = {
	"gio", gp_begin, gp_layer, gp_order, gp_wait, gp_collect, gp_end, nullptr, gp_poll,
};

// Load the kernels now: a first (lazy) load waits for the device to go
// idle, which a spinning gio kernel on another stream would postpone.
static int gp_preload(cudaStream_t s)
{
	struct tt_gpu_sum_layer sd = {};
	struct cudaFuncAttributes fa;
	uint32_t *d = nullptr;
	int rc = gp_err(cudaFuncGetAttributes(&fa, gp_status_kernel));

	if (!rc)
		rc = gp_err(cudaMalloc(&d, 4096));
	if (!rc)
		rc = gp_err(cudaMemsetAsync(d, 0, 4096, s));
	if (!rc) {
		sd.geo.n_layers = 1;
		sd.geo.n_spans = 1;
		sd.geo.span_bytes = 1024;
		sd.n_blocks = 1;
		sd.block_ids = d;
		sd.base[0] = (uint64_t)(uintptr_t)(d + 8);
		sd.sums = (uint64_t *)(uintptr_t)(d + 1000);
		rc = tt_gpu_sum_layer(&sd, s);
	}
	if (!rc)
		rc = gp_err(cudaStreamSynchronize(s));
	cudaFree(d);
	return rc;
}

// TUTTI_GIO_DEBUG: the streams this path and its controller made.
static void gp_log_streams(const struct tt_gio_path *p, const struct tt_emu *emu)
{
	unsigned ce = emu ? tt_emu_n_streams(emu) : 0;

	std::fprintf(stderr, "tutti gio_path: streams: path 2 (io, sum)%s%u (its own CUDA context); "
		     "CUDA_MODULE_LOADING=%s; wait timeout %.1f s\n",
		     emu ? " + its emulated controller " : " (no controller of its own) + ", ce,
		     gp_env("CUDA_MODULE_LOADING", "(unset: LAZY)"),
		     p->wait_timeout_s);
	std::fflush(stderr);
}

static int gp_open(struct tt_gio *g, uint32_t nsid_base, uint32_t lba_shift,
		   const struct tt_emu *emu, struct tt_gio_path **out)
{
	struct tt_gio_path *p;
	const char *to = std::getenv("TUTTI_GIO_WAIT_TIMEOUT_S");
	int rc;

	*out = nullptr;
	if (!g || nsid_base == 0 || (lba_shift != 9 && lba_shift != 12))
		return -EINVAL;
	p = new (std::nothrow) tt_gio_path();
	if (!p)
		return -ENOMEM;
	p->g = g;
	p->nsid_base = nsid_base;
	p->lba_shift = lba_shift;
	p->wait_timeout_s = GP_WAIT_TIMEOUT_S;
	if (to && *to) {
		char *end;
		double v = std::strtod(to, &end);

		// No wait is unbounded: 0, a negative or a typo keeps the default.
		if (*end || !(v > 0) || !(v < 1e6))
			std::fprintf(stderr, "tutti gio_path: TUTTI_GIO_WAIT_TIMEOUT_S=%s is not a "
				     "positive number of seconds; using %.0f\n", to, GP_WAIT_TIMEOUT_S);
		else
			p->wait_timeout_s = v;
	}
	p->dead.store(false);
	rc = gp_err(cudaGetDevice(&p->device));
	if (!rc)
		rc = gp_err(cudaStreamCreateWithFlags(&p->io, cudaStreamNonBlocking));
	if (!rc)
		rc = gp_err(cudaStreamCreateWithFlags(&p->sum, cudaStreamNonBlocking));
	if (!rc)
		rc = gp_preload(p->io);
	// A dump during a hang then allocates nothing.
	if (!rc && tt_gio_dump_prepare())
		std::fprintf(stderr, "tutti gio_path: no pinned memory for a hang dump\n");
	if (rc) {
		tt_gio_path_close(p);
		return rc;
	}
	gp_watchdog_start(p);
	if (std::getenv("TUTTI_GIO_DEBUG"))
		gp_log_streams(p, emu);
	*out = p;
	return 0;
}

extern "C" int tt_gio_path_open(struct tt_gio *g, uint32_t nsid_base, uint32_t lba_shift,
				struct tt_gio_path **out)
{
	return gp_open(g, nsid_base, lba_shift, nullptr, out);
}

extern "C" void tt_gio_path_close(struct tt_gio_path *p)
{
	if (!p)
		return;
	gp_watchdog_stop(p);
	if (p->store)
		tt_store_set_devpath(p->store, nullptr, nullptr);
	while (p->pool) {
		struct gp_txn *t = p->pool;

		p->pool = t->next;
		gp_txn_destroy(t);
	}
	if (p->io)
		cudaStreamDestroy(p->io);
	if (p->sum)
		cudaStreamDestroy(p->sum);
	if (p->own_gio)
		tt_gio_close(p->g);
	tt_emu_close(p->emu);
	delete p;
}

extern "C" struct tt_emu *tt_gio_path_emu(const struct tt_gio_path *p)
{
	return p->emu;
}

extern "C" int tt_gio_path_open_emu(struct tt_store *s, const struct tt_gio_path_params *pp,
				    struct tt_gio_path **out)
{
	const struct tt_geometry *geo = tt_store_geometry(s);
	struct tt_gio_path_params p = {};
	struct tt_emu_params ep = {};
	struct tt_gio_params gp = {};
	struct tt_emu *emu = nullptr;
	struct tt_gio *g = nullptr;
	struct tt_gio_path *path = nullptr;
	int fds[TT_MAX_MEMBERS], ndev = 0, rc;
	uint64_t bytes;
	uint32_t lba;

	*out = nullptr;
	if (pp)
		p = *pp;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		cudaGetLastError();
		return -ENODEV;
	}
	if (geo->span_bytes % 4096 == 0)
		lba = 12;
	else if (geo->span_bytes % 512 == 0)
		lba = 9;
	else
		return -EINVAL;
	ep.n_ns = (unsigned)tt_store_member_fds(s, fds, &bytes);
	ep.n_queues = p.n_queues ? p.n_queues : 8;
	ep.depth = p.depth ? p.depth : 256;
	ep.n_threads = p.n_threads ? p.n_threads : 4;
	ep.backing = TT_EMU_FILE;
	ep.ns_bytes = bytes >> lba << lba;
	ep.lba_shift = lba;
	ep.fds = fds;
	ep.sgls = p.prp_only ? 0 : TT_NVME_SGLS_BYTE_ALIGNED;
	// PRP list pages for one object (an entry per 4 KiB page, 511 a page).
	ep.list_chunks = 1 + geo->span_bytes / (4096u * 511u) + 1;
	ep.rate_gbps = p.rate_gbps;
	rc = tt_emu_open(&ep, &emu);
	if (!rc) {
		gp.n_queues = ep.n_queues;
		gp.qmem = tt_emu_qmem(emu);
		tt_emu_caps(emu, &gp.caps);
		gp.lba_shift = lba;
		gp.warps_per_queue = p.warps_per_queue;
		rc = tt_gio_open(&gp, &g);
	}
	if (!rc)
		rc = gp_open(g, 1, lba, emu, &path);
	if (rc) {
		tt_gio_close(g);
		tt_emu_close(emu);
		return rc;
	}
	path->emu = emu;
	path->own_gio = 1;
	rc = tt_store_set_devpath(s, &tt_devpath_gio, path);
	if (rc) {
		tt_gio_path_close(path);
		return rc;
	}
	path->store = s;
	*out = path;
	return 0;
}
