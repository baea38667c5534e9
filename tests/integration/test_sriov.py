#!/usr/bin/env python3
"""The emulated SR-IOV host: QEMU 10's igb (an Intel 82576 with SR-IOV, driven by
Linux's igb and igbvf) behind a PCIe expander on NUMA node 1 of a two-node guest, under TCG.
The guest boots Debian's kernel from tools/sriov-guest (Debian packages only) and runs this
machine's own build over 9p (tests/integration/sriov_guest.py inside). Checks, from what the
guest wrote out:

- the PF: igb, NUMA node 1; two VFs made through sriov_numvfs, one in each of two namespaces;
- vmigd --hop-interface VF on each: status's node NIC is the VF, kind device, driver igbvf, an
  SR-IOV VF of the PF's PCI address, NUMA node 1, and the speed its driver reports once the
  link is up (1000 Mbit/s: a device's figure, taken as it is);
- a migration between them carries 16 MiB over the VFs, every byte (sha256); both daemons name
  their VF, NUMA node 1, as the migration's NIC;
- --cpus nic on the first: status says CPU 1 (NUMA node 1 of the VF), and its data-path workers
  (as many threads as status's `threads`) may run on CPU 1 only, the control thread anywhere;
- the source's VF taken down: every status asked 1 s or more after says the link is down;
- vmigd on the PF with --node-bandwidth 80%: the node cap is 80 % of the PF's 1000 Mbit/s.

Not checked: whether the pinned workers' buffers really come from node 1 (TCG emulates no
per-node memory, so no placement is measurable here either), and the PF's cable (`set_link` on the QEMU monitor), whose carrier the VFs do not follow in
this emulation. Skips (77) without QEMU 10 or when the guest's boot files cannot be made (no
Debian mirror). About 1-2 min under TCG."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, '..', '..'))
BOOT_TIMEOUT_S = 420


def main():
    c = vt.Checks()
    if os.geteuid() != 0:
        raise vt.Skip('needs root (9p of / and network namespaces in the guest)')
    qemu = vt.qemu_binary("10.0")
    vmigd = os.environ.get('VMIGD') or os.path.join(REPO, 'build', 'vmigd')
    build = os.path.dirname(os.path.abspath(vmigd))
    if any(ch in build for ch in ' ,'):
        raise vt.Skip(f'the build directory {build!r} has a space or a comma, which QEMU\'s '
                      '-fsdev and the guest kernel\'s command line cannot carry')
    guest = os.path.join(REPO, 'build', 'sriov-guest')  # one copy for every build dir
    p = subprocess.run([os.path.join(REPO, 'tools', 'sriov-guest'), guest], capture_output=True,
                       text=True, timeout=600)
    if p.returncode != 0:
        raise vt.Skip(f'cannot make the guest\'s boot files: {p.stderr.strip()[-300:]}')
    out = tempfile.mkdtemp(prefix='vmig-sriov-', dir='/var/tmp')
    try:
        shutil.copy(os.path.join(HERE, 'sriov_guest.py'), os.path.join(out, 'guest.py'))
        with open(os.path.join(out, 'run.sh'), 'w') as f:
            f.write(f'exec /usr/bin/python3 /mnt/guest.py {build}\n')
        cmd = [qemu, '-accel', 'tcg', '-cpu', 'max', '-machine', 'q35', '-smp', '2', '-m', '2G',
               '-nodefaults', '-display', 'none',
               '-object', 'memory-backend-ram,id=m0,size=1G',
               '-object', 'memory-backend-ram,id=m1,size=1G',
               '-numa', 'node,nodeid=0,cpus=0,memdev=m0',
               '-numa', 'node,nodeid=1,cpus=1,memdev=m1',
               '-fsdev', 'local,id=fs0,path=/,security_model=none,readonly=on',
               '-device', 'virtio-9p-pci,fsdev=fs0,mount_tag=host,bus=pcie.0',
               '-fsdev', f'local,id=fs1,path={out},security_model=none',
               '-device', 'virtio-9p-pci,fsdev=fs1,mount_tag=out,bus=pcie.0',
               # The build again at its own path: the guest's /tmp, /var/tmp, /run and /root
               # are its own, and would hide a checkout under one of them.
               '-fsdev', f'local,id=fs2,path={build},security_model=none,readonly=on',
               '-device', 'virtio-9p-pci,fsdev=fs2,mount_tag=build,bus=pcie.0',
               '-device', 'pxb-pcie,id=pxb1,bus_nr=128,bus=pcie.0,numa_node=1',
               '-device', 'pcie-root-port,id=rp1,bus=pxb1,chassis=1',
               '-netdev', 'user,id=n0,restrict=on', '-device', 'igb,netdev=n0,bus=rp1',
               '-kernel', os.path.join(guest, 'vmlinuz'),
               '-initrd', os.path.join(guest, 'initrd.gz'),
               '-append', f'console=ttyS0 panic=-1 quiet run=/mnt/run.sh build={build}',
               '-serial', f'file:{out}/serial.log', '-no-reboot']
        vt.log(f'booting the emulated SR-IOV host ({os.path.basename(qemu)} '
               f'{open(os.path.join(guest, "kernel")).read().strip()})')
        try:
            q = subprocess.run(cmd, capture_output=True, text=True, timeout=BOOT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise vt.HarnessError(f'the guest did not power off within {BOOT_TIMEOUT_S} s; '
                                  f'serial: {tail(out, "serial.log")}; console: '
                                  f'{tail(out, "console.log")}')
        try:
            with open(os.path.join(out, 'result.json')) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            raise vt.HarnessError(f'no result from the guest ({e}); QEMU exit {q.returncode} '
                                  f'{q.stderr.strip()[-300:]}; serial: '
                                  f'{tail(out, "serial.log")}; console: '
                                  f'{tail(out, "console.log")}')
        for s in r.get('steps', []):
            vt.log(f'  guest: {s}')
        if r.get('error'):
            raise vt.HarnessError(f'in the guest: {r["error"]}; console: '
                                  f'{tail(out, "console.log")}; vmigd a: '
                                  f'{tail(out, "vmigd-a.log")}')
        judge(c, r)
    finally:
        if not os.environ.get('VMIG_KEEP'):
            shutil.rmtree(out, ignore_errors=True)
        else:
            vt.log(f'kept {out}')
    c.finish()


def tail(d, name, n=1200):
    try:
        with open(os.path.join(d, name), errors='replace') as f:
            return f.read()[-n:]
    except OSError:
        return '(none)'


def judge(c, r):
    vt.log(f'  PF {r["pf"]} ({r["pf_pci"]}), NUMA node {r["pf_numa"]}, {r["pf_totalvfs"]} VFs '
           f'possible; VFs {r["vfs"]} ({r["vf_pci"]})')
    c.check(r['pf_numa'] == '1', 'the PF sits on NUMA node 1')
    nic = r['status_a']['node']['nic']
    vt.log(f'  node NIC of the daemon on VF {r["vfs"][0]}: {nic}')
    c.check(nic and nic['interface'] == r['vfs'][0] and nic['kind'] == 'device' and
            nic.get('driver') == 'igbvf' and nic['vf'] is True and
            nic.get('pf') == r['pf_pci'] and nic.get('device') == r['vf_pci'][0],
            'discovery: the VF, igbvf, an SR-IOV VF of the PF\'s PCI address')
    c.check(nic and nic.get('numa_node') == 1, 'discovery: NUMA node 1')
    c.check(nic and nic['speed_known'] is True and nic['speed'] == 125000000,
            'discovery: the speed igbvf reports, 1000 Mbit/s')
    sa = r['status_a']
    vt.log(f'  --cpus nic: status cpus {sa.get("cpus")!r}, node CPUs {r["node_cpus"]}, '
           f'threads {sa["threads"]}, their CPUs {sorted(r["a_threads"])}')
    want = f'{r["node_cpus"]["1"]} (NUMA node 1 of {r["vfs"][0]})'
    c.check(sa.get('cpus') == want, f'--cpus nic: status cpus "{want}"')
    c.check(r['a_threads'].count(r['node_cpus']['1']) == sa['threads'] and
            len(r['a_threads']) > sa['threads'],
            f'--cpus nic: {sa["threads"]} worker threads on node 1\'s CPUs only, the rest not')
    st = r['stream']
    vt.log(f'  stream: {st["got"].get("n")} of {st["sent"]} bytes in {st["s"]} s')
    c.check(st['got'].get('sha') == st['sent_sha'] and st['got'].get('n') == st['sent'],
            'the migration carried every byte over the VFs')
    for side, vf, key in (('a', r['vfs'][0], 'mig_a'), ('b', r['vfs'][1], 'mig_b')):
        m = [x for x in r[key] if x['key'] == 'k']
        n = m and m[0]['nic']
        vt.log(f'  {side}: migration NIC {n and (n["interface"], n.get("driver"), n.get("numa_node"))}')
        c.check(n and n['interface'] == vf and n.get('driver') == 'igbvf' and
                n.get('numa_node') == 1, f'{side}: the migration goes over {vf}, NUMA node 1')
    polls = r['down_polls']
    first = next((a for a, n in polls if n and not n['link_up']), None)
    vt.log(f'  VF down: {len(polls)} polls, the first saying down asked at {first} s')
    late = [(a, n) for a, n in polls if a >= 1.0]
    c.check(late and all(n and not n['link_up'] for a, n in late),
            'the VF taken down: every status from 1 s on says so')
    pf = r.get('status_pf')
    if pf:
        vt.log(f'  PF daemon: node cap {pf["node"]["bandwidth"]} B/s, PF speed '
               f'{r["pf_speed"]} Mbit/s, node NIC {pf["node"]["nic"]}')
    c.check(pf and r['pf_speed'] == '1000' and pf['node']['bandwidth'] == 100000000 and
            pf['node']['nic']['speed'] == 125000000,
            f'--node-bandwidth 80% on the PF: 80 % of 1000 Mbit/s '
            f'({r.get("status_pf_error") or "ok"})')


if __name__ == '__main__':
    vt.run_main(main)
