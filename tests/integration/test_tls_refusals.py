#!/usr/bin/env python3
"""Integration test: what the TLS node hop refuses. While a capped 3-channel TLS migration is in
flight, raw clients in the source namespace probe the target's node-hop port: a certificate from
another CA, an expired one, one not yet valid, one without clientAuth, none at all, one with a
name outside the allow-list, a plain-text preamble, a silent TCP client (handshake timeout), a
client that completes TLS but sends no preamble (preamble timeout) and a burst of silent clients
over --max-unauthenticated. Each must be refused with its log token and its connection must fail
or be closed, and the migration must complete with identical memory. Then, with running source
guests: a source daemon that does not trust the target's CA refuses it and the migration fails
with the guest at home; and, the target restarted with --max-migration-conns 4 alone, 8 multifd
channels fail cleanly, after which a 2-channel migration through the same daemons completes.
After the target-side probes, the target's refusals by reason (`metrics --json` node
tls_refusals, the figures of vmigd_tls_refusals_total) count each probe's token, and every
reason is listed."""

import os
import re
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

HANDSHAKE_MS = PREAMBLE_MS = 1500
MAX_UNAUTH, MAX_MIGRATION_CONNS = 8, 4
TARGET_ARGS = ['--handshake-timeout', str(HANDSHAKE_MS), '--preamble-timeout', str(PREAMBLE_MS),
               '--max-unauthenticated', str(MAX_UNAUTH)]
# For (i) the target is restarted with only this: 9 connections at once would be over
# --max-unauthenticated 8 before the per-migration limit could be reached.
LIMIT_TARGET_ARGS = ['--max-migration-conns', str(MAX_MIGRATION_CONNS)]
LIVE_MIB, LIVE_CHANNELS = 256, 3            # 4 connections at once
LIVE_BANDWIDTH = 14 << 20                   # ~18 s: the probes run while it is in flight
FLOOD = 12                                  # silent connections at once from one address
TIMEOUT_WINDOW = (HANDSHAKE_MS / 1000 - 0.2, HANDSHAKE_MS / 1000 + 2.0)   # "closed within"
TARGET_REFUSED = r'node hop from \S+: TLS refused \({}\)'



# ---- target-side probes --------------------------------------------------------------------------

def refused_cert(tb, addr, port, certfiles, token):
    """A client presenting certfiles (None: no certificate) must not get through: its handshake
    fails, or an alert or a close follows it, and the target logs `TLS refused (token)`."""
    since = tb.target.log_offset()
    cert, key = (certfiles.cert, certfiles.key) if certfiles else (None, None)
    ok, probe = vt.probe_tls_accepted(tb.net.source_ns, addr, port, cert, key, tb.pki.ca)
    if ok or not probe.refused:
        raise vt.HarnessError(f'not refused: {probe}')
    m = tb.target.wait_log(TARGET_REFUSED.format(token), timeout=5, since=since)
    return f'{probe}; log: {m.string.split(": ", 2)[-1]}'


def accepted_cert(tb, addr, port):
    """The positive control: the node certificate gets the "unknown key" reply over TLS."""
    since = tb.target.log_offset()
    ok, probe = vt.probe_tls_accepted(tb.net.source_ns, addr, port, tb.pki.node.cert,
                                      tb.pki.node.key, tb.pki.ca)
    if not ok:
        raise vt.HarnessError(f'the node certificate was not accepted: {probe}')
    refusals = tb.target.log_matches(TARGET_REFUSED.format(r'[\w-]+'), since)
    if refusals:
        raise vt.HarnessError(f'accepted, but the target logged {refusals[0].group(0)}')
    return f'accepted: {probe}'


def plain_preamble(tb, addr, port):
    """A --no-tls source's first bytes (a plain preamble) are not TLS: refused (protocol) and
    closed, with no VMGR reply."""
    since = tb.target.log_offset()
    sock = tb.net.socket('source')
    try:
        sock.settimeout(5)
        sock.connect((addr, port))
        sock.sendall(vt.node_hop_preamble('plain-text-source'))
        data, took = b'', None
        started = time.monotonic()
        while time.monotonic() - started < 5:
            try:
                chunk = sock.recv(4096)
            except socket.timeout:
                break
            except OSError:
                chunk = b''
            if not chunk:
                took = time.monotonic() - started
                break
            data += chunk
    finally:
        sock.close()
    if took is None:
        raise vt.HarnessError('still open 5 s after a plain-text preamble')
    if vt.reply_status(data) is not None:
        raise vt.HarnessError(f'the target answered a plain-text preamble: {data.hex()}')
    tb.target.wait_log(TARGET_REFUSED.format('protocol'), timeout=3, since=since)
    return f'closed after {took:.2f}s ({len(data)} bytes back: a TLS alert at most)'


def silent_tcp(tb, addr, port):
    """A TCP client that never starts TLS is closed after --handshake-timeout."""
    since = tb.target.log_offset()
    sock = tb.net.socket('source')
    try:
        sock.settimeout(5)
        sock.connect((addr, port))
        took = vt.wait_closed(sock, 8)
    finally:
        sock.close()
    if took is None:
        raise vt.HarnessError('still open 8 s after connect')
    if not TIMEOUT_WINDOW[0] <= took <= TIMEOUT_WINDOW[1]:
        raise vt.HarnessError(f'closed after {took:.2f}s, expected {TIMEOUT_WINDOW[0]:.1f}-'
                              f'{TIMEOUT_WINDOW[1]:.1f}s (--handshake-timeout {HANDSHAKE_MS})')
    tb.target.wait_log(TARGET_REFUSED.format('handshake-timeout'), timeout=3, since=since)
    return f'closed by the target after {took:.2f}s, handshake-timeout logged'


def no_preamble(tb, addr, port, partial):
    """A client that completes TLS with the node certificate, then sends `partial` bytes of a
    preamble and nothing more, is closed after --preamble-timeout."""
    since = tb.target.log_offset()
    probe = vt.tls_connect(tb.net.source_ns, addr, port, tb.pki.node.cert, tb.pki.node.key,
                           tb.pki.ca, send=vt.node_hop_preamble('no-such-key')[:partial],
                           wait=8, read=1)
    if not probe.handshake:
        raise vt.HarnessError(f'the TLS handshake failed: {probe}')
    if probe.outcome not in ('closed', 'alert'):
        raise vt.HarnessError(f'not closed by the target: {probe}')
    if not TIMEOUT_WINDOW[0] <= probe.seconds <= TIMEOUT_WINDOW[1] + 0.5:
        raise vt.HarnessError(f'closed after {probe.seconds:.2f}s, expected about '
                              f'{PREAMBLE_MS} ms: {probe}')
    tb.target.wait_log(rf'node hop from \S+: no complete preamble within {PREAMBLE_MS} ms '
                       rf'\({partial} bytes\); dropped', timeout=3, since=since)
    return f'{probe}; preamble timeout logged with {partial} bytes'


def unauthenticated_flood(tb, addr, port):
    """FLOOD silent TCP connections at once from one address: past
    --max-unauthenticated its oldest are closed at once, the others at the handshake timeout."""
    since = tb.target.log_offset()
    socks, closed = [], {}
    base = time.monotonic()
    try:
        for _ in range(FLOOD):
            s = tb.net.socket('source')
            socks.append(s)
            s.settimeout(5)
            try:
                s.connect((addr, port))
            except (ConnectionResetError, ConnectionRefusedError):
                closed[s] = time.monotonic() - base     # reset before connect() returned
        while len(closed) < len(socks) and time.monotonic() - base < 8:
            for s in vt.peer_closed([s for s in socks if s not in closed], 0.05):
                closed[s] = time.monotonic() - base
    finally:
        for s in socks:
            s.close()
    times = sorted(closed.values())
    at_once = [t for t in times if t < 1.0]
    excess = FLOOD - MAX_UNAUTH
    desc = ' '.join(f'{t:.2f}' for t in times)
    if len(at_once) < excess:
        raise vt.HarnessError(f'{len(at_once)} of {FLOOD} closed within 1 s, expected at least '
                              f'{excess} (over --max-unauthenticated {MAX_UNAUTH}); closed after '
                              f'[{desc}]s')
    if len(times) < FLOOD:
        raise vt.HarnessError(f'{FLOOD - len(times)} connections still open 8 s later')
    evicted = (r'node hop from \S+: closed the oldest unauthenticated connection from \S+ '
               r'\(too-many-unauthenticated\)')
    lines = tb.target.log_matches(evicted, since)
    if not lines:
        tb.target.wait_log(evicted, timeout=2, since=since)
    return (f'{len(at_once)} closed within 1 s, all {FLOOD} closed after [{desc}]s; '
            f'{len(lines)} too-many-unauthenticated lines')


def finish_ok(tb, m, src, dst, what):
    result, digest = m.finish_verified(timeout=120)
    for daemon, role, rec in m.stop_records():
        if rec.get('outcome') != 'ok' or int(rec.get('conns', -1)) != m.channels + 1:
            raise vt.HarnessError(f'{daemon.name}: {m.key} stop line {rec}')
        linked = daemon.linked(m.key, role)
        if len(linked) != m.channels + 1 or \
                not all(r.get('tls', '').startswith('TLSv1.') for r in linked):
            raise vt.HarnessError(f'{daemon.name}: {m.key} linked lines '
                                  f'{[r["line"] for r in linked]}')
    return f'{what} completed: {result.summary()}, memory sha256 {digest[:16]}'


# ---- failing migrations --------------------------------------------------------------------------

def source_untrusts_target(tb):
    """A source daemon whose CA did not sign the target's certificate refuses the target: the
    source logs untrusted-ca and QEMU's migration fails with its guest still running."""
    pki = tb.pki
    wrong = tb.extra_daemon('vmigd-source-wrongca', 'source',
                            tls={'cert': pki.node.cert, 'key': pki.node.key, 'ca': pki.other_ca})
    src, dst = tb.qemu_pair(128, private=True)
    src.execute('cont')
    key = tb.new_key('wrongca')
    since = tb.target.log_offset()
    m = vt.start_via_daemons(src, dst, wrong, tb.target, key, tb.path('src'),
                             tb.path('dst', f'{key}.sock'), channels=0)
    try:
        err = vt.wait_failed_at_home(src)
        line = wrong.wait_log(rf'migration {key} role=source: port \d+ connection \d+ to \S+: '
                              r'TLS refused \(untrusted-ca\)', timeout=5)
        theirs = [x.group(0) for x in tb.target.log_matches(r'TLS refused \([\w-]+\)', since)]
        if tb.target.linked(key):
            raise vt.HarnessError('the target linked a connection of it')
    finally:
        wrong.source_stop(key)
        tb.target.target_stop(key)
        tb.close_qemus(src, dst)
    return (f'QEMU failed ({err}), guest running; source: {line.string.split(": ", 2)[-1]}; '
            f'target: {theirs or "nothing"}')


def over_migration_limit(tb):
    """8 multifd channels (9 connections) against a target with --max-migration-conns 4: refused
    with migration-conn-limit, QEMU's migration fails with its guest running; both daemons live
    on."""
    src, dst = tb.qemu_pair(128, private=True)
    src.execute('cont')
    key = tb.new_key('overlimit')
    m = tb.start_migration(src, dst, key, 8)
    try:
        err = vt.wait_failed_at_home(src)
        pattern = rf'migration {key} role=(target|source):.*refused \(migration-conn-limit\)'
        try:
            line = tb.target.wait_log(pattern, timeout=5)
        except vt.HarnessError:
            line = tb.source.wait_log(pattern, timeout=1)
        for daemon in (tb.source, tb.target):
            vt.answers(daemon)
    finally:
        vt.stop_quietly(key, tb.source, tb.target)
        tb.close_qemus(src, dst)
    stops = [f'{d.name}: {d.stop_record(key, role).get("outcome")}'
             for d, role in tb.sides()]
    return (f'QEMU failed ({err}), guest running; {line.string.split(": ", 2)[-1]}; stop lines '
            f'{stops}')


def after_limit(tb):
    src, dst = tb.qemu_pair(128)
    m = tb.start_migration(src, dst, tb.new_key('after-limit'), 2)
    try:
        return finish_ok(tb, m, src, dst, '2-channel migration')
    finally:
        tb.close_qemus(src, dst)


def refusal_counts(tb, tokens):
    """The target's tls_refusals: every reason listed, each probed token counted at least once,
    and no fewer than the `TLS refused (REASON)` lines it logged (its log is rate-limited)."""
    got = tb.target.metrics()['node']['tls_refusals']
    logged = {}
    for line in tb.target.log_text().splitlines():
        for token in re.findall(r'TLS refused \((\S+)\)', line):
            logged[token] = logged.get(token, 0) + 1
    reasons = {'no-certificate', 'untrusted-ca', 'expired', 'not-yet-valid', 'bad-purpose',
               'name-not-allowed', 'peer-refused', 'protocol', 'closed', 'handshake-timeout',
               'silent'}
    problems = []
    if set(got) != reasons:
        problems.append(f'reasons {sorted(got)}, expected {sorted(reasons)}')
    problems += [f'{t}: {got.get(t)} counted, probed' for t in tokens if not got.get(t)]
    problems += [f'{t}: {got.get(t)} counted, {n} logged' for t, n in logged.items()
                 if got.get(t, 0) < n]
    if problems:
        raise vt.HarnessError('; '.join(problems))
    return ', '.join(f'{t} {n}' for t, n in sorted(got.items()) if n)


# ---- main ----------------------------------------------------------------------------------------

def main():
    checks = vt.Checks('cases')
    with vt.Testbed(tls=True, target_args=TARGET_ARGS) as tb:
        pki = tb.pki
        src, dst = tb.qemu_pair(LIVE_MIB)
        m = tb.start_migration(src, dst, tb.new_key('live'), LIVE_CHANNELS,
                               max_bandwidth=LIVE_BANDWIDTH)
        m.wait_active()
        vt.wait_until(lambda: len(tb.target.linked(m.key)) == LIVE_CHANNELS + 1, 15,
                      'the target to link every connection of the live migration')
        addr, port = m.target['address'], m.target['port']
        vt.log(f'migration {m.key} in flight over TLS; target node hop {addr}:{port}')

        checks.run('good node certificate (control)', accepted_cert, tb, addr, port)
        cases = [('(a) certificate from another CA', pki.rogue, 'untrusted-ca'),
                 ('(b) expired certificate', pki.expired, 'expired'),
                 ('(c) no client certificate', None, 'no-certificate'),
                 ('(d) right CA, name not allowed', pki.badname, 'name-not-allowed'),
                 ('    not yet valid', pki.not_yet_valid, 'not-yet-valid'),
                 ('    serverAuth only', pki.serveronly, 'bad-purpose')]
        for name, certfiles, token in cases:
            checks.run(name, refused_cert, tb, addr, port, certfiles, token)
        checks.run('    plain-text preamble (a --no-tls source)', plain_preamble, tb, addr, port)
        checks.run('(e) silent TCP client', silent_tcp, tb, addr, port)
        checks.run('(f) TLS, then no preamble', no_preamble, tb, addr, port, 0)
        checks.run('    TLS, then 10 preamble bytes', no_preamble, tb, addr, port, 10)
        checks.run(f'(g) {FLOOD} silent clients at once', unauthenticated_flood, tb, addr, port)
        checks.run('good node certificate after the flood', accepted_cert, tb, addr, port)
        checks.run('refusals counted by reason', refusal_counts, tb,
                   [token for _, _, token in cases])
        checks.run('live migration still in flight after the probes', vt.still_in_flight, m)
        for daemon in (tb.source, tb.target):
            checks.run(f'{daemon.name} alive', vt.answers, daemon)
        checks.run('live migration', finish_ok, tb, m, src, dst, 'the in-flight migration')
        tb.close_qemus(src, dst)

        checks.run('(h) source does not trust the target\'s CA', source_untrusts_target, tb)
        tb.replace_daemon('target', args=LIMIT_TARGET_ARGS, name='vmigd-target-limit')
        vt.log(f'target restarted with {" ".join(LIMIT_TARGET_ARGS)}')
        checks.run(f'(i) 8 channels over --max-migration-conns {MAX_MIGRATION_CONNS}',
                   over_migration_limit, tb)
        checks.run('(i) then 2 channels through the same daemons', after_limit, tb)
        for daemon in (tb.source, tb.target):
            checks.run(f'{daemon.name} alive at the end', vt.answers, daemon)
        checks.finish()
        tb.stop_daemons()
    vt.log(f'all {checks.count} cases passed')


if __name__ == '__main__':
    vt.run_main(main)
