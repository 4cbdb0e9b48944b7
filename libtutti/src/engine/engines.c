// SPDX-License-Identifier: Apache-2.0
/*
 * The built-in engines: the only place that names them. "auto" asks each
 * in this order (engine.c); a wrapper engine is one more line here, or a
 * call to tt_engine_add().
 */
#include "engine_impl.h"

extern const struct tt_engine_ops tt_kqueue_ops;
extern const struct tt_engine_ops tt_uring_ops;
extern const struct tt_engine_ops tt_psync_ops;

const struct tt_engine_ops *const tt_engines[] = {
	&tt_kqueue_ops,		/* tutti.ko namespace nodes (native) */
	&tt_uring_ops,		/* files and block devices */
	&tt_psync_ops,		/* the same, where io_uring is unavailable */
	NULL,
};
