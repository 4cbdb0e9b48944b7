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
 *
 * A stalled command.  When a member has commands in flight and none
 * completes for TUTTI_KQ_TIMEOUT_MS (default 30 s), its queue is deleted
 * through the module, whose Delete SQ returns only once the controller has
 * finished or aborted every command of the queue (or was disabled and
 * stopped): only then are those commands failed (-ETIMEDOUT) and their
 * requests, bounce slots and list pages released, and a new queue is made.
 * A wait therefore never returns while a command of it can still move data
 * into or out of memory the caller is about to free or reuse.  If the
 * module cannot prove the queue stopped, the member is given up and what
 * its commands addressed (bounce slots, list pages) is never reused.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

#include "tutti/error.h"
#include "kqueue_impl.h"
#include "../support/util.h"

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

/* Create member @i's queue pair (SQ in the peer CMB with TUTTI_KQ_SQ_PEER). */
int tt_kq_member_queue(struct kq *k, unsigned i)
{
	struct kq_member *m = &k->m[i];
	size_t off = i * k->peer_sq_bytes;

	if (k->peer_fd >= 0)
		return tt_kqp_create(m->fd, m->depth, k->peer_fd, off, k->peer_cmb + off, &m->qp);
	return tt_kqp_create(m->fd, m->depth, -1, 0, NULL, &m->qp);
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
	m->depth = depth;
	k->peer_sq_bytes = sq_bytes;
	(void)e;
	return tt_kq_member_queue(k, i);
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
	k->timeout_ms = KQ_TIMEOUT_MS;
	if (getenv("TUTTI_KQ_TIMEOUT_MS") && atoi(getenv("TUTTI_KQ_TIMEOUT_MS")) >= 10)
		k->timeout_ms = (uint64_t)atoi(getenv("TUTTI_KQ_TIMEOUT_MS"));
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
		if (m->qp && !tt_kqp_stopped(tt_kqp_delete(m->qp)))
			m->quarantined = 1;
		m->qp = NULL;
		if (m->quarantined) {
			/* Not proven stopped: leave what it may address pinned and allocated. */
			k->bounce_quarantined = 1;
			free(m->lists_bus);
			free(m->bounce_bus);
			free(m->cmds);
			continue;
		}
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
	if (k->bounce && !k->bounce_quarantined)
		munmap(k->bounce, k->bounce_bytes);
	free(k->segs);
	free(k->reqs);
	free(k);
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
	.submit = tt_kq_submit,
	.reap = tt_kq_reap,
	.reg = kq_reg,
};
