// SPDX-License-Identifier: Apache-2.0
//
// gpu_rig.cuh - helpers shared by the GPU tests and benchmark (test code,
// not part of the library): an emulated
// controller plus a gio_uring handle over its queues, a watchdog sync, and
// a deterministic data pattern.
#ifndef TUTTI_GPU_RIG_CUH
#define TUTTI_GPU_RIG_CUH

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include <tutti/emu_ctrl.h>
#include <tutti/gio_uring.h>

#include "tap.h"

struct gpu_rig {
	struct tt_emu *emu;
	struct tt_gio *gio;
	cudaStream_t s;
};

// The whole test skips ("1..0 # SKIP no CUDA device", exit 0) when there is no GPU to run on.
static inline void gpu_require_device(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
		tap_skip_all("no CUDA device");
	cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
}

static inline int gpu_rig_open(struct gpu_rig *r, const struct tt_emu_params *ep,
			       unsigned warps)
{
	struct tt_gio_params gp = {};
	int rc;

	r->emu = nullptr;
	r->gio = nullptr;
	rc = tt_emu_open(ep, &r->emu);
	if (rc)
		return rc;
	gp.n_queues = ep->n_queues;
	gp.qmem = tt_emu_qmem(r->emu);
	tt_emu_caps(r->emu, &gp.caps);
	gp.lba_shift = ep->lba_shift;
	gp.warps_per_queue = warps;
	rc = tt_gio_open(&gp, &r->gio);
	if (!rc && cudaStreamCreateWithFlags(&r->s, cudaStreamNonBlocking) != cudaSuccess)
		rc = -5;
	return rc;
}

static inline void gpu_rig_close(struct gpu_rig *r)
{
	tt_gio_close(r->gio);
	tt_emu_close(r->emu);
	cudaStreamDestroy(r->s);
}

// Wait for @s, or abort the whole program after @secs (a hung queue must
// not hold the GPU): a dead kernel goes with the process.
static inline int gpu_sync_or_die(cudaStream_t s, double secs)
{
	auto t0 = std::chrono::steady_clock::now();
	cudaError_t e;

	while ((e = cudaStreamQuery(s)) == cudaErrorNotReady) {
		std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0;

		if (d.count() > secs) {
			std::printf("Bail out! GPU queues hung for %.0f s\n", secs);
			std::fflush(stdout);
			std::_Exit(1);
		}
		std::this_thread::sleep_for(std::chrono::microseconds(50));
	}
	return e == cudaSuccess ? 0 : -5;
}

__device__ __host__ static inline uint32_t gpu_pattern(uint32_t seed, uint64_t i)
{
	uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32 | seed);

	x ^= x >> 29;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 32;
	return (uint32_t)x;
}

__global__ void gpu_fill_kernel(uint32_t *p, uint64_t n, uint32_t seed)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		p[i] = gpu_pattern(seed, i);
}

static inline void gpu_fill(void *p, uint64_t bytes, uint32_t seed)
{
	gpu_fill_kernel<<<1024, 256, 0, cudaStreamPerThread>>>((uint32_t *)p, bytes / 4, seed);
	cudaStreamSynchronize(cudaStreamPerThread);
}

// @n commands of @obj bytes each, back to back in @buf (+ @first_off) and on the namespace from LBA 0.
static inline std::vector<tt_gio_iocb> gpu_linear_iocbs(void *buf, uint32_t n, uint32_t obj,
							 uint8_t op, uint32_t first_off)
{
	std::vector<tt_gio_iocb> v(n);

	for (uint32_t i = 0; i < n; i++) {
		std::memset(&v[i], 0, sizeof(v[i]));
		v[i].lba = (uint64_t)i * obj / 4096;
		v[i].nsid = 1;
		v[i].op = op;
		v[i].nseg = 1;
		v[i].seg[0].addr = (uint64_t)(uintptr_t)buf + first_off + (uint64_t)i * obj;
		v[i].seg[0].len = obj;
	}
	return v;
}

// Whether two device buffers hold the same bytes (copied to the host).
static inline bool gpu_dev_equal(const void *a, const void *b, size_t bytes)
{
	std::vector<char> x(bytes), y(bytes);

	cudaMemcpy(x.data(), a, bytes, cudaMemcpyDefault);
	cudaMemcpy(y.data(), b, bytes, cudaMemcpyDefault);
	return std::memcmp(x.data(), y.data(), bytes) == 0;
}


#ifndef KIB
#define KIB 1024ull
#define MIB (1024ull * 1024ull)
#endif

// An emulated controller of @nq queue pairs, one namespace of @ns_bytes.
static inline struct tt_emu_params base_params(unsigned nq, uint32_t depth,
					       int backing, uint64_t ns_bytes,
					       bool sgl)
{
	struct tt_emu_params p = {};

	p.n_queues = nq;
	p.depth = depth;
	p.n_threads = 4;
	p.backing = backing;
	p.n_ns = 1;
	p.ns_bytes = ns_bytes;
	p.lba_shift = 12;
	p.sgls = sgl ? TT_NVME_SGLS_BYTE_ALIGNED : 0;
	p.mdts_bytes = 0;
	p.list_chunks = 1;
	return p;
}

// Run @io as one batch with the fused kernel; returns failed commands.
static inline uint32_t run_iocbs(struct gpu_rig *r,
				 const std::vector<tt_gio_iocb> &io,
				 std::vector<uint16_t> *status)
{
	struct tt_gio_iocb *d = nullptr;
	struct tt_gio_batch *b = nullptr;
	uint32_t n_err = ~0u;

	cudaMalloc(&d, io.size() * sizeof(io[0]));
	cudaMemcpy(d, io.data(), io.size() * sizeof(io[0]), cudaMemcpyHostToDevice);
	if (tt_gio_batch_create(r->gio, (uint32_t)io.size(), &b) ||
	    tt_gio_prep_iocbs(b, d, (uint32_t)io.size()) ||
	    tt_gio_submit_wait(r->gio, b, r->s) || gpu_sync_or_die(r->s, 30)) {
		tap_diag("batch setup or launch failed");
	} else {
		std::vector<uint16_t> st(io.size());

		tt_gio_batch_result(b, &n_err, st.data());
		if (n_err && n_err != ~0u) {
			// Which statuses, and where: the first failures say more
			// than a count.
			unsigned shown = 0;

			for (size_t i = 0; i < st.size() && shown < 8; i++)
				if (st[i]) {
					tap_diag("command %zu of %zu: status 0x%x", i, st.size(),
						 (unsigned)st[i]);
					shown++;
				}
		}
		if (status)
			*status = st;
	}
	tt_gio_batch_destroy(b);
	cudaFree(d);
	return n_err;
}
#endif /* TUTTI_GPU_RIG_CUH */
