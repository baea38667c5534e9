// SPDX-License-Identifier: Apache-2.0
/* What the backends share: the names of migration states, and a job as JSON. */
#include <json-c/json.h>

#include "cv_backend.h"

const char *cv_status_str(enum cv_status s)
{
	static const char *const names[] = {
		[CV_ST_NONE] = "none",
		[CV_ST_SETUP] = "setup",
		[CV_ST_ACTIVE] = "active",
		[CV_ST_SWITCHOVER] = "switchover",
		[CV_ST_POSTCOPY] = "postcopy-active",
		[CV_ST_POSTCOPY_PAUSED] = "postcopy-paused",
		[CV_ST_CANCELLING] = "cancelling",
		[CV_ST_COMPLETED] = "completed",
		[CV_ST_FAILED] = "failed",
		[CV_ST_CANCELLED] = "cancelled",
	};

	return (unsigned int)s < sizeof(names) / sizeof(names[0]) && names[s] ? names[s] : "unknown";
}

/* Every field, as status, metrics and the test tools show it; "error" only when set. */
struct json_object *cv_job_json(const struct cv_job *j)
{
	struct json_object *o = json_object_new_object();

	json_object_object_add(o, "status", json_object_new_string(cv_status_str(j->status)));
	json_object_object_add(o, "elapsed_ms", json_object_new_int64(j->elapsed_ms));
	json_object_object_add(o, "total", json_object_new_uint64(j->total));
	json_object_object_add(o, "remaining", json_object_new_uint64(j->remaining));
	json_object_object_add(o, "transferred", json_object_new_uint64(j->transferred));
	json_object_object_add(o, "dirty_rate", json_object_new_uint64(j->dirty_rate));
	json_object_object_add(o, "dirty_syncs", json_object_new_uint64(j->dirty_syncs));
	json_object_object_add(o, "rate", json_object_new_uint64(j->rate));
	json_object_object_add(o, "expected_downtime_ms",
			       json_object_new_int64(j->expected_downtime_ms));
	json_object_object_add(o, "downtime_ms", json_object_new_int64(j->downtime_ms));
	json_object_object_add(o, "throttle_pct", json_object_new_int(j->throttle_pct));
	json_object_object_add(o, "postcopy_requests", json_object_new_uint64(j->postcopy_requests));
	json_object_object_add(o, "guest_running", json_object_new_boolean(j->guest_running));
	if (j->error[0])
		json_object_object_add(o, "error", json_object_new_string(j->error));
	return o;
}
