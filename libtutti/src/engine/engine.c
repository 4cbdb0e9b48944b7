// SPDX-License-Identifier: Apache-2.0
/* Engine dispatch and the request logic every engine shares. */
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <unistd.h>
#include <sys/stat.h>

#include "tutti/error.h"
#include "engine_impl.h"
#include "../support/util.h"
#include "../support/workers.h"

/* Engines made known at run time (a wrapper engine, a test's), after the table's. */
static const struct tt_engine_ops *added[TT_ENGINE_MAX_ADDED];
static unsigned n_added;

int tt_engine_add(const struct tt_engine_ops *ops)
{
	if (!ops || !ops->name || !ops->init || !ops->fini || !ops->submit || !ops->reap)
		return tt_seterr(-EINVAL, "engine: incomplete operations");
	if (tt_engine_find(ops->name))
		return tt_seterr(-EEXIST, "engine '%s' is known already", ops->name);
	if (n_added == TT_ENGINE_MAX_ADDED)
		return tt_seterr(-ENOSPC, "engine: more than %u added engines", TT_ENGINE_MAX_ADDED);
	added[n_added++] = ops;
	return 0;
}

/* The i-th known engine: the table's, then the added ones; NULL past the end. */
static const struct tt_engine_ops *nth_engine(unsigned i)
{
	unsigned n_table = 0;

	while (tt_engines[n_table])
		n_table++;
	if (i < n_table)
		return tt_engines[i];
	return i - n_table < n_added ? added[i - n_table] : NULL;
}

const struct tt_engine_ops *tt_engine_find(const char *name)
{
	const struct tt_engine_ops *ops;

	for (unsigned i = 0; (ops = nth_engine(i)); i++)
		if (!strcmp(ops->name, name))
			return ops;
	return NULL;
}

static int unknown_engine(const char *name)
{
	const struct tt_engine_ops *ops;
	char names[128] = "";

	for (unsigned i = 0; (ops = nth_engine(i)); i++) {
		strncat(names, ops->name, sizeof(names) - strlen(names) - 1);
		strncat(names, ", ", sizeof(names) - strlen(names) - 1);
	}
	return tt_seterr(-EINVAL, "unknown engine '%s' (%sauto)", name, names);
}

int tt_fd_cpu_copies(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return (fl >= 0 && !(fl & O_DIRECT)) || tt_fd_on_ram(fd);
}

static int init_engine(struct tt_engine *e, const struct tt_engine_ops *ops)
{
	e->ops = ops;
	e->priv = NULL;
	for (unsigned i = 0; i < e->n_members; i++)
		e->cpu_copy[i] = ops->preads && tt_fd_cpu_copies(e->fds[i]);
	return ops->init(e);
}

/*
 * "auto": the engines the members are native to if any claims them (kqueue
 * for tutti.ko nodes; no generic engine is tried after them), else the
 * generic ones; in table order, the first that initialises (uring, then
 * psync where io_uring is disabled).
 */
static int init_auto(struct tt_engine *e, const int *fds, unsigned n)
{
	const struct tt_engine_ops *ops;
	int want = TT_ENGINE_GENERIC, ret = 0;
	bool tried = false;

	for (unsigned i = 0; (ops = nth_engine(i)); i++)
		if (ops->probe && ops->probe(fds, n) == TT_ENGINE_NATIVE)
			want = TT_ENGINE_NATIVE;
	for (unsigned i = 0; (ops = nth_engine(i)); i++) {
		if (!ops->probe || ops->probe(fds, n) != want)
			continue;
		tried = true;
		ret = init_engine(e, ops);
		if (!ret)
			return 0;
	}
	return tried ? ret : tt_seterr(-ENODEV, "engine: none serves these members");
}

int tt_engine_open(const char *name, const int *fds, unsigned n,
		   const struct tt_engine_params *params, struct tt_engine **out)
{
	if (tt_fault_wanted(name))	/* fault.c: "fault:INNER" or TUTTI_FAULTS */
		return tt_fault_engine_open(name, fds, n, params, out);
	return tt_engine_open_plain(name, fds, n, params, out);
}

int tt_engine_open_plain(const char *name, const int *fds, unsigned n,
			 const struct tt_engine_params *params, struct tt_engine **out)
{
	const struct tt_engine_ops *ops = NULL;
	int auto_pick = !name || !*name || !strcmp(name, "auto");
	struct tt_engine *e;
	int ret;

	if (!n || n > TT_MAX_ENGINE_MEMBERS)
		return tt_seterr(-EINVAL, "engine: %u members (1..%u supported)", n,
				 TT_MAX_ENGINE_MEMBERS);
	if (!auto_pick) {
		ops = tt_engine_find(name);
		if (!ops)
			return unknown_engine(name);
	}
	e = calloc(1, sizeof(*e));
	if (!e)
		return tt_seterr(-ENOMEM, "engine: out of memory");
	memcpy(e->fds, fds, n * sizeof(*fds));
	e->n_members = n;
	if (params)
		e->p = *params;
	if (!e->p.queue_depth)
		e->p.queue_depth = TT_ENGINE_DEFAULT_DEPTH;
	if (!e->p.max_req_bytes)
		e->p.max_req_bytes = TT_ENGINE_DEFAULT_REQ_BYTES;
	if (!e->p.min_reqs)
		e->p.min_reqs = TT_ENGINE_DEFAULT_MIN_REQS;
	if (e->p.queue_depth > 32768)
		e->p.queue_depth = 32768;
	if (!e->p.copy_threads)
		e->p.copy_threads = tt_workers_auto();

	ret = auto_pick ? init_auto(e, fds, n) : init_engine(e, ops);
	if (ret) {
		free(e);
		return ret;
	}
	tt_engine_map_members(e);
	*out = e;
	return 0;
}

void tt_engine_close(struct tt_engine *e)
{
	if (!e)
		return;
	e->ops->fini(e);
	tt_engine_unmap_members(e);
	free(e);
}

const char *tt_engine_name(const struct tt_engine *e)
{
	return e->ops->name;
}

int tt_engine_register(struct tt_engine *e, void *addr, size_t len)
{
	return e->ops->reg ? e->ops->reg(e, addr, len) : 0;
}

/*
 * Merging adjacent objects saves syscalls and per-request cost, but a
 * small batch merged into a few huge requests leaves the device idle
 * (SSDs and virtual disks alike need many requests in flight).  So a batch
 * is spread over at least min_reqs requests, each no smaller than
 * TT_ENGINE_MIN_REQ_BYTES and no larger than max_req_bytes.
 */
static uint32_t batch_req_cap(const struct tt_engine *e, const struct tt_batch *b)
{
	uint64_t total = 0, cap;

	for (uint32_t i = 0; i < b->n; i++)
		total += b->ios[i].len;
	cap = total / e->p.min_reqs;
	if (cap < TT_ENGINE_MIN_REQ_BYTES)
		cap = TT_ENGINE_MIN_REQ_BYTES;
	if (cap > e->p.max_req_bytes)
		cap = e->p.max_req_bytes;
	return (uint32_t)cap;
}

int tt_engine_submit(struct tt_engine *e, struct tt_batch *b)
{
	b->req_cap = batch_req_cap(e, b);
	b->next = 0;
	b->inflight = 0;
	b->err = 0;
	b->reqs = 0;
	for (uint32_t i = 0; i < b->n; i++)
		b->ios[i].res = 1;	/* pending */
	if (!b->n)
		return 0;
	return e->ops->submit(e, b);
}

int tt_engine_wait(struct tt_engine *e, struct tt_batch *b)
{
	while (b->inflight) {
		int ret = e->ops->reap(e, 1);

		if (ret < 0)
			return ret;
	}
	return b->err;
}

int tt_engine_done(struct tt_engine *e, struct tt_batch *b)
{
	if (b->inflight)
		e->ops->reap(e, 0);
	return b->inflight == 0;
}

int tt_engine_flush(struct tt_engine *e)
{
	if (e->ops->flush)
		return e->ops->flush(e);
	for (unsigned m = 0; m < e->n_members; m++) {
		if (fdatasync(e->fds[m]))
			return tt_seterr(-errno, "flush of member %u failed: %s", m,
					 strerror(errno));
	}
	e->st.flushes++;
	e->st.syscalls += e->n_members;
	return 0;
}

void tt_engine_get_stats(const struct tt_engine *e, struct tt_engine_stats *st)
{
	*st = e->st;
}

int tt_engine_cpu_reads(const struct tt_engine *e, unsigned m)
{
	return m < e->n_members && e->cpu_copy[m];
}

int tt_engine_cpu_writes(const struct tt_engine *e, unsigned m)
{
	return m < e->n_members && e->map_wr[m];
}

unsigned tt_next_req(const struct tt_engine *e, struct tt_batch *b, unsigned i,
		     struct tt_req *r)
{
	const struct tt_io *io = &b->ios[i];
	uint64_t end = io->off + io->len;
	unsigned j = i + 1;

	(void)e;	/* limits are per batch (req_cap), set at submit */

	r->b = b;
	r->first = i;
	r->member = io->member;
	r->op = io->op;
	r->off = io->off;
	r->bytes = io->len;
	while (j < b->n && j - i < TT_ENGINE_MAX_IOV) {
		const struct tt_io *nx = &b->ios[j];

		if (nx->member != io->member || nx->op != io->op || nx->off != end ||
		    r->bytes + nx->len > b->req_cap)
			break;
		end += nx->len;
		r->bytes += nx->len;
		j++;
	}
	r->count = j - i;
	return r->count;
}

unsigned tt_req_iov(const struct tt_req *r, struct iovec *iov)
{
	const struct tt_io *ios = &r->b->ios[r->first];
	unsigned n = 0;

	for (uint32_t k = 0; k < r->count; k++) {
		if (n && (char *)iov[n - 1].iov_base + iov[n - 1].iov_len == (char *)ios[k].buf) {
			iov[n - 1].iov_len += ios[k].len;
			continue;
		}
		iov[n].iov_base = ios[k].buf;
		iov[n].iov_len = ios[k].len;
		n++;
	}
	return n;
}

/*
 * An error a device gives for part of a range (a bad sector, a failed
 * write): the errnos of NVMe status codes through tutti.ko (-EIO) and of the
 * block layer (-ENODATA medium, -EILSEQ protection, -EREMOTEIO target,
 * -ENOSPC).  Not the member's own end: a fence's -ETIMEDOUT, a gone device.
 */
static bool partial_error(int res)
{
	return res == -EIO || res == -ENODATA || res == -EILSEQ || res == -EREMOTEIO ||
	       res == -ENOSPC;
}

/*
 * A device fails a whole command, so ios merged into one request would all
 * take the error of one bad sector, blocks that touch it or not.  Each io of
 * such a request is moved again on its own, synchronously (an error path:
 * the device is done with the request's memory), and gets its own verdict.
 */
static void complete_each(struct tt_engine *e, const struct tt_req *r)
{
	for (uint32_t k = 0; k < r->count; k++) {
		const struct tt_io *io = &r->b->ios[r->first + k];
		struct tt_req one = *r;

		one.first = r->first + k;
		one.count = 1;
		one.off = io->off;
		one.bytes = io->len;
		tt_req_complete(e, &one, tt_req_sync(e, &one, 0));
	}
}

void tt_req_complete(struct tt_engine *e, const struct tt_req *r, int res)
{
	struct tt_batch *b = r->b;

	if (res < 0 && r->count > 1 && partial_error(res)) {
		complete_each(e, r);
		return;
	}

	for (uint32_t k = 0; k < r->count; k++)
		b->ios[r->first + k].res = res;
	if (res < 0 && !b->err)
		b->err = res;
	if (res == 0) {
		e->st.ios += r->count;
		if (r->op == TT_OP_READ)
			e->st.bytes_read += r->bytes;
		else
			e->st.bytes_written += r->bytes;
	}
	e->st.reqs++;
}

static void iov_advance(struct iovec *iov, unsigned n, unsigned *k, uint64_t bytes)
{
	while (bytes && *k < n) {
		if (bytes < iov[*k].iov_len) {
			iov[*k].iov_base = (char *)iov[*k].iov_base + bytes;
			iov[*k].iov_len -= bytes;
			return;
		}
		bytes -= iov[*k].iov_len;
		(*k)++;
	}
}

/*
 * preadv/pwritev @iov (@n entries, @bytes in all) at @off until every byte
 * moved, counting the system calls in @calls; 0 or -errno.
 */
static int iov_move(int fd, int write, struct iovec *iov, unsigned n, uint64_t bytes,
		    uint64_t off, uint64_t *calls)
{
	uint64_t done = 0;
	unsigned k = 0;

	while (done < bytes) {
		int cnt = (int)TT_MIN(n - k, (unsigned)IOV_MAX);
		ssize_t got = write ? pwritev(fd, &iov[k], cnt, (off_t)(off + done))
				    : preadv(fd, &iov[k], cnt, (off_t)(off + done));

		(*calls)++;
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return got < 0 ? -errno : -EIO;	/* 0: past the member's end */
		done += (uint64_t)got;
		iov_advance(iov, n, &k, (uint64_t)got);
	}
	return 0;
}

int tt_req_sync(struct tt_engine *e, const struct tt_req *r, uint64_t done)
{
	struct iovec iov[TT_ENGINE_MAX_IOV];
	unsigned n = tt_req_iov(r, iov);
	uint64_t calls = 0;
	unsigned k = 0;
	int ret;

	iov_advance(iov, n, &k, done);
	ret = iov_move(e->fds[r->member], r->op != TT_OP_READ, &iov[k], n - k, r->bytes - done,
		       r->off + done, &calls);
	e->st.syscalls += calls;
	return ret;
}

/* Are @ios a run tt_engine_move_now() takes? If not, every res is -EINVAL. */
static bool run_ok(const struct tt_engine *e, struct tt_io *ios, unsigned n, uint64_t *out)
{
	uint64_t bytes = 0;
	int wr;

	if (!n || n > TT_ENGINE_MAX_IOV)
		return false;
	wr = ios[0].op == TT_OP_WRITE;
	for (unsigned k = 0; k < n; k++) {
		if (ios[k].op != ios[0].op || ios[k].member != ios[0].member ||
		    ios[k].off != ios[0].off + bytes ||
		    !(wr ? tt_engine_cpu_writes(e, ios[k].member) :
			   ios[k].op == TT_OP_READ && tt_engine_cpu_reads(e, ios[k].member))) {
			for (unsigned j = 0; j < n; j++)
				ios[j].res = -EINVAL;
			return false;
		}
		bytes += ios[k].len;
	}
	*out = bytes;
	return true;
}

static void count_moved(struct tt_engine *e, const struct tt_io *ios, unsigned n, int wr,
			uint64_t calls, uint64_t moved)
{
	/* Other threads count at once: the counters are added atomically. */
	__atomic_add_fetch(&e->st.syscalls, calls, __ATOMIC_RELAXED);
	__atomic_add_fetch(&e->st.reqs, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&e->st.ios, moved, __ATOMIC_RELAXED);
	for (unsigned k = 0; k < n; k++)
		if (!ios[k].res)
			__atomic_add_fetch(wr ? &e->st.bytes_written : &e->st.bytes_read, ios[k].len,
					   __ATOMIC_RELAXED);
}

const char *tt_engine_map_read(struct tt_engine *e, struct tt_io *ios, unsigned n)
{
	uint64_t bytes, calls = 0;
	const char *p;

	if (!e->map_stream || !n || ios[0].op != TT_OP_READ || !run_ok(e, ios, n, &bytes))
		return NULL;
	p = tt_engine_map_run(e, ios, 0, bytes, &calls);
	if (!p)
		return NULL;
	for (unsigned k = 0; k < n; k++)
		ios[k].res = 0;
	count_moved(e, ios, n, 0, calls, n);
	return p;
}

int tt_engine_move_now(struct tt_engine *e, struct tt_io *ios, unsigned n)
{
	struct iovec iov[TT_ENGINE_MAX_IOV];
	uint64_t bytes, calls = 0, moved = 0;
	int wr, res = 0;

	if (!run_ok(e, ios, n, &bytes))
		return -EINVAL;
	wr = ios[0].op == TT_OP_WRITE;
	for (unsigned k = 0; k < n; k++) {
		iov[k].iov_base = ios[k].buf;
		iov[k].iov_len = ios[k].len;
	}
	if (tt_engine_map_move(e, ios, n, wr, bytes, &calls))
		res = iov_move(e->fds[ios[0].member], wr, iov, n, bytes, ios[0].off, &calls);
	for (unsigned k = 0; k < n; k++)
		ios[k].res = res;
	if (!res)
		moved = n;
	else if (n > 1) {
		/* A whole run takes one bad range's error: each io on its own. */
		res = 0;
		for (unsigned k = 0; k < n; k++) {
			iov[0].iov_base = ios[k].buf;
			iov[0].iov_len = ios[k].len;
			ios[k].res = iov_move(e->fds[ios[k].member], wr, iov, 1, ios[k].len,
					      ios[k].off, &calls);
			if (ios[k].res && !res)
				res = ios[k].res;
			moved += !ios[k].res;
		}
	}
	count_moved(e, ios, n, wr, calls, moved);
	return res;
}
