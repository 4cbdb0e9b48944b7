// SPDX-License-Identifier: GPL-2.0
/*
 * Pinning a process's buffers and handing it their bus addresses.  Pages
 * are pinned long term (FOLL_LONGTERM: never migrated while the device may
 * address them), counted against RLIMIT_MEMLOCK, and mapped for DMA in
 * both directions.  The process builds PRP lists or SGLs from the page
 * addresses itself.  Mappings live until unmapped or until the file is
 * released, which happens only after the file's queues were deleted.
 */
#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "tutti.h"

#define TUTTI_BUS_CHUNK	512	/* addresses copied out at a time */

static void tutti_dma_free(struct tutti_ctrl *c, struct tutti_dma *d)
{
	if (d->sgt.sgl) {
		if (d->mapped)
			dma_unmap_sgtable(&c->pdev->dev, &d->sgt, DMA_BIDIRECTIONAL, 0);
		sg_free_table(&d->sgt);
	}
	if (d->npinned) {
		unpin_user_pages_dirty_lock(d->pages, d->npinned, true);
		atomic_long_sub(d->npinned, &c->pinned_pages);
	}
	kvfree(d->pages);
	if (d->mm) {
		if (d->accounted && mmget_not_zero(d->mm)) {
			account_locked_vm(d->mm, d->npages, false);
			mmput(d->mm);
		}
		mmdrop(d->mm);
	}
	kfree(d);
}

static int tutti_dma_pin(struct tutti_dma *d)
{
	unsigned int flags = FOLL_WRITE | FOLL_LONGTERM;

	while (d->npinned < d->npages) {
		int n = pin_user_pages_fast(d->vaddr + d->npinned * PAGE_SIZE,
					    (int)min_t(unsigned long, d->npages - d->npinned,
						       INT_MAX / 2),
					    flags, d->pages + d->npinned);

		if (n <= 0)
			return n == 0 || n == -EFAULT || n == -ENOMEM ? -EFAULT : n;
		d->npinned += n;
	}
	return 0;
}

static int tutti_dma_copy_bus(struct tutti_dma *d, u64 __user *ubus)
{
	struct sg_dma_page_iter it;
	unsigned long done = 0;
	unsigned int n = 0;
	u64 *chunk;
	int ret = 0;

	chunk = kmalloc_array(TUTTI_BUS_CHUNK, sizeof(*chunk), GFP_KERNEL);
	if (!chunk)
		return -ENOMEM;
	for_each_sgtable_dma_page(&d->sgt, &it, 0) {
		chunk[n++] = sg_page_iter_dma_address(&it);
		if (n == TUTTI_BUS_CHUNK) {
			if (copy_to_user(ubus + done, chunk, n * sizeof(*chunk))) {
				ret = -EFAULT;
				goto out;
			}
			done += n;
			n = 0;
		}
	}
	if (n && copy_to_user(ubus + done, chunk, n * sizeof(*chunk)))
		ret = -EFAULT;
	else if (done + n != d->npages)
		ret = -EIO;
out:
	kfree(chunk);
	return ret;
}

/**
 * tutti_dma_map() - pin and map [vaddr, vaddr + len) (c->lock held)
 * @f: owner
 * @arg: request; handle filled on success, bus addresses copied out
 *
 * Return: 0; -EINVAL unaligned or out-of-range arguments; -EFAULT memory
 * that is not ordinary user memory of the caller (unmapped, I/O memory,
 * read-only) or an unwritable @arg->bus; -ENOMEM over RLIMIT_MEMLOCK.
 */
int tutti_dma_map(struct tutti_file *f, struct tutti_dma_map *arg)
{
	struct tutti_ctrl *c = f->ctrl;
	struct tutti_dma *d;
	u32 id;
	int ret;

	if (arg->flags || !arg->len || arg->len > TUTTI_DMA_MAX_BYTES ||
	    !PAGE_ALIGNED(arg->vaddr) || !PAGE_ALIGNED(arg->len) ||
	    arg->vaddr + arg->len < arg->vaddr ||
	    arg->vaddr + arg->len > TASK_SIZE || !arg->bus ||
	    arg->bus_cap < arg->len >> PAGE_SHIFT)
		return -EINVAL;
	if (!current->mm)
		return -EFAULT;
	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d)
		return -ENOMEM;
	d->vaddr = arg->vaddr;
	d->npages = arg->len >> PAGE_SHIFT;
	d->mm = current->mm;
	mmgrab(d->mm);
	ret = account_locked_vm(d->mm, d->npages, true);
	if (ret)
		goto fail;
	d->accounted = true;
	d->pages = kvmalloc_array(d->npages, sizeof(*d->pages), GFP_KERNEL);
	if (!d->pages) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = tutti_dma_pin(d);
	atomic_long_add(d->npinned, &c->pinned_pages);
	if (ret)
		goto fail;
	ret = sg_alloc_table_from_pages(&d->sgt, d->pages, d->npages, 0,
					arg->len, GFP_KERNEL);
	if (ret) {
		d->sgt.sgl = NULL;
		goto fail;
	}
	ret = dma_map_sgtable(&c->pdev->dev, &d->sgt, DMA_BIDIRECTIONAL, 0);
	if (ret)
		goto fail;
	d->mapped = true;
	ret = tutti_dma_copy_bus(d, u64_to_user_ptr(arg->bus));
	if (ret)
		goto fail;
	ret = xa_alloc(&f->dmas, &id, d, xa_limit_31b, GFP_KERNEL);
	if (ret)
		goto fail;
	arg->handle = id;
	return 0;
fail:
	tutti_dma_free(c, d);
	return ret;
}

/** tutti_dma_unmap() - drop one mapping (c->lock held); -EINVAL if unknown. */
int tutti_dma_unmap(struct tutti_file *f, u32 handle)
{
	struct tutti_dma *d = xa_erase(&f->dmas, handle);

	if (!d)
		return -EINVAL;
	tutti_dma_free(f->ctrl, d);
	return 0;
}

/** tutti_dmas_release() - drop every mapping of @f (queues already gone). */
void tutti_dmas_release(struct tutti_file *f)
{
	struct tutti_dma *d;
	unsigned long id;

	xa_for_each(&f->dmas, id, d) {
		xa_erase(&f->dmas, id);
		tutti_dma_free(f->ctrl, d);
	}
}
