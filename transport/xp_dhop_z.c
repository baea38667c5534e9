// SPDX-License-Identifier: Apache-2.0
/* Compressed chunks on the DPDK node hop (c.z): a compressing direction's stream is made of
 * xp_zchunk records only (zstd, or stored when auto decides against it), kept in the stream's
 * send buffer until the peer acknowledged them whole, so that a fallback can hand on plain bytes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "xp_bucket.h"
#include "xp_dhop_priv.h"
#include "xp_zchunk.h"
#include "xp_zlink.h"

#define CHUNK_BOUND (XP_ZCHUNK_HDR + XP_ZCHUNK_MAX)

struct dhop_z {
	struct xp_zlink zl;
	/* sending: QEMU's bytes for the next chunk, the chunk; what the stream still holds of
	 * the chunks sent starts at plain offset keep_plain */
	uint8_t *pbuf, *cbuf;
	uint64_t keep_plain;
	/* receiving: the chunk coming in (have of need bytes; need 0: its header not yet), and
	 * the plain bytes it decoded to, written up to ooff */
	uint8_t *ibuf, *obuf;
	size_t ihave, ineed, olen, ooff;
};

int xp_dhop_z_new(const struct xp_dhop_link_conf *c, struct dhop_z **ret)
{
	struct dhop_z *z;
	int r;

	*ret = NULL;
	if (c->z.out == XP_Z_OFF && !c->z.in)
		return 0;
	if (!c->resumable)
		return -EINVAL; /* a fallback hands on plain bytes: only with resumption */
	z = calloc(1, sizeof(*z));
	if (!z)
		return -ENOMEM;
	r = xp_zlink_init(&z->zl, c->z.out, c->z.level, c->z.in);
	if (r < 0) {
		free(z);
		return r;
	}
	if ((c->z.out != XP_Z_OFF &&
	     (!(z->pbuf = malloc(XP_ZCHUNK_MAX)) || !(z->cbuf = malloc(CHUNK_BOUND)))) ||
	    (c->z.in && (!(z->ibuf = malloc(CHUNK_BOUND)) || !(z->obuf = malloc(XP_ZCHUNK_MAX))))) {
		xp_dhop_z_free(z);
		return -ENOMEM;
	}
	*ret = z;
	return 0;
}

void xp_dhop_z_free(struct dhop_z *z)
{
	if (!z)
		return;
	xp_zlink_fini(&z->zl);
	free(z->pbuf);
	free(z->cbuf);
	free(z->ibuf);
	free(z->obuf);
	free(z);
}

bool xp_dhop_z_out(const struct dhop_link *l)
{
	return l->z && l->z->zl.enc;
}

bool xp_dhop_z_in(const struct dhop_link *l)
{
	return l->z && l->z->zl.dec;
}

void xp_dhop_z_fig(const struct dhop_link *l, struct xp_zfig *out)
{
	if (l->z)
		xp_zlink_fig(&l->z->zl, out);
}

void xp_dhop_z_set_mode(struct dhop_link *l, int mode)
{
	if (l->z)
		xp_zlink_set_mode(&l->z->zl, mode);
}

/* The n bytes at stream offset off of what the stream holds (from, spans iov) into buf. */
static void kept_copy(const struct iovec iov[2], uint64_t from, uint64_t off, void *buf, size_t n)
{
	size_t at = (size_t)(off - from), a = 0;

	if (at < iov[0].iov_len) {
		a = iov[0].iov_len - at < n ? iov[0].iov_len - at : n;
		memcpy(buf, (uint8_t *)iov[0].iov_base + at, a);
		at = 0;
	} else {
		at -= iov[0].iov_len;
	}
	if (n > a)
		memcpy((uint8_t *)buf + a, (uint8_t *)iov[1].iov_base + at, n - a);
}

/* Whether a whole chunk of the n held bytes (from, spans iov) starts at off: *h its header.
 * Only the end of what is held stops it: this thread wrote them. */
static bool chunk_at(const struct iovec iov[2], uint64_t from, size_t n, uint64_t off,
		     struct xp_zchunk_hdr *h)
{
	uint8_t hb[XP_ZCHUNK_HDR];
	const char *why;

	if (off + XP_ZCHUNK_HDR > from + n)
		return false;
	kept_copy(iov, from, off, hb, sizeof(hb));
	return xp_zchunk_parse(hb, sizeof(hb), h, &why) == 0 &&
	       off + XP_ZCHUNK_HDR + h->payload <= from + n;
}

void xp_dhop_z_release(struct dhop_link *l)
{
	struct dhop_z *z = l->z;
	struct xp_zchunk_hdr h;
	struct iovec iov[2];
	uint64_t from, acked = xp_rel_acked(l->rel);
	size_t n = xp_rel_kept(l->rel, &from, iov);
	uint64_t off = from;

	/* every chunk the peer acknowledged whole goes */
	while (chunk_at(iov, from, n, off, &h) && off + XP_ZCHUNK_HDR + h.payload <= acked) {
		off += XP_ZCHUNK_HDR + h.payload;
		z->keep_plain += h.plain;
	}
	xp_rel_release(l->rel, off);
	atomic_store_explicit(&l->acked, z->keep_plain, memory_order_relaxed);
}

size_t xp_dhop_z_send(struct dhop_link *l)
{
	struct dhop_z *z = l->z;
	struct iovec iov[2];
	size_t moved = 0, room;
	uint64_t now;
	ssize_t k, n;

	while (l->in_ready && !l->local_in_done && !l->falling &&
	       (room = xp_rel_write_space(l->rel, iov)) > XP_ZCHUNK_HDR) {
		size_t want = room - XP_ZCHUNK_HDR, grant;
		uint64_t held =
			atomic_load_explicit(&l->bytes[0], memory_order_relaxed) - z->keep_plain;

		/* the plain bytes of the chunks held are what a fallback hands the kernel path,
		 * which keeps at most c.keep */
		if (held >= l->c.keep)
			break;
		want = want < XP_ZCHUNK_MAX ? want : XP_ZCHUNK_MAX;
		want = want < l->c.keep - held ? want : (size_t)(l->c.keep - held);
		grant = xp_dhop_shape(l, want);
		xp_zlink_note(&z->zl, grant < want);
		if (!grant)
			break;
		k = read(l->c.local_fd, z->pbuf, grant);
		if (k <= 0) {
			xp_bucket_refund(l->c.bucket, grant);
			xp_dhop_read_none(l, k);
			break;
		}
		now = vm_now_ns();
		if (xp_zlink_decide(&z->zl,
				    atomic_load_explicit(&l->d->idle_pct, memory_order_relaxed),
				    now)) {
			n = xp_zlink_encode(&z->zl, z->pbuf, (size_t)k, z->cbuf, CHUNK_BOUND, now);
			if (n > 0)
				xp_zlink_sent(&z->zl, (size_t)k, (size_t)n);
		} else {
			n = xp_zchunk_pass(z->pbuf, (size_t)k, z->cbuf, CHUNK_BOUND);
		}
		if (n <= 0) { /* never for a length in range */
			xp_dhop_link_fail(l, -EPROTO, 1, "DPDK hop: cannot make a chunk");
			break;
		}
		/* a cap counts what the node hop carries: what the chunk saved goes back */
		if (grant > (size_t)n)
			xp_bucket_refund(l->c.bucket, grant - (size_t)n);
		xp_rel_write(l->rel, z->cbuf, (size_t)n); /* it fits: room > grant + header */
		iov[0] = (struct iovec){ z->pbuf, (size_t)k };
		iov[1] = (struct iovec){ NULL, 0 };
		xp_dhop_tap_feed(l, 0, iov, (size_t)k);
		xp_dhop_digest_feed(l, 0, iov, (size_t)k);
		atomic_fetch_add_explicit(&l->bytes[0], (uint64_t)k, memory_order_relaxed);
		moved += (size_t)k;
		if ((size_t)k < grant)
			break;
	}
	return moved;
}

/* Gathers the next chunk from the stream into ibuf: true once it is whole. */
static bool gather(struct dhop_link *l)
{
	struct dhop_z *z = l->z;
	struct xp_zchunk_hdr h;
	struct iovec iov[2];
	const char *why = NULL;
	size_t n;

	for (;;) {
		size_t need = z->ineed ? z->ineed : XP_ZCHUNK_HDR;

		if (z->ihave == need && z->ineed)
			return true;
		if (z->ihave == need) {
			if (xp_zchunk_parse(z->ibuf, z->ihave, &h, &why) < 0) {
				xp_dhop_link_fail(
					l, -EBADMSG, 1,
					"the peer sent a compressed chunk no vmigd writes "
					"(at stream offset %llu): %s",
					(unsigned long long)atomic_load(&l->bytes[1]), why);
				return false;
			}
			z->ineed = XP_ZCHUNK_HDR + h.payload;
			continue;
		}
		if (!xp_rel_read_space(l->rel, iov))
			return false;
		n = need - z->ihave;
		n = xp_rel_read(l->rel, z->ibuf + z->ihave, n);
		z->ihave += n;
	}
}

size_t xp_dhop_z_recv(struct dhop_link *l)
{
	struct dhop_z *z = l->z;
	struct iovec iov[2];
	const char *why = NULL;
	size_t moved = 0;
	ssize_t k;

	while (!l->local_out_done) {
		if (z->ooff == z->olen) {
			if (!gather(l))
				break;
			k = xp_zlink_decode(&z->zl, z->ibuf, z->ihave, z->obuf, XP_ZCHUNK_MAX,
					    &why);
			if (k < 0) {
				xp_dhop_link_fail(
					l, -EBADMSG, 1,
					"the peer sent a compressed chunk no vmigd writes "
					"(%zu bytes at stream offset %llu): %s",
					z->ihave, (unsigned long long)atomic_load(&l->bytes[1]),
					why ? why : "no room");
				break;
			}
			z->ihave = z->ineed = 0;
			z->olen = (size_t)k;
			z->ooff = 0;
		}
		iov[0] = (struct iovec){ z->obuf + z->ooff, z->olen - z->ooff };
		iov[1] = (struct iovec){ NULL, 0 };
		if (l->drop_rx) {
			xp_dhop_digest_feed(l, 1, iov, iov[0].iov_len);
			l->res.undelivered += iov[0].iov_len;
			z->ooff = z->olen;
			continue;
		}
		if (!l->out_ready)
			break;
		k = write(l->c.local_fd, iov[0].iov_base, iov[0].iov_len);
		if (k > 0) {
			xp_dhop_tap_feed(l, 1, iov, (size_t)k);
			xp_dhop_digest_feed(l, 1, iov, (size_t)k);
			z->ooff += (size_t)k;
			atomic_fetch_add_explicit(&l->bytes[1], (uint64_t)k, memory_order_relaxed);
			moved += (size_t)k;
			continue;
		}
		if (xp_dhop_write_none(l, k))
			continue;
		break;
	}
	return moved;
}

bool xp_dhop_z_drained(const struct dhop_link *l)
{
	return !xp_dhop_z_in(l) || l->z->ooff == l->z->olen;
}

bool xp_dhop_z_eof(const struct dhop_link *l)
{
	return xp_dhop_z_drained(l) && (!xp_dhop_z_in(l) || l->z->ihave == 0);
}

int xp_dhop_z_kept(struct dhop_link *l, uint8_t **ret, size_t *len)
{
	struct dhop_z *z = l->z;
	struct xp_zdec *dec = NULL;
	struct xp_zchunk_hdr h;
	struct iovec iov[2];
	uint8_t *plain = NULL, *rec = NULL;
	const char *why;
	uint64_t from, off, sent = atomic_load(&l->bytes[0]);
	size_t n = xp_rel_kept(l->rel, &from, iov), total = (size_t)(sent - z->keep_plain), at = 0;
	ssize_t k;
	int r = -ENOMEM;

	*ret = NULL;
	*len = 0;
	if (!total)
		return 0;
	if (!(plain = malloc(total)) || !(rec = malloc(CHUNK_BOUND)) || xp_zdec_new(&dec) < 0)
		goto out;
	r = -EPROTO; /* the chunks are this thread's own: never, unless it has a bug */
	for (off = from; off < from + n; off += XP_ZCHUNK_HDR + h.payload) {
		if (!chunk_at(iov, from, n, off, &h) || at + h.plain > total)
			goto out;
		kept_copy(iov, from, off, rec, XP_ZCHUNK_HDR + h.payload);
		k = xp_zdec_chunk(dec, rec, XP_ZCHUNK_HDR + h.payload, plain + at, total - at,
				  &why);
		if (k != (ssize_t)h.plain)
			goto out;
		at += (size_t)k;
	}
	if (at != total)
		goto out;
	*ret = plain;
	*len = total;
	plain = NULL;
	r = 0;
out:
	xp_zdec_free(dec);
	free(rec);
	free(plain);
	return r;
}
