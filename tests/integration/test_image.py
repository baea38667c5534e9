#!/usr/bin/env python3
"""vmigd's container image: tools/build-image's OCI archive (build/vmigd-image.oci.tar, or
$VMIG_IMAGE) loaded into a private podman store (vfs, under the work directory) and two vmigd run
from it the way KubeVirt's sidecar runs it: root, privileged, the node's network (here each of
the Testbed's namespaces, `--network ns:/run/netns/NS`), the work directory bind-mounted at its
own path for the control socket, the TLS files and QEMU's sockets.
- The image's configuration: entrypoint, command, user and labels as contrib/image/Containerfile
  gives them, the version debian/changelog's; `podman run IMAGE --version` through the
  entrypoint.
- Both daemons are the image's: the executable of each container's vmigd (/proc/PID/exe, PID
  from podman inspect) has the sha256 of the archive's usr/sbin/vmigd, and its root is the
  container's, not ours; `podman exec NAME vmigctl status --json` (as the sidecar's probes run
  vmigctl) answers on the control socket.
- A running test guest migrated through them with mutual TLS, 2 multifd channels, then with
  multifd off: completed, memory equal, both daemons' connection digests the same; each
  container stops on SIGTERM to podman and exits 0.
podman runs with runc where Debian's runc is installed: crun 1.8 refuses a hybrid cgroup
hierarchy whose cgroup2 mount has a controller (this CI machine's: hugetlb on
/sys/fs/cgroup/unified). The containers get the host's open-file limit and 4096 processes:
without CAP_SYS_RESOURCE (not ours here) podman's defaults (1048576) cannot be set. Skips (77)
without podman, or without the archive (tools/build-image makes it: .ci/run does, once per run,
before the tests). About 20 s, the image's load included."""

import gzip
import hashlib
import io
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB, CHANNELS = 128, 2
GUEST = vt.GuestSpec(64, 8, report_ms=200, fill=True)
VMIGD_IN_IMAGE = '/usr/sbin/vmigd'


def changelog_version():
    with open(os.path.join(vt.REPO_ROOT, 'debian', 'changelog')) as f:
        return re.match(r'\S+ \(([^)]+)\)', f.readline()).group(1)


class Archive:
    """The OCI archive, read with tarfile: its image name, configuration and the sha256 of its
    usr/sbin/vmigd."""

    def __init__(self, path):
        self.path = path
        with tarfile.open(path) as t:
            members = {m.name.lstrip('./'): m for m in t}

            def read(name):
                return t.extractfile(members[name]).read()

            def blob(digest):
                return read('blobs/' + digest.replace(':', '/'))
            index = json.loads(read('index.json'))
            desc = index['manifests'][0]
            self.name = desc['annotations']['org.opencontainers.image.ref.name']
            manifest = json.loads(blob(desc['digest']))
            self.config = json.loads(blob(manifest['config']['digest']))
            self.vmigd_sha256 = None
            for layer in manifest['layers']:
                data = blob(layer['digest'])
                if data[:2] == b'\x1f\x8b':          # gzip; `podman save` writes plain tar
                    data = gzip.decompress(data)
                with tarfile.open(fileobj=io.BytesIO(data)) as lt:
                    for member in lt:
                        if member.name.lstrip('./') == VMIGD_IN_IMAGE.lstrip('/'):
                            data = lt.extractfile(member).read()
                            self.vmigd_sha256 = hashlib.sha256(data).hexdigest()


def containerfile_config():
    """ENTRYPOINT, CMD, USER and LABEL keys of contrib/image/Containerfile's final stage."""
    path = os.path.join(vt.REPO_ROOT, 'contrib', 'image', 'Containerfile')
    with open(path) as f:
        text = f.read().replace('\\\n', ' ')
    final = text[text.rindex('\nFROM '):]
    out = {'labels': re.findall(r'(org\.opencontainers\.image\.[a-z.]+)=', final)}
    for key in ('ENTRYPOINT', 'CMD'):
        out[key] = json.loads(re.search(rf'^{key} (.*)$', final, re.M).group(1))
    out['USER'] = re.search(r'^USER (.*)$', final, re.M).group(1).strip()
    return out


class Podman:
    """podman with a private store under DIR (vfs: no mounts left behind)."""

    def __init__(self, directory):
        self.dir = directory
        self.base = ['podman', '--root', os.path.join(directory, 'root'),
                     '--runroot', os.path.join(directory, 'run'),
                     '--tmpdir', os.path.join(directory, 'tmp'), '--storage-driver', 'vfs',
                     '--cgroup-manager', 'cgroupfs', '--events-backend', 'file']
        if shutil.which('runc'):
            self.base += ['--runtime', shutil.which('runc')]
        nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1 << 20)
        self.limits = ['--ulimit', f'nofile={nofile}:{nofile}', '--ulimit', 'nproc=4096:4096']
        self.names = []

    def run(self, *args, timeout=120, check=True):
        proc = subprocess.run([*self.base, *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise vt.HarnessError(f'podman {" ".join(args[:3])}: exited {proc.returncode}: '
                                  f'{proc.stderr.strip()[-600:]}')
        return proc

    def wrapper(self, image):
        """The Testbed's daemon_wrapper: vmigd from the image, in side's namespace."""
        def wrap(tb, side, name):
            cname = f'{name}-{os.getpid()}'
            self.names.append(cname)
            return [*self.base, 'run', '--rm', '--name', cname, '--privileged', *self.limits,
                    '--network', f'ns:/run/netns/{tb.net.ns(side)}',
                    '--volume', f'{tb.workdir}:{tb.workdir}', '--entrypoint=', image]
        return wrap

    def close(self):
        for name in self.names:
            self.run('rm', '--force', '--time', '5', name, check=False, timeout=60)
        self.run('rmi', '--all', '--force', check=False, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


def check_config(ck, archive, podman, image):
    cfg, want = archive.config.get('config', {}), containerfile_config()
    version = changelog_version()
    ck.check(archive.name.split('/')[-1] == f'vmigd:{version}',
             f'the archive names its image {archive.name}, expected vmigd:{version}')
    ck.check(cfg.get('Entrypoint') == want['ENTRYPOINT'] and cfg.get('Cmd') == want['CMD'],
             f'entrypoint {cfg.get("Entrypoint")} and command {cfg.get("Cmd")}, the '
             f'Containerfile says {want["ENTRYPOINT"]} and {want["CMD"]}')
    ck.check(cfg.get('User') == want['USER'], f'user {cfg.get("User")!r}, expected {want["USER"]}')
    labels = cfg.get('Labels') or {}
    missing = [k for k in want['labels'] if k not in labels]
    ck.check(not missing, f'labels missing from the image: {missing}')
    ck.check(labels.get('org.opencontainers.image.version') == version and
             labels.get('org.opencontainers.image.licenses') == 'Apache-2.0',
             f'labels {labels}')
    out = podman.run('run', '--rm', *podman.limits, '--network', 'none', image, '--version')
    ck.check(out.stdout.strip() == f'vmigd {version}',
             f'`podman run {image} --version` says {out.stdout.strip()!r}')
    return f'image {image}: entrypoint {cfg.get("Entrypoint")} {cfg.get("Cmd")}, ' \
           f'{len(labels)} labels, {out.stdout.strip()}'


def check_daemons(ck, tb, podman, archive):
    lines = []
    for d, side in tb.sides():
        cname = next(n for n in podman.names if n.startswith(d.name + '-'))
        pid = int(podman.run('inspect', '--format', '{{.State.Pid}}', cname).stdout)
        with open(f'/proc/{pid}/exe', 'rb') as f:
            exe_sha = hashlib.sha256(f.read()).hexdigest()
        ck.check(exe_sha == archive.vmigd_sha256,
                 f'{d.name}: /proc/{pid}/exe has sha256 {exe_sha[:16]}, the image\'s '
                 f'{VMIGD_IN_IMAGE} {str(archive.vmigd_sha256)[:16]}')
        ck.check(os.stat(f'/proc/{pid}/root').st_ino != os.stat('/').st_ino or
                 os.stat(f'/proc/{pid}/root').st_dev != os.stat('/').st_dev,
                 f'{d.name}: vmigd (pid {pid}) runs in our root filesystem')
        ck.check(os.readlink(f'/proc/{pid}/exe').endswith(VMIGD_IN_IMAGE),
                 f'{d.name}: /proc/{pid}/exe is {os.readlink(f"/proc/{pid}/exe")}')
        probe = podman.run('exec', cname, 'vmigctl', '-c', d.control, 'status', '--json',
                           check=False)
        ck.check(probe.returncode == 0 and json.loads(probe.stdout or '{}').get('pid'),
                 f'{d.name}: the image\'s vmigctl status: {probe.returncode} '
                 f'{probe.stderr.strip()[:200]}')
        lines.append(f'{d.name}: pid {pid} runs the image\'s vmigd (sha256 {exe_sha[:12]}), '
                     'its vmigctl answers')
    return lines


def migrate(tb, channels):
    src, dst = tb.qemu_pair(MIB, guest=GUEST)
    src.start_guest()
    m = tb.start_migration(src, dst, tb.new_key(f'image-mfd{channels}'), channels)
    result, digest = m.finish_verified(timeout=120)
    tb.close_qemus(src, dst)
    return f'{result.summary()}, memory {digest[:12]}'


def main():
    path = os.environ.get('VMIG_IMAGE') or os.path.join(vt.REPO_ROOT, 'build',
                                                        'vmigd-image.oci.tar')
    if not shutil.which('podman'):
        raise vt.Skip('podman not installed (apt-get install podman runc)')
    if not os.path.exists(path):
        raise vt.Skip(f'{path} not built (tools/build-image, as root)')
    if os.geteuid() != 0:
        raise vt.Skip('needs root (network namespaces, privileged containers)')
    ck = vt.Checks('image checks')
    archive = Archive(path)
    podman = Podman(tempfile.mkdtemp(prefix='vmig-image-', dir='/tmp'))
    try:
        podman.run('load', '--input', path, timeout=300)
        image = archive.name if '/' in archive.name else f'localhost/{archive.name}'
        vt.log(check_config(ck, archive, podman, image))
        vmigctl = vt.find_binaries()[1]
        with vt.Testbed(vmigd=VMIGD_IN_IMAGE, vmigctl=vmigctl, tls=True,
                        daemon_wrapper=podman.wrapper(image)) as tb:
            vt.log(f'{tb.describe()}, both vmigd in containers of {image}')
            for line in check_daemons(ck, tb, podman, archive):
                vt.log(line)
            for channels in (CHANNELS, 0):
                vt.log(f'multifd {channels or "off"}, TLS: {migrate(tb, channels)}')
            tb.stop_daemons()
            vt.log('both containers exited 0 on SIGTERM')
    finally:
        podman.close()
    ck.finish()


if __name__ == '__main__':
    vt.run_main(main)
