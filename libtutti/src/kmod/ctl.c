// SPDX-License-Identifier: Apache-2.0
/*
 * ioctl wrappers for tutti.ko's nodes (/dev/tuttiN, /dev/tuttiNnM): what
 * a node is, queue pairs, pinned memory, read-only admin passthrough.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "tutti/error.h"
#include "tutti/kqueue.h"
#include "../../../kmod/include/uapi/tutti.h"

static void copy_id(char *dst, const uint8_t *src, size_t n)
{
	memcpy(dst, src, n);
	dst[n] = 0;
	while (n && (dst[n - 1] == ' ' || dst[n - 1] == 0))
		dst[--n] = 0;
}

int tt_kdev_info(int fd, struct tt_kinfo *info)
{
	struct tutti_info k = { .argsz = sizeof(k) };

	if (ioctl(fd, TUTTI_IOC_INFO, &k))
		return -errno;
	memset(info, 0, sizeof(*info));
	info->flags = k.flags;
	info->instance = k.instance;
	info->nsid = k.nsid;
	info->lba_shift = k.lba_shift;
	info->nsze = k.nsze;
	info->cap = k.cap;
	info->vs = k.vs;
	info->mdts_bytes = k.mdts_bytes;
	info->sgls = k.sgls;
	info->page_size = k.page_size;
	info->max_qid = k.max_qid;
	info->mqes = k.mqes;
	info->dstrd = k.dstrd;
	info->db_bytes = k.db_bytes;
	info->nn = k.nn;
	info->vid = k.vid;
	info->ssvid = k.ssvid;
	info->cmb_bus = k.cmb_bus;
	info->cmb_bytes = k.cmb_bytes;
	copy_id(info->sn, k.sn, sizeof(k.sn));
	copy_id(info->mn, k.mn, sizeof(k.mn));
	copy_id(info->fr, k.fr, sizeof(k.fr));
	memcpy(info->bdf, k.bdf, sizeof(info->bdf));
	info->bdf[sizeof(info->bdf) - 1] = 0;
	return 0;
}

int tt_kdev_size(int fd, uint64_t *bytes)
{
	struct tt_kinfo info;
	int ret = tt_kdev_info(fd, &info);

	if (ret || !(info.flags & TT_KINFO_NS))
		return -ENOTTY;
	*bytes = info.nsze << info.lba_shift;
	return 0;
}

int tt_kdev_extents(int fd, struct tt_kextents *ext)
{
	struct tutti_extents k = { .argsz = sizeof(k) };

	if (ioctl(fd, TUTTI_IOC_EXTENTS, &k))
		return tt_seterr(-errno, "tutti extents: %s", strerror(errno));
	memset(ext, 0, sizeof(*ext));
	ext->valid = !!(k.flags & TUTTI_EXTENTS_VALID);
	memcpy(ext->uuid, k.uuid, sizeof(ext->uuid));
	ext->member_index = k.member_index;
	ext->n_members = k.n_members;
	ext->table_off = k.table_off;
	ext->table_bytes = k.table_bytes;
	ext->data_off = k.data_off;
	ext->member_bytes = k.member_bytes;
	return 0;
}

int tt_kdev_admin(int fd, uint8_t opcode, uint32_t nsid, uint32_t cdw10,
		  void *buf, uint32_t len, uint16_t *status)
{
	struct tutti_admin a = {
		.argsz = sizeof(a),
		.opcode = opcode,
		.nsid = nsid,
		.cdw10 = cdw10,
		.data = (uintptr_t)buf,
		.data_len = len,
	};

	if (ioctl(fd, TUTTI_IOC_ADMIN, &a))
		return tt_seterr(-errno, "tutti admin %#x: %s", opcode, strerror(errno));
	*status = (uint16_t)a.status;
	return 0;
}

int tt_kdma_map(int fd, void *addr, size_t len, uint64_t *bus, uint32_t *handle)
{
	struct tutti_dma_map m = {
		.argsz = sizeof(m),
		.vaddr = (uintptr_t)addr,
		.len = len,
		.bus = (uintptr_t)bus,
		.bus_cap = (uint32_t)(len / 4096),
	};

	if (ioctl(fd, TUTTI_IOC_DMA_MAP, &m))
		return tt_seterr(-errno, "tutti: pinning %zu bytes: %s", len, strerror(errno));
	*handle = m.handle;
	return 0;
}

int tt_kdma_unmap(int fd, uint32_t handle)
{
	struct tutti_dma_unmap u = { .argsz = sizeof(u), .handle = handle };

	if (ioctl(fd, TUTTI_IOC_DMA_UNMAP, &u))
		return -errno;
	return 0;
}

int tt_kqp_create(int fd, uint32_t depth, int peer_fd, uint64_t peer_off,
		  void *peer_sq, struct tt_kqp **out)
{
	struct tutti_queue_create c = { .argsz = sizeof(c), .depth = depth };
	struct tutti_queue_delete d = { .argsz = sizeof(d) };
	struct tt_kinfo info;
	struct tt_kqp *q;
	int ret;

	ret = tt_kdev_info(fd, &info);
	if (ret)
		return tt_seterr(ret, "not a tutti node: %s", strerror(-ret));
	if (peer_fd >= 0) {
		c.flags = TUTTI_QUEUE_SQ_PEER;
		c.peer_fd = peer_fd;
		c.peer_off = peer_off;
	}
	q = calloc(1, sizeof(*q));
	if (!q)
		return tt_seterr(-ENOMEM, "out of memory");
	if (ioctl(fd, TUTTI_IOC_QUEUE_CREATE, &c)) {
		ret = -errno;
		free(q);
		return tt_seterr(ret, "tutti: creating a queue pair of depth %u: %s",
				 depth, strerror(-ret));
	}
	q->fd = fd;
	q->qid = (uint16_t)c.qid;
	q->depth = depth;
	q->sq_bus = c.sq_bus;
	q->sq_bytes = c.sq_bytes;
	q->cq_bytes = c.cq_bytes;
	q->db_bytes = info.db_bytes;
	q->sq_map = MAP_FAILED;
	q->cq_map = mmap(NULL, c.cq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			 (off_t)c.cq_mmap_off);
	q->db_map = mmap(NULL, info.db_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			 TUTTI_MMAP_DB);
	if (peer_fd < 0)
		q->sq_map = mmap(NULL, c.sq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
				 fd, (off_t)c.sq_mmap_off);
	if (q->cq_map == MAP_FAILED || q->db_map == MAP_FAILED ||
	    (peer_fd < 0 && q->sq_map == MAP_FAILED)) {
		ret = -errno;
		if (q->cq_map != MAP_FAILED)
			munmap(q->cq_map, q->cq_bytes);
		if (q->db_map != MAP_FAILED)
			munmap(q->db_map, q->db_bytes);
		if (q->sq_map != MAP_FAILED)
			munmap(q->sq_map, q->sq_bytes);
		d.qid = c.qid;
		ioctl(fd, TUTTI_IOC_QUEUE_DELETE, &d);
		free(q);
		return tt_seterr(ret, "tutti: mapping queue rings: %s", strerror(-ret));
	}
	if (peer_fd >= 0)
		q->sq_map = NULL;
	tt_sq_init(&q->sq, peer_fd >= 0 ? peer_sq : q->sq_map,
		   (volatile uint32_t *)((char *)q->db_map + c.sq_db), depth, q->qid);
	tt_cq_init(&q->cq, q->cq_map,
		   (volatile uint32_t *)((char *)q->db_map + c.cq_db), depth);
	*out = q;
	return 0;
}

int tt_kqp_delete(struct tt_kqp *q)
{
	struct tutti_queue_delete d = { .argsz = sizeof(d) };
	int ret = 0;

	if (!q)
		return 0;
	munmap(q->cq_map, q->cq_bytes);
	munmap(q->db_map, q->db_bytes);
	if (q->sq_map)
		munmap(q->sq_map, q->sq_bytes);
	d.qid = q->qid;
	if (ioctl(q->fd, TUTTI_IOC_QUEUE_DELETE, &d))
		ret = -errno;
	free(q);
	return ret;
}

int tt_kqp_stopped(int ret)
{
	return ret == 0 || ret == -EIO || ret == -ENODEV;
}

void tt_kqp_destroy(struct tt_kqp *q)
{
	tt_kqp_delete(q);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int tt_kqp_exec(struct tt_kqp *q, struct tt_nvme_sqe *sqe,
		struct tt_nvme_cqe *cqe, unsigned timeout_ms)
{
	static uint16_t next_cid;
	uint64_t deadline = now_ms() + timeout_ms;
	const struct tt_nvme_cqe *c;

	sqe->cid = next_cid++;
	if (tt_sq_push(&q->sq, sqe) < 0)
		return -ENOSPC;
	tt_sq_ring_doorbell(&q->sq);
	while (!(c = tt_cq_peek(&q->cq))) {
		if (now_ms() > deadline)
			return -ETIMEDOUT;
		sched_yield();
	}
	if (cqe)
		*cqe = *c;
	tt_sq_update_head(&q->sq, c->sq_head);
	tt_cq_advance(&q->cq);
	tt_cq_ring_doorbell(&q->cq);
	return 0;
}

void *tt_kdev_map_cmb(int fd, size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		       (off_t)TUTTI_MMAP_CMB);

	return p == MAP_FAILED ? NULL : p;
}
