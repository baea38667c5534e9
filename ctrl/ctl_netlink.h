/* SPDX-License-Identifier: Apache-2.0 */
/* The NIC that carries the node hop: the route to a peer and its interface (libnl-route-3), the
 * device behind it (sysfs: PCI address, driver, SR-IOV VF and PF, speed, NUMA node, queues),
 * and link and address events on the control loop. */
#ifndef CTL_NL_H
#define CTL_NL_H

#include <net/if.h>
#include <stdbool.h>
#include <stdint.h>

#include "xp_loop.h"

struct ctl_nl;

struct ctl_nic_info {
	int ifindex;
	char name[IF_NAMESIZE];
	char kind[24];	    /* "veth", "bridge", ... as the kernel names it; a NIC's "device" */
	char operstate[24]; /* the kernel's: "up", "down", "lowerlayerdown", "unknown", ... */
	bool up;	    /* administratively up and with carrier */
	unsigned int mtu;
	char addrs[200]; /* its addresses with prefix, space-separated */
	char peer[64];	 /* the address routed */
	char gateway[64];
	char source[64]; /* the route's preferred source address */
	/* From sysfs, "" or -1 where the interface has no device (veth, dummy, bridge). */
	char pci[32];
	char driver[32];
	bool vf;     /* an SR-IOV virtual function */
	char pf[32]; /* a VF's physical function, its PCI address */
	char pf_name[IF_NAMESIZE];
	int64_t speed_mbps; /* -1: unknown (no device, no carrier, or the driver does not say) */
	int numa_node;	    /* -1: none */
	unsigned int rx_queues, tx_queues;
};

enum ctl_nl_event {
	CTL_NL_LINK,   /* a link changed: ifindex, name and up are its */
	CTL_NL_GONE,   /* a link was deleted */
	CTL_NL_ADDR,   /* an address was added or removed on ifindex */
	CTL_NL_ROUTE,  /* a route was added or removed */
	CTL_NL_RESYNC, /* events were lost (the socket's buffer overflowed): look again */
};

typedef void (*ctl_nl_event_fn)(enum ctl_nl_event ev, int ifindex, const char *name, bool up,
				void *arg);

/* Lookups, and with a loop, events to fn on it. -errno on failure. */
int ctl_nl_new(struct xp_loop *loop, ctl_nl_event_fn fn, void *arg, struct ctl_nl **ret);
/* Takes NULL. */
void ctl_nl_free(struct ctl_nl *n);

/* The route to addr (numeric IPv4 or IPv6) and what carries it. 0, or -errno with one line in
 * err: no route, an address that does not parse. */
int ctl_nl_route(struct ctl_nl *n, const char *addr, struct ctl_nic_info *out, char *err,
		 size_t errlen);
/* The interface that holds addr as one of its own addresses; -ENOENT where none does. */
int ctl_nl_owner(struct ctl_nl *n, const char *addr, struct ctl_nic_info *out, char *err,
		 size_t errlen);
/* The link named name (for --hop-interface and the like). */
int ctl_nl_by_name(struct ctl_nl *n, const char *name, struct ctl_nic_info *out, char *err,
		   size_t errlen);

/* The device facts of interface name from a sysfs tree at root ("/sys", or a test's): fills
 * pci, driver, vf, pf, pf_name, speed_mbps, numa_node and the queue counts of out. */
void ctl_nl_sysfs(const char *root, const char *name, struct ctl_nic_info *out);

#endif
