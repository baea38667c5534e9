"""The testbed: a NetPair, a work directory and two vmigd daemons (plain or mutual TLS), with
QEMU pairs started on demand and migrations through the daemons; everything stopped and removed
on leaving the block. Stdlib only."""

import os
import shutil
import subprocess
import sys
import tempfile

from .base import DEFAULT_PORT_ID, HarnessError, Skip, log, tail, wait_until
from .daemons import Daemon, digest_problems, find_binaries
from .migrate import start_via_daemons
from .net import NetPair, UnixServer
from .qemu import Qemu
from .qemuversions import machine_for, qemu_version, resolve_qemu, side_qemu
from .tls import PKI, install_tls, make_pki


class Testbed:
    """A NetPair, a work directory and two vmigd ("source" in the source namespace, "target" in the
    target namespace), plus QEMU pairs started on demand. On leaving the block everything is
    stopped and removed (the work directory is kept if $VMIG_KEEP is set); if the block raised,
    the tails of all logs are printed first."""

    def __init__(self, vmigd=None, vmigctl=None, loopback=False, daemon_args=(),
                 source_args=(), target_args=(), qemu=None, tls=None,
                 source_tls=None, target_tls=None, tls_layout='files', qemu_src=None,
                 qemu_dst=None, source_vmigd=None, daemon_wrapper=None, before_daemons=None,
                 start_order=('source', 'target'), start_together=False):
        """tls (or source_tls/target_tls for one side): None for --no-tls; True makes a PKI
        under WORKDIR/pki (tb.pki) and uses it as a PKI does: each daemon gets its own copy of
        the node certificate, key and CA under WORKDIR/tls-source and WORKDIR/tls-target (see
        install_tls(); tls_layout 'files' or 'kubernetes', or a dict per side), so that a test
        can rotate one side's files; anything else tls_paths() takes is passed as it is.
        Both daemons get `--digest on` unless the arguments say otherwise.
        qemu (both sides) or qemu_src/qemu_dst: a QEMU version ('7.2', '10.0') or binary; by
        default $VMIG_QEMU_SRC and $VMIG_QEMU_DST (see side_qemu), else the system's 7.2. When
        the two differ, both run the older one's versioned q35 machine (machine_for).
        source_vmigd: the source side's daemon, default vmigd; vt.find_test_daemon() where a test
        sends the test build's request fields (start_migration's delay_first_ms).
        daemon_wrapper: a function (testbed, side, name) -> the command that starts daemon NAME
        in side's namespace, in place of `ip netns exec NS` (a container, say: vmigd is then
        the path it sees there). It runs once the work directory and the namespaces exist.
        before_daemons: called with the testbed once the namespaces exist, before either daemon
        starts (more links between the namespaces, say). start_order: which daemon starts first;
        start_together: the second is started right after the first, not once the first answers
        (two nodes that come up at the same time)."""
        if vmigd is None or vmigctl is None:
            vmigd, vmigctl = find_binaries()
        self.vmigd, self.vmigctl = vmigd, vmigctl
        self.binary = {'source': source_vmigd or vmigd, 'target': vmigd}
        self.qemu_spec = {'source': qemu_src or qemu, 'destination': qemu_dst or qemu}
        self.qemu = self.qemu_dst = self.machine = None
        self.net = NetPair(loopback)
        self.daemon_args = {'source': [*daemon_args, *source_args],
                            'target': [*daemon_args, *target_args]}
        # Every migration a test makes proves its bytes (`--digest on`, not the daemon's
        # default `auto`, which leaves plain-text spliced connections out) unless the test
        # picks its own.
        for args in self.daemon_args.values():
            if '--digest' not in args:
                args[:0] = ['--digest', 'on']
        self.tls = {'source': source_tls if source_tls is not None else tls,
                    'target': target_tls if target_tls is not None else tls}
        self.tls_layout = (tls_layout if isinstance(tls_layout, dict)
                           else {'source': tls_layout, 'target': tls_layout})
        self.tls_dirs = {}
        self.pki = tls if isinstance(tls, PKI) else None
        self.workdir = None
        self.source = self.target = None
        self.extra_daemons, self.retired = [], []
        self.qemus = []
        self.daemon_wrapper = daemon_wrapper
        self.before_daemons = before_daemons
        self.start_order, self.start_together = tuple(start_order), start_together
        self._keys = self._pairs = self._replaced = 0

    def __enter__(self):
        self.resolve_qemus()
        self.workdir = tempfile.mkdtemp(prefix='vmig-', dir='/tmp')
        try:
            self.net.__enter__()
            # Arguments may name the veth ends, known only now: {source_if}, {target_if}.
            for side, args in self.daemon_args.items():
                self.daemon_args[side] = [
                    a.replace('{source_if}', self.net.source_if or '')
                     .replace('{target_if}', self.net.target_if or '') for a in args]
            os.makedirs(self.path('src'))
            os.makedirs(self.path('dst'))
            if any(v is True for v in self.tls.values()) and self.pki is None:
                self.pki = make_pki(self.path('pki'))
            tls = {side: self._daemon_tls(side) for side in ('source', 'target')}
            if self.before_daemons:
                self.before_daemons(self)
            # Assigned before start(), so that close() stops a daemon whose start-up timed out.
            self.source = Daemon(self.binary['source'], self.vmigctl, 'vmigd-source', self.workdir,
                                 self.net.source_addr, self.daemon_prefix('source', 'vmigd-source'),
                                 self.daemon_args['source'], tls=tls['source'])
            self.target = Daemon(self.binary['target'], self.vmigctl, 'vmigd-target', self.workdir,
                                 self.net.target_addr, self.daemon_prefix('target', 'vmigd-target'),
                                 self.daemon_args['target'], tls=tls['target'])
            daemons = [getattr(self, side) for side in self.start_order]
            for d in daemons:
                d.launch() if self.start_together else d.start()
            if self.start_together:
                for d in daemons:
                    d.wait_ready()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        problems = []
        try:
            if exc_type is not None and not issubclass(exc_type, Skip):
                self.dump_logs()
            elif exc_type is None:
                # Every migration that both daemons call ok must have proved its bytes: the
                # daemons stop first, so that every stop line is written.
                self.stop_all()
                problems = digest_problems((self.source, self.target, *self.extra_daemons,
                                            *self.retired))
                if problems:
                    self.dump_logs()
        finally:
            self.close()
        if problems:
            raise HarnessError('connection digests: ' + '; '.join(problems[:6]) +
                               (f' (and {len(problems) - 6} more)' if len(problems) > 6 else ''))

    def stop_all(self):
        """Stop QEMUs and daemons (each daemon logs the stop lines it still owes)."""
        while self.qemus:
            self.qemus.pop().close()
        for d in (self.source, self.target, *self.extra_daemons):
            if d is not None:
                d.stop(timeout=10)

    def close(self):
        """Stop QEMUs and daemons, remove namespaces and the work directory. Idempotent."""
        try:
            self.stop_all()
        finally:
            self.net.close()
            if self.workdir and not os.environ.get('VMIG_KEEP'):
                shutil.rmtree(self.workdir, ignore_errors=True)
            elif self.workdir:
                log(f'kept {self.workdir}')
            self.workdir = None

    def daemon_prefix(self, side, name):
        """The command that starts daemon NAME in side's namespace: `ip netns exec NS`, or what
        daemon_wrapper makes of it."""
        if self.daemon_wrapper:
            return list(self.daemon_wrapper(self, side, name))
        return self.net.prefix(side)

    def path(self, *names):
        return os.path.join(self.workdir, *names)

    def resolve_qemus(self):
        """Find each side's QEMU binary and the machine type both run; Skip when one is not
        there."""
        bins = {side: resolve_qemu(spec) if spec else side_qemu(side)
                for side, spec in self.qemu_spec.items()}
        self.qemu, self.qemu_dst = bins['source'], bins['destination']
        self.machine = machine_for(self.qemu, self.qemu_dst)

    def describe(self):
        """'source vmigd ADDR (NS), target vmigd ADDR (NS), QEMU 7.2.22 -> 10.0.2 (pc-q35-7.2)':
        the start of a test's first line."""
        return (f'source vmigd {self.net.source_addr} ({self.net.source_ns}), target vmigd '
                f'{self.net.target_addr} ({self.net.target_ns}), {self.qemu_versions()}')

    def qemu_versions(self):
        """'QEMU 7.2.22 -> 10.0.2 (pc-q35-7.2)': which QEMU each side of a pair runs."""
        def text(binary):
            v = qemu_version(binary)
            return '.'.join(map(str, v)) if v else binary
        return f'QEMU {text(self.qemu)} -> {text(self.qemu_dst)} ({self.machine})'

    def sides(self):
        """((source daemon, 'source'), (target daemon, 'target')): the current ones."""
        return ((self.source, 'source'), (self.target, 'target'))

    def side_of(self, daemon):
        """'source' for the source daemon, else 'target'."""
        return 'source' if daemon is self.source else 'target'

    def ns_of(self, daemon):
        """The network namespace daemon runs in (see side_of())."""
        return self.net.ns(self.side_of(daemon))

    def _daemon_tls(self, side):
        tls = self.pki if self.tls[side] is True else self.tls[side]
        if isinstance(tls, PKI):
            directory = self.path(f'tls-{side}')
            self.tls_dirs[side] = directory
            return install_tls(directory, tls.node, tls.ca, layout=self.tls_layout[side])
        return tls

    def extra_daemon(self, name, side='source', args=(), tls=None):
        """Start one more vmigd in side's namespace (its own control socket and log, name
        NAME); it is stopped with the testbed."""
        addr = self.net.source_addr if side == 'source' else self.net.target_addr
        d = Daemon(self.binary[side], self.vmigctl, name, self.workdir, addr,
                   self.daemon_prefix(side, name), list(args), tls=tls)
        self.extra_daemons.append(d)
        return d.start()

    def replace_daemon(self, side, args=None, tls=None, name=None, killed=False):
        """Stop side's daemon and start a new one in its place (new log NAME, default
        vmigd-SIDE-2, ...) with args (default: the testbed's) and tls (default: the same files);
        tb.source / tb.target then name the new one. killed: the old one was killed on purpose
        (kill -9), so its exit status is not checked."""
        old = self.source if side == 'source' else self.target
        rc = old.stop()
        if rc != 0 and not killed:
            raise HarnessError(f'{old.name} exited {rc} after SIGTERM:\n{tail(old.log_path)}')
        self._replaced += 1
        d = Daemon(self.binary[side], self.vmigctl, name or f'vmigd-{side}-{self._replaced + 1}',
                   self.workdir, old.listen_addr, old.prefix,
                   self.daemon_args[side] if args is None else list(args),
                   tls=old.tls if tls is None else tls)
        self.retired.append(old)
        if side == 'source':
            self.source = d
        else:
            self.target = d
        return d.start()

    def takeover(self, side, name=None, args=None, tls=None, timeout=20):
        """Start a new vmigd with --takeover on side's control socket (same namespace, same
        options unless args) and wait until it has taken over: its status answers with its own
        pid. tls: the new one's (None: the old one's; False: --no-tls). tb.source / tb.target
        then name the new one; the old one, in tb.retired, carries what it had and exits on its
        own (wait_retired())."""
        old = self.source if side == 'source' else self.target
        self._replaced += 1
        d = Daemon(self.binary[side], self.vmigctl, name or f'vmigd-{side}-{self._replaced + 1}',
                   self.workdir, old.listen_addr, old.prefix,
                   [*(self.daemon_args[side] if args is None else args), '--takeover'],
                   tls=old.tls if tls is None else (tls or None))
        d.control = old.control
        with open(d.log_path, 'ab') as logf:
            d.proc = subprocess.Popen(d.command(), stdin=subprocess.DEVNULL, stdout=logf,
                                      stderr=logf)

        def taken():
            if d.proc.poll() is not None:
                raise HarnessError(f'{d.name}: vmigd --takeover exited {d.proc.returncode}:\n'
                                   f'{tail(d.log_path)}')
            return d.log_matches(r'takeover: took over from vmigd pid')
        wait_until(taken, timeout, f'{d.name} to take over from {old.name}', interval=0.05)
        self.retired.append(old)
        if side == 'source':
            self.source = d
        else:
            self.target = d
        return old

    @staticmethod
    def wait_retired(old, timeout=60):
        """Wait for a vmigd that handed over to exit on its own; its exit status (0 expected)."""
        try:
            return old.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise HarnessError(f'{old.name}: still running {timeout} s after it handed over:\n'
                               f'{tail(old.log_path)}') from None

    def dump_logs(self, lines=40):
        files = [d.log_path for d in (*self.retired, self.source, self.target,
                                      *self.extra_daemons) if d is not None]
        files += [q.log_path for q in self.qemus[-2:]]
        files += [q.serial_path for q in self.qemus[-2:] if q.guest is not None]
        try:
            for path in files:
                sys.stdout.write(f'--- tail of {path}\n{tail(path, lines)}')
            sys.stdout.flush()
        except OSError:                    # stdout gone (closed pipe): the logs cannot be shown
            pass

    def new_key(self, label='m'):
        self._keys += 1
        return f'{label}-{os.getpid()}-{self._keys}'

    def qemu_pair(self, size_mib, ram_variant=0, private=False, steady=False, guest=None,
                  src_args=(), qemu=None, reserve=True, sparse_dir=None, hugepages=False,
                  ram_file=None):
        """Start a source QEMU (source namespace) and a destination QEMU (target namespace).
        steady=True, for rate measurements: the destination's RAM is allocated at start
        (prealloc=on) and the source's RAM file read into the page cache, so that neither
        QEMU stalls on first touches or the disk while the migration runs. guest: a GuestSpec
        (or dict) to boot the test guest on both (see Qemu); both stay paused until
        src.start_guest(). src_args: more QEMU arguments for the source (a QMP socket of
        vmigd's own, say). qemu: a QEMU binary for both sides instead of the testbed's.
        ram_file: the source's RAM image instead of random bytes (realistic_ram_file())."""
        self._pairs += 1
        src_bin, dst_bin = (qemu, qemu) if qemu else (self.qemu, self.qemu_dst)
        machine = machine_for(src_bin, dst_bin) if qemu else self.machine
        pair = (Qemu(f'q{self._pairs}-src', 'source', size_mib, self.workdir,
                     self.net.prefix('source'), src_bin, extra_args=src_args,
                     ram_variant=ram_variant, private=private, guest=guest, machine=machine,
                     reserve=reserve, sparse_dir=sparse_dir, hugepages=hugepages,
                     ram_file=ram_file),
                Qemu(f'q{self._pairs}-dst', 'destination', size_mib, self.workdir,
                     self.net.prefix('target'), dst_bin, prealloc=steady, guest=guest,
                     machine=machine, reserve=reserve, sparse_dir=sparse_dir,
                     hugepages=hugepages))
        for q in pair:
            self.qemus.append(q)
            q.start()
        if steady:
            pair[0].warm_ram()
        return pair

    def close_qemus(self, *qemus):
        for q in qemus:
            q.close()
            self.qemus.remove(q)
            for path in (q.log_path, q.qmp_path, q.serial_path):
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

    def start_route(self, key, dst_path, delay_first_ms=None):
        """A migration KEY with no QEMU: `target start` to the unix socket dst_path and `source
        start`; the source's socket path (connect to it in the source namespace).
        delay_first_ms: --test-delay-first, which only vmigd-test takes (source_vmigd)."""
        raw, _ = self.target.target_start(key, {DEFAULT_PORT_ID: dst_path})
        return self.source.source_start(key, raw, self.path('src'), delay_first_ms)[0]

    def unix_server(self, name, handler, conns=1, timeout=60):
        """A UnixServer at WORKDIR/dst/NAME in the target namespace, where a destination QEMU
        would listen."""
        return UnixServer(self.net, 'target', self.path('dst', name), handler, conns, timeout)

    def stop_daemons(self):
        """SIGTERM both daemons; HarnessError unless both exit 0."""
        for d in (self.source, self.target):
            rc = d.stop()
            if rc != 0:
                raise HarnessError(f'{d.name} exited {rc} after SIGTERM:\n{tail(d.log_path)}')
