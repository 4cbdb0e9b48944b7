// SPDX-License-Identifier: Apache-2.0
/*
 * psync engine: each request is one preadv/pwritev, done inside submit.
 * The fallback where io_uring is unavailable; also a reference for tests.
 */
#include "engine_impl.h"

static int psync_init(struct tt_engine *e)
{
	(void)e;
	return 0;
}

static void psync_fini(struct tt_engine *e)
{
	(void)e;
}

static int psync_submit(struct tt_engine *e, struct tt_batch *b)
{
	struct tt_req r;

	while (b->next < b->n) {
		b->next += tt_next_req(e, b, b->next, &r);
		b->reqs++;
		tt_req_complete(e, &r, tt_req_sync(e, &r, 0));
	}
	return 0;
}

static int psync_reap(struct tt_engine *e, int wait)
{
	(void)e;
	(void)wait;
	return 0;
}

static int psync_probe(const int *fds, unsigned n)
{
	(void)fds;
	(void)n;
	return TT_ENGINE_GENERIC;
}

const struct tt_engine_ops tt_psync_ops = {
	.name = "psync",
	.probe = psync_probe,
	.init = psync_init,
	.fini = psync_fini,
	.submit = psync_submit,
	.reap = psync_reap,
	.preads = 1,
};
