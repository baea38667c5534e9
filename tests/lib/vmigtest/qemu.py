"""QEMU for the tests: a synchronous QMP client, paused q35 guests with random RAM (or booting the
test guest, tests/guest), the guest's serial lines, and guest-memory digests. Stdlib only."""

import dataclasses
import hashlib
import json
import os
import re
import socket
import subprocess
import tempfile
import time

from .base import REPO_ROOT, HarnessError, Skip, stop_process, tail, wait_until

VGA_BIOS_WINDOW = (0xA0000, 0x100000)      # differs between source and destination; not compared


class QMPError(HarnessError):
    """QEMU answered a QMP command with an error."""


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
            except ConnectionResetError:
                chunk = b''            # QEMU exited with our command unread: it is closed
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
        try:
            self.sock.sendall(json.dumps(msg).encode() + b'\n')
        except (BrokenPipeError, ConnectionResetError) as e:
            raise HarnessError(f'QMP {self.path}: connection closed ({e.strerror})') from None
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
        # The first writer wins: a test running beside this one may have made the file and
        # mapped it meanwhile, and replacing it would change the bytes its checks read back.
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return path


GUEST_READY = re.compile(r'vmig-guest: ws=(?P<ws>\d+)MiB rate=(?P<rate>\d+MiB/s|max) '
                         r'tsc=(?P<ghz>[\d.]+)GHz start=(?P<start>\d+)MiB mem=(?P<mem>\d+)MiB '
                         r'report=(?P<report>\d+)ms wait=(?P<wait>\w+)'
                         r'(?: noise=(?P<noise>\d+)%)? ready')
GUEST_REPORT = re.compile(r'vmig-guest: t=(?P<t_ms>\d+)ms pass=(?P<passes>\d+) '
                          r'pages=(?P<pages>\d+) rate=(?P<rate>[\d.]+)MiB/s '
                          r'lost=(?P<lost_ms>\d+)ms')


@dataclasses.dataclass
class GuestSpec:
    """The test guest's parameters (tests/guest/README.md), passed as its -append: a working set
    of ws_mib MiB from start_mib (None: the guest's default, 4 MiB-aligned above its image)
    dirtied at rate_mib_s MiB/s (0: flat out), a status line every report_ms ms; wait 'hlt'
    (default) or 'spin' between pacing slices; catchup_ms: the most pacing backlog made up
    (None: the guest's 20 ms; small makes it CPU-bound, so that a throttle slows it); fill: write
    the whole working set once before ready; populate_mib: write that much RAM from the working
    set's start once before ready (what a first pass must send); repeat: writes per page before
    the next (the rate counts writes, so distinct pages go at rate / repeat); burst: (on_ms,
    off_ms), writing only in the first on_ms of each cycle; tlbflush False: none of the TLB
    flushes that keep QEMU 7.2's TCG dirty tracking honest (shows what it loses); noise: % of
    each page written rewritten with pseudorandom bytes (None or 0: only the counter, so a page
    compresses about 100x; 25: about 4x)."""
    ws_mib: int
    rate_mib_s: int
    start_mib: int = None
    report_ms: int = 1000
    wait: str = None
    catchup_ms: int = None
    fill: bool = False
    populate_mib: int = None
    repeat: int = None
    burst: tuple = None
    tlbflush: bool = True
    noise: int = None

    def append(self):
        words = [f'ws={self.ws_mib}', f'rate={self.rate_mib_s}']
        if self.start_mib is not None:
            words.append(f'start={self.start_mib}')
        words.append(f'report={self.report_ms}')
        if self.wait:
            words.append(f'wait={self.wait}')
        if self.catchup_ms is not None:
            words.append(f'catchup={self.catchup_ms}')
        if self.fill:
            words.append('fill=1')
        if self.populate_mib:
            words.append(f'populate={self.populate_mib}')
        if self.repeat:
            words.append(f'repeat={self.repeat}')
        if self.burst:
            words.append(f'burst={self.burst[0]}/{self.burst[1]}')
        if not self.tlbflush:
            words.append('tlbflush=0')
        if self.noise:
            words.append(f'noise={self.noise}')
        return ' '.join(words)


@dataclasses.dataclass
class GuestReport:
    """One periodic status line of the test guest: ms since ready (TSC time, which stands still
    while the VM is stopped and carries over a migration), full passes over the working set,
    pages written since ready, the rate over the last period (MiB/s), pacing backlog dropped
    because of stalls longer than its catchup (20 ms unless set; ms, cumulative)."""
    t_ms: int
    passes: int
    pages: int
    rate: float
    lost_ms: int


def guest_binary():
    """The test guest's ELF: $VMIG_GUEST (meson sets it; empty when the compiler cannot make
    32-bit code), else REPO/build/tests/guest/vmig-guest.elf. Skip when there is none."""
    path = os.environ.get('VMIG_GUEST')
    if path is None:
        path = os.path.join(REPO_ROOT, 'build', 'tests', 'guest', 'vmig-guest.elf')
    if not path:
        raise Skip('the test guest was not built: the C compiler cannot link 32-bit '
                   'freestanding code (see tests/guest/meson.build)')
    if not os.path.isfile(path):
        raise Skip(f'{path} not built (ninja -C build, or set VMIG_GUEST)')
    return path


def parse_guest_report(line):
    """A GuestReport from a status line, or None for any other line."""
    m = GUEST_REPORT.search(line)
    if not m:
        return None
    return GuestReport(int(m['t_ms']), int(m['passes']), int(m['pages']), float(m['rate']),
                       int(m['lost_ms']))


class Qemu:
    """A paused q35 guest with size_mib of RAM and no devices. role 'source' backs its RAM with a
    file of random bytes (every page non-zero; ram_variant picks the file); role 'destination' has
    plain RAM (allocated at start with prealloc=True) and -incoming defer. Runs in a namespace
    through prefix; log in WORKDIR/NAME.log. private=True maps the source's file copy-on-write
    (share=off), so that a guest that is let run (`cont`) does not write into the cached file
    other guests start from.

    guest (a GuestSpec, or a dict of its fields): boot the test guest (tests/guest) with
    -kernel $VMIG_GUEST -append SPEC, its COM1 in WORKDIR/NAME.serial. Both roles get the same
    -kernel/-append (the destination's command line must match the source's); a source's RAM is
    then plain memory-backend-ram, so that the guest's writes dirty ordinary pages. The VM still
    starts paused (-S): start_guest() lets it run and waits for its ready line. A destination
    started with -S stays paused after an incoming migration (QEMU's autostart is off), so that
    both sides' RAM can be compared before it is let run with `cont`. machine: the -machine type
    (a versioned one, pc-q35-7.2, when the two sides run different QEMU versions)."""

    def __init__(self, name, role, size_mib, workdir, prefix=(), binary='qemu-system-x86_64',
                 extra_args=(), ram_variant=0, private=False, prealloc=False, guest=None,
                 machine='q35', reserve=True, sparse_dir=None, hugepages=False, ram_file=None):
        self.name, self.role, self.size_mib = name, role, size_mib
        # ram_file: a source's RAM image in place of the random one (ramimage.py)
        self.ram_file = ram_file
        self.ram_variant, self.private, self.prealloc = ram_variant, private, prealloc
        self.guest = GuestSpec(**guest) if isinstance(guest, dict) else guest
        self.guest_path = guest_binary() if self.guest is not None else None
        self.serial_path = os.path.join(workdir, f'{name}.serial')
        self.qmp_path = os.path.join(workdir, f'{name}.qmp')
        self.log_path = os.path.join(workdir, f'{name}.log')
        self.workdir, self.prefix = workdir, list(prefix)
        self.binary, self.extra_args = binary, list(extra_args)
        self.machine = machine
        # reserve=False: the RAM backend reserves no swap space (reserve=off, QEMU 6.1+), so a
        # guest far larger than the host starts, and only the pages it touches take memory.
        self.reserve = reserve
        # sparse_dir: RAM is a sparse file there, mapped private: pages never written read as
        # the file's holes (no memory where the disk's page cache can give them back), which
        # anonymous RAM does not give on every kernel (see test_large.py).
        self.sparse_ram = os.path.join(sparse_dir, f'{name}.ram') if sparse_dir else None
        # hugepages: RAM from the host's 2 MiB hugetlb pool (a memfd), as a VM given hugepages
        self.hugepages = hugepages
        self.proc = self.qmp = None

    def command(self):
        size = f'{self.size_mib}M'
        if self.role == 'source' and self.guest is not None:
            backend = f'memory-backend-ram,id=mem0,size={size}'
        elif self.role == 'source':
            backend = (f'memory-backend-file,id=mem0,size={size},'
                       f'mem-path={self.source_ram()},'
                       f'share={"off" if self.private else "on"}')
        else:
            backend = f'memory-backend-ram,id=mem0,size={size}'
            if self.prealloc:
                backend += ',prealloc=on'
        if self.hugepages:
            backend = f'memory-backend-memfd,id=mem0,size={size},hugetlb=on,hugetlbsize=2M'
        if self.sparse_ram:
            backend = (f'memory-backend-file,id=mem0,size={size},mem-path={self.sparse_ram},'
                       'share=off')
        if not self.reserve:
            backend += ',reserve=off'
        cmd = [self.binary, '-name', self.name, '-machine', f'{self.machine},memory-backend=mem0',
               '-m', size, '-object', backend, '-S', '-nodefaults', '-display', 'none',
               '-qmp', f'unix:{self.qmp_path},server=on,wait=off', *self.extra_args]
        if self.guest is not None:
            cmd += ['-kernel', self.guest_path, '-append', self.guest.append(),
                    '-serial', f'file:{self.serial_path}']
        if self.role == 'destination':
            cmd += ['-incoming', 'defer']
        return self.prefix + cmd

    def source_ram(self):
        """The file a source's RAM is mapped from: ram_file, else the random one."""
        return self.ram_file or random_ram_file(self.size_mib, self.ram_variant)

    def start(self, timeout=30):
        if self.sparse_ram:
            with open(self.sparse_ram, 'wb') as f:
                f.truncate(self.size_mib << 20)
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

    def warm_ram(self):
        """Read a source's RAM file through once, so that its pages are in the page cache when
        the migration reads them (a cold file stalls QEMU on the disk: a dent in a capped
        rate that is not the shaper's). Seconds it took; 0 for a destination."""
        if self.role != 'source' or self.guest is not None:
            return 0.0
        started = time.monotonic()
        with open(self.source_ram(), 'rb') as f:
            while f.read(8 << 20):
                pass
        return time.monotonic() - started

    def major_faults(self):
        """QEMU's major page faults so far (pages it had to wait for the disk for), or 0."""
        try:
            with open(f'/proc/{self.proc.pid}/stat') as f:
                return int(f.read().rsplit(')', 1)[1].split()[9])
        except (OSError, ValueError, IndexError, AttributeError):
            return 0

    def run_state(self):
        return self.execute('query-status')['status']

    def serial_lines(self):
        """The test guest's serial output so far, one string per complete line ([] before the
        first)."""
        try:
            with open(self.serial_path, 'rb') as f:
                data = f.read().decode(errors='replace')
        except FileNotFoundError:
            return []
        return [line.rstrip('\r') for line in data.split('\n')[:-1]]

    def wait_serial(self, pattern, timeout=30, since=0):
        """Wait for a serial line at index >= since matching the regex pattern (re.search);
        (index, match). HarnessError at the deadline, when the guest printed an error line or
        when QEMU exited."""
        regex = re.compile(pattern)

        def find():
            lines = self.serial_lines()
            for i in range(since, len(lines)):
                if 'vmig-guest: error' in lines[i]:
                    raise HarnessError(f'{self.name}: {lines[i]}')
                m = regex.search(lines[i])
                if m:
                    return i, m
            if self.proc is not None and self.proc.poll() is not None:
                raise HarnessError(f'{self.name}: QEMU exited {self.proc.returncode}\n'
                                   f'{tail(self.log_path)}')
            return None
        try:
            return wait_until(find, timeout, f'{self.name} serial line /{pattern}/',
                              interval=0.1)
        except HarnessError as e:
            raise HarnessError(f'{e}\n--- tail of {self.serial_path}\n'
                               f'{tail(self.serial_path, 10)}') from None

    def guest_reports(self, since=0):
        """[(index, GuestReport)] of the status lines at index >= since."""
        out = []
        for i, line in enumerate(self.serial_lines()[since:], since):
            r = parse_guest_report(line)
            if r:
                out.append((i, r))
        return out

    def wait_reports(self, count, since=0, timeout=30):
        """Wait until the serial has count status lines at index >= since; their GuestReports."""
        def enough():
            reports = self.guest_reports(since)
            return reports if len(reports) >= count else None
        try:
            found = wait_until(enough, timeout, f'{count} status lines from {self.name}', 0.1)
        except HarnessError as e:
            raise HarnessError(f'{e}\n{tail(self.serial_path, 10)}') from None
        return [r for _, r in found]

    def start_guest(self, timeout=30):
        """`cont` a source with a test guest and wait for its ready line; the line's match
        (GUEST_READY: ws, rate, ghz, start, mem, report, wait, noise)."""
        if self.guest is None:
            raise HarnessError(f'{self.name} has no test guest')
        self.execute('cont')
        return self.wait_serial(GUEST_READY.pattern, timeout)[1]

    def migration_info(self):
        return self.execute('query-migrate')

    def memory_dump(self, path):
        """pmemsave guest RAM [0, size) to path."""
        size = self.size_mib << 20
        self.execute('pmemsave', {'val': 0, 'size': size, 'filename': path}, timeout=300)
        if os.path.getsize(path) != size:
            raise HarnessError(f'{self.name}: pmemsave wrote {os.path.getsize(path)} bytes, '
                               f'not {size}')

    def memory_digest(self):
        """sha256 of guest RAM [0, size), without the VGA/BIOS window, via pmemsave to a file
        that is removed afterwards."""
        size = self.size_mib << 20
        dump = os.path.join(self.workdir, f'{self.name}.mem')
        try:
            self.memory_dump(dump)
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
        if self.sparse_ram and os.path.exists(self.sparse_ram):
            os.unlink(self.sparse_ram)
