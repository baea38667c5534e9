// SPDX-License-Identifier: Apache-2.0
/* Unit tests for bandwidth shaping's parts: max-min fair shares (proxy/px_share.h), the token
 * buckets (transport/xp_bucket.h) with time passed in, and the rate meters (lib/rate.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "px_share.h"
#include "rate.h"
#include "xp_bucket.h"

#define MiB (1024ull * 1024)
#define UNB UINT64_MAX
#define NS  1000000000ull

struct share_case {
	const char *name;
	uint64_t total;
	unsigned int n;
	struct px_share_in in[4];
	uint64_t want[4];
};

static const struct share_case share_cases[] = {
	{ "no node cap: own caps", 0, 3, { { 50 * MiB, UNB }, { 0, UNB }, { 10, 5 } },
	  { 50 * MiB, 0, 10 } },
	{ "two greedy split evenly", 100 * MiB, 2, { { 0, UNB }, { 0, UNB } },
	  { 50 * MiB, 50 * MiB } },
	{ "one wants less, the other takes the rest", 100 * MiB, 2,
	  { { 0, 20 * MiB }, { 0, UNB } }, { 20 * MiB, 80 * MiB } },
	{ "own cap below the share", 90 * MiB, 3, { { 10 * MiB, UNB }, { 0, UNB }, { 0, UNB } },
	  { 10 * MiB, 40 * MiB, 40 * MiB } },
	{ "water-fill in two rounds", 100 * MiB, 4,
	  { { 0, 10 * MiB }, { 0, 30 * MiB }, { 0, UNB }, { 0, UNB } },
	  { 10 * MiB, 30 * MiB, 30 * MiB, 30 * MiB } },
	{ "all satisfied: leftover unused", 100 * MiB, 2, { { 0, 10 * MiB }, { 5 * MiB, UNB } },
	  { 10 * MiB, 5 * MiB } },
	{ "idle migration still gets a non-zero rate", 100 * MiB, 2, { { 0, 0 }, { 0, UNB } },
	  { 1, 100 * MiB } },
	{ "one migration", 64 * MiB, 1, { { 0, UNB } }, { 64 * MiB } },
};

static void test_share_table(void **state)
{
	for (size_t i = 0; i < sizeof(share_cases) / sizeof(share_cases[0]); i++) {
		const struct share_case *c = &share_cases[i];
		uint64_t out[4] = { 0 };

		px_share(c->total, c->n, c->in, out);
		for (unsigned int j = 0; j < c->n; j++) {
			if (out[j] != c->want[j])
				fail_msg("%s: migration %u got %llu, want %llu", c->name, j,
					 (unsigned long long)out[j], (unsigned long long)c->want[j]);
		}
	}
}

/* Shares never add up to more than the node cap, whatever the demands. */
static void test_share_sum_bounded(void **state)
{
	struct px_share_in in[16];
	uint64_t out[16];

	srand(7);
	for (int round = 0; round < 2000; round++) {
		unsigned int n = 1 + rand() % 16;
		uint64_t total = 1 + (uint64_t)rand() * 1000, sum = 0;

		for (unsigned int i = 0; i < n; i++) {
			in[i].cap = rand() % 3 ? 0 : (uint64_t)rand() * 100;
			in[i].demand = rand() % 2 ? UNB : (uint64_t)rand() * 100;
		}
		px_share(total, n, in, out);
		for (unsigned int i = 0; i < n; i++) {
			sum += out[i] > 1 ? out[i] : 0;
			assert_true(out[i] >= 1);
			if (in[i].cap)
				assert_true(out[i] <= in[i].cap || out[i] == 1);
		}
		assert_true(sum <= total);
	}
}

static void test_bucket_rate(void **state)
{
	struct xp_bucket *b;
	struct xp_bucket *chain[2];
	uint64_t now = NS, wait = 0, sent = 0;
	size_t g;

	assert_int_equal(xp_bucket_new(100 * MiB, &b), 0);
	chain[0] = b;
	chain[1] = NULL;
	/* It starts empty: the first take waits for half a burst, 5 ms of the rate. */
	assert_int_equal(xp_bucket_take(chain, 1 << 20, now, &wait), 0);
	assert_true(wait > 0 && wait <= NS / 200 + 1);
	assert_int_equal(xp_bucket_held(b), 1);
	/* A greedy taker that always sleeps as told moves the rate, within a quantum. */
	for (int i = 0; i < 1000000 && now < 3 * NS; i++) {
		g = xp_bucket_take(chain, 1 << 20, now, &wait);
		if (g)
			sent += g;
		else
			now += wait;
	}
	assert_true(sent <= 200 * MiB + xp_bucket_burst(100 * MiB));
	assert_true(sent >= 200 * MiB - xp_bucket_burst(100 * MiB));
	xp_bucket_free(b);
}

static void test_bucket_burst_and_refund(void **state)
{
	struct xp_bucket *b;
	struct xp_bucket *chain[2];
	uint64_t wait;
	size_t g;

	assert_int_equal(xp_bucket_new(1000 * MiB, &b), 0);
	chain[0] = b;
	chain[1] = NULL;
	(void)xp_bucket_take(chain, 1, 1 * NS, &wait);
	/* A long idle time earns no more than the burst: 10 ms of the rate. */
	g = xp_bucket_take(chain, 1 << 30, 100 * NS, &wait);
	assert_int_equal(g, xp_bucket_burst(1000 * MiB));
	assert_int_equal(xp_bucket_burst(1000 * MiB), 1000 * MiB / 100);
	assert_int_equal(xp_bucket_burst(1 * MiB), XP_BUCKET_MIN_BURST);
	xp_bucket_refund(chain, 4096);
	assert_int_equal(xp_bucket_take(chain, 4096, 100 * NS, &wait), 4096);
	xp_bucket_free(b);
}

static void test_bucket_chain(void **state)
{
	struct xp_bucket *mig, *node;
	struct xp_bucket *chain[2];
	uint64_t now = NS, wait = 0, sent = 0;
	size_t g;

	/* The migration may send 80 MiB/s, the node only 20: the node bucket binds. */
	assert_int_equal(xp_bucket_new(80 * MiB, &mig), 0);
	assert_int_equal(xp_bucket_new(20 * MiB, &node), 0);
	chain[0] = mig;
	chain[1] = node;
	while (now < 2 * NS) {
		g = xp_bucket_take(chain, 1 << 20, now, &wait);
		if (g)
			sent += g;
		else
			now += wait;
	}
	assert_true(sent <= 20 * MiB + xp_bucket_burst(20 * MiB));
	assert_true(sent >= 20 * MiB - xp_bucket_burst(20 * MiB));
	/* Held is counted on the first bucket, whichever was short. */
	assert_true(xp_bucket_held(mig) > 0);
	assert_int_equal(xp_bucket_held(node), 0);
	/* Rate 0 is unlimited: everything is granted, nothing waits. */
	xp_bucket_set_rate(mig, 0);
	xp_bucket_set_rate(node, 0);
	assert_int_equal(xp_bucket_take(chain, 12345678, now, &wait), 12345678);
	xp_bucket_free(mig);
	xp_bucket_free(node);
}

static void test_rate_meter(void **state)
{
	struct vm_rate r = { 0 };
	uint64_t total = 0;

	/* 10 MB/s for 5 s, then 1 MB/s for 2 s, sampled every 100 ms. */
	for (uint64_t t = 0; t <= 7000; t += 100) {
		vm_rate_sample(&r, 10000 + t, total);
		total += t < 5000 ? 1000000 : 100000;
	}
	assert_int_equal(vm_rate_get(&r, 1000), 1000000);
	/* The last 10 s hold 5 s at 10 MB/s and 2 s at 1 MB/s over 7 s sampled. */
	assert_true(vm_rate_get(&r, 10000) > 7000000 && vm_rate_get(&r, 10000) < 7500000);
	/* An idle meter reads 0. */
	for (uint64_t t = 7100; t <= 20000; t += 100)
		vm_rate_sample(&r, 10000 + t, total);
	assert_int_equal(vm_rate_get(&r, 1000), 0);
	assert_int_equal(vm_rate_get(&r, 10000), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_share_table),
		cmocka_unit_test(test_share_sum_bounded),
		cmocka_unit_test(test_bucket_rate),
		cmocka_unit_test(test_bucket_burst_and_refund),
		cmocka_unit_test(test_bucket_chain),
		cmocka_unit_test(test_rate_meter),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
