// SPDX-License-Identifier: Apache-2.0
//
// Description: the GPU paths under faults (issue 12, items 9b and 10): the
// emulated controller makes progress whatever the GPU's hardware queues hold
// (64 streams, more than there are queues, half of them spinning until the
// round trip ends, half waiting behind them); a launch that fails leaves the
// batch usable (its completion target not moved); an earlier error nobody
// read does not fail a later good launch. Without a GPU: "1..0 # SKIP no CUDA device".
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tap.h"
#include "gpu_rig.cuh"

#include <tutti/gpu_sum.h>

// 4 queues of 64 on 2 threads, host memory, SGL.
static struct tt_emu_params params(uint64_t ns_bytes)
{
	struct tt_emu_params p = base_params(4, 64, TT_EMU_HOSTMEM, ns_bytes, true);

	p.n_threads = 2;
	return p;
}

__global__ void spin_until(volatile unsigned *flag)
{
	while (*flag == 0)
		__nanosleep(1000);
}

__global__ void set_flag(unsigned *flag)
{
	*flag = 1;
}

// Every hardware queue of the primary context held while a write and a read
// run: 32 streams spin until the round trip is over, 32 more wait on an event
// recorded behind a spinning one (as compute streams wait for a loaded
// layer). The controller must still complete every command.
static void progress_whatever_the_queues_hold(void)
{
	const uint32_t n = 512, obj = 8192;
	uint64_t bytes = (uint64_t)n * obj;
	struct tt_emu_params p = params(bytes);
	struct tt_gio_batch *b = nullptr;
	struct tt_gio_iocb *d = nullptr;
	cudaStream_t held[64], io;
	cudaEvent_t ev;
	unsigned *flag;
	struct gpu_rig r;
	uint32_t n_err = ~0u;
	char *src, *dst;
	int i, rc;

	if (!tap_ok(gpu_rig_open(&r, &p, 2) == 0, "held queues: open"))
		return;
	cudaStreamCreateWithFlags(&io, cudaStreamNonBlocking);
	cudaMalloc(&src, bytes);
	cudaMalloc(&dst, bytes);
	cudaMalloc(&d, n * sizeof(*d));
	cudaMalloc(&flag, sizeof(*flag));
	cudaMemset(flag, 0, sizeof(*flag));
	cudaMemset(dst, 0, bytes);
	gpu_fill(src, bytes, 21);
	cudaDeviceSynchronize();
	cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
	// Load set_flag now: a kernel's first (lazy) load waits for the device
	// to go idle, which the spinning streams never let it (the flag that
	// ends them would never be set).
	set_flag<<<1, 1, 0, io>>>(flag);
	cudaMemsetAsync(flag, 0, sizeof(*flag), io);
	gpu_sync_or_die(io, 10);
	for (i = 0; i < 64; i++)
		cudaStreamCreateWithFlags(&held[i], cudaStreamNonBlocking);
	for (i = 0; i < 32; i++)
		spin_until<<<1, 32, 0, held[i]>>>(flag);
	cudaEventRecord(ev, held[0]);
	for (i = 32; i < 64; i++)
		cudaStreamWaitEvent(held[i], ev, 0);
	tt_gio_batch_create(r.gio, n, &b);
	for (i = 0; i < 2; i++) {
		std::vector<tt_gio_iocb> v = gpu_linear_iocbs(i ? dst : src, n, obj,
							       i ? TT_NVME_CMD_READ : TT_NVME_CMD_WRITE, 0);

		cudaMemcpyAsync(d, v.data(), n * sizeof(*d), cudaMemcpyHostToDevice, io);
		tt_gio_prep_iocbs(b, d, n);
		tap_ok(tt_gio_submit_wait(r.gio, b, io) == 0, "held queues: %s launched",
		       i ? "read" : "write");
		gpu_sync_or_die(io, 30);	// "Bail out!" when the controller is stuck
		// Only the batch's own kernel may be waited for: the held streams
		// go on only after the round trip (a device-wide wait never returned).
		n_err = ~0u;
		rc = tt_gio_batch_result(b, &n_err, nullptr);
		tap_ok(rc == 0 && n_err == 0, "held queues: %s completed (%d), %u commands failed",
		       i ? "read" : "write", rc, n_err);
	}
	set_flag<<<1, 1, 0, io>>>(flag);
	gpu_sync_or_die(io, 10);
	for (i = 0; i < 64; i++)
		gpu_sync_or_die(held[i], 10);
	tap_ok(gpu_dev_equal(dst, src, bytes), "held queues: round trip bit-exact");
	for (i = 0; i < 64; i++)
		cudaStreamDestroy(held[i]);
	tt_gio_batch_destroy(b);
	gpu_rig_close(&r);
	cudaStreamDestroy(io);
	cudaEventDestroy(ev);
	cudaFree(src);
	cudaFree(dst);
	cudaFree(d);
	cudaFree(flag);
}

// A launch that fails (injected: TUTTI_GIO_FAULT_LAUNCH) must not move the batch's target:
// the next launch on a good stream completes instead of waiting forever.
static void failed_launch_leaves_the_batch_usable(void)
{
	const uint32_t n = 64, obj = 4096;
	uint64_t bytes = (uint64_t)n * obj;
	struct tt_emu_params p = params(bytes);
	struct tt_gio_batch *b = nullptr;
	struct tt_gio_iocb *d = nullptr;
	struct gpu_rig r;
	uint32_t n_err = ~0u;
	char *src;
	int rc;

	setenv("TUTTI_GIO_FAULT_LAUNCH", "1", 1);	// the first launch fails
	rc = gpu_rig_open(&r, &p, 2);
	unsetenv("TUTTI_GIO_FAULT_LAUNCH");
	if (!tap_ok(rc == 0, "failed launch: open"))
		return;
	cudaMalloc(&src, bytes);
	cudaMalloc(&d, n * sizeof(*d));
	gpu_fill(src, bytes, 5);
	std::vector<tt_gio_iocb> v = gpu_linear_iocbs(src, n, obj, TT_NVME_CMD_WRITE, 0);
	cudaMemcpy(d, v.data(), n * sizeof(*d), cudaMemcpyHostToDevice);
	tt_gio_batch_create(r.gio, n, &b);
	tt_gio_prep_iocbs(b, d, n);
	rc = tt_gio_batch_result(b, &n_err, nullptr);
	tap_ok(rc == -EINVAL && n_err == n, "failed launch: no result before a reaping launch "
	       "(%d, %u of %u counted failed)", rc, n_err, n);
	tap_ok(tt_gio_submit_wait(r.gio, b, r.s) != 0, "failed launch: the launch fails");
	rc = tt_gio_batch_result(b, &n_err, nullptr);
	tap_ok(rc == -EINVAL, "failed launch: still no result after it (%d)", rc);
	tap_ok(tt_gio_submit_wait(r.gio, b, r.s) == 0, "failed launch: then launched on a good stream");
	gpu_sync_or_die(r.s, 20);	// waits forever (bails out) if the target moved
	n_err = ~0u;
	rc = tt_gio_batch_result(b, &n_err, nullptr);
	tap_ok(rc == 0 && n_err == 0, "failed launch: the next run completes (%d, %u failed)", rc, n_err);
	tt_gio_batch_destroy(b);
	gpu_rig_close(&r);
	cudaFree(src);
	cudaFree(d);
}

// An error left unread by someone else (a failed allocation) must not make a
// good launch report failure.
static void stale_error_does_not_fail_a_launch(void)
{
	struct tt_gpu_sum_layer sd = {};
	uint64_t *sums;
	uint32_t *ids;
	char *mem, *huge = nullptr;

	cudaMalloc(&mem, 1 << 20);
	cudaMalloc(&sums, 4096);
	cudaMalloc(&ids, 64);
	cudaMemset(ids, 0, 64);
	cudaDeviceSynchronize();
	sd.geo.n_layers = 1;
	sd.geo.n_spans = 1;
	sd.geo.span_bytes = 4096;
	sd.geo.obj_stride = 4096;
	sd.geo.n_slots = 1;
	sd.layer = 0;
	sd.n_blocks = 1;
	sd.block_ids = ids;
	sd.sums = sums;
	sd.base[0] = (uint64_t)(uintptr_t)mem;
	sd.stride[0] = 4096;
	tap_ok(cudaMalloc(&huge, 1ull << 50) != cudaSuccess, "stale error: a failed allocation");
	tap_eq(tt_gpu_sum_layer(&sd, nullptr), 0, "stale error: a good hash launch still succeeds");
	cudaDeviceSynchronize();
	cudaGetLastError();
	cudaFree(mem);
	cudaFree(sums);
	cudaFree(ids);
}

int main(void)
{
	gpu_require_device();
	progress_whatever_the_queues_hold();
	failed_launch_leaves_the_batch_usable();
	stale_error_does_not_fail_a_launch();
	return tap_done();
}
