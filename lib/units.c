// SPDX-License-Identifier: Apache-2.0
/* Parsing and printing of rates and sizes; see units.h for the meaning of each unit. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "units.h"

struct unit {
	const char *name;
	double factor; /* bytes/s per unit */
};

/* Longest names first within each family does not matter: names are matched whole. */
static const struct unit units[] = {
	{ "", 1 },
	{ "B", 1 },
	{ "K", 1e3 },
	{ "KB", 1e3 },
	{ "M", 1e6 },
	{ "MB", 1e6 },
	{ "G", 1e9 },
	{ "GB", 1e9 },
	{ "T", 1e12 },
	{ "TB", 1e12 },
	{ "Ki", 1024.0 },
	{ "KiB", 1024.0 },
	{ "Mi", 1048576.0 },
	{ "MiB", 1048576.0 },
	{ "Gi", 1073741824.0 },
	{ "GiB", 1073741824.0 },
	{ "Ti", 1099511627776.0 },
	{ "TiB", 1099511627776.0 },
	{ "bit", 1 / 8.0 },
	{ "Kbit", 1e3 / 8 },
	{ "Mbit", 1e6 / 8 },
	{ "Gbit", 1e9 / 8 },
	{ "Tbit", 1e12 / 8 },
	{ "Kibit", 1024.0 / 8 },
	{ "Mibit", 1048576.0 / 8 },
	{ "Gibit", 1073741824.0 / 8 },
	{ "bps", 1 / 8.0 },
	{ "Kbps", 1e3 / 8 },
	{ "Mbps", 1e6 / 8 },
	{ "Gbps", 1e9 / 8 },
};

int vm_parse_rate(const char *s, uint64_t *out)
{
	char unit[8];
	const char *u;
	char *end;
	double v;
	size_t ul;

	if (!s || !*s)
		return -EINVAL;
	if (!strcasecmp(s, "none") || !strcasecmp(s, "unlimited")) {
		*out = 0;
		return 0;
	}
	/* Plain decimals only: strtod would also take hex, exponents and "inf". */
	if (strspn(s, "0123456789") == 0 && !(s[0] == '.' && s[1] >= '0' && s[1] <= '9'))
		return -EINVAL;
	for (const char *q = s; *q && (*q == '.' || (*q >= '0' && *q <= '9')); q++)
		if ((q[0] == '0' && (q[1] == 'x' || q[1] == 'X')) || q[1] == 'e' || q[1] == 'E')
			return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || !isfinite(v) || v < 0)
		return -EINVAL;
	u = end;
	ul = strlen(u);
	/* "/s" after the unit is allowed: "64MiB/s", "1Gbit/s". */
	if (ul >= 2 && !strcmp(u + ul - 2, "/s"))
		ul -= 2;
	if (ul >= sizeof(unit))
		return -EINVAL;
	memcpy(unit, u, ul);
	unit[ul] = '\0';
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		double b;

		if (strcmp(unit, units[i].name))
			continue;
		b = v * units[i].factor;
		if (b > (double)VM_RATE_MAX)
			return -EINVAL;
		/* A fraction of a byte per second rounds up: a cap is never 0 by accident. */
		*out = (uint64_t)ceil(b);
		return 0;
	}
	return -EINVAL;
}

static char *format(double v, const char *const *names, size_t n, const char *suffix, char *buf,
		    size_t len)
{
	size_t i = 0;

	while (i + 1 < n && v >= 1024)
		v /= 1024, i++;
	snprintf(buf, len, i ? "%.1f %s%s" : "%.0f %s%s", v, names[i], suffix);
	return buf;
}

char *vm_format_rate(uint64_t bps, char *buf, size_t len)
{
	static const char *const names[] = { "B", "KiB", "MiB", "GiB", "TiB" };

	if (bps == 0) {
		snprintf(buf, len, "unlimited");
		return buf;
	}
	return format((double)bps, names, 5, "/s", buf, len);
}

char *vm_format_bytes(uint64_t bytes, char *buf, size_t len)
{
	static const char *const names[] = { "B", "KiB", "MiB", "GiB", "TiB" };

	return format((double)bytes, names, 5, "", buf, len);
}
