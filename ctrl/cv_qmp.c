// SPDX-License-Identifier: Apache-2.0
/* The convergence module's QMP backend: a blocking client of one of the source QEMU's own QMP
 * sockets, one command in flight, every call bounded by a poll() deadline. It runs on the
 * monitor thread, never on the event loop, and knows nothing of policy: it reports and acts. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cv_backend.h"
#include "util.h"

/* QEMU sends each message as one line; a query-migrate reply is ~1 KiB, so 1 MiB is only ever
 * reached by something that is not QEMU, or a QEMU gone wrong. */
#define QMP_LINE_MAX   (1u << 20)
#define QMP_READ_CHUNK (64u << 10)
/* QEMU's largest max-bandwidth; what "unlimited" is in QMP. */
#define QMP_MAX_BANDWIDTH 2251799813685247ull
#define QMP_ERR_MAX	  256

struct cv_qmp {
	struct cv_backend b;
	pthread_mutex_t lock; /* one call at a time: the replies of a socket are a sequence */
	int fd;		      /* -1 once QEMU closed it: every later call is -ECONNRESET */
	unsigned int timeout_ms;
	int qemu_major, qemu_minor; /* from the greeting; -1: not given */
	int64_t next_id;
	char *buf; /* what was read and not yet handed out: [consumed, len) */
	size_t len, cap, consumed, scanned;
	bool skip_line;	    /* the rest of an overlong line is being discarded */
	char mig_event[32]; /* status of the last MIGRATION event, "" before one */
	int run_event;	    /* the last STOP (0) or RESUME (1) event, -1 before one */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char err[QMP_ERR_MAX];
};

static struct cv_qmp *to_qmp(struct cv_backend *b)
{
	return container_of(b, struct cv_qmp, b);
}

/* One printable line: QEMU's texts and our own go to logs and status replies. */
static void one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = ' ';
}

static void __attribute__((format(printf, 3, 4)))
fmt_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	one_line(err);
}

#define set_err(q, ...) fmt_err((q)->err, sizeof((q)->err), __VA_ARGS__)

static void copy_err(char *err, size_t errlen, const char *text)
{
	if (err && errlen)
		snprintf(err, errlen, "%s", text);
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
	fmt_err(err, errlen, "%s%s%s is %s, not %s", obj, *obj ? "." : "", key,
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
		fmt_err(err, errlen, "%s%s%s is negative: %" PRId64, obj, *obj ? "." : "", key,
			json_object_get_int64(v));
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
		fmt_err(err, errlen, "%s%s%s is out of range: %" PRId64, obj, *obj ? "." : "", key,
			x);
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
		fmt_err(err, errlen, "%s%s%s is out of range: %g", obj, *obj ? "." : "", key, x);
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

static bool status_in_flight(enum cv_status s)
{
	return s != CV_ST_NONE && s != CV_ST_COMPLETED && s != CV_ST_FAILED && s != CV_ST_CANCELLED;
}

/* Pages are 4 KiB to 64 KiB in practice; huge pages are not QEMU's accounting unit. */
#define PAGE_SIZE_MAX (1ull << 30)
/* Limits of sanity on QEMU's figures: 2^53 ms is 285 000 years. */
#define TIME_MAX ((int64_t)1 << 53)

/* mig, st: the "return" values of query-migrate and query-status, each may be NULL. */
static int job_from_json(struct json_object *mig, struct json_object *st, struct cv_job *out,
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
		fmt_err(err, errlen, "query-migrate returned something other than an object");
		return -EPROTO;
	}
	if (st && !json_object_is_type(st, json_type_object)) {
		fmt_err(err, errlen, "query-status returned something other than an object");
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
		fmt_err(err, errlen, "ram.page-size is out of range: %" PRIu64, page_size);
		return -EPROTO;
	}
	if (pages_rate > UINT64_MAX / page_size) {
		fmt_err(err, errlen, "ram.dirty-pages-rate is out of range: %" PRIu64, pages_rate);
		return -EPROTO;
	}
	j.dirty_rate = pages_rate * page_size;
	/* Megabits of 10^6 bits: QEMU computes bytes * 8 / ms / 1000. */
	if (mbps * 125000.0 + 0.5 >= 18446744073709551616.0) {
		fmt_err(err, errlen, "ram.mbps is out of range: %g", mbps);
		return -EPROTO;
	}
	j.rate = (uint64_t)(mbps * 125000.0 + 0.5);

	r = field_get(mig, "", "error-desc", json_type_string, &v, err, errlen);
	if (r < 0)
		return r;
	if (r == FOUND) {
		/* Taken up to an embedded NUL, if QEMU ever sent one. */
		snprintf(j.error, sizeof(j.error), "%s", json_object_get_string(v));
		one_line(j.error);
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

/* A whole text is one JSON object, whitespace around it allowed. NULL: not one. */
static struct json_object *parse_object(const char *text, size_t len)
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
		fmt_err(err, errlen, "%s: reply longer than %u bytes", what, QMP_LINE_MAX);
		return -EPROTO;
	}
	*reply = parse_object(text, len);
	if (!*reply) {
		fmt_err(err, errlen, "%s: reply is not a JSON object", what);
		return -EPROTO;
	}
	if (!json_object_object_get_ex(*reply, "return", ret)) {
		fmt_err(err, errlen, "%s: reply has no \"return\"", what);
		return -EPROTO;
	}
	if (!json_object_is_type(*ret, json_type_object)) {
		fmt_err(err, errlen, "%s: reply's \"return\" is not an object", what);
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
		r = job_from_json(mret, sret, job, err, sizeof(err));
	json_object_put(mreply);
	json_object_put(sreply);
	return r;
}

/* ------------------------------------------------------------------------------------------ */
/* The client: lines in, one command out at a time. */

static int wait_fd(int fd, short events, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = events };
		uint64_t now = vm_now_ms();
		int r;

		if (now >= deadline)
			return -ETIMEDOUT;
		r = poll(&p, 1, (int)(deadline - now > 60000 ? 60000 : deadline - now));
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

static int send_all(struct cv_qmp *q, const char *p, size_t len, uint64_t deadline)
{
	while (len > 0) {
		ssize_t k = send(q->fd, p, len, MSG_NOSIGNAL);
		int r;

		if (k > 0) {
			p += k;
			len -= (size_t)k;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno != EAGAIN)
			return errno == EPIPE ? -ECONNRESET : -errno;
		r = wait_fd(q->fd, POLLOUT, deadline);
		if (r < 0)
			return r;
	}
	return 0;
}

/*
 * The next line, NUL-terminated without its CR LF, valid until the next call. -ETIMEDOUT (a
 * partial line stays for the next call), -ECONNRESET at EOF, -EPROTO for a line over the limit
 * (the rest of it is skipped by later calls), -errno.
 */
static int read_line(struct cv_qmp *q, uint64_t deadline, char **line)
{
	if (q->consumed) {
		memmove(q->buf, q->buf + q->consumed, q->len - q->consumed);
		q->len -= q->consumed;
		q->scanned = q->scanned > q->consumed ? q->scanned - q->consumed : 0;
		q->consumed = 0;
	}
	for (;;) {
		char *nl = q->len > q->scanned
				   ? memchr(q->buf + q->scanned, '\n', q->len - q->scanned)
				   : NULL;
		ssize_t k;
		int r;

		if (nl && q->skip_line) {
			size_t n = (size_t)(nl - q->buf) + 1;

			memmove(q->buf, q->buf + n, q->len - n);
			q->len -= n;
			q->scanned = 0;
			q->skip_line = false;
			continue;
		}
		if (nl) {
			size_t n = (size_t)(nl - q->buf);

			*nl = '\0';
			if (n > 0 && q->buf[n - 1] == '\r')
				q->buf[n - 1] = '\0';
			q->consumed = n + 1;
			q->scanned = q->consumed;
			*line = q->buf;
			return 0;
		}
		q->scanned = q->len;
		if (q->skip_line) {
			q->len = q->scanned = 0;
		} else if (q->len > QMP_LINE_MAX) {
			q->len = q->scanned = 0;
			q->skip_line = true;
			return -EPROTO;
		}
		if (q->cap - q->len < QMP_READ_CHUNK) {
			size_t cap = q->cap ? q->cap * 2 : QMP_READ_CHUNK * 2;
			char *b;

			if (cap > QMP_LINE_MAX + QMP_READ_CHUNK + 1)
				cap = QMP_LINE_MAX + QMP_READ_CHUNK + 1;
			b = realloc(q->buf, cap);
			if (!b)
				return -ENOMEM;
			q->buf = b;
			q->cap = cap;
		}
		/* Keep a byte for the NUL of a line that fills the buffer. */
		k = recv(q->fd, q->buf + q->len, q->cap - q->len - 1, 0);
		if (k > 0) {
			q->len += (size_t)k;
			continue;
		}
		if (k == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return errno == EPIPE ? -ECONNRESET : -errno;
		r = wait_fd(q->fd, POLLIN, deadline);
		if (r < 0)
			return r;
	}
}

static void note_event(struct cv_qmp *q, struct json_object *msg)
{
	struct json_object *ev, *data, *st;
	const char *name;

	if (!json_object_object_get_ex(msg, "event", &ev) ||
	    !json_object_is_type(ev, json_type_string))
		return;
	name = json_object_get_string(ev);
	if (strcmp(name, "STOP") == 0) {
		q->run_event = 0;
	} else if (strcmp(name, "RESUME") == 0) {
		q->run_event = 1;
	} else if (strcmp(name, "MIGRATION") == 0 &&
		   json_object_object_get_ex(msg, "data", &data) &&
		   json_object_object_get_ex(data, "status", &st) &&
		   json_object_is_type(st, json_type_string)) {
		snprintf(q->mig_event, sizeof(q->mig_event), "%s", json_object_get_string(st));
		one_line(q->mig_event);
	}
}

static void lost_socket(struct cv_qmp *q)
{
	if (q->fd >= 0)
		close(q->fd);
	q->fd = -1;
	set_err(q, "QEMU closed its QMP socket %s", q->path);
}

/* What the migration looked like last, for a message about a silent QEMU. */
static const char *event_hint(struct cv_qmp *q, char *buf, size_t len)
{
	if (!q->mig_event[0] && q->run_event < 0)
		return "";
	snprintf(buf, len, " (last events: migration %s, guest %s)",
		 q->mig_event[0] ? q->mig_event : "-",
		 q->run_event < 0 ? "-"
		 : q->run_event	  ? "resumed"
				  : "stopped");
	return buf;
}

/*
 * Runs cmd (args taken, may be NULL) and waits for its reply by id; events in between are noted,
 * replies to earlier commands that timed out are dropped. 0 with *ret (a reference, when ret is
 * given) the reply's "return"; -EIO with QEMU's desc; -ETIMEDOUT, -ECONNRESET, -EPROTO, -errno;
 * every failure leaves its line in q->err.
 */
static int qmp_call(struct cv_qmp *q, const char *cmd, struct json_object *args, uint64_t deadline,
		    struct json_object **ret)
{
	struct json_object *msg = json_object_new_object();
	int64_t id = ++q->next_id;
	const char *text;
	char hint[96];
	size_t len;
	int r;

	if (q->fd < 0) {
		json_object_put(args);
		json_object_put(msg);
		set_err(q, "QEMU closed its QMP socket %s", q->path);
		return -ECONNRESET;
	}
	if (!msg) {
		json_object_put(args);
		set_err(q, "%s: out of memory", cmd);
		return -ENOMEM;
	}
	json_object_object_add(msg, "execute", json_object_new_string(cmd));
	if (args)
		json_object_object_add(msg, "arguments", args);
	json_object_object_add(msg, "id", json_object_new_int64(id));
	text = json_object_to_json_string_ext(msg, JSON_C_TO_STRING_PLAIN);
	len = strlen(text);
	/* The JSON text and its newline go out in one send when they fit, as QEMU likes best. */
	{
		char *line = malloc(len + 2);

		if (!line) {
			json_object_put(msg);
			set_err(q, "%s: out of memory", cmd);
			return -ENOMEM;
		}
		memcpy(line, text, len);
		line[len] = '\n';
		line[len + 1] = '\0';
		json_object_put(msg);
		r = send_all(q, line, len + 1, deadline);
		free(line);
	}
	if (r < 0)
		goto fail;
	for (;;) {
		struct json_object *reply, *v, *e;
		char *l;

		r = read_line(q, deadline, &l);
		if (r < 0)
			goto fail;
		reply = parse_object(l, strlen(l));
		if (!reply) {
			set_err(q, "%s: QEMU sent a line that is not a JSON object: %.60s", cmd, l);
			return -EPROTO;
		}
		if (json_object_object_get_ex(reply, "event", NULL)) {
			note_event(q, reply);
			json_object_put(reply);
			continue;
		}
		/* An id-less error is QEMU failing to read a command at all: ours is the only one.
		 */
		if (json_object_object_get_ex(reply, "id", &v)) {
			if (!json_object_is_type(v, json_type_int) ||
			    json_object_get_int64(v) != id) {
				json_object_put(reply);
				continue;
			}
		} else if (!json_object_object_get_ex(reply, "error", NULL)) {
			json_object_put(reply);
			continue;
		}
		if (json_object_object_get_ex(reply, "return", &v)) {
			if (ret)
				*ret = json_object_get(v);
			json_object_put(reply);
			return 0;
		}
		if (json_object_object_get_ex(reply, "error", &e) &&
		    json_object_object_get_ex(e, "desc", &v) &&
		    json_object_is_type(v, json_type_string)) {
			set_err(q, "%s: %s", cmd, json_object_get_string(v));
			json_object_put(reply);
			return -EIO;
		}
		set_err(q, "%s: QEMU's reply has neither a return nor an error with a desc", cmd);
		json_object_put(reply);
		return -EPROTO;
	}
fail:
	switch (r) {
	case -ETIMEDOUT:
		set_err(q, "%s: no reply to %s in %u ms%s", q->path, cmd, q->timeout_ms,
			event_hint(q, hint, sizeof(hint)));
		break;
	case -ECONNRESET:
		lost_socket(q);
		break;
	case -EPROTO:
		set_err(q, "%s: QEMU sent a line over %u bytes", cmd, QMP_LINE_MAX);
		break;
	default:
		set_err(q, "%s: QMP socket %s: %s", cmd, q->path, strerror(-r));
		break;
	}
	return r;
}

/* A query whose return must be an object (QEMU's MigrationInfo, StatusInfo). */
static int qmp_query_obj(struct cv_qmp *q, const char *cmd, uint64_t deadline,
			 struct json_object **ret)
{
	int r = qmp_call(q, cmd, NULL, deadline, ret);

	if (r == 0 && !json_object_is_type(*ret, json_type_object)) {
		set_err(q, "%s: QEMU's return is not an object", cmd);
		json_object_put(*ret);
		*ret = NULL;
		r = -EPROTO;
	}
	return r;
}

static uint64_t deadline_of(struct cv_qmp *q)
{
	return vm_now_ms() + q->timeout_ms;
}

/* A command whose return is ignored, under the lock. */
static int qmp_simple(struct cv_backend *b, const char *cmd, struct json_object *args)
{
	struct cv_qmp *q = to_qmp(b);
	int r;

	pthread_mutex_lock(&q->lock);
	r = qmp_call(q, cmd, args, deadline_of(q), NULL);
	pthread_mutex_unlock(&q->lock);
	return r;
}

static struct json_object *params1(const char *key, int64_t value)
{
	struct json_object *a = json_object_new_object();

	if (a)
		json_object_object_add(a, key, json_object_new_int64(value));
	return a;
}

/* 1 if capability cap is on, 0 if off or unknown to this QEMU, -errno. */
static int qmp_cap(struct cv_qmp *q, const char *cap, uint64_t deadline)
{
	struct json_object *ret = NULL;
	int r = qmp_call(q, "query-migrate-capabilities", NULL, deadline, &ret), on = 0;
	size_t n;

	if (r < 0)
		return r;
	if (!json_object_is_type(ret, json_type_array)) {
		json_object_put(ret);
		set_err(q, "query-migrate-capabilities: reply is not a list");
		return -EPROTO;
	}
	n = json_object_array_length(ret);
	for (size_t i = 0; i < n; i++) {
		struct json_object *c = json_object_array_get_idx(ret, i), *name, *state;

		if (json_object_object_get_ex(c, "capability", &name) &&
		    json_object_is_type(name, json_type_string) &&
		    strcmp(json_object_get_string(name), cap) == 0 &&
		    json_object_object_get_ex(c, "state", &state) &&
		    json_object_is_type(state, json_type_boolean))
			on = json_object_get_boolean(state);
	}
	json_object_put(ret);
	return on;
}

/*
 * Multifd with postcopy came in 10.1. 8.0 to 10.0 refuse the pair at migrate-set-capabilities,
 * but 7.2 takes it and its migration breaks at migrate-start-postcopy, so we refuse it ourselves
 * before any version that cannot do it. 0, or -EOPNOTSUPP with the reason in q->err.
 */
static int check_postcopy_multifd(struct cv_qmp *q, const char *what, uint64_t deadline)
{
	int r;

	if (q->qemu_major > 10 || (q->qemu_major == 10 && q->qemu_minor >= 1))
		return 0;
	r = qmp_cap(q, "multifd", deadline);
	if (r <= 0)
		return r;
	if (q->qemu_major >= 0)
		set_err(q,
			"%s: multifd is on, and QEMU %d.%d cannot do postcopy with multifd "
			"(10.1 can)",
			what, q->qemu_major, q->qemu_minor);
	else
		set_err(q,
			"%s: multifd is on, and this QEMU (no version in its greeting) may not "
			"do postcopy with multifd",
			what);
	return -EOPNOTSUPP;
}

/* ------------------------------------------------------------------------------------------ */
/* The ops. */

static int qmp_prepare(struct cv_backend *b, const struct cv_setup *s, char *err, size_t errlen)
{
	struct cv_qmp *q = to_qmp(b);
	uint64_t deadline;
	struct json_object *ret = NULL, *caps, *params, *v;
	char tried[96];
	struct cv_job job;
	int r;

	pthread_mutex_lock(&q->lock);
	deadline = deadline_of(q);
	r = qmp_query_obj(q, "query-migrate", deadline, &ret);
	if (r < 0)
		goto out;
	r = job_from_json(ret, NULL, &job, q->err, sizeof(q->err));
	if (r == 0 && status_in_flight(job.status)) {
		json_object_object_get_ex(ret, "status", &v);
		set_err(q,
			"a migration is already in progress (QEMU status %s): capabilities "
			"cannot change until it ends",
			json_object_get_string(v));
		r = -EBUSY;
	}
	json_object_put(ret);
	if (r < 0)
		goto out;
	if (s->post_copy) {
		r = check_postcopy_multifd(q, "postcopy-ram", deadline);
		if (r < 0)
			goto out;
	}

	caps = json_object_new_array();
	json_object_array_add(caps, json_object_new_object());
	json_object_object_add(json_object_array_get_idx(caps, 0), "capability",
			       json_object_new_string("events"));
	json_object_object_add(json_object_array_get_idx(caps, 0), "state",
			       json_object_new_boolean(1));
	snprintf(tried, sizeof(tried), "migrate-set-capabilities events auto-converge=%s%s",
		 s->auto_converge ? "on" : "off", s->post_copy ? " postcopy-ram" : "");
	/*
	 * auto-converge follows the policy either way: left on from an earlier attempt, QEMU
	 * would throttle a guest the policy does not allow throttled. postcopy-ram is only
	 * turned on: on its own it does nothing until migrate-start-postcopy.
	 */
	for (int i = 0; i < 2; i++) {
		const char *name = i == 0 ? "auto-converge" : "postcopy-ram";
		bool on = i == 0 ? s->auto_converge : s->post_copy;
		struct json_object *c;

		if (i == 1 && !on)
			continue;
		c = json_object_new_object();
		json_object_object_add(c, "capability", json_object_new_string(name));
		json_object_object_add(c, "state", json_object_new_boolean(on));
		json_object_array_add(caps, c);
	}
	v = json_object_new_object();
	json_object_object_add(v, "capabilities", caps);
	r = qmp_call(q, "migrate-set-capabilities", v, deadline, NULL);
	if (r == -EIO) {
		/* q->err is "migrate-set-capabilities: DESC"; say what was asked for. */
		const char *desc = strchr(q->err, ':');
		char copy[QMP_ERR_MAX];

		snprintf(copy, sizeof(copy), "%s", desc ? desc + 2 : q->err);
		set_err(q, "%s: %s", tried, copy);
	}
	if (r < 0)
		goto out;

	params = json_object_new_object();
	/*
	 * Dormant: QEMU throttles only when a period dirties more than it sent (threshold 100 %),
	 * which a working set bounded by the pass cannot do, and then by 1 %. QEMU counts two
	 * such syncs before each step, so a dormant throttle that fired would also delay the real
	 * one: set_throttle() brings the threshold back to QEMU's 50 %.
	 */
	if (s->auto_converge) {
		/* Else QEMU's defaults, which an earlier dormant attempt may have changed. */
		bool d = s->throttle_dormant;

		json_object_object_add(params, "cpu-throttle-initial",
				       json_object_new_int64(d ? 1 : 20));
		json_object_object_add(params, "cpu-throttle-increment",
				       json_object_new_int64(d ? 1 : 10));
		json_object_object_add(params, "throttle-trigger-threshold",
				       json_object_new_int64(d ? 100 : 50));
	}
	if (s->max_downtime_ms)
		json_object_object_add(
			params, "downtime-limit",
			json_object_new_int64(s->max_downtime_ms > INT64_MAX
						      ? INT64_MAX
						      : (int64_t)s->max_downtime_ms));
	if (json_object_object_length(params) > 0)
		r = qmp_call(q, "migrate-set-parameters", params, deadline, NULL);
	else
		json_object_put(params);
out:
	if (r < 0)
		copy_err(err, errlen, q->err);
	pthread_mutex_unlock(&q->lock);
	return r;
}

static int qmp_query(struct cv_backend *b, struct cv_job *job)
{
	struct cv_qmp *q = to_qmp(b);
	struct json_object *mig = NULL, *st = NULL;
	uint64_t deadline;
	int r;

	pthread_mutex_lock(&q->lock);
	deadline = deadline_of(q);
	r = qmp_query_obj(q, "query-migrate", deadline, &mig);
	if (r == 0)
		r = qmp_query_obj(q, "query-status", deadline, &st);
	if (r == 0) {
		char err[QMP_ERR_MAX];

		r = job_from_json(mig, st, job, err, sizeof(err));
		if (r < 0)
			set_err(q, "query-migrate/query-status: %s", err);
	}
	json_object_put(mig);
	json_object_put(st);
	pthread_mutex_unlock(&q->lock);
	return r;
}

static int qmp_set_bandwidth(struct cv_backend *b, uint64_t bytes_per_s)
{
	if (bytes_per_s == 0 || bytes_per_s > QMP_MAX_BANDWIDTH)
		bytes_per_s = QMP_MAX_BANDWIDTH;
	return qmp_simple(b, "migrate-set-parameters",
			  params1("max-bandwidth", (int64_t)bytes_per_s));
}

static int qmp_set_downtime(struct cv_backend *b, uint64_t ms)
{
	/* QEMU says what its range is (0 to 2000 s); past INT64_MAX the text would be wrong. */
	return qmp_simple(b, "migrate-set-parameters",
			  params1("downtime-limit", ms > INT64_MAX ? INT64_MAX : (int64_t)ms));
}

static unsigned int clamp_pct(unsigned int pct)
{
	return pct < 1 ? 1 : pct > 99 ? 99 : pct;
}

static int qmp_set_throttle(struct cv_backend *b, unsigned int initial_pct, unsigned int step_pct)
{
	struct cv_qmp *q = to_qmp(b);
	struct json_object *a;
	uint64_t deadline;
	int r;

	pthread_mutex_lock(&q->lock);
	deadline = deadline_of(q);
	/* Without auto-converge the parameters are taken and do nothing: say so. */
	r = qmp_cap(q, "auto-converge", deadline);
	if (r == 0) {
		set_err(q, "auto-converge is off (it can only be enabled before the migration): "
			   "no throttle to set");
		r = -EOPNOTSUPP;
	}
	if (r > 0) {
		a = params1("cpu-throttle-initial", clamp_pct(initial_pct));
		if (a) {
			json_object_object_add(a, "cpu-throttle-increment",
					       json_object_new_int64(clamp_pct(step_pct)));
			json_object_object_add(a, "throttle-trigger-threshold",
					       json_object_new_int64(50));
		}
		r = qmp_call(q, "migrate-set-parameters", a, deadline, NULL);
	}
	pthread_mutex_unlock(&q->lock);
	return r;
}

static int qmp_start_postcopy(struct cv_backend *b)
{
	struct cv_qmp *q = to_qmp(b);
	int r;

	pthread_mutex_lock(&q->lock);
	{
		uint64_t deadline = deadline_of(q);

		r = check_postcopy_multifd(q, "migrate-start-postcopy", deadline);
		if (r == 0)
			r = qmp_call(q, "migrate-start-postcopy", NULL, deadline, NULL);
	}
	pthread_mutex_unlock(&q->lock);
	return r;
}

static int qmp_pause(struct cv_backend *b)
{
	return qmp_simple(b, "stop", NULL);
}

static int qmp_resume(struct cv_backend *b)
{
	return qmp_simple(b, "cont", NULL);
}

static int qmp_abort(struct cv_backend *b)
{
	struct cv_qmp *q = to_qmp(b);
	struct json_object *ret = NULL;
	uint64_t deadline;
	struct cv_job job;
	int r;

	pthread_mutex_lock(&q->lock);
	deadline = deadline_of(q);
	/* Once the destination runs the guest, the source no longer has it whole: no cancel. */
	r = qmp_query_obj(q, "query-migrate", deadline, &ret);
	if (r == 0) {
		char err[QMP_ERR_MAX];

		r = job_from_json(ret, NULL, &job, err, sizeof(err));
		if (r < 0)
			set_err(q, "query-migrate: %s", err);
		else if (job.status == CV_ST_POSTCOPY || job.status == CV_ST_POSTCOPY_PAUSED) {
			set_err(q,
				"the migration is in postcopy (%s): cancelling it would lose the "
				"guest",
				cv_status_str(job.status));
			r = -EBUSY;
		}
	}
	json_object_put(ret);
	if (r == 0)
		r = qmp_call(q, "migrate_cancel", NULL, deadline, NULL);
	pthread_mutex_unlock(&q->lock);
	return r;
}

static const char *qmp_error(struct cv_backend *b)
{
	return to_qmp(b)->err;
}

static void qmp_free(struct cv_backend *b)
{
	struct cv_qmp *q;

	if (!b)
		return;
	q = to_qmp(b);
	if (q->fd >= 0)
		close(q->fd);
	pthread_mutex_destroy(&q->lock);
	free(q->buf);
	free(q);
}

static const struct cv_backend_ops qmp_ops = {
	.name = "qmp",
	.prepare = qmp_prepare,
	.query = qmp_query,
	.set_bandwidth = qmp_set_bandwidth,
	.set_downtime = qmp_set_downtime,
	.set_throttle = qmp_set_throttle,
	.start_postcopy = qmp_start_postcopy,
	.pause = qmp_pause,
	.resume = qmp_resume,
	.abort = qmp_abort,
	.error = qmp_error,
	.free = qmp_free,
};

/* ------------------------------------------------------------------------------------------ */

static int qmp_connect(struct cv_qmp *q, uint64_t deadline)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	memcpy(sa.sun_path, q->path, sizeof(q->path));
	q->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (q->fd < 0)
		return -errno;
	/* A unix connect does not go on in the background: EAGAIN is a full backlog, try again. */
	while (connect(q->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN || vm_now_ms() >= deadline)
			return errno == EAGAIN ? -ETIMEDOUT : -errno;
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000000 }, NULL);
	}
	return 0;
}

static void read_version(struct cv_qmp *q, struct json_object *greeting)
{
	struct json_object *o = greeting, *v;
	static const char *const path[] = { "QMP", "version", "qemu" };

	for (size_t i = 0; i < ARRAY_SIZE(path); i++)
		if (!json_object_object_get_ex(o, path[i], &o))
			return;
	if (json_object_object_get_ex(o, "major", &v) && json_object_is_type(v, json_type_int))
		q->qemu_major = json_object_get_int(v);
	if (json_object_object_get_ex(o, "minor", &v) && json_object_is_type(v, json_type_int))
		q->qemu_minor = json_object_get_int(v);
	if (q->qemu_major < 0 || q->qemu_minor < 0)
		q->qemu_major = q->qemu_minor = -1;
}

int cv_qmp_open(const char *path, unsigned int timeout_ms, struct cv_backend **ret, char *err,
		size_t errlen)
{
	struct json_object *greeting, *v;
	struct cv_qmp *q;
	uint64_t deadline = vm_now_ms() + timeout_ms;
	char *line;
	int r;

	if (!path || strlen(path) >= sizeof(q->path)) {
		if (path)
			fmt_err(err, errlen,
				"QMP socket path too long for a unix socket (%zu bytes, "
				"at most %zu): %s",
				strlen(path), sizeof(q->path) - 1, path);
		else
			fmt_err(err, errlen, "no QMP socket path given");
		return -EINVAL;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		fmt_err(err, errlen, "out of memory");
		return -ENOMEM;
	}
	q->b.ops = &qmp_ops;
	q->timeout_ms = timeout_ms;
	q->qemu_major = q->qemu_minor = -1;
	q->run_event = -1;
	snprintf(q->path, sizeof(q->path), "%s", path);
	pthread_mutex_init(&q->lock, NULL);

	r = qmp_connect(q, deadline);
	if (r < 0) {
		fmt_err(err, errlen, "cannot connect to QMP socket %s: %s", path, strerror(-r));
		goto fail;
	}
	r = read_line(q, deadline, &line);
	if (r == -ETIMEDOUT) {
		/* QEMU serves one client per QMP socket and keeps the next waiting, greeting
		 * unsent. */
		fmt_err(err, errlen,
			"%s: no reply in %u ms (is another client connected? QEMU "
			"serves one per QMP socket)",
			path, timeout_ms);
		goto fail;
	}
	if (r == -ECONNRESET) {
		fmt_err(err, errlen, "%s: closed before its QMP greeting", path);
		goto fail;
	}
	if (r < 0) {
		fmt_err(err, errlen, "%s: not a QMP greeting (%s)", path,
			r == -EPROTO ? "a line over 1 MiB" : strerror(-r));
		goto fail;
	}
	greeting = parse_object(line, strlen(line));
	if (!greeting || !json_object_object_get_ex(greeting, "QMP", &v) ||
	    !json_object_is_type(v, json_type_object)) {
		json_object_put(greeting);
		fmt_err(err, errlen, "%s: not a QMP greeting: %.60s", path, line);
		r = -EPROTO;
		goto fail;
	}
	read_version(q, greeting);
	json_object_put(greeting);
	r = qmp_call(q, "qmp_capabilities", NULL, deadline, NULL);
	if (r < 0) {
		if (r == -ETIMEDOUT)
			fmt_err(err, errlen, "%s: no reply in %u ms", path, timeout_ms);
		else if (r == -EIO)
			fmt_err(err, errlen, "%s: %s", path, q->err);
		else
			copy_err(err, errlen, q->err);
		goto fail;
	}
	*ret = &q->b;
	return 0;
fail:
	qmp_free(&q->b);
	return r;
}
