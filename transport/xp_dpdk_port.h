/* SPDX-License-Identifier: Apache-2.0 */
/* A DPDK port (xp_dpdk.h) as the port of xp_hop's sessions: the one adapter the daemon's hop and
 * tests/tools/dpdk-stream share. Not a port of its own: each op is the xp_dpdk call. */
#ifndef XP_DPDK_PORT_H
#define XP_DPDK_PORT_H

#include "xp_dpdk.h"
#include "xp_hop.h"

/* port: a struct xp_dpdk. Zero copy: frames are built and sealed in the packet buffers and sent
 * in bursts. */
extern const struct xp_hop_port_ops xp_dpdk_port_ops;
/* The same with copies (send and poll only), to measure what zero copy saves. */
extern const struct xp_hop_port_ops xp_dpdk_copy_port_ops;

#endif
