// SPDX-License-Identifier: Apache-2.0
/* Passive QEMU migration stream inspector: a byte-at-a-time-safe state machine over the main
 * channel and multifd channels that counts what goes by. It never judges the stream for QEMU;
 * anything it does not follow turns it into a byte counter with a reason. */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_inspect.h"
#include "util.h"

#define MAGIC_MAIN    0x5145564du /* "QEVM" */
#define MAGIC_MULTIFD 0x11223344u
#define MAIN_VERSION  3
#define MFD_VERSION   1

/* Multifd (reference §1.3-1.6). */
#define MFD_INIT_LEN	 64
#define MFD_HDR_MIN	 12 /* MultiFDPacketHdr_t: magic, version, flags */
#define MFD_HDR_RAM	 320
#define MFD_HDR_DEV	 276
#define MFD_PACKET_SIZE	 (512u * 1024)
#define MFD_PAGES_MAX	 (MFD_PACKET_SIZE / 512)
#define MFD_F_SYNC	 0x1u
#define MFD_F_COMP_MASK	 0x3eu
#define MFD_F_DEVSTATE	 0x40u
#define MFD_F_KNOWN	 (MFD_F_SYNC | MFD_F_COMP_MASK | MFD_F_DEVSTATE)
#define MFD_COMP_MAX	 (64u << 20) /* a compressed 512 KiB packet is far smaller */
#define MFD_DEVSTATE_MAX (256u << 20)

/* Main channel (reference §2.1-2.3). */
#define VM_EOF		 0x00
#define VM_SECTION_START 0x01
#define VM_SECTION_PART	 0x02
#define VM_SECTION_END	 0x03
#define VM_SECTION_FULL	 0x04
#define VM_CONFIGURATION 0x07
#define VM_COMMAND	 0x08
#define VM_FOOTER	 0x7e
#define CMD_PACKAGED	 7
#define CMD_SWITCHOVER	 11
#define RAM_ZERO	 0x002u
#define RAM_MEM_SIZE	 0x004u
#define RAM_PAGE	 0x008u
#define RAM_EOS		 0x010u
#define RAM_CONTINUE	 0x020u
#define RAM_XBZRLE	 0x040u
#define RAM_COMPRESS	 0x100u
#define RAM_FLUSH	 0x200u
#define RAM_FLAG_MASK	 0x3ffu
/* The main channel never says its page size (x86 never sends target-page-bits): assume x86. */
#define MAIN_PAGE_SIZE 4096u
#define MAIN_WANT      (64u * 1024)
#define MAIN_CONF_MAX  256
#define MAIN_COMP_MAX  (64u * 1024)
/* Setup before the ram section's end is a few KiB; a bounded scan fails loudly instead. */
#define SCAN_LIMIT (1u << 20)
/* 01 <id:4> 03 'r' 'a' 'm' <instance 0:4> <version 4:4> */
#define PAT_START_LEN 17
/* [be64 MULTIFD_FLUSH] be64 EOS 7e <id:4> */
#define PAT_EOS_LEN 13
#define WIN_LEN	    (PAT_EOS_LEN + 8)
#define WIN_RING    32 /* a power of two >= WIN_LEN */

#define BLOCKS_MAX 16
#define IDSTR_MAX  256
#define HB_LEN	   (MFD_HDR_RAM + 8 * MFD_PAGES_MAX)

/* Bits of the published flag word; the kind sits in the low two. */
#define PUB_KIND_MASK  0x3u
#define PUB_MACHINE    0x4u
#define PUB_BYTES_ONLY 0x8u
#define PUB_SWITCHOVER 0x10u

enum insp_state {
	S_DETECT,     /* the first 4 bytes */
	S_MFD_INIT,   /* MultiFDInit_t */
	S_MFD_HDR,    /* a packet header; grows 12 -> 276 or 320 -> 320 + 8 * pages_alloc */
	S_MAIN_HDR,   /* magic + version */
	S_MAIN_FIRST, /* the byte after the header: configuration or not */
	S_CONF_LEN,
	S_CONF_NAME,
	S_SCAN_START, /* byte by byte: the ram SECTION_START */
	S_SCAN_EOS,   /* byte by byte: the end of the ram setup payload */
	S_REC,	      /* a top-level record type */
	S_CMD,	      /* be16 cmd, be16 len */
	S_CMD_PACKAGED,
	S_SECT_ID,
	S_RAM_WORD,
	S_RAM_IDLEN,
	S_RAM_IDSTR,
	S_RAM_ZERO,
	S_RAM_XBZRLE,
	S_RAM_COMP,
	S_FOOTER,
	S_STOPPED,
};

/* Counters as the parser keeps them; copied to the published atomics after each feed. */
struct insp_count {
	uint64_t pages, zero_pages, packets, syncs, sync_bytes_last;
	uint64_t passes, pass_pages_last, pass_ms_last, pass_pages_cur;
	uint32_t stream_version, page_size;
	uint64_t ram_total;
	int channel_id;
};

struct px_insp {
	px_insp_clock_fn now_ms;

	/* Published: written by the parser only, read by px_insp_read() on any thread. */
	_Atomic uint32_t pub; /* PUB_*; release after machine/reason/switchover_ms */
	_Atomic uint64_t p_bytes, p_pages, p_zero_pages, p_packets, p_syncs, p_sync_bytes_last;
	_Atomic uint64_t p_passes, p_pass_pages_last, p_pass_ms_last, p_pass_pages_cur;
	_Atomic uint32_t p_stream_version, p_page_size;
	_Atomic uint64_t p_ram_total;
	_Atomic int p_channel_id;
	uint64_t switchover_ms;		   /* before PUB_SWITCHOVER */
	char machine[PX_INSP_MACHINE_MAX]; /* once, before PUB_MACHINE */
	char reason[PX_INSP_REASON_MAX];   /* once, before PUB_BYTES_ONLY */

	/* The parser's working state: the feeding thread only. */
	uint32_t pub_shadow;
	struct insp_count c;
	uint64_t pos;  /* stream bytes consumed */
	uint64_t skip; /* bytes to pass before the next item */
	enum insp_state st;
	size_t need, have;  /* the item being gathered into hb */
	uint64_t last_sync; /* stream position of the last sync point */
	/* multifd */
	uint32_t mfd_flags;
	uint32_t mfd_pages_alloc; /* 0 until the first RAM packet */
	/* main */
	uint32_t ram_id;
	uint32_t rec_type; /* the RAM record being read */
	uint64_t rec_off;
	uint8_t sect_type; /* PART or END */
	uint32_t scan_n;
	uint64_t mem_word; /* the ram setup payload's first 8 bytes: total | MEM_SIZE */
	uint8_t win[WIN_RING]; /* the last bytes scanned, a ring */
	uint32_t win_at;
	uint8_t win_len;
	/* scan passes */
	bool pass_off;	/* block table overflow */
	bool block_set; /* main: a record named its block, so CONTINUE means something */
	int cur_block;	/* ordinal of the main channel's current block, -1 none */
	uint32_t last_ord;
	uint64_t last_off;
	uint64_t pass_start;
	unsigned int nblocks;
	uint16_t block_len[BLOCKS_MAX];
	char block[BLOCKS_MAX][IDSTR_MAX];

	uint8_t hb[HB_LEN];
};

static uint64_t default_clock(void)
{
	return vm_now_ms();
}

static uint64_t get_be64(const uint8_t *p)
{
	return (uint64_t)vm_get_be32(p) << 32 | vm_get_be32(p + 4);
}

int px_insp_new(px_insp_clock_fn now_ms, struct px_insp **ret)
{
	struct px_insp *in = calloc(1, sizeof(*in));

	if (!in)
		return -ENOMEM;
	in->now_ms = now_ms ? now_ms : default_clock;
	in->c.channel_id = -1;
	atomic_init(&in->p_channel_id, -1);
	in->cur_block = -1;
	in->st = S_DETECT;
	in->need = 4;
	*ret = in;
	return 0;
}

void px_insp_free(struct px_insp *in)
{
	free(in);
}

static void publish_flags(struct px_insp *in, uint32_t set)
{
	in->pub_shadow |= set;
	atomic_store_explicit(&in->pub, in->pub_shadow, memory_order_release);
}

static void set_kind(struct px_insp *in, enum px_insp_kind k)
{
	in->pub_shadow = (in->pub_shadow & ~PUB_KIND_MASK) | (uint32_t)k;
	publish_flags(in, 0);
}

/* Parsing ends here for good; everything after is counted as bytes. */
__attribute__((format(printf, 2, 3))) static void stop(struct px_insp *in, const char *fmt, ...)
{
	va_list ap;

	if (in->st == S_STOPPED)
		return;
	va_start(ap, fmt);
	vsnprintf(in->reason, sizeof(in->reason), fmt, ap);
	va_end(ap);
	in->st = S_STOPPED;
	in->skip = 0;
	publish_flags(in, PUB_BYTES_ONLY);
}

static void expect(struct px_insp *in, enum insp_state st, size_t n)
{
	in->st = st;
	in->need = n;
	in->have = 0;
}

static unsigned long long item_at(const struct px_insp *in)
{
	return in->pos - in->have;
}

/* A sync point ending at stream position at. */
static void sync_at(struct px_insp *in, uint64_t at)
{
	in->c.syncs++;
	in->c.sync_bytes_last = at - in->last_sync;
	in->last_sync = at;
}

static void sync_point(struct px_insp *in)
{
	sync_at(in, in->pos);
}

static void set_switchover(struct px_insp *in)
{
	if (in->pub_shadow & PUB_SWITCHOVER)
		return;
	in->switchover_ms = in->now_ms();
	publish_flags(in, PUB_SWITCHOVER);
}

/* Ordinal of a RAMBlock name in first-seen order; -1 when the table is full. */
static int block_ord(struct px_insp *in, const char *name, size_t n)
{
	for (unsigned int i = 0; i < in->nblocks; i++)
		if (in->block_len[i] == n && memcmp(in->block[i], name, n) == 0)
			return (int)i;
	if (in->nblocks == BLOCKS_MAX)
		return -1;
	memcpy(in->block[in->nblocks], name, n);
	in->block_len[in->nblocks] = (uint16_t)n;
	return (int)in->nblocks++;
}

static bool pos_below(uint32_t ord, uint64_t off, uint32_t ord2, uint64_t off2)
{
	return ord < ord2 || (ord == ord2 && off < off2);
}

/*
 * npages pages of block ord spanning [lo, hi] in scan order. A position below the previous one
 * means the scan wrapped: one pass ended, the next began.
 */
static void pass_see(struct px_insp *in, int ord, uint64_t lo, uint64_t hi, uint64_t npages)
{
	uint64_t now;

	if (in->pass_off)
		return;
	if (ord < 0) {
		in->pass_off = true;
		return;
	}
	if (in->c.passes == 0) {
		in->c.passes = 1;
		in->pass_start = in->now_ms();
	} else if (pos_below((uint32_t)ord, lo, in->last_ord, in->last_off)) {
		now = in->now_ms();
		in->c.passes++;
		in->c.pass_pages_last = in->c.pass_pages_cur;
		in->c.pass_ms_last = now - in->pass_start;
		in->c.pass_pages_cur = 0;
		in->pass_start = now;
	}
	in->c.pass_pages_cur += npages;
	in->last_ord = (uint32_t)ord;
	in->last_off = hi;
}

/* ---- multifd ---- */

static void mfd_init(struct px_insp *in)
{
	uint32_t version = vm_get_be32(in->hb + 4);

	if (version != MFD_VERSION) {
		stop(in, "multifd: init version %u, expected %u", version, MFD_VERSION);
		return;
	}
	in->c.stream_version = version;
	in->c.channel_id = in->hb[24];
	expect(in, S_MFD_HDR, MFD_HDR_MIN);
}

static void mfd_pass(struct px_insp *in, uint32_t normal, uint32_t zero)
{
	const uint8_t *offs = in->hb + MFD_HDR_RAM;
	uint32_t n = normal + zero;
	uint64_t lo = UINT64_MAX, hi = 0;
	int ord;

	if (n == 0 || in->pass_off)
		return;
	ord = block_ord(in, (const char *)in->hb + 64, strnlen((const char *)in->hb + 64, 256));
	if (zero == 0) {
		/* Normal pages alone keep scan order, so a wrap inside a packet is seen too. */
		for (uint32_t i = 0; i < n; i++) {
			uint64_t off = get_be64(offs + 8 * i);

			pass_see(in, ord, off, off, 1);
		}
		return;
	}
	/* Zero-page detection (9.0+) reorders offsets within the packet: judge it as a whole. */
	for (uint32_t i = 0; i < n; i++) {
		uint64_t off = get_be64(offs + 8 * i);

		lo = off < lo ? off : lo;
		hi = off > hi ? off : hi;
	}
	pass_see(in, ord, lo, hi, n);
}

static void mfd_ram_packet(struct px_insp *in)
{
	uint32_t pa = in->mfd_pages_alloc, page_size = MFD_PACKET_SIZE / pa;
	uint32_t normal = vm_get_be32(in->hb + 16), size = vm_get_be32(in->hb + 20);
	uint32_t zero = vm_get_be32(in->hb + 32);
	unsigned long long at = item_at(in);

	if (normal > pa) {
		stop(in, "multifd: %u normal pages of %u at byte %llu", normal, pa, at);
		return;
	}
	if (zero > pa - normal) {
		stop(in, "multifd: %u zero + %u normal pages of %u at byte %llu", zero, normal, pa,
		     at);
		return;
	}
	/*
	 * 7.2 refreshes next_packet_size only for a packet with pages, so an empty one (SYNC) may
	 * carry the last packet's. Receivers read nothing after it, nor does the inspector.
	 */
	if (normal == 0) {
		if (size > MFD_COMP_MAX) {
			stop(in, "multifd: next_packet_size %u for no pages at byte %llu", size,
			     at);
			return;
		}
		size = 0;
	} else if (!(in->mfd_flags & MFD_F_COMP_MASK) ? size != (uint64_t)normal * page_size
						      : size > MFD_COMP_MAX) {
		stop(in, "multifd: next_packet_size %u for %u pages at byte %llu", size, normal,
		     at);
		return;
	}
	in->c.packets++;
	in->c.pages += normal;
	in->c.zero_pages += zero;
	if (in->mfd_flags & MFD_F_SYNC)
		sync_point(in);
	mfd_pass(in, normal, zero);
	expect(in, S_MFD_HDR, MFD_HDR_MIN);
	in->skip = size;
}

static void mfd_hdr(struct px_insp *in)
{
	unsigned long long at = item_at(in);
	uint32_t v, pa;

	if (in->have == MFD_HDR_MIN) {
		v = vm_get_be32(in->hb);
		if (v != MAGIC_MULTIFD) {
			stop(in, "multifd: bad packet magic 0x%08x at byte %llu", v, at);
			return;
		}
		v = vm_get_be32(in->hb + 4);
		if (v != MFD_VERSION) {
			stop(in, "multifd: packet version %u at byte %llu", v, at);
			return;
		}
		in->mfd_flags = vm_get_be32(in->hb + 8);
		if (in->mfd_flags & ~MFD_F_KNOWN) {
			stop(in, "multifd: unknown packet flags 0x%x at byte %llu", in->mfd_flags,
			     at);
			return;
		}
		in->need = in->mfd_flags & MFD_F_DEVSTATE ? MFD_HDR_DEV : MFD_HDR_RAM;
		return;
	}
	if (in->mfd_flags & MFD_F_DEVSTATE) {
		/* VFIO device state (10.0+): opaque bytes, not pages. */
		v = vm_get_be32(in->hb + MFD_HDR_DEV - 4);
		if (v > MFD_DEVSTATE_MAX) {
			stop(in, "multifd: device state of %u bytes at byte %llu", v, at);
			return;
		}
		in->c.packets++;
		expect(in, S_MFD_HDR, MFD_HDR_MIN);
		in->skip = v;
		return;
	}
	if (in->have == MFD_HDR_RAM) {
		pa = vm_get_be32(in->hb + 12);
		/*
		 * 9.2+ fills a SYNC packet's header only (pages_alloc 0) but still sends the
		 * whole packet: the offsets it would have, MULTIFD_PACKET_SIZE / page size.
		 */
		if (pa == 0 && (in->mfd_flags & MFD_F_SYNC))
			pa = in->mfd_pages_alloc ? in->mfd_pages_alloc
						 : MFD_PACKET_SIZE / MAIN_PAGE_SIZE;
		if (pa == 0 || pa > MFD_PAGES_MAX || (pa & (pa - 1))) {
			stop(in, "multifd: pages_alloc %u at byte %llu", pa, at);
			return;
		}
		if (in->mfd_pages_alloc && pa != in->mfd_pages_alloc) {
			stop(in, "multifd: pages_alloc %u after %u at byte %llu", pa,
			     in->mfd_pages_alloc, at);
			return;
		}
		in->mfd_pages_alloc = pa;
		in->c.page_size = MFD_PACKET_SIZE / pa;
		in->need = MFD_HDR_RAM + 8 * (size_t)pa;
		return;
	}
	mfd_ram_packet(in);
}

/* ---- main channel ---- */

static void enter_scan(struct px_insp *in, enum insp_state st)
{
	in->st = st;
	in->need = in->have = 0;
	in->win_len = 0;
	in->win_at = 0;
	in->scan_n = 0;
	in->mem_word = 0;
}

static void scan_byte(struct px_insp *in, uint8_t b)
{
	uint8_t last = in->st == S_SCAN_START ? 4 : (uint8_t)in->ram_id, lin[WIN_LEN];
	const uint8_t *w;

	in->win[in->win_at++ % WIN_RING] = b;
	if (in->win_len < WIN_LEN)
		in->win_len++;
	if (++in->scan_n > SCAN_LIMIT) {
		stop(in, "main: no ram %s in %u bytes, parsing stopped",
		     in->st == S_SCAN_START ? "section start" : "setup end", SCAN_LIMIT);
		return;
	}
	/* The ram setup payload opens with be64 (RAM total | MEM_SIZE); anything else: unknown. */
	if (in->st == S_SCAN_EOS && in->scan_n <= 8) {
		in->mem_word = in->mem_word << 8 | b;
		if (in->scan_n == 8 && (in->mem_word & (MAIN_PAGE_SIZE - 1)) == RAM_MEM_SIZE)
			in->c.ram_total = in->mem_word & ~(uint64_t)(MAIN_PAGE_SIZE - 1);
	}
	/* Both patterns end in a known byte; only then is the window worth a look. */
	if (b != last)
		return;
	for (unsigned int i = 0; i < WIN_LEN; i++)
		lin[i] = in->win[(in->win_at - WIN_LEN + i) % WIN_RING];
	if (in->st == S_SCAN_START) {
		w = lin + WIN_LEN - PAT_START_LEN;
		if (in->win_len < PAT_START_LEN || w[0] != VM_SECTION_START || w[5] != 3 ||
		    memcmp(w + 6, "ram", 3) != 0 || vm_get_be32(w + 9) != 0 ||
		    vm_get_be32(w + 13) != 4)
			return;
		in->ram_id = vm_get_be32(w + 1);
		enter_scan(in, S_SCAN_EOS);
		return;
	}
	w = lin + WIN_LEN - PAT_EOS_LEN;
	if (in->win_len < PAT_EOS_LEN || get_be64(w) != RAM_EOS || w[8] != VM_FOOTER ||
	    vm_get_be32(w + 9) != in->ram_id)
		return;
	/* 8.1+ per-round mode flushes multifd once in setup, just before the EOS. */
	if (in->win_len >= WIN_LEN && get_be64(lin) == RAM_FLUSH)
		sync_at(in, in->pos - PAT_EOS_LEN);
	sync_point(in);
	in->c.page_size = MAIN_PAGE_SIZE;
	expect(in, S_REC, 1);
}

static void main_hdr(struct px_insp *in)
{
	uint32_t v = vm_get_be32(in->hb + 4);

	if (v != MAIN_VERSION) {
		stop(in, "main: stream version %u, expected %u", v, MAIN_VERSION);
		return;
	}
	in->c.stream_version = v;
	expect(in, S_MAIN_FIRST, 1);
}

static void main_conf_name(struct px_insp *in)
{
	size_t n = in->have < PX_INSP_MACHINE_MAX - 1 ? in->have : PX_INSP_MACHINE_MAX - 1;

	for (size_t i = 0; i < n; i++) {
		uint8_t ch = in->hb[i];

		in->machine[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
	}
	in->machine[n] = '\0';
	publish_flags(in, PUB_MACHINE);
	enter_scan(in, S_SCAN_START);
}

/* Parsing stops at a record it cannot follow: expected after switchover, a surprise before. */
static void main_stop_at(struct px_insp *in, const char *what)
{
	if (in->pub_shadow & PUB_SWITCHOVER)
		stop(in, "switchover: device state follows");
	else
		stop(in, "main: %s, parsing stopped at byte %llu", what, item_at(in));
}

static void main_rec(struct px_insp *in)
{
	char what[40];

	switch (in->hb[0]) {
	case VM_COMMAND:
		expect(in, S_CMD, 4);
		return;
	case VM_SECTION_PART:
	case VM_SECTION_END:
		in->sect_type = in->hb[0];
		expect(in, S_SECT_ID, 4);
		return;
	case VM_EOF:
		main_stop_at(in, "EOF record");
		return;
	case VM_SECTION_START:
		main_stop_at(in, "SECTION_START after ram setup");
		return;
	case VM_SECTION_FULL:
		main_stop_at(in, "SECTION_FULL");
		return;
	default:
		snprintf(what, sizeof(what), "unknown record type 0x%02x", in->hb[0]);
		main_stop_at(in, what);
	}
}

static void main_cmd(struct px_insp *in)
{
	uint16_t cmd = vm_get_be16(in->hb), len = vm_get_be16(in->hb + 2);

	if (cmd == CMD_PACKAGED) {
		if (len != 4) {
			stop(in, "main: PACKAGED command of length %u at byte %llu", len,
			     item_at(in));
			return;
		}
		/*
		 * Post-copy starts: the source VM has stopped and QEMU's limit is now
		 * max-postcopy-bandwidth. 10.0 says SWITCHOVER_START first; 7.2 only this.
		 */
		set_switchover(in);
		expect(in, S_CMD_PACKAGED, 4);
		return;
	}
	/* 10.0+: the VM stopped; the last RAM pages still follow in the ram SECTION_END. */
	if (cmd == CMD_SWITCHOVER)
		set_switchover(in);
	expect(in, S_REC, 1);
	in->skip = len;
}

static void main_sect_id(struct px_insp *in)
{
	uint32_t id = vm_get_be32(in->hb);
	char what[48];

	if (id != in->ram_id) {
		snprintf(what, sizeof(what), "unknown section id %u (not ram)", id);
		main_stop_at(in, what);
		return;
	}
	if (in->sect_type == VM_SECTION_END)
		set_switchover(in);
	expect(in, S_RAM_WORD, 8);
}

/* A page record's header is complete: count it, then read or pass its payload. */
static void ram_page(struct px_insp *in)
{
	pass_see(in, in->cur_block, in->rec_off, in->rec_off, 1);
	switch (in->rec_type) {
	case RAM_ZERO:
		in->c.zero_pages++;
		expect(in, S_RAM_ZERO, 1);
		break;
	case RAM_PAGE:
		in->c.pages++;
		expect(in, S_RAM_WORD, 8);
		in->skip = MAIN_PAGE_SIZE;
		break;
	case RAM_XBZRLE:
		in->c.pages++;
		expect(in, S_RAM_XBZRLE, 3);
		break;
	default: /* RAM_COMPRESS */
		in->c.pages++;
		expect(in, S_RAM_COMP, 4);
		break;
	}
}

static void ram_word(struct px_insp *in)
{
	uint64_t word = get_be64(in->hb);
	uint32_t flags = word & RAM_FLAG_MASK, type = flags & ~RAM_CONTINUE;
	unsigned long long at = item_at(in);

	if (word & (MAIN_PAGE_SIZE - 1) & ~(uint64_t)RAM_FLAG_MASK) {
		stop(in, "main: RAM record word 0x%llx at byte %llu", (unsigned long long)word, at);
		return;
	}
	switch (type) {
	case RAM_EOS:
	case RAM_FLUSH:
		if (word != type) {
			stop(in, "main: RAM record word 0x%llx at byte %llu",
			     (unsigned long long)word, at);
			return;
		}
		sync_point(in);
		if (type == RAM_EOS)
			expect(in, S_FOOTER, 5);
		else
			expect(in, S_RAM_WORD, 8);
		return;
	case RAM_ZERO:
	case RAM_PAGE:
	case RAM_XBZRLE:
	case RAM_COMPRESS:
		break;
	default:
		stop(in, "main: RAM record flags 0x%x at byte %llu, parsing stopped", flags, at);
		return;
	}
	in->rec_type = type;
	in->rec_off = word & ~(uint64_t)(MAIN_PAGE_SIZE - 1);
	if (!(flags & RAM_CONTINUE)) {
		expect(in, S_RAM_IDLEN, 1);
		return;
	}
	if (!in->block_set) {
		stop(in, "main: RAM record continues no block at byte %llu", at);
		return;
	}
	ram_page(in);
}

static void ram_idstr(struct px_insp *in)
{
	in->cur_block = block_ord(in, (const char *)in->hb, in->have);
	in->block_set = true;
	ram_page(in);
}

static void main_footer(struct px_insp *in)
{
	if (in->hb[0] != VM_FOOTER || vm_get_be32(in->hb + 1) != in->ram_id) {
		stop(in, "main: bad ram section footer at byte %llu", item_at(in));
		return;
	}
	expect(in, S_REC, 1);
}

/* ---- the machine ---- */

static void detect(struct px_insp *in)
{
	uint32_t magic = vm_get_be32(in->hb);

	if (magic == MAGIC_MAIN) {
		set_kind(in, PX_INSP_MAIN);
		in->st = S_MAIN_HDR;
		in->need = 8;
	} else if (magic == MAGIC_MULTIFD) {
		set_kind(in, PX_INSP_MULTIFD);
		in->st = S_MFD_INIT;
		in->need = MFD_INIT_LEN;
	} else {
		set_kind(in, PX_INSP_OTHER);
		stop(in, "unrecognised stream start %02x %02x %02x %02x", in->hb[0], in->hb[1],
		     in->hb[2], in->hb[3]);
	}
}

/* hb holds the need bytes of the item of state st. */
static void step(struct px_insp *in)
{
	uint32_t v;

	switch (in->st) {
	case S_DETECT:
		detect(in);
		break;
	case S_MFD_INIT:
		mfd_init(in);
		break;
	case S_MFD_HDR:
		mfd_hdr(in);
		break;
	case S_MAIN_HDR:
		main_hdr(in);
		break;
	case S_MAIN_FIRST:
		if (in->hb[0] == VM_CONFIGURATION) {
			expect(in, S_CONF_LEN, 4);
		} else {
			/* No configuration section: this byte may begin the ram SECTION_START. */
			enter_scan(in, S_SCAN_START);
			scan_byte(in, in->hb[0]);
		}
		break;
	case S_CONF_LEN:
		v = vm_get_be32(in->hb);
		if (v == 0 || v > MAIN_CONF_MAX)
			stop(in, "main: machine name of %u bytes at byte %llu", v, item_at(in));
		else
			expect(in, S_CONF_NAME, v);
		break;
	case S_CONF_NAME:
		main_conf_name(in);
		break;
	case S_REC:
		main_rec(in);
		break;
	case S_CMD:
		main_cmd(in);
		break;
	case S_CMD_PACKAGED:
		expect(in, S_REC, 1);
		in->skip = vm_get_be32(in->hb);
		break;
	case S_SECT_ID:
		main_sect_id(in);
		break;
	case S_RAM_WORD:
		ram_word(in);
		break;
	case S_RAM_IDLEN:
		if (in->hb[0] == 0)
			stop(in, "main: empty RAMBlock name at byte %llu", item_at(in));
		else
			expect(in, S_RAM_IDSTR, in->hb[0]);
		break;
	case S_RAM_IDSTR:
		ram_idstr(in);
		break;
	case S_RAM_ZERO:
		expect(in, S_RAM_WORD, 8);
		break;
	case S_RAM_XBZRLE:
		if (in->hb[0] != 1) {
			stop(in, "main: XBZRLE encoding %u at byte %llu", in->hb[0], item_at(in));
			break;
		}
		expect(in, S_RAM_WORD, 8);
		in->skip = vm_get_be16(in->hb + 1);
		break;
	case S_RAM_COMP:
		v = vm_get_be32(in->hb);
		if (v > MAIN_COMP_MAX) {
			stop(in, "main: compressed page of %u bytes at byte %llu", v, item_at(in));
			break;
		}
		expect(in, S_RAM_WORD, 8);
		in->skip = v;
		break;
	case S_FOOTER:
		main_footer(in);
		break;
	case S_SCAN_START:
	case S_SCAN_EOS:
	case S_STOPPED:
		break;
	}
}

static void publish(struct px_insp *in)
{
	const struct insp_count *c = &in->c;

	atomic_store_explicit(&in->p_bytes, in->pos, memory_order_relaxed);
	atomic_store_explicit(&in->p_pages, c->pages, memory_order_relaxed);
	atomic_store_explicit(&in->p_zero_pages, c->zero_pages, memory_order_relaxed);
	atomic_store_explicit(&in->p_packets, c->packets, memory_order_relaxed);
	atomic_store_explicit(&in->p_syncs, c->syncs, memory_order_relaxed);
	atomic_store_explicit(&in->p_sync_bytes_last, c->sync_bytes_last, memory_order_relaxed);
	atomic_store_explicit(&in->p_passes, c->passes, memory_order_relaxed);
	atomic_store_explicit(&in->p_pass_pages_last, c->pass_pages_last, memory_order_relaxed);
	atomic_store_explicit(&in->p_pass_ms_last, c->pass_ms_last, memory_order_relaxed);
	atomic_store_explicit(&in->p_pass_pages_cur, c->pass_pages_cur, memory_order_relaxed);
	atomic_store_explicit(&in->p_stream_version, c->stream_version, memory_order_relaxed);
	atomic_store_explicit(&in->p_page_size, c->page_size, memory_order_relaxed);
	atomic_store_explicit(&in->p_ram_total, c->ram_total, memory_order_relaxed);
	atomic_store_explicit(&in->p_channel_id, c->channel_id, memory_order_relaxed);
}

void px_insp_feed(struct px_insp *in, const uint8_t *buf, size_t len)
{
	while (len > 0 && in->st != S_STOPPED) {
		size_t n;

		if (in->skip > 0) {
			n = len < in->skip ? len : (size_t)in->skip;
			in->skip -= n;
			in->pos += n;
			len -= n;
			if (buf)
				buf += n;
			continue;
		}
		if (!buf) {
			stop(in, "bytes passed unseen at byte %llu", (unsigned long long)in->pos);
			break;
		}
		if (in->st == S_SCAN_START || in->st == S_SCAN_EOS) {
			in->pos++;
			len--;
			scan_byte(in, *buf++);
			continue;
		}
		n = in->need - in->have;
		if (n > len)
			n = len;
		memcpy(in->hb + in->have, buf, n);
		in->have += n;
		in->pos += n;
		buf += n;
		len -= n;
		if (in->have == in->need) {
			step(in);
			/* Every item a state gathers is at least a byte long, so this cannot spin.
			 */
			if (in->st != S_STOPPED && in->st != S_SCAN_START && in->st != S_SCAN_EOS &&
			    (in->need <= in->have || in->need > sizeof(in->hb)))
				stop(in, "inspector: internal state error at byte %llu",
				     (unsigned long long)in->pos);
		}
	}
	in->pos += len;
	publish(in);
}

uint64_t px_insp_plan(struct px_insp *in, size_t *want)
{
	size_t total;

	if (in->st == S_STOPPED)
		return UINT64_MAX;
	if (in->skip > 0)
		return in->skip;
	switch (in->st) {
	case S_DETECT:
	case S_MFD_INIT:
		*want = in->need - in->have;
		break;
	case S_MFD_HDR:
		/* Ask for the whole header at once: its size is that of the last one, or 320. */
		total = in->need;
		if (!(in->have >= MFD_HDR_MIN && (in->mfd_flags & MFD_F_DEVSTATE))) {
			size_t guess = in->mfd_pages_alloc
					       ? MFD_HDR_RAM + 8 * (size_t)in->mfd_pages_alloc
					       : MFD_HDR_RAM;

			if (total < guess)
				total = guess;
		}
		*want = total - in->have;
		break;
	default:
		*want = MAIN_WANT;
		break;
	}
	return 0;
}

void px_insp_read(const struct px_insp *in, struct px_insp_stats *out)
{
	uint32_t pub = atomic_load_explicit(&in->pub, memory_order_acquire);

	memset(out, 0, sizeof(*out));
	out->kind = (enum px_insp_kind)(pub & PUB_KIND_MASK);
	if (pub & PUB_BYTES_ONLY) {
		out->bytes_only = true;
		memcpy(out->reason, in->reason, sizeof(out->reason));
	}
	if (pub & PUB_MACHINE)
		memcpy(out->machine, in->machine, sizeof(out->machine));
	if (pub & PUB_SWITCHOVER) {
		out->switchover = true;
		out->switchover_ms = in->switchover_ms;
	}
	out->stream_version = atomic_load_explicit(&in->p_stream_version, memory_order_relaxed);
	out->channel_id = atomic_load_explicit(&in->p_channel_id, memory_order_relaxed);
	out->page_size = atomic_load_explicit(&in->p_page_size, memory_order_relaxed);
	out->ram_total = atomic_load_explicit(&in->p_ram_total, memory_order_relaxed);
	out->bytes = atomic_load_explicit(&in->p_bytes, memory_order_relaxed);
	out->pages = atomic_load_explicit(&in->p_pages, memory_order_relaxed);
	out->zero_pages = atomic_load_explicit(&in->p_zero_pages, memory_order_relaxed);
	out->packets = atomic_load_explicit(&in->p_packets, memory_order_relaxed);
	out->syncs = atomic_load_explicit(&in->p_syncs, memory_order_relaxed);
	out->sync_bytes_last = atomic_load_explicit(&in->p_sync_bytes_last, memory_order_relaxed);
	out->passes = atomic_load_explicit(&in->p_passes, memory_order_relaxed);
	out->pass_pages_last = atomic_load_explicit(&in->p_pass_pages_last, memory_order_relaxed);
	out->pass_ms_last = atomic_load_explicit(&in->p_pass_ms_last, memory_order_relaxed);
	out->pass_pages_cur = atomic_load_explicit(&in->p_pass_pages_cur, memory_order_relaxed);
}

const char *px_insp_kind_str(enum px_insp_kind k)
{
	switch (k) {
	case PX_INSP_DETECTING:
		return "detecting";
	case PX_INSP_MAIN:
		return "main";
	case PX_INSP_MULTIFD:
		return "multifd";
	case PX_INSP_OTHER:
		return "other";
	}
	return "unknown";
}

static uint64_t tap_plan(void *ctx, size_t *want)
{
	return px_insp_plan(ctx, want);
}

static void tap_feed(void *ctx, const uint8_t *buf, size_t len)
{
	px_insp_feed(ctx, buf, len);
}

const struct xp_tap_ops px_insp_tap_ops = {
	.plan = tap_plan,
	.feed = tap_feed,
};
