// SPDX-License-Identifier: GPL-2.0
/*
 * Peer device memory.  A controller memory buffer (CMB) is memory on a PCI
 * device that other devices can DMA into, the way a GPU's BAR1 is: under
 * QEMU a second controller's CMB stands in for GPU memory.  The module
 * enables the CMB of every controller it binds, lets a process map it
 * (uncached) and hands its bus address out, so that another controller's
 * SQ and read data can live there.  A GPU's memory exposed through
 * NVIDIA's peer-to-peer API (tutti_p2p.c) enters the same way: a bus
 * address range plus a CPU/GPU mapping owned by someone else.
 */
#include <linux/file.h>
#include <linux/io-64-nonatomic-hi-lo.h>
#include <linux/mm.h>

#include "tutti.h"

/**
 * tutti_cmb_setup() - find and enable the controller memory buffer
 * @c: an enabled controller
 *
 * Leaves c->cmb_bytes 0 when there is none or it is unusable.
 */
void tutti_cmb_setup(struct tutti_ctrl *c)
{
	struct pci_dev *pdev = c->pdev;
	u64 unit, size, offset;
	u32 cmbloc;
	int bar;

	if (NVME_CAP_CMBS(c->cap))
		writel(NVME_CMBMSC_CRE, c->bar + NVME_REG_CMBMSC);
	c->cmbsz = tutti_rd32(c, NVME_REG_CMBSZ);
	if (!c->cmbsz)
		return;
	cmbloc = tutti_rd32(c, NVME_REG_CMBLOC);
	unit = 1ull << (12 + 4 * ((c->cmbsz >> NVME_CMBSZ_SZU_SHIFT) &
				  NVME_CMBSZ_SZU_MASK));
	size = unit * ((c->cmbsz >> NVME_CMBSZ_SZ_SHIFT) & NVME_CMBSZ_SZ_MASK);
	offset = unit * (cmbloc >> 12);
	bar = cmbloc & 0x7;
	if (bar > 5 || !(pci_resource_flags(pdev, bar) & IORESOURCE_MEM) ||
	    offset >= pci_resource_len(pdev, bar)) {
		dev_warn(&pdev->dev, "CMB outside its BAR, ignored\n");
		return;
	}
	size = min_t(u64, size, pci_resource_len(pdev, bar) - offset);
	size = round_down(size, PAGE_SIZE);
	if (!size || !IS_ALIGNED(pci_resource_start(pdev, bar) + offset, PAGE_SIZE))
		return;
	/*
	 * Tell the controller where the host put the CMB.  High half first:
	 * a controller may latch the address on the low-half write.
	 */
	if (NVME_CAP_CMBS(c->cap))
		hi_lo_writeq(NVME_CMBMSC_CRE | NVME_CMBMSC_CMSE |
			     (pci_bus_address(pdev, bar) + offset),
			     c->bar + NVME_REG_CMBMSC);
	c->cmb_bus = pci_bus_address(pdev, bar) + offset;
	c->cmb_phys = pci_resource_start(pdev, bar) + offset;
	c->cmb_bytes = size;
}

/**
 * tutti_peer_get() - the controller behind an open tutti file descriptor
 * @fd: descriptor in the calling process
 *
 * Return: the controller with a reference held, or an ERR_PTR: -EBADF for a
 * bad descriptor, -EINVAL for a file that is not a tutti node, -ENODEV for
 * an unbound controller.
 */
struct tutti_ctrl *tutti_peer_get(int fd)
{
	struct tutti_ctrl *peer = ERR_PTR(-EINVAL);
	struct tutti_file *pf;
	struct file *file;

	file = fget(fd);
	if (!file)
		return ERR_PTR(-EBADF);
	if (file->f_op == &tutti_fops) {
		pf = file->private_data;
		peer = pf->ctrl;
		if (READ_ONCE(peer->gone) || READ_ONCE(peer->dead))
			peer = ERR_PTR(-ENODEV);
		else
			kref_get(&peer->ref);
	}
	fput(file);
	return peer;
}
