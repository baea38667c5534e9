#!/usr/bin/env python3
"""Integration test of the convergence module's QMP backend (ctrl/cv_qmp.c) against a real QEMU,
driven by cv-probe ($CV_PROBE, tests/tools) on a second QMP socket of the source while the harness
watches through the first. No daemons, no namespaces: each migration goes to `exec:cat > /dev/null`
or, for postcopy, to a local destination QEMU.

- A paused 64 MiB guest of random pages, capped at 1 MB/s so that it stays active: `prepare
  auto-converge dormant downtime=400` sets what QEMU then reports (events, auto-converge,
  cpu-throttle 1 % + 1 % at a 100 % trigger threshold, downtime 400 ms); `query` while active
  (status, RAM total, rate near 1 MB/s, guest not running); `prepare` refused while active;
  `throttle`, `bandwidth`, `downtime` as QEMU's parameters; `resume` / `pause` as the guest's
  state; `watch`; `abort` -> cancelled with the guest still running; `bandwidth 0` -> QEMU's
  maximum.
- QEMU 7.2 takes postcopy-ram with multifd and breaks later: `prepare post-copy` refuses it
  with a clear line and changes nothing; without multifd it is set.
- Another client on the socket: `no reply in 500 ms` within a second; QEMU quitting under
  `watch` of a second migration: `QEMU closed its QMP socket`.
- The test guest (tests/guest) dirtying 4 MiB flat out under a 4 MB/s cap: dirty_rate and syncs
  appear, dormant auto-converge does not bite over several syncs, `throttle 30 10` makes it bite
  at 30 % (with cpu-throttle-tailslow on) and step +10; `abort` leaves the guest running. Skipped (the rest still runs) without
  the guest.
- `postcopy` on a migration to a real destination: postcopy-active, then completed."""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

QEMU_MAX_BANDWIDTH = 2251799813685247
CAP_BPS = 1000000           # part A: 64 MiB at 1 MB/s stays active for a minute
GUEST_CAP_BPS = 4000000     # part C: a 4 MiB working set is re-sent about once a second


class Probe:
    """cv-probe on one QMP socket; each run is a fresh connection."""

    def __init__(self, binary, qmp_path):
        self.binary, self.qmp_path = binary, qmp_path

    def run(self, *cmds, timeout_ms=5000, timeout=120):
        return subprocess.run([self.binary, '--qmp', self.qmp_path, '--timeout-ms',
                               str(timeout_ms), *map(str, cmds)],
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def ok(self, *cmds, **kw):
        """The JSON lines it printed; HarnessError unless it exited 0 silently on stderr."""
        p = self.run(*cmds, **kw)
        if p.returncode != 0 or p.stderr:
            raise vt.HarnessError(f'cv-probe {" ".join(map(str, cmds))}: exit {p.returncode}: '
                                  f'{p.stderr.strip()}')
        return [json.loads(line) for line in p.stdout.splitlines()]

    def fails(self, *cmds, **kw):
        """Its one stderr line; HarnessError unless it exited 1 with one line."""
        p = self.run(*cmds, **kw)
        lines = p.stderr.strip().splitlines()
        if p.returncode != 1 or len(lines) != 1 or not lines[0].startswith('cv-probe: '):
            raise vt.HarnessError(f'cv-probe {" ".join(map(str, cmds))}: exit {p.returncode}, '
                                  f'stderr {p.stderr!r}: expected exit 1 and one line')
        return lines[0]

    def query(self):
        return self.ok('query')[0]


def caps(q):
    return {c['capability']: c['state'] for c in q.execute('query-migrate-capabilities')}


def wait_status(q, statuses, timeout=30):
    return vt.wait_until(lambda: q.execute('query-migrate').get('status') in statuses and
                         q.execute('query-migrate'), timeout, f'migration status in {statuses}')


def machine():
    """The machine type for this run's QEMUs ($VMIG_QEMU_SRC/$VMIG_QEMU_DST pick each side's,
    as meson test --setup qemu10 or cross do)."""
    return vt.machine_for(vt.side_qemu('source'), vt.side_qemu('destination'))


def qemu_version(q):
    v = q.execute('query-version')['qemu']
    return v['major'], v['minor']


def source(name, wd, **kw):
    probe_qmp = os.path.join(wd, f'{name}.probe.qmp')
    kw.setdefault('binary', vt.side_qemu('source'))
    kw.setdefault('machine', machine())
    q = vt.Qemu(name, 'source', 64, wd, private=True,
                extra_args=['-qmp', f'unix:{probe_qmp},server=on,wait=off'], **kw)
    return q, probe_qmp


def part_paused(probe_bin, wd, check):
    """A: a paused guest migrating at 1 MB/s to /dev/null; the multifd refusal; a busy socket;
    QEMU going away."""
    vt.log('A: paused guest, 64 MiB at 1 MB/s to exec:cat')
    q, pq = source('src-a', wd)
    q.start()
    try:
        probe = Probe(probe_bin, pq)
        job = probe.query()
        check(job['status'] == 'none' and job['guest_running'] is False and
              job['elapsed_ms'] == -1, f'before any migration: {job}')
        probe.ok('prepare', 'auto-converge', 'dormant', 'downtime=400')
        c = caps(q)
        check(c['events'] and c['auto-converge'] and not c['postcopy-ram'],
              f'capabilities after prepare: {c}')
        p = q.execute('query-migrate-parameters')
        check((p['cpu-throttle-initial'], p['cpu-throttle-increment'],
               p['throttle-trigger-threshold'], p['downtime-limit']) == (1, 1, 100, 400),
              f'parameters after prepare: {p}')

        q.execute('migrate-set-parameters', {'max-bandwidth': CAP_BPS})
        q.execute('migrate', {'uri': 'exec:cat > /dev/null'})
        wait_status(q, ('active',))
        time.sleep(1.5)
        job = probe.query()
        vt.log(f'  query while active: {json.dumps(job)}')
        check(job['status'] == 'active', f'status {job["status"]}, not active')
        check(job['total'] == 64 << 20 or abs(job['total'] - (64 << 20)) < (4 << 20),
              f'total {job["total"]}, not about 64 MiB')
        check(0 < job['transferred'] < job['total'], f'transferred {job["transferred"]}')
        check(job['remaining'] > 0 and job['remaining'] <= job['total'],
              f'remaining {job["remaining"]}')
        check(0.5 * CAP_BPS <= job['rate'] <= 1.5 * CAP_BPS,
              f'rate {job["rate"]} B/s under a cap of {CAP_BPS}')
        check(job['elapsed_ms'] >= 1000, f'elapsed {job["elapsed_ms"]} ms')
        check(job['guest_running'] is False, 'guest_running under -S')
        check(job['downtime_ms'] == -1 and job['dirty_syncs'] >= 1, f'{job}')

        err = probe.fails('prepare', 'auto-converge')
        check('already in progress' in err and 'active' in err,
              f'prepare while active: {err!r}')

        probe.ok('throttle', 30, 5, 'bandwidth', 2 * CAP_BPS, 'downtime', 500)
        p = q.execute('query-migrate-parameters')
        check((p['cpu-throttle-initial'], p['cpu-throttle-increment'], p['max-bandwidth'],
               p['downtime-limit']) == (30, 5, 2 * CAP_BPS, 500),
              f'parameters after throttle/bandwidth/downtime: {p}')
        probe.ok('bandwidth', CAP_BPS)

        jobs = probe.ok('resume', 'query', 'pause', 'query')
        check([j['guest_running'] for j in jobs] == [True, False],
              f'resume/pause: guest_running {[j["guest_running"] for j in jobs]}')
        check(q.execute('query-status')['running'] is False, 'QEMU runs after pause')

        started = time.monotonic()
        jobs = probe.ok('watch', 2, 250)
        took = time.monotonic() - started
        check(7 <= len(jobs) <= 10 and all(j['status'] == 'active' for j in jobs) and
              1.7 < took < 4, f'watch 2 250: {len(jobs)} samples in {took:.2f}s, '
              f'{[j["status"] for j in jobs]}')
        tx = [j['transferred'] for j in jobs]
        check(tx == sorted(tx) and tx[-1] > tx[0], f'transferred over watch: {tx}')
        check([j['t_ms'] for j in jobs] == sorted(j['t_ms'] for j in jobs), 'watch t_ms order')

        jobs = probe.ok('resume', 'abort', 'watch', 10, 100)
        vt.log(f'  after abort: {json.dumps(jobs[-1])}')
        check(jobs[-1]['status'] == 'cancelled', f'after abort: {jobs[-1]["status"]}')
        check(all(j['status'] in ('active', 'cancelling', 'cancelled') for j in jobs),
              f'states during abort: {[j["status"] for j in jobs]}')
        check(jobs[-1]['guest_running'] is True, 'the guest does not run after abort')
        st = q.execute('query-status')
        check(st['status'] == 'running', f'QEMU after abort: {st}')
        probe.ok('bandwidth', 0)
        p = q.execute('query-migrate-parameters')
        check(p['max-bandwidth'] == QEMU_MAX_BANDWIDTH, f'bandwidth 0: {p["max-bandwidth"]}')

        major, minor = qemu_version(q)
        if (major, minor) < (10, 1):
            vt.log(f'  QEMU {major}.{minor}: postcopy-ram with multifd')
            q.execute('migrate-set-capabilities',
                      {'capabilities': [{'capability': 'multifd', 'state': True}]})
            err = probe.fails('prepare', 'post-copy')
            vt.log(f'  {err}')
            check('multifd' in err and f'QEMU {major}.{minor} cannot do postcopy' in err,
                  f'prepare post-copy with multifd: {err!r}')
            check(not caps(q)['postcopy-ram'], 'postcopy-ram set after the refusal')
            err = probe.fails('postcopy')
            check('multifd is on' in err, f'postcopy with multifd: {err!r}')
            q.execute('migrate-set-capabilities',
                      {'capabilities': [{'capability': 'multifd', 'state': False}]})
        probe.ok('prepare', 'post-copy')
        check(caps(q)['postcopy-ram'], 'postcopy-ram not set by prepare post-copy')

        # QEMU serves one client per QMP socket: the harness holds the first one.
        started = time.monotonic()
        err = Probe(probe_bin, q.qmp_path).fails('query', timeout_ms=500)
        took = time.monotonic() - started
        vt.log(f'  busy socket: {err} ({took:.2f}s)')
        check('no reply in 500 ms' in err and 'another client' in err and took < 1.5,
              f'a socket with a client: {err!r} after {took:.2f}s')

        # QEMU quits under a watch of a new migration (a finished one ends a watch at once).
        q.execute('migrate-set-capabilities',
                  {'capabilities': [{'capability': 'postcopy-ram', 'state': False}]})
        q.execute('migrate-set-parameters', {'max-bandwidth': CAP_BPS})
        q.execute('migrate', {'uri': 'exec:cat > /dev/null'})
        wait_status(q, ('active',))
        watch = subprocess.Popen([probe_bin, '--qmp', pq, 'watch', '30', '100'],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        q.close()
        started = time.monotonic()
        out, errtext = watch.communicate(timeout=10)
        took = time.monotonic() - started
        vt.log(f'  QEMU quit under watch: exit {watch.returncode}, {errtext.strip()} '
               f'({took:.2f}s)')
        check(watch.returncode == 1 and 'QEMU closed its QMP socket' in errtext and took < 2,
              f'QEMU quit under watch: exit {watch.returncode}, {errtext!r}, {took:.2f}s')
        check(len(out.splitlines()) >= 3, f'watch printed {len(out.splitlines())} lines first')
    finally:
        q.close()


def part_guest(probe_bin, wd, check):
    """C: auto-converge on a guest that dirties memory."""
    try:
        vt.guest_binary()
    except vt.Skip as e:
        vt.log(f'C: skipped: {e}')
        return
    vt.log(f'C: test guest dirtying 4 MiB flat out, {GUEST_CAP_BPS} B/s to exec:cat')
    q, pq = source('src-c', wd, guest={'ws_mib': 4, 'rate_mib_s': 0})
    q.start()
    try:
        probe = Probe(probe_bin, pq)
        probe.ok('prepare', 'auto-converge', 'dormant', 'bandwidth', GUEST_CAP_BPS)
        q.start_guest()
        q.execute('migrate', {'uri': 'exec:cat > /dev/null'})
        # A loaded host can hold the job in "setup" for a while: the samples below wait for
        # conditions of an active job, and would take "setup" for its end.
        wait_status(q, ('active', 'failed', 'cancelled', 'completed'))

        def sample(pred):
            def f():
                job = probe.query()
                return job if pred(job) else None
            return f
        job = vt.wait_until(sample(lambda j: j['dirty_syncs'] >= 5 or
                                   j['status'] not in ('active', 'setup')), 60, 'five dirty syncs',
                            interval=0.5)
        vt.log(f'  dormant: {json.dumps(job)}')
        check(job['status'] == 'active', f'status {job["status"]} during the dormant part')
        check(job['dirty_rate'] > 0, f'dirty_rate {job["dirty_rate"]}, syncs '
              f'{job["dirty_syncs"]}')
        check(job['throttle_pct'] == 0, f'dormant throttle at {job["throttle_pct"]} %')
        check(job['guest_running'] is True, 'guest_running false for a running guest')
        probe.ok('throttle', 30, 10)
        job = vt.wait_until(sample(lambda j: j['throttle_pct'] >= 30 or
                                   j['status'] != 'active'), 30, 'the throttle to bite',
                            interval=0.5)
        vt.log(f'  after throttle 30 10: {json.dumps(job)}')
        check(job['throttle_pct'] == 30, f'throttle bit at {job["throttle_pct"]} %, not 30')
        params = q.execute('query-migrate-parameters')
        check(params.get('cpu-throttle-tailslow') is True,
              f'cpu-throttle-tailslow {params.get("cpu-throttle-tailslow")} after throttle')
        job = vt.wait_until(sample(lambda j: j['throttle_pct'] > 30 or
                                   j['status'] != 'active'), 30, 'the throttle to step',
                            interval=0.5)
        check(job['throttle_pct'] == 40, f'throttle stepped 30 -> {job["throttle_pct"]}, not +10')
        reports = len(q.guest_reports())
        jobs = probe.ok('abort', 'watch', 10, 100)
        check(jobs[-1]['status'] == 'cancelled' and jobs[-1]['guest_running'],
              f'after abort: {jobs[-1]}')
        vt.wait_until(lambda: len(q.guest_reports()) >= reports + 2, 10,
                      'the guest to go on reporting after abort')
    finally:
        q.close()


def part_postcopy(probe_bin, wd, check):
    """D: migrate-start-postcopy on a real migration."""
    vt.log('D: postcopy to a destination QEMU')
    q, pq = source('src-d', wd)
    dst = vt.Qemu('dst-d', 'destination', 64, wd, binary=vt.side_qemu('destination'),
                  machine=machine())
    q.start()
    dst.start()
    try:
        probe = Probe(probe_bin, pq)
        dst.execute('migrate-set-capabilities',
                    {'capabilities': [{'capability': 'postcopy-ram', 'state': True}]})
        sock = os.path.join(wd, 'mig-d.sock')
        dst.execute('migrate-incoming', {'uri': f'unix:{sock}'})
        probe.ok('prepare', 'post-copy', 'bandwidth', 2 * CAP_BPS)
        q.execute('migrate', {'uri': f'unix:{sock}'})
        wait_status(q, ('active',))
        time.sleep(1)
        jobs = probe.ok('postcopy', 'watch', 30, 20)
        states = [j['status'] for j in jobs]
        vt.log(f'  after postcopy: {sorted(set(states))}, last {json.dumps(jobs[-1])}')
        check('postcopy-active' in states or jobs[-1]['status'] == 'completed',
              f'states after postcopy: {states}')
        check(jobs[-1]['status'] == 'completed' and jobs[-1]['downtime_ms'] >= 0 and
              jobs[-1]['remaining'] == 0, f'last after postcopy: {jobs[-1]}')
    finally:
        q.close()
        dst.close()


def main():
    if os.geteuid() != 0:
        raise vt.Skip('needs root (like the other QEMU tests)')
    vt.log(f'QEMU {vt.side_qemu("source")} -> {vt.side_qemu("destination")} ({machine()})')
    probe_bin = vt.tool_binary('CV_PROBE', 'tests/tools/cv-probe')
    checks = vt.Checks('checks')
    with vt.work_directory('vmig-cvqmp-') as wd:
        part_paused(probe_bin, wd, checks.check)
        part_guest(probe_bin, wd, checks.check)
        part_postcopy(probe_bin, wd, checks.check)
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
