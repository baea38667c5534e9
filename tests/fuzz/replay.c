// SPDX-License-Identifier: Apache-2.0
/* A main() for a libFuzzer target without libFuzzer: feeds every file named on the command line
 * (directories: every regular file in them, in name order) to LLVMFuzzerTestOneInput once. This
 * is how meson replays the seed corpora with any compiler; it does not fuzz. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL, *exact;
	size_t len = 0, cap = 0;

	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	for (;;) {
		size_t k;

		if (len == cap) {
			uint8_t *nbuf = realloc(buf, cap ? cap * 2 : 4096);

			if (!nbuf) {
				fprintf(stderr, "replay: %s: out of memory\n", path);
				free(buf);
				fclose(f);
				return -1;
			}
			buf = nbuf;
			cap = cap ? cap * 2 : 4096;
		}
		k = fread(buf + len, 1, cap - len, f);
		len += k;
		if (k == 0)
			break;
	}
	if (ferror(f)) {
		fprintf(stderr, "replay: %s: read error\n", path);
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	/* An exact-size copy, so that a sanitizer build sees any read past the input. */
	exact = malloc(len ? len : 1);
	if (!exact) {
		free(buf);
		return -1;
	}
	memcpy(exact, buf, len);
	free(buf);
	fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
	LLVMFuzzerTestOneInput(exact, len);
	free(exact);
	return 0;
}

static int replay_dir(const char *dir, unsigned int *count)
{
	struct dirent **names;
	int n = scandir(dir, &names, NULL, alphasort), r = 0;

	if (n < 0) {
		fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
		return -1;
	}
	for (int i = 0; i < n; i++) {
		char path[4096];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
		if (names[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			if (replay_file(path) < 0)
				r = -1;
			else
				(*count)++;
		}
		free(names[i]);
	}
	free(names);
	return r;
}

int main(int argc, char **argv)
{
	unsigned int count = 0;
	int r = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		struct stat st;

		if (stat(argv[i], &st) < 0) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			r = -1;
		} else if (S_ISDIR(st.st_mode)) {
			if (replay_dir(argv[i], &count) < 0)
				r = -1;
		} else if (replay_file(argv[i]) < 0) {
			r = -1;
		} else {
			count++;
		}
	}
	/* An empty corpus would make the test pass without testing anything. */
	if (count == 0) {
		fprintf(stderr, "replay: no inputs found\n");
		return 1;
	}
	fprintf(stderr, "replay: %u inputs, no crash\n", count);
	return r < 0 ? 1 : 0;
}
