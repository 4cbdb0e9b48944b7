// SPDX-License-Identifier: Apache-2.0
//
// Description: the GPU library's environment, checked before anything is
// opened; host-only, so it runs without a GPU too (in CI). TUTTI_CUFILE naming
// a FIFO: dlopen of it would block for good (seen through tutti-admin gpu);
// the gds path now refuses it with a reason.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <sys/stat.h>
#include <unistd.h>

#include "tap.h"

#include <tutti/error.h>
#include <tutti/gds_path.h>

int main(void)
{
	char dir[] = "/tmp/tutti-gpu-env-XXXXXX";
	char fifo[sizeof(dir) + 16];
	struct tt_file_path_params p;
	struct tt_file_path *fp = nullptr;
	int rc;

	if (!mkdtemp(dir))
		return 1;
	std::snprintf(fifo, sizeof(fifo), "%s/cufile", dir);
	if (mkfifo(fifo, 0600))
		return 1;
	setenv("TUTTI_CUFILE", fifo, 1);
	alarm(30);	// a dlopen of the FIFO would block here: SIGALRM fails the test
	std::memset(&p, 0, sizeof(p));
	p.device = -1;
	rc = tt_file_path_open_gds(&p, &fp);
	tap_ok(rc == -ENOSYS && !fp, "TUTTI_CUFILE naming a FIFO: gds path refused (%d)", rc);
	tap_ok(std::strstr(tt_errmsg(), "not a regular file") != nullptr, "and says why: %s",
	       tt_errmsg());
	alarm(0);
	unlink(fifo);
	rmdir(dir);
	return tap_done();
}
