#!/usr/bin/python3
"""Runs inside the emulated SR-IOV host (test_sriov.py), chrooted into this machine's own root
over 9p, so that it runs the build under test: finds the igb PF, makes two VFs, puts one in each
of two network namespaces, runs a vmigd on each VF (--hop-interface) and one on the PF
(--node-bandwidth 80%), carries a stream through a migration between the VF daemons, takes a
VF down and times the report. Everything it sees goes to /mnt/result.json for the host side to
judge. Usage: sriov_guest.py BUILD_DIR."""

import glob
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time

BUILD = sys.argv[1]
VMIGD, VMIGCTL = os.path.join(BUILD, 'vmigd'), os.path.join(BUILD, 'vmigctl')
OUT = '/mnt'
STREAM = 16 << 20
res = {'steps': []}


def step(what):
    res['steps'].append(f'{time.monotonic():.2f} {what}')
    save()


def save():
    with open(os.path.join(OUT, 'result.json'), 'w') as f:
        json.dump(res, f, indent=1)


def sh(*args, check=True):
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise RuntimeError(f'{" ".join(args)}: exit {p.returncode}: {p.stderr.strip()}')
    return p.stdout


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def ctl(name, *args):
    return sh(VMIGCTL, '-c', f'/run/{name}.ctl', *args)


def status(name):
    return json.loads(ctl(name, 'status', '--json'))


def daemon(name, ns, *args):
    pre = ['ip', 'netns', 'exec', ns] if ns else []
    log = open(os.path.join(OUT, f'vmigd-{name}.log'), 'w')
    p = subprocess.Popen([*pre, VMIGD, '--no-tls', '--control', f'/run/{name}.ctl',
                          '--log-level', 'info', *args], stdout=log, stderr=log)
    for _ in range(300):
        if p.poll() is not None:
            raise RuntimeError(f'vmigd {name} exited {p.returncode}')
        if subprocess.run([VMIGCTL, '-c', f'/run/{name}.ctl', 'status'],
                          capture_output=True).returncode == 0:
            return p
        time.sleep(0.1)
    raise RuntimeError(f'vmigd {name} does not answer')


def main():
    step('start')
    sh('ip', 'link', 'set', 'lo', 'up')
    pfs = [os.path.basename(d) for d in glob.glob('/sys/class/net/*')
           if os.path.basename(os.path.realpath(f'{d}/device/driver')) == 'igb']
    if not pfs:
        raise RuntimeError('no igb PF in /sys/class/net')
    pf = res['pf'] = pfs[0]
    dev = f'/sys/class/net/{pf}/device'
    res['pf_pci'] = os.path.basename(os.path.realpath(dev))
    res['pf_numa'] = read(f'{dev}/numa_node')
    res['pf_totalvfs'] = read(f'{dev}/sriov_totalvfs')
    sh('ip', 'link', 'set', pf, 'up')
    with open(f'{dev}/sriov_numvfs', 'w') as f:
        f.write('2')
    time.sleep(1)
    vfs = []
    for i in range(2):
        sh('ip', 'link', 'set', pf, 'vf', str(i), 'mac', f'02:00:00:00:00:0{i + 1}')
        names = glob.glob(f'{dev}/virtfn{i}/net/*')
        if not names:
            raise RuntimeError(f'VF {i} has no netdev')
        vfs.append(os.path.basename(names[0]))
    res['vfs'] = vfs
    res['vf_pci'] = [os.path.basename(os.path.realpath(f'{dev}/virtfn{i}')) for i in range(2)]
    step(f'PF {pf}, VFs {vfs}')
    for i, (ns, vf) in enumerate((('a', vfs[0]), ('b', vfs[1]))):
        sh('ip', 'netns', 'add', ns)
        sh('ip', 'link', 'set', vf, 'netns', ns)
        sh('ip', '-n', ns, 'addr', 'add', f'10.99.0.{i + 1}/24', 'dev', vf)
        sh('ip', '-n', ns, 'link', 'set', vf, 'up')
        sh('ip', '-n', ns, 'link', 'set', 'lo', 'up')
    for _ in range(100):
        if all(sh('ip', 'netns', 'exec', ns, 'cat', f'/sys/class/net/{vf}/carrier',
                  check=False).strip() == '1' for ns, vf in (('a', vfs[0]), ('b', vfs[1]))):
            break
        time.sleep(0.2)
    step('VFs in namespaces a and b, carrier up')
    procs = [daemon('a', 'a', '--hop-interface', vfs[0], '--cpus', 'nic'),
             daemon('b', 'b', '--hop-interface', vfs[1])]
    res['status_a'] = status('a')
    res['node_cpus'] = {n: read(f'/sys/devices/system/node/node{n}/cpulist') for n in (0, 1)}
    # Each thread of daemon a (ip netns exec execs it: the pid is vmigd's): where it may run.
    res['a_threads'] = [read(f'{t}/status').split('Cpus_allowed_list:')[1].split()[0]
                        for t in glob.glob(f'/proc/{procs[0].pid}/task/*')]
    step('daemons on the VFs')

    # The PF, in the root namespace: a share of its speed.
    sh('ip', 'addr', 'add', '10.98.0.1/24', 'dev', pf)
    res['pf_speed'] = read(f'/sys/class/net/{pf}/speed')
    try:
        procs.append(daemon('pf', None, '--hop-interface', pf, '--node-bandwidth', '80%'))
        res['status_pf'] = status('pf')
    except RuntimeError as e:
        res['status_pf_error'] = str(e)
    step('daemon on the PF')

    target = ctl('b', 'target', 'start', 'k', '--socket', '49152=/run/dst.sock').strip()
    got = {}

    def sink():
        s = socket.socket(socket.AF_UNIX)
        s.bind('/run/dst.sock')
        s.listen(1)
        s.settimeout(120)
        c, _ = s.accept()
        h, n = hashlib.sha256(), 0
        while True:
            d = c.recv(1 << 20)
            if not d:
                break
            h.update(d)
            n += len(d)
        got.update(sha=h.hexdigest(), n=n)
    # The sink runs in namespace b's vmigd's view only through the unix socket: no netns needed.
    t = threading.Thread(target=sink, daemon=True)
    t.start()
    time.sleep(0.3)
    os.makedirs('/run/src', exist_ok=True)
    src = ctl('a', 'source', 'start', 'k', '--target', target, '--dir', '/run/src').split()[0]
    data = os.urandom(1 << 20) * (STREAM >> 20)
    c = socket.socket(socket.AF_UNIX)
    c.connect(src)
    t0 = time.monotonic()
    c.sendall(data[:STREAM // 2])
    res['mig_a'] = status('a')['migrations']
    res['mig_b'] = status('b')['migrations']
    c.sendall(data[STREAM // 2:])
    c.close()
    t.join(120)
    res['stream'] = {'sent_sha': hashlib.sha256(data).hexdigest(), 'sent': len(data),
                     'got': got, 's': round(time.monotonic() - t0, 2)}
    step('stream carried')

    # A VF taken down in its namespace: how soon status says so.
    res['mig_a_before_down'] = status('a')['migrations']
    t0 = time.monotonic()
    sh('ip', '-n', 'a', 'link', 'set', vfs[0], 'down')
    polls = []
    while time.monotonic() - t0 < 3:
        asked = time.monotonic() - t0
        m = [x for x in status('a')['migrations'] if x['key'] == 'k']
        polls.append([round(asked, 3), m[0]['nic'] if m else None])
    res['down_polls'] = polls
    sh('ip', '-n', 'a', 'link', 'set', vfs[0], 'up')
    step('VF down and up')
    for p in procs:
        p.terminate()
        p.wait(20)
    step('done')


try:
    main()
except Exception as e:  # noqa: BLE001 -- the host side reports it
    res['error'] = f'{type(e).__name__}: {e}'
save()
