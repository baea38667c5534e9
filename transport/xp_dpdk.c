// SPDX-License-Identifier: Apache-2.0
/* xp_dpdk.h on DPDK 22.11: EAL from a string, the first port with one queue each way, a packet
 * pool made at start, ARP (answering for our address, learning and asking for peers on the
 * subnet), IPv4/UDP framing with checksums checked on the way in, and the link's upkeep. */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_arp.h>
#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_errno.h>
#include <rte_ip.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_udp.h>

#include "xp_dpdk.h"

#define MAX_ARGS   64
#define NB_MBUF	   8191
#define RING	   1024
#define BURST	   32
#define PEERS	   16
#define ARP_GAP_US 100000
#define TTL	   64
/* The link is looked at this often (af_packet's costs a system call), and a memif client whose
 * link stays down restarts its port this often: a handshake takes milliseconds when its server
 * is there, so half a second is long past any that is still under way (xp_dpdk_tend() says why
 * that matters), and soon enough that a migration started with the daemons finds the link up. */
#define LOOK_GAP_US    100000
#define RESTART_GAP_US 500000

/* EAL's arguments, split in place: EAL may keep pointers into them for the process's life. */
static char *eal_args;

struct peer {
	uint32_t ip; /* network order; 0: free */
	bool known;
	struct rte_ether_addr mac;
	uint64_t asked_us;
	uint64_t first_asked_us; /* the first request not answered yet; 0: none */
};

struct xp_dpdk {
	uint16_t port;
	struct rte_mempool *pool;
	struct rte_ether_addr mac;
	uint32_t ip, mask; /* network order */
	uint16_t udp_port; /* network order */
	uint16_t mtu;
	struct peer peers[PEERS];
	char *argv[MAX_ARGS + 1];
	struct xp_dpdk_stats st;
	/* transmit: frames wait here for one rte_eth_tx_burst() per BURST or per flush */
	struct rte_mbuf *txq[BURST];
	unsigned int ntx;
	/* a frame handed out by xp_dpdk_frame() and not yet sent; kept for the next ask */
	struct rte_mbuf *open;
	struct peer *open_peer;
	bool stop_at_close; /* false for net_memif: xp_dpdk_close() says why */
	/* the link (xp_dpdk_tend()) */
	char driver[32];
	bool memif, memif_client;
	bool started; /* rte_eth_dev_start() took: a memif client may wait for its server */
	bool link_up;
	uint64_t looked_us, since_us, restarted_us; /* since: link_up's value holds since then */
	char ifname[IF_NAMESIZE]; /* net_af_packet: the interface it is bound to */
	int ifd;		  /* a socket to read that interface's flags; -1: none */
};

bool xp_dpdk_built(void)
{
	return true;
}

static int parse_address(const char *s, uint32_t *ip, uint32_t *mask)
{
	char buf[32], *slash, *end;
	struct in_addr a;
	unsigned long prefix;

	if (!s || strlen(s) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, s);
	slash = strchr(buf, '/');
	if (!slash)
		return -EINVAL;
	*slash = '\0';
	prefix = strtoul(slash + 1, &end, 10);
	if (*end || slash[1] == '\0' || prefix < 1 || prefix > 32 ||
	    inet_pton(AF_INET, buf, &a) != 1)
		return -EINVAL;
	*ip = a.s_addr;
	*mask = htonl(prefix == 32 ? 0xffffffffu : ~(0xffffffffu >> prefix));
	return 0;
}

/* KEY's value in a device's arguments ("key=value,key=value"), into out; false if absent. */
static bool devarg(const char *args, const char *key, char *out, size_t len)
{
	size_t k = strlen(key), n;

	for (const char *p = args; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
		if (strncmp(p, key, k) != 0 || p[k] != '=')
			continue;
		p += k + 1;
		n = strcspn(p, ",");
		if (n >= len)
			return false;
		memcpy(out, p, n);
		out[n] = '\0';
		return true;
	}
	return false;
}

/* What the port is, for its upkeep: a memif client (it retries), an af_packet port (whose
 * interface's state is what its link is), anything else (whose driver tells its link). */
static void port_kind(struct xp_dpdk *d)
{
	struct rte_eth_dev_info info;
	const struct rte_devargs *da;
	const char *args;
	char v[16];

	if (rte_eth_dev_info_get(d->port, &info) < 0 || !info.driver_name)
		return;
	snprintf(d->driver, sizeof(d->driver), "%s", info.driver_name);
	da = info.device ? rte_dev_devargs(info.device) : NULL;
	args = da ? da->args : NULL;
	d->memif = strcmp(d->driver, "net_memif") == 0;
	/* memif's own spelling: "client" (or the old "slave"), else a server */
	d->memif_client = d->memif && devarg(args, "role", v, sizeof(v)) &&
			  (strstr(v, "client") || strstr(v, "slave"));
	if (strcmp(d->driver, "net_af_packet") == 0 &&
	    devarg(args, "iface", d->ifname, sizeof(d->ifname)))
		d->ifd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
}

int xp_dpdk_open(const struct xp_dpdk_conf *conf, struct xp_dpdk **ret, char *err, size_t errlen)
{
	struct rte_eth_conf pc = { 0 };
	struct xp_dpdk *d = calloc(1, sizeof(*d));
	int argc = 0, r = -EIO;
	char *tok, *save;

	if (!d)
		return -ENOMEM;
	d->ifd = -1;
	if (parse_address(conf->address, &d->ip, &d->mask) < 0) {
		snprintf(err, errlen, "--dpdk-address %s: not ADDR/PREFIX (IPv4)",
			 conf->address ? conf->address : "(none)");
		free(d);
		return -EINVAL;
	}
	d->udp_port = htons(conf->udp_port);
	if (eal_args) {
		snprintf(err, errlen, "--dpdk: EAL runs once per process, and it already did");
		free(d);
		return -EALREADY;
	}
	eal_args = strdup(conf->eal ? conf->eal : "");
	if (!eal_args) {
		free(d);
		return -ENOMEM;
	}
	d->argv[argc++] = "vmigd";
	for (tok = strtok_r(eal_args, " ", &save); tok && argc < MAX_ARGS;
	     tok = strtok_r(NULL, " ", &save))
		d->argv[argc++] = tok;
	if (tok) {
		snprintf(err, errlen, "--dpdk: more than %d EAL arguments", MAX_ARGS - 1);
		r = -EINVAL;
		goto fail;
	}
	if (rte_eal_init(argc, d->argv) < 0) {
		snprintf(err, errlen, "--dpdk: EAL did not start: %s", rte_strerror(rte_errno));
		goto fail;
	}
	if (rte_eth_dev_count_avail() < 1) {
		snprintf(err, errlen, "--dpdk: EAL started, but with no port (a --vdev or a VF?)");
		r = -ENODEV;
		goto fail_eal;
	}
	RTE_ETH_FOREACH_DEV(d->port) break;
	d->pool = rte_pktmbuf_pool_create("vmigd_hop", NB_MBUF, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE,
					  rte_socket_id());
	if (!d->pool) {
		snprintf(err, errlen, "--dpdk: no packet pool: %s (more memory: -m?)",
			 rte_strerror(rte_errno));
		goto fail_eal;
	}
	if (rte_eth_dev_configure(d->port, 1, 1, &pc) < 0 ||
	    rte_eth_rx_queue_setup(d->port, 0, RING, rte_eth_dev_socket_id(d->port), NULL,
				   d->pool) < 0 ||
	    rte_eth_tx_queue_setup(d->port, 0, RING, rte_eth_dev_socket_id(d->port), NULL) < 0) {
		snprintf(err, errlen, "--dpdk: port %u would not start", d->port);
		goto fail_eal;
	}
	port_kind(d);
	/* A memif client fails to start while its server is not there yet: it is tried again */
	d->started = rte_eth_dev_start(d->port) == 0;
	if (!d->started && !d->memif_client) {
		snprintf(err, errlen, "--dpdk: port %u would not start", d->port);
		goto fail_eal;
	}
	if (rte_eth_macaddr_get(d->port, &d->mac) < 0 || rte_eth_dev_get_mtu(d->port, &d->mtu) < 0)
		d->mtu = RTE_ETHER_MTU;
	d->stop_at_close = !d->memif;
	if (d->mtu > RTE_MBUF_DEFAULT_DATAROOM - RTE_ETHER_HDR_LEN)
		d->mtu = RTE_MBUF_DEFAULT_DATAROOM - RTE_ETHER_HDR_LEN;
	*ret = d;
	return 0;
fail_eal:
	if (d->ifd >= 0)
		close(d->ifd);
	if (d->pool)
		rte_mempool_free(d->pool);
	rte_eal_cleanup();
fail:
	free(d);
	return r;
}

/*
 * Stops the port (a VF's queues go quiet before the process lets go of the device) and leaves
 * the rest to the process's exit. DPDK 22.11's memif races its own peer: closing or stopping a
 * memif port runs memif_disconnect() on this thread while EAL's interrupt thread may be running
 * it for the peer's hang-up, and the two free the same control channel (crashes in
 * rte_intr_fd_get() and, with the close gone, in the stop: CI saw both). A memif port is left
 * running: the process's exit closes its socket, which the peer reads as the same disconnect.
 * EAL is started once per process anyway.
 */
void xp_dpdk_close(struct xp_dpdk *d)
{
	if (!d)
		return;
	xp_dpdk_flush(d);
	if (d->open)
		rte_pktmbuf_free(d->open);
	if (d->stop_at_close && d->started)
		rte_eth_dev_stop(d->port);
	if (d->ifd >= 0)
		close(d->ifd);
	free(d);
}

size_t xp_dpdk_max_payload(const struct xp_dpdk *d)
{
	return d->mtu - sizeof(struct rte_ipv4_hdr) - sizeof(struct rte_udp_hdr);
}

static struct peer *peer_of(struct xp_dpdk *d, uint32_t ip, bool add)
{
	struct peer *free_slot = NULL;

	for (int i = 0; i < PEERS; i++) {
		if (d->peers[i].ip == ip)
			return &d->peers[i];
		if (!d->peers[i].ip && !free_slot)
			free_slot = &d->peers[i];
	}
	if (!add)
		return NULL;
	if (!free_slot)
		free_slot = &d->peers[ip % PEERS]; /* full: the newest wins a slot */
	memset(free_slot, 0, sizeof(*free_slot));
	free_slot->ip = ip;
	return free_slot;
}

/* Sends what waits in the queue in one burst; what the ring does not take is dropped (the
 * stream sends it again). 0, or -EAGAIN when the ring was full. */
int xp_dpdk_flush(struct xp_dpdk *d)
{
	unsigned int queued = d->ntx;
	uint16_t n;

	if (!queued)
		return 0;
	/* a port not started (a memif client without its server) takes nothing, and says so on
	 * stderr with a stack trace at every burst */
	n = d->started ? rte_eth_tx_burst(d->port, 0, d->txq, (uint16_t)queued) : 0;
	for (unsigned int i = 0; i < queued; i++) {
		if (i < n) {
			d->st.tx_frames++;
			d->st.tx_bytes += d->txq[i]->pkt_len;
		} else {
			rte_pktmbuf_free(d->txq[i]);
			d->st.tx_ring_full++;
		}
	}
	d->st.tx_bursts++;
	d->ntx = 0;
	return n < queued ? -EAGAIN : 0;
}

/* Queues a frame; a full queue goes out at once. */
static int tx_one(struct xp_dpdk *d, struct rte_mbuf *m)
{
	d->txq[d->ntx++] = m;
	return d->ntx < BURST ? 0 : xp_dpdk_flush(d);
}

static void send_arp(struct xp_dpdk *d, uint16_t op, const struct rte_ether_addr *to_mac,
		     uint32_t to_ip)
{
	struct rte_mbuf *m = rte_pktmbuf_alloc(d->pool);
	struct rte_ether_hdr *eh;
	struct rte_arp_hdr *ah;

	if (!m) {
		d->st.tx_no_mbuf++;
		return;
	}
	eh = (struct rte_ether_hdr *)rte_pktmbuf_append(m, sizeof(*eh) + sizeof(*ah));
	ah = (struct rte_arp_hdr *)(eh + 1);
	if (op == RTE_ARP_OP_REQUEST)
		memset(&eh->dst_addr, 0xff, sizeof(eh->dst_addr));
	else
		rte_ether_addr_copy(to_mac, &eh->dst_addr);
	rte_ether_addr_copy(&d->mac, &eh->src_addr);
	eh->ether_type = htons(RTE_ETHER_TYPE_ARP);
	ah->arp_hardware = htons(RTE_ARP_HRD_ETHER);
	ah->arp_protocol = htons(RTE_ETHER_TYPE_IPV4);
	ah->arp_hlen = RTE_ETHER_ADDR_LEN;
	ah->arp_plen = 4;
	ah->arp_opcode = htons(op);
	rte_ether_addr_copy(&d->mac, &ah->arp_data.arp_sha);
	ah->arp_data.arp_sip = d->ip;
	if (op == RTE_ARP_OP_REQUEST)
		memset(&ah->arp_data.arp_tha, 0, sizeof(ah->arp_data.arp_tha));
	else
		rte_ether_addr_copy(to_mac, &ah->arp_data.arp_tha);
	ah->arp_data.arp_tip = to_ip;
	/* ARP does not wait for a burst: it goes with what is queued */
	if (tx_one(d, m) == 0 && xp_dpdk_flush(d) == 0) {
		if (op == RTE_ARP_OP_REQUEST)
			d->st.arp_requests_sent++;
		else
			d->st.arp_replies_sent++;
	}
}

/* An ARP request for p unless one went within ARP_GAP_US. */
static void ask(struct xp_dpdk *d, struct peer *p, uint64_t now_us)
{
	if (p->asked_us && now_us - p->asked_us < ARP_GAP_US)
		return;
	p->asked_us = now_us ? now_us : 1;
	if (!p->first_asked_us)
		p->first_asked_us = p->asked_us;
	send_arp(d, RTE_ARP_OP_REQUEST, NULL, p->ip);
}

/* The peer's entry when its MAC is known; else NULL, with an ARP request sent (at most one per
 * ARP_GAP_US) and counted. */
static struct peer *peer_ready(struct xp_dpdk *d, uint32_t ip, uint64_t now_us)
{
	struct peer *p = peer_of(d, ip, true);

	if (p->known)
		return p;
	ask(d, p, now_us);
	d->st.tx_no_arp++;
	return NULL;
}

int xp_dpdk_peer_arp(const struct xp_dpdk *d, uint32_t peer_ip, uint64_t now_us,
		     uint64_t *asking_us)
{
	const struct peer *p = peer_of((struct xp_dpdk *)d, htonl(peer_ip), false);

	if (p && p->known)
		return 1;
	if (!p || !p->first_asked_us)
		return -ENOENT;
	*asking_us = now_us > p->first_asked_us ? now_us - p->first_asked_us : 0;
	return 0;
}

void xp_dpdk_peer_forget(struct xp_dpdk *d, uint32_t peer_ip)
{
	struct peer *p = peer_of(d, htonl(peer_ip), false);

	if (!p)
		return;
	p->known = false;
	p->asked_us = p->first_asked_us = 0;
}

void xp_dpdk_arp_probe(struct xp_dpdk *d, uint32_t peer_ip, uint64_t now_us)
{
	struct peer *p = peer_of(d, htonl(peer_ip), true);

	if (!p->known)
		ask(d, p, now_us);
}

static inline size_t hdr_len(void)
{
	return sizeof(struct rte_ether_hdr) + sizeof(struct rte_ipv4_hdr) +
	       sizeof(struct rte_udp_hdr);
}

int xp_dpdk_frame(struct xp_dpdk *d, uint32_t peer_ip, uint64_t now_us, uint8_t **payload,
		  size_t *cap)
{
	struct peer *p = peer_ready(d, htonl(peer_ip), now_us);

	if (!p)
		return -EAGAIN;
	if (!d->open) {
		d->open = rte_pktmbuf_alloc(d->pool);
		if (!d->open) {
			d->st.tx_no_mbuf++;
			return -EAGAIN;
		}
	}
	d->open_peer = p;
	*payload = rte_pktmbuf_mtod_offset(d->open, uint8_t *, hdr_len());
	*cap = xp_dpdk_max_payload(d);
	return 0;
}

/* Ethernet, IPv4 and UDP headers in front of len bytes of payload already in m; the UDP
 * checksum over the payload unless skip_csum (0 on IPv4 says "none", RFC 768). */
static void put_headers(struct xp_dpdk *d, struct rte_mbuf *m, const struct peer *p,
			uint16_t peer_port, size_t len, bool skip_csum)
{
	struct rte_ether_hdr *eh = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
	struct rte_ipv4_hdr *iph = (struct rte_ipv4_hdr *)(eh + 1);
	struct rte_udp_hdr *uh = (struct rte_udp_hdr *)(iph + 1);

	m->data_len = m->pkt_len = (uint32_t)(hdr_len() + len);
	rte_ether_addr_copy(&p->mac, &eh->dst_addr);
	rte_ether_addr_copy(&d->mac, &eh->src_addr);
	eh->ether_type = htons(RTE_ETHER_TYPE_IPV4);
	memset(iph, 0, sizeof(*iph));
	iph->version_ihl = RTE_IPV4_VHL_DEF;
	iph->total_length = htons((uint16_t)(sizeof(*iph) + sizeof(*uh) + len));
	iph->fragment_offset = htons(RTE_IPV4_HDR_DF_FLAG);
	iph->time_to_live = TTL;
	iph->next_proto_id = IPPROTO_UDP;
	iph->src_addr = d->ip;
	iph->dst_addr = p->ip;
	uh->src_port = d->udp_port;
	uh->dst_port = htons(peer_port);
	uh->dgram_len = htons((uint16_t)(sizeof(*uh) + len));
	uh->dgram_cksum = 0;
	iph->hdr_checksum = rte_ipv4_cksum(iph);
	if (!skip_csum)
		uh->dgram_cksum = rte_ipv4_udptcp_cksum(iph, uh);
}

int xp_dpdk_frame_send(struct xp_dpdk *d, uint16_t peer_port, size_t len, bool sealed)
{
	struct rte_mbuf *m = d->open;

	if (!m || len > xp_dpdk_max_payload(d))
		return -EINVAL;
	d->open = NULL;
	put_headers(d, m, d->open_peer, peer_port, len, sealed);
	return tx_one(d, m);
}

int xp_dpdk_send(struct xp_dpdk *d, uint32_t peer_ip, uint16_t peer_port, const void *data,
		 size_t len, uint64_t now_us)
{
	struct peer *p;
	struct rte_mbuf *m;

	if (len > xp_dpdk_max_payload(d))
		return -EMSGSIZE;
	p = peer_ready(d, htonl(peer_ip), now_us);
	if (!p)
		return -EAGAIN;
	m = rte_pktmbuf_alloc(d->pool);
	if (!m) {
		d->st.tx_no_mbuf++;
		return -EAGAIN;
	}
	memcpy(rte_pktmbuf_mtod_offset(m, uint8_t *, hdr_len()), data, len);
	put_headers(d, m, p, peer_port, len, false);
	/* one datagram asked for on its own goes at once */
	return tx_one(d, m) ?: xp_dpdk_flush(d);
}

static void take_arp(struct xp_dpdk *d, struct rte_mbuf *m, const struct rte_ether_hdr *eh)
{
	const struct rte_arp_hdr *ah = (const struct rte_arp_hdr *)(eh + 1);
	uint32_t sip;
	struct peer *p;

	if (m->data_len < sizeof(*eh) + sizeof(*ah) ||
	    ntohs(ah->arp_hardware) != RTE_ARP_HRD_ETHER ||
	    ntohs(ah->arp_protocol) != RTE_ETHER_TYPE_IPV4 || ah->arp_plen != 4 ||
	    ah->arp_hlen != RTE_ETHER_ADDR_LEN) {
		d->st.rx_bad++;
		return;
	}
	sip = ah->arp_data.arp_sip;
	/* Learn a peer on our subnet that talks to us, or that we asked about. */
	if (sip && sip != d->ip && (sip & d->mask) == (d->ip & d->mask) &&
	    (ah->arp_data.arp_tip == d->ip || peer_of(d, sip, false))) {
		p = peer_of(d, sip, true);
		if (!p->known)
			d->st.arp_learned++;
		p->known = true;
		p->first_asked_us = 0;
		rte_ether_addr_copy(&ah->arp_data.arp_sha, &p->mac);
	}
	if (ntohs(ah->arp_opcode) == RTE_ARP_OP_REQUEST && ah->arp_data.arp_tip == d->ip)
		send_arp(d, RTE_ARP_OP_REPLY, &ah->arp_data.arp_sha, sip);
}

/* The header's checksum, computed again over the header with the field zeroed. */
static bool ip_sum_ok(struct rte_ipv4_hdr *iph)
{
	uint16_t sum = iph->hdr_checksum;
	bool ok;

	iph->hdr_checksum = 0;
	ok = rte_ipv4_cksum(iph) == sum;
	iph->hdr_checksum = sum;
	return ok;
}

/* A UDP checksum of 0 means none (IPv4); else it must match. */
static bool udp_sum_ok(const struct rte_ipv4_hdr *iph, struct rte_udp_hdr *uh)
{
	uint16_t sum = uh->dgram_cksum;
	bool ok;

	if (!sum)
		return true;
	uh->dgram_cksum = 0;
	ok = rte_ipv4_udptcp_cksum(iph, uh) == sum;
	uh->dgram_cksum = sum;
	return ok;
}

static void take_ipv4(struct xp_dpdk *d, struct rte_mbuf *m, const struct rte_ether_hdr *eh,
		      xp_dpdk_rx_fn fn, void *arg)
{
	struct rte_ipv4_hdr *iph = (struct rte_ipv4_hdr *)(eh + 1);
	struct rte_udp_hdr *uh;
	size_t ihl, tot, ulen;

	if (m->data_len < sizeof(*eh) + sizeof(*iph)) {
		d->st.rx_bad++;
		return;
	}
	ihl = (size_t)(iph->version_ihl & 0x0f) * 4;
	tot = ntohs(iph->total_length);
	if ((iph->version_ihl >> 4) != 4 || ihl < sizeof(*iph) || tot < ihl + sizeof(*uh) ||
	    sizeof(*eh) + tot > m->data_len || !ip_sum_ok(iph)) {
		d->st.rx_bad++;
		return;
	}
	if (iph->dst_addr != d->ip || iph->next_proto_id != IPPROTO_UDP ||
	    (ntohs(iph->fragment_offset) & (RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK))) {
		d->st.rx_not_ours++;
		return;
	}
	uh = (struct rte_udp_hdr *)((uint8_t *)iph + ihl);
	ulen = ntohs(uh->dgram_len);
	if (ulen < sizeof(*uh) || ulen > tot - ihl || !udp_sum_ok(iph, uh)) {
		d->st.rx_bad++;
		return;
	}
	if (uh->dst_port != d->udp_port) {
		d->st.rx_not_ours++;
		return;
	}
	d->st.rx_frames++;
	d->st.rx_bytes += ulen - sizeof(*uh);
	fn(arg, ntohl(iph->src_addr), ntohs(uh->src_port), (uint8_t *)(uh + 1), ulen - sizeof(*uh));
}

int xp_dpdk_poll(struct xp_dpdk *d, xp_dpdk_rx_fn fn, void *arg)
{
	struct rte_mbuf *pkts[BURST];
	uint16_t n = d->started ? rte_eth_rx_burst(d->port, 0, pkts, BURST) : 0;

	for (uint16_t i = 0; i < n; i++) {
		struct rte_mbuf *m = pkts[i];
		const struct rte_ether_hdr *eh = rte_pktmbuf_mtod(m, const struct rte_ether_hdr *);

		if (m->nb_segs != 1 || m->data_len < sizeof(*eh))
			d->st.rx_bad++;
		else if (eh->ether_type == htons(RTE_ETHER_TYPE_ARP))
			take_arp(d, m, eh);
		else if (eh->ether_type == htons(RTE_ETHER_TYPE_IPV4))
			take_ipv4(d, m, eh, fn, arg);
		else
			d->st.rx_not_ours++;
		rte_pktmbuf_free(m);
	}
	return n;
}

void xp_dpdk_stats(const struct xp_dpdk *d, struct xp_dpdk_stats *st)
{
	*st = d->st;
}

bool xp_dpdk_link_up(const struct xp_dpdk *d)
{
	struct rte_eth_link link;
	struct ifreq ifr = { 0 };

	if (!d->started || rte_eth_link_get_nowait(d->port, &link) < 0 ||
	    link.link_status != RTE_ETH_LINK_UP)
		return false;
	if (d->ifd < 0)
		return true;
	/* net_af_packet reports its link up whatever its interface does: the interface tells */
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", d->ifname);
	return ioctl(d->ifd, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_UP) &&
	       (ifr.ifr_flags & IFF_RUNNING);
}

/*
 * A memif client's port is stopped and started again only once its link has been down
 * RESTART_GAP_US (and as long after the last try): DPDK 22.11's memif_disconnect() runs unlocked
 * on whichever thread calls it, and EAL's interrupt thread calls it on a refusal or a hang-up, so
 * a stop must not come while the interrupt thread may still be at one (xp_dpdk_close() has the
 * crash that gives). Half a second after the link went down, that is long over. The server side
 * needs nothing: its listener takes the next client itself.
 */
bool xp_dpdk_tend(struct xp_dpdk *d, uint64_t now_us)
{
	bool up;

	if (d->looked_us && now_us - d->looked_us < LOOK_GAP_US)
		return d->link_up;
	d->looked_us = now_us;
	up = xp_dpdk_link_up(d);
	if (up != d->link_up || !d->since_us) {
		d->link_up = up;
		d->since_us = now_us;
	}
	if (up || !d->memif_client || now_us - d->since_us < RESTART_GAP_US ||
	    (d->restarted_us && now_us - d->restarted_us < RESTART_GAP_US))
		return up;
	if (d->started)
		rte_eth_dev_stop(d->port);
	d->started = rte_eth_dev_start(d->port) == 0;
	d->restarted_us = now_us;
	d->st.link_restarts++;
	return up;
}

void xp_dpdk_link_why(const struct xp_dpdk *d, char *buf, size_t len)
{
	if (d->link_up)
		snprintf(buf, len, "%s", "");
	else if (d->memif_client)
		snprintf(buf, len, "net_memif client: %s; port restarted %llu time%s to try again",
			 d->started ? "its handshake with the memif server did not complete"
				    : "no memif server to connect to",
			 (unsigned long long)d->st.link_restarts,
			 d->st.link_restarts == 1 ? "" : "s");
	else if (d->memif)
		snprintf(buf, len, "net_memif server: no client connected");
	else if (d->ifd >= 0)
		snprintf(buf, len, "%s: interface %s down or without carrier", d->driver,
			 d->ifname);
	else
		snprintf(buf, len, "port %u (%s): link state down", d->port, d->driver);
}

int xp_dpdk_thread_register(void)
{
	cpu_set_t cpus;
	int r;

	/* EAL would pin the thread to the CPUs its lcores leave over: it keeps its own */
	sched_getaffinity(0, sizeof(cpus), &cpus);
	r = rte_thread_register();
	sched_setaffinity(0, sizeof(cpus), &cpus);
	return r < 0 ? -rte_errno : 0;
}

uint32_t xp_dpdk_ip(const struct xp_dpdk *d)
{
	return ntohl(d->ip);
}
