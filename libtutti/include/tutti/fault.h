/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fault injection: an engine that wraps a real one and makes chosen I/O fail.
 *
 * Error paths are code paths: this engine lets tests make every I/O failure
 * the store must survive happen on demand, under any store and any engine.
 * It is compiled in but inert: it is used only when asked for, by
 *
 *   - the engine name "fault:INNER" (INNER: uring, psync, kqueue, auto), or
 *   - the environment variable TUTTI_FAULTS (a rule list, see below): every
 *     engine opened while it is set is wrapped and starts with those rules.
 *
 * Rules fire on counted events: each rule counts the events it matches from
 * the moment it is armed (the first is number 0) and fires on events
 * [nth, nth + count).  Events are ios (one object transfer) for IO, SHORT,
 * DELAY and FULL, batches (one tt_engine_submit()) for SUBMIT, and calls of
 * tt_engine_flush() for FLUSH.  The first rule that fires on an io decides
 * its fate.  What each kind does:
 *
 *   SUBMIT  tt_engine_submit() fails with @err after handing only the first
 *           @arg ios of the batch to the device (the rest never move); the
 *           batch still completes through tt_engine_wait(), every io not
 *           moved with @err.
 *   IO      the io completes with @err without moving (a read's memory is
 *           overwritten with garbage, as a failed DMA may leave it).
 *   SHORT   only the first @arg bytes (rounded down to 4 KiB) move, then
 *           the io completes with @err: a torn write (that prefix persists)
 *           or a short read (the rest of the memory is garbage).
 *   DELAY   the io's batch completes @arg reaps late (completions reorder).
 *   FLUSH   tt_engine_flush() fails with @err.
 *   FULL    the filesystem is full: a write that touches a hole of a sparse
 *           member file (lseek SEEK_HOLE) fails with -ENOSPC once @arg more
 *           bytes have been allocated.
 *   RATE    nothing fails, the device is slow: the ios it fires on move at
 *           @arg MB/s (10^6 bytes per second) at most, as through one pipe
 *           that serves batches in submission order; a batch completes no
 *           earlier than that pipe would finish it.  For tests and benchmarks
 *           that need a slow store ("rate:write:mbps=50": a write-throttled
 *           disk); not reported as hits.
 *
 * Text form (TUTTI_FAULTS, tt_fault_parse()): rules separated by ';', each
 * "KIND[:OPTION]..." with KIND submit, io, short, delay, flush or full and
 * options read | write (default: both), nth=N, count=N (default 1; 0 means
 * every event from nth on), err=EIO|ENOSPC|EAGAIN|ETIMEDOUT|ENODEV|N, and
 * the kind's @arg as after=N (submit), keep=N (short), reaps=N (delay) or
 * free=N (full) or mbps=N (rate; count defaults to 0 for full and rate).
 * Example: "io:write:nth=3:err=ENOSPC;submit:read:after=2".
 */
#ifndef TUTTI_FAULT_H
#define TUTTI_FAULT_H

#include <stdint.h>

#include "tutti/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */
struct tt_store;

enum tt_fault_kind {
	TT_FAULT_SUBMIT = 1,
	TT_FAULT_IO = 2,
	TT_FAULT_SHORT = 3,
	TT_FAULT_DELAY = 4,
	TT_FAULT_FLUSH = 5,
	TT_FAULT_FULL = 6,
	TT_FAULT_RATE = 7,
};

#define TT_FAULT_ANY_OP		0xffu	/* tt_fault.op: reads and writes */
#define TT_FAULT_MAX_RULES	32u

struct tt_fault {
	uint32_t kind;		/* enum tt_fault_kind */
	uint32_t op;		/* TT_OP_READ, TT_OP_WRITE or TT_FAULT_ANY_OP */
	int32_t err;		/* negative errno it fails with; 0: -EIO */
	uint32_t arg;		/* after / keep / reaps / free / mbps, by kind */
	uint64_t nth;		/* first matching event it fires on (from 0) */
	uint64_t count;		/* events it fires on; 0: all from nth on */
};

/* One fault that fired (an io it hit, or a flush: member 0, len 0). */
struct tt_fault_hit {
	uint32_t kind;
	uint32_t op;
	int32_t err;		/* 0 for DELAY: nothing failed */
	uint32_t member;
	uint64_t off;
	uint64_t len;		/* the whole io, also for SHORT */
};

/**
 * tt_fault_parse() - rules from their text form (see above)
 * @spec: the text
 * @out: rules
 * @cap: capacity of @out
 *
 * Return: number of rules, or -EINVAL (reason in tt_errmsg()).
 */
int tt_fault_parse(const char *spec, struct tt_fault *out, unsigned cap);

/**
 * tt_engine_fault_arm() - replace a fault engine's rules
 * @e: engine opened as "fault:..." (or under TUTTI_FAULTS)
 * @rules: the new rules, counting from now; NULL / 0: none (inert)
 * @n: number of rules (at most TT_FAULT_MAX_RULES)
 *
 * Return: 0, -EOPNOTSUPP (not a fault engine) or -EINVAL.
 */
int tt_engine_fault_arm(struct tt_engine *e, const struct tt_fault *rules, unsigned n);

/**
 * tt_engine_fault_hits() - take the faults fired since the last call
 * @e: fault engine
 * @hits: out, oldest first
 * @cap: capacity of @hits
 *
 * Return: number of hits copied, -ENOBUFS if some were lost (more than the
 * engine keeps, or than @cap), or -EOPNOTSUPP (not a fault engine).
 */
int tt_engine_fault_hits(struct tt_engine *e, struct tt_fault_hit *hits, unsigned cap);

/** tt_store_engine() - the I/O engine of an open store (owned by it). */
struct tt_engine *tt_store_engine(struct tt_store *s);

/**
 * tt_store_set_faults() - arm the rules of @spec on the store's fault engine
 * @s: store opened with a "fault:..." engine (or under TUTTI_FAULTS)
 * @spec: rules in text form; "" disarms
 *
 * Return: 0, -EOPNOTSUPP (the store's engine injects no faults) or -EINVAL.
 */
int tt_store_set_faults(struct tt_store *s, const char *spec);
/* cffi: end */
#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
