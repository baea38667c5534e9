// SPDX-License-Identifier: Apache-2.0
/* vmigctl(8): a thin client of vmigd's control socket. It builds one JSON request, prints the
 * reply in the form the command promises, and turns errors into one line on stderr. */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "vmigd-config.h"

#define REPLY_MAX (4 << 20)

enum { EXIT_FAIL = 1, EXIT_NO_DAEMON = 2 };

static const char *control_path = VMIGD_DEFAULT_CONTROL;
/* The request and reply of this run, released at exit on every path, errors included. */
static struct json_object *request_obj, *reply_obj;

static void release(void)
{
	json_object_put(request_obj);
	json_object_put(reply_obj);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: vmigctl [-c PATH] target start KEY --socket PORTID=UNIXPATH [--socket "
		"...]\n"
		"       vmigctl [-c PATH] target stop KEY\n"
		"       vmigctl [-c PATH] source start KEY --target JSON --dir BASEDIR\n"
		"       vmigctl [-c PATH] source stop KEY\n"
		"       vmigctl [-c PATH] list\n"
		"       vmigctl [-c PATH] status [--json]\n"
		"The control socket defaults to $VMIGD_CONTROL or %s. See vmigctl(8).\n",
		VMIGD_DEFAULT_CONTROL);
}

static void __attribute__((noreturn, format(printf, 2, 3))) die(int code, const char *fmt, ...)
{
	va_list ap;

	fputs("vmigctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(code);
}

/* Sends the request, returns the parsed reply after checking "ok". */
static struct json_object *call(struct json_object *req)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	const char *text = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
	struct json_object *reply, *ok, *err;
	size_t len = 0, cap = 65536;
	char *buf;
	int fd;

	if (strlen(control_path) >= sizeof(sun.sun_path))
		die(EXIT_FAIL, "control socket path too long: %s", control_path);
	strcpy(sun.sun_path, control_path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die(EXIT_FAIL, "socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		if (errno == ENOENT || errno == ECONNREFUSED)
			die(EXIT_NO_DAEMON, "vmigd is not running (no daemon at %s)", control_path);
		die(EXIT_NO_DAEMON, "cannot reach vmigd at %s: %s", control_path, strerror(errno));
	}
	if (dprintf(fd, "%s\n", text) < 0)
		die(EXIT_FAIL, "sending the request: %s", strerror(errno));
	buf = malloc(cap);
	if (!buf)
		die(EXIT_FAIL, "out of memory");
	for (;;) {
		ssize_t k;

		if (len + 1 >= cap) {
			if (cap >= REPLY_MAX)
				die(EXIT_FAIL, "reply from vmigd too large");
			cap *= 2;
			buf = realloc(buf, cap);
			if (!buf)
				die(EXIT_FAIL, "out of memory");
		}
		k = read(fd, buf + len, cap - len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			die(EXIT_FAIL, "reading the reply: %s", strerror(errno));
		if (k == 0)
			break;
		len += k;
	}
	close(fd);
	buf[len] = '\0';
	reply = json_tokener_parse(buf);
	free(buf);
	reply_obj = reply;
	if (!reply || !json_object_object_get_ex(reply, "ok", &ok))
		die(EXIT_FAIL, "vmigd sent no valid reply");
	if (!json_object_get_boolean(ok)) {
		const char *msg = json_object_object_get_ex(reply, "error", &err)
					  ? json_object_get_string(err)
					  : "request failed";
		die(EXIT_FAIL, "%s", msg);
	}
	return reply;
}

static struct json_object *request(const char *op, const char *key)
{
	struct json_object *o = json_object_new_object();

	request_obj = o;
	json_object_object_add(o, "op", json_object_new_string(op));
	if (key)
		json_object_object_add(o, "key", json_object_new_string(key));
	return o;
}

static void target_start(const char *key, int argc, char **argv)
{
	struct json_object *req = request("target-start", key), *socks = json_object_new_object();
	struct json_object *reply, *t;

	for (int i = 0; i < argc; i++) {
		const char *spec = NULL;
		char copy[4096], *eq;

		if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc)
			spec = argv[++i];
		else if (strncmp(argv[i], "--socket=", 9) == 0)
			spec = argv[i] + 9;
		else
			die(EXIT_FAIL, "target start: unexpected argument \"%s\"", argv[i]);
		snprintf(copy, sizeof(copy), "%s", spec);
		eq = strchr(copy, '=');
		if (!eq || eq == copy || !eq[1])
			die(EXIT_FAIL, "--socket: expected PORTID=UNIXPATH, got \"%s\"", spec);
		*eq = '\0';
		if (json_object_object_get_ex(socks, copy, NULL))
			die(EXIT_FAIL, "--socket: port %s given twice", copy);
		json_object_object_add(socks, copy, json_object_new_string(eq + 1));
	}
	json_object_object_add(req, "sockets", socks);
	if (json_object_object_length(socks) == 0)
		die(EXIT_FAIL, "target start: give at least one --socket PORTID=UNIXPATH");
	reply = call(req);
	if (!json_object_object_get_ex(reply, "target", &t))
		die(EXIT_FAIL, "vmigd sent no target description");
	printf("%s\n", json_object_to_json_string_ext(t, JSON_C_TO_STRING_PLAIN));
}

static void source_start(const char *key, int argc, char **argv)
{
	struct json_object *req = request("source-start", key), *reply, *socks, *t;
	const char *target = NULL, *dir = NULL;
	long delay = -1;

	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--target") == 0 && i + 1 < argc)
			target = argv[++i];
		else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
			dir = argv[++i];
		else if (strcmp(argv[i], "--test-delay-first") == 0 && i + 1 < argc)
			delay = strtol(argv[++i], NULL, 10);
		else
			die(EXIT_FAIL, "source start: unexpected argument \"%s\"", argv[i]);
	}
	if (!target || !dir)
		die(EXIT_FAIL, "source start: --target JSON and --dir BASEDIR are required");
	t = json_tokener_parse(target);
	if (t)
		json_object_object_add(req, "target", t);
	if (!t || !json_object_is_type(t, json_type_object))
		die(EXIT_FAIL, "--target: not a JSON object (pass what target start printed)");
	json_object_object_add(req, "dir", json_object_new_string(dir));
	if (delay >= 0)
		json_object_object_add(req, "test_delay_first_ms", json_object_new_int64(delay));
	reply = call(req);
	if (!json_object_object_get_ex(reply, "sockets", &socks))
		die(EXIT_FAIL, "vmigd sent no socket list");
	for (size_t i = 0; i < json_object_array_length(socks); i++)
		printf("%s\n", json_object_get_string(json_object_array_get_idx(socks, i)));
}

static const char *str_field(struct json_object *o, const char *name)
{
	struct json_object *v;

	return json_object_object_get_ex(o, name, &v) ? json_object_get_string(v) : "-";
}

static void list(void)
{
	struct json_object *reply = call(request("list", NULL)), *migs;

	if (!json_object_object_get_ex(reply, "migrations", &migs))
		die(EXIT_FAIL, "vmigd sent no migration list");
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i), *ports;
		char plist[256] = "";

		json_object_object_get_ex(m, "ports", &ports);
		for (size_t j = 0; ports && j < json_object_array_length(ports); j++) {
			size_t used = strlen(plist);

			snprintf(plist + used, sizeof(plist) - used, "%s%s", j ? "," : "",
				 str_field(json_object_array_get_idx(ports, j), "port"));
		}
		printf("%s %s ports=%s conns=%s active=%s bytes_tx=%s bytes_rx=%s state=%s\n",
		       str_field(m, "key"), str_field(m, "role"), plist,
		       str_field(m, "connections"), str_field(m, "connections_active"),
		       str_field(m, "bytes_tx"), str_field(m, "bytes_rx"), str_field(m, "state"));
	}
}

static bool bool_field(struct json_object *o, const char *name)
{
	struct json_object *v;

	return json_object_object_get_ex(o, name, &v) && json_object_get_boolean(v);
}

static void print_tls(struct json_object *s)
{
	struct json_object *t;

	if (!json_object_object_get_ex(s, "tls", &t) || !bool_field(t, "enabled")) {
		printf("tls: off (plain text)\n");
		return;
	}
	printf("tls: on, generation %s, %s, crypto %s\n", str_field(t, "generation"),
	       str_field(t, "certificate"),
	       bool_field(t, "ktls")	      ? "kTLS"
	       : bool_field(t, "ktls_kernel") ? "user-space (kTLS off)"
					      : "user-space (no kTLS in this kernel)");
}

/* One line per open connection: where it is and which TLS mode it runs in. */
static void print_connections(struct json_object *s)
{
	struct json_object *migs, *conns;

	if (!json_object_object_get_ex(s, "migration_list", &migs))
		return;
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i);

		if (!json_object_object_get_ex(m, "connection_list", &conns))
			continue;
		for (size_t j = 0; j < json_object_array_length(conns); j++) {
			struct json_object *c = json_object_array_get_idx(conns, j);

			printf("  %s %s port=%s seq=%s %s tls=%s", str_field(m, "key"),
			       str_field(m, "role"), str_field(c, "port"), str_field(c, "seq"),
			       str_field(c, "state"), str_field(c, "tls"));
			if (strcmp(str_field(c, "tls"), "off") != 0)
				printf(" cipher=%s crypto=%s resumed=%s", str_field(c, "cipher"),
				       str_field(c, "crypto"),
				       bool_field(c, "resumed") ? "yes" : "no");
			printf("\n");
		}
	}
}

static void status(int argc, char **argv)
{
	struct json_object *reply = call(request("status", NULL)), *s;
	static const char *const fields[] = {
		"version",   "pid",	"control", "listen",	 "advertise",	      "tls",
		"data_path", "threads", "uptime",  "migrations", "connections_active"
	};

	if (!json_object_object_get_ex(reply, "status", &s))
		die(EXIT_FAIL, "vmigd sent no status");
	if (argc > 0 && strcmp(argv[0], "--json") == 0) {
		printf("%s\n", json_object_to_json_string_ext(s, JSON_C_TO_STRING_PLAIN));
		return;
	}
	if (argc > 0)
		die(EXIT_FAIL, "status: unexpected argument \"%s\"", argv[0]);
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		if (strcmp(fields[i], "tls") == 0)
			print_tls(s);
		else
			printf("%s: %s\n", fields[i], str_field(s, fields[i]));
	}
	print_connections(s);
}

int main(int argc, char **argv)
{
	const char *env = getenv("VMIGD_CONTROL");
	int i = 1;

	atexit(release);
	if (env && *env)
		control_path = env;
	while (i < argc && argv[i][0] == '-') {
		if ((strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--control") == 0) &&
		    i + 1 < argc) {
			control_path = argv[i + 1];
			i += 2;
		} else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return EXIT_FAIL;
		}
	}
	argc -= i;
	argv += i;
	if (argc >= 3 && (strcmp(argv[0], "target") == 0 || strcmp(argv[0], "source") == 0)) {
		bool is_target = strcmp(argv[0], "target") == 0;

		if (strcmp(argv[1], "start") == 0) {
			(is_target ? target_start : source_start)(argv[2], argc - 3, argv + 3);
			return 0;
		}
		if (strcmp(argv[1], "stop") == 0 && argc == 3) {
			call(request(is_target ? "target-stop" : "source-stop", argv[2]));
			return 0;
		}
	} else if (argc == 1 && strcmp(argv[0], "list") == 0) {
		list();
		return 0;
	} else if (argc >= 1 && strcmp(argv[0], "status") == 0) {
		status(argc - 1, argv + 1);
		return 0;
	}
	usage(stderr);
	return EXIT_FAIL;
}
