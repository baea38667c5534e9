// SPDX-License-Identifier: Apache-2.0
// vmig-guest: a freestanding multiboot test guest that dirties a working set at a configured rate
// (MiB/s, TSC-paced, PIT-calibrated) and reports on COM1, for migration convergence tests.
// Not an OS: no paging, no libc, no libgcc (so no 64-bit '/' or '%': see udiv64()).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long s64;

#define MIB		(1u << 20)
#define PAGE		4096u
#define PAGES_PER_MIB	(MIB / PAGE)
#define MB_BOOT_MAGIC	0x2BADB002u
#define MB_INFO_MEM	(1u << 0)
#define MB_INFO_CMDLINE	(1u << 2)
#define MB_INFO_MMAP	(1u << 6)
#define PIT_HZ		1193182u
#define CAL_MS		40u		// TSC calibration window (the PIT's 16 bits hold 54 ms)
#define CAL_TRIES	8u		// completed tries kept for agreement
#define CAL_STARTS	200u		// tries begun, stalled ones included, before giving up
#define TICK_HZ		1000u		// PIT channel 0 rate: wakes the `hlt` between slices
#define CATCHUP_MS	20u		// default catchup=: most backlog a paced guest makes up
#define RATE_MAX	(1u << 20)	// MiB/s; keeps rate * 256 pages in 32 bits
#define FLAT_BATCH	64u		// pages between clock reads when rate=0

struct mb_info {
	u32 flags, mem_lower, mem_upper, boot_device, cmdline, mods_count, mods_addr;
	u32 syms[4];
	u32 mmap_length, mmap_addr;
};

struct mb_mmap {
	u32 size;			// of the rest of the entry
	u32 base_lo, base_hi, len_lo, len_hi;
	u32 type;
} __attribute__((packed));

struct idt_entry {
	u16 off_lo, sel;
	u8 zero, type;
	u16 off_hi;
} __attribute__((packed));

struct idt_desc {
	u16 limit;
	u32 base;
} __attribute__((packed));

// boot.S and guest.ld
extern char _hot_start[], _end[];
extern const u32 exc_stub_table[32];
extern void wake_stub(void);
extern void guest_halt(void) __attribute__((noreturn));
void guest_main(u32 magic, const struct mb_info *mbi);
void guest_exception(u32 vector) __attribute__((noreturn));

// gcc may emit calls to these even with -ffreestanding.
void *memset(void *d, int c, u32 n);
void *memcpy(void *d, const void *s, u32 n);

void *memset(void *d, int c, u32 n)
{
	u8 *p = d;

	while (n--)
		*p++ = (u8)c;
	return d;
}

void *memcpy(void *d, const void *s, u32 n)
{
	u8 *p = d;
	const u8 *q = s;

	while (n--)
		*p++ = *q++;
	return d;
}

static inline void outb(u16 port, u8 v)
{
	__asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port));
}

static inline u8 inb(u16 port)
{
	u8 v;

	__asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}

// QEMU 7.2 TCG loses dirty tracking of pages that stay in the vCPU's TLB: a bitmap sync clears
// a page's dirty bit without marking the TLB entry "not dirty" again (fixed upstream in 9.0,
// "physmem: Fix migration dirty bitmap coherency with TCG memory access"), so later stores
// through that entry take the fast path and are never migrated. A sync runs on QEMU's migration
// thread at any moment, so the guest keeps three rules (invlpg works with paging off; the next
// store refills the entry, which sees the cleared bit and traps again):
// - every burst of writes starts by dropping the TLB entries of the pages it writes;
// - every port access (the serial line) is followed by the same: a sync most often lands while
//   the vCPU waits for QEMU's big lock there, and the stack stores after it would be lost;
// - every burst ends with a store of each hot page's own first byte back into it after its
//   entry is dropped (idle_until), so each page the burst wrote is dirty again after its last
//   store, whenever the sync fell. If the migration completes before the next burst, the page
//   still goes out with its final bytes. Without this, a sync during report()'s serial output
//   followed by QEMU's switchover lost 8 bytes of the stack page (seen 3 times in 17 runs).
// Outside bursts the guest writes no memory except the IRQ0 frame of each `hlt`, and that goes to
// a page of its own (.irqstack: `hlt` runs on that stack), always the same 12 bytes. On the main
// stack it would land where the bursts' calls left other bytes, after retouch_hot, so a sync
// before the tick and QEMU's switchover right after it lost those bytes (4 of the top stack page,
// once in a few dozen runs).
static inline void invlpg(u32 addr)
{
	__asm__ volatile("invlpg (%0)" : : "r"(addr) : "memory");
}

// tlbflush=0: none of the above, to show what QEMU 7.2 loses without it (tests/guest/README.md).
static u32 no_flush;

// .data, .bss and the stack: the guest's own hot pages.
static void flush_hot(void)
{
	u32 a;

	if (no_flush)
		return;
	for (a = (u32)_hot_start & ~(PAGE - 1); a < (u32)_end; a += PAGE)
		invlpg(a);
}

// Each hot page's first byte stored back into it after its TLB entry is dropped: the last store
// of a burst (see "QEMU 7.2 TCG" above). In asm, so that no spill of the compiler's follows it.
static inline void retouch_hot(void)
{
	if (no_flush)
		return;
	__asm__ volatile("	movl $_hot_start, %%ecx\n"
			 "1:	invlpg (%%ecx)\n\t"
			 "movb (%%ecx), %%al\n\t"
			 "movb %%al, (%%ecx)\n\t"
			 "addl $4096, %%ecx\n\t"
			 "cmpl $_end, %%ecx\n\t"
			 "jb 1b"
			 : : : "eax", "ecx", "cc", "memory");
}

static inline u64 rdtsc(void)
{
	u32 lo, hi;

	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return ((u64)hi << 32) | lo;
}

// n / d with a 32-bit divisor, in two divl steps (the first remainder < d, so no overflow).
static u64 udiv64(u64 n, u32 d, u32 *rem)
{
	u32 hi = (u32)(n >> 32), lo = (u32)n, qhi = hi / d, r = hi % d, qlo;

	__asm__("divl %4" : "=a"(qlo), "=d"(r) : "a"(lo), "d"(r), "rm"(d));
	if (rem)
		*rem = r;
	return ((u64)qhi << 32) | qlo;
}

// ---- COM1 -----------------------------------------------------------------------------------

#define COM1 0x3f8

static void serial_init(void)
{
	outb(COM1 + 1, 0x00);		// no interrupts
	outb(COM1 + 3, 0x80);		// DLAB
	outb(COM1 + 0, 0x01);		// 115200 baud
	outb(COM1 + 1, 0x00);
	outb(COM1 + 3, 0x03);		// 8N1
	outb(COM1 + 2, 0xC7);		// FIFO on, cleared
	outb(COM1 + 4, 0x03);		// DTR, RTS
}

static void putc(char c)
{
	u32 spins = 1u << 20;

	while (!(inb(COM1 + 5) & 0x20) && --spins)
		;
	outb(COM1, (u8)c);
	flush_hot();
}

static void puts(const char *s)
{
	while (*s) {
		if (*s == '\n')
			putc('\r');
		putc(*s++);
	}
}

static void put_u64(u64 v)
{
	char buf[24];
	int i = 0;
	u32 r;

	do {
		v = udiv64(v, 10, &r);
		buf[i++] = (char)('0' + r);
	} while (v);
	while (i)
		putc(buf[--i]);
}

static void put_u32(u32 v)
{
	put_u64(v);
}

// v / 10 with one decimal: 481 -> "48.1".
static void put_tenths(u64 v)
{
	u32 r;

	put_u64(udiv64(v, 10, &r));
	putc('.');
	putc((char)('0' + r));
}

// Ends an error line ("vmig-guest: error: ..." begun by the caller) and stops the CPU.
static void __attribute__((noreturn)) die(const char *tail)
{
	puts(tail);
	puts(", halted\n");
	guest_halt();
}

static void __attribute__((noreturn)) fail(const char *what)
{
	puts("vmig-guest: error: ");
	die(what);
}

void guest_exception(u32 vector)
{
	puts("vmig-guest: error: CPU exception ");
	put_u32(vector);
	puts(", halted\n");
	guest_halt();
}

// ---- parameters -----------------------------------------------------------------------------

struct params {
	u32 ws_mib, rate_mib_s, start_mib, report_ms, catchup_ms;
	u32 populate_mib, repeat, burst_on_ms, burst_off_ms, noise_pct;
	int has_start, spin, fill, no_flush;
};

static int streq_n(const char *a, const char *b, u32 n)
{
	while (n--) {
		if (*a != *b)
			return 0;
		if (!*a)
			return 1;
		a++;
		b++;
	}
	return *b == 0;
}

static int parse_u32(const char *s, u32 n, u32 *out)
{
	u32 v = 0;

	if (n == 0 || n > 9)
		return -1;
	while (n--) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (u32)(*s++ - '0');
	}
	*out = v;
	return 0;
}

// "ws=64 rate=48 [start=8] [report=1000] [wait=hlt|spin] [catchup=20] [fill=0|1]
// [populate=MIB] [repeat=N] [burst=ON/OFF] [tlbflush=0|1] [noise=PCT]". A first word without
// '=' (QEMU puts the kernel's path there) is skipped; anything else unknown is an error.
static void parse_cmdline(const char *s, struct params *p)
{
	int first = 1, have_ws = 0, have_rate = 0;

	while (*s) {
		const char *word, *eq = 0;
		u32 klen, vlen;

		while (*s == ' ' || *s == '\t')
			s++;
		if (!*s)
			break;
		word = s;
		while (*s && *s != ' ' && *s != '\t') {
			if (*s == '=' && !eq)
				eq = s;
			s++;
		}
		if (!eq) {
			if (first) {
				first = 0;
				continue;
			}
			fail("bad -append word (expected key=value)");
		}
		first = 0;
		klen = (u32)(eq - word);
		vlen = (u32)(s - eq - 1);
		if (streq_n(word, "ws", klen)) {
			if (parse_u32(eq + 1, vlen, &p->ws_mib) < 0)
				fail("ws= wants a number of MiB");
			have_ws = 1;
		} else if (streq_n(word, "rate", klen)) {
			if (parse_u32(eq + 1, vlen, &p->rate_mib_s) < 0)
				fail("rate= wants MiB/s (0: as fast as it can)");
			have_rate = 1;
		} else if (streq_n(word, "start", klen)) {
			if (parse_u32(eq + 1, vlen, &p->start_mib) < 0)
				fail("start= wants a MiB offset");
			p->has_start = 1;
		} else if (streq_n(word, "report", klen)) {
			if (parse_u32(eq + 1, vlen, &p->report_ms) < 0)
				fail("report= wants milliseconds (0: no reports)");
		} else if (streq_n(word, "catchup", klen)) {
			if (parse_u32(eq + 1, vlen, &p->catchup_ms) < 0 || p->catchup_ms > 1000)
				fail("catchup= wants milliseconds from 0 to 1000");
		} else if (streq_n(word, "fill", klen)) {
			if (streq_n(eq + 1, "1", vlen))
				p->fill = 1;
			else if (streq_n(eq + 1, "0", vlen))
				p->fill = 0;
			else
				fail("fill= wants 0 or 1");
		} else if (streq_n(word, "tlbflush", klen)) {
			if (streq_n(eq + 1, "1", vlen))
				p->no_flush = 0;
			else if (streq_n(eq + 1, "0", vlen))
				p->no_flush = 1;
			else
				fail("tlbflush= wants 0 or 1");
		} else if (streq_n(word, "populate", klen)) {
			if (parse_u32(eq + 1, vlen, &p->populate_mib) < 0)
				fail("populate= wants a number of MiB");
		} else if (streq_n(word, "repeat", klen)) {
			if (parse_u32(eq + 1, vlen, &p->repeat) < 0 || !p->repeat ||
			    p->repeat > 1000)
				fail("repeat= wants writes per page from 1 to 1000");
		} else if (streq_n(word, "burst", klen)) {
			const char *v = eq + 1, *slash = v;

			while (slash < s && *slash != '/')
				slash++;
			if (slash == s || parse_u32(v, (u32)(slash - v), &p->burst_on_ms) < 0 ||
			    parse_u32(slash + 1, (u32)(s - slash - 1), &p->burst_off_ms) < 0 ||
			    !p->burst_on_ms || p->burst_on_ms + p->burst_off_ms > 3600000)
				fail("burst= wants ON/OFF milliseconds, such as 2000/4000");
		} else if (streq_n(word, "noise", klen)) {
			if (parse_u32(eq + 1, vlen, &p->noise_pct) < 0 || p->noise_pct > 100)
				fail("noise= wants a share of the page in % from 0 to 100");
		} else if (streq_n(word, "wait", klen)) {
			if (streq_n(eq + 1, "spin", vlen))
				p->spin = 1;
			else if (streq_n(eq + 1, "hlt", vlen))
				p->spin = 0;
			else
				fail("wait= wants hlt or spin");
		} else {
			fail("unknown -append key (known: ws rate start report wait catchup fill "
			     "populate repeat burst tlbflush noise)");
		}
	}
	if (!have_ws || !have_rate)
		fail("-append needs ws=MIB and rate=MIB_PER_S");
	if (p->ws_mib == 0)
		fail("ws=0: the working set is empty");
	if (p->rate_mib_s > RATE_MAX)
		fail("rate= too high (at most 1048576 MiB/s; 0 means flat out)");
	if (p->populate_mib && p->populate_mib < p->ws_mib)
		fail("populate= is smaller than the working set");
	if (p->burst_on_ms && !p->rate_mib_s)
		fail("burst= needs a paced rate (rate= above 0)");
}

// ---- timers ---------------------------------------------------------------------------------

// PIT channel 2's count latched between two TSC reads: the TSC at the latch is known to within
// `spread` ticks, however long the vCPU thread was descheduled around it.
struct pit_stamp {
	u64 tsc;
	u32 spread;
	u32 count;
};

static void pit_stamp(struct pit_stamp *s)
{
	u64 a = rdtsc(), b;
	u32 lo, hi;

	outb(0x43, 0x80);				// latch channel 2
	b = rdtsc();
	lo = inb(0x42);
	hi = inb(0x42);
	s->tsc = a + ((b - a) >> 1);
	s->spread = b - a > 0xFFFFFFFFull ? 0xFFFFFFFFu : (u32)(b - a);
	s->count = lo | hi << 8;
}

// TSC ticks per millisecond. Channel 2 (gate via port 0x61) counts down from 0xFFFF in mode 0
// and wraps every 55 ms; two latched reads CAL_MS apart give PIT ticks against TSC ticks. A
// loaded host's vCPU thread can lose tens of milliseconds anywhere, so a try starts again when
// the first read came too late to leave CAL_MS before the wrap, when the count went up (a wrap),
// or when one gap between reads was a quarter of the try or more (time enough to hide a wrap).
// A stall inside a read shows as its spread. The answer is the tighter of the first two tries
// that agree within 0.1 %: one try alone can be wrong in a way no single check sees.
static u32 calibrate_tsc(void)
{
	const u32 window = PIT_HZ / 1000 * CAL_MS;
	struct pit_stamp s1, s2, prev;
	u32 spins, i, cur, n = 0, starts = 0, rate[CAL_TRIES], spread[CAL_TRIES];
	u64 tsc, gap;

	while (++starts <= CAL_STARTS) {
		outb(0x61, (u8)((inb(0x61) & ~0x02) | 0x01));	// gate high, speaker off
		outb(0x43, 0xB0);				// channel 2, lo/hi byte, mode 0
		outb(0x42, 0xFF);
		outb(0x42, 0xFF);
		spins = 0;
		do {
			pit_stamp(&s1);
			if (++spins > 10000000u)
				fail("PIT channel 2 does not count");
		} while (s1.count > 0xFF00);
		// stalled past the room the window needs before the wrap
		if (s1.count < window + 0x100)
			continue;
		prev = s1;
		gap = 0;
		for (;;) {
			pit_stamp(&s2);
			if (s2.tsc - prev.tsc > gap)
				gap = s2.tsc - prev.tsc;
			if (s2.count > prev.count || s1.count - s2.count >= window)
				break;
			if (++spins > 20000000u)
				fail("PIT channel 2 does not count");
			prev = s2;
		}
		tsc = s2.tsc - s1.tsc;
		// wrapped, or may have
		if (s2.count > prev.count || gap * 4 >= tsc)
			continue;
		if (tsc < (u64)CAL_MS * 1000)
			fail("TSC runs slower than 1 MHz");
		cur = n % CAL_TRIES; // the oldest kept try makes room
		rate[cur] = (u32)udiv64(tsc * PIT_HZ, (s1.count - s2.count) * 1000, 0);
		spread[cur] = s1.spread + s2.spread;
		for (i = 0; i < n && i < CAL_TRIES; i++) {
			u32 a = rate[i], b = rate[cur], d = a > b ? a - b : b - a;

			if (i != cur && (u64)d * 1000 <= b)
				return spread[i] < spread[cur] ? a : b;
		}
		n++;
	}
	fail("PIT calibration: host stalls left no two tries that agree within 0.1 %");
}

static struct idt_entry idt[256];

static void idt_set(u32 vec, u32 handler)
{
	idt[vec].off_lo = (u16)handler;
	idt[vec].sel = 0x08;
	idt[vec].zero = 0;
	idt[vec].type = 0x8E;				// present, ring 0, 32-bit interrupt gate
	idt[vec].off_hi = (u16)(handler >> 16);
}

// IDT, the 8259s remapped to 0x20-0x2f with only IRQ0 open, PIT channel 0 at TICK_HZ.
static void interrupts_init(void)
{
	struct idt_desc d = { sizeof(idt) - 1, (u32)idt };
	u32 i, div = PIT_HZ / TICK_HZ;

	for (i = 0; i < 256; i++)
		idt_set(i, i < 32 ? exc_stub_table[i] : (u32)wake_stub);
	__asm__ volatile("lidt %0" : : "m"(d));
	outb(0x20, 0x11);
	outb(0xA0, 0x11);
	outb(0x21, 0x20);
	outb(0xA1, 0x28);
	outb(0x21, 0x04);
	outb(0xA1, 0x02);
	outb(0x21, 0x03);				// 8086 mode, auto-EOI: the stub writes nothing
	outb(0xA1, 0x01);
	outb(0x21, 0xFE);
	outb(0xA1, 0xFF);
	outb(0x43, 0x34);				// channel 0, lo/hi byte, mode 2
	outb(0x40, (u8)div);
	outb(0x40, (u8)(div >> 8));
}

// ---- the working set ------------------------------------------------------------------------

static struct {
	u32 start, end, cur;	// addresses
	u32 pass;		// full walks completed
	u64 pages;		// page writes since ready
	u32 repeat, again;	// writes per page before the next (repeat=), done on this one
	u32 noise_words;	// noise=: words after the counter rewritten with each write
	u32 rng;		// their xorshift32 state
} ws;

// noise=: the words [1, 1 + ws.noise_words) of the page at cur, fresh xorshift32 output (state
// in a register, stored back once). The rest of the page keeps what it had, so the page
// compresses about 100 / noise times.
static void scribble(u32 cur)
{
	u32 *w = (u32 *)cur + 1, *end = w + ws.noise_words, x = ws.rng;

	while (w < end) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		*(volatile u32 *)w++ = x;
	}
	ws.rng = x;
}

// Each write bumps a counter in the first word of the page: QEMU sees the page dirty, and the
// page's content says how often it was written (deterministic, so the source and destination
// RAM compare equal after a migration). The caller has run flush_hot(); each page's own TLB
// entry is dropped before its store. With noise= the page's noise words go first, then its entry
// is dropped again and the counter is the page's last store: a bitmap sync among the noise
// stores (QEMU 7.2 TCG would lose those after it) leaves the page dirty again by the counter's.
static void dirty(u32 n)
{
	u32 cur = ws.cur;

	ws.pages += n;
	while (n--) {
		if (!no_flush)
			invlpg(cur);
		if (ws.noise_words) {
			scribble(cur);
			if (!no_flush)
				invlpg(cur);
		}
		++*(volatile u32 *)cur;
		if (++ws.again < ws.repeat)
			continue;
		ws.again = 0;
		cur += PAGE;
		if (cur == ws.end) {
			cur = ws.start;
			ws.pass++;
		}
	}
	ws.cur = cur;
}

static struct {
	u32 tsc_ms, period_ms;
	u64 t0, last, next;
	u64 last_pages;
	u64 lost;		// TSC ticks of pacing backlog dropped (stalls beyond CATCHUP_MS)
} rep;

static void report(u64 now)
{
	u64 dt_ms, pages;

	if (!rep.period_ms || (s64)(now - rep.next) < 0)
		return;
	dt_ms = udiv64(now - rep.last, rep.tsc_ms, 0);
	pages = ws.pages - rep.last_pages;
	puts("vmig-guest: t=");
	put_u64(udiv64(now - rep.t0, rep.tsc_ms, 0));
	puts("ms pass=");
	put_u32(ws.pass);
	puts(" pages=");
	put_u64(ws.pages);
	puts(" rate=");
	// MiB/s in tenths: pages * 10 * 1000 / 256 / dt_ms = pages * 625 / (16 * dt_ms)
	put_tenths(dt_ms ? udiv64(pages * 625, (u32)dt_ms * 16, 0) : 0);
	puts("MiB/s lost=");
	put_u64(udiv64(rep.lost, rep.tsc_ms, 0));
	puts("ms\n");
	rep.last = now;
	rep.last_pages = ws.pages;
	rep.next += (u64)rep.period_ms * rep.tsc_ms;
	if ((s64)(now - rep.next) > 0)			// fell a whole period behind: re-anchor
		rep.next = now + (u64)rep.period_ms * rep.tsc_ms;
}

static void __attribute__((noreturn)) run_flat_out(void)
{
	for (;;) {
		flush_hot();
		dirty(FLAT_BATCH);
		report(rdtsc());
		retouch_hot();
	}
}

// Returns once the TSC reaches deadline, halting until each PIT tick meanwhile (or spinning).
// All in registers: no store while it waits (see "QEMU 7.2 TCG" above). `hlt` runs on the stack
// of .irqstack, with fixed flags, so the interrupt frame is always the same bytes in a page
// nothing else writes.
static void idle_until(u64 deadline, int spin)
{
	u32 lo = (u32)deadline, hi = (u32)(deadline >> 32), sp;

	retouch_hot();
	if (spin)
		__asm__ volatile("1:	rdtsc\n\t"
				 "subl %0, %%eax\n\t"
				 "sbbl %1, %%edx\n\t"
				 "js 1b"
				 : : "r"(lo), "r"(hi) : "eax", "edx", "cc");
	else
		__asm__ volatile("1:	rdtsc\n\t"
				 "subl %1, %%eax\n\t"
				 "sbbl %2, %%edx\n\t"
				 "jns 2f\n\t"
				 "movl %%esp, %0\n\t"
				 "movl $irq_stack_top, %%esp\n\t"
				 "xorl %%eax, %%eax\n\t"
				 "sti\n\t"
				 "hlt\n\t"
				 "cli\n\t"
				 "movl %0, %%esp\n\t"
				 "jmp 1b\n"
				 "2:"
				 : "=&r"(sp) : "r"(lo), "r"(hi) : "eax", "edx", "cc", "memory");
}

// Slices of 1 ms: each adds rate*256 thousandths of a page of credit and writes the whole pages.
// Between slices the CPU halts until the next PIT tick (or spins on the TSC with wait=spin).
// Up to catchup_ms of missed slices are made up at once; a longer stall's excess is dropped. A
// small catchup makes the guest behave like a CPU-bound workload: time the vCPU does not run
// (QEMU's auto-converge throttle sleeps it) is writing it does not do.
//
// burst=ON/OFF: writes only in the first ON ms of every ON+OFF ms (TSC time since ready); the
// slices of the quiet part write nothing and are not made up.
static void __attribute__((noreturn)) run_paced(u32 rate_mib_s, int spin, u32 catchup_ms,
						u32 on_ms, u32 off_ms)
{
	u32 per_slice = rate_mib_s * PAGES_PER_MIB, credit = 0, n, phase;
	u64 next = rdtsc() + rep.tsc_ms, now;

	for (;;) {
		idle_until(next, spin);
		flush_hot();			// first, before this burst's stores
		now = rdtsc();
		if (now - next > (u64)catchup_ms * rep.tsc_ms) {
			rep.lost += now - next - (u64)catchup_ms * rep.tsc_ms;
			next = now - (u64)catchup_ms * rep.tsc_ms;
		}
		credit += per_slice;
		n = credit / 1000;
		credit -= n * 1000;
		if (on_ms) {
			udiv64(udiv64(now - rep.t0, rep.tsc_ms, 0), on_ms + off_ms, &phase);
			if (phase >= on_ms)
				n = 0;
		}
		dirty(n);
		next += rep.tsc_ms;
		report(now);
	}
}

// The end of everything the loader put at or above 1 MiB: this image, the info structure, the
// command line, the memory map.
static u32 loaded_end(const struct mb_info *mbi, const char *cmdline)
{
	u32 end = (u32)_end, e;

	if ((u32)mbi + sizeof(*mbi) > end)
		end = (u32)mbi + sizeof(*mbi);
	if (cmdline) {
		e = (u32)cmdline;
		while (*(const char *)e)
			e++;
		if (e + 1 > end)
			end = e + 1;
	}
	if ((mbi->flags & MB_INFO_MMAP) && mbi->mmap_addr + mbi->mmap_length > end)
		end = mbi->mmap_addr + mbi->mmap_length;
	return end;
}

// 1 if [start, end) lies inside one "available" region of the BIOS memory map (or there is no
// map to ask).
static int in_usable_ram(const struct mb_info *mbi, u32 start, u32 end)
{
	u32 off = 0;

	if (!(mbi->flags & MB_INFO_MMAP))
		return 1;
	while (off + sizeof(struct mb_mmap) <= mbi->mmap_length) {
		const struct mb_mmap *m = (const struct mb_mmap *)(mbi->mmap_addr + off);
		u64 base = ((u64)m->base_hi << 32) | m->base_lo;
		u64 len = ((u64)m->len_hi << 32) | m->len_lo;

		if (m->type == 1 && base <= start && base + len >= end)
			return 1;
		off += m->size + 4;
	}
	return 0;
}

void guest_main(u32 magic, const struct mb_info *mbi)
{
	struct params p = { .report_ms = 1000, .catchup_ms = CATCHUP_MS };
	const char *cmdline = 0;
	u32 mem_top, min_start, start, end;

	serial_init();
	if (magic != MB_BOOT_MAGIC)
		fail("not started by a multiboot loader");
	if (!(mbi->flags & MB_INFO_MEM))
		fail("the multiboot info has no mem_upper");
	if (mbi->flags & MB_INFO_CMDLINE)
		cmdline = (const char *)mbi->cmdline;
	parse_cmdline(cmdline ? cmdline : "", &p);
	no_flush = (u32)p.no_flush;

	mem_top = MIB + mbi->mem_upper * 1024u;
	min_start = (loaded_end(mbi, cmdline) + MIB - 1) & ~(MIB - 1);
	if (!p.has_start)
		p.start_mib = ((min_start + 4 * MIB - 1) & ~(4 * MIB - 1)) / MIB;
	if (p.start_mib > 4095 || p.ws_mib > 4095 || p.start_mib + p.ws_mib > 4095)
		fail("start + ws beyond 4 GiB");
	start = p.start_mib * MIB;
	end = start + p.ws_mib * MIB;
	if (start < min_start) {
		puts("vmig-guest: error: start=");
		put_u32(p.start_mib);
		puts("MiB overlaps the kernel image (lowest start ");
		put_u32(min_start / MIB);
		die("MiB)");
	}
	if (end > mem_top || end < start) {
		puts("vmig-guest: error: ws=");
		put_u32(p.ws_mib);
		puts("MiB at start=");
		put_u32(p.start_mib);
		puts("MiB ends at ");
		put_u32(end / MIB);
		puts("MiB, beyond the RAM (mem_upper=");
		put_u32(mbi->mem_upper);
		puts("KiB: RAM ends at ");
		put_u32(mem_top / 1024);
		die("KiB)");
	}
	if (!in_usable_ram(mbi, start, end))
		fail("the working set overlaps memory the BIOS map does not mark available");

	rep.tsc_ms = calibrate_tsc();
	rep.period_ms = p.report_ms;
	interrupts_init();
	ws.start = ws.cur = start;
	ws.end = end;
	ws.repeat = 1; // fill= writes each page once; repeat= applies from ready on
	ws.noise_words = p.noise_pct * (PAGE / 4) / 100;
	if (ws.noise_words > PAGE / 4 - 1)
		ws.noise_words = PAGE / 4 - 1;	// the first word is the counter
	ws.rng = 0x2545F491u;
	if (p.populate_mib) {
		// Every page of [start, start + populate) written once before ready: RAM that a
		// first pass must send, beyond the working set that keeps changing.
		u32 top = start + p.populate_mib * MIB;

		if (top > mem_top || top < start || !in_usable_ram(mbi, start, top))
			fail("populate= reaches beyond the usable RAM");
		for (u32 a = start; a < top; a += PAGE) {
			if ((a & (FLAT_BATCH * PAGE - 1)) == 0)
				flush_hot();
			invlpg(a);
			++*(volatile u32 *)a;
		}
	}
	if (p.fill) {
		// Each page written once, flat out, before ready: a populated working set, as a VM
		// that has been running has. The counters start after it.
		for (u32 left = (end - start) / PAGE, n; left; left -= n) {
			n = left < FLAT_BATCH ? left : FLAT_BATCH;
			flush_hot();
			dirty(n);
		}
		ws.pages = 0;
		ws.pass = 0;
		ws.cur = start;
	}
	ws.repeat = p.repeat ? p.repeat : 1;

	puts("vmig-guest: ws=");
	put_u32(p.ws_mib);
	puts("MiB rate=");
	if (p.rate_mib_s) {
		put_u32(p.rate_mib_s);
		puts("MiB/s");
	} else {
		puts("max");
	}
	puts(" tsc=");
	put_u32(rep.tsc_ms / 1000000);
	putc('.');
	putc((char)('0' + rep.tsc_ms / 100000 % 10));
	putc((char)('0' + rep.tsc_ms / 10000 % 10));
	putc((char)('0' + rep.tsc_ms / 1000 % 10));
	puts("GHz start=");
	put_u32(p.start_mib);
	puts("MiB mem=");
	put_u32(mem_top / MIB);
	puts("MiB report=");
	put_u32(p.report_ms);
	puts(p.spin || !p.rate_mib_s ? "ms wait=spin" : "ms wait=hlt");
	if (p.noise_pct) {
		puts(" noise=");
		put_u32(p.noise_pct);
		putc('%');
	}
	puts(" ready\n");

	rep.t0 = rep.last = rdtsc();
	rep.next = rep.t0 + (u64)rep.period_ms * rep.tsc_ms;
	if (p.rate_mib_s)
		run_paced(p.rate_mib_s, p.spin, p.catchup_ms, p.burst_on_ms, p.burst_off_ms);
	run_flat_out();
}
