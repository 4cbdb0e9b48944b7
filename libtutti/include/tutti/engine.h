/* SPDX-License-Identifier: Apache-2.0 */
/*
 * I/O engines move batches of objects between store members and memory.
 *
 * The store describes a batch as an array of tt_io (one per object); an
 * engine may merge ios that are adjacent on the same member into one
 * request (scatter/gather on the memory side), submits the whole batch with
 * as few system calls as it can and writes each io's result back.  Engines
 * (tests/test_header_docs.py checks this list against the library's):
 *
 *   kqueue  tutti.ko namespace nodes: NVMe queue pairs this process drives
 *           (kqueue.h); "auto" picks it for such members
 *   uring   files/block devices via io_uring, O_DIRECT (the default)
 *   psync   preadv/pwritev, for kernels where io_uring is unavailable
 *   fault:X engine X with injected faults, for tests (fault.h)
 *
 * The GPU data paths (devpath.h) move device memory; engines move host
 * memory.
 */
#ifndef TUTTI_ENGINE_H
#define TUTTI_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

#define TT_MAX_ENGINE_MEMBERS 16u

enum tt_op {
	TT_OP_READ = 0,
	TT_OP_WRITE = 1,
};

/* One object transfer.  The engine fills @res: 0 or a negative errno. */
struct tt_io {
	void *buf;
	uint64_t off;
	uint32_t len;
	uint16_t member;
	uint8_t op;		/* enum tt_op */
	uint8_t flags;
	int32_t res;
	uint32_t tag;		/* caller's */
};

/* A set of ios submitted together and waited for together. */
struct tt_batch {
	struct tt_io *ios;
	uint32_t n;
	uint32_t next;		/* ios handed to the engine so far */
	uint32_t inflight;	/* requests submitted, not completed */
	int32_t err;		/* first failure, 0 if none */
	uint32_t reqs;		/* requests after coalescing */
	uint32_t req_cap;	/* engine: largest request for this batch */
};

struct tt_engine_params {
	uint32_t queue_depth;	/* ring entries; 0 = default (256) */
	uint32_t max_req_bytes;	/* largest merged request; 0 = 4 MiB */
	uint32_t min_reqs;	/* split a batch into at least this many; 0 = 64 */
	/*
	 * Reads the CPU copies (members in the page cache or tmpfs) run on
	 * up to this many kernel threads instead of the submitting one
	 * (io_uring); 0: the CPUs the process may run on, at most 8; 1: inline.
	 */
	uint32_t copy_threads;
};

struct tt_engine_stats {
	uint64_t ios;		/* objects moved */
	uint64_t reqs;		/* requests after coalescing */
	uint64_t bytes_read;
	uint64_t bytes_written;
	uint64_t syscalls;	/* submissions + waits that entered the kernel */
	uint64_t flushes;
};

struct tt_engine;

/**
 * tt_engine_open() - create an engine over opened member files
 * @name: "kqueue", "uring", "psync", "auto" (kqueue for tutti.ko nodes; else
 *        uring, falling back to psync), or "fault:NAME" (NAME wrapped by the
 *        fault engine, fault.h; so is every engine while TUTTI_FAULTS is set)
 * @fds: file descriptors, one per member, opened with O_DIRECT
 * @n: number of members
 * @params: tuning, or NULL for defaults
 * @out: the engine
 *
 * The engine does not own @fds.
 * Return: 0 or a negative errno (reason in tt_errmsg()).
 */
int tt_engine_open(const char *name, const int *fds, unsigned n,
		   const struct tt_engine_params *params, struct tt_engine **out);

/** tt_engine_close() - wait for nothing, free everything. */
void tt_engine_close(struct tt_engine *e);

/** tt_engine_name() - the engine actually in use ("kqueue"/"uring"/"psync"). */
const char *tt_engine_name(const struct tt_engine *e);

/**
 * tt_engine_register() - pin a memory area for fixed-buffer I/O
 * @e: engine
 * @addr: start of the area
 * @len: its length
 *
 * Optional: requests whose memory lies wholly inside a registered area
 * skip the per-I/O page pinning.  The area stays pinned until the engine
 * is closed and must stay mapped that long (the kernel would keep using
 * the old pages).  Return: 0 or a negative errno.
 */
int tt_engine_register(struct tt_engine *e, void *addr, size_t len);

/**
 * tt_engine_submit() - start a batch
 * @e: engine
 * @b: batch with @ios and @n set; the arrays must live until it completes
 *
 * Return: 0, or a negative errno: the batch failed, but ios of it may have
 * started (an engine may push part of a batch before the rest is refused).
 * Either way call tt_engine_wait() before reusing @b or the memory of its
 * ios; only its completed ios' results (tt_io.res) say what moved.
 */
int tt_engine_submit(struct tt_engine *e, struct tt_batch *b);

/**
 * tt_engine_wait() - wait until every io of @b has completed
 * @e: engine
 * @b: a submitted batch
 *
 * Return: 0 if all ios succeeded, else the first failure (per-io results
 * are in each tt_io.res).
 */
int tt_engine_wait(struct tt_engine *e, struct tt_batch *b);

/** tt_engine_done() - has @b completed?  Reaps what is ready, never blocks. */
int tt_engine_done(struct tt_engine *e, struct tt_batch *b);

/** tt_engine_flush() - make completed writes on every member durable. */
int tt_engine_flush(struct tt_engine *e);

/** tt_engine_get_stats() - counters since open. */
void tt_engine_get_stats(const struct tt_engine *e, struct tt_engine_stats *st);

/**
 * tt_engine_cpu_reads() - are reads of member @m memory copies the CPU makes
 * (tmpfs, the page cache) that tt_engine_move_now() may move?  0 for members
 * a device moves, and for engines that move bytes otherwise (the fault
 * engine, tutti.ko queues).
 */
int tt_engine_cpu_reads(const struct tt_engine *e, unsigned m);

/**
 * tt_engine_cpu_writes() - may tt_engine_move_now() write member @m, several
 * threads at once?  Only a RAM-backed member (tmpfs, ramfs) the engine has
 * mapped writable: a file's write() takes its inode lock, so writes through
 * the kernel would run one at a time however many threads make them.
 */
int tt_engine_cpu_writes(const struct tt_engine *e, unsigned m);

/**
 * tt_engine_move_now() - move @n ios on the calling thread, outside any batch
 * @e: engine
 * @ios: all reads of a member tt_engine_cpu_reads() allows, or all writes of
 *       one tt_engine_cpu_writes() allows, each starting where the one
 *       before ends; every res is set
 * @n: 1 to 256
 *
 * Any thread, several at once (the caller's threads hash what they have just
 * copied, or are about to copy, while it is in their cache).  A mapped member
 * is copied with memcpy after its pages are made present (a hole tmpfs cannot
 * fill is an error, not a SIGBUS: that run goes through pread/pwrite, which
 * say why); others with one preadv.  A failed run is moved again io by io,
 * so each io gets its own verdict.  Return: 0 or the first -errno.
 */
int tt_engine_move_now(struct tt_engine *e, struct tt_io *ios, unsigned n);

/**
 * tt_engine_map_read() - a run of reads the caller copies from the mapping
 * @e: engine
 * @ios: as tt_engine_move_now()'s reads
 * @n: 1 to 256
 *
 * Where tt_engine_move_now() would memcpy the run out of the member's
 * mapping, makes its pages present, counts it as read, sets every res to 0
 * and returns where the run's first byte is: the caller copies (the store's
 * threads hash each object there and stream it to its destination, one pass
 * over memory less than a copy the hash then reads back).  NULL where the
 * run must go through tt_engine_move_now() (not mapped, a page that could
 * not be made present, TUTTI_TMPFS_NT=0).  The bytes stay valid while the
 * engine is open.
 */
const char *tt_engine_map_read(struct tt_engine *e, struct tt_io *ios, unsigned n);

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
