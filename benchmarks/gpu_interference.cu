// SPDX-License-Identifier: Apache-2.0
//
// gpu_interference.cu - do GPU I/O kernels slow compute kernels down?
//
// Compute kernels run on the compute stream alone, then with a continuous
// gio_uring load on the I/O stream (emulated controller), interleaved rep by
// rep so clock and thermal drift cancel. Two placements:
//   green     tt_gpu_domains_create(io_sms): I/O kernels on io_sms SMs, compute
//             on the rest (green contexts)
//   fallback  two plain streams over the whole GPU (what the partition buys)
// Compute kernels (self-contained, no cuBLAS), each launched back to back
// until a measurement takes about --target-ms on the compute domain:
//   gemm   C = A B, 8192^3, fp16 in / fp32 accumulate, WMMA tensor cores
//   triad  c = a + s b over 3 x 2 GiB of fp32 (HBM-bound)
//   attn   FlashAttention-shaped forward, 64 heads x 4096 tokens x d 64:
//          QK^T and PV on tensor cores, online softmax in between, K/V
//          tiles streamed through shared memory
// I/O loads (the emulated controller's host threads complete the commands):
//   hostmem  512 KiB reads from pinned host memory into HBM (copy engine),
//            capped at --rate GB/s like an SSD array
//   null     4 KiB reads completed without data: the GPU submits and polls
//            as fast as it can
//
//   gpu_interference [--json PATH] [--iosms 16] [--reps 7] [--target-ms 100]
//                    [--rate 28] [--loads hostmem,null] [--kernels gemm,triad,attn]
//                    [--modes green,fallback]
//
// Time of a measurement: first block start to last block end over all its
// launches (%globaltimer), host wall time kept next to it. Prints progress,
// one "RESULT {json}" line per (load, placement, kernel) and a summary;
// benchmarks/gpu_interference.py renders the JSON into docs/benchmarks.md.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <cuda_fp16.h>
#include <mma.h>

#include <tutti/gpu_domains.h>

#include "../libtutti/tests/gpu_rig.cuh"

struct opts {
	std::string json, loads = "hostmem,null", kernels = "gemm,triad,attn";
	std::string modes = "green,fallback";
	unsigned iosms = 16, reps = 7;
	double target_ms = 100, rate = 28;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool has(const std::string &list, const char *name)
{
	return ("," + list + ",").find(std::string(",") + name + ",") != std::string::npos;
}

static double median(std::vector<double> v)
{
	if (v.empty())
		return NAN;
	std::sort(v.begin(), v.end());
	return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

[[noreturn]] static void die(const char *what)
{
	std::printf("Bail out! %s (%s)\n", what, cudaGetErrorString(cudaGetLastError()));
	std::fflush(stdout);
	std::_Exit(1);
}

#include "interference_kernels.cuh"

// ---- workloads ----

enum { WK_GEMM, WK_TRIAD, WK_ATTN };

struct workload {
	const char *name;
	const char *what;
	const char *unit;	// throughput: "TFLOP/s" or "GB/s"
	double work;		// per launch: FLOP or bytes moved
	int kind;
	unsigned units;		// launches per measurement
	void *p[4];
};

static void wk_launch(const workload &w, cudaStream_t s, span *sp)
{
	switch (w.kind) {
	case WK_GEMM:
		gemm_kernel<<<dim3(GM_DIM / GM_BN, GM_DIM / GM_BM), 256, 0, s>>>(
			(const __half *)w.p[0], (const __half *)w.p[1], (float *)w.p[2], sp);
		break;
	case WK_TRIAD:
		triad_kernel<<<(unsigned)(TR_VEC / TR_PER_BLOCK), 256, 0, s>>>(
			(const float4 *)w.p[0], (const float4 *)w.p[1], (float4 *)w.p[2], 0.5f, sp);
		break;
	default:
		attn_kernel<<<dim3(AT_SEQ / 64, AT_BH), 128, 0, s>>>(
			(const __half *)w.p[0], (const __half *)w.p[1], (const __half *)w.p[2],
			(__half *)w.p[3], 0.125f, sp);
	}
}

static void *dalloc(size_t n)
{
	void *p = nullptr;

	if (cudaMalloc(&p, n) != cudaSuccess)
		die("cudaMalloc");
	return p;
}

static workload wk_make(int kind)
{
	workload w = {};

	w.kind = kind;
	if (kind == WK_GEMM) {
		size_t n = (size_t)GM_DIM * GM_DIM;

		w.name = "gemm";
		w.what = "GEMM 8192^3, fp16 in, fp32 accumulate (WMMA tensor cores)";
		w.unit = "TFLOP/s";
		w.work = 2.0 * GM_DIM * GM_DIM * GM_DIM;
		w.p[0] = dalloc(n * 2);
		w.p[1] = dalloc(n * 2);
		w.p[2] = dalloc(n * 4);
		fill_half<<<4096, 256>>>((__half *)w.p[0], n, 1);
		fill_half<<<4096, 256>>>((__half *)w.p[1], n, 2);
	} else if (kind == WK_TRIAD) {
		w.name = "triad";
		w.what = "STREAM triad c = a + s*b, 3 x 2 GiB fp32 (HBM-bound)";
		w.unit = "GB/s";
		w.work = 3.0 * TR_BYTES;
		for (unsigned i = 0; i < 3; i++) {
			w.p[i] = dalloc(TR_BYTES);
			fill_float<<<4096, 256>>>((float *)w.p[i], TR_BYTES / 4, 10 + i);
		}
	} else {
		size_t n = (size_t)AT_BH * AT_SEQ * AT_D;

		w.name = "attn";
		w.what = "attention forward, 64 heads x 4096 tokens x d64, fp16 (FlashAttention-shaped)";
		w.unit = "TFLOP/s";
		w.work = 4.0 * AT_BH * AT_SEQ * AT_SEQ * AT_D;	// QK^T and PV
		for (unsigned i = 0; i < 4; i++) {
			w.p[i] = dalloc(n * 2);
			fill_half<<<4096, 256>>>((__half *)w.p[i], n, 20 + i);
		}
	}
	if (cudaDeviceSynchronize() != cudaSuccess)
		die("fill");
	return w;
}

// Spin on the stream (no sleep: the wall clock should stop when it ends).
static void spin_sync(cudaStream_t s, double secs)
{
	double t0 = now_s();
	cudaError_t e;

	while ((e = cudaStreamQuery(s)) == cudaErrorNotReady)
		if (now_s() - t0 > secs)
			die("compute stream hung");
	if (e != cudaSuccess)
		die("compute kernel failed");
}

struct timing {
	double gpu_ms, wall_ms;
};

// One measurement: w.units launches back to back on @s.
static timing run_compute(const workload &w, cudaStream_t s, span *sp)
{
	span hs;
	timing t;
	double t0 = now_s();

	span_reset<<<1, 1, 0, s>>>(sp);
	for (unsigned u = 0; u < w.units; u++)
		wk_launch(w, s, sp);
	if (cudaGetLastError() != cudaSuccess)
		die("launch");
	spin_sync(s, 60);
	t.wall_ms = (now_s() - t0) * 1e3;
	if (cudaMemcpy(&hs, sp, sizeof(hs), cudaMemcpyDeviceToHost) != cudaSuccess)
		die("span copy");
	t.gpu_ms = (hs.t1 - hs.t0) * 1e-6;
	return t;
}

// ---- I/O load: a host thread keeps the I/O stream busy with layer batches ----

struct io_load {
	const char *name;
	int backing;
	unsigned queues, threads, depth, warps, blocks, layers, obj_bytes, group;
	double rate;
	struct tt_geometry g;
	struct gpu_rig r;
	struct tt_gio_batch *b;
	uint64_t *slots;
	uint32_t *ids;
	char *buf;
};

static void io_open(io_load &L)
{
	struct tt_emu_params p = {};
	std::vector<uint64_t> s(L.blocks);
	std::vector<uint32_t> id(L.blocks);

	L.g = {};
	L.g.n_layers = L.layers;
	L.g.n_spans = 2;
	L.g.span_bytes = L.obj_bytes;
	L.g.obj_stride = L.obj_bytes;
	L.g.n_members = 1;
	L.g.stripe_objs = 1;
	L.g.n_slots = L.blocks;
	p.n_queues = L.queues;
	p.depth = L.depth;
	p.n_threads = L.threads;
	p.backing = L.backing;
	p.n_ns = 1;
	p.ns_bytes = (uint64_t)L.blocks * L.layers * 2 * L.obj_bytes;
	p.lba_shift = 12;
	p.sgls = TT_NVME_SGLS_BYTE_ALIGNED;
	p.list_chunks = 0;	// one object = one SGL data block in DPTR
	p.rate_gbps = L.rate;
	if (gpu_rig_open(&L.r, &p, L.warps) || tt_gio_batch_create(L.r.gio, L.blocks * 2, &L.b))
		die("emulated controller / gio open");
	// Slot i of the store goes to block (i * 7919) mod blocks of the buffer:
	// scattered like a paged KV cache, every block once.
	for (unsigned i = 0; i < L.blocks; i++) {
		s[i] = i;
		id[i] = (uint32_t)((i * 7919ull) % L.blocks);
	}
	L.slots = (uint64_t *)dalloc(L.blocks * 8);
	L.ids = (uint32_t *)dalloc(L.blocks * 4);
	cudaMemcpy(L.slots, s.data(), L.blocks * 8, cudaMemcpyHostToDevice);
	cudaMemcpy(L.ids, id.data(), L.blocks * 4, cudaMemcpyHostToDevice);
	L.buf = L.backing == TT_EMU_NULL ? nullptr : (char *)dalloc((size_t)L.blocks * 2 * L.obj_bytes);
}

static void io_close(io_load &L)
{
	tt_gio_batch_destroy(L.b);
	gpu_rig_close(&L.r);
	cudaFree(L.slots);
	cudaFree(L.ids);
	cudaFree(L.buf);
}

// Queue one layer's read (every block, K and V) on @s.
static void io_layer(io_load &L, cudaStream_t s, unsigned layer)
{
	struct tt_gio_layer d = {};

	d.geo = L.g;
	d.layer = layer % L.layers;
	d.n_blocks = L.blocks;
	d.slots = L.slots;
	d.block_ids = L.ids;
	d.base = (uint64_t)(uintptr_t)L.buf;	// every layer into the same pages
	d.block_stride = 2ull * L.obj_bytes;
	d.span_stride = L.obj_bytes;
	d.nsid_base = 1;
	d.op = TT_NVME_CMD_READ;
	if (tt_gio_prep_layer(L.b, &d) || tt_gio_submit_wait(L.r.gio, L.b, s))
		die("gio submit");
}

struct feeder {
	std::atomic<bool> stop{false};
	std::atomic<int> err{0};
	std::thread th;
};

// Keep @s fed: queue L.group layers, wait for them, again, until stopped.
static void feed(io_load *L, cudaStream_t s, feeder *f)
{
	unsigned layer = 0;

	while (!f->stop.load(std::memory_order_relaxed)) {
		for (unsigned i = 0; i < L->group; i++)
			io_layer(*L, s, layer++);
		if (gpu_sync_or_die(s, 60)) {
			f->err = 1;
			return;
		}
	}
}

static uint64_t emu_cmds(const io_load &L)
{
	struct tt_emu_stats st;

	tt_emu_get_stats(L.r.emu, &st);
	return st.cmds;
}

// Start the I/O load and return once commands are completing.
static void io_start(io_load &L, cudaStream_t s, feeder &f)
{
	uint64_t c0 = emu_cmds(L);
	double t0 = now_s();

	f.stop = false;
	f.err = 0;
	f.th = std::thread(feed, &L, s, &f);
	while (emu_cmds(L) == c0) {
		if (now_s() - t0 > 10)
			die("I/O load did not start");
		std::this_thread::sleep_for(std::chrono::microseconds(100));
	}
	std::this_thread::sleep_for(std::chrono::milliseconds(5));	// past the ramp-up
}

static void io_stop(feeder &f)
{
	f.stop = true;
	f.th.join();
	if (f.err)
		die("I/O load failed");
}

struct io_rate {
	double gbps, mcmds;
	uint64_t errors;
};

static io_rate rate_between(const struct tt_emu_stats &a, const struct tt_emu_stats &b, double secs)
{
	io_rate r;

	r.gbps = (b.bytes - a.bytes) / secs / 1e9;
	r.mcmds = (b.cmds - a.cmds) / secs / 1e6;
	r.errors = b.errors - a.errors;
	return r;
}

// ---- JSON ----

static std::string jnum(double v, const char *fmt = "%.4f")
{
	char b[64];

	if (!std::isfinite(v))
		return "null";
	std::snprintf(b, sizeof(b), fmt, v);
	return b;
}

static std::string jarr(const std::vector<double> &v, const char *fmt = "%.4f")
{
	std::string s = "[";

	for (size_t i = 0; i < v.size(); i++)
		s += (i ? "," : "") + jnum(v[i], fmt);
	return s + "]";
}

static std::string jstr(const std::string &v)
{
	std::string s = "\"";

	for (char c : v) {
		if (c == '"' || c == '\\')
			s += '\\';
		if ((unsigned char)c >= 0x20)
			s += c;
	}
	return s + "\"";
}

struct report {
	std::string meta;
	std::vector<std::string> kernels, loads, io_alone, results;
};

static void write_json(const report &R, const std::string &path)
{
	auto list = [](const std::vector<std::string> &v) {
		std::string s = "[";

		for (size_t i = 0; i < v.size(); i++)
			s += (i ? ",\n  " : "\n  ") + v[i];
		return s + "\n ]";
	};
	std::string s = "{\n \"meta\": " + R.meta + ",\n \"kernels\": " + list(R.kernels) +
			",\n \"loads\": " + list(R.loads) + ",\n \"io_alone\": " + list(R.io_alone) +
			",\n \"results\": " + list(R.results) + "\n}\n";
	if (!path.empty())
		std::ofstream(path) << s;
}

static std::string cpu_model(void)
{
	std::ifstream f("/proc/cpuinfo");
	std::string line;

	while (std::getline(f, line))
		if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
			return line.substr(line.find(':') + 2);
	return "";
}

// ---- main ----

struct placement {
	const char *name;
	struct tt_gpu_domains *d;
};

struct summary_row {
	std::string load, mode, kernel;
	double alone, with, slow, io_with, io_alone;
	const char *io_unit;
};

int main(int argc, char **argv)
{
	struct tt_gpu_domains dg, df;
	std::vector<placement> modes;
	std::vector<workload> wks;
	std::vector<io_load> loads;
	std::vector<summary_row> rows;
	cudaDeviceProp prop;
	std::string cmdline;
	int drv = 0, rt = 0;
	report R;
	span *sp;
	opts o;

	// Every kernel loaded when a context starts: a lazily loaded kernel's
	// first launch waits for the device to go idle, and here one context
	// always has work in flight.
	setenv("CUDA_MODULE_LOADING", "EAGER", 0);
	gpu_require_device();
	for (int i = 0; i < argc; i++)
		cmdline += (i ? " " : "") + std::string(argv[i]);
	for (int i = 1; i + 1 < argc; i += 2) {
		std::string k = argv[i], v = argv[i + 1];

		if (k == "--json") o.json = v;
		else if (k == "--iosms") o.iosms = (unsigned)std::stoul(v);
		else if (k == "--reps") o.reps = (unsigned)std::stoul(v);
		else if (k == "--target-ms") o.target_ms = std::stod(v);
		else if (k == "--rate") o.rate = std::stod(v);
		else if (k == "--loads") o.loads = v;
		else if (k == "--kernels") o.kernels = v;
		else if (k == "--modes") o.modes = v;
		else {
			std::fprintf(stderr, "usage: %s [--json PATH] [--iosms N] [--reps N] "
				     "[--target-ms MS] [--rate GBPS] [--loads hostmem,null] "
				     "[--kernels gemm,triad,attn] [--modes green,fallback]\n", argv[0]);
			return 2;
		}
	}
	if (argc % 2 == 0) {
		std::fprintf(stderr, "option %s needs a value\n", argv[argc - 1]);
		return 2;
	}
	cudaGetDeviceProperties(&prop, 0);
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rt);

	if (tt_gpu_domains_create(o.iosms, &dg))
		die("domains");
	if (tt_gpu_domains_create(0, &df))	// 0 I/O SMs: the plain-stream fallback
		die("plain streams");
	if (!dg.green)
		std::printf("# no green contexts: %s\n", dg.reason);
	else if (has(o.modes, "green"))
		modes.push_back({"green", &dg});
	if (has(o.modes, "fallback"))
		modes.push_back({"fallback", &df});
	if (modes.empty())
		die("no placement to measure");
	{
		time_t now = time(nullptr);
		char date[32];

		strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
		R.meta = "{\"date\": " + jstr(date) + ", \"command\": " + jstr(cmdline) +
			 ", \"gpu\": " + jstr(prop.name) + ", \"sms\": " +
			 std::to_string(prop.multiProcessorCount) + ", \"driver\": " + std::to_string(drv) +
			 ", \"runtime\": " + std::to_string(rt) + ", \"cpus\": " +
			 std::to_string(std::thread::hardware_concurrency()) +
			 ", \"cpu_model\": " + jstr(cpu_model()) + ", \"io_sms_asked\": " +
			 std::to_string(o.iosms) + ", \"green\": " + std::to_string(dg.green) +
			 ", \"green_reason\": " + jstr(dg.green ? "" : dg.reason) +
			 ", \"io_sms\": " + std::to_string(dg.io_sms) + ", \"compute_sms\": " +
			 std::to_string(dg.compute_sms) + ", \"reps\": " + std::to_string(o.reps) +
			 ", \"target_ms\": " + jnum(o.target_ms, "%.0f") + "}";
	}
	std::printf("# %s, %d SMs; green contexts: %s (I/O %u SMs, compute %u SMs)\n", prop.name,
		    prop.multiProcessorCount, dg.green ? "yes" : "no", dg.io_sms, dg.compute_sms);

	sp = (span *)dalloc(sizeof(span));
	if (has(o.kernels, "gemm")) wks.push_back(wk_make(WK_GEMM));
	if (has(o.kernels, "triad")) wks.push_back(wk_make(WK_TRIAD));
	if (has(o.kernels, "attn")) wks.push_back(wk_make(WK_ATTN));
	// Warm up every kernel in every context, then size each measurement to
	// ~target_ms on the first placement's compute stream (the compute domain).
	for (workload &w : wks) {
		for (placement &m : modes) {
			w.units = 1;
			run_compute(w, m.d->compute, sp);
		}
		w.units = 1;
		for (unsigned pass = 0; pass < 2; pass++) {
			timing t = run_compute(w, modes[0].d->compute, sp);

			if (!(t.gpu_ms > 0))
				die("no kernel time");
			w.units = std::max(1u, std::min(2000u, (unsigned)std::lround(
							      w.units * o.target_ms / t.gpu_ms)));
		}
		timing t = run_compute(w, modes[0].d->compute, sp);
		std::printf("# %s: %u launches, %.1f ms on %s (%.1f %s)\n", w.name, w.units, t.gpu_ms,
			    modes[0].name, w.work * w.units / (t.gpu_ms * 1e-3) / (w.unit[0] == 'T' ? 1e12 : 1e9),
			    w.unit);
		std::fflush(stdout);
		R.kernels.push_back("{\"name\": " + jstr(w.name) + ", \"what\": " + jstr(w.what) +
				    ", \"unit\": " + jstr(w.unit) + ", \"work_per_launch\": " +
				    jnum(w.work, "%.6g") + ", \"launches\": " + std::to_string(w.units) + "}");
	}

	if (has(o.loads, "hostmem"))
		loads.push_back({"hostmem", TT_EMU_HOSTMEM, 16, 8, 256, 4, 256, 4, 512 * 1024, 2, o.rate});
	if (has(o.loads, "null"))
		loads.push_back({"null", TT_EMU_NULL, 32, 8, 1024, 4, 65536, 4, 4096, 2, 0});
	for (io_load &L : loads) {
		io_open(L);
		R.loads.push_back("{\"name\": " + jstr(L.name) + ", \"backing\": " +
				  jstr(L.backing == TT_EMU_NULL ? "null" : "hostmem") +
				  ", \"rate_cap_gbps\": " + jnum(L.rate, "%.1f") + ", \"queues\": " +
				  std::to_string(L.queues) + ", \"ctrl_threads\": " + std::to_string(L.threads) +
				  ", \"depth\": " + std::to_string(L.depth) + ", \"warps\": " +
				  std::to_string(L.warps) + ", \"blocks\": " + std::to_string(L.blocks) +
				  ", \"object_bytes\": " + std::to_string(L.obj_bytes) +
				  ", \"cmds_per_kernel\": " + std::to_string(2 * L.blocks) + "}");
		for (placement &m : modes) {
			struct tt_emu_stats a, b;
			io_rate ra;
			feeder f;
			double t0;

			io_layer(L, m.d->io, 0);	// warm-up in this context
			gpu_sync_or_die(m.d->io, 60);
			// The I/O load alone, for reference.
			io_start(L, m.d->io, f);
			tt_emu_get_stats(L.r.emu, &a);
			t0 = now_s();
			std::this_thread::sleep_for(std::chrono::milliseconds(300));
			tt_emu_get_stats(L.r.emu, &b);
			ra = rate_between(a, b, now_s() - t0);
			io_stop(f);
			std::printf("# %s / %s: I/O alone %.2f GB/s, %.2f M commands/s\n", L.name, m.name,
				    ra.gbps, ra.mcmds);
			R.io_alone.push_back("{\"load\": " + jstr(L.name) + ", \"mode\": " + jstr(m.name) +
					     ", \"gbps\": " + jnum(ra.gbps, "%.3f") + ", \"mcmds_per_s\": " +
					     jnum(ra.mcmds, "%.3f") + ", \"errors\": " +
					     std::to_string(ra.errors) + "}");

			for (workload &w : wks) {
				std::vector<double> al, wi, alw, wiw, ratio, gb, mc;
				uint64_t errs = ra.errors;
				double ma, mw, slow;
				std::string res;

				// Rep 0 is a warm-up; odd reps run "with I/O" first.
				for (unsigned rep = 0; rep <= o.reps; rep++) {
					timing ta = {}, tw = {};

					for (unsigned half = 0; half < 2; half++) {
						if ((half == 0) == (rep % 2 == 0)) {
							ta = run_compute(w, m.d->compute, sp);
							continue;
						}
						io_start(L, m.d->io, f);
						tt_emu_get_stats(L.r.emu, &a);
						t0 = now_s();
						tw = run_compute(w, m.d->compute, sp);
						tt_emu_get_stats(L.r.emu, &b);
						io_rate rw = rate_between(a, b, now_s() - t0);
						io_stop(f);
						if (rep) {
							gb.push_back(rw.gbps);
							mc.push_back(rw.mcmds);
							errs += rw.errors;
						}
					}
					if (!rep)
						continue;
					al.push_back(ta.gpu_ms);
					wi.push_back(tw.gpu_ms);
					alw.push_back(ta.wall_ms);
					wiw.push_back(tw.wall_ms);
					ratio.push_back(100 * (tw.gpu_ms / ta.gpu_ms - 1));
				}
				ma = median(al);
				mw = median(wi);
				slow = 100 * (mw / ma - 1);
				res = "{\"load\": " + jstr(L.name) + ", \"mode\": " + jstr(m.name) +
				      ", \"green\": " + std::to_string(m.d->green) + ", \"io_sms\": " +
				      std::to_string(m.d->io_sms) + ", \"compute_sms\": " +
				      std::to_string(m.d->compute_sms) + ", \"kernel\": " + jstr(w.name) +
				      ", \"launches\": " + std::to_string(w.units) +
				      ", \"alone_ms\": " + jarr(al) + ", \"with_io_ms\": " + jarr(wi) +
				      ", \"alone_wall_ms\": " + jarr(alw) + ", \"with_io_wall_ms\": " + jarr(wiw) +
				      ", \"alone_med_ms\": " + jnum(ma) + ", \"with_io_med_ms\": " + jnum(mw) +
				      ", \"slowdown_pct\": " + jnum(slow, "%.3f") +
				      ", \"paired_slowdown_pct\": " + jnum(median(ratio), "%.3f") +
				      ", \"paired_pct\": " + jarr(ratio, "%.3f") +
				      ", \"alone_throughput\": " +
				      jnum(w.work * w.units / (ma * 1e-3) / (w.unit[0] == 'T' ? 1e12 : 1e9), "%.1f") +
				      ", \"throughput_unit\": " + jstr(w.unit) +
				      ", \"io_gbps\": " + jarr(gb, "%.3f") + ", \"io_mcmds_per_s\": " +
				      jarr(mc, "%.3f") + ", \"io_gbps_med\": " + jnum(median(gb), "%.3f") +
				      ", \"io_mcmds_per_s_med\": " + jnum(median(mc), "%.3f") +
				      ", \"io_errors\": " + std::to_string(errs) + "}";
				std::printf("RESULT %s\n", res.c_str());
				std::fflush(stdout);
				R.results.push_back(res);
				write_json(R, o.json);
				rows.push_back({L.name, m.name, w.name, ma, mw, slow,
						L.backing == TT_EMU_NULL ? median(mc) : median(gb),
						L.backing == TT_EMU_NULL ? ra.mcmds : ra.gbps,
						L.backing == TT_EMU_NULL ? "M cmd/s" : "GB/s"});
			}
		}
		io_close(L);
	}
	write_json(R, o.json);

	std::printf("\n%-8s %-9s %-6s %10s %12s %9s %22s\n", "I/O", "placement", "kernel", "alone ms",
		    "with I/O ms", "slowdown", "I/O during (alone)");
	for (const summary_row &s : rows)
		std::printf("%-8s %-9s %-6s %10.2f %12.2f %+8.2f%% %9.2f (%.2f) %s\n", s.load.c_str(),
			    s.mode.c_str(), s.kernel.c_str(), s.alone, s.with, s.slow, s.io_with,
			    s.io_alone, s.io_unit);
	tt_gpu_domains_destroy(&dg);
	tt_gpu_domains_destroy(&df);
	return 0;
}
