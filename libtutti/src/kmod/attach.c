// SPDX-License-Identifier: Apache-2.0
/*
 * Handing a PCI NVMe controller to tutti.ko and back, through sysfs:
 * unbind from the current driver, driver_override, bind.  A controller
 * whose namespaces are in use (mounted, swap, held by dm/md) is refused
 * before anything changes.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tutti/error.h"
#include "tutti/kqueue.h"

#define PCI_DEVS "/sys/bus/pci/devices"

static int write_str(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	ssize_t n;
	int err;

	if (fd < 0)
		return -errno;
	n = write(fd, s, strlen(s));
	err = n < 0 ? -errno : 0;
	close(fd);
	return err;
}

static int read_str(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -errno;
	buf[n] = 0;
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = 0;
	return 0;
}

/* Name of the driver bound to @bdf ("" if none). */
static void bound_driver(const char *bdf, char *drv, size_t len)
{
	char link[PATH_MAX], path[PATH_MAX];
	ssize_t n;

	snprintf(path, sizeof(path), PCI_DEVS "/%s/driver", bdf);
	n = readlink(path, link, sizeof(link) - 1);
	drv[0] = 0;
	if (n > 0) {
		link[n] = 0;
		snprintf(drv, len, "%.63s", strrchr(link, '/') ? strrchr(link, '/') + 1 : link);
	}
}

/* Is block device @name (major:minor in @dev) mounted or swapped on? */
static int dev_in_use(const char *name, const char *dev, char *why, size_t len)
{
	char line[4096], holders[PATH_MAX];
	FILE *f = fopen("/proc/self/mountinfo", "re");
	DIR *d;

	while (f && fgets(line, sizeof(line), f)) {
		char mnt[PATH_MAX], majmin[64];

		if (sscanf(line, "%*s %*s %63s %*s %4095s", majmin, mnt) == 2 &&
		    !strcmp(majmin, dev)) {
			snprintf(why, len, "/dev/%.64s is mounted on %.1024s", name, mnt);
			fclose(f);
			return 1;
		}
	}
	if (f)
		fclose(f);
	f = fopen("/proc/swaps", "re");
	while (f && fgets(line, sizeof(line), f)) {
		char dname[PATH_MAX];

		if (sscanf(line, "%4095s", dname) == 1 && strrchr(dname, '/') &&
		    !strcmp(strrchr(dname, '/') + 1, name)) {
			snprintf(why, len, "/dev/%.64s is in use as swap", name);
			fclose(f);
			return 1;
		}
	}
	if (f)
		fclose(f);
	snprintf(holders, sizeof(holders), "/sys/class/block/%s/holders", name);
	d = opendir(holders);
	if (d) {
		struct dirent *de;

		while ((de = readdir(d))) {
			if (de->d_name[0] == '.')
				continue;
			snprintf(why, len, "/dev/%.64s is held by %.64s", name, de->d_name);
			closedir(d);
			return 1;
		}
		closedir(d);
	}
	return 0;
}

/* Any block device (namespace or partition) below @bdf in use? */
static int ctrl_in_use(const char *bdf, char *why, size_t len)
{
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d;
	int busy = 0;

	snprintf(path, sizeof(path), "/sys/class/block");
	d = opendir(path);
	if (!d)
		return 0;
	while (!busy && (de = readdir(d))) {
		char link[PATH_MAX], dev[64], p[PATH_MAX + 300];
		ssize_t n;

		if (de->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "/sys/class/block/%s", de->d_name);
		n = readlink(p, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		/* .../devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1[/nvme0n1p1] */
		if (!strstr(link, bdf))
			continue;
		snprintf(p, sizeof(p), "/sys/class/block/%s/dev", de->d_name);
		if (read_str(p, dev, sizeof(dev)))
			continue;
		busy = dev_in_use(de->d_name, dev, why, len);
	}
	closedir(d);
	return busy;
}

static int check_bdf(const char *bdf)
{
	char path[PATH_MAX], cls[32];

	if (!bdf || !*bdf || strchr(bdf, '/') || strlen(bdf) > 32)
		return tt_seterr(-EINVAL, "'%s' is not a PCI address", bdf ? bdf : "");
	snprintf(path, sizeof(path), PCI_DEVS "/%s/class", bdf);
	if (read_str(path, cls, sizeof(cls)))
		return tt_seterr(-ENODEV, "%s: no such PCI device", bdf);
	if (strcmp(cls, "0x010802"))
		return tt_seterr(-ENODEV, "%s: not an NVMe controller (class %s)", bdf, cls);
	return 0;
}

int tt_kmod_attach(const char *bdf)
{
	char path[PATH_MAX], drv[64], why[PATH_MAX + 64];
	int ret = check_bdf(bdf);

	if (ret)
		return ret;
	if (access("/sys/bus/pci/drivers/tutti", F_OK))
		return tt_seterr(-ENOENT, "tutti.ko is not loaded (insmod tutti.ko or modprobe tutti)");
	bound_driver(bdf, drv, sizeof(drv));
	if (!strcmp(drv, "tutti"))
		return 0;
	if (ctrl_in_use(bdf, why, sizeof(why)))
		return tt_seterr(-EBUSY, "%s: refusing to attach: %s", bdf, why);
	if (*drv) {
		snprintf(path, sizeof(path), PCI_DEVS "/%s/driver/unbind", bdf);
		ret = write_str(path, bdf);
		if (ret)
			return tt_seterr(ret, "%s: unbinding from %s: %s", bdf, drv, strerror(-ret));
	}
	snprintf(path, sizeof(path), PCI_DEVS "/%s/driver_override", bdf);
	ret = write_str(path, "tutti");
	if (ret)
		return tt_seterr(ret, "%s: driver_override: %s", bdf, strerror(-ret));
	ret = write_str("/sys/bus/pci/drivers/tutti/bind", bdf);
	bound_driver(bdf, drv, sizeof(drv));
	if (ret || strcmp(drv, "tutti"))
		return tt_seterr(ret ? ret : -EIO, "%s: tutti.ko did not bind (%s): see dmesg",
				 bdf, ret ? strerror(-ret) : "no driver");
	return 0;
}

int tt_kmod_detach(const char *bdf)
{
	char path[PATH_MAX], drv[64];
	int ret = check_bdf(bdf);

	if (ret)
		return ret;
	bound_driver(bdf, drv, sizeof(drv));
	if (!strcmp(drv, "tutti")) {
		ret = write_str("/sys/bus/pci/drivers/tutti/unbind", bdf);
		if (ret)
			return tt_seterr(ret, "%s: unbinding from tutti: %s", bdf, strerror(-ret));
	}
	snprintf(path, sizeof(path), PCI_DEVS "/%s/driver_override", bdf);
	write_str(path, "\n");
	if (!access("/sys/bus/pci/drivers/nvme", F_OK)) {
		ret = write_str("/sys/bus/pci/drivers/nvme/bind", bdf);
		if (ret && ret != -EBUSY && ret != -ENODEV)
			return tt_seterr(ret, "%s: binding nvme: %s", bdf, strerror(-ret));
	} else {
		write_str("/sys/bus/pci/drivers_probe", bdf);
	}
	return 0;
}
