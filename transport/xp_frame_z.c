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
#include "xp_zlink.h"

struct frame_z {
	struct xp_zlink zl;
	/* direction 0: the chunk on its way, of plain bytes at the ring's head */
	uint8_t *obuf;
	size_t olen, ooff, oplain;
	/* direction 1: the chunk coming in, have bytes of it so far */
	uint8_t *ibuf;
	size_t ihave;
};

int xp_frame_z_open(struct pool_link *l)
{
	struct frame_z *z;
	int r;

	l->z = NULL;
	if (!framed(l) || (l->opts.z.out == XP_Z_OFF && !l->opts.z.in))
		return 0;
	z = calloc(1, sizeof(*z));
	if (!z)
		return -ENOMEM;
	r = xp_zlink_init(&z->zl, l->opts.z.out, l->opts.z.level, l->opts.z.in);
	if (r < 0) {
		free(z);
		return r;
	}
	l->z = z;
	if (l->opts.z.out != XP_Z_OFF && !(z->obuf = malloc(xp_zchunk_bound(XP_ZCHUNK_MAX))))
		goto fail;
	if (l->opts.z.in && !(z->ibuf = malloc(XP_FRAME_ZMAX)))
		goto fail;
	return 0;
fail:
	xp_frame_z_close(l);
	return -ENOMEM;
}

void xp_frame_z_close(struct pool_link *l)
{
	struct frame_z *z = l->z;

	if (!z)
		return;
	xp_zlink_fini(&z->zl);
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
	if (l->z)
		xp_zlink_note(&l->z->zl, throttled);
}

size_t xp_frame_z_start(struct xp_worker *w, struct xp_pump *p, size_t avail)
{
	struct frame_z *z = p->link->z;
	size_t len = avail < XP_ZCHUNK_MAX ? avail : XP_ZCHUNK_MAX;
	uint64_t now;
	ssize_t n;

	if (!z || !z->zl.enc || !p->ring || avail == 0)
		return 0;
	now = vm_now_ns();
	if (!xp_zlink_decide(&z->zl, w->idle_pct, now))
		return 0;
	/* the ring is mapped twice in a row: len bytes from its head are one run */
	n = xp_zlink_encode(&z->zl, p->buf + p->head, len, z->obuf, xp_zchunk_bound(XP_ZCHUNK_MAX),
			    now);
	if (n <= 0)
		return 0; /* never for a len in range: sent as DATA then */
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
	xp_zlink_sent(&z->zl, z->oplain, z->olen);
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
	plain = xp_zlink_decode(&z->zl, z->ibuf, len, out, XP_ZCHUNK_MAX, &why);
	if (plain < 0) {
		snprintf(l->res.detail, sizeof(l->res.detail),
			 "the peer sent a compressed chunk no vmigd writes (%zu bytes at stream "
			 "offset %llu): %s",
			 len, (unsigned long long)(xp_frame_in_done(p) + p->held),
			 why ? why : "no room");
		errno = EBADMSG;
		return -1;
	}
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
	if (l->z)
		xp_zlink_set_mode(&l->z->zl, mode);
}

void xp_frame_z_fig(const struct pool_link *l, struct xp_zfig *out)
{
	if (l->z)
		xp_zlink_fig(&l->z->zl, out);
}
