/* SPDX-License-Identifier: Apache-2.0 */
/* The test build's hooks in the daemon: vmigd-test links ctl_test.c (--dpdk-test-impair and the
 * impairing port behind it, its *_by_test figures, source-start's test_delay_first_ms, and
 * --test-wedge), vmigd links ctl_test_stub.c, which has none of that. */
#ifndef CTL_TEST_H
#define CTL_TEST_H

#include "xp_dhop.h"

struct xp_loop;

/* Takes the test build's own options out of argv, before the daemon reads it, adds its figures
 * (status's dpdk.*_by_test) to the tables and its request fields (test_delay_first_ms) to the
 * parser: 0, or -errno having said why on stderr. The options are not in --help, the config file
 * or a takeover's argv. */
int ctl_test_init(int *argc, char **argv);
/* The wrapper the test options put around the DPDK hop's port, or NULL. */
const struct xp_dhop_wrap *ctl_test_hop_wrap(void);
/* The daemon's loop runs from here: --test-wedge AFTER_MS,FOR_MS holds it in one callback (a
 * sleep) for FOR_MS, AFTER_MS after this call, as a wedged loop would be (the watchdog test). */
void ctl_test_start(struct xp_loop *loop);

#endif
