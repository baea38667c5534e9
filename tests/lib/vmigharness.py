"""Harness for vmigd tests, the demo and the bench: network namespaces, vmigd daemons (plain or
mutual TLS, with a throw-away PKI made by the openssl CLI), QEMU guest pairs driven over QMP,
migrations through the daemons (or direct), guest-memory comparison, raw TLS probes and node-hop
capture. Stdlib only. Every wait has a deadline; every resource is released by the context
managers."""

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
import ssl
import struct
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


def netns_socket(ns, family=socket.AF_INET, type=socket.SOCK_STREAM, proto=0):
    """Create a socket in namespace ns (None: ours). A short-lived thread enters the namespace with
    setns(2) and creates it; sockets keep the namespace they were created in."""
    if ns is None:
        return socket.socket(family, type, proto)
    result = {}

    def worker():
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f'/var/run/netns/{ns}') as f:
                if libc.setns(f.fileno(), CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f'setns({ns}): {os.strerror(err)}')
            result['sock'] = socket.socket(family, type, proto)
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
        return self.prefix + [self.vmigd, '--control', self.control, '--listen',
                              f'{self.listen_addr}:0', *self.tls_args(), '--log-level', 'info',
                              *self.extra_args]

    def start(self, timeout=15):
        """Start vmigd and wait until `vmigctl status --json` answers."""
        cmd = self.command()
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

    def node_hop(self):
        """(address, port) of the node-hop listener, from status."""
        addr, _, port = self.status()['listen'].rpartition(':')
        return addr.strip('[]'), int(port)

    def tls_status(self):
        """status's "tls" object ({} when the daemon reports none, or only a boolean)."""
        value = self.status().get('tls')
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

    def target_start(self, key, sockets, bandwidth=None):
        """sockets: {portid: unix path}; bandwidth: a RATE for --bandwidth (None: no option).
        Returns (JSON text exactly as printed, parsed dict)."""
        args = []
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
        (convergence: --qmp PATH, --mode, the policy)."""
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
        addr = self.status().get('metrics')
        return f'http://{addr}/metrics' if addr else None

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
# TLS: certificates made with the openssl CLI, installed like a Kubernetes secret, raw probes

NODE_CN = 'kubevirt.io:system:node:virt-handler'
CLIENT_CN = 'kubevirt.io:system:client:migration'
DEFAULT_TLS_ALLOW = ['kubevirt.io:system:node:virt-handler',
                     'kubevirt.io:system:client:virt-handler',
                     'kubevirt.io:system:client:migration']
CRYPTO_MODES = ('user-space', 'ktls', 'ktls-tx', 'ktls-rx')     # linked lines' crypto=
TLS_REFUSAL_TOKENS = ('no-certificate', 'untrusted-ca', 'expired', 'not-yet-valid', 'bad-purpose',
                      'name-not-allowed', 'peer-refused', 'protocol', 'closed', 'handshake-timeout')

_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[v3_node]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth,clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
[v3_serveronly]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
[v3_client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
[ca]
default_ca = ca_dated
[ca_dated]
database = {dir}/ca-db/index.txt
new_certs_dir = {dir}/ca-db
serial = {dir}/ca-db/serial
default_md = sha256
policy = policy_any
unique_subject = no
copy_extensions = none
email_in_dn = no
[policy_any]
commonName = supplied
"""


@dataclasses.dataclass
class CertFiles:
    """One PEM certificate and its key. serial: lowercase hex without leading zeros (see
    normalize_serial()); ca: the bundle it chains to."""
    name: str
    cert: str
    key: str
    subject: str
    serial: str
    ca: str = None

    def paths(self, ca=None):
        return {'cert': self.cert, 'key': self.key, 'ca': ca or self.ca}


@dataclasses.dataclass
class PKI:
    """What make_pki() made. ca/ca_key: the node CA; node, node2: good node certificates (same
    CN, different keys and serials); client (CN kubevirt.io:system:client:migration, EKU
    clientAuth only: a source's separate client pair); other_ca and rogue (signed by it, right
    CN); expired, not_yet_valid, badname (CN kubevirt.io:system:node:somebody-else), serveronly
    (EKU serverAuth only): signed by the right CA."""
    dir: str
    ca: str
    ca_key: str
    node: CertFiles
    node2: CertFiles
    client: CertFiles
    other_ca: str
    other_ca_key: str
    rogue: CertFiles
    expired: CertFiles
    not_yet_valid: CertFiles
    badname: CertFiles
    serveronly: CertFiles

    def paths(self, which='node', ca=None):
        """{'cert', 'key', 'ca'} for certificate WHICH (default: node, the right CA)."""
        return getattr(self, which).paths(ca)


def _openssl(*args, cwd=None):
    proc = subprocess.run(['openssl', *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise HarnessError(f'openssl {" ".join(args)} exited {proc.returncode}: '
                           f'{proc.stderr.strip()}')
    return proc.stdout


def normalize_serial(text):
    """'0A:1b:...' / '0x0a1b' / '0A1B' -> 'a1b'."""
    text = text.strip().lower()
    if text.startswith('0x'):
        text = text[2:]
    return text.replace(':', '').lstrip('0') or '0'


def shows_serial(text, serial):
    """Whether text shows the (normalized) serial, in any case, with or without colons."""
    return serial in str(text).lower().replace(':', '')


def cert_info(path):
    """{'subject', 'serial' (normalized), 'not_before', 'not_after'} of a PEM certificate."""
    out = _openssl('x509', '-in', path, '-noout', '-subject', '-serial', '-startdate', '-enddate',
                   '-nameopt', 'RFC2253')
    info = {}
    for line in out.splitlines():
        name, _, value = line.partition('=')
        info[name.strip()] = value.strip()
    return {'subject': info.get('subject', ''), 'serial': normalize_serial(info.get('serial', '')),
            'not_before': info.get('notBefore'), 'not_after': info.get('notAfter')}


def _new_serial():
    # 63 bits with the top one set: positive, and no leading zero to normalize away.
    return f'{int.from_bytes(os.urandom(8), "big") >> 1 | 1 << 62:x}'


def make_pki(directory, days=30):
    """Make a PKI under directory with the openssl CLI (ECDSA P-256 keys, like KubeVirt's); about
    a dozen openssl runs, well under a second. Returns a PKI; Skip without the openssl CLI."""
    if shutil.which('openssl') is None:
        raise Skip('the openssl command-line tool is not installed (it makes the test PKI)')
    os.makedirs(os.path.join(directory, 'ca-db'), exist_ok=True)
    cnf = os.path.join(directory, 'openssl.cnf')
    with open(cnf, 'w') as f:
        f.write(_OPENSSL_CNF.format(dir=directory))
    open(os.path.join(directory, 'ca-db', 'index.txt'), 'w').close()

    def key(name):
        path = os.path.join(directory, f'{name}.key')
        _openssl('genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256',
                 '-out', path)
        os.chmod(path, 0o600)
        return path

    def make_ca(name, cn):
        k = key(name)
        crt = os.path.join(directory, f'{name}.crt')
        _openssl('req', '-config', cnf, '-x509', '-new', '-key', k, '-subj', f'/CN={cn}',
                 '-days', str(days), '-sha256', '-extensions', 'v3_ca', '-set_serial',
                 '0x' + _new_serial(), '-out', crt)
        return crt, k

    def leaf(name, cn, ca, ca_key, ext='v3_node', dates=None):
        k = key(name)
        csr = os.path.join(directory, f'{name}.csr')
        crt = os.path.join(directory, f'{name}.crt')
        serial = _new_serial()
        _openssl('req', '-config', cnf, '-new', '-key', k, '-subj', f'/CN={cn}', '-out', csr)
        if dates is None:
            _openssl('x509', '-req', '-in', csr, '-CA', ca, '-CAkey', ca_key, '-set_serial',
                     '0x' + serial, '-days', str(days), '-sha256', '-extfile', cnf,
                     '-extensions', ext, '-out', crt)
        else:                  # openssl x509 -req of OpenSSL 3.0 cannot set the dates; ca can
            with open(os.path.join(directory, 'ca-db', 'serial'), 'w') as f:
                f.write(serial.upper().zfill(16) + '\n')
            _openssl('ca', '-batch', '-config', cnf, '-name', 'ca_dated', '-cert', ca, '-keyfile',
                     ca_key, '-in', csr, '-out', crt, '-startdate', dates[0], '-enddate',
                     dates[1], '-extensions', ext, '-notext', '-preserveDN')
        os.unlink(csr)
        info = cert_info(crt)
        if info['serial'] != serial:
            raise HarnessError(f'{crt}: serial {info["serial"]}, meant {serial}')
        return CertFiles(name, crt, k, info['subject'], info['serial'], ca)

    ca, ca_key = make_ca('ca', f'kubevirt.io@{int(time.time())}')
    other_ca, other_ca_key = make_ca('other-ca', 'some-other-ca@1')
    pki = PKI(
        dir=directory, ca=ca, ca_key=ca_key,
        node=leaf('node', NODE_CN, ca, ca_key),
        node2=leaf('node2', NODE_CN, ca, ca_key),
        client=leaf('client', CLIENT_CN, ca, ca_key, ext='v3_client'),
        other_ca=other_ca, other_ca_key=other_ca_key,
        rogue=leaf('rogue', NODE_CN, other_ca, other_ca_key),
        expired=leaf('expired', NODE_CN, ca, ca_key,
                     dates=('20200101000000Z', '20200102000000Z')),
        not_yet_valid=leaf('not-yet-valid', NODE_CN, ca, ca_key,
                           dates=('20990101000000Z', '20990201000000Z')),
        badname=leaf('badname', 'kubevirt.io:system:node:somebody-else', ca, ca_key),
        serveronly=leaf('serveronly', NODE_CN, ca, ca_key, ext='v3_serveronly'))
    return pki


def tls_paths(tls):
    """A dict with 'cert', 'key', 'ca' (and optionally 'client_cert', 'client_key') from a dict,
    a PKI (its node certificate and CA), or anything with .cert, .key and .ca."""
    if isinstance(tls, dict):
        paths = dict(tls)
    elif isinstance(tls, PKI):
        paths = tls.paths('node')
    else:
        paths = {'cert': tls.cert, 'key': tls.key, 'ca': tls.ca}
    for name in ('cert', 'key', 'ca'):
        if not paths.get(name):
            raise HarnessError(f'TLS configuration without {name}: {paths}')
    return paths


def atomic_write(path, data, mode=0o600):
    """Write data (bytes or str) to a temporary file in path's directory and rename it over path,
    so that a reader sees the old file or the new one, never a half-written one."""
    if isinstance(data, str):
        data = data.encode()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f'.{os.path.basename(path)}.')
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read(path):
    with open(path, 'rb') as f:
        return f.read()


TLS_FILE_NAMES = {'cert': 'tls.crt', 'key': 'tls.key', 'ca': 'ca.crt'}


def install_tls(directory, certfiles, ca, layout='files'):
    """Copy a certificate, its key and the CA into directory as tls.crt, tls.key and ca.crt;
    returns their paths as a dict. layout 'files': plain files. layout 'kubernetes': what the
    kubelet makes of a secret volume, tls.crt -> ..data/tls.crt, ..data -> ..TIMESTAMP/ (a
    directory holding the real files), so rotate_tls() can swap every file with one rename."""
    os.makedirs(directory, exist_ok=True)
    contents = {'cert': _read(certfiles.cert), 'key': _read(certfiles.key), 'ca': _read(ca)}
    if layout == 'files':
        for name, data in contents.items():
            atomic_write(os.path.join(directory, TLS_FILE_NAMES[name]), data)
    elif layout == 'kubernetes':
        _kube_swap(directory, contents)
        for name in TLS_FILE_NAMES.values():
            link = os.path.join(directory, name)
            if not os.path.islink(link):
                os.symlink(os.path.join('..data', name), link)
    else:
        raise HarnessError(f'unknown TLS file layout {layout!r}')
    return {name: os.path.join(directory, TLS_FILE_NAMES[name]) for name in contents}


def _kube_swap(directory, contents):
    """The kubelet's AtomicWriter: the files in a new ..TIMESTAMP directory, a ..data_tmp symlink
    to it renamed over ..data, then the old directory removed."""
    stamp = tempfile.mkdtemp(dir=directory, prefix=time.strftime('..%Y_%m_%d_%H_%M_%S.'))
    for name, data in contents.items():
        with open(os.path.join(stamp, TLS_FILE_NAMES[name]), 'wb') as f:
            f.write(data)
    data_link = os.path.join(directory, '..data')
    old = os.readlink(data_link) if os.path.islink(data_link) else None
    tmp_link = os.path.join(directory, '..data_tmp')
    if os.path.lexists(tmp_link):
        os.unlink(tmp_link)
    os.symlink(os.path.basename(stamp), tmp_link)
    os.rename(tmp_link, data_link)
    if old:
        shutil.rmtree(os.path.join(directory, old), ignore_errors=True)


def rotate_tls(directory, certfiles=None, ca=None, layout='files', key_data=None,
               cert_data=None):
    """Replace what install_tls() put in directory, the way a secret update does: with layout
    'files' each changed file is written to a temporary file and renamed over the old one (the
    key first, then the certificate, then the CA); with 'kubernetes' all of them at once with one
    rename of ..data. certfiles: new certificate and key (None: keep them); ca: a new CA file;
    key_data/cert_data: raw contents instead (e.g. garbage)."""
    contents = {name: _read(os.path.join(directory, TLS_FILE_NAMES[name]))
                for name in ('cert', 'key', 'ca')}
    new = {}
    if certfiles is not None:
        new['key'], new['cert'] = _read(certfiles.key), _read(certfiles.cert)
    if key_data is not None:
        new['key'] = key_data if isinstance(key_data, bytes) else key_data.encode()
    if cert_data is not None:
        new['cert'] = cert_data if isinstance(cert_data, bytes) else cert_data.encode()
    if ca is not None:
        new['ca'] = _read(ca)
    if layout == 'kubernetes':
        contents.update(new)
        _kube_swap(directory, contents)
    else:
        for name in ('key', 'cert', 'ca'):
            if name in new:
                atomic_write(os.path.join(directory, TLS_FILE_NAMES[name]), new[name])


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


def migration_connections(status, key):
    """The per-connection list of migration KEY in a status object: "connection_list" of its
    entry in "migration_list" (port, seq, state, tls, cipher, crypto, resumed, bytes_tx,
    bytes_rx). None if the key is not there, [] if the entry has no such list."""
    for entry in status.get('migration_list') or []:
        if entry.get('key') == key:
            value = entry.get('connection_list')
            return value if isinstance(value, list) else []
    return None


@dataclasses.dataclass
class TLSProbe:
    """What tls_connect() saw. outcome: 'connect-failed', 'handshake-failed' (the client's side
    failed: the server's alert or close arrived first), 'alert' (the server sent an alert after
    the client's side of the handshake was done: TLS 1.3 reports a refused client certificate
    this way), 'closed' (EOF or reset, no alert), 'reply' (bytes came back) or 'open' (nothing
    within the wait). seconds: from the TCP connect until that outcome."""
    outcome: str
    detail: str = ''
    handshake: bool = False
    version: str = None
    cipher: str = None
    reply: bytes = b''
    seconds: float = 0.0
    server_der: bytes = b''     # the certificate the server presented (DER), once shaken hands

    @property
    def server_serial(self):
        """The normalized serial of the server's certificate, or None."""
        if not self.server_der:
            return None
        proc = subprocess.run(['openssl', 'x509', '-inform', 'DER', '-noout', '-serial'],
                              input=self.server_der, capture_output=True, timeout=30)
        out = proc.stdout.decode(errors='replace').strip()
        return normalize_serial(out.partition('=')[2]) if proc.returncode == 0 else None

    @property
    def refused(self):
        return self.outcome in ('handshake-failed', 'alert', 'closed')

    def __str__(self):
        extra = f' {self.version}' if self.version else ''
        extra += f' reply={self.reply.hex()}' if self.reply else ''
        return f'{self.outcome} after {self.seconds:.2f}s{extra}' + \
            (f' ({self.detail})' if self.detail else '')


def tls_client_context(cert=None, key=None, ca=None):
    """A TLS client context: present cert/key if given; verify the server against ca if given
    (chain only, no host name: KubeVirt's nodes check the CN, not the address)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    if ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(ca)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def tls_connect(ns, address, port, cert=None, key=None, ca=None, send=b'', wait=1.0,
                read=8, timeout=5.0):
    """Open a TLS connection to a node-hop listener from namespace ns (None: ours) with the given
    client certificate (None: none) and CA, send `send` once the handshake is done, then wait up
    to `wait` seconds for `read` reply bytes, an alert or a close. Returns a TLSProbe."""
    started = time.monotonic()
    raw = netns_socket(ns)
    sock = raw
    probe = TLSProbe('open')
    try:
        raw.settimeout(timeout)
        try:
            raw.connect((address, port))
        except OSError as e:
            return TLSProbe('connect-failed', str(e), seconds=time.monotonic() - started)
        ctx = tls_client_context(cert, key, ca)
        sock = ctx.wrap_socket(raw, do_handshake_on_connect=False)
        sock.settimeout(timeout)
        try:
            sock.do_handshake()
        except (ssl.SSLError, OSError) as e:
            return TLSProbe('handshake-failed', _tls_error(e),
                            seconds=time.monotonic() - started)
        probe.handshake, probe.version, probe.cipher = True, sock.version(), sock.cipher()[0]
        probe.server_der = sock.getpeercert(binary_form=True) or b''
        if send:
            try:
                sock.sendall(send)
            except (ssl.SSLError, OSError) as e:
                probe.outcome, probe.detail = _classify(e)
                probe.seconds = time.monotonic() - started
                return probe
        deadline = time.monotonic() + wait
        while len(probe.reply) < read:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(read - len(probe.reply))
            except socket.timeout:
                break
            except (ssl.SSLError, OSError) as e:
                probe.outcome, probe.detail = _classify(e)
                break
            if not chunk:
                probe.outcome = 'closed'
                break
            probe.reply += chunk
        if probe.outcome == 'open' and probe.reply:
            probe.outcome = 'reply'
        probe.seconds = time.monotonic() - started
        return probe
    finally:
        sock.close()


def _tls_error(e):
    return getattr(e, 'reason', None) or str(e)


def _classify(e):
    if isinstance(e, ssl.SSLEOFError) or isinstance(e, (ConnectionResetError, BrokenPipeError)):
        return 'closed', _tls_error(e)
    if isinstance(e, ssl.SSLError) and 'ALERT' in str(getattr(e, 'reason', '') or e).upper():
        return 'alert', _tls_error(e)
    if isinstance(e, ssl.SSLError):
        return 'closed', _tls_error(e)
    return 'closed', str(e)


PREAMBLE_MAGIC, REPLY_MAGIC = 0x564D4750, 0x564D4752
REPLY_OK, REPLY_UNKNOWN_KEY = 0, 3


def node_hop_preamble(key, port=DEFAULT_PORT_ID, seq=0):
    """A version-1 node-hop preamble (doc/interfaces.md)."""
    key = key.encode()
    return struct.pack('>IHHIIHH', PREAMBLE_MAGIC, 1, 0, port, seq, len(key), 0) + key


def reply_status(data):
    """The status of an 8-byte VMGR reply, or None if data is not one."""
    if len(data) != 8:
        return None
    magic, version, status = struct.unpack('>IHH', data)
    return status if magic == REPLY_MAGIC and version == 1 else None


def probe_tls_accepted(ns, address, port, cert=None, key=None, ca=None):
    """Connect with this client certificate and send a preamble for a key nobody started: an
    authorised peer gets the VMGR "unknown key" reply over TLS (proof that the session works
    end to end); a refused one gets an alert or a close. (accepted, TLSProbe)."""
    probe = tls_connect(ns, address, port, cert, key, ca,
                        send=node_hop_preamble('tls-probe-no-such-key'), wait=5)
    return reply_status(probe.reply) == REPLY_UNKNOWN_KEY, probe


def wait_closed(sock, timeout):
    """Read from a plain socket until EOF or reset; seconds it took, or None if still open at the
    deadline. Bytes the peer sends are discarded."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - started
        if not chunk:
            return time.monotonic() - started


class Sniffer:
    """Captures the TCP payload to and from `port` on interface ifname of namespace ns (an
    AF_PACKET socket, so root only), up to limit bytes, while the with-block runs: to check what
    crosses the node hop. .payload: the bytes, segments concatenated in capture order; .packets:
    how many segments with payload were seen. Packets the socket drops are simply missing."""

    ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800

    def __init__(self, ns, ifname, port, limit=2 << 20):
        self.ns, self.ifname, self.port, self.limit = ns, ifname, port, limit
        self.payload, self.packets = bytearray(), 0
        self._sock = self._thread = None
        self._stop = threading.Event()

    def __enter__(self):
        self._sock = netns_socket(self.ns, socket.AF_PACKET, socket.SOCK_RAW,
                                  socket.htons(self.ETH_P_ALL))
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        self._sock.bind((self.ifname, self.ETH_P_ALL))
        self._sock.settimeout(0.1)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _run(self):
        buf = bytearray(1 << 18)
        view = memoryview(buf)
        while not self._stop.is_set() and len(self.payload) < self.limit:
            try:
                n = self._sock.recv_into(buf)
            except socket.timeout:
                continue
            except OSError:
                return
            if n < 34 or struct.unpack_from('>H', buf, 12)[0] != self.ETH_P_IP:
                continue
            ihl = (buf[14] & 0x0F) * 4
            if buf[23] != 6:                              # not TCP
                continue
            total = struct.unpack_from('>H', buf, 16)[0] or (n - 14)
            end = min(n, 14 + total)
            tcp = 14 + ihl
            if end < tcp + 20:
                continue
            sport, dport = struct.unpack_from('>HH', buf, tcp)
            if self.port not in (sport, dport):
                continue
            data = tcp + (buf[tcp + 12] >> 4) * 4
            if end > data:
                self.payload += view[data:end]
                self.packets += 1


def ram_page_prefixes(size_mib, variant=0, width=16):
    """The first width bytes of every 4 KiB page of the source guests' random RAM file: a
    plain-text migration stream carries these verbatim."""
    prefixes = set()
    with open(random_ram_file(size_mib, variant), 'rb') as f:
        while True:
            chunk = f.read(8 << 20)
            if not chunk:
                break
            for off in range(0, len(chunk), 4096):
                prefixes.add(chunk[off:off + width])
    return prefixes


def plaintext_hits(payload, prefixes, width=16):
    """How many offsets of payload start a guest page's prefix (see ram_page_prefixes())."""
    data = bytes(payload)
    return sum(1 for i in range(len(data) - width + 1) if data[i:i + width] in prefixes)


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


GUEST_READY = re.compile(r'vmig-guest: ws=(?P<ws>\d+)MiB rate=(?P<rate>\d+MiB/s|max) '
                         r'tsc=(?P<ghz>[\d.]+)GHz start=(?P<start>\d+)MiB mem=(?P<mem>\d+)MiB '
                         r'report=(?P<report>\d+)ms wait=(?P<wait>\w+) ready')
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
    the whole working set once before ready."""
    ws_mib: int
    rate_mib_s: int
    start_mib: int = None
    report_ms: int = 1000
    wait: str = None
    catchup_ms: int = None
    fill: bool = False

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
    both sides' RAM can be compared before it is let run with `cont`."""

    def __init__(self, name, role, size_mib, workdir, prefix=(), binary='qemu-system-x86_64',
                 extra_args=(), ram_variant=0, private=False, prealloc=False, guest=None):
        self.name, self.role, self.size_mib = name, role, size_mib
        self.ram_variant, self.private, self.prealloc = ram_variant, private, prealloc
        self.guest = GuestSpec(**guest) if isinstance(guest, dict) else guest
        self.guest_path = guest_binary() if self.guest is not None else None
        self.serial_path = os.path.join(workdir, f'{name}.serial')
        self.qmp_path = os.path.join(workdir, f'{name}.qmp')
        self.log_path = os.path.join(workdir, f'{name}.log')
        self.workdir, self.prefix = workdir, list(prefix)
        self.binary, self.extra_args = binary, list(extra_args)
        self.proc = self.qmp = None

    def command(self):
        size = f'{self.size_mib}M'
        if self.role == 'source' and self.guest is not None:
            backend = f'memory-backend-ram,id=mem0,size={size}'
        elif self.role == 'source':
            backend = (f'memory-backend-file,id=mem0,size={size},'
                       f'mem-path={random_ram_file(self.size_mib, self.ram_variant)},'
                       f'share={"off" if self.private else "on"}')
        else:
            backend = f'memory-backend-ram,id=mem0,size={size}'
            if self.prealloc:
                backend += ',prealloc=on'
        cmd = [self.binary, '-name', self.name, '-machine', 'q35,memory-backend=mem0', '-m', size,
               '-object', backend, '-S', '-nodefaults', '-display', 'none',
               '-qmp', f'unix:{self.qmp_path},server=on,wait=off', *self.extra_args]
        if self.guest is not None:
            cmd += ['-kernel', self.guest_path, '-append', self.guest.append(),
                    '-serial', f'file:{self.serial_path}']
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

    def warm_ram(self):
        """Read a source's RAM file through once, so that its pages are in the page cache when
        the migration reads them (a cold file stalls QEMU on the disk: a dent in a capped
        rate that is not the shaper's). Seconds it took; 0 for a destination."""
        if self.role != 'source' or self.guest is not None:
            return 0.0
        started = time.monotonic()
        with open(random_ram_file(self.size_mib, self.ram_variant), 'rb') as f:
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

    def start_guest(self, timeout=30):
        """`cont` a source with a test guest and wait for its ready line; the line's match
        (GUEST_READY: ws, rate, ghz, start, mem, report, wait)."""
        if self.guest is None:
            raise HarnessError(f'{self.name} has no test guest')
        self.execute('cont')
        return self.wait_serial(GUEST_READY.pattern, timeout)[1]

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


def start_via_daemons(src, dst, source_daemon, target_daemon, key, basedir, target_sock,
                      channels=0, max_bandwidth=DEFAULT_MAX_BANDWIDTH, delay_first_ms=None,
                      port_id=DEFAULT_PORT_ID, bandwidth=None, target_bandwidth=None,
                      source_args=()):
    """The KubeVirt-style flow: dst listens on target_sock, `target start` on the target daemon,
    `source start` with its JSON on the source daemon, src migrates to the socket that returns.
    bandwidth / target_bandwidth: the daemons' per-migration cap (`--bandwidth RATE` on `source
    start` / `target start`; None: none); source_args: more `source start` arguments. Returns
    the DaemonMigration once `migrate` is issued."""
    m = DaemonMigration(src, dst, source_daemon, target_daemon, key, channels)
    configure_migration(src, dst, channels, max_bandwidth)
    dst.execute('migrate-incoming', {'uri': f'unix:{target_sock}'})
    m.target_raw, m.target = target_daemon.target_start(key, {port_id: target_sock},
                                                        bandwidth=target_bandwidth)
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
    """Compare guest RAM of both sides; the common sha256, or HarnessError."""
    a, b = src.memory_digest(), dst.memory_digest()
    if a != b:
        raise HarnessError(f'guest memory differs: source {a} destination {b}')
    return a


# --------------------------------------------------------------------------------------------------
# Rates and metrics: sampling `vmigctl metrics --json` while migrations run, Prometheus text

MIB = 1 << 20


@dataclasses.dataclass
class RateSample:
    """One migration's figures at one moment. t: the daemon's time_unix (CLOCK_REALTIME, the
    clock time.time() reads) when it counted, or for QEMU the middle of the query-migrate call
    (bytes_tx is then ram.transferred)."""
    t: float
    bytes_tx: int
    bytes_rx: int = 0
    cap: int = 0
    limit: int = 0
    cap_lifted: bool = False
    switchover: bool = False
    conns_active: int = 0
    faults: int = 0          # QEMU samples: its major page faults so far


class RateWatch:
    """Samples the `vmigctl metrics --json` of some daemons (and the source QEMUs' ram.transferred)
    every interval seconds, in the calling thread, while migrations run; runs scheduled actions
    (a cap change) at their times and notes when they ran. series[(daemon name, key)] and
    qemu_series[key]: lists of RateSample in time order; events[label]: time.time() when the
    action had returned."""

    def __init__(self, daemons, qemus=None, interval=0.5):
        self.daemons, self.qemus, self.interval = list(daemons), dict(qemus or {}), interval
        self.series, self.qemu_series, self.events = {}, {}, {}
        self.cpu = []                  # (time.time(), idle jiffies, all jiffies) of the host

    def sample(self):
        self.cpu.append((time.time(), *cpu_jiffies()))
        for d in self.daemons:
            metrics = d.metrics()
            t = metrics['node']['time_unix']
            for m in metrics.get('migrations') or []:
                insp = m.get('inspect') or {}
                self.series.setdefault((d.name, m['key']), []).append(RateSample(
                    t, m['bytes_tx'], m['bytes_rx'], m['cap'], m['limit'],
                    bool(m.get('cap_lifted')), bool(insp.get('switchover')),
                    m['conns']['active']))
        for key, q in self.qemus.items():
            before = time.time()
            ram = q.migration_info().get('ram') or {}
            if 'transferred' in ram:
                self.qemu_series.setdefault(key, []).append(
                    RateSample((before + time.time()) / 2, ram['transferred'],
                               faults=q.major_faults()))

    def run(self, done, timeout, schedule=()):
        """Sample until done() is true (then once more, 0.3 s later, so that the last bytes are
        counted); schedule: (seconds after the start of run(), label, fn) to call on the way.
        HarnessError after timeout seconds."""
        started = time.monotonic()
        pending = sorted(schedule, key=lambda item: item[0])
        next_at = started
        while True:
            now = time.monotonic()
            while pending and now - started >= pending[0][0]:
                _, label, fn = pending.pop(0)
                fn()
                self.events[label] = time.time()
            self.sample()
            if done():
                time.sleep(0.3)
                self.sample()
                if pending:
                    raise HarnessError(f'the migrations ended before {pending[0][1]} '
                                       f'({pending[0][0]:g}s after the start)')
                return self
            if now - started > timeout:
                raise HarnessError(f'migrations still running after {timeout:g}s')
            next_at += self.interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    def get(self, daemon, key):
        """The samples of KEY on daemon (a Daemon or its name)."""
        name = daemon if isinstance(daemon, str) else daemon.name
        samples = self.series.get((name, key))
        if not samples:
            raise HarnessError(f'{name} never listed migration {key} in its metrics')
        return samples


def cpu_jiffies():
    """(idle + iowait, all) jiffies of all CPUs from /proc/stat; (0, 0) if unreadable."""
    try:
        with open('/proc/stat') as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(fields[3:5]), sum(fields)


def cpu_idle_between(watch, start, end):
    """The host's idle share (0..1) between the samples of watch nearest to [start, end], or
    None: a shaper that misses its rate on a host with no idle CPU was starved, not wrong."""
    inside = [c for c in watch.cpu if start <= c[0] <= end]
    if len(inside) < 2 or inside[-1][2] == inside[0][2]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2])


def qemu_faults_between(watch, key, start, end):
    """Major page faults of KEY's source QEMU within [start, end] (see RateWatch), or None."""
    inside = [s for s in watch.qemu_series.get(key, []) if start <= s.t <= end]
    return inside[-1].faults - inside[0].faults if len(inside) >= 2 else None


def flow_span(samples, field='bytes_rx'):
    """(t_first, t_last): the first sample with bytes flowing (field > 0), and the last one
    before the flow ended (field reached its final value) or before the switchover was seen
    or the cap lifted: the span in which the migration sent under its cap."""
    values = [getattr(s, field) for s in samples]
    final = values[-1]
    first = next((i for i, v in enumerate(values) if v > 0), None)
    if first is None:
        raise HarnessError('no bytes flowed in any sample')
    last = first
    for i in range(first, len(samples)):
        if samples[i].switchover or samples[i].cap_lifted or values[i] >= final:
            break
        last = i
    return samples[first].t, samples[last].t


def rate_between(samples, start, end, field='bytes_rx'):
    """(bytes/s, t0, t1) between the first sample at or after start and the last at or before
    end; HarnessError if that leaves fewer than two samples or under half a second."""
    inside = [s for s in samples if start <= s.t <= end]
    if len(inside) < 2 or inside[-1].t - inside[0].t < 0.5:
        raise HarnessError(f'too few samples between {start:.2f} and {end:.2f} to measure a '
                           f'rate ({len(inside)})')
    a, b = inside[0], inside[-1]
    return (getattr(b, field) - getattr(a, field)) / (b.t - a.t), a.t, b.t


def window_rates(samples, start, end, field='bytes_rx', width=1.0):
    """Rates (bytes/s) over consecutive windows of at least width seconds within [start, end]
    (each from one sample to the first one width seconds later)."""
    inside = [s for s in samples if start <= s.t <= end]
    rates, i = [], 0
    while i < len(inside):
        j = next((k for k in range(i + 1, len(inside))
                  if inside[k].t - inside[i].t >= width - 0.05), None)
        if j is None:
            break
        rates.append((getattr(inside[j], field) - getattr(inside[i], field))
                     / (inside[j].t - inside[i].t))
        i = j
    return rates


def within(value, expected, tolerance):
    """Whether value lies within +-tolerance (a fraction) of expected."""
    return abs(value - expected) <= tolerance * expected


def fmt_rates(rates):
    """'50.1 49.9 ...' in MiB/s."""
    return ' '.join(f'{r / MIB:.1f}' for r in rates)


PROM_NAME = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*\Z')
PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
PROM_TYPES = ('counter', 'gauge', 'histogram', 'summary', 'untyped')


def _prom_value(text):
    if text in ('NaN', '+Inf', '-Inf', 'Inf'):
        return float(text.replace('Inf', 'inf').replace('NaN', 'nan'))
    if not re.fullmatch(r'[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?', text):
        raise ValueError(f'not a number: {text!r}')
    return float(text)


def _prom_unescape(text):
    return re.sub(r'\\([\\"n])', lambda m: '\n' if m.group(1) == 'n' else m.group(1), text)


def parse_prometheus(text):
    """Parse the Prometheus text exposition format (version 0.0.4) strictly. Returns (families,
    problems): families {name: {'help', 'type', 'samples': [(labels dict, value)]}}, problems a
    list of what breaks the format: a line that does not parse, HELP or TYPE twice or after the
    name's first sample, a sample without TYPE, a family's samples not in one group, a label
    twice in a sample, the same series twice, a counter below zero, no final newline."""
    families, problems, seen_series = {}, [], set()
    current, closed = None, set()
    if text and not text.endswith('\n'):
        problems.append('the text does not end with a newline')
    for n, line in enumerate(text.split('\n')[:-1] if text.endswith('\n') else
                             text.split('\n'), 1):
        where = f'line {n}'
        if not line.strip():
            continue
        if line.startswith('#'):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ('HELP', 'TYPE'):
                name = parts[2]
                rest = parts[3] if len(parts) > 3 else ''
                fam = families.setdefault(name, {'help': None, 'type': None, 'samples': []})
                field = parts[1].lower()
                if not PROM_NAME.match(name):
                    problems.append(f'{where}: bad metric name {name!r}')
                if fam[field] is not None:
                    problems.append(f'{where}: {parts[1]} for {name} a second time')
                if fam['samples']:
                    problems.append(f'{where}: {parts[1]} for {name} after its samples')
                if field == 'type' and rest not in PROM_TYPES:
                    problems.append(f'{where}: TYPE {rest!r} for {name}')
                fam[field] = _prom_unescape(rest) if field == 'help' else rest
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([^ ]+)( -?\d+)?\Z', line)
        # A label value may hold '}': fall back to a scan of the label block.
        if not m:
            m2 = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\{', line)
            if m2:
                labels_text, pos = _prom_scan_labels(line, m2.end())
                tail_m = re.match(r' ([^ ]+)( -?\d+)?\Z', line[pos:]) if pos else None
                if labels_text is not None and tail_m:
                    name, value_text = m2.group(1), tail_m.group(1)
                    block = labels_text
                else:
                    problems.append(f'{where}: does not parse: {line!r}')
                    continue
            else:
                problems.append(f'{where}: does not parse: {line!r}')
                continue
        else:
            name, block, value_text = m.group(1), (m.group(2) or '{}')[1:-1], m.group(3)
        labels = {}
        if block:
            pos = 0
            while pos < len(block):
                lm = PROM_LABEL.match(block, pos)
                if not lm:
                    problems.append(f'{where}: bad label syntax at {block[pos:]!r}')
                    break
                lname = lm.group(1)
                if lname in labels:
                    problems.append(f'{where}: label {lname} twice')
                if lname.startswith('__'):
                    problems.append(f'{where}: reserved label name {lname}')
                labels[lname] = _prom_unescape(lm.group(2))
                pos = lm.end()
                if pos < len(block):
                    if block[pos] != ',':
                        problems.append(f'{where}: expected "," at {block[pos:]!r}')
                        break
                    pos += 1
        try:
            value = _prom_value(value_text)
        except ValueError as e:
            problems.append(f'{where}: {e}')
            continue
        fam = families.get(name)
        if fam is None or fam['type'] is None:
            problems.append(f'{where}: sample of {name} without a TYPE line before it')
            fam = families.setdefault(name, {'help': None, 'type': None, 'samples': []})
        if fam['help'] is None:
            problems.append(f'{where}: sample of {name} without a HELP line before it')
            fam['help'] = ''
        if name != current:
            if name in closed:
                problems.append(f'{where}: samples of {name} not in one group')
            if current is not None:
                closed.add(current)
            current = name
        series = (name, tuple(sorted(labels.items())))
        if series in seen_series:
            problems.append(f'{where}: series {name}{labels} twice')
        seen_series.add(series)
        if fam['type'] == 'counter' and not value >= 0:
            problems.append(f'{where}: counter {name} = {value}')
        fam['samples'].append((labels, value))
    return families, problems


def _prom_scan_labels(line, pos):
    """The text between '{' (ending at pos) and its closing '}', honouring quoted values; (text,
    index after '}') or (None, 0)."""
    start, quoted, i = pos, False, pos
    while i < len(line):
        ch = line[i]
        if quoted and ch == '\\':
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif ch == '}' and not quoted:
            return line[start:i], i + 1
        i += 1
    return None, 0


def prom_value(families, name, **labels):
    """The value of the one sample of family name whose labels include these; HarnessError when
    there is none or more than one."""
    found = [v for lab, v in families.get(name, {}).get('samples', [])
             if all(lab.get(k) == str(v2) for k, v2 in labels.items())]
    if len(found) != 1:
        raise HarnessError(f'{len(found)} samples of {name} with {labels}, expected one')
    return found[0]


def http_get(ns, url, method='GET', timeout=10):
    """An HTTP request with curl, run in network namespace ns (None: ours). (status code,
    {header name lowercased: value}, body text)."""
    if shutil.which('curl') is None:
        raise Skip('curl is not installed')
    cmd = [*netns_prefix(ns), 'curl', '-sS', '--max-time', str(timeout)]
    if method == 'HEAD':
        cmd.append('-I')                   # headers only (a body would not be read)
    else:
        cmd += ['-D', '-', '-o', '-']
        if method != 'GET':
            cmd += ['-X', method]
    proc = subprocess.run([*cmd, url], capture_output=True, timeout=timeout + 5,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise HarnessError(f'curl {method} {url} exited {proc.returncode}: '
                           f'{proc.stderr.decode(errors="replace").strip()}')
    out = proc.stdout
    head, sep, body = out.partition(b'\r\n\r\n')
    if not sep:
        raise HarnessError(f'curl {url}: no HTTP header in {out[:200]!r}')
    lines = head.decode(errors='replace').split('\r\n')
    m = re.match(r'HTTP/\d(\.\d)? (\d{3})', lines[0])
    if not m:
        raise HarnessError(f'curl {url}: status line {lines[0]!r}')
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(':')
        headers[name.strip().lower()] = value.strip()
    return int(m.group(2)), headers, body.decode(errors='replace')


# --------------------------------------------------------------------------------------------------
# Testbed: all of the above wired together


def still_in_flight(m):
    """A Checks case: the DaemonMigration m is still active, so what ran before it ran while a
    migration was in flight."""
    status = m.status()
    if status != 'active':
        raise HarnessError(f'the migration is {status}: the probes did not all run while it was '
                           'in flight')
    return 'yes'


class Checks:
    """Collects the outcomes of many small checks (probes, refusal cases) so that a test runs them
    all and then fails once, listing every one that failed. run() may be called from threads."""

    def __init__(self, noun='checks'):
        self.noun = noun
        self.failures, self.count, self.lock = [], 0, threading.Lock()

    def run(self, name, fn, *args):
        try:
            detail = fn(*args)
        except Exception as e:             # noqa: BLE001 -- a failed check, recorded
            detail = f'FAILED: {e}'
            with self.lock:
                self.failures.append(f'{name}: {e}')
        with self.lock:
            self.count += 1
        log(f'  {name}: {detail}')

    def finish(self):
        if self.failures:
            raise HarnessError(f'{len(self.failures)} of {self.count} {self.noun} failed:\n  '
                               + '\n  '.join(self.failures))


class Testbed:
    """A NetPair, a work directory and two vmigd ("source" in the source namespace, "target" in the
    target namespace), plus QEMU pairs started on demand. On leaving the block everything is
    stopped and removed (the work directory is kept if $VMIG_KEEP is set); if the block raised,
    the tails of all logs are printed first."""

    def __init__(self, vmigd=None, vmigctl=None, loopback=False, daemon_args=(),
                 source_args=(), target_args=(), qemu='qemu-system-x86_64', tls=None,
                 source_tls=None, target_tls=None, tls_layout='files'):
        """tls (or source_tls/target_tls for one side): None for --no-tls; True makes a PKI
        under WORKDIR/pki (tb.pki) and uses it as a PKI does: each daemon gets its own copy of
        the node certificate, key and CA under WORKDIR/tls-source and WORKDIR/tls-target (see
        install_tls(); tls_layout 'files' or 'kubernetes', or a dict per side), so that a test
        can rotate one side's files; anything else tls_paths() takes is passed as it is."""
        if vmigd is None or vmigctl is None:
            vmigd, vmigctl = find_binaries()
        self.vmigd, self.vmigctl, self.qemu = vmigd, vmigctl, qemu
        self.net = NetPair(loopback)
        self.daemon_args = {'source': [*daemon_args, *source_args],
                            'target': [*daemon_args, *target_args]}
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
        self._keys = self._pairs = self._replaced = 0

    def __enter__(self):
        if shutil.which(self.qemu) is None:
            raise Skip(f'{self.qemu} not installed')
        self.workdir = tempfile.mkdtemp(prefix='vmig-', dir='/tmp')
        try:
            self.net.__enter__()
            os.makedirs(self.path('src'))
            os.makedirs(self.path('dst'))
            if any(v is True for v in self.tls.values()) and self.pki is None:
                self.pki = make_pki(self.path('pki'))
            tls = {side: self._daemon_tls(side) for side in ('source', 'target')}
            # Assigned before start(), so that close() stops a daemon whose start-up timed out.
            self.source = Daemon(self.vmigd, self.vmigctl, 'vmigd-source', self.workdir,
                                 self.net.source_addr, self.net.prefix('source'),
                                 self.daemon_args['source'], tls=tls['source'])
            self.source.start()
            self.target = Daemon(self.vmigd, self.vmigctl, 'vmigd-target', self.workdir,
                                 self.net.target_addr, self.net.prefix('target'),
                                 self.daemon_args['target'], tls=tls['target'])
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
            for d in (self.source, self.target, *self.extra_daemons):
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
        d = Daemon(self.vmigd, self.vmigctl, name, self.workdir, addr, self.net.prefix(side),
                   list(args), tls=tls)
        self.extra_daemons.append(d)
        return d.start()

    def replace_daemon(self, side, args=None, tls=None, name=None):
        """Stop side's daemon and start a new one in its place (new log NAME, default
        vmigd-SIDE-2, ...) with args (default: the testbed's) and tls (default: the same files);
        tb.source / tb.target then name the new one."""
        old = self.source if side == 'source' else self.target
        rc = old.stop()
        if rc != 0:
            raise HarnessError(f'{old.name} exited {rc} after SIGTERM:\n{tail(old.log_path)}')
        self._replaced += 1
        d = Daemon(self.vmigd, self.vmigctl, name or f'vmigd-{side}-{self._replaced + 1}',
                   self.workdir, old.listen_addr, old.prefix,
                   self.daemon_args[side] if args is None else list(args),
                   tls=old.tls if tls is None else tls)
        self.retired.append(old)
        if side == 'source':
            self.source = d
        else:
            self.target = d
        return d.start()

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
                  src_args=()):
        """Start a source QEMU (source namespace) and a destination QEMU (target namespace).
        steady=True, for rate measurements: the destination's RAM is allocated at start
        (prealloc=on) and the source's RAM file read into the page cache, so that neither
        QEMU stalls on first touches or the disk while the migration runs. guest: a GuestSpec
        (or dict) to boot the test guest on both (see Qemu); both stay paused until
        src.start_guest(). src_args: more QEMU arguments for the source (a QMP socket of
        vmigd's own, say)."""
        self._pairs += 1
        pair = (Qemu(f'q{self._pairs}-src', 'source', size_mib, self.workdir,
                     self.net.prefix('source'), self.qemu, extra_args=src_args,
                     ram_variant=ram_variant, private=private, guest=guest),
                Qemu(f'q{self._pairs}-dst', 'destination', size_mib, self.workdir,
                     self.net.prefix('target'), self.qemu, prealloc=steady, guest=guest))
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

    def stop_daemons(self):
        """SIGTERM both daemons; HarnessError unless both exit 0."""
        for d in (self.source, self.target):
            rc = d.stop()
            if rc != 0:
                raise HarnessError(f'{d.name} exited {rc} after SIGTERM:\n{tail(d.log_path)}')
