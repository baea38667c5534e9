#!/usr/bin/env python3
"""Integration test of vmigd's metrics: `vmigctl metrics [--json]`, `vmigctl top`, the Prometheus
endpoint (`vmigd --metrics 127.0.0.1:0` in each daemon's namespace, scraped with curl there) and
the QEMU stream inspector, with real QEMU migrations through two daemons.

- During a 512 MiB 4-channel migration capped at 50 MiB/s: /metrics parsed strictly (HELP and
  TYPE once per name before its samples, samples of a name in one group, label syntax, no series
  twice, every name vmigd_), its figures against `metrics --json` taken right after (byte counters
  monotonic and close, cap and limit equal, key/role labels), HEAD, 404 and 405; `vmigctl top
  --count 2 --interval 0.5` and `vmigctl metrics`.
- After QEMU completed and before `source stop`, on both daemons, for that multifd migration and
  for one with multifd off: the inspector's pages and zero pages (JSON and Prometheus) within 1 %
  of the source QEMU's ram.normal and ram.duplicate; stream version 3, the machine type, channel
  counts, switchover, no bytes-only channel.
- Streams that are not QEMU's (random bytes; a QEVM header of another version) pass unchanged and
  show up as kind other / bytes only, with a reason.
- `vmigd --no-inspect`: no inspector figures anywhere, and the migration completes.
- Idle daemons, before any migration: every family doc/interfaces.md lists has its HELP and TYPE
  lines; vmigd_migrations_total (every role and outcome) and vmigd_tls_refusals_total (every
  reason) at 0, vmigd_build_info, process_*; /healthz 200 ok, /readyz 200 ready (GET and HEAD).
- vmigd_migrations_total after the real migrations: completed counted once per migration on each
  side; a route stopped with its connection still open counts stopped on the source; a
  migration under convergence control (`source start --qmp`) that QEMU cancels (migrate_cancel)
  counts cancelled on the source.
- A third vmigd with TLS and a node certificate that expires a few seconds after its start:
  vmigd_certificate_expiry_timestamp_seconds{cert="node"} is the certificate's notAfter and
  /readyz goes from 200 to 503 with the reason once it has passed."""

import calendar
import hashlib
import os
import re
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB = vt.MIB
CAP = 50 * MIB
PAGE_TOL = 0.01                    # inspector pages vs QEMU's counters
CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8'
MACHINE_PREFIX = 'pc-q35'          # vt.Qemu runs -machine q35
RAW_PAYLOAD = 8 << 20
# Families the documentation promises (doc/interfaces.md, "Prometheus metrics") for an active,
# inspected migration with open connections, bucket shaper.
EXPECTED_FAMILIES = (
    'vmigd_node_bandwidth_cap_bytes_per_second', 'vmigd_node_sent_bytes_total',
    'vmigd_node_received_bytes_total', 'vmigd_node_rate_bytes_per_second',
    'vmigd_node_connections', 'vmigd_node_connections_total', 'vmigd_migrations',
    'vmigd_node_verified_connections_total', 'vmigd_migration_verified_connections_total',
    'vmigd_node_info', 'vmigd_migration_info', 'vmigd_migration_sent_bytes_total',
    'vmigd_migration_received_bytes_total', 'vmigd_migration_rate_bytes_per_second',
    'vmigd_migration_cap_bytes_per_second', 'vmigd_migration_limit_bytes_per_second',
    'vmigd_migration_cap_lifted', 'vmigd_migration_connections',
    'vmigd_migration_connections_total', 'vmigd_migration_connections_failed_total',
    'vmigd_migration_connections_reordered_total', 'vmigd_migration_duration_seconds',
    'vmigd_migration_start_time_seconds', 'vmigd_migration_shaped_seconds_total',
    'vmigd_migration_inspect_channels', 'vmigd_migration_inspect_bytes_only_channels',
    'vmigd_migration_pages_total', 'vmigd_migration_zero_pages_total',
    'vmigd_migration_multifd_packets_total', 'vmigd_migration_sync_points_total',
    'vmigd_migration_passes_total', 'vmigd_migration_switchover', 'vmigd_migration_ram_total_bytes',
    'vmigd_port_sent_bytes_total',
    'vmigd_port_received_bytes_total', 'vmigd_port_rate_bytes_per_second',
    'vmigd_port_connections', 'vmigd_port_connections_total',
    'vmigd_connection_sent_bytes_total', 'vmigd_connection_received_bytes_total',
    'vmigd_connection_shaped_seconds_total', 'vmigd_connection_pacing_bytes_per_second')
OUTCOMES = ('completed', 'cancelled', 'failed', 'cut-short', 'stopped', 'corrupt',
            'connection-errors', 'aborted-by-vmigd')
TLS_REASONS = ('no-certificate', 'untrusted-ca', 'expired', 'not-yet-valid', 'bad-purpose',
               'name-not-allowed', 'peer-refused', 'protocol', 'closed', 'handshake-timeout',
               'silent')
PROCESS_FAMILIES = ('process_cpu_seconds_total', 'process_resident_memory_bytes',
                    'process_virtual_memory_bytes', 'process_start_time_seconds',
                    'process_open_fds', 'process_max_fds')
EXPIRING_IN = 10                   # seconds the short-lived certificate is valid (the migrations
                                   # run meanwhile: checked at the end, it has expired)
INSPECT_FAMILIES = ('vmigd_migration_inspect_channels', 'vmigd_migration_pages_total',
                    'vmigd_migration_zero_pages_total', 'vmigd_migration_switchover',
                    'vmigd_migration_inspect_bytes_only_channels',
                    'vmigd_migration_ram_total_bytes')


def scrape(tb, daemon):
    """GET /metrics from inside daemon's namespace; (families, problems, headers)."""
    status, headers, body = vt.http_get(tb.ns_of(daemon), daemon.metrics_url())
    if status != 200:
        raise vt.HarnessError(f'{daemon.name}: GET /metrics answered {status}')
    families, problems = vt.parse_prometheus(body)
    return families, problems, headers


def series_of(families, key):
    """{(name, labels tuple): value} of every sample about KEY."""
    return {(name, tuple(sorted(lab.items()))): v for name, fam in families.items()
            for lab, v in fam['samples'] if lab.get('key') == key}


# ---- Prometheus during a migration ---------------------------------------------------------------

def check_endpoint(tb, daemon):
    """status `metrics` is the address the start-up line logged; HEAD, 404, 405."""
    addr = daemon.status_field('metrics')
    line = daemon.log_matches(r'metrics: serving (http://\S+)')
    if not addr or not re.fullmatch(r'127\.0\.0\.1:\d+', addr) or addr.endswith(':0'):
        raise vt.HarnessError(f'status metrics = {addr!r}, expected 127.0.0.1:PORT')
    if not line or line[0].group(1) != f'http://{addr}/metrics':
        raise vt.HarnessError(f'log says {line[0].group(0) if line else "nothing"}, status '
                              f'{addr}')
    ns, url = tb.ns_of(daemon), daemon.metrics_url()
    head = vt.http_get(ns, url, method='HEAD')
    missing = vt.http_get(ns, url.replace('/metrics', '/nope'))
    post = vt.http_get(ns, url, method='POST')
    got = (head[0], missing[0], post[0])
    if got != (200, 404, 405):
        raise vt.HarnessError(f'HEAD /metrics, GET /nope, POST /metrics answered {got}, '
                              'expected 200, 404, 405')
    if head[1].get('content-type') != CONTENT_TYPE or \
            not int(head[1].get('content-length', '0')) > 1000:
        raise vt.HarnessError(f'HEAD: content-type {head[1].get("content-type")!r}, '
                              f'content-length {head[1].get("content-length")!r}')
    return f'{line[0].group(1)}; HEAD 200, /nope 404, POST 405'


def check_scrape(tb, daemon, key, previous):
    """Scrape, parse strictly, compare with `metrics --json` taken right after. previous: the
    series of the last scrape (counters must not go down); returns this one's."""
    role = tb.side_of(daemon)
    t_before = time.time()
    families, problems, headers = scrape(tb, daemon)
    js = daemon.metrics()
    mj = daemon.migration_metrics(key, js)
    elapsed = js['node']['time_unix'] - t_before
    if headers.get('content-type') != CONTENT_TYPE:
        problems.append(f'content-type {headers.get("content-type")!r}')
    problems += [f'name {n} without the vmigd_ prefix' for n in families
                 if not n.startswith('vmigd_') and n not in PROCESS_FAMILIES]
    problems += [f'family {n} missing' for n in EXPECTED_FAMILIES if n not in families]
    problems += [f'{n}: {fam["type"]} whose name does not end in _total' for n, fam
                 in families.items() if fam['type'] == 'counter' and not n.endswith('_total')]
    for name, fam in families.items():
        for lab, _ in fam['samples']:
            if 'key' in lab and lab.get('role') not in ('source', 'target'):
                problems.append(f'{name}{lab}: key without a role label')
            if 'conn' in lab and not re.fullmatch(rf'{lab.get("port")}\.\d+', lab['conn']):
                problems.append(f'{name}{lab}: conn label not PORT.SEQ')
    if mj is None:
        raise vt.HarnessError(f'metrics --json does not list {key}')

    def value(name, **labels):
        try:
            return vt.prom_value(families, name, key=key, role=role, **labels)
        except vt.HarnessError as e:
            problems.append(str(e))
            return None
    # Bytes: the scrape came first, so it may be behind the JSON by what the cap lets through
    # in between (plus what the buckets hold), never ahead.
    direction = 'bytes_tx' if role == 'source' else 'bytes_rx'
    name = ('vmigd_migration_sent_bytes_total' if role == 'source' else
            'vmigd_migration_received_bytes_total')
    prom_bytes = value(name)
    slack = CAP * (elapsed + 0.2) + 4 * MIB
    if prom_bytes is not None and not 0 <= mj[direction] - prom_bytes <= slack:
        problems.append(f'{name} {prom_bytes:.0f}, JSON {direction} {mj[direction]} '
                        f'{elapsed:.2f}s later: not within 0..{slack:.0f} behind')
    if prom_bytes is not None and prom_bytes <= 0:
        problems.append(f'{name} = {prom_bytes}: nothing flowed yet')
    node_name = name.replace('migration', 'node')
    node_bytes = vt.prom_value(families, node_name) if node_name in families else None
    if node_bytes is None or node_bytes < prom_bytes:
        problems.append(f'{node_name} {node_bytes} below the migration\'s {prom_bytes}')
    for name, want in (('vmigd_migration_cap_bytes_per_second', mj['cap']),
                       ('vmigd_migration_limit_bytes_per_second', mj['limit']),
                       ('vmigd_migration_connections_total', mj['conns']['total'])):
        got = value(name)
        if got is not None and got != want:
            problems.append(f'{name} {got:.0f}, JSON {want}')
    if role == 'source' and mj['cap'] != CAP:
        problems.append(f'JSON cap {mj["cap"]}, expected {CAP}')
    info = [lab for lab, _ in families.get('vmigd_migration_info', {}).get('samples', [])
            if lab.get('key') == key]
    if len(info) != 1 or info[0].get('role') != role or info[0].get('state') != 'active' or \
            info[0].get('mode') != 'plain' or info[0].get('stream') != '3' or \
            not info[0].get('machine', '').startswith(MACHINE_PREFIX):
        problems.append(f'vmigd_migration_info labels {info}')
    conns = [lab for lab, _ in families.get('vmigd_connection_sent_bytes_total',
                                               {}).get('samples', []) if lab.get('key') == key]
    if len(conns) != len(mj['connections']):
        problems.append(f'{len(conns)} vmigd_connection_sent_bytes_total series, JSON lists '
                        f'{len(mj["connections"])} connections')
    pages = value('vmigd_migration_pages_total')
    if pages is not None and not 0 < pages <= (mj['inspect'] or {}).get('pages', 0):
        problems.append(f'vmigd_migration_pages_total {pages}, JSON pages '
                        f'{(mj["inspect"] or {}).get("pages")}')
    series = series_of(families, key)
    if previous:
        for s, v in previous.items():
            if s[0].endswith('_total') and s in series and series[s] < v:
                problems.append(f'counter {s[0]}{dict(s[1])} went down: {v} -> {series[s]}')
        common = sum(1 for s in previous if s[0].endswith('_total') and s in series)
        if common < 10:
            problems.append(f'only {common} counter series in both scrapes')
    if problems:
        raise vt.HarnessError('; '.join(problems))
    return series, (f'{len(families)} families, {sum(len(f["samples"]) for f in families.values())}'
                    f' samples; {prom_bytes / MIB:.1f} MiB then JSON {mj[direction] / MIB:.1f} '
                    f'MiB {elapsed:.2f}s later; cap {mj["cap"]}')


def check_top(tb, key):
    """`vmigctl top --count 2 --interval 0.5`: two frames, a line for KEY with a rate."""
    started = time.monotonic()
    proc = tb.source.ctl('top', '--count', '2', '--interval', '0.5', timeout=20)
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise vt.HarnessError(f'top exited {proc.returncode}: {proc.stderr.strip()}')
    rx = re.compile(rf'^{re.escape(key)}\s+source\s+\[[^\]]*\]\s+([\d.]+) (B|KiB|MiB|GiB)\s+'
                    r'([\d.]+) (B|KiB|MiB|GiB)/s\s+(\S+ \S+|unlimited) / ')
    lines = [rx.match(line) for line in proc.stdout.splitlines() if line.startswith(key)]
    frames = [f for f in proc.stdout.split('\n\n') if f.strip()]
    unit = {'B': 1, 'KiB': 1 << 10, 'MiB': MIB, 'GiB': 1 << 30}
    if len(lines) != 2 or not all(lines) or len(frames) != 2:
        raise vt.HarnessError(f'top printed {len(frames)} frames, KEY lines {lines}:\n'
                              f'{proc.stdout}')
    rates = [float(m.group(3)) * unit[m.group(4)] for m in lines]
    if not all(0 < r <= CAP * 1.1 for r in rates) or lines[0].group(5) != '50.0 MiB/s':
        raise vt.HarnessError(f'top rates {vt.fmt_rates(rates)} MiB/s (cap 50), cap column '
                              f'{lines[0].group(5)!r}')
    if took < 0.4:
        raise vt.HarnessError(f'two frames 0.5 s apart took only {took:.2f}s')
    return f'2 frames in {took:.2f}s, rates {vt.fmt_rates(rates)} MiB/s'


def check_metrics_text(tb, key):
    """`vmigctl metrics`: the node, then a block for KEY with its role, cap and inspection."""
    out = tb.source.ctl_ok('metrics')
    want = [r'^node: cap unlimited, shaper bucket, inspect on, digests on$',
            rf'^{re.escape(key)} source active, mode plain',
            r'^\s+cap 50\.0 MiB/s, limit 50\.0 MiB/s',
            r'^\s+inspect: stream v3, machine pc-q35\S*, channels 1 main \+ 4 multifd',
            r'^\s+rate: tx [\d.]+ (KiB|MiB)/s \(1s\)',
            r'^\s+port 49152: sent [\d.]+ (KiB|MiB|GiB)']
    missing = [w for w in want if not re.search(w, out, re.M)]
    if missing:
        raise vt.HarnessError(f'no line like {missing} in:\n{out}')
    return f'{len(out.splitlines())} lines, all expected ones there'


# ---- inspector figures after completion ----------------------------------------------------------

def check_inspection(tb, daemon, key, channels, ram):
    """After QEMU completed, before the stops: pages and zero pages against QEMU's, in JSON and
    Prometheus, and the stream facts."""
    role = tb.side_of(daemon)
    mj = daemon.migration_metrics(key)
    families, problems, _ = scrape(tb, daemon)
    ins = (mj or {}).get('inspect')
    if not ins:
        raise vt.HarnessError(f'{daemon.name}: no inspect object for {key}: {mj}')
    if problems:
        raise vt.HarnessError(f'Prometheus format: {problems}')
    bad = []
    for what, got, qemu in (('pages', ins['pages'], ram['normal']),
                            ('zero_pages', ins['zero_pages'], ram['duplicate'])):
        # 1 %, but never less than one page: 1 % of a few dozen zero pages is under one.
        if abs(got - qemu) > max(1, PAGE_TOL * qemu):
            bad.append(f'{what} {got}, QEMU {qemu}')
        name = f'vmigd_migration_{what}_total'
        prom = vt.prom_value(families, name, key=key, role=role)
        if prom != got:
            bad.append(f'{name} {prom}, JSON {got}')
    want_channels = {'main': 1, 'multifd': channels, 'other': 0}
    if ins['channels'] != want_channels:
        bad.append(f'channels {ins["channels"]}, expected {want_channels}')
    for kind, n in want_channels.items():
        prom = vt.prom_value(families, 'vmigd_migration_inspect_channels', key=key, role=role,
                             kind=kind)
        if prom != n:
            bad.append(f'vmigd_migration_inspect_channels kind={kind} {prom}, expected {n}')
    if ins['stream_version'] != 3:
        bad.append(f'stream_version {ins["stream_version"]}')
    if not str(ins['machine']).startswith(MACHINE_PREFIX):
        bad.append(f'machine {ins["machine"]!r}')
    if ins['switchover'] is not True or vt.prom_value(
            families, 'vmigd_migration_switchover', key=key, role=role) != 1:
        bad.append(f'switchover {ins["switchover"]}')
    if ins['bytes_only'] != 0 or ins['reason'] is not None or vt.prom_value(
            families, 'vmigd_migration_inspect_bytes_only_channels', key=key, role=role) != 0:
        bad.append(f'bytes_only {ins["bytes_only"]} reason {ins["reason"]!r}')
    if ins['page_size'] != 4096 or ins['passes'] < 1 or ins['syncs'] < 1:
        bad.append(f'page_size {ins["page_size"]} passes {ins["passes"]} syncs {ins["syncs"]}')
    if bool(channels) != (ins['packets'] > 0):
        bad.append(f'{ins["packets"]} multifd packets with {channels} multifd channels')
    if bad:
        raise vt.HarnessError('; '.join(bad))
    return (f'pages {ins["pages"]} (QEMU {ram["normal"]}), zero {ins["zero_pages"]} (QEMU '
            f'{ram["duplicate"]}), channels {ins["channels"]}, {ins["machine"]}, '
            f'packets {ins["packets"]}, syncs {ins["syncs"]}')


def check_multifd_bytes(src, tb, key, ram, channels):
    """QEMU's multifd-bytes is exactly pages x page size plus a 320 + 8 x 128-byte header per
    packet (7.2), and in 10.0 also each channel's 64-byte initial packet: the inspector's
    counts must add up to it (QEMU's ram.normal can differ a little from the pages actually
    sent; this cannot). Other versions are not checked, and the result says so."""
    version = src.execute('query-version')['qemu']
    init = {(7, 2): 0, (10, 0): 64}.get((version['major'], version['minor']))
    if init is None:
        return (f'not checked: QEMU {version["major"]}.{version["minor"]}, what its '
                'multifd-bytes counts was checked for 7.2 and 10.0 only')
    bad = []
    for daemon in (tb.source, tb.target):
        ins = daemon.migration_metrics(key)['inspect']
        size = ins['pages'] * ins['page_size'] + ins['packets'] * (320 + 8 * (
            (512 << 10) // ins['page_size'])) + channels * init
        if size != ram['multifd-bytes']:
            bad.append(f'{daemon.name}: {ins["pages"]} pages, {ins["packets"]} packets and '
                       f'{channels} x {init} initial bytes make {size} bytes, QEMU '
                       f'multifd-bytes {ram["multifd-bytes"]}')
    if bad:
        raise vt.HarnessError('; '.join(bad))
    return (f'{ram["multifd-bytes"]} bytes = pages and packets on both daemons (QEMU '
            f'ram.normal {ram["normal"]})')


def inspected_migration(tb, checks, label, mib, channels, bandwidth=None, during=None,
                        guest=None, params=None):
    """A migration; `during(m)` runs while it is in flight; then the inspector checks on both
    daemons after QEMU completed and before the stops. guest: the test guest's GuestSpec (its
    RAM plain, so mostly zero pages; left paused); params: migrate-set-parameters for the
    source."""
    src, dst = tb.qemu_pair(mib, guest=guest)
    if params:
        src.execute('migrate-set-parameters', params)
    key = tb.new_key(label)
    m = tb.start_migration(src, dst, key, channels, bandwidth=bandwidth)
    try:
        if during:
            during(m)
        info = m.wait(timeout=120)
        for daemon in (tb.source, tb.target):
            checks.run(f'{label}: {daemon.name} inspector vs QEMU', check_inspection, tb, daemon,
                       key, channels, info['ram'])
        if channels:
            checks.run(f'{label}: multifd bytes add up', check_multifd_bytes, src, tb, key,
                       info['ram'], channels)
    finally:
        result = m.finish(timeout=120)
    checks.run(f'{label}: memory', lambda: f'{result.summary()}, sha256 '
               f'{vt.verify_memory(src, dst)[:12]}')
    tb.close_qemus(src, dst)


def during_capped(tb, checks):
    def run(m):
        key = m.key
        vt.wait_until(lambda: (tb.source.migration_metrics(key) or {}).get('bytes_tx', 0)
                      > 20 * MIB and len(tb.source.connections(key) or []) == 5, 30,
                      f'{key} to flow on 5 connections')
        for daemon in (tb.source, tb.target):
            checks.run(f'{daemon.name}: endpoint', check_endpoint, tb, daemon)
        previous = {tb.source.name: None, tb.target.name: None}
        for i in range(3):
            for daemon in (tb.source, tb.target):
                def one(daemon=daemon):
                    series, detail = check_scrape(tb, daemon, key, previous[daemon.name])
                    previous[daemon.name] = series
                    return detail
                checks.run(f'{daemon.name}: scrape {i + 1}', one)
            time.sleep(0.5)
        checks.run('vmigctl top', check_top, tb, key)
        checks.run('vmigctl metrics', check_metrics_text, tb, key)
        checks.run('still in flight', vt.still_in_flight, m)
    return run


# ---- families from start-up, outcomes, health --------------------------------------------------

def documented_families():
    """Every family name the "Prometheus metrics" section of doc/interfaces.md lists."""
    with open(os.path.join(vt.REPO_ROOT, 'doc', 'interfaces.md')) as f:
        doc = f.read()
    section = doc.split('\n## Prometheus metrics', 1)[1].split('\n## ', 1)[0]
    rows = [line.split('|')[1] for line in section.splitlines() if line.startswith('| `')]
    names = {n for row in rows for n in re.findall(r'`((?:vmigd|process)_[a-z0-9_]+)', row)}
    if len(names) < 60:
        raise vt.HarnessError(f'only {len(names)} families found in doc/interfaces.md')
    return names


def outcome_counts(tb, daemon):
    """{(role, outcome): count} of vmigd_migrations_total."""
    families, problems, _ = scrape(tb, daemon)
    if problems:
        raise vt.HarnessError(f'{daemon.name}: {problems}')
    return {(lab['role'], lab['outcome']): v for lab, v in
            families.get('vmigd_migrations_total', {}).get('samples', [])}


def check_health(tb, daemon, want_ready=True):
    """/healthz 200 ok; /readyz 200 ready (or 503); HEAD of both."""
    ns, url = tb.ns_of(daemon), daemon.metrics_url().replace('/metrics', '')
    got = {path: vt.http_get(ns, url + path) for path in ('/healthz', '/readyz')}
    heads = tuple(vt.http_get(ns, url + path, method='HEAD')[0] for path in got)
    want = {'/healthz': (200, 'ok\n'), '/readyz': (200, 'ready\n')}
    problems = [f'GET {path} answered {st} {body!r}, expected {want[path][0]} '
                f'{want[path][1]!r}' for path, (st, _, body) in got.items()
                if (st, body) != want[path]]
    if heads != (200, 200):
        problems.append(f'HEAD /healthz, /readyz answered {heads}')
    if problems:
        raise vt.HarnessError('; '.join(problems))
    return 'healthz 200 ok, readyz 200 ready, HEAD 200 200'


def check_idle(tb, daemon, documented):
    """An idle daemon: every documented family with HELP and TYPE, the node's counters by label
    at 0 for every label set, build_info and process_*."""
    families, problems, _ = scrape(tb, daemon)
    problems += [f'family {n}: no HELP or TYPE' for n in sorted(documented)
                 if n not in families or not families[n]['help'] or not families[n]['type']]
    problems += [f'family {n} not documented in doc/interfaces.md' for n in families
                 if n not in documented]
    counts = {(lab.get('role'), lab.get('outcome')): v for lab, v in
              families.get('vmigd_migrations_total', {}).get('samples', [])}
    want = {(r, o): 0 for r in ('source', 'target') for o in OUTCOMES}
    if counts != want:
        problems.append(f'vmigd_migrations_total {counts}, expected every role and outcome at 0')
    refusals = {lab.get('reason'): v for lab, v in
                families.get('vmigd_tls_refusals_total', {}).get('samples', [])}
    if refusals != {r: 0 for r in TLS_REASONS}:
        problems.append(f'vmigd_tls_refusals_total {refusals}')
    build = families.get('vmigd_build_info', {}).get('samples', [])
    version = daemon.status_field('version')
    if len(build) != 1 or build[0][1] != 1 or build[0][0].get('version') != version or \
            not re.fullmatch(r'tls(,dpdk)?(,libvirt)?,inspect', build[0][0].get('features', '')):
        problems.append(f'vmigd_build_info {build}, version {version}')
    proc = {n: vt.prom_value(families, n) for n in PROCESS_FAMILIES if n in families and
            families[n]['samples']}
    if not (proc.get('process_open_fds', 0) > 5 and proc.get('process_resident_memory_bytes', 0)
            > MIB and abs(proc.get('process_start_time_seconds', 0) - time.time()) < 600 and
            proc.get('process_cpu_seconds_total', -1) >= 0 and
            proc.get('process_virtual_memory_bytes', 0) > proc['process_resident_memory_bytes']):
        problems.append(f'process figures {proc}')
    if families.get('vmigd_certificate_expiry_timestamp_seconds', {}).get('samples'):
        problems.append('a certificate expiry sample on a --no-tls daemon')
    if problems:
        raise vt.HarnessError('; '.join(problems))
    return (f'{len(families)} families ({len(documented)} documented), all with HELP/TYPE; '
            f'{len(counts)} outcome and {len(refusals)} refusal series at 0; '
            f'features {build[0][0]["features"]}; {proc["process_open_fds"]:.0f} fds, '
            f'{proc["process_resident_memory_bytes"] / MIB:.1f} MiB resident')


def check_counted(tb, before, want, timeout=30):
    """Waits until each daemon's vmigd_migrations_total moved from before[name] by want[name]
    ({(role, outcome): n}; outcome '*': any outcome of that role) and by nothing else."""
    def moved(daemon):
        now = outcome_counts(tb, daemon)
        return {k: v - before[daemon.name].get(k, 0) for k, v in now.items()
                if v != before[daemon.name].get(k, 0)}
    details = []
    for daemon in (tb.source, tb.target):
        w = want[daemon.name]
        vt.wait_until(lambda d=daemon: sum(moved(d).values()) >= sum(w.values()) or None,
                      timeout, f'{daemon.name}: {sum(w.values())} migrations counted')
        time.sleep(0.2)
        delta = moved(daemon)
        rest = dict(delta)
        for (role, outcome), n in w.items():
            if outcome != '*':
                rest[(role, outcome)] = rest.get((role, outcome), 0) - n
        rest = {k: v for k, v in rest.items() if v}
        wild = {role: n for (role, outcome), n in w.items() if outcome == '*'}
        if any(v < 0 for v in rest.values()) or \
                {r: sum(v for (r2, _), v in rest.items() if r2 == r) for r in wild} != wild or \
                any(r not in wild for r, _ in rest):
            raise vt.HarnessError(f'{daemon.name}: vmigd_migrations_total moved by {delta}, '
                                  f'expected {w}')
        details.append(f'{daemon.name} ' + ', '.join(f'{r} {o} +{n:.0f}'
                                                     for (r, o), n in sorted(delta.items())))
    return '; '.join(details)


def cancelled_migration(tb, before):
    """A migration under convergence control (`source start --qmp`, predictive) that the test
    cancels on QEMU (migrate_cancel): the source counts it cancelled."""
    key = tb.new_key('cancel')
    vqmp = tb.path(f'{key}-vmigd.qmp')
    src, dst = tb.qemu_pair(256, src_args=['-qmp', f'unix:{vqmp},server=on,wait=off'])
    try:
        tb.start_migration(src, dst, key, 0, bandwidth='8Mi', max_bandwidth=1 << 40,
                           source_args=['--qmp', vqmp, '--mode', 'predictive'])
        vt.wait_until(lambda: (tb.source.migration_metrics(key) or {}).get('bytes_tx', 0)
                      > 4 * MIB, 30, f'{key} to flow')
        src.execute('migrate_cancel')
        vt.wait_until(lambda: src.migration_info().get('status') == 'cancelled' or None, 30,
                      f'{key}: QEMU to say cancelled')
        vt.wait_until(lambda: tb.source.convergence(key).get('state') == 'finished' or None,
                      15, f'{key}: the convergence outcome')
        conv = tb.source.convergence(key).get('outcome')
        tb.source.source_stop(key)
        tb.target.target_stop(key)
        detail = check_counted(tb, before, {tb.source.name: {('source', 'cancelled'): 1},
                                            tb.target.name: {('target', '*'): 1}})
    finally:
        vt.stop_quietly(key, tb.source, tb.target)
        tb.close_qemus(src, dst)
    return f'{detail}; convergence: {conv}'


class StoppedRoute:
    """A route whose connection is still open at its stop: the grace runs out, the source cuts
    it and counts it stopped (5 s later: a migration runs meanwhile)."""

    def __init__(self, tb):
        key = tb.new_key('stopped')
        self.sink = tb.unix_server(f'{key}.sock', vt.digest_all)
        entry = tb.start_route(key, self.sink.path)
        self.sock = tb.net.socket('source', socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(entry)
        self.sock.sendall(os.urandom(1 << 20))
        vt.wait_until(lambda: (tb.target.migration_metrics(key) or {}).get('bytes_rx', 0)
                      >= 1 << 20, 30, f'{key}: 1 MiB through')
        tb.source.source_stop(key)
        tb.target.target_stop(key)

    def close(self):
        self.sock.close()
        self.sink.join(60)


class ExpiringCertificate:
    """A third vmigd, with TLS, whose node certificate expires EXPIRING_IN s after its start:
    ready before, 503 with the reason after."""

    def __init__(self, tb):
        pki = vt.make_pki(tb.path('pki-expiring'))
        self.not_after = int(time.time()) + EXPIRING_IN
        leaf = vt.leaf_until(pki, 'short', self.not_after)
        tls = vt.install_tls(tb.path('tls-expiring'), leaf, pki.ca)
        self.d = tb.extra_daemon('vmigd-expiring', 'source', args=['--metrics', '127.0.0.1:0'],
                                 tls=tls)
        self.ns = tb.ns_of(tb.source)
        self.base = self.d.metrics_url().replace('/metrics', '')
        self.ca_after = calendar.timegm(time.strptime(
            vt.tls.cert_info(pki.ca)['not_after'], '%b %d %H:%M:%S %Y %Z'))

    def before(self):
        families, problems, _ = scrape_url(self.ns, self.d.metrics_url())
        got = {lab.get('cert'): v for lab, v in families.get(
            'vmigd_certificate_expiry_timestamp_seconds', {}).get('samples', [])}
        ready = vt.http_get(self.ns, self.base + '/readyz')
        if self.not_after - time.time() < 1:
            raise vt.HarnessError('the daemon took too long to start: its certificate expired')
        if got != {'node': self.not_after, 'ca': self.ca_after} or problems or \
                ready[::2] != (200, 'ready\n'):
            raise vt.HarnessError(f'expiry {got}, expected node {self.not_after} ca '
                                  f'{self.ca_after}; readyz {ready[::2]}; {problems}')
        return f'expiry node {self.not_after}, ca {self.ca_after}; readyz 200 ready'

    def after(self):
        left = self.not_after - time.time()
        if left > -1:
            time.sleep(left + 1)
        ready = vt.http_get(self.ns, self.base + '/readyz')
        head = vt.http_get(self.ns, self.base + '/readyz', method='HEAD')[0]
        health = vt.http_get(self.ns, self.base + '/healthz')
        want = f'tls: the node certificate expired at {self.not_after} (Unix time)\n'
        if ready[::2] != (503, want) or head != 503 or health[::2] != (200, 'ok\n'):
            raise vt.HarnessError(f'readyz {ready[::2]}, HEAD {head}, expected 503 {want!r}; '
                                  f'healthz {health[::2]}')
        rc = self.d.stop()
        if rc != 0:
            raise vt.HarnessError(f'vmigd-expiring exited {rc}')
        return f'readyz 503 {ready[2].strip()!r}, HEAD 503, healthz still 200'


def scrape_url(ns, url):
    status, headers, body = vt.http_get(ns, url)
    if status != 200:
        raise vt.HarnessError(f'GET {url} answered {status}')
    families, problems = vt.parse_prometheus(body)
    return families, problems, headers


# ---- streams that are not QEMU's -----------------------------------------------------------------

def raw_stream(tb, label, payload, kind, reason_rx):
    """Send payload through a migration with no QEMU; while the connection is open its inspect
    must say kind / bytes_only / a reason matching reason_rx; after, the summary must count it;
    the bytes must arrive unchanged."""
    key = tb.new_key(label)
    sink = tb.unix_server(f'{key}.sock', vt.digest_all)
    entry = tb.start_route(key, sink.path)
    problems = []
    with tb.net.socket('source', socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(entry)
        s.sendall(payload)

        def passed(daemon, field):
            mj = daemon.migration_metrics(key) or {}
            conns = mj.get('connections') or []
            return conns if conns and conns[0].get(field, 0) >= len(payload) else None
        for daemon, field in ((tb.source, 'bytes_tx'), (tb.target, 'bytes_rx')):
            conns = vt.wait_until(lambda: passed(daemon, field), 30,
                                  f'{daemon.name} to pass {len(payload)} bytes of {key}')
            ins = conns[0].get('inspect') or {}
            if ins.get('kind') != kind or ins.get('bytes_only') is not True or \
                    not re.search(reason_rx, str(ins.get('reason'))):
                problems.append(f'{daemon.name} open connection inspect {ins}, expected kind '
                                f'{kind}, bytes_only, reason /{reason_rx}/')
        s.shutdown(socket.SHUT_WR)
        vt.wait_closed(s, 30)
    (digest, count), = sink.join(60)
    if (digest, count) != (hashlib.sha256(payload).hexdigest(), len(payload)):
        problems.append(f'{count} bytes arrived, sent {len(payload)}; digest '
                        f'{"differs" if count == len(payload) else "-"}')
    want = {'main': int(kind == 'main'), 'multifd': 0, 'other': int(kind == 'other')}
    for daemon in (tb.source, tb.target):
        mj = daemon.migration_metrics(key) or {}
        ins = mj.get('inspect') or {}
        if ins.get('channels') != want or ins.get('bytes_only') != 1 or \
                not re.search(reason_rx, str(ins.get('reason'))) or ins.get('pages') != 0:
            problems.append(f'{daemon.name} summary {ins}, expected channels {want}, '
                            f'bytes_only 1, reason /{reason_rx}/, no pages')
        families, fmt, _ = scrape(tb, daemon)
        role = tb.side_of(daemon)
        got = (vt.prom_value(families, 'vmigd_migration_inspect_channels', key=key, role=role,
                             kind=kind),
               vt.prom_value(families, 'vmigd_migration_inspect_bytes_only_channels', key=key,
                             role=role))
        if got != (1, 1) or fmt:
            problems.append(f'{daemon.name} Prometheus channels kind={kind} and bytes-only '
                            f'{got}, expected (1, 1); format {fmt}')
    tb.source.source_stop(key)
    tb.target.target_stop(key)
    if problems:
        raise vt.HarnessError('; '.join(problems))
    return f'{count} bytes intact, kind {kind}, reason {ins.get("reason")!r}'


# ---- --no-inspect --------------------------------------------------------------------------------

def no_inspect(tb, checks):
    for side in ('source', 'target'):
        tb.replace_daemon(side, args=[*tb.daemon_args[side], '--no-inspect'],
                          name=f'vmigd-{side}-noinspect')
    src, dst = tb.qemu_pair(256)
    key = tb.new_key('noinspect')
    m = tb.start_migration(src, dst, key, 4, bandwidth='100Mi')

    def during():
        vt.wait_until(lambda: len(tb.source.connections(key) or []) == 5, 30,
                      f'{key} on 5 connections')
        problems = []
        for daemon in (tb.source, tb.target):
            js = daemon.metrics()
            mj = daemon.migration_metrics(key, js) or {}
            st = daemon.status_field('inspect')
            if js['node'].get('inspect') is not False or st is not False:
                problems.append(f'{daemon.name}: node inspect {js["node"].get("inspect")}, '
                                f'status inspect {st}')
            if mj.get('inspect') is not None or not mj.get('connections') or \
                    any(c.get('inspect') is not None for c in mj['connections']):
                problems.append(f'{daemon.name}: inspect {mj.get("inspect")!r}, connections '
                                f'{[c.get("inspect") for c in mj.get("connections", [])]}')
            families, fmt, _ = scrape(tb, daemon)
            info = [lab for lab, _ in families['vmigd_node_info']['samples']]
            leaked = [n for n in INSPECT_FAMILIES
                      if any(lab.get('key') == key for lab, _ in
                             families.get(n, {}).get('samples', []))]
            if info != [{'shaper': 'bucket', 'inspect': 'off'}] or leaked or fmt:
                problems.append(f'{daemon.name}: node_info {info}, inspector series {leaked}, '
                                f'format {fmt}')
            if not daemon.log_matches(r'bandwidth: node cap .*inspection off'):
                problems.append(f'{daemon.name}: no "inspection off" start line')
        if problems:
            raise vt.HarnessError('; '.join(problems))
        return 'inspect null on both daemons (JSON, status, Prometheus), "inspection off"'
    checks.run('no-inspect: while in flight', during)
    checks.run('no-inspect: still in flight', vt.still_in_flight, m)
    result = m.finish(timeout=120)
    checks.run('no-inspect: completed, memory', lambda: f'{result.summary()}, sha256 '
               f'{vt.verify_memory(src, dst)[:12]}')
    tb.close_qemus(src, dst)


def zero_pages(tb, checks):
    """A guest whose RAM is mostly zero pages, multifd 4: where QEMU finds them (9.0+'s
    zero-page-detection: 'multifd', in the multifd threads, the default; 'legacy', on the main
    channel; 'none', sent as data) and 7.2 (always the main channel)."""
    major_minor = vt.qemu_version(tb.qemu)[:2]
    guest = vt.GuestSpec(ws_mib=4, rate_mib_s=0)
    if major_minor < (9, 0):
        vt.log(f'[zero pages] 256 MiB of mostly zero pages, 4 channels; QEMU '
               f'{major_minor[0]}.{major_minor[1]} has no zero-page-detection (9.0+): its '
               'zero pages go on the main channel')
        inspected_migration(tb, checks, 'zero', 256, 4, guest=guest)
        return
    for mode in ('multifd', 'legacy', 'none'):
        vt.log(f'[zero pages] 256 MiB of mostly zero pages, 4 channels, zero-page-detection '
               f'{mode}')
        inspected_migration(tb, checks, f'zero-{mode}', 256, 4, guest=guest,
                            params={'zero-page-detection': mode})


def main():
    started = time.monotonic()
    checks = vt.Checks('metrics checks')
    with vt.Testbed(daemon_args=['--metrics', '127.0.0.1:0']) as tb:
        vt.log(f'{tb.describe()}; metrics on 127.0.0.1 in each')
        vt.log('[idle] families from start-up, health')
        documented = documented_families()
        for daemon in (tb.source, tb.target):
            checks.run(f'{daemon.name}: idle families', check_idle, tb, daemon, documented)
            checks.run(f'{daemon.name}: health', check_health, tb, daemon)
        vt.log(f'[readyz] a TLS vmigd whose certificate expires {EXPIRING_IN} s after start')
        expiring = ExpiringCertificate(tb)
        checks.run('expiring certificate: before', expiring.before)
        counts = {d.name: outcome_counts(tb, d) for d in (tb.source, tb.target)}
        vt.log('[multifd] 512 MiB, 4 channels, capped at 50Mi')
        inspected_migration(tb, checks, 'multifd4', 512, 4, bandwidth='50Mi',
                            during=during_capped(tb, checks))
        checks.run('multifd4: counted completed', check_counted, tb, counts,
                   {tb.source.name: {('source', 'completed'): 1},
                    tb.target.name: {('target', 'completed'): 1}})
        vt.log('[stopped] a route stopped with its connection open; its grace runs out during '
               'the next migration')
        counts = {d.name: outcome_counts(tb, d) for d in (tb.source, tb.target)}
        stopped = StoppedRoute(tb)
        vt.log('[multifd off] 256 MiB')
        inspected_migration(tb, checks, 'mfdoff', 256, 0)
        checks.run('mfdoff and the stopped route: counted', check_counted, tb, counts,
                   {tb.source.name: {('source', 'completed'): 1, ('source', 'stopped'): 1},
                    tb.target.name: {('target', 'completed'): 1, ('target', '*'): 1}})
        stopped.close()
        vt.log('[cancelled] a migration under convergence control, cancelled on QEMU')
        counts = {d.name: outcome_counts(tb, d) for d in (tb.source, tb.target)}
        checks.run('cancelled: counted', cancelled_migration, tb, counts)
        zero_pages(tb, checks)
        vt.log('[not QEMU] raw byte streams')
        noise = b'\x00RAW' + os.urandom(RAW_PAYLOAD - 4)
        checks.run('random bytes', raw_stream, tb, 'rawbytes', noise, 'other',
                   r'unrecognised stream start 00 52 41 57')
        qevm2 = b'QEVM\x00\x00\x00\x02' + os.urandom(RAW_PAYLOAD - 8)
        checks.run('QEVM version 2', raw_stream, tb, 'qevm2', qevm2, 'main',
                   r'^main: stream version 2')
        vt.log('[--no-inspect] 256 MiB, 4 channels, capped at 100Mi')
        no_inspect(tb, checks)
        checks.run('expiring certificate: after', expiring.after)
        tb.stop_daemons()
    vt.log(f'{checks.count} checks in {time.monotonic() - started:.1f}s')
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
