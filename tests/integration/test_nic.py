#!/usr/bin/env python3
"""Integration test of what vmigd finds out about the NIC that carries each node hop
(ctrl/ctl_netlink.c and ctrl/ctl_nic.c: libnl-route-3 and sysfs) and of link events, on two
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
  and log "now goes out on"), and deleting it moves it back;
- link down past the bound (--link-down-timeout 5, down 8 s; the daemons run with
  --resume-timeout 0, since a migration whose connections are all resumable waits for its node
  hop instead): both daemons fail the migration at the bound, status and log say why, and the
  source's local connection is cut;
- a real QEMU migration (7.2, a guest at twice the cap with nothing allowed, which vmigd's
  predictive policy aborts when it sees it cannot converge) with the link down for 4 s from
  3 s in: while down, the convergence evidence says "held" and no action is taken; after, the
  policy goes on and aborts as it would have; the log says held and goes on;
- vmigd --hop-interface: a daemon given only the interface listens on and advertises its
  address; an unknown interface, one without an address to use, and a --listen address of
  another interface are refused at start with the reason; --node-bandwidth 80% on a veth is
  refused: its speed is unknown; --cpus nic on a veth (no NUMA node), without an address of
  the node's own, and a malformed CPU list are refused."""

import hashlib
import json
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
BOUND_S = 5                  # --link-down-timeout
LONG_DOWN_S = BOUND_S + 3
HOLD_AT_S, HOLD_S = 3.0, 4.0       # the QEMU migration's link down
STREAM_MIB = 48


def ip(ns, *args):
    subprocess.run(['ip', '-n', ns, *args], check=True, capture_output=True, text=True)


def nic_of(daemon, key, role):
    m = daemon.migration_status(key, role)
    return m.get('nic') if m else None


def main():
    c = vt.Checks()
    # --resume-timeout 0: connections that are not resumable, which the link-down bound is
    # for (resumable ones wait for their node hop instead: test_resume's link case)
    with vt.Testbed(daemon_args=['--metrics', '127.0.0.1:0', '--resume-timeout', '0',
                                 '--link-down-timeout', str(BOUND_S)]) as tb:
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

        vt.log('--hop-interface and --node-bandwidth N%')
        ctl = tb.path('hop.ctl')
        hop = subprocess.Popen([*net.prefix('source'), tb.vmigd, '--no-tls', '--control', ctl,
                                '--hop-interface', dummy, '--log-level', 'info'],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            vt.wait_until(lambda: subprocess.run([tb.vmigctl, '-c', ctl, 'status'],
                                                 capture_output=True).returncode == 0, 10,
                          'the --hop-interface daemon to answer')
            st = json.loads(subprocess.run([tb.vmigctl, '-c', ctl, 'status', '--json'],
                                              capture_output=True, text=True).stdout)
            vt.log(f'  listen {st["listen"]}, advertise {st["advertise"]}, node nic '
                   f'{st["node"]["nic"] and st["node"]["nic"]["interface"]}')
            c.check(st['listen'].startswith(dummy_addr + ':') and st['advertise'] == dummy_addr
                    and st['node']['nic']['interface'] == dummy,
                    f'--hop-interface {dummy}: listens on and advertises {dummy_addr}')
        finally:
            hop.terminate()
            hop.wait(10)
        for args, want in (
                (['--hop-interface', 'vmnosuch0'], 'interface vmnosuch0: '),
                (['--hop-interface', 'lo', '--listen', f'{net.source_addr}:0'],
                 f'--listen {net.source_addr}:0 is not an address of --hop-interface lo'),
                (['--listen', f'{net.source_addr}:0', '--node-bandwidth', '80%'],
                 f'--node-bandwidth 80%: the speed of {net.source_if} (veth) is unknown'),
                (['--node-bandwidth', '120%'], 'a share of the link is 1% to 100%'),
                (['--listen', f'{net.source_addr}:0', '--cpus', 'nic'],
                 f'--cpus nic: {net.source_if} has no NUMA node (no device)'),
                (['--cpus', '0-'], '--cpus: expected a CPU list such as 0-3,8 or nic'),
                (['--cpus', 'nic'], '--cpus nic needs the node hop\'s own address')):
            p = subprocess.run([*net.prefix('source'), tb.vmigd, '--no-tls', '--control',
                                tb.path('bad.ctl'), *args], capture_output=True, text=True,
                               timeout=20)
            vt.log(f'  {" ".join(args)}: exit {p.returncode}: {p.stderr.strip()[-160:]}')
            c.check(p.returncode == 1 and want in p.stderr, f'{" ".join(args)}: refused, '
                    f'saying "{want}"')

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

        vt.log(f'link down for {LONG_DOWN_S} s, past the bound ({BOUND_S} s)')
        key = 'nic-long'
        server = tb.unix_server(f'{key}.sock', vt.digest_all)
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sender.connect(tb.start_route(key, tb.path('dst', f'{key}.sock')))
        sender.sendall(b'x' * (1 << 20))
        vt.wait_until(lambda: nic_of(tb.target, key, 'target'), 10,
                      'the target to know its peer')
        since = {d.name: d.log_offset() for d in (tb.source, tb.target)}
        t0 = time.monotonic()
        ip(tns, 'link', 'set', net.target_if, 'down')
        states = {}
        for d, role in tb.sides():
            m = vt.wait_until(lambda: (lambda m: m if m and m['state'] == 'failed' else None)(
                d.migration_status(key, role)), BOUND_S + 10, f'{d.name}: {key} to fail')
            states[role] = (time.monotonic() - t0, m['error'])
            vt.log(f'  {role}: failed {states[role][0]:.1f} s after the fault: {m["error"]}')
            c.check(f'link {net.source_if if role == "source" else net.target_if} down for '
                    f'{BOUND_S} s (--link-down-timeout)' in m['error'],
                    f'{role}: failed for the link, the bound named')
            c.check(BOUND_S - 0.5 <= states[role][0] <= BOUND_S + 5,
                    f'{role}: failed at the bound, not before and not long after')
            d.wait_log(f'migration {key} role={role} failed: link', 5, since[d.name],
                       'the failure in the log')
        # The local side (QEMU's socket) sees the migration end: its connection is cut.
        sender.settimeout(10)
        try:
            for _ in range(64):
                sender.sendall(b'y' * (1 << 20))
            cut = False
        except OSError:
            cut = True
        c.check(cut, 'the source\'s local connection is cut')
        sender.close()
        ip(tns, 'link', 'set', net.target_if, 'up')
        c.check(time.monotonic() - t0 < LONG_DOWN_S + 15, 'all of it while the link was down '
                'or just after')
        for d, role in tb.sides():
            d.ctl_ok('source' if role == 'source' else 'target', 'stop', key)
        try:
            server.join(20)
        except vt.HarnessError:
            pass                           # the target's local side may never have been opened

        vt.log(f'a QEMU migration watched by the predictive policy, link down for {HOLD_S} s')
        hold = {'down': None, 'up': None, 'evidence': []}

        def on_poll(key, info, now):
            if hold['down'] is None and now >= HOLD_AT_S:
                hold['down'] = now
                hold['since'] = tb.source.log_offset()
                ip(tns, 'link', 'set', net.target_if, 'down')
            elif hold['down'] is not None and hold['up'] is None:
                if now >= hold['down'] + HOLD_S:
                    ip(tns, 'link', 'set', net.target_if, 'up')
                    hold['up'] = now
                elif now >= hold['down'] + 1.0:
                    c = tb.source.convergence(key)
                    hold['evidence'].append((now, c.get('evidence', ''),
                                             len(c.get('actions', []))))
        try:
            r = vt.converge.run_scenario(tb, vt.converge.SCENARIOS['service'], 'predictive',
                                         on_poll=on_poll, verify=False)
        finally:
            if hold['down'] is not None and hold['up'] is None:
                ip(tns, 'link', 'set', net.target_if, 'up')
        for t, ev, n in hold['evidence'][::4]:
            vt.log(f'  at {t:.1f} s: {n} actions, evidence: {ev}')
        acts = r['conv'].get('actions', [])
        vt.log(f'  QEMU: {r["status"]} after {r["total_s"]:.1f} s; actions '
               f'{[(a["action"], a["at_s"]) for a in acts]}')
        c.check(hold['evidence'] and all(ev.startswith('held for ') and 'is down' in ev and
                                         n == 0 for t, ev, n in hold['evidence']),
                'while the link was down: evidence "held for ...", no action')
        c.check(r['status'] == 'cancelled' and [a['action'] for a in acts] == ['abort'],
                'after it: the policy went on and aborted, as without the fault')
        c.check(acts and acts[0]['at_s'] > hold['up'] - 1,
                f'the abort came after the link was back ({acts and acts[0]["at_s"]} s, up at '
                f'{hold["up"]:.1f} s of the poller\'s clock)')
        tb.source.wait_log(r'convergence: held \(link .* down\)', 5, hold['since'],
                           'the hold in the log')
        tb.source.wait_log(r'convergence: goes on \(the link is up again\)', 5, hold['since'],
                           'its end in the log')
        tb.stop_daemons()
    c.finish()


if __name__ == '__main__':
    vt.run_main(main)
