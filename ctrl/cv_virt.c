// SPDX-License-Identifier: Apache-2.0
/* The convergence module's libvirt backend: one domain's migration job figures from
 * virDomainGetJobStats and the actions KubeVirt's monitor takes (bandwidth, downtime, post-copy,
 * suspend, abort). Not a migration starter: the caller's virDomainMigrate* call owns the job. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include "cv_virt.h"

#define DEFAULT_URI "qemu:///system"
/* libvirt's own "unlimited" (QEMU_DOMAIN_MIG_BANDWIDTH_MAX, src/qemu/qemu_domain.h): what a
 * domain has until someone sets a speed; larger values are refused. */
#define BANDWIDTH_MAX_MIB ((unsigned long)(INT64_MAX / (1024 * 1024)))
#define MIB		  (1024ull * 1024)
/* QEMU's target page on x86, for a libvirt that reports a dirty rate without the page size. */
#define PAGE_SIZE_DEFAULT 4096

struct cv_virt {
	struct cv_backend base;
	virConnectPtr conn;
	virDomainPtr dom;
	char *uri;
	char *domain;
	/* prepare()'s downtime limit, applied again at the first query that sees the job: libvirt
	 * may refuse it before a migration job exists. 0: nothing pending. */
	uint64_t pending_downtime_ms;
	/* What this backend saw of the current job, for its end: libvirt 9.0 keeps no statistics
	 * of a cancelled migration, so a job that was active and is now simply gone (with the
	 * domain still running) ended without success. */
	enum { JOB_UNSEEN, JOB_ACTIVE, JOB_GONE } job;
	bool aborted; /* abort() succeeded on the current job */
	char err[512];
};

/* ---- the pure part: job statistics to a cv_job ---- */

static const virTypedParameter *param_find(const virTypedParameter *params, int n, const char *name)
{
	for (int i = 0; i < n; i++) {
		if (!strcmp(params[i].field, name))
			return &params[i];
	}
	return NULL;
}

/* libvirt documents most job fields as ULLONG but a few as INT; take any numeric type. Negative
 * and non-numeric values count as absent. */
static bool param_u64(const virTypedParameter *params, int n, const char *name, uint64_t *v)
{
	const virTypedParameter *p = param_find(params, n, name);

	if (!p)
		return false;
	switch (p->type) {
	case VIR_TYPED_PARAM_INT:
		if (p->value.i < 0)
			return false;
		*v = (uint64_t)p->value.i;
		return true;
	case VIR_TYPED_PARAM_UINT:
		*v = p->value.ui;
		return true;
	case VIR_TYPED_PARAM_LLONG:
		if (p->value.l < 0)
			return false;
		*v = (uint64_t)p->value.l;
		return true;
	case VIR_TYPED_PARAM_ULLONG:
		*v = p->value.ul;
		return true;
	case VIR_TYPED_PARAM_DOUBLE:
		if (!(p->value.d >= 0) || p->value.d >= 18446744073709551615.0)
			return false;
		*v = (uint64_t)p->value.d;
		return true;
	default:
		return false;
	}
}

static bool param_u64_either(const virTypedParameter *params, int n, const char *name,
			     const char *fallback, uint64_t *v)
{
	return param_u64(params, n, name, v) || param_u64(params, n, fallback, v);
}

static int64_t as_ms(uint64_t v)
{
	return v > INT64_MAX ? INT64_MAX : (int64_t)v;
}

int cv_virt_parse_job(int type, const virTypedParameter *params, int nparams, int state, int reason,
		      struct cv_job *job)
{
	struct cv_job j = { 0 };
	const virTypedParameter *p;
	bool finished = false;
	uint64_t v, pages;

	if (!params)
		nparams = 0;
	switch (type) {
	case VIR_DOMAIN_JOB_NONE:
		j.status = CV_ST_NONE;
		break;
	case VIR_DOMAIN_JOB_BOUNDED:
	case VIR_DOMAIN_JOB_UNBOUNDED:
		j.status = CV_ST_ACTIVE;
		break;
	case VIR_DOMAIN_JOB_COMPLETED:
		j.status = CV_ST_COMPLETED;
		finished = true;
		break;
	case VIR_DOMAIN_JOB_FAILED:
		j.status = CV_ST_FAILED;
		finished = true;
		break;
	case VIR_DOMAIN_JOB_CANCELLED:
		j.status = CV_ST_CANCELLED;
		finished = true;
		break;
	default:
		return -EPROTO;
	}
	j.elapsed_ms = -1;
	j.expected_downtime_ms = -1;
	j.downtime_ms = -1;

	if (param_u64(params, nparams, VIR_DOMAIN_JOB_TIME_ELAPSED, &v))
		j.elapsed_ms = as_ms(v);
	/* memory_* is the RAM part; data_* adds disks (NBD) and is all an older or non-QEMU
	 * driver may give. */
	if (param_u64_either(params, nparams, VIR_DOMAIN_JOB_MEMORY_TOTAL,
			     VIR_DOMAIN_JOB_DATA_TOTAL, &v))
		j.total = v;
	if (param_u64_either(params, nparams, VIR_DOMAIN_JOB_MEMORY_REMAINING,
			     VIR_DOMAIN_JOB_DATA_REMAINING, &v))
		j.remaining = v;
	if (param_u64_either(params, nparams, VIR_DOMAIN_JOB_MEMORY_PROCESSED,
			     VIR_DOMAIN_JOB_DATA_PROCESSED, &v))
		j.transferred = v;
	if (param_u64(params, nparams, VIR_DOMAIN_JOB_MEMORY_DIRTY_RATE, &pages)) {
		if (!param_u64(params, nparams, VIR_DOMAIN_JOB_MEMORY_PAGE_SIZE, &v) || !v)
			v = PAGE_SIZE_DEFAULT;
		j.dirty_rate = pages > UINT64_MAX / v ? UINT64_MAX : pages * v;
	}
	if (param_u64(params, nparams, VIR_DOMAIN_JOB_MEMORY_ITERATION, &v))
		j.dirty_syncs = v;
	if (param_u64(params, nparams, VIR_DOMAIN_JOB_MEMORY_BPS, &v))
		j.rate = v;
	/* "downtime" is QEMU's expected downtime while the job runs and the measured one once it
	 * completed; a failed or cancelled job had none. */
	if (param_u64(params, nparams, VIR_DOMAIN_JOB_DOWNTIME, &v)) {
		if (type == VIR_DOMAIN_JOB_COMPLETED)
			j.downtime_ms = as_ms(v);
		else if (!finished)
			j.expected_downtime_ms = as_ms(v);
	}
	if (param_u64(params, nparams, VIR_DOMAIN_JOB_AUTO_CONVERGE_THROTTLE, &v))
		j.throttle_pct = v > 100 ? 100 : (unsigned int)v;
	if (param_u64(params, nparams, VIR_DOMAIN_JOB_MEMORY_POSTCOPY_REQS, &v))
		j.postcopy_requests = v;
	p = param_find(params, nparams, VIR_DOMAIN_JOB_SUCCESS);
	if (type == VIR_DOMAIN_JOB_COMPLETED && p && p->type == VIR_TYPED_PARAM_BOOLEAN &&
	    !p->value.b)
		j.status = CV_ST_FAILED;
	p = param_find(params, nparams, VIR_DOMAIN_JOB_ERRMSG);
	if (p && p->type == VIR_TYPED_PARAM_STRING && p->value.s)
		snprintf(j.error, sizeof(j.error), "%s", p->value.s);

	/*
	 * libvirt's job types say nothing of QEMU's phases; the domain state and a few figures
	 * tell some. Never SWITCHOVER: libvirt gives the reason PAUSED_MIGRATION both to QEMU's
	 * stop for the last copy and to a virDomainSuspend during a migration (KubeVirt's "Paused"
	 * mode), so a stopped guest in pre-copy is ACTIVE with guest_running false.
	 */
	if (j.status == CV_ST_ACTIVE) {
		if (state == VIR_DOMAIN_RUNNING && reason == VIR_DOMAIN_RUNNING_POSTCOPY)
			j.status = CV_ST_POSTCOPY;
		else if (state == VIR_DOMAIN_PAUSED && reason == VIR_DOMAIN_PAUSED_POSTCOPY)
			j.status = CV_ST_POSTCOPY;
		/* libvirt gives zero memory figures while QEMU sets up (or copies disks). */
		else if (!j.total)
			j.status = CV_ST_SETUP;
	}
	/* Post-copy failed: the guest's memory is split between the hosts, whatever the job. */
	if ((state == VIR_DOMAIN_PAUSED && reason == VIR_DOMAIN_PAUSED_POSTCOPY_FAILED) ||
	    (state == VIR_DOMAIN_RUNNING && reason == VIR_DOMAIN_RUNNING_POSTCOPY_FAILED))
		j.status = CV_ST_POSTCOPY_PAUSED;
	/* The finished job's statistics were taken by someone else, but the domain says where it
	 * went. */
	if (j.status == CV_ST_NONE && state == VIR_DOMAIN_SHUTOFF &&
	    reason == VIR_DOMAIN_SHUTOFF_MIGRATED)
		j.status = CV_ST_COMPLETED;
	j.guest_running = state == VIR_DOMAIN_RUNNING;
	*job = j;
	return 0;
}

/* ---- process-wide libvirt set-up ---- */

static void error_silent(void *opaque, virErrorPtr e)
{
	/* libvirt's default handler prints every error to stderr; ours come back as err strings. */
}

static void *event_loop(void *arg)
{
	for (;;) {
		if (virEventRunDefaultImpl() < 0)
			break;
	}
	return NULL;
}

static int init_err;

/*
 * Once per process, before the first connection: libvirt's thread set-up, the silent error
 * handler, and its default event loop on a thread of its own, which keepalive needs (without one
 * a dead libvirtd is noticed only by the kernel's TCP timeouts). libvirt cannot unregister an
 * event loop, so the thread lives as long as the process; it blocks all signals, leaving them to
 * the daemon's own handling.
 */
static void init_once(void)
{
	sigset_t all, old;
	pthread_t tid;
	int r;

	if (virInitialize() < 0) {
		init_err = -EIO;
		return;
	}
	virSetErrorFunc(NULL, error_silent);
	if (virEventRegisterDefaultImpl() < 0) {
		init_err = -EIO;
		return;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = pthread_create(&tid, NULL, event_loop, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r) {
		init_err = -r;
		return;
	}
	pthread_detach(tid);
}

static int init(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, init_once);
	return init_err;
}

bool cv_virt_available(void)
{
	return true;
}

/* ---- errors ---- */

/* libvirt's last error (thread-local) as an errno. */
static int last_errno(void)
{
	virErrorPtr e = virGetLastError();

	/* A failed system call (connect, read) carries its errno. */
	if (e && e->code == VIR_ERR_SYSTEM_ERROR && e->int1 > 0)
		return -e->int1;
	switch (e ? e->code : VIR_ERR_OK) {
	case VIR_ERR_OK:
		return -EIO;
	case VIR_ERR_NO_MEMORY:
		return -ENOMEM;
	case VIR_ERR_NO_DOMAIN:
		return -ENOENT;
	case VIR_ERR_NO_SUPPORT:
	case VIR_ERR_OPERATION_UNSUPPORTED:
	case VIR_ERR_ARGUMENT_UNSUPPORTED:
		return -EOPNOTSUPP;
	case VIR_ERR_INVALID_ARG:
		return -EINVAL;
	case VIR_ERR_OPERATION_INVALID: /* domain not running, no job, post-copy cannot abort */
		return -EINVAL;
	case VIR_ERR_OPERATION_TIMEOUT: /* libvirtd's job lock, about 30 s */
	case VIR_ERR_AGENT_UNRESPONSIVE:
		return -ETIMEDOUT;
	case VIR_ERR_AUTH_FAILED:
	case VIR_ERR_AUTH_CANCELLED:
	case VIR_ERR_AUTH_UNAVAILABLE:
	case VIR_ERR_ACCESS_DENIED:
	case VIR_ERR_OPERATION_DENIED:
		return -EACCES;
	case VIR_ERR_RPC:
	case VIR_ERR_SYSTEM_ERROR: /* a socket that failed or closed: keepalive ends here */
	case VIR_ERR_NO_CONNECT:
		return -ECONNRESET;
	default:
		return -EIO;
	}
}

static const char *last_message(void)
{
	const char *m = virGetLastErrorMessage();

	return m && *m ? m : "unknown libvirt error";
}

static void seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* Records a failed call on the domain; returns its -errno. */
static int fail(struct cv_virt *v, const char *call)
{
	int r = last_errno();

	seterr(v->err, sizeof(v->err), "libvirt %s on domain %s (%s): %s", call, v->domain, v->uri,
	       last_message());
	virResetLastError();
	return r;
}

static struct cv_virt *virt(struct cv_backend *b)
{
	return (struct cv_virt *)b;
}

/* ---- the operations ---- */

/* Where libvirt refuses a downtime limit without a migration job. */
static bool no_job_error(void)
{
	return virGetLastErrorCode() == VIR_ERR_OPERATION_INVALID;
}

/*
 * Capabilities (auto-converge, post-copy) are flags of the migrate call its caller makes
 * (VIR_MIGRATE_AUTO_CONVERGE, VIR_MIGRATE_POSTCOPY: KubeVirt sets them from its policy), so this
 * cannot enable them; nor can it keep auto-converge dormant (see set_throttle). It checks that
 * the domain runs and sets the downtime limit. libvirt 9.0 takes that limit without a job too
 * (older ones refused it outside a migration), but a migration's start may reset QEMU's
 * parameters: so the limit is also applied again at the first query that sees the job.
 */
static int virt_prepare(struct cv_backend *b, const struct cv_setup *s, char *err, size_t errlen)
{
	struct cv_virt *v = virt(b);
	int r;

	r = virDomainIsActive(v->dom);
	if (r < 0) {
		r = fail(v, "virDomainIsActive");
		seterr(err, errlen, "%s", v->err);
		return r;
	}
	if (!r) {
		seterr(v->err, sizeof(v->err), "libvirt domain %s (%s) is not running", v->domain,
		       v->uri);
		seterr(err, errlen, "%s", v->err);
		return -EINVAL;
	}
	v->job = JOB_UNSEEN;
	v->aborted = false;
	v->pending_downtime_ms = s ? s->max_downtime_ms : 0;
	if (v->pending_downtime_ms &&
	    virDomainMigrateSetMaxDowntime(v->dom, v->pending_downtime_ms, 0) < 0) {
		if (!no_job_error()) {
			r = fail(v, "virDomainMigrateSetMaxDowntime");
			seterr(err, errlen, "%s", v->err);
			return r;
		}
		virResetLastError();
	}
	return 0;
}

static int virt_query(struct cv_backend *b, struct cv_job *job)
{
	struct cv_virt *v = virt(b);
	virTypedParameterPtr params = NULL;
	int nparams = 0, type, state, reason, r;

	if (virDomainGetJobStats(v->dom, &type, &params, &nparams, 0) < 0) {
		/* "domain is not running": a shut-off domain has no current job, but may keep the
		 * statistics of the migration that shut it off. */
		if (virGetLastErrorCode() != VIR_ERR_OPERATION_INVALID)
			return fail(v, "virDomainGetJobStats");
		virResetLastError();
		type = VIR_DOMAIN_JOB_NONE;
		params = NULL;
		nparams = 0;
	}
	/*
	 * No job: maybe one just ended. Its statistics are kept (KEEP_COMPLETED) so that every
	 * later query sees the same end, as QEMU's query-migrate shows the last migration's until
	 * the next one starts; a monitor that starts before the migration must treat an end it
	 * saw before any active sample as a previous job's.
	 */
	if (type == VIR_DOMAIN_JOB_NONE) {
		virTypedParamsFree(params, nparams);
		params = NULL;
		nparams = 0;
		if (virDomainGetJobStats(v->dom, &type, &params, &nparams,
					 VIR_DOMAIN_JOB_STATS_COMPLETED |
						 VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED) < 0)
			return fail(v, "virDomainGetJobStats(completed)");
	}
	if (virDomainGetState(v->dom, &state, &reason, 0) < 0) {
		r = fail(v, "virDomainGetState");
		goto out_params;
	}
	r = cv_virt_parse_job(type, params, nparams, state, reason, job);
	if (r < 0) {
		seterr(v->err, sizeof(v->err), "libvirt domain %s (%s): unknown job type %d",
		       v->domain, v->uri, type);
		goto out_params;
	}
	if (type == VIR_DOMAIN_JOB_BOUNDED || type == VIR_DOMAIN_JOB_UNBOUNDED) {
		if (v->job != JOB_ACTIVE)
			v->aborted = false;
		v->job = JOB_ACTIVE;
	} else if (type != VIR_DOMAIN_JOB_NONE) {
		v->job = JOB_UNSEEN; /* libvirt said how it ended */
	} else if (v->job != JOB_UNSEEN && job->status == CV_ST_NONE) {
		v->job = JOB_GONE;
		job->status = v->aborted ? CV_ST_CANCELLED : CV_ST_FAILED;
		if (!v->aborted)
			snprintf(job->error, sizeof(job->error),
				 "the libvirt job ended and left no statistics: it failed, or "
				 "another client cancelled it");
	}
	if (v->pending_downtime_ms &&
	    (type == VIR_DOMAIN_JOB_BOUNDED || type == VIR_DOMAIN_JOB_UNBOUNDED)) {
		/* A failure here is left in err for the log; the sample is still good. */
		if (virDomainMigrateSetMaxDowntime(v->dom, v->pending_downtime_ms, 0) < 0)
			fail(v, "virDomainMigrateSetMaxDowntime");
		v->pending_downtime_ms = 0;
	}
out_params:
	virTypedParamsFree(params, nparams);
	return r;
}

/*
 * libvirt takes MiB/s: rounded up so that a limit never ends below what was asked (and 1 byte/s
 * is 1 MiB/s). 0, and anything above libvirt's maximum, is its own "unlimited". The pre-copy
 * limit only: post-copy has its own (VIR_DOMAIN_MIGRATE_MAX_SPEED_POSTCOPY), unlimited unless
 * the migrate call set it.
 */
static int virt_set_bandwidth(struct cv_backend *b, uint64_t bytes_per_s)
{
	struct cv_virt *v = virt(b);
	uint64_t mib = bytes_per_s / MIB + (bytes_per_s % MIB != 0);

	if (!mib || mib > BANDWIDTH_MAX_MIB)
		mib = BANDWIDTH_MAX_MIB;
	if (virDomainMigrateSetMaxSpeed(v->dom, (unsigned long)mib, 0) < 0)
		return fail(v, "virDomainMigrateSetMaxSpeed");
	return 0;
}

static int virt_set_downtime(struct cv_backend *b, uint64_t ms)
{
	struct cv_virt *v = virt(b);

	if (virDomainMigrateSetMaxDowntime(v->dom, ms, 0) < 0)
		return fail(v, "virDomainMigrateSetMaxDowntime");
	v->pending_downtime_ms = 0;
	return 0;
}

/*
 * libvirt 9.0 has no call for cpu-throttle-initial/-increment: they are migrate parameters
 * (VIR_MIGRATE_PARAM_AUTO_CONVERGE_INITIAL/_INCREMENT) fixed when the migration starts, and
 * there is no virDomainSetJobParameters. virDomainQemuMonitorCommand could send QMP's
 * migrate-set-parameters, but it taints the domain and goes behind libvirt's back.
 */
static int virt_set_throttle(struct cv_backend *b, unsigned int initial_pct, unsigned int step_pct)
{
	struct cv_virt *v = virt(b);

	seterr(v->err, sizeof(v->err),
	       "libvirt has no call to change auto-converge throttling during a migration");
	return -EOPNOTSUPP;
}

static int virt_start_postcopy(struct cv_backend *b)
{
	struct cv_virt *v = virt(b);

	if (virDomainMigrateStartPostCopy(v->dom, 0) < 0)
		return fail(v, "virDomainMigrateStartPostCopy");
	return 0;
}

/*
 * libvirt records a suspend during an outgoing migration as its own (PAUSED_MIGRATION, as for
 * the switchover): a cancelled migration resumes the guest, a completed one starts it on the
 * destination. The downtime it then reports counts from this pause.
 */
static int virt_pause(struct cv_backend *b)
{
	struct cv_virt *v = virt(b);

	if (virDomainSuspend(v->dom) < 0)
		return fail(v, "virDomainSuspend");
	return 0;
}

/*
 * libvirt 9.0 lets an outgoing migration's job admit a suspend but not a resume: virDomainResume
 * would wait for the migration to end (or for libvirtd's job-lock timeout, about 30 s). So
 * while a job runs this refuses at once; aborting the migration resumes a guest it found running.
 */
static int virt_resume(struct cv_backend *b)
{
	struct cv_virt *v = virt(b);
	virDomainJobInfo info;

	if (virDomainGetJobInfo(v->dom, &info) < 0)
		return fail(v, "virDomainGetJobInfo");
	if (info.type == VIR_DOMAIN_JOB_BOUNDED || info.type == VIR_DOMAIN_JOB_UNBOUNDED) {
		seterr(v->err, sizeof(v->err),
		       "libvirt cannot resume domain %s (%s) while its migration job runs",
		       v->domain, v->uri);
		return -EBUSY;
	}
	if (virDomainResume(v->dom) < 0)
		return fail(v, "virDomainResume");
	return 0;
}

/* libvirt refuses once post-copy started (the destination owns the guest then). */
static int virt_abort(struct cv_backend *b)
{
	struct cv_virt *v = virt(b);

	if (virDomainAbortJob(v->dom) < 0)
		return fail(v, "virDomainAbortJob");
	v->aborted = true;
	return 0;
}

static const char *virt_error(struct cv_backend *b)
{
	return virt(b)->err;
}

static void virt_free(struct cv_backend *b)
{
	struct cv_virt *v = virt(b);

	if (!v)
		return;
	if (v->dom)
		virDomainFree(v->dom);
	if (v->conn)
		virConnectClose(v->conn);
	free(v->uri);
	free(v->domain);
	free(v);
}

static const struct cv_backend_ops virt_ops = {
	.name = "libvirt",
	.prepare = virt_prepare,
	.query = virt_query,
	.set_bandwidth = virt_set_bandwidth,
	.set_downtime = virt_set_downtime,
	.set_throttle = virt_set_throttle,
	.start_postcopy = virt_start_postcopy,
	.pause = virt_pause,
	.resume = virt_resume,
	.abort = virt_abort,
	.error = virt_error,
	.free = virt_free,
};

/* 8-4-4-4-12 hex digits, or 32 without dashes, as virDomainLookupByUUIDString takes. */
static bool looks_like_uuid(const char *s)
{
	size_t hex = 0;

	for (; *s; s++) {
		if ((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') ||
		    (*s >= 'A' && *s <= 'F'))
			hex++;
		else if (*s != '-')
			return false;
	}
	return hex == 32;
}

/*
 * timeout_ms cannot bound a libvirt call: the API has no per-call timeout. It sets the
 * keepalive instead (a ping every timeout_ms/4, at most every 5 s; the connection is dropped
 * after 3 unanswered, about timeout_ms, at most 20 s), which ends calls stuck on a dead or
 * unreachable libvirtd with an error. Calls that a live libvirtd holds up end by its own limits
 * (about 30 s waiting for a domain's job lock); connecting to an unreachable TCP host waits for
 * the kernel's connect timeout.
 */
int cv_virt_open(const char *uri, const char *domain, unsigned int timeout_ms,
		 struct cv_backend **ret, char *err, size_t errlen)
{
	struct cv_virt *v;
	int interval, r;

	if (!domain || !*domain || !ret) {
		seterr(err, errlen, "libvirt: no domain given");
		return -EINVAL;
	}
	if (!uri || !*uri)
		uri = DEFAULT_URI;
	r = init();
	if (r < 0) {
		seterr(err, errlen, "libvirt: initialisation failed: %s", strerror(-r));
		return r;
	}
	v = calloc(1, sizeof(*v));
	if (!v) {
		seterr(err, errlen, "libvirt: out of memory");
		return -ENOMEM;
	}
	v->base.ops = &virt_ops;
	v->uri = strdup(uri);
	v->domain = strdup(domain);
	if (!v->uri || !v->domain) {
		seterr(err, errlen, "libvirt: out of memory");
		r = -ENOMEM;
		goto out_free;
	}

	v->conn = virConnectOpen(uri);
	if (!v->conn) {
		r = last_errno();
		seterr(err, errlen, "libvirt: cannot connect to %s: %s", uri, last_message());
		virResetLastError();
		goto out_free;
	}
	virConnSetErrorFunc(v->conn, NULL, error_silent);
	interval = timeout_ms ? (int)(timeout_ms / 4000) : 5;
	interval = interval < 1 ? 1 : interval > 5 ? 5 : interval;
	/* 1: the far end (a local driver, test:///) has no keepalive, which is fine. */
	if (virConnectSetKeepAlive(v->conn, interval, 3) < 0) {
		r = last_errno();
		seterr(err, errlen, "libvirt: keepalive on %s: %s", uri, last_message());
		virResetLastError();
		goto out_free;
	}

	v->dom = virDomainLookupByName(v->conn, domain);
	if (!v->dom && virGetLastErrorCode() == VIR_ERR_NO_DOMAIN && looks_like_uuid(domain)) {
		virResetLastError();
		v->dom = virDomainLookupByUUIDString(v->conn, domain);
	}
	if (!v->dom) {
		r = last_errno();
		if (r == -ENOENT)
			seterr(err, errlen, "libvirt: no domain %s on %s (by name or UUID): %s",
			       domain, uri, last_message());
		else
			seterr(err, errlen, "libvirt: looking up domain %s on %s: %s", domain, uri,
			       last_message());
		virResetLastError();
		goto out_free;
	}
	*ret = &v->base;
	return 0;

out_free:
	virt_free(&v->base);
	return r;
}
