"""Network namespaces for the tests: two joined by a veth pair (NetPair), commands and sockets
inside one, and a unix listener standing where a destination QEMU would. Stdlib only; root."""

import atexit
import ctypes
import hashlib
import os
import re
import shutil
import select
import socket
import subprocess
import threading
import time

from .base import HarnessError, Skip

CLONE_NEWNET = 0x40000000


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

    def ns(self, side):
        """side's ('source'/'target') namespace; None in loopback mode."""
        return self.source_ns if side == 'source' else self.target_ns

    def prefix(self, side):
        """Command prefix that runs a program in side's ('source'/'target') namespace."""
        return netns_prefix(self.ns(side))

    def socket(self, side, family=socket.AF_INET, type=socket.SOCK_STREAM):
        """A socket created inside side's namespace (it stays there for its lifetime)."""
        return netns_socket(self.ns(side), family, type)


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


def peer_closed(socks, timeout):
    """Those of socks (plain sockets) that the peer closed or reset, waiting at most timeout
    seconds for the first; bytes the peer sends are discarded."""
    if not socks:
        return []
    readable, _, _ = select.select(socks, [], [], timeout)
    closed = []
    for s in readable:
        try:
            data = s.recv(4096)
        except OSError:
            data = b''
        if not data:
            closed.append(s)
    return closed


def read_until_close(sock, deadline):
    """Bytes read until EOF or reset; HarnessError if the peer keeps the connection open past
    deadline (time.monotonic())."""
    data = b''
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise HarnessError(f'connection still open after {len(data)} reply bytes')
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def recv_all(conn):
    """Everything conn sends until EOF (a UnixServer handler)."""
    chunks = []
    while True:
        data = conn.recv(1 << 20)
        if not data:
            return b''.join(chunks)
        chunks.append(data)


def digest_all(conn):
    """(sha256 hex, byte count) of everything conn sends until EOF (a UnixServer handler)."""
    digest, count = hashlib.sha256(), 0
    while True:
        data = conn.recv(1 << 20)
        if not data:
            return digest.hexdigest(), count
        digest.update(data)
        count += len(data)


class UnixServer:
    """A unix listener at path in side's namespace of net, standing where a destination QEMU
    would: a thread accepts conns connections one after the other and calls handler(conn) on
    each (timeout seconds for every accept and read); join() returns the handlers' results in
    accept order."""

    def __init__(self, net, side, path, handler, conns=1, timeout=60):
        self.path, self.handler, self.conns, self.timeout = path, handler, conns, timeout
        self.sock = net.socket(side, socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(64)
        self.sock.settimeout(timeout)
        self.results, self.error = [], None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for _ in range(self.conns):
                conn, _ = self.sock.accept()
                with conn:
                    conn.settimeout(self.timeout)
                    self.results.append(self.handler(conn))
        except Exception as e:             # noqa: BLE001 -- reported by join()
            self.error = e

    def join(self, timeout=90):
        """The handlers' results; HarnessError if one failed or they are not done in time."""
        self.thread.join(timeout)
        self.sock.close()
        if self.thread.is_alive() or self.error:
            raise HarnessError(f'unix listener {self.path}: {self.error or "still running"}')
        return self.results
