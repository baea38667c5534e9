/* SPDX-License-Identifier: Apache-2.0 */
/* proxy/'s own header, shared by the files that make up px_node.h's module: the records of a
 * node, its migrations, their ports and connections, and the calls between those files. Nothing
 * outside proxy/ includes it. Everything here runs on the control thread. */
#ifndef PX_PRIVATE_H
#define PX_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "px_inspect.h"
#include "px_node.h"
#include "list.h"
#include "log.h"
#include "px_order.h"
#include "rate.h"
#include "xp_bucket.h"
#include "xp_io.h"
#include "xp_path.h"

/* A target keeps at most this many connections of one port waiting for a missing predecessor. */
#define ORDER_MAX_PARKED 64
/* How long a connect(2) to a local unix socket may wait for room in the listener's backlog. */
#define LOCAL_CONNECT_TIMEOUT_MS 2000
/* A resumable connection's node hop that answers nothing this long has failed (TCP's user
 * timeout and keepalive; otherwise TCP would bear it for many minutes). */
#define PX_HOP_SILENCE_MS 10000
/* A node-hop TLS client that has sent nothing this long after its accept is dropped. */
#define PX_SILENCE_MS 3000
/*
 * After `stop`, how long connections already carried may run on before they are cut. QEMU reports
 * a migration completed a moment before it closes its channels, and orchestrators stop the
 * listeners right then (KubeVirt's StopSourceListener closes only the listener).
 */
#define STOP_GRACE_MS 5000
/* Rate meters, node-cap shares and pacing are brought up to date this often. */
#define TICK_MS 100
/*
 * A target waits this long, after a connection with digests ended, for its source's report; a
 * report that comes while the target still carries the connection waits as long for its end.
 */
#define VERIFY_WAIT_MS 3000
/* A source waits this long for the answer to its report (the target may wait VERIFY_WAIT_MS). */
#define VERIFY_ANSWER_MS (VERIFY_WAIT_MS + 3000)

#define ACCEPT_PAUSE_MS 250

/* Calls the transport's ops table: IO(n, timer_add, deadline, fn, arg, &t). */
#define IO(n, op, ...) ((n)->io->op((n)->ioc, __VA_ARGS__))
/*
 * After an accept returned r on the listener watched by w (what: which one, for the log): out of
 * fds or memory, the listener rests ACCEPT_PAUSE_MS (it stays readable, so the loop would spin);
 * -EAGAIN and the like are not errors.
 */
void px_accept_failed(struct px_node *n, struct xp_watch *w, int r, const char *what);

/* A refused node-hop connection, within the node's budget of such lines (lib/log.h). */
#define px_refusal(n, ...) vm_log_limited(&(n)->refusals, px_now(n), VM_LOG_WARN, __VA_ARGS__)

/* What a target keeps of a connection with digests once it ended, until its source reported. */
struct px_vrec {
	uint32_t port, seq;
	enum px_verdict verdict; /* PX_V_PENDING: no report yet */
	struct px_digests dg;
	uint64_t ended_ms;
};

/* What comparing one ended connection's digests with the peer's found, for the counters. */
enum { PX_VERIFIED_MATCH, PX_VERIFIED_CORRUPT, PX_VERIFIED_UNVERIFIED, PX_VERIFIED_N };

/* A migration's connection digests (px_verify.c). */
struct px_verify {
	unsigned int total;	 /* connections carried with digests */
	unsigned int matched;	 /* ... whose digests the peer's matched */
	unsigned int corrupt;	 /* ... whose digests differ from the peer's */
	unsigned int unverified; /* ... that ended before both sides could compare */
	uint64_t sum;		 /* XOR of each ended connection's own digest record */
	char corrupt_why[240];	 /* the first mismatch's story */
	/* target: its ended connections' records, and those still waiting for a report */
	struct px_vrec *recs;
	unsigned int nrecs, caprecs, waiting;
	struct xp_timer *timer;
};

enum conn_state {
	C_SRC_HELD,	 /* held back on purpose (px_start's hook) */
	C_SRC_CONNECT,	 /* node-hop connect in progress */
	C_SRC_HANDSHAKE, /* TLS handshake with the target */
	C_SRC_SEND,	 /* writing the preamble */
	C_SRC_REPLY,	 /* waiting for the target's reply */
	C_SRC_AWAIT,	 /* raw, TLS 1.3: waiting for the server's first record */
	C_TGT_HANDSHAKE, /* TLS handshake with the source */
	C_TGT_PREAMBLE,	 /* reading the preamble */
	C_TGT_PARKED,	 /* waiting for its predecessors */
	C_LINKED,	 /* carried by the data path */
	C_TGT_VERIFY,	 /* a source's report, waiting for the connection it is about to end */
	C_TGT_RESUME,	 /* a resumption, waiting for the link it resumes to let go of its hop */
};

/* One QEMU connection and its node-hop connection, from accept until the data path returns it. */
struct px_conn {
	struct px_node *n;
	struct px_migration *m; /* NULL for a target connection before its preamble */
	struct px_port *port;
	/* target, before m is known: the port whose own listener (KubeVirt mode) accepted it */
	struct px_port *lport;
	uint32_t seq;
	enum conn_state st;
	bool raw;	     /* a stock peer's connection: no preamble, no order, stock teardown */
	int lfd;	     /* local unix socket, -1 until there is one */
	struct xp_conn *hop; /* node hop while set up; NULL once linked (the data path's) */
	struct xp_conn_info tls; /* after the handshake: what it runs on */
	struct xp_watch *w;
	struct xp_timer *t;
	uint8_t buf[PX_PREAMBLE_MAX];
	size_t len, off;
	struct xp_link *link;
	struct px_dpdk
		dpdk; /* over the DPDK node hop: the peer's address, the stream (ip 0: not) */
	bool dpdk_offered; /* source: its preamble offered the DPDK node hop */
	bool dpdk_resume_offered; /* ... and to resume it over the kernel path */
	/* source: its preamble asked to send compressed chunks (PX_PREAMBLE_F_COMPRESS); target:
	 * it agreed, so its link decodes them */
	bool zout_offered, zin;
	bool zdpdk_offered; /* source: ... and on the DPDK node hop (PX_PREAMBLE_F_COMPRESS_DPDK) */
	/* source: the compression state last logged (px_sample.c), and when */
	bool zlogged_on;
	unsigned int zlogged_why;
	uint64_t zlogged_ms;
	char peer[80];
	char addr[64];	      /* target: the peer's address, no port (peer without it) */
	uint64_t accepted_ms; /* target, before its preamble: when it was accepted */
	bool heard;	      /* ... whether it has sent anything yet */
	struct px_insp *insp; /* the QEMU stream's direction, once linked (--no-inspect: NULL) */
	/*
	 * digest: its bytes are digested and the two nodes compare them at its end (px_verify.c).
	 * verify: not a QEMU connection but the report on connection (port, seq) that ended: the
	 * source sends it (C_SRC_*), the target answers it; dg is the source's digests.
	 */
	bool digest, verify;
	struct px_digests dg;
	struct vm_rate rate[2];
	uint64_t pacing; /* SO_MAX_PACING_RATE last asked for */
	/*
	 * Resumable (both vmigd agreed: PX_OK_RESUMABLE, px_resume.c): its link outlives a failed
	 * node hop, suspended from suspended_ms until a new connection carries it on or
	 * --resume-timeout (timer rt) fails the migration. token: the target's, for it. have,
	 * kept_from, kept_to: the data path's suspension report. resumer: the connection that is
	 * to carry it on (the source's attempt, the target's arrival); resumes: on that one, whose.
	 */
	bool resumable, suspended;
	bool resuming; /* not a QEMU connection: one that is to carry a resumable one on */
	uint8_t token[PX_TOKEN_LEN];
	uint64_t suspended_ms, have, kept_from, kept_to;
	uint64_t peer_have; /* on a target's resumer: the source's offset */
	bool refused;	    /* on a source's resumer: its connect was refused (ECONNREFUSED) */
	uint64_t refused_ms; /* since when every attempt was refused; 0: the last was not */
	unsigned int resumptions, attempts;
	uint64_t unhopped_ms, replayed;
	/* times its DPDK path failed and the kernel path carried it on; fell_back: the
	 * suspension report that follows is of the link that does */
	unsigned int fallbacks;
	bool fell_back;
	/* its migration moves to another vmigd: its link asked to hold still, and holds still;
	 * adopted: moved here from another vmigd */
	bool quiescing, quiesced, adopted;
	char lost[160];
	struct px_conn *resumer, *resumes;
	struct xp_timer *rt;
	struct vm_list node; /* in its migration's conns, or (m NULL) the node's unbound */
};

struct px_port {
	struct px_migration *m;
	uint32_t id;
	char path[108];
	int lfd; /* source: the unix listener; target in KubeVirt mode: its own TCP listener */
	struct xp_watch *w;
	unsigned int tcp;	/* target: lfd's TCP port; source: the port it dials */
	struct xp_addr peer;	/* source: where it dials */
	uint32_t next_seq;	/* source: next sequence number to hand out */
	struct px_order *order; /* target */
	uint64_t bytes[2];	/* of its ended connections */
	unsigned int conns_total;
	struct vm_rate rate[2];
};

/* What differs between the roles where a migration's lifecycle closes its ports. */
struct px_role_ops {
	/* The role's part of closing port p, once its listener's fd is closed. */
	void (*port_closed)(struct px_port *p);
	/* Whether a stop leaves m's port listeners open until its record goes. */
	bool (*stop_keeps_ports)(const struct px_migration *m);
};
extern const struct px_role_ops px_source_ops, px_target_ops;

struct px_migration {
	struct px_node *n;
	char key[PX_KEY_MAX + 1];
	enum px_role role;
	const struct px_role_ops *ops; /* role's */
	bool kubevirt;		  /* target: per-port listeners; source: given KubeVirt's map */
	bool tls;		  /* its node hop is TLS */
	struct px_start opts;	  /* as started: an identical start again changes nothing */
	struct px_portmap target; /* source: the map it was given */
	unsigned int nports;
	struct px_port ports[PX_PORTS_MAX];
	int dirfd; /* source: its sockets' directory (migrationproxy/), -1 until made */
	struct xp_addr peer;
	char peer_str[80];
	/* Target: the secret its source must present, and the peer its first connection came
	 * from (address, and certificate subject under TLS); later ones must match. */
	uint8_t secret[PX_SECRET_LEN];
	bool peer_bound;
	char peer_addr[64];
	char peer_name[160];
	uint64_t started_ms;
	struct vm_list conns; /* of struct px_conn */
	unsigned int conns_total, conns_active, conns_failed, conns_cut, conns_reordered;
	uint64_t bytes[2];
	uint64_t undelivered; /* dropped because the local side had closed (see px_conn_done) */
	unsigned int conns_short; /* main channels that ended before QEMU's switchover */
	char short_why[240];	  /* the first one's story */
	bool failed, stopping;
	enum px_outcome end_note; /* px_migration_note_end(); PX_OUT_COMPLETED: none */
	char error[200];
	uint64_t cap;		  /* bytes/s; 0: none */
	uint64_t limit;		  /* what the bucket (or pacing) holds it to now; 0: none */
	bool cap_lifted;	  /* switchover seen: the cap no longer applies */
	struct xp_bucket *bucket; /* its direction to the peer, all connections */
	uint64_t held_seen;	  /* xp_bucket_held() at the last tick */
	double pace_gain;	  /* pacing: sum of paces over the limit, corrected once a second */
	uint64_t pace_limit;	  /* the limit pace_gain was last corrected for */
	uint64_t pace_next_ms;	  /* when to correct it next */
	uint64_t shaped_ns_done;  /* of ended connections */
	struct px_insp_summary insp_done; /* counters of ended connections */
	struct vm_rate rate[2];
	struct xp_timer *order_timer;
	struct xp_timer *stop_timer;
	struct px_verify v;  /* digests of its connections, compared with the peer's */
	/* resumable connections: of ended ones, resumptions, bytes sent again, time without a
	 * node hop, falls back from DPDK to the kernel path; refused resumptions (forged or
	 * stale) */
	unsigned int resumptions, resume_refused, fallbacks;
	uint64_t replayed, unhopped_ms;
	bool unresumable; /* a connection was carried that is not resumable */
	/* compression: every chunk from now on (convergence's rung; px_compress_mode());
	 * ended connections' figures; what the node hop carried (wire bytes) */
	bool zforced;
	struct px_zinfo zdone;
	struct vm_rate wire;
	/*
	 * Moving to the vmigd taking over (px_move.c): moving while its links quiesce (quiet
	 * counts those still to), until move_timer gives up; moved once the other has it: its
	 * links end here without a trace (moved_to says where it went).
	 */
	bool moving, offered, moved; /* offered: described, the other vmigd's answer awaited */
	unsigned int quiet;
	struct xp_timer *move_timer;
	px_move_fn move_fn;
	void *move_arg;
	char moved_to[64];
	struct vm_list node; /* in its node's migrations, or stopped once stopping */
};

struct px_node {
	const struct xp_io_ops *io; /* the layer below */
	void *ioc;		    /* its context */
	struct xp_io *own_io;	    /* the real one, when px_node_new() was handed it */
	struct px_config conf;
	int lfd;
	struct xp_watch *lw;
	struct xp_addr bound;
	char listen_str[80];
	char advertise[PX_HOST_MAX];
	struct vm_list migrations; /* of struct px_migration, live */
	struct vm_list stopped; /* ... stopped, waiting for the data path to return their links */
	/* of struct px_conn: target connections before their preamble: unauthenticated */
	struct vm_list unbound;
	unsigned int nunbound;
	unsigned int unauth_refused; /* since the last log line about them */
	uint64_t unauth_logged_ms;
	struct vm_log_limit refusals; /* lines about refused node-hop connections */
	struct vm_log_limit accept_errors;
	uint64_t accept_paused; /* listener pauses for want of fds, since start */
	bool draining;
	bool retiring;	  /* handed over to another vmigd: ends once what it carries has ended */
	char **elsewhere; /* target keys that stayed with the vmigd this one took over from */
	unsigned int nelsewhere;
	char elsewhere_who[64];
	struct xp_bucket *bucket; /* the node cap (rate 0: none) */
	struct px_dpdk dpdk;	  /* this node's DPDK node hop (ip 0: none); stream unused */
	uint32_t dpdk_next;	  /* the stream id the next offer proposes */
	struct xp_hop_health dpdk_seen; /* the hop's health as last logged (px_dpdk.c) */
	uint64_t dpdk_fallbacks; /* connections the kernel path carried on, since start */
	struct xp_timer *tick;
	uint64_t bytes_done[2]; /* of ended connections */
	uint64_t conns_total;
	uint64_t verified[PX_VERIFIED_N]; /* connections with digests, by what the check found */
	unsigned int ended[2][PX_OUT_N];  /* migrations by role and outcome */
	unsigned int tls_refusals[PX_TLS_REFUSALS];
	unsigned int resume_refused; /* resumptions turned away (forged, stale or unknown) */
	struct vm_rate rate[2];
	struct xp_timer *drain_timer;
	void (*drain_done)(void *arg);
	void *drain_arg;
	/* Something may have ended (a connection, a migration's last link): px_node_housekeep() is
	 * due, on hk, a timer due at once, so at the end of the loop's pass. */
	bool dirty;
	struct xp_timer *hk;
};

/*
 * Walks both lists of a node's migrations, the live ones, then the stopped ones still waiting for
 * their links: for (m = px_next_any(n, NULL); m; m = px_next_any(n, m)).
 */
static inline struct px_migration *px_next_any(const struct px_node *n,
					       const struct px_migration *m)
{
	const struct vm_list *at = m ? m->node.next : n->migrations.next;

	if (at == &n->migrations)
		at = n->stopped.next;
	return at == &n->stopped ? NULL : vm_list_entry(at, struct px_migration, node);
}

/* Whether a and b hold the same len bytes, in time that does not depend on where they differ
 * (a peer's secret or token against ours). */
static inline bool px_same_secret(const uint8_t *a, const uint8_t *b, size_t len)
{
	uint8_t d = 0;

	for (size_t i = 0; i < len; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

/* Counts a TLS refusal of a node-hop connection (why: the transport's xp_conn_why). */
static inline void px_count_refusal(struct px_node *n, const struct xp_conn_why *why)
{
	if (why->token && why->refusal < XP_TLS_REFUSALS)
		n->tls_refusals[why->refusal]++;
}

/* Counts a refusal of the node's own (PX_REFUSAL_HANDSHAKE_TIMEOUT, PX_REFUSAL_SILENT). */
static inline void px_count_refusal_of(struct px_node *n, unsigned int r)
{
	n->tls_refusals[r]++;
}

/* The transport's clock, which a test's fake transport sets. */
static inline uint64_t px_now(const struct px_node *n)
{
	return n->io->now_ms(n->ioc);
}

/* px_conn.c: connections of either role */
/* A target connection that passed its preamble moves from the node's unbound list to port's
 * migration, as connection seq in state st; its watch and timer go. */
void px_conn_adopt(struct px_conn *c, struct px_port *port, uint32_t seq, enum conn_state st);
/* Frees a connection that is not (or no longer) carried by the data path. */
void px_conn_free(struct px_conn *c);
/* Frees it and marks the node dirty: its migration may finish, a drain may end (both checked
 * by px_node_housekeep(), after the handler that called this has returned). */
void px_conn_release(struct px_conn *c);
/* Whether this connection can go over the DPDK node hop: the node has one, the peer is a vmigd,
 * and the node hop is plain or TLS 1.3. */
bool px_dpdk_can(const struct px_conn *c);
/* Whether a new connection to the peer's DPDK address peer_ip (host order) takes the DPDK node
 * hop now: the port's link up and the peer not found unreachable (px_dpdk.c). A change is logged
 * first, so that the connection's path=kernel follows its reason. */
bool px_dpdk_usable(struct px_node *n, uint32_t peer_ip);
/* From the tick: logs a change of the hop's health once it lasts (px_dpdk.c). */
void px_dpdk_watch(struct px_node *n);
/* An XP_END_FALLBACK report: c goes on over the kernel path, or fails (px_dpdk.c). */
void px_dpdk_fallback(struct px_conn *c, const struct xp_link_result *res);
/* Writes the preamble's reply (PX_OK_DPDK in place of PX_OK when c->dpdk is set): 0, or -errno
 * (-EIO for a short write). */
int px_conn_reply(struct px_conn *c, enum px_status st);
/* The options a link of c is attached with: its cookie, wire, digests, resumption, caps and
 * inspector (c->insp, if any); the path (DPDK, adopted) is the caller's to add. */
void px_conn_link_opts(const struct px_conn *c, struct xp_link_opts *o);
/* Adds a link's compression figures to a sum. */
void px_zinfo_add(struct px_zinfo *to, const struct xp_zfig *f);
/*
 * Whether a source connection asks to send compressed chunks: always; auto where its bytes pass
 * through user space anyway (TLS, --data-path copy) or a cap (the migration's or the node's) can
 * hold it back. On the plain splice path without a cap auto could never start, and asking would
 * cost both nodes a copy of every byte.
 */
bool px_compress_wanted(const struct px_conn *c);
/* A source's compression: its start's, else the node's. */
enum px_compress px_compress_mode(const struct px_migration *m);
/* Hands both sockets to the data path. 0, or -errno with the connection still ours. */
int px_conn_link(struct px_conn *c);
/* The data path returned a link. */
void px_conn_done(void *cookie, const struct xp_link_result *res, void *arg);

/* px_verify.c: the end-of-connection digest check */
/* The data path returned a link with digests: a source reports them, a target keeps them. True
 * when c lives on (as a source's report), false when the caller may release it. */
bool px_verify_ended(struct px_conn *c, const struct xp_link_result *res);
/* Source: the target's answer to c's report is in c->buf (c->len bytes); c is released. */
void px_verify_answered(struct px_conn *c);
/* Source: c's report got no answer (why); it counts as unverified and c is freed, without
 * finishing the migration when quiet (a teardown's walk). */
void px_verify_lost(struct px_conn *c, const char *why, bool quiet);
/* Target: a report arrived on c for port (preamble p, authenticated); it is answered now or
 * when the connection it names ends. */
void px_verify_arrive(struct px_conn *c, struct px_port *port, const struct px_preamble *p);
/* A target's migration record, live or stopped and waiting for its links or reports. */
struct px_migration *px_verify_find(struct px_node *n, const char *key);
/* Whether the stop line must wait for reports still to come. */
bool px_verify_busy(const struct px_migration *m);
/* The stop line's " verified=M/N digest=..." (or " verified=none") into buf. */
void px_verify_note(struct px_migration *m, char *buf, size_t len);
/* Frees the records and the timer, when the migration's record goes. */
void px_verify_free(struct px_migration *m);
/* Source: its connection's preamble asks for the check (the target advertised it). */
bool px_verify_wanted(const struct px_conn *c);
/* Source: sends connection c's report: connect, TLS, preamble (px_source.c). */
void px_source_connect(struct px_conn *c);

/* px_resume.c: resumable connections */
/* Source: whether c's preamble offers resumption (the target advertised it, no stock peer). */
bool px_resume_wanted(const struct px_conn *c);
/* The data path suspended c's link (res: XP_END_SUSPENDED). */
void px_resume_suspended(struct px_conn *c, const struct xp_link_result *res);
/* Source: the reply to resumer r is in r->buf (r->len bytes). */
void px_resume_answered(struct px_conn *r);
/* Source: resumer r failed before a reply (why); the next attempt follows. */
void px_resume_failed(struct px_conn *r, const char *why);
/* Target: a resumption arrived on c for port (preamble p, its secret and peer checked). */
void px_resume_arrive(struct px_conn *c, struct px_port *port, const struct px_preamble *p);
/* Target: suspended o's resumer is there: reply, and o goes on over its connection. */
void px_resume_go(struct px_conn *o);
/* c's link ended for good: a resumption waiting for it is turned away. */
void px_resume_ended(struct px_conn *c);
/* c goes: its ties to a resumer, or to the connection it resumes, and its timer go first. */
void px_resume_forget(struct px_conn *c);

/* px_move.c: moving a migration to another vmigd */
/* c's link reported XP_END_QUIESCED (res->err: 0, or it cannot). */
void px_move_quiesced(struct px_conn *c, const struct xp_link_result *res);
/* c's link was suspended or ended while its migration was moving: the move is off. */
void px_move_off(struct px_migration *m, const char *why);
/* px_migration_finish() of a moved migration: a line saying where it went, instead of the stop
 * line (the rest of the finish is the same). */
void px_move_finish(struct px_migration *m);

/* px_migration.c: the lifecycle of a migration */
struct px_migration *px_migration_new(struct px_node *n, const char *key, enum px_role role);
/* A migration that never started: nothing was linked, nothing to log. */
void px_migration_discard(struct px_migration *m);
struct px_migration *px_migration_find(struct px_node *n, const char *key, enum px_role role);
/* Checks of start's arguments: 0 or -errno with one line for the operator in err. */
int px_check_key(struct px_node *n, const char *key, char *err, size_t errlen);
int px_check_path(const char *path, char *err, size_t errlen);
int px_check_ports(unsigned int nports, const uint32_t *ids, char *err, size_t errlen);
/* Fails it once: logs why and cuts every connection. */
void px_migration_fail(struct px_migration *m, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Drops connections still being set up; with links, cuts those being carried too. */
void px_migration_cut(struct px_migration *m, bool links);
/* A stopping migration whose connections and reports are all gone is finished (housekeeping). */
void px_migration_maybe_finish(struct px_migration *m);
void px_migration_finish(struct px_migration *m);
void px_migration_stop(struct px_migration *m);
void px_port_close(struct px_port *p);
/* A source port's socket, by its name in its migration's dirfd. */
static inline const char *px_port_name(const struct px_port *p)
{
	const char *slash = strrchr(p->path, '/');

	return slash ? slash + 1 : p->path;
}
const char *px_cap_note(uint64_t cap, char *buf, size_t len);

/* The migration's TLS as asked for, checked against the daemon's; 0 or -errno with err. */
int px_tls_choose(struct px_node *n, enum px_tls tls, bool *ret, char *err, size_t errlen);

/* px_source.c, px_target.c: the roles */
void px_source_accept(struct xp_watch *w, int lfd, uint32_t events, void *arg);
/* The node-hop listener's (lport NULL), or a KubeVirt-mode port's own. */
void px_target_accept(struct xp_watch *w, int lfd, uint32_t events, void *arg);
void px_target_accept_port(struct xp_watch *w, int lfd, uint32_t events, void *arg);

/* px_caps.c: caps, node shares and pacing */
void px_migration_apply_limit(struct px_migration *m, uint64_t limit);
void px_migration_set_cap_now(struct px_migration *m, uint64_t cap);
void px_migration_pace(struct px_migration *m);
void px_node_share(struct px_node *n);

/* px_sample.c: meters and what status and metrics read */
void px_node_tick(void *arg);

/* px_node.c */
/*
 * Housekeeping: what a handler may have ended is checked once, at the end of the loop's pass,
 * never from inside the handler (which may still hold the connection, its port or migration).
 * px_node_dirty() asks for it; px_node_housekeep() finishes stopped migrations that are done,
 * then ends a drain or retirement that is. Neither frees anything a caller holds.
 */
void px_node_dirty(struct px_node *n);
void px_node_housekeep(struct px_node *n);

#endif
