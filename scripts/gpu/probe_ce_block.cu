// SPDX-License-Identifier: Apache-2.0
//
// probe_ce_block.cu - can copies that wait behind a spinning kernel hold the copy engines, so
// that a second context's copies (the emulated controller's) never run (issue 12, item 10: the
// controller's copy batches stay pending while the processes' kernels wait for them)?
// probe_ctx_dma.cu held the primary context's queues with spinning kernels and bare event
// waits, and the controller's copy went through. Here the waiting streams also queue copies
// behind the wait, as PyTorch does (a D2H of a result after the attention that needs the loaded
// layer). The spinning kernel ends only when the second context's 4-byte copy lands.
//   probe_ce_block MODE [STREAMS [PRE]]   MODE: none | kernels | d2h | h2d | both
// PRE: 0 the controller's context made after the streams block (default); 1 made before, its
// first copy after; 2 made before and one copy into the flag's allocation done before too.
// Prints "landed after X ms" or "STUCK": then the kernel is released through mapped host
// memory and whether the copy lands after that is printed.
// Build: nvcc -std=c++17 -arch=sm_90 -O2 probe_ce_block.cu -ldl -o probe_ce_block
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	std::printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

#define DRV(f) static decltype(&f) p_##f
DRV(cuDeviceGet); DRV(cuCtxCreate); DRV(cuCtxPopCurrent);
static bool drv_load()
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h)
		return false;
#define SYM(f, v) if (!(p_##f = (decltype(p_##f))dlsym(h, v))) return false
	SYM(cuDeviceGet, "cuDeviceGet"); SYM(cuCtxCreate, "cuCtxCreate_v4");
	SYM(cuCtxPopCurrent, "cuCtxPopCurrent_v2");
	return true;
}

// Spins until the word the controller copies arrives, or the host says stop.
__global__ void spin_until(volatile unsigned *flag, volatile unsigned *stop)
{
	while (*flag != 1u && *stop == 0u)
		__nanosleep(500);
}

__global__ void touch(unsigned *p)
{
	p[threadIdx.x] += 1;
}

static double ms_since(std::chrono::steady_clock::time_point t0)
{
	return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "both";
	int n = argc > 2 ? std::atoi(argv[2]) : 64;
	int pre = argc > 3 ? std::atoi(argv[3]) : 0;
	const size_t piece = 1 << 20;
	CUdevice dev;
	CUcontext ctl, prev;

	setvbuf(stdout, nullptr, _IONBF, 0);
	if (!drv_load()) {
		std::printf("FAIL: libcuda.so.1 or a symbol missing\n");
		return 1;
	}
	CK(cudaSetDevice(0));
	CK(cudaFree(nullptr));
	unsigned *flag, *stop_h, *stop_d, *one;
	char *hbuf, *dbuf;
	CK(cudaMalloc(&flag, 4096));
	CK(cudaMemset(flag, 0, 4096));
	CK(cudaHostAlloc(&stop_h, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
	CK(cudaHostGetDevicePointer(&stop_d, stop_h, 0));
	CK(cudaHostAlloc(&one, 4096, cudaHostAllocPortable));
	CK(cudaHostAlloc(&hbuf, piece * n, cudaHostAllocPortable));
	CK(cudaMalloc(&dbuf, piece * n));
	*stop_h = 0;
	*one = 1;
	CK(cudaDeviceSynchronize());

	cudaStream_t cs = nullptr;
	cudaEvent_t ce = nullptr;
	auto make_ctl = [&]() -> int {
		if (p_cuDeviceGet(&dev, 0) || p_cuCtxCreate(&ctl, nullptr, 0, dev)) {
			std::printf("FAIL: cuCtxCreate\n");
			return 1;
		}
		CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
		CK(cudaEventCreateWithFlags(&ce, cudaEventDisableTiming));
		return 0;
	};
	if (pre >= 1) {
		if (make_ctl())
			return 1;
		if (pre >= 2) {
			CK(cudaMemcpyAsync(flag + 1, one, 4, cudaMemcpyHostToDevice, cs));
			CK(cudaStreamSynchronize(cs));
		}
		p_cuCtxPopCurrent(&prev);
	}
	cudaStream_t sp;
	cudaEvent_t ev;
	std::vector<cudaStream_t> st(n);
	CK(cudaStreamCreateWithFlags(&sp, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	spin_until<<<1, 32, 0, sp>>>(flag, stop_d);
	CK(cudaEventRecord(ev, sp));
	for (int i = 0; i < n; i++) {
		CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
		CK(cudaStreamWaitEvent(st[i], ev, 0));
		bool d2h = !std::strcmp(mode, "d2h") || (!std::strcmp(mode, "both") && (i & 1));
		bool h2d = !std::strcmp(mode, "h2d") || (!std::strcmp(mode, "both") && !(i & 1));
		if (d2h)
			CK(cudaMemcpyAsync(hbuf + i * piece, dbuf + i * piece, piece, cudaMemcpyDeviceToHost, st[i]));
		else if (h2d)
			CK(cudaMemcpyAsync(dbuf + i * piece, hbuf + i * piece, piece, cudaMemcpyHostToDevice, st[i]));
		else if (!std::strcmp(mode, "kernels"))
			touch<<<1, 32, 0, st[i]>>>((unsigned *)(dbuf + i * piece));
	}
	std::this_thread::sleep_for(std::chrono::milliseconds(200));

	// The controller: a context of its own, one copy of 4 bytes into the flag.
	std::printf("%s x%d pre %d: streams blocked\n", mode, n, pre);
	if (pre == 0 ? make_ctl() : 0)
		return 1;
	if (pre >= 1) {
		CUcontext c = ctl;
		typedef CUresult (*push_t)(CUcontext);
		push_t push = (push_t)dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuCtxPushCurrent_v2");
		if (!push || push(c)) {
			std::printf("FAIL: cuCtxPushCurrent\n");
			return 1;
		}
	}
	std::printf("%s x%d pre %d: controller context current, copying\n", mode, n, pre);
	auto t0 = std::chrono::steady_clock::now();
	CK(cudaMemcpyAsync(flag, one, 4, cudaMemcpyHostToDevice, cs));
	CK(cudaEventRecord(ce, cs));
	cudaError_t q;
	while ((q = cudaEventQuery(ce)) == cudaErrorNotReady && ms_since(t0) < 10000)
		std::this_thread::sleep_for(std::chrono::microseconds(200));
	if (q == cudaSuccess) {
		std::printf("%s x%d: the controller's copy landed after %.2f ms\n", mode, n, ms_since(t0));
	} else {
		std::printf("%s x%d: STUCK: the controller's copy not landed after %.0f ms (%s)\n", mode, n,
			    ms_since(t0), cudaGetErrorString(q));
		*stop_h = 1;	// release the kernel: the waiting copies then run, and the controller's?
		t0 = std::chrono::steady_clock::now();
		while ((q = cudaEventQuery(ce)) == cudaErrorNotReady && ms_since(t0) < 10000)
			std::this_thread::sleep_for(std::chrono::microseconds(200));
		std::printf("%s x%d: after releasing the kernel: %s after %.2f ms\n", mode, n,
			    q == cudaSuccess ? "landed" : "still STUCK", ms_since(t0));
	}
	p_cuCtxPopCurrent(&prev);
	*stop_h = 1;
	CK(cudaDeviceSynchronize());
	return 0;
}
