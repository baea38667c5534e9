#!/usr/bin/env python3
"""Integration test: QEMU 7.2 migrations through two stock KubeVirt peers (tests/stockpeer, Go:
virt-handler's migration proxy as KubeVirt ships it), no vmigd, in two network namespaces:
KubeVirt's flow (the target publishes {"targetNodeAddress", "targetDirectMigrationNodePorts"},
the source makes KEY-49152-source.sock from it), multifd off (a stock relay opens the far side
in accept order, which QEMU 7.2's multifd destination cannot take), plain text (disableTLS) and
mutual TLS with KubeVirt's names (server kubevirt.io:system:node:virt-handler, client
kubevirt.io:system:client:migration), guest memory compared, one line per connection on each
peer with the bytes QEMU sent. Then two refused client identities, each with a running guest: the
node's own certificate presented as the client's, and a source presenting client:migration to a
v1.6-or-older target that accepts only client:virt-handler. QEMU's migration fails, the source
guest runs on, the target peer says why and handed the destination no byte. This is the
baseline the mixed-cluster tests hold vmigd against."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402
from vmigtest import stockpeer as sp  # noqa: E402

GUEST_MIB = 128


def check_lines(m, result, tls):
    """Each peer has one connection line for the migration: no error, the source carried at
    least QEMU's ram.transferred to the target and the target delivered it; with TLS, TLS 1.x
    and the other side's KubeVirt name. A summary."""
    problems, parts = [], []
    want_peer = {'source': sp.STOCK_SERVER_CN, 'target': vt.CLIENT_CN}
    for role in ('source', 'target'):
        peer = m.peers[role]
        recs = peer.wait_conns(1)
        if len(recs) != 1:
            problems.append(f'{peer.name}: {len(recs)} connection lines, expected 1')
        r = recs[0]
        if 'error' in r or 'dial_error' in r:
            problems.append(f'{peer.name}: error in {r["line"]}')
        carried = r.get('local_to_peer' if role == 'source' else 'peer_to_local', -1)
        if carried < result.bytes:
            problems.append(f'{peer.name}: {carried} bytes carried, fewer than QEMU\'s '
                            f'ram.transferred {result.bytes}')
        if tls and (not str(r.get('tls', '')).startswith('TLSv1.')
                    or r.get('peer') != want_peer[role]):
            problems.append(f'{peer.name}: expected TLS with peer {want_peer[role]}: {r["line"]}')
        if not tls and 'tls' in r:
            problems.append(f'{peer.name}: TLS on a plain migration: {r["line"]}')
        parts.append(f'{role} {carried} bytes, ended by {r.get("ended_by")}'
                     + (f' {r.get("tls")} {r.get("cipher")} peer {r.get("peer")}' if tls else ''))
    if problems:
        raise vt.HarnessError('; '.join(problems))
    return '; '.join(parts)


def migrate(tb, tls):
    src, dst = tb.qemu_pair(GUEST_MIB)
    try:
        m = sp.start_migration(tb, src, dst, channels=0, tls=tls)
        result, digest = m.finish_verified()
        lines = check_lines(m, result, tls)
        return f'{result.summary()}; memory {digest[:16]}; {lines}'
    finally:
        tb.close_qemus(src, dst)


def refused(tb, source_cert, client_cns, expect):
    """A TLS migration whose client identity the target refuses: QEMU fails, the guest runs on,
    the target's line for the connection says `expect` and shows no byte delivered."""
    src, dst = tb.qemu_pair(GUEST_MIB, private=True)
    try:
        src.execute('cont')
        m = sp.start_migration(tb, src, dst, channels=0, tls=True, source_cert=source_cert,
                               client_cns=client_cns)
        err = vt.wait_failed_at_home(src)
        target = m.peers['target']
        recs = target.wait_conns(1)
        bad = [r for r in recs if expect not in r.get('error', '')]
        if bad:
            raise vt.HarnessError(f'{target.name}: expected an error with {expect!r}: '
                                  f'{bad[0]["line"]}')
        delivered = sum(max(r.get('peer_to_local', 0), 0) for r in recs)
        if delivered:
            raise vt.HarnessError(f'{target.name}: {delivered} bytes reached the destination')
        if not target.alive() or not m.peers['source'].alive():
            raise vt.HarnessError('a peer exited after the refusal')
        return f'QEMU failed ({err}), guest running; target: {recs[0]["error"]}'
    finally:
        tb.close_qemus(src, dst)


def main():
    checks = vt.Checks('migrations and refusals')
    with sp.StockTestbed(daemons=False, pki=True) as tb:
        vt.log(f'{tb.describe()}; stock peer {tb.stockpeer}')
        checks.run('plain text (disableTLS), multifd off', migrate, tb, False)
        checks.run('mutual TLS, KubeVirt names, multifd off', migrate, tb, True)
        checks.run('refused: the node certificate as the client\'s', refused, tb, 'node', None,
                   'common name is invalid')
        checks.run('refused: client:migration against a target that accepts only '
                   'client:virt-handler (v1.6 and older)', refused, tb, 'client',
                   [sp.OLD_CLIENT_CN], 'common name is invalid')
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
