// SPDX-License-Identifier: Apache-2.0
/*
 * Opening members safely: O_DIRECT where the filesystem allows it, an
 * exclusive claim on block devices (the kernel refuses it while mounted or
 * used by another holder), and an flock so two processes never write one
 * store unless they asked to share it.
 */
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "tutti/error.h"
#include "tutti/kqueue.h"
#include "member.h"

static uint32_t dio_mem_align(int fd, int is_blk)
{
#ifdef STATX_DIOALIGN
	struct statx stx;

	if (!statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) &&
	    (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_mem_align)
		return stx.stx_dio_mem_align < 512 ? 512 : stx.stx_dio_mem_align;
#endif
	if (is_blk) {
		int lbs = 0;

		if (!ioctl(fd, BLKSSZGET, &lbs) && lbs >= 512)
			return (uint32_t)lbs;
	}
	return 4096;
}

/*
 * A process killed with I/O in flight keeps its files (and so its flock and
 * exclusive block-device claim) until the kernel finishes tearing down its
 * io_uring, a few milliseconds later (over a second was seen on a loaded
 * 2-core machine, with O_DIRECT writes still draining).  A restarted server
 * must not fail on that, so busy is retried for a bounded time before it is
 * believed.
 */
#define BUSY_RETRY_MS	3000
#define BUSY_STEP_MS	10

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)ms * 1000000L };

	nanosleep(&ts, NULL);
}

static int open_retry(const char *path, int oflags)
{
	for (unsigned waited = 0;; waited += BUSY_STEP_MS) {
		int fd = open(path, oflags, 0644);

		if (fd >= 0 || errno != EBUSY || waited >= BUSY_RETRY_MS)
			return fd;
		sleep_ms(BUSY_STEP_MS);
	}
}

static int lock_retry(int fd, int op)
{
	for (unsigned waited = 0;; waited += BUSY_STEP_MS) {
		if (!flock(fd, op | LOCK_NB))
			return 0;
		if (errno != EWOULDBLOCK || waited >= BUSY_RETRY_MS)
			return -1;
		sleep_ms(BUSY_STEP_MS);
	}
}

int tt_member_open(const char *path, unsigned flags, struct tt_member *m)
{
	int wr = flags & TT_MEMBER_WRITE;
	int oflags = (wr ? O_RDWR : O_RDONLY) | O_CLOEXEC;
	struct stat st;
	int fd;

	memset(m, 0, sizeof(*m));
	m->fd = -1;
	if (strlen(path) >= TT_PATH_MAX)
		return tt_seterr(-ENAMETOOLONG, "%s: path too long", path);
	snprintf(m->path, sizeof(m->path), "%s", path);

	if (stat(path, &st)) {
		if (errno != ENOENT || !(flags & TT_MEMBER_CREATE))
			return tt_seterr(-errno, "%s: %s", path, strerror(errno));
		oflags |= O_CREAT | O_EXCL;
		m->created = 1;
	} else if (S_ISBLK(st.st_mode)) {
		m->is_blk = 1;
		/* O_EXCL on a block device: fails with EBUSY while mounted. */
		if (wr && !(flags & TT_MEMBER_NOLOCK))
			oflags |= O_EXCL;
	} else if (S_ISCHR(st.st_mode)) {
		m->is_chr = 1;	/* a tutti.ko namespace node, checked once open */
		/*
		 * Even a read-only store writes submission queues: the node is
		 * opened read-write; the store itself refuses data writes.
		 */
		oflags = (oflags & ~O_ACCMODE) | O_RDWR;
	} else if (!S_ISREG(st.st_mode)) {
		return tt_seterr(-EINVAL, "%s: not a regular file, block device or tutti "
				 "namespace node", path);
	}

	fd = open_retry(path, oflags | O_DIRECT);
	if (fd < 0 && errno == EINVAL && !m->is_blk) {
		/*
		 * Filesystem without O_DIRECT (tmpfs before 6.6): buffered +
		 * fdatasync.  The O_DIRECT attempt may already have created it.
		 */
		fd = open(path, oflags & ~O_EXCL, 0644);
	} else if (fd >= 0) {
		m->direct = 1;
	}
	if (fd < 0) {
		int err = errno;

		if (err == EBUSY)
			return tt_seterr(-EBUSY, "%s: device is mounted or in use", path);
		return tt_seterr(-err, "%s: %s", path, strerror(err));
	}
	m->fd = fd;

	if (!(flags & TT_MEMBER_NOLOCK) && lock_retry(fd, wr ? LOCK_EX : LOCK_SH)) {
		int err = errno;

		tt_member_close(m);
		/* flock() conflicts per open file: this process's own handle too */
		if (err == EWOULDBLOCK)
			return tt_seterr(-EBUSY, "%s: store is in use (open in another process, or in this one)",
					 path);
		return tt_seterr(-err, "%s: lock: %s", path, strerror(err));
	}

	if (m->is_chr) {
		if (tt_kdev_size(fd, &m->size)) {
			tt_member_close(m);
			return tt_seterr(-EINVAL, "%s: not a regular file, block device or "
					 "tutti namespace node", path);
		}
	} else if (m->is_blk) {
		if (ioctl(fd, BLKGETSIZE64, &m->size)) {
			int err = errno;

			tt_member_close(m);
			return tt_seterr(-err, "%s: size: %s", path, strerror(err));
		}
	} else {
		if (fstat(fd, &st)) {
			int err = errno;

			tt_member_close(m);
			return tt_seterr(-err, "%s: %s", path, strerror(err));
		}
		m->size = (uint64_t)st.st_size;
	}
	m->mem_align = m->direct ? dio_mem_align(fd, m->is_blk) : 1;
	return 0;
}

void tt_member_close(struct tt_member *m)
{
	/*
	 * Unlock explicitly: io_uring may still hold a reference to the file
	 * for a moment after its ring is torn down, and the lock would
	 * outlive close() until then.
	 */
	if (m->fd >= 0) {
		flock(m->fd, LOCK_UN);
		close(m->fd);
	}
	m->fd = -1;
}

int tt_member_resize(struct tt_member *m, uint64_t size)
{
	if (m->is_blk || m->is_chr)
		return 0;	/* devices have the size they have */
	if (ftruncate(m->fd, (off_t)size))
		return tt_seterr(-errno, "%s: resize to %llu bytes: %s", m->path,
				 (unsigned long long)size, strerror(errno));
	m->size = size;
	return 0;
}

/*
 * fallocate(2) proper, never glibc's posix_fallocate(), which falls back to
 * writing a byte per block: a file system that cannot reserve space is
 * refused with the way out, not emulated slowly.  The free space is checked
 * first, so a store that cannot fit never fills the file system on its way
 * to ENOSPC; a failure gives back what it grew.
 */
int tt_member_preallocate(struct tt_member *m, uint64_t size)
{
	struct statvfs vfs;
	struct stat st;
	uint64_t have, avail;
	int err, undo;

	if (m->is_blk || m->is_chr || !size)
		return 0;
	if (fstat(m->fd, &st) || fstatvfs(m->fd, &vfs))
		return tt_seterr(-errno, "%s: %s", m->path, strerror(errno));
	have = (uint64_t)st.st_blocks * 512;
	avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	if (have < size && size - have > avail)
		return tt_seterr(-ENOSPC, "%s: not enough space for %llu bytes (%llu "
				 "free): a smaller capacity, or a sparse file that takes "
				 "space only as blocks are written", m->path,
				 (unsigned long long)size, (unsigned long long)avail);
	do {
		err = fallocate(m->fd, 0, 0, (off_t)size) ? errno : 0;
	} while (err == EINTR);
	if (!err) {
		if (m->size < size)
			m->size = size;
		return 0;
	}
	undo = ftruncate(m->fd, st.st_size);	/* the error reported is fallocate's */
	(void)undo;
	if (err == EOPNOTSUPP || err == ENOSYS)
		return tt_seterr(-EOPNOTSUPP, "%s: the file system cannot reserve "
				 "space: format a sparse file there", m->path);
	if (err == ENOSPC)
		return tt_seterr(-ENOSPC, "%s: not enough space for %llu bytes: a "
				 "smaller capacity, or a sparse file that takes space "
				 "only as blocks are written", m->path,
				 (unsigned long long)size);
	return tt_seterr(-err, "%s: preallocate %llu bytes: %s", m->path,
			 (unsigned long long)size, strerror(err));
}

static int member_io(struct tt_member *m, void *buf, uint64_t len, uint64_t off,
		     int wr)
{
	uint64_t done = 0;

	while (done < len) {
		ssize_t n = wr ? pwrite(m->fd, (char *)buf + done, len - done, (off_t)(off + done))
			       : pread(m->fd, (char *)buf + done, len - done, (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return tt_seterr(-errno, "%s: %s at offset %llu: %s", m->path,
					 wr ? "write" : "read",
					 (unsigned long long)(off + done), strerror(errno));
		if (n == 0)
			return tt_seterr(-EIO, "%s: unexpected end of file at offset %llu",
					 m->path, (unsigned long long)(off + done));
		done += (uint64_t)n;
	}
	return 0;
}

int tt_member_pread(struct tt_member *m, void *buf, uint64_t len, uint64_t off)
{
	return member_io(m, buf, len, off, 0);
}

int tt_member_pwrite(struct tt_member *m, const void *buf, uint64_t len, uint64_t off)
{
	return member_io(m, (void *)buf, len, off, 1);
}

int tt_member_read_head(struct tt_member *m, void *buf, uint64_t len, uint64_t *got)
{
	ssize_t n;

	/*
	 * One read: it stops at the end of a short file, where a second one
	 * (unaligned under O_DIRECT) would fail rather than return 0.
	 */
	do {
		n = pread(m->fd, buf, len, 0);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return tt_seterr(-errno, "%s: read at offset 0: %s", m->path, strerror(errno));
	*got = (uint64_t)n;
	return 0;
}
