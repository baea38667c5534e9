/* SPDX-License-Identifier: Apache-2.0 */
/* Every figure vmigd reports, declared once: one table per kind of object. The JSON replies
 * (ctl_report.c), the Prometheus text (ctl_metrics.c) and vmigctl's text all walk these tables.
 * Types and data only: vmigctl links ctl_figures.c without the daemon. */
#ifndef CTL_FIGURES_H
#define CTL_FIGURES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctl_nic.h"
#include "cv_watch.h"
#include "px_node.h"

/* What a figure measures: it decides its JSON type and how Prometheus and vmigctl show it. */
enum ctl_unit {
	CTL_BYTES,   /* integer; vmigctl "1.5 GiB" */
	CTL_RATE,    /* bytes/s measured, integer; "52.4 MiB/s", "0 B/s" */
	CTL_CAP,     /* bytes/s allowed, integer, 0: none; "64.0 MiB/s", "unlimited" */
	CTL_COUNT,   /* integer, -1 where unknown; "-" then */
	CTL_MS,	     /* integer milliseconds (a key ending in _ms); Prometheus seconds, "1.500" */
	CTL_SECONDS, /* read as milliseconds; JSON seconds ("10.000"), Prometheus the same */
	CTL_BOOL,    /* JSON true/false, Prometheus 1/0 */
	CTL_STR,     /* JSON string; never a Prometheus sample */
};

/* How a figure's value is read from its object. */
enum ctl_ctype {
	CTL_C_NONE,
	CTL_C_U64, /* a member of this C type at .off */
	CTL_C_I64,
	CTL_C_UINT,
	CTL_C_INT,
	CTL_C_BOOL,
	CTL_C_STR,    /* const char *; NULL reads as .dflt (or absent) */
	CTL_C_CHARS,  /* char[]; "" counts as absent for a condition */
	CTL_C_ENUM,   /* an enum member, named by .names */
	CTL_C_COUNTS, /* unsigned int[]: a vector, [.first] to [.last], named by .names */
	CTL_C_CALC,   /* computed by .calc */
};

/* The member's C type, found by the compiler; a type not listed here does not compile. */
#define CTL_CTYPE(x)                                                                               \
	_Generic((x),                                                                              \
		uint64_t: CTL_C_U64,                                                               \
		int64_t: CTL_C_I64,                                                                \
		unsigned int: CTL_C_UINT,                                                          \
		int: CTL_C_INT,                                                                    \
		bool: CTL_C_BOOL,                                                                  \
		const char *: CTL_C_STR,                                                           \
		char *: CTL_C_CHARS)
/* How a row reads member m of struct T: its C type and its offset (.get, .when). */
#define CTL_MEMBER(T, m) { .type = CTL_CTYPE(((T *)0)->m), .off = offsetof(T, m) }

/* Enums whose value names the daemon's own functions give (ctl_report.c), so that this file
 * does not call them. */
enum ctl_names {
	CTL_N_NONE,
	CTL_N_ROLE,	   /* enum px_role: "source", "target" */
	CTL_N_SHAPER,	   /* px_shaper_str() */
	CTL_N_INSP_KIND,   /* px_insp_kind_str() */
	CTL_N_CV_MODE,	   /* cv_mode_str() */
	CTL_N_CV_STATUS,   /* cv_status_str() */
	CTL_N_CV_ACT,	   /* cv_act_str() */
	CTL_N_OUTCOME,	   /* px_outcome_str() */
	CTL_N_TLS_REFUSAL, /* px_tls_refusal_str() */
};

/* The moment a report is taken: what durations and Unix times count from. */
struct ctl_env {
	uint64_t now_ms; /* vm_now_ms() */
	double now_unix; /* CLOCK_REALTIME at the same moment, seconds */
};

enum ctl_vkind { CTL_V_NULL, CTL_V_U64, CTL_V_I64, CTL_V_BOOL, CTL_V_STR };

/* One value as read; CTL_SECONDS and CTL_MS hold milliseconds. */
struct ctl_value {
	enum ctl_vkind kind;
	uint64_t u;
	int64_t i;
	bool b;
	const char *s;
	const char *name; /* a vector's element: its name */
};

struct ctl_get {
	enum ctl_ctype type; /* CTL_C_NONE: not given */
	size_t off;
	enum ctl_names names;	  /* CTL_C_ENUM, CTL_C_COUNTS */
	unsigned int first, last; /* CTL_C_COUNTS */
	const char *dflt;	  /* CTL_C_STR: the value for NULL */
	bool negate;		  /* as a condition: holds when the member is zero */
	bool (*calc)(const void *obj, const struct ctl_env *env, struct ctl_value *v);
};

/* What becomes of a figure whose condition (.when, else its own value) does not hold. */
enum ctl_absent {
	CTL_ALWAYS,    /* no condition */
	CTL_NULL,      /* JSON null, no Prometheus sample, vmigctl "-" */
	CTL_OMIT,      /* no JSON key, no sample, nothing in vmigctl */
	CTL_NO_SAMPLE, /* JSON has the value anyway; only the Prometheus sample waits */
};

struct ctl_prom {
	const char *name; /* the family; NULL: not exported */
	const char *type; /* "gauge" or "counter" */
	const char *help;
	const char *labels; /* fixed labels after the object's own: direction="tx",window="1s" */
	const char *label;  /* CTL_C_COUNTS: the label naming each element, after .labels */
	bool percent;	    /* the figure is a percent; Prometheus has it as a 0-1 ratio */
};

/* Text flags (vmigctl). */
#define CTL_TXT_NONZERO 1u /* left out when 0, negative, false, null, "" or all zero */

struct ctl_fig {
	/* JSON: "bytes_tx", or "group.member" ("rates.tx_1s") inside the group's object. */
	const char *key;
	enum ctl_unit unit;
	struct ctl_get get;
	enum ctl_absent absent;
	/* The condition; not given: the value itself is set (non-zero, non-empty). */
	struct ctl_get when;
	/* Its JSON group is null, and it has no sample, unless this holds ("job" without one). */
	struct ctl_get group_when;
	struct ctl_prom prom;
	/*
	 * vmigctl: figures with the same line tag share a line, lines in the order their tag first
	 * appears. text is a printf format for the value (one %s), starting with the separator from
	 * the figure before it on the line (", ", " "), which is dropped at the start of a line; a
	 * CTL_BOOL's text is "IF TRUE|IF FALSE". NULL: not shown.
	 */
	const char *line, *text;
	unsigned int flags;
	/* Its key in replies of reply version 1 (before the tables), where it had another;
	 * vmigctl moves it (vmigctl_reply.c). NULL: the same key, or none. */
	const char *v1;
};

struct ctl_table {
	const char *what; /* "node", "migration", ... */
	const struct ctl_fig *figs;
	size_t n;
};

/* The daemon process (ctl_process.c): its build, and its figures as Prometheus clients show them */
struct ctl_process {
	const char *version, *features; /* VMIGD_VERSION, "tls,dpdk,libvirt,inspect" as built */
	uint64_t cpu_ms;		/* user and system CPU time */
	uint64_t rss, vsize;		/* bytes */
	uint64_t start_ms;		/* when it started, Unix time in ms */
	uint64_t open_fds, max_fds;	/* max_fds 0: no limit */
};

/* struct ctl_process: process_* (the families' names are the Prometheus client convention) */
extern const struct ctl_table ctl_process_table;
/* struct px_node_info; a test build adds its own figures (ctl_table_extend) */
extern struct ctl_table ctl_node_table;
/* struct px_migration_info; with "inspect", "ports", "connections" and "convergence" beside */
extern const struct ctl_table ctl_migration_table;
/* struct px_port_info, a migration's "ports" */
extern const struct ctl_table ctl_port_table;
/* struct px_conn_info, a migration's "connections"; with "inspect" beside */
extern const struct ctl_table ctl_conn_table;
/* struct px_insp_summary, a migration's "inspect" (null when not inspected) */
extern const struct ctl_table ctl_insp_summary_table;
/* struct px_insp_stats, a connection's "inspect" (null when not inspected) */
extern const struct ctl_table ctl_insp_stats_table;
/* struct cv_report, a migration's "convergence" (null when not watched); "actions" beside */
extern const struct ctl_table ctl_conv_table;
/* struct cv_action_rec, a convergence's "actions" */
extern const struct ctl_table ctl_action_table;

/* struct ctl_nic_view, a migration's "nic" and the node's (null when not known) */
extern const struct ctl_table ctl_nic_table;

/* A convergence watch's "state": waiting, watching, finished, stopped or irrecoverable. */
const char *ctl_conv_state(const struct cv_report *r);

/* Adds figs (kept, not copied) at t's end, before any report is made: the test build's figures
 * (ctrl/ctl_test.c), which the product does not have. 0 or -ENOMEM. */
int ctl_table_extend(struct ctl_table *t, const struct ctl_fig *figs, size_t n);

/* The figure with this JSON key, or NULL. */
const struct ctl_fig *ctl_fig_find(const struct ctl_table *t, const char *key);

/* The reply version this table describes (doc/interfaces.md): replies of status, list and
 * metrics carry it as "version". */
#define CTL_REPLY_VERSION 2

#endif
