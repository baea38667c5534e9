// SPDX-License-Identifier: Apache-2.0
/* Unit tests for the node-hop preamble and reply codec (proxy/px_preamble.h): round trips,
 * truncation, and every way a preamble can be refused. No I/O. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "px_preamble.h"

static void fill_key(char *key, size_t n)
{
	static const char chars[] = "abcXYZ019._-";

	for (size_t i = 0; i < n; i++)
		key[i] = chars[i % (sizeof(chars) - 1)];
	key[n] = '\0';
}

static void put_be16(uint8_t *p, uint16_t v)
{
	p[0] = v >> 8;
	p[1] = v;
}

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

/* Builds a preamble by hand, so that the decoder is not only checked against the encoder. */
static size_t build_raw(uint8_t *buf, uint16_t version, uint16_t flags, uint32_t port, uint32_t seq,
			uint16_t keylen, uint16_t reserved, const char *key)
{
	put_be32(buf, 0x564d4750u);
	put_be16(buf + 4, version);
	put_be16(buf + 6, flags);
	put_be32(buf + 8, port);
	put_be32(buf + 12, seq);
	put_be16(buf + 16, keylen);
	put_be16(buf + 18, reserved);
	memcpy(buf + 20, key, strlen(key));
	return 20 + strlen(key);
}

/* Decodes from an exactly-sized heap copy, so ASan sees any read past len. */
static int decode_exact(const uint8_t *buf, size_t len, struct px_preamble *ret)
{
	uint8_t *copy = malloc(len ? len : 1);
	int r;

	assert_non_null(copy);
	memcpy(copy, buf, len);
	r = px_preamble_decode(copy, len, ret);
	free(copy);
	return r;
}

static void check_round_trip(size_t keylen, uint32_t port, uint32_t seq)
{
	struct px_preamble in = {.version = PX_PROTO_VERSION, .port = port, .seq = seq};
	struct px_preamble out;
	uint8_t buf[PX_PREAMBLE_MAX], raw[PX_PREAMBLE_MAX];
	int n;

	fill_key(in.key, keylen);
	n = px_preamble_encode(&in, buf, sizeof(buf));
	assert_int_equal(n, PX_PREAMBLE_FIXED + keylen);
	/* The wire layout of doc/interfaces.md, byte for byte. */
	assert_int_equal(build_raw(raw, 1, 0, port, seq, keylen, 0, in.key), n);
	assert_memory_equal(buf, raw, n);

	memset(&out, 0xa5, sizeof(out));
	assert_int_equal(decode_exact(buf, n, &out), n);
	assert_int_equal(out.version, PX_PROTO_VERSION);
	assert_int_equal(out.port, port);
	assert_int_equal(out.seq, seq);
	assert_string_equal(out.key, in.key);
}

static void test_round_trip(void **state)
{
	static const uint32_t ports[] = {0, 1, 49152, 65535};
	static const uint32_t seqs[] = {0, 1, 0x7fffffffu, 0xffffffffu};
	static const size_t keylens[] = {1, 2, 127, PX_KEY_MAX};

	for (size_t k = 0; k < sizeof(keylens) / sizeof(keylens[0]); k++)
		for (size_t p = 0; p < sizeof(ports) / sizeof(ports[0]); p++)
			for (size_t s = 0; s < sizeof(seqs) / sizeof(seqs[0]); s++)
				check_round_trip(keylens[k], ports[p], seqs[s]);
}

static void test_decode_with_trailing_bytes(void **state)
{
	struct px_preamble in = {.version = PX_PROTO_VERSION, .port = 7, .seq = 3}, out;
	uint8_t buf[PX_PREAMBLE_MAX + 64];
	int n;

	strcpy(in.key, "vm-1");
	n = px_preamble_encode(&in, buf, sizeof(buf));
	assert_int_equal(n, 24);
	/* The peer's first data bytes may follow in the same read: they are not the preamble's. */
	memset(buf + n, 'x', sizeof(buf) - n);
	assert_int_equal(decode_exact(buf, sizeof(buf), &out), n);
	assert_string_equal(out.key, "vm-1");
}

static void test_truncations_need_more(void **state)
{
	static const size_t keylens[] = {1, 5, PX_KEY_MAX};

	for (size_t k = 0; k < sizeof(keylens) / sizeof(keylens[0]); k++) {
		struct px_preamble in = {
			.version = PX_PROTO_VERSION, .port = 65535, .seq = 0xffffffffu};
		struct px_preamble out, canary;
		uint8_t buf[PX_PREAMBLE_MAX];
		int n;

		fill_key(in.key, keylens[k]);
		n = px_preamble_encode(&in, buf, sizeof(buf));
		assert_int_equal(n, PX_PREAMBLE_FIXED + keylens[k]);
		for (int len = 0; len < n; len++) {
			memset(&out, 0x5a, sizeof(out));
			canary = out;
			/* Neither a false error nor an early success. */
			assert_int_equal(decode_exact(buf, len, &out), 0);
			/* *ret is written only on success. */
			assert_memory_equal(&out, &canary, sizeof(out));
		}
		assert_int_equal(decode_exact(buf, n, &out), n);
	}
}

static void test_garbage_first_byte(void **state)
{
	struct px_preamble out;
	uint8_t buf[PX_PREAMBLE_MAX];

	for (int b = 0; b < 256; b++) {
		if (b == 'V')
			continue;
		buf[0] = b;
		assert_int_equal(decode_exact(buf, 1, &out), -PX_ERR_MALFORMED);
	}
	/* A disagreement in any later magic byte is refused as soon as that byte is there. */
	memcpy(buf, "VMGX", 4);
	assert_int_equal(decode_exact(buf, 3, &out), 0);
	assert_int_equal(decode_exact(buf, 4, &out), -PX_ERR_MALFORMED);
	memcpy(buf, "VXGP", 4);
	assert_int_equal(decode_exact(buf, 2, &out), -PX_ERR_MALFORMED);
	/* The reply magic is not a preamble. */
	memcpy(buf, "VMGR", 4);
	assert_int_equal(decode_exact(buf, 4, &out), -PX_ERR_MALFORMED);
	/* An HTTP request or a TLS ClientHello on the node-hop port. */
	assert_int_equal(decode_exact((const uint8_t *)"GET / HTTP/1.1\r\n", 16, &out),
			 -PX_ERR_MALFORMED);
	assert_int_equal(decode_exact((const uint8_t *)"\x16\x03\x01\x02\x00", 5, &out),
			 -PX_ERR_MALFORMED);
}

static void test_wrong_version(void **state)
{
	static const uint16_t versions[] = {0, 2, 0x0100, 0x0101, 0xffff};
	struct px_preamble out;
	uint8_t buf[PX_PREAMBLE_MAX];

	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
		size_t n = build_raw(buf, versions[i], 0, 1, 0, 3, 0, "abc");

		for (size_t len = 0; len < 6; len++)
			assert_int_equal(decode_exact(buf, len, &out), 0);
		for (size_t len = 6; len <= n; len++)
			assert_int_equal(decode_exact(buf, len, &out), -PX_ERR_VERSION);
	}
}

static void check_malformed(const uint8_t *buf, size_t n)
{
	struct px_preamble out, canary;

	memset(&out, 0x33, sizeof(out));
	canary = out;
	assert_int_equal(decode_exact(buf, n, &out), -PX_ERR_MALFORMED);
	assert_memory_equal(&out, &canary, sizeof(out));
}

static void test_malformed_fixed_part(void **state)
{
	uint8_t buf[PX_PREAMBLE_MAX + 8];
	char key[PX_KEY_MAX + 2];
	size_t n;

	/* Flags other than SECRET, DPDK, DIGEST, VERIFY, RESUMABLE and RESUME, and reserved,
	 * must be 0, judged once the fixed part is there. */
	for (int bit = 0; bit < 16; bit++) {
		n = build_raw(buf, 1, (1u << bit) | PX_PREAMBLE_F_SECRET, 1, 0, 3, 0, "abc");
		if (1u << bit != PX_PREAMBLE_F_SECRET && 1u << bit != PX_PREAMBLE_F_DPDK &&
		    1u << bit != PX_PREAMBLE_F_DIGEST && 1u << bit != PX_PREAMBLE_F_VERIFY &&
		    1u << bit != PX_PREAMBLE_F_RESUMABLE && 1u << bit != PX_PREAMBLE_F_RESUME) {
			check_malformed(buf, n);
			check_malformed(buf, PX_PREAMBLE_FIXED);
		}
		n = build_raw(buf, 1, 0, 1, 0, 3, 1u << bit, "abc");
		check_malformed(buf, n);
		check_malformed(buf, PX_PREAMBLE_FIXED);
	}
	/* A report is no QEMU connection: it neither offers DPDK nor asks for digests. */
	n = build_raw(buf, 1, PX_PREAMBLE_F_VERIFY | PX_PREAMBLE_F_DPDK, 1, 0, 3, 0, "abc");
	check_malformed(buf, PX_PREAMBLE_FIXED);
	n = build_raw(buf, 1, PX_PREAMBLE_F_VERIFY | PX_PREAMBLE_F_DIGEST, 1, 0, 3, 0, "abc");
	check_malformed(buf, PX_PREAMBLE_FIXED);
	n = build_raw(buf, 1, PX_PREAMBLE_F_VERIFY | PX_PREAMBLE_F_RESUMABLE, 1, 0, 3, 0, "abc");
	check_malformed(buf, PX_PREAMBLE_FIXED);
	/* A resumption is no new connection: it offers nothing, asks for nothing. */
	for (unsigned int f = PX_PREAMBLE_F_DPDK; f <= PX_PREAMBLE_F_RESUMABLE; f <<= 1) {
		n = build_raw(buf, 1, PX_PREAMBLE_F_RESUME | f, 1, 0, 3, 0, "abc");
		check_malformed(buf, PX_PREAMBLE_FIXED);
	}
	/* Key length 0: refused, not "need more" and not success with an empty key. */
	n = build_raw(buf, 1, 0, 1, 0, 0, 0, "");
	check_malformed(buf, n);
	/* Key length over 128, even with all of the key there. */
	fill_key(key, PX_KEY_MAX + 1);
	n = build_raw(buf, 1, 0, 1, 0, PX_KEY_MAX + 1, 0, key);
	check_malformed(buf, PX_PREAMBLE_FIXED);
	check_malformed(buf, n);
	n = build_raw(buf, 1, 0, 1, 0, 0xffff, 0, "abc");
	check_malformed(buf, n);
	/* Logical port over 65535. */
	static const uint32_t bad_ports[] = {65536, 0x7fffffffu, 0xffffffffu};

	for (size_t i = 0; i < sizeof(bad_ports) / sizeof(bad_ports[0]); i++) {
		n = build_raw(buf, 1, 0, bad_ports[i], 0, 3, 0, "abc");
		check_malformed(buf, n);
		check_malformed(buf, PX_PREAMBLE_FIXED);
	}
}

static void test_malformed_key(void **state)
{
	static const char *const bad_keys[] = {"a b", "a/b",  "a\nb", "key!", "k\xc3\xa9y",
					       "a:b", "\x7f", "a+b",  "a@b"};
	uint8_t buf[PX_PREAMBLE_MAX];
	size_t n;

	for (size_t i = 0; i < sizeof(bad_keys) / sizeof(bad_keys[0]); i++) {
		n = build_raw(buf, 1, 0, 1, 0, strlen(bad_keys[i]), 0, bad_keys[i]);
		check_malformed(buf, n);
	}
	/* A NUL inside the announced key length is not a shorter key. */
	n = build_raw(buf, 1, 0, 1, 0, 3, 0, "abc");
	buf[21] = '\0';
	check_malformed(buf, n);
}

static void test_encode_rejects(void **state)
{
	struct px_preamble p = {.version = PX_PROTO_VERSION, .port = 1, .seq = 0};
	uint8_t buf[PX_PREAMBLE_MAX + 1];

	/* Invalid keys. */
	p.key[0] = '\0';
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);
	strcpy(p.key, "a b");
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);
	strcpy(p.key, "a/b");
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);
	/* Port over 65535. */
	strcpy(p.key, "vm");
	p.port = 65536;
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);
	p.port = 0xffffffffu;
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);
	p.port = 65535;
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), 22);

	/* Short buffers: one byte short fails, the exact size fits. */
	assert_int_equal(px_preamble_encode(&p, buf, 21), -ENOSPC);
	assert_int_equal(px_preamble_encode(&p, buf, 0), -ENOSPC);
	assert_int_equal(px_preamble_encode(&p, buf, PX_PREAMBLE_FIXED), -ENOSPC);
	assert_int_equal(px_preamble_encode(&p, buf, 22), 22);
	fill_key(p.key, PX_KEY_MAX);
	assert_int_equal(px_preamble_encode(&p, buf, PX_PREAMBLE_FIXED + PX_KEY_MAX - 1), -ENOSPC);
	assert_int_equal(px_preamble_encode(&p, buf, PX_PREAMBLE_FIXED + PX_KEY_MAX),
			 PX_PREAMBLE_FIXED + PX_KEY_MAX);
	/* With the secret and a DPDK offer, and with the secret and a report's digests (the
	 * longest: PX_PREAMBLE_MAX); a report with an offer is refused. */
	p.has_secret = true;
	p.dpdk = (struct px_dpdk){ .ip = 1, .port = 1, .stream = 1 };
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)),
			 PX_PREAMBLE_FIXED + PX_KEY_MAX + PX_SECRET_LEN + PX_DPDK_LEN);
	p.verify = true;
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);
	memset(&p.dpdk, 0, sizeof(p.dpdk));
	assert_int_equal(px_preamble_encode(&p, buf, PX_PREAMBLE_MAX - 1), -ENOSPC);
	assert_int_equal(px_preamble_encode(&p, buf, PX_PREAMBLE_MAX), PX_PREAMBLE_MAX);
	p.digest = true;
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);
}

/* The secret rides after the key, flagged; every split of it decodes the same. */
static void test_secret_round_trip(void **state)
{
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = 49152, .seq = 7 }, out;
	uint8_t buf[PX_PREAMBLE_MAX];
	int n;

	strcpy(p.key, "vm-1");
	p.has_secret = true;
	for (unsigned int i = 0; i < PX_SECRET_LEN; i++)
		p.secret[i] = (uint8_t)(0xa0 + i);
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_int_equal(n, PX_PREAMBLE_FIXED + 4 + PX_SECRET_LEN);
	assert_int_equal(buf[7], PX_PREAMBLE_F_SECRET);
	assert_int_equal(px_preamble_len(buf), (size_t)n);
	for (int len = 0; len < n; len++)
		assert_int_equal(decode_exact(buf, (size_t)len, &out), 0);
	assert_int_equal(decode_exact(buf, (size_t)n, &out), n);
	assert_true(out.has_secret);
	assert_memory_equal(out.secret, p.secret, PX_SECRET_LEN);
	assert_string_equal(out.key, "vm-1");
	/* Without the flag the same bytes end at the key: no secret. */
	p.has_secret = false;
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_int_equal(decode_exact(buf, (size_t)n, &out), n);
	assert_false(out.has_secret);
}

static void test_encode_key_too_long(void **state)
{
	/* A struct whose key is not terminated within PX_KEY_MAX + 1 bytes. */
	struct {
		struct px_preamble p;
		char tail[16];
	} s;
	uint8_t buf[PX_PREAMBLE_MAX + 32];

	memset(&s, 'k', sizeof(s));
	s.p.version = PX_PROTO_VERSION;
	s.p.port = 1;
	s.p.seq = 0;
	s.tail[sizeof(s.tail) - 1] = '\0';
	assert_int_equal(px_preamble_encode(&s.p, buf, sizeof(buf)), -EINVAL);
	fill_key(s.p.key, PX_KEY_MAX);
	s.p.has_secret = false;
	s.p.digest = s.p.verify = s.p.resumable = s.p.resume = s.p.dpdk_resume = false;
	s.p.compress = s.p.compress_dpdk = false;
	memset(&s.p.dpdk, 0, sizeof(s.p.dpdk));
	assert_int_equal(px_preamble_encode(&s.p, buf, sizeof(buf)),
			 PX_PREAMBLE_FIXED + PX_KEY_MAX);
}

/* A data connection asks for the check with a bare flag; a report carries both directions'
 * counts and digests after the secret, and the answer carries the verdict and the target's. */
static void test_verify_round_trip(void **state)
{
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = 49152, .seq = 3 }, q;
	struct px_digests dg = { .bytes = { 1ull << 40, 7 }, .digest = { 0x0123456789abcdefull, 42 } };
	struct px_digests got;
	uint8_t buf[PX_PREAMBLE_MAX], r[PX_REPLY_MAX];
	enum px_verdict v;
	enum px_status st;
	int n;

	(void)state;
	strcpy(p.key, "vm");
	p.has_secret = true;
	p.digest = true;
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_int_equal(n, PX_PREAMBLE_FIXED + 2 + PX_SECRET_LEN);
	assert_int_equal(buf[7], PX_PREAMBLE_F_SECRET | PX_PREAMBLE_F_DIGEST);
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &q), n);
	assert_true(q.digest);
	assert_false(q.verify);

	p.digest = false;
	p.verify = true;
	p.dg = dg;
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_int_equal(n, PX_PREAMBLE_FIXED + 2 + PX_SECRET_LEN + PX_DIGESTS_LEN);
	for (int len = 0; len < n; len++)
		assert_int_equal(px_preamble_decode(buf, (size_t)len, &q), 0);
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &q), n);
	assert_true(q.verify);
	assert_int_equal(q.seq, 3);
	assert_true(px_digests_equal(&q.dg, &dg));

	for (int i = 0; i <= PX_V_MAX; i++) {
		assert_int_equal(px_reply_encode_verified((enum px_verdict)i, &dg, r),
				 PX_REPLY_VERIFY_LEN);
		assert_int_equal(px_reply_len(r, PX_REPLY_LEN), PX_REPLY_VERIFY_LEN);
		for (size_t len = 0; len < PX_REPLY_VERIFY_LEN; len++)
			assert_int_equal(px_reply_decode_verified(r, len, &v, &got), 0);
		assert_int_equal(px_reply_decode_verified(r, sizeof(r), &v, &got),
				 PX_REPLY_VERIFY_LEN);
		assert_int_equal(v, i);
		assert_true(px_digests_equal(&got, &dg));
		assert_non_null(px_verdict_str(v));
	}
	/* a verdict out of range, and another status, are not a verdict */
	r[PX_REPLY_LEN + 3] = PX_V_MAX + 1;
	assert_int_equal(px_reply_decode_verified(r, sizeof(r), &v, &got), -EBADMSG);
	px_reply_encode(PX_ERR_UNKNOWN_KEY, NULL, r);
	assert_int_equal(px_reply_len(r, PX_REPLY_LEN), PX_REPLY_LEN);
	assert_int_equal(px_reply_decode_verified(r, PX_REPLY_LEN, &v, &got), -EBADMSG);
	assert_int_equal(px_reply_decode(r, PX_REPLY_LEN, &st, NULL), PX_REPLY_LEN);
	assert_int_equal(st, PX_ERR_UNKNOWN_KEY);
	got = dg;
	got.digest[1]++;
	assert_false(px_digests_equal(&got, &dg));
	assert_int_equal(px_digests_compare(&dg, &got), PX_V_MISMATCH);
	got = dg;
	got.bytes[0]--;
	assert_false(px_digests_equal(&got, &dg));
	assert_int_equal(px_digests_compare(&dg, &dg), PX_V_MATCH);
	/* fewer bytes: corrupt, unless a side says it stopped early (its QEMU had closed) */
	got.digest[0] ^= 0x55;
	assert_int_equal(px_digests_compare(&dg, &got), PX_V_MISMATCH);
	got.partial[0] = true;
	assert_int_equal(px_digests_compare(&dg, &got), PX_V_SHORT);
	/* ... but the same count with other bytes is corrupt, partial or not */
	got.bytes[0] = dg.bytes[0];
	assert_int_equal(px_digests_compare(&dg, &got), PX_V_MISMATCH);
	/* the flag travels in bit 63 of the count */
	got = dg;
	got.partial[1] = true;
	p.dg = got;
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &q), n);
	assert_true(q.dg.partial[1] && !q.dg.partial[0]);
	assert_int_equal(q.dg.bytes[1], dg.bytes[1]);
}

static void test_reply_round_trip(void **state)
{
	static const uint8_t ok_wire[PX_REPLY_LEN] = {'V', 'M', 'G', 'R', 0, 1, 0, 0};
	uint8_t buf[PX_REPLY_LEN];
	enum px_status st;

	for (int s = PX_OK; s <= PX_ERR_AUTH; s++) {
		assert_int_equal(px_reply_encode(s, NULL, buf), PX_REPLY_LEN);
		assert_memory_equal(buf, ok_wire, 6);
		assert_int_equal(buf[6], 0);
		assert_int_equal(buf[7], s);
		for (size_t len = 0; len < PX_REPLY_LEN; len++)
			assert_int_equal(px_reply_decode(buf, len, &st, NULL), 0);
		st = (enum px_status) - 1;
		assert_int_equal(px_reply_decode(buf, PX_REPLY_LEN, &st, NULL), PX_REPLY_LEN);
		assert_int_equal(st, s);
	}
}

/* The DPDK node hop: the source's offer in the preamble, the target's address in the reply. */
static void test_dpdk_round_trip(void **state)
{
	struct px_preamble p = { .version = PX_PROTO_VERSION,
				 .port = 3,
				 .seq = 9,
				 .has_secret = true,
				 .dpdk = { .ip = 0x0a000001, .port = 4790, .stream = 77 } };
	struct px_dpdk d = { .ip = 0x0a000002, .port = 4791, .stream = 0x80000005 }, got = { 0 };
	uint8_t buf[PX_PREAMBLE_MAX], r[PX_REPLY_DPDK_LEN];
	struct px_preamble q;
	enum px_status st;
	int n;

	strcpy(p.key, "m1");
	memset(p.secret, 0xab, sizeof(p.secret));
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_int_equal(n, PX_PREAMBLE_FIXED + 2 + PX_SECRET_LEN + PX_DPDK_LEN);
	for (int len = 0; len < n; len++)
		assert_int_equal(px_preamble_decode(buf, (size_t)len, &q), 0);
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &q), n);
	assert_int_equal(q.dpdk.ip, 0x0a000001);
	assert_int_equal(q.dpdk.port, 4790);
	assert_int_equal(q.dpdk.stream, 77);
	assert_memory_equal(q.secret, p.secret, PX_SECRET_LEN);
	/* a zero stream id or pad is malformed */
	buf[n - 1] = 0;
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &q), -PX_ERR_MALFORMED);
	/* no offer: no flag, no bytes */
	memset(&p.dpdk, 0, sizeof(p.dpdk));
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)),
			 PX_PREAMBLE_FIXED + 2 + PX_SECRET_LEN);
	assert_int_equal(px_preamble_decode(buf, sizeof(buf), &q),
			 PX_PREAMBLE_FIXED + 2 + PX_SECRET_LEN);
	assert_int_equal(q.dpdk.ip, 0);

	assert_int_equal(px_reply_encode(PX_OK_DPDK, &d, r), PX_REPLY_DPDK_LEN);
	/* its length: the fixed part until the status is in, then the address too */
	for (size_t len = 0; len < PX_REPLY_LEN; len++)
		assert_int_equal(px_reply_len(r, len), PX_REPLY_LEN);
	for (size_t len = PX_REPLY_LEN; len <= PX_REPLY_DPDK_LEN; len++)
		assert_int_equal(px_reply_len(r, len), PX_REPLY_DPDK_LEN);
	for (size_t len = 0; len < PX_REPLY_DPDK_LEN; len++)
		assert_int_equal(px_reply_decode(r, len, &st, &got), 0);
	assert_int_equal(px_reply_decode(r, sizeof(r), &st, &got), PX_REPLY_DPDK_LEN);
	assert_int_equal(st, PX_OK_DPDK);
	assert_int_equal(got.ip, d.ip);
	assert_int_equal(got.port, d.port);
	assert_int_equal(got.stream, d.stream);
	r[PX_REPLY_LEN] = r[PX_REPLY_LEN + 1] = r[PX_REPLY_LEN + 2] = r[PX_REPLY_LEN + 3] = 0;
	assert_int_equal(px_reply_decode(r, sizeof(r), &st, &got), -EBADMSG);
}

static void test_reply_bad(void **state)
{
	uint8_t buf[PX_REPLY_LEN];
	enum px_status st = PX_ERR_SHUTDOWN;

	px_reply_encode(PX_OK, NULL, buf);
	buf[0] ^= 1;
	assert_int_equal(px_reply_decode(buf, PX_REPLY_LEN, &st, NULL), -EBADMSG);
	px_reply_encode(PX_OK, NULL, buf);
	buf[3] = 'P'; /* the preamble's magic */
	assert_int_equal(px_reply_decode(buf, PX_REPLY_LEN, &st, NULL), -EBADMSG);
	px_reply_encode(PX_OK, NULL, buf);
	buf[5] = 2;
	assert_int_equal(px_reply_decode(buf, PX_REPLY_LEN, &st, NULL), -EBADMSG);
	px_reply_encode(PX_OK, NULL, buf);
	buf[4] = 1;
	assert_int_equal(px_reply_decode(buf, PX_REPLY_LEN, &st, NULL), -EBADMSG);
	/* *ret untouched on failure. */
	assert_int_equal(st, PX_ERR_SHUTDOWN);
}

static void test_key_valid(void **state)
{
	static const struct {
		const char *key;
		int valid;
	} cases[] = {
		{"a", 1},   {"Z", 1},		{"0", 1},	   {".", 1},	{"_", 1},
		{"-", 1},   {"vm-42.mig_1", 1}, {"ABCxyz0189", 1}, {"", 0},	{" ", 0},
		{"a b", 0}, {"a/b", 0},		{"a\tb", 0},	   {"a\nb", 0}, {"a:b", 0},
		{"a*b", 0}, {"k\xc3\xa9", 0},	{"a,b", 0},	   {"~", 0},
	};
	char key[PX_KEY_MAX + 2];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		assert_int_equal(!!px_key_valid(cases[i].key), cases[i].valid);
	fill_key(key, PX_KEY_MAX);
	assert_true(px_key_valid(key));
	fill_key(key, PX_KEY_MAX + 1);
	assert_false(px_key_valid(key));
	fill_key(key, 1);
	assert_true(px_key_valid(key));
}

static void test_status_str(void **state)
{
	for (int s = PX_OK; s <= PX_ERR_LIMIT; s++) {
		const char *str = px_status_str(s);

		assert_non_null(str);
		assert_true(strlen(str) > 0);
		for (int t = PX_OK; t < s; t++)
			assert_string_not_equal(str, px_status_str(t));
	}
	assert_non_null(px_status_str((enum px_status)99));
	assert_non_null(px_status_str((enum px_status) - 1));
}

/* The offer and a resumption round-trip; the replies that carry a token and an offset too. */
static void test_resume(void **state)
{
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = 49152, .seq = 3 }, out;
	uint8_t buf[PX_PREAMBLE_MAX], r[PX_REPLY_MAX], tok[PX_TOKEN_LEN];
	enum px_status st;
	int n;

	(void)state;
	strcpy(p.key, "vm-1");
	p.has_secret = true;
	memset(p.secret, 0xa5, sizeof(p.secret));
	p.resumable = true;
	p.digest = true;
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_int_equal(n, PX_PREAMBLE_FIXED + 4 + PX_SECRET_LEN);
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &out), n);
	assert_true(out.resumable && out.digest && !out.resume);
	p.resumable = p.digest = false;
	p.resume = true;
	memset(p.token, 0x3c, sizeof(p.token));
	p.have = 0x0102030405060708ull;
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_int_equal(n, PX_PREAMBLE_FIXED + 4 + PX_SECRET_LEN + PX_RESUME_LEN);
	for (int len = 0; len < n; len++)
		assert_int_equal(px_preamble_decode(buf, (size_t)len, &out), 0);
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &out), n);
	assert_true(out.resume && !out.resumable && out.have == p.have);
	assert_memory_equal(out.token, p.token, PX_TOKEN_LEN);
	assert_memory_equal(out.secret, p.secret, PX_SECRET_LEN);
	p.digest = true; /* a resumption asks for nothing */
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);

	memset(tok, 0x77, sizeof(tok));
	assert_int_equal(px_reply_encode_resumable(tok, NULL, r), PX_REPLY_RESUMABLE_LEN);
	assert_int_equal(px_reply_len(r, PX_REPLY_LEN), PX_REPLY_RESUMABLE_LEN);
	assert_int_equal(px_reply_decode(r, PX_REPLY_LEN, &st, NULL), 0);
	assert_int_equal(px_reply_decode(r, PX_REPLY_RESUMABLE_LEN, &st, NULL),
			 PX_REPLY_RESUMABLE_LEN);
	assert_int_equal(st, PX_OK_RESUMABLE);
	memset(tok, 0, sizeof(tok));
	px_reply_token(r, tok);
	assert_int_equal(tok[0], 0x77);
	assert_int_equal(tok[PX_TOKEN_LEN - 1], 0x77);
	/* over DPDK, resumable over the kernel path: the address, then the token */
	{
		struct px_dpdk d = { .ip = 0x0a000002, .port = 4791, .stream = 9 }, got = { 0 };

		memset(tok, 0x55, sizeof(tok));
		assert_int_equal(px_reply_encode_resumable(tok, &d, r), PX_REPLY_DPDK_RESUMABLE_LEN);
		assert_int_equal(px_reply_len(r, PX_REPLY_LEN), PX_REPLY_DPDK_RESUMABLE_LEN);
		assert_int_equal(px_reply_decode(r, PX_REPLY_DPDK_LEN, &st, &got), 0);
		assert_int_equal(px_reply_decode(r, PX_REPLY_DPDK_RESUMABLE_LEN, &st, &got),
				 PX_REPLY_DPDK_RESUMABLE_LEN);
		assert_int_equal(st, PX_OK_DPDK_RESUMABLE);
		assert_true(got.ip == d.ip && got.port == d.port && got.stream == d.stream);
		memset(tok, 0, sizeof(tok));
		px_reply_token(r, tok);
		assert_int_equal(tok[0], 0x55);
		assert_int_equal(tok[PX_TOKEN_LEN - 1], 0x55);
		/* no address: malformed */
		memset(r + PX_REPLY_LEN, 0, PX_DPDK_LEN);
		assert_int_equal(px_reply_decode(r, PX_REPLY_DPDK_RESUMABLE_LEN, &st, &got),
				 -EBADMSG);
	}
	/* the source offers resuming a DPDK connection only with both the offer and
	 * resumption; a decoder refuses the flag alone */
	p.resume = false;
	p.digest = false;
	p.resumable = true;
	p.dpdk_resume = true;
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);
	p.dpdk = (struct px_dpdk){ .ip = 0x0a000001, .port = 4790, .stream = 77 };
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_true(n > 0);
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &out), n);
	assert_true(out.dpdk_resume && out.resumable && out.dpdk.ip);
	buf[7] &= (uint8_t)~PX_PREAMBLE_F_RESUMABLE;
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &out), -PX_ERR_MALFORMED);
	/* compressed chunks on the DPDK hop: only with compression and DPDK resumption, both
	 * ways; a decoder refuses the flag without them */
	p.compress_dpdk = true;
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);
	p.compress = true;
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_true(n > 0);
	assert_int_equal(buf[6] & (PX_PREAMBLE_F_COMPRESS_DPDK >> 8),
			 PX_PREAMBLE_F_COMPRESS_DPDK >> 8);
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &out), n);
	assert_true(out.compress_dpdk && out.compress && out.dpdk_resume);
	buf[7] &= (uint8_t)~PX_PREAMBLE_F_COMPRESS;
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &out), -PX_ERR_MALFORMED);
	buf[7] |= PX_PREAMBLE_F_COMPRESS;
	buf[7] &= (uint8_t)~PX_PREAMBLE_F_DPDK_RESUME;
	assert_int_equal(px_preamble_decode(buf, (size_t)n, &out), -PX_ERR_MALFORMED);
	p.dpdk_resume = false;
	assert_int_equal(px_preamble_encode(&p, buf, sizeof(buf)), -EINVAL);
	p.compress = p.compress_dpdk = false;
	assert_int_equal(px_reply_encode_resumed(12345, r), PX_REPLY_RESUMED_LEN);
	assert_int_equal(px_reply_decode(r, PX_REPLY_RESUMED_LEN, &st, NULL), PX_REPLY_RESUMED_LEN);
	assert_int_equal(st, PX_RESUMED);
	assert_true(px_reply_have(r) == 12345);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_resume),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_decode_with_trailing_bytes),
		cmocka_unit_test(test_truncations_need_more),
		cmocka_unit_test(test_garbage_first_byte),
		cmocka_unit_test(test_wrong_version),
		cmocka_unit_test(test_malformed_fixed_part),
		cmocka_unit_test(test_malformed_key),
		cmocka_unit_test(test_encode_rejects),
		cmocka_unit_test(test_encode_key_too_long),
		cmocka_unit_test(test_secret_round_trip),
		cmocka_unit_test(test_reply_round_trip),
		cmocka_unit_test(test_verify_round_trip),
		cmocka_unit_test(test_dpdk_round_trip),
		cmocka_unit_test(test_reply_bad),
		cmocka_unit_test(test_key_valid),
		cmocka_unit_test(test_status_str),
	};

	return cmocka_run_group_tests_name("px_preamble", tests, NULL, NULL);
}
