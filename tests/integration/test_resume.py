#!/usr/bin/env python3
"""Resumable connections: real QEMU migrations between two vmigd in two namespaces whose node-hop
connections are cut under them, plain and TLS (`test_resume.py plain` or `tls` runs one half;
meson: tests resume and resume_tls). A running test guest writes 48 of its 128 MiB, migrated
with 8 multifd channels at a 24 MiB/s cap (about 4 s of pre-copy):
- every node-hop connection killed once mid-stream (`ss -K` in the source's namespace: a reset
  at both ends), and ten times in a row (each cut 0.3 s after the last one's
  resumptions);
- post-copy (no multifd: QEMU 7.2 cannot combine them), the connection killed after
  migrate-start-postcopy: the guest runs on the destination, with no recovery asked of QEMU;
- plain only: the veth down for 30 s, past the 10 s the daemons bear a node hop that answers
  nothing (TCP alone would bear it for minutes, then fail the migration);
- plain only: forged resumptions from the source's namespace, while a migration runs: a wrong
  secret, another migration's key with its own secret, a wrong token: each refused (status 10
  or 15), counted in the target's figures, the migration unharmed.
After each: QEMU says completed, guest memory is identical on both sides, both daemons'
digests of every connection match (every byte once, in order), the guest runs on the
destination only, both stop lines say ok and count the resumptions."""

import os
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB, CHANNELS, CAP = 128, 8, 24 << 20
GUEST = vt.GuestSpec(48, 4, report_ms=200, fill=True)
PREAMBLE_F_RESUME = 0x0020
STATUS_AUTH, STATUS_RESUME = 10, 15


def kill_hop(tb):
    """ss -K every node-hop connection of the source daemon: both ends see a reset. How many."""
    out = subprocess.run(['ip', 'netns', 'exec', tb.net.source_ns, 'ss', '-K', '-tn', 'dst',
                          tb.net.target_addr], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith('ESTAB'))


def link_down(tb, seconds):
    ip = ['ip', '-n', tb.net.source_ns, 'link', 'set', tb.net.source_if]
    subprocess.run(ip + ['down'], check=True)
    time.sleep(seconds)
    subprocess.run(ip + ['up'], check=True)


def resumed(d, key, role):
    """The stop line's resumed= count."""
    return int(d.stop_record(key, role).get('resumed', 0))


def finish(ck, tb, m, src, dst, label, want_resumed):
    """QEMU completed, memory and digests identical, the guest on the destination only, both
    stop lines ok with at least want_resumed resumptions."""
    result, digest = m.finish_verified(timeout=180)
    dst.execute('cont')
    vt.wait_until(lambda: dst.run_state() == 'running', 10, f'{label}: the destination to run')
    ck.check(src.run_state() == 'postmigrate',
             f'{label}: source {src.run_state()} after completion, expected postmigrate')
    counts = []
    for d, role in tb.sides():
        rec = d.stop_record(m.key, role)
        counts.append(int(rec.get('resumed', 0)))
        ck.check(rec.get('outcome') == 'ok', f'{label}: {role} outcome {rec.get("outcome")}')
        ck.check(counts[-1] >= want_resumed,
                 f'{label}: {role} resumed {counts[-1]} connections, expected {want_resumed} '
                 f'at least: {rec}')
    vt.log(f'  {label}: {result.summary()}, memory {digest[:12]}, resumed {counts[0]}/'
           f'{counts[1]} (source/target), replayed '
           f'{tb.source.stop_record(m.key, "source").get("replayed", 0)} bytes')


def resumptions(d, key, role):
    """The resumptions status counts for migration KEY so far (0 when it has no entry)."""
    entry = d.migration_status(key, role) or {}
    return int((entry.get('resume') or {}).get('resumptions', 0))


def key_of(tb, label):
    return tb.new_key(label.replace(' ', '-').replace('TLS', 'tls'))


def start_capped(tb, label, cap=CAP):
    """The running guest's capped multifd migration, a second into its pre-copy."""
    src, dst = tb.qemu_pair(MIB, guest=GUEST)
    src.start_guest()
    m = tb.start_migration(src, dst, key_of(tb, label), CHANNELS, bandwidth=f'{cap}')
    m.wait_active()
    time.sleep(1.0)
    return src, dst, m


def precopy(ck, tb, label, cuts, gap, cap=CAP):
    src, dst, m = start_capped(tb, label, cap)
    killed = []
    for i in range(cuts):
        killed.append(kill_hop(tb))
        # the next cut comes once both sides have resumed all of this one's connections (a cut
        # that fell inside a handshake would cut a resumption, not a stream, and count once)
        want = (CHANNELS + 1) * (i + 1)
        vt.wait_until(lambda: all(resumptions(d, m.key, role) >= want
                                  for d, role in tb.sides()), 30,
                      f'{label}: cut {i + 1}\'s {CHANNELS + 1} resumptions')
        time.sleep(gap)
    ck.check(all(k == CHANNELS + 1 for k in killed),
             f'{label}: the cuts killed {killed} connections, expected {CHANNELS + 1} each')
    finish(ck, tb, m, src, dst, f'{label} (cuts killed {killed})', (CHANNELS + 1) * cuts)
    tb.close_qemus(src, dst)


def postcopy(ck, tb, label):
    """Post-copy with the guest let run on the destination (`cont`): the cut comes while it
    faults its pages in over the node hop. Its memory then moves on from the source's, so what
    proves the bytes is both daemons' digests of the stream (every connection verified)."""
    src, dst = tb.qemu_pair(MIB, guest=vt.GuestSpec(48, 24, catchup_ms=2, fill=True))
    src.start_guest()
    for q in (src, dst):
        q.execute('migrate-set-capabilities',
                  {'capabilities': [{'capability': 'postcopy-ram', 'state': True}]})
    # post-copy at 8 MiB/s (QEMU's own limit there; the daemon's cap is lifted at the
    # switchover): some seconds with the guest on the destination and pages still coming
    src.execute('migrate-set-parameters', {'max-postcopy-bandwidth': 8 << 20})
    m = tb.start_migration(src, dst, key_of(tb, label), 0, bandwidth='16Mi',
                           max_bandwidth=1 << 40)
    m.wait_active()
    time.sleep(1.0)
    src.execute('migrate-start-postcopy')
    vt.wait_until(lambda: src.migration_info().get('status') == 'postcopy-active', 20,
                  f'{label}: post-copy to start')
    dst.execute('cont')
    vt.wait_until(lambda: len(dst.serial_lines()) > 0, 20,
                  f'{label}: the guest to report on the destination')
    killed = kill_hop(tb)
    reports = len(dst.serial_lines())
    ck.check(killed >= 1, f'{label}: killed {killed} connections in post-copy')
    vt.wait_until(lambda: len(dst.serial_lines()) > reports + 1, 20,
                  f'{label}: the guest on the destination to report after the cut')
    info = src.migration_info()
    ck.check(info.get('status') in ('postcopy-active', 'completed'),
             f'{label}: QEMU says {info.get("status")} after the cut, expected postcopy-active '
             'or completed (no pause, no recovery)')
    m.info = vt.wait_until(lambda: (lambda i: i if i.get('status') == 'completed' else None)(
        src.migration_info()), 120, f'{label}: post-copy to complete')
    m.info['_elapsed'] = time.monotonic() - m.started
    m.finish()
    m.check_digests()
    ck.check(src.run_state() == 'postmigrate' and dst.run_state() == 'running',
             f'{label}: source {src.run_state()}, destination {dst.run_state()}: the guest '
             'must run on the destination only')
    counts = [resumed(d, m.key, role) for d, role in tb.sides()]
    for (d, role), n in zip(tb.sides(), counts):
        rec = d.stop_record(m.key, role)
        ck.check(rec.get('outcome') == 'ok' and n >= 1,
                 f'{label}: {role} stop line {rec}, expected ok with a resumption')
    vt.log(f'  {label} (killed {killed} in post-copy): completed, the guest reported '
           f'{len(dst.serial_lines())} times on the destination, resumed {counts[0]}/{counts[1]}, '
           f'every connection verified')
    tb.close_qemus(src, dst)


def link_30s(ck, tb, label):
    src, dst, m = start_capped(tb, label)
    link_down(tb, 30)
    finish(ck, tb, m, src, dst, f'{label} (the link down 30 s)', 1)
    tb.close_qemus(src, dst)


def forge(tb, key, secret, port, seq, token=b'\0' * 16, have=0):
    """A resumption from the source's namespace (as a stranger on the source node would send
    it): the target's reply status."""
    key_b = key.encode()
    flags = PREAMBLE_F_RESUME | (0x0001 if secret else 0)
    pre = (struct.pack('>IHHIIHH', 0x564D4750, 1, flags, port, seq, len(key_b), 0) + key_b +
           (bytes.fromhex(secret) if secret else b'') + token + struct.pack('>Q', have))
    s = tb.net.socket('source')
    try:
        s.settimeout(5)
        listen = vt.status_field(tb.target.status(), 'listen')
        s.connect((tb.net.target_addr, int(listen.rsplit(':', 1)[1])))
        s.sendall(pre)
        reply = b''
        while len(reply) < 8:
            chunk = s.recv(8 - len(reply))
            if not chunk:
                break
            reply += chunk
    finally:
        s.close()
    return vt.reply_status(reply)


def forged(ck, tb, label):
    """While a migration runs, three forged resumptions of its connections: each refused and
    counted, the migration goes on and completes."""
    src, dst = tb.qemu_pair(MIB, guest=GUEST)
    src.start_guest()
    other = tb.target.target_start(tb.new_key('other'), {49152: tb.path('dst', 'none.sock')})[1]
    m = tb.start_migration(src, dst, key_of(tb, label), CHANNELS, bandwidth=f'{CAP}')
    m.wait_active()
    time.sleep(0.5)
    secret = m.target['secret']
    got = [('a wrong secret', forge(tb, m.key, '00' * 16, 49152, 0), STATUS_AUTH),
           ("another migration's key and secret", forge(tb, other['key'], other['secret'],
                                                        49152, 0), STATUS_RESUME),
           ('a wrong token', forge(tb, m.key, secret, 49152, 1, token=b'\x5a' * 16),
            STATUS_RESUME)]
    for what, status, want in got:
        ck.check(status == want, f'{label}: {what}: status {status}, expected {want}')
    entry = vt.status_migration(tb.target.status(), m.key, 'target') or {}
    n = entry.get('resume', {}).get('refused')
    ck.check(n == 1, f'{label}: the migration counts {n} refused resumptions, expected 1 (the '
             "wrong secret is refused before a resumption is looked at, the other migration's "
             'counts its own)')
    node = tb.target.metrics().get('node', {}).get('resume_refused')
    ck.check(node == 2, f'{label}: the node counts {node} refused resumptions, expected 2')
    finish(ck, tb, m, src, dst, f'{label} ({", ".join(f"{w}: {s}" for w, s, _ in got)})', 0)
    tb.target.target_stop(other['key'])
    tb.close_qemus(src, dst)


def run_half(ck, tls):
    label = 'TLS' if tls else 'plain'
    vt.log(f'{label}:')
    cases = [('once', lambda tb: precopy(ck, tb, f'{label} once', 1, 0)),
             ('ten', lambda tb: precopy(ck, tb, f'{label} ten in a row', 10, 0.3, cap=8 << 20)),
             ('postcopy', lambda tb: postcopy(ck, tb, f'{label} post-copy'))]
    if not tls:
        cases += [('forged', lambda tb: forged(ck, tb, f'{label} forged')),
                  ('link', lambda tb: link_30s(ck, tb, f'{label} link'))]
    # VMIG_RESUME_CASES=postcopy,link: those only (by hand)
    only = os.environ.get('VMIG_RESUME_CASES')
    with vt.Testbed(tls=tls) as tb:
        for name, run in cases:
            if not only or name in only.split(','):
                run(tb)


def main():
    halves = sys.argv[1:] or ['plain', 'tls']
    if any(h not in ('plain', 'tls') for h in halves):
        raise vt.HarnessError(f'usage: test_resume.py [plain|tls]..., not {halves}')
    ck = vt.Checks('resumption cases')
    for half in halves:
        run_half(ck, half == 'tls')
    ck.finish()


if __name__ == '__main__':
    vt.run_main(main)
