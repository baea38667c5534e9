// SPDX-License-Identifier: Apache-2.0
/* A migration's lifecycle, either role: checks of what starts it, failure, stop with its grace
 * period, and the one stop line logged once the data path has returned every link. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "px_private.h"
#include "units.h"

struct px_migration *px_migration_new(struct px_node *n, const char *key, enum px_role role)
{
	struct px_migration *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	m->n = n;
	strcpy(m->key, key);
	m->role = role;
	m->ops = role == PX_ROLE_SOURCE ? &px_source_ops : &px_target_ops;
	m->started_ms = px_now(n);
	m->pace_gain = 1.0;
	m->dirfd = -1;
	vm_list_init(&m->conns);
	vm_list_init(&m->node);
	for (unsigned int i = 0; i < PX_PORTS_MAX; i++) {
		m->ports[i].m = m;
		m->ports[i].lfd = -1;
	}
	if (xp_bucket_new(0, &m->bucket) < 0) {
		free(m);
		return NULL;
	}
	return m;
}

void px_migration_discard(struct px_migration *m)
{
	if (m->dirfd >= 0)
		close(m->dirfd);
	xp_bucket_free(m->bucket);
	free(m);
}

struct px_migration *px_migration_find(struct px_node *n, const char *key, enum px_role role)
{
	vm_list_each (struct px_migration, m, &n->migrations, node)
		if (m->role == role && strcmp(m->key, key) == 0)
			return m;
	return NULL;
}

int px_check_key(struct px_node *n, const char *key, char *err, size_t errlen)
{
	if (!px_key_valid(key)) {
		snprintf(err, errlen,
			 "invalid key \"%.40s\": use 1 to %d characters of A-Z a-z 0-9 . _ -", key,
			 PX_KEY_MAX);
		return -EINVAL;
	}
	if (n->draining) {
		snprintf(err, errlen, "vmigd is shutting down");
		return -ESHUTDOWN;
	}
	if (n->retiring) {
		snprintf(err, errlen,
			 "this vmigd has handed over to a newer one (takeover); ask the new one");
		return -ESHUTDOWN;
	}
	return 0;
}

/* The directory of path must exist and resolve as the target will resolve path itself:
 * without links (xp_path.h), so a link in the way is refused at start, not at the first
 * connection. */
static int check_dir_of(const char *path, char *err, size_t errlen)
{
	char dir[sizeof(((struct px_port_info *)0)->path)];
	const char *name;
	int fd, r;

	r = xp_path_split(path, dir, sizeof(dir), &name);
	if (r == 0)
		r = xp_path_open_dir(dir, &fd);
	if (r < 0) {
		snprintf(err, errlen, "directory %.100s %s%s", dir,
			 r == -ENOENT ? "does not exist" : "refused: ",
			 r == -ENOENT ? "" : xp_path_strerror(r));
		return r;
	}
	close(fd);
	return 0;
}

int px_check_path(const char *path, char *err, size_t errlen)
{
	int r = xp_unix_path_ok(path);

	if (r == -ENAMETOOLONG) {
		snprintf(err, errlen, "socket path too long (at most %zu bytes): %.60s...",
			 sizeof(((struct px_port_info *)0)->path) - 1, path);
		return r;
	}
	if (r < 0 || path[0] != '/') {
		snprintf(err, errlen, "socket path must be absolute: \"%.60s\"", path);
		return -EINVAL;
	}
	return check_dir_of(path, err, errlen);
}

int px_check_ports(unsigned int nports, const uint32_t *ids, char *err, size_t errlen)
{
	if (nports == 0 || nports > PX_PORTS_MAX) {
		snprintf(err, errlen, "give 1 to %d ports", PX_PORTS_MAX);
		return -EINVAL;
	}
	for (unsigned int i = 0; i < nports; i++)
		for (unsigned int j = 0; j < i; j++)
			if (ids[i] == ids[j]) {
				snprintf(err, errlen, "port %u is given twice", ids[i]);
				return -EINVAL;
			}
	return 0;
}

/* Parked connections belong to their order, which drops them itself. */
static void cut_conns(struct px_migration *m, bool links)
{
	struct px_conn *c, *next;

	vm_list_for_each_entry_safe (c, next, &m->conns, node) {
		if (c->st == C_LINKED) {
			if (links) {
				m->conns_cut++;
				IO(m->n, link_abort, c->link);
			}
		} else if (c->verify) {
			/* a report goes on past a stop, until the grace ends */
			if (links && m->role == PX_ROLE_SOURCE)
				px_verify_lost(c,
					       "the migration was cut before the target answered",
					       true);
			else if (links)
				px_conn_free(c);
		} else if (c->st != C_TGT_PARKED) {
			px_conn_free(c);
		}
	}
}

/*
 * Fails every port's ordering (parked connections are answered and dropped) and cuts the
 * connections. The record outlives the walk: whether it is done is housekeeping's to say.
 */
void px_migration_cut(struct px_migration *m, bool links)
{
	for (unsigned int i = 0; i < m->nports; i++)
		if (m->ports[i].order)
			px_order_fail(m->ports[i].order);
	cut_conns(m, links);
	px_node_dirty(m->n);
}

void px_migration_fail(struct px_migration *m, const char *fmt, ...)
{
	va_list ap;

	if (m->failed)
		return;
	m->failed = true;
	va_start(ap, fmt);
	vsnprintf(m->error, sizeof(m->error), fmt, ap);
	va_end(ap);
	log_err("migration %s role=%s failed: %s; closing its %u connections", m->key,
		px_role_str(m->role), m->error, m->conns_active);
	px_migration_cut(m, true);
	IO(m->n, timer_del, m->order_timer);
	m->order_timer = NULL;
}

int px_migration_abandon(struct px_node *n, const char *key, enum px_role role, const char *why)
{
	struct px_migration *m = px_migration_find(n, key, role);

	if (!m)
		return -ENOENT;
	px_migration_fail(m, "%s", why);
	return 0;
}

int px_migration_note_end(struct px_node *n, const char *key, enum px_role role, enum px_outcome o)
{
	/* The live one, else the newest stopped one: a stop may come first. */
	for (struct px_migration *m = px_next_any(n, NULL); m; m = px_next_any(n, m))
		if (m->role == role && strcmp(m->key, key) == 0) {
			m->end_note = o;
			return 0;
		}
	return -ENOENT;
}

const char *px_tls_refusal_str(unsigned int r)
{
	if (r == PX_REFUSAL_HANDSHAKE_TIMEOUT)
		return "handshake-timeout";
	if (r == PX_REFUSAL_SILENT)
		return "silent";
	return xp_tls_refusal_token(r);
}

const char *px_outcome_str(enum px_outcome o)
{
	static const char *const names[] = {
		[PX_OUT_COMPLETED] = "completed",
		[PX_OUT_CANCELLED] = "cancelled",
		[PX_OUT_FAILED] = "failed",
		[PX_OUT_CUT_SHORT] = "cut-short",
		[PX_OUT_STOPPED] = "stopped",
		[PX_OUT_CORRUPT] = "corrupt",
		[PX_OUT_CONN_ERRORS] = "connection-errors",
		[PX_OUT_ABORTED] = "aborted-by-vmigd",
	};

	return (unsigned int)o < ARRAY_SIZE(names) ? names[o] : "?";
}

void px_port_close(struct px_port *p)
{
	struct px_node *n = p->m->n;

	IO(n, watch_del, p->w);
	p->w = NULL;
	if (p->lfd < 0)
		return;
	IO(n, close_fd, p->lfd, false);
	p->lfd = -1;
	p->m->ops->port_closed(p);
}

int px_tls_choose(struct px_node *n, enum px_tls tls, bool *ret, char *err, size_t errlen)
{
	if (tls == PX_TLS_ON && !n->conf.tls) {
		snprintf(err, errlen,
			 "TLS asked for, but vmigd runs with --no-tls (no certificate to present)");
		return -ENOTSUP;
	}
	*ret = tls == PX_TLS_DEFAULT ? n->conf.tls != NULL : tls == PX_TLS_ON;
	return 0;
}

void px_migration_maybe_finish(struct px_migration *m)
{
	if (m->stopping && m->conns_active == 0 && !px_verify_busy(m))
		px_migration_finish(m);
}

/* The stop line: what the migration carried and how it ended, counted by outcome. */
static void stop_line(struct px_migration *m)
{
	struct px_node *n = m->n;
	double secs = (px_now(n) - m->started_ms) / 1000.0;
	char outcome[300], undelivered[256] = "", verified[64];
	enum px_outcome o;

	px_verify_note(m, verified, sizeof(verified));
	if (m->v.corrupt) {
		o = PX_OUT_CORRUPT;
		snprintf(outcome, sizeof(outcome), "corrupt (%s)", m->v.corrupt_why);
	} else if (m->end_note != PX_OUT_COMPLETED) {
		o = m->end_note;
		snprintf(outcome, sizeof(outcome), "%s", px_outcome_str(o));
	} else if (m->failed) {
		o = PX_OUT_FAILED;
		snprintf(outcome, sizeof(outcome), "failed (%s)", m->error);
	} else if (m->conns_cut) {
		o = PX_OUT_STOPPED;
		snprintf(outcome, sizeof(outcome), "stopped with %u connections in flight",
			 m->conns_cut);
	} else if (m->conns_failed) {
		o = PX_OUT_CONN_ERRORS;
		snprintf(outcome, sizeof(outcome), "errors on %u connections", m->conns_failed);
	} else if (m->conns_short) {
		o = PX_OUT_CUT_SHORT;
		snprintf(outcome, sizeof(outcome), "cut-short (%s)", m->short_why);
	} else {
		o = PX_OUT_COMPLETED;
		snprintf(outcome, sizeof(outcome), "ok");
	}
	n->ended[m->role][o]++;
	if (m->undelivered)
		snprintf(undelivered, sizeof(undelivered), " undelivered=%llu",
			 (unsigned long long)m->undelivered);
	/* what node hops that failed cost: resumed, sent again, how long without one */
	if (m->resumptions || m->unhopped_ms)
		snprintf(undelivered + strlen(undelivered), sizeof(undelivered) - strlen(undelivered),
			 " resumed=%u replayed=%llu hopless=%.1fs", m->resumptions,
			 (unsigned long long)m->replayed, m->unhopped_ms / 1000.0);
	if (m->fallbacks)
		snprintf(undelivered + strlen(undelivered), sizeof(undelivered) - strlen(undelivered),
			 " dpdk_fallbacks=%u", m->fallbacks);
	/* compression: the plain bytes that went (came) as chunks, the chunks, the CPU time */
	if (m->zdone.tx_plain || m->zdone.rx_plain)
		snprintf(undelivered + strlen(undelivered), sizeof(undelivered) - strlen(undelivered),
			 " compressed=%llu wire=%llu zcpu=%.2fs",
			 (unsigned long long)(m->zdone.tx_plain + m->zdone.rx_plain),
			 (unsigned long long)(m->zdone.tx_wire + m->zdone.rx_wire),
			 (double)(m->zdone.tx_ns + m->zdone.rx_ns) / 1e9);
	vm_log(m->v.corrupt				  ? VM_LOG_ERR
	       : strcmp(outcome, "ok") || m->v.unverified ? VM_LOG_WARN
							  : VM_LOG_INFO,
	       "migration %s role=%s stop conns=%u reordered=%u bytes=%llu tx=%llu rx=%llu%s "
	       "duration=%.3fs%s outcome=%s",
	       m->key, px_role_str(m->role), m->conns_total, m->conns_reordered,
	       (unsigned long long)(m->bytes[0] + m->bytes[1]), (unsigned long long)m->bytes[0],
	       (unsigned long long)m->bytes[1], undelivered, secs, verified, outcome);
}

void px_migration_finish(struct px_migration *m)
{
	struct px_node *n = m->n;

	/* a moved migration's stop line is the other vmigd's */
	if (m->moved)
		px_move_finish(m);
	else
		stop_line(m);
	vm_list_del(&m->node);
	for (unsigned int i = 0; i < m->nports; i++) {
		px_port_close(&m->ports[i]);
		px_order_free(m->ports[i].order);
	}
	IO(n, timer_del, m->order_timer);
	IO(n, timer_del, m->stop_timer);
	IO(n, timer_del, m->move_timer);
	px_verify_free(m);
	px_migration_discard(m);
}

static void stop_grace_expired(void *arg)
{
	struct px_migration *m = arg;

	m->stop_timer = NULL;
	log_warn("migration %s role=%s: %u connections still open %d ms after stop; cutting them",
		 m->key, px_role_str(m->role), m->conns_active, STOP_GRACE_MS);
	px_migration_cut(m, true);
	px_node_dirty(m->n);
}

/*
 * Leaves the key free at once; the record lives on until the data path returned its links.
 * Links get STOP_GRACE_MS to end by themselves, so a stop right after QEMU's "completed" loses
 * nothing.
 */
void px_migration_stop(struct px_migration *m)
{
	struct px_node *n = m->n;

	vm_list_del(&m->node);
	m->stopping = true;
	vm_list_add(&n->stopped, &m->node);
	for (unsigned int i = 0; i < m->nports && !m->ops->stop_keeps_ports(m); i++)
		px_port_close(&m->ports[i]);
	px_migration_cut(m, false);
	if (m->conns_active > 0 &&
	    IO(n, timer_add, px_now(n) + STOP_GRACE_MS, stop_grace_expired, m, &m->stop_timer) < 0)
		px_migration_cut(m, true);
	/* It may be done already; a retiring node may have waited for its first connection. */
	px_node_dirty(n);
}

const char *px_cap_note(uint64_t cap, char *buf, size_t len)
{
	char r[32];

	if (!cap)
		return "";
	snprintf(buf, len, " cap=%s", vm_format_rate(cap, r, sizeof(r)));
	return buf;
}
