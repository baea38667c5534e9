/* SPDX-License-Identifier: Apache-2.0 */
/* The process's own figures (struct ctl_process, ctl_figures.h) read from /proc/self, and the
 * features this vmigd was built with, for process_* and vmigd_build_info. */
#ifndef CTL_PROCESS_H
#define CTL_PROCESS_H

#include "ctl_figures.h"

/* "tls,dpdk,libvirt,inspect" as built (dpdk and libvirt only where they are). */
const char *ctl_build_features(void);

/* Fills p; a figure that cannot be read is 0. version and features are set too. */
void ctl_process_read(struct ctl_process *p);

#endif
