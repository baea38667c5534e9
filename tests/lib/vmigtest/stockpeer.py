"""Stock KubeVirt peers for the tests and the bench, on either end of a migration in a namespace
of a NetPair, beside vmigd or instead of it: tests/stockpeer (Go), a re-implementation of
virt-handler's migration proxy with one line per connection (kind 'stockpeer'), or tests/kvpeer,
KubeVirt's own migration-proxy.go of a pinned release behind the same command line, whose
connections are read from KubeVirt's log lines (kind 'kubevirt', see parse_kubevirt_log()).
StockPeer runs one peer (one migration per process);
StockTestbed is a Testbed whose vmigd daemons are optional and that stops its peers with it;
start_migration() runs KubeVirt's flow with each end a stock peer or vmigd in KubeVirt mode.
Stdlib only."""

import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time

from .base import DEFAULT_PORT_ID, REPO_ROOT, HarnessError, Skip, log, stop_process, tail
from .migrate import DEFAULT_MAX_BANDWIDTH, DaemonMigration, configure_migration
from .testbed import Testbed
from .tls import CLIENT_CN, NODE_CN, CertFiles, make_pki, tls_paths

# The client names a stock target accepts by default (--migration-cn-types' default), and the
# one a v1.6 or older target accepts.
STOCK_CLIENT_CNS = (CLIENT_CN, 'kubevirt.io:system:client:virt-handler')
OLD_CLIENT_CN = 'kubevirt.io:system:client:virt-handler'
STOCK_SERVER_CN = NODE_CN


def stockpeer_binary(build_dir=None):
    """The stock peer: $STOCKPEER (meson sets it; empty when go was not found at configure
    time), else BUILD/tests/stockpeer/stockpeer (BUILD: build_dir or REPO/build). Skip when there
    is none."""
    path = os.environ.get('STOCKPEER')
    if path == '':
        raise Skip('the stock KubeVirt peer (tests/stockpeer) was not built: `go` was not found '
                   'when the build was configured (Debian: apt-get install golang-go, then '
                   'meson setup --reconfigure)')
    if path is None:
        path = os.path.join(build_dir or os.path.join(REPO_ROOT, 'build'), 'tests', 'stockpeer',
                            'stockpeer')
    if not os.access(path, os.X_OK):
        raise Skip(f'{path} not built (needs go, Debian golang-go; ninja -C build, or set '
                   'STOCKPEER)')
    return path


# The KubeVirt releases tests/kvpeer is built for (contrib/kubevirt/upstream), and the default.
KUBEVIRT_VERSIONS = ('v1.8.4', 'v1.9.0', 'main')
DEFAULT_KUBEVIRT = 'v1.9.0'


def kvpeer_binary(version=DEFAULT_KUBEVIRT, build_dir=None):
    """KubeVirt's own proxy of release version (tests/kvpeer): from $KVPEER (meson sets it to
    VERSION=PATH,...; empty when go was not found at configure time), else
    BUILD/tests/kvpeer/kvpeer-VERSION. Skip when there is none."""
    if version not in KUBEVIRT_VERSIONS:
        raise HarnessError(f'KubeVirt {version!r}: one of {", ".join(KUBEVIRT_VERSIONS)}')
    env = os.environ.get('KVPEER')
    if env == '':
        raise Skip('KubeVirt\'s own proxy (tests/kvpeer) was not built: `go` was not found when '
                   'the build was configured (Debian: apt-get install golang-go, then meson '
                   'setup --reconfigure)')
    paths = dict(item.split('=', 1) for item in (env or '').split(',') if '=' in item)
    path = paths.get(version) or os.path.join(build_dir or os.path.join(REPO_ROOT, 'build'),
                                              'tests', 'kvpeer', f'kvpeer-{version}')
    if not os.access(path, os.X_OK):
        raise Skip(f'{path} not built (needs go, Debian golang-go; ninja -C build, or set '
                   'KVPEER)')
    return path


def peer_kind(binary):
    """'kubevirt' for a tests/kvpeer binary (kvpeer-VERSION), else 'stockpeer'."""
    return 'kubevirt' if os.path.basename(binary).startswith('kvpeer') else 'stockpeer'


_CONN_RE = re.compile(r'conn (\d+) (role=\S+ .*)$')
_FIELD_RE = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def parse_conn_line(line):
    """A peer's per-connection line (`conn N role=R key=K port=P accepted=A dialled=D [tls=V
    cipher=C peer="CN"] ended_by=... secs=S local_to_peer=N local_to_peer_end=eof|"ERR"|open
    peer_to_local=N peer_to_local_end=... [error="ERR"]`, or with `dial_error="ERR"` when the
    far side could not be opened) as a dict: id, the fields (quotes removed, byte counts and
    port as ints; -1: that copy was still open at exit), line. None for any other line."""
    m = _CONN_RE.search(line)
    if not m:
        return None
    rec = {'id': int(m.group(1)), 'line': line}
    for name, value in _FIELD_RE.findall(m.group(2)):
        if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
            try:
                value = json.loads(value)   # Go's strconv.Quote: JSON's escapes, mostly
            except ValueError:
                value = value[1:-1]
        elif name in ('port', 'local_to_peer', 'peer_to_local'):
            value = int(value)
        rec[name] = value
    return rec


_BYTES_RE = re.compile(r'^(\d+) bytes copied (from inbound to outbound|outbound to inbound)$')


def _logical_of(key, name):
    """KubeVirt's rule (GetTargetListenerPorts; the source socket names follow it)."""
    for port in (49152, 49153):
        if f'{key}-{port}' in name:
            return port
    return 0


def _port_of(addr):
    """The port of 'HOST:PORT' (KubeVirt writes ':::PORT' for the IPv6 wildcard), or None."""
    try:
        return int(str(addr).rsplit(':', 1)[1])
    except (IndexError, ValueError):
        return None


def parse_kubevirt_log(text, role):
    """Connection records, in the form of parse_conn_line()'s, from a kvpeer log: KubeVirt's
    migration-proxy.go logs no connection identity, only per proxy (its With() fields uid,
    listening, outbound) "N bytes copied from inbound to outbound" and "N bytes copied outbound
    to inbound" as each copy of a pair ends, and its errors. One record per inbound-to-outbound
    line (the copy that carries QEMU's stream on both roles: a source's unix side to TCP, a
    target's TCP to the destination's socket; it ends once the pair has ended) and per "unable
    to create outbound leg" (dial_error); within a proxy the other direction's lines, the error
    lines and kvpeer's "tls handshake" lines (a target's matched by its listening port) are
    given to the records in log order, which with several connections on one proxy is an
    approximation (the sums and the names are exact). Fields: id, port (logical), key,
    local_to_peer, peer_to_local (-1: not logged yet), error or dial_error, tls, cipher, peer,
    tls_config (migration or old-client), fallback (KubeVirt's "fallback to old tls config"),
    line (a summary), raw (the log lines)."""
    proxies, order, handshakes = {}, [], []
    for line in text.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if not isinstance(e, dict):
            continue
        msg = str(e.get('msg', ''))
        if e.get('component') == 'kvpeer':
            if msg == 'tls handshake':
                handshakes.append(e)
            continue
        if 'listening' not in e or 'outbound' not in e:
            continue
        ident = (e['listening'], e['outbound'])
        if ident not in proxies:
            proxies[ident] = {'records': [], 'out_in': [], 'pending': [], 'fallback': 0}
            order.append(ident)
        p = proxies[ident]
        key = e.get('uid', '')
        name = e['listening'] if role == 'source' else e['outbound']
        m = _BYTES_RE.match(msg)
        if m and m.group(2) == 'from inbound to outbound':
            rec = {'port': _logical_of(key, name), 'key': key, 'raw': [line],
                   'local_to_peer' if role == 'source' else 'peer_to_local': int(m.group(1))}
            if p['pending']:
                rec['error'] = p['pending'].pop(0)
            if p['fallback']:
                rec['fallback'], p['fallback'] = True, p['fallback'] - 1
            p['records'].append(rec)
        elif m:
            p['out_in'].append(int(m.group(1)))
        elif msg == 'unable to create outbound leg of proxy to host':
            p['records'].append({'port': _logical_of(key, name), 'key': key, 'raw': [line],
                                 'dial_error': e.get('reason', msg)})
        elif msg.startswith('error encountered copying data'):
            reason = e.get('reason', msg)
            target = next((r for r in reversed(p['records'])
                           if 'error' not in r and 'dial_error' not in r), None)
            if target is not None:
                target['error'] = reason
                target['raw'].append(line)
            else:
                p['pending'].append(reason)
        elif msg.startswith('fallback to old tls config') or msg.startswith('handshake failed'):
            p['fallback'] += 1
    out = []
    for ident in order:
        p = proxies[ident]
        if role == 'target':
            port = _port_of(ident[0])
            mine = [h for h in handshakes if _port_of(h.get('local')) == port]
        else:
            mine = handshakes
        other = 'peer_to_local' if role == 'source' else 'local_to_peer'
        carried = [r for r in p['records'] if 'dial_error' not in r]
        for i, rec in enumerate(carried):
            rec[other] = p['out_in'][i] if i < len(p['out_in']) else -1
            if i < len(mine):
                h = mine[i]
                rec.update(tls=h.get('tls'), cipher=h.get('cipher'), peer=h.get('peer'),
                           tls_config=h.get('config'))
        for rec in p['records']:
            rec['id'] = len(out) + 1
            rec.setdefault(other, -1)
            parts = [f'conn {rec["id"]} role={role} key={rec["key"]} port={rec["port"]} '
                     f'listening={ident[0]} outbound={ident[1]}']
            if 'tls' in rec:
                parts.append(f'tls={rec["tls"]} cipher={rec["cipher"]} '
                             f'peer={json.dumps(rec["peer"])}')
            parts.append(f'local_to_peer={rec.get("local_to_peer", -1)} '
                         f'peer_to_local={rec.get("peer_to_local", -1)}')
            for f in ('error', 'dial_error'):
                if f in rec:
                    parts.append(f'{f}={json.dumps(rec[f])}')
            rec['line'] = ' '.join(parts)
            out.append(rec)
    return out


def stock_tls(pki, role, which=None):
    """{'cert', 'key', 'ca'} for a stock peer from a PKI (make_pki()): a target serves with the
    node certificate, a source presents the migration client certificate (CN
    kubevirt.io:system:client:migration), as KubeVirt issues them. which: another of the PKI's
    certificates by name (a refusal case), or a CertFiles."""
    if isinstance(which, CertFiles):
        return {'cert': which.cert, 'key': which.key, 'ca': pki.ca}
    return pki.paths(which or ('node' if role == 'target' else 'client'))


class StockPeer:
    """One stock peer in a namespace (prefix), log WORKDIR/NAME.log: binary is tests/stockpeer
    or a tests/kvpeer (KubeVirt's own code; kind says which, from the binary's name unless
    given: 'stockpeer' or 'kubevirt'), with the same command line and output; conn_lines()
    reads either's log into the same records. tls: None
    for plain TCP (KubeVirt's disableTLS), else what tls_paths() takes ({'cert', 'key', 'ca'}):
    the target's server pair or the source's client pair (see stock_tls()). Start it with
    start_target() or start_source(); stop() ends it (SIGTERM: the listeners close and the pairs
    in flight end as at their first EOF). It also answers source_stop(key) and target_stop(key),
    so that a DaemonMigration can finish a migration with a peer on either end."""

    def __init__(self, binary, name, workdir, prefix=(), tls=None, extra_args=(), kind=None):
        self.binary, self.name = binary, name
        self.kind = kind or peer_kind(binary)
        if self.kind not in ('stockpeer', 'kubevirt'):
            raise HarnessError(f'{name}: unknown peer kind {self.kind!r}')
        self.log_path = os.path.join(workdir, f'{name}.log')
        self.prefix, self.extra_args = list(prefix), list(extra_args)
        self.tls = tls
        self.proc = None
        self.key = self.role = None
        self.target_raw, self.target = '', {}
        self.sockets = []

    def tls_args(self):
        if not self.tls:
            return []
        paths = tls_paths(self.tls)
        # The agreed command line: after --tls, --key names the private key file.
        return ['--tls', '--cert', paths['cert'], '--key', paths['key'], '--ca', paths['ca']]

    def start_target(self, key, sockets, listen_host=None, advertise=None, client_cns=None,
                     min_tls=None, timeout=15):
        """`stockpeer target`: one listener per {logical port: unix path} of sockets (a path
        alone in a list takes KubeVirt's rule); (the line it printed, parsed):
        {"targetNodeAddress", "targetDirectMigrationNodePorts": {"<tcp port>": logical}}."""
        args = ['target', '--key', key]
        items = sockets.items() if isinstance(sockets, dict) else ((None, p) for p in sockets)
        for logical, path in items:
            args += ['--socket', path if logical is None else f'{logical}={path}']
        if listen_host:
            args += ['--listen-host', listen_host]
        if advertise:
            args += ['--advertise', advertise]
        args += self.tls_args()
        if self.tls and client_cns:
            args += ['--client-cn', ','.join(client_cns)]
        if self.tls and min_tls:
            args += ['--min-tls', str(min_tls)]
        lines = self._start(args, 1, timeout)
        self.key, self.role = key, 'target'
        self.target_raw = lines[0]
        try:
            self.target = json.loads(lines[0])
        except ValueError:
            raise HarnessError(f'{self.name} printed {lines[0]!r}, not the target JSON') from None
        return self.target_raw, self.target

    def start_source(self, key, target_json, basedir, server_cn=None, socket_owner=None,
                     timeout=15):
        """`stockpeer source`: a unix listener per entry of target_json (the KubeVirt form; text
        or a dict) at BASEDIR/migrationproxy/KEY[-LOGICAL]-source.sock; the socket paths,
        sorted by logical port. socket_owner: 'UID:GID' (the peer's default: 107:107)."""
        text = target_json if isinstance(target_json, str) else json.dumps(target_json)
        try:
            count = len(json.loads(text).get('targetDirectMigrationNodePorts') or {})
        except (ValueError, AttributeError):
            count = 1               # a bad JSON on purpose: the peer says what is wrong
        args = ['source', '--key', key, '--target', text, '--dir', basedir]
        args += self.tls_args()
        if self.tls and server_cn:
            args += ['--server-cn', server_cn]
        if socket_owner:
            args += ['--socket-owner', socket_owner]
        self.sockets = self._start(args, max(count, 1), timeout)
        self.key, self.role = key, 'source'
        return self.sockets

    def command(self, args):
        return self.prefix + [self.binary, *args, *self.extra_args]

    def _start(self, args, nlines, timeout):
        if self.proc is not None:
            raise HarnessError(f'{self.name}: already started')
        with open(self.log_path, 'ab') as logf:
            self.proc = subprocess.Popen(self.command(args), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=logf)
        out, deadline = b'', time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while out.count(b'\n') < nlines:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HarnessError(f'{self.name}: {nlines} lines not printed within {timeout}s '
                                   f'(got {out!r}):\n{tail(self.log_path)}')
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.2))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    rc = self.proc.wait(5)
                    raise HarnessError(f'{self.name}: exited {rc} before it was ready:\n'
                                       f'{tail(self.log_path)}')
                out += chunk
        return out.decode().splitlines()[:nlines]

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=10):
        """SIGTERM and wait (SIGKILL after timeout); the exit status (0 after a clean stop)."""
        rc = stop_process(self.proc, timeout)
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        return rc

    # A DaemonMigration finishes with these.
    def source_stop(self, key):
        self._stop_for(key)

    def target_stop(self, key):
        self._stop_for(key)

    def _stop_for(self, key):
        if key != self.key:
            raise HarnessError(f'{self.name} carries {self.key}, not {key}')
        rc = self.stop()
        if rc != 0:
            raise HarnessError(f'{self.name} exited {rc} after SIGTERM:\n{tail(self.log_path)}')

    def log_text(self):
        try:
            with open(self.log_path, errors='replace') as f:
                return f.read()
        except FileNotFoundError:
            return ''

    def conn_lines(self):
        """Every connection's record so far, in log order: parse_conn_line() of each line of a
        stockpeer, parse_kubevirt_log() of a kvpeer's log."""
        if self.kind == 'kubevirt':
            return parse_kubevirt_log(self.log_text(), self.role)
        return [r for r in map(parse_conn_line, self.log_text().splitlines()) if r]

    def wait_conns(self, count, timeout=10):
        """Wait until count connections have their line (a stockpeer: both copies ended; a
        kvpeer: the inbound-to-outbound copy ended, or the dial failed); the records."""
        deadline = time.monotonic() + timeout
        while True:
            recs = self.conn_lines()
            if len(recs) >= count:
                return recs
            if time.monotonic() >= deadline:
                raise HarnessError(f'{self.name}: {len(recs)} of {count} connection lines after '
                                   f'{timeout:g}s:\n{tail(self.log_path, 15)}')
            time.sleep(0.05)

    def errors(self):
        """The connection lines that carry an error (error= or dial_error=)."""
        return [r for r in self.conn_lines() if 'error' in r or 'dial_error' in r]


class StockTestbed(Testbed):
    """A Testbed with stock peers: stock_target()/stock_source() start peers in the target or
    source namespace, stopped (before the daemons) when the block ends, their logs shown with
    the others'. daemons=False: no vmigd at all (tb.source and tb.target stay None), so a test
    of stock peers alone needs no vmigd build; pki=True makes tb.pki (make_pki()) even without
    TLS daemons. Everything else as Testbed (daemons=True takes its TLS arguments); a daemon
    whose TLS comes from tb.pki (tls=True) also gets the PKI's migration client pair
    (--tls-client-cert, CN kubevirt.io:system:client:migration), as KubeVirt issues one per
    node, unless client_pair=False: a stock target refuses the node certificate as a client's.
    kubevirt: a release of KUBEVIRT_VERSIONS: the peers are KubeVirt's own code of that release
    (tests/kvpeer), else tests/stockpeer; peer: a peer binary's path instead (its kind from its
    name)."""

    def __init__(self, daemons=True, pki=False, client_pair=True, kubevirt=None, peer=None,
                 **kw):
        if not daemons:
            kw.setdefault('vmigd', '')
            kw.setdefault('vmigctl', '')
        super().__init__(**kw)
        self.with_daemons, self.want_pki, self.client_pair = daemons, pki, client_pair
        self.kubevirt, self.peer_binary = kubevirt, peer
        self.stockpeer = None
        self.peers = []

    def _daemon_tls(self, side):
        tls = super()._daemon_tls(side)
        if self.client_pair and self.tls[side] is True and isinstance(tls, dict):
            tls = dict(tls, client_cert=self.pki.client.cert, client_key=self.pki.client.key)
        return tls

    def __enter__(self):
        if self.peer_binary:
            self.stockpeer = self.peer_binary
        elif self.kubevirt:
            self.stockpeer = kvpeer_binary(self.kubevirt)
        else:
            self.stockpeer = stockpeer_binary()
        if self.with_daemons:
            super().__enter__()
            try:
                if self.want_pki and self.pki is None:
                    self.pki = make_pki(self.path('pki'))
            except BaseException:
                self.__exit__(*sys.exc_info())
                raise
            return self
        self.resolve_qemus()
        self.workdir = tempfile.mkdtemp(prefix='vmig-', dir='/tmp')
        try:
            self.net.__enter__()
            os.makedirs(self.path('src'))
            os.makedirs(self.path('dst'))
            if self.want_pki or any(v is True for v in self.tls.values()):
                self.pki = make_pki(self.path('pki'))
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def close(self):
        try:
            while self.peers:
                self.peers.pop().stop(timeout=10)
        finally:
            super().close()

    def describe(self):
        if self.with_daemons:
            return super().describe()
        return (f'source namespace {self.net.source_ns} {self.net.source_addr}, target '
                f'namespace {self.net.target_ns} {self.net.target_addr}, {self.qemu_versions()}')

    def dump_logs(self, lines=40):
        try:
            for p in self.peers:
                sys.stdout.write(f'--- tail of {p.log_path}\n{tail(p.log_path, lines)}')
            sys.stdout.flush()
        except OSError:
            pass
        super().dump_logs(lines)

    def _peer(self, side, name, tls, extra_args, binary=None):
        peer = StockPeer(binary or self.stockpeer, name, self.workdir, self.net.prefix(side),
                         tls, extra_args)
        self.peers.append(peer)
        return peer

    def stock_target(self, key, sockets, tls=None, name=None, extra_args=(), binary=None, **kw):
        """A stock target peer in the target namespace for migration KEY (see
        StockPeer.start_target(); it listens on the wildcard and advertises the target
        namespace's address); the StockPeer, started. binary: another peer than the
        testbed's (stockpeer_binary() or kvpeer_binary())."""
        peer = self._peer('target', name or f'stock-target-{key}', tls, extra_args, binary)
        kw.setdefault('advertise', self.net.target_addr)
        peer.start_target(key, sockets, **kw)
        return peer

    def stock_source(self, key, target_json, tls=None, name=None, basedir=None, extra_args=(),
                     binary=None, **kw):
        """A stock source peer in the source namespace (see StockPeer.start_source(); sockets
        under basedir, default WORKDIR/src, owned by us); the StockPeer, started. binary: as
        stock_target()'s."""
        peer = self._peer('source', name or f'stock-source-{key}', tls, extra_args, binary)
        kw.setdefault('socket_owner', f'{os.getuid()}:{os.getgid()}')
        peer.start_source(key, target_json, basedir or self.path('src'), **kw)
        return peer


def kubevirt_dst_socket(tb, key, logical=DEFAULT_PORT_ID):
    """Where the destination QEMU listens in a KubeVirt target launcher, under the testbed:
    WORKDIR/dst/migrationproxy/KEY-LOGICAL-source.sock (the same name as the source's socket)."""
    suffix = f'{key}-{logical}' if logical else key
    path = tb.path('dst', 'migrationproxy', f'{suffix}-source.sock')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def vmigd_tls_flag(tls):
    return ['--tls'] if tls else ['--no-tls']


def start_migration(tb, src, dst, source='stock', target='stock', key=None, channels=0,
                    tls=False, max_bandwidth=DEFAULT_MAX_BANDWIDTH, source_cert=None,
                    target_cert=None, client_cns=None, server_cn=None, source_args=(),
                    target_args=(), peers=None):
    """KubeVirt's flow through tb (a StockTestbed) with each end a stock peer ('stock') or
    tb's vmigd in KubeVirt mode ('vmigd': `target start --kubevirt`, `source start` given the
    target's KubeVirt JSON): the destination listens on KubeVirt's socket name, the target
    side publishes its map, the source side makes KEY-49152-source.sock from it, the source
    QEMU migrates to that socket. tls: this migration's TLS (KubeVirt's disableTLS is
    tls=False); a stock peer then uses tb.pki's node pair as target and its client pair as
    source, unless target_cert/source_cert name another (a PKI certificate's name or a
    CertFiles); client_cns: the stock target's --client-cn; server_cn: the stock source's
    --server-cn; source_args/target_args: more vmigctl arguments; peers: {'source': binary,
    'target': binary} for stock ends whose peer is not the testbed's. Returns a DaemonMigration
    (source_daemon/target_daemon are the peers or the daemons) once `migrate` is issued, with
    .peers: {'source': StockPeer or None, 'target': ...}."""
    for end in (source, target):
        if end not in ('stock', 'vmigd'):
            raise HarnessError(f'unknown end {end!r}: stock or vmigd')
    if tls and tb.pki is None:
        raise HarnessError('a TLS migration needs tb.pki (StockTestbed(pki=True) or tls=True)')
    key = key or tb.new_key('stock')
    dst_sock = kubevirt_dst_socket(tb, key)
    configure_migration(src, dst, channels, max_bandwidth)
    dst.execute('migrate-incoming', {'uri': f'unix:{dst_sock}'})
    binaries = peers or {}
    peers = {'source': None, 'target': None}
    if target == 'stock':
        peers['target'] = tb.stock_target(
            key, {DEFAULT_PORT_ID: dst_sock},
            tls=stock_tls(tb.pki, 'target', target_cert) if tls else None,
            client_cns=client_cns, binary=binaries.get('target'))
        target_end, raw = peers['target'], peers['target'].target_raw
    else:
        raw = tb.target.ctl_ok('target', 'start', key, '--socket', f'{DEFAULT_PORT_ID}={dst_sock}',
                               '--kubevirt', *vmigd_tls_flag(tls), *target_args).strip()
        target_end = tb.target
    if source == 'stock':
        peers['source'] = tb.stock_source(
            key, raw, tls=stock_tls(tb.pki, 'source', source_cert) if tls else None,
            server_cn=server_cn, binary=binaries.get('source'))
        source_end, sockets = peers['source'], peers['source'].sockets
    else:
        source_end = tb.source
        sockets = tb.source.source_start(key, raw, tb.path('src'),
                                         extra=[*vmigd_tls_flag(tls), *source_args])
    m = DaemonMigration(src, dst, source_end, target_end, key, channels)
    m.target_raw, m.target, m.peers = raw, json.loads(raw), peers
    m.sockets = [s for s in sockets if s.endswith(f'{key}-{DEFAULT_PORT_ID}-source.sock')]
    if len(m.sockets) != 1:
        raise HarnessError(f'the source side made {sockets}, expected one '
                           f'{key}-{DEFAULT_PORT_ID}-source.sock')
    log(f'  {key}: {source} source -> {target} target, tls={"on" if tls else "off"}, '
        f'map {m.target.get("targetDirectMigrationNodePorts")} at '
        f'{m.target.get("targetNodeAddress")}')
    m.src_state = src.run_state()
    m.started = time.monotonic()
    src.execute('migrate', {'uri': f'unix:{m.sockets[0]}'})
    return m
