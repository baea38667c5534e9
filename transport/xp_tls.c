// SPDX-License-Identifier: Apache-2.0
/* Mutual TLS on OpenSSL 3 for the node hop: certificate generations, the allow-list, the
 * client's resumption cache and non-blocking sessions. Handshakes run on the control thread; a
 * finished session moves to a data-path worker, which only reads, writes and shuts it down. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "xp_tls.h"

#ifndef TCP_ULP
#define TCP_ULP 31
#endif

/* TLS 1.2 suites: ECDHE and AEAD only. TLS 1.3 suites are all AEAD; AES-128 first (faster). */
#define CIPHERS_12                                                                                 \
	"ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"                               \
	"ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"                               \
	"ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
#define CIPHERS_13 "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define GROUPS	   "X25519:P-256:P-384"
/* With read-ahead, one read(2) takes this many bytes of records. */
#define READ_BUFFER    (128 * 1024)
#define CACHE_PEERS    32
#define SESSION_ID_CTX "vmigd-node-hop"

struct cache_entry {
	char peer[80];
	SSL_SESSION *sess;
};

struct xp_tls {
	char *cert, *key, *client_cert, *client_key, *ca;
	char *allow[XP_TLS_ALLOW_MAX];
	unsigned int nallow;
	bool allow_any, resumption, ktls;
	SSL_CTX *srv, *cli;
	unsigned int generation;
	unsigned char digest[32]; /* of the files' bytes, to tell a real change from a touch */
	char desc[320];
	pthread_mutex_t cache_lock; /* tickets may arrive on a worker */
	struct cache_entry cache[CACHE_PEERS];
	unsigned int cache_next;
};

struct xp_tls_sess {
	struct xp_tls *t;
	SSL *ssl;
	int fd;
	/* xp_tls_sess_batch(): records wait in batch[off, len) for one write(2) */
	uint8_t *batch;
	size_t batch_cap, batch_off, batch_len;
	/* ... and records read from the socket wait in rbatch[roff, rlen) */
	uint8_t *rbatch;
	size_t rbatch_cap, rbatch_off, rbatch_len;
	bool server;
	unsigned int generation;
	char peer[80];
	enum xp_tls_refusal refusal;
	char error[448];
	char desc[256];
	const char *io_error;
};

static int sess_idx = -1;
static BIO_METHOD *batch_method;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int batch_write(BIO *b, const char *data, size_t len, size_t *written);
static int batch_read(BIO *b, char *data, size_t len, size_t *got);
static long batch_ctrl(BIO *b, int cmd, long num, void *ptr);
static int batch_create(BIO *b);

static void init_once(void)
{
	sess_idx = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
	batch_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "vmigd batch");
	if (batch_method) {
		BIO_meth_set_write_ex(batch_method, batch_write);
		BIO_meth_set_read_ex(batch_method, batch_read);
		BIO_meth_set_ctrl(batch_method, batch_ctrl);
		BIO_meth_set_create(batch_method, batch_create);
	}
}

const char *xp_tls_refusal_token(enum xp_tls_refusal r)
{
	static const char *const tok[] = {
		[XP_TLS_OK] = "ok",
		[XP_TLS_NO_CERT] = "no-certificate",
		[XP_TLS_UNTRUSTED] = "untrusted-ca",
		[XP_TLS_EXPIRED] = "expired",
		[XP_TLS_NOT_YET_VALID] = "not-yet-valid",
		[XP_TLS_BAD_PURPOSE] = "bad-purpose",
		[XP_TLS_NAME] = "name-not-allowed",
		[XP_TLS_PEER_REFUSED] = "peer-refused",
		[XP_TLS_PROTOCOL] = "protocol",
		[XP_TLS_CLOSED] = "closed",
	};

	return (unsigned int)r < ARRAY_SIZE(tok) ? tok[r] : "?";
}

/* The most recent OpenSSL error as one line; empties the thread's queue. */
static void ssl_error_line(char *buf, size_t len)
{
	unsigned long e = ERR_peek_last_error();

	if (!e)
		snprintf(buf, len, "unknown error");
	else
		ERR_error_string_n(e, buf, len);
	ERR_clear_error();
}

static void name_line(X509 *x, char *buf, size_t len)
{
	X509_NAME_oneline(X509_get_subject_name(x), buf, (int)len);
}

static void time_line(const ASN1_TIME *tm, char *buf, size_t len)
{
	BIO *b = BIO_new(BIO_s_mem());
	int k = 0;

	if (b && ASN1_TIME_print(b, tm) > 0)
		k = BIO_read(b, buf, (int)len - 1);
	buf[k > 0 ? k : 0] = '\0';
	if (k <= 0)
		snprintf(buf, len, "?");
	BIO_free(b);
}

/* ---- allow-list ---- */

static bool name_allowed(const struct xp_tls *t, const char *name, size_t len)
{
	for (unsigned int i = 0; i < t->nallow; i++)
		if (strlen(t->allow[i]) == len && memcmp(t->allow[i], name, len) == 0)
			return true;
	return false;
}

/* Whether the certificate's CN or one of its DNS/URI SANs is on the list. */
static bool cert_allowed(const struct xp_tls *t, X509 *x)
{
	X509_NAME *subj = X509_get_subject_name(x);
	GENERAL_NAMES *sans;
	bool ok = false;
	int i = -1;

	if (t->allow_any)
		return true;
	while ((i = X509_NAME_get_index_by_NID(subj, NID_commonName, i)) >= 0 && !ok) {
		ASN1_STRING *d = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subj, i));

		ok = name_allowed(t, (const char *)ASN1_STRING_get0_data(d), ASN1_STRING_length(d));
	}
	sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
	for (int k = 0; sans && !ok && k < sk_GENERAL_NAME_num(sans); k++) {
		GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, k);
		ASN1_STRING *d = g->type == GEN_DNS   ? g->d.dNSName
				 : g->type == GEN_URI ? g->d.uniformResourceIdentifier
						      : NULL;

		if (d)
			ok = name_allowed(t, (const char *)ASN1_STRING_get0_data(d),
					  ASN1_STRING_length(d));
	}
	GENERAL_NAMES_free(sans);
	return ok;
}

static void allow_list_line(const struct xp_tls *t, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (unsigned int i = 0; i < t->nallow && used < len; i++)
		used += snprintf(buf + used, len - used, "%s%s", i ? "," : "", t->allow[i]);
}

static int parse_allow(struct xp_tls *t, const char *list, char *err, size_t errlen)
{
	const char *p = list;

	while (*p) {
		size_t n;

		p += strspn(p, " \t");
		n = strcspn(p, ",");
		while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
			n--;
		if (n == 1 && *p == '*') {
			t->allow_any = true;
		} else if (n > 0) {
			if (t->nallow == XP_TLS_ALLOW_MAX || n > 255) {
				snprintf(err, errlen, "--tls-allow: at most %d names of 255 bytes",
					 XP_TLS_ALLOW_MAX);
				return -EINVAL;
			}
			t->allow[t->nallow] = strndup(p, n);
			if (!t->allow[t->nallow++])
				return -ENOMEM;
		}
		p += n;
		p += strspn(p, " \t");
		p += *p == ',';
	}
	if (!t->allow_any && t->nallow == 0) {
		snprintf(err, errlen, "--tls-allow: no names given");
		return -EINVAL;
	}
	return 0;
}

/* ---- verification ---- */

static enum xp_tls_refusal verify_refusal(int e)
{
	switch (e) {
	case X509_V_ERR_CERT_HAS_EXPIRED:
	case X509_V_ERR_CRL_HAS_EXPIRED:
		return XP_TLS_EXPIRED;
	case X509_V_ERR_CERT_NOT_YET_VALID:
	case X509_V_ERR_CRL_NOT_YET_VALID:
		return XP_TLS_NOT_YET_VALID;
	case X509_V_ERR_INVALID_PURPOSE:
		return XP_TLS_BAD_PURPOSE;
	default:
		return XP_TLS_UNTRUSTED;
	}
}

/* Runs on full handshakes only; a resumed session was checked when it was first made. */
static int verify_cb(int ok, X509_STORE_CTX *ctx)
{
	SSL *ssl = X509_STORE_CTX_get_ex_data(ctx, SSL_get_ex_data_X509_STORE_CTX_idx());
	struct xp_tls_sess *s = SSL_get_ex_data(ssl, sess_idx);
	X509 *x = X509_STORE_CTX_get_current_cert(ctx);
	int depth = X509_STORE_CTX_get_error_depth(ctx);
	char subj[200] = "?";

	if (!s)
		return ok;
	if (s->refusal != XP_TLS_OK)
		return 0;
	if (x)
		name_line(x, subj, sizeof(subj));
	if (!ok) {
		int e = X509_STORE_CTX_get_error(ctx);

		s->refusal = verify_refusal(e);
		if (s->refusal == XP_TLS_EXPIRED && x) {
			char when[64];

			time_line(X509_get0_notAfter(x), when, sizeof(when));
			snprintf(s->error, sizeof(s->error),
				 "certificate \"%s\" (chain depth %d) expired on %s", subj, depth,
				 when);
		} else {
			snprintf(s->error, sizeof(s->error),
				 "certificate \"%s\" (chain depth %d): %s", subj, depth,
				 X509_verify_cert_error_string(e));
		}
		return 0;
	}
	if (depth == 0 && !cert_allowed(s->t, x)) {
		char allow[256];

		allow_list_line(s->t, allow, sizeof(allow));
		s->refusal = XP_TLS_NAME;
		snprintf(s->error, sizeof(s->error),
			 "certificate \"%.100s\" is signed by our CA but neither its CN nor a SAN "
			 "is allowed (allowed: %.150s)",
			 subj, allow);
		X509_STORE_CTX_set_error(ctx, X509_V_ERR_APPLICATION_VERIFICATION);
		return 0;
	}
	return 1;
}

/* ---- resumption cache (client) ---- */

static void cache_clear(struct xp_tls *t)
{
	pthread_mutex_lock(&t->cache_lock);
	for (unsigned int i = 0; i < CACHE_PEERS; i++) {
		SSL_SESSION_free(t->cache[i].sess);
		t->cache[i].sess = NULL;
		t->cache[i].peer[0] = '\0';
	}
	pthread_mutex_unlock(&t->cache_lock);
}

static SSL_SESSION *cache_get(struct xp_tls *t, const char *peer)
{
	SSL_SESSION *s = NULL;

	pthread_mutex_lock(&t->cache_lock);
	for (unsigned int i = 0; i < CACHE_PEERS && !s; i++)
		if (t->cache[i].sess && strcmp(t->cache[i].peer, peer) == 0) {
			s = t->cache[i].sess;
			SSL_SESSION_up_ref(s);
		}
	pthread_mutex_unlock(&t->cache_lock);
	return s;
}

/* Called by OpenSSL when a ticket arrives; we keep a copy of the newest one per peer. */
static int new_session_cb(SSL *ssl, SSL_SESSION *sess)
{
	struct xp_tls_sess *s = SSL_get_ex_data(ssl, sess_idx);
	struct xp_tls *t;
	struct cache_entry *slot = NULL;

	if (!s || !s->peer[0] || !SSL_SESSION_is_resumable(sess))
		return 0;
	t = s->t;
	pthread_mutex_lock(&t->cache_lock);
	/* A late ticket from an older generation would only be refused by the new server key. */
	if (s->generation == t->generation) {
		for (unsigned int i = 0; i < CACHE_PEERS && !slot; i++)
			if (t->cache[i].sess && strcmp(t->cache[i].peer, s->peer) == 0)
				slot = &t->cache[i];
		if (!slot)
			slot = &t->cache[t->cache_next++ % CACHE_PEERS];
		/* A copy: OpenSSL marks the connection's own session unresumable if that
		 * connection later ends without close_notify, which says nothing of the ticket. */
		SSL_SESSION *dup = SSL_SESSION_dup(sess);

		if (dup) {
			SSL_SESSION_free(slot->sess);
			slot->sess = dup;
			snprintf(slot->peer, sizeof(slot->peer), "%s", s->peer);
		}
	}
	pthread_mutex_unlock(&t->cache_lock);
	return 0;
}

/* ---- contexts ---- */

/* SHA-256 over the files' bytes; -errno with the unreadable file in *bad. */
static int file_digest(struct xp_tls *t, unsigned char out[32], const char **bad)
{
	const char *files[] = { t->cert, t->key, t->client_cert, t->client_key, t->ca };
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	int r = -ENOMEM;

	if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL))
		goto out;
	for (unsigned int i = 0; i < ARRAY_SIZE(files); i++) {
		unsigned char buf[8192];
		FILE *f = fopen(files[i], "re");
		size_t n;

		if (!f) {
			r = -errno;
			*bad = files[i];
			goto out;
		}
		while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
			EVP_DigestUpdate(md, buf, n);
		fclose(f);
		EVP_DigestUpdate(md, "\n", 1);
	}
	r = EVP_DigestFinal_ex(md, out, NULL) ? 0 : -EIO;
out:
	EVP_MD_CTX_free(md);
	return r;
}

static int ctx_common(SSL_CTX *ctx, const struct xp_tls *t, const char *cert, const char *key,
		      char *err, size_t errlen)
{
	char e[200];

	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
					 SSL_OP_CIPHER_SERVER_PREFERENCE);
	if (t->ktls)
		SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS);
	/* Not SSL_MODE_RELEASE_BUFFERS: it would free and allocate on the data path. */
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_read_ahead(ctx, 1);
	SSL_CTX_set_default_read_buffer_len(ctx, READ_BUFFER);
	if (!SSL_CTX_set_cipher_list(ctx, CIPHERS_12) ||
	    !SSL_CTX_set_ciphersuites(ctx, CIPHERS_13) || !SSL_CTX_set1_groups_list(ctx, GROUPS)) {
		ssl_error_line(e, sizeof(e));
		snprintf(err, errlen, "cipher configuration: %s", e);
		return -EINVAL;
	}
	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		ssl_error_line(e, sizeof(e));
		snprintf(err, errlen, "certificate %s: %s", cert, e);
		return -EINVAL;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
		if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
			ERR_clear_error();
			snprintf(err, errlen, "private key %s does not belong to certificate %s",
				 key, cert);
			return -EINVAL;
		}
		ssl_error_line(e, sizeof(e));
		snprintf(err, errlen, "private key %s: %s", key, e);
		return -EINVAL;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		ERR_clear_error();
		snprintf(err, errlen, "private key %s does not belong to certificate %s", key,
			 cert);
		return -EINVAL;
	}
	if (SSL_CTX_load_verify_locations(ctx, t->ca, NULL) != 1) {
		ssl_error_line(e, sizeof(e));
		snprintf(err, errlen, "CA %s: %s", t->ca, e);
		return -EINVAL;
	}
	/* Our own certificate must be valid now, or every peer will refuse us. */
	if (X509_cmp_current_time(X509_get0_notAfter(SSL_CTX_get0_certificate(ctx))) < 0) {
		snprintf(err, errlen, "certificate %s has expired", cert);
		return -EKEYEXPIRED;
	}
	if (X509_cmp_current_time(X509_get0_notBefore(SSL_CTX_get0_certificate(ctx))) > 0) {
		snprintf(err, errlen, "certificate %s is not valid yet (check the clock)", cert);
		return -EKEYEXPIRED;
	}
	return 0;
}

static int ctx_build(struct xp_tls *t, SSL_CTX **srv, SSL_CTX **cli, char *err, size_t errlen)
{
	int r = -ENOMEM;

	*srv = SSL_CTX_new(TLS_server_method());
	*cli = SSL_CTX_new(TLS_client_method());
	if (!*srv || !*cli) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	r = ctx_common(*srv, t, t->cert, t->key, err, errlen);
	if (r < 0)
		goto fail;
	r = ctx_common(*cli, t, t->client_cert, t->client_key, err, errlen);
	if (r < 0)
		goto fail;
	SSL_CTX_set_verify(*srv, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verify_cb);
	SSL_CTX_set_verify(*cli, SSL_VERIFY_PEER, verify_cb);
	/* Stateless tickets; a fresh context (a new generation) has a fresh ticket key. */
	SSL_CTX_set_session_id_context(*srv, (const unsigned char *)SESSION_ID_CTX,
				       sizeof(SESSION_ID_CTX) - 1);
	SSL_CTX_set_num_tickets(*srv, 1);
	SSL_CTX_set_session_cache_mode(*cli,
				       SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
	SSL_CTX_sess_set_new_cb(*cli, new_session_cb);
	return 0;

fail:
	SSL_CTX_free(*srv);
	SSL_CTX_free(*cli);
	*srv = *cli = NULL;
	return r;
}

static void describe_cert(struct xp_tls *t)
{
	X509 *x = SSL_CTX_get0_certificate(t->srv);
	char subj[200], serial[80] = "?", when[64];
	BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
	char *hex = bn ? BN_bn2hex(bn) : NULL;

	name_line(x, subj, sizeof(subj));
	if (hex)
		snprintf(serial, sizeof(serial), "%s", hex);
	time_line(X509_get0_notAfter(x), when, sizeof(when));
	snprintf(t->desc, sizeof(t->desc), "certificate \"%.180s\" serial %.64s expires %.40s",
		 subj, serial, when);
	OPENSSL_free(hex);
	BN_free(bn);
}

int xp_tls_reload(struct xp_tls *t, char *err, size_t errlen)
{
	unsigned char digest[32];
	const char *bad = "?";
	SSL_CTX *srv, *cli;
	int r;

	r = file_digest(t, digest, &bad);
	if (r < 0) {
		snprintf(err, errlen, "cannot read %s: %s", bad, strerror(-r));
		return r;
	}
	if (t->generation && memcmp(digest, t->digest, sizeof(digest)) == 0)
		return 1;
	r = ctx_build(t, &srv, &cli, err, errlen);
	if (r < 0)
		return r;
	SSL_CTX_free(t->srv);
	SSL_CTX_free(t->cli);
	t->srv = srv;
	t->cli = cli;
	memcpy(t->digest, digest, sizeof(digest));
	pthread_mutex_lock(&t->cache_lock);
	t->generation++;
	pthread_mutex_unlock(&t->cache_lock);
	cache_clear(t);
	describe_cert(t);
	return 0;
}

int xp_tls_new(const struct xp_tls_conf *conf, struct xp_tls **ret, char *err, size_t errlen)
{
	struct xp_tls *t;
	int r = -ENOMEM;

	pthread_once(&once, init_once);
	if (!conf->cert || !conf->key || !conf->ca) {
		snprintf(err, errlen, "TLS needs --tls-cert, --tls-key and --tls-ca");
		return -EINVAL;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		goto nomem;
	pthread_mutex_init(&t->cache_lock, NULL);
	t->cert = strdup(conf->cert);
	t->key = strdup(conf->key);
	t->client_cert = strdup(conf->client_cert ? conf->client_cert : conf->cert);
	t->client_key = strdup(conf->client_key ? conf->client_key : conf->key);
	t->ca = strdup(conf->ca);
	t->resumption = conf->resumption;
	t->ktls = conf->ktls && xp_tls_kernel_has_ktls();
	if (!t->cert || !t->key || !t->client_cert || !t->client_key || !t->ca)
		goto fail_nomem;
	r = parse_allow(t, conf->allow ? conf->allow : XP_TLS_DEFAULT_ALLOW, err, errlen);
	if (r < 0)
		goto fail;
	r = xp_tls_reload(t, err, errlen);
	if (r < 0)
		goto fail;
	*ret = t;
	return 0;

fail_nomem:
	r = -ENOMEM;
nomem:
	snprintf(err, errlen, "out of memory");
fail:
	xp_tls_free(t);
	return r;
}

void xp_tls_free(struct xp_tls *t)
{
	if (!t)
		return;
	cache_clear(t);
	SSL_CTX_free(t->srv);
	SSL_CTX_free(t->cli);
	for (unsigned int i = 0; i < t->nallow; i++)
		free(t->allow[i]);
	free(t->cert);
	free(t->key);
	free(t->client_cert);
	free(t->client_key);
	free(t->ca);
	pthread_mutex_destroy(&t->cache_lock);
	free(t);
}

unsigned int xp_tls_generation(const struct xp_tls *t)
{
	return t->generation;
}

const char *xp_tls_describe(const struct xp_tls *t)
{
	return t->desc;
}

const char *xp_tls_allow_list(const struct xp_tls *t, unsigned int i)
{
	if (t->allow_any && i == 0)
		return "*";
	i -= t->allow_any;
	return i < t->nallow ? t->allow[i] : NULL;
}

bool xp_tls_ktls_enabled(const struct xp_tls *t)
{
	return t->ktls;
}

unsigned int xp_tls_files(const struct xp_tls *t, const char *out[5])
{
	out[0] = t->cert;
	out[1] = t->key;
	out[2] = t->client_cert;
	out[3] = t->client_key;
	out[4] = t->ca;
	return 5;
}

bool xp_tls_kernel_has_ktls(void)
{
	static int cached = -1;
	int fd;

	if (cached >= 0)
		return cached;
	/* On an unconnected socket the "tls" ULP answers ENOTCONN if it exists, ENOENT if not. */
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	cached = setsockopt(fd, IPPROTO_TCP, TCP_ULP, "tls", 3) == 0 || errno == ENOTCONN;
	close(fd);
	return cached;
}

/* ---- sessions ---- */

int xp_tls_sess_new(struct xp_tls *t, int fd, bool server, const char *peer,
		    struct xp_tls_sess **ret)
{
	struct xp_tls_sess *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->t = t;
	s->fd = fd;
	s->server = server;
	s->generation = t->generation;
	s->ssl = SSL_new(server ? t->srv : t->cli);
	if (!s->ssl || !SSL_set_fd(s->ssl, fd) || !SSL_set_ex_data(s->ssl, sess_idx, s)) {
		ERR_clear_error();
		xp_tls_sess_free(s);
		return -ENOMEM;
	}
	if (server) {
		SSL_set_accept_state(s->ssl);
	} else {
		SSL_set_connect_state(s->ssl);
		if (peer && t->resumption) {
			SSL_SESSION *cached = cache_get(t, peer);

			snprintf(s->peer, sizeof(s->peer), "%s", peer);
			if (cached) {
				SSL_set_session(s->ssl, cached);
				SSL_SESSION_free(cached);
			}
		}
	}
	*ret = s;
	return 0;
}

void xp_tls_sess_free(struct xp_tls_sess *s)
{
	if (!s)
		return;
	if (s->ssl) {
		SSL_set_ex_data(s->ssl, sess_idx, NULL);
		SSL_free(s->ssl);
	}
	free(s->batch);
	free(s->rbatch);
	free(s);
}

/* ---- batched writes ---- */

static int batch_create(BIO *b)
{
	BIO_set_init(b, 1);
	return 1;
}

/* Takes what fits; OpenSSL keeps the rest of a record and retries after xp_tls_flush(). */
static int batch_write(BIO *b, const char *data, size_t len, size_t *written)
{
	struct xp_tls_sess *s = BIO_get_data(b);
	size_t n;

	BIO_clear_retry_flags(b);
	n = s->batch_cap - s->batch_len;
	if (n == 0) {
		BIO_set_retry_write(b);
		return 0;
	}
	if (n > len)
		n = len;
	memcpy(s->batch + s->batch_len, data, n);
	s->batch_len += n;
	*written = n;
	return 1;
}

/*
 * One read(2) takes many records; OpenSSL then asks for exactly one record at a time. (Its own
 * read-ahead moves the unread rest of its buffer to the front at every record, which cost more
 * than the copy this makes.)
 */
static int batch_read(BIO *b, char *data, size_t len, size_t *got)
{
	struct xp_tls_sess *s = BIO_get_data(b);
	size_t n;

	BIO_clear_retry_flags(b);
	if (s->rbatch_off == s->rbatch_len) {
		ssize_t k;

		s->rbatch_off = s->rbatch_len = 0;
		do
			k = read(s->fd, s->rbatch, s->rbatch_cap);
		while (k < 0 && errno == EINTR);
		if (k < 0 && errno == EAGAIN) {
			BIO_set_retry_read(b);
			return 0;
		}
		if (k <= 0)
			return 0; /* end of stream, or the error in errno */
		s->rbatch_len = (size_t)k;
	}
	n = s->rbatch_len - s->rbatch_off;
	if (n > len)
		n = len;
	memcpy(data, s->rbatch + s->rbatch_off, n);
	s->rbatch_off += n;
	*got = n;
	return 1;
}

static long batch_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	struct xp_tls_sess *s = BIO_get_data(b);

	switch (cmd) {
	case BIO_CTRL_FLUSH:
		return 1; /* xp_tls_flush() is the caller's */
	case BIO_CTRL_WPENDING:
		return (long)(s->batch_len - s->batch_off);
	case BIO_CTRL_PENDING:
		return (long)(s->rbatch_len - s->rbatch_off);
	default:
		return 0;
	}
}

int xp_tls_sess_batch(struct xp_tls_sess *s, size_t cap)
{
	bool tx = !xp_tls_ktls_tx(s), rx = !xp_tls_ktls_rx(s);
	BIO *b;

	if (s->batch || s->rbatch || (!tx && !rx))
		return 0;
	if (!batch_method)
		return -ENOMEM;
	b = BIO_new(batch_method);
	s->batch = tx ? malloc(cap) : NULL;
	s->rbatch = rx ? malloc(cap) : NULL;
	if (!b || (tx && !s->batch) || (rx && !s->rbatch)) {
		BIO_free(b);
		free(s->batch);
		free(s->rbatch);
		s->batch = s->rbatch = NULL;
		return -ENOMEM;
	}
	BIO_set_data(b, s);
	s->batch_cap = s->rbatch_cap = cap;
	s->batch_off = s->batch_len = s->rbatch_off = s->rbatch_len = 0;
	/* What OpenSSL read ahead during the handshake stays in its own buffer, read first. */
	if (tx && rx) {
		/* The same new BIO both ways: SSL_set_bio() takes our one reference. */
		SSL_set_bio(s->ssl, b, b);
	} else if (tx) {
		SSL_set0_wbio(s->ssl, b);
	} else {
		SSL_set0_rbio(s->ssl, b);
	}
	if (rx)
		SSL_set_read_ahead(s->ssl, 0);
	return 0;
}

size_t xp_tls_unsent(const struct xp_tls_sess *s)
{
	return s->batch_len - s->batch_off;
}

int xp_tls_flush(struct xp_tls_sess *s, enum xp_tls_want *want)
{
	while (s->batch_off < s->batch_len) {
		ssize_t k = write(s->fd, s->batch + s->batch_off, s->batch_len - s->batch_off);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN) {
			*want = XP_TLS_WANT_WRITE;
			return -EAGAIN;
		}
		if (k < 0) {
			s->io_error = strerror(errno);
			return -errno;
		}
		s->batch_off += (size_t)k;
	}
	s->batch_off = s->batch_len = 0;
	return 0;
}

/* A TLS alert from the peer arrives as SSL library reason SSL_AD_REASON_OFFSET + its code. */
static bool peer_alert(struct xp_tls_sess *s, unsigned long e)
{
	int alert = ERR_GET_REASON(e) - SSL_AD_REASON_OFFSET;

	if (ERR_GET_LIB(e) != ERR_LIB_SSL || alert <= 0 || alert >= 256 ||
	    alert == SSL_AD_CLOSE_NOTIFY)
		return false;
	s->refusal = XP_TLS_PEER_REFUSED;
	snprintf(s->error, sizeof(s->error), "the peer refused us: alert \"%s\"",
		 SSL_alert_desc_string_long(alert));
	return true;
}

/* Maps a failed SSL call; fills want for the retryable cases. */
static int io_fail(struct xp_tls_sess *s, int ret, int saved_errno, enum xp_tls_want *want)
{
	unsigned long e;

	switch (SSL_get_error(s->ssl, ret)) {
	case SSL_ERROR_WANT_READ:
		*want = XP_TLS_WANT_READ;
		return -EAGAIN;
	case SSL_ERROR_WANT_WRITE:
		*want = XP_TLS_WANT_WRITE;
		return -EAGAIN;
	case SSL_ERROR_ZERO_RETURN:
		return 0;
	case SSL_ERROR_SYSCALL:
		ERR_clear_error();
		s->io_error = strerror(saved_errno ? saved_errno : EPIPE);
		return saved_errno ? -saved_errno : -EPIPE;
	default:
		e = ERR_peek_last_error();
		s->io_error = ERR_reason_error_string(e);
		if (!s->io_error)
			s->io_error = "TLS error";
		/* TLS 1.3: a server refuses our certificate after our handshake has finished. */
		if (peer_alert(s, e))
			s->io_error = s->error;
		ERR_clear_error();
		return ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING ? -EPIPE : -EPROTO;
	}
}

static void sess_finish(struct xp_tls_sess *s)
{
	X509 *peer = SSL_get0_peer_certificate(s->ssl);
	char subj[160] = "?";

	if (peer)
		name_line(peer, subj, sizeof(subj));
	snprintf(s->desc, sizeof(s->desc), "tls=%s cipher=%s crypto=%s resumed=%s peer=\"%s\"",
		 SSL_get_version(s->ssl), SSL_get_cipher_name(s->ssl),
		 xp_tls_ktls_tx(s) && xp_tls_ktls_rx(s) ? "ktls"
		 : xp_tls_ktls_tx(s)			? "ktls-tx"
							: "user-space",
		 SSL_session_reused(s->ssl) ? "yes" : "no", subj);
}

int xp_tls_handshake(struct xp_tls_sess *s, enum xp_tls_want *want)
{
	int r, saved;
	X509 *peer;

	ERR_clear_error();
	errno = 0;
	r = SSL_do_handshake(s->ssl);
	saved = errno;
	if (r == 1) {
		/* Also on resumption: the session still names the certificate first checked. */
		peer = SSL_get0_peer_certificate(s->ssl);
		if (!peer) {
			s->refusal = XP_TLS_NO_CERT;
			snprintf(s->error, sizeof(s->error), "the peer sent no certificate");
			return -EPROTO;
		}
		/* A resumed session skipped verification: the dates still hold. */
		if (X509_cmp_current_time(X509_get0_notAfter(peer)) < 0) {
			char subj[200];

			name_line(peer, subj, sizeof(subj));
			s->refusal = XP_TLS_EXPIRED;
			snprintf(s->error, sizeof(s->error),
				 "certificate \"%s\" has expired since this session began", subj);
			return -EPROTO;
		}
		if (!cert_allowed(s->t, peer)) {
			char subj[200];

			name_line(peer, subj, sizeof(subj));
			s->refusal = XP_TLS_NAME;
			snprintf(s->error, sizeof(s->error), "certificate \"%s\" is not allowed",
				 subj);
			return -EPROTO;
		}
		sess_finish(s);
		return 0;
	}
	switch (SSL_get_error(s->ssl, r)) {
	case SSL_ERROR_WANT_READ:
		*want = XP_TLS_WANT_READ;
		return -EAGAIN;
	case SSL_ERROR_WANT_WRITE:
		*want = XP_TLS_WANT_WRITE;
		return -EAGAIN;
	default:
		break;
	}
	if (s->refusal != XP_TLS_OK) {
		/* verify_cb said why. */
		ERR_clear_error();
		return -EPROTO;
	}
	if (SSL_get_verify_result(s->ssl) != X509_V_OK) {
		long v = SSL_get_verify_result(s->ssl);

		s->refusal = verify_refusal(v);
		snprintf(s->error, sizeof(s->error), "%s", X509_verify_cert_error_string(v));
		ERR_clear_error();
		return -EPROTO;
	}
	{
		unsigned long e = ERR_peek_last_error();
		int reason = ERR_GET_REASON(e);
		char line[200];

		if (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
			s->refusal = XP_TLS_NO_CERT;
			snprintf(s->error, sizeof(s->error),
				 "the peer sent no certificate (a client certificate is required)");
			ERR_clear_error();
			return -EPROTO;
		}
		if (e && peer_alert(s, e)) {
			ERR_clear_error();
			return -EPROTO;
		}
		if (!e || reason == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
			s->refusal = XP_TLS_CLOSED;
			snprintf(s->error, sizeof(s->error),
				 "the peer closed the connection during the handshake%s%s",
				 saved ? ": " : "", saved ? strerror(saved) : "");
			ERR_clear_error();
			return saved ? -saved : -ECONNRESET;
		}
		ssl_error_line(line, sizeof(line));
		s->refusal = XP_TLS_PROTOCOL;
		snprintf(s->error, sizeof(s->error), "%s", line);
		return -EPROTO;
	}
}

enum xp_tls_refusal xp_tls_sess_refusal(const struct xp_tls_sess *s)
{
	return s->refusal;
}

const char *xp_tls_sess_error(const struct xp_tls_sess *s)
{
	return s->error[0] ? s->error : "no error";
}

ssize_t xp_tls_read(struct xp_tls_sess *s, void *buf, size_t len, enum xp_tls_want *want)
{
	size_t n;
	int r;

	ERR_clear_error();
	errno = 0;
	r = SSL_read_ex(s->ssl, buf, len, &n);
	if (r == 1)
		return (ssize_t)n;
	return io_fail(s, r, errno, want);
}

ssize_t xp_tls_write(struct xp_tls_sess *s, const void *buf, size_t len, enum xp_tls_want *want)
{
	size_t n;
	int r;

	ERR_clear_error();
	errno = 0;
	r = SSL_write_ex(s->ssl, buf, len, &n);
	if (r == 1)
		return (ssize_t)n;
	r = io_fail(s, r, errno, want);
	return r == 0 ? -EPIPE : r;
}

int xp_tls_shutdown(struct xp_tls_sess *s, enum xp_tls_want *want)
{
	int r;

	ERR_clear_error();
	errno = 0;
	r = SSL_shutdown(s->ssl);
	if (r >= 0)
		return 0; /* 0: ours is sent, theirs not yet seen; 1: both */
	r = io_fail(s, r, errno, want);
	return r == 0 ? 0 : r;
}

bool xp_tls_ktls_tx(const struct xp_tls_sess *s)
{
	return BIO_get_ktls_send(SSL_get_wbio(s->ssl));
}

bool xp_tls_ktls_rx(const struct xp_tls_sess *s)
{
	return BIO_get_ktls_recv(SSL_get_rbio(s->ssl));
}

const char *xp_tls_sess_describe(const struct xp_tls_sess *s)
{
	return s->desc;
}

const char *xp_tls_sess_version(const struct xp_tls_sess *s)
{
	return SSL_get_version(s->ssl);
}

const char *xp_tls_sess_cipher(const struct xp_tls_sess *s)
{
	return SSL_get_cipher_name(s->ssl);
}

bool xp_tls_sess_resumed(const struct xp_tls_sess *s)
{
	return SSL_session_reused(s->ssl);
}

const char *xp_tls_sess_io_error(const struct xp_tls_sess *s)
{
	return s->io_error ? s->io_error : "no error";
}
