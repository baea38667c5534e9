/* SPDX-License-Identifier: Apache-2.0 */
/* Start-up choices read from the NICs: the node hop's address (--hop-interface) and the data-path
 * workers' CPUs (--cpus). Each refusal is one line on stderr, "vmigd: ...". */
#ifndef CTL_NIC_PICK_H
#define CTL_NIC_PICK_H

#include <stdbool.h>
#include <stddef.h>

#include "px_node.h"

/* --hop-interface ifname: the listener (pc->listen, --listen as given) on the interface's address,
 * its first IPv4 else its first global IPv6, and that address advertised unless advertise_given.
 * 0 or -errno. */
int ctl_nic_pick_hop(const char *ifname, const char *listen, bool advertise_given,
		     struct px_config *pc);
/* --cpus: a list ("0-3,8"), or "nic": the CPUs of the NUMA node of the interface holding the
 * address the node hop is advertised on. Fills pc->cpus and pc->pin, and desc with what it came
 * to, for status and the start line. 0 or -EINVAL. */
int ctl_nic_pick_cpus(const char *cpus, struct px_config *pc, char *desc, size_t desclen);

#endif
