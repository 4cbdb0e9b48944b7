// SPDX-License-Identifier: Apache-2.0
//
// Description: SM partitioning with green contexts. Kernels on the I/O and
// compute streams run on disjoint SM sets no larger than the domains; a
// gio_uring round trip launched in the I/O domain completes, bit-exact,
// while a kernel that fills every compute SM is still running. Without
// green contexts the fallback streams must still work (isolation checks
// skipped, with the reason). Without a GPU: "1..0 # SKIP no CUDA device".
//
// Build: nvcc -std=c++17 -arch=sm_90 -Ilibtutti/include libtutti/tests/test_gpu_domains.cu
//        libtutti/src/gpu/{gio_uring,emu_ctrl,domains}.cu -o test_gpu_domains
#include <cstdio>
#include <cstring>
#include <vector>

#include <tutti/gpu_domains.h>

#include "tap.h"
#include "gpu_rig.cuh"

__device__ static inline unsigned long long gtime_ns(void)
{
	unsigned long long t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

// Every block records its SM and stays resident for @ns nanoseconds.
__global__ void smid_kernel(unsigned *hits, unsigned long long ns)
{
	extern __shared__ char fill[];
	unsigned id;
	unsigned long long t0 = gtime_ns();

	asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
	if (threadIdx.x == 0) {
		atomicAdd(&hits[id & 511], 1u);
		fill[0] = (char)id;
	}
	while (gtime_ns() - t0 < ns)
		;
}

static unsigned count_sms(const std::vector<unsigned> &h)
{
	unsigned n = 0;

	for (unsigned v : h)
		n += v != 0;
	return n;
}

int main(void)
{
	struct tt_gpu_domains d;
	unsigned *hio, *hcomp;
	std::vector<unsigned> a(512), b(512);
	const size_t smem = 200 * 1024;	// one block per SM: fills the SM
	int rc;

	gpu_require_device();
	rc = tt_gpu_domains_create(16, &d);
	tap_eq(rc, 0, "domains: created (green=%d, io %u SMs, compute %u SMs%s%s)", d.green,
	       d.io_sms, d.compute_sms, d.green ? "" : ", fallback: ", d.green ? "" : d.reason);
	if (rc)
		return tap_done();
	cudaFuncSetAttribute(smid_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
	cudaMalloc(&hio, 512 * 4);
	cudaMalloc(&hcomp, 512 * 4);
	cudaMemset(hio, 0, 512 * 4);
	cudaMemset(hcomp, 0, 512 * 4);
	cudaDeviceSynchronize();
	smid_kernel<<<4 * 132, 128, smem, d.io>>>(hio, 200000);
	smid_kernel<<<4 * 132, 128, smem, d.compute>>>(hcomp, 200000);
	tap_eq(cudaStreamSynchronize(d.io) | cudaStreamSynchronize(d.compute), 0,
	       "domains: kernels ran on both streams");
	cudaMemcpy(a.data(), hio, 512 * 4, cudaMemcpyDeviceToHost);
	cudaMemcpy(b.data(), hcomp, 512 * 4, cudaMemcpyDeviceToHost);
	{
		unsigned nio = count_sms(a), ncomp = count_sms(b), both = 0;

		for (unsigned i = 0; i < 512; i++)
			both += a[i] && b[i];
		tap_diag("I/O kernel used %u SMs, compute kernel %u, shared %u", nio, ncomp, both);
		if (d.green) {
			tap_ok(nio >= 1 && nio <= d.io_sms, "domains: I/O kernel on <= %u SMs (%u)",
			       d.io_sms, nio);
			tap_ok(ncomp >= 1 && ncomp <= d.compute_sms,
			       "domains: compute kernel on <= %u SMs (%u)", d.compute_sms, ncomp);
			tap_eq(both, 0, "domains: no SM ran both");
		} else {
			tap_skip("domains: isolation: %s", d.reason);
		}
	}

	// I/O in the I/O domain while compute fills every compute SM.
	{
		const uint32_t n = 4096, obj = 16384;
		uint64_t bytes = (uint64_t)n * obj;
		struct tt_emu_params p = {};
		struct tt_gio_batch *wb = nullptr, *rb = nullptr;
		struct tt_gio_iocb *dw, *dr;
		std::vector<tt_gio_iocb> w(n), r(n);
		struct gpu_rig rig;
		char *src, *dst;
		uint32_t e1 = 1, e2 = 1;
		bool compute_busy;

		p.n_queues = 8;
		p.depth = 256;
		p.n_threads = 4;
		p.backing = TT_EMU_HOSTMEM;
		p.n_ns = 1;
		p.ns_bytes = bytes;
		p.lba_shift = 12;
		p.sgls = TT_NVME_SGLS_BYTE_ALIGNED;
		if (!tap_ok(gpu_rig_open(&rig, &p, 4) == 0, "domains: open emulator + gio_uring"))
			return tap_done();
		cudaMalloc(&src, bytes);
		cudaMalloc(&dst, bytes);
		gpu_fill(src, bytes, 5);
		cudaMemset(dst, 0, bytes);
		for (uint32_t i = 0; i < n; i++) {
			std::memset(&w[i], 0, sizeof(w[i]));
			w[i].lba = (uint64_t)i * obj / 4096;
			w[i].nsid = 1;
			w[i].op = TT_NVME_CMD_WRITE;
			w[i].nseg = 1;
			w[i].seg[0].addr = (uint64_t)(uintptr_t)src + (uint64_t)i * obj;
			w[i].seg[0].len = obj;
			r[i] = w[i];
			r[i].op = TT_NVME_CMD_READ;
			r[i].seg[0].addr = (uint64_t)(uintptr_t)dst + (uint64_t)i * obj;
		}
		cudaMalloc(&dw, n * sizeof(*dw));
		cudaMalloc(&dr, n * sizeof(*dr));
		cudaMemcpy(dw, w.data(), n * sizeof(*dw), cudaMemcpyHostToDevice);
		cudaMemcpy(dr, r.data(), n * sizeof(*dr), cudaMemcpyHostToDevice);
		tt_gio_batch_create(rig.gio, n, &wb);
		tt_gio_batch_create(rig.gio, n, &rb);
		tt_gio_prep_iocbs(wb, dw, n);
		tt_gio_prep_iocbs(rb, dr, n);
		// Warm up: first launches in each context load the kernels.
		tt_gio_submit_wait(rig.gio, wb, d.io);
		gpu_sync_or_die(d.io, 30);
		smid_kernel<<<1, 32, smem, d.compute>>>(hcomp, 1000);
		gpu_sync_or_die(d.compute, 30);

		// ~400 ms of compute on every compute SM, one block per SM at a time.
		smid_kernel<<<4 * d.compute_sms, 1024, smem, d.compute>>>(hcomp, 100000000ull);
		tt_gio_submit_wait(rig.gio, wb, d.io);
		tt_gio_submit_wait(rig.gio, rb, d.io);
		gpu_sync_or_die(d.io, 30);
		compute_busy = cudaStreamQuery(d.compute) == cudaErrorNotReady;
		gpu_sync_or_die(d.compute, 30);
		tt_gio_batch_result(wb, &e1, nullptr);
		tt_gio_batch_result(rb, &e2, nullptr);
		tap_ok(e1 == 0 && e2 == 0, "domains: %u writes + %u reads in the I/O domain succeed",
		       n, n);
		{
			std::vector<char> x(bytes), y(bytes);

			cudaMemcpy(x.data(), src, bytes, cudaMemcpyDeviceToHost);
			cudaMemcpy(y.data(), dst, bytes, cudaMemcpyDeviceToHost);
			tap_ok(std::memcmp(x.data(), y.data(), bytes) == 0,
			       "domains: round trip bit-exact");
		}
		if (d.green)
			tap_ok(compute_busy,
			       "domains: I/O finished while the compute domain was still full");
		else
			tap_skip("domains: isolation: %s", d.reason);
		tt_gio_batch_destroy(wb);
		tt_gio_batch_destroy(rb);
		gpu_rig_close(&rig);
		cudaFree(src);
		cudaFree(dst);
		cudaFree(dw);
		cudaFree(dr);
	}
	cudaFree(hio);
	cudaFree(hcomp);
	tt_gpu_domains_destroy(&d);
	return tap_done();
}
