// SPDX-License-Identifier: Apache-2.0
/* vm_digest: XXH3-64 (libxxhash) over a stream, and its byte count. */
#include <stdlib.h>

/* the state's layout, so that it lives inside struct vm_digest */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
/* XXH3 through libxxhash's run-time dispatch: AVX2 (2.5x SSE2 here) where the CPU has it. */
#include <xxh_x86dispatch.h>
#endif

#include "digest.h"

struct vm_digest {
	XXH3_state_t st;
	uint64_t bytes;
};

struct vm_digest *vm_digest_new(void)
{
	/* XXH3_state_t wants 64-byte alignment. */
	struct vm_digest *d = aligned_alloc(64, (sizeof(*d) + 63) & ~(size_t)63);

	if (d)
		vm_digest_reset(d);
	return d;
}

void vm_digest_free(struct vm_digest *d)
{
	free(d);
}

void vm_digest_reset(struct vm_digest *d)
{
	XXH3_64bits_reset(&d->st);
	d->bytes = 0;
}

void vm_digest_update(struct vm_digest *d, const void *buf, size_t len)
{
	XXH3_64bits_update(&d->st, buf, len);
	d->bytes += len;
}

uint64_t vm_digest_value(const struct vm_digest *d)
{
	return XXH3_64bits_digest(&d->st);
}

uint64_t vm_digest_bytes(const struct vm_digest *d)
{
	return d->bytes;
}

uint64_t vm_digest_of(const void *buf, size_t len)
{
	return XXH3_64bits(buf, len);
}
