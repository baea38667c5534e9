// SPDX-License-Identifier: Apache-2.0
/* Control requests executed: a parsed request (ctl_request.c) applied to the node by its entry in
 * runs[], and its JSON reply, whose figures come from ctl_figures.c's tables. A stop or cap for a
 * migration an older vmigd kept at a takeover is passed on to it (ctl_takeover_forward()). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl_json.h"
#include "ctl_portmap.h"
#include "ctl_proto.h"
#include "ctl_report.h"
#include "ctl_takeover.h"
#include "xp_tls.h"
#include "util.h"
#include "vmigd-config.h"

/* ---- replies ---- */

static char *reply_text(struct json_object *o)
{
	/* Seconds with millisecond precision, not 17 significant digits. */
	json_c_set_serialization_double_format("%.3f", JSON_C_OPTION_THREAD);
	char *s = NULL;

	if (o &&
	    asprintf(&s, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN)) < 0)
		s = NULL;
	json_object_put(o);
	/* json-c passes a string's bytes through: text from elsewhere may not be UTF-8. */
	return s ? ctl_json_utf8_fix(s) : NULL;
}

char *ctl_error_reply(const char *msg, int err)
{
	struct json_object *o = json_object_new_object();
	const char *code = err < 0 ? strerrorname_np(-err) : NULL;
	char line[512];

	snprintf(line, sizeof(line), "%s", msg);
	ctl_json_one_line(line);
	json_object_object_add(o, "ok", json_object_new_boolean(0));
	json_object_object_add(o, "error", json_object_new_string(line));
	/* For programs (KubeVirt's shim): ENOENT from a stop is a no-op to them. */
	if (code)
		json_object_object_add(o, "code", json_object_new_string(code));
	return reply_text(o);
}

static struct json_object *ok_reply(void)
{
	struct json_object *o = json_object_new_object();

	json_object_object_add(o, "ok", json_object_new_boolean(1));
	return o;
}

/* status, list and metrics: their figures' shape has a version (doc/interfaces.md). */
static struct json_object *ok_reply_versioned(void)
{
	struct json_object *o = ok_reply();

	json_object_object_add(o, "version", json_object_new_int(CTL_REPLY_VERSION));
	return o;
}

struct migration_walk {
	struct json_object *migs;
	struct cv_set *conv;
	struct ctl_nic *nic;
	struct ctl_env env;
};

/* One migration object, the same in every reply; with its convergence report when watched. */
static void add_migration(const struct px_migration_info *mi, void *arg)
{
	struct migration_walk *w = arg;
	struct cv_report *r = NULL;
	struct ctl_nic_view nic;

	if (w->conv && mi->role == PX_ROLE_SOURCE) {
		r = malloc(sizeof(*r));
		if (r && !cv_watch_report(w->conv, mi->key, r)) {
			free(r);
			r = NULL;
		}
	}
	json_object_array_add(
		w->migs,
		ctl_report_migration(mi, r, ctl_nic_migration(w->nic, mi, &nic) ? &nic : NULL,
				     &w->env));
	free(r);
}

static struct json_object *migration_list(struct px_node *n, const struct ctl_daemon_info *d,
					  const struct ctl_env *env)
{
	struct migration_walk w = {
		.migs = json_object_new_array(), .conv = d->conv, .nic = d->nic, .env = *env
	};

	px_node_foreach(n, add_migration, &w);
	return w.migs;
}

static struct json_object *node_object(struct px_node *n, const struct ctl_daemon_info *d,
				       const struct ctl_env *env)
{
	struct px_node_info ni;
	struct ctl_nic_view nic;
	struct json_object *o;

	px_node_info(n, &ni);
	o = ctl_report_node(&ni, env);
	json_object_object_add(o, "nic",
			       ctl_report_nic(ctl_nic_node(d->nic, &nic) ? &nic : NULL, env));
	return o;
}

static struct json_object *tls_object(const struct ctl_daemon_info *d)
{
	struct json_object *o = json_object_new_object(), *allow;

	json_object_object_add(o, "enabled", json_object_new_boolean(d->tls != NULL));
	json_object_object_add(o, "ktls_kernel", json_object_new_boolean(xp_tls_kernel_has_ktls()));
	if (!d->tls)
		return o;
	json_object_object_add(o, "generation", json_object_new_int(xp_tls_generation(d->tls)));
	json_object_object_add(o, "certificate", json_object_new_string(xp_tls_describe(d->tls)));
	json_object_object_add(o, "ktls", json_object_new_boolean(xp_tls_ktls_enabled(d->tls)));
	json_object_object_add(o, "min_version",
			       json_object_new_string(xp_tls_min_version(d->tls)));
	for (int servers = 0; servers < 2; servers++) {
		allow = json_object_new_array();
		for (unsigned int i = 0; xp_tls_allow_list(d->tls, servers, i); i++)
			json_object_array_add(
				allow, json_object_new_string(xp_tls_allow_list(d->tls, servers, i)));
		/* "allow": what this node accepts from sources, the list of old. */
		json_object_object_add(o, servers ? "allow_servers" : "allow", allow);
	}
	return o;
}

/* {"version":N,"reply_version":N,"features":[...]}: what a client talks to. */
static struct json_object *protocol_object(void)
{
	static const char *const features[] = { CTL_FEATURES };
	struct json_object *o = json_object_new_object(), *f = json_object_new_array();

	json_object_object_add(o, "version", json_object_new_int(CTL_PROTOCOL_VERSION));
	json_object_object_add(o, "reply_version", json_object_new_int(CTL_REPLY_VERSION));
	for (size_t i = 0; i < ARRAY_SIZE(features); i++)
		json_object_array_add(f, json_object_new_string(features[i]));
	json_object_object_add(o, "features", f);
	return o;
}

/* The daemon's own facts, then the node and its migrations as metrics has them. */
static struct json_object *status_object(struct px_node *n, const struct ctl_daemon_info *d)
{
	struct json_object *s = json_object_new_object(), *migs;
	struct ctl_env env;

	ctl_env_now(&env);
	json_object_object_add(s, "version", json_object_new_string(VMIGD_VERSION));
	json_object_object_add(s, "protocol", protocol_object());
	json_object_object_add(s, "pid", json_object_new_int(getpid()));
	json_object_object_add(s, "control", json_object_new_string(d->control_path));
	json_object_object_add(s, "listen", json_object_new_string(px_node_listen_str(n)));
	json_object_object_add(s, "advertise", json_object_new_string(px_node_advertise(n)));
	json_object_object_add(s, "tls", tls_object(d));
	json_object_object_add(s, "data_path", json_object_new_string(px_node_data_path(n)));
	json_object_object_add(s, "threads", json_object_new_int(px_node_threads(n)));
	json_object_object_add(s, "cpus", d->cpus ? json_object_new_string(d->cpus) : NULL);
	json_object_object_add(s, "uptime",
			       json_object_new_double((env.now_ms - d->started_ms) / 1000.0));
	if (d->metrics)
		json_object_object_add(s, "metrics", json_object_new_string(d->metrics));
	migs = migration_list(n, d, &env);
	json_object_object_add(s, "node", node_object(n, d, &env));
	json_object_object_add(s, "migrations", migs);
	if (d->takeover)
		ctl_takeover_status(d->takeover, s);
	return s;
}

/* ---- the operations' handlers: 0 and *reply, or -errno with one line in err ---- */

static int run_target_start(struct px_node *n, const struct ctl_daemon_info *d,
			    const struct ctl_request *req, struct json_object **reply, char *err,
			    size_t errlen)
{
	struct px_start opts = { .cap = req->bandwidth, .kubevirt = req->kubevirt, .tls = req->tls };
	struct px_portmap t;
	int r;

	r = px_target_start(n, req->key, req->nports, req->ports, &opts, &t, err, errlen);
	if (r < 0)
		return r;
	*reply = ok_reply();
	json_object_object_add(*reply, "target", ctl_portmap_to_json(&t));
	return 0;
}

static int run_source_start(struct px_node *n, const struct ctl_daemon_info *d,
			    const struct ctl_request *req, struct json_object **reply, char *err,
			    size_t errlen)
{
	struct px_start opts = { .cap = req->bandwidth, .tls = req->tls, .hook = req->hook,
				 .compress = req->compress };
	struct px_port_info socks[PX_PORTS_MAX];
	struct json_object *arr, *map;
	int r;

	if (req->converge && !d->conv) {
		snprintf(err, errlen, "convergence control is not available here");
		return -ENOTSUP;
	}
	/* The backend first: capabilities must be set before QEMU migrates. */
	if (req->converge) {
		r = cv_watch_start(d->conv, req->key, &req->conv, err, errlen);
		if (r < 0)
			return r;
	}
	r = px_source_start(n, &req->target, req->dir, &opts, socks, err, errlen);
	if (r < 0) {
		if (req->converge)
			cv_watch_stop(d->conv, req->key, NULL);
		return r;
	}
	*reply = ok_reply();
	arr = json_object_new_array();
	map = json_object_new_object();
	for (unsigned int i = 0; i < req->target.nports; i++) {
		char id[16];

		snprintf(id, sizeof(id), "%u", socks[i].id);
		json_object_array_add(arr, json_object_new_string(socks[i].path));
		json_object_object_add(map, id, json_object_new_string(socks[i].path));
	}
	json_object_object_add(*reply, "sockets", arr);
	json_object_object_add(*reply, "socket_map", map);
	return 0;
}

static int run_target_stop(struct px_node *n, const struct ctl_daemon_info *d,
			   const struct ctl_request *req, struct json_object **reply, char *err,
			   size_t errlen)
{
	int r = px_target_stop(n, req->key, err, errlen);

	if (r == -ENOENT && d->takeover)
		return ctl_takeover_forward(d->takeover, req, reply, err, errlen);
	if (r < 0)
		return r;
	*reply = ok_reply();
	return 0;
}

/*
 * Ends the convergence watch of a source just stopped; where it saw the hypervisor's job end
 * cancelled, the migration's stop line (and vmigd_migrations_total) says so: aborted-by-vmigd
 * where its own abort did it, else cancelled.
 */
static void conv_stop(struct px_node *n, struct cv_set *conv, const char *key)
{
	struct cv_report *last = malloc(sizeof(*last));
	bool aborted;

	if (!last) {
		cv_watch_stop(conv, key, NULL);
		return;
	}
	if (cv_watch_stop(conv, key, last) && last->have_job &&
	    (last->job.status == CV_ST_CANCELLED || last->job.status == CV_ST_FAILED)) {
		aborted = !last->policy.shadow && last->counts[CV_ACT_ABORT] > 0;
		if (aborted || last->job.status == CV_ST_CANCELLED)
			px_migration_note_end(n, key, PX_ROLE_SOURCE,
					      aborted ? PX_OUT_ABORTED : PX_OUT_CANCELLED);
	}
	free(last);
}

static int run_source_stop(struct px_node *n, const struct ctl_daemon_info *d,
			   const struct ctl_request *req, struct json_object **reply, char *err,
			   size_t errlen)
{
	int r = px_source_stop(n, req->key, err, errlen);

	if (r == -ENOENT && d->takeover)
		return ctl_takeover_forward(d->takeover, req, reply, err, errlen);
	if (r < 0)
		return r;
	if (d->conv)
		conv_stop(n, d->conv, req->key);
	*reply = ok_reply();
	return 0;
}

static int run_list(struct px_node *n, const struct ctl_daemon_info *d,
		    const struct ctl_request *req, struct json_object **reply, char *err,
		    size_t errlen)
{
	struct ctl_env env;

	ctl_env_now(&env);
	*reply = ok_reply_versioned();
	json_object_object_add(*reply, "migrations", migration_list(n, d, &env));
	return 0;
}

static int run_status(struct px_node *n, const struct ctl_daemon_info *d,
		      const struct ctl_request *req, struct json_object **reply, char *err,
		      size_t errlen)
{
	*reply = ok_reply_versioned();
	json_object_object_add(*reply, "status", status_object(n, d));
	return 0;
}

static int run_set_cap(struct px_node *n, const struct ctl_daemon_info *d,
		       const struct ctl_request *req, struct json_object **reply, char *err,
		       size_t errlen)
{
	int r = px_migration_set_cap(n, req->key, req->bandwidth, err, errlen);

	if (r == -ENOENT && d->takeover)
		return ctl_takeover_forward(d->takeover, req, reply, err, errlen);
	if (r < 0)
		return r;
	*reply = ok_reply();
	return 0;
}

static int run_node_cap(struct px_node *n, const struct ctl_daemon_info *d,
			const struct ctl_request *req, struct json_object **reply, char *err,
			size_t errlen)
{
	px_node_set_bandwidth(n, req->bandwidth);
	*reply = ok_reply();
	return 0;
}

/* {"ok":true,"version":2,"node":{...},"migrations":[...]}: everything the node can tell. */
static int run_metrics(struct px_node *n, const struct ctl_daemon_info *d,
		       const struct ctl_request *req, struct json_object **reply, char *err,
		       size_t errlen)
{
	struct ctl_env env;

	struct json_object *migs;

	ctl_env_now(&env);
	*reply = ok_reply_versioned();
	/* Migrations read before the node: see ctl_metrics_snapshot_take(). */
	migs = migration_list(n, d, &env);
	json_object_object_add(*reply, "node", node_object(n, d, &env));
	json_object_object_add(*reply, "migrations", migs);
	return 0;
}

/* ---- the operations, as ctl_request.c's ops[]; NULL for those that take the connection ---- */

typedef int (*ctl_run_fn)(struct px_node *n, const struct ctl_daemon_info *d,
			  const struct ctl_request *req, struct json_object **reply, char *err,
			  size_t errlen);

static const ctl_run_fn runs[] = {
	[CTL_TARGET_START] = run_target_start,
	[CTL_TARGET_STOP] = run_target_stop,
	[CTL_SOURCE_START] = run_source_start,
	[CTL_SOURCE_STOP] = run_source_stop,
	[CTL_LIST] = run_list,
	[CTL_STATUS] = run_status,
	[CTL_BANDWIDTH] = run_set_cap,
	[CTL_NODE_BANDWIDTH] = run_node_cap,
	[CTL_METRICS] = run_metrics,
	[CTL_TAKEOVER] = NULL,
};
_Static_assert(ARRAY_SIZE(runs) == CTL_OPS, "an entry for each enum ctl_op");

char *ctl_execute(struct px_node *n, const struct ctl_daemon_info *d, const struct ctl_request *req)
{
	struct json_object *reply = NULL;
	char err[512];

	int r;

	if ((unsigned int)req->op >= ARRAY_SIZE(runs))
		return ctl_error_reply("unknown op", -EINVAL);
	/* Only the control server serves such an op, on the connection it came on. */
	if (!runs[req->op]) {
		snprintf(err, sizeof(err), "%s is asked for by vmigd --%s on the control socket",
			 ctl_op_name(req->op), ctl_op_name(req->op));
		return ctl_error_reply(err, -EINVAL);
	}
	r = runs[req->op](n, d, req, &reply, err, sizeof(err));
	if (r < 0)
		return ctl_error_reply(err, r);
	return reply_text(reply);
}

char *ctl_handle(struct px_node *n, const struct ctl_daemon_info *d, const char *text, size_t len)
{
	struct ctl_request *req = malloc(sizeof(*req));
	char err[512];
	char *reply;
	int r;

	if (!req)
		return NULL;
	r = ctl_request_parse(text, len, req, err, sizeof(err));
	if (r < 0)
		reply = ctl_error_reply(err, r);
	else
		reply = ctl_execute(n, d, req);
	free(req);
	return reply;
}
