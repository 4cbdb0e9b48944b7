// SPDX-License-Identifier: Apache-2.0
//
// gds_path.cu - the GDS data path's backend: cuFileRead/cuFileWrite of
// whole runs straight into/out of the device chunks. libcufile.so.0 is
// opened with dlopen so the library builds and runs without it (-ENOSYS).
// The pipeline (runs, threads, kernels, hashing) is file_pipe.cu.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <dlfcn.h>
#include <sys/stat.h>

#include "tutti/error.h"
#include "tutti/gds_path.h"
#include "cufile_min.h"
#include "file_pipe.cuh"

static struct tt_cufile_api cf;
static int cf_state;		// 0 not tried, 1 loaded, < 0 error
static char cf_why[256];
static std::once_flag cf_once;

static void *cf_sym(void *h, const char *name)
{
	void *f = dlsym(h, name);

	if (!f && !cf_state) {
		cf_state = -ENOSYS;
		snprintf(cf_why, sizeof(cf_why), "libcufile.so.0 lacks %s", name);
	}
	return f;
}

// TUTTI_CUFILE names the library; else the loader's path, then the
// toolkit's own folder (often not on the loader's path). A path that is no
// regular file is refused before dlopen: opening a FIFO blocks for good.
static void *cf_dlopen(bool *refused)
{
	const char *env = getenv("TUTTI_CUFILE");
	struct stat st;
	void *h;

	*refused = false;
	if (env && *env && strchr(env, '/') && (stat(env, &st) || !S_ISREG(st.st_mode))) {
		*refused = true;
		return nullptr;
	}
	h = dlopen(env && *env ? env : "libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
	if (!h && !(env && *env))
		h = dlopen("/usr/local/cuda/lib64/libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
	return h;
}

// Close the driver at exit while CUDA still works: cuFile's implicit close
// at unload makes CUDA calls after the runtime's teardown, a reported way
// for cuFile programs to die with SIGSEGV after main returns (cudf#17121).
// Registered after the runtime was initialised, so atexit runs it first.
// Only the reference-counted _v2 close: the old one would tear the driver
// down under other users in the process.
static void cf_close_at_exit(void)
{
	if (cf.driver_close)
		cf.driver_close();
}

static void cf_load(void)
{
	bool refused;
	void *h = cf_dlopen(&refused);

	if (refused) {
		cf_state = -ENOSYS;
		snprintf(cf_why, sizeof(cf_why), "GDS unavailable: TUTTI_CUFILE=%s is not a "
			 "regular file (a library file is needed)", getenv("TUTTI_CUFILE"));
		return;
	}
	if (!h) {
		cf_state = -ENOSYS;
		snprintf(cf_why, sizeof(cf_why), "GDS unavailable: libcufile.so.0 is neither on "
			 "the loader's path nor in /usr/local/cuda/lib64 (TUTTI_CUFILE names it): %s",
			 dlerror());
		return;
	}
	*(void **)&cf.driver_open = cf_sym(h, "cuFileDriverOpen");
	*(void **)&cf.handle_register = cf_sym(h, "cuFileHandleRegister");
	*(void **)&cf.handle_deregister = cf_sym(h, "cuFileHandleDeregister");
	*(void **)&cf.buf_register = cf_sym(h, "cuFileBufRegister");
	*(void **)&cf.buf_deregister = cf_sym(h, "cuFileBufDeregister");
	*(void **)&cf.read = cf_sym(h, "cuFileRead");
	*(void **)&cf.write = cf_sym(h, "cuFileWrite");
	*(void **)&cf.driver_close = dlsym(h, "cuFileDriverClose_v2");	// optional
	if (cf_state)
		return;
	// cuFileDriverOpen fails in a process that has made no CUDA call yet.
	if (cudaFree(nullptr) != cudaSuccess) {
		cf_state = -EIO;
		snprintf(cf_why, sizeof(cf_why), "GDS: no CUDA device");
		return;
	}
	// Open for the rest of the process (other users, PyTorch or KvikIO,
	// may share it: the _v2 close counts references), closed at exit.
	struct tt_cufile_error e = cf.driver_open();

	if (e.err != TT_CU_FILE_SUCCESS) {
		cf_state = -EIO;
		snprintf(cf_why, sizeof(cf_why), "cuFileDriverOpen failed: cuFile error %d "
			 "(CUDA %d)", e.err, e.cu_err);
		return;
	}
	if (cf.driver_close)
		atexit(cf_close_at_exit);
	cf_state = 1;
}

// Chunks registered with cuFile skip its per-call pinning of GPU memory.
static int gds_init(struct tt_file_path *fp)
{
	for (struct fp_worker &w : fp->w)
		for (struct fp_chunk &c : w.chunks)
			c.registered = cf.buf_register(c.dev, fp->chunk_bytes, 0).err ==
				       TT_CU_FILE_SUCCESS;
	return 0;
}

static void gds_fini(struct tt_file_path *fp)
{
	for (struct fp_worker &w : fp->w)
		for (struct fp_chunk &c : w.chunks)
			if (c.registered) {
				cf.buf_deregister(c.dev);
				c.registered = 0;
			}
}

static int gds_txn_open(struct fp_txn *t)
{
	for (uint32_t m = 0; m < t->geo.n_members; m++) {
		struct tt_cufile_descr d;
		struct tt_cufile_error e;

		memset(&d, 0, sizeof(d));
		d.type = TT_CU_FILE_HANDLE_TYPE_OPAQUE_FD;
		d.handle.fd = t->fds[m];
		e = cf.handle_register(&t->fh[m], &d);
		if (e.err != TT_CU_FILE_SUCCESS) {
			tt_seterr(-EIO, "gds path: cuFileHandleRegister (member %u, fd %d) failed: "
				  "cuFile error %d (CUDA %d); cufile.log says why", m, t->fds[m],
				  e.err, e.cu_err);
			while (m--)
				cf.handle_deregister(t->fh[m]);
			return -EIO;
		}
	}
	return 0;
}

static void gds_txn_close(struct fp_txn *t)
{
	for (uint32_t m = 0; m < t->geo.n_members; m++)
		cf.handle_deregister(t->fh[m]);
}

static int gds_io(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j, int write)
{
	uint64_t done = 0;

	while (done < j->len) {
		ssize_t r = write ? cf.write(t->fh[j->member], c->dev, j->len - done,
					     (off_t)(j->off + done), (off_t)done)
				  : cf.read(t->fh[j->member], c->dev, j->len - done,
					    (off_t)(j->off + done), (off_t)done);

		if (r <= 0)
			return r == -1 && errno ? -errno : -EIO;
		done += (uint64_t)r;
	}
	return 0;
}

static int gds_get(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j)
{
	return gds_io(t, c, j, 0);
}

static int gds_put(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j)
{
	return gds_io(t, c, j, 1);
}

static const struct fp_backend gds_backend = {
	.name = "gds",
	.host_chunks = 0,
	.init = gds_init,
	.fini = gds_fini,
	.txn_open = gds_txn_open,
	.txn_close = gds_txn_close,
	.get = gds_get,
	.to_dev = nullptr,
	.from_dev = nullptr,
	.put = gds_put,
};

int tt_file_path_open_gds(const struct tt_file_path_params *p, struct tt_file_path **out)
{
	std::call_once(cf_once, cf_load);
	if (cf_state < 0)
		return tt_seterr(cf_state, "%s", cf_why);
	return fp_open(p, &gds_backend, nullptr, out);
}

const struct tt_devpath_ops tt_devpath_gds = {
	.name = "gds",
	.begin = fp_begin,
	.layer = fp_layer,
	.order = fp_order,
	.wait = fp_wait,
	.collect = fp_collect,
	.end = fp_end,
	.flush = nullptr,	// compat mode writes with pwrite; GDS by DMA: fdatasync covers both
	.poll = fp_poll,
};
