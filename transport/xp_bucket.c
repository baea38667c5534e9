// SPDX-License-Identifier: Apache-2.0
/* Token buckets for the data path: a mutex per bucket (taken a few thousand times a second at
 * most: once per pipe-full of bytes), tokens refilled from the monotonic clock at each take. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "util.h"
#include "xp_bucket.h"

struct xp_bucket {
	pthread_mutex_t mu;
	_Atomic uint64_t rate; /* bytes/s, 0: unlimited; written under mu */
	uint64_t burst;
	uint64_t tokens;
	uint64_t last_ns; /* when tokens were last brought up to date; 0: not yet */
	_Atomic uint64_t held;
};

uint64_t xp_bucket_burst(uint64_t rate)
{
	uint64_t b = rate / 100;

	if (rate == 0)
		return 0;
	return b < XP_BUCKET_MIN_BURST ? XP_BUCKET_MIN_BURST : b;
}

int xp_bucket_new(uint64_t rate, struct xp_bucket **ret)
{
	struct xp_bucket *b = calloc(1, sizeof(*b));

	if (!b)
		return -ENOMEM;
	pthread_mutex_init(&b->mu, NULL);
	atomic_init(&b->rate, rate);
	b->burst = xp_bucket_burst(rate);
	/* Start empty: a migration begins at its cap, not with a burst on top of it. */
	b->tokens = 0;
	atomic_init(&b->held, 0);
	*ret = b;
	return 0;
}

void xp_bucket_free(struct xp_bucket *b)
{
	if (!b)
		return;
	pthread_mutex_destroy(&b->mu);
	free(b);
}

/* Under mu. */
static void refill(struct xp_bucket *b, uint64_t rate, uint64_t now_ns)
{
	uint64_t dt, add;

	if (b->last_ns == 0 || now_ns <= b->last_ns) {
		if (b->last_ns == 0)
			b->last_ns = now_ns;
		return;
	}
	dt = now_ns - b->last_ns;
	/* Whole seconds and the rest apart, so rate * dt cannot overflow. */
	add = dt / 1000000000ull * rate + (dt % 1000000000ull) * rate / 1000000000ull;
	/* Keep the remainder of a partial token: advance the clock only by what was credited. */
	if (add == 0)
		return;
	b->last_ns = now_ns;
	b->tokens = b->tokens + add > b->burst ? b->burst : b->tokens + add;
}

void xp_bucket_set_rate(struct xp_bucket *b, uint64_t rate)
{
	pthread_mutex_lock(&b->mu);
	/* What was earned at the old rate stays earned. */
	refill(b, atomic_load_explicit(&b->rate, memory_order_relaxed), vm_now_ns());
	atomic_store_explicit(&b->rate, rate, memory_order_relaxed);
	b->burst = xp_bucket_burst(rate);
	if (b->tokens > b->burst)
		b->tokens = b->burst;
	pthread_mutex_unlock(&b->mu);
}

uint64_t xp_bucket_rate(const struct xp_bucket *b)
{
	return atomic_load_explicit(&b->rate, memory_order_relaxed);
}

uint64_t xp_bucket_held(const struct xp_bucket *b)
{
	return atomic_load_explicit(&b->held, memory_order_relaxed);
}

size_t xp_bucket_take(struct xp_bucket *const chain[2], size_t want, uint64_t now_ns,
		      uint64_t *wait_ns)
{
	struct xp_bucket *lim[2];
	uint64_t rate[2], avail = UINT64_MAX, need, wait = 0, min_burst = UINT64_MAX;
	unsigned int n = 0;

	for (unsigned int i = 0; i < 2; i++) {
		uint64_t r = chain[i] ? atomic_load_explicit(&chain[i]->rate, memory_order_relaxed)
				      : 0;

		if (r) {
			lim[n] = chain[i];
			rate[n++] = r;
		}
	}
	if (n == 0 || want == 0)
		return want;
	/* Always in chain order (migration, then node), so two takes cannot deadlock. */
	for (unsigned int i = 0; i < n; i++) {
		pthread_mutex_lock(&lim[i]->mu);
		refill(lim[i], rate[i], now_ns);
		if (lim[i]->tokens < avail)
			avail = lim[i]->tokens;
		if (lim[i]->burst < min_burst)
			min_burst = lim[i]->burst;
	}
	/*
	 * Wait for half a burst (5 ms of the rate) rather than a quantum: waking for every 16 KiB
	 * cost a core at 200 MiB/s with 8 connections, while the tokens arrive all the same.
	 */
	need = min_burst / 2 > XP_BUCKET_QUANTUM ? min_burst / 2 : XP_BUCKET_QUANTUM;
	if (need > want)
		need = want;
	if (avail >= need) {
		if (avail > want)
			avail = want;
		for (unsigned int i = 0; i < n; i++)
			lim[i]->tokens -= avail;
	} else {
		for (unsigned int i = 0; i < n; i++) {
			uint64_t t = lim[i]->tokens, w;

			if (t >= need)
				continue;
			w = ((need - t) * 1000000000ull + rate[i] - 1) / rate[i];
			if (w > wait)
				wait = w;
		}
		avail = 0;
	}
	for (unsigned int i = n; i-- > 0;)
		pthread_mutex_unlock(&lim[i]->mu);
	if (avail == 0) {
		if (chain[0])
			atomic_fetch_add_explicit(&chain[0]->held, 1, memory_order_relaxed);
		else if (chain[1])
			atomic_fetch_add_explicit(&chain[1]->held, 1, memory_order_relaxed);
		*wait_ns = wait;
	}
	return (size_t)avail;
}

void xp_bucket_refund(struct xp_bucket *const chain[2], size_t bytes)
{
	for (unsigned int i = 0; i < 2 && bytes; i++) {
		struct xp_bucket *b = chain[i];

		if (!b || atomic_load_explicit(&b->rate, memory_order_relaxed) == 0)
			continue;
		pthread_mutex_lock(&b->mu);
		b->tokens = b->tokens + bytes > b->burst ? b->burst : b->tokens + bytes;
		pthread_mutex_unlock(&b->mu);
	}
}
