#!/usr/bin/env python3
"""The DPDK node hop's pieces, end to end on real DPDK ports: xp_dpdk (EAL, ARP, IPv4/UDP), xp_rel
(the reliable stream) and xp_seal (AES-GCM keyed per direction), driven by tests/tools/dpdk-stream
in two network namespaces, joined by net_memif (a filesystem socket) and, separately, by
net_af_packet on a veth pair. Every byte is checked by the receiver. Sealed streams are keyed as
the daemons will key them: a mutual-TLS 1.3 control connection over the kernel (the veth), with
the node certificates and the default allow-list, and the TLS exporter's secret per direction. A
capture on the veth finds no clear text (a marker the sender writes every 4 KiB, found in a plain
run's capture); a sender whose certificate is from another CA is refused before it opens its port;
a receiver with another key refuses every frame and delivers nothing; with frames dropped,
duplicated and reordered on arrival the streams retransmit, the seal refuses the duplicates as
replays, and every byte still arrives once, in order. proxy/ does not carry migrations over
this path yet (issue 16); this tests what it will stand on. Skips (77) without DPDK."""

import os
import secrets
import socket
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MARKER = b'VMIGD-CLEAR-TEXT-MARKER'


class Sniffer:
    """Every frame seen on an interface in a namespace (AF_PACKET), joined, while it runs."""

    def __init__(self, net, side, ifname):
        self.sock = net.socket(side, socket.AF_PACKET, socket.SOCK_RAW)
        self.sock.bind((ifname, 0x0003))  # ETH_P_ALL
        self.sock.settimeout(0.2)
        self.data, self.frames, self.stop = bytearray(), 0, False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                self.data += self.sock.recv(65536)
                self.frames += 1
            except socket.timeout:
                continue

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def check_whole(rx, tx, size, what):
    if rx['rc'] != 0 or tx['rc'] != 0 or rx.get('bytes') != size or rx.get('bad_bytes') != 0:
        raise vt.HarnessError(f'{what}: not delivered whole: receiver {rx}, sender {tx}')


def main():
    tool = vt.dpdk.stream_tool()
    with vt.work_directory('/tmp/vmig-dpdk-', keep_on_error=True) as work, vt.NetPair() as net:
        memif, afp = vt.dpdk.MEMIF, vt.dpdk.afpacket(net)
        key = secrets.token_hex(32)
        pki = vt.make_pki(os.path.join(work, 'pki'))
        node = (pki.paths('node'), pki.paths('node2'))

        size = 64 << 20
        rx, tx = vt.dpdk.run_pair(tool, net, work, 'memif-plain', memif, size)
        check_whole(rx, tx, size, 'memif, plain')
        rx, tx = vt.dpdk.run_pair(tool, net, work, 'memif-sealed', memif, size, tls=node)
        check_whole(rx, tx, size, 'memif, sealed')
        if (tx['sealed'] is not True or rx['refused_frames'] != 0
                or {rx['keying'], tx['keying']} != {'tls-exporter'}):
            raise vt.HarnessError(f'memif, sealed, keyed by TLS: {rx} {tx}')

        # Eight streams on one port, as an 8-channel multifd migration has: demultiplexed by
        # stream id, one packet number space per direction under the seal.
        rx, tx = vt.dpdk.run_pair(tool, net, work, 'memif-8streams', memif, size, tls=node, streams=8)
        check_whole(rx, tx, size, 'memif, sealed, 8 streams')
        if rx['streams'] != 8 or rx['unknown_stream'] != 0 or rx['refused_frames'] != 0:
            raise vt.HarnessError(f'memif, 8 streams: {rx}')

        # Frames dropped, duplicated and held back behind the next on arrival: resent, the
        # duplicates refused by the seal as replays (never delivered twice), still whole.
        rx, tx = vt.dpdk.run_pair(tool, net, work, 'memif-loss', memif, 16 << 20, tls=node, streams=4,
                          impair=('--loss', '2', '--duplicate', '2', '--reorder', '3'))
        check_whole(rx, tx, 16 << 20, 'memif, sealed, 4 streams, 2 % dropped, 2 % duplicated, '
                    '3 % reordered')
        if (rx['dropped_by_test'] == 0 or tx['retransmitted_frames'] == 0
                or rx['duplicated_by_test'] == 0 or rx['reordered_by_test'] == 0):
            raise vt.HarnessError(f'memif, damaged: nothing was dropped, duplicated, reordered '
                                  f'or resent: {rx} {tx}')
        if rx['seal_replayed'] < rx['duplicated_by_test']:
            raise vt.HarnessError(f'memif, damaged: duplicates not refused as replays: {rx}')

        # A sender whose certificate another CA signed: refused on the control connection,
        # before it opens its port, so not one frame moves.
        rx, tx = vt.dpdk.run_pair(tool, net, work, 'memif-rogue', memif, 1 << 20, timeout=10,
                          tls=(pki.paths('node'), pki.paths('rogue', ca=pki.ca)))
        if rx['rc'] == 0 or tx['rc'] == 0 or 'untrusted-ca' not in rx.get('refused', ''):
            raise vt.HarnessError(f'a rogue sender was not refused as untrusted: {rx} {tx}')
        if 'bytes' in rx or 'bytes' in tx:
            raise vt.HarnessError(f'a rogue sender got a stream: {rx} {tx}')

        # Shared secrets (a test-only keying) that differ: every frame is refused.
        other = secrets.token_hex(32)
        rx, tx = vt.dpdk.run_pair(tool, net, work, 'memif-wrong-key', memif, 1 << 20, (other, key),
                          timeout=5)
        if rx['rc'] == 0 or rx.get('bytes') != 0 or rx.get('refused_frames', 0) == 0:
            raise vt.HarnessError(f'another key: frames were taken: {rx}')

        # af_packet on the veth pair, with a capture on the receiver's side of it.
        size = 8 << 20
        for name, tls, want_clear in (('afp-plain', None, True), ('afp-sealed', node, False)):
            sniff = Sniffer(net, 'target', net.target_if)
            try:
                rx, tx = vt.dpdk.run_pair(tool, net, work, name, afp, size, tls=tls)
            finally:
                sniff.close()
            check_whole(rx, tx, size, name)
            seen = MARKER in sniff.data
            vt.log(f'{name}: captured {sniff.frames} frames, {len(sniff.data)} bytes; '
                   f'clear-text marker {"found" if seen else "absent"}')
            if seen != want_clear:
                raise vt.HarnessError(f'{name}: clear-text marker {"found" if seen else "absent"}'
                                      f' in the capture')
    vt.log('PASS')


if __name__ == '__main__':
    vt.run_main(main)
