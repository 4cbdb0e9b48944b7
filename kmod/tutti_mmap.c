// SPDX-License-Identifier: GPL-2.0
/*
 * mmap of a tutti node: the doorbell page(s) of BAR0 and the controller's
 * CMB (both uncached), and the rings of the file's queues.
 *
 * Nothing is mapped when mmap() is called: every page is inserted by the
 * fault handler, which looks its target up under c->lock.  Deleting a
 * queue (c->lock held) takes it off the file's list and zaps its rings'
 * page table entries in every mapping of the file before the rings are
 * freed; unbinding sets c->gone and zaps everything.  A later access
 * faults again, finds nothing and gets SIGBUS: a process can never read or
 * write ring memory that was freed.  Mapping at mmap() time instead (as
 * remap_pfn_range does) leaves a window the zap cannot close: a new vma is
 * linked into the file's mapping tree only after f_op->mmap returns, so a
 * delete running in between misses its entries.
 *
 * Locking (tutti.h): mmap() and the fault handler run under mmap_lock (or,
 * for faults on 6.4+, the vma's lock) and take c->lock, which is therefore
 * never held where user memory is touched.
 */
#include <linux/mm.h>
#include <linux/pgtable.h>
#include <linux/version.h>

#include "tutti.h"

/* Ring page @idx: host DMA memory, in the linear map or (IOMMU) vmalloc'd. */
static unsigned long tutti_ring_pfn(void *ring, unsigned long idx)
{
	void *p = ring + idx * PAGE_SIZE;

	return is_vmalloc_addr(p) ? vmalloc_to_pfn(p) : page_to_pfn(virt_to_page(p));
}

/*
 * The pfn behind byte offset @off of the file (c->lock held; @off page
 * aligned), or 0 when nothing is there (any more).  @io: device memory.
 */
static unsigned long tutti_mmap_pfn(struct tutti_file *f, u64 off, bool *io)
{
	struct tutti_ctrl *c = f->ctrl;
	u32 qid = TUTTI_MMAP_QID(off);
	struct tutti_uq *q;
	u64 in;

	lockdep_assert_held(&c->lock);
	*io = true;
	switch (TUTTI_MMAP_TYPE(off)) {
	case 0:
		if (off < c->db_bytes)
			return (c->bar_phys + NVME_REG_DBS + off) >> PAGE_SHIFT;
		return 0;
	case 1:
		*io = false;
		q = tutti_queue_find(f, qid);
		in = off - TUTTI_MMAP_SQ(qid);
		if (q && !q->sq_peer && in < q->sq_bytes)
			return tutti_ring_pfn(q->sq, in >> PAGE_SHIFT);
		return 0;
	case 2:
		*io = false;
		q = tutti_queue_find(f, qid);
		in = off - TUTTI_MMAP_CQ(qid);
		if (q && !q->cq_peer && in < q->cq_bytes)
			return tutti_ring_pfn(q->cq, in >> PAGE_SHIFT);
		return 0;
	case 3:
		in = off - TUTTI_MMAP_CMB;
		if (in < c->cmb_bytes)
			return (c->cmb_phys + in) >> PAGE_SHIFT;
		return 0;
	}
	return 0;
}

static vm_fault_t tutti_vm_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct tutti_file *f = vma->vm_file->private_data;
	struct tutti_ctrl *c = f->ctrl;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	unsigned long pfn;
	pgprot_t prot;
	bool io;

	mutex_lock(&c->lock);
	if (!c->gone) {
		pfn = tutti_mmap_pfn(f, (u64)vmf->pgoff << PAGE_SHIFT, &io);
		prot = io ? pgprot_decrypted(vma->vm_page_prot) : vma->vm_page_prot;
		if (pfn)
			ret = vmf_insert_pfn_prot(vma, vmf->address, pfn, prot);
	}
	mutex_unlock(&c->lock);
	return ret;
}

static const struct vm_operations_struct tutti_vm_ops = {
	.fault = tutti_vm_fault,
};

/* Is [off, off + len) something this file may map?  (c->lock held) */
static int tutti_mmap_check(struct tutti_file *f, u64 off, u64 len, bool *io)
{
	struct tutti_ctrl *c = f->ctrl;
	struct tutti_uq *q;

	*io = true;
	switch (TUTTI_MMAP_TYPE(off)) {
	case 0:
		return !off && len <= c->db_bytes ? 0 : -EINVAL;
	case 1:
	case 2:
		*io = false;
		q = tutti_queue_find(f, TUTTI_MMAP_QID(off));
		if (!q || off & ((1ull << 24) - 1))
			return -EINVAL;
		if (TUTTI_MMAP_TYPE(off) == 1)
			return q->sq_peer || len > q->sq_bytes ? -EINVAL : 0;
		return q->cq_peer || len > q->cq_bytes ? -EINVAL : 0;
	case 3:
		off -= TUTTI_MMAP_CMB;
		if (!c->cmb_bytes)
			return -ENODEV;
		return off > c->cmb_bytes || len > c->cmb_bytes - off ? -EINVAL : 0;
	}
	return -EINVAL;
}

/**
 * tutti_mmap() - f_op->mmap of a node (mmap_lock held)
 * @file: the node
 * @vma: MAP_SHARED; offset and length checked here, pages inserted on fault
 *
 * Mappings are not inherited by children (VM_DONTCOPY) and never grow.
 */
int tutti_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct tutti_file *f = file->private_data;
	struct tutti_ctrl *c = f->ctrl;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	bool io = true;
	int ret;

	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (!capable(CAP_SYS_RAWIO))
		return -EPERM;
	mutex_lock(&c->lock);
	ret = c->gone ? -ENODEV : tutti_mmap_check(f, off, vma->vm_end - vma->vm_start, &io);
	mutex_unlock(&c->lock);
	if (ret)
		return ret;
	if (io)
		vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP);
#else
	vma->vm_flags |= VM_IO | VM_PFNMAP | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP;
#endif
	vma->vm_ops = &tutti_vm_ops;
	return 0;
}
