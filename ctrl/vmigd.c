// SPDX-License-Identifier: Apache-2.0
/* vmigd(8): the per-node migration transport daemon. main reads the options (ctl_options.c),
 * turns them into the node's configuration, starts each server (the node and its data path,
 * control socket, metrics, takeover, signals) and runs the loop until SIGTERM/SIGINT drains it. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "ctl_hop.h"
#include "ctl_metrics.h"
#include "ctl_nic.h"
#include "ctl_nic_pick.h"
#include "ctl_options.h"
#include "ctl_notify.h"
#include "ctl_server.h"
#include "ctl_takeover.h"
#include "ctl_test.h"
#include "ctl_watchdog.h"
#include "log.h"
#include "px_node.h"
#include "units.h"
#include "util.h"
#include "vmigd-config.h"
#include "xp_dpdk.h"
#include "xp_fwatch.h"
#include "xp_tls.h"

/* After the last change to a certificate file, wait this long for its siblings to follow. */
#define TLS_SETTLE_MS 300

struct daemon {
	struct xp_loop *loop;
	struct xp_tls *tls;
	struct xp_fwatch *tls_watch;
	struct px_node *node;
	struct ctl_server *ctl;
	struct ctl_metrics_server *metrics;
	struct cv_set *conv;
	struct ctl_nic *nic; /* NULL where netlink cannot be had */
	uint64_t node_bandwidth; /* --node-bandwidth N%: what it came to */
	char cpus[320];		 /* --cpus: the workers' CPUs, as status shows them; "" for any */
	struct ctl_takeover *takeover;
	struct ctl_watchdog *watchdog; /* NULL without WatchdogSec= */
	struct xp_watch *sigw;
	int sfd;
	struct ctl_daemon_info info;
	unsigned int drain_timeout_s;
	bool draining;
	/* From the options, for start-up. */
	struct px_config pc;
	struct xp_addr metrics_addr;
	struct ctl_takeover_offer offer; /* --takeover: what the old vmigd handed over */
	struct ctl_takeover_cmd takeover_cmd; /* SIGUSR2 */
};

static void drained(void *arg)
{
	struct daemon *d = arg;

	log_info("drained; exiting");
	xp_loop_quit(d->loop);
}

/* This vmigd handed its listeners to a newer one: what it still carries is all it does. Under
 * systemd the new one becomes the service's main process; it must be in the service's cgroup,
 * which a vmigd started by SIGUSR2 is. */
static void handed_over(void *arg, int pid)
{
	struct daemon *d = arg;
	bool watched = d->watchdog != NULL;
	char state[160];
	int r;

	d->draining = true;
	d->info.metrics = NULL;
	ctl_metrics_server_free(d->metrics);
	d->metrics = NULL;
	/* The new vmigd pings the watchdog from here on: this last ping, sent with the change of
	 * main process, gives it a whole interval for its first. */
	ctl_watchdog_free(d->watchdog);
	d->watchdog = NULL;
	snprintf(state, sizeof(state),
		 "MAINPID=%d\n%sSTATUS=handed over to vmigd pid %d; carrying what is in flight",
		 pid, watched ? "WATCHDOG=1\n" : "", pid);
	r = ctl_notify(state);
	if (r < 0)
		log_warn("systemd: cannot make pid %d the main process: %s", pid, strerror(-r));
}

static void retired(void *arg)
{
	struct daemon *d = arg;

	log_info("handed over, and what this vmigd carried has ended; exiting");
	xp_loop_quit(d->loop);
}

/* Each mode problem the files were forgiven (on a read-only mount), one warning each. */
static void tls_log_warnings(const struct xp_tls *t)
{
	const char *w = xp_tls_warnings(t);

	while (*w) {
		int n = (int)strcspn(w, "\n");

		log_warn("TLS: %.*s", n, w);
		w += n + (w[n] == '\n');
	}
}

/* New connections get the new pair; links in flight keep theirs. A bad pair changes nothing:
 * neither does a file that is not a regular file (a FIFO), nor one others could change. */
static void tls_reload(struct daemon *d, const char *why)
{
	char err[300];
	int r;

	if (!d->tls) {
		log_info("%s: TLS is off (--no-tls); nothing to reload", why);
		return;
	}
	r = xp_tls_reload(d->tls, err, sizeof(err));
	if (r < 0)
		log_err("TLS: reload refused, keeping generation %u: %s", xp_tls_generation(d->tls),
			err);
	else if (r > 0)
		log_info("TLS: %s: files unchanged, keeping generation %u", why,
			 xp_tls_generation(d->tls));
	else {
		log_info("TLS: generation %u: %s (%s)", xp_tls_generation(d->tls),
			 xp_tls_describe(d->tls), why);
		tls_log_warnings(d->tls);
	}
}

static void tls_files_changed(void *arg)
{
	tls_reload(arg, "certificate files changed");
}

static void on_signal(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct daemon *d = arg;
	struct signalfd_siginfo si;

	if (read(fd, &si, sizeof(si)) != sizeof(si))
		return;
	if (si.ssi_signo == SIGHUP) {
		tls_reload(d, "SIGHUP");
		return;
	}
	if (si.ssi_signo == SIGUSR2) {
		ctl_takeover_spawn(&d->takeover_cmd, d->draining);
		return;
	}
	if (d->draining) {
		log_warn("%s again: cutting what is left and exiting", strsignal(si.ssi_signo));
		xp_loop_quit(d->loop);
		return;
	}
	d->draining = true;
	log_info("%s: no new connections; draining", strsignal(si.ssi_signo));
	(void)ctl_notify("STOPPING=1\nSTATUS=draining: no new connections");
	px_node_drain(d->node, d->drain_timeout_s, drained, d);
}

/* Checks what the options say together, loads TLS, and fills d->pc and the rest of d that start-up
 * needs. Each refusal is one line on stderr. */
static int daemon_configure(struct daemon *d, struct ctl_options *o)
{
	struct px_config *pc = &d->pc;

	vm_log_setup("vmigd", o->log_level);
	o->tls.resumption = !o->no_tls_resumption;
	o->tls.ktls = !o->no_ktls;
	if (o->no_tls && (o->tls.cert || o->tls.key || o->tls.ca)) {
		vm_log_early(VM_LOG_ERR, "--no-tls contradicts --tls-cert/--tls-key/--tls-ca");
		return -EINVAL;
	}
	if (!o->no_tls && (!o->tls.cert || !o->tls.key || !o->tls.ca)) {
		vm_log_early(VM_LOG_ERR,
			     "the node hop is TLS by default: give --tls-cert, --tls-key and "
			     "--tls-ca (PEM), or --no-tls to carry migrations in plain text");
		return -EINVAL;
	}
	if (!o->tls.client_cert != !o->tls.client_key) {
		vm_log_early(VM_LOG_ERR, "--tls-client-cert and --tls-client-key go together");
		return -EINVAL;
	}
	if (!o->no_tls) {
		char err[300];

		if (xp_tls_new(&o->tls, &d->tls, err, sizeof(err)) < 0) {
			vm_log_early(VM_LOG_ERR, "TLS: %s", err);
			return -EINVAL;
		}
		tls_log_warnings(d->tls);
	}
	if (xp_addr_parse(o->listen, 1, &pc->listen) < 0) {
		vm_log_early(VM_LOG_ERR, "--listen: expected ADDR:PORT (numeric), got \"%s\"",
			     o->listen);
		return -EINVAL;
	}
	/* As KubeVirt: "::" for both families, "0.0.0.0" where IPv6 is off. */
	if (pc->listen.ss.ss_family == AF_INET6 && xp_addr_is_wildcard(&pc->listen) &&
	    !xp_ipv6_available()) {
		unsigned int port = xp_addr_port(&pc->listen);

		xp_addr_from_host("0.0.0.0", port, &pc->listen);
	}
	if (o->hop_interface &&
	    ctl_nic_pick_hop(o->hop_interface, o->listen, o->advertise != NULL, pc) < 0)
		return -EINVAL;
	if (o->cpus && ctl_nic_pick_cpus(o->cpus, pc, d->cpus, sizeof(d->cpus)) < 0)
		return -EINVAL;
	if (o->advertise) {
		struct xp_addr a;

		if (strlen(o->advertise) >= sizeof(pc->advertise) ||
		    xp_addr_from_host(o->advertise, 1, &a) < 0) {
			vm_log_early(VM_LOG_ERR,
				     "--advertise: expected a numeric IP address, got \"%s\"",
				     o->advertise);
			return -EINVAL;
		}
		strcpy(pc->advertise, o->advertise);
	}
	if (o->metrics && xp_addr_parse(o->metrics, 1, &d->metrics_addr) < 0) {
		vm_log_early(VM_LOG_ERR,
			     "--metrics: expected ADDR:PORT (numeric; IPv6 as [ADDR]:PORT), got "
			     "\"%s\"",
			     o->metrics);
		return -EINVAL;
	}
	if (xp_unix_path_ok(o->control) < 0) {
		vm_log_early(VM_LOG_ERR, "--control: path too long or empty: \"%s\"", o->control);
		return -EINVAL;
	}
	pc->threads = o->threads;
	pc->slots = (o->slots + o->threads - 1) / o->threads;
	pc->pipe_size = o->pipe_size;
	pc->copy_path = o->copy_path;
	pc->order_timeout_ms = o->order_timeout_ms;
	pc->connect_timeout_ms = o->connect_timeout_ms;
	pc->tls = d->tls;
	pc->handshake_timeout_ms = o->handshake_timeout_ms;
	pc->preamble_timeout_ms = o->preamble_timeout_ms;
	pc->max_unauth = o->max_unauth;
	pc->max_migration_conns = o->max_migration_conns;
	pc->node_bandwidth = o->node_bandwidth;
	pc->shaper = o->shaper;
	pc->inspect = !o->no_inspect;
	pc->digest = o->digest;
	pc->compress = (enum px_compress)o->compress;
	pc->compress_level = (int)o->compress_level;
	pc->keep_cap_at_switchover = o->keep_cap_at_switchover;
	pc->socket_uid = o->socket_uid;
	pc->socket_gid = o->socket_gid;
	pc->resume_timeout_ms = (uint64_t)o->resume_timeout_s * 1000;
	pc->resume_keep = o->resume_keep;
	/* a DPDK connection that falls back to the kernel path keeps there what DPDK held */
	if (o->dpdk_eal && o->resume_timeout_s && o->resume_keep < o->dpdk_buffer) {
		vm_log_early(VM_LOG_INFO,
			     "--resume-buffer %lu raised to --dpdk-buffer's %lu: a DPDK connection "
			     "that falls back to the kernel path keeps there what DPDK held",
			     o->resume_keep, o->dpdk_buffer);
		pc->resume_keep = o->dpdk_buffer;
	}
	if (!o->dpdk_eal != !o->dpdk_address) {
		vm_log_early(VM_LOG_ERR, "--dpdk and --dpdk-address go together");
		return -EINVAL;
	}
	if (o->dpdk_eal && !xp_dpdk_built()) {
		vm_log_early(VM_LOG_ERR, "--dpdk: this vmigd was built without DPDK (meson setup "
					 "-Ddpdk=enabled)");
		return -ENOTSUP;
	}
	d->drain_timeout_s = o->drain_timeout_s;
	d->info.tls = d->tls;
	d->info.control_path = o->control;
	return 0;
}

static void log_tls_start(struct daemon *d, const struct ctl_options *o)
{
	const char *files[5];
	unsigned int nf = xp_tls_files(d->tls, files);
	char allow[2][300] = { "", "" };
	int r;

	for (int servers = 0; servers < 2; servers++)
		for (unsigned int i = 0; xp_tls_allow_list(d->tls, servers, i); i++)
			snprintf(allow[servers] + strlen(allow[servers]),
				 sizeof(allow[servers]) - strlen(allow[servers]), "%s%s",
				 i ? "," : "", xp_tls_allow_list(d->tls, servers, i));
	/* "allow" is what sources may present; a target's names only where they differ. */
	log_info("TLS: generation %u: %s; CA %s; allow %s%s%s; min %s; resumption %s; kernel "
		 "kTLS %s",
		 xp_tls_generation(d->tls), xp_tls_describe(d->tls), o->tls.ca, allow[0],
		 strcmp(allow[0], allow[1]) ? "; targets allowed " : "",
		 strcmp(allow[0], allow[1]) ? allow[1] : "", xp_tls_min_version(d->tls),
		 o->tls.resumption ? "on" : "off",
		 xp_tls_kernel_has_ktls() ? (o->tls.ktls ? "used" : "present, off (--no-ktls)")
					  : "absent: user-space crypto");
	r = xp_fwatch_new(d->loop, files, nf, TLS_SETTLE_MS, tls_files_changed, d, &d->tls_watch);
	if (r < 0)
		log_warn("TLS: cannot watch the certificate files (%s); reload with SIGHUP",
			 strerror(-r));
}

/*
 * A carried connection holds FDS_PER_CONN fds (its two sockets and a splice pipe each way), and a
 * resumable one a pipe more per --pipe-size of --resume-buffer (at most 16) and its replay pipe;
 * FDS_SPARE cover listeners, control clients, QMP and libvirt. The soft limit is raised to what
 * --max-connections needs, as far as the hard limit allows; short of it, say so, since each
 * connection past the limit waits in a listen queue.
 */
#define FDS_PER_CONN 6
#define FDS_SPARE    256

static unsigned int fds_per_conn(const struct ctl_options *o)
{
	unsigned long kept = (o->resume_keep + o->pipe_size - 1) / o->pipe_size;

	if (!o->resume_timeout_s)
		return FDS_PER_CONN;
	return FDS_PER_CONN + 2 * ((kept < 16 ? kept : 16) + 1);
}

static void raise_nofile(unsigned long conns, unsigned int per_conn)
{
	rlim_t want = (rlim_t)conns * per_conn + FDS_SPARE, was;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	was = rl.rlim_cur;
	if (rl.rlim_cur < want) {
		rl.rlim_cur =
			rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			rl.rlim_cur = was;
	}
	if (rl.rlim_cur < want)
		log_warn("open files limit %llu (hard limit %llu) is below the %llu that "
			 "--max-connections %lu needs (%u per connection, %u spare): past it, "
			 "connections wait in the listen queues until fds are free; raise "
			 "LimitNOFILE= or the hard limit",
			 (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
			 (unsigned long long)want, conns, per_conn, FDS_SPARE);
	else if (rl.rlim_cur != was)
		log_info("open files limit raised from %llu to %llu for --max-connections %lu",
			 (unsigned long long)was, (unsigned long long)rl.rlim_cur, conns);
}

/* --node-bandwidth N%: the node cap from the speed of the link that holds the advertised
 * address, fixed at start. A link whose speed is not known is an error, not a guess. */
static int node_share(struct daemon *d, const struct ctl_options *o)
{
	struct ctl_nic_view v;
	char speed[32], rate[32];

	if (!d->nic || !ctl_nic_node(d->nic, &v)) {
		log_err("--node-bandwidth %g%%: no interface here holds the advertised address %s, "
			"so there is no link speed to take a share of; give a rate",
			o->node_share_pct, px_node_advertise(d->node));
		return -EINVAL;
	}
	if (!v.speed_known) {
		log_err("--node-bandwidth %g%%: the speed of %s (%s) is unknown (%s); give a rate",
			o->node_share_pct, v.nic.name, v.nic.kind,
			v.nic.pci[0]
				? "its device reports none, or it has no carrier"
				: "it has no device: veth, bridges and the like have no speed");
		return -EINVAL;
	}
	d->node_bandwidth = (uint64_t)(v.speed * o->node_share_pct / 100);
	px_node_set_bandwidth(d->node, d->node_bandwidth);
	log_info("node cap: %g%% of %s's %s = %s", o->node_share_pct, v.nic.name,
		 vm_format_rate(v.speed, speed, sizeof(speed)),
		 vm_format_rate(d->node_bandwidth, rate, sizeof(rate)));
	return 0;
}

/* The signals on_signal() serves, blocked here so that only its signalfd sees them. */
static void block_signals(sigset_t *mask)
{
	/* Writes to a closed peer must come back as EPIPE, not kill the daemon. */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(mask);
	sigaddset(mask, SIGTERM);
	sigaddset(mask, SIGINT);
	sigaddset(mask, SIGHUP);
	sigaddset(mask, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, mask, NULL);
}

/* --takeover, before the node exists: the running vmigd's offer, whose node-hop listener the
 * node adopts. */
static int start_ask(struct daemon *d, const struct ctl_options *o)
{
	char err[400];
	int r;

	if (!o->takeover)
		return 0;
	r = ctl_takeover_ask(o->control, &d->offer, err, sizeof(err));
	if (r < 0) {
		log_err("takeover: %s", err);
		return r;
	}
	log_info("takeover: vmigd pid %d offers its listeners", d->offer.pid);
	d->pc.adopt = true;
	d->pc.adopt_fd = d->offer.node_fd;
	d->offer.node_fd = -1;
	return 0;
}

/* The node: its data-path workers (the io_uring pool, one ring per thread) and the node hop's
 * listener, then convergence control and the NICs that follow its migrations. */
static int start_node(struct daemon *d, const struct ctl_options *o)
{
	struct ctl_hop_conf hop = {
		.eal = o->dpdk_eal,
		.address = o->dpdk_address,
		.udp_port = (uint16_t)o->dpdk_port,
		.buffer = (uint32_t)o->dpdk_buffer,
		.wrap = ctl_test_hop_wrap(),
	};
	struct xp_io *io;
	int r;

	r = ctl_io_new(d->loop, &d->pc, &hop, &io);
	if (r < 0)
		return r;
	r = px_node_new(io, &d->pc, &d->node);
	if (r < 0)
		return r;
	r = cv_set_new(d->loop, d->node, &d->conv);
	if (r < 0) {
		log_err("cannot set up convergence control: %s", strerror(-r));
		return r;
	}
	d->info.conv = d->conv;
	r = ctl_nic_new(d->loop, d->node, d->conv, o->link_down_timeout_s, &d->nic);
	if (r < 0)
		log_warn("cannot follow the node hop's interfaces through netlink (%s): status and "
			 "metrics show no NIC, and link events are not seen",
			 strerror(-r));
	d->info.nic = d->nic;
	d->info.cpus = d->cpus[0] ? d->cpus : NULL;
	return o->node_share_pct > 0 ? node_share(d, o) : 0;
}

/* The control socket: a new one, or the one the old vmigd handed over (--takeover). */
static int start_control(struct daemon *d, const struct ctl_options *o)
{
	int holder, r;

	if (o->takeover) {
		r = ctl_server_adopt(d->loop, o->control, d->offer.ctl_fd, d->offer.lock_fd,
				     d->node, &d->info, &d->ctl);
		if (r < 0) {
			log_err("takeover: cannot serve the control socket handed over: %s",
				strerror(-r));
			return r;
		}
		d->offer.ctl_fd = d->offer.lock_fd = -1;
	} else {
		r = ctl_server_new(d->loop, o->control, d->node, &d->info, &holder, &d->ctl);
	}
	if (r == -EADDRINUSE) {
		log_err("another vmigd (pid %d) is already running with control socket %s", holder,
			o->control);
		return r;
	}
	if (r < 0) {
		log_err("cannot create control socket %s: %s", o->control, strerror(-r));
		return r;
	}
	return 0;
}

/* --metrics: the HTTP endpoint, on the listener the old vmigd handed over where it had one. */
static int start_metrics(struct daemon *d, const struct ctl_options *o)
{
	char err[300];
	int r;

	if (!o->metrics) {
		if (d->offer.metrics_fd >= 0)
			log_warn("takeover: the previous vmigd served metrics; this one runs without "
				 "--metrics, so the endpoint closes");
		return 0;
	}
	if (d->offer.metrics_fd >= 0) {
		r = ctl_metrics_server_adopt(d->loop, d->node, d->conv, d->nic, d->offer.metrics_fd,
					     &d->metrics, err, sizeof(err));
		d->offer.metrics_fd = -1;
	} else {
		r = ctl_metrics_server_new(d->loop, d->node, d->conv, d->nic, &d->metrics_addr,
					   &d->metrics, err, sizeof(err));
	}
	if (r < 0) {
		log_err("metrics: %s", err);
		return r;
	}
	d->info.metrics = ctl_metrics_server_addr(d->metrics);
	ctl_metrics_server_want_dpdk(d->metrics, o->dpdk_eal != NULL);
	log_info("metrics: serving http://%s/metrics (health: /healthz, /readyz)", d->info.metrics);
	return 0;
}

/* Takeover, either side: ready to give (SIGUSR2 on a later vmigd), and with --takeover, the
 * moved targets started and the old vmigd told to let go. */
static int start_takeover(struct daemon *d, const struct ctl_options *o)
{
	char err[400];
	int r;

	r = ctl_takeover_new(&(struct ctl_takeover_parts){ .loop = d->loop,
							   .node = d->node,
							   .ctl = d->ctl,
							   .ctl_ops = &ctl_server_takeover_ops,
							   .metrics = d->metrics,
							   .conv = d->conv,
							   .drain_timeout_s = d->drain_timeout_s,
							   .committed = handed_over,
							   .retired = retired,
							   .arg = d },
			     &d->takeover);
	if (r < 0) {
		log_err("out of memory");
		return r;
	}
	d->info.takeover = d->takeover;
	if (!o->takeover)
		return 0;
	r = ctl_takeover_finish(d->takeover, &d->offer, err, sizeof(err));
	if (r < 0) {
		log_err("takeover: %s; vmigd pid %d carries on", err, d->offer.pid);
		return r;
	}
	ctl_takeover_offer_done(&d->offer);
	return 0;
}

static int start_signals(struct daemon *d, const sigset_t *mask)
{
	d->sfd = signalfd(-1, mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (d->sfd < 0 || xp_watch_add(d->loop, d->sfd, EPOLLIN, on_signal, d, &d->sigw) < 0) {
		log_err("cannot watch signals: %s", strerror(errno));
		return -errno;
	}
	return 0;
}

/* What runs, as the log's start lines say it. */
static void log_start(struct daemon *d, const struct ctl_options *o)
{
	char rate[32];

	if (d->tls)
		log_tls_start(d, o);
	else
		log_warn("node hop is plain text (--no-tls): migration data crosses the network "
			 "unencrypted and peers are not authenticated");
	log_info("vmigd %s started: listen=%s advertise=%s control=%s threads=%u data_path=%s "
		 "cpus=%s",
		 VMIGD_VERSION, px_node_listen_str(d->node), px_node_advertise(d->node), o->control,
		 px_node_threads(d->node), px_node_data_path(d->node),
		 d->cpus[0] ? d->cpus : "any");
	log_info("bandwidth: node cap %s, shaper %s, inspection %s, digests %s, compression %s "
		 "(zstd level %lu), caps %s at switchover",
		 vm_format_rate(o->node_share_pct > 0 ? d->node_bandwidth : o->node_bandwidth, rate,
				sizeof(rate)),
		 px_shaper_str(o->shaper), o->no_inspect ? "off" : "on",
		 px_digest_str(o->digest), px_compress_str((enum px_compress)o->compress),
		 o->compress_level, o->keep_cap_at_switchover ? "kept" : "lifted");
	if (o->dpdk_eal)
		log_info("DPDK node hop: %s udp %lu, %s, for peers that have one too",
			 o->dpdk_address, o->dpdk_port,
			 d->tls ? "sealed with AES-256-GCM keys from each connection's TLS 1.3 "
				  "session"
				: "plain text (--no-tls)");
}

/* The event loop, the node, convergence control, the control socket, metrics and the signals;
 * what was made before a failure is left in d for daemon_done(). Logs its errors. */
static int daemon_start(struct daemon *d, const struct ctl_options *o)
{
	sigset_t mask;
	int r;

	d->info.started_ms = vm_now_ms();
	raise_nofile(o->slots, fds_per_conn(o));
	block_signals(&mask);
	r = xp_loop_new(&d->loop);
	if (r < 0) {
		log_err("cannot create the event loop: %s", strerror(-r));
		return r;
	}
	r = start_ask(d, o);
	r = r ?: start_node(d, o);
	r = r ?: start_control(d, o);
	r = r ?: start_metrics(d, o);
	r = r ?: start_takeover(d, o);
	r = r ?: start_signals(d, &mask);
	r = r ?: ctl_watchdog_new(d->loop, o->takeover ? d->offer.pid : 0, &d->watchdog);
	if (r < 0)
		return r;
	ctl_test_start(d->loop);
	log_start(d, o);
	/* systemd (Type=notify): the control socket and the node-hop listener accept from here.
	 * A vmigd that took over is made the main process by the old one, and the service is
	 * ready already. */
	if (o->takeover)
		return 0;
	r = ctl_notify("READY=1");
	if (r < 0)
		log_warn("systemd: cannot send READY=1 to $NOTIFY_SOCKET: %s", strerror(-r));
	return 0;
}

/* Until a signal and a drain end the loop. */
static int daemon_run(struct daemon *d)
{
	int r = xp_loop_run(d->loop);

	if (r < 0)
		log_err("event loop: %s", strerror(-r));
	return r;
}

/* Takes a daemon in any state daemon_configure() or daemon_start() left it. */
static void daemon_done(struct daemon *d)
{
	ctl_watchdog_free(d->watchdog);
	xp_watch_del(d->sigw);
	if (d->sfd >= 0)
		close(d->sfd);
	ctl_takeover_free(d->takeover);
	ctl_takeover_offer_done(&d->offer);
	ctl_takeover_cmd_done(&d->takeover_cmd);
	ctl_metrics_server_free(d->metrics);
	ctl_server_free(d->ctl);
	xp_fwatch_free(d->tls_watch);
	/* Monitors read the node's figures: stop them first. */
	ctl_nic_free(d->nic);
	cv_set_free(d->conv);
	/* The node's links hold TLS sessions: free it first. */
	px_node_free(d->node);
	xp_tls_free(d->tls);
	xp_loop_free(d->loop);
}

int main(int argc, char **argv)
{
	struct ctl_options o;
	struct daemon d = { .sfd = -1,
			    .offer = { .sock = -1,
				       .ctl_fd = -1,
				       .lock_fd = -1,
				       .node_fd = -1,
				       .metrics_fd = -1 } };
	int r, status = 1;

	r = ctl_options_init(&o);
	if (r < 0)
		goto out_options;
	r = ctl_test_init(&argc, argv);
	if (r < 0)
		goto out_options;
	r = ctl_options_parse(argc, argv, &o);
	if (r != 0) {
		status = r > 0 ? 0 : 1;
		goto out_options;
	}
	if (daemon_configure(&d, &o) < 0)
		goto out_daemon;
	if (o.check_only) {
		printf("vmigd: configuration ok\n");
		status = 0;
		goto out_daemon;
	}
	if (ctl_takeover_cmd_init(&d.takeover_cmd, argc, argv) < 0)
		goto out_daemon;
	if (daemon_start(&d, &o) < 0 || daemon_run(&d) < 0)
		goto out_daemon;
	status = 0;
out_daemon:
	daemon_done(&d);
	if (status == 0 && !o.check_only)
		log_info("stopped");
out_options:
	ctl_options_done(&o);
	return status;
}
