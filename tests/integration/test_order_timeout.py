#!/usr/bin/env python3
"""Integration test: a real multifd migration whose first node-hop connection arrives after the
target's --order-timeout. The target must fail the whole migration (never hang), say so with the key,
refuse the late connection, and the source QEMU must report the failure and keep its guest; a
following migration on the same daemons must complete with identical memory."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

ORDER_TIMEOUT_MS = 1500
DELAY_MS = 4000                     # the main channel reaches the target 2.5 s after the timeout
CHANNELS = 4


def check_failed_migration(tb, problems):
    src, dst = tb.qemu_pair(256)
    key = tb.new_key('late-main')
    m = tb.start_migration(src, dst, key, CHANNELS, delay_first_ms=DELAY_MS)

    def source_failed():
        status = m.status()
        return status if status in ('failed', 'completed', 'cancelled') else None

    # Bounded: the target decides at 1.5 s; QEMU gives up once its channels are closed.
    status = vt.wait_until(source_failed, 60, 'the source QEMU to give up')
    if status != 'failed':
        problems.append(f'source QEMU migration status {status}, expected failed')
    # The late main channel is refused, not opened out of order.
    late = f'port {vt.DEFAULT_PORT_ID} connection 0 to '
    vt.wait_until(lambda: any(late in line and 'refused by the target: migration already failed'
                              in line for line in tb.source.migration_lines(key)),
                  DELAY_MS / 1000 + 15, 'the source daemon to log the refusal of connection 0')
    if time.monotonic() - m.started < DELAY_MS / 1000:
        problems.append('connection 0 was refused before it was even sent')

    failure = [line for line in tb.target.migration_lines(key) if 'failed:' in line]
    want = f'migration {key} role=target failed: port {vt.DEFAULT_PORT_ID} connection 0 did not ' \
           f'arrive within {ORDER_TIMEOUT_MS} ms'
    if not any(want in line for line in failure):
        problems.append(f'target log lacks "{want}": {failure}')
    rows = {row[0]: row for row in tb.target.list()}
    if key not in rows or 'state=failed' not in ' '.join(rows[key]):
        problems.append(f'target list does not show {key} as failed: {rows.get(key)}')

    # The guest stays with the source: its QEMU is alive, not handed over.
    if src.run_state() == 'postmigrate':
        problems.append('source guest is in postmigrate after a failed migration')
    if dst.run_state() != 'inmigrate':
        problems.append(f'destination left inmigrate ({dst.run_state()}) without a migration')

    tb.source.source_stop(key)
    tb.target.target_stop(key)
    rec = tb.target.stop_record(key, 'target')
    if not rec.get('outcome', '').startswith('failed'):
        problems.append(f'target stop line outcome={rec.get("outcome")}, expected failed (...)')
    tb.close_qemus(src, dst)


def check_next_migration_works(tb, problems):
    src, dst = tb.qemu_pair(256)
    m = tb.start_migration(src, dst, tb.new_key('after'), CHANNELS)
    result, _ = m.finish_verified(timeout=120)
    for daemon, _, rec in m.stop_records():
        outcome = rec.get('outcome')
        if outcome != 'ok':
            problems.append(f'{daemon.name}: next migration outcome={outcome}')
    vt.log(f'next migration ok: {result.summary()}')
    tb.close_qemus(src, dst)


def main():
    problems = []
    started = time.monotonic()
    # The source is vmigd-test: --test-delay-first is the test build's (doc/control-protocol.md).
    with vt.Testbed(target_args=['--order-timeout', str(ORDER_TIMEOUT_MS)],
                    source_vmigd=vt.find_test_daemon()) as tb:
        check_failed_migration(tb, problems)
        check_next_migration_works(tb, problems)
        tb.stop_daemons()
    if problems:
        raise vt.HarnessError('\n  '.join(['order timeout:'] + problems))
    vt.log(f'order timeout handled cleanly in {time.monotonic() - started:.1f}s')


if __name__ == '__main__':
    vt.run_main(main)
