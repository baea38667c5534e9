// SPDX-License-Identifier: Apache-2.0
/* Unit tests of connection digests: lib/digest.c against XXH3's one-shot value, and the data path
 * (transport/xp_pool.c) digesting what each direction reads, on the splice path (MSG_PEEK before
 * each splice) and the copy path, over real socket pairs and a real worker; undelivered bytes
 * count, a link without the option reports none, and a link over as soon as attached is
 * reported at once. */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "digest.h"
#include "xp_pool.h"

#define LEN (3u << 20) /* more than a pipe and the peek buffer: many splices and peeks */

static uint8_t data[LEN];

static void fill(void)
{
	uint32_t x = 2463534242u;

	for (size_t i = 0; i < LEN; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		data[i] = (uint8_t)x;
	}
}

/* The streaming digest equals the one-shot value however the stream is cut. */
static void test_digest_chunks(void **state)
{
	struct vm_digest *d = vm_digest_new();
	static const size_t cuts[] = { 1, 7, 64, 4096, 65536, 1u << 20 };

	(void)state;
	assert_non_null(d);
	fill();
	for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
		vm_digest_reset(d);
		for (size_t off = 0; off < LEN; off += cuts[c])
			vm_digest_update(d, data + off, off + cuts[c] > LEN ? LEN - off : cuts[c]);
		assert_int_equal(vm_digest_bytes(d), LEN);
		assert_true(vm_digest_value(d) == vm_digest_of(data, LEN));
	}
	vm_digest_reset(d);
	assert_true(vm_digest_value(d) == vm_digest_of(NULL, 0));
	data[LEN / 2] ^= 1;
	assert_false(vm_digest_of(data, LEN) == vm_digest_value(d));
	vm_digest_free(d);
	vm_digest_free(NULL);
}

struct done {
	bool ended;
	struct xp_link_result res;
};

static void on_done(void *cookie, const struct xp_link_result *res, void *arg)
{
	struct done *d = cookie;

	d->res = *res;
	d->ended = true;
}

/* Writes all of buf to fd, reading and keeping what comes back on rfd meanwhile. */
static void pump_both(int wfd, const uint8_t *buf, size_t len, int rfd, uint8_t *got, size_t *n,
		      size_t cap)
{
	size_t off = 0;

	while (off < len) {
		struct pollfd p[2] = { { .fd = wfd, .events = POLLOUT },
				       { .fd = rfd, .events = POLLIN } };

		assert_true(poll(p, 2, 10000) > 0);
		if (p[0].revents & POLLOUT) {
			ssize_t k = write(wfd, buf + off, len - off);

			assert_true(k > 0);
			off += (size_t)k;
		}
		if (p[1].revents & POLLIN) {
			ssize_t k = read(rfd, got + *n, cap - *n);

			assert_true(k >= 0);
			*n += (size_t)k;
		}
	}
}

/*
 * One link: QEMU's end writes data (direction a to b) and reads it all on the far end, which
 * sends back a short answer (b to a); both ends half-close. The result's digests are those of
 * the bytes each direction carried.
 */
static void one_link(enum xp_path path, bool digest)
{
	struct xp_pool_conf conf = {
		.threads = 1, .slots = 4, .pipe_size = 1u << 20, .path = path
	};
	struct xp_link_opts o = { 0 };
	static uint8_t got[LEN];
	struct done d = { 0 };
	static const char back[] = "the return path's few bytes";
	struct xp_pool *p;
	struct xp_link *l;
	int a[2], b[2];
	size_t n = 0;

	fill();
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, a), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, b), 0);
	assert_int_equal(xp_pool_new(&conf, on_done, NULL, &p), 0);
	o.cookie = &d;
	o.digest = digest;
	assert_int_equal(xp_pool_attach(p, a[1], b[1], &o, &l), 0);
	pump_both(a[0], data, LEN, b[0], got, &n, sizeof(got));
	assert_int_equal(shutdown(a[0], SHUT_WR), 0);
	while (n < LEN) {
		struct pollfd pf = { .fd = b[0], .events = POLLIN };
		ssize_t k;

		assert_true(poll(&pf, 1, 10000) > 0);
		k = read(b[0], got + n, sizeof(got) - n);
		assert_true(k > 0);
		n += (size_t)k;
	}
	assert_memory_equal(got, data, LEN);
	assert_int_equal(write(b[0], back, sizeof(back)), sizeof(back));
	assert_int_equal(shutdown(b[0], SHUT_WR), 0);
	while (!d.ended) {
		struct pollfd pf = { .fd = xp_pool_event_fd(p), .events = POLLIN };

		assert_true(poll(&pf, 1, 10000) > 0);
		xp_pool_reap(p);
	}
	assert_int_equal(d.res.end, XP_END_CLEAN);
	assert_int_equal(d.res.bytes[0], LEN);
	assert_int_equal(d.res.bytes[1], sizeof(back));
	assert_int_equal(d.res.digested, digest);
	if (digest) {
		assert_int_equal(d.res.digest_bytes[0], LEN);
		assert_true(d.res.digest[0] == vm_digest_of(data, LEN));
		assert_int_equal(d.res.digest_bytes[1], sizeof(back));
		assert_true(d.res.digest[1] == vm_digest_of(back, sizeof(back)));
	}
	xp_pool_free(p);
	close(a[0]);
	close(b[0]);
}

/*
 * A link whose bytes and both ends are already there when it is attached finishes in its first
 * steps, with no poll armed: the pool must still say so at once (the worker wakes the control
 * thread before it waits, not with its next completion, which here never comes).
 */
static void ends_at_once(enum xp_path path)
{
	struct xp_pool_conf conf = {
		.threads = 1, .slots = 4, .pipe_size = 1u << 20, .path = path
	};
	static const char there[] = "all of one direction, and its end";
	static const char back[] = "and of the other";
	struct xp_link_opts o = { .digest = true };
	struct done d = { 0 };
	struct xp_pool *p;
	struct xp_link *l;
	char got[64];
	int a[2], b[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, a), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, b), 0);
	assert_int_equal(write(a[0], there, sizeof(there)), sizeof(there));
	assert_int_equal(shutdown(a[0], SHUT_WR), 0);
	assert_int_equal(write(b[0], back, sizeof(back)), sizeof(back));
	assert_int_equal(shutdown(b[0], SHUT_WR), 0);
	assert_int_equal(xp_pool_new(&conf, on_done, NULL, &p), 0);
	o.cookie = &d;
	assert_int_equal(xp_pool_attach(p, a[1], b[1], &o, &l), 0);
	while (!d.ended) {
		struct pollfd pf = { .fd = xp_pool_event_fd(p), .events = POLLIN };

		assert_true(poll(&pf, 1, 5000) > 0);
		xp_pool_reap(p);
	}
	assert_int_equal(d.res.end, XP_END_CLEAN);
	assert_int_equal(d.res.bytes[0], sizeof(there));
	assert_int_equal(d.res.bytes[1], sizeof(back));
	assert_true(d.res.digest[0] == vm_digest_of(there, sizeof(there)));
	assert_true(d.res.digest[1] == vm_digest_of(back, sizeof(back)));
	assert_int_equal(read(b[0], got, sizeof(got)), sizeof(there));
	assert_int_equal(read(a[0], got, sizeof(got)), sizeof(back));
	xp_pool_free(p);
	close(a[0]);
	close(b[0]);
}

static void test_ends_at_once(void **state)
{
	(void)state;
	ends_at_once(XP_PATH_SPLICE);
	ends_at_once(XP_PATH_COPY);
}

static void test_splice_path(void **state)
{
	(void)state;
	one_link(XP_PATH_SPLICE, true);
}

static void test_copy_path(void **state)
{
	(void)state;
	one_link(XP_PATH_COPY, true);
}

static void test_no_digest(void **state)
{
	(void)state;
	one_link(XP_PATH_SPLICE, false);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_digest_chunks),
		cmocka_unit_test(test_splice_path),
		cmocka_unit_test(test_copy_path),
		cmocka_unit_test(test_no_digest),
		cmocka_unit_test(test_ends_at_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
