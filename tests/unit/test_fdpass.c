// SPDX-License-Identifier: Apache-2.0
/* xp_send_fds() and xp_recv_line_fds() (transport/xp_sock.h), which a takeover hands its
 * listeners over with: on real unix socket pairs, with real fds. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "xp_sock.h"

static void pair(int sv[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
}

/* Whether fd is open. */
static bool open_fd(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

/* Two fds (a pipe's ends) ride on the first of two lines; each line comes back alone, the fds
 * with the first, working and close-on-exec. */
static void test_line_with_fds_then_plain_line(void **state)
{
	int sv[2], p[2], got[4];
	unsigned int n = 4;
	char buf[128], c = 0;
	ssize_t k;

	pair(sv);
	assert_int_equal(pipe(p), 0);
	assert_int_equal(xp_send_fds(sv[0], "{\"fds\":2}\n", 10, p, 2, 1000), 0);
	assert_int_equal(xp_send_fds(sv[0], "second\n", 7, NULL, 0, 1000), 0);
	close(p[0]);
	close(p[1]);
	k = xp_recv_line_fds(sv[1], buf, sizeof(buf), got, &n, 1000);
	assert_int_equal(k, 10);
	assert_string_equal(buf, "{\"fds\":2}\n");
	assert_int_equal(n, 2);
	assert_true(fcntl(got[0], F_GETFD) & FD_CLOEXEC);
	assert_int_equal(write(got[1], "x", 1), 1);
	assert_int_equal(read(got[0], &c, 1), 1);
	assert_int_equal(c, 'x');
	close(got[0]);
	close(got[1]);
	n = 4;
	k = xp_recv_line_fds(sv[1], buf, sizeof(buf), got, &n, 1000);
	assert_int_equal(k, 7);
	assert_string_equal(buf, "second\n");
	assert_int_equal(n, 0);
	close(sv[0]);
	close(sv[1]);
}

/* More fds than the caller has room for: the rest are closed, not leaked. */
static void test_extra_fds_closed(void **state)
{
	int sv[2], p[2], got[1];
	unsigned int n = 1;
	char buf[64];

	pair(sv);
	assert_int_equal(pipe(p), 0);
	assert_int_equal(xp_send_fds(sv[0], "two\n", 4, p, 2, 1000), 0);
	close(p[0]);
	assert_int_equal(xp_recv_line_fds(sv[1], buf, sizeof(buf), got, &n, 1000), 4);
	assert_int_equal(n, 1);
	close(got[0]);
	/* Every copy of the read end is gone: writing to the pipe fails. */
	assert_int_equal(write(p[1], "x", 1), -1);
	assert_int_equal(errno, EPIPE);
	close(p[1]);
	close(sv[0]);
	close(sv[1]);
}

/* The end of the stream before a newline, a line too long, no line in time: errors, and the
 * fds that came with the partial line are closed. */
static void test_errors(void **state)
{
	int sv[2], p[2], got[2];
	unsigned int n = 2;
	char buf[8];

	pair(sv);
	assert_int_equal(pipe(p), 0);
	assert_int_equal(xp_send_fds(sv[0], "half", 4, &p[0], 1, 1000), 0);
	close(p[0]);
	close(sv[0]);
	assert_int_equal(xp_recv_line_fds(sv[1], buf, sizeof(buf), got, &n, 1000), -ECONNRESET);
	assert_int_equal(n, 0);
	assert_int_equal(write(p[1], "x", 1), -1); /* the read end closed with the failure */
	close(p[1]);
	close(sv[1]);

	pair(sv);
	n = 2;
	assert_int_equal(xp_send_fds(sv[0], "0123456789\n", 11, NULL, 0, 1000), 0);
	assert_int_equal(xp_recv_line_fds(sv[1], buf, sizeof(buf), got, &n, 1000), -EMSGSIZE);
	/* What was not read is still there (callers close the connection). */
	n = 2;
	assert_int_equal(xp_recv_line_fds(sv[1], buf, sizeof(buf), got, &n, 50), 4);
	assert_string_equal(buf, "789\n");
	n = 2;
	assert_int_equal(xp_recv_line_fds(sv[1], buf, sizeof(buf), got, &n, 50), -ETIMEDOUT);
	close(sv[0]);
	close(sv[1]);
	assert_int_equal(xp_send_fds(-1, "x", 1, NULL, 0, 10), -EBADF);
	assert_int_equal(xp_send_fds(3, "", 0, NULL, 0, 10), -EINVAL);
	assert_false(open_fd(sv[0]));
}

/* A listening TCP socket is adopted with its address; anything else is refused. */
static void test_tcp_adopt(void **state)
{
	struct xp_addr a, bound, got;
	int fd, sv[2];

	assert_int_equal(xp_addr_parse("127.0.0.1:0", 1, &a), 0);
	assert_int_equal(xp_tcp_listen(&a, 4, &fd, &bound), 0);
	assert_int_equal(xp_tcp_adopt(fd, &got), 0);
	assert_int_equal(xp_addr_port(&got), xp_addr_port(&bound));
	close(fd);
	pair(sv);
	assert_int_equal(xp_tcp_adopt(sv[0], &got), -EINVAL);
	close(sv[0]);
	close(sv[1]);
	assert_int_equal(xp_tcp_adopt(sv[0], &got), -EBADF);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_line_with_fds_then_plain_line),
		cmocka_unit_test(test_extra_fds_closed),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_tcp_adopt),
	};

	/* Writes to a pipe with no reader must fail with EPIPE, not end the test. */
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
