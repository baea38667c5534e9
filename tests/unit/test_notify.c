// SPDX-License-Identifier: Apache-2.0
/* Unit tests for ctl_notify (ctrl/ctl_notify.h) against real datagram sockets standing in for
 * systemd's: a path and an abstract name, the sender's credentials as systemd checks them, each
 * refusal, and a receiver that does not read (its queue full: -EAGAIN, never a wait). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "ctl_notify.h"

struct receiver {
	char dir[64];
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int fd;
};

/* A datagram socket bound like systemd's, with SO_PASSCRED so that a datagram carries the
 * sender's pid. name: "@abstract" or NULL for a path in a fresh directory. */
static void receiver_open(struct receiver *rx, const char *name)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	socklen_t len;
	int on = 1;

	memset(rx, 0, sizeof(*rx));
	rx->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(rx->fd >= 0);
	assert_int_equal(setsockopt(rx->fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)), 0);
	if (name) {
		snprintf(rx->path, sizeof(rx->path), "%s", name);
		memcpy(sa.sun_path + 1, name + 1, strlen(name) - 1);
		len = offsetof(struct sockaddr_un, sun_path) + strlen(name);
	} else {
		strcpy(rx->dir, "/tmp/vmig-notify-XXXXXX");
		assert_non_null(mkdtemp(rx->dir));
		snprintf(rx->path, sizeof(rx->path), "%s/notify", rx->dir);
		strcpy(sa.sun_path, rx->path);
		len = sizeof(sa);
	}
	assert_int_equal(bind(rx->fd, (struct sockaddr *)&sa, len), 0);
	assert_int_equal(setenv("NOTIFY_SOCKET", rx->path, 1), 0);
}

static void receiver_close(struct receiver *rx)
{
	if (rx->fd >= 0)
		close(rx->fd);
	if (rx->dir[0]) {
		unlink(rx->path);
		rmdir(rx->dir);
	}
	unsetenv("NOTIFY_SOCKET");
}

/* The next datagram, exactly as sent (no NUL added), and that this process sent it. */
static void expect_datagram(struct receiver *rx, const char *want)
{
	char buf[4096], cbuf[CMSG_SPACE(sizeof(struct ucred))];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov,
			     .msg_iovlen = 1,
			     .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *c;
	struct ucred uc;
	ssize_t n;

	/* A unix datagram is queued before sendto returns: nothing to wait for. */
	n = recvmsg(rx->fd, &mh, MSG_DONTWAIT);
	assert_int_equal(n, strlen(want));
	assert_memory_equal(buf, want, n);
	c = CMSG_FIRSTHDR(&mh);
	assert_non_null(c);
	assert_int_equal(c->cmsg_level, SOL_SOCKET);
	assert_int_equal(c->cmsg_type, SCM_CREDENTIALS);
	memcpy(&uc, CMSG_DATA(c), sizeof(uc));
	assert_int_equal(uc.pid, getpid());
}

static void expect_nothing(struct receiver *rx)
{
	char buf[16];

	assert_int_equal(recv(rx->fd, buf, sizeof(buf), MSG_DONTWAIT), -1);
	assert_int_equal(errno, EAGAIN);
}

static void test_unset_is_a_no_op(void **state)
{
	unsetenv("NOTIFY_SOCKET");
	assert_int_equal(ctl_notify("READY=1"), 0);
	assert_int_equal(setenv("NOTIFY_SOCKET", "", 1), 0);
	assert_int_equal(ctl_notify("READY=1"), 0);
	unsetenv("NOTIFY_SOCKET");
}

static void test_path(void **state)
{
	struct receiver rx;

	receiver_open(&rx, NULL);
	assert_int_equal(ctl_notify("READY=1"), 0);
	assert_int_equal(ctl_notify("STATUS=draining 2 migrations\nSTOPPING=1"), 0);
	/* One datagram per call, boundaries kept. */
	expect_datagram(&rx, "READY=1");
	expect_datagram(&rx, "STATUS=draining 2 migrations\nSTOPPING=1");
	expect_nothing(&rx);
	receiver_close(&rx);
}

static void test_abstract(void **state)
{
	char name[64];
	struct receiver rx;

	snprintf(name, sizeof(name), "@vmig-notify-test-%d", (int)getpid());
	receiver_open(&rx, name);
	assert_int_equal(ctl_notify("STOPPING=1"), 0);
	expect_datagram(&rx, "STOPPING=1");
	expect_nothing(&rx);
	receiver_close(&rx);

	/* The name is exactly as long as written: no socket is bound to its prefix's address. */
	name[strlen(name) - 1] = '\0';
	assert_int_equal(setenv("NOTIFY_SOCKET", name, 1), 0);
	assert_int_equal(ctl_notify("READY=1"), -ECONNREFUSED);
	unsetenv("NOTIFY_SOCKET");
}

/* A receiver that stops reading fills its queue (net.unix.max_dgram_qlen datagrams); the next
 * ping fails at once instead of holding the control loop. */
static void test_full_queue(void **state)
{
	struct receiver rx;
	unsigned int i;
	int r = 0;

	receiver_open(&rx, NULL);
	for (i = 0; i < 100000 && r == 0; i++)
		r = ctl_notify("WATCHDOG=1");
	assert_int_equal(r, -EAGAIN);
	assert_true(i > 1);
	expect_datagram(&rx, "WATCHDOG=1");
	assert_int_equal(ctl_notify("WATCHDOG=1"), 0);
	receiver_close(&rx);
}

static void test_no_listener(void **state)
{
	struct receiver rx;

	receiver_open(&rx, NULL);
	/* The socket file stays, nothing reads it any more. */
	close(rx.fd);
	rx.fd = -1;
	assert_int_equal(ctl_notify("READY=1"), -ECONNREFUSED);
	receiver_close(&rx);

	assert_int_equal(setenv("NOTIFY_SOCKET", "/nonexistent/vmig/notify", 1), 0);
	assert_int_equal(ctl_notify("READY=1"), -ENOENT);
	unsetenv("NOTIFY_SOCKET");
}

static void test_bad_addresses(void **state)
{
	char longpath[200];

	assert_int_equal(setenv("NOTIFY_SOCKET", "run/notify", 1), 0);
	assert_int_equal(ctl_notify("READY=1"), -EAFNOSUPPORT);
	assert_int_equal(setenv("NOTIFY_SOCKET", "vsock:2:1234", 1), 0);
	assert_int_equal(ctl_notify("READY=1"), -EAFNOSUPPORT);
	assert_int_equal(setenv("NOTIFY_SOCKET", "@", 1), 0);
	assert_int_equal(ctl_notify("READY=1"), -EINVAL);
	memset(longpath, 'x', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = '\0';
	assert_int_equal(setenv("NOTIFY_SOCKET", longpath, 1), 0);
	assert_int_equal(ctl_notify("READY=1"), -ENAMETOOLONG);
	unsetenv("NOTIFY_SOCKET");
}

static void test_bad_state(void **state)
{
	struct receiver rx;

	receiver_open(&rx, NULL);
	assert_int_equal(ctl_notify(NULL), -EINVAL);
	assert_int_equal(ctl_notify(""), -EINVAL);
	expect_nothing(&rx);
	receiver_close(&rx);
}

/* A stream socket at the path (not systemd's kind): the error comes back, nothing hangs. */
static void test_stream_socket(void **state)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char dir[] = "/tmp/vmig-notify-XXXXXX";
	int fd;

	assert_non_null(mkdtemp(dir));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/notify", dir);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fd, 1), 0);
	assert_int_equal(setenv("NOTIFY_SOCKET", sa.sun_path, 1), 0);
	assert_int_equal(ctl_notify("READY=1"), -EPROTOTYPE);
	close(fd);
	unlink(sa.sun_path);
	rmdir(dir);
	unsetenv("NOTIFY_SOCKET");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_unset_is_a_no_op),
		cmocka_unit_test(test_path),
		cmocka_unit_test(test_abstract),
		cmocka_unit_test(test_full_queue),
		cmocka_unit_test(test_no_listener),
		cmocka_unit_test(test_bad_addresses),
		cmocka_unit_test(test_bad_state),
		cmocka_unit_test(test_stream_socket),
	};

	return cmocka_run_group_tests_name("ctl_notify", tests, NULL, NULL);
}
