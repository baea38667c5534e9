#!/usr/bin/env python3
"""Integration test of KubeVirt mode between two vmigd: per-port listeners published
as KubeVirt's map (targetNodeAddress, targetDirectMigrationNodePorts), the source given that
map, ALPN keeping the preamble and the order between two vmigd over TLS, raw relaying in plain
text, idempotent starts, the socket owner and modes, a socket another migration serves, and the
error codes a shim reads, and the progress the stream alone gives a migration started the shim's
way (no convergence control). Real daemons, real QEMU 7.2, two network namespaces."""

import json
import os
import re
import socket
import stat
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

QEMU_UID = 107
PROGRESS_MIB = 128              # the guest of the progress check
PROGRESS_RATE = 48 << 20        # its QEMU max-bandwidth: under 3 s for its one pass
RAM_EXTRA_MAX = 16 << 20        # the stream's total beyond -m: ROMs, firmware, video RAM
REMAINING_SLACK = 8 << 20       # the stream's remaining against QEMU's, mid-pass


def kubevirt_map_ok(target):
    """KubeVirt's fields, with one TCP port per logical port."""
    ports = target.get('targetDirectMigrationNodePorts') or {}
    return (isinstance(target.get('targetNodeAddress'), str) and ports
            and all(k.isdigit() and int(k) > 0 for k in ports)
            and sorted(ports.values()) == [vt.DEFAULT_PORT_ID])


def alpn_ordered(tb, check):
    """TLS, 8 multifd channels, the first connection held back: the target must still open the
    channels in order (QEMU 7.2 needs it), which only the preamble over ALPN can give it."""
    src, dst = tb.qemu_pair(256)
    key = tb.new_key('kv-tls')
    m = tb.start_migration(src, dst, key, 8, delay_first_ms=700, target_args=['--kubevirt'])
    check(kubevirt_map_ok(m.target), f'target start printed KubeVirt\'s map: {m.target_raw}')
    check('port' not in m.target and m.target.get('tls') is True,
          f'no shared port in the map, tls true: {m.target_raw}')
    result, digest = m.finish_verified(timeout=180)
    linked = tb.target.linked(key, 'target')
    check(len(linked) == 9 and all(r.get('wire') == 'vmigd' and r.get('tls', '').startswith('TLS')
                                   for r in linked),
          f'9 connections linked over TLS with the preamble (ALPN): '
          f'{[(r.get("tls"), r.get("wire")) for r in linked]}')
    reordered = int(tb.target.stop_record(key, 'target').get('reordered', -1))
    check(reordered == 8, f'the target held the 8 multifd channels for the main one: '
          f'reordered={reordered}')
    tb.close_qemus(src, dst)
    return f'{result.summary()}, reordered {reordered}, memory sha256 {digest[:12]}'


def plain_raw(tb, check):
    """TLS off for this migration on TLS daemons: raw both ways (no preamble, no order), so
    multifd off with QEMU 7.2."""
    src, dst = tb.qemu_pair(256)
    key = tb.new_key('kv-plain')
    m = tb.start_migration(src, dst, key, 0, target_args=['--kubevirt', '--no-tls'],
                           source_args=['--no-tls'])
    check(m.target.get('tls') is False, f'the map says tls false: {m.target_raw}')
    info = m.wait(timeout=120)
    # Raw links are inspected too: the RAM total from the stream, QEMU's ram.total.
    totals = [(vt.status_inspect(vt.status_migration(d.status(), key, role) or {}) or {})
              .get('ram_total') for d, role in tb.sides()]
    check(totals == [info['ram']['total']] * 2,
          f'RAM total {totals} on raw links, QEMU ram.total {info["ram"]["total"]}')
    result, digest = m.finish_verified(timeout=120)
    for daemon, role in tb.sides():
        linked = daemon.linked(key, role)
        check(linked and all(r.get('wire') == 'raw' and r.get('tls') == 'off' for r in linked),
              f'{daemon.name}: linked raw in plain text: {[r["line"] for r in linked]}')
        check(daemon.stop_record(key, role).get('outcome') == 'ok',
              f'{daemon.name}: outcome ok')
    tb.close_qemus(src, dst)
    return f'{result.summary()}, memory sha256 {digest[:12]}'


def stream_progress(tb, check):
    """The shim's way, which never asks for convergence control: `target start --kubevirt`, then
    `source start` with its map. The inspector reads the RAM total from the stream's setup on both
    sides (QEMU's own ram.total, a little above -m), the source's status has a first-pass
    estimate of what remains (QEMU's ram.remaining, less what is in flight), and `top` draws its
    bar and ETA from it, saying "(stream)"."""
    src, dst = tb.qemu_pair(PROGRESS_MIB)
    key = tb.new_key('kv-progress')
    m = tb.start_migration(src, dst, key, 0, target_args=['--kubevirt'],
                           max_bandwidth=PROGRESS_RATE)
    top_rx = re.compile(rf'^{re.escape(key)}\s+source\s+\[(#+)\.*\]\s.*\s(\d+) s \(stream\)$')
    seen = {}

    def mid_pass():
        qemu_left = (src.migration_info().get('ram') or {}).get('remaining')
        entry = vt.status_migration(tb.source.status(), key, 'source') or {}
        insp = vt.status_inspect(entry)
        if not insp or insp.get('remaining_from') != 'first-pass':
            return None
        total, left = insp.get('ram_total') or 0, insp.get('remaining')
        if not (0 < total and left is not None and 0 < left < total * 3 // 4):
            return None
        seen['insp'], seen['convergence'] = insp, entry.get('convergence')
        seen['qemu_left'] = qemu_left
        out = tb.source.ctl_ok('top', '--count', '1')
        line = next((x for x in out.splitlines() if x.startswith(key)), '')
        seen['top'] = line
        return top_rx.match(line)

    vt.wait_until(mid_pass, 30, 'the first pass a quarter done in status and top', 0.2)
    insp = seen['insp']
    info = m.wait(timeout=120)
    qemu_total = (info.get('ram') or {}).get('total')
    sides = {}
    for daemon, role in tb.sides():
        entry = vt.status_migration(daemon.status(), key, role) or {}
        sides[role] = (vt.status_inspect(entry) or {}).get('ram_total')
    check(sides['source'] == sides['target'] == qemu_total,
          f'RAM total on both sides {sides}, QEMU ram.total {qemu_total}')
    check(PROGRESS_MIB << 20 <= insp['ram_total'] <= (PROGRESS_MIB << 20) + RAM_EXTRA_MAX,
          f'RAM total {insp["ram_total"]} for -m {PROGRESS_MIB}M')
    # The stream's count trails QEMU's by what is in flight (socket buffers, the time between
    # the two questions): a few MiB at this rate.
    check(seen['qemu_left'] is not None and
          abs(insp['remaining'] - seen['qemu_left']) <= REMAINING_SLACK,
          f'mid-pass remaining {insp["remaining"]} from the stream, QEMU said '
          f'{seen["qemu_left"]} just before')
    check(seen['convergence'] is None,
          f'no convergence control, as the shim asks: {seen["convergence"]}')
    result = m.finish(timeout=120)
    tb.close_qemus(src, dst)
    return (f'{result.summary()}; mid-pass remaining {insp["remaining"] >> 20} MiB of '
            f'{insp["ram_total"] >> 20} MiB (QEMU {seen["qemu_left"] >> 20} MiB); '
            f'top: {seen["top"].split("]", 1)[-1].strip()}')


def raw_teardown(tb, check):
    """A stock source never closes its TCP side (the Go proxy closes only its unix side when its
    first copy ends): the destination closing its socket alone must end vmigd's raw link, at
    once, with outcome ok. No QEMU: a unix server that reads everything and closes."""
    payload = 1 << 20
    def read_then_close(conn):
        got = 0
        while got < payload:
            chunk = conn.recv(1 << 16)
            if not chunk:
                break
            got += len(chunk)
        return got  # and the server closes the connection

    dst = tb.unix_server('teardown.sock', read_then_close)
    key = tb.new_key('kv-teardown')
    _, target = tb.target.target_start(key, {vt.DEFAULT_PORT_ID: dst.path},
                                       extra=['--kubevirt', '--no-tls'])
    port = int(next(iter(target['targetDirectMigrationNodePorts'])))
    with tb.net.socket('source') as s:
        s.settimeout(10)
        s.connect((target['targetNodeAddress'], port))
        s.sendall(os.urandom(payload))
        received, = dst.join()
        check(received == payload, f'the destination read {received} of {payload} bytes')
        check(s.recv(1) == b'', 'vmigd passed the destination\'s close on (FIN)')
        # The socket stays open on our side, as a stock source's does.
        try:
            vt.wait_until(lambda: not tb.target.connections(key), 5, 'the raw link to end')
            ended = True
        except vt.HarnessError:
            ended = False
        check(ended, 'the link ended within 5 s while the stock side still held its socket '
              f'open: {tb.target.connections(key)}')
        tb.target.target_stop(key)
        rec = tb.target.stop_record(key, 'target')
        check(rec.get('outcome') == 'ok' and rec.get('conns') == '1',
              f'target stop: outcome ok, 1 connection: {rec}')
    return f'{payload} bytes, link ended by the destination\'s close alone'


def idempotent(tb, check):
    """ProxyManager's rule: the same start again answers the same and changes nothing; another
    one replaces the listeners."""
    key = tb.new_key('kv-idem')
    socks = {vt.DEFAULT_PORT_ID: tb.path('dst', f'{key}.sock'), 0: tb.path('dst', 'virtqemud')}
    raw1, t1 = tb.target.target_start(key, socks, extra=['--kubevirt'])
    raw2, t2 = tb.target.target_start(key, socks, extra=['--kubevirt'])
    check(raw1 == raw2, f'the same target start answers the same: {raw1} / {raw2}')
    s1 = tb.source.source_start(key, raw1, tb.path('src'))
    s2 = tb.source.source_start(key, raw1, tb.path('src'))
    check(s1 == s2 and len(s1) == 2, f'the same source start answers the same: {s1} / {s2}')
    check(any(p.endswith(f'/migrationproxy/{key}-source.sock') for p in s1),
          f'logical port 0 gets KubeVirt\'s name {key}-source.sock: {s1}')
    raw3, t3 = tb.target.target_start(key, socks, bandwidth='10Mi', extra=['--kubevirt'])
    check(set(t3['targetDirectMigrationNodePorts']) != set(t1['targetDirectMigrationNodePorts']),
          f'another start replaced the listeners: {raw1} -> {raw3}')
    check(len([m for m in tb.target.migrations() if m.get('key') == key]) == 1,
          'one target migration for the key after the replace')
    for d, what in ((tb.target, 'target'), (tb.source, 'source')):
        d.ctl_ok(what, 'stop', key)
    return f'same answers; replaced: {raw1} -> {raw3}'


def owner_and_modes(tb, check):
    """Sockets 0660 and migrationproxy/ 0750, owned by --socket-owner (KubeVirt's 107), whatever
    the daemon's umask; uid 107 may connect, anyone else may not."""
    key = tb.new_key('kv-own')
    raw, _ = tb.target.target_start(key, {vt.DEFAULT_PORT_ID: tb.path('dst', f'{key}.sock')},
                                    extra=['--kubevirt'])
    # As /proc/PID/root/var/run/kubevirt: a base directory others may pass through; then only
    # the socket's own owner and mode decide.
    base = tb.path('owned')
    os.makedirs(base, exist_ok=True)
    os.chmod(tb.workdir, 0o711)
    os.chmod(base, 0o755)
    path = tb.source.source_start(key, raw, base)[0]
    st, dst = os.stat(path), os.stat(os.path.dirname(path))
    check(stat.S_IMODE(st.st_mode) == 0o660 and (st.st_uid, st.st_gid) == (QEMU_UID, QEMU_UID),
          f'socket mode {oct(stat.S_IMODE(st.st_mode))} owner {st.st_uid}:{st.st_gid}')
    check(stat.S_IMODE(dst.st_mode) == 0o750 and dst.st_uid == QEMU_UID,
          f'migrationproxy/ mode {oct(stat.S_IMODE(dst.st_mode))} owner {dst.st_uid}')
    for uid, want in ((QEMU_UID, None), (65534, 'EACCES')):
        got = connect_as(tb, path, uid)
        check(got == want, f'uid {uid} connecting: {got or "connected"}, expected '
              f'{want or "connected"}')
    tb.source.ctl_ok('source', 'stop', key)
    tb.target.ctl_ok('target', 'stop', key)
    return f'{path}: 0660 107:107 in a 0750 directory; uid 107 connects, 65534 gets EACCES'


def connect_as(tb, path, uid):
    """Connects to the unix socket path as uid (setpriv) in the source namespace; None, or the
    errno name the connect failed with."""
    probe = ('import errno, socket, sys\n'
             's = socket.socket(socket.AF_UNIX)\n'
             'try:\n'
             '    s.connect(sys.argv[1])\n'
             'except OSError as e:\n'
             '    print(errno.errorcode.get(e.errno, e.errno)); sys.exit(1)\n')
    cmd = [*vt.netns_prefix(tb.net.source_ns), 'setpriv', f'--reuid={uid}', f'--regid={uid}',
           '--clear-groups', '/usr/bin/python3', '-c', probe, path]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if p.returncode not in (0, 1):
        raise vt.HarnessError(f'{" ".join(cmd[:6])}... exited {p.returncode}: {p.stderr}')
    return p.stdout.strip() or None


def hijack(tb, check):
    """Two keys can name the same socket: "col" port 1 and "col-1" port 0. The second start is
    refused, and the first one keeps its socket."""
    base = tb.new_key('col')
    t = json.dumps({'version': 1, 'key': base, 'address': tb.net.target_addr,
                    'port': tb.target.node_hop()[1], 'ports': [1]})
    first = tb.source.source_start(base, t, tb.path('src'))[0]
    other = f'{base}-1'
    t2 = json.dumps({'version': 1, 'key': other, 'address': tb.net.target_addr,
                     'port': tb.target.node_hop()[1], 'ports': [0]})
    try:
        tb.source.source_start(other, t2, tb.path('src'))
        check(False, 'the second start was refused')
    except vt.VmigctlError as e:
        check('is served by migration' in str(e) and base in str(e),
              f'refused naming the live migration: {e}')
    check(os.path.exists(first) and stat.S_ISSOCK(os.stat(first).st_mode),
          f'{first} is still there')
    tb.source.ctl_ok('source', 'stop', base)
    return f'{other} refused; {first} still served'


def codes(tb, check):
    """A program (KubeVirt's shim) reads why a request failed from "code"."""
    reply = control(tb.source, {'op': 'target-stop', 'key': 'never-started'})
    check(reply.get('ok') is False and reply.get('code') == 'ENOENT',
          f'an unknown key answers code ENOENT: {reply}')
    reply = control(tb.source, {'op': 'target-start', 'key': 'k', 'sockets': {'49152': 'rel'},
                                'kubevirt': 'yes'})
    check(reply.get('code') == 'EINVAL' and '"kubevirt" must be true or false' in
          reply.get('error', ''), f'a bad field answers EINVAL and says which: {reply}')


def dual_stack(tb, check):
    """Without --listen, vmigd listens on [::] for both families, as KubeVirt's proxy does."""
    ctl = tb.path('dual.ctl')
    log = open(tb.path('dual.log'), 'w')
    proc = subprocess.Popen([tb.vmigd, '--control', ctl, '--no-tls'], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        vt.wait_until(lambda: os.path.exists(ctl), 10, 'the daemon\'s control socket')
        status = json.loads(subprocess.run([tb.vmigctl, '-c', ctl, 'status', '--json'],
                                           capture_output=True, text=True, check=True).stdout)
        listen = status['listen']
        check(listen.startswith('[::]:'), f'default listen address: {listen}')
        port = int(listen.rpartition(':')[2])
        for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect((host, port))
        return f'{listen} takes IPv4 and IPv6'
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def control(daemon, request):
    """One request on daemon's control socket, the reply as a dict."""
    with vt.netns_socket(None, socket.AF_UNIX) as s:
        s.connect(daemon.control)
        s.sendall(json.dumps(request).encode() + b'\n')
        return json.loads(vt.recv_all(s).decode())


def main():
    checks = vt.Checks('KubeVirt-mode checks')
    # The source is vmigd-test: --test-delay-first is the test build's (doc/control-protocol.md).
    with vt.Testbed(tls=True, source_vmigd=vt.find_test_daemon()) as tb:
        vt.log(f'KubeVirt mode between two vmigd: {tb.describe()}')
        for name, fn in (('TLS, ALPN: preamble and order on per-port listeners', alpn_ordered),
                         ('plain text per migration: raw both ways', plain_raw),
                         ('progress from the stream, as the shim starts migrations',
                          stream_progress),
                         ("raw teardown: the destination's close alone ends the link",
                          raw_teardown),
                         ('idempotent starts', idempotent),
                         ('socket owner and modes', owner_and_modes),
                         ('a socket another migration serves', hijack),
                         ('error codes', codes),
                         ('dual-stack listener by default', dual_stack)):
            vt.log(f'[{name}]')
            checks.run(name, fn, tb, checks.check)
        tb.stop_daemons()
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
