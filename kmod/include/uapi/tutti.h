/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR Apache-2.0 */
/*
 * tutti.ko user interface: NVMe queue pairs for user space.
 *
 * The module binds to NVMe controllers handed to it through sysfs
 * driver_override and creates one character device per controller
 * (/dev/tuttiN) and one per active namespace (/dev/tuttiNnM).  A process
 * opens a node and, through the ioctls below, creates I/O queue pairs whose
 * rings it maps into its address space, maps the doorbells, and pins its
 * buffers to learn their bus addresses.  It then builds NVMe commands
 * itself.  Everything a file created is torn down when it is released.
 *
 * Every argument structure starts with @argsz, which must equal the
 * structure's size (-EINVAL otherwise): a caller built against another
 * version of this header is refused instead of misread.  Reserved fields
 * must be zero.
 *
 * Namespace nodes also implement read(2)/write(2)/pread/pwrite at byte
 * offsets that are multiples of the logical block size (the module's own
 * polled I/O queue, for metadata), lseek(SEEK_END) (namespace size) and
 * fsync(2) (NVMe Flush).
 */
#ifndef _UAPI_LINUX_TUTTI_H
#define _UAPI_LINUX_TUTTI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define TUTTI_IOC_MAGIC		0xB7

/* struct tutti_info.flags */
#define TUTTI_INFO_NS		(1u << 0)	/* the node is a namespace node */
#define TUTTI_INFO_CMB		(1u << 1)	/* the controller has a usable CMB */
#define TUTTI_INFO_CMB_SQS	(1u << 2)	/* ... that can hold SQs */
#define TUTTI_INFO_CMB_DATA	(1u << 3)	/* ... and read/write data */
#define TUTTI_INFO_NV_P2P	(1u << 4)	/* built with GPU memory (nvidia-p2p) */

/**
 * struct tutti_info - what a node is (TUTTI_IOC_INFO, all out but @argsz)
 * @cap: CAP register
 * @vs: VS register
 * @mdts_bytes: largest transfer in bytes, 0 for no limit
 * @sgls: Identify Controller SGLS
 * @page_size: memory page size programmed in CC.MPS
 * @max_qid: highest I/O queue id the controller granted
 * @mqes: largest queue depth (entries)
 * @dstrd: doorbell stride (CAP.DSTRD)
 * @db_bytes: length of the doorbell mapping (TUTTI_MMAP_DB)
 * @nsid: namespace of this node, 0 on a controller node
 * @lba_shift: log2 of the namespace's logical block size
 * @nsze: namespace size in logical blocks
 * @cmb_bus: bus address of the controller memory buffer, 0 if none
 * @cmb_bytes: its size
 * @vid, @ssvid, @sn, @mn, @fr: from Identify Controller
 * @bdf: PCI address, NUL terminated
 */
struct tutti_info {
	__u32 argsz;
	__u32 flags;
	__u32 instance;
	__u32 nsid;
	__u64 cap;
	__u32 vs;
	__u32 mdts_bytes;
	__u32 sgls;
	__u32 page_size;
	__u32 max_qid;
	__u32 mqes;
	__u32 dstrd;
	__u32 db_bytes;
	__u32 lba_shift;
	__u32 nn;
	__u64 nsze;
	__u64 cmb_bus;
	__u64 cmb_bytes;
	__u16 vid;
	__u16 ssvid;
	__u8 sn[20];
	__u8 mn[40];
	__u8 fr[8];
	char bdf[16];
	__u32 reserved[4];
};

/* struct tutti_queue_create.flags */
#define TUTTI_QUEUE_SQ_PEER	(1u << 0)	/* SQ in another node's CMB */
#define TUTTI_QUEUE_SQ_GPU	(1u << 1)	/* SQ in a TUTTI_IOC_P2P_MAP range */
#define TUTTI_QUEUE_CQ_GPU	(1u << 2)	/* CQ in a TUTTI_IOC_P2P_MAP range */

/**
 * struct tutti_queue_create - TUTTI_IOC_QUEUE_CREATE
 * @flags: TUTTI_QUEUE_*; SQ_PEER excludes SQ_GPU and CQ_GPU
 * @depth: entries per ring, 2 to tutti_info.mqes
 * @peer_fd: with TUTTI_QUEUE_SQ_PEER, an open tutti node of the controller
 *           whose CMB holds the SQ (it may be this controller); with
 *           TUTTI_QUEUE_SQ_GPU or _CQ_GPU, the handle of a GPU range this
 *           file mapped with TUTTI_IOC_P2P_MAP (not a descriptor)
 * @peer_off: offset of the SQ in that CMB or GPU range, page aligned
 *           (0 unless SQ_PEER or SQ_GPU)
 * @qid: out, the queue id (SQ and CQ share it)
 * @sq_db, @cq_db: out, byte offsets of the doorbells in TUTTI_MMAP_DB
 * @cq_page: with TUTTI_QUEUE_CQ_GPU, the CQ's offset in the GPU range in
 *           pages (PAGE_SIZE); must be 0 otherwise.  A ring in GPU memory
 *           must lie on bus-contiguous pages and not overlap the other ring;
 *           the module cannot write GPU memory, so the owner zeroes a CQ
 *           there before creating the queue (phase tags start at 0).
 * @sq_mmap_off, @cq_mmap_off: out, mmap offsets of the rings in this file
 *           (a ring in a peer CMB or in GPU memory is not mapped through
 *           this file: the CMB through the peer's TUTTI_MMAP_CMB, GPU
 *           memory by its owner; the offset is then 0)
 * @sq_bytes, @cq_bytes: out, ring sizes (page multiples)
 * @sq_bus: out, bus address of the SQ ring
 */
struct tutti_queue_create {
	__u32 argsz;
	__u32 flags;
	__u32 depth;
	__s32 peer_fd;
	__u64 peer_off;
	__u32 qid;
	__u32 sq_db;
	__u32 cq_db;
	__u32 cq_page;
	__u64 sq_mmap_off;
	__u64 cq_mmap_off;
	__u64 sq_bytes;
	__u64 cq_bytes;
	__u64 sq_bus;
};

/** struct tutti_queue_delete - TUTTI_IOC_QUEUE_DELETE: @qid of this file */
struct tutti_queue_delete {
	__u32 argsz;
	__u32 qid;
};

/**
 * struct tutti_dma_map - TUTTI_IOC_DMA_MAP: pin and map user memory
 * @vaddr: start, page aligned
 * @len: length, a non-zero page multiple, at most TUTTI_DMA_MAX_BYTES
 * @bus: user pointer to an array of @bus_cap __u64: out, the bus address
 *       of each page of the area, in order
 * @bus_cap: entries in @bus, at least @len / page size
 * @handle: out, for TUTTI_IOC_DMA_UNMAP
 *
 * Pages are pinned long term and count against RLIMIT_MEMLOCK.
 */
struct tutti_dma_map {
	__u32 argsz;
	__u32 flags;
	__u64 vaddr;
	__u64 len;
	__u64 bus;
	__u32 bus_cap;
	__u32 handle;
};

#define TUTTI_DMA_MAX_BYTES	(4ull << 30)

/** struct tutti_dma_unmap - TUTTI_IOC_DMA_UNMAP: drop mapping @handle */
struct tutti_dma_unmap {
	__u32 argsz;
	__u32 handle;
};

/**
 * struct tutti_p2p_map - TUTTI_IOC_P2P_MAP: pin and map GPU memory
 * @flags: must be 0
 * @vaddr: GPU virtual address of the range (a CUDA device pointer of the
 *         calling process), aligned to TUTTI_P2P_GPU_PAGE (64 KiB)
 * @len: length, a non-zero multiple of TUTTI_P2P_GPU_PAGE, at most
 *       TUTTI_P2P_MAX_BYTES
 * @bus: user pointer to an array of @bus_cap __u64: out, the bus address
 *       of each page (PAGE_SIZE, as for TUTTI_IOC_DMA_MAP) of the range
 * @bus_cap: entries in @bus, at least @len / PAGE_SIZE
 * @handle: out, for TUTTI_IOC_P2P_UNMAP and TUTTI_QUEUE_SQ_GPU/_CQ_GPU
 *
 * Same layout as struct tutti_dma_map: the address list feeds the same
 * PRP/SGL builders.  Only in a module built with NVIDIA's nv-p2p.h
 * (tutti_info.flags & TUTTI_INFO_NV_P2P); otherwise -EOPNOTSUPP after the
 * arguments were checked.  When the GPU driver frees the memory (cudaFree,
 * exit of the CUDA context) every queue of this file is deleted on the
 * controller before the memory goes: see docs/kmod.md.
 */
struct tutti_p2p_map {
	__u32 argsz;
	__u32 flags;
	__u64 vaddr;
	__u64 len;
	__u64 bus;
	__u32 bus_cap;
	__u32 handle;
};

#define TUTTI_P2P_GPU_PAGE	(64ull << 10)
#define TUTTI_P2P_MAX_BYTES	(64ull << 30)

/**
 * struct tutti_p2p_unmap - TUTTI_IOC_P2P_UNMAP: drop GPU mapping @handle
 * (-EBUSY while a queue of this file has a ring in it)
 */
struct tutti_p2p_unmap {
	__u32 argsz;
	__u32 handle;
};

/**
 * struct tutti_admin - TUTTI_IOC_ADMIN: a read-only admin command
 * @opcode: 0x06 Identify or 0x02 Get Log Page (others: -EINVAL)
 * @nsid: namespace field
 * @cdw10..@cdw14: command dwords (Identify: CNS 0, 1, 2 only;
 *        Get Log Page: error, SMART / health, firmware slot logs)
 * @data: user buffer receiving the data
 * @data_len: its size: 4096 for Identify, 4..4096 (dword multiple) for logs
 * @result: out, completion DW0
 * @status: out, completion status field (0 = success)
 */
struct tutti_admin {
	__u32 argsz;
	__u8 opcode;
	__u8 rsvd[3];
	__u32 nsid;
	__u32 cdw10;
	__u32 cdw11;
	__u32 cdw12;
	__u32 cdw13;
	__u32 cdw14;
	__u64 data;
	__u32 data_len;
	__u32 result;
	__u32 status;
	__u32 reserved;
};

/* struct tutti_extents.flags */
#define TUTTI_EXTENTS_VALID	(1u << 0)	/* a Tutti superblock was found */

/**
 * struct tutti_extents - TUTTI_IOC_EXTENTS: the store's regions on a
 * namespace node, read from the Tutti superblock (copy A, else B)
 */
struct tutti_extents {
	__u32 argsz;
	__u32 flags;
	__u8 uuid[16];
	__u32 member_index;
	__u32 n_members;
	__u64 table_off;
	__u64 table_bytes;
	__u64 data_off;
	__u64 member_bytes;
};

#define TUTTI_IOC_INFO		_IOWR(TUTTI_IOC_MAGIC, 0x00, struct tutti_info)
#define TUTTI_IOC_QUEUE_CREATE	_IOWR(TUTTI_IOC_MAGIC, 0x01, struct tutti_queue_create)
#define TUTTI_IOC_QUEUE_DELETE	_IOW(TUTTI_IOC_MAGIC, 0x02, struct tutti_queue_delete)
#define TUTTI_IOC_DMA_MAP	_IOWR(TUTTI_IOC_MAGIC, 0x03, struct tutti_dma_map)
#define TUTTI_IOC_DMA_UNMAP	_IOW(TUTTI_IOC_MAGIC, 0x04, struct tutti_dma_unmap)
#define TUTTI_IOC_ADMIN		_IOWR(TUTTI_IOC_MAGIC, 0x05, struct tutti_admin)
#define TUTTI_IOC_EXTENTS	_IOWR(TUTTI_IOC_MAGIC, 0x06, struct tutti_extents)
#define TUTTI_IOC_P2P_MAP	_IOWR(TUTTI_IOC_MAGIC, 0x07, struct tutti_p2p_map)
#define TUTTI_IOC_P2P_UNMAP	_IOW(TUTTI_IOC_MAGIC, 0x08, struct tutti_p2p_unmap)

/*
 * mmap offsets.  The doorbell page(s) of BAR0 (uncached), the rings of a
 * queue this file created (TUTTI_MMAP_SQ/CQ(qid), as returned by
 * TUTTI_IOC_QUEUE_CREATE), and the controller's CMB (uncached, the whole
 * CMB or a prefix of it).
 */
#define TUTTI_MMAP_DB		0x0ull
#define TUTTI_MMAP_SQ(qid)	((1ull << 40) | ((__u64)(qid) << 24))
#define TUTTI_MMAP_CQ(qid)	((2ull << 40) | ((__u64)(qid) << 24))
#define TUTTI_MMAP_CMB		(3ull << 40)
#define TUTTI_MMAP_TYPE(off)	((off) >> 40)
#define TUTTI_MMAP_QID(off)	(((off) >> 24) & 0xffff)

#endif /* _UAPI_LINUX_TUTTI_H */
