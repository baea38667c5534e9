/* SPDX-License-Identifier: Apache-2.0 */
/* vmigd's own reliable, ordered byte stream over datagrams, for the kernel-bypass node hop: frame
 * format, sequence numbers, cumulative and selective acknowledgements, retransmission, flow and
 * congestion control. Pure: no clock, no I/O; the caller moves frames and says what time it is. */
#ifndef XP_REL_H
#define XP_REL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/*
 * A frame, all fields big-endian, carried in one UDP datagram (doc/design.md, "The DPDK node
 * hop"):
 *
 *    0  u8   version (XP_REL_VERSION)
 *    1  u8   flags (XP_REL_F_*)
 *    2  u16  payload length
 *    4  u32  stream: the QEMU connection it belongs to
 *    8  u64  packet number: one per frame sent, never reused (the nonce of a sealed frame)
 *   16  u64  seq: the stream offset of the payload's first byte (of the FIN, if flagged)
 *   24  u64  ack: every byte before it arrived (the FIN counts as one byte after the data)
 *   32  u32  window: bytes past ack the receiver has room for
 *   36  u8   SACK blocks that follow (at most XP_REL_MAX_SACK)
 *   37  u8   0; 38 u16 0
 *   40  SACK blocks, each u64 start and u64 end (exclusive) of bytes held past ack
 *       payload
 */
#define XP_REL_VERSION	 1
#define XP_REL_HDR	 40
#define XP_REL_MAX_SACK	 4
#define XP_REL_SACK_SIZE 16
#define XP_REL_MAX_HDR	 (XP_REL_HDR + XP_REL_MAX_SACK * XP_REL_SACK_SIZE)

enum {
	XP_REL_F_DATA = 1u << 0,  /* seq and payload (or FIN) are meaningful */
	XP_REL_F_FIN = 1u << 1,	  /* the stream ends at seq; no payload */
	XP_REL_F_PROBE = 1u << 2, /* answer with an acknowledgement now (zero-window probe) */
};
#define XP_REL_F_ALL (XP_REL_F_DATA | XP_REL_F_FIN | XP_REL_F_PROBE)

struct xp_rel_sack {
	uint64_t start, end;
};

struct xp_rel_hdr {
	uint8_t flags;
	uint16_t len;
	uint32_t stream;
	uint64_t pn, seq, ack;
	uint32_t window;
	uint8_t nsack;
	struct xp_rel_sack sack[XP_REL_MAX_SACK];
	const uint8_t *payload; /* into the parsed buffer */
};

/* Parses a frame; -EBADMSG with *why set for anything malformed (short, wrong version, unknown
 * flag, a length or SACK block that does not fit or makes no sense). */
int xp_rel_parse(const uint8_t *buf, size_t len, struct xp_rel_hdr *h, const char **why);
/* Writes h's header and SACK blocks; returns their length (h->payload is not copied). */
size_t xp_rel_put_hdr(const struct xp_rel_hdr *h, uint8_t *buf);
/* A sealed frame's packet number and header length (the sealing's nonce and associated data),
 * read before the frame can be parsed; -EBADMSG if buf is too short for them. */
int xp_rel_peek(const uint8_t *buf, size_t len, uint64_t *pn, size_t *hdr_len);

struct xp_rel_cfg {
	uint32_t stream;
	uint32_t mss;	       /* most payload per frame */
	uint32_t sndbuf;       /* bytes kept until acknowledged */
	uint32_t rcvbuf;       /* bytes held for the reader, in order or not: the window */
	uint32_t peer_rcvbuf;  /* the peer's rcvbuf, as the handshake said; 0: one frame until heard
				*/
	uint32_t min_rto_us;   /* 0: XP_REL_MIN_RTO_US */
	uint32_t ack_delay_us; /* 0: XP_REL_ACK_DELAY_US */
	/* The packet numbers this stream's frames take, shared by every stream to the same peer:
	 * one rising space per direction, as the sealing's nonces need. NULL: the stream's own. */
	uint64_t *pn_space;
};

#define XP_REL_MIN_RTO_US     10000
#define XP_REL_MAX_RTO_US     2000000
#define XP_REL_INITIAL_RTO_US 200000
#define XP_REL_ACK_DELAY_US   500
/* Loss: a frame is lost once this many frames' worth of bytes sent after it were acknowledged
 * selectively (RFC 6675's DupThresh). */
#define XP_REL_DUPTHRESH 3
/* Out-of-order ranges a receiver keeps; a frame that would need more is dropped and resent. */
#define XP_REL_MAX_RANGES 32

struct xp_rel_stats {
	uint64_t frames_sent, frames_received, bytes_sent, bytes_delivered;
	uint64_t retransmitted_frames, retransmitted_bytes, fast_recoveries, timeouts;
	uint64_t duplicate_frames, out_of_order_frames, beyond_window_frames, dropped_no_range;
	uint64_t bad_acks, bad_frames, probes_sent, tail_probes;
	uint64_t cwnd, ssthresh, pipe, srtt_us, rto_us, peer_window;
	uint64_t held; /* bytes in the receive buffer, in order or not: at most rcvbuf */
};

struct xp_rel;

/* Allocates every buffer the stream will use (none later); -EINVAL for a bad cfg, -ENOMEM. */
int xp_rel_new(const struct xp_rel_cfg *cfg, uint64_t now_us, struct xp_rel **ret);
void xp_rel_free(struct xp_rel *r);

/* Sending: copies up to len bytes into the send buffer; returns how many fitted. */
size_t xp_rel_write(struct xp_rel *r, const void *buf, size_t len);
/* The same without a copy, for readv() straight into the send buffer: up to two spans of free
 * room (iov[1] may be empty), their total returned; xp_rel_write_commit() takes the first n of
 * those bytes as written (n at most that total). After a shutdown there is no room. */
size_t xp_rel_write_space(struct xp_rel *r, struct iovec iov[2]);
void xp_rel_write_commit(struct xp_rel *r, size_t n);
/* What was written and is not acknowledged in order yet (sent or not, selectively acknowledged
 * or not), the oldest first, as up to two spans: what a stream handed to another path must send
 * again from, where the peer tells what it has. Their total is returned. */
size_t xp_rel_unacked(struct xp_rel *r, struct iovec iov[2]);
/*
 * For a writer whose bytes make sense only whole (compressed chunks): from now on bytes the peer
 * acknowledged stay in the send buffer, taking its room, until xp_rel_release() lets them go, so
 * that the writer can hand another path what the peer may not have used yet. xp_rel_kept():
 * what is held (released or not, acknowledged or not), from *from, as up to two spans, their
 * total returned. xp_rel_release() lets the bytes before upto go (at most what was
 * acknowledged). xp_rel_acked(): every byte before it was acknowledged.
 */
void xp_rel_hold(struct xp_rel *r);
size_t xp_rel_kept(struct xp_rel *r, uint64_t *from, struct iovec iov[2]);
void xp_rel_release(struct xp_rel *r, uint64_t upto);
uint64_t xp_rel_acked(const struct xp_rel *r);
/* No more writes: a FIN follows the data. */
void xp_rel_shutdown(struct xp_rel *r);
/* Every byte written and the FIN were acknowledged. */
bool xp_rel_send_done(const struct xp_rel *r);
/* Something sent (bytes or the FIN) waits for the peer's acknowledgement: a silent peer now is
 * a problem, where a stream with nothing out may be quiet for as long as its user is. */
bool xp_rel_awaiting_ack(const struct xp_rel *r);
/* Something written (bytes or the FIN) is not acknowledged yet, sent or not: what waits on the
 * peer, where xp_rel_awaiting_ack() counts only what went out (a frame that the port could not
 * send, for want of a link or of the peer's MAC, never went out). */
bool xp_rel_waiting(const struct xp_rel *r);

/* Receiving: copies out up to len bytes that arrived in order; returns how many. */
size_t xp_rel_read(struct xp_rel *r, void *buf, size_t len);
/* The same without a copy, for writev() straight from the receive buffer: up to two spans of
 * in-order bytes, their total returned; xp_rel_read_commit() takes the first n as read. */
size_t xp_rel_read_space(struct xp_rel *r, struct iovec iov[2]);
void xp_rel_read_commit(struct xp_rel *r, size_t n);
/* The peer's FIN arrived and every byte before it was read. */
bool xp_rel_eof(const struct xp_rel *r);

/*
 * The next frame to send now, into buf (at least XP_REL_MAX_HDR + mss bytes): a retransmission,
 * new data, the FIN, a window probe or an acknowledgement, in that order of preference, as the
 * congestion and peer windows allow. Returns its length, 0 when there is nothing to send now.
 */
size_t xp_rel_next_frame(struct xp_rel *r, uint64_t now_us, uint8_t *buf, size_t cap);
/* A parsed frame for this stream arrived. Returns 0, or -EPROTO for an acknowledgement of
 * bytes never sent (counted in bad_acks; the frame's data is still taken). */
int xp_rel_input(struct xp_rel *r, uint64_t now_us, const struct xp_rel_hdr *h);
/* When xp_rel_next_frame() may have something that it has not now (a timer): UINT64_MAX for
 * never. Calling it earlier is harmless. */
uint64_t xp_rel_deadline(const struct xp_rel *r);

void xp_rel_stats(const struct xp_rel *r, struct xp_rel_stats *st);

#endif
