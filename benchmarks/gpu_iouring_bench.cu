// SPDX-License-Identifier: Apache-2.0
//
// gpu_iouring_bench.cu - GPU io_uring against the emulated controller.
//
//   cmds  --queues Q --threads T --depth D --warps W --blocks N --layers L --runs R
//         null backing, 4 KiB objects, layer descriptors: commands/s issued and
//         completed by the GPU, and the submitting thread's CPU time per layer
//   bw    --queues Q --threads T --depth D --blocks N --layers L --span B --runs R
//         host-memory backing: write every layer from HBM, read it back into
//         another buffer with another block map, check bit-exact, GB/s each way
//   emubw the same with one command per object, checked on the GPU, plus
//         --copy kernel|batch|each|sync   who moves the controller's data: the gio
//                                  kernels (TUTTI_EMU_DMA=kernel) or the copy engines
//                                  (TUTTI_EMU_DMA=copy, TUTTI_EMU_COPY=batch|each|sync)
//         --rate G                 bandwidth cap in GB/s (0: none)
//         --compute 1 [--iosms S]  short FMA kernels launched back to back
//                                  meanwhile (in an S-SM green context split)
//
// Prints one line "RESULT {json}" per run; benchmarks/gpu_iouring.py drives it.
// Build: nvcc -std=c++17 -arch=sm_90 -O2 -Ilibtutti/include
//        benchmarks/gpu_iouring_bench.cu libtutti/src/gpu/gio_uring.cu
//        libtutti/src/gpu/emu_ctrl.cu libtutti/src/gpu/domains.cu -o build/gpu/gpu_iouring_bench
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include <tutti/gpu_domains.h>

#include "../libtutti/tests/gpu_rig.cuh"

struct opts {
	std::string mode = "cmds";
	unsigned queues = 32, threads = 8, depth = 1024, warps = 4;
	unsigned blocks = 65536, layers = 32, runs = 3, span = 4096;
	unsigned iosms = 0, iters = 1u << 21;	// cmds: 0 = whole GPU
	std::string copy = "kernel";		// emubw
	double rate = 0;
	unsigned compute = 0;
};

static double now_s(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct tt_geometry geometry(const opts &o)
{
	struct tt_geometry g = {};

	g.n_layers = o.layers;
	g.n_spans = 2;
	g.span_bytes = o.span;
	g.obj_stride = o.span;
	g.n_members = 1;
	g.stripe_objs = 1;
	g.n_slots = o.blocks;
	g.data_off = 0;
	return g;
}

static struct tt_emu_params emu_params(const opts &o, int backing, uint64_t ns_bytes)
{
	struct tt_emu_params p = {};

	p.n_queues = o.queues;
	p.depth = o.depth;
	p.n_threads = o.threads;
	p.backing = backing;
	p.n_ns = 1;
	p.ns_bytes = ns_bytes;
	p.lba_shift = 12;
	p.sgls = TT_NVME_SGLS_BYTE_ALIGNED;
	p.list_chunks = 0;	// one object = one SGL data block in DPTR
	return p;
}

struct layer_io {
	uint64_t *slots;
	uint32_t *ids;
};

static layer_io make_maps(unsigned n, unsigned seed)
{
	std::vector<uint64_t> s(n);
	std::vector<uint32_t> id(n);
	std::mt19937 rng(seed);
	layer_io m;

	for (unsigned i = 0; i < n; i++) {
		s[i] = i;
		id[i] = i;
	}
	std::shuffle(s.begin(), s.end(), rng);
	std::shuffle(id.begin(), id.end(), rng);
	cudaMalloc(&m.slots, n * 8);
	cudaMalloc(&m.ids, n * 4);
	cudaMemcpy(m.slots, s.data(), n * 8, cudaMemcpyHostToDevice);
	cudaMemcpy(m.ids, id.data(), n * 4, cudaMemcpyHostToDevice);
	return m;
}

// Queue every layer on one stream, then wait. Returns wall seconds; the
// launching thread's CPU seconds go to *cpu.
static double run_layers(struct gpu_rig *r, struct tt_gio_batch *b, const opts &o,
			 const struct tt_geometry &g, const layer_io &m, char *buf,
			 uint8_t op, double *cpu, bool *ok)
{
	uint64_t layer_bytes = (uint64_t)o.blocks * g.n_spans * g.span_bytes;
	double t0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_THREAD_CPUTIME_ID), c1;

	*ok = true;
	for (unsigned l = 0; l < o.layers; l++) {
		struct tt_gio_layer d = {};

		d.geo = g;
		d.layer = l;
		d.n_blocks = o.blocks;
		d.slots = m.slots;
		d.block_ids = m.ids;
		d.base = (uint64_t)(uintptr_t)buf + (buf ? l * layer_bytes : 0);
		d.block_stride = (uint64_t)g.n_spans * g.span_bytes;
		d.span_stride = g.span_bytes;
		d.nsid_base = 1;
		d.op = op;
		if (tt_gio_prep_layer(b, &d) || tt_gio_submit_wait(r->gio, b, r->s))
			*ok = false;
	}
	c1 = now_s(CLOCK_THREAD_CPUTIME_ID);
	if (gpu_sync_or_die(r->s, 120))
		*ok = false;
	*cpu = c1 - c0;
	return now_s(CLOCK_MONOTONIC) - t0;
}

// The same, but waiting for each layer before preparing the next.
static double run_layers_sync(struct gpu_rig *r, struct tt_gio_batch *b, const opts &o,
			      const struct tt_geometry &g, const layer_io &m, double *cpu)
{
	double t0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_THREAD_CPUTIME_ID);

	for (unsigned l = 0; l < o.layers; l++) {
		struct tt_gio_layer d = {};

		d.geo = g;
		d.layer = l;
		d.n_blocks = o.blocks;
		d.slots = m.slots;
		d.block_ids = m.ids;
		d.block_stride = (uint64_t)g.n_spans * g.span_bytes;
		d.span_stride = g.span_bytes;
		d.nsid_base = 1;
		d.op = TT_NVME_CMD_READ;
		tt_gio_prep_layer(b, &d);
		tt_gio_submit_wait(r->gio, b, r->s);
		cudaStreamSynchronize(r->s);	// blocking sync: the thread sleeps
	}
	*cpu = now_s(CLOCK_THREAD_CPUTIME_ID) - c0;
	return now_s(CLOCK_MONOTONIC) - t0;
}

static int bench_cmds(const opts &o)
{
	struct tt_geometry g = geometry(o);
	uint64_t ns = (uint64_t)o.blocks * o.layers * 2 * o.span;
	struct tt_emu_params p = emu_params(o, TT_EMU_NULL, ns);
	struct tt_gio_batch *b;
	struct gpu_rig r;
	layer_io m;
	uint64_t cmds = (uint64_t)o.blocks * o.layers * 2;
	int rc;

	struct tt_gpu_domains dom = {};
	cudaStream_t own;

	if ((rc = gpu_rig_open(&r, &p, o.warps))) {
		std::fprintf(stderr, "open: %d\n", rc);
		return 1;
	}
	own = r.s;
	if (o.iosms) {
		// Confine the I/O kernels to an I/O domain of o.iosms SMs.
		if (tt_gpu_domains_create(o.iosms, &dom) || !dom.green) {
			std::fprintf(stderr, "no SM domains: %s\n", dom.reason);
			return 1;
		}
		r.s = dom.io;
	}
	m = make_maps(o.blocks, 1);
	tt_gio_batch_create(r.gio, o.blocks * 2, &b);
	for (unsigned run = 0; run <= o.runs; run++) {
		double cpu, cpu_sync, secs, secs_sync;
		struct tt_emu_stats s0, s1;
		uint32_t n_err = 0;
		bool ok;

		tt_emu_get_stats(r.emu, &s0);
		secs = run_layers(&r, b, o, g, m, nullptr, TT_NVME_CMD_READ, &cpu, &ok);
		tt_gio_batch_result(b, &n_err, nullptr);
		tt_emu_get_stats(r.emu, &s1);
		secs_sync = run_layers_sync(&r, b, o, g, m, &cpu_sync);
		if (run == 0)
			continue;	// warm-up
		std::printf("RESULT {\"mode\":\"cmds\",\"io_sms\":%u,\"queues\":%u,\"threads\":%u,\"depth\":%u,"
			    "\"warps\":%u,\"blocks\":%u,\"layers\":%u,\"cmds\":%llu,"
			    "\"completed\":%llu,\"errors\":%u,\"ok\":%s,\"secs\":%.6f,"
			    "\"cmds_per_s\":%.1f,\"cpu_us_per_layer\":%.2f,"
			    "\"wall_us_per_layer\":%.2f,\"cpu_us_per_layer_sync\":%.2f,"
			    "\"wall_us_per_layer_sync\":%.2f,\"doorbells\":%llu}\n",
			    o.iosms ? dom.io_sms : 0, o.queues, o.threads, o.depth, o.warps, o.blocks,
			    o.layers, (unsigned long long)cmds, (unsigned long long)(s1.cmds - s0.cmds),
			    n_err, ok && n_err == 0 && s1.cmds - s0.cmds == cmds ? "true" : "false",
			    secs, cmds / secs, cpu / o.layers * 1e6, secs / o.layers * 1e6,
			    cpu_sync / o.layers * 1e6, secs_sync / o.layers * 1e6,
			    (unsigned long long)(s1.doorbells - s0.doorbells));
		std::fflush(stdout);
	}
	tt_gio_batch_destroy(b);
	r.s = own;
	gpu_rig_close(&r);
	if (o.iosms)
		tt_gpu_domains_destroy(&dom);
	return 0;
}

static int bench_bw(const opts &o)
{
	struct tt_geometry g = geometry(o);
	uint64_t bytes = (uint64_t)o.blocks * o.layers * 2 * o.span;
	struct tt_emu_params p = emu_params(o, TT_EMU_HOSTMEM, bytes);
	struct tt_gio_batch *b;
	struct gpu_rig r;
	layer_io wm, rm;
	char *src, *dst;
	int rc;

	if ((rc = gpu_rig_open(&r, &p, o.warps))) {
		std::fprintf(stderr, "open: %d\n", rc);
		return 1;
	}
	wm = make_maps(o.blocks, 2);
	rm = wm;
	{
		// Read back into other pages: same slots, reversed block ids.
		std::vector<uint32_t> id(o.blocks);
		cudaMemcpy(id.data(), wm.ids, o.blocks * 4, cudaMemcpyDeviceToHost);
		std::reverse(id.begin(), id.end());
		cudaMalloc(&rm.ids, o.blocks * 4);
		cudaMemcpy(rm.ids, id.data(), o.blocks * 4, cudaMemcpyHostToDevice);
	}
	cudaMalloc(&src, bytes);
	cudaMalloc(&dst, bytes);
	gpu_fill(src, bytes, 1234);
	tt_gio_batch_create(r.gio, o.blocks * 2, &b);
	for (unsigned run = 0; run <= o.runs; run++) {
		double cpu_w, cpu_r, ws, rs;
		uint32_t e1 = 0, e2 = 0;
		bool ok1, ok2, exact = true;

		cudaMemset(dst, 0, bytes);
		cudaDeviceSynchronize();
		ws = run_layers(&r, b, o, g, wm, src, TT_NVME_CMD_WRITE, &cpu_w, &ok1);
		tt_gio_batch_result(b, &e1, nullptr);
		rs = run_layers(&r, b, o, g, rm, dst, TT_NVME_CMD_READ, &cpu_r, &ok2);
		tt_gio_batch_result(b, &e2, nullptr);
		{
			// Block i of dst (rm map) must equal block i of src (wm map).
			std::vector<uint32_t> wi(o.blocks), ri(o.blocks);
			std::vector<char> hs(bytes), hd(bytes);
			uint64_t bb = 2ull * o.span, lb = (uint64_t)o.blocks * bb;

			cudaMemcpy(wi.data(), wm.ids, o.blocks * 4, cudaMemcpyDeviceToHost);
			cudaMemcpy(ri.data(), rm.ids, o.blocks * 4, cudaMemcpyDeviceToHost);
			cudaMemcpy(hs.data(), src, bytes, cudaMemcpyDeviceToHost);
			cudaMemcpy(hd.data(), dst, bytes, cudaMemcpyDeviceToHost);
			for (unsigned l = 0; l < o.layers && exact; l++)
				for (unsigned i = 0; i < o.blocks && exact; i++)
					exact = std::memcmp(hs.data() + l * lb + wi[i] * bb,
							    hd.data() + l * lb + ri[i] * bb, bb) == 0;
		}
		if (run == 0)
			continue;
		std::printf("RESULT {\"mode\":\"bw\",\"queues\":%u,\"threads\":%u,\"depth\":%u,"
			    "\"warps\":%u,\"blocks\":%u,\"layers\":%u,\"span\":%u,\"bytes\":%llu,"
			    "\"ok\":%s,\"bit_exact\":%s,\"write_gbps\":%.3f,\"read_gbps\":%.3f,"
			    "\"cpu_us_per_layer\":%.2f}\n",
			    o.queues, o.threads, o.depth, o.warps, o.blocks, o.layers, o.span,
			    (unsigned long long)bytes,
			    ok1 && ok2 && !e1 && !e2 ? "true" : "false", exact ? "true" : "false",
			    bytes / ws / 1e9, bytes / rs / 1e9, cpu_r / o.layers * 1e6);
		std::fflush(stdout);
	}
	tt_gio_batch_destroy(b);
	gpu_rig_close(&r);
	cudaFree(src);
	cudaFree(dst);
	return 0;
}

// Compute stand-in: FP32 FMA chains, no memory traffic to speak of.
__global__ void fma_kernel(float *out, unsigned iters)
{
	float a = threadIdx.x, b = 1.0f + 1e-7f, c = blockIdx.x, d = 0.5f;

	for (unsigned i = 0; i < iters; i++) {
		a = fmaf(a, b, 0.5f);
		c = fmaf(c, b, d);
	}
	out[blockIdx.x * blockDim.x + threadIdx.x] = a + c;
}

// Seconds the FMA kernel takes on @s (host clock, the kernel runs ~100 ms).
static double time_compute(cudaStream_t s, float *out, unsigned grid, unsigned iters)
{
	double t0 = now_s(CLOCK_MONOTONIC);

	fma_kernel<<<grid, 256, 0, s>>>(out, iters);
	gpu_sync_or_die(s, 60);
	return now_s(CLOCK_MONOTONIC) - t0;
}

// Queue @layers null-backing layer batches on @s (keeps the I/O path busy).
static void queue_io(struct gpu_rig *r, struct tt_gio_batch *b, const opts &o,
		     const layer_io &m, cudaStream_t s, unsigned layers)
{
	struct tt_geometry g = geometry(o);

	for (unsigned l = 0; l < layers; l++) {
		struct tt_gio_layer d = {};

		d.geo = g;
		d.layer = l % o.layers;
		d.n_blocks = o.blocks;
		d.slots = m.slots;
		d.block_ids = m.ids;
		d.block_stride = 2ull * g.span_bytes;
		d.span_stride = g.span_bytes;
		d.nsid_base = 1;
		d.op = TT_NVME_CMD_READ;
		tt_gio_prep_layer(b, &d);
		tt_gio_submit_wait(r->gio, b, s);
	}
}

// Interference of the I/O path with compute, with and without SM domains.
static int bench_interf(const opts &o)
{
	struct tt_geometry g = geometry(o);
	struct tt_emu_params p = emu_params(o, TT_EMU_NULL,
					    (uint64_t)o.blocks * o.layers * 2 * o.span);
	struct tt_gpu_domains dom;
	struct tt_gio_batch *b;
	cudaStream_t plain_c, plain_io;
	unsigned iosms = o.iosms ? o.iosms : 16;
	struct gpu_rig r;
	unsigned grid;
	int sms = 0;
	float *out;
	layer_io m;

	(void)g;
	cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
	grid = 16 * (unsigned)sms;
	cudaMalloc(&out, (size_t)grid * 256 * 4);
	if (gpu_rig_open(&r, &p, o.warps) || tt_gpu_domains_create(iosms, &dom)) {
		std::fprintf(stderr, "open failed\n");
		return 1;
	}
	cudaStreamCreateWithFlags(&plain_c, cudaStreamNonBlocking);
	cudaStreamCreateWithFlags(&plain_io, cudaStreamNonBlocking);
	m = make_maps(o.blocks, 3);
	tt_gio_batch_create(r.gio, o.blocks * 2, &b);
	// Warm up every kernel in every context.
	time_compute(plain_c, out, grid, 1024);
	time_compute(dom.compute, out, grid, 1024);
	queue_io(&r, b, o, m, plain_io, 1);
	queue_io(&r, b, o, m, dom.io, 1);
	gpu_sync_or_die(plain_io, 60);
	gpu_sync_or_die(dom.io, 60);
	for (unsigned run = 0; run < o.runs; run++) {
		double full, full_io, part, part_io, io_alone;
		double t0;

		full = time_compute(plain_c, out, grid, o.iters);
		t0 = now_s(CLOCK_MONOTONIC);
		queue_io(&r, b, o, m, plain_io, o.layers);
		gpu_sync_or_die(plain_io, 60);
		io_alone = now_s(CLOCK_MONOTONIC) - t0;
		queue_io(&r, b, o, m, plain_io, 4 * o.layers);
		full_io = time_compute(plain_c, out, grid, o.iters);
		gpu_sync_or_die(plain_io, 60);
		part = time_compute(dom.compute, out, grid, o.iters);
		queue_io(&r, b, o, m, dom.io, 4 * o.layers);
		part_io = time_compute(dom.compute, out, grid, o.iters);
		gpu_sync_or_die(dom.io, 60);
		std::printf("RESULT {\"mode\":\"interf\",\"green\":%d,\"io_sms\":%u,"
			    "\"compute_sms\":%u,\"queues\":%u,\"threads\":%u,\"blocks\":%u,"
			    "\"full_s\":%.6f,\"full_with_io_s\":%.6f,\"part_s\":%.6f,"
			    "\"part_with_io_s\":%.6f,\"io_layer_us\":%.1f,\"reason\":\"%s\"}\n",
			    dom.green, dom.io_sms, dom.compute_sms, o.queues, o.threads, o.blocks,
			    full, full_io, part, part_io, io_alone / o.layers * 1e6,
			    dom.green ? "" : dom.reason);
		std::fflush(stdout);
	}
	tt_gio_batch_destroy(b);
	gpu_rig_close(&r);
	tt_gpu_domains_destroy(&dom);
	cudaFree(out);
	return 0;
}

// Count 16-byte words where block ri[i] of @dst differs from block wi[i] of
// @src, every layer: the read-back check of emubw, on the GPU.
__global__ void cmp_blocks_kernel(const uint4 *src, const uint4 *dst, const uint32_t *wi,
				  const uint32_t *ri, unsigned blocks, unsigned layers,
				  uint64_t block_words, unsigned long long *bad)
{
	unsigned long long n = 0;

	for (uint64_t p = blockIdx.x; p < (uint64_t)layers * blocks; p += gridDim.x) {
		uint64_t l = p / blocks, i = p % blocks, lw = block_words * blocks;
		const uint4 *s = src + l * lw + wi[i] * block_words;
		const uint4 *d = dst + l * lw + ri[i] * block_words;

		for (uint64_t w = threadIdx.x; w < block_words; w += blockDim.x)
			n += s[w].x != d[w].x || s[w].y != d[w].y || s[w].z != d[w].z ||
			     s[w].w != d[w].w;
	}
	if (n)
		atomicAdd(bad, n);
}

// The compute beside the I/O in emubw: a model's launching thread keeps a
// few short kernels queued, so the controller threads share the CUDA
// runtime with it as well as the GPU.
struct compute_load {
	cudaStream_t s;
	cudaEvent_t ev[4];
	float *out;
	unsigned grid;
	unsigned long long kernels;
};

// Queue all layers of @m on r->s and wait; with @c, launch compute kernels
// (at most 4 queued) until the I/O is done. Returns wall seconds.
static double emubw_pass(struct gpu_rig *r, struct tt_gio_batch *b, const opts &o,
			 const struct tt_geometry &g, const layer_io &m, char *buf, uint8_t op,
			 compute_load *c, bool *ok)
{
	uint64_t layer_bytes = (uint64_t)o.blocks * g.n_spans * g.span_bytes;
	double t0 = now_s(CLOCK_MONOTONIC), t;
	unsigned k = 0;

	*ok = true;
	for (unsigned l = 0; l < o.layers; l++) {
		struct tt_gio_layer d = {};

		d.geo = g;
		d.layer = l;
		d.n_blocks = o.blocks;
		d.slots = m.slots;
		d.block_ids = m.ids;
		d.base = (uint64_t)(uintptr_t)buf + l * layer_bytes;
		d.block_stride = (uint64_t)g.n_spans * g.span_bytes;
		d.span_stride = g.span_bytes;
		d.nsid_base = 1;
		d.op = op;
		if (tt_gio_prep_layer(b, &d) || tt_gio_submit_wait(r->gio, b, r->s))
			*ok = false;
	}
	while (c && cudaStreamQuery(r->s) == cudaErrorNotReady) {
		if (now_s(CLOCK_MONOTONIC) - t0 > 120) {
			std::printf("Bail out! GPU queues hung for 120 s\n");
			std::fflush(stdout);
			std::_Exit(1);
		}
		if (k >= 4 && cudaEventQuery(c->ev[k % 4]) == cudaErrorNotReady) {
			std::this_thread::sleep_for(std::chrono::microseconds(10));
			continue;
		}
		fma_kernel<<<c->grid, 256, 0, c->s>>>(c->out, 32768);	// ~70 us
		cudaEventRecord(c->ev[k % 4], c->s);
		k++;
	}
	if (gpu_sync_or_die(r->s, 120))
		*ok = false;
	t = now_s(CLOCK_MONOTONIC) - t0;
	if (c) {
		gpu_sync_or_die(c->s, 60);
		c->kernels += k;
	}
	return t;
}

// Controller bandwidth, host memory <-> HBM, one command per object.
static int bench_emubw(const opts &o)
{
	struct tt_geometry g = geometry(o);
	uint64_t bytes = (uint64_t)o.blocks * o.layers * 2 * o.span;
	struct tt_emu_params p = emu_params(o, TT_EMU_HOSTMEM, bytes);
	struct tt_gpu_domains dom = {};
	unsigned long long *bad;
	struct tt_gio_batch *b;
	compute_load cl = {}, *c = nullptr;
	cudaStream_t own;
	struct gpu_rig r;
	layer_io wm, rm;
	char *src, *dst;
	bool has_dom = false;
	int rc, sms = 0;

	// The controller reads who moves its data at open: "kernel" the gio
	// kernels (TUTTI_EMU_DMA=kernel), else the copy engines this way.
	if (o.copy == "kernel") {
		setenv("TUTTI_EMU_DMA", "kernel", 1);
	} else {
		setenv("TUTTI_EMU_DMA", "copy", 1);
		setenv("TUTTI_EMU_COPY", o.copy.c_str(), 1);
	}
	p.rate_gbps = o.rate;
	if ((rc = gpu_rig_open(&r, &p, o.warps))) {
		std::fprintf(stderr, "open: %d\n", rc);
		return 1;
	}
	own = r.s;
	if (o.compute) {
		cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
		cl.grid = 4 * (unsigned)sms;	// one wave, 1024 threads an SM
		if (o.iosms && !tt_gpu_domains_create(o.iosms, &dom)) {
			has_dom = true;
			r.s = dom.io;
			cl.s = dom.compute;
			if (dom.green)
				cl.grid = 4 * dom.compute_sms;
			else
				std::fprintf(stderr, "no SM domains (%s): plain streams\n",
					     dom.reason);
		} else {
			cudaStreamCreateWithFlags(&cl.s, cudaStreamNonBlocking);
		}
		for (cudaEvent_t &e : cl.ev)
			cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
		cudaMalloc(&cl.out, (size_t)cl.grid * 256 * 4);
		// Load the kernel now: a lazy first launch waits for an idle GPU.
		fma_kernel<<<1, 32, 0, cl.s>>>(cl.out, 1);
		gpu_sync_or_die(cl.s, 60);
		c = &cl;
	}
	wm = make_maps(o.blocks, 4);
	rm = wm;
	{
		// Read back into other pages: same slots, reversed block ids.
		std::vector<uint32_t> id(o.blocks);
		cudaMemcpy(id.data(), wm.ids, o.blocks * 4, cudaMemcpyDeviceToHost);
		std::reverse(id.begin(), id.end());
		cudaMalloc(&rm.ids, o.blocks * 4);
		cudaMemcpy(rm.ids, id.data(), o.blocks * 4, cudaMemcpyHostToDevice);
	}
	cudaMalloc(&src, bytes);
	cudaMalloc(&dst, bytes);
	cudaMalloc(&bad, sizeof(*bad));
	gpu_fill(src, bytes, 4321);
	tt_gio_batch_create(r.gio, o.blocks * 2, &b);
	cmp_blocks_kernel<<<1, 32>>>((const uint4 *)src, (const uint4 *)dst, wm.ids, rm.ids, 0,
				     0, 0, bad);
	cudaDeviceSynchronize();
	for (unsigned run = 0; run <= o.runs; run++) {
		unsigned long long n_bad = 0, k0 = cl.kernels;
		struct tt_emu_stats s0, s1;
		double ws, rs;
		uint32_t e1 = 0, e2 = 0;
		bool ok1, ok2;

		cudaMemset(dst, 0, bytes);
		cudaMemset(bad, 0, sizeof(*bad));
		cudaDeviceSynchronize();
		tt_emu_get_stats(r.emu, &s0);
		ws = emubw_pass(&r, b, o, g, wm, src, TT_NVME_CMD_WRITE, c, &ok1);
		tt_gio_batch_result(b, &e1, nullptr);
		rs = emubw_pass(&r, b, o, g, rm, dst, TT_NVME_CMD_READ, c, &ok2);
		tt_gio_batch_result(b, &e2, nullptr);
		tt_emu_get_stats(r.emu, &s1);
		cmp_blocks_kernel<<<1024, 256>>>((const uint4 *)src, (const uint4 *)dst, wm.ids,
						 rm.ids, o.blocks, o.layers, 2ull * o.span / 16, bad);
		cudaMemcpy(&n_bad, bad, sizeof(n_bad), cudaMemcpyDeviceToHost);
		if (run == 0)
			continue;	// warm-up
		std::printf("RESULT {\"mode\":\"emubw\",\"copy\":\"%s\",\"queues\":%u,\"threads\":%u,"
			    "\"depth\":%u,\"warps\":%u,\"blocks\":%u,\"layers\":%u,\"span\":%u,"
			    "\"bytes\":%llu,\"rate_gbps\":%.3f,\"compute\":%u,\"io_sms\":%u,"
			    "\"ok\":%s,\"bit_exact\":%s,\"write_gbps\":%.3f,\"read_gbps\":%.3f,"
			    "\"emu_bytes\":%llu,\"emu_errors\":%llu,\"compute_kernels\":%llu}\n",
			    o.copy.c_str(), o.queues, o.threads, o.depth, o.warps, o.blocks, o.layers,
			    o.span, (unsigned long long)bytes, o.rate, o.compute,
			    has_dom && dom.green ? dom.io_sms : 0,
			    ok1 && ok2 && !e1 && !e2 ? "true" : "false", n_bad ? "false" : "true",
			    bytes / ws / 1e9, bytes / rs / 1e9,
			    (unsigned long long)(s1.bytes - s0.bytes),
			    (unsigned long long)(s1.errors - s0.errors), cl.kernels - k0);
		std::fflush(stdout);
	}
	tt_gio_batch_destroy(b);
	r.s = own;
	gpu_rig_close(&r);
	if (c) {
		for (cudaEvent_t &e : cl.ev)
			cudaEventDestroy(e);
		if (!has_dom)
			cudaStreamDestroy(cl.s);
		cudaFree(cl.out);
	}
	if (has_dom)
		tt_gpu_domains_destroy(&dom);
	cudaFree(src);
	cudaFree(dst);
	cudaFree(bad);
	return 0;
}

int main(int argc, char **argv)
{
	opts o;

	gpu_require_device();
	if (argc > 1)
		o.mode = argv[1];
	for (int i = 2; i + 1 < argc; i += 2) {
		std::string k = argv[i];
		unsigned v = (unsigned)std::strtoul(argv[i + 1], nullptr, 0);

		if (k == "--copy") o.copy = argv[i + 1];
		else if (k == "--rate") o.rate = std::strtod(argv[i + 1], nullptr);
		else if (k == "--compute") o.compute = v;
		else if (k == "--queues") o.queues = v;
		else if (k == "--threads") o.threads = v;
		else if (k == "--depth") o.depth = v;
		else if (k == "--warps") o.warps = v;
		else if (k == "--blocks") o.blocks = v;
		else if (k == "--layers") o.layers = v;
		else if (k == "--runs") o.runs = v;
		else if (k == "--span") o.span = v;
		else if (k == "--iosms") o.iosms = v;
		else if (k == "--iters") o.iters = v;
		else {
			std::fprintf(stderr, "unknown option %s\n", k.c_str());
			return 2;
		}
	}
	if (o.mode == "cmds")
		return bench_cmds(o);
	if (o.mode == "bw")
		return bench_bw(o);
	if (o.mode == "interf")
		return bench_interf(o);
	if (o.mode == "emubw")
		return bench_emubw(o);
	std::fprintf(stderr, "usage: %s cmds|bw|interf|emubw [--queues Q] [--threads T] ...\n",
		     argv[0]);
	return 2;
}
