// SPDX-License-Identifier: Apache-2.0
/* Streams of the node hop's session layer (xp_hop: xp_rel streams, one per QEMU connection as
 * multifd has them) over a DPDK port (xp_dpdk), sealed when keyed by a mutual-TLS control
 * connection (--tls-*, --control) or given a secret: the sender writes a known pattern, the
 * receiver checks every byte. For the DPDK node hop's tests and benchmarks until proxy/ carries
 * migrations over it. Prints one JSON line; exits 77 when this build has no DPDK. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "xp_dpdk.h"
#include "xp_dpdk_port.h"
#include "xp_hop.h"
#include "xp_impair.h"
#include "xp_rel.h"
#include "xp_seal.h"
#include "xp_tls.h"

#define MARKER "VMIGD-CLEAR-TEXT-MARKER"

#define MAX_STREAMS 32

/* One stream: the sender writes its share of the pattern into it, the receiver checks it. */
struct stream {
	struct xp_rel *r;
	uint64_t written, checked;
	bool fin; /* the sender queued its FIN */
};

/* The port as xp_hop sees it: xp_dpdk, less the hellos (empty datagrams); wrapped, where asked
 * to, in the impairing port (xp_impair.h) that drops, duplicates or holds back a share of the
 * frames that arrive. */
struct ctx {
	struct xp_dpdk *d;
	uint32_t peer;
	bool hello; /* a datagram from the peer arrived */
	xp_hop_rx_fn fn;
	void *fn_arg;
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

	if (ip == c->peer)
		c->hello = true;
	if (!len || !c->fn)
		return; /* a hello */
	c->fn(c->fn_arg, ip, port, data, len);
}

/* The port's one op of its own: the hellos stay out of the sessions. The others are xp_dpdk's
 * (xp_dpdk_port.h); port is the xp_dpdk, and the_ctx the one ctx there is. */
static struct ctx *the_ctx;

static int hello_poll(void *port, xp_hop_rx_fn fn, void *arg)
{
	the_ctx->fn = fn;
	the_ctx->fn_arg = arg;
	return xp_dpdk_poll(port, on_rx, the_ctx);
}

/* Waits for what a TLS step wants, up to the deadline: 0, or -ETIMEDOUT. */
static int wait_fd(int fd, enum xp_tls_want want, uint64_t deadline)
{
	struct pollfd p = { .fd = fd, .events = want == XP_TLS_WANT_WRITE ? POLLOUT : POLLIN };
	uint64_t now = now_us();

	if (now >= deadline || poll(&p, 1, (int)((deadline - now) / 1000) + 1) == 0)
		return -ETIMEDOUT;
	return 0;
}

/*
 * The control connection over the kernel: the receiver listens on control, the sender connects,
 * and a mutual TLS 1.3 handshake with the node's certificates and allow-list gives each
 * direction its secret through the exporter (xp_seal_export): the sender seals with the client's
 * (tx) and opens with the server's (rx), the receiver the other way round. The connection stays
 * open (fd) for as long as the stream runs. 0, or -errno with err set (a refusal names its reason).
 */
static int control_keys(const struct xp_tls_conf *tc, const struct sockaddr_in *control,
			bool sender, uint64_t timeout_s, uint8_t tx[XP_SEAL_SECRET],
			uint8_t rx[XP_SEAL_SECRET], int *fd_out, char *err, size_t errlen)
{
	uint8_t cs[XP_SEAL_SECRET], ss[XP_SEAL_SECRET];
	uint64_t deadline = now_us() + timeout_s * 1000000;
	struct xp_tls_sess *sess = NULL;
	struct xp_tls *t = NULL;
	enum xp_tls_want want = XP_TLS_WANT_NONE;
	int fd = -1, lfd = -1, one = 1, r;

	r = xp_tls_new(tc, &t, err, errlen);
	if (r)
		return r;
	if (sender) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		while (fd >= 0 && connect(fd, (const struct sockaddr *)control, sizeof(*control))) {
			if ((errno != ECONNREFUSED && errno != ENETUNREACH) ||
			    now_us() > deadline) {
				r = -errno;
				snprintf(err, errlen, "control connection: %s", strerror(errno));
				goto out;
			}
			usleep(50000); /* the receiver is not listening yet */
		}
	} else {
		lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
		    bind(lfd, (const struct sockaddr *)control, sizeof(*control)) ||
		    listen(lfd, 1)) {
			r = -errno;
			snprintf(err, errlen, "control listener: %s", strerror(errno));
			goto out;
		}
		r = wait_fd(lfd, XP_TLS_WANT_READ, deadline);
		if (r) {
			snprintf(err, errlen, "control listener: no sender in %" PRIu64 " s",
				 timeout_s);
			goto out;
		}
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	}
	if (fd < 0 || fcntl(fd, F_SETFL, O_NONBLOCK)) {
		snprintf(err, errlen, "control connection: %s", strerror(errno));
		r = -EIO;
		goto out;
	}
	r = xp_tls_sess_new(t, fd, !sender, NULL, &sess);
	if (r) {
		snprintf(err, errlen, "control connection: TLS session: %s", strerror(-r));
		goto out;
	}
	while ((r = xp_tls_handshake(sess, &want)) == -EAGAIN && !(r = wait_fd(fd, want, deadline)))
		;
	/* TLS 1.3: a client learns that its certificate was refused from the server's next record
	 */
	while (!r && sender && (r = xp_tls_await_server(sess, &want)) == -EAGAIN &&
	       !(r = wait_fd(fd, want, deadline)))
		;
	if (r) {
		snprintf(err, errlen, "control connection: TLS refused (%s): %s",
			 xp_tls_refusal_token(xp_tls_sess_refusal(sess)),
			 r == -ETIMEDOUT ? "timed out" : xp_tls_sess_error(sess));
		goto out;
	}
	r = xp_seal_export(sess, cs, ss);
	if (r) {
		snprintf(err, errlen, "control connection: no keys from %s (TLS 1.3 needed)",
			 xp_tls_sess_version(sess));
		goto out;
	}
	memcpy(tx, sender ? cs : ss, XP_SEAL_SECRET);
	memcpy(rx, sender ? ss : cs, XP_SEAL_SECRET);
	fprintf(stderr, "dpdk-stream: keyed by %s\n", xp_tls_sess_describe(sess));
out:
	explicit_bzero(cs, sizeof(cs));
	explicit_bzero(ss, sizeof(ss));
	xp_tls_sess_free(sess);
	xp_tls_free(t);
	if (lfd >= 0)
		close(lfd);
	if (r && fd >= 0)
		close(fd);
	else
		*fd_out = fd;
	return r;
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
	/* the peer's 4 MiB shared among its streams: 8 streams of 4 MiB each ran at a quarter of
	 * the speed of 8 of 512 KiB here, their rings out of the cache */
	struct xp_hop_conf hc = { .mss = 1344, .max_peers = 1 };
	struct xp_hop_port_ops ops = xp_dpdk_port_ops;
	struct xp_hop_peer_conf pc = { .udp_port = 4790, .budget = 4 << 20 };
	struct ctx c = { 0 };
	struct xp_impair_conf ic = { .seed = 12345 };
	struct xp_impair *im = NULL;
	struct xp_impair_stats is;
	bool zero_copy;
	struct stream st[MAX_STREAMS] = { 0 };
	unsigned int nstreams = 1;
	struct xp_hop *hop = NULL;
	struct xp_hop_peer *peer;
	struct xp_hop_peer_stats ps;
	struct xp_rel_stats rs;
	struct xp_dpdk_stats ds;
	struct xp_tls_conf tc = { .min_version = 13 };
	struct sockaddr_in control = { .sin_family = AF_INET };
	uint64_t send = 0, receive = 0, written = 0, checked = 0, start, t_end = 0, bad = 0;
	unsigned int i;
	uint64_t timeout_s = 120, idle = 0, sleeps = 0, last = 0;
	uint8_t secret[XP_SEAL_SECRET], tx_secret[XP_SEAL_SECRET], app[65536];
	bool sealed = false, keyed = false, sender;
	const char *keying = "none";
	char err[256] = "";
	struct in_addr a;
	double cpu0;
	int opt, r, cfd = -1;
	char *colon;
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
		{ "control", required_argument, NULL, 'c' },
		{ "tls-cert", required_argument, NULL, 'C' },
		{ "tls-key", required_argument, NULL, 'K' },
		{ "tls-ca", required_argument, NULL, 'A' },
		{ "tls-allow", required_argument, NULL, 'W' },
		{ "streams", required_argument, NULL, 'n' },
		{ "copy", no_argument, NULL, 'y' },
		{ "duplicate", required_argument, NULL, 'D' },
		{ "reorder", required_argument, NULL, 'R' },
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
			c.peer = pc.ip = ntohl(a.s_addr);
			break;
		case 'P':
			pc.udp_port = conf.udp_port = (uint16_t)atoi(optarg);
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
			ic.loss_pct = (unsigned int)atoi(optarg);
			break;
		case 'D':
			ic.dup_pct = (unsigned int)atoi(optarg);
			break;
		case 'R':
			ic.reorder_pct = (unsigned int)atoi(optarg);
			break;
		case 't':
			timeout_s = strtoull(optarg, NULL, 0);
			break;
		case 'c':
			colon = strrchr(optarg, ':');
			if (!colon)
				goto usage;
			*colon = 0;
			if (inet_pton(AF_INET, optarg, &control.sin_addr) != 1)
				goto usage;
			control.sin_port = htons((uint16_t)atoi(colon + 1));
			keyed = true;
			break;
		case 'C':
			tc.cert = optarg;
			break;
		case 'K':
			tc.key = optarg;
			break;
		case 'A':
			tc.ca = optarg;
			break;
		case 'W':
			tc.allow = optarg;
			break;
		case 'y':
			ops = xp_dpdk_copy_port_ops; /* to measure what zero copy saves */
			break;
		case 'n':
			nstreams = (unsigned int)atoi(optarg);
			if (nstreams < 1 || nstreams > MAX_STREAMS)
				goto usage;
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
	if (!conf.eal || !conf.address || !c.peer || !(send || receive) || (send && receive) ||
	    (keyed && (sealed || !tc.cert || !tc.key || !tc.ca)))
		goto usage;
	sender = send > 0;
	make_pattern();
	/*
	 * The receiver's port comes up before it listens for the control connection, and the
	 * sender's after its keys: so a memif client never looks for a server not there yet, and
	 * a sender that TLS refuses opens no port at all.
	 */
	if (!sender || !keyed) {
		r = xp_dpdk_open(&conf, &c.d, err, sizeof(err));
		if (r) {
			fprintf(stderr, "dpdk-stream: %s\n", err);
			return 1;
		}
	}
	if (keyed) {
		r = control_keys(&tc, &control, sender, timeout_s, tx_secret, secret, &cfd, err,
				 sizeof(err));
		if (r) {
			for (char *q = err; *q; q++)
				if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20)
					*q = '\''; /* a JSON string as it is */
			printf("{\"role\": \"%s\", \"refused\": \"%s\"}\n",
			       sender ? "sender" : "receiver", err);
			fprintf(stderr, "dpdk-stream: %s\n", err);
			xp_dpdk_close(c.d); /* the receiver's, opened first; NULL for a sender */
			return 1;
		}
		sealed = true;
		keying = "tls-exporter";
	} else if (sealed) {
		keying = "shared-secret"; /* a test's: one key both ways */
		memcpy(tx_secret, secret, sizeof(secret));
	}
	if (!c.d) {
		r = xp_dpdk_open(&conf, &c.d, err, sizeof(err));
		if (r) {
			fprintf(stderr, "dpdk-stream: %s\n", err);
			return 1;
		}
	}
	zero_copy = ops.frame != NULL;
	ops.poll = hello_poll;
	the_ctx = &c;
	if (xp_impair_new(&ic, &ops, c.d, &im)) {
		fprintf(stderr, "dpdk-stream: out of memory\n");
		return 1;
	}
	hc.ops = xp_impair_ops(im);
	hc.port = im;
	hc.max_streams = nstreams;
	pc.tx_secret = sealed ? tx_secret : NULL;
	pc.rx_secret = sealed ? secret : NULL;
	if (xp_hop_new(&hc, &hop) || xp_hop_peer_add(hop, &pc, &peer)) {
		fprintf(stderr, "dpdk-stream: out of memory\n");
		return 1;
	}
	explicit_bzero(secret, sizeof(secret));
	explicit_bzero(tx_secret, sizeof(tx_secret));
	for (i = 0; i < nstreams; i++) {
		if (xp_hop_stream_open(peer, i + 1, now_us(), &st[i].r)) {
			fprintf(stderr, "dpdk-stream: out of memory\n");
			return 1;
		}
		if (!sender)
			xp_rel_shutdown(st[i].r); /* nothing flows back but acknowledgements */
	}
	/* ARP, and a peer that is there: hellos (empty datagrams) until one comes back. */
	start = now_us();
	while (!c.hello) {
		uint64_t now = now_us();

		/* a memif client refused by a server not started yet tries again (xp_dpdk.h) */
		xp_dpdk_tend(c.d, now);
		xp_dpdk_send(c.d, c.peer, pc.udp_port, "", 0, now);
		for (i = 0; i < 100; i++)
			xp_dpdk_poll(c.d, on_rx, &c);
		if (now - start > timeout_s * 1000000) {
			xp_dpdk_stats(c.d, &ds);
			fprintf(stderr,
				"dpdk-stream: no answer from the peer in %" PRIu64
				" s (link %s; ARP requests sent %" PRIu64 ", replies sent %" PRIu64
				", learned %" PRIu64 "; frames in %" PRIu64 ", out %" PRIu64
				", not ours %" PRIu64 ", bad %" PRIu64 ", ring full %" PRIu64 ")\n",
				timeout_s, xp_dpdk_link_up(c.d) ? "up" : "down",
				ds.arp_requests_sent, ds.arp_replies_sent, ds.arp_learned,
				ds.rx_frames, ds.tx_frames, ds.rx_not_ours, ds.rx_bad,
				ds.tx_ring_full);
			return 1;
		}
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	for (i = 0; i < 20; i++) { /* the peer may still wait for our hello */
		xp_dpdk_send(c.d, c.peer, pc.udp_port, "", 0, now_us());
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	start = now_us();
	cpu0 = cpu_s();
	for (;;) {
		uint64_t now = now_us();
		bool all_done = true;
		int moved;
		size_t n;

		/* each stream carries send (or receive) / nstreams bytes, the first the remainder
		 */
		for (i = 0; i < nstreams; i++) {
			struct stream *s = &st[i];
			uint64_t want = (sender ? send : receive) / nstreams;

			if (i == 0)
				want += (sender ? send : receive) % nstreams;
			while (sender && s->written < want) {
				n = want - s->written < sizeof(app) ? want - s->written
								    : sizeof(app);
				n = xp_rel_write(s->r, pat + s->written % PERIOD, n);
				s->written += n;
				written += n;
				if (!n)
					break;
			}
			if (sender && s->written == want && !s->fin) {
				xp_rel_shutdown(s->r);
				s->fin = true;
			}
			while (!sender && (n = xp_rel_read(s->r, app, sizeof(app))) > 0) {
				if (memcmp(app, pat + s->checked % PERIOD, n))
					for (size_t j = 0; j < n; j++)
						bad += app[j] != pat[(s->checked + j) % PERIOD];
				s->checked += n;
				checked += n;
			}
			if (!xp_rel_send_done(s->r) || !xp_rel_eof(s->r))
				all_done = false;
		}
		moved = xp_hop_step(hop, now);
		if (!t_end && all_done)
			t_end = now;
		last = now;
		/* Done: linger a little to answer a peer whose last acknowledgement was lost. */
		if (t_end && now - t_end > 300000)
			break;
		if (now - start > timeout_s * 1000000) {
			fprintf(stderr, "dpdk-stream: not done after %" PRIu64 " s\n", timeout_s);
			break;
		}
		/* Adaptive polling: a core is given back when there is nothing to do. */
		if (moved) {
			idle = 0;
		} else if (++idle > 64) {
			uint64_t d = xp_hop_deadline(hop), ns = idle > 4096 ? 1000000 : 50000;

			if (d > now && (d - now) * 1000 < ns)
				ns = (d - now) * 1000;
			if (d > now) {
				nanosleep(&(struct timespec){ 0, (long)ns }, NULL);
				sleeps++;
			}
		}
	}
	/* the streams' figures, summed (the timer fields: the first stream's) */
	xp_rel_stats(st[0].r, &rs);
	for (i = 1; i < nstreams; i++) {
		struct xp_rel_stats o;

		xp_rel_stats(st[i].r, &o);
		rs.tail_probes += o.tail_probes;
		rs.frames_sent += o.frames_sent;
		rs.frames_received += o.frames_received;
	}
	xp_hop_peer_stats(peer, &ps);
	xp_dpdk_stats(c.d, &ds);
	xp_impair_stats(im, &is);
	{
		double secs = ((t_end ? t_end : last) - start) / 1e6, cpu = cpu_s() - cpu0;
		uint64_t bytes = sender ? written : checked;

		printf("{\"role\": \"%s\", \"bytes\": %" PRIu64 ", \"expected\": %" PRIu64
		       ", \"bad_bytes\": %" PRIu64 ", \"done\": %s, \"seconds\": %.3f, "
		       "\"gbit_s\": %.3f, \"cpu_s\": %.3f, \"core_s_per_gb\": %.3f, \"sealed\": "
		       "%s, \"keying\": \"%s\", \"streams\": %u, \"unknown_stream\": %" PRIu64 ", "
		       "\"sleeps\": %" PRIu64 ", \"dropped_by_test\": %" PRIu64
		       ", \"duplicated_by_test\": %" PRIu64 ", \"reordered_by_test\": %" PRIu64
		       ", \"refused_frames\": %" PRIu64 ", \"port_busy\": %" PRIu64
		       ", \"retransmitted_frames\": %" PRIu64 ", \"fast_recoveries\": %" PRIu64
		       ", \"timeouts\": %" PRIu64 ", \"tail_probes\": %" PRIu64
		       ", \"srtt_us\": %" PRIu64 ", \"frames_sent\": %" PRIu64
		       ", \"frames_received\": %" PRIu64 ", \"tx_frames\": %" PRIu64
		       ", \"rx_frames\": %" PRIu64 ", \"tx_ring_full\": %" PRIu64
		       ", \"tx_no_mbuf\": %" PRIu64 ", \"arp_learned\": %" PRIu64
		       ", \"seal_forged\": %" PRIu64 ", \"seal_replayed\": %" PRIu64
		       ", \"unknown_peer\": %" PRIu64 ", \"zero_copy\": %s, \"tx_bursts\": %" PRIu64
		       "}\n",
		       sender ? "sender" : "receiver", bytes, sender ? send : receive, bad,
		       t_end ? "true" : "false", secs, secs > 0 ? bytes * 8 / secs / 1e9 : 0, cpu,
		       bytes ? cpu / (bytes / 1e9) : 0, sealed ? "true" : "false", keying, nstreams,
		       ps.unknown_stream, sleeps, is.dropped, is.duplicated, is.reordered,
		       ps.forged + ps.replayed + ps.too_old + ps.malformed + ps.unknown_stream,
		       ps.port_busy, ps.retransmitted_frames, ps.fast_recoveries, ps.timeouts,
		       rs.tail_probes, rs.srtt_us, rs.frames_sent, rs.frames_received, ds.tx_frames,
		       ds.rx_frames, ds.tx_ring_full, ds.tx_no_mbuf, ds.arp_learned, ps.forged,
		       ps.replayed, xp_hop_unknown_peer(hop), zero_copy ? "true" : "false",
		       ds.tx_bursts);
		r = t_end && bad == 0 && (sender || checked == receive) ? 0 : 1;
	}
	/* The result is out before the teardown, which is DPDK's as much as ours (xp_dpdk_close()'s
	 * comment: a memif port is left to the exit). */
	fflush(stdout);
	xp_hop_free(hop);
	xp_impair_free(im);
	xp_dpdk_close(c.d);
	if (cfd >= 0)
		close(cfd);
	return r;
usage:
	fprintf(stderr, "usage: dpdk-stream --eal 'EAL ARGS' --address A/P --peer IP [--port N]\n"
			"       (--send BYTES | --receive BYTES) [--streams N] [--copy]\n"
			"       [--loss PCT] [--duplicate PCT] [--reorder PCT]\n"
			"       [--timeout S]\n"
			"       [--secret HEX64 | --control IP:PORT --tls-cert F --tls-key F\n"
			"        --tls-ca F [--tls-allow NAMES]]\n");
	return 2;
}
