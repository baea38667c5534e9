/* SPDX-License-Identifier: Apache-2.0 */
/* Metrics export for Prometheus: a snapshot of the node's figures, its rendering in the text
 * exposition format 0.0.4 (pure), and the HTTP endpoint serving it from the control loop. The
 * control protocol's JSON `metrics` reply is ctl_proto's, not this. */
#ifndef CTL_METRICS_H
#define CTL_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl_figures.h"
#include "ctl_nic.h"
#include "cv_watch.h"
#include "px_node.h"
#include "xp_loop.h"
#include "xp_sock.h"

#define CTL_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* The node's figures at one moment, owning copies of what px_node_foreach() only lends. */
struct ctl_metrics_snapshot {
	struct px_node_info node;
	struct ctl_process proc; /* the daemon process, vmigd_build_info's labels */
	unsigned int nmigs;
	struct px_migration_info *migs; /* strings and conns[] belong to the snapshot */
	struct cv_report *conv;		/* one per migs[], or NULL; .backend NULL: not watched */
	struct ctl_nic_view *nics;	/* one per migs[], or NULL; .nic.ifindex 0: not known */
	uint64_t now_ms;		/* vm_now_ms() when taken */
	double now_unix;		/* CLOCK_REALTIME at the same moment, seconds */
};

/* Runs on the control loop's thread; conv and nic may be NULL. 0 or -ENOMEM; *ret written only
 * on success. */
int ctl_metrics_snapshot_take(struct px_node *n, struct cv_set *conv, struct ctl_nic *nic,
			      struct ctl_metrics_snapshot **ret);
/* For snapshots from ctl_metrics_snapshot_take() only. Takes NULL. */
void ctl_metrics_snapshot_free(struct ctl_metrics_snapshot *s);

/*
 * The text exposition of s, malloc'd and NUL-terminated, its length in *len. Depends on nothing
 * but s: tests build s by hand. 0 or -ENOMEM; *ret and *len written only on success.
 */
int ctl_metrics_render(const struct ctl_metrics_snapshot *s, char **ret, size_t *len);

struct ctl_metrics_server;

/*
 * Serves GET /metrics on addr (port 0: a free one), from loop, reading n on each request. 0, or
 * -errno with one line for the operator in err. The server does not own n; free it first.
 */
int ctl_metrics_server_new(struct xp_loop *loop, struct px_node *n, struct cv_set *conv,
			   struct ctl_nic *nic, const struct xp_addr *addr,
			   struct ctl_metrics_server **ret, char *err, size_t errlen);
/* The same on a listener handed over by the vmigd this one takes over from (fd is its). */
int ctl_metrics_server_adopt(struct xp_loop *loop, struct px_node *n, struct cv_set *conv,
			     struct ctl_nic *nic, int fd, struct ctl_metrics_server **ret,
			     char *err, size_t errlen);
/* Its listener, to hand over; -1 if unknown. */
int ctl_metrics_server_fd(const struct ctl_metrics_server *s);
/* Takes NULL. */
void ctl_metrics_server_free(struct ctl_metrics_server *s);
/* With --dpdk: /readyz answers 503 while the node has no DPDK node hop. */
void ctl_metrics_server_want_dpdk(struct ctl_metrics_server *s, bool on);
/*
 * /readyz's judgement, pure: the number of reasons the node is not ready (0: ready), each a line
 * in buf: the node-hop listener closed (listening false), with TLS a certificate not loaded or
 * expired at now_unix (the node's, or the earliest of the CA bundle), with want_dpdk no DPDK
 * node hop.
 */
int ctl_metrics_ready(const struct px_node_info *ni, bool listening, bool want_dpdk,
		      double now_unix, char *buf, size_t len);
/* The address bound, "ADDR:PORT" ("[ADDR]:PORT" for IPv6). */
const char *ctl_metrics_server_addr(const struct ctl_metrics_server *s);

#endif
