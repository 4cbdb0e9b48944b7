// SPDX-License-Identifier: Apache-2.0
/*
 * Description: engines are a table: "auto" picks by each engine's probe
 * (never an engine without one), a name picks any known engine, and a
 * wrapper engine added with tt_engine_add() plugs in by name, delegating to
 * a built-in one (what a fault-injecting engine does).
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "../src/engine/engine_impl.h"
#include "tap.h"

#define OBJ 4096u

/* A wrapper over psync that counts what passes through it. */
static const struct tt_engine_ops *inner;
static unsigned wrapped_submits;

static int counting_init(struct tt_engine *e)
{
	return inner->init(e);
}

static void counting_fini(struct tt_engine *e)
{
	inner->fini(e);
}

static int counting_submit(struct tt_engine *e, struct tt_batch *b)
{
	wrapped_submits++;
	return inner->submit(e, b);
}

static int counting_reap(struct tt_engine *e, int wait)
{
	return inner->reap(e, wait);
}

static const struct tt_engine_ops counting_ops = {
	.name = "counting",	/* no probe: only by name */
	.init = counting_init,
	.fini = counting_fini,
	.submit = counting_submit,
	.reap = counting_reap,
};

static int claim_all(const int *fds, unsigned n)
{
	(void)fds;
	(void)n;
	return TT_ENGINE_NATIVE;
}

static const struct tt_engine_ops claiming_ops = {
	.name = "claiming",
	.probe = claim_all,
	.init = counting_init,
	.fini = counting_fini,
	.submit = counting_submit,
	.reap = counting_reap,
};

int main(void)
{
	char path[] = "/tmp/tutti-engine-table-XXXXXX";
	struct tt_engine_ops broken = { .name = "broken" };
	struct tt_io io;
	struct tt_batch b = { .ios = &io, .n = 1 };
	struct tt_engine *e;
	uint8_t *buf = aligned_alloc(OBJ, OBJ);
	int fd = mkstemp(path);
	const char *picked;

	if (fd < 0 || !buf)
		return 1;
	memset(buf, 0x5a, OBJ);

	/* The table knows the built-in engines; "auto" on a file is a generic one. */
	tap_ok(tt_engine_find("kqueue") && tt_engine_find("uring") && tt_engine_find("psync"),
	       "the table has kqueue, uring and psync");
	tap_ok(!tt_engine_find("auto") && !tt_engine_find("counting"), "nothing else yet");
	tap_eq(tt_engine_open("auto", &fd, 1, NULL, &e), 0, "auto on a regular file");
	picked = tt_engine_name(e);
	tap_ok(!strcmp(picked, "uring") || !strcmp(picked, "psync"), "auto picked %s", picked);
	tt_engine_close(e);

	/* Adding: complete ops under a new name only. */
	tap_eq(tt_engine_add(&broken), (unsigned long long)-EINVAL, "incomplete ops refused: %s",
	       tt_errmsg());
	inner = tt_engine_find("psync");
	tap_eq(tt_engine_add(&counting_ops), 0, "wrapper added");
	tap_eq(tt_engine_add(&counting_ops), (unsigned long long)-EEXIST, "same name twice refused");

	/* By name it moves data through the engine it wraps. */
	tap_eq(tt_engine_open("counting", &fd, 1, NULL, &e), 0, "open the wrapper by name");
	tap_ok(!strcmp(tt_engine_name(e), "counting"), "it is the wrapper");
	io = (struct tt_io){ .buf = buf, .off = 0, .len = OBJ, .op = TT_OP_WRITE };
	tap_eq(tt_engine_submit(e, &b), 0, "submit through the wrapper");
	tap_eq(tt_engine_wait(e, &b), 0, "the write completes");
	tap_eq(wrapped_submits, 1, "the wrapper saw the submit");
	tt_engine_close(e);
	tap_ok(pread(fd, buf, 16, 0) == 16 && buf[0] == 0x5a, "the bytes are in the file");

	/* No probe: "auto" never picks it. */
	tap_eq(tt_engine_open("auto", &fd, 1, NULL, &e), 0, "auto again");
	tap_ok(strcmp(tt_engine_name(e), "counting"), "auto did not pick the wrapper (%s)",
	       tt_engine_name(e));
	tt_engine_close(e);

	/* An engine whose probe claims the members is what "auto" picks. */
	tap_eq(tt_engine_add(&claiming_ops), 0, "a claiming engine added");
	tap_eq(tt_engine_open("auto", &fd, 1, NULL, &e), 0, "auto with a native engine known");
	tap_ok(!strcmp(tt_engine_name(e), "claiming"), "auto picked the native one (%s)",
	       tt_engine_name(e));
	tt_engine_close(e);

	tap_eq(tt_engine_open("nosuch", &fd, 1, NULL, &e), (unsigned long long)-EINVAL,
	       "unknown name refused");
	tap_ok(strstr(tt_errmsg(), "(kqueue, uring, psync, counting, claiming, auto)") != NULL,
	       "the message lists every known engine: %s", tt_errmsg());
	unlink(path);
	free(buf);
	return tap_done();
}
