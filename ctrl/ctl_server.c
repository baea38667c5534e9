// SPDX-License-Identifier: Apache-2.0
/* Control socket server. PATH.lock is held with flock(2) for the daemon's life, so a second
 * daemon on the same path refuses to start while a stale socket left by a crash is replaced.
 * One request per connection. Its reply is queued and sent as the client reads it, so the control
 * thread (which also runs node-hop handshakes) never waits on a client: one that sends no
 * complete request within CLIENT_TIMEOUT_MS, or reads nothing of its reply for CLIENT_STALL_MS,
 * is dropped. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctl_server.h"
#include "ctl_takeover.h"
#include "log.h"
#include "util.h"
#include "xp_sock.h"

#define CLIENT_TIMEOUT_MS 5000
#define CLIENT_STALL_MS	  5000
/*
 * Clients served at once; one more is told so and closed. Each holds a request (at most
 * CTL_REQUEST_MAX) or then its reply (at most CLIENT_REPLY_MAX: status and list of 2,000
 * migrations of 8 ports; a larger one is refused), so the control socket costs at most ~256 MiB
 * whatever connects, ~4 MiB while no client waits on a reply.
 */
#define CLIENTS_MAX	 64
#define CLIENT_BUF_FIRST 4096
#define CLIENT_REPLY_MAX (4u << 20)
#define ACCEPT_PAUSE_MS	 250

struct ctl_server {
	struct xp_loop *loop;
	struct px_node *node;
	const struct ctl_daemon_info *info;
	char path[108];
	char lock_path[128];
	int lock_fd;
	int fd;
	struct xp_watch *w;
	struct ctl_client *clients;
	unsigned int nclients;
	bool released; /* handed over: the socket and the lock are another vmigd's now */
	bool borrowed; /* adopted, until the old vmigd lets go: its files are not ours yet */
	struct vm_log_limit refusals;
};

struct ctl_client {
	struct ctl_server *s;
	int fd;
	struct xp_watch *w;
	struct xp_timer *t;
	size_t len, cap;
	char *buf; /* grows from CLIENT_BUF_FIRST to CTL_REQUEST_MAX + 1 */
	/* The reply, once the request is served: ours, sent from out_off on as the socket takes
	 * it. While it is set, the client's watch is for EPOLLOUT only: nothing more is read. */
	char *out;
	size_t out_len, out_off;
	uint64_t progress_ms; /* when out was queued or last took bytes */
	struct ctl_client *prev, *next;
};

static void client_free(struct ctl_client *c)
{
	xp_watch_del(c->w);
	xp_timer_del(c->t);
	if (c->fd >= 0)
		close(c->fd);
	if (c->prev)
		c->prev->next = c->next;
	else
		c->s->clients = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->s->nclients--;
	free(c->buf);
	free(c->out);
	free(c);
}

/* A one-line refusal of a few dozen bytes: an empty socket buffer takes it, or it is lost. */
static void client_say(struct ctl_client *c, const char *line)
{
	(void)send(c->fd, line, strlen(line), MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* What the socket takes of the queued reply now: 1 when all is sent, 0 when some is left. */
static int client_send(struct ctl_client *c)
{
	while (c->out_off < c->out_len) {
		ssize_t k = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (k < 0)
			return -errno;
		if (k == 0)
			return -EPIPE;
		c->out_off += k;
		c->progress_ms = vm_now_ms();
	}
	return 1;
}

static void client_stalled(void *arg);

static int client_arm_stall(struct ctl_client *c)
{
	return xp_timer_add(c->s->loop, c->progress_ms + CLIENT_STALL_MS, client_stalled, c, &c->t);
}

static void client_stalled(void *arg)
{
	struct ctl_client *c = arg;
	uint64_t now = vm_now_ms();

	c->t = NULL;
	if (now - c->progress_ms < CLIENT_STALL_MS && client_arm_stall(c) == 0)
		return;
	vm_log_limited(&c->s->refusals, now, VM_LOG_WARN,
		       "control: a client read no more of its reply for %d ms (%zu of %zu bytes "
		       "sent); dropped",
		       CLIENT_STALL_MS, c->out_off, c->out_len);
	client_free(c);
}

/* Takes reply (malloc'd, or NULL for out of memory) and sends it, now or as the client reads. */
static void client_reply(struct ctl_client *c, char *reply)
{
	size_t len;

	if (!reply) {
		client_say(c, "{\"ok\":false,\"error\":\"out of memory\"}\n");
		client_free(c);
		return;
	}
	len = strlen(reply);
	if (len > CLIENT_REPLY_MAX) {
		vm_log_limited(&c->s->refusals, vm_now_ms(), VM_LOG_WARN,
			       "control: a reply of %zu bytes not sent (at most %u)", len,
			       CLIENT_REPLY_MAX);
		client_say(c, "{\"ok\":false,\"error\":\"reply too large (over 4 MiB)\"}\n");
		free(reply);
		client_free(c);
		return;
	}
	free(c->buf);
	c->buf = NULL;
	c->len = c->cap = 0;
	c->out = reply;
	c->out_len = len;
	c->progress_ms = vm_now_ms();
	if (client_send(c) != 0) {
		client_free(c);
		return;
	}
	xp_timer_del(c->t);
	c->t = NULL;
	if (xp_watch_mod(c->w, EPOLLOUT) < 0 || client_arm_stall(c) < 0)
		client_free(c);
}

static void client_write(struct ctl_client *c)
{
	if (client_send(c) != 0)
		client_free(c);
}

static void client_serve(struct ctl_client *c)
{
	const struct ctl_daemon_info *info = c->s->info;
	struct ctl_request *req = malloc(sizeof(*req));
	char *reply = NULL, err[512];
	int r;

	if (!req)
		goto reply;
	r = ctl_request_parse(c->buf, c->len, req, err, sizeof(err));
	if (r < 0) {
		reply = ctl_error_reply(err, r);
	} else if (ctl_op_takes_conn(req->op) && info->takeover) {
		/* The connection becomes the takeover's: it passes fds and stays open. */
		int fd = c->fd;

		c->fd = -1;
		client_free(c);
		ctl_takeover_give(info->takeover, fd, req->pid);
		free(req);
		return;
	} else {
		reply = ctl_execute(c->s->node, info, req);
	}
	free(req);
reply:
	client_reply(c, reply);
}

/* Reads the request until it is served, then sends its reply. */
static void client_io(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct ctl_client *c = arg;
	ssize_t k;

	if (c->out) {
		client_write(c);
		return;
	}
	if (c->len == c->cap && c->cap < CTL_REQUEST_MAX + 1) {
		size_t cap = c->cap * 4 > CTL_REQUEST_MAX + 1 ? CTL_REQUEST_MAX + 1 : c->cap * 4;
		char *b = realloc(c->buf, cap);

		if (!b) {
			client_free(c);
			return;
		}
		c->buf = b;
		c->cap = cap;
	}
	k = read(fd, c->buf + c->len, c->cap - c->len);
	if (k < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (k < 0) {
		client_free(c);
		return;
	}
	if (k == 0) {
		/* End of stream: a request without its newline is still served if complete. */
		if (c->len == 0) {
			client_free(c);
			return;
		}
		client_serve(c);
		return;
	}
	c->len += k;
	if (c->len > CTL_REQUEST_MAX) {
		vm_log_limited(&c->s->refusals, vm_now_ms(), VM_LOG_WARN,
			       "control: request over %d bytes refused", CTL_REQUEST_MAX);
		client_say(c, "{\"ok\":false,\"error\":\"request too large (over 64 KiB)\"}\n");
		client_free(c);
		return;
	}
	if (memchr(c->buf + c->len - k, '\n', k))
		client_serve(c);
}

static void client_timeout(void *arg)
{
	struct ctl_client *c = arg;

	c->t = NULL;
	vm_log_limited(&c->s->refusals, vm_now_ms(), VM_LOG_WARN,
		       "control: client sent no complete request within %d ms; dropped",
		       CLIENT_TIMEOUT_MS);
	client_say(c, "{\"ok\":false,\"error\":\"incomplete request (timeout)\"}\n");
	client_free(c);
}

static void server_accept(struct xp_watch *w, int lfd, uint32_t events, void *arg)
{
	struct ctl_server *s = arg;
	int fd, r;

	while ((r = xp_accept(lfd, &fd)) == 0) {
		struct ctl_client *c;

		if (s->nclients >= CLIENTS_MAX) {
			static const char busy[] = "{\"ok\":false,\"error\":\"too many control "
						   "clients at once; try again\"}\n";

			vm_log_limited(&s->refusals, vm_now_ms(), VM_LOG_WARN,
				       "control: a client refused: %u clients are connected "
				       "(at most %u at once)",
				       s->nclients, CLIENTS_MAX);
			(void)send(fd, busy, sizeof(busy) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
			close(fd);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (c)
			c->buf = malloc(CLIENT_BUF_FIRST);
		if (!c || !c->buf) {
			free(c);
			close(fd);
			continue;
		}
		c->s = s;
		c->fd = fd;
		c->cap = CLIENT_BUF_FIRST;
		c->next = s->clients;
		if (s->clients)
			s->clients->prev = c;
		s->clients = c;
		s->nclients++;
		if (xp_watch_add(s->loop, fd, EPOLLIN, client_io, c, &c->w) < 0 ||
		    xp_timer_add(s->loop, vm_now_ms() + CLIENT_TIMEOUT_MS, client_timeout, c,
				 &c->t) < 0)
			client_free(c);
	}
	/* Out of fds, the listener stays readable: rest instead of spinning. */
	if (xp_accept_starved(r)) {
		vm_log_limited(&s->refusals, vm_now_ms(), VM_LOG_ERR,
			       "control: cannot accept a client: %s; not accepting for %u ms",
			       strerror(-r), ACCEPT_PAUSE_MS);
		(void)xp_watch_pause(w, ACCEPT_PAUSE_MS);
	}
}

static void write_pid(struct ctl_server *s)
{
	char pid[32];
	int n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());

	if (ftruncate(s->lock_fd, 0) < 0 || pwrite(s->lock_fd, pid, n, 0) != n)
		log_debug("cannot record the pid in %s", s->lock_path);
}

/*
 * The lock file is truncated and given our pid, as root: never through a link (O_NOFOLLOW; a
 * second name, st_nlink > 1, is a hard link) and never anything but a regular file (O_NONBLOCK:
 * a FIFO or a device is not waited on). Those refusals are logged here, naming the lock file,
 * since the caller only knows the socket's path.
 */
static int take_lock(struct ctl_server *s, int *holder)
{
	struct stat st;
	char pid[32];
	int n, r;

	s->lock_fd = open(s->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK,
			  0600);
	if (s->lock_fd < 0) {
		r = -errno;
		if (r == -ELOOP)
			log_err("control: lock file %s is a symbolic link; not following it",
				s->lock_path);
		return r;
	}
	if (fstat(s->lock_fd, &st) < 0) {
		r = -errno;
		goto fail;
	}
	if (!S_ISREG(st.st_mode) || st.st_nlink != 1) {
		log_err("control: lock file %s is %s; remove it", s->lock_path,
			!S_ISREG(st.st_mode) ? "not a regular file" : "a hard link");
		r = -EINVAL;
		goto fail;
	}
	if (flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		r = errno == EWOULDBLOCK ? -EADDRINUSE : -errno;
		n = pread(s->lock_fd, pid, sizeof(pid) - 1, 0);
		*holder = n > 0 ? (pid[n] = '\0', atoi(pid)) : 0;
		goto fail;
	}
	write_pid(s);
	return 0;

fail:
	close(s->lock_fd);
	s->lock_fd = -1;
	return r;
}

/* A server with no socket or lock yet, on path (which fits a unix socket address). */
static struct ctl_server *server_alloc(struct xp_loop *loop, const char *path, struct px_node *n,
				       const struct ctl_daemon_info *info)
{
	struct ctl_server *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->loop = loop;
	s->node = n;
	s->info = info;
	s->fd = -1;
	s->lock_fd = -1;
	s->refusals.what = "lines about refused control clients";
	snprintf(s->path, sizeof(s->path), "%s", path);
	snprintf(s->lock_path, sizeof(s->lock_path), "%s.lock", path);
	return s;
}

int ctl_server_new(struct xp_loop *loop, const char *path, struct px_node *n,
		   const struct ctl_daemon_info *info, int *holder, struct ctl_server **ret)
{
	struct ctl_server *s;
	int r;

	*holder = 0;
	if (xp_unix_path_ok(path) < 0)
		return -ENAMETOOLONG;
	s = server_alloc(loop, path, n, info);
	if (!s)
		return -ENOMEM;
	r = take_lock(s, holder);
	if (r < 0)
		goto fail;
	/* Whoever may connect may start and stop migrations: the daemon's user only, from the
	 * moment it listens. */
	r = xp_unix_listen(path, 16, &(struct xp_unix_owner){ .uid = -1, .gid = -1, .mode = 0600 },
			   &s->fd);
	if (r < 0)
		goto fail;
	r = xp_watch_add(loop, s->fd, EPOLLIN, server_accept, s, &s->w);
	if (r < 0)
		goto fail;
	*ret = s;
	return 0;

fail:
	if (s->fd >= 0) {
		close(s->fd);
		unlink(s->path);
	}
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	free(s);
	return r;
}

int ctl_server_adopt(struct xp_loop *loop, const char *path, int fd, int lock_fd, struct px_node *n,
		     const struct ctl_daemon_info *info, struct ctl_server **ret)
{
	struct ctl_server *s;
	int r;

	s = server_alloc(loop, path, n, info);
	if (!s)
		return -ENOMEM;
	/* The lock is the open file's, which both processes share now: it stays taken. */
	s->fd = fd;
	s->lock_fd = lock_fd;
	s->borrowed = true;
	r = xp_watch_add(loop, s->fd, EPOLLIN, server_accept, s, &s->w);
	if (r < 0) {
		free(s);
		return r;
	}
	*ret = s;
	return 0;
}

void ctl_server_fds(const struct ctl_server *s, int *fd, int *lock_fd)
{
	*fd = s->released ? -1 : s->fd;
	*lock_fd = s->released ? -1 : s->lock_fd;
}

int ctl_server_pause(struct ctl_server *s, bool pause)
{
	if (s->released)
		return -EBADF;
	if (pause) {
		xp_watch_del(s->w);
		s->w = NULL;
		return 0;
	}
	if (s->w)
		return 0;
	return xp_watch_add(s->loop, s->fd, EPOLLIN, server_accept, s, &s->w);
}

void ctl_server_own(struct ctl_server *s)
{
	s->borrowed = false;
	write_pid(s);
}

void ctl_server_release(struct ctl_server *s)
{
	if (s->released)
		return;
	xp_watch_del(s->w);
	s->w = NULL;
	close(s->fd);
	close(s->lock_fd);
	s->fd = s->lock_fd = -1;
	s->released = true;
}

void ctl_server_free(struct ctl_server *s)
{
	if (!s)
		return;
	while (s->clients)
		client_free(s->clients);
	if (!s->released) {
		xp_watch_del(s->w);
		close(s->fd);
		if (!s->borrowed) {
			unlink(s->path);
			unlink(s->lock_path);
		}
		close(s->lock_fd);
	}
	free(s);
}

char *ctl_server_handle(struct ctl_server *s, const char *text, size_t len)
{
	return ctl_handle(s->node, s->info, text, len);
}

const struct ctl_takeover_server_ops ctl_server_takeover_ops = {
	.pause = ctl_server_pause,
	.fds = ctl_server_fds,
	.release = ctl_server_release,
	.own = ctl_server_own,
	.handle = ctl_server_handle,
};
