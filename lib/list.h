/* SPDX-License-Identifier: Apache-2.0 */
/* A tiny intrusive doubly linked list, the kernel's shape: a struct vm_list in each element and
 * one as the head, circular, so adding and removing never branch on an end. No allocation. */
#ifndef VM_LIST_H
#define VM_LIST_H

#include <stdbool.h>

#include "util.h"

struct vm_list {
	struct vm_list *prev, *next;
};

/* An empty head, or an element in no list (vm_list_del() on it does nothing). */
static inline void vm_list_init(struct vm_list *l)
{
	l->prev = l->next = l;
}

static inline bool vm_list_empty(const struct vm_list *head)
{
	return head->next == head;
}

/* Adds e at the front of head. */
static inline void vm_list_add(struct vm_list *head, struct vm_list *e)
{
	e->prev = head;
	e->next = head->next;
	head->next->prev = e;
	head->next = e;
}

/* Takes e out of its list; e is then in none. */
static inline void vm_list_del(struct vm_list *e)
{
	e->prev->next = e->next;
	e->next->prev = e->prev;
	vm_list_init(e);
}

#define vm_list_entry(ptr, type, member)	container_of(ptr, type, member)
#define vm_list_first_entry(head, type, member) vm_list_entry((head)->next, type, member)

/* Each element pos of head, front to back; pos must stay in the list until the next step. */
#define vm_list_for_each_entry(pos, head, member)                                                  \
	for (pos = vm_list_entry((head)->next, __typeof__(*pos), member); &pos->member != (head);  \
	     pos = vm_list_entry(pos->member.next, __typeof__(*pos), member))

/* The same with pos declared by the loop, of type T (const or not): a for statement's own. */
#define vm_list_each(T, pos, head, member)                                                         \
	for (T *pos = vm_list_entry((head)->next, T, member); &pos->member != (head);              \
	     pos = vm_list_entry(pos->member.next, T, member))

/* The same where the body may take pos out of the list (or free it), but no other element. */
#define vm_list_for_each_entry_safe(pos, n, head, member)                                          \
	for (pos = vm_list_entry((head)->next, __typeof__(*pos), member),                          \
	    n = vm_list_entry(pos->member.next, __typeof__(*pos), member);                         \
	     &pos->member != (head);                                                               \
	     pos = n, n = vm_list_entry(n->member.next, __typeof__(*n), member))

#endif
