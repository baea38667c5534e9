"""Harness for vmigd tests, the demo and the bench: network namespaces, vmigd daemons, QEMU guest
pairs driven over QMP, migrations through the daemons (or direct) and guest-memory comparison.
Stdlib only. Every wait has a deadline; every resource is released by the context managers."""

import atexit
import ctypes
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SKIP_EXIT = 77
DEFAULT_PORT_ID = 49152
DEFAULT_MAX_BANDWIDTH = 100 << 30          # bytes/s; QEMU's default of 128 MiB/s would cap us
VGA_BIOS_WINDOW = (0xA0000, 0x100000)      # differs between source and destination; not compared
CLONE_NEWNET = 0x40000000
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))


class Skip(Exception):
    """The test cannot run here (not root, no netns, binaries not built); exit status 77."""


class HarnessError(Exception):
    """A step of the test failed: a command, a wait, a check."""


class QMPError(HarnessError):
    """QEMU answered a QMP command with an error."""


class VmigctlError(HarnessError):
    """vmigctl exited non-zero; carries the completed process."""

    def __init__(self, proc):
        super().__init__(f'vmigctl {" ".join(proc.args[3:])} exited {proc.returncode}: '
                         f'{proc.stderr.strip()}')
        self.proc = proc


def log(msg):
    """Progress line on stdout (meson test captures it)."""
    print(msg, flush=True)


def wait_until(predicate, timeout, what, interval=0.05):
    """Poll predicate() until it returns a true value; return that. HarnessError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise HarnessError(f'timed out after {timeout:g}s waiting for {what}')
        time.sleep(interval)


def run_main(main):
    """Run a test's main(); exit 0 on success, 77 on Skip, 1 on any failure.
    SIGTERM (meson's timeout) becomes an exception so that every cleanup path runs."""
    def on_term(signum, frame):
        raise HarnessError(f'killed by signal {signum}')
    signal.signal(signal.SIGTERM, on_term)
    try:
        main()
    except Skip as e:
        print(f'SKIP: {e}', flush=True)
        sys.exit(SKIP_EXIT)
    except Exception as e:                 # noqa: BLE001 -- report any failure the same way
        print(f'FAIL: {type(e).__name__}: {e}', flush=True)
        sys.exit(1)
    print('PASS', flush=True)
    sys.exit(0)


def find_binaries(build_dir=None):
    """(vmigd, vmigctl): from $VMIGD/$VMIGCTL (an error if missing), else from build_dir
    (default REPO/build; Skip if not built)."""
    env = [os.environ.get('VMIGD'), os.environ.get('VMIGCTL')]
    if all(env):
        for path in env:
            if not os.access(path, os.X_OK):
                raise HarnessError(f'{path} is not an executable')
        return tuple(env)
    build_dir = build_dir or os.path.join(REPO_ROOT, 'build')
    paths = tuple(os.path.join(build_dir, name) for name in ('vmigd', 'vmigctl'))
    for path in paths:
        if not os.access(path, os.X_OK):
            raise Skip(f'{path} not built (meson setup build && ninja -C build, '
                       'or set VMIGD and VMIGCTL)')
    return paths


def tail(path, lines=40):
    """The last lines of a text file, or a note that it is missing."""
    try:
        with open(path, errors='replace') as f:
            return ''.join(f.readlines()[-lines:])
    except OSError as e:
        return f'({e})\n'


# --------------------------------------------------------------------------------------------------
# Network namespaces


class NetPair:
    """Two network namespaces ("source" and "target") joined by a veth pair, addresses
    198.18.X.1/24 and 198.18.X.2/24, lo up. With loopback=True: no namespaces, both sides 127.0.0.1.
    Use as a context manager; an atexit hook removes the namespaces if the process ends first."""

    _count = 0

    def __init__(self, loopback=False):
        self.loopback = loopback
        self.source_ns = self.target_ns = None
        self.source_addr = self.target_addr = '127.0.0.1'
        self.source_if = self.target_if = None
        self._created = []

    def __enter__(self):
        if self.loopback:
            return self
        check_netns_possible()
        remove_stale_namespaces()
        NetPair._count += 1
        tag = f'vmh{os.getpid()}x{NetPair._count}'
        subnet = (os.getpid() + NetPair._count) % 256
        self.source_ns, self.target_ns = tag + 's', tag + 't'
        self.source_if, self.target_if = tag + 's', tag + 't'
        self.source_addr, self.target_addr = f'198.18.{subnet}.1', f'198.18.{subnet}.2'
        atexit.register(self.close)
        try:
            for ns in (self.source_ns, self.target_ns):
                _ip('netns', 'add', ns)
                self._created.append(ns)
                _ip('-n', ns, 'link', 'set', 'lo', 'up')
            _ip('link', 'add', self.source_if, 'netns', self.source_ns, 'type', 'veth',
                'peer', 'name', self.target_if, 'netns', self.target_ns)
            for ns, ifname, addr in ((self.source_ns, self.source_if, self.source_addr),
                                     (self.target_ns, self.target_if, self.target_addr)):
                _ip('-n', ns, 'addr', 'add', addr + '/24', 'dev', ifname)
                _ip('-n', ns, 'link', 'set', ifname, 'up')
        except Exception:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Delete the namespaces (the veth pair goes with them). Idempotent."""
        while self._created:
            subprocess.run(['ip', 'netns', 'del', self._created.pop()], capture_output=True)

    def prefix(self, side):
        """Command prefix that runs a program in side's ('source'/'target') namespace."""
        ns = self.source_ns if side == 'source' else self.target_ns
        return netns_prefix(ns)

    def socket(self, side, family=socket.AF_INET, type=socket.SOCK_STREAM):
        """A socket created inside side's namespace (it stays there for its lifetime)."""
        return netns_socket(self.source_ns if side == 'source' else self.target_ns, family, type)


def _ip(*args):
    proc = subprocess.run(['ip', *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise HarnessError(f'ip {" ".join(args)}: {proc.stderr.strip()}')


def netns_prefix(ns):
    """['ip', 'netns', 'exec', ns] or [] for the root namespace (ns None)."""
    return ['ip', 'netns', 'exec', ns] if ns else []


def netns_socket(ns, family=socket.AF_INET, type=socket.SOCK_STREAM):
    """Create a socket in namespace ns (None: ours). A short-lived thread enters the namespace with
    setns(2) and creates it; sockets keep the namespace they were created in."""
    if ns is None:
        return socket.socket(family, type)
    result = {}

    def worker():
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f'/var/run/netns/{ns}') as f:
                if libc.setns(f.fileno(), CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f'setns({ns}): {os.strerror(err)}')
            result['sock'] = socket.socket(family, type)
        except Exception as e:             # noqa: BLE001 -- handed to the caller's thread
            result['error'] = e
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    if 'error' in result:
        raise result['error']
    return result['sock']


def check_netns_possible():
    """Raise Skip unless we are root and can create a network namespace."""
    if os.geteuid() != 0:
        raise Skip('network namespaces need root (run as root, or use loopback mode)')
    if shutil.which('ip') is None:
        raise Skip('iproute2 (ip) not installed')
    probe = f'vmh{os.getpid()}probe'
    proc = subprocess.run(['ip', 'netns', 'add', probe], capture_output=True, text=True)
    if proc.returncode != 0:
        raise Skip(f'cannot create a network namespace: {proc.stderr.strip()}')
    subprocess.run(['ip', 'netns', 'del', probe], capture_output=True)


def remove_stale_namespaces():
    """Delete namespaces this harness made in processes that no longer exist (killed runs)."""
    proc = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        m = re.match(r'(vmh(\d+)x\d+[st])\b', line)
        if m and not os.path.exists(f'/proc/{m.group(2)}'):
            subprocess.run(['ip', 'netns', 'del', m.group(1)], capture_output=True)


# --------------------------------------------------------------------------------------------------
# Processes


def stop_process(proc, timeout=10, sig=signal.SIGTERM):
    """Send sig, wait up to timeout, then SIGKILL. The exit status (None if never started)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Daemon:
    """One vmigd, optionally in a network namespace, and vmigctl wrappers for its control socket.
    vmigctl itself runs in our namespace: the control socket is a filesystem object."""

    def __init__(self, vmigd, vmigctl, name, workdir, listen_addr, prefix=(), extra_args=()):
        self.vmigd, self.vmigctl, self.name = vmigd, vmigctl, name
        self.listen_addr = listen_addr
        self.control = os.path.join(workdir, f'{name}.ctl')
        self.log_path = os.path.join(workdir, f'{name}.log')
        self.prefix, self.extra_args = list(prefix), list(extra_args)
        self.proc = None

    def start(self, timeout=15):
        """Start vmigd and wait until `vmigctl status --json` answers."""
        cmd = self.prefix + [self.vmigd, '--control', self.control, '--listen',
                             f'{self.listen_addr}:0', '--no-tls', '--log-level', 'info',
                             *self.extra_args]
        with open(self.log_path, 'ab') as logf:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)

        def ready():
            if self.proc.poll() is not None:
                raise HarnessError(f'{self.name}: vmigd exited {self.proc.returncode} at '
                                   f'start-up:\n{tail(self.log_path)}')
            return self.ctl('status', '--json', timeout=5).returncode == 0
        wait_until(ready, timeout, f'{self.name} vmigd to answer status', interval=0.1)
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=30):
        """SIGTERM and wait; returns the exit status (SIGKILL after timeout)."""
        return stop_process(self.proc, timeout)

    def ctl(self, *args, timeout=30):
        """Run vmigctl against this daemon; the CompletedProcess (text)."""
        return subprocess.run([self.vmigctl, '-c', self.control, *args], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def ctl_ok(self, *args, timeout=30):
        """Run vmigctl; its stdout, or VmigctlError."""
        proc = self.ctl(*args, timeout=timeout)
        if proc.returncode != 0:
            raise VmigctlError(proc)
        return proc.stdout

    def status(self):
        return json.loads(self.ctl_ok('status', '--json'))

    def list(self):
        """`vmigctl list` as a list of field lists (KEY ROLE PORTS CONNS BYTES)."""
        return [line.split() for line in self.ctl_ok('list').splitlines() if line.strip()]

    def target_start(self, key, sockets):
        """sockets: {portid: unix path}. Returns (JSON text exactly as printed, parsed dict)."""
        args = []
        for portid, path in sockets.items():
            args += ['--socket', f'{portid}={path}']
        raw = self.ctl_ok('target', 'start', key, *args).strip()
        return raw, json.loads(raw)

    def target_stop(self, key):
        self.ctl_ok('target', 'stop', key)

    def source_start(self, key, target_json, basedir, delay_first_ms=None):
        """Returns the unix socket paths the daemon created, in the order of the target's ports."""
        args = ['source', 'start', key, '--target', target_json, '--dir', basedir]
        if delay_first_ms is not None:
            args += ['--test-delay-first', str(delay_first_ms)]
        return self.ctl_ok(*args).split()

    def source_stop(self, key):
        self.ctl_ok('source', 'stop', key)

    def log_text(self):
        with open(self.log_path, errors='replace') as f:
            return f.read()

    def migration_lines(self, key):
        """This daemon's log lines about migration KEY."""
        return [line for line in self.log_text().splitlines() if f'migration {key} ' in line]

    def stop_record(self, key, role, timeout=5):
        """Wait for `migration KEY role=ROLE stop k=v ...` in the log; its fields as a dict."""
        pattern = re.compile(rf'migration {re.escape(key)} role={role} stop (.*)$')

        def find():
            for line in self.migration_lines(key):
                m = pattern.search(line)
                if m:
                    return dict(f.split('=', 1) for f in m.group(1).split() if '=' in f)
            return None
        return wait_until(find, timeout, f'{self.name}: stop line for {key} role={role}')

    def problem_lines(self, key=None):
        """Log lines at level warn or error (about KEY if given)."""
        lines = self.log_text().splitlines()
        return [line for line in lines if re.search(r': (warn\w*|error):', line, re.IGNORECASE)
                and (key is None or key in line)]


# --------------------------------------------------------------------------------------------------
# QEMU


class QMP:
    """Synchronous QMP client on a unix socket. Events that arrive are kept in .events."""

    def __init__(self, path, timeout=30, proc=None):
        self.path, self.events, self._buf = path, [], b''
        self.sock = None

        def connect():
            if proc is not None and proc.poll() is not None:
                raise HarnessError(f'QEMU exited {proc.returncode} before its QMP socket opened')
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                return None
            return s
        self.sock = wait_until(connect, timeout, f'QMP socket {path}')
        greeting = self._recv(time.monotonic() + timeout)
        if 'QMP' not in greeting:
            raise HarnessError(f'unexpected QMP greeting {greeting}')
        self.execute('qmp_capabilities')

    def _recv(self, deadline):
        while b'\n' not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HarnessError(f'QMP {self.path}: no reply in time')
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                raise HarnessError(f'QMP {self.path}: connection closed')
            self._buf += chunk
        line, self._buf = self._buf.split(b'\n', 1)
        return json.loads(line)

    def execute(self, command, arguments=None, timeout=60):
        """Run a command and return its 'return' value; QMPError on an error reply."""
        msg = {'execute': command}
        if arguments:
            msg['arguments'] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b'\n')
        deadline = time.monotonic() + timeout
        while True:
            reply = self._recv(deadline)
            if 'event' in reply:
                self.events.append(reply)
            elif 'error' in reply:
                raise QMPError(f'{command}: {reply["error"].get("desc", reply["error"])}')
            elif 'return' in reply:
                return reply['return']

    def close(self):
        if self.sock:
            self.sock.close()
            self.sock = None


def random_ram_file(size_mib, variant=0, cache_dir=None):
    """A file of size_mib MiB of random bytes, made once per (size, variant) and reused
    ($VMIG_CACHE_DIR or /var/tmp/vmigharness-UID). Different variants have different contents."""
    cache_dir = cache_dir or os.environ.get('VMIG_CACHE_DIR',
                                            f'/var/tmp/vmigharness-{os.getuid()}')
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f'random-{size_mib}M-{variant}.bin')
    if os.path.exists(path) and os.path.getsize(path) == size_mib << 20:
        return path
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix='.random-')
    try:
        with os.fdopen(fd, 'wb') as f:
            for _ in range(size_mib // 16):
                f.write(os.urandom(16 << 20))
            f.write(os.urandom((size_mib % 16) << 20))
        os.rename(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


class Qemu:
    """A paused q35 guest with size_mib of RAM and no devices. role 'source' backs its RAM with a
    file of random bytes (every page non-zero; ram_variant picks the file); role 'destination' has
    plain RAM and -incoming defer. Runs in a namespace through prefix; log in WORKDIR/NAME.log."""

    def __init__(self, name, role, size_mib, workdir, prefix=(), binary='qemu-system-x86_64',
                 extra_args=(), ram_variant=0):
        self.name, self.role, self.size_mib = name, role, size_mib
        self.ram_variant = ram_variant
        self.qmp_path = os.path.join(workdir, f'{name}.qmp')
        self.log_path = os.path.join(workdir, f'{name}.log')
        self.workdir, self.prefix = workdir, list(prefix)
        self.binary, self.extra_args = binary, list(extra_args)
        self.proc = self.qmp = None

    def command(self):
        size = f'{self.size_mib}M'
        if self.role == 'source':
            backend = (f'memory-backend-file,id=mem0,size={size},'
                       f'mem-path={random_ram_file(self.size_mib, self.ram_variant)},share=on')
        else:
            backend = f'memory-backend-ram,id=mem0,size={size}'
        cmd = [self.binary, '-name', self.name, '-machine', 'q35,memory-backend=mem0', '-m', size,
               '-object', backend, '-S', '-nodefaults', '-display', 'none',
               '-qmp', f'unix:{self.qmp_path},server=on,wait=off', *self.extra_args]
        if self.role == 'destination':
            cmd += ['-incoming', 'defer']
        return self.prefix + cmd

    def start(self, timeout=30):
        with open(self.log_path, 'ab') as logf:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=logf)
        try:
            self.qmp = QMP(self.qmp_path, timeout, self.proc)
        except HarnessError as e:
            raise HarnessError(f'{self.name}: {e}\n{tail(self.log_path)}') from None
        return self

    def execute(self, command, arguments=None, timeout=60):
        return self.qmp.execute(command, arguments, timeout)

    def run_state(self):
        return self.execute('query-status')['status']

    def migration_info(self):
        return self.execute('query-migrate')

    def memory_digest(self):
        """sha256 of guest RAM [0, size), without the VGA/BIOS window, via pmemsave to a file
        that is removed afterwards."""
        size = self.size_mib << 20
        dump = os.path.join(self.workdir, f'{self.name}.mem')
        try:
            self.execute('pmemsave', {'val': 0, 'size': size, 'filename': dump}, timeout=300)
            if os.path.getsize(dump) != size:
                raise HarnessError(f'{self.name}: pmemsave wrote {os.path.getsize(dump)} bytes, '
                                   f'not {size}')
            digest = hashlib.sha256()
            with open(dump, 'rb') as f:
                for start, end in ((0, VGA_BIOS_WINDOW[0]), (VGA_BIOS_WINDOW[1], size)):
                    f.seek(start)
                    while start < end:
                        chunk = f.read(min(8 << 20, end - start))
                        digest.update(chunk)
                        start += len(chunk)
            return digest.hexdigest()
        finally:
            if os.path.exists(dump):
                os.unlink(dump)

    def close(self):
        """quit over QMP, then SIGTERM/SIGKILL if it lingers. Idempotent."""
        if self.qmp:
            try:
                self.qmp.execute('quit', timeout=5)
            except (OSError, HarnessError):
                pass
            self.qmp.close()
            self.qmp = None
        if self.proc and self.proc.poll() is None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                stop_process(self.proc, 5)


# --------------------------------------------------------------------------------------------------
# Migrations


@dataclasses.dataclass
class MigrationResult:
    key: str
    channels: int            # multifd channels; 0 = multifd off
    size_mib: int
    seconds: float           # wall time from `migrate` until query-migrate said completed
    qemu_total_ms: int       # QEMU's total-time
    bytes: int               # ram.transferred on the source
    source_sockets: list = dataclasses.field(default_factory=list)
    target: dict = dataclasses.field(default_factory=dict)

    @property
    def mib_per_s(self):
        return self.bytes / self.seconds / (1 << 20)

    @property
    def gbit_per_s(self):
        return self.bytes * 8 / self.seconds / 1e9

    def summary(self):
        mode = f'multifd={self.channels}' if self.channels else 'multifd=off'
        return (f'{self.key}: {self.size_mib} MiB {mode} {self.bytes} bytes in '
                f'{self.seconds:.2f}s (qemu {self.qemu_total_ms} ms) {self.mib_per_s:.0f} MiB/s '
                f'{self.gbit_per_s:.2f} Gbit/s')


def configure_migration(src, dst, channels, max_bandwidth=DEFAULT_MAX_BANDWIDTH):
    """multifd on with `channels` channels (0: off) on both sides; max-bandwidth on the source."""
    caps = [{'capability': 'multifd', 'state': channels > 0}]
    for q in (src, dst):
        q.execute('migrate-set-capabilities', {'capabilities': caps})
        if channels:
            q.execute('migrate-set-parameters', {'multifd-channels': channels})
    src.execute('migrate-set-parameters', {'max-bandwidth': max_bandwidth})


def wait_migration(src, dst, timeout, started, src_state):
    """Poll until the source reports completed (HarnessError on failed/cancelled/timeout), then
    check the run states: source 'postmigrate'; destination out of 'inmigrate' and in src_state, the
    source's state before the migration, which QEMU carries over (a never-started -S guest is
    'prelaunch', a stopped one 'paused'). Returns the source's final query-migrate, with
    '_elapsed' added: seconds from `started` (time.monotonic()) until completed was seen."""
    def finished():
        info = src.migration_info()
        return info if info.get('status') in ('completed', 'failed', 'cancelled') else None

    def dst_loaded():
        state = dst.run_state()
        return state if state != 'inmigrate' else None

    info = wait_until(finished, timeout, 'the migration to finish')
    elapsed = time.monotonic() - started
    if info['status'] != 'completed':
        raise HarnessError(f'migration {info["status"]}: {info.get("error-desc", "")}')
    dst_state = wait_until(dst_loaded, 30, 'destination to leave run state inmigrate')
    if dst_state != src_state:
        raise HarnessError(f'destination run state {dst_state}, expected {src_state}')
    dst_status = dst.migration_info().get('status')
    if dst_status != 'completed':
        raise HarnessError(f'destination migration status {dst_status}, expected completed')
    if src.run_state() != 'postmigrate':
        raise HarnessError(f'source run state {src.run_state()}, expected postmigrate')
    info['_elapsed'] = elapsed
    return info


def _result(key, channels, src, info, **kw):
    return MigrationResult(key=key, channels=channels, size_mib=src.size_mib,
                           seconds=info['_elapsed'], qemu_total_ms=info.get('total-time', 0),
                           bytes=info['ram']['transferred'], **kw)


def migrate_direct(src, dst, uri, channels=0, max_bandwidth=DEFAULT_MAX_BANDWIDTH, timeout=300):
    """QEMU to QEMU without daemons (a baseline): dst listens on uri (unix:PATH or tcp:ADDR:PORT
    reachable from the source's namespace), src connects to it."""
    configure_migration(src, dst, channels, max_bandwidth)
    dst.execute('migrate-incoming', {'uri': uri})
    src_state = src.run_state()
    started = time.monotonic()
    src.execute('migrate', {'uri': uri})
    return _result('direct', channels, src, wait_migration(src, dst, timeout, started, src_state))


class DaemonMigration:
    """A migration through two daemons, started by start_via_daemons(); finish() waits for it."""

    def __init__(self, src, dst, source_daemon, target_daemon, key, channels):
        self.src, self.dst, self.key, self.channels = src, dst, key, channels
        self.source_daemon, self.target_daemon = source_daemon, target_daemon
        self.target, self.target_raw, self.sockets = {}, '', []
        self.started = self.src_state = None

    def status(self):
        """The source's query-migrate status ('active', 'completed', ...)."""
        return self.src.migration_info().get('status')

    def finish(self, timeout=300):
        """Wait for completion, check run states, `source stop` and `target stop`; the result."""
        info = wait_migration(self.src, self.dst, timeout, self.started, self.src_state)
        self.source_daemon.source_stop(self.key)
        self.target_daemon.target_stop(self.key)
        return _result(self.key, self.channels, self.src, info, source_sockets=self.sockets,
                       target=self.target)


def start_via_daemons(src, dst, source_daemon, target_daemon, key, basedir, target_sock,
                      channels=0, max_bandwidth=DEFAULT_MAX_BANDWIDTH, delay_first_ms=None,
                      port_id=DEFAULT_PORT_ID):
    """The KubeVirt-style flow: dst listens on target_sock, `target start` on the target daemon,
    `source start` with its JSON on the source daemon, src migrates to the socket that returns.
    Returns the DaemonMigration once `migrate` is issued."""
    m = DaemonMigration(src, dst, source_daemon, target_daemon, key, channels)
    configure_migration(src, dst, channels, max_bandwidth)
    dst.execute('migrate-incoming', {'uri': f'unix:{target_sock}'})
    m.target_raw, m.target = target_daemon.target_start(key, {port_id: target_sock})
    m.sockets = source_daemon.source_start(key, m.target_raw, basedir, delay_first_ms)
    if len(m.sockets) != 1:
        raise HarnessError(f'source start printed {m.sockets}, expected one socket path')
    m.src_state = src.run_state()
    m.started = time.monotonic()
    src.execute('migrate', {'uri': f'unix:{m.sockets[0]}'})
    return m


def migrate_via_daemons(*args, timeout=300, **kw):
    """start_via_daemons() and finish(); the MigrationResult."""
    return start_via_daemons(*args, **kw).finish(timeout)


def verify_memory(src, dst):
    """Compare guest RAM of both sides; the common sha256, or HarnessError."""
    a, b = src.memory_digest(), dst.memory_digest()
    if a != b:
        raise HarnessError(f'guest memory differs: source {a} destination {b}')
    return a


# --------------------------------------------------------------------------------------------------
# Testbed: all of the above wired together


class Testbed:
    """A NetPair, a work directory and two vmigd ("source" in the source namespace, "target" in the
    target namespace), plus QEMU pairs started on demand. On leaving the block everything is
    stopped and removed (the work directory is kept if $VMIG_KEEP is set); if the block raised,
    the tails of all logs are printed first."""

    def __init__(self, vmigd=None, vmigctl=None, loopback=False, daemon_args=(),
                 source_args=(), target_args=(), qemu='qemu-system-x86_64'):
        if vmigd is None or vmigctl is None:
            vmigd, vmigctl = find_binaries()
        self.vmigd, self.vmigctl, self.qemu = vmigd, vmigctl, qemu
        self.net = NetPair(loopback)
        self.daemon_args = {'source': [*daemon_args, *source_args],
                            'target': [*daemon_args, *target_args]}
        self.workdir = None
        self.source = self.target = None
        self.qemus = []
        self._keys = self._pairs = 0

    def __enter__(self):
        if shutil.which(self.qemu) is None:
            raise Skip(f'{self.qemu} not installed')
        self.workdir = tempfile.mkdtemp(prefix='vmig-', dir='/tmp')
        try:
            self.net.__enter__()
            os.makedirs(self.path('src'))
            os.makedirs(self.path('dst'))
            # Assigned before start(), so that close() stops a daemon whose start-up timed out.
            self.source = Daemon(self.vmigd, self.vmigctl, 'vmigd-source', self.workdir,
                                 self.net.source_addr, self.net.prefix('source'),
                                 self.daemon_args['source'])
            self.source.start()
            self.target = Daemon(self.vmigd, self.vmigctl, 'vmigd-target', self.workdir,
                                 self.net.target_addr, self.net.prefix('target'),
                                 self.daemon_args['target'])
            self.target.start()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None and not issubclass(exc_type, Skip):
                self.dump_logs()
        finally:
            self.close()

    def close(self):
        """Stop QEMUs and daemons, remove namespaces and the work directory. Idempotent."""
        try:
            while self.qemus:
                self.qemus.pop().close()
            for d in (self.source, self.target):
                if d is not None:
                    d.stop(timeout=10)
        finally:
            self.net.close()
            if self.workdir and not os.environ.get('VMIG_KEEP'):
                shutil.rmtree(self.workdir, ignore_errors=True)
            elif self.workdir:
                log(f'kept {self.workdir}')
            self.workdir = None

    def path(self, *names):
        return os.path.join(self.workdir, *names)

    def dump_logs(self, lines=40):
        files = [d.log_path for d in (self.source, self.target) if d is not None]
        files += [q.log_path for q in self.qemus[-2:]]
        try:
            for path in files:
                sys.stdout.write(f'--- tail of {path}\n{tail(path, lines)}')
            sys.stdout.flush()
        except OSError:                    # stdout gone (closed pipe): the logs cannot be shown
            pass

    def new_key(self, label='m'):
        self._keys += 1
        return f'{label}-{os.getpid()}-{self._keys}'

    def qemu_pair(self, size_mib, ram_variant=0):
        """Start a source QEMU (source namespace) and a destination QEMU (target namespace)."""
        self._pairs += 1
        pair = (Qemu(f'q{self._pairs}-src', 'source', size_mib, self.workdir,
                     self.net.prefix('source'), self.qemu, ram_variant=ram_variant),
                Qemu(f'q{self._pairs}-dst', 'destination', size_mib, self.workdir,
                     self.net.prefix('target'), self.qemu))
        for q in pair:
            self.qemus.append(q)
            q.start()
        return pair

    def close_qemus(self, *qemus):
        for q in qemus:
            q.close()
            self.qemus.remove(q)
            for path in (q.log_path, q.qmp_path):
                if os.path.exists(path):
                    os.unlink(path)

    def start_migration(self, src, dst, key=None, channels=0, **kw):
        """start_via_daemons() through this testbed's daemons, sockets under the work dir."""
        key = key or self.new_key()
        return start_via_daemons(src, dst, self.source, self.target, key, self.path('src'),
                                 self.path('dst', f'{key}.sock'), channels, **kw)

    def migrate(self, src, dst, key=None, channels=0, timeout=300, **kw):
        """start_migration() and finish(); the MigrationResult."""
        return self.start_migration(src, dst, key, channels, **kw).finish(timeout)

    def stop_daemons(self):
        """SIGTERM both daemons; HarnessError unless both exit 0."""
        for d in (self.source, self.target):
            rc = d.stop()
            if rc != 0:
                raise HarnessError(f'{d.name} exited {rc} after SIGTERM:\n{tail(d.log_path)}')
