#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Every test's meson timeout against its measured durations: tests/durations.tsv and the latest
# logs in this build. Fails for a test with no measurement, a timeout below a measured duration,
# or a test in none or several of the cost suites (quick, root, qemu); and catches each of those
# planted in a copy of the data.
import copy
import glob
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
BUILD = os.environ.get('VMIG_BUILD_ROOT', os.path.join(ROOT, 'build'))
COST = ('quick', 'root', 'qemu')
failures = []


def expect(cond, what):
    print(('ok   ' if cond else 'FAIL ') + what)
    if not cond:
        failures.append(what)


def read_table():
    table = {}
    with open(os.path.join(ROOT, 'tests', 'durations.tsv')) as f:
        for line in f:
            if line.startswith('#') or not line.strip():
                continue
            name, secs = line.split('\t')[:2]
            table[name] = int(secs)
    return table


def read_logs(build):
    """{name: (slowest seconds, log file)} of this build's latest runs, any result."""
    seen = {}
    for path in glob.glob(os.path.join(build, 'meson-logs', 'testlog*.json')):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                name = r['name'].rpartition(' / ')[2]
                if r['duration'] > seen.get(name, (-1, ''))[0]:
                    seen[name] = (r['duration'], os.path.basename(path))
    return seen


def problems(tests, table, logs):
    """What is wrong: tests is meson's introspection (name, timeout, suite)."""
    out = []
    for t in tests:
        name, timeout = t['name'], t['timeout']
        suites = [s.partition(':')[2] or s for s in t['suite']]
        cost = [s for s in suites if s in COST]
        if len(cost) != 1:
            out.append(f'{name}: in cost suites {cost}, not exactly one of {", ".join(COST)}')
        if name not in table:
            out.append(f'{name}: no measured duration in tests/durations.tsv '
                       '(run it, then tools/test-times --write)')
        elif timeout < table[name]:
            out.append(f'{name}: timeout {timeout} s is below its measured {table[name]} s')
        if name in logs and timeout < logs[name][0]:
            out.append(f'{name}: timeout {timeout} s is below the {logs[name][0]:.0f} s it took '
                       f'({logs[name][1]})')
    return out


with open(os.path.join(BUILD, 'meson-info', 'intro-tests.json')) as f:
    tests = json.load(f)
table, logs = read_table(), read_logs(BUILD)
found = problems(tests, table, logs)
for p in found:
    print('  ' + p)
expect(not found, f'{len(tests)} tests: each measured, in one cost suite, its timeout above its '
       f'measured duration ({len(logs)} in this build\'s latest logs)')
expect(len(tests) > 50, f'meson lists the whole suite ({len(tests)} tests)')
slow = [t for t in tests if table.get(t['name'], 0) >= 90]
expect(all(any(s.endswith('long') for s in t['suite']) for t in slow) and slow,
       f'the tests measured at 90 s or more are in suite long: '
       f'{", ".join(t["name"] for t in slow)}')

# Planted: each fault in a copy of the data is found, and names the test.
victim = next(t for t in tests if t['name'] in table)
bad = copy.deepcopy(tests)
next(t for t in bad if t['name'] == victim['name'])['timeout'] = table[victim['name']] - 1
expect(any(victim['name'] in p and 'below' in p for p in problems(bad, table, {})),
       f'a timeout below the table\'s duration is caught ({victim["name"]})')
slow_log = {victim['name']: (victim['timeout'] + 1.0, 'testlog.json')}
expect(any('it took' in p for p in problems(tests, table, slow_log)),
       'a run in the logs that took longer than the timeout is caught')
short = dict(table)
del short[victim['name']]
expect(any('no measured duration' in p for p in problems(tests, short, {})),
       'a test missing from tests/durations.tsv is caught')
bad = copy.deepcopy(tests)
next(t for t in bad if t['name'] == victim['name'])['suite'] = ['vmigd:quick', 'vmigd:qemu']
expect(any('cost suites' in p for p in problems(bad, table, {})),
       'a test in two cost suites is caught')

sys.exit(1 if failures else 0)
