// SPDX-License-Identifier: Apache-2.0
/* Unit tests for the libvirt backend's pure part (ctrl/cv_virt.h): virDomainGetJobStats's typed
 * parameters and virDomainGetState's state and reason to a cv_job. The calls themselves are
 * tested against a real libvirtd by tests/integration/test_cv_virt.py. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cv_virt.h"

#define MiB  (1024ull * 1024)
#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

static virTypedParameter ull(const char *name, unsigned long long v)
{
	virTypedParameter p = { .type = VIR_TYPED_PARAM_ULLONG };

	snprintf(p.field, sizeof(p.field), "%s", name);
	p.value.ul = v;
	return p;
}

static virTypedParameter i32(const char *name, int v)
{
	virTypedParameter p = { .type = VIR_TYPED_PARAM_INT };

	snprintf(p.field, sizeof(p.field), "%s", name);
	p.value.i = v;
	return p;
}

static virTypedParameter boolean(const char *name, bool v)
{
	virTypedParameter p = { .type = VIR_TYPED_PARAM_BOOLEAN };

	snprintf(p.field, sizeof(p.field), "%s", name);
	p.value.b = v;
	return p;
}

static virTypedParameter str(const char *name, char *v)
{
	virTypedParameter p = { .type = VIR_TYPED_PARAM_STRING };

	snprintf(p.field, sizeof(p.field), "%s", name);
	p.value.s = v;
	return p;
}

/* What libvirt 9.0 gave for a running pre-copy migration of a 256 MiB guest. */
static void active_params(virTypedParameter *p, int *n)
{
	int i = 0;

	p[i++] = i32(VIR_DOMAIN_JOB_OPERATION, VIR_DOMAIN_JOB_OPERATION_MIGRATION_OUT);
	p[i++] = ull(VIR_DOMAIN_JOB_TIME_ELAPSED, 4321);
	p[i++] = ull(VIR_DOMAIN_JOB_DATA_TOTAL, 300 * MiB);
	p[i++] = ull(VIR_DOMAIN_JOB_DATA_PROCESSED, 150 * MiB);
	p[i++] = ull(VIR_DOMAIN_JOB_DATA_REMAINING, 150 * MiB);
	p[i++] = ull(VIR_DOMAIN_JOB_MEMORY_TOTAL, 256 * MiB);
	p[i++] = ull(VIR_DOMAIN_JOB_MEMORY_PROCESSED, 100 * MiB);
	p[i++] = ull(VIR_DOMAIN_JOB_MEMORY_REMAINING, 120 * MiB);
	p[i++] = ull(VIR_DOMAIN_JOB_MEMORY_BPS, 32 * MiB);
	p[i++] = ull(VIR_DOMAIN_JOB_MEMORY_DIRTY_RATE, 2500);
	p[i++] = ull(VIR_DOMAIN_JOB_MEMORY_PAGE_SIZE, 4096);
	p[i++] = ull(VIR_DOMAIN_JOB_MEMORY_ITERATION, 3);
	p[i++] = ull(VIR_DOMAIN_JOB_DOWNTIME, 1234);
	p[i++] = ull(VIR_DOMAIN_JOB_MEMORY_POSTCOPY_REQS, 0);
	*n = i;
}

static void test_active(void **state)
{
	virTypedParameter p[20];
	struct cv_job j;
	int n;

	active_params(p, &n);
	p[n++] = i32(VIR_DOMAIN_JOB_AUTO_CONVERGE_THROTTLE, 40);
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, n, VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_BOOTED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_ACTIVE);
	assert_int_equal(j.elapsed_ms, 4321);
	/* memory_* wins over data_*, which counts disks too */
	assert_int_equal(j.total, 256 * MiB);
	assert_int_equal(j.remaining, 120 * MiB);
	assert_int_equal(j.transferred, 100 * MiB);
	assert_int_equal(j.rate, 32 * MiB);
	assert_int_equal(j.dirty_rate, 2500 * 4096);
	assert_int_equal(j.dirty_syncs, 3);
	assert_int_equal(j.expected_downtime_ms, 1234);
	assert_int_equal(j.downtime_ms, -1);
	assert_int_equal(j.throttle_pct, 40);
	assert_int_equal(j.postcopy_requests, 0);
	assert_true(j.guest_running);
	assert_string_equal(j.error, "");

	/* a bounded job is just as active */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_BOUNDED, p, n, VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_MIGRATED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_ACTIVE);
}

static void test_data_fallback(void **state)
{
	virTypedParameter p[] = {
		ull(VIR_DOMAIN_JOB_TIME_ELAPSED, 10),
		ull(VIR_DOMAIN_JOB_DATA_TOTAL, 64 * MiB),
		ull(VIR_DOMAIN_JOB_DATA_PROCESSED, 16 * MiB),
		ull(VIR_DOMAIN_JOB_DATA_REMAINING, 48 * MiB),
		/* no page size: QEMU's x86 target page */
		ull(VIR_DOMAIN_JOB_MEMORY_DIRTY_RATE, 10),
	};
	struct cv_job j;

	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, N(p), VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_UNPAUSED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_ACTIVE);
	assert_int_equal(j.total, 64 * MiB);
	assert_int_equal(j.transferred, 16 * MiB);
	assert_int_equal(j.remaining, 48 * MiB);
	assert_int_equal(j.dirty_rate, 10 * 4096);
	assert_int_equal(j.rate, 0);
	assert_int_equal(j.expected_downtime_ms, -1);
}

static void test_setup(void **state)
{
	/* libvirt sends zeros while QEMU is in "setup" */
	virTypedParameter p[] = {
		ull(VIR_DOMAIN_JOB_TIME_ELAPSED, 3),
		ull(VIR_DOMAIN_JOB_DATA_TOTAL, 0),
		ull(VIR_DOMAIN_JOB_MEMORY_TOTAL, 0),
		ull(VIR_DOMAIN_JOB_MEMORY_REMAINING, 0),
	};
	struct cv_job j;

	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, N(p), VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_BOOTED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_SETUP);
	assert_int_equal(j.elapsed_ms, 3);
	/* no parameters at all */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, NULL, 5, VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_BOOTED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_SETUP);
	assert_int_equal(j.elapsed_ms, -1);
}

static void test_paused(void **state)
{
	virTypedParameter p[20];
	struct cv_job j;
	int n;

	active_params(p, &n);
	/* suspended by someone (KubeVirt's "Paused" mode): still pre-copy, guest stopped */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, n, VIR_DOMAIN_PAUSED,
					   VIR_DOMAIN_PAUSED_USER, &j),
			 0);
	assert_int_equal(j.status, CV_ST_ACTIVE);
	assert_false(j.guest_running);
	/* stopped by QEMU for the last copy, or suspended during the migration (libvirt 9.0 gives
	 * both this reason): pre-copy goes on as far as anyone can tell */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, n, VIR_DOMAIN_PAUSED,
					   VIR_DOMAIN_PAUSED_MIGRATION, &j),
			 0);
	assert_int_equal(j.status, CV_ST_ACTIVE);
	assert_false(j.guest_running);
	/* a save: paused, active */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, n, VIR_DOMAIN_PAUSED,
					   VIR_DOMAIN_PAUSED_SAVE, &j),
			 0);
	assert_int_equal(j.status, CV_ST_ACTIVE);
}

static void test_postcopy(void **state)
{
	virTypedParameter p[20];
	struct cv_job j;
	int n;

	active_params(p, &n);
	p[n - 1] = ull(VIR_DOMAIN_JOB_MEMORY_POSTCOPY_REQS, 77);
	/* the source during post-copy */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, n, VIR_DOMAIN_PAUSED,
					   VIR_DOMAIN_PAUSED_POSTCOPY, &j),
			 0);
	assert_int_equal(j.status, CV_ST_POSTCOPY);
	assert_int_equal(j.postcopy_requests, 77);
	assert_false(j.guest_running);
	/* the destination during post-copy */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, n, VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_POSTCOPY, &j),
			 0);
	assert_int_equal(j.status, CV_ST_POSTCOPY);
	assert_true(j.guest_running);
	/* post-copy failed: split guest, whatever the job type */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, n, VIR_DOMAIN_PAUSED,
					   VIR_DOMAIN_PAUSED_POSTCOPY_FAILED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_POSTCOPY_PAUSED);
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_FAILED, p, n, VIR_DOMAIN_PAUSED,
					   VIR_DOMAIN_PAUSED_POSTCOPY_FAILED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_POSTCOPY_PAUSED);
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_NONE, NULL, 0, VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_POSTCOPY_FAILED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_POSTCOPY_PAUSED);
	/* a completed post-copy migration stays completed */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_COMPLETED, p, n, VIR_DOMAIN_SHUTOFF,
					   VIR_DOMAIN_SHUTOFF_MIGRATED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_COMPLETED);
}

static void test_finished(void **state)
{
	char msg[] = "operation failed: migration out job: unexpectedly failed";
	virTypedParameter p[] = {
		ull(VIR_DOMAIN_JOB_TIME_ELAPSED, 9000),
		ull(VIR_DOMAIN_JOB_MEMORY_TOTAL, 256 * MiB),
		ull(VIR_DOMAIN_JOB_MEMORY_PROCESSED, 300 * MiB),
		ull(VIR_DOMAIN_JOB_MEMORY_REMAINING, 0),
		ull(VIR_DOMAIN_JOB_DOWNTIME, 57),
		boolean(VIR_DOMAIN_JOB_SUCCESS, true),
	};
	virTypedParameter failed[] = {
		ull(VIR_DOMAIN_JOB_TIME_ELAPSED, 100),
		ull(VIR_DOMAIN_JOB_DOWNTIME, 300),
		boolean(VIR_DOMAIN_JOB_SUCCESS, false),
		str(VIR_DOMAIN_JOB_ERRMSG, msg),
	};
	struct cv_job j;

	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_COMPLETED, p, N(p), VIR_DOMAIN_SHUTOFF,
					   VIR_DOMAIN_SHUTOFF_MIGRATED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_COMPLETED);
	assert_int_equal(j.downtime_ms, 57);
	assert_int_equal(j.expected_downtime_ms, -1);
	assert_int_equal(j.elapsed_ms, 9000);
	assert_int_equal(j.transferred, 300 * MiB);
	assert_false(j.guest_running);

	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_FAILED, failed, N(failed),
					   VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_MIGRATION_CANCELED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_FAILED);
	assert_string_equal(j.error, msg);
	/* no downtime happened */
	assert_int_equal(j.downtime_ms, -1);
	assert_int_equal(j.expected_downtime_ms, -1);
	assert_true(j.guest_running);

	/* "completed" that says it did not succeed */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_COMPLETED, failed, N(failed),
					   VIR_DOMAIN_RUNNING, VIR_DOMAIN_RUNNING_UNPAUSED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_FAILED);

	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_CANCELLED, failed, 2, VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_MIGRATION_CANCELED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_CANCELLED);
	assert_true(j.guest_running);
}

static void test_none(void **state)
{
	struct cv_job j;

	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_NONE, NULL, 0, VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_BOOTED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_NONE);
	assert_int_equal(j.elapsed_ms, -1);
	assert_int_equal(j.expected_downtime_ms, -1);
	assert_int_equal(j.downtime_ms, -1);
	assert_int_equal(j.total, 0);
	assert_true(j.guest_running);
	/* statistics gone, but the domain migrated away */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_NONE, NULL, 0, VIR_DOMAIN_SHUTOFF,
					   VIR_DOMAIN_SHUTOFF_MIGRATED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_COMPLETED);
	assert_int_equal(j.downtime_ms, -1);
	/* shut off otherwise: no job */
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_NONE, NULL, 0, VIR_DOMAIN_SHUTOFF,
					   VIR_DOMAIN_SHUTOFF_DESTROYED, &j),
			 0);
	assert_int_equal(j.status, CV_ST_NONE);
	assert_false(j.guest_running);
}

static void test_odd_values(void **state)
{
	virTypedParameter p[] = {
		i32(VIR_DOMAIN_JOB_AUTO_CONVERGE_THROTTLE, 250),
		ull(VIR_DOMAIN_JOB_MEMORY_TOTAL, 1),
		/* wrong types count as absent */
		str(VIR_DOMAIN_JOB_TIME_ELAPSED, (char *)"12"),
		i32(VIR_DOMAIN_JOB_DOWNTIME, -5),
		ull(VIR_DOMAIN_JOB_MEMORY_DIRTY_RATE, UINT64_MAX / 2),
		ull(VIR_DOMAIN_JOB_MEMORY_PAGE_SIZE, 4096),
		ull(VIR_DOMAIN_JOB_MEMORY_BPS, UINT64_MAX),
		ull("some_future_field", 5),
	};
	struct cv_job j;

	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, N(p), VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_BOOTED, &j),
			 0);
	assert_int_equal(j.throttle_pct, 100);
	assert_int_equal(j.elapsed_ms, -1);
	assert_int_equal(j.expected_downtime_ms, -1);
	assert_true(j.dirty_rate == UINT64_MAX);
	assert_true(j.rate == UINT64_MAX);

	p[1] = ull(VIR_DOMAIN_JOB_TIME_ELAPSED, UINT64_MAX);
	p[2] = ull(VIR_DOMAIN_JOB_MEMORY_TOTAL, 1);
	assert_int_equal(cv_virt_parse_job(VIR_DOMAIN_JOB_UNBOUNDED, p, N(p), VIR_DOMAIN_RUNNING,
					   VIR_DOMAIN_RUNNING_BOOTED, &j),
			 0);
	assert_true(j.elapsed_ms == INT64_MAX);
}

static void test_unknown_type(void **state)
{
	struct cv_job j;

	memset(&j, 0xa5, sizeof(j));
	assert_int_equal(
		cv_virt_parse_job(42, NULL, 0, VIR_DOMAIN_RUNNING, VIR_DOMAIN_RUNNING_BOOTED, &j),
		-EPROTO);
	assert_int_equal(((unsigned char *)&j)[0], 0xa5);
	assert_int_equal(
		cv_virt_parse_job(-1, NULL, 0, VIR_DOMAIN_RUNNING, VIR_DOMAIN_RUNNING_BOOTED, &j),
		-EPROTO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_active),	     cmocka_unit_test(test_data_fallback),
		cmocka_unit_test(test_setup),	     cmocka_unit_test(test_paused),
		cmocka_unit_test(test_postcopy),     cmocka_unit_test(test_finished),
		cmocka_unit_test(test_none),	     cmocka_unit_test(test_odd_values),
		cmocka_unit_test(test_unknown_type),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
