#!/usr/bin/env python3
"""Integration test of the convergence module: real QEMU running the test guest (tests/guest),
which dirties a working set at a set rate, migrated through two vmigd daemons with a cap; the
source daemon follows the migration on a QMP socket of its own (`source start --qmp`) while the
test drives QEMU on another.

256 MiB guests, a 64 MiB working set, a 16 MiB/s cap (memory / cap = 16 s), no multifd (QEMU 7.2
cannot combine it with post-copy), downtime limit 300 ms.
- predictive, 4 MiB/s dirty: completes in pre-copy, no action;
- predictive, 24 MiB/s (1.5x the cap), auto-converge allowed: throttles, completes within
  2 x memory / cap = 32 s, the first action within 5 s of the evidence (QEMU's second bitmap sync
  with the dirty rate at the link);
- predictive, 24 MiB/s, post-copy allowed: switches to post-copy and completes; memory verified;
- predictive, 24 MiB/s, nothing allowed: aborts within the window with "cannot converge: dirty X
  MiB/s >= link Y MiB/s" in status and log; the source guest still runs (its serial goes on);
- kubevirt mode, completionTimeoutPerGiB 10 (1 GB: a 10 s deadline): nothing at 4 MiB/s; with
  post-copy allowed, post-copy just after 10 s; with nothing allowed, abort just after 10 s.
Each line reports the time to the first action, the total time and QEMU's downtime."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigharness as vh  # noqa: E402

MIB = vh.MIB
MEM_MIB, WS_MIB, CAP_MIB = 256, 64, 16
LOW, HIGH = 4, 24                  # MiB/s the guest dirties
KUBEVIRT_PER_GIB = 10              # s: 256 MiB rounds up to 1 GB, so a 10 s deadline
ACT_WITHIN = 5.0                   # s from the evidence to the first predictive action
CATCHUP_MS = 2                     # the guest makes up little lost time: a throttle slows it


def conv(tb, key):
    """The source daemon's convergence object for key (status --json)."""
    for m in tb.source.status().get('migration_list', []):
        if m['key'] == key and m['role'] == 'source':
            c = m.get('convergence')
            if c is None:
                raise vh.HarnessError(f'{key}: no convergence object in status')
            return c
    raise vh.HarnessError(f'{key}: not in the source daemon\'s status')


def run(tb, name, rate, mode='predictive', policy=(), postcopy=False, expect='completed',
        timeout=120, check=None):
    """One migration of a guest dirtying `rate` MiB/s; follows QEMU's query-migrate every 0.2 s.
    Returns a dict: status, first action (name, at_s), evidence_s, total_s, downtime_ms, the
    convergence object, max throttle seen. check(r) runs while both QEMUs are still up."""
    key = tb.new_key(name)
    vqmp = os.path.join(tb.workdir, f'{key}-vmigd.qmp')
    src, dst = tb.qemu_pair(MEM_MIB, guest=vh.GuestSpec(WS_MIB, rate, catchup_ms=CATCHUP_MS,
                                                            fill=True),
                            src_args=['-qmp', f'unix:{vqmp},server=on,wait=off'])
    try:
        src.start_guest()
        if postcopy:
            dst.execute('migrate-set-capabilities',
                        {'capabilities': [{'capability': 'postcopy-ram', 'state': True}]})
        args = ['--qmp', vqmp, '--mode', mode, *policy]
        m = tb.start_migration(src, dst, key, 0, bandwidth=f'{CAP_MIB}Mi', source_args=args,
                               max_bandwidth=1 << 40)
        started = m.started
        evidence = None
        throttle = 0
        seen = set()
        while True:
            info = src.migration_info()
            st = info.get('status')
            seen.add(st)
            ram = info.get('ram', {})
            throttle = max(throttle, info.get('cpu-throttle-percentage', 0))
            if (evidence is None and ram.get('dirty-sync-count', 0) >= 2 and
                    ram.get('dirty-pages-rate', 0) * ram.get('page-size', 4096)
                    >= 0.9 * CAP_MIB * MIB):
                evidence = time.monotonic() - started
            if st in ('completed', 'failed', 'cancelled'):
                break
            if time.monotonic() - started > timeout:
                raise vh.HarnessError(f'{key}: still {st} after {timeout}s')
            time.sleep(0.2)
        total = time.monotonic() - started
        if st != expect:
            raise vh.HarnessError(f'{key}: QEMU says {st} ({info.get("error-desc", "")}), '
                                  f'expected {expect}; convergence: {conv(tb, key)}')
        c = vh.wait_until(lambda: (lambda c: c if c.get('state') == 'finished' else None)(
            conv(tb, key)), 10, f'{key}: the convergence outcome')
        acts = c.get('actions', [])
        out = {'key': key, 'status': st, 'total_s': total, 'evidence_s': evidence,
               'downtime_ms': info.get('downtime'), 'conv': c, 'throttle': throttle,
               'seen': seen, 'first': (acts[0]['action'], acts[0]['at_s']) if acts else None,
               'src': src, 'dst': dst}
        if st == 'completed':
            vh.verify_memory(src, dst)
        if check:
            check(out)
        return out
    finally:
        for stop in (tb.source.source_stop, tb.target.target_stop):
            try:
                stop(key)
            except vh.HarnessError as e:
                vh.log(f'    {e}')
        tb.close_qemus(src, dst)


def line(r):
    first = f'{r["first"][0]} at {r["first"][1]:.1f}s' if r['first'] else 'no action'
    ev = f', evidence at {r["evidence_s"]:.1f}s' if r['evidence_s'] is not None else ''
    dt = f', downtime {r["downtime_ms"]} ms' if r['downtime_ms'] is not None else ''
    return f'{r["status"]} in {r["total_s"]:.1f}s; {first}{ev}{dt}; throttle max {r["throttle"]}%'


def expect_actions(r, names):
    got = [a['action'] for a in r['conv'].get('actions', [])]
    if got[:len(names)] != names or (not names and got):
        raise vh.HarnessError(f'{r["key"]}: actions {got}, expected {names}: {r["conv"]}')
    for a in r['conv'].get('actions', []):
        if not a.get('ok'):
            raise vh.HarnessError(f'{r["key"]}: action {a["action"]} failed: {a.get("error")}')


def low(tb, mode, policy=()):
    r = run(tb, f'low-{mode}', LOW, mode, policy)
    expect_actions(r, [])
    return line(r)


def auto_converge(tb):
    r = run(tb, 'autoconv', HIGH, policy=['--allow-auto-converge'])
    expect_actions(r, ['auto-converge'])
    if r['throttle'] <= 0:
        raise vh.HarnessError(f'{r["key"]}: QEMU never throttled the guest')
    bound = 2 * MEM_MIB / CAP_MIB
    if r['total_s'] > bound:
        raise vh.HarnessError(f'{r["key"]}: took {r["total_s"]:.1f}s, over 2 x memory / cap = '
                              f'{bound:.0f}s ({line(r)})')
    within(r)
    return line(r) + f' (bound {bound:.0f}s)'


def within(r):
    if r['evidence_s'] is None:
        raise vh.HarnessError(f'{r["key"]}: QEMU never showed the dirty rate at the link')
    lag = r['first'][1] - r['evidence_s']
    if lag > ACT_WITHIN:
        raise vh.HarnessError(f'{r["key"]}: first action {lag:.1f}s after the evidence, over '
                              f'{ACT_WITHIN:g}s')


def postcopy(tb, mode, policy):
    r = run(tb, f'postcopy-{mode}', HIGH, mode, policy, postcopy=True)
    expect_actions(r, ['post-copy'])
    if 'postcopy-active' not in r['seen']:
        raise vh.HarnessError(f'{r["key"]}: QEMU was never seen in postcopy-active')
    if 'through post-copy' not in r['conv'].get('outcome', ''):
        raise vh.HarnessError(f'{r["key"]}: outcome {r["conv"].get("outcome")}')
    if mode == 'predictive':
        within(r)
    else:
        deadline(r)
    return line(r)


def deadline(r):
    at = r['first'][1]
    if not KUBEVIRT_PER_GIB <= at <= KUBEVIRT_PER_GIB + 1.5:
        raise vh.HarnessError(f'{r["key"]}: kubevirt acted at {at:.1f}s, expected just after '
                              f'the {KUBEVIRT_PER_GIB}s deadline')


def abort(tb, mode, policy, reason):
    r = run(tb, f'abort-{mode}', HIGH, mode, policy, expect='cancelled',
            check=lambda r: guest_lives(tb, r, reason))
    if mode == 'predictive':
        within(r)
    else:
        deadline(r)
    return line(r) + f'; reason: {r["conv"]["actions"][0]["reason"]}'


def guest_lives(tb, r, reason):
    """After an abort: the reason in status and log, the source guest running and writing."""
    expect_actions(r, ['abort'])
    c, src = r['conv'], r['src']
    act = c['actions'][0]
    if reason not in act['reason']:
        raise vh.HarnessError(f'{r["key"]}: abort reason "{act["reason"]}" lacks "{reason}"')
    if 'the guest is running on the source' not in c.get('outcome', ''):
        raise vh.HarnessError(f'{r["key"]}: outcome "{c.get("outcome")}"')
    tb.source.wait_log(rf'migration {r["key"]} role=source: convergence .*abort: .*{reason}',
                       timeout=5)
    if src.run_state() != 'running':
        raise vh.HarnessError(f'{r["key"]}: source guest {src.run_state()}, not running')
    # The guest goes on: new status lines on its serial after the abort.
    n = len(src.serial_lines())
    src.wait_serial(r'vmig-guest: t=', timeout=5, since=n)


def main():
    vh.guest_binary()
    started = time.monotonic()
    checks = vh.Checks('convergence scenarios')
    kv = ['--completion-timeout-per-gib', str(KUBEVIRT_PER_GIB)]
    with vh.Testbed() as tb:
        checks.run('predictive, low dirty rate', low, tb, 'predictive')
        checks.run('predictive, 1.5x the cap, auto-converge', auto_converge, tb)
        checks.run('predictive, above the cap, post-copy', postcopy, tb, 'predictive',
                   ['--allow-post-copy'])
        checks.run('predictive, above the cap, nothing allowed', abort, tb, 'predictive', [],
                   'cannot converge: dirty')
        checks.run('kubevirt, low dirty rate', low, tb, 'kubevirt', kv)
        checks.run('kubevirt, above the cap, post-copy', postcopy, tb, 'kubevirt',
                   kv + ['--allow-post-copy'])
        checks.run('kubevirt, above the cap, nothing allowed', abort, tb, 'kubevirt', kv,
                   'not completed after')
        tb.stop_daemons()
    vh.log(f'{checks.count} scenarios in {time.monotonic() - started:.1f}s')
    checks.finish()


if __name__ == '__main__':
    vh.run_main(main)
