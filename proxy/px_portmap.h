/* SPDX-License-Identifier: Apache-2.0 */
/* The port map a target hands to its source: where its node-hop listener is and which logical
 * ports it serves. Plain data; its JSON form (what `vmigctl target start` prints) is ctrl's
 * business (ctrl/ctl_portmap.h). */
#ifndef PX_PORTMAP_H
#define PX_PORTMAP_H

#include <stdbool.h>
#include <stdint.h>

#include "px_preamble.h"

#define PX_PORTS_MAX 8
#define PX_HOST_MAX  64

struct px_portmap {
	char key[PX_KEY_MAX + 1];
	char address[PX_HOST_MAX]; /* numeric IPv4 or IPv6 address, no brackets */
	unsigned int port;	   /* the node-hop TCP port all logical ports share; 0: tcp[] */
	unsigned int nports;
	uint32_t ports[PX_PORTS_MAX]; /* logical ports */
	/*
	 * KubeVirt's form (targetDirectMigrationNodePorts): one TCP port per logical port, which a
	 * stock peer serves raw, and a vmigd with the preamble once TLS's ALPN says so.
	 */
	bool kubevirt;
	uint32_t tcp[PX_PORTS_MAX];
	bool tls; /* what the target answers: its node hop for this migration is TLS */
	/* A secret the target made for this migration; its source presents it in each preamble.
	 * A stock KubeVirt peer neither gives nor takes one. */
	bool has_secret;
	uint8_t secret[PX_SECRET_LEN];
	/* The target's DPDK node hop (ip 0: none; stream unused): a source with one of its own
	 * offers it in each preamble only to a target that advertised one. */
	struct px_dpdk dpdk;
	/* The target checks each connection's digest at its end ("digest":"xxh3"): a source that
	 * keeps digests too asks for it (PX_PREAMBLE_F_DIGEST) only then, so that a vmigd older
	 * than the check never sees the flag. */
	bool digest;
	/* The target resumes a connection over a new one when the node hop fails ("resume":
	 * true): a source offers it (PX_PREAMBLE_F_RESUMABLE) only then. */
	bool resume;
	/* ... and one of the DPDK node hop over the kernel path ("resume_dpdk": true): a source
	 * offers that (PX_PREAMBLE_F_DPDK_RESUME) only then. */
	bool resume_dpdk;
	/* The target decodes compressed chunks on resumable connections ("compress":"zstd"): a
	 * source that compresses asks for it (PX_PREAMBLE_F_COMPRESS) only then. */
	bool compress;
	/* ... and on the DPDK node hop ("compress_dpdk": true, with "resume_dpdk"): a source asks
	 * for it there (PX_PREAMBLE_F_COMPRESS_DPDK) only then. */
	bool compress_dpdk;
};

/* KubeVirt's logical ports: libvirt's own connection, QEMU's migration stream, NBD. */
#define PX_KUBEVIRT_LIBVIRT 0
#define PX_KUBEVIRT_QEMU    49152
#define PX_KUBEVIRT_NBD	    49153

/* Whether KubeVirt uses logical port id (its maps name no other). */
static inline bool px_kubevirt_port(uint32_t id)
{
	return id == PX_KUBEVIRT_LIBVIRT || id == PX_KUBEVIRT_QEMU || id == PX_KUBEVIRT_NBD;
}

/* Parses a logical port id ("49152"): 0 or -EINVAL; *ret written only on success. */
int px_port_parse(const char *s, uint32_t *ret);

#endif
