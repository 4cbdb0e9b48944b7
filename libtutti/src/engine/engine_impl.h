/* SPDX-License-Identifier: Apache-2.0 */
/* What every engine implementation shares (not installed). */
#ifndef TT_ENGINE_IMPL_H
#define TT_ENGINE_IMPL_H

#include <sys/uio.h>

#include "tutti/engine.h"

#define TT_ENGINE_DEFAULT_DEPTH		256u
#define TT_ENGINE_DEFAULT_REQ_BYTES	(4u << 20)
#define TT_ENGINE_MAX_IOV		256u
#define TT_ENGINE_DEFAULT_MIN_REQS	64u
#define TT_ENGINE_MIN_REQ_BYTES		(128u << 10)

struct tt_engine;

/* tt_engine_ops.probe results */
#define TT_ENGINE_GENERIC	1	/* can serve any file or block device */
#define TT_ENGINE_NATIVE	2	/* the members are made for this engine */

/*
 * An engine. It knows no other engine: "auto" picks one by asking each
 * engine of the table (engines.c) and those added by tt_engine_add().
 */
struct tt_engine_ops {
	const char *name;
	/*
	 * Whether "auto" may pick this engine for the members @fds: a
	 * TT_ENGINE_* value, or 0 (not these). NULL: chosen by name only.
	 */
	int (*probe)(const int *fds, unsigned n);
	int (*init)(struct tt_engine *e);
	void (*fini)(struct tt_engine *e);
	/* Hand every io of @b to the device; may reap to make room. */
	int (*submit)(struct tt_engine *e, struct tt_batch *b);
	/* Process completions; with @wait, block until at least one. */
	int (*reap)(struct tt_engine *e, int wait);
	int (*reg)(struct tt_engine *e, void *addr, size_t len);
	/* Make completed writes durable; NULL: fdatasync every member. */
	int (*flush)(struct tt_engine *e);
	/*
	 * The engine reads members with plain pread/preadv (no queue of its
	 * own between the file and memory): tt_engine_move_now() may move
	 * those the CPU copies on other threads.
	 */
	int preads;
};

struct tt_engine {
	const struct tt_engine_ops *ops;
	int fds[TT_MAX_ENGINE_MEMBERS];
	unsigned n_members;
	struct tt_engine_params p;
	struct tt_engine_stats st;
	uint8_t cpu_copy[TT_MAX_ENGINE_MEMBERS];	/* tt_engine_cpu_reads() */
	/* RAM-backed members (tmpfs) mapped: tt_engine_move_now() copies them itself. */
	char *map[TT_MAX_ENGINE_MEMBERS];
	uint64_t map_len[TT_MAX_ENGINE_MEMBERS];
	uint8_t map_wr[TT_MAX_ENGINE_MEMBERS];		/* tt_engine_cpu_writes() */
	uint8_t map_rd[TT_MAX_ENGINE_MEMBERS];		/* every read too (TUTTI_TMPFS_MAP=rw) */
	/*
	 * Pages of a mapping this process's own writes made present, a bit a
	 * page: reads of those go through the mapping too (engine_map.c).
	 */
	uint64_t *map_mine[TT_MAX_ENGINE_MEMBERS];
	/* Copies through a mapping stream their stores (TUTTI_TMPFS_NT=0: memcpy). */
	uint8_t map_stream;
	/* Every mapped run populated first, swap or not (TUTTI_TMPFS_POPULATE=1). */
	uint8_t map_populate;
	void *priv;
};

/* Reads of @fd are memory copies by the CPU: no O_DIRECT, or a RAM filesystem. */
int tt_fd_cpu_copies(int fd);
/* @fd is on tmpfs or ramfs (engine_map.c). */
int tt_fd_on_ram(int fd);
/*
 * A run of a mapped member: where it lies in the mapping, its pages present
 * (NULL: the syscalls move it); moved through the mapping (0, or 1: use the
 * syscalls).  @calls counts the system calls made (engine_map.c).
 */
char *tt_engine_map_run(struct tt_engine *e, const struct tt_io *ios, int wr, uint64_t bytes,
			uint64_t *calls);
int tt_engine_map_move(struct tt_engine *e, struct tt_io *ios, unsigned n, int wr, uint64_t bytes,
		       uint64_t *calls);
/* Map the RAM-backed members the CPU copies (engine_map.c, after init); undo. */
void tt_engine_map_members(struct tt_engine *e);
void tt_engine_unmap_members(struct tt_engine *e);

/* A request: a run of ios adjacent on one member, moved by one syscall/SQE. */
struct tt_req {
	struct tt_batch *b;
	uint32_t first;
	uint32_t count;
	uint64_t off;
	uint64_t bytes;
	uint16_t member;
	uint8_t op;
};

/**
 * tt_next_req() - form the request starting at io @i of @b
 * @e: engine (limits)
 * @b: batch
 * @i: first io
 * @r: out
 *
 * Merges following ios while they continue the same member, direction and
 * byte range.  Return: number of ios in the request (>= 1).
 */
unsigned tt_next_req(const struct tt_engine *e, struct tt_batch *b, unsigned i,
		     struct tt_req *r);

/* Fill @iov for @r; returns the number of entries (adjacent memory merged). */
unsigned tt_req_iov(const struct tt_req *r, struct iovec *iov);

/*
 * Record a request's outcome in its ios and batch.  A request of several ios
 * that failed with an error of part of a range (-EIO, -ENODATA, ...) is
 * moved again io by io first (tt_req_sync()), so each io gets its own result.
 */
void tt_req_complete(struct tt_engine *e, const struct tt_req *r, int res);

/* Move @r synchronously with preadv/pwritev from byte @done on; 0 or -errno. */
int tt_req_sync(struct tt_engine *e, const struct tt_req *r, uint64_t done);

/* tt_engine_open() without the fault wrapper (which uses it for its inner engine). */
int tt_engine_open_plain(const char *name, const int *fds, unsigned n,
			 const struct tt_engine_params *params, struct tt_engine **out);

/* fault.c: is a fault engine asked for (by @name or TUTTI_FAULTS)?  Open one. */
int tt_fault_wanted(const char *name);
int tt_fault_engine_open(const char *name, const int *fds, unsigned n,
			 const struct tt_engine_params *params, struct tt_engine **out);

/* engines.c: the built-in engines, in the order "auto" tries them; NULL-terminated. */
extern const struct tt_engine_ops *const tt_engines[];

#define TT_ENGINE_MAX_ADDED	8u

/**
 * tt_engine_add() - make one more engine known by name (and to "auto", if it
 * has a probe), after the built-in ones: a wrapper engine, a test's engine
 * @ops: its operations; must outlive every engine opened with it
 *
 * Not thread-safe: call it before opening stores. Return: 0, -EINVAL
 * (incomplete @ops), -EEXIST (name taken) or -ENOSPC.
 */
int tt_engine_add(const struct tt_engine_ops *ops);

/** tt_engine_find() - the known engine called @name, or NULL. */
const struct tt_engine_ops *tt_engine_find(const char *name);

#endif
