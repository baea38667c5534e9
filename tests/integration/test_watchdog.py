#!/usr/bin/env python3
"""The systemd service watchdog, against a stand-in for systemd's side: the test binds the
AF_UNIX datagram socket $NOTIFY_SOCKET names and starts vmigd-test (the daemon with its test hooks)
with WATCHDOG_USEC=400000 and WATCHDOG_PID set to its pid, as systemd does for WatchdogSec=. It
judges the pings as systemd's watchdog does: READY=1, then WATCHDOG=1 with no gap longer than
WATCHDOG_USEC while the loop turns. A stopped thread cannot be had (SIGSTOP stops the process),
so the loop is wedged from inside: vmigd-test's --test-wedge 1000,1000 makes one of the control
loop's timer callbacks sleep 1 s, 1 s after start. The pings must stop for longer than
WATCHDOG_USEC (systemd would have killed it) and come back once the loop turns again. Then a
WATCHDOG_PID that is not vmigd's (the environment inherited by some other process) and no
WATCHDOG_USEC: READY=1 and no ping. Last, an upgrade as under systemd: SIGUSR2 starts a new
vmigd with --takeover, whose WATCHDOG_PID is the old one's; the stand-in reads each datagram's
sender (SO_PASSCRED) and takes pings only from the main process, which MAINPID= changes, as
systemd does. The old one's hand-over carries a ping, it pings no more after it, the new one
takes over the pings, and the main process's pings never leave a gap over WATCHDOG_USEC. Needs
no root."""

import os
import signal
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

USEC = 400000
WEDGE_AFTER_MS, WEDGE_FOR_MS = 1000, 1000


def run(ck, exe, tmp, label, watchdog_env, seconds, extra=()):
    """vmigd-test under a stand-in notify socket for `seconds`: [(t, message)], t in seconds
    since start, and its log. watchdog_env: 'own' (WATCHDOG_PID is vmigd's), 'other', None."""
    path = os.path.join(tmp, f'notify-{label}.sock')
    ctl = os.path.join(tmp, f'ctl-{label}.sock')
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(path)
    notify.settimeout(0.05)
    env = dict(os.environ, NOTIFY_SOCKET=path)
    env.pop('WATCHDOG_PID', None)
    env.pop('WATCHDOG_USEC', None)
    cmd = [exe, '--no-tls', '--listen', '127.0.0.1:0', '--control', ctl, '--threads', '1',
           *extra]
    if watchdog_env:
        env['WATCHDOG_USEC'] = str(USEC)
        # WATCHDOG_PID is the pid systemd forks and execs: the shell's, which exec keeps.
        pid = '$$' if watchdog_env == 'own' else '1'
        cmd = ['/bin/sh', '-c', f'WATCHDOG_PID={pid} exec "$@"', 'sh', *cmd]
    logpath = os.path.join(tmp, f'{label}.log')
    said = []
    with open(logpath, 'wb') as log:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < seconds and proc.poll() is None:
                try:
                    said.append((time.monotonic() - t0, notify.recv(4096).decode()))
                except socket.timeout:
                    pass
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(20)
            notify.close()
    with open(logpath, errors='replace') as f:
        text = f.read()
    ck.check(rc == 0, f'{label}: vmigd-test exited {rc}; its log:\n{text}')
    return said, text


def pings(said):
    return [t for t, m in said if 'WATCHDOG=1' in m.split('\n')]


def takeover(ck, exe, tmp):
    """SIGUSR2 0.8 s after start; the datagrams for 2.2 s more, each with its sender's pid."""
    path, ctl = os.path.join(tmp, 'notify-usr2.sock'), os.path.join(tmp, 'ctl-usr2.sock')
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(path)
    notify.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    notify.settimeout(0.05)
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC=str(USEC))
    cmd = ['/bin/sh', '-c', 'WATCHDOG_PID=$$ exec "$@"', 'sh', exe, '--no-tls', '--listen',
           '127.0.0.1:0', '--control', ctl, '--threads', '1']
    said, new_pid = [], None
    with open(os.path.join(tmp, 'usr2.log'), 'wb') as log:
        old = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        t0, signalled = time.monotonic(), False
        try:
            while time.monotonic() - t0 < 3.0:
                if not signalled and time.monotonic() - t0 > 0.8:
                    old.send_signal(signal.SIGUSR2)
                    signalled = True
                try:
                    msg, anc, _, _ = notify.recvmsg(4096, socket.CMSG_SPACE(12))
                except socket.timeout:
                    continue
                pid = next((struct.unpack('3i', d[:12])[0] for lv, ty, d in anc
                            if lv == socket.SOL_SOCKET and ty == socket.SCM_CREDENTIALS), None)
                said.append((time.monotonic() - t0, pid, msg.decode()))
                for line in msg.decode().split('\n'):
                    if line.startswith('MAINPID='):
                        new_pid = int(line[8:])
            old_rc = old.wait(20)
        finally:
            if old.poll() is None:
                old.kill()
                old.wait()
            if new_pid:
                try:
                    os.kill(new_pid, signal.SIGTERM)
                    vt.wait_until(lambda: not os.path.exists(f'/proc/{new_pid}'), 20,
                                  'the vmigd started by SIGUSR2 to exit')
                except ProcessLookupError:
                    pass
            notify.close()
    with open(os.path.join(tmp, 'usr2.log'), errors='replace') as f:
        text = f.read()
    ck.check(old_rc == 0, f'takeover: the old vmigd exited {old_rc}:\n{text}')
    if not ck.check(new_pid, f'takeover: no MAINPID= on the notify socket: {said}\n{text}'):
        return
    # systemd's side: a message counts only from the main process at its arrival; MAINPID=
    # in it changes the main process, WATCHDOG=1 in it resets the timer.
    main, accepted, refused, handover = old.pid, [], [], None
    for t, pid, m in said:
        lines = m.split('\n')
        if pid != main:
            refused.append((round(t, 3), pid, lines))
            continue
        if f'MAINPID={new_pid}' in lines:
            main, handover = new_pid, (t, 'WATCHDOG=1' in lines)
        if 'WATCHDOG=1' in lines:
            accepted.append(t)
    gaps = [round(b - a, 3) for a, b in zip(accepted, accepted[1:]) if b - a > USEC / 1e6]
    after = [t for t in accepted if handover and t > handover[0]]
    old_after = [t for t, pid, m in said if pid == old.pid and handover and t > handover[0]
                 and 'WATCHDOG=1' in m.split('\n')]
    vt.log(f'takeover: old pid {old.pid}, new {new_pid}; hand-over at {handover}; '
           f'{len(accepted)} pings taken, {len(refused)} datagrams refused; gaps {gaps}')
    ck.check(handover and handover[1], f'takeover: the MAINPID= datagram has no WATCHDOG=1: '
             f'{said}')
    ck.check(not gaps, f'takeover: the main process left gaps over {USEC} us: {gaps}')
    ck.check(len(after) >= 5, f'takeover: {len(after)} pings from the new vmigd after the '
             f'hand-over, expected >= 5 in 2.2 s')
    ck.check(not old_after, f'takeover: the old vmigd pinged after its hand-over: {old_after}')


def main():
    exe = vt.find_test_daemon()
    ck = vt.Checks('watchdog checks')
    limit = USEC / 1e6
    with vt.work_directory('vmig-watchdog-') as tmp:
        said, text = run(ck, exe, tmp, 'wedged', 'own', 4.0,
                         ('--test-wedge', f'{WEDGE_AFTER_MS},{WEDGE_FOR_MS}'))
        ready = [t for t, m in said if 'READY=1' in m.split('\n')]
        ts = pings(said)
        ck.check(len(ready) == 1, f'READY=1 {len(ready)} times, expected once: {said}')
        ck.check('systemd watchdog: 400 ms; the control loop sends WATCHDOG=1 every 200 ms'
                 in text, f'no start line naming the watchdog in the log:\n{text}')
        if ready and ts:
            # systemd's rule: from READY=1, each ping within WATCHDOG_USEC of the last.
            marks = [ready[0]] + ts
            gaps = [(b - a, a) for a, b in zip(marks, marks[1:])]
            late = [(round(g, 3), round(a, 3)) for g, a in gaps if g > limit]
            # The wedge's timer starts just before READY=1.
            before = [t for t in ts if t < ready[0] + WEDGE_AFTER_MS / 1000 - 0.1]
            after = [t for t in ts if t > ready[0] + (WEDGE_AFTER_MS + WEDGE_FOR_MS) / 1000 + 0.2]
            vt.log(f'READY=1 at {ready[0]:.3f} s; {len(ts)} pings; gaps over {limit} s '
                   f'(gap, from): {late}')
            ck.check(len(before) >= 4, f'{len(before)} pings before the wedge, expected >= 4 '
                     f'(every {USEC // 2000} ms): {ts}')
            ck.check(len(late) == 1 and late[0][0] >= WEDGE_FOR_MS / 1000 - 0.3,
                     f'expected exactly one gap over {limit} s, of about {WEDGE_FOR_MS} ms '
                     f'(the wedge): {late}')
            ck.check(len(after) >= 4, f'{len(after)} pings after the wedge, expected >= 4: {ts}')
        else:
            ck.check(False, f'no READY=1 or no WATCHDOG=1: {said}\n{text}')
        ck.check('--test-wedge: the control loop runs again' in text,
                 'the log does not say the wedge ended')

        for label, env in (('other-pid', 'other'), ('no-watchdog', None)):
            said, text = run(ck, exe, tmp, label, env, 1.0)
            ck.check(any('READY=1' in m for _, m in said), f'{label}: no READY=1: {said}')
            ck.check(not pings(said), f'{label}: WATCHDOG=1 sent: {said}')
            ck.check('systemd watchdog' not in text, f'{label}: a watchdog in the log:\n{text}')
        takeover(ck, exe, tmp)
    ck.finish()
    vt.log('pings every 200 ms, none while the loop was held 1 s, then again; none for '
           'another pid or without WATCHDOG_USEC; a takeover hands the pings over')


if __name__ == '__main__':
    vt.run_main(main)
