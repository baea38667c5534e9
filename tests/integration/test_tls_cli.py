#!/usr/bin/env python3
"""Integration test of vmigd's TLS configuration on loopback, no QEMU: without certificates (and
without --no-tls) the daemon refuses to start with one line, as it does with a half or broken
configuration; with a good one it logs generation 1 and status shows the certificate and the
allow-list; files are checked as sshd checks them (a FIFO as the CA, a key others can read, a
certificate others can write: refused at start with one line; a FIFO at reload: refused, the old
generation kept, SIGTERM still acted on); raw TLS clients show what the allow-list admits (the default, one name, "*"); a source
with its own client pair relays bytes to a target; with --no-tls it warns."""

import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

REFUSED = r'node hop from \S+: TLS refused \(({})\)'


def one_line_refusal(problems, what, proc, needle=None):
    lines = proc.stderr.strip().splitlines()
    if proc.returncode != 1 or len(lines) != 1 or (needle and needle not in lines[0]):
        problems.append(f'{what}: rc={proc.returncode} stderr={proc.stderr!r}, expected rc 1 and '
                        f'one line' + (f' naming {needle}' if needle else ''))
    else:
        vt.log(f'  {what}: refused: {lines[0]}')


def start_refusals(vmigd, ctl, pki, tmp, problems):
    garbage = os.path.join(tmp, 'garbage.key')
    with open(garbage, 'w') as f:
        f.write('-----BEGIN PRIVATE KEY-----\nnot a key at all\n-----END PRIVATE KEY-----\n')
    os.chmod(garbage, 0o600)
    base = ['--control', ctl, '--listen', '127.0.0.1:0']

    def run(*args):
        return vt.run_vmigd(vmigd, *base, *args)
    one_line_refusal(problems, 'no TLS options and no --no-tls', run(), '--tls-cert')
    one_line_refusal(problems, '--tls-cert alone', run('--tls-cert', pki.node.cert), '--tls-')
    one_line_refusal(problems, 'certificate and a key that does not match it',
                     run('--tls-cert', pki.node.cert, '--tls-key', pki.node2.key,
                         '--tls-ca', pki.ca))
    missing = os.path.join(tmp, 'no-such-ca.crt')
    one_line_refusal(problems, 'CA file missing',
                     run('--tls-cert', pki.node.cert, '--tls-key', pki.node.key,
                         '--tls-ca', missing), missing)
    one_line_refusal(problems, 'garbage key file',
                     run('--tls-cert', pki.node.cert, '--tls-key', garbage, '--tls-ca', pki.ca))
    one_line_refusal(problems, '--tls-client-cert without --tls-client-key',
                     run('--tls-cert', pki.node.cert, '--tls-key', pki.node.key,
                         '--tls-ca', pki.ca, '--tls-client-cert', pki.node2.cert))
    # Files checked as sshd checks them. A FIFO must not wedge start-up: refused at once.
    fifo = os.path.join(tmp, 'fifo-ca.crt')
    os.mkfifo(fifo, 0o600)
    try:
        one_line_refusal(problems, 'a FIFO as the CA',
                         vt.run_vmigd(vmigd, *base, '--tls-cert', pki.node.cert, '--tls-key',
                                      pki.node.key, '--tls-ca', fifo, timeout=5),
                         f'CA {fifo} is a FIFO')
    except subprocess.TimeoutExpired:
        problems.append('a FIFO as the CA: vmigd still starting after 5 s (blocked on the FIFO?)')
    world_key = os.path.join(tmp, 'world.key')
    shutil.copy(pki.node.key, world_key)
    os.chmod(world_key, 0o644)
    one_line_refusal(problems, 'a key others can read (0644)',
                     run('--tls-cert', pki.node.cert, '--tls-key', world_key, '--tls-ca', pki.ca),
                     f'{world_key} is readable by its group and others (mode 0644)')
    open_cert = os.path.join(tmp, 'open.crt')
    shutil.copy(pki.node.cert, open_cert)
    os.chmod(open_cert, 0o666)
    one_line_refusal(problems, 'a certificate others can write (0666)',
                     run('--tls-cert', open_cert, '--tls-key', pki.node.key, '--tls-ca', pki.ca),
                     f'{open_cert} is writable by its group and others (mode 0666)')
    p = run('--tls-cert', pki.node.cert, '--tls-key', pki.node.key, '--tls-ca', pki.ca, '-n')
    if p.returncode != 0:
        problems.append(f'-n with a good TLS configuration: rc={p.returncode} {p.stderr!r}')


def check_status(d, pki, allow, problems):
    tls = d.status_field('tls')
    want = {'enabled': True, 'generation': 1, 'allow': allow}
    if not isinstance(tls, dict):
        problems.append(f'{d.name}: status "tls" is {tls!r}, expected an object')
        return
    for name, value in want.items():
        if tls.get(name) != value:
            problems.append(f'{d.name}: status tls.{name} = {tls.get(name)!r}, expected {value!r}')
    cert = str(tls.get('certificate', ''))
    if not vt.shows_serial(cert, pki.node.serial):
        problems.append(f'{d.name}: status tls.certificate {cert!r} does not show serial '
                        f'{pki.node.serial}')
    if not isinstance(tls.get('ktls_kernel'), bool):
        problems.append(f'{d.name}: status tls.ktls_kernel = {tls.get("ktls_kernel")!r}, '
                        'expected a boolean')


def expect(d, pki, name, certfiles, accepted, token, problems):
    """A raw TLS client with certfiles (None: no certificate) against d: accepted or refused with
    token in the log."""
    addr, port = d.node_hop()
    since = d.log_offset()
    cert, key = (certfiles.cert, certfiles.key) if certfiles else (None, None)
    ok, probe = vt.probe_tls_accepted(None, addr, port, cert, key, pki.ca)
    where = f'{d.name} {name}'
    if accepted:
        if not ok:
            problems.append(f'{where}: expected accepted (unknown-key reply), got {probe}')
        refusals = d.log_matches(REFUSED.format(r'[\w-]+'), since)
        if refusals:
            problems.append(f'{where}: accepted but logged {refusals[0].group(0)}')
    else:
        if ok or not probe.refused:
            problems.append(f'{where}: expected refused ({token}), got {probe}')
        try:
            d.wait_log(REFUSED.format(token), timeout=5, since=since)
        except vt.HarnessError as e:
            problems.append(f'{where}: {e}')
    vt.log(f'  {where}: {"accepted" if ok else "refused"}: {probe}')


def fifo_reload(vmigd, vmigctl, pki, tmp, problems):
    """The CA replaced by a FIFO, then SIGHUP: the reload is refused with a line naming the FIFO,
    generation 1 stays and still admits a peer, and SIGTERM still stops the daemon at once."""
    files = vt.install_tls(os.path.join(tmp, 'fifo-reload'), pki.node, pki.ca)
    d = vt.Daemon(vmigd, vmigctl, 'vmigd-fifo-reload', tmp, '127.0.0.1', tls=files)
    try:
        d.start()
        d.wait_log(r'TLS: generation 1: ', timeout=5)
        since = d.log_offset()
        fifo = files['ca'] + '.fifo'
        os.mkfifo(fifo, 0o600)
        os.rename(fifo, files['ca'])
        d.sighup()
        m = d.wait_log(r'TLS: reload refused, keeping generation 1: CA \S+ is a FIFO, not a '
                       r'regular file', timeout=5, since=since)
        vt.log(f'  FIFO at reload: {m.group(0)}')
        tls = d.status_field('tls')
        if not isinstance(tls, dict) or tls.get('generation') != 1:
            problems.append(f'FIFO at reload: status tls {tls!r}, expected generation 1')
        expect(d, pki, 'node after the refused reload', pki.node, True, None, problems)
        started = time.monotonic()
        rc = d.stop(timeout=5)
        took = time.monotonic() - started
        if rc != 0 or took > 4:
            problems.append(f'FIFO at reload: SIGTERM: exit {rc} after {took:.1f}s, expected 0 '
                            'at once')
    except vt.HarnessError as e:
        problems.append(f'FIFO at reload: {e}')
    finally:
        d.stop(timeout=5)


def client_pair_relay(vmigd, vmigctl, pki, tmp, problems):
    """A source with its own client pair (--tls-client-cert, CN kubevirt.io:system:client:migration,
    clientAuth only) relays bytes both ways to a target on loopback: the target's linked line
    names the client certificate, the source's the target's node certificate."""
    target = vt.Daemon(vmigd, vmigctl, 'vmigd-pair-target', tmp, '127.0.0.1', tls=pki)
    # Not root: the source's sockets stay the daemon's (no chown to KubeVirt's qemu).
    owner = () if os.geteuid() == 0 else ('--socket-owner', '-1')
    source = vt.Daemon(vmigd, vmigctl, 'vmigd-pair-source', tmp, '127.0.0.1', extra_args=owner,
                       tls={**pki.paths('node'), 'client_cert': pki.client.cert,
                            'client_key': pki.client.key})
    dst_path = os.path.join(tmp, 'dst.sock')
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    key = 'pair'
    try:
        listener.bind(dst_path)
        listener.listen(4)
        listener.settimeout(10)
        target.start()
        source.start()
        raw, _ = target.target_start(key, {vt.DEFAULT_PORT_ID: dst_path})
        basedir = os.path.join(tmp, 'src')
        os.makedirs(basedir, exist_ok=True)
        path = source.source_start(key, raw, basedir)[0]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect(path)
            client.sendall(b'ping over TLS')
            far, _ = listener.accept()
            with far:
                far.settimeout(10)
                got = far.recv(100)
                far.sendall(b'pong')
                back = client.recv(100)
        if got != b'ping over TLS' or back != b'pong':
            problems.append(f'client pair: relayed {got!r} / {back!r}, expected ping / pong')
        t = vt.wait_until(lambda: target.linked(key, 'target'), 5, 'the target\'s linked line')[0]
        s = vt.wait_until(lambda: source.linked(key, 'source'), 5, 'the source\'s linked line')[0]
        if vt.CLIENT_CN not in t.get('peer', '') or not t.get('tls', '').startswith('TLSv1.'):
            problems.append(f'client pair: target linked line {t["line"]!r}, expected TLS and '
                            f'peer {vt.CLIENT_CN}')
        if vt.NODE_CN not in s.get('peer', ''):
            problems.append(f'client pair: source linked line {s["line"]!r}, expected peer '
                            f'{vt.NODE_CN}')
        vt.log(f'  client pair: relayed both ways; target sees peer="{t.get("peer")}", source '
               f'sees peer="{s.get("peer")}"')
        source.source_stop(key)
        target.target_stop(key)
    except (vt.HarnessError, OSError) as e:
        problems.append(f'client pair: {e}')
    finally:
        listener.close()
        source.stop()
        target.stop()


def main():
    vmigd, vmigctl = vt.find_binaries()
    problems = []
    with vt.work_directory('vmig-tlscli-') as tmp:
        started = time.monotonic()
        pki = vt.make_pki(os.path.join(tmp, 'pki'))
        vt.log(f'PKI made in {time.monotonic() - started:.2f}s')
        start_refusals(vmigd, os.path.join(tmp, 'refused.ctl'), pki, tmp, problems)

        cases = [
            ('default allow-list', [], vt.DEFAULT_TLS_ALLOW,
             [('node', pki.node, True, None), ('node2', pki.node2, True, None),
              ('badname', pki.badname, False, 'name-not-allowed'),
              ('rogue (other CA)', pki.rogue, False, 'untrusted-ca'),
              ('expired', pki.expired, False, 'expired'),
              ('not yet valid', pki.not_yet_valid, False, 'not-yet-valid'),
              ('serverAuth only', pki.serveronly, False, 'bad-purpose'),
              ('no client certificate', None, False, 'no-certificate')]),
            ('--tls-allow somebody-else', ['--tls-allow', 'kubevirt.io:system:node:somebody-else'],
             ['kubevirt.io:system:node:somebody-else'],
             [('node', pki.node, False, 'name-not-allowed'), ('badname', pki.badname, True, None)]),
            ('--tls-allow two names',
             ['--tls-allow', 'kubevirt.io:system:node:somebody-else,' + vt.NODE_CN],
             ['kubevirt.io:system:node:somebody-else', vt.NODE_CN],
             [('node', pki.node, True, None), ('badname', pki.badname, True, None)]),
            ('--tls-allow *', ['--tls-allow', '*'], ['*'],
             [('badname', pki.badname, True, None),
              ('rogue (other CA)', pki.rogue, False, 'untrusted-ca')]),
        ]
        for n, (label, args, allow, probes) in enumerate(cases, 1):
            vt.log(f'daemon {n}: {label}')
            d = vt.Daemon(vmigd, vmigctl, f'vmigd-{n}', tmp, '127.0.0.1', extra_args=args,
                          tls=pki)
            try:
                d.start()
                m = d.wait_log(r'TLS: generation 1: certificate "([^"]*)" serial ([0-9A-Fa-f:]+)',
                               timeout=5)
                if vt.normalize_serial(m.group(2)) != pki.node.serial:
                    problems.append(f'{d.name}: generation 1 line shows serial {m.group(2)}, '
                                    f'expected {pki.node.serial}')
                if vt.NODE_CN not in m.group(1):
                    problems.append(f'{d.name}: generation 1 line shows subject {m.group(1)!r}')
                check_status(d, pki, allow, problems)
                for name, certfiles, accepted, token in probes:
                    expect(d, pki, name, certfiles, accepted, token, problems)
                if not d.alive():
                    problems.append(f'{d.name}: exited during the probes')
                rc = d.stop()
                if rc != 0:
                    problems.append(f'{d.name}: exited {rc} after SIGTERM')
            except vt.HarnessError as e:
                problems.append(f'{d.name}: {e}')
            finally:
                d.stop()

        vt.log('a FIFO as the CA at reload')
        fifo_reload(vmigd, vmigctl, pki, tmp, problems)

        vt.log('a source with its own client pair')
        client_pair_relay(vmigd, vmigctl, pki, tmp, problems)

        d = vt.Daemon(vmigd, vmigctl, 'vmigd-plain', tmp, '127.0.0.1')
        try:
            d.start()
            if not d.log_matches(r'(?i)warn.*(--no-tls|plain text)'):
                problems.append('--no-tls: no warning about plain text in the log')
            tls = d.status_field('tls')
            if not (tls is False or (isinstance(tls, dict) and tls.get('enabled') is False)):
                problems.append(f'--no-tls: status "tls" is {tls!r}, expected false or '
                                '{"enabled": false, ...}')
        finally:
            d.stop()
        if problems:
            for path in sorted(os.listdir(tmp)):
                if path.endswith('.log'):
                    vt.log(f'--- {path}\n{vt.tail(os.path.join(tmp, path), 30)}')
    if problems:
        raise vt.HarnessError(f'{len(problems)} problem(s):\n  ' + '\n  '.join(problems))


if __name__ == '__main__':
    vt.run_main(main)
