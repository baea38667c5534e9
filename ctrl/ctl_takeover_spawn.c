// SPDX-License-Identifier: Apache-2.0
/* SIGUSR2's takeover: the running vmigd starts its own binary again with --takeover, forked
 * twice so that the new one is no child of this one; and the command line it is started with. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl_takeover.h"
#include "log.h"

/*
 * SIGUSR2: start the binary at this vmigd's path (a package upgrade put the new one there) with
 * the same arguments and --takeover. Forked twice, so that the new vmigd is no child of this one
 * (which exits first) and the service manager reaps it; under systemd it stays in the service's
 * cgroup. If it fails before it took over, this one carries on.
 */
void ctl_takeover_spawn(const struct ctl_takeover_cmd *c, bool busy)
{
	sigset_t all;
	pid_t child;
	int status;

	if (busy || !c->exe[0]) {
		log_warn("SIGUSR2: %s; no takeover started",
			 busy ? "this vmigd is handing over or draining already"
			      : "its own binary's path is unknown");
		return;
	}
	child = fork();
	if (child < 0) {
		log_err("SIGUSR2: cannot fork: %s", strerror(errno));
		return;
	}
	if (child == 0) {
		pid_t grandchild = fork();

		if (grandchild != 0)
			_exit(grandchild < 0 ? 1 : 0);
		/* exec keeps the signal mask: the new vmigd blocks what it watches itself. */
		sigemptyset(&all);
		pthread_sigmask(SIG_SETMASK, &all, NULL);
		execv(c->exe, c->argv);
		fprintf(stderr, "vmigd: SIGUSR2: cannot run %s: %s\n", c->exe, strerror(errno));
		_exit(127);
	}
	if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		log_err("SIGUSR2: cannot start %s --takeover", c->exe);
		return;
	}
	log_info("SIGUSR2: started %s --takeover; this vmigd carries on until it has taken over",
		 c->exe);
}

int ctl_takeover_cmd_init(struct ctl_takeover_cmd *c, int argc, char **argv)
{
	ssize_t n = readlink("/proc/self/exe", c->exe, sizeof(c->exe) - 1);
	int k = 0;

	if (n <= 0 || (size_t)n >= sizeof(c->exe) - 1) {
		c->exe[0] = '\0';
		return 0;
	}
	c->exe[n] = '\0';
	c->argv = calloc(argc + 2, sizeof(char *));
	if (!c->argv)
		return -ENOMEM;
	for (int i = 0; i < argc; i++)
		if (strcmp(argv[i], "--takeover") != 0)
			c->argv[k++] = argv[i];
	c->argv[k++] = "--takeover";
	c->argv[k] = NULL;
	return 0;
}

void ctl_takeover_cmd_done(struct ctl_takeover_cmd *c)
{
	free(c->argv);
	c->argv = NULL;
}
