"""One migration of the test guest (tests/guest) through the testbed's two vmigd, the source
daemon following it on a QMP socket of its own (`source start --qmp PATH --mode M ...`): what
tests/integration/test_converge.py checks and what `bench/vmig-bench converge` measures.

The guest dirties a working set of ws_mib MiB at a set rate (catchup_ms small: it makes up little
lost time, so that a throttle slows it); the migration is capped at cap_mib MiB/s by the daemons
(`--bandwidth`), QEMU's own max-bandwidth is out of the way, no multifd (QEMU 7.2 cannot combine it
with post-copy). The caller's side polls QEMU's query-migrate every `poll` s on the harness's QMP
socket; times are seconds from the `migrate` command. Stdlib only."""

import dataclasses
import os
import time

from .base import MIB, HarnessError, wait_until
from .daemons import stop_quietly
from .migrate import verify_memory
from .qemu import GuestSpec


@dataclasses.dataclass
class Sizes:
    """Guest memory, working set and cap (MiB, MiB, MiB/s); catchup_ms as GuestSpec's."""
    mem_mib: int = 256
    ws_mib: int = 64
    cap_mib: int = 16
    catchup_ms: int = 2


@dataclasses.dataclass
class Scenario:
    """One of the convergence scenarios, relative to a Sizes: the guest writes pages at rate x the cap
    (repeat: writes per page, so distinct pages go at rate / repeat; burst: (on_ms, off_ms);
    catchup_ms: None is the Sizes' (a throttle slows the guest), 20 the guest's default (a
    service that keeps its pace under a throttle)); noise: the guest's noise= (% of each page
    written rewritten with pseudorandom bytes, so zstd takes the working set down about
    100 / noise times; None: only the page's counter, ~100x); mem_x: guest memory x the
    Sizes'. policy: `source start` flags; postcopy: the capability on the destination too.
    expect: QEMU's final status; acts: the actions predictive must take, in order (empty:
    none)."""
    name: str
    what: str
    rate_x: float
    policy: tuple = ()
    postcopy: bool = False
    catchup_ms: int = None
    repeat: int = None
    burst: tuple = None
    noise: int = None
    mem_x: int = 1
    expect: str = 'completed'
    acts: tuple = ()


SCENARIOS = {s.name: s for s in (
    Scenario('throttle', 'throttle-responsive guest at 3x the cap, auto-converge only', 3.0,
             ('--allow-auto-converge',), mem_x=2, acts=('auto-converge',)),
    Scenario('service', 'service-paced guest at 2x the cap, nothing allowed', 2.0,
             catchup_ms=20, expect='cancelled', acts=('abort',)),
    Scenario('service-postcopy', 'service-paced guest at 2x the cap, post-copy allowed', 2.0,
             ('--allow-post-copy',), postcopy=True, catchup_ms=20, acts=('post-copy',)),
    Scenario('overlap', 'page writes at 2x the cap, each page 4 times: remaining falls', 2.0,
             ('--allow-auto-converge', '--allow-post-copy'), postcopy=True, repeat=4),
    Scenario('bursty', '3 s at 3x the cap, 5 s quiet, auto-converge allowed', 3.0,
             ('--allow-auto-converge',), burst=(3000, 5000)),
    Scenario('low', 'a quarter of the cap, everything allowed', 0.25,
             ('--allow-auto-converge', '--allow-post-copy'), postcopy=True),
    # Bench-only: the throttle guest at 2x the cap with 25 % of each page written random (zstd
    # ~4x): plain it needs auto-converge, compressed (~0.5x the cap on the node hop) it need not.
    # acts: what it takes with the harness's --compress off.
    Scenario('compressible', 'throttle-responsive guest at 2x the cap, 25 % of each page '
             'written random (zstd ~4x), auto-converge allowed', 2.0,
             ('--allow-auto-converge',), noise=25, mem_x=2, acts=('auto-converge',)),
)}


def run_scenario(tb, scen, mode='predictive', sizes=None, policy=(), **kw):
    """run() for a Scenario at sizes (its guest, policy flags, post-copy capability and expected
    status; more flags in policy, e.g. a mode's knobs); run()'s dict."""
    s = sizes or Sizes()
    sz = dataclasses.replace(s, mem_mib=s.mem_mib * scen.mem_x)
    if scen.catchup_ms is not None:
        sz = dataclasses.replace(sz, catchup_ms=scen.catchup_ms)
    kw.setdefault('expect', scen.expect)
    return run(tb, f'{scen.name}-{mode}', max(1, round(scen.rate_x * s.cap_mib)), mode,
               [*scen.policy, *policy], postcopy=scen.postcopy, sizes=sz,
               guest_extra={'repeat': scen.repeat, 'burst': scen.burst, 'noise': scen.noise},
               **kw)


def run(tb, name, rate, mode='predictive', policy=(), postcopy=False, expect='completed',
        timeout=120, check=None, sizes=None, verify=True, poll=0.2, on_migrate=None,
        guest_extra=None, on_poll=None):
    """One migration of a guest dirtying `rate` MiB/s; follows QEMU's query-migrate every `poll` s.
    Returns a dict: status, first action (name, at_s), evidence_s (the first sample with QEMU's
    dirty-sync-count >= 2 and its dirty rate >= 0.9 x the cap), total_s, downtime_ms, the
    convergence object, max throttle seen and when QEMU first throttled (throttle_s), when
    post-copy was first seen (postcopy_s), the statuses seen (polled, and from QEMU's MIGRATION
    events), a timeline of the samples in which status, sync count or throttle changed (t,
    status, dirty-sync-count, dirty MiB/s, remaining MiB, throttle %), QEMU's last query-migrate
    (info). expect: the final status QEMU must reach
    (None: any). verify: compare both sides' memory after a completed migration.
    on_migrate(src, dst) runs just after `migrate`; check(r) while both QEMUs are still up.
    guest_extra: more GuestSpec fields (repeat, burst, noise); on_poll(key, info, t) after each poll. The dict also has syncs_s: when QEMU's
    dirty-sync-count first reached each value, {count: s}."""
    s = sizes or Sizes()
    key = tb.new_key(name)
    vqmp = os.path.join(tb.workdir, f'{key}-vmigd.qmp')
    spec = GuestSpec(s.ws_mib, rate, catchup_ms=s.catchup_ms, fill=True,
                     **{k: v for k, v in (guest_extra or {}).items() if v is not None})
    src, dst = tb.qemu_pair(s.mem_mib, guest=spec,
                            src_args=['-qmp', f'unix:{vqmp},server=on,wait=off'])
    try:
        src.start_guest()
        if postcopy:
            dst.execute('migrate-set-capabilities',
                        {'capabilities': [{'capability': 'postcopy-ram', 'state': True}]})
        args = ['--qmp', vqmp, '--mode', mode, *policy]
        m = tb.start_migration(src, dst, key, 0, bandwidth=f'{s.cap_mib}Mi', source_args=args,
                               max_bandwidth=1 << 40)
        started = m.started
        if on_migrate:
            on_migrate(src, dst)
        evidence = throttle_s = postcopy_s = None
        throttle = 0
        seen = set()
        timeline, last, syncs_s = [], None, {}
        while True:
            info = src.migration_info()
            now = time.monotonic() - started
            st = info.get('status')
            seen.add(st)
            ram = info.get('ram', {})
            page = ram.get('page-size', 4096)
            thr = info.get('cpu-throttle-percentage', 0)
            throttle = max(throttle, thr)
            if thr and throttle_s is None:
                throttle_s = now
            if st == 'postcopy-active' and postcopy_s is None:
                postcopy_s = now
            syncs = ram.get('dirty-sync-count', 0)
            syncs_s.setdefault(syncs, now)
            dirty = ram.get('dirty-pages-rate', 0) * page
            if evidence is None and syncs >= 2 and dirty >= 0.9 * s.cap_mib * MIB:
                evidence = now
            mark = (st, syncs, thr)
            if mark != last:
                last = mark
                timeline.append((round(now, 2), st, syncs, round(dirty / MIB, 1),
                                 round(ram.get('remaining', 0) / MIB, 1), thr))
            if st in ('completed', 'failed', 'cancelled'):
                break
            if on_poll:
                on_poll(key, info, now)
            if now > timeout:
                raise HarnessError(f'{key}: still {st} after {timeout}s')
            time.sleep(poll)
        total = time.monotonic() - started
        # A status QEMU passed through between two polls (post-copy with the cap lifted can
        # finish in less than `poll`) is in its MIGRATION events (vmigd turns them on).
        seen |= {e['data'].get('status') for e in src.qmp.events
                 if e.get('event') == 'MIGRATION' and isinstance(e.get('data'), dict)}
        if expect is not None and st != expect:
            raise HarnessError(f'{key}: QEMU says {st} ({info.get("error-desc", "")}), '
                               f'expected {expect}; convergence: {tb.source.convergence(key)}')
        c = wait_until(lambda: (lambda c: c if c.get('state') == 'finished' else None)(
            tb.source.convergence(key)), 10, f'{key}: the convergence outcome')
        acts = c.get('actions', [])
        out = {'key': key, 'status': st, 'total_s': total, 'evidence_s': evidence,
               'downtime_ms': info.get('downtime'), 'conv': c, 'throttle': throttle,
               'throttle_s': throttle_s, 'postcopy_s': postcopy_s, 'seen': seen,
               'timeline': timeline, 'info': info, 'syncs_s': syncs_s,
               'first': (acts[0]['action'], acts[0]['at_s']) if acts else None,
               'src': src, 'dst': dst}
        if st == 'completed' and verify:
            verify_memory(src, dst)
        if check:
            check(out)
        return out
    finally:
        stop_quietly(key, tb.source, tb.target)
        tb.close_qemus(src, dst)
