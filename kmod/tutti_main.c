// SPDX-License-Identifier: GPL-2.0
/*
 * tutti.ko: NVMe queue pairs for user space.
 *
 * The PCI driver has no ID table: it binds only to controllers handed to
 * it with sysfs driver_override, never to one found by class.  Per bound
 * controller it creates /dev/tuttiN and /dev/tuttiNnM (one per active
 * namespace), whose file operations are in tutti_fops.c; tutti_ctrl.c
 * brings the controller up and runs the module's own queues, tutti_queue.c
 * the queue pairs of a process, tutti_dma.c pinned buffers, tutti_mmap.c
 * what a process maps, tutti_cmb.c peer memory and, when built with NVIDIA's nv-p2p.h, tutti_p2p.c GPU memory.
 * The user interface is include/uapi/tutti.h.
 */
#include <linux/dma-mapping.h>
#include <linux/idr.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/version.h>

#include "tutti.h"

static DEFINE_IDA(tutti_instances);

static void tutti_ctrl_release(struct kref *ref)
{
	struct tutti_ctrl *c = container_of(ref, struct tutti_ctrl, ref);
	unsigned int i;

	for (i = 0; i < c->n_ns; i++)
		kfree(c->ns[i]);
	ida_destroy(&c->qids);
	ida_free(&tutti_instances, c->instance);
	pci_dev_put(c->pdev);
	kfree(c->id);
	kfree(c);
}

void tutti_ctrl_put(struct tutti_ctrl *c)
{
	kref_put(&c->ref, tutti_ctrl_release);
}

static int tutti_node_add(struct tutti_ctrl *c, struct tutti_node *node,
			  struct tutti_ns *ns)
{
	int ret;

	node->ctrl = c;
	node->ns = ns;
	if (ns)
		snprintf(node->name, sizeof(node->name), "tutti%dn%u", c->instance,
			 ns->nsid);
	else
		snprintf(node->name, sizeof(node->name), "tutti%d", c->instance);
	node->misc.minor = MISC_DYNAMIC_MINOR;
	node->misc.name = node->name;
	node->misc.fops = &tutti_fops;
	node->misc.parent = &c->pdev->dev;
	node->misc.mode = 0600;
	ret = misc_register(&node->misc);
	if (ret)
		return ret;
	node->registered = true;
	return 0;
}

static void tutti_nodes_remove(struct tutti_ctrl *c)
{
	unsigned int i;

	for (i = 0; i < c->n_ns; i++) {
		if (c->ns[i]->node.registered)
			misc_deregister(&c->ns[i]->node.misc);
		c->ns[i]->node.registered = false;
	}
	if (c->node.registered)
		misc_deregister(&c->node.misc);
	c->node.registered = false;
}

static void tutti_hw_release(struct tutti_ctrl *c)
{
	struct pci_dev *pdev = c->pdev;

	if (c->bar) {
		tutti_ctrl_teardown(c);
		iounmap(c->bar);
	}
	c->bar = NULL;
	pci_release_mem_regions(pdev);
	pci_clear_master(pdev);
	pci_disable_device(pdev);
}

static int tutti_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct tutti_ctrl *c;
	unsigned int i;
	int ret;

	/* Reached only through driver_override or new_id: still insist on NVMe. */
	if (pdev->class != PCI_CLASS_STORAGE_EXPRESS)
		return -ENODEV;
	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c)
		return -ENOMEM;
	kref_init(&c->ref);
	mutex_init(&c->lock);
	mutex_init(&c->kill_lock);
	mutex_init(&c->admin.lock);
	mutex_init(&c->io.lock);
	INIT_LIST_HEAD(&c->files);
	ida_init(&c->qids);
	c->instance = ida_alloc(&tutti_instances, GFP_KERNEL);
	if (c->instance < 0) {
		kfree(c);
		return -ENOMEM;
	}
	c->pdev = pci_dev_get(pdev);
	c->id = kzalloc(sizeof(*c->id), GFP_KERNEL);
	if (!c->id) {
		tutti_ctrl_put(c);
		return -ENOMEM;
	}

	ret = pci_enable_device_mem(pdev);
	if (ret)
		goto fail_put;
	ret = pci_request_mem_regions(pdev, TUTTI_NAME);
	if (ret) {
		pci_disable_device(pdev);
		goto fail_put;
	}
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		goto fail_hw;
	c->bar_phys = pci_resource_start(pdev, 0);
	c->bar_len = pci_resource_len(pdev, 0);
	if (c->bar_len < NVME_REG_DBS + PAGE_SIZE) {
		ret = -ENODEV;
		goto fail_hw;
	}
	c->bar = pci_ioremap_bar(pdev, 0);
	if (!c->bar) {
		ret = -ENOMEM;
		goto fail_hw;
	}
	pci_set_master(pdev);
	ret = tutti_ctrl_setup(c);
	if (ret)
		goto fail_hw;
	ret = tutti_node_add(c, &c->node, NULL);
	for (i = 0; !ret && i < c->n_ns; i++)
		ret = tutti_node_add(c, &c->ns[i]->node, c->ns[i]);
	if (ret)
		goto fail_nodes;
	pci_set_drvdata(pdev, c);
	return 0;
fail_nodes:
	tutti_nodes_remove(c);
fail_hw:
	tutti_hw_release(c);
fail_put:
	tutti_ctrl_put(c);
	return ret;
}

static void tutti_remove(struct pci_dev *pdev)
{
	struct tutti_ctrl *c = pci_get_drvdata(pdev);
	struct tutti_file *f;
	LIST_HEAD(unpin);
	LIST_HEAD(gpu);

	/*
	 * No new opens; then take every process's queues and memory away.
	 * gone first: a fault after the zap finds it and raises SIGBUS
	 * (tutti_mmap.c), and every other path refuses.  Pinned memory is
	 * unpinned after c->lock is dropped (it takes mmap_lock: tutti.h).
	 */
	tutti_nodes_remove(c);
	mutex_lock(&c->lock);
	WRITE_ONCE(c->gone, true);
	list_for_each_entry(f, &c->files, node) {
		unmap_mapping_range(f->filp->f_mapping, 0, 0, 1);
		tutti_queues_release(f);
		tutti_dmas_take(f, &unpin, false);
		tutti_p2p_detach_all(f, &gpu);
	}
	mutex_unlock(&c->lock);
	tutti_dmas_free(c, &unpin);
	tutti_p2p_teardown_list(&gpu);
	tutti_hw_release(c);
	pci_set_drvdata(pdev, NULL);
	tutti_ctrl_put(c);
}

static void tutti_shutdown(struct pci_dev *pdev)
{
	struct tutti_ctrl *c = pci_get_drvdata(pdev);

	if (c && !c->dead)
		tutti_ctrl_shutdown(c);
}

static ssize_t user_queues_show(struct device *dev, struct device_attribute *attr,
				char *buf)
{
	struct tutti_ctrl *c = pci_get_drvdata(to_pci_dev(dev));

	return sysfs_emit(buf, "%d\n", c ? atomic_read(&c->n_uqueues) : 0);
}
static DEVICE_ATTR_RO(user_queues);

static ssize_t pinned_pages_show(struct device *dev, struct device_attribute *attr,
				 char *buf)
{
	struct tutti_ctrl *c = pci_get_drvdata(to_pci_dev(dev));

	return sysfs_emit(buf, "%ld\n", c ? atomic_long_read(&c->pinned_pages) : 0);
}
static DEVICE_ATTR_RO(pinned_pages);

static struct attribute *tutti_attrs[] = {
	&dev_attr_user_queues.attr,
	&dev_attr_pinned_pages.attr,
	NULL,
};
ATTRIBUTE_GROUPS(tutti);

/* Empty: binding happens only through driver_override (or new_id). */
static const struct pci_device_id tutti_ids[] = {
	{ }
};

static struct pci_driver tutti_driver = {
	.name = TUTTI_NAME,
	.id_table = tutti_ids,
	.probe = tutti_probe,
	.remove = tutti_remove,
	.shutdown = tutti_shutdown,
	.dev_groups = tutti_groups,
};

module_pci_driver(tutti_driver);

MODULE_DESCRIPTION("Tutti: NVMe queue pairs for user space");
MODULE_AUTHOR("The Tutti authors");
MODULE_LICENSE("GPL");
MODULE_VERSION("0.1.0");	/* /sys/module/tutti/version: tutti-admin doctor shows it; keep = dkms.conf */
