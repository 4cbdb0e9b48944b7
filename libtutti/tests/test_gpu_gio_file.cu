// SPDX-License-Identifier: Apache-2.0
//
// Description: gio_uring over file-backed namespaces: a real file, one on
// tmpfs (pinned in place, and with TUTTI_EMU_FILE_MAP=0; read-write and
// read-only), and how long pinning a large tmpfs namespace takes; every
// transfer bit-exact against the file's bytes. The in-memory namespaces,
// SGL/PRP, rings and errors: test_gpu_gio.cu. Without a GPU:
// "1..0 # SKIP no CUDA device".
//
// Build: nvcc -std=c++17 -arch=sm_90 -Ilibtutti/include libtutti/tests/test_gpu_gio_file.cu
//        -Llibtutti_gpu ... (scripts/gpu/h200_run.sh builds every test_gpu_*.cu)

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <fcntl.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "tap.h"
#include "gpu_rig.cuh"

// A real file behind the namespace.
static void file_backed(void)
{
	const uint32_t n = 1024, obj = 16 * KIB;
	uint64_t bytes = (uint64_t)n * obj;
	char path[] = "/tmp/tutti_gio_XXXXXX";
	int fd = mkstemp(path);
	struct tt_emu_params p = base_params(4, 64, TT_EMU_FILE, bytes, false);
	struct gpu_rig r;
	char *src, *dst;

	if (!tap_ok(fd >= 0 && ftruncate(fd, (off_t)bytes) == 0, "file: temp file %s", path))
		return;
	unlink(path);
	p.fds = &fd;
	if (!tap_ok(gpu_rig_open(&r, &p, 4) == 0, "file: open"))
		return;
	cudaMalloc(&src, bytes);
	cudaMalloc(&dst, bytes);
	gpu_fill(src, bytes, 77);
	cudaMemset(dst, 0, bytes);
	tap_eq(run_iocbs(&r, gpu_linear_iocbs(src, n, obj, TT_NVME_CMD_WRITE, 0), nullptr), 0,
	       "file: %u PRP writes succeed", n);
	{
		std::vector<char> f(bytes), s(bytes);

		tap_ok(pread(fd, f.data(), bytes, 0) == (ssize_t)bytes, "file: pread whole file");
		cudaMemcpy(s.data(), src, bytes, cudaMemcpyDeviceToHost);
		tap_ok(std::memcmp(f.data(), s.data(), bytes) == 0, "file: file holds the GPU buffer");
	}
	tap_eq(run_iocbs(&r, gpu_linear_iocbs(dst, n, obj, TT_NVME_CMD_READ, 0), nullptr), 0,
	       "file: %u reads succeed", n);
	tap_ok(gpu_dev_equal(dst, src, bytes), "file: read back bit-exact");
	gpu_rig_close(&r);
	close(fd);
	cudaFree(src);
	cudaFree(dst);
}

// Every byte of the @bytes-long file behind @fd equals @dev's.
static bool file_equals_dev(int fd, const void *dev, uint64_t bytes)
{
	std::vector<char> f(bytes), d(bytes);

	if (pread(fd, f.data(), bytes, 0) != (ssize_t)bytes)
		return false;
	cudaMemcpy(d.data(), dev, bytes, cudaMemcpyDefault);
	return std::memcmp(f.data(), d.data(), bytes) == 0;
}

static bool shm_is_tmpfs(uint64_t need)
{
	struct statfs sf;

	return statfs("/dev/shm", &sf) == 0 && sf.f_type == 0x01021994 &&
	       (uint64_t)sf.f_bavail * sf.f_bsize >= need;
}

// A namespace file on tmpfs (/dev/shm), @map: TUTTI_EMU_FILE_MAP. Reads the
// file's contents into HBM, writes a GPU buffer over it (pread sees it),
// reads that back; 32 KiB commands plus one of 8 MiB, larger than a bounce
// buffer. Then a second controller over an O_RDONLY fd reads it again.
static void file_tmpfs(const char *map)
{
	const uint32_t n = 512, obj = 32 * KIB, big = 8 * MIB;
	uint64_t bytes = (uint64_t)n * obj + big;
	char path[] = "/dev/shm/tutti_gio_XXXXXX";
	struct tt_emu_params p = base_params(4, 64, TT_EMU_FILE, bytes, true);
	struct gpu_rig r;
	std::vector<char> init(bytes);
	std::mt19937_64 rng(5);
	char *src, *dst;
	int fd, rfd, mode, want = std::strcmp(map, "0") ? 3 : 0;

	if (!shm_is_tmpfs(2 * bytes)) {
		tap_skip("file tmpfs map=%s: /dev/shm is not tmpfs or is full", map);
		return;
	}
	fd = mkstemp(path);
	for (uint64_t i = 0; i < bytes / 8; i++)
		((uint64_t *)init.data())[i] = rng();
	if (!tap_ok(fd >= 0 && pwrite(fd, init.data(), bytes, 0) == (ssize_t)bytes,
		    "file tmpfs map=%s: %s filled", map, path))
		return;
	p.fds = &fd;
	setenv("TUTTI_EMU_FILE_MAP", map, 1);
	if (!tap_ok(gpu_rig_open(&r, &p, 4) == 0, "file tmpfs map=%s: open", map)) {
		unlink(path);
		return;
	}
	mode = tt_emu_ns_mapped(r.emu, 1);
	tap_eq(mode, want, "file tmpfs map=%s: namespace mode %d", map, mode);
	cudaMalloc(&src, bytes);
	cudaMalloc(&dst, bytes);
	gpu_fill(src, bytes, 31);
	cudaMemset(dst, 0, bytes);
	std::vector<tt_gio_iocb> rd = gpu_linear_iocbs(dst, n, obj, TT_NVME_CMD_READ, 0);
	std::vector<tt_gio_iocb> wr = gpu_linear_iocbs(src, n, obj, TT_NVME_CMD_WRITE, 0);
	rd.push_back(rd[0]);
	rd.back().lba = (uint64_t)n * obj / 4096;
	rd.back().seg[0].addr = (uint64_t)(uintptr_t)dst + (uint64_t)n * obj;
	rd.back().seg[0].len = big;
	wr.push_back(rd.back());
	wr.back().op = TT_NVME_CMD_WRITE;
	wr.back().seg[0].addr = (uint64_t)(uintptr_t)src + (uint64_t)n * obj;
	tap_eq(run_iocbs(&r, rd, nullptr), 0, "file tmpfs map=%s: %u reads succeed", map,
	       n + 1);
	tap_ok(file_equals_dev(fd, dst, bytes),
	       "file tmpfs map=%s: HBM holds exactly the file", map);
	tap_eq(run_iocbs(&r, wr, nullptr), 0, "file tmpfs map=%s: %u writes succeed", map,
	       n + 1);
	tap_ok(file_equals_dev(fd, src, bytes),
	       "file tmpfs map=%s: pread of the file sees the GPU writes", map);
	cudaMemset(dst, 0, bytes);
	tap_eq(run_iocbs(&r, rd, nullptr), 0, "file tmpfs map=%s: reads again", map);
	tap_ok(gpu_dev_equal(dst, src, bytes), "file tmpfs map=%s: read back bit-exact", map);
	gpu_rig_close(&r);

	// Read-only: mapped for reads where read-only registration is
	// supported (1), else the bounce (0); the data is the same.
	rfd = open(path, O_RDONLY);
	p.fds = &rfd;
	if (tap_ok(rfd >= 0 && gpu_rig_open(&r, &p, 4) == 0,
		   "file tmpfs read-only map=%s: open", map)) {
		mode = tt_emu_ns_mapped(r.emu, 1);
		tap_ok(mode == 0 || (want && mode == 1),
		       "file tmpfs read-only map=%s: mode %d", map, mode);
		cudaMemset(dst, 0, bytes);
		tap_eq(run_iocbs(&r, rd, nullptr), 0,
		       "file tmpfs read-only map=%s: reads succeed", map);
		tap_ok(file_equals_dev(fd, dst, bytes),
		       "file tmpfs read-only map=%s: HBM holds exactly the file", map);
		gpu_rig_close(&r);
	}
	if (rfd >= 0)
		close(rfd);
	unsetenv("TUTTI_EMU_FILE_MAP");
	unlink(path);
	close(fd);
	cudaFree(src);
	cudaFree(dst);
}

// How long pinning a 1 GiB tmpfs namespace takes (sparse: registration
// also allocates its pages), against opening with TUTTI_EMU_FILE_MAP=0.
static void file_tmpfs_open_time(void)
{
	const uint64_t bytes = 1024 * MIB;
	char path[] = "/dev/shm/tutti_gio_XXXXXX";
	struct tt_emu_params p = base_params(4, 64, TT_EMU_FILE, bytes, true);
	struct tt_emu *e = nullptr;
	double secs[2] = {0, 0};
	int fd, i, mode = -1;

	if (!shm_is_tmpfs(2 * bytes)) {
		tap_skip("file tmpfs open time: no tmpfs with 2 GiB free at /dev/shm");
		return;
	}
	fd = mkstemp(path);
	if (!tap_ok(fd >= 0 && ftruncate(fd, (off_t)bytes) == 0, "file tmpfs 1 GiB: %s", path))
		return;
	unlink(path);
	p.fds = &fd;
	for (i = 0; i < 2; i++) {
		setenv("TUTTI_EMU_FILE_MAP", i ? "1" : "0", 1);
		auto t0 = std::chrono::steady_clock::now();
		if (!tap_ok(tt_emu_open(&p, &e) == 0, "file tmpfs 1 GiB: open, map=%d", i))
			break;
		secs[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
				  .count();
		if (i)
			mode = tt_emu_ns_mapped(e, 1);
		tt_emu_close(e);
	}
	unsetenv("TUTTI_EMU_FILE_MAP");
	tap_eq(mode, 3, "file tmpfs 1 GiB: mapped");
	tap_diag("file tmpfs 1 GiB: tt_emu_open %.3f s mapped (sparse file), %.3f s with "
		 "TUTTI_EMU_FILE_MAP=0", secs[1], secs[0]);
	close(fd);
}

int main(void)
{
	gpu_require_device();
	file_backed();
	file_tmpfs("1");
	file_tmpfs("0");
	file_tmpfs_open_time();
	return tap_done();
}
