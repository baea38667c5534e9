// SPDX-License-Identifier: Apache-2.0
/* The convergence policy: KubeVirt's legacy decision order, and the predictive mode that
 * escalates as soon as the dirty rate holds at the link rate. Pure: no clock, no I/O. */
#include <stdio.h>
#include <string.h>

#include "cv_policy.h"

#define MIB (1024.0 * 1024.0)
/*
 * How long auto-converge gets before the next step, unless QEMU's throttle is at its top or the
 * deadline has passed: counted in bitmap syncs, because QEMU throttles only at a sync, after two
 * in a row dirtied over its threshold, and steps up only after two more.
 */
#define THROTTLE_GRACE_SYNCS 4
#define THROTTLE_TOP	  99

void cv_policy_default(struct cv_policy *p)
{
	memset(p, 0, sizeof(*p));
	p->mode = CV_MODE_PREDICTIVE;
	p->completion_timeout_per_gib = CV_DEFAULT_COMPLETION_PER_GIB;
	p->progress_timeout_s = CV_DEFAULT_PROGRESS_TIMEOUT_S;
	p->window_ms = CV_DEFAULT_WINDOW_MS;
}

const char *cv_mode_str(enum cv_mode m)
{
	return m == CV_MODE_KUBEVIRT ? "kubevirt" : "predictive";
}

const char *cv_act_str(enum cv_act a)
{
	static const char *const names[] = {
		[CV_ACT_NONE] = "none",		  [CV_ACT_RAISE_CAP] = "raise-cap",
		[CV_ACT_THROTTLE] = "auto-converge", [CV_ACT_POSTCOPY] = "post-copy",
		[CV_ACT_PAUSE] = "pause",		  [CV_ACT_ABORT] = "abort",
	};

	return (unsigned int)a < sizeof(names) / sizeof(names[0]) ? names[a] : "unknown";
}

void cv_state_init(struct cv_state *s)
{
	memset(s, 0, sizeof(*s));
	s->evidence_since_ms = -1;
	s->action_ms = -1;
	s->acceptable_s = -1;
}

static bool done(const struct cv_state *s, enum cv_act a)
{
	return s->done & (1u << a);
}

static void take(struct cv_state *s, const struct cv_inputs *in, struct cv_action *a,
		 enum cv_act act)
{
	a->act = act;
	s->done |= 1u << act;
	s->action_ms = in->now_ms;
	s->syncs_at_action = in->job.dirty_syncs;
	s->evidence_since_ms = -1;
	if (act == CV_ACT_POSTCOPY)
		s->postcopy = true;
	if (act == CV_ACT_PAUSE)
		s->paused = true;
	if (act == CV_ACT_THROTTLE)
		s->throttling = true;
}

/* KubeVirt: ceil(memory in decimal GB) x completionTimeoutPerGiB, set once the total is known. */
static void set_deadline(const struct cv_policy *p, struct cv_state *s, const struct cv_job *j)
{
	if (s->acceptable_s >= 0 || !p->completion_timeout_per_gib || !j->total)
		return;
	s->gb = (j->total + 999999999ull) / 1000000000ull;
	s->acceptable_s = (int64_t)(p->completion_timeout_per_gib * s->gb);
}

/* Progress is any decrease of the remaining bytes against the previous sample (KubeVirt). */
static void track_progress(struct cv_state *s, const struct cv_inputs *in)
{
	uint64_t remaining = in->job.remaining;

	if (s->watermark == 0 || remaining < s->watermark)
		s->progress_ms = in->now_ms;
	s->watermark = remaining;
}

/* progressTimeout, in both modes: the abort and its reason. */
static bool abort_if_stuck(const struct cv_policy *p, struct cv_state *s,
			   const struct cv_inputs *in, struct cv_action *a)
{
	if (!p->progress_timeout_s ||
	    in->now_ms - s->progress_ms <= (int64_t)p->progress_timeout_s * 1000)
		return false;
	snprintf(a->reason, sizeof(a->reason),
		 "stuck: remaining %.1f MiB has not gone down for %lld s (progressTimeout %llu s)",
		 in->job.remaining / MIB, (long long)((in->now_ms - s->progress_ms) / 1000),
		 (unsigned long long)p->progress_timeout_s);
	take(s, in, a, CV_ACT_ABORT);
	return true;
}

static bool late(const struct cv_state *s, const struct cv_inputs *in)
{
	return s->acceptable_s >= 0 && in->now_ms > s->acceptable_s * 1000;
}

static void kubevirt(const struct cv_policy *p, struct cv_state *s, const struct cv_inputs *in,
		     struct cv_action *a)
{
	const struct cv_job *j = &in->job;

	if (j->status != CV_ST_ACTIVE)
		return;
	track_progress(s, in);
	/* 1. Never act in post-copy; 2. past the deadline, disrupt if allowed. */
	if (s->postcopy || done(s, CV_ACT_ABORT))
		return;
	/* A post-copy that QEMU refused is not tried again: the deadline then aborts. */
	if (p->allow_workload_disruption && late(s, in) && !s->paused &&
	    !done(s, CV_ACT_POSTCOPY)) {
		snprintf(a->reason, sizeof(a->reason),
			 "not completed after %lld s (acceptable %lld s: completionTimeoutPerGiB "
			 "%llu x %llu GB)",
			 (long long)(in->now_ms / 1000), (long long)s->acceptable_s,
			 (unsigned long long)p->completion_timeout_per_gib,
			 (unsigned long long)s->gb);
		if (p->allow_post_copy) {
			take(s, in, a, CV_ACT_POSTCOPY);
		} else {
			take(s, in, a, CV_ACT_PAUSE);
			s->acceptable_s *= 2;
		}
		return;
	}
	/* 3. No progress for progressTimeout; 4. past the deadline. */
	if (abort_if_stuck(p, s, in, a) || !late(s, in))
		return;
	snprintf(a->reason, sizeof(a->reason),
		 "not completed after %lld s (acceptable %lld s: completionTimeoutPerGiB %llu x %llu "
		 "GB)",
		 (long long)(in->now_ms / 1000), (long long)s->acceptable_s,
		 (unsigned long long)p->completion_timeout_per_gib, (unsigned long long)s->gb);
	take(s, in, a, CV_ACT_ABORT);
}

/*
 * The dirty rate to judge by: QEMU's once it has one (two bitmap syncs), and only from a sync
 * after the last action, so an action is judged by its effect; else the stream's estimate.
 */
static bool dirty_rate(struct cv_state *s, const struct cv_inputs *in, uint64_t *rate)
{
	const struct cv_job *j = &in->job;

	if (j->dirty_syncs >= 2) {
		if (s->action_ms >= 0 && j->dirty_syncs <= s->syncs_at_action)
			return false;
		s->dirty_from = "qemu";
		*rate = j->dirty_rate;
		return true;
	}
	if (in->stream_dirty_rate && s->action_ms < 0) {
		s->dirty_from = "stream";
		*rate = in->stream_dirty_rate;
		return true;
	}
	return false;
}

/* What the node could give this migration: its cap less what the others send. */
static uint64_t headroom(const struct cv_inputs *in)
{
	uint64_t others = in->node_rate > in->wire_rate ? in->node_rate - in->wire_rate : 0;

	if (!in->node_cap || !in->cap || others >= in->node_cap)
		return 0;
	return in->node_cap - others;
}

static void predictive(const struct cv_policy *p, struct cv_state *s, const struct cv_inputs *in,
		       struct cv_action *a)
{
	const struct cv_job *j = &in->job;
	uint64_t dirty = 0, link = in->wire_rate ? in->wire_rate : j->rate, room;
	bool known, hopeless, overdue;
	char why[160];

	if (j->status != CV_ST_ACTIVE) {
		s->evidence_since_ms = -1;
		return;
	}
	track_progress(s, in);
	if (s->postcopy || done(s, CV_ACT_ABORT))
		return;
	known = link > 0 && dirty_rate(s, in, &dirty);
	if (known) {
		s->dirty_rate = dirty;
		s->link_rate = link;
	}
	hopeless = known && dirty * 100 >= link * CV_CONVERGE_PCT;
	overdue = late(s, in);
	if (abort_if_stuck(p, s, in, a))
		return;
	if (!hopeless && !overdue) {
		/* Unknown (no fresh sync yet) keeps the evidence; a good sample clears it. */
		if (known)
			s->evidence_since_ms = -1;
		return;
	}
	if (hopeless && s->evidence_since_ms < 0)
		s->evidence_since_ms = in->now_ms;
	if (!overdue && in->now_ms - s->evidence_since_ms < (int64_t)p->window_ms)
		return;
	if (hopeless)
		snprintf(why, sizeof(why),
			 "dirty %.1f MiB/s (%s) >= %d%% of link %.1f MiB/s for %.1f s, pass %llu, "
			 "remaining %.1f MiB",
			 dirty / MIB, s->dirty_from, CV_CONVERGE_PCT, link / MIB,
			 (in->now_ms - s->evidence_since_ms) / 1000.0,
			 (unsigned long long)j->dirty_syncs, j->remaining / MIB);
	else
		snprintf(why, sizeof(why),
			 "not completed after %lld s (acceptable %lld s), remaining %.1f MiB",
			 (long long)(in->now_ms / 1000), (long long)s->acceptable_s,
			 j->remaining / MIB);

	/* The ladder: headroom, auto-converge, post-copy, pause, abort. */
	room = headroom(in);
	if (!done(s, CV_ACT_RAISE_CAP) && room > in->cap + in->cap / 10) {
		a->cap = room;
		snprintf(a->reason, sizeof(a->reason), "%s: cap %.1f -> %.1f MiB/s (node headroom)",
			 why, in->cap / MIB, room / MIB);
		take(s, in, a, CV_ACT_RAISE_CAP);
		return;
	}
	if (p->allow_auto_converge && !done(s, CV_ACT_THROTTLE)) {
		a->throttle_initial = CV_THROTTLE_INITIAL;
		a->throttle_step = CV_THROTTLE_STEP;
		snprintf(a->reason, sizeof(a->reason), "%s: throttle the guest %u%% + %u%%/sync", why,
			 CV_THROTTLE_INITIAL, CV_THROTTLE_STEP);
		take(s, in, a, CV_ACT_THROTTLE);
		return;
	}
	/* Auto-converge gets its grace (see THROTTLE_GRACE_SYNCS). */
	if (s->throttling && !done(s, CV_ACT_POSTCOPY) && !done(s, CV_ACT_PAUSE) && !overdue &&
	    j->throttle_pct < THROTTLE_TOP &&
	    j->dirty_syncs < s->syncs_at_action + THROTTLE_GRACE_SYNCS)
		return;
	if (p->allow_post_copy && p->allow_workload_disruption && !done(s, CV_ACT_POSTCOPY)) {
		snprintf(a->reason, sizeof(a->reason), "%s: switch to post-copy", why);
		take(s, in, a, CV_ACT_POSTCOPY);
		return;
	}
	if (p->allow_workload_disruption && !done(s, CV_ACT_PAUSE)) {
		snprintf(a->reason, sizeof(a->reason), "%s: pause the guest", why);
		take(s, in, a, CV_ACT_PAUSE);
		return;
	}
	if (done(s, CV_ACT_PAUSE))
		return; /* a paused guest dirties nothing: the next pass completes */
	if (hopeless)
		snprintf(a->reason, sizeof(a->reason),
			 "cannot converge: dirty %.1f MiB/s >= link %.1f MiB/s (%s)", dirty / MIB,
			 link / MIB, why);
	else
		snprintf(a->reason, sizeof(a->reason), "cannot converge in time: %s", why);
	take(s, in, a, CV_ACT_ABORT);
}

void cv_decide(const struct cv_policy *p, struct cv_state *s, const struct cv_inputs *in,
	       struct cv_action *a)
{
	memset(a, 0, sizeof(*a));
	if (!in->have_job)
		return;
	if (in->job.status == CV_ST_POSTCOPY || in->job.status == CV_ST_POSTCOPY_PAUSED)
		s->postcopy = true;
	set_deadline(p, s, &in->job);
	if (p->mode == CV_MODE_KUBEVIRT)
		kubevirt(p, s, in, a);
	else
		predictive(p, s, in, a);
}
