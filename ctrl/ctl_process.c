// SPDX-License-Identifier: Apache-2.0
/* The process's CPU time, memory, start time and file descriptors from /proc/self and
 * getrlimit(), as Prometheus client libraries export them; and the build's features. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ctl_process.h"
#include "cv_backend.h"
#include "vmigd-config.h"
#include "xp_dpdk.h"

const char *ctl_build_features(void)
{
	static char buf[64];

	if (!buf[0])
		snprintf(buf, sizeof(buf), "tls%s%s,inspect", xp_dpdk_built() ? ",dpdk" : "",
			 cv_virt_available() ? ",libvirt" : "");
	return buf;
}

/* The boot time, Unix seconds, from /proc/stat's btime; 0 if not found. */
static unsigned long long boot_time(void)
{
	FILE *f = fopen("/proc/stat", "re");
	unsigned long long bt = 0;
	char line[256];

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "btime %llu", &bt) == 1)
			break;
	fclose(f);
	return bt;
}

/* /proc/self/stat: utime, stime (14, 15), starttime (22), vsize (23), rss (24, pages). */
static void read_stat(struct ctl_process *p)
{
	unsigned long long utime, stime, start, vsize;
	long long rss;
	long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
	char buf[1024], *at;
	FILE *f = fopen("/proc/self/stat", "re");
	size_t n;

	if (!f)
		return;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* The name, field 2, may hold spaces and parentheses: fields 3 on follow its last ')'. */
	at = strrchr(buf, ')');
	if (!at || tck <= 0 || page <= 0 ||
	    sscanf(at + 2,
		   "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d "
		   "%llu %llu %lld",
		   &utime, &stime, &start, &vsize, &rss) != 5)
		return;
	p->cpu_ms = (utime + stime) * 1000 / (unsigned long long)tck;
	p->start_ms = boot_time() * 1000 + start * 1000 / (unsigned long long)tck;
	p->vsize = vsize;
	p->rss = rss > 0 ? (uint64_t)rss * (uint64_t)page : 0;
}

static uint64_t open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	uint64_t n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n ? n - 1 : 0; /* not the directory's own fd */
}

void ctl_process_read(struct ctl_process *p)
{
	struct rlimit rl;

	memset(p, 0, sizeof(*p));
	p->version = VMIGD_VERSION;
	p->features = ctl_build_features();
	read_stat(p);
	p->open_fds = open_fds();
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		p->max_fds = rl.rlim_cur == RLIM_INFINITY ? 0 : rl.rlim_cur;
}
