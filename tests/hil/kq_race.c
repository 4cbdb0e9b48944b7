// SPDX-License-Identifier: Apache-2.0
/*
 * Description: tutti.ko's races, run inside the HIL guest, each round in a
 * child process under a watchdog (a deadlocked or oopsed round is reported
 * with where its threads sleep, not left to the boot timeout):
 *   mmap-dma NS N       two threads of one process, one DMA-mapping fresh
 *                       memory, one mmap-ing the doorbells (ABBA on
 *                       c->lock / mmap_lock: issue 12 item 7)
 *   fsync-detach BDF N  fsyncs on the namespace node racing an unbind (item 8)
 *   deleted-map NS N    a deleted queue's ring mappings must fault (SIGBUS),
 *                       not read freed memory (item 9)
 *   unmap-busy NS       DMA_UNMAP with a live queue keeps the pages pinned
 *                       until the queue is deleted (item 9)
 * The stalled-command tests are in kq_stall.c.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tutti/error.h"
#include "tutti/kqueue.h"
#include "../../kmod/include/uapi/tutti.h"
#include "hil.h"

#define ROUND_TIMEOUT_S	30
#define MD_ITERS	50	/* per thread and round */

/* Counters the round children add to (shared memory), to show what ran. */
static struct tally {
	atomic_long a, b, c;
} *tally;

static void tally_init(void)
{
	tally = mmap(NULL, sizeof(*tally), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		     -1, 0);
	if (tally == MAP_FAILED)
		bail("mmap: %s", strerror(errno));
	memset(tally, 0, sizeof(*tally));
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int open_node(const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		bail("open %s: %s", path, strerror(errno));
	return fd;
}

/* Where every thread of @pid sleeps (a hung round's evidence). */
static void print_stacks(pid_t pid)
{
	char path[400], buf[4096];
	struct dirent *de;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	d = opendir(path);
	while (d && (de = readdir(d))) {
		FILE *f;
		size_t n;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/stack", pid, de->d_name);
		f = fopen(path, "r");
		n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
		if (f)
			fclose(f);
		buf[n] = 0;
		printf("# thread %s:\n", de->d_name);
		for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n"))
			printf("#   %s\n", l);
	}
	if (d)
		closedir(d);
}

/* Print what a round's child wrote to @fd. */
static void copy_out(int fd)
{
	char buf[4096];
	ssize_t n;

	lseek(fd, 0, SEEK_SET);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		fwrite(buf, 1, (size_t)n, stdout);
	fflush(stdout);
}

/*
 * Run @fn(@arg) in a child; 0 if it exited 0 within the timeout.  A child
 * still running then is reported (it may be stuck in the kernel for good).
 */
static int watched(const char *what, int (*fn)(void *), void *arg, int *hung)
{
	uint64_t deadline = now_ms() + ROUND_TIMEOUT_S * 1000ull;
	char log[] = "/tmp/kq_race.XXXXXX";
	int lfd = mkstemp(log), st;
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		/*
		 * Not the caller's stdout: a child stuck in the kernel for good would
		 * hold the suite's pipe open.  Its output is copied after it ends.
		 */
		dup2(lfd, 1);
		dup2(lfd, 2);
		_exit(fn(arg));
	}
	*hung = 0;
	while (waitpid(pid, &st, WNOHANG) == 0) {
		if (now_ms() > deadline) {
			*hung = 1;
			printf("# %s: no progress for %d s: the round is stuck in the kernel\n",
			       what, ROUND_TIMEOUT_S);
			print_stacks(pid);
			kill(pid, SIGKILL);
			break;
		}
		usleep(20000);
	}
	copy_out(lfd);
	close(lfd);
	unlink(log);
	if (*hung)
		return -1;
	if (WIFSIGNALED(st)) {
		printf("# %s: child killed by signal %d\n", what, WTERMSIG(st));
		return -1;
	}
	return WEXITSTATUS(st);
}

/* ------------------------------------------------------------ mmap-dma */

struct md_arg {
	const char *node;
	int fd;
	int iters;
	atomic_int errs;
};

static void *md_dma(void *p)
{
	struct md_arg *a = p;
	uint64_t bus[16];

	for (int i = 0; i < a->iters; i++) {
		/* Not populated: the pin faults the pages in (mmap_lock). */
		void *m = mmap(NULL, 16 * 4096, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		uint32_t h;

		if (m == MAP_FAILED || tt_kdma_map(a->fd, m, 16 * 4096, bus, &h) ||
		    tt_kdma_unmap(a->fd, h))
			a->errs++;
		else
			tally->a++;
		munmap(m, 16 * 4096);
	}
	return NULL;
}

static void *md_mmap(void *p)
{
	struct md_arg *a = p;

	for (int i = 0; i < a->iters; i++) {
		volatile uint32_t *db = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd,
					     TUTTI_MMAP_DB);

		if (db == MAP_FAILED) {
			a->errs++;
			continue;
		}
		(void)db[0];	/* a fault: the handler takes c->lock under mmap_lock */
		munmap((void *)db, 4096);
		tally->b++;
	}
	return NULL;
}

static int md_round(void *p)
{
	struct md_arg *a = p;
	pthread_t t1, t2;

	a->fd = open_node(a->node);
	pthread_create(&t1, NULL, md_dma, a);
	pthread_create(&t2, NULL, md_mmap, a);
	pthread_join(t1, NULL);
	pthread_join(t2, NULL);
	close(a->fd);
	return a->errs ? 1 : 0;
}

static int t_mmap_dma(const char *node, int rounds)
{
	struct md_arg a = { .node = node, .iters = MD_ITERS };
	int bad = 0, hung = 0, r;
	uint64_t t0 = now_ms();

	tally_init();
	for (r = 0; r < rounds && !hung; r++)
		bad += watched("mmap-dma", md_round, &a, &hung) != 0;
	check(!hung && !bad, "mmap-dma: %d/%d rounds of 2 threads x %d (DMA_MAP+UNMAP of fresh "
	      "memory | mmap+fault+munmap of the doorbells) finished, no deadlock; %ld maps, %ld "
	      "mmaps (%.1f s)", r - bad, rounds, MD_ITERS, (long)tally->a, (long)tally->b,
	      (now_ms() - t0) / 1000.0);
	return 0;
}

/* ------------------------------------------------------------ fsync-detach */

struct fd_arg {
	const char *bdf;
	char node[64];
	int fd;
	atomic_int stop, flushes, enodev, other;
};

static void *fd_flusher(void *p)
{
	struct fd_arg *a = p;

	while (!a->stop) {
		if (!fsync(a->fd)) {
			a->flushes++;
		} else if (errno == ENODEV) {
			a->enodev++;
			break;
		} else {
			a->other++;
			break;
		}
	}
	return NULL;
}

static int write_sysfs(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC), ok;

	if (fd < 0)
		return -errno;
	ok = write(fd, s, strlen(s)) == (ssize_t)strlen(s);
	close(fd);
	return ok ? 0 : -errno;
}

/* The namespace node of controller @bdf, or "" (not bound). */
static void ns_node_of(const char *bdf, char *out, size_t len)
{
	char path[256];
	struct dirent *de;
	DIR *d;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/misc", bdf);
	out[0] = 0;
	d = opendir(path);
	while (d && (de = readdir(d)))
		if (!strncmp(de->d_name, "tutti", 5) && strstr(de->d_name, "n1"))
			snprintf(out, len, "/dev/%.40s", de->d_name);
	if (d)
		closedir(d);
}

static int fd_round(void *p)
{
	struct fd_arg *a = p;
	pthread_t t[8];
	char path[128];

	a->fd = open_node(a->node);
	for (int i = 0; i < 8; i++)
		pthread_create(&t[i], NULL, fd_flusher, a);
	usleep(1000 + rand() % 20000);
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver/unbind", a->bdf);
	if (write_sysfs(path, a->bdf))
		a->other += 100;
	a->stop = 1;
	for (int i = 0; i < 8; i++)
		pthread_join(t[i], NULL);
	close(a->fd);
	tally->a += a->flushes;
	tally->b += a->enodev;
	tally->c += a->enodev > 0;
	if (a->other)
		printf("# fsync-detach: %d unexpected errors\n", a->other);
	return a->other ? 1 : 0;
}

static int wait_node(const char *bdf, char *node, size_t len)
{
	for (int i = 0; i < 200; i++) {
		ns_node_of(bdf, node, len);
		if (node[0] && !access(node, F_OK))
			return 0;
		usleep(20000);
	}
	return -1;
}

static int t_fsync_detach(const char *bdf, int rounds)
{
	struct fd_arg a = { .bdf = bdf };
	int bad = 0, hung = 0, r;
	uint64_t t0 = now_ms();

	srand((unsigned)time(NULL));
	tally_init();
	for (r = 0; r < rounds && !hung; r++) {
		if (wait_node(bdf, a.node, sizeof(a.node))) {
			printf("# fsync-detach: %s has no namespace node\n", bdf);
			bad++;
			break;
		}
		a.stop = 0;
		bad += watched("fsync-detach", fd_round, &a, &hung) != 0;
		if (tt_kmod_attach(bdf))
			printf("# fsync-detach: rebind %s: %s\n", bdf, tt_errmsg());
	}
	check(!hung && !bad && !wait_node(bdf, a.node, sizeof(a.node)),
	      "fsync-detach: %d/%d rounds of 8 threads fsync-ing while %s was unbound: each "
	      "fsync 0 or ENODEV, no oops, rebound; %ld flushes, %ld ENODEV in %ld rounds "
	      "(%.1f s)", r - bad, rounds, bdf, (long)tally->a, (long)tally->b, (long)tally->c,
	      (now_ms() - t0) / 1000.0);
	return 0;
}

/* ------------------------------------------------------------ deleted-map */

static sigjmp_buf dm_jmp;

static void dm_bus(int sig)
{
	(void)sig;
	siglongjmp(dm_jmp, 1);
}

/* Read *p; 1 if it raised SIGBUS. */
static int faults(volatile uint32_t *p)
{
	struct sigaction sa = { .sa_handler = dm_bus }, old;
	int hit = 0;

	sigaction(SIGBUS, &sa, &old);
	if (!sigsetjmp(dm_jmp, 1))
		(void)*p;
	else
		hit = 1;
	sigaction(SIGBUS, &old, NULL);
	return hit;
}

static int dm_round(void *p)
{
	const char *node = p;
	int fd = open_node(node), bad = 0;

	for (int i = 0; i < 10; i++) {
		struct tutti_queue_delete d = { .argsz = sizeof(d) };
		struct tt_kqp *q;

		if (tt_kqp_create(fd, 64, -1, 0, NULL, &q))
			bail("queue: %s", tt_errmsg());
		memset(q->sq_map, 0xa5, 4096);
		d.qid = q->qid;
		if (xioctl(fd, TUTTI_IOC_QUEUE_DELETE, &d))
			bad++;
		/* Still mapped here: both rings must fault now. */
		if (!faults(q->sq_map) || !faults(q->cq_map)) {
			if (!bad++)
				printf("# deleted-map: queue %u: a ring still reads (%#x)\n", q->qid,
				       *(volatile uint32_t *)q->sq_map);
		}
		munmap(q->sq_map, q->sq_bytes);
		munmap(q->cq_map, q->cq_bytes);
		munmap(q->db_map, q->db_bytes);
		free(q);
	}
	close(fd);
	return bad ? 1 : 0;
}

static int t_deleted_map(const char *node, int rounds)
{
	struct tt_kinfo info;
	int bad = 0, hung = 0, r, fd = open_node(node);

	tt_kdev_info(fd, &info);
	close(fd);
	for (r = 0; r < rounds && !hung; r++)
		bad += watched("deleted-map", dm_round, (void *)node, &hung) != 0;
	check(!hung && !bad, "deleted-map: %d/%d rounds x 10 queues deleted while mapped: SQ and "
	      "CQ mappings fault (SIGBUS) afterwards", r - bad, rounds);
	check(sysfs_long(info.bdf, "user_queues") == 0 && sysfs_long(info.bdf, "pinned_pages") == 0,
	      "deleted-map: user_queues %ld, pinned_pages %ld afterwards",
	      sysfs_long(info.bdf, "user_queues"), sysfs_long(info.bdf, "pinned_pages"));
	return 0;
}

/* ------------------------------------------------------------ unmap-busy */

static int t_unmap_busy(const char *node)
{
	int fd = open_node(node);
	struct tt_kinfo info;
	struct tt_kqp *q;
	void *buf = hil_pages(256 * 4096);
	uint64_t bus[256];
	uint32_t h;
	long base, held, after_unmap, after_delete;

	tt_kdev_info(fd, &info);
	base = sysfs_long(info.bdf, "pinned_pages");
	if (tt_kqp_create(fd, 64, -1, 0, NULL, &q) || tt_kdma_map(fd, buf, 256 * 4096, bus, &h))
		bail("queue/map: %s", tt_errmsg());
	held = sysfs_long(info.bdf, "pinned_pages");
	check(!tt_kdma_unmap(fd, h), "unmap-busy: DMA_UNMAP with a live queue succeeds");
	after_unmap = sysfs_long(info.bdf, "pinned_pages");
	check(held == base + 256 && after_unmap == held,
	      "unmap-busy: the 256 pages stay pinned while the queue lives (%ld -> %ld -> %ld)",
	      base, held, after_unmap);
	check(tt_kqp_stopped(tt_kqp_delete(q)), "unmap-busy: the queue is deleted");
	after_delete = sysfs_long(info.bdf, "pinned_pages");
	check(after_delete == base, "unmap-busy: and unpinned when it is (%ld)", after_delete);
	/* Without a live queue the unpin is immediate. */
	if (tt_kdma_map(fd, buf, 256 * 4096, bus, &h))
		bail("map: %s", tt_errmsg());
	check(!tt_kdma_unmap(fd, h) && sysfs_long(info.bdf, "pinned_pages") == base,
	      "unmap-busy: with no queue, DMA_UNMAP unpins at once");
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(cmd, "mmap-dma") && argc == 4)
		return t_mmap_dma(argv[2], atoi(argv[3])) || tap_failed;
	if (!strcmp(cmd, "fsync-detach") && argc == 4)
		return t_fsync_detach(argv[2], atoi(argv[3])) || tap_failed;
	if (!strcmp(cmd, "deleted-map") && argc == 4)
		return t_deleted_map(argv[2], atoi(argv[3])) || tap_failed;
	if (!strcmp(cmd, "unmap-busy") && argc == 3)
		return t_unmap_busy(argv[2]) || tap_failed;
	fprintf(stderr, "usage: %s mmap-dma NS N | fsync-detach BDF N | deleted-map NS N | "
		"unmap-busy NS\n", argv[0]);
	return 2;
}
