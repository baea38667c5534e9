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
		assert_int_equal(strncmp(names[i], "vmigd_", 6), 0);
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
	check_line(text, "vmigd_migration_passes{key=\"vm-1\",role=\"source\"} 3");
	check_line(text,
		   "vmigd_migration_dirty_rate_bytes_per_second{key=\"vm-1\",role=\"source\"} "
		   "20480000");
	check_line(text, "vmigd_migration_inspect_channels{key=\"vm-1\",role=\"source\","
			 "kind=\"multifd\"} 8");
	check_line(text, "vmigd_migration_switchover{key=\"vm-1\",role=\"source\"} 0");
	check_no(text, "vmigd_migration_pages_total{key=\"vm.2_x\"");
	check_no(text, "vmigd_migration_passes{key=\"vm.2_x\"");

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
	check_line(text, "vmigd_migration_passes{key=\"vm-1\",role=\"source\"} 3");
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
	check_no(text, "vmigd_migration_");
	check_no(text, "vmigd_port_");
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_render),
		cmocka_unit_test(test_dirty_unknown),
		cmocka_unit_test(test_no_migrations),
		cmocka_unit_test(test_many),
		cmocka_unit_test(test_conv_state_as_json),
	};

	return cmocka_run_group_tests_name("ctl_metrics", tests, NULL, NULL);
}
