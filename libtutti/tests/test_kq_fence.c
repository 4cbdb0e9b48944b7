// SPDX-License-Identifier: Apache-2.0
/*
 * Description: the kqueue engine against a controller that stops answering
 * (fake_tutti.h: a stand-in for tutti.ko and the controller, in this
 * process).  A wait that times out must fence before it returns: the queue
 * is deleted (Delete SQ finishes or aborts the stalled commands) before the
 * commands are failed and their memory and slots released, so nothing lands
 * in memory the caller frees or reuses, and no store slot is overwritten
 * after it was given to another block.  Run it under ASan too:
 *   make BUILD=build/asan CC='gcc -fsanitize=address' build/asan/tests/test_kq_fence
 * One case: test_kq_fence baseline|stalled-read|stalled-write|two-members|unfenced|store
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tutti/tutti.h"
#include "tutti/kqueue.h"
#include "fake_tutti.h"
#include "tap.h"
#include "testutil.h"

#define KiB		1024u
#define MiB		(1024u * KiB)
#define TIMEOUT_MS	200u	/* TUTTI_KQ_TIMEOUT_MS for these tests */
/* A held command runs by itself after this (TEST_KQ_RESUME_MS overrides). */
static unsigned RESUME_MS = 700;

static char dir[] = "/tmp/tutti-kqf-XXXXXX";
static char path[300];

static int all_bytes(const void *buf, size_t len, uint8_t v)
{
	const uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

static void sleep_ms(unsigned ms)
{
	usleep(ms * 1000u);
}

static void *pages(size_t len)
{
	void *p = aligned_alloc(4096, len);

	if (!p)
		abort();
	return p;
}

static struct tt_engine *open_engine(int *fds, unsigned n)
{
	struct tt_engine_params ep = { .queue_depth = 64 };
	struct tt_engine *e = NULL;

	if (tt_engine_open("kqueue", fds, n, &ep, &e))
		printf("# engine: %s\n", tt_errmsg());
	return e;
}

/* One io through @e; returns the wait's result, io result in *res. */
static int one_io(struct tt_engine *e, int op, void *buf, uint32_t len, uint64_t off,
		  uint16_t member, int32_t *res)
{
	struct tt_io io = { .buf = buf, .off = off, .len = len, .op = (uint8_t)op,
			    .member = member };
	struct tt_batch b = { .ios = &io, .n = 1 };
	int ret = tt_engine_submit(e, &b);

	if (!ret)
		ret = tt_engine_wait(e, &b);
	*res = io.res;
	return ret;
}

/* The fake works: round trips through PRP and SGL, registered and bounced. */
static void t_baseline(int fd)
{
	struct tt_engine *e;
	uint8_t *w = pages(MiB), *r = pages(MiB + 4096);
	int32_t res;

	for (int prp = 0; prp < 2; prp++) {
		setenv("TUTTI_KQ_PRP", prp ? "1" : "0", 1);
		e = open_engine(&fd, 1);
		if (!tap_ok(e != NULL, "[%s] kqueue engine on the stand-in", prp ? "PRP" : "SGL"))
			continue;
		tap_ok(!tt_engine_register(e, w, MiB), "register 1 MiB");
		fill(w, MiB, 1 + prp);
		tap_ok(!one_io(e, TT_OP_WRITE, w, MiB, 4 * MiB, 0, &res) && !res,
		       "[%s] write 1 MiB from registered memory", prp ? "PRP" : "SGL");
		memset(r, 0, MiB + 4096);
		tap_ok(!one_io(e, TT_OP_READ, r + 512, MiB, 4 * MiB, 0, &res) && !res &&
		       !memcmp(r + 512, w, MiB), "[%s] read it back into unregistered memory: "
		       "identical", prp ? "PRP" : "SGL");
		tt_engine_close(e);
	}
	setenv("TUTTI_KQ_PRP", "0", 1);
	tap_eq(fk.bad_dma, 0, "the stand-in saw no transfer outside pinned memory");
	free(w);
	free(r);
}

/*
 * A read stalls (bounced: the engine copies into the caller's memory on
 * completion).  The controller finishes it only when the queue is deleted.
 */
static void t_stalled_read(int fd)
{
	const uint32_t len = 256 * KiB;
	uint8_t *buf = malloc(len), *gone = malloc(len), *want = pages(len), *got = pages(len);
	struct tt_engine *e = open_engine(&fd, 1);
	uint64_t t0, dt;
	int32_t res;
	int ret;

	if (!e)
		return;
	fill(want, len, 7);
	tap_ok(!one_io(e, TT_OP_WRITE, want, len, 8 * MiB, 0, &res) && !res, "write the data");
	fk_reset();
	fk.stall = 1;
	fk.finish_on_delete = 1;
	fk.resume_ms = RESUME_MS;
	t0 = fk_now_ms();
	ret = one_io(e, TT_OP_READ, buf, len, 8 * MiB, 0, &res);
	dt = fk_now_ms() - t0;
	tap_ok(fk_outstanding() == 0,
	       "stalled read: no command outstanding when the wait returned (fenced)");
	fk_mark();
	memset(buf, 0x5a, len);
	tap_eq((unsigned)-ret, ETIMEDOUT, "the wait returns -ETIMEDOUT (%s)", tt_errmsg());
	tap_eq((unsigned)-res, ETIMEDOUT, "the io is failed with -ETIMEDOUT");
	tap_ok(dt >= TIMEOUT_MS && dt < 5000, "after the timeout (%llu ms)", (unsigned long long)dt);
	tap_eq(fk.finished_on_delete, 1, "the controller finished it while the queue was deleted");

	/* A late completion must find nothing of the request: the caller reuses its memory. */
	fk.stall = 0;
	sleep_ms(RESUME_MS + 300);
	memset(got, 0, len);
	tap_ok(!one_io(e, TT_OP_READ, got, len, 8 * MiB, 0, &res) && !res &&
	       !memcmp(got, want, len), "the next read works (new queue) and is exact");
	tap_ok(all_bytes(buf, len, 0x5a), "nothing was copied into the failed read's memory "
	       "after the wait returned");
	tap_eq(fk.late, 0, "no stalled command ran after the wait returned");

	/* The same with the caller's memory freed at once (ASan sees any late copy). */
	fk_reset();
	fk.stall = 1;
	fk.finish_on_delete = 1;
	fk.resume_ms = RESUME_MS;
	ret = one_io(e, TT_OP_READ, gone, len, 8 * MiB, 0, &res);
	free(gone);
	fk_mark();
	fk.stall = 0;
	sleep_ms(RESUME_MS + 300);
	for (int i = 0; i < 4; i++)
		ret |= !one_io(e, TT_OP_READ, got, len, 8 * MiB, 0, &res) && !res ? 0 : 1;
	tap_ok(ret != 0 && fk.late == 0 && !memcmp(got, want, len),
	       "freed right after the timeout: 4 more reads, exact, nothing late");
	/* All bounce slots came back: 64 bounced requests at once. */
	{
		struct tt_io io[64];
		struct tt_batch b = { .ios = io, .n = 64 };
		uint8_t *many = malloc(64 * 4096 + 1), *src = pages(128 * 4096);
		int ok;

		fill(src, 128 * 4096, 8);
		ok = !one_io(e, TT_OP_WRITE, src, 128 * 4096, 24 * MiB, 0, &res) && !res;
		for (int i = 0; i < 64; i++)
			io[i] = (struct tt_io){ .buf = many + 1 + i * 4096, .len = 4096,
						.off = 24 * MiB + (uint64_t)i * 8192, .op = TT_OP_READ };
		ok = ok && !tt_engine_submit(e, &b) && !tt_engine_wait(e, &b);
		for (int i = 0; ok && i < 64; i++)
			ok = io[i].res == 0 && !memcmp(many + 1 + i * 4096, src + i * 8192, 4096);
		tap_ok(ok, "64 bounced reads at once after two fences: all exact");
		free(many);
		free(src);
	}
	tt_engine_close(e);
	free(buf);
	free(want);
	free(got);
}

/* A write stalls; Delete SQ aborts it: it never lands, not even later. */
static void t_stalled_write(int fd)
{
	const uint32_t len = 128 * KiB;
	uint8_t *old = pages(len), *w = pages(len), *disk = pages(len);
	struct tt_engine *e = open_engine(&fd, 1);
	int32_t res;
	int ret;

	if (!e)
		return;
	fill(old, len, 11);
	tap_ok(pwrite(fd, old, len, 12 * MiB) == (ssize_t)len, "old bytes on disk");
	tap_ok(!tt_engine_register(e, w, len), "register the write's memory");
	fill(w, len, 12);
	fk_reset();
	fk.stall = 1;
	fk.resume_ms = RESUME_MS;
	ret = one_io(e, TT_OP_WRITE, w, len, 12 * MiB, 0, &res);
	tap_ok(fk_outstanding() == 0 && ret == -ETIMEDOUT && res == -ETIMEDOUT,
	       "stalled write: -ETIMEDOUT, nothing outstanding at return");
	fk_mark();
	tap_eq(fk.aborted, 1, "Delete SQ aborted it");
	tap_ok(pread(fd, disk, len, 12 * MiB) == (ssize_t)len && !memcmp(disk, old, len),
	       "the disk still holds the old bytes");
	fill(w, len, 13);	/* the caller reuses the memory */
	sleep_ms(RESUME_MS + 300);
	tap_ok(pread(fd, disk, len, 12 * MiB) == (ssize_t)len && !memcmp(disk, old, len),
	       "and still does after the controller would have resumed");
	tap_eq(fk.late, 0, "no stalled command ran after the wait returned");
	tt_engine_close(e);
	free(old);
	free(w);
	free(disk);
}

/* Two members, one stalls: the other's ios complete, the wait drains both. */
static void t_two_members(int fd)
{
	int fd2 = open(path, O_RDWR | O_CLOEXEC), fds[2] = { fd, fd2 };
	uint8_t *want = pages(MiB), *buf = pages(MiB);
	struct tt_io io[4];
	struct tt_batch b = { .ios = io, .n = 4 };
	struct tt_engine *e = open_engine(fds, 2);
	int32_t res;
	int ret;

	if (!e)
		return;
	fill(want, MiB, 21);
	tap_ok(pwrite(fd, want, MiB, 16 * MiB) == (ssize_t)MiB, "data on disk");
	fk_reset();
	fk.stall = 1;
	fk.stall_qid = 2;	/* member 0's queue (the first made) */
	fk.finish_on_delete = 0;
	for (int i = 0; i < 4; i++)
		io[i] = (struct tt_io){ .buf = buf + i * 256 * KiB, .len = 256 * KiB,
					.off = 16 * MiB + i * 256 * KiB, .op = TT_OP_READ,
					.member = (uint16_t)(i & 1) };
	ret = tt_engine_submit(e, &b);
	if (!ret)
		ret = tt_engine_wait(e, &b);
	tap_ok(ret == -ETIMEDOUT && b.inflight == 0 && fk_outstanding() == 0,
	       "the wait returns -ETIMEDOUT with nothing in flight on either member");
	tap_ok(io[0].res == -ETIMEDOUT && io[2].res == -ETIMEDOUT,
	       "the stalled member's ios failed");
	tap_ok(io[1].res == 0 && io[3].res == 0 &&
	       !memcmp(buf + 256 * KiB, want + 256 * KiB, 256 * KiB) &&
	       !memcmp(buf + 768 * KiB, want + 768 * KiB, 256 * KiB),
	       "the other member's ios completed, exact");
	fk_reset();
	tap_ok(!one_io(e, TT_OP_READ, buf, 256 * KiB, 16 * MiB, 0, &res) && !res &&
	       !memcmp(buf, want, 256 * KiB), "the stalled member serves again (new queue)");
	tt_engine_close(e);
	close(fd2);
	free(want);
	free(buf);
}

/*
 * The module cannot prove the queue stopped: the member is given up, and
 * what its commands address (bounce slots, list pages) stays pinned and
 * mapped, even after close, so a controller that wakes up later writes
 * into memory nobody reuses.
 */
static void t_unfenced(int fd)
{
	const uint32_t len = 64 * KiB;
	uint8_t *buf = malloc(len);
	struct tt_engine *e = open_engine(&fd, 1);
	int32_t res;
	int ret;

	if (!e)
		return;
	fk_reset();
	fk.stall = 1;
	fk.resume_ms = RESUME_MS;
	fk.finish_on_delete = 1;
	fk.delete_errno = ETIMEDOUT;
	ret = one_io(e, TT_OP_READ, buf, len, 20 * MiB, 0, &res);
	fk_mark();
	memset(buf, 0x5a, len);
	tap_ok(ret == -ETIMEDOUT && res == -ETIMEDOUT && strstr(tt_errmsg(), "proven stopped"),
	       "unproven delete: -ETIMEDOUT, member given up (%s)", tt_errmsg());
	ret = one_io(e, TT_OP_READ, buf, len, 20 * MiB, 0, &res);
	tap_ok(ret == -EIO && res == -EIO, "the member refuses more I/O (%s)", tt_errmsg());
	tt_engine_close(e);
	sleep_ms(RESUME_MS + 300);	/* the held command runs now, DMA included */
	tap_eq(fk.late, 1, "the controller woke up after close and moved the data");
	tap_eq(fk.bad_dma, 0, "into memory that was still pinned (not given back)");
	tap_ok(all_bytes(buf, len, 0x5a), "and not into the caller's memory");
	fk.delete_errno = 0;
	free(buf);
}

/* Store level: a failed put's slot is not overwritten after it is reused. */
static void t_store_slot_reuse(void)
{
	const char *paths[1] = { path };
	struct tt_format_params p;
	struct tt_open_params op = { .engine = "kqueue", .flags = TT_OPEN_NO_VERIFY };
	struct tt_store *s;
	size_t bb = 4 * 2 * 4096;
	uint8_t key[TT_KEY_BYTES], *in = pages(bb), *out = pages(bb);
	int ok = 1, ret;

	memset(&p, 0, sizeof(p));
	strcpy(p.fp.model_id, "test/kq-fence");
	strcpy(p.fp.dtype, "bfloat16");
	p.fp.n_layers = 4;
	p.fp.kv_heads = 2;
	p.fp.head_dim = 64;
	p.fp.block_size = 16;
	p.n_slots = 4;
	p.flags = TT_FORMAT_FORCE;
	fk_reset();
	ret = tt_store_format(paths, 1, &p);
	tap_eq(ret, 0, "format a store on the stand-in: %s", ret ? tt_errmsg() : "ok");
	ret = tt_store_open(paths, 1, &op, &s);
	if (!tap_eq(ret, 0, "open it on kqueue, checksums off: %s", ret ? tt_errmsg() : "ok"))
		return;
	for (unsigned i = 0; i < 4; i++) {
		key_of(i, key);
		fill(in, bb, i);
		ok &= !tt_store_put(s, key, in, bb);
	}
	tap_ok(ok, "fill the store (4 blocks)");
	{
		struct tt_store_info info;

		tt_store_get_info(s, &info);
		fk.stall_from = info.geo.data_off;	/* the block's data, not the slot table */
	}
	fk.stall = 1;
	fk.resume_ms = RESUME_MS;
	key_of(10, key);
	fill(in, bb, 10);
	ret = tt_store_put(s, key, in, bb);
	tap_ok(ret != 0, "a put (evicting block 0) whose writes stall fails (%s)", tt_errmsg());
	fk_mark();
	fk.stall = 0;
	key_of(11, key);
	fill(in, bb, 11);
	tap_eq(tt_store_put(s, key, in, bb), 0, "the next put succeeds (in the slot given back)");
	sleep_ms(RESUME_MS + 300);
	ok = !tt_store_get(s, key, out, bb) && !memcmp(in, out, bb);
	for (unsigned i = 1; i < 4; i++) {
		key_of(i, key);
		fill(in, bb, i);
		ok &= !tt_store_get(s, key, out, bb) && !memcmp(in, out, bb);
	}
	tap_ok(ok, "after the controller would have resumed, the 4 stored blocks read back "
	       "exact (verification off)");
	tap_eq(fk.late, 0, "no stalled write ran after the put returned");
	key_of(10, key);
	tap_eq((unsigned)-tt_store_get(s, key, out, bb), ENOENT, "the failed block is absent");
	tt_store_close(s);
	free(in);
	free(out);
}

/* Every case, or the one named on the command line (to see each fail on old code). */
int main(int argc, char **argv)
{
	const char *only = argc > 1 ? argv[1] : NULL;
	static const struct {
		const char *name;
		void (*fn)(int fd);
	} cases[] = {
		{ "baseline", t_baseline },
		{ "stalled-read", t_stalled_read },
		{ "stalled-write", t_stalled_write },
		{ "two-members", t_two_members },
		{ "unfenced", t_unfenced },
	};
	int fd;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/ns", dir);
	if (fk_node_add(path, 64ull * MiB, 12, 1, 512 * KiB)) {
		printf("not ok 1 - stand-in node: %s\n", strerror(errno));
		return 1;
	}
	setenv("TUTTI_KQ_TIMEOUT_MS", "200", 1);
	if (getenv("TEST_KQ_RESUME_MS"))
		RESUME_MS = (unsigned)atoi(getenv("TEST_KQ_RESUME_MS"));
	fd = open(path, O_RDWR | O_CLOEXEC);
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (!only || !strcmp(only, cases[i].name))
			cases[i].fn(fd);
	close(fd);
	if (!only || !strcmp(only, "store"))
		t_store_slot_reuse();
	fk_node_stop();
	unlink(path);
	rmdir(dir);
	return tap_done();
}
