// SPDX-License-Identifier: Apache-2.0
/* vmigctl's exchange with vmigd (vmigctl_call.h): one request and one reply on the control socket,
 * and the failures of a run as one line on stderr and, with --json, one JSON object on stdout.
 * What the commands send and print is in vmigctl.c. */
#include <errno.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "vmigctl_args.h"
#include "vmigctl_call.h"

#define REPLY_MAX (4 << 20)

/* What vmigd says when it has as many control clients as it serves at once (ctl_server.c). */
#define BUSY_ERROR "too many control clients"

/* This run's command line, and its request and reply, released at exit on every path. */
static const struct vc_call *cl;
static struct json_object *request_obj, *reply_obj;

static void release(void)
{
	json_object_put(request_obj);
	json_object_put(reply_obj);
}

void vc_call_setup(const struct vc_call *c)
{
	cl = c;
	atexit(release);
	/* A write to a daemon that has closed is an error to report, not a silent death. */
	signal(SIGPIPE, SIG_IGN);
}

void vc_print_json(struct json_object *o)
{
	printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
								 JSON_C_TO_STRING_NOSLASHESCAPE));
	fflush(stdout);
}

/* The errno whose name is code ("EEXIST"), 0 if none is. */
static int errno_of(const char *code)
{
	for (int e = 1; code && e < 4096; e++) {
		const char *name = strerrorname_np(e);

		if (name && strcmp(name, code) == 0)
			return e;
	}
	return 0;
}

/*
 * Ends the run with exit status code: one line on stderr; with --json also, on stdout, the error
 * as vmigd writes one, {"ok":false,"error":MSG,"code":"ENAME","errno":N} (code and errno when
 * err names one; reply: vmigd's own error reply, printed with errno added).
 */
static void __attribute__((noreturn))
fail_with(int code, int err, struct json_object *reply, const char *msg)
{
	fprintf(stderr, "vmigctl: %s\n", msg);
	if (cl && cl->json) {
		struct json_object *o = reply ? json_object_get(reply) : json_object_new_object(),
				   *c;

		if (!reply) {
			json_object_object_add(o, "ok", json_object_new_boolean(false));
			json_object_object_add(o, "error", json_object_new_string(msg));
			if (err && strerrorname_np(err))
				json_object_object_add(
					o, "code", json_object_new_string(strerrorname_np(err)));
		} else if (json_object_object_get_ex(o, "code", &c)) {
			err = errno_of(json_object_get_string(c));
		}
		if (err)
			json_object_object_add(o, "errno", json_object_new_int(err));
		vc_print_json(o);
		json_object_put(o);
	}
	exit(code);
}

void vc_fail(int code, int err, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fail_with(code, err, NULL, msg);
}

/* Writes all of p; 0 or -errno (EPIPE, not SIGPIPE, when vmigd has closed). */
static int send_all(int fd, const char *p, size_t len)
{
	while (len > 0) {
		ssize_t k = send(fd, p, len, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		p += k;
		len -= (size_t)k;
	}
	return 0;
}

/* Nothing to talk to at the control socket: say why, and where the path came from. */
static void __attribute__((noreturn)) no_daemon(int err)
{
	const char *why = err == ENOENT		? "no such socket: vmigd is not running there"
			  : err == ECONNREFUSED ? "nothing listens on it: vmigd is not running"
			  : err == EACCES	? "permission denied: it is for vmigd's user only"
						: strerror(err);

	vc_fail(VC_EXIT_NO_DAEMON, err, "cannot connect to vmigd at %s (%s): %s (%s)", cl->control,
		cl->control_from, why, strerrorname_np(err) ? strerrorname_np(err) : "?");
}

/* vmigd's error reply: its line (and the test build's hint), exit 1, or 4 when it is busy. */
static void __attribute__((noreturn)) refused(struct json_object *reply)
{
	struct json_object *err;
	const char *msg = json_object_object_get_ex(reply, "error", &err)
				  ? json_object_get_string(err)
				  : NULL;
	char line[1024];

	if (!msg) {
		/* {"ok":false,"code":"ENOENT"}: the code is all there is */
		msg = json_object_object_get_ex(reply, "code", &err) ? json_object_get_string(err)
								     : "request failed";
		snprintf(line, sizeof(line), "request failed: %s", msg);
		fail_with(VC_EXIT_REFUSED, 0, reply, line);
	}
	if (strstr(msg, BUSY_ERROR)) {
		snprintf(line, sizeof(line), "vmigd is busy: %s", msg);
		fail_with(VC_EXIT_BUSY, 0, reply, line);
	}
	/* The product refuses the test build's field as any unknown one: say which. */
	if (strstr(msg, "unknown field \"test_delay_first_ms\"")) {
		snprintf(line, sizeof(line),
			 "%s; --test-delay-first needs the test build, vmigd-test", msg);
		fail_with(VC_EXIT_REFUSED, 0, reply, line);
	}
	fail_with(VC_EXIT_REFUSED, 0, reply, msg);
}

struct json_object *vc_call(struct json_object *req)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	const char *text = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
	struct json_object *reply, *ok, *note;
	size_t len = 0, cap = 65536;
	char *buf;
	int fd, sent;

	if (strlen(cl->control) >= sizeof(sun.sun_path))
		vc_usage_error(cl->cmd, "control socket path too long (%zu bytes, at most %zu): %s",
			       strlen(cl->control), sizeof(sun.sun_path) - 1, cl->control);
	strcpy(sun.sun_path, cl->control);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		vc_fail(VC_EXIT_REFUSED, errno, "socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0)
		no_daemon(errno);
	/* vmigd may have said why and closed before the request is written (its client cap):
	 * then what it said is still there to read. */
	sent = send_all(fd, text, strlen(text));
	if (sent == 0)
		sent = send_all(fd, "\n", 1);
	if (sent < 0 && sent != -EPIPE && sent != -ECONNRESET)
		vc_fail(VC_EXIT_REFUSED, -sent, "sending the request: %s", strerror(-sent));
	buf = malloc(cap);
	if (!buf)
		vc_fail(VC_EXIT_REFUSED, ENOMEM, "out of memory");
	for (;;) {
		ssize_t k;

		if (len + 1 >= cap) {
			if (cap >= REPLY_MAX)
				vc_fail(VC_EXIT_REFUSED, 0, "reply from vmigd too large");
			cap *= 2;
			buf = realloc(buf, cap);
			if (!buf)
				vc_fail(VC_EXIT_REFUSED, ENOMEM, "out of memory");
		}
		k = read(fd, buf + len, cap - len);
		if (k < 0 && errno == EINTR)
			continue;
		/* vmigd closed with our request unread (its client cap): keep what it wrote. */
		if (k < 0 && errno == ECONNRESET) {
			sent = -ECONNRESET;
			break;
		}
		if (k < 0)
			vc_fail(VC_EXIT_REFUSED, errno, "reading the reply: %s", strerror(errno));
		if (k == 0)
			break;
		len += k;
	}
	close(fd);
	buf[len] = '\0';
	reply = json_tokener_parse(buf);
	free(buf);
	json_object_put(reply_obj); /* top calls again and again */
	reply_obj = reply;
	if (!reply && sent < 0)
		vc_fail(VC_EXIT_BUSY, -sent,
			"vmigd is busy: it closed the connection without reading the request "
			"(%s); try again",
			strerror(-sent));
	if (!reply || !json_object_object_get_ex(reply, "ok", &ok))
		vc_fail(VC_EXIT_REFUSED, 0, "vmigd sent no valid reply");
	if (!json_object_get_boolean(ok))
		refused(reply);
	/* What the daemon did other than asked (a takeover's migration carried elsewhere). */
	if (json_object_object_get_ex(reply, "note", &note))
		fprintf(stderr, "vmigctl: %s\n", json_object_get_string(note));
	return reply;
}

struct json_object *vc_request(const char *op, const char *key)
{
	struct json_object *o = json_object_new_object();

	json_object_put(request_obj);
	request_obj = o;
	json_object_object_add(o, "op", json_object_new_string(op));
	if (key)
		json_object_object_add(o, "key", json_object_new_string(key));
	return o;
}
