#!/usr/bin/env python3
"""Integration test: certificate rotation on the TLS node hop. While a capped TLS migration runs,
both daemons' certificate and key are replaced with node2's, the target's file by file (temporary
file + rename), the source's the way the kubelet updates a secret volume (one rename of ..data):
each daemon must log generation 2 with node2's serial and the running migration must complete with
identical memory. A new migration then runs on generation 2. A garbage key is refused (generation
2 stays) and migrations still complete; SIGHUP makes a daemon re-read its files (refused again
while the key is garbage; generation 3 on the source after a change that inotify cannot see)."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

LIVE_MIB, LIVE_CHANNELS = 256, 4
LIVE_BANDWIDTH = 24 << 20           # ~11 s: the rotation happens while it runs
GENERATION = r'TLS: generation {}: certificate "([^"]*)" serial ([0-9A-Fa-f:]+)'
REFUSED = r'TLS: reload refused, keeping generation {}: (.*)$'
GARBAGE_KEY = b'-----BEGIN PRIVATE KEY-----\nZ2FyYmFnZQ==\n-----END PRIVATE KEY-----\n'


def read(path):
    with open(path, 'rb') as f:
        return f.read()


def wait_generation(daemon, gen, certfiles, since, timeout=10):
    """Wait for `TLS: generation GEN` with certfiles' serial in daemon's log after since."""
    m = daemon.wait_log(GENERATION.format(gen), timeout=timeout, since=since)
    if vt.normalize_serial(m.group(2)) != certfiles.serial:
        raise vt.HarnessError(f'{daemon.name}: generation {gen} has serial {m.group(2)}, expected '
                              f'{certfiles.name}\'s {certfiles.serial}')
    return m


def check_status(daemon, gen, certfiles, problems):
    tls = daemon.tls_status()
    if tls.get('generation') != gen or not vt.shows_serial(tls.get('certificate'),
                                                           certfiles.serial):
        problems.append(f'{daemon.name}: status tls {tls}, expected generation {gen} with '
                        f'{certfiles.name}\'s serial {certfiles.serial}')


def check_serves(tb, daemon, side, certfiles, problems):
    """A new TLS connection to daemon's node-hop listener (from the other namespace) is accepted
    and the daemon presents certfiles' certificate."""
    addr, port = daemon.node_hop()
    ns = tb.net.ns('source' if side == 'target' else 'target')
    ok, probe = vt.probe_tls_accepted(ns, addr, port, tb.pki.node.cert, tb.pki.node.key,
                                      tb.pki.ca)
    serial = probe.server_serial
    if not ok or serial != certfiles.serial:
        problems.append(f'{daemon.name}: a new connection got {probe}, server certificate serial '
                        f'{serial}, expected {certfiles.name}\'s {certfiles.serial} and accepted')
    return serial


def first_not_resumed(daemon, key, problems, why, want=None):
    """The first connection after a reload must not resume a session from before it: that would
    not show the peer the new certificate. It may resume one that a connection after the reload
    made with a full handshake (a digest report of a migration that ended after it, say): then
    its peer= shows want, the certificate the peer presents now."""
    recs = [r for r in daemon.linked(key, 'source') if r['seq'] == 0]
    if recs and recs[0].get('resumed') != 'no' and \
            not (want and vt.shows_serial(recs[0].get('peer', ''), want.serial)):
        problems.append(f'{daemon.name} {key}: the first connection after {why} was resumed: '
                        f'{recs[0]["line"]}')


def check_migration(tb, result, problems, peer_of=None):
    """Stop lines ok, one TLS linked line per channel. peer_of: {role: CertFiles the peer must
    present}; a linked line whose peer= shows another known serial is a problem."""
    pki = tb.pki
    known = [pki.node, pki.node2]
    seen = []
    for daemon, role in tb.sides():
        rec = daemon.stop_record(result.key, role)
        if rec.get('outcome') != 'ok' or int(rec.get('conns', -1)) != result.channels + 1:
            problems.append(f'{daemon.name} {result.key}: stop line {rec}')
        linked = daemon.linked(result.key, role)
        if len(linked) != result.channels + 1 or \
                not all(r.get('tls', '').startswith('TLSv1.') for r in linked):
            problems.append(f'{daemon.name} {result.key}: linked lines '
                            f'{[r["line"] for r in linked]}')
        want = (peer_of or {}).get(role)
        for r in linked:
            peer = r.get('peer', '')
            shown = [c for c in known if vt.shows_serial(peer, c.serial)]
            if want and shown and want not in shown:
                problems.append(f'{daemon.name} {result.key}: peer presented '
                                f'{shown[0].name}\'s certificate, expected {want.name}\'s: '
                                f'{r["line"]}')
            if shown:
                seen.append(f'{role} peer={shown[0].name}')
    return sorted(set(seen))


def migrate(tb, label, channels, problems, peer_of=None, mib=128, after_reload=None):
    src, dst = tb.qemu_pair(mib)
    result = tb.migrate(src, dst, tb.new_key(label), channels, timeout=120)
    digest = vt.verify_memory(src, dst)
    seen = check_migration(tb, result, problems, peer_of)
    if after_reload:
        first_not_resumed(tb.source, result.key, problems, after_reload,
                          (peer_of or {}).get('source'))
    vt.log(f'  {result.summary()} sha256 {digest[:12]}'
           + (f'; linked lines show {", ".join(seen)}' if seen else ''))
    tb.close_qemus(src, dst)


def main():
    started = time.monotonic()
    problems = []
    with vt.Testbed(tls=True, tls_layout={'source': 'kubernetes', 'target': 'files'}) as tb:
        pki = tb.pki
        vt.log(f'node serial {pki.node.serial}, node2 serial {pki.node2.serial}')
        for daemon in (tb.source, tb.target):
            wait_generation(daemon, 1, pki.node, 0)
            check_status(daemon, 1, pki.node, problems)

        vt.log('1. rotation to node2 while a migration runs')
        src, dst = tb.qemu_pair(LIVE_MIB)
        m = tb.start_migration(src, dst, tb.new_key('rotate-live'), LIVE_CHANNELS,
                               max_bandwidth=LIVE_BANDWIDTH)
        vt.wait_until(lambda: len(tb.target.linked(m.key)) == LIVE_CHANNELS + 1, 30,
                      'the target to link every connection of the live migration')
        time.sleep(1)
        since = {d.name: d.log_offset() for d in (tb.source, tb.target)}
        rotated = time.monotonic()
        vt.rotate_tls(tb.tls_dirs['target'], pki.node2, layout='files')
        vt.rotate_tls(tb.tls_dirs['source'], pki.node2, layout='kubernetes')
        for daemon in (tb.target, tb.source):
            line = wait_generation(daemon, 2, pki.node2, since[daemon.name])
            took = time.monotonic() - rotated
            interim = daemon.log_matches(REFUSED.format(1), since[daemon.name])
            vt.log(f'  {daemon.name}: generation 2 within {took:.2f}s: {line.group(0)}'
                   + (f' (after {len(interim)} refused interim state(s): '
                      f'{interim[0].group(1)})' if interim else ''))
            check_status(daemon, 2, pki.node2, problems)
        if m.status() != 'active':
            problems.append(f'the live migration was already {m.status()} when both daemons had '
                            'reloaded: the rotation did not happen in flight')
        result, digest = m.finish_verified(timeout=120)
        check_migration(tb, result, problems)
        vt.log(f'  in-flight migration survived: {result.summary()} sha256 {digest[:12]}')
        tb.close_qemus(src, dst)

        vt.log('2. a new migration on generation 2')
        for daemon, side in ((tb.target, 'target'), (tb.source, 'source')):
            serial = check_serves(tb, daemon, side, pki.node2, problems)
            vt.log(f'  {daemon.name} presents serial {serial} to a new connection')
        migrate(tb, 'gen2', 4, problems, peer_of={'source': pki.node2, 'target': pki.node2},
                after_reload='the rotation')

        vt.log('3. a garbage key is refused and generation 2 stays')
        since_t = tb.target.log_offset()
        vt.rotate_tls(tb.tls_dirs['target'], key_data=GARBAGE_KEY, layout='files')
        line = tb.target.wait_log(REFUSED.format(2), timeout=10, since=since_t)
        vt.log(f'  {tb.target.name}: {line.group(0)}')
        if tb.target.log_matches(GENERATION.format(r'\d+'), since_t):
            problems.append(f'{tb.target.name}: a new generation after a garbage key')
        check_status(tb.target, 2, pki.node2, problems)
        check_serves(tb, tb.target, 'target', pki.node2, problems)
        migrate(tb, 'badkey', 2, problems, peer_of={'source': pki.node2, 'target': pki.node2})

        vt.log('4. SIGHUP')
        since_t = tb.target.log_offset()
        tb.target.sighup()
        line = tb.target.wait_log(REFUSED.format(2), timeout=10, since=since_t)
        vt.log(f'  {tb.target.name}, key still garbage: {line.group(0)}')
        # The source's files behind ..data, changed in place: no event in the directory that
        # holds tls.crt and tls.key, so only SIGHUP can make the daemon notice.
        data_dir = os.path.join(tb.tls_dirs['source'], '..data')
        since_s = tb.source.log_offset()
        vt.atomic_write(os.path.join(data_dir, 'tls.key'), read(pki.node.key))
        vt.atomic_write(os.path.join(data_dir, 'tls.crt'), read(pki.node.cert))
        time.sleep(1.5)
        early = tb.source.log_matches(GENERATION.format(3), since_s)
        if early:
            vt.log(f'  {tb.source.name} reloaded before SIGHUP (it watches the files behind '
                   f'..data): {early[0].group(0)}; SIGHUP shown on the target only')
        else:
            tb.source.sighup()
            line = wait_generation(tb.source, 3, pki.node, since_s)
            vt.log(f'  {tb.source.name} after SIGHUP: {line.group(0)}')
        check_status(tb.source, 3, pki.node, problems)

        since_t = tb.target.log_offset()
        vt.rotate_tls(tb.tls_dirs['target'], pki.node2, layout='files')
        time.sleep(1.5)
        after = [x.group(0) for x in tb.target.log_matches(r'TLS: .*', since_t)]
        vt.log(f'  {tb.target.name}, good key back: {after or "no TLS line"}')
        if tb.target.tls_status().get('certificate') is None or \
                not vt.shows_serial(tb.target.tls_status().get('certificate'), pki.node2.serial):
            problems.append(f'{tb.target.name}: status tls {tb.target.tls_status()} after the '
                            'good key came back, expected node2\'s certificate')
        check_serves(tb, tb.source, 'source', pki.node, problems)
        check_serves(tb, tb.target, 'target', pki.node2, problems)
        migrate(tb, 'final', 4, problems, peer_of={'source': pki.node2, 'target': pki.node},
                after_reload='generation 3 on the source')

        for daemon in (tb.source, tb.target):
            if not daemon.alive():
                problems.append(f'{daemon.name} exited')
        tb.stop_daemons()
    vt.log(f'rotation test done in {time.monotonic() - started:.1f}s')
    if problems:
        raise vt.HarnessError(f'{len(problems)} problem(s):\n  ' + '\n  '.join(problems))


if __name__ == '__main__':
    vt.run_main(main)
