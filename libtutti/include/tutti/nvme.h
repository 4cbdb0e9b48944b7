/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tutti/nvme.h - NVMe 1.4 queue entries and command builders
 *
 * Submission and completion queue entries as laid out by the NVM Express
 * Base Specification 1.4 (section 4.2 and 4.6), the SGL descriptor (4.4),
 * and builders for the commands libtutti issues. Builders zero the entry
 * first, so the order is: build the command, map its data (nvme_prp.h /
 * nvme_sgl.h), set the command identifier, push it (nvme_queue.h).
 */
#ifndef TUTTI_NVME_H
#define TUTTI_NVME_H

#include "hd.h"

/* cffi: begin */
/* NVM command set opcodes */
#define TT_NVME_CMD_FLUSH 0x00
#define TT_NVME_CMD_WRITE 0x01
#define TT_NVME_CMD_READ  0x02

/* Admin command set opcodes */
#define TT_NVME_ADMIN_DELETE_SQ    0x00
#define TT_NVME_ADMIN_CREATE_SQ    0x01
#define TT_NVME_ADMIN_GET_LOG_PAGE 0x02
#define TT_NVME_ADMIN_DELETE_CQ    0x04
#define TT_NVME_ADMIN_CREATE_CQ    0x05
#define TT_NVME_ADMIN_IDENTIFY     0x06
#define TT_NVME_ADMIN_SET_FEATURES 0x09

/* Identify CNS values */
#define TT_NVME_IDENTIFY_CNS_NS          0x00
#define TT_NVME_IDENTIFY_CNS_CTRL        0x01
#define TT_NVME_IDENTIFY_CNS_ACTIVE_NSID 0x02

/* Log page identifiers */
#define TT_NVME_LOG_ERROR   0x01
#define TT_NVME_LOG_SMART   0x02
#define TT_NVME_LOG_FW_SLOT 0x03

/* Feature identifiers */
#define TT_NVME_FEAT_NUM_QUEUES 0x07

/* SQE flags byte (CDW0 bits 15:8): FUSE in bits 1:0, PSDT in bits 7:6 */
#define TT_NVME_FLAG_FUSE_MASK  0x03
#define TT_NVME_FLAG_PSDT_MASK  0xc0
#define TT_NVME_FLAG_PSDT_PRP   0x00
#define TT_NVME_FLAG_PSDT_SGL   0x40 /* SGL data, MPTR is a contiguous buffer */
#define TT_NVME_FLAG_PSDT_SGL_MPTR_SGL 0x80 /* SGL data, MPTR is an SGL */

/* SGL descriptor types (byte 15 bits 7:4) and subtypes (bits 3:0) */
#define TT_NVME_SGL_TYPE_DATA_BLOCK   0x0
#define TT_NVME_SGL_TYPE_BIT_BUCKET   0x1
#define TT_NVME_SGL_TYPE_SEGMENT      0x2
#define TT_NVME_SGL_TYPE_LAST_SEGMENT 0x3
#define TT_NVME_SGL_SUBTYPE_ADDRESS   0x0

/* Identify Controller SGLS field, bits 1:0 */
#define TT_NVME_SGLS_SUPPORT_MASK  0x3
#define TT_NVME_SGLS_BYTE_ALIGNED  0x1
#define TT_NVME_SGLS_DWORD_ALIGNED 0x2

/* Status field (CQE DW3 bits 31:16): phase is bit 0, status code above it */
#define TT_NVME_STATUS_PHASE 0x0001
#define TT_NVME_STATUS_DNR   0x8000
#define TT_NVME_STATUS_MORE  0x4000

/* Status code types, and codes as returned by tt_nvme_cqe_status() */
#define TT_NVME_SCT_GENERIC      0x0
#define TT_NVME_SCT_CMD_SPECIFIC 0x1
#define TT_NVME_SCT_MEDIA        0x2
#define TT_NVME_SCT_PATH         0x3
/* cffi: end */
#define TT_NVME_SC(sct, sc) ((uint16_t)(((sct) << 8) | (sc)))

#define TT_NVME_SC_SUCCESS            TT_NVME_SC(0, 0x00)
#define TT_NVME_SC_INVALID_OPCODE     TT_NVME_SC(0, 0x01)
#define TT_NVME_SC_INVALID_FIELD      TT_NVME_SC(0, 0x02)
#define TT_NVME_SC_CMDID_CONFLICT     TT_NVME_SC(0, 0x03)
#define TT_NVME_SC_DATA_XFER_ERROR    TT_NVME_SC(0, 0x04)
#define TT_NVME_SC_POWER_LOSS         TT_NVME_SC(0, 0x05)
#define TT_NVME_SC_INTERNAL           TT_NVME_SC(0, 0x06)
#define TT_NVME_SC_ABORT_REQ          TT_NVME_SC(0, 0x07)
#define TT_NVME_SC_ABORT_SQ_DELETED   TT_NVME_SC(0, 0x08)
#define TT_NVME_SC_INVALID_NS         TT_NVME_SC(0, 0x0b)
#define TT_NVME_SC_CMD_SEQ_ERROR      TT_NVME_SC(0, 0x0c)
#define TT_NVME_SC_SGL_INVALID_SEG    TT_NVME_SC(0, 0x0d)
#define TT_NVME_SC_SGL_INVALID_COUNT  TT_NVME_SC(0, 0x0e)
#define TT_NVME_SC_SGL_INVALID_DATA   TT_NVME_SC(0, 0x0f)
#define TT_NVME_SC_SGL_INVALID_TYPE   TT_NVME_SC(0, 0x11)
#define TT_NVME_SC_PRP_INVALID_OFFSET TT_NVME_SC(0, 0x13)
#define TT_NVME_SC_LBA_RANGE          TT_NVME_SC(0, 0x80)
#define TT_NVME_SC_CAP_EXCEEDED       TT_NVME_SC(0, 0x81)
#define TT_NVME_SC_NS_NOT_READY       TT_NVME_SC(0, 0x82)
#define TT_NVME_SC_CQ_INVALID         TT_NVME_SC(1, 0x00)
#define TT_NVME_SC_QID_INVALID        TT_NVME_SC(1, 0x01)
#define TT_NVME_SC_QUEUE_SIZE         TT_NVME_SC(1, 0x02)
#define TT_NVME_SC_WRITE_FAULT        TT_NVME_SC(2, 0x80)
#define TT_NVME_SC_READ_ERROR         TT_NVME_SC(2, 0x81)
#define TT_NVME_SC_ACCESS_DENIED      TT_NVME_SC(2, 0x86)

/**
 * struct tt_nvme_sgl_desc - SGL descriptor (16 bytes)
 * @addr: bus address of the data block or of the next SGL segment
 * @len: length in bytes of the data block or of the next SGL segment
 * @rsvd: reserved, zero
 * @type: descriptor type << 4 | descriptor subtype
 */
struct tt_nvme_sgl_desc {
	uint64_t addr;
	uint32_t len;
	uint8_t rsvd[3];
	uint8_t type;
};

/**
 * struct tt_nvme_sqe - submission queue entry (64 bytes)
 *
 * @opcode, @flags (FUSE bits 1:0, PSDT bits 7:6) and @cid form CDW0.
 * @dptr holds PRP1/PRP2 when PSDT is 00b and one SGL descriptor otherwise.
 */
struct tt_nvme_sqe {
	uint8_t opcode;
	uint8_t flags;
	uint16_t cid;
	uint32_t nsid;
	uint32_t cdw2;
	uint32_t cdw3;
	uint64_t mptr;
	union {
		struct {
			uint64_t prp1;
			uint64_t prp2;
		} prp;
		struct tt_nvme_sgl_desc sgl;
	} dptr;
	uint32_t cdw10;
	uint32_t cdw11;
	uint32_t cdw12;
	uint32_t cdw13;
	uint32_t cdw14;
	uint32_t cdw15;
};

/**
 * struct tt_nvme_cqe - completion queue entry (16 bytes)
 * @result: command specific DW0
 * @dw1: command specific DW1
 * @sq_head: SQ head pointer as consumed by the controller
 * @sq_id: submission queue the command came from
 * @cid: command identifier
 * @status: phase tag (bit 0) and status field (bits 15:1)
 */
struct tt_nvme_cqe {
	uint32_t result;
	uint32_t dw1;
	uint16_t sq_head;
	uint16_t sq_id;
	uint16_t cid;
	uint16_t status;
};

TT_STATIC_ASSERT(sizeof(struct tt_nvme_sgl_desc) == 16, "SGL descriptor is 16 bytes");
TT_STATIC_ASSERT(sizeof(struct tt_nvme_sqe) == 64, "SQE is 64 bytes");
TT_STATIC_ASSERT(sizeof(struct tt_nvme_cqe) == 16, "CQE is 16 bytes");
TT_STATIC_ASSERT(offsetof(struct tt_nvme_sqe, cid) == 2, "CID at byte 2");
TT_STATIC_ASSERT(offsetof(struct tt_nvme_sqe, nsid) == 4, "NSID at byte 4");
TT_STATIC_ASSERT(offsetof(struct tt_nvme_sqe, mptr) == 16, "MPTR at byte 16");
TT_STATIC_ASSERT(offsetof(struct tt_nvme_sqe, dptr) == 24, "DPTR at byte 24");
TT_STATIC_ASSERT(offsetof(struct tt_nvme_sqe, cdw10) == 40, "CDW10 at byte 40");
TT_STATIC_ASSERT(offsetof(struct tt_nvme_sgl_desc, type) == 15, "SGL id at byte 15");
TT_STATIC_ASSERT(offsetof(struct tt_nvme_cqe, sq_head) == 8, "SQHD at byte 8");
TT_STATIC_ASSERT(offsetof(struct tt_nvme_cqe, status) == 14, "status at byte 14");

/* cffi: begin */
/**
 * struct tt_dma_seg - one physically contiguous piece of a data buffer
 * @addr: bus address as seen by the controller
 * @len: length in bytes
 */
struct tt_dma_seg {
	uint64_t addr;
	uint32_t len;
};
/* cffi: end */

/**
 * struct tt_nvme_list - memory for PRP lists or SGL segments
 * @vaddr: @nchunks chunks of @chunk_bytes each, one after the other in the
 *         submitter's (CPU or GPU) address space
 * @bus: bus address of each chunk; chunks need not be contiguous on the bus
 * @nchunks: number of chunks
 * @chunk_bytes: size of a chunk; must equal the controller page size for
 *               PRP lists, holds @chunk_bytes / 16 SGL descriptors
 */
struct tt_nvme_list {
	void *vaddr;
	const uint64_t *bus;
	unsigned nchunks;
	uint32_t chunk_bytes;
};

/* cffi: begin */
/**
 * struct tt_nvme_xfer_caps - controller limits that shape data mapping
 * @page_size: memory page size programmed in CC.MPS, in bytes
 * @mdts_bytes: maximum data transfer size in bytes, 0 for no limit
 * @sgls: Identify Controller SGLS field
 * @sgl_threshold: smallest transfer, in bytes, that is mapped with SGLs
 */
struct tt_nvme_xfer_caps {
	uint32_t page_size;
	uint32_t mdts_bytes;
	uint32_t sgls;
	uint32_t sgl_threshold;
};
/* cffi: end */

/**
 * tt_nvme_list_chunks() - list chunks needed for a chained list
 * @n: entries to store (PRP entries after PRP1, or SGL data descriptors)
 * @per_chunk: entries one chunk holds
 *
 * PRP lists and SGL segments chain the same way: every chunk but the last
 * gives its final entry to the pointer to the next chunk.
 *
 * Return: number of chunks, 0 if @per_chunk is too small to chain.
 */
TT_INLINE unsigned tt_nvme_list_chunks(unsigned n, unsigned per_chunk)
{
	if (n <= per_chunk)
		return 1;
	if (per_chunk < 2)
		return 0;
	return 1 + (n - per_chunk + per_chunk - 2) / (per_chunk - 1);
}

/*
 * Index in list memory of data entry @k when @n entries fill @nchunks
 * chunks of @per_chunk entries laid out by tt_nvme_list_chunks().
 */
TT_INLINE unsigned tt__list_slot(unsigned k, unsigned per_chunk,
				 unsigned nchunks)
{
	unsigned c;

	if (nchunks <= 1)
		return k;
	c = k / (per_chunk - 1);
	if (c > nchunks - 1)
		c = nchunks - 1;
	return c * per_chunk + (k - c * (per_chunk - 1));
}

/**
 * tt_nvme_mdts_bytes() - convert Identify Controller MDTS to bytes
 * @mdts: MDTS field (a power of two in units of CAP.MPSMIN)
 * @mpsmin_bytes: minimum memory page size from CAP.MPSMIN, in bytes
 *
 * Return: the limit in bytes, 0 when there is none or it exceeds 4 GiB - 1.
 */
TT_INLINE uint32_t tt_nvme_mdts_bytes(uint8_t mdts, uint32_t mpsmin_bytes)
{
	uint64_t v;

	if (mdts == 0 || mdts >= 32)
		return 0;
	v = (uint64_t)mpsmin_bytes << mdts;
	return v > 0xffffffffu ? 0 : (uint32_t)v;
}

/**
 * tt_nvme_sqe_clear() - zero a submission queue entry
 * @sqe: entry to clear
 */
TT_INLINE void tt_nvme_sqe_clear(struct tt_nvme_sqe *sqe)
{
	sqe->opcode = 0;
	sqe->flags = 0;
	sqe->cid = 0;
	sqe->nsid = 0;
	sqe->cdw2 = 0;
	sqe->cdw3 = 0;
	sqe->mptr = 0;
	sqe->dptr.prp.prp1 = 0;
	sqe->dptr.prp.prp2 = 0;
	sqe->cdw10 = 0;
	sqe->cdw11 = 0;
	sqe->cdw12 = 0;
	sqe->cdw13 = 0;
	sqe->cdw14 = 0;
	sqe->cdw15 = 0;
}

/**
 * tt_nvme_sqe_set_psdt() - select PRP or SGL data pointers in an entry
 * @sqe: entry to change
 * @psdt: TT_NVME_FLAG_PSDT_PRP or TT_NVME_FLAG_PSDT_SGL
 */
TT_INLINE void tt_nvme_sqe_set_psdt(struct tt_nvme_sqe *sqe, uint8_t psdt)
{
	sqe->flags = (uint8_t)((sqe->flags & ~TT_NVME_FLAG_PSDT_MASK) |
			       (psdt & TT_NVME_FLAG_PSDT_MASK));
}

/**
 * tt_nvme_sgl_desc_set() - fill an SGL descriptor
 * @d: descriptor to fill
 * @addr: bus address
 * @len: length in bytes
 * @type: TT_NVME_SGL_TYPE_* (the subtype is always "address")
 */
TT_INLINE void tt_nvme_sgl_desc_set(struct tt_nvme_sgl_desc *d, uint64_t addr,
				    uint32_t len, uint8_t type)
{
	d->addr = addr;
	d->len = len;
	d->rsvd[0] = 0;
	d->rsvd[1] = 0;
	d->rsvd[2] = 0;
	d->type = (uint8_t)((type << 4) | TT_NVME_SGL_SUBTYPE_ADDRESS);
}

/**
 * tt_nvme_sgl_desc_type() - descriptor type of an SGL descriptor
 * @d: descriptor
 *
 * Return: TT_NVME_SGL_TYPE_* value (byte 15 bits 7:4).
 */
TT_INLINE uint8_t tt_nvme_sgl_desc_type(const struct tt_nvme_sgl_desc *d)
{
	return (uint8_t)(d->type >> 4);
}

TT_INLINE int tt__nvme_cmd_rw(struct tt_nvme_sqe *sqe, uint8_t opcode,
			      uint32_t nsid, uint64_t slba, uint32_t nblocks)
{
	if (nblocks == 0 || nblocks > 0x10000)
		return -TT_EINVAL;
	tt_nvme_sqe_clear(sqe);
	sqe->opcode = opcode;
	sqe->nsid = nsid;
	sqe->cdw10 = (uint32_t)slba;
	sqe->cdw11 = (uint32_t)(slba >> 32);
	sqe->cdw12 = nblocks - 1; /* NLB is 0's based */
	return 0;
}

/**
 * tt_nvme_cmd_read() - build an NVM Read command
 * @sqe: entry to fill (cleared first)
 * @nsid: namespace
 * @slba: first logical block
 * @nblocks: number of logical blocks, 1 to 65536
 *
 * Return: 0, or -TT_EINVAL if @nblocks is out of range.
 */
TT_INLINE int tt_nvme_cmd_read(struct tt_nvme_sqe *sqe, uint32_t nsid,
			       uint64_t slba, uint32_t nblocks)
{
	return tt__nvme_cmd_rw(sqe, TT_NVME_CMD_READ, nsid, slba, nblocks);
}

/**
 * tt_nvme_cmd_write() - build an NVM Write command
 * @sqe: entry to fill (cleared first)
 * @nsid: namespace
 * @slba: first logical block
 * @nblocks: number of logical blocks, 1 to 65536
 *
 * Return: 0, or -TT_EINVAL if @nblocks is out of range.
 */
TT_INLINE int tt_nvme_cmd_write(struct tt_nvme_sqe *sqe, uint32_t nsid,
				uint64_t slba, uint32_t nblocks)
{
	return tt__nvme_cmd_rw(sqe, TT_NVME_CMD_WRITE, nsid, slba, nblocks);
}

/**
 * tt_nvme_cmd_flush() - build an NVM Flush command
 * @sqe: entry to fill (cleared first)
 * @nsid: namespace, or 0xffffffff for all namespaces
 */
TT_INLINE void tt_nvme_cmd_flush(struct tt_nvme_sqe *sqe, uint32_t nsid)
{
	tt_nvme_sqe_clear(sqe);
	sqe->opcode = TT_NVME_CMD_FLUSH;
	sqe->nsid = nsid;
}

/**
 * tt_nvme_cmd_identify() - build an Identify command
 * @sqe: entry to fill (cleared first)
 * @cns: TT_NVME_IDENTIFY_CNS_* structure to return
 * @nsid: namespace, for namespace scoped structures
 * @cntid: controller identifier, for controller lists
 *
 * The 4 KiB result buffer is mapped afterwards like any other data.
 */
TT_INLINE void tt_nvme_cmd_identify(struct tt_nvme_sqe *sqe, uint8_t cns,
				    uint32_t nsid, uint16_t cntid)
{
	tt_nvme_sqe_clear(sqe);
	sqe->opcode = TT_NVME_ADMIN_IDENTIFY;
	sqe->nsid = nsid;
	sqe->cdw10 = (uint32_t)cns | ((uint32_t)cntid << 16);
}

/**
 * tt_nvme_cmd_get_log_page() - build a Get Log Page command
 * @sqe: entry to fill (cleared first)
 * @lid: TT_NVME_LOG_* log page identifier
 * @nsid: namespace, or 0xffffffff for the controller
 * @len: bytes to return, a non-zero multiple of 4
 * @offset: byte offset into the log page, a multiple of 4
 *
 * Return: 0, or -TT_EINVAL if @len or @offset is not dword granular.
 */
TT_INLINE int tt_nvme_cmd_get_log_page(struct tt_nvme_sqe *sqe, uint8_t lid,
				       uint32_t nsid, uint32_t len,
				       uint64_t offset)
{
	uint32_t numd;

	if (len == 0 || (len & 3) || (offset & 3))
		return -TT_EINVAL;
	numd = len / 4 - 1; /* 0's based dword count */
	tt_nvme_sqe_clear(sqe);
	sqe->opcode = TT_NVME_ADMIN_GET_LOG_PAGE;
	sqe->nsid = nsid;
	sqe->cdw10 = (uint32_t)lid | ((numd & 0xffff) << 16);
	sqe->cdw11 = numd >> 16;
	sqe->cdw12 = (uint32_t)offset;
	sqe->cdw13 = (uint32_t)(offset >> 32);
	return 0;
}

/**
 * tt_nvme_cmd_create_cq() - build a Create I/O Completion Queue command
 * @sqe: entry to fill (cleared first)
 * @qid: queue identifier, 1 or more
 * @qsize: number of entries, 2 to 65536
 * @bus: bus address of the physically contiguous, page aligned ring
 * @iv: interrupt vector
 * @ien: enable interrupts (false for polled queues)
 *
 * Return: 0, or -TT_EINVAL for the admin queue id or a bad size.
 */
TT_INLINE int tt_nvme_cmd_create_cq(struct tt_nvme_sqe *sqe, uint16_t qid,
				    uint32_t qsize, uint64_t bus, uint16_t iv,
				    bool ien)
{
	if (qid == 0 || qsize < 2 || qsize > 0x10000)
		return -TT_EINVAL;
	tt_nvme_sqe_clear(sqe);
	sqe->opcode = TT_NVME_ADMIN_CREATE_CQ;
	sqe->dptr.prp.prp1 = bus;
	sqe->cdw10 = ((qsize - 1) << 16) | qid;
	sqe->cdw11 = ((uint32_t)iv << 16) | ((ien ? 1u : 0u) << 1) | 1u; /* PC */
	return 0;
}

/**
 * tt_nvme_cmd_create_sq() - build a Create I/O Submission Queue command
 * @sqe: entry to fill (cleared first)
 * @qid: queue identifier, 1 or more
 * @qsize: number of entries, 2 to 65536
 * @bus: bus address of the physically contiguous, page aligned ring
 * @cqid: completion queue that receives this queue's completions
 * @qprio: queue priority for weighted round robin (0 urgent .. 3 low)
 *
 * Return: 0, or -TT_EINVAL for the admin queue id or a bad size.
 */
TT_INLINE int tt_nvme_cmd_create_sq(struct tt_nvme_sqe *sqe, uint16_t qid,
				    uint32_t qsize, uint64_t bus, uint16_t cqid,
				    uint8_t qprio)
{
	if (qid == 0 || cqid == 0 || qsize < 2 || qsize > 0x10000)
		return -TT_EINVAL;
	tt_nvme_sqe_clear(sqe);
	sqe->opcode = TT_NVME_ADMIN_CREATE_SQ;
	sqe->dptr.prp.prp1 = bus;
	sqe->cdw10 = ((qsize - 1) << 16) | qid;
	sqe->cdw11 = ((uint32_t)cqid << 16) | ((uint32_t)(qprio & 3) << 1) | 1u;
	return 0;
}

/**
 * tt_nvme_cmd_delete_sq() - build a Delete I/O Submission Queue command
 * @sqe: entry to fill (cleared first)
 * @qid: queue identifier
 */
TT_INLINE void tt_nvme_cmd_delete_sq(struct tt_nvme_sqe *sqe, uint16_t qid)
{
	tt_nvme_sqe_clear(sqe);
	sqe->opcode = TT_NVME_ADMIN_DELETE_SQ;
	sqe->cdw10 = qid;
}

/**
 * tt_nvme_cmd_delete_cq() - build a Delete I/O Completion Queue command
 * @sqe: entry to fill (cleared first)
 * @qid: queue identifier
 */
TT_INLINE void tt_nvme_cmd_delete_cq(struct tt_nvme_sqe *sqe, uint16_t qid)
{
	tt_nvme_sqe_clear(sqe);
	sqe->opcode = TT_NVME_ADMIN_DELETE_CQ;
	sqe->cdw10 = qid;
}

/**
 * tt_nvme_cmd_set_features() - build a Set Features command
 * @sqe: entry to fill (cleared first)
 * @fid: feature identifier
 * @cdw11: feature specific value
 * @save: make the value persist across resets
 */
TT_INLINE void tt_nvme_cmd_set_features(struct tt_nvme_sqe *sqe, uint8_t fid,
					uint32_t cdw11, bool save)
{
	tt_nvme_sqe_clear(sqe);
	sqe->opcode = TT_NVME_ADMIN_SET_FEATURES;
	sqe->cdw10 = (uint32_t)fid | ((save ? 1u : 0u) << 31);
	sqe->cdw11 = cdw11;
}

/**
 * tt_nvme_cqe_phase() - phase tag of a completion entry
 * @cqe: completion entry
 *
 * Return: 0 or 1.
 */
TT_INLINE uint8_t tt_nvme_cqe_phase(const struct tt_nvme_cqe *cqe)
{
	return (uint8_t)(cqe->status & TT_NVME_STATUS_PHASE);
}

/**
 * tt_nvme_cqe_status() - status of a completion entry, without the phase
 * @cqe: completion entry
 *
 * Return: status code type in bits 10:8 and status code in bits 7:0
 * (compare with TT_NVME_SC_*); 0 means success.
 */
TT_INLINE uint16_t tt_nvme_cqe_status(const struct tt_nvme_cqe *cqe)
{
	return (uint16_t)((cqe->status >> 1) & 0x7ff);
}

/**
 * tt_nvme_cqe_dnr() - whether the controller says not to retry
 * @cqe: completion entry
 *
 * Return: true if the Do Not Retry bit is set.
 */
TT_INLINE bool tt_nvme_cqe_dnr(const struct tt_nvme_cqe *cqe)
{
	return (cqe->status & TT_NVME_STATUS_DNR) != 0;
}

/**
 * tt_nvme_status_str() - name of a status code
 * @code: value from tt_nvme_cqe_status()
 *
 * Return: a static string; "Unknown status" for codes not listed here.
 */
TT_INLINE const char *tt_nvme_status_str(uint16_t code)
{
	switch (code) {
	case TT_NVME_SC_SUCCESS:            return "Successful Completion";
	case TT_NVME_SC_INVALID_OPCODE:     return "Invalid Command Opcode";
	case TT_NVME_SC_INVALID_FIELD:      return "Invalid Field in Command";
	case TT_NVME_SC_CMDID_CONFLICT:     return "Command ID Conflict";
	case TT_NVME_SC_DATA_XFER_ERROR:    return "Data Transfer Error";
	case TT_NVME_SC_POWER_LOSS:         return "Commands Aborted due to Power Loss Notification";
	case TT_NVME_SC_INTERNAL:           return "Internal Error";
	case TT_NVME_SC_ABORT_REQ:          return "Command Abort Requested";
	case TT_NVME_SC_ABORT_SQ_DELETED:   return "Command Aborted due to SQ Deletion";
	case TT_NVME_SC_INVALID_NS:         return "Invalid Namespace or Format";
	case TT_NVME_SC_CMD_SEQ_ERROR:      return "Command Sequence Error";
	case TT_NVME_SC_SGL_INVALID_SEG:    return "Invalid SGL Segment Descriptor";
	case TT_NVME_SC_SGL_INVALID_COUNT:  return "Invalid Number of SGL Descriptors";
	case TT_NVME_SC_SGL_INVALID_DATA:   return "Data SGL Length Invalid";
	case TT_NVME_SC_SGL_INVALID_TYPE:   return "SGL Descriptor Type Invalid";
	case TT_NVME_SC_PRP_INVALID_OFFSET: return "PRP Offset Invalid";
	case TT_NVME_SC_LBA_RANGE:          return "LBA Out of Range";
	case TT_NVME_SC_CAP_EXCEEDED:       return "Capacity Exceeded";
	case TT_NVME_SC_NS_NOT_READY:       return "Namespace Not Ready";
	case TT_NVME_SC_CQ_INVALID:         return "Completion Queue Invalid";
	case TT_NVME_SC_QID_INVALID:        return "Invalid Queue Identifier";
	case TT_NVME_SC_QUEUE_SIZE:         return "Invalid Queue Size";
	case TT_NVME_SC_WRITE_FAULT:        return "Write Fault";
	case TT_NVME_SC_READ_ERROR:         return "Unrecovered Read Error";
	case TT_NVME_SC_ACCESS_DENIED:      return "Access Denied";
	default:                            return "Unknown status";
	}
}

#endif /* TUTTI_NVME_H */
