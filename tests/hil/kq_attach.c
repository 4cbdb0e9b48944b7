// SPDX-License-Identifier: Apache-2.0
/*
 * Description: attach/detach a PCI NVMe controller to/from tutti.ko
 * (tt_kmod_attach/tt_kmod_detach), for the guest tests until tutti-admin
 * grows the verbs.  usage: kq_attach attach|detach BDF
 */
#include <stdio.h>
#include <string.h>

#include "tutti/error.h"
#include "tutti/kqueue.h"

int main(int argc, char **argv)
{
	int ret;

	if (argc != 3 || (strcmp(argv[1], "attach") && strcmp(argv[1], "detach"))) {
		fprintf(stderr, "usage: %s attach|detach BDF\n", argv[0]);
		return 2;
	}
	ret = !strcmp(argv[1], "attach") ? tt_kmod_attach(argv[2]) : tt_kmod_detach(argv[2]);
	if (ret) {
		fprintf(stderr, "%s %s: %s\n", argv[1], argv[2], tt_errmsg());
		return 1;
	}
	return 0;
}
