#!/usr/bin/env python3
"""Integration test of the convergence module: real QEMU running the test guest (tests/guest),
migrated through two vmigd daemons with a cap; the source daemon follows the migration on a QMP
socket of its own (`source start --qmp`) while the test drives QEMU on another.

The six convergence scenarios (tests/lib/vmigtest/converge.py, SCENARIOS, less BENCH_ONLY; the
same in `bench/vmig-bench converge`), at 256 MiB of guest memory (the throttle guest 512 MiB), a
64 MiB working set, a 16 MiB/s cap (4 s per pass over the working set), no multifd (QEMU 7.2
cannot combine it with post-copy), downtime limit 300 ms.
- predictive, each of the six: QEMU's final status and the actions it must take, and no other:
  throttle (3x the cap, responsive, auto-converge only) completes within 2 x memory / cap;
  service (2x the cap, keeps its pace, nothing allowed) is aborted with "no action left" in the
  reason, the guest still running on the source, the source's stop line outcome=aborted-by-vmigd
  (shadow mode's: ok); service-postcopy switches to post-copy and
  completes; overlap (page writes at 2x the cap, remaining falling), bursty and low complete
  with no action. A first action comes before the stall mode could act at all (40 s).
- stall mode (VEP 248) with stallProgressTimeout 10 s: service is aborted (abort_low_bandwidth),
  service-postcopy switches to post-copy; neither before 10 s.
- shadow: service with `--shadow`: the abort is decided and logged, not carried out; the test
  then lifts the cap and the migration completes, its outcome naming the decision.
- kubevirt mode, completionTimeoutPerGiB 10 (1 GB: a 10 s deadline): nothing for low; post-copy
  and abort just after 10 s.
- predictive, service, with a 40 MiB/s node cap on the source daemon: the first step raises the
  migration's cap into the node's headroom, and the migration completes with nothing else.
Each line reports the time to the first action, the total time and QEMU's downtime."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MEM_MIB, WS_MIB, CAP_MIB = 256, 64, 16
KUBEVIRT_PER_GIB = 10              # s: 256 MiB rounds up to 1 GB, so a 10 s deadline
STALL_WINDOW_S = 10                # stallProgressTimeout here (VEP 248's default: 40)
STALL_DEFAULT_S = 40
NODE_CAP = '40Mi'                  # the headroom scenario's node cap
CATCHUP_MS = 2                     # the guest makes up little lost time: a throttle slows it

SIZES = vt.converge.Sizes(MEM_MIB, WS_MIB, CAP_MIB, CATCHUP_MS)
SCENARIOS = vt.converge.SCENARIOS
# Bench-only (bench/vmig-bench converge --compress): compressible is the throttle guest with
# compressible pages, which with the harness's --compress off shows nothing throttle does not.
BENCH_ONLY = ('compressible',)


def run(tb, scen, mode='predictive', policy=(), **kw):
    """vt.converge.run_scenario() at this test's sizes."""
    return vt.converge.run_scenario(tb, SCENARIOS[scen], mode, sizes=SIZES, policy=policy, **kw)


def line(r):
    first = f'{r["first"][0]} at {r["first"][1]:.1f}s' if r['first'] else 'no action'
    dt = f', downtime {r["downtime_ms"]} ms' if r['downtime_ms'] is not None else ''
    return (f'{r["status"]} in {r["total_s"]:.1f}s; {first}{dt}; throttle max {r["throttle"]}%; '
            f'passes {max(r["syncs_s"])}')


def expect_actions(r, names):
    got = [a['action'] for a in r['conv'].get('actions', [])]
    if got != list(names):
        raise vt.HarnessError(f'{r["key"]}: actions {got}, expected {list(names)}: '
                              f'{r["conv"]}')
    for a in r['conv'].get('actions', []):
        if not a.get('ok'):
            raise vt.HarnessError(f'{r["key"]}: action {a["action"]} failed: {a.get("error")}')


def reason(r):
    acts = r['conv'].get('actions', [])
    return f'; reason: {acts[0]["reason"]}' if acts else ''


def predictive(tb, name):
    scen = SCENARIOS[name]
    check = (lambda r: guest_lives(tb, r, 'no action left')) if scen.expect == 'cancelled' \
        else None
    r = run(tb, name, check=check, timeout=150)
    expect_actions(r, scen.acts)
    if scen.expect == 'cancelled':
        stop_outcome(tb, r, 'aborted-by-vmigd')
    if r['first'] and r['first'][1] >= STALL_DEFAULT_S:
        raise vt.HarnessError(f'{r["key"]}: first action at {r["first"][1]:.1f}s, not before '
                              f'the stall mode could act ({STALL_DEFAULT_S}s)')
    if name == 'throttle':
        bound = 2 * MEM_MIB * scen.mem_x / CAP_MIB
        if r['total_s'] > bound:
            raise vt.HarnessError(f'{r["key"]}: took {r["total_s"]:.1f}s, over 2 x memory / cap '
                                  f'= {bound:.0f}s ({line(r)})')
        if r['throttle'] <= 0:
            raise vt.HarnessError(f'{r["key"]}: QEMU never throttled the guest')
        return line(r) + f' (bound {bound:.0f}s)'
    if name == 'service-postcopy':
        postcopy_done(r)
    return line(r) + reason(r)


def postcopy_done(r):
    if 'postcopy-active' not in r['seen']:
        raise vt.HarnessError(f'{r["key"]}: QEMU was never seen in postcopy-active')
    if 'through post-copy' not in r['conv'].get('outcome', ''):
        raise vt.HarnessError(f'{r["key"]}: outcome {r["conv"].get("outcome")}')


def guest_lives(tb, r, phrase):
    """After an abort: the phrase in the reason, in status and log; the source guest running and
    writing."""
    expect_actions(r, ['abort'])
    c, src = r['conv'], r['src']
    act = c['actions'][0]
    if phrase not in act['reason']:
        raise vt.HarnessError(f'{r["key"]}: abort reason "{act["reason"]}" lacks "{phrase}"')
    if 'the guest is running on the source' not in c.get('outcome', ''):
        raise vt.HarnessError(f'{r["key"]}: outcome "{c.get("outcome")}"')
    tb.source.wait_log(rf'migration {r["key"]} role=source: convergence .*abort: .*{phrase}',
                       timeout=5)
    if src.run_state() != 'running':
        raise vt.HarnessError(f'{r["key"]}: source guest {src.run_state()}, not running')
    # The guest goes on: new status lines on its serial after the abort.
    n = len(src.serial_lines())
    src.wait_serial(r'vmig-guest: t=', timeout=5, since=n)


def stop_outcome(tb, r, want):
    """The source's stop line (the outcome vmigd_migrations_total counts): want."""
    rec = tb.source.stop_record(r['key'], 'source')
    if rec.get('outcome') != want:
        raise vt.HarnessError(f'{r["key"]}: source stop line outcome={rec.get("outcome")}, '
                              f'expected {want}')


def stall(tb, name):
    policy = ['--policy', f'{{"stallDetector": {{"stallProgressTimeout": {STALL_WINDOW_S}}}}}']
    scen = SCENARIOS[name]
    check = (lambda r: guest_lives(tb, r, 'abort_low_bandwidth')) \
        if scen.expect == 'cancelled' else None
    r = run(tb, name, 'stall', policy, check=check, timeout=150)
    expect_actions(r, scen.acts)
    if r['first'][1] < STALL_WINDOW_S:
        raise vt.HarnessError(f'{r["key"]}: stall acted at {r["first"][1]:.1f}s, inside its '
                              f'{STALL_WINDOW_S}s window')
    if name == 'service-postcopy':
        postcopy_done(r)
        if 'switchover to post-copy' not in r['conv']['actions'][0]['reason']:
            raise vt.HarnessError(f'{r["key"]}: reason {r["conv"]["actions"][0]["reason"]}')
    return line(r) + reason(r)


def shadow(tb):
    lifted = {}

    def lift(key, info, now):
        # Once the shadow abort is decided, lift the cap: the migration that vmigd would have
        # aborted completes.
        if lifted:
            return
        acts = tb.source.convergence(key).get('actions', [])
        if acts:
            lifted['at'] = now
            tb.source.set_bandwidth(key, 'none')

    r = run(tb, 'service', policy=['--shadow'], expect='completed', on_poll=lift, timeout=150)
    expect_actions(r, ['abort'])
    if 'cancelling' in r['seen'] or 'cancelled' in r['seen']:
        raise vt.HarnessError(f'{r["key"]}: shadow mode cancelled the migration: {r["seen"]}')
    out = r['conv'].get('outcome', '')
    stop_outcome(tb, r, 'ok')
    if 'shadow: 1 decisions not acted on, the first abort' not in out:
        raise vt.HarnessError(f'{r["key"]}: outcome "{out}"')
    tb.source.wait_log(rf'migration {r["key"]} role=source: convergence \(predictive, shadow: '
                       r'not acted on\) at .*: abort: ', timeout=5)
    return line(r) + f'; cap lifted at {lifted["at"]:.1f}s; outcome: {out}'


def kubevirt(tb, name):
    kv = ['--completion-timeout-per-gib', str(KUBEVIRT_PER_GIB)]
    scen = SCENARIOS[name]
    check = (lambda r: guest_lives(tb, r, 'not completed after')) \
        if scen.expect == 'cancelled' else None
    r = run(tb, name, 'kubevirt', kv, check=check)
    expect_actions(r, scen.acts)
    if r['first']:
        at = r['first'][1]
        if not KUBEVIRT_PER_GIB <= at <= KUBEVIRT_PER_GIB + 1.5:
            raise vt.HarnessError(f'{r["key"]}: kubevirt acted at {at:.1f}s, expected just '
                                  f'after the {KUBEVIRT_PER_GIB}s deadline')
    if name == 'service-postcopy':
        postcopy_done(r)
    return line(r)


def headroom(tb):
    r = run(tb, 'service', expect='completed')
    expect_actions(r, ['raise-cap'])
    act = r['conv']['actions'][0]
    if 'node headroom' not in act['reason']:
        raise vt.HarnessError(f'{r["key"]}: reason "{act["reason"]}"')
    tb.source.wait_log(rf'migration {r["key"]} role=source: convergence .*raise-cap: ', timeout=5)
    return line(r) + f'; {act["reason"].split(": ")[-1]}'


def main():
    vt.guest_binary()
    started = time.monotonic()
    checks = vt.Checks('convergence scenarios')
    with vt.Testbed() as tb:
        for name, scen in SCENARIOS.items():
            if name in BENCH_ONLY:
                continue
            checks.run(f'predictive, {name}: {scen.what}', predictive, tb, name)
        for name in ('service', 'service-postcopy'):
            checks.run(f'stall ({STALL_WINDOW_S}s window), {name}', stall, tb, name)
        checks.run('predictive shadow, service: decided, not acted on', shadow, tb)
        for name in ('low', 'service-postcopy', 'service'):
            checks.run(f'kubevirt ({KUBEVIRT_PER_GIB}s deadline), {name}', kubevirt, tb, name)
        tb.replace_daemon('source', args=['--node-bandwidth', NODE_CAP],
                          name='vmigd-source-nodecap')
        checks.run('predictive, service, node headroom', headroom, tb)
        tb.stop_daemons()
    vt.log(f'{checks.count} scenarios in {time.monotonic() - started:.1f}s')
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
