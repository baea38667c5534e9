// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for the QMP backend's job parser: bytes -> two reply texts (query-migrate up to
 * the first newline, query-status after it; no newline: query-migrate alone, an empty first line:
 * none) -> cv_qmp_parse_job(). What it accepts must be a sane job; what it refuses, untouched. */
#include <errno.h>
#include <string.h>

#include "cv_backend.h"
#include "fuzz.h"

static void check_job(const struct cv_job *j, bool have_status)
{
	FUZZ_CHECK((unsigned int)j->status <= CV_ST_CANCELLED);
	FUZZ_CHECK(strcmp(cv_status_str(j->status), "unknown") != 0);
	FUZZ_CHECK(j->elapsed_ms >= -1);
	FUZZ_CHECK(j->expected_downtime_ms >= -1);
	FUZZ_CHECK(j->downtime_ms >= -1);
	FUZZ_CHECK(j->throttle_pct <= 100);
	/* The hypervisor's text, one line, terminated within the field. */
	FUZZ_CHECK(memchr(j->error, '\0', sizeof(j->error)) != NULL);
	for (const char *p = j->error; *p; p++)
		FUZZ_CHECK((unsigned char)*p >= 0x20 && *p != 0x7f);
	/* Nothing says the guest runs without a query-status reply. */
	if (!have_status)
		FUZZ_CHECK(!j->guest_running);
}

/* Field by field: struct cv_job has padding, which a struct copy need not carry. */
static bool same_job(const struct cv_job *a, const struct cv_job *b)
{
	return a->status == b->status && a->elapsed_ms == b->elapsed_ms && a->total == b->total &&
	       a->remaining == b->remaining && a->transferred == b->transferred &&
	       a->dirty_rate == b->dirty_rate && a->dirty_syncs == b->dirty_syncs &&
	       a->rate == b->rate && a->expected_downtime_ms == b->expected_downtime_ms &&
	       a->downtime_ms == b->downtime_ms && a->throttle_pct == b->throttle_pct &&
	       a->postcopy_requests == b->postcopy_requests &&
	       a->guest_running == b->guest_running && strcmp(a->error, b->error) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nl = memchr(data, '\n', size);
	size_t mlen = nl ? (size_t)(nl - data) : size;
	char *mig, *st = NULL;
	struct cv_job job, again, canary;
	int r, r2;

	/* Exact-size copies, NUL-terminated as the API wants: a read past either is a crash. */
	mig = malloc(mlen + 1);
	FUZZ_CHECK(mig != NULL);
	memcpy(mig, data, mlen);
	mig[mlen] = '\0';
	if (nl) {
		size_t slen = size - mlen - 1;

		st = malloc(slen + 1);
		FUZZ_CHECK(st != NULL);
		memcpy(st, nl + 1, slen);
		st[slen] = '\0';
	}
	memset(&job, 0xa5, sizeof(job));
	canary = job;
	r = cv_qmp_parse_job(nl && mlen == 0 ? NULL : mig, st, &job);
	if (r == 0) {
		check_job(&job, st != NULL);
		/* The same text, the same job: no state kept between calls. */
		memset(&again, 0, sizeof(again));
		r2 = cv_qmp_parse_job(nl && mlen == 0 ? NULL : mig, st, &again);
		FUZZ_CHECK(r2 == 0);
		FUZZ_CHECK(same_job(&job, &again));
	} else {
		FUZZ_CHECK(r == -EPROTO);
		/* Output parameters are never written on failure. */
		FUZZ_CHECK(memcmp(&job, &canary, sizeof(job)) == 0);
	}
	free(mig);
	free(st);
	return 0;
}
