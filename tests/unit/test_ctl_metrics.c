// SPDX-License-Identifier: Apache-2.0
/* Unit tests for the Prometheus rendering (ctrl/ctl_metrics.h): snapshots built by hand, checked
 * for the text format's rules (HELP and TYPE once per family, samples grouped under them, label
 * values escaped) and for exact sample lines. The HTTP endpoint is not run here. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl_metrics.h"
#include "ctl_report.h"
#include "util.h"

#define MAX_FAMILIES 256

/* The format's rules, checked line by line over the whole text. */
static void check_format(const char *text)
{
	static char names[MAX_FAMILIES][128];
	unsigned int help[MAX_FAMILIES] = { 0 }, type[MAX_FAMILIES] = { 0 }, n = 0;
	char cur[128] = "";
	const char *line = text;

	assert_true(strlen(text) > 0);
	assert_int_equal(text[strlen(text) - 1], '\n');
	while (*line) {
		const char *end = strchr(line, '\n');
		char buf[1024], name[128];
		unsigned int i;

		assert_non_null(end);
		assert_true((size_t)(end - line) < sizeof(buf));
		memcpy(buf, line, end - line);
		buf[end - line] = '\0';
		line = end + 1;
		if (strncmp(buf, "# HELP ", 7) == 0 || strncmp(buf, "# TYPE ", 7) == 0) {
			bool is_help = buf[2] == 'H';

			assert_int_equal(sscanf(buf + 7, "%127s", name), 1);
			for (i = 0; i < n && strcmp(names[i], name) != 0; i++)
				;
			if (i == n) {
				assert_true(n < MAX_FAMILIES);
				strcpy(names[n++], name);
			}
			(is_help ? help : type)[i]++;
			if (!is_help) {
				const char *t = buf + 7 + strlen(name) + 1;

				assert_true(strcmp(t, "gauge") == 0 || strcmp(t, "counter") == 0);
				strcpy(cur, name);
			}
			continue;
		}
		/* A sample: NAME[{LABELS}] VALUE, under the TYPE line of its own family. */
		assert_true(buf[0] != '#' && buf[0] != '\0');
		assert_int_equal(sscanf(buf, "%127[a-z_]", name), 1);
		if (strcmp(name, cur) != 0)
			fail_msg("sample of %s outside its group (under %s): %s", name, cur, buf);
		assert_non_null(strrchr(buf, ' '));
		assert_true(strspn(strrchr(buf, ' ') + 1, "0123456789.") ==
			    strlen(strrchr(buf, ' ') + 1));
		/* Counters end in _total, gauges do not. */
	}
	for (unsigned int i = 0; i < n; i++) {
		if (help[i] != 1 || type[i] != 1)
			fail_msg("%s: %u HELP and %u TYPE lines, want one each", names[i], help[i],
				 type[i]);
		/* vmigd's own, or the process_* of Prometheus client convention */
		assert_true(strncmp(names[i], "vmigd_", 6) == 0 ||
			    strncmp(names[i], "process_", 8) == 0);
	}
}

static void check_type(const char *text, const char *name, const char *type)
{
	char want[256];

	snprintf(want, sizeof(want), "\n# TYPE %s %s\n", name, type);
	if (!strstr(text, want))
		fail_msg("no \"# TYPE %s %s\" line", name, type);
}

static void check_line(const char *text, const char *line)
{
	char want[1024];

	snprintf(want, sizeof(want), "\n%s\n", line);
	if (!strstr(text, want))
		fail_msg("no line \"%s\" in:\n%s", line, text);
}

static void check_no(const char *text, const char *what)
{
	if (strstr(text, what))
		fail_msg("\"%s\" should not be there", what);
}

static char *render(const struct ctl_metrics_snapshot *s)
{
	char *text;
	size_t len;

	assert_int_equal(ctl_metrics_render(s, &text, &len), 0);
	assert_int_equal(strlen(text), len);
	return text;
}

static const struct px_conn_info conns[] = {
	{ .port = 49152,
	  .seq = 0,
	  .state = "linked",
	  .bytes_tx = 4096,
	  .bytes_rx = 12,
	  .shaped_ms = 1500,
	  .pacing = 0 },
	{ .port = 49152,
	  .seq = 3,
	  .state = "linked",
	  .tls = "TLSv1.3",
	  .cipher = "TLS_AES_128_GCM_SHA256",
	  .crypto = "ktls",
	  .bytes_tx = 1 << 20,
	  .pacing = 62500000 },
};

static void fill(struct ctl_metrics_snapshot *s, struct px_migration_info *m)
{
	memset(s, 0, sizeof(*s));
	memset(m, 0, 2 * sizeof(*m));
	s->node.bandwidth = 125000000;
	s->node.shaper = PX_SHAPE_BUCKET;
	s->node.inspect = true;
	s->node.bytes_tx = 1073741824;
	s->node.bytes_rx = 77;
	s->node.rate = (struct px_rates){ 52428800, 50000000, 1, 2 };
	s->node.migrations = 2;
	s->node.conns_active = 2;
	s->node.conns_total = 9;
	s->now_ms = 100000;
	s->now_unix = 1700000000.5;
	s->migs = m;
	s->nmigs = 2;

	m[0].key = "vm-1";
	m[0].role = PX_ROLE_SOURCE;
	m[0].state = "active";
	m[0].mode = "ktls";
	m[0].started_ms = 90000;
	m[0].bytes_tx = 1073741824;
	m[0].bytes_rx = 77;
	m[0].rate = (struct px_rates){ 52428800, 50000000, 1, 2 };
	m[0].cap = 67108864;
	m[0].limit = 62500000;
	m[0].shaped_ms = 2500;
	m[0].conns_active = 2;
	m[0].conns_total = 9;
	m[0].conns_failed = 1;
	m[0].nports = 2;
	m[0].ports[0] =
		(struct px_port_info){ .id = 49152, .bytes_tx = 1073741800, .conns_active = 2 };
	m[0].ports[1] = (struct px_port_info){ .id = 0, .bytes_tx = 24 };
	m[0].nconns = 2;
	m[0].conns = conns;
	m[0].inspected = true;
	m[0].insp.main = 1;
	m[0].insp.multifd = 8;
	m[0].insp.stream_version = 3;
	/* From the wire: quotes, backslashes and newlines must come out escaped. */
	strcpy(m[0].insp.machine, "pc\"q\\35\nx");
	m[0].insp.pages = 250000;
	m[0].insp.zero_pages = 10000;
	m[0].insp.syncs = 40;
	m[0].insp.passes = 3;
	m[0].insp.dirty_known = true;
	m[0].insp.dirty_pages_per_pass = 5000;
	m[0].insp.dirty_rate = 20480000;

	m[1].key = "vm.2_x";
	m[1].role = PX_ROLE_TARGET;
	m[1].state = "failed";
	m[1].mode = "plain";
	m[1].started_ms = 99999;
	m[1].bytes_rx = 5;
	m[1].nports = 1;
	m[1].ports[0].id = 7;
}

static void test_render(void **state)
{
	struct px_migration_info m[2];
	struct ctl_metrics_snapshot s;
	char *text;

	fill(&s, m);
	text = render(&s);
	check_format(text);

	check_type(text, "vmigd_node_bandwidth_cap_bytes_per_second", "gauge");
	check_line(text, "vmigd_node_bandwidth_cap_bytes_per_second 125000000");
	check_type(text, "vmigd_node_sent_bytes_total", "counter");
	check_line(text, "vmigd_node_sent_bytes_total 1073741824");
	check_line(text, "vmigd_node_received_bytes_total 77");
	check_line(text,
		   "vmigd_node_rate_bytes_per_second{direction=\"tx\",window=\"1s\"} 52428800");
	check_line(text, "vmigd_node_rate_bytes_per_second{direction=\"rx\",window=\"10s\"} 2");
	check_line(text, "vmigd_node_info{shaper=\"bucket\",inspect=\"on\"} 1");
	check_line(text, "vmigd_migrations 2");

	check_line(text,
		   "vmigd_migration_sent_bytes_total{key=\"vm-1\",role=\"source\"} 1073741824");
	check_line(text, "vmigd_migration_received_bytes_total{key=\"vm.2_x\",role=\"target\"} 5");
	check_line(text, "vmigd_migration_rate_bytes_per_second{key=\"vm-1\",role=\"source\","
			 "direction=\"tx\",window=\"1s\"} 52428800");
	check_line(text,
		   "vmigd_migration_cap_bytes_per_second{key=\"vm-1\",role=\"source\"} 67108864");
	check_line(text,
		   "vmigd_migration_limit_bytes_per_second{key=\"vm-1\",role=\"source\"} 62500000");
	check_line(text, "vmigd_migration_cap_bytes_per_second{key=\"vm.2_x\",role=\"target\"} 0");
	check_line(text,
		   "vmigd_migration_connections{key=\"vm-1\",role=\"source\",state=\"active\"} 2");
	check_line(text, "vmigd_migration_connections_total{key=\"vm-1\",role=\"source\"} 9");
	check_line(text, "vmigd_migration_duration_seconds{key=\"vm-1\",role=\"source\"} 10.000");
	check_line(text, "vmigd_migration_duration_seconds{key=\"vm.2_x\",role=\"target\"} 0.001");
	check_line(text, "vmigd_migration_start_time_seconds{key=\"vm-1\",role=\"source\"} "
			 "1699999990.500");
	check_line(text,
		   "vmigd_migration_shaped_seconds_total{key=\"vm-1\",role=\"source\"} 2.500");
	check_line(text, "vmigd_migration_info{key=\"vm-1\",role=\"source\",state=\"active\","
			 "mode=\"ktls\",stream=\"3\",machine=\"pc\\\"q\\\\35\\nx\"} 1");
	check_line(text, "vmigd_migration_info{key=\"vm.2_x\",role=\"target\",state=\"failed\","
			 "mode=\"plain\",stream=\"\",machine=\"\"} 1");

	/* The inspector's figures, for the inspected migration only. */
	check_line(text, "vmigd_migration_pages_total{key=\"vm-1\",role=\"source\"} 250000");
	check_line(text, "vmigd_migration_zero_pages_total{key=\"vm-1\",role=\"source\"} 10000");
	check_line(text, "vmigd_migration_sync_points_total{key=\"vm-1\",role=\"source\"} 40");
	check_line(text, "vmigd_migration_passes_total{key=\"vm-1\",role=\"source\"} 3");
	check_line(text,
		   "vmigd_migration_dirty_rate_bytes_per_second{key=\"vm-1\",role=\"source\"} "
		   "20480000");
	check_line(text, "vmigd_migration_inspect_channels{key=\"vm-1\",role=\"source\","
			 "kind=\"multifd\"} 8");
	check_line(text, "vmigd_migration_switchover{key=\"vm-1\",role=\"source\"} 0");
	check_no(text, "vmigd_migration_pages_total{key=\"vm.2_x\"");
	check_no(text, "vmigd_migration_passes_total{key=\"vm.2_x\"");

	check_line(text, "vmigd_port_sent_bytes_total{key=\"vm-1\",role=\"source\",port=\"49152\"} "
			 "1073741800");
	check_line(text, "vmigd_port_sent_bytes_total{key=\"vm-1\",role=\"source\",port=\"0\"} 24");
	check_line(text,
		   "vmigd_port_received_bytes_total{key=\"vm.2_x\",role=\"target\",port=\"7\"} 0");
	check_line(text, "vmigd_port_rate_bytes_per_second{key=\"vm-1\",role=\"source\","
			 "port=\"49152\",direction=\"rx\",window=\"1s\"} 0");
	check_line(text, "vmigd_connection_sent_bytes_total{key=\"vm-1\",role=\"source\","
			 "port=\"49152\",conn=\"49152.3\"} 1048576");
	check_line(text, "vmigd_connection_received_bytes_total{key=\"vm-1\",role=\"source\","
			 "port=\"49152\",conn=\"49152.0\"} 12");
	check_line(text, "vmigd_connection_shaped_seconds_total{key=\"vm-1\",role=\"source\","
			 "port=\"49152\",conn=\"49152.0\"} 1.500");
	free(text);
}

/* The dirty-rate estimate appears only once a pass after the first completed. */
static void test_dirty_unknown(void **state)
{
	struct px_migration_info m[2];
	struct ctl_metrics_snapshot s;
	char *text;

	fill(&s, m);
	m[0].insp.dirty_known = false;
	text = render(&s);
	check_format(text);
	check_no(text, "vmigd_migration_dirty_rate_bytes_per_second{");
	check_no(text, "vmigd_migration_dirty_pages_per_pass{");
	check_line(text, "vmigd_migration_passes_total{key=\"vm-1\",role=\"source\"} 3");
	free(text);
}

static void test_no_migrations(void **state)
{
	struct px_migration_info m[2];
	struct ctl_metrics_snapshot s;
	char *text;

	fill(&s, m);
	s.nmigs = 0;
	s.node.migrations = 0;
	s.node.bandwidth = 0;
	s.node.shaper = PX_SHAPE_PACING;
	s.node.inspect = false;
	text = render(&s);
	check_format(text);
	check_line(text, "vmigd_migrations 0");
	check_line(text, "vmigd_node_bandwidth_cap_bytes_per_second 0");
	check_line(text, "vmigd_node_info{shaper=\"pacing\",inspect=\"off\"} 1");
	/* No sample of a migration, a port or a connection; their families are listed all the
	 * same (HELP and TYPE from start-up). */
	check_no(text, "\nvmigd_migration_");
	check_no(text, "\nvmigd_port_");
	check_no(text, "\nvmigd_connection_");
	check_type(text, "vmigd_migration_sent_bytes_total", "counter");
	check_type(text, "vmigd_migration_info", "gauge");
	free(text);
}

/* Many migrations and connections: still one group per family. */
static void test_many(void **state)
{
	static struct px_migration_info m[40];
	static char keys[40][16];
	struct ctl_metrics_snapshot s;
	char *text;

	fill(&s, m);
	for (unsigned int i = 2; i < 40; i++) {
		m[i] = m[i % 2];
		snprintf(keys[i], sizeof(keys[i]), "k%u", i);
		m[i].key = keys[i];
	}
	s.nmigs = 40;
	text = render(&s);
	check_format(text);
	check_line(text,
		   "vmigd_migration_sent_bytes_total{key=\"k38\",role=\"source\"} 1073741824");
	free(text);
}

/*
 * A convergence watch's state reads the same in Prometheus as in JSON (the conv table's "state"):
 * vmigd_convergence_info once worked it out itself and said "irrecoverable" where JSON said
 * "finished". Every combination of the flags the state is made of.
 */
static void test_conv_state_as_json(void **state)
{
	const struct ctl_fig *f = ctl_fig_find(&ctl_conv_table, "state");
	struct px_migration_info m[2];
	struct ctl_metrics_snapshot s;
	struct cv_report conv[2];

	assert_non_null(f);
	for (unsigned int bits = 0; bits < 16; bits++) {
		struct ctl_env env = { 0 };
		struct ctl_value v;
		char want[256];
		char *text;

		fill(&s, m);
		memset(conv, 0, sizeof(conv));
		conv[0].backend = "qmp";
		conv[0].irrecoverable = bits & 1;
		conv[0].finished = bits & 2;
		conv[0].stopped = bits & 4;
		conv[0].elapsed_ms = bits & 8 ? 1000 : -1;
		s.conv = conv;
		ctl_fig_read(f, &conv[0], &env, 0, &v);
		assert_int_equal(v.kind, CTL_V_STR);
		if (conv[0].irrecoverable)
			assert_string_equal(v.s, "irrecoverable");
		text = render(&s);
		check_format(text);
		snprintf(want, sizeof(want),
			 "vmigd_convergence_info{key=\"vm-1\",role=\"source\",mode=\"%s\","
			 "backend=\"qmp\",state=\"%s\"} 1",
			 cv_mode_str(conv[0].mode), v.s);
		check_line(text, want);
		free(text);
	}
}

/* Has "# HELP NAME " and "# TYPE NAME TYPE" lines. */
static void check_family(const char *text, const char *name, const char *type)
{
	char want[256];

	snprintf(want, sizeof(want), "# HELP %s ", name);
	if (!strstr(text, want))
		fail_msg("no HELP line for %s", name);
	check_type(text, name, type);
}

/* An idle node, just started: every family of every table is there with HELP and TYPE, and the
 * node's counters by label have every label set at 0. */
static void test_families_from_start(void **state)
{
	const struct ctl_table *tables[] = {
		&ctl_node_table, &ctl_migration_table, &ctl_insp_summary_table, &ctl_port_table,
		&ctl_conn_table, &ctl_conv_table,      &ctl_nic_table,		&ctl_process_table,
	};
	static const char *const info[] = { "vmigd_node_info", "vmigd_migration_info",
					    "vmigd_migration_nic_info", "vmigd_convergence_info",
					    "vmigd_build_info" };
	static const char *const outcomes[] = { "completed",	     "cancelled",	"failed",
						"cut-short",	     "stopped",		"corrupt",
						"connection-errors", "aborted-by-vmigd" };
	static const char *const reasons[] = {
		"no-certificate", "untrusted-ca",      "expired",      "not-yet-valid",
		"bad-purpose",	  "name-not-allowed",  "peer-refused", "protocol",
		"closed",	  "handshake-timeout", "silent"
	};
	struct ctl_metrics_snapshot s;
	char line[256], *text;

	memset(&s, 0, sizeof(s));
	s.proc = (struct ctl_process){ .version = "9.9.9", .features = "tls,inspect" };
	text = render(&s);
	check_format(text);
	for (size_t t = 0; t < ARRAY_SIZE(tables); t++)
		for (size_t k = 0; k < tables[t]->n; k++)
			if (tables[t]->figs[k].prom.name)
				check_family(text, tables[t]->figs[k].prom.name,
					     tables[t]->figs[k].prom.type);
	for (size_t i = 0; i < ARRAY_SIZE(info); i++)
		check_family(text, info[i], "gauge");
	check_family(text, "vmigd_migrations_total", "counter");
	check_family(text, "vmigd_tls_refusals_total", "counter");
	check_family(text, "vmigd_certificate_expiry_timestamp_seconds", "gauge");
	check_family(text, "process_cpu_seconds_total", "counter");
	check_family(text, "process_resident_memory_bytes", "gauge");
	check_family(text, "process_open_fds", "gauge");
	for (size_t i = 0; i < ARRAY_SIZE(outcomes); i++) {
		snprintf(line, sizeof(line),
			 "vmigd_migrations_total{role=\"source\",outcome=\"%s\"} 0", outcomes[i]);
		check_line(text, line);
		snprintf(line, sizeof(line),
			 "vmigd_migrations_total{role=\"target\",outcome=\"%s\"} 0", outcomes[i]);
		check_line(text, line);
	}
	for (size_t i = 0; i < ARRAY_SIZE(reasons); i++) {
		snprintf(line, sizeof(line), "vmigd_tls_refusals_total{reason=\"%s\"} 0",
			 reasons[i]);
		check_line(text, line);
	}
	check_line(text, "vmigd_build_info{version=\"9.9.9\",features=\"tls,inspect\"} 1");
	/* Without TLS no certificate, so no expiry sample; no DPDK hop, no frames. */
	check_no(text, "\nvmigd_certificate_expiry_timestamp_seconds{");
	check_no(text, "\nvmigd_dpdk_frames_total{");
	free(text);
}

/* Counts land on their own role and outcome; TLS expiry, DPDK frames, the renamed families. */
static void test_counts_and_renames(void **state)
{
	struct px_migration_info m[2];
	struct ctl_metrics_snapshot s;
	struct cv_report conv[2];
	char *text;

	fill(&s, m);
	s.node.ended_source[PX_OUT_COMPLETED] = 3;
	s.node.ended_source[PX_OUT_ABORTED] = 1;
	s.node.ended_target[PX_OUT_CUT_SHORT] = 2;
	s.node.tls_refusals[XP_TLS_UNTRUSTED] = 5;
	s.node.tls.on = true;
	s.node.tls.node_expiry = 1800000000;
	s.node.tls.ca_expiry = 1700000000;
	s.node.dpdk.on = true;
	s.node.dpdk.stats.tx_frames = 11;
	s.node.dpdk.stats.rx_frames = 12;
	s.proc = (struct ctl_process){ .cpu_ms = 1500,
				       .rss = 4096,
				       .start_ms = 1699999000250,
				       .open_fds = 9,
				       .max_fds = 1024 };
	memset(conv, 0, sizeof(conv));
	conv[0].backend = "qmp";
	conv[0].have_job = true;
	conv[0].job.throttle_pct = 35;
	conv[0].job.dirty_syncs = 7;
	s.conv = conv;
	text = render(&s);
	check_format(text);
	check_line(text, "vmigd_migrations_total{role=\"source\",outcome=\"completed\"} 3");
	check_line(text, "vmigd_migrations_total{role=\"source\",outcome=\"aborted-by-vmigd\"} 1");
	check_line(text, "vmigd_migrations_total{role=\"source\",outcome=\"cut-short\"} 0");
	check_line(text, "vmigd_migrations_total{role=\"target\",outcome=\"cut-short\"} 2");
	check_line(text, "vmigd_migrations_total{role=\"target\",outcome=\"completed\"} 0");
	check_line(text, "vmigd_tls_refusals_total{reason=\"untrusted-ca\"} 5");
	check_line(text, "vmigd_tls_refusals_total{reason=\"expired\"} 0");
	check_line(text, "vmigd_certificate_expiry_timestamp_seconds{cert=\"node\"} 1800000000");
	check_line(text, "vmigd_certificate_expiry_timestamp_seconds{cert=\"ca\"} 1700000000");
	check_line(text, "vmigd_dpdk_frames_total{direction=\"tx\"} 11");
	check_line(text, "vmigd_dpdk_frames_total{direction=\"rx\"} 12");
	check_no(text, "dir=");
	check_line(text, "vmigd_convergence_throttle_ratio{key=\"vm-1\",role=\"source\"} 0.35");
	check_type(text, "vmigd_convergence_dirty_syncs_total", "counter");
	check_line(text, "vmigd_convergence_dirty_syncs_total{key=\"vm-1\",role=\"source\"} 7");
	check_type(text, "vmigd_migration_passes_total", "counter");
	check_no(text, "throttle_percent");
	check_line(text, "process_cpu_seconds_total 1.500");
	check_line(text, "process_resident_memory_bytes 4096");
	check_line(text, "process_start_time_seconds 1699999000.250");
	check_line(text, "process_open_fds 9");
	check_line(text, "process_max_fds 1024");
	free(text);
}

/* /readyz's judgement: each reason on its own line. */
static void test_ready(void **state)
{
	struct px_node_info ni;
	char why[1024];

	memset(&ni, 0, sizeof(ni));
	assert_int_equal(ctl_metrics_ready(&ni, true, false, 1700000000, why, sizeof(why)), 0);
	assert_string_equal(why, "");
	assert_int_equal(ctl_metrics_ready(&ni, false, true, 1700000000, why, sizeof(why)), 2);
	assert_non_null(strstr(why, "node hop: not listening"));
	assert_non_null(strstr(why, "dpdk: "));
	ni.dpdk.on = true;
	assert_int_equal(ctl_metrics_ready(&ni, true, true, 1700000000, why, sizeof(why)), 0);
	ni.tls.on = true;
	ni.tls.node_expiry = 1800000000;
	ni.tls.ca_expiry = 1900000000;
	assert_int_equal(ctl_metrics_ready(&ni, true, false, 1700000000, why, sizeof(why)), 0);
	assert_int_equal(ctl_metrics_ready(&ni, true, false, 1850000000, why, sizeof(why)), 1);
	assert_string_equal(why, "tls: the node certificate expired at 1800000000 (Unix time)\n");
	assert_int_equal(ctl_metrics_ready(&ni, true, false, 1950000000, why, sizeof(why)), 2);
	assert_non_null(strstr(why, "\ntls: a CA certificate expired at 1900000000"));
	ni.tls.node_expiry = 0;
	assert_int_equal(ctl_metrics_ready(&ni, true, false, 1700000000, why, sizeof(why)), 1);
	assert_string_equal(why, "tls: no node certificate loaded\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_render),
		cmocka_unit_test(test_dirty_unknown),
		cmocka_unit_test(test_no_migrations),
		cmocka_unit_test(test_many),
		cmocka_unit_test(test_conv_state_as_json),
		cmocka_unit_test(test_families_from_start),
		cmocka_unit_test(test_counts_and_renames),
		cmocka_unit_test(test_ready),
	};

	return cmocka_run_group_tests_name("ctl_metrics", tests, NULL, NULL);
}
