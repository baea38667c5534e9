#!/usr/bin/env python3
"""Integration test of the data path's byte semantics through two vmigd in two namespaces, with
plain sockets at both ends: every byte arrives unchanged, a half-close reaches the far end while the
return direction keeps working (as QEMU's return path needs), and connections reach the destination
socket in the source's accept order even when the first one is held back."""

import hashlib
import os
import socket
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigharness as vh  # noqa: E402

PAYLOAD = 64 << 20
ORDERED_CONNS = 9


def recv_all(sock):
    chunks = []
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return b''.join(chunks)
        chunks.append(data)


class Destination:
    """A unix listener in the target namespace standing where the destination QEMU would."""

    def __init__(self, tb, name, handler, conns):
        self.path = tb.path('dst', name)
        self.sock = tb.net.socket('target', socket.AF_UNIX)
        self.sock.bind(self.path)
        self.sock.listen(64)
        self.sock.settimeout(60)
        self.handler, self.conns = handler, conns
        self.results, self.error = [], None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            for _ in range(self.conns):
                conn, _ = self.sock.accept()
                with conn:
                    conn.settimeout(60)
                    self.results.append(self.handler(conn))
        except Exception as e:          # reported by join()
            self.error = e

    def join(self):
        self.thread.join(90)
        self.sock.close()
        if self.thread.is_alive() or self.error:
            raise vh.HarnessError(f'destination {self.path}: {self.error or "still running"}')
        return self.results


def start_route(tb, key, dst_path, delay_first_ms=None):
    raw, _ = tb.target.target_start(key, {vh.DEFAULT_PORT_ID: dst_path})
    return tb.source.source_start(key, raw, tb.path('src'), delay_first_ms)[0]


def check_half_close(tb):
    """Source sends PAYLOAD and half-closes; the destination reads to EOF, answers with the
    digest and closes; the source must read that answer and then EOF."""
    def echo_digest(conn):
        data = recv_all(conn)
        conn.sendall(hashlib.sha256(data).hexdigest().encode())
        return len(data)

    dst = Destination(tb, 'half.sock', echo_digest, 1)
    key = tb.new_key('half')
    entry = start_route(tb, key, dst.path)
    payload = os.urandom(PAYLOAD)
    with tb.net.socket('source', socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(entry)
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        answer = recv_all(s)
    received, = dst.join()
    if received != PAYLOAD:
        raise vh.HarnessError(f'destination got {received} bytes, sent {PAYLOAD}')
    if answer.decode() != hashlib.sha256(payload).hexdigest():
        raise vh.HarnessError(f'the reply over the return direction is wrong: {answer[:80]!r}')
    for d, role in ((tb.source, 'source'), (tb.target, 'target')):
        d.ctl_ok(f'{role}', 'stop', key)
        rec = d.stop_record(key, role)
        if rec.get('outcome') != 'ok' or int(rec['bytes']) != PAYLOAD + 64:
            raise vh.HarnessError(f'{d.name} stop line {rec}, expected ok and {PAYLOAD + 64} '
                                  'bytes')
    vh.log(f'half-close: {PAYLOAD} bytes forward, digest back, clean ends on both daemons')


def check_order(tb):
    """ORDERED_CONNS sequential connections, each sending its index; the destination must accept
    them in that order although connection 0 reaches the target last."""
    dst = Destination(tb, 'order.sock', lambda conn: int(recv_all(conn)), ORDERED_CONNS)
    key = tb.new_key('order')
    entry = start_route(tb, key, dst.path, delay_first_ms=500)
    socks = []
    for i in range(ORDERED_CONNS):
        s = tb.net.socket('source', socket.AF_UNIX)
        s.connect(entry)
        s.sendall(str(i).encode())
        s.shutdown(socket.SHUT_WR)
        socks.append(s)
    order = dst.join()
    for s in socks:
        s.close()
    if order != list(range(ORDERED_CONNS)):
        raise vh.HarnessError(f'destination accepted connections in order {order}')
    tb.source.source_stop(key)
    tb.target.target_stop(key)
    reordered = int(tb.target.stop_record(key, 'target').get('reordered', -1))
    if reordered != ORDERED_CONNS - 1:
        raise vh.HarnessError(f'target reordered {reordered}, expected {ORDERED_CONNS - 1}')
    vh.log(f'order: {ORDERED_CONNS} connections accepted as 0..{ORDERED_CONNS - 1}, '
           f'{reordered} held back by the target')


def main():
    with vh.Testbed() as tb:
        check_half_close(tb)
        check_order(tb)
        tb.stop_daemons()


if __name__ == '__main__':
    vh.run_main(main)
