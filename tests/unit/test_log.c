// SPDX-License-Identifier: Apache-2.0
/* Unit tests for lib/log.h: the line budget (a flood gives VM_LOG_LIMIT_BURST lines per window and
 * one summary with the number not logged; a quiet source logs every line), and the journal's
 * format (priority prefixes, no ident or pid) only where $JOURNAL_STREAM names stderr itself. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

static int saved_stderr = -1, pipe_rd = -1;

/* stderr into a pipe, read back by captured(). */
static int capture(void **state)
{
	int p[2];

	assert_int_equal(pipe2(p, O_NONBLOCK), 0);
	fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
	saved_stderr = dup(STDERR_FILENO);
	dup2(p[1], STDERR_FILENO);
	close(p[1]);
	pipe_rd = p[0];
	vm_log_setup("t", VM_LOG_INFO);
	return 0;
}

static int release(void **state)
{
	dup2(saved_stderr, STDERR_FILENO);
	close(saved_stderr);
	close(pipe_rd);
	return 0;
}

/* What was logged since the last call, as one string (static). */
static const char *captured(void)
{
	static char buf[1 << 20];
	ssize_t n = read(pipe_rd, buf, sizeof(buf) - 1);

	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

static unsigned int count(const char *s, const char *what)
{
	unsigned int n = 0;

	for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
		n++;
	return n;
}

static void test_flood(void **state)
{
	struct vm_log_limit l = { .what = "refusals" };
	uint64_t t0 = 1000000;
	const char *out;

	/* 100,000 refusals within one window: the burst, nothing more. */
	for (unsigned int i = 0; i < 100000; i++)
		vm_log_limited(&l, t0 + i / 100, VM_LOG_WARN, "refused %u", i);
	out = captured();
	assert_int_equal(count(out, "refused "), VM_LOG_LIMIT_BURST);
	assert_non_null(strstr(out, "refused 0\n"));
	assert_null(strstr(out, "not logged"));
	/* The window passes with no new refusal: the tick reports the rest, once. */
	vm_log_limit_flush(&l, t0 + VM_LOG_LIMIT_WINDOW_MS - 1);
	assert_string_equal(captured(), "");
	vm_log_limit_flush(&l, t0 + VM_LOG_LIMIT_WINDOW_MS);
	out = captured();
	assert_non_null(strstr(out, "warning: 99980 more refusals in the last 10 s were not "
				    "logged"));
	assert_non_null(strstr(out, "99980 not logged since start"));
	vm_log_limit_flush(&l, t0 + 3 * VM_LOG_LIMIT_WINDOW_MS);
	assert_string_equal(captured(), "");
	/* A new window has its own burst, and the total goes on. */
	for (unsigned int i = 0; i < VM_LOG_LIMIT_BURST + 5; i++)
		vm_log_limited(&l, t0 + 4 * VM_LOG_LIMIT_WINDOW_MS, VM_LOG_WARN, "again %u", i);
	assert_int_equal(count(captured(), "again "), VM_LOG_LIMIT_BURST);
	vm_log_limited(&l, t0 + 5 * VM_LOG_LIMIT_WINDOW_MS, VM_LOG_WARN, "later");
	out = captured();
	assert_non_null(strstr(out, "5 more refusals in the last 10 s"));
	assert_non_null(strstr(out, "99985 not logged since start"));
	assert_non_null(strstr(out, "later\n"));
}

static void test_quiet(void **state)
{
	struct vm_log_limit l = { .what = "refusals" };

	/* One line a second for a minute: every one logged, no summary. */
	for (unsigned int i = 0; i < 60; i++)
		vm_log_limited(&l, 5000 + i * 1000ull, VM_LOG_WARN, "refused %u", i);
	vm_log_limit_flush(&l, 5000 + 120 * 1000ull);
	const char *out = captured();

	assert_int_equal(count(out, "refused "), 60);
	assert_null(strstr(out, "not logged"));
}

/* $JOURNAL_STREAM as systemd sets it for a stderr whose fstat(2) is st, give or take d on the
 * inode. */
static void set_stream(const struct stat *st, unsigned long long d)
{
	char v[64];

	snprintf(v, sizeof(v), "%llu:%llu", (unsigned long long)st->st_dev,
		 (unsigned long long)st->st_ino + d);
	setenv("JOURNAL_STREAM", v, 1);
}

static void log_each(void)
{
	log_err("e %d", 1);
	log_warn("w %d", 2);
	log_info("i %d", 3);
	log_debug("d %d", 4);
}

static void test_journal(void **state)
{
	char want[256];
	struct stat st;

	assert_int_equal(fstat(STDERR_FILENO, &st), 0);
	/* stderr is the journal: each line's priority, the level word, no ident or pid. */
	set_stream(&st, 0);
	vm_log_setup("t", VM_LOG_DEBUG);
	log_each();
	assert_string_equal(captured(), "<3>error: e 1\n<4>warning: w 2\n<6>info: i 3\n"
					"<7>debug: d 4\n");
	/* Another stream (stderr redirected under systemd, or a child's): the plain format. */
	set_stream(&st, 1);
	vm_log_setup("t", VM_LOG_INFO);
	log_each();
	snprintf(want, sizeof(want), "t[%d]: error: e 1\nt[%d]: warning: w 2\nt[%d]: info: i 3\n",
		 (int)getpid(), (int)getpid(), (int)getpid());
	assert_string_equal(captured(), want);
	/* Garbage, and no variable at all: the plain format. */
	setenv("JOURNAL_STREAM", "8:x", 1);
	vm_log_setup("t", VM_LOG_INFO);
	log_warn("w %d", 2);
	snprintf(want, sizeof(want), "t[%d]: warning: w 2\n", (int)getpid());
	assert_string_equal(captured(), want);
	unsetenv("JOURNAL_STREAM");
	vm_log_setup("t", VM_LOG_INFO);
	log_warn("w %d", 2);
	assert_string_equal(captured(), want);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_flood),
		cmocka_unit_test(test_quiet),
		cmocka_unit_test(test_journal),
	};

	return cmocka_run_group_tests(tests, capture, release);
}
