// SPDX-License-Identifier: Apache-2.0
//
// file_pipe_txn.cu - the devpath ops of the staged and GDS data paths
// (file_pipe.cuh): a transaction's layers are planned at begin (objects in
// disk order, cut into jobs of adjacent objects), queued to the I/O threads
// of file_pipe.cu per layer, ordered against compute by the layer's event,
// and their GPU checksums read back at collect.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <vector>

#include "tutti/error.h"
#include "cuda_query.cuh"
#include "file_pipe.cuh"

struct fp_obj {
	uint64_t off;
	uint32_t member;
	uint32_t tag;
};

// Sort a layer's objects in disk order and cut them into runs of at most @cap.
static void plan_layer(struct fp_txn *t, uint32_t l, uint32_t cap,
		       std::vector<struct fp_obj> &objs)
{
	const struct tt_geometry *g = &t->geo;
	uint32_t S = g->n_spans;
	uint32_t *tags = &t->tags[(size_t)l * t->n * S];

	objs.clear();
	for (unsigned i = 0; i < t->n; i++) {
		if (t->slots[i] < 0)
			continue;
		for (uint32_t k = 0; k < S; k++) {
			struct tt_extent e = tt_locate(g, (uint64_t)t->slots[i], l, k);

			objs.push_back({ e.off, e.member, i * S + k });
		}
	}
	std::sort(objs.begin(), objs.end(), [](const fp_obj &a, const fp_obj &b) {
		return a.member != b.member ? a.member < b.member : a.off < b.off;
	});
	for (uint32_t x = 0; x < objs.size(); x++) {
		struct fp_job *j = t->jobs.empty() ? nullptr : &t->jobs.back();

		tags[x] = objs[x].tag;
		if (x && j->member == objs[x].member && j->off + j->len == objs[x].off &&
		    j->len + g->obj_stride <= cap) {
			j->count++;
			j->len += g->obj_stride;
			continue;
		}
		t->jobs.push_back({ x, 1, objs[x].member, g->obj_stride, objs[x].off });
	}
	t->layers[l].n_objs = (uint32_t)objs.size();
}

static int txn_device(struct fp_txn *t, const uint32_t *ids)
{
	struct tt_file_path *fp = t->fp;
	size_t n = t->n ? t->n : 1, R = tt_objs_per_slot(&t->geo);
	size_t o_skip = n * 4, o_tags = (o_skip + n + 255) & ~(size_t)255;
	size_t o_sums = (o_tags + t->tags.size() * 4 + 255) & ~(size_t)255;
	size_t bytes = o_sums + n * R * 8;
	std::vector<uint8_t> skip(n, 0);

	for (unsigned i = 0; i < t->n; i++)
		skip[i] = t->slots[i] < 0;
	// Stream-ordered: no device-wide synchronisation of the caller's work.
	if (cudaMallocFromPoolAsync(&t->dmem, bytes, fp->pool, fp->ctl) != cudaSuccess)
		return -ENOMEM;
	t->d_ids = (uint32_t *)t->dmem;
	t->d_skip = (uint8_t *)t->dmem + o_skip;
	t->d_tags = (uint32_t *)((char *)t->dmem + o_tags);
	t->d_sums = (uint64_t *)((char *)t->dmem + o_sums);
	if ((t->n && cudaMemcpyAsync(t->d_ids, ids, t->n * 4, cudaMemcpyHostToDevice, fp->ctl)) ||
	    cudaMemcpyAsync(t->d_skip, skip.data(), n, cudaMemcpyHostToDevice, fp->ctl) ||
	    (!t->tags.empty() && cudaMemcpyAsync(t->d_tags, t->tags.data(), t->tags.size() * 4,
						 cudaMemcpyHostToDevice, fp->ctl)) ||
	    cudaMemsetAsync(t->d_sums, 0, n * R * 8, fp->ctl) ||
	    cudaStreamSynchronize(fp->ctl))
		return -EIO;
	return 0;
}

static void txn_free(struct fp_txn *t)
{
	struct tt_file_path *fp = t->fp;

	for (struct fp_layer &ly : t->layers)
		if (ly.ev)
			cudaEventDestroy(ly.ev);
	if (t->dmem) {
		cudaFreeAsync(t->dmem, fp->ctl);
		cudaStreamSynchronize(fp->ctl);
	}
	delete t;
}

int fp_begin(void *ctx, const struct tt_devpath_txn *ti, void **out)
{
	struct tt_file_path *fp = (struct tt_file_path *)ctx;
	const struct tt_geometry *g = ti->geo;
	uint32_t L = g->n_layers, S = g->n_spans;
	uint64_t moved = 0;
	std::vector<struct fp_obj> objs;
	uint64_t t0 = fp_ns();
	struct fp_txn *t;
	uint32_t cap, be_cap, nw;
	int ret;

	if (S > TT_GPU_SUM_MAX_SPANS || g->n_members > TT_MAX_ENGINE_MEMBERS ||
	    g->obj_stride > fp->chunk_bytes || g->obj_stride % 4096)
		return tt_seterr(-EINVAL, "%s path: %u spans (<= %u), %u members, objects of "
				 "%u B (chunk %u B)", fp->be->name, S, TT_GPU_SUM_MAX_SPANS,
				 g->n_members, g->obj_stride, fp->chunk_bytes);
	t = new (std::nothrow) fp_txn();
	if (!t)
		return tt_seterr(-ENOMEM, "out of memory");
	t->fp = fp;
	t->geo = *g;
	t->write = ti->write;
	t->n = ti->n;
	memcpy(t->fds, ti->fds, g->n_members * sizeof(int));
	be_cap = fp->be->txn_plan ? fp->be->txn_plan(t) : 0;
	nw = t->workers ? t->workers : fp->n_workers;
	try {
		t->slots.assign(ti->slots, ti->slots + ti->n);
		t->status.assign(ti->n, 0);
		t->tags.resize((size_t)L * ti->n * S);
		t->layers = std::vector<struct fp_layer>(L);
		for (unsigned i = 0; i < ti->n; i++)
			moved += ti->slots[i] >= 0;
		// Enough runs per layer to keep every thread busy, none tiny.
		cap = (uint32_t)std::min<uint64_t>(be_cap ? be_cap : fp->chunk_bytes,
			std::max<uint64_t>(FP_MIN_RUN, moved * S * g->obj_stride / (2 * nw)));
		cap = std::max(cap / g->obj_stride * g->obj_stride, g->obj_stride);
		for (uint32_t l = 0; l < L; l++) {
			size_t first = t->jobs.size();

			plan_layer(t, l, cap, objs);
			t->layers[l].n_jobs = (uint32_t)(t->jobs.size() - first);
			t->layers[l].next_job = (uint32_t)first;	// index, fixed below
		}
	} catch (const std::bad_alloc &) {
		delete t;
		return tt_seterr(-ENOMEM, "out of memory");
	}
	for (uint32_t l = 0; l < L; l++) {
		struct fp_layer *ly = &t->layers[l];

		ly->t = t;
		ly->layer = l;
		ly->jobs = t->jobs.data() + ly->next_job.load();
		ly->next_job = 0;
		ly->tags = &t->tags[(size_t)l * t->n * S];
		if (cudaEventCreateWithFlags(&ly->ev, FP_EVENT) != cudaSuccess) {
			txn_free(t);
			return tt_seterr(-EIO, "%s path: cudaEventCreate failed", fp->be->name);
		}
	}
	ret = txn_device(t, ti->block_ids);
	if (ret) {
		txn_free(t);
		return tt_seterr(ret, "%s path: transaction setup failed (%s)", fp->be->name,
				 ret == -ENOMEM ? "device memory" : "CUDA");
	}
	// The backend's own reason (e.g. the cuFile error) stays in tt_errmsg().
	if (fp->be->txn_open && (ret = fp->be->txn_open(t))) {
		txn_free(t);
		return ret;
	}
	for (uint32_t l = 0; l < L; l++)
		t->layers[l].dtags = t->d_tags + (size_t)l * t->n * S;
	*out = t;
	fp_count(&fp->begin_ns, fp_ns() - t0);
	return 0;
}

int fp_layer(void *txn, uint32_t layer, const struct tt_memmap *mem)
{
	struct fp_txn *t = (struct fp_txn *)txn;
	struct tt_file_path *fp = t->fp;
	struct fp_layer *ly;
	uint32_t S = t->geo.n_spans;

	if (layer >= t->geo.n_layers || mem->n_layers != t->geo.n_layers || mem->n_spans != S)
		return tt_seterr(-EINVAL, "%s path: layer %u, memory map %u x %u", fp->be->name,
				 layer, mem->n_layers, mem->n_spans);
	ly = &t->layers[layer];
	if (ly->submitted)
		return tt_seterr(-EALREADY, "layer %u already submitted", layer);
	for (uint32_t k = 0; k < S; k++) {
		ly->base[k] = mem->base[tt_obj_index(&t->geo, layer, k)];
		ly->stride[k] = mem->stride[tt_obj_index(&t->geo, layer, k)];
	}
	ly->sum = fp->sum[__atomic_fetch_add(&fp->sum_next, 1, __ATOMIC_RELAXED) % FP_SUM_STREAMS];
	ly->tr_sub = fp->trace ? fp_ns() : 0;
	// Writes hash the bytes they are about to move, alongside the gathers
	// (launched without fp->mu: a launch may block, file_pipe.cu).
	if (t->write && ly->n_objs && fp_layer_sum(ly))
		return tt_seterr(-EIO, "%s path: hash kernel launch failed", fp->be->name);

	std::unique_lock<std::mutex> lk(fp->mu);
	fp->cv_done.wait(lk, [&] {
		uint64_t lo = fp->tail;

		for (struct fp_worker &w : fp->w)
			lo = std::min(lo, w.cursor);
		return fp->tail - lo < FP_RING;
	});
	ly->submitted = 1;
	fp->ring[fp->tail % FP_RING] = ly;
	fp->tail++;
	lk.unlock();
	fp->cv_work.notify_all();
	return 0;
}

// Wait until every run of @layer was moved and queued on the GPU.
static struct fp_layer *layer_queued(struct fp_txn *t, uint32_t layer)
{
	struct tt_file_path *fp = t->fp;
	struct fp_layer *ly;

	if (layer >= t->geo.n_layers || !t->layers[layer].submitted)
		return nullptr;
	ly = &t->layers[layer];
	std::unique_lock<std::mutex> lk(fp->mu);
	fp->cv_done.wait(lk, [&] { return ly->done != 0; });
	return ly;
}

int fp_order(void *txn, uint32_t layer, struct CUstream_st *stream)
{
	uint64_t t0 = fp_ns();
	struct fp_layer *ly = layer_queued((struct fp_txn *)txn, layer);

	fp_count(&((struct fp_txn *)txn)->fp->layer_wait_ns, fp_ns() - t0);
	if (!ly)
		return tt_seterr(-EINVAL, "layer %u was not submitted", layer);
	return cudaStreamWaitEvent(stream, ly->ev, 0) == cudaSuccess ? 0 : -EIO;
}

int fp_wait(void *txn, uint32_t layer)
{
	uint64_t t0 = fp_ns();
	struct fp_layer *ly = layer_queued((struct fp_txn *)txn, layer);
	int err;

	if (!ly)
		return tt_seterr(-EINVAL, "layer %u was not submitted", layer);
	if (cudaEventSynchronize(ly->ev) != cudaSuccess)
		fp_set_err(&ly->err, -EIO);
	fp_count(&((struct fp_txn *)txn)->fp->layer_wait_ns, fp_ns() - t0);
	err = __atomic_load_n(&ly->err, __ATOMIC_RELAXED);
	if (err)
		return tt_seterr(err, "%s path: layer %u: %s", ((struct fp_txn *)txn)->fp->be->name,
				 layer, strerror(-err));
	return 0;
}

// Done: every run of the layer queued by the threads, and its event reached
// (a failed query counts as done: fp_wait reports it).
int fp_poll(void *txn, uint32_t layer)
{
	struct fp_txn *t = (struct fp_txn *)txn;
	struct fp_layer *ly;

	if (layer >= t->geo.n_layers || !t->layers[layer].submitted)
		return 1;
	ly = &t->layers[layer];
	{
		std::lock_guard<std::mutex> lk(t->fp->mu);

		if (!ly->done)
			return 0;
	}
	return tt_cuda_reached(cudaEventQuery(ly->ev));
}

int fp_collect(void *txn, int32_t *status, uint64_t *sums)
{
	struct fp_txn *t = (struct fp_txn *)txn;
	uint32_t R = tt_objs_per_slot(&t->geo), S = t->geo.n_spans;
	std::vector<uint64_t> h((size_t)t->n * R);

	// A failed layer shows in the per-block status, not in the return: every
	// block has objects in every layer, so a layer that failed as a whole
	// (its event, its hash kernel) fails each block of the transaction.
	int layer_err = 0;

	for (uint32_t l = 0; l < t->geo.n_layers; l++) {
		int e = t->layers[l].submitted ? fp_wait(t, l) : 0;

		if (e && !layer_err)
			layer_err = e;
	}
	// On ctl, not the legacy stream, which would wait for the caller's compute.
	if (t->n && (cudaMemcpyAsync(h.data(), t->d_sums, h.size() * 8, cudaMemcpyDeviceToHost,
				     t->fp->ctl) || cudaStreamSynchronize(t->fp->ctl)))
		return tt_seterr(-EIO, "%s path: reading the checksums back failed", t->fp->be->name);
	for (unsigned i = 0; i < t->n; i++) {
		status[i] = __atomic_load_n(&t->status[i], __ATOMIC_RELAXED);
		if (t->slots[i] < 0)
			continue;
		if (!status[i])
			status[i] = layer_err;
		for (uint32_t l = 0; l < t->geo.n_layers; l++) {
			if (!t->layers[l].submitted)
				continue;
			for (uint32_t k = 0; k < S; k++) {
				uint32_t m = tt_obj_index(&t->geo, l, k);

				sums[(size_t)i * R + m] = h[(size_t)i * R + m];
			}
		}
	}
	return 0;
}

void fp_end(void *txn)
{
	struct fp_txn *t = (struct fp_txn *)txn;

	for (uint32_t l = 0; l < t->geo.n_layers; l++) {
		struct fp_layer *ly = &t->layers[l];

		if (ly->submitted && layer_queued(t, l))
			cudaEventSynchronize(ly->ev);
	}
	if (t->fp->be->txn_close)
		t->fp->be->txn_close(t);
	txn_free(t);
}
