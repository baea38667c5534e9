// SPDX-License-Identifier: Apache-2.0
/* cv-probe: drives one convergence backend (QMP or libvirt) by hand or from a test, a command at
 * a time, printing job samples as JSON lines (test_cv_qmp.py, test_cv_virt.py). A test and
 * debugging tool, not installed; the daemon's monitor threads use the same ops. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cv_backend.h"

enum { EXIT_FAIL = 1, EXIT_USAGE = 2 };

/* --keep-going: every command prints a line and a failed one does not end the run. */
static bool keep_going;
static uint64_t t_start;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: cv-probe (--qmp PATH | --libvirt URI --domain NAME) [--timeout-ms N] "
		"[--keep-going] CMD...\n"
		"commands, run in order:\n"
		"  prepare [auto-converge] [post-copy] [dormant] [downtime=MS]\n"
		"  query                       one JSON line of the job\n"
		"  watch SECONDS INTERVAL_MS   a JSON line per sample until completed, failed,\n"
		"                              cancelled or SECONDS\n"
		"  bandwidth BPS               0: unlimited\n"
		"  downtime MS\n"
		"  throttle INIT STEP          auto-converge's start and step, percent\n"
		"  postcopy | pause | resume | abort\n"
		"  sleep MS\n"
		"--keep-going: every line carries cmd, t_ms (since the start) and rc; a command\n"
		"that prints no job, or fails, prints {\"cmd\",\"t_ms\",\"rc\"} (with errno and\n"
		"error when rc < 0: -errno); a failed command does not stop the run; an open\n"
		"that fails prints a line with cmd \"open\".\n"
		"Exit status: 0, 1 (the error on stderr, or with --keep-going any command or the\n"
		"open failed), 2 (usage).\n");
}

static void __attribute__((noreturn, format(printf, 1, 2))) usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "cv-probe: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	usage(stderr);
	exit(EXIT_USAGE);
}

static uint64_t number(const char *what, const char *s)
{
	char *end;
	unsigned long long v;

	if (!s)
		usage_error("%s: a number is missing", what);
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-')
		usage_error("%s: not a number: %s", what, s);
	return v;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(uint64_t ms)
{
	struct timespec ts = { .tv_sec = (time_t)(ms / 1000),
			       .tv_nsec = (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void print_json(struct json_object *o)
{
	printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	fflush(stdout);
	json_object_put(o);
}

/* A job sample printed by cmd ("query", "watch"); t_ms: since the watch started, -1: none. */
static void print_job(const struct cv_job *j, const char *cmd, int64_t t_ms)
{
	struct json_object *o = cv_job_json(j);

	if (keep_going) {
		json_object_object_add(o, "cmd", json_object_new_string(cmd));
		json_object_object_add(o, "rc", json_object_new_int(0));
		t_ms = (int64_t)(now_ms() - t_start);
	}
	if (t_ms >= 0)
		json_object_object_add(o, "t_ms", json_object_new_int64(t_ms));
	/* Always there, empty when unset: tests read it without a default. */
	if (!j->error[0])
		json_object_object_add(o, "error", json_object_new_string(""));
	print_json(o);
}

/* --keep-going: what a command that prints no job did, or why one failed (rc -errno). */
static void print_result(const char *cmd, int rc, const char *err)
{
	struct json_object *o = json_object_new_object();

	json_object_object_add(o, "cmd", json_object_new_string(cmd));
	json_object_object_add(o, "t_ms", json_object_new_int64((int64_t)(now_ms() - t_start)));
	json_object_object_add(o, "rc", json_object_new_int(rc));
	if (rc < 0) {
		json_object_object_add(o, "errno", json_object_new_string(strerror(-rc)));
		json_object_object_add(o, "error", json_object_new_string(err));
	}
	print_json(o);
}

static bool finished(enum cv_status s)
{
	return s == CV_ST_COMPLETED || s == CV_ST_FAILED || s == CV_ST_CANCELLED;
}

/* Runs the command at argv[*i], advancing *i past its arguments. 0, or -errno (error() says). */
static int run_command(struct cv_backend *b, char **argv, int argc, int *i, char *err,
		       size_t errlen)
{
	const char *cmd = argv[(*i)++];
	struct cv_job job;
	int r;

	err[0] = '\0';
	if (strcmp(cmd, "prepare") == 0) {
		struct cv_setup s = { 0 };

		for (; *i < argc; (*i)++) {
			const char *a = argv[*i];

			if (strcmp(a, "auto-converge") == 0)
				s.auto_converge = true;
			else if (strcmp(a, "post-copy") == 0)
				s.post_copy = true;
			else if (strcmp(a, "dormant") == 0)
				s.throttle_dormant = true;
			else if (strncmp(a, "downtime=", 9) == 0)
				s.max_downtime_ms = number("prepare downtime=", a + 9);
			else
				break;
		}
		return b->ops->prepare(b, &s, err, errlen);
	}
	if (strcmp(cmd, "query") == 0) {
		r = b->ops->query(b, &job);
		if (r == 0)
			print_job(&job, cmd, -1);
		return r;
	}
	if (strcmp(cmd, "watch") == 0) {
		uint64_t secs = number("watch SECONDS", *i < argc ? argv[(*i)++] : NULL);
		uint64_t interval = number("watch INTERVAL_MS", *i < argc ? argv[(*i)++] : NULL);
		uint64_t t0 = now_ms(), next = t0;

		if (interval == 0)
			usage_error("watch: INTERVAL_MS must be at least 1");
		for (;;) {
			r = b->ops->query(b, &job);
			if (r < 0)
				return r;
			print_job(&job, cmd, (int64_t)(now_ms() - t0));
			if (finished(job.status))
				return 0;
			next += interval;
			if (next > t0 + secs * 1000)
				return 0;
			if (next > now_ms())
				sleep_ms(next - now_ms());
		}
	}
	if (strcmp(cmd, "bandwidth") == 0)
		return b->ops->set_bandwidth(
			b, number("bandwidth BPS", *i < argc ? argv[(*i)++] : NULL));
	if (strcmp(cmd, "downtime") == 0)
		return b->ops->set_downtime(b,
					    number("downtime MS", *i < argc ? argv[(*i)++] : NULL));
	if (strcmp(cmd, "throttle") == 0) {
		uint64_t init = number("throttle INIT", *i < argc ? argv[(*i)++] : NULL);
		uint64_t step = number("throttle STEP", *i < argc ? argv[(*i)++] : NULL);

		if (init > 100 || step > 100)
			usage_error("throttle: percentages are 0 to 100");
		return b->ops->set_throttle(b, (unsigned int)init, (unsigned int)step);
	}
	if (strcmp(cmd, "postcopy") == 0)
		return b->ops->start_postcopy(b);
	if (strcmp(cmd, "pause") == 0)
		return b->ops->pause(b);
	if (strcmp(cmd, "resume") == 0)
		return b->ops->resume(b);
	if (strcmp(cmd, "abort") == 0)
		return b->ops->abort(b);
	if (strcmp(cmd, "sleep") == 0) {
		sleep_ms(number("sleep MS", *i < argc ? argv[(*i)++] : NULL));
		return 0;
	}
	usage_error("unknown command: %s", cmd);
}

/* Every command is checked before the first one runs, so that a typo does not stop a test
 * half-way through with a guest paused. */
static void check_commands(char **argv, int argc, int first)
{
	static const struct {
		const char *name;
		int nargs;
	} cmds[] = {
		{ "prepare", -1 }, { "query", 0 },    { "watch", 2 },	 { "bandwidth", 1 },
		{ "downtime", 1 }, { "throttle", 2 }, { "postcopy", 0 }, { "pause", 0 },
		{ "resume", 0 },   { "abort", 0 },    { "sleep", 1 },
	};

	if (first >= argc)
		usage_error("no command");
	for (int i = first; i < argc;) {
		size_t k;

		for (k = 0; k < sizeof(cmds) / sizeof(cmds[0]); k++)
			if (strcmp(argv[i], cmds[k].name) == 0)
				break;
		if (k == sizeof(cmds) / sizeof(cmds[0]))
			usage_error("unknown command: %s", argv[i]);
		i++;
		if (cmds[k].nargs < 0) {
			while (i < argc && (strcmp(argv[i], "auto-converge") == 0 ||
					    strcmp(argv[i], "post-copy") == 0 ||
					    strcmp(argv[i], "dormant") == 0 ||
					    strncmp(argv[i], "downtime=", 9) == 0)) {
				if (strncmp(argv[i], "downtime=", 9) == 0)
					number("prepare downtime=", argv[i] + 9);
				i++;
			}
			continue;
		}
		for (int n = 0; n < cmds[k].nargs; n++, i++)
			number(cmds[k].name, i < argc ? argv[i] : NULL);
	}
}

int main(int argc, char **argv)
{
	const char *qmp = NULL, *uri = NULL, *domain = NULL;
	unsigned int timeout_ms = 5000;
	struct cv_backend *b = NULL;
	char err[512];
	int i = 1, r, status = 0;

	t_start = now_ms();
	for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
		const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(opt, "--help") == 0) {
			usage(stdout);
			return 0;
		}
		if (strcmp(opt, "--keep-going") == 0) {
			keep_going = true;
			continue;
		}
		if (!val)
			usage_error("%s needs a value", opt);
		if (strcmp(opt, "--qmp") == 0)
			qmp = val;
		else if (strcmp(opt, "--libvirt") == 0)
			uri = val;
		else if (strcmp(opt, "--domain") == 0)
			domain = val;
		else if (strcmp(opt, "--timeout-ms") == 0) {
			uint64_t t = number("--timeout-ms", val);

			if (t == 0 || t > 3600000)
				usage_error("--timeout-ms: 1 to 3600000");
			timeout_ms = (unsigned int)t;
		} else
			usage_error("unknown option %s", opt);
		i++;
	}
	if (!!qmp == !!(uri || domain))
		usage_error("give --qmp PATH, or --libvirt URI --domain NAME");
	if (!qmp && !domain)
		usage_error("--libvirt needs --domain NAME");
	check_commands(argv, argc, i);

	if (qmp) {
		r = cv_qmp_open(qmp, timeout_ms, &b, err, sizeof(err));
	} else if (!cv_virt_available()) {
		snprintf(err, sizeof(err),
			 "--libvirt: no libvirt backend: vmigd was built without libvirt");
		r = -ENOTSUP;
	} else {
		r = cv_virt_open(uri, domain, timeout_ms, &b, err, sizeof(err));
	}
	if (r < 0) {
		if (keep_going)
			print_result("open", r, err);
		else
			fprintf(stderr, "cv-probe: %s\n", err);
		return EXIT_FAIL;
	}
	while (i < argc) {
		const char *cmd = argv[i];

		r = run_command(b, argv, argc, &i, err, sizeof(err));
		if (r < 0 && !err[0])
			snprintf(err, sizeof(err), "%s", b->ops->error(b));
		if (keep_going) {
			/* query and watch printed their samples; anything else says how it went. */
			if (r < 0 || (strcmp(cmd, "query") != 0 && strcmp(cmd, "watch") != 0))
				print_result(cmd, r, err);
			if (r < 0)
				status = EXIT_FAIL;
			continue;
		}
		if (r < 0) {
			fprintf(stderr, "cv-probe: %s: %s\n", cmd, err);
			b->ops->free(b);
			return EXIT_FAIL;
		}
	}
	b->ops->free(b);
	return status;
}
