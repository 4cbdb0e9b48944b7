/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The store under random I/O fault schedules, checked against a ground-truth
 * model (fault_model.c).  Engine-agnostic: the caller names the engine under
 * test and the member paths, so the same driver runs on files here (psync,
 * uring) and on tutti.ko namespace nodes in the HIL guests (kqueue).
 */
#ifndef TUTTI_TESTS_FAULT_MODEL_H
#define TUTTI_TESTS_FAULT_MODEL_H

#include <stddef.h>
#include <stdint.h>

struct fm_config {
	const char *engine;		/* engine under test: "psync", "uring", "kqueue", ... */
	const char *const *paths;	/* members; formatted (and, for files, recreated) per schedule */
	unsigned n_paths;
	unsigned steps;			/* operations per schedule (0: 16) */
	uint64_t n_slots;		/* slots of the store (0: 24; at most 153) */
};

struct fm_stats {
	uint64_t schedules;
	uint64_t steps;
	uint64_t faults;		/* injected faults that failed an io, a submit or a flush */
	uint64_t failed_blocks;		/* blocks reported failed by the store */
	uint64_t blocks_compared;	/* blocks read back and compared byte for byte */
	uint64_t unverified_reads;	/* ... of them read with verification off */
	uint64_t reopens;
	uint64_t disk_checks;		/* crash views opened and checked */
};

/**
 * fm_run() - one random schedule
 * @c: engine and members
 * @seed: the schedule (operations, keys, faults): the same seed, the same run
 * @st: counters, added to
 * @why: out, the first invariant broken (with the step), if any
 * @why_len: size of @why
 *
 * Invariants: no read with status 0 returns bytes other than the stored
 * ones, verification on or off; no block is ever reported corrupt or dropped
 * (no corruption is injected, so that would be an I/O error taken for it);
 * a key vanishes only by eviction or invalidation; every block an injected
 * fault touched is reported failed, and (reads) only those; after every step
 * the store as on disk opens, checks clean and serves exactly the stored
 * bytes of every key it holds, including every key committed durably.
 *
 * Return: 0 if every invariant held, 1 if one broke, -1 if the schedule
 * could not run (format/open failed; reason in @why).
 */
int fm_run(const struct fm_config *c, uint64_t seed, struct fm_stats *st, char *why,
	   size_t why_len);

#endif
