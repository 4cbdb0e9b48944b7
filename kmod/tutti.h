/* SPDX-License-Identifier: GPL-2.0 */
/* tutti.ko internals: one struct per controller, namespace, open file. */
#ifndef TUTTI_KMOD_H
#define TUTTI_KMOD_H

#include <linux/kref.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mutex.h>
#include <linux/nvme.h>
#include <linux/pci.h>
#include <linux/xarray.h>

#include "include/uapi/tutti.h"

#define TUTTI_NAME		"tutti"
#define TUTTI_MAX_NS		16
#define TUTTI_ADMIN_DEPTH	32
#define TUTTI_KQ_DEPTH		32
#define TUTTI_KQ_QID		1	/* the module's own polled I/O queue */
#define TUTTI_KBUF_MAX		(256u << 10)
#define TUTTI_MAX_QUEUES	64	/* I/O queue pairs asked for */
#define TUTTI_CMD_TIMEOUT_MS	30000

/* A polled queue pair the module drives itself (admin, or qid 1). */
struct tutti_kq {
	struct nvme_command *sq;
	struct nvme_completion *cq;
	dma_addr_t sq_dma, cq_dma;
	u32 depth;
	u16 qid;
	u16 sq_tail, cq_head;
	u8 cq_phase;
	u16 next_cid;
	struct mutex lock;
};

struct tutti_ctrl;

/* A character device: the controller's, or one of its namespaces'. */
struct tutti_node {
	struct miscdevice misc;
	struct tutti_ctrl *ctrl;
	struct tutti_ns *ns;	/* NULL for the controller node */
	char name[24];
	bool registered;
};

struct tutti_ns {
	struct tutti_ctrl *ctrl;
	u32 nsid;
	u32 lba_shift;
	u64 nsze;
	struct tutti_node node;
};

struct tutti_ctrl {
	struct kref ref;
	struct pci_dev *pdev;
	void __iomem *bar;
	resource_size_t bar_phys;
	resource_size_t bar_len;
	int instance;
	u64 cap;
	u32 vs;
	u32 page_size;
	u32 dstrd;
	u32 mqes;		/* entries */
	u32 mdts_bytes;
	u32 max_qid;
	u32 db_bytes;
	struct nvme_id_ctrl *id;	/* Identify Controller, 4 KiB */

	struct tutti_kq admin;
	struct tutti_kq io;
	void *kbuf;		/* bounce for the read/write path */
	dma_addr_t kbuf_dma;
	u32 kbuf_bytes;
	__le64 *kprp;		/* PRP list page for @kbuf */
	dma_addr_t kprp_dma;

	/* controller memory buffer (peer memory for another controller) */
	u64 cmb_bus;
	resource_size_t cmb_phys;
	u64 cmb_bytes;
	u32 cmbsz;

	struct mutex lock;	/* files, qids, gone */
	struct list_head files;
	struct ida qids;
	bool gone;		/* unbound: every file operation fails */
	bool dead;		/* stopped answering: disabled */
	bool io_ready;

	atomic_t n_uqueues;		/* queue pairs of processes (sysfs) */
	atomic_long_t pinned_pages;	/* pinned for processes (sysfs) */

	struct tutti_node node;	/* controller node */
	struct tutti_ns *ns[TUTTI_MAX_NS];
	unsigned int n_ns;
};

/* A queue pair created by a process. */
struct tutti_uq {
	struct list_head node;
	u16 qid;
	u32 depth;
	void *sq;
	dma_addr_t sq_dma;
	size_t sq_bytes;
	bool sq_peer;
	bool live;		/* created on the controller, counted */
	struct tutti_ctrl *peer;	/* holds a reference while the SQ is there */
	void *cq;
	dma_addr_t cq_dma;
	size_t cq_bytes;
};

/* Pinned, DMA-mapped user memory. */
struct tutti_dma {
	u64 vaddr;
	unsigned long npages;
	unsigned long npinned;
	struct page **pages;
	struct sg_table sgt;
	struct mm_struct *mm;	/* for RLIMIT_MEMLOCK accounting */
	bool accounted;
	bool mapped;
};

struct tutti_file {
	struct tutti_ctrl *ctrl;
	struct tutti_ns *ns;	/* NULL on the controller node */
	struct file *filp;
	struct list_head node;	/* in ctrl->files */
	struct list_head queues;
	struct xarray dmas;
};

/* tutti_ctrl.c */
u32 tutti_rd32(struct tutti_ctrl *c, u32 off);
u64 tutti_rd64(struct tutti_ctrl *c, u32 off);
int tutti_ctrl_reset(struct tutti_ctrl *c);
int tutti_ctrl_enable(struct tutti_ctrl *c);
void tutti_ctrl_shutdown(struct tutti_ctrl *c);
int tutti_ctrl_setup(struct tutti_ctrl *c);
void tutti_ctrl_teardown(struct tutti_ctrl *c);
int tutti_admin_exec(struct tutti_ctrl *c, struct nvme_command *cmd, u32 *result);
int tutti_admin_passthru(struct tutti_ctrl *c, struct nvme_command *cmd,
			 void __user *ubuf, u32 len, u32 *result);
int tutti_kio(struct tutti_ns *ns, bool write, u64 lba, u32 nlb, u32 *status);
int tutti_kflush(struct tutti_ns *ns);
int tutti_status_errno(u16 status);

/* tutti_queue.c */
int tutti_queue_create(struct tutti_file *f, struct tutti_queue_create *arg);
int tutti_queue_delete(struct tutti_file *f, u32 qid);
void tutti_queues_release(struct tutti_file *f);
struct tutti_uq *tutti_queue_find(struct tutti_file *f, u32 qid);

/* tutti_dma.c */
int tutti_dma_map(struct tutti_file *f, struct tutti_dma_map *arg);
int tutti_dma_unmap(struct tutti_file *f, u32 handle);
void tutti_dmas_release(struct tutti_file *f);

/* tutti_cmb.c */
void tutti_cmb_setup(struct tutti_ctrl *c);
int tutti_cmb_mmap(struct tutti_ctrl *c, struct vm_area_struct *vma, u64 off);
struct tutti_ctrl *tutti_peer_get(int fd);

/* tutti_main.c */
extern const struct file_operations tutti_fops;
void tutti_ctrl_put(struct tutti_ctrl *c);
void tutti_vma_init(struct vm_area_struct *vma);

#endif
