// SPDX-License-Identifier: Apache-2.0
/* One xp_rel stream over a DPDK port (xp_dpdk), sealed with xp_seal when given a secret: the
 * sender writes a known pattern, the receiver checks every byte. For the DPDK node hop's tests and
 * benchmarks until proxy/ carries migrations over it. Prints one JSON line; exits 77 when this
 * build has no DPDK. */
#include <errno.h>
#include <getopt.h>
#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xp_dpdk.h"
#include "xp_rel.h"
#include "xp_seal.h"

#define MARKER "VMIGD-CLEAR-TEXT-MARKER"

struct ctx {
	struct xp_dpdk *d;
	struct xp_rel *r;
	struct xp_seal *tx, *rx;
	uint32_t peer;
	uint16_t port;
	unsigned int loss_pct;
	uint32_t rng;
	uint64_t now, dropped_by_test, refused_frames, got;
	bool hello; /* a datagram from the peer arrived */
};

static uint64_t now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static double cpu_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The stream's bytes repeat every PERIOD: a pattern with a marker at every 4 KiB that a capture
 * can look for, made once, so that writing and checking cost a copy and a memcmp, not the
 * transport's own figures. pat holds a period and one more read's worth, for any offset. */
#define PERIOD (1u << 20)
static uint8_t pat[PERIOD + 65536];

static void make_pattern(void)
{
	for (uint64_t off = 0; off < sizeof(pat); off++) {
		uint64_t o = off % PERIOD, in_page = o % 4096;

		pat[off] = in_page < sizeof(MARKER) - 1 ? (uint8_t)MARKER[in_page]
							 : (uint8_t)((o * 0x9e3779b97f4a7c15ull) >> 56);
	}
}

static void on_rx(void *arg, uint32_t ip, uint16_t port, uint8_t *data, size_t len)
{
	struct ctx *c = arg;
	struct xp_rel_hdr h;
	const char *why;
	size_t hl;

	(void)port;
	if (ip != c->peer)
		return;
	c->hello = true;
	if (!len)
		return; /* a hello */
	c->rng = c->rng * 1103515245 + 12345;
	if (c->loss_pct && (c->rng >> 16) % 100 < c->loss_pct) {
		c->dropped_by_test++;
		return;
	}
	if (c->rx) {
		uint64_t pn;

		if (xp_rel_peek(data, len, &pn, &hl) || hl + XP_SEAL_TAG > len) {
			c->refused_frames++;
			return;
		}
		if (xp_open(c->rx, pn, data, hl, data + hl, len - hl - XP_SEAL_TAG,
			    data + len - XP_SEAL_TAG)) {
			c->refused_frames++;
			return;
		}
		len -= XP_SEAL_TAG;
	}
	if (xp_rel_parse(data, len, &h, &why)) {
		c->refused_frames++;
		return;
	}
	xp_rel_input(c->r, c->now, &h);
}

/* Sends what the stream has to send; a frame the port cannot take now counts as lost. */
static int transmit(struct ctx *c, uint8_t *buf, size_t cap)
{
	size_t n;
	int sent = 0;

	while ((n = xp_rel_next_frame(c->r, c->now, buf, cap - XP_SEAL_TAG)) > 0) {
		if (c->tx) {
			uint64_t pn;
			size_t hl;

			if (xp_rel_peek(buf, n, &pn, &hl) ||
			    xp_seal(c->tx, pn, buf, hl, buf + hl, n - hl, buf + n))
				return -EIO;
			n += XP_SEAL_TAG;
		}
		xp_dpdk_send(c->d, c->peer, c->port, buf, n, c->now);
		sent++;
	}
	return sent;
}

static int hex_secret(const char *s, uint8_t out[XP_SEAL_SECRET])
{
	if (strlen(s) != 2 * XP_SEAL_SECRET)
		return -1;
	for (int i = 0; i < XP_SEAL_SECRET; i++)
		if (sscanf(s + 2 * i, "%2hhx", &out[i]) != 1)
			return -1;
	return 0;
}

int main(int argc, char **argv)
{
	struct xp_dpdk_conf conf = { .udp_port = 4790 };
	struct xp_rel_cfg rc = { .stream = 1, .mss = 1344, .sndbuf = 4 << 20, .rcvbuf = 4 << 20 };
	struct ctx c = { .rng = 12345, .port = 4790 };
	struct xp_rel_stats rs;
	struct xp_dpdk_stats ds;
	struct xp_seal_stats ss = { 0 };
	uint64_t send = 0, receive = 0, written = 0, checked = 0, start, t_end = 0, bad = 0;
	uint64_t timeout_s = 120, idle = 0, sleeps = 0;
	uint8_t secret[XP_SEAL_SECRET], buf[2048], app[65536];
	bool sealed = false, sender;
	char err[256] = "";
	struct in_addr a;
	double cpu0;
	int opt, r;
	static const struct option longopts[] = {
		{ "eal", required_argument, NULL, 'e' },
		{ "address", required_argument, NULL, 'a' },
		{ "peer", required_argument, NULL, 'p' },
		{ "port", required_argument, NULL, 'P' },
		{ "send", required_argument, NULL, 's' },
		{ "receive", required_argument, NULL, 'r' },
		{ "secret", required_argument, NULL, 'k' },
		{ "loss", required_argument, NULL, 'l' },
		{ "timeout", required_argument, NULL, 't' },
		{ NULL, 0, NULL, 0 },
	};

	while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (opt) {
		case 'e':
			conf.eal = optarg;
			break;
		case 'a':
			conf.address = optarg;
			break;
		case 'p':
			if (inet_pton(AF_INET, optarg, &a) != 1)
				goto usage;
			c.peer = ntohl(a.s_addr);
			break;
		case 'P':
			c.port = conf.udp_port = (uint16_t)atoi(optarg);
			break;
		case 's':
			send = strtoull(optarg, NULL, 0);
			break;
		case 'r':
			receive = strtoull(optarg, NULL, 0);
			break;
		case 'k':
			if (hex_secret(optarg, secret))
				goto usage;
			sealed = true;
			break;
		case 'l':
			c.loss_pct = (unsigned int)atoi(optarg);
			break;
		case 't':
			timeout_s = strtoull(optarg, NULL, 0);
			break;
		default:
			goto usage;
		}
	}
	if (!xp_dpdk_built()) {
		printf("dpdk-stream: skipped: this build has no DPDK (meson setup "
		       "-Ddpdk=enabled)\n");
		return 77;
	}
	if (!conf.eal || !conf.address || !c.peer || !(send || receive) || (send && receive))
		goto usage;
	sender = send > 0;
	make_pattern();
	r = xp_dpdk_open(&conf, &c.d, err, sizeof(err));
	if (r) {
		fprintf(stderr, "dpdk-stream: %s\n", err);
		return 1;
	}
	if (xp_rel_new(&rc, now_us(), &c.r) || (sealed && (xp_seal_new(secret, false, 0, &c.tx) ||
							   xp_seal_new(secret, true, 0, &c.rx)))) {
		fprintf(stderr, "dpdk-stream: out of memory\n");
		return 1;
	}
	if (!sender)
		xp_rel_shutdown(c.r); /* nothing flows back but acknowledgements */
	/* ARP, and a peer that is there: hellos (empty datagrams) until one comes back. */
	start = now_us();
	while (!c.hello) {
		c.now = now_us();
		xp_dpdk_send(c.d, c.peer, c.port, "", 0, c.now);
		for (int i = 0; i < 100; i++)
			xp_dpdk_poll(c.d, on_rx, &c);
		if (c.now - start > timeout_s * 1000000) {
			xp_dpdk_stats(c.d, &ds);
			fprintf(stderr,
				"dpdk-stream: no answer from the peer in %" PRIu64
				" s (ARP requests sent %" PRIu64 ", replies sent %" PRIu64
				", learned %" PRIu64 "; frames in %" PRIu64 ", out %" PRIu64
				", not ours %" PRIu64 ", bad %" PRIu64 ")\n",
				timeout_s, ds.arp_requests_sent, ds.arp_replies_sent,
				ds.arp_learned, ds.rx_frames, ds.tx_frames, ds.rx_not_ours,
				ds.rx_bad);
			return 1;
		}
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	for (int i = 0; i < 20; i++) { /* the peer may still wait for our hello */
		xp_dpdk_send(c.d, c.peer, c.port, "", 0, now_us());
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	start = now_us();
	cpu0 = cpu_s();
	for (;;) {
		int got, sent;
		size_t n;

		c.now = now_us();
		got = xp_dpdk_poll(c.d, on_rx, &c);
		while (sender && written < send) {
			n = send - written < sizeof(app) ? send - written : sizeof(app);
			n = xp_rel_write(c.r, pat + written % PERIOD, n);
			written += n;
			if (!n)
				break;
			if (written == send)
				xp_rel_shutdown(c.r);
		}
		while (!sender && (n = xp_rel_read(c.r, app, sizeof(app))) > 0) {
			if (memcmp(app, pat + checked % PERIOD, n))
				for (size_t i = 0; i < n; i++)
					bad += app[i] != pat[(checked + i) % PERIOD];
			checked += n;
		}
		sent = transmit(&c, buf, sizeof(buf));
		if (sent < 0)
			return 1;
		if (!t_end && xp_rel_send_done(c.r) && xp_rel_eof(c.r))
			t_end = c.now;
		/* Done: linger a little to answer a peer whose last acknowledgement was lost. */
		if (t_end && c.now - t_end > 300000)
			break;
		if (c.now - start > timeout_s * 1000000) {
			fprintf(stderr, "dpdk-stream: not done after %" PRIu64 " s\n", timeout_s);
			break;
		}
		/* Adaptive polling: a core is given back when there is nothing to do. */
		if (got || sent) {
			idle = 0;
		} else if (++idle > 64) {
			uint64_t d = xp_rel_deadline(c.r), ns = idle > 4096 ? 1000000 : 50000;

			if (d > c.now && (d - c.now) * 1000 < ns)
				ns = (d - c.now) * 1000;
			if (d > c.now) {
				nanosleep(&(struct timespec){ 0, (long)ns }, NULL);
				sleeps++;
			}
		}
	}
	xp_rel_stats(c.r, &rs);
	xp_dpdk_stats(c.d, &ds);
	if (sealed)
		xp_seal_stats(sender ? c.tx : c.rx, &ss);
	{
		double secs = ((t_end ? t_end : c.now) - start) / 1e6, cpu = cpu_s() - cpu0;
		uint64_t bytes = sender ? written : checked;

		printf("{\"role\": \"%s\", \"bytes\": %" PRIu64 ", \"expected\": %" PRIu64
		       ", \"bad_bytes\": %" PRIu64 ", \"done\": %s, \"seconds\": %.3f, "
		       "\"gbit_s\": %.3f, \"cpu_s\": %.3f, \"core_s_per_gb\": %.3f, \"sealed\": "
		       "%s, "
		       "\"sleeps\": %" PRIu64 ", \"dropped_by_test\": %" PRIu64
		       ", \"refused_frames\": %" PRIu64 ", \"retransmitted_frames\": %" PRIu64
		       ", \"fast_recoveries\": %" PRIu64 ", \"timeouts\": %" PRIu64
		       ", \"tail_probes\": %" PRIu64 ", \"srtt_us\": %" PRIu64
		       ", \"frames_sent\": %" PRIu64 ", \"frames_received\": %" PRIu64
		       ", \"tx_frames\": %" PRIu64 ", \"rx_frames\": %" PRIu64
		       ", \"tx_ring_full\": %" PRIu64 ", \"tx_no_mbuf\": %" PRIu64
		       ", \"arp_learned\": %" PRIu64 ", \"seal_forged\": %" PRIu64
		       ", \"seal_replayed\": %" PRIu64 "}\n",
		       sender ? "sender" : "receiver", bytes, sender ? send : receive, bad,
		       t_end ? "true" : "false", secs, secs > 0 ? bytes * 8 / secs / 1e9 : 0, cpu,
		       bytes ? cpu / (bytes / 1e9) : 0, sealed ? "true" : "false", sleeps,
		       c.dropped_by_test, c.refused_frames, rs.retransmitted_frames,
		       rs.fast_recoveries, rs.timeouts, rs.tail_probes, rs.srtt_us, rs.frames_sent,
		       rs.frames_received, ds.tx_frames, ds.rx_frames, ds.tx_ring_full,
		       ds.tx_no_mbuf, ds.arp_learned, ss.forged, ss.replayed);
		r = t_end && bad == 0 && (sender || checked == receive) ? 0 : 1;
	}
	xp_seal_free(c.tx);
	xp_seal_free(c.rx);
	xp_rel_free(c.r);
	xp_dpdk_close(c.d);
	return r;
usage:
	fprintf(stderr, "usage: dpdk-stream --eal 'EAL ARGS' --address A/P --peer IP [--port N]\n"
			"       (--send BYTES | --receive BYTES) [--secret HEX64] [--loss PCT]\n"
			"       [--timeout S]\n");
	return 2;
}
