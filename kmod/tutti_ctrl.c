// SPDX-License-Identifier: GPL-2.0
/*
 * Controller bring-up and the module's own polled queues: reset, enable,
 * admin queue, Identify, Set Features (queue count), a kernel I/O queue
 * (qid 1) for the read/write path, shutdown.  No interrupts are used: the
 * module polls its two queues, and user queues are created with interrupts
 * off (their owners poll).
 */
#include <linux/delay.h>
#include <linux/dma-mapping.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/jiffies.h>
#include <linux/module.h>
#include <linux/slab.h>

#include "tutti.h"

static unsigned int cmd_timeout_ms = TUTTI_CMD_TIMEOUT_MS;
module_param(cmd_timeout_ms, uint, 0644);
MODULE_PARM_DESC(cmd_timeout_ms,
		 "admin and kernel I/O command timeout in ms (default 30000, at least 100); "
		 "a command that times out disables the controller");

static unsigned long tutti_cmd_timeout(void)
{
	return msecs_to_jiffies(max_t(unsigned int, READ_ONCE(cmd_timeout_ms), 100));
}

u32 tutti_rd32(struct tutti_ctrl *c, u32 off)
{
	return readl(c->bar + off);
}

u64 tutti_rd64(struct tutti_ctrl *c, u32 off)
{
	return lo_hi_readq(c->bar + off);
}

static void __iomem *tutti_db(struct tutti_ctrl *c, u16 qid, bool cq)
{
	return c->bar + NVME_REG_DBS + (2 * qid + (cq ? 1 : 0)) * (4 << c->dstrd);
}

static unsigned long tutti_ready_timeout(struct tutti_ctrl *c)
{
	/* CAP.TO is in 500 ms units; allow at least a second under emulation. */
	return msecs_to_jiffies(max_t(u32, NVME_CAP_TIMEOUT(c->cap) * 500, 1000));
}

static int tutti_wait_csts(struct tutti_ctrl *c, u32 mask, u32 val)
{
	unsigned long deadline = jiffies + tutti_ready_timeout(c);
	u32 csts;

	for (;;) {
		csts = tutti_rd32(c, NVME_REG_CSTS);
		if (csts == ~0u)
			return -ENODEV;
		if ((csts & mask) == val)
			return 0;
		if (time_after(jiffies, deadline))
			return -ETIMEDOUT;
		usleep_range(1000, 2000);
	}
}

int tutti_ctrl_reset(struct tutti_ctrl *c)
{
	u32 cc = tutti_rd32(c, NVME_REG_CC);

	/* Firmware (SeaBIOS) may leave the controller enabled. */
	writel(cc & ~NVME_CC_ENABLE, c->bar + NVME_REG_CC);
	return tutti_wait_csts(c, NVME_CSTS_RDY, 0);
}

int tutti_ctrl_enable(struct tutti_ctrl *c)
{
	u32 cc = NVME_CC_CSS_NVM | NVME_CC_AMS_RR | NVME_CC_SHN_NONE |
		 NVME_CC_IOSQES | NVME_CC_IOCQES | NVME_CC_ENABLE;
	u32 aqa = (c->admin.depth - 1) | ((c->admin.depth - 1) << 16);

	/* CC.MPS = 0: 4 KiB memory pages. */
	writel(aqa, c->bar + NVME_REG_AQA);
	lo_hi_writeq(c->admin.sq_dma, c->bar + NVME_REG_ASQ);
	lo_hi_writeq(c->admin.cq_dma, c->bar + NVME_REG_ACQ);
	writel(cc, c->bar + NVME_REG_CC);
	return tutti_wait_csts(c, NVME_CSTS_RDY | NVME_CSTS_CFS, NVME_CSTS_RDY);
}

/* Normal shutdown (CC.SHN), then CC.EN=0.  Return: 0 once CSTS.RDY reads 0. */
int tutti_ctrl_shutdown(struct tutti_ctrl *c)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(5000);
	u32 cc = tutti_rd32(c, NVME_REG_CC);

	if (cc == ~0u)
		return -ENODEV;
	if (!(cc & NVME_CC_ENABLE))
		return tutti_wait_csts(c, NVME_CSTS_RDY, 0);
	cc = (cc & ~NVME_CC_SHN_MASK) | NVME_CC_SHN_NORMAL;
	writel(cc, c->bar + NVME_REG_CC);
	while ((tutti_rd32(c, NVME_REG_CSTS) & NVME_CSTS_SHST_MASK) !=
	       NVME_CSTS_SHST_CMPLT) {
		if (time_after(jiffies, deadline)) {
			dev_warn(&c->pdev->dev, "shutdown timed out\n");
			break;
		}
		usleep_range(1000, 2000);
	}
	writel(cc & ~(NVME_CC_ENABLE | NVME_CC_SHN_MASK), c->bar + NVME_REG_CC);
	return tutti_wait_csts(c, NVME_CSTS_RDY, 0);
}

static int tutti_kq_alloc(struct tutti_ctrl *c, struct tutti_kq *q, u16 qid,
			  u32 depth)
{
	struct device *dev = &c->pdev->dev;

	q->qid = qid;
	q->depth = depth;
	q->sq_tail = 0;
	q->cq_head = 0;
	q->cq_phase = 1;
	q->sq = dma_alloc_coherent(dev, depth * sizeof(*q->sq), &q->sq_dma,
				   GFP_KERNEL);
	q->cq = dma_alloc_coherent(dev, depth * sizeof(*q->cq), &q->cq_dma,
				   GFP_KERNEL);
	if (!q->sq || !q->cq)
		return -ENOMEM;
	memset(q->cq, 0, depth * sizeof(*q->cq));
	return 0;
}

static void tutti_kq_free(struct tutti_ctrl *c, struct tutti_kq *q)
{
	struct device *dev = &c->pdev->dev;

	if (q->sq)
		dma_free_coherent(dev, q->depth * sizeof(*q->sq), q->sq, q->sq_dma);
	if (q->cq)
		dma_free_coherent(dev, q->depth * sizeof(*q->cq), q->cq, q->cq_dma);
	q->sq = NULL;
	q->cq = NULL;
}

/**
 * tutti_ctrl_kill() - stop all DMA of a controller that must not go on
 * @c: a bound controller (its BAR mapped)
 * @why: logged
 *
 * Used when the module cannot prove a queue stopped (a command or a delete
 * that failed or timed out): CC.EN=0 resets the controller, which ends
 * every queue; then it waits up to CAP.TO for CSTS.RDY=0, the controller's
 * word that the reset is done, and turns bus mastering off, so a
 * controller that wakes up later cannot reach memory.  The controller is
 * dead until rebound.  Callers free memory the controller may have
 * addressed only when this returns true (confirmed stopped); otherwise
 * that memory stays allocated and pinned for good.  Takes c->kill_lock
 * (innermost); may sleep up to CAP.TO.  A second call returns the first
 * call's verdict.
 *
 * Return: true when the controller confirmed it stopped.
 */
bool tutti_ctrl_kill(struct tutti_ctrl *c, const char *why)
{
	bool stopped;
	int ret;

	mutex_lock(&c->kill_lock);
	if (!c->dead) {
		dev_err(&c->pdev->dev, "%s: controller disabled\n", why);
		WRITE_ONCE(c->dead, true);
		writel(0, c->bar + NVME_REG_CC);
		ret = tutti_wait_csts(c, NVME_CSTS_RDY, 0);
		pci_clear_master(c->pdev);
		/* A read flushes the posted writes above to the device. */
		if (tutti_rd32(c, NVME_REG_CSTS) == ~0u)
			ret = -ENODEV;
		WRITE_ONCE(c->stopped, ret == 0);
		if (ret)
			dev_err(&c->pdev->dev,
				"controller did not confirm it stopped (%d): memory it may address stays allocated and pinned\n",
				ret);
	}
	stopped = c->stopped;
	mutex_unlock(&c->kill_lock);
	return stopped;
}

/**
 * tutti_ctrl_stopped() - was the controller disabled and confirmed stopped?
 * @c: controller
 *
 * Then nothing it was asked to do can still reach memory.
 */
bool tutti_ctrl_stopped(struct tutti_ctrl *c)
{
	return READ_ONCE(c->stopped);
}

int tutti_status_errno(u16 status)
{
	if (!status)
		return 0;
	if ((status & 0x7ff) == NVME_SC_INVALID_FIELD ||
	    (status & 0x7ff) == NVME_SC_INVALID_NS)
		return -EINVAL;
	return -EIO;
}

/*
 * Submit @cmd on @q and poll for its completion (q->lock held).  Returns
 * the NVMe status (>= 0) or a negative errno when the controller did not
 * answer; a controller that stops answering is marked dead.
 */
static int tutti_kq_exec(struct tutti_ctrl *c, struct tutti_kq *q,
			 struct nvme_command *cmd, u32 *result)
{
	unsigned long deadline = jiffies + tutti_cmd_timeout();
	struct nvme_completion *cqe;
	unsigned int spins = 0;
	u16 cid, status;

	lockdep_assert_held(&q->lock);
	/* Dead, or torn down by unbind (the rings are freed then). */
	if (READ_ONCE(c->dead) || !q->sq)
		return -ENODEV;
	cid = q->next_cid++;
	cmd->common.command_id = cid;
	memcpy(&q->sq[q->sq_tail], cmd, sizeof(*cmd));
	if (++q->sq_tail == q->depth)
		q->sq_tail = 0;
	writel(q->sq_tail, tutti_db(c, q->qid, false));

	for (;;) {
		cqe = &q->cq[q->cq_head];
		status = le16_to_cpu(READ_ONCE(cqe->status));
		if ((status & 1) == q->cq_phase)
			break;
		if (time_after(jiffies, deadline) ||
		    (tutti_rd32(c, NVME_REG_CSTS) & NVME_CSTS_CFS)) {
			dev_err(&c->pdev->dev, "queue %u: command %#x timed out\n",
				q->qid, cmd->common.opcode);
			tutti_ctrl_kill(c, "command timeout");
			return -EIO;
		}
		if (++spins < 64)
			cpu_relax();
		else
			usleep_range(10, 50);
	}
	dma_rmb();
	if (result)
		*result = le32_to_cpu(cqe->result.u32);
	if (le16_to_cpu(cqe->command_id) != cid)
		dev_warn(&c->pdev->dev, "queue %u: completion for cid %u, expected %u\n",
			 q->qid, le16_to_cpu(cqe->command_id), cid);
	if (++q->cq_head == q->depth) {
		q->cq_head = 0;
		q->cq_phase ^= 1;
	}
	writel(q->cq_head, tutti_db(c, q->qid, true));
	return status >> 1;
}

/**
 * tutti_admin_exec() - run an admin command without data transfer
 * @c: controller
 * @cmd: command (command id is set here)
 * @result: out (may be NULL), completion DW0
 *
 * Return: NVMe status (0 success), or a negative errno.
 */
int tutti_admin_exec(struct tutti_ctrl *c, struct nvme_command *cmd, u32 *result)
{
	int ret;

	mutex_lock(&c->admin.lock);
	ret = tutti_kq_exec(c, &c->admin, cmd, result);
	mutex_unlock(&c->admin.lock);
	return ret;
}

/* An admin command reading at most 4 KiB into the start of kbuf (io.lock held). */
static int tutti_admin_read(struct tutti_ctrl *c, struct nvme_command *cmd,
			    u32 *result)
{
	lockdep_assert_held(&c->io.lock);
	cmd->common.dptr.prp1 = cpu_to_le64(c->kbuf_dma);
	return tutti_admin_exec(c, cmd, result);
}

/**
 * tutti_admin_passthru() - a read-only admin command into a user buffer
 * @c: controller
 * @cmd: Identify or Get Log Page, validated by the caller
 * @ubuf: user buffer
 * @len: bytes to copy out, at most 4096
 * @result: out, completion DW0
 *
 * Return: NVMe status (>= 0) or a negative errno.
 */
int tutti_admin_passthru(struct tutti_ctrl *c, struct nvme_command *cmd,
			 void __user *ubuf, u32 len, u32 *result)
{
	int ret;

	/* c->io.lock is the one tutti lock that may be held across user memory. */
	mutex_lock(&c->io.lock);
	if (READ_ONCE(c->gone)) {
		ret = -ENODEV;
	} else {
		memset(c->kbuf, 0, PAGE_SIZE);
		ret = tutti_admin_read(c, cmd, result);
		if (ret >= 0 && copy_to_user(ubuf, c->kbuf, len))
			ret = -EFAULT;
	}
	mutex_unlock(&c->io.lock);
	return ret;
}

/* Fill the data pointer for @len bytes of kbuf (PRP; kbuf is contiguous). */
static void tutti_kbuf_prp(struct tutti_ctrl *c, struct nvme_command *cmd,
			   u32 len)
{
	cmd->rw.dptr.prp1 = cpu_to_le64(c->kbuf_dma);
	if (len <= PAGE_SIZE)
		cmd->rw.dptr.prp2 = 0;
	else if (len <= 2 * PAGE_SIZE)
		cmd->rw.dptr.prp2 = cpu_to_le64(c->kbuf_dma + PAGE_SIZE);
	else
		cmd->rw.dptr.prp2 = cpu_to_le64(c->kprp_dma);
}

/**
 * tutti_kio() - read or write @nlb blocks at @lba through kbuf (io.lock held)
 * @ns: namespace
 * @write: direction
 * @lba: first block
 * @nlb: blocks; nlb << lba_shift <= kbuf_bytes
 * @status: out, NVMe status
 *
 * Return: 0, or a negative errno (-EIO for an NVMe error status).
 */
int tutti_kio(struct tutti_ns *ns, bool write, u64 lba, u32 nlb, u32 *status)
{
	struct tutti_ctrl *c = ns->ctrl;
	struct nvme_command cmd = { };
	int ret;

	lockdep_assert_held(&c->io.lock);
	cmd.rw.opcode = write ? nvme_cmd_write : nvme_cmd_read;
	cmd.rw.nsid = cpu_to_le32(ns->nsid);
	cmd.rw.slba = cpu_to_le64(lba);
	cmd.rw.length = cpu_to_le16(nlb - 1);
	tutti_kbuf_prp(c, &cmd, nlb << ns->lba_shift);
	ret = tutti_kq_exec(c, &c->io, &cmd, NULL);
	if (ret < 0)
		return ret;
	if (status)
		*status = ret;
	return tutti_status_errno(ret);
}

/** tutti_kflush() - NVMe Flush of @ns: completed writes become durable. */
int tutti_kflush(struct tutti_ns *ns)
{
	struct tutti_ctrl *c = ns->ctrl;
	struct nvme_command cmd = { };
	int ret;

	cmd.common.opcode = nvme_cmd_flush;
	cmd.common.nsid = cpu_to_le32(ns->nsid);
	/*
	 * gone is checked under io.lock: unbind sets it before the teardown
	 * takes io.lock to free the queue (checked before the lock, a flush
	 * could run on a queue the teardown had just freed).
	 */
	mutex_lock(&c->io.lock);
	if (READ_ONCE(c->gone))
		ret = -ENODEV;
	else
		ret = tutti_kq_exec(c, &c->io, &cmd, NULL);
	mutex_unlock(&c->io.lock);
	return ret < 0 ? ret : tutti_status_errno(ret);
}

static int tutti_identify(struct tutti_ctrl *c, u8 cns, u32 nsid)
{
	struct nvme_command cmd = { };

	cmd.identify.opcode = nvme_admin_identify;
	cmd.identify.nsid = cpu_to_le32(nsid);
	cmd.identify.cns = cns;
	return tutti_admin_read(c, &cmd, NULL);
}

static int tutti_set_queue_count(struct tutti_ctrl *c)
{
	struct nvme_command cmd = { };
	u32 want = TUTTI_MAX_QUEUES - 1, res = 0;
	int ret;

	cmd.features.opcode = nvme_admin_set_features;
	cmd.features.fid = cpu_to_le32(NVME_FEAT_NUM_QUEUES);
	cmd.features.dword11 = cpu_to_le32(want | (want << 16));
	ret = tutti_admin_exec(c, &cmd, &res);
	if (ret)
		return ret < 0 ? ret : -EIO;
	c->max_qid = min((res & 0xffff) + 1, (res >> 16) + 1);
	return 0;
}

static int tutti_create_kio_queue(struct tutti_ctrl *c)
{
	struct nvme_command cmd = { };
	int ret;

	ret = tutti_kq_alloc(c, &c->io, TUTTI_KQ_QID, TUTTI_KQ_DEPTH);
	if (ret)
		return ret;
	cmd.create_cq.opcode = nvme_admin_create_cq;
	cmd.create_cq.prp1 = cpu_to_le64(c->io.cq_dma);
	cmd.create_cq.cqid = cpu_to_le16(TUTTI_KQ_QID);
	cmd.create_cq.qsize = cpu_to_le16(TUTTI_KQ_DEPTH - 1);
	cmd.create_cq.cq_flags = cpu_to_le16(NVME_QUEUE_PHYS_CONTIG);
	ret = tutti_admin_exec(c, &cmd, NULL);
	if (ret)
		return ret < 0 ? ret : -EIO;
	memset(&cmd, 0, sizeof(cmd));
	cmd.create_sq.opcode = nvme_admin_create_sq;
	cmd.create_sq.prp1 = cpu_to_le64(c->io.sq_dma);
	cmd.create_sq.sqid = cpu_to_le16(TUTTI_KQ_QID);
	cmd.create_sq.qsize = cpu_to_le16(TUTTI_KQ_DEPTH - 1);
	cmd.create_sq.sq_flags = cpu_to_le16(NVME_QUEUE_PHYS_CONTIG);
	cmd.create_sq.cqid = cpu_to_le16(TUTTI_KQ_QID);
	ret = tutti_admin_exec(c, &cmd, NULL);
	if (ret)
		return ret < 0 ? ret : -EIO;
	c->io_ready = true;
	return 0;
}

/* Delete qid 1 (io.lock and admin.lock held). */
static void tutti_delete_kio_queue_locked(struct tutti_ctrl *c)
{
	struct nvme_command cmd = { };

	if (!c->io_ready)
		return;
	cmd.delete_queue.opcode = nvme_admin_delete_sq;
	cmd.delete_queue.qid = cpu_to_le16(TUTTI_KQ_QID);
	if (!tutti_kq_exec(c, &c->admin, &cmd, NULL)) {
		cmd.delete_queue.opcode = nvme_admin_delete_cq;
		tutti_kq_exec(c, &c->admin, &cmd, NULL);
	}
	c->io_ready = false;
}

static int tutti_scan_namespaces(struct tutti_ctrl *c)
{
	__le32 nsids[TUTTI_MAX_NS];
	unsigned int i;
	int ret;

	ret = tutti_identify(c, NVME_ID_CNS_NS_ACTIVE_LIST, 0);
	if (ret)
		return ret < 0 ? ret : -EIO;
	memcpy(nsids, c->kbuf, sizeof(nsids));
	for (i = 0; i < TUTTI_MAX_NS && nsids[i]; i++) {
		u32 nsid = le32_to_cpu(nsids[i]);
		struct nvme_id_ns *id = c->kbuf;
		struct tutti_ns *ns;
		u8 lbaf;

		ret = tutti_identify(c, NVME_ID_CNS_NS, nsid);
		if (ret)
			return ret < 0 ? ret : -EIO;
		lbaf = id->flbas & 0xf;
		if (!le64_to_cpu(id->nsze) || id->lbaf[lbaf].ds < 9 ||
		    id->lbaf[lbaf].ds > 12 || id->lbaf[lbaf].ms) {
			dev_info(&c->pdev->dev, "namespace %u: unsupported format, skipped\n",
				 nsid);
			continue;
		}
		ns = kzalloc(sizeof(*ns), GFP_KERNEL);
		if (!ns)
			return -ENOMEM;
		ns->ctrl = c;
		ns->nsid = nsid;
		ns->lba_shift = id->lbaf[lbaf].ds;
		ns->nsze = le64_to_cpu(id->nsze);
		c->ns[c->n_ns++] = ns;
	}
	return 0;
}

/**
 * tutti_ctrl_setup() - bring a freshly bound controller up
 * @c: controller with BAR0 mapped
 *
 * Return: 0 or a negative errno (everything allocated is left for
 * tutti_ctrl_teardown()).
 */
int tutti_ctrl_setup(struct tutti_ctrl *c)
{
	struct device *dev = &c->pdev->dev;
	u32 mps_min;
	int ret;

	c->cap = tutti_rd64(c, NVME_REG_CAP);
	c->vs = tutti_rd32(c, NVME_REG_VS);
	if (c->cap == ~0ull)
		return -ENODEV;
	mps_min = NVME_CAP_MPSMIN(c->cap);
	if (mps_min != 0 || PAGE_SIZE != 4096) {
		dev_err(dev, "needs 4 KiB memory pages (CAP.MPSMIN %u)\n", mps_min);
		return -ENODEV;
	}
	if (!(NVME_CAP_CSS(c->cap) & NVME_CAP_CSS_NVM)) {
		dev_err(dev, "NVM command set not supported\n");
		return -ENODEV;
	}
	c->page_size = 4096;
	c->dstrd = NVME_CAP_STRIDE(c->cap);
	c->mqes = NVME_CAP_MQES(c->cap) + 1;

	ret = tutti_ctrl_reset(c);
	if (ret) {
		dev_err(dev, "reset failed (%d)\n", ret);
		return ret;
	}
	ret = tutti_kq_alloc(c, &c->admin, 0, TUTTI_ADMIN_DEPTH);
	if (ret)
		return ret;
	c->kbuf_bytes = TUTTI_KBUF_MAX;
	c->kbuf = dma_alloc_coherent(dev, c->kbuf_bytes, &c->kbuf_dma, GFP_KERNEL);
	c->kprp = dma_alloc_coherent(dev, PAGE_SIZE, &c->kprp_dma, GFP_KERNEL);
	if (!c->kbuf || !c->kprp)
		return -ENOMEM;

	ret = tutti_ctrl_enable(c);
	if (ret) {
		dev_err(dev, "enable failed (%d, CSTS %#x)\n", ret,
			tutti_rd32(c, NVME_REG_CSTS));
		return ret;
	}

	mutex_lock(&c->io.lock);
	ret = tutti_identify(c, NVME_ID_CNS_CTRL, 0);
	if (!ret)
		memcpy(c->id, c->kbuf, sizeof(*c->id));
	mutex_unlock(&c->io.lock);
	if (ret) {
		dev_err(dev, "Identify Controller failed (%d)\n", ret);
		return ret < 0 ? ret : -EIO;
	}
	c->mdts_bytes = c->id->mdts ? c->page_size << c->id->mdts : 0;
	if (c->mdts_bytes && c->mdts_bytes < c->kbuf_bytes)
		c->kbuf_bytes = c->mdts_bytes;
	for (u32 i = 0; i < c->kbuf_bytes / PAGE_SIZE - 1; i++)
		c->kprp[i] = cpu_to_le64(c->kbuf_dma + (u64)(i + 1) * PAGE_SIZE);

	ret = tutti_set_queue_count(c);
	if (ret) {
		dev_err(dev, "Set Features (queue count) failed (%d)\n", ret);
		return ret;
	}
	c->db_bytes = PAGE_ALIGN((c->max_qid + 1) * 2 * (4 << c->dstrd));
	if (NVME_REG_DBS + c->db_bytes > c->bar_len) {
		c->max_qid = (c->bar_len - NVME_REG_DBS) / (2 * (4 << c->dstrd)) - 1;
		c->db_bytes = PAGE_ALIGN((c->max_qid + 1) * 2 * (4 << c->dstrd));
	}
	ret = tutti_create_kio_queue(c);
	if (ret) {
		dev_err(dev, "kernel I/O queue: %d\n", ret);
		return ret;
	}
	mutex_lock(&c->io.lock);
	ret = tutti_scan_namespaces(c);
	mutex_unlock(&c->io.lock);
	if (ret)
		return ret;
	tutti_cmb_setup(c);
	dev_info(dev, "%.40s, %u namespace(s), %u I/O queues, MDTS %u KiB, SGLS %#x%s\n",
		 c->id->mn, c->n_ns, c->max_qid, c->mdts_bytes >> 10,
		 le32_to_cpu(c->id->sgls), c->cmb_bytes ? ", CMB" : "");
	return 0;
}

/**
 * tutti_ctrl_teardown() - delete the module's queue, shut down, free
 * @c: controller (unbound, or a probe that failed)
 *
 * The module's rings and bounce buffer are freed only when the controller
 * is known to have stopped: a normal shutdown that ended with CSTS.RDY=0,
 * or a kill that confirmed it.  Otherwise they are left allocated.
 */
void tutti_ctrl_teardown(struct tutti_ctrl *c)
{
	struct device *dev = &c->pdev->dev;
	bool stopped;

	mutex_lock(&c->io.lock);
	mutex_lock(&c->admin.lock);
	if (!c->dead) {
		tutti_delete_kio_queue_locked(c);
		if (tutti_ctrl_shutdown(c))
			tutti_ctrl_kill(c, "shutdown did not end with CSTS.RDY=0");
	}
	stopped = !c->dead || tutti_ctrl_stopped(c);
	if (stopped) {
		tutti_kq_free(c, &c->io);
		tutti_kq_free(c, &c->admin);
		if (c->kbuf)
			dma_free_coherent(dev, TUTTI_KBUF_MAX, c->kbuf, c->kbuf_dma);
		if (c->kprp)
			dma_free_coherent(dev, PAGE_SIZE, c->kprp, c->kprp_dma);
	} else {
		dev_err(dev, "the module's queues and bounce buffer are left allocated\n");
	}
	/* Every later command sees no rings (tutti_kq_exec). */
	c->io.sq = NULL;
	c->io.cq = NULL;
	c->admin.sq = NULL;
	c->admin.cq = NULL;
	c->kbuf = NULL;
	c->kprp = NULL;
	mutex_unlock(&c->admin.lock);
	mutex_unlock(&c->io.lock);
}
