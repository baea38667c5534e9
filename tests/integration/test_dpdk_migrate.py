#!/usr/bin/env python3
"""Integration test: real QEMU migrations between two vmigd daemons in two network namespaces whose
node hop is DPDK (vmigd --dpdk): over net_memif, with mutual TLS (multifd off, 4 and 8 channels,
and 4 under a 32 MiB/s cap, which must hold; then both daemons idle under a tenth of a core),
in plain text (4 channels), and with 2 % of arriving frames dropped, 1 % duplicated and 2 % held
behind the next on both daemons (4 channels); then over net_af_packet on the veth pair, sealed,
with a capture on the veth that must find no guest page in clear text, and plain, where it must
find some. Each must complete with identical guest memory and `path=dpdk` on every connection,
and target start must advertise the target's DPDK address. With --dpdk on one side only, either
side, a migration goes over the kernel path and says `path=kernel`."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB = 128
CAPTURE = 4 << 20


def check_path(tb, result, problems, path):
    """Every connection of the migration went the path expected, on both daemons, and the stop
    lines say ok with at least QEMU's bytes."""
    for daemon, role in tb.sides():
        where = f'{daemon.name} {result.key}'
        recs = daemon.linked(result.key, role)
        paths = sorted({r.get('path') for r in recs})
        if len(recs) != result.channels + 1 or paths != [path]:
            problems.append(f'{where}: {len(recs)} linked lines with path {paths}, expected '
                            f'{result.channels + 1} with path={path}')
        rec = daemon.stop_record(result.key, role)
        if rec.get('outcome') != 'ok' or int(rec.get('bytes', -1)) < result.bytes:
            problems.append(f'{where}: stop line {rec}')
        problems += [f'{where}: {line}' for line in daemon.problem_lines(result.key)
                     if ': error:' in line.lower()]


def migrate(tb, label, channels, problems, capture=None, path='dpdk', advertised=True,
            cap=None):
    if path == 'dpdk':
        # a connection made while the port's link is down (a memif handshake under way) takes
        # the kernel path
        vt.dpdk.wait_link(tb)
    src, dst = tb.qemu_pair(MIB)
    key = tb.new_key(label)
    m = tb.start_migration(src, dst, key, channels, **({'bandwidth': cap} if cap else {}))
    # target start advertises the target's DPDK hop, and only then does a source offer it
    want = f'{vt.dpdk.DAEMON_ADDR["target"]}:{vt.dpdk.DAEMON_PORT}' if advertised else None
    if m.target.get('dpdk') != want:
        problems.append(f'{label}: target JSON dpdk = {m.target.get("dpdk")!r}, expected {want!r}')
    if capture:
        with vt.Sniffer(tb.net.target_ns, tb.net.target_if, vt.dpdk.DAEMON_PORT, limit=CAPTURE,
                        udp=True) as sniff:
            result = m.finish(timeout=300)
    else:
        result = m.finish(timeout=300)
    digest = vt.verify_memory(src, dst)
    check_path(tb, result, problems, path)
    vt.log(f'[{label}] {result.summary()} sha256 {digest[:12]}')
    tb.close_qemus(src, dst)
    if cap:
        # A cap is a maximum (plus the bucket's burst); the sender always had more to send, so a
        # rate far under it would mean the cap is not what holds it back.
        rate = result.bytes / result.seconds
        vt.log(f'    capped at {cap >> 20} MiB/s: {rate / (1 << 20):.1f} MiB/s on average')
        if rate > cap * 1.1 or rate < cap * 0.4:
            problems.append(f'{label}: {rate / (1 << 20):.1f} MiB/s under a cap of '
                            f'{cap >> 20} MiB/s')
    if not capture:
        return
    hits = vt.plaintext_hits(sniff.payload, vt.ram_page_prefixes(MIB))
    vt.log(f'    captured {len(sniff.payload)} bytes of DPDK frames on the veth, {hits} plain-text '
           'guest pages')
    if len(sniff.payload) < CAPTURE // 2:
        problems.append(f'{label}: only {len(sniff.payload)} bytes captured')
    elif capture == 'sealed' and hits:
        problems.append(f'{label}: {hits} guest pages crossed the sealed DPDK hop in clear text')
    elif capture == 'plain' and not hits:
        problems.append(f'{label}: no guest page in a plain DPDK hop: the check cannot see them')


def bed(kind, sockdir, tag, tls, extra=(), vmigd=None):
    """vmigd: another daemon binary for both sides (vmigd-test, for --dpdk-test-impair)."""
    binaries = {} if vmigd is None else {'vmigd': vmigd, 'vmigctl': vt.find_binaries()[1]}
    return vt.Testbed(tls=tls, **binaries,
                      source_args=vt.dpdk.daemon_args('source', kind, sockdir, tag, extra),
                      target_args=vt.dpdk.daemon_args('target', kind, sockdir, tag, extra))


def cpu_seconds(pid):
    with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def check_idle(tb, problems, seconds=3):
    """With no migration, a daemon's DPDK thread sleeps: each daemon under a tenth of a core (a
    polling lcore would burn a whole one)."""
    before = {d.name: cpu_seconds(d.proc.pid) for d in (tb.source, tb.target)}
    time.sleep(seconds)
    for d in (tb.source, tb.target):
        used = (cpu_seconds(d.proc.pid) - before[d.name]) / seconds
        vt.log(f'    {d.name} idle with --dpdk: {used:.3f} of a core')
        if used > 0.1:
            problems.append(f'{d.name}: {used:.2f} of a core while idle with --dpdk')


def check_status(tb, problems, sealed, impaired=False):
    """status's dpdk object on both daemons: frames both ways, sealed or not, and with damage
    injected, drops, every duplicate refused as a replay, and the source's retransmissions."""
    for d in (tb.source, tb.target):
        st = d.status_field('dpdk')
        vt.log(f'    {d.name} status dpdk: {st}')
        if not isinstance(st, dict) or not st.get('tx_frames') or not st.get('rx_frames') \
                or st.get('sealed') is not sealed or st.get('forged'):
            problems.append(f'{d.name}: status dpdk = {st!r}, expected frames both ways, '
                            f'sealed={sealed}, none forged')
        elif impaired and (not st.get('dropped_by_test')
                           or st.get('replayed', 0) < st.get('duplicated_by_test', 1)
                           or (d is tb.source and not st.get('retransmitted_frames'))):
            # The target sends acknowledgements only, which are never resent: the source's
            # retransmissions are what its drops of data frames cost.
            problems.append(f'{d.name}: with damage injected, status dpdk = {st!r}: expected '
                            'drops, every duplicate refused as a replay, and on the source '
                            'retransmissions')


def main():
    vt.dpdk.daemon_ready()
    try:
        run()
    finally:
        vt.dpdk.remove_eal_dirs()


def run():
    problems = []
    with vt.work_directory('/tmp/vmig-dpdkm-') as sockdir:
        with bed('memif', sockdir, 'm', True) as tb:
            vt.log(f'{tb.describe()}; DPDK net_memif, sealed with keys from TLS 1.3')
            for channels in (0, 4, 8):
                migrate(tb, f'memif-tls-mfd{channels}', channels, problems)
            migrate(tb, 'memif-tls-capped-mfd4', 4, problems, cap=32 << 20)
            check_status(tb, problems, True)
            check_idle(tb, problems)
        with bed('memif', sockdir, 'p', None) as tb:
            migrate(tb, 'memif-plain-mfd4', 4, problems)
            check_status(tb, problems, False)
        with bed('memif', sockdir, 'l', True, ('--dpdk-test-impair', '2,1,2'),
                 vmigd=vt.find_test_daemon()) as tb:
            migrate(tb, 'memif-damaged-mfd4', 4, problems)
            check_status(tb, problems, True, impaired=True)
        with bed('afpacket', sockdir, 'a', True) as tb:
            vt.log('DPDK net_af_packet on the veth pair, sealed, captured')
            migrate(tb, 'afpacket-tls-mfd4', 4, problems, capture='sealed')
        with bed('afpacket', sockdir, 'b', None) as tb:
            migrate(tb, 'afpacket-plain-mfd0', 0, problems, capture='plain')
        # One side without --dpdk, either way round: the kernel path, and status says so.
        for side in ('source', 'target'):
            args = vt.dpdk.daemon_args(side, 'afpacket', sockdir, 'h' + side[0])
            with vt.Testbed(tls=True, **{f'{side}_args': args}) as tb:
                migrate(tb, f'only-{side}-dpdk-mfd4', 4, problems, path='kernel',
                        advertised=side == 'target')
    if problems:
        raise vt.HarnessError(f'{len(problems)} problem(s):\n  ' + '\n  '.join(problems))
    vt.log('ok: QEMU migrations over the DPDK node hop, memory verified')


if __name__ == '__main__':
    vt.run_main(main)
