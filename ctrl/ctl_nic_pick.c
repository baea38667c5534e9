// SPDX-License-Identifier: Apache-2.0
/* At start-up, before the node exists: the node hop's address picked from an interface
 * (--hop-interface) and the workers' CPUs from a list or a NIC's NUMA node (--cpus), each by one
 * netlink lookup. Following NICs while migrations run is ctl_nic.c's. */
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ctl_netlink.h"
#include "ctl_nic_pick.h"
#include "xp_sock.h"

/* Whether word (an address without its "/LEN") is one of addrs ("A/LEN B/LEN"). */
static bool has_address(const char *addrs, const char *word)
{
	size_t n = strlen(word);

	for (const char *p = addrs; (p = strstr(p, word)); p += n)
		if ((p == addrs || p[-1] == ' ') && (p[n] == '/' || p[n] == ' ' || !p[n]))
			return true;
	return false;
}

/* The address to carry the node hop on, of addrs: the first IPv4, else the first IPv6 that is
 * not link-local (a peer could not reach that without the interface's name). */
static bool pick_address(const char *addrs, char *out, size_t len)
{
	char buf[sizeof(((struct ctl_nic_info *)0)->addrs)], *save, *w;

	for (int want6 = 0; want6 < 2; want6++) {
		snprintf(buf, sizeof(buf), "%s", addrs);
		for (w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
			bool v6 = strchr(w, ':') != NULL;

			*strchrnul(w, '/') = '\0';
			if (v6 != want6 || (v6 && !strncasecmp(w, "fe80:", 5)))
				continue;
			snprintf(out, len, "%s", w);
			return true;
		}
	}
	return false;
}

int ctl_nic_pick_hop(const char *ifname, const char *listen, bool advertise_given,
		     struct px_config *pc)
{
	struct ctl_nic_info nic;
	struct ctl_nl *nl;
	char err[300], addr[64];
	int r = ctl_nl_new(NULL, NULL, NULL, &nl);

	if (r < 0) {
		fprintf(stderr, "vmigd: --hop-interface: cannot open netlink: %s\n", strerror(-r));
		return r;
	}
	r = ctl_nl_by_name(nl, ifname, &nic, err, sizeof(err));
	ctl_nl_free(nl);
	if (r < 0) {
		fprintf(stderr, "vmigd: --hop-interface: %s\n", err);
		return r;
	}
	if (!xp_addr_is_wildcard(&pc->listen)) {
		xp_addr_host(&pc->listen, addr, sizeof(addr));
		if (!has_address(nic.addrs, addr)) {
			fprintf(stderr,
				"vmigd: --listen %s is not an address of --hop-interface %s (it "
				"has: "
				"%s)\n",
				listen, nic.name, nic.addrs[0] ? nic.addrs : "none");
			return -EINVAL;
		}
	} else if (!pick_address(nic.addrs, addr, sizeof(addr)) ||
		   xp_addr_from_host(addr, xp_addr_port(&pc->listen), &pc->listen) < 0) {
		fprintf(stderr,
			"vmigd: --hop-interface %s has no IPv4 or global IPv6 address to carry the "
			"node hop on (it has: %s)\n",
			nic.name, nic.addrs[0] ? nic.addrs : "none");
		return -EINVAL;
	}
	if (!advertise_given)
		snprintf(pc->advertise, sizeof(pc->advertise), "%s", addr);
	if (!nic.up)
		fprintf(stderr, "vmigd: warning: --hop-interface %s is down (%s)\n", nic.name,
			nic.operstate);
	return 0;
}

/* "0-3,8" into set; false for anything else, or a CPU past the set's size. */
static bool parse_cpulist(const char *s, cpu_set_t *set)
{
	CPU_ZERO(set);
	while (*s && *s != '\n') {
		char *end;
		unsigned long a = strtoul(s, &end, 10), b = a;

		if (end == s)
			return false;
		if (*end == '-') {
			s = end + 1;
			b = strtoul(s, &end, 10);
			if (end == s || b < a)
				return false;
		}
		if (b >= CPU_SETSIZE)
			return false;
		for (unsigned long i = a; i <= b; i++)
			CPU_SET(i, set);
		s = end;
		if (*s == ',')
			s++;
		else if (*s && *s != '\n')
			return false;
	}
	return CPU_COUNT(set) > 0;
}

int ctl_nic_pick_cpus(const char *cpus, struct px_config *pc, char *desc, size_t desclen)
{
	char path[96], list[256] = "", host[64] = "", err[300];
	struct ctl_nic_info nic;
	struct ctl_nl *nl;
	FILE *f;

	if (strcmp(cpus, "nic")) {
		if (!parse_cpulist(cpus, &pc->cpus)) {
			fprintf(stderr,
				"vmigd: --cpus: expected a CPU list such as 0-3,8 or nic, got "
				"\"%s\"\n",
				cpus);
			return -EINVAL;
		}
		snprintf(desc, desclen, "%s", cpus);
		pc->pin = true;
		return 0;
	}
	if (pc->advertise[0])
		snprintf(host, sizeof(host), "%s", pc->advertise);
	else if (!xp_addr_is_wildcard(&pc->listen))
		xp_addr_host(&pc->listen, host, sizeof(host));
	if (!host[0]) {
		fprintf(stderr, "vmigd: --cpus nic needs the node hop's own address: give "
				"--hop-interface, --listen ADDR:PORT or --advertise\n");
		return -EINVAL;
	}
	if (ctl_nl_new(NULL, NULL, NULL, &nl) < 0) {
		fprintf(stderr, "vmigd: --cpus nic: cannot open netlink\n");
		return -EINVAL;
	}
	if (ctl_nl_owner(nl, host, &nic, err, sizeof(err)) < 0) {
		ctl_nl_free(nl);
		fprintf(stderr, "vmigd: --cpus nic: %s\n", err);
		return -EINVAL;
	}
	ctl_nl_free(nl);
	if (nic.numa_node < 0) {
		fprintf(stderr, "vmigd: --cpus nic: %s has no NUMA node (%s); give a CPU list\n",
			nic.name,
			nic.pci[0] ? "its device does not say: a one-node machine" : "no device");
		return -EINVAL;
	}
	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", nic.numa_node);
	f = fopen(path, "re");
	if (!f || !fgets(list, sizeof(list), f) || !parse_cpulist(list, &pc->cpus)) {
		if (f)
			fclose(f);
		fprintf(stderr, "vmigd: --cpus nic: cannot read the CPUs of NUMA node %d (%s)\n",
			nic.numa_node, path);
		return -EINVAL;
	}
	fclose(f);
	list[strcspn(list, "\n")] = '\0';
	snprintf(desc, desclen, "%s (NUMA node %d of %s)", list, nic.numa_node,
		 nic.name);
	pc->pin = true;
	return 0;
}
