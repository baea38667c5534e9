#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vmigctl against a fake control socket that answers canned replies, in reply version 2 (vmigd
now) and version 1 (vmigd before the figure tables: no top-level "version"), so that a new vmigctl
works against an old daemon during a rollout. No daemon, no root, no QEMU.

For each of `status`, `list`, `metrics` and `top --count 1`: the text of the version 2 reply has
the lines it should, and the version 1 reply of the same state prints the same text. `status
--json` and `metrics --json` print the daemon's reply as it came. The version 1 replies are made
here from the version 2 ones the way the daemon used to write them (git show of ctrl/ctl_proto.c
before reply version 2), independently of vmigctl's own conversion."""

import copy
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading

SKIP = 77


def rates(tx1, tx10, rx1, rx10):
    return {'tx_1s': tx1, 'tx_10s': tx10, 'rx_1s': rx1, 'rx_10s': rx10}


NODE = {'bandwidth': 125000000, 'shaper': 'bucket', 'inspect': True, 'bytes_tx': 1073741824,
        'bytes_rx': 77, 'rates': rates(52428800, 50000000, 1, 2),
        'conns': {'active': 3, 'total': 9}, 'migration_count': 2, 'time_unix': 1700000000.5}

CONV = {
    'mode': 'predictive', 'backend': 'qmp',
    'policy': {'allowAutoConverge': True, 'allowPostCopy': False,
               'allowWorkloadDisruption': False, 'completionTimeoutPerGiB': 150,
               'progressTimeout': 150, 'bandwidth': 67108864, 'maxDowntimeMs': 0,
               'evidenceWindowMs': 2000},
    'state': 'watching', 'elapsed_ms': 21000,
    'action_counts': {'raise-cap': 0, 'auto-converge': 1, 'post-copy': 0, 'pause': 0,
                      'abort': 0},
    'job': {'status': 'active', 'elapsed_ms': 21000, 'total': 1 << 30, 'remaining': 60 << 20,
            'transferred': 900 << 20, 'dirty_rate': 25000000, 'dirty_syncs': 5,
            'rate': 16000000, 'expected_downtime_ms': 300, 'downtime_ms': -1,
            'throttle_pct': 60, 'postcopy_requests': 0, 'guest_running': True},
    'dirty_rate': 24000000, 'dirty_rate_from': 'qemu', 'link_rate': 16500000,
    'query_errors': 0, 'irrecoverable': False,
    'actions': [{'at_s': 5.25, 'action': 'auto-converge', 'ok': True,
                 'reason': 'dirty 23.8 MiB/s (qemu) >= 90% of link 16.0 MiB/s for 2.0 s'}],
}

SOURCE = {
    'key': 'vm-1', 'role': 'source', 'state': 'active', 'mode': 'plain',
    'bytes_tx': 1073741824, 'bytes_rx': 77, 'rates': rates(52428800, 50000000, 1, 2),
    'cap': 67108864, 'limit': 62500000, 'cap_lifted': False,
    'conns': {'active': 2, 'total': 9, 'failed': 1, 'reordered': 0},
    'duration_s': 10.0, 'peer': '198.18.0.2:40123', 'started_unix': 1699999990.5,
    'shaped_ms': 2500,
    'inspect': {'stream_version': 3, 'machine': 'pc-q35-7.2',
                'channels': {'main': 1, 'multifd': 4, 'other': 0}, 'bytes_only': 0,
                'reason': None, 'page_size': 4096, 'pages': 250000, 'zero_pages': 10000,
                'packets': 321, 'syncs': 40, 'passes': 3, 'dirty_known': True,
                'dirty_pages_per_pass': 5000, 'dirty_rate': 20480000, 'switchover': False},
    'ports': [{'id': 49152, 'bytes_tx': 1073741800, 'bytes_rx': 77,
               'rates': rates(52428800, 50000000, 1, 2), 'conns': {'active': 2, 'total': 8},
               'socket': '/run/kubevirt/migrationproxy/vm-1-49152-source.sock'},
              {'id': 0, 'bytes_tx': 24, 'bytes_rx': 0, 'rates': rates(0, 0, 0, 0),
               'conns': {'active': 0, 'total': 1},
               'socket': '/run/kubevirt/migrationproxy/vm-1-source.sock'}],
    'connections': [
        {'port': 49152, 'seq': 0, 'state': 'linked', 'tls': 'off', 'bytes_tx': 4096,
         'bytes_rx': 12, 'rates': rates(11, 12, 13, 14), 'shaped_ms': 1500, 'pacing': 0,
         'inspect': None},
        {'port': 49152, 'seq': 1, 'state': 'linked', 'tls': 'TLSv1.3',
         'cipher': 'TLS_AES_128_GCM_SHA256', 'crypto': 'user-space', 'resumed': True,
         'bytes_tx': 1 << 20, 'bytes_rx': 0, 'rates': rates(0, 0, 0, 0), 'shaped_ms': 0,
         'pacing': 0, 'inspect': None}],
    'convergence': CONV,
}

TARGET = {
    'key': 'vm-2', 'role': 'target', 'state': 'failed', 'mode': 'plain',
    'error': 'port 7 connection 0 did not arrive within 10000 ms',
    'bytes_tx': 0, 'bytes_rx': 5, 'rates': rates(0, 0, 0, 0), 'cap': 0, 'limit': 0,
    'cap_lifted': False, 'conns': {'active': 0, 'total': 0, 'failed': 0, 'reordered': 0},
    'duration_s': 12.25, 'started_unix': 1699999988.25, 'shaped_ms': 0, 'inspect': None,
    'ports': [{'id': 7, 'bytes_tx': 0, 'bytes_rx': 5, 'rates': rates(0, 0, 0, 0),
               'conns': {'active': 0, 'total': 0}, 'socket': '/run/dst.sock'}],
    'connections': [], 'convergence': None,
}

STATUS = {'version': '0.1.0', 'pid': 4242, 'control': '/run/vmigd/control.sock',
          'listen': '0.0.0.0:40123', 'advertise': '198.18.0.2',
          'tls': {'enabled': False, 'ktls_kernel': False}, 'data_path': 'io_uring+splice',
          'threads': 2, 'uptime': 5.125, 'metrics': '127.0.0.1:9100'}


def v2_replies():
    migs = [SOURCE, TARGET]
    return {
        'list': {'ok': True, 'version': 2, 'migrations': migs},
        'status': {'ok': True, 'version': 2,
                   'status': {**STATUS, 'node': NODE, 'migrations': migs}},
        'metrics': {'ok': True, 'version': 2, 'node': NODE, 'migrations': migs},
    }


def v1_migration(m):
    """A migration as version 1's list and status wrote it (add_migration)."""
    o = {'key': m['key'], 'role': m['role'],
         'ports': [{'port': p['id'], 'socket': p['socket']} for p in m['ports']]}
    if 'peer' in m:
        o['peer'] = m['peer']
    o['state'] = m['state']
    if 'error' in m:
        o['error'] = m['error']
    o.update({'seconds': m['duration_s'], 'connections': m['conns']['total'],
              'connections_active': m['conns']['active'],
              'connections_failed': m['conns']['failed'],
              'connections_reordered': m['conns']['reordered'],
              'bytes_tx': m['bytes_tx'], 'bytes_rx': m['bytes_rx'], 'cap': m['cap'],
              'limit': m['limit'], 'rate': m['rates']})
    keep = ('port', 'seq', 'state', 'tls', 'cipher', 'crypto', 'resumed', 'bytes_tx', 'bytes_rx')
    o['connection_list'] = [{k: c[k] for k in keep if k in c} for c in m['connections']]
    if m['convergence'] is not None:
        o['convergence'] = m['convergence']
    return o


def v1_replies():
    migs = [SOURCE, TARGET]
    node = {k: NODE[k] for k in ('bandwidth', 'shaper', 'inspect', 'bytes_tx', 'bytes_rx',
                                   'rates')}
    node.update({'migrations': NODE['migration_count'], 'conns_active': NODE['conns']['active'],
                 'conns_total': NODE['conns']['total'], 'time_unix': NODE['time_unix']})
    status = {k: STATUS[k] for k in ('version', 'pid', 'control', 'listen', 'advertise', 'tls',
                                     'data_path', 'threads', 'uptime')}
    status.update({'migrations': NODE['migration_count'],
                   'connections_active': NODE['conns']['active'],
                   'bandwidth': NODE['bandwidth'], 'shaper': NODE['shaper'],
                   'inspect': NODE['inspect'], 'metrics': STATUS['metrics'],
                   'migration_list': [v1_migration(m) for m in migs]})
    return {
        'list': {'ok': True, 'migrations': [v1_migration(m) for m in migs]},
        'status': {'ok': True, 'status': status},
        # metrics' migrations had version 2's shape already
        'metrics': {'ok': True, 'node': node, 'migrations': copy.deepcopy(migs)},
    }


class FakeDaemon:
    """A unix listener answering each request {"op": OP} with replies[OP], one line."""

    def __init__(self, path, replies):
        self.path, self.replies, self.ops = path, replies, []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b''
                while not data.endswith(b'\n'):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                op = json.loads(data)['op']
                self.ops.append(op)
                reply = self.replies.get(op, {'ok': False, 'error': f'no canned reply for {op}'})
                conn.sendall((json.dumps(reply) + '\n').encode())

    def close(self):
        self.sock.close()


def vmigctl(path, *args):
    proc = subprocess.run([os.environ['VMIGCTL'], '-c', path, *args], capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise AssertionError(f'vmigctl {" ".join(args)} exited {proc.returncode}: '
                             f'{proc.stderr.strip()}')
    return proc.stdout


# Lines the text of these replies must have (exact lines, or /regex/ at a line's start).
WANT = {
    'list': [
        'vm-1 source ports=49152,0 conns=9 active=2 bytes_tx=1073741824 bytes_rx=77 state=active',
        'vm-2 target ports=7 conns=0 active=0 bytes_tx=0 bytes_rx=5 state=failed',
    ],
    'status': [
        'version: 0.1.0', 'pid: 4242', 'listen: 0.0.0.0:40123', 'tls: off (plain text)',
        'uptime: 5.125', 'migrations: 2', 'connections_active: 3', 'bandwidth: 119.2 MiB/s',
        'shaper: bucket', 'inspect: on', 'metrics: http://127.0.0.1:9100/metrics',
        '  vm-1 source port=49152 seq=0 linked tls=off',
        '  vm-1 source port=49152 seq=1 linked tls=TLSv1.3 cipher=TLS_AES_128_GCM_SHA256 '
        'crypto=user-space resumed=yes',
        'convergence vm-1: predictive via qmp, watching at 21.0 s, QEMU active, remaining '
        '60.0 MiB of 1.0 GiB, dirty 23.8 MiB/s, throttle 60%, pass 5',
        '  at 5.2 s: auto-converge: dirty 23.8 MiB/s (qemu) >= 90% of link 16.0 MiB/s for 2.0 s',
    ],
    'metrics': [
        'node: cap 119.2 MiB/s, shaper bucket, inspect on',
        '  sent 1.0 GiB, received 77 B',
        '  rate: tx 50.0 MiB/s (1s) 47.7 MiB/s (10s), rx 1 B/s (1s) 2 B/s (10s)',
        '  connections 3 active, 9 total, 2 migrations',
        'vm-1 source active, mode plain, running 10.0 s, peer 198.18.0.2:40123',
        '  cap 64.0 MiB/s, limit 59.6 MiB/s, shaped 2.5 s',
        '  connections: 2 active, 9 total, 1 failed, 0 reordered',
        '  inspect: stream v3, machine pc-q35-7.2, channels 1 main + 4 multifd, page size 4.0 KiB',
        '    pages: 250000 (zero 10000), packets 321, sync points 40, pass 3, 5000 dirty '
        'pages/pass, dirty 19.5 MiB/s',
        '  port 49152: sent 1024.0 MiB, received 77 B, connections 2 active, 8 total, socket '
        '/run/kubevirt/migrationproxy/vm-1-49152-source.sock',
        '  conn port=49152 seq=1 linked tls=TLSv1.3 cipher=TLS_AES_128_GCM_SHA256 '
        'crypto=user-space resumed=yes',
        '    sent 4.0 KiB, received 12 B, rate: tx 11 B/s (1s) 12 B/s (10s), rx 13 B/s (1s) '
        '14 B/s (10s), shaped 1.5 s',
        '  convergence: predictive via qmp, watching at 21.0 s, QEMU active, remaining 60.0 MiB '
        'of 1.0 GiB, dirty 23.8 MiB/s, throttle 60%, pass 5',
        '    actions: auto-converge 1',
        'vm-2 target failed, mode plain, running 12.2 s',
        '  error: port 7 connection 0 did not arrive within 10000 ms',
        '  inspect: off',
    ],
    'top': [
        'vmigd: node cap 119.2 MiB/s, tx 50.0 MiB/s, rx 1 B/s, 2 migrations, 3 connections '
        '(every 1 s)',
        r'/vm-1 +source +\[#+\.*\] +1\.0 GiB +50\.0 MiB/s +64\.0 MiB/s / 59\.6 MiB/s +22\.9 MiB/s '
        r'+5 2 s \(qemu\)$',
        r'/ +convergence predictive: at 5\.2 s: auto-converge: dirty',
        r'/vm-2 +target +\[\.+\] +5 B +0 B/s +unlimited / unlimited +- +- failed$',
    ],
}
COMMANDS = {'list': ['list'], 'status': ['status'], 'metrics': ['metrics'],
            'top': ['top', '--count', '1']}


def missing_lines(text, want):
    lines = text.splitlines()
    out = []
    for w in want:
        if w.startswith('/'):
            if not any(re.match(w[1:], line) for line in lines):
                out.append(w)
        elif w not in lines:
            out.append(w)
    return out


def main():
    if not os.environ.get('VMIGCTL') or not os.access(os.environ['VMIGCTL'], os.X_OK):
        print('SKIP: set VMIGCTL to the vmigctl binary (meson test sets it)')
        return SKIP
    problems, checks = [], 0
    with tempfile.TemporaryDirectory(prefix='vmigctl-compat-') as tmp:
        daemons = {v: FakeDaemon(os.path.join(tmp, f'v{v}.sock'), r)
                   for v, r in ((2, v2_replies()), (1, v1_replies()))}
        texts = {}
        for name, args in COMMANDS.items():
            for version, d in daemons.items():
                text = vmigctl(d.path, *args)
                texts[(name, version)] = text
                gone = missing_lines(text, WANT[name])
                checks += 1
                if gone:
                    problems.append(f'{name} of a version {version} reply lacks {gone}:\n{text}')
            checks += 1
            if texts[(name, 1)] != texts[(name, 2)]:
                problems.append(f'{name}: a version 1 reply prints otherwise than version 2:\n'
                                f'--- v1\n{texts[(name, 1)]}--- v2\n{texts[(name, 2)]}')
        # --json: the daemon's reply, as it came, either version.
        for version, d in daemons.items():
            got = json.loads(vmigctl(d.path, 'status', '--json'))
            want = d.replies['status']['status']
            checks += 1
            if got != want:
                problems.append(f'status --json of version {version}: {got}, want {want}')
            got = json.loads(vmigctl(d.path, 'metrics', '--json'))
            checks += 1
            if got != d.replies['metrics']:
                problems.append(f'metrics --json of version {version} is not the reply')
        for d in daemons.values():
            d.close()
    for p in problems:
        print(f'FAIL: {p}')
    print(f'{checks} checks, {len(problems)} failed')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
