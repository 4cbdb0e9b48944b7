// SPDX-License-Identifier: Apache-2.0
//
// probe_resident_dma.cu - can an emulated controller move data with a kernel that
// stays resident in a green context, so it never waits in a CUDA hardware queue
// behind the work it serves (issue 12, item 10)?  Questions, each printed as one line:
//   1. does cudaDeviceSynchronize() (what torch.cuda.synchronize() calls) on the
//      primary context return while that kernel runs in a green context?
//   2. does cudaStreamSynchronize on a primary-context stream?
//   3. does the resident kernel serve a copy while the primary context's hardware
//      queues are held by a spinning kernel and by a stream waiting on an event that
//      only the copy's completion makes possible (the hang's shape), and at what rate?
// Build: nvcc -std=c++17 -arch=sm_90 -O2 probe_resident_dma.cu -ldl -o probe
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

// The driver API, resolved at run time (no libcuda to link against on the build machine).
#define DRV(f) static decltype(&f) p_##f
DRV(cuDeviceGet); DRV(cuDeviceGetDevResource); DRV(cuDevSmResourceSplitByCount);
DRV(cuDevResourceGenerateDesc); DRV(cuGreenCtxCreate); DRV(cuGreenCtxStreamCreate);
static bool drv_load()
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h)
		return false;
#define SYM(f) if (!(p_##f = (decltype(p_##f))dlsym(h, #f))) return false
	SYM(cuDeviceGet); SYM(cuDeviceGetDevResource); SYM(cuDevSmResourceSplitByCount);
	SYM(cuDevResourceGenerateDesc); SYM(cuGreenCtxCreate); SYM(cuGreenCtxStreamCreate);
	return true;
}

struct work {
	volatile unsigned req;      // host: request number (1, 2, ...); ~0u: quit
	unsigned arrived;           // blocks done, cumulative
	volatile unsigned served;   // last request every block finished
	const char *src;            // host (mapped) pointer as seen by the device
	char *dst;
	unsigned long long bytes;
};

__global__ void resident_dma(work *w)
{
	__shared__ unsigned req;
	unsigned gen = 0;

	for (;;) {
		if (threadIdx.x == 0) {
			while ((req = w->req) == gen)
				__nanosleep(200);
		}
		__syncthreads();
		if (req == ~0u)
			return;
		gen = req;
		const uint4 *s = (const uint4 *)w->src;
		uint4 *d = (uint4 *)w->dst;
		unsigned long long n = w->bytes / 16;
		for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
		     i += (unsigned long long)gridDim.x * blockDim.x)
			d[i] = s[i];
		__threadfence_system();
		__syncthreads();
		if (threadIdx.x == 0 && atomicAdd(&w->arrived, 1) == gridDim.x * gen - 1) {
			__threadfence_system();
			w->served = gen;
		}
	}
}

// Spins until *flag becomes nonzero (the shape of a gio kernel waiting for completions).
__global__ void spin_until(volatile unsigned *flag)
{
	while (*flag == 0)
		__nanosleep(500);
}

__global__ void set_flag(volatile unsigned *flag, const volatile unsigned *served, unsigned want)
{
	while (*served < want)
		__nanosleep(500);
	*flag = 1;
}

static bool returns_within(double secs, void (*fn)(void *), void *arg)
{
	std::atomic<bool> done{false};
	std::thread t([&] { fn(arg); done = true; });
	auto t0 = std::chrono::steady_clock::now();
	while (!done && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < secs)
		std::this_thread::sleep_for(std::chrono::milliseconds(10));
	bool ok = done;
	if (ok)
		t.join();
	else
		t.detach();
	return ok;
}

int main(int argc, char **argv)
{
	unsigned io_sms = argc > 1 ? (unsigned)atoi(argv[1]) : 16;
	size_t bytes = 1ull << 30;
	CUdevice dev;
	CUdevResource all, io, rest;
	CUdevResourceDesc dio;
	CUgreenCtx g;
	CUstream gs;
	unsigned nb = 1;

	setvbuf(stdout, nullptr, _IONBF, 0);	// a hang is killed by timeout(1): keep every line
	CK(cudaSetDevice(0));
	CK(cudaFree(nullptr));
	if (!drv_load()) {
		std::printf("FAIL: libcuda.so.1 or a green-context symbol missing\n");
		return 1;
	}
	DK(p_cuDeviceGet(&dev, 0));
	DK(p_cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
	DK(p_cuDevSmResourceSplitByCount(&io, &nb, &all, &rest, 0, io_sms));
	DK(p_cuDevResourceGenerateDesc(&dio, &io, 1));
	DK(p_cuGreenCtxCreate(&g, dio, dev, CU_GREEN_CTX_DEFAULT_STREAM));
	DK(p_cuGreenCtxStreamCreate(&gs, g, CU_STREAM_NON_BLOCKING, 0));
	std::printf("green context: %u SMs for the resident kernel, %u left\n", io.sm.smCount,
		    rest.sm.smCount);

	work *w;
	char *host, *dev_buf;
	CK(cudaHostAlloc(&w, sizeof(*w), cudaHostAllocMapped));
	CK(cudaHostAlloc(&host, bytes, cudaHostAllocMapped));
	CK(cudaMalloc(&dev_buf, bytes));
	std::memset((void *)w, 0, sizeof(*w));
	std::memset(host, 0x5a, bytes);
	work *wd;
	CK(cudaHostGetDevicePointer(&wd, w, 0));
	CK(cudaHostGetDevicePointer((void **)&w->src, host, 0));
	w->dst = dev_buf;
	w->bytes = bytes;
	int blocks = (int)io.sm.smCount * 2;
	resident_dma<<<blocks, 1024, 0, (cudaStream_t)gs>>>(wd);
	CK(cudaGetLastError());
	std::this_thread::sleep_for(std::chrono::milliseconds(200));

	// 1. device synchronize on the primary context
	bool r1 = returns_within(5.0, [](void *) { cudaDeviceSynchronize(); }, nullptr);
	std::printf("Q1 cudaDeviceSynchronize with a resident kernel in a green context: %s\n",
		    r1 ? "returns" : "BLOCKS (>5 s)");
	// 2. a primary stream's synchronize
	cudaStream_t ps;
	CK(cudaStreamCreateWithFlags(&ps, cudaStreamNonBlocking));
	bool r2 = returns_within(5.0, [](void *a) { cudaStreamSynchronize(*(cudaStream_t *)a); }, &ps);
	std::printf("Q2 cudaStreamSynchronize(primary stream): %s\n", r2 ? "returns" : "BLOCKS");

	// 3. the hang's shape: 40 primary streams (more than the hardware queues), each one
	// either spinning until the copy is served or waiting on an event recorded after a spin.
	unsigned *flag;
	CK(cudaMalloc(&flag, sizeof(unsigned)));
	CK(cudaMemset(flag, 0, sizeof(unsigned)));
	CK(cudaDeviceSynchronize());
	cudaStream_t st[40];
	cudaEvent_t ev;
	CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	for (int i = 0; i < 40; i++)
		CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
	unsigned *served_d;
	CK(cudaHostGetDevicePointer(&served_d, (void *)&w->served, 0));
	for (int i = 0; i < 20; i++)
		spin_until<<<1, 32, 0, st[i]>>>(flag);
	CK(cudaEventRecord(ev, st[0]));
	for (int i = 20; i < 39; i++)
		CK(cudaStreamWaitEvent(st[i], ev, 0));
	set_flag<<<1, 1, 0, st[39]>>>(flag, served_d, 1);
	auto t0 = std::chrono::steady_clock::now();
	w->req = 1;
	while (w->served < 1 &&
	       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 10)
		;
	double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
	std::printf("Q3 copy served while the primary queues are held: %s, %.2f GB/s (1 GiB)\n",
		    w->served >= 1 ? "yes" : "NO (10 s)", bytes / dt / 1e9);
	bool r3 = returns_within(10.0, [](void *) { cudaDeviceSynchronize(); }, nullptr);
	std::printf("Q3b the held streams drained afterwards: %s\n", r3 ? "yes" : "NO");
	// rate, idle GPU: 5 copies
	t0 = std::chrono::steady_clock::now();
	for (unsigned k = 2; k <= 6; k++) {
		w->req = k;
		while (w->served < k)
			;
	}
	dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
	std::printf("rate, idle GPU: %.2f GB/s (5 x 1 GiB, %d blocks of 1024 threads)\n",
		    5.0 * bytes / dt / 1e9, blocks);
	w->req = ~0u;
	bool r4 = returns_within(5.0, [](void *a) { cudaStreamSynchronize((cudaStream_t)a); }, gs);
	std::printf("resident kernel quit: %s\n", r4 ? "yes" : "NO");
	return 0;
}
