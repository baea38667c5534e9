// SPDX-License-Identifier: Apache-2.0
/* A link's compression on any data path (xp_zlink.h): the contexts, when auto sends a chunk
 * compressed (only while its cap holds it back, its thread has time and recent chunks shrank),
 * the backoff after chunks that did not, and the figures. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "util.h"
#include "xp_pool.h"
#include "xp_zchunk.h"
#include "xp_zlink.h"

#define MS 1000000ull
/* A wait for tokens counts for this long after it ended. */
#define RECENT_NS (1000 * MS)
/* A thread starts compressing only when it waited at least this share of the last 100 ms (it
 * waits for the link, not the link for it); below the second, a compressing thread that nothing
 * held back is what the migration waited for (the reason then says so). */
#define IDLE_ON_PCT  30
#define IDLE_OFF_PCT 10
/* A chunk that keeps more than this share (of 1024) did not pay; this many in a row stop it */
#define BAD_RATIO	 900
#define BAD_RUN		 4
#define BACKOFF_FIRST_NS (250 * MS)
#define BACKOFF_MAX_NS	 (8000 * MS)

static uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int xp_zlink_init(struct xp_zlink *z, int mode, int level, bool in)
{
	int r = 0;

	memset(z, 0, sizeof(*z));
	z->mode = mode;
	z->backoff_ns = BACKOFF_FIRST_NS;
	z->ratio = 1024;
	atomic_store_explicit(&z->pub_ratio, z->ratio, memory_order_relaxed);
	if (mode != XP_Z_OFF)
		r = xp_zenc_new(level, &z->enc);
	if (!r && in)
		r = xp_zdec_new(&z->dec);
	if (r)
		xp_zlink_fini(z);
	return r;
}

void xp_zlink_fini(struct xp_zlink *z)
{
	xp_zenc_free(z->enc);
	xp_zdec_free(z->dec);
	z->enc = NULL;
	z->dec = NULL;
}

void xp_zlink_note(struct xp_zlink *z, bool throttled)
{
	if (throttled && z->mode == XP_Z_AUTO)
		z->throttled_ns = vm_now_ns();
}

bool xp_zlink_decide(struct xp_zlink *z, unsigned int idle, uint64_t now)
{
	enum xp_zwhy why;
	bool on;

	if (z->mode == XP_Z_ALWAYS) {
		why = XP_ZWHY_ALWAYS;
		on = true;
	} else if (z->mode == XP_Z_OFF) {
		return false;
	} else if (now < z->backoff_until) {
		why = XP_ZWHY_RATIO;
		on = false;
	} else if (!z->on && idle < IDLE_ON_PCT) {
		/* busy already: the CPU, not the cap, is what the migration waits for, and
		 * compressing would slow it */
		why = XP_ZWHY_CPU;
		on = false;
	} else if (now - z->throttled_ns <= RECENT_NS) {
		/*
		 * Its cap holds it back: fewer bytes go faster, as long as compressing keeps it so
		 * (the time compressing takes is then the thread's to spend). A full node hop alone
		 * is no such sign: a peer short of CPU fills it as well as a slow link does, and
		 * compressing then slows the migration (doc/performance.md, "Compression").
		 */
		why = XP_ZWHY_CAPPED;
		on = true;
	} else {
		/* nothing holds it back: compressing would only cost time, or (its thread busy)
		 * it is what the migration waited for */
		why = z->on && idle < IDLE_OFF_PCT ? XP_ZWHY_CPU : XP_ZWHY_IDLE_HOP;
		on = false;
	}
	if (on != z->on || atomic_load_explicit(&z->why, memory_order_relaxed) != why) {
		if (on != z->on)
			atomic_fetch_add_explicit(&z->flips, 1, memory_order_relaxed);
		z->on = on;
		atomic_store_explicit(&z->pub_on, on, memory_order_relaxed);
		atomic_store_explicit(&z->why, why, memory_order_relaxed);
		atomic_store_explicit(&z->idle_pct, idle, memory_order_relaxed);
	}
	return on;
}

/* auto, after a chunk: a run of chunks that did not shrink stops compression for a while,
 * longer each time it finds the same; one that shrank well starts the wait afresh. */
static void judge(struct xp_zlink *z, size_t plain, size_t wire, uint64_t now)
{
	unsigned int r = (unsigned int)(wire * 1024 / plain);

	z->ratio = (z->ratio * 7 + (r > 1024 ? 1024 : r)) / 8;
	atomic_store_explicit(&z->pub_ratio, z->ratio, memory_order_relaxed);
	if (z->mode != XP_Z_AUTO)
		return;
	if (r <= BAD_RATIO) {
		z->bad = 0;
		if (r < BAD_RATIO * 3 / 4)
			z->backoff_ns = BACKOFF_FIRST_NS;
		return;
	}
	if (++z->bad < BAD_RUN)
		return;
	z->bad = 0;
	z->backoff_until = now + z->backoff_ns;
	z->backoff_ns = z->backoff_ns * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : z->backoff_ns * 2;
	z->on = false;
	atomic_fetch_add_explicit(&z->flips, 1, memory_order_relaxed);
	atomic_store_explicit(&z->pub_on, false, memory_order_relaxed);
	atomic_store_explicit(&z->why, XP_ZWHY_RATIO, memory_order_relaxed);
}

ssize_t xp_zlink_encode(struct xp_zlink *z, const void *src, size_t len, void *dst, size_t cap,
			uint64_t now)
{
	uint64_t t0 = cpu_ns();
	ssize_t n = xp_zenc_chunk(z->enc, src, len, dst, cap);

	atomic_fetch_add_explicit(&z->tx_ns, cpu_ns() - t0, memory_order_relaxed);
	if (n > 0)
		judge(z, len, (size_t)n, now);
	return n;
}

void xp_zlink_sent(struct xp_zlink *z, size_t plain, size_t wire)
{
	atomic_fetch_add_explicit(&z->tx_plain, plain, memory_order_relaxed);
	atomic_fetch_add_explicit(&z->tx_wire, wire, memory_order_relaxed);
}

ssize_t xp_zlink_decode(struct xp_zlink *z, const void *rec, size_t len, void *dst, size_t cap,
			const char **why)
{
	uint64_t t0 = cpu_ns();
	ssize_t plain = xp_zdec_chunk(z->dec, rec, len, dst, cap, why);

	atomic_fetch_add_explicit(&z->rx_ns, cpu_ns() - t0, memory_order_relaxed);
	/* a passed chunk went as it was: the sender did not count it either */
	if (plain >= 0 && ((const uint8_t *)rec)[0] != XP_ZCHUNK_PASS) {
		atomic_fetch_add_explicit(&z->rx_plain, (uint64_t)plain, memory_order_relaxed);
		atomic_fetch_add_explicit(&z->rx_wire, len, memory_order_relaxed);
	}
	return plain;
}

void xp_zlink_set_mode(struct xp_zlink *z, int mode)
{
	if (atomic_load(&z->mode) != XP_Z_OFF && mode != XP_Z_OFF)
		atomic_store(&z->mode, mode);
}

void xp_zlink_fig(const struct xp_zlink *z, struct xp_zfig *out)
{
	out->tx_plain = atomic_load_explicit(&z->tx_plain, memory_order_relaxed);
	out->tx_wire = atomic_load_explicit(&z->tx_wire, memory_order_relaxed);
	out->tx_ns = atomic_load_explicit(&z->tx_ns, memory_order_relaxed);
	out->rx_plain = atomic_load_explicit(&z->rx_plain, memory_order_relaxed);
	out->rx_wire = atomic_load_explicit(&z->rx_wire, memory_order_relaxed);
	out->rx_ns = atomic_load_explicit(&z->rx_ns, memory_order_relaxed);
	out->on = atomic_load_explicit(&z->pub_on, memory_order_relaxed);
	out->why = (enum xp_zwhy)atomic_load_explicit(&z->why, memory_order_relaxed);
	out->flips = atomic_load_explicit(&z->flips, memory_order_relaxed);
	out->idle_pct = atomic_load_explicit(&z->idle_pct, memory_order_relaxed);
	out->ratio_pct = atomic_load_explicit(&z->pub_ratio, memory_order_relaxed) * 100 / 1024;
}
