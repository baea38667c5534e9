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
  post-copy allowed, post-copy just after 10 s; with nothing allowed, abort just after 10 s;
- predictive, 24 MiB/s, nothing allowed, but the source daemon has a 40 MiB/s node cap: the
  first step raises the migration's cap into the node's headroom (vmigd's own and QEMU's), and
  the migration completes with no other action.
Each line reports the time to the first action, the total time and QEMU's downtime."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB = vt.MIB
MEM_MIB, WS_MIB, CAP_MIB = 256, 64, 16
LOW, HIGH = 4, 24                  # MiB/s the guest dirties
KUBEVIRT_PER_GIB = 10              # s: 256 MiB rounds up to 1 GB, so a 10 s deadline
NODE_CAP = '40Mi'                  # the headroom scenario's node cap
ACT_WITHIN = 5.0                   # s from the evidence to the first predictive action
CATCHUP_MS = 2                     # the guest makes up little lost time: a throttle slows it


SIZES = vt.converge.Sizes(MEM_MIB, WS_MIB, CAP_MIB, CATCHUP_MS)


def run(tb, *args, **kw):
    """vt.converge.run() at this test's sizes (tests/lib/vmigtest/converge.py, shared with
    bench/vmig-bench converge)."""
    return vt.converge.run(tb, *args, sizes=SIZES, **kw)


def line(r):
    first = f'{r["first"][0]} at {r["first"][1]:.1f}s' if r['first'] else 'no action'
    ev = f', evidence at {r["evidence_s"]:.1f}s' if r['evidence_s'] is not None else ''
    dt = f', downtime {r["downtime_ms"]} ms' if r['downtime_ms'] is not None else ''
    return f'{r["status"]} in {r["total_s"]:.1f}s; {first}{ev}{dt}; throttle max {r["throttle"]}%'


def expect_actions(r, names):
    got = [a['action'] for a in r['conv'].get('actions', [])]
    if got[:len(names)] != names or (not names and got):
        raise vt.HarnessError(f'{r["key"]}: actions {got}, expected {names}: {r["conv"]}')
    for a in r['conv'].get('actions', []):
        if not a.get('ok'):
            raise vt.HarnessError(f'{r["key"]}: action {a["action"]} failed: {a.get("error")}')


def low(tb, mode, policy=()):
    r = run(tb, f'low-{mode}', LOW, mode, policy)
    expect_actions(r, [])
    return line(r)


def auto_converge(tb):
    r = run(tb, 'autoconv', HIGH, policy=['--allow-auto-converge'])
    expect_actions(r, ['auto-converge'])
    if r['throttle'] <= 0:
        raise vt.HarnessError(f'{r["key"]}: QEMU never throttled the guest')
    bound = 2 * MEM_MIB / CAP_MIB
    if r['total_s'] > bound:
        raise vt.HarnessError(f'{r["key"]}: took {r["total_s"]:.1f}s, over 2 x memory / cap = '
                              f'{bound:.0f}s ({line(r)})')
    within(r)
    return line(r) + f' (bound {bound:.0f}s)'


def within(r):
    if r['evidence_s'] is None:
        raise vt.HarnessError(f'{r["key"]}: QEMU never showed the dirty rate at the link')
    lag = r['first'][1] - r['evidence_s']
    if lag > ACT_WITHIN:
        raise vt.HarnessError(f'{r["key"]}: first action {lag:.1f}s after the evidence, over '
                              f'{ACT_WITHIN:g}s')


def postcopy(tb, mode, policy):
    r = run(tb, f'postcopy-{mode}', HIGH, mode, policy, postcopy=True)
    expect_actions(r, ['post-copy'])
    if 'postcopy-active' not in r['seen']:
        raise vt.HarnessError(f'{r["key"]}: QEMU was never seen in postcopy-active')
    if 'through post-copy' not in r['conv'].get('outcome', ''):
        raise vt.HarnessError(f'{r["key"]}: outcome {r["conv"].get("outcome")}')
    if mode == 'predictive':
        within(r)
    else:
        deadline(r)
    return line(r)


def deadline(r):
    at = r['first'][1]
    if not KUBEVIRT_PER_GIB <= at <= KUBEVIRT_PER_GIB + 1.5:
        raise vt.HarnessError(f'{r["key"]}: kubevirt acted at {at:.1f}s, expected just after '
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
        raise vt.HarnessError(f'{r["key"]}: abort reason "{act["reason"]}" lacks "{reason}"')
    if 'the guest is running on the source' not in c.get('outcome', ''):
        raise vt.HarnessError(f'{r["key"]}: outcome "{c.get("outcome")}"')
    tb.source.wait_log(rf'migration {r["key"]} role=source: convergence .*abort: .*{reason}',
                       timeout=5)
    if src.run_state() != 'running':
        raise vt.HarnessError(f'{r["key"]}: source guest {src.run_state()}, not running')
    # The guest goes on: new status lines on its serial after the abort.
    n = len(src.serial_lines())
    src.wait_serial(r'vmig-guest: t=', timeout=5, since=n)


def headroom(tb):
    r = run(tb, 'headroom', HIGH)
    expect_actions(r, ['raise-cap'])
    act = r['conv']['actions'][0]
    if 'node headroom' not in act['reason']:
        raise vt.HarnessError(f'{r["key"]}: reason "{act["reason"]}"')
    tb.source.wait_log(rf'migration {r["key"]} role=source: convergence .*raise-cap: ', timeout=5)
    within(r)
    return line(r) + f'; {act["reason"].split(": ")[-1]}'


def main():
    vt.guest_binary()
    started = time.monotonic()
    checks = vt.Checks('convergence scenarios')
    kv = ['--completion-timeout-per-gib', str(KUBEVIRT_PER_GIB)]
    with vt.Testbed() as tb:
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
        tb.replace_daemon('source', args=['--node-bandwidth', NODE_CAP],
                          name='vmigd-source-nodecap')
        checks.run('predictive, above the cap, node headroom', headroom, tb)
        tb.stop_daemons()
    vt.log(f'{checks.count} scenarios in {time.monotonic() - started:.1f}s')
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
