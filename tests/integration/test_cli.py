#!/usr/bin/env python3
"""Integration test of vmigd's command line on loopback: bad options fail with one clear line and
exit 1, -n checks a configuration (a key it does not know is an error naming FILE:LINE; a config
others can write, or a FIFO, is refused), a config file is read and the command line overrides it, port 0 binds a free port that status reports, a
second daemon on the same control socket refuses to start and names the first, a lock file that is
a symlink or a FIFO is refused (the link's target untouched), a takeover request naming a pid
that is not the connection's is refused, vmigctl says "vmigd is busy" (exit 4) while 64 clients
hold the control socket, and SIGTERM exits 0 and removes the
control socket."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

BAD = [
    (['--listen', 'nowhere'], '--listen'),
    (['--listen', '127.0.0.1:70000'], '--listen'),
    (['--threads', '0'], '--threads'),
    (['--threads', 'many'], '--threads'),
    (['--order-timeout', '-5'], '--order-timeout'),
    (['--advertise', 'host.example'], '--advertise'),
    (['--data-path', 'teleport'], '--data-path'),
    (['--log-level', 'loud'], '--log-level'),
    (['--control', '/' + 'x' * 120], '--control'),
    (['--config', '/nonexistent/vmigd.conf'], 'cannot read config'),
    (['stray-argument'], 'unexpected argument'),
]


def busy_clients(vmigctl, ctl, problems):
    """64 silent raw clients hold every control slot: vmigctl is turned away, and says so
    ("vmigd is busy: ...", exit 4) instead of dying of SIGPIPE; once they go, status answers."""
    held = []
    try:
        deadline = time.monotonic() + 5
        while len(held) < 64:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(ctl)
            except BlockingIOError:    # the listen queue is full until vmigd accepts
                s.close()
                if time.monotonic() > deadline:
                    raise vt.HarnessError('vmigd did not accept 64 control clients in 5 s')
                time.sleep(0.01)
                continue
            held.append(s)
        # The listen queue is FIFO: connected, the 64 are accepted before vmigctl is.
        p = subprocess.run([vmigctl, '-c', ctl, 'status'], capture_output=True, text=True,
                           timeout=10)
        if p.returncode != 4 or not p.stderr.startswith('vmigctl: vmigd is busy: '):
            problems.append(f'vmigctl with 64 control clients held: rc={p.returncode} '
                            f'stderr={p.stderr!r}, expected rc 4 and "vmigd is busy: ..."')
        vt.log(f'64 control clients held: vmigctl exit {p.returncode}: {p.stderr.strip()}')
    finally:
        for s in held:
            s.close()
    p = vt.wait_until(lambda: (lambda q: q if q.returncode == 0 else None)(
        subprocess.run([vmigctl, '-c', ctl, 'status'], capture_output=True, text=True,
                       timeout=10)), 5, 'status once the 64 clients are gone', interval=0.05)


def main():
    vmigd, vmigctl = vt.find_binaries()
    problems = []
    with vt.work_directory('vmig-cli-') as tmp:
        ctl = os.path.join(tmp, 'ctl.sock')
        for args, needle in BAD:
            p = vt.run_vmigd(vmigd, '--control', ctl, '--no-tls', *args)
            lines = p.stderr.strip().splitlines()
            if p.returncode != 1 or not lines or needle not in lines[0]:
                problems.append(f'vmigd {" ".join(args)}: rc={p.returncode} stderr={p.stderr!r}, '
                                f'expected rc 1 and a line naming {needle}')
        p = vt.run_vmigd(vmigd, '--control', ctl)
        if p.returncode != 1 or 'no-tls' not in p.stderr:
            problems.append(f'without --no-tls: rc={p.returncode} {p.stderr!r}, expected a refusal '
                            'that names --no-tls')

        conf = os.path.join(tmp, 'vmigd.conf')
        with open(conf, 'w') as f:
            f.write('# test configuration\n'
                    f'control {ctl}\n'
                    'listen 127.0.0.1:0\n'
                    'no-tls\n'
                    'threads 3   # trailing comment\n'
                    'order-timeout 2500\n')
        p = vt.run_vmigd(vmigd, '--config', conf, '-n')
        if p.returncode != 0:
            problems.append(f'-n with a good config: rc={p.returncode} {p.stderr!r}')
        with open(conf + '.bad', 'w') as f:
            f.write('threads lots\n')
        p = vt.run_vmigd(vmigd, '--config', conf + '.bad', '-n')
        if p.returncode != 1 or '--threads' not in p.stderr:
            problems.append(f'-n with a bad config: rc={p.returncode} {p.stderr!r}')
        # A key vmigd does not know is an error naming the file and line, never skipped.
        with open(conf + '.typo', 'w') as f:
            f.write('no-tls\nnode-bandwith 100Mi\n')
        p = vt.run_vmigd(vmigd, '--config', conf + '.typo', '-n')
        if p.returncode != 1 or f'{conf}.typo:2: unknown option "node-bandwith"' not in p.stderr:
            problems.append(f'-n with an unknown key: rc={p.returncode} {p.stderr!r}')

        # Read as sshd reads its files: not a config others can write, nor a FIFO (at once).
        os.chmod(conf + '.typo', 0o666)
        p = vt.run_vmigd(vmigd, '--config', conf + '.typo', '-n')
        if p.returncode != 1 or 'is writable by its group and others (mode 0666)' not in p.stderr:
            problems.append(f'-n with a 0666 config: rc={p.returncode} {p.stderr!r}')
        os.mkfifo(conf + '.fifo')
        p = vt.run_vmigd(vmigd, '--config', conf + '.fifo', '-n', timeout=5)
        if p.returncode != 1 or 'is a FIFO, not a regular file' not in p.stderr:
            problems.append(f'-n with a FIFO as config: rc={p.returncode} {p.stderr!r}')

        # The lock file (CONTROL.lock, truncated and given our pid as root) is never reached
        # through a link, and is a regular file.
        victim = os.path.join(tmp, 'victim')
        with open(victim, 'w') as f:
            f.write('precious\n')
        for kind, needle in (('symlink', 'is a symbolic link'), ('fifo', 'not a regular file')):
            lctl = os.path.join(tmp, f'lock-{kind}.sock')
            if kind == 'symlink':
                os.symlink(victim, lctl + '.lock')
            else:
                os.mkfifo(lctl + '.lock')
            p = vt.run_vmigd(vmigd, '--control', lctl, '--no-tls', '--listen', '127.0.0.1:0',
                             timeout=10)
            if p.returncode != 1 or needle not in p.stderr:
                problems.append(f'lock file a {kind}: rc={p.returncode} {p.stderr!r}, expected '
                                f'rc 1 and "{needle}"')
        with open(victim) as f:
            if f.read() != 'precious\n':
                problems.append('the lock file\'s symlink target was written')

        log1 = open(os.path.join(tmp, 'd1.log'), 'wb')
        first = subprocess.Popen([vmigd, '--config', conf, '--threads', '1'],
                                 stdout=log1, stderr=log1, stdin=subprocess.DEVNULL)
        try:
            def status():
                if first.poll() is not None:
                    raise vt.HarnessError(f'vmigd exited {first.returncode} at start-up')
                p = subprocess.run([vmigctl, '-c', ctl, 'status', '--json'], capture_output=True,
                                   text=True, timeout=5)
                return json.loads(p.stdout) if p.returncode == 0 else None
            st = vt.wait_until(status, 15, 'vmigd to answer status')
            listen, threads = vt.status_field(st, 'listen'), vt.status_field(st, 'threads')
            host, port = listen.rsplit(':', 1)
            if host != '127.0.0.1' or not 0 < int(port) < 65536:
                problems.append(f'status listen={listen}, expected 127.0.0.1 and a port')
            if threads != 1:
                problems.append(f'threads={threads}: the command line (1) should override '
                                'the config file (3)')
            p = vt.run_vmigd(vmigd, '--config', conf)
            if p.returncode != 1 or f'pid {first.pid}' not in p.stderr or \
                    'already running' not in p.stderr:
                problems.append(f'second daemon: rc={p.returncode} {p.stderr!r}, expected a '
                                f'refusal naming pid {first.pid}')
            if first.poll() is not None:
                problems.append('the first daemon died when the second tried to start')
            # A takeover names the pid systemd is told (MAINPID=): one that is not the
            # connection's own (SO_PEERCRED) is refused, and the daemon carries on.
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(ctl)
                s.sendall(b'{"op":"takeover","pid":%d,"version":"x"}\n' % first.pid)
                got = s.makefile('rb').readline().decode(errors='replace')
            want = f'it names pid {first.pid} but the connection is pid {os.getpid()}\'s'
            if '"ok":false' not in got or want not in got:
                problems.append(f'takeover naming another pid: reply {got!r}, expected a '
                                f'refusal saying "{want}"')
            vt.log(f'takeover naming another pid: {got.strip()}')
            if status() is None:
                problems.append('no status after the refused takeover')
            busy_clients(vmigctl, ctl, problems)
        finally:
            first.send_signal(signal.SIGTERM)
            rc = first.wait(20)
            log1.close()
        if rc != 0:
            problems.append(f'SIGTERM: exit status {rc}, expected 0')
        if os.path.exists(ctl):
            problems.append('the control socket is still there after exit')
    if problems:
        raise vt.HarnessError('\n  '.join(['command line:'] + problems))
    vt.log(f'{len(BAD)} bad option sets refused; config, -n, port 0, single instance and '
           'SIGTERM behave')


if __name__ == '__main__':
    vt.run_main(main)
