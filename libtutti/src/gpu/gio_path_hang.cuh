// SPDX-License-Identifier: Apache-2.0
//
// gio_path_hang.cuh - a wait with a timeout (TUTTI_GIO_WAIT_TIMEOUT_S) that dumps
// what tells the store gio path's hang suspects apart (docs/gpu.md, Known
// issues). Included once, by gio_path.cu, where struct gp_txn is known.
#ifndef TT_GIO_PATH_HANG_CUH
#define TT_GIO_PATH_HANG_CUH

#include "cuda_query.cuh"

static const char *gp_query_str(cudaEvent_t ev)
{
	return tt_cuda_query_name(cudaEventQuery(ev), "cudaSuccess", "cudaErrorNotReady");
}

static const char *gp_stream_str(cudaStream_t s)
{
	return tt_cuda_query_name(cudaStreamQuery(s), "idle", "busy");
}

static const char *gp_env(const char *name, const char *unset)
{
	const char *v = std::getenv(name);

	return v ? v : unset;
}

// Poll @ev until done or @secs passed. Return: 0, -EIO or -ETIMEDOUT.
static int gp_poll_event(cudaEvent_t ev, double secs)
{
	auto t0 = std::chrono::steady_clock::now();
	cudaError_t r;

	while ((r = cudaEventQuery(ev)) == cudaErrorNotReady) {
		std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0;

		if (d.count() > secs)
			return -ETIMEDOUT;
		std::this_thread::sleep_for(std::chrono::microseconds(200));
	}
	return gp_err(r);
}

// Everything that tells the hang's suspects apart, on stderr (docs/gpu.md,
// Known issues: how to run the diagnosis).
static void gp_hang_report(const struct gp_txn *t, uint32_t layer, const char *where,
			   double waited)
{
	const struct tt_gio_path *p = t->p;
	FILE *f = stderr;
	static const char *st_names[] = {"idle", "submitted", "failed"};

	std::fprintf(f, "tutti gio_path: HANG (report %u of this transaction): %s: layer %u of a "
		     "%s transaction (%u blocks, %u moving) not done after %.1f s\n", t->hung + 1,
		     where, layer, t->write ? "write" : "read", t->n, t->nm, waited);
	std::fprintf(f, "gio_path: CUDA_MODULE_LOADING=%s | streams: io %s, sum %s | ev_begin %s\n",
		     gp_env("CUDA_MODULE_LOADING", "(unset: LAZY)"), gp_stream_str(p->io),
		     gp_stream_str(p->sum), gp_query_str(t->ev_begin));
	for (uint32_t l = 0; l < t->geo.n_layers; l++) {
		uint8_t s = t->st[l];

		std::fprintf(f, "gio_path layer %u: %s | ev_io %s | ev_done %s | failed commands "
			     "(host copy) %u\n", l, s <= GP_FAILED ? st_names[s] : "?",
			     s == GP_IDLE || t->write || t->nm == 0 ? "(not recorded)" :
			     gp_query_str(t->ev_io[l]),
			     s == GP_IDLE ? "(not recorded)" : gp_query_str(t->ev_done[l]),
			     t->h_lerr[l]);
	}
	std::fflush(f);
	// Host reads first: a device copy that blocks in the runtime (not
	// just never finishes) must not cost the controller's side.
	if (p->emu)
		tt_emu_dump(p->emu, f);
	else
		std::fprintf(f, "gio_path: no emulated controller of the path's own to dump\n");
	tt_gio_dump(p->g, f);
	for (uint32_t l = 0; l < t->geo.n_layers; l++) {
		if (t->st[l] == GP_IDLE || !t->nm)
			continue;
		std::fprintf(f, "gio_path layer %u", l);
		tt_gio_batch_dump(t->b[l], f);
	}
	std::fprintf(f, "tutti gio_path: end of hang report\n");
	std::fflush(f);
}

// Wait for @ev with the timeout; once the transaction hung, later waits get
// 1 s, and only the first two timeouts dump (the second shows what moved).
static int gp_timed(struct gp_txn *t, cudaEvent_t ev, uint32_t layer, const char *where)
{
	double secs = t->hung ? 1.0 : t->p->wait_timeout_s;
	int rc = gp_poll_event(ev, secs);

	if (rc != -ETIMEDOUT)
		return rc;
	if (t->hung < 2)
		gp_hang_report(t, layer, where, secs);
	t->hung++;
	return tt_seterr(-ETIMEDOUT, "gio path: %s: layer %u not done after %.1f s "
			 "(TUTTI_GIO_WAIT_TIMEOUT_S; state dumped on stderr)", where, layer, secs);
}

#endif /* TT_GIO_PATH_HANG_CUH */
