/* SPDX-License-Identifier: Apache-2.0 */
/* What the convergence module asks of a hypervisor: one migration's job figures and the few
 * actions it takes. Backends: QMP (cv_qmp.c, its replies parsed by cv_qmp_json.c) and libvirt
 * (cv_virt.c, or cv_virt_stub.c). Calls block for at most the timeout given at open; they run on
 * a monitor thread, never the loop. */
#ifndef CV_BACKEND_H
#define CV_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cv_status {
	CV_ST_NONE,	     /* no migration yet (QEMU "none", libvirt no job) */
	CV_ST_SETUP,
	CV_ST_ACTIVE,	     /* pre-copy */
	CV_ST_SWITCHOVER,    /* "device", "pre-switchover": the guest is stopped for the last copy */
	CV_ST_POSTCOPY,	     /* "postcopy-active" */
	CV_ST_POSTCOPY_PAUSED, /* "postcopy-paused", "postcopy-recover": the guest is split */
	CV_ST_CANCELLING,
	CV_ST_COMPLETED,
	CV_ST_FAILED,
	CV_ST_CANCELLED,
};

/* One sample of the migration job. Unknown figures are 0 (times: -1). */
struct cv_job {
	enum cv_status status;
	int64_t elapsed_ms;	      /* since the migration started: total-time, time_elapsed */
	uint64_t total;		      /* RAM bytes: ram.total, memory_total */
	uint64_t remaining;	      /* ram.remaining, memory_remaining */
	uint64_t transferred;	      /* ram.transferred, memory_processed */
	uint64_t dirty_rate;	      /* bytes/s: dirty-pages-rate x page-size, 0 before two syncs */
	uint64_t dirty_syncs;	      /* ram.dirty-sync-count, memory_iteration */
	uint64_t rate;		      /* the hypervisor's own transfer rate, bytes/s (mbps, memory_bps) */
	int64_t expected_downtime_ms; /* -1: not given */
	int64_t downtime_ms;	      /* after completion; -1: not given */
	unsigned int throttle_pct;    /* cpu-throttle-percentage: 0 while not throttled */
	uint64_t postcopy_requests;
	bool guest_running;	      /* the source guest runs (query-status; domain state) */
	char error[256];	      /* why it failed, when the hypervisor says */
};

/* What the policy allows, set before the migration starts (capabilities cannot change later). */
struct cv_setup {
	bool auto_converge; /* enable auto-converge, dormant until set_throttle() */
	bool post_copy;	    /* enable postcopy-ram (QEMU 7.2: not with multifd) */
	bool throttle_dormant; /* auto-converge waits for set_throttle() (QEMU: trigger threshold
				* 100 %, 1 % + 1 %); false: the hypervisor's defaults (20 % + 10 %) */
	uint64_t max_downtime_ms; /* 0: leave the hypervisor's */
};

struct cv_backend;

struct cv_backend_ops {
	const char *name; /* "qmp", "libvirt" */
	/*
	 * Before QEMU's migrate. QMP: capabilities events, auto-converge and postcopy-ram as
	 * allowed, with throttling dormant (cpu-throttle-initial 1, increment 1) and the downtime
	 * limit. libvirt: capabilities are migrate flags that its caller sets; it checks the domain.
	 * -errno with one line in err.
	 */
	int (*prepare)(struct cv_backend *b, const struct cv_setup *s, char *err, size_t errlen);
	int (*query)(struct cv_backend *b, struct cv_job *job);
	/* The hypervisor's own bandwidth limit, bytes/s; 0 lifts it. */
	int (*set_bandwidth)(struct cv_backend *b, uint64_t bytes_per_s);
	int (*set_downtime)(struct cv_backend *b, uint64_t ms);
	/* Make auto-converge bite: the throttle QEMU starts at and adds at each sync that dirties
	 * more than half of what it sent. -EOPNOTSUPP where the backend cannot. */
	int (*set_throttle)(struct cv_backend *b, unsigned int initial_pct, unsigned int step_pct);
	int (*start_postcopy)(struct cv_backend *b);
	int (*pause)(struct cv_backend *b);  /* stop the source guest; the migration goes on */
	int (*resume)(struct cv_backend *b); /* run the source guest again */
	int (*abort)(struct cv_backend *b);  /* cancel the migration; the source guest stays */
	/* The last failure, one line, for logs and status. */
	const char *(*error)(struct cv_backend *b);
	void (*free)(struct cv_backend *b);
};

/* Each backend's struct starts with this. */
struct cv_backend {
	const struct cv_backend_ops *ops;
};

/*
 * QMP: connects to a QMP unix socket of the source QEMU (one of its own; QEMU takes several) and
 * negotiates capabilities. timeout_ms bounds every call. -errno with one line in err.
 */
int cv_qmp_open(const char *path, unsigned int timeout_ms, struct cv_backend **ret, char *err,
		size_t errlen);
/* The parser behind query(), for tests and the fuzzer: QEMU's whole reply lines to
 * query-migrate and query-status ({"return": ...}; either may be NULL). -EPROTO on anything
 * malformed. */
int cv_qmp_parse_job(const char *migrate_reply, const char *status_reply, struct cv_job *job);
/* libvirt: the domain by name or UUID on uri (NULL: qemu:///system). -ENOTSUP in a build
 * without libvirt. */
int cv_virt_open(const char *uri, const char *domain, unsigned int timeout_ms,
		 struct cv_backend **ret, char *err, size_t errlen);
bool cv_virt_available(void);

const char *cv_status_str(enum cv_status s);

struct json_object;
/* The job as a new JSON object (json-c), for status and the tools; NULL only on ENOMEM. */
struct json_object *cv_job_json(const struct cv_job *j);

#endif
