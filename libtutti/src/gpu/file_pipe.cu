// SPDX-License-Identifier: Apache-2.0
//
// file_pipe.cu - the pipeline behind the staged and GDS data paths.
//
// At begin, each layer's objects are sorted in disk order and cut into runs
// (jobs) of objects adjacent on one member. A submitted layer goes into a
// ring that every I/O thread walks in order: a thread takes the layer's
// jobs one at a time (an atomic counter), moves each through one of its
// chunks, and when none is left records an event on its stream and makes
// the layer's completion stream wait for it. The last thread to leave a
// layer hashes it there (reads) and records the layer's event: the layer
// has landed when that event has, with no CPU round trip for the GPU side.
// A thread never waits for the others, so it runs on into the next layer.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <new>

#include <unistd.h>

#include "tutti/error.h"
#include "file_pipe.cuh"
#include "gpu_launch.cuh"

#define FP_THREADS	256

struct fp_move {
	const uint32_t *tags;
	const uint32_t *ids;
	uint64_t base[TT_GPU_SUM_MAX_SPANS];
	uint64_t stride[TT_GPU_SUM_MAX_SPANS];
	uint32_t n_spans;
	uint32_t span_bytes;
	uint32_t obj_stride;
};

// One CTA per object: chunk slot j <-> its paged block. Writes zero the
// padding so the bytes on disk do not depend on stale staging memory.
__global__ void fp_move_kernel(char *chunk, struct fp_move a, int to_paged)
{
	uint32_t j = blockIdx.x, tag = a.tags[j];
	uint32_t i = tag / a.n_spans, k = tag % a.n_spans;
	char *pg = (char *)(a.base[k] + (uint64_t)a.ids[i] * a.stride[k]);
	char *st = chunk + (uint64_t)j * a.obj_stride;
	char *dst = to_paged ? pg : st;
	const char *src = to_paged ? st : pg;

	if (((uintptr_t)dst | (uintptr_t)src | a.span_bytes) % 16 == 0) {
		uint4 *d = (uint4 *)dst;
		const uint4 *s = (const uint4 *)src;

		for (uint32_t x = threadIdx.x; x < a.span_bytes / 16; x += blockDim.x)
			d[x] = s[x];
	} else {
		for (uint32_t x = threadIdx.x; x < a.span_bytes; x += blockDim.x)
			dst[x] = src[x];
	}
	if (!to_paged)
		for (uint32_t x = a.span_bytes + threadIdx.x; x < a.obj_stride; x += blockDim.x)
			st[x] = 0;
}

static void job_fail(struct fp_layer *ly, const struct fp_job *j, int err)
{
	struct fp_txn *t = ly->t;

	for (uint32_t x = j->first; x < j->first + j->count; x++)
		__atomic_store_n(&t->status[ly->tags[x] / t->geo.n_spans], -EIO, __ATOMIC_RELAXED);
	fp_set_err(&ly->err, err);
}

static int launch_move(struct fp_layer *ly, const struct fp_job *j, struct fp_chunk *c,
		       cudaStream_t s, int to_paged)
{
	struct fp_txn *t = ly->t;
	struct fp_move a;

	a.tags = ly->dtags + j->first;
	a.ids = t->d_ids;
	memcpy(a.base, ly->base, sizeof(a.base));
	memcpy(a.stride, ly->stride, sizeof(a.stride));
	a.n_spans = t->geo.n_spans;
	a.span_bytes = t->geo.span_bytes;
	a.obj_stride = t->geo.obj_stride;
	return tt_launch(fp_move_kernel, j->count, FP_THREADS, s, (char *)c->dev, a, to_paged) ==
			       cudaSuccess ? 0 : -EIO;
}

static void read_layer(struct tt_file_path *fp, struct fp_worker *w, struct fp_layer *ly)
{
	const struct fp_backend *be = fp->be;
	uint32_t x;

	while ((x = ly->next_job.fetch_add(1)) < ly->n_jobs) {
		const struct fp_job *j = &ly->jobs[x];
		struct fp_chunk *c = &w->chunks[w->next++ % fp->depth];
		uint64_t t0 = fp_ns(), t1 = t0, t2 = t0;
		int ret = -EIO;

		// The chunk's last copy and scatter must be done before reuse.
		if (cudaEventSynchronize(c->ev) != cudaSuccess)
			goto fail;
		t1 = fp_ns();
		ret = be->get(ly->t, c, j);
		t2 = fp_ns();
		if (!ret && be->to_dev)
			ret = be->to_dev(c, j->len, w->s);
		if (!ret)
			ret = launch_move(ly, j, c, w->s, 1);
		if (!ret && cudaEventRecord(c->ev, w->s) != cudaSuccess)
			ret = -EIO;
		fp_count(&w->ns[FP_T_WAIT], t1 - t0);
		fp_count(&w->ns[FP_T_GET], t2 - t1);
		fp_count(&w->ns[FP_T_QUEUE], fp_ns() - t2);
		fp_count(&w->runs, 1);
		fp_count(&w->bytes, j->len);
		if (!ret)
			continue;
fail:
		job_fail(ly, j, ret);
	}
}

static void put_job(struct tt_file_path *fp, struct fp_worker *w, struct fp_layer *ly,
		    struct fp_chunk *c, const struct fp_job *j)
{
	uint64_t t0 = fp_ns(), t1;
	int ret = cudaEventSynchronize(c->ev) == cudaSuccess ? 0 : -EIO;

	t1 = fp_ns();
	if (fp->trace)
		fp_count(&ly->tr_wait, t1 - t0);
	if (!ret)
		ret = fp->be->put(ly->t, c, j);
	fp_count(&w->ns[FP_T_WAIT], t1 - t0);
	fp_count(&w->ns[FP_T_PUT], fp_ns() - t1);
	fp_count(&w->runs, 1);
	fp_count(&w->bytes, j->len);
	if (ret)
		job_fail(ly, j, ret);
}

// Put the @k oldest of a writing thread's @n runs in flight, in order.
static void put_oldest(struct tt_file_path *fp, struct fp_worker *w, struct fp_layer *ly,
		       struct fp_chunk **pc, const struct fp_job **pj, unsigned *n, unsigned k)
{
	for (unsigned q = 0; q < k; q++)
		put_job(fp, w, ly, pc[q], pj[q]);
	std::copy(pc + k, pc + *n, pc);
	std::copy(pj + k, pj + *n, pj);
	*n -= k;
}

// Runs gathered and copied out ahead of the oldest one's put (up to
// write_ahead beyond it, with the chunks that leaves free). Mapped members'
// puts are no-ops, so the runs stay queued back to back on the GPU; with one
// run ahead (the rule before) every run waited out a host round trip.
static void write_layer(struct tt_file_path *fp, struct fp_worker *w, struct fp_layer *ly)
{
	const struct fp_backend *be = fp->be;
	const struct fp_job *pj[FP_MAX_AHEAD + 1];
	struct fp_chunk *pc[FP_MAX_AHEAD + 1];
	unsigned n = 0;
	uint32_t x;

	while ((x = ly->next_job.fetch_add(1)) < ly->n_jobs) {
		const struct fp_job *j = &ly->jobs[x];
		struct fp_chunk *c = &w->chunks[w->next++ % fp->depth];
		uint64_t t0;
		int ret;

		// A chunk is reused only once its last run is put (puts go in order).
		for (unsigned k = 0; k < n; k++)
			if (pc[k] == c) {
				put_oldest(fp, w, ly, pc, pj, &n, k + 1);
				break;
			}
		t0 = fp_ns();
		ret = launch_move(ly, j, c, w->s, 0);
		if (!ret && be->from_dev)
			ret = be->from_dev(ly->t, c, j, w->s);
		if (!ret && cudaEventRecord(c->ev, w->s) != cudaSuccess)
			ret = -EIO;
		fp_count(&w->ns[FP_T_QUEUE], fp_ns() - t0);
		if (fp->trace)
			fp_count(&ly->tr_queue, fp_ns() - t0);
		if (ret) {
			job_fail(ly, j, ret);
			continue;
		}
		pc[n] = c;
		pj[n++] = j;
		if (n > fp->write_ahead)
			put_oldest(fp, w, ly, pc, pj, &n, 1);
	}
	put_oldest(fp, w, ly, pc, pj, &n, n);
}

int fp_layer_sum(struct fp_layer *ly)
{
	struct fp_txn *t = ly->t;
	struct tt_gpu_sum_layer d;

	memset(&d, 0, sizeof(d));
	d.geo = t->geo;
	d.layer = ly->layer;
	d.n_blocks = t->n;
	d.block_ids = t->d_ids;
	d.skip = t->d_skip;
	memcpy(d.base, ly->base, sizeof(d.base));
	memcpy(d.stride, ly->stride, sizeof(d.stride));
	d.sums = t->d_sums;
	return tt_gpu_sum_layer(&d, ly->sum);
}

// Last thread out of a layer. No CUDA call is made under fp->mu: a launch
// blocks while the device's launch queue is full (a 32K-token prefill runs
// the caller ~850 ms ahead of the GPU on the H200), and under the lock one
// blocked launch held up every thread, submission and poll of the path.
static void layer_finish(struct tt_file_path *fp, struct fp_layer *ly)
{
	int ret = 0;

	if (!ly->t->write && ly->n_objs)
		ret = fp_layer_sum(ly);
	if (!ret && cudaEventRecord(ly->ev, ly->sum) != cudaSuccess)
		ret = -EIO;
	if (ret)
		fp_set_err(&ly->err, -EIO);
	if (fp->trace) {
		uint64_t now = fp_ns();

		fprintf(stderr, "fp-trace %.3f %s L%u jobs %u: started %.3f ms after submit, "
			"done %.3f ms after; threads queued %.3f ms, waited %.3f ms for copies\n",
			(now - fp->tr_origin) / 1e6, ly->t->write ? "write" : "read", ly->layer,
			ly->n_jobs, ly->tr_start ? (ly->tr_start - ly->tr_sub) / 1e6 : 0.0,
			(now - ly->tr_sub) / 1e6, ly->tr_queue / 1e6, ly->tr_wait / 1e6);
	}
	{
		std::lock_guard<std::mutex> lk(fp->mu);

		ly->done = 1;
	}
	fp->cv_done.notify_all();
}

static void worker_main(struct tt_file_path *fp, struct fp_worker *w)
{
	unsigned idx = (unsigned)(w - fp->w.data());
	cudaSetDevice(fp->device);	// before the lock: may create the context

	std::unique_lock<std::mutex> lk(fp->mu);

	for (;;) {
		struct fp_layer *ly;
		uint64_t t0 = fp_ns();
		bool last;

		fp->cv_work.wait(lk, [&] { return fp->stop || w->cursor != fp->tail; });
		// Only the part since the counters were last reset.
		t0 = std::max(t0, __atomic_load_n(&fp->reset_ns, __ATOMIC_RELAXED));
		fp_count(&w->ns[FP_T_IDLE], fp_ns() - t0);
		if (w->cursor == fp->tail)
			break;
		ly = fp->ring[w->cursor % FP_RING];
		// A thread the transaction does not use passes its layers
		// without a CUDA call.
		if (!ly->t->workers || idx < ly->t->workers) {
			if (fp->trace && !ly->tr_start)
				ly->tr_start = fp_ns();
			lk.unlock();
			if (ly->t->write)
				write_layer(fp, w, ly);
			else
				read_layer(fp, w, ly);
			if (cudaEventRecord(w->ev, w->s) != cudaSuccess ||
			    cudaStreamWaitEvent(ly->sum, w->ev, 0) != cudaSuccess)
				fp_set_err(&ly->err, -EIO);
			lk.lock();
		}
		last = ++ly->passed == fp->n_workers;
		w->cursor++;
		if (last) {
			lk.unlock();
			layer_finish(fp, ly);
			lk.lock();
		}
		fp->cv_done.notify_all();	// ring room
	}
}

static void fp_free(struct tt_file_path *fp)
{
	{
		std::lock_guard<std::mutex> lk(fp->mu);
		fp->stop = 1;
	}
	fp->cv_work.notify_all();
	for (struct fp_worker &w : fp->w)
		if (w.th.joinable())
			w.th.join();
	if (fp->be->fini)
		fp->be->fini(fp);
	for (struct fp_worker &w : fp->w) {
		for (struct fp_chunk &c : w.chunks) {
			if (c.ev)
				cudaEventDestroy(c.ev);
			cudaFree(c.dev);
			tt_pinned_free(&c.host_mem);
		}
		if (w.ev)
			cudaEventDestroy(w.ev);
		if (w.s)
			cudaStreamDestroy(w.s);
	}
	for (unsigned q = 0; q < FP_SUM_STREAMS; q++)
		if (fp->sum[q])
			cudaStreamDestroy(fp->sum[q]);
	if (fp->ctl)
		cudaStreamDestroy(fp->ctl);
	if (fp->pool)
		cudaMemPoolDestroy(fp->pool);
	delete fp;
}

void tt_file_path_close(struct tt_file_path *fp)
{
	if (fp)
		fp_free(fp);
}

static uint64_t take(uint64_t *ctr, int reset)
{
	return reset ? __atomic_exchange_n(ctr, 0, __ATOMIC_RELAXED)
		     : __atomic_load_n(ctr, __ATOMIC_RELAXED);
}

void tt_file_path_get_stats(struct tt_file_path *fp, struct tt_file_path_stats *st, int reset)
{
	memset(st, 0, sizeof(*st));
	if (reset)
		__atomic_store_n(&fp->reset_ns, fp_ns(), __ATOMIC_RELAXED);
	for (struct fp_worker &w : fp->w) {
		uint64_t runs = take(&w.runs, reset);

		st->threads_busy += runs != 0;
		st->runs += runs;
		st->bytes += take(&w.bytes, reset);
		st->get_s += take(&w.ns[FP_T_GET], reset) / 1e9;
		st->put_s += take(&w.ns[FP_T_PUT], reset) / 1e9;
		st->chunk_wait_s += take(&w.ns[FP_T_WAIT], reset) / 1e9;
		st->queue_s += take(&w.ns[FP_T_QUEUE], reset) / 1e9;
		st->idle_s += take(&w.ns[FP_T_IDLE], reset) / 1e9;
	}
	st->begin_s = take(&fp->begin_ns, reset) / 1e9;
	st->layer_wait_s = take(&fp->layer_wait_ns, reset) / 1e9;
	st->n_threads = fp->n_workers;
	if (fp->be->stats)
		fp->be->stats(fp, st, reset);
}

// A measurement's switch: @name as a count in [1, @max], else @dflt.
static unsigned env_count(const char *name, unsigned dflt, unsigned max)
{
	const char *e = getenv(name);
	char *end;
	long v;

	if (!e || !*e)
		return dflt;
	v = strtol(e, &end, 10);
	if (*end || v < 1 || (unsigned long)v > max)
		return dflt;
	return (unsigned)v;
}

static int fp_alloc(struct tt_file_path *fp)
{
	const unsigned fl = cudaStreamNonBlocking;
	cudaMemPoolProps pp = {};
	uint64_t keep = UINT64_MAX;

	pp.allocType = cudaMemAllocationTypePinned;
	pp.location.type = cudaMemLocationTypeDevice;
	pp.location.id = fp->device;
	if (cudaMemPoolCreate(&fp->pool, &pp) != cudaSuccess) {
		fp->pool = nullptr;
		return -ENOMEM;
	}
	if (cudaMemPoolSetAttribute(fp->pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
		return -EIO;

	for (unsigned q = 0; q < FP_SUM_STREAMS; q++)
		if (cudaStreamCreateWithFlags(&fp->sum[q], fl) != cudaSuccess)
			return -EIO;
	if (cudaStreamCreateWithFlags(&fp->ctl, fl) != cudaSuccess)
		return -EIO;
	for (struct fp_worker &w : fp->w) {
		if (cudaStreamCreateWithFlags(&w.s, fl) != cudaSuccess ||
		    cudaEventCreateWithFlags(&w.ev, cudaEventDisableTiming) != cudaSuccess)
			return -EIO;
		w.chunks.resize(fp->depth);
		for (struct fp_chunk &c : w.chunks) {
			c = {};
			if (cudaEventCreateWithFlags(&c.ev, FP_EVENT) != cudaSuccess ||
			    cudaMalloc(&c.dev, fp->chunk_bytes) != cudaSuccess)
				return -ENOMEM;
			if (fp->be->host_chunks) {
				if (tt_pinned_alloc(&c.host_mem, fp->chunk_bytes,
						    cudaHostAllocPortable))
					return -ENOMEM;
				c.host = c.host_mem.host;
			}
		}
	}
	return 0;
}

// Load both kernels now. With lazy loading (CUDA's default) a kernel's
// first launch loads its module, which can wait for the device to go idle;
// from a worker, or from the caller's thread while the workers keep the
// copy engines busy (or another user's kernel waits on host threads, as
// the emulated controller's do), that stalls the pipeline or deadlocks.
static int fp_preload(struct tt_file_path *fp)
{
	struct cudaFuncAttributes fa;
	struct tt_gpu_sum_layer d;
	uint32_t *buf = nullptr;
	int ret = -EIO;

	if (cudaFuncGetAttributes(&fa, fp_move_kernel) != cudaSuccess ||
	    cudaMalloc(&buf, 8192) != cudaSuccess)
		goto out;
	// One 1 KiB object hashed for real: loads the hash kernel's module too.
	memset(&d, 0, sizeof(d));
	d.geo.n_layers = 1;
	d.geo.n_spans = 1;
	d.geo.span_bytes = 1024;
	d.geo.obj_stride = 4096;
	d.n_blocks = 1;
	d.block_ids = buf;		// block 0
	d.base[0] = (uint64_t)(uintptr_t)buf + 4096;
	d.sums = (uint64_t *)(buf + 16);
	if (cudaMemsetAsync(buf, 0, 8192, fp->ctl) == cudaSuccess &&
	    !tt_gpu_sum_layer(&d, fp->ctl) && cudaStreamSynchronize(fp->ctl) == cudaSuccess)
		ret = 0;
out:
	cudaFree(buf);
	return ret;
}

int fp_open(const struct tt_file_path_params *p, const struct fp_backend *be,
	    void *priv, struct tt_file_path **out)
{
	struct tt_file_path_params d = {};
	struct tt_file_path *fp;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int ret, prev;

	if (p)
		d = *p;
	if (!d.n_threads)
		d.n_threads = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (unsigned)ncpu;
	if (!d.chunk_bytes)
		d.chunk_bytes = 4u << 20;
	if (!d.depth)
		d.depth = 3;
	if (d.depth < 2 || d.n_threads > 256 || d.chunk_bytes % 4096 || d.map > TT_FILE_MAP_ANY)
		return tt_seterr(-EINVAL, "%s path: depth %u (>= 2), %u threads (<= 256), "
				 "chunk %u B (multiple of 4 KiB), map %u (<= %d)", be->name, d.depth,
				 d.n_threads, d.chunk_bytes, d.map, TT_FILE_MAP_ANY);
	if (d.device < 0 && cudaGetDevice(&d.device) != cudaSuccess)
		return tt_seterr(-EIO, "%s path: no CUDA device", be->name);
	fp = new (std::nothrow) tt_file_path();
	if (!fp)
		return tt_seterr(-ENOMEM, "%s path: out of memory", be->name);
	fp->be = be;
	fp->priv = priv;
	fp->device = d.device;
	fp->n_workers = d.n_threads;
	fp->depth = d.depth;
	fp->trace = getenv("TUTTI_FP_TRACE") != nullptr;
	fp->tr_origin = fp_ns();
	fp->write_ahead = std::min(d.depth - 1, FP_MAX_AHEAD);
	fp->write_ahead = env_count("TUTTI_FP_WRITE_AHEAD", fp->write_ahead, fp->write_ahead);
	fp->mapped_workers = env_count("TUTTI_FP_MAPPED_WORKERS", FP_MAPPED_WORKERS, d.n_threads);
	fp->chunk_bytes = d.chunk_bytes;
	fp->chunk_set = p && p->chunk_bytes;
	fp->threads_set = p && p->n_threads;
	fp->map = d.map;
	fp->w.resize(d.n_threads);
	// Streams, chunks and kernels belong to @device; the caller's current
	// device is put back before returning.
	if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(d.device) != cudaSuccess) {
		delete fp;
		return tt_seterr(-EIO, "%s path: cannot use CUDA device %d", be->name, d.device);
	}
	ret = fp_alloc(fp);
	if (ret) {
		tt_seterr(ret, "%s path: cannot allocate %u x %u chunks of %u B: %s", be->name,
			  d.n_threads, d.depth, d.chunk_bytes, cudaGetErrorString(cudaGetLastError()));
	} else if (fp_preload(fp)) {
		ret = tt_seterr(-EIO, "%s path: loading the kernels failed: %s", be->name,
				cudaGetErrorString(cudaGetLastError()));
	} else if (be->init) {
		ret = be->init(fp);
	}
	if (ret) {
		fp_free(fp);
		cudaSetDevice(prev);
		return ret;
	}
	for (struct fp_worker &w : fp->w)
		w.th = std::thread(worker_main, fp, &w);
	cudaSetDevice(prev);
	*out = fp;
	return 0;
}
