// SPDX-License-Identifier: Apache-2.0
/* The figure tables (ctl_figures.h): one line per figure, in the order JSON, Prometheus and
 * vmigctl show them. To add a figure, add its line here; nothing else lists figures. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_figures.h"
#include "util.h"

#define GAUGE	"gauge"
#define COUNTER "counter"

/* Each table below sets OBJ to the struct it describes. The macros read as the table does, one
 * entry to a line, which clang-format would take apart. */
/* clang-format off */
#define MEMBER(m)		CTL_MEMBER(OBJ, m)
#define FIELD(m)		.get = MEMBER(m)
#define STR_OR(m, d)		.get = { .type = CTL_C_STR, .off = offsetof(OBJ, m), .dflt = d }
/* An enum is read as an int: the array size refuses to compile for one of another size. */
#define ENUM_OFF(m)		(offsetof(OBJ, m) + \
				 0 * sizeof(char[sizeof(((OBJ *)0)->m) == sizeof(int) ? 1 : -1]))
#define ENUM(m, n)		.get = { .type = CTL_C_ENUM, .off = ENUM_OFF(m), .names = n }
#define COUNTS(m, n, a, b)	.get = { .type = CTL_C_COUNTS, .off = offsetof(OBJ, m), \
					 .names = n, .first = a, .last = b }
#define CALC(fn)		.get = { .type = CTL_C_CALC, .calc = fn }
#define NULL_EMPTY		.absent = CTL_NULL
#define OMIT_EMPTY		.absent = CTL_OMIT
#define NULL_UNLESS(m)		.absent = CTL_NULL, .when = MEMBER(m)
#define OMIT_UNLESS(m)		.absent = CTL_OMIT, .when = MEMBER(m)
/* A DPDK node hop figure: the transport's own count (struct xp_hop_stats), on a node with one. */
#define DPDK(m)			FIELD(dpdk.stats.m), OMIT_UNLESS(dpdk.on)
#define OMIT_IF(m)		.absent = CTL_OMIT, .when = { .type = CTL_CTYPE(((OBJ *)0)->m), \
					.off = offsetof(OBJ, m), .negate = true }
#define SAMPLE_UNLESS(m)	.absent = CTL_NO_SAMPLE, .when = MEMBER(m)
#define GROUP_NULL_UNLESS(m)	.group_when = MEMBER(m)
#define PROM(n, t, h)		.prom = { .name = n, .type = t, .help = h }
#define PROM_L(n, t, h, l)	.prom = { .name = n, .type = t, .help = h, .labels = l }
#define PROM_V(n, t, h, l)	.prom = { .name = n, .type = t, .help = h, .label = l }
#define PROM_LV(n, t, h, l, v)	.prom = { .name = n, .type = t, .help = h, .labels = l, .label = v }
#define PROM_RATIO(n, t, h)	.prom = { .name = n, .type = t, .help = h, .percent = true }
#define TEXT(l, f)		.line = l, .text = f
#define NONZERO			.flags = CTL_TXT_NONZERO
#define V1(k)			.v1 = k

/* The four windows of a struct px_rates member, as "rates.tx_1s" ...; family NULL: JSON only. */
#define RATE(m, w, line, text, family, help, labels) \
	{ "rates." #w, CTL_RATE, FIELD(m.w), TEXT(line, text), PROM_L(family, GAUGE, help, labels) }
#define RATES(m, line, family, help) \
	RATE(m, tx_1s, line, ", rate: tx %s (1s)", family, help, "direction=\"tx\",window=\"1s\""), \
	RATE(m, tx_10s, line, " %s (10s)", family, help, "direction=\"tx\",window=\"10s\""), \
	RATE(m, rx_1s, line, ", rx %s (1s)", family, help, "direction=\"rx\",window=\"1s\""), \
	RATE(m, rx_10s, line, " %s (10s)", family, help, "direction=\"rx\",window=\"10s\"")
/* clang-format on */

#define TABLE(name, what, figs) const struct ctl_table name = { what, figs, ARRAY_SIZE(figs) }

/* ---- computed figures ---- */

static bool ms(uint64_t v, struct ctl_value *out)
{
	out->kind = CTL_V_U64;
	out->u = v;
	return true;
}

static bool node_time(const void *obj, const struct ctl_env *env, struct ctl_value *v)
{
	return ms((uint64_t)(env->now_unix * 1000), v);
}

static uint64_t age_ms(const struct px_migration_info *mi, const struct ctl_env *env)
{
	return env->now_ms > mi->started_ms ? env->now_ms - mi->started_ms : 0;
}

/* Compression: the chunks' bytes as a share of their plain bytes, in %; CPU time in ms. */
static bool pct_of(uint64_t part, uint64_t whole, struct ctl_value *out)
{
	if (!whole)
		return false;
	out->kind = CTL_V_U64;
	out->u = (part * 100 + whole / 2) / whole;
	return true;
}

static bool mig_z_ratio(const void *obj, const struct ctl_env *env, struct ctl_value *v)
{
	const struct px_migration_info *mi = obj;

	return pct_of(mi->z.tx_wire, mi->z.tx_plain, v);
}

static bool mig_z_tx_cpu(const void *obj, const struct ctl_env *env, struct ctl_value *v)
{
	return ms(((const struct px_migration_info *)obj)->z.tx_ns / 1000000, v);
}

static bool mig_z_rx_cpu(const void *obj, const struct ctl_env *env, struct ctl_value *v)
{
	return ms(((const struct px_migration_info *)obj)->z.rx_ns / 1000000, v);
}

static bool mig_duration(const void *obj, const struct ctl_env *env, struct ctl_value *v)
{
	return ms(age_ms(obj, env), v);
}

/* The monotonic start moved onto the wall clock, so that a clock step leaves the age alone. */
static bool mig_started(const void *obj, const struct ctl_env *env, struct ctl_value *v)
{
	return ms((uint64_t)(env->now_unix * 1000) - age_ms(obj, env), v);
}

const char *ctl_conv_state(const struct cv_report *r)
{
	return r->irrecoverable	   ? "irrecoverable"
	       : r->finished	   ? "finished"
	       : r->stopped	   ? "stopped"
	       : r->elapsed_ms < 0 ? "waiting"
				   : "watching";
}

static bool conv_state(const void *obj, const struct ctl_env *env, struct ctl_value *v)
{
	const struct cv_report *r = obj;

	v->kind = CTL_V_STR;
	v->s = ctl_conv_state(r);
	return true;
}

/* ---- the tables ---- */

#define MIGRATIONS_HELP                                                                            \
	"Migrations ended since start, by role and by the outcome of their stop line: completed, " \
	"cancelled, failed, cut-short, stopped, corrupt, connection-errors, aborted-by-vmigd."
#define EXPIRY_HELP                                                                                \
	"When the certificate expires (notAfter), Unix time: the node's (cert=node) and the "      \
	"earliest in the CA bundle (cert=ca), read at load and at each reload."

#define OBJ struct px_node_info
static const struct ctl_fig node_figs[] = {
	{ "bandwidth", CTL_CAP, FIELD(bandwidth), TEXT("head", "cap %s"),
	  PROM("vmigd_node_bandwidth_cap_bytes_per_second", GAUGE,
	       "Cap on what this node sends, all migrations together; 0: none.") },
	{ "shaper", CTL_STR, ENUM(shaper, CTL_N_SHAPER), TEXT("head", ", shaper %s") },
	{ "inspect", CTL_BOOL, FIELD(inspect), TEXT("head", ", inspect on|, inspect off") },
	{ "digest", CTL_STR, FIELD(digest), TEXT("head", ", digests %s") },
	{ "bytes_tx", CTL_BYTES, FIELD(bytes_tx), TEXT("bytes", "sent %s"),
	  PROM("vmigd_node_sent_bytes_total", COUNTER,
	       "QEMU stream bytes sent to peers (tx), all migrations since start.") },
	{ "bytes_rx", CTL_BYTES, FIELD(bytes_rx), TEXT("bytes", ", received %s"),
	  PROM("vmigd_node_received_bytes_total", COUNTER,
	       "QEMU stream bytes received from peers (rx), all migrations since start.") },
	RATES(rate, "rate", "vmigd_node_rate_bytes_per_second",
	      "Stream bytes per second over the window, all migrations."),
	{ "conns.active", CTL_COUNT, FIELD(conns_active), TEXT("conns", "connections %s active"),
	  V1("conns_active"),
	  PROM_L("vmigd_node_connections", GAUGE, "Connections being set up or carried now.",
		 "state=\"active\"") },
	{ "conns.total", CTL_COUNT, FIELD(conns_total), TEXT("conns", ", %s total"),
	  V1("conns_total"),
	  PROM("vmigd_node_connections_total", COUNTER, "Connections carried since start.") },
	{ "verified.match", CTL_COUNT, FIELD(verified), TEXT("conns", ", %s verified"),
	  PROM_L("vmigd_node_verified_connections_total", COUNTER,
		 "Connections since start by what comparing their digests with the peer's found: "
		 "the same bytes (match), different bytes (corrupt), or no comparison "
		 "(unverified).",
		 "result=\"match\"") },
	{ "verified.corrupt", CTL_COUNT, FIELD(corrupt), TEXT("conns", ", %s CORRUPT"), NONZERO,
	  PROM_L("vmigd_node_verified_connections_total", COUNTER,
		 "Connections since start by what comparing their digests with the peer's found: "
		 "the same bytes (match), different bytes (corrupt), or no comparison "
		 "(unverified).",
		 "result=\"corrupt\"") },
	{ "verified.unverified", CTL_COUNT, FIELD(unverified), TEXT("conns", ", %s unverified"),
	  NONZERO,
	  PROM_L("vmigd_node_verified_connections_total", COUNTER,
		 "Connections since start by what comparing their digests with the peer's found: "
		 "the same bytes (match), different bytes (corrupt), or no comparison "
		 "(unverified).",
		 "result=\"unverified\"") },
	{ "migration_count", CTL_COUNT, FIELD(migrations), TEXT("conns", ", %s migrations"),
	  V1("migrations"),
	  PROM("vmigd_migrations", GAUGE, "Migrations on this node now, either role.") },
	{ "dpdk.address", CTL_STR, FIELD(dpdk.address), OMIT_UNLESS(dpdk.on),
	  TEXT("dpdk", "DPDK node hop %s") },
	{ "dpdk.sealed", CTL_BOOL, FIELD(dpdk.sealed), OMIT_UNLESS(dpdk.on),
	  TEXT("dpdk", ", sealed|, plain") },
	{ "dpdk.link_up", CTL_BOOL, DPDK(link_up), TEXT("dpdk", ", link up|, link down"),
	  PROM("vmigd_dpdk_link_up", GAUGE,
	       "Whether the DPDK node hop's port link is up (1); while it is down (0), new "
	       "connections take the kernel path.") },
	{ "dpdk.link_restarts", CTL_COUNT, DPDK(link_restarts),
	  TEXT("dpdk", ", port restarted %s times"), NONZERO,
	  PROM("vmigd_dpdk_link_restarts_total", COUNTER,
	       "Restarts of a memif client port whose link stayed down, to try its handshake "
	       "again.") },
	{ "dpdk.fallbacks", CTL_COUNT, FIELD(dpdk.fallbacks), OMIT_UNLESS(dpdk.on),
	  TEXT("dpdk", ", %s connections fell back to the kernel path"), NONZERO,
	  PROM("vmigd_dpdk_fallbacks_total", COUNTER,
	       "Resumable connections whose DPDK path failed and that went on over the kernel "
	       "path from where they stood.") },
	{ "dpdk.unreachable_peers", CTL_COUNT, DPDK(unreachable_peers),
	  TEXT("dpdk", ", %s peers unreachable"), NONZERO,
	  PROM("vmigd_dpdk_unreachable_peers", GAUGE,
	       "Peers a DPDK link failed to without a frame from them (ARP unanswered, or silent): "
	       "new connections to them take the kernel path until they answer ARP again.") },
	{ "dpdk.tx_frames", CTL_COUNT, DPDK(tx_frames), TEXT("dpdk", ", frames out %s"),
	  PROM_L("vmigd_dpdk_frames_total", COUNTER,
		 "Frames the DPDK node hop's port sent (tx) and took in (rx).",
		 "direction=\"tx\"") },
	{ "dpdk.rx_frames", CTL_COUNT, DPDK(rx_frames), TEXT("dpdk", " in %s"),
	  PROM_L("vmigd_dpdk_frames_total", COUNTER,
		 "Frames the DPDK node hop's port sent (tx) and took in (rx).",
		 "direction=\"rx\"") },
	{ "dpdk.tx_bursts", CTL_COUNT, DPDK(tx_bursts),
	  PROM("vmigd_dpdk_tx_bursts_total", COUNTER,
	       "Bursts the DPDK port sent: frames per burst is frames out over this.") },
	{ "dpdk.retransmitted_frames", CTL_COUNT, DPDK(retransmitted_frames),
	  TEXT("dpdk", ", resent %s"),
	  PROM("vmigd_dpdk_retransmitted_frames_total", COUNTER,
	       "Frames the DPDK node hop's reliable transport sent again (found lost).") },
	{ "dpdk.timeouts", CTL_COUNT, DPDK(timeouts), TEXT("dpdk", ", %s timeouts"),
	  PROM("vmigd_dpdk_timeouts_total", COUNTER,
	       "Retransmission timer expiries on the DPDK node hop (congestion window back to one "
	       "frame).") },
	{ "dpdk.fast_recoveries", CTL_COUNT, DPDK(fast_recoveries),
	  TEXT("dpdk", ", %s fast recoveries"),
	  PROM("vmigd_dpdk_fast_recoveries_total", COUNTER,
	       "Losses the DPDK node hop found from acknowledgements (congestion window "
	       "halved).") },
	{ "dpdk.forged", CTL_COUNT, DPDK(forged), TEXT("dpdk", ", forged %s"),
	  PROM_L("vmigd_dpdk_refused_frames_total", COUNTER,
		 "Frames the DPDK node hop refused, by reason; none reaches QEMU.",
		 "reason=\"forged\"") },
	{ "dpdk.replayed", CTL_COUNT, DPDK(replayed), TEXT("dpdk", ", replayed %s"),
	  PROM_L("vmigd_dpdk_refused_frames_total", COUNTER,
		 "Frames the DPDK node hop refused, by reason; none reaches QEMU.",
		 "reason=\"replayed\"") },
	{ "dpdk.too_old", CTL_COUNT, DPDK(too_old), TEXT("dpdk", ", too old %s"),
	  PROM_L("vmigd_dpdk_refused_frames_total", COUNTER,
		 "Frames the DPDK node hop refused, by reason; none reaches QEMU.",
		 "reason=\"too_old\"") },
	{ "dpdk.malformed", CTL_COUNT, DPDK(malformed), TEXT("dpdk", ", malformed %s"),
	  PROM_L("vmigd_dpdk_refused_frames_total", COUNTER,
		 "Frames the DPDK node hop refused, by reason; none reaches QEMU.",
		 "reason=\"malformed\"") },
	{ "dpdk.unknown_stream", CTL_COUNT, DPDK(unknown_stream),
	  TEXT("dpdk", ", unknown stream %s"),
	  PROM_L("vmigd_dpdk_refused_frames_total", COUNTER,
		 "Frames the DPDK node hop refused, by reason; none reaches QEMU.",
		 "reason=\"unknown_stream\"") },
	{ "dpdk.unknown_peer", CTL_COUNT, DPDK(unknown_peer), TEXT("dpdk", ", unknown peer %s"),
	  PROM_L("vmigd_dpdk_refused_frames_total", COUNTER,
		 "Frames the DPDK node hop refused, by reason; none reaches QEMU.",
		 "reason=\"unknown_peer\"") },
	{ "dpdk.polls", CTL_COUNT, DPDK(polls),
	  PROM("vmigd_dpdk_polls_total", COUNTER, "Rounds of the DPDK node hop's thread.") },
	{ "dpdk.sleeps", CTL_COUNT, DPDK(sleeps),
	  PROM("vmigd_dpdk_sleeps_total", COUNTER,
	       "Rounds of the DPDK node hop's thread that ended in a sleep (nothing to do).") },
	{ "migrations_ended.source", CTL_COUNT,
	  COUNTS(ended_source, CTL_N_OUTCOME, PX_OUT_COMPLETED, PX_OUT_N - 1),
	  PROM_LV("vmigd_migrations_total", COUNTER, MIGRATIONS_HELP, "role=\"source\"",
		  "outcome") },
	{ "migrations_ended.target", CTL_COUNT,
	  COUNTS(ended_target, CTL_N_OUTCOME, PX_OUT_COMPLETED, PX_OUT_N - 1),
	  PROM_LV("vmigd_migrations_total", COUNTER, MIGRATIONS_HELP, "role=\"target\"",
		  "outcome") },
	{ "tls_refusals", CTL_COUNT,
	  COUNTS(tls_refusals, CTL_N_TLS_REFUSAL, XP_TLS_NO_CERT, PX_TLS_REFUSALS - 1),
	  PROM_V("vmigd_tls_refusals_total", COUNTER,
		 "Node-hop connections whose TLS handshake failed since start, by reason (as the "
		 "log line's token: no-certificate, untrusted-ca, expired, not-yet-valid, "
		 "bad-purpose, name-not-allowed, peer-refused, protocol, closed, "
		 "handshake-timeout, silent).",
		 "reason") },
	{ "resume_refused", CTL_COUNT, FIELD(resume_refused),
	  PROM("vmigd_resumptions_refused_total", COUNTER,
	       "Resumptions of node-hop connections turned away since start (a wrong token, an "
	       "unknown connection, an offset outside what was kept).") },
	{ "certificate_expiry.node", CTL_COUNT, FIELD(tls.node_expiry), OMIT_UNLESS(tls.on),
	  PROM_L("vmigd_certificate_expiry_timestamp_seconds", GAUGE, EXPIRY_HELP,
		 "cert=\"node\"") },
	{ "certificate_expiry.ca", CTL_COUNT, FIELD(tls.ca_expiry), OMIT_UNLESS(tls.on),
	  PROM_L("vmigd_certificate_expiry_timestamp_seconds", GAUGE, EXPIRY_HELP, "cert=\"ca\"") },
	{ "time_unix", CTL_SECONDS, CALC(node_time) },
};
struct ctl_table ctl_node_table = { "node", node_figs, ARRAY_SIZE(node_figs) };
#undef OBJ

#define OBJ struct px_migration_info
static const struct ctl_fig migration_figs[] = {
	{ "key", CTL_STR, FIELD(key), TEXT("head", "%s") },
	{ "role", CTL_STR, ENUM(role, CTL_N_ROLE), TEXT("head", " %s") },
	{ "state", CTL_STR, FIELD(state), TEXT("head", " %s") },
	{ "mode", CTL_STR, STR_OR(mode, "plain"), TEXT("head", ", mode %s") },
	{ "tls", CTL_BOOL, FIELD(tls) },
	{ "kubevirt", CTL_BOOL, FIELD(kubevirt), TEXT("head", ", KubeVirt ports|") },
	{ "error", CTL_STR, FIELD(error), OMIT_EMPTY, TEXT("error", "error: %s") },
	{ "bytes_tx", CTL_BYTES, FIELD(bytes_tx), TEXT("bytes", "sent %s"),
	  PROM("vmigd_migration_sent_bytes_total", COUNTER,
	       "QEMU stream bytes sent to the peer (local to peer).") },
	{ "bytes_rx", CTL_BYTES, FIELD(bytes_rx), TEXT("bytes", ", received %s"),
	  PROM("vmigd_migration_received_bytes_total", COUNTER,
	       "QEMU stream bytes received from the peer (peer to local).") },
	RATES(rate, "rate", "vmigd_migration_rate_bytes_per_second",
	      "Stream bytes per second over the window."),
	{ "cap", CTL_CAP, FIELD(cap), TEXT("caps", "cap %s"),
	  PROM("vmigd_migration_cap_bytes_per_second", GAUGE,
	       "Cap set for this migration; 0: none.") },
	{ "limit", CTL_CAP, FIELD(limit), TEXT("caps", ", limit %s"),
	  PROM("vmigd_migration_limit_bytes_per_second", GAUGE,
	       "What the migration may send now: its cap or its share of the node cap; 0: none.") },
	{ "cap_lifted", CTL_BOOL, FIELD(cap_lifted), TEXT("caps", " (lifted at switchover)|"),
	  PROM("vmigd_migration_cap_lifted", GAUGE, "1 once the cap was lifted at switchover.") },
	{ "conns.active", CTL_COUNT, FIELD(conns_active), TEXT("conns", "connections: %s active"),
	  V1("connections_active"),
	  PROM_L("vmigd_migration_connections", GAUGE, "Connections being set up or carried now.",
		 "state=\"active\"") },
	{ "conns.total", CTL_COUNT, FIELD(conns_total), TEXT("conns", ", %s total"),
	  V1("connections"),
	  PROM("vmigd_migration_connections_total", COUNTER, "Connections carried so far.") },
	{ "conns.failed", CTL_COUNT, FIELD(conns_failed), TEXT("conns", ", %s failed"),
	  V1("connections_failed"),
	  PROM("vmigd_migration_connections_failed_total", COUNTER, "Connections that failed.") },
	{ "conns.verified", CTL_COUNT, FIELD(conns_verified), TEXT("conns", ", %s verified"),
	  PROM_L("vmigd_migration_verified_connections_total", COUNTER,
		 "Ended connections by what comparing their digests with the peer's found.",
		 "result=\"match\"") },
	{ "conns.corrupt", CTL_COUNT, FIELD(conns_corrupt), TEXT("conns", ", %s CORRUPT"), NONZERO,
	  PROM_L("vmigd_migration_verified_connections_total", COUNTER,
		 "Ended connections by what comparing their digests with the peer's found.",
		 "result=\"corrupt\"") },
	{ "conns.unverified", CTL_COUNT, FIELD(conns_unverified), TEXT("conns", ", %s unverified"),
	  NONZERO,
	  PROM_L("vmigd_migration_verified_connections_total", COUNTER,
		 "Ended connections by what comparing their digests with the peer's found.",
		 "result=\"unverified\"") },
	{ "conns.reordered", CTL_COUNT, FIELD(conns_reordered), TEXT("conns", ", %s reordered"),
	  V1("connections_reordered"),
	  PROM("vmigd_migration_connections_reordered_total", COUNTER,
	       "Target: connections that arrived before a predecessor and waited.") },
	{ "duration_s", CTL_SECONDS, CALC(mig_duration), TEXT("head", ", running %s"),
	  V1("seconds"),
	  PROM("vmigd_migration_duration_seconds", GAUGE,
	       "Time since the migration was started.") },
	{ "peer", CTL_STR, FIELD(peer), OMIT_EMPTY, TEXT("head", ", peer %s") },
	{ "started_unix", CTL_SECONDS, CALC(mig_started),
	  PROM("vmigd_migration_start_time_seconds", GAUGE,
	       "When the migration was started, Unix time.") },
	{ "shaped_ms", CTL_MS, FIELD(shaped_ms), TEXT("caps", ", shaped %s"),
	  PROM("vmigd_migration_shaped_seconds_total", COUNTER,
	       "Time the migration's connections waited for the cap, summed.") },
	{ "resume.conns", CTL_COUNT, FIELD(resume.conns), TEXT("resume", "resumable: %s now"),
	  PROM_L("vmigd_migration_resumable_connections", GAUGE,
		 "Resumable connections carried now (state=active), and of those without a node "
		 "hop now (state=suspended).",
		 "state=\"active\"") },
	{ "resume.suspended", CTL_COUNT, FIELD(resume.suspended),
	  TEXT("resume", ", %s WITHOUT A HOP"), NONZERO,
	  PROM_L("vmigd_migration_resumable_connections", GAUGE,
		 "Resumable connections carried now (state=active), and of those without a node "
		 "hop now (state=suspended).",
		 "state=\"suspended\"") },
	{ "resume.resumptions", CTL_COUNT, FIELD(resume.resumptions),
	  TEXT("resume", ", resumed %s times"),
	  PROM("vmigd_migration_resumptions_total", COUNTER,
	       "Times the migration's connections went on over new node-hop connections after "
	       "theirs failed.") },
	{ "resume.fallbacks", CTL_COUNT, FIELD(resume.fallbacks),
	  TEXT("resume", ", %s fell back from DPDK"), NONZERO,
	  PROM("vmigd_migration_dpdk_fallbacks_total", COUNTER,
	       "Times the migration's connections went on over the kernel path when their DPDK "
	       "path failed.") },
	{ "resume.replayed", CTL_BYTES, FIELD(resume.replayed), TEXT("resume", ", %s sent again"),
	  NONZERO,
	  PROM("vmigd_migration_replayed_bytes_total", COUNTER,
	       "Bytes sent again after resumptions (what the failed node hops lost).") },
	{ "resume.unhopped_ms", CTL_MS, FIELD(resume.unhopped_ms),
	  TEXT("resume", ", %s without a hop"), NONZERO,
	  PROM("vmigd_migration_hopless_seconds_total", COUNTER,
	       "Time the migration's connections spent without a node hop, summed.") },
	{ "resume.kept", CTL_BYTES, FIELD(resume.kept), TEXT("resume", ", keeping %s"),
	  PROM("vmigd_migration_kept_bytes", GAUGE,
	       "Bytes the migration's resumable connections keep until the peer says it "
	       "delivered them (the memory resumption costs now).") },
	{ "resume.refused", CTL_COUNT, FIELD(resume.refused),
	  TEXT("resume", ", %s resumptions REFUSED"), NONZERO,
	  PROM("vmigd_migration_resumptions_refused_total", COUNTER,
	       "Target: resumptions turned away (a wrong token, an unknown connection, an offset "
	       "outside what was kept); the migration goes on.") },
	{ "wire.tx", CTL_BYTES, FIELD(wire_tx), TEXT("wire", "node hop: sent %s"),
	  PROM("vmigd_migration_wire_sent_bytes_total", COUNTER,
	       "Bytes the migration's connections sent on the node hop: the stream's, compressed "
	       "chunks counted as sent (frame headers and TLS not counted).") },
	{ "wire.tx_1s", CTL_RATE, FIELD(wire_1s), TEXT("wire", ", rate %s (1s)"),
	  PROM_L("vmigd_migration_wire_rate_bytes_per_second", GAUGE,
		 "Node-hop bytes per second over the window (see wire_sent_bytes).",
		 "window=\"1s\"") },
	{ "wire.tx_10s", CTL_RATE, FIELD(wire_10s), TEXT("wire", " %s (10s)"),
	  PROM_L("vmigd_migration_wire_rate_bytes_per_second", GAUGE,
		 "Node-hop bytes per second over the window (see wire_sent_bytes).",
		 "window=\"10s\"") },
	{ "compress.mode", CTL_STR, FIELD(zmode), OMIT_UNLESS(zmode),
	  TEXT("compress", "compression %s") },
	{ "compress.conns_on", CTL_COUNT, FIELD(zconns_on), OMIT_UNLESS(zmode),
	  TEXT("compress", ", on for %s connections now"),
	  PROM("vmigd_migration_compressing_connections", GAUGE,
	       "Source: connections sending compressed chunks now.") },
	{ "compress.plain", CTL_BYTES, FIELD(z.tx_plain), OMIT_UNLESS(zmode),
	  TEXT("compress", ", %s of the stream"),
	  PROM("vmigd_migration_compress_plain_bytes_total", COUNTER,
	       "Source: stream bytes sent compressed, before compression.") },
	{ "compress.wire", CTL_BYTES, FIELD(z.tx_wire), OMIT_UNLESS(zmode),
	  TEXT("compress", " sent as %s"),
	  PROM("vmigd_migration_compress_wire_bytes_total", COUNTER,
	       "Source: the compressed chunks those bytes went as.") },
	{ "compress.ratio_pct", CTL_COUNT, CALC(mig_z_ratio), OMIT_UNLESS(z.tx_plain),
	  TEXT("compress", " (%s%%)") },
	{ "compress.cpu_ms", CTL_MS, CALC(mig_z_tx_cpu), OMIT_UNLESS(zmode),
	  TEXT("compress", ", CPU %s"),
	  PROM("vmigd_migration_compress_cpu_seconds_total", COUNTER,
	       "Source: CPU time spent compressing.") },
	{ "compress.changes", CTL_COUNT, FIELD(z.flips), OMIT_UNLESS(zmode),
	  TEXT("compress", ", turned on or off %s times"), NONZERO },
	{ "decompress.plain", CTL_BYTES, FIELD(z.rx_plain), OMIT_UNLESS(z.rx_plain),
	  TEXT("compress", "decoded %s"),
	  PROM("vmigd_migration_decompress_plain_bytes_total", COUNTER,
	       "Target: stream bytes that came compressed, decoded.") },
	{ "decompress.wire", CTL_BYTES, FIELD(z.rx_wire), OMIT_UNLESS(z.rx_plain),
	  TEXT("compress", " from %s"),
	  PROM("vmigd_migration_decompress_wire_bytes_total", COUNTER,
	       "Target: the compressed chunks those bytes came as.") },
	{ "decompress.cpu_ms", CTL_MS, CALC(mig_z_rx_cpu), OMIT_UNLESS(z.rx_plain),
	  TEXT("compress", ", CPU %s"),
	  PROM("vmigd_migration_decompress_cpu_seconds_total", COUNTER,
	       "Target: CPU time spent decoding compressed chunks.") },
};
TABLE(ctl_migration_table, "migration", migration_figs);
#undef OBJ

/* Its Prometheus families are the migration's (key and role labels), for inspected ones only. */
#define OBJ struct px_insp_summary
static const struct ctl_fig insp_summary_figs[] = {
	{ "stream_version", CTL_COUNT, FIELD(stream_version), TEXT("head", "stream v%s") },
	{ "machine", CTL_STR, FIELD(machine), TEXT("head", ", machine %s") },
	{ "channels.main", CTL_COUNT, FIELD(main), TEXT("head", ", channels %s main"),
	  PROM_L("vmigd_migration_inspect_channels", GAUGE,
		 "Connections the inspector saw, by kind.", "kind=\"main\"") },
	{ "channels.multifd", CTL_COUNT, FIELD(multifd), TEXT("head", " + %s multifd"),
	  PROM_L("vmigd_migration_inspect_channels", GAUGE,
		 "Connections the inspector saw, by kind.", "kind=\"multifd\"") },
	{ "channels.other", CTL_COUNT, FIELD(other), TEXT("head", " + %s other"), NONZERO,
	  PROM_L("vmigd_migration_inspect_channels", GAUGE,
		 "Connections the inspector saw, by kind.", "kind=\"other\"") },
	{ "bytes_only", CTL_COUNT, FIELD(bytes_only), NONZERO,
	  TEXT("bytes_only", "bytes only on %s channel(s)"),
	  PROM("vmigd_migration_inspect_bytes_only_channels", GAUGE,
	       "Connections where the inspector stopped parsing and only counts bytes.") },
	{ "reason", CTL_STR, FIELD(reason), NULL_EMPTY, TEXT("bytes_only", ": %s"), NONZERO },
	{ "page_size", CTL_BYTES, FIELD(page_size), TEXT("head", ", page size %s"), NONZERO },
	{ "ram_total", CTL_BYTES, FIELD(ram_total), NULL_EMPTY, TEXT("head", ", RAM %s"), NONZERO,
	  PROM("vmigd_migration_ram_total_bytes", GAUGE,
	       "RAM the stream's setup announced: all RAM blocks of the guest, ROMs and video "
	       "RAM included.") },
	{ "remaining", CTL_BYTES, FIELD(remaining), NULL_UNLESS(remaining_known),
	  TEXT("progress", "stream: remaining %s"),
	  PROM("vmigd_migration_stream_remaining_bytes", GAUGE,
	       "RAM still to send as the stream tells it: in the first pass the total less the "
	       "pages sent, later the last completed pass's pages; no sample where unknown.") },
	{ "remaining_from", CTL_STR, FIELD(remaining_from), NULL_EMPTY, TEXT("progress", " (%s)"),
	  NONZERO },
	{ "pages", CTL_COUNT, FIELD(pages), TEXT("pages", "pages: %s"),
	  PROM("vmigd_migration_pages_total", COUNTER, "RAM pages sent with their data.") },
	{ "zero_pages", CTL_COUNT, FIELD(zero_pages), TEXT("pages", " (zero %s)"),
	  PROM("vmigd_migration_zero_pages_total", COUNTER,
	       "RAM pages sent as zero pages (no data).") },
	{ "packets", CTL_COUNT, FIELD(packets), TEXT("pages", ", packets %s"),
	  PROM("vmigd_migration_multifd_packets_total", COUNTER, "Multifd packet headers seen.") },
	{ "syncs", CTL_COUNT, FIELD(syncs), TEXT("pages", ", sync points %s"),
	  PROM("vmigd_migration_sync_points_total", COUNTER,
	       "Sync points seen: multifd SYNC flags, main-channel EOS and multifd flushes.") },
	{ "passes", CTL_COUNT, FIELD(passes), TEXT("pages", ", pass %s"),
	  PROM("vmigd_migration_passes_total", COUNTER,
	       "RAM scan passes begun (the most any channel began).") },
	{ "dirty_known", CTL_BOOL, FIELD(dirty_known) },
	{ "dirty_pages_per_pass", CTL_COUNT, FIELD(dirty_pages_per_pass), NULL_UNLESS(dirty_known),
	  TEXT("pages", ", %s dirty pages/pass"), NONZERO,
	  PROM("vmigd_migration_dirty_pages_per_pass", GAUGE,
	       "Pages of the last completed pass after the first: an estimate of the dirty set.") },
	{ "dirty_rate", CTL_RATE, FIELD(dirty_rate), NULL_UNLESS(dirty_known),
	  TEXT("pages", ", dirty %s"),
	  PROM("vmigd_migration_dirty_rate_bytes_per_second", GAUGE,
	       "Dirty-rate estimate: the last completed pass's pages over its duration.") },
	{ "switchover", CTL_BOOL, FIELD(switchover), TEXT("pages", ", switchover|"),
	  PROM("vmigd_migration_switchover", GAUGE,
	       "1 once the completion stage began (VM stopped).") },
};
TABLE(ctl_insp_summary_table, "inspect", insp_summary_figs);
#undef OBJ

#define OBJ struct px_port_info
static const struct ctl_fig port_figs[] = {
	{ "id", CTL_COUNT, FIELD(id), TEXT("head", "port %s:"), V1("port") },
	{ "bytes_tx", CTL_BYTES, FIELD(bytes_tx), TEXT("head", " sent %s"),
	  PROM("vmigd_port_sent_bytes_total", COUNTER, "Stream bytes sent on a logical port.") },
	{ "bytes_rx", CTL_BYTES, FIELD(bytes_rx), TEXT("head", ", received %s"),
	  PROM("vmigd_port_received_bytes_total", COUNTER,
	       "Stream bytes received on a logical port.") },
	RATES(rate, "rate", "vmigd_port_rate_bytes_per_second",
	      "Stream bytes per second on a logical port over the window."),
	{ "conns.active", CTL_COUNT, FIELD(conns_active), TEXT("head", ", connections %s active"),
	  PROM_L("vmigd_port_connections", GAUGE, "Connections of a logical port now.",
		 "state=\"active\"") },
	{ "conns.total", CTL_COUNT, FIELD(conns_total), TEXT("head", ", %s total"),
	  PROM("vmigd_port_connections_total", COUNTER, "Connections of a logical port so far.") },
	{ "socket", CTL_STR, FIELD(path), TEXT("head", ", socket %s") },
	{ "listen", CTL_COUNT, FIELD(listen), OMIT_UNLESS(listen),
	  TEXT("head", ", listening on %s") },
	{ "peer_port", CTL_COUNT, FIELD(peer_port), OMIT_UNLESS(peer_port),
	  TEXT("head", ", to TCP port %s") },
};
TABLE(ctl_port_table, "port", port_figs);
#undef OBJ

/* The head line is also `vmigctl status`'s line per connection. */
#define OBJ struct px_conn_info
static const struct ctl_fig conn_figs[] = {
	{ "port", CTL_COUNT, FIELD(port), TEXT("head", "port=%s") },
	{ "seq", CTL_COUNT, FIELD(seq), TEXT("head", " seq=%s") },
	{ "state", CTL_STR, FIELD(state), TEXT("head", " %s") },
	{ "tls", CTL_STR, STR_OR(tls, "off"), TEXT("head", " tls=%s") },
	{ "cipher", CTL_STR, FIELD(cipher), OMIT_UNLESS(tls), TEXT("head", " cipher=%s") },
	{ "crypto", CTL_STR, FIELD(crypto), OMIT_UNLESS(tls), TEXT("head", " crypto=%s") },
	{ "resumed", CTL_BOOL, FIELD(resumed), OMIT_UNLESS(tls),
	  TEXT("head", " resumed=yes| resumed=no") },
	{ "raw", CTL_BOOL, FIELD(raw), TEXT("head", " raw|") },
	{ "path", CTL_STR, FIELD(path), TEXT("head", " path=%s") },
	{ "bytes_tx", CTL_BYTES, FIELD(bytes_tx), TEXT("bytes", "sent %s"),
	  PROM("vmigd_connection_sent_bytes_total", COUNTER,
	       "Stream bytes sent on an open connection.") },
	{ "bytes_rx", CTL_BYTES, FIELD(bytes_rx), TEXT("bytes", ", received %s"),
	  PROM("vmigd_connection_received_bytes_total", COUNTER,
	       "Stream bytes received on an open connection.") },
	RATES(rate, "bytes", NULL, NULL),
	{ "shaped_ms", CTL_MS, FIELD(shaped_ms), TEXT("bytes", ", shaped %s"),
	  PROM("vmigd_connection_shaped_seconds_total", COUNTER,
	       "Time an open connection waited for the cap.") },
	{ "pacing", CTL_CAP, FIELD(pacing), TEXT("bytes", ", pacing %s"), NONZERO,
	  PROM("vmigd_connection_pacing_bytes_per_second", GAUGE,
	       "SO_MAX_PACING_RATE set on the connection (pacing shaper); 0: none.") },
	{ "resume.on", CTL_BOOL, FIELD(resumable), TEXT("head", " resumable|") },
	{ "resume.suspended", CTL_BOOL, FIELD(suspended), OMIT_UNLESS(resumable),
	  TEXT("head", " NO-HOP|"),
	  PROM("vmigd_connection_suspended", GAUGE,
	       "1 while a resumable connection has no node hop (waiting for a new one).") },
	{ "resume.resumptions", CTL_COUNT, FIELD(resumptions), OMIT_UNLESS(resumable),
	  TEXT("resume", "resumed %s times"), NONZERO,
	  PROM("vmigd_connection_resumptions_total", COUNTER,
	       "Times a resumable connection went on over a new node-hop connection.") },
	{ "resume.fallbacks", CTL_COUNT, FIELD(fallbacks), OMIT_UNLESS(resumable),
	  TEXT("resume", ", fell back from DPDK %s times"), NONZERO,
	  PROM("vmigd_connection_dpdk_fallbacks_total", COUNTER,
	       "Times a resumable connection went on over the kernel path when its DPDK path "
	       "failed.") },
	{ "resume.replayed", CTL_BYTES, FIELD(replayed), OMIT_UNLESS(resumable),
	  TEXT("resume", ", %s sent again"), NONZERO,
	  PROM("vmigd_connection_replayed_bytes_total", COUNTER,
	       "Bytes a resumable connection sent again after resumptions.") },
	{ "resume.unhopped_ms", CTL_MS, FIELD(unhopped_ms), OMIT_UNLESS(resumable),
	  TEXT("resume", ", %s without a hop"), NONZERO,
	  PROM("vmigd_connection_hopless_seconds_total", COUNTER,
	       "Time a resumable connection spent without a node hop, resumptions ended.") },
	{ "resume.kept", CTL_BYTES, FIELD(kept), OMIT_UNLESS(resumable),
	  TEXT("bytes", ", kept %s"),
	  PROM("vmigd_connection_kept_bytes", GAUGE,
	       "Bytes a resumable connection keeps until the peer says it delivered them.") },
	{ "compress.mode", CTL_STR, FIELD(zmode), OMIT_UNLESS(zmode),
	  TEXT("compress", "compression %s") },
	{ "compress.on", CTL_BOOL, FIELD(zon), OMIT_UNLESS(zwhy), TEXT("compress", ", ON|, off"),
	  PROM("vmigd_connection_compressing", GAUGE,
	       "1 while a source connection sends compressed chunks.") },
	{ "compress.why", CTL_STR, FIELD(zwhy), OMIT_UNLESS(zwhy), TEXT("compress", ": %s") },
	{ "compress.idle_pct", CTL_COUNT, FIELD(zidle_pct), OMIT_UNLESS(zwhy),
	  TEXT("compress", " (worker idle %s%%") },
	{ "compress.recent_pct", CTL_COUNT, FIELD(zratio_pct), OMIT_UNLESS(zwhy),
	  TEXT("compress", ", recent chunks %s%% of their size)") },
	{ "compress.plain", CTL_BYTES, FIELD(z.tx_plain), OMIT_UNLESS(zwhy),
	  TEXT("compress", ", %s"),
	  PROM("vmigd_connection_compress_plain_bytes_total", COUNTER,
	       "Stream bytes a source connection sent compressed, before compression.") },
	{ "compress.wire", CTL_BYTES, FIELD(z.tx_wire), OMIT_UNLESS(zwhy),
	  TEXT("compress", " sent as %s"),
	  PROM("vmigd_connection_compress_wire_bytes_total", COUNTER,
	       "The compressed chunks a source connection sent those bytes as.") },
	{ "decompress.plain", CTL_BYTES, FIELD(z.rx_plain), OMIT_UNLESS(z.rx_plain),
	  TEXT("compress", ", decoded %s"),
	  PROM("vmigd_connection_decompress_plain_bytes_total", COUNTER,
	       "Stream bytes that came compressed to a target connection, decoded.") },
	{ "decompress.wire", CTL_BYTES, FIELD(z.rx_wire), OMIT_UNLESS(z.rx_plain),
	  TEXT("compress", " from %s") },
};
TABLE(ctl_conn_table, "connection", conn_figs);
#undef OBJ

#define OBJ struct px_insp_stats
static const struct ctl_fig insp_stats_figs[] = {
	{ "kind", CTL_STR, ENUM(kind, CTL_N_INSP_KIND), TEXT("head", "%s") },
	{ "bytes_only", CTL_BOOL, FIELD(bytes_only), TEXT("head", ", bytes only|") },
	{ "reason", CTL_STR, FIELD(reason), NULL_EMPTY, TEXT("head", ": %s"), NONZERO },
	{ "stream_version", CTL_COUNT, FIELD(stream_version), TEXT("head", ", stream v%s"),
	  NONZERO },
	{ "machine", CTL_STR, FIELD(machine), TEXT("head", ", machine %s"), NONZERO },
	{ "channel_id", CTL_COUNT, FIELD(channel_id), TEXT("head", ", channel %s"), NONZERO },
	{ "page_size", CTL_BYTES, FIELD(page_size), TEXT("head", ", page size %s"), NONZERO },
	{ "ram_total", CTL_BYTES, FIELD(ram_total), TEXT("head", ", RAM %s"), NONZERO },
	{ "bytes", CTL_BYTES, FIELD(bytes), TEXT("pages", "seen %s") },
	{ "pages", CTL_COUNT, FIELD(pages), TEXT("pages", ", pages %s") },
	{ "zero_pages", CTL_COUNT, FIELD(zero_pages), TEXT("pages", " (zero %s)") },
	{ "packets", CTL_COUNT, FIELD(packets), TEXT("pages", ", packets %s"), NONZERO },
	{ "syncs", CTL_COUNT, FIELD(syncs), TEXT("pages", ", sync points %s") },
	{ "sync_bytes_last", CTL_BYTES, FIELD(sync_bytes_last), TEXT("pages", " (%s apart)"),
	  NONZERO },
	{ "passes", CTL_COUNT, FIELD(passes), TEXT("pages", ", pass %s") },
	{ "pass_pages_last", CTL_COUNT, FIELD(pass_pages_last), TEXT("pages", ", last %s pages"),
	  NONZERO },
	{ "pass_ms_last", CTL_MS, FIELD(pass_ms_last), TEXT("pages", " in %s"), NONZERO },
	{ "switchover", CTL_BOOL, FIELD(switchover), TEXT("pages", ", switchover|") },
};
TABLE(ctl_insp_stats_table, "inspect", insp_stats_figs);
#undef OBJ

/* Job figures: the hypervisor's last sample ("job" is null before the first). */
#define OBJ    struct cv_report
#define JOB(m) FIELD(job.m), GROUP_NULL_UNLESS(have_job)
static const struct ctl_fig conv_figs[] = {
	{ "mode", CTL_STR, ENUM(mode, CTL_N_CV_MODE), TEXT("head", "%s") },
	{ "backend", CTL_STR, FIELD(backend), TEXT("head", " via %s") },
	{ "policy.allowAutoConverge", CTL_BOOL, FIELD(policy.allow_auto_converge),
	  TEXT("policy", "policy: auto-converge|policy: no auto-converge") },
	{ "policy.allowPostCopy", CTL_BOOL, FIELD(policy.allow_post_copy),
	  TEXT("policy", ", post-copy|, no post-copy") },
	{ "policy.allowWorkloadDisruption", CTL_BOOL, FIELD(policy.allow_workload_disruption),
	  TEXT("policy", ", workload disruption|, no workload disruption") },
	{ "policy.completionTimeoutPerGiB", CTL_COUNT, FIELD(policy.completion_timeout_per_gib),
	  TEXT("policy", ", completion timeout %s s/GiB") },
	{ "policy.progressTimeout", CTL_COUNT, FIELD(policy.progress_timeout_s),
	  TEXT("policy", ", progress timeout %s s") },
	{ "policy.bandwidth", CTL_CAP, FIELD(policy.bandwidth), TEXT("policy", ", bandwidth %s") },
	{ "policy.maxDowntimeMs", CTL_MS, FIELD(policy.max_downtime_ms),
	  TEXT("policy", ", max downtime %s"), NONZERO },
	{ "policy.evidenceWindowMs", CTL_MS, FIELD(policy.window_ms),
	  TEXT("policy", ", evidence window %s") },
	{ "policy.shadow", CTL_BOOL, FIELD(policy.shadow),
	  TEXT("policy", ", shadow (decides, never acts)|") },
	{ "state", CTL_STR, CALC(conv_state), TEXT("head", ", %s") },
	{ "elapsed_ms", CTL_MS, FIELD(elapsed_ms), TEXT("head", " at %s"), NONZERO },
	{ "action_counts", CTL_COUNT, COUNTS(counts, CTL_N_CV_ACT, CV_ACT_RAISE_CAP, CV_ACT_ABORT),
	  TEXT("actions", "actions: %s"), NONZERO,
	  PROM_V("vmigd_convergence_actions_total", COUNTER,
		 "Convergence actions taken (action: raise-cap, relax-downtime, auto-converge, "
		 "post-copy, pause, abort), including failed attempts and, in shadow mode, the "
		 "decisions not acted on.",
		 "action") },
	{ "job.status", CTL_STR, ENUM(job.status, CTL_N_CV_STATUS), GROUP_NULL_UNLESS(have_job),
	  TEXT("head", ", QEMU %s") },
	{ "job.elapsed_ms", CTL_MS, JOB(elapsed_ms) },
	{ "job.remaining", CTL_BYTES, JOB(remaining), TEXT("head", ", remaining %s"),
	  PROM("vmigd_convergence_remaining_bytes", GAUGE,
	       "RAM the hypervisor still has to send.") },
	{ "job.total", CTL_BYTES, JOB(total), TEXT("head", " of %s"),
	  PROM("vmigd_convergence_total_bytes", GAUGE,
	       "The guest's RAM, as the hypervisor counts it.") },
	{ "job.transferred", CTL_BYTES, JOB(transferred), TEXT("job", "QEMU sent %s") },
	{ "dirty_rate", CTL_RATE, FIELD(dirty_rate), SAMPLE_UNLESS(have_job),
	  TEXT("judged", "judged by: dirty %s"),
	  PROM("vmigd_convergence_dirty_rate_bytes_per_second", GAUGE,
	       "The dirty rate the policy last judged by (from QEMU, else the stream).") },
	{ "dirty_rate_from", CTL_STR, FIELD(dirty_from), NULL_EMPTY, TEXT("judged", " (%s)"),
	  NONZERO },
	{ "link_rate", CTL_RATE, FIELD(link_rate), TEXT("judged", ", link %s") },
	{ "evidence", CTL_STR, FIELD(evidence), OMIT_EMPTY, TEXT("judged", "; %s") },
	{ "job.dirty_rate", CTL_RATE, JOB(dirty_rate), TEXT("head", ", dirty %s") },
	{ "job.throttle_pct", CTL_COUNT, JOB(throttle_pct), TEXT("head", ", throttle %s%%"),
	  PROM_RATIO("vmigd_convergence_throttle_ratio", GAUGE,
		     "The guest's CPU throttle from auto-converge, 0 to 1.") },
	{ "job.dirty_syncs", CTL_COUNT, JOB(dirty_syncs), TEXT("head", ", pass %s"),
	  PROM("vmigd_convergence_dirty_syncs_total", COUNTER,
	       "The hypervisor's dirty-bitmap syncs so far (QEMU's passes over RAM).") },
	{ "job.rate", CTL_RATE, JOB(rate), TEXT("job", ", at %s") },
	{ "job.expected_downtime_ms", CTL_MS, JOB(expected_downtime_ms),
	  TEXT("job", ", expected downtime %s") },
	{ "job.downtime_ms", CTL_MS, JOB(downtime_ms), TEXT("job", ", downtime %s"), NONZERO },
	{ "job.postcopy_requests", CTL_COUNT, JOB(postcopy_requests),
	  TEXT("job", ", post-copy requests %s"), NONZERO },
	{ "job.guest_running", CTL_BOOL, JOB(guest_running),
	  TEXT("job", ", guest running|, guest stopped") },
	{ "job.error", CTL_STR, JOB(error), OMIT_EMPTY, TEXT("job", ", error: %s") },
	{ "query_errors", CTL_COUNT, FIELD(query_errors), TEXT("errors", "query errors: %s"),
	  NONZERO },
	{ "last_error", CTL_STR, FIELD(last_error), OMIT_UNLESS(query_errors),
	  TEXT("errors", ", last: %s") },
	{ "outcome", CTL_STR, FIELD(outcome), OMIT_EMPTY, TEXT("outcome", "outcome: %s") },
	{ "irrecoverable", CTL_BOOL, FIELD(irrecoverable), TEXT("outcome", " (irrecoverable)|") },
};
TABLE(ctl_conv_table, "convergence", conv_figs);
#undef JOB
#undef OBJ

/* What carries the node hop (ctl_nic.c). Prometheus: the migration's labels; the strings are
 * the labels of vmigd_migration_nic_info (ctl_metrics.c). */
#define OBJ struct ctl_nic_view
static const struct ctl_fig nic_figs[] = {
	{ "interface", CTL_STR, FIELD(nic.name), OMIT_EMPTY, TEXT("head", "%s") },
	{ "kind", CTL_STR, FIELD(nic.kind), OMIT_EMPTY, TEXT("head", ", %s") },
	{ "driver", CTL_STR, FIELD(nic.driver), OMIT_EMPTY, TEXT("head", ", driver %s") },
	{ "device", CTL_STR, FIELD(nic.pci), OMIT_EMPTY, TEXT("head", ", device %s") },
	{ "vf", CTL_BOOL, FIELD(nic.vf), TEXT("head", ", SR-IOV VF|") },
	{ "pf", CTL_STR, FIELD(nic.pf), OMIT_EMPTY, TEXT("head", " of %s") },
	{ "pf_interface", CTL_STR, FIELD(nic.pf_name), OMIT_EMPTY, TEXT("head", " (%s)") },
	{ "numa_node", CTL_COUNT, FIELD(nic.numa_node), OMIT_UNLESS(nic.pci),
	  TEXT("head", ", NUMA node %s") },
	{ "speed", CTL_RATE, FIELD(speed), NULL_UNLESS(speed_known), TEXT("link", ", speed %s"),
	  NONZERO,
	  PROM("vmigd_migration_nic_speed_bytes_per_second", GAUGE,
	       "Link speed of the interface that carries the migration's node hop, where its "
	       "device reports one.") },
	{ "speed_known", CTL_BOOL, FIELD(speed_known), TEXT("link", "|, speed unknown") },
	{ "mtu", CTL_COUNT, FIELD(nic.mtu), TEXT("link", ", mtu %s") },
	{ "queues.rx", CTL_COUNT, FIELD(nic.rx_queues), TEXT("link", ", queues rx %s") },
	{ "queues.tx", CTL_COUNT, FIELD(nic.tx_queues), TEXT("link", " tx %s") },
	{ "state", CTL_STR, FIELD(nic.operstate), OMIT_EMPTY, TEXT("state", "state %s") },
	{ "link_up", CTL_BOOL, FIELD(link_up), TEXT("state", ", link up|, LINK DOWN"),
	  PROM("vmigd_migration_link_up", GAUGE,
	       "1 while the link that carries the migration's node hop is up with carrier.") },
	{ "link_down_ms", CTL_MS, FIELD(down_ms), TEXT("state", " for %s"), NONZERO,
	  PROM("vmigd_migration_link_down_seconds", GAUGE,
	       "How long that link has been down now; 0 while up.") },
	{ "link_downs", CTL_COUNT, FIELD(downs), TEXT("state", ", down %s times so far"), NONZERO,
	  PROM("vmigd_migration_link_downs_total", COUNTER,
	       "Times that link went down while the migration ran.") },
	{ "peer", CTL_STR, FIELD(nic.peer), OMIT_EMPTY, TEXT("route", "route to %s") },
	{ "gateway", CTL_STR, FIELD(nic.gateway), OMIT_EMPTY, TEXT("route", " via %s") },
	{ "source", CTL_STR, FIELD(nic.source), OMIT_EMPTY, TEXT("route", " from %s") },
	{ "addresses", CTL_STR, FIELD(nic.addrs), OMIT_EMPTY, TEXT("addrs", "addresses %s") },
	{ "error", CTL_STR, FIELD(error), OMIT_EMPTY, TEXT("error", "now: %s") },
};
TABLE(ctl_nic_table, "nic", nic_figs);
#undef OBJ

/* The head line is also `vmigctl status`'s line per action. */
#define OBJ struct cv_action_rec
static const struct ctl_fig action_figs[] = {
	{ "at_s", CTL_SECONDS, FIELD(at_ms), TEXT("head", "at %s") },
	{ "action", CTL_STR, ENUM(act, CTL_N_CV_ACT), TEXT("head", ": %s") },
	{ "ok", CTL_BOOL, FIELD(ok), TEXT("head", "| (failed)") },
	{ "reason", CTL_STR, FIELD(reason), TEXT("head", ": %s") },
	{ "error", CTL_STR, FIELD(error), OMIT_IF(ok), TEXT("head", " (%s)") },
};
TABLE(ctl_action_table, "action", action_figs);
#undef OBJ

#define OBJ struct ctl_process
static const struct ctl_fig process_figs[] = {
	{ "version", CTL_STR, FIELD(version) },
	{ "features", CTL_STR, FIELD(features) },
	{ "cpu_s", CTL_SECONDS, FIELD(cpu_ms),
	  PROM("process_cpu_seconds_total", COUNTER, "Total user and system CPU time spent.") },
	{ "resident_bytes", CTL_BYTES, FIELD(rss),
	  PROM("process_resident_memory_bytes", GAUGE, "Resident memory size.") },
	{ "virtual_bytes", CTL_BYTES, FIELD(vsize),
	  PROM("process_virtual_memory_bytes", GAUGE, "Virtual memory size.") },
	{ "start_unix", CTL_SECONDS, FIELD(start_ms),
	  PROM("process_start_time_seconds", GAUGE, "Start time of the process, Unix time.") },
	{ "open_fds", CTL_COUNT, FIELD(open_fds),
	  PROM("process_open_fds", GAUGE, "Open file descriptors.") },
	{ "max_fds", CTL_COUNT, FIELD(max_fds), SAMPLE_UNLESS(max_fds),
	  PROM("process_max_fds", GAUGE, "The limit on open file descriptors (RLIMIT_NOFILE).") },
};
TABLE(ctl_process_table, "process", process_figs);
#undef OBJ

int ctl_table_extend(struct ctl_table *t, const struct ctl_fig *figs, size_t n)
{
	struct ctl_fig *all = malloc((t->n + n) * sizeof(*all));

	if (!all)
		return -ENOMEM;
	memcpy(all, t->figs, t->n * sizeof(*all));
	memcpy(all + t->n, figs, n * sizeof(*all));
	/* lives as long as the table: the process (a table is extended once, at start-up) */
	t->figs = all;
	t->n += n;
	return 0;
}

const struct ctl_fig *ctl_fig_find(const struct ctl_table *t, const char *key)
{
	for (size_t i = 0; i < t->n; i++)
		if (strcmp(t->figs[i].key, key) == 0)
			return &t->figs[i];
	return NULL;
}
