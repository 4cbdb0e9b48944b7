// SPDX-License-Identifier: GPL-2.0
/*
 * A do-nothing module the HIL harness builds (with W=1) and loads on every kernel, so the
 * build-and-insmod plumbing is proven even before kmod/ exists.
 */
#include <linux/init.h>
#include <linux/module.h>

static int __init hil_selftest_init(void)
{
	pr_info("hil_selftest: loaded\n");
	return 0;
}

static void __exit hil_selftest_exit(void)
{
	pr_info("hil_selftest: unloaded\n");
}

module_init(hil_selftest_init);
module_exit(hil_selftest_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Tutti HIL harness self-test module");
