/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A few threads that share the caller's loops over independent items (the
 * checksums of a layer's objects).  Not installed.
 */
#ifndef TT_SUPPORT_WORKERS_H
#define TT_SUPPORT_WORKERS_H

#include <sched.h>

#define TT_WORKERS_MAX	16u

struct tt_workers;

/*
 * tt_workers_start() - @n threads in all, the caller counted: n - 1 are
 * started, on the CPUs of @cpus when given (else they inherit the caller's:
 * a store starts them lazily, from whichever thread runs its first large
 * layer, which may be bound to one core).  Return: NULL when @n < 2 or no
 * thread could be started (then tt_workers_for() runs every loop on the
 * caller's thread).
 */
struct tt_workers *tt_workers_start(unsigned n, const cpu_set_t *cpus);

void tt_workers_stop(struct tt_workers *w);

/*
 * tt_workers_for() - call fn(arg, i) for every i < @n, spread over the
 * threads, the caller's among them; returns when every call has.  One loop
 * at a time: a caller finding the threads busy runs its loop alone.
 */
void tt_workers_for(struct tt_workers *w, unsigned n,
		    void (*fn)(void *arg, unsigned i), void *arg);

/* Threads a store uses when asked for 0 ("auto"): the CPUs it may run on, at most 8. */
unsigned tt_workers_auto(void);

#endif
