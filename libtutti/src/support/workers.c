// SPDX-License-Identifier: Apache-2.0
/*
 * Parallel loops for CPU work on data the CPU has just copied (page-cache
 * reads, tmpfs): one thread hashing a layer limits the rate at which such
 * a store can be read, whatever the copies do.
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "util.h"
#include "workers.h"

#define TT_WORKERS_GRAIN	4u	/* items claimed at once */

struct tt_workers {
	pthread_mutex_t busy;		/* one loop at a time */
	pthread_mutex_t mu;
	pthread_cond_t go, idle;
	pid_t pid;			/* the process whose threads these are */
	unsigned n_threads;		/* started, the caller not counted */
	pthread_t th[TT_WORKERS_MAX];
	uint64_t gen;			/* loops started so far */
	unsigned running;		/* threads still in the current loop */
	int stop;
	/* The current loop. */
	void (*fn)(void *arg, unsigned i);
	void *arg;
	unsigned n;
	unsigned next;			/* atomic: first item not claimed */
};

static void run_items(struct tt_workers *w)
{
	for (;;) {
		unsigned i = __atomic_fetch_add(&w->next, TT_WORKERS_GRAIN, __ATOMIC_RELAXED);

		if (i >= w->n)
			return;
		for (unsigned k = i; k < TT_MIN(i + TT_WORKERS_GRAIN, w->n); k++)
			w->fn(w->arg, k);
	}
}

static void *worker(void *p)
{
	struct tt_workers *w = p;
	uint64_t seen = 0;

	pthread_mutex_lock(&w->mu);
	for (;;) {
		while (!w->stop && w->gen == seen)
			pthread_cond_wait(&w->go, &w->mu);
		if (w->stop)
			break;
		seen = w->gen;
		pthread_mutex_unlock(&w->mu);
		run_items(w);
		pthread_mutex_lock(&w->mu);
		if (--w->running == 0)
			pthread_cond_signal(&w->idle);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

struct tt_workers *tt_workers_start(unsigned n, const cpu_set_t *cpus)
{
	sigset_t all, old;
	pthread_attr_t attr;
	struct tt_workers *w;

	if (n < 2)
		return NULL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->pid = getpid();
	pthread_mutex_init(&w->busy, NULL);
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->go, NULL);
	pthread_cond_init(&w->idle, NULL);
	/* Signals stay with the application's threads (Python's main one). */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	if (cpus && CPU_COUNT(cpus))	/* a mask the kernel refuses: inherited instead */
		pthread_attr_setaffinity_np(&attr, sizeof(*cpus), cpus);
	for (unsigned k = 0; k < TT_MIN(n, TT_WORKERS_MAX) - 1; k++) {
		if (pthread_create(&w->th[k], &attr, worker, w) &&
		    (!cpus || pthread_create(&w->th[k], NULL, worker, w)))
			break;	/* fewer threads; still correct */
		w->n_threads++;
	}
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!w->n_threads) {
		tt_workers_stop(w);
		return NULL;
	}
	return w;
}

void tt_workers_stop(struct tt_workers *w)
{
	if (!w)
		return;
	if (w->pid != getpid()) {
		free(w);	/* a forked child: the threads stayed with the parent */
		return;
	}
	pthread_mutex_lock(&w->mu);
	w->stop = 1;
	pthread_cond_broadcast(&w->go);
	pthread_mutex_unlock(&w->mu);
	for (unsigned k = 0; k < w->n_threads; k++)
		pthread_join(w->th[k], NULL);
	pthread_cond_destroy(&w->idle);
	pthread_cond_destroy(&w->go);
	pthread_mutex_destroy(&w->mu);
	pthread_mutex_destroy(&w->busy);
	free(w);
}

void tt_workers_for(struct tt_workers *w, unsigned n,
		    void (*fn)(void *arg, unsigned i), void *arg)
{
	/* In a forked child the threads are the parent's: alone, not hung. */
	if (!w || n <= TT_WORKERS_GRAIN || w->pid != getpid() ||
	    pthread_mutex_trylock(&w->busy)) {
		for (unsigned i = 0; i < n; i++)
			fn(arg, i);
		return;
	}
	pthread_mutex_lock(&w->mu);
	w->fn = fn;
	w->arg = arg;
	w->n = n;
	w->next = 0;
	w->running = w->n_threads;
	w->gen++;
	pthread_cond_broadcast(&w->go);
	pthread_mutex_unlock(&w->mu);
	run_items(w);
	/* Every thread leaves the loop before the next may start. */
	pthread_mutex_lock(&w->mu);
	while (w->running)
		pthread_cond_wait(&w->idle, &w->mu);
	pthread_mutex_unlock(&w->mu);
	pthread_mutex_unlock(&w->busy);
}

unsigned tt_workers_auto(void)
{
	cpu_set_t set;
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	/* The CPUs this process may run on (a container's cpuset), if known. */
	if (!sched_getaffinity(0, sizeof(set), &set))
		n = CPU_COUNT(&set);
	return n < 1 ? 1 : (unsigned)TT_MIN(n, 8);
}
