// SPDX-License-Identifier: Apache-2.0
/* Control requests: JSON (json-c) to struct ctl_request, and the replies. Every field is
 * checked here so that the proxy layer only sees well-formed requests. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl_json.h"
#include "ctl_portmap.h"
#include "ctl_proto.h"
#include "units.h"
#include "xp_tls.h"
#include "util.h"
#include "vmigd-config.h"

static const char *const op_names[] = {
	[CTL_TARGET_START] = "target-start",
	[CTL_TARGET_STOP] = "target-stop",
	[CTL_SOURCE_START] = "source-start",
	[CTL_SOURCE_STOP] = "source-stop",
	[CTL_LIST] = "list",
	[CTL_STATUS] = "status",
	[CTL_BANDWIDTH] = "bandwidth",
	[CTL_NODE_BANDWIDTH] = "node-bandwidth",
	[CTL_METRICS] = "metrics",
};

static int __attribute__((format(printf, 3, 4))) bad(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* Errors quote client text; keep them to the one line the protocol promises. */
static void one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

static int parse_key(struct json_object *o, struct ctl_request *req, char *err, size_t errlen)
{
	const char *key;

	key = ctl_json_member_cstring(o, "key");
	if (!key)
		return bad(err, errlen, "missing or bad \"key\" (a string)");
	if (!px_key_valid(key))
		return bad(err, errlen,
			   "invalid key \"%.40s\": use 1 to 128 characters of A-Z a-z 0-9 . _ -",
			   key);
	strcpy(req->key, key);
	return 0;
}

static int parse_sockets(struct json_object *o, struct ctl_request *req, char *err, size_t errlen)
{
	struct json_object *socks;

	if (!json_object_object_get_ex(o, "sockets", &socks) ||
	    !json_object_is_type(socks, json_type_object) || json_object_object_length(socks) == 0)
		return bad(err, errlen, "missing \"sockets\": give at least one PORTID=UNIXPATH");
	if (json_object_object_length(socks) > PX_PORTS_MAX)
		return bad(err, errlen, "too many sockets (at most 8)");
	json_object_object_foreach (socks, name, val) {
		struct px_port_info *p = &req->ports[req->nports];
		const char *path;

		if (px_port_parse(name, &p->id) < 0)
			return bad(err, errlen, "bad port id \"%.20s\": use 0 to 65535", name);
		path = ctl_json_cstring(val);
		if (!path)
			return bad(err, errlen, "the path for port %.20s is not a string", name);
		if (strlen(path) >= sizeof(p->path))
			return bad(err, errlen,
				   "socket path too long (at most 107 bytes): %.60s...", path);
		strcpy(p->path, path);
		req->nports++;
	}
	return 0;
}

/* "bandwidth": a JSON integer, bytes/s from 0 (no cap) to VM_RATE_MAX; optional unless said. */
static int parse_bandwidth(struct json_object *o, bool required, struct ctl_request *req, char *err,
			   size_t errlen)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, "bandwidth", &v)) {
		if (required)
			return bad(err, errlen, "missing \"bandwidth\" (bytes/s, 0 for no cap)");
		return 0;
	}
	if (!json_object_is_type(v, json_type_int))
		return bad(err, errlen,
			   "\"bandwidth\" must be an integer number of bytes/s (0 for no cap)");
	if (json_object_get_int64(v) < 0)
		return bad(err, errlen, "\"bandwidth\" must not be negative (0 for no cap)");
	if (json_object_get_uint64(v) > VM_RATE_MAX)
		return bad(err, errlen, "\"bandwidth\" is over the largest rate, %llu bytes/s",
			   VM_RATE_MAX);
	req->bandwidth = json_object_get_uint64(v);
	return 0;
}

static int parse_source(struct json_object *o, struct ctl_request *req, char *err, size_t errlen)
{
	struct json_object *t, *v;
	const char *dir;
	int r;

	if (!json_object_object_get_ex(o, "target", &t))
		return bad(err, errlen, "missing \"target\" (the JSON that target start printed)");
	r = ctl_portmap_from_json(t, &req->target, err, errlen);
	if (r < 0)
		return r;
	if (strcmp(req->target.key, req->key) != 0) {
		snprintf(err, errlen, "the target JSON is for migration %s, not %s",
			 req->target.key, req->key);
		return -EINVAL;
	}
	dir = ctl_json_member_cstring(o, "dir");
	if (!dir)
		return bad(err, errlen, "missing \"dir\" (the base directory)");
	if (strlen(dir) >= sizeof(req->dir))
		return bad(err, errlen, "\"dir\" is too long");
	strcpy(req->dir, dir);
	if (json_object_object_get_ex(o, "test_delay_first_ms", &v)) {
		int64_t ms = json_object_get_int64(v);

		if (!json_object_is_type(v, json_type_int) || ms < 0 || ms > 600000)
			return bad(err, errlen, "\"test_delay_first_ms\" must be 0..600000");
		req->delay_first_ms = ms;
	}
	return 0;
}

/* A policy field: a bool, or a whole number from 0 to max. Absent leaves *v. */
static int policy_bool(struct json_object *o, const char *name, bool *v, char *err, size_t errlen)
{
	struct json_object *f;

	if (!json_object_object_get_ex(o, name, &f))
		return 0;
	if (!json_object_is_type(f, json_type_boolean))
		return bad(err, errlen, "policy: \"%s\" must be true or false", name);
	*v = json_object_get_boolean(f);
	return 0;
}

static int policy_u64(struct json_object *o, const char *name, uint64_t max, uint64_t *v,
		      char *err, size_t errlen)
{
	struct json_object *f;

	if (!json_object_object_get_ex(o, name, &f))
		return 0;
	if (!json_object_is_type(f, json_type_int) || json_object_get_int64(f) < 0 ||
	    json_object_get_uint64(f) > max)
		return bad(err, errlen, "policy: \"%s\" must be a whole number from 0 to %llu",
			   name, (unsigned long long)max);
	*v = json_object_get_uint64(f);
	return 0;
}

static const char *const policy_fields[] = {
	"allowAutoConverge", "allowPostCopy",	"allowWorkloadDisruption", "completionTimeoutPerGiB",
	"progressTimeout",   "bandwidth",	"maxDowntimeMs",	   "evidenceWindowMs",
};

/* KubeVirt's names; allowWorkloadDisruption follows allowPostCopy unless given (as there). */
static int parse_policy(struct json_object *o, struct cv_policy *p, char *err, size_t errlen)
{
	bool disruption_given = json_object_object_get_ex(o, "allowWorkloadDisruption", NULL);
	int r = 0;

	if (!json_object_is_type(o, json_type_object))
		return bad(err, errlen, "\"policy\" must be a JSON object");
	json_object_object_foreach (o, name, val) {
		unsigned int i;

		(void)val;
		for (i = 0; i < ARRAY_SIZE(policy_fields); i++)
			if (!strcmp(name, policy_fields[i]))
				break;
		if (i == ARRAY_SIZE(policy_fields))
			return bad(err, errlen,
				   "policy: unknown field \"%.40s\" (known: allowAutoConverge, "
				   "allowPostCopy, allowWorkloadDisruption, completionTimeoutPerGiB, "
				   "progressTimeout, bandwidth, maxDowntimeMs, evidenceWindowMs)",
				   name);
	}
	r = r ?: policy_bool(o, "allowAutoConverge", &p->allow_auto_converge, err, errlen);
	r = r ?: policy_bool(o, "allowPostCopy", &p->allow_post_copy, err, errlen);
	r = r ?: policy_bool(o, "allowWorkloadDisruption", &p->allow_workload_disruption, err,
			     errlen);
	r = r ?: policy_u64(o, "completionTimeoutPerGiB", 1000000, &p->completion_timeout_per_gib,
			    err, errlen);
	r = r ?: policy_u64(o, "progressTimeout", 1000000, &p->progress_timeout_s, err, errlen);
	r = r ?: policy_u64(o, "bandwidth", VM_RATE_MAX, &p->bandwidth, err, errlen);
	r = r ?: policy_u64(o, "maxDowntimeMs", 2000000, &p->max_downtime_ms, err, errlen);
	r = r ?: policy_u64(o, "evidenceWindowMs", 600000, &p->window_ms, err, errlen);
	if (r == 0 && !disruption_given)
		p->allow_workload_disruption = p->allow_post_copy;
	return r;
}

/*
 * "convergence": {"mode": "predictive"|"kubevirt", "qmp": PATH | "libvirt": {"uri", "domain"},
 * "policy": {...}}.
 */
static int parse_convergence(struct json_object *o, struct ctl_request *req, char *err,
			     size_t errlen)
{
	struct json_object *c, *v, *lv;
	struct cv_spec *sp = &req->conv;
	const char *s;
	int r;

	if (!json_object_object_get_ex(o, "convergence", &c))
		return 0;
	if (!json_object_is_type(c, json_type_object))
		return bad(err, errlen, "\"convergence\" must be a JSON object");
	cv_policy_default(&sp->policy);
	s = ctl_json_member_cstring(c, "mode");
	if (json_object_object_get_ex(c, "mode", NULL)) {
		if (!s || (strcmp(s, "predictive") && strcmp(s, "kubevirt")))
			return bad(err, errlen,
				   "convergence: \"mode\" must be \"predictive\" or \"kubevirt\"");
		sp->policy.mode = strcmp(s, "kubevirt") ? CV_MODE_PREDICTIVE : CV_MODE_KUBEVIRT;
	}
	if (json_object_object_get_ex(c, "qmp", &v) == json_object_object_get_ex(c, "libvirt", &lv))
		return bad(err, errlen,
			   "convergence: give one backend, \"qmp\" (a QMP socket path) or "
			   "\"libvirt\" ({\"domain\": NAME, \"uri\": URI})");
	if (json_object_object_get_ex(c, "qmp", &v)) {
		s = ctl_json_cstring(v);
		if (!s || !*s || strlen(s) >= sizeof(sp->qmp))
			return bad(err, errlen,
				   "convergence: \"qmp\" must be a socket path of 1 to 107 bytes");
		sp->backend = CV_BACKEND_QMP;
		strcpy(sp->qmp, s);
	} else {
		const char *dom = ctl_json_member_cstring(lv, "domain");
		const char *uri = ctl_json_member_cstring(lv, "uri");

		if (!dom || !*dom || strlen(dom) >= sizeof(sp->domain))
			return bad(err, errlen,
				   "convergence: libvirt needs \"domain\" (a name or UUID)");
		if (json_object_object_get_ex(lv, "uri", NULL) &&
		    (!uri || strlen(uri) >= sizeof(sp->uri)))
			return bad(err, errlen, "convergence: libvirt \"uri\" must be a string");
		sp->backend = CV_BACKEND_LIBVIRT;
		strcpy(sp->domain, dom);
		if (uri)
			strcpy(sp->uri, uri);
	}
	if (json_object_object_get_ex(c, "policy", &v)) {
		r = parse_policy(v, &sp->policy, err, errlen);
		if (r < 0)
			return r;
		sp->policy_given = true;
	}
	json_object_object_foreach (c, name, val) {
		(void)val;
		if (strcmp(name, "mode") && strcmp(name, "qmp") && strcmp(name, "libvirt") &&
		    strcmp(name, "policy"))
			return bad(err, errlen,
				   "convergence: unknown field \"%.40s\" (known: mode, qmp, libvirt, "
				   "policy)",
				   name);
	}
	if (sp->policy.mode == CV_MODE_PREDICTIVE && sp->policy.window_ms == 0)
		return bad(err, errlen, "policy: \"evidenceWindowMs\" must be at least 1");
	req->converge = true;
	return 0;
}

/* The policy's bandwidth and the request's are one cap: either, or both the same. */
static int join_bandwidth(struct json_object *o, struct ctl_request *req, char *err,
			  size_t errlen)
{
	struct cv_policy *p = &req->conv.policy;

	if (!req->converge || !p->bandwidth)
		return 0;
	if (json_object_object_get_ex(o, "bandwidth", NULL) && req->bandwidth != p->bandwidth)
		return bad(err, errlen,
			   "\"bandwidth\" (%llu) and the policy's \"bandwidth\" (%llu) differ: "
			   "give one",
			   (unsigned long long)req->bandwidth, (unsigned long long)p->bandwidth);
	req->bandwidth = p->bandwidth;
	return 0;
}

int ctl_request_parse(const char *text, size_t len, struct ctl_request *ret, char *err,
		      size_t errlen)
{
	struct json_tokener *tok;
	struct json_object *o;
	struct ctl_request *req;
	const char *op;
	int r = -EINVAL;

	if (len > CTL_REQUEST_MAX)
		return bad(err, errlen, "request too large (over 64 KiB)");
	req = calloc(1, sizeof(*req));
	tok = json_tokener_new();
	if (!req || !tok) {
		free(req);
		json_tokener_free(tok);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	o = json_tokener_parse_ex(tok, text, len);
	if (!o || json_tokener_get_parse_end(tok) < len) {
		/* Trailing white space after the object is fine, anything else is not. */
		size_t end = json_tokener_get_parse_end(tok);

		while (o && end < len &&
		       (text[end] == '\n' || text[end] == ' ' || text[end] == '\r' ||
			text[end] == '\t'))
			end++;
		if (!o || end < len) {
			enum json_tokener_error je = json_tokener_get_error(tok);

			bad(err, errlen, "request is not one JSON object: %s",
			    o				  ? "trailing data"
			    : je == json_tokener_continue ? "incomplete JSON"
							  : json_tokener_error_desc(je));
			goto out;
		}
	}
	if (!json_object_is_type(o, json_type_object)) {
		bad(err, errlen, "request is not a JSON object");
		goto out;
	}
	op = ctl_json_member_cstring(o, "op");
	if (!op) {
		bad(err, errlen, "missing or bad \"op\"");
		goto out;
	}
	for (r = 0; r < (int)ARRAY_SIZE(op_names); r++)
		if (strcmp(op, op_names[r]) == 0)
			break;
	if (r == (int)ARRAY_SIZE(op_names)) {
		r = bad(err, errlen, "unknown op \"%.40s\"", op);
		goto out;
	}
	req->op = r;
	r = 0;
	if (req->op != CTL_LIST && req->op != CTL_STATUS && req->op != CTL_NODE_BANDWIDTH &&
	    req->op != CTL_METRICS)
		r = parse_key(o, req, err, errlen);
	if (r == 0 && req->op == CTL_TARGET_START)
		r = parse_sockets(o, req, err, errlen);
	if (r == 0 && req->op == CTL_SOURCE_START)
		r = parse_source(o, req, err, errlen);
	if (r == 0 && (req->op == CTL_TARGET_START || req->op == CTL_SOURCE_START ||
		       req->op == CTL_BANDWIDTH || req->op == CTL_NODE_BANDWIDTH))
		r = parse_bandwidth(o, req->op == CTL_BANDWIDTH || req->op == CTL_NODE_BANDWIDTH,
				    req, err, errlen);
	if (r == 0 && req->op == CTL_SOURCE_START)
		r = parse_convergence(o, req, err, errlen);
	if (r == 0 && req->op == CTL_SOURCE_START)
		r = join_bandwidth(o, req, err, errlen);
	if (r == 0 && req->converge)
		req->conv.policy.bandwidth = req->bandwidth;
	if (r == 0)
		*ret = *req;
out:
	if (r < 0)
		one_line(err);
	json_object_put(o);
	json_tokener_free(tok);
	free(req);
	return r;
}

static char *reply_text(struct json_object *o)
{
	/* Seconds with millisecond precision, not 17 significant digits. */
	json_c_set_serialization_double_format("%.3f", JSON_C_OPTION_THREAD);
	char *s = NULL;

	if (o &&
	    asprintf(&s, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN)) < 0)
		s = NULL;
	json_object_put(o);
	return s;
}

char *ctl_error_reply(const char *msg)
{
	struct json_object *o = json_object_new_object();
	char line[512];

	snprintf(line, sizeof(line), "%s", msg);
	one_line(line);
	json_object_object_add(o, "ok", json_object_new_boolean(0));
	json_object_object_add(o, "error", json_object_new_string(line));
	return reply_text(o);
}

static struct json_object *ok_reply(void)
{
	struct json_object *o = json_object_new_object();

	json_object_object_add(o, "ok", json_object_new_boolean(1));
	return o;
}

static struct json_object *conn_list(const struct px_migration_info *mi);

static struct json_object *u64(uint64_t v)
{
	return json_object_new_uint64(v);
}

static struct json_object *rates_object(const struct px_rates *r)
{
	struct json_object *o = json_object_new_object();

	json_object_object_add(o, "tx_1s", u64(r->tx_1s));
	json_object_object_add(o, "tx_10s", u64(r->tx_10s));
	json_object_object_add(o, "rx_1s", u64(r->rx_1s));
	json_object_object_add(o, "rx_10s", u64(r->rx_10s));
	return o;
}

static const char *role_str(enum px_role r)
{
	return r == PX_ROLE_SOURCE ? "source" : "target";
}

static struct json_object *dbl(double v)
{
	return json_object_new_double(v);
}

/* What the convergence module sees and did for one migration (status and metrics). */
static struct json_object *convergence_object(const struct cv_report *r)
{
	struct json_object *o = json_object_new_object(), *p = json_object_new_object(),
			   *acts = json_object_new_array(), *counts = json_object_new_object();
	const struct cv_policy *pol = &r->policy;

	json_object_object_add(o, "mode", json_object_new_string(cv_mode_str(r->mode)));
	json_object_object_add(o, "backend", json_object_new_string(r->backend));
	json_object_object_add(p, "allowAutoConverge",
			       json_object_new_boolean(pol->allow_auto_converge));
	json_object_object_add(p, "allowPostCopy", json_object_new_boolean(pol->allow_post_copy));
	json_object_object_add(p, "allowWorkloadDisruption",
			       json_object_new_boolean(pol->allow_workload_disruption));
	json_object_object_add(p, "completionTimeoutPerGiB", u64(pol->completion_timeout_per_gib));
	json_object_object_add(p, "progressTimeout", u64(pol->progress_timeout_s));
	json_object_object_add(p, "bandwidth", u64(pol->bandwidth));
	json_object_object_add(p, "maxDowntimeMs", u64(pol->max_downtime_ms));
	json_object_object_add(p, "evidenceWindowMs", u64(pol->window_ms));
	json_object_object_add(o, "policy", p);
	json_object_object_add(o, "state", json_object_new_string(r->finished ? "finished"
								  : r->stopped	      ? "stopped"
								  : r->elapsed_ms < 0 ? "waiting"
										     : "watching"));
	json_object_object_add(o, "elapsed_ms", json_object_new_int64(r->elapsed_ms));
	json_object_object_add(o, "job", r->have_job ? cv_job_json(&r->job) : NULL);
	json_object_object_add(o, "dirty_rate", u64(r->dirty_rate));
	json_object_object_add(o, "dirty_rate_from",
			       r->dirty_from ? json_object_new_string(r->dirty_from) : NULL);
	json_object_object_add(o, "link_rate", u64(r->link_rate));
	for (unsigned int i = 0; i < r->nactions && i < CV_ACTIONS_MAX; i++) {
		const struct cv_action_rec *a = &r->actions[i];
		struct json_object *ao = json_object_new_object();

		json_object_object_add(ao, "at_s", dbl(a->at_ms / 1000.0));
		json_object_object_add(ao, "action", json_object_new_string(cv_act_str(a->act)));
		json_object_object_add(ao, "ok", json_object_new_boolean(a->ok));
		json_object_object_add(ao, "reason", json_object_new_string(a->reason));
		if (!a->ok)
			json_object_object_add(ao, "error", json_object_new_string(a->error));
		json_object_array_add(acts, ao);
	}
	json_object_object_add(o, "actions", acts);
	for (unsigned int i = CV_ACT_RAISE_CAP; i <= CV_ACT_ABORT; i++)
		json_object_object_add(counts, cv_act_str(i), json_object_new_int(r->counts[i]));
	json_object_object_add(o, "action_counts", counts);
	json_object_object_add(o, "query_errors", json_object_new_int(r->query_errors));
	if (r->query_errors)
		json_object_object_add(o, "last_error", json_object_new_string(r->last_error));
	if (r->outcome[0])
		json_object_object_add(o, "outcome", json_object_new_string(r->outcome));
	json_object_object_add(o, "irrecoverable", json_object_new_boolean(r->irrecoverable));
	return o;
}

/* The convergence object of a source migration that has a monitor, else NULL. */
static struct json_object *convergence_of(struct cv_set *set, const struct px_migration_info *mi)
{
	struct cv_report *r;
	struct json_object *o = NULL;

	if (!set || mi->role != PX_ROLE_SOURCE)
		return NULL;
	r = malloc(sizeof(*r));
	if (r && cv_watch_report(set, mi->key, r))
		o = convergence_object(r);
	free(r);
	return o;
}

struct status_walk {
	struct json_object *migs;
	struct cv_set *conv;
};

static void add_migration(const struct px_migration_info *mi, void *arg)
{
	struct status_walk *sw = arg;
	struct json_object *a = sw->migs, *o = json_object_new_object(),
			   *ports = json_object_new_array(), *cv;

	json_object_object_add(o, "key", json_object_new_string(mi->key));
	json_object_object_add(o, "role", json_object_new_string(role_str(mi->role)));
	for (unsigned int i = 0; i < mi->nports; i++) {
		struct json_object *p = json_object_new_object();

		json_object_object_add(p, "port", json_object_new_int(mi->ports[i].id));
		json_object_object_add(p, "socket", json_object_new_string(mi->ports[i].path));
		json_object_array_add(ports, p);
	}
	json_object_object_add(o, "ports", ports);
	if (mi->peer)
		json_object_object_add(o, "peer", json_object_new_string(mi->peer));
	json_object_object_add(o, "state", json_object_new_string(mi->state));
	if (mi->error)
		json_object_object_add(o, "error", json_object_new_string(mi->error));
	json_object_object_add(o, "seconds",
			       json_object_new_double((vm_now_ms() - mi->started_ms) / 1000.0));
	json_object_object_add(o, "connections", json_object_new_int(mi->conns_total));
	json_object_object_add(o, "connections_active", json_object_new_int(mi->conns_active));
	json_object_object_add(o, "connections_failed", json_object_new_int(mi->conns_failed));
	json_object_object_add(o, "connections_reordered",
			       json_object_new_int(mi->conns_reordered));
	json_object_object_add(o, "bytes_tx", json_object_new_int64(mi->bytes_tx));
	json_object_object_add(o, "bytes_rx", json_object_new_int64(mi->bytes_rx));
	json_object_object_add(o, "cap", u64(mi->cap));
	json_object_object_add(o, "limit", u64(mi->limit));
	json_object_object_add(o, "rate", rates_object(&mi->rate));
	json_object_object_add(o, "connection_list", conn_list(mi));
	cv = convergence_of(sw->conv, mi);
	if (cv)
		json_object_object_add(o, "convergence", cv);
	json_object_array_add(a, o);
}

/* One connection as status shows it: where it is, the mode it runs in, its bytes. */
static struct json_object *conn_object(const struct px_conn_info *c)
{
	struct json_object *o = json_object_new_object();

	json_object_object_add(o, "port", u64(c->port));
	json_object_object_add(o, "seq", u64(c->seq));
	json_object_object_add(o, "state", json_object_new_string(c->state));
	json_object_object_add(o, "tls", json_object_new_string(c->tls ? c->tls : "off"));
	if (c->tls) {
		json_object_object_add(o, "cipher", json_object_new_string(c->cipher));
		json_object_object_add(o, "crypto", json_object_new_string(c->crypto));
		json_object_object_add(o, "resumed", json_object_new_boolean(c->resumed));
	}
	json_object_object_add(o, "bytes_tx", u64(c->bytes_tx));
	json_object_object_add(o, "bytes_rx", u64(c->bytes_rx));
	return o;
}

/* Every connection open now, with the mode it runs in. */
static struct json_object *conn_list(const struct px_migration_info *mi)
{
	struct json_object *a = json_object_new_array();

	for (unsigned int i = 0; i < mi->nconns; i++)
		json_object_array_add(a, conn_object(&mi->conns[i]));
	return a;
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
	allow = json_object_new_array();
	for (unsigned int i = 0; xp_tls_allow_list(d->tls, i); i++)
		json_object_array_add(allow, json_object_new_string(xp_tls_allow_list(d->tls, i)));
	json_object_object_add(o, "allow", allow);
	return o;
}

static struct json_object *status_object(struct px_node *n, const struct ctl_daemon_info *d)
{
	struct json_object *s = json_object_new_object(), *migs = json_object_new_array();
	struct px_node_info ni;

	json_object_object_add(s, "version", json_object_new_string(VMIGD_VERSION));
	json_object_object_add(s, "pid", json_object_new_int(getpid()));
	json_object_object_add(s, "control", json_object_new_string(d->control_path));
	json_object_object_add(s, "listen", json_object_new_string(px_node_listen_str(n)));
	json_object_object_add(s, "advertise", json_object_new_string(px_node_advertise(n)));
	json_object_object_add(s, "tls", tls_object(d));
	json_object_object_add(s, "data_path", json_object_new_string(px_node_data_path(n)));
	json_object_object_add(s, "threads", json_object_new_int(px_node_threads(n)));
	json_object_object_add(s, "uptime",
			       json_object_new_double((vm_now_ms() - d->started_ms) / 1000.0));
	json_object_object_add(s, "migrations", json_object_new_int(px_node_migrations(n)));
	json_object_object_add(s, "connections_active",
			       json_object_new_int(px_node_active_conns(n)));
	px_node_info(n, &ni);
	json_object_object_add(s, "bandwidth", u64(ni.bandwidth));
	json_object_object_add(s, "shaper", json_object_new_string(px_shaper_str(ni.shaper)));
	json_object_object_add(s, "inspect", json_object_new_boolean(ni.inspect));
	if (d->metrics)
		json_object_object_add(s, "metrics", json_object_new_string(d->metrics));
	px_node_foreach(n, add_migration, &(struct status_walk){ .migs = migs, .conv = d->conv });
	json_object_object_add(s, "migration_list", migs);
	return s;
}

/* The metrics reply: what the inspector made of a migration's connections, summed. */
static struct json_object *insp_summary_object(const struct px_insp_summary *s)
{
	struct json_object *o = json_object_new_object(), *ch = json_object_new_object();

	json_object_object_add(ch, "main", json_object_new_int(s->main));
	json_object_object_add(ch, "multifd", json_object_new_int(s->multifd));
	json_object_object_add(ch, "other", json_object_new_int(s->other));
	json_object_object_add(o, "channels", ch);
	json_object_object_add(o, "bytes_only", json_object_new_int(s->bytes_only));
	json_object_object_add(o, "reason",
			       s->reason[0] ? json_object_new_string(s->reason) : NULL);
	json_object_object_add(o, "stream_version", u64(s->stream_version));
	json_object_object_add(o, "machine", json_object_new_string(s->machine));
	json_object_object_add(o, "page_size", u64(s->page_size));
	json_object_object_add(o, "pages", u64(s->pages));
	json_object_object_add(o, "zero_pages", u64(s->zero_pages));
	json_object_object_add(o, "packets", u64(s->packets));
	json_object_object_add(o, "syncs", u64(s->syncs));
	json_object_object_add(o, "passes", u64(s->passes));
	json_object_object_add(o, "dirty_known", json_object_new_boolean(s->dirty_known));
	json_object_object_add(o, "dirty_pages_per_pass",
			       s->dirty_known ? u64(s->dirty_pages_per_pass) : NULL);
	json_object_object_add(o, "dirty_rate", s->dirty_known ? u64(s->dirty_rate) : NULL);
	json_object_object_add(o, "switchover", json_object_new_boolean(s->switchover));
	return o;
}

static struct json_object *insp_stats_object(const struct px_insp_stats *s)
{
	struct json_object *o = json_object_new_object();

	json_object_object_add(o, "kind", json_object_new_string(px_insp_kind_str(s->kind)));
	json_object_object_add(o, "bytes_only", json_object_new_boolean(s->bytes_only));
	json_object_object_add(o, "reason",
			       s->reason[0] ? json_object_new_string(s->reason) : NULL);
	json_object_object_add(o, "stream_version", u64(s->stream_version));
	json_object_object_add(o, "machine", json_object_new_string(s->machine));
	json_object_object_add(o, "channel_id", json_object_new_int(s->channel_id));
	json_object_object_add(o, "page_size", u64(s->page_size));
	json_object_object_add(o, "bytes", u64(s->bytes));
	json_object_object_add(o, "pages", u64(s->pages));
	json_object_object_add(o, "zero_pages", u64(s->zero_pages));
	json_object_object_add(o, "packets", u64(s->packets));
	json_object_object_add(o, "syncs", u64(s->syncs));
	json_object_object_add(o, "sync_bytes_last", u64(s->sync_bytes_last));
	json_object_object_add(o, "passes", u64(s->passes));
	json_object_object_add(o, "pass_pages_last", u64(s->pass_pages_last));
	json_object_object_add(o, "pass_ms_last", u64(s->pass_ms_last));
	json_object_object_add(o, "switchover", json_object_new_boolean(s->switchover));
	return o;
}

static struct json_object *metrics_conn(const struct px_conn_info *c)
{
	struct json_object *o = conn_object(c);

	json_object_object_add(o, "rates", rates_object(&c->rate));
	json_object_object_add(o, "shaped_ms", u64(c->shaped_ms));
	json_object_object_add(o, "pacing", u64(c->pacing));
	json_object_object_add(o, "inspect", c->inspected ? insp_stats_object(&c->insp) : NULL);
	return o;
}

struct metrics_walk {
	struct json_object *migs;
	struct cv_set *conv;
	uint64_t now_ms;
	double now_unix; /* CLOCK_REALTIME at now_ms */
};

static void add_metrics_migration(const struct px_migration_info *mi, void *arg)
{
	struct metrics_walk *w = arg;
	struct json_object *o = json_object_new_object(), *c = json_object_new_object(),
			   *ports = json_object_new_array(), *conns = json_object_new_array();
	double age = w->now_ms > mi->started_ms ? (w->now_ms - mi->started_ms) / 1000.0 : 0;

	json_object_object_add(o, "key", json_object_new_string(mi->key));
	json_object_object_add(o, "role", json_object_new_string(role_str(mi->role)));
	json_object_object_add(o, "state", json_object_new_string(mi->state));
	if (mi->error)
		json_object_object_add(o, "error", json_object_new_string(mi->error));
	if (mi->peer)
		json_object_object_add(o, "peer", json_object_new_string(mi->peer));
	json_object_object_add(o, "started_unix", json_object_new_double(w->now_unix - age));
	json_object_object_add(o, "duration_s", json_object_new_double(age));
	json_object_object_add(o, "bytes_tx", u64(mi->bytes_tx));
	json_object_object_add(o, "bytes_rx", u64(mi->bytes_rx));
	json_object_object_add(o, "rates", rates_object(&mi->rate));
	json_object_object_add(c, "active", json_object_new_int(mi->conns_active));
	json_object_object_add(c, "total", json_object_new_int(mi->conns_total));
	json_object_object_add(c, "failed", json_object_new_int(mi->conns_failed));
	json_object_object_add(c, "reordered", json_object_new_int(mi->conns_reordered));
	json_object_object_add(o, "conns", c);
	json_object_object_add(o, "cap", u64(mi->cap));
	json_object_object_add(o, "limit", u64(mi->limit));
	json_object_object_add(o, "cap_lifted", json_object_new_boolean(mi->cap_lifted));
	json_object_object_add(o, "shaped_ms", u64(mi->shaped_ms));
	json_object_object_add(o, "mode", json_object_new_string(mi->mode ? mi->mode : "plain"));
	json_object_object_add(o, "inspect", mi->inspected ? insp_summary_object(&mi->insp) : NULL);
	for (unsigned int i = 0; i < mi->nports; i++) {
		const struct px_port_info *pi = &mi->ports[i];
		struct json_object *p = json_object_new_object(), *pc = json_object_new_object();

		json_object_object_add(p, "id", u64(pi->id));
		json_object_object_add(p, "socket", json_object_new_string(pi->path));
		json_object_object_add(p, "bytes_tx", u64(pi->bytes_tx));
		json_object_object_add(p, "bytes_rx", u64(pi->bytes_rx));
		json_object_object_add(p, "rates", rates_object(&pi->rate));
		json_object_object_add(pc, "active", json_object_new_int(pi->conns_active));
		json_object_object_add(pc, "total", json_object_new_int(pi->conns_total));
		json_object_object_add(p, "conns", pc);
		json_object_array_add(ports, p);
	}
	json_object_object_add(o, "ports", ports);
	for (unsigned int i = 0; i < mi->nconns; i++)
		json_object_array_add(conns, metrics_conn(&mi->conns[i]));
	json_object_object_add(o, "connections", conns);
	json_object_object_add(o, "convergence", convergence_of(w->conv, mi));
	json_object_array_add(w->migs, o);
}

/* {"ok":true,"node":{...},"migrations":[...]}: everything px_node_info() and the walk give. */
static struct json_object *metrics_reply(struct px_node *n, struct cv_set *conv)
{
	struct metrics_walk w = { .migs = json_object_new_array(),
				  .conv = conv,
				  .now_ms = vm_now_ms() };
	struct json_object *o = ok_reply(), *node = json_object_new_object();
	struct px_node_info ni;
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	w.now_unix = ts.tv_sec + ts.tv_nsec / 1e9;
	px_node_info(n, &ni);
	json_object_object_add(node, "bandwidth", u64(ni.bandwidth));
	json_object_object_add(node, "shaper", json_object_new_string(px_shaper_str(ni.shaper)));
	json_object_object_add(node, "inspect", json_object_new_boolean(ni.inspect));
	json_object_object_add(node, "bytes_tx", u64(ni.bytes_tx));
	json_object_object_add(node, "bytes_rx", u64(ni.bytes_rx));
	json_object_object_add(node, "rates", rates_object(&ni.rate));
	json_object_object_add(node, "migrations", json_object_new_int(ni.migrations));
	json_object_object_add(node, "conns_active", json_object_new_int(ni.conns_active));
	json_object_object_add(node, "conns_total", u64(ni.conns_total));
	json_object_object_add(node, "time_unix", json_object_new_double(w.now_unix));
	json_object_object_add(o, "node", node);
	px_node_foreach(n, add_metrics_migration, &w);
	json_object_object_add(o, "migrations", w.migs);
	return o;
}

char *ctl_execute(struct px_node *n, const struct ctl_daemon_info *d, const struct ctl_request *req)
{
	struct px_port_info socks[PX_PORTS_MAX];
	struct px_portmap t;
	struct json_object *o, *arr;
	char err[512];
	int r = 0;

	switch (req->op) {
	case CTL_TARGET_START:
		r = px_target_start(n, req->key, req->nports, req->ports, req->bandwidth, &t, err,
				    sizeof(err));
		if (r < 0)
			break;
		o = ok_reply();
		json_object_object_add(o, "target", ctl_portmap_to_json(&t));
		return reply_text(o);
	case CTL_SOURCE_START:
		if (req->converge && !d->conv) {
			snprintf(err, sizeof(err), "convergence control is not available here");
			r = -ENOTSUP;
			break;
		}
		/* The backend first: capabilities must be set before QEMU migrates. */
		if (req->converge) {
			r = cv_watch_start(d->conv, req->key, &req->conv, err, sizeof(err));
			if (r < 0)
				break;
		}
		r = px_source_start(n, &req->target, req->dir, req->delay_first_ms, req->bandwidth,
				    socks, err, sizeof(err));
		if (r < 0) {
			if (req->converge)
				cv_watch_stop(d->conv, req->key);
			break;
		}
		o = ok_reply();
		arr = json_object_new_array();
		for (unsigned int i = 0; i < req->target.nports; i++)
			json_object_array_add(arr, json_object_new_string(socks[i].path));
		json_object_object_add(o, "sockets", arr);
		return reply_text(o);
	case CTL_TARGET_STOP:
	case CTL_SOURCE_STOP:
		r = (req->op == CTL_TARGET_STOP ? px_target_stop : px_source_stop)(n, req->key, err,
										   sizeof(err));
		if (r < 0)
			break;
		if (req->op == CTL_SOURCE_STOP && d->conv)
			cv_watch_stop(d->conv, req->key);
		return reply_text(ok_reply());
	case CTL_LIST:
		o = ok_reply();
		arr = json_object_new_array();
		px_node_foreach(n, add_migration, &(struct status_walk){ .migs = arr, .conv = d->conv });
		json_object_object_add(o, "migrations", arr);
		return reply_text(o);
	case CTL_STATUS:
		o = ok_reply();
		json_object_object_add(o, "status", status_object(n, d));
		return reply_text(o);
	case CTL_BANDWIDTH:
		r = px_migration_set_cap(n, req->key, req->bandwidth, err, sizeof(err));
		if (r < 0)
			break;
		return reply_text(ok_reply());
	case CTL_NODE_BANDWIDTH:
		px_node_set_bandwidth(n, req->bandwidth);
		return reply_text(ok_reply());
	case CTL_METRICS:
		return reply_text(metrics_reply(n, d->conv));
	}
	return ctl_error_reply(err);
}

char *ctl_handle(struct px_node *n, const struct ctl_daemon_info *d, const char *text, size_t len)
{
	struct ctl_request *req = malloc(sizeof(*req));
	char err[512];
	char *reply;

	if (!req)
		return NULL;
	if (ctl_request_parse(text, len, req, err, sizeof(err)) < 0)
		reply = ctl_error_reply(err);
	else
		reply = ctl_execute(n, d, req);
	free(req);
	return reply;
}
