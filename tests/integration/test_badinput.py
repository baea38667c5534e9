#!/usr/bin/env python3
"""Integration test: while a bandwidth-capped 1 GiB migration is in flight, feed the target daemon's
node-hop port and both control sockets bad input and drive vmigctl into its error paths; every
probe must be refused cleanly, both daemons must live on and the migration must still complete."""

import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

CONNECT_TIMEOUT_MS = 2000          # target daemon's --connect-timeout: bounds silent preambles
MIGRATION_MIB, MIGRATION_CHANNELS = 1024, 4
MIGRATION_BANDWIDTH = 80 << 20     # ~13 s for 1 GiB: the probes run while it is in flight


# ---- node hop ------------------------------------------------------------------------------------

def nodehop_probe(tb, target, payload, expect, close_first=False):
    """Connect from the source namespace to the target's node-hop port and send payload. Accept an
    8-byte VMGR reply with status `expect` followed by close, or a close without reply."""
    sock = tb.net.socket('source')
    try:
        sock.settimeout(5)
        sock.connect((target['address'], target['port']))
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            return 'reset while sending'
        if close_first:
            sock.shutdown(socket.SHUT_WR)
        started = time.monotonic()
        data = vt.read_until_close(sock, started + CONNECT_TIMEOUT_MS / 1000 + 5)
        took = time.monotonic() - started
    finally:
        sock.close()
    if not data:
        return f'closed without reply after {took:.1f}s'
    if len(data) != 8:
        raise vt.HarnessError(f'reply of {len(data)} bytes: {data[:32].hex()}')
    status = vt.reply_status(data)
    if status != expect:
        raise vt.HarnessError(f'reply {data.hex()}: status {status} (None: not a version-1 VMGR '
                              f'reply), expected status {expect}')
    return f'status {status} then close after {took:.1f}s'


def silent_flood(tb, target, count):
    """count connections that send half a preamble and go quiet: all must be closed by the target
    within its connect timeout (plus slack)."""
    socks = []
    try:
        for _ in range(count):
            s = tb.net.socket('source')
            s.settimeout(5)
            s.connect((target['address'], target['port']))
            s.sendall(vt.node_hop_preamble('x')[:10])
            socks.append(s)
        deadline = time.monotonic() + CONNECT_TIMEOUT_MS / 1000 + 5
        for s in socks:
            data = vt.read_until_close(s, deadline)
            if data and vt.reply_status(data) != vt.REPLY_MALFORMED:
                raise vt.HarnessError(f'unexpected reply {data.hex()}')
    finally:
        for s in socks:
            s.close()
    return f'all {count} closed by the target'


def nodehop_probes(checks, tb, target, live_key, secret):
    garbage = b'\x00' + os.urandom(255)
    pre = vt.node_hop_preamble
    cases = [
        ('random garbage', garbage, vt.REPLY_MALFORMED, False),
        ('truncated preamble, then close', pre(live_key)[:11], vt.REPLY_MALFORMED, True),
        ('bad magic', pre(live_key, magic=0xDEADBEEF), vt.REPLY_MALFORMED, False),
        ('bad version', pre(live_key, version=2), vt.REPLY_BAD_VERSION, False),
        ('a reserved flag set', pre(live_key, flags=2), vt.REPLY_MALFORMED, False),
        ('reserved field set', pre(live_key, reserved=7), vt.REPLY_MALFORMED, False),
        ('unknown key', pre('no-such-key'), vt.REPLY_UNKNOWN_KEY, False),
        ('unknown port of the live key', pre(live_key, port=1234), vt.REPLY_UNKNOWN_PORT, False),
        ('the live key without its secret', pre(live_key, seq=7), vt.REPLY_NOT_THE_PEER, False),
        ('the live key with a wrong secret', pre(live_key, seq=7, secret=bytes(16)),
         vt.REPLY_NOT_THE_PEER, False),
        ('sequence 0 of the live key again, with its secret', pre(live_key, secret=secret),
         vt.REPLY_DUPLICATE, False),
        ('key length 0', pre('', keylen=0), vt.REPLY_MALFORMED, False),
        ('key length 65535', pre('k' * 128, keylen=65535), vt.REPLY_MALFORMED, False),
        ('key length 129', pre('k' * 129), vt.REPLY_MALFORMED, False),
    ]
    for name, payload, expect, close_first in cases:
        checks.run(f'node hop: {name}', nodehop_probe, tb, target, payload, expect, close_first)


# ---- control socket ------------------------------------------------------------------------------

def control_probe(path, payload, shut_wr=False):
    """Send payload on the control socket; accept a {"ok":false,"error":"..."} line, or a close."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5)
        sock.connect(path)
        try:
            sock.sendall(payload)
            if shut_wr:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return 'closed while we were sending'
        data = vt.read_until_close(sock, time.monotonic() + 5)
    finally:
        sock.close()
    if not data:
        return 'closed without reply'
    if not data.endswith(b'\n') or data.count(b'\n') != 1:
        raise vt.HarnessError(f'reply is not one line: {data[:200]!r}')
    reply = json.loads(data)
    if reply.get('ok') is not False or not isinstance(reply.get('error'), str) \
            or not reply['error'] or '\n' in reply['error']:
        raise vt.HarnessError(f'reply {reply}')
    return f'refused: {reply["error"]}'


def silent_control_client(daemon):
    """A client that connects and says nothing must not block other control requests."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(daemon.control)
        daemon.ctl_ok('status', timeout=5)
    finally:
        sock.close()
    return 'status answered while a silent client was connected'


def control_probes(checks, daemon, workdir):
    sock = os.path.join(workdir, 'unused.sock')
    target = {'version': 1, 'key': 'ctl-src', 'address': '127.0.0.1', 'port': 9,
              'ports': [vt.DEFAULT_PORT_ID]}
    cases = [
        ('not JSON', b'hello daemon\n'),
        ('JSON not an object', b'[1,2,3]\n'),
        ('JSON without op', b'{"key":"x"}\n'),
        ('op not a string', b'{"op":42}\n'),
        ('unknown op', b'{"op":"frobnicate"}\n'),
        ('100 KiB blob', b'{"op":"status","pad":"' + b'A' * (100 << 10) + b'"}\n'),
        ('target-start without sockets', b'{"op":"target-start","key":"ctl-a"}\n'),
        ('target-start without key',
         json.dumps({'op': 'target-start', 'sockets': {'49152': sock}}).encode() + b'\n'),
        ('target-start bad key characters',
         json.dumps({'op': 'target-start', 'key': 'a/b c', 'sockets': {'49152': sock}}).encode()
         + b'\n'),
        ('target-start key of 129 chars',
         json.dumps({'op': 'target-start', 'key': 'k' * 129, 'sockets': {'1': sock}}).encode()
         + b'\n'),
        ('target-start port id 70000',
         json.dumps({'op': 'target-start', 'key': 'ctl-b', 'sockets': {'70000': sock}}).encode()
         + b'\n'),
        ('source-start without target',
         json.dumps({'op': 'source-start', 'key': 'ctl-src', 'dir': workdir}).encode() + b'\n'),
        ('source-start target version 2',
         json.dumps({'op': 'source-start', 'key': 'ctl-src', 'target': {**target, 'version': 2},
                     'dir': workdir}).encode() + b'\n'),
    ]
    for name, payload in cases:
        checks.run(f'control {daemon.name}: {name}', control_probe, daemon.control, payload)
    checks.run(f'control {daemon.name}: half message then close', control_probe, daemon.control,
               b'{"op":"sta', True)
    checks.run(f'control {daemon.name}: silent client', silent_control_client, daemon)


# ---- vmigctl -------------------------------------------------------------------------------------

def ctl_fails(daemon, args, expect_rc=1, control=None):
    """vmigctl (on daemon's control socket, or control) must exit expect_rc with exactly one
    stderr line starting 'vmigctl: '."""
    proc = daemon.ctl(*args, timeout=15, control=control)
    if proc.returncode != expect_rc:
        raise vt.HarnessError(f'exit {proc.returncode}, expected {expect_rc}; '
                              f'stderr {proc.stderr!r}')
    if not proc.stderr.startswith('vmigctl: ') or proc.stderr.count('\n') != 1 \
            or not proc.stderr.endswith('\n'):
        raise vt.HarnessError(f'stderr is not one "vmigctl: " line: {proc.stderr!r}')
    return proc.stderr.strip()


def same_start_again(tb, live):
    """Starts are idempotent (KubeVirt's ProxyManager calls them on every reconcile): the live
    migration's own start again answers the same and leaves it alone."""
    raw, _ = tb.target.target_start(live.key, {vt.DEFAULT_PORT_ID: live.target_sock})
    if raw != live.target_raw:
        raise vt.HarnessError(f'target start answered {raw}, first {live.target_raw}')
    socks = tb.source.source_start(live.key, live.target_raw, tb.path('src'))
    if socks != live.sockets:
        raise vt.HarnessError(f'source start answered {socks}, first {live.sockets}')
    vt.still_in_flight(live)
    return 'the same answers, the migration still in flight'


def vmigctl_probes(checks, tb, live):
    src, tgt = tb.source, tb.target
    sock = tb.path('dst', 'probe.sock')
    long_dir = tb.path('d' * 90)
    os.makedirs(long_dir)
    stale = tb.path('stale.ctl')
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()
    tgt.target_start('ctl-dup', {vt.DEFAULT_PORT_ID: sock})
    target_for = {}
    for key in ('ctl-nodir', 'ctl-long', 'ctl-badjson'):
        target_for[key] = tgt.target_start(key, {vt.DEFAULT_PORT_ID: sock})[0]
    cases = [
        ('target stop of an unknown KEY', tgt, ['target', 'stop', 'no-such-key']),
        ('source stop of an unknown KEY', src, ['source', 'stop', 'no-such-key']),
        ('target start, socket path of 120 bytes', tgt,
         ['target', 'start', 'ctl-long-t', '--socket',
          f'{vt.DEFAULT_PORT_ID}=/tmp/' + 'a' * 115]),
        ('source start, socket path over 107 bytes', src,
         ['source', 'start', 'ctl-long', '--target', target_for['ctl-long'], '--dir', long_dir]),
        ('source start, --dir missing', src,
         ['source', 'start', 'ctl-nodir', '--target', target_for['ctl-nodir'],
          '--dir', tb.path('no', 'such', 'dir')]),
        ('target start, invalid KEY', tgt,
         ['target', 'start', 'bad/key', '--socket', f'{vt.DEFAULT_PORT_ID}={sock}']),
    ]
    for name, daemon, args in cases:
        checks.run(f'vmigctl: {name}', ctl_fails, daemon, args)
    # vmigctl's own refusal, before anything is sent: a usage error (exit 2)
    checks.run('vmigctl: source start, unparsable --target', ctl_fails, src,
               ['source', 'start', 'ctl-badjson', '--target', target_for['ctl-badjson'][:-5],
                '--dir', tb.path('src')], 2)
    checks.run('vmigctl: the live KEY started again with the same arguments', same_start_again,
               tb, live)
    checks.run('vmigctl: daemon not running (no socket)', ctl_fails, src, ['status'], 3,
               tb.path('absent.ctl'))
    checks.run('vmigctl: daemon not running (stale socket)', ctl_fails, src, ['status'], 3, stale)
    for key in ('ctl-dup', *target_for):
        tgt.target_stop(key)


# ---- main ----------------------------------------------------------------------------------------

def main():
    binaries = vt.find_binaries()
    checks = vt.Checks('probes')
    with vt.Testbed(*binaries, target_args=['--connect-timeout', str(CONNECT_TIMEOUT_MS)]) as tb:
        src, dst = tb.qemu_pair(MIGRATION_MIB)
        m = tb.start_migration(src, dst, tb.new_key('live'), MIGRATION_CHANNELS,
                               max_bandwidth=MIGRATION_BANDWIDTH)
        m.wait_active()
        vt.log(f'migration {m.key} in flight; node hop {m.target["address"]}:{m.target["port"]}')

        flood = threading.Thread(target=checks.run, args=(
            'node hop: 20 truncated preambles left silent', silent_flood, tb, m.target, 20))
        flood.start()
        nodehop_probes(checks, tb, m.target, m.key, m.target['secret'])
        for daemon in (tb.target, tb.source):
            control_probes(checks, daemon, tb.workdir)
        vmigctl_probes(checks, tb, m)
        flood.join()

        checks.run('migration still in flight after the probes', vt.still_in_flight, m)
        for daemon in (tb.source, tb.target):
            checks.run(f'{daemon.name} alive and answering', vt.answers, daemon)
        checks.finish()
        result, digest = m.finish_verified(timeout=120)
        vt.log(f'in-flight migration survived: {result.summary()}, memory sha256 {digest[:16]}')
        for daemon, _, rec in m.stop_records():
            if rec.get('outcome') != 'ok':
                raise vt.HarnessError(f'{daemon.name}: {m.key} stopped with {rec}')
        tb.stop_daemons()
    vt.log(f'all {checks.count} checks passed')


if __name__ == '__main__':
    vt.run_main(main)
