/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers for the guest tests, in the TAP dialect of every Tutti test program
 * (libtutti/tests/tap.h): each check prints "ok N - ..." or "not ok N - ...", and
 * the plan "1..N" is printed when the program exits normally; one that dies
 * before (a crash, a signal) has no plan, and run-guest.sh fails it (it judges
 * each program's output with scripts/tap-run, then numbers the lines into its own
 * stream).  Shared helpers (fill, key_of) come from libtutti/tests/testutil.h.
 */
#ifndef TUTTI_HIL_H
#define TUTTI_HIL_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "../../libtutti/tests/tap.h"
#include "../../libtutti/tests/testutil.h"

/* Every guest program prints its plan at exit (it exits from many places). */
__attribute__((constructor)) static void hil_plan_at_exit(void)
{
	tap_plan_at_exit();
}

__attribute__((format(printf, 2, 3)))
static inline bool check(bool cond, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	tap_vline(cond, fmt, ap);
	va_end(ap);
	return cond;
}

/* A check that failed so that the program cannot go on: "not ok", the plan, exit 1. */
__attribute__((format(printf, 1, 2), noreturn))
static inline void bail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	tap_vline(false, fmt, ap);
	va_end(ap);
	exit(1);
}

/* @len bytes of private anonymous memory, populated; bails out on failure. */
static inline void *hil_pages(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

	if (p == MAP_FAILED)
		bail("mmap %zu: %s", len, strerror(errno));
	return p;
}

/* 0 or the errno of a failed ioctl, so checks can compare with EINVAL etc. */
static inline int xioctl(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) ? errno : 0;
}

/* The number a sysfs-style file holds, or -1 if it cannot be read. */
static inline long file_long(const char *path)
{
	char buf[64] = "";
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return strtol(buf, NULL, 0);
}

/* A PCI device's sysfs attribute (tutti.ko adds user_queues, pinned_pages). */
static inline long sysfs_long(const char *bdf, const char *attr)
{
	char path[256];

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/%s", bdf, attr);
	return file_long(path);
}

#endif
