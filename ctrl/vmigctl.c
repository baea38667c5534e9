// SPDX-License-Identifier: Apache-2.0
/* vmigctl(8): a thin client of vmigd's control socket. It builds one JSON request, prints the
 * reply in the form the command promises (figures by the tables of ctl_figures.c, replies of
 * version 1 daemons too, or the reply as JSON), and turns errors into one line on stderr; `top`
 * repeats the metrics request to draw a live view. The command line: vmigctl_args.c. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl_figures.h"
#include "vmigctl_args.h"
#include "vmigctl_call.h"
#include "vmigctl_reply.h"
#include "units.h"
#include "util.h"
#include "vmigd-config.h"

/* A failure after the command line was read: vmigd refused, or sent nothing valid. */
#define EXIT_FAIL VC_EXIT_REFUSED

/* A failure of no particular errno. */
#define die(code, ...) vc_fail(code, 0, __VA_ARGS__)

/* This run's command line. */
static const struct vc_call *cl;

/* A wrong argument of this run's command: a usage error (exit 2), nothing was sent. */
#define bad_arg(...) vc_usage_error(cl->cmd, __VA_ARGS__)

/* A command whose text is nothing on success: with --json, the reply. */
static void call_quiet(struct json_object *req)
{
	struct json_object *reply = vc_call(req);

	if (cl->json)
		vc_print_json(reply);
}

/* RATE as vmigd takes it: an integer of bytes/s, from what the operator wrote. */
static uint64_t rate_arg(const char *what, const char *s)
{
	uint64_t v;

	if (vm_parse_rate(s, &v) < 0)
		bad_arg("%s: expected a rate such as 1Gbit, 500MB, 64Mi or none, got \"%s\"", what,
			s);
	return v;
}

/* Whole seconds or milliseconds for a policy field. */
static int64_t count_arg(const char *what, const char *v)
{
	char *end;
	long long n;

	errno = 0;
	n = strtoll(v, &end, 10);
	if (errno || end == v || *end || n < 0)
		bad_arg("%s: expected a whole number from 0, got \"%s\"", what, v);
	return n;
}

/* ---- target start, source start (and the options of every command, by their ids) ---- */

enum {
	O_SOCKET = 1,
	O_KUBEVIRT,
	O_LISTEN,
	O_TLS,
	O_NO_TLS,
	O_BANDWIDTH,
	O_TARGET,
	O_DIR,
	O_QMP,
	O_LIBVIRT_DOMAIN,
	O_LIBVIRT_URI,
	O_MODE,
	O_SHADOW,
	O_POLICY,
	O_ALLOW_AUTO_CONVERGE,
	O_ALLOW_POST_COPY,
	O_ALLOW_DISRUPTION,
	O_NO_DISRUPTION,
	O_COMPLETION_TIMEOUT,
	O_PROGRESS_TIMEOUT,
	O_MAX_DOWNTIME,
	O_EVIDENCE_WINDOW,
	O_TEST_DELAY_FIRST,
	O_COMPRESS,
	O_INTERVAL,
	O_COUNT,
};

/* Options both starts take: --tls/--no-tls, --bandwidth. */
static void common_start_opts(struct json_object *req)
{
	const char *bw = vc_opt_val(cl, O_BANDWIDTH);

	if (vc_opt_has(cl, O_TLS) || vc_opt_has(cl, O_NO_TLS))
		json_object_object_add(req, "tls", json_object_new_boolean(vc_opt_has(cl, O_TLS)));
	if (bw)
		json_object_object_add(req, "bandwidth",
				       json_object_new_uint64(rate_arg("--bandwidth", bw)));
}

static void target_start(const struct vc_call *c)
{
	struct json_object *req = vc_request("target-start", c->args[0]);
	struct json_object *socks = json_object_new_object(), *listen = json_object_new_object();
	struct json_object *reply, *t;

	json_object_object_add(req, "sockets", socks);
	common_start_opts(req);
	for (int i = 0; i < c->ngiven; i++) {
		const char *v = c->given[i].val;
		char copy[4096], *eq, *end;
		unsigned long tcp;

		switch (c->given[i].opt->id) {
		case O_KUBEVIRT:
			json_object_object_add(req, "kubevirt", json_object_new_boolean(true));
			break;
		case O_LISTEN:
			/* PORTID=TCPPORT: vmigd checks the id; the number is ours to read. */
			snprintf(copy, sizeof(copy), "%s", v);
			eq = strchr(copy, '=');
			if (eq)
				*eq = '\0';
			errno = 0;
			tcp = eq ? strtoul(eq + 1, &end, 10) : 0;
			if (!eq || eq == copy || !eq[1] || *end || errno || !tcp || tcp > 65535)
				bad_arg("--listen: expected PORTID=TCPPORT (1 to 65535), got "
					"\"%s\"",
					v);
			if (json_object_object_get_ex(listen, copy, NULL))
				bad_arg("--listen: port %s given twice", copy);
			json_object_object_add(listen, copy, json_object_new_int((int)tcp));
			break;
		case O_SOCKET:
			snprintf(copy, sizeof(copy), "%s", v);
			eq = strchr(copy, '=');
			if (!eq || eq == copy || !eq[1])
				bad_arg("--socket: expected PORTID=UNIXPATH, got \"%s\"", v);
			*eq = '\0';
			if (json_object_object_get_ex(socks, copy, NULL))
				bad_arg("--socket: port %s given twice", copy);
			json_object_object_add(socks, copy, json_object_new_string(eq + 1));
			break;
		}
	}
	if (json_object_object_length(listen))
		json_object_object_add(req, "listen", listen);
	else
		json_object_put(listen);
	reply = vc_call(req);
	if (c->json) {
		vc_print_json(reply);
		return;
	}
	if (!json_object_object_get_ex(reply, "target", &t))
		die(EXIT_FAIL, "vmigd sent no target description");
	printf("%s\n", json_object_to_json_string_ext(t, JSON_C_TO_STRING_PLAIN));
}

/* --policy JSON or @FILE: KubeVirt's field names (vmigctl(8)). */
static struct json_object *policy_arg(const char *v)
{
	struct json_object *p;
	char *text = NULL;

	if (v[0] == '@') {
		FILE *f = fopen(v + 1, "r");
		size_t n = 0;

		if (!f)
			bad_arg("--policy: cannot read %s: %s", v + 1, strerror(errno));
		text = calloc(1, 65536);
		if (!text)
			vc_fail(EXIT_FAIL, ENOMEM, "out of memory");
		n = fread(text, 1, 65535, f);
		fclose(f);
		text[n] = '\0';
		v = text;
	}
	p = json_tokener_parse(v);
	free(text);
	if (!p || !json_object_is_type(p, json_type_object))
		bad_arg("--policy: expected a JSON object such as '{\"allowAutoConverge\":true}' "
			"or @FILE");
	return p;
}

/* The policy fields the flags set: KubeVirt's names. */
static const struct {
	int id;
	const char *field;
	bool count; /* a whole number, else true */
} policy_flags[] = {
	{ O_ALLOW_AUTO_CONVERGE, "allowAutoConverge", false },
	{ O_ALLOW_POST_COPY, "allowPostCopy", false },
	{ O_ALLOW_DISRUPTION, "allowWorkloadDisruption", false },
	{ O_SHADOW, "shadow", false },
	{ O_COMPLETION_TIMEOUT, "completionTimeoutPerGiB", true },
	{ O_PROGRESS_TIMEOUT, "progressTimeout", true },
	{ O_MAX_DOWNTIME, "maxDowntimeMs", true },
	{ O_EVIDENCE_WINDOW, "evidenceWindowMs", true },
};

static void source_start(const struct vc_call *c)
{
	struct json_object *req = vc_request("source-start", c->args[0]), *reply, *socks, *t;
	struct json_object *over = json_object_new_object(), *pol = NULL;
	const char *qmp = vc_opt_val(c, O_QMP), *dom = vc_opt_val(c, O_LIBVIRT_DOMAIN);
	const char *uri = vc_opt_val(c, O_LIBVIRT_URI), *mode = vc_opt_val(c, O_MODE);
	const char *target = vc_opt_val(c, O_TARGET), *delay = vc_opt_val(c, O_TEST_DELAY_FIRST);

	for (int i = 0; i < c->ngiven; i++) {
		const struct vc_opt *o = c->given[i].opt;

		char what[64];

		snprintf(what, sizeof(what), "--%s", o->name);
		for (size_t k = 0; k < ARRAY_SIZE(policy_flags); k++)
			if (policy_flags[k].id == o->id)
				json_object_object_add(over, policy_flags[k].field,
						       policy_flags[k].count
							       ? json_object_new_int64(count_arg(
									 what, c->given[i].val))
							       : json_object_new_boolean(true));
		if (o->id == O_NO_DISRUPTION)
			json_object_object_add(over, "allowWorkloadDisruption",
					       json_object_new_boolean(false));
	}
	if (vc_opt_has(c, O_POLICY))
		pol = policy_arg(vc_opt_val(c, O_POLICY));
	if (!qmp && !dom && (pol || mode || uri || json_object_object_length(over)))
		bad_arg("a convergence policy needs a backend: --qmp PATH (the source QEMU's QMP "
			"socket) or --libvirt-domain NAME");
	if (uri && !dom)
		bad_arg("--libvirt-uri goes with --libvirt-domain");
	t = json_tokener_parse(target);
	if (!t || !json_object_is_type(t, json_type_object))
		bad_arg("--target: not a JSON object (pass what target start printed)");
	json_object_object_add(req, "target", t);
	json_object_object_add(req, "dir", json_object_new_string(vc_opt_val(c, O_DIR)));
	if (vc_opt_has(c, O_COMPRESS))
		json_object_object_add(req, "compress",
				       json_object_new_string(vc_opt_val(c, O_COMPRESS)));
	common_start_opts(req);
	if (qmp || dom) {
		struct json_object *conv = json_object_new_object();

		if (!pol)
			pol = json_object_new_object();
		json_object_object_foreach (over, name, val)
			json_object_object_add(pol, name, json_object_get(val));
		if (qmp) {
			json_object_object_add(conv, "qmp", json_object_new_string(qmp));
		} else {
			struct json_object *lv = json_object_new_object();

			json_object_object_add(lv, "domain", json_object_new_string(dom));
			if (uri)
				json_object_object_add(lv, "uri", json_object_new_string(uri));
			json_object_object_add(conv, "libvirt", lv);
		}
		if (mode)
			json_object_object_add(conv, "mode", json_object_new_string(mode));
		json_object_object_add(conv, "policy", pol);
		json_object_object_add(req, "convergence", conv);
	}
	json_object_put(over);
	if (delay)
		json_object_object_add(
			req, "test_delay_first_ms",
			json_object_new_int64(count_arg("--test-delay-first", delay)));
	reply = vc_call(req);
	if (c->json) {
		vc_print_json(reply);
		return;
	}
	if (!json_object_object_get_ex(reply, "sockets", &socks) ||
	    !json_object_is_type(socks, json_type_array))
		die(EXIT_FAIL, "vmigd sent no socket list");
	for (size_t i = 0; i < json_object_array_length(socks); i++)
		printf("%s\n", json_object_get_string(json_object_array_get_idx(socks, i)));
}

static void target_stop(const struct vc_call *c)
{
	call_quiet(vc_request("target-stop", c->args[0]));
}

static void source_stop(const struct vc_call *c)
{
	call_quiet(vc_request("source-stop", c->args[0]));
}

/* ---- list, status ---- */

static void list(const struct vc_call *c)
{
	struct json_object *reply = vc_call(vc_request("list", NULL)), *migs;

	if (c->json) {
		vc_print_json(reply);
		return;
	}
	vc_reply_v2(reply);
	if (!json_object_object_get_ex(reply, "migrations", &migs))
		die(EXIT_FAIL, "vmigd sent no migration list");
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i), *ports, *conns;
		char plist[256] = "";

		json_object_object_get_ex(m, "ports", &ports);
		for (size_t j = 0; ports && j < json_object_array_length(ports); j++) {
			size_t used = strlen(plist);

			snprintf(plist + used, sizeof(plist) - used, "%s%s", j ? "," : "",
				 vc_str_field(json_object_array_get_idx(ports, j), "id"));
		}
		conns = vc_obj_field(m, "conns");
		printf("%s %s ports=%s conns=%s active=%s bytes_tx=%s bytes_rx=%s state=%s\n",
		       vc_str_field(m, "key"), vc_str_field(m, "role"), plist,
		       vc_str_field(conns, "total"), vc_str_field(conns, "active"),
		       vc_str_field(m, "bytes_tx"), vc_str_field(m, "bytes_rx"),
		       vc_str_field(m, "state"));
	}
}

static void print_tls(struct json_object *s)
{
	struct json_object *t;

	if (!json_object_object_get_ex(s, "tls", &t) || !vc_bool_field(t, "enabled")) {
		printf("tls: off (plain text)\n");
		return;
	}
	printf("tls: on, generation %s, %s, crypto %s\n", vc_str_field(t, "generation"),
	       vc_str_field(t, "certificate"),
	       vc_bool_field(t, "ktls")		 ? "kTLS"
	       : vc_bool_field(t, "ktls_kernel") ? "user-space (kTLS off)"
						 : "user-space (no kTLS in this kernel)");
}

/* One line per open connection: where it is and which TLS mode it runs in. */
static void print_connections(struct json_object *migs)
{
	char line[1024];

	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i), *conns;

		if (!json_object_object_get_ex(m, "connections", &conns) ||
		    !json_object_is_type(conns, json_type_array))
			continue;
		for (size_t j = 0; j < json_object_array_length(conns); j++)
			printf("  %s %s %s\n", vc_str_field(m, "key"), vc_str_field(m, "role"),
			       vc_figure_line(&ctl_conn_table, json_object_array_get_idx(conns, j),
					      "head", line, sizeof(line)));
	}
}

/* A convergence object: its figures, then one line per action. */
static void print_conv(struct json_object *cv, const char *indent, const char *title)
{
	static const char *const not_outcome[] = { "outcome", NULL };
	struct json_object *acts;
	char more[32], line[1024];

	snprintf(more, sizeof(more), "%s  ", indent);
	vc_print_figures(&ctl_conv_table, cv, indent, title, not_outcome);
	if (json_object_object_get_ex(cv, "actions", &acts) &&
	    json_object_is_type(acts, json_type_array))
		for (size_t j = 0; j < json_object_array_length(acts); j++)
			printf("%s%s\n", more,
			       vc_figure_line(&ctl_action_table, json_object_array_get_idx(acts, j),
					      "head", line, sizeof(line)));
	if (*vc_figure_line(&ctl_conv_table, cv, "outcome", line, sizeof(line)))
		printf("%s%s\n", more, line);
}

/* Per watched migration: the mode, what it judged by, each action, the outcome. */
static void print_convergence(struct json_object *migs)
{
	char title[256];

	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i);
		struct json_object *cv = vc_obj_field(m, "convergence");

		if (!cv)
			continue;
		snprintf(title, sizeof(title), "convergence %s: ", vc_str_field(m, "key"));
		print_conv(cv, "", title);
	}
}

/* Per migration whose NIC vmigd knows: the interface, its device, link and route. */
static void print_nics(struct json_object *migs)
{
	char title[256];

	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i);
		struct json_object *nic = vc_obj_field(m, "nic");

		if (!nic)
			continue;
		snprintf(title, sizeof(title), "nic %s (%s): ", vc_str_field(m, "key"),
			 vc_str_field(m, "role"));
		vc_print_figures(&ctl_nic_table, nic, "", title, NULL);
	}
}

static void status(const struct vc_call *c)
{
	struct json_object *reply = vc_call(vc_request("status", NULL)), *s, *node, *migs;
	static const char *const fields[] = { "version",   "pid",	"control",
					      "listen",	   "advertise", "tls",
					      "data_path", "threads",	"uptime" };
	/* status's own names for the node's figures, kept from version 1 for grep. */
	static const struct {
		const char *name, *key;
	} node_lines[] = {
		{ "migrations", "migration_count" },
		{ "connections_active", "conns.active" },
		{ "bandwidth", "bandwidth" },
		{ "shaper", "shaper" },
		{ "inspect", "inspect" },
	};

	if (!json_object_object_get_ex(reply, "status", &s))
		die(EXIT_FAIL, "vmigd sent no status");
	/* the status object alone, as it came: what probes and scripts read */
	if (c->json) {
		vc_print_json(s);
		return;
	}
	vc_reply_v2(reply);
	node = vc_obj_field(s, "node");
	for (size_t i = 0; i < ARRAY_SIZE(fields); i++) {
		if (strcmp(fields[i], "tls") == 0)
			print_tls(s);
		else
			printf("%s: %s\n", fields[i], vc_str_field(s, fields[i]));
	}
	for (size_t i = 0; i < ARRAY_SIZE(node_lines); i++) {
		const struct ctl_fig *f = ctl_fig_find(&ctl_node_table, node_lines[i].key);
		struct json_object *v;
		char buf[64];
		bool found;

		v = vc_at(node, node_lines[i].key, &found);
		if (f->unit == CTL_BOOL)
			printf("%s: %s\n", node_lines[i].name,
			       v && json_object_get_boolean(v) ? "on" : "off");
		else
			printf("%s: %s\n", node_lines[i].name,
			       vc_value_text(f, v, buf, sizeof(buf)));
	}
	if (vc_obj_field(node, "nic"))
		vc_print_figures(&ctl_nic_table, vc_obj_field(node, "nic"), "", "nic: ", NULL);
	if (json_object_object_get_ex(s, "metrics", NULL))
		printf("metrics: http://%s/metrics\n", vc_str_field(s, "metrics"));
	if (json_object_object_get_ex(s, "migrations", &migs) &&
	    json_object_is_type(migs, json_type_array)) {
		print_connections(migs);
		print_nics(migs);
		print_convergence(migs);
	}
}

static void set_bandwidth(const char *key, const char *rate)
{
	struct json_object *req = vc_request(key ? "bandwidth" : "node-bandwidth", key);

	json_object_object_add(req, "bandwidth", json_object_new_uint64(rate_arg("RATE", rate)));
	call_quiet(req);
}

static void bandwidth(const struct vc_call *c)
{
	set_bandwidth(c->args[0], c->args[1]);
}

static void node_bandwidth(const struct vc_call *c)
{
	set_bandwidth(NULL, c->args[0]);
}

/* ---- metrics ---- */

/* Each array member of o's key, by its table. */
static void print_each(const struct ctl_table *t, struct json_object *o, const char *key,
		       const char *indent, const char *title)
{
	struct json_object *a;

	if (!json_object_object_get_ex(o, key, &a) || !json_object_is_type(a, json_type_array))
		return;
	for (size_t i = 0; i < json_object_array_length(a); i++)
		vc_print_figures(t, json_object_array_get_idx(a, i), indent, title, NULL);
}

/* A migration with everything in it, every figure the tables have. */
static void print_migration(struct json_object *m)
{
	struct json_object *in = vc_obj_field(m, "inspect"), *cv = vc_obj_field(m, "convergence"),
			   *conns;

	vc_print_figures(&ctl_migration_table, m, "", "", NULL);
	if (in)
		vc_print_figures(&ctl_insp_summary_table, in, "  ", "inspect: ", NULL);
	else
		printf("  inspect: off\n");
	print_each(&ctl_port_table, m, "ports", "  ", "");
	if (json_object_object_get_ex(m, "connections", &conns) &&
	    json_object_is_type(conns, json_type_array))
		for (size_t i = 0; i < json_object_array_length(conns); i++) {
			struct json_object *c = json_object_array_get_idx(conns, i);

			vc_print_figures(&ctl_conn_table, c, "  ", "conn ", NULL);
			in = vc_obj_field(c, "inspect");
			if (in)
				vc_print_figures(&ctl_insp_stats_table, in, "    ",
						 "inspect: ", NULL);
		}
	if (cv)
		print_conv(cv, "  ", "convergence: ");
	if (vc_obj_field(m, "nic"))
		vc_print_figures(&ctl_nic_table, vc_obj_field(m, "nic"), "  ", "nic: ", NULL);
}

static void metrics(const struct vc_call *c)
{
	struct json_object *reply = vc_call(vc_request("metrics", NULL)), *node, *migs;

	if (c->json) {
		vc_print_json(reply);
		return;
	}
	vc_reply_v2(reply);
	node = vc_obj_field(reply, "node");
	if (!node || !json_object_object_get_ex(reply, "migrations", &migs) ||
	    !json_object_is_type(migs, json_type_array))
		die(EXIT_FAIL, "vmigd sent no metrics");
	vc_print_figures(&ctl_node_table, node, "", "node: ", NULL);
	if (vc_obj_field(node, "nic"))
		vc_print_figures(&ctl_nic_table, vc_obj_field(node, "nic"), "", "nic: ", NULL);
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		printf("\n");
		print_migration(json_object_array_get_idx(migs, i));
	}
}

/* ---- top ---- */

#define BAR_WIDTH 20

/*
 * Progress, where a total is known (the hypervisor's, else the stream's): done against total.
 * Without one the bar shows activity: the rate against the migration's limit, or without one,
 * its share of the node's rate in the same direction.
 */
static void bar(char *buf, uint64_t rate, uint64_t limit, uint64_t node_rate)
{
	uint64_t ref = limit ? limit : node_rate;
	unsigned int fill = ref ? (rate >= ref ? BAR_WIDTH : rate * BAR_WIDTH / ref) : 0;

	if (rate && !fill)
		fill = 1; /* moving, however little */
	buf[0] = '[';
	for (unsigned int i = 0; i < BAR_WIDTH; i++)
		buf[1 + i] = i < fill ? '#' : '.';
	buf[BAR_WIDTH + 1] = ']';
	buf[BAR_WIDTH + 2] = '\0';
}

/* A figure of o as its table's unit prints it. */
static const char *fig(const struct ctl_table *t, struct json_object *o, const char *key, char *buf,
		       size_t len)
{
	bool found;

	return vc_value_text(ctl_fig_find(t, key), vc_at(o, key, &found), buf, len);
}

/*
 * Without the hypervisor's figures: progress from the stream's RAM total and its estimate of
 * what remains (the inspector's "remaining"; absent where the stream cannot tell). The ETA is
 * what remains over the 10-s rate, less the dirty rate once a dirty pass was measured. Returns
 * whether the stream gave the bar.
 */
static bool stream_progress(struct json_object *m, struct json_object *in, bool src, char *bars,
			    char *eta, size_t eta_len)
{
	uint64_t total = vc_u64_at(in, "ram_total"), left, rate, dirty = 0;
	bool found;

	if (!in || !total || !vc_at(in, "remaining", &found))
		return false;
	left = vc_u64_at(in, "remaining");
	bar(bars, total - (left < total ? left : total), total, 0);
	if (strcmp(vc_str_field(m, "state"), "failed") == 0)
		return true;
	rate = vc_u64_at(m, src ? "rates.tx_10s" : "rates.rx_10s");
	if (vc_bool_field(in, "dirty_known"))
		dirty = vc_u64_at(in, "dirty_rate");
	if (rate > dirty)
		snprintf(eta, eta_len, "%.0f s (stream)", (double)left / (rate - dirty));
	else if (rate && dirty)
		snprintf(eta, eta_len, "never (stream)");
	else
		snprintf(eta, eta_len, "- (stream)");
	return true;
}

/* A compressing source's line (its mode, connections on, the node hop's rate beside the
 * stream's, the recent ratio, CPU), or a decoding target's. */
static void top_compress(struct json_object *m, bool src, uint64_t rate)
{
	struct json_object *z = vc_obj_field(m, src ? "compress" : "decompress");
	char a[32], b[32], r[16] = "-";

	if (!z)
		return;
	if (!src) {
		printf("%20s decompress: %s plain from %s, %" PRIu64 " ms CPU\n", "",
		       vm_format_bytes(vc_u64_at(z, "plain"), a, sizeof(a)),
		       vm_format_bytes(vc_u64_at(z, "wire"), b, sizeof(b)), vc_u64_at(z, "cpu_ms"));
		return;
	}
	if (vc_u64_at(z, "plain"))
		snprintf(r, sizeof(r), "%" PRIu64 " %%", vc_u64_at(z, "ratio_pct"));
	printf("%20s compress %s: %" PRIu64 " connections on, node hop %s (stream %s), ratio %s, "
	       "%" PRIu64 " ms CPU\n",
	       "", vc_str_field(z, "mode"), vc_u64_at(z, "conns_on"),
	       vc_speed(vc_u64_at(m, "wire.tx_1s"), a, sizeof(a)), vc_speed(rate, b, sizeof(b)),
	       r, vc_u64_at(z, "cpu_ms"));
}

static void top_frame(struct json_object *reply, double interval)
{
	struct json_object *node = vc_obj_field(reply, "node"), *migs;
	char a[32], b[32], c[32], n[32], k[32];

	if (!node || !json_object_object_get_ex(reply, "migrations", &migs) ||
	    !json_object_is_type(migs, json_type_array))
		die(EXIT_FAIL, "vmigd sent no metrics");
	printf("vmigd: node cap %s, tx %s, rx %s, %s migrations, %s connections (every %g s)\n",
	       fig(&ctl_node_table, node, "bandwidth", a, sizeof(a)),
	       fig(&ctl_node_table, node, "rates.tx_1s", b, sizeof(b)),
	       fig(&ctl_node_table, node, "rates.rx_1s", c, sizeof(c)),
	       fig(&ctl_node_table, node, "migration_count", n, sizeof(n)),
	       fig(&ctl_node_table, node, "conns.active", k, sizeof(k)), interval);
	printf("%-20s %-6s %-22s %-11s %-12s %-25s %-12s %4s %s\n", "KEY", "ROLE", "ACTIVITY",
	       "BYTES", "RATE", "CAP / LIMIT", "DIRTY", "PASS", "ETA");
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i), *in;
		bool src = strcmp(vc_str_field(m, "role"), "source") == 0;
		const char *rate_key = src ? "rates.tx_1s" : "rates.rx_1s";
		uint64_t rate = vc_u64_at(m, rate_key);
		char bars[BAR_WIDTH + 3], caps[64], dirty[32] = "-", pass[24] = "-", eta[32];
		struct json_object *cv, *job;

		bar(bars, rate, vc_u64_at(m, "limit"), vc_u64_at(node, rate_key));
		snprintf(caps, sizeof(caps), "%s / %s",
			 fig(&ctl_migration_table, m, "cap", a, sizeof(a)),
			 fig(&ctl_migration_table, m, "limit", b, sizeof(b)));
		in = vc_obj_field(m, "inspect");
		if (in && vc_bool_field(in, "dirty_known"))
			fig(&ctl_insp_summary_table, in, "dirty_rate", dirty, sizeof(dirty));
		if (in && vc_u64_at(in, "passes"))
			fig(&ctl_insp_summary_table, in, "passes", pass, sizeof(pass));
		cv = vc_obj_field(m, "convergence");
		job = vc_obj_field(cv, "job");
		snprintf(eta, sizeof(eta), "%s",
			 strcmp(vc_str_field(m, "state"), "failed") == 0 ? "failed" : "-");
		if (!job) {
			stream_progress(m, in, src, bars, eta, sizeof(eta));
		} else {
			/* The hypervisor knows the total: bar, dirty rate, pass and ETA from it. */
			uint64_t total = vc_u64_at(job, "total"),
				 left = vc_u64_at(job, "remaining");
			uint64_t dirty_rate = vc_u64_at(cv, "dirty_rate");

			if (total)
				bar(bars, total - (left < total ? left : total), total, 0);
			if (dirty_rate)
				fig(&ctl_conv_table, cv, "dirty_rate", dirty, sizeof(dirty));
			if (vc_u64_at(job, "dirty_syncs"))
				fig(&ctl_conv_table, cv, "job.dirty_syncs", pass, sizeof(pass));
			if (strcmp(vc_str_field(job, "status"), "active") != 0)
				snprintf(eta, sizeof(eta), "%s", vc_str_field(job, "status"));
			else if (rate > dirty_rate)
				/* Each pass resends what the last one's time let the guest dirty.
				 */
				snprintf(eta, sizeof(eta), "%.0f s (qemu)",
					 (double)left / (rate - dirty_rate));
			else if (rate)
				snprintf(eta, sizeof(eta), "never (qemu)");
		}
		printf("%-20.20s %-6s %s %-11s %-12s %-25s %-12s %4s %s\n", vc_str_field(m, "key"),
		       vc_str_field(m, "role"), bars,
		       fig(&ctl_migration_table, m, src ? "bytes_tx" : "bytes_rx", a, sizeof(a)),
		       vc_speed(rate, b, sizeof(b)), caps, dirty, pass, eta);
		top_compress(m, src, rate);
		if (cv) {
			struct json_object *acts;
			size_t na = json_object_object_get_ex(cv, "actions", &acts) &&
						    json_object_is_type(acts, json_type_array)
					    ? json_object_array_length(acts)
					    : 0;
			struct json_object *last =
				na ? json_object_array_get_idx(acts, na - 1) : NULL;
			char line[1024];

			printf("%20s convergence %s: %s\n", "", vc_str_field(cv, "mode"),
			       last ? vc_figure_line(&ctl_action_table, last, "head", line,
						     sizeof(line))
				    : "no action");
			if (*vc_figure_line(&ctl_conv_table, cv, "outcome", line, sizeof(line)))
				printf("%20s %s\n", "", line);
		}
	}
	fflush(stdout);
}

static void top(const struct vc_call *c)
{
	bool tty = isatty(STDOUT_FILENO);
	const char *iv = vc_opt_val(c, O_INTERVAL), *cv = vc_opt_val(c, O_COUNT);
	double interval = 1;
	unsigned long count = 0; /* 0: until interrupted */
	char *end;

	if (iv) {
		interval = strtod(iv, &end);
		if (end == iv || *end || !(interval >= 0.1 && interval <= 3600))
			bad_arg("--interval: expected seconds from 0.1 to 3600, got \"%s\"", iv);
	}
	if (cv) {
		errno = 0;
		count = strtoul(cv, &end, 10);
		if (end == cv || *end || errno || cv[0] == '-' || count < 1)
			bad_arg("--count: expected a number of frames from 1, got \"%s\"", cv);
	}
	for (unsigned long n = 0; count == 0 || n < count; n++) {
		struct timespec ts = { (time_t)interval,
				       (long)((interval - (time_t)interval) * 1e9) };
		struct json_object *reply;

		if (n > 0)
			while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
				;
		reply = vc_call(vc_request("metrics", NULL));
		/* --json: each frame's reply on a line of its own */
		if (c->json) {
			vc_print_json(reply);
			continue;
		}
		vc_reply_v2(reply);
		/* On a terminal each frame replaces the last; piped, frames follow each other. */
		if (tty)
			printf("\033[H\033[2J");
		else if (n > 0)
			printf("\n");
		top_frame(reply, interval);
	}
}

/* The completion script, for a shell that vmigctl's package does not equip. */
static void completion(const struct vc_call *c);

/* ---- the command table: the help, the parsing and the completion come from it ---- */

/* The options both starts take. */
static const struct vc_opt start_opts[] = {
	{ .name = "tls",
	  .id = O_TLS,
	  .help = "this migration's node hop with TLS (default: the daemon's)",
	  .group = 1 },
	{ .name = "no-tls",
	  .id = O_NO_TLS,
	  .help = "this migration's node hop without TLS",
	  .group = 1 },
	{ .name = "bandwidth",
	  .id = O_BANDWIDTH,
	  .arg = "RATE",
	  .help = "cap what this migration sends in this role" },
	{ 0 },
};

static const struct vc_opt target_start_opts[] = {
	{ .name = "socket",
	  .id = O_SOCKET,
	  .arg = "PORTID=UNIXPATH",
	  .help = "carry logical port PORTID to this socket",
	  .flags = VC_OPT_REQUIRED | VC_OPT_REPEAT },
	{ .name = "kubevirt",
	  .id = O_KUBEVIRT,
	  .help = "one TCP listener per logical port, and KubeVirt's reply" },
	{ .name = "listen",
	  .id = O_LISTEN,
	  .arg = "PORTID=TCPPORT",
	  .help = "with --kubevirt: the TCP port for logical port PORTID",
	  .flags = VC_OPT_REPEAT },
	{ 0 },
};

static const struct vc_opt source_start_opts[] = {
	{ .name = "target",
	  .id = O_TARGET,
	  .arg = "JSON",
	  .help = "what target start printed, or KubeVirt's fields",
	  .flags = VC_OPT_REQUIRED },
	{ .name = "dir",
	  .id = O_DIR,
	  .arg = "BASEDIR",
	  .help = "make the sockets in BASEDIR/migrationproxy/",
	  .flags = VC_OPT_REQUIRED,
	  .complete = "@dir" },
	{ .name = "compress",
	  .id = O_COMPRESS,
	  .arg = "MODE",
	  .help = "off, auto or always (default: the daemon's --compress)",
	  .complete = "off auto always" },
	{ .name = "qmp",
	  .id = O_QMP,
	  .arg = "PATH",
	  .help = "convergence control through this QMP socket of the source QEMU",
	  .group = 2,
	  .complete = "@file" },
	{ .name = "libvirt-domain",
	  .id = O_LIBVIRT_DOMAIN,
	  .arg = "NAME",
	  .help = "convergence control through libvirt, of this domain",
	  .group = 2 },
	{ .name = "libvirt-uri",
	  .id = O_LIBVIRT_URI,
	  .arg = "URI",
	  .help = "libvirt's URI (default qemu:///system)" },
	{ .name = "mode",
	  .id = O_MODE,
	  .arg = "MODE",
	  .help = "predictive (default), stall or kubevirt",
	  .complete = "predictive stall kubevirt" },
	{ .name = "shadow", .id = O_SHADOW, .help = "decide and log, never act" },
	{ .name = "policy",
	  .id = O_POLICY,
	  .arg = "JSON|@FILE",
	  .help = "the policy, KubeVirt's field names" },
	{ .name = "allow-auto-converge",
	  .id = O_ALLOW_AUTO_CONVERGE,
	  .help = "allow throttling the guest's vCPUs" },
	{ .name = "allow-post-copy", .id = O_ALLOW_POST_COPY, .help = "allow post-copy" },
	{ .name = "allow-workload-disruption",
	  .id = O_ALLOW_DISRUPTION,
	  .help = "allow pausing the guest and post-copy",
	  .group = 3 },
	{ .name = "no-workload-disruption",
	  .id = O_NO_DISRUPTION,
	  .help = "forbid pausing the guest and post-copy",
	  .group = 3 },
	{ .name = "completion-timeout-per-gib",
	  .id = O_COMPLETION_TIMEOUT,
	  .arg = "S",
	  .help = "seconds per GB of guest memory before it is late (150)" },
	{ .name = "progress-timeout",
	  .id = O_PROGRESS_TIMEOUT,
	  .arg = "S",
	  .help = "abort after S seconds without progress (150)" },
	{ .name = "max-downtime",
	  .id = O_MAX_DOWNTIME,
	  .arg = "MS",
	  .help = "QEMU's downtime limit" },
	{ .name = "evidence-window",
	  .id = O_EVIDENCE_WINDOW,
	  .arg = "MS",
	  .help = "predictive: how long evidence must hold (2000)" },
	{ .name = "test-delay-first",
	  .id = O_TEST_DELAY_FIRST,
	  .arg = "MS",
	  .help = "hold back each port's first connection (vmigd-test only)" },
	{ 0 },
};

static const struct vc_opt top_opts[] = {
	{ .name = "interval",
	  .id = O_INTERVAL,
	  .arg = "SECONDS",
	  .help = "redraw every SECONDS, 0.1 to 3600 (default 1)" },
	{ .name = "count", .id = O_COUNT, .arg = "N", .help = "stop after N frames" },
	{ 0 },
};

static const struct vc_cmd commands[] = {
	{ .name = "target start",
	  .args = "KEY",
	  .help = "carry KEY's node hop to this node's QEMU; prints the target JSON",
	  .opts = target_start_opts,
	  .also = start_opts,
	  .run = target_start },
	{ .name = "target stop",
	  .args = "KEY",
	  .help = "stop the target role of migration KEY",
	  .run = target_stop,
	  .keys = "target" },
	{ .name = "source start",
	  .args = "KEY",
	  .help = "make migration KEY's source sockets; prints their paths",
	  .opts = source_start_opts,
	  .also = start_opts,
	  .run = source_start },
	{ .name = "source stop",
	  .args = "KEY",
	  .help = "stop the source role of migration KEY",
	  .run = source_stop,
	  .keys = "source" },
	{ .name = "bandwidth",
	  .args = "KEY RATE",
	  .help = "change the cap of migration KEY now (none: no cap)",
	  .run = bandwidth,
	  .keys = "" },
	{ .name = "node-bandwidth",
	  .args = "RATE",
	  .help = "change the node's cap now (none: no cap)",
	  .run = node_bandwidth },
	{ .name = "list", .help = "one line per migration", .run = list },
	{ .name = "status", .help = "the daemon, the node and each connection", .run = status },
	{ .name = "metrics", .help = "every figure the daemon has", .run = metrics },
	{ .name = "top", .help = "a live view of the migrations", .opts = top_opts, .run = top },
	{ .name = "completion",
	  .args = "SHELL",
	  .help = "print the completion script for SHELL (bash)",
	  .run = completion,
	  .hidden = true },
};

static void completion(const struct vc_call *c)
{
	if (strcmp(c->args[0], "bash") != 0)
		bad_arg("completion: only bash is known, not \"%s\"", c->args[0]);
	vc_print_bash_completion(commands, ARRAY_SIZE(commands));
}

int main(int argc, char **argv)
{
	static struct vc_call call_line;

	vc_parse(commands, ARRAY_SIZE(commands), argc, argv, &call_line);
	cl = &call_line;
	vc_call_setup(cl);
	cl->cmd->run(cl);
	return VC_EXIT_OK;
}
