// SPDX-License-Identifier: Apache-2.0
/*
 * Description: the store under random I/O fault schedules against a
 * ground-truth model (fault_model.c): 0 wrong bytes returned (verification
 * on or off), 0 blocks taken for corrupt or dropped because of an I/O error,
 * every block a fault touched reported failed, and after every step a store
 * on disk that opens, checks clean and holds every durable key exactly.
 *
 * Without arguments (make ctest, CI): psync and uring, 12 s each, from a
 * seed picked at random (printed), on files in /dev/shm (else /tmp).  A
 * failure prints the seed that reproduces it.  Long runs and other engines:
 *
 *   test_fault_model [--engine NAME]... [--schedules N] [--seconds S]
 *                    [--seed SEED] [--steps K] [--slots N]
 *                    [--dir DIR | --paths MEMBER[,MEMBER...]]
 *
 * --paths formats those members (devices, tutti.ko nodes) with force.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "fault_model.h"
#include "tap.h"

#define MAX_ENGINES 4
#define MAX_PATHS 4

struct opts {
	const char *engines[MAX_ENGINES];
	unsigned n_engines;
	uint64_t schedules;	/* 0: until the time is up */
	double seconds;		/* 0: no time limit */
	uint64_t seed;
	int seed_given;
	unsigned steps;
	uint64_t slots;
	const char *dir;
	char *paths[MAX_PATHS];
	unsigned n_paths;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(void)
{
	fprintf(stderr, "usage: test_fault_model [--engine NAME]... [--schedules N] [--seconds S] "
		"[--seed SEED] [--steps K] [--slots N] [--dir DIR | --paths M0[,M1...]]\n");
	exit(2);
}

static void parse(int argc, char **argv, struct opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			usage();
		i++;
		if (!strcmp(a, "--engine") && o->n_engines < MAX_ENGINES) {
			o->engines[o->n_engines++] = v;
		} else if (!strcmp(a, "--schedules")) {
			o->schedules = strtoull(v, NULL, 0);
		} else if (!strcmp(a, "--seconds")) {
			o->seconds = atof(v);
		} else if (!strcmp(a, "--seed")) {
			o->seed = strtoull(v, NULL, 0);
			o->seed_given = 1;
		} else if (!strcmp(a, "--steps")) {
			o->steps = (unsigned)strtoul(v, NULL, 0);
		} else if (!strcmp(a, "--slots")) {
			o->slots = strtoull(v, NULL, 0);
		} else if (!strcmp(a, "--dir")) {
			o->dir = v;
		} else if (!strcmp(a, "--paths")) {
			char *list = strdup(v), *save = NULL;

			for (char *p = strtok_r(list, ",", &save); p && o->n_paths < MAX_PATHS;
			     p = strtok_r(NULL, ",", &save))
				o->paths[o->n_paths++] = p;
		} else {
			usage();
		}
	}
}

static void run_engine(const struct opts *o, const char *engine, const char *const *paths,
		       unsigned n_paths)
{
	struct fm_config c = { .engine = engine, .paths = paths, .n_paths = n_paths,
			       .steps = o->steps, .n_slots = o->slots };
	struct fm_stats st = { 0 };
	double t0 = now_s();
	char why[512] = "";
	uint64_t i;
	int ret = 0;

	for (i = 0; !o->schedules || i < o->schedules; i++) {
		if (o->seconds && now_s() - t0 > o->seconds)
			break;
		ret = fm_run(&c, o->seed + i, &st, why, sizeof(why));
		if (ret)
			break;
	}
	/*
	 * An engine this machine lacks (no io_uring) skips; members named
	 * with --paths must take every schedule, and a setup that worked
	 * once must work again.
	 */
	if (ret < 0 && !i && !o->n_paths) {
		tap_skip("[%s] cannot run a schedule here: %s", engine, why);
		return;
	}
	if (ret < 0) {
		tap_ok(0, "[%s] schedule with seed %llu could not run: %s", engine,
		       (unsigned long long)(o->seed + i), why);
		return;
	}
	if (ret) {
		tap_ok(0, "[%s] schedule with seed %llu: %s", engine,
		       (unsigned long long)(o->seed + i), why);
		tap_diag("reproduce: test_fault_model --engine %s --seed %llu --schedules 1", engine,
			 (unsigned long long)(o->seed + i));
		return;
	}
	tap_ok(1, "[%s] %llu schedules (seeds %llu..%llu), %llu steps in %.0f s: %llu faults "
	       "injected, %llu failed blocks reported, %llu blocks compared byte for byte (%llu "
	       "with verification off), %llu reopens, %llu crash views checked: every invariant "
	       "held", engine, (unsigned long long)st.schedules, (unsigned long long)o->seed,
	       (unsigned long long)(o->seed + st.schedules - 1), (unsigned long long)st.steps,
	       now_s() - t0, (unsigned long long)st.faults, (unsigned long long)st.failed_blocks,
	       (unsigned long long)st.blocks_compared, (unsigned long long)st.unverified_reads,
	       (unsigned long long)st.reopens, (unsigned long long)st.disk_checks);
}

int main(int argc, char **argv)
{
	struct opts o = { 0 };
	/* tmpfs if there is one: the model tests the store's logic, not the disk's flushes. */
	char shm[] = "/dev/shm/tutti-fault-model-XXXXXX", tmp[] = "/tmp/tutti-fault-model-XXXXXX";
	char p0[300], p1[300];
	const char *paths[MAX_PATHS] = { p0, p1 };
	unsigned n_paths = 2;
	char *dir = NULL;

	parse(argc, argv, &o);
	if (!o.n_engines) {
		o.engines[o.n_engines++] = "psync";
		o.engines[o.n_engines++] = "uring";
		if (!o.schedules && !o.seconds)
			o.seconds = 12;
	}
	if (!o.seed_given)
		o.seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
	if (!o.schedules && !o.seconds)
		o.schedules = 100;
	tap_diag("seed %llu", (unsigned long long)o.seed);
	if (o.n_paths) {
		for (unsigned i = 0; i < o.n_paths; i++)
			paths[i] = o.paths[i];
		n_paths = o.n_paths;
	} else {
		dir = o.dir ? (char *)o.dir : mkdtemp(shm);
		if (!dir)
			dir = mkdtemp(tmp);
		if (!dir) {
			perror("mkdtemp");
			return 1;
		}
		snprintf(p0, sizeof(p0), "%s/m0", dir);
		snprintf(p1, sizeof(p1), "%s/m1", dir);
	}
	for (unsigned e = 0; e < o.n_engines; e++)
		run_engine(&o, o.engines[e], paths, n_paths);
	if (dir) {
		unlink(p0);
		unlink(p1);
		if (!o.dir)
			rmdir(dir);
	}
	return tap_done();
}
