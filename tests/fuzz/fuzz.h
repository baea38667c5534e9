/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by the libFuzzer targets and the replay driver: the entry point's prototype and an
 * invariant check that aborts (a crash libFuzzer and meson both see), naming the broken rule. */
#ifndef VM_FUZZ_H
#define VM_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__,       \
				#cond);                                                            \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/*
 * VMIG_FUZZ_SKIP="oneline,nul,portid" turns named checks off, so that a fuzzing run can look past
 * a known, reported bug instead of finding it again and again. Replays run every check.
 */
static inline int fuzz_skip(const char *check)
{
	const char *s = getenv("VMIG_FUZZ_SKIP");
	size_t n = strlen(check);

	while (s && *s) {
		if (strncmp(s, check, n) == 0 && (s[n] == ',' || s[n] == '\0'))
			return 1;
		s = strchr(s, ',');
		if (s)
			s++;
	}
	return 0;
}

#endif
