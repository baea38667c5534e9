#!/usr/bin/env python3
"""Integration test of vmigd's bandwidth caps with real QEMU migrations through two daemons in two
network namespaces. The rate is measured from `vmigctl metrics --json`, sampled every 0.5 s with
the daemon's own timestamps: the target daemon's bytes_rx (what arrived), checked against the
source daemon's bytes_tx and QEMU's ram.transferred, over the steady part of each migration (from
one second after the bytes start flowing until one second before the flow ends or the switchover
is seen). QEMU's own max-bandwidth is set far above every cap, so the daemon's cap is what binds;
the destination QEMU's RAM is allocated at start and the source's RAM file read into the page
cache first, so that neither QEMU stalls mid-way (each rate line shows the host's idle CPU and
the source QEMU's major faults, to tell a starved run from a shaper that is wrong).

A cap is a maximum: every rate's upper side is judged, always. Its lower side is judged only
where the sender demonstrably had more to send all through the span: the source QEMU still had
RAM pending in every sample (query-migrate ram.remaining) and the source daemon was held back in
every sample interval, by its bucket (the migration's shaped_ms in `metrics --json` grew by at
least 0.3 s/s per connection and 0.85 x the span's median) or, with --shaper pacing, by the
kernel (its node-hop sockets held at least 64 KiB unsent, `ss`'s notsent). A loaded host that
cannot feed the cap shows as a sender that ran dry; the rate line then says why its lower side
was not judged.

- per-migration cap set at `source start --bandwidth`: 50 MiB/s on a 512 MiB 4-channel migration
  and 200 MiB/s on a 1 GiB 8-channel one, each within +-3 %;
- the cap changed under a running migration with `vmigctl bandwidth`: 50 -> 150 -> 50 MiB/s
  (+-3 % before the first change, +-5 % from 0.5 s after each change: the lowered segment is
  only 2.5 s, and one slow second of QEMU's, 46.7 MiB/s, once took it to -3.75 %), then lifted
  (`none`); a log line each;
- the node cap (`vmigd --node-bandwidth 100Mi` on the source): two concurrent 512 MiB migrations
  get 50 MiB/s each (+-10 %), 100 together (+-3 %); then, with the node cap set at run time
  (`vmigctl node-bandwidth`), a 512 MiB migration capped at 20 MiB/s of its own (+-3 %) and a
  1 GiB one that gets the remaining 80 (+-10 %, max-min fairness), together 100 (+-3 %);
- 50 MiB/s with mutual TLS (+-3 %) and with `--shaper pacing` (+-10 %; the deviation is reported).
Every migration must complete with identical guest memory."""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB = vt.MIB
CAP_TOL = 0.03             # a migration's own cap, steady part
CHANGED_TOL = 0.05         # a changed cap, from 0.5 s after the change
FAIR_TOL = 0.10            # each migration's share of the node cap
PACING_TOL = 0.10          # --shaper pacing: reported, checked loosely
SETTLE = 0.5               # seconds after a cap change before its windows start
EDGE = 1.0                 # seconds dropped at both ends of a migration's flow
MIN_STEADY = 1.5           # a steady part shorter than this measures nothing (cap200's 1 GiB
                           # at 200 MiB/s gives about 3 s; CI once sampled only 2.00 s of it)
RAISE_AT, LOWER_AT, LIFT_AT = 4.5, 8.0, 11.0   # seconds after `migrate`: the cap-change plan


def running(*ms):
    return lambda: all(m.status() not in ('setup', 'active') for m in ms)


def steady(watch, daemon, key, field='bytes_rx'):
    """(start, end) of the steady part of KEY's flow as daemon saw it."""
    t0, t1 = vt.flow_span(watch.get(daemon, key), field)
    return t0 + EDGE, t1 - EDGE


def rates_over(tb, watch, key, start, end):
    """{'target rx', 'source tx', 'qemu'}: rates over [start, end], and the target's 1-s
    windows."""
    if end - start < MIN_STEADY:
        raise vt.HarnessError(f'{key}: steady part of {end - start:.2f}s, under '
                              f'{MIN_STEADY:g}s: the migration ran too fast for its cap?')
    rates = {'target rx': vt.rate_between(watch.get(tb.target, key), start, end)[0],
             'source tx': vt.rate_between(watch.get(tb.source, key), start, end,
                                          'bytes_tx')[0]}
    if watch.qemu_series.get(key):
        rates['qemu'] = vt.rate_between(watch.qemu_series[key], start, end, 'bytes_tx')[0]
    windows = vt.window_rates(watch.get(tb.target, key), start, end)
    return rates, windows


def sender(tb, watch, keys, start, end):
    """(check the lower side?, why): whether every migration of keys demonstrably had more to
    send all through [start, end], so that a rate under its cap there is the shaper's doing:
    its source QEMU still had RAM pending in every sample (ram.remaining) and the source daemon
    was held back all the time, by its bucket (shaped_ms grew in every interval, see
    vt.held_back()) or, with --shaper pacing, by the kernel (its node-hop sockets held unsent
    bytes in every sample, see vt.backlogged()). A host too loaded to feed the cap shows as a
    sender that ran dry, and then only the upper side is judged."""
    held, dry = [], []
    for key in keys:
        pending = vt.qemu_pending(watch, key, start, end)
        if not pending:
            dry.append(f'{key}: QEMU had '
                       + ('no samples' if pending is None else 'no RAM left to send'))
            continue
        if key in watch.backlog:
            ok, detail = vt.backlogged(watch, key, start, end)
        else:
            ok, detail = vt.held_back(watch.get(tb.source, key), start, end)
        (held if ok else dry).append(f'{key}: {detail}, QEMU {pending / MIB:.0f} MiB pending')
    return (False, '; '.join(dry)) if dry else (True, '; '.join(held))


def judge(what, rates, windows, expected, tol, span, cond='', held=(True, '')):
    """Log the figures; HarnessError naming each rate above expected + tol (a cap is a maximum:
    always judged) or below expected - tol (only when held says the sender had more to send:
    see sender(); otherwise the reason is logged). cond: what the host was doing meanwhile (see
    conditions()), shown with them."""
    lower, why = held
    shown = ', '.join(f'{name} {r / MIB:.2f}' for name, r in rates.items())
    dev = (rates['target rx'] - expected) / expected * 100
    cpu = f', {cond}' if cond else ''
    vt.log(f'    {what}: {shown} MiB/s over {span:.1f}s (target {dev:+.2f}% of '
           f'{expected / MIB:g}{cpu}); 1-s windows: {vt.fmt_rates(windows)}')
    if why:
        vt.log(f'      lower side {"judged" if lower else "not judged"}: {why}')
    high = [f'{name} {r / MIB:.2f}' for name, r in rates.items() if r > expected * (1 + tol)]
    low = [f'{name} {r / MIB:.2f}' for name, r in rates.items() if r < expected * (1 - tol)]
    bad = high + (low if lower else [])
    if bad:
        sent = f'; the sender had more to send: {why}' if lower and low and why else ''
        raise vt.HarnessError(f'{what}: {", ".join(bad)} MiB/s, outside '
                              f'{expected / MIB:g} MiB/s +-{tol * 100:g}%{cpu}{sent}')
    note = '' if lower else (f'; lower side not judged ({", ".join(low)} under -'
                             f'{tol * 100:g}%)' if low else '; lower side not judged')
    return (f'{rates["target rx"] / MIB:.2f} MiB/s ({dev:+.2f}%), windows '
            f'{min(windows) / MIB:.1f}-{max(windows) / MIB:.1f}' if windows else 'ok') + note


def conditions(watch, keys, start, end):
    """'host CPU N% idle, QEMU major faults M': a shaper starved of CPU, or a QEMU waiting for
    its RAM file on the disk, cannot keep a rate; the figures say which happened."""
    idle = vt.cpu_idle_between(watch, start, end)
    faults = [vt.qemu_faults_between(watch, k, start, end) for k in keys]
    out = [f'host CPU {idle * 100:.0f}% idle'] if idle is not None else []
    if any(f is not None for f in faults):
        out.append(f'QEMU major faults {"+".join(str(f) for f in faults)}')
    return ', '.join(out)


def pair(tb, mib, variant=0):
    """A QEMU pair that does not stall on its own (see Testbed.qemu_pair(steady=True))."""
    return tb.qemu_pair(mib, ram_variant=variant, steady=True)


def check_qemu_unbound(src, cap):
    """QEMU's own limit must be far above the daemon's cap, or it, not the daemon, binds."""
    bw = src.execute('query-migrate-parameters')['max-bandwidth']
    if bw < 10 * cap:
        raise vt.HarnessError(f'QEMU max-bandwidth {bw} is not well above the cap {cap}')
    return f'QEMU max-bandwidth {bw / MIB:.0f} MiB/s'


def check_cap_fields(watch, daemon, key, start, end, cap, limit=None, until=None):
    """The daemon's metrics report the cap (and the limit) all through [start, end]. until: the
    action that ends the span; only samples taken before it began count (a sample's time is the
    daemon's wall clock, the action's ours, and the order of the calls is what is certain)."""
    inside = [s for s in watch.get(daemon, key) if start <= s.t <= end
              and (until is None or s.seq <= watch.events_after[until])]
    caps = {s.cap for s in inside}
    limits = {s.limit for s in inside}
    if caps != {cap}:
        odd = ', '.join(f'{s.cap} at {s.t:.3f} (sample {s.seq})' for s in inside if s.cap != cap)
        raise vt.HarnessError(f'{daemon.name} reported cap {sorted(caps)}, expected {cap}: {odd} '
                              f'in [{start:.3f}, {end:.3f}]')
    if limit is not None and limits != {limit}:
        raise vt.HarnessError(f'{daemon.name} reported limit {sorted(limits)}, expected {limit}')
    return f'cap {cap}, limit {sorted(limits)} in {len(inside)} samples'


def check_shaper(daemon, shaper):
    st = daemon.status_field('shaper')
    line = daemon.log_matches(r'bandwidth: node cap \S+.*, shaper (\w+)')
    if st != shaper or not line or line[0].group(1) != shaper:
        raise vt.HarnessError(f'status shaper {st!r}, start line '
                              f'{line[0].group(0) if line else None}; expected {shaper}')
    return f'status shaper {st}; {line[0].group(0)}'


def sampled(checks, label, watch, *args, **kw):
    """watch.run(*args, **kw) as a check (a failure there is reported with the others, and the
    migrations are still finished); whether it succeeded."""
    ok = []

    def run():
        watch.run(*args, **kw)
        ok.append(True)
        return (f'{sum(len(v) for v in watch.series.values())} daemon samples'
                + (f', events {sorted(watch.events)}' if watch.events else ''))
    checks.run(f'{label}: metrics sampled while it ran', run)
    return bool(ok)


def finish_and_verify(m):
    result, digest = m.finish_verified(timeout=120)
    return f'{result.summary()}, memory sha256 {digest[:12]}'


def capped(tb, checks, label, mib, channels, cap_text, cap, tol=CAP_TOL, variant=0,
           pacing=False):
    """One migration capped at `source start --bandwidth cap_text`; its steady rate must be cap
    +-tol. pacing: the source daemon runs --shaper pacing (the kernel holds the sender back:
    its node-hop sockets' backlog is sampled too)."""
    vt.log(f'[{label}] {mib} MiB, {channels} channels, source start --bandwidth {cap_text}')
    src, dst = pair(tb, mib, variant)
    key = tb.new_key(label)
    m = tb.start_migration(src, dst, key, channels, bandwidth=cap_text)
    backlog = {key: (tb.net.source_ns, m.target['address'], m.target['port'])} if pacing else {}
    watch = vt.RateWatch([tb.source, tb.target], {key: src}, backlog=backlog)
    try:
        ok = sampled(checks, label, watch, running(m), timeout=mib / (cap / MIB) * 2 + 30)
    finally:
        checks.run(f'{label}: completed, memory', finish_and_verify, m)
    checks.run(f'{label}: QEMU limit', check_qemu_unbound, src, cap)
    if not ok:
        tb.close_qemus(src, dst)
        return

    def rate():
        start, end = steady(watch, tb.target, key)
        rates, windows = rates_over(tb, watch, key, start, end)
        return judge(f'{label} steady', rates, windows, cap, tol, end - start,
                     conditions(watch, [key], start, end), sender(tb, watch, [key], start, end))
    checks.run(f'{label}: rate {cap / MIB:g} MiB/s +-{tol * 100:g}%', rate)

    def fields():
        start, end = steady(watch, tb.target, key)
        return check_cap_fields(watch, tb.source, key, start, end, cap, cap)
    checks.run(f'{label}: metrics cap/limit', fields)
    tb.close_qemus(src, dst)


def cap_change(tb, checks):
    """50 MiB/s, raised to 150, lowered to 50, lifted (see RAISE_AT ...). 1 GiB leaves some 130
    MiB for after the lift, whatever the rates: they cannot exceed the caps."""
    label, mib, channels = 'change', 1024, 4
    vt.log(f'[{label}] {mib} MiB, {channels} channels: 50Mi, 150Mi at {RAISE_AT:g}s, 50Mi at '
           f'{LOWER_AT:g}s, none at {LIFT_AT:g}s')
    src, dst = pair(tb, mib)
    key = tb.new_key(label)
    offset = tb.source.log_offset()
    m = tb.start_migration(src, dst, key, channels, bandwidth='50Mi')
    watch = vt.RateWatch([tb.source, tb.target], {key: src})
    schedule = [(RAISE_AT, 'raise', lambda: tb.source.set_bandwidth(key, '150Mi')),
                (LOWER_AT, 'lower', lambda: tb.source.set_bandwidth(key, '50Mi')),
                (LIFT_AT, 'lift', lambda: tb.source.set_bandwidth(key, 'none'))]
    try:
        ok = sampled(checks, label, watch, running(m), timeout=60, schedule=schedule)
    finally:
        checks.run(f'{label}: completed, memory', finish_and_verify, m)
    if not ok:
        tb.close_qemus(src, dst)
        return
    ev = watch.events
    flow_start = vt.flow_span(watch.get(tb.target, key))[0]
    segments = [('50 before the raise', flow_start + EDGE, 'raise', 50 * MIB, CAP_TOL),
                ('150 after the raise', ev['raise'] + SETTLE, 'lower', 150 * MIB, CHANGED_TOL),
                ('50 after the lowering', ev['lower'] + SETTLE, 'lift', 50 * MIB, CHANGED_TOL)]
    for what, start, until, cap, tol in segments:
        end = ev[until]

        def rate(what=what, start=start, end=end, cap=cap, tol=tol):
            rates, windows = rates_over(tb, watch, key, start, end)
            return judge(f'{label} {what}', rates, windows, cap, tol, end - start,
                         conditions(watch, [key], start, end),
                         sender(tb, watch, [key], start, end))
        checks.run(f'{label}: {what} +-{tol * 100:g}%', rate)
        checks.run(f'{label}: metrics cap {what}', check_cap_fields, watch, tb.source, key,
                   start, end, cap, cap, until)

    def log_lines():
        found = [m.group(1) for m in tb.source.log_matches(
            rf'migration {key} role=source: cap (unlimited|\S+ \S+)', since=offset)]
        want = ['150.0 MiB/s', '50.0 MiB/s', 'unlimited']
        if found != want:
            raise vt.HarnessError(f'cap log lines say {found}, expected {want} and the lift')
        return f'cap log lines: {found}'
    checks.run(f'{label}: log lines', log_lines)

    def lifted():
        last = [s for s in watch.get(tb.source, key) if s.t > ev['lift']]
        if not last or last[0].cap != 0:
            raise vt.HarnessError(f'after `bandwidth {key} none` metrics say cap '
                                  f'{last[0].cap if last else "(no sample)"}')
        return 'cap 0 after `none`'
    checks.run(f'{label}: cap lifted', lifted)
    tb.close_qemus(src, dst)


def node_cap(tb, checks):
    """Two concurrent 512 MiB migrations under the source's --node-bandwidth 100Mi."""
    label = 'node'
    node = 100 * MIB
    vt.log(f'[{label}] two 512 MiB 4-channel migrations at once, source --node-bandwidth 100Mi')

    def node_fields():
        bandwidth = tb.source.status_field('bandwidth')
        line = tb.source.log_matches(r'bandwidth: node cap (\S+ \S+), shaper (\w+)')
        if bandwidth != node or not line or line[0].group(1) != '100.0 MiB/s':
            raise vt.HarnessError(f'status bandwidth {bandwidth}, start line '
                                  f'{line[0].group(0) if line else None}; expected {node}')
        return f'status bandwidth {node}, {line[0].group(0)}'
    checks.run(f'{label}: node cap at start', node_fields)
    pairs = [pair(tb, 512, v) for v in (1, 2)]
    keys = [tb.new_key(f'{label}{i}') for i in (1, 2)]
    ms = [tb.start_migration(src, dst, key, 4) for (src, dst), key in zip(pairs, keys)]
    watch = vt.RateWatch([tb.source, tb.target], {k: p[0] for k, p in zip(keys, pairs)})
    try:
        ok = sampled(checks, label, watch, running(*ms), timeout=60)
        for m in ms:                   # all seen completed before any memory is compared
            m.wait(timeout=60)
    finally:
        for m, (src, dst) in zip(ms, pairs):
            checks.run(f'{label}: {m.key} completed, memory', finish_and_verify, m)
    if not ok:
        for src, dst in pairs:
            tb.close_qemus(src, dst)
        return

    def shares():
        spans = [steady(watch, tb.target, k) for k in keys]
        start, end = max(s for s, _ in spans), min(e for _, e in spans)
        each = [rates_over(tb, watch, k, start, end) for k in keys]
        cond = conditions(watch, keys, start, end)
        problems = []
        for k, (rates, windows) in zip(keys, each):
            try:
                judge(f'{k} share', rates, windows, node / 2, FAIR_TOL, end - start, cond,
                      sender(tb, watch, [k], start, end))
            except vt.HarnessError as e:
                problems.append(str(e))
        total = {name: sum(r[name] for r, _ in each) for name in each[0][0]}
        try:
            judge('sum', total, [], node, CAP_TOL, end - start, cond,
                  sender(tb, watch, keys, start, end))
        except vt.HarnessError as e:
            problems.append(str(e))
        limits = [s.limit for k in keys for s in watch.get(tb.source, k) if start <= s.t <= end]
        median = statistics.median(limits)
        if not vt.within(median, node / 2, FAIR_TOL):
            problems.append(f'median limit in metrics {median / MIB:.1f} MiB/s, not ~50')
        if problems:
            raise vt.HarnessError('; '.join(problems))
        parts = ' + '.join(f'{r["target rx"] / MIB:.2f}' for r, _ in each)
        return (f'{parts} = {total["target rx"] / MIB:.2f} MiB/s, median limit '
                f'{median / MIB:.1f}')
    checks.run(f'{label}: fair split 50/50 +-{FAIR_TOL * 100:g}%, sum +-{CAP_TOL * 100:g}%',
               shares)
    for src, dst in pairs:
        tb.close_qemus(src, dst)


def node_cap_own_cap(tb, checks):
    """The node cap set at run time; one migration capped at 20 MiB/s of its own: the other gets
    the remaining 80 (max-min fairness). The small one's cap is lifted once the big one is done."""
    label = 'maxmin'
    node = 100 * MIB
    vt.log(f'[{label}] node cap 100Mi set by vmigctl node-bandwidth; 512 MiB capped at 20Mi and '
           '1 GiB uncapped at once')

    def runtime_node_cap():
        offset = tb.source.log_offset()
        tb.source.set_node_bandwidth('none')
        off = tb.source.status_field('bandwidth')
        tb.source.set_node_bandwidth('100Mi')
        on = tb.source.status_field('bandwidth')
        line = tb.source.wait_log(r'node cap 100\.0 MiB/s', since=offset)
        if off != 0 or on != node:
            raise vt.HarnessError(f'status bandwidth {off} after none, {on} after 100Mi')
        return f'status bandwidth 0 then {on}; log: {line.group(0)}'
    checks.run(f'{label}: vmigctl node-bandwidth', runtime_node_cap)
    small_src, small_dst = pair(tb, 512, 4)
    big_src, big_dst = pair(tb, 1024)
    small_key, big_key = tb.new_key('maxmin-20'), tb.new_key('maxmin-big')
    small = tb.start_migration(small_src, small_dst, small_key, 4, bandwidth='20Mi')
    big = tb.start_migration(big_src, big_dst, big_key, 4)
    watch = vt.RateWatch([tb.source, tb.target], {small_key: small_src, big_key: big_src})
    try:
        ok = sampled(checks, label, watch, running(big), timeout=60)
        big.wait(timeout=60)
        tb.source.set_bandwidth(small_key, 'none')
        small.wait(timeout=60)
    finally:
        checks.run(f'{label}: {big_key} completed, memory', finish_and_verify, big)
        checks.run(f'{label}: {small_key} completed, memory', finish_and_verify, small)
    if not ok:
        tb.close_qemus(small_src, small_dst)
        tb.close_qemus(big_src, big_dst)
        return

    def shares():
        big_span = steady(watch, tb.target, big_key)
        small_start = vt.flow_span(watch.get(tb.target, small_key))[0] + EDGE
        start, end = max(big_span[0], small_start), big_span[1]
        rates_small, w_small = rates_over(tb, watch, small_key, start, end)
        rates_big, w_big = rates_over(tb, watch, big_key, start, end)
        cond = conditions(watch, [small_key, big_key], start, end)
        problems = []
        for what, rates, windows, expected, tol, keys in (
                ('capped 20', rates_small, w_small, 20 * MIB, CAP_TOL, [small_key]),
                ('the rest, 80', rates_big, w_big, 80 * MIB, FAIR_TOL, [big_key]),
                ('sum', {k: rates_small[k] + rates_big[k] for k in rates_big}, [], node,
                 CAP_TOL, [small_key, big_key])):
            try:
                judge(f'{label} {what}', rates, windows, expected, tol, end - start, cond,
                      sender(tb, watch, keys, start, end))
            except vt.HarnessError as e:
                problems.append(str(e))
        if problems:
            raise vt.HarnessError('; '.join(problems))
        return (f'{rates_small["target rx"] / MIB:.2f} + {rates_big["target rx"] / MIB:.2f} '
                'MiB/s')
    checks.run(f'{label}: 20 (own cap +-{CAP_TOL * 100:g}%) + 80 (+-{FAIR_TOL * 100:g}%)',
               shares)
    tb.close_qemus(small_src, small_dst)
    tb.close_qemus(big_src, big_dst)


def main():
    started = time.monotonic()
    checks = vt.Checks('cap checks')
    with vt.Testbed() as tb:
        vt.log(f'{tb.describe()}, plain text')
        capped(tb, checks, 'cap50', 512, 4, '50Mi', 50 * MIB)
        capped(tb, checks, 'cap200', 1024, 8, '200Mi', 200 * MIB)
        cap_change(tb, checks)
        tb.replace_daemon('source', args=['--node-bandwidth', '100Mi'], name='vmigd-source-node')
        node_cap(tb, checks)
        node_cap_own_cap(tb, checks)
        tb.replace_daemon('source', args=['--shaper', 'pacing'], name='vmigd-source-pacing')
        checks.run('pacing: status and start line', check_shaper, tb.source, 'pacing')
        capped(tb, checks, 'pacing50', 512, 4, '50Mi', 50 * MIB, tol=PACING_TOL, pacing=True)
        tb.stop_daemons()
    with vt.Testbed(tls=True) as tb:
        vt.log('mutual TLS on the node hop')
        capped(tb, checks, 'tls50', 512, 4, '50Mi', 50 * MIB)
        tb.stop_daemons()
    vt.log(f'{checks.count} checks in {time.monotonic() - started:.1f}s')
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
