// SPDX-License-Identifier: Apache-2.0
//
// Description: the staged and GDS data paths (staged_path.h, gds_path.h)
// through the store's API, bit-exact: blocks written from shuffled paged
// GPU blocks read back through the CPU store API, blocks stored by the CPU
// read into shuffled GPU blocks, 1 and 2 members (small stripes), small
// chunks (many runs, chunk reuse), a compute stream ordered on a layer
// with tt_txn_layer_order(), and a corrupted object caught by the GPU
// checksums (block -EBADMSG, dropped; its neighbours intact), and blocks
// written through the path read back through it. The staged path runs
// with pread (members on TMPDIR, mapping off) and mapped (members on
// /dev/shm, registered with CUDA: every read run must come from the
// mapping), and falls back to pread, saying why, when mapping is off by
// environment or the registration fails (injected). The GDS path is
// skipped where libcufile.so.0 is missing. Without a GPU: "1..0 # SKIP no CUDA device".
//
// Every case runs in a child process (the parent makes no CUDA call, so
// the children can): its TAP lines come back through a pipe, renumbered,
// one line at a time. A case that crashes or hangs fails a check of its
// own ("process ran to the end") and the next case still runs; the output
// shows the last check it passed, and whether it died at exit.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <linux/magic.h>
#include <sys/prctl.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "tap.h"
#include <tutti/error.h>
#include <tutti/gds_path.h>
#include <tutti/staged_path.h>
#include <tutti/store.h>

#define LAYERS 4u
#define SPAN 16384u	// kv_heads 4 x head_dim 128 x bf16 x 16 tokens

// The probe child's exit status when there is no GPU (between child and parent only).
#define CHILD_NO_DEVICE 77

static void require_device(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
		std::exit(CHILD_NO_DEVICE);
}

static std::string tmpdir, shmdir;	// shmdir empty: no tmpfs at /dev/shm

static bool in_ram(const char *dir)
{
	struct statfs sf;

	return !statfs(dir, &sf) && (sf.f_type == TMPFS_MAGIC || sf.f_type == RAMFS_MAGIC);
}

static struct tt_format_params params(uint64_t slots, uint32_t stripe)
{
	struct tt_format_params p;

	std::memset(&p, 0, sizeof(p));
	std::strcpy(p.fp.model_id, "test/gpu-staged");
	std::strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = LAYERS;
	p.fp.kv_heads = 4;
	p.fp.head_dim = 128;
	p.fp.block_size = 16;
	p.n_slots = slots;
	p.stripe_objs = stripe;
	return p;
}

// Paged KV memory like vLLM's: per layer, K and V each nblk blocks of SPAN.
struct paged {
	char *dev;
	uint32_t nblk;
	std::vector<uint64_t> base, stride;
	struct tt_memmap mm;

	explicit paged(uint32_t n) : dev(nullptr), nblk(n)
	{
		size_t bytes = (size_t)LAYERS * 2 * n * SPAN;

		if (cudaMalloc(&dev, bytes) != cudaSuccess)
			dev = nullptr;
		else
			cudaMemset(dev, 0, bytes);
		for (uint32_t m = 0; m < LAYERS * 2; m++) {
			base.push_back((uint64_t)(uintptr_t)dev + (uint64_t)m * n * SPAN);
			stride.push_back(SPAN);
		}
		mm = { LAYERS, 2, base.data(), stride.data() };
	}
	~paged() { cudaFree(dev); }
	// Bytes of block @id as the store keeps a block: (layer, span) order.
	std::vector<char> block(uint32_t id) const
	{
		std::vector<char> b((size_t)LAYERS * 2 * SPAN);

		for (uint32_t m = 0; m < LAYERS * 2; m++)
			cudaMemcpy(&b[(size_t)m * SPAN], (void *)(uintptr_t)(base[m] + (uint64_t)id * SPAN),
				   SPAN, cudaMemcpyDeviceToHost);
		return b;
	}
	void set_block(uint32_t id, const std::vector<char> &b)
	{
		for (uint32_t m = 0; m < LAYERS * 2; m++)
			cudaMemcpy((void *)(uintptr_t)(base[m] + (uint64_t)id * SPAN),
				   &b[(size_t)m * SPAN], SPAN, cudaMemcpyHostToDevice);
	}
};

static std::vector<char> pattern(uint32_t seed)
{
	std::vector<char> b((size_t)LAYERS * 2 * SPAN);
	std::mt19937_64 r(seed);

	for (size_t x = 0; x < b.size(); x += 8) {
		uint64_t v = r();

		std::memcpy(&b[x], &v, 8);
	}
	return b;
}

static void key_of(uint32_t i, uint32_t salt, uint8_t *key)
{
	char s[64];

	std::snprintf(s, sizeof(s), "block-%u-%u", salt, i);
	tt_key_from_bytes(s, std::strlen(s), key);
}

static std::vector<uint32_t> shuffled_ids(uint32_t n, uint32_t nblk, uint32_t seed)
{
	std::vector<uint32_t> v(nblk);

	std::iota(v.begin(), v.end(), 0);
	std::shuffle(v.begin(), v.end(), std::mt19937(seed));
	v.resize(n);
	return v;
}

typedef int (*open_fn)(const struct tt_file_path_params *, struct tt_file_path **);

// What the staged path must report for its members' reads.
enum { X_ANY, X_FS, X_MAPPED, X_PREAD };

struct cfg {
	const char *path;
	open_fn open;
	const struct tt_devpath_ops *ops;
	unsigned members;
	uint32_t stripe;
	uint32_t chunk;
	unsigned threads;
	int shm;		// members on /dev/shm (else TMPDIR)
	unsigned map;		// tt_file_path_params.map
	const char *env;	// "NAME=value" set before the path opens
	int expect;		// X_*: X_FS mapped iff the directory is in RAM
	const char *why;	// X_PREAD: in the reason
	int map_ahead;		// tt_file_path_map_store() before the first transaction
};

static void label_of(const struct cfg *c, char *b, size_t n)
{
	std::snprintf(b, n, "%s%s, %u member(s), stripe %u, chunk %u KiB, %u threads%s%s",
		      c->path, c->shm ? " on /dev/shm" : "", c->members, c->stripe, c->chunk >> 10,
		      c->threads, c->env ? ", " : "", c->env ? c->env : "");
}

// What the case wants of the staged path's members in @dir: X_FS resolved.
static int expected_mode(const struct cfg *c, const char *dir)
{
	if (c->expect == X_FS)
		return in_ram(dir) ? X_MAPPED : X_PREAD;
	return c->expect;
}

// Mapped runs are DMA: a transfer takes 2 of the default threads, all it is given.
static void check_threads(const struct cfg *c, const struct tt_file_path_stats *st,
			  const char *name, const char *what)
{
	unsigned most = c->threads ? c->threads : std::min(st->n_threads, 2u);

	tap_ok(st->threads_busy >= 1 && st->threads_busy <= most, "[%s] %s by %u of %u "
	       "threads (at most %u)", name, what, st->threads_busy, st->n_threads, most);
}

// After a read: how the members were read, against what the case wants.
static void check_mode(const struct cfg *c, struct tt_file_path *path, const char *name,
		       const char *dir)
{
	struct tt_file_path_stats st;
	int want = expected_mode(c, dir);

	if (c->ops != &tt_devpath_staged || want == X_ANY)
		return;
	tt_file_path_get_stats(path, &st, 0);
	for (char *l = st.files, *e; *l; l = e + (*e != 0)) {
		e = std::strchr(l, '\n');
		e = e ? e : l + std::strlen(l);
		tap_diag("[%s] %.*s", name, (int)(e - l), l);
	}
	tap_diag("[%s] runs %llu, mapped %llu; thread s: get %.3f wait %.3f queue %.3f idle %.3f",
		 name, (unsigned long long)st.runs, (unsigned long long)st.mapped_runs, st.get_s,
		 st.chunk_wait_s, st.queue_s, st.idle_s);
	if (want == X_MAPPED) {
		check_threads(c, &st, name, "read");
		tap_eq(st.n_mapped, c->members, "[%s] every member mapped and registered", name);
		tap_ok(st.runs && st.mapped_runs == st.runs,
		       "[%s] every read run came from the mapping (%llu of %llu)", name,
		       (unsigned long long)st.mapped_runs, (unsigned long long)st.runs);
	} else {
		tap_ok(st.n_mapped == 0 && st.mapped_runs == 0 && st.runs,
		       "[%s] read with pread (%u mapped, %llu mapped runs)", name, st.n_mapped,
		       (unsigned long long)st.mapped_runs);
		tap_ok(std::strstr(st.files, c->why ? c->why : "pread") != nullptr,
		       "[%s] the path says why (\"%s\")", name, c->why ? c->why : "pread");
	}
}

static void run(const struct cfg *c)
{
	const uint32_t N = 96, NBLK = 160;
	char name[160];
	const std::string &dir = c->shm ? shmdir : tmpdir;
	std::string p0 = dir + "/m0.img", p1 = dir + "/m1.img";
	const char *paths[2] = { p0.c_str(), p1.c_str() };
	struct tt_format_params fp = params(256, c->stripe);
	struct tt_file_path_params pp = {};
	struct tt_file_path *path = nullptr;
	struct tt_store *s = nullptr;
	std::vector<uint8_t> keys(N * TT_KEY_BYTES), keys2(N * TT_KEY_BYTES);
	std::vector<int32_t> st(N);
	std::vector<int64_t> slots(N);
	struct tt_txn *t = nullptr;
	bool same = true;
	int ret;

	label_of(c, name, sizeof(name));
	if (c->shm && shmdir.empty()) {
		tap_skip("[%s] /dev/shm is not a tmpfs here", name);
		return;
	}
	if (c->env)
		putenv((char *)c->env);	// this process only: one case per process
	pp.n_threads = c->threads;
	pp.chunk_bytes = c->chunk;
	pp.depth = 2;
	pp.device = -1;
	pp.map = c->map;
	unlink(p0.c_str());
	unlink(p1.c_str());
	fp.flags = TT_FORMAT_FORCE;
	if (!tap_eq(tt_store_format(paths, c->members, &fp), 0, "[%s] format", name) ||
	    !tap_eq(tt_store_open(paths, c->members, nullptr, &s), 0, "[%s] open", name))
		return;
	ret = c->open(&pp, &path);
	if (!tap_eq(ret, 0, "[%s] open the path (%s)", name, ret ? tt_errmsg() : "ok") ||
	    !tap_eq(tt_store_set_devpath(s, c->ops, path), 0, "[%s] set_devpath", name)) {
		tt_store_close(s);
		tt_file_path_close(path);
		return;
	}
	if (c->map_ahead)
		tap_eq(tt_file_path_map_store(path, s), c->members, "[%s] map and register the "
		       "members ahead (%s)", name, tt_errmsg());

	// 1. GPU -> store through the path, then the CPU store API reads it.
	{
		paged src(NBLK);
		std::vector<uint32_t> ids = shuffled_ids(N, NBLK, 1 + c->members);

		if (!tap_ok(src.dev != nullptr, "[%s] %u paged blocks in GPU memory", name, NBLK))
			goto out;
		for (uint32_t i = 0; i < N; i++) {
			src.set_block(ids[i], pattern(1000 + i));
			key_of(i, 1, &keys[i * TT_KEY_BYTES]);
		}
		if (!tap_eq(tt_store_write_begin(s, keys.data(), N, &t), 0, "[%s] write_begin", name))
			goto out;
		ret = tt_txn_bind_device(t, ids.data());
		if (ret && c->ops == &tt_devpath_gds && strstr(tt_errmsg(), "cuFileHandleRegister")) {
			/* cuFile before 1.17 without nvidia-fs refuses to register files (the
			 * H200's 1.15 does, on ext4 and tmpfs): a property of the machine. */
			tap_skip("[%s] cuFile cannot register the store's files here: %s", name,
				 tt_errmsg());
			tt_txn_abort(t);
			goto out;
		}
		if (!tap_eq(ret, 0, "[%s] bind write to device (%s)", name, ret ? tt_errmsg() : "ok"))
			goto out;
		ret = 0;
		for (uint32_t l = 0; l < LAYERS; l++)
			ret |= tt_txn_layer(t, l, &src.mm, nullptr);
		for (uint32_t l = 0; l < LAYERS; l++)
			ret |= tt_txn_wait_layer(t, l);
		tap_eq(ret, 0, "[%s] write: every layer submitted and done", name);
		tap_eq(tt_txn_finish(t, st.data()), N, "[%s] write: %u blocks committed", name, N);
		if (c->ops == &tt_devpath_staged && c->expect != X_ANY) {
			struct tt_file_path_stats ws;
			int want = expected_mode(c, dir.c_str());

			tt_file_path_get_stats(path, &ws, 1);
			if (want == X_MAPPED) {
				check_threads(c, &ws, name, "written");
				tap_ok(ws.runs && ws.mapped_runs == ws.runs, "[%s] every write run "
				       "went by DMA into the mapping (%llu of %llu)", name,
				       (unsigned long long)ws.mapped_runs,
				       (unsigned long long)ws.runs);
			} else {
				tap_ok(ws.runs && ws.mapped_runs == 0, "[%s] written with pwrite "
				       "(%llu mapped runs)", name, (unsigned long long)ws.mapped_runs);
			}
		}
		for (uint32_t i = 0; i < N; i++) {
			std::vector<char> got((size_t)LAYERS * 2 * SPAN);

			if (tt_store_get(s, &keys[i * TT_KEY_BYTES], got.data(), got.size()) ||
			    got != pattern(1000 + i))
				same = false;
		}
		tap_ok(same, "[%s] CPU store API reads back every block bit-exact", name);
	}

	// 2. CPU store -> GPU through the path, into other shuffled blocks.
	{
		paged dst(NBLK);
		std::vector<uint32_t> ids = shuffled_ids(N, NBLK, 7 + c->members);
		cudaStream_t cs;
		std::vector<char> l0((size_t)NBLK * SPAN);
		bool ordered = true;

		if (!tap_ok(dst.dev != nullptr, "[%s] %u paged blocks in GPU memory", name, NBLK))
			goto out;
		for (uint32_t i = 0; i < N; i++) {
			key_of(i, 2, &keys2[i * TT_KEY_BYTES]);
			tt_store_put(s, &keys2[i * TT_KEY_BYTES], pattern(5000 + i).data(),
				     (size_t)LAYERS * 2 * SPAN);
		}
		tap_eq(tt_store_lookup(s, keys2.data(), N, slots.data()), N, "[%s] CPU put %u blocks",
		       name, N);
		if (c->ops == &tt_devpath_staged) {
			struct tt_file_path_stats z;

			tt_file_path_get_stats(path, &z, 1);	// count this read only
		}
		if (!tap_eq(tt_store_read_begin(s, slots.data(), N, &t), 0, "[%s] read_begin", name) ||
		    !tap_eq(tt_txn_bind_device(t, ids.data()), 0, "[%s] bind read to device", name))
			goto out;
		cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
		ret = 0;
		for (uint32_t l = 0; l < LAYERS; l++)
			ret |= tt_txn_layer(t, l, &dst.mm, nullptr);
		// Layer 0's K span, copied on a compute stream ordered on the GPU.
		ret |= tt_txn_layer_order(t, 0, cs);
		cudaMemcpyAsync(l0.data(), (void *)(uintptr_t)dst.base[0], l0.size(),
				cudaMemcpyDeviceToHost, cs);
		cudaStreamSynchronize(cs);
		for (uint32_t l = 0; l < LAYERS; l++)
			ret |= tt_txn_wait_layer(t, l);
		tap_eq(ret, 0, "[%s] read: every layer submitted, ordered and done", name);
		tap_eq(tt_txn_finish(t, st.data()), N, "[%s] read: %u blocks verified by GPU checksums",
		       name, N);
		same = true;
		for (uint32_t i = 0; i < N; i++) {
			std::vector<char> want = pattern(5000 + i);

			if (dst.block(ids[i]) != want)
				same = false;
			if (std::memcmp(&l0[(size_t)ids[i] * SPAN], want.data(), SPAN))
				ordered = false;
		}
		tap_ok(same, "[%s] every block landed bit-exact in its shuffled GPU block", name);
		tap_ok(ordered, "[%s] a stream ordered on layer 0 saw its bytes", name);
		cudaStreamDestroy(cs);
		check_mode(c, path, name, dir.c_str());

		// 3. Corrupt one object of block 5 on disk: only block 5 fails.
		{
			struct tt_store_info info;
			int64_t slot5 = slots[5];
			int fds[TT_MAX_MEMBERS];
			struct tt_extent e;
			char junk[64];

			tt_store_get_info(s, &info);
			e = tt_locate(&info.geo, (uint64_t)slot5, 2, 1);
			tt_store_member_fds(s, fds, nullptr);
			std::memset(junk, 0x5a, sizeof(junk));
			{
				// A second, buffered descriptor: the store's may be O_DIRECT.
				std::string mp = e.member ? p1 : p0;
				int fd = open(mp.c_str(), O_WRONLY);

				tap_ok(fd >= 0 && pwrite(fd, junk, sizeof(junk), (off_t)e.off + 1000) == 64,
				       "[%s] corrupt 64 bytes of block 5, layer 2, V", name);
				if (fd >= 0) {
					fsync(fd);
					close(fd);
				}
			}
			// Page cache and O_DIRECT must agree on what is on disk.
			posix_fadvise(fds[e.member], 0, 0, POSIX_FADV_DONTNEED);
			if (!tap_eq(tt_store_read_begin(s, slots.data(), N, &t), 0, "[%s] read again", name) ||
			    !tap_eq(tt_txn_bind_device(t, ids.data()), 0, "[%s] bind", name))
				goto out;
			for (uint32_t l = 0; l < LAYERS; l++)
				tt_txn_layer(t, l, &dst.mm, nullptr);
			tap_eq(tt_txn_finish(t, st.data()), N - 1, "[%s] %u of %u blocks ok", name, N - 1, N);
			tap_eq((unsigned long long)st[5], (unsigned long long)-EBADMSG,
			       "[%s] the corrupted block is -EBADMSG", name);
			tap_eq(st[4] | st[6], 0, "[%s] its neighbours are fine", name);
			tap_eq(tt_store_lookup(s, &keys2[5 * TT_KEY_BYTES], 1, &slot5), 0,
			       "[%s] the corrupted block was dropped", name);
		}
	}

	// 4. The blocks written through the path in 1, read back through it.
	{
		paged dst(NBLK);
		std::vector<uint32_t> ids = shuffled_ids(N, NBLK, 11 + c->members);

		if (!tap_ok(dst.dev != nullptr, "[%s] %u paged blocks in GPU memory", name, NBLK))
			goto out;
		if (!tap_eq(tt_store_lookup(s, keys.data(), N, slots.data()), N, "[%s] lookup %u "
			    "blocks written through the path", name, N) ||
		    !tap_eq(tt_store_read_begin(s, slots.data(), N, &t), 0, "[%s] read_begin", name) ||
		    !tap_eq(tt_txn_bind_device(t, ids.data()), 0, "[%s] bind", name))
			goto out;
		for (uint32_t l = 0; l < LAYERS; l++)
			tt_txn_layer(t, l, &dst.mm, nullptr);
		tap_eq(tt_txn_finish(t, st.data()), N, "[%s] written through the path, %u blocks "
		       "read back through it verified", name, N);
		same = true;
		for (uint32_t i = 0; i < N; i++)
			if (dst.block(ids[i]) != pattern(1000 + i))
				same = false;
		tap_ok(same, "[%s] and bit-exact", name);
	}
	tap_eq(tt_store_set_devpath(s, nullptr, nullptr), 0, "[%s] remove the path", name);
out:
	tt_store_close(s);	// aborts a transaction left open by a failure
	tt_file_path_close(path);
}

#define STAGED "staged", tt_file_path_open_staged, &tt_devpath_staged
#define GDS "gds", tt_file_path_open_gds, &tt_devpath_gds

static const struct cfg cfgs[] = {
	// TMPDIR: mapped iff it is in RAM; then pread, mapping off.
	{ STAGED, 1, 0, 0, 0, 0, TT_FILE_MAP_AUTO, nullptr,
	  X_FS, "not RAM-backed", 0 },
	{ STAGED, 2, 4, 0, 0, 0, TT_FILE_MAP_OFF, nullptr,
	  X_PREAD, "mapping off", 0 },
	{ STAGED, 2, 3, 64 << 10, 2, 0, TT_FILE_MAP_OFF, nullptr,
	  X_PREAD, "mapping off", 0 },
	// /dev/shm: mapped (at the first transaction; ahead), and the fallbacks.
	{ STAGED, 1, 0, 0, 0, 1, TT_FILE_MAP_AUTO, nullptr,
	  X_MAPPED, nullptr, 0 },
	{ STAGED, 2, 3, 64 << 10, 2, 1, TT_FILE_MAP_AUTO, nullptr,
	  X_MAPPED, nullptr, 1 },
	{ STAGED, 2, 4, 0, 0, 1, TT_FILE_MAP_AUTO,
	  "TUTTI_STAGED_MAP=off", X_PREAD, "mapping off", 0 },
	{ STAGED, 1, 0, 0, 3, 1, TT_FILE_MAP_AUTO,
	  "TUTTI_STAGED_MAP_FAULT=register", X_PREAD, "cudaHostRegister", 0 },
	{ GDS, 1, 0, 0, 0, 0, 0, nullptr, X_ANY, nullptr, 0 },
	{ GDS, 2, 4, 64 << 10, 3, 0, 0, nullptr, X_ANY, nullptr, 0 },
};
#define N_CFGS (sizeof(cfgs) / sizeof(cfgs[0]))
#define DONE_MARK "case done"
#define GDS_MARK "gds: available"
#define TEST_SECS 80.0	// all cases; the runner allows the test 90 s

// In the child. @k < 0: is there a device, does the GDS path open.
static int child_case(int k)
{
	struct tt_file_path *probe = nullptr;
	int gds;

	require_device();
	if (k >= 0) {
		run(&cfgs[k]);
		return tap_failed ? 1 : 0;
	}
	gds = tt_file_path_open_gds(nullptr, &probe);
	if (gds == 0) {
		tt_file_path_close(probe);
		tap_diag(GDS_MARK);
	} else {
		tap_diag("GDS path not run: %s", tt_errmsg());
	}
	tap_ok(gds == 0 || gds == -ENOSYS, "gds: opens, or says -ENOSYS (%d)", gds);
	return tap_failed ? 1 : 0;
}

static double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

// One line from a child: checks renumbered into ours, the rest as comments.
static void relay(const std::string &ln, unsigned *checks, bool *done, bool *gds)
{
	bool ok = ln.compare(0, 3, "ok ") == 0, nok = ln.compare(0, 7, "not ok ") == 0;
	size_t d = ln.find(" - ");

	if (ln.empty())
		return;
	if ((ok || nok) && d != std::string::npos) {
		(*checks)++;
		tap_ok(ok, "%s", ln.c_str() + d + 3);
	} else if (ln.compare(0, 3, "1..") == 0) {
		return;	// the child's plan: ours is printed at the end
	} else if (ln == "# " DONE_MARK) {
		*done = true;
	} else {
		if (ln == "# " GDS_MARK)
			*gds = true;
		std::printf("%s%s\n", ln.compare(0, 1, "#") ? "# " : "", ln.c_str());
	}
}

// Run case @k in a child for at most @secs; CHILD_NO_DEVICE: no device (probe only).
static int spawn_case(int k, const char *label, double secs, bool *gds)
{
	std::string buf;
	unsigned checks = 0;
	bool done = false, hung = false;
	double end = mono() + secs;
	int pfd[2], st = 0;
	pid_t pid;

	std::fflush(stdout);
	if (pipe(pfd) || (pid = fork()) < 0) {
		tap_ok(false, "[%s] start a process: %s", label, std::strerror(errno));
		return 1;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);	// no orphan if the runner kills us
		close(pfd[0]);
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		close(pfd[1]);
		tap_count = tap_failed = 0;
		int rc = child_case(k);

		std::printf("\n# " DONE_MARK "\n");	// on a line of its own
		std::fflush(stdout);
		std::exit(rc);	// a plain exit: a crash in exit handlers must show
	}
	close(pfd[1]);
	for (;;) {
		struct pollfd p = { pfd[0], POLLIN, 0 };
		double left = end - mono();
		char b[4096];
		ssize_t r;

		if (left <= 0) {
			hung = true;
			break;
		}
		if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
			continue;
		r = read(pfd[0], b, sizeof(b));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		buf.append(b, (size_t)r);
		for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1))
			relay(buf.substr(0, nl), &checks, &done, gds);
	}
	if (!buf.empty() && !hung)
		relay(buf, &checks, &done, gds);
	close(pfd[0]);
	if (hung)
		kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	if (k < 0 && WIFEXITED(st) && WEXITSTATUS(st) == CHILD_NO_DEVICE)
		return CHILD_NO_DEVICE;
	if (hung)
		tap_ok(false, "[%s] process ran to the end: hung, killed after %.0f s (after %u checks)",
		       label, secs, checks);
	else if (WIFSIGNALED(st))
		tap_ok(false, "[%s] process ran to the end: signal %d (%s) %s %u checks", label,
		       WTERMSIG(st), strsignal(WTERMSIG(st)), done ? "at exit, after all its" : "after",
		       checks);
	else
		tap_ok(done, "[%s] process ran to the end (exit %d, %u checks)", label, WEXITSTATUS(st),
		       checks);
	return 0;
}

int main(void)
{
	const char *td = std::getenv("TMPDIR");
	double end = mono() + TEST_SECS;
	char dir[256];
	bool gds = false;

	// No CUDA here: the children could not use it after the parent had.
	setvbuf(stdout, nullptr, _IOLBF, 0);
	std::snprintf(dir, sizeof(dir), "%s/tt_gpu_staged.XXXXXX", td ? td : "/tmp");
	if (!mkdtemp(dir)) {
		std::printf("Bail out! mkdtemp failed\n");
		return 1;
	}
	tmpdir = dir;
	if (in_ram("/dev/shm")) {
		char sd[] = "/dev/shm/tt_gpu_staged.XXXXXX";

		if (mkdtemp(sd))
			shmdir = sd;
	}
	if (spawn_case(-1, "device and GDS probe", 20, &gds) == CHILD_NO_DEVICE) {
		rmdir(dir);
		if (!shmdir.empty())
			rmdir(shmdir.c_str());
		tap_skip_all("no CUDA device");
	}
	for (unsigned k = 0; k < N_CFGS; k++) {
		const struct cfg *c = &cfgs[k];
		char label[160];
		double left = end - mono();

		label_of(c, label, sizeof(label));
		if (c->ops == &tt_devpath_gds && !gds)
			continue;
		if (left < 2) {
			tap_ok(false, "[%s] not run: the test's %.0f s are spent", label, TEST_SECS);
			continue;
		}
		spawn_case((int)k, label, std::min(20.0, left), &gds);
	}
	for (const std::string &d : { tmpdir, shmdir }) {
		if (d.empty())
			continue;
		unlink((d + "/m0.img").c_str());
		unlink((d + "/m1.img").c_str());
		rmdir(d.c_str());
	}
	return tap_done();
}
