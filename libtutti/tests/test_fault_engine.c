// SPDX-License-Identifier: Apache-2.0
/*
 * Description: the fault engine (fault.h) over uring and psync does what
 * each rule says and nothing else: a failed submit moves only the ios it
 * handed over and still completes through wait, a failed io moves nothing
 * and leaves garbage in a read's memory, a torn write persists exactly its
 * prefix, a delayed batch completes late, a failed flush fails, a full
 * filesystem refuses writes into holes, a rate rule holds writes back to
 * its rate (batches queue behind each other) and moves them bit-exact;
 * rules count and stop as told, the text form parses, and without rules
 * the engine is a plain pass-through.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "tap.h"

#define OBJ 4096u
#define N 8u

static uint8_t *src, *dst;

static void fill_src(unsigned round)
{
	for (unsigned i = 0; i < N * 2 * OBJ; i++)
		src[i] = (uint8_t)(i * 7 + i / OBJ + round * 13);
}

/* ios[i]: object i (2 pages each) at offset i * 2 pages. */
static void batch_of(struct tt_io *ios, unsigned op, uint8_t *mem)
{
	for (unsigned i = 0; i < N; i++)
		ios[i] = (struct tt_io){ .buf = mem + (size_t)i * 2 * OBJ, .off = (uint64_t)i * 2 * OBJ,
					 .len = 2 * OBJ, .op = (uint8_t)op, .tag = i };
}

static int run_batch(struct tt_engine *e, unsigned op, uint8_t *mem, struct tt_io *ios,
		     int *submit_ret)
{
	struct tt_batch b = { .ios = ios, .n = N };

	batch_of(ios, op, mem);
	*submit_ret = tt_engine_submit(e, &b);
	return tt_engine_wait(e, &b);
}

static int arm(struct tt_engine *e, const char *spec)
{
	struct tt_fault r[8];
	int n = tt_fault_parse(spec, r, 8);

	return n < 0 ? n : tt_engine_fault_arm(e, r, (unsigned)n);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * rate: at 4 MB/s a batch of N objects (64 KiB) takes >= 16 ms, two batches
 * submitted together >= 32 ms (one pipe); only a lower bound is asserted
 * (the device's own time comes on top).  Reads are not held back.
 */
static void run_rate(struct tt_engine *e, const char *name)
{
	const double one = N * 2.0 * OBJ / 4e6;
	struct tt_io ios[N], ios2[N];
	struct tt_batch b = { .ios = ios, .n = N }, b2 = { .ios = ios2, .n = N };
	double t0, dt;
	int sr;

	tap_eq(arm(e, "rate:write:mbps=4"), 0, "[%s] arm rate", name);
	fill_src(5);
	t0 = now_s();
	tap_eq(run_batch(e, TT_OP_WRITE, src, ios, &sr), 0, "[%s] rate: write completes", name);
	dt = now_s() - t0;
	tap_ok(dt >= one * 0.999, "[%s] rate: one batch took %.1f ms (>= %.1f)", name, dt * 1e3,
	       one * 1e3);
	batch_of(ios, TT_OP_WRITE, src);
	batch_of(ios2, TT_OP_WRITE, src);
	t0 = now_s();
	tt_engine_submit(e, &b);
	tt_engine_submit(e, &b2);
	{
		int done = tt_engine_done(e, &b);

		dt = now_s() - t0;	/* a busy machine may deschedule us past the due time */
		tap_ok(!done || dt >= one * 0.999, "[%s] rate: not done before its time (%s at %.1f ms)",
		       name, done ? "done" : "pending", dt * 1e3);
	}
	tap_eq(tt_engine_wait(e, &b2) | tt_engine_wait(e, &b), 0, "[%s] rate: both complete", name);
	dt = now_s() - t0;
	tap_ok(dt >= 2 * one * 0.999, "[%s] rate: two batches queue: %.1f ms (>= %.1f)", name,
	       dt * 1e3, 2 * one * 1e3);
	memset(dst, 0, N * 2 * OBJ);
	tap_eq(run_batch(e, TT_OP_READ, dst, ios, &sr), 0, "[%s] rate: read back", name);
	tap_ok(!memcmp(src, dst, N * 2 * OBJ), "[%s] rate: bit-exact", name);
	arm(e, "");
}

/* Write everything cleanly (rules disarmed), so reads have known content. */
static void write_clean(struct tt_engine *e, unsigned round)
{
	struct tt_io ios[N];
	int sr;

	arm(e, "");
	fill_src(round);
	run_batch(e, TT_OP_WRITE, src, ios, &sr);
}

static void run(const char *inner, int fd)
{
	char name[32];
	struct tt_engine_params ep = { .queue_depth = 4, .max_req_bytes = 4 * OBJ };
	struct tt_fault_hit hits[64];
	struct tt_io ios[N];
	struct tt_engine *e;
	int sr, ret, ok;

	snprintf(name, sizeof(name), "fault:%s", inner);
	tap_eq(tt_engine_open(name, &fd, 1, &ep, &e), 0, "[%s] open", name);
	tap_ok(!strcmp(tt_engine_name(e), name), "[%s] is called %s", name, tt_engine_name(e));

	/* No rules: a plain engine. */
	fill_src(1);
	tap_eq(run_batch(e, TT_OP_WRITE, src, ios, &sr), 0, "[%s] write without rules", name);
	memset(dst, 0, N * 2 * OBJ);
	tap_eq(run_batch(e, TT_OP_READ, dst, ios, &sr), 0, "[%s] read without rules", name);
	tap_ok(!memcmp(src, dst, N * 2 * OBJ), "[%s] bit-exact", name);
	tap_eq(tt_engine_fault_hits(e, hits, 64), 0, "[%s] no hits", name);

	/* io: the 3rd read (nth=2) fails, moves nothing, garbage in its memory. */
	tap_eq(arm(e, "io:read:nth=2:err=ENODEV"), 0, "[%s] arm io", name);
	memset(dst, 0, N * 2 * OBJ);
	ret = run_batch(e, TT_OP_READ, dst, ios, &sr);
	tap_eq(ret, (unsigned long long)-ENODEV, "[%s] io: wait reports the io's error", name);
	ok = 1;
	for (unsigned i = 0; i < N; i++)
		ok &= i == 2 ? ios[i].res == -ENODEV : ios[i].res == 0;
	tap_ok(ok, "[%s] io: exactly io 2 failed", name);
	tap_ok(dst[2 * 2 * OBJ] == 0xa5 && !memcmp(src, dst, 2 * 2 * OBJ) &&
	       !memcmp(src + 3 * 2 * OBJ, dst + 3 * 2 * OBJ, 5 * 2 * OBJ),
	       "[%s] io: failed read left garbage, the others landed", name);
	tap_eq(tt_engine_fault_hits(e, hits, 64), 1, "[%s] io: one hit", name);
	tap_ok(hits[0].kind == TT_FAULT_IO && hits[0].off == 2 * 2 * OBJ &&
	       hits[0].len == 2 * OBJ && hits[0].err == -ENODEV, "[%s] io: the hit names the io",
	       name);
	tap_eq(run_batch(e, TT_OP_READ, dst, ios, &sr), 0, "[%s] io: count=1 fires once", name);

	/* io on writes: the failed write does not reach the disk. */
	write_clean(e, 2);
	arm(e, "io:write:nth=5");
	fill_src(3);
	tap_eq(run_batch(e, TT_OP_WRITE, src, ios, &sr), (unsigned long long)-EIO,
	       "[%s] io write: -EIO by default", name);
	arm(e, "");
	run_batch(e, TT_OP_READ, dst, ios, &sr);
	ok = !memcmp(dst, src, 5 * 2 * OBJ) && !memcmp(dst + 6 * 2 * OBJ, src + 6 * 2 * OBJ,
						       2 * 2 * OBJ);
	fill_src(2);
	tap_ok(ok && !memcmp(dst + 5 * 2 * OBJ, src + 5 * 2 * OBJ, 2 * OBJ),
	       "[%s] io write: object 5 keeps its old bytes, the others are new", name);

	/* short write: only the first page of object 4 persists (torn). */
	write_clean(e, 4);
	arm(e, "short:write:nth=4:keep=5000");
	fill_src(5);
	tap_eq(run_batch(e, TT_OP_WRITE, src, ios, &sr), (unsigned long long)-EIO,
	       "[%s] torn write fails", name);
	arm(e, "");
	run_batch(e, TT_OP_READ, dst, ios, &sr);
	ok = !memcmp(dst + 4 * 2 * OBJ, src + 4 * 2 * OBJ, OBJ);
	fill_src(4);
	tap_ok(ok && !memcmp(dst + 4 * 2 * OBJ + OBJ, src + 4 * 2 * OBJ + OBJ, OBJ),
	       "[%s] torn write: its first 4 KiB are new, the rest old", name);

	/* short read: the prefix arrives, the rest is garbage, the io fails. */
	write_clean(e, 4);
	arm(e, "short:read:nth=1:keep=4096:err=EAGAIN");
	memset(dst, 0, N * 2 * OBJ);
	tap_eq(run_batch(e, TT_OP_READ, dst, ios, &sr), (unsigned long long)-EAGAIN,
	       "[%s] short read fails", name);
	tap_ok(!memcmp(dst + 2 * OBJ, src + 2 * OBJ, OBJ) && dst[3 * OBJ] == 0xa5,
	       "[%s] short read: prefix landed, rest garbage", name);

	/* submit: hands over 3 ios, fails; wait still completes the batch. */
	write_clean(e, 4);
	tt_engine_fault_hits(e, hits, 64);
	arm(e, "submit:write:after=3:err=EAGAIN");
	fill_src(6);
	ret = run_batch(e, TT_OP_WRITE, src, ios, &sr);
	tap_eq(sr, (unsigned long long)-EAGAIN, "[%s] submit fails: %s", name, tt_errmsg());
	tap_eq(ret, (unsigned long long)-EAGAIN, "[%s] submit: wait completes the batch", name);
	ok = 1;
	for (unsigned i = 0; i < N; i++)
		ok &= i < 3 ? ios[i].res == 0 : ios[i].res == -EAGAIN;
	tap_ok(ok, "[%s] submit: the 3 handed over moved, the rest failed", name);
	tap_eq(tt_engine_fault_hits(e, hits, 64), N, "[%s] submit: every io of the batch is a hit",
	       name);
	arm(e, "");
	run_batch(e, TT_OP_READ, dst, ios, &sr);
	ok = !memcmp(dst, src, 3 * 2 * OBJ);
	fill_src(4);
	tap_ok(ok && !memcmp(dst + 3 * 2 * OBJ, src + 3 * 2 * OBJ, 5 * 2 * OBJ),
	       "[%s] submit: only the handed-over ios reached the disk", name);

	/* delay: the batch completes 3 reaps late, bit-exact. */
	write_clean(e, 4);
	arm(e, "delay:read:nth=0:reaps=3");
	{
		struct tt_batch b = { .ios = ios, .n = N };
		unsigned polls = 0;

		memset(dst, 0, N * 2 * OBJ);
		batch_of(ios, TT_OP_READ, dst);
		tap_eq(tt_engine_submit(e, &b), 0, "[%s] delay: submit", name);
		while (!tt_engine_done(e, &b) && polls < 100000) {
			polls++;
			usleep(10);
		}
		tap_ok(polls >= 3 && polls < 100000, "[%s] delay: done after %u polls", name, polls);
		tap_ok(b.err == 0 && !memcmp(dst, src, N * 2 * OBJ), "[%s] delay: bit-exact", name);
	}

	/* flush: the 2nd flush fails, then flushes work again. */
	arm(e, "flush:nth=1:err=EIO");
	tap_eq(tt_engine_flush(e), 0, "[%s] flush 0 ok", name);
	tap_eq(tt_engine_flush(e), (unsigned long long)-EIO, "[%s] flush 1 fails", name);
	tap_eq(tt_engine_flush(e), 0, "[%s] flush 2 ok", name);

	/* count=0: every event from nth on. */
	arm(e, "io:read:nth=6:count=0");
	run_batch(e, TT_OP_READ, dst, ios, &sr);
	ok = 1;
	for (unsigned i = 0; i < N; i++)
		ok &= i < 6 ? ios[i].res == 0 : ios[i].res == -EIO;
	tap_ok(ok, "[%s] count=0: ios 6 and 7 fail", name);
	run_batch(e, TT_OP_READ, dst, ios, &sr);
	ok = 1;
	for (unsigned i = 0; i < N; i++)
		ok &= ios[i].res == -EIO;
	tap_ok(ok, "[%s] count=0: and every later one", name);
	run_rate(e, name);
	tt_engine_close(e);
}

/* full: writes into holes of a sparse file fail with ENOSPC, others work. */
static void run_full(const char *inner, const char *path)
{
	char name[32];
	struct tt_io ios[N];
	struct tt_engine *e;
	int fd, sr, ok = 1;

	snprintf(name, sizeof(name), "fault:%s", inner);
	unlink(path);
	fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0644);
	if (fd < 0)
		fd = open(path, O_RDWR | O_CREAT, 0644);
	/* Objects 0..3 written, 4..7 a hole. */
	tap_eq(ftruncate(fd, N * 2 * OBJ), 0, "[%s] full: sparse file", name);
	tt_engine_open(name, &fd, 1, NULL, &e);
	batch_of(ios, TT_OP_WRITE, src);
	{
		struct tt_batch b = { .ios = ios, .n = 4 };

		tt_engine_submit(e, &b);
		tt_engine_wait(e, &b);
	}
	tap_eq(arm(e, "full:free=8192"), 0, "[%s] full: arm with 8 KiB free", name);
	run_batch(e, TT_OP_WRITE, src, ios, &sr);
	for (unsigned i = 0; i < N; i++)
		ok &= i < 5 ? ios[i].res == 0 : ios[i].res == -ENOSPC;
	tap_ok(ok, "[%s] full: rewrites and one new object fit, the rest -ENOSPC", name);
	tt_engine_close(e);
	close(fd);
	unlink(path);
}

static void test_parse(void)
{
	struct tt_fault r[4];

	tap_eq(tt_fault_parse("io:write:nth=3:count=2:err=ENOSPC;submit:after=1;full:free=0x1000",
			      r, 4), 3, "parse three rules");
	tap_ok(r[0].kind == TT_FAULT_IO && r[0].op == TT_OP_WRITE && r[0].nth == 3 &&
	       r[0].count == 2 && r[0].err == -ENOSPC, "rule 0 parsed");
	tap_ok(r[1].kind == TT_FAULT_SUBMIT && r[1].op == TT_FAULT_ANY_OP && r[1].arg == 1 &&
	       r[1].count == 1, "rule 1 parsed (defaults: any op, once)");
	tap_ok(r[2].kind == TT_FAULT_FULL && r[2].arg == 4096 && r[2].count == 0,
	       "rule 2 parsed (a full filesystem stays full)");
	tap_eq(tt_fault_parse("rate:write:mbps=50", r, 4), 1, "parse a rate");
	tap_ok(r[0].kind == TT_FAULT_RATE && r[0].op == TT_OP_WRITE && r[0].arg == 50 &&
	       r[0].count == 0, "rate parsed (every io by default)");
	tap_eq(tt_fault_parse("rate:write", r, 4), (unsigned long long)-EINVAL,
	       "a rate without mbps: %s", tt_errmsg());
	tap_eq(tt_fault_parse("", r, 4), 0, "empty: no rules");
	tap_eq(tt_fault_parse("io:nth=x", r, 4), (unsigned long long)-EINVAL, "bad number: %s",
	       tt_errmsg());
	tap_eq(tt_fault_parse("melt", r, 4), (unsigned long long)-EINVAL, "bad kind: %s",
	       tt_errmsg());
	tap_eq(tt_fault_parse("io:keep=4096", r, 4), (unsigned long long)-EINVAL,
	       "an option of another kind: %s", tt_errmsg());
	tap_eq(tt_fault_parse("io;io;io;io;io", r, 4), (unsigned long long)-EINVAL,
	       "too many rules");
}

int main(void)
{
	char path[] = "/tmp/tutti-fault-XXXXXX";
	char full[64];
	int fd = mkstemp(path), dfd;
	struct tt_engine *e;

	if (fd < 0)
		return 1;
	dfd = open(path, O_RDWR | O_DIRECT);
	if (dfd < 0)
		dfd = fd;
	src = aligned_alloc(OBJ, N * 2 * OBJ);
	dst = aligned_alloc(OBJ, N * 2 * OBJ);
	test_parse();
	run("uring", dfd);
	run("psync", dfd);
	snprintf(full, sizeof(full), "%s.full", path);
	run_full("uring", full);
	run_full("psync", full);
	tap_eq(tt_engine_open("psync", &dfd, 1, NULL, &e), 0, "a plain engine");
	tap_eq(tt_engine_fault_arm(e, NULL, 0), (unsigned long long)-EOPNOTSUPP,
	       "a plain engine takes no rules: %s", tt_errmsg());
	tt_engine_close(e);
	setenv("TUTTI_FAULTS", "io:read", 1);
	tap_eq(tt_engine_open("psync", &dfd, 1, NULL, &e), 0, "TUTTI_FAULTS wraps any engine");
	tap_ok(!strcmp(tt_engine_name(e), "fault:psync"), "... named %s", tt_engine_name(e));
	{
		struct tt_io ios[N];
		int sr;

		tap_eq(run_batch(e, TT_OP_READ, dst, ios, &sr), (unsigned long long)-EIO,
		       "... and starts with its rules");
	}
	tt_engine_close(e);
	setenv("TUTTI_FAULTS", "bogus", 1);
	tap_eq(tt_engine_open("psync", &dfd, 1, NULL, &e), (unsigned long long)-EINVAL,
	       "a bad TUTTI_FAULTS is refused: %s", tt_errmsg());
	unsetenv("TUTTI_FAULTS");
	{
		struct tt_fault bad = { .kind = TT_FAULT_RATE, .op = TT_FAULT_ANY_OP };

		tap_eq(tt_engine_open("fault:psync", &dfd, 1, NULL, &e), 0, "fault:psync");
		tap_eq(tt_engine_fault_arm(e, &bad, 1), (unsigned long long)-EINVAL,
		       "a rate of 0 is refused: %s", tt_errmsg());
		tt_engine_close(e);
	}
	free(src);
	free(dst);
	unlink(path);
	return tap_done();
}
