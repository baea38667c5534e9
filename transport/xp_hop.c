// SPDX-License-Identifier: Apache-2.0
/* The kernel-bypass node hop's sessions: peers, their streams, sealing, demultiplexing and the
 * send/receive round over a datagram port (xp_hop.h). Everything is allocated when a peer or a
 * stream is added; a step allocates nothing. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "xp_hop.h"

struct hop_stream {
	uint32_t id;
	struct xp_rel *r;
};

struct xp_hop_peer {
	struct xp_hop *h;
	bool used;
	uint32_t ip;
	uint16_t udp_port;
	uint32_t first, last;	 /* the stream ids it takes (0 and UINT32_MAX: all) */
	struct xp_seal *tx, *rx; /* both NULL: plain */
	uint32_t stream_buf;
	uint64_t pn; /* the packet numbers of all its streams' frames: this direction's nonces */
	struct hop_stream *st;
	unsigned int nst, rr;
	struct xp_hop_peer_stats stats;
};

struct xp_hop {
	struct xp_hop_conf conf;
	struct xp_hop_peer *peers;
	uint8_t *frame; /* one frame being built: header, payload, tag */
	size_t frame_cap;
	uint64_t now, unknown_peer;
	unsigned int rr;
	unsigned int hw; /* peers[hw..] are all unused: what lookups and steps scan */
};

int xp_hop_new(const struct xp_hop_conf *conf, struct xp_hop **ret)
{
	struct xp_hop *h;

	if (!conf->ops || !conf->ops->send || !conf->ops->poll || conf->mss < 64 ||
	    conf->mss > 65535 || !conf->max_peers || !conf->max_streams ||
	    !conf->ops->frame != !conf->ops->frame_send || !conf->ops->frame != !conf->ops->flush)
		return -EINVAL;
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->conf = *conf;
	h->frame_cap = XP_REL_MAX_HDR + conf->mss + XP_SEAL_TAG;
	h->frame = malloc(h->frame_cap);
	h->peers = calloc(conf->max_peers, sizeof(*h->peers));
	if (!h->frame || !h->peers) {
		xp_hop_free(h);
		return -ENOMEM;
	}
	*ret = h;
	return 0;
}

static void peer_clear(struct xp_hop_peer *p)
{
	for (unsigned int i = 0; i < p->nst; i++)
		xp_rel_free(p->st[i].r);
	free(p->st);
	xp_seal_free(p->tx);
	xp_seal_free(p->rx);
	memset(p, 0, sizeof(*p));
}

void xp_hop_free(struct xp_hop *h)
{
	if (!h)
		return;
	for (unsigned int i = 0; h->peers && i < h->conf.max_peers; i++)
		if (h->peers[i].used)
			peer_clear(&h->peers[i]);
	free(h->peers);
	free(h->frame);
	free(h);
}

/* The peer at ip that takes stream ids first .. last (one id: first == last), or NULL. */
static struct xp_hop_peer *peer_find(struct xp_hop *h, uint32_t ip, uint32_t first, uint32_t last)
{
	for (unsigned int i = 0; i < h->hw; i++) {
		struct xp_hop_peer *p = &h->peers[i];

		if (p->used && p->ip == ip && first <= p->last && p->first <= last)
			return p;
	}
	return NULL;
}

int xp_hop_peer_add(struct xp_hop *h, const struct xp_hop_peer_conf *conf, struct xp_hop_peer **ret)
{
	struct xp_hop_peer *p = NULL;
	int r = -ENOMEM;

	uint32_t first = conf->first_stream ? conf->first_stream : 0;
	uint32_t last =
		conf->first_stream ? conf->first_stream + h->conf.max_streams - 1 : UINT32_MAX;

	if (!conf->ip || !!conf->tx_secret != !!conf->rx_secret ||
	    conf->budget / h->conf.max_streams < 2 * h->conf.mss || last < first)
		return -EINVAL;
	if (peer_find(h, conf->ip, first, last))
		return -EEXIST;
	for (unsigned int i = 0; i < h->conf.max_peers && !p; i++)
		if (!h->peers[i].used)
			p = &h->peers[i];
	if (!p)
		return -ENOSPC;
	p->h = h;
	p->used = true;
	if ((unsigned int)(p - h->peers) >= h->hw)
		h->hw = (unsigned int)(p - h->peers) + 1;
	p->ip = conf->ip;
	p->udp_port = conf->udp_port;
	p->first = first;
	p->last = last;
	p->stream_buf = conf->budget / h->conf.max_streams;
	p->st = calloc(h->conf.max_streams, sizeof(*p->st));
	if (!p->st)
		goto fail;
	if (conf->tx_secret) {
		r = xp_seal_new(conf->tx_secret, false, 0, &p->tx);
		if (!r)
			r = xp_seal_new(conf->rx_secret, true, 0, &p->rx);
		if (r)
			goto fail;
	}
	*ret = p;
	return 0;
fail:
	xp_hop_peer_remove(h, p);
	return r;
}

void xp_hop_peer_remove(struct xp_hop *h, struct xp_hop_peer *p)
{
	peer_clear(p);
	while (h->hw && !h->peers[h->hw - 1].used)
		h->hw--;
}

struct xp_rel *xp_hop_stream(const struct xp_hop_peer *p, uint32_t id)
{
	for (unsigned int i = 0; i < p->nst; i++)
		if (p->st[i].id == id)
			return p->st[i].r;
	return NULL;
}

int xp_hop_stream_open(struct xp_hop_peer *p, uint32_t id, uint64_t now_us, struct xp_rel **ret)
{
	struct xp_rel_cfg cfg = {
		.stream = id,
		.mss = p->h->conf.mss,
		.sndbuf = p->stream_buf,
		.rcvbuf = p->stream_buf,
		.peer_rcvbuf = p->stream_buf, /* both ends split the same budget the same way */
		.pn_space = &p->pn,
	};
	int r;

	if (!id || id < p->first || id > p->last)
		return -EINVAL;
	if (xp_hop_stream(p, id))
		return -EEXIST;
	if (p->nst == p->h->conf.max_streams)
		return -ENOSPC;
	r = xp_rel_new(&cfg, now_us, &p->st[p->nst].r);
	if (r)
		return r;
	p->st[p->nst].id = id;
	*ret = p->st[p->nst++].r;
	return 0;
}

void xp_hop_peer_stats(const struct xp_hop_peer *p, struct xp_hop_peer_stats *st)
{
	*st = p->stats;
	for (unsigned int i = 0; i < p->nst; i++) {
		struct xp_rel_stats rs;

		xp_rel_stats(p->st[i].r, &rs);
		st->retransmitted_frames += rs.retransmitted_frames;
		st->timeouts += rs.timeouts;
		st->fast_recoveries += rs.fast_recoveries;
	}
}

uint64_t xp_hop_unknown_peer(const struct xp_hop *h)
{
	return h->unknown_peer;
}

/* One datagram from the port: from a peer, opened if sealed, parsed, to its stream. */
static void on_datagram(void *arg, uint32_t ip, uint16_t port, uint8_t *data, size_t len)
{
	struct xp_hop *h = arg;
	/* The stream id is in clear (authenticated, not encrypted): it picks the peer, whose keys
	 * then open the frame. A datagram too short to hold one reaches only a peer that takes
	 * every id, which refuses it as malformed. */
	uint32_t id = len >= 8 ? vm_get_be32(data + 4) : 0;
	struct xp_hop_peer *p = peer_find(h, ip, id, id);
	struct xp_rel_hdr hdr;
	struct xp_rel *r;
	const char *why;

	(void)port;
	if (!p) {
		h->unknown_peer++;
		return;
	}
	p->stats.frames_in++;
	if (p->rx) {
		uint64_t pn;
		size_t hl;
		int e;

		if (xp_rel_peek(data, len, &pn, &hl) || hl + XP_SEAL_TAG > len) {
			p->stats.malformed++;
			return;
		}
		e = xp_open(p->rx, pn, data, hl, data + hl, len - hl - XP_SEAL_TAG,
			    data + len - XP_SEAL_TAG);
		if (e) {
			if (e == -EALREADY)
				p->stats.replayed++;
			else if (e == -ESTALE)
				p->stats.too_old++;
			else
				p->stats.forged++;
			return;
		}
		len -= XP_SEAL_TAG;
	}
	if (xp_rel_parse(data, len, &hdr, &why)) {
		p->stats.malformed++;
		return;
	}
	r = xp_hop_stream(p, hdr.stream);
	if (!r) {
		p->stats.unknown_stream++;
		return;
	}
	xp_rel_input(r, h->now, &hdr);
}

/*
 * Where the next frame is built: in the port's own buffer when it lends one big enough (the frame
 * is then sealed in place and never copied), else in h->frame. 0, or -EAGAIN when the port has
 * no buffer for this peer now.
 */
static int frame_buf(struct xp_hop *h, const struct xp_hop_peer *p, uint8_t **buf, size_t *cap,
		     bool *lent)
{
	const struct xp_hop_port_ops *ops = h->conf.ops;

	*lent = false;
	if (ops->frame) {
		int e = ops->frame(h->conf.port, p->ip, h->now, buf, cap);

		if (e)
			return e;
		if (*cap >= h->frame_cap) {
			*cap = h->frame_cap;
			*lent = true;
			return 0;
		}
	}
	*buf = h->frame;
	*cap = h->frame_cap;
	return 0;
}

/* A frame from each of p's streams in turn while any has one. 1 when the port filled up. */
static int peer_send(struct xp_hop *h, struct xp_hop_peer *p, int *moved)
{
	const struct xp_hop_port_ops *ops = h->conf.ops;
	unsigned int busy = p->nst;
	uint8_t *buf;
	size_t n, cap;
	bool lent;
	int e;

	while (busy) {
		struct xp_rel *r = p->st[p->rr].r;

		if (frame_buf(h, p, &buf, &cap, &lent)) {
			p->stats.port_busy++;
			return 1;
		}
		p->rr = (p->rr + 1) % p->nst;
		n = xp_rel_next_frame(r, h->now, buf, cap - XP_SEAL_TAG);
		if (!n) {
			busy--;
			continue; /* a lent buffer stays the port's, for the next frame */
		}
		busy = p->nst;
		if (p->tx) {
			uint64_t pn;
			size_t hl;

			/* xp_rel wrote the header: peek cannot fail, and pn rises (pn_space) */
			if (xp_rel_peek(buf, n, &pn, &hl) ||
			    xp_seal(p->tx, pn, buf, hl, buf + hl, n - hl, buf + n))
				continue; /* never sent: xp_rel finds it lost and sends it again */
			n += XP_SEAL_TAG;
		}
		(*moved)++;
		if (lent)
			e = ops->frame_send(h->conf.port, p->udp_port, n, p->tx != NULL);
		else
			e = ops->send(h->conf.port, p->ip, p->udp_port, buf, n, h->now);
		if (e == -EAGAIN) {
			p->stats.port_busy++; /* the frame(s) count as lost; the rest wait */
			return 1;
		}
		p->stats.frames_out++;
	}
	return 0;
}

int xp_hop_step(struct xp_hop *h, uint64_t now_us)
{
	int moved;

	h->now = now_us;
	moved = h->conf.ops->poll(h->conf.port, on_datagram, h);
	for (unsigned int i = 0; i < h->hw; i++) {
		struct xp_hop_peer *p = &h->peers[(h->rr + i) % h->hw];

		if (p->used && p->nst && peer_send(h, p, &moved))
			break;
	}
	h->rr = h->hw ? (h->rr + 1) % h->hw : 0; /* no peer always first */
	if (h->conf.ops->flush)
		h->conf.ops->flush(h->conf.port);
	return moved;
}

uint64_t xp_hop_deadline(const struct xp_hop *h)
{
	uint64_t d = UINT64_MAX;

	for (unsigned int i = 0; i < h->hw; i++)
		for (unsigned int j = 0; h->peers[i].used && j < h->peers[i].nst; j++) {
			uint64_t t = xp_rel_deadline(h->peers[i].st[j].r);

			d = t < d ? t : d;
		}
	return d;
}
