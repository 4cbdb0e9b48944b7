/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tap.h - minimal TAP output for libtutti's standalone tests
 *
 * Each check prints "ok N - desc" or "not ok N - desc" (with "# got/want"
 * diagnostics); tap_done() prints the plan "1..N" and returns the exit
 * status: 0 only when every check passed.
 */
#ifndef TUTTI_TESTS_TAP_H
#define TUTTI_TESTS_TAP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

static int tap_count;
static int tap_failed;

__attribute__((format(printf, 2, 3)))
static inline bool tap_ok(bool cond, const char *fmt, ...)
{
	va_list ap;

	tap_count++;
	if (!cond)
		tap_failed++;
	printf("%s %d - ", cond ? "ok" : "not ok", tap_count);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	return cond;
}

__attribute__((format(printf, 3, 4)))
static inline bool tap_eq(unsigned long long got, unsigned long long want,
		   const char *fmt, ...)
{
	va_list ap;
	bool cond = got == want;

	tap_count++;
	if (!cond)
		tap_failed++;
	printf("%s %d - ", cond ? "ok" : "not ok", tap_count);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	if (!cond)
		printf("#   got:  0x%llx\n#   want: 0x%llx\n", got, want);
	return cond;
}

/* A check that cannot be made here, and why (TAP "# SKIP": counts as passed). */
__attribute__((format(printf, 1, 2)))
static inline void tap_skip(const char *fmt, ...)
{
	va_list ap;

	tap_count++;
	printf("ok %d - # SKIP ", tap_count);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

/* Print a diagnostic line; shown by TAP consumers, ignored for results. */
__attribute__((format(printf, 1, 2)))
static inline void tap_diag(const char *fmt, ...)
{
	va_list ap;

	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

static inline int tap_done(void)
{
	printf("1..%d\n", tap_count);
	return tap_failed ? 1 : 0;
}

#endif /* TUTTI_TESTS_TAP_H */
