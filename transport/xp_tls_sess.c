// SPDX-License-Identifier: Apache-2.0
/* TLS sessions on the node hop: handshake on the control thread, then read, write, flush and
 * shutdown on a data-path worker through a BIO that batches records into one read(2)/write(2).
 * Not the contexts, certificates, allow-list or resumption cache: xp_tls.c. */
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xp_tls.h"
#include "xp_tls_priv.h"

int xp_tls_sess_idx = -1;
static BIO_METHOD *batch_method;
pthread_once_t xp_tls_once = PTHREAD_ONCE_INIT;

static int batch_write(BIO *b, const char *data, size_t len, size_t *written);
static int batch_read(BIO *b, char *data, size_t len, size_t *got);
static long batch_ctrl(BIO *b, int cmd, long num, void *ptr);
static int batch_create(BIO *b);

/* Once per process, from xp_tls_new(): what every session needs before its SSL is made. */
void xp_tls_init_once(void)
{
	xp_tls_sess_idx = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
	batch_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "vmigd batch");
	if (batch_method) {
		BIO_meth_set_write_ex(batch_method, batch_write);
		BIO_meth_set_read_ex(batch_method, batch_read);
		BIO_meth_set_ctrl(batch_method, batch_ctrl);
		BIO_meth_set_create(batch_method, batch_create);
	}
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
	if (!s->ssl || !SSL_set_fd(s->ssl, fd) || !SSL_set_ex_data(s->ssl, xp_tls_sess_idx, s)) {
		ERR_clear_error();
		xp_tls_sess_free(s);
		return -ENOMEM;
	}
	if (server) {
		SSL_set_accept_state(s->ssl);
	} else {
		SSL_set_connect_state(s->ssl);
		if (peer && t->resumption) {
			SSL_SESSION *cached = xp_tls_cache_get(t, peer);

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
		SSL_set_ex_data(s->ssl, xp_tls_sess_idx, NULL);
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
	snprintf(s->peer_name, sizeof(s->peer_name), "%s", subj);
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
		if (!xp_tls_cert_allowed(s->t, s->server, peer)) {
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

		s->refusal = xp_tls_verify_refusal(v);
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
		xp_tls_ssl_error_line(line, sizeof(line));
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

int xp_tls_await_server(struct xp_tls_sess *s, enum xp_tls_want *want)
{
	char c;
	size_t n;
	int r;

	if (s->server || s->ticket || SSL_version(s->ssl) < TLS1_3_VERSION)
		return 0;
	ERR_clear_error();
	errno = 0;
	/* A peek runs the record layer (a ticket, an alert) and leaves data where it is. */
	r = SSL_peek_ex(s->ssl, &c, 1, &n);
	if (r == 1 || s->ticket)
		return 0;
	r = io_fail(s, r, errno, want);
	if (r == -EAGAIN && s->ticket)
		return 0;
	if (r == 0) {
		/* close_notify before anything: the server hung up on us. */
		s->refusal = XP_TLS_PEER_REFUSED;
		snprintf(s->error, sizeof(s->error),
			 "the server closed the connection right after the handshake");
		return -ECONNRESET;
	}
	if (r < 0 && r != -EAGAIN && s->refusal == XP_TLS_OK) {
		s->refusal = XP_TLS_CLOSED;
		snprintf(s->error, sizeof(s->error),
			 "the server ended the connection right after the handshake: %s",
			 s->io_error ? s->io_error : strerror(-r));
	}
	return r;
}

unsigned int xp_tls_sess_alpn(const struct xp_tls_sess *s)
{
	const unsigned char *p;
	unsigned int len;

	SSL_get0_alpn_selected(s->ssl, &p, &len);
	if (len == sizeof(XP_TLS_ALPN3) - 1 && memcmp(p, XP_TLS_ALPN3, len) == 0)
		return 3;
	if (len == sizeof(XP_TLS_ALPN2) - 1 && memcmp(p, XP_TLS_ALPN2, len) == 0)
		return 2;
	return len == sizeof(XP_TLS_ALPN) - 1 && memcmp(p, XP_TLS_ALPN, len) == 0;
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

const char *xp_tls_sess_peer_name(const struct xp_tls_sess *s)
{
	return s->peer_name;
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
