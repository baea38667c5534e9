/* SPDX-License-Identifier: Apache-2.0 */
/* Takeover (vmigd --takeover, doc/design.md "Upgrades without losing a migration"): a new vmigd
 * asks the running one on its control socket for its listeners (SCM_RIGHTS) and the targets that
 * have had no connection yet, then takes the live migrations whose connections all resume; the
 * old one carries the rest until they end. */
#ifndef CTL_TAKEOVER_H
#define CTL_TAKEOVER_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include "ctl_request.h"
#include "xp_loop.h"

struct ctl_server;
struct ctl_metrics_server;
struct cv_set;
struct json_object;
struct ctl_takeover;

/*
 * The control server as the takeover reaches it (ctl_server.c fills ctl_server_takeover_ops), so
 * that the takeover does not include the server, which hands it takeover requests.
 */
struct ctl_takeover_server_ops {
	/* Stops (or resumes) accepting clients; the listener stays open. 0 or -errno. */
	int (*pause)(struct ctl_server *s, bool pause);
	/* The listener and the lock file's fd, to hand over; -1 once released. */
	void (*fds)(const struct ctl_server *s, int *fd, int *lock_fd);
	/* Handed over: stop accepting and close this process's copies of the listener and lock. */
	void (*release)(struct ctl_server *s);
	/* The old vmigd has let go: the socket and lock files are this process's. */
	void (*own)(struct ctl_server *s);
	/* A request passed on by the new vmigd, served as a client's: the reply (malloc'd, with its
	 * newline), NULL when out of memory. */
	char *(*handle)(struct ctl_server *s, const char *text, size_t len);
};

/* What a daemon hands the takeover, either side. */
struct ctl_takeover_parts {
	struct xp_loop *loop;
	struct px_node *node;
	struct ctl_server *ctl;
	const struct ctl_takeover_server_ops *ctl_ops; /* how to reach ctl */
	struct ctl_metrics_server *metrics; /* NULL without --metrics */
	struct cv_set *conv; /* a migration under convergence control stays with the old vmigd */
	unsigned int drain_timeout_s;	    /* the old one's bound on what it still carries */
	/* Old side: the new vmigd (pid) has taken over; stop serving metrics and treat a signal
	 * as a second one (cut and exit). */
	void (*committed)(void *arg, int pid);
	/* Old side: what it carried has ended (or was cut at drain_timeout_s): exit. */
	void (*retired)(void *arg);
	void *arg;
};

/* What the old vmigd hands over; fds are -1 where absent, and are the caller's to use or to
 * leave for ctl_takeover_offer_done(). */
struct ctl_takeover_offer {
	int sock; /* the connection to the old vmigd */
	int pid;
	int ctl_fd, lock_fd, node_fd, metrics_fd;
	struct json_object *msg; /* the offer as sent (moved targets, kept migrations) */
};

/* New side, before the node exists: connects to control and asks. 0 or -errno with err. */
int ctl_takeover_ask(const char *control, struct ctl_takeover_offer *out, char *err, size_t errlen);
/* Closes what was not used (the fds still >= 0, and the connection unless finished). */
void ctl_takeover_offer_done(struct ctl_takeover_offer *o);

int ctl_takeover_new(const struct ctl_takeover_parts *parts, struct ctl_takeover **ret);
/* Takes NULL. */
void ctl_takeover_free(struct ctl_takeover *t);

/*
 * New side, once its node, control server and metrics run on the offer's fds: starts the moved
 * targets, notes the migrations the old one keeps and tells it to let go. From here the old one
 * no longer accepts. 0 or -errno with err (then exit: the old one carries on).
 */
int ctl_takeover_finish(struct ctl_takeover *t, struct ctl_takeover_offer *o, char *err,
			size_t errlen);

/* A target the old vmigd hands over, as its offer describes it. */
struct ctl_takeover_target {
	char key[PX_KEY_MAX + 1];
	unsigned int nports;
	struct px_port_info ports[PX_PORTS_MAX];
	struct px_start opts; /* cap, tls, the secret */
};

/* One entry of the offer's "moved" (pure, fuzzed): 0, or -EPROTO with one line in err. */
int ctl_takeover_parse_target(struct json_object *m, struct ctl_takeover_target *out, char *err,
			      size_t errlen);

/*
 * Old side: the control connection fd asked for a takeover (pid: who). fd is the takeover's.
 * Refused (one reply line and a warning) unless SO_PEERCRED says fd's peer is pid, running as
 * root or as our euid.
 */
void ctl_takeover_give(struct ctl_takeover *t, int fd, int pid);

/*
 * New side: a stop or cap change for a migration the old vmigd still carries is passed on to it;
 * *reply says so. -ENOENT (err left as it is) when key is not one of those.
 */
int ctl_takeover_forward(struct ctl_takeover *t, const struct ctl_request *req,
			 struct json_object **reply, char *err, size_t errlen);
/* Adds "takeover" to a status object where there was one. */
void ctl_takeover_status(struct ctl_takeover *t, struct json_object *status);

/* What SIGUSR2 runs: this binary's path (as it was at start) and its arguments with --takeover. */
struct ctl_takeover_cmd {
	char exe[PATH_MAX]; /* "": unknown, no takeover can be started */
	char **argv;
};

/* Reads /proc/self/exe (left "" where it cannot be) and copies argv. 0 or -ENOMEM. */
int ctl_takeover_cmd_init(struct ctl_takeover_cmd *c, int argc, char **argv);
/* Takes a zeroed cmd. */
void ctl_takeover_cmd_done(struct ctl_takeover_cmd *c);
/* Old side, on SIGUSR2: starts c, unless busy (handing over or draining already: a warning).
 * Logs what came of it; this vmigd carries on either way. */
void ctl_takeover_spawn(const struct ctl_takeover_cmd *c, bool busy);

#endif
