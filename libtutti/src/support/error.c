// SPDX-License-Identifier: Apache-2.0
/* Thread-local "why" for the last failure; see tutti/error.h. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tutti/error.h"

static __thread char tt_msg[512];

const char *tt_errmsg(void)
{
	return tt_msg;
}

int tt_seterr(int err, const char *fmt, ...)
{
	char msg[sizeof(tt_msg)];
	va_list ap;

	/* Formatted aside first: a caller may prefix the reason it got (tt_errmsg()). */
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	memcpy(tt_msg, msg, sizeof(msg));
	return err;
}

void tt_clearerr(void)
{
	tt_msg[0] = '\0';
}
