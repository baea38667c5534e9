"""What crosses the node hop, seen from outside the daemons: the preamble and its reply, raw TLS
clients with a chosen certificate (Python ssl) in a namespace, and a capture of the node-hop TCP
payload (AF_PACKET) with a count of guest pages in it. Stdlib only."""

import dataclasses
import socket
import ssl
import struct
import subprocess
import threading
import time

from .base import DEFAULT_PORT_ID
from .net import netns_socket
from .qemu import random_ram_file
from .tls import normalize_serial


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
                read=8, timeout=5.0, bind=None):
    """Open a TLS connection to a node-hop listener from namespace ns (None: ours) with the given
    client certificate (None: none) and CA, send `send` once the handshake is done, then wait up
    to `wait` seconds for `read` reply bytes, an alert or a close. bind: the local address to
    connect from (None: the kernel's choice). Returns a TLSProbe."""
    started = time.monotonic()
    raw = netns_socket(ns)
    sock = raw
    probe = TLSProbe('open')
    try:
        raw.settimeout(timeout)
        if bind:
            raw.bind((bind, 0))
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
# The VMGR reply's status (doc/interfaces.md).
(REPLY_OK, REPLY_MALFORMED, REPLY_BAD_VERSION, REPLY_UNKNOWN_KEY, REPLY_UNKNOWN_PORT,
 REPLY_DUPLICATE, REPLY_CONNECT, REPLY_FAILED, REPLY_SHUTDOWN, REPLY_LIMIT,
 REPLY_NOT_THE_PEER) = range(11)
PREAMBLE_F_SECRET = 0x0001


def node_hop_preamble(key, port=DEFAULT_PORT_ID, seq=0, magic=PREAMBLE_MAGIC, version=1, flags=0,
                      keylen=None, reserved=0, secret=None):
    """A node-hop preamble (doc/interfaces.md): version 1 and well-formed unless told otherwise
    (keylen: the length field, by default the key's length). secret: the migration's, as the
    target JSON's hex string or bytes; it follows the key, flagged."""
    key = key.encode()
    keylen = len(key) if keylen is None else keylen
    tail = b''
    if secret is not None:
        flags |= PREAMBLE_F_SECRET
        tail = bytes.fromhex(secret) if isinstance(secret, str) else secret
    return (struct.pack('>IHHIIHH', magic, version, flags, port, seq, keylen, reserved) + key +
            tail)


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


class Sniffer:
    """Captures the TCP payload (udp=True: the UDP payload) to and from `port` on interface
    ifname of namespace ns (an AF_PACKET socket, so root only), up to limit bytes, while the
    with-block runs: to check what crosses the node hop. .payload: the bytes, segments
    concatenated in capture order; .packets: how many segments with payload were seen. Packets
    the socket drops are simply missing."""

    ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800

    def __init__(self, ns, ifname, port, limit=2 << 20, udp=False):
        self.ns, self.ifname, self.port, self.limit = ns, ifname, port, limit
        self.proto = 17 if udp else 6
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
            if buf[23] != self.proto:                     # not TCP (or UDP)
                continue
            total = struct.unpack_from('>H', buf, 16)[0] or (n - 14)
            end = min(n, 14 + total)
            tcp = 14 + ihl
            if end < tcp + 20:
                continue
            sport, dport = struct.unpack_from('>HH', buf, tcp)
            if self.port not in (sport, dport):
                continue
            data = tcp + (8 if self.proto == 17 else (buf[tcp + 12] >> 4) * 4)
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
