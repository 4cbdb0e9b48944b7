// SPDX-License-Identifier: Apache-2.0
/*
 * Description: engines move batches bit-exactly, merge ios adjacent on disk
 * into one request (also when their memory is scattered), respect the
 * request size limit, report errors per io (also inside one merged request:
 * each io is moved again on its own), and batches larger than the ring still
 * complete.  Reads the CPU copies (a buffered or tmpfs member) run on
 * io_uring's workers, or on any thread with tt_engine_move_now(); work the
 * kernel cancels because no worker can be started is done with a syscall
 * instead of failing.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "../src/engine/engine_impl.h"
#include "tap.h"

#define OBJ 4096u

static void run(const char *name, int fd)
{
	struct tt_engine_params ep = { .queue_depth = 8, .max_req_bytes = 16 * OBJ,
				       .copy_threads = 4 };
	enum { N = 200 };
	struct tt_io ios[N];
	struct tt_batch b = { .ios = ios, .n = N };
	struct tt_engine_stats st;
	struct tt_engine *e;
	uint8_t *src = aligned_alloc(OBJ, (size_t)N * OBJ);
	uint8_t *dst = aligned_alloc(OBJ, (size_t)2 * N * OBJ);
	int ok = 1;

	tap_eq(tt_engine_open(name, &fd, 1, &ep, &e), 0, "[%s] open", name);
	tap_ok(!strcmp(tt_engine_name(e), name), "[%s] is %s", name, tt_engine_name(e));
	for (unsigned i = 0; i < N * OBJ; i++)
		src[i] = (uint8_t)(i * 31 + i / OBJ);
	/* Write N objects contiguous on disk, from contiguous memory. */
	for (unsigned i = 0; i < N; i++)
		ios[i] = (struct tt_io){ .buf = src + (size_t)i * OBJ, .off = (uint64_t)i * OBJ,
					 .len = OBJ, .op = TT_OP_WRITE };
	tap_eq(tt_engine_submit(e, &b), 0, "[%s] submit write", name);
	tap_eq(tt_engine_wait(e, &b), 0, "[%s] write batch ok", name);
	tap_eq(b.reqs, (N + 15) / 16, "[%s] %u objects merged into %u requests", name, N, b.reqs);

	/* Read back into scattered memory (every other object slot, reversed). */
	for (unsigned i = 0; i < N; i++)
		ios[i] = (struct tt_io){ .buf = dst + (size_t)(2 * (N - 1 - i)) * OBJ,
					 .off = (uint64_t)i * OBJ, .len = OBJ, .op = TT_OP_READ };
	tt_engine_submit(e, &b);
	tap_eq(tt_engine_wait(e, &b), 0, "[%s] scattered read ok", name);
	tap_eq(b.reqs, (N + 15) / 16, "[%s] scattered memory still merges", name);
	for (unsigned i = 0; i < N; i++)
		if (memcmp(src + (size_t)i * OBJ, dst + (size_t)(2 * (N - 1 - i)) * OBJ, OBJ))
			ok = 0;
	tap_ok(ok, "[%s] bit-exact", name);
	for (unsigned i = 0; i < N; i++)
		ok &= ios[i].res == 0;
	tap_ok(ok, "[%s] every io reports success", name);

	/* Past the end of the file: that io fails, the others succeed. */
	ios[0] = (struct tt_io){ .buf = dst, .off = 0, .len = OBJ, .op = TT_OP_READ };
	ios[1] = (struct tt_io){ .buf = dst + OBJ, .off = (uint64_t)(N + 100) * OBJ,
				 .len = OBJ, .op = TT_OP_READ };
	b.n = 2;
	tt_engine_submit(e, &b);
	tap_ok(tt_engine_wait(e, &b) < 0, "[%s] read past the end fails", name);
	tap_ok(ios[0].res == 0 && ios[1].res < 0, "[%s] failure is per io (%d, %d)", name,
	       ios[0].res, ios[1].res);

	/*
	 * One request of three adjacent ios whose last runs past the end: a
	 * device fails the whole command, but only that io may fail (the
	 * others are moved again on their own and succeed).
	 */
	for (unsigned i = 0; i < 3; i++)
		ios[i] = (struct tt_io){ .buf = dst + (size_t)i * OBJ, .off = (uint64_t)(N - 2 + i) * OBJ,
					 .len = OBJ, .op = TT_OP_READ };
	b.n = 3;
	memset(dst, 0, 3 * OBJ);
	tt_engine_submit(e, &b);
	tap_ok(tt_engine_wait(e, &b) < 0 && b.reqs == 1, "[%s] one merged request, failed (%u)",
	       name, b.reqs);
	tap_ok(ios[0].res == 0 && ios[1].res == 0 && ios[2].res == -EIO &&
	       !memcmp(dst, src + (size_t)(N - 2) * OBJ, 2 * OBJ),
	       "[%s] a failed merged request fails only the io that failed (%d, %d, %d), the others "
	       "hold their bytes", name, ios[0].res, ios[1].res, ios[2].res);
	tap_eq(tt_engine_flush(e), 0, "[%s] flush", name);
	tt_engine_get_stats(e, &st);
	tap_eq(st.bytes_written, (unsigned long long)N * OBJ, "[%s] bytes written counted", name);
	tt_engine_close(e);
	free(src);
	free(dst);
}

/*
 * In a process that may start no thread (RLIMIT_NPROC; root first becomes
 * nobody, whose rights the limit binds), io_uring cancels async work: the
 * engine must move the data inline instead of failing it.  Exit status: 0
 * written, read and exact, 1 bytes differ, 2 an io failed, 3 could not set up.
 */
static int read_without_threads(const char *path)
{
	struct tt_engine_params ep = { .queue_depth = 8, .copy_threads = 4 };
	struct rlimit one = { 1, 1 };
	enum { N = 64 };
	struct tt_io ios[N];
	struct tt_batch b = { .ios = ios, .n = N };
	struct tt_engine *e;
	uint8_t *dst = malloc((size_t)N * OBJ);
	int fd, ret;

	if (!dst || (geteuid() == 0 && (setgid(65534) || setuid(65534))) ||
	    setrlimit(RLIMIT_NPROC, &one))
		return 3;
	fd = open(path, O_RDWR);	/* buffered: the CPU copies */
	if (fd < 0 || tt_engine_open("uring", &fd, 1, &ep, &e))
		return 3;
	/*
	 * Buffered writes that would block are handed to the workers by the
	 * kernel itself (then cancelled), reads by the engine: both must land.
	 */
	for (unsigned i = 0; i < (unsigned)N * OBJ; i++)
		dst[i] = (uint8_t)(i * 31 + i / OBJ);
	for (unsigned i = 0; i < N; i++)
		ios[i] = (struct tt_io){ .buf = dst + (size_t)i * OBJ, .off = (uint64_t)i * OBJ,
					 .len = OBJ, .op = TT_OP_WRITE };
	tt_engine_submit(e, &b);
	if (tt_engine_wait(e, &b))
		return 2;
	memset(dst, 0, (size_t)N * OBJ);
	for (unsigned i = 0; i < N; i++)
		ios[i] = (struct tt_io){ .buf = dst + (size_t)i * OBJ, .off = (uint64_t)i * OBJ,
					 .len = OBJ, .op = TT_OP_READ };
	tt_engine_submit(e, &b);
	ret = tt_engine_wait(e, &b);
	tt_engine_close(e);
	if (ret)
		return 2;
	for (unsigned i = 0; i < (unsigned)N * OBJ; i++)
		if (dst[i] != (uint8_t)(i * 31 + i / OBJ))
			return 1;
	return 0;
}

static void check_without_threads(const char *path)
{
	int st = -1;
	pid_t pid;

	chmod(path, 0666);
	pid = fork();
	if (pid == 0)
		_exit(read_without_threads(path));
	waitpid(pid, &st, 0);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 3) {
		tap_skip("no thread allowed: could not drop to an unprivileged user");
		return;
	}
	tap_ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	       "[uring] no io_uring worker can be started: cancelled writes and reads redone inline, exact (status %d)",
	       WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/*
 * Reads the CPU copies may be moved on any thread (the store's threads read
 * and hash a large layer at once): exact, past the end -EIO, and refused for
 * a member a device moves or an engine with a queue of its own.
 */
static void check_move_now(int fd, int direct_fd)
{
	struct tt_engine_stats st;
	struct tt_engine *e;
	uint8_t *buf = aligned_alloc(OBJ, 2 * OBJ), *want = aligned_alloc(OBJ, OBJ);
	struct tt_io io = { .buf = buf, .off = 3 * OBJ, .len = OBJ, .op = TT_OP_READ };
	struct stat sb;

	for (unsigned i = 0; i < OBJ; i++)
		want[i] = (uint8_t)(i * 7 + 3);
	tap_eq(pwrite(fd, want, OBJ, 3 * OBJ), OBJ, "move_now: object written");
	tap_eq(tt_engine_open("uring", &fd, 1, NULL, &e), 0, "move_now: open");
	tap_ok(tt_engine_cpu_reads(e, 0), "move_now: a buffered/tmpfs member is read by the CPU");
	tap_ok(!tt_engine_cpu_reads(e, 1), "move_now: no member 1");
	tap_eq(tt_engine_move_now(e, &io, 1), 0, "move_now: read");
	tap_ok(io.res == 0 && !memcmp(buf, want, OBJ), "move_now: exact");
	fstat(fd, &sb);
	io.off = (uint64_t)sb.st_size + OBJ;
	tap_eq(tt_engine_move_now(e, &io, 1), (unsigned long long)-EIO, "move_now: past the end is -EIO");
	tap_eq(io.res, -EIO, "move_now: and so is its result");
	{
		/* A run of two: one preadv; one that crosses the end: each io its own verdict. */
		struct tt_io run[2] = {
			{ .buf = buf, .off = 2 * OBJ, .len = OBJ, .op = TT_OP_READ },
			{ .buf = buf + OBJ, .off = 3 * OBJ, .len = OBJ, .op = TT_OP_READ },
		};

		tap_eq(tt_engine_move_now(e, run, 2), 0, "move_now: a run of two");
		tap_ok(!memcmp(buf + OBJ, want, OBJ), "move_now: the run's second object exact");
		run[0].off = (uint64_t)sb.st_size - OBJ;
		run[1].off = (uint64_t)sb.st_size;
		tap_eq(tt_engine_move_now(e, run, 2), (unsigned long long)-EIO, "move_now: run past the end");
		tap_ok(run[0].res == 0 && run[1].res == -EIO,
		       "move_now: only the io past the end fails (%d, %d)", run[0].res, run[1].res);
		run[1].off = run[0].off + 2 * OBJ;
		tap_eq(tt_engine_move_now(e, run, 2), (unsigned long long)-EINVAL,
		       "move_now: not adjacent on the member: refused");
	}
	io.op = TT_OP_WRITE;
	tap_ok(!tt_engine_cpu_writes(e, 0), "move_now: a disk file's writes are not the CPU's to spread");
	tap_eq(tt_engine_move_now(e, &io, 1), (unsigned long long)-EINVAL,
	       "move_now: so a write is refused");
	tt_engine_get_stats(e, &st);
	tap_ok(st.ios == 4 && st.bytes_read == 4 * OBJ, "move_now: counted (%llu ios, %llu bytes)",
	       (unsigned long long)st.ios, (unsigned long long)st.bytes_read);
	tt_engine_close(e);
	tap_eq(tt_engine_open("fault:uring", &fd, 1, NULL, &e), 0, "move_now: fault engine open");
	tap_ok(!tt_engine_cpu_reads(e, 0), "move_now: never behind the fault engine (its faults apply)");
	tt_engine_close(e);
	if (direct_fd != fd) {
		tap_eq(tt_engine_open("uring", &direct_fd, 1, NULL, &e), 0, "move_now: O_DIRECT open");
		tap_ok(!tt_engine_cpu_reads(e, 0), "move_now: not for an O_DIRECT member on a disk");
		tt_engine_close(e);
	} else {
		tap_skip("no O_DIRECT on this filesystem");
		tap_skip("no O_DIRECT on this filesystem");
	}
	free(buf);
	free(want);
}

/*
 * tt_engine_map_read(): where the default would memcpy a read out of the
 * mapping (its own pages), the caller is given the bytes instead, counted as
 * read; anything else (pages it never wrote, past the end, a write, another
 * mode, TUTTI_TMPFS_NT=0) is NULL: the run goes through tt_engine_move_now().
 */
static void check_map_read(struct tt_engine *e, int fd, const char *how)
{
	uint8_t *want = aligned_alloc(OBJ, 2 * OBJ);
	struct tt_io io = { .buf = want, .off = 2 * OBJ, .len = 2 * OBJ, .op = TT_OP_READ, .res = 1 };
	struct tt_engine_stats a, b;
	const char *p;

	tap_ok(pread(fd, want, 2 * OBJ, 2 * OBJ) == 2 * OBJ, "map_read (%s): the file's bytes", how);
	tt_engine_get_stats(e, &a);
	p = tt_engine_map_read(e, &io, 1);
	tt_engine_get_stats(e, &b);
	if (strcmp(how, "w")) {	/* the default (its own pages) and rw (every page) */
		tap_ok(p && !io.res && !memcmp(p, want, 2 * OBJ),
		       "map_read (%s): its written pages given, exact, res 0", how);
		tap_ok(b.bytes_read - a.bytes_read == 2 * OBJ && b.ios - a.ios == 1,
		       "map_read (%s): counted as read", how);
	} else {
		tap_ok(!p && b.bytes_read == a.bytes_read, "map_read (%s): not given", how);
		tap_skip("counted only when given");
	}
	io.off = 7 * OBJ;	/* written through the file: never its own */
	tap_ok(!tt_engine_map_read(e, &io, 1) || !strcmp(how, "rw"),
	       "map_read (%s): pages it never wrote: not given (but with rw)", how);
	io.off = (uint64_t)16 * OBJ;
	tap_ok(!tt_engine_map_read(e, &io, 1), "map_read (%s): past the end: not given", how);
	io.off = 2 * OBJ;
	io.op = TT_OP_WRITE;
	tap_ok(!tt_engine_map_read(e, &io, 1), "map_read (%s): a write: not given", how);
	free(want);
}

/*
 * With TUTTI_TMPFS_NT=0 reads of its own pages are memcpy'd by
 * tt_engine_move_now() (none given), and its writes still land exact.
 */
static void check_map_read_off(const char *path)
{
	uint8_t *buf = aligned_alloc(OBJ, OBJ), *got = aligned_alloc(OBJ, OBJ);
	struct tt_io io = { .buf = buf, .off = OBJ, .len = OBJ, .op = TT_OP_WRITE };
	struct tt_engine *e;
	int fd = open(path, O_RDWR);

	setenv("TUTTI_TMPFS_NT", "0", 1);
	for (unsigned i = 0; i < OBJ; i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	tap_ok(fd >= 0 && !tt_engine_open("uring", &fd, 1, NULL, &e), "map_read (NT=0): open");
	tap_ok(!tt_engine_move_now(e, &io, 1), "map_read (NT=0): written through the map");
	io.op = TT_OP_READ;
	tap_ok(!tt_engine_map_read(e, &io, 1), "map_read (NT=0): its own pages not given");
	io.buf = got;
	tap_ok(!tt_engine_move_now(e, &io, 1) && !memcmp(got, buf, OBJ), "map_read (NT=0): read exact");
	tt_engine_close(e);
	close(fd);
	unsetenv("TUTTI_TMPFS_NT");
	free(buf);
	free(got);
}

/*
 * A tmpfs member is mapped: tt_engine_move_now() writes and reads it by
 * memcpy on any thread, coherent with the file's other users, a hole filled
 * on write; read-only opens are never written; past the end still -EIO.
 */
static void check_move_now_ram(const char *path, const char *how)
{
	enum { N = 16 };
	uint8_t *buf = aligned_alloc(OBJ, 2 * OBJ), *got = aligned_alloc(OBJ, 2 * OBJ);
	struct tt_io run[2] = {
		{ .buf = buf, .off = 2 * OBJ, .len = OBJ, .op = TT_OP_WRITE },
		{ .buf = buf + OBJ, .off = 3 * OBJ, .len = OBJ, .op = TT_OP_WRITE },
	};
	struct tt_engine_stats st;
	struct tt_engine *e;
	int fd = open(path, O_RDWR), ro;

	setenv("TUTTI_TMPFS_MAP", how, 1);
	tap_ok(fd >= 0 && !ftruncate(fd, 0) && !ftruncate(fd, (off_t)N * OBJ),
	       "ram (%s): a sparse tmpfs member", how);
	for (unsigned i = 0; i < 2 * OBJ; i++)
		buf[i] = (uint8_t)(i * 13 + 5);
	tap_eq(tt_engine_open("uring", &fd, 1, NULL, &e), 0, "ram: open");
	tap_ok(tt_engine_cpu_writes(e, 0) && tt_engine_cpu_reads(e, 0),
	       "ram: its writes and reads are the CPU's, on any thread");
	tap_eq(tt_engine_move_now(e, run, 2), 0, "ram: a run of two written into a hole");
	tap_ok(pread(fd, got, 2 * OBJ, 2 * OBJ) == 2 * OBJ && !memcmp(got, buf, 2 * OBJ),
	       "ram: the file reads what was written through the map");
	if (!*how) {
		/* The default: the pages the map's writes made present, and only those, read through it. */
		uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), bad = 0;

		for (uint64_t p = 0; e->map_mine[0] && p < N * OBJ / pg; p++) {
			int mine = !!(e->map_mine[0][p / 64] & (1ULL << (p % 64)));

			bad += mine != (p >= 2 * OBJ / pg && p < 4 * OBJ / pg);
		}
		tap_ok(e->map_mine[0] && !bad, "ram (default): its written pages, and only those, are its own");
		run[0] = (struct tt_io){ .buf = got, .off = 2 * OBJ, .len = 2 * OBJ, .op = TT_OP_READ };
		memset(got, 0, 2 * OBJ);
		tap_ok(!tt_engine_move_now(e, run, 1) && !memcmp(got, buf, 2 * OBJ),
		       "ram (default): its own pages read through the map, exact");
		run[0] = (struct tt_io){ .buf = buf, .off = 2 * OBJ, .len = OBJ, .op = TT_OP_WRITE };
		run[1] = (struct tt_io){ .buf = buf + OBJ, .off = 3 * OBJ, .len = OBJ, .op = TT_OP_WRITE };
	} else {
		tap_ok(!e->map_mine[0], "ram (%s): no pages of its own kept", how);
	}
	memset(got, 0x5a, OBJ);
	tap_eq(pwrite(fd, got, OBJ, 7 * OBJ), OBJ, "ram: written through the file");
	run[0] = (struct tt_io){ .buf = buf, .off = 7 * OBJ, .len = OBJ, .op = TT_OP_READ };
	tap_eq(tt_engine_move_now(e, run, 1), 0, "ram: read through the map");
	tap_ok(!memcmp(buf, got, OBJ), "ram: and what the file wrote is what the map reads");
	run[0].off = (uint64_t)N * OBJ;
	tap_eq(tt_engine_move_now(e, run, 1), (unsigned long long)-EIO, "ram: past the end is -EIO");
	tt_engine_get_stats(e, &st);
	tap_ok(st.bytes_written == 2 * OBJ && st.bytes_read == OBJ * (*how ? 1 : 3) &&
	       st.ios == (*how ? 3u : 4u),
	       "ram: counted (%llu written, %llu read, %llu ios)", (unsigned long long)st.bytes_written,
	       (unsigned long long)st.bytes_read, (unsigned long long)st.ios);
	check_map_read(e, fd, how);
	tt_engine_close(e);
	ro = open(path, O_RDONLY);
	tap_eq(tt_engine_open("uring", &ro, 1, NULL, &e), 0, "ram: read-only open");
	tap_ok(!tt_engine_cpu_writes(e, 0) && tt_engine_cpu_reads(e, 0), "ram: read-only: never written");
	run[0].off = 2 * OBJ;
	tap_eq(tt_engine_move_now(e, run, 1), 0, "ram: read-only: read");
	run[0].op = TT_OP_WRITE;
	tap_eq(tt_engine_move_now(e, run, 1), (unsigned long long)-EINVAL, "ram: read-only: write refused");
	tt_engine_close(e);
	tap_eq(tt_engine_open("fault:uring", &fd, 1, NULL, &e), 0, "ram: fault engine open");
	tap_ok(!tt_engine_cpu_writes(e, 0), "ram: never behind the fault engine (its faults apply)");
	tt_engine_close(e);
	close(ro);
	close(fd);
	unsetenv("TUTTI_TMPFS_MAP");
	free(buf);
	free(got);
}

int main(void)
{
	char path[] = "/tmp/tutti-engine-XXXXXX";
	char shm[] = "/dev/shm/tutti-engine-XXXXXX";
	int fd = mkstemp(path), dfd, sfd;
	struct tt_engine *e;

	if (fd < 0)
		return 1;
	dfd = open(path, O_RDWR | O_DIRECT);
	if (dfd < 0)
		dfd = fd;	/* filesystem without O_DIRECT */
	run("uring", dfd);
	run("psync", dfd);
	run("uring", fd);	/* buffered: reads on io_uring's workers */
	check_without_threads(path);
	check_move_now(fd, dfd);
	sfd = mkstemp(shm);	/* tmpfs: reads on io_uring's workers */
	if (sfd >= 0) {
		run("uring", sfd);
		check_move_now_ram(shm, "");	/* the default: reads of its own pages mapped */
		check_move_now_ram(shm, "w");	/* reads by preadv */
		check_move_now_ram(shm, "rw");
		check_map_read_off(shm);
		setenv("TUTTI_TMPFS_MAP", "0", 1);
		tap_eq(tt_engine_open("uring", &sfd, 1, NULL, &e), 0, "ram (0): open");
		tap_ok(!tt_engine_cpu_writes(e, 0), "ram (0): not mapped: writes through the engine");
		tt_engine_close(e);
		unsetenv("TUTTI_TMPFS_MAP");
		close(sfd);
		unlink(shm);
	} else {
		tap_skip("no /dev/shm");
	}
	tap_eq(tt_engine_open("nosuch", &dfd, 1, NULL, &e), (unsigned long long)-EINVAL,
	       "unknown engine: %s", tt_errmsg());
	tap_eq(tt_engine_open("auto", &dfd, 0, NULL, &e), (unsigned long long)-EINVAL,
	       "zero members rejected");
	unlink(path);
	return tap_done();
}
