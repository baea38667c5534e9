"""virt-launcher's own libvirt call through vmigd, for the tests: two throw-away libvirtds
(virt.Libvirtd) stand for the source and target virt-launcher pods, and a peer-to-peer
virDomainMigrateToURI3 (virsh migrate --p2p) is wired exactly as KubeVirt wires it
(kubevirt-dropin.md §1). Stdlib only.

Each libvirtd has its own mount namespace with private /run/libvirt and /var/lib/libvirt, so one
path names a different file in each "pod", as in two launchers:
- LAUNCHER_RUN (/run/libvirt/kv) stands for a launcher's /var/run/kubevirt: the source vmigd's
  sockets are in its migrationproxy/ on the source, the destination QEMU's and NBD server's on the
  target (libvirt's destination listens on the very paths the unix:// URIs name, in its own
  filesystem: qemuMigrationDstPrepareDirect takes a unix URI's path as its listen address, and
  the disks URI's path is the NBD server's socket);
- the disk image lies at the same path on both, so that libvirt's destination opens its own copy;
- vmigd reaches a launcher's files through /proc/PID/root/..., as virt-handler does.
Paths stay under 108 bytes with a 36-character key (a VMI UID), as KubeVirt's do."""

import glob
import hashlib
import os
import random
import re

from .base import HarnessError
from .migrate import differing_pages
from .virt import QEMU

LAUNCHER_RUN = '/run/libvirt/kv'            # a launcher's /var/run/kubevirt, in its namespace
LIBVIRT_SOCK = '/run/libvirt/libvirt-sock'  # virtqemud's socket in a launcher (here libvirtd's)
IMAGES = '/var/lib/libvirt/images'
RAM_DIR = '/var/lib/libvirt/qemu/ram'       # qemu.conf's default memory_backing_dir
LIBVIRT_PORT, MIGRATION_PORT, BLOCK_PORT = 0, 49152, 49153
KUBEVIRT_PORTS = (LIBVIRT_PORT, MIGRATION_PORT, BLOCK_PORT)


def proxy_key(key, port):
    """KubeVirt's ConstructProxyKey: KEY for logical port 0, KEY-PORT otherwise."""
    return key if port == LIBVIRT_PORT else f'{key}-{port}'


def proxy_socket(key, port):
    """A logical port's socket in a launcher's namespace: LAUNCHER_RUN/migrationproxy/
    <proxy key>-source.sock (SourceUnixFile), on both sides."""
    return f'{LAUNCHER_RUN}/migrationproxy/{proxy_key(key, port)}-source.sock'


class Launcher:
    """A libvirtd (started, a virt.Libvirtd) seen as a virt-launcher pod: paths in its namespace
    and the /proc/PID/root/... paths by which vmigd (and the test) reach them."""

    def __init__(self, libvirtd):
        self.lv = libvirtd

    @property
    def pid(self):
        if self.lv.proc is None or self.lv.proc.poll() is not None:
            raise HarnessError(f'libvirtd {self.lv.name} is not running')
        return self.lv.proc.pid        # unshare and sh exec libvirtd: the pid is libvirtd's

    def root(self, path):
        """/proc/PID/root + path: path in this launcher's namespace, from anywhere."""
        return f'/proc/{self.pid}/root{path}'

    def prepare_run_dir(self, target):
        """LAUNCHER_RUN exists, as in every launcher; the target launcher also makes its
        migrationproxy/ (live-migration-target.go), where its QEMU and NBD server listen."""
        os.makedirs(self.root(LAUNCHER_RUN), exist_ok=True)
        if target:
            os.makedirs(self.root(f'{LAUNCHER_RUN}/migrationproxy'), exist_ok=True)

    def target_sockets(self, key, ports=KUBEVIRT_PORTS):
        """`target start --socket` for a target launcher, as virt-handler's
        handleTargetMigrationProxy builds them: port 0 is virtqemud's socket, the others the
        sockets the destination QEMU and its NBD server will create in migrationproxy/."""
        return {port: self.root(LIBVIRT_SOCK if port == LIBVIRT_PORT else proxy_socket(key, port))
                for port in ports}

    def ram_file(self, dom):
        """The host path of dom's RAM (memory-backend-file under RAM_DIR, DOMAINDIR/pc.ram);
        HarnessError unless exactly one."""
        found = glob.glob(self.root(f'{RAM_DIR}/*-{dom}/pc.ram'))
        if len(found) != 1:
            raise HarnessError(f'{self.lv.name}: RAM file of {dom}: {found or "none"}')
        return found[0]

    def domain_pids(self):
        """The QEMUs of this libvirtd (its pid files) that still run."""
        return [pid for pid in self.lv.qemu_pids() if qemu_alive(pid)]


def qemu_alive(pid):
    """Whether pid is a QEMU that has not exited (not a zombie, not a reused pid)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            state = f.read().rpartition(')')[2].split()[0]
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            cmdline = f.read()
    except OSError:
        return False
    return state not in ('Z', 'X') and b'qemu-system' in cmdline


def domain_xml(name, kernel, cmdline, memory_mib, disk, serial):
    """A TCG q35 domain booting kernel (the test guest) with a raw virtio disk at disk, COM1 in
    the file serial (paths in the launcher's namespace), and its RAM in a shared file under
    RAM_DIR, so that a test can read a guest's memory from the host."""
    return f'''<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <memoryBacking>
    <source type='file'/>
    <access mode='shared'/>
  </memoryBacking>
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
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='{disk}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
    <serial type='file'><source path='{serial}'/><target port='0'/></serial>
  </devices>
</domain>
'''


def migrate_argv(src_uri, dom, key, parallel=0, storage='all', disks=('vda',), suspend=False,
                 extra=()):
    """virsh migrate as virt-launcher calls virDomainMigrateToURI3 (live-migration-source.go):
    VIR_MIGRATE_LIVE | PEER2PEER | PERSIST_DEST, the dconnuri through KEY-source.sock,
    VIR_MIGRATE_PARAM_URI unix://...KEY-49152-source.sock, VIR_MIGRATE_PARAM_DISKS_URI
    unix://...KEY-49153-source.sock with MIGRATE_DISKS, ParallelConnections with
    VIR_MIGRATE_PARALLEL when parallel > 0. storage 'all' is VIR_MIGRATE_NON_SHARED_DISK, 'inc'
    VIR_MIGRATE_NON_SHARED_INC (KubeVirt's block migration flag), None no disk copy.
    suspend: VIR_MIGRATE_PAUSED (the domain stays paused on the destination)."""
    argv = ['virsh', '-q', '-c', src_uri, 'migrate', '--live', '--p2p', '--persistent']
    if suspend:
        argv.append('--suspend')
    argv += ['--migrateuri', f'unix://{proxy_socket(key, MIGRATION_PORT)}']
    if storage:
        argv += [f'--copy-storage-{storage}', '--migrate-disks', ','.join(disks),
                 '--disks-uri', f'unix://{proxy_socket(key, BLOCK_PORT)}']
    if parallel:
        argv += ['--parallel', '--parallel-connections', str(parallel)]
    argv += [*extra, dom, f'qemu+unix:///system?socket={proxy_socket(key, LIBVIRT_PORT)}']
    return argv


def disk_pattern(seed, size):
    """size pseudo-random bytes from seed: a disk's known content."""
    return random.Random(seed).randbytes(size)


def hmp_write(lv, dom, byte, offset, length, device='virtio-disk0'):
    """Writes length bytes of byte at offset into dom's disk through QEMU's qemu-io (HMP, via
    virsh qemu-monitor-command: a query job, allowed during a migration) on the guest device's
    own BlockBackend, as a guest write would go: through the migration's mirror."""
    cmd = (f'qemu-io -d /machine/peripheral/{device}/virtio-backend '
           f'"write -P {byte:#x} {offset} {length}"')
    out = lv.virsh('qemu-monitor-command', '--hmp', dom, cmd).stdout.strip()
    if out:
        raise HarnessError(f'qemu-io on {dom}: {out}')


def job_info(lv, dom):
    """virsh domjobinfo as a dict ('Job type', 'Operation', 'Memory processed', ...)."""
    out = lv.virsh('domjobinfo', dom, check=False).stdout
    return {k.strip(): v.strip() for k, _, v in
            (line.partition(':') for line in out.splitlines() if ':' in line)}


def file_digest(path, ranges=None):
    """sha256 of a file (or of its byte ranges [(start, end)])."""
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for start, end in ranges or ((0, os.path.getsize(path)),):
            f.seek(start)
            while start < end:
                chunk = f.read(min(8 << 20, end - start))
                if not chunk:
                    break
                h.update(chunk)
                start += len(chunk)
    return h.hexdigest()


def first_difference(a, b, page=4096):
    """Offsets of the first few differing pages of two equally long files, and how many."""
    found, count = [], 0
    for offset in differing_pages(a, b, page):
        count += 1
        if len(found) < 8:
            found.append(hex(offset))
    return found, count


def domstate(lv, dom):
    """'running (unpaused)', 'shut off (migrated)'...; '' for an unknown domain."""
    proc = lv.virsh('domstate', '--reason', dom, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ''


def is_persistent(lv, dom):
    out = lv.virsh('dominfo', dom, check=False).stdout
    return bool(re.search(r'^Persistent:\s+yes', out, re.MULTILINE))


def remove_domain(lv, dom):
    """destroy (if it runs) and undefine dom on lv; quiet when it is not there."""
    state = domstate(lv, dom)
    if state and not state.startswith('shut off'):
        lv.virsh('destroy', dom, check=False)
    lv.virsh('undefine', dom, check=False)
