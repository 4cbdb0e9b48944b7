// SPDX-License-Identifier: Apache-2.0
/*
 * io_uring engine: a batch becomes one io_uring_enter when it fits the ring.
 * Members are registered files; requests whose memory is one registered
 * area use READ_FIXED/WRITE_FIXED, scattered memory uses READV/WRITEV.
 *
 * A read the CPU copies (a member in the page cache or tmpfs) would be
 * copied inline by the submitting thread, one core for the whole batch;
 * such reads go to io_uring's workers (IOSQE_ASYNC), a bounded number
 * (large layers the store reads on its own threads: tt_engine_move_now).
 * Writes stay inline: async they were slower on 2 cores (2.8-3.0 GB/s
 * against 3.7 into tmpfs) and on 16 (3.0-3.4 against 3.5-3.6), a file's
 * buffered writes being serialized by its inode lock anyway (large layers
 * to tmpfs the store copies into the member's mapping on its own threads).
 */
#include <liburing.h>
#include <stdlib.h>
#include <string.h>

#include "tutti/error.h"
#include "engine_impl.h"

#define TT_URING_MAX_AREAS	1024u	/* kernel allows 16K fixed buffers */
#define TT_URING_AREA_MAX	(1ul << 30)	/* kernel limit per fixed buffer */

struct uring_req {
	struct tt_req r;
	struct iovec iov[TT_ENGINE_MAX_IOV];
	struct uring_req *next_free;
};

struct uring {
	struct io_uring ring;
	struct uring_req *reqs;
	struct uring_req *free;
	unsigned unsubmitted;
	struct iovec areas[TT_URING_MAX_AREAS];
	unsigned n_areas;
	int registered;
	int async;				/* reads of cpu_copy members go async */
};

/* Workers for the CPU's copies: none (inline), or at most @want of them. */
static void uring_async_init(struct tt_engine *e, struct uring *u)
{
	unsigned want = e->p.copy_threads, any = 0;
	unsigned max[2];

	for (unsigned i = 0; i < e->n_members; i++)
		any |= e->cpu_copy[i];
	if (!any || want == 1)
		return;
	max[0] = want;	/* bounded: regular-file work */
	max[1] = 0;	/* unbounded: unchanged */
	u->async = io_uring_register_iowq_max_workers(&u->ring, max) == 0;
}

static int uring_init(struct tt_engine *e)
{
	struct uring *u = calloc(1, sizeof(*u));
	unsigned depth = e->p.queue_depth;
	int ret;

	if (!u)
		return tt_seterr(-ENOMEM, "uring: out of memory");
	u->reqs = calloc(depth, sizeof(*u->reqs));
	if (!u->reqs) {
		free(u);
		return tt_seterr(-ENOMEM, "uring: out of memory");
	}
	ret = io_uring_queue_init(depth, &u->ring, 0);
	if (ret < 0) {
		free(u->reqs);
		free(u);
		return tt_seterr(ret, "io_uring unavailable: %s", strerror(-ret));
	}
	ret = io_uring_register_files(&u->ring, e->fds, e->n_members);
	if (ret < 0) {
		io_uring_queue_exit(&u->ring);
		free(u->reqs);
		free(u);
		return tt_seterr(ret, "io_uring file registration: %s", strerror(-ret));
	}
	for (unsigned i = 0; i < depth; i++) {
		u->reqs[i].next_free = u->free;
		u->free = &u->reqs[i];
	}
	uring_async_init(e, u);
	e->priv = u;
	return 0;
}

static void uring_fini(struct tt_engine *e)
{
	struct uring *u = e->priv;

	/* Drop the ring's file references now, not in deferred teardown. */
	io_uring_unregister_files(&u->ring);
	io_uring_queue_exit(&u->ring);
	free(u->reqs);
	free(u);
}

static void uring_finish_req(struct tt_engine *e, struct uring_req *q, int res)
{
	struct uring *u = e->priv;
	struct tt_batch *b = q->r.b;

	/*
	 * Work the kernel hands to io_uring's workers (ours, and a buffered
	 * write that would block) is cancelled when no worker can be started
	 * (RLIMIT_NPROC).  Nothing here cancels: move it with a syscall, and
	 * stop asking for workers.
	 */
	if (res == -ECANCELED) {
		u->async = 0;
		res = tt_req_sync(e, &q->r, 0);
	} else if (res >= 0 && (uint64_t)res < q->r.bytes)
		res = tt_req_sync(e, &q->r, (uint64_t)res);	/* short: finish it */
	else if (res > 0)
		res = 0;
	tt_req_complete(e, &q->r, res);
	b->inflight--;
	q->next_free = u->free;
	u->free = q;
}

static int uring_reap(struct tt_engine *e, int wait)
{
	struct uring *u = e->priv;
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;
	int ret;

	if (u->unsubmitted || wait) {
		ret = io_uring_submit_and_wait(&u->ring, wait ? 1 : 0);
		e->st.syscalls++;
		if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
			return tt_seterr(ret, "io_uring_enter: %s", strerror(-ret));
		if (ret >= 0)
			u->unsubmitted = 0;
	}
	io_uring_for_each_cqe(&u->ring, head, cqe) {
		uring_finish_req(e, io_uring_cqe_get_data(cqe), cqe->res);
		seen++;
	}
	io_uring_cq_advance(&u->ring, seen);
	return (int)seen;
}

/* Index of the registered area holding [p, p+len), or -1. */
static int uring_area(const struct uring *u, const void *p, uint64_t len)
{
	for (unsigned i = 0; u->registered && i < u->n_areas; i++) {
		const char *a = u->areas[i].iov_base;

		if ((const char *)p >= a && (const char *)p + len <= a + u->areas[i].iov_len)
			return (int)i;
	}
	return -1;
}

static void uring_prep(struct tt_engine *e, struct uring_req *q,
		       struct io_uring_sqe *sqe)
{
	struct uring *u = e->priv;
	unsigned niov = tt_req_iov(&q->r, q->iov);
	int rd = q->r.op == TT_OP_READ;
	int area = niov == 1 ? uring_area(u, q->iov[0].iov_base, q->r.bytes) : -1;

	if (area >= 0 && rd)
		io_uring_prep_read_fixed(sqe, q->r.member, q->iov[0].iov_base,
					 (unsigned)q->r.bytes, q->r.off, area);
	else if (area >= 0)
		io_uring_prep_write_fixed(sqe, q->r.member, q->iov[0].iov_base,
					  (unsigned)q->r.bytes, q->r.off, area);
	else if (rd)
		io_uring_prep_readv(sqe, q->r.member, q->iov, niov, q->r.off);
	else
		io_uring_prep_writev(sqe, q->r.member, q->iov, niov, q->r.off);
	sqe->flags |= IOSQE_FIXED_FILE;
	if (rd && u->async && e->cpu_copy[q->r.member])
		sqe->flags |= IOSQE_ASYNC;
	io_uring_sqe_set_data(sqe, q);
}

static int uring_submit(struct tt_engine *e, struct tt_batch *b)
{
	struct uring *u = e->priv;
	int ret;

	while (b->next < b->n) {
		struct io_uring_sqe *sqe;
		struct uring_req *q;

		/* Out of requests or SQEs: push what we have, reap, go on. */
		while (!u->free || !(sqe = io_uring_get_sqe(&u->ring))) {
			ret = uring_reap(e, !u->free);
			if (ret < 0)
				return ret;
			if (u->free && (sqe = io_uring_get_sqe(&u->ring)))
				break;
		}
		q = u->free;
		u->free = q->next_free;
		b->next += tt_next_req(e, b, b->next, &q->r);
		b->reqs++;
		b->inflight++;
		uring_prep(e, q, sqe);
		u->unsubmitted++;
	}
	ret = io_uring_submit(&u->ring);
	e->st.syscalls++;
	if (ret < 0)
		return tt_seterr(ret, "io_uring_submit: %s", strerror(-ret));
	u->unsubmitted = 0;
	return 0;
}

static int uring_reg(struct tt_engine *e, void *addr, size_t len)
{
	struct uring *u = e->priv;
	unsigned before = u->n_areas;
	int ret;

	/* A fixed buffer is at most 1 GiB: register big areas in pieces. */
	for (size_t done = 0; done < len; done += TT_URING_AREA_MAX) {
		if (u->n_areas == TT_URING_MAX_AREAS) {
			u->n_areas = before;
			return tt_seterr(-ENOSPC, "uring: more than %u registered areas",
					 TT_URING_MAX_AREAS);
		}
		u->areas[u->n_areas].iov_base = (char *)addr + done;
		u->areas[u->n_areas].iov_len = (len - done < TT_URING_AREA_MAX ? len - done : TT_URING_AREA_MAX);
		u->n_areas++;
	}
	/* The kernel takes the whole table at once: re-register all areas. */
	if (u->registered)
		io_uring_unregister_buffers(&u->ring);
	ret = io_uring_register_buffers(&u->ring, u->areas, u->n_areas);
	if (ret < 0) {
		int err = ret;

		u->n_areas = before;	/* keep what worked before */
		ret = u->n_areas ? io_uring_register_buffers(&u->ring, u->areas, u->n_areas) : -1;
		u->registered = ret == 0;
		return tt_seterr(err, "io_uring buffer registration: %s (I/O still works)",
				 strerror(-err));
	}
	u->registered = 1;
	return 0;
}

static int uring_probe(const int *fds, unsigned n)
{
	(void)fds;
	(void)n;
	return TT_ENGINE_GENERIC;	/* init says whether io_uring is usable */
}

const struct tt_engine_ops tt_uring_ops = {
	.name = "uring",
	.probe = uring_probe,
	.init = uring_init,
	.fini = uring_fini,
	.submit = uring_submit,
	.reap = uring_reap,
	.reg = uring_reg,
	.preads = 1,
};
