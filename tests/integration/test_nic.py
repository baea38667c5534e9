#!/usr/bin/env python3
"""Integration test of what vmigd finds out about the NIC that carries each node hop (issue 17,
ctrl/ctl_netlink.c and ctrl/ctl_nic.c: libnl-route-3 and sysfs) and of link events, on two
namespaces joined by a veth pair, with a dummy interface beside it. No QEMU: a byte stream goes
through a migration started without one (tests/lib/vmigtest: start_route), so that link faults
can be timed against it.

- the node: status names the interface that holds the advertised address (the veth, kind veth,
  no device, speed unknown, NUMA node -1);
- a migration whose target sits behind a dummy interface: kind dummy, speed unknown, the route's
  source address; `vmigctl status` says "speed unknown" (a kernel without the dummy driver gets
  a second veth pair in its place, and the log says so);
- a migration over the veth: both daemons name their own end of the pair (the target once the
  first connection came), link up, route to the peer from the own address;
- link down (the target's end of the pair taken down, so the source's loses its carrier): every
  status asked for from 1 s after the fault says LINK DOWN (link_up false, link_down_ms, one
  down), and the log says it; the same in the metrics (vmigd_migration_link_up 0,
  vmigd_migration_nic_info with the interface). Up again after 2 s: status says up, downs 1,
  the log "up again after", and the stream carries on: every byte arrives (sha256);
- a route added for the peer through the dummy interface moves the migration there (status
  and log "now goes out on"), and deleting it moves it back."""

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

REPORT_WITHIN_S = 1.0
DOWN_S = 2.0
STREAM_MIB = 48


def ip(ns, *args):
    subprocess.run(['ip', '-n', ns, *args], check=True, capture_output=True, text=True)


def nic_of(daemon, key, role):
    m = daemon.migration_status(key, role)
    return m.get('nic') if m else None


def main():
    c = vt.Checks()
    with vt.Testbed(daemon_args=['--metrics', '127.0.0.1:0']) as tb:
        net = tb.net
        sns, tns = net.ns('source'), net.ns('target')
        subnet = net.source_addr.split('.')[2]
        dummy, dummy_addr = 'vmdum0', f'198.19.{subnet}.1'
        dummy_peer = f'198.19.{subnet}.2'
        try:
            ip(sns, 'link', 'add', dummy, 'type', 'dummy')
            kind = 'dummy'
        except subprocess.CalledProcessError as e:
            # Some kernels have no dummy driver (CONFIG_DUMMY, no module to load): a veth pair
            # with both ends in the source's namespace is another interface without a device.
            vt.log(f'  no dummy interface here ({e.stderr.strip()}): a second veth pair '
                   'stands in for it')
            ip(sns, 'link', 'add', dummy, 'type', 'veth', 'peer', 'name', dummy + 'p')
            ip(sns, 'link', 'set', dummy + 'p', 'up')
            kind = 'veth'
        ip(sns, 'addr', 'add', f'{dummy_addr}/24', 'dev', dummy)
        ip(sns, 'link', 'set', dummy, 'up')

        vt.log('the node')
        node = tb.source.status()['node'].get('nic')
        vt.log(f'  {node}')
        c.check(node and node['interface'] == net.source_if and node['kind'] == 'veth',
                f'node: the advertised address is on {net.source_if}, a veth')
        c.check(node and node['speed'] is None and node['speed_known'] is False and
                'device' not in node and 'numa_node' not in node,
                'node: no device, so speed unknown (null) and no NUMA node')
        c.check(node and f'{net.source_addr}/24' in node['addresses'].split(),
                'node: its addresses include the veth\'s')

        vt.log('a migration behind the dummy interface')
        raw, _ = tb.target.target_start('nic-dummy', {vt.DEFAULT_PORT_ID: tb.path('dst', 'x')})
        raw = raw.replace(net.target_addr, dummy_peer)
        tb.source.source_start('nic-dummy', raw, tb.path('src'))
        nic = nic_of(tb.source, 'nic-dummy', 'source')
        vt.log(f'  {nic}')
        c.check(nic and nic['interface'] == dummy and nic['kind'] == kind and
                nic['peer'] == dummy_peer and nic['source'] == dummy_addr and
                'gateway' not in nic, f'dummy: routed out of {dummy} from {dummy_addr}')
        c.check(nic and nic['speed'] is None and not nic['speed_known'],
                'dummy: speed unknown')
        text = tb.source.ctl_ok('status')
        line = [x for x in text.splitlines() if x.startswith('nic nic-dummy')]
        vt.log(f'  vmigctl status: {line}')
        c.check(line and f'nic nic-dummy (source): {dummy}, {kind}' in line[0] and
                'speed unknown' in text, 'vmigctl status shows it, "speed unknown"')
        tb.source.source_stop('nic-dummy')
        tb.target.ctl_ok('target', 'stop', 'nic-dummy')

        vt.log('a migration over the veth, link down for 2 s')
        key = 'nic-veth'
        data = os.urandom(1 << 20) * STREAM_MIB
        want = hashlib.sha256(data).hexdigest()
        server = tb.unix_server(f'{key}.sock', vt.digest_all)
        src_sock = tb.start_route(key, tb.path('dst', f'{key}.sock'))
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sender.connect(src_sock)
        sent = {'n': 0}

        def send():
            # Slowly enough that the stream spans the fault: 4 MiB every 0.25 s.
            for off in range(0, len(data), 4 << 20):
                sender.sendall(data[off:off + (4 << 20)])
                sent['n'] = off + (4 << 20)
                time.sleep(0.25)
            sender.close()
        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        vt.wait_until(lambda: nic_of(tb.target, key, 'target'), 10,
                      'the target to know its peer')
        s_nic, t_nic = nic_of(tb.source, key, 'source'), nic_of(tb.target, key, 'target')
        vt.log(f'  source: {s_nic}')
        vt.log(f'  target: {t_nic}')
        c.check(s_nic['interface'] == net.source_if and s_nic['link_up'] and
                s_nic['peer'] == net.target_addr and s_nic['source'] == net.source_addr,
                f'source: over {net.source_if} from {net.source_addr}, link up')
        c.check(t_nic['interface'] == net.target_if and t_nic['peer'] == net.source_addr,
                f'target: over {net.target_if} back to {net.source_addr}')
        c.check(s_nic['link_downs'] == 0 and s_nic['link_down_ms'] == 0, 'no downs yet')

        since = tb.source.log_offset()
        t0 = time.monotonic()
        ip(tns, 'link', 'set', net.target_if, 'down')
        polls = []
        while time.monotonic() - t0 < DOWN_S:
            asked = time.monotonic() - t0
            polls.append((asked, nic_of(tb.source, key, 'source')))
        ip(tns, 'link', 'set', net.target_if, 'up')
        late = [(a, n) for a, n in polls if a >= REPORT_WITHIN_S]
        first_down = next((a for a, n in polls if n and not n['link_up']), None)
        vt.log(f'  {len(polls)} status polls during the fault; first saying down asked at '
               f'{first_down if first_down is None else round(first_down, 3)} s')
        c.check(late and all(n and not n['link_up'] and n['link_down_ms'] > 0 and
                             n['link_downs'] == 1 for a, n in late),
                f'every status asked {REPORT_WITHIN_S} s or more after the fault says the link '
                'is down, once')
        tb.source.wait_log(f'{key} role=source: link {net.source_if} down', 5, since,
                           'the log line for the link down')
        vt.log('  ' + [x for x in tb.source.log_since(since).splitlines()
                       if 'link ' + net.source_if in x][0])
        # The metrics while it was down came from the polls above; now, the info and the gauge.
        status, _, body = vt.http_get(net.ns('source'), tb.source.metrics_url())
        fams, problems = vt.parse_prometheus(body)
        c.check(not problems, f'the exposition parses ({problems[:2]})')
        info = vt.prom_value(fams, 'vmigd_migration_nic_info', key=key, role='source',
                             interface=net.source_if, kind='veth')
        c.check(info == 1, 'vmigd_migration_nic_info names the veth')
        downs = vt.prom_value(fams, 'vmigd_migration_link_downs_total', key=key, role='source')
        c.check(downs == 1, f'vmigd_migration_link_downs_total {downs}')

        vt.wait_until(lambda: nic_of(tb.source, key, 'source')['link_up'], 5, 'link up again')
        s_nic = nic_of(tb.source, key, 'source')
        c.check(s_nic['link_downs'] == 1 and s_nic['link_down_ms'] == 0,
                'up again: link_up, one down counted')
        tb.source.wait_log(f'{key} role=source: link {net.source_if} up again after', 5, since,
                           'the log line for the link up')

        vt.log('a route through the dummy interface, then back')
        since = tb.source.log_offset()
        ip(sns, 'route', 'add', f'{net.target_addr}/32', 'dev', dummy)
        vt.wait_until(lambda: nic_of(tb.source, key, 'source')['interface'] == dummy, 5,
                      f'the migration to move to {dummy}')
        tb.source.wait_log(f'now goes out on {dummy} \\(was {net.source_if}\\)', 5, since,
                           'the log line for the move')
        ip(sns, 'route', 'del', f'{net.target_addr}/32', 'dev', dummy)
        vt.wait_until(lambda: nic_of(tb.source, key, 'source')['interface'] == net.source_if, 5,
                      f'the migration to move back to {net.source_if}')
        vt.log('  moved there and back')

        thread.join(60)
        got = server.join(60)
        c.check(got and got[0] == (want, len(data)),
                f'every byte arrived through the link down ({got and got[0][1]} of {len(data)})')
        tb.stop_daemons()
    c.finish()


if __name__ == '__main__':
    vt.run_main(main)
