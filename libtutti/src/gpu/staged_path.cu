// SPDX-License-Identifier: Apache-2.0
//
// staged_path.cu - the staged data path's backend: pread/pwrite of whole
// runs into pinned chunks, one async copy between chunk and device chunk.
// The pipeline (runs, threads, kernels, hashing) is file_pipe.cu.
//
// Mapped reads: pread's copy into the pinned chunk is what limits a
// RAM-backed store (the CPU touches every byte twice, the DMA a third
// time). A file whose pages can be pinned where they are (tmpfs, ramfs,
// hugetlbfs) is mapped once and registered with CUDA instead, so a run is
// one DMA from the page cache into the device chunk. The registration pins
// every page of the file until the path closes; pwrite (the CPU engine, a
// corruption test) goes into those same pages, so reads see it.
//
// Mapped writes: on a RAM-backed file opened for writing the registration
// is writable and a write run is one DMA from the device chunk into the
// file's pages (pwrite from a pinned chunk ran at 2-4 GB/s on the H200
// against 45 GB/s for mapped reads). Only there: a disk file system's page
// written by DMA is never marked dirty, so it would not reach the disk.
#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "tutti/error.h"
#include "file_pipe.cuh"

// Buffered preads in 1 MiB runs: with 16 threads x 3 chunks the staging
// buffers (48 MiB) stay mostly in the CPU's last-level cache between the
// kernel's copy and the DMA that reads them (H200: 38.3 vs 35.2 GB/s).
#define ST_BUFFERED_RUN	(1u << 20)
#define ST_MAX_FILES	64

// A file the path has seen: mapped and registered, or why not.
struct st_file {
	dev_t dev;
	ino_t ino;
	uint64_t size;		// file size when first seen
	char *map;		// registered view; nullptr: pread/pwrite
	int writes;		// write runs DMA into the view (RAM-backed, writable)
	uint64_t len;		// bytes mapped
	int stale;		// the file shrank since: not matched again
	char line[200];		// how it is read, and why
};

struct st_priv {
	std::mutex mu;
	unsigned mode;		// enum tt_file_map
	int ro;			// cudaHostRegisterReadOnly supported
	const char *fault;	// TUTTI_STAGED_MAP_FAULT: "mmap" or "register" (tests)
	unsigned n_files;
	struct st_file files[ST_MAX_FILES];
	uint64_t mapped_runs;	// atomic
	uint64_t mapped_bytes;
	unsigned n_mapped;
	double map_s;
};

static const char *fs_name(long type)
{
	switch (type) {
	case TMPFS_MAGIC: return "tmpfs";
	case RAMFS_MAGIC: return "ramfs";
	case HUGETLBFS_MAGIC: return "hugetlbfs";
	case 0xEF53: return "ext4";
	case 0x58465342: return "xfs";
	case 0x9123683E: return "btrfs";
	case 0x794c7630: return "overlayfs";
	case 0x6969: return "nfs";
	case 0x65735546: return "fuse";
	default: return "this file system";
	}
}

static int fs_in_ram(long type)
{
	return type == TMPFS_MAGIC || type == RAMFS_MAGIC || type == HUGETLBFS_MAGIC;
}

// A message cut at the buffer's end is fine: these lines are diagnostics.
__attribute__((format(printf, 3, 4)))
static void st_say(char *b, size_t n, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b, n, fmt, ap);
	va_end(ap);
}

__attribute__((format(printf, 3, 4)))
static void st_append(char *b, size_t n, const char *fmt, ...)
{
	size_t o = strlen(b);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b + o, n - o, fmt, ap);
	va_end(ap);
}

// Map @f's file (@fd) read-only and register it; on failure say why in
// f->line and leave f->map NULL. Runs on the caller's thread (begin).
static void st_map(struct tt_file_path *fp, struct st_priv *pv, struct st_file *f, int fd,
		   const struct stat *st)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t len, holes;
	struct statfs sf;
	const char *fs;
	char *map, why[160] = "";
	int prev = -1, wr = 0;
	cudaError_t err = cudaErrorNotSupported;
	const char *inj = "";
	uint64_t t0 = fp_ns();
	int tries[2], n_tries = 0, in_ram, want_wr;
	double dt;

	if (pv->mode == TT_FILE_MAP_OFF) {
		st_say(f->line, sizeof(f->line), "pread: mapping off (param or TUTTI_STAGED_MAP)");
		return;
	}
	if (fstatfs(fd, &sf)) {
		st_say(f->line, sizeof(f->line), "pread: statfs: %s", strerror(errno));
		return;
	}
	fs = fs_name(sf.f_type);
	in_ram = fs_in_ram(sf.f_type);
	want_wr = in_ram && (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR;
	if (!in_ram && pv->mode != TT_FILE_MAP_ANY) {
		st_say(f->line, sizeof(f->line), "pread: %s is not RAM-backed "
			 "(TUTTI_STAGED_MAP=any tries it)", fs);
		return;
	}
	// A disk file system's O_DIRECT write cannot drop a pinned page from
	// the page cache: the mapping would go stale. (tmpfs's O_DIRECT goes
	// through the page cache.)
	if (!fs_in_ram(sf.f_type) && (fcntl(fd, F_GETFL) & O_DIRECT)) {
		st_say(f->line, sizeof(f->line), "pread: %s file opened O_DIRECT: its writes "
			 "would bypass the pinned pages", fs);
		return;
	}
	if (!st->st_size) {
		st_say(f->line, sizeof(f->line), "pread: empty file");
		return;
	}
	// Pinning faults in every page: a hole of a sparse file becomes RAM.
	holes = (uint64_t)st->st_size > (uint64_t)st->st_blocks * 512 ?
		(uint64_t)st->st_size - (uint64_t)st->st_blocks * 512 : 0;
	if (fs_in_ram(sf.f_type) && sf.f_blocks && holes > (uint64_t)sf.f_bavail * sf.f_bsize) {
		st_say(f->line, sizeof(f->line), "pread: pinning would fill %.2f GiB of holes, "
			 "%.2f GiB free on %s", holes / 1073741824.0,
			 (double)sf.f_bavail * sf.f_bsize / 1073741824.0, fs);
		return;
	}
	if (sf.f_type == HUGETLBFS_MAGIC && sf.f_bsize > pg)
		pg = sf.f_bsize;
	len = ((uint64_t)st->st_size + pg - 1) / pg * pg;
	map = (char *)mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
	if (map != MAP_FAILED && pv->fault && !strcmp(pv->fault, "mmap")) {
		munmap(map, len);
		map = (char *)MAP_FAILED;
		errno = ENODEV;
		inj = " (injected)";
	}
	if (map == MAP_FAILED) {
		st_say(f->line, sizeof(f->line), "pread: mmap on %s: %s%s", fs, strerror(errno), inj);
		return;
	}
	if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(fp->device) != cudaSuccess) {
		cudaGetLastError();
		st_say(f->line, sizeof(f->line), "pread: cannot use CUDA device %d", fp->device);
		munmap(map, len);
		return;
	}
	// A store open for writing on a RAM-backed file system: writable
	// first, so writes can DMA into it (shmem allows such a pin). Else
	// read-only first: the pin needs no write access to the page cache
	// (which a file system with writeback refuses), and the GPU cannot
	// write the store; then a writable view.
	if (want_wr)
		tries[n_tries++] = 1;
	if (pv->ro)
		tries[n_tries++] = 0;
	if (!want_wr)
		tries[n_tries++] = 1;
	for (int i = 0; i < n_tries; i++) {
		wr = tries[i];
		if (mprotect(map, len, wr ? PROT_READ | PROT_WRITE : PROT_READ)) {
			st_append(why, sizeof(why), "%sno %s view: %s", *why ? "; " : "",
				  wr ? "writable" : "read-only", strerror(errno));
			continue;
		}
		if (pv->fault && !strcmp(pv->fault, "register")) {
			err = cudaErrorNotSupported;
			inj = " (injected)";
		} else {
			err = cudaHostRegister(map, len, cudaHostRegisterPortable |
					       (wr ? 0 : cudaHostRegisterReadOnly));
		}
		if (err == cudaSuccess)
			break;
		cudaGetLastError();	// not sticky: keep it from the next check
		st_append(why, sizeof(why), "%s%s registration: %s%s", *why ? "; " : "",
			  wr ? "writable" : "read-only", cudaGetErrorString(err), inj);
		if (*inj)
			break;
	}
	cudaSetDevice(prev);
	if (err != cudaSuccess) {
		st_say(f->line, sizeof(f->line), "pread: cudaHostRegister of %.2f GiB on %s: %s",
			 len / 1073741824.0, fs, why);
		munmap(map, len);
		return;
	}
	dt = (fp_ns() - t0) / 1e9;
	f->map = map;
	f->len = len;
	f->writes = wr && in_ram;
	pv->n_mapped++;
	pv->mapped_bytes += len;
	pv->map_s += dt;
	st_say(f->line, sizeof(f->line), "mapped: %s, %.2f GiB, %s registration in %.2f s%s", fs,
		 len / 1073741824.0, wr ? "writable" : "read-only", dt,
		 f->writes ? ", writes too" : "");
}

// The file behind @fd, mapped on first sight (pv->mu held); NULL if the
// table is full or fstat fails.
static struct st_file *st_file_of(struct tt_file_path *fp, struct st_priv *pv, int fd)
{
	char proc[32], name[128];
	struct st_file *f;
	struct stat st;
	ssize_t r;

	if (fstat(fd, &st))
		return nullptr;
	for (unsigned i = 0; i < pv->n_files; i++) {
		f = &pv->files[i];
		if (f->stale || f->dev != st.st_dev || f->ino != st.st_ino)
			continue;
		if ((uint64_t)st.st_size >= f->size)
			return f;
		// Truncated: the pinned pages may no longer be the file's.
		f->stale = 1;
		strncat(f->line, " [stale: file shrank]", sizeof(f->line) - strlen(f->line) - 1);
	}
	if (pv->n_files == ST_MAX_FILES)
		return nullptr;
	f = &pv->files[pv->n_files++];
	memset(f, 0, sizeof(*f));
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	f->size = (uint64_t)st.st_size;
	st_map(fp, pv, f, fd, &st);
	// The name, for the reader of the stats.
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	r = readlink(proc, name, sizeof(name) - 1);
	name[r > 0 ? r : 0] = 0;
	if (r > 0) {
		char line[sizeof(f->line)];

		st_say(line, sizeof(line), "%s: %s", name, f->line);
		memcpy(f->line, line, sizeof(line));
	}
	return f;
}

static uint32_t staged_txn_plan(struct fp_txn *t)
{
	struct tt_file_path *fp = t->fp;
	struct st_priv *pv = (struct st_priv *)fp->priv;
	int buffered = 0, mapped = 1;

	{
		std::lock_guard<std::mutex> lk(pv->mu);

		for (uint32_t m = 0; m < t->geo.n_members; m++) {
			struct st_file *f = st_file_of(fp, pv, t->fds[m]);

			t->fh[m] = f && f->map && (!t->write || f->writes) ? f : nullptr;
			mapped &= t->fh[m] != nullptr;
			if (!t->fh[m] && !(fcntl(t->fds[m], F_GETFL) & O_DIRECT))
				buffered = 1;
		}
	}
	// Every run a DMA: a few threads queue them (file_pipe.cuh).
	if (mapped && !fp->threads_set)
		t->workers = std::min(fp->n_workers, fp->mapped_workers);
	if (t->write)
		return 0;
	return buffered && !fp->chunk_set ? ST_BUFFERED_RUN : 0;
}

// Whole-run pread/pwrite; O_DIRECT or buffered, short transfers finished.
static int staged_pio(int fd, void *buf, uint32_t len, uint64_t off, int write)
{
	uint64_t done = 0;

	while (done < len) {
		ssize_t r = write ? pwrite(fd, (char *)buf + done, len - done, (off_t)(off + done))
				  : pread(fd, (char *)buf + done, len - done, (off_t)(off + done));

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -EIO;	// past the end of the member
		done += (uint64_t)r;
	}
	return 0;
}

// Run @j's bytes in its member's registered mapping (counted as a mapped
// run), or NULL: the member is not mapped for this transaction, or the run
// lies past the size the file had when it was mapped.
static char *st_run_map(struct fp_txn *t, const struct fp_job *j)
{
	struct st_file *f = (struct st_file *)t->fh[j->member];

	if (!f || j->off + j->len > f->size)
		return nullptr;
	fp_count(&((struct st_priv *)t->fp->priv)->mapped_runs, 1);
	return f->map + j->off;
}

static int staged_get(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j)
{
	char *m = st_run_map(t, j);

	// Mapped: nothing to do on the CPU, to_dev copies from the file.
	if (m) {
		c->src = m;
		return 0;
	}
	c->src = c->host;
	return staged_pio(t->fds[j->member], c->host, j->len, j->off, 0);
}

static int staged_put(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j)
{
	if (c->dst != c->host)	// from_dev's DMA put it in the file (its event is done)
		return 0;
	return staged_pio(t->fds[j->member], c->host, j->len, j->off, 1);
}

static int staged_to_dev(struct fp_chunk *c, uint32_t len, cudaStream_t s)
{
	return cudaMemcpyAsync(c->dev, c->src, len, cudaMemcpyHostToDevice, s) ? -EIO : 0;
}

static int staged_from_dev(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j,
			   cudaStream_t s)
{
	char *m = st_run_map(t, j);

	c->dst = m ? m : c->host;
	return cudaMemcpyAsync(c->dst, c->dev, j->len, cudaMemcpyDeviceToHost, s) ? -EIO : 0;
}

static int staged_init(struct tt_file_path *fp)
{
	struct st_priv *pv = new (std::nothrow) st_priv();
	const char *env = getenv("TUTTI_STAGED_MAP");
	int ro = 0;

	if (!pv)
		return tt_seterr(-ENOMEM, "staged path: out of memory");
	pv->mode = fp->map;
	if (env && (!strcmp(env, "off") || !strcmp(env, "0")))
		pv->mode = TT_FILE_MAP_OFF;
	else if (env && !strcmp(env, "auto"))
		pv->mode = TT_FILE_MAP_AUTO;
	else if (env && !strcmp(env, "any"))
		pv->mode = TT_FILE_MAP_ANY;
	pv->fault = getenv("TUTTI_STAGED_MAP_FAULT");
	if (pv->fault && !*pv->fault)
		pv->fault = nullptr;
	if (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, fp->device))
		ro = 0;
	cudaGetLastError();
	pv->ro = ro;
	fp->priv = pv;
	return 0;
}

static void staged_fini(struct tt_file_path *fp)
{
	struct st_priv *pv = (struct st_priv *)fp->priv;
	int prev = -1;

	if (!pv)
		return;
	if (pv->n_mapped && cudaGetDevice(&prev) == cudaSuccess)
		cudaSetDevice(fp->device);
	for (unsigned i = 0; i < pv->n_files; i++) {
		struct st_file *f = &pv->files[i];

		if (!f->map)
			continue;
		cudaHostUnregister(f->map);
		munmap(f->map, f->len);
	}
	if (prev >= 0)
		cudaSetDevice(prev);
	fp->priv = nullptr;
	delete pv;
}

static void staged_stats(struct tt_file_path *fp, struct tt_file_path_stats *st, int reset)
{
	struct st_priv *pv = (struct st_priv *)fp->priv;
	size_t o = 0;

	st->mapped_runs = reset ? __atomic_exchange_n(&pv->mapped_runs, 0, __ATOMIC_RELAXED)
				: __atomic_load_n(&pv->mapped_runs, __ATOMIC_RELAXED);
	std::lock_guard<std::mutex> lk(pv->mu);
	st->n_mapped = pv->n_mapped;
	st->mapped_bytes = pv->mapped_bytes;
	st->map_s = pv->map_s;
	for (unsigned i = 0; i < pv->n_files && o + 1 < sizeof(st->files); i++) {
		int r = snprintf(st->files + o, sizeof(st->files) - o, "%s%s", o ? "\n" : "",
				 pv->files[i].line);

		o += r > 0 ? (size_t)r : 0;
	}
}

static const struct fp_backend staged_backend = {
	.name = "staged",
	.host_chunks = 1,
	.init = staged_init,
	.fini = staged_fini,
	.txn_open = nullptr,
	.txn_close = nullptr,
	.get = staged_get,
	.to_dev = staged_to_dev,
	.from_dev = staged_from_dev,
	.put = staged_put,
	.txn_plan = staged_txn_plan,
	.stats = staged_stats,
};

int tt_file_path_open_staged(const struct tt_file_path_params *p, struct tt_file_path **out)
{
	return fp_open(p, &staged_backend, nullptr, out);
}

int tt_file_path_map_store(struct tt_file_path *fp, const struct tt_store *s)
{
	struct st_priv *pv;
	int fds[TT_MAX_MEMBERS], n, mapped = 0;

	if (!fp || fp->be != &staged_backend || !fp->priv)
		return tt_seterr(-EINVAL, "tt_file_path_map_store: not a staged path");
	pv = (struct st_priv *)fp->priv;
	n = tt_store_member_fds(s, fds, nullptr);
	std::lock_guard<std::mutex> lk(pv->mu);
	for (int m = 0; m < n; m++) {
		struct st_file *f = st_file_of(fp, pv, fds[m]);

		mapped += f && f->map;
	}
	return mapped;
}

const struct tt_devpath_ops tt_devpath_staged = {
	.name = "staged",
	.begin = fp_begin,
	.layer = fp_layer,
	.order = fp_order,
	.wait = fp_wait,
	.collect = fp_collect,
	.end = fp_end,
	.flush = nullptr,	// pwrite: the store's fdatasync covers it
	.poll = fp_poll,
};
