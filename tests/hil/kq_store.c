// SPDX-License-Identifier: Apache-2.0
/*
 * Description: a Tutti store on the kqueue engine (tutti.ko's queue pairs)
 * striped over both emulated controllers, run inside the HIL guest: round
 * trips with both mapping modes, and crash safety (a writer SIGKILLed at
 * random points, then after a reboot of the whole guest: every acknowledged
 * block whole, the store checking clean).  Subcommands: see main().
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tutti/error.h"
#include "tutti/store.h"
#include "hil.h"

static struct tt_format_params small_params(void)
{
	struct tt_format_params p;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "hil/kqueue");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = 4;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;	/* span 4 KiB, block 32 KiB */
	p.n_slots = 2048;
	p.stripe_objs = 8;	/* small stripe unit: a few blocks cover both members */
	p.flags = TT_FORMAT_FORCE;
	return p;
}

#define BLOCK_BYTES (4 * 2 * 4096)

static void store_key(uint64_t i, uint8_t key[16])
{
	tt_key_from_bytes(&i, sizeof(i), key);
}

static struct tt_store *store_open(const char *const *paths, unsigned n, const char *engine)
{
	struct tt_open_params op = { .engine = engine };
	struct tt_store *s = NULL;

	for (int tries = 0; tries < 50; tries++) {
		int ret = tt_store_open(paths, n, &op, &s);

		if (!ret)
			return s;
		if (ret != -EBUSY)
			bail("open store (%s): %s", engine, tt_errmsg());
		usleep(100000);
	}
	bail("store stays busy");
}

static int t_store(const char *a, const char *b)
{
	const char *paths[2] = { a, b };
	struct tt_format_params p = small_params();
	struct tt_store_info info;
	struct tt_check_result cr = { 0 };
	uint8_t *w = hil_pages(BLOCK_BYTES), *rb = hil_pages(BLOCK_BYTES);
	uint8_t *reg = hil_pages(64 * BLOCK_BYTES);
	uint8_t key[16];
	struct tt_store *s;
	int ok = 1, members[2] = { 0, 0 };

	check(!tt_store_format(paths, 2, &p), "format a store striped over %s and %s (%s)", a, b,
	      tt_errmsg());
	s = store_open(paths, 2, "kqueue");
	tt_store_get_info(s, &info);
	check(!strcmp(info.engine, "kqueue"), "store engine: %s", info.engine);
	for (uint64_t i = 0; i < 200; i++) {
		fill(w, BLOCK_BYTES, i);
		store_key(i, key);
		ok &= !tt_store_put(s, key, w, BLOCK_BYTES);
	}
	check(ok, "put 200 blocks (%s)", tt_errmsg());
	ok = 1;
	for (uint64_t i = 0; i < 200; i++) {
		fill(w, BLOCK_BYTES, i);
		store_key(i, key);
		memset(rb, 0, BLOCK_BYTES);
		ok &= !tt_store_get(s, key, rb, BLOCK_BYTES) && !memcmp(rb, w, BLOCK_BYTES);
	}
	check(ok, "get 200 blocks back: identical bytes");
	for (uint32_t l = 0; l < 4; l++)
		for (uint32_t sp = 0; sp < 2; sp++)
			for (uint64_t sl = 0; sl < 200; sl++)
				members[tt_locate(&info.geo, sl, l, sp).member]++;
	check(members[0] > 0 && members[1] > 0, "objects striped over both controllers (%d / %d)",
	      members[0], members[1]);
	/* Registered memory: the engine addresses it directly, no bounce. */
	check(!tt_store_register_memory(s, reg, 64 * BLOCK_BYTES), "register 2 MiB with the store");
	fill(reg, BLOCK_BYTES, 1000);
	store_key(1000, key);
	check(!tt_store_put(s, key, reg, BLOCK_BYTES), "put from registered memory");
	memset(reg + BLOCK_BYTES, 0, BLOCK_BYTES);
	check(!tt_store_get(s, key, reg + BLOCK_BYTES, BLOCK_BYTES) &&
	      !memcmp(reg, reg + BLOCK_BYTES, BLOCK_BYTES), "get into registered memory: identical");
	tt_store_close(s);
	s = store_open(paths, 2, "auto");
	tt_store_get_info(s, &info);
	check(!strcmp(info.engine, "kqueue"), "engine 'auto' picks kqueue for tutti nodes");
	check(info.n_committed == 201, "reopened: %llu blocks committed",
	      (unsigned long long)info.n_committed);
	fill(w, BLOCK_BYTES, 77);
	store_key(77, key);
	check(!tt_store_get(s, key, rb, BLOCK_BYTES) && !memcmp(rb, w, BLOCK_BYTES),
	      "a block survives close/reopen");
	ok = tt_store_check(s, 0, ~0ull, 0, &cr, NULL, 0) == 0;
	check(ok && cr.bad == 0 && cr.ok == 201, "check: %llu ok, %llu bad", (unsigned long long)cr.ok, (unsigned long long)cr.bad);
	tt_store_close(s);
	return 0;
}

/* Child: put blocks forever, report each committed index on stdout. */
static int t_writer(const char *a, const char *b, uint64_t base)
{
	const char *paths[2] = { a, b };
	uint8_t *w = hil_pages(BLOCK_BYTES);
	struct tt_store *s = store_open(paths, 2, "kqueue");
	uint8_t key[16];

	for (uint64_t i = base;; i++) {
		fill(w, BLOCK_BYTES, i);
		store_key(i, key);
		if (tt_store_put(s, key, w, BLOCK_BYTES))
			return 1;
		printf("%llu\n", (unsigned long long)i);
		fflush(stdout);
	}
}

/* Verify every key in [0, upto): missing or identical, never different. */
static void verify_store(const char *const *paths, uint64_t upto, int64_t must_have_upto,
			 const char *what)
{
	struct tt_check_result cr = { 0 };
	uint8_t *w = hil_pages(BLOCK_BYTES), *rb = hil_pages(BLOCK_BYTES);
	struct tt_store *s = store_open(paths, 2, "kqueue");
	uint64_t hits = 0, wrong = 0, lost = 0;
	uint8_t key[16];

	int ret = tt_store_check(s, 0, ~0ull, 0, &cr, NULL, 0);

	check(ret == 0 && cr.bad == 0 &&
	      cr.bad_records == 0, "%s: check clean (%llu ok, %llu bad, %llu bad records)", what,
	      (unsigned long long)cr.ok, (unsigned long long)cr.bad,
	      (unsigned long long)cr.bad_records);
	for (uint64_t i = 0; i < upto; i++) {
		int ret;

		store_key(i, key);
		ret = tt_store_get(s, key, rb, BLOCK_BYTES);
		if (ret == 0) {
			fill(w, BLOCK_BYTES, i);
			hits++;
			wrong += !!memcmp(rb, w, BLOCK_BYTES);
		} else if ((int64_t)i <= must_have_upto && (int64_t)i > must_have_upto - 1024) {
			/* acknowledged and recent enough not to be LRU-evicted */
			lost++;
		}
	}
	check(wrong == 0 && lost == 0,
	      "%s: %llu blocks served, %llu wrong, %llu of the last 1024 acknowledged lost",
	      what, (unsigned long long)hits, (unsigned long long)wrong, (unsigned long long)lost);
	tt_store_close(s);
	munmap(w, BLOCK_BYTES);
	munmap(rb, BLOCK_BYTES);
}

static int t_crash(const char *self, const char *a, const char *b, int trials)
{
	const char *paths[2] = { a, b };
	struct tt_format_params p = small_params();
	int64_t acked = -1;
	uint64_t next = 0;
	int ok_trials = 0;

	if (tt_store_format(paths, 2, &p))
		bail("format: %s", tt_errmsg());
	srand((unsigned)time(NULL) ^ (unsigned)getpid());
	for (int t = 0; t < trials; t++) {
		int pfd[2], st;
		char base[32];
		pid_t pid;
		FILE *f;
		char line[64];
		struct timespec ts = { 0, (200 + rand() % 800) * 1000000L };

		if (pipe(pfd))
			bail("pipe");
		snprintf(base, sizeof(base), "%llu", (unsigned long long)next);
		pid = fork();
		if (!pid) {
			dup2(pfd[1], 1);
			close(pfd[0]);
			execl(self, self, "writer", a, b, base, (char *)NULL);
			_exit(127);
		}
		close(pfd[1]);
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		f = fdopen(pfd[0], "r");
		while (fgets(line, sizeof(line), f))
			acked = strtoll(line, NULL, 10);
		fclose(f);
		next = (uint64_t)(acked + 1);	/* a re-put of a committed key is a no-op */
		ok_trials += WIFSIGNALED(st);
	}
	check(ok_trials == trials, "%d writers SIGKILLed mid-write", ok_trials);
	verify_store(paths, next + 16, acked, "after SIGKILL trials");
	return 0;
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(cmd, "store") && argc == 4)
		return t_store(argv[2], argv[3]) || tap_failed;
	if (!strcmp(cmd, "writer") && argc == 5) {
		tap_no_plan();	/* stdout carries committed indexes only (HIL-ACKED) */
		return t_writer(argv[2], argv[3], strtoull(argv[4], NULL, 10));
	}
	if (!strcmp(cmd, "crash") && argc == 5)
		return t_crash(argv[0], argv[2], argv[3], atoi(argv[4])) || tap_failed;
	if (!strcmp(cmd, "verify") && argc == 5) {
		const char *paths[2] = { argv[2], argv[3] };

		verify_store(paths, strtoull(argv[4], NULL, 10), -1, "after reboot");
		return tap_failed;
	}
	fprintf(stderr, "usage: %s store NS_A NS_B | writer NS_A NS_B BASE | crash NS_A NS_B N | "
		"verify NS_A NS_B UPTO\n", argv[0]);
	return 2;
}
