// SPDX-License-Identifier: Apache-2.0
//
// Description: gio_uring round trips GPU memory <-> emulated NVMe store,
// bit-exact: SGL and PRP data pointers, multi-segment commands (SGL
// segments, PRP lists), ring wrap many times over, 32 queue pairs, the
// issue/wait_cqe kernels on two streams, layer descriptors (tt_locate on
// the GPU, two namespaces), per-command errors, the bandwidth cap, and the
// hang diagnostics (tt_gio_dump, tt_emu_dump, tt_gio_batch_dump) on an idle
// controller. File-backed namespaces: test_gpu_gio_file.cu. Without a GPU:
// "1..0 # SKIP no CUDA device".
//
// Build: nvcc -std=c++17 -arch=sm_90 -Ilibtutti/include libtutti/tests/test_gpu_gio.cu
//        libtutti/src/gpu/{gio_uring,emu_ctrl,domains}.cu -o test_gpu_gio

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "tap.h"
#include "gpu_rig.cuh"

// Object i of @n, each @obj bytes: contiguous at @buf + i * obj, LBA i * obj / 4K.
// Write @n objects from a patterned GPU buffer to the store, read them back
// into a zeroed one, compare store and both buffers.
static void round_trip(const char *name, bool sgl, uint32_t nq, uint32_t depth,
		       uint32_t n, uint32_t obj, uint32_t first_off)
{
	uint64_t bytes = (uint64_t)n * obj;
	struct tt_emu_params p = base_params(nq, depth, TT_EMU_HOSTMEM, bytes, sgl);
	struct tt_emu_stats st;
	struct gpu_rig r;
	char *src, *dst;
	bool every_q = true;
	uint32_t q;

	if (!tap_ok(gpu_rig_open(&r, &p, 4) == 0, "%s: open emulator + gio_uring", name))
		return;
	cudaMalloc(&src, bytes + first_off);
	cudaMalloc(&dst, bytes + first_off);
	gpu_fill(src, bytes + first_off, 0x5eed + n);
	cudaMemset(dst, 0, bytes + first_off);
	tap_eq(run_iocbs(&r, gpu_linear_iocbs(src, n, obj, TT_NVME_CMD_WRITE, first_off), nullptr),
	       0, "%s: %u writes of %u B on %u queues, all succeed", name, n, obj, nq);
	tap_ok(gpu_dev_equal(tt_emu_ns_data(r.emu, 1), src + first_off, bytes),
	       "%s: store holds exactly the GPU buffer", name);
	tap_eq(run_iocbs(&r, gpu_linear_iocbs(dst, n, obj, TT_NVME_CMD_READ, first_off), nullptr),
	       0, "%s: %u reads back, all succeed", name, n);
	tap_ok(gpu_dev_equal(dst + first_off, src + first_off, bytes),
	       "%s: GPU buffer read back is bit-exact", name);
	tt_emu_get_stats(r.emu, &st);
	tap_eq(st.cmds, 2ull * n, "%s: controller completed every command once", name);
	for (q = 0; q < nq; q++)
		every_q &= tt_emu_queue_cmds(r.emu, q) >= 2ull * n / nq / 2;
	tap_ok(every_q, "%s: every queue carried its share", name);
	if (2ull * n / nq > depth)
		tap_ok(st.cq_wraps >= nq && st.sq_wraps >= nq,
		       "%s: rings wrapped (%llu SQ, %llu CQ wraps)", name,
		       (unsigned long long)st.sq_wraps, (unsigned long long)st.cq_wraps);
	gpu_rig_close(&r);
	cudaFree(src);
	cudaFree(dst);
}

// Each command gathers 4 scattered 4 KiB pieces: SGL segment lists or PRP lists.
static void multi_segment(bool sgl)
{
	const char *name = sgl ? "multi-seg SGL" : "multi-seg PRP";
	const uint32_t n = 2048, piece = 4096, k = 4;
	uint64_t bytes = (uint64_t)n * k * piece;
	struct tt_emu_params p = base_params(8, 128, TT_EMU_HOSTMEM, bytes, sgl);
	std::vector<tt_gio_iocb> w(n), rd(n);
	std::vector<uint32_t> perm(n * k);
	std::mt19937 rng(7);
	struct gpu_rig r;
	char *src, *dst, *lin;
	uint32_t i, j;

	if (!tap_ok(gpu_rig_open(&r, &p, 4) == 0, "%s: open", name))
		return;
	cudaMalloc(&src, bytes);
	cudaMalloc(&dst, bytes);
	cudaMalloc(&lin, bytes);
	gpu_fill(src, bytes, 99);
	cudaMemset(dst, 0, bytes);
	for (i = 0; i < n * k; i++)
		perm[i] = i;
	std::shuffle(perm.begin(), perm.end(), rng);
	// Store piece i holds src piece perm[i]; reading scatters it to dst piece perm[i].
	for (i = 0; i < n; i++) {
		std::memset(&w[i], 0, sizeof(w[i]));
		w[i].lba = (uint64_t)i * k;
		w[i].nsid = 1;
		w[i].op = TT_NVME_CMD_WRITE;
		w[i].nseg = k;
		for (j = 0; j < k; j++) {
			w[i].seg[j].addr = (uint64_t)(uintptr_t)src + (uint64_t)perm[i * k + j] * piece;
			w[i].seg[j].len = piece;
		}
		rd[i] = w[i];
		rd[i].op = TT_NVME_CMD_READ;
		for (j = 0; j < k; j++)
			rd[i].seg[j].addr = (uint64_t)(uintptr_t)dst + (uint64_t)perm[i * k + j] * piece;
	}
	tap_eq(run_iocbs(&r, w, nullptr), 0, "%s: %u gathered writes succeed", name, n);
	{
		std::vector<char> store(bytes), s(bytes);
		bool ok = true;

		std::memcpy(store.data(), tt_emu_ns_data(r.emu, 1), bytes);
		cudaMemcpy(s.data(), src, bytes, cudaMemcpyDeviceToHost);
		for (i = 0; i < n * k && ok; i++)
			ok = std::memcmp(store.data() + (uint64_t)i * piece,
					 s.data() + (uint64_t)perm[i] * piece, piece) == 0;
		tap_ok(ok, "%s: store pieces are the gathered GPU pieces in order", name);
	}
	tap_eq(run_iocbs(&r, rd, nullptr), 0, "%s: %u scattered reads succeed", name, n);
	tap_ok(gpu_dev_equal(dst, src, bytes), "%s: scattered read is bit-exact", name);
	gpu_rig_close(&r);
	cudaFree(src);
	cudaFree(dst);
	cudaFree(lin);
}

// issue_io and wait_cqe as two kernels on two streams, 16x the ring depth.
static void issue_then_wait(void)
{
	const uint32_t n = 16384, obj = 4096, nq = 4, depth = 256;
	uint64_t bytes = (uint64_t)n * obj;
	struct tt_emu_params p = base_params(nq, depth, TT_EMU_HOSTMEM, bytes, true);
	struct tt_gio_batch *b = nullptr;
	struct tt_gio_iocb *d;
	cudaStream_t s2;
	cudaEvent_t ev;
	struct gpu_rig r;
	uint32_t n_err = ~0u;
	char *src, *dst;
	int i, rc;

	if (!tap_ok(gpu_rig_open(&r, &p, 2) == 0, "issue+wait: open"))
		return;
	cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
	cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
	cudaMalloc(&src, bytes);
	cudaMalloc(&dst, bytes);
	cudaMalloc(&d, n * sizeof(*d));
	gpu_fill(src, bytes, 3);
	cudaMemset(dst, 0, bytes);
	tt_gio_batch_create(r.gio, n, &b);
	for (i = 0; i < 2; i++) {
		std::vector<tt_gio_iocb> io = gpu_linear_iocbs(i ? dst : src, n, obj,
			i ? TT_NVME_CMD_READ : TT_NVME_CMD_WRITE, 0);

		cudaMemcpy(d, io.data(), n * sizeof(*d), cudaMemcpyHostToDevice);
		tt_gio_prep_iocbs(b, d, n);
		tap_ok(tt_gio_issue(r.gio, b, r.s) == 0 && tt_gio_wait_cqe(r.gio, b, s2) == 0,
		       "issue+wait: %s launched on two streams", i ? "read" : "write");
		cudaEventRecord(ev, s2);
		cudaStreamWaitEvent(r.s, ev, 0);  // compute on r.s would go here
		gpu_sync_or_die(r.s, 30);
		gpu_sync_or_die(s2, 30);
		rc = tt_gio_batch_result(b, &n_err, nullptr);
		tap_eq(rc, 0, "issue+wait: %u commands, %u failed", n, n_err);
	}
	tap_ok(gpu_dev_equal(dst, src, bytes), "issue+wait: round trip bit-exact");
	tt_gio_batch_destroy(b);
	gpu_rig_close(&r);
	cudaStreamDestroy(s2);
	cudaEventDestroy(ev);
	cudaFree(src);
	cudaFree(dst);
	cudaFree(d);
}

__global__ void spin_kernel(long long cycles)
{
	long long t0 = clock64();

	while (clock64() - t0 < cycles)
		;
}

// A framework's compute keeps the legacy default stream busy (1.5 s spins)
// while a batch is made and run: the batch must neither wait for that
// compute nor be reset by set-up work queued behind it (tt_gio_batch_create
// once zeroed its completion counter there: the zeroing would land after the
// first run and the second run would spin forever).
static void busy_default_stream(void)
{
	const uint32_t n = 256, obj = 4096;
	uint64_t bytes = (uint64_t)n * obj;
	struct tt_emu_params p = base_params(4, 64, TT_EMU_HOSTMEM, bytes, true);
	struct tt_gio_batch *b = nullptr;
	struct tt_gio_iocb *d = nullptr;
	struct gpu_rig r;
	uint32_t n_err = ~0u;
	int khz = 0, i;
	char *src, *dst;

	if (!tap_ok(gpu_rig_open(&r, &p, 2) == 0, "busy stream 0: open"))
		return;
	cudaMalloc(&src, bytes);
	cudaMalloc(&dst, bytes);
	cudaMalloc(&d, n * sizeof(*d));
	gpu_fill(src, bytes, 11);
	cudaMemsetAsync(dst, 0, bytes, r.s);
	cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
	spin_kernel<<<1, 1>>>((long long)khz * 1000 * 3 / 2);	// about 1.5 s on stream 0
	tap_ok(tt_gio_batch_create(r.gio, n, &b) == 0, "busy stream 0: batch made");
	for (i = 0; i < 2; i++) {
		std::vector<tt_gio_iocb> io = gpu_linear_iocbs(i ? dst : src, n, obj,
			i ? TT_NVME_CMD_READ : TT_NVME_CMD_WRITE, 0);

		cudaMemcpyAsync(d, io.data(), n * sizeof(*d), cudaMemcpyHostToDevice, r.s);
		tt_gio_prep_iocbs(b, d, n);
		tap_ok(tt_gio_submit_wait(r.gio, b, r.s) == 0, "busy stream 0: run %d launched", i);
		gpu_sync_or_die(r.s, 20);
		tap_ok(cudaStreamQuery(0) == cudaErrorNotReady,
		       "busy stream 0: run %d done while stream 0 still computes", i);
		// Stream 0 drains; the next run must still complete (the counter
		// was not reset under it).
		if (i == 0)
			cudaStreamSynchronize(0);
		if (i == 0)
			spin_kernel<<<1, 1>>>((long long)khz * 1000 * 3 / 2);
	}
	cudaStreamSynchronize(0);
	n_err = ~0u;	// set by the call, which runs before the message is made
	i = tt_gio_batch_result(b, &n_err, nullptr);
	tap_ok(i == 0 && n_err == 0, "busy stream 0: no command failed (result %d, %u failed)", i, n_err);
	tap_ok(gpu_dev_equal(dst, src, bytes), "busy stream 0: round trip bit-exact");
	tt_gio_batch_destroy(b);
	gpu_rig_close(&r);
	cudaFree(src);
	cudaFree(dst);
	cudaFree(d);
}

// Layer descriptors: 4 layers x K/V of 8 KiB, striped over 2 namespaces.
static void layers(void)
{
	struct tt_geometry g = {};
	struct tt_emu_params p;
	const uint32_t nb = 200, npages = 512;
	uint64_t layer_bytes, ns_bytes;
	std::vector<uint64_t> slots(nb);
	std::vector<uint32_t> ids(nb), ids2(nb);
	std::mt19937 rng(11);
	struct tt_gio_batch *b = nullptr;
	uint64_t *dslots;
	uint32_t *dids, *dids2, l, i, s, bad = 0;
	struct gpu_rig r;
	char *src, *dst;

	g.n_layers = 4;
	g.n_spans = 2;
	g.span_bytes = 8192;
	g.obj_stride = 8192;
	g.n_members = 2;
	g.stripe_objs = 4;
	g.n_slots = 256;
	g.data_off = 1 * MIB;
	ns_bytes = g.data_off + tt_member_objs(&g) * g.obj_stride;
	p = base_params(8, 64, TT_EMU_HOSTMEM, ns_bytes, true);
	p.n_ns = 2;
	if (!tap_ok(gpu_rig_open(&r, &p, 4) == 0, "layers: open"))
		return;
	std::vector<uint64_t> all(g.n_slots);
	for (i = 0; i < g.n_slots; i++)
		all[i] = i;
	std::shuffle(all.begin(), all.end(), rng);
	std::vector<uint32_t> pages(npages);
	for (i = 0; i < npages; i++)
		pages[i] = i;
	std::shuffle(pages.begin(), pages.end(), rng);
	for (i = 0; i < nb; i++) {
		slots[i] = all[i];
		ids[i] = pages[i];
		ids2[i] = pages[npages - 1 - i];
	}
	layer_bytes = (uint64_t)npages * g.n_spans * g.span_bytes;
	cudaMalloc(&src, layer_bytes * g.n_layers);
	cudaMalloc(&dst, layer_bytes * g.n_layers);
	gpu_fill(src, layer_bytes * g.n_layers, 21);
	cudaMemset(dst, 0, layer_bytes * g.n_layers);
	cudaMalloc(&dslots, nb * 8);
	cudaMalloc(&dids, nb * 4);
	cudaMalloc(&dids2, nb * 4);
	cudaMemcpy(dslots, slots.data(), nb * 8, cudaMemcpyHostToDevice);
	cudaMemcpy(dids, ids.data(), nb * 4, cudaMemcpyHostToDevice);
	cudaMemcpy(dids2, ids2.data(), nb * 4, cudaMemcpyHostToDevice);
	tt_gio_batch_create(r.gio, nb * g.n_spans, &b);
	for (int pass = 0; pass < 2; pass++) {
		uint32_t fails = 0;

		for (l = 0; l < g.n_layers; l++) {
			struct tt_gio_layer d = {};

			d.geo = g;
			d.layer = l;
			d.n_blocks = nb;
			d.slots = dslots;
			d.block_ids = pass ? dids2 : dids;
			d.base = (uint64_t)(uintptr_t)(pass ? dst : src) + l * layer_bytes;
			d.block_stride = (uint64_t)g.n_spans * g.span_bytes;
			d.span_stride = g.span_bytes;
			d.nsid_base = 1;
			d.op = pass ? TT_NVME_CMD_READ : TT_NVME_CMD_WRITE;
			if (tt_gio_prep_layer(b, &d) || tt_gio_submit_wait(r.gio, b, r.s) ||
			    gpu_sync_or_die(r.s, 30) || tt_gio_batch_result(b, nullptr, nullptr))
				fails++;
		}
		tap_eq(fails, 0, "layers: %s %u layers x %u blocks, all commands succeed",
		       pass ? "read" : "write", g.n_layers, nb);
	}
	// Every object where tt_locate() puts it, and back where the block map says.
	{
		std::vector<char> h(layer_bytes * g.n_layers), h2(layer_bytes * g.n_layers);

		cudaMemcpy(h.data(), src, h.size(), cudaMemcpyDeviceToHost);
		cudaMemcpy(h2.data(), dst, h2.size(), cudaMemcpyDeviceToHost);
		for (l = 0; l < g.n_layers; l++)
			for (i = 0; i < nb; i++)
				for (s = 0; s < g.n_spans; s++) {
					struct tt_extent e = tt_locate(&g, slots[i], l, s);
					const char *ns = (const char *)tt_emu_ns_data(r.emu, 1 + e.member);
					uint64_t m1 = l * layer_bytes + ((uint64_t)ids[i] * g.n_spans + s) * g.span_bytes;
					uint64_t m2 = l * layer_bytes + ((uint64_t)ids2[i] * g.n_spans + s) * g.span_bytes;

					bad += std::memcmp(ns + e.off, h.data() + m1, g.span_bytes) != 0;
					bad += std::memcmp(h2.data() + m2, h.data() + m1, g.span_bytes) != 0;
				}
	}
	tap_eq(bad, 0, "layers: store at tt_locate() and re-mapped read-back are bit-exact");
	tt_gio_batch_destroy(b);
	gpu_rig_close(&r);
	cudaFree(src);
	cudaFree(dst);
	cudaFree(dslots);
	cudaFree(dids);
	cudaFree(dids2);
}

// Bad commands fail alone, with the right status; the rest succeed.
static void errors(void)
{
	const uint32_t n = 256, obj = 4096;
	struct tt_emu_params p = base_params(2, 64, TT_EMU_HOSTMEM, (uint64_t)n * obj, true);
	std::vector<uint16_t> st;
	struct gpu_rig r;
	char *buf;

	if (!tap_ok(gpu_rig_open(&r, &p, 2) == 0, "errors: open"))
		return;
	cudaMalloc(&buf, (uint64_t)n * obj);
	std::vector<tt_gio_iocb> io = gpu_linear_iocbs(buf, n, obj, TT_NVME_CMD_READ, 0);
	io[10].lba = n;			// past the namespace
	io[20].seg[0].len = 1000;	// not whole LBAs: cannot be built
	io[30].nsid = 9;		// no such namespace
	tap_eq(run_iocbs(&r, io, &st), 3, "errors: exactly 3 of %u commands fail", n);
	tap_eq(st.size() > 30 ? st[10] : 0, TT_NVME_SC_LBA_RANGE, "errors: LBA out of range");
	tap_eq(st.size() > 30 ? st[20] : 0, TT_NVME_SC_INVALID_OPCODE,
	       "errors: unbuildable command fails closed (poisoned opcode)");
	tap_eq(st.size() > 30 ? st[30] : 0, TT_NVME_SC_INVALID_NS, "errors: invalid namespace");
	tap_eq(st.size() > 30 ? st[11] : 1, 0, "errors: neighbours unaffected");
	gpu_rig_close(&r);
	cudaFree(buf);
}

// The bandwidth cap holds the data rate under the chosen GB/s.
static void throttle(void)
{
	const uint32_t n = 256, obj = 1 * MIB;
	const double gbps = 4.0;
	uint64_t bytes = (uint64_t)n * obj;
	struct tt_emu_params p = base_params(4, 64, TT_EMU_HOSTMEM, bytes, true);
	struct gpu_rig r;
	double secs, want = (double)bytes / (gbps * 1e9);
	char *buf;

	p.rate_gbps = gbps;
	if (!tap_ok(gpu_rig_open(&r, &p, 2) == 0, "throttle: open"))
		return;
	cudaMalloc(&buf, bytes);
	run_iocbs(&r, gpu_linear_iocbs(buf, 16, obj, TT_NVME_CMD_READ, 0), nullptr); // warm up
	auto t0 = std::chrono::steady_clock::now();
	tap_eq(run_iocbs(&r, gpu_linear_iocbs(buf, n, obj, TT_NVME_CMD_READ, 0), nullptr), 0,
	       "throttle: %u x 1 MiB reads succeed", n);
	secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
	tap_diag("throttle: %.2f GB/s measured with a %.1f GB/s cap", bytes / secs / 1e9, gbps);
	tap_ok(secs >= 0.9 * want, "throttle: took %.3f s, at least 0.9 x %.3f s", secs, want);
	gpu_rig_close(&r);
	cudaFree(buf);
}

// The hang diagnostics on a live, idle controller: tt_gio_dump() and
// tt_emu_dump() name every queue, read the emulated doorbells through their
// host view, and find nothing outstanding once a batch completed.
static void dumps(void)
{
	const uint32_t nq = 3, n = 96, obj = 4096;
	struct tt_emu_params p = base_params(nq, 64, TT_EMU_HOSTMEM, (uint64_t)n * obj, true);
	std::vector<tt_gio_iocb> io;
	struct tt_gio_iocb *d = nullptr;
	struct tt_gio_batch *b = nullptr;
	struct gpu_rig r;
	std::string out;
	char *buf, line[512];
	bool all = true;
	FILE *f;

	if (!tap_ok(gpu_rig_open(&r, &p, 2) == 0, "dumps: open"))
		return;
	cudaMalloc(&buf, (uint64_t)n * obj);
	io = gpu_linear_iocbs(buf, n, obj, TT_NVME_CMD_READ, 0);
	cudaMalloc(&d, io.size() * sizeof(io[0]));
	cudaMemcpy(d, io.data(), io.size() * sizeof(io[0]), cudaMemcpyHostToDevice);
	tap_ok(tt_gio_batch_create(r.gio, n, &b) == 0 && tt_gio_prep_iocbs(b, d, n) == 0 &&
	       tt_gio_submit_wait(r.gio, b, r.s) == 0 && gpu_sync_or_die(r.s, 30) == 0,
	       "dumps: %u reads over %u queues done", n, nq);
	f = std::tmpfile();
	if (!tap_ok(f != nullptr, "dumps: tmpfile")) {
		gpu_rig_close(&r);
		return;
	}
	tt_gio_dump(r.gio, f);
	tt_emu_dump(r.emu, f);
	tt_gio_batch_dump(b, f);
	std::rewind(f);
	while (std::fgets(line, sizeof(line), f))
		out += line;
	std::fclose(f);
	for (uint32_t q = 0; q < nq; q++) {
		char g[32], e[32];

		std::snprintf(g, sizeof(g), "gio q%u (", q);
		std::snprintf(e, sizeof(e), "emu q%u (", q);
		all = all && out.find(g) != std::string::npos && out.find(e) != std::string::npos;
	}
	tap_ok(all, "dumps: gio and emu dumps name all %u queues", nq);
	tap_ok(out.find("did not finish") == std::string::npos &&
	       out.find("device copy") == std::string::npos, "dumps: the device copy finished");
	tap_ok(out.find("not host-visible") == std::string::npos && out.find(" sq_db ") !=
	       std::string::npos, "dumps: emulated doorbells read through their host view");
	tap_ok(out.find("DIFFERS") == std::string::npos &&
	       out.find("NOT REAPED") == std::string::npos && out.find("CQ FULL") ==
	       std::string::npos, "dumps: idle: doorbells match published, nothing unreaped");
	tap_ok(out.find("all reaped") != std::string::npos && out.find("thread_err 0") !=
	       std::string::npos, "dumps: batch fully reaped, no controller thread error");
	if (!all || out.find("did not finish") != std::string::npos)
		tap_diag("dump:\n%s", out.c_str());
	tt_gio_batch_destroy(b);
	cudaFree(d);
	cudaFree(buf);
	gpu_rig_close(&r);
}

// The emulated controller's other data mover, the copy engines from its own
// context (TUTTI_EMU_DMA=copy), and a typo refused rather than measured.
static void dma_modes(void)
{
	struct tt_emu_params p = base_params(2, 64, TT_EMU_HOSTMEM, 1 * MIB, true);
	struct tt_emu *e = nullptr;

	setenv("TUTTI_EMU_DMA", "copy", 1);
	round_trip("copy engines", true, 8, 64, 4096, 16 * KIB, 0);
	setenv("TUTTI_EMU_DMA", "kernels", 1);
	tap_ok(tt_emu_open(&p, &e) == -EINVAL, "TUTTI_EMU_DMA=kernels (a typo): open refused");
	tt_emu_close(e);
	unsetenv("TUTTI_EMU_DMA");
}

int main(void)
{
	gpu_require_device();
	round_trip("SGL", true, 8, 64, 4096, 16 * KIB, 0);
	round_trip("PRP", false, 8, 64, 4096, 16 * KIB, 0);
	round_trip("PRP offset", false, 8, 64, 1024, 16 * KIB, 512);
	round_trip("32 queues wrap", true, 32, 64, 65536, 4 * KIB, 0);
	// SGL allows any byte address: the GPU's moves (EMU_DMA_KERNEL) then
	// go byte by byte instead of 16 bytes at a time.
	round_trip("SGL odd address", true, 4, 64, 256, 16 * KIB, 3);
	dma_modes();
	multi_segment(true);
	multi_segment(false);
	issue_then_wait();
	busy_default_stream();
	layers();
	errors();
	throttle();
	dumps();
	return tap_done();
}
