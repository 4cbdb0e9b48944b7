/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Errors: every libtutti call returns 0 (or a count) on success and a
 * negative errno on failure.  A human-readable reason for the last failure
 * of the calling thread is kept in tt_errmsg(), so callers (the CLI, Python)
 * can say *why* without each layer inventing its own error type.
 */
#ifndef TUTTI_ERROR_H
#define TUTTI_ERROR_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default)	/* the exported API: libtutti.map */

/* cffi: begin */
/**
 * tt_errmsg() - reason for the calling thread's last libtutti failure
 *
 * Return: a NUL-terminated string owned by libtutti, "" if none.
 */
const char *tt_errmsg(void);
/* cffi: end */

/**
 * tt_seterr() - record a failure reason and pass the error through
 * @err: negative errno to return
 * @fmt: printf-style reason
 *
 * Return: @err, so callers can write ``return tt_seterr(-EINVAL, ...)``.
 */
int tt_seterr(int err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* cffi: begin */
/** tt_clearerr() - forget the calling thread's last failure reason. */
void tt_clearerr(void);
/* cffi: end */

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif
