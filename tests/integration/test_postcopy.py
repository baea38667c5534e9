#!/usr/bin/env python3
"""Integration test of what newer QEMU adds on the wire, carried through two vmigd daemons: the
test guest dirtying memory (tests/guest), migrated with a cap so that it cannot finish in
pre-copy, then switched to post-copy by the test (migrate-start-postcopy) on the QEMUs that
$VMIG_QEMU_SRC/$VMIG_QEMU_DST name (meson test --setup qemu10 or cross runs it on 10.0):
- post-copy: completes, the destination loaded, both RAMs equal, one node-hop connection; the
  source daemon held pre-copy to its cap and lifted it at post-copy (a switchover: the source VM
  stopped, QEMU's own limit is max-postcopy-bandwidth from then on, unlimited by default);
- post-copy with postcopy-preempt: QEMU opens a second connection to the same port (the preempt
  channel, pages the destination faulted on); the target must connect it second, after the main
  channel (the destination tells them apart by order without multifd). 7.2 opens it with the
  main channel, 10.0 only when post-copy starts, in the middle of a running migration (the log
  says how many were linked then). Checked: two links, sequence 0 then 1, completed, RAMs equal;
- post-copy with multifd: 10.0 refuses the pair (QEMU's error is logged; 10.1 allows it), 7.2
  takes it and breaks later (doc/design.md), so neither is migrated;
- switchover-ack (8.1+): the destination answers on the return path (the main channel, the other
  way) before the source may switch over; with no device that holds it back (only VFIO does),
  the ack comes at once. Checked: completed with the capability on both sides, RAMs equal.
What a version lacks is logged as "not run" with the reason, never silently passed."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB = vt.MIB
MEM_MIB, WS_MIB, RATE, CAP = 256, 64, 24, '16Mi'   # 256 MiB at 16 MiB/s: 16 s of pre-copy
CAP_BYTES = 16 * MIB
SLOW_RATE = 2                                      # MiB/s: converges in pre-copy at CAP
POSTCOPY_AFTER = 2.0                               # s of pre-copy before migrate-start-postcopy


def caps(q, names, state=True):
    q.execute('migrate-set-capabilities',
              {'capabilities': [{'capability': n, 'state': state} for n in names]})


def guest_pair(tb, rate=RATE):
    src, dst = tb.qemu_pair(MEM_MIB, guest=vt.GuestSpec(WS_MIB, rate, catchup_ms=2, fill=True))
    src.start_guest()
    return src, dst


def migrate(tb, label, capabilities, postcopy, channels=0, rate=RATE):
    """A capped migration of the dirtying guest with `capabilities` on both sides; post-copy
    started after POSTCOPY_AFTER s if `postcopy`: the source daemon kept to its cap until then
    and lifted it after. Statuses seen, the links on the target, the result's summary and the
    memory digest."""
    src, dst = guest_pair(tb, rate)
    key = tb.new_key(label)
    try:
        for q in (src, dst):
            caps(q, capabilities)
        m = tb.start_migration(src, dst, key, channels, bandwidth=CAP, max_bandwidth=1 << 40)
        seen = []
        if postcopy:
            time.sleep(POSTCOPY_AFTER)
            st = src.migration_info().get('status')
            if st != 'active':
                raise vt.HarnessError(f'{key}: {st} after {POSTCOPY_AFTER}s, expected active')
            before = tb.source.migration_metrics(key)
            held = time.monotonic() - m.started
            # When QEMU opened its connections: the preempt channel in pre-copy already, or
            # only when post-copy starts.
            precopy_conns = len(tb.target.connections(key) or [])
            src.execute('migrate-start-postcopy')
            posted = time.monotonic() - m.started
            # A cap is a maximum: up to post-copy the source daemon held the stream to it
            # (its bucket starts empty; 1 MiB for the tick and the burst).
            limit = CAP_BYTES * held + MIB
            if before['bytes_tx'] > limit:
                raise vt.HarnessError(f'{key}: {before["bytes_tx"]} bytes sent in {held:.2f}s '
                                      f'of pre-copy, over the cap ({limit:.0f})')

            def in_postcopy():
                s = src.migration_info().get('status')
                if s not in seen:
                    seen.append(s)
                return s if s in ('postcopy-active', 'completed', 'failed') else None
            vt.wait_until(in_postcopy, 30, f'{key}: post-copy', 0.05)
        if postcopy:
            # Post-copy is a switchover: the source VM stopped, QEMU's limit is now
            # max-postcopy-bandwidth (unlimited), and so the daemon's own cap is lifted.
            lifted = vt.wait_until(lambda: tb.source.migration_metrics(key)['cap_lifted'], 10,
                                   f'{key}: the cap lifted at post-copy')
            seen.append(f'cap lifted {lifted}')
        result = m.finish(timeout=120)
        digest = vt.verify_memory(src, dst)
        links = [r['seq'] for r in tb.target.linked(key, 'target')]
        text = f'{result.summary()}; memory sha256 {digest[:12]}; target links (seq) {links}'
        if postcopy:
            text += (f'; post-copy started at {posted:.1f}s with {precopy_conns} connection(s) '
                     f'linked, statuses {seen}')
        return text, links, seen
    except BaseException:
        vt.stop_quietly(key, tb.source, tb.target)
        raise
    finally:
        tb.close_qemus(src, dst)


def case_postcopy(tb, check):
    text, links, seen = migrate(tb, 'pc', ['postcopy-ram'], True)
    check('postcopy-active' in seen or 'completed' in seen, f'statuses {seen}')
    check(links == [0], f'one connection expected, linked {links}')
    return text


def case_preempt(tb, check):
    text, links, seen = migrate(tb, 'preempt', ['postcopy-ram', 'postcopy-preempt'], True)
    check(links == [0, 1], f'the main channel then the preempt channel expected, linked {links}')
    return text


def case_multifd_postcopy(tb, check, version):
    """10.0 refuses post-copy with multifd: the error text, and no migration."""
    src, dst = guest_pair(tb)
    try:
        caps(src, ['multifd'])
        try:
            caps(src, ['postcopy-ram'])
        except vt.QMPError as e:
            msg = str(e)
            check('multifd' in msg.lower(), f'QEMU refused with "{msg}", expected multifd named')
            return f'QEMU {version} refuses postcopy-ram with multifd: "{msg}"'
        check(False, f'QEMU {version} took postcopy-ram with multifd; this test expects 10.0 to '
              'refuse it (10.1 allows the pair: carry it through vmigd then)')
        return 'accepted'
    finally:
        tb.close_qemus(src, dst)


def case_switchover_ack(tb, check):
    text, links, _ = migrate(tb, 'swack', ['return-path', 'switchover-ack'], False,
                             rate=SLOW_RATE)
    check(links == [0], f'one connection expected, linked {links}')
    return text


def main():
    checks = vt.Checks('post-copy and newer channel checks')
    notrun = []
    with vt.Testbed() as tb:
        vt.log(tb.describe())
        versions = (vt.qemu_version(tb.qemu)[:2], vt.qemu_version(tb.qemu_dst)[:2])
        low = min(versions)

        def case(name, fn, *args, needs=None):
            if needs:
                vt.log(f'[{name}] not run: {needs}')
                notrun.append(name)
                return
            vt.log(f'[{name}]')
            checks.run(name, fn, tb, checks.check, *args)

        case('post-copy', case_postcopy)
        case('post-copy with postcopy-preempt, two connections', case_preempt,
             needs=None if low >= (7, 2) else 'postcopy-preempt is 7.1+')
        if low == (10, 0) and versions[0] == versions[1]:
            case('post-copy with multifd', case_multifd_postcopy, '10.0')
        else:
            case('post-copy with multifd', None, needs=(
                'QEMU 7.2 takes postcopy-ram with multifd and breaks later (doc/design.md), '
                '10.0 refuses it, 10.1 is the first to carry both: only 10.0 -> 10.0 checks '
                'the refusal'))
        case('switchover-ack', case_switchover_ack,
             needs=None if low >= (8, 1) else
             f'switchover-ack is QEMU 8.1+; this pair is {low[0]}.{low[1]}')
    vt.log(f'{len(notrun)} not run on this pair: {notrun}' if notrun else 'all cases run')
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
