// SPDX-License-Identifier: Apache-2.0
/* Drives the libvirt convergence backend (cv_virt_open and its ops) from the command line for
 * test_cv_virt.py: one JSON line per command. A test tool, not for operators.
 *
 *   cv-virt-drive --libvirt URI --domain NAME [--timeout MS] COMMAND...
 *   COMMAND: prepare DOWNTIME_MS | query | watch SECONDS INTERVAL_MS | bandwidth BPS |
 *            downtime MS | throttle INIT STEP | postcopy | pause | resume | abort | sleep MS
 *
 * Exit status: 0 when every command returned 0, 1 when one failed, 2 when open failed (its line
 * has "cmd":"open"), 64 on bad usage. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <json-c/json.h>

#include "cv_backend.h"

static struct timespec t0;

static long long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0.tv_sec) * 1000LL + (t.tv_nsec - t0.tv_nsec) / 1000000;
}

static void json_str(const char *s)
{
	putchar('"');
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void result(const char *cmd, int rc, const char *err)
{
	printf("{\"cmd\":\"%s\",\"t_ms\":%lld,\"rc\":%d", cmd, now_ms(), rc);
	if (rc < 0) {
		printf(",\"errno\":");
		json_str(strerror(-rc));
		printf(",\"error\":");
		json_str(err);
	}
	printf("}\n");
	fflush(stdout);
}

static int query(struct cv_backend *b)
{
	struct json_object *o;
	struct cv_job j;
	int rc = b->ops->query(b, &j);

	if (rc < 0) {
		result("query", rc, b->ops->error(b));
		return rc;
	}
	o = cv_job_json(&j);
	json_object_object_add(o, "cmd", json_object_new_string("query"));
	json_object_object_add(o, "t_ms", json_object_new_int64(now_ms()));
	json_object_object_add(o, "rc", json_object_new_int(0));
	if (!j.error[0])
		json_object_object_add(o, "error", json_object_new_string(""));
	printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	fflush(stdout);
	json_object_put(o);
	return 0;
}

static void sleep_ms(unsigned long ms)
{
	struct timespec t = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	while (nanosleep(&t, &t) < 0 && errno == EINTR)
		;
}

static int usage(void)
{
	fprintf(stderr,
		"usage: cv-virt-drive --libvirt URI --domain NAME [--timeout MS] COMMAND...\n"
		"  COMMAND: prepare DOWNTIME_MS | query | watch SECONDS INTERVAL_MS |\n"
		"           bandwidth BPS | downtime MS | throttle INIT STEP | postcopy |\n"
		"           pause | resume | abort | sleep MS\n");
	return 64;
}

static bool num(const char *s, unsigned long long *v)
{
	char *end;

	if (!s || !*s)
		return false;
	errno = 0;
	*v = strtoull(s, &end, 10);
	return !errno && !*end;
}

int main(int argc, char **argv)
{
	const char *uri = NULL, *domain = NULL;
	unsigned long long timeout = 10000, a, c;
	struct cv_backend *b;
	char err[512] = "";
	int i = 1, rc, status = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (; i + 1 < argc && !strncmp(argv[i], "--", 2); i += 2) {
		if (!strcmp(argv[i], "--libvirt"))
			uri = argv[i + 1];
		else if (!strcmp(argv[i], "--domain"))
			domain = argv[i + 1];
		else if (!strcmp(argv[i], "--timeout") && num(argv[i + 1], &timeout))
			;
		else
			return usage();
	}
	if (!domain || i >= argc)
		return usage();
	rc = cv_virt_open(uri, domain, (unsigned int)timeout, &b, err, sizeof(err));
	if (rc < 0) {
		result("open", rc, err);
		return 2;
	}
	for (; i < argc; i++) {
		const char *cmd = argv[i];
		const char *x = i + 1 < argc ? argv[i + 1] : NULL;
		const char *y = i + 2 < argc ? argv[i + 2] : NULL;

		if (!strcmp(cmd, "query")) {
			rc = query(b);
		} else if (!strcmp(cmd, "watch") && num(x, &a) && num(y, &c) && c) {
			long long end = now_ms() + (long long)a * 1000;

			rc = 0;
			while (now_ms() < end) {
				if (query(b) < 0)
					rc = -1;
				sleep_ms(c);
			}
			i += 2;
			if (rc < 0)
				status = 1;
			continue;
		} else if (!strcmp(cmd, "prepare") && num(x, &a)) {
			struct cv_setup s = { .max_downtime_ms = a };

			rc = b->ops->prepare(b, &s, err, sizeof(err));
			result(cmd, rc, err);
			i++;
		} else if (!strcmp(cmd, "bandwidth") && num(x, &a)) {
			rc = b->ops->set_bandwidth(b, a);
			result(cmd, rc, b->ops->error(b));
			i++;
		} else if (!strcmp(cmd, "downtime") && num(x, &a)) {
			rc = b->ops->set_downtime(b, a);
			result(cmd, rc, b->ops->error(b));
			i++;
		} else if (!strcmp(cmd, "throttle") && num(x, &a) && num(y, &c)) {
			rc = b->ops->set_throttle(b, (unsigned int)a, (unsigned int)c);
			result(cmd, rc, b->ops->error(b));
			i += 2;
		} else if (!strcmp(cmd, "postcopy")) {
			rc = b->ops->start_postcopy(b);
			result(cmd, rc, b->ops->error(b));
		} else if (!strcmp(cmd, "pause")) {
			rc = b->ops->pause(b);
			result(cmd, rc, b->ops->error(b));
		} else if (!strcmp(cmd, "resume")) {
			rc = b->ops->resume(b);
			result(cmd, rc, b->ops->error(b));
		} else if (!strcmp(cmd, "abort")) {
			rc = b->ops->abort(b);
			result(cmd, rc, b->ops->error(b));
		} else if (!strcmp(cmd, "sleep") && num(x, &a)) {
			sleep_ms(a);
			rc = 0;
			i++;
		} else {
			b->ops->free(b);
			return usage();
		}
		if (rc < 0)
			status = 1;
	}
	b->ops->free(b);
	return status;
}
