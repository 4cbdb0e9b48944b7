/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers for the guest tests: each check prints one "ok - ..." or
 * "not ok - ..." line; run-guest.sh numbers them (TAP) and counts.
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

static int hil_failed;

__attribute__((format(printf, 2, 3)))
static inline bool check(bool cond, const char *fmt, ...)
{
	va_list ap;

	if (!cond)
		hil_failed++;
	printf("%s - ", cond ? "ok" : "not ok");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	return cond;
}

__attribute__((format(printf, 1, 2), noreturn))
static inline void bail(const char *fmt, ...)
{
	va_list ap;

	printf("not ok - ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
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

/* Deterministic bytes from @seed (xorshift), to recognise data after a round trip. */
static inline void fill(void *p, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;

	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		((uint8_t *)p)[i] = (uint8_t)x;
	}
}

#endif
