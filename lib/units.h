/* SPDX-License-Identifier: Apache-2.0 */
/* Bandwidth figures as operators write them ("64Mi", "1Gbit", "500MB") and as we print them. One
 * meaning per unit, documented in vmigctl(8): K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti of 1024,
 * bytes unless the unit ends in "bit" or "bps". */
#ifndef VM_UNITS_H
#define VM_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* The largest rate accepted: 1 PB/s, far above any NIC, so that sums cannot overflow. */
#define VM_RATE_MAX 1000000000000000ull

/* Bytes per second into *out (0 for "0", "none", "unlimited"); 0 or -EINVAL. */
int vm_parse_rate(const char *s, uint64_t *out);
/* "52.4 MiB/s" (binary units), or "unlimited" for 0. Returns buf. */
char *vm_format_rate(uint64_t bytes_per_s, char *buf, size_t len);
/* "1.5 GiB" (binary units). Returns buf. */
char *vm_format_bytes(uint64_t bytes, char *buf, size_t len);

#endif
