// SPDX-License-Identifier: Apache-2.0
/* Unit tests for the figure tables (ctrl/ctl_figures.h) and what is made of them: every figure of
 * every table, read from inputs built by hand, must be in the JSON object (ctrl/ctl_report.h)
 * with the value it holds, and where exported in the Prometheus text (ctrl/ctl_metrics.h) with
 * the same value; the tables' own rules (keys, families, text formats); the reply schema of
 * version 2 (doc/interfaces.md). */
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "ctl_figures.h"
#include "ctl_metrics.h"
#include "ctl_report.h"

static const struct ctl_table *const tables[] = {
	&ctl_node_table, &ctl_migration_table,	  &ctl_port_table,
	&ctl_conn_table, &ctl_insp_summary_table, &ctl_insp_stats_table,
	&ctl_conv_table, &ctl_action_table,	  &ctl_nic_table,
};

/* ---- inputs ---- */

#define NOW_MS	 100000
#define NOW_UNIX 1700000000.5

static struct px_conn_info conns[3];
static struct px_migration_info migs[3];
static struct cv_report conv[3];
static struct ctl_nic_view nics[3];
static struct ctl_metrics_snapshot snap;

/* Every figure a value of its own where it can, so that a table entry reading the wrong member
 * shows. m[0]: a source, inspected, with connections and a convergence job; m[1]: a failed
 * target, inspected, no dirty rate yet; m[2]: a source, not inspected, watched without a job. */
static void fill(void)
{
	memset(conns, 0, sizeof(conns));
	memset(migs, 0, sizeof(migs));
	memset(conv, 0, sizeof(conv));
	memset(nics, 0, sizeof(nics));
	memset(&snap, 0, sizeof(snap));
	snap.node = (struct px_node_info){ .bandwidth = 125000000,
					   .shaper = PX_SHAPE_PACING,
					   .inspect = true,
					   .digest = "auto",
					   .verified = 12,
					   .corrupt = 1,
					   .bytes_tx = 1073741824,
					   .bytes_rx = 77,
					   .rate = { 52428800, 50000000, 1, 2 },
					   .migrations = 3,
					   .conns_active = 4,
					   .conns_total = 9 };
	snap.now_ms = NOW_MS;
	snap.now_unix = NOW_UNIX;
	snap.migs = migs;
	snap.nmigs = 3;
	snap.conv = conv;

	conns[0] = (struct px_conn_info){ .port = 49152,
					  .seq = 0,
					  .state = "linked",
					  .bytes_tx = 4096,
					  .bytes_rx = 12,
					  .rate = { 11, 12, 13, 14 },
					  .shaped_ms = 1500,
					  .path = "kernel",
					  .inspected = true,
					  .zmode = "auto",
					  .zon = true,
					  .zwhy = "its cap holds it back",
					  .zidle_pct = 60,
					  .zratio_pct = 31,
					  .z = { .tx_plain = 3000, .tx_wire = 1000, .tx_ns = 5000000 } };
	conns[0].insp = (struct px_insp_stats){ .kind = PX_INSP_MAIN,
						.stream_version = 3,
						.channel_id = -1,
						.page_size = 4096,
						.bytes = 40960,
						.pages = 100,
						.zero_pages = 7,
						.syncs = 2,
						.sync_bytes_last = 999,
						.passes = 5,
						.pass_pages_last = 55,
						.pass_ms_last = 1234,
						.switchover = true };
	strcpy(conns[0].insp.machine, "pc-q35-7.2");
	conns[1] = (struct px_conn_info){ .port = 49152,
					  .seq = 3,
					  .state = "linked",
					  .tls = "TLSv1.3",
					  .cipher = "TLS_AES_128_GCM_SHA256",
					  .crypto = "ktls",
					  .resumed = true,
					  .bytes_tx = 1 << 20,
					  .pacing = 62500000,
					  .path = "dpdk",
					  .inspected = true };
	conns[1].insp = (struct px_insp_stats){
		.kind = PX_INSP_MULTIFD, .bytes_only = true, .channel_id = 2, .packets = 17
	};
	strcpy(conns[1].insp.reason, "multifd: bad magic");
	conns[2] = (struct px_conn_info){ .port = 0, .seq = 1, .state = "connecting" };

	migs[0] = (struct px_migration_info){ .key = "vm-1",
					      .role = PX_ROLE_SOURCE,
					      .state = "active",
					      .mode = "ktls",
					      .peer = "198.18.0.2:40123",
					      .started_ms = NOW_MS - 10000,
					      .bytes_tx = 1073741824,
					      .bytes_rx = 78,
					      .rate = { 52428801, 50000001, 3, 4 },
					      .cap = 67108864,
					      .limit = 62500000,
					      .shaped_ms = 2500,
					      .conns_active = 2,
					      .conns_total = 19,
					      .conns_failed = 1,
					      .conns_reordered = 4,
					      .nports = 2,
					      .nconns = 3,
					      .conns = conns,
					      .inspected = true,
					      .zmode = "auto",
					      .zconns_on = 1,
					      .z = { .tx_plain = 1 << 20,
						     .tx_wire = 1 << 18,
						     .tx_ns = 1500000000,
						     .flips = 2 },
					      .wire_tx = 1073741824 - (3 << 18),
					      .wire_1s = 1000,
					      .wire_10s = 900 };
	migs[0].ports[0] = (struct px_port_info){ .id = 49152,
						  .path = "/run/a.sock",
						  .bytes_tx = 1073741800,
						  .bytes_rx = 5,
						  .rate = { 21, 22, 23, 24 },
						  .conns_active = 2,
						  .conns_total = 8 };
	migs[0].ports[1] = (struct px_port_info){ .id = 0, .path = "/run/b.sock", .bytes_tx = 24 };
	migs[0].insp = (struct px_insp_summary){ .main = 1,
						 .multifd = 8,
						 .other = 1,
						 .bytes_only = 1,
						 .stream_version = 3,
						 .page_size = 4096,
						 .pages = 250000,
						 .zero_pages = 10000,
						 .packets = 321,
						 .syncs = 40,
						 .passes = 6,
						 .dirty_known = true,
						 .dirty_pages_per_pass = 5000,
						 .dirty_rate = 20480000,
						 .switchover = true };
	strcpy(migs[0].insp.machine, "pc-q35-7.2");
	strcpy(migs[0].insp.reason, "other: unrecognised stream start 00 52 41 57");

	migs[1] = (struct px_migration_info){
		.key = "vm.2_x",
		.role = PX_ROLE_TARGET,
		.state = "failed",
		.mode = "plain",
		.error = "port 49152 connection 0 did not arrive within 10000 ms",
		.started_ms = NOW_MS - 1,
		.bytes_rx = 5,
		.nports = 1,
		.inspected = true,
	};
	migs[1].ports[0].id = 7;
	strcpy(migs[1].ports[0].path, "/run/c.sock");
	migs[1].insp.passes = 1;

	migs[2] = (struct px_migration_info){ .key = "k3",
					      .role = PX_ROLE_SOURCE,
					      .state = "active",
					      .mode = "tls",
					      .peer = "[2001:db8::2]:5",
					      .started_ms = NOW_MS - 123456,
					      .cap_lifted = true,
					      .nports = 1 };
	migs[2].ports[0].id = 1;

	conv[0].mode = CV_MODE_PREDICTIVE;
	conv[0].backend = "qmp";
	cv_policy_default(&conv[0].policy);
	conv[0].policy.allow_auto_converge = true;
	conv[0].policy.bandwidth = 67108864;
	conv[0].policy.max_downtime_ms = 500;
	conv[0].have_job = true;
	conv[0].job = (struct cv_job){ .status = CV_ST_ACTIVE,
				       .elapsed_ms = 21000,
				       .total = 1 << 30,
				       .remaining = 60 << 20,
				       .transferred = 900 << 20,
				       .dirty_rate = 25000000,
				       .dirty_syncs = 5,
				       .rate = 16000000,
				       .expected_downtime_ms = 300,
				       .downtime_ms = -1,
				       .throttle_pct = 60,
				       .postcopy_requests = 3,
				       .guest_running = true };
	strcpy(conv[0].job.error, "nothing wrong");
	conv[0].elapsed_ms = 21001;
	conv[0].dirty_rate = 24000000;
	conv[0].link_rate = 16500000;
	conv[0].dirty_from = "qemu";
	conv[0].nactions = 2;
	conv[0].actions[0] = (struct cv_action_rec){
		.at_ms = 5250, .act = CV_ACT_THROTTLE, .ok = true, .reason = "dirty >= 90% of link"
	};
	conv[0].actions[1] = (struct cv_action_rec){ .at_ms = 15500,
						     .act = CV_ACT_POSTCOPY,
						     .ok = false,
						     .reason = "still dirty",
						     .error = "multifd is on" };
	conv[0].counts[CV_ACT_THROTTLE] = 1;
	conv[0].counts[CV_ACT_POSTCOPY] = 3;

	conv[2].mode = CV_MODE_KUBEVIRT;
	conv[2].backend = "libvirt";
	cv_policy_default(&conv[2].policy);
	conv[2].policy.mode = CV_MODE_KUBEVIRT;
	conv[2].elapsed_ms = -1;
	conv[2].query_errors = 2;
	strcpy(conv[2].last_error, "libvirt: gone");
	conv[2].stopped = true;
	strcpy(conv[2].outcome, "not followed to the end (libvirt: gone)");

	/* m[0] over an SR-IOV VF whose link is down now; m[1] over a veth (no device: speed
	 * unknown, no NUMA node); m[2]: not known. */
	snap.nics = nics;
	nics[0].nic = (struct ctl_nic_info){ .ifindex = 7,
					     .name = "ens1f0v2",
					     .kind = "device",
					     .operstate = "lowerlayerdown",
					     .mtu = 9000,
					     .addrs = "10.1.0.5/24",
					     .peer = "10.1.0.9",
					     .gateway = "10.1.0.1",
					     .source = "10.1.0.5",
					     .pci = "0000:02:10.4",
					     .driver = "igbvf",
					     .vf = true,
					     .pf = "0000:02:00.0",
					     .pf_name = "ens1f0",
					     .speed_mbps = 25000,
					     .numa_node = 1,
					     .rx_queues = 2,
					     .tx_queues = 3 };
	nics[0].speed = 3125000000;
	nics[0].speed_known = true;
	nics[0].down_ms = 1500;
	nics[0].downs = 2;
	strcpy(nics[0].error, "no route to 10.1.0.9: Network is unreachable");
	nics[1].nic = (struct ctl_nic_info){ .ifindex = 3,
					     .name = "veth1",
					     .kind = "veth",
					     .operstate = "up",
					     .up = true,
					     .mtu = 1500,
					     .peer = "198.18.0.1",
					     .speed_mbps = -1,
					     .numa_node = -1,
					     .rx_queues = 1,
					     .tx_queues = 1 };
	nics[1].link_up = true;
}

static const struct ctl_env env = { .now_ms = NOW_MS, .now_unix = NOW_UNIX };

static char *prom_text(void)
{
	char *text;
	size_t len;

	assert_int_equal(ctl_metrics_render(&snap, &text, &len), 0);
	return text;
}

static struct json_object *mig_json(unsigned int i)
{
	return ctl_report_migration(&migs[i], conv[i].backend ? &conv[i] : NULL,
				    nics[i].nic.ifindex ? &nics[i] : NULL, &env);
}

/* ---- walking the tables ---- */

/* The value at "member" or "group.member"; *state 0: missing, 1: the group is null, 2: found. */
static struct json_object *at(struct json_object *o, const char *key, int *state)
{
	const char *dot = strchr(key, '.');
	struct json_object *v = NULL;
	char group[64];

	*state = 0;
	if (dot) {
		snprintf(group, sizeof(group), "%.*s", (int)(dot - key), key);
		if (!json_object_object_get_ex(o, group, &o))
			return NULL;
		if (!o) {
			*state = 1;
			return NULL;
		}
		key = dot + 1;
	}
	if (json_object_object_get_ex(o, key, &v))
		*state = 2;
	return v;
}

static bool is_exported(const struct ctl_table *t)
{
	return t != &ctl_insp_stats_table && t != &ctl_action_table;
}

/* The Prometheus value text of v for f. */
static void prom_value(const struct ctl_fig *f, const struct ctl_value *v, char *buf, size_t len)
{
	uint64_t u = v->kind == CTL_V_BOOL ? v->b : v->kind == CTL_V_I64 ? (uint64_t)v->i : v->u;

	if (f->prom.percent)
		snprintf(buf, len, "%.2f", u / 100.0);
	else if (f->unit == CTL_MS || f->unit == CTL_SECONDS)
		snprintf(buf, len, "%" PRIu64 ".%03" PRIu64, u / 1000, u % 1000);
	else
		snprintf(buf, len, "%" PRIu64, u);
}

/* NAME{LABELS}, with the object's labels and the figure's own. */
static void series(const struct ctl_fig *f, const char *labels, const char *elem, char *buf,
		   size_t len)
{
	char fixed[256] = "";

	if (f->prom.labels)
		snprintf(fixed, sizeof(fixed), "%s", f->prom.labels);
	if (f->prom.label && elem)
		snprintf(fixed + strlen(fixed), sizeof(fixed) - strlen(fixed), "%s%s=\"%s\"",
			 *fixed ? "," : "", f->prom.label, elem);
	if (*labels || *fixed)
		snprintf(buf, len, "%s{%s%s%s}", f->prom.name, labels, *labels && *fixed ? "," : "",
			 fixed);
	else
		snprintf(buf, len, "%s", f->prom.name);
}

static int problems;

static void __attribute__((format(printf, 1, 2))) problem(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprint_error(fmt, ap);
	va_end(ap);
	print_error("\n");
	problems++;
}

/* One value in JSON: as read, by its kind (a vector's element: in the vector's object). */
static void check_json_value(const char *where, const struct ctl_fig *f, const struct ctl_value *v,
			     struct json_object *j)
{
	switch (v->kind) {
	case CTL_V_NULL:
		if (j)
			problem("%s %s: JSON %s, want null", where, f->key,
				json_object_to_json_string(j));
		return;
	case CTL_V_BOOL:
		if (!json_object_is_type(j, json_type_boolean) ||
		    json_object_get_boolean(j) != v->b)
			problem("%s %s: JSON %s, want %d", where, f->key,
				json_object_to_json_string(j), v->b);
		return;
	case CTL_V_STR:
		if (!json_object_is_type(j, json_type_string) ||
		    strcmp(json_object_get_string(j), v->s) != 0)
			problem("%s %s: JSON %s, want \"%s\"", where, f->key,
				json_object_to_json_string(j), v->s);
		return;
	case CTL_V_U64:
	case CTL_V_I64:
		break;
	}
	if (f->unit == CTL_SECONDS) {
		double want = (v->kind == CTL_V_I64 ? (double)v->i : (double)v->u) / 1000.0;

		if (!json_object_is_type(j, json_type_double) ||
		    fabs(json_object_get_double(j) - want) > 1e-9)
			problem("%s %s: JSON %s, want %.3f s", where, f->key,
				json_object_to_json_string(j), want);
	} else if (!json_object_is_type(j, json_type_int) ||
		   (v->kind == CTL_V_U64 ? json_object_get_uint64(j) != v->u
					 : json_object_get_int64(j) != v->i)) {
		problem("%s %s: JSON %s, want %" PRIu64 "/%" PRId64, where, f->key,
			json_object_to_json_string(j), v->u, v->i);
	}
}

static void check_prom(const char *where, const char *text, const struct ctl_fig *f,
		       const char *labels, const struct ctl_value *v, bool want)
{
	char name[512], value[64], line[600];
	const char *p;

	series(f, labels, v ? v->name : NULL, name, sizeof(name));
	snprintf(line, sizeof(line), "\n%s ", name);
	p = strstr(text, line);
	if (!want) {
		if (p)
			problem("%s %s: a sample %s where there should be none", where, f->key,
				name);
		return;
	}
	prom_value(f, v, value, sizeof(value));
	snprintf(line, sizeof(line), "\n%s %s\n", name, value);
	if (!strstr(text, line))
		problem("%s %s: no sample \"%s %s\"", where, f->key, name, value);
}

/* Every figure of t in obj: JSON o holds it, and Prometheus text (labels: the object's). */
static void check_object(const char *where, const struct ctl_table *t, const void *obj,
			 struct json_object *o, const char *text, const char *labels)
{
	for (size_t k = 0; k < t->n; k++) {
		const struct ctl_fig *f = &t->figs[k];
		bool present = ctl_fig_present(f, obj), prom = text && f->prom.name;
		struct json_object *j;
		struct ctl_value v;
		int state;

		j = at(o, f->key, &state);
		if (f->group_when.type && !present && state == 1) {
			/* its group is null: no figure of it, anywhere */
			if (prom)
				check_prom(where, text, f, labels, NULL, false);
			continue;
		}
		if (!present && f->absent == CTL_OMIT) {
			if (state != 0)
				problem("%s %s: in JSON (%s), should be left out", where, f->key,
					json_object_to_json_string(j));
			if (prom)
				check_prom(where, text, f, labels, NULL, false);
			continue;
		}
		if (state != 2) {
			problem("%s %s: not in JSON", where, f->key);
			continue;
		}
		if (!present && f->absent == CTL_NULL) {
			if (j)
				problem("%s %s: JSON %s, want null", where, f->key,
					json_object_to_json_string(j));
			if (prom)
				check_prom(where, text, f, labels, NULL, false);
			continue;
		}
		for (unsigned int i = 0; i < ctl_fig_count(f); i++) {
			struct json_object *e = j;

			ctl_fig_read(f, obj, &env, i, &v);
			if (f->get.type == CTL_C_COUNTS &&
			    !json_object_object_get_ex(j, v.name, &e))
				problem("%s %s: no element %s", where, f->key, v.name);
			check_json_value(where, f, &v, e);
			if (prom)
				check_prom(where, text, f, labels, &v, present);
		}
	}
}

static void mig_labels(const struct px_migration_info *mi, char *buf, size_t len)
{
	snprintf(buf, len, "key=\"%s\",role=\"%s\"", mi->key, px_role_str(mi->role));
}

/* Every object of the snapshot through its table, JSON and Prometheus. */
static void test_every_figure(void **state)
{
	char *text, where[128], labels[256], plabels[512];
	struct json_object *node, *m, *a, *c;

	fill();
	text = prom_text();
	problems = 0;
	node = ctl_report_node(&snap.node, &env);
	check_object("node", &ctl_node_table, &snap.node, node, text, "");
	json_object_put(node);
	for (unsigned int i = 0; i < snap.nmigs; i++) {
		const struct px_migration_info *mi = &migs[i];

		m = mig_json(i);
		mig_labels(mi, labels, sizeof(labels));
		snprintf(where, sizeof(where), "migration %s", mi->key);
		check_object(where, &ctl_migration_table, mi, m, text, labels);
		assert_true(json_object_object_get_ex(m, "inspect", &a));
		if (mi->inspected) {
			check_object(where, &ctl_insp_summary_table, &mi->insp, a, text, labels);
		} else {
			assert_null(a);
			for (size_t k = 0; k < ctl_insp_summary_table.n; k++)
				if (ctl_insp_summary_table.figs[k].prom.name)
					check_prom(where, text, &ctl_insp_summary_table.figs[k],
						   labels, NULL, false);
		}
		assert_true(json_object_object_get_ex(m, "ports", &a));
		assert_int_equal(json_object_array_length(a), mi->nports);
		for (unsigned int j = 0; j < mi->nports; j++) {
			snprintf(plabels, sizeof(plabels), "%s,port=\"%u\"", labels,
				 mi->ports[j].id);
			snprintf(where, sizeof(where), "migration %s port %u", mi->key,
				 mi->ports[j].id);
			check_object(where, &ctl_port_table, &mi->ports[j],
				     json_object_array_get_idx(a, j), text, plabels);
		}
		assert_true(json_object_object_get_ex(m, "connections", &a));
		assert_int_equal(json_object_array_length(a), mi->nconns);
		for (unsigned int j = 0; j < mi->nconns; j++) {
			const struct px_conn_info *ci = &mi->conns[j];

			c = json_object_array_get_idx(a, j);
			snprintf(plabels, sizeof(plabels), "%s,port=\"%u\",conn=\"%u.%u\"", labels,
				 ci->port, ci->port, ci->seq);
			snprintf(where, sizeof(where), "migration %s conn %u.%u", mi->key, ci->port,
				 ci->seq);
			check_object(where, &ctl_conn_table, ci, c, text, plabels);
			assert_true(json_object_object_get_ex(c, "inspect", &c));
			if (ci->inspected)
				check_object(where, &ctl_insp_stats_table, &ci->insp, c, NULL,
					     NULL);
			else
				assert_null(c);
		}
		assert_true(json_object_object_get_ex(m, "convergence", &c));
		snprintf(where, sizeof(where), "migration %s convergence", mi->key);
		if (conv[i].backend) {
			check_object(where, &ctl_conv_table, &conv[i], c, text, labels);
			assert_true(json_object_object_get_ex(c, "actions", &a));
			assert_int_equal(json_object_array_length(a), conv[i].nactions);
			for (unsigned int j = 0; j < conv[i].nactions; j++)
				check_object(where, &ctl_action_table, &conv[i].actions[j],
					     json_object_array_get_idx(a, j), NULL, NULL);
		} else {
			assert_null(c);
		}
		assert_true(json_object_object_get_ex(m, "nic", &c));
		snprintf(where, sizeof(where), "migration %s nic", mi->key);
		if (nics[i].nic.ifindex) {
			check_object(where, &ctl_nic_table, &nics[i], c, text, labels);
		} else {
			assert_null(c);
			for (size_t k = 0; k < ctl_nic_table.n; k++)
				if (ctl_nic_table.figs[k].prom.name)
					check_prom(where, text, &ctl_nic_table.figs[k], labels,
						   NULL, false);
		}
		json_object_put(m);
	}
	free(text);
	assert_int_equal(problems, 0);
}

/* The figures as the tables read them: a few by hand, so that the walk above is not only the
 * tables checked against themselves. */
static void test_values_by_hand(void **state)
{
	static const struct {
		int mig; /* -1: the node */
		const char *path, *json;
	} want[] = {
		{ -1, "bytes_rx", "77" },
		{ -1, "shaper", "\"pacing\"" },
		{ -1, "migration_count", "3" },
		{ -1, "digest", "\"auto\"" },
		{ -1, "verified", "{ \"match\": 12, \"corrupt\": 1, \"unverified\": 0 }" },
		{ -1, "conns", "{ \"active\": 4, \"total\": 9 }" },
		{ -1, "time_unix", "1700000000.500" },
		{ 0, "rates",
		  "{ \"tx_1s\": 52428801, \"tx_10s\": 50000001, \"rx_1s\": 3, \"rx_10s\": 4 }" },
		{ 0, "conns",
		  "{ \"active\": 2, \"total\": 19, \"failed\": 1, \"verified\": 0, \"corrupt\": 0, "
		  "\"unverified\": 0, \"reordered\": 4 }" },
		{ 0, "duration_s", "10.000" },
		{ 0, "started_unix", "1699999990.500" },
		{ 0, "shaped_ms", "2500" },
		{ 1, "duration_s", "0.001" },
		{ 1, "mode", "\"plain\"" },
		{ 1, "role", "\"target\"" },
		{ 2, "cap_lifted", "true" },
		{ 2, "inspect", "null" },
		{ 1, "convergence", "null" },
	};
	struct json_object *o, *v;
	char buf[64];
	int found;

	fill();
	json_c_set_serialization_double_format("%.3f", JSON_C_OPTION_THREAD);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		o = want[i].mig < 0 ? ctl_report_node(&snap.node, &env) : mig_json(want[i].mig);
		v = at(o, want[i].path, &found);
		assert_int_equal(found, 2);
		if (strcmp(json_object_to_json_string_ext(v, JSON_C_TO_STRING_SPACED),
			   want[i].json))
			fail_msg("%d %s: %s, want %s", want[i].mig, want[i].path,
				 json_object_to_json_string_ext(v, JSON_C_TO_STRING_SPACED),
				 want[i].json);
		json_object_put(o);
	}
	/* Deeper: a port, a connection, the inspector, convergence. */
	o = mig_json(0);
	v = json_object_array_get_idx(json_object_object_get(o, "ports"), 0);
	assert_int_equal(json_object_get_int(json_object_object_get(v, "id")), 49152);
	assert_string_equal(json_object_get_string(json_object_object_get(v, "socket")),
			    "/run/a.sock");
	assert_int_equal(json_object_get_int(json_object_object_get(
				 json_object_object_get(v, "rates"), "rx_10s")),
			 24);
	v = json_object_array_get_idx(json_object_object_get(o, "connections"), 1);
	assert_int_equal(json_object_get_int64(json_object_object_get(v, "pacing")), 62500000);
	assert_string_equal(json_object_get_string(json_object_object_get(v, "crypto")), "ktls");
	v = json_object_object_get(v, "inspect");
	assert_string_equal(json_object_get_string(json_object_object_get(v, "kind")), "multifd");
	assert_int_equal(json_object_get_int(json_object_object_get(v, "channel_id")), 2);
	v = json_object_object_get(o, "inspect");
	assert_int_equal(json_object_get_int64(json_object_object_get(v, "dirty_rate")), 20480000);
	assert_int_equal(json_object_get_int(json_object_object_get(
				 json_object_object_get(v, "channels"), "other")),
			 1);
	v = json_object_object_get(o, "convergence");
	assert_string_equal(json_object_get_string(json_object_object_get(v, "state")), "watching");
	assert_int_equal(json_object_get_int(json_object_object_get(
				 json_object_object_get(v, "action_counts"), "post-copy")),
			 3);
	snprintf(buf, sizeof(buf), "%s",
		 json_object_to_json_string(json_object_object_get(
			 json_object_array_get_idx(json_object_object_get(v, "actions"), 0),
			 "at_s")));
	assert_string_equal(buf, "5.250");
	json_object_put(o);
	o = mig_json(2);
	v = json_object_object_get(o, "convergence");
	assert_string_equal(json_object_get_string(json_object_object_get(v, "state")), "stopped");
	assert_string_equal(json_object_get_string(json_object_object_get(v, "last_error")),
			    "libvirt: gone");
	assert_true(json_object_object_get_ex(v, "job", &v));
	assert_null(v);
	json_object_put(o);
}

/* The job object is the one the tools print (cv_job_json), figure for figure. */
static void test_job_as_cv_job_json(void **state)
{
	struct json_object *o, *job, *want;

	fill();
	o = mig_json(0);
	job = json_object_object_get(json_object_object_get(o, "convergence"), "job");
	want = cv_job_json(&conv[0].job);
	if (!json_object_equal(job, want))
		fail_msg("job %s, cv_job_json %s", json_object_to_json_string(job),
			 json_object_to_json_string(want));
	conv[0].job.error[0] = '\0';
	json_object_put(o);
	json_object_put(want);
	o = mig_json(0);
	job = json_object_object_get(json_object_object_get(o, "convergence"), "job");
	want = cv_job_json(&conv[0].job);
	assert_true(json_object_equal(job, want));
	json_object_put(o);
	json_object_put(want);
}

/* The keys of o, sorted, comma-separated. */
static void keys_of(struct json_object *o, char *buf, size_t len)
{
	const char *keys[64];
	size_t n = 0, used = 0;

	json_object_object_foreach (o, k, v) {
		(void)v;
		assert_true(n < 64);
		keys[n++] = k;
	}
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && strcmp(keys[j - 1], keys[j]) > 0; j--) {
			const char *t = keys[j];

			keys[j] = keys[j - 1];
			keys[j - 1] = t;
		}
	buf[0] = '\0';
	for (size_t i = 0; i < n; i++)
		used += snprintf(buf + used, len - used, "%s%s", i ? "," : "", keys[i]);
}

static void check_keys(struct json_object *o, const char *want)
{
	char got[2048];

	keys_of(o, got, sizeof(got));
	if (strcmp(got, want) != 0)
		fail_msg("keys %s, want %s", got, want);
}

/* What doc/interfaces.md promises for reply version 2, key for key. */
static void test_schema_v2(void **state)
{
	struct json_object *o;

	fill();
	snap.node.dpdk.on = false; /* a node without a DPDK port: no dpdk object */
	o = ctl_report_node(&snap.node, &env);
	check_keys(o, "bandwidth,bytes_rx,bytes_tx,conns,digest,inspect,migration_count,"
		      "migrations_ended,rates,resume_refused,shaper,time_unix,tls_refusals,verified");
	check_keys(json_object_object_get(o, "verified"), "corrupt,match,unverified");
	check_keys(json_object_object_get(o, "migrations_ended"), "source,target");
	check_keys(json_object_object_get(json_object_object_get(o, "migrations_ended"), "source"),
		   "aborted-by-vmigd,cancelled,completed,connection-errors,corrupt,cut-short,"
		   "failed,stopped");
	check_keys(json_object_object_get(o, "tls_refusals"),
		   "bad-purpose,closed,expired,handshake-timeout,name-not-allowed,no-certificate,"
		   "not-yet-valid,peer-refused,protocol,silent,untrusted-ca");
	json_object_put(o);
	/* the DPDK node hop's figures, only on a node that has one */
	snap.node.dpdk.on = true;
	o = ctl_report_node(&snap.node, &env);
	check_keys(json_object_object_get(o, "dpdk"),
		   "address,fallbacks,fast_recoveries,forged,link_restarts,link_up,malformed,polls,"
		   "replayed,"
		   "retransmitted_frames,rx_frames,sealed,sleeps,timeouts,too_old,tx_bursts,"
		   "tx_frames,unknown_peer,unknown_stream,unreachable_peers");
	snap.node.dpdk.on = false;
	check_keys(json_object_object_get(o, "conns"), "active,total");
	check_keys(json_object_object_get(o, "rates"), "rx_10s,rx_1s,tx_10s,tx_1s");
	json_object_put(o);
	o = mig_json(0);
	check_keys(o, "bytes_rx,bytes_tx,cap,cap_lifted,compress,connections,conns,convergence,"
		      "duration_s,inspect,key,kubevirt,limit,mode,nic,peer,ports,rates,resume,role,"
		      "shaped_ms,started_unix,state,tls,wire");
	check_keys(json_object_object_get(o, "compress"),
		   "changes,conns_on,cpu_ms,mode,plain,ratio_pct,wire");
	check_keys(json_object_object_get(o, "wire"), "tx,tx_10s,tx_1s");
	assert_int_equal(json_object_get_int(json_object_object_get(
				 json_object_object_get(o, "compress"), "ratio_pct")),
			 25);
	check_keys(json_object_object_get(o, "resume"),
		   "conns,fallbacks,kept,refused,replayed,resumptions,suspended,unhopped_ms");
	check_keys(json_object_object_get(o, "nic"),
		   "addresses,device,driver,error,gateway,interface,kind,link_down_ms,link_downs,"
		   "link_up,mtu,numa_node,peer,pf,pf_interface,queues,source,speed,speed_known,"
		   "state,vf");
	check_keys(json_object_object_get(o, "conns"),
		   "active,corrupt,failed,reordered,total,unverified,verified");
	check_keys(json_object_array_get_idx(json_object_object_get(o, "ports"), 0),
		   "bytes_rx,bytes_tx,conns,id,rates,socket");
	check_keys(
		json_object_object_get(
			json_object_array_get_idx(json_object_object_get(o, "ports"), 0), "conns"),
		"active,total");
	check_keys(json_object_array_get_idx(json_object_object_get(o, "connections"), 0),
		   "bytes_rx,bytes_tx,compress,inspect,pacing,path,port,rates,raw,resume,seq,"
		   "shaped_ms,state,tls");
	check_keys(json_object_object_get(
			   json_object_array_get_idx(json_object_object_get(o, "connections"), 0),
			   "compress"),
		   "idle_pct,mode,on,plain,recent_pct,why,wire");
	check_keys(json_object_array_get_idx(json_object_object_get(o, "connections"), 1),
		   "bytes_rx,bytes_tx,cipher,crypto,inspect,pacing,path,port,rates,raw,resume,resumed,"
		   "seq,shaped_ms,state,tls");
	check_keys(
		json_object_object_get(o, "inspect"),
		"bytes_only,channels,dirty_known,dirty_pages_per_pass,dirty_rate,machine,packets,"
		"page_size,pages,passes,ram_total,reason,remaining,remaining_from,stream_version,"
		"switchover,syncs,zero_pages");
	check_keys(json_object_object_get(
			   json_object_array_get_idx(json_object_object_get(o, "connections"), 0),
			   "inspect"),
		   "bytes,bytes_only,channel_id,kind,machine,packets,page_size,pages,pass_ms_last,"
		   "pass_pages_last,passes,ram_total,reason,stream_version,switchover,sync_bytes_last,"
		   "syncs,zero_pages");
	check_keys(json_object_object_get(o, "convergence"),
		   "action_counts,actions,backend,dirty_rate,dirty_rate_from,elapsed_ms,"
		   "irrecoverable,job,link_rate,mode,policy,query_errors,state");
	check_keys(
		json_object_array_get_idx(
			json_object_object_get(json_object_object_get(o, "convergence"), "actions"),
			1),
		"action,at_s,error,ok,reason");
	check_keys(
		json_object_array_get_idx(
			json_object_object_get(json_object_object_get(o, "convergence"), "actions"),
			0),
		"action,at_s,ok,reason");
	json_object_put(o);
	/* A failed target: error, no peer. */
	o = mig_json(1);
	check_keys(
		o,
		"bytes_rx,bytes_tx,cap,cap_lifted,connections,conns,convergence,duration_s,"
		"error,inspect,key,kubevirt,limit,mode,nic,ports,rates,resume,role,shaped_ms,started_unix,"
		"state,tls,wire");
	json_object_put(o);
	o = mig_json(2);
	check_keys(json_object_object_get(o, "convergence"),
		   "action_counts,actions,backend,dirty_rate,dirty_rate_from,elapsed_ms,"
		   "irrecoverable,job,last_error,link_rate,mode,outcome,policy,query_errors,state");
	json_object_put(o);
}

/* The tables' own rules. */
static void test_table_rules(void **state)
{
	for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++) {
		const struct ctl_table *tab = tables[t];

		for (size_t k = 0; k < tab->n; k++) {
			const struct ctl_fig *f = &tab->figs[k];
			const char *p;
			int convs = 0;

			if (!f->key || !f->get.type)
				fail_msg("%s: entry %zu without a key or accessor", tab->what, k);
			if (ctl_fig_find(tab, f->key) != f)
				fail_msg("%s: key %s twice", tab->what, f->key);
			if (f->prom.name) {
				if (!is_exported(tab))
					fail_msg("%s %s: exported from a table that is not",
						 tab->what, f->key);
				if (strncmp(f->prom.name, "vmigd_", 6) != 0 || !f->prom.help ||
				    !f->prom.type)
					fail_msg("%s %s: family %s", tab->what, f->key,
						 f->prom.name);
				if ((strcmp(f->prom.type, "counter") == 0) !=
				    (strlen(f->prom.name) > 6 &&
				     strcmp(f->prom.name + strlen(f->prom.name) - 6, "_total") ==
					     0))
					fail_msg("%s: a counter ends in _total, a gauge does not",
						 f->prom.name);
				if (f->unit == CTL_STR)
					fail_msg("%s %s: a string is no sample", tab->what, f->key);
				/* A family's members are next to each other, alike. */
				for (size_t j = k + 2; j < tab->n; j++)
					if (tab->figs[j].prom.name &&
					    strcmp(tab->figs[j].prom.name, f->prom.name) == 0 &&
					    (!tab->figs[j - 1].prom.name ||
					     strcmp(tab->figs[j - 1].prom.name, f->prom.name) != 0))
						fail_msg("%s: family %s split", tab->what,
							 f->prom.name);
				if (k > 0 && tab->figs[k - 1].prom.name &&
				    strcmp(tab->figs[k - 1].prom.name, f->prom.name) == 0 &&
				    (strcmp(tab->figs[k - 1].prom.help, f->prom.help) ||
				     strcmp(tab->figs[k - 1].prom.type, f->prom.type)))
					fail_msg("%s: members differ in help or type",
						 f->prom.name);
			}
			if (!f->text)
				continue;
			if (!f->line)
				fail_msg("%s %s: text without a line", tab->what, f->key);
			/* vmigctl hands the format one string: exactly one %s, or none for a
			 * boolean's "IF TRUE|IF FALSE". */
			for (p = f->text; (p = strchr(p, '%')); p += 2) {
				if (p[1] == 's')
					convs++;
				else if (p[1] != '%')
					fail_msg("%s %s: format \"%s\"", tab->what, f->key,
						 f->text);
			}
			if (f->unit == CTL_BOOL ? convs != 0 || !strchr(f->text, '|') : convs != 1)
				fail_msg("%s %s: text \"%s\"", tab->what, f->key, f->text);
		}
	}
}

/* The NIC figures by hand: a VF with its device, a veth without one, and the info metric. */
static void test_nic(void **state)
{
	struct json_object *o, *n;
	char *text;

	fill();
	o = mig_json(0);
	n = json_object_object_get(o, "nic");
	assert_int_equal(json_object_get_uint64(json_object_object_get(n, "speed")), 3125000000);
	assert_int_equal(json_object_get_int(json_object_object_get(n, "numa_node")), 1);
	assert_string_equal(json_object_get_string(json_object_object_get(n, "pf_interface")),
			    "ens1f0");
	assert_false(json_object_get_boolean(json_object_object_get(n, "link_up")));
	assert_int_equal(json_object_get_int(json_object_object_get(n, "link_down_ms")), 1500);
	json_object_put(o);
	o = mig_json(1);
	n = json_object_object_get(o, "nic");
	check_keys(n, "interface,kind,link_down_ms,link_downs,link_up,mtu,peer,queues,speed,"
		      "speed_known,state,vf");
	assert_true(json_object_object_get_ex(n, "speed", NULL));
	assert_null(json_object_object_get(n, "speed"));
	json_object_put(o);
	o = mig_json(2);
	assert_true(json_object_object_get_ex(o, "nic", &n));
	assert_null(n);
	json_object_put(o);

	text = prom_text();
	assert_non_null(strstr(text, "\nvmigd_migration_nic_info{key=\"vm-1\",role=\"source\","
				     "interface=\"ens1f0v2\",kind=\"device\",driver=\"igbvf\","
				     "device=\"0000:02:10.4\",vf=\"true\",pf=\"0000:02:00.0\","
				     "numa_node=\"1\"} 1\n"));
	assert_non_null(strstr(text, "\nvmigd_migration_link_down_seconds{key=\"vm-1\","
				     "role=\"source\"} 1.500\n"));
	/* veth: no speed sample, link up. */
	assert_null(strstr(text, "vmigd_migration_nic_speed_bytes_per_second{key=\"vm.2_x\""));
	assert_non_null(
		strstr(text, "\nvmigd_migration_link_up{key=\"vm.2_x\",role=\"target\"} 1\n"));
	assert_null(strstr(text, "vmigd_migration_nic_info{key=\"k3\""));
	free(text);
}

/* The samples of the convergence actions family: one migration after the other. */
/* A test build's figures (ctrl/ctl_test.c) join a group the table has, on the same condition:
 * the node's dpdk object gains them; a node without a hop still has none. On a copy of the node
 * table, so that the other tests see the product's. */
static void test_table_extend(void **state)
{
	static const struct ctl_fig extra[] = {
		{ "dpdk.dropped_by_test", CTL_COUNT,
		  .get = { .type = CTL_C_U64,
			   .off = offsetof(struct px_node_info, dpdk.stats.dropped_by_test) },
		  .absent = CTL_OMIT,
		  .when = { .type = CTL_C_BOOL, .off = offsetof(struct px_node_info, dpdk.on) } },
	};
	struct ctl_table t = ctl_node_table;
	struct json_object *o, *d;

	fill();
	assert_int_equal(ctl_table_extend(&t, extra, sizeof(extra) / sizeof(extra[0])), 0);
	assert_int_equal(t.n, ctl_node_table.n + 1);
	assert_ptr_equal(ctl_fig_find(&t, "dpdk.dropped_by_test"), &t.figs[t.n - 1]);
	assert_null(ctl_fig_find(&ctl_node_table, "dpdk.dropped_by_test"));
	snap.node.dpdk.on = true;
	snap.node.dpdk.stats.dropped_by_test = 17;
	o = json_object_new_object();
	ctl_report_figures(o, &t, &snap.node, &env);
	assert_true(json_object_object_get_ex(o, "dpdk", &d));
	assert_int_equal(json_object_get_int64(json_object_object_get(d, "dropped_by_test")), 17);
	assert_non_null(json_object_object_get(d, "tx_frames"));
	json_object_put(o);
	snap.node.dpdk.on = false;
	o = json_object_new_object();
	ctl_report_figures(o, &t, &snap.node, &env);
	assert_false(json_object_object_get_ex(o, "dpdk", &d));
	json_object_put(o);
	free((void *)t.figs);
}

static void test_prom_convergence(void **state)
{
	char *text, *a, *b;

	fill();
	text = prom_text();
	a = strstr(text, "vmigd_convergence_actions_total{key=\"vm-1\",role=\"source\","
			 "action=\"abort\"} 0\n");
	b = strstr(text, "vmigd_convergence_actions_total{key=\"k3\",role=\"source\","
			 "action=\"raise-cap\"} 0\n");
	assert_non_null(a);
	assert_non_null(b);
	assert_true(a < b);
	assert_non_null(strstr(text, "\nvmigd_convergence_dirty_rate_bytes_per_second{key=\"vm-1\","
				     "role=\"source\"} 24000000\n"));
	/* No job yet: no sample of it (its family is listed all the same). */
	assert_null(strstr(text, "vmigd_convergence_remaining_bytes{key=\"k3\""));
	assert_null(strstr(text, "vmigd_convergence_dirty_rate_bytes_per_second{key=\"k3\""));
	assert_non_null(strstr(text,
			       "\nvmigd_convergence_info{key=\"k3\",role=\"source\","
			       "mode=\"kubevirt\",backend=\"libvirt\",state=\"stopped\"} 1\n"));
	free(text);
	conv[0].have_job = false;
	text = prom_text();
	assert_null(strstr(text, "\nvmigd_convergence_remaining_bytes{"));
	assert_non_null(strstr(text, "\n# TYPE vmigd_convergence_remaining_bytes gauge\n"));
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_rules),
		cmocka_unit_test(test_every_figure),
		cmocka_unit_test(test_values_by_hand),
		cmocka_unit_test(test_job_as_cv_job_json),
		cmocka_unit_test(test_schema_v2),
		cmocka_unit_test(test_table_extend),
		cmocka_unit_test(test_prom_convergence),
		cmocka_unit_test(test_nic),
	};

	return cmocka_run_group_tests_name("figures", tests, NULL, NULL);
}
