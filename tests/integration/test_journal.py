#!/usr/bin/env python3
"""Log priorities in the journal. Part `standin` (no root): vmigd with stderr redirected to a file
and $JOURNAL_STREAM set to that file's DEV:INO, as systemd sets it for a stream to journald;
--no-tls makes it warn at start. Every line must carry its syslog priority (<4> for the warning,
<6> for the start line, <3> for a start-up error) and neither ident nor pid (the journal adds
both; a start-up error keeps "vmigd:" as vmigd prints it on a terminal); with $JOURNAL_STREAM
naming another file, or unset, the lines are "vmigd[PID]: LEVEL: message" as on a terminal.
Part `systemd` (root, systemd as PID 1, else 77): vmigd-test as a transient Type=notify service
(systemd-run) with WatchdogSec=2s: `journalctl -u UNIT -p warning` shows the warning and the
journal's MESSAGE has no second ident; the service stays active past three watchdog intervals
(the pings are taken); then a second service whose loop --test-wedge holds for 6 s is killed by
systemd's watchdog (Result=watchdog)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

WARNING = 'node hop is plain text (--no-tls)'


def run_daemon(vmigd, tmp, label, stream):
    """vmigd --no-tls until it has logged its start line, stderr to a file; stream: 'own' sets
    $JOURNAL_STREAM to that file, 'other' to another file, None unsets it. (lines, pid)"""
    path = os.path.join(tmp, f'{label}.log')
    env = dict(os.environ)
    env.pop('JOURNAL_STREAM', None)
    with open(path, 'wb') as log:
        if stream:
            st = os.fstat(log.fileno()) if stream == 'own' else os.stat(tmp)
            env['JOURNAL_STREAM'] = f'{st.st_dev}:{st.st_ino}'
        proc = subprocess.Popen([vmigd, '--no-tls', '--listen', '127.0.0.1:0', '--control',
                                 os.path.join(tmp, f'{label}.sock'), '--threads', '1'],
                                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            def started():
                if proc.poll() is not None:
                    raise vt.HarnessError(f'{label}: vmigd exited {proc.returncode}')
                with open(path, errors='replace') as f:
                    return ' started: listen=' in f.read()
            vt.wait_until(started, 15, f'{label}: the start line')
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(20)
    with open(path, errors='replace') as f:
        lines = f.read().splitlines()
    if rc != 0:
        raise vt.HarnessError(f'{label}: vmigd exited {rc}: {lines}')
    return lines, proc.pid


def standin():
    vmigd, _ = vt.find_binaries()
    ck = vt.Checks('journal checks')
    with vt.work_directory('vmig-journal-') as tmp:
        lines, pid = run_daemon(vmigd, tmp, 'journal', 'own')
        vt.log('to the journal: ' + ' | '.join(lines[:3]))
        ck.check(lines and all(ln[:3] in ('<3>', '<4>', '<6>', '<7>') for ln in lines),
                 f'a line without a priority prefix: {lines}')
        ck.check(f'<4>warning: {WARNING}' in '\n'.join(lines), f'no <4> warning line: {lines}')
        ck.check(any(ln.startswith('<6>info: vmigd ') and ' started: ' in ln for ln in lines),
                 f'no <6> start line: {lines}')
        ck.check(not any('vmigd[' in ln or f'[{pid}]' in ln for ln in lines),
                 f'ident or pid in a journal line: {lines}')
        # A start-up error, written before logging is set up, carries <3> too.
        path = os.path.join(tmp, 'bad-option.log')
        env = dict(os.environ)
        with open(path, 'wb') as log:
            st = os.fstat(log.fileno())
            env['JOURNAL_STREAM'] = f'{st.st_dev}:{st.st_ino}'
            rc = subprocess.run([vmigd, '--no-tls', '--listen', 'nowhere', '--control',
                                 os.path.join(tmp, 'bad.sock')], env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                timeout=15).returncode
        with open(path, errors='replace') as f:
            bad = f.read().splitlines()
        ck.check(rc != 0 and bad == ['<3>vmigd: --listen: expected ADDR:PORT (numeric), got '
                                     '"nowhere"'],
                 f'start-up error to the journal: exit {rc}, {bad}')
        for label, stream in (('other-stream', 'other'), ('terminal', None)):
            lines, pid = run_daemon(vmigd, tmp, label, stream)
            vt.log(f'{label}: ' + ' | '.join(lines[:2]))
            ck.check(f'vmigd[{pid}]: warning: {WARNING}' in '\n'.join(lines),
                     f'{label}: no "vmigd[{pid}]: warning:" line: {lines}')
            ck.check(all(ln.startswith(f'vmigd[{pid}]: ') for ln in lines),
                     f'{label}: a line not in the plain format: {lines}')
    ck.finish()
    vt.log('priorities to the journal, the plain format elsewhere')


def sh(*cmd, check=True, timeout=30):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise vt.HarnessError(f'{" ".join(cmd)}: rc={p.returncode} {p.stderr.strip()}')
    return p.stdout


def unit_prop(unit, prop):
    return sh('systemctl', 'show', '-P', prop, unit).strip()


def start_unit(exe, tmp, unit, *extra):
    sh('systemd-run', f'--unit={unit}', '--property=Type=notify', '--property=WatchdogSec=2s',
       '--property=TimeoutStopSec=20', exe, '--no-tls', '--listen', '127.0.0.1:0', '--control',
       os.path.join(tmp, f'{unit}.sock'), '--threads', '1', *extra)


def real_systemd():
    if not os.path.isdir('/run/systemd/system'):
        raise vt.Skip('systemd is not PID 1 here (no /run/systemd/system): no real journal or '
                      'watchdog; part standin and test watchdog stand in for them')
    if os.geteuid() != 0:
        raise vt.Skip('needs root to start system services with systemd-run')
    for tool in ('systemd-run', 'systemctl', 'journalctl'):
        if not shutil.which(tool):
            raise vt.Skip(f'{tool} not installed')
    exe = vt.find_test_daemon()
    ck = vt.Checks('systemd checks')
    tag = uuid.uuid4().hex[:8]
    units = [f'vmigd-journal-{tag}.service', f'vmigd-wedge-{tag}.service']
    with vt.work_directory('vmig-journal-') as tmp:
        try:
            start_unit(exe, tmp, units[0])
            time.sleep(7)        # more than three WatchdogSec= intervals
            ck.check(unit_prop(units[0], 'ActiveState') == 'active',
                     f'{units[0]} not active after 7 s with WatchdogSec=2s: '
                     f'{unit_prop(units[0], "Result")}')
            sh('journalctl', '--sync', check=False)
            warn = sh('journalctl', '-u', units[0], '-p', 'warning', '-o', 'cat', '--no-pager')
            ck.check(f'warning: {WARNING}' in warn, f'journalctl -p warning: {warn!r}')
            ck.check(' started: ' not in warn, f'the info start line at -p warning: {warn!r}')
            recs = [json.loads(x) for x in sh('journalctl', '-u', units[0], '-o', 'json',
                                              '--no-pager').splitlines() if x.strip()]
            msgs = [r for r in recs if r.get('SYSLOG_IDENTIFIER', '').startswith('vmigd')]
            ck.check(msgs and not any('vmigd[' in str(r.get('MESSAGE')) for r in msgs),
                     f'a MESSAGE with the ident in it: {[r.get("MESSAGE") for r in msgs]}')
            ck.check(any(r.get('PRIORITY') == '4' for r in msgs), 'no PRIORITY=4 record')
            start_unit(exe, tmp, units[1], '--test-wedge', '1000,6000')

            def killed():
                return unit_prop(units[1], 'Result') == 'watchdog' or None
            vt.wait_until(killed, 15, f'systemd to kill {units[1]} for its watchdog')
            vt.log(f'{units[1]}: Result=watchdog')
        except vt.HarnessError as e:
            ck.check(False, str(e))
        finally:
            for u in units:
                sh('systemctl', 'stop', u, check=False)
                sh('systemctl', 'reset-failed', u, check=False)
    ck.finish()
    vt.log('journalctl -p warning shows the warning; the watchdog holds and then fires')


if __name__ == '__main__':
    vt.run_main(real_systemd if sys.argv[1:] == ['systemd'] else standin)
