// SPDX-License-Identifier: Apache-2.0
/* Unit tests for mutual TLS on the node hop (transport/xp_tls.h): real handshakes in-process
 * between an xp_tls client and an xp_tls server over a non-blocking socketpair, with
 * certificates made on the fly (certfactory.h) in a temporary directory: data both ways,
 * TLS 1.3 half-close, resumption, every refusal the classification names, load and reload
 * errors. */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "certfactory.h"
#include "xp_seal.h"
#include "xp_tls.h"

/* The name every node presents, from the default allow-list. */
#define NODE_CN "kubevirt.io:system:node:virt-handler"
#define SAN_URI "spiffe://cluster.local/ns/kubevirt/sa/virt-handler"
#define SAN_DNS "virt-handler.kubevirt.svc"
#define PEER	"198.18.0.2:4000"
#define STEPS	200
#define POLL_MS 3000
#define BULK	(300 * 1024)

/* ---- fixture: two CAs, an impostor CA and the leaves the cases use ---- */

static char dir[64];
static struct cf_ca ca1, ca2, impostor;
static char ca_both[PATH_MAX]; /* ca1 + ca2 */

enum { CA1, CA2, IMPOSTOR };

struct leaf {
	const char *name;
	int ca;
	struct cf_leaf opt;
	char crt[PATH_MAX], key[PATH_MAX];
};

static struct leaf leaves[] = {
	{ .name = "node-a", .ca = CA1, .opt = { .cn = NODE_CN, .not_before = -3600 } },
	{ .name = "node-b", .ca = CA1, .opt = { .cn = NODE_CN, .not_before = -3600 } },
	{ .name = "other-ca", .ca = CA2, .opt = { .cn = NODE_CN, .not_before = -3600 } },
	{ .name = "impostor", .ca = IMPOSTOR, .opt = { .cn = NODE_CN, .not_before = -3600 } },
	{ .name = "expired",
	  .ca = CA1,
	  .opt = { .cn = NODE_CN, .not_before = -2 * CF_DAY, .not_after = -CF_DAY } },
	{ .name = "not-yet",
	  .ca = CA1,
	  .opt = { .cn = NODE_CN, .not_before = CF_DAY, .not_after = 2 * CF_DAY } },
	{ .name = "stranger", .ca = CA1, .opt = { .cn = "mallory", .not_before = -3600 } },
	{ .name = "stranger-uri",
	  .ca = CA1,
	  .opt = { .cn = "mallory", .uri = SAN_URI, .not_before = -3600 } },
	{ .name = "stranger-dns",
	  .ca = CA1,
	  .opt = { .cn = "mallory", .dns = SAN_DNS, .not_before = -3600 } },
	{ .name = "no-cn-uri", .ca = CA1, .opt = { .uri = SAN_URI, .not_before = -3600 } },
	{ .name = "server-only",
	  .ca = CA1,
	  .opt = { .cn = NODE_CN, .not_before = -3600, .eku = CF_EKU_SERVER } },
	{ .name = "client-only",
	  .ca = CA1,
	  .opt = { .cn = NODE_CN, .not_before = -3600, .eku = CF_EKU_CLIENT } },
	{ .name = "no-eku",
	  .ca = CA1,
	  .opt = { .cn = NODE_CN, .not_before = -3600, .eku = CF_EKU_NONE } },
};

static struct leaf *leaf(const char *name)
{
	for (size_t i = 0; i < sizeof(leaves) / sizeof(leaves[0]); i++)
		if (strcmp(leaves[i].name, name) == 0)
			return &leaves[i];
	fail_msg("no leaf %s", name);
	return NULL;
}

static const struct cf_ca *ca_of(int which)
{
	return which == CA1 ? &ca1 : which == CA2 ? &ca2 : &impostor;
}

static int group_setup(void **state)
{
	(void)state;
	/* A peer that closes first must not kill the test with SIGPIPE (vmigd ignores it too). */
	signal(SIGPIPE, SIG_IGN);
	if (cf_tmpdir(dir, sizeof(dir)) < 0 || cf_ca_make(&ca1, dir, "ca1", "vmigd test CA") < 0 ||
	    cf_ca_make(&ca2, dir, "ca2", "vmigd other CA") < 0 ||
	    /* Same name as ca1, another key: a chain that looks right but does not verify. */
	    cf_ca_make(&impostor, dir, "impostor-ca", "vmigd test CA") < 0)
		return -1;
	snprintf(ca_both, sizeof(ca_both), "%s/ca-both.pem", dir);
	if (cf_cat(ca_both, ca1.path, ca2.path) < 0)
		return -1;
	for (size_t i = 0; i < sizeof(leaves) / sizeof(leaves[0]); i++)
		if (cf_leaf_make(ca_of(leaves[i].ca), dir, leaves[i].name, &leaves[i].opt,
				 leaves[i].crt, leaves[i].key) < 0)
			return -1;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	cf_ca_free(&ca1);
	cf_ca_free(&ca2);
	cf_ca_free(&impostor);
	if (dir[0])
		cf_rmdir(dir);
	return 0;
}

/* ---- contexts ---- */

struct ctx_opt {
	const char *leaf;	 /* cert and key */
	const char *client_leaf; /* client_cert and client_key, or NULL */
	const char *ca;		 /* NULL: ca1 */
	const char *allow;	 /* NULL: the default list */
	const char *allow_clients, *allow_servers;
	unsigned int min_version;
	const char *ciphers12;
	bool resumption;
};

static struct xp_tls *ctx_new(const struct ctx_opt *o)
{
	struct leaf *l = leaf(o->leaf), *cl = o->client_leaf ? leaf(o->client_leaf) : NULL;
	struct xp_tls_conf conf = {
		.cert = l->crt,
		.key = l->key,
		.client_cert = cl ? cl->crt : NULL,
		.client_key = cl ? cl->key : NULL,
		.ca = o->ca ? o->ca : ca1.path,
		.allow = o->allow,
		.allow_clients = o->allow_clients,
		.allow_servers = o->allow_servers,
		.min_version = o->min_version,
		.ciphers12 = o->ciphers12,
		.resumption = o->resumption,
	};
	struct xp_tls *t = NULL;
	char err[256] = "";
	int r = xp_tls_new(&conf, &t, err, sizeof(err));

	if (r < 0)
		fail_msg("xp_tls_new(%s): %d %s", o->leaf, r, err);
	assert_non_null(t);
	assert_int_equal(xp_tls_generation(t), 1);
	return t;
}

static void sockpair(int fd[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fd), 0);
}

/* ---- one end of a connection: an xp_tls session, or plain OpenSSL for what xp_tls cannot be */

struct end {
	const char *who;
	struct xp_tls_sess *x;
	SSL_CTX *raw_ctx;
	SSL *raw;
	int fd;
	int rc; /* of the handshake: -EAGAIN while running */
	enum xp_tls_want want;
};

static void end_xp(struct end *e, const char *who, struct xp_tls *t, int fd, bool server,
		   const char *peer)
{
	memset(e, 0, sizeof(*e));
	e->who = who;
	e->fd = fd;
	e->rc = -EAGAIN;
	e->want = XP_TLS_WANT_NONE;
	assert_int_equal(xp_tls_sess_new(t, fd, server, peer, &e->x), 0);
	assert_non_null(e->x);
	assert_int_equal(xp_tls_sess_refusal(e->x), XP_TLS_OK);
}

/* A plain OpenSSL client that verifies nothing; with a certificate when leaf is not NULL. */
static void end_raw_client(struct end *e, int fd, const char *leaf_name, int max_version)
{
	memset(e, 0, sizeof(*e));
	e->who = "raw client";
	e->fd = fd;
	e->rc = -EAGAIN;
	e->raw_ctx = SSL_CTX_new(TLS_client_method());
	assert_non_null(e->raw_ctx);
	SSL_CTX_set_verify(e->raw_ctx, SSL_VERIFY_NONE, NULL);
	if (max_version)
		SSL_CTX_set_max_proto_version(e->raw_ctx, max_version);
	if (leaf_name) {
		struct leaf *l = leaf(leaf_name);

		assert_int_equal(SSL_CTX_use_certificate_file(e->raw_ctx, l->crt, SSL_FILETYPE_PEM),
				 1);
		assert_int_equal(SSL_CTX_use_PrivateKey_file(e->raw_ctx, l->key, SSL_FILETYPE_PEM),
				 1);
	}
	e->raw = SSL_new(e->raw_ctx);
	assert_non_null(e->raw);
	assert_int_equal(SSL_set_fd(e->raw, fd), 1);
	SSL_set_connect_state(e->raw);
}

static void end_free(struct end *e)
{
	xp_tls_sess_free(e->x);
	SSL_free(e->raw);
	SSL_CTX_free(e->raw_ctx);
	ERR_clear_error();
	e->x = NULL;
	e->raw = NULL;
	e->raw_ctx = NULL;
}

static int end_step(struct end *e)
{
	int r, k;

	if (e->x)
		return xp_tls_handshake(e->x, &e->want);
	ERR_clear_error();
	r = SSL_do_handshake(e->raw);
	if (r == 1)
		return 0;
	k = SSL_get_error(e->raw, r);
	if (k == SSL_ERROR_WANT_READ || k == SSL_ERROR_WANT_WRITE) {
		e->want = k == SSL_ERROR_WANT_READ ? XP_TLS_WANT_READ : XP_TLS_WANT_WRITE;
		return -EAGAIN;
	}
	ERR_clear_error();
	return -EPROTO;
}

static short want_events(enum xp_tls_want w)
{
	return w == XP_TLS_WANT_WRITE ? POLLOUT : POLLIN;
}

/* Steps both handshakes until neither wants to go on; polls when both wait. Bounded. */
static void handshake(struct end *a, struct end *b)
{
	struct end *e[2] = { a, b };

	for (int i = 0; i < STEPS; i++) {
		struct pollfd p[2];
		int n = 0;

		for (int k = 0; k < 2; k++)
			if (e[k]->rc == -EAGAIN)
				e[k]->rc = end_step(e[k]);
		for (int k = 0; k < 2; k++)
			if (e[k]->rc == -EAGAIN)
				p[n++] = (struct pollfd){ .fd = e[k]->fd,
							  .events = want_events(e[k]->want) };
		if (n == 0)
			return;
		/* One side failed and the other waits for what will never come: stop. */
		if (poll(p, n, POLL_MS) <= 0)
			return;
	}
}

/* Reads on e until something other than -EAGAIN, polling: for the alert TLS 1.3 delivers late. */
static ssize_t read_until(struct end *e, void *buf, size_t len)
{
	for (int i = 0; i < STEPS; i++) {
		ssize_t k = xp_tls_read(e->x, buf, len, &e->want);
		struct pollfd p = { .fd = e->fd, .events = want_events(e->want) };

		if (k != -EAGAIN)
			return k;
		if (poll(&p, 1, POLL_MS) <= 0)
			return -ETIMEDOUT;
	}
	return -ETIMEDOUT;
}

static void write_all(struct end *e, const void *buf, size_t len)
{
	size_t done = 0;

	for (int i = 0; done < len && i < 10000; i++) {
		ssize_t k = xp_tls_write(e->x, (const char *)buf + done, len - done, &e->want);
		struct pollfd p = { .fd = e->fd, .events = want_events(e->want) };

		if (k > 0) {
			done += (size_t)k;
			continue;
		}
		if (k != -EAGAIN)
			fail_msg("%s: write: %zd (%s)", e->who, k, xp_tls_sess_io_error(e->x));
		assert_true(poll(&p, 1, POLL_MS) > 0);
	}
	assert_int_equal(done, len);
}

static void shutdown_end(struct end *e)
{
	for (int i = 0; i < STEPS; i++) {
		int r = xp_tls_shutdown(e->x, &e->want);
		struct pollfd p = { .fd = e->fd, .events = want_events(e->want) };

		if (r == 0)
			return;
		if (r != -EAGAIN)
			fail_msg("%s: shutdown: %d (%s)", e->who, r, xp_tls_sess_io_error(e->x));
		assert_true(poll(&p, 1, POLL_MS) > 0);
	}
	fail_msg("%s: shutdown does not finish", e->who);
}

/* ---- bulk data: any number of flows at once, so that neither side blocks the other ---- */

struct flow {
	struct end *w, *r;
	const uint8_t *src;
	uint8_t *dst;
	size_t len, sent, got;
	enum xp_tls_want wwant, rwant;
};

static void flow_init(struct flow *f, struct end *w, struct end *r, size_t len, unsigned int seed)
{
	uint8_t *src = malloc(len);

	assert_non_null(src);
	for (size_t i = 0; i < len; i++) {
		seed = seed * 1103515245u + 12345u;
		src[i] = (uint8_t)(seed >> 16);
	}
	*f = (struct flow){ .w = w, .r = r, .src = src, .len = len };
	f->dst = calloc(1, len);
	assert_non_null(f->dst);
}

static void flow_check_free(struct flow *f)
{
	assert_int_equal(f->got, f->len);
	assert_memory_equal(f->src, f->dst, f->len);
	free((void *)f->src);
	free(f->dst);
}

static void pump(struct flow *f, int n)
{
	for (int round = 0; round < 100000; round++) {
		bool progress = false, done = true;
		struct pollfd p[8];
		int np = 0;

		for (int i = 0; i < n; i++) {
			while (f[i].sent < f[i].len) {
				/* At most 64 KiB a call: partial writes happen, and are retried
				 * alike. */
				size_t want = f[i].len - f[i].sent;
				ssize_t k = xp_tls_write(f[i].w->x, f[i].src + f[i].sent,
							 want > 65536 ? 65536 : want, &f[i].wwant);

				if (k == -EAGAIN)
					break;
				if (k <= 0)
					fail_msg("%s: write: %zd (%s)", f[i].w->who, k,
						 xp_tls_sess_io_error(f[i].w->x));
				f[i].sent += (size_t)k;
				progress = true;
			}
			while (f[i].got < f[i].len) {
				ssize_t k = xp_tls_read(f[i].r->x, f[i].dst + f[i].got,
							f[i].len - f[i].got, &f[i].rwant);

				if (k == -EAGAIN)
					break;
				if (k <= 0)
					fail_msg("%s: read: %zd (%s)", f[i].r->who, k,
						 xp_tls_sess_io_error(f[i].r->x));
				f[i].got += (size_t)k;
				progress = true;
			}
			if (f[i].got < f[i].len)
				done = false;
		}
		if (done)
			return;
		if (progress)
			continue;
		for (int i = 0; i < n; i++) {
			if (f[i].sent < f[i].len)
				p[np++] = (struct pollfd){ .fd = f[i].w->fd,
							   .events = want_events(f[i].wwant) };
			if (f[i].got < f[i].len)
				p[np++] = (struct pollfd){ .fd = f[i].r->fd,
							   .events = want_events(f[i].rwant) };
		}
		if (poll(p, np, POLL_MS) <= 0)
			fail_msg("data stalled");
	}
	fail_msg("data does not finish");
}

/* ---- a connection between two contexts ---- */

struct conn {
	int fd[2];
	struct end cli, srv;
};

static void conn_open(struct conn *c, struct xp_tls *cli, struct xp_tls *srv, const char *peer)
{
	sockpair(c->fd);
	end_xp(&c->cli, "client", cli, c->fd[0], false, peer);
	end_xp(&c->srv, "server", srv, c->fd[1], true, NULL);
	handshake(&c->cli, &c->srv);
}

static void conn_close(struct conn *c)
{
	end_free(&c->cli);
	end_free(&c->srv);
	close(c->fd[0]);
	close(c->fd[1]);
}

static void assert_ok(struct conn *c)
{
	if (c->cli.rc != 0 || c->srv.rc != 0)
		fail_msg("handshake: client %d %s (%s), server %d %s (%s)", c->cli.rc,
			 xp_tls_refusal_token(xp_tls_sess_refusal(c->cli.x)),
			 xp_tls_sess_error(c->cli.x), c->srv.rc,
			 xp_tls_refusal_token(xp_tls_sess_refusal(c->srv.x)),
			 xp_tls_sess_error(c->srv.x));
	assert_int_equal(xp_tls_sess_refusal(c->cli.x), XP_TLS_OK);
	assert_int_equal(xp_tls_sess_refusal(c->srv.x), XP_TLS_OK);
}

/* A short exchange both ways; on the client, the read also takes the server's ticket. */
static void round_trip(struct conn *c)
{
	char buf[16];

	write_all(&c->cli, "ping", 4);
	assert_int_equal(read_until(&c->srv, buf, sizeof(buf)), 4);
	assert_memory_equal(buf, "ping", 4);
	write_all(&c->srv, "pong", 4);
	assert_int_equal(read_until(&c->cli, buf, sizeof(buf)), 4);
	assert_memory_equal(buf, "pong", 4);
}

/* ---- good pairs ---- */

static void test_refusal_tokens(void **state)
{
	static const char *const want[] = {
		"ok",	       "no-certificate",   "untrusted-ca", "expired",  "not-yet-valid",
		"bad-purpose", "name-not-allowed", "peer-refused", "protocol", "closed",
	};

	(void)state;
	for (int i = XP_TLS_OK; i <= XP_TLS_CLOSED; i++)
		assert_string_equal(xp_tls_refusal_token(i), want[i]);
	assert_string_equal(xp_tls_refusal_token(XP_TLS_CLOSED + 1), "?");
	assert_string_equal(xp_tls_refusal_token((enum xp_tls_refusal) - 1), "?");
}

static void test_context(void **state)
{
	struct xp_tls *t = ctx_new(&(struct ctx_opt){ .leaf = "node-a" });
	struct xp_tls *u = ctx_new(&(struct ctx_opt){ .leaf = "node-b", .allow = "*,a,,b," });
	const char *files[5];

	(void)state;
	assert_non_null(strstr(xp_tls_describe(t), NODE_CN));
	assert_non_null(strstr(xp_tls_describe(t), "serial"));
	/* The default list. */
	assert_string_equal(xp_tls_allow_list(t, false, 0), "kubevirt.io:system:node:virt-handler");
	assert_string_equal(xp_tls_allow_list(t, false, 1),
			    "kubevirt.io:system:client:virt-handler");
	assert_string_equal(xp_tls_allow_list(t, false, 2), "kubevirt.io:system:client:migration");
	assert_null(xp_tls_allow_list(t, false, 3));
	/* "*" first; empty names skipped. */
	assert_string_equal(xp_tls_allow_list(u, false, 0), "*");
	assert_string_equal(xp_tls_allow_list(u, false, 1), "a");
	assert_string_equal(xp_tls_allow_list(u, false, 2), "b");
	assert_null(xp_tls_allow_list(u, false, 3));
	/* Client files default to the server pair. */
	assert_int_equal(xp_tls_files(t, files), 5);
	assert_string_equal(files[0], leaf("node-a")->crt);
	assert_string_equal(files[1], leaf("node-a")->key);
	assert_string_equal(files[2], leaf("node-a")->crt);
	assert_string_equal(files[3], leaf("node-a")->key);
	assert_string_equal(files[4], ca1.path);
	assert_false(xp_tls_ktls_enabled(t));
	xp_tls_free(t);
	xp_tls_free(u);
	xp_tls_free(NULL);
}

static void test_ktls_probe(void **state)
{
	bool a = xp_tls_kernel_has_ktls(), b = xp_tls_kernel_has_ktls();

	(void)state;
	assert_true(a == b);
	print_message("kernel kTLS: %s\n", a ? "yes" : "no");
}

static void check_half_close(struct end *first, struct end *other)
{
	struct flow f;
	char buf[64];

	/* first says it is done sending... */
	shutdown_end(first);
	assert_int_equal(read_until(other, buf, sizeof(buf)), 0);
	/* ...and still receives what other sends afterwards (TLS 1.3 half-close). */
	flow_init(&f, other, first, BULK, 7);
	pump(&f, 1);
	flow_check_free(&f);
	/* Now other is done too. */
	shutdown_end(other);
	assert_int_equal(read_until(first, buf, sizeof(buf)), 0);
}

static void good_pair(bool server_closes_first)
{
	struct xp_tls *a = ctx_new(&(struct ctx_opt){ .leaf = "node-a", .resumption = true });
	struct xp_tls *b = ctx_new(&(struct ctx_opt){ .leaf = "node-b", .resumption = true });
	struct flow f[2];
	struct conn c;

	conn_open(&c, a, b, PEER);
	assert_ok(&c);
	assert_string_equal(xp_tls_sess_version(c.cli.x), "TLSv1.3");
	assert_string_equal(xp_tls_sess_version(c.srv.x), "TLSv1.3");
	assert_string_equal(xp_tls_sess_cipher(c.cli.x), xp_tls_sess_cipher(c.srv.x));
	assert_false(xp_tls_sess_resumed(c.cli.x));
	assert_false(xp_tls_sess_resumed(c.srv.x));
	assert_false(xp_tls_ktls_tx(c.cli.x));
	assert_non_null(strstr(xp_tls_sess_describe(c.cli.x), "TLSv1.3"));
	assert_non_null(strstr(xp_tls_sess_describe(c.cli.x), "resumed=no"));
	assert_non_null(strstr(xp_tls_sess_describe(c.cli.x), NODE_CN));
	assert_non_null(strstr(xp_tls_sess_describe(c.srv.x), NODE_CN));

	/* A few hundred KiB both ways at once. */
	flow_init(&f[0], &c.cli, &c.srv, BULK, 1);
	flow_init(&f[1], &c.srv, &c.cli, BULK + 12345, 2);
	pump(f, 2);
	flow_check_free(&f[0]);
	flow_check_free(&f[1]);

	if (server_closes_first)
		check_half_close(&c.srv, &c.cli);
	else
		check_half_close(&c.cli, &c.srv);
	conn_close(&c);
	xp_tls_free(a);
	xp_tls_free(b);
}

static void test_good_pair_client_closes(void **state)
{
	(void)state;
	good_pair(false);
}

static void test_good_pair_server_closes(void **state)
{
	(void)state;
	good_pair(true);
}

/* The DPDK node hop's frame keys: both ends of one TLS 1.3 session export the same two secrets,
 * one per direction; another session exports others; TLS 1.2, or a session not up, none. A frame
 * sealed by the client opens on the server. */
static void test_hop_keys(void **state)
{
	struct xp_tls *a = ctx_new(&(struct ctx_opt){ .leaf = "node-a" });
	struct xp_tls *b = ctx_new(&(struct ctx_opt){ .leaf = "node-b" });
	uint8_t cc[XP_SEAL_SECRET], cs[XP_SEAL_SECRET], sc[XP_SEAL_SECRET], ss[XP_SEAL_SECRET];
	uint8_t dc[XP_SEAL_SECRET], ds[XP_SEAL_SECRET], frame[64] = "a guest page, or part of one";
	uint8_t tag[XP_SEAL_TAG];
	struct xp_seal *tx, *rx;
	struct conn c, d;

	(void)state;
	conn_open(&c, a, b, NULL);
	assert_ok(&c);
	assert_int_equal(xp_seal_export(c.cli.x, cc, cs), 0);
	assert_int_equal(xp_seal_export(c.srv.x, sc, ss), 0);
	assert_memory_equal(cc, sc, sizeof(cc));
	assert_memory_equal(cs, ss, sizeof(cs));
	assert_memory_not_equal(cc, cs, sizeof(cc));
	assert_int_equal(xp_seal_new(cc, false, 0, &tx), 0);
	assert_int_equal(xp_seal_new(sc, true, 0, &rx), 0);
	assert_int_equal(xp_seal(tx, 1, (const uint8_t *)"hdr", 3, frame, sizeof(frame), tag), 0);
	assert_memory_not_equal(frame, "a guest page", 12);
	assert_int_equal(xp_open(rx, 1, (const uint8_t *)"hdr", 3, frame, sizeof(frame), tag), 0);
	assert_string_equal((char *)frame, "a guest page, or part of one");
	xp_seal_free(tx);
	xp_seal_free(rx);

	conn_open(&d, a, b, NULL);
	assert_ok(&d);
	assert_int_equal(xp_seal_export(d.cli.x, dc, ds), 0);
	assert_memory_not_equal(dc, cc, sizeof(dc));
	assert_memory_not_equal(ds, cs, sizeof(ds));
	conn_close(&c);
	conn_close(&d);

	/* Before the handshake, and on TLS 1.2: -EPROTO. */
	sockpair(c.fd);
	end_raw_client(&c.cli, c.fd[0], "node-a", TLS1_2_VERSION);
	end_xp(&c.srv, "server", b, c.fd[1], true, NULL);
	assert_int_equal(xp_seal_export(c.srv.x, sc, ss), -EPROTO);
	handshake(&c.cli, &c.srv);
	assert_int_equal(c.srv.rc, 0);
	assert_string_equal(xp_tls_sess_version(c.srv.x), "TLSv1.2");
	assert_int_equal(xp_seal_export(c.srv.x, sc, ss), -EPROTO);
	conn_close(&c);
	xp_tls_free(a);
	xp_tls_free(b);
}

/* One context as both ends, as on a node that talks to itself; separate client files. */
static void test_same_context_client_pair(void **state)
{
	struct xp_tls *t = ctx_new(&(struct ctx_opt){ .leaf = "node-a", .client_leaf = "node-b" });
	struct conn c;

	(void)state;
	conn_open(&c, t, t, NULL);
	assert_ok(&c);
	round_trip(&c);
	conn_close(&c);
	xp_tls_free(t);
}

/* A peer that cuts the stream without close_notify reads as -EPIPE, not as an orderly 0. */
static void test_truncation(void **state)
{
	struct xp_tls *a = ctx_new(&(struct ctx_opt){ .leaf = "node-a" });
	struct xp_tls *b = ctx_new(&(struct ctx_opt){ .leaf = "node-b" });
	struct conn c;
	char buf[64];

	(void)state;
	conn_open(&c, a, b, NULL);
	assert_ok(&c);
	round_trip(&c);
	assert_int_equal(shutdown(c.fd[0], SHUT_WR), 0);
	assert_int_equal(read_until(&c.srv, buf, sizeof(buf)), -EPIPE);
	assert_int_equal(xp_tls_sess_refusal(c.srv.x), XP_TLS_OK);
	conn_close(&c);
	xp_tls_free(a);
	xp_tls_free(b);
}

/* ---- KubeVirt's TLS: ALPN between vmigd, names per role, versions, suites ---- */

/* Two vmigd agree on XP_TLS_ALPN3; a vmigd that offers only XP_TLS_ALPN2 (one before resumable
 * connections) or XP_TLS_ALPN (one before the digests) gets that; a client that offers none
 * (KubeVirt's Go proxy) gets none. */
static void test_alpn(void **state)
{
	struct xp_tls *a = ctx_new(&(struct ctx_opt){ .leaf = "node-a" });
	struct xp_tls *b = ctx_new(&(struct ctx_opt){ .leaf = "node-b" });
	struct conn c;

	(void)state;
	conn_open(&c, a, b, NULL);
	assert_ok(&c);
	assert_int_equal(xp_tls_sess_alpn(c.cli.x), 3);
	assert_int_equal(xp_tls_sess_alpn(c.srv.x), 3);
	conn_close(&c);
	sockpair(c.fd);
	end_raw_client(&c.cli, c.fd[0], "node-a", 0);
	assert_int_equal(SSL_set_alpn_protos(c.cli.raw,
					     (const unsigned char *)"\x07" XP_TLS_ALPN2 "\x07" XP_TLS_ALPN,
					     2 + 2 * (sizeof(XP_TLS_ALPN) - 1)),
			 0);
	end_xp(&c.srv, "server", b, c.fd[1], true, NULL);
	handshake(&c.cli, &c.srv);
	assert_int_equal(c.srv.rc, 0);
	assert_int_equal(xp_tls_sess_alpn(c.srv.x), 2);
	conn_close(&c);
	sockpair(c.fd);
	end_raw_client(&c.cli, c.fd[0], "node-a", 0);
	assert_int_equal(SSL_set_alpn_protos(c.cli.raw, (const unsigned char *)"\x07" XP_TLS_ALPN,
					     1 + sizeof(XP_TLS_ALPN) - 1),
			 0);
	end_xp(&c.srv, "server", b, c.fd[1], true, NULL);
	handshake(&c.cli, &c.srv);
	assert_int_equal(c.srv.rc, 0);
	assert_int_equal(xp_tls_sess_alpn(c.srv.x), 1);
	conn_close(&c);
	sockpair(c.fd);
	end_raw_client(&c.cli, c.fd[0], "node-a", 0);
	end_xp(&c.srv, "server", b, c.fd[1], true, NULL);
	handshake(&c.cli, &c.srv);
	assert_int_equal(c.srv.rc, 0);
	assert_int_equal(xp_tls_sess_alpn(c.srv.x), 0);
	conn_close(&c);
	xp_tls_free(a);
	xp_tls_free(b);
}

/* KubeVirt checks a client's CN and a server's apart: a target admits only its client names,
 * a source only its server names. */
static void test_allow_per_role(void **state)
{
	struct xp_tls *srv = ctx_new(&(struct ctx_opt){
		.leaf = "node-b", .allow_clients = "mallory", .allow_servers = "nobody" });
	struct xp_tls *cli = ctx_new(&(struct ctx_opt){
		.leaf = "stranger", .allow_clients = "nobody", .allow_servers = NODE_CN });
	struct conn c;

	(void)state;
	assert_string_equal(xp_tls_allow_list(srv, false, 0), "mallory");
	assert_null(xp_tls_allow_list(srv, false, 1));
	assert_string_equal(xp_tls_allow_list(srv, true, 0), "nobody");
	/* stranger (CN mallory) may come to srv; srv (CN node) may be reached by cli. */
	conn_open(&c, cli, srv, NULL);
	assert_ok(&c);
	conn_close(&c);
	/* The other way round neither name fits: the target refuses the source. */
	conn_open(&c, srv, cli, NULL);
	assert_int_equal(xp_tls_sess_refusal(c.cli.x), XP_TLS_NAME);
	conn_close(&c);
	xp_tls_free(srv);
	xp_tls_free(cli);
}

/* stderr into a file until stderr_captured(), which gives back what was logged (static). */
static int stderr_saved = -1;
static FILE *stderr_file;

static void stderr_capture(void)
{
	stderr_file = tmpfile();
	assert_non_null(stderr_file);
	fflush(stderr);
	stderr_saved = dup(STDERR_FILENO);
	dup2(fileno(stderr_file), STDERR_FILENO);
}

static const char *stderr_captured(void)
{
	static char buf[4096];
	size_t n;

	fflush(stderr);
	dup2(stderr_saved, STDERR_FILENO);
	close(stderr_saved);
	rewind(stderr_file);
	n = fread(buf, 1, sizeof(buf) - 1, stderr_file);
	buf[n] = '\0';
	fclose(stderr_file);
	fputs(buf, stderr);
	return buf;
}

/* --tls-min-version 1.3 refuses a TLS 1.2 client; --tls-ciphers takes IANA names (as KubeVirt's
 * CR) and OpenSSL's, and leaves out a suite it does not know, naming it. */
static void test_version_and_suites(void **state)
{
	struct xp_tls *srv = ctx_new(&(struct ctx_opt){ .leaf = "node-b", .min_version = 13 });
	struct xp_tls_conf conf = { .cert = leaf("node-a")->crt,
				    .key = leaf("node-a")->key,
				    .ca = ca1.path };
	struct xp_tls *t = NULL;
	const char *out;
	struct conn c;
	char err[256];

	(void)state;
	assert_string_equal(xp_tls_min_version(srv), "TLSv1.3");
	sockpair(c.fd);
	end_raw_client(&c.cli, c.fd[0], "node-a", TLS1_2_VERSION);
	end_xp(&c.srv, "server", srv, c.fd[1], true, NULL);
	handshake(&c.cli, &c.srv);
	assert_true(c.srv.rc < 0 && c.srv.rc != -EAGAIN);
	assert_int_equal(xp_tls_sess_refusal(c.srv.x), XP_TLS_PROTOCOL);
	conn_close(&c);
	xp_tls_free(srv);

	conf.ciphers12 = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,ECDHE-RSA-AES256-GCM-SHA384";
	assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), 0);
	xp_tls_free(t);
	t = NULL;
	/* As KubeVirt: an unknown name (or a TLS 1.3 suite) is left out, with a warning naming
	 * it; a list with no known suite left is refused. */
	conf.ciphers12 = "TLS_NO_SUCH_SUITE,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,"
			 "TLS_AES_128_GCM_SHA256,NO-SUCH-SUITE";
	stderr_capture();
	assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), 0);
	out = stderr_captured();
	assert_non_null(strstr(out, "unknown TLS 1.2 suite \"TLS_NO_SUCH_SUITE\": left out\n"));
	assert_non_null(strstr(out, "unknown TLS 1.2 suite \"TLS_AES_128_GCM_SHA256\": left out\n"));
	assert_non_null(strstr(out, "unknown TLS 1.2 suite \"NO-SUCH-SUITE\": left out\n"));
	assert_null(strstr(out, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"));
	xp_tls_free(t);
	t = NULL;
	conf.ciphers12 = "TLS_NO_SUCH_SUITE,NO-SUCH-SUITE";
	stderr_capture();
	assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), -EINVAL);
	out = stderr_captured();
	assert_string_equal(err, "--tls-ciphers: no known TLS 1.2 suite in "
				 "\"TLS_NO_SUCH_SUITE,NO-SUCH-SUITE\"");
	assert_non_null(strstr(out, "\"TLS_NO_SUCH_SUITE\": left out"));
	assert_non_null(strstr(out, "\"NO-SUCH-SUITE\": left out"));
	assert_null(t);
	conf.ciphers12 = " , ";
	assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "--tls-ciphers: no suites given");
	conf.ciphers12 = NULL;
	conf.min_version = 11;
	assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), -EINVAL);
	assert_null(t);
}

/* A serverAuth-only pair is a target's, never a source's: it loads, and says why it cannot be
 * a client. */
static void test_client_problem(void **state)
{
	struct xp_tls *t = ctx_new(&(struct ctx_opt){ .leaf = "server-only" });
	struct xp_tls *u =
		ctx_new(&(struct ctx_opt){ .leaf = "server-only", .client_leaf = "client-only" });

	(void)state;
	assert_non_null(xp_tls_client_problem(t));
	assert_non_null(strstr(xp_tls_client_problem(t), "lacks clientAuth"));
	assert_null(xp_tls_client_problem(u));
	xp_tls_free(t);
	xp_tls_free(u);
}

/* TLS 1.3: a client hears that the server took its certificate from the server's ticket, and
 * that it did not from an alert; xp_tls_await_server() waits for either without eating data. */
static void test_await_server(void **state)
{
	struct xp_tls *srv = ctx_new(&(struct ctx_opt){ .leaf = "node-b" });
	struct xp_tls *cli = ctx_new(&(struct ctx_opt){ .leaf = "node-a" });
	struct xp_tls *strict = ctx_new(&(struct ctx_opt){ .leaf = "node-b", .allow = "nobody" });
	enum xp_tls_want want;
	struct conn c;
	char buf[16];
	int r = -EAGAIN;

	(void)state;
	conn_open(&c, cli, srv, NULL);
	assert_ok(&c);
	for (int i = 0; i < STEPS && r == -EAGAIN; i++) {
		struct pollfd p = { .fd = c.cli.fd, .events = POLLIN };

		r = xp_tls_await_server(c.cli.x, &want);
		if (r == -EAGAIN)
			assert_true(poll(&p, 1, POLL_MS) > 0);
	}
	assert_int_equal(r, 0);
	/* The server's data after the ticket is still there to read. */
	write_all(&c.srv, "nbd", 3);
	assert_int_equal(read_until(&c.cli, buf, sizeof(buf)), 3);
	conn_close(&c);

	conn_open(&c, cli, strict, NULL);
	assert_int_equal(c.cli.rc, 0); /* TLS 1.3: the client finished first */
	r = -EAGAIN;
	for (int i = 0; i < STEPS && r == -EAGAIN; i++) {
		struct pollfd p = { .fd = c.cli.fd, .events = POLLIN };

		r = xp_tls_await_server(c.cli.x, &want);
		if (r == -EAGAIN)
			assert_true(poll(&p, 1, POLL_MS) > 0);
	}
	assert_true(r < 0 && r != -EAGAIN);
	assert_int_equal(xp_tls_sess_refusal(c.cli.x), XP_TLS_PEER_REFUSED);
	conn_close(&c);
	xp_tls_free(srv);
	xp_tls_free(cli);
	xp_tls_free(strict);
}

/* ---- resumption ---- */

static void test_resumption(void **state)
{
	struct xp_tls *a = ctx_new(&(struct ctx_opt){ .leaf = "node-a", .resumption = true });
	struct xp_tls *b = ctx_new(&(struct ctx_opt){ .leaf = "node-b", .resumption = true });
	struct conn c;

	(void)state;
	/* The first connection reads once after the handshake: the ticket arrives. It then ends
	 * without close_notify, which must not spoil the cached ticket. */
	conn_open(&c, a, b, PEER);
	assert_ok(&c);
	assert_false(xp_tls_sess_resumed(c.cli.x));
	round_trip(&c);
	conn_close(&c);

	conn_open(&c, a, b, PEER);
	assert_ok(&c);
	assert_true(xp_tls_sess_resumed(c.cli.x));
	assert_true(xp_tls_sess_resumed(c.srv.x));
	assert_non_null(strstr(xp_tls_sess_describe(c.cli.x), "resumed=yes"));
	/* Resumed sessions still know the peer's certificate. */
	assert_non_null(strstr(xp_tls_sess_describe(c.cli.x), NODE_CN));
	assert_non_null(strstr(xp_tls_sess_describe(c.srv.x), NODE_CN));
	round_trip(&c);
	conn_close(&c);

	/* Another peer has no ticket. */
	conn_open(&c, a, b, "198.18.0.3:4000");
	assert_ok(&c);
	assert_false(xp_tls_sess_resumed(c.cli.x));
	conn_close(&c);

	/* No peer name: no cache. */
	conn_open(&c, a, b, NULL);
	assert_ok(&c);
	assert_false(xp_tls_sess_resumed(c.cli.x));
	conn_close(&c);

	/* A client that never reads after the handshake never receives a ticket: the ticket
	 * from the second connection is still the one used. */
	conn_open(&c, a, b, PEER);
	assert_ok(&c);
	assert_true(xp_tls_sess_resumed(c.cli.x));
	conn_close(&c);

	xp_tls_free(a);
	xp_tls_free(b);
}

static void test_no_resumption(void **state)
{
	struct xp_tls *a = ctx_new(&(struct ctx_opt){ .leaf = "node-a", .resumption = false });
	struct xp_tls *b = ctx_new(&(struct ctx_opt){ .leaf = "node-b", .resumption = true });
	struct conn c;

	(void)state;
	for (int i = 0; i < 2; i++) {
		conn_open(&c, a, b, PEER);
		assert_ok(&c);
		assert_false(xp_tls_sess_resumed(c.cli.x));
		assert_false(xp_tls_sess_resumed(c.srv.x));
		round_trip(&c);
		conn_close(&c);
	}
	xp_tls_free(a);
	xp_tls_free(b);
}

/* Rewrites dir/name.{crt,key} with a fresh leaf and points a context's copies at them. */
static void fresh_pair(const char *name, const char *cn, char *crt, char *key)
{
	struct cf_leaf opt = { .cn = cn, .not_before = -3600 };

	assert_int_equal(cf_leaf_make(&ca1, dir, name, &opt, crt, key), 0);
}

static struct xp_tls *ctx_files(const char *crt, const char *key, bool resumption)
{
	struct xp_tls_conf conf = {
		.cert = crt, .key = key, .ca = ca1.path, .resumption = resumption
	};
	struct xp_tls *t = NULL;
	char err[256] = "";

	if (xp_tls_new(&conf, &t, err, sizeof(err)) < 0)
		fail_msg("xp_tls_new: %s", err);
	return t;
}

static void test_resumption_reload(void **state)
{
	char acrt[PATH_MAX], akey[PATH_MAX], bcrt[PATH_MAX], bkey[PATH_MAX], err[256] = "";
	struct xp_tls *a, *b;
	struct conn c, late;

	(void)state;
	fresh_pair("rot-a", NODE_CN, acrt, akey);
	fresh_pair("rot-b", NODE_CN, bcrt, bkey);
	a = ctx_files(acrt, akey, true);
	b = ctx_files(bcrt, bkey, true);

	conn_open(&c, a, b, PEER);
	assert_ok(&c);
	round_trip(&c);
	conn_close(&c);
	conn_open(&c, a, b, PEER);
	assert_ok(&c);
	assert_true(xp_tls_sess_resumed(c.cli.x));
	round_trip(&c);
	conn_close(&c);

	/* The client rotates: its cache is emptied. */
	fresh_pair("rot-a", NODE_CN, acrt, akey);
	assert_int_equal(xp_tls_reload(a, err, sizeof(err)), 0);
	assert_int_equal(xp_tls_generation(a), 2);
	conn_open(&c, a, b, PEER);
	assert_ok(&c);
	assert_false(xp_tls_sess_resumed(c.cli.x));
	assert_false(xp_tls_sess_resumed(c.srv.x));
	round_trip(&c);
	conn_close(&c);
	/* ... and fills again. */
	conn_open(&c, a, b, PEER);
	assert_ok(&c);
	assert_true(xp_tls_sess_resumed(c.cli.x));
	round_trip(&c);
	conn_close(&c);

	/* The server rotates: its new ticket key refuses the client's ticket; a full handshake. */
	fresh_pair("rot-b", NODE_CN, bcrt, bkey);
	assert_int_equal(xp_tls_reload(b, err, sizeof(err)), 0);
	assert_int_equal(xp_tls_generation(b), 2);
	conn_open(&c, a, b, PEER);
	assert_ok(&c);
	assert_false(xp_tls_sess_resumed(c.cli.x));
	assert_false(xp_tls_sess_resumed(c.srv.x));
	round_trip(&c);
	conn_close(&c);

	/* A ticket that arrives after the client's reload, on a session of the old generation,
	 * is not cached: the next session makes a full handshake. */
	conn_open(&late, a, b, PEER);
	assert_ok(&late);
	assert_true(xp_tls_sess_resumed(late.cli.x));
	fresh_pair("rot-a", NODE_CN, acrt, akey);
	assert_int_equal(xp_tls_reload(a, err, sizeof(err)), 0);
	assert_int_equal(xp_tls_generation(a), 3);
	/* The old session still works, and now reads its ticket. */
	round_trip(&late);
	conn_open(&c, a, b, PEER);
	assert_ok(&c);
	assert_false(xp_tls_sess_resumed(c.cli.x));
	conn_close(&c);
	conn_close(&late);

	xp_tls_free(a);
	xp_tls_free(b);
}

/* ---- refusals ---- */

enum client_kind { XP_CLIENT, RAW_CLIENT, RAW_CLIENT_NO_CERT, RAW_CLIENT_TLS12 };

struct refusal_case {
	const char *name;
	const char *srv_leaf, *cli_leaf;
	const char *srv_allow, *cli_allow; /* NULL: the default list */
	const char *srv_ca;		   /* NULL: ca1 */
	enum client_kind kind;
	enum xp_tls_refusal srv, cli; /* expected on each side */
};

static const struct refusal_case refusal_cases[] = {
	/* Accepted. */
	{ "good", "node-b", "node-a", .srv = XP_TLS_OK, .cli = XP_TLS_OK },
	{ "uri-san-allowed", "node-b", "stranger-uri", .srv_allow = SAN_URI, .srv = XP_TLS_OK },
	{ "dns-san-allowed", "node-b", "stranger-dns", .srv_allow = "x," SAN_DNS,
	  .srv = XP_TLS_OK },
	{ "no-cn-uri-allowed", "node-b", "no-cn-uri", .srv_allow = SAN_URI, .srv = XP_TLS_OK },
	{ "allow-any", "node-b", "stranger", .srv_allow = "*", .srv = XP_TLS_OK },
	{ "no-eku", "node-b", "no-eku", .srv = XP_TLS_OK },
	{ "client-eku-as-client", "node-b", "client-only", .srv = XP_TLS_OK },
	{ "server-eku-as-server", "server-only", "node-a", .srv = XP_TLS_OK },
	{ "two-cas-trusted", "node-b", "other-ca", .srv_ca = "both", .srv = XP_TLS_OK },
	{ "tls12-raw-client", "node-b", "node-a", .kind = RAW_CLIENT_TLS12, .srv = XP_TLS_OK },

	/* Refused by the server: the client hears of it (peer-refused). */
	{ "client-other-ca", "node-b", "other-ca", .srv = XP_TLS_UNTRUSTED,
	  .cli = XP_TLS_PEER_REFUSED },
	{ "client-impostor-ca", "node-b", "impostor", .srv = XP_TLS_UNTRUSTED,
	  .cli = XP_TLS_PEER_REFUSED },
	{ "allow-any-other-ca", "node-b", "other-ca", .srv_allow = "*", .srv = XP_TLS_UNTRUSTED,
	  .cli = XP_TLS_PEER_REFUSED },
	{ "client-expired", "node-b", "expired", .kind = RAW_CLIENT, .srv = XP_TLS_EXPIRED },
	{ "client-not-yet-valid", "node-b", "not-yet", .kind = RAW_CLIENT,
	  .srv = XP_TLS_NOT_YET_VALID },
	{ "client-no-cert", "node-b", NULL, .kind = RAW_CLIENT_NO_CERT, .srv = XP_TLS_NO_CERT },
	{ "client-no-cert-tls12", "node-b", NULL, .kind = RAW_CLIENT_TLS12, .srv = XP_TLS_NO_CERT },
	{ "client-name", "node-b", "stranger", .srv = XP_TLS_NAME, .cli = XP_TLS_PEER_REFUSED },
	{ "client-name-san-not-listed", "node-b", "stranger-uri", .srv = XP_TLS_NAME,
	  .cli = XP_TLS_PEER_REFUSED },
	{ "client-server-eku", "node-b", "server-only", .srv = XP_TLS_BAD_PURPOSE,
	  .cli = XP_TLS_PEER_REFUSED },

	/* Refused by the client: the server hears of it (peer-refused). */
	{ "server-other-ca", "other-ca", "node-a", .srv = XP_TLS_PEER_REFUSED,
	  .cli = XP_TLS_UNTRUSTED },
	{ "server-name", "stranger", "node-a", .srv = XP_TLS_PEER_REFUSED, .cli = XP_TLS_NAME },
	{ "server-client-eku", "client-only", "node-a", .srv = XP_TLS_PEER_REFUSED,
	  .cli = XP_TLS_BAD_PURPOSE },
};

static void run_refusal_case(const struct refusal_case *rc)
{
	struct xp_tls *srv, *cli = NULL;
	struct conn c;
	char buf[64];

	srv = ctx_new(&(struct ctx_opt){
		.leaf = rc->srv_leaf, .ca = rc->srv_ca ? ca_both : NULL, .allow = rc->srv_allow });
	sockpair(c.fd);
	switch (rc->kind) {
	case XP_CLIENT:
		cli = ctx_new(&(struct ctx_opt){ .leaf = rc->cli_leaf, .allow = rc->cli_allow });
		end_xp(&c.cli, "client", cli, c.fd[0], false, NULL);
		break;
	case RAW_CLIENT:
		end_raw_client(&c.cli, c.fd[0], rc->cli_leaf, 0);
		break;
	case RAW_CLIENT_NO_CERT:
		end_raw_client(&c.cli, c.fd[0], NULL, 0);
		break;
	case RAW_CLIENT_TLS12:
		end_raw_client(&c.cli, c.fd[0], rc->cli_leaf, TLS1_2_VERSION);
		break;
	}
	end_xp(&c.srv, "server", srv, c.fd[1], true, NULL);
	handshake(&c.cli, &c.srv);

	print_message("%-28s server %d %-16s \"%s\"\n", rc->name, c.srv.rc,
		      xp_tls_refusal_token(xp_tls_sess_refusal(c.srv.x)),
		      xp_tls_sess_error(c.srv.x));
	if (rc->srv == XP_TLS_OK) {
		if (c.srv.rc != 0)
			fail_msg("%s: server refused: %s: %s", rc->name,
				 xp_tls_refusal_token(xp_tls_sess_refusal(c.srv.x)),
				 xp_tls_sess_error(c.srv.x));
		assert_int_equal(c.cli.rc, 0);
		if (rc->kind == RAW_CLIENT_TLS12)
			assert_string_equal(xp_tls_sess_version(c.srv.x), "TLSv1.2");
		else
			assert_string_equal(xp_tls_sess_version(c.srv.x), "TLSv1.3");
		assert_int_equal(xp_tls_sess_refusal(c.srv.x), XP_TLS_OK);
		if (c.cli.x) {
			assert_int_equal(xp_tls_sess_refusal(c.cli.x), XP_TLS_OK);
			round_trip(&c);
		}
		goto out;
	}
	/* The refusing side names the reason, and says something about it. */
	if (rc->srv != XP_TLS_PEER_REFUSED) {
		assert_true(c.srv.rc < 0 && c.srv.rc != -EAGAIN);
		assert_string_equal(xp_tls_refusal_token(xp_tls_sess_refusal(c.srv.x)),
				    xp_tls_refusal_token(rc->srv));
		assert_string_not_equal(xp_tls_sess_error(c.srv.x), "no error");
		if (c.cli.x) {
			/* TLS 1.3: the client finished before the server looked at its
			 * certificate; the alert comes with the first read. */
			if (c.cli.rc == 0) {
				ssize_t k = read_until(&c.cli, buf, sizeof(buf));

				print_message("%-28s client read %zd: %s\n", "", k,
					      xp_tls_sess_io_error(c.cli.x));
				assert_true(k < 0 && k != -ETIMEDOUT);
			}
			assert_string_equal(xp_tls_refusal_token(xp_tls_sess_refusal(c.cli.x)),
					    xp_tls_refusal_token(rc->cli));
			print_message("%-28s client %s \"%s\"\n", "",
				      xp_tls_refusal_token(xp_tls_sess_refusal(c.cli.x)),
				      xp_tls_sess_error(c.cli.x));
		}
	} else {
		/* The client refuses the server; the server hears of it. */
		assert_true(c.cli.rc < 0 && c.cli.rc != -EAGAIN);
		print_message("%-28s client %d %-16s \"%s\"\n", "", c.cli.rc,
			      xp_tls_refusal_token(xp_tls_sess_refusal(c.cli.x)),
			      xp_tls_sess_error(c.cli.x));
		assert_string_equal(xp_tls_refusal_token(xp_tls_sess_refusal(c.cli.x)),
				    xp_tls_refusal_token(rc->cli));
		assert_string_not_equal(xp_tls_sess_error(c.cli.x), "no error");
		assert_true(c.srv.rc < 0 && c.srv.rc != -EAGAIN);
		assert_string_equal(xp_tls_refusal_token(xp_tls_sess_refusal(c.srv.x)),
				    xp_tls_refusal_token(XP_TLS_PEER_REFUSED));
	}
out:
	conn_close(&c);
	xp_tls_free(cli);
	xp_tls_free(srv);
}

static void test_refusals(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(refusal_cases) / sizeof(refusal_cases[0]); i++)
		run_refusal_case(&refusal_cases[i]);
}

/* Not TLS at all, and a peer that hangs up mid-handshake. */
static void test_protocol_and_closed(void **state)
{
	static const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
	struct xp_tls *b = ctx_new(&(struct ctx_opt){ .leaf = "node-b" });
	struct end srv;
	int fd[2], r = -EAGAIN;

	(void)state;
	sockpair(fd);
	assert_int_equal(write(fd[0], http, sizeof(http) - 1), (ssize_t)sizeof(http) - 1);
	end_xp(&srv, "server", b, fd[1], true, NULL);
	for (int i = 0; i < 10 && r == -EAGAIN; i++)
		r = xp_tls_handshake(srv.x, &srv.want);
	assert_int_equal(r, -EPROTO);
	assert_string_equal(xp_tls_refusal_token(xp_tls_sess_refusal(srv.x)), "protocol");
	print_message("http: %s\n", xp_tls_sess_error(srv.x));
	end_free(&srv);
	close(fd[0]);
	close(fd[1]);

	/* Nothing at all, then EOF. */
	sockpair(fd);
	end_xp(&srv, "server", b, fd[1], true, NULL);
	assert_int_equal(xp_tls_handshake(srv.x, &srv.want), -EAGAIN);
	assert_int_equal(srv.want, XP_TLS_WANT_READ);
	assert_int_equal(shutdown(fd[0], SHUT_WR), 0);
	r = xp_tls_handshake(srv.x, &srv.want);
	assert_true(r < 0 && r != -EAGAIN);
	assert_string_equal(xp_tls_refusal_token(xp_tls_sess_refusal(srv.x)), "closed");
	print_message("eof: %d %s\n", r, xp_tls_sess_error(srv.x));
	end_free(&srv);
	close(fd[0]);
	close(fd[1]);

	/* A client whose server hangs up after the ClientHello. */
	sockpair(fd);
	end_xp(&srv, "client", b, fd[0], false, NULL);
	assert_int_equal(xp_tls_handshake(srv.x, &srv.want), -EAGAIN);
	close(fd[1]);
	r = xp_tls_handshake(srv.x, &srv.want);
	assert_true(r < 0 && r != -EAGAIN);
	assert_string_equal(xp_tls_refusal_token(xp_tls_sess_refusal(srv.x)), "closed");
	print_message("client eof: %d %s\n", r, xp_tls_sess_error(srv.x));
	end_free(&srv);
	close(fd[0]);
	xp_tls_free(b);
}

/* ---- xp_tls_new and xp_tls_reload errors ---- */

static int try_new(const char *cert, const char *key, const char *ccert, const char *ckey,
		   const char *ca, char *err, size_t errlen)
{
	struct xp_tls_conf conf = {
		.cert = cert, .key = key, .client_cert = ccert, .client_key = ckey, .ca = ca
	};
	struct xp_tls *t = NULL;
	int r;

	err[0] = '\0';
	r = xp_tls_new(&conf, &t, err, errlen);
	if (r == 0)
		xp_tls_free(t);
	else
		assert_null(t);
	print_message("xp_tls_new: %d \"%s\"\n", r, err);
	return r;
}

static void test_new_errors(void **state)
{
	struct leaf *a = leaf("node-a"), *b = leaf("node-b"), *x = leaf("expired");
	char missing[PATH_MAX], garbage[PATH_MAX], err[512];
	struct xp_tls *t = NULL;
	struct xp_tls_conf conf = { .cert = a->crt, .key = a->key };
	int r;

	(void)state;
	snprintf(missing, sizeof(missing), "%s/missing.crt", dir);
	snprintf(garbage, sizeof(garbage), "%s/garbage.pem", dir);
	assert_int_equal(cf_write(garbage, "not a PEM file\n", 15), 0);

	/* No CA: refused before touching a file. */
	assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), -EINVAL);
	assert_null(t);
	assert_true(err[0] != '\0');

	/* A missing file: the line names it. */
	r = try_new(missing, a->key, NULL, NULL, ca1.path, err, sizeof(err));
	assert_int_equal(r, -ENOENT);
	assert_non_null(strstr(err, "missing.crt"));
	r = try_new(a->crt, a->key, NULL, NULL, missing, err, sizeof(err));
	assert_int_equal(r, -ENOENT);
	assert_non_null(strstr(err, "missing.crt"));

	/* Not PEM. */
	assert_true(try_new(garbage, a->key, NULL, NULL, ca1.path, err, sizeof(err)) < 0);
	assert_non_null(strstr(err, garbage));
	assert_true(try_new(a->crt, garbage, NULL, NULL, ca1.path, err, sizeof(err)) < 0);
	assert_non_null(strstr(err, garbage));
	assert_true(try_new(a->crt, a->key, NULL, NULL, garbage, err, sizeof(err)) < 0);
	assert_non_null(strstr(err, garbage));

	/* A key that is not the certificate's: OpenSSL already refuses it when loading the key
	 * ("key values mismatch"), so the line names the key file. */
	assert_int_equal(try_new(a->crt, b->key, NULL, NULL, ca1.path, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, b->key));
	/* ... on the client pair too. */
	assert_int_equal(try_new(a->crt, a->key, b->crt, a->key, ca1.path, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, a->key));

	/* Our own certificate expired: as a server, and as a client. */
	assert_int_equal(try_new(x->crt, x->key, NULL, NULL, ca1.path, err, sizeof(err)),
			 -EKEYEXPIRED);
	assert_non_null(strstr(err, x->crt));
	assert_int_equal(try_new(a->crt, a->key, x->crt, x->key, ca1.path, err, sizeof(err)),
			 -EKEYEXPIRED);
	assert_non_null(strstr(err, x->crt));
	/* ... or not valid yet. */
	assert_int_equal(try_new(leaf("not-yet")->crt, leaf("not-yet")->key, NULL, NULL, ca1.path,
				 err, sizeof(err)),
			 -EKEYEXPIRED);
	assert_non_null(strstr(err, "not valid yet"));
	/* Spaces around allow-list names are not part of them. */
	conf = (struct xp_tls_conf){
		.cert = a->crt, .key = a->key, .ca = ca1.path, .allow = " x , " NODE_CN " "
	};
	assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), 0);
	assert_string_equal(xp_tls_allow_list(t, false, 1), NODE_CN);
	assert_null(xp_tls_allow_list(t, false, 2));
	xp_tls_free(t);
	t = NULL;

	/* Allow-lists without a name. */
	conf = (struct xp_tls_conf){ .cert = a->crt, .key = a->key, .ca = ca1.path, .allow = "," };
	assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), -EINVAL);
	assert_null(t);
	assert_non_null(strstr(err, "allow"));
	conf.allow = "";
	assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), -EINVAL);
	assert_null(t);
	/* At most XP_TLS_ALLOW_MAX names of at most 255 bytes. */
	{
		char list[XP_TLS_ALLOW_MAX * 4 + 300];
		size_t n = 0;

		for (int i = 0; i < XP_TLS_ALLOW_MAX; i++)
			n += (size_t)snprintf(list + n, sizeof(list) - n, "%sn%d", i ? "," : "", i);
		conf.allow = list;
		assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), 0);
		char last[16];

		snprintf(last, sizeof(last), "n%d", XP_TLS_ALLOW_MAX - 1);
		assert_string_equal(xp_tls_allow_list(t, false, XP_TLS_ALLOW_MAX - 1), last);
		xp_tls_free(t);
		t = NULL;
		snprintf(list + n, sizeof(list) - n, ",one-more");
		assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), -EINVAL);
		assert_null(t);
		memset(list, 'x', 256);
		list[256] = '\0';
		assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), -EINVAL);
		assert_null(t);
		list[255] = '\0';
		assert_int_equal(xp_tls_new(&conf, &t, err, sizeof(err)), 0);
		xp_tls_free(t);
		t = NULL;
	}
}

static void test_reload(void **state)
{
	char crt[PATH_MAX], key[PATH_MAX], good_key[PATH_MAX], err[512] = "";
	struct xp_tls *a, *b = ctx_new(&(struct ctx_opt){ .leaf = "node-b" });
	char desc1[320];
	struct conn c;
	int r;

	(void)state;
	fresh_pair("reload", NODE_CN, crt, key);
	snprintf(good_key, sizeof(good_key), "%s/reload-good.key", dir);
	assert_int_equal(cf_copy(key, good_key), 0);
	a = ctx_files(crt, key, false);
	snprintf(desc1, sizeof(desc1), "%s", xp_tls_describe(a));

	/* Same bytes, even rewritten: nothing new. */
	assert_int_equal(xp_tls_reload(a, err, sizeof(err)), 1);
	assert_int_equal(cf_copy(good_key, key), 0);
	assert_int_equal(xp_tls_reload(a, err, sizeof(err)), 1);
	assert_int_equal(xp_tls_generation(a), 1);

	/* A broken key: refused, the old pair stays. */
	assert_int_equal(cf_write(key, "-----BEGIN PRIVATE KEY-----\nAAAA\n", 33), 0);
	err[0] = '\0';
	r = xp_tls_reload(a, err, sizeof(err));
	print_message("reload, broken key: %d \"%s\"\n", r, err);
	assert_true(r < 0);
	assert_true(err[0] != '\0');
	assert_non_null(strstr(err, key));
	assert_int_equal(xp_tls_generation(a), 1);
	assert_string_equal(xp_tls_describe(a), desc1);
	conn_open(&c, a, b, NULL);
	assert_ok(&c);
	round_trip(&c);
	conn_close(&c);
	conn_open(&c, b, a, NULL);
	assert_ok(&c);
	conn_close(&c);

	/* A key of another certificate (a rotation caught half-way): refused likewise. */
	assert_int_equal(cf_key_make(dir, "reload-other", NULL), 0);
	{
		char other[PATH_MAX];

		snprintf(other, sizeof(other), "%s/reload-other.key", dir);
		assert_int_equal(cf_copy(other, key), 0);
	}
	r = xp_tls_reload(a, err, sizeof(err));
	assert_true(r < 0);
	assert_int_equal(xp_tls_generation(a), 1);

	/* The file gone: refused. */
	assert_int_equal(unlink(key), 0);
	r = xp_tls_reload(a, err, sizeof(err));
	print_message("reload, key gone: %d \"%s\"\n", r, err);
	assert_int_equal(r, -ENOENT);
	assert_int_equal(xp_tls_generation(a), 1);

	/* Back to the first bytes: the same generation as before. */
	assert_int_equal(cf_copy(good_key, key), 0);
	assert_int_equal(xp_tls_reload(a, err, sizeof(err)), 1);
	assert_int_equal(xp_tls_generation(a), 1);

	/* A real rotation, with a session of the old generation open across it. */
	conn_open(&c, a, b, NULL);
	assert_ok(&c);
	fresh_pair("reload", NODE_CN, crt, key);
	assert_int_equal(xp_tls_reload(a, err, sizeof(err)), 0);
	assert_int_equal(xp_tls_generation(a), 2);
	assert_string_not_equal(xp_tls_describe(a), desc1);
	round_trip(&c);
	conn_close(&c);
	conn_open(&c, a, b, NULL);
	assert_ok(&c);
	round_trip(&c);
	conn_close(&c);
	assert_int_equal(xp_tls_reload(a, err, sizeof(err)), 1);
	assert_int_equal(xp_tls_generation(a), 2);

	xp_tls_free(a);
	xp_tls_free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_refusal_tokens),
		cmocka_unit_test(test_context),
		cmocka_unit_test(test_ktls_probe),
		cmocka_unit_test(test_good_pair_client_closes),
		cmocka_unit_test(test_good_pair_server_closes),
		cmocka_unit_test(test_hop_keys),
		cmocka_unit_test(test_same_context_client_pair),
		cmocka_unit_test(test_truncation),
		cmocka_unit_test(test_resumption),
		cmocka_unit_test(test_no_resumption),
		cmocka_unit_test(test_resumption_reload),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_protocol_and_closed),
		cmocka_unit_test(test_new_errors),
		cmocka_unit_test(test_reload),
		cmocka_unit_test(test_alpn),
		cmocka_unit_test(test_allow_per_role),
		cmocka_unit_test(test_version_and_suites),
		cmocka_unit_test(test_client_problem),
		cmocka_unit_test(test_await_server),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
