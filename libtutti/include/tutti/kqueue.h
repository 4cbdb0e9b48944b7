/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/kqueue.h - user side of tutti.ko (kmod/): NVMe queue pairs that a
 * process drives itself, and the "kqueue" engine built on them.
 *
 * A store member for the kqueue engine is a namespace node of the module,
 * /dev/tuttiNnM (controller N, namespace M).  The engine creates one queue
 * pair per member on the member's file, pins memory through the module to
 * learn bus addresses, and builds NVMe commands with tt_nvme_map() (SGL
 * when the controller supports it, PRP otherwise; TUTTI_KQ_PRP=1 in the
 * environment forces PRP), split at the controller's MDTS.  Unregistered
 * memory goes through a pinned bounce pool.  Metadata I/O and flushes use
 * the node's read/write/fsync, served by the module's own queue.
 *
 * A member whose commands get no completion for TUTTI_KQ_TIMEOUT_MS (default
 * 30000) is fenced: its queue is deleted (tt_kqp_delete()) before the
 * commands fail with -ETIMEDOUT and their memory is released, and a new
 * queue is made (docs/kmod.md, "The kqueue engine").
 *
 * The functions below are what the engine uses, exported for tools and
 * tests that drive queues by hand.  All return 0 or a negative errno
 * (reason in tt_errmsg()).
 */
#ifndef TUTTI_KQUEUE_H
#define TUTTI_KQUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "tutti/nvme_queue.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */
/* cffi: begin */

/* struct tt_kinfo.flags (equal to the module's TUTTI_INFO_*) */
#define TT_KINFO_NS		(1u << 0)
#define TT_KINFO_CMB		(1u << 1)
#define TT_KINFO_CMB_SQS	(1u << 2)
#define TT_KINFO_CMB_DATA	(1u << 3)

/** struct tt_kinfo - what a tutti node is (see kmod/include/uapi/tutti.h) */
struct tt_kinfo {
	uint32_t flags;
	uint32_t instance;
	uint32_t nsid;
	uint32_t lba_shift;
	uint64_t nsze;
	uint64_t cap;
	uint32_t vs;
	uint32_t mdts_bytes;
	uint32_t sgls;
	uint32_t page_size;
	uint32_t max_qid;
	uint32_t mqes;
	uint32_t dstrd;
	uint32_t db_bytes;
	uint32_t nn;
	uint16_t vid;
	uint16_t ssvid;
	uint64_t cmb_bus;
	uint64_t cmb_bytes;
	char sn[21];
	char mn[41];
	char fr[9];
	char bdf[16];
};

/** struct tt_kextents - the store regions the module read from a superblock */
struct tt_kextents {
	int valid;
	uint8_t uuid[16];
	uint32_t member_index;
	uint32_t n_members;
	uint64_t table_off;
	uint64_t table_bytes;
	uint64_t data_off;
	uint64_t member_bytes;
};

/* cffi: end */
/**
 * struct tt_kqp - an I/O queue pair of the calling process, mapped
 * @fd: the node it was created on (not owned)
 * @qid: queue id
 * @sq, @cq: ring state for nvme_queue.h
 * @sq_bus: bus address of the SQ ring
 * @sq_map, @cq_map, @db_map: the mappings (SQ: NULL when it is in a peer's
 *        CMB; the caller owns that mapping)
 */
struct tt_kqp {
	int fd;
	uint16_t qid;
	uint32_t depth;
	struct tt_nvme_sq sq;
	struct tt_nvme_cq cq;
	uint64_t sq_bus;
	void *sq_map;
	size_t sq_bytes;
	void *cq_map;
	size_t cq_bytes;
	void *db_map;
	size_t db_bytes;
};
/* cffi: begin */

/**
 * tt_kdev_info() - describe an open tutti node
 * @fd: open node
 * @info: out
 * Return: 0, -ENOTTY if @fd is not a tutti node.
 */
int tt_kdev_info(int fd, struct tt_kinfo *info);

/**
 * tt_kdev_size() - byte size of a namespace node (for store members)
 * Return: 0, -ENOTTY not a tutti namespace node.
 */
int tt_kdev_size(int fd, uint64_t *bytes);

/** tt_kdev_extents() - the Tutti superblock's regions, as the module reads them */
int tt_kdev_extents(int fd, struct tt_kextents *ext);

/**
 * tt_kdev_admin() - read-only admin passthrough (Identify, Get Log Page)
 * @fd: open node
 * @opcode: 0x06 Identify or 0x02 Get Log Page
 * @nsid: namespace field
 * @cdw10: CNS for Identify, log id for Get Log Page
 * @buf: receives @len bytes (4096 for Identify)
 * @len: bytes
 * @status: out, NVMe status (0 success)
 * Return: 0 when the command ran (see @status), else a negative errno.
 */
int tt_kdev_admin(int fd, uint8_t opcode, uint32_t nsid, uint32_t cdw10,
		  void *buf, uint32_t len, uint16_t *status);

/**
 * tt_kdma_map() - pin [addr, addr + len) and get each page's bus address
 * @fd: open node (its controller does the DMA)
 * @addr: page aligned
 * @len: page multiple
 * @bus: out, len / 4096 entries
 * @handle: out, for tt_kdma_unmap()
 */
int tt_kdma_map(int fd, void *addr, size_t len, uint64_t *bus, uint32_t *handle);

/** tt_kdma_unmap() - unpin a mapping made by tt_kdma_map(). */
int tt_kdma_unmap(int fd, uint32_t handle);

/**
 * tt_kqp_create() - create and map an I/O queue pair
 * @fd: open node
 * @depth: entries per ring
 * @peer_fd: -1, or an open tutti node whose CMB holds the SQ
 * @peer_off: offset of the SQ in that CMB (page aligned)
 * @peer_sq: the caller's mapping of that CMB offset (with @peer_fd)
 * @out: the queue pair (free with tt_kqp_destroy())
 */
int tt_kqp_create(int fd, uint32_t depth, int peer_fd, uint64_t peer_off,
		  void *peer_sq, struct tt_kqp **out);

/**
 * tt_kqp_delete() - unmap a queue pair and delete it on the controller
 * @q: queue pair (freed; NULL is a no-op)
 *
 * The module's Delete SQ returns only after the controller finished or
 * aborted every command of the queue, or after it disabled a controller
 * that did not answer and saw it stop (docs/kmod.md, "Stopping a queue").
 * Return: 0 deleted; -EIO the controller had to be disabled and stopped;
 * -ENODEV the controller was unbound (and so stopped); -ETIMEDOUT the
 * controller was disabled but did not confirm it stopped; other -errno
 * the delete was refused.  tt_kqp_stopped() says which of these mean that
 * no command of the queue can still move data.
 */
int tt_kqp_delete(struct tt_kqp *q);

/**
 * tt_kqp_stopped() - does tt_kqp_delete()'s result @ret prove the queue stopped?
 *
 * Return: 1 for 0, -EIO and -ENODEV; 0 otherwise: then memory the queue's
 * commands addressed must never be reused.
 */
int tt_kqp_stopped(int ret);

/** tt_kqp_destroy() - tt_kqp_delete(), result ignored (tests, tools). */
void tt_kqp_destroy(struct tt_kqp *q);

/**
 * tt_kqp_exec() - submit one command and poll for its completion
 * @q: queue pair with nothing else in flight
 * @sqe: command; its cid is set here
 * @cqe: out (may be NULL)
 * @timeout_ms: give up after this long (-ETIMEDOUT)
 * Return: 0 when a completion arrived (status in @cqe), else -errno.  After
 * -ETIMEDOUT the command is still live: delete the queue (tt_kqp_delete())
 * before the memory it addresses is reused.
 */
int tt_kqp_exec(struct tt_kqp *q, struct tt_nvme_sqe *sqe,
		struct tt_nvme_cqe *cqe, unsigned timeout_ms);

/**
 * tt_kdev_map_cmb() - map the first @len bytes of a node's CMB (uncached)
 * Return: the mapping, or NULL (errno set).
 */
void *tt_kdev_map_cmb(int fd, size_t len);

/**
 * tt_kmod_attach() - hand a PCI NVMe controller to tutti.ko
 * @bdf: PCI address, "0000:00:04.0"
 *
 * Refuses (-EBUSY, reason in tt_errmsg()) while any of the controller's
 * block devices is mounted, used as swap or held by another device;
 * otherwise unbinds the current driver, sets driver_override and binds.
 */
int tt_kmod_attach(const char *bdf);

/**
 * tt_kmod_detach() - give a controller back to the kernel's nvme driver
 * @bdf: PCI address
 */
int tt_kmod_detach(const char *bdf);

/* cffi: end */
#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
