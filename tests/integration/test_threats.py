#!/usr/bin/env python3
"""A root vmigd against the users it serves: QEMU's user (uid 107, through `setpriv`) owns the
directories the daemon works in, and strangers reach its node-hop port. Real daemons, real
QEMU, loopback and a namespace pair. Each case failed before its fix:
- a link put where migrationproxy/ goes (to a root-only directory) makes `source start` fail
  with a clear error, and the directory keeps its owner and mode (it became uid 107's);
- the same below /proc/PID/root of a stand-in launcher (a chrooted process): a link to
  /proc/1/root/... is refused; a start through the launcher's own /var/run -> /run link works
  and its sockets land inside the launcher's root; a link that climbs out of that root stays
  inside it;
- a link from a target's destination socket to the daemon's own control socket: nothing is
  relayed into it (a control request sent as migration bytes got its answer back);
- 70 silent TLS connections from a stranger's address, reconnected as they are closed, while a
  real QEMU migration with a valid certificate starts and completes verified (every new
  connection was refused).
About 3 s (a 64 MiB guest with nothing written migrates in well under a second)."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

QEMU_UID = 107                  # the daemon's default --socket-owner, QEMU's user in KubeVirt
SILENT = 70                     # over --max-unauthenticated's default 64
LINK_REFUSED = 'a symbolic link is in the way'


def as_qemu(*cmd):
    """Run cmd as uid/gid 107 with no other groups."""
    r = subprocess.run(['setpriv', f'--reuid={QEMU_UID}', f'--regid={QEMU_UID}',
                        '--clear-groups', *cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise vt.HarnessError(f'as uid {QEMU_UID}: {" ".join(cmd)}: {r.stderr.strip()}')


def qemu_dir(path):
    """A directory uid 107 owns and may write, as a launcher's /var/run/kubevirt is."""
    os.makedirs(path, exist_ok=True)
    os.chown(path, QEMU_UID, QEMU_UID)
    os.chmod(path, 0o755)
    return path


def root_only(path):
    """A root directory with a root file in it: what the links aim at."""
    os.makedirs(path, mode=0o700)
    with open(os.path.join(path, 'secret'), 'w') as f:
        f.write('root only\n')
    os.chmod(os.path.join(path, 'secret'), 0o600)
    return path


def owner_mode(path):
    st = os.lstat(path)
    return st.st_uid, st.st_gid, st.st_mode & 0o7777


def target_json(d, key, path):
    raw, _ = d.target_start(key, {vt.DEFAULT_PORT_ID: path})
    return raw


def refused_start(d, key, base, what):
    """`source start` must fail naming the link; the error text."""
    target = target_json(d, key, os.path.join(os.path.dirname(d.control), 'dst', f'{key}.sock'))
    r = d.ctl('source', 'start', key, '--target', target, '--dir', base)
    out = (r.stdout + r.stderr).strip()
    if r.returncode == 0:
        raise vt.HarnessError(f'{what}: source start succeeded: {out}')
    if LINK_REFUSED not in out:
        raise vt.HarnessError(f'{what}: source start failed without naming the link: {out}')
    return out


def check_link_dir(d, work):
    """migrationproxy -> a root directory, planted by uid 107."""
    base = qemu_dir(os.path.join(work, 'launcher-run'))
    victim = root_only(os.path.join(work, 'root-only'))
    as_qemu('ln', '-s', victim, os.path.join(base, 'migrationproxy'))
    out = refused_start(d, 'link-dir', base, 'migrationproxy as a link')
    if owner_mode(victim) != (0, 0, 0o700):
        raise vt.HarnessError(f'{victim} is now {owner_mode(victim)} (was root:root 0700)')
    return f'refused: "{out}"; {victim} still root:root 0700'


class Launcher:
    """A stand-in virt-launcher: a process chrooted into root, with its /var/run -> /run link
    and a /var/run/kubevirt that uid 107 writes. /proc/PID/root is that root."""

    def __init__(self, root):
        self.root = root
        os.makedirs(os.path.join(root, 'var'))
        os.makedirs(os.path.join(root, 'run'))
        os.symlink('/run', os.path.join(root, 'var', 'run'))
        self.run_dir = qemu_dir(os.path.join(root, 'run', 'kubevirt'))
        self.proc = subprocess.Popen(
            [sys.executable, '-c', 'import os, sys, time\nos.chroot(sys.argv[1])\n'
             'os.chdir("/")\nprint("in", flush=True)\ntime.sleep(600)\n', root],
            stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != 'in':
            raise vt.HarnessError('the stand-in launcher did not start')

    def proc_path(self, *names):
        return os.path.join(f'/proc/{self.proc.pid}/root', *names)

    def close(self):
        vt.stop_process(self.proc)


def check_launcher(d, work):
    """The /proc/PID/root form of the same, and what must keep working there."""
    launcher = Launcher(os.path.join(work, 'launcher-root'))
    try:
        done = []
        base = launcher.proc_path('var', 'run', 'kubevirt')
        target = target_json(d, 'launcher', os.path.join(work, 'dst', 'launcher.sock'))
        socks = d.source_start('launcher', target, base)
        real = os.path.join(launcher.run_dir, 'migrationproxy', os.path.basename(socks[0]))
        if not socks[0].startswith(base + '/migrationproxy/') or not os.path.exists(real):
            raise vt.HarnessError(f'the source socket {socks[0]} is not at {real}')
        for path, want in ((os.path.dirname(real), (QEMU_UID, QEMU_UID, 0o750)),
                           (real, (QEMU_UID, QEMU_UID, 0o660))):
            if owner_mode(path) != want:
                raise vt.HarnessError(f'{path}: owner and mode {owner_mode(path)}, want {want}')
        d.source_stop('launcher')
        done.append('a start through the launcher\'s /var/run -> /run link works, socket '
                    '107:107 0660 inside its root')
        # A QEMU escape plants a link to the host through /proc.
        victim = root_only(os.path.join(work, 'host-only'))
        mp = os.path.join(launcher.run_dir, 'migrationproxy')
        as_qemu('rm', '-rf', mp)
        as_qemu('ln', '-s', f'/proc/1/root{victim}', mp)
        refused_start(d, 'launcher-host', base, 'migrationproxy -> /proc/1/root/...')
        if owner_mode(victim) != (0, 0, 0o700):
            raise vt.HarnessError(f'{victim} is now {owner_mode(victim)} (was root:root 0700)')
        done.append('migrationproxy -> /proc/1/root/HOSTDIR refused, HOSTDIR untouched')
        # A link that climbs out resolves inside the launcher's root, where nothing is.
        climb = '../' * (victim.count('/') + 4) + victim.lstrip('/')
        as_qemu('ln', '-s', climb, os.path.join(launcher.run_dir, 'up'))
        target = target_json(d, 'launcher-up', os.path.join(work, 'dst', 'launcher-up.sock'))
        r = d.ctl('source', 'start', 'launcher-up', '--target', target, '--dir',
                  launcher.proc_path('run', 'kubevirt', 'up'))
        out = (r.stdout + r.stderr).strip()
        if r.returncode == 0 or 'does not exist' not in out:
            raise vt.HarnessError(f'a link out of the launcher\'s root: exit {r.returncode}: '
                                  f'{out}')
        if os.path.exists(os.path.join(victim, 'migrationproxy')):
            raise vt.HarnessError(f'{victim}/migrationproxy was made on the host')
        done.append(f'a link climbing out stays inside: "{out}"')
        return '; '.join(done)
    finally:
        launcher.close()


def check_relay_into_control(work, vmigd, vmigctl):
    """The target's destination socket is a link to its own control socket."""
    src = vt.Daemon(vmigd, vmigctl, 'vmigd-src', work, '127.0.0.1').start()
    dst = vt.Daemon(vmigd, vmigctl, 'vmigd-dst', work, '127.0.0.1').start()
    try:
        qdir = qemu_dir(os.path.join(work, 'target-run'))
        dst_path = os.path.join(qdir, 'relay-49152-source.sock')
        target = target_json(dst, 'relay', dst_path)
        as_qemu('ln', '-s', dst.control, dst_path)
        sock = src.source_start('relay', target, qemu_dir(os.path.join(work, 'source-run')))[0]
        since = dst.log_offset()
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(sock)
            try:
                s.sendall(b'{"op":"list"}\n')
                got = vt.read_until_close(s, time.monotonic() + 5)
            except (BrokenPipeError, ConnectionResetError):
                got = b''                  # the source gave up on its refused hop first
        if got:
            raise vt.HarnessError(f'the control socket answered through the hop: {got[:200]!r}')
        m = dst.wait_log(rf'connect to {dst_path}: {LINK_REFUSED}', since=since, timeout=5)
        return f'nothing came back; the target logged "{m.group(0)}"'
    finally:
        src.stop()
        dst.stop()


class Strangers:
    """SILENT TCP connections to (addr, port) from sock_fn's sockets, each reconnected as soon
    as the daemon closes it, until stop()."""

    def __init__(self, sock_fn, addr, port):
        self.sock_fn, self.addr, self.port = sock_fn, addr, port
        self.closed = self.made = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _connect(self):
        s = self.sock_fn()
        s.settimeout(2)
        try:
            s.connect((self.addr, self.port))
        except OSError:
            s.close()
            self.closed += 1
            return None
        self.made += 1
        return s

    def _run(self):
        socks = [s for s in (self._connect() for _ in range(SILENT)) if s]
        while not self.done.is_set():
            for s in vt.peer_closed(socks, 0.05):
                socks.remove(s)
                s.close()
                self.closed += 1
            while len(socks) < SILENT and not self.done.is_set():
                s = self._connect()
                if s:
                    socks.append(s)
        for s in socks:
            s.close()

    def stop(self):
        self.done.set()
        self.thread.join(10)


def check_starvation():
    """A migration with a valid certificate while strangers hold silent connections."""
    with vt.Testbed(tls=True) as tb:
        addr, port = tb.target.node_hop()
        since = tb.target.log_offset()
        # From inside the target's namespace: an address that is not the source node's.
        strangers = Strangers(lambda: tb.net.socket('target'), addr, port)
        try:
            tb.target.wait_log(r'\(too-many-unauthenticated\)', since=since, timeout=10)
            src, dst = tb.qemu_pair(64)
            m = tb.start_migration(src, dst, tb.new_key('starved'), 2)
            result, _ = m.finish_verified(timeout=120)
        finally:
            strangers.stop()
        if strangers.made < SILENT:
            raise vt.HarnessError(f'only {strangers.made} stranger connections were made')
        return (f'{strangers.made} stranger connections made, {strangers.closed} closed by the '
                f'daemon; the migration completed verified in {result.seconds:.1f} s')


def main():
    if os.geteuid() != 0:
        raise vt.Skip('needs root: a root daemon, and setpriv to act as uid 107')
    if shutil.which('setpriv') is None:
        raise vt.Skip('setpriv (util-linux) is not installed')
    vmigd, vmigctl = vt.find_binaries()
    ck = vt.Checks('threat cases')
    with vt.work_directory('vmig-threats-', keep_on_error=True) as work:
        os.chmod(work, 0o755)
        d = vt.Daemon(vmigd, vmigctl, 'vmigd-links', work, '127.0.0.1').start()
        try:
            qemu_dir(os.path.join(work, 'dst'))
            ck.run('migrationproxy planted as a link', check_link_dir, d, work)
            ck.run('below /proc/PID/root', check_launcher, d, work)
        finally:
            d.stop()
        ck.run('a destination socket linked to the control socket', check_relay_into_control,
               work, vmigd, vmigctl)
    ck.run(f'{SILENT} silent strangers during a TLS migration', check_starvation)
    ck.finish()


if __name__ == '__main__':
    vt.run_main(main)
