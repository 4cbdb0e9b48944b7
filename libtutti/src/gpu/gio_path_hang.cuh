// SPDX-License-Identifier: Apache-2.0
//
// gio_path_hang.cuh - the store gio path's bounded waits. Waits block in
// cudaEventSynchronize, as before; a watchdog thread per path watches the
// work in flight (the lists' upload, each layer: its event), and work older
// than TUTTI_GIO_WAIT_TIMEOUT_S (default 60 s) makes it dump what tells a
// hang's suspects apart (docs/gpu.md, Known issues) and fence the path: its
// controller aborts every command, so the kernels, the store's waits and
// compute streams ordered after a layer all go on. Included
// once, by gio_path.cu, where struct gp_txn is known.
#ifndef TT_GIO_PATH_HANG_CUH
#define TT_GIO_PATH_HANG_CUH

#include <algorithm>

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

// The fence of a hang: the path's own controller aborts every command
// (what deleting a real queue does), so the kernels waiting on completions
// finish and the streams ordered after them go on; the path refuses new
// transactions. A path on a controller it does not own can only refuse.
static void gp_fence(struct tt_gio_path *p)
{
	p->dead.store(true);
	if (p->emu)
		tt_emu_abort(p->emu);
}

// Watch @ev (recorded just now for @t's @layer) until it completes.
static void gp_fly(struct gp_txn *t, uint32_t layer, cudaEvent_t ev, const char *what)
{
	struct tt_gio_path *p = t->p;
	bool was_idle;

	{
		std::lock_guard<std::mutex> lk(p->wd_mu);

		was_idle = p->flights.empty();
		p->flights.push_back({t, layer, ev, what, std::chrono::steady_clock::now(), false,
				      false});
	}
	if (was_idle)
		p->wd_cv.notify_one();
}

// @t ended (every event of it done): stop watching it; its state goes back
// to the pool and its events will be recorded again.
static void gp_land(struct gp_txn *t)
{
	struct tt_gio_path *p = t->p;
	std::lock_guard<std::mutex> lk(p->wd_mu);

	p->flights.erase(std::remove_if(p->flights.begin(), p->flights.end(),
					[t](const struct gp_flight &f) { return f.t == t; }),
			 p->flights.end());
}

// One watchdog round (lock held): forget what completed; fence for work in
// flight longer than the timeout, and say once of each that the fence did
// not bring it back within GP_DRAIN_S.
static void gp_watch_round(struct tt_gio_path *p)
{
	auto now = std::chrono::steady_clock::now();

	for (size_t i = 0; i < p->flights.size();) {
		struct gp_flight &f = p->flights[i];
		double secs = std::chrono::duration<double>(now - f.since).count();

		if (tt_cuda_reached(cudaEventQuery(f.ev))) {
			p->flights.erase(p->flights.begin() + i);
			continue;
		}
		i++;
		if (!f.fenced && secs > p->wait_timeout_s) {
			f.fenced = true;
			f.t->fenced = true;
			if (p->dead.load())	// fenced already: its abort is on the way
				continue;
			gp_hang_report(f.t, f.layer, f.what, secs);
			f.t->hung++;
			std::fprintf(stderr, "tutti gio_path: fenced: %s\n", p->emu ?
				     "its controller aborts every command; the waits end as the "
				     "aborted commands come back" : "no controller of its own to abort: "
				     "the path refuses new transactions, this work may never end");
			gp_fence(p);
		} else if (f.fenced && !f.stuck_said && secs > p->wait_timeout_s + GP_DRAIN_S) {
			f.stuck_said = true;
			if (f.t->hung < 2) {	// the second report shows what the fence moved
				gp_hang_report(f.t, f.layer, f.what, secs);
				f.t->hung++;
			}
			std::fprintf(stderr, "tutti gio_path: %s %u still not back %.0f s after the "
				     "fence: the controller cannot even abort (its data movement is "
				     "stuck). Waits go on: returning would hand back memory a late "
				     "copy can still write.\n", f.what, f.layer, GP_DRAIN_S);
		}
	}
}

static void gp_watchdog_run(struct tt_gio_path *p)
{
	std::unique_lock<std::mutex> lk(p->wd_mu);
	bool dev_set = false;

	while (!p->wd_stop) {
		// Idle: sleep until work is in flight; else look every quarter timeout.
		if (p->flights.empty())
			p->wd_cv.wait(lk);
		else
			p->wd_cv.wait_for(lk, std::chrono::duration<double>(
					  std::min(p->wait_timeout_s / 4, 0.5)));
		if (p->wd_stop || p->flights.empty())
			continue;
		if (!dev_set) {		// its queries and the report's: the path's device
			cudaSetDevice(p->device);
			dev_set = true;
		}
		gp_watch_round(p);
	}
}

// Block until @ev is done, as cudaEventSynchronize. Bounded by the
// watchdog: @ev is in flight (gp_fly), and past the path's timeout the
// fence's aborted commands end the wait. Return: 0, -EIO (CUDA error),
// -ETIMEDOUT (the watchdog fenced @t).
static int gp_block(struct gp_txn *t, cudaEvent_t ev, uint32_t layer, const char *where)
{
	struct tt_gio_path *p = t->p;
	cudaError_t r = cudaEventQuery(ev);
	bool fenced;

	if (r == cudaErrorNotReady)
		r = cudaEventSynchronize(ev);
	{
		std::lock_guard<std::mutex> lk(p->wd_mu);

		fenced = t->fenced;
	}
	if (fenced)
		return tt_seterr(-ETIMEDOUT, "gio path: %s: layer %u: the transaction had work "
				 "not done after %.1f s: the path was fenced (TUTTI_GIO_WAIT_TIMEOUT_S; "
				 "state dumped on stderr)", where, layer, p->wait_timeout_s);
	return gp_err(r);
}

static void gp_watchdog_start(struct tt_gio_path *p)
{
	p->wd_stop = false;
	p->watchdog = std::thread(gp_watchdog_run, p);
}

static void gp_watchdog_stop(struct tt_gio_path *p)
{
	if (!p->watchdog.joinable())
		return;
	{
		std::lock_guard<std::mutex> lk(p->wd_mu);

		p->wd_stop = true;
	}
	p->wd_cv.notify_one();
	p->watchdog.join();
}

#endif /* TT_GIO_PATH_HANG_CUH */
