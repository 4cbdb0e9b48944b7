// SPDX-License-Identifier: Apache-2.0
//
// gpu_file_hbm - layer-wise retrieve of a Llama-3-8B-shaped prefix from a
// file store into shuffled paged GPU blocks, one process, same store:
//   staged  the staged data path (staged_path.h) through the store's API,
//           pread into pinned chunks (mapping off)
//   mapped  the staged path reading from the member file mapped and
//           registered with CUDA (tmpfs): one DMA per run, no pread; the
//           registration is timed once, before the runs ("map_s")
//   gds     the GDS data path (gds_path.h), if libcufile.so.0 is there
//   cpu     the store's own engine into pinned host memory laid out like
//           the GPU cache (CPU checksums), one cudaMemcpyAsync per layer
//           and span once the layer is verified, the next layer in flight
//   raw     ceiling: this program's threads read the data region in 4 MiB
//           reads into pinned memory (O_DIRECT unless --buffered)
//   h2d     ceiling: pinned -> HBM cudaMemcpy bandwidth
//   raw_h2d raw's reads, each copied to HBM as it lands (staged minus its
//           scatter and hashing)
// Every path's first run is compared byte for byte with the stored data;
// staged/gds/cpu runs also pass the store's checksum verification.
// One "RESULT {json}" line per measurement on stdout; staged and mapped
// results carry the path's per-phase thread time (tt_file_path_stats),
// and one "INFO {json}" line per path says how each file was read.
//
//   gpu_file_hbm --store /dev/shm/kv.img --tokens 32768 --runs 3 [--drop]
//                [--buffered] [--threads 16] [--chunk 4194304] [--modes ...]
//                [--rounds K] (every mode's runs K times over, interleaved)
//                [--variants 8:4194304,16:1048576:4,m8:0]
//                (staged, or mapped with "m": threads:chunk[:depth], 2 runs)
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include <tutti/error.h>
#include <tutti/gds_path.h>
#include <tutti/staged_path.h>
#include <tutti/store.h>

#define L 32u
#define SPAN (32u << 10)	// 8 KV heads x 128 x bf16 x 16 tokens
#define R (L * 2u)

struct opts {
	std::string store, modes = "h2d,raw,raw_h2d,staged,mapped,gds,cpu", variants;
	unsigned tokens = 8192, runs = 3, threads = 0;
	unsigned rounds = 1;	// repeat every mode's runs, modes interleaved
	unsigned run0 = 0;	// this round's first run number
	uint32_t chunk = 0;
	int drop = 0, buffered = 0;
};

static double now(void)
{
	return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double cpu_secs(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static int drop_caches(void)
{
	int fd;

	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
	if (fd < 0)
		return 0;
	int ok = write(fd, "3\n", 2) == 2;

	close(fd);
	return ok;
}

static void die(const char *what, int ret)
{
	std::fprintf(stderr, "gpu_file_hbm: %s: %d (%s) %s\n", what, ret, strerror(ret < 0 ? -ret : ret),
		     tt_errmsg());
	std::exit(1);
}

// Block i's bytes, (layer, span) order: cheap to make, different everywhere.
static void fill_block(char *p, uint32_t i)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (i + 1);

	for (size_t o = 0; o < (size_t)R * SPAN; o += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		std::memcpy(p + o, &x, 8);
	}
}

static void result(const opts &o, const char *mode, unsigned run, double secs, uint64_t bytes,
		   int ok, int exact, double cpu, int dropped, const char *extra)
{
	std::printf("RESULT {\"mode\":\"%s\",\"store\":\"%s\",\"tokens\":%u,\"run\":%u,\"secs\":%.6f,"
		    "\"bytes\":%llu,\"gbps\":%.4f,\"ok\":%d,\"bit_exact\":%d,\"cpu_us_per_layer\":%.1f,"
		    "\"dropped\":%d,\"direct\":%d%s}\n",
		    mode, o.store.c_str(), o.tokens, o.run0 + run, secs, (unsigned long long)bytes,
		    bytes / secs / 1e9, ok, exact, cpu * 1e6 / L, dropped, !o.buffered, extra);
	std::fflush(stdout);
}

// @s as a JSON string body.
static std::string json_esc(const char *s)
{
	std::string o;

	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			o += '\\', o += *s;
		else if (*s == '\n')
			o += "\\n";
		else if ((unsigned char)*s >= 0x20)
			o += *s;
	}
	return o;
}

struct paged_gpu {
	char *dev = nullptr;
	uint64_t base[R], stride[R];
	struct tt_memmap mm;
};

static bool host_matches(const char *src, const std::vector<char> &got, uint32_t n,
			 const std::vector<uint32_t> &ids)
{
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t m = 0; m < R; m++)
			if (std::memcmp(src + ((size_t)i * R + m) * SPAN,
					&got[((size_t)m * n + ids[i]) * SPAN], SPAN))
				return false;
	return true;
}

static double h2d(const opts &o)
{
	size_t bytes = 256u << 20;
	void *h, *d;
	cudaStream_t s;
	double t0, best = 0;

	cudaHostAlloc(&h, bytes, 0);
	cudaMalloc(&d, bytes);
	cudaStreamCreate(&s);
	std::memset(h, 1, bytes);
	for (unsigned r = 0; r < o.runs; r++) {
		cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s);
		cudaStreamSynchronize(s);
		t0 = now();
		for (int k = 0; k < 8; k++)
			cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s);
		cudaStreamSynchronize(s);
		double secs = now() - t0;

		result(o, "h2d", r, secs, 8 * bytes, 1, -1, 0, 0, "");
		best = std::max(best, 8 * bytes / secs);
	}
	cudaFreeHost(h);
	cudaFree(d);
	cudaStreamDestroy(s);
	return best;
}

// The member's data region in 4 MiB reads by @threads threads.
static void raw(const opts &o, const struct tt_geometry *g, unsigned threads)
{
	const uint32_t rb = 4u << 20;
	uint64_t total = tt_member_objs(g) * g->obj_stride, nreq = total / rb;
	std::vector<void *> bufs(threads);

	for (void *&b : bufs)	// pinned, like the staged path's chunks; not timed
		if (cudaHostAlloc(&b, rb, 0) != cudaSuccess)
			die("cudaHostAlloc", -ENOMEM);
	for (unsigned r = 0; r < o.runs; r++) {
		int dropped = o.drop ? drop_caches() : 0;
		int fd = open(o.store.c_str(), O_RDONLY | (o.buffered ? 0 : O_DIRECT));
		std::atomic<uint64_t> next{0};
		std::atomic<int> bad{0};
		std::vector<std::thread> th;
		double t0, c0;

		if (fd < 0)
			die("open for raw reads", -errno);
		c0 = cpu_secs();
		t0 = now();
		for (unsigned k = 0; k < threads; k++)
			th.emplace_back([&, k] {
				uint64_t q;

				while ((q = next++) < nreq)
					if (pread(fd, bufs[k], rb, (off_t)(g->data_off + q * rb)) != (ssize_t)rb)
						bad++;
			});
		for (std::thread &t : th)
			t.join();
		double secs = now() - t0;

		close(fd);
		result(o, "raw", r, secs, nreq * rb, bad == 0, -1, cpu_secs() - c0, dropped, "");
	}
	for (void *b : bufs)
		cudaFreeHost(b);
}

// The staged design's ceiling without its GPU work: the same 4 MiB reads,
// each followed by one async H2D copy of the pinned buffer (two buffers
// per thread), no scatter, no hash. Between raw and h2d it shows what
// reading and copying at once costs (both load host memory).
static void raw_h2d(const opts &o, const struct tt_geometry *g, unsigned threads)
{
	const uint32_t rb = 4u << 20;
	uint64_t total = tt_member_objs(g) * g->obj_stride, nreq = total / rb;
	struct lane {
		void *h[2];
		void *d;
		cudaStream_t s;
		cudaEvent_t ev[2];
	};
	std::vector<lane> ls(threads);
	const unsigned evf = cudaEventDisableTiming | cudaEventBlockingSync;

	for (lane &l : ls)	// not timed
		if (cudaHostAlloc(&l.h[0], rb, 0) || cudaHostAlloc(&l.h[1], rb, 0) ||
		    cudaMalloc(&l.d, 2 * (size_t)rb) ||
		    cudaStreamCreateWithFlags(&l.s, cudaStreamNonBlocking) ||
		    cudaEventCreateWithFlags(&l.ev[0], evf) || cudaEventCreateWithFlags(&l.ev[1], evf))
			die("raw_h2d buffers", -ENOMEM);
	for (unsigned r = 0; r < o.runs; r++) {
		int dropped = o.drop ? drop_caches() : 0;
		int fd = open(o.store.c_str(), O_RDONLY | (o.buffered ? 0 : O_DIRECT));
		std::atomic<uint64_t> next{0};
		std::atomic<int> bad{0};
		std::vector<std::thread> th;
		double t0, c0;

		if (fd < 0)
			die("open for raw_h2d reads", -errno);
		c0 = cpu_secs();
		t0 = now();
		for (unsigned k = 0; k < threads; k++)
			th.emplace_back([&, k] {
				lane &l = ls[k];
				uint64_t q;

				for (unsigned i = 0; (q = next++) < nreq; i++) {
					unsigned b = i & 1;

					cudaEventSynchronize(l.ev[b]);	// its last copy is done
					if (pread(fd, l.h[b], rb, (off_t)(g->data_off + q * rb)) != (ssize_t)rb)
						bad++;
					if (cudaMemcpyAsync((char *)l.d + (size_t)b * rb, l.h[b], rb,
							    cudaMemcpyHostToDevice, l.s) ||
					    cudaEventRecord(l.ev[b], l.s))
						bad++;
				}
				if (cudaStreamSynchronize(l.s))
					bad++;
			});
		for (std::thread &t : th)
			t.join();
		double secs = now() - t0;

		close(fd);
		result(o, "raw_h2d", r, secs, nreq * rb, bad == 0, -1, cpu_secs() - c0, dropped, "");
	}
	for (lane &l : ls) {
		cudaFreeHost(l.h[0]);
		cudaFreeHost(l.h[1]);
		cudaFree(l.d);
		cudaEventDestroy(l.ev[0]);
		cudaEventDestroy(l.ev[1]);
		cudaStreamDestroy(l.s);
	}
}

int main(int argc, char **argv)
{
	opts o;

	for (int a = 1; a < argc; a++) {
		std::string k = argv[a];
		const char *v = a + 1 < argc ? argv[a + 1] : "";

		if (k == "--store") o.store = v, a++;
		else if (k == "--tokens") o.tokens = (unsigned)atoi(v), a++;
		else if (k == "--runs") o.runs = (unsigned)atoi(v), a++;
		else if (k == "--rounds") o.rounds = (unsigned)atoi(v), a++;
		else if (k == "--threads") o.threads = (unsigned)atoi(v), a++;
		else if (k == "--chunk") o.chunk = (uint32_t)atoi(v), a++;
		else if (k == "--modes") o.modes = v, a++;
		else if (k == "--variants") o.variants = v, a++;
		else if (k == "--drop") o.drop = 1;
		else if (k == "--buffered") o.buffered = 1;
		else {
			std::fprintf(stderr, "unknown option %s\n", argv[a]);
			return 2;
		}
	}
	int ndev = 0;

	if (o.store.empty() || cudaGetDeviceCount(&ndev) != cudaSuccess || !ndev) {
		std::fprintf(stderr, "gpu_file_hbm: need --store and a CUDA device\n");
		return o.store.empty() ? 2 : 77;
	}
	auto want = [&](const char *m) { return ("," + o.modes + ",").find("," + std::string(m) + ",") != std::string::npos; };
	const uint32_t n = o.tokens / 16;
	const uint64_t bytes = (uint64_t)n * R * SPAN;
	unsigned threads = o.threads ? o.threads : std::min(16u, (unsigned)sysconf(_SC_NPROCESSORS_ONLN));

	if (want("h2d"))
		h2d(o);

	// A store of exactly the prefix, filled by the CPU path in one transaction.
	struct tt_format_params fp;
	const char *paths[1] = { o.store.c_str() };
	struct tt_open_params op = {};
	struct tt_store *s;
	int ret;

	std::memset(&fp, 0, sizeof(fp));
	std::strcpy(fp.fp.model_id, "meta-llama/Meta-Llama-3-8B");
	std::strcpy(fp.fp.dtype, "bfloat16");
	fp.fp.n_layers = L;
	fp.fp.kv_heads = 8;
	fp.fp.head_dim = 128;
	fp.fp.block_size = 16;
	fp.n_slots = n;
	fp.flags = TT_FORMAT_FORCE;
	unlink(o.store.c_str());
	if ((ret = tt_store_format(paths, 1, &fp)))
		die("format", ret);
	if ((ret = tt_store_open(paths, 1, &op, &s)))
		die("open", ret);
	const struct tt_geometry *g = tt_store_geometry(s);
	char *src = (char *)aligned_alloc(4096, bytes);
	std::vector<uint8_t> keys((size_t)n * TT_KEY_BYTES);
	std::vector<int64_t> slots(n);
	std::vector<int32_t> st(n);
	struct tt_txn *t;

	for (uint32_t i = 0; i < n; i++) {
		char k[32];

		fill_block(src + (size_t)i * R * SPAN, i);
		std::snprintf(k, sizeof(k), "prefix-%u", i);
		tt_key_from_bytes(k, strlen(k), &keys[(size_t)i * TT_KEY_BYTES]);
	}
	{
		uint64_t base[R], stride[R];
		struct tt_memmap mm = { L, 2, base, stride };
		std::vector<uint32_t> ids(n);
		double t0 = now();

		std::iota(ids.begin(), ids.end(), 0);
		for (uint32_t m = 0; m < R; m++) {
			base[m] = (uint64_t)(uintptr_t)src + (uint64_t)m * SPAN;
			stride[m] = (uint64_t)R * SPAN;
		}
		if ((ret = tt_store_write_begin(s, keys.data(), n, &t)))
			die("write_begin", ret);
		for (uint32_t l = 0; l < L; l++)
			if ((ret = tt_txn_layer(t, l, &mm, ids.data())))
				die("write layer", ret);
		if ((ret = tt_txn_finish(t, st.data())) != (int)n)
			die("write finish", ret);
		std::fprintf(stderr, "# filled %s: %.2f GiB in %.2f s\n", o.store.c_str(),
			     bytes / 1073741824.0, now() - t0);
	}
	if (tt_store_lookup(s, keys.data(), n, slots.data()) != (int)n)
		die("lookup", -ENOENT);

	// Shuffled paged blocks, K and V of each layer apart, as vLLM has them.
	std::vector<uint32_t> ids(n);
	std::iota(ids.begin(), ids.end(), 0);
	std::shuffle(ids.begin(), ids.end(), std::mt19937(42));
	paged_gpu pg;
	if (cudaMalloc(&pg.dev, bytes) != cudaSuccess)
		die("cudaMalloc", -ENOMEM);
	for (uint32_t m = 0; m < R; m++) {
		pg.base[m] = (uint64_t)(uintptr_t)pg.dev + (uint64_t)m * n * SPAN;
		pg.stride[m] = SPAN;
	}
	pg.mm = { L, 2, pg.base, pg.stride };
	std::vector<char> back;
	auto gpu_exact = [&]() {
		back.resize(bytes);
		cudaMemcpy(back.data(), pg.dev, bytes, cudaMemcpyDeviceToHost);
		return host_matches(src, back, n, ids);
	};

	char *host = nullptr;

	// --rounds: the whole sequence again, so a disk whose speed drifts
	// (a virtual disk warming its host's cache) does not favour the modes
	// that run last.
	for (unsigned round = 0; round < std::max(1u, o.rounds); round++) {
	o.run0 = round * o.runs;
	if (want("raw"))
		raw(o, g, threads);
	if (want("raw_h2d"))
		raw_h2d(o, g, threads);

	// The paths at their defaults, then --variants "[m]threads:chunk[:depth],..."
	// of the staged path (m: mapped).
	struct variant {
		const char *name;
		int (*open)(const struct tt_file_path_params *, struct tt_file_path **);
		const struct tt_devpath_ops *ops;
		unsigned threads;
		uint32_t chunk;
		unsigned depth;
		int tuned;
	};
	std::vector<variant> vs = {
		{ "staged", tt_file_path_open_staged, &tt_devpath_staged, threads, o.chunk, 0, 0 },
		{ "mapped", tt_file_path_open_staged, &tt_devpath_staged, threads, o.chunk, 0, 0 },
		{ "gds", tt_file_path_open_gds, &tt_devpath_gds, threads, o.chunk, 0, 0 },
	};
	for (size_t a = 0; !o.variants.empty() && a != std::string::npos;) {
		size_t b = o.variants.find(',', a);
		std::string v = o.variants.substr(a, b == std::string::npos ? b : b - a);
		bool m = !v.empty() && v[0] == 'm';
		unsigned th = 0, dep = 0;
		uint32_t ch = 0;

		std::sscanf(v.c_str() + m, "%u:%u:%u", &th, &ch, &dep);
		vs.push_back({ m ? "mapped" : "staged", tt_file_path_open_staged, &tt_devpath_staged,
			       th, ch, dep, 1 });
		a = b == std::string::npos ? b : b + 1;
	}
	for (const variant &dp : vs) {
		bool staged = dp.ops == &tt_devpath_staged, mapped = !std::strcmp(dp.name, "mapped");
		struct tt_file_path_params pp = {};
		struct tt_file_path_stats ps;
		struct tt_file_path *fpth;
		double map_s = 0;
		char extra[160];

		if (!want(dp.name))
			continue;
		pp.n_threads = dp.threads;
		pp.chunk_bytes = dp.chunk;
		pp.depth = dp.depth;
		pp.device = -1;
		pp.map = mapped ? TT_FILE_MAP_AUTO : TT_FILE_MAP_OFF;
		if ((ret = dp.open(&pp, &fpth))) {
			std::printf("SKIP {\"mode\":\"%s\",\"why\":\"%s\"}\n", dp.name,
				    json_esc(tt_errmsg()).c_str());
			std::fflush(stdout);
			continue;
		}
		if ((ret = tt_store_set_devpath(s, dp.ops, fpth)))
			die("set_devpath", ret);
		if (mapped) {
			// Pin the file now: its cost, once, apart from the reads.
			double t0 = now();

			ret = tt_file_path_map_store(fpth, s);
			map_s = now() - t0;
		}
		if (staged) {
			tt_file_path_get_stats(fpth, &ps, 1);
			std::printf("INFO {\"mode\":\"%s\",\"variant\":%d,\"threads\":%u,\"map_s\":%.4f,"
				    "\"mapped_bytes\":%llu,\"files\":\"%s\"}\n", dp.name, dp.tuned,
				    ps.n_threads, map_s, (unsigned long long)ps.mapped_bytes,
				    json_esc(ps.files).c_str());
			std::fflush(stdout);
			if (mapped && !ps.n_mapped) {
				std::printf("SKIP {\"mode\":\"mapped\",\"why\":\"%s\"}\n",
					    json_esc(ps.files).c_str());
				std::fflush(stdout);
				tt_store_set_devpath(s, nullptr, nullptr);
				tt_file_path_close(fpth);
				continue;
			}
		}
		for (unsigned r = 0; r < (dp.tuned ? 2 : o.runs); r++) {
			int dropped = o.drop ? drop_caches() : 0;
			std::string ph;
			double t0, c0;

			cudaMemset(pg.dev, 0, bytes);
			cudaDeviceSynchronize();
			if (staged)
				tt_file_path_get_stats(fpth, &ps, 1);
			c0 = cpu_secs();
			t0 = now();
			if ((ret = tt_store_read_begin(s, slots.data(), n, &t)))
				die("read_begin", ret);
			if ((ret = tt_txn_bind_device(t, ids.data()))) {
				// e.g. cuFile refusing this file system: say so, go on
				std::printf("SKIP {\"mode\":\"%s\",\"why\":\"bind: %s\"}\n", dp.name,
					    json_esc(tt_errmsg()).c_str());
				std::fflush(stdout);
				tt_txn_abort(t);
				break;
			}
			for (uint32_t l = 0; l < L; l++)
				if ((ret = tt_txn_layer(t, l, &pg.mm, nullptr)))
					die("layer", ret);
			for (uint32_t l = 0; l < L; l++)
				tt_txn_wait_layer(t, l);
			ret = tt_txn_finish(t, st.data());
			double secs = now() - t0;
			double cpu = cpu_secs() - c0;

			std::snprintf(extra, sizeof(extra), ",\"threads\":%u,\"chunk\":%u,\"depth\":%u,"
				      "\"variant\":%d", dp.threads, dp.chunk ? dp.chunk : 4u << 20,
				      dp.depth ? dp.depth : 3, dp.tuned);
			ph = extra;
			if (staged) {
				// Thread time per phase, as a share of threads x wall time.
				char b[320];
				double tw = ps.n_threads * secs;

				tt_file_path_get_stats(fpth, &ps, 0);
				std::snprintf(b, sizeof(b), ",\"map_s\":%.4f,\"runs\":%llu,\"mapped_runs\":%llu,"
					      "\"avg_run\":%llu,\"f_get\":%.3f,\"f_wait\":%.3f,\"f_queue\":%.3f,"
					      "\"f_idle\":%.3f,\"begin_s\":%.4f,\"layer_wait_s\":%.4f",
					      map_s, (unsigned long long)ps.runs,
					      (unsigned long long)ps.mapped_runs,
					      (unsigned long long)(ps.runs ? ps.bytes / ps.runs : 0),
					      ps.get_s / tw, ps.chunk_wait_s / tw, ps.queue_s / tw,
					      ps.idle_s / tw, ps.begin_s, ps.layer_wait_s);
				ph += b;
			}
			result(o, dp.name, r, secs, bytes, ret == (int)n,
			       r + o.run0 == 0 && !dp.tuned ? gpu_exact() : -1, cpu, dropped, ph.c_str());
		}
		tt_store_set_devpath(s, nullptr, nullptr);
		tt_file_path_close(fpth);
	}

	if (want("cpu")) {
		uint64_t hb[R], hs[R];
		struct tt_memmap hm = { L, 2, hb, hs };
		cudaStream_t cs;

		if (!host) {
			if (cudaHostAlloc(&host, bytes, 0) != cudaSuccess)
				die("cudaHostAlloc", -ENOMEM);
			tt_store_register_memory(s, host, bytes);
		}
		cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
		for (uint32_t m = 0; m < R; m++) {
			hb[m] = (uint64_t)(uintptr_t)host + (uint64_t)m * n * SPAN;
			hs[m] = SPAN;
		}
		for (unsigned r = 0; r < o.runs; r++) {
			int dropped = o.drop ? drop_caches() : 0;
			double t0, c0;
			int err = 0;

			cudaMemset(pg.dev, 0, bytes);
			cudaDeviceSynchronize();
			c0 = cpu_secs();
			t0 = now();
			if ((ret = tt_store_read_begin(s, slots.data(), n, &t)))
				die("read_begin", ret);
			err |= tt_txn_layer(t, 0, &hm, ids.data());
			for (uint32_t l = 0; l < L; l++) {
				if (l + 1 < L)
					err |= tt_txn_layer(t, l + 1, &hm, ids.data());
				err |= tt_txn_wait_layer(t, l);
				for (uint32_t k = 0; k < 2; k++) {
					uint32_t m = l * 2 + k;

					cudaMemcpyAsync((void *)(uintptr_t)pg.base[m], (void *)(uintptr_t)hb[m],
							(size_t)n * SPAN, cudaMemcpyHostToDevice, cs);
				}
			}
			ret = tt_txn_finish(t, st.data());
			cudaStreamSynchronize(cs);
			double secs = now() - t0;
			double cpu = cpu_secs() - c0;

			result(o, "cpu", r, secs, bytes, ret == (int)n && !err,
			       r + o.run0 == 0 ? gpu_exact() : -1, cpu, dropped, "");
		}
		cudaStreamDestroy(cs);
	}
	}	// rounds
	tt_store_close(s);	// before the registered host memory goes
	cudaFreeHost(host);
	cudaFree(pg.dev);
	free(src);
	unlink(o.store.c_str());
	return 0;
}
