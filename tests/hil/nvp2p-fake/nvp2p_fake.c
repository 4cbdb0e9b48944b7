// SPDX-License-Identifier: GPL-2.0
/*
 * nvp2p_fake: a stand-in for the NVIDIA driver's peer-to-peer API (the six
 * nvidia_p2p_* functions tutti.ko's P2P build looks up with symbol_get()),
 * for the HIL guest only.  "GPU memory" is a window of device memory given
 * by bus address (the second QEMU controller's CMB), presented at the fake
 * GPU virtual addresses [FAKE_GPU_VA, FAKE_GPU_VA + size): 64 KiB pages,
 * bus address = physical (no IOMMU in the guest).
 *
 * It mirrors the semantics tutti relies on, as read in the 535 driver's
 * kernel-open/nvidia/nv-p2p.c: get_pages, dma_map_pages and put_pages take
 * a global lock standing in for the resource manager's API lock; a
 * revocation (write a GPU address to /sys/module/nvp2p_fake/parameters/
 * revoke) unlinks every registration overlapping it and calls its free
 * callback WITH THAT LOCK HELD, then frees the page table and its DMA
 * mappings; put_pages of an unlinked table returns 0 without touching it;
 * dma_unmap_pages takes only a per-table lock.  So a client that holds a
 * lock of its own across get/map/put while its callback takes the same
 * lock deadlocks here as it would on a real driver.
 *
 * Parameters: base, size (the window, set at load), revoke (write-only),
 * pinned (read: page tables currently registered), revoked (count).
 */
#include <linux/list.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/slab.h>

#include "nv-p2p.h"

#define FAKE_GPU_VA	0x7f0000000000ull
#define FAKE_PAGE	(64ull << 10)

static unsigned long long base;
module_param(base, ullong, 0444);
MODULE_PARM_DESC(base, "bus address of the memory standing in for GPU memory");
static unsigned long long size;
module_param(size, ullong, 0444);
MODULE_PARM_DESC(size, "its size in bytes (64 KiB multiple)");

struct fake_reg {
	struct list_head node;
	struct nvidia_p2p_page_table pt;
	u64 va, len;
	void (*cb)(void *data);
	void *data;
	struct mutex map_lock;			/* like dma_mapping_list.lock */
	struct nvidia_p2p_dma_mapping *map;	/* at most one here */
	u8 uuid[16];
};

static DEFINE_MUTEX(fake_api_lock);		/* the "RM API lock" */
static LIST_HEAD(fake_regs);
static int pinned;
static int revoked;
module_param(pinned, int, 0444);
module_param(revoked, int, 0444);

static void fake_free_map(struct nvidia_p2p_dma_mapping *m)
{
	if (!m)
		return;
	kfree(m->dma_addresses);
	kfree(m);
}

static void fake_free_reg(struct fake_reg *r)
{
	u32 i;

	mutex_lock(&r->map_lock);
	fake_free_map(r->map);
	r->map = NULL;
	mutex_unlock(&r->map_lock);
	for (i = 0; i < r->pt.entries; i++)
		kfree(r->pt.pages[i]);
	kfree(r->pt.pages);
	kfree(r);
}

int nvidia_p2p_get_pages(uint64_t p2p_token, uint32_t va_space,
			 uint64_t virtual_address, uint64_t length,
			 struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data)
{
	struct fake_reg *r;
	u64 off = virtual_address - FAKE_GPU_VA;
	u32 i, n;

	if (p2p_token || va_space || !free_callback || !page_table)
		return -EINVAL;
	if (!IS_ALIGNED(virtual_address, FAKE_PAGE) || !IS_ALIGNED(length, FAKE_PAGE) ||
	    !length || virtual_address < FAKE_GPU_VA || off >= size || length > size - off)
		return -EINVAL;
	n = length / FAKE_PAGE;
	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	mutex_init(&r->map_lock);
	r->pt.pages = kcalloc(n, sizeof(*r->pt.pages), GFP_KERNEL);
	if (!r->pt.pages) {
		kfree(r);
		return -ENOMEM;
	}
	for (i = 0; i < n; i++) {
		r->pt.pages[i] = kzalloc(sizeof(*r->pt.pages[i]), GFP_KERNEL);
		if (!r->pt.pages[i]) {
			r->pt.entries = i;
			fake_free_reg(r);
			return -ENOMEM;
		}
		r->pt.pages[i]->physical_address = base + off + (u64)i * FAKE_PAGE;
	}
	r->pt.version = NVIDIA_P2P_PAGE_TABLE_VERSION;
	r->pt.page_size = NVIDIA_P2P_PAGE_SIZE_64KB;
	r->pt.entries = n;
	r->pt.gpu_uuid = r->uuid;
	r->va = virtual_address;
	r->len = length;
	r->cb = free_callback;
	r->data = data;
	*page_table = &r->pt;
	mutex_lock(&fake_api_lock);
	list_add_tail(&r->node, &fake_regs);
	pinned++;
	mutex_unlock(&fake_api_lock);
	return 0;
}
EXPORT_SYMBOL_GPL(nvidia_p2p_get_pages);

int nvidia_p2p_put_pages(uint64_t p2p_token, uint32_t va_space,
			 uint64_t virtual_address,
			 struct nvidia_p2p_page_table *page_table)
{
	struct fake_reg *r, *found = NULL;

	mutex_lock(&fake_api_lock);
	list_for_each_entry(r, &fake_regs, node) {
		if (&r->pt == page_table && r->va == virtual_address) {
			found = r;
			list_del(&r->node);
			pinned--;
			break;
		}
	}
	mutex_unlock(&fake_api_lock);
	if (found)
		fake_free_reg(found);
	return 0;	/* already unlinked by a revocation: 0, table untouched */
}
EXPORT_SYMBOL_GPL(nvidia_p2p_put_pages);

int nvidia_p2p_dma_map_pages(struct pci_dev *peer,
			     struct nvidia_p2p_page_table *page_table,
			     struct nvidia_p2p_dma_mapping **dma_mapping)
{
	struct fake_reg *r = container_of(page_table, struct fake_reg, pt);
	struct nvidia_p2p_dma_mapping *m;
	u32 i, n = page_table->entries;
	int ret = 0;

	if (!peer || !dma_mapping)
		return -EINVAL;
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	m->dma_addresses = kcalloc(n, sizeof(u64), GFP_KERNEL);
	if (!m->dma_addresses) {
		kfree(m);
		return -ENOMEM;
	}
	for (i = 0; i < n; i++)
		m->dma_addresses[i] = page_table->pages[i]->physical_address;
	m->version = NVIDIA_P2P_DMA_MAPPING_VERSION;
	m->page_size_type = NVIDIA_P2P_PAGE_SIZE_64KB;
	m->entries = n;
	m->pci_dev = peer;
	mutex_lock(&fake_api_lock);
	mutex_lock(&r->map_lock);
	if (r->map)
		ret = -EBUSY;
	else
		r->map = m;
	mutex_unlock(&r->map_lock);
	mutex_unlock(&fake_api_lock);
	if (ret) {
		fake_free_map(m);
		return ret;
	}
	*dma_mapping = m;
	return 0;
}
EXPORT_SYMBOL_GPL(nvidia_p2p_dma_map_pages);

int nvidia_p2p_dma_unmap_pages(struct pci_dev *peer,
			       struct nvidia_p2p_page_table *page_table,
			       struct nvidia_p2p_dma_mapping *dma_mapping)
{
	struct fake_reg *r = container_of(page_table, struct fake_reg, pt);
	bool mine;

	if (!peer || !page_table || !dma_mapping)
		return -EINVAL;
	mutex_lock(&r->map_lock);
	mine = r->map == dma_mapping;
	if (mine)
		r->map = NULL;
	mutex_unlock(&r->map_lock);
	if (mine)
		fake_free_map(dma_mapping);
	return 0;
}
EXPORT_SYMBOL_GPL(nvidia_p2p_dma_unmap_pages);

int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table)
{
	return 0;
}
EXPORT_SYMBOL_GPL(nvidia_p2p_free_page_table);

int nvidia_p2p_free_dma_mapping(struct nvidia_p2p_dma_mapping *dma_mapping)
{
	return 0;
}
EXPORT_SYMBOL_GPL(nvidia_p2p_free_dma_mapping);

/* Write a fake GPU address: revoke every registration that contains it. */
static int fake_revoke_set(const char *val, const struct kernel_param *kp)
{
	struct fake_reg *r, *tmp;
	LIST_HEAD(gone);
	u64 va;
	int ret = kstrtoull(val, 0, &va);

	if (ret)
		return ret;
	mutex_lock(&fake_api_lock);
	list_for_each_entry_safe(r, tmp, &fake_regs, node) {
		if (va < r->va || va - r->va >= r->len)
			continue;
		list_del(&r->node);
		pinned--;
		revoked++;
		r->cb(r->data);		/* with the "API lock" held, as the RM does */
		list_add_tail(&r->node, &gone);
	}
	mutex_unlock(&fake_api_lock);
	list_for_each_entry_safe(r, tmp, &gone, node) {
		list_del(&r->node);
		fake_free_reg(r);
	}
	return 0;
}

static const struct kernel_param_ops fake_revoke_ops = {
	.set = fake_revoke_set,
};
module_param_cb(revoke, &fake_revoke_ops, NULL, 0200);
MODULE_PARM_DESC(revoke, "write a fake GPU address: free the memory under its pins");

static int __init fake_init(void)
{
	if (!base || !size || !IS_ALIGNED(base, FAKE_PAGE) || !IS_ALIGNED(size, FAKE_PAGE))
		return -EINVAL;
	return 0;
}

static void __exit fake_exit(void)
{
	WARN_ON(!list_empty(&fake_regs));
}

module_init(fake_init);
module_exit(fake_exit);
MODULE_DESCRIPTION("HIL stand-in for the NVIDIA peer-to-peer API");
MODULE_LICENSE("GPL");
