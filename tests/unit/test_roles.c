// SPDX-License-Identifier: Apache-2.0
/* Unit tests of the source and target roles (proxy/px_source.c, px_target.c, and the lifecycle
 * and caps around them) through a fake transport (fake_io.h): ordering with a delayed first
 * connection, refusals, the order timeout, stop during set-up, peers that hang up mid-preamble,
 * TLS outcomes, limits, drain, the caps handed to each link, and the DPDK node hop's offer. No
 * socket, no thread, no sleep. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_io.h"
#include "px_node.h"
#include "xp_bucket.h"

#define KEY	 "vm1"
#define PORT	 49152
#define DST_SOCK "/tmp/vmigd-test-roles-dst.sock"
#define MB	 1000000ull

struct t {
	struct fake_io f;
	struct px_config conf;
	struct px_node *n;
	char dir[64];
};

/* Stands in for an OpenSSL context: proxy only asks whether there is one. */
static char fake_tls_ctx;

static void conf_default(struct px_config *c, bool tls)
{
	memset(c, 0, sizeof(*c));
	assert_int_equal(xp_addr_parse("0.0.0.0:0", 1, &c->listen), 0);
	strcpy(c->advertise, "198.18.0.2");
	c->threads = 1;
	c->slots = 64;
	c->order_timeout_ms = 10000;
	c->connect_timeout_ms = 10000;
	c->tls = tls ? (struct xp_tls *)&fake_tls_ctx : NULL;
	c->handshake_timeout_ms = 10000;
	c->preamble_timeout_ms = 5000;
	c->max_unauth = 64;
	c->max_migration_conns = 64;
	c->shaper = PX_SHAPE_BUCKET;
	c->socket_uid = c->socket_gid = -1;
}

static void start(struct t *t)
{
	assert_int_equal(px_node_new_io(&fake_io_ops, &t->f, &t->conf, &t->n), 0);
}

static int setup_plain(void **state)
{
	struct t *t = calloc(1, sizeof(*t));

	fake_io_init(&t->f, false);
	conf_default(&t->conf, false);
	strcpy(t->dir, "/tmp/vmigd-test-roles-XXXXXX");
	assert_non_null(mkdtemp(t->dir));
	fake_log_begin();
	*state = t;
	return 0;
}

static int setup_tls(void **state)
{
	struct t *t;

	setup_plain(state);
	t = *state;
	t->f.tls = true;
	conf_default(&t->conf, true);
	return 0;
}

static int teardown(void **state)
{
	struct t *t = *state;
	char sub[128];

	px_node_free(t->n);
	fake_io_done(&t->f);
	fake_log_end();
	snprintf(sub, sizeof(sub), "%s/migrationproxy", t->dir);
	rmdir(sub);
	rmdir(t->dir);
	free(t);
	return 0;
}

/* ---- helpers ---- */

/* The secret of the last target_start(): what its source puts in each preamble. */
static uint8_t secret[PX_SECRET_LEN];

static size_t preamble(const char *key, uint32_t port, uint32_t seq, uint8_t *buf)
{
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = port, .seq = seq };
	int r;

	strcpy(p.key, key);
	p.has_secret = true;
	memcpy(p.secret, secret, PX_SECRET_LEN);
	r = px_preamble_encode(&p, buf, PX_PREAMBLE_MAX);
	assert_true(r > 0);
	return (size_t)r;
}

/* A node-hop connection from a source that sends the preamble of (key, port, seq). */
static struct fake_conn *arrive(struct t *t, const char *key, uint32_t port, uint32_t seq)
{
	uint8_t buf[PX_PREAMBLE_MAX];
	size_t len = preamble(key, port, seq, buf);
	struct fake_conn *c = fake_incoming(&t->f, buf, len);

	fake_settle(&t->f);
	return c;
}

/* A node-hop connection on the own listener of the KubeVirt-mode port whose TCP port is tcp. */
static struct fake_conn *arrive_on(struct t *t, unsigned int tcp)
{
	struct fake_conn *c =
		fake_incoming_on(&t->f, FAKE_FIRST_PORT_LISTEN + (int)(tcp - 41000), "", 0);

	fake_settle(&t->f);
	return c;
}

/* The status a target answered on c; -1 while it has not answered. */
static int reply_of(const struct fake_conn *c)
{
	enum px_status st;

	if (c->out_len < PX_REPLY_LEN)
		return -1;
	assert_int_equal(px_reply_decode(c->out, PX_REPLY_LEN, &st, NULL), PX_REPLY_LEN);
	return (int)st;
}

static void target_start(struct t *t, const char *key, uint64_t cap)
{
	struct px_port_info p = { .id = PORT };
	struct px_portmap out;
	char err[256];

	strcpy(p.path, DST_SOCK);
	assert_int_equal(px_target_start(t->n, key, 1, &p, &(struct px_start){ .cap = cap }, &out,
					 err, sizeof(err)),
			 0);
	assert_int_equal(out.port, 40000);
	assert_string_equal(out.address, "198.18.0.2");
	assert_true(out.has_secret);
	memcpy(secret, out.secret, PX_SECRET_LEN);
}

/* The hook vmigd-test's test_delay_first_ms installs (ctrl/ctl_test.c): each port's first
 * connection held back arg ms. */
static unsigned int hold_first(uint64_t arg, uint32_t port, uint32_t seq)
{
	return seq == 0 ? (unsigned int)arg : 0;
}

/* Starts a source of key; returns the path QEMU connects to. */
static const char *source_start(struct t *t, const char *key, unsigned int delay_ms, uint64_t cap)
{
	static struct px_port_info out[PX_PORTS_MAX];
	struct px_portmap pm = { .port = 40000, .nports = 1, .ports = { PORT } };
	struct px_start opts = { .cap = cap };
	char err[256];

	if (delay_ms)
		opts.hook = (struct px_source_hook){ .hold_ms = hold_first, .arg = delay_ms };
	strcpy(pm.key, key);
	strcpy(pm.address, "198.18.0.2");
	assert_int_equal(px_source_start(t->n, &pm, t->dir, &opts, out, err, sizeof(err)), 0);
	return out[0].path;
}

/* The preamble a source wrote on c. */
static struct px_preamble written_preamble(const struct fake_conn *c)
{
	struct px_preamble p;

	assert_true(px_preamble_decode(c->out, c->out_len, &p) > 0);
	return p;
}

static void answer(struct t *t, struct fake_conn *c, enum px_status st)
{
	uint8_t r[PX_REPLY_LEN];

	px_reply_encode(st, NULL, r);
	fake_feed(c, r, sizeof(r));
	fake_settle(&t->f);
}

struct seen {
	const char *key;
	bool found;
	struct px_migration_info mi;
	char state[16], error[200];
	char conn_state[8][16];
	char conn_tls[8][16];
};

static void see_one(const struct px_migration_info *mi, void *arg)
{
	struct seen *s = arg;

	if (strcmp(mi->key, s->key))
		return;
	s->found = true;
	s->mi = *mi;
	snprintf(s->state, sizeof(s->state), "%s", mi->state);
	snprintf(s->error, sizeof(s->error), "%s", mi->error ? mi->error : "");
	for (unsigned int i = 0; i < mi->nconns && i < 8; i++) {
		snprintf(s->conn_state[i], 16, "%s", mi->conns[i].state);
		snprintf(s->conn_tls[i], 16, "%s", mi->conns[i].tls ? mi->conns[i].tls : "off");
	}
	s->mi.conns = NULL;
}

static struct seen see(struct t *t, const char *key)
{
	struct seen s = { .key = key };

	px_node_foreach(t->n, see_one, &s);
	return s;
}

static bool logged(const char *text)
{
	return strstr(fake_log(), text) != NULL;
}

#define assert_logged(text)                                                                        \
	do {                                                                                       \
		if (!logged(text))                                                                 \
			fail_msg("not in the log: %s", text);                                      \
	} while (0)

/* ---- target role ---- */

/* Connections 2 and 1 arrive before 0: QEMU's socket sees 0, 1, 2, in that order. */
static void test_target_orders_a_delayed_first(void **state)
{
	struct t *t = *state;
	struct fake_conn *c[3];
	struct seen s;

	start(t);
	target_start(t, KEY, 0);
	c[2] = arrive(t, KEY, PORT, 2);
	c[1] = arrive(t, KEY, PORT, 1);
	assert_int_equal(t->f.nlocal_connects, 0);
	assert_int_equal(reply_of(c[1]), -1);
	assert_int_equal(reply_of(c[2]), -1);
	s = see(t, KEY);
	assert_string_equal(s.conn_state[0], "parked");
	assert_string_equal(s.conn_state[1], "parked");

	c[0] = arrive(t, KEY, PORT, 0);
	assert_int_equal(t->f.nlocal_connects, 3);
	assert_int_equal(t->f.nlinks, 3);
	for (unsigned int i = 0; i < 3; i++) {
		assert_string_equal(t->f.local_connects[i].path, DST_SOCK);
		assert_ptr_equal(t->f.links[i].conn, c[i]);
		assert_int_equal(t->f.links[i].local_fd, t->f.local_connects[i].fd);
		assert_int_equal(reply_of(c[i]), PX_OK);
	}
	s = see(t, KEY);
	assert_int_equal(s.mi.conns_reordered, 2);
	assert_int_equal(s.mi.conns_total, 3);
	assert_int_equal(s.mi.conns_active, 3);
	assert_string_equal(s.conn_state[0], "linked");

	for (unsigned int i = 0; i < 3; i++) {
		t->f.links[i].bytes[1] = 1000 * (i + 1);
		fake_link_end(&t->f, &t->f.links[i], XP_END_CLEAN, 0);
	}
	assert_int_equal(px_target_stop(t->n, KEY, NULL, 0), 0);
	fake_end_pass(&t->f);
	assert_logged(
		"migration vm1 role=target stop conns=3 reordered=2 bytes=6000 tx=0 rx=6000 ");
	assert_logged("outcome=ok");
}

/* A connection for a live migration, but with no or a wrong secret: refused with "not the
 * peer", and the migration goes on to link its own connection 0. */
static void test_target_secret(void **state)
{
	struct t *t = *state;
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = PORT, .seq = 0 };
	uint8_t buf[PX_PREAMBLE_MAX];
	struct fake_conn *none, *wrong, *good;
	int len;

	start(t);
	target_start(t, KEY, 0);
	strcpy(p.key, KEY);
	len = px_preamble_encode(&p, buf, sizeof(buf));
	none = fake_incoming(&t->f, buf, (size_t)len);
	p.has_secret = true;
	memcpy(p.secret, secret, PX_SECRET_LEN);
	p.secret[PX_SECRET_LEN - 1] ^= 1;
	len = px_preamble_encode(&p, buf, sizeof(buf));
	wrong = fake_incoming(&t->f, buf, (size_t)len);
	fake_settle(&t->f);
	assert_int_equal(reply_of(none), PX_ERR_AUTH);
	assert_int_equal(reply_of(wrong), PX_ERR_AUTH);
	assert_true(none->closed && wrong->closed);
	assert_logged("connection from 198.18.0.1:50100 refused (not-the-peer): no secret");
	assert_logged("connection from 198.18.0.1:50101 refused (not-the-peer): a wrong secret; "
		      "the migration goes on");
	good = arrive(t, KEY, PORT, 0);
	assert_int_equal(reply_of(good), PX_OK);
	assert_true(good->attached);
	assert_string_equal(see(t, KEY).state, "active");
}

/* Every connection of a migration comes from the peer of its first: another address, or
 * under TLS another certificate subject, is refused even with the right secret. */
static void test_target_binds_first_peer(void **state)
{
	struct t *t = *state;
	uint8_t buf[PX_PREAMBLE_MAX];
	struct fake_conn *first, *other, *again;

	start(t);
	target_start(t, KEY, 0);
	first = fake_incoming(&t->f, buf, preamble(KEY, PORT, 0, buf));
	snprintf(first->peer, sizeof(first->peer), "[fd00::1]:50001");
	fake_settle(&t->f);
	assert_int_equal(reply_of(first), PX_OK);
	other = fake_incoming(&t->f, buf, preamble(KEY, PORT, 1, buf));
	snprintf(other->peer, sizeof(other->peer), "[fd00::2]:50002");
	again = fake_incoming(&t->f, buf, preamble(KEY, PORT, 1, buf));
	snprintf(again->peer, sizeof(again->peer), "[fd00::1]:50003");
	fake_settle(&t->f);
	assert_int_equal(reply_of(other), PX_ERR_AUTH);
	assert_logged("refused (not-the-peer): address fd00::2, not fd00::1 of its first "
		      "connection");
	/* Seq 1 was not used up by the refused one. */
	assert_int_equal(reply_of(again), PX_OK);
	assert_int_equal(see(t, KEY).mi.conns_total, 2);
}

static void test_target_binds_first_certificate(void **state)
{
	struct t *t = *state;
	uint8_t buf[PX_PREAMBLE_MAX];
	struct fake_conn *first, *other;

	start(t);
	target_start(t, KEY, 0);
	first = fake_incoming(&t->f, buf, preamble(KEY, PORT, 0, buf));
	snprintf(first->peer_name, sizeof(first->peer_name), "/CN=node-a");
	other = fake_incoming(&t->f, buf, preamble(KEY, PORT, 1, buf));
	snprintf(other->peer_name, sizeof(other->peer_name), "/CN=node-b");
	fake_settle(&t->f);
	assert_int_equal(reply_of(first), PX_OK);
	assert_int_equal(reply_of(other), PX_ERR_AUTH);
	assert_logged("refused (not-the-peer): certificate \"/CN=node-b\", not \"/CN=node-a\" of "
		      "its first connection");
}

/* The target reads exactly the preamble: what follows it is QEMU's and stays unread. */
static void test_target_reads_only_the_preamble(void **state)
{
	struct t *t = *state;
	uint8_t buf[PX_PREAMBLE_MAX + 100];
	struct fake_conn *c;
	size_t len;

	start(t);
	target_start(t, KEY, 0);
	len = preamble(KEY, PORT, 0, buf);
	memset(buf + len, 0x5a, 100);
	c = fake_incoming(&t->f, buf, len + 100);
	fake_settle(&t->f);
	assert_int_equal(reply_of(c), PX_OK);
	assert_true(c->attached);
	assert_int_equal(c->in_off, len);
}

static void test_target_refuses_unknown_key_port_and_garbage(void **state)
{
	struct t *t = *state;
	struct fake_conn *c;
	uint8_t junk[PX_PREAMBLE_FIXED];

	start(t);
	target_start(t, KEY, 0);
	c = arrive(t, "nope", PORT, 0);
	assert_int_equal(reply_of(c), PX_ERR_UNKNOWN_KEY);
	assert_true(c->closed);
	assert_logged("for nope: unknown migration key; connection refused");

	c = arrive(t, KEY, 1234, 0);
	assert_int_equal(reply_of(c), PX_ERR_UNKNOWN_PORT);
	assert_true(c->closed);

	memset(junk, 'G', sizeof(junk));
	c = fake_incoming(&t->f, junk, sizeof(junk));
	fake_settle(&t->f);
	assert_int_equal(reply_of(c), PX_ERR_MALFORMED);
	assert_true(c->closed);

	/* None of it touched the migration. */
	assert_int_equal(t->f.nlocal_connects, 0);
	assert_int_equal(see(t, KEY).mi.conns_active, 0);
	assert_string_equal(see(t, KEY).state, "active");
	assert_int_equal(px_node_active_conns(t->n), 0);
}

/* Connection 1 waits for 0, which never comes: after --order-timeout the migration fails. */
static void test_target_order_timeout(void **state)
{
	struct t *t = *state;
	struct fake_conn *c1, *late;
	struct seen s;

	start(t);
	target_start(t, KEY, 0);
	c1 = arrive(t, KEY, PORT, 1);
	fake_advance(&t->f, 9999);
	assert_int_equal(reply_of(c1), -1);
	assert_string_equal(see(t, KEY).state, "active");

	fake_advance(&t->f, 1);
	assert_int_equal(reply_of(c1), PX_ERR_FAILED);
	assert_true(c1->closed);
	s = see(t, KEY);
	assert_string_equal(s.state, "failed");
	assert_string_equal(s.error, "port 49152 connection 0 did not arrive within 10000 ms (1 "
				     "later connections were waiting)");
	assert_logged("migration vm1 role=target failed: port 49152 connection 0 did not arrive");

	/* The sequence stays broken until the operator starts a new attempt. */
	late = arrive(t, KEY, PORT, 0);
	assert_int_equal(reply_of(late), PX_ERR_FAILED);
	assert_int_equal(t->f.nlocal_connects, 0);
}

/* A source that hangs up in the middle of its preamble costs nothing but its own connection. */
static void test_target_peer_closes_mid_preamble(void **state)
{
	struct t *t = *state;
	uint8_t buf[PX_PREAMBLE_MAX];
	struct fake_conn *c;

	start(t);
	target_start(t, KEY, 0);
	preamble(KEY, PORT, 0, buf);
	c = fake_incoming(&t->f, buf, 10);
	fake_settle(&t->f);
	assert_false(c->closed);
	assert_int_equal(px_node_active_conns(t->n), 1);
	fake_feed(c, NULL, 0);
	fake_settle(&t->f);
	assert_true(c->closed);
	assert_int_equal(c->out_len, 0);
	assert_int_equal(px_node_active_conns(t->n), 0);
	assert_logged("closed after 10 bytes, before the preamble was complete");
	assert_string_equal(see(t, KEY).state, "active");
	/* Its timer went with it: only the node's tick is left. */
	assert_int_equal(fake_timers_live(&t->f), 1);
}

static void test_target_preamble_timeout(void **state)
{
	struct t *t = *state;
	struct fake_conn *c;

	start(t);
	target_start(t, KEY, 0);
	c = fake_incoming(&t->f, "VMGP", 4);
	fake_settle(&t->f);
	fake_advance(&t->f, 4999);
	assert_false(c->closed);
	fake_advance(&t->f, 1);
	assert_true(c->closed);
	assert_logged("no complete preamble within 5000 ms (4 bytes); dropped");
}

/* A local socket that cannot be opened fails the migration, and everything parked behind it. */
static void test_target_local_connect_fails(void **state)
{
	struct t *t = *state;
	struct fake_conn *c0, *c1;

	start(t);
	target_start(t, KEY, 0);
	strcpy(t->f.refuse_local, DST_SOCK);
	c1 = arrive(t, KEY, PORT, 1);
	c0 = arrive(t, KEY, PORT, 0);
	assert_int_equal(reply_of(c0), PX_ERR_CONNECT);
	assert_int_equal(reply_of(c1), PX_ERR_FAILED);
	assert_string_equal(see(t, KEY).error,
			    "port 49152 connection 0 could not be opened on " DST_SOCK);
	assert_int_equal(t->f.nlinks, 0);
}

static void test_target_migration_conn_limit(void **state)
{
	struct t *t = *state;
	struct fake_conn *c[3];

	t->conf.max_migration_conns = 2;
	start(t);
	target_start(t, KEY, 0);
	c[0] = arrive(t, KEY, PORT, 0);
	c[1] = arrive(t, KEY, PORT, 1);
	c[2] = arrive(t, KEY, PORT, 2);
	assert_int_equal(reply_of(c[0]), PX_OK);
	assert_int_equal(reply_of(c[1]), PX_OK);
	assert_int_equal(reply_of(c[2]), PX_ERR_LIMIT);
	assert_string_equal(see(t, KEY).state, "failed");
	assert_true(t->f.links[0].aborted && t->f.links[1].aborted);
	assert_logged("refused (migration-conn-limit)");
}

/* A node-hop connection from addr that has sent nothing yet. */
static struct fake_conn *incoming_from(struct t *t, const char *addr)
{
	struct fake_conn *c = fake_incoming(&t->f, "", 0);

	snprintf(c->peer, sizeof(c->peer), "%s:%d", addr, 50000 + (int)t->f.nconns);
	fake_settle(&t->f);
	return c;
}

/*
 * Unauthenticated connections are bounded per listener; at the bound the oldest of the address
 * that holds most goes, never the newcomer, so a stranger's flood evicts only its own and a
 * peer still gets in.
 */
static void test_target_max_unauthenticated(void **state)
{
	struct t *t = *state;
	struct fake_conn *c[8];

	t->conf.max_unauth = 4;
	start(t);
	for (int i = 0; i < 5; i++)
		c[i] = incoming_from(t, "198.18.0.9");
	assert_true(c[0]->closed);
	assert_false(c[1]->closed || c[2]->closed || c[3]->closed || c[4]->closed);
	assert_logged("closed the oldest unauthenticated connection from 198.18.0.9 "
		      "(too-many-unauthenticated): 4 on this listener, 4 from 198.18.0.9 "
		      "(--max-unauthenticated 4 per listener)");
	/* The listener is full: the stranger's oldest go, not the peer's. */
	c[5] = incoming_from(t, "198.18.0.1");
	c[6] = incoming_from(t, "198.18.0.1");
	assert_true(c[1]->closed && c[2]->closed);
	assert_false(c[3]->closed || c[4]->closed || c[5]->closed || c[6]->closed);
	/* Two each: on the tie the oldest of all goes, the stranger's. */
	c[7] = incoming_from(t, "198.18.0.7");
	assert_true(c[3]->closed);
	assert_false(c[4]->closed || c[5]->closed || c[6]->closed || c[7]->closed);
	assert_int_equal(px_node_active_conns(t->n), 4);
}

/* A peer's burst of channels from one address, accepted before any preamble is read, fits
 * whole while the listener has room: no share per address cuts it short. */
static void test_target_burst_from_one_address(void **state)
{
	struct t *t = *state;
	struct fake_conn *c[33];

	t->conf.max_unauth = 64;
	start(t);
	for (int i = 0; i < 33; i++)
		c[i] = incoming_from(t, "198.18.0.1");
	for (int i = 0; i < 33; i++)
		assert_false(c[i]->closed);
	assert_int_equal(px_node_active_conns(t->n), 33);
}

/* The shared port and a KubeVirt-mode port's own listener have a budget each. */
static void test_target_unauthenticated_per_listener(void **state)
{
	struct t *t = *state;
	struct px_port_info p = { .id = PORT };
	struct px_portmap out;
	struct fake_conn *shared[2], *own;
	char err[256];

	t->conf.max_unauth = 2;
	start(t);
	strcpy(p.path, DST_SOCK);
	assert_int_equal(px_target_start(t->n, KEY, 1, &p, &(struct px_start){ .kubevirt = true },
					 &out, err, sizeof(err)),
			 0);
	shared[0] = incoming_from(t, "198.18.0.9");
	shared[1] = incoming_from(t, "198.18.0.8");
	own = fake_incoming_on(&t->f, FAKE_FIRST_PORT_LISTEN + (int)(out.tcp[0] - 41000), "", 0);
	fake_settle(&t->f);
	assert_false(shared[0]->closed || shared[1]->closed || own->closed);
}

/* A TLS client that sends nothing is dropped after 3 s, long before --handshake-timeout. */
static void test_target_silent_dropped(void **state)
{
	struct t *t = *state;
	struct fake_conn *silent, *slow;

	start(t);
	silent = fake_incoming(&t->f, "", 0);
	silent->hs_again = 1000000;
	slow = fake_incoming(&t->f, "", 0);
	slow->hs_again = 1000000;
	fake_fire(&t->f, FAKE_TCP_LISTEN);
	fake_feed(slow, "\x16", 1);
	fake_fire(&t->f, slow->c.fd);
	fake_advance(&t->f, 2999);
	assert_false(silent->closed);
	fake_advance(&t->f, 1);
	assert_true(silent->closed);
	assert_false(slow->closed);
	assert_logged("TLS refused (silent): not a byte within 3000 ms; dropped");
	fake_advance(&t->f, 7000);
	assert_true(slow->closed);
	assert_logged("TLS refused (handshake-timeout)");
}

static void test_target_tls_handshake_then_preamble(void **state)
{
	struct t *t = *state;
	uint8_t buf[PX_PREAMBLE_MAX];
	size_t len;
	struct fake_conn *c;
	struct seen s;

	start(t);
	target_start(t, KEY, 0);
	len = preamble(KEY, PORT, 0, buf);
	c = fake_incoming(&t->f, buf, len);
	c->hs_again = 2;
	fake_settle(&t->f);
	assert_int_equal(c->hs_calls, 3);
	assert_int_equal(reply_of(c), PX_OK);
	s = see(t, KEY);
	assert_string_equal(s.conn_tls[0], "TLSv1.3");
	assert_logged("port 49152 connection 0 linked tls=TLSv1.3 cipher=TLS_AES_128_GCM_SHA256");
}

static void test_target_tls_refused(void **state)
{
	struct t *t = *state;
	struct fake_conn *c, *slow;

	start(t);
	c = fake_incoming(&t->f, "", 0);
	c->hs_result = -EPROTO;
	c->refusal = "untrusted-ca";
	c->detail = "certificate \"/CN=rogue\": unable to get local issuer certificate";
	fake_settle(&t->f);
	assert_true(c->closed);
	assert_logged("TLS refused (untrusted-ca): certificate \"/CN=rogue\"");

	/* One that never finishes its handshake is dropped after --handshake-timeout. */
	slow = fake_incoming(&t->f, "", 0);
	slow->hs_again = 1000000;
	fake_fire(&t->f, FAKE_TCP_LISTEN);
	fake_feed(slow, "\x16", 1);
	fake_fire(&t->f, slow->c.fd);
	fake_advance(&t->f, 10000);
	assert_true(slow->closed);
	assert_logged("TLS refused (handshake-timeout): no complete handshake within 10000 ms");
	assert_int_equal(px_node_active_conns(t->n), 0);
}

/* ---- source role ---- */

/* The first connection held back (a hook as vmigd-test's --test-delay-first): the others reach the
 * target first, each with the sequence number of its accept, and each QEMU socket is linked to its
 * own node hop. */
static void test_source_delayed_first(void **state)
{
	struct t *t = *state;
	const char *path;
	int qemu[3];

	start(t);
	path = source_start(t, KEY, 500, 0);
	for (unsigned int i = 0; i < 3; i++)
		qemu[i] = fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	assert_int_equal(t->f.nconns, 2);
	assert_int_equal(written_preamble(t->f.conns[0]).seq, 1);
	assert_int_equal(written_preamble(t->f.conns[1]).seq, 2);
	assert_string_equal(see(t, KEY).conn_state[2], "delayed");

	fake_advance(&t->f, 500);
	assert_int_equal(t->f.nconns, 3);
	{
		struct px_preamble p = written_preamble(t->f.conns[2]);

		assert_int_equal(p.seq, 0);
		assert_int_equal(p.port, PORT);
		assert_string_equal(p.key, KEY);
		assert_string_equal(t->f.conns[2]->peer, "198.18.0.2:40000");
	}
	/* Nothing is relayed before the target's answer. */
	assert_int_equal(t->f.nlinks, 0);
	answer(t, t->f.conns[2], PX_OK);
	answer(t, t->f.conns[0], PX_OK);
	answer(t, t->f.conns[1], PX_OK);
	assert_int_equal(t->f.nlinks, 3);
	assert_int_equal(t->f.links[0].local_fd, qemu[0]);
	assert_ptr_equal(t->f.links[0].conn, t->f.conns[2]);
	assert_int_equal(t->f.links[1].local_fd, qemu[1]);
	assert_int_equal(t->f.links[2].local_fd, qemu[2]);
	assert_int_equal(see(t, KEY).mi.conns_total, 3);
}

/* The target refuses, or hangs up before its reply: QEMU's connection is dropped, never relayed. */
static void test_source_refused_and_closed_before_reply(void **state)
{
	struct t *t = *state;
	const char *path;
	int q0, q1;

	start(t);
	path = source_start(t, KEY, 0, 0);
	q0 = fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	answer(t, t->f.conns[0], PX_ERR_UNKNOWN_KEY);
	assert_true(t->f.conns[0]->closed);
	assert_int_equal(t->f.closed_fds[0], q0);
	assert_logged("migration vm1 role=source: port 49152 connection 0 to 198.18.0.2:40000: "
		      "refused by the target: unknown migration key");

	q1 = fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	fake_feed(t->f.conns[1], "VMG", 3);
	fake_feed(t->f.conns[1], NULL, 0);
	fake_settle(&t->f);
	assert_true(t->f.conns[1]->closed);
	assert_int_equal(t->f.closed_fds[1], q1);
	assert_logged("connection 1 to 198.18.0.2:40000: the target closed the connection before "
		      "replying");
	assert_int_equal(see(t, KEY).mi.conns_failed, 2);
	assert_int_equal(t->f.nlinks, 0);
}

/* Stop while a connect is still in progress: the half-made connection goes, nothing lingers. */
static void test_source_stop_during_setup(void **state)
{
	struct t *t = *state;
	const char *path;
	int q;

	t->f.connect_later = true;
	start(t);
	path = source_start(t, KEY, 0, 0);
	q = fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	assert_int_equal(t->f.nconns, 1);
	assert_string_equal(see(t, KEY).conn_state[0], "connecting");
	assert_int_equal(px_source_stop(t->n, KEY, NULL, 0), 0);
	fake_end_pass(&t->f);
	assert_true(t->f.conns[0]->closed);
	assert_false(fake_watched(&t->f, t->f.conns[0]->c.fd));
	assert_int_equal(t->f.closed_fds[0], t->f.listeners[0].fd);
	assert_int_equal(t->f.closed_fds[1], q);
	assert_false(see(t, KEY).found);
	assert_logged("migration vm1 role=source stop conns=0 ");
	assert_int_equal(fake_timers_live(&t->f), 1);
	assert_int_equal(px_node_active_conns(t->n), 0);
}

/* Links already carried get STOP_GRACE_MS (5 s) to end by themselves, then they are cut. */
static void test_stop_grace_then_cut(void **state)
{
	struct t *t = *state;
	struct fake_conn *c;

	start(t);
	target_start(t, KEY, 0);
	c = arrive(t, KEY, PORT, 0);
	assert_true(c->attached);
	assert_int_equal(px_target_stop(t->n, KEY, NULL, 0), 0);
	fake_end_pass(&t->f);
	/* The key is free at once: a new attempt may start. */
	target_start(t, KEY, 0);
	fake_advance(&t->f, 4999);
	assert_false(t->f.links[0].aborted);
	fake_advance(&t->f, 1);
	assert_true(t->f.links[0].aborted);
	fake_link_end(&t->f, &t->f.links[0], XP_END_ABORTED, 0);
	assert_logged("1 connections still open 5000 ms after stop; cutting them");
	assert_logged("outcome=stopped with 1 connections in flight");
}

static void test_source_connect_timeout(void **state)
{
	struct t *t = *state;
	int q;

	t->f.connect_later = true;
	start(t);
	q = fake_qemu_connect(&t->f, source_start(t, KEY, 0, 0));
	fake_settle(&t->f);
	fake_advance(&t->f, 9999);
	assert_false(t->f.conns[0]->closed);
	fake_advance(&t->f, 1);
	assert_true(t->f.conns[0]->closed);
	assert_int_equal(t->f.closed_fds[0], q);
	assert_logged("connection 0 to 198.18.0.2:40000: connect timed out");
	assert_int_equal(see(t, KEY).mi.conns_failed, 1);
}

/* Connected, then the target hangs up during the handshake (it refused our certificate). */
static void test_source_tls_refused(void **state)
{
	struct t *t = *state;
	const char *path;

	t->f.connect_later = true;
	start(t);
	path = source_start(t, KEY, 0, 0);
	fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	t->f.conns[0]->hs_result = -ECONNRESET;
	t->f.conns[0]->refusal = "closed";
	t->f.conns[0]->refusal_closed = true;
	t->f.conns[0]->detail = "the peer closed the connection during the handshake";
	fake_connect_done(&t->f, t->f.conns[0], 0);
	fake_settle(&t->f);
	assert_true(t->f.conns[0]->closed);
	assert_int_equal(t->f.conns[0]->out_len, 0);
	assert_logged(
		"TLS refused (closed): the peer closed the connection during the handshake (is "
		"the target over its --max-unauthenticated, shutting down, or not speaking "
		"TLS?)");

	/* A handshake that goes on: TLS first, then the preamble inside it. */
	fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	t->f.conns[1]->hs_again = 1;
	fake_connect_done(&t->f, t->f.conns[1], 0);
	fake_settle(&t->f);
	assert_int_equal(t->f.conns[1]->hs_calls, 2);
	assert_int_equal(written_preamble(t->f.conns[1]).seq, 1);
	answer(t, t->f.conns[1], PX_OK);
	assert_string_equal(see(t, KEY).conn_tls[0], "TLSv1.3");
}

/* More QEMU connections than --max-migration-conns fail the migration on the source too. */
static void test_source_migration_conn_limit(void **state)
{
	struct t *t = *state;
	const char *path;
	int q[3];

	t->conf.max_migration_conns = 2;
	start(t);
	path = source_start(t, KEY, 0, 0);
	for (unsigned int i = 0; i < 3; i++)
		q[i] = fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	assert_int_equal(t->f.nconns, 2);
	assert_string_equal(see(t, KEY).state, "failed");
	/* The third was reset, and the two being set up were dropped with the migration. */
	assert_int_equal(t->f.closed_fds[0], q[2]);
	assert_true(t->f.closed_reset[0]);
	assert_true(t->f.conns[0]->closed && t->f.conns[1]->closed);
}

/* ---- KubeVirt mode: per-port listeners, stock (raw) peers, ALPN between vmigd ---- */

static void target_start_kubevirt(struct t *t, enum px_tls tls, struct px_portmap *out)
{
	struct px_port_info p[2] = { { .id = PORT }, { .id = 0 } };
	char err[256];

	strcpy(p[0].path, DST_SOCK);
	strcpy(p[1].path, "/tmp/vmigd-test-roles-virtqemud-sock");
	assert_int_equal(px_target_start(t->n, KEY, 2, p,
					 &(struct px_start){ .kubevirt = true, .tls = tls }, out,
					 err, sizeof(err)),
			 0);
	assert_true(out->kubevirt);
	assert_int_equal(out->port, 0);
	assert_int_equal(out->nports, 2);
	assert_int_equal(out->ports[0], PORT);
	assert_int_equal(out->tcp[0], 41000);
	assert_int_equal(out->ports[1], 0);
	assert_int_equal(out->tcp[1], 41001);
	assert_true(out->has_secret);
	memcpy(secret, out->secret, PX_SECRET_LEN);
}

/* A KubeVirt-mode migration's source may come without the secret to its own ports only: on the
 * shared port, knowing the key is not enough. */
static void test_kubevirt_target_shared_port_needs_secret(void **state)
{
	struct t *t = *state;
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = PORT, .seq = 0 };
	uint8_t buf[PX_PREAMBLE_MAX];
	struct px_portmap map;
	struct fake_conn *none, *good;
	int len;

	start(t);
	target_start_kubevirt(t, PX_TLS_DEFAULT, &map);
	strcpy(p.key, KEY);
	len = px_preamble_encode(&p, buf, sizeof(buf));
	none = fake_incoming(&t->f, buf, (size_t)len);
	fake_settle(&t->f);
	assert_int_equal(reply_of(none), PX_ERR_AUTH);
	assert_true(none->closed);
	assert_logged("refused (not-the-peer): no secret on the shared port");
	good = arrive(t, KEY, PORT, 0);
	assert_int_equal(reply_of(good), PX_OK);
	assert_true(good->attached);
}

/* A stock source on a port's own listener: no preamble, no reply, the local socket at once,
 * stock teardown on the link; each port's connections go to that port's socket. */
static void test_kubevirt_target_raw(void **state)
{
	struct t *t = *state;
	struct px_portmap map;
	struct fake_conn *c[3];
	struct seen s;

	start(t);
	target_start_kubevirt(t, PX_TLS_DEFAULT, &map);
	c[0] = arrive_on(t, 41000);
	c[1] = arrive_on(t, 41000);
	c[2] = arrive_on(t, 41001);
	assert_int_equal(t->f.nlocal_connects, 3);
	assert_string_equal(t->f.local_connects[0].path, DST_SOCK);
	assert_string_equal(t->f.local_connects[2].path, "/tmp/vmigd-test-roles-virtqemud-sock");
	for (unsigned int i = 0; i < 3; i++) {
		assert_true(c[i]->attached);
		assert_int_equal(c[i]->out_len, 0);
		assert_true(t->f.links[i].opts.raw);
	}
	s = see(t, KEY);
	assert_true(s.mi.kubevirt);
	assert_int_equal(s.mi.conns_total, 3);
	assert_int_equal(s.mi.conns_reordered, 0);
	assert_int_equal(s.mi.ports[0].tcp, 41000);
	assert_logged("port 49152 connection 1 linked tls=off wire=raw");
	/* A stock source dials a port whose QEMU side is not there: that connection goes, and
	 * only it (no order to break). */
	strcpy(t->f.refuse_local, DST_SOCK);
	c[0] = arrive_on(t, 41000);
	assert_true(c[0]->closed);
	assert_string_equal(see(t, KEY).state, "active");
	assert_logged("raw connection 2 from 198.18.0.1:");
	/* Stop drops the listeners; the links get their grace. */
	assert_int_equal(px_target_stop(t->n, KEY, NULL, 0), 0);
	fake_end_pass(&t->f);
	assert_false(fake_watched(&t->f, FAKE_FIRST_PORT_LISTEN));
}

/* Over TLS a vmigd source says so with ALPN: preamble and order on the port's own listener, for
 * that port only; a client without ALPN (stock) is served raw. */
static void test_kubevirt_target_alpn(void **state)
{
	struct t *t = *state;
	struct px_portmap map;
	uint8_t buf[PX_PREAMBLE_MAX];
	struct fake_conn *v1, *v0, *wrong, *stock;

	start(t);
	target_start_kubevirt(t, PX_TLS_DEFAULT, &map);
	assert_true(map.tls);
	v1 = fake_incoming_on(&t->f, FAKE_FIRST_PORT_LISTEN, buf, preamble(KEY, PORT, 1, buf));
	v1->alpn = true;
	fake_settle(&t->f);
	assert_int_equal(reply_of(v1), -1); /* parked: waits for 0 */
	v0 = fake_incoming_on(&t->f, FAKE_FIRST_PORT_LISTEN, buf, preamble(KEY, PORT, 0, buf));
	v0->alpn = true;
	fake_settle(&t->f);
	assert_int_equal(reply_of(v0), PX_OK);
	assert_int_equal(reply_of(v1), PX_OK);
	assert_false(t->f.links[0].opts.raw);
	assert_int_equal(see(t, KEY).mi.conns_reordered, 1);
	/* Port 0's preamble on port 49152's listener: refused. */
	wrong = fake_incoming_on(&t->f, FAKE_FIRST_PORT_LISTEN, buf, preamble(KEY, 0, 0, buf));
	wrong->alpn = true;
	fake_settle(&t->f);
	assert_int_equal(reply_of(wrong), PX_ERR_UNKNOWN_PORT);
	stock = arrive_on(t, 41001);
	assert_true(stock->attached);
	assert_true(t->f.links[2].opts.raw);
	assert_int_equal(stock->hs_flags, XP_HS_SERVER | XP_HS_TLS);
}

/* A target stopped while a connection on its port's listener is still in its handshake: that
 * connection goes with it. */
static void test_kubevirt_target_stop_unbound(void **state)
{
	struct t *t = *state;
	struct px_portmap map;
	struct fake_conn *c;

	start(t);
	target_start_kubevirt(t, PX_TLS_DEFAULT, &map);
	c = fake_incoming_on(&t->f, FAKE_FIRST_PORT_LISTEN, "", 0);
	c->hs_again = 5;
	fake_fire(&t->f, FAKE_FIRST_PORT_LISTEN);
	assert_int_equal(px_node_active_conns(t->n), 1);
	assert_int_equal(px_target_stop(t->n, KEY, NULL, 0), 0);
	fake_end_pass(&t->f);
	assert_true(c->closed);
	assert_int_equal(px_node_active_conns(t->n), 0);
}

/* The TCP ports asked for (a restart keeping what was published): bound as given, the same
 * request again answers the same; one taken fails the start, naming it, and closes the
 * listeners already opened. */
static void test_kubevirt_target_listen_ports(void **state)
{
	struct t *t = *state;
	struct px_port_info p[2] = { { .id = PORT, .tcp = 45000 }, { .id = 0, .tcp = 45001 } };
	struct px_start o = { .kubevirt = true };
	struct px_portmap map;
	struct fake_conn *c;
	char err[256];

	start(t);
	strcpy(p[0].path, DST_SOCK);
	strcpy(p[1].path, "/tmp/vmigd-test-roles-virtqemud-sock");
	assert_int_equal(px_target_start(t->n, KEY, 2, p, &o, &map, err, sizeof(err)), 0);
	assert_int_equal(map.tcp[0], 45000);
	assert_int_equal(map.tcp[1], 45001);
	assert_int_equal(see(t, KEY).mi.ports[0].tcp, 45000);
	assert_int_equal(px_target_start(t->n, KEY, 2, p, &o, &map, err, sizeof(err)), 0);
	assert_int_equal(t->f.nport_listeners, 2);
	c = fake_incoming_on(&t->f, FAKE_FIRST_PORT_LISTEN + 1, "", 0);
	fake_settle(&t->f);
	assert_true(c->attached);
	assert_string_equal(t->f.local_connects[0].path, "/tmp/vmigd-test-roles-virtqemud-sock");
	assert_int_equal(px_target_stop(t->n, KEY, NULL, 0), 0);
	fake_end_pass(&t->f);

	/* Port 0's TCP port is taken: 49152's listener, opened first, is closed again. */
	t->f.busy_port = 45003;
	p[0].tcp = 45002;
	p[1].tcp = 45003;
	t->f.nclosed_fds = 0;
	assert_int_equal(px_target_start(t->n, "vm-busy", 2, p, &o, &map, err, sizeof(err)),
			 -EADDRINUSE);
	assert_string_equal(err, "cannot listen for port 0 on TCP port 45003: Address already in "
				 "use (EADDRINUSE)");
	assert_int_equal(t->f.nclosed_fds, 1);
	assert_int_equal(t->f.closed_fds[0], FAKE_FIRST_PORT_LISTEN + 2);
	assert_false(fake_watched(&t->f, FAKE_FIRST_PORT_LISTEN + 2));
	assert_int_equal(see(t, "vm-busy").mi.nports, 0);

	/* A TCP port of its own is KubeVirt mode's only. */
	assert_int_equal(px_target_start(t->n, "vm-plain", 1, p, &(struct px_start){ 0 }, &map, err,
					 sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "port 49152: a TCP port of its own (45002) needs KubeVirt mode, "
				 "1 to 65535");
}

/* Plain text per migration on a TLS daemon needs the per-port listeners. */
static void test_kubevirt_tls_per_migration(void **state)
{
	struct t *t = *state;
	struct px_port_info p = { .id = PORT };
	struct px_portmap map;
	struct fake_conn *c;
	char err[256];

	start(t);
	strcpy(p.path, DST_SOCK);
	assert_int_equal(px_target_start(t->n, KEY, 1, &p, &(struct px_start){ .tls = PX_TLS_OFF },
					 &map, err, sizeof(err)),
			 -EINVAL);
	assert_string_equal(err,
			    "TLS off for this migration needs per-port listeners (--kubevirt): "
			    "the shared node-hop port is TLS");
	target_start_kubevirt(t, PX_TLS_OFF, &map);
	assert_false(map.tls);
	c = arrive_on(t, 41000);
	assert_int_equal(c->hs_flags, 0);
	assert_true(c->attached);
}

static const char *source_start_kubevirt(struct t *t, enum px_tls tls)
{
	static struct px_port_info out[PX_PORTS_MAX];
	struct px_portmap pm = {
		.kubevirt = true, .nports = 2, .ports = { PORT, 0 }, .tcp = { 42000, 42001 }
	};
	char err[256];

	strcpy(pm.key, KEY);
	strcpy(pm.address, "198.18.0.2");
	assert_int_equal(px_source_start(t->n, &pm, t->dir, &(struct px_start){ .tls = tls }, out,
					 err, sizeof(err)),
			 0);
	assert_int_equal(out[0].tcp, 42000);
	assert_non_null(strstr(out[1].path, "/migrationproxy/vm1-source.sock"));
	return out[0].path;
}

/* KubeVirt's map on the source, plain text: each logical port dials its own TCP port and relays
 * at once, with no preamble. */
static void test_kubevirt_source_raw(void **state)
{
	struct t *t = *state;
	char path0[128];
	int q;

	start(t);
	source_start_kubevirt(t, PX_TLS_DEFAULT);
	q = fake_qemu_connect(&t->f, source_start_kubevirt(t, PX_TLS_DEFAULT));
	snprintf(path0, sizeof(path0), "%s/migrationproxy/vm1-source.sock", t->dir);
	fake_qemu_connect(&t->f, path0);
	fake_settle(&t->f);
	assert_int_equal(t->f.nconns, 2);
	assert_int_equal(t->f.nlinks, 2);
	assert_int_equal(t->f.links[0].local_fd, q);
	assert_true(t->f.links[0].opts.raw && t->f.links[1].opts.raw);
	assert_int_equal(t->f.conns[0]->out_len, 0);
	assert_string_equal(t->f.conns[0]->peer, "198.18.0.2");
	assert_logged("port 49152 connection 0 linked tls=off wire=raw");
	assert_logged("port 0 connection 0 linked tls=off wire=raw");
	/* The same start again changed nothing (one listener per port, as before). */
	assert_int_equal(t->f.nlisteners, 2);
}

/* KubeVirt's map over TLS: a vmigd target (ALPN) gets the preamble; a stock one is relayed
 * once its first record arrived, and one that refuses our certificate fails the connection
 * before a byte of QEMU's is sent. */
static void test_kubevirt_source_tls(void **state)
{
	struct t *t = *state;
	const char *path;

	start(t);
	path = source_start_kubevirt(t, PX_TLS_DEFAULT);
	t->f.connect_later = true;
	for (unsigned int i = 0; i < 4; i++)
		fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	assert_int_equal(t->f.nconns, 4);
	t->f.conns[0]->alpn = true;
	t->f.conns[1]->await_again = 2;
	t->f.conns[2]->await_result = -EPROTO;
	t->f.conns[2]->refusal = "peer-refused";
	t->f.conns[2]->detail = "the peer refused us: alert \"bad certificate\"";
	t->f.conns[3]->await_again = 1000000;
	for (unsigned int i = 0; i < 4; i++)
		fake_connect_done(&t->f, t->f.conns[i], 0);
	fake_settle_some(&t->f, 50);
	assert_int_equal(written_preamble(t->f.conns[0]).seq, 0);
	assert_true(t->f.conns[1]->attached);
	assert_int_equal(t->f.conns[1]->out_len, 0);
	assert_int_equal(t->f.conns[1]->await_calls, 3);
	assert_true(t->f.conns[2]->closed);
	assert_logged(
		"connection 2 to 198.18.0.2:42000: TLS refused (peer-refused): the peer refused "
		"us: alert \"bad certificate\"");
	assert_false(t->f.conns[3]->attached);
	/* A server that sends nothing after the handshake: relayed after 1 s anyway. */
	fake_advance(&t->f, 1000);
	assert_true(t->f.conns[3]->attached);
	answer(t, t->f.conns[0], PX_OK);
	assert_false(fake_link_of(&t->f, t->f.conns[0])->opts.raw);
}

/* Two keys can name the same socket file ("col" port 1, "col-1" port 0): the second start must
 * not take the live one's socket. */
static void test_source_socket_hijack(void **state)
{
	struct t *t = *state;
	struct px_port_info out[PX_PORTS_MAX];
	struct px_portmap a = {
		.key = "col", .address = "198.18.0.2", .port = 40000, .nports = 1, .ports = { 1 }
	};
	struct px_portmap b = {
		.key = "col-1", .address = "198.18.0.2", .port = 40000, .nports = 1, .ports = { 0 }
	};
	char err[256];

	start(t);
	assert_int_equal(
		px_source_start(t->n, &a, t->dir, &(struct px_start){ 0 }, out, err, sizeof(err)),
		0);
	assert_int_equal(
		px_source_start(t->n, &b, t->dir, &(struct px_start){ 0 }, out, err, sizeof(err)),
		-EEXIST);
	assert_non_null(strstr(err, "/migrationproxy/col-1-source.sock is served by migration col "
				    "(port 1)"));
	assert_int_equal(t->f.nlisteners, 1);
}

/* The sockets and migrationproxy/ get --socket-owner and their modes, whatever the umask. */
static void test_source_socket_owner(void **state)
{
	struct t *t = *state;
	char sub[128];
	struct stat st;
	mode_t old = umask(077);

	t->conf.socket_uid = (int)getuid();
	t->conf.socket_gid = (int)getgid();
	start(t);
	source_start(t, KEY, 0, 0);
	umask(old);
	assert_int_equal(t->f.listeners[0].owner.uid, (int)getuid());
	assert_int_equal(t->f.listeners[0].owner.gid, (int)getgid());
	assert_int_equal(t->f.listeners[0].owner.mode, 0660);
	snprintf(sub, sizeof(sub), "%s/migrationproxy", t->dir);
	assert_int_equal(stat(sub, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0750);
}

/* ---- caps ---- */

/* A sender presses against bucket b: takes until one comes back short. */
static void press(struct xp_bucket *b)
{
	struct xp_bucket *chain[2] = { b, NULL };
	uint64_t wait;

	for (unsigned int i = 0; i < 1000; i++)
		if (xp_bucket_take(chain, 64 * 1024, 1000000000ull, &wait) == 0)
			return;
	fail_msg("the bucket never ran dry");
}

/* Each link takes from its migration's bucket and the node's; a cap changes both at once. */
static void test_caps_applied_to_links(void **state)
{
	struct t *t = *state;
	const char *path;
	struct xp_bucket *mb;

	t->conf.node_bandwidth = 100 * MB;
	start(t);
	path = source_start(t, KEY, 0, 50 * MB);
	fake_qemu_connect(&t->f, path);
	fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	answer(t, t->f.conns[0], PX_OK);
	answer(t, t->f.conns[1], PX_OK);
	assert_int_equal(t->f.nlinks, 2);
	mb = t->f.links[0].opts.bucket[0];
	assert_non_null(mb);
	assert_ptr_equal(t->f.links[1].opts.bucket[0], mb);
	assert_int_equal(xp_bucket_rate(t->f.links[0].opts.bucket[1]), 100 * MB);
	/* Idle, it gets the floor of a share (1 MiB/s, room to start); held back by it, it gets
	 * its own cap, the lower of the two. */
	fake_advance(&t->f, 100);
	assert_int_equal(xp_bucket_rate(mb), 1 << 20);
	press(mb);
	fake_advance(&t->f, 100);
	assert_int_equal(xp_bucket_rate(mb), 50 * MB);
	assert_int_equal(see(t, KEY).mi.limit, 50 * MB);

	/* A new cap moves the share at once, not at the next tick. */
	press(mb);
	assert_int_equal(px_migration_set_cap(t->n, KEY, 20 * MB, NULL, 0), 0);
	assert_int_equal(xp_bucket_rate(mb), 20 * MB);
	assert_int_equal(see(t, KEY).mi.cap, 20 * MB);
	assert_int_equal(px_migration_set_cap(t->n, KEY, 0, NULL, 0), 0);
	/* No cap of its own: the node's share bounds it, and never to nothing. */
	assert_true(xp_bucket_rate(mb) > 0 && xp_bucket_rate(mb) <= 100 * MB);
	px_node_set_bandwidth(t->n, 0);
	assert_int_equal(xp_bucket_rate(t->f.links[0].opts.bucket[1]), 0);
	assert_int_equal(xp_bucket_rate(mb), 0);
	assert_logged("migration vm1 role=source: cap 19.1 MiB/s");
}

/* The pacing shaper splits the migration's limit among its links, and a lifted cap unpaces. */
static void test_caps_pacing_split(void **state)
{
	struct t *t = *state;
	struct fake_conn *c[2];
	uint64_t sum;

	t->conf.shaper = PX_SHAPE_PACING;
	start(t);
	target_start(t, KEY, 0);
	c[0] = arrive(t, KEY, PORT, 0);
	c[1] = arrive(t, KEY, PORT, 1);
	assert_null(t->f.links[0].opts.bucket[0]);
	assert_int_equal(px_migration_set_cap(t->n, KEY, 8 * MB, NULL, 0), 0);
	sum = t->f.links[0].pacing + t->f.links[1].pacing;
	assert_true(t->f.links[0].pacing > 0 && t->f.links[1].pacing > 0);
	assert_true(sum <= 8 * MB);
	assert_int_equal(px_migration_set_cap(t->n, KEY, 0, NULL, 0), 0);
	assert_int_equal(t->f.links[0].pacing, 0);
	assert_int_equal(t->f.links[1].pacing, 0);
	(void)c;
}

/* ---- node ---- */

static unsigned int drained_calls;

static void on_drained(void *arg)
{
	drained_calls++;
}

/*
 * Drain: no new connections (the listener stays until the end, for digest reports only: a new
 * connection is told "shutting down"), links in flight finish, then done and the listener goes.
 */
static void test_drain_waits_for_links(void **state)
{
	struct t *t = *state;
	struct fake_conn *c, *late;

	start(t);
	target_start(t, KEY, 0);
	c = arrive(t, KEY, PORT, 0);
	drained_calls = 0;
	px_node_drain(t->n, 300, on_drained, NULL);
	fake_end_pass(&t->f);
	assert_true(fake_watched(&t->f, FAKE_TCP_LISTEN));
	late = arrive(t, KEY, PORT, 1);
	assert_int_equal(reply_of(late), PX_ERR_SHUTDOWN);
	assert_int_equal(drained_calls, 0);
	fake_link_end(&t->f, fake_link_of(&t->f, c), XP_END_CLEAN, 0);
	assert_int_equal(drained_calls, 1);
	assert_false(fake_watched(&t->f, FAKE_TCP_LISTEN));
	{
		struct px_port_info p = { .id = PORT };
		struct px_portmap out;
		char err[256];

		strcpy(p.path, DST_SOCK);
		assert_int_equal(px_target_start(t->n, "vm2", 1, &p, &(struct px_start){ 0 }, &out,
						 err, sizeof(err)),
				 -ESHUTDOWN);
		assert_string_equal(err, "vmigd is shutting down");
	}
}

/* ---- takeover ---- */

/* The node that took over: its listener is the one handed over, and a target started with the
 * old node's secret takes the source's connections. */
static void test_takeover_adopt_and_given_secret(void **state)
{
	struct t *t = *state;
	struct px_port_info p = { .id = PORT };
	struct px_start opts = { .has_secret = true };
	struct px_preamble pre = { .version = PX_PROTO_VERSION, .port = PORT, .has_secret = true };
	uint8_t buf[PX_PREAMBLE_MAX], got[PX_SECRET_LEN];
	struct px_portmap out;
	struct fake_conn *c;
	char err[256];
	int len;

	t->conf.adopt = true;
	t->conf.adopt_fd = 7;
	assert_int_equal(px_node_new_io(&fake_io_ops, &t->f, &t->conf, &t->n), -EINVAL);
	assert_logged("the node-hop listener handed over is not a TCP listener");
	t->conf.adopt_fd = FAKE_TCP_LISTEN;
	start(t);
	assert_string_equal(px_node_listen_str(t->n), "198.18.0.2:40000");
	assert_true(fake_watched(&t->f, FAKE_TCP_LISTEN));
	for (unsigned int i = 0; i < PX_SECRET_LEN; i++)
		opts.secret[i] = (uint8_t)(0xa0 + i);
	strcpy(p.path, DST_SOCK);
	assert_int_equal(px_target_start(t->n, KEY, 1, &p, &opts, &out, err, sizeof(err)), 0);
	assert_memory_equal(out.secret, opts.secret, PX_SECRET_LEN);
	assert_int_equal(px_target_secret(t->n, KEY, got), 0);
	assert_memory_equal(got, opts.secret, PX_SECRET_LEN);
	assert_int_equal(px_target_secret(t->n, "vm9", got), -ENOENT);
	strcpy(pre.key, KEY);
	memcpy(pre.secret, opts.secret, PX_SECRET_LEN);
	len = px_preamble_encode(&pre, buf, sizeof(buf));
	c = fake_incoming(&t->f, buf, (size_t)len);
	fake_settle(&t->f);
	assert_int_equal(reply_of(c), PX_OK);
	assert_true(c->attached);
}

/* The old node: a target with no connection yet can be handed over, one with connections not;
 * pausing the listener leaves it open; retiring closes this copy, keeps what it carries and
 * ends once the last link ended and no migration waits for its first connection. */
static void test_takeover_retire(void **state)
{
	struct t *t = *state;
	struct px_port_info p = { .id = PORT };
	struct px_portmap out;
	struct fake_conn *c;
	char err[256];

	start(t);
	target_start(t, KEY, 0);
	c = arrive(t, KEY, PORT, 0);
	strcpy(p.path, DST_SOCK);
	assert_int_equal(px_target_start(t->n, "vm2", 1, &p, &(struct px_start){ 0 }, &out, err,
					 sizeof(err)),
			 0);
	source_start(t, "vm3", 0, 0);
	assert_int_equal(px_migration_hand_over(t->n, KEY, PX_ROLE_TARGET, "vmigd pid 9"), -EBUSY);
	assert_int_equal(px_migration_hand_over(t->n, "vm3", PX_ROLE_SOURCE, "vmigd pid 9"),
			 -EBUSY);
	assert_int_equal(px_migration_hand_over(t->n, "vm4", PX_ROLE_TARGET, "vmigd pid 9"),
			 -ENOENT);
	assert_int_equal(px_migration_hand_over(t->n, "vm2", PX_ROLE_TARGET, "vmigd pid 9"), 0);
	assert_logged("migration vm2 role=target: handed over to vmigd pid 9 before its first "
		      "connection");
	assert_false(see(t, "vm2").found);

	assert_int_equal(px_node_listen_fd(t->n), FAKE_TCP_LISTEN);
	assert_int_equal(px_node_listen_pause(t->n, true), 0);
	assert_false(fake_watched(&t->f, FAKE_TCP_LISTEN));
	assert_int_equal(px_node_listen_pause(t->n, false), 0);
	assert_true(fake_watched(&t->f, FAKE_TCP_LISTEN));

	drained_calls = 0;
	px_node_retire(t->n, 300, on_drained, NULL);
	fake_end_pass(&t->f);
	assert_int_equal(px_node_listen_fd(t->n), -1);
	assert_false(fake_watched(&t->f, FAKE_TCP_LISTEN));
	assert_logged("handed over: carrying on with 1 connections in flight and 1 migrations "
		      "waiting for their first");
	assert_int_equal(px_target_start(t->n, "vm5", 1, &p, &(struct px_start){ 0 }, &out, err,
					 sizeof(err)),
			 -ESHUTDOWN);
	assert_string_equal(err, "this vmigd has handed over to a newer one (takeover); ask the "
				 "new one");
	/* The link it carries goes on to its end... */
	fake_link_end(&t->f, fake_link_of(&t->f, c), XP_END_CLEAN, 0);
	assert_int_equal(drained_calls, 0);
	/* ... and the source still waiting for QEMU keeps it until stopped. */
	assert_int_equal(px_source_stop(t->n, "vm3", err, sizeof(err)), 0);
	fake_end_pass(&t->f);
	assert_int_equal(drained_calls, 1);
}

/* A source waiting for its first connection holds a retiring node only until the timeout. */
static void test_takeover_retire_timeout(void **state)
{
	struct t *t = *state;

	start(t);
	source_start(t, "vm3", 0, 0);
	drained_calls = 0;
	px_node_retire(t->n, 10, on_drained, NULL);
	fake_end_pass(&t->f);
	fake_advance(&t->f, 9000);
	assert_int_equal(drained_calls, 0);
	fake_advance(&t->f, 2000);
	assert_int_equal(drained_calls, 1);
}

/* A takeover's offer waits for connections the shared listener accepted whose preamble has not
 * come yet (one may be a pending target's first); a KubeVirt-mode port's own do not count. */
static void test_takeover_counts_unbound(void **state)
{
	struct t *t = *state;
	uint8_t buf[PX_PREAMBLE_MAX];
	struct fake_conn *c;
	size_t len;

	start(t);
	target_start(t, KEY, 0);
	len = preamble(KEY, PORT, 0, buf);
	assert_int_equal(px_node_unbound_shared(t->n), 0);
	c = fake_incoming(&t->f, buf, 5);
	fake_settle(&t->f);
	assert_int_equal(px_node_unbound_shared(t->n), 1);
	fake_feed(c, buf + 5, len - 5);
	fake_settle(&t->f);
	assert_int_equal(px_node_unbound_shared(t->n), 0);
	assert_int_equal(reply_of(c), PX_OK);
}

/* On the new node, a connection for a target that stayed with the old one is refused as such,
 * one for a key nobody has as unknown. */
static void test_takeover_elsewhere(void **state)
{
	struct t *t = *state;
	const char *keys[] = { "vmX" };
	struct fake_conn *c;

	start(t);
	assert_int_equal(px_node_set_elsewhere(t->n, keys, 1, "an older vmigd (pid 7)"), 0);
	assert_string_equal(px_node_elsewhere(t->n, "vmX"), "an older vmigd (pid 7)");
	assert_null(px_node_elsewhere(t->n, "vmY"));
	c = arrive(t, "vmX", PORT, 3);
	assert_int_equal(reply_of(c), PX_ERR_SHUTDOWN);
	assert_true(c->closed);
	assert_logged("migration vmX role=target: port 49152 connection 3 from 198.18.0.1:50100 "
		      "refused: the migration stayed with an older vmigd (pid 7) at the takeover");
	c = arrive(t, "vmY", PORT, 0);
	assert_int_equal(reply_of(c), PX_ERR_UNKNOWN_KEY);
	assert_int_equal(px_node_set_elsewhere(t->n, NULL, 0, NULL), 0);
	assert_null(px_node_elsewhere(t->n, "vmX"));
}

static void test_start_refusals(void **state)
{
	struct t *t = *state;
	struct px_port_info p[2] = { { .id = PORT }, { .id = PORT } };
	struct px_start none = { 0 };
	struct px_portmap out;
	char err[256];

	start(t);
	strcpy(p[0].path, DST_SOCK);
	strcpy(p[1].path, "/tmp/other.sock");
	assert_int_equal(px_target_start(t->n, "bad key", 1, p, &none, &out, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(px_target_start(t->n, KEY, 2, p, &none, &out, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "port 49152 is given twice");
	strcpy(p[0].path, "relative.sock");
	assert_int_equal(px_target_start(t->n, KEY, 1, p, &none, &out, err, sizeof(err)), -EINVAL);
	strcpy(p[0].path, "/nonexistent-dir/x.sock");
	assert_int_equal(px_target_start(t->n, KEY, 1, p, &none, &out, err, sizeof(err)), -ENOENT);
	assert_string_equal(err, "directory /nonexistent-dir does not exist");
	/* TLS for one migration needs a daemon with a certificate. */
	strcpy(p[0].path, DST_SOCK);
	assert_int_equal(px_target_start(t->n, KEY, 1, p, &(struct px_start){ .tls = PX_TLS_ON },
					 &out, err, sizeof(err)),
			 -ENOTSUP);
	assert_int_equal(px_target_stop(t->n, "nope", err, sizeof(err)), -ENOENT);
	assert_string_equal(err, "unknown migration nope: no target listener with that key");
}

/* Starts are idempotent, as KubeVirt's ProxyManager: the same arguments do nothing (the same
 * answer, nothing logged, nothing replaced); other ones replace the listeners. */
static void test_start_idempotent(void **state)
{
	struct t *t = *state;
	struct px_port_info p = { .id = PORT };
	struct px_portmap a, b, c;
	struct fake_conn *conn;
	char err[256];

	start(t);
	strcpy(p.path, DST_SOCK);
	assert_int_equal(px_target_start(t->n, KEY, 1, &p, &(struct px_start){ .kubevirt = true },
					 &a, err, sizeof(err)),
			 0);
	conn = arrive_on(t, a.tcp[0]);
	assert_true(conn->attached);
	assert_int_equal(px_target_start(t->n, KEY, 1, &p, &(struct px_start){ .kubevirt = true },
					 &b, err, sizeof(err)),
			 0);
	assert_memory_equal(&a, &b, sizeof(a));
	assert_false(t->f.links[0].aborted);
	assert_int_equal(t->f.nport_listeners, 1);
	/* Another cap is another start: new listeners, the old migration stops. */
	assert_int_equal(px_target_start(t->n, KEY, 1, &p,
					 &(struct px_start){ .kubevirt = true, .cap = 1000000 }, &c,
					 err, sizeof(err)),
			 0);
	assert_int_equal(t->f.nport_listeners, 2);
	assert_int_not_equal(c.tcp[0], a.tcp[0]);
	assert_logged("migration vm1 role=target: started again with other arguments");
	fake_advance(&t->f, 5000);
	assert_true(t->f.links[0].aborted);
}

/* ---- connection digests (px_verify.c) ---- */

/* The QEMU stream's digests of one connection, and the same as a link on a target carries them
 * (its direction 0 is the way back to the source). */
static const struct px_digests dg_good = { .bytes = { 5000, 40 },
					   .digest = { 0xabcdef0123456789ull, 0x42 } };

static void link_digests(struct fake_link *l, const struct px_digests *dg, bool target)
{
	for (int d = 0; d < 2; d++) {
		l->digest_bytes[d] = dg->bytes[d ^ target];
		l->digest[d] = dg->digest[d ^ target];
	}
}

/* A data connection that asks for the check (flag DIGEST), or a report (VERIFY) with dg. */
static struct fake_conn *arrive_dg(struct t *t, uint32_t seq, bool verify,
				   const struct px_digests *dg)
{
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = PORT, .seq = seq };
	uint8_t buf[PX_PREAMBLE_MAX];
	int len;

	strcpy(p.key, KEY);
	p.has_secret = true;
	memcpy(p.secret, secret, PX_SECRET_LEN);
	p.digest = !verify;
	p.verify = verify;
	if (dg)
		p.dg = *dg;
	len = px_preamble_encode(&p, buf, sizeof(buf));
	assert_true(len > 0);
	struct fake_conn *c = fake_incoming(&t->f, buf, (size_t)len);

	fake_settle(&t->f);
	return c;
}

/* A target node with --digest on and migration KEY started; it must advertise the check. */
static void target_start_digest(struct t *t)
{
	struct px_port_info p = { .id = PORT };
	struct px_portmap out;
	char err[256];

	t->conf.digest = PX_DIGEST_ON;
	start(t);
	strcpy(p.path, DST_SOCK);
	assert_int_equal(px_target_start(t->n, KEY, 1, &p, &(struct px_start){ 0 }, &out, err,
					 sizeof(err)),
			 0);
	assert_true(out.digest);
	memcpy(secret, out.secret, PX_SECRET_LEN);
}

/* Starts a source of KEY given a map whose target checks digests; the path QEMU connects to. */
static const char *source_start_digest(struct t *t)
{
	static struct px_port_info out[PX_PORTS_MAX];
	struct px_portmap pm = { .port = 40000, .nports = 1, .ports = { PORT }, .digest = true };
	char err[256];

	strcpy(pm.key, KEY);
	strcpy(pm.address, "198.18.0.2");
	assert_int_equal(px_source_start(t->n, &pm, t->dir, &(struct px_start){ 0 }, out, err,
					 sizeof(err)),
			 0);
	return out[0].path;
}

/* The verdict a target answered on a report; -1 while it has not. */
static int verdict_of(const struct fake_conn *c, struct px_digests *dg)
{
	enum px_verdict v;

	if (c->out_len < PX_REPLY_VERIFY_LEN)
		return -1;
	assert_int_equal(px_reply_decode_verified(c->out, c->out_len, &v, dg),
			 PX_REPLY_VERIFY_LEN);
	return (int)v;
}

/*
 * Target: it advertises the check, digests a connection that asks for it, and answers each
 * report: the same digests (match), a report before the connection ended (answered at its end,
 * though the migration was stopped meanwhile; reports still come in after the stop), different
 * bytes (corrupt: an error and outcome=corrupt), an unknown connection, and a connection whose
 * report never came (unverified after VERIFY_WAIT_MS, the stop line waits).
 */
static void test_digest_target(void **state)
{
	struct t *t = *state;
	struct px_digests bad = dg_good, got;
	struct fake_conn *c[4], *r[4];

	target_start_digest(t);
	for (unsigned int i = 0; i < 4; i++) {
		c[i] = arrive_dg(t, i, false, NULL);
		assert_int_equal(reply_of(c[i]), PX_OK);
		assert_true(t->f.links[i].opts.digest);
		link_digests(&t->f.links[i], &dg_good, true);
	}
	/* 0 ended, then its report: a match */
	fake_link_end(&t->f, &t->f.links[0], XP_END_CLEAN, 0);
	r[0] = arrive_dg(t, 0, true, &dg_good);
	assert_int_equal(verdict_of(r[0], &got), PX_V_MATCH);
	assert_true(px_digests_equal(&got, &dg_good));
	assert_true(r[0]->closed);
	/* 4: the destination QEMU closed before the end, the target read less: not corrupt */
	c[0] = arrive_dg(t, 4, false, NULL);
	link_digests(&t->f.links[4], &dg_good, true);
	t->f.links[4].digest_bytes[1] = 4000;
	t->f.links[4].digest[1] = 0x1234;
	t->f.links[4].digest_partial[1] = true;
	fake_link_end(&t->f, &t->f.links[4], XP_END_CLEAN, 0);
	r[0] = arrive_dg(t, 4, true, &dg_good);
	assert_int_equal(verdict_of(r[0], &got), PX_V_SHORT);
	assert_true(got.partial[0]);
	assert_logged("port 49152 connection 4 not verified: a QEMU closed its socket before the "
		      "stream's end");
	/* 1's report comes first and waits for its end, across the target's stop */
	r[1] = arrive_dg(t, 1, true, &dg_good);
	assert_int_equal(verdict_of(r[1], NULL), -1);
	assert_int_equal(px_target_stop(t->n, KEY, NULL, 0), 0);
	fake_end_pass(&t->f);
	assert_false(r[1]->closed);
	fake_link_end(&t->f, &t->f.links[1], XP_END_CLEAN, 0);
	assert_int_equal(verdict_of(r[1], &got), PX_V_MATCH);
	/* 2: one byte count and digest differ */
	fake_link_end(&t->f, &t->f.links[2], XP_END_CLEAN, 0);
	bad.digest[0] ^= 1;
	r[2] = arrive_dg(t, 2, true, &bad);
	assert_int_equal(verdict_of(r[2], &got), PX_V_MISMATCH);
	assert_logged("port 49152 connection 2 CORRUPT: the source read 5000 bytes "
		      "abcdef0123456788, back 40 bytes 0000000000000042; the target 5000 bytes "
		      "abcdef0123456789");
	/* a connection the target never carried */
	r[3] = arrive_dg(t, 9, true, &dg_good);
	assert_int_equal(verdict_of(r[3], NULL), PX_V_UNKNOWN);
	/* 3 ends and no report comes: the stop line waits VERIFY_WAIT_MS for it */
	fake_link_end(&t->f, &t->f.links[3], XP_END_CLEAN, 0);
	assert_false(logged("role=target stop"));
	fake_advance(&t->f, 2999);
	assert_false(logged("role=target stop"));
	fake_advance(&t->f, 1);
	assert_logged("port 49152 connection 3 not verified: no report from the source within "
		      "3000 ms of its end");
	assert_logged("role=target stop conns=5 ");
	assert_logged(" verified=2/5 digest=");
	assert_logged("outcome=corrupt (port 49152 connection 2: the source read 5000 bytes from "
		      "its QEMU, the target 5000 from the node hop, with different digests)");
}

/* Source: the target's JSON says it checks digests, so each connection asks for it; at its
 * end the source reports on a connection of its own, and the answer settles it. */
static void test_digest_source(void **state)
{
	struct t *t = *state;
	struct px_digests tgt = dg_good;
	uint8_t reply[PX_REPLY_VERIFY_LEN];
	struct px_preamble pre;
	struct fake_conn *rep[3];
	const char *path;

	t->conf.digest = PX_DIGEST_ON;
	start(t);
	path = source_start_digest(t);
	for (unsigned int i = 0; i < 3; i++)
		fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	for (unsigned int i = 0; i < 3; i++) {
		assert_true(written_preamble(t->f.conns[i]).digest);
		answer(t, t->f.conns[i], PX_OK);
		assert_true(t->f.links[i].opts.digest);
		link_digests(&t->f.links[i], &dg_good, false);
	}
	/* each end makes a report with the link's digests */
	for (unsigned int i = 0; i < 3; i++) {
		fake_link_end(&t->f, &t->f.links[i], XP_END_CLEAN, 0);
		assert_int_equal(t->f.nconns, 4 + i);
		rep[i] = t->f.conns[3 + i];
		pre = written_preamble(rep[i]);
		assert_true(pre.verify);
		assert_false(pre.digest);
		assert_int_equal(pre.seq, i);
		assert_true(px_digests_equal(&pre.dg, &dg_good));
	}
	assert_int_equal(px_source_stop(t->n, KEY, NULL, 0), 0);
	fake_end_pass(&t->f);
	/* the stop line waits for the answers */
	assert_false(logged("role=source stop"));
	px_reply_encode_verified(PX_V_MATCH, &tgt, reply);
	fake_feed(rep[0], reply, sizeof(reply));
	tgt.bytes[0]--;
	px_reply_encode_verified(PX_V_MISMATCH, &tgt, reply);
	fake_feed(rep[1], reply, sizeof(reply));
	fake_settle(&t->f);
	assert_logged("port 49152 connection 1 CORRUPT: the source read 5000 bytes");
	assert_false(logged("role=source stop"));
	/* the third gets no answer: unverified once the grace ends, the report cut */
	fake_advance(&t->f, 5000);
	assert_true(rep[2]->closed);
	assert_logged("port 49152 connection 2 not verified: the migration was cut before the "
		      "target answered");
	assert_logged("role=source stop conns=3 ");
	assert_logged(" verified=1/3 digest=");
	assert_logged("outcome=corrupt (port 49152 connection 1: ");
	assert_int_equal(px_node_active_conns(t->n), 0);
}

/* A draining target waits for the report of a connection that ended (5 s at most), then is done;
 * its listener takes that report. */
static void test_digest_drain(void **state)
{
	struct t *t = *state;
	struct fake_conn *c, *r;

	target_start_digest(t);
	c = arrive_dg(t, 0, false, NULL);
	link_digests(fake_link_of(&t->f, c), &dg_good, true);
	drained_calls = 0;
	px_node_drain(t->n, 300, on_drained, NULL);
	fake_end_pass(&t->f);
	fake_link_end(&t->f, fake_link_of(&t->f, c), XP_END_CLEAN, 0);
	assert_int_equal(drained_calls, 0);
	r = arrive_dg(t, 0, true, &dg_good);
	assert_int_equal(verdict_of(r, NULL), PX_V_MATCH);
	assert_int_equal(drained_calls, 1);
	assert_false(fake_watched(&t->f, FAKE_TCP_LISTEN));
}

/* --digest auto: a plain-text connection (spliced) is not asked, a TLS one is. */
static void test_digest_auto(void **state)
{
	struct t *t = *state;

	start(t);
	fake_qemu_connect(&t->f, source_start_digest(t));
	fake_settle(&t->f);
	assert_int_equal(written_preamble(t->f.conns[0]).digest, t->f.tls);
}

/* A stock peer (KubeVirt's map, no ALPN) and a target without the check are never asked. */
static void test_digest_not_asked(void **state)
{
	struct t *t = *state;
	const char *path;

	t->conf.digest = PX_DIGEST_ON;
	start(t);
	path = source_start(t, KEY, 0, 0); /* a map without "digest" */
	fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	assert_false(written_preamble(t->f.conns[0]).digest);
	answer(t, t->f.conns[0], PX_OK);
	assert_false(t->f.links[0].opts.digest);
	fake_link_end(&t->f, &t->f.links[0], XP_END_CLEAN, 0);
	assert_int_equal(t->f.nconns, 1);
	assert_int_equal(px_source_stop(t->n, KEY, NULL, 0), 0);
	fake_end_pass(&t->f);
	assert_logged("role=source stop conns=1 ");
	assert_logged(" verified=none outcome=ok");
}

/* ---- the DPDK node hop's negotiation ---- */

#define DPDK_LOW  0x0a000001u /* 10.0.0.1 */
#define DPDK_HIGH 0x0a000002u /* 10.0.0.2 */
#define DPDK_UDP  4791

/* This node has a DPDK node hop at ip (the fake's info() tells of it). */
static void dpdk_node(struct t *t, uint32_t ip)
{
	t->f.dpdk_ip = ip;
	t->f.dpdk_port = DPDK_UDP;
}

/* A source of key to a target whose DPDK hop is at target_ip (0: none); the path QEMU uses. */
static const char *source_start_dpdk(struct t *t, uint32_t target_ip)
{
	static struct px_port_info out[PX_PORTS_MAX];
	struct px_portmap pm = { .port = 40000, .nports = 1, .ports = { PORT } };
	char err[256];

	strcpy(pm.key, KEY);
	strcpy(pm.address, "198.18.0.2");
	pm.dpdk.ip = target_ip;
	pm.dpdk.port = DPDK_UDP;
	assert_int_equal(
		px_source_start(t->n, &pm, t->dir, &(struct px_start){ 0 }, out, err, sizeof(err)),
		0);
	return out[0].path;
}

/* The target's answer: st, and with PX_OK_DPDK its hop and the stream, fed in two reads (the
 * fixed part first) so that the source must learn the reply's length from its status. */
static void answer_dpdk(struct t *t, struct fake_conn *c, enum px_status st, uint32_t stream)
{
	struct px_dpdk d = { .ip = DPDK_LOW, .port = DPDK_UDP, .stream = stream };
	uint8_t r[PX_REPLY_DPDK_LEN];
	size_t n = px_reply_encode(st, &d, r);

	fake_feed(c, r, PX_REPLY_LEN);
	fake_settle(&t->f);
	fake_feed(c, r + PX_REPLY_LEN, n - PX_REPLY_LEN);
	fake_settle(&t->f);
}

/* Both have a hop: the source offers its own, with a stream id below the top bit; the target's
 * PX_OK_DPDK (the id with the top bit it set) links the connection over the hop. */
static void test_dpdk_source_offers(void **state)
{
	struct t *t = *state;
	struct px_node_info ni;
	struct px_preamble p;
	const char *path;
	int q;

	dpdk_node(t, DPDK_HIGH);
	t->f.hop_stats.tx_frames = 7;
	start(t);
	px_node_info(t->n, &ni);
	assert_true(ni.dpdk.on);
	assert_string_equal(ni.dpdk.address, "10.0.0.2:4791");
	assert_int_equal(ni.dpdk.stats.tx_frames, 7);
	path = source_start_dpdk(t, DPDK_LOW);
	q = fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	p = written_preamble(t->f.conns[0]);
	assert_int_equal(p.dpdk.ip, DPDK_HIGH);
	assert_int_equal(p.dpdk.port, DPDK_UDP);
	assert_true(p.dpdk.stream != 0);
	assert_int_equal(p.dpdk.stream & 0x80000000u, 0);
	assert_int_equal(t->f.nlinks, 0);
	answer_dpdk(t, t->f.conns[0], PX_OK_DPDK, p.dpdk.stream | 0x80000000u);
	assert_int_equal(t->f.nlinks, 1);
	assert_int_equal(t->f.links[0].local_fd, q);
	assert_int_equal(t->f.links[0].opts.dpdk.ip, DPDK_LOW);
	assert_int_equal(t->f.links[0].opts.dpdk.port, DPDK_UDP);
	assert_int_equal(t->f.links[0].opts.dpdk.stream, p.dpdk.stream | 0x80000000u);
}

/* A target without a hop answers PX_OK to the offer: the connection takes the kernel path. */
static void test_dpdk_source_falls_back(void **state)
{
	struct t *t = *state;
	const char *path;

	dpdk_node(t, DPDK_HIGH);
	start(t);
	path = source_start_dpdk(t, DPDK_LOW);
	fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	assert_true(written_preamble(t->f.conns[0]).dpdk.ip != 0);
	answer(t, t->f.conns[0], PX_OK);
	assert_int_equal(t->f.nlinks, 1);
	assert_int_equal(t->f.links[0].opts.dpdk.ip, 0);
	assert_int_equal(t->f.links[0].opts.dpdk.stream, 0);
}

/* No offer to a target that advertised no hop; a PX_OK_DPDK (status 11) answered to a source
 * that offered nothing is refused, and nothing is relayed. */
static void test_dpdk_source_refuses_unoffered(void **state)
{
	struct t *t = *state;
	const char *path;
	int q;

	dpdk_node(t, DPDK_HIGH);
	start(t);
	path = source_start_dpdk(t, 0);
	q = fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	assert_int_equal(written_preamble(t->f.conns[0]).dpdk.ip, 0);
	answer_dpdk(t, t->f.conns[0], PX_OK_DPDK, 5);
	assert_int_equal(t->f.nlinks, 0);
	assert_true(t->f.conns[0]->closed);
	assert_int_equal(t->f.closed_fds[0], q);
	assert_logged("the target chose the DPDK node hop, which this side did not offer");
}

/* The offer as a source at src_ip would send it on connection seq. */
static struct fake_conn *arrive_offer(struct t *t, uint32_t src_ip, uint32_t stream)
{
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = PORT, .seq = 0 };
	uint8_t buf[PX_PREAMBLE_MAX];
	struct fake_conn *c;
	int r;

	strcpy(p.key, KEY);
	p.has_secret = true;
	memcpy(p.secret, secret, PX_SECRET_LEN);
	p.dpdk.ip = src_ip;
	p.dpdk.port = DPDK_UDP;
	p.dpdk.stream = stream;
	r = px_preamble_encode(&p, buf, sizeof(buf));
	assert_true(r > 0);
	c = fake_incoming(&t->f, buf, (size_t)r);
	fake_settle(&t->f);
	return c;
}

/* The target with a hop answers an offer with PX_OK_DPDK, its own address and the stream id,
 * the top bit set when the source's address is the lower one; the link goes over the hop. */
static void test_dpdk_target_accepts(void **state)
{
	struct t *t = *state;
	struct px_portmap out;
	struct px_port_info pi = { .id = PORT };
	struct px_dpdk d;
	enum px_status st;
	char err[256];
	struct fake_conn *c;

	dpdk_node(t, DPDK_HIGH);
	start(t);
	strcpy(pi.path, DST_SOCK);
	assert_int_equal(
		px_target_start(t->n, KEY, 1, &pi, &(struct px_start){ 0 }, &out, err, sizeof(err)),
		0);
	assert_int_equal(out.dpdk.ip, DPDK_HIGH);
	assert_int_equal(out.dpdk.port, DPDK_UDP);
	memcpy(secret, out.secret, PX_SECRET_LEN);
	c = arrive_offer(t, DPDK_LOW, 42);
	assert_int_equal(c->out_len, PX_REPLY_DPDK_LEN);
	assert_int_equal(px_reply_len(c->out, c->out_len), PX_REPLY_DPDK_LEN);
	assert_int_equal(px_reply_decode(c->out, c->out_len, &st, &d), PX_REPLY_DPDK_LEN);
	assert_int_equal(st, PX_OK_DPDK);
	assert_int_equal(d.ip, DPDK_HIGH);
	assert_int_equal(d.port, DPDK_UDP);
	assert_int_equal(d.stream, 42 | 0x80000000u);
	assert_int_equal(t->f.nlinks, 1);
	assert_int_equal(t->f.links[0].opts.dpdk.ip, DPDK_LOW);
	assert_int_equal(t->f.links[0].opts.dpdk.stream, 42 | 0x80000000u);
}

/* From a source at the higher address, the id keeps its top bit clear. */
static void test_dpdk_target_stream_bit(void **state)
{
	struct t *t = *state;
	struct px_dpdk d;
	enum px_status st;
	struct fake_conn *c;

	dpdk_node(t, DPDK_LOW);
	start(t);
	target_start(t, KEY, 0);
	c = arrive_offer(t, DPDK_HIGH, 0x80000042u);
	assert_int_equal(px_reply_decode(c->out, c->out_len, &st, &d), PX_REPLY_DPDK_LEN);
	assert_int_equal(st, PX_OK_DPDK);
	assert_int_equal(d.ip, DPDK_LOW);
	assert_int_equal(d.stream, 0x42);
	assert_int_equal(t->f.links[0].opts.dpdk.stream, 0x42);
}

/* A target without a hop answers an offer with PX_OK: the kernel path. */
static void test_dpdk_target_without_hop(void **state)
{
	struct t *t = *state;
	struct px_node_info ni;
	struct fake_conn *c;

	start(t);
	px_node_info(t->n, &ni);
	assert_false(ni.dpdk.on);
	target_start(t, KEY, 0);
	c = arrive_offer(t, DPDK_LOW, 42);
	assert_int_equal(reply_of(c), PX_OK);
	assert_int_equal(c->out_len, PX_REPLY_LEN);
	assert_int_equal(t->f.nlinks, 1);
	assert_int_equal(t->f.links[0].opts.dpdk.ip, 0);
}

/* How many times text is in the log. */
static unsigned int log_count(const char *text)
{
	unsigned int n = 0;

	for (const char *at = fake_log(); (at = strstr(at, text)); at += strlen(text))
		n++;
	return n;
}

/* While the hop's link is down the source offers nothing (the kernel path) and says why, once;
 * once it is up again (told by the tick), the next connection offers it again. */
static void test_dpdk_source_kernel_while_link_down(void **state)
{
	struct t *t = *state;
	const char *path;

	dpdk_node(t, DPDK_HIGH);
	start(t);
	t->f.hop_health.link_up = false;
	t->f.hop_health.link_for_ms = 6000;
	strcpy(t->f.hop_health.link_why, "net_memif client: no memif server to connect to");
	path = source_start_dpdk(t, DPDK_LOW);
	fake_qemu_connect(&t->f, path);
	fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	assert_int_equal(written_preamble(t->f.conns[0]).dpdk.ip, 0);
	assert_int_equal(written_preamble(t->f.conns[1]).dpdk.ip, 0);
	assert_int_equal(log_count("DPDK node hop: link down (net_memif client: no memif server to "
				   "connect to); new connections go over the kernel path"),
			 1);
	answer(t, t->f.conns[0], PX_OK);
	assert_int_equal(t->f.links[0].opts.dpdk.ip, 0);
	t->f.hop_health.link_up = true;
	t->f.hop_health.link_for_ms = 1500;
	fake_advance(&t->f, 200);
	assert_int_equal(log_count("DPDK node hop: link up again; new connections go over DPDK"),
			 1);
	fake_qemu_connect(&t->f, path);
	fake_settle(&t->f);
	assert_int_equal(written_preamble(t->f.conns[2]).dpdk.ip, DPDK_HIGH);
	assert_int_equal(log_count("link up again"), 1);
}

/* The tick logs a link that went down only once it has been down a second (a memif port is
 * down for its handshake's few milliseconds at every start), and then once. */
static void test_dpdk_link_down_logged_once_it_lasts(void **state)
{
	struct t *t = *state;

	dpdk_node(t, DPDK_HIGH);
	start(t);
	t->f.hop_health.link_up = false;
	t->f.hop_health.link_for_ms = 300;
	strcpy(t->f.hop_health.link_why, "net_af_packet: interface dp0 down or without carrier");
	fake_advance(&t->f, 300);
	assert_false(logged("link down"));
	t->f.hop_health.link_for_ms = 1200;
	fake_advance(&t->f, 300);
	fake_advance(&t->f, 300);
	assert_int_equal(log_count("DPDK node hop: link down (net_af_packet: interface dp0 down or "
				   "without carrier); new connections go over the kernel path"),
			 1);
}

/* A target whose hop found the offering source's address unreachable answers PX_OK (the kernel
 * path) and says why, once; once the peer answers ARP again it takes the hop again. */
static void test_dpdk_target_kernel_for_unreachable_peer(void **state)
{
	struct t *t = *state;
	struct fake_conn *c;

	dpdk_node(t, DPDK_HIGH);
	start(t);
	target_start(t, KEY, 0);
	t->f.hop_health.npeers = 1;
	t->f.hop_health.peers[0].ip = DPDK_LOW;
	strcpy(t->f.hop_health.peers[0].why, "ARP for 10.0.0.1 unanswered for 5 s");
	c = arrive_offer(t, DPDK_LOW, 42);
	assert_int_equal(reply_of(c), PX_OK);
	assert_int_equal(t->f.links[0].opts.dpdk.ip, 0);
	assert_logged("DPDK node hop: peer 10.0.0.1 unreachable (ARP for 10.0.0.1 unanswered for "
		      "5 s); new connections to it go over the kernel path");
	t->f.hop_health.npeers = 0;
	fake_advance(&t->f, 200);
	assert_logged("DPDK node hop: peer 10.0.0.1 answered ARP again; new connections to it go "
		      "over DPDK");
}

#define T(f)  cmocka_unit_test_setup_teardown(f, setup_plain, teardown)
#define TT(f) cmocka_unit_test_setup_teardown(f, setup_tls, teardown)

/* A node with a DPDK hop at DPDK_HIGH that resumes connections (1 MiB kept each), started. */
static void dpdk_resume_node(struct t *t)
{
	t->conf.resume_timeout_ms = 60000;
	t->conf.resume_keep = 1u << 20;
	dpdk_node(t, DPDK_HIGH);
	start(t);
}

/* Both resume connections: the target says so in its JSON ("resume_dpdk"), a source that offers
 * DPDK and resumption asks for both (PX_PREAMBLE_F_DPDK_RESUME) and takes status 16, and its
 * link is the DPDK hop's and resumable. */
static void test_dpdk_source_resumable(void **state)
{
	struct t *t = *state;
	static struct px_port_info out[PX_PORTS_MAX];
	struct px_portmap pm = { .port = 40000, .nports = 1, .ports = { PORT } };
	struct px_dpdk d = { .ip = DPDK_LOW, .port = DPDK_UDP };
	uint8_t r[PX_REPLY_MAX], tok[PX_TOKEN_LEN];
	struct px_preamble p;
	char err[256];
	size_t n;

	dpdk_resume_node(t);
	strcpy(pm.key, KEY);
	strcpy(pm.address, "198.18.0.2");
	pm.dpdk = d;
	pm.resume = pm.resume_dpdk = true;
	assert_int_equal(
		px_source_start(t->n, &pm, t->dir, &(struct px_start){ 0 }, out, err, sizeof(err)),
		0);
	fake_qemu_connect(&t->f, out[0].path);
	fake_settle(&t->f);
	p = written_preamble(t->f.conns[0]);
	assert_true(p.dpdk.ip == DPDK_HIGH && p.resumable && p.dpdk_resume);
	d.stream = p.dpdk.stream | 0x80000000u;
	memset(tok, 0x5a, sizeof(tok));
	n = px_reply_encode_resumable(tok, &d, r);
	fake_feed(t->f.conns[0], r, PX_REPLY_LEN);
	fake_settle(&t->f);
	fake_feed(t->f.conns[0], r + PX_REPLY_LEN, n - PX_REPLY_LEN);
	fake_settle(&t->f);
	assert_int_equal(t->f.nlinks, 1);
	assert_int_equal(t->f.links[0].opts.dpdk.ip, DPDK_LOW);
	assert_int_equal(t->f.links[0].opts.resume.keep, 1u << 20);
	assert_logged("path=dpdk resume=yes");
}

/* A target with a hop and resumption: an offer that asks for both gets status 16 and a
 * resumable DPDK link; one from an older source (resumable, no DPDK_RESUME) gets status 11 and
 * a link that is not. When the first link's DPDK path fails, the connection goes on from where
 * it stood on a link of the kernel path, suspended until the source resumes it. */
static void test_dpdk_target_resumable_falls_back(void **state)
{
	struct t *t = *state;
	struct px_port_info pi = { .id = PORT };
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = PORT, .has_secret = true };
	uint8_t buf[PX_PREAMBLE_MAX], kept[10] = { 0 };
	struct xp_link_state st = { .fd = 77, .sent = 100, .have = 50 };
	struct xp_link_result res = { .end = XP_END_FALLBACK, .err = -ENETDOWN, .err_side = 1 };
	struct px_portmap out;
	struct fake_conn *c;
	enum px_status s;
	struct px_dpdk d;
	char err[256];
	int n;

	dpdk_resume_node(t);
	strcpy(pi.path, DST_SOCK);
	assert_int_equal(
		px_target_start(t->n, KEY, 1, &pi, &(struct px_start){ 0 }, &out, err, sizeof(err)),
		0);
	assert_true(out.resume && out.resume_dpdk);
	strcpy(p.key, KEY);
	memcpy(p.secret, out.secret, PX_SECRET_LEN);
	p.dpdk = (struct px_dpdk){ .ip = DPDK_LOW, .port = DPDK_UDP, .stream = 42 };
	p.resumable = p.dpdk_resume = true;
	n = px_preamble_encode(&p, buf, sizeof(buf));
	assert_true(n > 0);
	c = fake_incoming(&t->f, buf, (size_t)n);
	fake_settle(&t->f);
	assert_int_equal(c->out_len, PX_REPLY_DPDK_RESUMABLE_LEN);
	assert_int_equal(px_reply_decode(c->out, c->out_len, &s, &d), PX_REPLY_DPDK_RESUMABLE_LEN);
	assert_int_equal(s, PX_OK_DPDK_RESUMABLE);
	assert_int_equal(d.stream, 42 | 0x80000000u);
	assert_int_equal(t->f.nlinks, 1);
	assert_true(t->f.links[0].opts.dpdk.ip == DPDK_LOW && t->f.links[0].opts.resume.keep);

	p.seq = 1;
	p.dpdk.stream = 43;
	p.dpdk_resume = false;
	n = px_preamble_encode(&p, buf, sizeof(buf));
	c = fake_incoming(&t->f, buf, (size_t)n);
	fake_settle(&t->f);
	assert_int_equal(px_reply_decode(c->out, c->out_len, &s, &d), PX_REPLY_DPDK_LEN);
	assert_int_equal(s, PX_OK_DPDK);
	assert_int_equal(t->f.nlinks, 2);
	assert_true(t->f.links[1].opts.dpdk.ip && t->f.links[1].opts.resume.keep == 0);

	/* the first one's DPDK path fails: 10 bytes the source had not acknowledged */
	st.kept = kept;
	st.kept_len = sizeof(kept);
	res.fallback = &st;
	res.bytes[1] = 100;
	snprintf(res.detail, sizeof(res.detail), "DPDK link down for 5 s: test");
	t->f.links[0].ended = true;
	t->f.done(t->f.links[0].opts.cookie, &res, t->f.done_arg);
	fake_end_pass(&t->f);
	assert_logged("DPDK node hop: Network is down: DPDK link down for 5 s: test, after 0/100 "
		      "bytes (tx/rx); falling back to the kernel path from offset 90, 10 bytes kept");
	assert_int_equal(t->f.nlinks, 3);
	assert_null(t->f.links[2].conn);
	assert_int_equal(t->f.links[2].local_fd, 77);
	assert_ptr_equal(t->f.links[2].opts.adopt, &st);
	assert_int_equal(t->f.links[2].opts.dpdk.ip, 0);
	assert_int_equal(t->f.links[2].opts.resume.keep, 1u << 20);
	/* its suspension: a target waits for the source's resumption */
	fake_link_end(&t->f, &t->f.links[2], XP_END_SUSPENDED, 0);
	{
		struct px_node_info ni;

		px_node_info(t->n, &ni);
		assert_int_equal(ni.dpdk.fallbacks, 1);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_target_orders_a_delayed_first),
		T(test_target_reads_only_the_preamble),
		T(test_target_refuses_unknown_key_port_and_garbage),
		T(test_target_order_timeout),
		T(test_target_peer_closes_mid_preamble),
		T(test_target_preamble_timeout),
		T(test_target_local_connect_fails),
		T(test_target_migration_conn_limit),
		T(test_target_max_unauthenticated),
		T(test_target_burst_from_one_address),
		T(test_target_unauthenticated_per_listener),
		TT(test_target_silent_dropped),
		TT(test_target_tls_handshake_then_preamble),
		TT(test_target_tls_refused),
		T(test_source_delayed_first),
		T(test_source_refused_and_closed_before_reply),
		T(test_source_stop_during_setup),
		T(test_stop_grace_then_cut),
		T(test_source_connect_timeout),
		TT(test_source_tls_refused),
		T(test_source_migration_conn_limit),
		T(test_caps_applied_to_links),
		T(test_caps_pacing_split),
		T(test_drain_waits_for_links),
		T(test_kubevirt_target_raw),
		T(test_kubevirt_target_shared_port_needs_secret),
		TT(test_kubevirt_target_alpn),
		T(test_target_secret),
		T(test_target_binds_first_peer),
		TT(test_target_binds_first_certificate),
		TT(test_kubevirt_target_stop_unbound),
		TT(test_kubevirt_target_listen_ports),
		TT(test_kubevirt_tls_per_migration),
		T(test_kubevirt_source_raw),
		TT(test_kubevirt_source_tls),
		T(test_source_socket_hijack),
		T(test_source_socket_owner),
		T(test_takeover_adopt_and_given_secret),
		T(test_takeover_retire),
		T(test_takeover_retire_timeout),
		T(test_takeover_elsewhere),
		T(test_takeover_counts_unbound),
		T(test_start_refusals),
		T(test_start_idempotent),
		T(test_digest_target),
		T(test_digest_source),
		T(test_digest_not_asked),
		T(test_digest_auto),
		TT(test_digest_auto),
		T(test_digest_drain),
		T(test_dpdk_source_offers),
		T(test_dpdk_source_falls_back),
		T(test_dpdk_source_refuses_unoffered),
		T(test_dpdk_target_accepts),
		T(test_dpdk_target_stream_bit),
		T(test_dpdk_target_without_hop),
		T(test_dpdk_source_kernel_while_link_down),
		T(test_dpdk_link_down_logged_once_it_lasts),
		T(test_dpdk_target_kernel_for_unreachable_peer),
		T(test_dpdk_source_resumable),
		T(test_dpdk_target_resumable_falls_back),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
