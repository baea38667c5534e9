// SPDX-License-Identifier: Apache-2.0
/* Connections of either role: adopting and freeing one that is still being set up, handing a
 * finished one to the data path (with its caps and the stream inspector) and taking it back when
 * its link ends. The roles' set-up steps are in px_source.c and px_target.c; what follows an end
 * (a migration finished, a drain over) is px_node_housekeep()'s. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "px_private.h"

const char *px_role_str(enum px_role r)
{
	return r == PX_ROLE_SOURCE ? "source" : "target";
}

void px_conn_adopt(struct px_conn *c, struct px_port *port, uint32_t seq, enum conn_state st)
{
	struct px_node *n = c->n;

	IO(n, watch_del, c->w);
	IO(n, timer_del, c->t);
	c->w = NULL;
	c->t = NULL;
	vm_list_del(&c->node);
	n->nunbound--;
	c->m = port->m;
	c->port = port;
	c->lport = NULL;
	c->seq = seq;
	c->st = st;
	vm_list_add(&port->m->conns, &c->node);
	port->m->conns_active++;
}

void px_conn_free(struct px_conn *c)
{
	struct px_migration *m = c->m;
	struct px_node *n = c->n;

	IO(n, watch_del, c->w);
	IO(n, timer_del, c->t);
	px_resume_forget(c);
	if (c->st != C_LINKED) {
		IO(n, close, c->hop);
		IO(n, close_fd, c->lfd, false);
	}
	px_insp_free(c->insp);
	vm_list_del(&c->node);
	if (m)
		m->conns_active--;
	else
		n->nunbound--;
	free(c);
}

void px_conn_release(struct px_conn *c)
{
	struct px_node *n = c->n;

	px_conn_free(c);
	px_node_dirty(n);
}

/* A fresh connection's send buffer is empty, so a failure means the peer is gone; callers
 * refusing a connection need not care. */
int px_conn_reply(struct px_conn *c, enum px_status st)
{
	uint8_t r[PX_REPLY_MAX];
	uint32_t ev;
	size_t len;
	ssize_t k;

	/* accepted over the DPDK node hop: this node's address and the stream both will use */
	if (st == PX_OK && c->dpdk.ip) {
		struct px_dpdk self = c->n->dpdk;

		self.stream = c->dpdk.stream;
		if (c->resumable)
			len = px_reply_encode_resumable(c->token, &self, r);
		else
			len = px_reply_encode(PX_OK_DPDK, &self, r);
	} else if (st == PX_OK && c->resumable) {
		len = px_reply_encode_resumable(c->token, NULL, r);
	} else {
		len = px_reply_encode(st, NULL, r);
	}
	k = IO(c->n, write, c->hop, r, len, &ev);
	if (k < 0)
		return k == -EAGAIN ? -EIO : (int)k;
	return (size_t)k == len ? 0 : -EIO;
}

bool px_dpdk_can(const struct px_conn *c)
{
	/* the keys come from TLS 1.3's exporter; TLS 1.2 has none. A source offers it only to a
	 * target that advertised one, so that a vmigd older than the offer never sees it. */
	if (c->m && c->m->role == PX_ROLE_SOURCE && !c->m->target.dpdk.ip)
		return false;
	return c->n->dpdk.ip && !c->raw &&
	       (!c->tls.version[0] || strcmp(c->tls.version, "TLSv1.3") == 0);
}

void px_zinfo_add(struct px_zinfo *to, const struct xp_zfig *f)
{
	to->tx_plain += f->tx_plain;
	to->tx_wire += f->tx_wire;
	to->tx_ns += f->tx_ns;
	to->rx_plain += f->rx_plain;
	to->rx_wire += f->rx_wire;
	to->rx_ns += f->rx_ns;
	to->flips += f->flips;
}

enum px_compress px_compress_mode(const struct px_migration *m)
{
	enum px_compress z =
		m->opts.compress != PX_COMPRESS_DEFAULT ? m->opts.compress : m->n->conf.compress;

	return z == PX_COMPRESS_AUTO && m->zforced ? PX_COMPRESS_ALWAYS : z;
}

bool px_compress_wanted(const struct px_conn *c)
{
	enum px_compress z = px_compress_mode(c->m);

	if (z != PX_COMPRESS_AUTO)
		return z == PX_COMPRESS_ALWAYS;
	return c->m->tls || c->n->conf.copy_path || c->m->cap || c->n->conf.node_bandwidth;
}

void px_migration_compress_all(struct px_node *n, const char *key)
{
	struct px_migration *m = px_migration_find(n, key, PX_ROLE_SOURCE);
	unsigned int k = 0;

	if (!m || m->zforced || px_compress_mode(m) != PX_COMPRESS_AUTO)
		return;
	m->zforced = true;
	vm_list_each (struct px_conn, c, &m->conns, node) {
		if (c->st == C_LINKED && c->zout_offered) {
			IO(n, link_set_zmode, c->link, XP_Z_ALWAYS);
			k++;
		}
	}
	log_info("migration %s role=source: convergence: every chunk compressed from now on (%u "
		 "connections now)",
		 m->key, k);
}

void px_conn_link_opts(const struct px_conn *c, struct xp_link_opts *o)
{
	struct px_node *n = c->n;

	memset(o, 0, sizeof(*o));
	o->cookie = (void *)c;
	o->raw = c->raw;
	o->digest = c->digest;
	if (c->resumable) {
		o->resume.keep = n->conf.resume_keep;
		o->resume.silence_ms = PX_HOP_SILENCE_MS;
	}
	/* compression: what a source sends in the kernel path's frames or the DPDK hop's stream,
	 * to a target that agreed on that path */
	if (c->resumable) {
		enum px_compress z = c->zout_offered ? px_compress_mode(c->m) : PX_COMPRESS_OFF;

		o->z.out = z == PX_COMPRESS_ALWAYS ? XP_Z_ALWAYS
			   : z == PX_COMPRESS_AUTO ? XP_Z_AUTO
						   : XP_Z_OFF;
		o->z.level = n->conf.compress_level;
		o->z.in = c->zin;
	}
	if (n->conf.shaper == PX_SHAPE_BUCKET) {
		o->bucket[0] = c->m->bucket;
		o->bucket[1] = n->bucket;
	}
	/* The QEMU stream: from the local socket on a source, from the node hop on a target. */
	if (c->insp) {
		unsigned int d = c->m->role == PX_ROLE_SOURCE ? 0 : 1;

		o->tap_ops[d] = &px_insp_tap_ops;
		o->tap_ctx[d] = c->insp;
	}
}

int px_conn_link(struct px_conn *c)
{
	struct px_node *n = c->n;
	struct xp_link_opts o;
	int r;

	IO(n, watch_del, c->w);
	IO(n, timer_del, c->t);
	c->w = NULL;
	c->t = NULL;
	if (n->conf.inspect && px_insp_new(NULL, &c->insp) < 0)
		c->insp = NULL;
	px_conn_link_opts(c, &o);
	o.dpdk.ip = c->dpdk.ip;
	o.dpdk.port = c->dpdk.port;
	o.dpdk.stream = c->dpdk.stream;
	/* The description was taken at the handshake: once attached, the data path owns the
	 * session and may free it at any time. */
	r = IO(n, attach, c->lfd, c->hop, &o, &c->link);
	if (r < 0) {
		px_insp_free(c->insp);
		c->insp = NULL;
		return r;
	}
	c->st = C_LINKED;
	c->hop = NULL;
	c->lfd = -1;
	if (!c->resumable)
		c->m->unresumable = true;
	c->m->conns_total++;
	c->port->conns_total++;
	n->conns_total++;
	log_info("migration %s role=%s: port %u connection %u linked %s wire=%s path=%s resume=%s "
		 "compress=%s",
		 c->m->key, px_role_str(c->m->role), c->port->id, c->seq,
		 c->tls.describe[0] ? c->tls.describe : "tls=off", c->raw ? "raw" : "vmigd",
		 c->dpdk.ip ? "dpdk" : "kernel", c->resumable ? "yes" : "no",
		 c->zin		   ? "in"
		 : o.z.out == XP_Z_OFF ? "off"
				       : px_compress_str(px_compress_mode(c->m)));
	return 0;
}

/*
 * A main channel that ended without a socket error but before QEMU's switchover, while the
 * inspector still followed it: the migration was cut short. In plain text the FIN of a killed
 * vmigd reads like any other end, so the stream is what tells. Who ended it, as far as this side
 * can know: on a target, bytes the destination QEMU never read mean it closed first.
 */
static void note_short(struct px_conn *c, const struct xp_link_result *res,
		       const struct px_insp_stats *st)
{
	struct px_migration *m = c->m;
	char who[120];

	if (st->kind != PX_INSP_MAIN || st->bytes_only || st->switchover)
		return;
	if (m->conns_short++)
		return;
	if (m->role == PX_ROLE_TARGET && res->undelivered)
		snprintf(who, sizeof(who),
			 "the destination QEMU closed it first, %llu bytes for it "
			 "undelivered",
			 (unsigned long long)res->undelivered);
	else if (m->role == PX_ROLE_TARGET)
		snprintf(who, sizeof(who),
			 "the source side ended it (its QEMU, its vmigd or the "
			 "node hop)");
	else
		snprintf(who, sizeof(who),
			 "the source QEMU or the node hop ended it (a cancelled "
			 "or failed migration)");
	snprintf(m->short_why, sizeof(m->short_why),
		 "port %u connection %u, the main channel, ended before QEMU's switchover after "
		 "%.1f MiB: %s",
		 c->port->id, c->seq, st->bytes / 1048576.0, who);
}

void px_conn_done(void *cookie, const struct xp_link_result *res, void *arg)
{
	struct px_conn *c = cookie;
	struct px_migration *m = c->m;

	if (res->end == XP_END_QUIESCED) {
		px_move_quiesced(c, res);
		return;
	}
	if (res->end == XP_END_FALLBACK) {
		px_dpdk_fallback(c, res);
		return;
	}
	if (res->end == XP_END_MOVED) {
		/* another vmigd carries it on: its figures and its check are that one's */
		px_conn_release(c);
		return;
	}
	if (m->moving)
		px_move_off(m, res->end == XP_END_SUSPENDED ? "a connection lost its node hop"
							    : "a connection ended");
	if (res->end == XP_END_SUSPENDED) {
		px_resume_suspended(c, res);
		return;
	}
	if (c->resumable) {
		if (c->suspended)
			c->unhopped_ms += px_now(c->n) - c->suspended_ms;
		c->suspended = false;
		m->resumptions += res->resumed;
		m->fallbacks += c->fallbacks;
		m->replayed += res->replayed;
		m->unhopped_ms += c->unhopped_ms;
		px_resume_ended(c);
	}
	px_zinfo_add(&m->zdone, &res->z);
	m->bytes[0] += res->bytes[0];
	m->bytes[1] += res->bytes[1];
	c->port->bytes[0] += res->bytes[0];
	c->port->bytes[1] += res->bytes[1];
	m->n->bytes_done[0] += res->bytes[0];
	m->n->bytes_done[1] += res->bytes[1];
	m->shaped_ns_done += res->shaped_ns;
	if (c->insp) {
		struct px_insp_stats st;

		px_insp_read(c->insp, &st);
		px_insp_fold(&m->insp_done, &st, false);
		if (res->end == XP_END_CLEAN)
			note_short(c, res, &st);
	}
	m->undelivered += res->undelivered;
	if (res->end == XP_END_ERROR) {
		m->conns_failed++;
		log_err("migration %s role=%s: port %u connection %u failed after %llu/%llu bytes "
			"(tx/rx): %s on the %s side%s%s",
			m->key, px_role_str(m->role), c->port->id, c->seq,
			(unsigned long long)res->bytes[0], (unsigned long long)res->bytes[1],
			strerror(-res->err), res->err_side == 0 ? "local" : "node-hop",
			res->detail[0] ? ": " : "", res->detail);
	} else {
		if (res->undelivered)
			log_info("migration %s role=%s: port %u connection %u: the local side "
				 "closed after its end of stream with %llu bytes from the peer not "
				 "read (QEMU's destination ends multifd channels so)",
				 m->key, px_role_str(m->role), c->port->id, c->seq,
				 (unsigned long long)res->undelivered);
		log_debug("migration %s: port %u connection %u ended (%s%s), %llu/%llu bytes",
			  m->key, c->port->id, c->seq, res->end == XP_END_CLEAN ? "clean" : "cut",
			  res->reset_after_eof ? ", peer reset after its stream ended" : "",
			  (unsigned long long)res->bytes[0], (unsigned long long)res->bytes[1]);
	}
	if (px_verify_ended(c, res))
		return;
	px_conn_release(c);
}
