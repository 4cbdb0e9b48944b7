// SPDX-License-Identifier: Apache-2.0
/*
 * Description: the GPU memory (nvidia-p2p) interface of tutti.ko as the
 * guest sees it.  The guest has no NVIDIA driver, so this checks the
 * contract around it: malformed requests are refused with -EINVAL (the
 * checks are shared by both builds), well-formed ones with -EOPNOTSUPP in a
 * module built without nv-p2p.h (-ENODEV in one built with it, since
 * nvidia.ko is not loaded), GPU rings in TUTTI_IOC_QUEUE_CREATE likewise,
 * CAP_SYS_RAWIO is required, and the controller keeps serving.
 *
 * "live": the P2P build against nvp2p_fake.ko (tests/hil/nvp2p-fake), a
 * stand-in for the NVIDIA driver whose "GPU memory" is controller B's CMB
 * (fake GPU addresses FAKE_VA.. = B's CMB from offset 0): pin, bus list,
 * SQ and CQ in that memory, a read DMA'd into it, -EBUSY unmap under a
 * ring, revocation by the "driver" (every queue of the file stopped before
 * the callback returns), teardown on close and on SIGKILL.
 * usage: kq_p2p NODE | kq_p2p live NS_NODE_A CTRL_NODE_B
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>
#include <sys/mman.h>
#include <time.h>

#include "tutti/error.h"
#include "tutti/kqueue.h"
#include "tutti/nvme.h"
#include "../../kmod/include/uapi/tutti.h"
#include "hil.h"

#define GPU_PAGE TUTTI_P2P_GPU_PAGE
/* A made-up, well-formed GPU virtual address (there is no GPU here). */
#define FAKE_VA (0x7f0000000000ull)

static struct tutti_p2p_map good_map(uint64_t *bus, uint32_t cap)
{
	struct tutti_p2p_map m = {
		.argsz = sizeof(m), .vaddr = FAKE_VA, .len = 2 * GPU_PAGE,
		.bus = (uintptr_t)bus, .bus_cap = cap,
	};

	return m;
}

/* Drop CAP_SYS_RAWIO in a child and try the ioctl there: EPERM. */
static int eperm_without_rawio(int fd)
{
	pid_t pid = fork();
	int st;

	if (pid == 0) {
		struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
		struct __user_cap_data_struct d[2];
		uint64_t bus[32];
		struct tutti_p2p_map m = good_map(bus, 32);

		if (syscall(SYS_capget, &h, d))
			_exit(2);
		d[CAP_SYS_RAWIO / 32].effective &= ~(1u << (CAP_SYS_RAWIO % 32));
		if (syscall(SYS_capset, &h, d))
			_exit(3);
		_exit(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EPERM ? 0 : 1);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}


/* ---- live: the P2P build against nvp2p_fake ---- */

#define FAKE_SYS "/sys/module/nvp2p_fake/parameters/"
#define WIN (1ul << 20)			/* the range pinned: 1 MiB */
#define SQ_OFF 0ul
#define CQ_OFF (64ul << 10)
#define DATA_OFF (512ul << 10)
#define LBA_OFF ((128ul << 20) + (40ul << 20))	/* scratch, far from a store */

static long fake_param(const char *name)
{
	char path[128];

	snprintf(path, sizeof(path), FAKE_SYS "%s", name);
	return file_long(path);
}

static int fake_revoke(uint64_t va)
{
	FILE *f = fopen(FAKE_SYS "revoke", "w");
	int ok;

	if (!f)
		return -1;
	ok = fprintf(f, "%#llx\n", (unsigned long long)va) > 0;
	return fclose(f) == 0 && ok ? 0 : -1;
}

static long user_queues(const char *ns_node)
{
	struct tutti_info i = { .argsz = sizeof(i) };
	int fd = open(ns_node, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || ioctl(fd, TUTTI_IOC_INFO, &i))
		return -1;
	close(fd);
	return sysfs_long(i.bdf, "user_queues");
}

/* A queue pair whose rings are in the "GPU" window, driven by hand. */
struct gq {
	struct tutti_queue_create c;
	volatile uint8_t *sq, *cq;	/* in the CMB mapping */
	volatile uint32_t *db;
	uint16_t tail, head;
	uint8_t phase;
};

static int gq_create(int fd, uint32_t handle, uint8_t *win, volatile uint32_t *db, struct gq *q)
{
	memset(q, 0, sizeof(*q));
	/* A CQ in device memory is zeroed by its owner before creation. */
	memset(win + CQ_OFF, 0, 4096);
	q->c.argsz = sizeof(q->c);
	q->c.flags = TUTTI_QUEUE_SQ_GPU | TUTTI_QUEUE_CQ_GPU;
	q->c.depth = 16;
	q->c.peer_fd = (int32_t)handle;
	q->c.peer_off = SQ_OFF;
	q->c.cq_page = CQ_OFF / 4096;
	q->sq = win + SQ_OFF;
	q->cq = win + CQ_OFF;
	q->db = db;
	q->phase = 1;
	return xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q->c);
}

/* Submit one command; wait up to @ms for its completion. Returns status or -1. */
static int gq_exec(struct gq *q, struct tt_nvme_sqe *sqe, unsigned ms)
{
	volatile struct tt_nvme_cqe *cqe;
	struct timespec t0, t;

	sqe->cid = (uint16_t)(q->tail + 1);
	memcpy((void *)(q->sq + (size_t)q->tail * 64), sqe, 64);
	__sync_synchronize();
	q->tail = (uint16_t)((q->tail + 1) % q->c.depth);
	q->db[q->c.sq_db / 4] = q->tail;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cqe = (volatile struct tt_nvme_cqe *)(q->cq + (size_t)q->head * 16);
	while ((cqe->status & 1) != q->phase) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > ms)
			return -1;
		usleep(100);
	}
	__sync_synchronize();
	q->head = (uint16_t)((q->head + 1) % q->c.depth);
	if (!q->head)
		q->phase ^= 1;
	q->db[q->c.cq_db / 4] = q->head;
	return (cqe->status >> 1) & 0x7ff;
}

static void read_cmd(struct tt_nvme_sqe *sqe, const struct tutti_info *info, const uint64_t *bus,
		     size_t data_off, size_t len)
{
	tt_nvme_cmd_read(sqe, info->nsid, LBA_OFF >> info->lba_shift,
			 (uint32_t)(len >> info->lba_shift));
	sqe->dptr.prp.prp1 = bus[data_off / 4096];
	sqe->dptr.prp.prp2 = len > 4096 ? bus[data_off / 4096 + 1] : 0;
}

static int p2p_map(int fd, uint64_t va, size_t len, uint64_t *bus, uint32_t *handle)
{
	struct tutti_p2p_map m = { .argsz = sizeof(m), .vaddr = va, .len = len,
				   .bus = (uintptr_t)bus, .bus_cap = (uint32_t)(len / 4096) };
	int e = xioctl(fd, TUTTI_IOC_P2P_MAP, &m);

	*handle = m.handle;
	return e;
}

static int p2p_unmap(int fd, uint32_t handle)
{
	struct tutti_p2p_unmap u = { .argsz = sizeof(u), .handle = handle };

	return xioctl(fd, TUTTI_IOC_P2P_UNMAP, &u);
}

static int qdelete(int fd, uint32_t qid)
{
	struct tutti_queue_delete d = { .argsz = sizeof(d), .qid = qid };

	return xioctl(fd, TUTTI_IOC_QUEUE_DELETE, &d);
}

/* The child of the SIGKILL check: pin, queue with GPU rings, then wait to die. */
static void crash_child(const char *ns, const char *ctrl_b, int ready)
{
	static uint64_t bus[WIN / 4096];
	int fd = open(ns, O_RDWR | O_CLOEXEC), fb = open(ctrl_b, O_RDWR | O_CLOEXEC);
	/* tutti mappings are not inherited across fork: map again */
	uint8_t *win = fb < 0 ? NULL : tt_kdev_map_cmb(fb, 4u << 20);
	volatile uint32_t *db;
	uint32_t h;
	struct gq q;
	char c = 1;

	if (fd < 0 || !win)
		_exit(2);
	db = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, TUTTI_MMAP_DB);
	if (db == MAP_FAILED || p2p_map(fd, FAKE_VA, WIN, bus, &h) || gq_create(fd, h, win, db, &q))
		_exit(3);
	if (write(ready, &c, 1) != 1)
		_exit(4);
	for (;;)
		pause();
}

static int t_live(const char *ns, const char *ctrl_b)
{
	static uint64_t bus[WIN / 4096], bus2[WIN / 4096];
	struct tutti_info info = { .argsz = sizeof(info) }, bi = { .argsz = sizeof(bi) };
	int fd = open(ns, O_RDWR | O_CLOEXEC), fb = open(ctrl_b, O_RDWR | O_CLOEXEC), e, st, pfd[2];
	uint8_t want[8192], *win;
	volatile uint32_t *db;
	struct tt_nvme_sqe sqe;
	struct tt_kqp *hq = NULL;
	struct tt_nvme_cqe cqe;
	uint32_t h, h2;
	struct gq q, q2;
	long uq0;
	pid_t pid;
	size_t i;
	int ok;
	char c;

	if (fd < 0 || fb < 0 || xioctl(fd, TUTTI_IOC_INFO, &info) || xioctl(fb, TUTTI_IOC_INFO, &bi))
		bail("live: cannot open %s / %s", ns, ctrl_b);
	check(info.flags & TUTTI_INFO_NV_P2P, "the loaded module is the nvidia-p2p build (TUTTI_INFO_NV_P2P)");
	win = tt_kdev_map_cmb(fb, 4u << 20);
	db = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, TUTTI_MMAP_DB);
	if (!win || db == MAP_FAILED)
		bail("live: map the CMB / doorbells");
	uq0 = user_queues(ns);

	/* Pin: bus addresses in DMA_MAP's shape (one per 4 KiB page). */
	e = p2p_map(fd, FAKE_VA, WIN, bus, &h);
	check(e == 0 && h != 0, "P2P_MAP of 1 MiB of (stand-in) GPU memory: handle %u (%d)", h, e);
	for (ok = 1, i = 0; i < WIN / 4096; i++)
		ok &= bus[i] == bi.cmb_bus + i * 4096;
	check(ok, "256 bus addresses, one per 4 KiB page, = the window's (%#llx..)",
	      (unsigned long long)bus[0]);
	check(fake_param("pinned") == 1, "the driver holds 1 pin");
	e = p2p_map(fd, FAKE_VA + (16ul << 20), WIN, bus2, &h2);
	check(e == EINVAL, "P2P_MAP outside the driver's memory: the driver's EINVAL (%d)", e);

	/* SQ and CQ in GPU memory; a read DMA'd into GPU memory. */
	e = gq_create(fd, h, win, db, &q);
	check(e == 0 && q.c.sq_bus == bus[0] && !q.c.sq_mmap_off && !q.c.cq_mmap_off,
	      "queue %u with SQ and CQ in GPU memory (SQ bus %#llx, no mmap offsets) (%d)", q.c.qid,
	      (unsigned long long)q.c.sq_bus, e);
	fill(want, sizeof(want), 1);
	if (pwrite(fd, want, sizeof(want), LBA_OFF) != (ssize_t)sizeof(want))
		bail("live: pwrite");
	memset(win + DATA_OFF, 0, sizeof(want));
	read_cmd(&sqe, &info, bus, DATA_OFF, sizeof(want));
	e = gq_exec(&q, &sqe, 5000);
	check(e == 0, "read through the GPU-resident rings: status %d", e);
	check(!memcmp(win + DATA_OFF, want, sizeof(want)), "8 KiB DMA'd into GPU memory = the bytes written");
	check(p2p_unmap(fd, h) == EBUSY, "P2P_UNMAP while a ring lives there: EBUSY");
	e = tt_kqp_create(fd, 16, -1, 0, NULL, &hq);
	read_cmd(&sqe, &info, bus, DATA_OFF + 8192, 4096);
	check(!e && tt_kqp_exec(hq, &sqe, &cqe, 5000) == 0 && tt_nvme_cqe_status(&cqe) == 0,
	      "a host-ring queue of the same file reads into GPU memory too");

	/* The driver takes the memory back. */
	check(fake_revoke(FAKE_VA + 4096) == 0, "the driver frees the memory (callback returned)");
	check(fake_param("revoked") == 1 && fake_param("pinned") == 0, "the pin is gone from the driver");
	read_cmd(&sqe, &info, bus, DATA_OFF, 4096);
	check(gq_exec(&q, &sqe, 1000) == -1, "the GPU-ring queue was deleted: no completion");
	e = hq ? tt_kqp_exec(hq, &sqe, &cqe, 1000) : 0;
	check(e == -ETIMEDOUT, "the file's host-ring queue was stopped too (%d)", e);
	e = gq_create(fd, h, win, db, &q2);
	check(e == ENXIO, "a queue on the revoked range: ENXIO (%d)", e);
	if (hq)
		tt_kqp_destroy(hq);
	check(qdelete(fd, q.c.qid) == 0, "deleting the revoked queue");
	check(p2p_unmap(fd, h) == 0, "P2P_UNMAP of the revoked range");
	check(user_queues(ns) == uq0, "user_queues back to %ld", uq0);

	/* Normal life: map, queue, delete, unmap. */
	e = p2p_map(fd, FAKE_VA, WIN, bus, &h);
	check(!e && !gq_create(fd, h, win, db, &q) && gq_exec(&q, (read_cmd(&sqe, &info, bus, DATA_OFF, 4096), &sqe), 5000) == 0,
	      "map again, queue again, read again");
	check(qdelete(fd, q.c.qid) == 0 && p2p_unmap(fd, h) == 0 && fake_param("pinned") == 0,
	      "delete + unmap: the driver holds no pin");
	e = p2p_map(fd, FAKE_VA, WIN, bus, &h);
	check(!e && fake_param("pinned") == 1, "a range left mapped at close...");
	munmap((void *)db, 4096);	/* a mapping holds the file: release needs both gone */
	close(fd);
	check(fake_param("pinned") == 0, "...is given back by the file's release");

	/* SIGKILL with a pin and GPU rings: all given back. */
	if (pipe(pfd))
		bail("pipe");
	pid = fork();
	if (pid == 0)
		crash_child(ns, ctrl_b, pfd[1]);
	e = read(pfd[0], &c, 1) == 1;
	check(e && fake_param("pinned") == 1 && user_queues(ns) == uq0 + 1,
	      "a child pinned GPU memory and put a queue's rings in it");
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	check(fake_param("pinned") == 0 && user_queues(ns) == uq0,
	      "SIGKILL: its pin and queue are gone (pinned %ld, user_queues %ld)",
	      fake_param("pinned"), user_queues(ns));

	/* Revocation after the owner died: nothing left to call back. */
	check(fake_revoke(FAKE_VA) == 0 && fake_param("revoked") == 1, "no callback for a released range");
	munmap(win, 4u << 20);
	close(fb);
	return tap_failed ? 1 : 0;
}

int main(int argc, char **argv)
{
	uint64_t bus[64];
	struct tutti_info info = { .argsz = sizeof(info) };
	struct tutti_p2p_map m;
	int fd, e, want, built;
	uint8_t blk[4096];

	if (argc == 4 && !strcmp(argv[1], "live"))
		return t_live(argv[2], argv[3]);
	if (argc != 2)
		bail("usage: kq_p2p NODE | kq_p2p live NS_NODE_A CTRL_NODE_B");
	fd = open(argv[1], O_RDWR | O_CLOEXEC);
	if (fd < 0)
		bail("open %s: %s", argv[1], strerror(errno));
	if (xioctl(fd, TUTTI_IOC_INFO, &info))
		bail("%s: INFO failed", argv[1]);
	built = !!(info.flags & TUTTI_INFO_NV_P2P);
	want = built ? ENODEV : EOPNOTSUPP;
	printf("# module %s nvidia-p2p: well-formed requests expect %s\n",
	       built ? "built with" : "built without", built ? "ENODEV" : "EOPNOTSUPP");

	m = good_map(bus, 32);
	e = xioctl(fd, TUTTI_IOC_P2P_MAP, &m);
	check(e == want, "P2P_MAP of a well-formed range: %s (got %d)", strerror(want), e);
	check(m.handle == 0, "P2P_MAP left no handle");

	/* Malformed: refused before the build-dependent answer. */
	m = good_map(bus, 32);
	m.argsz -= 4;
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EINVAL, "P2P_MAP with a wrong argsz: EINVAL");
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, (void *)8) == EFAULT, "P2P_MAP with a bad pointer: EFAULT");
	m = good_map(bus, 32);
	m.flags = 1;
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EINVAL, "P2P_MAP with flags set: EINVAL");
	m = good_map(bus, 32);
	m.vaddr = 0;
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EINVAL, "P2P_MAP of address 0: EINVAL");
	m = good_map(bus, 32);
	m.vaddr += 4096;
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EINVAL, "P2P_MAP not 64 KiB aligned (4 KiB is not enough): EINVAL");
	m = good_map(bus, 32);
	m.len = 0;
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EINVAL, "P2P_MAP of 0 bytes: EINVAL");
	m = good_map(bus, 32);
	m.len = GPU_PAGE + 4096;
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EINVAL, "P2P_MAP of a length not a 64 KiB multiple: EINVAL");
	m = good_map(bus, 32);
	m.len = TUTTI_P2P_MAX_BYTES + GPU_PAGE;
	m.bus_cap = UINT32_MAX;
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EINVAL, "P2P_MAP over TUTTI_P2P_MAX_BYTES: EINVAL");
	m = good_map(bus, 32);
	m.vaddr = UINT64_MAX & ~(GPU_PAGE - 1);
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EINVAL, "P2P_MAP whose end wraps around: EINVAL");
	m = good_map(NULL, 32);
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EINVAL, "P2P_MAP without an address list: EINVAL");
	m = good_map(bus, 31);
	check(xioctl(fd, TUTTI_IOC_P2P_MAP, &m) == EINVAL,
	      "P2P_MAP with an address list one entry short (128 KiB = 32 pages): EINVAL");

	{
		struct tutti_p2p_unmap u = { .argsz = sizeof(u), .handle = 0 };

		check(xioctl(fd, TUTTI_IOC_P2P_UNMAP, &u) == EINVAL, "P2P_UNMAP of handle 0: EINVAL");
		u.handle = 1;
		e = xioctl(fd, TUTTI_IOC_P2P_UNMAP, &u);
		check(e == (built ? EINVAL : EOPNOTSUPP), "P2P_UNMAP of a handle never mapped: %s (got %d)",
		      built ? "EINVAL" : "EOPNOTSUPP", e);
		u.argsz = 4;
		check(xioctl(fd, TUTTI_IOC_P2P_UNMAP, &u) == EINVAL, "P2P_UNMAP with a wrong argsz: EINVAL");
	}
	{
		struct tutti_queue_create q = { .argsz = sizeof(q), .depth = 16,
						.flags = TUTTI_QUEUE_SQ_GPU, .peer_fd = 1 };

		e = xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q);
		check(e == (built ? EINVAL : EOPNOTSUPP), "queue with its SQ in GPU memory: %s (got %d)",
		      built ? "EINVAL (no such range)" : "EOPNOTSUPP", e);
		q.flags = TUTTI_QUEUE_CQ_GPU;
		q.cq_page = 4;
		e = xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q);
		check(e == (built ? EINVAL : EOPNOTSUPP), "queue with its CQ in GPU memory: %s (got %d)",
		      built ? "EINVAL (no such range)" : "EOPNOTSUPP", e);
		q.depth = 1;
		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "GPU queue of depth 1: EINVAL");
		q.depth = 16;
		q.flags = TUTTI_QUEUE_SQ_GPU | TUTTI_QUEUE_SQ_PEER;
		q.cq_page = 0;
		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "SQ both in a CMB and in GPU memory: EINVAL");
		q.flags = TUTTI_QUEUE_SQ_GPU;
		q.peer_fd = 0;
		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "GPU ring with handle 0: EINVAL");
		q.flags = 0;
		q.cq_page = 1;
		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "cq_page without TUTTI_QUEUE_CQ_GPU: EINVAL");
		q.cq_page = 0;
		q.flags = 1u << 7;
		check(xioctl(fd, TUTTI_IOC_QUEUE_CREATE, &q) == EINVAL, "unknown queue flag: EINVAL");
	}
	e = eperm_without_rawio(fd);
	check(e == 0, "P2P_MAP without CAP_SYS_RAWIO: EPERM (child status %d)", e);
	check(pread(fd, blk, sizeof(blk), 0) == (ssize_t)sizeof(blk), "the controller still serves reads");
	close(fd);
	return tap_failed ? 1 : 0;
}
