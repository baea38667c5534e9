#!/usr/bin/env python3
"""Integration test: the DPDK node hop's liveness (doc/design.md, "The DPDK node hop",
"Liveness"), with real QEMU 7.2 migrations between two vmigd.

Start order, over net_memif: the two daemons launched together, the memif server first, then
the memif client first (a server that is not started yet refuses the client's handshake, which
DPDK 22.11 never tries again by itself), and a client whose server comes up only after it is up
(vmigd used to exit). Each time the link comes up, `status` says so, and migrations (8 channels)
go over DPDK with memory verified. VMIG_DPDK_ORDER_RUNS (default 3) runs each together-order.
Then, the memif link up, every node-hop TCP connection under it is reset mid-migration (`ss -K`):
every connection falls back to the kernel path and the migration completes there; and the same
in post-copy, with the guest running on the destination (test_resume.py's case).

Failures, over net_af_packet on a veth pair of the test's own that a bridge in the target
namespace joins: with the target's end left out of the bridge, the source's ARP goes unanswered,
and within the bound (5 s) every connection falls back to the kernel path ("ARP for ...
unanswered") and the migration completes there, memory and digests verified; the next one goes
over the kernel path from the start, and once the bridge joins the target, over DPDK again. Then
the source's DPDK interface is taken down mid-migration: every connection falls back within the
bound ("DPDK link down") from where it stood and the migration completes; one started while it
is down goes over the kernel path, and once it is up again, DPDK. That was with TLS; the link down
again in plain text (VMIG_DPDK_DOWN_RUNS times, default 1). Last, with --resume-timeout 0
(no resumption, so no fallback), an unanswered ARP fails the migration within the bound, with
its reason, instead of hanging."""

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402
import test_resume  # noqa: E402  (its post-copy case, run here over DPDK)

MIB = 32
CHANNELS = 8
BOUND = 5      # the hop's DEAD_US (transport/xp_dhop.c)
SLACK = 3.5    # the hop's look every 100 ms, QEMU noticing, and a loaded 2-core host
# A longer manual loop: VMIG_DPDK_ORDER_RUNS=20 VMIG_DPDK_ORDER_MIB=512 (the guest of the
# start-order runs; the failures keep MIB).
FAILED_RX = re.compile(r'failed after \d+/(\d+) bytes')
FALLBACK_RX = re.compile(r'after \d+/(\d+) bytes \(tx/rx\); falling back')
RUNS = int(os.environ.get('VMIG_DPDK_ORDER_RUNS', '3'))
ORDER_MIB = int(os.environ.get('VMIG_DPDK_ORDER_MIB', str(MIB)))
DOWN_RUNS = int(os.environ.get('VMIG_DPDK_DOWN_RUNS', '1'))


def migrate_ok(tb, label, checks, path, mib=MIB):
    """A migration that completes with its memory the same and every connection on path."""
    src, dst = tb.qemu_pair(mib)
    key = tb.new_key(label)
    m = tb.start_migration(src, dst, key, CHANNELS)
    result = m.finish(timeout=120)
    vt.verify_memory(src, dst)
    tb.close_qemus(src, dst)
    for daemon, role in tb.sides():
        paths = sorted({r.get('path') for r in daemon.linked(key, role)})
        checks.check(paths == [path], f'{label}: {daemon.name} linked with path {paths}, '
                     f'expected {path}')
    vt.log(f'[{label}] {result.summary()} path={path}')


def ended(qemu):
    """query-migrate once the migration is over, else None."""
    info = qemu.migration_info()
    return info if info.get('status') not in ('setup', 'active', 'device') else None


def start_faulted(tb, label, during):
    """A capped migration over DPDK, and during() half a second into it (if given): its QEMUs,
    key, migration, both logs' offsets before it, and when the fault (or the start) was."""
    src, dst = tb.qemu_pair(MIB)
    key = tb.new_key(label)
    since = {d: d.log_offset() for d in (tb.source, tb.target)}
    m = tb.start_migration(src, dst, key, CHANNELS, bandwidth=8 << 20)
    t0 = time.monotonic()
    if during:
        m.wait_active()
        time.sleep(0.5)
        during()
        t0 = time.monotonic()
    return src, dst, key, m, since, t0


def migrate_fails(tb, label, checks, reason, during=None):
    """A migration over DPDK that must fail, its source's log naming reason (a regex), within the
    bound (counted from when it started, or from `during`'s return: the fault it made
    mid-stream)."""
    src, dst, key, m, since, t0 = start_faulted(tb, label, during)
    info = vt.wait_until(lambda: ended(src), BOUND + 30,
                         f'{label}: the source QEMU to end its migration', 0.1)
    took = time.monotonic() - t0
    err = info.get('error-desc', '')
    checks.check(info.get('status') == 'failed', f'{label}: QEMU says {info.get("status")}, '
                 'expected failed')
    vt.stop_quietly(key, tb.source, tb.target)
    tb.close_qemus(src, dst)
    failed, got = [], 0
    for d in (tb.source, tb.target):
        lines = [ln for ln in d.log_since(since[d]).splitlines()
                 if key in ln and ' failed after ' in ln]
        got += sum(int(m.group(1)) for m in map(FAILED_RX.search, lines) if m)
        if d is tb.source:
            failed = lines
    vt.log(f'[{label}] failed in {took:.1f} s: QEMU "{err}"; vmigd: '
           f'{failed[0].split(": ", 2)[-1] if failed else "(no failed line)"}')
    checks.check(failed and all(re.search(reason, ln) for ln in failed),
                 f'{label}: the failed lines should all say "{reason}": {failed[:2]}')
    checks.check(took <= BOUND + SLACK, f'{label}: failed after {took:.1f} s, over the bound '
                 f'({BOUND} s, plus {SLACK} s)')
    if during:
        # mid-stream: the target had taken bytes over DPDK before the fault
        vt.log(f'    the target had {got} bytes over DPDK before')
        checks.check(got > 0, f'{label}: the target took no byte before the fault')


def migrate_falls_back(tb, label, checks, reason, during=None):
    """A migration over DPDK whose DPDK path fails (from the start, or mid-stream from `during`):
    every connection falls back to the kernel path within the bound, the source's log naming
    reason (a regex), and the migration completes there, memory and digests verified."""
    src, dst, key, m, since, t0 = start_faulted(tb, label, during)
    tb.source.wait_log(rf'migration {key} role=source: .* falling back to the kernel path',
                       timeout=BOUND + 30, since=since[tb.source])
    took = time.monotonic() - t0
    result, _ = m.finish_verified(timeout=180)
    tb.close_qemus(src, dst)
    fell = {d: [ln for ln in d.log_since(since[d]).splitlines()
                if key in ln and 'falling back to the kernel path' in ln]
            for d in (tb.source, tb.target)}
    linked = len(tb.source.linked(key, 'source', since[tb.source]))
    resumed = len(tb.source.log_matches(rf'migration {key} role=source: .* resumed after',
                                        since[tb.source]))
    stop = tb.source.stop_record(key, 'source')
    vt.log(f'[{label}] {result.summary()}: fell back in {took:.1f} s, '
           f'{len(fell[tb.source])}/{linked} connections, {resumed} resumed; '
           f'{fell[tb.source][0].split(": ", 2)[-1] if fell[tb.source] else "(no line)"}')
    checks.check(fell[tb.source] and all(re.search(reason, ln) for ln in fell[tb.source]),
                 f'{label}: the fallback lines should all say "{reason}": '
                 f'{fell[tb.source][:2]}')
    checks.check(took <= BOUND + SLACK, f'{label}: fell back after {took:.1f} s, over the '
                 f'bound ({BOUND} s, plus {SLACK} s)')
    checks.check(len(fell[tb.target]) == len(fell[tb.source]) == resumed,
                 f'{label}: {len(fell[tb.source])} connections fell back on the source, '
                 f'{len(fell[tb.target])} on the target, {resumed} resumed')
    checks.check(stop.get('dpdk_fallbacks') == str(len(fell[tb.source])),
                 f'{label}: the stop line says dpdk_fallbacks={stop.get("dpdk_fallbacks")}')
    if during:
        # mid-stream: the target had taken bytes over DPDK before the fault
        got = sum(int(x.group(1)) for x in map(FALLBACK_RX.search, fell[tb.target]) if x)
        vt.log(f'    the target had {got} bytes over DPDK before')
        checks.check(got > 0, f'{label}: the target took no byte before the fault')


def memif_orders(sockdir, checks):
    """Server first, client first (launched together), and a client alone first."""
    debug = '--log-level=pmd.net.memif:debug'
    cases = [(f'{first}-first-{i}', first, True) for first in ('server', 'client')
             for i in range(RUNS)] + [('client-alone-first', 'client', False)]
    tally = {}
    for label, first, together in cases:
        # The source starts first; which of the two is memif's server decides the order.
        server = 'source' if first == 'server' else 'target'
        tag = label.replace('-', '')
        # the client alone for 2 s before its server starts
        late = (None if together else
                lambda tb, side, name: (['sh', '-c', 'sleep 2; exec "$@"', 'sh']
                                        if side == 'target' else []) + tb.net.prefix(side))
        with vt.Testbed(tls=True, start_together=together, daemon_wrapper=late,
                        source_args=vt.dpdk.daemon_args('source', 'memif', sockdir, tag,
                                                        memif_server=server, eal_extra=debug),
                        target_args=vt.dpdk.daemon_args('target', 'memif', sockdir, tag,
                                                        memif_server=server,
                                                        eal_extra=debug)) as tb:
            took = vt.dpdk.wait_link(tb)
            client = tb.source if server == 'target' else tb.target
            text = client.log_text()
            refused = text.count('Disconnect received: ID not found')
            restarts = client.status_field('dpdk').get('link_restarts')
            vt.log(f'[{label}] link up {took:.2f} s after both answered; the memif client was '
                   f'refused {refused} times, its port restarted {restarts} times')
            if not together:
                # the line about the link up again comes with the next tick (100 ms)
                client.wait_log('DPDK node hop: link up again', timeout=2)
                checks.check(restarts and 'DPDK node hop: link down (net_memif client: no memif '
                             'server to connect to' in text,
                             f'{label}: the client alone should say it has no server and '
                             f'restart its port: restarts {restarts}')
            migrate_ok(tb, label, checks, 'dpdk', ORDER_MIB)
            if not together:
                # the memif link stays up; the TCP connections under it are reset
                migrate_falls_back(tb, 'memif-hop-reset', checks,
                                   'the peer vmigd closed the node-hop connection before the '
                                   'stream ended', during=lambda: kill_hop(tb))
                postcopy_falls_back(tb, checks)
            key = first if together else label
            tally.setdefault(key, [0, 0])[0] += 1
            tally[key][1] += refused > 0
    for key, (runs, refused) in tally.items():
        vt.log(f'    {key}: {runs} of {runs} migrations over DPDK, {refused} after a refused '
               'handshake tried again')


def postcopy_falls_back(tb, checks):
    """Post-copy over DPDK, the guest running on the destination, every TCP connection under
    the hop reset: the connection falls back to the kernel path, and post-copy completes with no
    pause and no recovery asked of QEMU (test_resume.py's case: digests verified, the guest on
    the destination only)."""
    since = tb.source.log_offset()
    test_resume.postcopy(checks, tb, 'memif post-copy')
    lines = tb.source.log_since(since).splitlines()
    fell = [ln for ln in lines if 'falling back to the kernel path' in ln]
    paths = {r.get('path') for r in map(vt.parse_linked, lines) if r}
    vt.log(f'[memif-postcopy] linked over {sorted(paths)}, {len(fell)} fell back: '
           f'{fell[0].split(": ", 2)[-1] if fell else "(no line)"}')
    checks.check(paths == {'dpdk'} and len(fell) >= 1,
                 f'memif post-copy: linked over {paths}, {len(fell)} fell back; expected dpdk '
                 'and a fallback')


def kill_hop(tb):
    """ss -K every node-hop TCP connection of the source daemon: both ends see a reset."""
    subprocess.run(['ip', 'netns', 'exec', tb.net.source_ns, 'ss', '-K', '-tn', 'dst',
                    tb.net.target_addr], capture_output=True, check=True)


def ip(ns, *args):
    cmd = ['ip'] + (['-n', ns] if ns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise vt.HarnessError(f'{" ".join(cmd)}: {proc.stderr.strip()}')


def dpdk_wires(tb):
    """The DPDK ports' own wires, apart from the node hop's TCP veth: a veth pair dS (source) -
    dX (target namespace), another dT - dY in the target namespace, and a bridge there that holds
    dX; dY, the target's side, stays out of it until the test bridges it."""
    s, t = tb.net.source_ns, tb.net.target_ns
    ip(s, 'link', 'add', 'dS', 'type', 'veth', 'peer', 'name', 'dX', 'netns', t)
    ip(t, 'link', 'add', 'dT', 'type', 'veth', 'peer', 'name', 'dY')
    ip(t, 'link', 'add', 'br0', 'type', 'bridge')
    ip(t, 'link', 'set', 'dX', 'master', 'br0')
    for ns, dev in ((s, 'dS'), (t, 'dX'), (t, 'dT'), (t, 'dY'), (t, 'br0')):
        ip(ns, 'link', 'set', dev, 'up')


def afpacket_bed(sockdir, tag, tls, extra=()):
    """Two daemons whose DPDK ports are net_af_packet on the wires of dpdk_wires() (dS and dT),
    their EAL prefixes from tag, extra arguments on both."""
    return vt.Testbed(tls=tls, before_daemons=dpdk_wires,
                      source_args=vt.dpdk.daemon_args('source', 'afpacket', sockdir, tag + 's',
                                                      iface='dS') + list(extra),
                      target_args=vt.dpdk.daemon_args('target', 'afpacket', sockdir, tag + 't',
                                                      iface='dT') + list(extra))


def failures(sockdir, checks):
    """ARP unanswered, then a link down mid-migration: each falls back to the kernel path within
    the bound with its reason and completes, the kernel path takes the next migration, and DPDK
    the one after the fault."""
    peer = vt.dpdk.DAEMON_ADDR['target']
    with afpacket_bed(sockdir, 'f', True) as tb:
        s, t = tb.net.source_ns, tb.net.target_ns
        vt.dpdk.wait_link(tb)
        since = tb.source.log_offset()
        migrate_falls_back(tb, 'arp-unanswered', checks,
                           re.escape(f'ARP for {peer} unanswered for {BOUND} s'))
        checks.check(tb.source.log_matches(
            rf'DPDK node hop: peer {peer} unreachable \(ARP for {peer} unanswered.*\); new '
            'connections to it go over the kernel path', since),
            'arp-unanswered: no "peer ... unreachable" line on the source')
        checks.check(tb.source.status_field('dpdk').get('unreachable_peers') == 1,
                     'arp-unanswered: status dpdk.unreachable_peers should be 1')
        migrate_ok(tb, 'arp-unanswered-kernel', checks, 'kernel')
        since = tb.source.log_offset()
        ip(t, 'link', 'set', 'dY', 'master', 'br0')
        tb.source.wait_log(f'DPDK node hop: peer {peer} answered ARP again', timeout=5,
                           since=since)
        migrate_ok(tb, 'arp-answered', checks, 'dpdk')

        since = tb.source.log_offset()
        # a channel set up just before the fault may be the first to time out: its reason
        # names the link all the same, down a little less than the bound
        migrate_falls_back(tb, 'link-down', checks, r'DPDK link down for \d s: '
                           'net_af_packet: interface dS down',
                           during=lambda: ip(s, 'link', 'set', 'dS', 'down'))
        checks.check(tb.source.log_matches(
            r'DPDK node hop: link down \(net_af_packet: interface dS down or without carrier\); '
            'new connections go over the kernel path', since),
            'link-down: no "link down ..." line on the source')
        checks.check(tb.source.status_field('dpdk').get('link_up') is False,
                     'link-down: status dpdk.link_up should be false')
        migrate_ok(tb, 'link-down-kernel', checks, 'kernel')
        since = tb.source.log_offset()
        ip(s, 'link', 'set', 'dS', 'up')
        tb.source.wait_log('DPDK node hop: link up again; new connections go over DPDK',
                           timeout=5, since=since)
        migrate_ok(tb, 'link-up-again', checks, 'dpdk')


def plain_link_down(sockdir, checks):
    """In plain text (the kernel path splices, and keeps what it sent in pipes) a link down
    mid-migration falls back the same way; VMIG_DPDK_DOWN_RUNS (default 1) times in a row
    (VMIG_DPDK_DOWN_TLS=1: with TLS instead, for a longer manual loop)."""
    tls = os.environ.get('VMIG_DPDK_DOWN_TLS') == '1'
    with afpacket_bed(sockdir, 'p', tls) as tb:
        s, t = tb.net.source_ns, tb.net.target_ns
        mode = 'tls' if tls else 'plain'
        ip(t, 'link', 'set', 'dY', 'master', 'br0')
        vt.dpdk.wait_link(tb)
        for i in range(DOWN_RUNS):
            migrate_ok(tb, f'{mode}-up-{i}', checks, 'dpdk')
            migrate_falls_back(tb, f'{mode}-link-down-{i}', checks, r'DPDK link down for \d s: '
                               'net_af_packet: interface dS down',
                               during=lambda: ip(s, 'link', 'set', 'dS', 'down'))
            since = tb.source.log_offset()
            ip(s, 'link', 'set', 'dS', 'up')
            tb.source.wait_log('DPDK node hop: link up again', timeout=5, since=since)


def no_resumption(sockdir, checks):
    """With --resume-timeout 0 there is nothing to fall back with: an unanswered ARP fails the
    migration within the bound, with its reason, instead of hanging."""
    peer = vt.dpdk.DAEMON_ADDR['target']
    off = ['--resume-timeout', '0']
    with afpacket_bed(sockdir, 'g', True, off) as tb:
        vt.dpdk.wait_link(tb)
        migrate_fails(tb, 'arp-unanswered-unresumable', checks,
                      re.escape(f'ARP for {peer} unanswered for {BOUND} s'))


def main():
    vt.dpdk.daemon_ready()
    checks = vt.Checks()
    t0 = time.monotonic()
    try:
        with vt.work_directory('/tmp/vmig-dpdkl-') as sockdir:
            memif_orders(sockdir, checks)
            t1 = time.monotonic()
            failures(sockdir, checks)
            plain_link_down(sockdir, checks)
            t2 = time.monotonic()
            no_resumption(sockdir, checks)
            vt.log(f'    start orders {t1 - t0:.1f} s, fallbacks {t2 - t1:.1f} s, without '
                   f'resumption {time.monotonic() - t2:.1f} s')
    finally:
        vt.dpdk.remove_eal_dirs()
    checks.finish()
    vt.log('ok: the DPDK hop comes up in any start order, falls back to the kernel path within '
           'its bound, and fails within it where it cannot')


if __name__ == '__main__':
    vt.run_main(main)
