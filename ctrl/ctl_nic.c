// SPDX-License-Identifier: Apache-2.0
/* Each migration's NIC and its link's history (ctl_nic.h): one record per migration, kept by a
 * one-second sweep of the node's migrations and by ctl_netlink's events. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_nic.h"
#include "log.h"
#include "util.h"

#define SWEEP_MS 1000

struct rec {
	struct ctl_nic *c;
	char key[PX_KEY_MAX + 1];
	enum px_role role;
	char peer[64];
	struct ctl_nic_info nic; /* as last looked up */
	bool found;		 /* nic is a route's */
	bool up;
	uint64_t down_since_ms; /* while down */
	unsigned int downs;
	bool stale; /* an address changed: look the route up again */
	bool seen;  /* by this sweep */
	struct xp_timer *fail_t; /* while down: the bound */
	bool abandoned;		 /* failed for it, or left alone and said why */
	char error[200];
	struct rec *next;
};

struct ctl_nic {
	struct xp_loop *loop;
	struct px_node *node;
	struct cv_set *conv;
	unsigned int down_timeout_s;
	struct ctl_nl *nic;
	struct xp_timer *t;
	struct rec *recs;
};

/* The link's speed in bytes/s; 0 where no device reports one. */
static uint64_t speed_bps(const struct ctl_nic_info *nic)
{
	return nic->speed_mbps > 0 ? (uint64_t)nic->speed_mbps * 125000 : 0;
}

static void speed(struct ctl_nic_view *v)
{
	v->speed = speed_bps(&v->nic);
	v->speed_known = v->speed != 0;
}

static void rec_free(struct rec *r)
{
	xp_timer_del(r->fail_t);
	free(r);
}

static void on_down_bound(void *arg);

/* The convergence policy's headroom stops at the link's speed (a source's only). */
static void tell_speed(struct ctl_nic *c, const struct rec *r)
{
	if (c->conv && r->role == PX_ROLE_SOURCE)
		cv_watch_set_link(c->conv, r->key, speed_bps(&r->nic));
}

/* The link is back (or the route moved to one that is up): the bound and the hold end. */
static void link_back_policy(struct ctl_nic *c, struct rec *r, const char *why)
{
	xp_timer_del(r->fail_t);
	r->fail_t = NULL;
	if (c->conv && r->role == PX_ROLE_SOURCE)
		cv_watch_hold(c->conv, r->key, false, why);
}

/* The link went down: hold convergence, arm the bound. */
static void link_down_policy(struct ctl_nic *c, struct rec *r)
{
	char why[160];

	if (c->conv && r->role == PX_ROLE_SOURCE) {
		snprintf(why, sizeof(why), "link %s of the node hop is down", r->nic.name);
		cv_watch_hold(c->conv, r->key, true, why);
	}
	if (c->down_timeout_s && !r->abandoned && !r->fail_t &&
	    xp_timer_add(c->loop, r->down_since_ms + c->down_timeout_s * 1000ull, on_down_bound, r,
			 &r->fail_t) < 0)
		log_warn("migration %s role=%s: cannot arm the link-down bound: it waits for TCP",
			 r->key, px_role_str(r->role));
}

static struct rec *find(struct ctl_nic *c, const char *key, enum px_role role)
{
	for (struct rec *r = c->recs; r; r = r->next)
		if (r->role == role && !strcmp(r->key, key))
			return r;
	return NULL;
}

/* The route to the record's peer, again; a change of interface is logged. */
static void resolve(struct ctl_nic *c, struct rec *r)
{
	struct ctl_nic_info nic;
	char err[200];

	r->stale = false;
	if (ctl_nl_route(c->nic, r->peer, &nic, err, sizeof(err)) < 0) {
		if (strcmp(err, r->error))
			log_warn("migration %s role=%s: node hop to %s: %s%s", r->key,
				 px_role_str(r->role), r->peer, err,
				 r->found ? " (status keeps the interface it had)" : "");
		snprintf(r->error, sizeof(r->error), "%s", err);
		return;
	}
	r->error[0] = '\0';
	if (!r->found)
		log_info("migration %s role=%s: node hop to %s goes out on %s (%s%s%s, %s)", r->key,
			 px_role_str(r->role), r->peer, nic.name, nic.kind,
			 nic.vf ? ", SR-IOV VF of " : "", nic.vf ? nic.pf : "",
			 nic.up ? "link up" : "link down");
	else if (nic.ifindex != r->nic.ifindex)
		log_warn("migration %s role=%s: node hop to %s now goes out on %s (was %s)", r->key,
			 px_role_str(r->role), r->peer, nic.name, r->nic.name);
	if (!r->found || nic.ifindex != r->nic.ifindex) {
		/* Moved onto a link that is up: what a link down set going ends. */
		if (r->found && !r->up && nic.up)
			link_back_policy(c, r, "the route moved to a link that is up");
		if (!nic.up && r->up) {
			/* Found down (it went down before vmigd looked): as if the event came. */
			r->down_since_ms = vm_now_ms();
			r->downs++;
			log_warn("migration %s role=%s: link %s is down: the node hop to %s has no "
				 "carrier",
				 r->key, px_role_str(r->role), nic.name, r->peer);
		}
		r->up = nic.up;
		if (nic.up)
			r->down_since_ms = 0;
		r->nic = nic;
		r->found = true;
		tell_speed(c, r);
		if (!r->up)
			link_down_policy(c, r);
		return;
	}
	r->nic = nic;
	tell_speed(c, r);
}

static void sweep_one(const struct px_migration_info *mi, void *arg)
{
	struct ctl_nic *c = arg;
	struct rec *r = find(c, mi->key, mi->role);

	if (!mi->peer_host)
		return;
	if (!r) {
		r = calloc(1, sizeof(*r));
		if (!r)
			return;
		r->c = c;
		snprintf(r->key, sizeof(r->key), "%s", mi->key);
		r->role = mi->role;
		r->up = true;
		r->next = c->recs;
		c->recs = r;
	}
	r->seen = true;
	if (strcmp(r->peer, mi->peer_host)) {
		snprintf(r->peer, sizeof(r->peer), "%s", mi->peer_host);
		r->stale = true;
	}
	if (r->stale || !r->found)
		resolve(c, r);
}

/* New migrations get their record, ended ones lose theirs, stale routes are looked up again. */
static void sweep(struct ctl_nic *c)
{
	struct rec **pp = &c->recs;

	for (struct rec *r = c->recs; r; r = r->next)
		r->seen = false;
	px_node_foreach(c->node, sweep_one, c);
	while (*pp) {
		struct rec *r = *pp;

		if (r->seen) {
			pp = &r->next;
			continue;
		}
		*pp = r->next;
		rec_free(r);
	}
}

static void on_tick(void *arg)
{
	struct ctl_nic *c = arg;

	c->t = NULL;
	sweep(c);
	if (xp_timer_add(c->loop, vm_now_ms() + SWEEP_MS, on_tick, c, &c->t) < 0)
		log_warn("nic: cannot arm the sweep timer: new migrations' interfaces are looked "
			 "up on events only");
}

struct fail_look {
	struct rec *r;
	bool found, failed, switchover, inspected, resumable;
};

static void fail_look_one(const struct px_migration_info *mi, void *arg)
{
	struct fail_look *l = arg;

	if (mi->role != l->r->role || strcmp(mi->key, l->r->key))
		return;
	l->found = true;
	l->failed = mi->error != NULL;
	l->inspected = mi->inspected;
	l->resumable = mi->resume.all;
	l->switchover = mi->cap_lifted || (mi->inspected && mi->insp.switchover);
}

/*
 * Down for the bound: fail the migration now rather than when TCP gives up, minutes later. Not
 * once QEMU's switchover has begun: a post-copy guest whose connections are cut is lost on both
 * nodes, while QEMU can recover a post-copy whose link comes back. Not where the stream is not
 * inspected either, since vmigd cannot tell then.
 */
static void on_down_bound(void *arg)
{
	struct rec *r = arg;
	struct ctl_nic *c = r->c;
	struct fail_look l = { .r = r };
	char why[240];

	r->fail_t = NULL;
	if (r->up || r->abandoned)
		return;
	r->abandoned = true;
	px_node_foreach(c->node, fail_look_one, &l);
	if (!l.found || l.failed)
		return;
	if (l.resumable) {
		log_warn("migration %s role=%s: link %s down for %u s, but not failed: its "
			 "connections resume when it is back (--resume-timeout)",
			 r->key, px_role_str(r->role), r->nic.name, c->down_timeout_s);
		return;
	}
	if (l.switchover || !l.inspected) {
		log_warn("migration %s role=%s: link %s down for %u s, but not failed: %s", r->key,
			 px_role_str(r->role), r->nic.name, c->down_timeout_s,
			 l.switchover
				 ? "QEMU's switchover has begun, and cutting a post-copy "
				   "migration would lose the guest (QEMU can recover it when the "
				   "link is back)"
				 : "its stream is not inspected (--no-inspect), so vmigd cannot "
				   "tell whether post-copy runs");
		return;
	}
	snprintf(why, sizeof(why),
		 "link %s down for %u s (--link-down-timeout): failed now rather than when TCP "
		 "gives up; QEMU on the source keeps the guest",
		 r->nic.name, c->down_timeout_s);
	px_migration_abandon(c->node, r->key, r->role, why);
}

static void link_changed(struct ctl_nic *c, int ifindex, const char *name, bool up, bool gone)
{
	uint64_t now = vm_now_ms();

	for (struct rec *r = c->recs; r; r = r->next) {
		if (!r->found || r->nic.ifindex != ifindex || (r->up == up && !gone))
			continue;
		if (!up || gone) {
			if (!r->up)
				continue;
			r->up = false;
			r->down_since_ms = now;
			r->downs++;
			log_warn("migration %s role=%s: link %s %s: the node hop to %s has no "
				 "carrier (down %u time%s during this migration)",
				 r->key, px_role_str(r->role), name[0] ? name : r->nic.name,
				 gone ? "deleted" : "down", r->peer, r->downs,
				 r->downs == 1 ? "" : "s");
			link_down_policy(c, r);
		} else {
			log_info("migration %s role=%s: link %s up again after %.1f s", r->key,
				 px_role_str(r->role), name, (now - r->down_since_ms) / 1000.0);
			r->up = true;
			r->down_since_ms = 0;
			link_back_policy(c, r, "the link is up again");
		}
	}
}

static void on_event(enum ctl_nl_event ev, int ifindex, const char *name, bool up, void *arg)
{
	struct ctl_nic *c = arg;

	switch (ev) {
	case CTL_NL_LINK:
	case CTL_NL_GONE:
		sweep(c); /* a migration started since the last sweep: known before it is judged */
		link_changed(c, ifindex, name, up, ev == CTL_NL_GONE);
		break;
	case CTL_NL_ADDR:
	case CTL_NL_ROUTE:
	case CTL_NL_RESYNC:
		/* A route may have moved: every record is looked up again, now. */
		for (struct rec *r = c->recs; r; r = r->next)
			r->stale = true;
		sweep(c);
		break;
	}
}

int ctl_nic_new(struct xp_loop *loop, struct px_node *n, struct cv_set *conv,
		unsigned int down_timeout_s, struct ctl_nic **ret)
{
	struct ctl_nic *c = calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->loop = loop;
	c->node = n;
	c->conv = conv;
	c->down_timeout_s = down_timeout_s;
	r = ctl_nl_new(loop, on_event, c, &c->nic);
	if (r == 0)
		r = xp_timer_add(loop, vm_now_ms() + SWEEP_MS, on_tick, c, &c->t);
	if (r < 0) {
		ctl_nic_free(c);
		return r;
	}
	*ret = c;
	return 0;
}

void ctl_nic_free(struct ctl_nic *c)
{
	if (!c)
		return;
	xp_timer_del(c->t);
	ctl_nl_free(c->nic);
	while (c->recs) {
		struct rec *r = c->recs;

		c->recs = r->next;
		rec_free(r);
	}
	free(c);
}

bool ctl_nic_migration(struct ctl_nic *c, const struct px_migration_info *mi,
		       struct ctl_nic_view *out)
{
	struct rec *r;
	struct ctl_nic_info now;
	char err[200];

	memset(out, 0, sizeof(*out));
	if (!c || !mi->peer_host)
		return false;
	r = find(c, mi->key, mi->role);
	if (!r || strcmp(r->peer, mi->peer_host)) {
		/* Asked before the sweep saw it: look it up now. */
		sweep(c);
		r = find(c, mi->key, mi->role);
	}
	if (!r || !r->found) {
		if (r)
			snprintf(out->error, sizeof(out->error), "%s", r->error);
		return r && r->error[0];
	}
	/* The facts as of now (state, speed, addresses); the history is the record's. */
	if (ctl_nl_route(c->nic, r->peer, &now, err, sizeof(err)) < 0)
		snprintf(out->error, sizeof(out->error), "%s", err);
	else if (now.ifindex == r->nic.ifindex) {
		r->nic = now;
		tell_speed(c, r);
	} else
		resolve(c, r); /* moved without an event seen yet: logged there */
	out->nic = r->nic;
	speed(out);
	out->link_up = r->up;
	out->down_ms = r->up ? 0 : vm_now_ms() - r->down_since_ms;
	out->downs = r->downs;
	return true;
}

bool ctl_nic_node(struct ctl_nic *c, struct ctl_nic_view *out)
{
	char host[80], err[200];
	const char *adv = c ? px_node_advertise(c->node) : NULL;
	const char *colon;
	size_t n;

	memset(out, 0, sizeof(*out));
	if (!adv)
		return false;
	colon = strrchr(adv, ':');
	n = colon ? (size_t)(colon - adv) : strlen(adv);
	if (n >= 2 && adv[0] == '[' && adv[n - 1] == ']') {
		adv++;
		n -= 2;
	}
	snprintf(host, sizeof(host), "%.*s", (int)n, adv);
	if (ctl_nl_owner(c->nic, host, &out->nic, err, sizeof(err)) < 0)
		return false;
	speed(out);
	out->link_up = out->nic.up;
	return true;
}
