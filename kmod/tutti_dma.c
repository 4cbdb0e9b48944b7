// SPDX-License-Identifier: GPL-2.0
/*
 * Pinning a process's buffers and handing it their bus addresses.  Pages
 * are pinned long term (FOLL_LONGTERM: never migrated while the device may
 * address them), counted against RLIMIT_MEMLOCK, and mapped for DMA in
 * both directions.  The process builds PRP lists or SGLs from the page
 * addresses itself.  Mappings live until unmapped or until the file is
 * released, which happens only after the file's queues were deleted.
 *
 * A mapping unmapped while the file has a live queue may still be the
 * target of a command in flight (the module never sees the commands): it
 * is kept pinned (f->dma_zombies) until the file has no live queue, i.e.
 * until the queues that could address it were deleted on the controller.
 *
 * Locking (tutti.h): pinning, unpinning, RLIMIT_MEMLOCK accounting and the
 * copy of the bus addresses touch the caller's mm (mmap_lock), so they run
 * under no tutti lock; c->lock and f->qlock are taken only around the
 * bookkeeping (the xarray, the zombie list).
 */
#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "tutti.h"

#define TUTTI_BUS_CHUNK	512	/* addresses copied out at a time */

/* Unpin, unmap and unaccount one mapping (no tutti lock held: mmap_lock). */
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

/* Publish @d in @f's table unless the controller was unbound meanwhile. */
static int tutti_dma_publish(struct tutti_file *f, struct tutti_dma *d, u32 *id)
{
	struct tutti_ctrl *c = f->ctrl;
	int ret;

	mutex_lock(&c->lock);
	if (c->gone) {
		ret = -ENODEV;
	} else {
		mutex_lock(&f->qlock);
		ret = xa_alloc(&f->dmas, id, d, xa_limit_31b, GFP_KERNEL);
		mutex_unlock(&f->qlock);
	}
	mutex_unlock(&c->lock);
	return ret;
}

/**
 * tutti_dma_map() - pin and map [vaddr, vaddr + len) (no tutti lock held)
 * @f: owner
 * @arg: request; handle filled on success, bus addresses copied out
 *
 * Return: 0; -EINVAL unaligned or out-of-range arguments; -EFAULT memory
 * that is not ordinary user memory of the caller (unmapped, I/O memory,
 * read-only) or an unwritable @arg->bus; -ENOMEM over RLIMIT_MEMLOCK;
 * -ENODEV the controller was unbound.
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
	INIT_LIST_HEAD(&d->node);
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
	ret = tutti_dma_publish(f, d, &id);
	if (ret)
		goto fail;
	arg->handle = id;
	return 0;
fail:
	/* Not published: no queue of the file was told these addresses. */
	tutti_dma_free(c, d);
	return ret;
}

/**
 * tutti_dma_unmap() - drop one mapping (no tutti lock held)
 * @f: owner
 * @handle: from tutti_dma_map()
 *
 * Unpinned at once when the file has no live queue, else when it has none
 * any more (a command in flight may still address the pages).
 *
 * Return: 0, or -EINVAL for an unknown handle.
 */
int tutti_dma_unmap(struct tutti_file *f, u32 handle)
{
	struct tutti_dma *d;
	bool later;

	mutex_lock(&f->qlock);
	d = xa_erase(&f->dmas, handle);
	later = d && (tutti_file_has_live_queue(f) || f->leaked);
	if (later)
		list_add_tail(&d->node, &f->dma_zombies);
	mutex_unlock(&f->qlock);
	if (!d)
		return -EINVAL;
	if (!later)
		tutti_dma_free(f->ctrl, d);
	return 0;
}

/**
 * tutti_dmas_take() - take the mappings of @f that may be unpinned now
 * @f: file (its queues deleted, or @zombies_only)
 * @out: list they are moved to; free them with tutti_dmas_free() after
 *       dropping c->lock
 * @zombies_only: only those unmapped earlier, and only if the file has no
 *       live queue left; otherwise every mapping (release, unbind)
 *
 * Nothing is taken from a file whose queue could not be proven stopped
 * (f->leaked): those pages stay pinned for good.
 */
void tutti_dmas_take(struct tutti_file *f, struct list_head *out, bool zombies_only)
{
	struct tutti_dma *d;
	unsigned long id;

	mutex_lock(&f->qlock);
	if (f->leaked || (zombies_only && tutti_file_has_live_queue(f))) {
		mutex_unlock(&f->qlock);
		return;
	}
	list_splice_tail_init(&f->dma_zombies, out);
	if (!zombies_only) {
		xa_for_each(&f->dmas, id, d) {
			xa_erase(&f->dmas, id);
			list_add_tail(&d->node, out);
		}
	}
	mutex_unlock(&f->qlock);
}

/** tutti_dmas_free() - unpin what tutti_dmas_take() took (no tutti lock held). */
void tutti_dmas_free(struct tutti_ctrl *c, struct list_head *list)
{
	struct tutti_dma *d, *tmp;

	list_for_each_entry_safe(d, tmp, list, node) {
		list_del(&d->node);
		tutti_dma_free(c, d);
	}
}
