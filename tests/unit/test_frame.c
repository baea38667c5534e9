// SPDX-License-Identifier: Apache-2.0
/* Unit tests of resumable links (transport/xp_frame.c) on real sockets and a real worker: two
 * links joined by a loopback TCP connection carry a stream both ways while that connection is
 * cut again and again (a FIN, a reset), each time resumed over a new one from the offsets the
 * two sides report; every byte arrives once and in order, on the splice and the copy path, with
 * a small keep bound (flow control) and a large one. Then the frame codec, and a peer that
 * breaks the protocol: refused with EBADMSG, never suspended. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <time.h>

#include <cmocka.h>

#include "util.h"
#include "xp_frame.h"
#include "xp_pool.h"
#include "xp_zchunk.h"

/* Compressed runs: the first link attached sends chunks (mode), the second takes them, and the
 * streams are half text-like pages, half random ones. */
static struct {
	enum xp_zmode out;
	bool in_second;
	unsigned int attached;
} zrun;

/* The byte at offset i of direction d's stream: no two nearby offsets alike. */
static uint8_t pattern(unsigned int d, uint64_t i)
{
	uint64_t x = (i >> 3) * 0x9e3779b97f4a7c15ull + d;

	if (zrun.out && (i >> 12) % 2 == 0)
		return (uint8_t)("the quick brown fox "[i % 20] + ((i >> 14) & 3));

	return (uint8_t)(x >> (8 * (i & 7)) ^ (x >> 56));
}

/* A loopback TCP pair: *a connected, *b accepted. */
static void tcp_pair(int *a, int *b)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(l >= 0);
	assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(l, 1), 0);
	assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
	*a = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(*a, (struct sockaddr *)&sa, sizeof(sa)), 0);
	*b = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	assert_true(*b >= 0);
	/* as the daemon's are: the copy path's read(2) must never block its worker */
	assert_int_equal(fcntl(*a, F_SETFL, O_NONBLOCK), 0);
	close(l);
}

struct side {
	struct xp_link *l;
	bool suspended, ended;
	struct xp_link_result res;
	int hop_dup; /* the test's handle on the current node hop, to cut it */
};

static void on_done(void *cookie, const struct xp_link_result *res, void *arg)
{
	struct side *s = cookie;

	(void)arg;
	s->res = *res;
	if (res->end != XP_END_SUSPENDED && getenv("VMIG_TEST_VERBOSE"))
		print_message("link %p end %d err %d side %d\n", (void *)s, res->end, res->err,
			      res->err_side);
	if (res->end == XP_END_ERROR)
		print_message("link %p ended: %s on side %d %s\n", (void *)s, strerror(-res->err),
			      res->err_side, res->detail);
	if (res->end == XP_END_SUSPENDED)
		s->suspended = true;
	else
		s->ended = true;
}

/* The pool of the run under way, for the story of a failure. */
static struct xp_pool *cur_pool;

/* One direction of QEMU's traffic, as the test plays both QEMUs. */
struct flow {
	unsigned int tag;
	int wfd, rfd;
	uint64_t len, sent, got;
	uint64_t upto; /* writes stop here for now (the next cut must find bytes still to come) */
	size_t chunk;  /* bytes per write(2); 0: 64 KiB */
	bool shut;
};

static void flow_write(struct flow *f)
{
	uint8_t buf[65536];
	uint64_t end = f->upto < f->len ? f->upto : f->len;
	size_t chunk = f->chunk ? f->chunk : sizeof(buf);

	while (f->sent < end) {
		size_t n = end - f->sent < chunk ? (size_t)(end - f->sent) : chunk;
		ssize_t k;

		for (size_t i = 0; i < n; i++)
			buf[i] = pattern(f->tag, f->sent + i);
		k = write(f->wfd, buf, n);
		if (k < 0 && errno == EAGAIN)
			return;
		if (k <= 0)
			fail_msg("writing at %llu: %s", (unsigned long long)f->sent, strerror(errno));
		f->sent += (uint64_t)k;
	}
	if (f->sent == f->len && !f->shut) {
		assert_int_equal(shutdown(f->wfd, SHUT_WR), 0);
		f->shut = true;
	}
}

static void flow_read(struct flow *f)
{
	uint8_t buf[65536];
	ssize_t k;

	while ((k = read(f->rfd, buf, sizeof(buf))) > 0) {
		for (ssize_t i = 0; i < k; i++)
			if (buf[i] != pattern(f->tag, f->got + (uint64_t)i))
				fail_msg("byte %llu of the stream differs",
					 (unsigned long long)(f->got + (uint64_t)i));
		f->got += (uint64_t)k;
	}
	if (k == 0 ? f->got != f->len : errno != EAGAIN) {
		int e = errno;

		/* the link's own story first, when it has ended */
		for (int i = 0; i < 10 && cur_pool; i++) {
			struct pollfd pf = { .fd = xp_pool_event_fd(cur_pool), .events = POLLIN };

			if (poll(&pf, 1, 100) > 0)
				xp_pool_reap(cur_pool);
		}
		errno = e;
		fail_msg("direction %u: %s after %llu of %llu bytes", f->tag,
			 k == 0 ? "end of stream" : strerror(errno), (unsigned long long)f->got,
			 (unsigned long long)f->len);
	}
}

/* Cuts the node hop: a FIN both ways, or (reset) a reset, as a middlebox or ss -K would. */
static void cut(int fd, bool reset)
{
	struct sockaddr sa = { .sa_family = AF_UNSPEC };

	if (reset)
		(void)connect(fd, &sa, sizeof(sa)); /* tcp_disconnect(): an RST */
	else
		(void)shutdown(fd, SHUT_RDWR);
	close(fd);
}

static void attach(struct xp_pool *p, struct side *s, int local, int hop, size_t keep)
{
	struct xp_link_opts o = { .cookie = s, .resume = { .keep = keep, .silence_ms = 5000 } };

	if (zrun.out && zrun.attached == 0) {
		o.z.out = zrun.out;
		o.z.level = 1;
	}
	if (zrun.in_second && zrun.attached == 1)
		o.z.in = true;
	zrun.attached++;

	s->hop_dup = dup(hop);
	assert_int_equal(xp_pool_attach(p, local, hop, &o, &s->l), 0);
}

/*
 * QEMU A sends big bytes to QEMU B and B sends small back; the hop is cut each time another
 * 1/(cuts+1) of the big stream has arrived, both links report their suspension, and they go on
 * over a new connection from the offsets the other side reported.
 */
static void resume_run(enum xp_path path, size_t keep, uint64_t big, unsigned int cuts,
		       size_t chunk)
{
	struct xp_pool_conf conf = { .threads = 2, .slots = 4, .pipe_size = 1u << 20, .path = path };
	struct side a = { 0 }, b = { 0 };
	struct xp_pool *p;
	int qa[2], qb[2], ha, hb;
	unsigned int done_cuts = 0;
	struct flow ab, ba;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, qa), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, qb), 0);
	ab = (struct flow){ .tag = 0, .wfd = qa[0], .rfd = qb[0], .len = big, .chunk = chunk };
	ba = (struct flow){ .tag = 1, .wfd = qb[0], .rfd = qa[0], .len = 300000, .upto = 300000 };
	tcp_pair(&ha, &hb);
	assert_int_equal(xp_pool_new(&conf, on_done, NULL, &p), 0);
	cur_pool = p;
	attach(p, &a, qa[1], ha, keep);
	attach(p, &b, qb[1], hb, keep);
	while (!a.ended || !b.ended) {
		uint64_t next = big / (cuts + 1) * (done_cuts + 1);
		struct pollfd pf[3] = { { .fd = xp_pool_event_fd(p), .events = POLLIN },
					{ .fd = qa[0], .events = POLLIN },
					{ .fd = qb[0], .events = POLLIN } };

		ab.upto = done_cuts < cuts ? next + (1u << 20) : big;
		if (!ab.shut && ab.sent < ab.upto)
			pf[1].events |= POLLOUT;
		if (!ba.shut)
			pf[2].events |= POLLOUT;
		if (poll(pf, 3, 20000) <= 0)
			fail_msg("stuck after %u cuts: a to b %llu sent %llu got, b to a %llu sent %llu "
				 "got; suspended %d %d, ended %d %d, kept %llu %llu",
				 done_cuts, (unsigned long long)ab.sent, (unsigned long long)ab.got,
				 (unsigned long long)ba.sent, (unsigned long long)ba.got, a.suspended,
				 b.suspended, a.ended, b.ended, (unsigned long long)xp_link_kept(a.l),
				 (unsigned long long)xp_link_kept(b.l));
		if (pf[0].revents)
			xp_pool_reap(p);
		flow_write(&ab);
		flow_write(&ba);
		flow_read(&ab);
		flow_read(&ba);
		if (done_cuts < cuts && !a.suspended && !b.suspended && ab.got >= next) {
			cut(a.hop_dup, done_cuts & 1);
			close(b.hop_dup);
			done_cuts++;
		}
		if (a.suspended && b.suspended) {
			int na, nb;

			assert_int_equal(a.res.end, XP_END_SUSPENDED);
			assert_true(a.res.kept_from <= b.res.have && b.res.have <= a.res.kept_to);
			assert_true(b.res.kept_from <= a.res.have && a.res.have <= b.res.kept_to);
			tcp_pair(&na, &nb);
			/* an offset it never had is refused, and takes nothing */
			assert_int_equal(xp_link_resume(a.l, na, NULL, a.res.kept_to + 1), -ERANGE);
			a.hop_dup = dup(na);
			b.hop_dup = dup(nb);
			a.suspended = b.suspended = false;
			assert_int_equal(xp_link_resume(a.l, na, NULL, b.res.have), 0);
			assert_int_equal(xp_link_resume(b.l, nb, NULL, a.res.have), 0);
		}
	}
	assert_int_equal(done_cuts, cuts);
	assert_int_equal(ab.got, big);
	assert_int_equal(ba.got, 300000);
	if (a.res.end != XP_END_CLEAN || b.res.end != XP_END_CLEAN)
		fail_msg("ends %d (%s on side %d) and %d (%s on side %d)", a.res.end,
			 strerror(-a.res.err), a.res.err_side, b.res.end, strerror(-b.res.err),
			 b.res.err_side);
	/* each byte counted once, replays apart */
	assert_int_equal(a.res.bytes[0], big);
	assert_int_equal(b.res.bytes[1], big);
	assert_int_equal(b.res.bytes[0], 300000);
	assert_int_equal(a.res.resumed, cuts);
	assert_int_equal(b.res.resumed, cuts);
	if (zrun.out) {
		/* chunks lost at a cut are made again from what was kept: sent at least once */
		assert_true(b.res.z.rx_plain > big / 4 && b.res.z.rx_plain <= a.res.z.tx_plain);
		assert_true(a.res.z.tx_wire < a.res.z.tx_plain * 3 / 4);
		assert_true(b.res.z.rx_wire < b.res.z.rx_plain * 3 / 4);
	}
	close(a.hop_dup);
	close(b.hop_dup);
	xp_pool_free(p);
	close(qa[0]);
	close(qb[0]);
}

static void test_splice_ten_cuts(void **state)
{
	(void)state;
	resume_run(XP_PATH_SPLICE, 8u << 20, 64u << 20, 10, 0);
}

static void test_copy_ten_cuts(void **state)
{
	(void)state;
	resume_run(XP_PATH_COPY, 8u << 20, 64u << 20, 10, 0);
}

/* A keep smaller than a pipe: the sender stops at the bound and goes on as ACKs come. */
static void test_small_keep(void **state)
{
	(void)state;
	resume_run(XP_PATH_SPLICE, 65536, 16u << 20, 3, 0);
	resume_run(XP_PATH_COPY, 65536, 16u << 20, 3, 0);
}

/*
 * QEMU's small writes (a return-path message, a post-copy page and its header) take a pipe
 * slot each however few their bytes: the kept pipe runs out of slots long before its bytes,
 * and the sender must wait for an ACK there too, never spin.
 */
static void test_small_writes(void **state)
{
	(void)state;
	resume_run(XP_PATH_SPLICE, 65536, 1u << 20, 3, 17);
}

/* Compressed chunks across ten cuts, every byte once and in order (the return direction
 * spliced): what was lost in flight is compressed again from what was kept. */
static void test_compressed_cuts(void **state)
{
	(void)state;
	zrun = (typeof(zrun)){ .out = XP_Z_ALWAYS, .in_second = true };
	resume_run(XP_PATH_SPLICE, 2u << 20, 16u << 20, 10, 0);
	zrun = (typeof(zrun)){ 0 };
}

static void test_no_cut(void **state)
{
	(void)state;
	resume_run(XP_PATH_SPLICE, 8u << 20, 8u << 20, 0, 0);
}

/* A slot whose last link was resumable carries a plain one next, as if it never had been. */
static void test_slot_reuse(void **state)
{
	struct xp_pool_conf conf = { .threads = 1, .slots = 1, .pipe_size = 1u << 20 };
	struct side a = { 0 }, b = { 0 }, c = { 0 };
	struct xp_link_opts plain = { .cookie = &c };
	struct xp_pool *p;
	int qa[2], qb[2], ha, hb, x[2], y[2];
	char buf[64];

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, qa), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, qb), 0);
	tcp_pair(&ha, &hb);
	conf.slots = 2;
	assert_int_equal(xp_pool_new(&conf, on_done, NULL, &p), 0);
	attach(p, &a, qa[1], ha, 1u << 20);
	attach(p, &b, qb[1], hb, 1u << 20);
	assert_int_equal(write(qa[0], "resumable", 9), 9);
	assert_int_equal(shutdown(qa[0], SHUT_WR), 0);
	assert_int_equal(shutdown(qb[0], SHUT_WR), 0);
	while (!a.ended || !b.ended) {
		struct pollfd pf = { .fd = xp_pool_event_fd(p), .events = POLLIN };

		assert_true(poll(&pf, 1, 5000) > 0);
		xp_pool_reap(p);
	}
	assert_int_equal(a.res.end, XP_END_CLEAN);
	assert_int_equal(read(qb[0], buf, sizeof(buf)), 9);
	/* the same slots, plain links now */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, x), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, y), 0);
	assert_int_equal(xp_pool_attach(p, x[1], y[1], &plain, &c.l), 0);
	assert_int_equal(write(x[0], "plain", 5), 5);
	assert_int_equal(shutdown(x[0], SHUT_WR), 0);
	assert_int_equal(shutdown(y[0], SHUT_WR), 0);
	while (!c.ended) {
		struct pollfd pf = { .fd = xp_pool_event_fd(p), .events = POLLIN };

		assert_true(poll(&pf, 1, 5000) > 0);
		xp_pool_reap(p);
	}
	assert_int_equal(c.res.end, XP_END_CLEAN);
	assert_int_equal(c.res.bytes[0], 5);
	assert_int_equal(read(y[0], buf, sizeof(buf)), 5);
	xp_pool_free(p);
	close(a.hop_dup);
	close(b.hop_dup);
	close(qa[0]);
	close(qb[0]);
	close(x[0]);
	close(y[0]);
}

static void test_codec(void **state)
{
	struct xp_frame f = { .type = XP_FRAME_DATA, .len = 4096, .off = 1ull << 40 }, g;
	uint8_t buf[XP_FRAME_LEN];

	(void)state;
	xp_frame_put(&f, buf);
	assert_int_equal(xp_frame_get(buf, &g), 0);
	assert_int_equal(g.type, XP_FRAME_DATA);
	assert_int_equal(g.len, 4096);
	assert_true(g.off == 1ull << 40);
	buf[0] ^= 1; /* magic */
	assert_int_equal(xp_frame_get(buf, &g), -EBADMSG);
	buf[0] ^= 1;
	buf[3] = 1; /* pad */
	assert_int_equal(xp_frame_get(buf, &g), -EBADMSG);
	buf[3] = 0;
	buf[2] = 9; /* type */
	assert_int_equal(xp_frame_get(buf, &g), -EBADMSG);
	f = (struct xp_frame){ .type = XP_FRAME_ACK, .len = 1 };
	xp_frame_put(&f, buf);
	assert_int_equal(xp_frame_get(buf, &g), -EBADMSG);
	f = (struct xp_frame){ .type = XP_FRAME_DATA, .len = 0 };
	xp_frame_put(&f, buf);
	assert_int_equal(xp_frame_get(buf, &g), -EBADMSG);
	f.len = XP_FRAME_MAX + 1;
	xp_frame_put(&f, buf);
	assert_int_equal(xp_frame_get(buf, &g), -EBADMSG);
}

/*
 * A link whose node-hop peer is the test: hb (blocking) is that peer's socket, q[0] the local
 * QEMU's. The local QEMU writes a page, and the test reads it as one DATA frame from offset 0.
 */
static struct xp_pool *peer_link(struct side *a, int q[2], int *hb)
{
	struct xp_pool_conf conf = { .threads = 1, .slots = 2, .pipe_size = 1u << 20 };
	uint8_t hdr[XP_FRAME_LEN], page[4096];
	struct xp_pool *p;
	struct xp_frame f;
	int ha;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, q), 0);
	tcp_pair(&ha, hb);
	assert_int_equal(xp_pool_new(&conf, on_done, NULL, &p), 0);
	attach(p, a, q[1], ha, 1u << 20);
	assert_int_equal(fcntl(*hb, F_SETFL, 0), 0);
	memset(page, 7, sizeof(page));
	assert_int_equal(write(q[0], page, sizeof(page)), sizeof(page));
	assert_int_equal(recv(*hb, hdr, sizeof(hdr), MSG_WAITALL), sizeof(hdr));
	assert_int_equal(xp_frame_get(hdr, &f), 0);
	assert_int_equal(f.type, XP_FRAME_DATA);
	assert_true(f.off == 0 && f.len == sizeof(page));
	assert_int_equal(recv(*hb, page, sizeof(page), MSG_WAITALL), sizeof(page));
	return p;
}

/* One link whose peer is the test: it reads the link's frames and answers with a bad one (and
 * its payload, len bytes of it). */
static void bad_peer_payload(const struct xp_frame *answer, const void *payload, size_t len,
			     const char *what)
{
	struct side a = { 0 };
	uint8_t hdr[XP_FRAME_LEN];
	int q[2], hb;
	struct xp_pool *p = peer_link(&a, q, &hb);

	xp_frame_put(answer, hdr);
	assert_int_equal(write(hb, hdr, sizeof(hdr)), sizeof(hdr));
	if (len)
		assert_int_equal(write(hb, payload, len), (ssize_t)len);
	while (!a.ended && !a.suspended) {
		struct pollfd pf = { .fd = xp_pool_event_fd(p), .events = POLLIN };

		assert_true(poll(&pf, 1, 5000) > 0);
		xp_pool_reap(p);
	}
	if (a.suspended || a.res.end != XP_END_ERROR || a.res.err != -EBADMSG)
		fail_msg("%s: end %d err %d, not an error EBADMSG", what, a.res.end, a.res.err);
	/* nothing of a bad chunk reaches the local socket */
	assert_true(recv(q[0], hdr, sizeof(hdr), MSG_DONTWAIT) <= 0);
	if (len)
		print_message("%s: %s\n", what, a.res.detail);
	xp_pool_free(p);
	close(a.hop_dup);
	close(hb);
	close(q[0]);
}

static void bad_peer(const struct xp_frame *answer, const char *what)
{
	bad_peer_payload(answer, NULL, 0, what);
}

/*
 * The far side's QEMU closed its socket (its vmigd sends GONE): what the local QEMU had written
 * goes on being carried, but a byte it writes after that is to a QEMU that is gone, and fails
 * the link (so the local QEMU sees its migration fail); one that ended first ends it cleanly.
 */
static void gone_peer(bool ended_first)
{
	struct side a = { 0 };
	uint8_t hdr[XP_FRAME_LEN], page[4096];
	struct xp_frame f;
	int q[2], hb;
	struct xp_pool *p = peer_link(&a, q, &hb);

	if (ended_first) {
		/* the local QEMU ends: END goes out, the peer acknowledges all, then GONE */
		assert_int_equal(shutdown(q[0], SHUT_WR), 0);
		assert_int_equal(recv(hb, hdr, sizeof(hdr), MSG_WAITALL), sizeof(hdr));
		assert_int_equal(xp_frame_get(hdr, &f), 0);
		assert_int_equal(f.type, XP_FRAME_END);
	}
	f = (struct xp_frame){ .type = XP_FRAME_ACK, .off = sizeof(page) };
	xp_frame_put(&f, hdr);
	assert_int_equal(write(hb, hdr, sizeof(hdr)), sizeof(hdr));
	f = (struct xp_frame){ .type = XP_FRAME_GONE, .off = 0 };
	xp_frame_put(&f, hdr);
	assert_int_equal(write(hb, hdr, sizeof(hdr)), sizeof(hdr));
	if (ended_first) {
		/* and the peer's own direction ends: all is complete, both close */
		f = (struct xp_frame){ .type = XP_FRAME_END, .off = 0 };
		xp_frame_put(&f, hdr);
		assert_int_equal(write(hb, hdr, sizeof(hdr)), sizeof(hdr));
		assert_int_equal(shutdown(hb, SHUT_WR), 0);
	} else {
		usleep(100000);
		(void)write(q[0], page, sizeof(page));
	}
	while (!a.ended && !a.suspended) {
		struct pollfd pf = { .fd = xp_pool_event_fd(p), .events = POLLIN };

		assert_true(poll(&pf, 1, 5000) > 0);
		xp_pool_reap(p);
	}
	assert_false(a.suspended);
	if (ended_first) {
		assert_int_equal(a.res.end, XP_END_CLEAN);
	} else {
		assert_int_equal(a.res.end, XP_END_ERROR);
		assert_int_equal(a.res.err, -ESHUTDOWN);
		assert_int_equal(a.res.err_side, 1);
	}
	xp_pool_free(p);
	close(a.hop_dup);
	close(hb);
	close(q[0]);
}

static void test_gone(void **state)
{
	(void)state;
	gone_peer(false);
	gone_peer(true);
}

static void test_bad_peer(void **state)
{
	(void)state;
	bad_peer(&(struct xp_frame){ .type = XP_FRAME_ACK, .off = 4097 },
		 "an ACK of bytes never sent");
	bad_peer(&(struct xp_frame){ .type = XP_FRAME_DATA, .len = 10, .off = 5 },
		 "DATA at an offset that is not the stream's");
	bad_peer(&(struct xp_frame){ .type = XP_FRAME_END, .off = 3 }, "an END at the wrong length");
	bad_peer(&(struct xp_frame){ .type = 7 }, "a frame of no known type");
	bad_peer(&(struct xp_frame){ .type = XP_FRAME_ZDATA, .len = 10 },
		 "a compressed chunk to a link that did not agree to them");
}

/* A compressed chunk no vmigd writes, to a link that takes them: refused with its reason; and a
 * good one delivered as its plain bytes. */
static void test_bad_chunk(void **state)
{
	uint8_t plain[8192], chunk[XP_FRAME_ZMAX], got[8192];
	struct xp_zenc *enc;
	ssize_t n;

	(void)state;
	for (size_t i = 0; i < sizeof(plain); i++)
		plain[i] = (uint8_t)("vmigd compresses "[i % 17]);
	assert_int_equal(xp_zenc_new(1, &enc), 0);
	n = xp_zenc_chunk(enc, plain, sizeof(plain), chunk, sizeof(chunk));
	assert_true(n > XP_ZCHUNK_HDR && n < (ssize_t)sizeof(plain));
	xp_zenc_free(enc);
	zrun = (typeof(zrun)){ .in_second = true, .attached = 1 };
	/* a good chunk: the local socket gets its plain bytes */
	{
		struct side a = { 0 };
		uint8_t hdr[XP_FRAME_LEN];
		struct xp_frame f = { .type = XP_FRAME_ZDATA, .len = (uint32_t)n, .off = 0 };
		int q[2], hb;
		struct xp_pool *p = peer_link(&a, q, &hb);

		xp_frame_put(&f, hdr);
		assert_int_equal(write(hb, hdr, sizeof(hdr)), sizeof(hdr));
		assert_int_equal(write(hb, chunk, (size_t)n), n);
		assert_int_equal(fcntl(q[0], F_SETFL, 0), 0);
		assert_int_equal(recv(q[0], got, sizeof(got), MSG_WAITALL), sizeof(got));
		assert_memory_equal(got, plain, sizeof(plain));
		xp_pool_free(p);
		close(a.hop_dup);
		close(hb);
		close(q[0]);
	}
	zrun.attached = 1;
	chunk[0] = 9;
	bad_peer_payload(&(struct xp_frame){ .type = XP_FRAME_ZDATA, .len = (uint32_t)n }, chunk,
			 (size_t)n, "a chunk of an unknown type");
	chunk[0] = XP_ZCHUNK_ZSTD;
	chunk[XP_ZCHUNK_HDR + 6] ^= 0x55;
	zrun.attached = 1;
	bad_peer_payload(&(struct xp_frame){ .type = XP_FRAME_ZDATA, .len = (uint32_t)n }, chunk,
			 (size_t)n, "a corrupt zstd frame");
	zrun = (typeof(zrun)){ 0 };
}

/* Reaps until s has a report (an end, or a suspension or quiescence: res.end says which). */
static void wait_report(struct xp_pool *p, struct side *s)
{
	s->ended = s->suspended = false;
	while (!s->ended && !s->suspended) {
		struct pollfd pf = { .fd = xp_pool_event_fd(p), .events = POLLIN };

		assert_true(poll(&pf, 1, 5000) > 0);
		xp_pool_reap(p);
	}
}

static void hop_frame(int fd, enum xp_frame_type type, uint64_t off)
{
	struct xp_frame f = { .type = type, .off = off };
	uint8_t hdr[XP_FRAME_LEN];

	xp_frame_put(&f, hdr);
	assert_int_equal(write(fd, hdr, sizeof(hdr)), sizeof(hdr));
}

/*
 * A link moved to another process, in one pool: it quiesces (it asks for the ACK of what it
 * sent, and holds still once it has it), its state is read, a link refuses a state whose digests
 * do not match its own, the first one is released (the local socket stays open), and a link
 * adopting the state starts suspended and goes on from its offsets over a new node hop.
 */
static void test_quiesce_adopt(void **state)
{
	struct side a = { 0 }, bad = { 0 }, c = { 0 };
	struct xp_link_opts o = { .resume = { .keep = 1u << 20, .silence_ms = 5000 } };
	struct xp_link_state st, wrong;
	uint8_t hdr[XP_FRAME_LEN], page[4096];
	struct xp_frame f;
	int q[2], hb, other[2], hc, hd;
	struct xp_pool *p = peer_link(&a, q, &hb);

	(void)state;
	xp_link_quiesce(a.l, true);
	assert_int_equal(recv(hb, hdr, sizeof(hdr), MSG_WAITALL), sizeof(hdr));
	assert_int_equal(xp_frame_get(hdr, &f), 0);
	assert_true(f.type == XP_FRAME_PING && f.off == sizeof(page));
	hop_frame(hb, XP_FRAME_ACK, sizeof(page));
	wait_report(p, &a);
	assert_true(a.res.end == XP_END_QUIESCED && a.res.err == 0);
	assert_int_equal(xp_link_state(a.l, &st), 0);
	assert_true(st.sent == sizeof(page) && st.have == 0 && st.fd >= 0);
	assert_true(st.dg_len[0] == 0 && st.dg_len[1] == 0);

	/* digests on one side only: refused at the start, before a byte moves */
	wrong = st;
	wrong.dg_len[0] = 8;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, other), 0);
	o.cookie = &bad;
	o.adopt = &wrong;
	assert_int_equal(xp_pool_attach(p, other[1], -1, &o, &bad.l), 0);
	wait_report(p, &bad);
	assert_true(bad.res.end == XP_END_ERROR && bad.res.err == -EPROTO);
	close(other[0]);

	/* released: the node hop is reset, QEMU's socket stays open for the other process */
	o.cookie = &c;
	o.adopt = &st;
	st.fd = dup(st.fd);
	xp_link_release(a.l);
	wait_report(p, &a);
	assert_int_equal(a.res.end, XP_END_MOVED);
	close(a.hop_dup); /* the test's own handle would keep the hop open */
	assert_true(recv(hb, hdr, sizeof(hdr), 0) <= 0);
	assert_int_equal(xp_pool_attach(p, st.fd, -1, &o, &c.l), 0);
	wait_report(p, &c);
	assert_true(c.suspended && c.res.kept_from == sizeof(page) &&
		    c.res.kept_to == sizeof(page) && c.res.have == 0);

	/* resumed from the peer's offset: the next bytes go out from there */
	tcp_pair(&hc, &hd);
	assert_int_equal(fcntl(hd, F_SETFL, 0), 0);
	assert_int_equal(xp_link_resume(c.l, hc, NULL, sizeof(page)), 0);
	memset(page, 9, sizeof(page));
	assert_int_equal(write(q[0], page, sizeof(page)), sizeof(page));
	assert_int_equal(recv(hd, hdr, sizeof(hdr), MSG_WAITALL), sizeof(hdr));
	assert_int_equal(xp_frame_get(hdr, &f), 0);
	assert_true(f.type == XP_FRAME_DATA && f.off == sizeof(page) && f.len == sizeof(page));
	assert_int_equal(recv(hd, page, sizeof(page), MSG_WAITALL), sizeof(page));
	assert_int_equal(page[0], 9);
	xp_link_abort(c.l);
	wait_report(p, &c);
	xp_pool_free(p);
	close(hb);
	close(hd);
	close(q[0]);
}

/*
 * A link from the DPDK node hop (XP_END_FALLBACK): it starts suspended holding the bytes the peer
 * may lack as what it sent and kept; resumed from an offset among them, it sends the rest of
 * them again in order, then what its local socket sends. One that would keep more than it may
 * is refused at its start. On both paths: kept in pipes (splice) or in the ring (copy).
 */
static void adopt_kept_run(enum xp_path path)
{
	struct xp_pool_conf conf = { .threads = 1, .slots = 2, .pipe_size = 1u << 16, .path = path };
	struct xp_link_opts o = { .resume = { .keep = 1u << 18, .silence_ms = 5000 } };
	enum { KEPT = 150000, FROM = 1234, MORE = 4096 };
	static uint8_t kept[KEPT], got[KEPT];
	const uint64_t sent = 1000000;
	struct side a = { 0 }, big = { 0 };
	struct xp_link_state st = { .sent = sent, .have = 77, .kept = kept, .kept_len = KEPT };
	uint8_t hdr[XP_FRAME_LEN];
	uint64_t at = sent - KEPT + FROM;
	struct xp_frame f;
	struct xp_pool *p;
	int q[2], other[2], hc, hd;

	for (size_t i = 0; i < KEPT; i++)
		kept[i] = pattern(0, sent - KEPT + i);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, q), 0);
	assert_int_equal(xp_pool_new(&conf, on_done, NULL, &p), 0);
	st.fd = q[1];
	o.cookie = &a;
	o.adopt = &st;
	assert_int_equal(xp_pool_attach(p, q[1], -1, &o, &a.l), 0);
	memset(kept, 0, 16); /* the pool took a copy of its own */
	for (size_t i = 0; i < 16; i++)
		kept[i] = pattern(0, sent - KEPT + i);
	wait_report(p, &a);
	assert_true(a.suspended && a.res.kept_from == sent - KEPT && a.res.kept_to == sent &&
		    a.res.have == 77);
	assert_true(xp_link_kept(a.l) == KEPT);

	/* more than it may keep: refused before a byte moves */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, other), 0);
	st.fd = other[1];
	st.kept_len = KEPT;
	o.resume.keep = KEPT / 2;
	o.cookie = &big;
	assert_int_equal(xp_pool_attach(p, other[1], -1, &o, &big.l), 0);
	wait_report(p, &big);
	assert_true(big.res.end == XP_END_ERROR && big.res.err == -ENOBUFS);
	close(other[0]);

	/* resumed from inside what it kept: the rest of it, in order, then the local socket's */
	tcp_pair(&hc, &hd);
	assert_int_equal(fcntl(hd, F_SETFL, 0), 0);
	assert_int_equal(xp_link_resume(a.l, hc, NULL, at), 0);
	while (at < sent) {
		assert_int_equal(recv(hd, hdr, sizeof(hdr), MSG_WAITALL), sizeof(hdr));
		assert_int_equal(xp_frame_get(hdr, &f), 0);
		if (f.type != XP_FRAME_DATA)
			continue;
		assert_true(f.off == at && f.len <= sent - at);
		assert_int_equal(recv(hd, got, f.len, MSG_WAITALL), f.len);
		assert_memory_equal(got, kept + (at - (sent - KEPT)), f.len);
		at += f.len;
	}
	for (size_t i = 0; i < MORE; i++)
		got[i] = pattern(0, sent + i);
	assert_int_equal(write(q[0], got, MORE), MORE);
	do {
		assert_int_equal(recv(hd, hdr, sizeof(hdr), MSG_WAITALL), sizeof(hdr));
		assert_int_equal(xp_frame_get(hdr, &f), 0);
	} while (f.type != XP_FRAME_DATA);
	assert_true(f.off == sent && f.len <= MORE);
	assert_int_equal(recv(hd, got, f.len, MSG_WAITALL), f.len);
	assert_int_equal(got[0], pattern(0, sent));
	assert_int_equal(got[f.len - 1], pattern(0, sent + f.len - 1));
	xp_link_abort(a.l);
	wait_report(p, &a);
	xp_pool_free(p);
	close(hd);
	close(q[0]);
}

/*
 * A link suspended (its node hop reset) and aborted before the control thread reaped the
 * suspension: both reports come, in order, the suspension as it was posted and then the end,
 * never the end twice (which once freed a connection its second report then used).
 */
static void test_suspended_then_aborted_unreaped(void **state)
{
	struct side a = { 0 };
	struct pollfd pf;
	int q[2], hb;
	struct xp_pool *p = peer_link(&a, q, &hb);

	(void)state;
	a.suspended = a.ended = false;
	setsockopt(hb, SOL_SOCKET, SO_LINGER, &(struct linger){ .l_onoff = 1, .l_linger = 0 },
		   sizeof(struct linger));
	close(hb);
	close(a.hop_dup);
	pf = (struct pollfd){ .fd = xp_pool_event_fd(p), .events = POLLIN };
	assert_true(poll(&pf, 1, 5000) > 0); /* the suspension is posted, not reaped */
	xp_link_abort(a.l);
	usleep(200000); /* the end is posted behind it */
	xp_pool_reap(p);
	assert_true(a.suspended);
	assert_true(a.ended && a.res.end == XP_END_ABORTED);
	xp_pool_free(p);
	close(q[0]);
}

static void test_adopt_kept(void **state)
{
	(void)state;
	adopt_kept_run(XP_PATH_SPLICE);
	adopt_kept_run(XP_PATH_COPY);
}

int main(void)
{
	/* as vmigd does: a closed peer is an EPIPE to look at, not the end of the test */
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_codec),
		cmocka_unit_test(test_no_cut),
		cmocka_unit_test(test_splice_ten_cuts),
		cmocka_unit_test(test_copy_ten_cuts),
		cmocka_unit_test(test_small_keep),
		cmocka_unit_test(test_small_writes),
		cmocka_unit_test(test_gone),
		cmocka_unit_test(test_slot_reuse),
		cmocka_unit_test(test_bad_peer),
		cmocka_unit_test(test_bad_chunk),
		cmocka_unit_test(test_compressed_cuts),
		cmocka_unit_test(test_quiesce_adopt),
		cmocka_unit_test(test_adopt_kept),
		cmocka_unit_test(test_suspended_then_aborted_unreaped),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
