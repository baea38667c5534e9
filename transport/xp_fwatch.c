// SPDX-License-Identifier: Apache-2.0
/* inotify on the directories holding the watched files. Any event naming one of the files, or a
 * Kubernetes "..data"-style entry, (re)starts a settle timer; the callback runs when it fires. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "util.h"
#include "xp_fwatch.h"

#define FWATCH_MAX 8
#define DIR_EVENTS                                                                                 \
	(IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_ATTRIB |        \
	 IN_DELETE_SELF | IN_MOVE_SELF)

struct xp_fwatch {
	struct xp_loop *loop;
	int fd;
	struct xp_watch *w;
	struct xp_timer *t;
	unsigned int settle_ms;
	xp_fwatch_fn fn;
	void *arg;
	unsigned int nnames;
	char *names[FWATCH_MAX]; /* basenames of the watched files */
};

static void settled(void *arg)
{
	struct xp_fwatch *fw = arg;

	fw->t = NULL;
	fw->fn(fw->arg);
}

static bool interesting(const struct xp_fwatch *fw, const struct inotify_event *ev)
{
	if (!ev->len || (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_Q_OVERFLOW)))
		return true;
	/* Secret volumes swap a "..data" symlink; the files themselves are links into it. */
	if (strncmp(ev->name, "..", 2) == 0)
		return true;
	for (unsigned int i = 0; i < fw->nnames; i++)
		if (strcmp(ev->name, fw->names[i]) == 0)
			return true;
	return false;
}

static void on_events(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct xp_fwatch *fw = arg;
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	bool hit = false;
	ssize_t k;

	while ((k = read(fd, buf, sizeof(buf))) > 0) {
		for (char *p = buf; p < buf + k;) {
			const struct inotify_event *ev = (const struct inotify_event *)p;

			hit = hit || interesting(fw, ev);
			p += sizeof(*ev) + ev->len;
		}
	}
	if (!hit)
		return;
	xp_timer_del(fw->t);
	fw->t = NULL;
	/* Without a timer the change is still picked up by the next event or SIGHUP. */
	(void)xp_timer_add(fw->loop, vm_now_ms() + fw->settle_ms, settled, fw, &fw->t);
}

int xp_fwatch_new(struct xp_loop *loop, const char *const *paths, unsigned int n,
		  unsigned int settle_ms, xp_fwatch_fn fn, void *arg, struct xp_fwatch **ret)
{
	struct xp_fwatch *fw;
	int r = -ENOMEM;

	if (n > FWATCH_MAX)
		return -EINVAL;
	fw = calloc(1, sizeof(*fw));
	if (!fw)
		return -ENOMEM;
	fw->loop = loop;
	fw->settle_ms = settle_ms;
	fw->fn = fn;
	fw->arg = arg;
	fw->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (fw->fd < 0) {
		r = -errno;
		goto fail;
	}
	for (unsigned int i = 0; i < n; i++) {
		char d[PATH_MAX], b[PATH_MAX];

		if (strlen(paths[i]) >= PATH_MAX) {
			r = -ENAMETOOLONG;
			goto fail;
		}
		strcpy(d, paths[i]);
		strcpy(b, paths[i]);
		/* The same directory twice gives the same watch descriptor: harmless. */
		if (inotify_add_watch(fw->fd, dirname(d), DIR_EVENTS) < 0) {
			r = -errno;
			goto fail;
		}
		fw->names[fw->nnames] = strdup(basename(b));
		if (!fw->names[fw->nnames++]) {
			r = -ENOMEM;
			goto fail;
		}
	}
	r = xp_watch_add(loop, fw->fd, EPOLLIN, on_events, fw, &fw->w);
	if (r < 0)
		goto fail;
	*ret = fw;
	return 0;

fail:
	xp_fwatch_free(fw);
	return r;
}

void xp_fwatch_free(struct xp_fwatch *fw)
{
	if (!fw)
		return;
	xp_watch_del(fw->w);
	xp_timer_del(fw->t);
	if (fw->fd >= 0)
		close(fw->fd);
	for (unsigned int i = 0; i < fw->nnames; i++)
		free(fw->names[i]);
	free(fw);
}
