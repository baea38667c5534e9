#!/usr/bin/env python3
"""The fault matrix, plain and TLS: a capped 2-channel multifd migration of a running
test guest (128 MiB, 96 of them written: about 4 s at 24 MiB/s) between two vmigd in two
namespaces, and one fault in its middle:
- kill -9 of the source daemon, and of the target daemon;
- SIGSTOP of either daemon for 3 s, then SIGCONT;
- the veth link down for 2 s, and for 20 s;
- the destination QEMU killed;
- `source stop` and `target stop` mid-stream (at 8 MiB/s: the 5 s grace ends before it does);
- a takeover (vmigd --takeover) of the source daemon, and of the target daemon: the live
  migration moves to the new one (its connections resume there), which ends it and writes its
  stop line; the old one exits 0 on its own (one that could not move at that moment, as on a
  loaded machine, stays with the old one, which says why, ends it and then exits 0).
After each: the migration completed or failed within BOUND_S of the fault's end (a fault that
only pauses the hop must complete); the guest runs on exactly one side (a failed migration: on
the source, its serial going on; a completed one: on the destination once let run); the stop
lines say what happened (a target cut short in plain text says cut-short and who, finding 6);
then a killed daemon is started again and both serve the next migration (64 MiB, 2 channels)
with memory verified. At the end, the daemons that lived through the matrix hold no more fds
than after their first migration and their RSS grew by less than 32 MiB. test_takeover.py has
more of takeover (twice in a row, a target moved, a takeover that fails). `test_faults.py plain`
or `tls` runs one half (meson: tests faults and faults_tls)."""

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB, CHANNELS = 128, 2
BANDWIDTH = 24 << 20
SLOW_BANDWIDTH = 8 << 20
FAULT_AT_S = 1.5
BOUND_S = 60
NEXT_MIB = 64
GUEST = vt.GuestSpec(96, 4, report_ms=200, fill=True)   # 96 MiB to send: ~4 s at the cap


def pid_fds(pid):
    return len(os.listdir(f'/proc/{pid}/fd'))


def pid_rss_kib(pid):
    with open(f'/proc/{pid}/status') as f:
        return int([line for line in f if line.startswith('VmRSS:')][0].split()[1])


def kill9(side):
    def fault(tb, m, src, dst):
        d = tb.source if side == 'source' else tb.target
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        return f'kill -9 of the {side} daemon'
    return fault


def sigstop(side, seconds):
    def fault(tb, m, src, dst):
        d = tb.source if side == 'source' else tb.target
        d.proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        d.proc.send_signal(signal.SIGCONT)
        return f'SIGSTOP of the {side} daemon for {seconds} s'
    return fault


def link_down(seconds):
    def fault(tb, m, src, dst):
        ip = ['ip', '-n', tb.net.source_ns, 'link', 'set', tb.net.source_if]
        subprocess.run(ip + ['down'], check=True)
        time.sleep(seconds)
        subprocess.run(ip + ['up'], check=True)
        return f'the link down for {seconds} s'
    return fault


def kill_destination(tb, m, src, dst):
    dst.proc.send_signal(signal.SIGKILL)
    dst.proc.wait(10)
    return 'the destination QEMU killed'


def stop_side(side):
    def fault(tb, m, src, dst):
        if side == 'source':
            tb.source.source_stop(m.key)
        else:
            tb.target.target_stop(m.key)
        return f'`{side} stop` mid-stream'
    return fault


def takeover(side):
    def fault(tb, m, src, dst):
        tb.fault_carrier = (side, tb.takeover(side))
        return f'a takeover of the {side} daemon'
    return fault


# (name, fault, outcome: 'complete', 'fail' or 'either', the side whose daemon is killed, the
# cap). `stop` lets connections run for a 5 s grace: those migrations take 12 s, so it cuts them.
CASES = [
    ('kill-source', kill9('source'), 'fail', 'source', BANDWIDTH),
    ('kill-target', kill9('target'), 'fail', 'target', BANDWIDTH),
    ('stop-source', sigstop('source', 3), 'complete', None, BANDWIDTH),
    ('stop-target', sigstop('target', 3), 'complete', None, BANDWIDTH),
    ('link-2s', link_down(2), 'complete', None, BANDWIDTH),
    ('link-20s', link_down(20), 'either', None, BANDWIDTH),
    ('kill-destination', kill_destination, 'fail', None, BANDWIDTH),
    ('source-stop', stop_side('source'), 'fail', None, SLOW_BANDWIDTH),
    ('target-stop', stop_side('target'), 'fail', None, SLOW_BANDWIDTH),
    ('takeover-source', takeover('source'), 'complete', None, BANDWIDTH),
    ('takeover-target', takeover('target'), 'complete', None, BANDWIDTH),
]


def ended(m):
    info = m.src.migration_info()
    return info if info.get('status') not in ('setup', 'active', 'device') else None


def dst_state(dst):
    """The destination QEMU's run state; 'gone' once it exited (QEMU ends on a failed incoming
    migration); 'no answer' while its main loop waits on a multifd channel that will never
    come, as 7.2 can after a cut."""
    if dst.proc.poll() is not None:
        return 'gone'
    try:
        return dst.execute('query-status', timeout=5)['status']
    except vt.HarnessError:
        # Its QMP closed under the question: QEMU is on its way out.
        try:
            dst.proc.wait(timeout=2)
            return 'gone'
        except subprocess.TimeoutExpired:
            return 'no answer'


def carrier(tb, d, key, role):
    """The daemon that carried migration KEY's ROLE to its end, and why, if not d: after a
    takeover of that side, the old vmigd keeps a migration that could not move at that moment
    (a connection still being set up or checked, or not quiet within the 3 s a move waits for,
    as on a loaded machine) and says so; it ends it and writes its stop line there."""
    if not tb.fault_carrier or tb.fault_carrier[0] != role:
        return d, None
    old = tb.fault_carrier[1]
    for line in old.migration_lines(key):
        if 'stays with this vmigd' in line or 'not moved to the vmigd taking over' in line:
            return old, line
    return d, None


def stop_line(d, key, role):
    """The stop line's fields, after `ROLE stop` where the migration still exists."""
    if not d.log_matches(rf'migration {key} role={role} stop '):
        (d.source_stop if role == 'source' else d.target_stop)(key)
    return d.stop_record(key, role, timeout=15)


def run_case(ck, tb, label, name, fault, want, killed, bandwidth):
    src, dst = tb.qemu_pair(MIB, guest=GUEST)
    src.start_guest()
    key = tb.new_key(name)
    m = tb.start_migration(src, dst, key, CHANNELS, max_bandwidth=bandwidth)
    m.wait_active()
    time.sleep(FAULT_AT_S)
    tb.fault_carrier = None
    what = fault(tb, m, src, dst)
    done = time.monotonic()
    info = vt.wait_until(lambda: ended(m), BOUND_S, f'{label} {name}: the migration to end')
    took = time.monotonic() - done
    status = info['status']
    tag = f'{label} {name} ({what})'
    ck.check(want == 'either' or status == ('completed' if want == 'complete' else 'failed'),
             f'{tag}: source QEMU says {status} {took:.1f} s after the fault, expected {want}')
    if status == 'completed':
        m.wait()
        digest = vt.verify_memory(src, dst)
        dst.execute('cont')
        vt.wait_until(lambda: dst.run_state() == 'running', 10, 'the destination to run')
        ck.check(src.run_state() == 'postmigrate',
                 f'{tag}: source {src.run_state()} after completion, expected postmigrate')
        where = f'completed, memory {digest[:12]}, guest on the destination'
    else:
        state = vt.wait_until(lambda: src.run_state() != 'finish-migrate' and src.run_state(),
                              10, 'the source guest to settle')
        n = len(src.serial_lines())
        there = dst_state(dst)
        ck.check(state == 'running', f'{tag}: source guest {state} after the failure')
        ck.check(there != 'running',
                 f'{tag}: destination {there}: the guest must not run there too')
        vt.wait_until(lambda: len(src.serial_lines()) > n, 10,
                      f'{tag}: the source guest to report again')
        where = f'failed ({info.get("error-desc", "")[:60]}), guest on the source ({there} there)'
    lines = []
    for d, role in ((tb.source, 'source'), (tb.target, 'target')):
        if killed == role:
            continue
        d, stayed = carrier(tb, d, key, role)
        rec = stop_line(d, key, role)
        lines.append(f'{role}: {rec.get("outcome")}')
        if stayed:
            lines.append(f'{role} stayed with {d.name}: {stayed.split(": ", 1)[-1][-90:]}')
        if status == 'completed':
            ck.check(rec.get('outcome') == 'ok', f'{tag}: {role} outcome {rec.get("outcome")}')
        elif role == 'target' and name == 'kill-source':
            # The source node's vmigd died: its connections were resumable, so the target kept
            # the destination's sockets waiting for them, said so, and the stop cut them.
            line = [x for x in d.migration_lines(key) if ' stop ' in x][0]
            lost = [x for x in d.migration_lines(key) if 'node hop lost' in x]
            ck.check(rec.get('outcome', '').startswith('stopped') and ': warning: ' in line and
                     lost, f'{tag}: the target says its node hop was lost, then stopped with its '
                     f'connections in flight: {line}; {lost[:1]}')
        elif role == 'target' and name == 'kill-destination' and label == 'plain':
            # No socket error, yet the stream ended before QEMU's switchover (finding 6).
            ok = rec.get('outcome') == 'cut-short'
            line = [x for x in d.migration_lines(key) if ' stop ' in x][0]
            who = 'destination QEMU closed it first'
            ck.check(ok and ': warning: ' in line and who in line,
                     f'{tag}: the target says cut-short, {who!r}, as a warning: {line}')
        elif status != 'completed':
            ck.check(rec.get('outcome') != 'ok',
                     f'{tag}: {role} outcome {rec.get("outcome")} for a failed migration')
    tb.close_qemus(src, dst)
    if tb.fault_carrier:
        old = tb.fault_carrier[1]
        rc = tb.wait_retired(old)
        ck.check(rc == 0, f'{tag}: {old.name} exited {rc} once it had handed over')
        lines.append(f'{old.name} exited {rc}')
    if killed:
        tb.replace_daemon(killed, killed=True)
    vt.log(f'  {tag}: {where} in {took:.1f} s; stop lines {lines}')
    # Both daemons serve the next migration.
    src, dst = tb.qemu_pair(NEXT_MIB)
    result, digest = tb.start_migration(src, dst, tb.new_key(f'{name}-next'),
                                        CHANNELS).finish_verified(timeout=120)
    tb.close_qemus(src, dst)
    return f'next: {result.summary()}, memory {digest[:12]}'


def run_matrix(ck, tls):
    label = 'TLS' if tls else 'plain'
    vt.log(f'{label}:')
    with vt.Testbed(tls=tls) as tb:
        src, dst = tb.qemu_pair(NEXT_MIB)
        tb.start_migration(src, dst, tb.new_key('warm'), CHANNELS).finish_verified(timeout=120)
        tb.close_qemus(src, dst)
        base = {d.proc.pid: (pid_fds(d.proc.pid), pid_rss_kib(d.proc.pid))
                for d in (tb.source, tb.target)}
        # VMIG_FAULT_CASES=takeover-source,link-2s: those only (by hand)
        only = [x for x in os.environ.get('VMIG_FAULT_CASES', '').split(',') if x]
        for case in (c for c in CASES if not only or c[0] in only):
            try:
                vt.log(f'  {run_case(ck, tb, label, *case)}')
            except vt.HarnessError as e:
                ck.check(False, f'{label} {case[0]}: {e}')
                tb.dump_logs(15)
                return
        for d in (tb.source, tb.target):
            pid = d.proc.pid
            if pid not in base:
                continue
            fds, rss = pid_fds(pid), pid_rss_kib(pid)
            vt.log(f'  {d.name}: fds {base[pid][0]} -> {fds}, RSS {base[pid][1]} -> {rss} KiB')
            ck.check(fds <= base[pid][0], f'{label} {d.name}: {fds} fds, {base[pid][0]} after '
                     'its first migration')
            ck.check(rss - base[pid][1] < 32 * 1024, f'{label} {d.name}: RSS grew '
                     f'{(rss - base[pid][1]) // 1024} MiB over the matrix')


def main():
    """Argument 'plain' or 'tls': that half of the matrix only (meson runs the two halves as
    two tests, side by side); none: both."""
    halves = sys.argv[1:] or ['plain', 'tls']
    if any(h not in ('plain', 'tls') for h in halves):
        raise vt.HarnessError(f'usage: test_faults.py [plain|tls]..., not {halves}')
    ck = vt.Checks('fault cases')
    for half in halves:
        run_matrix(ck, half == 'tls')
    ck.finish()


if __name__ == '__main__':
    vt.run_main(main)
