"""vmigd daemons for the tests: starting one (plain or TLS), vmigctl calls on its control socket,
its log (stop lines, `linked` lines, warnings) and its status JSON. Every read of `vmigctl status
--json` goes through the status_* functions here, so that a moved key is one change. Stdlib
only."""

import json
import os
import re
import signal
import subprocess

from .base import REPO_ROOT, HarnessError, Skip, log, stop_process, tail, wait_until
from .tls import tls_paths


class VmigctlError(HarnessError):
    """vmigctl exited non-zero; carries the completed process."""

    def __init__(self, proc):
        super().__init__(f'vmigctl {" ".join(proc.args[3:])} exited {proc.returncode}: '
                         f'{proc.stderr.strip()}')
        self.proc = proc


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


def find_test_daemon(build_dir=None):
    """vmigd-test, the daemon with its test machinery (--dpdk-test-impair, --test-wedge,
    source-start's test_delay_first_ms): from $VMIGD_TEST,
    else beside $VMIGD, else from build_dir (default REPO/build); Skip if not built."""
    path = os.environ.get('VMIGD_TEST')
    if not path and os.environ.get('VMIGD'):
        path = os.path.join(os.path.dirname(os.environ['VMIGD']), 'vmigd-test')
    if not path:
        path = os.path.join(build_dir or os.path.join(REPO_ROOT, 'build'), 'vmigd-test')
    if not os.access(path, os.X_OK):
        raise Skip(f'{path} not built (meson setup build && ninja -C build, or set VMIGD_TEST)')
    return path


class Daemon:
    """One vmigd, optionally in a network namespace, and vmigctl wrappers for its control socket.
    vmigctl itself runs in our namespace: the control socket is a filesystem object.
    tls: None for --no-tls (the default), else what tls_paths() takes (a PKI, a CertFiles, a
    dict of cert/key/ca paths): the daemon then starts with --tls-cert/--tls-key/--tls-ca."""

    def __init__(self, vmigd, vmigctl, name, workdir, listen_addr, prefix=(), extra_args=(),
                 tls=None):
        self.vmigd, self.vmigctl, self.name = vmigd, vmigctl, name
        self.listen_addr = listen_addr
        self.control = os.path.join(workdir, f'{name}.ctl')
        self.log_path = os.path.join(workdir, f'{name}.log')
        self.prefix, self.extra_args = list(prefix), list(extra_args)
        self.tls = tls
        self.proc = None

    def tls_args(self):
        """['--no-tls'] without tls, else the --tls-* options for its files."""
        if not self.tls:
            return ['--no-tls']
        paths = tls_paths(self.tls)
        args = ['--tls-cert', paths['cert'], '--tls-key', paths['key'], '--tls-ca', paths['ca']]
        if paths.get('client_cert'):
            args += ['--tls-client-cert', paths['client_cert'],
                     '--tls-client-key', paths['client_key']]
        return args

    def command(self):
        # Tests pace their migrations with caps (to watch them, to cut their node hops mid-way,
        # to make them need convergence control): the daemon's default `--compress auto` would
        # let a capped migration of compressible memory finish in half the time. Compression is
        # off unless a test asks for it (test_compress does).
        compress = ([] if any(a == '--compress' or a.startswith('--compress=')
                              for a in self.extra_args) else ['--compress', 'off'])
        return self.prefix + [self.vmigd, '--control', self.control, '--listen',
                              f'{self.listen_addr}:0', *self.tls_args(), '--log-level', 'info',
                              *compress, *self.extra_args]

    def start(self, timeout=15):
        """Start vmigd and wait until `vmigctl status --json` answers."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self):
        """Start vmigd without waiting for it (wait_ready() does)."""
        cmd = self.command()
        with open(self.log_path, 'ab') as logf:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
        return self

    def wait_ready(self, timeout=15):
        """Wait until the launched vmigd answers `vmigctl status --json`."""
        def ready():
            if self.proc.poll() is not None:
                raise HarnessError(f'{self.name}: vmigd exited {self.proc.returncode} at '
                                   f'start-up:\n{tail(self.log_path)}')
            return self.ctl('status', '--json', timeout=5).returncode == 0
        wait_until(ready, timeout, f'{self.name} vmigd to answer status', interval=0.1)
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def sighup(self):
        """Send SIGHUP (vmigd re-reads its TLS files). `ip netns exec` execs vmigd, so the pid we
        started is vmigd's own."""
        if not self.alive():
            raise HarnessError(f'{self.name}: not running, cannot send SIGHUP')
        self.proc.send_signal(signal.SIGHUP)

    def log_offset(self):
        """The log's current size: pass it as since= to look only at lines written after now."""
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def log_since(self, since=0):
        with open(self.log_path, 'rb') as f:
            f.seek(since)
            return f.read().decode(errors='replace')

    def log_matches(self, pattern, since=0):
        """re.Match objects for every log line (written at or after offset since) matching
        pattern."""
        rx = re.compile(pattern)
        return [m for m in (rx.search(line) for line in self.log_since(since).splitlines()) if m]

    def wait_log(self, pattern, timeout=10, since=0, what=None):
        """Wait for a log line (at or after offset since) matching the regex; its re.Match."""
        def find():
            found = self.log_matches(pattern, since)
            return found[0] if found else None
        try:
            return wait_until(find, timeout, what or f'{self.name}: log line /{pattern}/',
                              interval=0.1)
        except HarnessError as e:
            raise HarnessError(f'{e}; last lines:\n{tail(self.log_path, 15)}') from None

    def status_field(self, name):
        """One figure of status (see status_field())."""
        return status_field(self.status(), name)

    def node_hop(self):
        """(address, port) of the node-hop listener, from status."""
        addr, _, port = self.status_field('listen').rpartition(':')
        return addr.strip('[]'), int(port)

    def tls_status(self):
        """status's "tls" object ({} when the daemon reports none, or only a boolean)."""
        value = self.status_field('tls')
        return value if isinstance(value, dict) else {}

    def linked(self, key, role=None, since=0):
        """The `linked` lines about migration KEY parsed by parse_linked(), in log order."""
        out = []
        for line in self.log_since(since).splitlines():
            rec = parse_linked(line)
            if rec and rec['key'] == key and (role is None or rec['role'] == role):
                out.append(rec)
        return out

    def connections(self, key):
        """status's per-connection list for migration KEY (see migration_connections())."""
        return migration_connections(self.status(), key)

    def migration_status(self, key, role=None):
        """status's entry for migration KEY (in role ROLE, if given), or None."""
        return status_migration(self.status(), key, role)

    def migrations(self):
        """status's per-migration entries (see status_migrations())."""
        return status_migrations(self.status())

    def convergence(self, key):
        """status's convergence object of source migration KEY (`source start --qmp` or
        `--libvirt-domain`); HarnessError when KEY is not listed or has none."""
        entry = self.migration_status(key, 'source')
        if entry is None:
            raise HarnessError(f'{key}: not in {self.name}\'s status')
        if entry.get('convergence') is None:
            raise HarnessError(f'{key}: no convergence object in status: {entry}')
        return entry['convergence']

    def stop(self, timeout=30):
        """SIGTERM and wait; returns the exit status (SIGKILL after timeout)."""
        return stop_process(self.proc, timeout)

    def ctl(self, *args, timeout=30, control=None):
        """Run vmigctl against this daemon (or the control socket path control); the
        CompletedProcess (text)."""
        return subprocess.run([self.vmigctl, '-c', control or self.control, *args],
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

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

    def target_start(self, key, sockets, bandwidth=None, extra=()):
        """sockets: {portid: unix path}; bandwidth: a RATE for --bandwidth (None: no option);
        extra: more vmigctl arguments (--kubevirt, --tls, --no-tls). Returns (JSON text exactly
        as printed, parsed dict)."""
        args = list(extra)
        for portid, path in sockets.items():
            args += ['--socket', f'{portid}={path}']
        if bandwidth is not None:
            args += ['--bandwidth', str(bandwidth)]
        raw = self.ctl_ok('target', 'start', key, *args).strip()
        return raw, json.loads(raw)

    def target_stop(self, key):
        self.ctl_ok('target', 'stop', key)

    def source_start(self, key, target_json, basedir, delay_first_ms=None, bandwidth=None,
                     extra=()):
        """Returns the unix socket paths the daemon created, in the order of the target's ports.
        bandwidth: a RATE for --bandwidth (None: no option); extra: more vmigctl arguments
        (convergence: --qmp PATH, --mode, the policy). delay_first_ms: --test-delay-first,
        which only vmigd-test takes (find_test_daemon()); the product refuses the field."""
        args = ['source', 'start', key, '--target', target_json, '--dir', basedir, *extra]
        if delay_first_ms is not None:
            args += ['--test-delay-first', str(delay_first_ms)]
        if bandwidth is not None:
            args += ['--bandwidth', str(bandwidth)]
        return self.ctl_ok(*args).split()

    def source_stop(self, key):
        self.ctl_ok('source', 'stop', key)

    def set_bandwidth(self, key, rate):
        """`vmigctl bandwidth KEY RATE`: change a running migration's cap."""
        self.ctl_ok('bandwidth', key, str(rate))

    def set_node_bandwidth(self, rate):
        """`vmigctl node-bandwidth RATE`: change the node cap."""
        self.ctl_ok('node-bandwidth', str(rate))

    def metrics(self):
        """`vmigctl metrics --json`, parsed: {'ok', 'node': {...}, 'migrations': [...]}."""
        return json.loads(self.ctl_ok('metrics', '--json'))

    def migration_metrics(self, key, metrics=None):
        """The metrics object of migration KEY (from metrics, default a fresh `metrics --json`),
        or None if the daemon does not list it."""
        metrics = self.metrics() if metrics is None else metrics
        for m in metrics.get('migrations') or []:
            if m.get('key') == key:
                return m
        return None

    def metrics_url(self):
        """http://ADDR:PORT/metrics from status's "metrics" (vmigd --metrics), or None."""
        addr = self.status_field('metrics')
        return f'http://{addr}/metrics' if addr else None

    def log_text(self):
        with open(self.log_path, errors='replace') as f:
            return f.read()

    def migration_lines(self, key):
        """This daemon's log lines about migration KEY."""
        return [line for line in self.log_text().splitlines() if f'migration {key} ' in line]

    def stop_record(self, key, role, timeout=15):
        """Wait for `migration KEY role=ROLE stop k=v ...` in the log; its fields as a dict. A
        target's line waits up to 3 s after a connection's end for the source's digest report
        (and a stop gives links 5 s), hence the default."""
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


_LINKED_RE = re.compile(r'migration (\S+) role=(\w+): port (\d+) connection (\d+) linked (.*)$')
_FIELD_RE = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def parse_linked(line):
    """A `migration KEY role=R: port P connection S linked tls=... cipher=... crypto=...
    resumed=yes|no peer="..."` line as a dict (key, role, port, seq, the k=v fields with quotes
    removed, and line); None for any other line."""
    m = _LINKED_RE.search(line)
    if not m:
        return None
    rec = {'key': m.group(1), 'role': m.group(2), 'port': int(m.group(3)),
           'seq': int(m.group(4)), 'line': line}
    for name, value in _FIELD_RE.findall(m.group(5)):
        if value.startswith('"') and value.endswith('"') and len(value) >= 2:
            value = value[1:-1]
        rec[name] = value
    return rec


# The status JSON (`vmigctl status --json`, reply version 2: doc/interfaces.md), named in these
# functions only, so that a moved key is one change here.

def status_field(status, name):
    """A figure of a status object (reply version 2, doc/interfaces.md): the daemon's own (listen,
    tls, pid, metrics, threads...) or the node's (bandwidth, shaper, inspect, conns, under
    "node"). None when absent."""
    node = status.get('node')
    if isinstance(node, dict) and name in node:
        return node[name]
    return status.get(name)


def status_migrations(status):
    """The migration objects of a status object ("migrations"): key, role, state, bytes,
    "connections", convergence... [] when there are none."""
    value = status.get('migrations')
    return value if isinstance(value, list) else []


def status_migration(status, key, role=None):
    """The entry of migration KEY (in role ROLE, if given) in a status object, or None."""
    for entry in status_migrations(status):
        if entry.get('key') == key and (role is None or entry.get('role') == role):
            return entry
    return None


def status_connections(entry):
    """A migration object's connections open now ("connections": port, seq, state, tls, cipher,
    crypto, resumed, bytes_tx, bytes_rx, ...); [] if none."""
    value = entry.get('connections')
    return value if isinstance(value, list) else []


def status_inspect(entry):
    """A migration object's inspector figures ("inspect": ram_total, remaining, passes...), or
    None where the stream is not inspected."""
    value = entry.get('inspect')
    return value if isinstance(value, dict) else None


def status_migration_count(status):
    """How many migrations a status object counts ("node.migration_count")."""
    return (status.get('node') or {}).get('migration_count')


def migration_connections(status, key):
    """The per-connection list of migration KEY in a status object (see status_connections()).
    None if the key is not there, [] if the entry has no such list."""
    entry = status_migration(status, key)
    return None if entry is None else status_connections(entry)


def run_vmigd(vmigd, *args, timeout=20):
    """Run vmigd in the foreground with args (a start-up refusal, -n); the CompletedProcess."""
    return subprocess.run([vmigd, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def stop_quietly(key, source=None, target=None):
    """`source stop KEY` on source and `target stop KEY` on target (either may be None; one
    daemon may be both), logging a failure rather than raising it: clean-up after a migration
    that may have gone already."""
    for daemon, stop in ((source, 'source_stop'), (target, 'target_stop')):
        if daemon is None:
            continue
        try:
            getattr(daemon, stop)(key)
        except HarnessError as e:
            log(f'    {e}')


_STOP_RE = re.compile(r'migration (\S+) role=(source|target) stop (.*)$')


def stop_lines(daemons):
    """Every `migration KEY role=R stop ...` line in the logs of daemons, as (daemon name, key,
    role, fields); the outcome keeps its reason (everything after `outcome=`)."""
    found = []
    for d in daemons:
        if d is None or not os.path.exists(d.log_path):
            continue
        for line in d.log_text().splitlines():
            m = _STOP_RE.search(line)
            if not m:
                continue
            head, _, outcome = m.group(3).partition(' outcome=')
            fields = dict(f.split('=', 1) for f in head.split() if '=' in f)
            fields['outcome'] = outcome
            found.append((d.name, m.group(1), m.group(2), fields))
    return found


def digest_problems(daemons):
    """What the daemons' logs say against the bytes of the migrations they carried: any corrupt
    connection, and for each key stopped once as source and once as target, both ok and at
    least one side with digests, anything but the same `verified=N/N` and `digest=` on both.
    A list of problems; empty when every such migration proved its bytes."""
    problems = []
    by_key = {}
    # A daemon that handed over to another mid-migration (takeover) carried its connections to
    # their end, but their reports reach the new one's listener, which cannot answer for them:
    # those migrations are checked for corruption only.
    retired = {d.name for d in daemons if d is not None and os.path.exists(d.log_path) and
               'handed over: carrying on' in d.log_text()}
    exempt = set()
    for name, key, role, f in stop_lines(daemons):
        if name in retired:
            exempt.add(key)
    for name, key, role, f in stop_lines(daemons):
        if f['outcome'].startswith('corrupt'):
            problems.append(f'{name}: {key} role={role} outcome={f["outcome"]}')
        by_key.setdefault(key, {}).setdefault(role, []).append(f)
    for d in daemons:
        if d is not None and os.path.exists(d.log_path):
            problems += [f'{d.name}: {line}' for line in d.log_text().splitlines()
                         if ' CORRUPT: ' in line]
    for key, roles in by_key.items():
        src, tgt = roles.get('source', []), roles.get('target', [])
        if len(src) != 1 or len(tgt) != 1 or key in exempt:
            continue
        s, t = src[0], tgt[0]
        if s['outcome'] != 'ok' or t['outcome'] != 'ok':
            continue
        if s.get('verified') == 'none' and t.get('verified') == 'none':
            continue
        sv, tv = s.get('verified', '?'), t.get('verified', '?')
        m, _, n = sv.partition('/')
        if sv != tv or m != n or s.get('digest') != t.get('digest'):
            problems.append(f'{key}: source verified={sv} digest={s.get("digest")}, target '
                            f'verified={tv} digest={t.get("digest")}: expected N/N and the '
                            'same digest on both')
    return problems
