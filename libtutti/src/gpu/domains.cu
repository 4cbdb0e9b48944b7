// SPDX-License-Identifier: Apache-2.0
//
// domains.cu - I/O and compute SM domains with CUDA green contexts
// (driver API: cuDevSmResourceSplitByCount, cuGreenCtxCreate), falling
// back to two plain streams over the whole GPU. Driver functions are
// looked up at run time (cudaGetDriverEntryPointByVersion), so nothing
// links against libcuda and an old driver just means the fallback.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include <cuda.h>
#include <cuda_runtime.h>

#include "tutti/gpu_domains.h"

#include "cuda_drv.cuh"

struct gpu_domains_priv {
	CUgreenCtx io_ctx;
	CUgreenCtx compute_ctx;
};

// The driver calls used, resolved at run time.
static struct {
	decltype(&cuDeviceGet) DeviceGet;
	decltype(&cuDeviceGetDevResource) DeviceGetDevResource;
	decltype(&cuDevSmResourceSplitByCount) DevSmResourceSplitByCount;
	decltype(&cuDevResourceGenerateDesc) DevResourceGenerateDesc;
	decltype(&cuGreenCtxCreate) GreenCtxCreate;
	decltype(&cuGreenCtxStreamCreate) GreenCtxStreamCreate;
	decltype(&cuGreenCtxDestroy) GreenCtxDestroy;
	decltype(&cuStreamDestroy) StreamDestroy;
	decltype(&cuGetErrorName) GetErrorName;
} drv;

// Return: NULL, or the first symbol the driver lacks.
static const char *drv_load(void)
{
	if (!tt_drv_sym("cuDeviceGet", &drv.DeviceGet)) return "cuDeviceGet";
	if (!tt_drv_sym("cuDeviceGetDevResource", &drv.DeviceGetDevResource)) return "cuDeviceGetDevResource";
	if (!tt_drv_sym("cuDevSmResourceSplitByCount", &drv.DevSmResourceSplitByCount))
		return "cuDevSmResourceSplitByCount";
	if (!tt_drv_sym("cuDevResourceGenerateDesc", &drv.DevResourceGenerateDesc))
		return "cuDevResourceGenerateDesc";
	if (!tt_drv_sym("cuGreenCtxCreate", &drv.GreenCtxCreate)) return "cuGreenCtxCreate";
	if (!tt_drv_sym("cuGreenCtxStreamCreate", &drv.GreenCtxStreamCreate)) return "cuGreenCtxStreamCreate";
	if (!tt_drv_sym("cuGreenCtxDestroy", &drv.GreenCtxDestroy)) return "cuGreenCtxDestroy";
	if (!tt_drv_sym("cuStreamDestroy", &drv.StreamDestroy)) return "cuStreamDestroy";
	if (!tt_drv_sym("cuGetErrorName", &drv.GetErrorName)) return "cuGetErrorName";
	return nullptr;
}

static bool dom_fail(struct tt_gpu_domains *d, const char *what, CUresult r)
{
	const char *name = nullptr;

	if (r == CUDA_SUCCESS)
		return false;
	drv.GetErrorName(r, &name);
	std::snprintf(d->reason, sizeof(d->reason), "%s: %s", what, name ? name : "error");
	return true;
}

static int dom_green(unsigned io_sms, struct tt_gpu_domains *d, gpu_domains_priv *p)
{
	CUdevResource all, io, rest;
	CUdevResourceDesc dio, drest;
	CUstream sio = nullptr, scomp = nullptr;
	unsigned nb = 1;
	CUdevice dev;
	int ord = 0;

	const char *missing;

	if (cudaGetDevice(&ord) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
		std::snprintf(d->reason, sizeof(d->reason), "no CUDA device");
		return -1;
	}
	if ((missing = drv_load())) {
		std::snprintf(d->reason, sizeof(d->reason), "driver lacks %s", missing);
		return -1;
	}
	if (dom_fail(d, "cuDeviceGet", drv.DeviceGet(&dev, ord)) ||
	    dom_fail(d, "cuDeviceGetDevResource",
		     drv.DeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM)) ||
	    dom_fail(d, "cuDevSmResourceSplitByCount",
		     drv.DevSmResourceSplitByCount(&io, &nb, &all, &rest, 0, io_sms)) ||
	    dom_fail(d, "cuDevResourceGenerateDesc(io)", drv.DevResourceGenerateDesc(&dio, &io, 1)) ||
	    dom_fail(d, "cuDevResourceGenerateDesc(compute)",
		     drv.DevResourceGenerateDesc(&drest, &rest, 1)) ||
	    dom_fail(d, "cuGreenCtxCreate(io)",
		     drv.GreenCtxCreate(&p->io_ctx, dio, dev, CU_GREEN_CTX_DEFAULT_STREAM)) ||
	    dom_fail(d, "cuGreenCtxCreate(compute)",
		     drv.GreenCtxCreate(&p->compute_ctx, drest, dev, CU_GREEN_CTX_DEFAULT_STREAM)) ||
	    dom_fail(d, "cuGreenCtxStreamCreate(io)",
		     drv.GreenCtxStreamCreate(&sio, p->io_ctx, CU_STREAM_NON_BLOCKING, 0)) ||
	    dom_fail(d, "cuGreenCtxStreamCreate(compute)",
		     drv.GreenCtxStreamCreate(&scomp, p->compute_ctx, CU_STREAM_NON_BLOCKING, 0)) ||
	    nb != 1 || rest.sm.smCount == 0) {
		if (nb != 1 || rest.sm.smCount == 0)
			std::snprintf(d->reason, sizeof(d->reason), "split left no compute SMs");
		if (sio)
			drv.StreamDestroy(sio);
		if (scomp)
			drv.StreamDestroy(scomp);
		return -1;
	}
	d->io = sio;
	d->compute = scomp;
	d->io_sms = io.sm.smCount;
	d->compute_sms = rest.sm.smCount;
	d->green = 1;
	return 0;
}

extern "C" int tt_gpu_domains_create(unsigned io_sms, struct tt_gpu_domains *d)
{
	gpu_domains_priv *p = new (std::nothrow) gpu_domains_priv();
	cudaStream_t a = nullptr, b = nullptr;
	int ord = 0, sms = 0;

	std::memset(d, 0, sizeof(*d));
	if (!p)
		return -ENOMEM;
	d->priv = p;
	if (io_sms && dom_green(io_sms, d, p) == 0)
		return 0;
	if (!io_sms)
		std::snprintf(d->reason, sizeof(d->reason), "no I/O SMs asked for");
	// Fallback: whatever was made goes; two plain streams over the GPU.
	if (p->io_ctx)
		drv.GreenCtxDestroy(p->io_ctx);
	if (p->compute_ctx)
		drv.GreenCtxDestroy(p->compute_ctx);
	p->io_ctx = p->compute_ctx = nullptr;
	if (cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) != cudaSuccess) {
		delete p;
		d->priv = nullptr;
		return -EIO;
	}
	cudaGetDevice(&ord);
	cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ord);
	d->io = a;
	d->compute = b;
	d->io_sms = d->compute_sms = (unsigned)sms;
	d->green = 0;
	return 0;
}

extern "C" void tt_gpu_domains_destroy(struct tt_gpu_domains *d)
{
	gpu_domains_priv *p = (gpu_domains_priv *)d->priv;

	if (d->io)
		cudaStreamDestroy(d->io);
	if (d->compute)
		cudaStreamDestroy(d->compute);
	if (p) {
		if (p->io_ctx)
			drv.GreenCtxDestroy(p->io_ctx);
		if (p->compute_ctx)
			drv.GreenCtxDestroy(p->compute_ctx);
		delete p;
	}
	std::memset(d, 0, sizeof(*d));
}
