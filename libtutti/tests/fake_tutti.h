/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fake_tutti.h - a stand-in for tutti.ko and its NVMe controller, inside the
 * test process, for host tests of the kqueue engine (no module, no QEMU).
 *
 * The test registers a regular file as a namespace node (fk_node_add()).
 * This header then defines ioctl() and mmap() for the whole program (they
 * take precedence over libc's, for libtutti.a too) and answers tutti.ko's
 * ioctls and mmaps on descriptors of that file: INFO, EXTENTS,
 * DMA_MAP/UNMAP (bus address = virtual address), QUEUE_CREATE/DELETE (rings
 * and doorbells in memfds that both sides map).  Everything else goes to the
 * kernel.  A controller thread serves the queues: Read, Write and Flush
 * with PRP or SGL data pointers against the file; every byte it moves must
 * lie in pinned memory (else Data Transfer Error, counted in fk.bad_dma).
 *
 * Fault injection:
 *  - fk.stall: every Read/Write fetched (of queue fk.stall_qid, or of all;
 *    at or above byte fk.stall_from) is held (a controller that stops
 *    answering);
 *  - fk.resume_ms: a held command then runs by itself that long after it
 *    was fetched (a controller that wakes up late);
 *  - QUEUE_DELETE finishes (fk.finish_on_delete) or aborts every held
 *    command of the queue before it returns, as Delete SQ must; with
 *    fk.delete_errno it fails with that errno and stops nothing (a module
 *    that could not prove the queue stopped);
 *  - fk_mark(): from now on every held command that still runs or
 *    completes counts in fk.late (the test calls it when a wait returns).
 * The namespace is the file's current size (a store format resizes it).
 * Include it in one test file only.
 */
#ifndef TUTTI_FAKE_TUTTI_H
#define TUTTI_FAKE_TUTTI_H

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tutti/nvme.h"
#include "../../kmod/include/uapi/tutti.h"

#define FK_PAGE		4096u
#define FK_MAX_Q	8u
#define FK_MAX_AREAS	512u
#define FK_DEPTH_MAX	1024u

struct fk_held {
	struct tt_nvme_sqe sqe;
	uint64_t fetched_ms;
};

struct fk_queue {
	int live;
	uint32_t depth;
	int sq_fd, cq_fd;
	size_t sq_bytes, cq_bytes;
	struct tt_nvme_sqe *sq;
	struct tt_nvme_cqe *cq;
	uint32_t sq_head, cq_tail;
	uint16_t phase;
	struct fk_held held[FK_DEPTH_MAX];
	unsigned n_held;
};

struct fk_area {
	uint64_t addr, len;
	uint32_t handle;
};

static struct {
	pthread_mutex_t lock;
	pthread_t thread;
	int running, stop;
	dev_t dev;
	ino_t ino;
	int io_fd;		/* the file, for the controller's data moves */
	uint32_t lba_shift;
	uint32_t mdts_bytes;
	uint32_t sgls;
	int db_fd;
	volatile uint32_t *db;
	struct fk_queue q[FK_MAX_Q + 1];	/* qid 2..FK_MAX_Q */
	struct fk_area areas[FK_MAX_AREAS];
	unsigned n_areas;
	uint32_t next_handle;
	/* fault injection and what was seen */
	int stall;		/* hold Read/Write commands ... */
	unsigned stall_qid;	/* ... of this queue only (0: every queue) */
	uint64_t stall_from;	/* ... at or above this byte offset only */
	uint64_t resume_ms;
	int finish_on_delete;
	int delete_errno;
	int marked;
	unsigned long cmds, held_total, aborted, finished_on_delete, late, bad_dma;
} fk = { .lock = PTHREAD_MUTEX_INITIALIZER };

static uint64_t fk_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void *fk_real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);

	return r == -1 ? MAP_FAILED : (void *)r;
}

/* Is @fd the registered namespace file? */
static int fk_is_node(int fd)
{
	struct stat st;

	return fk.db && fd >= 0 && !fstat(fd, &st) && S_ISREG(st.st_mode) &&
	       st.st_dev == fk.dev && st.st_ino == fk.ino;
}

/* Pinned memory covering [addr, addr + len)?  (fk.lock held) */
static int fk_pinned(uint64_t addr, uint64_t len)
{
	for (unsigned i = 0; i < fk.n_areas; i++)
		if (addr >= fk.areas[i].addr && addr + len <= fk.areas[i].addr + fk.areas[i].len)
			return 1;
	return 0;
}

/* Move @len bytes between the file at @pos and "bus address" @addr. */
static uint16_t fk_move(int write, uint64_t pos, uint64_t addr, uint64_t len)
{
	ssize_t n;

	if (!fk_pinned(addr, len)) {
		fk.bad_dma++;
		return TT_NVME_SC_DATA_XFER_ERROR;
	}
	if (write)
		n = pwrite(fk.io_fd, (void *)(uintptr_t)addr, len, (off_t)pos);
	else
		n = pread(fk.io_fd, (void *)(uintptr_t)addr, len, (off_t)pos);
	return n == (ssize_t)len ? TT_NVME_SC_SUCCESS : TT_NVME_SC_INTERNAL;
}

/* A PRP data pointer (NVMe 1.4, 4.3), list pages included. */
static uint16_t fk_prp(const struct tt_nvme_sqe *s, int write, uint64_t pos, uint64_t bytes)
{
	uint64_t prp1 = s->dptr.prp.prp1, prp2 = s->dptr.prp.prp2, len, left;
	uint16_t st;

	len = FK_PAGE - (prp1 & (FK_PAGE - 1));
	len = len < bytes ? len : bytes;
	st = fk_move(write, pos, prp1, len);
	left = bytes - len;
	pos += len;
	if (st || !left)
		return st;
	if (left <= FK_PAGE)
		return fk_move(write, pos, prp2, left);
	for (;;) {
		unsigned epp = (FK_PAGE - (prp2 & (FK_PAGE - 1))) / 8;
		const uint64_t *list = (const uint64_t *)(uintptr_t)prp2;

		if (!fk_pinned(prp2, (uint64_t)epp * 8))
			return TT_NVME_SC_DATA_XFER_ERROR;
		for (unsigned i = 0; i < epp && left; i++) {
			if (i == epp - 1 && left > FK_PAGE) {
				prp2 = list[i];		/* next list page */
				break;
			}
			len = left < FK_PAGE ? left : FK_PAGE;
			st = fk_move(write, pos, list[i], len);
			if (st)
				return st;
			pos += len;
			left -= len;
		}
		if (!left)
			return TT_NVME_SC_SUCCESS;
	}
}

/* An SGL data pointer: a data block, or (last) segments of data blocks. */
static uint16_t fk_sgl(const struct tt_nvme_sqe *s, int write, uint64_t pos, uint64_t bytes)
{
	struct tt_nvme_sgl_desc d = s->dptr.sgl;
	uint16_t st;

	for (;;) {
		uint8_t t = tt_nvme_sgl_desc_type(&d);
		const struct tt_nvme_sgl_desc *seg;
		unsigned cnt;

		if (t == TT_NVME_SGL_TYPE_DATA_BLOCK)
			return d.len == bytes ? fk_move(write, pos, d.addr, d.len)
					      : TT_NVME_SC_SGL_INVALID_DATA;
		if (t != TT_NVME_SGL_TYPE_SEGMENT && t != TT_NVME_SGL_TYPE_LAST_SEGMENT)
			return TT_NVME_SC_SGL_INVALID_TYPE;
		if (!fk_pinned(d.addr, d.len))
			return TT_NVME_SC_DATA_XFER_ERROR;
		seg = (const struct tt_nvme_sgl_desc *)(uintptr_t)d.addr;
		cnt = d.len / 16;
		for (unsigned j = 0; j < cnt; j++) {
			uint8_t et = tt_nvme_sgl_desc_type(&seg[j]);

			if (et == TT_NVME_SGL_TYPE_SEGMENT || et == TT_NVME_SGL_TYPE_LAST_SEGMENT) {
				d = seg[j];
				break;
			}
			if (seg[j].len > bytes)
				return TT_NVME_SC_SGL_INVALID_DATA;
			st = fk_move(write, pos, seg[j].addr, seg[j].len);
			if (st)
				return st;
			pos += seg[j].len;
			bytes -= seg[j].len;
		}
		if (t == TT_NVME_SGL_TYPE_LAST_SEGMENT || !bytes)
			return bytes ? TT_NVME_SC_SGL_INVALID_DATA : TT_NVME_SC_SUCCESS;
	}
}

/* The namespace's size in blocks: the file's size now. */
static uint64_t fk_nsze(void)
{
	struct stat st;

	return fstat(fk.io_fd, &st) ? 0 : (uint64_t)st.st_size >> fk.lba_shift;
}

static uint16_t fk_exec(const struct tt_nvme_sqe *s)
{
	uint64_t slba = s->cdw10 | (uint64_t)s->cdw11 << 32;
	uint64_t nlb = (uint64_t)(s->cdw12 & 0xffff) + 1;
	int write = s->opcode == TT_NVME_CMD_WRITE;

	fk.cmds++;
	if (s->opcode == TT_NVME_CMD_FLUSH)
		return fdatasync(fk.io_fd) ? TT_NVME_SC_INTERNAL : TT_NVME_SC_SUCCESS;
	if (s->opcode != TT_NVME_CMD_READ && !write)
		return TT_NVME_SC_INVALID_OPCODE;
	if (slba + nlb > fk_nsze())
		return TT_NVME_SC_LBA_RANGE;
	if (s->flags & TT_NVME_FLAG_PSDT_MASK)
		return fk_sgl(s, write, slba << fk.lba_shift, nlb << fk.lba_shift);
	return fk_prp(s, write, slba << fk.lba_shift, nlb << fk.lba_shift);
}

/* Post a completion for @cid of queue @qid (fk.lock held). */
static void fk_complete(unsigned qid, uint16_t cid, uint16_t status)
{
	struct fk_queue *q = &fk.q[qid];
	struct tt_nvme_cqe c = { 0 };

	c.cid = cid;
	c.sq_id = (uint16_t)qid;
	c.sq_head = (uint16_t)q->sq_head;
	c.status = (uint16_t)(status << 1) | q->phase;
	memcpy((void *)&q->cq[q->cq_tail], &c, sizeof(c) - 2);
	__atomic_store_n(&q->cq[q->cq_tail].status, c.status, __ATOMIC_RELEASE);
	if (++q->cq_tail == q->depth) {
		q->cq_tail = 0;
		q->phase ^= 1;
	}
}

/* Run held command @i of queue @qid and drop it from the held list. */
static void fk_run_held(unsigned qid, unsigned i, int abort)
{
	struct fk_queue *q = &fk.q[qid];
	struct fk_held h = q->held[i];

	q->held[i] = q->held[--q->n_held];
	if (fk.marked)
		fk.late++;
	if (abort) {
		fk.aborted++;
		fk_complete(qid, h.sqe.cid, TT_NVME_SC_ABORT_SQ_DELETED);
	} else {
		fk_complete(qid, h.sqe.cid, fk_exec(&h.sqe));
	}
}

static void fk_poll_queue(unsigned qid)
{
	struct fk_queue *q = &fk.q[qid];
	uint32_t tail = __atomic_load_n(&fk.db[2 * qid], __ATOMIC_ACQUIRE) % q->depth;
	uint64_t now = fk_now_ms();

	while (q->sq_head != tail) {
		struct tt_nvme_sqe s = q->sq[q->sq_head];

		q->sq_head = (q->sq_head + 1) % q->depth;
		if (fk.stall && s.opcode != TT_NVME_CMD_FLUSH &&
		    (!fk.stall_qid || fk.stall_qid == qid) &&
		    ((s.cdw10 | (uint64_t)s.cdw11 << 32) << fk.lba_shift) >= fk.stall_from) {
			q->held[q->n_held].sqe = s;
			q->held[q->n_held++].fetched_ms = now;
			fk.held_total++;
			continue;
		}
		fk_complete(qid, s.cid, fk_exec(&s));
	}
	for (unsigned i = 0; i < q->n_held;) {
		if (fk.resume_ms && now - q->held[i].fetched_ms >= fk.resume_ms)
			fk_run_held(qid, i, 0);
		else
			i++;
	}
}

static void *fk_thread(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&fk.lock);
		if (fk.stop) {
			pthread_mutex_unlock(&fk.lock);
			return NULL;
		}
		for (unsigned qid = 2; qid <= FK_MAX_Q; qid++)
			if (fk.q[qid].live)
				fk_poll_queue(qid);
		pthread_mutex_unlock(&fk.lock);
		usleep(50);
	}
}

/* Commands fetched and not completed, over every queue. */
static unsigned fk_outstanding(void)
{
	unsigned n = 0;

	pthread_mutex_lock(&fk.lock);
	for (unsigned qid = 2; qid <= FK_MAX_Q; qid++)
		n += fk.q[qid].live ? fk.q[qid].n_held : 0;
	pthread_mutex_unlock(&fk.lock);
	return n;
}

static void fk_mark(void)
{
	pthread_mutex_lock(&fk.lock);
	fk.marked = 1;
	pthread_mutex_unlock(&fk.lock);
}

/* Clear the fault injection and the counters between cases. */
static void fk_reset(void)
{
	pthread_mutex_lock(&fk.lock);
	fk.stall = 0;
	fk.stall_qid = 0;
	fk.stall_from = 0;
	fk.resume_ms = 0;
	fk.finish_on_delete = 0;
	fk.delete_errno = 0;
	fk.marked = 0;
	fk.cmds = fk.held_total = fk.aborted = fk.finished_on_delete = 0;
	fk.late = fk.bad_dma = 0;
	pthread_mutex_unlock(&fk.lock);
}

static int fk_queue_create(struct tutti_queue_create *c)
{
	unsigned qid;
	struct fk_queue *q;

	if (c->argsz != sizeof(*c) || c->flags || c->depth < 2 || c->depth > FK_DEPTH_MAX)
		return EINVAL;
	for (qid = 2; qid <= FK_MAX_Q && fk.q[qid].live; qid++)
		;
	if (qid > FK_MAX_Q)
		return ENOSPC;
	q = &fk.q[qid];
	memset(q, 0, sizeof(*q));
	q->depth = c->depth;
	q->sq_bytes = ((size_t)c->depth * 64 + FK_PAGE - 1) & ~(size_t)(FK_PAGE - 1);
	q->cq_bytes = ((size_t)c->depth * 16 + FK_PAGE - 1) & ~(size_t)(FK_PAGE - 1);
	q->sq_fd = memfd_create("fk-sq", MFD_CLOEXEC);
	q->cq_fd = memfd_create("fk-cq", MFD_CLOEXEC);
	if (q->sq_fd < 0 || q->cq_fd < 0 || ftruncate(q->sq_fd, (off_t)q->sq_bytes) ||
	    ftruncate(q->cq_fd, (off_t)q->cq_bytes))
		return ENOMEM;
	q->sq = fk_real_mmap(NULL, q->sq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, q->sq_fd, 0);
	q->cq = fk_real_mmap(NULL, q->cq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, q->cq_fd, 0);
	if (q->sq == MAP_FAILED || q->cq == MAP_FAILED)
		return ENOMEM;
	q->phase = 1;
	fk.db[2 * qid] = 0;
	fk.db[2 * qid + 1] = 0;
	q->live = 1;
	c->qid = qid;
	c->sq_db = 2 * qid * 4;
	c->cq_db = (2 * qid + 1) * 4;
	c->sq_mmap_off = TUTTI_MMAP_SQ(qid);
	c->cq_mmap_off = TUTTI_MMAP_CQ(qid);
	c->sq_bytes = q->sq_bytes;
	c->cq_bytes = q->cq_bytes;
	c->sq_bus = (uintptr_t)q->sq;
	return 0;
}

/* Delete SQ + CQ: every held command finished or aborted before it returns. */
static int fk_queue_delete(uint32_t qid)
{
	struct fk_queue *q = &fk.q[qid];

	if (qid < 2 || qid > FK_MAX_Q || !q->live)
		return EINVAL;
	if (fk.delete_errno)
		return fk.delete_errno;		/* nothing stopped: keeps running */
	while (q->n_held) {
		if (fk.finish_on_delete)
			fk.finished_on_delete++;
		fk_run_held(qid, 0, !fk.finish_on_delete);
	}
	munmap(q->sq, q->sq_bytes);
	munmap(q->cq, q->cq_bytes);
	close(q->sq_fd);
	close(q->cq_fd);
	q->live = 0;
	return 0;
}

static int fk_dma_map(struct tutti_dma_map *m)
{
	if (m->argsz != sizeof(*m) || !m->len || (m->vaddr | m->len) & (FK_PAGE - 1) ||
	    m->bus_cap < m->len / FK_PAGE || fk.n_areas == FK_MAX_AREAS)
		return EINVAL;
	for (uint64_t i = 0; i < m->len / FK_PAGE; i++)
		((uint64_t *)(uintptr_t)m->bus)[i] = m->vaddr + i * FK_PAGE;
	fk.areas[fk.n_areas].addr = m->vaddr;
	fk.areas[fk.n_areas].len = m->len;
	fk.areas[fk.n_areas++].handle = m->handle = ++fk.next_handle;
	return 0;
}

static int fk_dma_unmap(struct tutti_dma_unmap *u)
{
	for (unsigned i = 0; i < fk.n_areas; i++) {
		if (fk.areas[i].handle == u->handle) {
			fk.areas[i] = fk.areas[--fk.n_areas];
			return 0;
		}
	}
	return EINVAL;
}

static int fk_ioctl(unsigned long req, void *arg)
{
	switch (req) {
	case TUTTI_IOC_INFO: {
		struct tutti_info *i = arg;

		memset(i, 0, sizeof(*i));
		i->argsz = sizeof(*i);
		i->flags = TUTTI_INFO_NS;
		i->nsid = 1;
		i->lba_shift = fk.lba_shift;
		i->nsze = fk_nsze();
		i->mdts_bytes = fk.mdts_bytes;
		i->sgls = fk.sgls;
		i->page_size = FK_PAGE;
		i->max_qid = FK_MAX_Q;
		i->mqes = FK_DEPTH_MAX;
		i->db_bytes = FK_PAGE;
		memcpy(i->mn, "fake tutti.ko", 13);
		return 0;
	}
	case TUTTI_IOC_EXTENTS:
		memset((char *)arg + 4, 0, sizeof(struct tutti_extents) - 4);
		return 0;
	case TUTTI_IOC_QUEUE_CREATE:
		return fk_queue_create(arg);
	case TUTTI_IOC_QUEUE_DELETE:
		return fk_queue_delete(((struct tutti_queue_delete *)arg)->qid);
	case TUTTI_IOC_DMA_MAP:
		return fk_dma_map(arg);
	case TUTTI_IOC_DMA_UNMAP:
		return fk_dma_unmap(arg);
	}
	return ENOTTY;
}

/* The program's ioctl(): tutti.ko's for the registered file, else the kernel's. */
int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	void *arg;
	int err;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!fk_is_node(fd))
		return (int)syscall(SYS_ioctl, fd, req, arg);
	pthread_mutex_lock(&fk.lock);
	err = fk_ioctl(req, arg);
	pthread_mutex_unlock(&fk.lock);
	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}

/* The program's mmap(): doorbells and rings of the registered file, else the kernel's. */
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	uint64_t o = (uint64_t)off;
	unsigned qid = TUTTI_MMAP_QID(o);
	int mfd = -1;

	if (!fk_is_node(fd))
		return fk_real_mmap(addr, len, prot, flags, fd, off);
	pthread_mutex_lock(&fk.lock);
	if (o == TUTTI_MMAP_DB && len <= FK_PAGE)
		mfd = fk.db_fd;
	else if (qid >= 2 && qid <= FK_MAX_Q && fk.q[qid].live && o == TUTTI_MMAP_SQ(qid))
		mfd = fk.q[qid].sq_fd;
	else if (qid >= 2 && qid <= FK_MAX_Q && fk.q[qid].live && o == TUTTI_MMAP_CQ(qid))
		mfd = fk.q[qid].cq_fd;
	pthread_mutex_unlock(&fk.lock);
	if (mfd < 0 || !(flags & MAP_SHARED)) {
		errno = EINVAL;
		return MAP_FAILED;
	}
	return fk_real_mmap(addr, len, prot, flags, mfd, 0);
}

/* Make the file at @path (@bytes long) a namespace node; start the controller. */
static int fk_node_add(const char *path, uint64_t bytes, uint32_t lba_shift, uint32_t sgls,
		       uint32_t mdts_bytes)
{
	struct stat st;

	fk.io_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fk.io_fd < 0 || ftruncate(fk.io_fd, (off_t)bytes) || fstat(fk.io_fd, &st))
		return -errno;
	fk.dev = st.st_dev;
	fk.ino = st.st_ino;
	fk.lba_shift = lba_shift;
	fk.sgls = sgls;
	fk.mdts_bytes = mdts_bytes;
	fk.db_fd = memfd_create("fk-db", MFD_CLOEXEC);
	if (fk.db_fd < 0 || ftruncate(fk.db_fd, FK_PAGE))
		return -errno;
	fk.db = fk_real_mmap(NULL, FK_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fk.db_fd, 0);
	if (fk.db == MAP_FAILED)
		return -ENOMEM;
	if (pthread_create(&fk.thread, NULL, fk_thread, NULL))
		return -EAGAIN;
	fk.running = 1;
	return 0;
}

static void fk_node_stop(void)
{
	if (!fk.running)
		return;
	pthread_mutex_lock(&fk.lock);
	fk.stop = 1;
	pthread_mutex_unlock(&fk.lock);
	pthread_join(fk.thread, NULL);
	fk.running = 0;
}

#endif
