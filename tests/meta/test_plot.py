#!/usr/bin/env python3
"""`bench/vmig-bench plot` on results made here in vmig-bench's shape: a converge run with a
timeline and two actions, and a qemu results file with two routes. The images are SVG, drawn
twice to the same bytes, and carry what they must show (the actions by name, the routes, the
median). Skips (77) where Debian's python3 has no matplotlib (python3-matplotlib)."""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, '..', '..', 'bench', 'vmig-bench')

CONVERGE = {
    'mode': 'converge',
    'runs': [{'scenario': 'service', 'mode': 'predictive', 'run': r, 'mem_mib': 256,
              'cap_mib_s': 16, 'dirty_mib_s': 32, 'status': 'cancelled', 'total_s': 17.5,
              'timeline': [[0.0, 'active', 1, 0.0, 254.0, 0], [4.1, 'active', 2, 31.0, 62.0, 0],
                           [8.0, 'active', 3, 30.5, 61.5, 60],
                           [12.2, 'active', 4, 30.0, 61.0, 80],
                           [17.5, 'cancelled', 4, 0.0, 0.0, 80]],
              'actions': [{'action': 'auto-converge', 'at_s': 7.9, 'reason': 'x'},
                          {'action': 'abort', 'at_s': 16.0, 'reason': 'y'}]}
             for r in (1, 2)],
}
QEMU = {
    'mode': 'qemu', 'params': {'ram': 1 << 30, 'channels': 8},
    'runs': [{'run': i, 'route': route, 'ok': True, 'gbit_s': g, 'relay_cpu_s_per_gb': c}
             for i, (route, g, c) in enumerate([('vmigd', 14.0, 0.26), ('vmigd', 15.0, 0.28),
                                                ('kubevirt-go', 9.0, 0.49),
                                                ('kubevirt-go', 9.4, 0.47)])],
}


def main():
    probe = subprocess.run(['/usr/bin/python3', '-c', 'import matplotlib'], capture_output=True)
    if probe.returncode != 0:
        print('SKIP: /usr/bin/python3 has no matplotlib (Debian: python3-matplotlib, which '
              'tools/setup installs)')
        return 77
    problems = []
    with tempfile.TemporaryDirectory(prefix='vmig-plot-') as tmp:
        files = []
        for name, data in (('converge-x.json', CONVERGE), ('qemu-x.json', QEMU)):
            files.append(os.path.join(tmp, name))
            with open(files[-1], 'w') as f:
                json.dump(data, f)
        outs = []
        for n in (1, 2):
            out = os.path.join(tmp, f'out{n}')
            p = subprocess.run([sys.executable, BENCH, 'plot', *files, '--out', out],
                               capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                print(f'FAIL: vmig-bench plot exited {p.returncode}: {p.stderr[-800:]}')
                return 1
            outs.append(out)
        got = sorted(os.listdir(outs[0]))
        want = ['converge-x-service-predictive.svg', 'qemu-x-routes.svg']
        if got != want:
            problems.append(f'images {got}, want {want}')
        for name in got:
            a = open(os.path.join(outs[0], name)).read()
            b = open(os.path.join(outs[1], name)).read()
            if a != b:
                problems.append(f'{name}: two runs drew different bytes')
            if not a.startswith('<?xml') or '<svg' not in a:
                problems.append(f'{name}: not SVG')
            for must in ({'converge-x-service-predictive.svg':
                          ('auto-converge', 'abort', 'run 1: cancelled 17.5 s',
                           'service / predictive')}.get(name) or
                         ('vmigd', 'kubevirt-go', '14.50', '9.20', 'core-s/GB')):
                if must not in a:
                    problems.append(f'{name}: no "{must}" in it')
        p = subprocess.run([sys.executable, BENCH, 'plot', os.path.join(tmp, 'nope.json')],
                           capture_output=True, text=True, timeout=60)
        if p.returncode == 0:
            problems.append('a missing results file: exit 0')
    for x in problems:
        print(f'FAIL: {x}')
    print('PASS' if not problems else f'{len(problems)} problems')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
