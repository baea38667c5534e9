// SPDX-License-Identifier: Apache-2.0
/* xp_rel streams (one per QEMU connection, as multifd has them) over a DPDK port (xp_dpdk), sealed
 * with xp_seal when keyed by a mutual-TLS control connection (--tls-*, --control) or given a
 * secret: the sender writes a known pattern, the receiver checks every byte. For the DPDK node
 * hop's tests and benchmarks until proxy/ carries migrations over it. Prints one JSON line; exits
 * 77 when this build has no DPDK. */
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
#include "xp_rel.h"
#include "xp_seal.h"
#include "xp_tls.h"

#define MARKER "VMIGD-CLEAR-TEXT-MARKER"

#define MAX_STREAMS 32

/* One stream: the sender writes size bytes of the pattern into it, the receiver checks them. */
struct stream {
	struct xp_rel *r;
	uint64_t written, checked;
	bool fin; /* the sender queued its FIN */
};

struct ctx {
	struct xp_dpdk *d;
	struct stream st[MAX_STREAMS];
	unsigned int nstreams;
	uint64_t pn; /* the packet numbers of every stream's frames: the nonces of this direction */
	struct xp_seal *tx, *rx;
	uint32_t peer;
	uint16_t port;
	unsigned int loss_pct;
	uint32_t rng;
	uint64_t now, dropped_by_test, refused_frames, unknown_stream, got;
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
	/* streams are numbered from 1 */
	if (h.stream == 0 || h.stream > c->nstreams) {
		c->unknown_stream++;
		return;
	}
	xp_rel_input(c->st[h.stream - 1].r, c->now, &h);
}

/* Sends what the streams have to send, a frame from each in turn so that none starves. A frame
 * the port cannot take now counts as lost (xp_rel sends it again), and the round ends there:
 * the frames after it would only be lost too. */
static int transmit(struct ctx *c, uint8_t *buf, size_t cap)
{
	unsigned int i, busy = c->nstreams;
	size_t n;
	int sent = 0;

	for (i = 0; busy; i = (i + 1) % c->nstreams) {
		n = xp_rel_next_frame(c->st[i].r, c->now, buf, cap - XP_SEAL_TAG);
		if (!n) {
			busy--;
			continue;
		}
		busy = c->nstreams;
		if (c->tx) {
			uint64_t pn;
			size_t hl;

			if (xp_rel_peek(buf, n, &pn, &hl) ||
			    xp_seal(c->tx, pn, buf, hl, buf + hl, n - hl, buf + n))
				return -EIO;
			n += XP_SEAL_TAG;
		}
		sent++;
		if (xp_dpdk_send(c->d, c->peer, c->port, buf, n, c->now) == -EAGAIN)
			break;
	}
	return sent;
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
 * and opens with the server's, the receiver the other way round. The connection stays open (fd)
 * for as long as the stream runs. 0, or -errno with err set (a refusal names its reason).
 */
static int control_keys(const struct xp_tls_conf *tc, const struct sockaddr_in *control,
			bool sender, uint64_t timeout_s, struct xp_seal **tx, struct xp_seal **rx,
			int *fd_out, char *err, size_t errlen)
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
	r = xp_seal_new(sender ? cs : ss, false, 0, tx);
	if (!r)
		r = xp_seal_new(sender ? ss : cs, true, 0, rx);
	if (r)
		snprintf(err, errlen, "sealing: %s", strerror(-r));
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
	struct xp_rel_cfg rc = { .stream = 1, .mss = 1344, .sndbuf = 4 << 20, .rcvbuf = 4 << 20 };
	struct ctx c = { .rng = 12345, .port = 4790, .nstreams = 1 };
	struct xp_rel_stats rs;
	struct xp_dpdk_stats ds;
	struct xp_seal_stats ss = { 0 };
	struct xp_tls_conf tc = { .min_version = 13 };
	struct sockaddr_in control = { .sin_family = AF_INET };
	uint64_t send = 0, receive = 0, written = 0, checked = 0, start, t_end = 0, bad = 0;
	unsigned int i;
	uint64_t timeout_s = 120, idle = 0, sleeps = 0;
	uint8_t secret[XP_SEAL_SECRET], buf[2048], app[65536];
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
		case 'n':
			c.nstreams = (unsigned int)atoi(optarg);
			if (c.nstreams < 1 || c.nstreams > MAX_STREAMS)
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
		r = control_keys(&tc, &control, sender, timeout_s, &c.tx, &c.rx, &cfd, err,
				 sizeof(err));
		if (r) {
			for (char *q = err; *q; q++)
				if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20)
					*q = '\''; /* a JSON string as it is */
			printf("{\"role\": \"%s\", \"refused\": \"%s\"}\n",
			       sender ? "sender" : "receiver", err);
			fprintf(stderr, "dpdk-stream: %s\n", err);
			return 1;
		}
		sealed = true;
		keying = "tls-exporter";
	} else if (sealed) {
		keying = "shared-secret";
	}
	if (!c.d) {
		r = xp_dpdk_open(&conf, &c.d, err, sizeof(err));
		if (r) {
			fprintf(stderr, "dpdk-stream: %s\n", err);
			return 1;
		}
	}
	for (i = 0; i < c.nstreams; i++) {
		rc.stream = i + 1;
		rc.pn_space = &c.pn;
		/* the peer's 4 MiB shared among its streams, as a daemon's budget per peer would be
		 */
		rc.sndbuf = rc.rcvbuf = c.nstreams > 8 ? 512 << 10 : (4u << 20) / c.nstreams;
		if (xp_rel_new(&rc, now_us(), &c.st[i].r)) {
			fprintf(stderr, "dpdk-stream: out of memory\n");
			return 1;
		}
		if (!sender)
			xp_rel_shutdown(c.st[i].r); /* nothing flows back but acknowledgements */
	}
	if (sealed && !keyed &&
	    (xp_seal_new(secret, false, 0, &c.tx) || xp_seal_new(secret, true, 0, &c.rx))) {
		fprintf(stderr, "dpdk-stream: out of memory\n");
		return 1;
	}
	/* ARP, and a peer that is there: hellos (empty datagrams) until one comes back. */
	start = now_us();
	while (!c.hello) {
		c.now = now_us();
		xp_dpdk_send(c.d, c.peer, c.port, "", 0, c.now);
		for (i = 0; i < 100; i++)
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
	for (i = 0; i < 20; i++) { /* the peer may still wait for our hello */
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
		bool all_done = true;

		/* each stream carries send (or receive) / nstreams bytes, the first the remainder
		 */
		for (i = 0; i < c.nstreams; i++) {
			struct stream *st = &c.st[i];
			uint64_t want = (sender ? send : receive) / c.nstreams;

			if (i == 0)
				want += (sender ? send : receive) % c.nstreams;
			while (sender && st->written < want) {
				n = want - st->written < sizeof(app) ? want - st->written
								     : sizeof(app);
				n = xp_rel_write(st->r, pat + st->written % PERIOD, n);
				st->written += n;
				written += n;
				if (!n)
					break;
			}
			if (sender && st->written == want && !st->fin) {
				xp_rel_shutdown(st->r);
				st->fin = true;
			}
			while (!sender && (n = xp_rel_read(st->r, app, sizeof(app))) > 0) {
				if (memcmp(app, pat + st->checked % PERIOD, n))
					for (size_t j = 0; j < n; j++)
						bad += app[j] != pat[(st->checked + j) % PERIOD];
				st->checked += n;
				checked += n;
			}
			if (!xp_rel_send_done(st->r) || !xp_rel_eof(st->r))
				all_done = false;
		}
		sent = transmit(&c, buf, sizeof(buf));
		if (sent < 0)
			return 1;
		if (!t_end && all_done)
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
			uint64_t d = UINT64_MAX, ns = idle > 4096 ? 1000000 : 50000;

			for (i = 0; i < c.nstreams; i++) {
				uint64_t di = xp_rel_deadline(c.st[i].r);

				d = di < d ? di : d;
			}

			if (d > c.now && (d - c.now) * 1000 < ns)
				ns = (d - c.now) * 1000;
			if (d > c.now) {
				nanosleep(&(struct timespec){ 0, (long)ns }, NULL);
				sleeps++;
			}
		}
	}
	/* the streams' figures, summed (the window and timer fields: the first stream's) */
	xp_rel_stats(c.st[0].r, &rs);
	for (i = 1; i < c.nstreams; i++) {
		struct xp_rel_stats o;

		xp_rel_stats(c.st[i].r, &o);
		rs.retransmitted_frames += o.retransmitted_frames;
		rs.fast_recoveries += o.fast_recoveries;
		rs.timeouts += o.timeouts;
		rs.tail_probes += o.tail_probes;
		rs.frames_sent += o.frames_sent;
		rs.frames_received += o.frames_received;
	}
	xp_dpdk_stats(c.d, &ds);
	if (sealed)
		xp_seal_stats(sender ? c.tx : c.rx, &ss);
	{
		double secs = ((t_end ? t_end : c.now) - start) / 1e6, cpu = cpu_s() - cpu0;
		uint64_t bytes = sender ? written : checked;

		printf("{\"role\": \"%s\", \"bytes\": %" PRIu64 ", \"expected\": %" PRIu64
		       ", \"bad_bytes\": %" PRIu64 ", \"done\": %s, \"seconds\": %.3f, "
		       "\"gbit_s\": %.3f, \"cpu_s\": %.3f, \"core_s_per_gb\": %.3f, \"sealed\": "
		       "%s, \"keying\": \"%s\", \"streams\": %u, \"unknown_stream\": %" PRIu64 ", "
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
		       bytes ? cpu / (bytes / 1e9) : 0, sealed ? "true" : "false", keying,
		       c.nstreams, c.unknown_stream, sleeps, c.dropped_by_test, c.refused_frames,
		       rs.retransmitted_frames, rs.fast_recoveries, rs.timeouts, rs.tail_probes,
		       rs.srtt_us, rs.frames_sent, rs.frames_received, ds.tx_frames, ds.rx_frames,
		       ds.tx_ring_full, ds.tx_no_mbuf, ds.arp_learned, ss.forged, ss.replayed);
		r = t_end && bad == 0 && (sender || checked == receive) ? 0 : 1;
	}
	xp_seal_free(c.tx);
	xp_seal_free(c.rx);
	for (i = 0; i < c.nstreams; i++)
		xp_rel_free(c.st[i].r);
	xp_dpdk_close(c.d);
	if (cfd >= 0)
		close(cfd);
	return r;
usage:
	fprintf(stderr, "usage: dpdk-stream --eal 'EAL ARGS' --address A/P --peer IP [--port N]\n"
			"       (--send BYTES | --receive BYTES) [--streams N] [--loss PCT]\n"
			"       [--timeout S]\n"
			"       [--secret HEX64 | --control IP:PORT --tls-cert F --tls-key F\n"
			"        --tls-ca F [--tls-allow NAMES]]\n");
	return 2;
}
