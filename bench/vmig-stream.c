// SPDX-License-Identifier: Apache-2.0
// vmig-stream: bulk-data load generator for the bench harness (bench/vmig-bench stream): N parallel
// streams of random bytes from a sender to a sink, over unix or TCP. Not a test of correctness.

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#define VS_WRITE_SIZE (1u << 20)
#define VS_MAX_STREAMS 1024

struct vs_opts {
	bool send;
	const char *unix_path;
	const char *tcp; /* HOST:PORT to connect to (send) or listen on (sink) */
	uint64_t bytes;
	bool shared; /* send: bytes is the total, streams take 1 MiB at a time from it */
	unsigned int streams;
	unsigned int timeout_s;
	const char *progress;	  /* sink: file of "MONOTONIC_S BYTES" lines, or NULL */
	unsigned int progress_ms; /* ... one every this many ms */
};

struct vs_stream {
	pthread_t thread;
	int fd;
	const struct vs_opts *opts;
	const unsigned char *buf; /* shared, read-only: the sender's pre-filled random data */
	uint64_t bytes;		  /* written by its thread only; read by the progress thread */
	double t_end;
	int err; /* -errno */
};

/* Bytes the sink has read, all streams: sampled by the progress thread. */
static _Atomic uint64_t vs_sink_total;
static _Atomic int vs_sink_done;
/* send --shared: the bytes no stream has taken yet. */
static _Atomic uint64_t vs_pool;

/* Up to max bytes from the shared pool; 0 once it is empty. */
static uint64_t vs_claim(uint64_t max)
{
	uint64_t have = atomic_load(&vs_pool), take;

	do {
		take = have < max ? have : max;
		if (!take)
			return 0;
	} while (!atomic_compare_exchange_weak(&vs_pool, &have, have - take));
	return take;
}

static double vs_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void vs_usage(FILE *f)
{
	fprintf(f, "usage: vmig-stream send (--unix PATH | --tcp HOST:PORT) --bytes B\n"
		   "                         [--streams N] [--shared] [--timeout S]\n"
		   "       vmig-stream sink (--unix PATH | --tcp-listen HOST:PORT)\n"
		   "                         [--streams N] [--timeout S]\n"
		   "                         [--progress FILE [--progress-ms MS]]\n"
		   "B takes K, M, G, T suffixes (powers of 1024): per stream, or with --shared\n"
		   "the total, which the streams take 1 MiB at a time as each is ready for more\n"
		   "(so they end together). The sink binds PATH.tmp,\n"
		   "listens and renames it to PATH, so PATH appears only once it accepts.\n"
		   "Both print one JSON line: bytes, seconds, Gbit/s, own CPU seconds, per-stream\n"
		   "bytes and end times (CLOCK_MONOTONIC s).\n"
		   "--progress: the sink writes \"SECONDS BYTES\" lines to FILE every MS ms\n"
		   "(default 100) from its start to the last EOF: CLOCK_MONOTONIC seconds and the\n"
		   "bytes read so far over all streams.\n");
}

static int vs_parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;
	unsigned int shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'T':
	case 't':
		shift += 10;
		/* fall through */
	case 'G':
	case 'g':
		shift += 10;
		/* fall through */
	case 'M':
	case 'm':
		shift += 10;
		/* fall through */
	case 'K':
	case 'k':
		shift += 10;
		end++;
		if (*end == 'i' && end[1] == 'B')
			end += 2;
		else if (*end == 'B')
			end++;
		break;
	case '\0':
		break;
	default:
		return -EINVAL;
	}
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*ret = (uint64_t)v << shift;
	return 0;
}

static int vs_split_hostport(const char *s, char *host, size_t hostlen, const char **port)
{
	const char *colon = strrchr(s, ':');
	size_t n;

	if (!colon || !colon[1])
		return -EINVAL;
	n = colon - s;
	if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
		s++;
		n -= 2;
	}
	if (n >= hostlen)
		return -EINVAL;
	memcpy(host, s, n);
	host[n] = '\0';
	*port = colon + 1;
	return 0;
}

static int vs_unix_addr(const char *path, struct sockaddr_un *sun)
{
	memset(sun, 0, sizeof(*sun));
	sun->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sun->sun_path))
		return -ENAMETOOLONG;
	strcpy(sun->sun_path, path);
	return 0;
}

static int vs_connect(const struct vs_opts *o)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai, *p;
	struct sockaddr_un sun;
	char host[256];
	const char *port;
	int fd, r, one = 1;

	if (o->unix_path) {
		r = vs_unix_addr(o->unix_path, &sun);
		if (r < 0)
			return r;
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
			r = -errno;
			close(fd);
			return r;
		}
		return fd;
	}

	r = vs_split_hostport(o->tcp, host, sizeof(host), &port);
	if (r < 0)
		return r;
	if (getaddrinfo(host, port, &hints, &ai))
		return -EHOSTUNREACH;
	r = -ECONNREFUSED;
	for (p = ai; p; p = p->ai_next) {
		fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
		if (fd < 0) {
			r = -errno;
			continue;
		}
		if (connect(fd, p->ai_addr, p->ai_addrlen) == 0) {
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			r = fd;
			break;
		}
		r = -errno;
		close(fd);
	}
	freeaddrinfo(ai);
	return r;
}

static int vs_listen(const struct vs_opts *o, unsigned int backlog)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
	struct sockaddr_un sun;
	char host[256], tmp[PATH_MAX];
	const char *port;
	int fd, r, one = 1;

	if (o->unix_path) {
		/* Bind a temporary name, rename once listening: the path appearing means ready. */
		if (snprintf(tmp, sizeof(tmp), "%s.tmp", o->unix_path) >= (int)sizeof(tmp))
			return -ENAMETOOLONG;
		r = vs_unix_addr(tmp, &sun);
		if (r < 0)
			return r;
		unlink(tmp);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 || listen(fd, backlog) < 0 ||
		    rename(tmp, o->unix_path) < 0) {
			r = -errno;
			unlink(tmp);
			close(fd);
			return r;
		}
		return fd;
	}

	r = vs_split_hostport(o->tcp, host, sizeof(host), &port);
	if (r < 0)
		return r;
	if (getaddrinfo(host[0] ? host : NULL, port, &hints, &ai))
		return -EADDRNOTAVAIL;
	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
	if (fd < 0) {
		r = -errno;
		goto out_free;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, backlog) < 0) {
		r = -errno;
		close(fd);
		goto out_free;
	}
	r = fd;
out_free:
	freeaddrinfo(ai);
	return r;
}

static void *vs_send_thread(void *arg)
{
	struct vs_stream *s = arg;
	uint64_t left = s->opts->shared ? 0 : s->opts->bytes;
	size_t off = 0;
	char drain[4096];
	ssize_t n;

	for (;;) {
		size_t want;

		/* --shared: the next chunk from the pool, as QEMU hands pages to a free channel. */
		if (!left && (!s->opts->shared || !(left = vs_claim(VS_WRITE_SIZE))))
			break;
		want = VS_WRITE_SIZE - off;

		if (want > left)
			want = left;
		n = write(s->fd, s->buf + off, want);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			s->err = -errno;
			goto out;
		}
		s->bytes += n;
		left -= n;
		off = (off + n) % VS_WRITE_SIZE;
	}
	/* Half-close, then wait for the far end's EOF: that is when every byte has arrived. */
	if (shutdown(s->fd, SHUT_WR) < 0) {
		s->err = -errno;
		goto out;
	}
	for (;;) {
		n = read(s->fd, drain, sizeof(drain));
		if (n == 0)
			break;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			s->err = -errno;
			break;
		}
	}
out:
	s->t_end = vs_now();
	return NULL;
}

static void *vs_sink_thread(void *arg)
{
	struct vs_stream *s = arg;
	unsigned char *buf;
	ssize_t n;

	buf = malloc(VS_WRITE_SIZE);
	if (!buf) {
		s->err = -ENOMEM;
		goto out;
	}
	for (;;) {
		n = read(s->fd, buf, VS_WRITE_SIZE);
		if (n == 0)
			break;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			s->err = -errno;
			break;
		}
		s->bytes += n;
		atomic_fetch_add_explicit(&vs_sink_total, (uint64_t)n, memory_order_relaxed);
	}
	free(buf);
out:
	s->t_end = vs_now();
	/* Our close is the sender's EOF: it tells the sender the data got here. */
	close(s->fd);
	s->fd = -1;
	return NULL;
}

/* The sink's progress: the total read so far, every progress_ms on an absolute schedule, and
 * once more when the last stream has ended. */
static void *vs_progress_thread(void *arg)
{
	const struct vs_opts *o = arg;
	struct timespec next;
	FILE *f = fopen(o->progress, "we");

	if (!f) {
		fprintf(stderr, "vmig-stream: %s: %s\n", o->progress, strerror(errno));
		return NULL;
	}
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (;;) {
		int done = atomic_load(&vs_sink_done);

		fprintf(f, "%.6f %llu\n", vs_now(),
			(unsigned long long)atomic_load_explicit(&vs_sink_total,
								 memory_order_relaxed));
		fflush(f);
		if (done)
			break;
		next.tv_nsec += (long)o->progress_ms * 1000000L;
		while (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
			;
	}
	fclose(f);
	return NULL;
}

static void vs_print_result(const char *mode, struct vs_stream *st, unsigned int n, double t0)
{
	struct rusage ru;
	uint64_t total = 0;
	double t_end = t0, secs, cpu;
	unsigned int i;
	int err = 0;

	for (i = 0; i < n; i++) {
		total += st[i].bytes;
		if (st[i].t_end > t_end)
			t_end = st[i].t_end;
		if (st[i].err && !err)
			err = st[i].err;
	}
	secs = t_end - t0;
	/* Our own CPU, so the harness can tell its relays' cost from the load generator's. */
	getrusage(RUSAGE_SELF, &ru);
	cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
	      ru.ru_stime.tv_usec / 1e6;
	printf("{\"mode\":\"%s\",\"streams\":%u,\"bytes\":%llu,\"seconds\":%.6f,\"gbit_s\":%.3f,"
	       "\"cpu_s\":%.3f,\"error\":%d,\"per_stream_bytes\":[",
	       mode, n, (unsigned long long)total, secs, secs > 0 ? total * 8 / secs / 1e9 : 0.0,
	       cpu, err);
	for (i = 0; i < n; i++)
		printf("%s%llu", i ? "," : "", (unsigned long long)st[i].bytes);
	/* CLOCK_MONOTONIC seconds: the start and each stream's end, to line up with --progress. */
	printf("],\"t0\":%.6f,\"per_stream_end\":[", t0);
	for (i = 0; i < n; i++)
		printf("%s%.6f", i ? "," : "", st[i].t_end);
	printf("]}\n");
	fflush(stdout);
}

static int vs_run_threads(struct vs_stream *st, unsigned int n, void *(*fn)(void *))
{
	unsigned int i, started = 0;
	int r = 0;

	for (i = 0; i < n; i++) {
		r = -pthread_create(&st[i].thread, NULL, fn, &st[i]);
		if (r < 0)
			break;
		started++;
	}
	for (i = 0; i < started; i++)
		pthread_join(st[i].thread, NULL);
	for (i = 0; i < n && !r; i++)
		if (st[i].err)
			r = st[i].err;
	return r;
}

static int vs_send(const struct vs_opts *o)
{
	struct vs_stream *st;
	unsigned char *buf;
	unsigned int i;
	double t0;
	size_t got;
	ssize_t n;
	int r;

	buf = malloc(VS_WRITE_SIZE);
	if (!buf)
		return -ENOMEM;
	for (got = 0; got < VS_WRITE_SIZE; got += n) {
		n = getrandom(buf + got, VS_WRITE_SIZE - got, 0);
		if (n < 0) {
			r = -errno;
			goto out_buf;
		}
	}
	st = calloc(o->streams, sizeof(*st));
	if (!st) {
		r = -ENOMEM;
		goto out_buf;
	}
	for (i = 0; i < o->streams; i++)
		st[i].fd = -1;

	atomic_store(&vs_pool, o->shared ? o->bytes : 0);
	/* Connect every stream first (in order: the relay numbers them in accept order). */
	t0 = vs_now();
	for (i = 0; i < o->streams; i++) {
		r = vs_connect(o);
		if (r < 0) {
			fprintf(stderr, "vmig-stream: connect %u: %s\n", i, strerror(-r));
			goto out_close;
		}
		st[i].fd = r;
		st[i].opts = o;
		st[i].buf = buf;
	}
	r = vs_run_threads(st, o->streams, vs_send_thread);
	vs_print_result("send", st, o->streams, t0);
	if (r < 0)
		fprintf(stderr, "vmig-stream: send: %s\n", strerror(-r));
out_close:
	for (i = 0; i < o->streams; i++)
		if (st[i].fd >= 0)
			close(st[i].fd);
	free(st);
out_buf:
	free(buf);
	return r;
}

static int vs_sink(const struct vs_opts *o)
{
	struct vs_stream *st;
	unsigned int i, started = 0;
	double t0 = 0;
	int lfd, fd, r = 0;
	pthread_t progress;
	bool progress_on = false;

	st = calloc(o->streams, sizeof(*st));
	if (!st)
		return -ENOMEM;
	lfd = vs_listen(o, o->streams);
	if (lfd < 0) {
		r = lfd;
		fprintf(stderr, "vmig-stream: listen: %s\n", strerror(-r));
		goto out_free;
	}
	if (o->progress)
		progress_on = !pthread_create(&progress, NULL, vs_progress_thread, (void *)o);
	fprintf(stderr, "vmig-stream: listening\n");
	while (started < o->streams) {
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			fprintf(stderr, "vmig-stream: accept: %s\n", strerror(-r));
			break;
		}
		/* The clock starts at the first connection: idle time before it is not transfer. */
		if (!started)
			t0 = vs_now();
		st[started].fd = fd;
		st[started].opts = o;
		r = -pthread_create(&st[started].thread, NULL, vs_sink_thread, &st[started]);
		if (r < 0) {
			close(fd);
			break;
		}
		started++;
	}
	close(lfd);
	if (o->unix_path)
		unlink(o->unix_path);
	for (i = 0; i < started; i++)
		pthread_join(st[i].thread, NULL);
	if (progress_on) {
		atomic_store(&vs_sink_done, 1);
		pthread_join(progress, NULL);
	}
	for (i = 0; i < started && !r; i++)
		if (st[i].err)
			r = st[i].err;
	vs_print_result("sink", st, started, t0);
	if (r < 0)
		fprintf(stderr, "vmig-stream: sink: %s\n", strerror(-r));
out_free:
	free(st);
	return r;
}

int main(int argc, char **argv)
{
	struct vs_opts o = {.streams = 1, .timeout_s = 600, .progress_ms = 100};
	uint64_t v;
	int i, r;

	if (argc < 2) {
		vs_usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "send")) {
		o.send = true;
	} else if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		vs_usage(stdout);
		return 0;
	} else if (strcmp(argv[1], "sink")) {
		vs_usage(stderr);
		return 2;
	}
	for (i = 2; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (o.send && !strcmp(a, "--shared")) {
			o.shared = true;
			continue;
		}
		if (!val)
			goto bad;
		if (!strcmp(a, "--unix")) {
			o.unix_path = val;
		} else if ((o.send && !strcmp(a, "--tcp")) ||
			   (!o.send && !strcmp(a, "--tcp-listen"))) {
			o.tcp = val;
		} else if (o.send && !strcmp(a, "--bytes")) {
			if (vs_parse_size(val, &o.bytes) < 0)
				goto bad;
		} else if (!strcmp(a, "--streams")) {
			if (vs_parse_size(val, &v) < 0 || !v || v > VS_MAX_STREAMS)
				goto bad;
			o.streams = v;
		} else if (!o.send && !strcmp(a, "--progress")) {
			o.progress = val;
		} else if (!o.send && !strcmp(a, "--progress-ms")) {
			if (vs_parse_size(val, &v) < 0 || !v || v > 60000)
				goto bad;
			o.progress_ms = v;
		} else if (!strcmp(a, "--timeout")) {
			if (vs_parse_size(val, &v) < 0 || v > UINT_MAX)
				goto bad;
			o.timeout_s = v;
		} else {
			goto bad;
		}
		i++;
	}
	if (!!o.unix_path == !!o.tcp || (o.send && !o.bytes))
		goto bad;

	/* A stuck relay must not hang the bench: SIGALRM's default action ends the process. */
	signal(SIGPIPE, SIG_IGN);
	alarm(o.timeout_s);
	r = o.send ? vs_send(&o) : vs_sink(&o);
	return r < 0 ? 1 : 0;
bad:
	vs_usage(stderr);
	return 2;
}
