/* SPDX-License-Identifier: Apache-2.0 */
/* A running digest of one direction's bytes (XXH3-64), for proving that what left QEMU on one
 * node is what reached QEMU on the other. Not a MAC: TLS or the seal authenticates the bytes. */
#ifndef VM_DIGEST_H
#define VM_DIGEST_H

#include <stddef.h>
#include <stdint.h>

struct vm_digest;

/* NULL when out of memory. */
struct vm_digest *vm_digest_new(void);
/* Takes NULL. */
void vm_digest_free(struct vm_digest *d);
void vm_digest_reset(struct vm_digest *d);
void vm_digest_update(struct vm_digest *d, const void *buf, size_t len);
/* The digest of everything fed since the reset; the stream may go on. */
uint64_t vm_digest_value(const struct vm_digest *d);
uint64_t vm_digest_bytes(const struct vm_digest *d);

/*
 * A running digest's whole state as bytes, for another process (a takeover moves a connection
 * with its digests): save writes at most VM_DIGEST_STATE_MAX bytes and returns how many (or
 * -ENOSPC); load takes them back into d, or -EPROTO where they come from another libxxhash or
 * layout (d is then unchanged).
 */
#define VM_DIGEST_STATE_MAX 1024
int vm_digest_save(const struct vm_digest *d, uint8_t *buf, size_t len);
int vm_digest_load(struct vm_digest *d, const uint8_t *buf, size_t len);

/* One buffer at once, the same value as a reset, one update and vm_digest_value(). */
uint64_t vm_digest_of(const void *buf, size_t len);

#endif
