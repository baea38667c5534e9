// SPDX-License-Identifier: Apache-2.0
/* The convergence policy: KubeVirt's legacy decision order, VEP 248's stall detector, and the
 * predictive mode that escalates on evidence from the passes over RAM and gives up only when no
 * allowed action is left. Pure: no clock, no I/O. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cv_policy.h"

#define MIB (1024.0 * 1024.0)
/* The highest throttle QEMU applies (cpu-throttle-percentage is at most 99). */
#define THROTTLE_TOP	  99

void cv_policy_default(struct cv_policy *p)
{
	memset(p, 0, sizeof(*p));
	p->mode = CV_MODE_PREDICTIVE;
	p->completion_timeout_per_gib = CV_DEFAULT_COMPLETION_PER_GIB;
	p->progress_timeout_s = CV_DEFAULT_PROGRESS_TIMEOUT_S;
	p->window_ms = CV_DEFAULT_WINDOW_MS;
	p->stall = (struct cv_stall_opts){
		.margin_pct = 4,
		.window_s = 40,
		.switchover_timeout_s = 60,
		.ewma_alpha_pct = 40,
		.precopy_factor_pct = 150,
		.decay_pct = 50,
		.local_minima = true,
		.completion_factor = 2,
	};
}

/* stall: the most it relaxes the downtime to (maxDowntimeMs, VEP 248's 900 ms by default). */
static uint64_t stall_max_downtime_ms(const struct cv_policy *p)
{
	return p->max_downtime_ms ? p->max_downtime_ms : CV_STALL_MAX_DOWNTIME_MS;
}

uint64_t cv_start_downtime_ms(const struct cv_policy *p)
{
	uint64_t max = stall_max_downtime_ms(p);

	if (p->mode != CV_MODE_STALL)
		return p->max_downtime_ms;
	return max < CV_STALL_START_DOWNTIME_MS ? max : CV_STALL_START_DOWNTIME_MS;
}

const char *cv_mode_str(enum cv_mode m)
{
	return m == CV_MODE_KUBEVIRT ? "kubevirt" : m == CV_MODE_STALL ? "stall" : "predictive";
}

const char *cv_act_str(enum cv_act a)
{
	static const char *const names[] = {
		[CV_ACT_NONE] = "none",
		[CV_ACT_RAISE_CAP] = "raise-cap",
		[CV_ACT_COMPRESS] = "compress",
		[CV_ACT_DOWNTIME] = "relax-downtime",
		[CV_ACT_THROTTLE] = "auto-converge",
		[CV_ACT_POSTCOPY] = "post-copy",
		[CV_ACT_PAUSE] = "pause",
		[CV_ACT_ABORT] = "abort",
	};

	return (unsigned int)a < sizeof(names) / sizeof(names[0]) ? names[a] : "unknown";
}

void cv_state_init(struct cv_state *s)
{
	memset(s, 0, sizeof(*s));
	s->evidence_since_ms = -1;
	s->action_ms = -1;
	s->acceptable_s = -1;
	s->stall_ms = -1;
	s->relaxed_ms = -1;
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
	s->evidence_since_ms = -1;
	s->stalled = 0;
	s->stall_min = s->stall_max = 0;
	s->low = 0;
	s->niters_at_action = s->niters;
	if (act == CV_ACT_POSTCOPY)
		s->postcopy = true;
	if (act == CV_ACT_PAUSE)
		s->paused = true;
	if (act == CV_ACT_THROTTLE) {
		s->throttling = true;
		s->throttle_from = in->job.throttle_pct;
		s->dirty_at_throttle = in->job.dirty_rate;
	}
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

/* The pass `back` passes before the newest (0: the newest); NULL when there is none. */
static const struct cv_iter *iter_back(const struct cv_state *s, unsigned int back)
{
	if (back >= s->niters || back >= CV_ITERS)
		return NULL;
	return &s->iters[(s->niters - 1 - back) % CV_ITERS];
}

/* A new pass began (QEMU synced its dirty bitmap since the last sample): record it. The first
 * pass (sync 1) sends all of RAM and says nothing of convergence: passes count from sync 2. */
static bool new_pass(struct cv_state *s, const struct cv_inputs *in)
{
	const struct cv_job *j = &in->job;
	struct cv_iter *it;

	if (j->dirty_syncs == s->last_syncs)
		return false;
	s->last_syncs = j->dirty_syncs;
	if (j->dirty_syncs < 2)
		return false;
	it = &s->iters[s->niters++ % CV_ITERS];
	it->t_ms = in->now_ms;
	it->remaining = j->remaining;
	it->throttle = j->throttle_pct;
	return true;
}

/* What the link carries for this migration: its limit (cap or node share), else the EWMA of
 * what it sent. */
static uint64_t link_rate(struct cv_state *s, const struct cv_inputs *in, unsigned int alpha_pct)
{
	uint64_t now = in->wire_rate ? in->wire_rate : in->job.rate;

	if (now)
		s->bw = s->bw ? (alpha_pct * now + (100 - alpha_pct) * s->bw) / 100 : now;
	s->link_rate = in->limit ? in->limit : s->bw;
	return s->link_rate;
}

static uint64_t allowed_downtime_ms(const struct cv_policy *p)
{
	return p->max_downtime_ms ? p->max_downtime_ms : 300; /* QEMU's default */
}

/* ms to send remaining at rate; a huge figure when the rate is unknown. */
static uint64_t send_ms(uint64_t remaining, uint64_t rate)
{
	return rate ? remaining * 1000 / rate : UINT64_MAX / 2;
}

/* The node's cap, held to the link's speed where that is known and lower: a cap set above the
 * link (25 Gbit/s of a VF under a 100 Gbit/s node cap) is no room to grow into. The link alone
 * makes no room: without a node cap, the migration's own cap is the operator's word. */
static uint64_t ceiling(const struct cv_inputs *in)
{
	return in->link_speed && in->link_speed < in->node_cap ? in->link_speed : in->node_cap;
}

/* What the node could give this migration: its ceiling less what the others send. */
static uint64_t headroom(const struct cv_inputs *in)
{
	uint64_t others = in->node_rate > in->wire_rate ? in->node_rate - in->wire_rate : 0;

	if (!in->node_cap || !in->cap || others >= ceiling(in))
		return 0;
	return ceiling(in) - others;
}

/* The last n + 1 passes fall, each at most CV_MARGIN_PCT above the one before. */
static bool falling(const struct cv_state *s, unsigned int n)
{
	for (unsigned int i = 0; i < n; i++) {
		const struct cv_iter *newer = iter_back(s, i), *older = iter_back(s, i + 1);

		if (!newer || !older ||
		    newer->remaining * 100 > older->remaining * (100 + CV_MARGIN_PCT))
			return false;
	}
	return true;
}

/*
 * Projected time to converge, assuming each pass leaves the same share of the one before (the
 * geometric model), that share taken over the last CV_STALL_PASSES passes since the last action
 * so that one noisy pass does not decide. Only used to see whether a falling remaining beats a
 * deadline. -1 when there are too few passes, or remaining did not fall by CV_MARGIN_PCT over
 * them (passes that hold steady are the stall rule's), or not pass after pass: the model says
 * nothing of a guest whose passes go up and down (a bursty one), whose window's two ends may
 * happen to be equal.
 */
static int64_t projected_ms(const struct cv_state *s, uint64_t link, uint64_t target)
{
	const struct cv_iter *a = iter_back(s, CV_STALL_PASSES), *b = iter_back(s, 0);
	double q, r, total = 0;

	if (!a || !b || s->niters - s->niters_at_action <= CV_STALL_PASSES || !a->remaining ||
	    b->remaining * 100 > a->remaining * (100 - CV_MARGIN_PCT) || !link ||
	    !falling(s, CV_STALL_PASSES))
		return -1;
	q = pow((double)b->remaining / a->remaining, 1.0 / CV_STALL_PASSES);
	for (r = b->remaining; r > target && total < 1e9; r *= q)
		total += r * 1000.0 / link;
	return (int64_t)total;
}

/* The passes as "64.0/63.8/64.1 MiB", oldest first, for reasons. */
static void passes_str(const struct cv_state *s, unsigned int n, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (unsigned int i = n; i-- > 0;) {
		const struct cv_iter *it = iter_back(s, i);

		if (it && off < len)
			off += snprintf(buf + off, len - off, "%s%.1f", off ? "/" : "",
					it->remaining / MIB);
	}
}

/* remaining is more than CV_SWING_PCT above low. */
static bool swung(uint64_t remaining, uint64_t low)
{
	return low && remaining * 100 > low * (100 + CV_SWING_PCT);
}

/* How long passes without a new low must go on: the window when they hold steady near the low;
 * at least CV_VARYING_HOLD_MS when they rose well above it or go up and down, as a burst and its
 * drain do. */
static int64_t hold_ms(const struct cv_policy *p, const struct cv_state *s)
{
	bool varying = swung(s->stall_max, s->low) || swung(s->stall_max, s->stall_min);

	if (varying && p->window_ms < CV_VARYING_HOLD_MS)
		return CV_VARYING_HOLD_MS;
	return (int64_t)p->window_ms;
}

/* A new pass over RAM: whether it made a new low (else one more without), and the evidence line.
 * *slow: the projection puts convergence past the deadline; *slow_hard: past CV_HARD_FACTOR x
 * the deadline. */
static void predictive_pass(const struct cv_policy *p, struct cv_state *s,
			    const struct cv_inputs *in, uint64_t link, uint64_t allowed,
			    bool *slow, bool *slow_hard)
{
	const struct cv_job *j = &in->job;
	const struct cv_iter *it;
	uint64_t down_ms, target = link * allowed / 1000;
	int64_t proj, hold;
	char passes[64], held[48];

	it = iter_back(s, 0);
	down_ms = send_ms(it->remaining, link);
	if (down_ms <= allowed || !s->low ||
	    it->remaining * 100 <= s->low * (100 - CV_MARGIN_PCT) ||
	    (swung(s->stall_max, s->low) && !swung(it->remaining, s->low))) {
		s->stalled = 0;
		s->stall_min = s->stall_max = 0;
		s->evidence_since_ms = -1;
	} else if (s->stalled++ == 0) {
		s->evidence_since_ms = in->now_ms;
		s->stall_min = s->stall_max = it->remaining;
	} else {
		s->stall_min = it->remaining < s->stall_min ? it->remaining : s->stall_min;
		s->stall_max = it->remaining > s->stall_max ? it->remaining : s->stall_max;
	}
	if (!s->low || it->remaining < s->low)
		s->low = it->remaining;
	if (s->throttling && it->throttle >= THROTTLE_TOP && !s->top_pass)
		s->top_pass = s->niters;
	proj = projected_ms(s, link, target);
	*slow = proj >= 0 && s->acceptable_s >= 0 &&
	       in->now_ms + proj > s->acceptable_s * 1000;
	*slow_hard = *slow && in->now_ms + proj > s->acceptable_s * 1000 * CV_HARD_FACTOR;
	passes_str(s, 4, passes, sizeof(passes));
	hold = hold_ms(p, s);
	held[0] = '\0';
	if (hold > (int64_t)p->window_ms)
		snprintf(held, sizeof(held), " (up and down: held %lld s)",
			 (long long)hold / 1000);
	snprintf(s->evidence, sizeof(s->evidence),
		 "pass %llu: remaining %s MiB (low %.1f), %u without a new low%s, expected "
		 "downtime %llu ms (allowed %llu) at %.1f MiB/s%s",
		 (unsigned long long)j->dirty_syncs, passes, s->low / MIB, s->stalled, held,
		 (unsigned long long)(down_ms > 999999 ? 999999 : down_ms),
		 (unsigned long long)allowed, link / MIB,
		 *slow ? ", too slow for the deadline" : "");
}

/* The abort's reason: what was tried, and why nothing else is left. */
static void predictive_no_action(const struct cv_policy *p, const struct cv_state *s,
				 const struct cv_inputs *in, bool slow_hard, const char *why,
				 struct cv_action *a)
{
	const struct cv_job *j = &in->job;
	char thr[100];

	if (s->throttling)
		snprintf(thr, sizeof(thr),
			 "auto-converge at %u%% (dirty %.1f MiB/s at %u%%, %.1f now)",
			 j->throttle_pct, s->dirty_at_throttle / MIB, s->throttle_from,
			 j->dirty_rate / MIB);
	else
		snprintf(thr, sizeof(thr), "auto-converge %s",
			 p->allow_auto_converge ? "refused by the hypervisor"
						: "not allowed");
	snprintf(a->reason, sizeof(a->reason),
		 "cannot converge%s (%s): no action left: %s, post-copy %s, no node headroom",
		 slow_hard ? " in time" : "", why, thr,
		 p->allow_post_copy ? "refused" : "not allowed");
}

/*
 * Predictive. Judged once per pass over RAM: pre-copy converges while each pass makes a new
 * low of remaining (by CV_MARGIN_PCT) or the pass would fit the allowed downtime. Evidence that
 * it does not: CV_STALL_PASSES passes in a row without a new low, held for window_ms, with the
 * expected downtime over the allowed one; or a falling remaining that the geometric projection
 * puts past the completion deadline (completionTimeoutPerGiB), or that deadline passed. Then the
 * ladder: node headroom, auto-converge (and its throttle gets to its top while the passes still
 * show no low), post-copy, pause. An abort only when none is left and the passes show no new
 * low, or the projection puts convergence past CV_HARD_FACTOR x the deadline; a deadline alone
 * never aborts. Its reason says so with the figures.
 */
static void predictive(const struct cv_policy *p, struct cv_state *s, const struct cv_inputs *in,
		       struct cv_action *a)
{
	const struct cv_job *j = &in->job;
	uint64_t link, room, allowed = allowed_downtime_ms(p);
	bool overdue, slow = false, slow_hard = false, evidence, throttle_room;
	char why[320];

	if (j->status != CV_ST_ACTIVE)
		return;
	track_progress(s, in);
	if (s->postcopy || done(s, CV_ACT_ABORT))
		return;
	link = link_rate(s, in, 40);
	if (j->dirty_syncs >= 2) {
		s->dirty_rate = j->dirty_rate;
		s->dirty_from = "qemu";
	}
	if (abort_if_stuck(p, s, in, a))
		return;
	overdue = late(s, in);
	if (new_pass(s, in))
		predictive_pass(p, s, in, link, allowed, &slow, &slow_hard);
	/* Evidence that pre-copy does not converge, or will not before the hard limit. */
	evidence = slow_hard || (s->stalled >= CV_STALL_PASSES &&
				 in->now_ms - s->evidence_since_ms >= hold_ms(p, s));
	if (!evidence && !overdue && !slow)
		return;
	if (overdue)
		snprintf(why, sizeof(why), "not completed after %lld s (acceptable %lld s); %s",
			 (long long)(in->now_ms / 1000), (long long)s->acceptable_s, s->evidence);
	else
		snprintf(why, sizeof(why), "not converging: %s", s->evidence);

	/* The ladder: headroom, compression, auto-converge, post-copy, pause, abort. */
	room = headroom(in);
	if (!done(s, CV_ACT_RAISE_CAP) && room > in->cap + in->cap / 10) {
		a->cap = room;
		snprintf(a->reason, sizeof(a->reason),
			 "%s: cap %.1f -> %.1f MiB/s (node headroom%s)", why, in->cap / MIB,
			 room / MIB,
			 ceiling(in) < in->node_cap ? ", held to the link's speed" : "");
		take(s, in, a, CV_ACT_RAISE_CAP);
		return;
	}
	/* fewer bytes for the same pages, where they shrink: nothing slows the guest */
	if (in->can_compress && !done(s, CV_ACT_COMPRESS)) {
		snprintf(a->reason, sizeof(a->reason),
			 "%s: compress every chunk (%u of its connections compressed before)", why,
			 in->compressing);
		take(s, in, a, CV_ACT_COMPRESS);
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
	/* The throttle has headroom until QEMU has held it at its top for a whole pass; past the
	 * deadline, post-copy or a pause (where allowed) do not wait for it. */
	throttle_room = s->throttling && (!s->top_pass || s->niters < s->top_pass + 1);
	if (throttle_room && !overdue && !done(s, CV_ACT_POSTCOPY) && !done(s, CV_ACT_PAUSE))
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
	/* No abort while the throttle can still rise, or while the passes make new lows fast
	 * enough for CV_HARD_FACTOR x the deadline, late or not. */
	if (!evidence || throttle_room)
		return;
	predictive_no_action(p, s, in, slow_hard, why, a);
	take(s, in, a, CV_ACT_ABORT);
}

/* stall: the lowest remaining among the passes at least window_ms old; 0 when none is. */
static uint64_t low_before(const struct cv_state *s, int64_t before_ms)
{
	uint64_t low = 0;

	for (unsigned int i = 0; i < CV_ITERS; i++) {
		const struct cv_iter *it = iter_back(s, i);

		if (!it)
			break;
		if (it->t_ms <= before_ms && (!low || it->remaining < low))
			low = it->remaining;
	}
	return low;
}

/* stall: the lowest remaining among the passes since since_ms (the patience window). */
static uint64_t low_since(const struct cv_state *s, int64_t since_ms)
{
	uint64_t low = 0;

	for (unsigned int i = 0; i < CV_ITERS; i++) {
		const struct cv_iter *it = iter_back(s, i);

		if (!it || it->t_ms < since_ms)
			break;
		if (!low || it->remaining < low)
			low = it->remaining;
	}
	return low;
}

/*
 * VEP 248 as published (see doc/design.md, "Convergence control", for what is interpreted):
 * bandwidth as an EWMA; a stall at a pass whose remaining is not a new low by stallMargin
 * against every pass older than stallProgressTimeout; then relax the downtime up to
 * maxDowntimeMs when the implied downtime is within precopyPossibleFactor of it, else post-copy
 * (allowed, and its implied downtime within 2 x the completion time less elapsed) at a local low
 * of remaining or when the patience window runs out, else abort. A relaxed downtime
 * that brings no switch-over within switchoverTimeout, and completionTimeoutFactor x the
 * completion time, abort.
 */
static void stall(const struct cv_policy *p, struct cv_state *s, const struct cv_inputs *in,
		  struct cv_action *a)
{
	const struct cv_stall_opts *o = &p->stall;
	const struct cv_job *j = &in->job;
	uint64_t link, max_down = stall_max_downtime_ms(p);
	uint64_t old_low, implied, remaining;
	int64_t window = (int64_t)o->window_s * 1000;
	char why[320];

	if (j->status != CV_ST_ACTIVE)
		return;
	if (s->postcopy || done(s, CV_ACT_ABORT))
		return;
	link = link_rate(s, in, o->ewma_alpha_pct);
	if (j->dirty_syncs >= 2) {
		s->dirty_rate = j->dirty_rate;
		s->dirty_from = "qemu";
	}
	if (s->acceptable_s >= 0 && o->completion_factor &&
	    in->now_ms > s->acceptable_s * 1000 * (int64_t)o->completion_factor) {
		snprintf(a->reason, sizeof(a->reason),
			 "abort_timeout: not completed after %lld s (%u x the completion time %lld "
			 "s)",
			 (long long)(in->now_ms / 1000), o->completion_factor,
			 (long long)s->acceptable_s);
		take(s, in, a, CV_ACT_ABORT);
		return;
	}
	if (s->relaxed_ms >= 0 && o->switchover_timeout_s &&
	    in->now_ms - s->relaxed_ms > (int64_t)o->switchover_timeout_s * 1000) {
		bool pc = p->allow_post_copy && p->allow_workload_disruption &&
			  !done(s, CV_ACT_POSTCOPY);

		snprintf(a->reason, sizeof(a->reason),
			 "%s: no switch-over %llu s after the downtime was relaxed to %llu ms "
			 "(switchoverTimeout)%s",
			 pc ? "switchover to post-copy" : "abort_timeout",
			 (unsigned long long)o->switchover_timeout_s, (unsigned long long)max_down,
			 pc ? "" : "; post-copy not allowed");
		take(s, in, a, pc ? CV_ACT_POSTCOPY : CV_ACT_ABORT);
		return;
	}
	/* Relaxed: pre-copy gets its switchoverTimeout to switch over. */
	if (s->relaxed_ms >= 0) {
		new_pass(s, in);
		return;
	}
	if (!new_pass(s, in))
		return;
	remaining = iter_back(s, 0)->remaining;
	implied = send_ms(remaining, link);
	old_low = low_before(s, in->now_ms - window);
	snprintf(s->evidence, sizeof(s->evidence),
		 "pass %llu: remaining %.1f MiB, low before the last %llu s %.1f MiB, implied "
		 "downtime %llu ms at %.1f MiB/s (EWMA)",
		 (unsigned long long)j->dirty_syncs, remaining / MIB,
		 (unsigned long long)o->window_s, old_low / MIB,
		 (unsigned long long)(implied > 999999 ? 999999 : implied), link / MIB);
	if (s->stall_ms < 0) {
		if (!old_low || remaining * 100 < old_low * (100 - o->margin_pct))
			return;
		s->stall_ms = in->now_ms;
		s->patience_ms = window * o->decay_pct / 100;
	}
	snprintf(why, sizeof(why), "stall (since %.1f s): %s", s->stall_ms / 1000.0, s->evidence);
	if (!done(s, CV_ACT_DOWNTIME) && implied * 100 <= max_down * o->precopy_factor_pct) {
		a->downtime_ms = max_down;
		snprintf(a->reason, sizeof(a->reason), "%s: relax_downtime to %llu ms", why,
			 (unsigned long long)max_down);
		take(s, in, a, CV_ACT_DOWNTIME);
		s->relaxed_ms = in->now_ms;
		return;
	}
	if (p->allow_post_copy && p->allow_workload_disruption && !done(s, CV_ACT_POSTCOPY) &&
	    (s->acceptable_s < 0 || (int64_t)implied <= 2 * s->acceptable_s * 1000 - in->now_ms)) {
		/* At a local low of remaining, or once the patience window (the stall window
		 * times patienceWindowDecayFactor) has run out. */
		if (o->local_minima && in->now_ms - s->stall_ms < s->patience_ms &&
		    remaining * 100 >
			    low_since(s, in->now_ms - s->patience_ms) * (100 + o->margin_pct))
			return;
		snprintf(a->reason, sizeof(a->reason), "%s: switchover to post-copy", why);
		take(s, in, a, CV_ACT_POSTCOPY);
		return;
	}
	snprintf(a->reason, sizeof(a->reason), "abort_low_bandwidth: %s; post-copy %s", why,
		 p->allow_post_copy && p->allow_workload_disruption ? "would take too long"
								    : "not allowed");
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
	else if (p->mode == CV_MODE_STALL)
		stall(p, s, in, a);
	else
		predictive(p, s, in, a);
}
