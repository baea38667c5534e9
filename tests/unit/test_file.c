// SPDX-License-Identifier: Apache-2.0
/* Unit tests for lib/file.h: what vm_file_read_checked() reads, what it refuses (a FIFO, a device,
 * a directory, too big, a key others can read, a file others can write, a stranger's file), that
 * it never blocks, and the warning on a read-only mount (in a user namespace, where there is one).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "file.h"

static char dir[256];

static void path_of(char *out, const char *name)
{
	snprintf(out, PATH_MAX, "%s/%s", dir, name);
}

static void make(const char *name, const char *text, mode_t mode, char *out)
{
	int fd;

	path_of(out, name);
	fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

/* vm_file_read_checked() with msg printed; *data freed. */
static int rd(const char *path, const char *what, unsigned int flags, size_t max, char *msg,
	      size_t msglen, char *text, size_t textlen)
{
	char *data = NULL;
	size_t len = 12345;
	int r = vm_file_read_checked(path, what, flags, max, &data, &len, msg, msglen);

	print_message("%d \"%s\"\n", r, msg);
	if (r >= 0) {
		assert_non_null(data);
		assert_int_equal(strlen(data), len);
		if (text)
			snprintf(text, textlen, "%s", data);
		free(data);
	} else {
		assert_null(data);
		assert_int_equal(len, 12345);
	}
	return r;
}

static void test_reads(void **state)
{
	char p[PATH_MAX], link[PATH_MAX], msg[600], text[64];

	(void)state;
	make("ok.key", "secret\n", 0600, p);
	assert_int_equal(
		rd(p, "key", VM_FILE_SECRET, VM_FILE_MAX, msg, sizeof(msg), text, sizeof(text)), 0);
	assert_string_equal(text, "secret\n");
	assert_string_equal(msg, "");
	/* Links are followed: Kubernetes secret volumes are links into ..data. */
	path_of(link, "link.key");
	assert_int_equal(symlink("ok.key", link), 0);
	assert_int_equal(
		rd(link, "key", VM_FILE_SECRET, VM_FILE_MAX, msg, sizeof(msg), text, sizeof(text)),
		0);
	assert_string_equal(text, "secret\n");
	/* A certificate may be read by anyone. */
	make("ok.crt", "public\n", 0644, p);
	assert_int_equal(rd(p, "certificate", 0, VM_FILE_MAX, msg, sizeof(msg), NULL, 0), 0);
	/* Empty, and exactly max bytes. */
	make("empty", "", 0600, p);
	assert_int_equal(rd(p, "config", 0, VM_FILE_MAX, msg, sizeof(msg), text, sizeof(text)), 0);
	assert_string_equal(text, "");
	make("eight", "12345678", 0600, p);
	assert_int_equal(rd(p, "config", 0, 8, msg, sizeof(msg), text, sizeof(text)), 0);
	assert_string_equal(text, "12345678");
}

static void test_refusals(void **state)
{
	char p[PATH_MAX], msg[600];

	(void)state;
	path_of(p, "missing");
	assert_int_equal(rd(p, "CA", 0, VM_FILE_MAX, msg, sizeof(msg), NULL, 0), -ENOENT);
	assert_non_null(strstr(msg, p));
	assert_non_null(strstr(msg, "CA"));

	/* A FIFO with no writer: refused at once, not waited on. */
	path_of(p, "fifo");
	assert_int_equal(mkfifo(p, 0600), 0);
	assert_true(rd(p, "CA", 0, VM_FILE_MAX, msg, sizeof(msg), NULL, 0) < 0);
	assert_non_null(strstr(msg, "is a FIFO, not a regular file"));
	assert_non_null(strstr(msg, p));
	assert_true(rd("/dev/zero", "certificate", 0, VM_FILE_MAX, msg, sizeof(msg), NULL, 0) < 0);
	assert_string_equal(msg, "certificate /dev/zero is a character device, not a regular file");
	assert_int_equal(rd(dir, "config", 0, VM_FILE_MAX, msg, sizeof(msg), NULL, 0), -EISDIR);
	assert_non_null(strstr(msg, "is a directory"));

	make("nine", "123456789", 0600, p);
	assert_int_equal(rd(p, "config", 0, 8, msg, sizeof(msg), NULL, 0), -EFBIG);
	assert_non_null(strstr(msg, "larger than 8 bytes"));

	/* A key others (or the group) can read; any file others can write. */
	make("world.key", "secret\n", 0644, p);
	assert_int_equal(
		rd(p, "private key", VM_FILE_SECRET, VM_FILE_MAX, msg, sizeof(msg), NULL, 0),
		-EPERM);
	assert_non_null(
		strstr(msg, "is readable by its group and others (mode 0644); chmod 600 it"));
	assert_non_null(strstr(msg, p));
	make("group.key", "secret\n", 0640, p);
	assert_int_equal(
		rd(p, "private key", VM_FILE_SECRET, VM_FILE_MAX, msg, sizeof(msg), NULL, 0),
		-EPERM);
	assert_non_null(strstr(msg, "readable by its group (mode 0640)"));
	make("world.crt", "public\n", 0666, p);
	assert_int_equal(rd(p, "certificate", 0, VM_FILE_MAX, msg, sizeof(msg), NULL, 0), -EPERM);
	assert_non_null(strstr(msg, "is writable by its group and others (mode 0666); chmod go-w"));
	make("other.conf", "x\n", 0602, p);
	assert_int_equal(rd(p, "config", 0, VM_FILE_MAX, msg, sizeof(msg), NULL, 0), -EPERM);
	assert_non_null(strstr(msg, "writable by others (mode 0602)"));

	/* Someone else's file: only root can make one here. */
	if (geteuid() == 0) {
		make("stranger.crt", "public\n", 0644, p);
		assert_int_equal(chown(p, 4242, 4242), 0);
		assert_int_equal(rd(p, "CA", 0, VM_FILE_MAX, msg, sizeof(msg), NULL, 0), -EPERM);
		assert_non_null(strstr(msg, "is owned by uid 4242, not root; chown it"));
	}
}

/* In a child: a user and mount namespace, a tmpfs with a 0644 key, remounted read-only. 77 where
 * the namespaces are not to be had. */
static int ro_child(void)
{
	char p[PATH_MAX], msg[600], *data = NULL;
	size_t len;
	uid_t uid = geteuid();
	gid_t gid = getegid();
	int fd, r;

	if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0)
		return 77;
	/* Our uid as root inside, so that the file is "root's". */
	snprintf(p, sizeof(p), "0 %u 1", (unsigned int)uid);
	fd = open("/proc/self/uid_map", O_WRONLY);
	if (fd < 0 || write(fd, p, strlen(p)) < 0)
		return 77;
	close(fd);
	fd = open("/proc/self/setgroups", O_WRONLY);
	if (fd >= 0) {
		(void)!write(fd, "deny", 4);
		close(fd);
	}
	snprintf(p, sizeof(p), "0 %u 1", (unsigned int)gid);
	fd = open("/proc/self/gid_map", O_WRONLY);
	if (fd < 0 || write(fd, p, strlen(p)) < 0)
		return 77;
	close(fd);
	if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
	    mount("tmpfs", dir, "tmpfs", 0, "mode=0700") < 0)
		return 77;
	make("tls.key", "secret\n", 0644, p);
	if (mount(NULL, dir, NULL, MS_REMOUNT | MS_RDONLY, NULL) < 0)
		return 77;
	r = vm_file_read_checked(p, "private key", VM_FILE_SECRET, VM_FILE_MAX, &data, &len, msg,
				 sizeof(msg));
	fprintf(stderr, "read-only mount: %d \"%s\"\n", r, msg);
	if (r != 1 || !data || strcmp(data, "secret\n") != 0 ||
	    !strstr(msg, "readable by its group and others (mode 0644)") ||
	    !strstr(msg, "allowed: it is on a read-only mount"))
		return 1;
	free(data);
	/* Still refused there: what is not a regular file. */
	r = vm_file_read_checked(dir, "CA", 0, VM_FILE_MAX, &data, &len, msg, sizeof(msg));
	return r == -EISDIR ? 0 : 2;
}

static void test_read_only_mount(void **state)
{
	pid_t pid;
	int st;

	(void)state;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(ro_child());
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	if (WEXITSTATUS(st) == 77)
		skip();
	assert_int_equal(WEXITSTATUS(st), 0);
}

static int setup(void **state)
{
	char *d;

	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/vmig-file-XXXXXX");
	d = mkdtemp(dir);
	return d ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[PATH_MAX + 16];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reads),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_read_only_mount),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
