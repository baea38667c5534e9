// SPDX-License-Identifier: Apache-2.0
/* vmigd(8): the per-node migration transport daemon. Parses options (command line and
 * --config), starts the node (listener, data-path workers) and the control socket, and runs
 * the control loop until SIGTERM/SIGINT, when it drains and exits 0. */
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

#include "ctl_server.h"
#include "log.h"
#include "px_node.h"
#include "util.h"
#include "vmigd-config.h"

#define MAX_CONFIG_ARGS 128

struct options {
	const char *control;
	const char *listen;
	const char *advertise;
	bool no_tls;
	unsigned int threads;
	unsigned long order_timeout_ms;
	unsigned long connect_timeout_ms;
	unsigned long drain_timeout_s;
	unsigned long pipe_size;
	unsigned long slots;
	bool copy_path;
	enum vm_log_level log_level;
	bool check_only;
};

struct daemon {
	struct xp_loop *loop;
	struct px_node *node;
	struct ctl_server *ctl;
	struct ctl_daemon_info info;
	unsigned int drain_timeout_s;
	bool draining;
};

static const struct option long_opts[] = {
	{ "control", required_argument, NULL, 'c' },
	{ "listen", required_argument, NULL, 'l' },
	{ "advertise", required_argument, NULL, 'a' },
	{ "no-tls", no_argument, NULL, 'T' },
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
		"usage: vmigd [--control PATH] [--listen ADDR:PORT] [--advertise ADDR] --no-tls\n"
		"             [--threads N] [--order-timeout MS] [--connect-timeout MS]\n"
		"             [--drain-timeout S] [--pipe-size BYTES] [--max-connections N]\n"
		"             [--data-path splice|copy]\n"
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

static void on_signal(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct daemon *d = arg;
	struct signalfd_siginfo si;

	if (read(fd, &si, sizeof(si)) != sizeof(si))
		return;
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
	};
	struct px_config pc = { 0 };
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
	if (!o.no_tls) {
		fprintf(stderr, "vmigd: TLS on the node hop is not implemented yet; "
				"pass --no-tls to carry migrations in plain text\n");
		return 1;
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
	if (xp_unix_path_ok(o.control) < 0) {
		fprintf(stderr, "vmigd: --control: path too long or empty: \"%s\"\n", o.control);
		return 1;
	}
	if (o.check_only) {
		printf("vmigd: configuration ok\n");
		return 0;
	}
	pc.threads = o.threads;
	pc.slots = (o.slots + o.threads - 1) / o.threads;
	pc.pipe_size = o.pipe_size;
	pc.copy_path = o.copy_path;
	pc.order_timeout_ms = o.order_timeout_ms;
	pc.connect_timeout_ms = o.connect_timeout_ms;
	d.drain_timeout_s = o.drain_timeout_s;
	d.info.started_ms = vm_now_ms();
	d.info.tls = false;
	d.info.control_path = o.control;

	/* Writes to a closed peer must come back as EPIPE, not kill the daemon. */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);

	r = xp_loop_new(&d.loop);
	if (r < 0) {
		log_err("cannot create the event loop: %s", strerror(-r));
		goto out;
	}
	r = px_node_new(d.loop, &pc, &d.node);
	if (r < 0)
		goto out;
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
	sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0 || xp_watch_add(d.loop, sfd, EPOLLIN, on_signal, &d, &sigw) < 0) {
		log_err("cannot watch signals: %s", strerror(errno));
		goto out;
	}
	log_warn("node hop is plain text (--no-tls): migration data crosses the network "
		 "unencrypted");
	log_info("vmigd %s started: listen=%s advertise=%s control=%s threads=%u data_path=%s",
		 VMIGD_VERSION, px_node_listen_str(d.node), px_node_advertise(d.node), o.control,
		 px_node_threads(d.node), px_node_data_path(d.node));
	r = xp_loop_run(d.loop);
	if (r < 0)
		log_err("event loop: %s", strerror(-r));
	else
		status = 0;
out:
	xp_watch_del(sigw);
	if (sfd >= 0)
		close(sfd);
	ctl_server_free(d.ctl);
	px_node_free(d.node);
	xp_loop_free(d.loop);
	if (status == 0)
		log_info("stopped");
	return status;
}
