// SPDX-License-Identifier: GPL-2.0
/*
 * tutti.ko: the file operations of /dev/tuttiN (controller) and
 * /dev/tuttiNnM (namespace): argument checks, then dispatch to tutti_ctrl.c,
 * tutti_queue.c, tutti_dma.c, tutti_cmb.c and tutti_p2p.c.  Reads and writes
 * of a namespace node go through the module's own queues; queue pairs,
 * doorbells and buffers reach user space through ioctl and mmap.
 */
#include <linux/capability.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "tutti.h"

static u64 tutti_ns_bytes(const struct tutti_ns *ns)
{
	return ns->nsze << ns->lba_shift;
}

static void tutti_file_release(struct kref *ref)
{
	struct tutti_file *f = container_of(ref, struct tutti_file, ref);
	struct tutti_ctrl *c = f->ctrl;

	xa_destroy(&f->dmas);
	xa_destroy(&f->p2ps);
	kfree(f);
	tutti_ctrl_put(c);
}

/* The last reference: the file's own, or a GPU range's (tutti_p2p.c). */
void tutti_file_put(struct tutti_file *f)
{
	kref_put(&f->ref, tutti_file_release);
}

static int tutti_open(struct inode *inode, struct file *file)
{
	struct miscdevice *misc = file->private_data;
	struct tutti_node *node = container_of(misc, struct tutti_node, misc);
	struct tutti_ctrl *c = node->ctrl;
	struct tutti_file *f;

	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	kref_init(&f->ref);
	f->ctrl = c;
	f->ns = node->ns;
	f->filp = file;
	INIT_LIST_HEAD(&f->queues);
	INIT_LIST_HEAD(&f->dma_zombies);
	mutex_init(&f->qlock);
	xa_init_flags(&f->dmas, XA_FLAGS_ALLOC1);
	xa_init_flags(&f->p2ps, XA_FLAGS_ALLOC1);
	mutex_lock(&c->lock);
	if (c->gone) {
		mutex_unlock(&c->lock);
		kfree(f);
		return -ENODEV;
	}
	kref_get(&c->ref);
	list_add_tail(&f->node, &c->files);
	mutex_unlock(&c->lock);
	file->private_data = f;
	/* The read/write path never uses the page cache. */
	if (f->ns)
		file->f_mode |= FMODE_CAN_ODIRECT;
	return 0;
}

static int tutti_release(struct inode *inode, struct file *file)
{
	struct tutti_file *f = file->private_data;
	struct tutti_ctrl *c = f->ctrl;
	LIST_HEAD(unpin);
	LIST_HEAD(gpu);

	/*
	 * Queues first (deleted on the controller, or the controller stopped),
	 * then the memory they addressed: unpinned outside c->lock (it takes
	 * mmap_lock), GPU ranges given back outside it too (tutti_p2p.c).
	 * After an unbind (gone) the queues and pins were taken already.
	 */
	mutex_lock(&c->lock);
	list_del(&f->node);
	if (!c->gone)
		tutti_queues_release(f);
	tutti_dmas_take(f, &unpin, false);
	tutti_p2p_detach_all(f, &gpu);
	mutex_unlock(&c->lock);
	tutti_dmas_free(c, &unpin);
	tutti_p2p_teardown_list(&gpu);
	tutti_file_put(f);
	return 0;
}

/* Check the offset and length of a read/write against the namespace. */
static ssize_t tutti_rw_check(struct tutti_ns *ns, loff_t pos, size_t *len)
{
	u64 size = tutti_ns_bytes(ns);
	u64 mask = (1ull << ns->lba_shift) - 1;

	if (pos < 0 || (pos & mask) || (*len & mask))
		return -EINVAL;
	if ((u64)pos >= size)
		return 0;
	*len = min_t(u64, *len, size - pos);
	*len = min_t(size_t, *len, MAX_RW_COUNT & ~mask);
	return 1;
}

static ssize_t tutti_rw(struct file *file, char __user *ubuf, size_t len,
			loff_t *ppos, bool write)
{
	struct tutti_file *f = file->private_data;
	struct tutti_ns *ns = f->ns;
	struct tutti_ctrl *c = f->ctrl;
	size_t done = 0;
	ssize_t ret;

	if (!ns)
		return -EINVAL;
	ret = tutti_rw_check(ns, *ppos, &len);
	if (ret <= 0)
		return ret == 0 && write ? -ENOSPC : ret;
	while (done < len) {
		u32 chunk = min_t(size_t, len - done, c->kbuf_bytes);
		u64 lba = (*ppos + done) >> ns->lba_shift;

		mutex_lock(&c->io.lock);
		if (READ_ONCE(c->gone)) {
			ret = -ENODEV;
		} else if (write && copy_from_user(c->kbuf, ubuf + done, chunk)) {
			ret = -EFAULT;
		} else {
			ret = tutti_kio(ns, write, lba, chunk >> ns->lba_shift, NULL);
			if (!ret && !write && copy_to_user(ubuf + done, c->kbuf, chunk))
				ret = -EFAULT;
		}
		mutex_unlock(&c->io.lock);
		if (ret)
			break;
		done += chunk;
		if (fatal_signal_pending(current))
			break;
	}
	if (!done)
		return ret;
	*ppos += done;
	return done;
}

static ssize_t tutti_read(struct file *file, char __user *buf, size_t len,
			  loff_t *ppos)
{
	return tutti_rw(file, buf, len, ppos, false);
}

static ssize_t tutti_write(struct file *file, const char __user *buf,
			   size_t len, loff_t *ppos)
{
	return tutti_rw(file, (char __user *)buf, len, ppos, true);
}

static loff_t tutti_llseek(struct file *file, loff_t off, int whence)
{
	struct tutti_file *f = file->private_data;

	return fixed_size_llseek(file, off, whence, f->ns ? tutti_ns_bytes(f->ns) : 0);
}

static int tutti_fsync(struct file *file, loff_t start, loff_t end, int datasync)
{
	struct tutti_file *f = file->private_data;

	if (!f->ns)
		return -EINVAL;
	/* tutti_kflush() checks gone under io.lock: an unbind may be running. */
	return tutti_kflush(f->ns);
}

static void tutti_fill_info(struct tutti_file *f, struct tutti_info *info)
{
	struct tutti_ctrl *c = f->ctrl;

	memset(info, 0, sizeof(*info));
	info->argsz = sizeof(*info);
	info->instance = c->instance;
	info->cap = c->cap;
	info->vs = c->vs;
	info->mdts_bytes = c->mdts_bytes;
	info->sgls = le32_to_cpu(c->id->sgls);
	info->page_size = c->page_size;
	info->max_qid = c->max_qid;
	info->mqes = c->mqes;
	info->dstrd = c->dstrd;
	info->db_bytes = c->db_bytes;
	info->nn = le32_to_cpu(c->id->nn);
	if (f->ns) {
		info->flags |= TUTTI_INFO_NS;
		info->nsid = f->ns->nsid;
		info->lba_shift = f->ns->lba_shift;
		info->nsze = f->ns->nsze;
	}
	if (c->cmb_bytes) {
		info->flags |= TUTTI_INFO_CMB;
		if (c->cmbsz & NVME_CMBSZ_SQS)
			info->flags |= TUTTI_INFO_CMB_SQS;
		if ((c->cmbsz & NVME_CMBSZ_RDS) && (c->cmbsz & NVME_CMBSZ_WDS))
			info->flags |= TUTTI_INFO_CMB_DATA;
		info->cmb_bus = c->cmb_bus;
		info->cmb_bytes = c->cmb_bytes;
	}
	if (TUTTI_HAVE_NV_P2P)
		info->flags |= TUTTI_INFO_NV_P2P;
	info->vid = le16_to_cpu(c->id->vid);
	info->ssvid = le16_to_cpu(c->id->ssvid);
	memcpy(info->sn, c->id->sn, sizeof(info->sn));
	memcpy(info->mn, c->id->mn, sizeof(info->mn));
	memcpy(info->fr, c->id->fr, sizeof(info->fr));
	strscpy(info->bdf, pci_name(c->pdev), sizeof(info->bdf));
}

/* Identify (CNS 0/1/2) and Get Log Page (error, SMART, firmware) only. */
static int tutti_admin_ioctl(struct tutti_file *f, struct tutti_admin *a)
{
	struct nvme_command cmd = { };
	u32 len = a->data_len;
	int ret;

	if (a->rsvd[0] || a->rsvd[1] || a->rsvd[2] || a->reserved || !a->data)
		return -EINVAL;
	if (a->cdw11 || a->cdw12 || a->cdw13 || a->cdw14)
		return -EINVAL;
	switch (a->opcode) {
	case nvme_admin_identify:
		if (len != 4096 || a->cdw10 > NVME_ID_CNS_NS_ACTIVE_LIST)
			return -EINVAL;
		break;
	case nvme_admin_get_log_page:
		if (!len || len > 4096 || (len & 3))
			return -EINVAL;
		if (a->cdw10 != NVME_LOG_ERROR && a->cdw10 != NVME_LOG_SMART &&
		    a->cdw10 != NVME_LOG_FW_SLOT)
			return -EINVAL;
		break;
	default:
		return -EINVAL;
	}
	cmd.common.opcode = a->opcode;
	cmd.common.nsid = cpu_to_le32(a->nsid);
	cmd.common.cdw10 = cpu_to_le32(a->cdw10);
	if (a->opcode == nvme_admin_get_log_page)	/* NUMDL: dwords - 1 */
		cmd.common.cdw10 |= cpu_to_le32(((len / 4) - 1) << 16);
	ret = tutti_admin_passthru(f->ctrl, &cmd, u64_to_user_ptr(a->data), len,
				   &a->result);
	if (ret < 0)
		return ret;
	a->status = ret;
	return 0;
}

static u32 sb_u32(const u8 *p)
{
	__le32 v;

	memcpy(&v, p, sizeof(v));
	return le32_to_cpu(v);
}

static u64 sb_u64(const u8 *p)
{
	__le64 v;

	memcpy(&v, p, sizeof(v));
	return le64_to_cpu(v);
}

/* Read the Tutti superblock (copy A, else B) of a namespace. */
static int tutti_extents_ioctl(struct tutti_file *f, struct tutti_extents *e)
{
	struct tutti_ns *ns = f->ns;
	struct tutti_ctrl *c = f->ctrl;
	int ret = 0, copy;
	u8 *sb;

	if (!ns)
		return -EINVAL;
	memset(e, 0, sizeof(*e));
	e->argsz = sizeof(*e);
	mutex_lock(&c->io.lock);
	if (READ_ONCE(c->gone))
		ret = -ENODEV;
	for (copy = 0; !ret && copy < 2; copy++) {
		u32 nlb = 4096 >> ns->lba_shift;

		ret = tutti_kio(ns, false, (u64)copy * nlb, nlb, NULL);
		if (ret)
			break;
		sb = c->kbuf;
		if (memcmp(sb, "TUTTIKV1", 8) || sb_u32(sb + 8) != 1 ||
		    sb_u32(sb + 12) != 4096)
			continue;
		e->flags = TUTTI_EXTENTS_VALID;
		memcpy(e->uuid, sb + 16, 16);
		e->member_index = sb_u32(sb + 32);
		e->n_members = sb_u32(sb + 36);
		e->table_off = sb_u64(sb + 72);
		e->table_bytes = sb_u64(sb + 80);
		e->data_off = sb_u64(sb + 88);
		e->member_bytes = sb_u64(sb + 96);
		break;
	}
	mutex_unlock(&c->io.lock);
	return ret;
}

/**
 * tutti_p2p_check_map() - check a TUTTI_IOC_P2P_MAP request's arguments
 * @a: the request
 *
 * In both builds, so that a module without nvidia-p2p refuses malformed
 * requests (-EINVAL) the same way before it answers -EOPNOTSUPP.
 *
 * Return: 0 or -EINVAL.
 */
int tutti_p2p_check_map(const struct tutti_p2p_map *a)
{
	if (a->flags || !a->vaddr || !a->len || a->len > TUTTI_P2P_MAX_BYTES)
		return -EINVAL;
	/* NVIDIA's P2P pages are 64 KiB: start and length on that grain. */
	if (!IS_ALIGNED(a->vaddr, TUTTI_P2P_GPU_PAGE) ||
	    !IS_ALIGNED(a->len, TUTTI_P2P_GPU_PAGE))
		return -EINVAL;
	if (a->vaddr + a->len < a->vaddr)
		return -EINVAL;
	if (!a->bus || a->bus_cap < a->len >> PAGE_SHIFT)
		return -EINVAL;
	return 0;
}

/*
 * GPU ranges: checked here, then handled without c->lock (tutti_p2p.c
 * must not hold it across calls into the NVIDIA driver).
 */
static long tutti_p2p_ioctl(struct tutti_file *f, unsigned int cmd, void __user *up)
{
	union {
		struct tutti_p2p_map m;
		struct tutti_p2p_unmap u;
	} a;
	long ret;

	if (copy_from_user(&a, up, _IOC_SIZE(cmd)))
		return -EFAULT;
	if (a.m.argsz != _IOC_SIZE(cmd))
		return -EINVAL;
	if (cmd == TUTTI_IOC_P2P_UNMAP)
		return a.u.handle ? tutti_p2p_unmap(f, a.u.handle) : -EINVAL;
	ret = tutti_p2p_check_map(&a.m);
	if (ret)
		return ret;
	ret = tutti_p2p_map(f, &a.m);
	if (!ret && copy_to_user(up, &a.m, sizeof(a.m))) {
		tutti_p2p_unmap(f, a.m.handle);
		ret = -EFAULT;
	}
	return ret;
}

/*
 * Copy in an argument whose first u32 is its size.  The size in the ioctl
 * number already matched (else -ENOTTY); argsz must match too.
 */
static int tutti_arg_in(void *arg, void __user *uarg, size_t size)
{
	if (copy_from_user(arg, uarg, size))
		return -EFAULT;
	if (*(u32 *)arg != size)
		return -EINVAL;
	return 0;
}

/* Queue creation and deletion: c->lock, the controller still bound. */
static long tutti_queue_ioctl(struct tutti_file *f, unsigned int cmd, void *arg)
{
	struct tutti_ctrl *c = f->ctrl;
	LIST_HEAD(unpin);
	long ret;

	mutex_lock(&c->lock);
	if (c->gone)
		ret = -ENODEV;
	else if (cmd == TUTTI_IOC_QUEUE_CREATE)
		ret = tutti_queue_create(f, arg);
	else
		ret = tutti_queue_delete(f, ((struct tutti_queue_delete *)arg)->qid, &unpin);
	mutex_unlock(&c->lock);
	tutti_dmas_free(c, &unpin);
	return ret;
}

/*
 * Dispatch.  No tutti lock is held here: each handler takes the locks it
 * needs in the documented order (tutti.h), and none but c->io.lock is held
 * across user memory access (arguments are copied in before and out after).
 */
static long tutti_ioctl(struct file *file, unsigned int cmd, unsigned long uarg)
{
	struct tutti_file *f = file->private_data;
	struct tutti_ctrl *c = f->ctrl;
	void __user *up = (void __user *)uarg;
	union {
		struct tutti_info info;
		struct tutti_queue_create qc;
		struct tutti_queue_delete qd;
		struct tutti_dma_map dm;
		struct tutti_dma_unmap du;
		struct tutti_admin ad;
		struct tutti_extents ex;
	} a;
	size_t size = _IOC_SIZE(cmd);
	bool out = _IOC_DIR(cmd) & _IOC_READ;
	long ret;

	switch (cmd) {
	case TUTTI_IOC_INFO:
	case TUTTI_IOC_EXTENTS:
		break;
	case TUTTI_IOC_QUEUE_CREATE:
	case TUTTI_IOC_QUEUE_DELETE:
	case TUTTI_IOC_DMA_MAP:
	case TUTTI_IOC_DMA_UNMAP:
	case TUTTI_IOC_ADMIN:
		/* Queues and pinned memory mean raw DMA: see docs/kmod.md. */
		if (!capable(CAP_SYS_RAWIO))
			return -EPERM;
		break;
	case TUTTI_IOC_P2P_MAP:
	case TUTTI_IOC_P2P_UNMAP:
		if (!capable(CAP_SYS_RAWIO))
			return -EPERM;
		return tutti_p2p_ioctl(f, cmd, up);
	default:
		return -ENOTTY;
	}
	ret = tutti_arg_in(&a, up, size);
	if (ret)
		return ret;
	if (READ_ONCE(c->gone))
		return -ENODEV;

	switch (cmd) {
	case TUTTI_IOC_INFO:
		tutti_fill_info(f, &a.info);	/* fixed since probe */
		break;
	case TUTTI_IOC_EXTENTS:
		ret = tutti_extents_ioctl(f, &a.ex);
		break;
	case TUTTI_IOC_QUEUE_CREATE:
	case TUTTI_IOC_QUEUE_DELETE:
		ret = tutti_queue_ioctl(f, cmd, &a);
		break;
	case TUTTI_IOC_DMA_MAP:
		ret = tutti_dma_map(f, &a.dm);
		break;
	case TUTTI_IOC_DMA_UNMAP:
		ret = tutti_dma_unmap(f, a.du.handle);
		break;
	case TUTTI_IOC_ADMIN:
		ret = tutti_admin_ioctl(f, &a.ad);
		break;
	}
	if (!ret && out && copy_to_user(up, &a, size))
		ret = -EFAULT;
	return ret;
}

const struct file_operations tutti_fops = {
	.owner = THIS_MODULE,
	.open = tutti_open,
	.release = tutti_release,
	.read = tutti_read,
	.write = tutti_write,
	.llseek = tutti_llseek,
	.fsync = tutti_fsync,
	.unlocked_ioctl = tutti_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = tutti_mmap,
};
