/* SPDX-License-Identifier: Apache-2.0 */
/* Control requests, parsed: JSON text in, a struct ctl_request out (doc/interfaces.md). Pure: no
 * daemon state, nothing executed (that is ctl_proto.h), and fuzzed (tests/fuzz/fuzz_ctl.c). */
#ifndef CTL_REQUEST_H
#define CTL_REQUEST_H

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
	"strict-fields", "kubevirt", "convergence", "secret", "takeover", "note", "node-bandwidth",  \
		"listen"
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
#define CTL_OPS (CTL_TAKEOVER + 1)

struct ctl_request {
	enum ctl_op op;
	char key[PX_KEY_MAX + 1];
	unsigned int nports; /* target-start */
	struct px_port_info ports[PX_PORTS_MAX];
	struct px_portmap target; /* source-start */
	char dir[CTL_DIR_MAX];
	/* source-start: a hook on the source's connections, set by a field an extension added
	 * (ctl_request_extend()); .hold_ms NULL: none. */
	struct px_source_hook hook;
	/* bytes/s, 0: none. target-start, source-start (optional), bandwidth, node-bandwidth */
	uint64_t bandwidth;
	bool kubevirt;	/* target-start: one listener per logical port, KubeVirt's map */
	enum px_tls tls; /* target-start, source-start: "tls" true or false, else the daemon's */
	/* source-start: "compress": "off", "auto" or "always", else the daemon's --compress */
	enum px_compress compress;
	bool converge;	/* source-start: "convergence" was given */
	struct cv_spec conv;
	int pid; /* takeover: the process asking */
};

struct json_object;

/* A field an op takes beyond its own, added at start-up by ctl_request_extend() (vmigd-test's
 * test_delay_first_ms, ctl_test.c): the product's parser refuses it as any unknown field. parse
 * reads the member v into req: 0, or -EINVAL with one line in err. */
struct ctl_field_ext {
	enum ctl_op op;
	const char *name;
	int (*parse)(struct json_object *v, struct ctl_request *req, char *err, size_t errlen);
};

/* Adds n fields to the ops they name, for the process's life (at start-up, before any request
 * is parsed): 0, or -ENOMEM. fields must outlive the process. */
int ctl_request_extend(const struct ctl_field_ext *fields, size_t n);
/* 0, or -EINVAL with one line for the operator in err. *req is filled only on success. */
int ctl_request_parse(const char *text, size_t len, struct ctl_request *req, char *err,
		      size_t errlen);
/* The op's name on the wire ("source-stop"). */
const char *ctl_op_name(enum ctl_op op);
/* Whether the op takes the control connection itself (takeover: it passes fds and stays open)
 * rather than one reply; ctl_execute() refuses such an op. */
bool ctl_op_takes_conn(enum ctl_op op);

#endif
