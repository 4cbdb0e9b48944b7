// SPDX-License-Identifier: Apache-2.0
//
// staged_path.cu - the staged data path's backend: pread/pwrite of whole
// runs into pinned chunks, one async copy between chunk and device chunk.
// The pipeline (runs, threads, kernels, hashing) is file_pipe.cu.
#include <cerrno>

#include <unistd.h>

#include "tutti/error.h"
#include "file_pipe.cuh"

// Whole-run pread/pwrite; O_DIRECT or buffered, short transfers finished.
static int staged_pio(int fd, void *buf, uint32_t len, uint64_t off, int write)
{
	uint64_t done = 0;

	while (done < len) {
		ssize_t r = write ? pwrite(fd, (char *)buf + done, len - done, (off_t)(off + done))
				  : pread(fd, (char *)buf + done, len - done, (off_t)(off + done));

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -EIO;	// past the end of the member
		done += (uint64_t)r;
	}
	return 0;
}

static int staged_get(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j)
{
	return staged_pio(t->fds[j->member], c->host, j->len, j->off, 0);
}

static int staged_put(struct fp_txn *t, struct fp_chunk *c, const struct fp_job *j)
{
	return staged_pio(t->fds[j->member], c->host, j->len, j->off, 1);
}

static int staged_to_dev(struct fp_chunk *c, uint32_t len, cudaStream_t s)
{
	return cudaMemcpyAsync(c->dev, c->host, len, cudaMemcpyHostToDevice, s) ? -EIO : 0;
}

static int staged_from_dev(struct fp_chunk *c, uint32_t len, cudaStream_t s)
{
	return cudaMemcpyAsync(c->host, c->dev, len, cudaMemcpyDeviceToHost, s) ? -EIO : 0;
}

static const struct fp_backend staged_backend = {
	.name = "staged",
	.host_chunks = 1,
	.init = nullptr,
	.fini = nullptr,
	.txn_open = nullptr,
	.txn_close = nullptr,
	.get = staged_get,
	.to_dev = staged_to_dev,
	.from_dev = staged_from_dev,
	.put = staged_put,
};

int tt_staged_open(const struct tt_file_path_params *p, struct tt_file_path **out)
{
	return fp_open(p, &staged_backend, nullptr, out);
}

const struct tt_devpath_ops tt_staged_ops = {
	.name = "staged",
	.begin = fp_begin,
	.layer = fp_layer,
	.order = fp_order,
	.wait = fp_wait,
	.collect = fp_collect,
	.end = fp_end,
	.flush = nullptr,	// pwrite: the store's fdatasync covers it
};
