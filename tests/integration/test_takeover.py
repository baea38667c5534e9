#!/usr/bin/env python3
"""Takeover (vmigd --takeover), real QEMU under TCG, two vmigd in two namespaces, each
migration a capped 2-channel multifd one of a running test guest (96 MiB written: about 4 s at
24 MiB/s):
- plain text: a takeover on the source mid-stream; then twice in a row on the source;
- TLS: a takeover on the target mid-stream; then twice in a row on the target;
  each time the live migration moves to the new vmigd (its connections resume there over new
  node-hop connections) and the old one exits while the migration still runs;
- a target started but not yet connected when its daemon is taken over: it moves to the new
  vmigd with its secret, and the migration that follows goes through it;
- a KubeVirt-mode target started (its per-port TCP ports published) but not yet connected when
  its daemon is taken over: it stays with the old vmigd on those ports, which carry the
  migration that follows (the old one logs the connections and its stop line, the new one's
  status names it kept and `target stop` through the new one reaches it);
- a takeover that fails before it took over (the new vmigd runs --no-tls and cannot carry a TLS
  target on): it exits 1 saying why, the old one carries on (its pid answers status) and the
  migration that follows goes through the old one.
- SIGUSR2 to the source daemon mid-stream, the way an upgrade under systemd runs it: the daemon
  starts its own binary with --takeover; with $NOTIFY_SOCKET set (a datagram socket of the
  test's standing in for systemd) the old one names the new one the main process (MAINPID=).
After each migration: completed, guest memory and every connection's digests equal on both
sides, the stop line of the daemon that ended it says ok and the old daemon exits 0 on its own
once what it carried has ended or moved; the new daemon serves the next migration, memory
verified. A moved migration's cap changes through the new daemon; a KubeVirt-mode target that
stays with the old one is named kept in the new one's status, and `target stop` reaches it."""

import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB, CHANNELS = 128, 2
BANDWIDTH = 24 << 20
GUEST = vt.GuestSpec(96, 4, report_ms=200, fill=True)
NEXT_MIB = 64


def pid_of(d):
    return d.status_field('pid')


def migrate_with_takeovers(ck, tb, label, side, times, at_s=(1.0, 2.0)):
    """A capped migration with `times` takeovers of side's daemon in its middle: each time the
    live migration moves to the new daemon (its connections resume there) and the old one
    exits while the migration still runs."""
    src, dst = tb.qemu_pair(MIB, guest=GUEST)
    src.start_guest()
    key = tb.new_key(f'{side}-x{times}')
    m = tb.start_migration(src, dst, key, CHANNELS, max_bandwidth=BANDWIDTH)
    m.wait_active()
    started = time.monotonic()
    olds = []
    for i in range(times):
        time.sleep(max(0.0, started + at_s[i] - time.monotonic()))
        old = tb.takeover(side)
        olds.append(old)
        ck.check(m.status() == 'active',
                 f'{label} {key}: the migration is {m.status()} right after takeover {i + 1}')
        rc = tb.wait_retired(old, timeout=20)
        state = m.status()
        ck.check(rc == 0 and state == 'active',
                 f'{label} {key}: {old.name} exited {rc} with the migration {state} '
                 f'(expected 0, while it is still active)')
        ck.check(bool(old.log_matches(rf'migration {key} role={side}: moved to vmigd pid')),
                 f'{label} {key}: {old.name} does not say it moved the migration')
    new = tb.source if side == 'source' else tb.target
    # the new daemon ends it, and writes its stop line
    if side == 'source':
        m.source_daemon = new
    else:
        m.target_daemon = new
    took = new.status_field('takeover') or {}
    ck.check(not any(k.get('key') == key for k in took.get('kept', [])),
             f'{label} {key}: status names the moved migration kept: {took}')
    # The new daemon carries it: a cap change is its own, not passed on.
    proc = new.ctl('bandwidth', key, '32Mi')
    ck.check(proc.returncode == 0 and 'passed on' not in proc.stderr,
             f'{label} {key}: bandwidth through the new daemon: {proc.returncode} '
             f'{proc.stderr.strip()}')
    result, digest = m.finish_verified(timeout=120)
    rec = new.stop_record(key, side, timeout=30)
    peer = (tb.target if side == 'source' else tb.source).stop_record(key, 'target' if side ==
                                                                       'source' else 'source')
    conns = CHANNELS + 1
    ck.check(rec.get('outcome') == 'ok' and int(rec.get('resumed', 0)) >= conns,
             f'{label} {key}: the {side} that ended it says outcome {rec.get("outcome")} '
             f'resumed={rec.get("resumed")} (expected ok, at least {conns})')
    ck.check(peer.get('outcome') == 'ok' and int(peer.get('resumed', 0)) >= times * conns,
             f'{label} {key}: its peer says outcome {peer.get("outcome")} '
             f'resumed={peer.get("resumed")} (expected ok, at least {times * conns})')
    ck.check(pid_of(new) == new.proc.pid, f'{label}: status is not answered by {new.name}')
    tb.close_qemus(src, dst)
    return (f'{label}: {times} takeover(s) of the {side} mid-stream, each moving the live '
            f'migration: {result.summary()}, memory {digest[:12]}, resumed {rec.get("resumed")}'
            f'/{peer.get("resumed")}')


def moved_target(ck, tb, label):
    """`target start`, then a takeover of the target daemon, then the migration."""
    src, dst = tb.qemu_pair(NEXT_MIB)
    key = tb.new_key('moved')
    olds = []
    m = tb.start_migration(src, dst, key, CHANNELS,
                           between=lambda: olds.append(tb.takeover('target')))
    m.target_daemon = tb.target   # the new one carries it, and logs its stop line
    result, digest = m.finish_verified(timeout=120)
    ck.check(bool(tb.target.log_matches(rf'migration {key} role=target: port \d+ connection 0 '
                                        r'linked')),
             f'{label} {key}: the new target daemon did not carry the moved target')
    ck.check(bool(olds[0].log_matches(rf'migration {key} role=target: handed over to vmigd')),
             f'{label} {key}: the old target daemon does not say it handed the target over')
    ck.check(tb.wait_retired(olds[0]) == 0, f'{label}: {olds[0].name} did not exit 0')
    tb.close_qemus(src, dst)
    return f'{label}: a target with no connection yet moved: {result.summary()}, {digest[:12]}'


def kubevirt_kept_target(ck, tb, label, tls):
    """`target start --kubevirt`, then a takeover of the target daemon, then the migration to
    the TCP ports that target start published."""
    src, dst = tb.qemu_pair(NEXT_MIB)
    key = tb.new_key('kv-kept')
    olds = []
    # Plain text: a KubeVirt-mode target serves vmigd's source raw (no order): one channel.
    channels = CHANNELS if tls else 0
    m = tb.start_migration(src, dst, key, channels, target_args=['--kubevirt'],
                           between=lambda: olds.append(tb.takeover('target')))
    published = sorted(int(p) for p in m.target.get('targetDirectMigrationNodePorts', {}))
    took = tb.target.status_field('takeover') or {}
    ck.check(any(k.get('key') == key and k.get('role') == 'target'
                 for k in took.get('kept', [])),
             f'{label} {key}: the new daemon\'s status does not name the target kept: {took}')
    result, digest = m.finish_verified(timeout=120)
    old = olds[0]
    linked = old.linked(key, 'target')
    ck.check(len(linked) == channels + 1,
             f'{label} {key}: the old daemon linked {len(linked)} connections, '
             f'expected {channels + 1}')
    ck.check(bool(old.log_matches(rf'migration {key} role=target start ports=\S+ kubevirt')) and
             not tb.target.log_matches(rf'migration {key} role=target'),
             f'{label} {key}: the target is not the old daemon\'s alone')
    ck.check(old.stop_record(key, 'target').get('outcome') == 'ok',
             f'{label} {key}: the old daemon\'s stop line does not say ok')
    ck.check(tb.wait_retired(old) == 0, f'{label}: {old.name} did not exit 0')
    tb.close_qemus(src, dst)
    return (f'{label}: a KubeVirt-mode target with no connection yet stayed on its ports '
            f'{published}: {result.summary()}, {digest[:12]}')


def failed_takeover(ck, tb, label):
    """The new vmigd cannot carry the pending TLS target (it runs --no-tls): it fails before it
    took over, and the old one carries on."""
    src, dst = tb.qemu_pair(NEXT_MIB)
    key = tb.new_key('refused')
    old = tb.target
    before = pid_of(old)
    tried = []

    def try_takeover():
        try:
            tb.takeover('target', tls=False, name='vmigd-target-failed')
        except vt.HarnessError as e:
            tried.append(str(e))
    m = tb.start_migration(src, dst, key, CHANNELS, between=try_takeover)
    ck.check(len(tried) == 1 and 'exited 1' in tried[0] and 'cannot carry on target' in tried[0],
             f'{label}: the failed takeover: {tried}')
    ck.check(tb.target is old and pid_of(old) == before,
             f'{label}: status after the failed takeover is not the old daemon\'s')
    ck.check(bool(old.log_matches(r'went away before it took over; carrying on')),
             f'{label}: the old daemon does not say it carries on')
    result, digest = m.finish_verified(timeout=120)
    tb.close_qemus(src, dst)
    return f'{label}: a failed takeover left the old daemon serving: {result.summary()}'


def next_migration(tb, label):
    src, dst = tb.qemu_pair(NEXT_MIB)
    result, digest = tb.start_migration(src, dst, tb.new_key('next'),
                                        CHANNELS).finish_verified(timeout=120)
    tb.close_qemus(src, dst)
    return f'{label}: next migration {result.summary()}, memory {digest[:12]}'


def run(ck, tls):
    label = 'TLS' if tls else 'plain'
    side = 'target' if tls else 'source'
    with vt.Testbed(tls=tls) as tb:
        try:
            vt.log(migrate_with_takeovers(ck, tb, label, side, 1))
            vt.log(next_migration(tb, label))
            vt.log(migrate_with_takeovers(ck, tb, label, side, 2))
            vt.log(next_migration(tb, label))
            vt.log(moved_target(ck, tb, label))
            vt.log(kubevirt_kept_target(ck, tb, label, tls))
            if tls:
                vt.log(failed_takeover(ck, tb, label))
            vt.log(next_migration(tb, label))
        except vt.HarnessError as e:
            ck.check(False, f'{label}: {e}')
            tb.dump_logs(20)


def run_usr2(ck):
    """SIGUSR2 mid-stream, with a stand-in for systemd's notify socket."""
    label = 'SIGUSR2'
    with vt.Testbed(tls=False) as tb:
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path = tb.path('notify.sock')
        notify.bind(path)
        notify.settimeout(0.2)
        new_pid = None
        try:
            os.environ['NOTIFY_SOCKET'] = path
            tb.replace_daemon('source')            # started with $NOTIFY_SOCKET
            del os.environ['NOTIFY_SOCKET']
            old = tb.source
            src, dst = tb.qemu_pair(MIB, guest=GUEST)
            src.start_guest()
            key = tb.new_key('usr2')
            m = tb.start_migration(src, dst, key, CHANNELS, max_bandwidth=BANDWIDTH)
            m.wait_active()
            time.sleep(1.5)
            old.proc.send_signal(signal.SIGUSR2)
            new_pid = vt.wait_until(lambda: (pid_of(old) != old.proc.pid and pid_of(old)),
                                    20, 'the vmigd started by SIGUSR2 to answer status')
            said = []

            def mainpid():
                try:
                    said.append(notify.recv(4096).decode())
                except socket.timeout:
                    pass
                return any(f'MAINPID={new_pid}' in x for x in said)
            vt.wait_until(mainpid, 10, f'MAINPID={new_pid} on the notify socket')
            result, digest = m.finish_verified(timeout=120)
            rec = old.stop_record(key, 'source', timeout=30)
            ck.check(rec.get('outcome') == 'ok', f'{label}: outcome {rec.get("outcome")}')
            ck.check(tb.wait_retired(old) == 0, f'{label}: the old vmigd did not exit 0')
            vt.log(f'{label}: {result.summary()}, memory {digest[:12]}; the old vmigd said '
                   f'{[x.splitlines()[0] for x in said]}')
            tb.close_qemus(src, dst)
            vt.log(next_migration(tb, label))
        except vt.HarnessError as e:
            ck.check(False, f'{label}: {e}')
            tb.dump_logs(20)
        finally:
            os.environ.pop('NOTIFY_SOCKET', None)
            notify.close()
            if new_pid:
                try:
                    os.kill(new_pid, signal.SIGTERM)
                    vt.wait_until(lambda: not os.path.exists(f'/proc/{new_pid}'), 30,
                                  'the vmigd started by SIGUSR2 to exit')
                except (ProcessLookupError, vt.HarnessError):
                    pass


def main():
    ck = vt.Checks('takeover checks')
    run(ck, False)
    run(ck, True)
    run_usr2(ck)
    ck.finish()


if __name__ == '__main__':
    vt.run_main(main)
