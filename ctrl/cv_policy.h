/* SPDX-License-Identifier: Apache-2.0 */
/* The convergence policy as a pure function: from one sample of a migration's figures and the
 * state carried since its start, what to do now (doc/design.md, "Convergence control"). */
#ifndef CV_POLICY_H
#define CV_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cv_backend.h"

enum cv_mode {
	CV_MODE_PREDICTIVE, /* act on evidence that pre-copy cannot converge */
	CV_MODE_KUBEVIRT,   /* KubeVirt's legacy monitor: completion and progress timeouts */
	CV_MODE_STALL,	    /* KubeVirt's VEP 248 stall detector, its published rules */
};

/* VEP 248's knobs (KubeVirt's StallDetectorOptions), in vmigd's units. */
struct cv_stall_opts {
	unsigned int margin_pct;       /* stallMargin: progress is a new low by this much */
	uint64_t window_s;	       /* stallProgressTimeout: how far back a low counts */
	uint64_t switchover_timeout_s; /* after relaxing the downtime, the switch-over must come */
	unsigned int ewma_alpha_pct;   /* ewmaAlpha x 100, for the bandwidth */
	unsigned int precopy_factor_pct; /* precopyPossibleFactor x 100 */
	unsigned int decay_pct;		 /* patienceWindowDecayFactor x 100 */
	bool local_minima;		 /* searchLocalMinima: post-copy at a low of remaining */
	unsigned int completion_factor;	 /* completionTimeoutFactor */
};

/* Field names follow KubeVirt's MigrationConfiguration. */
struct cv_policy {
	enum cv_mode mode;
	bool allow_auto_converge;
	bool allow_post_copy;
	bool allow_workload_disruption;
	uint64_t completion_timeout_per_gib; /* s per GB of guest memory (KubeVirt rounds up to
					      * decimal GB); 0: no completion timeout */
	uint64_t progress_timeout_s;	     /* abort after this long without progress; 0: never */
	uint64_t bandwidth;		     /* bytes/s, the migration's cap; 0: none */
	uint64_t max_downtime_ms;	     /* 0: the hypervisor's default */
	uint64_t window_ms;		     /* predictive: how long evidence must hold */
	bool shadow; /* decide and log, never act (the hypervisor is not even prepared) */
	struct cv_stall_opts stall;
};

#define CV_DEFAULT_COMPLETION_PER_GIB 150
#define CV_DEFAULT_PROGRESS_TIMEOUT_S 150
#define CV_DEFAULT_WINDOW_MS	      2000
#define CV_KUBEVIRT_POLL_MS	      400
#define CV_PREDICTIVE_POLL_MS	      250
/* VEP 248's defaults (../shared/reference/kubevirt-dropin.md, section 9). */
#define CV_STALL_MAX_DOWNTIME_MS   900
#define CV_STALL_START_DOWNTIME_MS 300

/* KubeVirt's defaults: nothing allowed, 150 s per GB, 150 s without progress. */
void cv_policy_default(struct cv_policy *p);
/* The downtime limit to set before the migration: the policy's (0: the hypervisor's); stall
 * mode starts at min(maxDowntimeMs, 300) as VEP 248 does. */
uint64_t cv_start_downtime_ms(const struct cv_policy *p);
const char *cv_mode_str(enum cv_mode m);

/* One sample: the hypervisor's job and vmigd's own view of the wire. */
struct cv_inputs {
	int64_t now_ms; /* since the migration started (the hypervisor's elapsed time) */
	struct cv_job job;
	bool have_job;		  /* the backend answered this time */
	uint64_t wire_rate;	  /* bytes/s this migration sent over the last second */
	uint64_t cap;		  /* its own cap; 0: none */
	uint64_t limit;		  /* what it may send now (cap or node share); 0: none */
	uint64_t node_cap;	  /* 0: none */
	uint64_t node_rate;	  /* bytes/s all migrations on this node sent */
	uint64_t link_speed;	  /* bytes/s of the node hop's link, where known; 0: not */
	/* vmigd may compress every chunk of it (--compress auto, a target that decodes): the
	 * rung before auto-converge; how many of its connections compress now */
	bool can_compress;
	unsigned int compressing;
};

enum cv_act {
	CV_ACT_NONE,
	CV_ACT_RAISE_CAP, /* use the node's headroom */
	CV_ACT_COMPRESS,  /* compress every chunk of it, before slowing the guest */
	CV_ACT_DOWNTIME,  /* stall: relax the downtime limit so pre-copy can switch over */
	CV_ACT_THROTTLE,  /* make auto-converge bite */
	CV_ACT_POSTCOPY,
	CV_ACT_PAUSE,
	CV_ACT_ABORT,
};

struct cv_action {
	enum cv_act act;
	uint64_t cap;		       /* RAISE_CAP */
	uint64_t downtime_ms;	       /* DOWNTIME */
	unsigned int throttle_initial; /* THROTTLE, percent */
	unsigned int throttle_step;
	char reason[512]; /* one line: why, with the figures */
};

/* One pass over RAM as the policy saw it: the first sample after a dirty-bitmap sync. */
struct cv_iter {
	int64_t t_ms;
	uint64_t remaining; /* what the pass has to send: the dirty set at the sync */
	unsigned int throttle;
};

#define CV_ITERS 64 /* kept: the last this many passes */

/* Carried from one call to the next; zero it (cv_state_init) when monitoring begins. */
struct cv_state {
	unsigned int done;	   /* bit (1 << enum cv_act) per action taken */
	int64_t evidence_since_ms; /* -1: pre-copy looks able to converge */
	int64_t action_ms;	   /* when it was taken; -1: none yet */
	uint64_t watermark;	   /* kubevirt: the last remaining bytes */
	int64_t progress_ms;	   /* when remaining last went down */
	int64_t acceptable_s;	   /* completion deadline; doubled after a pause; -1: not set */
	uint64_t gb;		   /* guest memory, decimal GB rounded up (KubeVirt) */
	bool postcopy, paused, throttling; /* in force: the caller clears one that failed */
	/* passes since the first sync: iters[n % CV_ITERS] is the newest of n */
	struct cv_iter iters[CV_ITERS];
	unsigned int niters;
	unsigned int niters_at_action; /* niters when the last action was taken */
	uint64_t last_syncs;
	unsigned int stalled;	    /* passes in a row without a new low */
	uint64_t stall_min, stall_max; /* the extremes of remaining over those passes */
	uint64_t low;		    /* the lowest remaining at a pass since the last action */
	uint64_t bw;		    /* the link, bytes/s: EWMA of the wire rate (stall mode) */
	unsigned int top_pass;	    /* niters when the throttle was first at its top; 0: not */
	unsigned int throttle_from; /* throttle and dirty rate when the throttle began */
	uint64_t dirty_at_throttle;
	int64_t stall_ms;    /* stall: when a stall was first seen; -1: none */
	int64_t patience_ms; /* stall: how long to wait for a low before post-copy */
	int64_t relaxed_ms;  /* stall: when the downtime was relaxed; -1: not */
	/* the figures behind the last evaluation, for status */
	uint64_t dirty_rate, link_rate;
	const char *dirty_from; /* "qemu" or NULL */
	char evidence[240];	/* the last judgement, one line */
};

void cv_state_init(struct cv_state *s);
/* Decides; also records an action in *s as taken (the caller reports if it failed). */
void cv_decide(const struct cv_policy *p, struct cv_state *s, const struct cv_inputs *in,
	       struct cv_action *a);
const char *cv_act_str(enum cv_act a);

/* Throttling that the predictive mode asks for first and adds at each sync. */
#define CV_THROTTLE_INITIAL 60
#define CV_THROTTLE_STEP    20
/* Predictive: passes in a row without a new low of remaining (by the stall margin) before
 * pre-copy counts as not converging; the evidence must also have held for window_ms. */
#define CV_STALL_PASSES 3
/* Predictive: past the completion deadline it escalates; a falling remaining that the projection
 * puts past this many times the deadline counts as not converging (VEP 248's
 * completionTimeoutFactor, 2). */
#define CV_HARD_FACTOR 2
#define CV_MARGIN_PCT	4
/* Predictive: passes without a new low that rise more than this share above the low, or differ
 * by more than it among themselves, are a guest whose dirtying changes (a burst and its drain),
 * not a steady state: their evidence must hold for CV_VARYING_HOLD_MS (or the window, if longer).
 * A pass back within this share of the low after such passes ends them: the guest came back
 * down, and a guest that keeps doing so is judged by the completion deadline. */
#define CV_SWING_PCT	   50
#define CV_VARYING_HOLD_MS 20000

#endif
