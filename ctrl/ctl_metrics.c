// SPDX-License-Identifier: Apache-2.0
/* Prometheus metrics: snapshot, text rendering of the figure tables (ctl_figures.c; doc/
 * interfaces.md lists the names) and the libmicrohttpd endpoint, run without a thread of its own
 * from the control loop, where px_node may be read. Not a general HTTP server: GET /metrics, and
 * /healthz and /readyz for probes. */
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ctl_metrics.h"
#include "ctl_process.h"
#include "ctl_report.h"
#include "log.h"
#include "util.h"

/*
 * A scrape is a handful of connections; more are refused, idle ones dropped. The idle timeout
 * restarts on every byte, so a request (from accept, or from the end of the one before on a
 * kept-alive connection, to its response sent) also has a deadline: a client that dribbles a
 * byte now and then holds a slot for that long at most. And one address holds at most
 * HTTP_PER_ADDR_LIMIT slots, so it cannot take them all.
 */
#define HTTP_CONN_LIMIT		 32
#define HTTP_PER_ADDR_LIMIT	 8
#define HTTP_IDLE_TIMEOUT	 10 /* seconds */
#define HTTP_REQUEST_DEADLINE_MS 10000
#define LABELS_MAX		 1024

/* ---- snapshot ---- */

struct take {
	struct ctl_metrics_snapshot *s;
	struct ctl_nic *nic;
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
	if (t->nic) {
		struct ctl_nic_view *v = realloc(t->s->nics, t->cap * sizeof(*v));

		if (!v) {
			t->err = -ENOMEM;
			return;
		}
		t->s->nics = v;
		if (!ctl_nic_migration(t->nic, mi, &v[t->s->nmigs]))
			memset(&v[t->s->nmigs], 0, sizeof(*v));
	}
	c = &t->s->migs[t->s->nmigs++];
	*c = *mi;
	/* Nothing lent survives the callback: pointers are copies or NULL from here on. */
	c->key = c->peer = c->peer_host = c->state = c->error = c->mode = NULL;
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
	free(s->nics);
	free(s->conv);
	free(s);
}

int ctl_metrics_snapshot_take(struct px_node *n, struct cv_set *conv, struct ctl_nic *nic,
			      struct ctl_metrics_snapshot **ret)
{
	struct take t = { .nic = nic };
	struct timespec ts;

	t.s = calloc(1, sizeof(*t.s));
	if (!t.s)
		return -ENOMEM;
	clock_gettime(CLOCK_REALTIME, &ts);
	t.s->now_ms = vm_now_ms();
	t.s->now_unix = ts.tv_sec + ts.tv_nsec / 1e9;
	/*
	 * The migrations first: their live counters keep growing, and the node's, read after them,
	 * then holds at least what they showed (a scrape never has a node below its migrations).
	 */
	px_node_foreach(n, take_one, &t);
	px_node_info(n, &t.s->node);
	ctl_process_read(&t.s->proc);
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
 * The families are the figure tables' (ctl_figures.c), in table order; a family's members (its
 * fixed labels: direction and window, kind) sit next to each other there, so each family's samples
 * form one group under one HELP and TYPE. The info metrics, whose labels describe a thing rather
 * than count it, are lists of labels here (vmigd_node_info, vmigd_migration_info,
 * vmigd_migration_nic_info and vmigd_convergence_info), each label a figure of the tables.
 */
struct prom {
	FILE *f;
	const char *family; /* the last one whose HELP and TYPE were written */
	struct ctl_env env;
};

/* Which objects a table's samples are about, each with its own labels. */
enum objs {
	OBJS_NODE,
	OBJS_PROCESS,
	OBJS_MIGRATION,
	OBJS_INSPECT,
	OBJS_PORT,
	OBJS_CONN,
	OBJS_CONV,
	OBJS_NIC
};

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

/* Milliseconds as seconds, "1.500": the base unit Prometheus wants, without rounding. */
static void milli(FILE *f, uint64_t v)
{
	fprintf(f, "%" PRIu64 ".%03" PRIu64 "\n", v / 1000, v % 1000);
}

static void sample(struct prom *p, const struct ctl_fig *fig, const char *labels,
		   const struct ctl_value *v)
{
	const struct ctl_prom *m = &fig->prom;
	bool ms = fig->unit == CTL_MS || fig->unit == CTL_SECONDS;
	char fixed[LABELS_MAX] = "";

	if (m->labels)
		snprintf(fixed, sizeof(fixed), "%s", m->labels);
	if (m->label && v->name)
		label(fixed, sizeof(fixed), m->label, v->name);
	head(p, m->name, m->type, m->help);
	fputs(m->name, p->f);
	if (*labels || *fixed)
		fprintf(p->f, "{%s%s%s}", labels, *labels && *fixed ? "," : "", fixed);
	fputc(' ', p->f);
	if (v->kind == CTL_V_BOOL)
		fprintf(p->f, "%d\n", v->b);
	else if (m->percent)
		fprintf(p->f, "%.2f\n",
			(v->kind == CTL_V_I64 ? (double)v->i : (double)v->u) / 100.0);
	else if (v->kind == CTL_V_I64 && v->i < 0)
		fprintf(p->f, "%" PRId64 "\n", v->i); /* no exported figure is negative yet */
	else if (ms)
		milli(p->f, v->kind == CTL_V_I64 ? (uint64_t)v->i : v->u);
	else
		fprintf(p->f, "%" PRIu64 "\n", v->kind == CTL_V_I64 ? (uint64_t)v->i : v->u);
}

/* One figure of one object: no sample where its condition does not hold. */
static void emit(struct prom *p, const struct ctl_fig *f, const void *obj, const char *labels)
{
	struct ctl_value v;

	if (!ctl_fig_present(f, obj))
		return;
	for (unsigned int i = 0; i < ctl_fig_count(f); i++) {
		ctl_fig_read(f, obj, &p->env, i, &v);
		sample(p, f, labels, &v);
	}
}

static void mig_labels(const struct px_migration_info *mi, char *buf, size_t len)
{
	buf[0] = '\0';
	label(buf, len, "key", mi->key);
	label(buf, len, "role", px_role_str(mi->role));
}

/* One figure of every object of a kind, in the order of the snapshot. */
static void walk(struct prom *p, const struct ctl_metrics_snapshot *s, enum objs k,
		 const struct ctl_fig *f)
{
	char labels[LABELS_MAX], plabels[LABELS_MAX], port[16], conn[32];

	if (k == OBJS_NODE || k == OBJS_PROCESS) {
		emit(p, f, k == OBJS_NODE ? (const void *)&s->node : &s->proc, "");
		return;
	}
	for (unsigned int i = 0; i < s->nmigs; i++) {
		const struct px_migration_info *mi = &s->migs[i];

		mig_labels(mi, labels, sizeof(labels));
		switch (k) {
		case OBJS_MIGRATION:
			emit(p, f, mi, labels);
			break;
		case OBJS_INSPECT:
			if (mi->inspected)
				emit(p, f, &mi->insp, labels);
			break;
		case OBJS_CONV:
			if (s->conv && s->conv[i].backend)
				emit(p, f, &s->conv[i], labels);
			break;
		case OBJS_NIC:
			if (s->nics && s->nics[i].nic.ifindex)
				emit(p, f, &s->nics[i], labels);
			break;
		case OBJS_PORT:
			for (unsigned int j = 0; j < mi->nports; j++) {
				snprintf(plabels, sizeof(plabels), "%s", labels);
				snprintf(port, sizeof(port), "%" PRIu32, mi->ports[j].id);
				label(plabels, sizeof(plabels), "port", port);
				emit(p, f, &mi->ports[j], plabels);
			}
			break;
		case OBJS_CONN:
			for (unsigned int j = 0; j < mi->nconns; j++) {
				const struct px_conn_info *c = &mi->conns[j];

				snprintf(plabels, sizeof(plabels), "%s", labels);
				snprintf(port, sizeof(port), "%" PRIu32, c->port);
				snprintf(conn, sizeof(conn), "%" PRIu32 ".%" PRIu32, c->port,
					 c->seq);
				label(plabels, sizeof(plabels), "port", port);
				label(plabels, sizeof(plabels), "conn", conn);
				emit(p, f, c, plabels);
			}
			break;
		case OBJS_NODE:
		case OBJS_PROCESS:
			break;
		}
	}
}

/* Every exported figure of a table: a family's samples, object by object, then the next. */
static void render_table(struct prom *p, const struct ctl_metrics_snapshot *s,
			 const struct ctl_table *t, enum objs k)
{
	for (size_t n = 0; n < t->n; n++) {
		const struct ctl_prom *m = &t->figs[n].prom;

		if (!m->name)
			continue;
		/* Every family from start-up, with or without samples. */
		head(p, m->name, m->type, m->help);
		walk(p, s, k, &t->figs[n]);
	}
}

/*
 * The info families: their labels are figures of the tables, read as JSON reads them (a bool as
 * "true"/"false" unless yes_no gives its two words, a count in decimal, nothing as ""). Whether a
 * figure is present does not matter here: an info sample always has all its labels.
 */
struct info_label {
	const char *label;
	const struct ctl_table *t;
	const char *key;
	const char *yes_no[2];
	bool zero_empty; /* a count of 0 reads as "" (not known yet) */
};

static void info_label(struct prom *p, char *buf, size_t len, const struct info_label *l,
		       const void *obj)
{
	const struct ctl_fig *f = obj ? ctl_fig_find(l->t, l->key) : NULL;
	struct ctl_value v = { .kind = CTL_V_NULL };
	char num[24] = "";
	const char *s = "";

	if (f)
		ctl_fig_read(f, obj, &p->env, 0, &v);
	if (v.kind == CTL_V_STR)
		s = v.s;
	else if (v.kind == CTL_V_BOOL)
		s = l->yes_no[0] ? l->yes_no[!v.b] : v.b ? "true" : "false";
	else if (v.kind == CTL_V_U64 && !(l->zero_empty && !v.u))
		snprintf(num, sizeof(num), "%" PRIu64, v.u);
	else if (v.kind == CTL_V_I64 && !(l->zero_empty && !v.i))
		snprintf(num, sizeof(num), "%" PRId64, v.i);
	label(buf, len, l->label, num[0] ? num : s);
}

static const struct info_label node_info_labels[] = {
	{ .label = "shaper", .t = &ctl_node_table, .key = "shaper" },
	{ .label = "inspect", .t = &ctl_node_table, .key = "inspect", .yes_no = { "on", "off" } },
};

/* Where the migration's own figures end and its stream's ("stream", "machine") begin. */
#define MIG_INFO_OWN 2
static const struct info_label migration_info_labels[] = {
	{ .label = "state", .t = &ctl_migration_table, .key = "state" },
	{ .label = "mode", .t = &ctl_migration_table, .key = "mode" },
	{ .label = "stream",
	  .t = &ctl_insp_summary_table,
	  .key = "stream_version",
	  .zero_empty = true },
	{ .label = "machine", .t = &ctl_insp_summary_table, .key = "machine" },
};

static const struct info_label nic_info_labels[] = {
	{ .label = "interface", .t = &ctl_nic_table, .key = "interface" },
	{ .label = "kind", .t = &ctl_nic_table, .key = "kind" },
	{ .label = "driver", .t = &ctl_nic_table, .key = "driver" },
	{ .label = "device", .t = &ctl_nic_table, .key = "device" },
	{ .label = "vf", .t = &ctl_nic_table, .key = "vf" },
	{ .label = "pf", .t = &ctl_nic_table, .key = "pf" },
	{ .label = "numa_node", .t = &ctl_nic_table, .key = "numa_node" },
};

static const struct info_label conv_info_labels[] = {
	{ .label = "mode", .t = &ctl_conv_table, .key = "mode" },
	{ .label = "backend", .t = &ctl_conv_table, .key = "backend" },
	{ .label = "state", .t = &ctl_conv_table, .key = "state" },
};

/* One info sample: base labels (the object's), then ls read from obj (insp: from the stream's). */
static void info_sample(struct prom *p, const char *family, const char *help, const char *base,
			const struct info_label *ls, size_t n, const void *obj, size_t own,
			const void *insp)
{
	char labels[LABELS_MAX];

	snprintf(labels, sizeof(labels), "%s", base);
	for (size_t i = 0; i < n; i++)
		info_label(p, labels, sizeof(labels), &ls[i], i < own ? obj : insp);
	head(p, family, "gauge", help);
	fprintf(p->f, "%s{%s} 1\n", family, labels);
}

#define MIGRATION_INFO_HELP                                                                        \
	"Always 1; the labels describe the migration (stream: QEMU stream version)."
#define NIC_INFO_HELP                                                                              \
	"Always 1; the labels describe the interface that carries the migration's node hop "       \
	"(device: its bus address; numa_node -1: none)."
#define CONV_INFO_HELP                                                                             \
	"Always 1; the labels give the mode, backend and state (waiting, watching, finished, "     \
	"stopped, irrecoverable)."

static void render_node_info(struct prom *p, const struct ctl_metrics_snapshot *s)
{
	info_sample(p, "vmigd_node_info",
		    "Always 1; the labels say how the node shapes and inspects.", "",
		    node_info_labels, ARRAY_SIZE(node_info_labels), &s->node,
		    ARRAY_SIZE(node_info_labels), NULL);
}

static void render_migration_info(struct prom *p, const struct ctl_metrics_snapshot *s)
{
	char labels[LABELS_MAX];

	head(p, "vmigd_migration_info", "gauge", MIGRATION_INFO_HELP);
	for (unsigned int i = 0; i < s->nmigs; i++) {
		const struct px_migration_info *mi = &s->migs[i];

		mig_labels(mi, labels, sizeof(labels));
		info_sample(p, "vmigd_migration_info", MIGRATION_INFO_HELP, labels,
			    migration_info_labels, ARRAY_SIZE(migration_info_labels), mi,
			    MIG_INFO_OWN, mi->inspected ? &mi->insp : NULL);
	}
}

static void render_nic_info(struct prom *p, const struct ctl_metrics_snapshot *s)
{
	char labels[LABELS_MAX];

	head(p, "vmigd_migration_nic_info", "gauge", NIC_INFO_HELP);
	for (unsigned int i = 0; s->nics && i < s->nmigs; i++) {
		if (!s->nics[i].nic.ifindex)
			continue;
		mig_labels(&s->migs[i], labels, sizeof(labels));
		info_sample(p, "vmigd_migration_nic_info", NIC_INFO_HELP, labels, nic_info_labels,
			    ARRAY_SIZE(nic_info_labels), &s->nics[i], ARRAY_SIZE(nic_info_labels),
			    NULL);
	}
}

static void render_convergence_info(struct prom *p, const struct ctl_metrics_snapshot *s)
{
	char labels[LABELS_MAX];

	head(p, "vmigd_convergence_info", "gauge", CONV_INFO_HELP);
	for (unsigned int i = 0; s->conv && i < s->nmigs; i++) {
		if (!s->conv[i].backend)
			continue;
		mig_labels(&s->migs[i], labels, sizeof(labels));
		info_sample(p, "vmigd_convergence_info", CONV_INFO_HELP, labels, conv_info_labels,
			    ARRAY_SIZE(conv_info_labels), &s->conv[i], ARRAY_SIZE(conv_info_labels),
			    NULL);
	}
}

static const struct info_label build_info_labels[] = {
	{ .label = "version", .t = &ctl_process_table, .key = "version" },
	{ .label = "features", .t = &ctl_process_table, .key = "features" },
};

static void render_build_info(struct prom *p, const struct ctl_metrics_snapshot *s)
{
	info_sample(p, "vmigd_build_info",
		    "Always 1; the labels give vmigd's version and the features it was built with.",
		    "", build_info_labels, ARRAY_SIZE(build_info_labels), &s->proc,
		    ARRAY_SIZE(build_info_labels), NULL);
}

int ctl_metrics_render(const struct ctl_metrics_snapshot *s, char **ret, size_t *len)
{
	struct prom p = { .env = { .now_ms = s->now_ms, .now_unix = s->now_unix } };
	char *buf = NULL;
	size_t n = 0;
	int bad;

	p.f = open_memstream(&buf, &n);
	if (!p.f)
		return -ENOMEM;
	render_table(&p, s, &ctl_node_table, OBJS_NODE);
	render_node_info(&p, s);
	render_migration_info(&p, s);
	render_table(&p, s, &ctl_migration_table, OBJS_MIGRATION);
	render_table(&p, s, &ctl_insp_summary_table, OBJS_INSPECT);
	render_table(&p, s, &ctl_port_table, OBJS_PORT);
	render_table(&p, s, &ctl_conn_table, OBJS_CONN);
	render_table(&p, s, &ctl_conv_table, OBJS_CONV);
	render_convergence_info(&p, s);
	render_nic_info(&p, s);
	render_table(&p, s, &ctl_nic_table, OBJS_NIC);
	render_build_info(&p, s);
	render_table(&p, s, &ctl_process_table, OBJS_PROCESS);
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
	struct ctl_nic *nic;
	struct MHD_Daemon *d;
	struct xp_watch *w;
	struct xp_timer *t;
	char addr[64];
	char *err; /* while starting: where libmicrohttpd's complaint goes */
	size_t errlen;
	struct http_conn *conns; /* every connection MHD holds, oldest last */
	struct vm_log_limit refusals;
	bool want_dpdk; /* --dpdk: not ready without the DPDK node hop */
};

/*
 * One TCP connection, from MHD's NOTIFY_CONNECTION STARTED to CLOSED; it is the connection's
 * socket context, owned by us and freed at CLOSED. fd stays MHD's.
 */
struct http_conn {
	int fd;
	bool shut; /* past its deadline: shut down, MHD closes it on its next run */
	uint64_t deadline_ms;
	struct xp_addr peer;
	struct http_conn *prev, *next;
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

/* The address part only: a client's connections from different ports count together. */
static bool same_host(const struct sockaddr *a, const struct sockaddr *b)
{
	if (a->sa_family != b->sa_family)
		return false;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->sa_family == AF_INET6)
		return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			       &((const struct sockaddr_in6 *)b)->sin6_addr,
			       sizeof(struct in6_addr));
	return false;
}

static void host_str(const struct sockaddr *sa, socklen_t len, char *buf, size_t buflen)
{
	struct xp_addr a = { .len = len };

	if (len <= sizeof(a.ss)) {
		memcpy(&a.ss, sa, len);
		if (xp_addr_host(&a, buf, buflen) == 0)
			return;
	}
	snprintf(buf, buflen, "an unknown address");
}

/* MHD's accept policy: called once a connection is accepted, before MHD takes it on. */
static enum MHD_Result on_accept(void *arg, const struct sockaddr *addr, socklen_t addrlen)
{
	struct ctl_metrics_server *s = arg;
	unsigned int n = 0;
	char host[64];

	for (struct http_conn *h = s->conns; h; h = h->next)
		if (same_host((const struct sockaddr *)&h->peer.ss, addr))
			n++;
	if (n < HTTP_PER_ADDR_LIMIT)
		return MHD_YES;
	host_str(addr, addrlen, host, sizeof(host));
	vm_log_limited(&s->refusals, vm_now_ms(), VM_LOG_WARN,
		       "metrics: a connection from %s refused: it has %u open (at most %u from "
		       "one address)",
		       host, n, HTTP_PER_ADDR_LIMIT);
	return MHD_NO;
}

static void on_connection(void *arg, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode toe)
{
	struct ctl_metrics_server *s = arg;
	struct http_conn *h = *socket_context;
	const union MHD_ConnectionInfo *fd, *peer;

	if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (!h)
			return;
		if (h->prev)
			h->prev->next = h->next;
		else
			s->conns = h->next;
		if (h->next)
			h->next->prev = h->prev;
		free(h);
		*socket_context = NULL;
		return;
	}
	if (toe != MHD_CONNECTION_NOTIFY_STARTED)
		return;
	fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	peer = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	h = calloc(1, sizeof(*h));
	if (!h || !fd || !peer) {
		/* Untracked, it would have no deadline: end it at once (MHD sees the shutdown). */
		free(h);
		if (fd)
			(void)shutdown(fd->connect_fd, SHUT_RDWR);
		return;
	}
	h->fd = fd->connect_fd;
	h->deadline_ms = vm_now_ms() + HTTP_REQUEST_DEADLINE_MS;
	if (peer->client_addr->sa_family == AF_INET6) {
		h->peer.len = sizeof(struct sockaddr_in6);
		memcpy(&h->peer.ss, peer->client_addr, h->peer.len);
	} else if (peer->client_addr->sa_family == AF_INET) {
		h->peer.len = sizeof(struct sockaddr_in);
		memcpy(&h->peer.ss, peer->client_addr, h->peer.len);
	}
	h->next = s->conns;
	if (s->conns)
		s->conns->prev = h;
	s->conns = h;
	*socket_context = h;
}

/* A request ended (its response sent, or the connection gone): the next one has its own time. */
static void on_completed(void *arg, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	const union MHD_ConnectionInfo *info =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct http_conn *h = info ? info->socket_context : NULL;

	if (h && !h->shut)
		h->deadline_ms = vm_now_ms() + HTTP_REQUEST_DEADLINE_MS;
}

/*
 * Shuts down each connection past its deadline: MHD cannot be told to close one outside its
 * request handler, which a dribbling client never reaches, but it reads the end of stream and
 * closes it itself. The earliest deadline still to come, or 0.
 */
static uint64_t expire(struct ctl_metrics_server *s)
{
	uint64_t now = vm_now_ms(), next = 0;
	char host[64];

	for (struct http_conn *h = s->conns; h; h = h->next) {
		if (h->shut)
			continue;
		if (h->deadline_ms > now) {
			if (!next || h->deadline_ms < next)
				next = h->deadline_ms;
			continue;
		}
		h->shut = true;
		host_str((const struct sockaddr *)&h->peer.ss, h->peer.len, host, sizeof(host));
		vm_log_limited(&s->refusals, now, VM_LOG_WARN,
			       "metrics: a connection from %s closed: no request answered within "
			       "%u ms",
			       host, HTTP_REQUEST_DEADLINE_MS);
		(void)shutdown(h->fd, SHUT_RDWR);
	}
	return next;
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

static enum MHD_Result reply_ready(struct ctl_metrics_server *s, struct MHD_Connection *c)
{
	struct px_node_info ni;
	struct timespec ts;
	char why[1024];
	struct MHD_Response *r;
	enum MHD_Result ret;
	int n;

	clock_gettime(CLOCK_REALTIME, &ts);
	px_node_info(s->node, &ni);
	n = ctl_metrics_ready(&ni, px_node_listening(s->node), s->want_dpdk, (double)ts.tv_sec, why,
			      sizeof(why));
	if (!n)
		return reply_static(c, MHD_HTTP_OK, "ready\n");
	r = MHD_create_response_from_buffer(strlen(why), why, MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
	ret = MHD_queue_response(c, MHD_HTTP_SERVICE_UNAVAILABLE, r);
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
	/* Answering at all is the health: this runs on the control loop's thread. */
	if (strcmp(url, "/healthz") == 0)
		return reply_static(c, MHD_HTTP_OK, "ok\n");
	if (strcmp(url, "/readyz") == 0)
		return reply_ready(s, c);
	if (strcmp(url, "/metrics") != 0)
		return reply_static(c, MHD_HTTP_NOT_FOUND,
				    "not found; metrics are at /metrics, health at /healthz and "
				    "/readyz\n");
	e = ctl_metrics_snapshot_take(s->node, s->conv, s->nic, &snap);
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

/*
 * MHD must run again within its timeout even when no fd is ready (idle connections expire), and
 * we at the next request deadline.
 */
static void run(struct ctl_metrics_server *s)
{
	MHD_UNSIGNED_LONG_LONG ms;
	uint64_t at;

	/*
	 * Twice: at HTTP_CONN_LIMIT connections MHD takes the listen socket out of its epoll set,
	 * and puts it back at the start of a run, but only a run that follows the one in which
	 * connections closed. Nothing would call that run once the last connection was gone: the
	 * endpoint stopped accepting for good (libmicrohttpd 0.9.75; test_hostile.py).
	 */
	expire(s);
	MHD_run(s->d);
	MHD_run(s->d);
	xp_timer_del(s->t);
	s->t = NULL;
	vm_log_limit_flush(&s->refusals, vm_now_ms());
	at = expire(s);
	if (MHD_get_timeout(s->d, &ms) == MHD_YES && (!at || vm_now_ms() + ms < at))
		at = vm_now_ms() + ms;
	if (at && xp_timer_add(s->loop, at, on_timer, s, &s->t) < 0)
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

/* On addr, or on adopt_fd (>= 0) when handed over. */
static int server_start(struct xp_loop *loop, struct px_node *n, struct cv_set *conv,
			struct ctl_nic *nic, const struct xp_addr *addr, int adopt_fd,
			struct ctl_metrics_server **ret, char *err, size_t errlen)
{
	struct ctl_metrics_server *s;
	const union MHD_DaemonInfo *info;
	struct xp_addr bound;
	char where[64];
	int fd, r;

	if (!addr || xp_addr_format(addr, where, sizeof(where)) < 0)
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
	s->nic = nic;
	s->refusals.what = "lines about refused or expired metrics connections";
	if (adopt_fd >= 0) {
		fd = adopt_fd;
		r = xp_tcp_adopt(fd, &bound);
		if (r < 0) {
			snprintf(err, errlen, "the metrics listener handed over is not one: %s",
				 strerror(-r));
			goto free_s;
		}
	} else {
		r = xp_tcp_listen(addr, 16, &fd, &bound);
		if (r < 0) {
			snprintf(err, errlen, "cannot listen on %s: %s", where, strerror(-r));
			goto free_s;
		}
	}
	xp_addr_format(&bound, s->addr, sizeof(s->addr));
	s->err = err;
	s->errlen = errlen;
	snprintf(err, errlen, "libmicrohttpd would not start on %s", s->addr);
	/* No thread of its own: MHD_run() from the loop, through MHD's epoll fd. From here on the
	 * listen socket is MHD's, which closes it in MHD_stop_daemon(). */
	s->d = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, on_accept, s, on_request, s,
				MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_LISTEN_SOCKET,
				fd, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HTTP_CONN_LIMIT,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)HTTP_IDLE_TIMEOUT,
				MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
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

int ctl_metrics_server_new(struct xp_loop *loop, struct px_node *n, struct cv_set *conv,
			   struct ctl_nic *nic, const struct xp_addr *addr,
			   struct ctl_metrics_server **ret, char *err, size_t errlen)
{
	return server_start(loop, n, conv, nic, addr, -1, ret, err, errlen);
}

int ctl_metrics_server_adopt(struct xp_loop *loop, struct px_node *n, struct cv_set *conv,
			     struct ctl_nic *nic, int fd, struct ctl_metrics_server **ret,
			     char *err, size_t errlen)
{
	return server_start(loop, n, conv, nic, NULL, fd, ret, err, errlen);
}

int ctl_metrics_server_fd(const struct ctl_metrics_server *s)
{
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_LISTEN_FD);

	return info ? info->listen_fd : -1;
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

void ctl_metrics_server_want_dpdk(struct ctl_metrics_server *s, bool on)
{
	s->want_dpdk = on;
}

const char *ctl_metrics_server_addr(const struct ctl_metrics_server *s)
{
	return s->addr;
}
