#!/usr/bin/env python3
"""Integration test of the data path's byte semantics through two vmigd in two namespaces, with
plain sockets at both ends: every byte arrives unchanged, a half-close reaches the far end while the
return direction keeps working (as QEMU's return path needs), and connections reach the destination
socket in the source's accept order even when the first one is held back."""

import hashlib
import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

PAYLOAD = 64 << 20
ORDERED_CONNS = 9


def check_half_close(tb):
    """Source sends PAYLOAD and half-closes; the destination reads to EOF, answers with the
    digest and closes; the source must read that answer and then EOF."""
    def echo_digest(conn):
        data = vt.recv_all(conn)
        conn.sendall(hashlib.sha256(data).hexdigest().encode())
        return len(data)

    dst = tb.unix_server('half.sock', echo_digest)
    key = tb.new_key('half')
    entry = tb.start_route(key, dst.path)
    payload = os.urandom(PAYLOAD)
    with tb.net.socket('source', socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(entry)
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        answer = vt.recv_all(s)
    received, = dst.join()
    if received != PAYLOAD:
        raise vt.HarnessError(f'destination got {received} bytes, sent {PAYLOAD}')
    if answer.decode() != hashlib.sha256(payload).hexdigest():
        raise vt.HarnessError(f'the reply over the return direction is wrong: {answer[:80]!r}')
    for d, role in tb.sides():
        d.ctl_ok(role, 'stop', key)
        rec = d.stop_record(key, role)
        if rec.get('outcome') != 'ok' or int(rec['bytes']) != PAYLOAD + 64:
            raise vt.HarnessError(f'{d.name} stop line {rec}, expected ok and {PAYLOAD + 64} '
                                  'bytes')
    vt.log(f'half-close: {PAYLOAD} bytes forward, digest back, clean ends on both daemons')


def check_order(tb):
    """ORDERED_CONNS sequential connections, each sending its index; the destination must accept
    them in that order although connection 0 reaches the target last."""
    dst = tb.unix_server('order.sock', lambda conn: int(vt.recv_all(conn)), ORDERED_CONNS)
    key = tb.new_key('order')
    entry = tb.start_route(key, dst.path, delay_first_ms=500)
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
        raise vt.HarnessError(f'destination accepted connections in order {order}')
    tb.source.source_stop(key)
    tb.target.target_stop(key)
    reordered = int(tb.target.stop_record(key, 'target').get('reordered', -1))
    if reordered != ORDERED_CONNS - 1:
        raise vt.HarnessError(f'target reordered {reordered}, expected {ORDERED_CONNS - 1}')
    vt.log(f'order: {ORDERED_CONNS} connections accepted as 0..{ORDERED_CONNS - 1}, '
           f'{reordered} held back by the target')


def main():
    # The source is vmigd-test: --test-delay-first is the test build's (doc/control-protocol.md).
    with vt.Testbed(source_vmigd=vt.find_test_daemon()) as tb:
        check_half_close(tb)
        check_order(tb)
        tb.stop_daemons()


if __name__ == '__main__':
    vt.run_main(main)
