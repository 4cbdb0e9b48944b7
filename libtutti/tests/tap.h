/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tap.h - the one TAP dialect of Tutti's test programs: the C unit tests (libtutti/tests/test_*.c),
 * the GPU tests (libtutti/tests/test_gpu_*.cu, hd_compile.cu) and the HIL guest programs
 * (tests/hil/kq_*.c, through hil.h).
 *
 * Each check prints "ok N - desc" or "not ok N - desc" (with "# got/want" diagnostics for
 * tap_eq), a check that cannot be made here "ok N - # SKIP why", and the program ends with the
 * plan "1..N": tap_done() prints it and returns the exit status (0 only when every check
 * passed), or tap_plan_at_exit() prints it when the program exits normally (the guest programs,
 * which exit from many places).  A program with nothing to test here says "1..0 # SKIP why"
 * and exits 0 (tap_skip_all), never a special exit code.
 *
 * One consumer reads every program's output: Perl's prove (TAP::Harness; `make ctest`,
 * `make gpu-test`, tests/hil/run-guest.sh).  A program that dies before its plan (a crash, an
 * abort, a signal) has no plan, or a short one, and fails there; a skip is reported as a skip.
 * Every line is flushed, so the lines before a crash are not lost.
 */
#ifndef TUTTI_TESTS_TAP_H
#define TUTTI_TESTS_TAP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int tap_count;
static int tap_failed;
static bool tap_planned;
static pid_t tap_exit_pid;	/* the process whose exit prints the plan (tap_plan_at_exit) */

static inline void tap_vline(bool cond, const char *fmt, va_list ap)
{
	tap_count++;
	if (!cond)
		tap_failed++;
	printf("%s %d - ", cond ? "ok" : "not ok", tap_count);
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
}

__attribute__((format(printf, 2, 3)))
static inline bool tap_ok(bool cond, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	tap_vline(cond, fmt, ap);
	va_end(ap);
	return cond;
}

__attribute__((format(printf, 3, 4)))
static inline bool tap_eq(unsigned long long got, unsigned long long want,
		   const char *fmt, ...)
{
	va_list ap;
	bool cond = got == want;

	va_start(ap, fmt);
	tap_vline(cond, fmt, ap);
	va_end(ap);
	if (!cond) {
		printf("#   got:  0x%llx\n#   want: 0x%llx\n", got, want);
		fflush(stdout);
	}
	return cond;
}

/* A check that cannot be made here, and why (TAP "# SKIP": reported as a skip, not a failure). */
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
	fflush(stdout);
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
	fflush(stdout);
}

/* The plan, and the exit status: 0 only when every check passed. */
static inline int tap_done(void)
{
	if (!tap_planned)
		printf("1..%d\n", tap_count);
	tap_planned = true;
	fflush(stdout);
	return tap_failed ? 1 : 0;
}

/*
 * Nothing of this program can run here (no GPU, say): the plan "1..0 # SKIP why", exit 0.
 * Only before the first check.
 */
__attribute__((format(printf, 1, 2), noreturn))
static inline void tap_skip_all(const char *fmt, ...)
{
	va_list ap;

	printf("1..0 # SKIP ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	tap_planned = true;
	exit(0);
}

static inline void tap_atexit(void)
{
	if (getpid() == tap_exit_pid)	/* a forked child that calls exit() prints no plan */
		tap_done();
}

/* Print the plan when this process exits normally (exit() or a return from main). */
static inline void tap_plan_at_exit(void)
{
	if (!tap_exit_pid) {
		tap_exit_pid = getpid();
		atexit(tap_atexit);
	}
}

/* This process's stdout is not TAP (a helper mode whose output another program reads): no plan. */
static inline void tap_no_plan(void)
{
	tap_planned = true;
}

#endif /* TUTTI_TESTS_TAP_H */
