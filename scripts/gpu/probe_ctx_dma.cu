// SPDX-License-Identifier: Apache-2.0
//
// probe_ctx_dma.cu - can an emulated controller's copies run in a CUDA context of their own
// (cuCtxCreate, same device, same process), so they never wait in a hardware queue behind
// the primary context's spinning kernels and event waits (issue 12, item 10)?
//   A. does a copy issued in the second context into memory cudaMalloc'ed by the primary
//      context land (same device, unified addressing)?
//   B. does it complete while 40 primary streams hold every hardware queue (20 spinning
//      until the copied bytes arrive, 20 waiting on an event behind them)?
//   C. copy rate host -> device from the second context, idle and while the primary spins.
//   D. cudaDeviceSynchronize() on the primary context while the second context is busy.
// Build: nvcc -std=c++17 -arch=sm_90 -O2 probe_ctx_dma.cu -ldl -o probe_ctx
#include <dlfcn.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <cuda.h>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	std::printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)
#define DK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { \
	std::printf("FAIL %s: CUresult %d\n", #x, (int)r_); return 1; } } while (0)

#define DRV(f) static decltype(&f) p_##f
DRV(cuDeviceGet); DRV(cuCtxCreate); DRV(cuCtxGetCurrent); DRV(cuStreamCreate);
DRV(cuMemcpyHtoDAsync); DRV(cuStreamSynchronize);
static bool drv_load()
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h)
		return false;
#define SYM(f, v) if (!(p_##f = (decltype(p_##f))dlsym(h, v))) return false
	SYM(cuDeviceGet, "cuDeviceGet"); SYM(cuCtxCreate, "cuCtxCreate_v4");
	SYM(cuCtxGetCurrent, "cuCtxGetCurrent"); SYM(cuStreamCreate, "cuStreamCreate");
	SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"); SYM(cuStreamSynchronize, "cuStreamSynchronize");
	return true;
}

__global__ void spin_until(volatile unsigned *flag, unsigned want)
{
	while (*flag != want)
		__nanosleep(500);
}

static double secs_since(std::chrono::steady_clock::time_point t0)
{
	return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int main()
{
	const size_t bytes = 1ull << 30;
	CUdevice dev;
	CUcontext prim, ctl;
	CUstream cs;

	setvbuf(stdout, nullptr, _IONBF, 0);
	if (!drv_load()) {
		std::printf("FAIL: libcuda.so.1 or a symbol missing\n");
		return 1;
	}
	CK(cudaSetDevice(0));
	CK(cudaFree(nullptr));
	DK(p_cuCtxGetCurrent(&prim));
	char *host, *dst;
	unsigned *flag;
	CK(cudaHostAlloc(&host, bytes, cudaHostAllocPortable));	// pinned for every context
	CK(cudaMalloc(&dst, bytes));
	CK(cudaMalloc(&flag, 4096));
	CK(cudaMemset(flag, 0, 4096));
	CK(cudaDeviceSynchronize());
	std::memset(host, 0x5a, bytes);

	// The controller's context, made and used on its own thread (as the controller's threads).
	std::atomic<int> go{0}, done{0};
	std::atomic<int> err{0};
	double rate_idle = 0, rate_busy = 0;
	std::thread ctlr([&] {
		if (p_cuDeviceGet(&dev, 0) || p_cuCtxCreate(&ctl, nullptr, 0, dev) ||
		    p_cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING)) {
			err = 1;
			return;
		}
		for (int round = 1; round <= 3; round++) {
			while (go.load() < round)
				std::this_thread::yield();
			unsigned *val = (unsigned *)(host + bytes - 4096);
			*val = (unsigned)round;
			auto t0 = std::chrono::steady_clock::now();
			CUresult r = p_cuMemcpyHtoDAsync((CUdeviceptr)dst, host, bytes, cs);
			r = r ? r : p_cuMemcpyHtoDAsync((CUdeviceptr)flag, val, 4, cs);
			r = r ? r : p_cuStreamSynchronize(cs);
			if (r) {
				std::printf("controller copy round %d: CUresult %d\n", round, (int)r);
				err = 1;
				return;
			}
			double dt = secs_since(t0);
			if (round == 1)
				rate_idle = bytes / dt / 1e9;
			else
				rate_busy = bytes / dt / 1e9;
			done = round;
		}
	});

	// A: idle
	go = 1;
	auto t0 = std::chrono::steady_clock::now();
	while (done < 1 && !err && secs_since(t0) < 20)
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	unsigned h = 0;
	CK(cudaMemcpy(&h, flag, 4, cudaMemcpyDeviceToHost));
	char probe = 0;
	CK(cudaMemcpy(&probe, dst + 12345, 1, cudaMemcpyDeviceToHost));
	std::printf("A copy from a second context into primary-context memory: %s (flag %u, byte 0x%02x), %.1f GB/s idle\n",
		    done >= 1 && h == 1 && (unsigned char)probe == 0x5a ? "lands" : "FAILS", h,
		    (unsigned char)probe, rate_idle);
	if (err || done < 1)
		return 2;

	// B: every primary hardware queue held
	cudaStream_t st[40];
	cudaEvent_t ev;
	CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	for (int i = 0; i < 40; i++)
		CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
	for (int i = 0; i < 20; i++)
		spin_until<<<1, 32, 0, st[i]>>>(flag, 2);
	CK(cudaEventRecord(ev, st[0]));
	for (int i = 20; i < 40; i++)
		CK(cudaStreamWaitEvent(st[i], ev, 0));
	std::this_thread::sleep_for(std::chrono::milliseconds(100));
	go = 2;
	t0 = std::chrono::steady_clock::now();
	while (done < 2 && !err && secs_since(t0) < 20)
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	std::printf("B copy while 40 primary streams hold the queues: %s, %.1f GB/s\n",
		    done >= 2 ? "completes" : "STUCK (20 s)", rate_busy);
	t0 = std::chrono::steady_clock::now();
	cudaError_t e = cudaDeviceSynchronize();
	std::printf("B' the primary streams drained after it: %s in %.2f s\n", cudaGetErrorString(e),
		    secs_since(t0));

	// D: primary device synchronize while the controller's context is busy
	go = 3;
	t0 = std::chrono::steady_clock::now();
	CK(cudaDeviceSynchronize());
	double dsync = secs_since(t0);
	while (done < 3 && secs_since(t0) < 20)
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	std::printf("D primary cudaDeviceSynchronize during a 1 GiB controller copy: %.3f s (copy took ~%.3f s)\n",
		    dsync, bytes / (rate_idle * 1e9));
	ctlr.join();
	return 0;
}
