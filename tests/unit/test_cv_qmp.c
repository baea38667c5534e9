// SPDX-License-Identifier: Apache-2.0
/* Unit tests for the convergence module's QMP backend (ctrl/cv_backend.h; cv_qmp.c and
 * cv_qmp_json.c): the job parser on real QEMU 7.2 replies and 9.x/10.x-shaped ones, and the
 * client against a scripted fake QMP server on a unix socket (greeting, commands in order,
 * events, delays, errors, garbage, overlong lines, a socket that closes). */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "cv_backend.h"

/* Real replies of QEMU 7.2.22 (Debian 12), captured from query-migrate and query-status. */
#define R72_NONE "{\"return\": {}}"

#define R72_ACTIVE                                                                                 \
	"{\"return\": {\"expected-downtime\": 300, \"status\": \"active\", \"setup-time\": 2, "    \
	"\"total-time\": 3506, \"ram\": {\"total\": 67641344, \"postcopy-requests\": 0, "          \
	"\"dirty-sync-count\": 1, \"multifd-bytes\": 0, \"pages-per-second\": 250, "               \
	"\"downtime-bytes\": 0, \"page-size\": 4096, \"remaining\": 63340544, "                    \
	"\"postcopy-bytes\": 0, \"mbps\": 8.2094400000000007, \"transferred\": 3592860, "          \
	"\"dirty-sync-missed-zero-copy\": 0, \"precopy-bytes\": 3592860, \"duplicate\": 175, "     \
	"\"dirty-pages-rate\": 0, \"skipped\": 0, \"normal-bytes\": 3584000, \"normal\": 875}}}"

#define R72_CANCELLED "{\"return\": {\"status\": \"cancelled\"}}"

#define R72_FAILED                                                                                 \
	"{\"return\": {\"status\": \"failed\", "                                                   \
	"\"error-desc\": \"Unable to write to command: Broken pipe\"}}"

#define R72_COMPLETED                                                                              \
	"{\"return\": {\"status\": \"completed\", \"setup-time\": 1, \"downtime\": 18, "           \
	"\"total-time\": 320, \"ram\": {\"total\": 67641344, \"postcopy-requests\": 0, "           \
	"\"dirty-sync-count\": 3, \"multifd-bytes\": 0, \"pages-per-second\": 32710, "             \
	"\"downtime-bytes\": 27195733, \"page-size\": 4096, \"remaining\": 0, "                    \
	"\"postcopy-bytes\": 0, \"mbps\": 1693.9112727272727, \"transferred\": 67468314, "         \
	"\"dirty-sync-missed-zero-copy\": 0, \"precopy-bytes\": 40272581, \"duplicate\": 283, "    \
	"\"dirty-pages-rate\": 0, \"skipped\": 0, \"normal-bytes\": 67334144, "                    \
	"\"normal\": 16439}}}"

#define R72_POSTCOPY                                                                               \
	"{\"return\": {\"expected-downtime\": 300, \"status\": \"postcopy-active\", "              \
	"\"setup-time\": 8, \"total-time\": 2604, \"ram\": {\"total\": 67641344, "                 \
	"\"postcopy-requests\": 0, \"dirty-sync-count\": 2, \"multifd-bytes\": 0, "                \
	"\"pages-per-second\": 490, \"downtime-bytes\": 0, \"page-size\": 4096, "                  \
	"\"remaining\": 62730240, \"postcopy-bytes\": 0, \"mbps\": 16.08912, "                     \
	"\"transferred\": 5229906, \"dirty-sync-missed-zero-copy\": 0, "                           \
	"\"precopy-bytes\": 5229906, \"duplicate\": 133, \"dirty-pages-rate\": 0, "                \
	"\"skipped\": 0, \"normal-bytes\": 5218304, \"normal\": 1274}}}"

#define R72_POSTCOPY_DONE                                                                          \
	"{\"return\": {\"status\": \"completed\", \"setup-time\": 8, \"downtime\": 4, "            \
	"\"total-time\": 2778, \"ram\": {\"total\": 67641344, \"postcopy-requests\": 3, "          \
	"\"dirty-sync-count\": 2, \"multifd-bytes\": 0, \"pages-per-second\": 86358, "             \
	"\"downtime-bytes\": 0, \"page-size\": 4096, \"remaining\": 0, "                           \
	"\"postcopy-bytes\": 61693973, \"mbps\": 193.37841732851987, "                             \
	"\"transferred\": 66923879, \"dirty-sync-missed-zero-copy\": 0, "                          \
	"\"precopy-bytes\": 5229906, \"duplicate\": 416, \"dirty-pages-rate\": 0, "                \
	"\"skipped\": 0, \"normal-bytes\": 66789376, \"normal\": 16306}}}"

#define S72_PRELAUNCH                                                                              \
	"{\"return\": {\"status\": \"prelaunch\", \"singlestep\": false, \"running\": false}}"

#define S72_RUNNING                                                                                \
	"{\"return\": {\"status\": \"running\", \"singlestep\": false, \"running\": true}}"

#define S72_FINISH_MIGRATE                                                                         \
	"{\"return\": {\"status\": \"finish-migrate\", \"singlestep\": false, "                    \
	"\"running\": false}}"

#define S72_POSTMIGRATE                                                                            \
	"{\"return\": {\"status\": \"postmigrate\", \"singlestep\": false, \"running\": false}}"

/* Built from the QAPI schemas of 9.2 and 10.1: fields 7.2 lacks, none it dropped. */
#define R92_ACTIVE                                                                                 \
	"{\"return\": {\"expected-downtime\": 412, \"status\": \"active\", \"setup-time\": 3, "    \
	"\"total-time\": 48211, \"ram\": {\"total\": 4312793088, \"postcopy-requests\": 0, "       \
	"\"dirty-sync-count\": 7, \"multifd-bytes\": 9801234560, \"pages-per-second\": 28784, "    \
	"\"downtime-bytes\": 0, \"page-size\": 4096, \"remaining\": 812646400, "                   \
	"\"postcopy-bytes\": 0, \"mbps\": 943.21337, \"transferred\": 9877262336, "                \
	"\"dirty-sync-missed-zero-copy\": 0, \"precopy-bytes\": 76027776, "                        \
	"\"duplicate\": 812004, \"dirty-pages-rate\": 25300, \"normal-bytes\": 9876529152, "       \
	"\"normal\": 2411262}, \"vfio\": {\"transferred\": 1048576}, "                             \
	"\"cpu-throttle-percentage\": 30, \"socket-address\": [{\"port\": \"49152\", "             \
	"\"ipv6\": false, \"host\": \"198.18.0.2\", \"type\": \"inet\"}]}}"

#define R101_POSTCOPY                                                                              \
	"{\"return\": {\"status\": \"postcopy-active\", \"setup-time\": 5, "                       \
	"\"total-time\": 93012, \"expected-downtime\": 300, \"ram\": {\"total\": 4312793088, "     \
	"\"postcopy-requests\": 117, \"dirty-sync-count\": 12, \"multifd-bytes\": 9801234560, "    \
	"\"pages-per-second\": 28784, \"downtime-bytes\": 0, \"page-size\": 4096, "                \
	"\"remaining\": 2147483648, \"postcopy-bytes\": 1073741824, \"mbps\": 9411.5, "            \
	"\"transferred\": 9877262336, \"dirty-sync-missed-zero-copy\": 0, "                        \
	"\"precopy-bytes\": 76027776, \"duplicate\": 812004, \"dirty-pages-rate\": 0, "            \
	"\"normal-bytes\": 9876529152, \"normal\": 2411262}, \"cpu-throttle-percentage\": 0, "     \
	"\"postcopy-blocktime\": 2231, \"postcopy-vcpu-blocktime\": [1103, 1128], "                \
	"\"postcopy-latency\": 95341, \"postcopy-vcpu-latency\": [94011, 96671], "                 \
	"\"postcopy-non-vcpu-latency\": 12, \"dirty-limit-throttle-time-per-round\": 0, "          \
	"\"dirty-limit-ring-full-time\": 0}}"

/* A real reply of QEMU 10.0.2 (bookworm-backports) during a multifd migration. */
#define R100_ACTIVE_MULTIFD                                                                        \
	"{\"return\": {\"expected-downtime\": 300, \"status\": \"active\", \"setup-time\": 1, "    \
	"\"total-time\": 2501, \"ram\": {\"total\": 67641344, \"postcopy-requests\": 0, "          \
	"\"dirty-sync-count\": 1, \"multifd-bytes\": 39425216, \"pages-per-second\": 3801, "         \
	"\"downtime-bytes\": 200, \"page-size\": 4096, \"remaining\": 28315648, "                    \
	"\"postcopy-bytes\": 0, \"mbps\": 124.90407920792079, \"transferred\": 39425861, "           \
	"\"dirty-sync-missed-zero-copy\": 0, \"precopy-bytes\": 0, \"duplicate\": 0, "               \
	"\"dirty-pages-rate\": 0, \"normal-bytes\": 39321600, \"normal\": 9600}}}"

#define S10_RUNNING "{\"return\": {\"status\": \"running\", \"running\": true}}"

#define GREETING_72                                                                                \
	"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, \"major\": 7}, "         \
	"\"package\": \"Debian 1:7.2+dfsg-7+deb12u18+b3\"}, \"capabilities\": [\"oob\"]}}"
#define GREETING_101                                                                               \
	"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 0, \"minor\": 1, \"major\": 10}, "         \
	"\"package\": \"\"}, \"capabilities\": [\"oob\"]}}"
#define EV_MIGRATION(st)                                                                           \
	"{\"timestamp\": {\"seconds\": 1795261658, \"microseconds\": 5986}, \"event\": "           \
	"\"MIGRATION\", \"data\": {\"status\": \"" st "\"}}\r\n"
#define EV(name)                                                                                   \
	"{\"timestamp\": {\"seconds\": 1795261658, \"microseconds\": 61585}, \"event\": \"" name   \
	"\"}\r\n"
#define CAPS(multifd, ac)                                                                          \
	"[{\"state\": false, \"capability\": \"xbzrle\"}, {\"state\": " ac ", \"capability\": "    \
	"\"auto-converge\"}, {\"state\": false, \"capability\": \"postcopy-ram\"}, "               \
	"{\"state\": " multifd ", \"capability\": \"multifd\"}]"

/* ------------------------------------------------------------------------------------------ */
/* The fake QMP server: one client, a script of steps, problems kept for the test to report. */

enum step_kind { S_END, S_SEND, S_EXPECT, S_REPLY, S_WITH_ID, S_SLEEP, S_CLOSE, S_BIG };

struct step {
	enum step_kind kind;
	const char *a; /* S_SEND: text; S_EXPECT: command; S_REPLY: text with @ID@;
			* S_WITH_ID: a reply without an id, one of the defines above */
	const char *b; /* S_EXPECT: its arguments as JSON, NULL: none */
	size_t n;      /* S_SLEEP: ms; S_BIG: bytes in the line */
};

/* clang-format off */
#define SEND(t)		  { S_SEND, t, NULL, 0 }
#define EXPECT(cmd, args) { S_EXPECT, cmd, args, 0 }
#define REPLY(t)	  { S_REPLY, t, NULL, 0 }
#define WITH_ID(r)	  { S_WITH_ID, r, NULL, 0 }
#define SLEEP(ms)	  { S_SLEEP, NULL, NULL, ms }
#define CLOSE		  { S_CLOSE, NULL, NULL, 0 }
#define BIG(bytes)	  { S_BIG, NULL, NULL, bytes }
#define END		  { S_END, NULL, NULL, 0 }
/* clang-format on */
#define OK(ret) REPLY("{\"return\": " ret ", \"id\": @ID@}\r\n")
#define QERR(desc)                                                                                 \
	REPLY("{\"id\": @ID@, \"error\": {\"class\": \"GenericError\", \"desc\": \"" desc          \
	      "\"}}\r\n")
#define HANDSHAKE SEND(GREETING_72 "\r\n"), EXPECT("qmp_capabilities", NULL), OK("{}")

#define WAIT_MS 5000 /* the fake's patience with a client that says nothing */

struct fake {
	char dir[64], path[96];
	int lfd, fd;
	pthread_t thread;
	const struct step *steps;
	char id[64];	   /* the id of the last command seen, as JSON */
	char problem[512]; /* the first thing that went against the script */
	char buf[1 << 16];
	size_t len;
};

static void __attribute__((format(printf, 2, 3))) problem(struct fake *f, const char *fmt, ...)
{
	va_list ap;

	if (f->problem[0])
		return;
	va_start(ap, fmt);
	vsnprintf(f->problem, sizeof(f->problem), fmt, ap);
	va_end(ap);
}

/* The next line from the client; NULL at EOF or after WAIT_MS. */
static char *fake_line(struct fake *f)
{
	static __thread char line[sizeof(((struct fake *)0)->buf)];

	for (;;) {
		char *nl = memchr(f->buf, '\n', f->len);
		struct pollfd p = { .fd = f->fd, .events = POLLIN };
		ssize_t k;

		if (nl) {
			size_t n = (size_t)(nl - f->buf);

			memcpy(line, f->buf, n);
			line[n] = '\0';
			memmove(f->buf, nl + 1, f->len - n - 1);
			f->len -= n + 1;
			return line;
		}
		if (f->len == sizeof(f->buf) || poll(&p, 1, WAIT_MS) <= 0)
			return NULL;
		k = read(f->fd, f->buf + f->len, sizeof(f->buf) - f->len);
		if (k <= 0)
			return NULL;
		f->len += (size_t)k;
	}
}

static void fake_write(struct fake *f, const char *text, size_t len)
{
	while (len > 0) {
		ssize_t k = send(f->fd, text, len, MSG_NOSIGNAL);

		if (k <= 0)
			return;
		text += k;
		len -= (size_t)k;
	}
}

static void fake_expect(struct fake *f, const struct step *s)
{
	struct json_object *o = NULL, *v, *want = NULL;
	char *line = fake_line(f);

	if (!line) {
		problem(f, "expected %s, got nothing", s->a);
		return;
	}
	o = json_tokener_parse(line);
	if (!o || !json_object_object_get_ex(o, "execute", &v) ||
	    strcmp(json_object_get_string(v), s->a) != 0) {
		problem(f, "expected %s, got %s", s->a, line);
		goto out;
	}
	if (!json_object_object_get_ex(o, "id", &v)) {
		problem(f, "%s without an id: %s", s->a, line);
		goto out;
	}
	snprintf(f->id, sizeof(f->id), "%s", json_object_to_json_string(v));
	want = s->b ? json_tokener_parse(s->b) : NULL;
	if (s->b && !want) {
		problem(f, "bad test: arguments of %s are not JSON: %s", s->a, s->b);
		goto out;
	}
	if (!json_object_object_get_ex(o, "arguments", &v))
		v = NULL;
	if (!!v != !!want || (v && !json_object_equal(v, want)))
		problem(f, "%s: arguments %s, expected %s", s->a,
			v ? json_object_to_json_string(v) : "(none)", s->b ? s->b : "(none)");
out:
	json_object_put(want);
	json_object_put(o);
}

static void fake_reply(struct fake *f, const char *tmpl)
{
	const char *at = strstr(tmpl, "@ID@");
	size_t len = strlen(tmpl) + sizeof(f->id) + 1;
	char *out = malloc(len);

	if (at)
		snprintf(out, len, "%.*s%s%s", (int)(at - tmpl), tmpl, f->id, at + 4);
	else
		snprintf(out, len, "%s", tmpl);
	fake_write(f, out, strlen(out));
	free(out);
}

/* {"return": ...} becomes {"id": ID, "return": ...} CR LF. */
static void fake_with_id(struct fake *f, const char *reply)
{
	size_t len = strlen(reply) + sizeof(f->id) + 16;
	char *out = malloc(len);

	snprintf(out, len, "{\"id\": %s, %s\r\n", f->id, reply + 1);
	fake_write(f, out, strlen(out));
	free(out);
}

static void fake_big(struct fake *f, size_t n)
{
	static const char head[] = "{\"return\": \"";
	char *line = malloc(n + 1);

	memset(line, 'x', n);
	memcpy(line, head, sizeof(head) - 1);
	memcpy(line + n - 3, "\"}\n", 3);
	fake_write(f, line, n);
	free(line);
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	const struct step *s;
	char *line;

	f->fd = accept(f->lfd, NULL, NULL);
	if (f->fd < 0) {
		problem(f, "accept: %s", strerror(errno));
		return NULL;
	}
	for (s = f->steps; s->kind != S_END && !f->problem[0]; s++) {
		switch (s->kind) {
		case S_SEND:
			fake_write(f, s->a, strlen(s->a));
			break;
		case S_EXPECT:
			fake_expect(f, s);
			break;
		case S_REPLY:
			fake_reply(f, s->a);
			break;
		case S_WITH_ID:
			fake_with_id(f, s->a);
			break;
		case S_SLEEP:
			nanosleep(&(struct timespec){ .tv_sec = s->n / 1000,
						      .tv_nsec = (long)(s->n % 1000) * 1000000 },
				  NULL);
			break;
		case S_BIG:
			fake_big(f, s->n);
			break;
		case S_CLOSE:
			close(f->fd);
			f->fd = -1;
			return NULL;
		case S_END:
			break;
		}
	}
	/* The script is done: anything more the client sends was not expected. */
	if (!f->problem[0] && (line = fake_line(f)) != NULL)
		problem(f, "unexpected: %s", line);
	close(f->fd);
	f->fd = -1;
	return NULL;
}

static struct fake *fake_start(const struct step *steps)
{
	struct fake *f = calloc(1, sizeof(*f));
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	assert_non_null(f);
	snprintf(f->dir, sizeof(f->dir), "/tmp/test-cv-qmp.XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/qmp.sock", f->dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->path);
	f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(f->lfd >= 0);
	assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(f->lfd, 4), 0);
	f->steps = steps;
	f->fd = -1;
	assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
	return f;
}

/* Joins the server (the client must be gone, or the script closed) and fails on a problem. */
static void fake_finish(struct fake *f)
{
	char problem_copy[sizeof(f->problem)];

	pthread_join(f->thread, NULL);
	close(f->lfd);
	unlink(f->path);
	rmdir(f->dir);
	memcpy(problem_copy, f->problem, sizeof(problem_copy));
	free(f);
	if (problem_copy[0])
		fail_msg("fake QMP server: %s", problem_copy);
}

static struct cv_backend *open_ok(struct fake *f, unsigned int timeout_ms)
{
	struct cv_backend *b = NULL;
	char err[256] = "";

	if (cv_qmp_open(f->path, timeout_ms, &b, err, sizeof(err)) != 0)
		fail_msg("cv_qmp_open: %s", err);
	assert_non_null(b);
	assert_string_equal(b->ops->name, "qmp");
	return b;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void assert_one_line(const char *s)
{
	assert_non_null(s);
	assert_true(s[0] != '\0');
	assert_null(strchr(s, '\n'));
}

static void assert_contains(const char *s, const char *needle)
{
	if (!strstr(s, needle))
		fail_msg("\"%s\" does not contain \"%s\"", s, needle);
}

/* ------------------------------------------------------------------------------------------ */
/* The parser. */

struct parse_case {
	const char *name, *migrate, *status;
	struct cv_job want;
};

#define JOB(st, el, tot, rem, tx, dr, syn, rt, exp, dt, thr, pcr, run, e)                          \
	{                                                                                          \
		.status = st, .elapsed_ms = el, .total = tot, .remaining = rem, .transferred = tx, \
		.dirty_rate = dr, .dirty_syncs = syn, .rate = rt, .expected_downtime_ms = exp,     \
		.downtime_ms = dt, .throttle_pct = thr, .postcopy_requests = pcr,                  \
		.guest_running = run, .error = e                                                   \
	}

static const struct parse_case parse_cases[] = {
	{ "7.2 none, prelaunch", R72_NONE, S72_PRELAUNCH,
	  JOB(CV_ST_NONE, -1, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, false, "") },
	{ "7.2 active, running", R72_ACTIVE, S72_RUNNING,
	  JOB(CV_ST_ACTIVE, 3506, 67641344, 63340544, 3592860, 0, 1, 1026180, 300, -1, 0, 0, true,
	      "") },
	{ "7.2 cancelled", R72_CANCELLED, S72_RUNNING,
	  JOB(CV_ST_CANCELLED, -1, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, true, "") },
	{ "7.2 failed", R72_FAILED, S72_PRELAUNCH,
	  JOB(CV_ST_FAILED, -1, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, false,
	      "Unable to write to command: Broken pipe") },
	{ "7.2 completed", R72_COMPLETED, S72_POSTMIGRATE,
	  JOB(CV_ST_COMPLETED, 320, 67641344, 0, 67468314, 0, 3, 211738909, -1, 18, 0, 0, false,
	      "") },
	{ "7.2 postcopy-active", R72_POSTCOPY, S72_FINISH_MIGRATE,
	  JOB(CV_ST_POSTCOPY, 2604, 67641344, 62730240, 5229906, 0, 2, 2011140, 300, -1, 0, 0,
	      false, "") },
	{ "7.2 postcopy completed", R72_POSTCOPY_DONE, S72_POSTMIGRATE,
	  JOB(CV_ST_COMPLETED, 2778, 67641344, 0, 66923879, 0, 2, 24172302, -1, 4, 0, 3, false,
	      "") },
	{ "9.2 active, throttled", R92_ACTIVE, S10_RUNNING,
	  JOB(CV_ST_ACTIVE, 48211, 4312793088u, 812646400, 9877262336u, 25300 * 4096, 7, 117901671,
	      412, -1, 30, 0, true, "") },
	{ "10.0 active, multifd", R100_ACTIVE_MULTIFD, S10_RUNNING,
	  JOB(CV_ST_ACTIVE, 2501, 67641344, 28315648, 39425861, 0, 1, 15613010, 300, -1, 0, 0, true,
	      "") },
	{ "10.1 postcopy", R101_POSTCOPY, S10_RUNNING,
	  JOB(CV_ST_POSTCOPY, 93012, 4312793088u, 2147483648u, 9877262336u, 0, 12, 1176437500, 300,
	      -1, 0, 117, true, "") },
	{ "no status reply", R72_ACTIVE, NULL,
	  JOB(CV_ST_ACTIVE, 3506, 67641344, 63340544, 3592860, 0, 1, 1026180, 300, -1, 0, 0, false,
	      "") },
	{ "no migrate reply", NULL, S72_RUNNING,
	  JOB(CV_ST_NONE, -1, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, true, "") },
	{ "page size 64 KiB",
	  "{\"return\": {\"status\": \"active\", \"ram\": {\"page-size\": 65536, "
	  "\"dirty-pages-rate\": 10}}}",
	  "{\"return\": {\"status\": \"running\"}}",
	  JOB(CV_ST_ACTIVE, -1, 0, 0, 0, 655360, 0, 0, -1, -1, 0, 0, true, "") },
	{ "page size absent: 4 KiB",
	  "{\"return\": {\"status\": \"active\", \"ram\": "
	  "{\"dirty-pages-rate\": 10, \"mbps\": 0}}}",
	  "{\"return\": {\"status\": \"paused\"}}",
	  JOB(CV_ST_ACTIVE, -1, 0, 0, 0, 40960, 0, 0, -1, -1, 0, 0, false, "") },
	{ "error-desc made one line",
	  "{\"return\": {\"status\": \"failed\", \"error-desc\": "
	  "\"a\\nb\\tc\\u0000d\"}}",
	  NULL, JOB(CV_ST_FAILED, -1, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, false, "a b c") },
	{ "whitespace and an id around the reply",
	  "  {\"id\": 7, \"return\": {\"status\": "
	  "\"setup\", \"total-time\": 0}}\r\n",
	  NULL, JOB(CV_ST_SETUP, 0, 0, 0, 0, 0, 0, 0, -1, -1, 0, 0, false, "") },
	{ "huge but valid numbers",
	  "{\"return\": {\"status\": \"active\", \"ram\": {\"total\": "
	  "18446744073709551615, \"dirty-pages-rate\": 2251799813685248, "
	  "\"page-size\": 4096, \"mbps\": 1.4e14}}}",
	  NULL,
	  JOB(CV_ST_ACTIVE, -1, UINT64_MAX, 0, 0, 2251799813685248ull * 4096, 0,
	      17500000000000000000ull, -1, -1, 0, 0, false, "") },
};

static void assert_job_equal(const char *name, const struct cv_job *got, const struct cv_job *want)
{
#define FIELD(f, fmt)                                                                              \
	if (got->f != want->f)                                                                     \
	fail_msg("%s: " #f " %" fmt ", want %" fmt, name, got->f, want->f)
	FIELD(status, "d");
	FIELD(elapsed_ms, PRId64);
	FIELD(total, PRIu64);
	FIELD(remaining, PRIu64);
	FIELD(transferred, PRIu64);
	FIELD(dirty_rate, PRIu64);
	FIELD(dirty_syncs, PRIu64);
	FIELD(rate, PRIu64);
	FIELD(expected_downtime_ms, PRId64);
	FIELD(downtime_ms, PRId64);
	FIELD(throttle_pct, "u");
	FIELD(postcopy_requests, PRIu64);
	FIELD(guest_running, "d");
#undef FIELD
	if (strcmp(got->error, want->error) != 0)
		fail_msg("%s: error \"%s\", want \"%s\"", name, got->error, want->error);
}

static void test_parse_real_replies(void **state)
{
	for (size_t i = 0; i < sizeof(parse_cases) / sizeof(parse_cases[0]); i++) {
		const struct parse_case *c = &parse_cases[i];
		struct cv_job job;
		int r;

		memset(&job, 0x5a, sizeof(job));
		r = cv_qmp_parse_job(c->migrate, c->status, &job);
		if (r != 0)
			fail_msg("%s: cv_qmp_parse_job returned %d", c->name, r);
		assert_job_equal(c->name, &job, &c->want);
	}
}

/* Every state QEMU 7.2 to 10.2 has, and two it might add. */
static void test_parse_states(void **state)
{
	static const struct {
		const char *qemu;
		enum cv_status want;
	} states[] = {
		{ "none", CV_ST_NONE },
		{ "setup", CV_ST_SETUP },
		{ "active", CV_ST_ACTIVE },
		{ "colo", CV_ST_ACTIVE },
		{ "device", CV_ST_SWITCHOVER },
		{ "pre-switchover", CV_ST_SWITCHOVER },
		{ "wait-unplug", CV_ST_SWITCHOVER },
		{ "postcopy-device", CV_ST_SWITCHOVER },
		{ "postcopy-active", CV_ST_POSTCOPY },
		{ "postcopy-paused", CV_ST_POSTCOPY_PAUSED },
		{ "postcopy-recover-setup", CV_ST_POSTCOPY_PAUSED },
		{ "postcopy-recover", CV_ST_POSTCOPY_PAUSED },
		{ "cancelling", CV_ST_CANCELLING },
		{ "completed", CV_ST_COMPLETED },
		{ "failed", CV_ST_FAILED },
		{ "cancelled", CV_ST_CANCELLED },
		{ "hyperspace", CV_ST_ACTIVE },	     /* unknown: still a migration */
		{ "postcopy-warp", CV_ST_POSTCOPY }, /* unknown postcopy: never cancel */
		{ "", CV_ST_ACTIVE },
	};

	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
		char text[128];
		struct cv_job job;

		snprintf(text, sizeof(text), "{\"return\": {\"status\": \"%s\"}}", states[i].qemu);
		assert_int_equal(cv_qmp_parse_job(text, NULL, &job), 0);
		if (job.status != states[i].want)
			fail_msg("\"%s\": %s, want %s", states[i].qemu, cv_status_str(job.status),
				 cv_status_str(states[i].want));
	}
}

/* Malformed replies and fields of the wrong type or range: -EPROTO, the job untouched. */
static void test_parse_rejects(void **state)
{
	static const struct {
		const char *name, *migrate, *status;
	} bad[] = {
		{ "not JSON", "{\"return\": ", NULL },
		{ "empty", "", NULL },
		{ "an array", "[1,2]", NULL },
		{ "two objects", "{\"return\": {}} {\"return\": {}}", NULL },
		{ "trailing bytes", "{\"return\": {}}x", NULL },
		{ "an error reply", "{\"error\": {\"class\": \"GenericError\", \"desc\": \"no\"}}",
		  NULL },
		{ "return not an object", "{\"return\": []}", NULL },
		{ "return null", "{\"return\": null}", NULL },
		{ "status a number", "{\"return\": {\"status\": 5}}", NULL },
		{ "status null", "{\"return\": {\"status\": null}}", NULL },
		{ "ram a string", "{\"return\": {\"status\": \"active\", \"ram\": \"lots\"}}",
		  NULL },
		{ "ram.total a string", "{\"return\": {\"ram\": {\"total\": \"1\"}}}", NULL },
		{ "ram.total a float", "{\"return\": {\"ram\": {\"total\": 1.5}}}", NULL },
		{ "ram.remaining negative", "{\"return\": {\"ram\": {\"remaining\": -5}}}", NULL },
		{ "ram.transferred a bool", "{\"return\": {\"ram\": {\"transferred\": true}}}",
		  NULL },
		{ "ram.mbps a string", "{\"return\": {\"ram\": {\"mbps\": \"fast\"}}}", NULL },
		{ "ram.mbps negative", "{\"return\": {\"ram\": {\"mbps\": -1.0}}}", NULL },
		{ "ram.mbps too large", "{\"return\": {\"ram\": {\"mbps\": 1e300}}}", NULL },
		{ "ram.page-size 0", "{\"return\": {\"ram\": {\"page-size\": 0}}}", NULL },
		{ "ram.page-size 2 GiB", "{\"return\": {\"ram\": {\"page-size\": 2147483648}}}",
		  NULL },
		{ "dirty rate overflows",
		  "{\"return\": {\"ram\": {\"page-size\": 65536, "
		  "\"dirty-pages-rate\": 18446744073709551615}}}",
		  NULL },
		{ "ram.dirty-sync-count an object",
		  "{\"return\": {\"ram\": {\"dirty-sync-count\": {}}}}", NULL },
		{ "ram.postcopy-requests an array",
		  "{\"return\": {\"ram\": {\"postcopy-requests\": [1]}}}", NULL },
		{ "total-time a string", "{\"return\": {\"total-time\": \"5\"}}", NULL },
		{ "total-time negative", "{\"return\": {\"total-time\": -1}}", NULL },
		{ "downtime a float", "{\"return\": {\"downtime\": 0.5}}", NULL },
		{ "expected-downtime null", "{\"return\": {\"expected-downtime\": null}}", NULL },
		{ "throttle 101", "{\"return\": {\"cpu-throttle-percentage\": 101}}", NULL },
		{ "throttle a string", "{\"return\": {\"cpu-throttle-percentage\": \"30\"}}",
		  NULL },
		{ "error-desc a number", "{\"return\": {\"error-desc\": 3}}", NULL },
		{ "running a string", NULL, "{\"return\": {\"running\": \"yes\"}}" },
		{ "running null", NULL, "{\"return\": {\"running\": null}}" },
		{ "run status a number", NULL, "{\"return\": {\"status\": 1}}" },
		{ "status reply an array", NULL, "[]" },
		{ "status return a bool", R72_NONE, "{\"return\": true}" },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct cv_job job, canary;
		int r;

		memset(&job, 0x5a, sizeof(job));
		canary = job;
		r = cv_qmp_parse_job(bad[i].migrate, bad[i].status, &job);
		if (r != -EPROTO)
			fail_msg("%s: returned %d, want -EPROTO", bad[i].name, r);
		if (memcmp(&job, &canary, sizeof(job)) != 0)
			fail_msg("%s: the job was written on failure", bad[i].name);
	}
}

/* A 2 MiB reply text: refused by length, not parsed. */
static void test_parse_long(void **state)
{
	size_t n = 2u << 20;
	char *text = malloc(n + 1);
	struct cv_job job;

	assert_non_null(text);
	memset(text, ' ', n);
	memcpy(text, "{\"return\": {}}", 14);
	text[n] = '\0';
	assert_int_equal(cv_qmp_parse_job(text, NULL, &job), -EPROTO);
	free(text);
}

/* ------------------------------------------------------------------------------------------ */
/* Opening. */

static void test_open_ok(void **state)
{
	static const struct step script[] = { HANDSHAKE, END };
	struct fake *f = fake_start(script);
	struct cv_backend *b = open_ok(f, 2000);

	b->ops->free(b);
	fake_finish(f);
	/* free takes NULL, through the ops of any backend */
}

struct open_case {
	const char *name;
	struct step script[4];
	unsigned int timeout_ms;
	int want;
	const char *needle;
};

static const struct open_case open_cases[] = {
	{ "not a greeting",
	  { SEND("{\"hello\": 1}\r\n"), END },
	  2000,
	  -EPROTO,
	  "not a QMP greeting" },
	{ "an ssh server",
	  { SEND("SSH-2.0-OpenSSH_9.2p1\r\n"), END },
	  2000,
	  -EPROTO,
	  "not a QMP greeting" },
	{ "QMP not an object",
	  { SEND("{\"QMP\": 1}\r\n"), END },
	  2000,
	  -EPROTO,
	  "not a QMP greeting" },
	{ "silent", { SLEEP(800), END }, 300, -ETIMEDOUT, "no reply in 300 ms" },
	{ "closed at once", { CLOSE }, 2000, -ECONNRESET, "closed before its QMP greeting" },
	{ "capabilities refused",
	  { SEND(GREETING_72 "\r\n"), EXPECT("qmp_capabilities", NULL),
	    QERR("Capabilities negotiation is already complete, command ignored"), END },
	  2000,
	  -EIO,
	  "qmp_capabilities: Capabilities negotiation is already complete" },
	{ "no reply to capabilities",
	  { SEND(GREETING_72 "\r\n"), EXPECT("qmp_capabilities", NULL), SLEEP(800), END },
	  300,
	  -ETIMEDOUT,
	  "no reply in 300 ms" },
	{ "closed after the greeting",
	  { SEND(GREETING_72 "\r\n"), EXPECT("qmp_capabilities", NULL), CLOSE },
	  2000,
	  -ECONNRESET,
	  "QEMU closed its QMP socket" },
};

static void test_open_failures(void **state)
{
	for (size_t i = 0; i < sizeof(open_cases) / sizeof(open_cases[0]); i++) {
		const struct open_case *c = &open_cases[i];
		struct cv_backend *b = (struct cv_backend *)&b, *canary = b;
		struct fake *f = fake_start(c->script);
		char err[256] = "";
		uint64_t t0 = now_ms(), took;
		int r = cv_qmp_open(f->path, c->timeout_ms, &b, err, sizeof(err));

		took = now_ms() - t0;
		fake_finish(f);
		if (r != c->want)
			fail_msg("%s: returned %d (%s), want %d", c->name, r, err, c->want);
		if (b != canary)
			fail_msg("%s: *ret written on failure", c->name);
		assert_one_line(err);
		if (!strstr(err, c->needle))
			fail_msg("%s: \"%s\" does not say \"%s\"", c->name, err, c->needle);
		if (r == -ETIMEDOUT && (took < c->timeout_ms || took > c->timeout_ms + 250))
			fail_msg("%s: timed out after %" PRIu64 " ms, not ~%u", c->name, took,
				 c->timeout_ms);
	}
}

static void test_open_no_socket(void **state)
{
	struct cv_backend *b = NULL;
	char err[256] = "", path[300];
	int r;

	r = cv_qmp_open("/nonexistent/qmp.sock", 500, &b, err, sizeof(err));
	assert_int_equal(r, -ENOENT);
	assert_null(b);
	assert_string_equal(err, "cannot connect to QMP socket /nonexistent/qmp.sock: No such file "
				 "or directory");
	memset(path, 'p', sizeof(path) - 1);
	path[0] = '/';
	path[sizeof(path) - 1] = '\0';
	r = cv_qmp_open(path, 500, &b, err, sizeof(err));
	assert_int_equal(r, -EINVAL);
	assert_contains(err, "too long");
	/* A short error buffer is filled and terminated, never overrun. */
	memset(err, 'z', sizeof(err));
	r = cv_qmp_open("/nonexistent/qmp.sock", 500, &b, err, 8);
	assert_int_equal(r, -ENOENT);
	assert_int_equal(strlen(err), 7);
	assert_int_equal(err[8], 'z');
	assert_int_equal(cv_qmp_open("/nonexistent/qmp.sock", 500, &b, NULL, 0), -ENOENT);
}

/* The QMP socket is where QEMU's user writes: a link there is refused, never followed. */
static void test_open_link_refused(void **state)
{
	struct cv_backend *b = NULL;
	char dir[] = "/tmp/vmigd-test-qmp-link-XXXXXX", sock[64], link[64], err[256] = "";
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int lfd;

	assert_non_null(mkdtemp(dir));
	snprintf(sock, sizeof(sock), "%s/qmp.sock", dir);
	snprintf(link, sizeof(link), "%s/link.sock", dir);
	strcpy(sa.sun_path, sock);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 4), 0);
	assert_int_equal(symlink(sock, link), 0);
	assert_int_equal(cv_qmp_open(link, 500, &b, err, sizeof(err)), -ELOOP);
	assert_null(b);
	assert_contains(err, "a symbolic link is in the way");
	close(lfd);
	unlink(link);
	unlink(sock);
	rmdir(dir);
}

/* ------------------------------------------------------------------------------------------ */
/* prepare(): what is sent, in order. */

struct prepare_case {
	const char *name;
	struct cv_setup setup;
	struct step script[12];
	int want;
	const char *needle; /* in err and error() on failure */
};

#define CAPS_ARGS(list) "{\"capabilities\": [" list "]}"
#define CAP(name)	"{\"capability\": \"" name "\", \"state\": true}"
#define CAPOFF(name)	"{\"capability\": \"" name "\", \"state\": false}"

static const struct prepare_case prepare_cases[] = {
	{ "defaults: events only",
	  { 0 },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{}"),
	    EXPECT("migrate-set-capabilities", CAPS_ARGS(CAP("events") ", " CAPOFF("auto-converge"))), OK("{}"), END },
	  0,
	  NULL },
	{ "auto-converge dormant, downtime",
	  { .auto_converge = true, .throttle_dormant = true, .max_downtime_ms = 500 },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{\"status\": \"completed\"}"),
	    EXPECT("migrate-set-capabilities", CAPS_ARGS(CAP("events") ", " CAP("auto-converge"))),
	    OK("{}"),
	    EXPECT("migrate-set-parameters",
		   "{\"cpu-throttle-initial\": 1, \"cpu-throttle-increment\": 1, "
		   "\"throttle-trigger-threshold\": 100, \"downtime-limit\": 500}"),
	    OK("{}"), END },
	  0,
	  NULL },
	{ "auto-converge with QEMU's throttle, post-copy",
	  { .auto_converge = true, .post_copy = true },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{\"status\": \"cancelled\"}"),
	    EXPECT("query-migrate-capabilities", NULL), OK(CAPS("false", "false")),
	    EXPECT("migrate-set-capabilities",
		   CAPS_ARGS(CAP("events") ", " CAP("auto-converge") ", " CAP("postcopy-ram"))),
	    OK("{}"),
	    EXPECT("migrate-set-parameters",
		   "{\"cpu-throttle-initial\": 20, \"cpu-throttle-increment\": 10, "
		   "\"throttle-trigger-threshold\": 50}"),
	    OK("{}"), END },
	  0,
	  NULL },
	{ "dormant without auto-converge: no parameters",
	  { .throttle_dormant = true },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{\"status\": \"failed\"}"),
	    EXPECT("migrate-set-capabilities", CAPS_ARGS(CAP("events") ", " CAPOFF("auto-converge"))), OK("{}"), END },
	  0,
	  NULL },
	{ "events in between",
	  { .max_downtime_ms = 2000 },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), SEND(EV("RESUME")), OK("{}"),
	    EXPECT("migrate-set-capabilities", CAPS_ARGS(CAP("events") ", " CAPOFF("auto-converge"))),
	    SEND(EV_MIGRATION("none")), OK("{}"),
	    EXPECT("migrate-set-parameters", "{\"downtime-limit\": 2000}"), OK("{}"), END },
	  0,
	  NULL },
	{ "a migration in progress",
	  { .auto_converge = true },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{\"status\": \"active\"}"), END },
	  -EBUSY,
	  "a migration is already in progress (QEMU status active)" },
	{ "a migration in an unknown state",
	  { 0 },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{\"status\": \"hyperspace\"}"), END },
	  -EBUSY,
	  "QEMU status hyperspace" },
	{ "a cancel not yet done",
	  { 0 },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{\"status\": \"cancelling\"}"), END },
	  -EBUSY,
	  "cancelling" },
	{ "post-copy with multifd on 7.2",
	  { .post_copy = true },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{}"),
	    EXPECT("query-migrate-capabilities", NULL), OK(CAPS("true", "false")), END },
	  -EOPNOTSUPP,
	  "postcopy-ram: multifd is on, and QEMU 7.2 cannot do postcopy with multifd" },
	{ "QEMU refuses a capability",
	  { .auto_converge = true, .post_copy = true },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{}"),
	    EXPECT("query-migrate-capabilities", NULL), OK(CAPS("false", "false")),
	    EXPECT("migrate-set-capabilities",
		   CAPS_ARGS(CAP("events") ", " CAP("auto-converge") ", " CAP("postcopy-ram"))),
	    QERR("Postcopy is not compatible with ignore-shared"), END },
	  -EIO,
	  "migrate-set-capabilities events auto-converge=on postcopy-ram: Postcopy is not "
	  "compatible with ignore-shared" },
	{ "QEMU refuses a parameter",
	  { .max_downtime_ms = 2000001 },
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{}"),
	    EXPECT("migrate-set-capabilities", CAPS_ARGS(CAP("events") ", " CAPOFF("auto-converge"))), OK("{}"),
	    EXPECT("migrate-set-parameters", "{\"downtime-limit\": 2000001}"),
	    QERR("Parameter 'downtime_limit' expects an integer in the range of 0 to (2000 * "
		 "1000) ms"),
	    END },
	  -EIO,
	  "migrate-set-parameters: Parameter 'downtime_limit' expects" },
};

static void test_prepare(void **state)
{
	for (size_t i = 0; i < sizeof(prepare_cases) / sizeof(prepare_cases[0]); i++) {
		const struct prepare_case *c = &prepare_cases[i];
		struct fake *f = fake_start(c->script);
		struct cv_backend *b = open_ok(f, 2000);
		char err[256] = "";
		int r = b->ops->prepare(b, &c->setup, err, sizeof(err));

		if (r != c->want)
			fail_msg("%s: returned %d (%s), want %d", c->name, r, err, c->want);
		if (c->needle) {
			assert_one_line(err);
			if (!strstr(err, c->needle) || !strstr(b->ops->error(b), c->needle))
				fail_msg("%s: \"%s\" / \"%s\" do not say \"%s\"", c->name, err,
					 b->ops->error(b), c->needle);
		}
		b->ops->free(b);
		fake_finish(f);
	}
}

/* On 10.1, multifd with postcopy is QEMU's to allow: no capability query first. */
static void test_prepare_postcopy_10_1(void **state)
{
	static const struct step script[] = {
		SEND(GREETING_101 "\r\n"),
		EXPECT("qmp_capabilities", NULL),
		OK("{}"),
		EXPECT("query-migrate", NULL),
		OK("{}"),
		EXPECT("migrate-set-capabilities",
		       CAPS_ARGS(CAP("events") ", " CAPOFF("auto-converge") ", " CAP("postcopy-ram"))),
		OK("{}"),
		END
	};
	struct cv_setup s = { .post_copy = true };
	struct fake *f = fake_start(script);
	struct cv_backend *b = open_ok(f, 2000);
	char err[256] = "";

	assert_int_equal(b->ops->prepare(b, &s, err, sizeof(err)), 0);
	b->ops->free(b);
	fake_finish(f);
}

/* ------------------------------------------------------------------------------------------ */
/* The actions. */

enum action { A_BANDWIDTH, A_DOWNTIME, A_THROTTLE, A_POSTCOPY, A_PAUSE, A_RESUME, A_ABORT };

struct action_case {
	const char *name;
	enum action act;
	uint64_t x, y;
	struct step script[10];
	int want;
	const char *needle;
};

static const struct action_case action_cases[] = {
	{ "bandwidth 0 is unlimited",
	  A_BANDWIDTH,
	  0,
	  0,
	  { HANDSHAKE, EXPECT("migrate-set-parameters", "{\"max-bandwidth\": 2251799813685247}"),
	    OK("{}"), END },
	  0,
	  NULL },
	{ "bandwidth 1 MB/s",
	  A_BANDWIDTH,
	  1000000,
	  0,
	  { HANDSHAKE, EXPECT("migrate-set-parameters", "{\"max-bandwidth\": 1000000}"), OK("{}"),
	    END },
	  0,
	  NULL },
	{ "bandwidth beyond QEMU's maximum",
	  A_BANDWIDTH,
	  UINT64_MAX,
	  0,
	  { HANDSHAKE, EXPECT("migrate-set-parameters", "{\"max-bandwidth\": 2251799813685247}"),
	    OK("{}"), END },
	  0,
	  NULL },
	{ "downtime",
	  A_DOWNTIME,
	  750,
	  0,
	  { HANDSHAKE, EXPECT("migrate-set-parameters", "{\"downtime-limit\": 750}"), OK("{}"),
	    END },
	  0,
	  NULL },
	{ "downtime refused",
	  A_DOWNTIME,
	  2000001,
	  0,
	  { HANDSHAKE, EXPECT("migrate-set-parameters", "{\"downtime-limit\": 2000001}"),
	    QERR("Parameter 'downtime_limit' expects an integer in the range of 0 to (2000 * "
		 "1000) ms"),
	    END },
	  -EIO,
	  "migrate-set-parameters: Parameter 'downtime_limit' expects an integer" },
	{ "throttle",
	  A_THROTTLE,
	  30,
	  5,
	  { HANDSHAKE, EXPECT("query-migrate-capabilities", NULL), OK(CAPS("false", "true")),
	    EXPECT("migrate-set-parameters",
		   "{\"cpu-throttle-initial\": 30, \"cpu-throttle-increment\": 5, "
		   "\"throttle-trigger-threshold\": 50, \"cpu-throttle-tailslow\": true}"),
	    OK("{}"), END },
	  0,
	  NULL },
	{ "throttle clamped to 1..99",
	  A_THROTTLE,
	  0,
	  150,
	  { HANDSHAKE, EXPECT("query-migrate-capabilities", NULL), OK(CAPS("false", "true")),
	    EXPECT("migrate-set-parameters",
		   "{\"cpu-throttle-initial\": 1, \"cpu-throttle-increment\": 99, "
		   "\"throttle-trigger-threshold\": 50, \"cpu-throttle-tailslow\": true}"),
	    OK("{}"), END },
	  0,
	  NULL },
	{ "throttle without auto-converge",
	  A_THROTTLE,
	  30,
	  5,
	  { HANDSHAKE, EXPECT("query-migrate-capabilities", NULL), OK(CAPS("false", "false")),
	    END },
	  -EOPNOTSUPP,
	  "auto-converge is off" },
	{ "postcopy",
	  A_POSTCOPY,
	  0,
	  0,
	  { HANDSHAKE, EXPECT("query-migrate-capabilities", NULL), OK(CAPS("false", "false")),
	    EXPECT("migrate-start-postcopy", NULL), OK("{}"), END },
	  0,
	  NULL },
	{ "postcopy with multifd on 7.2",
	  A_POSTCOPY,
	  0,
	  0,
	  { HANDSHAKE, EXPECT("query-migrate-capabilities", NULL), OK(CAPS("true", "false")), END },
	  -EOPNOTSUPP,
	  "migrate-start-postcopy: multifd is on" },
	{ "postcopy not enabled",
	  A_POSTCOPY,
	  0,
	  0,
	  { HANDSHAKE, EXPECT("query-migrate-capabilities", NULL), OK(CAPS("false", "false")),
	    EXPECT("migrate-start-postcopy", NULL),
	    QERR("Enable postcopy with migrate_set_capability before the start of migration"),
	    END },
	  -EIO,
	  "migrate-start-postcopy: Enable postcopy with migrate_set_capability" },
	{ "pause",
	  A_PAUSE,
	  0,
	  0,
	  { HANDSHAKE, EXPECT("stop", NULL), SEND(EV("STOP")), OK("{}"), END },
	  0,
	  NULL },
	{ "resume",
	  A_RESUME,
	  0,
	  0,
	  { HANDSHAKE, EXPECT("cont", NULL), SEND(EV("RESUME")), OK("{}"), END },
	  0,
	  NULL },
	{ "resume refused",
	  A_RESUME,
	  0,
	  0,
	  { HANDSHAKE, EXPECT("cont", NULL), QERR("Migration is not finalized yet"), END },
	  -EIO,
	  "cont: Migration is not finalized yet" },
	{ "abort",
	  A_ABORT,
	  0,
	  0,
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{\"status\": \"active\"}"),
	    EXPECT("migrate_cancel", NULL), OK("{}"), SEND(EV_MIGRATION("cancelling")), END },
	  0,
	  NULL },
	{ "abort refused in postcopy",
	  A_ABORT,
	  0,
	  0,
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{\"status\": \"postcopy-active\"}"),
	    END },
	  -EBUSY,
	  "cancelling it would lose the guest" },
	{ "abort refused in an unknown postcopy state",
	  A_ABORT,
	  0,
	  0,
	  { HANDSHAKE, EXPECT("query-migrate", NULL), OK("{\"status\": \"postcopy-warp\"}"), END },
	  -EBUSY,
	  "in postcopy" },
};

static int run_action(struct cv_backend *b, const struct action_case *c)
{
	switch (c->act) {
	case A_BANDWIDTH:
		return b->ops->set_bandwidth(b, c->x);
	case A_DOWNTIME:
		return b->ops->set_downtime(b, c->x);
	case A_THROTTLE:
		return b->ops->set_throttle(b, (unsigned int)c->x, (unsigned int)c->y);
	case A_POSTCOPY:
		return b->ops->start_postcopy(b);
	case A_PAUSE:
		return b->ops->pause(b);
	case A_RESUME:
		return b->ops->resume(b);
	case A_ABORT:
		return b->ops->abort(b);
	}
	return -EINVAL;
}

static void test_actions(void **state)
{
	for (size_t i = 0; i < sizeof(action_cases) / sizeof(action_cases[0]); i++) {
		const struct action_case *c = &action_cases[i];
		struct fake *f = fake_start(c->script);
		struct cv_backend *b = open_ok(f, 2000);
		int r = run_action(b, c);

		if (r != c->want)
			fail_msg("%s: returned %d (%s), want %d", c->name, r, b->ops->error(b),
				 c->want);
		if (c->needle) {
			assert_one_line(b->ops->error(b));
			if (!strstr(b->ops->error(b), c->needle))
				fail_msg("%s: \"%s\" does not say \"%s\"", c->name,
					 b->ops->error(b), c->needle);
		}
		b->ops->free(b);
		fake_finish(f);
	}
}

/* ------------------------------------------------------------------------------------------ */
/* query() through the socket, and what goes wrong on the way. */

static void test_query_with_events(void **state)
{
	static const struct step script[] = {
		HANDSHAKE,
		EXPECT("query-migrate", NULL),
		SEND(EV_MIGRATION("active")),
		SEND("{\"event\": \"MIGRATION_PASS\", \"data\": {\"pass\": 2}}\r\n"),
		SEND(EV("STOP")),
		/* A reply to someone else's id is not ours. */
		SEND("{\"return\": {\"status\": \"failed\"}, \"id\": \"not-ours\"}\r\n"),
		WITH_ID(R92_ACTIVE),
		EXPECT("query-status", NULL),
		SEND(EV("RESUME")),
		WITH_ID(S10_RUNNING),
		END,
	};
	struct fake *f = fake_start(script);
	struct cv_backend *b = open_ok(f, 2000);
	struct cv_job job, want = parse_cases[7].want;

	assert_int_equal(b->ops->query(b, &job), 0);
	assert_job_equal("query", &job, &want);
	b->ops->free(b);
	fake_finish(f);
}

/* A reply of 900 KiB (within the limit), then one of 2 MiB (beyond): -EPROTO, and the next call
 * works, the rest of the long line skipped. */
static void test_long_lines(void **state)
{
	static char padded[960 << 10];
	static const struct step script_tmpl[] = {
		HANDSHAKE,
		EXPECT("query-migrate", NULL),
		REPLY(NULL), /* padded */
		EXPECT("query-status", NULL),
		OK("{\"status\": \"running\", \"running\": true}"),
		EXPECT("stop", NULL),
		BIG(2u << 20),
		EXPECT("cont", NULL),
		OK("{}"),
		END,
	};
	struct step script[sizeof(script_tmpl) / sizeof(script_tmpl[0])];
	struct fake *f;
	struct cv_backend *b;
	struct cv_job job;
	int n;

	n = snprintf(padded, sizeof(padded),
		     "{\"id\": @ID@, \"return\": {\"status\": \"active\", "
		     "\"padding\": \"");
	memset(padded + n, 'p', (900 << 10) - n);
	snprintf(padded + (900 << 10), sizeof(padded) - (900 << 10), "\"}}\r\n");
	memcpy(script, script_tmpl, sizeof(script));
	script[4].a = padded;
	f = fake_start(script);
	b = open_ok(f, 3000);
	assert_int_equal(b->ops->query(b, &job), 0);
	assert_int_equal(job.status, CV_ST_ACTIVE);
	assert_true(job.guest_running);
	assert_int_equal(b->ops->pause(b), -EPROTO);
	assert_contains(b->ops->error(b), "over 1048576 bytes");
	assert_int_equal(b->ops->resume(b), 0);
	b->ops->free(b);
	fake_finish(f);
}

static void test_timeout(void **state)
{
	static const struct step script[] = {
		HANDSHAKE,
		SEND(EV_MIGRATION("active")),
		EXPECT("stop", NULL),
		SLEEP(700),
		OK("{}"), /* late: stop has given up; cont must not take it for its own */
		EXPECT("cont", NULL),
		QERR("cont's own reply"),
		END,
	};
	struct fake *f = fake_start(script);
	struct cv_backend *b = open_ok(f, 500);
	uint64_t t0 = now_ms(), took;

	assert_int_equal(b->ops->pause(b), -ETIMEDOUT);
	took = now_ms() - t0;
	if (took < 500 || took > 750)
		fail_msg("timed out after %" PRIu64 " ms, not ~500", took);
	assert_one_line(b->ops->error(b));
	assert_contains(b->ops->error(b), "no reply to stop in 500 ms");
	assert_contains(b->ops->error(b), "last events: migration active");
	assert_int_equal(b->ops->resume(b), -EIO);
	assert_string_equal(b->ops->error(b), "cont: cont's own reply");
	b->ops->free(b);
	fake_finish(f);
}

static void test_closed(void **state)
{
	static const struct step script[] = {
		HANDSHAKE,
		EXPECT("query-migrate", NULL),
		SEND("{\"return\": {\"sta"),
		CLOSE,
	};
	struct fake *f = fake_start(script);
	struct cv_backend *b = open_ok(f, 2000);
	struct cv_job job, canary;
	uint64_t t0;

	memset(&job, 0x5a, sizeof(job));
	canary = job;
	assert_int_equal(b->ops->query(b, &job), -ECONNRESET);
	assert_memory_equal(&job, &canary, sizeof(job));
	assert_contains(b->ops->error(b), "QEMU closed its QMP socket");
	fake_finish(f);
	/* Every later call says the same, at once. */
	t0 = now_ms();
	assert_int_equal(b->ops->pause(b), -ECONNRESET);
	assert_int_equal(b->ops->abort(b), -ECONNRESET);
	assert_true(now_ms() - t0 < 100);
	assert_contains(b->ops->error(b), "QEMU closed its QMP socket");
	b->ops->free(b);
}

struct bad_reply_case {
	const char *name;
	const char *reply; /* to query-migrate */
	int want;
	const char *needle;
};

static const struct bad_reply_case bad_replies[] = {
	{ "garbage", "this is not json\r\n", -EPROTO, "not a JSON object: this is not json" },
	{ "a JSON array", "[{\"return\": {}}]\r\n", -EPROTO, "not a JSON object" },
	{ "neither return nor error", "{\"id\": @ID@, \"result\": {}}\r\n", -EPROTO,
	  "neither a return nor an error" },
	{ "return not an object", "{\"id\": @ID@, \"return\": []}\r\n", -EPROTO,
	  "query-migrate: QEMU's return is not an object" },
	{ "ram.total a string", "{\"id\": @ID@, \"return\": {\"ram\": {\"total\": \"1\"}}}\r\n",
	  -EPROTO, "ram.total is a string, not an integer" },
	{ "status a number", "{\"id\": @ID@, \"return\": {\"status\": 5}}\r\n", -EPROTO,
	  "status is an integer, not a string" },
	{ "an error without an id",
	  "{\"error\": {\"class\": \"GenericError\", \"desc\": \"JSON parse error\"}}\r\n", -EIO,
	  "query-migrate: JSON parse error" },
	{ "an error without a desc", "{\"id\": @ID@, \"error\": {\"class\": 3}}\r\n", -EPROTO,
	  "neither a return nor an error with a desc" },
};

static void test_bad_replies(void **state)
{
	for (size_t i = 0; i < sizeof(bad_replies) / sizeof(bad_replies[0]); i++) {
		const struct bad_reply_case *c = &bad_replies[i];
		struct step script[] = {
			HANDSHAKE,
			EXPECT("query-migrate", NULL),
			REPLY(c->reply),
			EXPECT("query-status", NULL),
			OK("{\"running\": true}"),
			END,
		};
		struct fake *f;
		struct cv_backend *b;
		struct cv_job job;
		int r;

		/* A malformed migrate reply ends query() before query-status is sent. */
		if (c->want != 0 && !strstr(c->name, "ram.total") && !strstr(c->name, "status a"))
			script[5] = (struct step)END;
		f = fake_start(script);
		b = open_ok(f, 2000);
		r = b->ops->query(b, &job);
		if (r != c->want)
			fail_msg("%s: returned %d (%s), want %d", c->name, r, b->ops->error(b),
				 c->want);
		assert_one_line(b->ops->error(b));
		if (!strstr(b->ops->error(b), c->needle))
			fail_msg("%s: \"%s\" does not say \"%s\"", c->name, b->ops->error(b),
				 c->needle);
		b->ops->free(b);
		fake_finish(f);
	}
}

/* Two threads on one backend: the lock keeps each command with its own reply. */
struct worker {
	struct cv_backend *b;
	int fails;
};

static void *query_worker(void *arg)
{
	struct worker *w = arg;

	for (int i = 0; i < 50; i++) {
		struct cv_job job;

		if (w->b->ops->query(w->b, &job) != 0 || job.status != CV_ST_ACTIVE ||
		    !job.guest_running)
			w->fails++;
	}
	return NULL;
}

static void *echo_server(void *arg)
{
	int fd = accept(*(int *)arg, NULL, NULL);
	char buf[65536];
	size_t len = 0;

	(void)!write(fd, GREETING_72 "\r\n", strlen(GREETING_72) + 2);
	for (;;) {
		char *nl = memchr(buf, '\n', len);
		struct json_object *o, *id, *cmd;
		char out[4096];

		if (!nl) {
			ssize_t k = read(fd, buf + len, sizeof(buf) - len);

			if (k <= 0)
				break;
			len += (size_t)k;
			continue;
		}
		*nl = '\0';
		o = json_tokener_parse(buf);
		memmove(buf, nl + 1, len - (size_t)(nl + 1 - buf));
		len -= (size_t)(nl + 1 - buf);
		if (!o || !json_object_object_get_ex(o, "id", &id) ||
		    !json_object_object_get_ex(o, "execute", &cmd)) {
			json_object_put(o);
			break;
		}
		/* An event before each reply, and the replies in two writes. */
		snprintf(out, sizeof(out), "%s{\"return\": %s, \"id\": %s}\r\n", EV("STOP"),
			 strcmp(json_object_get_string(cmd), "query-migrate") == 0
				 ? "{\"status\": \"active\"}"
			 : strcmp(json_object_get_string(cmd), "query-status") == 0
				 ? "{\"status\": \"running\", \"running\": true}"
				 : "{}",
			 json_object_to_json_string(id));
		(void)!write(fd, out, strlen(out) / 2);
		(void)!write(fd, out + strlen(out) / 2, strlen(out) - strlen(out) / 2);
		json_object_put(o);
	}
	close(fd);
	return NULL;
}

static void test_threads(void **state)
{
	char dir[] = "/tmp/test-cv-qmp.XXXXXX", path[96], err[256];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct worker w[2] = { { 0 } };
	pthread_t server, t[2];
	struct cv_backend *b;
	int lfd;

	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/qmp.sock", dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 1), 0);
	assert_int_equal(pthread_create(&server, NULL, echo_server, &lfd), 0);
	assert_int_equal(cv_qmp_open(path, 2000, &b, err, sizeof(err)), 0);
	for (int i = 0; i < 2; i++) {
		w[i].b = b;
		assert_int_equal(pthread_create(&t[i], NULL, query_worker, &w[i]), 0);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	b->ops->free(b);
	pthread_join(server, NULL);
	close(lfd);
	unlink(path);
	rmdir(dir);
	assert_int_equal(w[0].fails + w[1].fails, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_real_replies),
		cmocka_unit_test(test_parse_states),
		cmocka_unit_test(test_parse_rejects),
		cmocka_unit_test(test_parse_long),
		cmocka_unit_test(test_open_ok),
		cmocka_unit_test(test_open_failures),
		cmocka_unit_test(test_open_no_socket),
		cmocka_unit_test(test_open_link_refused),
		cmocka_unit_test(test_prepare),
		cmocka_unit_test(test_prepare_postcopy_10_1),
		cmocka_unit_test(test_actions),
		cmocka_unit_test(test_query_with_events),
		cmocka_unit_test(test_long_lines),
		cmocka_unit_test(test_timeout),
		cmocka_unit_test(test_closed),
		cmocka_unit_test(test_bad_replies),
		cmocka_unit_test(test_threads),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
