// SPDX-License-Identifier: GPL-2.0
/*
 * GPU memory through NVIDIA's peer-to-peer API (nv-p2p.h, "GPUDirect
 * RDMA").  Built only when the Kbuild is given the directory of the NVIDIA
 * driver's nv-p2p.h (make NV_P2P_INC=...): see docs/kmod.md.
 *
 * TUTTI_IOC_P2P_MAP pins a range of the caller's GPU memory with
 * nvidia_p2p_get_pages(), maps it for this controller with
 * nvidia_p2p_dma_map_pages() and hands out one bus address per PAGE_SIZE
 * page, exactly like TUTTI_IOC_DMA_MAP does for host memory, so the PRP/SGL
 * builders consume it unchanged.  A queue's SQ and/or CQ can be placed in
 * such a range (TUTTI_QUEUE_SQ_GPU / _CQ_GPU): the same "ring at a bus
 * address of device memory" path a peer CMB uses.
 *
 * Revocation.  The GPU driver may take the memory back at any time
 * (cudaFree, the CUDA context's exit, which at process exit can come before
 * or after this file's release) and then calls tutti_p2p_free_cb().  Before
 * that callback returns, every queue of the owning file is deleted on the
 * controller (tutti_queues_revoke(): a completed Delete SQ means the
 * controller has finished or aborted all of that queue's commands), so no
 * DMA of this module's queues reaches the memory afterwards; if a delete
 * fails the controller is disabled.  The whole file's queues, not only
 * those with a ring in the range, because any of them may have reads or
 * writes in flight that address it.
 *
 * Locking against the NVIDIA driver.  The callback runs with the resource
 * manager's locks held (it is reached from the RM's memory-free path), and
 * nvidia_p2p_get_pages(), _dma_map_pages() and _put_pages() take those
 * locks.  Hence:
 *  - no lock the callback takes is held across those three calls: this
 *    file calls them without c->lock, and the callback never takes c->lock
 *    (which is held across user-memory access elsewhere); it takes only
 *    f->qlock (list changes and admin commands, nothing that waits for the
 *    GPU driver), the admin queue's lock and p->lock (a spinlock);
 *  - the callback waits for this file's code only while that code reads the
 *    page table or mapping or runs nvidia_p2p_dma_unmap_pages() (p->busy):
 *    that function takes no RM lock (checked in the 535 driver's
 *    kernel-open/nvidia/nv-p2p.c), so the wait is bounded;
 *  - once the callback has been entered (p->revoked), this file never
 *    touches the page table or the mapping again: the NVIDIA driver frees
 *    both when the callback returns.  nvidia_p2p_put_pages() is skipped
 *    then; when it races with the callback it finds the table already
 *    unlinked and returns 0 without touching it (nv-p2p.c: "does not race").
 * One window cannot be closed from here: if the memory is freed while
 * nvidia_p2p_dma_map_pages() is still reading the page table (a process
 * freeing the very range it is pinning, from another thread), that call
 * runs on a freed table inside the NVIDIA driver; the same holds for every
 * user of that API (nvidia-peermem included).
 *
 * Lifetime.  A range belongs to the file that mapped it (f->p2ps).  It is
 * given back by TUTTI_IOC_P2P_UNMAP (-EBUSY while a ring of the file lives
 * in it), by the file's release (after the file's queues were deleted: a
 * crash included, as release runs on exit), or by unbinding the controller.
 * The bookkeeping (struct tutti_p2p) is reference counted: the file's
 * table, and each queue with a ring in the range, hold one; the range
 * holds the file, whose queues the callback must reach.
 */
#include <linux/completion.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "nv-p2p.h"

#include "tutti.h"

#define TUTTI_P2P_MAX_MAPS	4096		/* GPU ranges per open file */
#define TUTTI_P2P_CHUNK		512		/* addresses copied out at a time */

/*
 * The NVIDIA functions, looked up with symbol_get() when a range is mapped
 * and released with symbol_put() when it is given back, rather than linked
 * (a module dependency on nvidia.ko): tutti.ko then loads, and serves NVMe,
 * on machines without the NVIDIA driver or with a driver built after this
 * module (no Module.symvers of it needed at build time); nvidia.ko cannot
 * be unloaded while a range is pinned (each symbol_get holds it); and
 * without nvidia.ko loaded TUTTI_IOC_P2P_MAP answers -ENODEV.  symbol_get
 * needs EXPORT_SYMBOL_GPL exports on 6.5+ kernels: the driver's
 * NV_EXPORT_SYMBOL is exactly that.
 */
struct tutti_nv {
	typeof(&nvidia_p2p_get_pages) get_pages;
	typeof(&nvidia_p2p_put_pages) put_pages;
	typeof(&nvidia_p2p_dma_map_pages) dma_map_pages;
	typeof(&nvidia_p2p_dma_unmap_pages) dma_unmap_pages;
	typeof(&nvidia_p2p_free_page_table) free_page_table;
	typeof(&nvidia_p2p_free_dma_mapping) free_dma_mapping;
};

static void tutti_nv_put(struct tutti_nv *nv)
{
	if (nv->get_pages)
		symbol_put(nvidia_p2p_get_pages);
	if (nv->put_pages)
		symbol_put(nvidia_p2p_put_pages);
	if (nv->dma_map_pages)
		symbol_put(nvidia_p2p_dma_map_pages);
	if (nv->dma_unmap_pages)
		symbol_put(nvidia_p2p_dma_unmap_pages);
	if (nv->free_page_table)
		symbol_put(nvidia_p2p_free_page_table);
	if (nv->free_dma_mapping)
		symbol_put(nvidia_p2p_free_dma_mapping);
	memset(nv, 0, sizeof(*nv));
}

static int tutti_nv_get(struct tutti_nv *nv)
{
	nv->get_pages = symbol_get(nvidia_p2p_get_pages);
	nv->put_pages = symbol_get(nvidia_p2p_put_pages);
	nv->dma_map_pages = symbol_get(nvidia_p2p_dma_map_pages);
	nv->dma_unmap_pages = symbol_get(nvidia_p2p_dma_unmap_pages);
	nv->free_page_table = symbol_get(nvidia_p2p_free_page_table);
	nv->free_dma_mapping = symbol_get(nvidia_p2p_free_dma_mapping);
	if (!nv->get_pages || !nv->put_pages || !nv->dma_map_pages ||
	    !nv->dma_unmap_pages || !nv->free_page_table || !nv->free_dma_mapping) {
		tutti_nv_put(nv);
		return -ENODEV;		/* nvidia.ko is not loaded */
	}
	return 0;
}

enum tutti_p2p_state {
	TUTTI_P2P_NEW,		/* nothing pinned yet */
	TUTTI_P2P_PINNED,	/* page table held, being set up */
	TUTTI_P2P_LIVE,		/* pinned and mapped, addresses handed out */
	TUTTI_P2P_RELEASING,	/* being given back by this module */
	TUTTI_P2P_REVOKED,	/* taken back by the GPU driver */
};

/* A pinned, DMA-mapped GPU range (see the comment at the top). */
struct tutti_p2p {
	struct kref ref;
	struct list_head node;		/* on a teardown list */
	struct tutti_file *file;	/* referenced: the callback stops its queues */
	struct pci_dev *pdev;		/* the controller the range is mapped for */
	u64 vaddr;
	u64 len;
	unsigned long npages;		/* PAGE_SIZE pages */
	u64 *bus;			/* their bus addresses, our own copy */
	u32 rings;			/* queues with a ring here (c->lock) */
	struct tutti_nv nv;
	struct nvidia_p2p_page_table *pt;
	struct nvidia_p2p_dma_mapping *map;

	spinlock_t lock;		/* the fields below */
	enum tutti_p2p_state state;
	bool busy;		/* this module is reading pt/map or unmapping */
	bool revoked;		/* the callback was entered */
	bool cb_running;
	wait_queue_head_t wq;	/* busy and cb_running going false */
};

static void tutti_p2p_free(struct kref *ref)
{
	struct tutti_p2p *p = container_of(ref, struct tutti_p2p, ref);

	kvfree(p->bus);
	tutti_file_put(p->file);
	kfree(p);
}

static void tutti_p2p_put(struct tutti_p2p *p)
{
	kref_put(&p->ref, tutti_p2p_free);
}

/* Claim the range for reading pt/map unless the callback came first. */
static bool tutti_p2p_enter(struct tutti_p2p *p)
{
	bool ok;

	spin_lock(&p->lock);
	ok = !p->revoked;
	if (ok)
		p->busy = true;
	spin_unlock(&p->lock);
	return ok;
}

static void tutti_p2p_leave(struct tutti_p2p *p, enum tutti_p2p_state state)
{
	spin_lock(&p->lock);
	p->busy = false;
	p->state = state;
	spin_unlock(&p->lock);
	wake_up_all(&p->wq);
}

static bool tutti_p2p_idle(struct tutti_p2p *p, bool cb)
{
	bool idle;

	spin_lock(&p->lock);
	idle = cb ? !p->cb_running : !p->busy;
	spin_unlock(&p->lock);
	return idle;
}

/*
 * Called by the NVIDIA driver when the pages are freed under us (with its
 * locks held; may sleep).  The page table and mapping are freed by the
 * driver when this returns.
 */
static void tutti_p2p_free_cb(void *data)
{
	struct tutti_p2p *p = data;
	enum tutti_p2p_state was;

	spin_lock(&p->lock);
	p->cb_running = true;
	p->revoked = true;
	spin_unlock(&p->lock);
	/* Bounded: busy never spans a call that takes the driver's locks. */
	wait_event(p->wq, tutti_p2p_idle(p, false));
	spin_lock(&p->lock);
	was = p->state;
	if (was == TUTTI_P2P_LIVE)
		p->state = TUTTI_P2P_REVOKED;
	spin_unlock(&p->lock);
	if (was == TUTTI_P2P_LIVE) {
		/* Addresses were handed out: stop every queue that may use them. */
		tutti_queues_revoke(p->file);
		/* No-ops in current drivers, required by the older API contract. */
		p->nv.free_dma_mapping(p->map);
		p->nv.free_page_table(p->pt);
	}
	/*
	 * PINNED: the map ioctl sees p->revoked and fails without touching the
	 * table.  RELEASING: the teardown skips nvidia_p2p_put_pages().
	 */
	spin_lock(&p->lock);
	p->cb_running = false;
	spin_unlock(&p->lock);
	wake_up_all(&p->wq);
}

/*
 * Give the range back to the GPU driver (no c->lock held; the range is in
 * no table any more and no queue has a ring in it), then drop the table's
 * reference.
 */
static void tutti_p2p_release(struct tutti_p2p *p)
{
	bool claimed, put;

	spin_lock(&p->lock);
	claimed = !p->revoked && p->state != TUTTI_P2P_NEW;
	if (claimed) {
		p->state = TUTTI_P2P_RELEASING;
		p->busy = true;
	}
	spin_unlock(&p->lock);
	if (claimed) {
		if (p->map)
			p->nv.dma_unmap_pages(p->pdev, p->pt, p->map);
		spin_lock(&p->lock);
		p->busy = false;
		put = !p->revoked;
		spin_unlock(&p->lock);
		wake_up_all(&p->wq);
		if (put)
			p->nv.put_pages(0, 0, p->vaddr, p->pt);
	}
	/* A callback in flight still uses p (and p->nv): let it finish. */
	wait_event(p->wq, tutti_p2p_idle(p, true));
	p->pt = NULL;
	p->map = NULL;
	tutti_nv_put(&p->nv);
	tutti_p2p_put(p);
}

/* Check the page table and mapping and copy the addresses (p->busy held). */
static int tutti_p2p_take_addresses(struct tutti_p2p *p)
{
	const unsigned long per = TUTTI_P2P_GPU_PAGE >> PAGE_SHIFT;
	struct nvidia_p2p_dma_mapping *m = p->map;
	unsigned long i, j;

	if (!NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(m) ||
	    m->page_size_type != NVIDIA_P2P_PAGE_SIZE_64KB ||
	    m->entries != p->len / TUTTI_P2P_GPU_PAGE || !m->dma_addresses)
		return -EIO;
	for (i = 0; i < m->entries; i++) {
		if (!IS_ALIGNED(m->dma_addresses[i], PAGE_SIZE))
			return -EIO;
		for (j = 0; j < per; j++)
			p->bus[i * per + j] = m->dma_addresses[i] + j * PAGE_SIZE;
	}
	return 0;
}

static int tutti_p2p_copy_bus(struct tutti_p2p *p, u64 __user *ubus)
{
	unsigned long done = 0, n;

	while (done < p->npages) {
		n = min_t(unsigned long, p->npages - done, TUTTI_P2P_CHUNK);
		if (copy_to_user(ubus + done, p->bus + done, n * sizeof(*p->bus)))
			return -EFAULT;
		done += n;
		cond_resched();
	}
	return 0;
}

/**
 * tutti_p2p_map() - pin and map a range of the caller's GPU memory
 * @f: owner
 * @arg: request (checked by tutti_p2p_check_map()); handle filled, bus
 *       addresses copied out
 *
 * Called without c->lock.
 *
 * Return: 0; -ENODEV nvidia.ko not loaded or the controller unbound;
 * -ENOSPC too many ranges on this file; -EFAULT unwritable @arg->bus;
 * -ENXIO the GPU driver freed the memory meanwhile; -EIO an unexpected
 * page table or mapping; the NVIDIA driver's errno otherwise (-EINVAL for
 * memory that is not GPU memory of this process).
 */
int tutti_p2p_map(struct tutti_file *f, struct tutti_p2p_map *arg)
{
	struct tutti_ctrl *c = f->ctrl;
	struct tutti_p2p *p;
	u32 id;
	int ret;

	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	kref_init(&p->ref);
	INIT_LIST_HEAD(&p->node);
	spin_lock_init(&p->lock);
	init_waitqueue_head(&p->wq);
	p->state = TUTTI_P2P_NEW;
	kref_get(&f->ref);
	p->file = f;
	p->pdev = c->pdev;
	p->vaddr = arg->vaddr;
	p->len = arg->len;
	p->npages = arg->len >> PAGE_SHIFT;
	p->bus = kvmalloc_array(p->npages, sizeof(*p->bus), GFP_KERNEL);
	if (!p->bus) {
		tutti_p2p_put(p);
		return -ENOMEM;
	}
	ret = tutti_nv_get(&p->nv);
	if (ret) {
		tutti_p2p_put(p);
		return ret;
	}

	/* Reserve the handle (an entry that reads NULL until the range is live). */
	mutex_lock(&c->lock);
	ret = c->gone ? -ENODEV :
		xa_alloc(&f->p2ps, &id, NULL, XA_LIMIT(1, TUTTI_P2P_MAX_MAPS), GFP_KERNEL);
	mutex_unlock(&c->lock);
	if (ret) {
		tutti_p2p_release(p);
		return ret == -EBUSY ? -ENOSPC : ret;
	}

	ret = p->nv.get_pages(0, 0, p->vaddr, p->len, &p->pt, tutti_p2p_free_cb, p);
	if (ret) {
		p->pt = NULL;
		goto fail;
	}
	/* From here on the callback may run at any moment. */
	if (!tutti_p2p_enter(p)) {
		ret = -ENXIO;
		goto fail;
	}
	if (!NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(p->pt) ||
	    p->pt->page_size != NVIDIA_P2P_PAGE_SIZE_64KB ||
	    p->pt->entries != p->len / TUTTI_P2P_GPU_PAGE)
		ret = -EIO;
	tutti_p2p_leave(p, TUTTI_P2P_PINNED);
	if (ret)
		goto fail;
	ret = p->nv.dma_map_pages(p->pdev, p->pt, &p->map);
	if (ret) {
		p->map = NULL;
		goto fail;
	}
	if (!tutti_p2p_enter(p)) {
		ret = -ENXIO;
		goto fail;
	}
	ret = tutti_p2p_take_addresses(p);
	tutti_p2p_leave(p, ret ? TUTTI_P2P_PINNED : TUTTI_P2P_LIVE);
	if (ret)
		goto fail;
	ret = tutti_p2p_copy_bus(p, u64_to_user_ptr(arg->bus));
	if (ret)
		goto fail;

	/* Publish, unless the controller was unbound meanwhile. */
	mutex_lock(&c->lock);
	if (c->gone)
		ret = -ENODEV;
	else
		ret = xa_err(xa_store(&f->p2ps, id, p, GFP_KERNEL));
	mutex_unlock(&c->lock);
	if (ret)
		goto fail;
	arg->handle = id;
	return 0;
fail:
	mutex_lock(&c->lock);
	xa_erase(&f->p2ps, id);
	mutex_unlock(&c->lock);
	tutti_p2p_release(p);
	return ret;
}

/** tutti_p2p_unmap() - give back range @handle of @f (no c->lock held). */
int tutti_p2p_unmap(struct tutti_file *f, u32 handle)
{
	struct tutti_ctrl *c = f->ctrl;
	struct tutti_p2p *p;
	int ret = 0;

	mutex_lock(&c->lock);
	p = xa_load(&f->p2ps, handle);
	if (!p)
		ret = c->gone ? -ENODEV : -EINVAL;
	else if (p->rings)
		ret = -EBUSY;
	else
		xa_erase(&f->p2ps, handle);
	mutex_unlock(&c->lock);
	if (!ret)
		tutti_p2p_release(p);
	return ret;
}

/**
 * tutti_p2p_detach_all() - take every range off a file (c->lock held)
 * @f: the file (being released, or its controller unbound)
 * @out: list the ranges are moved to
 *
 * The caller gives them back with tutti_p2p_teardown_list() after dropping
 * c->lock, and after the file's queues were deleted.
 */
void tutti_p2p_detach_all(struct tutti_file *f, struct list_head *out)
{
	struct tutti_p2p *p;
	unsigned long id;

	lockdep_assert_held(&f->ctrl->lock);
	xa_for_each(&f->p2ps, id, p) {
		xa_erase(&f->p2ps, id);
		list_add_tail(&p->node, out);
	}
}

/** tutti_p2p_teardown_list() - give back the ranges on @list (no c->lock). */
void tutti_p2p_teardown_list(struct list_head *list)
{
	struct tutti_p2p *p, *tmp;

	list_for_each_entry_safe(p, tmp, list, node) {
		list_del_init(&p->node);
		tutti_p2p_release(p);
	}
}

/**
 * tutti_p2p_place_ring() - put a ring of @q in GPU range @handle (c->lock held)
 * @f: owner of the queue and the range
 * @q: the queue being created
 * @handle: TUTTI_IOC_P2P_MAP handle of @f
 * @off: byte offset of the ring in the range, page aligned
 * @bytes: ring size (a page multiple)
 * @bus: out, the ring's bus address
 *
 * The ring must lie on bus-contiguous pages (NVMe rings are physically
 * contiguous here).  Return: 0, -EINVAL, or -ENXIO for a revoked range.
 */
int tutti_p2p_place_ring(struct tutti_file *f, struct tutti_uq *q, u32 handle,
			 u64 off, size_t bytes, dma_addr_t *bus)
{
	struct tutti_p2p *p = xa_load(&f->p2ps, handle);
	unsigned long first, i;
	bool live;

	lockdep_assert_held(&f->ctrl->lock);
	if (!p || (q->p2p && q->p2p != p))
		return -EINVAL;
	if (!PAGE_ALIGNED(off) || !bytes || off >= p->len || bytes > p->len - off)
		return -EINVAL;
	first = off >> PAGE_SHIFT;
	for (i = 1; i < bytes >> PAGE_SHIFT; i++)
		if (p->bus[first + i] != p->bus[first] + i * PAGE_SIZE)
			return -EINVAL;
	spin_lock(&p->lock);
	live = p->state == TUTTI_P2P_LIVE && !p->revoked;
	spin_unlock(&p->lock);
	if (!live)
		return -ENXIO;
	if (!q->p2p) {
		kref_get(&p->ref);
		q->p2p = p;
		p->rings++;
	}
	*bus = p->bus[first];
	return 0;
}

/** tutti_p2p_ring_live() - has @q's GPU range not been revoked? (f->qlock held) */
bool tutti_p2p_ring_live(struct tutti_uq *q)
{
	bool live;

	if (!q->p2p)
		return true;
	spin_lock(&q->p2p->lock);
	live = !q->p2p->revoked;
	spin_unlock(&q->p2p->lock);
	return live;
}

/** tutti_p2p_ring_put() - the queue is gone from the controller (c->lock held). */
void tutti_p2p_ring_put(struct tutti_uq *q)
{
	if (!q->p2p)
		return;
	q->p2p->rings--;
	tutti_p2p_put(q->p2p);
	q->p2p = NULL;
}
