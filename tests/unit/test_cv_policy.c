// SPDX-License-Identifier: Apache-2.0
/* cv_decide() as a pure function: each case is a policy and a timeline of samples, with the
 * action expected at each one (and a phrase its reason must hold). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cv_policy.h"

#define MI (1024ull * 1024ull)
#define END { -1, CV_ST_NONE, 0, 0, 0, 0, 0, CV_ACT_NONE, NULL }

struct sample {
	int64_t t_ms;
	enum cv_status st;
	uint64_t dirty_mib; /* QEMU's dirty rate, MiB/s */
	uint64_t syncs;
	uint64_t wire_mib; /* vmigd's 1-s rate */
	uint64_t remaining_mib;
	unsigned int throttle;
	enum cv_act expect;
	const char *reason_has; /* NULL: not checked */
};

struct env {
	uint64_t cap_mib, node_cap_mib, node_rate_mib, stream_dirty_mib, total_mib;
};

struct policy_case {
	const char *name;
	enum cv_mode mode;
	bool ac, pc, wd;	  /* allow auto-converge, post-copy, workload disruption */
	uint64_t per_gib, progress_s; /* 0: off */
	struct env env;
	struct sample s[24];
};

#define A CV_ST_ACTIVE
#define NONE CV_ACT_NONE, NULL

static const struct policy_case cases[] = {
	{ "predictive: low dirty rate, nothing to do", CV_MODE_PREDICTIVE, true, true, true, 150,
	  150, { 32, 0, 0, 0, 256 },
	  { { 0, CV_ST_SETUP, 0, 0, 0, 256, 0, NONE },
	    { 1000, A, 0, 1, 32, 200, 0, NONE },
	    { 2000, A, 8, 2, 32, 100, 0, NONE },
	    { 4000, A, 8, 3, 32, 40, 0, NONE },
	    { 6000, A, 8, 4, 32, 10, 0, NONE },
	    { 8000, A, 8, 5, 32, 3, 0, NONE },
	    END } },
	{ "predictive: dirty at the link, nothing allowed: abort after the window",
	  CV_MODE_PREDICTIVE, false, false, false, 150, 150, { 32, 0, 0, 0, 256 },
	  { { 1000, A, 0, 1, 32, 200, 0, NONE },
	    { 2000, A, 32, 2, 32, 64, 0, NONE },
	    { 3000, A, 32, 2, 32, 64, 0, NONE },
	    { 4000, A, 32, 3, 32, 63, 0, CV_ACT_ABORT,
	      "cannot converge: dirty 32.0 MiB/s >= link 32.0 MiB/s" },
	    { 5000, A, 32, 3, 32, 64, 0, NONE },
	    END } },
	{ "predictive: 0.85 of the link is left alone", CV_MODE_PREDICTIVE, false, false, false,
	  150, 150, { 32, 0, 0, 0, 256 },
	  { { 2000, A, 27, 2, 32, 64, 0, NONE },
	    { 5000, A, 27, 3, 32, 60, 0, NONE },
	    { 9000, A, 27, 4, 32, 55, 0, NONE },
	    END } },
	{ "predictive: auto-converge first, then abort once it had its grace", CV_MODE_PREDICTIVE,
	  true, false, false, 150, 150, { 32, 0, 0, 0, 256 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, CV_ACT_THROTTLE, "throttle the guest 60% + 20%/sync" },
	    { 5000, A, 40, 3, 32, 63, 0, NONE }, /* no sync since: not judged */
	    { 6000, A, 36, 4, 32, 62, 40, NONE },
	    { 9000, A, 34, 5, 32, 61, 60, NONE },
	    { 13000, A, 33, 6, 32, 60, 80, NONE },
	    { 14500, A, 33, 7, 32, 59, 90, CV_ACT_ABORT, "cannot converge" },
	    END } },
	{ "predictive: auto-converge's grace is counted in syncs, not seconds", CV_MODE_PREDICTIVE,
	  true, false, false, 150, 150, { 32, 0, 0, 0, 1024 },
	  { { 8000, A, 40, 2, 32, 250, 0, NONE },
	    { 10300, A, 40, 2, 32, 239, 0, CV_ACT_THROTTLE, NULL },
	    { 16000, A, 40, 3, 32, 250, 0, NONE },
	    { 24000, A, 40, 4, 32, 250, 60, NONE },
	    { 31000, A, 38, 5, 32, 200, 60, NONE },
	    { 38000, A, 38, 6, 32, 180, 80, CV_ACT_ABORT, "cannot converge" },
	    END } },
	{ "predictive: auto-converge that works leaves the rest", CV_MODE_PREDICTIVE, true, true,
	  true, 150, 150, { 32, 0, 0, 0, 256 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, CV_ACT_THROTTLE, NULL },
	    { 6000, A, 24, 4, 32, 40, 40, NONE },
	    { 8000, A, 12, 5, 32, 12, 60, NONE },
	    { 16000, A, 12, 6, 32, 10, 60, NONE },
	    END } },
	{ "predictive: throttle at its top moves on at once to post-copy", CV_MODE_PREDICTIVE,
	  true, true, true, 150, 150, { 32, 0, 0, 0, 256 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, CV_ACT_THROTTLE, NULL },
	    { 5000, A, 40, 4, 32, 64, 99, NONE },
	    { 7000, A, 40, 5, 32, 64, 99, CV_ACT_POSTCOPY, "switch to post-copy" },
	    { 9000, CV_ST_POSTCOPY, 40, 5, 32, 64, 99, NONE },
	    END } },
	{ "predictive: post-copy allowed, no auto-converge", CV_MODE_PREDICTIVE, false, true, true,
	  150, 150, { 32, 0, 0, 0, 256 },
	  { { 2000, A, 48, 2, 32, 64, 0, NONE },
	    { 4500, A, 48, 3, 32, 64, 0, CV_ACT_POSTCOPY, "dirty 48.0 MiB/s (qemu)" },
	    { 6000, A, 48, 4, 32, 64, 0, NONE }, /* QEMU not yet in post-copy: never twice */
	    { 9000, A, 48, 5, 32, 64, 0, NONE },
	    END } },
	{ "predictive: post-copy needs workload disruption too", CV_MODE_PREDICTIVE, false, true,
	  false, 150, 150, { 32, 0, 0, 0, 256 },
	  { { 2000, A, 48, 2, 32, 64, 0, NONE },
	    { 4500, A, 48, 3, 32, 64, 0, CV_ACT_ABORT, "cannot converge" },
	    END } },
	{ "predictive: disruption alone pauses, once", CV_MODE_PREDICTIVE, false, false, true, 150,
	  150, { 32, 0, 0, 0, 256 },
	  { { 2000, A, 48, 2, 32, 64, 0, NONE },
	    { 4000, A, 48, 3, 32, 64, 0, CV_ACT_PAUSE, "pause the guest" },
	    { 6000, A, 0, 4, 32, 20, 0, NONE },
	    { 9000, A, 40, 5, 32, 20, 0, NONE },
	    END } },
	{ "predictive: node headroom first", CV_MODE_PREDICTIVE, false, false, false, 150, 150,
	  { 32, 100, 40, 0, 256 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, CV_ACT_RAISE_CAP, "cap 32.0 -> 92.0 MiB/s" },
	    { 6000, A, 40, 4, 92, 30, 0, NONE },
	    { 8000, A, 40, 5, 92, 10, 0, NONE },
	    END } },
	{ "predictive: no node cap, no headroom step", CV_MODE_PREDICTIVE, true, false, false,
	  150, 150, { 32, 0, 32, 0, 256 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, CV_ACT_THROTTLE, NULL },
	    END } },
	{ "predictive: the stream's estimate before QEMU has one", CV_MODE_PREDICTIVE, false,
	  false, false, 150, 150, { 32, 0, 0, 40, 256 },
	  { { 1000, A, 0, 1, 32, 200, 0, NONE },
	    { 3100, A, 0, 1, 32, 150, 0, CV_ACT_ABORT, "(stream)" },
	    END } },
	{ "predictive: evidence that lapses starts over", CV_MODE_PREDICTIVE, false, false, false,
	  150, 150, { 32, 0, 0, 0, 256 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 3000, A, 20, 3, 32, 50, 0, NONE },
	    { 4500, A, 40, 4, 32, 50, 0, NONE },
	    { 6000, A, 40, 4, 32, 49, 0, NONE },
	    { 6600, A, 40, 5, 32, 48, 0, CV_ACT_ABORT, "for 2.1 s" },
	    END } },
	{ "predictive: switchover and post-copy are left alone", CV_MODE_PREDICTIVE, false, false,
	  false, 150, 150, { 32, 0, 0, 0, 256 },
	  { { 2000, CV_ST_SWITCHOVER, 40, 2, 32, 1, 0, NONE },
	    { 5000, CV_ST_SWITCHOVER, 40, 2, 32, 1, 0, NONE },
	    { 6000, CV_ST_POSTCOPY, 40, 2, 32, 1, 0, NONE },
	    { 9000, A, 40, 3, 32, 1, 0, NONE },
	    END } },
	{ "predictive: no progress for progressTimeout aborts", CV_MODE_PREDICTIVE, false, false,
	  false, 150, 3, { 32, 0, 0, 0, 256 },
	  { { 1000, A, 0, 1, 0, 100, 0, NONE },
	    { 2000, A, 0, 1, 0, 100, 0, NONE },
	    { 4100, A, 0, 1, 0, 100, 0, CV_ACT_ABORT, "progressTimeout 3 s" },
	    END } },
	{ "kubevirt: past the deadline with post-copy", CV_MODE_KUBEVIRT, false, true, true, 2, 0,
	  { 0, 0, 0, 0, 256 },
	  { { 400, A, 48, 1, 32, 200, 0, NONE },
	    { 1600, A, 48, 2, 32, 64, 0, NONE },
	    { 2000, A, 48, 2, 32, 63, 0, NONE },
	    { 2400, A, 48, 3, 32, 64, 0, CV_ACT_POSTCOPY,
	      "acceptable 2 s: completionTimeoutPerGiB 2 x 1 GB" },
	    { 6000, A, 48, 4, 32, 64, 0, NONE },
	    END } },
	{ "kubevirt: past the deadline without disruption aborts", CV_MODE_KUBEVIRT, true, true,
	  false, 2, 0, { 0, 0, 0, 0, 256 },
	  { { 400, A, 48, 1, 32, 200, 0, NONE },
	    { 2400, A, 48, 3, 32, 64, 0, CV_ACT_ABORT, "not completed after 2 s" },
	    { 2800, A, 48, 3, 32, 64, 0, NONE },
	    END } },
	{ "kubevirt: pause doubles the deadline, then abort", CV_MODE_KUBEVIRT, false, false, true,
	  2, 0, { 0, 0, 0, 0, 256 },
	  { { 400, A, 48, 1, 32, 200, 0, NONE },
	    { 2400, A, 48, 3, 32, 64, 0, CV_ACT_PAUSE, NULL },
	    { 3600, A, 0, 4, 32, 60, 0, NONE },
	    { 4400, A, 0, 4, 32, 59, 0, CV_ACT_ABORT, "acceptable 4 s" },
	    END } },
	{ "kubevirt: stuck for progressTimeout", CV_MODE_KUBEVIRT, false, false, false, 0, 2,
	  { 0, 0, 0, 0, 4096 },
	  { { 400, A, 48, 1, 32, 100, 0, NONE },
	    { 800, A, 48, 1, 32, 100, 0, NONE },
	    { 2000, A, 48, 1, 32, 120, 0, NONE },
	    { 2800, A, 48, 1, 32, 120, 0, CV_ACT_ABORT, "stuck" },
	    END } },
	{ "kubevirt: any decrease is progress, and 0 disables the deadline", CV_MODE_KUBEVIRT,
	  false, false, false, 0, 2, { 0, 0, 0, 0, 4096 },
	  { { 400, A, 48, 1, 32, 100, 0, NONE },
	    { 1800, A, 48, 1, 32, 120, 0, NONE },
	    { 2200, A, 48, 1, 32, 119, 0, NONE },
	    { 3600, A, 48, 1, 32, 121, 0, NONE },
	    { 4000, A, 48, 1, 32, 118, 0, NONE },
	    { 9000, A, 48, 1, 32, 117, 0, NONE },
	    END } },
	{ "kubevirt: the deadline rounds memory up to decimal GB", CV_MODE_KUBEVIRT, false, false,
	  false, 1, 0, { 0, 0, 0, 0, 1000 }, /* 1000 MiB = 1.05 GB: 2 GB */
	  { { 400, A, 48, 1, 32, 900, 0, NONE },
	    { 1800, A, 48, 2, 32, 800, 0, NONE },
	    { 2100, A, 48, 2, 32, 700, 0, CV_ACT_ABORT, "x 2 GB" },
	    END } },
};

static void run_case(const struct policy_case *c)
{
	struct cv_policy p;
	struct cv_state st;

	cv_policy_default(&p);
	p.mode = c->mode;
	p.allow_auto_converge = c->ac;
	p.allow_post_copy = c->pc;
	p.allow_workload_disruption = c->wd;
	p.completion_timeout_per_gib = c->per_gib;
	p.progress_timeout_s = c->progress_s;
	p.bandwidth = c->env.cap_mib * MI;
	cv_state_init(&st);
	for (const struct sample *s = c->s; s->t_ms >= 0; s++) {
		struct cv_inputs in = { 0 };
		struct cv_action a;

		in.now_ms = s->t_ms;
		in.have_job = true;
		in.job.status = s->st;
		in.job.total = c->env.total_mib * MI;
		in.job.remaining = s->remaining_mib * MI;
		in.job.dirty_rate = s->dirty_mib * MI;
		in.job.dirty_syncs = s->syncs;
		in.job.throttle_pct = s->throttle;
		in.wire_rate = s->wire_mib * MI;
		in.cap = c->env.cap_mib * MI;
		in.node_cap = c->env.node_cap_mib * MI;
		in.node_rate = c->env.node_rate_mib * MI;
		in.stream_dirty_rate = c->env.stream_dirty_mib * MI;
		cv_decide(&p, &st, &in, &a);
		if (a.act != s->expect)
			fail_msg("%s: at %lld ms: %s, expected %s (%s)", c->name,
				 (long long)s->t_ms, cv_act_str(a.act), cv_act_str(s->expect),
				 a.reason);
		if (s->reason_has && !strstr(a.reason, s->reason_has))
			fail_msg("%s: at %lld ms: reason \"%s\" lacks \"%s\"", c->name,
				 (long long)s->t_ms, a.reason, s->reason_has);
		if (a.act == CV_ACT_THROTTLE)
			assert_true(a.throttle_initial > 0 && a.throttle_step > 0);
	}
}

static void test_cases(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_case(&cases[i]);
}

/* No job this time (the backend failed): nothing is decided and nothing is recorded. */
static void test_no_job(void **state)
{
	struct cv_policy p;
	struct cv_state st;
	struct cv_inputs in = { .now_ms = 100000 };
	struct cv_action a;

	(void)state;
	cv_policy_default(&p);
	cv_state_init(&st);
	cv_decide(&p, &st, &in, &a);
	assert_int_equal(a.act, CV_ACT_NONE);
	assert_int_equal(st.done, 0);
}

/* A step the hypervisor refused (the monitor clears it): the ladder goes on past it. */
static void test_refused_step(void **state)
{
	struct cv_policy p;
	struct cv_state st;
	struct cv_inputs in = { .have_job = true };
	struct cv_action a;

	(void)state;
	cv_policy_default(&p);
	p.mode = CV_MODE_KUBEVIRT;
	p.allow_post_copy = p.allow_workload_disruption = true;
	p.completion_timeout_per_gib = 2;
	cv_state_init(&st);
	in.job.status = CV_ST_ACTIVE;
	in.job.total = 256 * MI;
	in.job.remaining = 64 * MI;
	in.now_ms = 2400;
	cv_decide(&p, &st, &in, &a);
	assert_int_equal(a.act, CV_ACT_POSTCOPY);
	st.postcopy = false; /* QEMU said no */
	in.now_ms = 2800;
	in.job.remaining = 63 * MI;
	cv_decide(&p, &st, &in, &a);
	assert_int_equal(a.act, CV_ACT_ABORT);

	/* predictive: a refused post-copy moves on to pause after new evidence. */
	cv_policy_default(&p);
	p.allow_post_copy = p.allow_workload_disruption = true;
	cv_state_init(&st);
	in.job.dirty_rate = 48 * MI;
	in.wire_rate = 32 * MI;
	in.job.dirty_syncs = 2;
	in.now_ms = 2000;
	cv_decide(&p, &st, &in, &a);
	assert_int_equal(a.act, CV_ACT_NONE);
	in.job.dirty_syncs = 3;
	in.now_ms = 4000;
	cv_decide(&p, &st, &in, &a);
	assert_int_equal(a.act, CV_ACT_POSTCOPY);
	st.postcopy = false;
	in.job.dirty_syncs = 4;
	in.now_ms = 5000;
	cv_decide(&p, &st, &in, &a);
	assert_int_equal(a.act, CV_ACT_NONE);
	in.now_ms = 7000;
	in.job.remaining = 60 * MI;
	cv_decide(&p, &st, &in, &a);
	assert_int_equal(a.act, CV_ACT_PAUSE);
}

static void test_names(void **state)
{
	(void)state;
	assert_string_equal(cv_act_str(CV_ACT_THROTTLE), "auto-converge");
	assert_string_equal(cv_mode_str(CV_MODE_KUBEVIRT), "kubevirt");
	assert_string_equal(cv_status_str(CV_ST_POSTCOPY), "postcopy-active");
	assert_string_equal(cv_status_str((enum cv_status)99), "unknown");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cases),
		cmocka_unit_test(test_no_job),
		cmocka_unit_test(test_refused_step),
		cmocka_unit_test(test_names),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
