// SPDX-License-Identifier: Apache-2.0
/* vmigd-test's hooks (ctl_test.h): --dpdk-test-impair LOSS,DUP,REORDER wraps the DPDK hop's port in
 * an impairing one (transport/xp_impair.c), whose counts are status's dpdk.*_by_test figures;
 * source-start's test_delay_first_ms field; and --test-wedge AFTER_MS,FOR_MS, which holds the
 * control loop. Design: a second daemon, not options of the product. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <json-c/json.h>

#include "ctl_figures.h"
#include "ctl_request.h"
#include "ctl_test.h"
#include "log.h"
#include "util.h"
#include "xp_impair.h"
#include "xp_loop.h"

#define OPT_IMPAIR "--dpdk-test-impair"
#define OPT_WEDGE  "--test-wedge"
#define WEDGE_MAX  600000

static struct xp_impair_conf impair;
static bool impaired;

static int parse_impair(const char *arg)
{
	unsigned int v[3];
	char tail;

	if (sscanf(arg, "%u,%u,%u%c", &v[0], &v[1], &v[2], &tail) == 3 && v[0] <= 50 &&
	    v[1] <= 50 && v[2] <= 50) {
		impair.loss_pct = v[0];
		impair.dup_pct = v[1];
		impair.reorder_pct = v[2];
		impaired = v[0] || v[1] || v[2];
		return 0;
	}
	fprintf(stderr,
		"vmigd: " OPT_IMPAIR ": expected LOSS,DUP,REORDER (percent, 0 to 50 each), got "
		"\"%s\"\n",
		arg);
	return -EINVAL;
}

static unsigned int wedge_after_ms, wedge_for_ms;

static int parse_wedge(const char *arg)
{
	unsigned int v[2];
	char tail;

	if (sscanf(arg, "%u,%u%c", &v[0], &v[1], &tail) == 2 && v[0] <= WEDGE_MAX &&
	    v[1] <= WEDGE_MAX) {
		wedge_after_ms = v[0];
		wedge_for_ms = v[1];
		return 0;
	}
	fprintf(stderr,
		"vmigd: " OPT_WEDGE ": expected AFTER_MS,FOR_MS (0 to %d each), got \"%s\"\n",
		WEDGE_MAX, arg);
	return -EINVAL;
}

/* The test options: each takes one argument, as "--name ARG" or "--name=ARG". */
static const struct {
	const char *name;
	int (*parse)(const char *arg);
} test_opts[] = {
	{ OPT_IMPAIR, parse_impair },
	{ OPT_WEDGE, parse_wedge },
};

/* The impairing port's counts, in the node's "dpdk" object on a node with a DPDK hop. */
/* clang-format off */
#define BY_TEST(m) \
	{ "dpdk." #m, CTL_COUNT, \
	  .get = CTL_MEMBER(struct px_node_info, dpdk.stats.m), \
	  .absent = CTL_OMIT, .when = CTL_MEMBER(struct px_node_info, dpdk.on) }
/* clang-format on */

static const struct ctl_fig node_figs[] = {
	BY_TEST(dropped_by_test),
	BY_TEST(duplicated_by_test),
	BY_TEST(reordered_by_test),
};

/* The source holds each port's first connection's node-hop connect back this long: the others
 * reach the target first (the ordering tests). */
static unsigned int hold_first(uint64_t ms, uint32_t port, uint32_t seq)
{
	return seq == 0 ? (unsigned int)ms : 0;
}

#define DELAY_FIRST_MAX 600000

/* source-start's "test_delay_first_ms": 0 to 600000 ms, 0 (the default) holding nothing back. */
static int parse_delay_first(struct json_object *v, struct ctl_request *req, char *err,
			     size_t errlen)
{
	int64_t ms = json_object_get_int64(v);

	if (!json_object_is_type(v, json_type_int) || ms < 0 || ms > DELAY_FIRST_MAX) {
		snprintf(err, errlen, "\"test_delay_first_ms\" must be 0..%d", DELAY_FIRST_MAX);
		return -EINVAL;
	}
	req->hook = ms ? (struct px_source_hook){ .hold_ms = hold_first, .arg = (uint64_t)ms }
		       : (struct px_source_hook){ 0 };
	return 0;
}

static const struct ctl_field_ext req_fields[] = {
	{ CTL_SOURCE_START, "test_delay_first_ms", parse_delay_first },
};

int ctl_test_init(int *argc, char **argv)
{
	int i = 1, r;

	r = ctl_table_extend(&ctl_node_table, node_figs, ARRAY_SIZE(node_figs));
	if (r == 0)
		r = ctl_request_extend(req_fields, ARRAY_SIZE(req_fields));
	if (r < 0) {
		fprintf(stderr, "vmigd: out of memory\n");
		return r;
	}
	while (i < *argc && strcmp(argv[i], "--") != 0) {
		const char *arg = NULL;
		unsigned int k;
		int used = 0;

		for (k = 0; k < ARRAY_SIZE(test_opts) && !used; k++) {
			const char *name = test_opts[k].name;
			size_t n = strlen(name);

			if (strcmp(argv[i], name) == 0) {
				if (i + 1 >= *argc) {
					fprintf(stderr, "vmigd: %s needs an argument\n", name);
					return -EINVAL;
				}
				arg = argv[i + 1];
				used = 2;
			} else if (strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') {
				arg = argv[i] + n + 1;
				used = 1;
			}
		}
		if (!used) {
			i++;
			continue;
		}
		r = test_opts[k - 1].parse(arg);
		if (r < 0)
			return r;
		memmove(&argv[i], &argv[i + used], (size_t)(*argc - i - used + 1) * sizeof(*argv));
		*argc -= used;
	}
	return 0;
}

static int wrap(void *arg, const struct xp_hop_port_ops *ops, void *port,
		const struct xp_hop_port_ops **ret_ops, void **ret_port)
{
	struct xp_impair *im;
	int r;

	r = xp_impair_new(&impair, ops, port, &im);
	if (r < 0)
		return r;
	*ret_ops = xp_impair_ops(im);
	*ret_port = im;
	return 0;
}

static void wrap_stats(void *arg, const void *port, struct xp_hop_stats *st)
{
	struct xp_impair_stats is;

	xp_impair_stats(port, &is);
	st->dropped_by_test = is.dropped;
	st->duplicated_by_test = is.duplicated;
	st->reordered_by_test = is.reordered;
}

static void wrap_free(void *arg, void *port)
{
	xp_impair_free(port);
}

static const struct xp_dhop_wrap impair_wrap = {
	.wrap = wrap,
	.stats = wrap_stats,
	.free = wrap_free,
};

const struct xp_dhop_wrap *ctl_test_hop_wrap(void)
{
	impair.seed = (uint32_t)vm_now_ns();
	return impaired ? &impair_wrap : NULL;
}

/* The loop does nothing else for wedge_for_ms: no timer, no watch, no control request. */
static void wedge(void *arg)
{
	struct timespec ts = { .tv_sec = wedge_for_ms / 1000,
			       .tv_nsec = (long)(wedge_for_ms % 1000) * 1000000 };

	log_warn(OPT_WEDGE ": holding the control loop for %u ms", wedge_for_ms);
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	log_warn(OPT_WEDGE ": the control loop runs again");
}

void ctl_test_start(struct xp_loop *loop)
{
	struct xp_timer *t;

	if (wedge_for_ms && xp_timer_add(loop, vm_now_ms() + wedge_after_ms, wedge, NULL, &t) < 0)
		log_err(OPT_WEDGE ": cannot arm the timer");
}
