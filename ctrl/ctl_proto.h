/* SPDX-License-Identifier: Apache-2.0 */
/* The control protocol's execution: a parsed request (ctl_request.h) applied to the node, and its
 * one JSON reply (doc/interfaces.md). Parsing is not here: it is pure and needs no daemon. */
#ifndef CTL_PROTO_H
#define CTL_PROTO_H

#include "ctl_request.h"

struct xp_tls;
struct ctl_takeover;

/* What status reports besides the node's own figures. */
struct ctl_daemon_info {
	uint64_t started_ms;
	struct xp_tls *tls; /* NULL: --no-tls */
	const char *control_path;
	const char *metrics; /* the HTTP endpoint's ADDR:PORT, NULL without --metrics */
	struct cv_set *conv; /* the convergence monitors; NULL: none (tests) */
	struct ctl_takeover *takeover; /* NULL: no takeover (tests) */
	struct ctl_nic *nic;	       /* the node hop's NICs; NULL: not followed (tests) */
	const char *cpus;	       /* the data-path workers' CPUs (--cpus); NULL: any */
};

/* Returns the reply text (with the trailing newline), malloc'd; NULL only on ENOMEM. An op that
 * takes the connection (ctl_op_takes_conn()) is refused with a reason. */
char *ctl_execute(struct px_node *n, const struct ctl_daemon_info *d,
		  const struct ctl_request *req);
/* The whole exchange: parse, execute, or an error reply. */
char *ctl_handle(struct px_node *n, const struct ctl_daemon_info *d, const char *text, size_t len);
/* {"ok":false,"error":msg,"code":"ENOENT"}: code names err (-errno), absent for 0. */
char *ctl_error_reply(const char *msg, int err);

#endif
