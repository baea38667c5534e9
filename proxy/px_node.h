/* SPDX-License-Identifier: Apache-2.0 */
/* A node's migrations: target listeners (node-hop TCP in, ordered connects to local unix
 * sockets) and source listeners (unix sockets in, node-hop TCP out with a preamble). Owns the
 * node-hop listener and reaches sockets, TLS and the data path only through transport's ops
 * table (xp_io.h); runs on the control thread's loop. */
#ifndef PX_NODE_H
#define PX_NODE_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "px_inspect.h"
#include "px_portmap.h"
#include "xp_io.h"
#include "xp_loop.h"
#include "xp_sock.h"
#include "xp_tls.h"

struct px_node;
struct xp_tls;

/* How a cap is enforced on the wire (doc/design.md, "Bandwidth caps"). */
enum px_shaper {
	PX_SHAPE_BUCKET, /* token buckets in the data path: per migration and per node */
	PX_SHAPE_PACING, /* SO_MAX_PACING_RATE per node-hop socket, the cap split among them */
};

/*
 * Which connections a source asks the target to compare digests of (px_verify.c): auto, those
 * whose bytes pass through user space anyway (a TLS node hop, the DPDK hop, --data-path copy),
 * where the check costs almost nothing; on, every one to a vmigd peer (on the plain splice path
 * the bytes are read once more for it); off, none. A target always does the check it is asked.
 */
enum px_digest { PX_DIGEST_AUTO, PX_DIGEST_ON, PX_DIGEST_OFF };

/*
 * Compression of what a source sends to a vmigd target, on resumable kernel-path connections
 * (a target that is not off takes it): off; auto, a connection's chunks go compressed while
 * its cap holds it back, its worker has time to spare and they shrink; always.
 */
enum px_compress { PX_COMPRESS_DEFAULT, PX_COMPRESS_OFF, PX_COMPRESS_AUTO, PX_COMPRESS_ALWAYS };

struct px_config {
	struct xp_addr listen;
	char advertise[PX_HOST_MAX]; /* empty: derive from the listen address */
	unsigned int threads;
	unsigned int slots; /* links per worker */
	size_t pipe_size;
	bool copy_path; /* read/write instead of splice (for comparison) */
	bool pin;	/* workers on cpus only */
	cpu_set_t cpus;
	uint64_t order_timeout_ms;
	uint64_t connect_timeout_ms;
	struct xp_tls *tls; /* NULL: plain text (--no-tls); not owned, outlives the node */
	uint64_t handshake_timeout_ms;
	uint64_t preamble_timeout_ms;
	unsigned int max_unauth;	  /* node-hop connections before their preamble */
	unsigned int max_migration_conns; /* per migration and role */
	uint64_t node_bandwidth;	  /* bytes/s this node sends, all migrations; 0: no cap */
	enum px_shaper shaper;
	bool inspect;		     /* read the QEMU stream as it passes (px_inspect) */
	enum px_digest digest;
	bool keep_cap_at_switchover; /* else a migration's cap is lifted once its VM stopped */
	/* With adopt: the node-hop listener is adopt_fd, handed over by the vmigd this one takes
	 * over from (--takeover), and listen is not used. */
	bool adopt;
	int adopt_fd;
	/* A source's sockets and migrationproxy/: this owner (-1: the daemon's), mode 0660/0750. */
	int socket_uid, socket_gid;
	/*
	 * Resumable connections between two vmigd (px_resume.c): how long one waits for its node
	 * hop to come back (0: none are offered or accepted), and what each keeps of what it sent
	 * until the peer says it delivered it.
	 */
	uint64_t resume_timeout_ms;
	size_t resume_keep;
	enum px_compress compress; /* never PX_COMPRESS_DEFAULT */
	int compress_level;	   /* zstd's */
};

/* A migration's TLS: the daemon's (on unless --no-tls), or set per migration. */
enum px_tls { PX_TLS_DEFAULT, PX_TLS_ON, PX_TLS_OFF };

/* A hook on a source migration's local connections (vmigd-test installs one, ctrl/ctl_test.c):
 * hold_ms(arg, port, seq) says, as connection seq of port is accepted, how long to hold its
 * node-hop connect back, in ms (0: not at all). Called on the node's thread. */
struct px_source_hook {
	unsigned int (*hold_ms)(uint64_t arg, uint32_t port, uint32_t seq);
	uint64_t arg;
};

/* What a start asks for besides its key, ports and target. */
struct px_start {
	uint64_t cap;  /* bytes/s; 0: none */
	bool kubevirt; /* target: one TCP listener per logical port, KubeVirt's map */
	enum px_tls tls;
	enum px_compress compress; /* source; PX_COMPRESS_DEFAULT: the node's */
	struct px_source_hook hook; /* source; .hold_ms NULL: none */
	/* target: the migration's secret, given (a takeover moves a target with its own) */
	bool has_secret;
	uint8_t secret[PX_SECRET_LEN];
};

/* Bytes/s over the last second and the last ten, each way. */
struct px_rates {
	uint64_t tx_1s, tx_10s, rx_1s, rx_10s;
};

/* What the inspector found on a migration's connections, summed (live and ended). */
struct px_insp_summary {
	unsigned int main, multifd, other; /* channels of each kind */
	unsigned int bytes_only;	   /* channels where parsing stopped */
	char reason[PX_INSP_REASON_MAX];   /* the first such channel's reason, unless switchover */
	uint32_t stream_version;
	char machine[PX_INSP_MACHINE_MAX];
	uint32_t page_size;
	uint64_t pages, zero_pages, packets, syncs;
	uint64_t passes;	       /* the most any channel began */
	bool dirty_known;	       /* a pass after the first one completed */
	uint64_t dirty_pages_per_pass; /* pages of the last completed pass, all channels */
	uint64_t dirty_rate;	       /* bytes/s: those pages over that pass's duration */
	bool switchover;
	uint64_t ram_total; /* RAM bytes the main channel's setup announced; 0 until seen */
	/*
	 * px_insp_estimate(): RAM still to send, as the stream tells it. In the first pass, the
	 * total less the pages sent so far (remaining_from "first-pass"); once a pass after the
	 * first completed, that pass's pages (a pass resends what the last one let the guest dirty:
	 * "last-pass"). Unknown (remaining_known false, remaining_from NULL) before the total, in
	 * the second pass, after switchover and where a channel stopped parsing.
	 */
	bool remaining_known;
	uint64_t remaining;
	const char *remaining_from;
};

enum px_role { PX_ROLE_SOURCE, PX_ROLE_TARGET };
/* "source" or "target": the one name of a role, in logs, JSON, Prometheus labels and the CLI. */
const char *px_role_str(enum px_role r);

/*
 * How a migration ended, as its stop line's outcome says (px_migration_finish()), for
 * vmigd_migrations_total. The first that holds, in this order: corrupt, aborted-by-vmigd and
 * cancelled (told by the caller, px_migration_note_end(): the convergence watch saw the job end
 * so), failed, stopped (connections in flight cut), connection-errors, cut-short, completed.
 */
enum px_outcome {
	PX_OUT_COMPLETED,
	PX_OUT_CANCELLED,
	PX_OUT_FAILED,
	PX_OUT_CUT_SHORT,
	PX_OUT_STOPPED,
	PX_OUT_CORRUPT,
	PX_OUT_CONN_ERRORS,
	PX_OUT_ABORTED,
	PX_OUT_N,
};
/* "completed", "cancelled", ..., "aborted-by-vmigd": the label values. */
const char *px_outcome_str(enum px_outcome o);

/* TLS refusals by reason: enum xp_tls_refusal's, and two of the node's own timers. */
#define PX_REFUSAL_HANDSHAKE_TIMEOUT XP_TLS_REFUSALS	   /* no complete handshake in time */
#define PX_REFUSAL_SILENT	     (XP_TLS_REFUSALS + 1) /* not a byte in time (target) */
#define PX_TLS_REFUSALS		     (XP_TLS_REFUSALS + 2)
/* The log line's token: xp_tls_refusal_token(), "handshake-timeout", "silent". */
const char *px_tls_refusal_str(unsigned int r);

struct px_port_info {
	uint32_t id;
	char path[108];
	/* target in KubeVirt mode: its listener's TCP port; source: the port it dials; else 0 */
	unsigned int tcp;
	unsigned int listen, peer_port; /* the same, by role (status), 0 where not */
	/* filled by px_node_foreach() */
	uint64_t bytes_tx, bytes_rx;
	struct px_rates rate;
	unsigned int conns_active, conns_total;
};

/* Compression (xp_link.h's xp_zfig), of a connection or summed over a migration's, live and
 * ended: plain bytes sent as chunks, the chunks' bytes, the CPU time it took; the same of what
 * came in so and was decoded. */
struct px_zinfo {
	uint64_t tx_plain, tx_wire, tx_ns;
	uint64_t rx_plain, rx_wire, rx_ns;
	unsigned int flips; /* times a connection turned it on or off */
};

struct px_conn_info {
	uint32_t port, seq;
	const char *state;	     /* "connecting", "handshake", ..., "linked" */
	const char *tls;	     /* "TLSv1.3", or NULL in plain text */
	const char *cipher;	     /* with tls */
	const char *crypto;	     /* "user-space", "ktls", "ktls-tx" */
	bool resumed;		     /* the TLS session was resumed from a ticket */
	bool raw;		     /* a stock peer's: no preamble, first end of stream ends it */
	const char *path;	     /* "dpdk" (the DPDK node hop, agreed), else "kernel" */
	uint64_t bytes_tx, bytes_rx; /* so far, while linked */
	struct px_rates rate;
	uint64_t shaped_ms; /* time it waited for tokens */
	uint64_t pacing;    /* SO_MAX_PACING_RATE set on it, bytes/s; 0: none */
	bool inspected;	    /* insp is valid */
	struct px_insp_stats insp;
	/* resumable (both vmigd agreed): without a node hop now (suspended), how often it was
	 * resumed, the bytes it sent again, its time without a node hop, what it keeps now */
	bool resumable, suspended;
	unsigned int resumptions;
	uint64_t replayed, unhopped_ms, kept;
	unsigned int fallbacks; /* times its DPDK path failed and the kernel path carried it on */
	/* compression: it may send chunks (zmode: "auto", "always") or take them ("in"), NULL:
	 * neither; compressing now, the last decision's reason, its worker's idle share then,
	 * the recent chunks' size as a share of their plain bytes */
	const char *zmode;
	bool zon;
	const char *zwhy;
	unsigned int zidle_pct, zratio_pct;
	struct px_zinfo z;
};

/* A migration's resumable connections, live and ended (px_resume.c). */
struct px_resume_info {
	unsigned int conns;	   /* carried now and resumable */
	unsigned int suspended;	   /* ... without a node hop now */
	unsigned int resumptions;  /* resumed so far */
	unsigned int fallbacks;	   /* carried on over the kernel path when DPDK failed */
	unsigned int refused;	   /* target: resumptions turned away (forged, stale, unknown) */
	uint64_t replayed;	   /* bytes sent again after resumptions */
	uint64_t unhopped_ms;	   /* time without a node hop, summed over connections */
	uint64_t kept;		   /* bytes kept now for the peer */
	bool all;		   /* every connection carried so far is resumable (one at least) */
};

struct px_migration_info {
	const char *key;
	enum px_role role;
	unsigned int nports;
	struct px_port_info ports[PX_PORTS_MAX];
	const char *peer;	   /* source: the target's node-hop address */
	const char *peer_host;	   /* the peer's address alone (source: the target's; target: its
				      first connection's); NULL until known */
	uint64_t started_ms;	   /* vm_now_ms() at start */
	unsigned int conns_total;  /* connections carried so far (linked) */
	unsigned int conns_active; /* being set up or carried now */
	unsigned int conns_failed;
	unsigned int conns_reordered; /* target: arrived before a predecessor and waited */
	/* Ended connections with digests: the peer's matched, differed, or could not be had. */
	unsigned int conns_verified, conns_corrupt, conns_unverified;
	uint64_t bytes_tx;	      /* local -> peer */
	uint64_t bytes_rx;	      /* peer -> local */
	const char *state;	      /* "active", "failed" */
	const char *error;	      /* the failure's reason, or NULL */
	unsigned int nconns;	      /* conns[]: one per connection open now */
	const struct px_conn_info *conns;
	struct px_rates rate;
	uint64_t cap;	    /* bytes/s set for this migration; 0: none */
	uint64_t limit;	    /* what it may send now: cap, node share, or 0 (none) */
	bool cap_lifted;    /* at switchover */
	uint64_t shaped_ms; /* time its connections waited for tokens, summed */
	const char *mode;   /* "plain", "tls", "ktls" (any connection with kTLS) */
	bool kubevirt;	    /* per-port listeners (target) or KubeVirt's map (source) */
	bool tls;	    /* its node hop is TLS */
	bool inspected;
	struct px_insp_summary insp;
	struct px_resume_info resume;
	/* compression: the source's mode ("off", "auto", "always"; NULL on a target), its
	 * connections compressing now, the figures, and bytes/s on the node hop (what the
	 * connections sent, chunks counted as sent) over the last second and ten */
	const char *zmode;
	unsigned int zconns, zconns_on; /* carried now that may compress, and do */
	struct px_zinfo z;
	uint64_t wire_tx, wire_1s, wire_10s;
};

struct px_node_info {
	uint64_t bandwidth; /* node cap, bytes/s; 0: none */
	enum px_shaper shaper;
	bool inspect;
	const char *digest; /* px_digest_str() */
	uint64_t bytes_tx, bytes_rx; /* all migrations since start */
	/* connections since start whose digests the peer's matched, differed, could not be had */
	uint64_t verified, corrupt, unverified;
	struct px_rates rate;
	unsigned int migrations, conns_active;
	uint64_t conns_total;
	/* The DPDK node hop, when the node has one (on): its frames, what the reliable transport
	 * resent, what the sealing and the parser refused, and how often its thread slept, as the
	 * transport counts them (the io's hop_stats). */
	struct {
		bool on, sealed;
		char address[24]; /* "ADDR:UDP" */
		struct xp_hop_stats stats;
		uint64_t fallbacks; /* connections the kernel path carried on when DPDK failed */
	} dpdk;
	/* migrations ended since start, by role and outcome */
	unsigned int ended_source[PX_OUT_N], ended_target[PX_OUT_N];
	/* node-hop connections TLS refused since start, by reason (px_tls_refusal_str()) */
	unsigned int tls_refusals[PX_TLS_REFUSALS];
	unsigned int resume_refused; /* resumptions turned away since start */
	/* with TLS: when the node's certificate and the CA bundle's first one expire (notAfter,
	 * Unix seconds; 0: not known) */
	struct {
		bool on;
		int64_t node_expiry, ca_expiry;
	} tls;
};

/* On the real transport (xp_io_new(): sockets, OpenSSL, the io_uring pool, maybe a DPDK hop),
 * which the node owns from the call on, even when it fails. */
int px_node_new(struct xp_io *io, const struct px_config *conf, struct px_node **ret);
/* On a transport of the caller's (tests): io and its context outlive the node. */
int px_node_new_io(const struct xp_io_ops *io, void *ioc, const struct px_config *conf,
		   struct px_node **ret);
/* Aborts whatever is left. Takes NULL. */
void px_node_free(struct px_node *n);
const char *px_node_listen_str(const struct px_node *n);
const char *px_node_advertise(const struct px_node *n);
unsigned int px_node_threads(const struct px_node *n);
/* "io_uring+splice", "io_uring+copy", or with TLS "io_uring+openssl" / "io_uring+ktls". */
const char *px_node_data_path(const struct px_node *n);
unsigned int px_node_migrations(const struct px_node *n);
unsigned int px_node_active_conns(const struct px_node *n);

/*
 * All return 0 or -errno with one line for the operator in err. Starts are idempotent, as
 * KubeVirt's ProxyManager: the same key with the same arguments again changes nothing and
 * answers the same; with other arguments the old listeners stop (as stop) and new ones start.
 */
int px_target_start(struct px_node *n, const char *key, unsigned int nports,
		    const struct px_port_info *ports, const struct px_start *opts,
		    struct px_portmap *out, char *err, size_t errlen);
int px_target_stop(struct px_node *n, const char *key, char *err, size_t errlen);
/* out receives the created socket paths (and the ports dialled), in the order of t->ports. */
int px_source_start(struct px_node *n, const struct px_portmap *t, const char *dir,
		    const struct px_start *opts, struct px_port_info *out, char *err,
		    size_t errlen);
/* Changes a running migration's cap, in every role this node has it in; 0 lifts it. */
int px_migration_set_cap(struct px_node *n, const char *key, uint64_t cap, char *err,
			 size_t errlen);
/* Changes the node's cap; 0 lifts it. */
void px_node_set_bandwidth(struct px_node *n, uint64_t rate);
void px_node_info(struct px_node *n, struct px_node_info *out);
const char *px_shaper_str(enum px_shaper s);
/* "auto", "on", "off" */
const char *px_digest_str(enum px_digest d);
const char *px_compress_str(enum px_compress c);
/* Convergence's rung: a source migration in --compress auto compresses every chunk from now
 * on, its connections carried now and those to come (logged). Unknown keys: nothing. */
void px_migration_compress_all(struct px_node *n, const char *key);
/* A compression decision's reason (enum xp_zwhy), in words. */
const char *px_zwhy_str(unsigned int why);
int px_source_stop(struct px_node *n, const char *key, char *err, size_t errlen);
/* Fails the migration now, as an error of its own would: why is logged and shown in status,
 * every connection is cut (QEMU sees its migration fail). 0, or -ENOENT; one that failed
 * already is left as it is. */
int px_migration_abandon(struct px_node *n, const char *key, enum px_role role, const char *why);
/* What the caller knows of how the migration ended (PX_OUT_CANCELLED, PX_OUT_ABORTED), before
 * or right after its stop: its stop line counts it so unless corrupt. 0, or -ENOENT. */
int px_migration_note_end(struct px_node *n, const char *key, enum px_role role, enum px_outcome o);
/* Whether the node-hop listener is open (false after a drain or retire). */
bool px_node_listening(const struct px_node *n);

typedef void (*px_migration_fn)(const struct px_migration_info *mi, void *arg);
void px_node_foreach(struct px_node *n, px_migration_fn fn, void *arg);

/*
 * Takeover (doc/design.md, "Upgrades without losing a migration"). The node-hop listener, to
 * hand to the vmigd that takes over; -1 after a drain or retire.
 */
int px_node_listen_fd(const struct px_node *n);
/* Connections the node-hop listener accepted whose preamble has not come yet (a takeover waits
 * for them: one may be a pending target's first). */
unsigned int px_node_unbound_shared(const struct px_node *n);
/* Stops (or resumes) accepting on the node-hop listener, which stays open. 0 or -errno. */
int px_node_listen_pause(struct px_node *n, bool pause);
/* A target's secret (to move it to another vmigd): 0, or -ENOENT with no such target. */
int px_target_secret(struct px_node *n, const char *key, uint8_t out[PX_SECRET_LEN]);
/*
 * Forgets a migration that has never had a connection, now started on the vmigd named by to,
 * without touching its sockets: 0, -ENOENT, or -EBUSY when it has had connections.
 */
int px_migration_hand_over(struct px_node *n, const char *key, enum px_role role, const char *to);

/*
 * Moving a live migration to the vmigd taking over (doc/design.md, "Upgrades without losing a
 * migration"): every connection resumable and carried, none ended or in set-up. The old vmigd
 * quiesces its links (nothing held, everything acknowledged and delivered), describes them in a
 * struct px_move with QEMU's sockets, the source's listeners and socket directory as fds (still
 * its own: the caller passes copies on), and the new one adopts it: its links start suspended
 * and resume over new node-hop connections, as after a failed one. The old one then lets go.
 */
#define PX_MOVE_CONNS_MAX 48
struct px_move_conn {
	uint32_t port, seq;
	int fd; /* QEMU's socket */
	uint8_t token[PX_TOKEN_LEN];
	bool digest;
	char peer[80];
	char addr[64];
	struct xp_link_state st;
};

struct px_move {
	char key[PX_KEY_MAX + 1];
	enum px_role role;
	bool tls;
	uint64_t cap;
	uint64_t age_ms; /* since it started, for its duration */
	/* target: its secret, and the source that came (address, certificate subject) */
	uint8_t secret[PX_SECRET_LEN];
	char peer_addr[64];
	char peer_name[160];
	/* source: the target's map, and the directory of its sockets */
	struct px_portmap target;
	int dirfd;
	unsigned int nports;
	struct {
		uint32_t id;
		char path[108];
		int lfd;	   /* source: the unix listener */
		uint32_t next_seq; /* source: the next to hand out; target: the next in order */
	} ports[PX_PORTS_MAX];
	unsigned int nconns;
	struct px_move_conn conns[PX_MOVE_CONNS_MAX];
};

/* The old side's answer: mv ready (the callee may keep it until px_migration_move_end), or NULL
 * with why it cannot move; then it carries on here, as before. */
typedef void (*px_move_fn)(void *arg, const char *key, enum px_role role, struct px_move *mv,
			   const char *why);
/* Quiesces migration (key, role) for a move; fn follows, within PX_MOVE_QUIESCE_MS. 0, or
 * -ENOENT / -EBUSY with why (it cannot move; nothing changed). */
#define PX_MOVE_QUIESCE_MS 3000
int px_migration_move_begin(struct px_node *n, const char *key, enum px_role role, px_move_fn fn,
			    void *arg, char *why, size_t whylen);
/* After fn's mv: moved (the new vmigd has it: its links here end, its sockets stay) to to, or
 * not (its links go on here). mv is freed. */
void px_migration_move_end(struct px_node *n, struct px_move *mv, bool moved, const char *to);
/* New side: carries mv on here, from whom (for the log); 0, or -errno with err (the old vmigd
 * carries it on then). Each fd of mv it took is -1 in mv after, success or not: the caller
 * closes the rest. */
int px_migration_adopt(struct px_node *n, struct px_move *mv, const char *from, char *err,
		       size_t errlen);

/*
 * After a takeover, on the vmigd that handed over: closes its copy of the node-hop listener,
 * keeps the migrations it carries (and their own listeners) until none has a connection or is
 * waiting for its first, then calls done; after timeout_s the rest are cut first. Starts are
 * refused from here on.
 */
void px_node_retire(struct px_node *n, unsigned int timeout_s, void (*done)(void *arg), void *arg);
/*
 * On the vmigd that took over: the keys of target migrations that stayed with the one it took
 * over from (who says which, for the log). A node-hop connection for one is refused with a line
 * that says so. keys NULL (nkeys 0) clears the list. 0 or -ENOMEM.
 */
int px_node_set_elsewhere(struct px_node *n, const char *const *keys, unsigned int nkeys,
			  const char *who);
/* Who has key's migration, if it stayed elsewhere at a takeover; NULL if not. */
const char *px_node_elsewhere(const struct px_node *n, const char *key);

/*
 * Stops taking new connections (listeners close, sockets are removed) and calls done once no
 * connection is left, or after timeout_s, when the rest are cut first.
 */
void px_node_drain(struct px_node *n, unsigned int timeout_s, void (*done)(void *arg), void *arg);

#endif
