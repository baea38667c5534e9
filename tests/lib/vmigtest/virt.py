"""Throw-away libvirt daemons for tests: each libvirtd runs in a private mount namespace with its
own /run/libvirt, /etc/libvirt, /var/lib/libvirt, /var/log/libvirt and /var/cache/libvirt (temp
directories bind-mounted over them), its own host UUID and a qemu.conf that runs QEMU as root
with no security driver, no cgroups, no namespaces and no virtlogd (stdio_handler = "file").
Its unix socket lies in the test's directory, reachable from outside the namespace as
qemu+unix:///system?socket=DIR/run/libvirt-sock. Also: a small TCG domain's XML and a fallback
guest payload (a multiboot image that dirties a working set as fast as it can). Stdlib only."""

import os
import shutil
import signal
import struct
import subprocess
import time
import uuid

from .base import HarnessError, Skip, stop_process, tail

LIBVIRTD = '/usr/sbin/libvirtd'
QEMU = shutil.which('qemu-system-x86_64') or '/usr/bin/qemu-system-x86_64'
# Debian's QEMU driver resolves its built-in user before it reads qemu.conf.
QEMU_USER = 'libvirt-qemu'
PRIVATE_DIRS = {'run': '/run/libvirt', 'etc': '/etc/libvirt', 'lib': '/var/lib/libvirt',
                'log': '/var/log/libvirt', 'cache': '/var/cache/libvirt'}

LIBVIRTD_CONF = '''\
unix_sock_group = "root"
unix_sock_rw_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
host_uuid = "{uuid}"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
'''

QEMU_CONF = '''\
user = "root"
group = "root"
security_driver = "none"
dynamic_ownership = 0
namespaces = []
cgroup_controllers = []
stdio_handler = "file"
'''

START_SH = '''\
set -e
for p in {mounts}; do
	mkdir -p "${{p#*:}}"
	mount --bind "${{p%%:*}}" "${{p#*:}}"
done
mount --bind "{dir}/passwd" /etc/passwd
mount --bind "{dir}/group" /etc/group
exec {libvirtd} -f /etc/libvirt/libvirtd.conf -p /run/libvirt/libvirtd.pid
'''


def check_possible():
    """Skip unless root, libvirtd, virsh, unshare and QEMU are here."""
    if os.geteuid() != 0:
        raise Skip('needs root (private mount namespaces for libvirtd)')
    for path, pkg in ((LIBVIRTD, 'libvirt-daemon'), (QEMU, 'qemu-system-x86'),
                      (shutil.which('virsh') or '/usr/bin/virsh', 'libvirt-clients'),
                      (shutil.which('unshare') or '/usr/bin/unshare', 'util-linux')):
        if not os.access(path, os.X_OK):
            raise Skip(f'{path} missing (apt-get install {pkg}, or run tools/setup)')
    if not os.path.exists('/usr/lib/x86_64-linux-gnu/libvirt/connection-driver/'
                          'libvirt_driver_qemu.so'):
        raise Skip('libvirt QEMU driver missing (apt-get install libvirt-daemon-driver-qemu)')
    probe = subprocess.run(['unshare', '-m', '--propagation', 'private', 'true'],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise Skip(f'cannot make a mount namespace: {probe.stderr.strip()}')


class Libvirtd:
    """One libvirtd in its own mount namespace under directory; a context manager."""

    def __init__(self, directory, name, cache_dir=None):
        """cache_dir: a /var/cache/libvirt to share (QEMU capabilities, which a fresh libvirtd
        takes seconds to probe); libvirt checks each entry against the binaries itself."""
        self.dir = os.path.abspath(directory)
        self.cache_dir = os.path.abspath(cache_dir) if cache_dir else None
        self.name = name
        self.host_uuid = str(uuid.uuid4())
        self.proc = None
        self.sock = os.path.join(self.dir, 'run', 'libvirt-sock')
        self.uri = f'qemu+unix:///system?socket={self.sock}'
        self.log_path = os.path.join(self.dir, 'log', 'libvirtd.log')

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self, timeout=30):
        mounts = []
        for sub, target in PRIVATE_DIRS.items():
            source = os.path.join(self.dir, sub)
            if sub == 'cache' and self.cache_dir:
                source = self.cache_dir
            os.makedirs(source, exist_ok=True)
            mounts.append(f'{source}:{target}')
        with open(os.path.join(self.dir, 'etc', 'libvirtd.conf'), 'w') as f:
            f.write(LIBVIRTD_CONF.format(uuid=self.host_uuid))
        with open(os.path.join(self.dir, 'etc', 'qemu.conf'), 'w') as f:
            f.write(QEMU_CONF)
        self._private_accounts()
        script = os.path.join(self.dir, 'start.sh')
        with open(script, 'w') as f:
            f.write(START_SH.format(dir=self.dir, libvirtd=LIBVIRTD, mounts=' '.join(mounts)))
        self.out = open(os.path.join(self.dir, 'libvirtd.out'), 'w')
        self.proc = subprocess.Popen(['unshare', '-m', '--propagation', 'private', 'sh', script],
                                     stdout=self.out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise HarnessError(f'libvirtd {self.name} exited {self.proc.returncode}:\n'
                                   f'{tail(self.out.name)}{tail(self.log_path)}')
            if os.path.exists(self.sock) and self.virsh('version', check=False).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise HarnessError(f'libvirtd {self.name} not up after {timeout} s:\n'
                                   f'{tail(self.log_path)}')
            time.sleep(0.1)

    def _private_accounts(self):
        """/etc/passwd and /etc/group for the namespace, with the user the driver insists on."""
        for name, line in (('passwd', f'{QEMU_USER}:x:64055:64055::/var/lib/libvirt:/bin/false'),
                           ('group', f'{QEMU_USER}:x:64055:')):
            with open(f'/etc/{name}') as f:
                text = f.read()
            if not any(row.split(':')[0] == QEMU_USER for row in text.splitlines()):
                text = text.rstrip('\n') + '\n' + line + '\n'
            with open(os.path.join(self.dir, name), 'w') as f:
                f.write(text)

    def virsh(self, *args, check=True, timeout=60):
        """virsh -c URI ARGS; HarnessError on failure when check."""
        proc = subprocess.run(['virsh', '-q', '-c', self.uri, *args], capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise HarnessError(f'virsh {" ".join(args)} ({self.name}) exited '
                               f'{proc.returncode}: {proc.stderr.strip()}')
        return proc

    def domstate(self, dom):
        """'running (booted)', 'paused (user)', 'shut off (migrated)'..."""
        return self.virsh('domstate', '--reason', dom).stdout.strip()

    def qemu_pids(self):
        pids = []
        qdir = os.path.join(self.dir, 'run', 'qemu')
        for name in os.listdir(qdir) if os.path.isdir(qdir) else []:
            if name.endswith('.pid'):
                try:
                    with open(os.path.join(qdir, name)) as f:
                        pids.append(int(f.read().strip()))
                except (OSError, ValueError):
                    pass
        return pids

    def stop(self):
        """Destroy its domains, stop libvirtd; QEMU outlives libvirtd, so kill what is left."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            listing = self.virsh('list', '--name', check=False, timeout=20)
            for dom in listing.stdout.split():
                self.virsh('destroy', dom, check=False, timeout=20)
        pids = self.qemu_pids()
        stop_process(self.proc)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.out.close()
        self.proc = None


def domain_xml(name, kernel, cmdline='', memory_mib=256, serial_log=None):
    """A TCG q35 domain that boots kernel (multiboot) with no disks and no network."""
    serial = (f"<serial type='file'><source path='{serial_log}'/><target port='0'/></serial>"
              if serial_log else '')
    return f'''<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{kernel}</kernel>
    <cmdline>{cmdline}</cmdline>
  </os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>{QEMU}</emulator>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
    {serial}
  </devices>
</domain>
'''


def dirtier_image(path, ws_mib=64, start_mib=4):
    """Writes a multiboot (a.out kludge) image loaded at 1 MiB that writes a counter into every
    page of [start_mib, start_mib + ws_mib) MiB, over and over, as fast as TCG runs it: every page
    of the working set is dirty at every sync, so a migration capped below its size never
    converges until the guest is stopped. For when the project's test guest is not built."""
    load = 0x100000
    end = (start_mib + ws_mib) << 20
    code = bytes([0xFA,                                   # cli
                  0x31, 0xC0,                             # xor eax, eax
                  0xBF]) + struct.pack('<I', start_mib << 20) + bytes([  # outer: mov edi, start
                  0x89, 0x07,                             # inner: mov [edi], eax
                  0x81, 0xC7, 0x00, 0x10, 0x00, 0x00,     # add edi, 4096
                  0x81, 0xFF]) + struct.pack('<I', end) + bytes([  # cmp edi, end
                  0x72, 0xF0,                             # jb inner
                  0x40,                                   # inc eax
                  0xEB, 0xE8])                            # jmp outer
    magic, flags = 0x1BADB002, 0x00010000
    header = struct.pack('<8I', magic, flags, (-(magic + flags)) & 0xFFFFFFFF,
                         load, load, 0, 0, load + 32)
    with open(path, 'wb') as f:
        f.write(header + code)
    return path
