// SPDX-License-Identifier: Apache-2.0
/* The convergence module's QMP backend: a blocking client of one of the source QEMU's own QMP
 * sockets, one command in flight, every call bounded by a poll() deadline. It runs on the
 * monitor thread, never on the event loop, and knows nothing of policy: it reports and acts.
 * What the replies say is read by cv_qmp_json.c. */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cv_backend.h"
#include "cv_qmp_priv.h"
#include "util.h"
#include "xp_path.h"
#include "xp_sock.h"

/* Room the line buffer keeps for one recv(2); it grows to QMP_LINE_MAX and this much more. */
#define QMP_READ_CHUNK (64u << 10)
/* QEMU's largest max-bandwidth; what "unlimited" is in QMP. */
#define QMP_MAX_BANDWIDTH 2251799813685247ull

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

#define set_err(q, ...) cv_qmp_fmt_err((q)->err, sizeof((q)->err), __VA_ARGS__)

static void copy_err(char *err, size_t errlen, const char *text)
{
	if (err && errlen)
		snprintf(err, errlen, "%s", text);
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
		cv_qmp_one_line(q->mig_event);
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
		reply = cv_qmp_parse_object(l, strlen(l));
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

static bool status_in_flight(enum cv_status s)
{
	return s != CV_ST_NONE && s != CV_ST_COMPLETED && s != CV_ST_FAILED && s != CV_ST_CANCELLED;
}

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
	r = cv_qmp_job_from_json(ret, NULL, &job, q->err, sizeof(q->err));
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

		r = cv_qmp_job_from_json(mig, st, job, err, sizeof(err));
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
			/*
			 * Near the tail QEMU then steps by less than step_pct, to the throttle
			 * that brings the dirty rate to the threshold (QEMU 5.1+): no more
			 * guest slowdown than converging needs.
			 */
			json_object_object_add(a, "cpu-throttle-tailslow",
					       json_object_new_boolean(true));
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

		r = cv_qmp_job_from_json(ret, NULL, &job, err, sizeof(err));
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

/* The QMP socket is in the launcher's directories, which QEMU's user writes: reached without
 * following a link (xp_path.h), owned by whoever QEMU runs as. */
static int qmp_connect(struct cv_qmp *q, uint64_t deadline)
{
	uint64_t now = vm_now_ms();

	q->fd = -1;
	return xp_unix_connect_checked(q->path, XP_ANY_OWNER,
				       deadline > now ? (unsigned int)(deadline - now) : 1, &q->fd);
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
			cv_qmp_fmt_err(err, errlen,
				       "QMP socket path too long for a unix socket (%zu bytes, "
				       "at most %zu): %s",
				       strlen(path), sizeof(q->path) - 1, path);
		else
			cv_qmp_fmt_err(err, errlen, "no QMP socket path given");
		return -EINVAL;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		cv_qmp_fmt_err(err, errlen, "out of memory");
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
		cv_qmp_fmt_err(err, errlen, "cannot connect to QMP socket %s: %s", path,
			       xp_path_strerror(r));
		goto fail;
	}
	r = read_line(q, deadline, &line);
	if (r == -ETIMEDOUT) {
		/* QEMU serves one client per QMP socket and keeps the next waiting, greeting
		 * unsent. */
		cv_qmp_fmt_err(err, errlen,
			       "%s: no reply in %u ms (is another client connected? QEMU "
			       "serves one per QMP socket)",
			       path, timeout_ms);
		goto fail;
	}
	if (r == -ECONNRESET) {
		cv_qmp_fmt_err(err, errlen, "%s: closed before its QMP greeting", path);
		goto fail;
	}
	if (r < 0) {
		cv_qmp_fmt_err(err, errlen, "%s: not a QMP greeting (%s)", path,
			       r == -EPROTO ? "a line over 1 MiB" : strerror(-r));
		goto fail;
	}
	greeting = cv_qmp_parse_object(line, strlen(line));
	if (!greeting || !json_object_object_get_ex(greeting, "QMP", &v) ||
	    !json_object_is_type(v, json_type_object)) {
		json_object_put(greeting);
		cv_qmp_fmt_err(err, errlen, "%s: not a QMP greeting: %.60s", path, line);
		r = -EPROTO;
		goto fail;
	}
	read_version(q, greeting);
	json_object_put(greeting);
	r = qmp_call(q, "qmp_capabilities", NULL, deadline, NULL);
	if (r < 0) {
		if (r == -ETIMEDOUT)
			cv_qmp_fmt_err(err, errlen, "%s: no reply in %u ms", path, timeout_ms);
		else if (r == -EIO)
			cv_qmp_fmt_err(err, errlen, "%s: %s", path, q->err);
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
