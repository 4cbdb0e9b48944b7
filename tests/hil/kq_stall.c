// SPDX-License-Identifier: Apache-2.0
/*
 * Description: a stalled command in the HIL guest.  The guest asks the
 * host harness (a "HIL-QMP <json>" line on the results port: run-qemu.sh
 * forwards it to QEMU's QMP socket) to throttle the controller's drive, so
 * that one read takes seconds while the guest keeps running.  QEMU's Delete
 * SQ waits for the throttled request (it cancels synchronously), like a
 * controller that finishes an old command before it acknowledges the
 * delete.
 *   stall NS DRIVE        the kqueue engine times out, fences (deletes the
 *                         queue) and only then fails the read: nothing lands
 *                         in the caller's memory after the wait returned,
 *                         the member serves again
 *   stall-kill NS BDF DRIVE  the module's own command times out while the
 *                         engine's read is in flight: the controller is
 *                         disabled and confirmed stopped; the engine's fence
 *                         sees that (or the reset completes the read with an
 *                         error first); nothing lands, pins given back
 *   pause NS DRIVE        QEMU stopped (QMP stop/cont) while a command is in
 *                         flight: the guest does not see the pause, no
 *                         spurious timeout, exact bytes
 * Only the engine API and the older tt_k* calls are used, so this builds
 * against an older libtutti too (LIBTUTTI=...: the before/after runs).
 */
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "tutti/engine.h"
#include "tutti/error.h"
#include "tutti/kqueue.h"
#include "hil.h"

#define MiB		(1ul << 20)
#define STALL_OFF	(200 * MiB)	/* scratch LBAs, far from a store's metadata */
#define LEN		(256u << 10)
#define ENGINE_TMO_MS	"2000"
#define BPS_RD		65536	/* a 256 KiB read then waits ~4 s for the bucket */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void qmp(const char *json)
{
	printf("HIL-QMP %s\n", json);
	fflush(stdout);
}

/*
 * Throttle reads of @drive to @bps bytes/s (0: off), then wait @settle_ms for
 * the host to act on it (it polls the results port every 0.2 s).
 */
static void throttle(const char *drive, long bps, unsigned settle_ms)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd),
		 "{\"execute\":\"block_set_io_throttle\",\"arguments\":{\"device\":\"%s\","
		 "\"bps\":0,\"bps_rd\":%ld,\"bps_wr\":0,\"iops\":0,\"iops_rd\":0,\"iops_wr\":0}}",
		 drive, bps);
	qmp(cmd);
	usleep(settle_ms * 1000u);
}

struct rig {
	int fd;
	struct tt_engine *e;
	uint8_t *buf, *want;
};

/* The kqueue engine on @node with a @timeout_ms stall timeout, the data written. */
static void rig_open(struct rig *r, const char *node, const char *timeout_ms)
{
	struct tt_engine_params ep = { .queue_depth = 64 };
	struct tt_io io;
	struct tt_batch b = { .ios = &io, .n = 1 };

	setenv("TUTTI_KQ_TIMEOUT_MS", timeout_ms, 1);
	r->fd = open(node, O_RDWR | O_CLOEXEC);
	if (r->fd < 0 || tt_engine_open("kqueue", &r->fd, 1, &ep, &r->e))
		bail("engine on %s: %s", node, tt_errmsg());
	r->buf = hil_pages(LEN);
	r->want = hil_pages(LEN);
	if (tt_engine_register(r->e, r->buf, LEN) || tt_engine_register(r->e, r->want, LEN))
		bail("register: %s", tt_errmsg());
	fill(r->want, LEN, 99);
	io = (struct tt_io){ .buf = r->want, .off = STALL_OFF, .len = LEN, .op = TT_OP_WRITE };
	if (tt_engine_submit(r->e, &b) || tt_engine_wait(r->e, &b) || io.res)
		bail("write the data: %s", tt_errmsg());
}

/* One read of the data into r->buf; returns the wait's result. */
static int rig_read(struct rig *r, int32_t *res)
{
	struct tt_io io = { .buf = r->buf, .off = STALL_OFF, .len = LEN, .op = TT_OP_READ };
	struct tt_batch b = { .ios = &io, .n = 1 };
	int ret = tt_engine_submit(r->e, &b);

	if (!ret)
		ret = tt_engine_wait(r->e, &b);
	*res = io.res;
	return ret;
}

/* Fill the throttle's bucket through the module's own queue (pread). */
static void prime(struct rig *r)
{
	uint8_t *tmp = hil_pages(LEN);

	if (pread(r->fd, tmp, LEN, STALL_OFF + LEN) != LEN)
		printf("# primer read: %s\n", strerror(errno));
	munmap(tmp, LEN);
}

static int all_bytes(const uint8_t *p, size_t len, uint8_t v)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

static int t_stall(const char *node, const char *drive)
{
	struct rig r;
	double t0, dt;
	int32_t res;
	int ret;

	rig_open(&r, node, ENGINE_TMO_MS);
	throttle(drive, BPS_RD, 1500);
	prime(&r);
	t0 = now_s();
	ret = rig_read(&r, &res);
	dt = now_s() - t0;
	memset(r.buf, 0x5a, LEN);	/* the caller reuses the memory at once */
	check(ret == -ETIMEDOUT && res == -ETIMEDOUT,
	      "stall: the throttled read fails with -ETIMEDOUT after %.1f s (guest clock): %s",
	      dt, tt_errmsg());
	check(strstr(tt_errmsg(), "queue deleted") != NULL,
	      "stall: the engine deleted the queue before failing the read (fence)");
	/* Unfenced, the read would land ~2 s after the wait returned (the bucket's delay). */
	throttle(drive, 0, 3000);
	check(all_bytes(r.buf, LEN, 0x5a),
	      "stall: nothing was written into the read's memory after the wait returned");
	memset(r.buf, 0, LEN);
	check(!rig_read(&r, &res) && !res && !memcmp(r.buf, r.want, LEN),
	      "stall: the member serves again (new queue), exact bytes");
	tt_engine_close(r.e);
	close(r.fd);
	return 0;
}

static int set_cmd_timeout(long ms)
{
	FILE *f = fopen("/sys/module/tutti/parameters/cmd_timeout_ms", "w");

	if (!f)
		return -1;
	fprintf(f, "%ld\n", ms);
	return fclose(f);
}

struct kill_arg {
	int fd;
	ssize_t got;
	int err;
};

/* A read through the module's own queue (pread on the node), behind the engine's. */
static void *kill_pread(void *p)
{
	struct kill_arg *a = p;
	uint8_t *tmp = hil_pages(4096);

	usleep(300000);
	a->got = pread(a->fd, tmp, 4096, STALL_OFF + 2 * LEN);
	a->err = errno;
	munmap(tmp, 4096);
	return NULL;
}

/*
 * The module's own command times out (cmd_timeout_ms=200) while the
 * engine's read is in flight: the module disables the controller, waits
 * for CSTS.RDY=0 and turns bus mastering off.  The engine then times out,
 * its delete reports the controller stopped, and it fails the read: no
 * byte lands afterwards, everything pinned is given back at close.
 */
static int t_stall_kill(const char *node, const char *bdf, const char *drive)
{
	struct kill_arg ka = { 0 };
	pthread_t t;
	struct rig r;
	double t0, dt;
	int32_t res;
	int ret, fenced, exact;

	rig_open(&r, node, "3000");
	ka.fd = r.fd;
	if (set_cmd_timeout(200))
		bail("cmd_timeout_ms: %s", strerror(errno));
	throttle(drive, BPS_RD, 1500);
	prime(&r);
	pthread_create(&t, NULL, kill_pread, &ka);
	t0 = now_s();
	ret = rig_read(&r, &res);
	dt = now_s() - t0;
	exact = ret == 0 && res == 0 && !memcmp(r.buf, r.want, LEN);
	memset(r.buf, 0x5a, LEN);
	pthread_join(t, NULL);
	set_cmd_timeout(30000);
	check(ka.got < 0 && ka.err == EIO, "stall-kill: the module's own read timed out: %s",
	      strerror(ka.err));
	/*
	 * Either the engine fenced (its delete found the controller stopped), or
	 * the controller, being reset, posted an error completion for the read
	 * first (QEMU does, at times): completed, the command moves no more data.
	 * A failed request of several ios is then moved again io by io through
	 * the node (engine.c, complete_each), which the dead controller fails
	 * with an errno of its own (EIO or ENODEV): any error will do here, as
	 * long as the read is not reported done.
	 */
	fenced = ret == -ETIMEDOUT && res == -ETIMEDOUT &&
		 strstr(tt_errmsg(), "disabled and stopped") != NULL;
	/*
	 * Or the read's data had moved and QEMU completed it as the reset began
	 * (seen in CI rehearsals): done before the controller stopped, with the
	 * stored bytes.  What must never happen is a success with other bytes.
	 */
	check(fenced || (ret < 0 && res < 0 && ret != -ETIMEDOUT) || exact,
	      "stall-kill: the engine's read ended safely, %s (%.1f s; wait %d, io %d): %s",
	      fenced ? "fenced: its queue was proven stopped" :
	      exact ? "completed with the stored bytes before the controller stopped" :
		      "completed with an error by the controller's reset", dt, ret, res,
	      tt_errmsg());
	throttle(drive, 0, 1000);
	check(all_bytes(r.buf, LEN, 0x5a),
	      "stall-kill: nothing was written into the read's memory after the wait returned");
	if (!fenced)	/* the queue died with the controller: this read finds that out */
		printf("# stall-kill: next read: %d (%s)\n", rig_read(&r, &res), tt_errmsg());
	check(rig_read(&r, &res) == -EIO && strstr(tt_errmsg(), "no queue"),
	      "stall-kill: the member has no queue now (%s)", tt_errmsg());
	tt_engine_close(r.e);
	close(r.fd);
	check(sysfs_long(bdf, "user_queues") == 0 && sysfs_long(bdf, "pinned_pages") == 0,
	      "stall-kill: rings and pins given back (user_queues %ld, pinned_pages %ld)",
	      sysfs_long(bdf, "user_queues"), sysfs_long(bdf, "pinned_pages"));
	return 0;
}

static int t_pause(const char *node, const char *drive)
{
	struct rig r;
	double t0, dt;
	int32_t res;
	int ret;

	rig_open(&r, node, "4000");
	throttle(drive, BPS_RD * 2, 1500);	/* the read takes ~2 s (host time) */
	prime(&r);
	qmp("{\"hil\":\"pause\",\"ms\":3000,\"after_ms\":300}");
	t0 = now_s();
	ret = rig_read(&r, &res);
	dt = now_s() - t0;
	check(!ret && !res && !memcmp(r.buf, r.want, LEN),
	      "pause: QEMU stopped for 3 s with the read in flight: no timeout, exact bytes "
	      "(%.1f s on the guest clock)", dt);
	throttle(drive, 0, 1000);
	tt_engine_close(r.e);
	close(r.fd);
	return 0;
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(cmd, "stall") && argc == 4)
		return t_stall(argv[2], argv[3]) || tap_failed;
	if (!strcmp(cmd, "stall-kill") && argc == 5)
		return t_stall_kill(argv[2], argv[3], argv[4]) || tap_failed;
	if (!strcmp(cmd, "pause") && argc == 4)
		return t_pause(argv[2], argv[3]) || tap_failed;
	fprintf(stderr, "usage: %s stall NS DRIVE | stall-kill NS BDF DRIVE | pause NS DRIVE\n",
		argv[0]);
	return 2;
}
