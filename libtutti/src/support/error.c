// SPDX-License-Identifier: Apache-2.0
/* Thread-local "why" for the last failure; see tutti/error.h. */
#include <stdarg.h>
#include <stdio.h>

#include "tutti/error.h"

static __thread char tt_msg[512];

const char *tt_errmsg(void)
{
	return tt_msg;
}

int tt_seterr(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tt_msg, sizeof(tt_msg), fmt, ap);
	va_end(ap);
	return err;
}

void tt_clearerr(void)
{
	tt_msg[0] = '\0';
}
