// SPDX-License-Identifier: Apache-2.0
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

void *tt_alloc_aligned(size_t len)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, TT_ALIGN_UP(len ? len : 1, 4096)))
		return NULL;
	memset(p, 0, TT_ALIGN_UP(len ? len : 1, 4096));
	return p;
}

uint64_t tt_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
