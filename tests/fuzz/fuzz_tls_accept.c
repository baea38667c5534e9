// SPDX-License-Identifier: Apache-2.0
/* libFuzzer target for the server side of the node hop's TLS handshake (transport/xp_tls.h):
 * each input is what a client sends before it closes its write side. A server session reads it
 * over a non-blocking socketpair and steps the handshake until it ends. It can never succeed (the
 * input cannot prove a client key), so it must end refused, with a reason and a line, and never
 * crash or leak. The certificates are made once, with tests/unit/certfactory.c.
 * VMIG_FUZZ_VERBOSE=1 prints how each input was refused. */
#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "certfactory.h"
#include "fuzz.h"
#include "xp_tls.h"

#define STEPS 100

static struct xp_tls *tls;

static void setup(void)
{
	struct cf_leaf opt = { .cn = "kubevirt.io:system:node:virt-handler", .not_before = -3600 };
	char dir[64], crt[PATH_MAX], key[PATH_MAX], err[256];
	struct xp_tls_conf conf = { 0 };
	struct cf_ca ca;
	int r;

	if (tls)
		return;
	/* The session writes its ServerHello to a socket whose peer never reads: no SIGPIPE as
	 * long as that end is open, but vmigd ignores it too. */
	signal(SIGPIPE, SIG_IGN);
	FUZZ_CHECK(cf_tmpdir(dir, sizeof(dir)) == 0);
	FUZZ_CHECK(cf_ca_make(&ca, dir, "ca", "vmigd fuzz CA") == 0);
	FUZZ_CHECK(cf_leaf_make(&ca, dir, "node", &opt, crt, key) == 0);
	conf.cert = crt;
	conf.key = key;
	conf.ca = ca.path;
	r = xp_tls_new(&conf, &tls, err, sizeof(err));
	if (r < 0)
		fprintf(stderr, "fuzz_tls_accept: xp_tls_new: %s\n", err);
	FUZZ_CHECK(r == 0);
	/* Everything is in memory now. */
	cf_ca_free(&ca);
	cf_rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	setup();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct xp_tls_sess *s = NULL;
	enum xp_tls_want want = XP_TLS_WANT_NONE;
	int fd[2], r = -EAGAIN;
	size_t off = 0;

	/* The replay driver does not call LLVMFuzzerInitialize. */
	setup();
	FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fd) == 0);
	/* A socket buffer takes far more than any input (-max_len). */
	while (off < size) {
		ssize_t k = write(fd[0], data + off, size - off);

		FUZZ_CHECK(k > 0);
		off += (size_t)k;
	}
	FUZZ_CHECK(shutdown(fd[0], SHUT_WR) == 0);
	FUZZ_CHECK(xp_tls_sess_new(tls, fd[1], true, NULL, &s) == 0);
	for (int i = 0; i < STEPS && r == -EAGAIN; i++)
		r = xp_tls_handshake(s, &want);
	/* All input is there and then EOF: the handshake cannot wait for more. */
	FUZZ_CHECK(r != -EAGAIN);
	/* Nobody holds a client key: no input can complete a mutual handshake. */
	FUZZ_CHECK(r < 0);
	FUZZ_CHECK(xp_tls_sess_refusal(s) != XP_TLS_OK);
	FUZZ_CHECK(strcmp(xp_tls_refusal_token(xp_tls_sess_refusal(s)), "?") != 0);
	FUZZ_CHECK(xp_tls_sess_error(s)[0] != '\0');
	FUZZ_CHECK(strcmp(xp_tls_sess_error(s), "no error") != 0);
	if (getenv("VMIG_FUZZ_VERBOSE"))
		fprintf(stderr, "  %d %s: %s\n", r, xp_tls_refusal_token(xp_tls_sess_refusal(s)),
			xp_tls_sess_error(s));
	xp_tls_sess_free(s);
	close(fd[0]);
	close(fd[1]);
	return 0;
}
