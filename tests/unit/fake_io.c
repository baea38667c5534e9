// SPDX-License-Identifier: Apache-2.0
/* The fake transport behind proxy's unit tests (fake_io.h): a scripted loop, clock, listeners,
 * node-hop connections and data path. It records what proxy asked of it, for the tests to check. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_io.h"

/* The loop's opaque types, as this fake keeps them. */
struct xp_watch {
	int fd;
	uint32_t events;
	xp_watch_fn fn;
	void *arg;
};

struct xp_timer {
	uint64_t deadline;
	xp_timer_fn fn;
	void *arg;
};

static void die(const char *what)
{
	fprintf(stderr, "fake_io: %s\n", what);
	abort();
}

static int f_watch_add(void *io, int fd, uint32_t events, xp_watch_fn fn, void *arg,
		       struct xp_watch **ret)
{
	struct fake_io *f = io;

	for (unsigned int i = 0; i < FAKE_MAX; i++) {
		if (f->watches[i])
			continue;
		f->watches[i] = calloc(1, sizeof(struct xp_watch));
		if (!f->watches[i])
			return -ENOMEM;
		*f->watches[i] = (struct xp_watch){ fd, events, fn, arg };
		*ret = f->watches[i];
		return 0;
	}
	die("out of watch slots");
	return -ENOSPC;
}

static int f_watch_mod(void *io, struct xp_watch *w, uint32_t events)
{
	w->events = events;
	return 0;
}

static void f_watch_del(void *io, struct xp_watch *w)
{
	struct fake_io *f = io;

	if (!w)
		return;
	for (unsigned int i = 0; i < FAKE_MAX; i++)
		if (f->watches[i] == w)
			f->watches[i] = NULL;
	free(w);
}

/* Paused: no events until a test resumes it with watch_mod. */
static int f_watch_pause(void *io, struct xp_watch *w, uint64_t ms)
{
	w->events = 0;
	return 0;
}

static int f_timer_add(void *io, uint64_t deadline_ms, xp_timer_fn fn, void *arg,
		       struct xp_timer **ret)
{
	struct fake_io *f = io;

	for (unsigned int i = 0; i < FAKE_MAX; i++) {
		if (f->timers[i])
			continue;
		f->timers[i] = calloc(1, sizeof(struct xp_timer));
		if (!f->timers[i])
			return -ENOMEM;
		*f->timers[i] = (struct xp_timer){ deadline_ms, fn, arg };
		*ret = f->timers[i];
		return 0;
	}
	die("out of timer slots");
	return -ENOSPC;
}

static void f_timer_del(void *io, struct xp_timer *t)
{
	struct fake_io *f = io;

	if (!t)
		return;
	for (unsigned int i = 0; i < FAKE_MAX; i++)
		if (f->timers[i] == t)
			f->timers[i] = NULL;
	free(t);
}

static uint64_t f_now_ms(void *io)
{
	return ((struct fake_io *)io)->now;
}

static int f_start(void *io, xp_link_done_fn done, void *arg)
{
	struct fake_io *f = io;

	f->done = done;
	f->done_arg = arg;
	return 0;
}

static void f_info(void *io, struct xp_io_info *out)
{
	out->threads = 1;
	out->data_path = "fake";
	out->tls_client_problem = NULL;
	out->dpdk_ip = ((struct fake_io *)io)->dpdk_ip;
	out->dpdk_port = ((struct fake_io *)io)->dpdk_port;
}

static int f_hop_health(void *io, struct xp_hop_health *out)
{
	struct fake_io *f = io;

	if (!f->dpdk_ip)
		return -ENOENT;
	*out = f->hop_health;
	return 0;
}

static int f_hop_stats(void *io, struct xp_hop_stats *out)
{
	struct fake_io *f = io;

	if (!f->dpdk_ip)
		return -ENOENT;
	*out = f->hop_stats;
	return 0;
}

/* The first listener is the node hop's (FAKE_TCP_LISTEN, port 40000); KubeVirt-mode ports get
 * fds from FAKE_FIRST_PORT_LISTEN and the port asked for, else ports from 41000; busy_port is
 * taken. */
static int f_listen_tcp(void *io, const struct xp_addr *a, int *ret_fd, struct xp_addr *bound)
{
	struct fake_io *f = io;

	*bound = *a;
	if (!f->listened) {
		f->listened = true;
		if (xp_addr_port(a) == 0)
			xp_addr_from_host("198.18.0.2", 40000, bound);
		*ret_fd = FAKE_TCP_LISTEN;
		return 0;
	}
	if (xp_addr_port(a) && xp_addr_port(a) == f->busy_port)
		return -EADDRINUSE;
	if (!xp_addr_port(a))
		xp_addr_set_port(bound, 41000 + f->nport_listeners);
	*ret_fd = FAKE_FIRST_PORT_LISTEN + (int)f->nport_listeners++;
	return 0;
}

/* The node-hop listener handed over (takeover): only FAKE_TCP_LISTEN is one. */
static int f_listen_adopt(void *io, int fd, struct xp_addr *bound)
{
	struct fake_io *f = io;

	if (fd != FAKE_TCP_LISTEN)
		return -EINVAL;
	f->listened = true;
	return xp_addr_from_host("198.18.0.2", 40000, bound);
}

/* Records the full path: the directory dirfd is (a real one the proxy opened), then name. */
static int f_listen_unix(void *io, int dirfd, const char *name, const struct xp_unix_owner *owner,
			 int *ret_fd)
{
	struct fake_io *f = io;
	struct fake_local *l = &f->listeners[f->nlisteners++];
	char link[64], dir[256];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
	n = readlink(link, dir, sizeof(dir) - 1);
	if (n < 0)
		die("listen_unix: not a directory fd");
	dir[n] = '\0';
	if (snprintf(l->path, sizeof(l->path), "%s/%s", dir, name) >= (int)sizeof(l->path))
		die("listen_unix: path too long");
	l->fd = f->next_fd++;
	l->owner = owner ? *owner : (struct xp_unix_owner){ -1, -1, 0 };
	*ret_fd = l->fd;
	return 0;
}

static struct fake_conn *conn_new(struct fake_io *f)
{
	struct fake_conn *c = calloc(1, sizeof(*c));

	if (!c || f->nconns == FAKE_MAX)
		die("out of connections");
	c->c.fd = FAKE_FIRST_CONN + (int)f->nconns;
	f->conns[f->nconns++] = c;
	return c;
}

static int f_accept(void *io, int lfd, struct xp_conn **ret, char *peer, size_t peerlen)
{
	struct fake_io *f = io;
	struct fake_conn *c;
	unsigned int i;

	for (i = 0; i < f->npending && f->pending[i]->lfd != lfd; i++)
		;
	if (i == f->npending)
		return -EAGAIN;
	c = f->pending[i];
	f->npending--;
	memmove(f->pending + i, f->pending + i + 1, (f->npending - i) * sizeof(f->pending[0]));
	if (c->peer[0])
		snprintf(peer, peerlen, "%s", c->peer);
	else
		snprintf(peer, peerlen, "198.18.0.1:%d", 50000 + c->c.fd);
	*ret = &c->c;
	return 0;
}

static int f_accept_local(void *io, int lfd, int *ret_fd)
{
	struct fake_io *f = io;

	for (unsigned int i = 0; i < f->nlocal_queue; i++) {
		if (f->local_queue_lfd[i] != lfd)
			continue;
		*ret_fd = f->local_queue[i];
		f->nlocal_queue--;
		memmove(f->local_queue + i, f->local_queue + i + 1,
			(f->nlocal_queue - i) * sizeof(int));
		memmove(f->local_queue_lfd + i, f->local_queue_lfd + i + 1,
			(f->nlocal_queue - i) * sizeof(int));
		return 0;
	}
	return -EAGAIN;
}

static int f_connect(void *io, const struct xp_addr *a, const char *peer, struct xp_conn **ret)
{
	struct fake_io *f = io;
	struct fake_conn *c;
	int r = f->connect_err;

	if (r) {
		f->connect_err = 0;
		return r;
	}
	c = conn_new(f);
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	c->connecting = f->connect_later;
	*ret = &c->c;
	return c->connecting ? 1 : 0;
}

static int f_connected(void *io, struct xp_conn *xc)
{
	return ((struct fake_conn *)xc)->connect_err;
}

static int f_connect_local(void *io, const char *path, int owner_uid, unsigned int timeout_ms,
			   int *ret_fd)
{
	struct fake_io *f = io;
	struct fake_local *l = &f->local_connects[f->nlocal_connects++];

	snprintf(l->path, sizeof(l->path), "%s", path);
	if (!strcmp(path, f->refuse_local)) {
		l->fd = -1;
		return -ECONNREFUSED;
	}
	l->fd = f->next_fd++;
	*ret_fd = l->fd;
	return 0;
}

static int f_handshake(void *io, struct xp_conn *xc, unsigned int flags, uint32_t *events)
{
	struct fake_io *f = io;
	struct fake_conn *c = (struct fake_conn *)xc;
	bool server = flags & XP_HS_SERVER;

	c->hs_flags = flags;
	if (!(flags & XP_HS_TLS))
		return 0;
	if (!f->tls)
		return -ENOTSUP;
	if (server != c->accepted)
		die("handshake on the wrong side");
	c->hs_calls++;
	c->hs_waiting = false;
	if (c->hs_again) {
		c->hs_again--;
		c->hs_waiting = true;
		*events = EPOLLIN;
		return -EAGAIN;
	}
	if (c->hs_result < 0)
		return c->hs_result;
	c->tls_done = true;
	return 0;
}

static int f_await_server(void *io, struct xp_conn *xc, uint32_t *events)
{
	struct fake_conn *c = (struct fake_conn *)xc;

	c->await_calls++;
	*events = EPOLLIN;
	if (!c->tls_done || c->await_again == 0)
		return c->await_result;
	c->await_again--;
	c->hs_waiting = true;
	return -EAGAIN;
}

static ssize_t f_read(void *io, struct xp_conn *xc, void *buf, size_t len, uint32_t *events)
{
	struct fake_conn *c = (struct fake_conn *)xc;
	size_t k = c->in_len - c->in_off;

	*events = EPOLLIN;
	if (k) {
		k = k < len ? k : len;
		memcpy(buf, c->in + c->in_off, k);
		c->in_off += k;
		return (ssize_t)k;
	}
	if (c->in_eof)
		return 0;
	return c->in_err ? c->in_err : -EAGAIN;
}

static ssize_t f_write(void *io, struct xp_conn *xc, const void *buf, size_t len, uint32_t *events)
{
	struct fake_conn *c = (struct fake_conn *)xc;
	size_t room = sizeof(c->out) - c->out_len;

	*events = EPOLLOUT;
	if (c->write_room && c->write_room - c->out_len < room)
		room = c->write_room - c->out_len;
	if (!room)
		return -EAGAIN;
	len = len < room ? len : room;
	memcpy(c->out + c->out_len, buf, len);
	c->out_len += len;
	return (ssize_t)len;
}

static void f_why(void *io, const struct xp_conn *xc, int err, struct xp_conn_why *out)
{
	const struct fake_conn *c = (const struct fake_conn *)xc;

	out->token = c->refusal;
	out->closed = c->refusal_closed;
	out->detail = c->detail;
}

static void f_conn_info(void *io, const struct xp_conn *xc, struct xp_conn_info *out)
{
	struct fake_io *f = io;
	const struct fake_conn *c = (const struct fake_conn *)xc;

	memset(out, 0, sizeof(*out));
	if (!f->tls || !c->tls_done) {
		snprintf(out->describe, sizeof(out->describe), "tls=off");
		return;
	}
	out->vmigd = c->alpn || c->alpn2;
	out->digests = c->alpn2;
	snprintf(out->version, sizeof(out->version), "TLSv1.3");
	snprintf(out->cipher, sizeof(out->cipher), "TLS_AES_128_GCM_SHA256");
	snprintf(out->crypto, sizeof(out->crypto), "user-space");
	snprintf(out->describe, sizeof(out->describe),
		 "tls=TLSv1.3 cipher=TLS_AES_128_GCM_SHA256 crypto=user-space resumed=no "
		 "peer=\"fake\"");
	snprintf(out->peer_name, sizeof(out->peer_name), "%s",
		 c->peer_name[0] ? c->peer_name : "/CN=fake");
}

static void f_close(void *io, struct xp_conn *xc)
{
	struct fake_conn *c = (struct fake_conn *)xc;

	if (!c)
		return;
	if (c->closed || c->attached)
		die("a connection closed twice, or closed after it was attached");
	c->closed = true;
}

static void f_close_fd(void *io, int fd, bool reset)
{
	struct fake_io *f = io;

	if (fd < 0)
		return;
	f->closed_reset[f->nclosed_fds] = reset;
	f->closed_fds[f->nclosed_fds++] = fd;
}

static int f_attach(void *io, int local_fd, struct xp_conn *xc, const struct xp_link_opts *o,
		    struct xp_link **ret)
{
	struct fake_io *f = io;
	struct fake_conn *c = (struct fake_conn *)xc;
	struct fake_link *l;

	if (f->attach_err)
		return f->attach_err;
	/* c NULL: a link that starts suspended from o->adopt (a takeover, a DPDK fallback) */
	if (c ? c->closed || c->attached : !o->adopt)
		die("attach of a closed or attached connection, or of none without a state");
	l = &f->links[f->nlinks++];
	l->local_fd = local_fd;
	l->conn = c;
	l->opts = *o;
	if (c)
		c->attached = true;
	*ret = (struct xp_link *)l;
	return 0;
}

static void f_link_abort(void *io, struct xp_link *xl)
{
	((struct fake_link *)xl)->aborted = true;
}

static void f_link_bytes(void *io, const struct xp_link *xl, uint64_t out[2])
{
	const struct fake_link *l = (const struct fake_link *)xl;

	out[0] = l->bytes[0];
	out[1] = l->bytes[1];
}

static uint64_t f_link_shaped_ns(void *io, const struct xp_link *xl)
{
	return ((const struct fake_link *)xl)->shaped_ns;
}

/* The fake data path never agrees to resumable links (its conn_info offers no XP_TLS_ALPN3 and its
 * target JSON no "resume"): these are not reached. */
static void f_link_suspend(void *io, struct xp_link *xl)
{
}

static int f_link_resume(void *io, struct xp_link *xl, struct xp_conn *c, uint64_t have)
{
	return -ENOTSUP;
}

static uint64_t f_link_kept(void *io, const struct xp_link *xl)
{
	return 0;
}

static void f_link_zfig(void *io, const struct xp_link *xl, struct xp_zfig *out)
{
	*out = (struct xp_zfig){ 0 };
}

static void f_link_set_zmode(void *io, struct xp_link *xl, int mode)
{
}

static void f_link_range(void *io, const struct xp_link *xl, uint64_t *acked, uint64_t *sent)
{
	*acked = *sent = 0;
}

static void f_link_set_pacing(void *io, struct xp_link *xl, uint64_t rate)
{
	((struct fake_link *)xl)->pacing = rate;
}

const struct xp_io_ops fake_io_ops = {
	.watch_add = f_watch_add,
	.watch_mod = f_watch_mod,
	.watch_del = f_watch_del,
	.watch_pause = f_watch_pause,
	.timer_add = f_timer_add,
	.timer_del = f_timer_del,
	.now_ms = f_now_ms,
	.start = f_start,
	.info = f_info,
	.hop_stats = f_hop_stats,
	.hop_health = f_hop_health,
	.listen_tcp = f_listen_tcp,
	.listen_unix = f_listen_unix,
	.listen_adopt = f_listen_adopt,
	.accept = f_accept,
	.accept_local = f_accept_local,
	.connect = f_connect,
	.connected = f_connected,
	.connect_local = f_connect_local,
	.handshake = f_handshake,
	.await_server = f_await_server,
	.read = f_read,
	.write = f_write,
	.why = f_why,
	.conn_info = f_conn_info,
	.close = f_close,
	.close_fd = f_close_fd,
	.attach = f_attach,
	.link_abort = f_link_abort,
	.link_bytes = f_link_bytes,
	.link_shaped_ns = f_link_shaped_ns,
	.link_set_pacing = f_link_set_pacing,
	.link_suspend = f_link_suspend,
	.link_resume = f_link_resume,
	.link_kept = f_link_kept,
	.link_zfig = f_link_zfig,
	.link_set_zmode = f_link_set_zmode,
	.link_range = f_link_range,
};

void fake_io_init(struct fake_io *f, bool tls)
{
	memset(f, 0, sizeof(*f));
	f->now = 1000000;
	f->tls = tls;
	f->next_fd = FAKE_FIRST_LOCAL;
	f->hop_health.link_up = true;
}

void fake_io_done(struct fake_io *f)
{
	for (unsigned int i = 0; i < FAKE_MAX; i++) {
		free(f->watches[i]);
		free(f->timers[i]);
	}
	for (unsigned int i = 0; i < f->nconns; i++)
		free(f->conns[i]);
	memset(f, 0, sizeof(*f));
}

struct fake_conn *fake_incoming(struct fake_io *f, const void *data, size_t len)
{
	return fake_incoming_on(f, FAKE_TCP_LISTEN, data, len);
}

struct fake_conn *fake_incoming_on(struct fake_io *f, int lfd, const void *data, size_t len)
{
	struct fake_conn *c = conn_new(f);

	c->accepted = true;
	c->lfd = lfd;
	fake_feed(c, data, len);
	f->pending[f->npending++] = c;
	return c;
}

void fake_feed(struct fake_conn *c, const void *data, size_t len)
{
	if (!data) {
		c->in_eof = true;
		return;
	}
	if (c->in_len + len > sizeof(c->in))
		die("fake_feed: too much");
	memcpy(c->in + c->in_len, data, len);
	c->in_len += len;
}

int fake_qemu_connect(struct fake_io *f, const char *path)
{
	for (unsigned int i = 0; i < f->nlisteners; i++) {
		if (strcmp(f->listeners[i].path, path))
			continue;
		f->local_queue[f->nlocal_queue] = f->next_fd++;
		f->local_queue_lfd[f->nlocal_queue] = f->listeners[i].fd;
		return f->local_queue[f->nlocal_queue++];
	}
	die("fake_qemu_connect: nobody listens there");
	return -1;
}

static struct xp_watch *watch_of(const struct fake_io *f, int fd)
{
	for (unsigned int i = 0; i < FAKE_MAX; i++)
		if (f->watches[i] && f->watches[i]->fd == fd)
			return f->watches[i];
	return NULL;
}

bool fake_watched(const struct fake_io *f, int fd)
{
	return watch_of(f, fd) != NULL;
}

void fake_end_pass(struct fake_io *f)
{
	fake_advance(f, 0);
}

bool fake_fire(struct fake_io *f, int fd)
{
	struct xp_watch *w = watch_of(f, fd);

	if (!w)
		return false;
	/* The callback may delete its own watch. */
	w->fn(w, fd, w->events, w->arg);
	fake_end_pass(f);
	return true;
}

static struct fake_conn *conn_of(const struct fake_io *f, int fd)
{
	for (unsigned int i = 0; i < f->nconns; i++)
		if (f->conns[i]->c.fd == fd)
			return f->conns[i];
	return NULL;
}

/* Would the kernel report what watch w waits for? */
static bool ready(const struct fake_io *f, const struct xp_watch *w)
{
	struct fake_conn *c = conn_of(f, w->fd);

	if (w->fd == FAKE_TCP_LISTEN ||
	    (w->fd >= FAKE_FIRST_PORT_LISTEN && w->fd < FAKE_FIRST_CONN)) {
		for (unsigned int i = 0; i < f->npending; i++)
			if (f->pending[i]->lfd == w->fd)
				return true;
		return false;
	}
	if (!c) {
		for (unsigned int i = 0; i < f->nlocal_queue; i++)
			if (f->local_queue_lfd[i] == w->fd)
				return true;
		return false;
	}
	if (c->closed || c->attached)
		return false;
	if (w->events & EPOLLOUT)
		return !c->connecting && (!c->write_room || c->out_len < c->write_room);
	return c->in_off < c->in_len || c->in_eof || c->in_err || c->hs_waiting;
}

void fake_settle(struct fake_io *f)
{
	for (unsigned int rounds = 0; rounds < 1000; rounds++) {
		bool fired = false;

		for (unsigned int i = 0; i < FAKE_MAX; i++) {
			struct xp_watch *w = f->watches[i];

			if (w && ready(f, w)) {
				w->fn(w, w->fd, w->events, w->arg);
				fired = true;
			}
		}
		fake_end_pass(f);
		if (!fired)
			return;
	}
	die("fake_settle: still busy after 1000 rounds");
}

void fake_settle_some(struct fake_io *f, unsigned int rounds)
{
	for (unsigned int r = 0; r < rounds; r++) {
		bool fired = false;

		for (unsigned int i = 0; i < FAKE_MAX; i++) {
			struct xp_watch *w = f->watches[i];

			if (w && ready(f, w)) {
				w->fn(w, w->fd, w->events, w->arg);
				fired = true;
			}
		}
		fake_end_pass(f);
		if (!fired)
			return;
	}
}

void fake_advance(struct fake_io *f, uint64_t ms)
{
	f->now += ms;
	for (;;) {
		struct xp_timer *t = NULL;
		unsigned int at = 0;
		xp_timer_fn fn;
		void *arg;

		for (unsigned int i = 0; i < FAKE_MAX; i++)
			if (f->timers[i] && f->timers[i]->deadline <= f->now &&
			    (!t || f->timers[i]->deadline < t->deadline)) {
				t = f->timers[i];
				at = i;
			}
		if (!t)
			return;
		/* As the real loop: the timer is freed before its function runs. */
		fn = t->fn;
		arg = t->arg;
		f->timers[at] = NULL;
		free(t);
		fn(arg);
	}
}

void fake_connect_done(struct fake_io *f, struct fake_conn *c, int err)
{
	c->connecting = false;
	c->connect_err = err;
}

void fake_link_end(struct fake_io *f, struct fake_link *l, enum xp_link_end end, int err)
{
	struct xp_link_result res = { .end = end, .err = err, .err_side = 1 };

	if (l->ended)
		die("a link ended twice");
	l->ended = true;
	res.bytes[0] = l->bytes[0];
	res.bytes[1] = l->bytes[1];
	res.shaped_ns = l->shaped_ns;
	res.digested = l->opts.digest;
	for (int d = 0; d < 2; d++) {
		res.digest[d] = l->digest[d];
		res.digest_bytes[d] = l->digest_bytes[d];
		res.digest_partial[d] = l->digest_partial[d];
	}
	f->done(l->opts.cookie, &res, f->done_arg);
	fake_end_pass(f);
}

struct fake_link *fake_link_of(struct fake_io *f, const struct fake_conn *c)
{
	for (unsigned int i = 0; i < f->nlinks; i++)
		if (f->links[i].conn == c)
			return &f->links[i];
	return NULL;
}

unsigned int fake_timers_live(const struct fake_io *f)
{
	unsigned int k = 0;

	for (unsigned int i = 0; i < FAKE_MAX; i++)
		k += f->timers[i] != NULL;
	return k;
}

/* ---- stderr capture ---- */

static int log_fd = -1, saved_stderr = -1;
static char log_text[1 << 16];

void fake_log_begin(void)
{
	fake_log_end();
	log_fd = memfd_create("vmigd-log", 0);
	saved_stderr = dup(STDERR_FILENO);
	if (log_fd < 0 || saved_stderr < 0 || dup2(log_fd, STDERR_FILENO) < 0)
		die("cannot capture stderr");
}

const char *fake_log(void)
{
	ssize_t k;

	if (log_fd < 0)
		return "";
	k = pread(log_fd, log_text, sizeof(log_text) - 1, 0);
	log_text[k > 0 ? k : 0] = '\0';
	return log_text;
}

/* Whatever was captured, test failures included, goes on to the real stderr. */
void fake_log_end(void)
{
	const char *text;

	if (log_fd < 0)
		return;
	text = fake_log();
	dup2(saved_stderr, STDERR_FILENO);
	if (write(STDERR_FILENO, text, strlen(text)) < 0) {
		/* nowhere to say it */
	}
	close(saved_stderr);
	close(log_fd);
	log_fd = saved_stderr = -1;
}
