"""The DPDK node hop's tool, tests/tools/dpdk-stream, run as a pair across a NetPair's two
namespaces: one receiver, one sender, each on its own DPDK port (net_memif, or net_af_packet on
the veth), for test_dpdk_hop.py and `bench/vmig-bench dpdk`."""

import glob
import json
import os
import shutil
import subprocess
import time

from .base import Skip, log, tool_binary, wait_until

PORT = 4790
MEMIF = ('net_memif0,role=server,socket={sock},socket-abstract=no',
         'net_memif0,role=client,socket={sock},socket-abstract=no')


def afpacket(net):
    """The vdev pair for net_af_packet on the NetPair's veth ends."""
    return (f'net_af_packet0,iface={net.target_if}', f'net_af_packet0,iface={net.source_if}')


def stream_tool():
    path = tool_binary('DPDK_STREAM', 'tests/tools/dpdk-stream')
    proc = subprocess.run([path], capture_output=True, text=True)
    if proc.returncode == 77:
        raise Skip(proc.stdout.strip())
    if not glob.glob('/usr/lib/*/dpdk/pmds-*/librte_net_memif.so*'):
        raise Skip('DPDK has no net_memif PMD here')
    return path


def run_pair(tool, net, work, name, vdevs, size, keys=(None, None), impair=(), timeout=60,
             tls=None, streams=1, extra=(), again=True):
    """Receiver in the target namespace, sender in the source one; (receiver, sender) results,
    each the tool's JSON with its exit status as 'rc'. keys: a shared secret per side (hex);
    tls: per side {'cert', 'key', 'ca'}, keyed over a TLS control connection on the veth.
    streams: how many streams (multifd's channels) share the port, size split among them.
    extra: more arguments for both sides (--copy). impair: the receiver's test-only damage on
    arrival (--loss, --duplicate, --reorder PCT)."""
    cpus = os.cpu_count() or 1
    procs, outs = [], []
    for side, role, lcore, addr, peer, vdev, key, certs in (
            ('target', 'receive', 0, '10.77.0.1/24', '10.77.0.2', vdevs[0], keys[0],
             tls and tls[0]),
            ('source', 'send', 1 % cpus, '10.77.0.2/24', '10.77.0.1', vdevs[1], keys[1],
             tls and tls[1])):
        prefix = f'vmigdpdk{os.getpid()}{name}{role}'
        # A memif server leaves its socket behind (its port is only stopped): one per run.
        vdev = vdev.replace('{sock}', os.path.join(work, name + '.sock'))
        eal = (f'--no-huge -m 256 --no-pci --no-shconf --file-prefix={prefix} -l {lcore} '
               f'--vdev={vdev}')
        cmd = [*net.prefix(side), tool, '--eal', eal, '--address', addr, '--peer', peer,
               '--port', str(PORT), f'--{role}', str(size), '--timeout', str(timeout),
               '--streams', str(streams), *extra]
        if key:
            cmd += ['--secret', key]
        if certs:
            cmd += ['--control', f'{net.target_addr}:{PORT + 1}', '--tls-cert', certs['cert'],
                    '--tls-key', certs['key'], '--tls-ca', certs['ca']]
        if role == 'receive':
            cmd += list(impair)
        out = open(os.path.join(work, f'{name}-{role}.out'), 'w+')
        procs.append((subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT), prefix))
        outs.append(out)
        if role == 'receive':
            time.sleep(0.5)  # the memif server first
    results = []
    for (proc, prefix), out in zip(procs, outs):
        try:
            rc = proc.wait(timeout + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        shutil.rmtree(f'/var/run/dpdk/{prefix}', ignore_errors=True)
        out.seek(0)
        text = out.read()
        lines = [ln for ln in text.splitlines() if ln.startswith('{')]
        res = json.loads(lines[-1]) if lines else {'output': text[-2000:]}
        res['rc'] = rc
        if rc < 0 and lines:
            log(f'{name}: {prefix} died of signal {-rc} after printing its result (in its '
                f'teardown: DPDK 22.11 stopping a memif port while the peer hangs up)')
        results.append(res)
    log(f'{name}: receiver {short(results[0])}; sender {short(results[1])}')
    # The port's own link never coming up is DPDK's memif handshake, not the hop: seen once in
    # about 30 runs here with CI beside it. One more try, said in the log.
    if again and all('no answer from the peer' in r.get('output', '') and '(link down' in
                     r.get('output', '') for r in results):
        log(f'{name}: the memif link never came up on either side: once more')
        return run_pair(tool, net, work, name + '-again', vdevs, size, keys, impair, timeout,
                        tls, streams, extra, again=False)
    return results


def short(r):
    keys = ('rc', 'bytes', 'done', 'gbit_s', 'core_s_per_gb', 'keying', 'streams',
            'retransmitted_frames',
            'timeouts', 'dropped_by_test', 'duplicated_by_test', 'reordered_by_test',
            'refused_frames', 'seal_forged', 'seal_replayed', 'refused', 'output')
    return {k: r[k] for k in keys if k in r}


def daemon_ready(vmigd=None):
    """Skip unless vmigd was built with DPDK and DPDK has the net_memif PMD."""
    from .daemons import find_binaries
    if vmigd is None:
        vmigd, _ = find_binaries()
    proc = subprocess.run([vmigd, '--no-tls', '--dpdk', 'x', '--dpdk-address', '10.0.0.1/24',
                           '-n'], capture_output=True, text=True)
    if 'built without DPDK' in proc.stderr:
        raise Skip('vmigd was built without DPDK (meson setup -Ddpdk=enabled)')
    if not glob.glob('/usr/lib/*/dpdk/pmds-*/librte_net_memif.so*'):
        raise Skip('DPDK has no net_memif PMD here')


DAEMON_ADDR = {'source': '10.79.0.1', 'target': '10.79.0.2'}
DAEMON_PORT = 4791


def remove_eal_dirs():
    """Remove the EAL folders this process's daemons left: EAL makes /var/run/dpdk/PREFIX for
    each --file-prefix even with --no-shconf, and daemon_args' prefixes start vmigdPID."""
    for path in glob.glob(f'/var/run/dpdk/vmigd{os.getpid()}*'):
        shutil.rmtree(path, ignore_errors=True)


def wait_link(tb, timeout=15):
    """Both daemons of Testbed tb say (status dpdk.link_up) that their DPDK port's link is up:
    until then new connections take the kernel path. How long that took."""
    t0 = time.monotonic()
    for d in (tb.source, tb.target):
        wait_until(lambda: (d.status_field('dpdk') or {}).get('link_up') is True, timeout,
                   f'{d.name}: status dpdk.link_up', interval=0.05)
    return time.monotonic() - t0


def daemon_args(side, kind, sockdir, tag, extra=(), memif_server='source', iface=None,
                eal_extra=''):
    """vmigd's --dpdk options for one side of a NetPair (Testbed's placeholders {source_if} and
    {target_if} name the veth ends): kind 'memif' (a socket in sockdir, memif_server's side the
    server) or 'afpacket' (on the side's veth end, or on iface); its own EAL file prefix (tag)
    and lcore; eal_extra: more EAL arguments (--log-level=pmd.net.memif:debug)."""
    lcore = 0 if side == 'source' else 1 % (os.cpu_count() or 1)
    if kind == 'memif':
        vdev = MEMIF[0 if side == memif_server else 1].format(
            sock=os.path.join(sockdir, f'memif-{tag}.sock'))
    else:
        vdev = f'net_af_packet0,iface={iface or "{" + side + "_if}"}'
    eal = (f'--no-huge -m 256 --no-pci --no-shconf --file-prefix=vmigd{os.getpid()}{tag}{side} '
           f'-l {lcore} {eal_extra + " " if eal_extra else ""}--vdev={vdev}')
    return ['--dpdk', eal, '--dpdk-address', DAEMON_ADDR[side] + '/24', *extra]
