// SPDX-License-Identifier: Apache-2.0
// vmig-tls-handshake: what one node-hop TLS handshake costs, through the real xp_tls API (the
// code vmigd runs). N handshakes over fresh socket pairs, the client and the server session
// driven non-blocking by one thread, once without resumption and once with it. Run by
// bench/vmig-bench handshake; see bench/README.md. Not a test of correctness.

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <openssl/evp.h>
#include <openssl/opensslv.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "xp_tls.h"

#define HS_PEER "bench-peer" /* the client's resumption cache key: one peer throughout */
#define HS_POLL_MS 5000	     /* a handshake step that waits this long is stuck */

struct hs_opts {
	const char *cert, *key, *ca, *allow;
	unsigned int n, warmup;
	bool tcp, ktls, json, full, resume;
};

struct hs_result {
	const char *mode;
	unsigned int n, resumed;
	double *hs_us, *conn_us, *cli_cpu_us, *srv_cpu_us; /* per handshake */
	double cpu_user_s, cpu_sys_s, wall_s;		     /* over the whole measured loop */
	char version[32], cipher[64], describe[256];
	bool ktls_tx, ktls_rx;
};

struct hs_pair {
	int cfd, sfd;
};

static int hs_listen_fd = -1; /* TCP: one listening socket on 127.0.0.1 for every connection */
static struct sockaddr_in hs_listen_addr;

static double hs_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double hs_thread_cpu(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double hs_tv(struct timeval tv)
{
	return tv.tv_sec + tv.tv_usec / 1e6;
}

static void hs_usage(FILE *f)
{
	fprintf(f,
		"usage: vmig-tls-handshake --cert PEM --key PEM --ca PEM [--n N] [--warmup W]\n"
		"                          [--mode full|resume|both] [--transport unix|tcp]\n"
		"                          [--allow NAMES] [--ktls] [--json]\n"
		"N handshakes (default 500, after W = 5 unmeasured ones) between a client and a\n"
		"server xp_tls session in this one thread, each over a fresh socketpair (unix) or\n"
		"loopback TCP connection. Both sides present the same certificate, as two nodes of\n"
		"one cluster would present theirs. full: the client offers no ticket; resume: the\n"
		"client caches the ticket of the previous connection to the same peer and offers it.\n"
		"Prints the median and p90 handshake wall time, the CPU time per handshake (this\n"
		"process, both sides together), and the fraction of handshakes that resumed.\n");
}

static int hs_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The q-quantile (nearest rank) of v[0..n), which it sorts. */
static double hs_quantile(double *v, unsigned int n, double q)
{
	unsigned int k;

	if (!n)
		return NAN;
	qsort(v, n, sizeof(*v), hs_cmp);
	k = (unsigned int)ceil(q * n);
	return v[k ? k - 1 : 0];
}

static int hs_listen(void)
{
	socklen_t len = sizeof(hs_listen_addr);
	int one = 1;

	hs_listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (hs_listen_fd < 0)
		return -errno;
	setsockopt(hs_listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&hs_listen_addr, 0, sizeof(hs_listen_addr));
	hs_listen_addr.sin_family = AF_INET;
	hs_listen_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(hs_listen_fd, (struct sockaddr *)&hs_listen_addr, sizeof(hs_listen_addr)) < 0 ||
	    listen(hs_listen_fd, 16) < 0 ||
	    getsockname(hs_listen_fd, (struct sockaddr *)&hs_listen_addr, &len) < 0)
		return -errno;
	return 0;
}

/* A connected, non-blocking pair: the client's end and the server's. */
static int hs_connect(const struct hs_opts *o, struct hs_pair *p)
{
	int fds[2], one = 1;

	if (!o->tcp) {
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) < 0)
			return -errno;
		p->cfd = fds[0];
		p->sfd = fds[1];
		return 0;
	}
	p->cfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (p->cfd < 0)
		return -errno;
	if (connect(p->cfd, (struct sockaddr *)&hs_listen_addr, sizeof(hs_listen_addr)) < 0 &&
	    errno != EINPROGRESS) {
		int e = errno;

		close(p->cfd);
		return -e;
	}
	/* On loopback the kernel completes the TCP handshake at once: accept does not wait. */
	p->sfd = accept4(hs_listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (p->sfd < 0) {
		int e = errno;

		close(p->cfd);
		return -e;
	}
	/* As vmigd's node hop does: no Nagle delay on the handshake's small flights. */
	setsockopt(p->cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(p->sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return 0;
}

static short hs_events(enum xp_tls_want w)
{
	return w == XP_TLS_WANT_WRITE ? POLLOUT : POLLIN;
}

/* Waits until fd is ready for w (one side only). */
static int hs_wait(int fd, enum xp_tls_want w)
{
	struct pollfd p = { .fd = fd, .events = hs_events(w) };
	int r = poll(&p, 1, HS_POLL_MS);

	if (r < 0)
		return -errno;
	return r ? 0 : -ETIMEDOUT;
}

static void hs_fail(const char *what, struct xp_tls_sess *s, int r)
{
	fprintf(stderr, "vmig-tls-handshake: %s: %s (%s: %s)\n", what, strerror(-r),
		s ? xp_tls_refusal_token(xp_tls_sess_refusal(s)) : "-",
		s ? xp_tls_sess_error(s) : "-");
}

/*
 * Both handshakes, one step each in turn, polling only when neither can progress. The CPU time
 * of each side's calls (thread CPU clock) is added to cli_cpu / srv_cpu.
 */
static int hs_handshake(struct xp_tls_sess *c, struct xp_tls_sess *s, int cfd, int sfd,
			double *cli_cpu, double *srv_cpu)
{
	enum xp_tls_want cw = XP_TLS_WANT_NONE, sw = XP_TLS_WANT_NONE;
	bool cdone = false, sdone = false;

	for (;;) {
		struct pollfd p[2];
		nfds_t np = 0;
		double t;
		int r;

		if (!cdone) {
			t = hs_thread_cpu();
			r = xp_tls_handshake(c, &cw);
			*cli_cpu += hs_thread_cpu() - t;
			if (r == 0)
				cdone = true;
			else if (r != -EAGAIN) {
				hs_fail("client handshake", c, r);
				return r;
			}
		}
		if (!sdone) {
			t = hs_thread_cpu();
			r = xp_tls_handshake(s, &sw);
			*srv_cpu += hs_thread_cpu() - t;
			if (r == 0)
				sdone = true;
			else if (r != -EAGAIN) {
				hs_fail("server handshake", s, r);
				return r;
			}
		}
		if (cdone && sdone)
			return 0;
		if (!cdone)
			p[np++] = (struct pollfd){ .fd = cfd, .events = hs_events(cw) };
		if (!sdone)
			p[np++] = (struct pollfd){ .fd = sfd, .events = hs_events(sw) };
		r = poll(p, np, HS_POLL_MS);
		if (r < 0)
			return -errno;
		if (r == 0) {
			fprintf(stderr, "vmig-tls-handshake: handshake stuck for %d ms (client %s, "
					"server %s)\n",
				HS_POLL_MS, cdone ? "done" : cw == XP_TLS_WANT_READ ? "reads" : "writes",
				sdone ? "done" : sw == XP_TLS_WANT_READ ? "reads" : "writes");
			return -ETIMEDOUT;
		}
	}
}

/*
 * After the handshake, one byte from the server to the client: the client's read takes in the
 * TLS 1.3 session ticket the server sent at the end of its handshake (that is where xp_tls
 * caches it for the next connection), as a relayed connection's first read would. Then
 * close_notify from both sides.
 */
static int hs_exchange(struct xp_tls_sess *c, struct xp_tls_sess *s, int cfd, int sfd)
{
	enum xp_tls_want w = XP_TLS_WANT_NONE;
	unsigned char b = 0x5a, got = 0;
	ssize_t n;
	int r;

	while ((n = xp_tls_write(s, &b, 1, &w)) == -EAGAIN)
		if ((r = hs_wait(sfd, w)) < 0)
			return r;
	if (n != 1) {
		r = n < 0 ? (int)n : -EIO;
		hs_fail("server write", s, r);
		return r;
	}
	while ((n = xp_tls_read(c, &got, 1, &w)) == -EAGAIN)
		if ((r = hs_wait(cfd, w)) < 0)
			return r;
	if (n != 1 || got != b) {
		r = n < 0 ? (int)n : -EIO;
		hs_fail("client read", c, r);
		return r;
	}
	while ((r = xp_tls_shutdown(c, &w)) == -EAGAIN)
		if ((r = hs_wait(cfd, w)) < 0)
			return r;
	while ((r = xp_tls_shutdown(s, &w)) == -EAGAIN)
		if ((r = hs_wait(sfd, w)) < 0)
			return r;
	return 0;
}

static int hs_ctx(const struct hs_opts *o, bool resumption, struct xp_tls **t)
{
	struct xp_tls_conf conf = {
		.cert = o->cert,
		.key = o->key,
		.ca = o->ca,
		.allow = o->allow,
		.resumption = resumption,
		.ktls = o->ktls,
	};
	char err[320] = "";
	int r = xp_tls_new(&conf, t, err, sizeof(err));

	if (r < 0)
		fprintf(stderr, "vmig-tls-handshake: %s\n", err);
	return r;
}

/*
 * One mode: a server context and a client context (two nodes), warm-up handshakes, then N
 * measured ones. Each connection is set up, handshaken, given its one byte, shut down, freed.
 */
static int hs_run(const struct hs_opts *o, bool resumption, struct hs_result *res)
{
	struct xp_tls *ts = NULL, *tc = NULL;
	struct rusage ru0 = { 0 }, ru1;
	double w0 = 0;
	int r;

	memset(res, 0, sizeof(*res));
	res->mode = resumption ? "resume" : "full";
	res->n = o->n;
	res->hs_us = calloc(o->n, sizeof(double));
	res->conn_us = calloc(o->n, sizeof(double));
	res->cli_cpu_us = calloc(o->n, sizeof(double));
	res->srv_cpu_us = calloc(o->n, sizeof(double));
	if (!res->hs_us || !res->conn_us || !res->cli_cpu_us || !res->srv_cpu_us)
		return -ENOMEM;
	r = hs_ctx(o, false, &ts);
	if (r == 0)
		r = hs_ctx(o, resumption, &tc);
	for (unsigned int i = 0; r == 0 && i < o->warmup + o->n; i++) {
		struct xp_tls_sess *c = NULL, *s = NULL;
		struct hs_pair p = { -1, -1 };
		double cli_cpu = 0, srv_cpu = 0, t0, t1, t2, tc0;
		unsigned int k = i - o->warmup; /* valid when i >= warmup */

		if (i == o->warmup) {
			getrusage(RUSAGE_SELF, &ru0);
			w0 = hs_now();
		}
		t0 = hs_now();
		r = hs_connect(o, &p);
		if (r < 0) {
			fprintf(stderr, "vmig-tls-handshake: connect: %s\n", strerror(-r));
			break;
		}
		t1 = hs_now();
		tc0 = hs_thread_cpu();
		r = xp_tls_sess_new(ts, p.sfd, true, NULL, &s);
		srv_cpu += hs_thread_cpu() - tc0;
		if (r == 0) {
			tc0 = hs_thread_cpu();
			r = xp_tls_sess_new(tc, p.cfd, false, HS_PEER, &c);
			cli_cpu += hs_thread_cpu() - tc0;
		}
		if (r < 0)
			fprintf(stderr, "vmig-tls-handshake: session: %s\n", strerror(-r));
		else
			r = hs_handshake(c, s, p.cfd, p.sfd, &cli_cpu, &srv_cpu);
		t2 = hs_now();
		if (r == 0 && i >= o->warmup) {
			res->hs_us[k] = (t2 - t1) * 1e6;
			res->cli_cpu_us[k] = cli_cpu * 1e6;
			res->srv_cpu_us[k] = srv_cpu * 1e6;
			if (xp_tls_sess_resumed(c))
				res->resumed++;
			if (i + 1 == o->warmup + o->n) {
				snprintf(res->version, sizeof(res->version), "%s",
					 xp_tls_sess_version(c));
				snprintf(res->cipher, sizeof(res->cipher), "%s",
					 xp_tls_sess_cipher(c));
				snprintf(res->describe, sizeof(res->describe), "%s",
					 xp_tls_sess_describe(c));
				res->ktls_tx = xp_tls_ktls_tx(c);
				res->ktls_rx = xp_tls_ktls_rx(c);
			}
		}
		if (r == 0)
			r = hs_exchange(c, s, p.cfd, p.sfd);
		xp_tls_sess_free(c);
		xp_tls_sess_free(s);
		close(p.cfd);
		close(p.sfd);
		if (r == 0 && i >= o->warmup)
			res->conn_us[k] = (hs_now() - t0) * 1e6;
	}
	if (r == 0) {
		res->wall_s = hs_now() - w0;
		getrusage(RUSAGE_SELF, &ru1);
		res->cpu_user_s = hs_tv(ru1.ru_utime) - hs_tv(ru0.ru_utime);
		res->cpu_sys_s = hs_tv(ru1.ru_stime) - hs_tv(ru0.ru_stime);
	}
	xp_tls_free(tc);
	xp_tls_free(ts);
	return r;
}

/* "EC 256 bit" / "RSA 2048 bit", and the signature algorithm, of the certificate file. */
static void hs_cert_kind(const char *path, char *kind, size_t len)
{
	FILE *f = fopen(path, "re");
	X509 *x = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
	EVP_PKEY *k = x ? X509_get0_pubkey(x) : NULL;

	if (k)
		snprintf(kind, len, "%s %d bit, signed with %s", EVP_PKEY_get0_type_name(k),
			 EVP_PKEY_get_bits(k), OBJ_nid2ln(X509_get_signature_nid(x)));
	else
		snprintf(kind, len, "?");
	X509_free(x);
	if (f)
		fclose(f);
}

static void hs_json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", *s);
		else
			putchar(*s);
	}
	putchar('"');
}

struct hs_summary {
	double hs_median, hs_p90, conn_median, conn_p90, cli_cpu_median, srv_cpu_median;
	double cpu_per_hs_us;
};

static void hs_summarize(struct hs_result *r, struct hs_summary *m)
{
	m->hs_median = hs_quantile(r->hs_us, r->n, 0.5);
	m->hs_p90 = hs_quantile(r->hs_us, r->n, 0.9);
	m->conn_median = hs_quantile(r->conn_us, r->n, 0.5);
	m->conn_p90 = hs_quantile(r->conn_us, r->n, 0.9);
	m->cli_cpu_median = hs_quantile(r->cli_cpu_us, r->n, 0.5);
	m->srv_cpu_median = hs_quantile(r->srv_cpu_us, r->n, 0.5);
	m->cpu_per_hs_us = (r->cpu_user_s + r->cpu_sys_s) / r->n * 1e6;
}

static void hs_print_json(const struct hs_opts *o, const char *kind, struct hs_result *res,
			  unsigned int nres)
{
	printf("{\"tool\":\"vmig-tls-handshake\",\"cert\":");
	hs_json_str(o->cert);
	printf(",\"cert_key\":");
	hs_json_str(kind);
	printf(",\"openssl\":");
	hs_json_str(OPENSSL_VERSION_TEXT);
	printf(",\"transport\":\"%s\",\"n\":%u,\"warmup\":%u,\"ktls_asked\":%s,\"modes\":{",
	       o->tcp ? "tcp" : "unix", o->n, o->warmup, o->ktls ? "true" : "false");
	for (unsigned int i = 0; i < nres; i++) {
		struct hs_result *r = &res[i];
		struct hs_summary m;

		hs_summarize(r, &m);
		printf("%s\"%s\":{\"handshake_us_median\":%.1f,\"handshake_us_p90\":%.1f,"
		       "\"connection_us_median\":%.1f,\"connection_us_p90\":%.1f,"
		       "\"cpu_us_per_handshake\":%.1f,\"cpu_user_s\":%.4f,\"cpu_sys_s\":%.4f,"
		       "\"client_cpu_us_median\":%.1f,\"server_cpu_us_median\":%.1f,"
		       "\"loop_wall_s\":%.4f,\"handshakes_per_s\":%.1f,\"resumed\":%u,"
		       "\"resumed_fraction\":%.4f,\"version\":",
		       i ? "," : "", r->mode, m.hs_median, m.hs_p90, m.conn_median, m.conn_p90,
		       m.cpu_per_hs_us, r->cpu_user_s, r->cpu_sys_s, m.cli_cpu_median,
		       m.srv_cpu_median, r->wall_s, r->n / r->wall_s, r->resumed,
		       (double)r->resumed / r->n);
		hs_json_str(r->version);
		printf(",\"cipher\":");
		hs_json_str(r->cipher);
		printf(",\"session\":");
		hs_json_str(r->describe);
		printf(",\"ktls_tx\":%s,\"ktls_rx\":%s}", r->ktls_tx ? "true" : "false",
		       r->ktls_rx ? "true" : "false");
	}
	printf("}}\n");
}

static void hs_print_text(const struct hs_opts *o, const char *kind, struct hs_result *res,
			  unsigned int nres)
{
	printf("%u handshakes per mode over %s, certificate %s (%s)\n", o->n,
	       o->tcp ? "loopback TCP" : "a unix socketpair", o->cert, kind);
	printf("%-7s %11s %11s %13s %11s %11s %12s %8s\n", "mode", "median us", "p90 us",
	       "CPU us/hs", "client us", "server us", "conn med us", "resumed");
	for (unsigned int i = 0; i < nres; i++) {
		struct hs_summary m;

		hs_summarize(&res[i], &m);
		printf("%-7s %11.1f %11.1f %13.1f %11.1f %11.1f %12.1f %7.1f%%\n", res[i].mode,
		       m.hs_median, m.hs_p90, m.cpu_per_hs_us, m.cli_cpu_median, m.srv_cpu_median,
		       m.conn_median, 100.0 * res[i].resumed / res[i].n);
		printf("        %s\n", res[i].describe);
	}
	printf("median/p90: wall time of one handshake (both sessions created and driven to done);\n"
	       "CPU us/hs: getrusage user+sys of this process over the loop / N (client and server\n"
	       "together, socket set-up, the 1-byte exchange, close_notify and close included);\n"
	       "client/server us: median thread CPU time inside each side's session and handshake\n"
	       "calls; conn med: wall time of a whole connection.\n");
}

int main(int argc, char **argv)
{
	struct hs_opts o = { .n = 500, .warmup = 5, .full = true, .resume = true };
	struct hs_result res[2];
	unsigned int nres = 0;
	char kind[160];
	int r = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			hs_usage(stdout);
			return 0;
		} else if (!strcmp(a, "--ktls")) {
			o.ktls = true;
		} else if (!strcmp(a, "--json")) {
			o.json = true;
		} else if (!v) {
			hs_usage(stderr);
			return 2;
		} else if (!strcmp(a, "--cert")) {
			o.cert = argv[++i];
		} else if (!strcmp(a, "--key")) {
			o.key = argv[++i];
		} else if (!strcmp(a, "--ca")) {
			o.ca = argv[++i];
		} else if (!strcmp(a, "--allow")) {
			o.allow = argv[++i];
		} else if (!strcmp(a, "--n")) {
			o.n = (unsigned int)strtoul(argv[++i], NULL, 10);
		} else if (!strcmp(a, "--warmup")) {
			o.warmup = (unsigned int)strtoul(argv[++i], NULL, 10);
		} else if (!strcmp(a, "--mode")) {
			v = argv[++i];
			o.full = !strcmp(v, "full") || !strcmp(v, "both");
			o.resume = !strcmp(v, "resume") || !strcmp(v, "both");
			if (!o.full && !o.resume) {
				hs_usage(stderr);
				return 2;
			}
		} else if (!strcmp(a, "--transport")) {
			v = argv[++i];
			if (strcmp(v, "unix") && strcmp(v, "tcp")) {
				hs_usage(stderr);
				return 2;
			}
			o.tcp = !strcmp(v, "tcp");
		} else {
			hs_usage(stderr);
			return 2;
		}
	}
	if (!o.cert || !o.key || !o.ca || o.n == 0) {
		hs_usage(stderr);
		return 2;
	}
	if (o.tcp && (r = hs_listen()) < 0) {
		fprintf(stderr, "vmig-tls-handshake: listen on 127.0.0.1: %s\n", strerror(-r));
		return 1;
	}
	hs_cert_kind(o.cert, kind, sizeof(kind));
	if (o.full && (r = hs_run(&o, false, &res[nres++])) < 0)
		return 1;
	if (o.resume && (r = hs_run(&o, true, &res[nres++])) < 0)
		return 1;
	if (o.json)
		hs_print_json(&o, kind, res, nres);
	else
		hs_print_text(&o, kind, res, nres);
	for (unsigned int i = 0; i < nres; i++) {
		free(res[i].hs_us);
		free(res[i].conn_us);
		free(res[i].cli_cpu_us);
		free(res[i].srv_cpu_us);
	}
	if (hs_listen_fd >= 0)
		close(hs_listen_fd);
	return 0;
}
