// SPDX-License-Identifier: Apache-2.0
/* Paths in directories others may write (transport/xp_path.h, xp_unix_listen_at and
 * xp_unix_connect_checked in xp_sock.h): on a real temporary tree, links planted where a
 * hostile user of that directory would put them. No root needed; tests/integration/
 * test_threats.py runs the same attacks as another user against a root daemon. */
#include <errno.h>
#include <fcntl.h>
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

#include "xp_path.h"
#include "xp_sock.h"

struct t {
	char dir[64];
};

static int setup(void **state)
{
	struct t *t = calloc(1, sizeof(*t));

	strcpy(t->dir, "/tmp/vmigd-test-path-XXXXXX");
	assert_non_null(mkdtemp(t->dir));
	*state = t;
	return 0;
}

static int teardown(void **state)
{
	struct t *t = *state;
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", t->dir);
	assert_int_equal(system(cmd), 0);
	free(t);
	return 0;
}

/* dir/name, in a static buffer (one at a time). */
static const char *at(const struct t *t, const char *name)
{
	static char buf[2][256];
	static unsigned int k;

	k ^= 1;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", t->dir, name);
	return buf[k];
}

static mode_t mode_of(const char *path)
{
	struct stat st;

	assert_int_equal(lstat(path, &st), 0);
	return st.st_mode & 07777;
}

static void test_open_dir(void **state)
{
	struct t *t = *state;
	char path[256];
	int fd;

	assert_int_equal(mkdir(at(t, "real"), 0755), 0);
	assert_int_equal(symlink(at(t, "real"), at(t, "link")), 0);
	assert_int_equal(symlink("/proc/self/root", at(t, "magic")), 0);
	assert_int_equal(xp_path_open_dir(at(t, "real"), &fd), 0);
	close(fd);
	/* A link anywhere in a plain path is refused, not followed. */
	assert_int_equal(xp_path_open_dir(at(t, "link"), &fd), -ELOOP);
	snprintf(path, sizeof(path), "%s/link/.", t->dir);
	assert_int_equal(xp_path_open_dir(path, &fd), -ELOOP);
	assert_int_equal(xp_path_open_dir("relative/dir", &fd), -EINVAL);
	/* Below /proc/PID/root the rest resolves inside that root; links there are followed
	 * (inside it), a magic link never. */
	snprintf(path, sizeof(path), "/proc/%d/root%s/link", (int)getpid(), t->dir);
	assert_int_equal(xp_path_open_dir(path, &fd), 0);
	close(fd);
	snprintf(path, sizeof(path), "/proc/%d/root%s/magic/tmp", (int)getpid(), t->dir);
	assert_int_equal(xp_path_open_dir(path, &fd), -ELOOP);
	snprintf(path, sizeof(path), "/proc/%d/root", (int)getpid());
	assert_int_equal(xp_path_open_dir(path, &fd), 0);
	close(fd);
	/* Only digits: /proc/self is a link the caller did not name as a root. */
	snprintf(path, sizeof(path), "/proc/self/root%s/real", t->dir);
	assert_int_equal(xp_path_open_dir(path, &fd), -ELOOP);
}

/* migrationproxy/ gets its mode whatever the umask; a link or a file in its place is refused
 * and what the link points to is left as it was. */
static void test_make_dir(void **state)
{
	struct t *t = *state;
	struct xp_unix_owner o = { -1, -1, 0750 };
	mode_t old = umask(077);
	int base, fd;

	assert_int_equal(xp_path_open_dir(t->dir, &base), 0);
	assert_int_equal(xp_path_make_dir(base, "mp", &o, &fd), 0);
	close(fd);
	umask(old);
	assert_int_equal(mode_of(at(t, "mp")), 0750);
	assert_int_equal(chmod(at(t, "mp"), 0700), 0);
	assert_int_equal(xp_path_make_dir(base, "mp", &o, &fd), 0);
	close(fd);
	assert_int_equal(mode_of(at(t, "mp")), 0750);

	assert_int_equal(mkdir(at(t, "victim"), 0700), 0);
	assert_int_equal(symlink(at(t, "victim"), at(t, "ln")), 0);
	assert_int_equal(xp_path_make_dir(base, "ln", &o, &fd), -ELOOP);
	assert_int_equal(mode_of(at(t, "victim")), 0700);
	assert_int_equal(close(open(at(t, "file"), O_CREAT | O_WRONLY, 0600)), 0);
	assert_int_equal(xp_path_make_dir(base, "file", &o, &fd), -ENOTDIR);
	assert_int_equal(xp_path_make_dir(base, "../x", &o, &fd), -EINVAL);
	close(base);
}

static void test_listen_at(void **state)
{
	struct t *t = *state;
	struct xp_unix_owner o = { -1, -1, 0660 };
	mode_t old = umask(0);
	int dfd, lfd, lfd2;

	assert_int_equal(xp_path_open_dir(t->dir, &dfd), 0);
	/* The mode comes from the umask at bind(), whatever the process's was. */
	assert_int_equal(xp_unix_listen_at(dfd, "a.sock", 16, &o, &lfd), 0);
	assert_int_equal(mode_of(at(t, "a.sock")), 0660);
	umask(077);
	/* A stale socket is replaced. */
	assert_int_equal(xp_unix_listen_at(dfd, "a.sock", 16, &o, &lfd2), 0);
	assert_int_equal(mode_of(at(t, "a.sock")), 0660);
	umask(old);
	close(lfd);
	/* A link is never replaced nor followed; another file is left alone. */
	assert_int_equal(close(open(at(t, "victim"), O_CREAT | O_WRONLY, 0600)), 0);
	assert_int_equal(symlink(at(t, "victim"), at(t, "b.sock")), 0);
	assert_int_equal(xp_unix_listen_at(dfd, "b.sock", 16, &o, &lfd), -ELOOP);
	assert_int_equal(mode_of(at(t, "victim")), 0600);
	assert_int_equal(xp_unix_listen_at(dfd, "victim", 16, &o, &lfd), -EEXIST);
	/* unlink_at removes sockets only. */
	xp_unix_unlink_at(dfd, "b.sock");
	xp_unix_unlink_at(dfd, "victim");
	assert_int_equal(access(at(t, "victim"), F_OK), 0);
	xp_unix_unlink_at(dfd, "a.sock");
	assert_int_equal(access(at(t, "a.sock"), F_OK), -1);
	close(lfd2);
	close(dfd);
}

/* Whether a connection waits on listener lfd. */
static bool pending(int lfd)
{
	int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);

	if (fd < 0)
		return false;
	close(fd);
	return true;
}

static void test_connect_checked(void **state)
{
	struct t *t = *state;
	int dfd, lfd, fd;

	assert_int_equal(xp_path_open_dir(t->dir, &dfd), 0);
	assert_int_equal(xp_unix_listen_at(dfd, "qemu.sock", 16, NULL, &lfd), 0);
	assert_int_equal(xp_unix_connect_checked(at(t, "qemu.sock"), -1, 1000, &fd), 0);
	close(fd);
	assert_true(pending(lfd));
	/* A link to a socket (vmigd's own control socket, say) is refused, nothing connects. */
	assert_int_equal(symlink(at(t, "qemu.sock"), at(t, "ln.sock")), 0);
	assert_int_equal(xp_unix_connect_checked(at(t, "ln.sock"), -1, 1000, &fd), -ELOOP);
	assert_int_equal(mkdir(at(t, "sub"), 0755), 0);
	assert_int_equal(symlink(t->dir, at(t, "sub/up")), 0);
	assert_int_equal(xp_unix_connect_checked(at(t, "sub/up/qemu.sock"), -1, 1000, &fd),
			 -ELOOP);
	assert_false(pending(lfd));
	assert_int_equal(close(open(at(t, "file"), O_CREAT | O_WRONLY, 0600)), 0);
	assert_int_equal(xp_unix_connect_checked(at(t, "file"), -1, 1000, &fd), -ENOTSOCK);
	assert_int_equal(xp_unix_connect_checked(at(t, "none.sock"), -1, 1000, &fd), -ENOENT);
	assert_string_equal(xp_path_strerror(-ELOOP),
			    "a symbolic link is in the way (vmigd never follows one there)");
	close(lfd);
	close(dfd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_open_dir, setup, teardown),
		cmocka_unit_test_setup_teardown(test_make_dir, setup, teardown),
		cmocka_unit_test_setup_teardown(test_listen_at, setup, teardown),
		cmocka_unit_test_setup_teardown(test_connect_checked, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
