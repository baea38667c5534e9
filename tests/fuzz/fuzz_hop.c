// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for xp_hop, the node hop's sessions: the input is a run of datagrams (each
 * a flags byte, a big-endian u16 length, the bytes) handed to two peers' sessions, one plain and
 * one sealed with a key the fuzzer never learns. Sealed, every datagram from the peer is refused
 * and counted and no stream reads a byte; plain, streams stay within their buffers; from an
 * address that is no peer's, nothing but a count either way. */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "xp_hop.h"

#define IP_PEER	    0x0a000002u
#define IP_STRANGER 0x0a0000ffu
#define BUDGET	    (64u << 10)

/* The port: what the test hands it is what poll gives; what the hop sends goes nowhere. */
struct port {
	uint8_t *data;
	size_t len;
	uint32_t from;
	bool pending;
};

static int port_send(void *port, uint32_t ip, uint16_t udp_port, const void *data, size_t len,
		     uint64_t now_us)
{
	(void)port;
	(void)ip;
	(void)udp_port;
	(void)data;
	(void)len;
	(void)now_us;
	return 0;
}

static int port_poll(void *port, xp_hop_rx_fn fn, void *arg)
{
	struct port *p = port;

	if (!p->pending)
		return 0;
	p->pending = false;
	fn(arg, p->from, 4790, p->data, p->len);
	return 1;
}

static const struct xp_hop_port_ops ops = { .send = port_send, .poll = port_poll };

struct side {
	struct port port;
	struct xp_hop *h;
	struct xp_hop_peer *peer;
	struct xp_rel *r[2];
};

static void side_new(struct side *s, bool sealed)
{
	static const uint8_t tx[XP_SEAL_SECRET] = "ours, for sending";
	static const uint8_t rx[XP_SEAL_SECRET] = "the peer's: the fuzzer's unknown";
	struct xp_hop_conf c = {
		.ops = &ops, .port = &s->port, .mss = 1024, .max_peers = 1, .max_streams = 2
	};
	struct xp_hop_peer_conf pc = { .ip = IP_PEER, .udp_port = 4790, .budget = BUDGET };

	memset(s, 0, sizeof(*s));
	if (sealed) {
		pc.tx_secret = tx;
		pc.rx_secret = rx;
	}
	FUZZ_CHECK(xp_hop_new(&c, &s->h) == 0);
	FUZZ_CHECK(xp_hop_peer_add(s->h, &pc, &s->peer) == 0);
	FUZZ_CHECK(xp_hop_stream_open(s->peer, 1, 0, &s->r[0]) == 0);
	FUZZ_CHECK(xp_hop_stream_open(s->peer, 2, 0, &s->r[1]) == 0);
	FUZZ_CHECK(xp_rel_write(s->r[0], "some bytes to send", 18) == 18);
}

/* One datagram to a side, in a copy of its own (opening works in place). */
static void deliver(struct side *s, const uint8_t *data, size_t len, uint32_t from, uint64_t now)
{
	uint8_t *copy = malloc(len ? len : 1);

	FUZZ_CHECK(copy != NULL);
	memcpy(copy, data, len);
	s->port.data = copy;
	s->port.len = len;
	s->port.from = from;
	s->port.pending = true;
	xp_hop_step(s->h, now);
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct side plain, sealed;
	struct xp_hop_peer_stats ps;
	struct xp_rel_stats rs;
	uint64_t now = 1, from_peer = 0, strangers = 0;
	uint8_t out[256];
	size_t off = 0;

	side_new(&plain, false);
	side_new(&sealed, true);
	while (off + 3 <= size) {
		uint8_t flags = data[off];
		size_t len = (size_t)data[off + 1] << 8 | data[off + 2];
		uint32_t from = flags & 1 ? IP_STRANGER : IP_PEER;

		off += 3;
		if (len > size - off)
			len = size - off;
		if (flags & 2)
			now += 300000; /* timers fire: retransmissions, probes */
		deliver(&plain, data + off, len, from, now);
		deliver(&sealed, data + off, len, from, now);
		if (from == IP_PEER)
			from_peer++;
		else
			strangers++;
		off += len;
		now++;
	}
	for (int i = 0; i < 2; i++) {
		FUZZ_CHECK(xp_rel_read(sealed.r[i], out, sizeof(out)) == 0);
		FUZZ_CHECK(!xp_rel_eof(sealed.r[i]));
		while (xp_rel_read(plain.r[i], out, sizeof(out)) > 0)
			;
		xp_rel_stats(plain.r[i], &rs);
		FUZZ_CHECK(rs.held <= BUDGET / 2);
	}
	xp_hop_peer_stats(sealed.peer, &ps);
	FUZZ_CHECK(ps.frames_in == from_peer);
	FUZZ_CHECK(ps.forged + ps.replayed + ps.too_old + ps.malformed + ps.unknown_stream ==
		   from_peer);
	FUZZ_CHECK(xp_hop_unknown_peer(sealed.h) == strangers);
	FUZZ_CHECK(xp_hop_unknown_peer(plain.h) == strangers);
	xp_hop_peer_stats(plain.peer, &ps);
	FUZZ_CHECK(ps.frames_in == from_peer);
	xp_hop_free(plain.h);
	xp_hop_free(sealed.h);
	return 0;
}
