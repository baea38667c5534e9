// SPDX-License-Identifier: Apache-2.0
/* The node hop's NIC through libnl-route-3 (routes, links, addresses, events) and sysfs (the
 * device behind a link). Lookups are synchronous netlink round trips on the control thread. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/route/route.h>
#include <netlink/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"
#include "ctl_netlink.h"

#ifndef IFF_LOWER_UP
#define IFF_LOWER_UP 0x10000
#endif

struct ctl_nl {
	struct nl_sock *sk; /* requests */
	struct nl_sock *ev; /* events; NULL without a loop */
	struct xp_watch *w;
	ctl_nl_event_fn fn;
	void *arg;
};

/* ---- sysfs ---- */

/* snprintf into buf; false (and "") where it does not fit. */
static bool __attribute__((format(printf, 3, 4))) pathf(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= len) {
		buf[0] = '\0';
		return false;
	}
	return true;
}

/* The last component of the link at path, or "" where there is none. */
static void link_base(const char *path, char *out, size_t len)
{
	char buf[PATH_MAX];
	ssize_t n = readlink(path, buf, sizeof(buf) - 1);
	const char *slash;

	out[0] = '\0';
	if (n <= 0)
		return;
	buf[n] = '\0';
	slash = strrchr(buf, '/');
	pathf(out, len, "%s", slash ? slash + 1 : buf);
}

/* A decimal in the file at path; false where it cannot be read (a link without carrier answers
 * "speed" with EINVAL) or does not parse. */
static bool read_long(const char *path, long *out)
{
	char buf[64], *end;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	errno = 0;
	*out = strtol(buf, &end, 10);
	return errno == 0 && end != buf && (*end == '\n' || *end == '\0');
}

/* The first entry of dir (a PF's net/ directory names its interface), or "". */
static void first_entry(const char *dir, char *out, size_t len)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	out[0] = '\0';
	if (!d)
		return;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.') {
			pathf(out, len, "%s", e->d_name);
			break;
		}
	closedir(d);
}

void ctl_nl_sysfs(const char *root, const char *name, struct ctl_nic_info *out)
{
	char path[PATH_MAX], dev[PATH_MAX];
	struct dirent *e;
	long v;
	DIR *d;

	out->pci[0] = out->driver[0] = out->pf[0] = out->pf_name[0] = '\0';
	out->vf = false;
	out->speed_mbps = -1;
	out->numa_node = -1;
	out->rx_queues = out->tx_queues = 0;
	pathf(path, sizeof(path), "%s/class/net/%s/queues", root, name);
	d = opendir(path);
	while (d && (e = readdir(d))) {
		if (!strncmp(e->d_name, "rx-", 3))
			out->rx_queues++;
		else if (!strncmp(e->d_name, "tx-", 3))
			out->tx_queues++;
	}
	if (d)
		closedir(d);
	pathf(dev, sizeof(dev), "%s/class/net/%s/device", root, name);
	link_base(dev, out->pci, sizeof(out->pci));
	/* No device (veth, dummy, bridge, a tunnel): what speed such a link reports is made up
	 * (veth says 10000), so it stays unknown. */
	if (!out->pci[0])
		return;
	pathf(path, sizeof(path), "%s/driver", dev);
	link_base(path, out->driver, sizeof(out->driver));
	pathf(path, sizeof(path), "%s/physfn", dev);
	link_base(path, out->pf, sizeof(out->pf));
	if (out->pf[0]) {
		out->vf = true;
		pathf(path, sizeof(path), "%s/physfn/net", dev);
		first_entry(path, out->pf_name, sizeof(out->pf_name));
	}
	pathf(path, sizeof(path), "%s/numa_node", dev);
	if (read_long(path, &v) && v >= 0 && v < INT_MAX)
		out->numa_node = (int)v;
	pathf(path, sizeof(path), "%s/class/net/%s/speed", root, name);
	if (read_long(path, &v) && v > 0 && v != UINT32_MAX)
		out->speed_mbps = v;
}

/* ---- netlink lookups ---- */

struct reply {
	int err; /* the kernel's -errno */
	bool found;
	int ifindex;
	char gateway[64], source[64];
};

static void addr_str(struct nl_addr *a, char *out, size_t len)
{
	out[0] = '\0';
	if (a) {
		/* nl_addr2str adds "/len" to a prefix shorter than the address. */
		char buf[96];

		nl_addr2str(a, buf, sizeof(buf));
		pathf(out, len, "%s", buf);
	}
}

static void route_obj(struct nl_object *obj, void *arg)
{
	struct rtnl_route *r = (struct rtnl_route *)obj;
	struct rtnl_nexthop *nh =
		rtnl_route_get_nnexthops(r) > 0 ? rtnl_route_nexthop_n(r, 0) : NULL;
	struct reply *rep = arg;

	if (!nh)
		return;
	rep->found = true;
	rep->ifindex = rtnl_route_nh_get_ifindex(nh);
	addr_str(rtnl_route_nh_get_gateway(nh), rep->gateway, sizeof(rep->gateway));
	addr_str(rtnl_route_get_pref_src(r), rep->source, sizeof(rep->source));
}

static int on_route(struct nl_msg *msg, void *arg)
{
	nl_msg_parse(msg, route_obj, arg);
	return NL_OK;
}

static int on_error(struct sockaddr_nl *nla, struct nlmsgerr *e, void *arg)
{
	struct reply *rep = arg;

	rep->err = e->error < 0 ? e->error : -e->error;
	return NL_STOP;
}

/* libnl's error as an errno, for the callers' -errno. */
static int nl_errno(int nle)
{
	switch (-nle) {
	case NLE_NOMEM:
		return -ENOMEM;
	case NLE_NOADDR:
	case NLE_OBJ_NOTFOUND:
	case NLE_NODEV:
		return -ENOENT;
	case NLE_PERM:
		return -EPERM;
	case NLE_INVAL:
		return -EINVAL;
	default:
		return -EIO;
	}
}

static int parse_addr(const char *s, unsigned char *bin, int *family)
{
	if (inet_pton(AF_INET, s, bin) == 1) {
		*family = AF_INET;
		return 4;
	}
	if (inet_pton(AF_INET6, s, bin) == 1) {
		*family = AF_INET6;
		return 16;
	}
	return -EINVAL;
}

/* The interface's own addresses, "A/LEN B/LEN". */
static void link_addrs(struct ctl_nl *n, int ifindex, char *out, size_t len)
{
	struct nl_cache *cache;
	size_t used = 0;

	out[0] = '\0';
	if (rtnl_addr_alloc_cache(n->sk, &cache) < 0)
		return;
	for (struct nl_object *o = nl_cache_get_first(cache); o; o = nl_cache_get_next(o)) {
		struct rtnl_addr *a = (struct rtnl_addr *)o;
		char buf[96];

		if (rtnl_addr_get_ifindex(a) != ifindex)
			continue;
		addr_str(rtnl_addr_get_local(a), buf, sizeof(buf));
		if (buf[0] && used + strlen(buf) + 2 < len)
			used += snprintf(out + used, len - used, "%s%s", used ? " " : "", buf);
	}
	nl_cache_free(cache);
}

/* The link's own facts (netlink) and its device's (sysfs). */
static int link_facts(struct ctl_nl *n, int ifindex, const char *name, struct ctl_nic_info *out,
		      char *err, size_t errlen)
{
	struct rtnl_link *l;
	unsigned int flags;
	const char *type;
	char kind[sizeof(out->kind)];
	int r = rtnl_link_get_kernel(n->sk, ifindex, name, &l);

	if (r >= 0 && !l)
		r = -NLE_OBJ_NOTFOUND;
	if (r < 0) {
		if (name)
			snprintf(err, errlen, "interface %s: %s", name, nl_geterror(r));
		else
			snprintf(err, errlen, "interface #%d: %s", ifindex, nl_geterror(r));
		return nl_errno(r);
	}
	out->ifindex = rtnl_link_get_ifindex(l);
	snprintf(out->name, sizeof(out->name), "%s", rtnl_link_get_name(l));
	type = rtnl_link_get_type(l);
	flags = rtnl_link_get_flags(l);
	rtnl_link_operstate2str(rtnl_link_get_operstate(l), out->operstate, sizeof(out->operstate));
	out->up = (flags & IFF_UP) && (flags & IFF_LOWER_UP);
	out->mtu = rtnl_link_get_mtu(l);
	snprintf(kind, sizeof(kind), "%s", type ? type : "");
	rtnl_link_put(l);
	link_addrs(n, out->ifindex, out->addrs, sizeof(out->addrs));
	ctl_nl_sysfs("/sys", out->name, out);
	/* The kernel names a virtual link's kind; a NIC's is its device's. */
	snprintf(out->kind, sizeof(out->kind), "%s",
		 kind[0]		? kind
		 : flags & IFF_LOOPBACK ? "loopback"
		 : out->pci[0]		? "device"
					: "unknown");
	/* A driver that reports a speed with the carrier down reports the last one. */
	if (!out->up)
		out->speed_mbps = -1;
	return 0;
}

int ctl_nl_route(struct ctl_nl *n, const char *addr, struct ctl_nic_info *out, char *err,
		 size_t errlen)
{
	struct rtmsg rtm = { 0 };
	struct reply rep = { 0 };
	unsigned char bin[16];
	struct nl_addr *dst = NULL;
	struct nl_msg *msg = NULL;
	struct nl_cb *cb = NULL;
	int family, alen, r;

	memset(out, 0, sizeof(*out));
	snprintf(out->peer, sizeof(out->peer), "%s", addr);
	alen = parse_addr(addr, bin, &family);
	if (alen < 0) {
		snprintf(err, errlen, "%s: not a numeric IPv4 or IPv6 address", addr);
		return -EINVAL;
	}
	r = -ENOMEM;
	rtm.rtm_family = family;
	dst = nl_addr_build(family, bin, alen);
	msg = nlmsg_alloc_simple(RTM_GETROUTE, 0);
	cb = nl_cb_alloc(NL_CB_DEFAULT);
	if (!dst || !msg || !cb || nlmsg_append(msg, &rtm, sizeof(rtm), NLMSG_ALIGNTO) < 0 ||
	    nla_put_addr(msg, RTA_DST, dst) < 0) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	nl_cb_set(cb, NL_CB_VALID, NL_CB_CUSTOM, on_route, &rep);
	nl_cb_err(cb, NL_CB_CUSTOM, on_error, &rep);
	r = nl_send_auto(n->sk, msg);
	if (r >= 0)
		r = nl_recvmsgs(n->sk, cb);
	if (rep.err < 0) {
		r = rep.err;
		snprintf(err, errlen, "no route to %s: %s", addr, strerror(-r));
		goto out;
	}
	if (r < 0) {
		snprintf(err, errlen, "route to %s: netlink: %s", addr, nl_geterror(r));
		r = nl_errno(r);
		goto out;
	}
	if (!rep.found) {
		r = -ENETUNREACH;
		snprintf(err, errlen, "no route to %s", addr);
		goto out;
	}
	r = link_facts(n, rep.ifindex, NULL, out, err, errlen);
	snprintf(out->peer, sizeof(out->peer), "%s", addr);
	snprintf(out->gateway, sizeof(out->gateway), "%s", rep.gateway);
	snprintf(out->source, sizeof(out->source), "%s", rep.source);
out:
	nl_cb_put(cb);
	nlmsg_free(msg);
	nl_addr_put(dst);
	return r;
}

int ctl_nl_owner(struct ctl_nl *n, const char *addr, struct ctl_nic_info *out, char *err,
		 size_t errlen)
{
	struct nl_cache *cache;
	unsigned char bin[16];
	int family, alen, ifindex = 0, r;

	memset(out, 0, sizeof(*out));
	alen = parse_addr(addr, bin, &family);
	if (alen < 0) {
		snprintf(err, errlen, "%s: not a numeric IPv4 or IPv6 address", addr);
		return -EINVAL;
	}
	r = rtnl_addr_alloc_cache(n->sk, &cache);
	if (r < 0) {
		snprintf(err, errlen, "addresses: netlink: %s", nl_geterror(r));
		return nl_errno(r);
	}
	for (struct nl_object *o = nl_cache_get_first(cache); o; o = nl_cache_get_next(o)) {
		struct nl_addr *a = rtnl_addr_get_local((struct rtnl_addr *)o);

		if (a && nl_addr_get_family(a) == family && (int)nl_addr_get_len(a) == alen &&
		    !memcmp(nl_addr_get_binary_addr(a), bin, alen)) {
			ifindex = rtnl_addr_get_ifindex((struct rtnl_addr *)o);
			break;
		}
	}
	nl_cache_free(cache);
	if (!ifindex) {
		snprintf(err, errlen, "no interface holds %s", addr);
		return -ENOENT;
	}
	return link_facts(n, ifindex, NULL, out, err, errlen);
}

int ctl_nl_by_name(struct ctl_nl *n, const char *name, struct ctl_nic_info *out, char *err,
		   size_t errlen)
{
	memset(out, 0, sizeof(*out));
	return link_facts(n, 0, name, out, err, errlen);
}

/* ---- events ---- */

struct ev_ctx {
	struct ctl_nl *n;
	int type;
};

static void ev_obj(struct nl_object *obj, void *arg)
{
	struct ev_ctx *c = arg;

	if (c->type == RTM_NEWLINK || c->type == RTM_DELLINK) {
		struct rtnl_link *l = (struct rtnl_link *)obj;
		unsigned int flags = rtnl_link_get_flags(l);
		const char *name = rtnl_link_get_name(l);

		c->n->fn(c->type == RTM_DELLINK ? CTL_NL_GONE : CTL_NL_LINK,
			 rtnl_link_get_ifindex(l), name ? name : "",
			 (flags & IFF_UP) && (flags & IFF_LOWER_UP), c->n->arg);
	} else if (c->type == RTM_NEWADDR || c->type == RTM_DELADDR) {
		c->n->fn(CTL_NL_ADDR, rtnl_addr_get_ifindex((struct rtnl_addr *)obj), "", true,
			 c->n->arg);
	} else if (c->type == RTM_NEWROUTE || c->type == RTM_DELROUTE) {
		c->n->fn(CTL_NL_ROUTE, 0, "", true, c->n->arg);
	}
}

static int on_event(struct nl_msg *msg, void *arg)
{
	struct ev_ctx c = { .n = arg, .type = nlmsg_hdr(msg)->nlmsg_type };

	nl_msg_parse(msg, ev_obj, &c);
	return NL_OK;
}

static void on_readable(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct ctl_nl *n = arg;
	/* nl_socket_get_cb() takes a reference: one per wake-up, given back below. */
	struct nl_cb *cb = nl_socket_get_cb(n->ev);

	/* A bounded batch: the watch is level-triggered and comes back for the rest. */
	for (int i = 0; i < 64; i++) {
		int r = nl_recvmsgs_report(n->ev, cb);

		if (r == -NLE_NOMEM) { /* ENOBUFS: the kernel dropped events */
			n->fn(CTL_NL_RESYNC, 0, "", false, n->arg);
			continue;
		}
		if (r <= 0)
			break;
	}
	nl_cb_put(cb);
}

static int events_start(struct ctl_nl *n, struct xp_loop *loop)
{
	int r;

	n->ev = nl_socket_alloc();
	if (!n->ev)
		return -ENOMEM;
	nl_socket_disable_seq_check(n->ev);
	nl_socket_modify_cb(n->ev, NL_CB_VALID, NL_CB_CUSTOM, on_event, n);
	r = nl_connect(n->ev, NETLINK_ROUTE);
	if (r >= 0)
		r = nl_socket_add_memberships(n->ev, RTNLGRP_LINK, RTNLGRP_IPV4_IFADDR,
					      RTNLGRP_IPV6_IFADDR, RTNLGRP_IPV4_ROUTE,
					      RTNLGRP_IPV6_ROUTE, 0);
	if (r >= 0)
		r = nl_socket_set_nonblocking(n->ev);
	if (r < 0)
		return nl_errno(r);
	nl_socket_set_buffer_size(n->ev, 1 << 20, 0);
	return xp_watch_add(loop, nl_socket_get_fd(n->ev), EPOLLIN, on_readable, n, &n->w);
}

int ctl_nl_new(struct xp_loop *loop, ctl_nl_event_fn fn, void *arg, struct ctl_nl **ret)
{
	struct ctl_nl *n = calloc(1, sizeof(*n));
	int r = -ENOMEM;

	if (!n)
		return -ENOMEM;
	n->fn = fn;
	n->arg = arg;
	n->sk = nl_socket_alloc();
	if (!n->sk)
		goto fail;
	/* No ACK after a reply: one left in the socket would answer the next request. Errors
	 * still come back. */
	nl_socket_disable_auto_ack(n->sk);
	r = nl_connect(n->sk, NETLINK_ROUTE);
	if (r < 0) {
		r = nl_errno(r);
		goto fail;
	}
	if (loop && fn) {
		r = events_start(n, loop);
		if (r < 0)
			goto fail;
	}
	*ret = n;
	return 0;
fail:
	ctl_nl_free(n);
	return r;
}

void ctl_nl_free(struct ctl_nl *n)
{
	if (!n)
		return;
	xp_watch_del(n->w);
	if (n->ev)
		nl_socket_free(n->ev);
	if (n->sk)
		nl_socket_free(n->sk);
	free(n);
}
