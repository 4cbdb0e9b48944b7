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
#define TUTTI_CMD_TIMEOUT_MS	30000	/* default of the cmd_timeout_ms parameter */

/*
 * Lock order (docs/kmod.md, "Locking"), outermost first:
 *
 *   c->io.lock  >  mmap_lock  >  c->lock  >  f->qlock  >  c->admin.lock  >  c->kill_lock
 *
 * mmap_lock is the kernel's: held around f_op->mmap and vm_ops->fault, and
 * taken by anything that touches user memory (copy_{to,from}_user,
 * pin_user_pages*, account_locked_vm).  Hence c->lock, f->qlock,
 * c->admin.lock and c->kill_lock are never held while user memory is
 * touched or pages are pinned, unpinned or accounted; only c->io.lock is
 * (the read/write path copies through the module's bounce buffer), and
 * nothing that runs under mmap_lock takes c->io.lock.  The nvidia-p2p free
 * callback (RM locks held) takes f->qlock and what nests inside it, never
 * c->lock.  unmap_mapping_range() (i_mmap_rwsem) is called under c->lock.
 */

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
	bool dead;		/* stopped answering: disabled (tutti_ctrl_kill()) */
	bool stopped;		/* ... and confirmed stopped: CSTS.RDY=0, no bus mastering */
	struct mutex kill_lock;	/* dead, stopped */
	bool io_ready;

	atomic_t n_uqueues;		/* queue pairs of processes (sysfs) */
	atomic_long_t pinned_pages;	/* pinned for processes (sysfs) */

	struct tutti_node node;	/* controller node */
	struct tutti_ns *ns[TUTTI_MAX_NS];
	unsigned int n_ns;
};

struct tutti_p2p;

/*
 * A queue pair created by a process.  A ring not in the module's own DMA
 * memory (sq_peer / cq_peer) lives at a bus address of device memory: a
 * peer controller's CMB (@peer holds that controller) or a pinned GPU range
 * (@p2p holds the mapping's bookkeeping, not the pin itself: see
 * tutti_p2p.c for what happens when the GPU driver takes the memory back).
 */
struct tutti_uq {
	struct list_head node;	/* in tutti_file.queues (c->lock and f->qlock) */
	u16 qid;
	u32 depth;
	void *sq;
	dma_addr_t sq_dma;
	size_t sq_bytes;
	bool sq_peer;
	bool cq_peer;
	bool live;		/* created on the controller, counted */
	bool revoked;		/* stopped on the controller by a GPU revocation */
	bool unfenced;		/* a delete failed and the controller did not
				 * confirm it stopped: its memory is never freed */
	struct tutti_ctrl *peer;	/* holds a reference while the SQ is there */
	struct tutti_p2p *p2p;		/* GPU range holding a ring, referenced */
	void *cq;
	dma_addr_t cq_dma;
	size_t cq_bytes;
};

/* Pinned, DMA-mapped user memory. */
struct tutti_dma {
	struct list_head node;	/* f->dma_zombies, or a list being freed */
	u64 vaddr;
	unsigned long npages;
	unsigned long npinned;
	struct page **pages;
	struct sg_table sgt;
	struct mm_struct *mm;	/* for RLIMIT_MEMLOCK accounting */
	bool accounted;
	bool mapped;
};

/*
 * An open node.  Reference counted because a pinned GPU range (tutti_p2p.c)
 * can outlive the file's release by the time its teardown takes, and its
 * revocation callback reaches the file's queues.
 */
struct tutti_file {
	struct kref ref;
	struct tutti_ctrl *ctrl;	/* referenced */
	struct tutti_ns *ns;	/* NULL on the controller node */
	struct file *filp;
	struct list_head node;	/* in ctrl->files */
	struct list_head queues;
	/*
	 * Taken inside c->lock around changes to @queues and around deleting
	 * a queue on the controller; the GPU revocation callback takes it
	 * alone (never c->lock, which is held across user-memory access).
	 * Holders only touch the list and run admin commands.
	 */
	struct mutex qlock;
	struct xarray dmas;	/* pinned memory, f->qlock */
	/*
	 * Unmapped while a queue of the file was live (a command in flight may
	 * still address it): unpinned once the file has no live queue (f->qlock).
	 */
	struct list_head dma_zombies;
	/*
	 * A queue of the file could not be proven stopped: nothing the file
	 * pinned is ever unpinned (f->qlock).
	 */
	bool leaked;
	struct xarray p2ps;	/* GPU ranges (TUTTI_IOC_P2P_MAP), c->lock */
};

/* tutti_ctrl.c */
u32 tutti_rd32(struct tutti_ctrl *c, u32 off);
u64 tutti_rd64(struct tutti_ctrl *c, u32 off);
int tutti_ctrl_reset(struct tutti_ctrl *c);
int tutti_ctrl_enable(struct tutti_ctrl *c);
int tutti_ctrl_shutdown(struct tutti_ctrl *c);
int tutti_ctrl_setup(struct tutti_ctrl *c);
void tutti_ctrl_teardown(struct tutti_ctrl *c);
int tutti_admin_exec(struct tutti_ctrl *c, struct nvme_command *cmd, u32 *result);
int tutti_admin_passthru(struct tutti_ctrl *c, struct nvme_command *cmd,
			 void __user *ubuf, u32 len, u32 *result);
int tutti_kio(struct tutti_ns *ns, bool write, u64 lba, u32 nlb, u32 *status);
int tutti_kflush(struct tutti_ns *ns);
int tutti_status_errno(u16 status);
bool tutti_ctrl_kill(struct tutti_ctrl *c, const char *why);
bool tutti_ctrl_stopped(struct tutti_ctrl *c);

/* tutti_queue.c */
int tutti_queue_create(struct tutti_file *f, struct tutti_queue_create *arg);
int tutti_queue_delete(struct tutti_file *f, u32 qid, struct list_head *unpin);
void tutti_queues_release(struct tutti_file *f);
struct tutti_uq *tutti_queue_find(struct tutti_file *f, u32 qid);
bool tutti_file_has_live_queue(struct tutti_file *f);
void tutti_queues_revoke(struct tutti_file *f);

/* tutti_dma.c */
int tutti_dma_map(struct tutti_file *f, struct tutti_dma_map *arg);
int tutti_dma_unmap(struct tutti_file *f, u32 handle);
void tutti_dmas_take(struct tutti_file *f, struct list_head *out, bool zombies_only);
void tutti_dmas_free(struct tutti_ctrl *c, struct list_head *list);

/* tutti_cmb.c */
void tutti_cmb_setup(struct tutti_ctrl *c);
struct tutti_ctrl *tutti_peer_get(int fd);

/* tutti_mmap.c */
int tutti_mmap(struct file *file, struct vm_area_struct *vma);

/*
 * GPU memory through NVIDIA's peer-to-peer API (tutti_p2p.c, built only
 * with NV_P2P_INC=<dir of nv-p2p.h>, which defines TUTTI_NV_P2P).  The
 * argument checks are common to both builds, so a module without the
 * NVIDIA path still refuses malformed requests with -EINVAL before it says
 * -EOPNOTSUPP.
 */
int tutti_p2p_check_map(const struct tutti_p2p_map *arg);
#ifdef TUTTI_NV_P2P
#define TUTTI_HAVE_NV_P2P	1
int tutti_p2p_map(struct tutti_file *f, struct tutti_p2p_map *arg);
int tutti_p2p_unmap(struct tutti_file *f, u32 handle);
void tutti_p2p_detach_all(struct tutti_file *f, struct list_head *out);
void tutti_p2p_teardown_list(struct list_head *list);
int tutti_p2p_place_ring(struct tutti_file *f, struct tutti_uq *q, u32 handle,
			 u64 off, size_t bytes, dma_addr_t *bus);
void tutti_p2p_ring_put(struct tutti_uq *q);
bool tutti_p2p_ring_live(struct tutti_uq *q);
#else
#define TUTTI_HAVE_NV_P2P	0
static inline int tutti_p2p_map(struct tutti_file *f, struct tutti_p2p_map *arg)
{
	return -EOPNOTSUPP;
}
static inline int tutti_p2p_unmap(struct tutti_file *f, u32 handle)
{
	return -EOPNOTSUPP;
}
static inline void tutti_p2p_detach_all(struct tutti_file *f, struct list_head *out) { }
static inline void tutti_p2p_teardown_list(struct list_head *list) { }
static inline int tutti_p2p_place_ring(struct tutti_file *f, struct tutti_uq *q,
				       u32 handle, u64 off, size_t bytes,
				       dma_addr_t *bus)
{
	return -EOPNOTSUPP;
}
static inline void tutti_p2p_ring_put(struct tutti_uq *q) { }
static inline bool tutti_p2p_ring_live(struct tutti_uq *q)
{
	return true;
}
#endif

/* tutti_main.c */
void tutti_ctrl_put(struct tutti_ctrl *c);

/* tutti_fops.c */
extern const struct file_operations tutti_fops;
void tutti_file_put(struct tutti_file *f);

#endif
