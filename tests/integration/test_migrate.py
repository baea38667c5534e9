#!/usr/bin/env python3
"""Integration test: 25 QEMU migrations through one pair of vmigd daemons in two network namespaces
(multifd off/4/8/16 at 256 MiB, 8 channels at 1 GiB, 8 channels with the first node-hop connection
held back 700 ms, then 3 at once); each must complete with identical guest memory."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

# (RAM MiB, multifd channels (0 = off), --test-delay-first ms or None)
PLAN = ([(256, 0, None)] * 5 + [(256, 4, None)] * 5 + [(256, 8, None)] * 5
        + [(256, 16, None)] * 5 + [(1024, 8, None), (256, 8, 700)])
CONCURRENT = 3                      # then this many 256 MiB, 4-channel migrations at once


def daemon_record_problems(tb, result, delay_ms):
    """What is wrong in the daemons' account of a migration QEMU completed: each must log a start
    and an ok stop, one connection per QEMU channel (main + multifd), at least the bytes QEMU
    counted, and no error line for the key. Returns a list of problems (empty: all good)."""
    problems = []
    expected_conns = result.channels + 1
    for daemon, role in tb.sides():
        rec = daemon.stop_record(result.key, role)
        where = f'{daemon.name} {result.key}'
        if not any(f'role={role} start' in line for line in daemon.migration_lines(result.key)):
            problems.append(f'{where}: no start line')
        if rec.get('outcome') != 'ok':
            problems.append(f'{where}: stop line says outcome={rec.get("outcome")}')
        if int(rec.get('conns', -1)) != expected_conns:
            problems.append(f'{where}: conns={rec.get("conns")}, expected {expected_conns}')
        if int(rec.get('bytes', -1)) < result.bytes:
            problems.append(f'{where}: bytes={rec.get("bytes")}, fewer than the {result.bytes} '
                            'QEMU counted')
        problems += [f'{where}: {line}' for line in daemon.problem_lines(result.key)
                     if ': error:' in line.lower()]
    if delay_ms and result.seconds < delay_ms / 1000:
        problems.append(f'{result.key} finished in {result.seconds:.2f}s although its first '
                        f'connection was held back {delay_ms} ms')
    # With the first connection held back, the target must have held every other one until it
    # came: that is the ordering rule at work, not a lucky arrival order.
    reordered = int(tb.target.stop_record(result.key, 'target').get('reordered', -1))
    if delay_ms and result.channels and reordered != result.channels:
        problems.append(f'{result.key}: target reordered {reordered} connections, expected '
                        f'{result.channels} (all multifd channels waited for the main one)')
    return problems


def report(tb, label, result, digest, delay_ms, problems):
    found = daemon_record_problems(tb, result, delay_ms)
    problems += found
    state = 'ok' if not found else f'QEMU ok, {len(found)} daemon problem(s)'
    vt.log(f'[{label}] {state} {result.summary()} memory sha256 {digest[:16]}')
    for p in found:
        vt.log(f'    {p}')


def run_sequential(tb, problems):
    for n, (size, channels, delay) in enumerate(PLAN, 1):
        src, dst = tb.qemu_pair(size)
        key = tb.new_key(f'mfd{channels}' + (f'-delay{delay}' if delay else ''))
        m = tb.start_migration(src, dst, key, channels, delay_first_ms=delay)
        listed = [row[0] for row in tb.source.list()]
        if key not in listed:
            problems.append(f'source `list` does not show {key} while it runs: {listed}')
        result, digest = m.finish_verified(timeout=120)
        report(tb, f'{n}/{len(PLAN)}', result, digest, delay, problems)
        tb.close_qemus(src, dst)


def run_concurrent(tb, problems):
    """CONCURRENT migrations in flight together, each guest with different RAM contents: every
    destination must end up with its own source's memory."""
    pairs = [tb.qemu_pair(256, ram_variant=i) for i in range(1, CONCURRENT + 1)]
    running = [tb.start_migration(src, dst, tb.new_key('concurrent'), 4) for src, dst in pairs]
    results = [m.finish(timeout=120) for m in running]
    digests = set()
    for result, (src, dst) in zip(results, pairs):
        digest = vt.verify_memory(src, dst)
        digests.add(digest)
        report(tb, 'concurrent', result, digest, None, problems)
    if len(digests) != CONCURRENT:
        raise vt.HarnessError('concurrent guests were meant to have distinct memory contents')
    for src, dst in pairs:
        tb.close_qemus(src, dst)


def main():
    started = time.monotonic()
    problems = []
    # The source is vmigd-test: --test-delay-first is the test build's (doc/control-protocol.md).
    with vt.Testbed(source_vmigd=vt.find_test_daemon()) as tb:
        vt.log(tb.describe())
        run_sequential(tb, problems)
        run_concurrent(tb, problems)
        st = tb.target.status()
        left = vt.status_migration_count(st), vt.status_migrations(st)
        if left[0] not in (0, []) or left[1]:
            problems.append(f'target daemon still lists migrations after all stops: {left}')
        warnings = tb.source.problem_lines() + tb.target.problem_lines()
        if warnings:
            vt.log('daemon warnings and errors:\n' + '\n'.join(warnings))
        tb.stop_daemons()
    total = len(PLAN) + CONCURRENT
    vt.log(f'{total} migrations completed with identical memory in '
           f'{time.monotonic() - started:.1f}s')
    if problems:
        raise vt.HarnessError(f'{len(problems)} problem(s) in the daemons\' account:\n  '
                              + '\n  '.join(problems))


if __name__ == '__main__':
    vt.run_main(main)
