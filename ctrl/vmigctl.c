// SPDX-License-Identifier: Apache-2.0
/* vmigctl(8): a thin client of vmigd's control socket. It builds one JSON request, prints the
 * reply in the form the command promises, and turns errors into one line on stderr; `top` repeats
 * the metrics request to draw a live view. */
#include <errno.h>
#include <inttypes.h>
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

#include "units.h"
#include "util.h"
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
		"                         [--bandwidth RATE]\n"
		"       vmigctl [-c PATH] target stop KEY\n"
		"       vmigctl [-c PATH] source start KEY --target JSON --dir BASEDIR "
		"[--bandwidth RATE]\n"
		"                         [--qmp PATH | --libvirt-domain NAME [--libvirt-uri URI]]\n"
		"                         [--mode predictive|kubevirt] [--policy JSON|@FILE]\n"
		"                         [--allow-auto-converge] [--allow-post-copy]\n"
		"                         [--allow-workload-disruption | --no-workload-disruption]\n"
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
	json_object_put(reply_obj); /* top calls again and again */
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

static void target_start(const char *key, int argc, char **argv)
{
	struct json_object *req = request("target-start", key), *socks = json_object_new_object();
	struct json_object *reply, *t;

	for (int i = 0; i < argc; i++) {
		const char *spec = NULL;
		char copy[4096], *eq;

		if (bandwidth_opt(req, argc, argv, &i))
			continue;
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
		else if (!bandwidth_opt(req, argc, argv, &i))
			die(EXIT_FAIL, "source start: unexpected argument \"%s\"", argv[i]);
	}
	if (qmp && dom)
		die(EXIT_FAIL, "source start: give --qmp or --libvirt-domain, not both");
	if (!qmp && !dom && (pol || mode || uri || json_object_object_length(over)))
		die(EXIT_FAIL, "source start: a convergence policy needs a backend: --qmp PATH (the "
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

static const char *str_field(struct json_object *o, const char *name)
{
	struct json_object *v;

	/* "-" for a field left out or null, so that printf never sees NULL. */
	return o && json_object_object_get_ex(o, name, &v) && v ? json_object_get_string(v) : "-";
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

	return o && json_object_object_get_ex(o, name, &v) && json_object_get_boolean(v);
}

/* 0 when missing: the figures are counters, rates and caps, where 0 reads as none. */
static uint64_t u64_field(struct json_object *o, const char *name)
{
	struct json_object *v;

	return o && json_object_object_get_ex(o, name, &v) ? json_object_get_uint64(v) : 0;
}

static double double_field(struct json_object *o, const char *name)
{
	struct json_object *v;

	return o && json_object_object_get_ex(o, name, &v) ? json_object_get_double(v) : 0;
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

/* Per watched migration: the mode, what it judged by, each action, the outcome. */
static void print_convergence(struct json_object *s)
{
	struct json_object *migs, *cv, *acts, *job;

	if (!json_object_object_get_ex(s, "migration_list", &migs))
		return;
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i);

		if (!json_object_object_get_ex(m, "convergence", &cv))
			continue;
		printf("convergence %s: %s via %s, %s", str_field(m, "key"), str_field(cv, "mode"),
		       str_field(cv, "backend"), str_field(cv, "state"));
		if (json_object_object_get_ex(cv, "job", &job) && job)
			printf(", QEMU %s, remaining %s of %s, pass %s, dirty %s B/s, throttle %s%%",
			       str_field(job, "status"), str_field(job, "remaining"),
			       str_field(job, "total"), str_field(job, "dirty_syncs"),
			       str_field(job, "dirty_rate"), str_field(job, "throttle_pct"));
		printf("\n");
		if (json_object_object_get_ex(cv, "actions", &acts))
			for (size_t j = 0; j < json_object_array_length(acts); j++) {
				struct json_object *a = json_object_array_get_idx(acts, j);

				printf("  at %s s: %s%s: %s\n", str_field(a, "at_s"),
				       str_field(a, "action"), bool_field(a, "ok") ? "" : " (failed)",
				       str_field(a, "reason"));
			}
		if (json_object_object_get_ex(cv, "outcome", NULL))
			printf("  outcome: %s\n", str_field(cv, "outcome"));
	}
}

static void status(int argc, char **argv)
{
	struct json_object *reply = call(request("status", NULL)), *s;
	char rate[32];
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
	printf("bandwidth: %s\n", vm_format_rate(u64_field(s, "bandwidth"), rate, sizeof(rate)));
	printf("shaper: %s\n", str_field(s, "shaper"));
	printf("inspect: %s\n", bool_field(s, "inspect") ? "on" : "off");
	if (json_object_object_get_ex(s, "metrics", NULL))
		printf("metrics: http://%s/metrics\n", str_field(s, "metrics"));
	print_connections(s);
	print_convergence(s);
}

static void set_bandwidth(const char *key, const char *rate)
{
	struct json_object *req = request(key ? "bandwidth" : "node-bandwidth", key);

	json_object_object_add(req, "bandwidth", json_object_new_uint64(rate_arg("RATE", rate)));
	call(req);
}

static struct json_object *obj_field(struct json_object *o, const char *name)
{
	struct json_object *v;

	if (!o || !json_object_object_get_ex(o, name, &v) ||
	    !json_object_is_type(v, json_type_object))
		return NULL;
	return v;
}

/* A measured rate: "0 B/s" when idle (vm_format_rate's 0 is a cap's "unlimited"). */
static char *speed(uint64_t v, char *buf, size_t len)
{
	if (v == 0) {
		snprintf(buf, len, "0 B/s");
		return buf;
	}
	return vm_format_rate(v, buf, len);
}

static void print_rates(const char *indent, struct json_object *r)
{
	char a[32], b[32], c[32], d[32];

	printf("%srate: tx %s (1s) %s (10s), rx %s (1s) %s (10s)\n", indent,
	       speed(u64_field(r, "tx_1s"), a, sizeof(a)),
	       speed(u64_field(r, "tx_10s"), b, sizeof(b)),
	       speed(u64_field(r, "rx_1s"), c, sizeof(c)),
	       speed(u64_field(r, "rx_10s"), d, sizeof(d)));
}

static void print_inspect(struct json_object *in)
{
	struct json_object *ch = obj_field(in, "channels");
	char a[32];

	if (!in) {
		printf("  inspect: off\n");
		return;
	}
	printf("  inspect: stream v%" PRIu64 ", machine %s, channels %" PRIu64 " main + %" PRIu64
	       " multifd",
	       u64_field(in, "stream_version"),
	       *str_field(in, "machine") ? str_field(in, "machine") : "-", u64_field(ch, "main"),
	       u64_field(ch, "multifd"));
	if (u64_field(ch, "other"))
		printf(" + %" PRIu64 " other", u64_field(ch, "other"));
	printf("\n  pages: %" PRIu64 " (zero %" PRIu64 "), sync points %" PRIu64 ", pass %" PRIu64,
	       u64_field(in, "pages"), u64_field(in, "zero_pages"), u64_field(in, "syncs"),
	       u64_field(in, "passes"));
	if (bool_field(in, "dirty_known"))
		printf(", dirty %s (%" PRIu64 " pages/pass)",
		       speed(u64_field(in, "dirty_rate"), a, sizeof(a)),
		       u64_field(in, "dirty_pages_per_pass"));
	else
		printf(", dirty -");
	if (bool_field(in, "switchover"))
		printf(", switchover");
	printf("\n");
	if (u64_field(in, "bytes_only"))
		printf("  bytes only on %" PRIu64 " channel(s): %s\n", u64_field(in, "bytes_only"),
		       str_field(in, "reason"));
}

static void print_migration(struct json_object *m)
{
	struct json_object *ports, *c = obj_field(m, "conns");
	char a[32], b[32], tx[32], rx[32];

	printf("%s %s %s, mode %s, running %.1f s", str_field(m, "key"), str_field(m, "role"),
	       str_field(m, "state"), str_field(m, "mode"), double_field(m, "duration_s"));
	if (json_object_object_get_ex(m, "peer", NULL))
		printf(", peer %s", str_field(m, "peer"));
	printf("\n");
	if (json_object_object_get_ex(m, "error", NULL))
		printf("  error: %s\n", str_field(m, "error"));
	printf("  sent %s, received %s\n", vm_format_bytes(u64_field(m, "bytes_tx"), a, sizeof(a)),
	       vm_format_bytes(u64_field(m, "bytes_rx"), b, sizeof(b)));
	print_rates("  ", obj_field(m, "rates"));
	printf("  cap %s, limit %s%s, shaped %.1f s\n",
	       vm_format_rate(u64_field(m, "cap"), a, sizeof(a)),
	       vm_format_rate(u64_field(m, "limit"), b, sizeof(b)),
	       bool_field(m, "cap_lifted") ? " (lifted at switchover)" : "",
	       u64_field(m, "shaped_ms") / 1000.0);
	printf("  connections: %" PRIu64 " active, %" PRIu64 " total, %" PRIu64 " failed\n",
	       u64_field(c, "active"), u64_field(c, "total"), u64_field(c, "failed"));
	print_inspect(obj_field(m, "inspect"));
	if (!json_object_object_get_ex(m, "ports", &ports))
		return;
	for (size_t i = 0; i < json_object_array_length(ports); i++) {
		struct json_object *p = json_object_array_get_idx(ports, i), *r;

		r = obj_field(p, "rates");
		printf("  port %s: sent %s, received %s, tx %s, rx %s (1s), %" PRIu64
		       " connections active\n",
		       str_field(p, "id"), vm_format_bytes(u64_field(p, "bytes_tx"), a, sizeof(a)),
		       vm_format_bytes(u64_field(p, "bytes_rx"), b, sizeof(b)),
		       speed(u64_field(r, "tx_1s"), tx, sizeof(tx)),
		       speed(u64_field(r, "rx_1s"), rx, sizeof(rx)),
		       u64_field(obj_field(p, "conns"), "active"));
	}
}

static void metrics(int argc, char **argv)
{
	struct json_object *reply, *node, *migs;
	bool json = argc == 1 && strcmp(argv[0], "--json") == 0;
	char a[32], b[32];

	if (argc > 0 && !json)
		die(EXIT_FAIL, "metrics: unexpected argument \"%s\"", argv[0]);
	reply = call(request("metrics", NULL));
	if (json) {
		printf("%s\n", json_object_to_json_string_ext(
				       reply, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED));
		return;
	}
	node = obj_field(reply, "node");
	if (!node || !json_object_object_get_ex(reply, "migrations", &migs))
		die(EXIT_FAIL, "vmigd sent no metrics");
	printf("node: cap %s, shaper %s, inspect %s\n",
	       vm_format_rate(u64_field(node, "bandwidth"), a, sizeof(a)),
	       str_field(node, "shaper"), bool_field(node, "inspect") ? "on" : "off");
	printf("  sent %s, received %s\n",
	       vm_format_bytes(u64_field(node, "bytes_tx"), a, sizeof(a)),
	       vm_format_bytes(u64_field(node, "bytes_rx"), b, sizeof(b)));
	print_rates("  ", obj_field(node, "rates"));
	printf("  migrations: %" PRIu64 ", connections %" PRIu64 " active, %" PRIu64 " total\n",
	       u64_field(node, "migrations"), u64_field(node, "conns_active"),
	       u64_field(node, "conns_total"));
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		printf("\n");
		print_migration(json_object_array_get_idx(migs, i));
	}
}

#define BAR_WIDTH 20

/*
 * There is no total to measure progress against yet, so the bar shows activity: the rate against
 * the migration's limit, or without one, its share of the node's rate in the same direction.
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

static void top_frame(struct json_object *reply, double interval)
{
	struct json_object *node = obj_field(reply, "node"), *migs, *nr = obj_field(node, "rates");
	char a[32], b[32], c[32];

	if (!node || !json_object_object_get_ex(reply, "migrations", &migs))
		die(EXIT_FAIL, "vmigd sent no metrics");
	printf("vmigd: node cap %s, tx %s, rx %s, %" PRIu64 " migrations, %" PRIu64
	       " connections (every %g s)\n",
	       vm_format_rate(u64_field(node, "bandwidth"), a, sizeof(a)),
	       speed(u64_field(nr, "tx_1s"), b, sizeof(b)),
	       speed(u64_field(nr, "rx_1s"), c, sizeof(c)), u64_field(node, "migrations"),
	       u64_field(node, "conns_active"), interval);
	printf("%-20s %-6s %-22s %-11s %-12s %-25s %-12s %4s %s\n", "KEY", "ROLE", "ACTIVITY",
	       "BYTES", "RATE", "CAP / LIMIT", "DIRTY", "PASS", "ETA");
	for (size_t i = 0; i < json_object_array_length(migs); i++) {
		struct json_object *m = json_object_array_get_idx(migs, i), *in;
		struct json_object *r = obj_field(m, "rates");
		bool src = strcmp(str_field(m, "role"), "source") == 0;
		uint64_t rate = u64_field(r, src ? "tx_1s" : "rx_1s");
		char bars[BAR_WIDTH + 3], caps[64], dirty[32] = "-", pass[24] = "-", eta[32];
		struct json_object *cv, *job;

		bar(bars, rate, u64_field(m, "limit"), u64_field(nr, src ? "tx_1s" : "rx_1s"));
		snprintf(caps, sizeof(caps), "%s / %s",
			 vm_format_rate(u64_field(m, "cap"), a, sizeof(a)),
			 vm_format_rate(u64_field(m, "limit"), b, sizeof(b)));
		in = obj_field(m, "inspect");
		if (in && bool_field(in, "dirty_known"))
			speed(u64_field(in, "dirty_rate"), dirty, sizeof(dirty));
		if (in && u64_field(in, "passes"))
			snprintf(pass, sizeof(pass), "%" PRIu64, u64_field(in, "passes"));
		cv = obj_field(m, "convergence");
		job = obj_field(cv, "job");
		snprintf(eta, sizeof(eta), "%s",
			 strcmp(str_field(m, "state"), "failed") == 0 ? "failed" : "-");
		if (job) {
			/* The hypervisor knows the total: bar, dirty rate, pass and ETA from it. */
			uint64_t total = u64_field(job, "total"), left = u64_field(job, "remaining");

			if (total)
				bar(bars, total - (left < total ? left : total), total, 0);
			if (u64_field(cv, "dirty_rate"))
				speed(u64_field(cv, "dirty_rate"), dirty, sizeof(dirty));
			if (u64_field(job, "dirty_syncs"))
				snprintf(pass, sizeof(pass), "%" PRIu64, u64_field(job, "dirty_syncs"));
			if (strcmp(str_field(job, "status"), "active") != 0)
				snprintf(eta, sizeof(eta), "%s", str_field(job, "status"));
			else if (rate > u64_field(cv, "dirty_rate"))
				/* Each pass resends what the last one's time let the guest dirty. */
				snprintf(eta, sizeof(eta), "%.0f s",
					 (double)left / (rate - u64_field(cv, "dirty_rate")));
			else if (rate)
				snprintf(eta, sizeof(eta), "never");
		}
		printf("%-20.20s %-6s %s %-11s %-12s %-25s %-12s %4s %s\n", str_field(m, "key"),
		       str_field(m, "role"), bars,
		       vm_format_bytes(u64_field(m, src ? "bytes_tx" : "bytes_rx"), a, sizeof(a)),
		       speed(rate, b, sizeof(b)), caps, dirty, pass, eta);
		if (cv) {
			struct json_object *acts = obj_field(cv, "actions");
			size_t n = acts ? json_object_array_length(acts) : 0;
			struct json_object *last = n ? json_object_array_get_idx(acts, n - 1) : NULL;

			printf("%20s convergence %s: %s%s%s%s%s\n", "", str_field(cv, "mode"),
			       last ? str_field(last, "action") : "no action",
			       last ? " at " : "", last ? str_field(last, "at_s") : "",
			       last ? " s: " : "", last ? str_field(last, "reason") : "");
			if (json_object_object_get_ex(cv, "outcome", NULL))
				printf("%20s outcome: %s\n", "", str_field(cv, "outcome"));
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
		reply = call(request("metrics", NULL));
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
