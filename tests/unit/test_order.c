// SPDX-License-Identifier: Apache-2.0
/* Unit tests for connection ordering (proxy/px_order.h) against a fake transport that records
 * every open and drop. Time is passed in, so timeouts are tested without sleeping. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "px_order.h"

#define MAX_EVENTS 64
#define NO_FAIL UINT32_MAX

struct drop_event {
	uint32_t seq;
	void *conn;
	enum px_status why;
};

/* The fake layer below: what was opened and dropped, in order. */
struct fake {
	uint32_t opened[MAX_EVENTS];
	void *opened_conn[MAX_EVENTS];
	unsigned int nopened;
	/* Number of calls to arrive() made before each open, to check opens happen at once. */
	unsigned int open_at_arrival[MAX_EVENTS];
	unsigned int arrivals;
	struct drop_event dropped[MAX_EVENTS];
	unsigned int ndropped;
	uint32_t fail_seq; /* open() of this seq fails */
};

static int fake_open(void *ctx, uint32_t seq, void *conn)
{
	struct fake *f = ctx;

	if (seq == f->fail_seq)
		return -ECONNREFUSED;
	assert_true(f->nopened < MAX_EVENTS);
	f->opened[f->nopened] = seq;
	f->opened_conn[f->nopened] = conn;
	f->open_at_arrival[f->nopened] = f->arrivals;
	f->nopened++;
	return 0;
}

static void fake_drop(void *ctx, uint32_t seq, void *conn, enum px_status why)
{
	struct fake *f = ctx;

	assert_true(f->ndropped < MAX_EVENTS);
	f->dropped[f->ndropped++] = (struct drop_event){.seq = seq, .conn = conn, .why = why};
}

static const struct px_order_ops fake_ops = {
	.open = fake_open,
	.drop = fake_drop,
};

/* Distinct, recognisable conn pointers, never dereferenced. */
#define CONN(s) ((void *)(uintptr_t)(0x10000 + (uintptr_t)(s)))

static void fake_init(struct fake *f)
{
	memset(f, 0, sizeof(*f));
	f->fail_seq = NO_FAIL;
}

static struct px_order *order_new(struct fake *f, unsigned int max_parked, uint64_t timeout)
{
	struct px_order *o = NULL;

	fake_init(f);
	assert_int_equal(px_order_new(&fake_ops, f, max_parked, timeout, &o), 0);
	assert_non_null(o);
	assert_int_equal(px_order_next(o), 0);
	assert_int_equal(px_order_parked(o), 0);
	assert_false(px_order_failed(o));
	assert_int_equal(px_order_deadline(o), 0);
	return o;
}

static enum px_status arrive(struct fake *f, struct px_order *o, uint32_t seq, uint64_t now)
{
	f->arrivals++;
	return px_order_arrive(o, seq, CONN(seq), now);
}

static bool was_dropped(const struct fake *f, uint32_t seq, enum px_status *why)
{
	for (unsigned int i = 0; i < f->ndropped; i++) {
		if (f->dropped[i].seq == seq) {
			assert_ptr_equal(f->dropped[i].conn, CONN(seq));
			*why = f->dropped[i].why;
			return true;
		}
	}
	return false;
}

/* seq was dropped through the ops, with status want. */
static void assert_dropped(const struct fake *f, uint32_t seq, enum px_status want)
{
	enum px_status why;

	assert_true(was_dropped(f, seq, &why));
	assert_int_equal(why, want);
}

static void test_new_invalid(void **state)
{
	struct px_order *o = (struct px_order *)0x1;
	struct fake f;

	fake_init(&f);
	assert_int_equal(px_order_new(&fake_ops, &f, 0, 1000, &o), -EINVAL);
	/* *ret is written only on success. */
	assert_ptr_equal(o, (struct px_order *)0x1);
	px_order_free(NULL);
}

static void test_in_order(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);

	for (uint32_t s = 0; s < 20; s++) {
		assert_int_equal(arrive(&f, o, s, 10 * s), PX_OK);
		assert_int_equal(f.nopened, s + 1);
		assert_int_equal(f.opened[s], s);
		assert_ptr_equal(f.opened_conn[s], CONN(s));
		assert_int_equal(px_order_next(o), s + 1);
		assert_int_equal(px_order_parked(o), 0);
		/* Nothing parked: nothing to wait for. */
		assert_int_equal(px_order_deadline(o), 0);
		assert_false(px_order_expire(o, 1000000));
	}
	assert_int_equal(f.ndropped, 0);
	px_order_free(o);
	assert_int_equal(f.ndropped, 0);
}

static void test_reversed(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 16, 1000);

	for (uint32_t s = 16; s >= 1; s--) {
		assert_int_equal(arrive(&f, o, s, 0), PX_OK);
		assert_int_equal(f.nopened, 0);
		assert_int_equal(px_order_parked(o), 17 - s);
		assert_int_equal(px_order_next(o), 0);
	}
	assert_int_equal(arrive(&f, o, 0, 5), PX_OK);
	assert_int_equal(f.nopened, 17);
	for (uint32_t s = 0; s <= 16; s++) {
		assert_int_equal(f.opened[s], s);
		assert_ptr_equal(f.opened_conn[s], CONN(s));
		/* All opened during the last arrival, that of 0. */
		assert_int_equal(f.open_at_arrival[s], 17);
	}
	assert_int_equal(px_order_next(o), 17);
	assert_int_equal(px_order_parked(o), 0);
	assert_int_equal(px_order_deadline(o), 0);
	assert_int_equal(f.ndropped, 0);
	px_order_free(o);
	assert_int_equal(f.ndropped, 0);
}

/* xorshift32: a deterministic generator, so a failure names its seed. */
static uint32_t rnd(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

static void check_permutation(uint32_t seed, uint32_t n)
{
	uint32_t perm[MAX_EVENTS];
	bool arrived[MAX_EVENTS] = {false};
	struct fake f;
	struct px_order *o;
	uint32_t rs = seed;

	/* Fisher-Yates over 0..n. */
	for (uint32_t i = 0; i <= n; i++)
		perm[i] = i;
	for (uint32_t i = n; i > 0; i--) {
		uint32_t j = rnd(&rs) % (i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	o = order_new(&f, n > 0 ? n : 1, 1000);
	for (uint32_t i = 0; i <= n; i++) {
		uint32_t prefix = 0;

		assert_int_equal(arrive(&f, o, perm[i], i), PX_OK);
		arrived[perm[i]] = true;
		while (prefix <= n && arrived[prefix])
			prefix++;
		/* Exactly the arrived prefix is open: nothing early, nothing held back. */
		assert_int_equal(f.nopened, prefix);
		assert_int_equal(px_order_next(o), prefix);
		assert_int_equal(px_order_parked(o), i + 1 - prefix);
		assert_int_equal(px_order_deadline(o) != 0, i + 1 > prefix);
	}
	for (uint32_t s = 0; s <= n; s++) {
		assert_int_equal(f.opened[s], s);
		assert_ptr_equal(f.opened_conn[s], CONN(s));
	}
	assert_int_equal(f.ndropped, 0);
	px_order_free(o);
	assert_int_equal(f.ndropped, 0);
}

static void test_random_permutations(void **state)
{
	static const uint32_t seeds[] = {1, 2, 3, 0xdeadbeef, 12345, 777, 0x9e3779b9, 42};

	for (uint32_t n = 0; n <= 17; n++)
		for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
			check_permutation(seeds[i] + n, n);
}

static void test_duplicates(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);

	assert_int_equal(arrive(&f, o, 0, 0), PX_OK);
	assert_int_equal(arrive(&f, o, 3, 0), PX_OK);
	/* Already opened. */
	assert_int_equal(arrive(&f, o, 0, 1), PX_ERR_DUPLICATE);
	/* Already parked. */
	assert_int_equal(arrive(&f, o, 3, 1), PX_ERR_DUPLICATE);
	assert_int_equal(f.nopened, 1);
	assert_int_equal(px_order_parked(o), 1);
	assert_false(px_order_failed(o));
	/* A duplicate does not fail the sequence: the rest still goes through. */
	assert_int_equal(arrive(&f, o, 1, 2), PX_OK);
	assert_int_equal(arrive(&f, o, 2, 2), PX_OK);
	assert_int_equal(f.nopened, 4);
	assert_int_equal(f.opened[3], 3);
	/* Opened after having been parked. */
	assert_int_equal(arrive(&f, o, 3, 3), PX_ERR_DUPLICATE);
	assert_int_equal(arrive(&f, o, 1, 3), PX_ERR_DUPLICATE);
	assert_int_equal(f.ndropped, 0);
	px_order_free(o);
}

static void test_timeout(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);

	assert_int_equal(arrive(&f, o, 1, 0), PX_OK);
	assert_int_equal(arrive(&f, o, 2, 400), PX_OK);
	/* The clock runs from the first parked one, not the latest. */
	assert_int_equal(px_order_deadline(o), 1000);
	assert_false(px_order_expire(o, 0));
	assert_false(px_order_expire(o, 999));
	assert_false(px_order_failed(o));
	assert_int_equal(f.ndropped, 0);
	assert_true(px_order_expire(o, 1000));
	assert_true(px_order_failed(o));
	assert_int_equal(f.nopened, 0);
	assert_int_equal(f.ndropped, 2);
	assert_dropped(&f, 1, PX_ERR_FAILED);
	assert_dropped(&f, 2, PX_ERR_FAILED);
	assert_int_equal(px_order_parked(o), 0);
	assert_int_equal(px_order_deadline(o), 0);
	/* Only once. */
	assert_false(px_order_expire(o, 5000));
	/* Later arrivals, the missing head included, are refused. */
	assert_int_equal(arrive(&f, o, 0, 1001), PX_ERR_FAILED);
	assert_int_equal(arrive(&f, o, 3, 1001), PX_ERR_FAILED);
	assert_int_equal(f.nopened, 0);
	assert_int_equal(f.ndropped, 2);
	px_order_free(o);
	assert_int_equal(f.ndropped, 2);
}

static void test_timeout_exact_deadline(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);

	assert_int_equal(arrive(&f, o, 1, 0), PX_OK);
	assert_int_equal(px_order_deadline(o), 1000);
	assert_false(px_order_expire(o, px_order_deadline(o) - 1));
	assert_true(px_order_expire(o, px_order_deadline(o)));
	assert_int_equal(f.ndropped, 1);
	assert_int_equal(f.dropped[0].seq, 1);
	assert_int_equal(f.dropped[0].why, PX_ERR_FAILED);
	px_order_free(o);
}

static void test_timeout_restarts_when_head_advances(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);

	assert_int_equal(arrive(&f, o, 2, 0), PX_OK);
	assert_int_equal(px_order_deadline(o), 1000);
	/* 0 comes late but in time; 1 is still missing: a fresh wait for 1 starts now. */
	assert_int_equal(arrive(&f, o, 0, 900), PX_OK);
	assert_int_equal(f.nopened, 1);
	assert_int_equal(px_order_next(o), 1);
	assert_int_equal(px_order_parked(o), 1);
	assert_int_equal(px_order_deadline(o), 1900);
	assert_false(px_order_expire(o, 1000));
	assert_false(px_order_expire(o, 1899));
	assert_false(px_order_failed(o));
	assert_true(px_order_expire(o, 1900));
	assert_dropped(&f, 2, PX_ERR_FAILED);
	px_order_free(o);
}

static void test_timeout_restarts_after_parked_opened(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);

	/* 1 and 3 parked; 0 at t=500 opens 0 and 1, and 2 is now the one awaited. */
	assert_int_equal(arrive(&f, o, 1, 0), PX_OK);
	assert_int_equal(arrive(&f, o, 3, 100), PX_OK);
	assert_int_equal(arrive(&f, o, 0, 500), PX_OK);
	assert_int_equal(f.nopened, 2);
	assert_int_equal(px_order_next(o), 2);
	assert_int_equal(px_order_deadline(o), 1500);
	/* 2 arrives: all open, nothing waits any more. */
	assert_int_equal(arrive(&f, o, 2, 1400), PX_OK);
	assert_int_equal(f.nopened, 4);
	assert_int_equal(px_order_deadline(o), 0);
	assert_false(px_order_expire(o, 100000));
	/* A new gap later starts a new clock at its own arrival. */
	assert_int_equal(arrive(&f, o, 5, 50000), PX_OK);
	assert_int_equal(px_order_deadline(o), 51000);
	assert_int_equal(f.ndropped, 0);
	px_order_free(o);
	assert_int_equal(f.ndropped, 1);
	assert_int_equal(f.dropped[0].seq, 5);
	assert_int_equal(f.dropped[0].why, PX_ERR_SHUTDOWN);
}

static void test_head_open_fails(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);
	enum px_status why;

	f.fail_seq = 0;
	assert_int_equal(arrive(&f, o, 2, 0), PX_OK);
	assert_int_equal(arrive(&f, o, 1, 0), PX_OK);
	assert_int_equal(arrive(&f, o, 0, 10), PX_ERR_CONNECT);
	assert_true(px_order_failed(o));
	assert_int_equal(f.nopened, 0);
	/* The head itself is answered by the caller, not dropped through the ops. */
	assert_false(was_dropped(&f, 0, &why));
	assert_int_equal(f.ndropped, 2);
	assert_dropped(&f, 1, PX_ERR_FAILED);
	assert_dropped(&f, 2, PX_ERR_FAILED);
	assert_int_equal(px_order_parked(o), 0);
	assert_int_equal(px_order_deadline(o), 0);
	assert_int_equal(arrive(&f, o, 3, 20), PX_ERR_FAILED);
	px_order_free(o);
	assert_int_equal(f.ndropped, 2);
}

static void test_head_open_fails_nothing_parked(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);

	assert_int_equal(arrive(&f, o, 0, 0), PX_OK);
	f.fail_seq = 1;
	assert_int_equal(arrive(&f, o, 1, 0), PX_ERR_CONNECT);
	assert_true(px_order_failed(o));
	assert_int_equal(f.ndropped, 0);
	assert_int_equal(arrive(&f, o, 2, 0), PX_ERR_FAILED);
	px_order_free(o);
	assert_int_equal(f.ndropped, 0);
}

static void test_parked_open_fails(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);
	enum px_status why;

	f.fail_seq = 2;
	for (uint32_t s = 4; s >= 1; s--)
		assert_int_equal(arrive(&f, o, s, 0), PX_OK);
	/* 0's own open works, so its arrival is OK; 1 opens, 2 fails, 3 and 4 never open. */
	assert_int_equal(arrive(&f, o, 0, 0), PX_OK);
	assert_true(px_order_failed(o));
	assert_int_equal(f.nopened, 2);
	assert_int_equal(f.opened[0], 0);
	assert_int_equal(f.opened[1], 1);
	assert_int_equal(f.ndropped, 3);
	assert_dropped(&f, 2, PX_ERR_CONNECT);
	assert_dropped(&f, 3, PX_ERR_FAILED);
	assert_dropped(&f, 4, PX_ERR_FAILED);
	assert_false(was_dropped(&f, 0, &why));
	assert_false(was_dropped(&f, 1, &why));
	assert_int_equal(px_order_parked(o), 0);
	assert_int_equal(px_order_deadline(o), 0);
	assert_int_equal(arrive(&f, o, 5, 0), PX_ERR_FAILED);
	px_order_free(o);
	assert_int_equal(f.ndropped, 3);
}

static void test_parking_limit(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 4, 1000);

	/* With 4 slots and 0 missing, 1..4 can park; 5 is a gap no real channel set makes. */
	assert_int_equal(arrive(&f, o, 5, 0), PX_ERR_MALFORMED);
	assert_int_equal(arrive(&f, o, 1000, 0), PX_ERR_MALFORMED);
	assert_int_equal(arrive(&f, o, UINT32_MAX, 0), PX_ERR_MALFORMED);
	assert_int_equal(px_order_parked(o), 0);
	for (uint32_t s = 1; s <= 4; s++)
		assert_int_equal(arrive(&f, o, s, 0), PX_OK);
	assert_int_equal(px_order_parked(o), 4);
	/* Full: even a seq within the gap bound is refused. */
	assert_int_equal(arrive(&f, o, 5, 0), PX_ERR_MALFORMED);
	assert_int_equal(px_order_parked(o), 4);
	/* A refusal for the limit does not fail the sequence. */
	assert_false(px_order_failed(o));
	assert_int_equal(f.ndropped, 0);
	assert_int_equal(arrive(&f, o, 0, 1), PX_OK);
	assert_int_equal(f.nopened, 5);
	assert_int_equal(px_order_parked(o), 0);
	/* The bound moves with the head: now next is 5, and 9 is the farthest that parks. */
	assert_int_equal(arrive(&f, o, 10, 2), PX_ERR_MALFORMED);
	assert_int_equal(arrive(&f, o, 9, 2), PX_OK);
	px_order_free(o);
	assert_int_equal(f.ndropped, 1);
	assert_int_equal(f.dropped[0].seq, 9);
	assert_int_equal(f.dropped[0].why, PX_ERR_SHUTDOWN);
}

static void test_fail_explicit(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);

	assert_int_equal(arrive(&f, o, 0, 0), PX_OK);
	assert_int_equal(arrive(&f, o, 2, 0), PX_OK);
	px_order_fail(o);
	assert_true(px_order_failed(o));
	assert_dropped(&f, 2, PX_ERR_FAILED);
	assert_int_equal(px_order_deadline(o), 0);
	assert_int_equal(arrive(&f, o, 1, 0), PX_ERR_FAILED);
	px_order_free(o);
	assert_int_equal(f.ndropped, 1);
}

static void test_free_drops_shutdown(void **state)
{
	struct fake f;
	struct px_order *o = order_new(&f, 8, 1000);

	assert_int_equal(arrive(&f, o, 0, 0), PX_OK);
	assert_int_equal(arrive(&f, o, 2, 0), PX_OK);
	assert_int_equal(arrive(&f, o, 5, 0), PX_OK);
	assert_int_equal(arrive(&f, o, 3, 0), PX_OK);
	assert_int_equal(f.ndropped, 0);
	px_order_free(o);
	assert_int_equal(f.nopened, 1);
	assert_int_equal(f.ndropped, 3);
	for (uint32_t s = 2; s <= 5; s++) {
		if (s == 4)
			continue;
		assert_dropped(&f, s, PX_ERR_SHUTDOWN);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_new_invalid),
		cmocka_unit_test(test_in_order),
		cmocka_unit_test(test_reversed),
		cmocka_unit_test(test_random_permutations),
		cmocka_unit_test(test_duplicates),
		cmocka_unit_test(test_timeout),
		cmocka_unit_test(test_timeout_exact_deadline),
		cmocka_unit_test(test_timeout_restarts_when_head_advances),
		cmocka_unit_test(test_timeout_restarts_after_parked_opened),
		cmocka_unit_test(test_head_open_fails),
		cmocka_unit_test(test_head_open_fails_nothing_parked),
		cmocka_unit_test(test_parked_open_fails),
		cmocka_unit_test(test_parking_limit),
		cmocka_unit_test(test_fail_explicit),
		cmocka_unit_test(test_free_drops_shutdown),
	};

	return cmocka_run_group_tests_name("px_order", tests, NULL, NULL);
}
