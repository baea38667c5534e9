// SPDX-License-Identifier: Apache-2.0
/* Takeover, both sides: the old vmigd's offer (listeners as fds, targets to move, migrations it
 * keeps), commit or roll back, then live migrations moved one line each (ctl_move.h); the new
 * vmigd's ask, finish, adoption and requests passed back for what the old one still carries;
 * SIGUSR2's start of the new one. JSON lines on one control connection. */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctl_json.h"
#include "ctl_metrics.h"
#include "ctl_move.h"
#include "ctl_takeover.h"
#include "cv_watch.h"
#include "log.h"
#include "units.h"
#include "util.h"
#include "vmigd-config.h"
#include "xp_sock.h"

/* The new vmigd has this long from the offer to say it has taken over; else the old carries on. */
#define OFFER_TIMEOUT_MS 30000
/* Before its offer the old one waits this long at most for connections in set-up (handshake and
 * preamble timeouts by default: 10 + 5 s), checking every SETTLE_STEP_MS. */
#define SETTLE_MAX_MS	 16000
#define SETTLE_STEP_MS	 50
#define ASK_TIMEOUT_MS	 (SETTLE_MAX_MS + 10000)
#define SEND_TIMEOUT_MS	 2000
#define LINE_MAX_LEN	 (CTL_REQUEST_MAX + 1)
/* A moved migration's line: 48 connections' digest states in hex take about 120 KiB. */
#define MOVE_LINE_MAX (1024 * 1024)

enum give_state { GIVE_IDLE, GIVE_OFFERED, GIVE_COMMITTED };

/* A takeover connection: to the vmigd this one took over from, or to the one taking over. */
struct tk_link {
	struct ctl_takeover *tk;
	int fd;
	int pid; /* the other vmigd's */
	struct xp_watch *w;
	struct xp_timer *t;
	char *buf;
	size_t len;
};

struct ctl_takeover {
	struct ctl_takeover_parts p;
	struct tk_link up;   /* new side: to the vmigd this one took over from */
	struct tk_link down; /* old side: to the vmigd taking over from this one */
	/* Old side. */
	enum give_state state;
	uint64_t settle_until;	   /* the offer waits for connections in set-up until then */
	struct json_object *moved; /* keys of the targets offered */
	/* live migrations sent to the new vmigd, each until it answers */
	struct px_move **sent;
	unsigned int nsent;
	unsigned int moving; /* migrations quiescing, not sent yet */
	/* New side. */
	bool took_over;
	bool peer_gone;
	struct json_object *kept; /* [{"key","role"}] the old one carries on with */
};

int ctl_takeover_new(const struct ctl_takeover_parts *parts, struct ctl_takeover **ret)
{
	struct ctl_takeover *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	t->p = *parts;
	t->up = (struct tk_link){ .tk = t, .fd = -1 };
	t->down = (struct tk_link){ .tk = t, .fd = -1 };
	*ret = t;
	return 0;
}

static void link_close(struct tk_link *l)
{
	xp_watch_del(l->w);
	l->w = NULL;
	xp_timer_del(l->t);
	l->t = NULL;
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
	free(l->buf);
	l->buf = NULL;
	l->len = 0;
}

void ctl_takeover_free(struct ctl_takeover *t)
{
	if (!t)
		return;
	/* the process ends: what was sent and not answered goes with it */
	for (unsigned int i = 0; i < t->nsent; i++)
		free(t->sent[i]);
	free(t->sent);
	link_close(&t->up);
	link_close(&t->down);
	json_object_put(t->moved);
	json_object_put(t->kept);
	free(t);
}

static void send_line(int fd, struct json_object *o)
{
	const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
	size_t len = strlen(s);
	char *line = malloc(len + 2);

	if (!line)
		return;
	memcpy(line, s, len);
	memcpy(line + len, "\n", 2);
	if (xp_send_fds(fd, line, len + 1, NULL, 0, SEND_TIMEOUT_MS) < 0)
		log_warn("takeover: cannot write to the other vmigd");
	free(line);
}

/*
 * Reads what is there into l->buf and calls fn for each complete line; at the end of the stream
 * (or an error) calls fn with NULL. Returns false once the connection is gone.
 */
static bool read_lines(struct tk_link *l, void (*fn)(struct tk_link *l, char *line))
{
	ssize_t k;
	char *nl;

	if (!l->buf) {
		l->buf = malloc(LINE_MAX_LEN + 1);
		if (!l->buf) {
			fn(l, NULL);
			return false;
		}
	}
	k = read(l->fd, l->buf + l->len, LINE_MAX_LEN - l->len);
	if (k < 0 && (errno == EAGAIN || errno == EINTR))
		return true;
	if (k <= 0) {
		fn(l, NULL);
		return false;
	}
	l->len += k;
	while ((nl = memchr(l->buf, '\n', l->len))) {
		size_t used = nl - l->buf + 1;

		*nl = '\0';
		fn(l, l->buf);
		if (!l->buf)
			return false;
		memmove(l->buf, l->buf + used, l->len - used);
		l->len -= used;
	}
	if (l->len == LINE_MAX_LEN) {
		log_warn("takeover: a line over %d bytes from vmigd pid %d; closing", LINE_MAX_LEN,
			 l->pid);
		fn(l, NULL);
		return false;
	}
	return true;
}

/* ---- the old side ---- */

static void give_rollback(struct ctl_takeover *t, const char *why)
{
	log_warn("takeover by pid %d: %s; carrying on as before (listeners resumed)", t->down.pid,
		 why);
	link_close(&t->down);
	json_object_put(t->moved);
	t->moved = NULL;
	t->state = GIVE_IDLE;
	if (px_node_listen_pause(t->p.node, false) < 0 || t->p.ctl_ops->pause(t->p.ctl, false) < 0)
		log_err("takeover: cannot resume a listener; restart vmigd when it is idle");
}

/* ---- the old side: live migrations moved ---- */

/* The new vmigd's answer to a move (adopted or not), or none (it went away: why). */
static void move_answered(struct ctl_takeover *t, const char *key, const char *role, bool adopted,
			  const char *why)
{
	char to[48];

	snprintf(to, sizeof(to), "vmigd pid %d", t->down.pid);
	for (unsigned int i = 0; i < t->nsent; i++) {
		struct px_move *mv = t->sent[i];

		if (strcmp(mv->key, key) || strcmp(px_role_str(mv->role), role))
			continue;
		t->sent[i] = t->sent[--t->nsent];
		if (!adopted)
			log_warn("takeover: migration %s role=%s: %s did not adopt it: %s", key, role,
				 to, why ? why : "no reason given");
		px_migration_move_end(t->p.node, mv, adopted, to);
		return;
	}
	log_warn("takeover: vmigd pid %d answered for migration %s role=%s, which was not sent",
		 t->down.pid, key, role);
}

static void moves_end(struct ctl_takeover *t, const char *why)
{
	while (t->nsent > 0) {
		struct px_move *mv = t->sent[0];

		move_answered(t, mv->key, px_role_str(mv->role), false, why);
	}
}

/* px_migration_move_begin's answer: mv to send, or NULL (it stays; px said why). */
static void move_ready(void *arg, const char *key, enum px_role role, struct px_move *mv,
		       const char *why)
{
	struct ctl_takeover *t = arg;
	int fds[CTL_MOVE_FDS_MAX];
	unsigned int nfds = 0;
	struct json_object *o;
	struct px_move **grown;
	const char *text;
	char *line = NULL;
	int r = -ENOMEM;

	t->moving--;
	if (!mv)
		return;
	grown = realloc(t->sent, (t->nsent + 1) * sizeof(*grown));
	o = grown ? ctl_move_to_json(mv, fds, &nfds) : NULL;
	if (grown)
		t->sent = grown;
	text = o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN) : NULL;
	if (text)
		line = malloc(strlen(text) + 2);
	if (line && t->down.fd >= 0) {
		sprintf(line, "%s\n", text);
		r = xp_send_fds(t->down.fd, line, strlen(line), fds, nfds, SEND_TIMEOUT_MS);
	} else if (line) {
		r = -ENOTCONN;
	}
	free(line);
	json_object_put(o);
	if (r < 0) {
		log_warn("takeover: migration %s role=%s: cannot send it to vmigd pid %d: %s; it "
			 "carries on here",
			 key, px_role_str(role), t->down.pid, strerror(-r));
		px_migration_move_end(t->p.node, mv, false, "the new vmigd");
		return;
	}
	t->sent[t->nsent++] = mv;
	log_info("takeover: migration %s role=%s sent to vmigd pid %d (%u connections, %u fds)",
		 key, px_role_str(role), t->down.pid, mv->nconns, nfds);
}

static void move_begin(const struct px_migration_info *mi, void *arg)
{
	struct ctl_takeover *t = arg;
	struct cv_report rep;
	char why[200];

	if (t->p.conv && cv_watch_report(t->p.conv, mi->key, &rep)) {
		log_info("takeover: migration %s role=%s stays with this vmigd until it ends: it is "
			 "under convergence control",
			 mi->key, px_role_str(mi->role));
		return;
	}
	if (px_migration_move_begin(t->p.node, mi->key, mi->role, move_ready, t, why,
				    sizeof(why)) < 0) {
		log_info("takeover: migration %s role=%s stays with this vmigd until it ends: %s",
			 mi->key, px_role_str(mi->role), why);
		return;
	}
	t->moving++;
}

static void give_commit(struct ctl_takeover *t)
{
	char to[48];
	size_t n = json_object_array_length(t->moved);

	xp_timer_del(t->down.t);
	t->down.t = NULL;
	t->state = GIVE_COMMITTED;
	snprintf(to, sizeof(to), "vmigd pid %d", t->down.pid);
	for (size_t i = 0; i < n; i++) {
		const char *key = ctl_json_cstring(json_object_array_get_idx(t->moved, i));

		if (px_migration_hand_over(t->p.node, key, PX_ROLE_TARGET, to) < 0)
			log_warn("migration %s role=target: not handed over: it changed meanwhile",
				 key);
	}
	t->p.ctl_ops->release(t->p.ctl);
	t->p.committed(t->p.arg, t->down.pid);
	px_node_foreach(t->p.node, move_begin, t);
	log_info("takeover: vmigd pid %d has the listeners now; live migrations moving to it: %u; "
		 "this one carries the rest until it ends, then exits",
		 t->down.pid, t->moving);
	px_node_retire(t->p.node, t->p.drain_timeout_s, t->p.retired, t->p.arg);
}

/* Before the commit: "taken". After: requests passed on for the migrations kept here. */
static void give_line(struct tk_link *l, char *line)
{
	struct ctl_takeover *t = l->tk;
	struct json_object *o = NULL;
	const char *op;
	char *reply;

	if (!line) {
		if (t->state == GIVE_OFFERED) {
			give_rollback(t, "it went away before it took over");
		} else {
			link_close(l);
			moves_end(t, "it went away before it answered");
		}
		return;
	}
	if (t->state == GIVE_COMMITTED && (o = json_tokener_parse(line)) &&
	    (op = ctl_json_member_cstring(o, "op")) &&
	    (!strcmp(op, "adopted") || !strcmp(op, "refused"))) {
		const char *key = ctl_json_member_cstring(o, "key");
		const char *role = ctl_json_member_cstring(o, "role");

		if (key && role)
			move_answered(t, key, role, !strcmp(op, "adopted"),
				      ctl_json_member_cstring(o, "error"));
		json_object_put(o);
		return;
	}
	json_object_put(o);
	o = NULL;
	if (t->state == GIVE_COMMITTED) {
		reply = t->p.ctl_ops->handle(t->p.ctl, line, strlen(line));
		if (reply) {
			log_info("takeover: a request passed on by vmigd pid %d: %s -> %s", l->pid,
				 line, reply);
			(void)xp_send_fds(l->fd, reply, strlen(reply), NULL, 0, SEND_TIMEOUT_MS);
		}
		free(reply);
		return;
	}
	o = json_tokener_parse(line);
	op = o ? ctl_json_member_cstring(o, "op") : NULL;
	if (op && strcmp(op, "taken") == 0)
		give_commit(t);
	else
		give_rollback(t, "it said something other than \"taken\"");
	json_object_put(o);
}

static void give_read(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	read_lines(arg, give_line);
}

static void give_timeout(void *arg)
{
	struct ctl_takeover *t = arg;

	t->down.t = NULL;
	give_rollback(t, "no word from it within 30 s of the offer");
}

/* What moves (targets with no connection yet, on the shared port) and what stays. */
struct offer_walk {
	struct ctl_takeover *t;
	struct json_object *moved, *moved_keys, *kept;
};

static void offer_migration(const struct px_migration_info *mi, void *arg)
{
	struct offer_walk *ow = arg;
	struct json_object *o = json_object_new_object();

	if (mi->role == PX_ROLE_TARGET && !mi->kubevirt && mi->conns_total == 0 &&
	    mi->conns_active == 0 && mi->conns_failed == 0 && strcmp(mi->state, "active") == 0) {
		uint8_t secret[PX_SECRET_LEN];
		struct json_object *ports = json_object_new_array();

		if (px_target_secret(ow->t->p.node, mi->key, secret) < 0)
			goto keep;
		for (unsigned int i = 0; i < mi->nports; i++) {
			struct json_object *p = json_object_new_object();

			json_object_object_add(p, "id", json_object_new_int64(mi->ports[i].id));
			json_object_object_add(p, "path",
					       json_object_new_string(mi->ports[i].path));
			json_object_array_add(ports, p);
		}
		json_object_object_add(o, "key", json_object_new_string(mi->key));
		json_object_object_add(o, "sockets", ports);
		json_object_object_add(o, "bandwidth", json_object_new_int64((int64_t)mi->cap));
		json_object_object_add(o, "tls", json_object_new_boolean(mi->tls));
		json_object_object_add(o, "secret", ctl_json_new_hex(secret, PX_SECRET_LEN));
		json_object_array_add(ow->moved, o);
		json_object_array_add(ow->moved_keys, json_object_new_string(mi->key));
		return;
	}
keep:
	json_object_object_add(o, "key", json_object_new_string(mi->key));
	json_object_object_add(o, "role", json_object_new_string(px_role_str(mi->role)));
	json_object_object_add(o, "pid", json_object_new_int(getpid()));
	json_object_array_add(ow->kept, o);
}

/* Migrations this vmigd found left with an older one at its own takeover, still carried there:
 * the next one must know them too (a target's connection for one is refused knowingly). */
static void offer_inherited(struct ctl_takeover *t, struct json_object *kept)
{
	for (size_t i = 0; t->kept && !t->peer_gone && i < json_object_array_length(t->kept); i++)
		json_object_array_add(kept, json_object_get(json_object_array_get_idx(t->kept, i)));
}

static void give_offer(struct ctl_takeover *t);

/*
 * A connection the listener accepted before the pause may be a pending target's first: once its
 * preamble binds it there, that target must stay. So the offer waits until none is in set-up
 * (or SETTLE_MAX_MS passed; then such a target may end up in both processes, design.md).
 */
static void give_settle(void *arg)
{
	struct ctl_takeover *t = arg;
	unsigned int k = px_node_unbound_shared(t->p.node);

	t->down.t = NULL;
	if (k > 0 && vm_now_ms() < t->settle_until &&
	    xp_timer_add(t->p.loop, vm_now_ms() + SETTLE_STEP_MS, give_settle, t, &t->down.t) == 0)
		return;
	if (k > 0)
		log_warn("takeover: %u node-hop connections still in set-up after %d ms; offering "
			 "anyway",
			 k, SETTLE_MAX_MS);
	give_offer(t);
}

/*
 * The pid a takeover names becomes systemd's MAINPID=, so it must be the asker's own: the kernel's
 * SO_PEERCRED says who connected. The control socket is 0600, so the uid check matters only where
 * someone loosened it; root or our own euid may take over, nobody else.
 */
static int peer_check(int fd, int pid, char *why, size_t len)
{
	struct ucred cr;
	socklen_t cl = sizeof(cr);
	uid_t euid = geteuid();

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0) {
		int r = -errno;

		snprintf(why, len, "cannot read the asker's credentials (SO_PEERCRED): %s",
			 strerror(-r));
		return r;
	}
	if (cr.pid != pid) {
		snprintf(why, len, "it names pid %d but the connection is pid %d's", pid,
			 (int)cr.pid);
		return -EPERM;
	}
	if (cr.uid != 0 && cr.uid != euid) {
		snprintf(why, len, "pid %d runs as uid %u, neither root nor this vmigd's uid %u",
			 pid, (unsigned int)cr.uid, (unsigned int)euid);
		return -EPERM;
	}
	return 0;
}

void ctl_takeover_give(struct ctl_takeover *t, int fd, int pid)
{
	char why[160], line[256];

	if (peer_check(fd, pid, why, sizeof(why)) < 0) {
		log_warn("takeover by pid %d refused: %s", pid, why);
		snprintf(line, sizeof(line), "{\"ok\":false,\"error\":\"takeover refused: %s\"}\n",
			 why);
		(void)send(fd, line, strlen(line), MSG_NOSIGNAL | MSG_DONTWAIT);
		close(fd);
		return;
	}
	if (t->state != GIVE_IDLE || px_node_listen_fd(t->p.node) < 0) {
		static const char busy[] = "{\"ok\":false,\"error\":\"this vmigd is handing over "
					   "or shutting down already\"}\n";

		log_warn("takeover by pid %d refused: this vmigd is handing over or shutting down "
			 "already",
			 pid);
		(void)send(fd, busy, sizeof(busy) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
		close(fd);
		return;
	}
	t->down.fd = fd;
	t->down.pid = pid;
	t->state = GIVE_OFFERED;
	/* Connections and clients that come from here wait in the listen queues. */
	(void)px_node_listen_pause(t->p.node, true);
	(void)t->p.ctl_ops->pause(t->p.ctl, true);
	t->settle_until = vm_now_ms() + SETTLE_MAX_MS;
	if (px_node_unbound_shared(t->p.node) > 0)
		log_info("takeover: vmigd pid %d asks; waiting for %u node-hop connections in "
			 "set-up "
			 "before the offer",
			 pid, px_node_unbound_shared(t->p.node));
	give_settle(t);
}

static void give_offer(struct ctl_takeover *t)
{
	static const char *const names[] = { "control", "lock", "node", "metrics" };
	struct offer_walk ow = { .t = t };
	struct json_object *o, *fdn;
	int fds[4], nfds = 0, r, fd = t->down.fd, pid = t->down.pid;
	const char *text;
	char *line;

	t->p.ctl_ops->fds(t->p.ctl, &fds[0], &fds[1]);
	fds[2] = px_node_listen_fd(t->p.node);
	fds[3] = t->p.metrics ? ctl_metrics_server_fd(t->p.metrics) : -1;
	fdn = json_object_new_array();
	for (int i = 0; i < 4; i++) {
		if (fds[i] < 0)
			continue;
		fds[nfds++] = fds[i];
		json_object_array_add(fdn, json_object_new_string(names[i]));
	}
	ow.moved = json_object_new_array();
	ow.moved_keys = json_object_new_array();
	ow.kept = json_object_new_array();
	px_node_foreach(t->p.node, offer_migration, &ow);
	offer_inherited(t, ow.kept);
	o = json_object_new_object();
	json_object_object_add(o, "ok", json_object_new_boolean(true));
	json_object_object_add(o, "pid", json_object_new_int(getpid()));
	json_object_object_add(o, "version", json_object_new_string(VMIGD_VERSION));
	json_object_object_add(o, "fds", fdn);
	json_object_object_add(o, "moved", ow.moved);
	json_object_object_add(o, "kept", ow.kept);
	text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
	line = malloc(strlen(text) + 2);
	t->moved = ow.moved_keys;
	if (!line) {
		json_object_put(o);
		give_rollback(t, "out of memory");
		return;
	}
	sprintf(line, "%s\n", text);
	log_info("takeover: vmigd pid %d asks; offering the listeners (%d fds) and %zu targets "
		 "with no connection yet; migrations staying here until they end: %zu",
		 pid, nfds, json_object_array_length(t->moved), json_object_array_length(ow.kept));
	r = xp_send_fds(fd, line, strlen(line), fds, nfds, SEND_TIMEOUT_MS);
	free(line);
	json_object_put(o);
	if (r < 0) {
		char why[96];

		snprintf(why, sizeof(why), "cannot send the offer: %s", strerror(-r));
		give_rollback(t, why);
		return;
	}
	if (xp_watch_add(t->p.loop, fd, EPOLLIN, give_read, &t->down, &t->down.w) < 0 ||
	    xp_timer_add(t->p.loop, vm_now_ms() + OFFER_TIMEOUT_MS, give_timeout, t, &t->down.t) <
		    0)
		give_rollback(t, "out of memory");
}

/* ---- the new side ---- */

void ctl_takeover_offer_done(struct ctl_takeover_offer *o)
{
	int *fds[] = { &o->sock, &o->ctl_fd, &o->lock_fd, &o->node_fd, &o->metrics_fd };

	for (size_t i = 0; i < ARRAY_SIZE(fds); i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
	json_object_put(o->msg);
	o->msg = NULL;
}

/* Gives each fd received its place by the names the offer lists. */
static int offer_fds(struct ctl_takeover_offer *o, const int *fds, unsigned int nfds, char *err,
		     size_t errlen)
{
	struct json_object *names;

	if (!json_object_object_get_ex(o->msg, "fds", &names) ||
	    !json_object_is_type(names, json_type_array) ||
	    json_object_array_length(names) != nfds) {
		snprintf(err, errlen, "the offer names %s fds than came with it",
			 names ? "other" : "no");
		return -EPROTO;
	}
	for (unsigned int i = 0; i < nfds; i++) {
		const char *n = ctl_json_cstring(json_object_array_get_idx(names, i));
		int *slot = !n			    ? NULL
			    : !strcmp(n, "control") ? &o->ctl_fd
			    : !strcmp(n, "lock")    ? &o->lock_fd
			    : !strcmp(n, "node")    ? &o->node_fd
			    : !strcmp(n, "metrics") ? &o->metrics_fd
						    : NULL;

		if (!slot || *slot >= 0) {
			snprintf(err, errlen, "the offer names an fd \"%s\" twice or unknown",
				 n ? n : "?");
			return -EPROTO;
		}
		*slot = fds[i];
	}
	if (o->ctl_fd < 0 || o->lock_fd < 0 || o->node_fd < 0) {
		snprintf(err, errlen,
			 "the offer lacks the control socket, its lock or the listener");
		return -EPROTO;
	}
	return 0;
}

int ctl_takeover_ask(const char *control, struct ctl_takeover_offer *o, char *err, size_t errlen)
{
	int fds[XP_FDS_MAX];
	unsigned int nfds = XP_FDS_MAX;
	char ask[128], *line;
	const char *msg;
	ssize_t k;
	int r;

	*o = (struct ctl_takeover_offer){ -1, 0, -1, -1, -1, -1, NULL };
	r = xp_unix_connect(control, SEND_TIMEOUT_MS, &o->sock);
	if (r < 0) {
		snprintf(err, errlen, "cannot reach a vmigd on %s: %s (nothing to take over?)",
			 control, strerror(-r));
		return r;
	}
	snprintf(ask, sizeof(ask), "{\"op\":\"takeover\",\"pid\":%d,\"version\":\"%s\"}\n",
		 (int)getpid(), VMIGD_VERSION);
	r = xp_send_fds(o->sock, ask, strlen(ask), NULL, 0, SEND_TIMEOUT_MS);
	if (r < 0) {
		snprintf(err, errlen, "cannot ask the vmigd on %s: %s", control, strerror(-r));
		goto fail;
	}
	line = malloc(LINE_MAX_LEN + 1);
	if (!line) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	k = xp_recv_line_fds(o->sock, line, LINE_MAX_LEN + 1, fds, &nfds, ASK_TIMEOUT_MS);
	if (k < 0) {
		r = (int)k;
		snprintf(err, errlen, "no offer from the vmigd on %s: %s", control,
			 k == -ECONNRESET ? "it closed the connection" : strerror(-r));
		free(line);
		goto fail;
	}
	o->msg = json_tokener_parse(line);
	free(line);
	if (!o->msg || !json_object_is_type(o->msg, json_type_object)) {
		r = -EPROTO;
		snprintf(err, errlen, "the vmigd on %s answered something other than JSON",
			 control);
		goto fail_fds;
	}
	msg = ctl_json_member_cstring(o->msg, "error");
	if (msg) {
		r = -EPERM;
		snprintf(err, errlen, "the vmigd on %s refused: %s", control, msg);
		goto fail_fds;
	}
	o->pid = json_object_get_int(json_object_object_get(o->msg, "pid"));
	r = offer_fds(o, fds, nfds, err, errlen);
	if (r < 0)
		goto fail_fds;
	return 0;

fail_fds:
	for (unsigned int i = 0; i < nfds; i++)
		close(fds[i]);
	o->ctl_fd = o->lock_fd = o->node_fd = o->metrics_fd = -1;
fail:
	ctl_takeover_offer_done(o);
	return r;
}

static void take_line(struct tk_link *l, char *line)
{
	struct ctl_takeover *t = l->tk;

	if (line) {
		log_info("takeover: the previous vmigd (pid %d) answered: %s", l->pid, line);
		return;
	}
	log_info("takeover: the previous vmigd (pid %d) has ended what it carried and exited; the "
		 "takeover is complete",
		 l->pid);
	t->peer_gone = true;
	(void)px_node_set_elsewhere(t->p.node, NULL, 0, NULL);
	link_close(l);
}

/* Recomputes which targets are elsewhere from the kept list (after a move took one). */
static void kept_drop(struct ctl_takeover *t, const char *key, enum px_role role)
{
	const char *keys[64];
	unsigned int nkeys = 0;
	char who[64];

	for (size_t i = 0; t->kept && i < json_object_array_length(t->kept); i++) {
		struct json_object *k = json_object_array_get_idx(t->kept, i);
		const char *kk = ctl_json_member_cstring(k, "key");
		const char *kr = ctl_json_member_cstring(k, "role");

		if (kk && kr && !strcmp(kk, key) && !strcmp(kr, px_role_str(role))) {
			json_object_array_del_idx(t->kept, i, 1);
			break;
		}
	}
	for (size_t i = 0; t->kept && i < json_object_array_length(t->kept); i++) {
		struct json_object *k = json_object_array_get_idx(t->kept, i);
		const char *kk = ctl_json_member_cstring(k, "key");
		const char *kr = ctl_json_member_cstring(k, "role");

		if (kk && kr && !strcmp(kr, "target") && nkeys < ARRAY_SIZE(keys))
			keys[nkeys++] = kk;
	}
	snprintf(who, sizeof(who), "an older vmigd (pid %d, or the one before it)", t->up.pid);
	if (px_node_set_elsewhere(t->p.node, keys, nkeys, who) < 0)
		log_warn("takeover: out of memory noting the migrations left with vmigd pid %d",
			 t->up.pid);
}

/* Whether fd is one mv still holds (not taken by the adoption). */
static bool move_holds(const struct px_move *mv, int fd)
{
	if (mv->dirfd == fd)
		return true;
	for (unsigned int i = 0; i < mv->nports; i++)
		if (mv->ports[i].lfd == fd)
			return true;
	for (unsigned int i = 0; i < mv->nconns; i++)
		if (mv->conns[i].fd == fd)
			return true;
	return false;
}

/* A live migration the old vmigd sends: adopted here, or refused (it carries it on). */
static void take_move(struct ctl_takeover *t, struct json_object *o, int *fds, unsigned int nfds)
{
	struct px_move *mv = malloc(sizeof(*mv));
	struct json_object *a = json_object_new_object();
	char err[256] = "out of memory", from[48];
	bool named[XP_FDS_MAX] = { false };
	int r = -ENOMEM;

	snprintf(from, sizeof(from), "vmigd pid %d", t->up.pid);
	if (mv)
		r = ctl_move_from_json(o, fds, nfds, mv, err, sizeof(err));
	for (unsigned int i = 0; r == 0 && i < nfds; i++)
		named[i] = move_holds(mv, fds[i]);
	if (r == 0)
		r = px_migration_adopt(t->p.node, mv, from, err, sizeof(err));
	/* what the adoption did not take (all, when the line was refused), and what the line
	 * named not at all, closes here; what links took, they close */
	for (unsigned int i = 0; i < nfds; i++)
		if (!named[i] || move_holds(mv, fds[i]))
			close(fds[i]);
	json_object_object_add(a, "op", json_object_new_string(r == 0 ? "adopted" : "refused"));
	json_object_object_add(a, "key", json_object_new_string(mv ? mv->key : ""));
	json_object_object_add(a, "role", json_object_new_string(mv ? px_role_str(mv->role) : ""));
	if (r < 0)
		json_object_object_add(a, "error", json_object_new_string(err));
	send_line(t->up.fd, a);
	json_object_put(a);
	if (r == 0)
		kept_drop(t, mv->key, mv->role);
	else
		log_warn("takeover: a live migration (%s) stays with vmigd pid %d: %s",
			 mv && mv->key[0] ? mv->key : "?", t->up.pid, err);
	free(mv);
}

static void take_read(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct tk_link *l = arg;
	struct ctl_takeover *t = l->tk;
	char *line = malloc(MOVE_LINE_MAX + 1);
	int fds[XP_FDS_MAX];

	/* line by line, each with the fds on its first byte (a move's), while there are lines */
	do {
		unsigned int nfds = XP_FDS_MAX;
		struct json_object *o;
		ssize_t k;
		const char *op;

		if (!line) {
			take_line(l, NULL);
			return;
		}
		k = xp_recv_line_fds(fd, line, MOVE_LINE_MAX + 1, fds, &nfds, SEND_TIMEOUT_MS);
		if (k < 0) {
			free(line);
			take_line(l, NULL);
			return;
		}
		line[k - 1] = '\0';
		o = json_tokener_parse(line);
		op = o ? ctl_json_member_cstring(o, "op") : NULL;
		if (op && !strcmp(op, "move")) {
			take_move(t, o, fds, nfds);
		} else {
			for (unsigned int i = 0; i < nfds; i++)
				close(fds[i]);
			take_line(l, line);
		}
		json_object_put(o);
	} while (recv(fd, line, 1, MSG_PEEK | MSG_DONTWAIT) > 0);
	free(line);
}

/* One moved target, as the old vmigd described it. */
static int start_moved(struct ctl_takeover *t, struct json_object *m, char *err, size_t errlen)
{
	struct ctl_takeover_target tg;
	struct px_portmap out;
	char why[256];
	int r;

	r = ctl_takeover_parse_target(m, &tg, err, errlen);
	if (r < 0)
		return r;
	if (px_target_start(t->p.node, tg.key, tg.nports, tg.ports, &tg.opts, &out, why,
			    sizeof(why)) < 0) {
		snprintf(err, errlen, "cannot carry on target %s here: %s", tg.key, why);
		return -EINVAL;
	}
	return 0;
}

int ctl_takeover_finish(struct ctl_takeover *t, struct ctl_takeover_offer *o, char *err,
			size_t errlen)
{
	struct json_object *moved = json_object_object_get(o->msg, "moved");
	struct json_object *kept = json_object_object_get(o->msg, "kept");
	const char *keys[64];
	unsigned int nkeys = 0;
	size_t nmoved = moved ? json_object_array_length(moved) : 0;
	char who[64];
	int r;

	t->up.pid = o->pid;
	for (size_t i = 0; i < nmoved; i++) {
		r = start_moved(t, json_object_array_get_idx(moved, i), err, errlen);
		if (r < 0)
			return r;
	}
	t->kept = json_object_get(kept);
	for (size_t i = 0; kept && i < json_object_array_length(kept); i++) {
		struct json_object *k = json_object_array_get_idx(kept, i);
		const char *role = ctl_json_member_cstring(k, "role");
		const char *key = ctl_json_member_cstring(k, "key");

		if (key && role && !strcmp(role, "target") && nkeys < ARRAY_SIZE(keys))
			keys[nkeys++] = key;
	}
	snprintf(who, sizeof(who), "an older vmigd (pid %d, or the one before it)", o->pid);
	r = px_node_set_elsewhere(t->p.node, keys, nkeys, who);
	if (r < 0) {
		snprintf(err, errlen, "out of memory");
		return r;
	}
	r = xp_send_fds(o->sock, "{\"op\":\"taken\"}\n", 15, NULL, 0, SEND_TIMEOUT_MS);
	if (r < 0) {
		snprintf(err, errlen, "cannot tell the previous vmigd: %s", strerror(-r));
		return r;
	}
	/* From here the old one has let go: the files are this process's. */
	t->p.ctl_ops->own(t->p.ctl);
	t->up.fd = o->sock;
	o->sock = -1;
	t->took_over = true;
	if (xp_watch_add(t->p.loop, t->up.fd, EPOLLIN, take_read, &t->up, &t->up.w) < 0)
		log_warn("takeover: cannot watch the previous vmigd; its answers go unlogged");
	log_info("takeover: took over from vmigd pid %d: targets moved here: %zu; migrations "
		 "staying with it until they end: %zu",
		 o->pid, nmoved, kept ? json_object_array_length(kept) : (size_t)0);
	return 0;
}

/* The entry of a migration left with an older vmigd at a takeover, or NULL. */
static struct json_object *kept_entry(const struct ctl_takeover *t, const char *key)
{
	for (size_t i = 0; t->kept && i < json_object_array_length(t->kept); i++) {
		struct json_object *e = json_object_array_get_idx(t->kept, i);
		const char *k = ctl_json_member_cstring(e, "key");

		if (k && !strcmp(k, key))
			return e;
	}
	return NULL;
}

int ctl_takeover_forward(struct ctl_takeover *t, const struct ctl_request *req,
			 struct json_object **reply, char *err, size_t errlen)
{
	struct json_object *o, *e = t->took_over ? kept_entry(t, req->key) : NULL;
	int pid = e ? json_object_get_int(json_object_object_get(e, "pid")) : 0;
	char note[200];

	if (!e)
		return -ENOENT;
	if (pid != t->up.pid || t->peer_gone || t->up.fd < 0) {
		/* Ended there, or left with a vmigd before the one this took over from: it ends
		 * when its connections do, which is all a stop would ask for. */
		if (req->op == CTL_BANDWIDTH) {
			snprintf(err, errlen,
				 "migration %s stayed with vmigd pid %d at a takeover, which %s; "
				 "its "
				 "cap cannot change from here",
				 req->key, pid,
				 pid == t->up.pid && t->peer_gone ? "has ended it and exited"
								  : "this one cannot reach");
			return -ENOENT;
		}
		snprintf(note, sizeof(note),
			 "stayed with vmigd pid %d at a takeover, which ends it when its "
			 "connections end%s",
			 pid, pid == t->up.pid && t->peer_gone ? " (it has, and exited)" : "");
		goto ok;
	}
	o = json_object_new_object();
	json_object_object_add(o, "op", json_object_new_string(ctl_op_name(req->op)));
	json_object_object_add(o, "key", json_object_new_string(req->key));
	if (req->op == CTL_BANDWIDTH)
		json_object_object_add(o, "bandwidth",
				       json_object_new_int64((int64_t)req->bandwidth));
	send_line(t->up.fd, o);
	json_object_put(o);
	log_info("takeover: %s %s passed on to the previous vmigd (pid %d), which carries it",
		 ctl_op_name(req->op), req->key, t->up.pid);
	snprintf(note, sizeof(note),
		 "carried by the previous vmigd (pid %d) since a takeover: passed on to it",
		 t->up.pid);
ok:
	*reply = json_object_new_object();
	json_object_object_add(*reply, "ok", json_object_new_boolean(true));
	json_object_object_add(*reply, "note", json_object_new_string(note));
	return 0;
}

void ctl_takeover_status(struct ctl_takeover *t, struct json_object *status)
{
	struct json_object *o;

	if (!t->took_over)
		return;
	o = json_object_new_object();
	json_object_object_add(o, "from_pid", json_object_new_int(t->up.pid));
	json_object_object_add(o, "previous",
			       json_object_new_string(t->peer_gone ? "exited" : "carrying on"));
	json_object_object_add(o, "kept",
			       t->kept ? json_object_get(t->kept) : json_object_new_array());
	json_object_object_add(status, "takeover", o);
}
