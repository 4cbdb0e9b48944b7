// SPDX-License-Identifier: Apache-2.0
/*
 * Description: tutti.ko + kqueue engine against QEMU's emulated NVMe, run
 * inside the HIL guest: identify, SMART, SGL/PRP, MDTS, CMB peer memory,
 * malformed commands and SIGKILLed queue owners.  One subcommand per test
 * group (see main()); every check prints an "ok"/"not ok" line.  A store on
 * the kqueue engine: kq_store.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tutti/engine.h"
#include "tutti/error.h"
#include "tutti/kqueue.h"
#include "tutti/nvme_sgl.h"
#include "tutti/store.h"
#include "../../kmod/include/uapi/tutti.h"
#include "hil.h"

#define MiB (1ul << 20)
#define TMO 30000u
/* Scratch LBAs used by the raw tests: far from a store's metadata. */
#define SCRATCH_OFF (128 * MiB)

static int open_node(const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		bail("open %s: %s", path, strerror(errno));
	return fd;
}

/* A pinned buffer with its page bus addresses. */
struct dbuf {
	uint8_t *p;
	size_t len;
	uint64_t *bus;
	uint32_t handle;
};

static void dbuf_init(int fd, struct dbuf *b, size_t len)
{
	b->p = hil_pages(len);
	b->len = len;
	b->bus = calloc(len / 4096, sizeof(*b->bus));
	if (tt_kdma_map(fd, b->p, len, b->bus, &b->handle))
		bail("dma map: %s", tt_errmsg());
}

/* Segments for [off, off+len) of @b (one per page, merged when contiguous). */
static unsigned dbuf_segs(const struct dbuf *b, size_t off, size_t len,
			  struct tt_dma_seg *segs, int reverse_pages)
{
	unsigned n = 0;

	(void)reverse_pages;
	while (len) {
		size_t pg = off / 4096, in = off % 4096;
		uint32_t chunk = (uint32_t)(4096 - in < len ? 4096 - in : len);
		uint64_t bus = b->bus[pg] + in;

		if (n && segs[n - 1].addr + segs[n - 1].len == bus) {
			segs[n - 1].len += chunk;
		} else {
			segs[n].addr = bus;
			segs[n].len = chunk;
			n++;
		}
		off += chunk;
		len -= chunk;
	}
	return n;
}

struct rig {
	int fd;
	struct tt_kinfo info;
	struct tt_kqp *q;
	struct dbuf list;
};

static void rig_init(struct rig *r, const char *node)
{
	r->fd = open_node(node);
	if (tt_kdev_info(r->fd, &r->info))
		bail("%s: not a tutti node", node);
	if (tt_kqp_create(r->fd, 64, -1, 0, NULL, &r->q))
		bail("queue: %s", tt_errmsg());
	dbuf_init(r->fd, &r->list, 16 * 4096);
}

/* One Read/Write of @len bytes at byte @off; map as SGL (sgl=1) or PRP. */
static int rig_rw(struct rig *r, int write, uint64_t off, struct tt_dma_seg *segs,
		  unsigned nsegs, int sgl, uint32_t mdts, uint8_t *psdt)
{
	struct tt_nvme_list list = { r->list.p, r->list.bus, 16, 4096 };
	uint32_t len = 0, shift = r->info.lba_shift;
	struct tt_nvme_sqe sqe;
	struct tt_nvme_cqe cqe;
	int ret;

	for (unsigned i = 0; i < nsegs; i++)
		len += segs[i].len;
	if (write)
		tt_nvme_cmd_write(&sqe, r->info.nsid, off >> shift, len >> shift);
	else
		tt_nvme_cmd_read(&sqe, r->info.nsid, off >> shift, len >> shift);
	ret = sgl ? tt_nvme_map_sgl(&sqe, segs, nsegs, mdts, &list)
		  : tt_nvme_map_prpv(&sqe, segs, nsegs, 4096, mdts, &list);
	if (ret)
		return ret;
	if (psdt)
		*psdt = sqe.flags & TT_NVME_FLAG_PSDT_MASK;
	ret = tt_kqp_exec(r->q, &sqe, &cqe, TMO);
	if (ret)
		return ret;
	return tt_nvme_cqe_status(&cqe);
}

static int t_identify(const char *ctrl_node, const char *ns_node)
{
	struct tt_kinfo info, ninfo;
	uint8_t *id = hil_pages(4096);
	int fd = open_node(ctrl_node), nfd = open_node(ns_node);
	uint16_t status = 1;
	char sn[21], mn[41];
	long vid, ssvid;
	int ret;

	check(!tt_kdev_info(fd, &info), "INFO ioctl on %s", ctrl_node);
	check(!(info.flags & TT_KINFO_NS), "controller node is not a namespace node");
	check(!tt_kdev_info(nfd, &ninfo) && (ninfo.flags & TT_KINFO_NS) && ninfo.nsid == 1,
	      "%s is namespace 1", ns_node);
	ret = tt_kdev_admin(fd, 0x06, 0, 1, id, 4096, &status);
	check(!ret && status == 0, "Identify Controller passthrough (status %#x)", status);
	vid = sysfs_long(info.bdf, "vendor");
	ssvid = sysfs_long(info.bdf, "subsystem_vendor");
	check((id[0] | id[1] << 8) == vid && info.vid == vid,
	      "Identify VID %#x = PCI vendor %#lx of %s", id[0] | id[1] << 8, vid, info.bdf);
	check((id[2] | id[3] << 8) == ssvid, "Identify SSVID %#x = PCI subsystem vendor %#lx",
	      id[2] | id[3] << 8, ssvid);
	memcpy(mn, id + 24, 40);
	mn[40] = 0;
	for (int i = 39; i >= 0 && mn[i] == ' '; i--)
		mn[i] = 0;
	check(!strcmp(mn, "QEMU NVMe Ctrl") && !strcmp(info.mn, mn),
	      "model number '%s' is QEMU's", mn);
	memcpy(sn, id + 4, 20);
	sn[20] = 0;
	for (int i = 19; i >= 0 && sn[i] == ' '; i--)
		sn[i] = 0;
	check(sn[0] && !strcmp(sn, info.sn), "serial '%s' (INFO agrees)", sn);
	if (getenv("TUTTI_EXPECT_SERIAL"))
		check(!strcmp(sn, getenv("TUTTI_EXPECT_SERIAL")), "serial is QEMU's serial= '%s'",
		      getenv("TUTTI_EXPECT_SERIAL"));
	check(info.mdts_bytes == (id[77] ? 4096u << id[77] : 0),
	      "MDTS %u bytes from Identify byte 77 (%u)", info.mdts_bytes, id[77]);
	check((info.sgls & 3) == (id[536] & 3), "SGLS %#x", info.sgls);
	check(!tt_kdev_admin(fd, 0x06, 1, 0, id, 4096, &status) && status == 0 &&
	      (id[0] | (uint64_t)id[1] << 8 | (uint64_t)id[2] << 16 | (uint64_t)id[3] << 24) ==
	      ninfo.nsze, "Identify Namespace 1: NSZE %llu blocks",
	      (unsigned long long)ninfo.nsze);
	printf("# %s: %s sn=%s mn=%s fr=%s mdts=%u sgls=%#x qids=%u cmb=%llu\n", ctrl_node,
	       info.bdf, info.sn, info.mn, info.fr, info.mdts_bytes, info.sgls, info.max_qid,
	       (unsigned long long)info.cmb_bytes);
	close(fd);
	close(nfd);
	return 0;
}

static int t_smart(const char *node)
{
	uint8_t *log = hil_pages(4096);
	int fd = open_node(node);
	uint16_t status = 1;
	unsigned temp;

	int ret = tt_kdev_admin(fd, 0x02, 0xffffffff, 2, log, 512, &status);

	check(!ret && status == 0, "SMART / health log passthrough (status %#x)", status);
	temp = log[1] | log[2] << 8;
	check(temp > 200 && temp < 400, "composite temperature %u K is plausible", temp);
	check(!tt_kdev_admin(fd, 0x02, 0xffffffff, 1, log, 64, &status) && status == 0,
	      "error log passthrough");
	close(fd);
	return 0;
}

/* SGL and PRP transfers of the same data give identical bytes. */
static int t_sglprp(const char *node)
{
	const size_t len = 256 * 1024;
	struct tt_dma_seg segs[80];
	struct dbuf w, rs, rp, scat;
	uint8_t psdt = 0xff;
	struct rig r;
	unsigned n;
	int st;

	rig_init(&r, node);
	dbuf_init(r.fd, &w, len);
	dbuf_init(r.fd, &rs, len + 4096);
	dbuf_init(r.fd, &rp, len);
	dbuf_init(r.fd, &scat, 2 * len);
	check(tt_nvme_sgl_supported(r.info.sgls), "controller supports SGLs (SGLS %#x)",
	      r.info.sgls);

	fill(w.p, len, 1);
	n = dbuf_segs(&w, 0, len, segs, 0);
	st = rig_rw(&r, 1, SCRATCH_OFF, segs, n, 1, 0, &psdt);
	check(st == 0 && psdt == TT_NVME_FLAG_PSDT_SGL, "write 256 KiB with SGL (PSDT %#x)", psdt);
	n = dbuf_segs(&rp, 0, len, segs, 0);
	st = rig_rw(&r, 0, SCRATCH_OFF, segs, n, 0, 0, &psdt);
	check(st == 0 && psdt == TT_NVME_FLAG_PSDT_PRP, "read it back with PRP (PSDT %#x)", psdt);
	check(!memcmp(rp.p, w.p, len), "SGL write, PRP read: identical bytes");
	n = dbuf_segs(&rs, 0, len, segs, 0);
	check(rig_rw(&r, 0, SCRATCH_OFF, segs, n, 1, 0, NULL) == 0 && !memcmp(rs.p, w.p, len),
	      "SGL read: identical bytes");

	fill(w.p, len, 2);
	n = dbuf_segs(&w, 0, len, segs, 0);
	check(rig_rw(&r, 1, SCRATCH_OFF, segs, n, 0, 0, NULL) == 0, "write 256 KiB with PRP");
	memset(rs.p, 0, len + 4096);
	memset(rp.p, 0, len);
	n = dbuf_segs(&rs, 0, len, segs, 0);
	check(rig_rw(&r, 0, SCRATCH_OFF, segs, n, 1, 0, NULL) == 0 && !memcmp(rs.p, w.p, len),
	      "PRP write, SGL read: identical bytes");
	/* Byte-unaligned destination: SGL only (PRP needs dword alignment). */
	n = dbuf_segs(&rs, 3, len, segs, 0);
	check(rig_rw(&r, 0, SCRATCH_OFF, segs, n, 1, 0, NULL) == 0 && !memcmp(rs.p + 3, w.p, len),
	      "SGL read into a buffer at byte offset 3: identical bytes");
	check(rig_rw(&r, 0, SCRATCH_OFF, segs, n, 0, 0, NULL) == -TT_EINVAL,
	      "PRP refuses the byte-unaligned buffer (mapping layer)");
	/* Scattered pages: every other page, so nothing merges. */
	n = 0;
	for (size_t pg = 0; pg < len / 4096; pg++) {
		segs[n].addr = scat.bus[2 * pg];
		segs[n].len = 4096;
		n++;
	}
	check(rig_rw(&r, 0, SCRATCH_OFF, segs, n, 1, 0, NULL) == 0, "SGL read into 64 scattered pages (segment list)");
	{
		int same = 1;

		for (size_t pg = 0; pg < len / 4096; pg++)
			same &= !memcmp(scat.p + 2 * pg * 4096, w.p + pg * 4096, 4096);
		check(same, "scattered SGL read: identical bytes");
		memset(scat.p, 0, 2 * len);
		check(rig_rw(&r, 0, SCRATCH_OFF, segs, n, 0, 0, NULL) == 0, "PRP list read into the same scattered pages");
		same = 1;
		for (size_t pg = 0; pg < len / 4096; pg++)
			same &= !memcmp(scat.p + 2 * pg * 4096, w.p + pg * 4096, 4096);
		check(same, "scattered PRP read: identical bytes");
	}
	tt_kqp_destroy(r.q);
	close(r.fd);
	return 0;
}

/* Open an engine over @nodes and move @len bytes at @off both ways. */
static int engine_roundtrip(const char *name, int *fds, unsigned n, size_t len, uint64_t off,
			    int reg, uint64_t seed, uint8_t *want_out)
{
	struct tt_engine *e;
	uint8_t *w = hil_pages(len + 8192), *rb = hil_pages(len + 8192);
	struct tt_io io[2];
	struct tt_batch b = { 0 };
	int ok;

	if (tt_engine_open(name, fds, n, NULL, &e))
		bail("engine %s: %s", name, tt_errmsg());
	check(!strcmp(tt_engine_name(e), "kqueue"), "engine '%s' resolves to kqueue", name);
	if (reg)
		check(!tt_engine_register(e, w, len + 8192) && !tt_engine_register(e, rb, len + 8192),
		      "register buffers");
	fill(w + 512, len, seed);
	io[0] = (struct tt_io){ .buf = w + 512, .off = off, .len = (uint32_t)len, .op = TT_OP_WRITE };
	b.ios = io;
	b.n = 1;
	ok = !tt_engine_submit(e, &b) && !tt_engine_wait(e, &b) && io[0].res == 0;
	check(ok, "write %zu bytes in one request (%s memory, unaligned by 512)", len,
	      reg ? "registered" : "bounced");
	check(!tt_engine_flush(e), "flush");
	io[0] = (struct tt_io){ .buf = rb + 4096, .off = off, .len = (uint32_t)len, .op = TT_OP_READ };
	ok = !tt_engine_submit(e, &b) && !tt_engine_wait(e, &b) && io[0].res == 0;
	check(ok && !memcmp(rb + 4096, w + 512, len), "read it back: identical bytes");
	if (want_out)
		memcpy(want_out, w + 512, len);
	tt_engine_close(e);
	munmap(w, len + 8192);
	munmap(rb, len + 8192);
	return 0;
}

/* Commands above MDTS: the controller refuses one, the engine splits. */
static int t_mdts(const char *node)
{
	struct tt_dma_seg segs[1];
	struct dbuf big;
	struct rig r;
	size_t len;
	uint8_t *want, *got;
	int st;

	rig_init(&r, node);
	if (!r.info.mdts_bytes)
		bail("controller has no MDTS: nothing to split");
	len = 2 * (size_t)r.info.mdts_bytes;
	dbuf_init(r.fd, &big, len);
	segs[0].addr = big.bus[0];
	segs[0].len = (uint32_t)len;
	for (size_t pg = 1; pg < len / 4096; pg++)
		if (big.bus[pg] != big.bus[0] + pg * 4096)
			segs[0].len = 0;
	if (segs[0].len) {
		st = rig_rw(&r, 0, SCRATCH_OFF, segs, 1, 1, 0, NULL);
		check(st > 0, "one %zu KiB command (2 x MDTS) is refused by the controller (status %#x)",
		      len >> 10, st);
	} else {
		printf("# buffer not physically contiguous: raw MDTS probe skipped\n");
	}
	tt_kqp_destroy(r.q);
	/* 3 x MDTS + 8 KiB in one request, through the engine. */
	len = 3 * (size_t)r.info.mdts_bytes + 8192;
	want = hil_pages(len);
	got = hil_pages(len);
	engine_roundtrip("kqueue", &r.fd, 1, len, SCRATCH_OFF + 4 * MiB, 1, 7, want);
	engine_roundtrip("kqueue", &r.fd, 1, len, SCRATCH_OFF + 8 * MiB, 0, 8, NULL);
	/* The kernel path (module's own queue, PRP) sees the same bytes at the same LBAs. */
	check(pread(r.fd, got, len, (off_t)(SCRATCH_OFF + 4 * MiB)) == (ssize_t)len &&
	      !memcmp(got, want, len), "pread on the node (module's queue) sees the split write");
	close(r.fd);
	return 0;
}

/* Peer memory: A's SQ and A's read data in B's CMB. */
static int t_cmb(const char *ns_a, const char *ctrl_b)
{
	const size_t len = 128 * 1024;
	struct tt_dma_seg segs[40];
	struct tt_kinfo bi;
	struct dbuf w, host;
	struct tt_kqp *pq;
	uint8_t *cmb, *tmp;
	struct rig r;
	int fb = open_node(ctrl_b);
	unsigned n;
	int ret = tt_kdev_info(fb, &bi);

	check(!ret && (bi.flags & TT_KINFO_CMB) && (bi.flags & TT_KINFO_CMB_SQS),
	      "%s has a CMB that can hold SQs (%llu MiB at bus %#llx)", ctrl_b,
	      (unsigned long long)(bi.cmb_bytes >> 20), (unsigned long long)bi.cmb_bus);
	cmb = tt_kdev_map_cmb(fb, 4 * MiB);
	check(cmb != NULL, "map the CMB into the process");
	if (!cmb)
		return 1;
	rig_init(&r, ns_a);
	ret = tt_kqp_create(r.fd, 64, fb, 0, cmb, &pq);
	check(!ret && pq->sq_bus == bi.cmb_bus,
	      "SQ of %s placed in %s's CMB (bus %#llx)", ns_a, ctrl_b,
	      (unsigned long long)bi.cmb_bus);
	tt_kqp_destroy(r.q);
	r.q = pq;
	dbuf_init(r.fd, &w, len);
	dbuf_init(r.fd, &host, len);
	fill(w.p, len, 3);
	n = dbuf_segs(&w, 0, len, segs, 0);
	check(rig_rw(&r, 1, SCRATCH_OFF + 16 * MiB, segs, n, 0, 0, NULL) == 0,
	      "write through the SQ in peer memory");
	n = dbuf_segs(&host, 0, len, segs, 0);
	check(rig_rw(&r, 0, SCRATCH_OFF + 16 * MiB, segs, n, 0, 0, NULL) == 0 &&
	      !memcmp(host.p, w.p, len), "read into host memory: identical bytes");
	tmp = hil_pages(len);
	segs[0].addr = bi.cmb_bus + 1 * MiB;
	segs[0].len = (uint32_t)len;
	check(rig_rw(&r, 0, SCRATCH_OFF + 16 * MiB, segs, 1, 0, 0, NULL) == 0,
	      "read DMA'd peer-to-peer into the CMB (PRP list)");
	memcpy(tmp, cmb + 1 * MiB, len);
	check(!memcmp(tmp, host.p, len), "CMB bytes (PRP) = host-memory bytes");
	segs[0].addr = bi.cmb_bus + 2 * MiB + 5;
	check(rig_rw(&r, 0, SCRATCH_OFF + 16 * MiB, segs, 1, 1, 0, NULL) == 0,
	      "read DMA'd into the CMB at a byte-unaligned address (SGL)");
	memcpy(tmp, cmb + 2 * MiB + 5, len);
	check(!memcmp(tmp, host.p, len), "CMB bytes (SGL) = host-memory bytes");
	/* And back: write from the CMB to another LBA range. */
	segs[0].addr = bi.cmb_bus + 1 * MiB;
	memset(host.p, 0, len);
	check(rig_rw(&r, 1, SCRATCH_OFF + 20 * MiB, segs, 1, 1, 0, NULL) == 0,
	      "write from the CMB to disk");
	n = dbuf_segs(&host, 0, len, segs, 0);
	check(rig_rw(&r, 0, SCRATCH_OFF + 20 * MiB, segs, n, 1, 0, NULL) == 0 &&
	      !memcmp(host.p, w.p, len), "bytes written from the CMB read back identical");
	tt_kqp_destroy(r.q);
	munmap(cmb, 4 * MiB);
	close(r.fd);
	close(fb);
	return 0;
}

static int t_malformed(const char *node)
{
	int fd = open_node(node), e;
	struct tt_kinfo info;
	void *buf = hil_pages(2 * 4096), *db;
	uint64_t bus[4];
	uint8_t blk[4096];

	tt_kdev_info(fd, &info);
	{
		struct tutti_info i = { .argsz = sizeof(i) - 4 };

		check(xioctl(fd, TUTTI_IOC_INFO, &i) == EINVAL, "INFO with a wrong argsz: EINVAL");
		check(xioctl(fd, TUTTI_IOC_INFO, (void *)8) == EFAULT, "INFO with a bad pointer: EFAULT");
	}
	{
		struct tutti_queue_create q = { .argsz = sizeof(q), .depth = 1 };

		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "queue depth 1: EINVAL");
		q.depth = info.mqes + 1;
		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "queue depth MQES+1: EINVAL");
		q.depth = 16;
		q.flags = 0x80;
		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "unknown queue flag: EINVAL");
		q.flags = TUTTI_QUEUE_SQ_PEER;
		q.peer_fd = -1;
		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "peer SQ on fd -1: EINVAL");
		q.peer_fd = 0;
		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "peer SQ on a non-tutti fd: EINVAL");
		q.peer_fd = fd;
		q.peer_off = 100;
		e = xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q);
		check(e == EINVAL, "peer SQ at an unaligned CMB offset: EINVAL (%d)", e);
		q.peer_off = 1ull << 40;
		e = xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q);
		check(e == EINVAL, "peer SQ beyond the CMB: EINVAL (%d)", e);
		q.flags = 0;
		q.peer_fd = 0;
		q.peer_off = 0;
		q.cq_page = 1;
		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "cq_page set without a GPU CQ: EINVAL");
	}
	{
		struct tutti_queue_delete d = { .argsz = sizeof(d), .qid = 0 };

		check(xioctl(fd, TUTTI_IOC_QUEUE_DELETE, &d) == EINVAL, "delete the admin queue: EINVAL");
		d.qid = 1;
		check(xioctl(fd, TUTTI_IOC_QUEUE_DELETE, &d) == EINVAL, "delete the module's queue: EINVAL");
		d.qid = 65535;
		check(xioctl(fd, TUTTI_IOC_QUEUE_DELETE, &d) == EINVAL, "delete qid 65535: EINVAL");
	}
	{
		struct tutti_dma_map m = { .argsz = sizeof(m), .vaddr = (uintptr_t)buf + 8, .len = 4096,
					   .bus = (uintptr_t)bus, .bus_cap = 4 };

		check(xioctl(fd, TUTTI_IOC_DMA_MAP, &m) == EINVAL, "DMA map of an unaligned buffer: EINVAL");
		m.vaddr = (uintptr_t)buf;
		m.len = 100;
		check(xioctl(fd, TUTTI_IOC_DMA_MAP, &m) == EINVAL, "DMA map of 100 bytes: EINVAL");
		m.len = 0;
		check(xioctl(fd, TUTTI_IOC_DMA_MAP, &m) == EINVAL, "DMA map of 0 bytes: EINVAL");
		m.len = 8 * 4096;
		check(xioctl(fd, TUTTI_IOC_DMA_MAP, &m) == EINVAL, "bus list too short: EINVAL");
		m.len = 4096;
		m.bus = 8;
		check(xioctl(fd, TUTTI_IOC_DMA_MAP, &m) == EFAULT, "unwritable bus list: EFAULT");
		m.bus = (uintptr_t)bus;
		m.vaddr = 0x1000;
		check(xioctl(fd, TUTTI_IOC_DMA_MAP, &m) == EFAULT, "DMA map of unmapped memory: EFAULT");
		m.vaddr = (uintptr_t)-4096 & ~0xfffull;
		check(xioctl(fd, TUTTI_IOC_DMA_MAP, &m) == EINVAL, "DMA map of a kernel address: EINVAL");
		db = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, TUTTI_MMAP_DB);
		m.vaddr = (uintptr_t)db;
		e = xioctl(fd, TUTTI_IOC_DMA_MAP, &m);
		check(db != MAP_FAILED && e == EFAULT, "DMA map of the doorbell page (foreign, I/O memory): EFAULT (%d)", e);
		munmap(db, 4096);
		m.vaddr = (uintptr_t)blk;	/* the stack: fine if aligned; use a read-only map */
		db = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		m.vaddr = (uintptr_t)db;
		check(xioctl(fd, TUTTI_IOC_DMA_MAP, &m) == EFAULT, "DMA map of read-only memory: EFAULT");
		munmap(db, 4096);
	}
	{
		struct tutti_dma_unmap u = { .argsz = sizeof(u), .handle = 12345 };

		check(xioctl(fd, TUTTI_IOC_DMA_UNMAP, &u) == EINVAL, "unmap an unknown handle: EINVAL");
	}
	{
		struct tutti_admin a = { .argsz = sizeof(a), .opcode = 0x80, .data = (uintptr_t)buf,
					 .data_len = 4096 };

		check(xioctl(fd, TUTTI_IOC_ADMIN, &a) == EINVAL, "admin Format NVM: EINVAL (read-only passthrough)");
		a.opcode = 0x09;
		check(xioctl(fd, TUTTI_IOC_ADMIN, &a) == EINVAL, "admin Set Features: EINVAL");
		a.opcode = 0x06;
		a.data_len = 100;
		check(xioctl(fd, TUTTI_IOC_ADMIN, &a) == EINVAL, "Identify with 100 bytes: EINVAL");
		a.data_len = 4096;
		a.cdw10 = 0x10;
		check(xioctl(fd, TUTTI_IOC_ADMIN, &a) == EINVAL, "Identify CNS 0x10: EINVAL");
		a.cdw10 = 1;
		a.data = 16;
		check(xioctl(fd, TUTTI_IOC_ADMIN, &a) == EFAULT, "Identify into a bad pointer: EFAULT");
		a.opcode = 0x02;
		a.cdw10 = 0xc0;
		a.data = (uintptr_t)buf;
		a.data_len = 512;
		check(xioctl(fd, TUTTI_IOC_ADMIN, &a) == EINVAL, "vendor log page: EINVAL");
	}
	check(ioctl(fd, _IO(TUTTI_IOC_MAGIC, 0x7f)) < 0 && errno == ENOTTY, "unknown ioctl: ENOTTY");
	check(mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, (off_t)TUTTI_MMAP_SQ(5)) == MAP_FAILED &&
	      errno == EINVAL, "mmap of a queue the file does not own: EINVAL");
	check(mmap(NULL, 1 << 20, PROT_READ, MAP_SHARED, fd, TUTTI_MMAP_DB) == MAP_FAILED &&
	      errno == EINVAL, "mmap of more than the doorbells: EINVAL");
	check(mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, TUTTI_MMAP_DB) == MAP_FAILED &&
	      errno == EINVAL, "private mmap: EINVAL");
	check(pread(fd, blk, 100, 0) < 0 && errno == EINVAL, "read of 100 bytes: EINVAL");
	check(pread(fd, blk, 4096, 3) < 0 && errno == EINVAL, "read at offset 3: EINVAL");
	{
		volatile uintptr_t bad = 16;

		check(pread(fd, (void *)bad, 4096, 0) < 0 && errno == EFAULT,
		      "read into a bad pointer: EFAULT");
	}
	check(pread(fd, blk, 4096, 0) == 4096, "the controller still serves reads");
	close(fd);
	return 0;
}

/* Keep a queue full of commands until killed. */
static int t_victim(const char *node)
{
	struct rig r;
	struct dbuf d;
	struct tt_nvme_sqe sqe;
	unsigned k = 0;

	rig_init(&r, node);
	dbuf_init(r.fd, &d, 4 * MiB);
	for (;;) {
		while (tt_sq_space(&r.q->sq)) {
			uint64_t off = SCRATCH_OFF + 32 * MiB + (k % 64) * 65536;

			if (k & 1)
				tt_nvme_cmd_write(&sqe, r.info.nsid, off >> r.info.lba_shift,
						  65536 >> r.info.lba_shift);
			else
				tt_nvme_cmd_read(&sqe, r.info.nsid, off >> r.info.lba_shift,
						 65536 >> r.info.lba_shift);
			tt_nvme_map_prp(&sqe, &d.bus[(k % 64) * 16], 16, 0, 65536, 4096, 0,
					&(struct tt_nvme_list){ r.list.p, r.list.bus, 16, 4096 });
			sqe.cid = (uint16_t)k++;
			tt_sq_push(&r.q->sq, &sqe);
		}
		tt_sq_ring_doorbell(&r.q->sq);
		if (k >= 63 && k < 64 + 63) {
			printf("ready\n");
			fflush(stdout);
			k = 64 + 63;
		}
		const struct tt_nvme_cqe *c;

		while ((c = tt_cq_peek(&r.q->cq))) {
			tt_sq_update_head(&r.q->sq, c->sq_head);
			tt_cq_advance(&r.q->cq);
		}
		tt_cq_ring_doorbell(&r.q->cq);
	}
	return 0;
}

static int t_kill(const char *self, const char *node, int n)
{
	int fd = open_node(node), killed = 0, served = 0;
	struct tt_kinfo info;
	struct timespec ts;

	tt_kdev_info(fd, &info);
	close(fd);
	srand((unsigned)time(NULL));
	for (int i = 0; i < n; i++) {
		int pfd[2], st;
		char buf[16] = "";
		pid_t pid;

		if (pipe(pfd))
			bail("pipe");
		pid = fork();
		if (!pid) {
			dup2(pfd[1], 1);
			close(pfd[0]);
			execl(self, self, "victim", node, (char *)NULL);
			_exit(127);
		}
		close(pfd[1]);
		if (read(pfd[0], buf, 6) == 6 && !strncmp(buf, "ready", 5))
			served++;
		ts.tv_sec = 0;
		ts.tv_nsec = (rand() % 5000) * 1000L;
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		close(pfd[0]);
		killed += WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
	}
	check(served == n, "%d/%d victims had commands in flight", served, n);
	check(killed == n, "%d/%d victims SIGKILLed", killed, n);
	check(sysfs_long(info.bdf, "user_queues") == 0, "module reclaimed every queue (user_queues = %ld)",
	      sysfs_long(info.bdf, "user_queues"));
	check(sysfs_long(info.bdf, "pinned_pages") == 0, "no pinned page left (pinned_pages = %ld)",
	      sysfs_long(info.bdf, "pinned_pages"));
	{
		struct rig r;
		struct dbuf d;
		struct tt_dma_seg seg[20];
		unsigned n;

		rig_init(&r, node);
		dbuf_init(r.fd, &d, 65536);
		n = dbuf_segs(&d, 0, 65536, seg, 0);
		check(rig_rw(&r, 0, SCRATCH_OFF, seg, n, 0, 0, NULL) == 0,
		      "the controller serves the next process (queue %u)", r.q->qid);
		tt_kqp_destroy(r.q);
		close(r.fd);
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(cmd, "identify") && argc == 4)
		return t_identify(argv[2], argv[3]) || tap_failed;
	if (!strcmp(cmd, "smart") && argc == 3)
		return t_smart(argv[2]) || tap_failed;
	if (!strcmp(cmd, "sglprp") && argc == 3)
		return t_sglprp(argv[2]) || tap_failed;
	if (!strcmp(cmd, "mdts") && argc == 3)
		return t_mdts(argv[2]) || tap_failed;
	if (!strcmp(cmd, "cmb") && argc == 4)
		return t_cmb(argv[2], argv[3]) || tap_failed;
	if (!strcmp(cmd, "malformed") && argc == 3)
		return t_malformed(argv[2]) || tap_failed;
	if (!strcmp(cmd, "victim") && argc == 3)
		return t_victim(argv[2]);
	if (!strcmp(cmd, "kill") && argc == 4)
		return t_kill(argv[0], argv[2], atoi(argv[3])) || tap_failed;
	fprintf(stderr, "usage: %s identify CTRL NS | smart NODE | sglprp NS | mdts NS | "
		"cmb NS_A CTRL_B | malformed NS | kill NS N  (store tests: kq_store)\n", argv[0]);
	return 2;
}
