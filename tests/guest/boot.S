/* SPDX-License-Identifier: Apache-2.0 */
/* vmig-guest entry: the multiboot v1 header, a flat GDT of our own, the stack, and the interrupt
 * stubs (exceptions stop the guest; IRQ0, the 1 kHz PIT tick, only wakes `hlt`). Nothing else. */

#define MB_MAGIC	0x1BADB002
#define MB_FLAGS	0x00000003	/* bit 0: page-align modules; bit 1: want mem_lower/upper */

	.section .multiboot, "a"
	.align 4
	.long MB_MAGIC
	.long MB_FLAGS
	.long -(MB_MAGIC + MB_FLAGS)

	.section .text
	.globl _start
_start:
	/* The loader leaves a flat 4 GiB CS/DS but its GDT may live anywhere; an interrupt's iret
	 * reloads CS from the GDT, so install ours before enabling interrupts. */
	cli
	lgdt gdt_desc
	ljmp $0x08, $1f
1:	mov $0x10, %ecx
	mov %ecx, %ds
	mov %ecx, %es
	mov %ecx, %fs
	mov %ecx, %gs
	mov %ecx, %ss
	mov $stack_top, %esp
	push %ebx		/* multiboot info */
	push %eax		/* multiboot magic */
	call guest_main
	.globl guest_halt
guest_halt:
	cli
	hlt
	jmp guest_halt

/* Exceptions 0-31: push the vector and report it, then stop. */
	.macro exc_stub n
	.globl exc_stub_\n
exc_stub_\n:
	push $\n
	jmp exc_common
	.endm
	.altmacro
	.set i, 0
	.rept 32
	exc_stub %i
	.set i, i + 1
	.endr

exc_common:
	call guest_exception	/* never returns */
	jmp guest_halt

	/* IRQ0 (the PICs run in auto-EOI mode) and any other vector: return at once. It writes
	 * nothing but its own frame, always the same bytes (see guest.c, "QEMU 7.2 TCG"). */
	.globl wake_stub
wake_stub:
	iret

	.globl exc_stub_table
	.section .rodata
	.align 4
exc_stub_table:
	.macro exc_entry n
	.long exc_stub_\n
	.endm
	.set i, 0
	.rept 32
	exc_entry %i
	.set i, i + 1
	.endr

	.align 8
gdt:
	.quad 0
	.quad 0x00CF9A000000FFFF	/* 0x08: code, base 0, 4 GiB, 32-bit */
	.quad 0x00CF92000000FFFF	/* 0x10: data, base 0, 4 GiB */
gdt_desc:
	.word gdt_desc - gdt - 1
	.long gdt

	.section .bss
	.align 16
	.space 16384
stack_top:

	/* The stack `hlt` runs on, so that the IRQ0 frame lands in a page nothing else writes (see
	 * guest.c, "QEMU 7.2 TCG"): one whole page, all of it the guest's own. */
	.section .irqstack, "aw", @progbits
	.balign 4096
	.space 4096
	.globl irq_stack_top
irq_stack_top:

	.section .note.GNU-stack, "", @progbits
