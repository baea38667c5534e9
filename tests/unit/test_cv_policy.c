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
	uint64_t cap_mib, node_cap_mib, node_rate_mib, total_mib;
	uint64_t link_mib; /* the node hop's link speed; 0: unknown */
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

/* clang-format off */
static const struct policy_case cases[] = {
	{ "predictive: low dirty rate, nothing to do",
	  CV_MODE_PREDICTIVE, true, true, true, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 0, CV_ST_SETUP, 0, 0, 0, 256, 0, NONE },
	    { 1000, A, 0, 1, 32, 200, 0, NONE },
	    { 2000, A, 8, 2, 32, 100, 0, NONE },
	    { 4000, A, 8, 3, 32, 40, 0, NONE },
	    { 6000, A, 8, 4, 32, 10, 0, NONE },
	    { 8000, A, 8, 5, 32, 3, 0, NONE },
	    END } },
	{ "predictive: no new low for 3 passes, nothing allowed: abort, saying so",
	  CV_MODE_PREDICTIVE, false, false, false, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 1000, A, 0, 1, 32, 200, 0, NONE },
	    { 2000, A, 32, 2, 32, 64, 0, NONE },
	    { 4000, A, 32, 3, 32, 64, 0, NONE },
	    { 5000, A, 32, 3, 32, 40, 0, NONE }, /* within a pass: not judged */
	    { 6000, A, 32, 4, 32, 63, 0, NONE },
	    { 8000, A, 32, 5, 32, 64, 0, CV_ACT_ABORT,
	      "remaining 64.0/64.0/63.0/64.0 MiB (low 63.0), 3 without a new low, expected "
	      "downtime 2000 ms (allowed 300)" },
	    { 9000, A, 32, 6, 32, 64, 0, NONE },
	    END } },
	{ "predictive: the abort names every action it had",
	  CV_MODE_PREDICTIVE, false, false, false, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 32, 2, 32, 64, 0, NONE },
	    { 4000, A, 32, 3, 32, 64, 0, NONE },
	    { 6000, A, 32, 4, 32, 64, 0, NONE },
	    { 8000, A, 32, 5, 32, 64, 0, CV_ACT_ABORT,
	      "no action left: auto-converge not allowed, post-copy not allowed, no node "
	      "headroom" },
	    END } },
	{ "predictive: dirty above the link, remaining falls each pass: no action",
	  CV_MODE_PREDICTIVE, true, true, true, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 56, 0, NONE },
	    { 6000, A, 40, 4, 32, 49, 0, NONE },
	    { 8000, A, 40, 5, 32, 43, 0, NONE },
	    { 10000, A, 40, 6, 32, 37, 0, NONE },
	    { 12000, A, 40, 7, 32, 32, 0, NONE },
	    { 14000, A, 40, 8, 32, 28, 0, NONE },
	    END } },
	{ "predictive: bursts that reach a new low in between: no action",
	  CV_MODE_PREDICTIVE, true, false, false, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, NONE },
	    { 6000, A, 40, 4, 32, 64, 0, NONE },
	    { 8000, A, 10, 5, 32, 20, 0, NONE },
	    { 10000, A, 40, 6, 32, 64, 0, NONE },
	    { 12000, A, 40, 7, 32, 64, 0, NONE },
	    { 14000, A, 5, 8, 32, 12, 0, NONE },
	    END } },
	/* A 3 s burst, 5 s quiet guest as CI met it: the two ends of a projection window happened
	 * to be equal (60/12/25/60), and three passes of a burst held for 2 s. Neither is evidence. */
	{ "predictive: a bursty guest's passes go up and down: no projection, no stall",
	  CV_MODE_PREDICTIVE, true, false, false, 150, 150, { 16, 0, 0, 256, 0 },
	  { { 4000, A, 16, 2, 16, 61, 0, NONE },
	    { 7800, A, 16, 3, 16, 12, 0, NONE },
	    { 8600, A, 16, 4, 16, 25, 0, NONE },
	    { 10200, A, 16, 5, 16, 60, 0, NONE }, /* ends 61 and 60: not a slow fall */
	    { 14000, A, 16, 6, 16, 30, 0, NONE }, /* three without a new low, up and down */
	    { 15900, A, 16, 7, 16, 13, 0, NONE }, /* back near the low: the burst ended */
	    { 16700, A, 16, 8, 16, 28, 0, NONE },
	    { 18500, A, 16, 9, 16, 60, 0, NONE },
	    { 22300, A, 16, 10, 16, 35, 0, NONE },
	    { 24500, A, 16, 11, 16, 12, 0, NONE },
	    { 25300, A, 16, 12, 16, 4, 0, NONE },
	    END } },
	{ "predictive: passes that rose above the low need 20 s, not the window",
	  CV_MODE_PREDICTIVE, true, false, false, 150, 150, { 16, 0, 0, 256, 0 },
	  { { 4000, A, 16, 2, 16, 61, 0, NONE },
	    { 7800, A, 16, 3, 16, 30, 0, NONE },
	    { 9700, A, 16, 4, 16, 13, 0, NONE },
	    { 10500, A, 16, 5, 16, 17, 0, NONE },
	    { 11600, A, 16, 6, 16, 23, 0, NONE },
	    { 13000, A, 16, 7, 16, 22, 0, NONE }, /* 3 passes for 2.5 s: steady, it would act */
	    { 14400, A, 16, 8, 16, 14, 0, NONE },
	    { 15300, A, 16, 9, 16, 20, 0, NONE },
	    { 16600, A, 16, 10, 16, 3, 0, NONE },
	    END } },
	{ "predictive: a burst that does not end is judged after 20 s",
	  CV_MODE_PREDICTIVE, true, false, false, 150, 150, { 16, 0, 0, 256, 0 },
	  { { 4000, A, 16, 2, 16, 61, 0, NONE },
	    { 7800, A, 16, 3, 16, 12, 0, NONE },
	    { 8600, A, 16, 4, 16, 60, 0, NONE },
	    { 12400, A, 16, 5, 16, 60, 0, NONE },
	    { 16200, A, 16, 6, 16, 61, 0, NONE },
	    { 20000, A, 16, 7, 16, 60, 0, NONE },
	    { 23800, A, 16, 8, 16, 60, 0, NONE },
	    { 27600, A, 16, 9, 16, 60, 0, NONE },
	    { 31400, A, 16, 10, 16, 60, 0, CV_ACT_THROTTLE,
	      "7 without a new low (up and down: held 20 s)" },
	    END } },
	{ "predictive: a guest that keeps coming back to the same low waits for the deadline",
	  CV_MODE_PREDICTIVE, true, false, false, 30, 150, { 16, 0, 0, 256, 0 },
	  { { 4000, A, 16, 2, 16, 61, 0, NONE },
	    { 7800, A, 16, 3, 16, 12, 0, NONE },
	    { 8600, A, 16, 4, 16, 60, 0, NONE },
	    { 12400, A, 16, 5, 16, 40, 0, NONE },
	    { 14900, A, 16, 6, 16, 12, 0, NONE },
	    { 15700, A, 16, 7, 16, 60, 0, NONE },
	    { 19500, A, 16, 8, 16, 40, 0, NONE },
	    { 22000, A, 16, 9, 16, 12, 0, NONE },
	    { 22800, A, 16, 10, 16, 60, 0, NONE },
	    { 26600, A, 16, 11, 16, 40, 0, NONE },
	    { 29100, A, 16, 12, 16, 12, 0, NONE },
	    { 29900, A, 16, 13, 16, 60, 0, NONE },
	    { 30500, A, 16, 13, 16, 60, 0, CV_ACT_THROTTLE, "acceptable 30 s" },
	    END } },
	{ "predictive: a pass within the downtime is convergence",
	  CV_MODE_PREDICTIVE, false, false, false, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 32, 2, 32, 9, 0, NONE },
	    { 3000, A, 32, 3, 32, 9, 0, NONE },
	    { 4000, A, 32, 4, 32, 9, 0, NONE },
	    { 5000, A, 32, 5, 32, 9, 0, NONE },
	    { 6000, A, 32, 6, 32, 9, 0, NONE },
	    END } },
	{ "predictive: falling, but too slowly for twice the deadline",
	  CV_MODE_PREDICTIVE, false, false, false, 10, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 30, 2, 32, 64, 0, NONE },
	    { 4000, A, 30, 3, 32, 58, 0, NONE },
	    { 6000, A, 30, 4, 32, 52, 0, NONE }, /* too few passes to project from */
	    { 8000, A, 30, 5, 32, 47, 0, CV_ACT_ABORT, "too slow for the deadline" },
	    END } },
	{ "predictive: too slow for the deadline: escalate, but no abort while it falls",
	  CV_MODE_PREDICTIVE, true, false, false, 20, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 30, 2, 32, 64, 0, NONE },
	    { 4000, A, 30, 3, 32, 58, 0, NONE },
	    { 6000, A, 30, 4, 32, 52, 0, NONE },
	    { 8000, A, 30, 5, 32, 47, 0, CV_ACT_THROTTLE, "too slow for the deadline" },
	    { 10000, A, 30, 6, 32, 44, 60, NONE },
	    { 21000, A, 30, 7, 32, 40, 99, NONE }, /* past the deadline, still falling */
	    { 23000, A, 30, 8, 32, 36, 99, NONE }, /* projected within 40 s: no abort */
	    { 41000, A, 30, 9, 32, 33, 99, CV_ACT_ABORT, "cannot converge in time" },
	    END } },
	{ "predictive: falling fast enough for the deadline",
	  CV_MODE_PREDICTIVE, false, false, false, 60, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 30, 2, 32, 64, 0, NONE },
	    { 4000, A, 30, 3, 32, 58, 0, NONE },
	    { 6000, A, 30, 4, 32, 52, 0, NONE },
	    { 8000, A, 30, 5, 32, 47, 0, NONE },
	    { 10000, A, 30, 6, 32, 42, 0, NONE },
	    END } },
	{ "predictive: the window holds the evidence back",
	  CV_MODE_PREDICTIVE, false, false, false, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 32, 2, 32, 12, 0, NONE },
	    { 2500, A, 32, 3, 32, 12, 0, NONE },
	    { 3000, A, 32, 4, 32, 12, 0, NONE },
	    { 3500, A, 32, 5, 32, 12, 0, NONE },
	    { 4400, A, 32, 6, 32, 12, 0, NONE },
	    { 4600, A, 32, 7, 32, 12, 0, CV_ACT_ABORT, NULL },
	    END } },
	{ "predictive: auto-converge, then abort only with the throttle at its top",
	  CV_MODE_PREDICTIVE, true, false, false, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, NONE },
	    { 6000, A, 40, 4, 32, 64, 0, NONE },
	    { 8000, A, 40, 5, 32, 64, 0, CV_ACT_THROTTLE, "throttle the guest 60% + 20%/sync" },
	    { 10000, A, 36, 6, 32, 64, 60, NONE },
	    { 12000, A, 34, 7, 32, 64, 60, NONE },
	    { 14000, A, 33, 8, 32, 64, 80, NONE },
	    { 16000, A, 33, 9, 32, 64, 80, NONE }, /* evidence again, but 80% < 99% */
	    { 18000, A, 33, 10, 32, 64, 99, NONE },
	    { 20000, A, 33, 11, 32, 64, 99, CV_ACT_ABORT,
	      "auto-converge at 99% (dirty 40.0 MiB/s at 0%, 33.0 now)" },
	    END } },
	{ "predictive: auto-converge that works leaves the rest",
	  CV_MODE_PREDICTIVE, true, true, true, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, NONE },
	    { 6000, A, 40, 4, 32, 64, 0, NONE },
	    { 8000, A, 40, 5, 32, 64, 0, CV_ACT_THROTTLE, NULL },
	    { 10000, A, 24, 6, 32, 64, 60, NONE },
	    { 12000, A, 24, 7, 32, 64, 80, NONE },
	    { 14000, A, 12, 8, 32, 40, 99, NONE },
	    { 16000, A, 12, 9, 32, 20, 99, NONE },
	    { 18000, A, 12, 10, 32, 12, 99, NONE },
	    END } },
	{ "predictive: throttle at its top moves on to post-copy",
	  CV_MODE_PREDICTIVE, true, true, true, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, NONE },
	    { 6000, A, 40, 4, 32, 64, 0, NONE },
	    { 8000, A, 40, 5, 32, 64, 0, CV_ACT_THROTTLE, NULL },
	    { 10000, A, 40, 6, 32, 64, 99, NONE },
	    { 12000, A, 40, 7, 32, 64, 99, NONE },
	    { 14000, A, 40, 8, 32, 64, 99, NONE },
	    { 16000, A, 40, 9, 32, 64, 99, CV_ACT_POSTCOPY, "switch to post-copy" },
	    { 17000, CV_ST_POSTCOPY, 40, 9, 32, 64, 99, NONE },
	    END } },
	{ "predictive: post-copy allowed, no auto-converge",
	  CV_MODE_PREDICTIVE, false, true, true, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 48, 2, 32, 64, 0, NONE },
	    { 4000, A, 48, 3, 32, 64, 0, NONE },
	    { 6000, A, 48, 4, 32, 64, 0, NONE },
	    { 8000, A, 48, 5, 32, 64, 0, CV_ACT_POSTCOPY, "3 without a new low" },
	    { 10000, A, 48, 6, 32, 64, 0, NONE }, /* QEMU not yet in post-copy: never twice */
	    { 20000, A, 48, 11, 32, 64, 0, NONE },
	    END } },
	{ "predictive: post-copy needs workload disruption too",
	  CV_MODE_PREDICTIVE, false, true, false, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 48, 2, 32, 64, 0, NONE },
	    { 4000, A, 48, 3, 32, 64, 0, NONE },
	    { 6000, A, 48, 4, 32, 64, 0, NONE },
	    { 8000, A, 48, 5, 32, 64, 0, CV_ACT_ABORT, "post-copy refused" },
	    END } },
	{ "predictive: disruption alone pauses, once",
	  CV_MODE_PREDICTIVE, false, false, true, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 48, 2, 32, 64, 0, NONE },
	    { 4000, A, 48, 3, 32, 64, 0, NONE },
	    { 6000, A, 48, 4, 32, 64, 0, NONE },
	    { 8000, A, 48, 5, 32, 64, 0, CV_ACT_PAUSE, "pause the guest" },
	    { 9000, A, 0, 6, 32, 64, 0, NONE },
	    { 10000, A, 0, 7, 32, 64, 0, NONE },
	    { 11000, A, 0, 8, 32, 64, 0, NONE },
	    { 12000, A, 0, 9, 32, 64, 0, NONE },
	    END } },
	{ "predictive: node headroom first", CV_MODE_PREDICTIVE, false, false, false, 150, 150,
	  { 32, 100, 40, 256, 0 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, NONE },
	    { 6000, A, 40, 4, 32, 64, 0, NONE },
	    { 8000, A, 40, 5, 32, 64, 0, CV_ACT_RAISE_CAP, "cap 32.0 -> 92.0 MiB/s" },
	    { 9000, A, 40, 6, 92, 30, 0, NONE },
	    { 10000, A, 40, 7, 92, 10, 0, NONE },
	    END } },
	/* The same with an 80 MiB/s link under the 100 MiB/s node cap: room up to the link. */
	{ "predictive: node headroom held to the link", CV_MODE_PREDICTIVE, false, false, false, 150,
	  150, { 32, 100, 40, 256, 80 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, NONE },
	    { 6000, A, 40, 4, 32, 64, 0, NONE },
	    { 8000, A, 40, 5, 32, 64, 0, CV_ACT_RAISE_CAP,
	      "cap 32.0 -> 72.0 MiB/s (node headroom, held to the link's speed)" },
	    END } },
	/* A 36 MiB/s link leaves no room worth a step: nothing else allowed, so the abort. */
	{ "predictive: a link too slow for the node cap is no headroom", CV_MODE_PREDICTIVE, false,
	  false, false, 150, 150, { 32, 100, 40, 256, 36 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, NONE },
	    { 6000, A, 40, 4, 32, 64, 0, NONE },
	    { 8000, A, 40, 5, 32, 64, 0, CV_ACT_ABORT, "no node headroom" },
	    END } },
	{ "stall: no new low against passes older than 40 s, nothing allowed",
	  CV_MODE_STALL, false, false, false, 0, 0, { 32, 0, 0, 256, 0 },
	  { { 5000, A, 40, 2, 32, 64, 0, NONE },
	    { 15000, A, 40, 3, 32, 64, 0, NONE },
	    { 30000, A, 40, 4, 32, 63, 0, NONE },
	    { 44000, A, 40, 5, 32, 64, 0, NONE }, /* no pass 40 s old yet */
	    { 46000, A, 40, 6, 32, 64, 0, CV_ACT_ABORT,
	      "abort_low_bandwidth: stall (since 46.0 s): pass 6: remaining 64.0 MiB, low before "
	      "the last 40 s 64.0 MiB" },
	    END } },
	{ "stall: a new low by the margin is progress", CV_MODE_STALL, false, false, false, 0, 0,
	  { 32, 0, 0, 256, 0 },
	  { { 5000, A, 40, 2, 32, 64, 0, NONE },
	    { 46000, A, 40, 3, 32, 61, 0, NONE },
	    { 60000, A, 40, 4, 32, 58, 0, NONE },
	    END } },
	{ "stall: pre-copy possible: relax the downtime, then switchoverTimeout",
	  CV_MODE_STALL, false, false, false, 0, 0, { 32, 0, 0, 256, 0 },
	  { { 5000, A, 40, 2, 32, 40, 0, NONE },
	    { 46000, A, 40, 3, 32, 40, 0, CV_ACT_DOWNTIME, "relax_downtime to 900 ms" },
	    { 100000, A, 40, 9, 32, 40, 0, NONE },
	    { 106100, A, 40, 10, 32, 40, 0, CV_ACT_ABORT, "abort_timeout: no switch-over 60 s" },
	    END } },
	{ "stall: post-copy at a local low of remaining", CV_MODE_STALL, false, true, true, 0, 0,
	  { 32, 0, 0, 256, 0 },
	  { { 5000, A, 40, 2, 32, 64, 0, NONE },
	    { 40000, A, 40, 3, 32, 50, 0, NONE },
	    { 46000, A, 40, 4, 32, 64, 0, NONE }, /* stall, but 50 MiB 6 s ago: wait */
	    { 50000, A, 40, 5, 32, 51, 0, CV_ACT_POSTCOPY, "switchover to post-copy" },
	    END } },
	{ "stall: completionTimeoutFactor x the completion time aborts",
	  CV_MODE_STALL, false, false, false, 2, 0, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 2, 32, 50, 0, NONE },
	    { 4100, A, 40, 3, 32, 64, 0, CV_ACT_ABORT, "abort_timeout: not completed after 4 s" },
	    END } },
	{ "predictive: switchover and post-copy are left alone",
	  CV_MODE_PREDICTIVE, false, false, false, 150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, CV_ST_SWITCHOVER, 40, 2, 32, 1, 0, NONE },
	    { 5000, CV_ST_SWITCHOVER, 40, 2, 32, 1, 0, NONE },
	    { 6000, CV_ST_POSTCOPY, 40, 2, 32, 1, 0, NONE },
	    { 9000, A, 40, 3, 32, 1, 0, NONE },
	    END } },
	{ "predictive: no progress for progressTimeout aborts",
	  CV_MODE_PREDICTIVE, false, false, false, 150, 3, { 32, 0, 0, 256, 0 },
	  { { 1000, A, 0, 1, 0, 100, 0, NONE },
	    { 2000, A, 0, 1, 0, 100, 0, NONE },
	    { 4100, A, 0, 1, 0, 100, 0, CV_ACT_ABORT, "progressTimeout 3 s" },
	    END } },
	{ "kubevirt: past the deadline with post-copy", CV_MODE_KUBEVIRT, false, true, true, 2, 0,
	  { 0, 0, 0, 256, 0 },
	  { { 400, A, 48, 1, 32, 200, 0, NONE },
	    { 1600, A, 48, 2, 32, 64, 0, NONE },
	    { 2000, A, 48, 2, 32, 63, 0, NONE },
	    { 2400, A, 48, 3, 32, 64, 0, CV_ACT_POSTCOPY,
	      "acceptable 2 s: completionTimeoutPerGiB 2 x 1 GB" },
	    { 6000, A, 48, 4, 32, 64, 0, NONE },
	    END } },
	{ "kubevirt: past the deadline without disruption aborts",
	  CV_MODE_KUBEVIRT, true, true, false, 2, 0, { 0, 0, 0, 256, 0 },
	  { { 400, A, 48, 1, 32, 200, 0, NONE },
	    { 2400, A, 48, 3, 32, 64, 0, CV_ACT_ABORT, "not completed after 2 s" },
	    { 2800, A, 48, 3, 32, 64, 0, NONE },
	    END } },
	{ "kubevirt: pause doubles the deadline, then abort",
	  CV_MODE_KUBEVIRT, false, false, true, 2, 0, { 0, 0, 0, 256, 0 },
	  { { 400, A, 48, 1, 32, 200, 0, NONE },
	    { 2400, A, 48, 3, 32, 64, 0, CV_ACT_PAUSE, NULL },
	    { 3600, A, 0, 4, 32, 60, 0, NONE },
	    { 4400, A, 0, 4, 32, 59, 0, CV_ACT_ABORT, "acceptable 4 s" },
	    END } },
	{ "kubevirt: stuck for progressTimeout", CV_MODE_KUBEVIRT, false, false, false, 0, 2,
	  { 0, 0, 0, 4096, 0 },
	  { { 400, A, 48, 1, 32, 100, 0, NONE },
	    { 800, A, 48, 1, 32, 100, 0, NONE },
	    { 2000, A, 48, 1, 32, 120, 0, NONE },
	    { 2800, A, 48, 1, 32, 120, 0, CV_ACT_ABORT, "stuck" },
	    END } },
	{ "kubevirt: any decrease is progress, and 0 disables the deadline",
	  CV_MODE_KUBEVIRT, false, false, false, 0, 2, { 0, 0, 0, 4096, 0 },
	  { { 400, A, 48, 1, 32, 100, 0, NONE },
	    { 1800, A, 48, 1, 32, 120, 0, NONE },
	    { 2200, A, 48, 1, 32, 119, 0, NONE },
	    { 3600, A, 48, 1, 32, 121, 0, NONE },
	    { 4000, A, 48, 1, 32, 118, 0, NONE },
	    { 9000, A, 48, 1, 32, 117, 0, NONE },
	    END } },
	{ "kubevirt: the deadline rounds memory up to decimal GB",
	  CV_MODE_KUBEVIRT,
	  false,
	  false,
	  false,
	  1,
	  0,
	  { 0, 0, 0, 1000, 0 }, /* 1000 MiB = 1.05 GB: 2 GB */
	  { { 400, A, 48, 1, 32, 900, 0, NONE },
	    { 1800, A, 48, 2, 32, 800, 0, NONE },
	    { 2100, A, 48, 2, 32, 700, 0, CV_ACT_ABORT, "x 2 GB" },
	    END } },
};
/* clang-format on */

/* vmigd may compress every chunk (cv_inputs.can_compress) in these */
static const struct policy_case zcases[] = {
	{ "predictive: compression before auto-converge", CV_MODE_PREDICTIVE, true, false, false,
	  150, 150, { 32, 0, 0, 256, 0 },
	  { { 2000, A, 40, 2, 32, 64, 0, NONE },
	    { 4000, A, 40, 3, 32, 64, 0, NONE },
	    { 6000, A, 40, 4, 32, 64, 0, NONE },
	    { 8000, A, 40, 5, 32, 64, 0, CV_ACT_COMPRESS,
	      "compress every chunk (0 of its connections compressed before)" },
	    { 10000, A, 40, 6, 32, 64, 0, NONE },
	    { 12000, A, 40, 7, 32, 64, 0, NONE },
	    { 14000, A, 40, 8, 32, 64, 0, NONE },
	    /* the passes show no new low with every chunk compressed either: the next rung */
	    { 16000, A, 40, 9, 32, 64, 0, CV_ACT_THROTTLE, "throttle the guest" },
	    { 18000, A, 40, 10, 32, 64, 60, NONE },
	    END } },
};
static bool zauto;

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
		in.link_speed = c->env.link_mib * MI;
		in.can_compress = zauto;
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
	zauto = true;
	for (size_t i = 0; i < sizeof(zcases) / sizeof(zcases[0]); i++)
		run_case(&zcases[i]);
	zauto = false;
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
	for (unsigned int sync = 2; sync <= 5; sync++) {
		in.job.dirty_syncs = sync;
		in.now_ms = sync * 2000;
		cv_decide(&p, &st, &in, &a);
		assert_int_equal(a.act, sync < 5 ? CV_ACT_NONE : CV_ACT_POSTCOPY);
	}
	st.postcopy = false;
	for (unsigned int sync = 6; sync <= 9; sync++) {
		in.job.dirty_syncs = sync;
		in.now_ms = sync * 2000;
		cv_decide(&p, &st, &in, &a);
		assert_int_equal(a.act, sync < 9 ? CV_ACT_NONE : CV_ACT_PAUSE);
	}
}

static void test_names(void **state)
{
	(void)state;
	assert_string_equal(cv_act_str(CV_ACT_THROTTLE), "auto-converge");
	assert_string_equal(cv_mode_str(CV_MODE_KUBEVIRT), "kubevirt");
	assert_string_equal(cv_mode_str(CV_MODE_STALL), "stall");
	assert_string_equal(cv_act_str(CV_ACT_DOWNTIME), "relax-downtime");
}

/* What prepare sets: the policy's downtime; stall mode starts at min(maxDowntimeMs, 300). */
static void test_start_downtime(void **state)
{
	struct cv_policy p;

	(void)state;
	cv_policy_default(&p);
	assert_int_equal(cv_start_downtime_ms(&p), 0);
	p.max_downtime_ms = 900;
	assert_int_equal(cv_start_downtime_ms(&p), 900);
	p.mode = CV_MODE_STALL;
	assert_int_equal(cv_start_downtime_ms(&p), 300);
	p.max_downtime_ms = 200;
	assert_int_equal(cv_start_downtime_ms(&p), 200);
	p.max_downtime_ms = 0;
	assert_int_equal(cv_start_downtime_ms(&p), 300);
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
		cmocka_unit_test(test_start_downtime),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
