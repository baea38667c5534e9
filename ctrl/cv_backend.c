// SPDX-License-Identifier: Apache-2.0
/* What the backends share: the names of migration states. */
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
