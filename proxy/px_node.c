// SPDX-License-Identifier: Apache-2.0
/* The node: its node-hop listener, its transport (the real one, or one a test hands in), its
 * meters' tick, its drain and its accessors. Migrations and roles are in the other px_*.c files
 * (doc/design.md, "Where to read"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "log.h"
#include "px_private.h"

unsigned int px_node_active_conns(const struct px_node *n)
{
	unsigned int k = n->nunbound;

	for (struct px_migration *m = px_next_any(n, NULL); m; m = px_next_any(n, m))
		k += m->conns_active;
	return k;
}

/* A migration that has not had its first connection yet, and may still get one. */
static bool waiting_first(const struct px_migration *m)
{
	return !m->failed && !m->stopping && m->conns_total == 0 && m->conns_active == 0 &&
	       m->conns_failed == 0;
}

static void check_drained(struct px_node *n)
{
	void (*done)(void *arg) = n->drain_done;

	/* A connection still before its preamble carries nothing: a stranger's must not hold a
	 * drain up (a report that has not got that far yet is lost, and logged so). */
	if (!(n->draining || n->retiring) || !done ||
	    px_node_active_conns(n) - (n->draining ? n->nunbound : 0) > 0)
		return;
	vm_list_each (struct px_migration, m, &n->migrations, node)
		if (n->retiring && waiting_first(m))
			return;
	/* A target's ended connections wait (VERIFY_WAIT_MS at most) for their sources' reports. */
	for (struct px_migration *m = px_next_any(n, NULL); m; m = px_next_any(n, m))
		if (px_verify_busy(m))
			return;
	n->drain_done = NULL;
	/* A drain kept the node-hop listener for those reports; a retirement closed it. */
	IO(n, watch_del, n->lw);
	n->lw = NULL;
	IO(n, close_fd, n->lfd, false);
	n->lfd = -1;
	IO(n, timer_del, n->drain_timer);
	n->drain_timer = NULL;
	done(n->drain_arg);
}

void px_node_housekeep(struct px_node *n)
{
	struct px_migration *m, *next;

	IO(n, timer_del, n->hk);
	n->hk = NULL;
	if (!n->dirty)
		return;
	n->dirty = false;
	vm_list_for_each_entry_safe (m, next, &n->stopped, node)
		px_migration_maybe_finish(m);
	check_drained(n);
}

static void housekeep_due(void *arg)
{
	struct px_node *n = arg;

	n->hk = NULL;
	px_node_housekeep(n);
}

/* The loop runs timers after a pass's events (and rescans for timers added meanwhile), so a
 * timer due now is the end of the pass. Without one (ENOMEM) the next tick does it. */
void px_node_dirty(struct px_node *n)
{
	n->dirty = true;
	if (!n->hk)
		(void)IO(n, timer_add, px_now(n), housekeep_due, n, &n->hk);
}

static void drain_expired(void *arg)
{
	struct px_node *n = arg;

	n->drain_timer = NULL;
	log_warn("drain timeout: cutting %u connections still in flight", px_node_active_conns(n));
	/* A retiring node stops waiting for migrations that never got their first connection. */
	n->retiring = false;
	n->draining = true;
	while (!vm_list_empty(&n->unbound))
		px_conn_free(vm_list_first_entry(&n->unbound, struct px_conn, node));
	vm_list_each (struct px_migration, m, &n->migrations, node)
		px_migration_cut(m, true);
	px_node_dirty(n);
}

/*
 * The start of a drain or a retirement: done follows once it ends. A retirement closes this
 * copy of the node-hop listener at once (after a takeover the socket lives on in the vmigd that
 * took over); a drain keeps it until the end, for the digest reports of the connections in
 * flight, and refuses everything else on it (status 8).
 */
static void wind_down(struct px_node *n, void (*done)(void *arg), void *arg, bool keep_listener)
{
	n->drain_done = done;
	n->drain_arg = arg;
	if (keep_listener)
		return;
	IO(n, watch_del, n->lw);
	n->lw = NULL;
	IO(n, close_fd, n->lfd, false);
	n->lfd = -1;
}

/* ... and its bound: what is left after timeout_s is cut. */
static void wind_down_timer(struct px_node *n, unsigned int timeout_s)
{
	if (IO(n, timer_add, px_now(n) + timeout_s * 1000ull, drain_expired, n, &n->drain_timer) <
	    0)
		drain_expired(n);
	else
		px_node_dirty(n);
}

void px_node_drain(struct px_node *n, unsigned int timeout_s, void (*done)(void *arg), void *arg)
{
	n->draining = true;
	wind_down(n, done, arg, true);
	vm_list_each (struct px_migration, m, &n->migrations, node)
		for (unsigned int i = 0; i < m->nports; i++)
			px_port_close(&m->ports[i]);
	if (px_node_active_conns(n) > 0)
		log_info("draining: %u connections in flight, waiting up to %u s",
			 px_node_active_conns(n), timeout_s);
	wind_down_timer(n, timeout_s);
}

int px_node_listen_fd(const struct px_node *n)
{
	return n->lfd;
}

bool px_node_listening(const struct px_node *n)
{
	return n->lfd >= 0 && !n->draining && !n->retiring;
}

unsigned int px_node_unbound_shared(const struct px_node *n)
{
	unsigned int k = 0;

	vm_list_each (const struct px_conn, c, &n->unbound, node)
		k += c->lport == NULL;
	return k;
}

int px_node_listen_pause(struct px_node *n, bool pause)
{
	if (n->lfd < 0)
		return -EBADF;
	if (pause) {
		IO(n, watch_del, n->lw);
		n->lw = NULL;
		return 0;
	}
	if (n->lw)
		return 0;
	return IO(n, watch_add, n->lfd, EPOLLIN, px_target_accept, n, &n->lw);
}

int px_migration_hand_over(struct px_node *n, const char *key, enum px_role role, const char *to)
{
	struct px_migration *m = px_migration_find(n, key, role);

	if (!m)
		return -ENOENT;
	if (!waiting_first(m) || m->kubevirt || role != PX_ROLE_TARGET)
		return -EBUSY;
	vm_list_del(&m->node);
	log_info("migration %s role=%s: handed over to %s before its first connection", m->key,
		 px_role_str(m->role), to);
	for (unsigned int i = 0; i < m->nports; i++)
		px_order_free(m->ports[i].order);
	IO(n, timer_del, m->order_timer);
	IO(n, timer_del, m->stop_timer);
	px_migration_discard(m);
	px_node_share(n);
	return 0;
}

void px_node_retire(struct px_node *n, unsigned int timeout_s, void (*done)(void *arg), void *arg)
{
	unsigned int waiting = 0;

	n->retiring = true;
	wind_down(n, done, arg, false);
	vm_list_each (struct px_migration, m, &n->migrations, node)
		waiting += waiting_first(m);
	log_info("handed over: carrying on with %u connections in flight and %u migrations "
		 "waiting for their first, for up to %u s",
		 px_node_active_conns(n), waiting, timeout_s);
	wind_down_timer(n, timeout_s);
}

int px_node_set_elsewhere(struct px_node *n, const char *const *keys, unsigned int nkeys,
			  const char *who)
{
	char **list = NULL;

	if (nkeys) {
		list = calloc(nkeys, sizeof(*list));
		if (!list)
			return -ENOMEM;
		for (unsigned int i = 0; i < nkeys; i++) {
			list[i] = strdup(keys[i]);
			if (!list[i]) {
				while (i--)
					free(list[i]);
				free(list);
				return -ENOMEM;
			}
		}
	}
	for (unsigned int i = 0; i < n->nelsewhere; i++)
		free(n->elsewhere[i]);
	free(n->elsewhere);
	n->elsewhere = list;
	n->nelsewhere = nkeys;
	snprintf(n->elsewhere_who, sizeof(n->elsewhere_who), "%s", who ? who : "");
	return 0;
}

const char *px_node_elsewhere(const struct px_node *n, const char *key)
{
	for (unsigned int i = 0; i < n->nelsewhere; i++)
		if (strcmp(n->elsewhere[i], key) == 0)
			return n->elsewhere_who;
	return NULL;
}

int px_node_new_io(const struct xp_io_ops *io, void *ioc, const struct px_config *conf,
		   struct px_node **ret)
{
	struct px_node *n;
	int r;

	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->io = io;
	n->ioc = ioc;
	n->conf = *conf;
	n->lfd = -1;
	vm_list_init(&n->unbound);
	vm_list_init(&n->migrations);
	vm_list_init(&n->stopped);
	n->refusals.what = "lines about refused node-hop connections";
	n->accept_errors.what = "lines about failed accepts";
	r = xp_bucket_new(conf->shaper == PX_SHAPE_BUCKET ? conf->node_bandwidth : 0, &n->bucket);
	if (r < 0)
		goto fail;
	r = IO(n, start, px_conn_done, n);
	if (r < 0) {
		log_err("cannot start %u data-path workers (io_uring): %s", conf->threads,
			strerror(-r));
		goto fail;
	}
	{
		struct xp_io_info info = { 0 };

		IO(n, info, &info);
		n->dpdk.ip = info.dpdk_ip;
		n->dpdk.port = info.dpdk_port;
		/* logged as it changes from here (px_dpdk.c): what a start expects */
		n->dpdk_seen.link_up = true;
	}
	if (conf->adopt) {
		r = IO(n, listen_adopt, conf->adopt_fd, &n->bound);
		if (r < 0) {
			log_err("the node-hop listener handed over is not a TCP listener: %s",
				strerror(-r));
			goto fail;
		}
		n->lfd = conf->adopt_fd;
	} else {
		r = IO(n, listen_tcp, &conf->listen, &n->lfd, &n->bound);
	}
	if (r < 0) {
		char a[80] = "?";

		xp_addr_format(&conf->listen, a, sizeof(a));
		log_err("cannot listen on %s: %s", a, strerror(-r));
		goto fail;
	}
	xp_addr_format(&n->bound, n->listen_str, sizeof(n->listen_str));
	r = IO(n, watch_add, n->lfd, EPOLLIN, px_target_accept, n, &n->lw);
	if (r < 0)
		goto fail;
	if (conf->advertise[0]) {
		strcpy(n->advertise, conf->advertise);
	} else if (!xp_addr_is_wildcard(&n->bound)) {
		xp_addr_host(&n->bound, n->advertise, sizeof(n->advertise));
	} else if (xp_addr_guess_public(n->advertise, sizeof(n->advertise)) < 0) {
		log_warn("no non-loopback address found; advertising 127.0.0.1 (use --advertise)");
		strcpy(n->advertise, "127.0.0.1");
	}
	r = IO(n, timer_add, px_now(n) + TICK_MS, px_node_tick, n, &n->tick);
	if (r < 0)
		goto fail;
	*ret = n;
	return 0;

fail:
	px_node_free(n);
	return r;
}

int px_node_new(struct xp_io *io, const struct px_config *conf, struct px_node **ret)
{
	struct px_node *n;
	int r;

	r = px_node_new_io(&xp_io_ops, io, conf, &n);
	if (r < 0) {
		xp_io_free(io);
		return r;
	}
	n->own_io = io;
	*ret = n;
	return 0;
}

void px_node_free(struct px_node *n)
{
	if (!n)
		return;
	/* Joining the workers closes every link's sockets. */
	if (n->own_io)
		xp_io_stop(n->own_io);
	n->drain_done = NULL;
	while (!vm_list_empty(&n->unbound))
		px_conn_free(vm_list_first_entry(&n->unbound, struct px_conn, node));
	/* Every migration still here gets its stop line; its links are gone with the pool. */
	for (int stopped = 0; stopped < 2; stopped++) {
		struct vm_list *head = stopped ? &n->stopped : &n->migrations;

		while (!vm_list_empty(head)) {
			struct px_migration *m =
				vm_list_first_entry(head, struct px_migration, node);

			for (unsigned int i = 0; i < m->nports; i++) {
				px_order_free(m->ports[i].order);
				m->ports[i].order = NULL;
			}
			while (!vm_list_empty(&m->conns)) {
				struct px_conn *c =
					vm_list_first_entry(&m->conns, struct px_conn, node);

				if (c->st == C_LINKED)
					m->conns_cut++;
				px_conn_free(c);
			}
			px_migration_finish(m);
		}
	}
	IO(n, timer_del, n->drain_timer);
	IO(n, timer_del, n->tick);
	IO(n, timer_del, n->hk);
	IO(n, watch_del, n->lw);
	IO(n, close_fd, n->lfd, false);
	xp_io_free(n->own_io);
	xp_bucket_free(n->bucket);
	px_node_set_elsewhere(n, NULL, 0, NULL);
	free(n);
}

const char *px_node_listen_str(const struct px_node *n)
{
	return n->listen_str;
}

const char *px_node_advertise(const struct px_node *n)
{
	return n->advertise;
}

const char *px_node_data_path(const struct px_node *n)
{
	struct xp_io_info info;

	IO(n, info, &info);
	return info.data_path;
}

unsigned int px_node_threads(const struct px_node *n)
{
	struct xp_io_info info;

	IO(n, info, &info);
	return info.threads;
}

unsigned int px_node_migrations(const struct px_node *n)
{
	unsigned int k = 0;

	vm_list_each (struct px_migration, m, &n->migrations, node)
		k++;
	return k;
}

void px_accept_failed(struct px_node *n, struct xp_watch *w, int r, const char *what)
{
	struct rlimit rl = { 0 };

	if (r == -EAGAIN || r == -EINTR || r == -ECONNABORTED)
		return;
	if (!xp_accept_starved(r)) {
		vm_log_limited(&n->accept_errors, px_now(n), VM_LOG_ERR, "%s: accept: %s", what,
			       strerror(-r));
		return;
	}
	n->accept_paused++;
	getrlimit(RLIMIT_NOFILE, &rl);
	vm_log_limited(&n->accept_errors, px_now(n), VM_LOG_ERR,
		       "%s: cannot accept a connection: %s (open files limit %llu); not accepting "
		       "for %u ms, connections wait in the listen queue",
		       what, strerror(-r), (unsigned long long)rl.rlim_cur, ACCEPT_PAUSE_MS);
	if (IO(n, watch_pause, w, ACCEPT_PAUSE_MS) < 0)
		log_err("%s: cannot pause the listener", what);
}
