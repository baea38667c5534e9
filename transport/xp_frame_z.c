// SPDX-License-Identifier: Apache-2.0
/* A resumable link's compressed chunks, on its worker: when direction 0 sends its held bytes as
 * ZDATA frames (xp_zchunk.h) and when as DATA (auto: only while its cap holds it back, its worker
 * has time and recent chunks shrank), and direction 1's decoding. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "util.h"
#include "xp_bucket.h"
#include "xp_pool_priv.h"
#include "xp_zchunk.h"

#define MS 1000000ull
/* A wait for tokens counts for this long after it ended. */
#define RECENT_NS (1000 * MS)
/* A worker starts compressing only when it waited at least this share of the last 100 ms (it
 * waits for the link, not the link for it); below the second, a compressing worker that nothing
 * held back is what the migration waited for (the reason then says so). */
#define IDLE_ON_PCT  30
#define IDLE_OFF_PCT 10
/* A chunk that keeps more than this share (of 1024) did not pay; this many in a row stop it */
#define BAD_RATIO	 900
#define BAD_RUN		 4
#define BACKOFF_FIRST_NS (250 * MS)
#define BACKOFF_MAX_NS	 (8000 * MS)

struct frame_z {
	_Atomic int mode; /* enum xp_zmode: the control thread may change it */
	struct xp_zenc *enc;
	struct xp_zdec *dec;
	/* direction 0: the chunk on its way, of plain bytes at the ring's head */
	uint8_t *obuf;
	size_t olen, ooff, oplain;
	/* direction 1: the chunk coming in, have bytes of it so far */
	uint8_t *ibuf;
	size_t ihave;
	/* auto: what it saw, what it decided */
	uint64_t throttled_ns, backoff_until, backoff_ns;
	unsigned int bad;
	unsigned int ratio; /* recent chunks' chunk / plain, of 1024 */
	bool on;
	/* for the control thread */
	_Atomic uint64_t tx_plain, tx_wire, tx_ns, rx_plain, rx_wire, rx_ns;
	_Atomic bool pub_on;
	_Atomic unsigned int why, flips, idle_pct, pub_ratio;
};

static uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int xp_frame_z_open(struct pool_link *l)
{
	struct frame_z *z;
	int r = -ENOMEM;

	l->z = NULL;
	if (!framed(l) || (l->opts.z.out == XP_Z_OFF && !l->opts.z.in))
		return 0;
	z = calloc(1, sizeof(*z));
	if (!z)
		return -ENOMEM;
	z->mode = l->opts.z.out;
	z->backoff_ns = BACKOFF_FIRST_NS;
	z->ratio = 1024;
	atomic_store_explicit(&z->pub_ratio, z->ratio, memory_order_relaxed);
	if (z->mode != XP_Z_OFF) {
		r = xp_zenc_new(l->opts.z.level, &z->enc);
		if (r < 0)
			goto fail;
		r = -ENOMEM;
		z->obuf = malloc(xp_zchunk_bound(XP_ZCHUNK_MAX));
		if (!z->obuf)
			goto fail;
	}
	if (l->opts.z.in) {
		r = xp_zdec_new(&z->dec);
		if (r < 0)
			goto fail;
		r = -ENOMEM;
		z->ibuf = malloc(XP_FRAME_ZMAX);
		if (!z->ibuf)
			goto fail;
	}
	l->z = z;
	return 0;
fail:
	l->z = z;
	xp_frame_z_close(l);
	return r;
}

void xp_frame_z_close(struct pool_link *l)
{
	struct frame_z *z = l->z;

	if (!z)
		return;
	xp_zenc_free(z->enc);
	xp_zdec_free(z->dec);
	free(z->obuf);
	free(z->ibuf);
	free(z);
	l->z = NULL;
}

void xp_frame_z_reset(struct pool_link *l)
{
	if (!l->z)
		return;
	l->z->olen = l->z->ooff = l->z->oplain = 0;
	l->z->ihave = 0;
	l->p[1].fin.zdata = false;
}

void xp_frame_z_note(struct pool_link *l, bool throttled)
{
	struct frame_z *z = l->z;

	if (z && throttled && z->mode == XP_Z_AUTO)
		z->throttled_ns = vm_now_ns();
}

/* auto: whether the next chunk goes compressed, and why (published when it changes). */
static bool decide(struct xp_worker *w, struct frame_z *z, uint64_t now)
{
	unsigned int idle = w->idle_pct;
	enum xp_zwhy why;
	bool on;

	if (z->mode == XP_Z_ALWAYS) {
		why = XP_ZWHY_ALWAYS;
		on = true;
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
		 * (the time compressing takes is then the worker's to spend). A full node hop alone
		 * is no such sign: a peer short of CPU fills it as well as a slow link does, and
		 * compressing then slows the migration (doc/performance.md, "Compression").
		 */
		why = XP_ZWHY_CAPPED;
		on = true;
	} else {
		/* nothing holds it back: compressing would only cost time, or (its worker busy)
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
static void judge(struct frame_z *z, size_t plain, size_t wire, uint64_t now)
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

size_t xp_frame_z_start(struct xp_worker *w, struct xp_pump *p, size_t avail)
{
	struct frame_z *z = p->link->z;
	size_t len = avail < XP_ZCHUNK_MAX ? avail : XP_ZCHUNK_MAX;
	uint64_t now, t0;
	ssize_t n;

	if (!z || z->mode == XP_Z_OFF || !p->ring || avail == 0)
		return 0;
	now = vm_now_ns();
	if (!decide(w, z, now))
		return 0;
	t0 = cpu_ns();
	/* the ring is mapped twice in a row: len bytes from its head are one run */
	n = xp_zenc_chunk(z->enc, p->buf + p->head, len, z->obuf, xp_zchunk_bound(XP_ZCHUNK_MAX));
	atomic_fetch_add_explicit(&z->tx_ns, cpu_ns() - t0, memory_order_relaxed);
	if (n <= 0)
		return 0; /* never for a len in range: sent as DATA then */
	judge(z, len, (size_t)n, now);
	z->olen = (size_t)n;
	z->ooff = 0;
	z->oplain = len;
	return z->olen;
}

ssize_t xp_frame_z_write(struct pool_link *l)
{
	struct xp_pump *p = &l->p[0];
	struct frame_z *z = l->z;
	ssize_t n = xp_frame_hop_write(l, z->obuf + z->ooff, z->olen - z->ooff, false);

	if (n < 0)
		return -1;
	z->ooff += (size_t)n;
	p->fout.left -= (uint64_t)n;
	if (p->fout.left > 0)
		return 0;
	p->fout.zdata = false;
	p->head = (p->head + z->oplain) % p->ring;
	p->held -= z->oplain;
	p->sent += z->oplain;
	/* a cap counts what the node hop carries: the bytes the chunk saved go back */
	if (p->shaped && z->oplain > z->olen)
		xp_bucket_refund(p->bucket, z->oplain - z->olen);
	atomic_fetch_add_explicit(&z->tx_plain, z->oplain, memory_order_relaxed);
	atomic_fetch_add_explicit(&z->tx_wire, z->olen, memory_order_relaxed);
	atomic_store_explicit(&l->pub_sent, p->sent, memory_order_relaxed);
	xp_frame_publish_kept(l);
	n = (ssize_t)z->oplain;
	z->olen = z->ooff = z->oplain = 0;
	return n;
}

ssize_t xp_frame_z_read(struct xp_worker *w, struct xp_pump *p, int src, uint8_t *dst)
{
	struct pool_link *l = p->link;
	struct frame_z *z = l->z;
	struct frame_in *f = &p->fin;
	uint8_t *out = dst ? dst : w->dg_peek;
	const char *why = NULL;
	ssize_t n, plain;
	uint64_t t0;
	size_t len;

	n = xp_frame_hop_read(p, src, z->ibuf + z->ihave, (size_t)f->left);
	if (n == 0)
		errno = ECONNRESET;
	if (n <= 0)
		return -1;
	z->ihave += (size_t)n;
	f->left -= (uint64_t)n;
	if (f->left > 0)
		return 0;
	f->zdata = false;
	len = z->ihave;
	z->ihave = 0;
	t0 = cpu_ns();
	plain = xp_zdec_chunk(z->dec, z->ibuf, len, out, XP_ZCHUNK_MAX, &why);
	atomic_fetch_add_explicit(&z->rx_ns, cpu_ns() - t0, memory_order_relaxed);
	if (plain < 0) {
		snprintf(l->res.detail, sizeof(l->res.detail),
			 "the peer sent a compressed chunk no vmigd writes (%zu bytes at stream "
			 "offset %llu): %s",
			 len, (unsigned long long)(xp_frame_in_done(p) + p->held),
			 why ? why : "no room");
		errno = EBADMSG;
		return -1;
	}
	atomic_fetch_add_explicit(&z->rx_plain, (uint64_t)plain, memory_order_relaxed);
	atomic_fetch_add_explicit(&z->rx_wire, len, memory_order_relaxed);
	if (dst)
		return plain;
	if (p->dg)
		vm_digest_update(p->dg, out, (size_t)plain);
	p->dropped += (uint64_t)plain;
	l->res.undelivered += (uint64_t)plain;
	return 0;
}

void xp_frame_z_set_mode(struct pool_link *l, int mode)
{
	if (l->z && atomic_load(&l->z->mode) != XP_Z_OFF && mode != XP_Z_OFF)
		atomic_store(&l->z->mode, mode);
}

void xp_frame_z_fig(const struct pool_link *l, struct xp_zfig *out)
{
	struct frame_z *z = l->z;

	if (!z)
		return;
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
