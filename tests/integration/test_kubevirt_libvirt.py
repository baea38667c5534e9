#!/usr/bin/env python3
"""virt-launcher's own call through vmigd: two throw-away libvirtds in private mount
namespaces stand for the source and target virt-launcher pods (vmigtest.virt, .virtmigrate),
two vmigd in two network namespaces for the two virt-handlers, and a peer-to-peer
virDomainMigrateToURI3 (virsh migrate --p2p) wired exactly as KubeVirt wires it
(kubevirt-dropin.md §1):
- target: `vmigctl target start KEY --kubevirt --socket 0=/proc/PID/root/run/libvirt/libvirt-sock
  --socket 49152=/proc/PID/root/<run>/migrationproxy/KEY-49152-source.sock --socket 49153=...
  KEY-49153-source.sock` (PID: the target libvirtd; <run>, /run/libvirt/kv, stands for the
  launcher's /var/run/kubevirt), which prints KubeVirt's map;
- source: `vmigctl source start KEY --target <that map> --dir /proc/PID/root/<run>` (PID: the
  source libvirtd), which makes KEY-source.sock, KEY-49152-source.sock, KEY-49153-source.sock;
- libvirt: VIR_MIGRATE_LIVE | PEER2PEER | PERSIST_DEST with the dconnuri
  qemu+unix:///system?socket=<run>/migrationproxy/KEY-source.sock (port 0: the source libvirtd's
  RPC connection to the destination libvirtd), VIR_MIGRATE_PARAM_URI unix://<run>/...
  KEY-49152-source.sock (the main channel and, with ParallelConnections, the multifd channels),
  VIR_MIGRATE_PARAM_DISKS_URI unix://<run>/...KEY-49153-source.sock with MIGRATE_DISKS vda
  (NBD). libvirt's destination listens on the same paths in its own namespace (the migration URI's
  path for QEMU's incoming socket, the disks URI's for the NBD server): exactly where the target
  vmigd dials them through /proc/PID/root. KEY is a UUID, as a VMI UID.
The VM: 128 MiB, the test guest (tests/guest) writing a 48 MiB working set at 4 MiB/s, RAM in a
shared file (so that the test reads both sides' memory), a raw 8 MiB virtio disk of known
pseudo-random content (the destination's copy is an empty file of that size, as a target launcher
prepares it). The source vmigd caps the migration at 16 MiB/s so that its memory phase lasts
seconds, and while it runs QEMU writes 512 KiB into the disk (qemu-io on the guest's device, so
through the mirror). With VIR_MIGRATE_PAUSED the destination stays paused at the end, so that
its RAM is compared with the source's (the source's file kept by a hard link): byte for byte.

Two migrations, each of a fresh domain, source to target:
1. TLS between two vmigd (KubeVirt's identities: the source presents the migration client
   certificate, the target its node certificate): ALPN vmigd/1 keeps the preamble and the order;
   4 parallel connections; VIR_MIGRATE_NON_SHARED_DISK.
2. plain text on both starts (`--no-tls`, KubeVirt's disableTLS), which makes KubeVirt mode
   raw, as a stock virt-handler speaks; VIR_MIGRATE_NON_SHARED_INC, KubeVirt's own block flag.
   Parallel connections only with a QEMU of 8.0 or later: a raw relay keeps no order, and QEMU
   7.2's destination takes the first connection to arrive as the main channel (doc/design.md,
   "Raw").
Each: virsh migrate succeeds; the source domain is shut off (migrated) and its QEMU gone; the
domain is persistent and paused on the target, its RAM equal to the source's final RAM, its disk
exactly the pattern plus the write; resumed, it runs and its guest's status lines carry on from
the source's; both vmigd logged linked connections on all three logical ports (1 libvirt, 1 + N
QEMU, 1 NBD) with wire=vmigd over TLS (peer names checked) or wire=raw tls=off, and after
`source stop`/`target stop` stop lines with outcome=ok, as many connections as were linked and
the same bytes each way on both; the source sockets are gone. At the end nothing is left: no
QEMU, no migration in either daemon, both daemons exit 0.
About 25 s with libvirt's QEMU capabilities cached (/var/tmp/vmig-libvirt-cache)."""

import collections
import hashlib
import os
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

kv = vt.virtmigrate

DOM = 'kvlv'
MEMORY_MIB = 128
GUEST_ARGS = 'ws=48 rate=4 fill=1'
DISK = f'{kv.IMAGES}/{DOM}-disk0.img'       # the same path in both launchers
DISK_BYTES = 8 << 20
SERIAL = f'/var/log/libvirt/{DOM}.serial'
CAP = '16Mi'                # the source vmigd's cap: a memory phase of a few seconds
PARALLEL = 4
WRITE = (0x5A, 1 << 20, 512 << 10)          # byte, offset, length written mid-migration
CACHE_DIR = '/var/tmp/vmig-libvirt-cache'


def serial_reports(launcher):
    """The guest's status lines (GuestReport) in a launcher's serial file."""
    try:
        with open(launcher.root(SERIAL), errors='replace') as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [r for r in map(vt.qemu.parse_guest_report, lines) if r]


def serial_errors(launcher):
    try:
        with open(launcher.root(SERIAL), errors='replace') as f:
            return [line for line in f if 'error' in line]
    except OSError:
        return []


def fresh_domain(a, b, key, guest, work):
    """The VM, defined and started anew on the source launcher a: its disk written with the
    pattern of key, the target's copy an empty file of the same size; returns the disk content."""
    for launcher in (a, b):
        kv.remove_domain(launcher.lv, DOM)
    content = bytearray(kv.disk_pattern(key, DISK_BYTES))
    os.makedirs(a.root(kv.IMAGES), exist_ok=True)
    os.makedirs(b.root(kv.IMAGES), exist_ok=True)
    with open(a.root(DISK), 'wb') as f:
        f.write(content)
    with open(b.root(DISK), 'wb') as f:
        f.truncate(DISK_BYTES)
    xml = os.path.join(work, f'{DOM}.xml')
    with open(xml, 'w') as f:
        f.write(kv.domain_xml(DOM, guest, GUEST_ARGS, MEMORY_MIB, DISK, SERIAL))
    a.lv.virsh('define', xml)
    a.lv.virsh('start', DOM)
    vt.wait_until(lambda: serial_reports(a), 30, 'the guest\'s first status line on the source')
    return content


def linked_by_port(daemon, key, role):
    groups = collections.defaultdict(list)
    for rec in daemon.linked(key, role):
        groups[rec['port']].append(rec)
    return groups


def migrate(tb, a, b, guest, tls, parallel, storage, check):
    """One migration of a fresh domain from a to b through the two vmigd, KubeVirt's way; the
    checks of the module's docstring. A one-line summary."""
    key = str(uuid.uuid4())
    content = fresh_domain(a, b, key, guest, tb.workdir)
    vt.log(f'  key {key}; domain {DOM} running on the source ({kv.domstate(a.lv, DOM)})')
    kept_ram = a.root(f'/var/lib/libvirt/{key}-source.ram')
    try:
        return transfer(tb, a, b, key, tls, content, kept_ram, parallel, storage, check)
    finally:
        if os.path.exists(kept_ram):
            os.unlink(kept_ram)
        for daemon, role in tb.sides():          # after a failure: the daemons' side of it
            if any(m.get('key') == key for m in daemon.migrations()):
                vt.stop_quietly(key, *((daemon, None) if role == 'source' else (None, daemon)))


def transfer(tb, a, b, key, tls, content, kept_ram, parallel, storage, check):
    """migrate()'s part from `target start` on; kept_ram: where to keep the source's RAM."""
    mode = 'TLS' if tls else 'plain'
    tls_args = [] if tls else ['--no-tls']

    # virt-handler's part: the target's listeners, published as KubeVirt's map; the source's
    # sockets in the source launcher's migrationproxy/.
    sockets = b.target_sockets(key)
    raw, target = tb.target.target_start(key, sockets, extra=['--kubevirt', *tls_args])
    vt.log(f'  target start: {raw}')
    ports = target.get('targetDirectMigrationNodePorts') or {}
    check(target.get('targetNodeAddress') == tb.net.target_addr and
          sorted(ports.values()) == sorted(kv.KUBEVIRT_PORTS) and
          all(p.isdigit() for p in ports) and target.get('tls') is tls,
          f'{mode}: target start printed KubeVirt\'s map for ports 0, 49152, 49153: {raw}')
    paths = tb.source.source_start(key, raw, a.root(kv.LAUNCHER_RUN), bandwidth=CAP,
                                   extra=tls_args)
    want = {a.root(kv.proxy_socket(key, p)) for p in kv.KUBEVIRT_PORTS}
    check(set(paths) == want, f'{mode}: source start made KubeVirt\'s three sockets: {paths}')

    # The source's RAM outlives its QEMU through a hard link (the file is shared memory; a
    # link within the launcher's /var/lib/libvirt, the same mount).
    src_pids = a.domain_pids()
    os.link(a.ram_file(DOM), kept_ram)
    argv = kv.migrate_argv(a.lv.uri, DOM, key, parallel, storage, suspend=True)
    vt.log(f'  {" ".join(argv)}')
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        # libvirt starts the memory migration once the disk mirror is ready; a write then must
        # reach the destination through the mirror.
        def memory_phase():
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise vt.HarnessError(f'virsh migrate exited {proc.returncode} before the '
                                      f'memory phase: {(out + err).strip()}')
            j = kv.job_info(a.lv, DOM)
            return j if 'Memory processed' in j else None
        job = vt.wait_until(memory_phase, 60, 'the migration\'s memory phase', 0.05)
        byte, offset, length = WRITE
        kv.hmp_write(a.lv, DOM, byte, offset, length)
        content[offset:offset + length] = bytes([byte]) * length
        state = kv.domstate(a.lv, DOM)
        after = kv.job_info(a.lv, DOM)
        check(state.startswith('running') and after.get('Operation') == 'Outgoing migration',
              f'{mode}: {length >> 10} KiB written into the disk during the memory phase, '
              f'before the switchover (at {job.get("Time elapsed")}, memory processed '
              f'{job.get("Memory processed")}, file processed {job.get("File processed")}; '
              f'then {state})')
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    seconds = time.monotonic() - started
    if not check(proc.returncode == 0, f'{mode}: virsh migrate succeeded in {seconds:.1f} s '
                 f'({(out + err).strip()!r})'):
        raise vt.HarnessError(f'virsh migrate exited {proc.returncode}')

    # Where the VM is.
    src_state, dst_state = kv.domstate(a.lv, DOM), kv.domstate(b.lv, DOM)
    check(src_state == 'shut off (migrated)', f'{mode}: source domain {src_state!r}')
    check(dst_state.startswith('paused'), f'{mode}: target domain {dst_state!r} '
          '(VIR_MIGRATE_PAUSED)')
    check(kv.is_persistent(b.lv, DOM), f'{mode}: the domain is persistent on the target')
    vt.wait_until(lambda: not any(kv.qemu_alive(p) for p in src_pids), 30,
                  'the source QEMU to exit')
    check(not a.domain_pids(), f'{mode}: the source QEMU ({src_pids}) is gone')

    # Memory: the destination's RAM file against the source's final one, byte for byte.
    dst_ram = b.ram_file(DOM)
    src_digest, dst_digest = kv.file_digest(kept_ram), kv.file_digest(dst_ram)
    same = (os.path.getsize(kept_ram) == os.path.getsize(dst_ram) == MEMORY_MIB << 20 and
            src_digest == dst_digest)
    detail = '' if same else ' differing pages %s (%d)' % kv.first_difference(kept_ram, dst_ram)
    check(same, f'{mode}: guest RAM equal on both sides ({MEMORY_MIB} MiB, sha256 '
          f'{dst_digest[:12]}){detail}')
    os.unlink(kept_ram)

    # Disk: the pattern and the write, on the target's own copy.
    disk_digest = kv.file_digest(b.root(DISK))
    check(disk_digest == hashlib.sha256(content).hexdigest() and
          os.path.getsize(b.root(DISK)) == DISK_BYTES,
          f'{mode}: the target\'s disk holds the pattern and the write ({DISK_BYTES >> 20} MiB, '
          f'sha256 {disk_digest[:12]})')

    # It runs on the target, and the guest carries on.
    last = serial_reports(a)[-1]
    b.lv.virsh('resume', DOM)
    state = kv.domstate(b.lv, DOM)
    check(state.startswith('running'), f'{mode}: resumed, the domain runs on the target '
          f'({state})')
    report = vt.wait_until(lambda: [r for r in serial_reports(b) if r.t_ms > last.t_ms], 15,
                           'a status line of the guest on the target after the source\'s last')
    errors = serial_errors(a) + serial_errors(b)
    check(not errors and report[0].passes >= last.passes and report[0].pages > last.pages,
          f'{mode}: the guest carries on: source\'s last t={last.t_ms}ms pages={last.pages}, '
          f'target\'s next t={report[0].t_ms}ms pages={report[0].pages} {errors or ""}')

    # vmigd: every logical port linked, the stop lines.
    tb.source.source_stop(key)
    tb.target.target_stop(key)
    expect = {kv.LIBVIRT_PORT: 1, kv.MIGRATION_PORT: 1 + parallel, kv.BLOCK_PORT: 1}
    records = {}
    for daemon, role in tb.sides():
        groups = linked_by_port(daemon, key, role)
        counts = {port: len(groups.get(port, [])) for port in expect}
        check(counts == expect, f'{mode}: {daemon.name} linked connections per logical port '
              f'{counts}, expected {expect}')
        recs = [r for g in groups.values() for r in g]
        if tls:
            peer = vt.CLIENT_CN if role == 'target' else vt.NODE_CN
            good = all(r.get('wire') == 'vmigd' and r.get('tls', '').startswith('TLS') and
                       r.get('peer') == f'/CN={peer}' for r in recs)
        else:
            good = all(r.get('wire') == 'raw' and r.get('tls') == 'off' for r in recs)
        check(recs and good, f'{mode}: {daemon.name}: all linked '
              f'{"wire=vmigd over TLS, peer " + peer if tls else "wire=raw tls=off"}: '
              f'{sorted({(r.get("wire"), r.get("tls"), r.get("peer")) for r in recs})}')
        stop = daemon.stop_record(key, role)
        records[role] = stop
        check(stop.get('outcome') == 'ok' and int(stop.get('conns', -1)) == len(recs),
              f'{mode}: {daemon.name} stop line: {stop}')
        check(not any(m.get('key') == key for m in daemon.migrations()),
              f'{mode}: {daemon.name} has no migration {key} left')
    s, t = records.get('source', {}), records.get('target', {})
    check(s.get('tx') == t.get('rx') and s.get('rx') == t.get('tx'),
          f'{mode}: the same bytes each way on both daemons: source tx={s.get("tx")} '
          f'rx={s.get("rx")}, target rx={t.get("rx")} tx={t.get("tx")}')
    check(not any(os.path.exists(p) for p in paths), f'{mode}: the source sockets are gone')
    return (f'{seconds:.1f} s, {int(s.get("bytes", 0)) / vt.MIB:.1f} MiB through vmigd, '
            f'reordered={records["target"].get("reordered")}, parallel {parallel}, '
            f'storage {storage}')


def nothing_left(tb, a, b, check):
    """The domain destroyed on the target: no QEMU of either launcher, no migration in either
    daemon."""
    kv.remove_domain(b.lv, DOM)
    kv.remove_domain(a.lv, DOM)
    vt.wait_until(lambda: not a.domain_pids() and not b.domain_pids(), 30,
                  'every QEMU of the two launchers to exit')
    for daemon, _ in tb.sides():
        left = [(m.get('key'), m.get('role')) for m in daemon.migrations()]
        check(not left, f'{daemon.name}: no migrations left ({left})')
    return 'no QEMU, no migrations'


def main():
    vt.virt.check_possible()
    guest = os.path.abspath(vt.guest_binary())
    version = vt.qemu_version(vt.virt.QEMU) or (0, 0, 0)
    raw_parallel = PARALLEL if version >= (8, 0, 0) else 0
    os.makedirs(CACHE_DIR, exist_ok=True)
    t0 = time.monotonic()
    checks = vt.Checks('KubeVirt libvirt checks')

    def check(cond, what):
        """checks.check(), and an ok line; returns cond."""
        if checks.check(cond, what):
            vt.log(f'    ok: {what}')
        return cond
    with vt.work_directory('vmig-kvlv-pki-') as pkidir:
        pki = vt.make_pki(pkidir)
        # KubeVirt's identities: the source dials with the migration client certificate, the
        # target serves its node certificate; each side accepts only the other's name.
        with vt.Testbed(tls=pki, source_tls={**pki.paths('node'), 'client_cert': pki.client.cert,
                                            'client_key': pki.client.key},
                        source_args=['--tls-allow-server', vt.NODE_CN],
                        target_args=['--tls-allow-client', vt.CLIENT_CN]) as tb:
            vt.log(f'virt-launcher\'s libvirt call through vmigd: {tb.describe()}; QEMU '
                   f'{".".join(map(str, version))}; guest {guest} {GUEST_ARGS!r}')
            with vt.virt.Libvirtd(tb.path('a'), 'a', CACHE_DIR) as lva, \
                    vt.virt.Libvirtd(tb.path('b'), 'b', CACHE_DIR) as lvb:
                a, b = kv.Launcher(lva), kv.Launcher(lvb)
                a.prepare_run_dir(target=False)
                b.prepare_run_dir(target=True)
                vt.log(f'two libvirtds up in {time.monotonic() - t0:.1f} s: source launcher '
                       f'pid {a.pid}, target launcher pid {b.pid}')
                if not raw_parallel:
                    vt.log(f'note: QEMU {".".join(map(str, version))} < 8.0: the raw migration '
                           'runs without parallel connections (no order on a raw relay)')
                for name, args in (
                        ('TLS, vmigd to vmigd, 4 parallel connections, NON_SHARED_DISK',
                         (True, PARALLEL, 'all')),
                        (f'plain text (raw), {raw_parallel or "no"} parallel connections, '
                         'NON_SHARED_INC', (False, raw_parallel, 'inc'))):
                    vt.log(f'[{name}]')
                    checks.run(name, migrate, tb, a, b, guest, *args, check)
                vt.log('[nothing left]')
                checks.run('nothing left', nothing_left, tb, a, b, check)
            tb.stop_daemons()
            for daemon, _ in tb.sides():
                problems = [line for line in daemon.problem_lines()
                            if 'plain text' not in line]
                check(not problems, f'{daemon.name}: no warnings or errors in its log '
                      f'{problems}')
    vt.log(f'{time.monotonic() - t0:.1f} s')
    checks.finish()


if __name__ == '__main__':
    vt.run_main(main)
