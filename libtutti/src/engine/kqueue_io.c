// SPDX-License-Identifier: Apache-2.0
/*
 * kqueue engine, the I/O half (kqueue.c sets up and tears down): requests
 * become NVMe commands (kq_issue), completions are polled (tt_kq_reap), and
 * a member whose commands stop completing is fenced (kq_fence): see the
 * top of kqueue.c.
 */
#include <sched.h>
#include <string.h>

#include "tutti/error.h"
#include "kqueue_impl.h"
#include "../support/util.h"

static void kq_ring(struct tt_engine *e)
{
	struct kq *k = e->priv;

	for (unsigned i = 0; i < e->n_members; i++) {
		if (k->m[i].unrung && k->m[i].qp) {
			tt_sq_ring_doorbell(&k->m[i].qp->sq);
			k->m[i].unrung = 0;
		}
	}
}

/* Copy between a request's memory and a bounce slot. */
static void kq_copy(struct kq_req *q, uint64_t off, char *bounce, uint32_t len, int to_bounce)
{
	for (unsigned i = 0; i < q->niov && len; i++) {
		char *base = q->iov[i].iov_base;
		size_t l = q->iov[i].iov_len, n;

		if (off >= l) {
			off -= l;
			continue;
		}
		n = TT_MIN(l - off, (size_t)len);
		if (to_bounce)
			memcpy(bounce, base + off, n);
		else
			memcpy(base + off, bounce, n);
		bounce += n;
		len -= (uint32_t)n;
		off = 0;
	}
}

static void kq_finish_req(struct tt_engine *e, struct kq_req *q)
{
	struct kq *k = e->priv;

	tt_req_complete(e, &q->r, q->res);
	q->r.b->inflight--;
	q->next_free = k->free_reqs;
	k->free_reqs = q;
}

static int kq_reap_member(struct tt_engine *e, struct kq_member *m)
{
	struct kq *k = e->priv;
	const struct tt_nvme_cqe *cqe;
	int seen = 0;

	while ((cqe = tt_cq_peek(&m->qp->cq))) {
		uint16_t status = tt_nvme_cqe_status(cqe);
		struct kq_cmd *c;
		struct kq_req *q;

		tt_sq_update_head(&m->qp->sq, cqe->sq_head);
		if (cqe->cid >= m->ncmds || !m->cmds[cqe->cid].req) {
			tt_cq_advance(&m->qp->cq);
			continue;	/* not ours: ignore */
		}
		c = &m->cmds[cqe->cid];
		q = c->req;
		if (status && !q->res)
			q->res = status == TT_NVME_SC_LBA_RANGE ? -ERANGE : -EIO;
		if (c->bounce >= 0) {
			if (!status && q->r.op == TT_OP_READ)
				kq_copy(q, c->req_off, k->bounce + (size_t)c->bounce * k->max_cmd,
					c->len, 0);
			k->bounce_free[k->n_bounce_free++] = c->bounce;
		}
		c->req = NULL;
		c->next_free = m->free;
		m->free = c;
		m->inflight--;
		tt_cq_advance(&m->qp->cq);
		seen++;
		if (--q->pending == 0 && q->all_issued)
			kq_finish_req(e, q);
	}
	if (seen) {
		tt_cq_ring_doorbell(&m->qp->cq);
		m->progress_ms = kq_now_ms();
	}
	return seen;
}

/* Take command @c off member @m: its request loses a pending command. */
static void kq_cmd_drop(struct tt_engine *e, struct kq_member *m, struct kq_cmd *c,
			int res, int slot_reusable)
{
	struct kq *k = e->priv;
	struct kq_req *q = c->req;

	if (!q->res)
		q->res = res;
	if (c->bounce >= 0 && slot_reusable)
		k->bounce_free[k->n_bounce_free++] = c->bounce;
	c->req = NULL;
	m->inflight--;
	if (--q->pending == 0 && q->all_issued)
		kq_finish_req(e, q);
}

/*
 * Member @mi has commands in flight and none completed for timeout_ms: its
 * controller stalled (or a command was lost).  Fence, then fail: delete the
 * queue first (the module's Delete SQ returns once the controller finished
 * or aborted every command of it, or was disabled and stopped), and only
 * then fail the commands with -ETIMEDOUT and release their requests, bounce
 * slots and list pages; then make a new queue.  Without the proof, the
 * commands are failed but their bounce slots and the member's list pages
 * are never reused, and the member takes no more requests.
 *
 * Return: commands failed (> 0: progress for tt_kq_reap()).
 */
static int kq_fence(struct tt_engine *e, unsigned mi)
{
	struct kq *k = e->priv;
	struct kq_member *m = &k->m[mi];
	unsigned stalled = m->inflight;
	int del, stopped;

	del = tt_kqp_delete(m->qp);
	m->qp = NULL;
	stopped = tt_kqp_stopped(del);
	for (unsigned c = 0; c < m->ncmds; c++)
		if (m->cmds[c].req)
			kq_cmd_drop(e, m, &m->cmds[c], -ETIMEDOUT, stopped);
	m->unrung = 0;
	if (!stopped) {
		m->quarantined = 1;
		m->lost = -EIO;
		k->bounce_quarantined = 1;
		tt_seterr(-ETIMEDOUT, "kqueue: member %u: %u command(s) got no completion for "
			  "%llu ms and its queue could not be proven stopped (%s): member given up",
			  mi, stalled, (unsigned long long)k->timeout_ms, strerror(-del));
		return (int)stalled;
	}
	m->free = NULL;
	for (unsigned c = m->ncmds; c-- > 0;) {
		m->cmds[c].next_free = m->free;
		m->free = &m->cmds[c];
	}
	m->lost = tt_kq_member_queue(k, mi);
	m->progress_ms = kq_now_ms();
	tt_seterr(-ETIMEDOUT, "kqueue: member %u: %u command(s) got no completion for %llu ms: "
		  "queue deleted (%s), commands failed, %s%s", mi, stalled,
		  (unsigned long long)k->timeout_ms,
		  del ? "controller disabled and stopped" : "controller finished or aborted them",
		  m->lost ? "no new queue: " : "new queue made",
		  m->lost ? strerror(-m->lost) : "");
	return (int)stalled;
}

/* Fence every member whose commands got no completion for timeout_ms. */
static int kq_fence_stalled(struct tt_engine *e)
{
	struct kq *k = e->priv;
	uint64_t now = kq_now_ms();
	int n = 0;

	for (unsigned i = 0; i < e->n_members; i++) {
		struct kq_member *m = &k->m[i];

		if (m->inflight && m->qp && now - m->progress_ms >= k->timeout_ms)
			n += kq_fence(e, i);
	}
	return n;
}

/*
 * Process completions; with @wait, until at least one command completed
 * (or was failed by a fence).
 * Never fails: a member that stops answering is fenced (kq_fence()), which
 * finishes its requests with -ETIMEDOUT, so every wait is bounded by about
 * timeout_ms plus the module's delete.
 */
int tt_kq_reap(struct tt_engine *e, int wait)
{
	struct kq *k = e->priv;
	unsigned spins = 0;

	kq_ring(e);
	for (;;) {
		unsigned busy = 0;
		int seen = 0;

		for (unsigned i = 0; i < e->n_members; i++) {
			struct kq_member *m = &k->m[i];

			if (!m->inflight || !m->qp)
				continue;
			busy++;
			seen += kq_reap_member(e, m);
		}
		if (seen || !busy)
			return seen;
		if (!wait || ++spins > 64) {
			seen = kq_fence_stalled(e);
			if (seen || !wait)
				return seen;
			sched_yield();
		}
	}
}

/*
 * Describe [off, off + len) of the request's memory as bus segments, if
 * it all lies in registered areas.  Return: segment count, 0 if not.
 */
static unsigned kq_segs(struct kq *k, struct kq_req *q, unsigned mi, uint64_t off,
			uint32_t len)
{
	unsigned n = 0;

	for (unsigned i = 0; i < q->niov && len; i++) {
		char *p = q->iov[i].iov_base;
		size_t l = q->iov[i].iov_len;
		const struct kq_area *a = NULL;

		if (off >= l) {
			off -= l;
			continue;
		}
		p += off;
		l = TT_MIN(l - off, (size_t)len);
		off = 0;
		for (unsigned j = 0; j < k->n_areas; j++) {
			if (p >= k->areas[j].base && p + l <= k->areas[j].base + k->areas[j].len &&
			    k->areas[j].bus[mi]) {
				a = &k->areas[j];
				break;
			}
		}
		if (!a)
			return 0;
		len -= (uint32_t)l;
		while (l) {
			size_t pg = (size_t)(p - a->base) / KQ_PAGE;
			uint32_t in = (uint32_t)((size_t)(p - a->base) % KQ_PAGE);
			uint32_t chunk = (uint32_t)TT_MIN((size_t)(KQ_PAGE - in), l);
			uint64_t bus = a->bus[mi][pg] + in;

			if (n && k->segs[n - 1].addr + k->segs[n - 1].len == bus) {
				k->segs[n - 1].len += chunk;
			} else {
				if (n == k->max_segs)
					return 0;
				k->segs[n].addr = bus;
				k->segs[n].len = chunk;
				n++;
			}
			p += chunk;
			l -= chunk;
		}
	}
	return n;
}

static unsigned kq_bounce_segs(struct kq *k, struct kq_member *m, int slot, uint32_t len)
{
	size_t first = (size_t)slot * k->max_cmd / KQ_PAGE;
	unsigned n = 0;

	for (uint32_t done = 0; done < len; done += KQ_PAGE) {
		uint64_t bus = m->bounce_bus[first + done / KQ_PAGE];
		uint32_t chunk = TT_MIN(KQ_PAGE, len - done);

		if (n && k->segs[n - 1].addr + k->segs[n - 1].len == bus) {
			k->segs[n - 1].len += chunk;
		} else {
			k->segs[n].addr = bus;
			k->segs[n].len = chunk;
			n++;
		}
	}
	return n;
}

/*
 * Issue the command for [off, off + len) of @q.  Return: 0, -EAGAIN when
 * a command slot, bounce slot or SQ entry is needed first, or a negative
 * errno that fails the request.
 */
static int kq_issue(struct tt_engine *e, struct kq_req *q, uint64_t off, uint32_t len)
{
	struct kq *k = e->priv;
	unsigned mi = q->r.member;
	struct kq_member *m = &k->m[mi];
	uint64_t slba = (q->r.off + off) >> m->info.lba_shift;
	uint32_t nlb = len >> m->info.lba_shift;
	struct tt_nvme_list list;
	struct tt_nvme_sqe sqe;
	struct kq_cmd *c = m->free;
	unsigned nsegs, cid;
	int bounce = -1, ret;

	if (!m->qp)
		return tt_seterr(m->lost ? m->lost : -EIO, "kqueue: member %u lost its queue", mi);
	if (!c || tt_sq_space(&m->qp->sq) == 0)
		return -EAGAIN;
	cid = (unsigned)(c - m->cmds);
	list.vaddr = m->lists + (size_t)cid * k->list_pages * KQ_PAGE;
	list.bus = m->lists_bus + (size_t)cid * k->list_pages;
	list.nchunks = k->list_pages;
	list.chunk_bytes = KQ_PAGE;
	if (q->r.op == TT_OP_READ)
		ret = tt_nvme_cmd_read(&sqe, m->info.nsid, slba, nlb);
	else
		ret = tt_nvme_cmd_write(&sqe, m->info.nsid, slba, nlb);
	if (ret)
		return -EINVAL;
	nsegs = kq_segs(k, q, mi, off, len);
	if (!nsegs || tt_nvme_map(&sqe, m->qp->qid, k->segs, nsegs, &m->caps, &list)) {
		if (!k->n_bounce_free)
			return -EAGAIN;
		bounce = k->bounce_free[--k->n_bounce_free];
		nsegs = kq_bounce_segs(k, m, bounce, len);
		ret = tt_nvme_map(&sqe, m->qp->qid, k->segs, nsegs, &m->caps, &list);
		if (ret) {
			k->bounce_free[k->n_bounce_free++] = bounce;
			return tt_seterr(ret, "kqueue: cannot map a %u-byte command (%d)", len, ret);
		}
		if (q->r.op == TT_OP_WRITE)
			kq_copy(q, off, k->bounce + (size_t)bounce * k->max_cmd, len, 1);
	}
	sqe.cid = (uint16_t)cid;
	if (tt_sq_push(&m->qp->sq, &sqe) < 0) {
		if (bounce >= 0)
			k->bounce_free[k->n_bounce_free++] = bounce;
		return -EAGAIN;
	}
	m->free = c->next_free;
	c->req = q;
	c->req_off = off;
	c->len = len;
	c->bounce = bounce;
	if (!m->inflight)
		m->progress_ms = kq_now_ms();
	m->inflight++;
	m->unrung++;
	q->pending++;
	return 0;
}

/* Reject requests the device must not see; 0 if fine. */
static int kq_check(const struct tt_engine *e, const struct tt_req *r)
{
	const struct kq *k = e->priv;
	const struct kq_member *m;
	uint64_t mask;

	if (r->member >= e->n_members)
		return tt_seterr(-EINVAL, "kqueue: no member %u", r->member);
	m = &k->m[r->member];
	if (!m->qp)
		return tt_seterr(-EIO, "kqueue: member %u has no queue: it was deleted after its "
				 "controller stopped answering, and %s", r->member,
				 m->quarantined ? "could not be proven stopped"
						: "a new one could not be made");
	mask = (1ull << m->info.lba_shift) - 1;
	if ((r->off & mask) || (r->bytes & mask) || !r->bytes)
		return tt_seterr(-EINVAL, "kqueue: I/O at %llu+%llu is not block aligned",
				 (unsigned long long)r->off, (unsigned long long)r->bytes);
	if (r->off > m->bytes || r->bytes > m->bytes - r->off)
		return tt_seterr(-ERANGE, "kqueue: I/O past the end of member %u", r->member);
	if (r->op == TT_OP_WRITE && r->off < m->write_floor)
		return tt_seterr(-EPERM, "kqueue: write into the superblock area of member %u",
				 r->member);
	return 0;
}

int tt_kq_submit(struct tt_engine *e, struct tt_batch *b)
{
	struct kq *k = e->priv;
	int ret;

	while (b->next < b->n || k->cur) {
		struct kq_req *q = k->cur;

		if (!q) {
			while (!k->free_reqs) {
				if (tt_kq_reap(e, 1) <= 0)	/* cannot happen: a request is in flight */
					return tt_seterr(-EIO, "kqueue: no request slot comes free");
			}
			q = k->free_reqs;
			k->free_reqs = q->next_free;
			b->next += tt_next_req(e, b, b->next, &q->r);
			b->reqs++;
			b->inflight++;
			q->niov = tt_req_iov(&q->r, q->iov);
			q->issued = 0;
			q->pending = 0;
			q->all_issued = 0;
			q->res = kq_check(e, &q->r);
			k->cur = q;
		}
		while (!q->res && q->issued < q->r.bytes) {
			uint32_t len = (uint32_t)TT_MIN(q->r.bytes - q->issued, (uint64_t)k->max_cmd);

			ret = kq_issue(e, q, q->issued, len);
			if (ret == -EAGAIN) {
				/* Nothing in flight to wait for: the bounce slots are quarantined. */
				if (tt_kq_reap(e, 1) == 0 && !q->res)
					q->res = tt_seterr(-EIO, "kqueue: no bounce slot left (held by "
							   "commands not proven stopped)");
				continue;
			}
			if (ret) {
				q->res = ret;
				break;
			}
			q->issued += len;
		}
		k->cur = NULL;
		q->all_issued = 1;
		if (!q->pending)
			kq_finish_req(e, q);
	}
	kq_ring(e);
	return 0;
}
