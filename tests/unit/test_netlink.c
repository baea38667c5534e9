// SPDX-License-Identifier: Apache-2.0
/* Unit tests for ctl_netlink (ctrl/ctl_netlink.h): the device facts read from a sysfs tree made
 * here (an SR-IOV VF and its PF, a veth, a NIC without carrier or NUMA node), then the real
 * netlink lookups on this host's loopback and their errors. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctl_netlink.h"

static char root[64];

static void mkdirs(const char *rel)
{
	char path[512], *p;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		mkdir(path, 0755);
		*p = '/';
	}
	mkdir(path, 0755);
}

static void put(const char *rel, const char *text)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void link_to(const char *rel, const char *target)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	assert_int_equal(symlink(target, path), 0);
}

/*
 * A tree shaped like the kernel's:
 * - ens1f0v2: a VF (0000:02:10.4, igbvf) of PF 0000:02:00.0 (ens1f0) on NUMA node 1, 25 Gbit/s,
 *   two rx and three tx queues;
 * - veth0: no device, a made-up speed of 10000 (what veth reports);
 * - eno1: a NIC (e1000e) without carrier (speed -1 as the kernel gives it) and NUMA node -1;
 * - eno2: a NIC whose speed file cannot be read at all.
 */
static int tree_up(void **state)
{
	snprintf(root, sizeof(root), "/tmp/vmig-sysfs-XXXXXX");
	assert_non_null(mkdtemp(root));
	mkdirs("devices/pci0000:00/0000:02:00.0/net/ens1f0");
	mkdirs("devices/pci0000:00/0000:02:10.4");
	mkdirs("devices/pci0000:00/0000:00:19.0");
	mkdirs("devices/pci0000:00/0000:00:1a.0");
	mkdirs("bus/pci/drivers/igbvf");
	mkdirs("bus/pci/drivers/e1000e");
	link_to("devices/pci0000:00/0000:02:10.4/driver", "../../../bus/pci/drivers/igbvf");
	link_to("devices/pci0000:00/0000:02:10.4/physfn", "../0000:02:00.0");
	put("devices/pci0000:00/0000:02:10.4/numa_node", "1\n");
	link_to("devices/pci0000:00/0000:00:19.0/driver", "../../../bus/pci/drivers/e1000e");
	put("devices/pci0000:00/0000:00:19.0/numa_node", "-1\n");

	mkdirs("class/net/ens1f0v2/queues/rx-0");
	mkdirs("class/net/ens1f0v2/queues/rx-1");
	mkdirs("class/net/ens1f0v2/queues/tx-0");
	mkdirs("class/net/ens1f0v2/queues/tx-1");
	mkdirs("class/net/ens1f0v2/queues/tx-2");
	link_to("class/net/ens1f0v2/device", "../../../devices/pci0000:00/0000:02:10.4");
	put("class/net/ens1f0v2/speed", "25000\n");

	mkdirs("class/net/veth0/queues/rx-0");
	mkdirs("class/net/veth0/queues/tx-0");
	put("class/net/veth0/speed", "10000\n");

	mkdirs("class/net/eno1");
	link_to("class/net/eno1/device", "../../../devices/pci0000:00/0000:00:19.0");
	put("class/net/eno1/speed", "-1\n");

	mkdirs("class/net/eno2");
	link_to("class/net/eno2/device", "../../../devices/pci0000:00/0000:00:1a.0");
	return 0;
}

static int tree_down(void **state)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	return system(cmd) == 0 ? 0 : -1;
}

static void test_sysfs_vf(void **state)
{
	struct ctl_nic_info n;

	memset(&n, 0x5a, sizeof(n));
	ctl_nl_sysfs(root, "ens1f0v2", &n);
	assert_string_equal(n.pci, "0000:02:10.4");
	assert_string_equal(n.driver, "igbvf");
	assert_true(n.vf);
	assert_string_equal(n.pf, "0000:02:00.0");
	assert_string_equal(n.pf_name, "ens1f0");
	assert_int_equal(n.speed_mbps, 25000);
	assert_int_equal(n.numa_node, 1);
	assert_int_equal(n.rx_queues, 2);
	assert_int_equal(n.tx_queues, 3);
}

static void test_sysfs_no_device(void **state)
{
	struct ctl_nic_info n;

	memset(&n, 0x5a, sizeof(n));
	ctl_nl_sysfs(root, "veth0", &n);
	assert_string_equal(n.pci, "");
	assert_string_equal(n.driver, "");
	assert_false(n.vf);
	assert_string_equal(n.pf, "");
	/* veth's 10000 is not believed: no device, no speed. */
	assert_int_equal(n.speed_mbps, -1);
	assert_int_equal(n.numa_node, -1);
	assert_int_equal(n.rx_queues, 1);
	assert_int_equal(n.tx_queues, 1);
}

static void test_sysfs_unknowns(void **state)
{
	struct ctl_nic_info n;

	ctl_nl_sysfs(root, "eno1", &n);
	assert_string_equal(n.pci, "0000:00:19.0");
	assert_string_equal(n.driver, "e1000e");
	assert_false(n.vf);
	assert_int_equal(n.speed_mbps, -1);
	assert_int_equal(n.numa_node, -1);
	ctl_nl_sysfs(root, "eno2", &n);
	assert_string_equal(n.pci, "0000:00:1a.0");
	assert_string_equal(n.driver, "");
	assert_int_equal(n.speed_mbps, -1);
	assert_int_equal(n.numa_node, -1);
	ctl_nl_sysfs(root, "nosuch0", &n);
	assert_string_equal(n.pci, "");
	assert_int_equal(n.rx_queues, 0);
}

static void test_loopback(void **state)
{
	struct ctl_nl *nl;
	struct ctl_nic_info n;
	char err[200];

	assert_int_equal(ctl_nl_new(NULL, NULL, NULL, &nl), 0);
	assert_int_equal(ctl_nl_route(nl, "127.0.0.1", &n, err, sizeof(err)), 0);
	assert_string_equal(n.name, "lo");
	assert_string_equal(n.kind, "loopback");
	assert_string_equal(n.peer, "127.0.0.1");
	assert_string_equal(n.pci, "");
	assert_int_equal(n.speed_mbps, -1);
	assert_non_null(strstr(n.addrs, "127.0.0.1/8"));
	assert_int_equal(ctl_nl_owner(nl, "127.0.0.1", &n, err, sizeof(err)), 0);
	assert_string_equal(n.name, "lo");
	assert_int_equal(ctl_nl_by_name(nl, "lo", &n, err, sizeof(err)), 0);
	assert_true(n.ifindex > 0);

	assert_int_equal(ctl_nl_route(nl, "node-b.example", &n, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "node-b.example: not a numeric IPv4 or IPv6 address");
	assert_int_equal(ctl_nl_owner(nl, "192.0.2.77", &n, err, sizeof(err)), -ENOENT);
	assert_string_equal(err, "no interface holds 192.0.2.77");
	assert_int_equal(ctl_nl_by_name(nl, "vmignosuch0", &n, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "interface vmignosuch0: "));
	/* Multicast and the like have no unicast route out of a box without a default route;
	 * whatever the host has, a route lookup answers or says why, never crashes. */
	if (ctl_nl_route(nl, "::ffff:0.0.0.1", &n, err, sizeof(err)) < 0)
		assert_true(err[0] != '\0');
	ctl_nl_free(nl);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sysfs_vf),
		cmocka_unit_test(test_sysfs_no_device),
		cmocka_unit_test(test_sysfs_unknowns),
		cmocka_unit_test(test_loopback),
	};

	return cmocka_run_group_tests(tests, tree_up, tree_down);
}
