// SPDX-License-Identifier: Apache-2.0
/*
 * RAM-backed members (tmpfs, ramfs) mapped: the store's threads copy their
 * runs with memcpy, in parallel, instead of read()/write() under the file's
 * inode lock, and read the pages their own writes made present from there.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/vfs.h>
#include <linux/magic.h>

#include "engine_impl.h"
#include "../support/stream_copy.h"

int tt_fd_on_ram(int fd)
{
	struct statfs sf;

	return !fstatfs(fd, &sf) && (sf.f_type == TMPFS_MAGIC || sf.f_type == RAMFS_MAGIC);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ	22	/* Linux 5.14 */
#define MADV_POPULATE_WRITE	23
#endif

static uint64_t page_size(void)
{
	return (uint64_t)sysconf(_SC_PAGESIZE);
}

/*
 * A tmpfs member's bytes are already memory: mapped, the store's threads copy
 * them with memcpy, in parallel, where write() would take the file's inode
 * lock for each call (measured: 3.2 GB/s stored on 16 CPUs, against 11 for
 * separate files).  Only RAM filesystems: a disk file's read error would be a
 * SIGBUS.  Needs MADV_POPULATE_* so that a page tmpfs cannot supply is an
 * error returned, not a signal.
 */
void tt_engine_map_members(struct tt_engine *e)
{
	/*
	 * Writes, and reads of the pages those writes mapped, by default: a
	 * process's first touch of a page it never mapped costs more than
	 * pread's copy of it (2.2x slower first reads, 2 CPUs), while a page
	 * already mapped is a plain memcpy without faults (checked retrieves
	 * 1.1x preadv's on 16 CPUs: docs/benchmarks.md).  "rw": every read, "w":
	 * writes only, "0": neither.
	 */
	const char *how = getenv("TUTTI_TMPFS_MAP"), *nt = getenv("TUTTI_TMPFS_NT");
	const char *pop = getenv("TUTTI_TMPFS_POPULATE");
	int reads = how && !strcmp(how, "rw"), mine = !how || !*how;

	if (how && (!strcmp(how, "0") || !strcmp(how, "off")))
		return;
	e->map_stream = !nt || (strcmp(nt, "0") && strcmp(nt, "off"));
	e->map_populate = pop && *pop && strcmp(pop, "0") && strcmp(pop, "off");
	for (unsigned m = 0; m < e->n_members; m++) {
		int fd = e->fds[m], fl = fcntl(fd, F_GETFL), wr;
		struct stat st;
		void *p;

		if (!e->cpu_copy[m] || fl < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode) ||
		    st.st_size <= 0 || !tt_fd_on_ram(fd))
			continue;
		wr = (fl & O_ACCMODE) == O_RDWR;
		if (!wr && !reads)
			continue;	/* nothing would go through it */
		p = mmap(NULL, (size_t)st.st_size, PROT_READ | (wr ? PROT_WRITE : 0), MAP_SHARED,
			 fd, 0);
		if (p == MAP_FAILED)
			continue;
		if (madvise(p, (size_t)page_size(), MADV_POPULATE_READ)) {
			munmap(p, (size_t)st.st_size);	/* kernel before 5.14 */
			continue;
		}
		e->map[m] = p;
		e->map_len[m] = (uint64_t)st.st_size;
		e->map_wr[m] = (uint8_t)wr;
		e->map_rd[m] = (uint8_t)reads;
		/* Zero pages until used: a bit a page costs 1/32768 of what it tracks. */
		if (wr && mine && !reads)
			e->map_mine[m] = calloc(((uint64_t)st.st_size + 64 * page_size() - 1) /
						(64 * page_size()), sizeof(uint64_t));
	}
}

/* Pages [@a, @b) of member @m were made present by this process's writes. */
static void mine_set(struct tt_engine *e, unsigned m, uint64_t a, uint64_t b)
{
	uint64_t *bits = e->map_mine[m];

	if (!bits)
		return;
	for (; a < b; a++)
		__atomic_fetch_or(&bits[a / 64], 1ULL << (a % 64), __ATOMIC_RELAXED);
}

/* Were all pages [@a, @b) of member @m made present by this process's writes? */
static int mine_all(const struct tt_engine *e, unsigned m, uint64_t a, uint64_t b)
{
	const uint64_t *bits = e->map_mine[m];

	if (!bits)
		return 0;
	for (; a < b; a++)
		if (!(__atomic_load_n(&bits[a / 64], __ATOMIC_RELAXED) & (1ULL << (a % 64))))
			return 0;
	return 1;
}

void tt_engine_unmap_members(struct tt_engine *e)
{
	for (unsigned m = 0; m < e->n_members; m++) {
		if (e->map[m])
			munmap(e->map[m], (size_t)e->map_len[m]);
		free(e->map_mine[m]);
		e->map[m] = NULL;
		e->map_mine[m] = NULL;
		e->map_wr[m] = 0;
		e->map_rd[m] = 0;
	}
}

/*
 * Is swap configured now?  Looked at most once a second (a swapon in that
 * second, then a reclaim of a page just checked, is the window).
 */
static int swap_on(void)
{
	static int64_t next_ns;	/* atomic: when to look again */
	static int on = 1;	/* atomic */
	struct timespec ts;
	struct sysinfo si;
	int64_t now;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	if (now >= __atomic_load_n(&next_ns, __ATOMIC_ACQUIRE)) {
		__atomic_store_n(&on, sysinfo(&si) || si.totalswap > 0, __ATOMIC_RELAXED);
		__atomic_store_n(&next_ns, now + 1000000000, __ATOMIC_RELEASE);
	}
	return __atomic_load_n(&on, __ATOMIC_RELAXED);
}

/*
 * Where a run of a mapped member lies in the mapping, its pages made
 * present: NULL where the syscalls must move it instead (past the mapping,
 * or a page the filesystem cannot supply, whose error pread/pwrite then
 * report).  Pages this process's writes made present need no populating
 * while there is no swap: they stay in memory and mapped, a copy through
 * the mapping cannot fault to I/O; skipping it also leaves the pages'
 * LRU state alone (the populate's page walk marks each accessed, which made
 * the first read of freshly written pages ~0.8x later ones).  Another
 * process truncating the member, or punching a hole in it while its tmpfs
 * is full, would be a SIGBUS (the store's lock keeps other stores out, not
 * truncate(1) or fallocate(1)); a hole with space left reads as zeros,
 * which the checksums fail.
 */
char *tt_engine_map_run(struct tt_engine *e, const struct tt_io *ios, int wr, uint64_t bytes,
			uint64_t *calls)
{
	unsigned m = ios[0].member;
	uint64_t off = ios[0].off, pg = page_size(), start = off & ~(pg - 1);
	uint64_t pages_end = (off + bytes + pg - 1) / pg;
	int mine;

	if (!e->map[m] || off + bytes < off || off + bytes > e->map_len[m])
		return NULL;
	mine = mine_all(e, m, start / pg, pages_end);
	if (wr ? !e->map_wr[m] : !e->map_rd[m] && !mine)
		return NULL;
	if (mine && !e->map_populate && !swap_on())
		return e->map[m] + off;
	(*calls)++;
	/*
	 * Reads populate too: a page reclaimed since (swapped out) whose
	 * swap-in fails is then an error and pread's, not a SIGBUS.
	 */
	if (madvise(e->map[m] + start, off + bytes - start,
		    wr ? MADV_POPULATE_WRITE : MADV_POPULATE_READ))
		return NULL;
	if (wr)
		mine_set(e, m, start / pg, pages_end);
	return e->map[m] + off;
}

/* A run of a mapped member copied by the CPU: 0, or 1 for the syscalls. */
int tt_engine_map_move(struct tt_engine *e, struct tt_io *ios, unsigned n, int wr, uint64_t bytes,
		       uint64_t *calls)
{
	char *p = tt_engine_map_run(e, ios, wr, bytes, calls);

	if (!p)
		return 1;
	for (unsigned k = 0; k < n; k++) {
		if (wr && e->map_stream)
			tt_copy_stream(p, ios[k].buf, ios[k].len);
		else if (wr)
			memcpy(p, ios[k].buf, ios[k].len);
		else
			memcpy(ios[k].buf, p, ios[k].len);
		p += ios[k].len;
	}
	if (wr && e->map_stream)
		tt_copy_stream_end();
	return 0;
}
