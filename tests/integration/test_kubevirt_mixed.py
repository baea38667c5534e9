#!/usr/bin/env python3
"""Integration test of a mixed cluster (the KubeVirt drop-in): real QEMU guests
migrated between a stock KubeVirt peer (tests/stockpeer, virt-handler's Go proxy) and vmigd in
KubeVirt mode, in two network namespaces, both directions. vmigd runs as the sidecar does: TLS
with the node pair as server, KubeVirt's migration client pair as client, and KubeVirt's names
per role (--tls-allow-client kubevirt.io:system:client:migration, --tls-allow-server
kubevirt.io:system:node:virt-handler).

1. QEMU 7.2 (Debian's), multifd off: stock source -> vmigd target and vmigd source -> stock
   target, each in plain text (KubeVirt's disableTLS, `--no-tls` per migration) and with mutual
   TLS under KubeVirt's names. Guest memory compared; on each relay one connection per QEMU
   channel: vmigd's `linked ... wire=raw` lines (tls=off, or TLS with the stock peer's name), its
   stop line (outcome ok, the bytes QEMU sent at least), the stock peer's connection lines (no
   error, the bytes, TLS and vmigd's name); vmigd's links end by themselves once QEMU closed its
   end, before anyone stops the migration (a stock source never closes its side), and a vmigd
   target stopped while the stock source still runs (KubeVirt's handlers live on) logs its stop
   line within the stop's grace.
2. Multifd, 4 channels, TLS, both directions, with QEMU 10.0 on both sides. A stock peer opens the
   far side in accept order (each connection in its own goroutine), and vmigd serves a stock peer
   raw, without its ordering. QEMU 7.2's destination classifies channels purely by arrival (the
   first is the main channel; qemu-migration-wire.md 1.2), so 7.2 multifd through a stock peer
   can break and is NOT run here; destinations from 8.0 peek each unix channel's magic (multifd
   on, postcopy-ram off), as do those KubeVirt ships (9.0 and later), so order does not matter
   to them. The vmigd source holds QEMU's main channel back 700 ms (--test-delay-first), so
   that the stock target hands the destination the multifd channels first. Without QEMU 10.0
   (tools/setup puts it in build/qemu10) this case is reported as skipped.
3. Bad input of this mode, each ending with a clear error in vmigd's log or reply, the source
   guest running again (QEMU's migration failed, query-status running) and both daemons
   answering:
   a. a stock source dialling a target started without --kubevirt (the shared node-hop port,
      which always expects vmigd's preamble): refused as a malformed preamble, the destination
      untouched;
   b. a vmigd source given vmigd's own target form (preamble) for a stock target's port: the
      preamble bytes reach the destination QEMU, which fails the incoming migration; vmigd
      cannot tell before it sends (a Go server selects no ALPN, as it does for a raw KubeVirt
      map), and reports the target closing without a reply;
   c. wrong client identities: a stock source presenting the node certificate to a vmigd TLS
      target (TLS refused (name-not-allowed)), and a vmigd source presenting client:migration to
      a stock target that accepts only client:virt-handler (KubeVirt v1.6 and older; TLS refused
      (peer-refused) before a byte of QEMU's is sent);
   d. a KubeVirt map with logical ports vmigd does not take: `vmigctl source start` exits
      non-zero with one line saying the map is invalid, the same request on the control socket
      (the shim's way) is answered with code EINVAL, and no socket is made;
   e. a second `target start --kubevirt` of a key with other sockets: the old TCP listener is
      gone (connection refused) and a migration through the new map completes.
Needs root, network namespaces, QEMU 7.2 and go (the stock peer); else it skips (77). About
20 s on two CPUs; a stock-source case whose links linger waits up to 18 s more for them."""

import errno
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402
from vmigtest import stockpeer as sp  # noqa: E402

GUEST_MIB = 128
MULTIFD_CHANNELS = 4
# vmigd as the sidecar runs it (doc/kubevirt.md): KubeVirt's names per role.
KUBEVIRT_TLS_ARGS = ['--tls-allow-client', vt.CLIENT_CN, '--tls-allow-server', vt.NODE_CN]
# How long vmigd's links may take to end by themselves once QEMU closed its end.
LINK_END_S = 10
# A stop lets the links run this long, then cuts them (doc/design.md, "Migration lifecycle").
STOP_GRACE_S = 5


def qemu_pair(tb, binary, **kw):
    """tb.qemu_pair() with QEMU `binary` on both sides."""
    return tb.qemu_pair(GUEST_MIB, qemu=binary, **kw)


def links_end_by_themselves(tb, m, check):
    """Once QEMU completed, every link vmigd carries for the migration ends without a stop
    (raw: at the first end of stream, whether or not the stock peer ever closes its side)."""
    for end in ('source', 'target'):
        if m.peers[end] is not None:
            continue
        daemon = tb.source if end == 'source' else tb.target

        def open_conns():
            conns = daemon.connections(m.key)
            return conns if conns else None
        deadline = time.monotonic() + LINK_END_S
        left = open_conns()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = open_conns()
        check(not left, f'{daemon.name}: {len(left or [])} links still open {LINK_END_S}s after '
              f'QEMU completed, before any stop (a raw link ends at the first end of stream: a '
              f'stock source may never close its side): '
              + ', '.join(f'seq {c.get("seq")} {c.get("state")} raw={c.get("raw")} '
                          f'tx={c.get("bytes_tx")} rx={c.get("bytes_rx")}' for c in left or []))


def finish(tb, m, check):
    """After QEMU completed: vmigd's links end by themselves, then the stops as KubeVirt's
    handlers make them, which live on after a migration: with a stock source, vmigd's target is
    stopped while the stock source still runs (a stock source never closes its side) and must
    log its stop line within the stop's grace; then the other end. Both sides' memory compared;
    (MigrationResult, sha256)."""
    info = m.wait(timeout=180)
    links_end_by_themselves(tb, m, check)
    if m.peers['source'] is not None:
        since = tb.target.log_offset()
        tb.target.target_stop(m.key)
        try:
            tb.target.wait_log(rf'migration {m.key} role=target stop ', STOP_GRACE_S + 3, since,
                               f'the stop line for {m.key}')
        except vt.HarnessError:
            check(False, f'{tb.target.name}: no stop line for {m.key} within '
                  f'{STOP_GRACE_S + 3}s of `target stop`, given while the stock source still '
                  f'runs (node connections {tb.target.status_field("conns")})')
        m.source_daemon.source_stop(m.key)
    else:
        m.source_daemon.source_stop(m.key)
        m.target_daemon.target_stop(m.key)
    result = vt.MigrationResult(key=m.key, channels=m.channels, size_mib=m.src.size_mib,
                                seconds=info['_elapsed'], qemu_total_ms=info.get('total-time', 0),
                                bytes=info['ram']['transferred'], source_sockets=m.sockets,
                                target=m.target)
    return result, vt.verify_memory(m.src, m.dst)


def check_vmigd_end(daemon, role, key, conns, tls, peer_cn, qemu_bytes, check):
    """vmigd's lines for one end: conns `linked ... wire=raw` lines, TLS as asked with the stock
    peer's name; the stop line's outcome ok, conns and bytes. A summary."""
    linked = daemon.linked(key, role)
    check(len(linked) == conns, f'{daemon.name}: {len(linked)} linked lines, expected {conns}: '
          f'{[r["line"] for r in linked]}')
    for r in linked:
        if tls:
            ok = (r.get('wire') == 'raw' and r.get('tls', '').startswith('TLSv1.')
                  and peer_cn in r.get('peer', ''))
        else:
            ok = r.get('wire') == 'raw' and r.get('tls') == 'off'
        check(ok, f'{daemon.name}: expected wire=raw, '
              f'{"TLS with peer " + peer_cn if tls else "tls=off"}: {r["line"]}')
    rec = daemon.stop_record(key, role)
    carried = int(rec.get('tx' if role == 'source' else 'rx', -1))
    check(rec.get('outcome') == 'ok', f'{daemon.name}: stop outcome {rec.get("outcome")}')
    check(int(rec.get('conns', -1)) == conns, f'{daemon.name}: stop conns={rec.get("conns")}, '
          f'expected {conns}')
    check(carried >= qemu_bytes, f'{daemon.name}: carried {carried} bytes, fewer than QEMU\'s '
          f'ram.transferred {qemu_bytes}')
    first = linked[0] if linked else {}
    tls_text = (f' {first.get("tls")} {first.get("cipher")} peer "{first.get("peer")}"'
                if tls and first else '')
    return (f'vmigd {role} {len(linked)} linked wire=raw{tls_text}, {carried} bytes, '
            f'outcome {rec.get("outcome")}')


def check_stock_end(peer, role, conns, tls, peer_cn, qemu_bytes, check):
    """The stock peer's connection lines: conns of them, no error, the bytes QEMU sent, TLS as
    asked with vmigd's name. A summary."""
    try:
        recs = peer.wait_conns(conns)
    except vt.HarnessError as e:
        check(False, str(e))
        recs = peer.conn_lines()
    check(len(recs) == conns, f'{peer.name}: {len(recs)} connection lines, expected {conns}')
    for r in recs:
        check('error' not in r and 'dial_error' not in r, f'{peer.name}: error in {r["line"]}')
        if tls:
            check(str(r.get('tls', '')).startswith('TLSv1.') and r.get('peer') == peer_cn,
                  f'{peer.name}: expected TLS with peer {peer_cn}: {r["line"]}')
        else:
            check('tls' not in r, f'{peer.name}: TLS on a plain migration: {r["line"]}')
    field = 'local_to_peer' if role == 'source' else 'peer_to_local'
    carried = sum(max(r.get(field, 0), 0) for r in recs)
    check(carried >= qemu_bytes, f'{peer.name}: {carried} bytes carried, fewer than QEMU\'s '
          f'ram.transferred {qemu_bytes}')
    ended = sorted({str(r.get('ended_by')) for r in recs})
    first = recs[0] if recs else {}
    tls_text = (f' {first.get("tls")} {first.get("cipher")} peer "{first.get("peer")}"'
                if tls and first else '')
    return f'stock {role} {len(recs)} conns{tls_text}, {carried} bytes, ended by {",".join(ended)}'


def mixed(tb, check, source, target, tls, channels=0, qemu=None, delay_main_ms=None):
    """One migration between a stock peer and vmigd (source/target: 'stock' or 'vmigd'): memory
    compared, both relays' lines checked. delay_main_ms (a vmigd source): hold QEMU's first
    connection, its main channel, back that long, so that the stock target opens the
    destination's channels out of QEMU's order. A summary with the figures."""
    src, dst = qemu_pair(tb, qemu or tb.qemu)
    try:
        extra = ['--test-delay-first', str(delay_main_ms)] if delay_main_ms else []
        m = sp.start_migration(tb, src, dst, source=source, target=target, channels=channels,
                               tls=tls, source_args=extra)
        result, digest = finish(tb, m, check)
        conns = channels + 1
        parts = []
        names = {'source': vt.NODE_CN, 'target': vt.CLIENT_CN}   # the other end's name
        for role, kind in (('source', source), ('target', target)):
            if kind == 'stock':
                parts.append(check_stock_end(m.peers[role], role, conns, tls, names[role],
                                             result.bytes, check))
            else:
                daemon = tb.source if role == 'source' else tb.target
                parts.append(check_vmigd_end(daemon, role, m.key, conns, tls, names[role],
                                             result.bytes, check))
        if delay_main_ms:
            order = [r['seq'] for r in tb.source.linked(m.key, 'source')]
            check(order[-1:] == [0], f'{tb.source.name}: the main channel (connection 0) linked '
                  f'last, after the multifd channels: {order}')
            parts.append(f'main channel held back {delay_main_ms} ms: linked in order {order}')
        return f'{result.summary()}; memory sha256 {digest[:12]}; ' + '; '.join(parts)
    finally:
        tb.close_qemus(src, dst)


# Bad input.

def nothing_crashed(tb, check, *peers):
    for d in (tb.source, tb.target):
        try:
            vt.answers(d)
        except vt.HarnessError as e:
            check(False, f'{d.name}: {e}')
    for p in peers:
        if p is not None:
            check(p.alive(), f'{p.name} exited ({p.proc.returncode})')


def running_guest(tb):
    """A QEMU pair whose source guest runs (its RAM mapped copy-on-write)."""
    src, dst = qemu_pair(tb, tb.qemu, private=True)
    src.execute('cont')
    return src, dst


def dst_outcome(dst):
    """What became of a destination QEMU: 'exited N' (QEMU 7.2 exits when an incoming migration
    fails) or its query-migrate status and run state."""
    if dst.proc.poll() is not None:
        return f'exited {dst.proc.returncode}'
    try:
        return f'{dst.migration_info().get("status") or "none"}, {dst.run_state()}'
    except (vt.HarnessError, OSError) as e:
        # QEMU may be exiting between the poll and the question (its QMP socket then resets):
        # give it a moment to be counted as exited
        try:
            dst.proc.wait(5)
            return f'exited {dst.proc.returncode}'
        except subprocess.TimeoutExpired:
            return f'no answer ({e})'


def dst_error_line(dst):
    lines = [line for line in vt.tail(dst.log_path, 10).splitlines() if line.strip()]
    return lines[-1] if lines else '(nothing logged)'


def stock_source_to_shared_port(tb, check):
    """3a: a target started without --kubevirt serves only vmigd's preamble on the shared
    node-hop port; a stock source pointed at that port (KubeVirt's map {"<port>": 49152}) is
    refused as a malformed preamble and the destination is never connected."""
    src, dst = running_guest(tb)
    key = tb.new_key('mx-3a')
    source = None
    try:
        dst_sock = sp.kubevirt_dst_socket(tb, key)
        vt.configure_migration(src, dst, 0)
        dst.execute('migrate-incoming', {'uri': f'unix:{dst_sock}'})
        tb.target.target_start(key, {vt.DEFAULT_PORT_ID: dst_sock})
        kmap = {'targetNodeAddress': tb.net.target_addr,
                'targetDirectMigrationNodePorts': {str(tb.target.node_hop()[1]):
                                                   vt.DEFAULT_PORT_ID}}
        since = tb.target.log_offset()
        source = tb.stock_source(key, kmap, tls=sp.stock_tls(tb.pki, 'source'))
        src.execute('migrate', {'uri': f'unix:{source.sockets[0]}'})
        err = vt.wait_failed_at_home(src)
        line = tb.target.wait_log(r'node hop from \S+: malformed preamble; connection refused '
                                  r'\(a stock KubeVirt peer\? it needs a target started with '
                                  r'--kubevirt\)',
                                  since=since).group(0)
        check(not tb.target.linked(key), f'{tb.target.name}: linked a connection for {key}')
        state = dst_outcome(dst)
        check(state.startswith('none') or 'inmigrate' in state,
              f'the destination was left alone: {state}')
        nothing_crashed(tb, check, source)
        return f'QEMU failed ({err}), guest running; vmigd: "{line}"; destination {state}'
    finally:
        vt.stop_quietly(key, target=tb.target)
        if source is not None:
            source.stop()
        tb.close_qemus(src, dst)


def vmigd_form_to_stock_target(tb, check, tls):
    """3b: a vmigd source given vmigd's own target form ({"version":1,...,"port":P,
    "ports":[49152]}) for a stock target's port sends its preamble, which the stock target hands
    the destination QEMU as stream bytes: QEMU fails the incoming migration, the source guest
    runs on."""
    src, dst = running_guest(tb)
    key = tb.new_key('mx-3b')
    target = None
    try:
        dst_sock = sp.kubevirt_dst_socket(tb, key)
        vt.configure_migration(src, dst, 0)
        dst.execute('migrate-incoming', {'uri': f'unix:{dst_sock}'})
        target = tb.stock_target(key, {vt.DEFAULT_PORT_ID: dst_sock},
                                 tls=sp.stock_tls(tb.pki, 'target') if tls else None)
        port = int(next(iter(target.target['targetDirectMigrationNodePorts'])))
        own_form = json.dumps({'version': 1, 'key': key, 'address': tb.net.target_addr,
                               'port': port, 'ports': [vt.DEFAULT_PORT_ID]})
        since = tb.source.log_offset()
        sockets = tb.source.source_start(key, own_form, tb.path('src'),
                                         extra=sp.vmigd_tls_flag(tls))
        started = time.monotonic()
        src.execute('migrate', {'uri': f'unix:{sockets[0]}'})
        err = vt.wait_failed_at_home(src)
        took = time.monotonic() - started
        m = tb.source.wait_log(rf'migration {key} role=source: port {vt.DEFAULT_PORT_ID} '
                               r'connection 0.*', since=since)
        recs = target.wait_conns(1)
        delivered = sum(max(r.get('peer_to_local', 0), 0) for r in recs)
        check(delivered > 0, f'{target.name}: the preamble reached the destination '
              f'({delivered} bytes)')
        state = dst_outcome(dst)
        check(not state.startswith('none') and 'inmigrate' not in state
              and 'active' not in state,
              f'the destination QEMU failed the incoming migration: {state}')
        nothing_crashed(tb, check, target)
        return (f'QEMU failed after {took:.1f}s ({err}), guest running; vmigd: "{m.group(0)}"; '
                f'stock target delivered {delivered} bytes; destination {state}: '
                f'"{dst_error_line(dst)}"')
    finally:
        vt.stop_quietly(key, source=tb.source)
        if target is not None:
            target.stop()
        tb.close_qemus(src, dst)


def node_cert_as_client(tb, check):
    """3c: a stock source presenting the node certificate (CN node:virt-handler) as its client
    certificate to a vmigd TLS target that takes only client:migration from sources."""
    src, dst = running_guest(tb)
    m = None
    since = tb.target.log_offset()
    try:
        m = sp.start_migration(tb, src, dst, source='stock', target='vmigd', tls=True,
                               source_cert='node')
        err = vt.wait_failed_at_home(src)
        line = tb.target.wait_log(r'node hop from \S+: TLS refused \(name-not-allowed\).*',
                                  since=since).group(0)
        check(not tb.target.linked(m.key), f'{tb.target.name}: linked a connection for {m.key}')
        state = dst_outcome(dst)
        check(state.startswith('none') or 'inmigrate' in state,
              f'the destination was left alone: {state}')
        peer_errors = [r.get('error', r.get('dial_error', '')) for r in
                       m.peers['source'].wait_conns(1)]
        nothing_crashed(tb, check, m.peers['source'])
        return (f'QEMU failed ({err}), guest running; vmigd: "{line}"; stock source: '
                f'{peer_errors}; destination {state}')
    finally:
        if m is not None:
            vt.stop_quietly(m.key, target=tb.target)
        tb.close_qemus(src, dst)


def client_name_refused_by_stock(tb, check):
    """3c: a vmigd source (client:migration) to a stock target of KubeVirt v1.6 or older, which
    accepts only client:virt-handler."""
    src, dst = running_guest(tb)
    m = None
    since = tb.source.log_offset()
    try:
        m = sp.start_migration(tb, src, dst, source='vmigd', target='stock', tls=True,
                               client_cns=[sp.OLD_CLIENT_CN])
        err = vt.wait_failed_at_home(src)
        line = tb.source.wait_log(rf'migration {m.key} role=source: port \d+ connection \d+ '
                                  r'to \S+: TLS refused \(peer-refused\).*', since=since).group(0)
        target = m.peers['target']
        recs = target.wait_conns(1)
        check(all('common name is invalid' in r.get('error', '') for r in recs),
              f'{target.name}: refused for its name: {[r["line"] for r in recs]}')
        delivered = sum(max(r.get('peer_to_local', 0), 0) for r in recs)
        check(delivered == 0, f'{target.name}: {delivered} bytes reached the destination')
        nothing_crashed(tb, check, target)
        return (f'QEMU failed ({err}), guest running; vmigd: "{line}"; stock target: '
                f'{recs[0].get("error") if recs else None}')
    finally:
        if m is not None:
            vt.stop_quietly(m.key, source=tb.source)
        tb.close_qemus(src, dst)


def control(daemon, request):
    """One request on daemon's control socket (as KubeVirt's shim sends it), the reply."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(daemon.control)
        s.sendall(json.dumps(request).encode() + b'\n')
        return json.loads(vt.recv_all(s).decode())


def sockets_of(tb, key):
    directory = tb.path('src', 'migrationproxy')
    return [f for f in os.listdir(directory) if f.startswith(key)] if os.path.isdir(directory) \
        else []


def unknown_logical_ports(tb, check):
    """3d: KubeVirt's map with logical ports vmigd does not take (only 0, 49152 and 49153
    exist): `vmigctl source start` exits non-zero with one line saying so, the control request
    (the shim's way) is refused with code EINVAL, and no socket is made."""
    out = []
    for ports in ({'40000': 5900}, {'40000': vt.DEFAULT_PORT_ID, '40001': 5900}):
        kmap = {'targetNodeAddress': tb.net.target_addr,
                'targetDirectMigrationNodePorts': ports}
        key = tb.new_key('mx-3d')
        proc = tb.source.ctl('source', 'start', key, '--target', json.dumps(kmap), '--dir',
                             tb.path('src'), '--tls')
        err = proc.stderr.strip()
        check(proc.returncode != 0, f'vmigctl source start with {ports} exited '
              f'{proc.returncode}')
        check(len(err.splitlines()) == 1 and err.startswith('vmigctl: ') and 'invalid' in err
              and 'logical port 5900' in err,
              f'one line naming the logical port that is invalid: {err!r}')
        key2 = tb.new_key('mx-3d')
        reply = control(tb.source, {'op': 'source-start', 'key': key2, 'target': kmap,
                                    'dir': tb.path('src'), 'tls': True})
        check(reply.get('ok') is False and reply.get('code') == 'EINVAL'
              and 'logical port' in reply.get('error', ''),
              f'the control request is refused with EINVAL: {reply}')
        for k in (key, key2):
            check(not sockets_of(tb, k), f'no socket made for {k}: {sockets_of(tb, k)}')
            check(tb.source.migration_status(k) is None, f'{k} is not in status')
        out.append(f'{ports}: vmigctl exit {proc.returncode} "{err}", control reply '
                   f'{reply.get("code")} "{reply.get("error")}"')
    nothing_crashed(tb, check)
    return '; '.join(out)


def connect_refused(tb, addr, port):
    """Whether a TCP connect from the source namespace to addr:port is refused."""
    with vt.netns_socket(tb.net.source_ns) as s:
        s.settimeout(5)
        try:
            s.connect((addr, port))
        except ConnectionRefusedError:
            return True
        except OSError as e:
            if e.errno == errno.ECONNREFUSED:
                return True
            raise
        return False


def restart_with_other_sockets(tb, check):
    """3e: `target start --kubevirt` again for the key with another socket replaces the
    listeners: the old TCP port refuses connections, and a stock source given the new map
    migrates through it."""
    key = tb.new_key('mx-3e')
    old_sock = tb.path('dst', f'{key}-old-{vt.DEFAULT_PORT_ID}.sock')
    since = tb.target.log_offset()
    _, old = tb.target.target_start(key, {vt.DEFAULT_PORT_ID: old_sock},
                                    extra=['--kubevirt', '--no-tls'])
    old_port = int(next(iter(old['targetDirectMigrationNodePorts'])))
    # Something where the first destination would listen, so that the probe is carried.
    with socket.socket(socket.AF_UNIX) as first_dst:
        first_dst.bind(old_sock)
        first_dst.listen(4)
        check(not connect_refused(tb, tb.net.target_addr, old_port),
              f'the first listener takes connections on {old_port}')
    src, dst = qemu_pair(tb, tb.qemu)
    finished = False
    try:
        m = sp.start_migration(tb, src, dst, source='stock', target='vmigd', key=key, tls=False)
        new_ports = [int(p) for p in m.target['targetDirectMigrationNodePorts']]
        check(old_port not in new_ports, f'new ports {new_ports} differ from {old_port}')
        line = tb.target.wait_log(rf'migration {key} role=target: started again with other '
                                  r'arguments.*', since=since).group(0)
        check(connect_refused(tb, tb.net.target_addr, old_port),
              f'the old port {old_port} refuses connections')
        result, digest = finish(tb, m, check)
        finished = True
        nothing_crashed(tb, check)
        return (f'old port {old_port} refused, new {new_ports}; "{line}"; {result.summary()}; '
                f'memory sha256 {digest[:12]}')
    finally:
        if not finished:
            vt.stop_quietly(key, target=tb.target)
        tb.close_qemus(src, dst)


def main():
    checks = vt.Checks('mixed-cluster checks')
    skipped, ran = [], 0
    qemu72 = vt.qemu_binary('7.2')
    try:
        qemu10, why10 = vt.qemu_binary('10.0'), None
    except vt.Skip as e:
        qemu10, why10 = None, str(e)

    def case(name, fn, *args, needs=None):
        nonlocal ran
        if needs is not None:
            vt.log(f'[{name}] SKIPPED: {needs}')
            skipped.append(f'{name}: {needs}')
            return
        vt.log(f'[{name}]')
        started = time.monotonic()
        checks.run(name, fn, tb, checks.check, *args)
        vt.log(f'  ({time.monotonic() - started:.1f}s)')
        ran += 1

    # The vmigd source sends --test-delay-first (delay_main_ms): vmigd-test.
    with sp.StockTestbed(tls=True, qemu=qemu72, daemon_args=KUBEVIRT_TLS_ARGS,
                         source_vmigd=vt.find_test_daemon()) as tb:
        vt.log(f'{tb.describe()}; stock peer {tb.stockpeer}; QEMU {vt.qemu_version(qemu72)} '
               f'{qemu72}; ' + (f'QEMU {vt.qemu_version(qemu10)} {qemu10}' if qemu10 else why10))
        for source, target in (('stock', 'vmigd'), ('vmigd', 'stock')):
            for tls in (False, True):
                what = 'mutual TLS, KubeVirt names' if tls else 'plain text (disableTLS)'
                case(f'1. {source} source -> {target} target, {what}, QEMU 7.2, multifd off',
                     mixed, source, target, tls)
        for source, target, delay in (('stock', 'vmigd', None), ('vmigd', 'stock', 700)):
            case(f'2. {source} source -> {target} target, mutual TLS, QEMU 10.0, multifd '
                 f'{MULTIFD_CHANNELS}' + (', main channel last' if delay else ''), mixed,
                 source, target, True, MULTIFD_CHANNELS, qemu10, delay, needs=why10)
        case('3a. stock source to a target without --kubevirt (shared port, preamble)',
             stock_source_to_shared_port)
        case('3b. vmigd source given vmigd\'s own form for a stock target, TLS',
             vmigd_form_to_stock_target, True)
        case('3b. vmigd source given vmigd\'s own form for a stock target, plain text',
             vmigd_form_to_stock_target, False)
        case('3c. stock source presenting the node certificate to a vmigd target',
             node_cert_as_client)
        case('3c. vmigd source (client:migration) to a stock target taking only '
             'client:virt-handler', client_name_refused_by_stock)
        case('3d. unknown logical ports in the KubeVirt map of source start',
             unknown_logical_ports)
        case('3e. target start --kubevirt again with other sockets', restart_with_other_sockets)
        tb.stop_daemons()
    for line in skipped:
        vt.log(f'SKIPPED: {line}')
    if not ran:
        raise vt.Skip(f'every case skipped: {"; ".join(skipped)}')
    vt.log(f'{ran} cases run, {len(skipped)} skipped')
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
