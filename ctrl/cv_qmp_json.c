// SPDX-License-Identifier: Apache-2.0
/* The QMP backend's reader of QEMU's replies: query-migrate's MigrationInfo and query-status's
 * StatusInfo into a cv_job, with no trust in their types. Pure: no socket, no lock, no policy; the
 * client that fetches the replies is cv_qmp.c. */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cv_backend.h"
#include "cv_qmp_priv.h"
#include "util.h"

void cv_qmp_one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = ' ';
}

void __attribute__((format(printf, 3, 4)))
cv_qmp_fmt_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	cv_qmp_one_line(err);
}

/* ------------------------------------------------------------------------------------------ */
/* The parser: QEMU's MigrationInfo and StatusInfo, read with no trust in their types. */

enum field { ABSENT = 0, FOUND = 1 };

/* FOUND with *v, ABSENT, or -EPROTO with a message naming the field. */
static int field_get(struct json_object *o, const char *obj, const char *key, enum json_type t,
		     struct json_object **v, char *err, size_t errlen)
{
	static const char *const names[] = {
		[json_type_null] = "null",	  [json_type_boolean] = "a boolean",
		[json_type_double] = "a float",	  [json_type_int] = "an integer",
		[json_type_object] = "an object", [json_type_array] = "an array",
		[json_type_string] = "a string",
	};
	enum json_type got;

	if (!o || !json_object_object_get_ex(o, key, v))
		return ABSENT;
	got = json_object_get_type(*v);
	if (got == t || (t == json_type_double && got == json_type_int))
		return FOUND;
	cv_qmp_fmt_err(err, errlen, "%s%s%s is %s, not %s", obj, *obj ? "." : "", key,
		       (unsigned int)got < ARRAY_SIZE(names) ? names[got] : "of an unknown type",
		       names[t]);
	return -EPROTO;
}

static int field_u64(struct json_object *o, const char *obj, const char *key, uint64_t *out,
		     char *err, size_t errlen)
{
	struct json_object *v;
	int r = field_get(o, obj, key, json_type_int, &v, err, errlen);

	if (r != FOUND)
		return r;
	/* json-c keeps integers above INT64_MAX as unsigned; get_int64 clamps them to its max. */
	if (json_object_get_int64(v) < 0) {
		cv_qmp_fmt_err(err, errlen, "%s%s%s is negative: %" PRId64, obj, *obj ? "." : "",
			       key, json_object_get_int64(v));
		return -EPROTO;
	}
	*out = json_object_get_uint64(v);
	return FOUND;
}

/* Times and percentages: integers from 0 to max. */
static int field_i64(struct json_object *o, const char *obj, const char *key, int64_t max,
		     int64_t *out, char *err, size_t errlen)
{
	struct json_object *v;
	int r = field_get(o, obj, key, json_type_int, &v, err, errlen);
	int64_t x;

	if (r != FOUND)
		return r;
	x = json_object_get_int64(v);
	if (x < 0 || x > max) {
		cv_qmp_fmt_err(err, errlen, "%s%s%s is out of range: %" PRId64, obj,
			       *obj ? "." : "", key, x);
		return -EPROTO;
	}
	*out = x;
	return FOUND;
}

/* "mbps" is a QAPI number: a float, or an integer when it happens to be whole ("mbps": 0). */
static int field_num(struct json_object *o, const char *obj, const char *key, double *out,
		     char *err, size_t errlen)
{
	struct json_object *v;
	int r = field_get(o, obj, key, json_type_double, &v, err, errlen);
	double x;

	if (r != FOUND)
		return r;
	x = json_object_get_double(v);
	if (!isfinite(x) || x < 0) {
		cv_qmp_fmt_err(err, errlen, "%s%s%s is out of range: %g", obj, *obj ? "." : "", key,
			       x);
		return -EPROTO;
	}
	*out = x;
	return FOUND;
}

static const struct {
	const char *name;
	enum cv_status status;
} qemu_states[] = {
	{ "none", CV_ST_NONE },
	{ "setup", CV_ST_SETUP },
	{ "active", CV_ST_ACTIVE },
	{ "colo", CV_ST_ACTIVE }, /* never ends by itself; nothing to converge */
	{ "device", CV_ST_SWITCHOVER },
	{ "pre-switchover", CV_ST_SWITCHOVER },
	{ "wait-unplug", CV_ST_SWITCHOVER },
	{ "postcopy-device", CV_ST_SWITCHOVER }, /* 10.2: device state on the way to postcopy */
	{ "postcopy-active", CV_ST_POSTCOPY },
	{ "postcopy-paused", CV_ST_POSTCOPY_PAUSED },
	{ "postcopy-recover-setup", CV_ST_POSTCOPY_PAUSED },
	{ "postcopy-recover", CV_ST_POSTCOPY_PAUSED },
	{ "cancelling", CV_ST_CANCELLING },
	{ "completed", CV_ST_COMPLETED },
	{ "failed", CV_ST_FAILED },
	{ "cancelled", CV_ST_CANCELLED },
};

/*
 * A state this QEMU added after us still means a migration exists. Calling it finished would
 * make the policy give up on (or clean up under) a running migration, and refusing the sample
 * would blind it; so an unknown state is ACTIVE (still running, nothing terminal decided), and an
 * unknown "postcopy-..." one is POSTCOPY, where nothing may be done that needs the source's copy
 * (no cancel). prepare() refuses both, as it does any migration in flight.
 */
static enum cv_status status_from_qemu(const char *s)
{
	for (size_t i = 0; i < ARRAY_SIZE(qemu_states); i++)
		if (strcmp(s, qemu_states[i].name) == 0)
			return qemu_states[i].status;
	return strncmp(s, "postcopy-", 9) == 0 ? CV_ST_POSTCOPY : CV_ST_ACTIVE;
}

/* Pages are 4 KiB to 64 KiB in practice; huge pages are not QEMU's accounting unit. */
#define PAGE_SIZE_MAX (1ull << 30)
/* Limits of sanity on QEMU's figures: 2^53 ms is 285 000 years. */
#define TIME_MAX ((int64_t)1 << 53)

int cv_qmp_job_from_json(struct json_object *mig, struct json_object *st, struct cv_job *out,
			 char *err, size_t errlen)
{
	struct cv_job j = {
		.status = CV_ST_NONE,
		.elapsed_ms = -1,
		.expected_downtime_ms = -1,
		.downtime_ms = -1,
	};
	struct json_object *v, *ram = NULL;
	uint64_t pages_rate = 0, page_size = 4096;
	int64_t pct = 0;
	double mbps = 0;
	int r;

	if (mig && !json_object_is_type(mig, json_type_object)) {
		cv_qmp_fmt_err(err, errlen,
			       "query-migrate returned something other than an object");
		return -EPROTO;
	}
	if (st && !json_object_is_type(st, json_type_object)) {
		cv_qmp_fmt_err(err, errlen, "query-status returned something other than an object");
		return -EPROTO;
	}
	/* No status: no migration was ever started (QAPI's own words). */
	r = field_get(mig, "", "status", json_type_string, &v, err, errlen);
	if (r < 0)
		return r;
	if (r == FOUND)
		j.status = status_from_qemu(json_object_get_string(v));
	r = field_get(mig, "", "ram", json_type_object, &ram, err, errlen);
	if (r < 0)
		return r;
	if (r == ABSENT)
		ram = NULL;

	if ((r = field_i64(mig, "", "total-time", TIME_MAX, &j.elapsed_ms, err, errlen)) < 0 ||
	    (r = field_i64(mig, "", "expected-downtime", TIME_MAX, &j.expected_downtime_ms, err,
			   errlen)) < 0 ||
	    (r = field_i64(mig, "", "downtime", TIME_MAX, &j.downtime_ms, err, errlen)) < 0 ||
	    (r = field_i64(mig, "", "cpu-throttle-percentage", 100, &pct, err, errlen)) < 0 ||
	    (r = field_u64(ram, "ram", "total", &j.total, err, errlen)) < 0 ||
	    (r = field_u64(ram, "ram", "remaining", &j.remaining, err, errlen)) < 0 ||
	    (r = field_u64(ram, "ram", "transferred", &j.transferred, err, errlen)) < 0 ||
	    (r = field_u64(ram, "ram", "dirty-pages-rate", &pages_rate, err, errlen)) < 0 ||
	    (r = field_u64(ram, "ram", "page-size", &page_size, err, errlen)) < 0 ||
	    (r = field_u64(ram, "ram", "dirty-sync-count", &j.dirty_syncs, err, errlen)) < 0 ||
	    (r = field_u64(ram, "ram", "postcopy-requests", &j.postcopy_requests, err, errlen)) <
		    0 ||
	    (r = field_num(ram, "ram", "mbps", &mbps, err, errlen)) < 0)
		return r;
	j.throttle_pct = (unsigned int)pct;
	if (page_size == 0 || page_size > PAGE_SIZE_MAX) {
		cv_qmp_fmt_err(err, errlen, "ram.page-size is out of range: %" PRIu64, page_size);
		return -EPROTO;
	}
	if (pages_rate > UINT64_MAX / page_size) {
		cv_qmp_fmt_err(err, errlen, "ram.dirty-pages-rate is out of range: %" PRIu64,
			       pages_rate);
		return -EPROTO;
	}
	j.dirty_rate = pages_rate * page_size;
	/* Megabits of 10^6 bits: QEMU computes bytes * 8 / ms / 1000. */
	if (mbps * 125000.0 + 0.5 >= 18446744073709551616.0) {
		cv_qmp_fmt_err(err, errlen, "ram.mbps is out of range: %g", mbps);
		return -EPROTO;
	}
	j.rate = (uint64_t)(mbps * 125000.0 + 0.5);

	r = field_get(mig, "", "error-desc", json_type_string, &v, err, errlen);
	if (r < 0)
		return r;
	if (r == FOUND) {
		/* Taken up to an embedded NUL, if QEMU ever sent one. */
		snprintf(j.error, sizeof(j.error), "%s", json_object_get_string(v));
		cv_qmp_one_line(j.error);
	}

	/* "running" is the one to read; a QEMU that dropped it still says "status": "running". */
	r = field_get(st, "", "running", json_type_boolean, &v, err, errlen);
	if (r < 0)
		return r;
	if (r == FOUND) {
		j.guest_running = json_object_get_boolean(v);
	} else {
		r = field_get(st, "", "status", json_type_string, &v, err, errlen);
		if (r < 0)
			return r;
		j.guest_running = r == FOUND && strcmp(json_object_get_string(v), "running") == 0;
	}
	*out = j;
	return 0;
}

struct json_object *cv_qmp_parse_object(const char *text, size_t len)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *o;
	size_t end;

	if (!tok)
		return NULL;
	o = json_tokener_parse_ex(tok, text, (int)len);
	end = json_tokener_get_parse_end(tok);
	json_tokener_free(tok);
	if (!o)
		return NULL;
	for (; end < len; end++) {
		if (!strchr(" \t\r\n", text[end])) {
			json_object_put(o);
			return NULL;
		}
	}
	if (!json_object_is_type(o, json_type_object)) {
		json_object_put(o);
		return NULL;
	}
	return o;
}

/* The "return" of one reply's text; -EPROTO if it is not a successful reply. */
static int reply_return(const char *what, const char *text, struct json_object **reply,
			struct json_object **ret, char *err, size_t errlen)
{
	size_t len = strlen(text);

	if (len > QMP_LINE_MAX) {
		cv_qmp_fmt_err(err, errlen, "%s: reply longer than %u bytes", what, QMP_LINE_MAX);
		return -EPROTO;
	}
	*reply = cv_qmp_parse_object(text, len);
	if (!*reply) {
		cv_qmp_fmt_err(err, errlen, "%s: reply is not a JSON object", what);
		return -EPROTO;
	}
	if (!json_object_object_get_ex(*reply, "return", ret)) {
		cv_qmp_fmt_err(err, errlen, "%s: reply has no \"return\"", what);
		return -EPROTO;
	}
	if (!json_object_is_type(*ret, json_type_object)) {
		cv_qmp_fmt_err(err, errlen, "%s: reply's \"return\" is not an object", what);
		return -EPROTO;
	}
	return 0;
}

int cv_qmp_parse_job(const char *migrate_reply, const char *status_reply, struct cv_job *job)
{
	struct json_object *mreply = NULL, *sreply = NULL, *mret = NULL, *sret = NULL;
	char err[QMP_ERR_MAX];
	int r = 0;

	if (migrate_reply)
		r = reply_return("query-migrate", migrate_reply, &mreply, &mret, err, sizeof(err));
	if (r == 0 && status_reply)
		r = reply_return("query-status", status_reply, &sreply, &sret, err, sizeof(err));
	if (r == 0)
		r = cv_qmp_job_from_json(mret, sret, job, err, sizeof(err));
	json_object_put(mreply);
	json_object_put(sreply);
	return r;
}
