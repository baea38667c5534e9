// SPDX-License-Identifier: Apache-2.0
/* vm_digest: XXH3-64 (libxxhash) over a stream, and its byte count. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

/* The saved form: libxxhash's version, the state's size, the byte count, the state. */
struct saved_head {
	uint32_t version, size;
	uint64_t bytes;
};

/* The default secret's address in this process, as a reset state holds it. */
static const unsigned char *default_secret(void)
{
	XXH3_state_t fresh;

	XXH3_64bits_reset(&fresh);
	return fresh.extSecret;
}

int vm_digest_save(const struct vm_digest *d, uint8_t *buf, size_t len)
{
	struct saved_head h = { XXH_versionNumber(), sizeof(d->st), d->bytes };

	_Static_assert(sizeof(h) + sizeof(d->st) <= VM_DIGEST_STATE_MAX, "VM_DIGEST_STATE_MAX");
	if (len < sizeof(h) + sizeof(d->st))
		return -ENOSPC;
	/* a pointer into this process's libxxhash: only the default secret is ever used here */
	if (d->st.extSecret != default_secret())
		return -ENOTSUP;
	memcpy(buf, &h, sizeof(h));
	memcpy(buf + sizeof(h), &d->st, sizeof(d->st));
	return (int)(sizeof(h) + sizeof(d->st));
}

int vm_digest_load(struct vm_digest *d, const uint8_t *buf, size_t len)
{
	struct saved_head h;
	XXH3_state_t st;

	if (len != sizeof(h) + sizeof(d->st))
		return -EPROTO;
	memcpy(&h, buf, sizeof(h));
	if (h.version != XXH_versionNumber() || h.size != sizeof(d->st))
		return -EPROTO;
	memcpy(&st, buf + sizeof(h), sizeof(st));
	/* the saved pointer was the other process's default secret: this process's instead */
	st.extSecret = default_secret();
	d->st = st;
	d->bytes = h.bytes;
	return 0;
}

uint64_t vm_digest_of(const void *buf, size_t len)
{
	return XXH3_64bits(buf, len);
}
