// SPDX-License-Identifier: Apache-2.0
/* Control requests: JSON (json-c) to struct ctl_request, one entry per operation in ops[]. Every
 * field is checked here so that the proxy layer only sees well-formed requests. Pure: no daemon
 * state and no replies (ctl_proto.c executes a request and answers it). */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ctl_json.h"
#include "ctl_portmap.h"
#include "ctl_request.h"
#include "units.h"
#include "util.h"

static int __attribute__((format(printf, 3, 4))) bad(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
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
	struct json_object *t;
	const char *dir;
	int r;

	if (!json_object_object_get_ex(o, "target", &t))
		return bad(err, errlen, "missing \"target\" (the JSON that target start printed)");
	r = ctl_portmap_from_json(t, &req->target, err, errlen);
	if (r < 0)
		return r;
	/* KubeVirt's fields carry no key: the request's is the migration's. */
	if (req->target.kubevirt && !req->target.key[0])
		strcpy(req->target.key, req->key);
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
	return 0;
}

/* An optional boolean field, its error prefixed by where ("" or "policy: "): absent leaves *v. */
static int bool_field(struct json_object *o, const char *where, const char *name, bool *v,
		      char *err, size_t errlen)
{
	struct json_object *f;

	if (!json_object_object_get_ex(o, name, &f))
		return 0;
	if (!json_object_is_type(f, json_type_boolean))
		return bad(err, errlen, "%s\"%s\" must be true or false", where, name);
	*v = json_object_get_boolean(f);
	return 0;
}

/* A policy field: a bool, or a whole number from 0 to max. Absent leaves *v. */
static int policy_bool(struct json_object *o, const char *name, bool *v, char *err, size_t errlen)
{
	return bool_field(o, "policy: ", name, v, err, errlen);
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

/* A fraction written as KubeVirt does (a JSON number, or a string such as "0.4"), as
 * hundredths, from lo to hi. Absent leaves *v. */
static int policy_hundredths(struct json_object *o, const char *name, unsigned int lo,
			     unsigned int hi, unsigned int *v, char *err, size_t errlen)
{
	struct json_object *f;
	const char *str;
	char *end;
	double d;

	if (!json_object_object_get_ex(o, name, &f))
		return 0;
	if (json_object_is_type(f, json_type_double) || json_object_is_type(f, json_type_int)) {
		d = json_object_get_double(f);
	} else if ((str = ctl_json_cstring(f)) && *str) {
		d = strtod(str, &end);
		if (*end)
			d = -1;
	} else {
		d = -1;
	}
	if (!(d * 100 >= lo && d * 100 <= hi))
		return bad(err, errlen, "policy: \"%s\" must be a number from %.2f to %.2f", name,
			   lo / 100.0, hi / 100.0);
	*v = (unsigned int)(d * 100 + 0.5);
	return 0;
}

/*
 * bandwidthPerMigration as KubeVirt serialises it: a Quantity ("64Mi", "1Gi", "500M", "0")
 * or a whole number of bytes/s. KubeVirt hands libvirt whole MiB/s, half up, at least 1 unless
 * 0 (unlimited); the same here.
 */
static int policy_quantity(struct json_object *o, const char *name, uint64_t *v, char *err,
			   size_t errlen)
{
	struct json_object *f;
	const char *str;
	char q[40];
	uint64_t b;

	if (!json_object_object_get_ex(o, name, &f))
		return 0;
	if (json_object_is_type(f, json_type_int) && json_object_get_int64(f) >= 0) {
		b = json_object_get_uint64(f);
	} else {
		str = ctl_json_cstring(f);
		if (!str || strlen(str) >= sizeof(q))
			goto refuse;
		snprintf(q, sizeof(q), "%s", str);
		/* Kubernetes writes kilo as "k"; vmigd's units take "K". Milli ("m") is no rate. */
		if (strlen(q) == strspn(q, "0123456789.") + 1 && q[strlen(q) - 1] == 'k')
			q[strlen(q) - 1] = 'K';
		if (vm_parse_rate(q, &b) < 0 || strstr(q, "bit") || strstr(q, "bps"))
			goto refuse;
	}
	if (b > VM_RATE_MAX)
		goto refuse;
	if (b) {
		uint64_t mib = (b + (1u << 19)) >> 20;

		b = (mib ? mib : 1) << 20;
	}
	*v = b;
	return 0;
refuse:
	return bad(err, errlen,
		   "policy: \"%s\" must be a Kubernetes quantity of bytes/s such as \"64Mi\" or "
		   "\"1Gi\", or a whole number",
		   name);
}

/*
 * The fields of o against the known names: one that differs from a known name only in case is
 * refused ("did you mean"); the others vmigd does not know are appended to ign, after prefix,
 * for one log line.
 */
static int sort_fields(struct json_object *o, const char *const *known, size_t nknown,
		       const char *prefix, char *ign, size_t ignlen, char *err, size_t errlen)
{
	json_object_object_foreach (o, name, val) {
		size_t i, n = strlen(ign);

		(void)val;
		for (i = 0; i < nknown && strcmp(name, known[i]); i++)
			if (!strcasecmp(name, known[i]))
				return bad(err, errlen, "policy: \"%.40s\": did you mean \"%s\"?",
					   name, known[i]);
		if (i == nknown && n + 2 < ignlen)
			snprintf(ign + n, ignlen - n, "%s%s%.40s", n ? ", " : "", prefix, name);
	}
	return 0;
}

/* VEP 248's options, in a "stallDetector" object (KubeVirt's StallDetectorOptions). */
static int parse_stall(struct json_object *o, struct cv_stall_opts *so, char *ign, size_t ignlen,
		       char *err, size_t errlen)
{
	static const char *const known[] = {
		"stallMargin",	     "stallProgressTimeout",	"switchoverTimeout",
		"ewmaAlpha",	     "precopyPossibleFactor",	"patienceWindowDecayFactor",
		"searchLocalMinima", "completionTimeoutFactor",
	};
	uint64_t margin = so->margin_pct, factor = so->completion_factor;
	int r = 0;

	if (!json_object_is_type(o, json_type_object))
		return bad(err, errlen, "policy: \"stallDetector\" must be a JSON object");
	r = sort_fields(o, known, ARRAY_SIZE(known), "stallDetector.", ign, ignlen, err, errlen);
	r = r ?: policy_u64(o, "stallMargin", 99, &margin, err, errlen);
	r = r ?: policy_u64(o, "stallProgressTimeout", 86400, &so->window_s, err, errlen);
	r = r ?: policy_u64(o, "switchoverTimeout", 86400, &so->switchover_timeout_s, err, errlen);
	r = r ?: policy_hundredths(o, "ewmaAlpha", 1, 100, &so->ewma_alpha_pct, err, errlen);
	if (!r)
		r = policy_hundredths(o, "precopyPossibleFactor", 100, 10000,
				      &so->precopy_factor_pct, err, errlen);
	if (!r)
		r = policy_hundredths(o, "patienceWindowDecayFactor", 1, 100, &so->decay_pct, err,
				      errlen);
	r = r ?: policy_bool(o, "searchLocalMinima", &so->local_minima, err, errlen);
	r = r ?: policy_u64(o, "completionTimeoutFactor", 100, &factor, err, errlen);
	if (r == 0 && so->window_s == 0)
		return bad(err, errlen, "policy: \"stallProgressTimeout\" must be at least 1");
	so->margin_pct = (unsigned int)margin;
	so->completion_factor = (unsigned int)factor;
	return r;
}

static const char *const experimental_fields[] = { "stallDetector" };

static const char *const policy_fields[] = {
	"allowAutoConverge",	   "allowPostCopy",    "allowWorkloadDisruption",
	"completionTimeoutPerGiB", "progressTimeout",  "bandwidth",
	"maxDowntimeMs",	   "evidenceWindowMs", "shadow",
	"bandwidthPerMigration",   "stallDetector",    "experimental",
};

/*
 * KubeVirt's names, in its migration options object as it serialises it (MigrationConfiguration,
 * a Policy's spec, VMIMConfigurationOptions): fields vmigd does not use are listed in ign for one
 * log line, not refused; a field it uses with a wrong type is. allowWorkloadDisruption follows
 * allowPostCopy unless given (as there).
 */
static int parse_policy(struct json_object *o, struct cv_policy *p, char *ign, size_t ignlen,
			char *err, size_t errlen)
{
	bool disruption_given = json_object_object_get_ex(o, "allowWorkloadDisruption", NULL);
	struct json_object *v;
	int r = 0;

	if (!json_object_is_type(o, json_type_object))
		return bad(err, errlen, "\"policy\" must be a JSON object");
	r = sort_fields(o, policy_fields, ARRAY_SIZE(policy_fields), "", ign, ignlen, err, errlen);
	r = r ?: policy_bool(o, "allowAutoConverge", &p->allow_auto_converge, err, errlen);
	r = r ?: policy_bool(o, "allowPostCopy", &p->allow_post_copy, err, errlen);
	r = r ?: policy_bool(o, "allowWorkloadDisruption", &p->allow_workload_disruption, err,
			     errlen);
	r = r ?: policy_u64(o, "completionTimeoutPerGiB", 1000000, &p->completion_timeout_per_gib,
			    err, errlen);
	r = r ?: policy_u64(o, "progressTimeout", 1000000, &p->progress_timeout_s, err, errlen);
	r = r ?: policy_u64(o, "bandwidth", VM_RATE_MAX, &p->bandwidth, err, errlen);
	r = r ?: policy_quantity(o, "bandwidthPerMigration", &p->bandwidth, err, errlen);
	r = r ?: policy_u64(o, "maxDowntimeMs", 2000000, &p->max_downtime_ms, err, errlen);
	r = r ?: policy_u64(o, "evidenceWindowMs", 600000, &p->window_ms, err, errlen);
	r = r ?: policy_bool(o, "shadow", &p->shadow, err, errlen);
	if (r == 0 && json_object_object_get_ex(o, "bandwidth", NULL) &&
	    json_object_object_get_ex(o, "bandwidthPerMigration", NULL))
		return bad(err, errlen,
			   "policy: give \"bandwidth\" or \"bandwidthPerMigration\", not both");
	if (r == 0 && json_object_object_get_ex(o, "stallDetector", &v))
		r = parse_stall(v, &p->stall, ign, ignlen, err, errlen);
	/* A Policy's spec carries it as experimental.stallDetector. */
	if (r == 0 && json_object_object_get_ex(o, "experimental", &v)) {
		struct json_object *sd;

		if (!json_object_is_type(v, json_type_object))
			return bad(err, errlen, "policy: \"experimental\" must be a JSON object");
		r = sort_fields(v, experimental_fields, ARRAY_SIZE(experimental_fields),
				"experimental.", ign, ignlen, err, errlen);
		if (r == 0 && json_object_object_get_ex(v, "stallDetector", &sd))
			r = parse_stall(sd, &p->stall, ign, ignlen, err, errlen);
	}
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
		if (!s || (strcmp(s, "predictive") && strcmp(s, "kubevirt") && strcmp(s, "stall")))
			return bad(err, errlen,
				   "convergence: \"mode\" must be \"predictive\", \"stall\" or "
				   "\"kubevirt\"");
		sp->policy.mode = !strcmp(s, "kubevirt") ? CV_MODE_KUBEVIRT
				  : !strcmp(s, "stall")	 ? CV_MODE_STALL
							 : CV_MODE_PREDICTIVE;
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
		r = parse_policy(v, &sp->policy, sp->ignored, sizeof(sp->ignored), err, errlen);
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

/* ---- the operations' parsers: each checks its fields in order, so the first error wins ---- */

static int parse_nothing(struct json_object *o, struct ctl_request *req, char *err, size_t errlen)
{
	return 0;
}

/* An optional boolean field of a request: absent leaves *v. */
static int parse_flag(struct json_object *o, const char *name, bool *v, char *err, size_t errlen)
{
	return bool_field(o, "", name, v, err, errlen);
}

/* "tls": this migration's node hop with or without TLS (KubeVirt's disableTLS, per migration). */
static int parse_tls(struct json_object *o, struct ctl_request *req, char *err, size_t errlen)
{
	bool tls = false;
	int r;

	if (!json_object_object_get_ex(o, "tls", NULL))
		return 0;
	r = parse_flag(o, "tls", &tls, err, errlen);
	if (r == 0)
		req->tls = tls ? PX_TLS_ON : PX_TLS_OFF;
	return r;
}

/* "compress": this migration's compression, instead of the daemon's --compress. */
static int parse_compress(struct json_object *o, struct ctl_request *req, char *err,
			  size_t errlen)
{
	static const char *const names[] = { [PX_COMPRESS_OFF] = "off",
					     [PX_COMPRESS_AUTO] = "auto",
					     [PX_COMPRESS_ALWAYS] = "always" };
	struct json_object *v;
	const char *s;

	if (!json_object_object_get_ex(o, "compress", &v))
		return 0;
	s = json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
	for (size_t i = PX_COMPRESS_OFF; i < ARRAY_SIZE(names); i++) {
		if (!strcmp(s, names[i])) {
			req->compress = (enum px_compress)i;
			return 0;
		}
	}
	return bad(err, errlen, "\"compress\": expected \"off\", \"auto\" or \"always\"");
}

/*
 * "listen": {"PORTID": TCPPORT}, KubeVirt mode only: the TCP port each named logical port's
 * listener binds (a restarted daemon keeps the ports it published). Ports not named bind any.
 */
static int parse_listen(struct json_object *o, struct ctl_request *req, char *err, size_t errlen)
{
	struct json_object *l;

	if (!json_object_object_get_ex(o, "listen", &l))
		return 0;
	if (!json_object_is_type(l, json_type_object))
		return bad(err, errlen, "\"listen\" must be an object of \"PORTID\": TCPPORT");
	if (!req->kubevirt)
		return bad(err, errlen,
			   "\"listen\" needs \"kubevirt\": only KubeVirt mode has a listener per "
			   "port");
	json_object_object_foreach (l, name, val) {
		uint32_t id;
		int64_t tcp;
		unsigned int i;

		if (px_port_parse(name, &id) < 0)
			return bad(err, errlen, "listen: bad port id \"%.20s\": use 0 to 65535",
				   name);
		for (i = 0; i < req->nports && req->ports[i].id != id; i++)
			;
		if (i == req->nports)
			return bad(err, errlen, "listen: port %u has no socket in \"sockets\"", id);
		if (!json_object_is_type(val, json_type_int) ||
		    (tcp = json_object_get_int64(val)) < 1 || tcp > 65535)
			return bad(err, errlen, "listen: the TCP port for port %u must be 1 to 65535",
				   id);
		if (req->ports[i].tcp)
			return bad(err, errlen, "listen: port %u is listed twice", id);
		for (unsigned int j = 0; j < req->nports; j++)
			if (req->ports[j].tcp == tcp)
				return bad(err, errlen,
					   "listen: TCP port %u is given to ports %u and %u",
					   (unsigned int)tcp, req->ports[j].id, id);
		req->ports[i].tcp = (unsigned int)tcp;
	}
	return 0;
}

static int parse_target_start(struct json_object *o, struct ctl_request *req, char *err,
			      size_t errlen)
{
	int r = parse_key(o, req, err, errlen);

	r = r ?: parse_sockets(o, req, err, errlen);
	r = r ?: parse_flag(o, "kubevirt", &req->kubevirt, err, errlen);
	r = r ?: parse_listen(o, req, err, errlen);
	r = r ?: parse_tls(o, req, err, errlen);
	return r ?: parse_bandwidth(o, false, req, err, errlen);
}

static int parse_source_start(struct json_object *o, struct ctl_request *req, char *err,
			      size_t errlen)
{
	int r = parse_key(o, req, err, errlen);

	r = r ?: parse_source(o, req, err, errlen);
	r = r ?: parse_tls(o, req, err, errlen);
	r = r ?: parse_compress(o, req, err, errlen);
	r = r ?: parse_bandwidth(o, false, req, err, errlen);
	r = r ?: parse_convergence(o, req, err, errlen);
	r = r ?: join_bandwidth(o, req, err, errlen);
	if (r == 0 && req->converge)
		req->conv.policy.bandwidth = req->bandwidth;
	return r;
}

static int parse_takeover(struct json_object *o, struct ctl_request *req, char *err, size_t errlen)
{
	struct json_object *v;
	int64_t pid;

	if (!json_object_object_get_ex(o, "pid", &v) || !json_object_is_type(v, json_type_int))
		return bad(err, errlen, "takeover: missing or bad \"pid\"");
	pid = json_object_get_int64(v);
	if (pid <= 0 || pid > INT32_MAX)
		return bad(err, errlen, "takeover: \"pid\" out of range");
	req->pid = (int)pid;
	return 0;
}

/* target-stop, source-stop */
static int parse_stop(struct json_object *o, struct ctl_request *req, char *err, size_t errlen)
{
	return parse_key(o, req, err, errlen);
}

static int parse_set_cap(struct json_object *o, struct ctl_request *req, char *err, size_t errlen)
{
	int r = parse_key(o, req, err, errlen);

	return r ?: parse_bandwidth(o, true, req, err, errlen);
}

static int parse_node_cap(struct json_object *o, struct ctl_request *req, char *err, size_t errlen)
{
	return parse_bandwidth(o, true, req, err, errlen);
}

/* ---- the operations ---- */

#define FIELDS(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define NO_FIELDS   ((const char *const[]){ NULL })

enum {
	/* Takes the control connection itself, not one reply (ctl_op_takes_conn()). */
	CTL_OP_TAKES_CONN = 1 << 0,
};

static const struct ctl_op_def {
	const char *name;
	/* The fields it takes besides "op"; any other is refused (check_fields()). */
	const char *const *fields;
	/* Fills req from the request object; -EINVAL with one line in err. */
	int (*parse)(struct json_object *o, struct ctl_request *req, char *err, size_t errlen);
	unsigned int flags;
} ops[] = {
	[CTL_TARGET_START] = { "target-start",
			       FIELDS("key", "sockets", "bandwidth", "kubevirt", "listen", "tls"),
			       parse_target_start },
	[CTL_TARGET_STOP] = { "target-stop", FIELDS("key"), parse_stop },
	[CTL_SOURCE_START] = { "source-start",
			       FIELDS("key", "target", "dir", "bandwidth", "convergence", "tls",
				      "compress"),
			       parse_source_start },
	[CTL_SOURCE_STOP] = { "source-stop", FIELDS("key"), parse_stop },
	[CTL_LIST] = { "list", NO_FIELDS, parse_nothing },
	[CTL_STATUS] = { "status", NO_FIELDS, parse_nothing },
	[CTL_BANDWIDTH] = { "bandwidth", FIELDS("key", "bandwidth"), parse_set_cap },
	[CTL_NODE_BANDWIDTH] = { "node-bandwidth", FIELDS("bandwidth"), parse_node_cap },
	[CTL_METRICS] = { "metrics", NO_FIELDS, parse_nothing },
	[CTL_TAKEOVER] = { "takeover", FIELDS("pid", "version"), parse_takeover,
			   CTL_OP_TAKES_CONN },
};
_Static_assert(ARRAY_SIZE(ops) == CTL_OPS, "an entry for each enum ctl_op");

/* The fields ctl_request_extend() added: none in the product. */
static const struct ctl_field_ext **exts;
static size_t nexts;

int ctl_request_extend(const struct ctl_field_ext *fields, size_t n)
{
	const struct ctl_field_ext **all = realloc(exts, (nexts + n) * sizeof(*all));

	if (!all)
		return -ENOMEM;
	/* lives as long as the process (extended once, at start-up) */
	for (size_t i = 0; i < n; i++)
		all[nexts + i] = &fields[i];
	exts = all;
	nexts += n;
	return 0;
}

/* The extension field name of op, or NULL. */
static const struct ctl_field_ext *ext_find(enum ctl_op op, const char *name)
{
	for (size_t i = 0; i < nexts; i++)
		if (exts[i]->op == op && !strcmp(exts[i]->name, name))
			return exts[i];
	return NULL;
}

/* Each extension field of op that o has, read into req, in the order they were added. */
static int parse_exts(struct json_object *o, enum ctl_op op, struct ctl_request *req, char *err,
		      size_t errlen)
{
	struct json_object *v;
	int r;

	for (size_t i = 0; i < nexts; i++) {
		if (exts[i]->op != op || !json_object_object_get_ex(o, exts[i]->name, &v))
			continue;
		r = exts[i]->parse(v, req, err, errlen);
		if (r < 0)
			return r;
	}
	return 0;
}

const char *ctl_op_name(enum ctl_op op)
{
	return (unsigned int)op < ARRAY_SIZE(ops) ? ops[op].name : "?";
}

bool ctl_op_takes_conn(enum ctl_op op)
{
	return (unsigned int)op < ARRAY_SIZE(ops) && (ops[op].flags & CTL_OP_TAKES_CONN);
}

/* Edits from a to b, up to 3 (more is "far"): a typo's distance to the field it meant. */
static unsigned int edits(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned int row[48], prev;

	if (la >= ARRAY_SIZE(row) || lb >= ARRAY_SIZE(row))
		return 4;
	for (size_t j = 0; j <= lb; j++)
		row[j] = (unsigned int)j;
	for (size_t i = 1; i <= la; i++) {
		prev = row[0];
		row[0] = (unsigned int)i;
		for (size_t j = 1; j <= lb; j++) {
			unsigned int sub = prev + (tolower((unsigned char)a[i - 1]) !=
						   tolower((unsigned char)b[j - 1]));
			unsigned int best =
				row[j] + 1 < row[j - 1] + 1 ? row[j] + 1 : row[j - 1] + 1;

			prev = row[j];
			row[j] = sub < best ? sub : best;
		}
	}
	return row[lb] > 3 ? 4 : row[lb];
}

/* The nearest of the field names to name so far (*best: its edits), and name appended to list. */
static void consider(const char *name, const char *field, const char **near, unsigned int *best,
		     char *list, size_t listlen)
{
	size_t n = strlen(list);
	unsigned int d = edits(name, field);

	if (d < *best) {
		*best = d;
		*near = field;
	}
	snprintf(list + n, listlen - n, "%s%s", n ? ", " : "", field);
}

/*
 * Every member of a request is "op" or one of the fields its op takes (its own, and those an
 * extension added): a misspelt field would otherwise be dropped silently (a cap that never
 * applies). The error names it, the nearest field it may have meant, and the fields the op takes.
 */
static int check_fields(struct json_object *o, enum ctl_op opi, char *err, size_t errlen)
{
	const struct ctl_op_def *op = &ops[opi];

	json_object_object_foreach (o, name, val) {
		const char *near = NULL;
		unsigned int best = 3;
		char list[256] = "";
		size_t i;

		(void)val;
		if (!strcmp(name, "op") || ext_find(opi, name))
			continue;
		for (i = 0; op->fields[i] && strcmp(name, op->fields[i]); i++)
			;
		if (op->fields[i])
			continue;
		for (i = 0; op->fields[i]; i++)
			consider(name, op->fields[i], &near, &best, list, sizeof(list));
		for (i = 0; i < nexts; i++)
			if (exts[i]->op == opi)
				consider(name, exts[i]->name, &near, &best, list, sizeof(list));
		if (near)
			return bad(
				err, errlen,
				"%s: unknown field \"%.40s\": did you mean \"%s\"? (it takes %s)",
				op->name, name, near, list);
		return bad(err, errlen, "%s: unknown field \"%.40s\" (it takes %s)", op->name, name,
			   list[0] ? list : "no field but \"op\"");
	}
	return 0;
}

int ctl_request_parse(const char *text, size_t len, struct ctl_request *ret, char *err,
		      size_t errlen)
{
	struct json_tokener *tok;
	struct json_object *o = NULL;
	struct ctl_request *req;
	const char *op;
	char key[48];
	unsigned int i;
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
	/* Requests are UTF-8: names and keys end up in logs and in replies, which must be. */
	if (!ctl_json_utf8_valid(text, len)) {
		bad(err, errlen, "request is not valid UTF-8");
		goto out;
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
	/* json-c keeps the last of a key given twice: {"op":"list","op":"target-stop"} would
	 * stop. Refused before anything runs. */
	r = ctl_json_duplicate_key(text, json_tokener_get_parse_end(tok), key, sizeof(key));
	if (r > 0) {
		r = bad(err, errlen, "request has the key \"%s\" twice", key);
		goto out;
	}
	if (r < 0) {
		snprintf(err, errlen, "%s",
			 r == -ENOMEM ? "out of memory" : "request is not one JSON object");
		goto out;
	}
	r = -EINVAL;
	if (!json_object_is_type(o, json_type_object)) {
		bad(err, errlen, "request is not a JSON object");
		goto out;
	}
	op = ctl_json_member_cstring(o, "op");
	if (!op) {
		bad(err, errlen, "missing or bad \"op\"");
		goto out;
	}
	for (i = 0; i < ARRAY_SIZE(ops); i++)
		if (strcmp(op, ops[i].name) == 0)
			break;
	if (i == ARRAY_SIZE(ops)) {
		bad(err, errlen, "unknown op \"%.40s\"", op);
		goto out;
	}
	req->op = i;
	r = check_fields(o, i, err, errlen);
	if (r < 0)
		goto out;
	r = ops[i].parse(o, req, err, errlen);
	if (r == 0)
		r = parse_exts(o, i, req, err, errlen);
	if (r == 0)
		*ret = *req;
out:
	if (r < 0)
		ctl_json_one_line(err);
	json_object_put(o);
	json_tokener_free(tok);
	free(req);
	return r;
}
