// SPDX-License-Identifier: Apache-2.0
/* Prometheus metrics: snapshot, text rendering (doc/interfaces.md lists the names) and the
 * libmicrohttpd endpoint, run without a thread of its own from the control loop, where px_node
 * may be read. Not a general HTTP server: GET /metrics, nothing else. */
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl_metrics.h"
#include "log.h"
#include "util.h"

/* A scrape is a handful of connections; more are refused, idle ones dropped. */
#define HTTP_CONN_LIMIT	  32
#define HTTP_IDLE_TIMEOUT 10 /* seconds */
#define LABELS_MAX	  1024

/* ---- snapshot ---- */

struct take {
	struct ctl_metrics_snapshot *s;
	unsigned int cap;
	int err;
};

static int dup_str(const char **dst, const char *src)
{
	if (!src) {
		*dst = NULL;
		return 0;
	}
	*dst = strdup(src);
	return *dst ? 0 : -ENOMEM;
}

static int copy_conns(struct px_migration_info *c, const struct px_migration_info *mi)
{
	struct px_conn_info *conns;

	if (mi->nconns == 0)
		return 0;
	conns = calloc(mi->nconns, sizeof(*conns));
	if (!conns)
		return -ENOMEM;
	c->conns = conns;
	for (unsigned int i = 0; i < mi->nconns; i++) {
		conns[i] = mi->conns[i];
		conns[i].state = conns[i].tls = conns[i].cipher = conns[i].crypto = NULL;
		c->nconns = i + 1;
		if (dup_str(&conns[i].state, mi->conns[i].state) < 0 ||
		    dup_str(&conns[i].tls, mi->conns[i].tls) < 0 ||
		    dup_str(&conns[i].cipher, mi->conns[i].cipher) < 0 ||
		    dup_str(&conns[i].crypto, mi->conns[i].crypto) < 0)
			return -ENOMEM;
	}
	return 0;
}

static void take_one(const struct px_migration_info *mi, void *arg)
{
	struct take *t = arg;
	struct px_migration_info *c;

	if (t->err)
		return;
	if (t->s->nmigs == t->cap) {
		unsigned int cap = t->cap ? 2 * t->cap : 8;
		struct px_migration_info *m = realloc(t->s->migs, cap * sizeof(*m));

		if (!m) {
			t->err = -ENOMEM;
			return;
		}
		t->s->migs = m;
		t->cap = cap;
	}
	c = &t->s->migs[t->s->nmigs++];
	*c = *mi;
	/* Nothing lent survives the callback: pointers are copies or NULL from here on. */
	c->key = c->peer = c->state = c->error = c->mode = NULL;
	c->conns = NULL;
	c->nconns = 0;
	if (dup_str(&c->key, mi->key) < 0 || dup_str(&c->peer, mi->peer) < 0 ||
	    dup_str(&c->state, mi->state) < 0 || dup_str(&c->error, mi->error) < 0 ||
	    dup_str(&c->mode, mi->mode) < 0 || copy_conns(c, mi) < 0)
		t->err = -ENOMEM;
}

void ctl_metrics_snapshot_free(struct ctl_metrics_snapshot *s)
{
	if (!s)
		return;
	for (unsigned int i = 0; i < s->nmigs; i++) {
		struct px_migration_info *m = &s->migs[i];

		for (unsigned int j = 0; j < m->nconns; j++) {
			free((char *)m->conns[j].state);
			free((char *)m->conns[j].tls);
			free((char *)m->conns[j].cipher);
			free((char *)m->conns[j].crypto);
		}
		free((struct px_conn_info *)m->conns);
		free((char *)m->key);
		free((char *)m->peer);
		free((char *)m->state);
		free((char *)m->error);
		free((char *)m->mode);
	}
	free(s->migs);
	free(s->conv);
	free(s);
}

int ctl_metrics_snapshot_take(struct px_node *n, struct cv_set *conv,
			      struct ctl_metrics_snapshot **ret)
{
	struct take t = { 0 };
	struct timespec ts;

	t.s = calloc(1, sizeof(*t.s));
	if (!t.s)
		return -ENOMEM;
	clock_gettime(CLOCK_REALTIME, &ts);
	t.s->now_ms = vm_now_ms();
	t.s->now_unix = ts.tv_sec + ts.tv_nsec / 1e9;
	px_node_info(n, &t.s->node);
	px_node_foreach(n, take_one, &t);
	if (!t.err && conv && t.s->nmigs) {
		t.s->conv = calloc(t.s->nmigs, sizeof(*t.s->conv));
		if (!t.s->conv)
			t.err = -ENOMEM;
		for (unsigned int i = 0; !t.err && i < t.s->nmigs; i++)
			if (t.s->migs[i].role == PX_ROLE_SOURCE)
				cv_watch_report(conv, t.s->migs[i].key, &t.s->conv[i]);
	}
	if (t.err) {
		ctl_metrics_snapshot_free(t.s);
		return t.err;
	}
	*ret = t.s;
	return 0;
}

/* ---- rendering ---- */

/*
 * One metric: a family name and, for families split by a label of their own (direction, window,
 * state, kind), the fixed labels of this member. Members of one family sit next to each other
 * in the tables below, so each family's samples form one group under one HELP and TYPE.
 */
struct metric {
	const char *name, *type, *help;
	const char *fixed; /* labels after the object's own, or NULL */
	int id;
	bool milli; /* the value is in thousandths of the unit */
};

enum {
	/* node */
	NV_CAP,
	NV_SENT,
	NV_RECV,
	NV_TX1,
	NV_TX10,
	NV_RX1,
	NV_RX10,
	NV_CONNS,
	NV_CONNS_TOTAL,
	NV_MIGS,
	/* migration */
	MV_SENT,
	MV_RECV,
	MV_TX1,
	MV_TX10,
	MV_RX1,
	MV_RX10,
	MV_CAP,
	MV_LIMIT,
	MV_CAP_LIFTED,
	MV_CONNS,
	MV_CONNS_TOTAL,
	MV_CONNS_FAILED,
	MV_CONNS_REORDERED,
	MV_DURATION,
	MV_START,
	MV_SHAPED,
	MV_CH_MAIN, /* from here on: inspected migrations only */
	MV_CH_MULTIFD,
	MV_CH_OTHER,
	MV_BYTES_ONLY,
	MV_PAGES,
	MV_ZERO,
	MV_PACKETS,
	MV_SYNCS,
	MV_PASSES,
	MV_DIRTY_PAGES,
	MV_DIRTY_RATE,
	MV_SWITCHOVER,
	/* port */
	PV_SENT,
	PV_RECV,
	PV_TX1,
	PV_TX10,
	PV_RX1,
	PV_RX10,
	PV_CONNS,
	PV_CONNS_TOTAL,
	/* connection */
	CV_SENT,
	CV_RECV,
	CV_SHAPED,
	CV_PACING,
};

#define TX1  "direction=\"tx\",window=\"1s\""
#define TX10 "direction=\"tx\",window=\"10s\""
#define RX1  "direction=\"rx\",window=\"1s\""
#define RX10 "direction=\"rx\",window=\"10s\""
#define M(n, t, h, f, i)                                                                           \
	{                                                                                          \
		.name = n, .type = t, .help = h, .fixed = f, .id = i                               \
	}
#define M_MILLI(n, t, h, f, i)                                                                     \
	{                                                                                          \
		.name = n, .type = t, .help = h, .fixed = f, .id = i, .milli = true                \
	}
#define RATE_FAMILY(name, help, first)                                                             \
	M(name, "gauge", help, TX1, first), M(name, "gauge", help, TX10, first + 1),               \
		M(name, "gauge", help, RX1, first + 2), M(name, "gauge", help, RX10, first + 3)

static const struct metric node_metrics[] = {
	M("vmigd_node_bandwidth_cap_bytes_per_second", "gauge",
	  "Cap on what this node sends, all migrations together; 0: none.", NULL, NV_CAP),
	M("vmigd_node_sent_bytes_total", "counter",
	  "QEMU stream bytes sent to peers (tx), all migrations since start.", NULL, NV_SENT),
	M("vmigd_node_received_bytes_total", "counter",
	  "QEMU stream bytes received from peers (rx), all migrations since start.", NULL, NV_RECV),
	RATE_FAMILY("vmigd_node_rate_bytes_per_second",
		    "Stream bytes per second over the window, all migrations.", NV_TX1),
	M("vmigd_node_connections", "gauge", "Connections being set up or carried now.",
	  "state=\"active\"", NV_CONNS),
	M("vmigd_node_connections_total", "counter", "Connections carried since start.", NULL,
	  NV_CONNS_TOTAL),
	M("vmigd_migrations", "gauge", "Migrations on this node now, either role.", NULL, NV_MIGS),
};

static const struct metric mig_metrics[] = {
	M("vmigd_migration_sent_bytes_total", "counter",
	  "QEMU stream bytes sent to the peer (local to peer).", NULL, MV_SENT),
	M("vmigd_migration_received_bytes_total", "counter",
	  "QEMU stream bytes received from the peer (peer to local).", NULL, MV_RECV),
	RATE_FAMILY("vmigd_migration_rate_bytes_per_second",
		    "Stream bytes per second over the window.", MV_TX1),
	M("vmigd_migration_cap_bytes_per_second", "gauge", "Cap set for this migration; 0: none.",
	  NULL, MV_CAP),
	M("vmigd_migration_limit_bytes_per_second", "gauge",
	  "What the migration may send now: its cap or its share of the node cap; 0: none.", NULL,
	  MV_LIMIT),
	M("vmigd_migration_cap_lifted", "gauge", "1 once the cap was lifted at switchover.", NULL,
	  MV_CAP_LIFTED),
	M("vmigd_migration_connections", "gauge", "Connections being set up or carried now.",
	  "state=\"active\"", MV_CONNS),
	M("vmigd_migration_connections_total", "counter", "Connections carried so far.", NULL,
	  MV_CONNS_TOTAL),
	M("vmigd_migration_connections_failed_total", "counter", "Connections that failed.", NULL,
	  MV_CONNS_FAILED),
	M("vmigd_migration_connections_reordered_total", "counter",
	  "Target: connections that arrived before a predecessor and waited.", NULL,
	  MV_CONNS_REORDERED),
	M_MILLI("vmigd_migration_duration_seconds", "gauge",
		"Time since the migration was started.", NULL, MV_DURATION),
	M_MILLI("vmigd_migration_start_time_seconds", "gauge",
		"When the migration was started, Unix time.", NULL, MV_START),
	M_MILLI("vmigd_migration_shaped_seconds_total", "counter",
		"Time the migration's connections waited for the cap, summed.", NULL, MV_SHAPED),
	M("vmigd_migration_inspect_channels", "gauge", "Connections the inspector saw, by kind.",
	  "kind=\"main\"", MV_CH_MAIN),
	M("vmigd_migration_inspect_channels", "gauge", "Connections the inspector saw, by kind.",
	  "kind=\"multifd\"", MV_CH_MULTIFD),
	M("vmigd_migration_inspect_channels", "gauge", "Connections the inspector saw, by kind.",
	  "kind=\"other\"", MV_CH_OTHER),
	M("vmigd_migration_inspect_bytes_only_channels", "gauge",
	  "Connections where the inspector stopped parsing and only counts bytes.", NULL,
	  MV_BYTES_ONLY),
	M("vmigd_migration_pages_total", "counter", "RAM pages sent with their data.", NULL,
	  MV_PAGES),
	M("vmigd_migration_zero_pages_total", "counter", "RAM pages sent as zero pages (no data).",
	  NULL, MV_ZERO),
	M("vmigd_migration_multifd_packets_total", "counter", "Multifd packet headers seen.", NULL,
	  MV_PACKETS),
	M("vmigd_migration_sync_points_total", "counter",
	  "Sync points seen: multifd SYNC flags, main-channel EOS and multifd flushes.", NULL,
	  MV_SYNCS),
	M("vmigd_migration_passes", "gauge", "RAM scan passes begun (the most any channel began).",
	  NULL, MV_PASSES),
	M("vmigd_migration_dirty_pages_per_pass", "gauge",
	  "Pages of the last completed pass after the first: an estimate of the dirty set.", NULL,
	  MV_DIRTY_PAGES),
	M("vmigd_migration_dirty_rate_bytes_per_second", "gauge",
	  "Dirty-rate estimate: the last completed pass's pages over its duration.", NULL,
	  MV_DIRTY_RATE),
	M("vmigd_migration_switchover", "gauge", "1 once the completion stage began (VM stopped).",
	  NULL, MV_SWITCHOVER),
};

static const struct metric port_metrics[] = {
	M("vmigd_port_sent_bytes_total", "counter", "Stream bytes sent on a logical port.", NULL,
	  PV_SENT),
	M("vmigd_port_received_bytes_total", "counter", "Stream bytes received on a logical port.",
	  NULL, PV_RECV),
	RATE_FAMILY("vmigd_port_rate_bytes_per_second",
		    "Stream bytes per second on a logical port over the window.", PV_TX1),
	M("vmigd_port_connections", "gauge", "Connections of a logical port now.",
	  "state=\"active\"", PV_CONNS),
	M("vmigd_port_connections_total", "counter", "Connections of a logical port so far.", NULL,
	  PV_CONNS_TOTAL),
};

static const struct metric conn_metrics[] = {
	M("vmigd_connection_sent_bytes_total", "counter",
	  "Stream bytes sent on an open connection.", NULL, CV_SENT),
	M("vmigd_connection_received_bytes_total", "counter",
	  "Stream bytes received on an open connection.", NULL, CV_RECV),
	M_MILLI("vmigd_connection_shaped_seconds_total", "counter",
		"Time an open connection waited for the cap.", NULL, CV_SHAPED),
	M("vmigd_connection_pacing_bytes_per_second", "gauge",
	  "SO_MAX_PACING_RATE set on the connection (pacing shaper); 0: none.", NULL, CV_PACING),
};

struct prom {
	FILE *f;
	const char *family; /* the last one whose HELP and TYPE were written */
};

static uint64_t rate_of(const struct px_rates *r, int which)
{
	switch (which) {
	case 0:
		return r->tx_1s;
	case 1:
		return r->tx_10s;
	case 2:
		return r->rx_1s;
	}
	return r->rx_10s;
}

static bool node_value(int id, const struct ctl_metrics_snapshot *s, uint64_t *v)
{
	const struct px_node_info *n = &s->node;

	switch (id) {
	case NV_CAP:
		*v = n->bandwidth;
		break;
	case NV_SENT:
		*v = n->bytes_tx;
		break;
	case NV_RECV:
		*v = n->bytes_rx;
		break;
	case NV_TX1:
	case NV_TX10:
	case NV_RX1:
	case NV_RX10:
		*v = rate_of(&n->rate, id - NV_TX1);
		break;
	case NV_CONNS:
		*v = n->conns_active;
		break;
	case NV_CONNS_TOTAL:
		*v = n->conns_total;
		break;
	case NV_MIGS:
		*v = n->migrations;
		break;
	default:
		return false;
	}
	return true;
}

static uint64_t age_ms(const struct ctl_metrics_snapshot *s, const struct px_migration_info *mi)
{
	return s->now_ms > mi->started_ms ? s->now_ms - mi->started_ms : 0;
}

static bool mig_value(int id, const struct ctl_metrics_snapshot *s,
		      const struct px_migration_info *mi, uint64_t *v)
{
	const struct px_insp_summary *in = &mi->insp;

	if (id >= MV_CH_MAIN && !mi->inspected)
		return false;
	switch (id) {
	case MV_SENT:
		*v = mi->bytes_tx;
		break;
	case MV_RECV:
		*v = mi->bytes_rx;
		break;
	case MV_TX1:
	case MV_TX10:
	case MV_RX1:
	case MV_RX10:
		*v = rate_of(&mi->rate, id - MV_TX1);
		break;
	case MV_CAP:
		*v = mi->cap;
		break;
	case MV_LIMIT:
		*v = mi->limit;
		break;
	case MV_CAP_LIFTED:
		*v = mi->cap_lifted;
		break;
	case MV_CONNS:
		*v = mi->conns_active;
		break;
	case MV_CONNS_TOTAL:
		*v = mi->conns_total;
		break;
	case MV_CONNS_FAILED:
		*v = mi->conns_failed;
		break;
	case MV_CONNS_REORDERED:
		*v = mi->conns_reordered;
		break;
	case MV_DURATION:
		*v = age_ms(s, mi);
		break;
	case MV_START:
		/* The monotonic start moved onto the wall clock, in ms. */
		*v = (uint64_t)(s->now_unix * 1000) - age_ms(s, mi);
		break;
	case MV_SHAPED:
		*v = mi->shaped_ms;
		break;
	case MV_CH_MAIN:
		*v = in->main;
		break;
	case MV_CH_MULTIFD:
		*v = in->multifd;
		break;
	case MV_CH_OTHER:
		*v = in->other;
		break;
	case MV_BYTES_ONLY:
		*v = in->bytes_only;
		break;
	case MV_PAGES:
		*v = in->pages;
		break;
	case MV_ZERO:
		*v = in->zero_pages;
		break;
	case MV_PACKETS:
		*v = in->packets;
		break;
	case MV_SYNCS:
		*v = in->syncs;
		break;
	case MV_PASSES:
		*v = in->passes;
		break;
	case MV_DIRTY_PAGES:
		*v = in->dirty_pages_per_pass;
		return in->dirty_known;
	case MV_DIRTY_RATE:
		*v = in->dirty_rate;
		return in->dirty_known;
	case MV_SWITCHOVER:
		*v = in->switchover;
		break;
	default:
		return false;
	}
	return true;
}

static bool port_value(int id, const struct px_port_info *p, uint64_t *v)
{
	switch (id) {
	case PV_SENT:
		*v = p->bytes_tx;
		break;
	case PV_RECV:
		*v = p->bytes_rx;
		break;
	case PV_TX1:
	case PV_TX10:
	case PV_RX1:
	case PV_RX10:
		*v = rate_of(&p->rate, id - PV_TX1);
		break;
	case PV_CONNS:
		*v = p->conns_active;
		break;
	case PV_CONNS_TOTAL:
		*v = p->conns_total;
		break;
	default:
		return false;
	}
	return true;
}

static bool conn_value(int id, const struct px_conn_info *c, uint64_t *v)
{
	switch (id) {
	case CV_SENT:
		*v = c->bytes_tx;
		break;
	case CV_RECV:
		*v = c->bytes_rx;
		break;
	case CV_SHAPED:
		*v = c->shaped_ms;
		break;
	case CV_PACING:
		*v = c->pacing;
		break;
	default:
		return false;
	}
	return true;
}

/*
 * Appends name="value" to buf, escaped as the format wants (\\, \", \n). Anything else outside
 * printable ASCII becomes '?': label values must be UTF-8, and these come from the wire.
 */
static void label(char *buf, size_t len, const char *name, const char *val)
{
	size_t n = strlen(buf);

	n += snprintf(buf + n, len - n, "%s%s=\"", n ? "," : "", name);
	for (; val && *val && n + 4 < len; val++) {
		unsigned char c = *val;

		if (c == '\\' || c == '"')
			buf[n++] = '\\', buf[n++] = c;
		else if (c == '\n')
			buf[n++] = '\\', buf[n++] = 'n';
		else
			buf[n++] = c >= 0x20 && c < 0x7f ? c : '?';
	}
	if (n + 2 <= len) {
		buf[n++] = '"';
		buf[n] = '\0';
	}
}

static void head(struct prom *p, const char *name, const char *type, const char *help)
{
	if (p->family && strcmp(p->family, name) == 0)
		return;
	p->family = name;
	fprintf(p->f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(struct prom *p, const struct metric *m, const char *labels, uint64_t v)
{
	head(p, m->name, m->type, m->help);
	fputs(m->name, p->f);
	if (*labels || m->fixed)
		fprintf(p->f, "{%s%s%s}", labels, *labels && m->fixed ? "," : "",
			m->fixed ? m->fixed : "");
	if (m->milli)
		fprintf(p->f, " %" PRIu64 ".%03" PRIu64 "\n", v / 1000, v % 1000);
	else
		fprintf(p->f, " %" PRIu64 "\n", v);
}

static const char *role_str(enum px_role r)
{
	return r == PX_ROLE_SOURCE ? "source" : "target";
}

static void mig_labels(const struct px_migration_info *mi, char *buf, size_t len)
{
	buf[0] = '\0';
	label(buf, len, "key", mi->key);
	label(buf, len, "role", role_str(mi->role));
}

static void render_node(struct prom *p, const struct ctl_metrics_snapshot *s)
{
	char labels[LABELS_MAX] = "";
	uint64_t v;

	for (size_t i = 0; i < ARRAY_SIZE(node_metrics); i++)
		if (node_value(node_metrics[i].id, s, &v))
			sample(p, &node_metrics[i], "", v);
	head(p, "vmigd_node_info", "gauge",
	     "Always 1; the labels say how the node shapes and inspects.");
	label(labels, sizeof(labels), "shaper", px_shaper_str(s->node.shaper));
	label(labels, sizeof(labels), "inspect", s->node.inspect ? "on" : "off");
	fprintf(p->f, "vmigd_node_info{%s} 1\n", labels);
}

static void render_info(struct prom *p, const struct ctl_metrics_snapshot *s)
{
	for (unsigned int i = 0; i < s->nmigs; i++) {
		const struct px_migration_info *mi = &s->migs[i];
		char labels[LABELS_MAX], ver[16] = "";

		if (mi->inspected && mi->insp.stream_version)
			snprintf(ver, sizeof(ver), "%" PRIu32, mi->insp.stream_version);
		mig_labels(mi, labels, sizeof(labels));
		label(labels, sizeof(labels), "state", mi->state);
		label(labels, sizeof(labels), "mode", mi->mode);
		label(labels, sizeof(labels), "stream", ver);
		label(labels, sizeof(labels), "machine", mi->inspected ? mi->insp.machine : "");
		head(p, "vmigd_migration_info", "gauge",
		     "Always 1; the labels describe the migration (stream: QEMU stream version).");
		fprintf(p->f, "vmigd_migration_info{%s} 1\n", labels);
	}
}

static void render_migrations(struct prom *p, const struct ctl_metrics_snapshot *s)
{
	char labels[LABELS_MAX], plabels[LABELS_MAX], port[16], conn[32];
	uint64_t v;

	render_info(p, s);
	for (size_t k = 0; k < ARRAY_SIZE(mig_metrics); k++)
		for (unsigned int i = 0; i < s->nmigs; i++) {
			mig_labels(&s->migs[i], labels, sizeof(labels));
			if (mig_value(mig_metrics[k].id, s, &s->migs[i], &v))
				sample(p, &mig_metrics[k], labels, v);
		}
	for (size_t k = 0; k < ARRAY_SIZE(port_metrics); k++)
		for (unsigned int i = 0; i < s->nmigs; i++) {
			const struct px_migration_info *mi = &s->migs[i];

			for (unsigned int j = 0; j < mi->nports; j++) {
				mig_labels(mi, plabels, sizeof(plabels));
				snprintf(port, sizeof(port), "%" PRIu32, mi->ports[j].id);
				label(plabels, sizeof(plabels), "port", port);
				if (port_value(port_metrics[k].id, &mi->ports[j], &v))
					sample(p, &port_metrics[k], plabels, v);
			}
		}
	for (size_t k = 0; k < ARRAY_SIZE(conn_metrics); k++)
		for (unsigned int i = 0; i < s->nmigs; i++) {
			const struct px_migration_info *mi = &s->migs[i];

			for (unsigned int j = 0; j < mi->nconns; j++) {
				const struct px_conn_info *c = &mi->conns[j];

				mig_labels(mi, plabels, sizeof(plabels));
				snprintf(port, sizeof(port), "%" PRIu32, c->port);
				snprintf(conn, sizeof(conn), "%" PRIu32 ".%" PRIu32, c->port,
					 c->seq);
				label(plabels, sizeof(plabels), "port", port);
				label(plabels, sizeof(plabels), "conn", conn);
				if (conn_value(conn_metrics[k].id, c, &v))
					sample(p, &conn_metrics[k], plabels, v);
			}
		}
}

/* The convergence module's figures, for the migrations it watches. */
static void render_convergence(struct prom *p, const struct ctl_metrics_snapshot *s)
{
	static const struct {
		const char *name, *type, *help;
	} fam[] = {
		{ "vmigd_convergence_actions_total", "counter",
		  "Convergence actions taken (action: raise-cap, auto-converge, post-copy, pause, "
		  "abort), including failed attempts." },
		{ "vmigd_convergence_remaining_bytes", "gauge",
		  "RAM the hypervisor still has to send." },
		{ "vmigd_convergence_total_bytes", "gauge", "The guest's RAM, as the hypervisor "
							   "counts it." },
		{ "vmigd_convergence_dirty_rate_bytes_per_second", "gauge",
		  "The dirty rate the policy last judged by (from QEMU, else the stream)." },
		{ "vmigd_convergence_throttle_percent", "gauge",
		  "The guest's CPU throttle from auto-converge." },
		{ "vmigd_convergence_dirty_syncs", "gauge",
		  "The hypervisor's dirty-bitmap syncs so far (QEMU's passes over RAM)." },
		{ "vmigd_convergence_info", "gauge",
		  "Always 1; the labels give the mode, backend and state (waiting, watching, "
		  "finished, irrecoverable)." },
	};
	char labels[LABELS_MAX], l2[LABELS_MAX];

	if (!s->conv)
		return;
	for (size_t k = 0; k < ARRAY_SIZE(fam); k++)
		for (unsigned int i = 0; i < s->nmigs; i++) {
			const struct cv_report *r = &s->conv[i];
			uint64_t v[] = { 0,
					 r->job.remaining,
					 r->job.total,
					 r->dirty_rate,
					 r->job.throttle_pct,
					 r->job.dirty_syncs };

			if (!r->backend)
				continue;
			mig_labels(&s->migs[i], labels, sizeof(labels));
			head(p, fam[k].name, fam[k].type, fam[k].help);
			if (k == 0) {
				for (unsigned int a = CV_ACT_RAISE_CAP; a <= CV_ACT_ABORT; a++) {
					snprintf(l2, sizeof(l2), "%s", labels);
					label(l2, sizeof(l2), "action", cv_act_str(a));
					fprintf(p->f, "%s{%s} %u\n", fam[k].name, l2, r->counts[a]);
				}
			} else if (k < ARRAY_SIZE(fam) - 1) {
				if (r->have_job)
					fprintf(p->f, "%s{%s} %" PRIu64 "\n", fam[k].name, labels,
						v[k]);
			} else {
				label(labels, sizeof(labels), "mode", cv_mode_str(r->mode));
				label(labels, sizeof(labels), "backend", r->backend);
				label(labels, sizeof(labels), "state",
				      r->irrecoverable ? "irrecoverable"
				      : r->finished    ? "finished"
				      : r->stopped     ? "stopped"
				      : r->elapsed_ms < 0 ? "waiting"
							  : "watching");
				fprintf(p->f, "%s{%s} 1\n", fam[k].name, labels);
			}
		}
}

int ctl_metrics_render(const struct ctl_metrics_snapshot *s, char **ret, size_t *len)
{
	struct prom p = { 0 };
	char *buf = NULL;
	size_t n = 0;
	int bad;

	p.f = open_memstream(&buf, &n);
	if (!p.f)
		return -ENOMEM;
	render_node(&p, s);
	render_migrations(&p, s);
	render_convergence(&p, s);
	bad = ferror(p.f);
	if (fclose(p.f) != 0 || bad) {
		free(buf);
		return -ENOMEM;
	}
	*ret = buf;
	*len = n;
	return 0;
}

/* ---- HTTP ---- */

struct ctl_metrics_server {
	struct xp_loop *loop;
	struct px_node *node;
	struct cv_set *conv;
	struct MHD_Daemon *d;
	struct xp_watch *w;
	struct xp_timer *t;
	char addr[64];
	char *err; /* while starting: where libmicrohttpd's complaint goes */
	size_t errlen;
};

static void mhd_log(void *arg, const char *fmt, va_list ap)
{
	struct ctl_metrics_server *s = arg;
	char line[256];
	size_t n;

	vsnprintf(line, sizeof(line), fmt, ap);
	n = strcspn(line, "\r\n");
	line[n] = '\0';
	if (s->err && n)
		snprintf(s->err, s->errlen, "libmicrohttpd: %s", line);
	else
		log_debug("metrics: %s", line);
}

static enum MHD_Result reply_static(struct MHD_Connection *c, unsigned int status, const char *body)
{
	struct MHD_Response *r =
		MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
	enum MHD_Result ret;

	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

/* Called from MHD_run(), so on the control loop's thread: px_node may be read. */
static enum MHD_Result on_request(void *arg, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	struct ctl_metrics_server *s = arg;
	struct ctl_metrics_snapshot *snap;
	struct MHD_Response *r;
	enum MHD_Result ret;
	char *body;
	size_t len;
	int e;

	/*
	 * The first call has the headers only. Answering then would make MHD close the connection
	 * (it cannot know what follows), so wait for the end of the request, discarding any body.
	 */
	if (!*con_cls) {
		*con_cls = s;
		return MHD_YES;
	}
	if (*upload_size) {
		*upload_size = 0;
		return MHD_YES;
	}
	/* HEAD is GET without the body (MHD drops it), as HTTP requires of a server. */
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
		return reply_static(c, MHD_HTTP_METHOD_NOT_ALLOWED, "use GET /metrics\n");
	if (strcmp(url, "/metrics") != 0)
		return reply_static(c, MHD_HTTP_NOT_FOUND, "not found; metrics are at /metrics\n");
	e = ctl_metrics_snapshot_take(s->node, s->conv, &snap);
	if (e == 0) {
		e = ctl_metrics_render(snap, &body, &len);
		ctl_metrics_snapshot_free(snap);
	}
	if (e < 0)
		return reply_static(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
	/* MHD frees body with the response. */
	r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, CTL_METRICS_CONTENT_TYPE);
	ret = MHD_queue_response(c, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

static void on_timer(void *arg);

/* MHD must run again within its timeout even when no fd is ready (idle connections expire). */
static void run(struct ctl_metrics_server *s)
{
	MHD_UNSIGNED_LONG_LONG ms;

	MHD_run(s->d);
	xp_timer_del(s->t);
	s->t = NULL;
	if (MHD_get_timeout(s->d, &ms) == MHD_YES &&
	    xp_timer_add(s->loop, vm_now_ms() + ms, on_timer, s, &s->t) < 0)
		log_warn("metrics: cannot arm a timer; idle HTTP connections may linger");
}

static void on_timer(void *arg)
{
	struct ctl_metrics_server *s = arg;

	s->t = NULL; /* freed before we were called */
	run(s);
}

static void on_ready(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	run(arg);
}

int ctl_metrics_server_new(struct xp_loop *loop, struct px_node *n, struct cv_set *conv,
			   const struct xp_addr *addr, struct ctl_metrics_server **ret, char *err,
			   size_t errlen)
{
	struct ctl_metrics_server *s;
	const union MHD_DaemonInfo *info;
	struct xp_addr bound;
	char where[64];
	int fd, r;

	if (xp_addr_format(addr, where, sizeof(where)) < 0)
		snprintf(where, sizeof(where), "the address given");
	if (!MHD_is_feature_supported(MHD_FEATURE_EPOLL)) {
		snprintf(err, errlen, "this libmicrohttpd has no epoll support");
		return -EOPNOTSUPP;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->loop = loop;
	s->node = n;
	s->conv = conv;
	r = xp_tcp_listen(addr, 16, &fd, &bound);
	if (r < 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", where, strerror(-r));
		goto free_s;
	}
	xp_addr_format(&bound, s->addr, sizeof(s->addr));
	s->err = err;
	s->errlen = errlen;
	snprintf(err, errlen, "libmicrohttpd would not start on %s", s->addr);
	/* No thread of its own: MHD_run() from the loop, through MHD's epoll fd. From here on the
	 * listen socket is MHD's, which closes it in MHD_stop_daemon(). */
	s->d = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, s,
				MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_LISTEN_SOCKET,
				fd, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HTTP_CONN_LIMIT,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)HTTP_IDLE_TIMEOUT,
				MHD_OPTION_END);
	s->err = NULL;
	if (!s->d) {
		/* Whether MHD closed fd on this path differs between versions; vmigd exits now. */
		r = -EIO;
		goto free_s;
	}
	info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD);
	if (!info) {
		snprintf(err, errlen, "libmicrohttpd gave no epoll fd");
		r = -EIO;
		goto stop_mhd;
	}
	r = xp_watch_add(loop, info->epoll_fd, EPOLLIN, on_ready, s, &s->w);
	if (r < 0) {
		snprintf(err, errlen, "cannot watch the HTTP server: %s", strerror(-r));
		goto stop_mhd;
	}
	run(s);
	*ret = s;
	return 0;

stop_mhd:
	MHD_stop_daemon(s->d);
free_s:
	free(s);
	return r;
}

void ctl_metrics_server_free(struct ctl_metrics_server *s)
{
	if (!s)
		return;
	xp_watch_del(s->w);
	xp_timer_del(s->t);
	MHD_stop_daemon(s->d);
	free(s);
}

const char *ctl_metrics_server_addr(const struct ctl_metrics_server *s)
{
	return s->addr;
}
