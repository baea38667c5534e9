// SPDX-License-Identifier: Apache-2.0
/* Unit tests for lib/units.h: rates as operators write them (vmigctl --bandwidth, vmigd
 * --node-bandwidth), each unit's one meaning, what is refused, and how rates are printed. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "units.h"

static const struct {
	const char *text;
	uint64_t want;
} good[] = {
	/* Plain bytes/s. */
	{ "0", 0 },
	{ "1", 1 },
	{ "123456789", 123456789 },
	{ "500B", 500 },
	{ "64/s", 64 },
	/* None at all. */
	{ "none", 0 },
	{ "unlimited", 0 },
	{ "NONE", 0 },
	{ "Unlimited", 0 },
	/* K/M/G/T: powers of 1000, bytes. */
	{ "1K", 1000 },
	{ "500MB", 500000000 },
	{ "500M", 500000000 },
	{ "2G", 2000000000 },
	{ "2GB/s", 2000000000 },
	{ "1T", 1000000000000ull },
	/* Ki/Mi/Gi/Ti: powers of 1024, bytes. */
	{ "1Ki", 1024 },
	{ "64Mi", 67108864 },
	{ "64MiB", 67108864 },
	{ "64MiB/s", 67108864 },
	{ "1Gi", 1073741824 },
	{ "1.5Gi", 1610612736 },
	{ "1Ti", 1099511627776ull },
	/* Bits when the unit ends in bit or bps. */
	{ "1Gbit", 125000000 },
	{ "1Gbit/s", 125000000 },
	{ "10Gbps", 1250000000 },
	{ "100Mbit", 12500000 },
	{ "8bit", 1 },
	{ "1Mibit", 131072 },
	/* A fraction of a byte rounds up: a cap never becomes "none" by accident. */
	{ "1bit", 1 },
	{ "0.5", 1 },
	{ "0.0", 0 },
	{ ".5K", 500 },
	/* The largest: 1 PB/s. */
	{ "1000T", 1000000000000000ull },
	{ "1000000000000000", 1000000000000000ull },
};

static const char *const bad[] = {
	"",
	" ",
	"garbage",
	"0x10",
	"1e3",
	"1E3Mi",
	"inf",
	"nan",
	"M",
	"Mi",
	"-1",
	"-64Mi",
	"+64",
	" 64Mi",
	"12 Mi",
	"64Mi ",
	"64 MiB/s",
	"64mi",	 /* units are case-sensitive: m is not M */
	"64Kib", /* ... and Kib is not Kibit */
	"64MiB/s/s",
	"64/",
	"64P",
	"1001T", /* over VM_RATE_MAX */
	"1000000000000001",
	"99999999999999999999999",
	"1e400",
	"inf",
	"nan",
	"none please",
	"64Mibps", /* no binary bps */
};

static void test_parse_good(void **state)
{
	int failed = 0;

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		uint64_t v = 0xdeadbeef;
		int r = vm_parse_rate(good[i].text, &v);

		if (r != 0 || v != good[i].want) {
			print_error("\"%s\": got %d, %llu; want 0, %llu\n", good[i].text, r,
				    (unsigned long long)v, (unsigned long long)good[i].want);
			failed++;
		}
	}
	assert_int_equal(failed, 0);
}

static void test_parse_bad(void **state)
{
	int failed = 0;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		uint64_t v = 0xdeadbeef;
		int r = vm_parse_rate(bad[i], &v);

		/* Refused, and *out untouched. */
		if (r != -EINVAL || v != 0xdeadbeef) {
			print_error("\"%s\": got %d, %llu; want -EINVAL and no value\n", bad[i], r,
				    (unsigned long long)v);
			failed++;
		}
	}
	assert_int_equal(failed, 0);
}

static void test_parse_null(void **state)
{
	uint64_t v = 7;

	assert_int_equal(vm_parse_rate(NULL, &v), -EINVAL);
	assert_int_equal(v, 7);
}

static void test_max(void **state)
{
	uint64_t v;

	/* VM_RATE_MAX itself is accepted; sums of a few of them still fit 64 bits. */
	assert_int_equal(vm_parse_rate("1000000000000000", &v), 0);
	assert_true(v == VM_RATE_MAX);
	assert_true(VM_RATE_MAX * 1000 / 1000 == VM_RATE_MAX);
}

static void test_format_rate(void **state)
{
	static const struct {
		uint64_t v;
		const char *want;
	} cases[] = {
		{ 0, "unlimited" },
		{ 1, "1 B/s" },
		{ 500, "500 B/s" },
		{ 1023, "1023 B/s" },
		{ 1024, "1.0 KiB/s" },
		{ 1536, "1.5 KiB/s" },
		{ 67108864, "64.0 MiB/s" },
		{ 54945382, "52.4 MiB/s" },
		{ 125000000, "119.2 MiB/s" },
		{ 1610612736, "1.5 GiB/s" },
		{ 1099511627776ull, "1.0 TiB/s" },
		{ VM_RATE_MAX, "909.5 TiB/s" },
	};
	char buf[32];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_ptr_equal(vm_format_rate(cases[i].v, buf, sizeof(buf)), buf);
		assert_string_equal(buf, cases[i].want);
	}
	/* A short buffer is cut, terminated. */
	vm_format_rate(67108864, buf, 5);
	assert_string_equal(buf, "64.0");
}

/* What vm_format_rate prints, vm_parse_rate reads back to within its rounding. */
static void test_round_trip(void **state)
{
	static const uint64_t values[] = { 1, 999, 1024, 67108864, 125000000, 1610612736 };
	char buf[64], unit[16];

	for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
		uint64_t back;
		double num;

		vm_format_rate(values[i], buf, sizeof(buf));
		/* "64.0 MiB/s" is the printed form; the parser takes it without the space. */
		assert_int_equal(sscanf(buf, "%lf %15s", &num, unit), 2);
		snprintf(buf, sizeof(buf), "%g%s", num, unit);
		assert_int_equal(vm_parse_rate(buf, &back), 0);
		assert_true(back >= values[i] * 0.95 && back <= values[i] * 1.05 + 1);
	}
}

static void test_format_bytes(void **state)
{
	char buf[32];

	assert_string_equal(vm_format_bytes(0, buf, sizeof(buf)), "0 B");
	assert_string_equal(vm_format_bytes(1000, buf, sizeof(buf)), "1000 B");
	assert_string_equal(vm_format_bytes(1048576, buf, sizeof(buf)), "1.0 MiB");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_good),   cmocka_unit_test(test_parse_bad),
		cmocka_unit_test(test_parse_null),   cmocka_unit_test(test_max),
		cmocka_unit_test(test_format_rate),  cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_format_bytes),
	};

	return cmocka_run_group_tests_name("units", tests, NULL, NULL);
}
