// SPDX-License-Identifier: Apache-2.0
/* vmigd(8): the per-node migration transport daemon. Parses options (command line and
 * --config), loads TLS, starts the node (listener, data-path workers) and the control socket, and
 * the metrics endpoint, and runs the control loop until SIGTERM/SIGINT, when it drains and exits 0.
 * SIGHUP reloads TLS. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "ctl_metrics.h"
#include "ctl_server.h"
#include "log.h"
#include "px_node.h"
#include "units.h"
#include "util.h"
#include "vmigd-config.h"
#include "xp_fwatch.h"
#include "xp_tls.h"

#define MAX_CONFIG_ARGS 128
/* After the last change to a certificate file, wait this long for its siblings to follow. */
#define TLS_SETTLE_MS 300

struct options {
	const char *control;
	const char *listen;
	const char *advertise;
	bool no_tls;
	struct xp_tls_conf tls;
	unsigned long handshake_timeout_ms;
	unsigned long preamble_timeout_ms;
	unsigned long max_unauth;
	unsigned long max_migration_conns;
	unsigned int threads;
	unsigned long order_timeout_ms;
	unsigned long connect_timeout_ms;
	unsigned long drain_timeout_s;
	unsigned long pipe_size;
	unsigned long slots;
	bool copy_path;
	uint64_t node_bandwidth;
	enum px_shaper shaper;
	bool no_inspect;
	bool keep_cap_at_switchover;
	const char *metrics;
	enum vm_log_level log_level;
	bool check_only;
};

struct daemon {
	struct xp_loop *loop;
	struct xp_tls *tls;
	struct xp_fwatch *tls_watch;
	struct px_node *node;
	struct ctl_server *ctl;
	struct ctl_metrics_server *metrics;
	struct cv_set *conv;
	struct ctl_daemon_info info;
	unsigned int drain_timeout_s;
	bool draining;
};

static const struct option long_opts[] = {
	{ "control", required_argument, NULL, 'c' },
	{ "listen", required_argument, NULL, 'l' },
	{ "advertise", required_argument, NULL, 'a' },
	{ "no-tls", no_argument, NULL, 'T' },
	{ "tls-cert", required_argument, NULL, 1001 },
	{ "tls-key", required_argument, NULL, 1002 },
	{ "tls-ca", required_argument, NULL, 1003 },
	{ "tls-client-cert", required_argument, NULL, 1004 },
	{ "tls-client-key", required_argument, NULL, 1005 },
	{ "tls-allow", required_argument, NULL, 1006 },
	{ "no-tls-resumption", no_argument, NULL, 1007 },
	{ "no-ktls", no_argument, NULL, 1008 },
	{ "handshake-timeout", required_argument, NULL, 1009 },
	{ "preamble-timeout", required_argument, NULL, 1010 },
	{ "max-unauthenticated", required_argument, NULL, 1011 },
	{ "max-migration-conns", required_argument, NULL, 1012 },
	{ "node-bandwidth", required_argument, NULL, 1013 },
	{ "shaper", required_argument, NULL, 1014 },
	{ "no-inspect", no_argument, NULL, 1015 },
	{ "keep-cap-at-switchover", no_argument, NULL, 1016 },
	{ "metrics", required_argument, NULL, 1017 },
	{ "threads", required_argument, NULL, 't' },
	{ "order-timeout", required_argument, NULL, 'O' },
	{ "connect-timeout", required_argument, NULL, 'C' },
	{ "drain-timeout", required_argument, NULL, 'D' },
	{ "pipe-size", required_argument, NULL, 'P' },
	{ "max-connections", required_argument, NULL, 'M' },
	{ "data-path", required_argument, NULL, 'X' },
	{ "log-level", required_argument, NULL, 'L' },
	{ "config", required_argument, NULL, 'f' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: vmigd [--control PATH] [--listen ADDR:PORT] [--advertise ADDR]\n"
		"             (--tls-cert FILE --tls-key FILE --tls-ca FILE | --no-tls)\n"
		"             [--tls-client-cert FILE --tls-client-key FILE] [--tls-allow NAMES]\n"
		"             [--no-tls-resumption] [--no-ktls] [--handshake-timeout MS]\n"
		"             [--preamble-timeout MS] [--max-unauthenticated N]\n"
		"             [--max-migration-conns N]\n"
		"             [--threads N] [--order-timeout MS] [--connect-timeout MS]\n"
		"             [--drain-timeout S] [--pipe-size BYTES] [--max-connections N]\n"
		"             [--data-path splice|copy]\n"
		"             [--node-bandwidth RATE] [--shaper bucket|pacing] [--no-inspect]\n"
		"             [--keep-cap-at-switchover] [--metrics ADDR:PORT]\n"
		"             [--log-level error|warning|info|debug] [--config FILE] [-n]\n"
		"Carries QEMU live-migration connections between nodes. See vmigd(8).\n");
}

static int parse_ulong(const char *name, const char *s, unsigned long min, unsigned long max,
		       unsigned long *ret)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || !*s || *end || *s == '-' || v < min || v > max) {
		fprintf(stderr, "vmigd: --%s: expected a number from %lu to %lu, got \"%s\"\n",
			name, min, max, s);
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

/* Strings made from --config lines; getopt keeps pointers into them until exit. */
static char *config_args[MAX_CONFIG_ARGS];
static int config_nargs;

static void free_config_args(void)
{
	while (config_nargs > 0)
		free(config_args[--config_nargs]);
}

/* Reads "option value" lines; each becomes "--option value" ahead of the command line's own. */
static int read_config(const char *path)
{
	char **args = config_args;
	int *nargs = &config_nargs;
	char line[1024];
	FILE *f = fopen(path, "re");
	int lineno = 0;

	if (!f) {
		fprintf(stderr, "vmigd: cannot read config %s: %s\n", path, strerror(errno));
		return -errno;
	}
	while (fgets(line, sizeof(line), f)) {
		char *name = line, *val, *end;

		lineno++;
		name += strspn(name, " \t");
		end = name + strcspn(name, "#\r\n");
		while (end > name && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		*end = '\0';
		if (!*name)
			continue;
		val = name + strcspn(name, " \t=");
		if (*val) {
			*val++ = '\0';
			val += strspn(val, " \t=");
		}
		if (*nargs + 2 > MAX_CONFIG_ARGS || strcmp(name, "config") == 0) {
			fprintf(stderr, "vmigd: %s:%d: too many options or a nested config\n", path,
				lineno);
			fclose(f);
			return -EINVAL;
		}
		if (asprintf(&args[*nargs], "--%s", name) < 0 ||
		    (++*nargs, *val && !(args[(*nargs)++] = strdup(val)))) {
			fclose(f);
			return -ENOMEM;
		}
	}
	fclose(f);
	return 0;
}

static int parse_options(int argc, char **argv, struct options *o)
{
	unsigned long v;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "c:l:a:t:nhV", long_opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			o->control = optarg;
			break;
		case 'l':
			o->listen = optarg;
			break;
		case 'a':
			o->advertise = optarg;
			break;
		case 'T':
			o->no_tls = true;
			break;
		case 1001:
			o->tls.cert = optarg;
			break;
		case 1002:
			o->tls.key = optarg;
			break;
		case 1003:
			o->tls.ca = optarg;
			break;
		case 1004:
			o->tls.client_cert = optarg;
			break;
		case 1005:
			o->tls.client_key = optarg;
			break;
		case 1006:
			o->tls.allow = optarg;
			break;
		case 1007:
			o->tls.resumption = false;
			break;
		case 1008:
			o->tls.ktls = false;
			break;
		case 1009:
			if (parse_ulong("handshake-timeout", optarg, 100, 600000,
					&o->handshake_timeout_ms))
				return -EINVAL;
			break;
		case 1010:
			if (parse_ulong("preamble-timeout", optarg, 100, 600000,
					&o->preamble_timeout_ms))
				return -EINVAL;
			break;
		case 1011:
			if (parse_ulong("max-unauthenticated", optarg, 1, 65536, &o->max_unauth))
				return -EINVAL;
			break;
		case 1012:
			if (parse_ulong("max-migration-conns", optarg, 1, 65536,
					&o->max_migration_conns))
				return -EINVAL;
			break;
		case 't':
			if (parse_ulong("threads", optarg, 1, 64, &v) < 0)
				return -EINVAL;
			o->threads = v;
			break;
		case 'O':
			if (parse_ulong("order-timeout", optarg, 100, 3600000,
					&o->order_timeout_ms))
				return -EINVAL;
			break;
		case 'C':
			if (parse_ulong("connect-timeout", optarg, 100, 3600000,
					&o->connect_timeout_ms))
				return -EINVAL;
			break;
		case 'D':
			if (parse_ulong("drain-timeout", optarg, 0, 86400, &o->drain_timeout_s))
				return -EINVAL;
			break;
		case 'P':
			if (parse_ulong("pipe-size", optarg, 4096, 64 << 20, &o->pipe_size))
				return -EINVAL;
			break;
		case 'M':
			if (parse_ulong("max-connections", optarg, 1, 1 << 20, &o->slots))
				return -EINVAL;
			break;
		case 'X':
			if (strcmp(optarg, "splice") != 0 && strcmp(optarg, "copy") != 0) {
				fprintf(stderr, "vmigd: --data-path: use splice or copy\n");
				return -EINVAL;
			}
			o->copy_path = strcmp(optarg, "copy") == 0;
			break;
		case 1013:
			if (vm_parse_rate(optarg, &o->node_bandwidth) < 0) {
				fprintf(stderr,
					"vmigd: --node-bandwidth: expected a rate such as 1Gbit, "
					"500MB, 64Mi or none (vmigd(8): RATE UNITS), got \"%s\"\n",
					optarg);
				return -EINVAL;
			}
			break;
		case 1014:
			if (strcmp(optarg, "bucket") == 0) {
				o->shaper = PX_SHAPE_BUCKET;
			} else if (strcmp(optarg, "pacing") == 0) {
				o->shaper = PX_SHAPE_PACING;
			} else {
				fprintf(stderr, "vmigd: --shaper: use bucket or pacing\n");
				return -EINVAL;
			}
			break;
		case 1015:
			o->no_inspect = true;
			break;
		case 1016:
			o->keep_cap_at_switchover = true;
			break;
		case 1017:
			o->metrics = optarg;
			break;
		case 'L':
			if (vm_log_level_parse(optarg, &o->log_level) < 0) {
				fprintf(stderr,
					"vmigd: --log-level: use error, warning, info or debug\n");
				return -EINVAL;
			}
			break;
		case 'f':
			break;
		case 'n':
			o->check_only = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("vmigd %s\n", VMIGD_VERSION);
			exit(0);
		default:
			usage(stderr);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "vmigd: unexpected argument \"%s\"\n", argv[optind]);
		return -EINVAL;
	}
	return 0;
}

static void drained(void *arg)
{
	struct daemon *d = arg;

	log_info("drained; exiting");
	xp_loop_quit(d->loop);
}

/* New connections get the new pair; links in flight keep theirs. A bad pair changes nothing. */
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
	else
		log_info("TLS: generation %u: %s (%s)", xp_tls_generation(d->tls),
			 xp_tls_describe(d->tls), why);
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
	if (d->draining) {
		log_warn("%s again: cutting what is left and exiting", strsignal(si.ssi_signo));
		xp_loop_quit(d->loop);
		return;
	}
	d->draining = true;
	log_info("%s: no new connections; draining", strsignal(si.ssi_signo));
	px_node_drain(d->node, d->drain_timeout_s, drained, d);
}

static unsigned int default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : n > 4 ? 4 : n;
}

int main(int argc, char **argv)
{
	struct options o = {
		.control = VMIGD_DEFAULT_CONTROL,
		.listen = "0.0.0.0:0",
		.threads = default_threads(),
		.order_timeout_ms = 10000,
		.connect_timeout_ms = 10000,
		.drain_timeout_s = 300,
		.pipe_size = 1 << 20,
		.slots = 1024,
		.log_level = VM_LOG_INFO,
		.tls = { .resumption = true, .ktls = true },
		.handshake_timeout_ms = 10000,
		.preamble_timeout_ms = 5000,
		.max_unauth = 64,
		.max_migration_conns = 64,
		.shaper = PX_SHAPE_BUCKET,
	};
	struct px_config pc = { 0 };
	struct xp_addr metrics_addr;
	char rate[32];
	struct daemon d = { 0 };
	char *args[MAX_CONFIG_ARGS + 256];
	struct xp_watch *sigw = NULL;
	int nargs = 1, holder, sfd = -1, r, status = 1;
	sigset_t mask;

	/* --config lines go first so that the command line overrides them. */
	atexit(free_config_args);
	args[0] = argv[0];
	for (int i = 1; i < argc; i++) {
		const char *cfg = NULL;

		if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
			cfg = argv[i + 1];
		else if (strncmp(argv[i], "--config=", 9) == 0)
			cfg = argv[i] + 9;
		if (cfg && read_config(cfg) < 0)
			return 1;
	}
	for (int i = 0; i < config_nargs; i++)
		args[nargs++] = config_args[i];
	if (argc > 256) {
		fprintf(stderr, "vmigd: too many arguments\n");
		return 1;
	}
	for (int i = 1; i < argc; i++)
		args[nargs++] = argv[i];
	args[nargs] = NULL;
	if (parse_options(nargs, args, &o) < 0)
		return 1;

	vm_log_setup("vmigd", o.log_level);
	if (o.no_tls && (o.tls.cert || o.tls.key || o.tls.ca)) {
		fprintf(stderr, "vmigd: --no-tls contradicts --tls-cert/--tls-key/--tls-ca\n");
		return 1;
	}
	if (!o.no_tls && (!o.tls.cert || !o.tls.key || !o.tls.ca)) {
		fprintf(stderr,
			"vmigd: the node hop is TLS by default: give --tls-cert, --tls-key and "
			"--tls-ca (PEM), or --no-tls to carry migrations in plain text\n");
		return 1;
	}
	if (!o.tls.client_cert != !o.tls.client_key) {
		fprintf(stderr, "vmigd: --tls-client-cert and --tls-client-key go together\n");
		return 1;
	}
	if (!o.no_tls) {
		char err[300];

		if (xp_tls_new(&o.tls, &d.tls, err, sizeof(err)) < 0) {
			fprintf(stderr, "vmigd: TLS: %s\n", err);
			return 1;
		}
	}
	if (xp_addr_parse(o.listen, 1, &pc.listen) < 0) {
		fprintf(stderr, "vmigd: --listen: expected ADDR:PORT (numeric), got \"%s\"\n",
			o.listen);
		return 1;
	}
	if (o.advertise) {
		struct xp_addr a;

		if (strlen(o.advertise) >= sizeof(pc.advertise) ||
		    xp_addr_from_host(o.advertise, 1, &a) < 0) {
			fprintf(stderr,
				"vmigd: --advertise: expected a numeric IP address, got \"%s\"\n",
				o.advertise);
			return 1;
		}
		strcpy(pc.advertise, o.advertise);
	}
	if (o.metrics && xp_addr_parse(o.metrics, 1, &metrics_addr) < 0) {
		fprintf(stderr,
			"vmigd: --metrics: expected ADDR:PORT (numeric; IPv6 as [ADDR]:PORT), got "
			"\"%s\"\n",
			o.metrics);
		return 1;
	}
	if (xp_unix_path_ok(o.control) < 0) {
		fprintf(stderr, "vmigd: --control: path too long or empty: \"%s\"\n", o.control);
		return 1;
	}
	if (o.check_only) {
		printf("vmigd: configuration ok\n");
		xp_tls_free(d.tls);
		return 0;
	}
	pc.threads = o.threads;
	pc.slots = (o.slots + o.threads - 1) / o.threads;
	pc.pipe_size = o.pipe_size;
	pc.copy_path = o.copy_path;
	pc.order_timeout_ms = o.order_timeout_ms;
	pc.connect_timeout_ms = o.connect_timeout_ms;
	pc.tls = d.tls;
	pc.handshake_timeout_ms = o.handshake_timeout_ms;
	pc.preamble_timeout_ms = o.preamble_timeout_ms;
	pc.max_unauth = o.max_unauth;
	pc.max_migration_conns = o.max_migration_conns;
	pc.node_bandwidth = o.node_bandwidth;
	pc.shaper = o.shaper;
	pc.inspect = !o.no_inspect;
	pc.keep_cap_at_switchover = o.keep_cap_at_switchover;
	d.drain_timeout_s = o.drain_timeout_s;
	d.info.started_ms = vm_now_ms();
	d.info.tls = d.tls;
	d.info.control_path = o.control;

	/* Writes to a closed peer must come back as EPIPE, not kill the daemon. */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);

	r = xp_loop_new(&d.loop);
	if (r < 0) {
		log_err("cannot create the event loop: %s", strerror(-r));
		goto out;
	}
	r = px_node_new(d.loop, &pc, &d.node);
	if (r < 0)
		goto out;
	r = cv_set_new(d.loop, d.node, &d.conv);
	if (r < 0) {
		log_err("cannot set up convergence control: %s", strerror(-r));
		goto out;
	}
	d.info.conv = d.conv;
	r = ctl_server_new(d.loop, o.control, d.node, &d.info, &holder, &d.ctl);
	if (r == -EADDRINUSE) {
		log_err("another vmigd (pid %d) is already running with control socket %s", holder,
			o.control);
		goto out;
	}
	if (r < 0) {
		log_err("cannot create control socket %s: %s", o.control, strerror(-r));
		goto out;
	}
	if (o.metrics) {
		char err[300];

		r = ctl_metrics_server_new(d.loop, d.node, d.conv, &metrics_addr, &d.metrics, err,
					   sizeof(err));
		if (r < 0) {
			log_err("metrics: %s", err);
			goto out;
		}
		d.info.metrics = ctl_metrics_server_addr(d.metrics);
		log_info("metrics: serving http://%s/metrics", d.info.metrics);
	}
	sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0 || xp_watch_add(d.loop, sfd, EPOLLIN, on_signal, &d, &sigw) < 0) {
		log_err("cannot watch signals: %s", strerror(errno));
		goto out;
	}
	if (d.tls) {
		const char *files[5];
		unsigned int nf = xp_tls_files(d.tls, files);
		char allow[300] = "";

		for (unsigned int i = 0; xp_tls_allow_list(d.tls, i); i++)
			snprintf(allow + strlen(allow), sizeof(allow) - strlen(allow), "%s%s",
				 i ? "," : "", xp_tls_allow_list(d.tls, i));
		log_info("TLS: generation %u: %s; CA %s; allow %s; resumption %s; kernel kTLS %s",
			 xp_tls_generation(d.tls), xp_tls_describe(d.tls), o.tls.ca, allow,
			 o.tls.resumption ? "on" : "off",
			 xp_tls_kernel_has_ktls()
				 ? (o.tls.ktls ? "used" : "present, off (--no-ktls)")
				 : "absent: user-space crypto");
		r = xp_fwatch_new(d.loop, files, nf, TLS_SETTLE_MS, tls_files_changed, &d,
				  &d.tls_watch);
		if (r < 0)
			log_warn("TLS: cannot watch the certificate files (%s); reload with SIGHUP",
				 strerror(-r));
	} else {
		log_warn("node hop is plain text (--no-tls): migration data crosses the network "
			 "unencrypted and peers are not authenticated");
	}
	log_info("vmigd %s started: listen=%s advertise=%s control=%s threads=%u data_path=%s",
		 VMIGD_VERSION, px_node_listen_str(d.node), px_node_advertise(d.node), o.control,
		 px_node_threads(d.node), px_node_data_path(d.node));
	log_info("bandwidth: node cap %s, shaper %s, inspection %s, caps %s at switchover",
		 vm_format_rate(o.node_bandwidth, rate, sizeof(rate)), px_shaper_str(o.shaper),
		 o.no_inspect ? "off" : "on", o.keep_cap_at_switchover ? "kept" : "lifted");
	r = xp_loop_run(d.loop);
	if (r < 0)
		log_err("event loop: %s", strerror(-r));
	else
		status = 0;
out:
	xp_watch_del(sigw);
	if (sfd >= 0)
		close(sfd);
	ctl_metrics_server_free(d.metrics);
	ctl_server_free(d.ctl);
	xp_fwatch_free(d.tls_watch);
	/* Monitors read the node's figures: stop them first. */
	cv_set_free(d.conv);
	/* The node's links hold TLS sessions: free it first. */
	px_node_free(d.node);
	xp_tls_free(d.tls);
	xp_loop_free(d.loop);
	if (status == 0)
		log_info("stopped");
	return status;
}
