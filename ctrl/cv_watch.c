// SPDX-License-Identifier: Apache-2.0
/* Convergence monitors: a thread per watched migration that blocks on its backend, and a loop
 * timer that hands it vmigd's figures and applies the cap changes it asks for. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cv_watch.h"
#include "log.h"
#include "units.h"
#include "util.h"

#define BACKEND_TIMEOUT_MS 2000
#define PUBLISH_MS	   100
/* Query failures in a row before the monitor gives up on a backend that answers nothing. */
#define QUERY_ERRORS_MAX 40
#define MIB		 (1024.0 * 1024.0)

struct cv_watch {
	struct cv_set *set;
	struct cv_watch *next;
	char key[PX_KEY_MAX + 1];
	struct cv_spec spec;
	struct cv_backend *b;
	pthread_t thread;
	bool started;

	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t wake;
	bool quit;
	/* from the loop: vmigd's own figures (the cv_inputs fields after job) */
	struct cv_inputs px;
	unsigned int px_conns; /* connections vmigd carried for it so far */
	/* to the loop */
	uint64_t want_cap;
	bool want_cap_set;
	bool want_compress;
	/* held by the loop (cv_watch_hold): since when, why, and how long held before */
	bool held;
	int64_t held_since_ms, held_total_ms;
	char held_why[160];
	/* the report */
	struct cv_report rep;
	int64_t started_ms; /* CLOCK_MONOTONIC ms when the job was first seen; -1 before */
};

struct cv_set {
	struct xp_loop *loop;
	struct px_node *node;
	struct xp_timer *timer;
	pthread_mutex_t lock; /* the list: the loop adds and removes, status reads */
	struct cv_watch *watches;
};

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the monitor thread ---- */

/* Carries out one decision; the backend's error when it fails. */
static int execute(struct cv_watch *w, const struct cv_action *a)
{
	const struct cv_backend_ops *ops = w->b->ops;

	switch (a->act) {
	case CV_ACT_RAISE_CAP:
		pthread_mutex_lock(&w->lock);
		w->want_cap = a->cap;
		w->want_cap_set = true;
		pthread_mutex_unlock(&w->lock);
		/* The hypervisor may hold its own limit at the old cap (libvirt, KubeVirt). */
		return ops->set_bandwidth(w->b, a->cap);
	case CV_ACT_COMPRESS:
		/* vmigd's own: the loop tells the migration's connections */
		pthread_mutex_lock(&w->lock);
		w->want_compress = true;
		pthread_mutex_unlock(&w->lock);
		return 0;
	case CV_ACT_DOWNTIME:
		return ops->set_downtime(w->b, a->downtime_ms);
	case CV_ACT_THROTTLE:
		return ops->set_throttle(w->b, a->throttle_initial, a->throttle_step);
	case CV_ACT_POSTCOPY:
		return ops->start_postcopy(w->b);
	case CV_ACT_PAUSE:
		return ops->pause(w->b);
	case CV_ACT_ABORT:
		return ops->abort(w->b);
	default:
		return 0;
	}
}

static void record(struct cv_watch *w, const struct cv_action *a, int64_t at_ms, int r)
{
	struct cv_report *rep = &w->rep;
	const char *mode = cv_mode_str(w->spec.policy.mode);

	pthread_mutex_lock(&w->lock);
	rep->counts[a->act]++;
	if (rep->nactions < CV_ACTIONS_MAX) {
		struct cv_action_rec *rec = &rep->actions[rep->nactions];

		rec->at_ms = at_ms;
		rec->act = a->act;
		rec->ok = r >= 0;
		snprintf(rec->reason, sizeof(rec->reason), "%s", a->reason);
		if (r < 0)
			snprintf(rec->error, sizeof(rec->error), "%s", w->b->ops->error(w->b));
	}
	rep->nactions++;
	pthread_mutex_unlock(&w->lock);
	if (w->spec.policy.shadow)
		log_info("migration %s role=source: convergence (%s, shadow: not acted on) at %.1f "
			 "s: %s: %s",
			 w->key, mode, at_ms / 1000.0, cv_act_str(a->act), a->reason);
	else if (r < 0)
		log_err("migration %s role=source: convergence (%s) at %.1f s: %s failed: %s; "
			"it was for: %s",
			w->key, mode, at_ms / 1000.0, cv_act_str(a->act), w->b->ops->error(w->b),
			a->reason);
	else
		log_warn("migration %s role=source: convergence (%s) at %.1f s: %s: %s", w->key,
			 mode, at_ms / 1000.0, cv_act_str(a->act), a->reason);
}

static bool final(enum cv_status s)
{
	return s == CV_ST_COMPLETED || s == CV_ST_FAILED || s == CV_ST_CANCELLED;
}

/* The outcome, once the job ended: what happened to the guest is the part that matters. */
static void finish(struct cv_watch *w, struct cv_state *st, bool saw_postcopy, struct cv_job *j)
{
	const struct cv_backend_ops *ops = w->b->ops;
	struct cv_report *rep = &w->rep;
	bool shadow = w->spec.policy.shadow;
	bool aborted = !shadow && rep->counts[CV_ACT_ABORT] > 0, irrecoverable = false;
	char out[sizeof(rep->outcome)], why[300] = "";
	double secs = j->elapsed_ms > 0 ? j->elapsed_ms / 1000.0 : 0;

	if (j->status == CV_ST_COMPLETED) {
		snprintf(out, sizeof(out), "completed in %.1f s, downtime %lld ms%s%s", secs,
			 (long long)j->downtime_ms, saw_postcopy ? ", through post-copy" : "",
			 !st->paused || shadow	    ? ""
			 : strcmp(ops->name, "qmp") ? "; vmigd paused the guest for it (libvirt "
						      "resumes it on the destination)"
						    : "; vmigd paused the guest for it, so it is "
						      "paused on the destination "
						      "until resumed (cont)");
		log_info("migration %s role=source: convergence: %s", w->key, out);
	} else if (saw_postcopy) {
		irrecoverable = true;
		snprintf(out, sizeof(out),
			 "post-copy failed (%s%s%.180s): the guest's memory is split between the nodes "
			 "and it cannot be recovered on either (KubeVirt marks such a VMI "
			 "irrecoverable)",
			 cv_status_str(j->status), j->error[0] ? ": " : "", j->error);
		log_err("migration %s role=source: convergence: %s", w->key, out);
	} else {
		if (j->error[0])
			snprintf(why, sizeof(why), ": %s", j->error);
		if (aborted && rep->nactions <= CV_ACTIONS_MAX)
			for (unsigned int i = 0; i < rep->nactions; i++)
				if (rep->actions[i].act == CV_ACT_ABORT)
					snprintf(why, sizeof(why), ": %s", rep->actions[i].reason);
		/* A guest vmigd paused runs again where it was. */
		if (st->paused && !shadow && ops->resume(w->b) < 0)
			log_err("migration %s role=source: convergence: cannot resume the guest vmigd "
				"paused: %s",
				w->key, ops->error(w->b));
		if (ops->query(w->b, j) < 0)
			snprintf(out, sizeof(out),
				 "%s%s; the state of the guest on the source is unknown (%s)",
				 aborted ? "aborted by vmigd" : cv_status_str(j->status), why,
				 ops->error(w->b));
		else
			snprintf(out, sizeof(out), "%s%s; the guest %s on the source%s",
				 aborted ? "aborted by vmigd" : cv_status_str(j->status), why,
				 j->guest_running ? "is running" : "is NOT running",
				 j->guest_running	 ? ""
				 : st->paused && !shadow ? " (resuming it failed)"
							 : " (it was not running before either?)");
		if (j->guest_running)
			log_warn("migration %s role=source: convergence: %s", w->key, out);
		else
			log_err("migration %s role=source: convergence: %s", w->key, out);
	}
	if (shadow && rep->nactions) {
		size_t n = strlen(out);

		snprintf(out + n, sizeof(out) - n,
			 "; shadow: %u decisions not acted on, the first %s at %.1f s",
			 rep->nactions, cv_act_str(rep->actions[0].act),
			 rep->actions[0].at_ms / 1000.0);
	}
	pthread_mutex_lock(&w->lock);
	snprintf(rep->outcome, sizeof(rep->outcome), "%s", out);
	rep->finished = true;
	rep->irrecoverable = irrecoverable;
	pthread_mutex_unlock(&w->lock);
}

/* Sleeps until the next poll; false when told to quit. */
static bool nap(struct cv_watch *w, unsigned int ms)
{
	struct timespec ts;
	bool quit;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&w->lock);
	while (!w->quit && pthread_cond_timedwait(&w->wake, &w->lock, &ts) == 0)
		;
	quit = w->quit;
	pthread_mutex_unlock(&w->lock);
	return !quit;
}

/*
 * One poll's inputs, under the lock: the job as the backend gave it (r: the query's result) and
 * the node's figures, with the policy's clock, which starts when the job is first seen (*seen)
 * and leaves out the time it was held. Returns whether it is held now.
 */
static bool sample(struct cv_watch *w, int r, const struct cv_job *job, bool *seen,
		   struct cv_inputs *in)
{
	bool held;

	pthread_mutex_lock(&w->lock);
	*in = w->px;
	in->job = *job;
	in->have_job = r == 0;
	if (r == 0) {
		w->rep.have_job = true;
		w->rep.job = in->job;
		/*
		 * A finished job before ours began is a previous migration's, unless
		 * vmigd already carried this one (it ended between two samples).
		 */
		if (!*seen && in->job.status != CV_ST_NONE &&
		    (!final(in->job.status) || w->px_conns > 0)) {
			*seen = true;
			w->started_ms =
				mono_ms() - (in->job.elapsed_ms > 0 ? in->job.elapsed_ms : 0);
		}
	} else {
		w->rep.query_errors++;
		snprintf(w->rep.last_error, sizeof(w->rep.last_error), "%s",
			 w->b->ops->error(w->b));
	}
	in->now_ms = *seen ? mono_ms() - w->started_ms : 0;
	w->rep.elapsed_ms = *seen ? in->now_ms : -1;
	held = w->held;
	/* The policy's clock leaves out the time it was held. */
	in->now_ms -= w->held_total_ms + (held ? mono_ms() - w->held_since_ms : 0);
	if (in->now_ms < 0)
		in->now_ms = 0; /* held before the job was first seen */
	if (held)
		snprintf(w->rep.evidence, sizeof(w->rep.evidence),
			 "held for %.1f s: %s; no action until it ends",
			 (mono_ms() - w->held_since_ms) / 1000.0, w->held_why);
	pthread_mutex_unlock(&w->lock);
	return held;
}

/* Post-copy that lost its connection: the guest is split until it recovers. Said once. */
static void postcopy_paused(struct cv_watch *w, const struct cv_job *job)
{
	pthread_mutex_lock(&w->lock);
	snprintf(w->rep.outcome, sizeof(w->rep.outcome),
		 "post-copy interrupted (%s): the guest's memory is split between the "
		 "nodes; unless QEMU recovers it (migrate-recover), it is lost",
		 cv_status_str(job->status));
	w->rep.irrecoverable = true;
	pthread_mutex_unlock(&w->lock);
	log_err("migration %s role=source: convergence: %s", w->key, w->rep.outcome);
}

/* The policy's decision on this sample, reported, and carried out unless in shadow mode. */
static void decide(struct cv_watch *w, struct cv_state *st, const struct cv_inputs *in)
{
	const struct cv_policy *p = &w->spec.policy;
	struct cv_action a;
	int r;

	cv_decide(p, st, in, &a);
	pthread_mutex_lock(&w->lock);
	w->rep.dirty_rate = st->dirty_rate;
	w->rep.link_rate = st->link_rate;
	w->rep.dirty_from = st->dirty_from;
	snprintf(w->rep.evidence, sizeof(w->rep.evidence), "%s", st->evidence);
	pthread_mutex_unlock(&w->lock);
	if (a.act == CV_ACT_NONE)
		return;
	/* Shadow: recorded and logged as decided, nothing done. */
	r = p->shadow ? 0 : execute(w, &a);
	record(w, &a, in->now_ms, r);
	/* A step that did not happen is not in force: the ladder goes on past it. */
	if (r < 0 && a.act == CV_ACT_POSTCOPY)
		st->postcopy = false;
	if (r < 0 && a.act == CV_ACT_PAUSE)
		st->paused = false;
	if (r < 0 && a.act == CV_ACT_THROTTLE)
		st->throttling = false; /* libvirt cannot: no grace to wait out */
}

static void *watch_main(void *arg)
{
	struct cv_watch *w = arg;
	const struct cv_policy *p = &w->spec.policy;
	unsigned int poll_ms =
		p->mode == CV_MODE_PREDICTIVE ? CV_PREDICTIVE_POLL_MS : CV_KUBEVIRT_POLL_MS;
	struct cv_state st;
	bool seen = false, going = true, saw_postcopy = false, told_paused = false,
	     was_held = false;
	unsigned int failing = 0; /* query errors in a row */

	cv_state_init(&st);
	while (going) {
		struct cv_inputs in;
		struct cv_job job = { 0 };
		bool held;
		int r;

		going = nap(w, poll_ms);
		r = w->b->ops->query(w->b, &job);
		held = sample(w, r, &job, &seen, &in);
		if (r < 0) {
			failing++;
			if (failing == 1 || failing == QUERY_ERRORS_MAX)
				log_warn("migration %s role=source: convergence: cannot query the "
					 "migration: %s%s",
					 w->key, w->b->ops->error(w->b),
					 failing == QUERY_ERRORS_MAX
						 ? "; giving up: no more convergence actions"
						 : "");
			if (r == -ECONNRESET || failing >= QUERY_ERRORS_MAX)
				break;
			continue;
		}
		failing = 0;
		if (!seen)
			continue;
		if (in.job.status == CV_ST_POSTCOPY || in.job.status == CV_ST_POSTCOPY_PAUSED)
			saw_postcopy = true;
		if (final(in.job.status)) {
			finish(w, &st, saw_postcopy || st.postcopy, &in.job);
			break;
		}
		/* Post-copy that lost its connection: the guest is split until it recovers. */
		if (in.job.status == CV_ST_POSTCOPY_PAUSED && !told_paused) {
			told_paused = true;
			postcopy_paused(w, &in.job);
		}
		if (!going)
			break; /* stopping: the last sample only settles the outcome */
		if (held) {
			was_held = true;
			continue;
		}
		if (was_held) {
			/* What was building up before the hold is not evidence after it. */
			was_held = false;
			st.evidence_since_ms = -1;
			st.stalled = 0;
			st.stall_min = st.stall_max = 0;
			st.stall_ms = -1;
			st.progress_ms = in.now_ms;
		}
		decide(w, &st, &in);
	}
	if (!w->rep.finished) {
		pthread_mutex_lock(&w->lock);
		w->rep.stopped = true;
		snprintf(w->rep.outcome, sizeof(w->rep.outcome),
			 "not followed to the end (%s)",
			 w->rep.query_errors ? w->rep.last_error : "vmigd stopped watching");
		pthread_mutex_unlock(&w->lock);
	}
	return NULL;
}

/* ---- the loop side ---- */

static void take_figures(const struct px_migration_info *mi, void *arg)
{
	struct cv_set *set = arg;

	if (mi->role != PX_ROLE_SOURCE)
		return;
	for (struct cv_watch *w = set->watches; w; w = w->next) {
		if (strcmp(w->key, mi->key))
			continue;
		pthread_mutex_lock(&w->lock);
		w->px_conns = mi->conns_total;
		w->px.wire_rate = mi->rate.tx_1s;
		w->px.cap = mi->cap;
		w->px.limit = mi->limit;
		w->px.can_compress = mi->zconns > 0 && mi->zmode && !strcmp(mi->zmode, "auto");
		w->px.compressing = mi->zconns_on;
		pthread_mutex_unlock(&w->lock);
	}
}

static void arm(struct cv_set *set);

static void publish(void *arg)
{
	struct cv_set *set = arg;
	struct px_node_info ni;

	set->timer = NULL;
	px_node_info(set->node, &ni);
	px_node_foreach(set->node, take_figures, set);
	for (struct cv_watch *w = set->watches; w; w = w->next) {
		uint64_t cap = 0;
		bool apply, compress;

		pthread_mutex_lock(&w->lock);
		w->px.node_cap = ni.bandwidth;
		w->px.node_rate = ni.rate.tx_1s;
		apply = w->want_cap_set;
		if (apply)
			cap = w->want_cap;
		w->want_cap_set = false;
		compress = w->want_compress;
		w->want_compress = false;
		pthread_mutex_unlock(&w->lock);
		if (compress)
			px_migration_compress_all(set->node, w->key);
		if (apply) {
			char err[200];

			if (px_migration_set_cap(set->node, w->key, cap, err, sizeof(err)) < 0)
				log_err("migration %s role=source: convergence: cannot raise the cap "
					"to %.1f MiB/s: %s",
					w->key, cap / MIB, err);
		}
	}
	if (set->watches)
		arm(set);
}

/* The figures timer runs while something is watched. */
static void arm(struct cv_set *set)
{
	if (!set->timer &&
	    xp_timer_add(set->loop, vm_now_ms() + PUBLISH_MS, publish, set, &set->timer) < 0)
		log_err("convergence: cannot arm the figures timer: out of memory");
}

int cv_set_new(struct xp_loop *loop, struct px_node *n, struct cv_set **ret)
{
	struct cv_set *set = calloc(1, sizeof(*set));

	if (!set)
		return -ENOMEM;
	set->loop = loop;
	set->node = n;
	pthread_mutex_init(&set->lock, NULL);
	*ret = set;
	return 0;
}

/* Ends the monitor's thread (its last sample and outcome first); again: nothing. */
static void watch_join(struct cv_watch *w)
{
	if (w->started) {
		pthread_mutex_lock(&w->lock);
		w->quit = true;
		pthread_cond_signal(&w->wake);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
		w->started = false;
	}
}

static void watch_free(struct cv_watch *w)
{
	watch_join(w);
	if (w->b)
		w->b->ops->free(w->b);
	pthread_cond_destroy(&w->wake);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

void cv_set_free(struct cv_set *set)
{
	if (!set)
		return;
	while (set->watches) {
		struct cv_watch *w = set->watches;

		set->watches = w->next;
		watch_free(w);
	}
	xp_timer_del(set->timer);
	pthread_mutex_destroy(&set->lock);
	free(set);
}

static struct cv_watch *find(struct cv_set *set, const char *key)
{
	for (struct cv_watch *w = set->watches; w; w = w->next)
		if (!strcmp(w->key, key))
			return w;
	return NULL;
}

int cv_watch_start(struct cv_set *set, const char *key, const struct cv_spec *spec, char *err,
		   size_t errlen)
{
	const struct cv_policy *p = &spec->policy;
	struct cv_setup setup = {
		.auto_converge = p->allow_auto_converge,
		.post_copy = p->allow_post_copy,
		/* KubeVirt leaves QEMU's own throttling (20 % + 10 %); predictive decides. */
		.throttle_dormant = p->mode == CV_MODE_PREDICTIVE,
		.max_downtime_ms = cv_start_downtime_ms(p),
	};
	struct cv_watch *w;
	char e[300];
	int r;

	if (find(set, key)) {
		snprintf(err, errlen, "migration %s is already watched", key);
		return -EEXIST;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	w->set = set;
	snprintf(w->key, sizeof(w->key), "%s", key);
	w->spec = *spec;
	w->started_ms = -1;
	w->rep.elapsed_ms = -1;
	w->rep.mode = p->mode;
	w->rep.policy = *p;
	pthread_mutex_init(&w->lock, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&w->wake, &ca);
		pthread_condattr_destroy(&ca);
	}
	if (spec->backend == CV_BACKEND_QMP)
		r = cv_qmp_open(spec->qmp, BACKEND_TIMEOUT_MS, &w->b, e, sizeof(e));
	else
		r = cv_virt_open(spec->uri[0] ? spec->uri : NULL, spec->domain, BACKEND_TIMEOUT_MS,
				 &w->b, e, sizeof(e));
	if (r < 0) {
		snprintf(err, errlen, "convergence: %s", e);
		goto fail;
	}
	w->rep.backend = w->b->ops->name;
	/* Shadow changes nothing in the hypervisor: its capabilities are whoever's set them. */
	if (p->shadow)
		setup = (struct cv_setup){ 0 };
	r = w->b->ops->prepare(w->b, &setup, e, sizeof(e));
	if (r < 0) {
		snprintf(err, errlen, "convergence: %s", e);
		goto fail;
	}
	r = -pthread_create(&w->thread, NULL, watch_main, w);
	if (r < 0) {
		snprintf(err, errlen, "convergence: cannot start the monitor: %s", strerror(-r));
		goto fail;
	}
	w->started = true;
	pthread_mutex_lock(&set->lock);
	w->next = set->watches;
	set->watches = w;
	pthread_mutex_unlock(&set->lock);
	arm(set);
	log_info("migration %s role=source: convergence %s%s via %s: auto-converge %s, post-copy "
		 "%s, workload disruption %s, completionTimeoutPerGiB %llu s, progressTimeout %llu "
		 "s, max downtime %llu ms%s",
		 key, cv_mode_str(p->mode),
		 p->shadow ? " (shadow: decides and logs, never acts)" : "", w->b->ops->name,
		 p->allow_auto_converge ? "on" : "off", p->allow_post_copy ? "on" : "off",
		 p->allow_workload_disruption ? "on" : "off",
		 (unsigned long long)p->completion_timeout_per_gib,
		 (unsigned long long)p->progress_timeout_s, (unsigned long long)p->max_downtime_ms,
		 p->max_downtime_ms ? "" : " (the hypervisor's)");
	if (spec->ignored[0])
		log_info("migration %s role=source: convergence: policy fields vmigd does not use, "
			 "ignored: %s",
			 key, spec->ignored);
	return 0;
fail:
	watch_free(w);
	return r;
}

bool cv_watch_stop(struct cv_set *set, const char *key, struct cv_report *last)
{
	struct cv_watch **pp = &set->watches, *w;

	while (*pp && strcmp((*pp)->key, key))
		pp = &(*pp)->next;
	w = *pp;
	if (!w)
		return false;
	pthread_mutex_lock(&set->lock);
	*pp = w->next;
	pthread_mutex_unlock(&set->lock);
	watch_join(w);
	if (last)
		*last = w->rep; /* the thread is gone: no lock to take */
	watch_free(w);
	return true;
}

void cv_watch_hold(struct cv_set *set, const char *key, bool hold, const char *why)
{
	struct cv_watch *w;

	pthread_mutex_lock(&set->lock);
	w = find(set, key);
	if (w) {
		pthread_mutex_lock(&w->lock);
		if (hold && !w->held) {
			w->held = true;
			w->held_since_ms = mono_ms();
		} else if (!hold && w->held) {
			w->held = false;
			w->held_total_ms += mono_ms() - w->held_since_ms;
		}
		snprintf(w->held_why, sizeof(w->held_why), "%s", why ? why : "");
		pthread_mutex_unlock(&w->lock);
		if (hold)
			log_warn("migration %s role=source: convergence: held (%s)", key, why);
		else
			log_info("migration %s role=source: convergence: goes on (%s)", key, why);
	}
	pthread_mutex_unlock(&set->lock);
}

void cv_watch_set_link(struct cv_set *set, const char *key, uint64_t speed)
{
	struct cv_watch *w;

	pthread_mutex_lock(&set->lock);
	w = find(set, key);
	if (w) {
		pthread_mutex_lock(&w->lock);
		w->px.link_speed = speed;
		pthread_mutex_unlock(&w->lock);
	}
	pthread_mutex_unlock(&set->lock);
}

bool cv_watch_report(struct cv_set *set, const char *key, struct cv_report *out)
{
	struct cv_watch *w;

	pthread_mutex_lock(&set->lock);
	w = find(set, key);
	if (w) {
		pthread_mutex_lock(&w->lock);
		*out = w->rep;
		pthread_mutex_unlock(&w->lock);
	}
	pthread_mutex_unlock(&set->lock);
	return w != NULL;
}
