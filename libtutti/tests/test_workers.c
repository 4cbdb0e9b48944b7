// SPDX-License-Identifier: Apache-2.0
/*
 * Description: the store's thread pool runs every item of a loop exactly
 * once, on several threads, loop after loop; without a pool, for small
 * loops, and in a forked child (whose threads stayed with the parent) it
 * runs them on the caller's thread instead of waiting for threads that are
 * not there.  Its threads run on the CPUs they are given, whatever the
 * caller is bound to (a vLLM CPU worker's thread: one core).
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/support/workers.h"
#include "tap.h"

#define MAX_ITEMS 4096u

struct loop {
	unsigned hits[MAX_ITEMS];
	pthread_t who[MAX_ITEMS];
};

static void count(void *arg, unsigned i)
{
	struct loop *l = arg;

	__atomic_fetch_add(&l->hits[i], 1, __ATOMIC_RELAXED);
	l->who[i] = pthread_self();
	if (i % 64 == 0)
		usleep(50);	/* long enough for the other threads to take items */
}

/* Per item: how many CPUs the thread that ran it may use. */
static int item_cpus[MAX_ITEMS];

static void note_cpus(void *arg, unsigned i)
{
	cpu_set_t s;

	(void)arg;
	item_cpus[i] = sched_getaffinity(0, sizeof(s), &s) ? -1 : CPU_COUNT(&s);
	if (i % 64 == 0)
		usleep(50);
}

/* Items run by threads allowed @cpus CPUs. */
static unsigned items_on(int cpus)
{
	unsigned n = 0;

	for (unsigned i = 0; i < MAX_ITEMS; i++)
		n += item_cpus[i] == cpus;
	return n;
}

static int exactly_once(const struct loop *l, unsigned n)
{
	for (unsigned i = 0; i < MAX_ITEMS; i++)
		if (l->hits[i] != (i < n))
			return 0;
	return 1;
}

static unsigned threads_seen(const struct loop *l, unsigned n)
{
	pthread_t seen[32];
	unsigned k = 0;

	for (unsigned i = 0; i < n; i++) {
		unsigned j = 0;

		while (j < k && !pthread_equal(seen[j], l->who[i]))
			j++;
		if (j == k && k < 32)
			seen[k++] = l->who[i];
	}
	return k;
}

int main(void)
{
	static struct loop l;
	struct tt_workers *w;
	int ok = 1, st = -1;
	pid_t pid;

	tap_ok(tt_workers_start(1, NULL) == NULL, "one thread in all: no pool");
	memset(&l, 0, sizeof(l));
	tt_workers_for(NULL, 100, count, &l);
	tap_ok(exactly_once(&l, 100) && threads_seen(&l, 100) == 1,
	       "no pool: every item once, on the caller's thread");

	w = tt_workers_start(4, NULL);
	tap_ok(w != NULL, "a pool of 4 threads starts");
	memset(&l, 0, sizeof(l));
	tt_workers_for(w, 3, count, &l);
	tap_ok(exactly_once(&l, 3) && threads_seen(&l, 3) == 1 && pthread_equal(l.who[0], pthread_self()),
	       "a loop of 3 items runs on the caller alone");
	memset(&l, 0, sizeof(l));
	tt_workers_for(w, MAX_ITEMS, count, &l);
	tap_ok(exactly_once(&l, MAX_ITEMS), "%u items, each exactly once", MAX_ITEMS);
	tap_ok(threads_seen(&l, MAX_ITEMS) > 1, "on more than one thread (%u)", threads_seen(&l, MAX_ITEMS));
	for (unsigned r = 0; r < 2000 && ok; r++) {
		unsigned n = 5 + (r * 2654435761u) % (MAX_ITEMS - 5);

		memset(l.hits, 0, sizeof(l.hits));
		tt_workers_for(w, n, count, &l);
		ok = exactly_once(&l, n);
	}
	tap_ok(ok, "2000 loops of varied sizes back to back: every item exactly once each time");

	pid = fork();
	if (pid == 0) {
		alarm(20);	/* a hang is a failure, not a stuck test */
		memset(&l, 0, sizeof(l));
		tt_workers_for(w, MAX_ITEMS, count, &l);
		if (!exactly_once(&l, MAX_ITEMS) || threads_seen(&l, MAX_ITEMS) != 1)
			_exit(1);
		tt_workers_stop(w);
		_exit(0);
	}
	waitpid(pid, &st, 0);
	tap_ok(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	       "in a forked child the loop runs on the caller's thread, then the pool is freed (status %d)", st);
	memset(&l, 0, sizeof(l));
	tt_workers_for(w, MAX_ITEMS, count, &l);
	tap_ok(exactly_once(&l, MAX_ITEMS) && threads_seen(&l, MAX_ITEMS) > 1,
	       "the parent's pool still works after the fork");
	tt_workers_stop(w);
	{
		cpu_set_t set, one;
		unsigned want;

		sched_getaffinity(0, sizeof(set), &set);
		want = CPU_COUNT(&set) < 8 ? (unsigned)CPU_COUNT(&set) : 8;
		tap_eq(tt_workers_auto(), want, "auto: the CPUs this process may use, at most 8 (%u)", want);
		CPU_ZERO(&one);
		for (int c = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, &set)) {
				CPU_SET(c, &one);
				break;
			}
		sched_setaffinity(0, sizeof(one), &one);
		tap_eq(tt_workers_auto(), 1, "auto: pinned to one CPU, one thread");
		/* A caller bound to one CPU starts threads on the set given, or, without one, on its CPU. */
		w = tt_workers_start(3, &set);
		tt_workers_for(w, MAX_ITEMS, note_cpus, NULL);
		tt_workers_stop(w);
		if (CPU_COUNT(&set) > 1)
			tap_ok(items_on(CPU_COUNT(&set)) > 0 && items_on(CPU_COUNT(&set)) + items_on(1) == MAX_ITEMS,
			       "a pool given the process's %d CPUs runs there though its caller is bound to one "
			       "(%u items there)", CPU_COUNT(&set), items_on(CPU_COUNT(&set)));
		else
			tap_skip("needs 2 CPUs or more: a pool's CPUs vs its caller's");
		w = tt_workers_start(3, NULL);
		tt_workers_for(w, MAX_ITEMS, note_cpus, NULL);
		tt_workers_stop(w);
		tap_eq(items_on(1), MAX_ITEMS, "without a set, its threads inherit the caller's one CPU");
		sched_setaffinity(0, sizeof(set), &set);
	}
	return tap_done();
}
