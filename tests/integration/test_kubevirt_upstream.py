#!/usr/bin/env python3
"""Integration test: real QEMU guests migrated between vmigd in KubeVirt mode and KubeVirt's OWN
migration proxy (tests/kvpeer: pkg/virt-handler/migration-proxy/migration-proxy.go of each
pinned release, contrib/kubevirt/upstream v1.8.4, v1.9.0 and main, compiled in unchanged), in
two network namespaces. vmigd runs as the sidecar does (TLS with the node pair as server,
KubeVirt's migration client pair as client, --tls-allow-client kubevirt.io:system:client:migration
--tls-allow-server kubevirt.io:system:node:virt-handler).

For each release, both directions, plain text (KubeVirt's disableTLS, `--no-tls`) and mutual
TLS under KubeVirt's names: vmigd source -> KubeVirt target plain on QEMU 7.2 without multifd
and with TLS on QEMU 10.0 with 8 multifd channels; KubeVirt source -> vmigd target plain on
QEMU 10.0 with 8 channels and with TLS on QEMU 7.2 without multifd (without QEMU 10.0,
tools/setup's build/qemu10, those run on 7.2 without multifd and say so). Then KubeVirt v1.9.0
as source and main as target, TLS, QEMU 7.2: the real code on both ends. Then, for each release,
three refused client identities, each with a running guest (QEMU 7.2): a vmigd source
(client:migration) at a KubeVirt target that accepts only client:virt-handler (KubeVirt v1.6
and older: `--migration-cn-types virt-handler`), a KubeVirt source presenting the node
certificate to a vmigd target, and the same to a KubeVirt target; QEMU's migration fails, the
guest runs on, the refusing side says why ("common name is invalid, got ..." in KubeVirt's
log, TLS refused in vmigd's) and the destination got no byte. Each migration: guest memory
compared; vmigd's `linked ... wire=raw` lines (TLS with KubeVirt's names) and its stop line
(outcome ok, the bytes QEMU sent at least); on KubeVirt's side, one "N bytes copied from inbound
to outbound" line of its log per QEMU connection, no error logged, the bytes QEMU sent at least,
and each handshake's version and peer name (kvpeer's own handshake lines: KubeVirt's code logs
none). Needs root, network namespaces, QEMU 7.2 and go; else it skips (77)."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402
from vmigtest import stockpeer as sp  # noqa: E402
import test_kubevirt_mixed as mx  # noqa: E402  (finish(), the per-end checks, refusals)
import test_stock_peers as st  # noqa: E402  (a refusal between two stock peers)

GUEST_MIB = 128
MULTIFD_CHANNELS = 8


def migrate(tb, check, binaries, source, target, tls, channels, qemu):
    """One migration; source/target 'stock' (a kvpeer of binaries) or 'vmigd'. A summary."""
    src, dst = tb.qemu_pair(GUEST_MIB, qemu=qemu)
    try:
        m = sp.start_migration(tb, src, dst, source=source, target=target, channels=channels,
                               tls=tls, peers=binaries)
        if source == target == 'stock':
            result, digest = m.finish_verified()
        else:
            result, digest = mx.finish(tb, m, check)
        conns = channels + 1
        names = {'source': vt.NODE_CN, 'target': vt.CLIENT_CN}   # the other end's name
        parts = []
        for role, kind in (('source', source), ('target', target)):
            if kind == 'stock':
                peer = m.peers[role]
                check(peer.kind == 'kubevirt', f'{peer.name} is {peer.binary}, not a kvpeer')
                text = mx.check_stock_end(peer, role, conns, tls, names[role], result.bytes,
                                          check)
                # KubeVirt's log does not say which copy ended a connection
                parts.append(text.replace('stock ', 'KubeVirt ', 1).replace(', ended by None', ''))
            else:
                daemon = tb.source if role == 'source' else tb.target
                parts.append(mx.check_vmigd_end(daemon, role, m.key, conns, tls, names[role],
                                                result.bytes, check))
        return f'{result.summary()}; memory sha256 {digest[:12]}; ' + '; '.join(parts)
    finally:
        tb.close_qemus(src, dst)


def main():
    checks = vt.Checks('KubeVirt\'s own proxy against vmigd')
    binaries = {v: sp.kvpeer_binary(v) for v in sp.KUBEVIRT_VERSIONS}
    qemu72 = vt.qemu_binary('7.2')
    try:
        qemu10, why10 = vt.qemu_binary('10.0'), None
    except vt.Skip as e:
        qemu10, why10 = None, str(e)
    notes = []

    def case(name, *args, fn=migrate):
        vt.log(f'[{name}]')
        started = time.monotonic()
        checks.run(name, fn, tb, checks.check, *args)
        vt.log(f'  ({time.monotonic() - started:.1f}s)')

    with sp.StockTestbed(tls=True, qemu=qemu72, daemon_args=mx.KUBEVIRT_TLS_ARGS,
                         peer=binaries[sp.DEFAULT_KUBEVIRT]) as tb:
        vt.log(f'{tb.describe()}; KubeVirt peers {binaries}; QEMU {vt.qemu_version(qemu72)} '
               f'{qemu72}; ' + (f'QEMU {vt.qemu_version(qemu10)} {qemu10}' if qemu10 else why10))
        if qemu10:
            multi, multi_text = (MULTIFD_CHANNELS, qemu10), f'QEMU 10.0, multifd {MULTIFD_CHANNELS}'
        else:
            multi, multi_text = (0, qemu72), 'QEMU 7.2, multifd off (no QEMU 10.0)'
            notes.append(f'multifd cases ran on QEMU 7.2 without multifd: {why10}')
        single, single_text = (0, qemu72), 'QEMU 7.2, multifd off'
        for v in sp.KUBEVIRT_VERSIONS:
            both = {'source': binaries[v], 'target': binaries[v]}
            for source, target, tls, (channels, qemu), text in (
                    ('vmigd', 'stock', False, single, single_text),
                    ('vmigd', 'stock', True, multi, multi_text),
                    ('stock', 'vmigd', False, multi, multi_text),
                    ('stock', 'vmigd', True, single, single_text)):
                ends = (f'{"KubeVirt " + v if source == "stock" else "vmigd"} source -> '
                        f'{"KubeVirt " + v if target == "stock" else "vmigd"} target')
                what = 'mutual TLS, KubeVirt names' if tls else 'plain text (disableTLS)'
                case(f'{ends}, {what}, {text}', both, source, target, tls, channels, qemu)
        case('KubeVirt v1.9.0 source -> KubeVirt main target, mutual TLS, QEMU 7.2, multifd off',
             {'source': binaries['v1.9.0'], 'target': binaries['main']}, 'stock', 'stock', True,
             0, qemu72)
        for v in sp.KUBEVIRT_VERSIONS:
            tb.stockpeer = binaries[v]      # the peer of the stock ends below
            case(f'refused: vmigd source (client:migration) at a KubeVirt {v} target taking only '
                 'client:virt-handler', fn=mx.client_name_refused_by_stock)
            case(f'refused: KubeVirt {v} source presenting the node certificate to a vmigd '
                 'target', fn=mx.node_cert_as_client)
            case(f'refused: KubeVirt {v} source presenting the node certificate to a KubeVirt '
                 f'{v} target', 'node', None, 'common name is invalid, got '
                 'kubevirt.io:system:node:virt-handler',
                 fn=lambda tb, _check, *a: st.refused(tb, *a))
        tb.stop_daemons()
    for line in notes:
        vt.log(f'NOTE: {line}')
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
