"""Migrations for the tests: QEMU to QEMU directly (a baseline) or through two vmigd daemons the
KubeVirt way (`target start`, `source start`, `migrate`), waiting for completion with the run
states checked, and comparing both sides' memory. Stdlib only."""

import dataclasses
import os
import time

from .base import DEFAULT_PORT_ID, HarnessError, wait_until
from .qemu import VGA_BIOS_WINDOW

DEFAULT_MAX_BANDWIDTH = 100 << 30          # bytes/s; QEMU's default of 128 MiB/s would cap us


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
    'prelaunch', a stopped one 'paused'), except that a 'running' source leaves the destination
    'paused' (it runs with -S: no autostart). Returns the source's final query-migrate, with
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
    expected = 'paused' if src_state == 'running' else src_state
    if dst_state != expected:
        raise HarnessError(f'destination run state {dst_state}, expected {expected}')
    dst_status = dst.migration_info().get('status')
    if dst_status != 'completed':
        raise HarnessError(f'destination migration status {dst_status}, expected completed')
    if src.run_state() != 'postmigrate':
        raise HarnessError(f'source run state {src.run_state()}, expected postmigrate')
    info['_elapsed'] = elapsed
    return info


def wait_failed_at_home(src, timeout=60):
    """Wait until the source QEMU ends its migration as failed with its guest running again at
    home; QEMU's error text. HarnessError (after migrate_cancel) if it is still going after
    timeout s, or if it ended any other way."""
    def ended():
        info = src.migration_info()
        return info if info.get('status') not in ('setup', 'active', 'device') else None
    try:
        info = wait_until(ended, timeout, 'the source QEMU to end the migration', 0.2)
    except HarnessError:
        info = src.migration_info()
        try:
            src.execute('migrate_cancel')
        except HarnessError:
            pass
        raise HarnessError(f'the migration still {info.get("status")} after {timeout}s '
                           '(cancelled)') from None
    if info.get('status') != 'failed':
        raise HarnessError(f'source QEMU says {info.get("status")}, expected failed')
    state = wait_until(lambda: src.run_state() != 'finish-migrate' and src.run_state(), 10,
                       'the source guest to settle')
    if state != 'running':
        raise HarnessError(f'source guest {state} after the failed migration, expected '
                           'running at home')
    return info.get('error-desc', '')


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
        self.started = self.src_state = self.info = None

    def status(self):
        """The source's query-migrate status ('active', 'completed', ...)."""
        return self.src.migration_info().get('status')

    def wait_active(self, timeout=30):
        """Wait until the source's query-migrate says active."""
        wait_until(lambda: self.status() == 'active', timeout, 'the migration to become active')

    def wait(self, timeout=300):
        """Wait for completion and check run states (see wait_migration()), without stopping
        the daemons' side of it: the source's final query-migrate. finish() after it does not
        wait again."""
        if self.info is None:
            self.info = wait_migration(self.src, self.dst, timeout, self.started, self.src_state)
        return self.info

    def finish(self, timeout=300):
        """Wait for completion, check run states, `source stop` and `target stop`; the result."""
        info = self.wait(timeout)
        self.source_daemon.source_stop(self.key)
        self.target_daemon.target_stop(self.key)
        return _result(self.key, self.channels, self.src, info, source_sockets=self.sockets,
                       target=self.target)

    def finish_verified(self, timeout=300, unverified_ok=False):
        """finish(), then both sides' guest memory compared, and both daemons' stop lines: the
        same `verified=N/N` and `digest=` (see check_digests()); (MigrationResult, sha256)."""
        result = self.finish(timeout)
        digest = verify_memory(self.src, self.dst)
        self.check_digests(unverified_ok=unverified_ok)
        return result, digest

    def check_digests(self, timeout=15, unverified_ok=False):
        """Both daemons' stop lines for this migration say every connection's digests matched
        the peer's (`verified=N/N`, N the connections carried) with the same `digest=`, or,
        when no connection had digests (a stock peer), `verified=none` on both. A target's
        line may wait up to 3 s for a report, hence the timeout. unverified_ok (a target taken
        over mid-migration, whose successor cannot answer the reports): only no corruption.
        Returns the digest (or 'none'; also with a stock peer on either side, which keeps
        none)."""
        sides = ((self.source_daemon, 'source'), (self.target_daemon, 'target'))
        if not all(hasattr(d, 'stop_record') for d, _ in sides):
            return 'none'
        recs = {role: d.stop_record(self.key, role, timeout=timeout)
                for d, role in sides}
        s, t = recs['source'], recs['target']
        if unverified_ok:
            bad = [f'{role} outcome={r.get("outcome")}' for role, r in recs.items()
                   if r.get('outcome') == 'corrupt']
            if bad:
                raise HarnessError(f'{self.key}: {", ".join(bad)}')
            return s.get('digest', 'none')
        if s.get('verified') == 'none' and t.get('verified') == 'none':
            return 'none'
        m, _, n = s.get('verified', '?').partition('/')
        if (s.get('verified') != t.get('verified') or m != n or n != s.get('conns') or
                s.get('digest') != t.get('digest') or not s.get('digest')):
            raise HarnessError(f'{self.key}: connection digests do not prove the bytes: source '
                               f'conns={s.get("conns")} verified={s.get("verified")} '
                               f'digest={s.get("digest")} outcome={s.get("outcome")}, target '
                               f'conns={t.get("conns")} verified={t.get("verified")} '
                               f'digest={t.get("digest")} outcome={t.get("outcome")}')
        return s['digest']

    def stop_records(self):
        """Both daemons' stop lines for this migration (see Daemon.stop_record()):
        [(daemon, role, fields)], source first."""
        return [(d, role, d.stop_record(self.key, role))
                for d, role in ((self.source_daemon, 'source'), (self.target_daemon, 'target'))]


def start_via_daemons(src, dst, source_daemon, target_daemon, key, basedir, target_sock,
                      channels=0, max_bandwidth=DEFAULT_MAX_BANDWIDTH, delay_first_ms=None,
                      port_id=DEFAULT_PORT_ID, bandwidth=None, target_bandwidth=None,
                      source_args=(), target_args=(), between=None):
    """The KubeVirt-style flow: dst listens on target_sock, `target start` on the target daemon,
    `source start` with its JSON on the source daemon, src migrates to the socket that returns.
    bandwidth / target_bandwidth: the daemons' per-migration cap (`--bandwidth RATE` on `source
    start` / `target start`; None: none); source_args, target_args: more `source start` and
    `target start` arguments (--kubevirt, --no-tls); between: called with no argument after
    `target start`, before `source start`. Returns the DaemonMigration once `migrate` is
    issued."""
    m = DaemonMigration(src, dst, source_daemon, target_daemon, key, channels)
    m.target_sock = target_sock
    configure_migration(src, dst, channels, max_bandwidth)
    dst.execute('migrate-incoming', {'uri': f'unix:{target_sock}'})
    m.target_raw, m.target = target_daemon.target_start(key, {port_id: target_sock},
                                                        bandwidth=target_bandwidth,
                                                        extra=target_args)
    if between:
        between()
    m.sockets = source_daemon.source_start(key, m.target_raw, basedir, delay_first_ms,
                                           bandwidth=bandwidth, extra=source_args)
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
    """Compare guest RAM of both sides; the common sha256, or HarnessError that says which
    pages differ."""
    a, b = src.memory_digest(), dst.memory_digest()
    if a != b:
        raise HarnessError(f'guest memory differs: source {a} destination {b}; '
                           f'{memory_difference(src, dst)}')
    return a


def differing_pages(a, b, page=4096, skip=None):
    """Offsets of the pages that differ between files a and b, in order; skip: an offset range
    (start, end) left out."""
    with open(a, 'rb') as fa, open(b, 'rb') as fb:
        offset = 0
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if not x and not y:
                return
            if x != y:
                for i in range(0, max(len(x), len(y)), page):
                    if skip and skip[0] <= offset + i < skip[1]:
                        continue
                    if x[i:i + page] != y[i:i + page]:
                        yield offset + i
            offset += len(x)


def memory_difference(src, dst, page=4096, shown=8):
    """Dump both RAMs again and say which 4 KiB pages differ (count, first few ranges, bytes
    differing in the first page), outside the VGA/BIOS window. The dumps are kept with
    VMIG_KEEP=1."""
    paths = [os.path.join(q.workdir, f'{q.name}.diff.mem') for q in (src, dst)]
    try:
        for q, path in zip((src, dst), paths):
            q.memory_dump(path)
        ranges, count = [], 0
        for p in differing_pages(*paths, page, VGA_BIOS_WINDOW):
            count += 1
            if ranges and ranges[-1][1] == p:
                ranges[-1][1] = p + page
            else:
                ranges.append([p, p + page])
        if not count:
            return 'the second dumps are equal (the RAM changed between the dumps)'
        pages = []
        for path in paths:
            with open(path, 'rb') as f:
                f.seek(ranges[0][0])
                pages.append(f.read(page))
        nbytes = sum(1 for u, v in zip(*pages) if u != v)
        where = ', '.join(f'{a:#x}-{b:#x}' for a, b in ranges[:shown])
        more = f' and {len(ranges) - shown} more ranges' if len(ranges) > shown else ''
        return (f'{count} pages differ in {len(ranges)} ranges: {where}{more}; '
                f'{nbytes} bytes differ in the page at {ranges[0][0]:#x}')
    except (OSError, HarnessError) as e:
        return f'no page comparison: {e}'
    finally:
        if not os.environ.get('VMIG_KEEP'):
            for path in paths:
                if os.path.exists(path):
                    os.unlink(path)
