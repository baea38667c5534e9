#!/usr/bin/env python3
"""Integration test: 21 QEMU migrations through two vmigd daemons in two network namespaces with
mutual TLS on the node hop (7 with one connection each side: multifd off or 1 channel; 7 with 8
and 7 with 16 multifd channels; 128 MiB guests, one of each group 256 MiB), then two with TLS
session resumption off on the source. Each must complete with identical guest memory, ok stop
lines and one `linked ... tls=TLSv1.x` line per QEMU channel on both daemons. One capped migration
per group is watched through `status` while it runs and its node-hop traffic is captured: no guest
page may cross in plain text (a --no-tls migration at the end shows that the capture would see
them). Later migrations must resume TLS sessions, the ones with --no-tls-resumption none."""

import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

WATCH_BANDWIDTH = 32 << 20          # ~4 s for 128 MiB: long enough to watch status (and sniff)
SNIFF_LIMIT, SNIFF_MIN = 2 << 20, 1 << 20   # node-hop bytes captured on a watched migration
# (multifd channels (0 = off), watched through status while capped, guest RAM MiB)
PLAN = ([(0, True, 128), (1, False, 128), (0, False, 128), (1, False, 128), (0, False, 128),
         (1, False, 128), (0, False, 256)]
        + [(8, True, 128)] + [(8, False, 128)] * 5 + [(8, False, 256)]
        + [(16, True, 128)] + [(16, False, 128)] * 5 + [(16, False, 256)])


def check_linked(daemon, role, key, channels):
    """The `linked` lines of KEY on one daemon: one per QEMU channel, sequence numbers 0..N, each
    with TLS 1.x, a cipher, crypto=, resumed=yes|no and the peer's name. (problems, records)."""
    problems, where = [], f'{daemon.name} {key}'
    recs = daemon.linked(key, role)
    seqs = sorted(r['seq'] for r in recs)
    if seqs != list(range(channels + 1)):
        problems.append(f'{where}: linked lines for sequence numbers {seqs}, expected '
                        f'0..{channels}')
    for r in recs:
        bad = []
        if not r.get('tls', '').startswith('TLSv1.'):
            bad.append('tls=TLSv1.x')
        if not r.get('cipher'):
            bad.append('cipher')
        if r.get('crypto') not in vt.CRYPTO_MODES:
            bad.append('crypto')
        if r.get('resumed') not in ('yes', 'no'):
            bad.append('resumed')
        if vt.NODE_CN not in r.get('peer', ''):
            bad.append('peer')
        if bad:
            problems.append(f'{where}: linked line with bad {",".join(bad)}: {r["line"]}')
    return problems, recs


def check_record(tb, result):
    problems, linked = [], {}
    for daemon, role in tb.sides():
        rec = daemon.stop_record(result.key, role)
        where = f'{daemon.name} {result.key}'
        if rec.get('outcome') != 'ok':
            problems.append(f'{where}: stop line says outcome={rec.get("outcome")}')
        if int(rec.get('conns', -1)) != result.channels + 1:
            problems.append(f'{where}: conns={rec.get("conns")}, expected {result.channels + 1}')
        if int(rec.get('bytes', -1)) < result.bytes:
            problems.append(f'{where}: bytes={rec.get("bytes")}, fewer than QEMU\'s '
                            f'{result.bytes}')
        problems += [f'{where}: {line}' for line in daemon.problem_lines(result.key)
                     if ': error:' in line.lower()]
        found, recs = check_linked(daemon, role, result.key, result.channels)
        problems += found
        linked[role] = recs
    return problems, linked


def watch_status(tb, m):
    """Poll both daemons' status while m runs until each lists all of m's connections linked
    with TLS. Returns problems (empty: both seen)."""
    want = m.channels + 1
    seen, last, text = {}, {}, {}

    def good(conns):
        return (conns is not None and len(conns) == want
                and all(c.get('state') == 'linked' and str(c.get('tls', '')).startswith('TLSv1.')
                        and c.get('crypto') in vt.CRYPTO_MODES and c.get('cipher')
                        and isinstance(c.get('resumed'), bool) for c in conns))
    while m.status() in ('setup', 'active') and len(seen) < 2:
        for daemon in (tb.source, tb.target):
            if daemon.name in seen:
                continue
            conns = daemon.connections(m.key)
            last[daemon.name] = conns
            if good(conns):
                seen[daemon.name] = conns
                text[daemon.name] = daemon.ctl_ok('status')
        time.sleep(0.1)
    problems = []
    for daemon in (tb.source, tb.target):
        if daemon.name not in seen:
            problems.append(f'{daemon.name} {m.key}: status never listed {want} linked TLS '
                            f'connections while the migration ran; last: {last.get(daemon.name)}')
        else:
            c = seen[daemon.name][0]
            vt.log(f'    status {daemon.name}: {want} connections linked, e.g. {c}')
            # The text form: one line per open connection, `  KEY ROLE port=P seq=S STATE
            # tls=VERSION cipher=C crypto=... resumed=...`.
            lines = [line for line in text[daemon.name].splitlines()
                     if line.split()[:1] == [m.key]]
            if len(lines) < want or not all(re.search(r' seq=\d+ .*tls=TLSv1\.\d cipher=\S+ '
                                                      r'crypto=\S+ resumed=(yes|no)', line)
                                            for line in lines):
                problems.append(f'{daemon.name} {m.key}: `vmigctl status` shows these lines for '
                                f'the migration, expected {want} with tls=TLSv1.x: {lines}')
    return problems


def sniffed(tb, m, mib, sniffer, tls, problems):
    """Check what the sniffer saw of m's node hop: with TLS no guest page may cross in plain
    text; without, some must (proof that the check can see them). Returns a summary."""
    hits = vt.plaintext_hits(sniffer.payload, vt.ram_page_prefixes(mib))
    seen = f'{len(sniffer.payload)} node-hop bytes captured, {hits} plain-text guest pages'
    if len(sniffer.payload) < SNIFF_MIN:
        problems.append(f'{m.key}: only {len(sniffer.payload)} node-hop bytes captured, too few '
                        'to check the encryption')
    elif tls and hits:
        problems.append(f'{m.key}: {hits} guest pages crossed the TLS node hop in plain text')
    elif not tls and not hits:
        problems.append(f'{m.key}: no guest page found in a plain-text node hop: the encryption '
                        'check cannot see plain text')
    return seen


def migrate(tb, n, total, channels, watch, problems, label='tls', mib=128, tls=True):
    src, dst = tb.qemu_pair(mib)
    key = tb.new_key(f'{label}-mfd{channels}')
    kw = {'max_bandwidth': WATCH_BANDWIDTH} if watch else {}
    m = tb.start_migration(src, dst, key, channels, **kw)
    if watch:
        with vt.Sniffer(tb.net.target_ns, tb.net.target_if, m.target['port'],
                        limit=SNIFF_LIMIT) as sniffer:
            problems += watch_status(tb, m) if tls else []
            result = m.finish(timeout=180)
        vt.log(f'    {sniffed(tb, m, mib, sniffer, tls, problems)}')
    else:
        result = m.finish(timeout=180)
    digest = vt.verify_memory(src, dst)
    if not tls:
        vt.log(f'[{n}/{total}] ok {result.summary()} sha256 {digest[:12]} (plain text)')
        tb.close_qemus(src, dst)
        return {}
    found, linked = check_record(tb, result)
    problems += found
    resumed = {role: sum(r.get('resumed') == 'yes' for r in recs)
               for role, recs in linked.items()}
    tlsv = sorted({str(r.get('tls')) for recs in linked.values() for r in recs})
    crypto = sorted({str(r.get('crypto')) for recs in linked.values() for r in recs})
    state = 'ok' if not found else f'QEMU ok, {len(found)} daemon problem(s)'
    vt.log(f'[{n}/{total}] {state} {result.summary()} sha256 {digest[:12]} {",".join(tlsv)} '
           f'crypto={",".join(crypto)} resumed source={resumed.get("source")} '
           f'target={resumed.get("target")}')
    for p in found:
        vt.log(f'    {p}')
    tb.close_qemus(src, dst)
    return resumed


def check_tls_status(daemon, pki, problems):
    tls = daemon.status_field('tls')
    if not isinstance(tls, dict) or tls.get('enabled') is not True or \
            tls.get('generation') != 1 or not vt.shows_serial(tls.get('certificate'),
                                                              pki.node.serial):
        problems.append(f'{daemon.name}: status tls = {tls!r}, expected enabled, generation 1, '
                        f'certificate with serial {pki.node.serial}')


def main():
    started = time.monotonic()
    problems = []
    with vt.Testbed(tls=True) as tb:
        pki = tb.pki
        vt.log(f'{tb.describe()}; mutual TLS, node certificate serial {pki.node.serial}')
        for daemon in (tb.source, tb.target):
            check_tls_status(daemon, pki, problems)
        resumed = {'source': 0, 'target': 0}
        for n, (channels, watch, mib) in enumerate(PLAN, 1):
            counts = migrate(tb, n, len(PLAN), channels, watch, problems, mib=mib)
            if n > 1:
                for role in resumed:
                    resumed[role] += counts.get(role) or 0
        vt.log(f'resumed connections in migrations 2..{len(PLAN)}: {resumed}')
        for role, count in resumed.items():
            if count == 0:
                problems.append(f'no {role} linked line says resumed=yes in migrations '
                                f'2..{len(PLAN)}, though resumption is on by default')

        args = [*tb.daemon_args['source'], '--no-tls-resumption']
        tb.replace_daemon('source', args=args, name='vmigd-source-noresume')
        vt.log('source restarted with --no-tls-resumption')
        for i in range(2):
            counts = migrate(tb, len(PLAN) + 1 + i, len(PLAN) + 2, 8, False, problems,
                             label='noresume')
            if any(counts.values()):
                problems.append(f'--no-tls-resumption on the source, yet connections were '
                                f'resumed: {counts}')

        refusals = [line for d in (*tb.retired, tb.source, tb.target)
                    for line in d.log_text().splitlines() if 'TLS refused' in line]
        if refusals:
            problems.append(f'{len(refusals)} TLS refusals logged, e.g. {refusals[0]}')
        warnings = [line for d in (*tb.retired, tb.source, tb.target)
                    for line in d.problem_lines()]
        if warnings:
            vt.log('daemon warnings and errors:\n' + '\n'.join(warnings))
        # The control for the sniffer: the same migration with --no-tls daemons must show guest
        # pages in plain text.
        for side in ('source', 'target'):
            tb.replace_daemon(side, tls=False, name=f'vmigd-{side}-plain')
        migrate(tb, 'control', 'control', 8, True, problems, label='plain', tls=False)
        tb.stop_daemons()
    vt.log(f'{len(PLAN) + 2} TLS migrations completed with identical memory in '
           f'{time.monotonic() - started:.1f}s')
    if problems:
        raise vt.HarnessError(f'{len(problems)} problem(s) in the daemons\' account:\n  '
                              + '\n  '.join(problems))


if __name__ == '__main__':
    vt.run_main(main)
