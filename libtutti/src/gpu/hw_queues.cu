// SPDX-License-Identifier: Apache-2.0
//
// hw_queues.cu - keep the emulated controller's copies out of the hardware
// work queues that GPU kernels spin in.
//
// CUDA maps every stream of a context onto CUDA_DEVICE_MAX_CONNECTIONS
// hardware queues (default 8, at most 32), fixed when the context is made.
// A queue runs its work in order, whatever stream it came from. The gio
// path's kernels spin until the emulated controller completes their
// commands, and the controller completes them with copies it queues on its
// own streams: a copy that lands in the same hardware queue behind a
// spinning kernel, or behind a stream waiting for one, never runs, and the
// kernel never ends. Seen on the H200 (docs/gpu.md): with the default 8
// queues the store's gio path hung (copies pending for 20 s, controller
// idle); the same binaries with 32 did not, with 1 at once. A real
// controller moves data itself, so only the emulated one needs this.
//
// So: at load, libtutti asks for 32 queues when nobody chose and no
// context exists yet (then the request is in time); tt_emu_open() refuses,
// with the reason, when the queues it gets are fewer.
#include <cstdlib>
#include <cstring>

#include <dlfcn.h>

#include "tutti/emu_ctrl.h"
#include "tutti/error.h"

static int hwq_late;	// a context existed before our request: default 8

// Whether the process already made a CUDA context (its queue count is
// then fixed): asked of libcuda only if something loaded and initialised it.
static bool hwq_context_exists()
{
	typedef int (*count_fn)(int *);
	typedef int (*state_fn)(int, unsigned *, int *);
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	count_fn count;
	state_fn state;
	int n = 0, active = 0;
	unsigned flags;
	bool found = false;

	if (!h)
		return false;
	count = (count_fn)dlsym(h, "cuDeviceGetCount");
	state = (state_fn)dlsym(h, "cuDevicePrimaryCtxGetState");
	// CUDA_ERROR_NOT_INITIALIZED (nonzero) before cuInit: no context.
	if (count && state && count(&n) == 0)
		for (int d = 0; d < n && !found; d++)
			found = state(d, &flags, &active) == 0 && active;
	dlclose(h);
	return found;
}

__attribute__((constructor)) static void hwq_request()
{
	if (std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"))
		return;		// the user's choice stands
	if (hwq_context_exists())
		hwq_late = 1;
	else
		setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
}

extern "C" int tt_gpu_hw_queues(void)
{
	const char *v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
	long n;

	if (hwq_late || !v || !*v)
		return 8;
	n = std::strtol(v, nullptr, 10);
	return n < 1 ? 1 : n > 32 ? 32 : (int)n;
}

extern "C" int tt_emu_check_hw_queues(void)
{
	int have = tt_gpu_hw_queues();
	const char *force = std::getenv("TUTTI_EMU_SHARED_QUEUES");

	if (have >= TT_EMU_HW_QUEUES || (force && !std::strcmp(force, "1")))
		return 0;
	return tt_seterr(-EDEADLK,
			 "the emulated controller needs %d CUDA hardware queues, this process has %d%s: "
			 "its copies could queue behind a kernel waiting for them and never run. "
			 "Set CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts (libtutti does when it "
			 "is loaded first; `import tutti.gpu` before using CUDA does too), or "
			 "TUTTI_EMU_SHARED_QUEUES=1 to run anyway",
			 TT_EMU_HW_QUEUES, have,
			 hwq_late ? " (CUDA was started before libtutti was loaded)" : "");
}
