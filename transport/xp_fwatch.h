/* SPDX-License-Identifier: Apache-2.0 */
/* Watches a few files for replacement or rewrite (inotify on their directories, so that an atomic
 * rename or a Kubernetes secret volume's symlink swap is seen) and calls back once they settle. */
#ifndef XP_FWATCH_H
#define XP_FWATCH_H

#include "xp_loop.h"

struct xp_fwatch;

typedef void (*xp_fwatch_fn)(void *arg);

/* fn runs on the loop settle_ms after the last change seen. -errno on failure. */
int xp_fwatch_new(struct xp_loop *loop, const char *const *paths, unsigned int n,
		  unsigned int settle_ms, xp_fwatch_fn fn, void *arg, struct xp_fwatch **ret);
/* Takes NULL. */
void xp_fwatch_free(struct xp_fwatch *w);

#endif
