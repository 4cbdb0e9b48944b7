/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers for the guest tests: each check prints one "ok - ..." or
 * "not ok - ..." line; run-guest.sh numbers them (TAP) and counts.
 */
#ifndef TUTTI_HIL_H
#define TUTTI_HIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif
