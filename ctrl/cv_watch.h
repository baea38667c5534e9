/* SPDX-License-Identifier: Apache-2.0 */
/* The convergence module: one monitor thread per source migration that has a hypervisor
 * backend. It samples the job and vmigd's own figures, runs the policy and takes its actions. */
#ifndef CV_WATCH_H
#define CV_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cv_policy.h"
#include "px_node.h"
#include "xp_loop.h"

enum cv_backend_kind { CV_BACKEND_QMP, CV_BACKEND_LIBVIRT };

/* What source start asks for. */
struct cv_spec {
	struct cv_policy policy;
	enum cv_backend_kind backend;
	char qmp[108];	   /* QMP: the source QEMU's socket (one of its own) */
	char uri[256];	   /* libvirt: connection URI, empty for qemu:///system */
	char domain[256];  /* libvirt: name or UUID */
	bool policy_given; /* else cv_policy_default() with the request's bandwidth */
	char ignored[160]; /* policy fields vmigd does not use, for one log line at start */
};

#define CV_ACTIONS_MAX 16

struct cv_action_rec {
	int64_t at_ms; /* since the migration started */
	enum cv_act act;
	bool ok;
	char reason[512];
	char error[160]; /* when !ok: the backend's reason */
};

/* A copy of one watch, for status, metrics and top. */
struct cv_report {
	enum cv_mode mode;
	const char *backend; /* "qmp", "libvirt" */
	struct cv_policy policy;
	bool finished;	     /* the migration ended and the outcome is final */
	bool stopped;	     /* the monitor ended before that (stop, or the backend gone) */
	bool irrecoverable;  /* post-copy failed */
	bool have_job;
	struct cv_job job;   /* the last sample */
	int64_t elapsed_ms;  /* since the migration started; -1 before */
	uint64_t dirty_rate, link_rate; /* what the policy last judged by */
	const char *dirty_from;
	char evidence[240];    /* the policy's last judgement */
	unsigned int nactions; /* actions[] holds the first CV_ACTIONS_MAX */
	struct cv_action_rec actions[CV_ACTIONS_MAX];
	unsigned int counts[CV_ACT_ABORT + 1];
	unsigned int query_errors;
	char last_error[160];
	char outcome[384]; /* empty while the migration runs */
};

struct cv_set;

int cv_set_new(struct xp_loop *loop, struct px_node *n, struct cv_set **ret);
/* Stops every monitor. Takes NULL. */
void cv_set_free(struct cv_set *set);
/*
 * At source start, before QEMU migrates: opens the backend and prepares it (capabilities), then
 * starts the monitor. Blocks for at most a few seconds. -errno with one line in err.
 */
int cv_watch_start(struct cv_set *set, const char *key, const struct cv_spec *spec, char *err,
		   size_t errlen);
/* At source stop: a last sample, the outcome logged, the monitor gone. No-op when not watched.
 * last (may be NULL): the final report, written when watched; returns whether it was. */
bool cv_watch_stop(struct cv_set *set, const char *key, struct cv_report *last);
/* false when key is not watched. */
bool cv_watch_report(struct cv_set *set, const char *key, struct cv_report *out);
/*
 * Holds the policy (hold true) or lets it go on: while held it samples and reports but decides
 * nothing, and its clock (deadline, progress, evidence windows) does not run, so a node hop
 * whose link is down is not read as a guest that cannot converge. why says what holds it (one
 * line, shown as the evidence). No-op when not watched.
 */
void cv_watch_hold(struct cv_set *set, const char *key, bool hold, const char *why);
/* The speed of the node hop's link, bytes/s (0: not known): the ceiling of the node headroom
 * the policy may give the migration. No-op when not watched. */
void cv_watch_set_link(struct cv_set *set, const char *key, uint64_t speed);

#endif
