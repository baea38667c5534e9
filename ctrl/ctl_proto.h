/* SPDX-License-Identifier: Apache-2.0 */
/* The control protocol: one JSON request in, one JSON reply out (doc/interfaces.md). Parsing
 * and validation are pure; ctl_execute() applies a request to the node. */
#ifndef CTL_PROTO_H
#define CTL_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cv_watch.h"
#include "px_node.h"

/*
 * The requests' rules (doc/control-protocol.md): 1, fields an op does not take were ignored;
 * 2, they are refused, and there is a takeover op. Reply formats have their own version
 * (CTL_REPLY_VERSION). status reports both, and the features below.
 */
#define CTL_PROTOCOL_VERSION 2
#define CTL_FEATURES                                                                               \
	"strict-fields", "kubevirt", "convergence", "secret", "takeover", "note", "node-bandwidth"
#define CTL_REQUEST_MAX 65536
#define CTL_DIR_MAX	4096

enum ctl_op {
	CTL_TARGET_START,
	CTL_TARGET_STOP,
	CTL_SOURCE_START,
	CTL_SOURCE_STOP,
	CTL_LIST,
	CTL_STATUS,
	CTL_BANDWIDTH,
	CTL_NODE_BANDWIDTH,
	CTL_METRICS,
	CTL_TAKEOVER, /* a vmigd --takeover asking for the listeners (ctl_takeover.h) */
};

struct ctl_request {
	enum ctl_op op;
	char key[PX_KEY_MAX + 1];
	unsigned int nports; /* target-start */
	struct px_port_info ports[PX_PORTS_MAX];
	struct px_portmap target; /* source-start */
	char dir[CTL_DIR_MAX];
	unsigned int delay_first_ms;
	/* bytes/s, 0: none. target-start, source-start (optional), bandwidth, node-bandwidth */
	uint64_t bandwidth;
	bool kubevirt;	/* target-start: one listener per logical port, KubeVirt's map */
	enum px_tls tls; /* target-start, source-start: "tls" true or false, else the daemon's */
	bool converge;	/* source-start: "convergence" was given */
	struct cv_spec conv;
	int pid; /* takeover: the process asking */
};

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

/* 0, or -EINVAL with one line for the operator in err. *req is filled only on success. */
int ctl_request_parse(const char *text, size_t len, struct ctl_request *req, char *err,
		      size_t errlen);
/* Returns the reply text (with the trailing newline), malloc'd; NULL only on ENOMEM. */
char *ctl_execute(struct px_node *n, const struct ctl_daemon_info *d,
		  const struct ctl_request *req);
/* The whole exchange: parse, execute, or an error reply. */
char *ctl_handle(struct px_node *n, const struct ctl_daemon_info *d, const char *text, size_t len);
/* The op's name on the wire ("source-stop"). */
const char *ctl_op_name(enum ctl_op op);
/* {"ok":false,"error":msg,"code":"ENOENT"}: code names err (-errno), absent for 0. */
char *ctl_error_reply(const char *msg, int err);

#endif
