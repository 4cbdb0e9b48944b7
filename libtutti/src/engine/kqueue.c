// SPDX-License-Identifier: Apache-2.0
/*
 * kqueue engine: the CPU drives NVMe queue pairs that tutti.ko (kmod/)
 * created for this process, one per member (/dev/tuttiNnM).  A request
 * (ios merged by tt_next_req()) becomes one or more Read/Write commands,
 * split at the controller's MDTS; each command's memory is described with
 * tt_nvme_map() (SGL when the controller takes SGLs, PRP otherwise, and
 * always PRP with TUTTI_KQ_PRP=1).  Memory inside a registered area is
 * addressed directly through the bus addresses the module returned when it
 * pinned the area; anything else (or anything PRPs cannot express) goes
 * through a pinned bounce pool.  Completions are polled: no system call on
 * the I/O path.  Flushes and metadata use the node's fsync/pread/pwrite.
 *
 * TUTTI_KQ_SQ_PEER=/dev/tuttiK places every member's SQ in controller K's
 * CMB (peer memory, standing in for GPU memory).
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "tutti/error.h"
#include "tutti/kqueue.h"
#include "tutti/nvme_sgl.h"
#include "engine_impl.h"
#include "../support/util.h"

#define KQ_PAGE			4096u
#define KQ_MAX_CMD		(1u << 20)	/* per command, below MDTS */
#define KQ_MAX_DEPTH		1024u
#define KQ_BOUNCE_SLOTS		16u
#define KQ_MAX_AREAS		256u
#define KQ_TIMEOUT_MS		30000u
#define KQ_SGL_PER_CHUNK	(KQ_PAGE / 16)

struct kq_req;

struct kq_cmd {
	struct kq_req *req;
	uint64_t req_off;	/* where in the request this command starts */
	uint32_t len;
	int bounce;		/* bounce slot, -1 for direct */
	struct kq_cmd *next_free;
};

struct kq_member {
	int fd;
	struct tt_kinfo info;
	struct tt_kqp *qp;
	struct kq_cmd *cmds;
	unsigned ncmds;
	struct kq_cmd *free;
	char *lists;		/* ncmds * list_pages pages */
	uint64_t *lists_bus;
	uint32_t lists_handle;
	int lists_mapped;
	struct tt_nvme_xfer_caps caps;
	uint64_t bytes;
	uint64_t write_floor;	/* the engine never writes below (superblocks) */
	uint64_t *bounce_bus;
	uint32_t bounce_handle;
	int bounce_mapped;
	unsigned unrung;
	unsigned inflight;
};

struct kq_req {
	struct tt_req r;
	struct iovec iov[TT_ENGINE_MAX_IOV];
	unsigned niov;
	uint64_t issued;
	unsigned pending;
	int all_issued;
	int res;
	struct kq_req *next_free;
};

struct kq_area {
	char *base;		/* page aligned */
	size_t len;
	uint64_t *bus[TT_MAX_ENGINE_MEMBERS];
	uint32_t handle[TT_MAX_ENGINE_MEMBERS];
};

struct kq {
	struct kq_member m[TT_MAX_ENGINE_MEMBERS];
	struct kq_req *reqs;
	struct kq_req *free_reqs;
	struct kq_req *cur;
	struct kq_area areas[KQ_MAX_AREAS];
	unsigned n_areas;
	char *bounce;
	size_t bounce_bytes;
	int bounce_free[KQ_BOUNCE_SLOTS];
	unsigned n_bounce_free;
	struct tt_dma_seg *segs;
	unsigned max_segs;
	uint32_t max_cmd;
	unsigned list_pages;
	int peer_fd;
	char *peer_cmb;
	size_t peer_len;
};

static uint64_t kq_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void *kq_alloc_pages(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/* Pin @bytes at @p on member @m's controller; @bus gets one entry a page. */
static int kq_map(struct kq_member *m, void *p, size_t bytes, uint64_t **bus,
		  uint32_t *handle)
{
	int ret;

	*bus = calloc(bytes / KQ_PAGE, sizeof(**bus));
	if (!*bus)
		return tt_seterr(-ENOMEM, "kqueue: out of memory");
	ret = tt_kdma_map(m->fd, p, bytes, *bus, handle);
	if (ret) {
		free(*bus);
		*bus = NULL;
	}
	return ret;
}

static int kq_peer_setup(struct kq *k, unsigned n, size_t sq_bytes)
{
	const char *path = getenv("TUTTI_KQ_SQ_PEER");
	struct tt_kinfo pi;
	int ret;

	k->peer_fd = -1;
	if (!path || !*path)
		return 0;
	k->peer_fd = open(path, O_RDWR | O_CLOEXEC);
	if (k->peer_fd < 0)
		return tt_seterr(-errno, "kqueue: TUTTI_KQ_SQ_PEER %s: %s", path, strerror(errno));
	ret = tt_kdev_info(k->peer_fd, &pi);
	if (ret || !(pi.flags & TT_KINFO_CMB_SQS) || pi.cmb_bytes < n * sq_bytes)
		return tt_seterr(-EINVAL, "kqueue: %s has no CMB that can hold %u SQs", path, n);
	k->peer_len = n * sq_bytes;
	k->peer_cmb = tt_kdev_map_cmb(k->peer_fd, k->peer_len);
	if (!k->peer_cmb)
		return tt_seterr(-errno, "kqueue: mapping the CMB of %s: %s", path, strerror(errno));
	return 0;
}

static int kq_member_init(struct tt_engine *e, struct kq *k, unsigned i, uint32_t depth)
{
	struct kq_member *m = &k->m[i];
	size_t sq_bytes = TT_ALIGN_UP((size_t)depth * 64, KQ_PAGE);
	struct tt_kextents ext;
	size_t lb;
	int ret;

	m->ncmds = depth - 1;
	m->cmds = calloc(m->ncmds, sizeof(*m->cmds));
	if (!m->cmds)
		return tt_seterr(-ENOMEM, "kqueue: out of memory");
	for (unsigned c = m->ncmds; c-- > 0;) {
		m->cmds[c].next_free = m->free;
		m->free = &m->cmds[c];
	}
	m->caps.page_size = KQ_PAGE;
	m->caps.mdts_bytes = m->info.mdts_bytes;
	m->caps.sgls = getenv("TUTTI_KQ_PRP") && !strcmp(getenv("TUTTI_KQ_PRP"), "1") ?
		       0 : m->info.sgls;
	m->caps.sgl_threshold = 0;
	m->bytes = m->info.nsze << m->info.lba_shift;
	if (!tt_kdev_extents(m->fd, &ext) && ext.valid)
		m->write_floor = ext.table_off;

	lb = (size_t)m->ncmds * k->list_pages * KQ_PAGE;
	m->lists = kq_alloc_pages(lb);
	if (!m->lists)
		return tt_seterr(-ENOMEM, "kqueue: out of memory for PRP/SGL lists");
	ret = kq_map(m, m->lists, lb, &m->lists_bus, &m->lists_handle);
	if (ret)
		return ret;
	m->lists_mapped = 1;
	ret = kq_map(m, k->bounce, k->bounce_bytes, &m->bounce_bus, &m->bounce_handle);
	if (ret)
		return ret;
	m->bounce_mapped = 1;
	if (k->peer_fd >= 0)
		ret = tt_kqp_create(m->fd, depth, k->peer_fd, i * sq_bytes,
				    k->peer_cmb + i * sq_bytes, &m->qp);
	else
		ret = tt_kqp_create(m->fd, depth, -1, 0, NULL, &m->qp);
	(void)e;
	return ret;
}

static void kq_fini(struct tt_engine *e);

static int kq_init(struct tt_engine *e)
{
	struct kq *k = calloc(1, sizeof(*k));
	uint32_t depth = TT_MAX(e->p.queue_depth, 2u);
	unsigned entries;
	int ret;

	if (!k)
		return tt_seterr(-ENOMEM, "kqueue: out of memory");
	e->priv = k;
	k->peer_fd = -1;
	k->max_cmd = KQ_MAX_CMD;
	for (unsigned i = 0; i < e->n_members; i++) {
		struct kq_member *m = &k->m[i];

		m->fd = e->fds[i];
		ret = tt_kdev_info(m->fd, &m->info);
		if (ret || !(m->info.flags & TT_KINFO_NS)) {
			ret = tt_seterr(-ENOTTY, "kqueue: member %u is not a tutti namespace "
					"node (/dev/tuttiNnM; is tutti.ko loaded and the "
					"controller attached?)", i);
			goto fail;
		}
		if (m->info.mdts_bytes && m->info.mdts_bytes < k->max_cmd)
			k->max_cmd = m->info.mdts_bytes;
		if (m->info.lba_shift > 12) {
			ret = tt_seterr(-EINVAL, "kqueue: member %u has %u-byte blocks (at most 4096)",
					i, 1u << m->info.lba_shift);
			goto fail;
		}
		depth = TT_MIN(depth, m->info.mqes);
	}
	depth = TT_MIN(depth, KQ_MAX_DEPTH);
	entries = k->max_cmd / KQ_PAGE + 1;
	k->list_pages = TT_MAX(tt_nvme_prp_list_pages(entries, KQ_PAGE),
			       tt_nvme_list_chunks(entries, KQ_SGL_PER_CHUNK));
	k->max_segs = entries + 1;
	k->segs = calloc(k->max_segs, sizeof(*k->segs));
	k->reqs = calloc(depth, sizeof(*k->reqs));
	k->bounce_bytes = (size_t)KQ_BOUNCE_SLOTS * k->max_cmd;
	k->bounce = kq_alloc_pages(k->bounce_bytes);
	if (!k->segs || !k->reqs || !k->bounce) {
		ret = tt_seterr(-ENOMEM, "kqueue: out of memory");
		goto fail;
	}
	for (unsigned i = 0; i < depth; i++) {
		k->reqs[i].next_free = k->free_reqs;
		k->free_reqs = &k->reqs[i];
	}
	for (unsigned i = 0; i < KQ_BOUNCE_SLOTS; i++)
		k->bounce_free[k->n_bounce_free++] = (int)i;
	ret = kq_peer_setup(k, e->n_members, TT_ALIGN_UP((size_t)depth * 64, KQ_PAGE));
	if (ret)
		goto fail;
	for (unsigned i = 0; i < e->n_members; i++) {
		ret = kq_member_init(e, k, i, depth);
		if (ret)
			goto fail;
	}
	return 0;
fail:
	kq_fini(e);
	e->priv = NULL;
	return ret;
}

static void kq_fini(struct tt_engine *e)
{
	struct kq *k = e->priv;

	if (!k)
		return;
	for (unsigned i = 0; i < e->n_members; i++) {
		struct kq_member *m = &k->m[i];

		/* Deleting the queue first: no DMA may outlive the pinning. */
		tt_kqp_destroy(m->qp);
		if (m->lists_mapped)
			tt_kdma_unmap(m->fd, m->lists_handle);
		if (m->bounce_mapped)
			tt_kdma_unmap(m->fd, m->bounce_handle);
		if (m->lists)
			munmap(m->lists, (size_t)m->ncmds * k->list_pages * KQ_PAGE);
		free(m->lists_bus);
		free(m->bounce_bus);
		free(m->cmds);
		for (unsigned a = 0; a < k->n_areas; a++) {
			if (k->areas[a].bus[i]) {
				tt_kdma_unmap(m->fd, k->areas[a].handle[i]);
				free(k->areas[a].bus[i]);
			}
		}
	}
	if (k->peer_cmb)
		munmap(k->peer_cmb, k->peer_len);
	if (k->peer_fd >= 0)
		close(k->peer_fd);
	if (k->bounce)
		munmap(k->bounce, k->bounce_bytes);
	free(k->segs);
	free(k->reqs);
	free(k);
}

static void kq_ring(struct tt_engine *e)
{
	struct kq *k = e->priv;

	for (unsigned i = 0; i < e->n_members; i++) {
		if (k->m[i].unrung) {
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
	if (seen)
		tt_cq_ring_doorbell(&m->qp->cq);
	return seen;
}

static int kq_reap(struct tt_engine *e, int wait)
{
	struct kq *k = e->priv;
	uint64_t deadline = 0;
	unsigned spins = 0;
	int seen;

	kq_ring(e);
	for (;;) {
		unsigned busy = 0;

		seen = 0;
		for (unsigned i = 0; i < e->n_members; i++) {
			busy += k->m[i].inflight;
			if (k->m[i].inflight)
				seen += kq_reap_member(e, &k->m[i]);
		}
		if (seen || !wait || !busy)
			return seen;
		if (++spins > 64) {
			if (!deadline)
				deadline = kq_now_ms() + KQ_TIMEOUT_MS;
			else if (kq_now_ms() > deadline)
				return tt_seterr(-ETIMEDOUT, "kqueue: no completion for %u s",
						 KQ_TIMEOUT_MS / 1000);
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
	m->inflight++;
	m->unrung++;
	q->pending++;
	return 0;
}

/* Reject requests the device must not see; 0 if fine. */
static int kq_check(const struct kq *k, const struct tt_req *r)
{
	const struct kq_member *m;
	uint64_t mask;

	if (r->member >= TT_MAX_ENGINE_MEMBERS || !k->m[r->member].qp)
		return tt_seterr(-EINVAL, "kqueue: no member %u", r->member);
	m = &k->m[r->member];
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

static int kq_submit(struct tt_engine *e, struct tt_batch *b)
{
	struct kq *k = e->priv;
	int ret;

	while (b->next < b->n || k->cur) {
		struct kq_req *q = k->cur;

		if (!q) {
			while (!k->free_reqs) {
				ret = kq_reap(e, 1);
				if (ret < 0)
					return ret;
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
			q->res = kq_check(k, &q->r);
			k->cur = q;
		}
		while (!q->res && q->issued < q->r.bytes) {
			uint32_t len = (uint32_t)TT_MIN(q->r.bytes - q->issued, (uint64_t)k->max_cmd);

			ret = kq_issue(e, q, q->issued, len);
			if (ret == -EAGAIN) {
				ret = kq_reap(e, 1);
				if (ret < 0)
					return ret;
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

static int kq_reg(struct tt_engine *e, void *addr, size_t len)
{
	struct kq *k = e->priv;
	uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(KQ_PAGE - 1);
	uintptr_t end = TT_ALIGN_UP((uintptr_t)addr + len, KQ_PAGE);
	struct kq_area *a;
	int ret = 0;

	if (!len)
		return 0;
	if (k->n_areas == KQ_MAX_AREAS)
		return tt_seterr(-ENOSPC, "kqueue: more than %u registered areas", KQ_MAX_AREAS);
	a = &k->areas[k->n_areas];
	memset(a, 0, sizeof(*a));
	a->base = (char *)start;
	a->len = end - start;
	for (unsigned i = 0; i < e->n_members && !ret; i++)
		ret = kq_map(&k->m[i], a->base, a->len, &a->bus[i], &a->handle[i]);
	if (ret) {
		for (unsigned i = 0; i < e->n_members; i++) {
			if (a->bus[i]) {
				tt_kdma_unmap(k->m[i].fd, a->handle[i]);
				free(a->bus[i]);
			}
		}
		return ret;
	}
	k->n_areas++;
	return 0;
}

/* Members that are tutti.ko namespace nodes are this engine's alone ("auto"). */
static int kq_probe(const int *fds, unsigned n)
{
	uint64_t bytes;

	(void)n;
	return tt_kdev_size(fds[0], &bytes) == 0 ? TT_ENGINE_NATIVE : 0;
}

const struct tt_engine_ops tt_kqueue_ops = {
	.name = "kqueue",
	.probe = kq_probe,
	.init = kq_init,
	.fini = kq_fini,
	.submit = kq_submit,
	.reap = kq_reap,
	.reg = kq_reg,
};
