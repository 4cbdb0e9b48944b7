// SPDX-License-Identifier: Apache-2.0
//
// emu_ctx.cuh - the emulated controller's own CUDA context (TUTTI_EMU_DMA=copy
// only: by default the gio kernels move its data and it needs no context).
// Included once, by emu_ctrl.cu.
//
// CUDA runs the streams of one context through CUDA_DEVICE_MAX_CONNECTIONS
// hardware queues (8 by default, at most 32), and a queue runs its work in
// order, whatever stream it came from. The gio path's kernels spin until the
// controller completes their commands, and compute streams wait on events
// recorded behind them: a controller copy queued in the same hardware queue as
// either never runs, and nothing ends. With 32 queues that still happened
// whenever the process had more streams than queues (PyTorch's stream pools
// alone make 64): on the H200, 6 of 12 processes running the layer-order test
// hung, the controller's copy batches pending with their events not ready
// (docs/gpu.md).
//
// A context of its own has hardware queues of its own. Measured there
// (scripts/gpu/probe_ctx_dma.cu): a 1 GiB copy from a second context of the
// same process into memory the primary context allocated lands (unified
// addressing) at 55 GB/s, also while 40 primary-context streams hold every
// queue; and the primary context's cudaDeviceSynchronize() does not wait for
// it. (A resident copy kernel in a green context was tried first: the
// primary context's device synchronize then never returns.) A real controller
// is an agent of its own too: it moves data whatever the GPU's queues hold.
#ifndef TT_EMU_CTX_CUH
#define TT_EMU_CTX_CUH

#include "cuda_drv.cuh"

static struct {
	decltype(&cuDeviceGet) DeviceGet;
	decltype(&cuCtxCreate) CtxCreate;
	decltype(&cuCtxDestroy) CtxDestroy;
	decltype(&cuCtxPushCurrent) CtxPushCurrent;
	decltype(&cuCtxPopCurrent) CtxPopCurrent;
	decltype(&cuCtxSetCurrent) CtxSetCurrent;
} emu_drv;

static bool emu_drv_load(void)
{
	return tt_drv_sym("cuDeviceGet", &emu_drv.DeviceGet) &&
	       tt_drv_sym("cuCtxCreate", &emu_drv.CtxCreate) &&
	       tt_drv_sym("cuCtxDestroy", &emu_drv.CtxDestroy) &&
	       tt_drv_sym("cuCtxPushCurrent", &emu_drv.CtxPushCurrent) &&
	       tt_drv_sym("cuCtxPopCurrent", &emu_drv.CtxPopCurrent) &&
	       tt_drv_sym("cuCtxSetCurrent", &emu_drv.CtxSetCurrent);
}

// The controller's context on @device (TUTTI_EMU_CONTEXT=primary: none, the
// caller's, for comparison). Return: 0, -ENOSYS (driver too old), -EIO.
static int emu_ctx_create(int device, CUcontext *out)
{
	const char *which = std::getenv("TUTTI_EMU_CONTEXT");
	CUdevice dev;
	CUcontext ctx = nullptr, prev = nullptr;

	*out = nullptr;
	if (which && !std::strcmp(which, "primary"))
		return 0;
	if (!emu_drv_load())
		return -ENOSYS;
	if (emu_drv.DeviceGet(&dev, device) != CUDA_SUCCESS ||
	    emu_drv.CtxCreate(&ctx, nullptr, CU_CTX_SCHED_AUTO, dev) != CUDA_SUCCESS)
		return -EIO;
	// cuCtxCreate makes it current: give the caller its own back.
	emu_drv.CtxPopCurrent(&prev);
	*out = ctx;
	return 0;
}

// Run the next runtime calls of this thread in @ctx until emu_ctx_leave().
static bool emu_ctx_enter(CUcontext ctx)
{
	return !ctx || emu_drv.CtxPushCurrent(ctx) == CUDA_SUCCESS;
}

static void emu_ctx_leave(CUcontext ctx)
{
	CUcontext prev;

	if (ctx)
		emu_drv.CtxPopCurrent(&prev);
}

#endif /* TT_EMU_CTX_CUH */
