// SPDX-License-Identifier: Apache-2.0
/* vmigctl(8): a thin client of vmigd's control socket. It builds one JSON request, prints the
 * reply in the form the command promises (figures by the tables of ctl_figures.c, replies of
 * version 1 daemons too), and turns errors into one line on stderr; `top` repeats the metrics
 * request to draw a live view. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ctl_figures.h"
#include "vmigctl_reply.h"
#include "units.h"
#include "util.h"
#include "vmigd-config.h"

#define REPLY_MAX (4 << 20)

/* EXIT_BUSY: vmigd turned the connection away (its control-client cap) before serving it. */
enum { EXIT_FAIL = 1, EXIT_NO_DAEMON = 2, EXIT_BUSY = 3 };

/* What vmigd says when it has as many control clients as it serves at once (ctl_server.c). */
#define BUSY_ERROR "too many control clients"

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
		"                         [--kubevirt [--listen PORTID=TCPPORT ...]] [--tls | "
		"--no-tls]\n"
		"                         [--bandwidth RATE]\n"
		"       vmigctl [-c PATH] target stop KEY\n"
		"       vmigctl [-c PATH] source start KEY --target JSON --dir BASEDIR "
		"[--bandwidth RATE]\n"
		"                         [--tls | --no-tls]\n"
		"                         [--qmp PATH | --libvirt-domain NAME [--libvirt-uri "
		"URI]]\n"
		"                         [--mode predictive|stall|kubevirt] [--shadow]\n"
		"                         [--policy JSON|@FILE]\n"
		"                         [--allow-auto-converge] [--allow-post-copy]\n"
		"                         [--allow-workload-disruption | "
		"--no-workload-disruption]\n"
		"                         [--completion-timeout-per-gib S] [--progress-timeout S]\n"
		"                         [--max-downtime MS] [--evidence-window MS]\n"
		"       vmigctl [-c PATH] source stop KEY\n"
		"       vmigctl [-c PATH] bandwidth KEY RATE\n"
		"       vmigctl [-c PATH] node-bandwidth RATE\n"
		"       vmigctl [-c PATH] list\n"
		"       vmigctl [-c PATH] status [--json]\n"
		"       vmigctl [-c PATH] metrics [--json]\n"
		"       vmigctl [-c PATH] top [--interval SECONDS] [--count N]\n"
		"RATE: bytes/s with K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (of 1024), bits\n"
		"with a unit ending in bit or bps (1Gbit), or none.\n"
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

/* Sends the request, returns the parsed reply after checking "ok". */
static struct json_object *call(struct json_object *req)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	const char *text = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
	struct json_object *reply, *ok, *err;
	size_t len = 0, cap = 65536;
	char *buf;
	int fd, sent;

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
	/* vmigd may have said why and closed before the request is written (its client cap):
	 * then what it said is still there to read. */
	sent = send_all(fd, text, strlen(text));
	if (sent == 0)
		sent = send_all(fd, "\n", 1);
	if (sent < 0 && sent != -EPIPE && sent != -ECONNRESET)
		die(EXIT_FAIL, "sending the request: %s", strerror(-sent));
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
		/* vmigd closed with our request unread (its client cap): keep what it wrote. */
		if (k < 0 && errno == ECONNRESET) {
			sent = -ECONNRESET;
			break;
		}
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
	json_object_put(reply_obj); /* top calls again and again */
	reply_obj = reply;
	if (!reply && sent < 0)
		die(EXIT_BUSY,
		    "vmigd is busy: it closed the connection without reading the request "
		    "(%s); try again",
		    strerror(-sent));
	if (!reply || !json_object_object_get_ex(reply, "ok", &ok))
		die(EXIT_FAIL, "vmigd sent no valid reply");
	if (!json_object_get_boolean(ok)) {
		const char *msg = json_object_object_get_ex(reply, "error", &err)
					  ? json_object_get_string(err)
					  : "request failed";

		if (strstr(msg, BUSY_ERROR))
			die(EXIT_BUSY, "vmigd is busy: %s", msg);
		/* The product refuses the test build's field as any unknown one: say which. */
		if (strstr(msg, "unknown field \"test_delay_first_ms\""))
			die(EXIT_FAIL, "%s; --test-delay-first needs the test build, vmigd-test",
			    msg);
		die(EXIT_FAIL, "%s", msg);
	}
	/* What the daemon did other than asked (a takeover's migration carried elsewhere). */
	if (json_object_object_get_ex(reply, "note", &err))
		fprintf(stderr, "vmigctl: %s\n", json_object_get_string(err));
	return reply;
}

static struct json_object *request(const char *op, const char *key)
{
	struct json_object *o = json_object_new_object();

	json_object_put(request_obj);
	request_obj = o;
	json_object_object_add(o, "op", json_object_new_string(op));
	if (key)
		json_object_object_add(o, "key", json_object_new_string(key));
	return o;
}

/* RATE as vmigd takes it: an integer of bytes/s, from what the operator wrote. */
static uint64_t rate_arg(const char *what, const char *s)
{
	uint64_t v;

	if (vm_parse_rate(s, &v) < 0)
		die(EXIT_FAIL,
		    "%s: expected a rate such as 1Gbit, 500MB, 64Mi or none (vmigctl(8): RATE "
		    "UNITS), got \"%s\"",
		    what, s);
	return v;
}

/* --bandwidth RATE or --bandwidth=RATE at argv[*i]: true when it was one (and adds it). */
static bool bandwidth_opt(struct json_object *req, int argc, char **argv, int *i)
{
	const char *v = NULL;

	if (strcmp(argv[*i], "--bandwidth") == 0 && *i + 1 < argc)
		v = argv[++*i];
	else if (strncmp(argv[*i], "--bandwidth=", 12) == 0)
		v = argv[*i] + 12;
	else
		return false;
	json_object_object_add(req, "bandwidth",
			       json_object_new_uint64(rate_arg("--bandwidth", v)));
	return true;
}

/* --tls or --no-tls at argv[i]: this migration's TLS (KubeVirt's disableTLS); true when it
 * was one (and adds it). */
static bool tls_opt(struct json_object *req, const char *arg)
{
	if (strcmp(arg, "--tls") && strcmp(arg, "--no-tls"))
		return false;
	json_object_object_add(req, "tls", json_object_new_boolean(strcmp(arg, "--tls") == 0));
	return true;
}

static void target_start(const char *key, int argc, char **argv)
{
	struct json_object *req = request("target-start", key), *socks = json_object_new_object();
	struct json_object *listen = json_object_new_object(), *reply, *t;

	for (int i = 0; i < argc; i++) {
		const char *spec = NULL;
		char copy[4096], *eq, *end;
		unsigned long tcp;

		if (bandwidth_opt(req, argc, argv, &i) || tls_opt(req, argv[i]))
			continue;
		if (strcmp(argv[i], "--kubevirt") == 0) {
			json_object_object_add(req, "kubevirt", json_object_new_boolean(true));
			continue;
		}
		/* --listen PORTID=TCPPORT: vmigd checks the id; the number is ours to read. */
		if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
			snprintf(copy, sizeof(copy), "%s", argv[++i]);
			eq = strchr(copy, '=');
			if (eq)
				*eq = '\0';
			errno = 0;
			tcp = eq ? strtoul(eq + 1, &end, 10) : 0;
			if (!eq || eq == copy || !eq[1] || *end || errno || !tcp || tcp > 65535)
				die(EXIT_FAIL,
				    "--listen: expected PORTID=TCPPORT (1 to 65535), got \"%s\"",
				    argv[i]);
			if (json_object_object_get_ex(listen, copy, NULL))
				die(EXIT_FAIL, "--listen: port %s given twice", copy);
			json_object_object_add(listen, copy, json_object_new_int((int)tcp));
			continue;
		}
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
	if (json_object_object_length(listen))
		json_object_object_add(req, "listen", listen);
	else
		json_object_put(listen);
	if (json_object_object_length(socks) == 0)
		die(EXIT_FAIL, "target start: give at least one --socket PORTID=UNIXPATH");
	reply = call(req);
	if (!json_object_object_get_ex(reply, "target", &t))
		die(EXIT_FAIL, "vmigd sent no target description");
	printf("%s\n", json_object_to_json_string_ext(t, JSON_C_TO_STRING_PLAIN));
}

/* --policy JSON or @FILE: KubeVirt's field names (vmigctl(8)). */
static struct json_object *policy_arg(const char *v)
{
	struct json_object *p;
	char *text = NULL;

	if (v[0] == '@') {
		FILE *f = fopen(v + 1, "r");
		size_t n = 0;

		if (!f)
			die(EXIT_FAIL, "--policy: cannot read %s: %s", v + 1, strerror(errno));
		text = calloc(1, 65536);
		if (!text)
			die(EXIT_FAIL, "out of memory");
		n = fread(text, 1, 65535, f);
		fclose(f);
		text[n] = '\0';
		v = text;
	}
	p = json_tokener_parse(v);
	free(text);
	if (!p || !json_object_is_type(p, json_type_object))
		die(EXIT_FAIL, "--policy: expected a JSON object such as "
			       "'{\"allowAutoConverge\":true}' or @FILE");
	return p;
}

/* Whole seconds or milliseconds for a policy field. */
static int64_t count_arg(const char *what, const char *v)
{
	char *end;
	long long n;

	errno = 0;
	n = strtoll(v, &end, 10);
	if (errno || end == v || *end || n < 0)
		die(EXIT_FAIL, "%s: expected a whole number from 0, got \"%s\"", what, v);
	return n;
}

static void source_start(const char *key, int argc, char **argv)
{
	struct json_object *req = request("source-start", key), *reply, *socks, *t;
	struct json_object *conv = json_object_new_object(), *pol = NULL;
	const char *target = NULL, *dir = NULL, *qmp = NULL, *dom = NULL, *uri = NULL;
	const char *mode = NULL;
	long delay = -1;
	static const struct {
		const char *opt, *field;
	} flags[] = {
		{ "--allow-auto-converge", "allowAutoConverge" },
		{ "--allow-post-copy", "allowPostCopy" },
		{ "--allow-workload-disruption", "allowWorkloadDisruption" },
		{ "--shadow", "shadow" },
	}, counts[] = {
		{ "--completion-timeout-per-gib", "completionTimeoutPerGiB" },
		{ "--progress-timeout", "progressTimeout" },
		{ "--max-downtime", "maxDowntimeMs" },
		{ "--evidence-window", "evidenceWindowMs" },
	};
	struct json_object *over = json_object_new_object();

	for (int i = 0; i < argc; i++) {
		bool done = false;

		for (size_t k = 0; k < ARRAY_SIZE(flags) && !done; k++)
			if (strcmp(argv[i], flags[k].opt) == 0) {
				json_object_object_add(over, flags[k].field,
						       json_object_new_boolean(true));
				done = true;
			}
		for (size_t k = 0; k < ARRAY_SIZE(counts) && !done; k++)
			if (strcmp(argv[i], counts[k].opt) == 0 && i + 1 < argc) {
				json_object_object_add(
					over, counts[k].field,
					json_object_new_int64(count_arg(counts[k].opt, argv[++i])));
				done = true;
			}
		if (done)
			continue;
		if (strcmp(argv[i], "--target") == 0 && i + 1 < argc)
			target = argv[++i];
		else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
			dir = argv[++i];
		else if (strcmp(argv[i], "--test-delay-first") == 0 && i + 1 < argc)
			delay = strtol(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--qmp") == 0 && i + 1 < argc)
			qmp = argv[++i];
		else if (strcmp(argv[i], "--libvirt-domain") == 0 && i + 1 < argc)
			dom = argv[++i];
		else if (strcmp(argv[i], "--libvirt-uri") == 0 && i + 1 < argc)
			uri = argv[++i];
		else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc)
			mode = argv[++i];
		else if (strcmp(argv[i], "--policy") == 0 && i + 1 < argc) {
			json_object_put(pol);
			pol = policy_arg(argv[++i]);
		} else if (strcmp(argv[i], "--no-workload-disruption") == 0)
			json_object_object_add(over, "allowWorkloadDisruption",
					       json_object_new_boolean(false));
		else if (!bandwidth_opt(req, argc, argv, &i) && !tls_opt(req, argv[i]))
			die(EXIT_FAIL, "source start: unexpected argument \"%s\"", argv[i]);
	}
	if (qmp && dom)
		die(EXIT_FAIL, "source start: give --qmp or --libvirt-domain, not both");
	if (!qmp && !dom && (pol || mode || uri || json_object_object_length(over)))
		die(EXIT_FAIL,
		    "source start: a convergence policy needs a backend: --qmp PATH (the "
		    "source QEMU's QMP socket) or --libvirt-domain NAME");
	if (qmp || dom) {
		if (!pol)
			pol = json_object_new_object();
		json_object_object_foreach (over, name, val)
			json_object_object_add(pol, name, json_object_get(val));
		if (qmp) {
			json_object_object_add(conv, "qmp", json_object_new_string(qmp));
		} else {
			struct json_object *lv = json_object_new_object();

			json_object_object_add(lv, "domain", json_object_new_string(dom));
			if (uri)
				json_object_object_add(lv, "uri", json_object_new_string(uri));
			json_object_object_add(conv, "libvirt", lv);
		}
		if (mode)
			json_object_object_add(conv, "mode", json_object_new_string(mode));
		json_object_object_add(conv, "policy", pol);
		json_object_object_add(req, "convergence", conv);
	} else {
		json_object_put(conv);
	}
	json_object_put(over);
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

/* ---- list, status ---- */

static void list(void)
{
	struct json_object *reply = vc_reply_v2(call(request("list", NULL))), *migs;

	if (!json_object_object_get_ex(reply, "migrations", &migs))
		die(EXIT_FAIL, "vmigd sent no migration list");
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i), *ports, *c;
		char plist[256] = "";

		json_object_object_get_ex(m, "ports", &ports);
		for (size_t j = 0; ports && j < json_object_array_length(ports); j++) {
			size_t used = strlen(plist);

			snprintf(plist + used, sizeof(plist) - used, "%s%s", j ? "," : "",
				 vc_str_field(json_object_array_get_idx(ports, j), "id"));
		}
		c = vc_obj_field(m, "conns");
		printf("%s %s ports=%s conns=%s active=%s bytes_tx=%s bytes_rx=%s state=%s\n",
		       vc_str_field(m, "key"), vc_str_field(m, "role"), plist,
		       vc_str_field(c, "total"), vc_str_field(c, "active"),
		       vc_str_field(m, "bytes_tx"), vc_str_field(m, "bytes_rx"),
		       vc_str_field(m, "state"));
	}
}

static void print_tls(struct json_object *s)
{
	struct json_object *t;

	if (!json_object_object_get_ex(s, "tls", &t) || !vc_bool_field(t, "enabled")) {
		printf("tls: off (plain text)\n");
		return;
	}
	printf("tls: on, generation %s, %s, crypto %s\n", vc_str_field(t, "generation"),
	       vc_str_field(t, "certificate"),
	       vc_bool_field(t, "ktls")		 ? "kTLS"
	       : vc_bool_field(t, "ktls_kernel") ? "user-space (kTLS off)"
						 : "user-space (no kTLS in this kernel)");
}

/* One line per open connection: where it is and which TLS mode it runs in. */
static void print_connections(struct json_object *migs)
{
	char line[1024];

	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i), *conns;

		if (!json_object_object_get_ex(m, "connections", &conns) ||
		    !json_object_is_type(conns, json_type_array))
			continue;
		for (size_t j = 0; j < json_object_array_length(conns); j++)
			printf("  %s %s %s\n", vc_str_field(m, "key"), vc_str_field(m, "role"),
			       vc_figure_line(&ctl_conn_table, json_object_array_get_idx(conns, j),
					      "head", line, sizeof(line)));
	}
}

/* A convergence object: its figures, then one line per action. */
static void print_conv(struct json_object *cv, const char *indent, const char *title)
{
	static const char *const not_outcome[] = { "outcome", NULL };
	struct json_object *acts;
	char more[32], line[1024];

	snprintf(more, sizeof(more), "%s  ", indent);
	vc_print_figures(&ctl_conv_table, cv, indent, title, not_outcome);
	if (json_object_object_get_ex(cv, "actions", &acts) &&
	    json_object_is_type(acts, json_type_array))
		for (size_t j = 0; j < json_object_array_length(acts); j++)
			printf("%s%s\n", more,
			       vc_figure_line(&ctl_action_table, json_object_array_get_idx(acts, j),
					      "head", line, sizeof(line)));
	if (*vc_figure_line(&ctl_conv_table, cv, "outcome", line, sizeof(line)))
		printf("%s%s\n", more, line);
}

/* Per watched migration: the mode, what it judged by, each action, the outcome. */
static void print_convergence(struct json_object *migs)
{
	char title[256];

	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i);
		struct json_object *cv = vc_obj_field(m, "convergence");

		if (!cv)
			continue;
		snprintf(title, sizeof(title), "convergence %s: ", vc_str_field(m, "key"));
		print_conv(cv, "", title);
	}
}

/* Per migration whose NIC vmigd knows: the interface, its device, link and route. */
static void print_nics(struct json_object *migs)
{
	char title[256];

	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i);
		struct json_object *nic = vc_obj_field(m, "nic");

		if (!nic)
			continue;
		snprintf(title, sizeof(title), "nic %s (%s): ", vc_str_field(m, "key"),
			 vc_str_field(m, "role"));
		vc_print_figures(&ctl_nic_table, nic, "", title, NULL);
	}
}

static void status(int argc, char **argv)
{
	struct json_object *reply = call(request("status", NULL)), *s, *node, *migs;
	static const char *const fields[] = { "version",   "pid",	"control",
					      "listen",	   "advertise", "tls",
					      "data_path", "threads",	"uptime" };
	/* status's own names for the node's figures, kept from version 1 for grep. */
	static const struct {
		const char *name, *key;
	} node_lines[] = {
		{ "migrations", "migration_count" },
		{ "connections_active", "conns.active" },
		{ "bandwidth", "bandwidth" },
		{ "shaper", "shaper" },
		{ "inspect", "inspect" },
	};

	if (!json_object_object_get_ex(reply, "status", &s))
		die(EXIT_FAIL, "vmigd sent no status");
	if (argc > 0 && strcmp(argv[0], "--json") == 0) {
		printf("%s\n", json_object_to_json_string_ext(s, JSON_C_TO_STRING_PLAIN));
		return;
	}
	if (argc > 0)
		die(EXIT_FAIL, "status: unexpected argument \"%s\"", argv[0]);
	vc_reply_v2(reply);
	node = vc_obj_field(s, "node");
	for (size_t i = 0; i < ARRAY_SIZE(fields); i++) {
		if (strcmp(fields[i], "tls") == 0)
			print_tls(s);
		else
			printf("%s: %s\n", fields[i], vc_str_field(s, fields[i]));
	}
	for (size_t i = 0; i < ARRAY_SIZE(node_lines); i++) {
		const struct ctl_fig *f = ctl_fig_find(&ctl_node_table, node_lines[i].key);
		struct json_object *v;
		char buf[64];
		bool found;

		v = vc_at(node, node_lines[i].key, &found);
		if (f->unit == CTL_BOOL)
			printf("%s: %s\n", node_lines[i].name,
			       v && json_object_get_boolean(v) ? "on" : "off");
		else
			printf("%s: %s\n", node_lines[i].name,
			       vc_value_text(f, v, buf, sizeof(buf)));
	}
	if (vc_obj_field(node, "nic"))
		vc_print_figures(&ctl_nic_table, vc_obj_field(node, "nic"), "", "nic: ", NULL);
	if (json_object_object_get_ex(s, "metrics", NULL))
		printf("metrics: http://%s/metrics\n", vc_str_field(s, "metrics"));
	if (json_object_object_get_ex(s, "migrations", &migs) &&
	    json_object_is_type(migs, json_type_array)) {
		print_connections(migs);
		print_nics(migs);
		print_convergence(migs);
	}
}

static void set_bandwidth(const char *key, const char *rate)
{
	struct json_object *req = request(key ? "bandwidth" : "node-bandwidth", key);

	json_object_object_add(req, "bandwidth", json_object_new_uint64(rate_arg("RATE", rate)));
	call(req);
}

/* ---- metrics ---- */

/* Each array member of o's key, by its table. */
static void print_each(const struct ctl_table *t, struct json_object *o, const char *key,
		       const char *indent, const char *title)
{
	struct json_object *a;

	if (!json_object_object_get_ex(o, key, &a) || !json_object_is_type(a, json_type_array))
		return;
	for (size_t i = 0; i < json_object_array_length(a); i++)
		vc_print_figures(t, json_object_array_get_idx(a, i), indent, title, NULL);
}

/* A migration with everything in it, every figure the tables have. */
static void print_migration(struct json_object *m)
{
	struct json_object *in = vc_obj_field(m, "inspect"), *cv = vc_obj_field(m, "convergence"),
			   *conns;

	vc_print_figures(&ctl_migration_table, m, "", "", NULL);
	if (in)
		vc_print_figures(&ctl_insp_summary_table, in, "  ", "inspect: ", NULL);
	else
		printf("  inspect: off\n");
	print_each(&ctl_port_table, m, "ports", "  ", "");
	if (json_object_object_get_ex(m, "connections", &conns) &&
	    json_object_is_type(conns, json_type_array))
		for (size_t i = 0; i < json_object_array_length(conns); i++) {
			struct json_object *c = json_object_array_get_idx(conns, i);

			vc_print_figures(&ctl_conn_table, c, "  ", "conn ", NULL);
			in = vc_obj_field(c, "inspect");
			if (in)
				vc_print_figures(&ctl_insp_stats_table, in, "    ",
						 "inspect: ", NULL);
		}
	if (cv)
		print_conv(cv, "  ", "convergence: ");
	if (vc_obj_field(m, "nic"))
		vc_print_figures(&ctl_nic_table, vc_obj_field(m, "nic"), "  ", "nic: ", NULL);
}

static void metrics(int argc, char **argv)
{
	struct json_object *reply, *node, *migs;
	bool json = argc == 1 && strcmp(argv[0], "--json") == 0;

	if (argc > 0 && !json)
		die(EXIT_FAIL, "metrics: unexpected argument \"%s\"", argv[0]);
	reply = call(request("metrics", NULL));
	if (json) {
		printf("%s\n", json_object_to_json_string_ext(
				       reply, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED));
		return;
	}
	vc_reply_v2(reply);
	node = vc_obj_field(reply, "node");
	if (!node || !json_object_object_get_ex(reply, "migrations", &migs) ||
	    !json_object_is_type(migs, json_type_array))
		die(EXIT_FAIL, "vmigd sent no metrics");
	vc_print_figures(&ctl_node_table, node, "", "node: ", NULL);
	if (vc_obj_field(node, "nic"))
		vc_print_figures(&ctl_nic_table, vc_obj_field(node, "nic"), "", "nic: ", NULL);
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		printf("\n");
		print_migration(json_object_array_get_idx(migs, i));
	}
}

/* ---- top ---- */

#define BAR_WIDTH 20

/*
 * Progress, where a total is known (the hypervisor's, else the stream's): done against total.
 * Without one the bar shows activity: the rate against the migration's limit, or without one,
 * its share of the node's rate in the same direction.
 */
static void bar(char *buf, uint64_t rate, uint64_t limit, uint64_t node_rate)
{
	uint64_t ref = limit ? limit : node_rate;
	unsigned int fill = ref ? (rate >= ref ? BAR_WIDTH : rate * BAR_WIDTH / ref) : 0;

	if (rate && !fill)
		fill = 1; /* moving, however little */
	buf[0] = '[';
	for (unsigned int i = 0; i < BAR_WIDTH; i++)
		buf[1 + i] = i < fill ? '#' : '.';
	buf[BAR_WIDTH + 1] = ']';
	buf[BAR_WIDTH + 2] = '\0';
}

/* A figure of o as its table's unit prints it. */
static const char *fig(const struct ctl_table *t, struct json_object *o, const char *key, char *buf,
		       size_t len)
{
	bool found;

	return vc_value_text(ctl_fig_find(t, key), vc_at(o, key, &found), buf, len);
}

/*
 * Without the hypervisor's figures: progress from the stream's RAM total and its estimate of
 * what remains (the inspector's "remaining"; absent where the stream cannot tell). The ETA is
 * what remains over the 10-s rate, less the dirty rate once a dirty pass was measured. Returns
 * whether the stream gave the bar.
 */
static bool stream_progress(struct json_object *m, struct json_object *in, bool src, char *bars,
			    char *eta, size_t eta_len)
{
	uint64_t total = vc_u64_at(in, "ram_total"), left, rate, dirty = 0;
	bool found;

	if (!in || !total || !vc_at(in, "remaining", &found))
		return false;
	left = vc_u64_at(in, "remaining");
	bar(bars, total - (left < total ? left : total), total, 0);
	if (strcmp(vc_str_field(m, "state"), "failed") == 0)
		return true;
	rate = vc_u64_at(m, src ? "rates.tx_10s" : "rates.rx_10s");
	if (vc_bool_field(in, "dirty_known"))
		dirty = vc_u64_at(in, "dirty_rate");
	if (rate > dirty)
		snprintf(eta, eta_len, "%.0f s (stream)", (double)left / (rate - dirty));
	else if (rate && dirty)
		snprintf(eta, eta_len, "never (stream)");
	else
		snprintf(eta, eta_len, "- (stream)");
	return true;
}

static void top_frame(struct json_object *reply, double interval)
{
	struct json_object *node = vc_obj_field(reply, "node"), *migs;
	char a[32], b[32], c[32], n[32], k[32];

	if (!node || !json_object_object_get_ex(reply, "migrations", &migs) ||
	    !json_object_is_type(migs, json_type_array))
		die(EXIT_FAIL, "vmigd sent no metrics");
	printf("vmigd: node cap %s, tx %s, rx %s, %s migrations, %s connections (every %g s)\n",
	       fig(&ctl_node_table, node, "bandwidth", a, sizeof(a)),
	       fig(&ctl_node_table, node, "rates.tx_1s", b, sizeof(b)),
	       fig(&ctl_node_table, node, "rates.rx_1s", c, sizeof(c)),
	       fig(&ctl_node_table, node, "migration_count", n, sizeof(n)),
	       fig(&ctl_node_table, node, "conns.active", k, sizeof(k)), interval);
	printf("%-20s %-6s %-22s %-11s %-12s %-25s %-12s %4s %s\n", "KEY", "ROLE", "ACTIVITY",
	       "BYTES", "RATE", "CAP / LIMIT", "DIRTY", "PASS", "ETA");
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i), *in;
		bool src = strcmp(vc_str_field(m, "role"), "source") == 0;
		const char *rate_key = src ? "rates.tx_1s" : "rates.rx_1s";
		uint64_t rate = vc_u64_at(m, rate_key);
		char bars[BAR_WIDTH + 3], caps[64], dirty[32] = "-", pass[24] = "-", eta[32];
		struct json_object *cv, *job;

		bar(bars, rate, vc_u64_at(m, "limit"), vc_u64_at(node, rate_key));
		snprintf(caps, sizeof(caps), "%s / %s",
			 fig(&ctl_migration_table, m, "cap", a, sizeof(a)),
			 fig(&ctl_migration_table, m, "limit", b, sizeof(b)));
		in = vc_obj_field(m, "inspect");
		if (in && vc_bool_field(in, "dirty_known"))
			fig(&ctl_insp_summary_table, in, "dirty_rate", dirty, sizeof(dirty));
		if (in && vc_u64_at(in, "passes"))
			fig(&ctl_insp_summary_table, in, "passes", pass, sizeof(pass));
		cv = vc_obj_field(m, "convergence");
		job = vc_obj_field(cv, "job");
		snprintf(eta, sizeof(eta), "%s",
			 strcmp(vc_str_field(m, "state"), "failed") == 0 ? "failed" : "-");
		if (!job) {
			stream_progress(m, in, src, bars, eta, sizeof(eta));
		} else {
			/* The hypervisor knows the total: bar, dirty rate, pass and ETA from it. */
			uint64_t total = vc_u64_at(job, "total"),
				 left = vc_u64_at(job, "remaining");
			uint64_t dirty_rate = vc_u64_at(cv, "dirty_rate");

			if (total)
				bar(bars, total - (left < total ? left : total), total, 0);
			if (dirty_rate)
				fig(&ctl_conv_table, cv, "dirty_rate", dirty, sizeof(dirty));
			if (vc_u64_at(job, "dirty_syncs"))
				fig(&ctl_conv_table, cv, "job.dirty_syncs", pass, sizeof(pass));
			if (strcmp(vc_str_field(job, "status"), "active") != 0)
				snprintf(eta, sizeof(eta), "%s", vc_str_field(job, "status"));
			else if (rate > dirty_rate)
				/* Each pass resends what the last one's time let the guest dirty.
				 */
				snprintf(eta, sizeof(eta), "%.0f s (qemu)",
					 (double)left / (rate - dirty_rate));
			else if (rate)
				snprintf(eta, sizeof(eta), "never (qemu)");
		}
		printf("%-20.20s %-6s %s %-11s %-12s %-25s %-12s %4s %s\n", vc_str_field(m, "key"),
		       vc_str_field(m, "role"), bars,
		       fig(&ctl_migration_table, m, src ? "bytes_tx" : "bytes_rx", a, sizeof(a)),
		       vc_speed(rate, b, sizeof(b)), caps, dirty, pass, eta);
		if (cv) {
			struct json_object *acts;
			size_t na = json_object_object_get_ex(cv, "actions", &acts) &&
						    json_object_is_type(acts, json_type_array)
					    ? json_object_array_length(acts)
					    : 0;
			struct json_object *last =
				na ? json_object_array_get_idx(acts, na - 1) : NULL;
			char line[1024];

			printf("%20s convergence %s: %s\n", "", vc_str_field(cv, "mode"),
			       last ? vc_figure_line(&ctl_action_table, last, "head", line,
						     sizeof(line))
				    : "no action");
			if (*vc_figure_line(&ctl_conv_table, cv, "outcome", line, sizeof(line)))
				printf("%20s %s\n", "", line);
		}
	}
	fflush(stdout);
}

static void top(int argc, char **argv)
{
	bool tty = isatty(STDOUT_FILENO);
	double interval = 1;
	unsigned long count = 0; /* 0: until interrupted */
	char *end;

	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--interval") == 0 && i + 1 < argc) {
			interval = strtod(argv[++i], &end);
			if (*end || !(interval >= 0.1 && interval <= 3600))
				die(EXIT_FAIL,
				    "--interval: expected seconds from 0.1 to 3600, got "
				    "\"%s\"",
				    argv[i]);
		} else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
			count = strtoul(argv[++i], &end, 10);
			if (*end || argv[i][0] == '-' || count < 1)
				die(EXIT_FAIL,
				    "--count: expected a number of frames from 1, got "
				    "\"%s\"",
				    argv[i]);
		} else {
			die(EXIT_FAIL, "top: unexpected argument \"%s\"", argv[i]);
		}
	}
	for (unsigned long n = 0; count == 0 || n < count; n++) {
		struct timespec ts = { (time_t)interval,
				       (long)((interval - (time_t)interval) * 1e9) };
		struct json_object *reply;

		if (n > 0)
			while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
				;
		reply = vc_reply_v2(call(request("metrics", NULL)));
		/* On a terminal each frame replaces the last; piped, frames follow each other. */
		if (tty)
			printf("\033[H\033[2J");
		else if (n > 0)
			printf("\n");
		top_frame(reply, interval);
	}
}

int main(int argc, char **argv)
{
	const char *env = getenv("VMIGD_CONTROL");
	int i = 1;

	atexit(release);
	/* A write to a daemon that has closed is an error to report, not a silent death. */
	signal(SIGPIPE, SIG_IGN);
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
	} else if (argc == 3 && strcmp(argv[0], "bandwidth") == 0) {
		set_bandwidth(argv[1], argv[2]);
		return 0;
	} else if (argc == 2 && strcmp(argv[0], "node-bandwidth") == 0) {
		set_bandwidth(NULL, argv[1]);
		return 0;
	} else if (argc >= 1 && strcmp(argv[0], "metrics") == 0) {
		metrics(argc - 1, argv + 1);
		return 0;
	} else if (argc >= 1 && strcmp(argv[0], "top") == 0) {
		top(argc - 1, argv + 1);
		return 0;
	}
	usage(stderr);
	return EXIT_FAIL;
}
