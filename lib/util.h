/* SPDX-License-Identifier: Apache-2.0 */
/* Tiny helpers shared by every layer: clocks, big-endian access, array sizes. */
#ifndef VM_UTIL_H
#define VM_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define ARRAY_SIZE(a)			(sizeof(a) / sizeof((a)[0]))
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline uint64_t vm_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline uint64_t vm_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static inline void vm_put_be16(uint8_t *p, uint16_t v)
{
	p[0] = v >> 8;
	p[1] = v;
}

static inline void vm_put_be32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

static inline uint16_t vm_get_be16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t vm_get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void vm_put_be64(uint8_t *p, uint64_t v)
{
	vm_put_be32(p, (uint32_t)(v >> 32));
	vm_put_be32(p + 4, (uint32_t)v);
}

static inline uint64_t vm_get_be64(const uint8_t *p)
{
	return (uint64_t)vm_get_be32(p) << 32 | vm_get_be32(p + 4);
}

#endif
