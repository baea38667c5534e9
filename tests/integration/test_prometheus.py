#!/usr/bin/env python3
"""A real Prometheus server (Debian's prometheus) scraping the two vmigd of a testbed every second
during a real QEMU migration, with vmigd's rules (contrib/prometheus/vmigd-rules.yaml) loaded
and evaluated every second; everything asserted through Prometheus's HTTP API.

- Prometheus runs in the source namespace (`--storage.tsdb.path` in the work directory, its web
  listener on 127.0.0.1 there); it scrapes the source vmigd at its node address and the target
  vmigd across the veth pair (`vmigd --metrics 0.0.0.0:0` in each namespace). Both targets up.
- 256 MiB, 2 multifd channels, capped at 64Mi: while it runs Prometheus has the migration's sent
  bytes; once QEMU completed, its last sample of the source's sent bytes is what the daemon
  serves and equals the target's received bytes, within a few % of QEMU's ram.transferred; the
  daemon's own 1-s rate peaked near the cap; the recording rules
  vmigd:migration_sent_bytes:rate1m and vmigd:node_sent_bytes:rate1m are above 0.
- Every rule of the file loaded, evaluated, health ok; VmigdDown not firing,
  VmigdMigrationFailureRate inactive. Where vmigd exports vmigd_migrations_total: after `source stop` and `target stop`,
  one completed migration on each daemon (role source, role target) and a failure share of 0;
  vmigd_build_info 1 and a resident size (process_resident_memory_bytes) for both.
- The target vmigd stopped: its `up` turns 0 and VmigdDown is pending for it; the source is up.

Needs root, QEMU and prometheus; skips (77) without."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB = vt.MIB
RULES = os.path.join(vt.REPO_ROOT, 'contrib', 'prometheus', 'vmigd-rules.yaml')
CAP = 64 * MIB
SIZE_MIB = 256
# Prometheus has the source namespace to itself: any port there is free.
WEB = '127.0.0.1:9090'


class Prometheus:
    """prometheus in the source namespace, scraping targets {side: 'ADDR:PORT'} every second."""

    def __init__(self, tb, targets):
        self.tb, self.ns = tb, tb.net.ns('source')
        self.dir = tb.path('prometheus')
        self.log_path = os.path.join(self.dir, 'prometheus.log')
        os.makedirs(os.path.join(self.dir, 'tsdb'))
        conf = os.path.join(self.dir, 'prometheus.yml')
        with open(conf, 'w') as f:
            json.dump({  # YAML is a superset of JSON
                'global': {'scrape_interval': '1s', 'scrape_timeout': '1s',
                           'evaluation_interval': '1s'},
                'rule_files': [RULES],
                'scrape_configs': [{'job_name': 'vmigd', 'static_configs': [
                    {'targets': [addr], 'labels': {'side': side}}
                    for side, addr in targets.items()]}]}, f)
        self.cmd = [*tb.net.prefix('source'), 'prometheus', f'--config.file={conf}',
                    f'--storage.tsdb.path={self.dir}/tsdb', f'--web.listen-address={WEB}']
        self.proc = None

    def __enter__(self):
        with open(self.log_path, 'ab') as logf:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=logf)

        def ready():
            if self.proc.poll() is not None:
                raise vt.HarnessError(f'prometheus exited {self.proc.returncode}:\n'
                                      f'{vt.tail(self.log_path)}')
            try:
                return vt.http_get(self.ns, f'http://{WEB}/-/ready', timeout=2)[0] == 200
            except vt.HarnessError:
                return False
        vt.wait_until(ready, 30, 'prometheus to be ready', interval=0.2)
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is not None and self.proc is not None:
            sys.stdout.write(f'--- tail of {self.log_path}\n{vt.tail(self.log_path, 20)}')
        vt.stop_process(self.proc)

    def api(self, path, **params):
        url = f'http://{WEB}/api/v1/{path}'
        if params:
            url += '?' + urllib.parse.urlencode(params)
        status, _, body = vt.http_get(self.ns, url)
        reply = json.loads(body)
        if status != 200 or reply.get('status') != 'success':
            raise vt.HarnessError(f'prometheus {path} {params}: {status} {body[:300]}')
        return reply['data']

    def query(self, expr):
        """{frozenset of (label, value) without __name__: float} of an instant query."""
        data = self.api('query', query=expr)
        return {frozenset((k, v) for k, v in r['metric'].items() if k != '__name__'):
                float(r['value'][1]) for r in data['result']}

    def value(self, expr):
        """The one value of expr, or None when it has no result (HarnessError for several)."""
        got = self.query(expr)
        if len(got) > 1:
            raise vt.HarnessError(f'{expr}: {len(got)} results, expected one: {got}')
        return next(iter(got.values())) if got else None

    def wait_value(self, expr, cond, what, timeout=15):
        """Wait until expr has one value for which cond holds; that value."""
        seen = []

        def ok():
            v = self.value(expr)
            seen[:] = [v]
            return v is not None and cond(v) and (v,)
        try:
            return vt.wait_until(ok, timeout, what, interval=0.25)[0]
        except vt.HarnessError:
            raise vt.HarnessError(f'{what}: {expr} is {seen[0] if seen else None} after '
                                  f'{timeout} s') from None

    def rules(self):
        return [r for g in self.api('rules')['groups'] for r in g['rules']]

    def alerts(self, name):
        """[(instance, state)] of the active (pending or firing) alerts called name."""
        return [(a['labels'].get('instance'), a['state']) for a in self.api('alerts')['alerts']
                if a['labels'].get('alertname') == name]


def scrape(tb, daemon):
    status, _, body = vt.http_get(tb.ns_of(daemon), daemon.metrics_url())
    if status != 200:
        raise vt.HarnessError(f'{daemon.name}: GET /metrics answered {status}')
    families, problems = vt.parse_prometheus(body)
    if problems:
        raise vt.HarnessError(f'{daemon.name}: /metrics: {problems[:3]}')
    return families


def rule_names():
    with open(RULES) as f:
        return [line.split(':', 1)[1].strip() for line in f
                if line.strip().startswith(('- alert:', '- record:'))]


def main():
    if shutil.which('prometheus') is None:
        raise vt.Skip('no prometheus (Debian: apt-get install prometheus)')
    started = time.monotonic()
    checks = vt.Checks('Prometheus checks')
    with vt.Testbed(daemon_args=['--metrics', '0.0.0.0:0']) as tb:
        addr = {'source': tb.net.source_addr, 'target': tb.net.target_addr}
        inst = {side: f'{addr[side]}:{d.status_field("metrics").rpartition(":")[2]}'
                for d, side in tb.sides()}
        vt.log(f'{tb.describe()}; Prometheus in the source namespace scrapes {inst}')
        has_outcomes = 'vmigd_migrations_total' in scrape(tb, tb.source)
        with Prometheus(tb, inst) as prom:
            vt.log(f'prometheus ready, {time.monotonic() - started:.1f} s after the start')
            for side in ('source', 'target'):
                checks.run(f'up {side}', lambda s=side: prom.wait_value(
                    f'up{{job="vmigd", instance="{inst[s]}"}}', lambda v: v == 1,
                    f'{s} vmigd up'))
            src, dst = tb.qemu_pair(SIZE_MIB)
            m = tb.start_migration(src, dst, channels=2, bandwidth='64Mi')
            key = m.key
            sel = f'key="{key}", role="source", instance="{inst["source"]}"'
            checks.run('sent bytes while it runs', lambda: '%d bytes' % prom.wait_value(
                f'vmigd_migration_sent_bytes_total{{{sel}}}', lambda v: v > 0,
                'sent bytes in Prometheus', timeout=30))
            checks.run('still in flight', vt.still_in_flight, m)
            info = m.wait(120)
            ram = info['ram']['transferred']
            vt.log(f'{key}: QEMU completed, {ram} bytes of RAM in {info["_elapsed"]:.1f} s')

            def final_bytes():
                # what the daemon serves now, and Prometheus's latest sample of it: equal once
                # a scrape after the last byte came in
                def served():
                    return vt.prom_value(scrape(tb, tb.source), 'vmigd_migration_sent_bytes_total',
                                         key=key, role='source')
                got = prom.wait_value(f'vmigd_migration_sent_bytes_total{{{sel}}}',
                                      lambda v: v == served(), 'the last sample', timeout=10)
                sent = served()
                received = vt.prom_value(scrape(tb, tb.target),
                                         'vmigd_migration_received_bytes_total', key=key,
                                         role='target')
                if received != sent or not 0.98 * ram <= sent <= 1.1 * ram:
                    raise vt.HarnessError(f'source sent {sent}, target received {received}, '
                                          f'QEMU ram.transferred {ram}')
                return f'{got:.0f} bytes, as the daemon serves, = target received, ' \
                       f'{sent / ram:.3f} x ram.transferred'
            checks.run('sent bytes at the end', final_bytes)

            def peak_rate():
                v = prom.value('max_over_time(vmigd_migration_rate_bytes_per_second'
                               f'{{{sel}, direction="tx", window="1s"}}[1m])')
                if v is None or not 0.25 * CAP <= v <= 1.5 * CAP:
                    raise vt.HarnessError(f'peak 1-s rate {v}, cap {CAP}')
                return f'peak 1-s rate {v / MIB:.1f} MiB/s, cap 64 MiB/s'
            checks.run('rate', peak_rate)
            checks.run('recording rule per migration', lambda: '%.0f B/s' % prom.wait_value(
                f'max_over_time(vmigd:migration_sent_bytes:rate1m{{{sel}}}[1m])',
                lambda v: v > 0, 'the recording rule'))
            checks.run('recording rule per node', lambda: '%.0f B/s' % prom.wait_value(
                f'vmigd:node_sent_bytes:rate1m{{instance="{inst["source"]}"}}',
                lambda v: v > 0, 'the node recording rule'))
            m.finish(30)

            def rules_ok():
                rules = prom.rules()
                names = [r['name'] for r in rules]
                bad = [(r['name'], r.get('health'), r.get('lastError')) for r in rules
                       if r.get('health') != 'ok']
                if sorted(names) != sorted(rule_names()) or bad:
                    raise vt.HarnessError(f'loaded {names}; not ok: {bad}')
                states = {r['name']: r['state'] for r in rules if r['type'] == 'alerting'}
                # VmigdDown fires only after 5 minutes; a scrape slower than its 1-s timeout on
                # a loaded host would make it pending for a moment, which is no failure here
                if states['VmigdDown'] == 'firing' or \
                        states['VmigdMigrationFailureRate'] != 'inactive':
                    raise vt.HarnessError(f'alert states {states}')
                return f'{len(rules)} rules evaluated, health ok; alerts {set(states.values())}'
            checks.run('rules', rules_ok)
            if has_outcomes:
                for side in ('source', 'target'):
                    checks.run(f'{side}: one completed migration', lambda s=side: prom.wait_value(
                        f'sum(vmigd_migrations_total{{instance="{inst[s]}", role="{s}", '
                        'outcome="completed"})', lambda v: v == 1, f'{s} completed == 1'))
                    checks.run(f'{side}: nothing but completed', lambda s=side: prom.wait_value(
                        f'sum(vmigd_migrations_total{{instance="{inst[s]}", '
                        'outcome!="completed"})', lambda v: v == 0, f'{s} others == 0'))
                checks.run('failure share', lambda: prom.wait_value(
                    f'vmigd:migrations_failed:ratio_rate1h{{instance="{inst["source"]}", '
                    'role="source"}', lambda v: v == 0, 'the failure share'))
                checks.run('build info and process figures', lambda: '%d daemons' %
                           prom.wait_value('count(vmigd_build_info == 1) and on () '
                                           'count(process_resident_memory_bytes > 1e6) == 2',
                                           lambda v: v == 2, 'both daemons\' build_info, RSS'))
            else:
                vt.log('vmigd_migrations_total is not exported by this vmigd: its checks, and '
                       'those of vmigd_build_info and process_*, left out')
            rc = tb.target.stop()
            checks.check(rc == 0, f'target vmigd exited {rc} after SIGTERM')
            checks.run('target down', lambda: prom.wait_value(
                f'up{{instance="{inst["target"]}"}}', lambda v: v == 0, 'up == 0'))
            checks.run('VmigdDown pending', lambda: vt.wait_until(
                lambda: (inst['target'], 'pending') in prom.alerts('VmigdDown') and
                prom.alerts('VmigdDown'), 10, 'VmigdDown pending for the target'))
            checks.run('source still up', lambda: prom.wait_value(
                f'up{{instance="{inst["source"]}"}}', lambda v: v == 1, 'source up'))
    vt.log(f'{checks.count} checks in {time.monotonic() - started:.1f} s')
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
