// SPDX-License-Identifier: GPL-2.0
/*
 * I/O queue pairs owned by a process.  The module allocates the rings
 * (host DMA memory, the SQ in a peer's CMB, or either ring in a pinned GPU
 * range: tutti_p2p.c), creates the CQ (interrupts
 * off: the owner polls) and the SQ on the controller, and lets the owner
 * map them; the owner builds commands and rings the doorbells itself.
 * Deleting the SQ makes the controller finish or abort everything it holds
 * from that queue before it answers, so once both deletes have completed no
 * DMA for the queue is outstanding and its memory can be freed: this is
 * what makes a crashed process safe to clean up after.
 */
#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/slab.h>

#include "tutti.h"

struct tutti_uq *tutti_queue_find(struct tutti_file *f, u32 qid)
{
	struct tutti_uq *q;

	list_for_each_entry(q, &f->queues, node)
		if (q->qid == qid)
			return q;
	return NULL;
}

static int tutti_delete_hw(struct tutti_ctrl *c, u8 opcode, u16 qid)
{
	struct nvme_command cmd = { };
	int ret;

	cmd.delete_queue.opcode = opcode;
	cmd.delete_queue.qid = cpu_to_le16(qid);
	ret = tutti_admin_exec(c, &cmd, NULL);
	if (ret > 0)
		dev_warn(&c->pdev->dev, "delete %s %u: status %#x\n",
			 opcode == nvme_admin_delete_sq ? "SQ" : "CQ", qid, ret);
	return ret;
}

/*
 * Stop @q on the controller: Delete SQ (the controller finishes or aborts
 * every command of the queue before it answers), then Delete CQ.  Any
 * failure (an error status, a timeout, a dead controller) disables the
 * controller (tutti_ctrl_kill()).
 *
 * Return: 0 deleted; -EIO the controller had to be disabled and confirmed
 * it stopped; -ETIMEDOUT it did not confirm it (then nothing the queue
 * addressed may ever be freed).  Either 0 or -EIO means no DMA of the
 * queue can happen any more.
 */
static int tutti_uq_stop_hw(struct tutti_ctrl *c, struct tutti_uq *q, const char *why)
{
	int ret = tutti_delete_hw(c, nvme_admin_delete_sq, q->qid);

	if (!ret)
		ret = tutti_delete_hw(c, nvme_admin_delete_cq, q->qid);
	if (!ret)
		return 0;
	return tutti_ctrl_kill(c, why) ? -EIO : -ETIMEDOUT;
}

/* Free a queue the controller no longer uses (c->lock held). */
static void tutti_uq_free(struct tutti_ctrl *c, struct tutti_uq *q)
{
	struct device *dev = &c->pdev->dev;

	if (q->sq && !q->sq_peer)
		dma_free_coherent(dev, q->sq_bytes, q->sq, q->sq_dma);
	if (q->cq && !q->cq_peer)
		dma_free_coherent(dev, q->cq_bytes, q->cq, q->cq_dma);
	if (q->peer)
		tutti_ctrl_put(q->peer);
	tutti_p2p_ring_put(q);
	if (q->live)
		atomic_dec(&c->n_uqueues);
	ida_free(&c->qids, q->qid);
	kfree(q);
}

/*
 * A queue that may still be alive on a controller that did not confirm it
 * stopped: its rings, queue id and references are never given back, and
 * nothing its file pinned is ever unpinned (f->leaked).
 */
static void tutti_uq_leak(struct tutti_file *f, struct tutti_uq *q)
{
	struct tutti_ctrl *c = f->ctrl;

	mutex_lock(&f->qlock);
	f->leaked = true;
	mutex_unlock(&f->qlock);
	dev_err(&c->pdev->dev,
		"queue %u not proven stopped: its rings and the file's pinned memory are leaked\n",
		q->qid);
	if (q->live)
		atomic_dec(&c->n_uqueues);
	kfree(q);
}

/*
 * Remove every page table entry of @q's rings from every mapping of the
 * file (c->lock held, @q off the list): a later access faults, and the
 * fault handler finds no queue (SIGBUS).
 */
static void tutti_uq_zap(struct tutti_file *f, struct tutti_uq *q)
{
	struct address_space *mapping = f->filp->f_mapping;

	if (!q->sq_peer)
		unmap_mapping_range(mapping, TUTTI_MMAP_SQ(q->qid), q->sq_bytes, 1);
	if (!q->cq_peer)
		unmap_mapping_range(mapping, TUTTI_MMAP_CQ(q->qid), q->cq_bytes, 1);
}

static int tutti_uq_place_sq(struct tutti_file *f, struct tutti_uq *q,
			     const struct tutti_queue_create *arg)
{
	struct tutti_ctrl *c = f->ctrl;
	struct tutti_ctrl *peer;
	int ret;

	if (arg->flags & TUTTI_QUEUE_SQ_GPU) {
		ret = tutti_p2p_place_ring(f, q, (u32)arg->peer_fd, arg->peer_off,
					   q->sq_bytes, &q->sq_dma);
		if (!ret)
			q->sq_peer = true;
		return ret;
	}
	if (!(arg->flags & TUTTI_QUEUE_SQ_PEER)) {
		q->sq = dma_alloc_coherent(&c->pdev->dev, q->sq_bytes, &q->sq_dma,
					   GFP_KERNEL);
		return q->sq ? 0 : -ENOMEM;
	}
	peer = tutti_peer_get(arg->peer_fd);
	if (IS_ERR(peer))
		return PTR_ERR(peer) == -ENODEV ? -ENODEV : -EINVAL;
	q->peer = peer;
	if (!peer->cmb_bytes || !(peer->cmbsz & NVME_CMBSZ_SQS))
		return -EINVAL;
	if (!IS_ALIGNED(arg->peer_off, PAGE_SIZE) || arg->peer_off >= peer->cmb_bytes ||
	    q->sq_bytes > peer->cmb_bytes - arg->peer_off)
		return -EINVAL;
	q->sq_peer = true;
	q->sq_dma = peer->cmb_bus + arg->peer_off;
	return 0;
}

static int tutti_uq_place_cq(struct tutti_file *f, struct tutti_uq *q,
			     const struct tutti_queue_create *arg)
{
	struct tutti_ctrl *c = f->ctrl;
	u64 off = (u64)arg->cq_page << PAGE_SHIFT;
	int ret;

	if (arg->flags & TUTTI_QUEUE_CQ_GPU) {
		/* Both rings in one range: they must not overlap. */
		if ((arg->flags & TUTTI_QUEUE_SQ_GPU) &&
		    off < arg->peer_off + q->sq_bytes && arg->peer_off < off + q->cq_bytes)
			return -EINVAL;
		ret = tutti_p2p_place_ring(f, q, (u32)arg->peer_fd, off, q->cq_bytes,
					   &q->cq_dma);
		if (!ret)
			q->cq_peer = true;
		return ret;
	}
	q->cq = dma_alloc_coherent(&c->pdev->dev, q->cq_bytes, &q->cq_dma, GFP_KERNEL);
	if (!q->cq)
		return -ENOMEM;
	memset(q->cq, 0, q->cq_bytes);
	return 0;
}

/*
 * Arguments alone (no state): -EINVAL for malformed ones, -EOPNOTSUPP for
 * a ring in GPU memory when the module was built without nvidia-p2p.
 */
static int tutti_queue_check(struct tutti_ctrl *c, const struct tutti_queue_create *arg)
{
	const u32 gpu = TUTTI_QUEUE_SQ_GPU | TUTTI_QUEUE_CQ_GPU;

	if (arg->flags & ~(TUTTI_QUEUE_SQ_PEER | gpu))
		return -EINVAL;
	if ((arg->flags & TUTTI_QUEUE_SQ_PEER) && (arg->flags & gpu))
		return -EINVAL;
	if (!(arg->flags & (TUTTI_QUEUE_SQ_PEER | gpu)) && arg->peer_fd)
		return -EINVAL;
	if (!(arg->flags & (TUTTI_QUEUE_SQ_PEER | TUTTI_QUEUE_SQ_GPU)) && arg->peer_off)
		return -EINVAL;
	if (!(arg->flags & TUTTI_QUEUE_CQ_GPU) && arg->cq_page)
		return -EINVAL;
	if ((arg->flags & gpu) && arg->peer_fd <= 0)
		return -EINVAL;		/* handles start at 1 */
	if (arg->depth < 2 || arg->depth > c->mqes || arg->depth > 65536)
		return -EINVAL;
	if ((arg->flags & gpu) && !TUTTI_HAVE_NV_P2P)
		return -EOPNOTSUPP;
	return 0;
}

/**
 * tutti_queue_create() - create an I/O queue pair for the file (c->lock held)
 * @f: owner
 * @arg: request, outputs filled on success
 *
 * Return: 0 or a negative errno (-EINVAL bad argument, -ENOSPC no free
 * queue id, -EIO the controller refused).
 */
int tutti_queue_create(struct tutti_file *f, struct tutti_queue_create *arg)
{
	struct tutti_ctrl *c = f->ctrl;
	struct nvme_command cmd = { };
	bool fenced = true;	/* nothing was handed to the controller yet */
	struct tutti_uq *q;
	int qid, ret;

	ret = tutti_queue_check(c, arg);
	if (ret)
		return ret;
	if (c->max_qid <= TUTTI_KQ_QID)
		return -ENOSPC;
	qid = ida_alloc_range(&c->qids, TUTTI_KQ_QID + 1, c->max_qid, GFP_KERNEL);
	if (qid < 0)
		return qid == -ENOMEM ? -ENOMEM : -ENOSPC;
	q = kzalloc(sizeof(*q), GFP_KERNEL);
	if (!q) {
		ida_free(&c->qids, qid);
		return -ENOMEM;
	}
	q->qid = qid;
	q->depth = arg->depth;
	q->sq_bytes = PAGE_ALIGN(q->depth * sizeof(struct nvme_command));
	q->cq_bytes = PAGE_ALIGN(q->depth * sizeof(struct nvme_completion));
	ret = tutti_uq_place_sq(f, q, arg);
	if (ret)
		goto fail;
	ret = tutti_uq_place_cq(f, q, arg);
	if (ret)
		goto fail;

	cmd.create_cq.opcode = nvme_admin_create_cq;
	cmd.create_cq.prp1 = cpu_to_le64(q->cq_dma);
	cmd.create_cq.cqid = cpu_to_le16(qid);
	cmd.create_cq.qsize = cpu_to_le16(q->depth - 1);
	cmd.create_cq.cq_flags = cpu_to_le16(NVME_QUEUE_PHYS_CONTIG);
	ret = tutti_admin_exec(c, &cmd, NULL);
	if (ret) {
		/* Refused, or never sent: nothing to stop.  Timed out: killed. */
		fenced = ret > 0 || ret == -ENODEV || tutti_ctrl_stopped(c);
		goto fail;
	}
	memset(&cmd, 0, sizeof(cmd));
	cmd.create_sq.opcode = nvme_admin_create_sq;
	cmd.create_sq.prp1 = cpu_to_le64(q->sq_dma);
	cmd.create_sq.sqid = cpu_to_le16(qid);
	cmd.create_sq.qsize = cpu_to_le16(q->depth - 1);
	cmd.create_sq.sq_flags = cpu_to_le16(NVME_QUEUE_PHYS_CONTIG);
	cmd.create_sq.cqid = cpu_to_le16(qid);
	ret = tutti_admin_exec(c, &cmd, NULL);
	if (ret) {
		/* The CQ exists: delete it, or stop the controller. */
		if (ret > 0)
			fenced = !tutti_delete_hw(c, nvme_admin_delete_cq, qid) ||
				 tutti_ctrl_kill(c, "CQ of a failed queue creation not deleted");
		else
			fenced = tutti_ctrl_stopped(c);
		goto fail;
	}
	/*
	 * A GPU range holding a ring may have been revoked while the queue was
	 * being created: the revocation sweeps f->queues under f->qlock after
	 * marking the range, so either it sees this queue or this sees the mark.
	 */
	mutex_lock(&f->qlock);
	if (!tutti_p2p_ring_live(q)) {
		fenced = tutti_uq_stop_hw(c, q, "queue on revoked GPU memory not deleted") !=
			 -ETIMEDOUT;
		mutex_unlock(&f->qlock);
		ret = -ENXIO;
		goto fail;
	}
	list_add_tail(&q->node, &f->queues);
	q->live = true;
	mutex_unlock(&f->qlock);
	atomic_inc(&c->n_uqueues);

	arg->qid = qid;
	arg->sq_db = (2 * qid) * (4 << c->dstrd);
	arg->cq_db = (2 * qid + 1) * (4 << c->dstrd);
	arg->sq_mmap_off = q->sq_peer ? 0 : TUTTI_MMAP_SQ(qid);
	arg->cq_mmap_off = q->cq_peer ? 0 : TUTTI_MMAP_CQ(qid);
	arg->sq_bytes = q->sq_bytes;
	arg->cq_bytes = q->cq_bytes;
	arg->sq_bus = q->sq_dma;
	return 0;
fail:
	if (ret > 0)
		ret = -EIO;
	if (fenced)
		tutti_uq_free(c, q);
	else
		tutti_uq_leak(f, q);
	return ret;
}

/*
 * Stop @q on the controller and free it (c->lock held).  Return: 0, -EIO
 * or -ETIMEDOUT as tutti_uq_stop_hw().
 */
static int tutti_uq_destroy(struct tutti_file *f, struct tutti_uq *q)
{
	struct tutti_ctrl *c = f->ctrl;
	int ret;

	lockdep_assert_held(&c->lock);
	mutex_lock(&f->qlock);
	list_del(&q->node);
	if (q->revoked)
		ret = q->unfenced ? -ETIMEDOUT : 0;
	else
		ret = tutti_uq_stop_hw(c, q, "queue not deleted");
	mutex_unlock(&f->qlock);
	/* Off the list: faults after the zap find no queue (tutti_mmap.c). */
	tutti_uq_zap(f, q);
	if (ret == -ETIMEDOUT)
		tutti_uq_leak(f, q);
	else
		tutti_uq_free(c, q);
	return ret;
}

/**
 * tutti_file_has_live_queue() - may a queue of @f still run commands?
 * @f: file (f->qlock held)
 *
 * Revoked queues were stopped on the controller and do not count.
 */
bool tutti_file_has_live_queue(struct tutti_file *f)
{
	struct tutti_uq *q;

	lockdep_assert_held(&f->qlock);
	list_for_each_entry(q, &f->queues, node)
		if (!q->revoked)
			return true;
	return false;
}

/**
 * tutti_queue_delete() - delete one queue pair of @f (c->lock held)
 * @f: owner
 * @qid: queue id
 * @unpin: receives memory unmapped while a queue was live, once none is
 *         (the caller frees it with tutti_dmas_free() after dropping c->lock)
 *
 * The rings' mappings are zapped (a later access raises SIGBUS) before the
 * rings are freed.  Return: 0 deleted; -EIO the controller had to be
 * disabled and confirmed it stopped; -ETIMEDOUT it did not confirm it
 * (what the queue's commands addressed must never be reused); -EINVAL no
 * such queue of this file.
 */
int tutti_queue_delete(struct tutti_file *f, u32 qid, struct list_head *unpin)
{
	struct tutti_uq *q = tutti_queue_find(f, qid);
	int ret;

	if (!q)
		return -EINVAL;
	ret = tutti_uq_destroy(f, q);
	tutti_dmas_take(f, unpin, true);
	return ret;
}

/** tutti_queues_release() - delete every queue pair of @f (c->lock held). */
void tutti_queues_release(struct tutti_file *f)
{
	struct tutti_uq *q, *tmp;

	list_for_each_entry_safe(q, tmp, &f->queues, node)
		tutti_uq_destroy(f, q);
}

/**
 * tutti_queues_revoke() - stop every queue of @f now (GPU memory going away)
 * @f: owner of the GPU range being revoked
 *
 * Called by the nvidia-p2p free callback, with only f->qlock: a deleted SQ
 * means the controller finished or aborted its commands, so no DMA of the
 * file's queues reaches the range after this returns.  Every queue of the
 * file is stopped, not only those with a ring there: any of them may have
 * reads or writes in flight that address it.  A delete that fails
 * disables the controller and waits until it confirmed it stopped (up to
 * CAP.TO).  The queues stay on the list
 * (their ids stay reserved) until the owner deletes them or closes the
 * file; their doorbells then reach no queue.
 */
void tutti_queues_revoke(struct tutti_file *f)
{
	struct tutti_ctrl *c = f->ctrl;
	struct tutti_uq *q;
	unsigned int n = 0;
	int ret;

	mutex_lock(&f->qlock);
	list_for_each_entry(q, &f->queues, node) {
		if (q->revoked)
			continue;
		ret = tutti_uq_stop_hw(c, q, "GPU memory revoked, queue not deleted");
		q->revoked = true;
		if (ret == -ETIMEDOUT) {
			q->unfenced = true;
			f->leaked = true;
		}
		n++;
	}
	mutex_unlock(&f->qlock);
	if (n)
		dev_info_ratelimited(&c->pdev->dev,
				     "GPU memory revoked by its driver: %u queue(s) stopped\n", n);
}
