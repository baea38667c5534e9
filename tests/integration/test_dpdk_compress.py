#!/usr/bin/env python3
"""Compression over the DPDK node hop: real QEMU 7.2 migrations (64 MiB of the realistic image,
4 multifd channels, the guest paused, a 16 MiB/s cap on the source) between two vmigd whose node
hop is DPDK:
- net_memif, sealed (TLS), `--compress always`: every connection links `path=dpdk` and
  compresses; the chunks shrink to at most 70 %, the node hop carries at most the cap, and the
  target decodes exactly what the source sent;
- net_memif, plain, the default `auto`: the cap holds the connections back, so they compress;
- net_af_packet, sealed, `always`, the source's DPDK interface taken down mid-stream: every
  connection falls back to the kernel path from the chunks the target had whole, goes on
  compressing there, and the migration completes.
After each: QEMU says completed, guest memory is identical on both sides and both daemons'
digests of every connection match. 19 s alone here, 18 s under ASan (25 s in durations.tsv for a
busier machine)."""

import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402
import test_compress as tc  # noqa: E402  (its check of what went compressed)
import test_dpdk_liveness as live  # noqa: E402  (its veth wires for net_af_packet)

MIB, CHANNELS, CAP = 64, 4, 16 << 20


def bed(kind, sockdir, tag, tls, mode):
    extra = ('--compress', mode)
    if kind == 'memif':
        return vt.Testbed(tls=tls,
                          source_args=vt.dpdk.daemon_args('source', kind, sockdir, tag, extra),
                          target_args=vt.dpdk.daemon_args('target', kind, sockdir, tag, extra))
    return live.afpacket_bed(sockdir, tag, tls, extra)


def migrate(ck, tb, label, image, during=None, path='dpdk'):
    """One capped migration over DPDK with compressible memory; during(): a fault a second into
    it. Both stop lines and the source's linked lines."""
    vt.dpdk.wait_link(tb)
    src, dst = tb.qemu_pair(MIB, ram_file=image)
    key = tb.new_key(label)
    since = {d: d.log_offset() for d in (tb.source, tb.target)}
    m = tb.start_migration(src, dst, key, CHANNELS, bandwidth=f'{CAP}')
    ck.check(m.target.get('compress_dpdk') is True,
             f'{label}: target JSON does not advertise compress_dpdk: {m.target_raw}')
    if during:
        m.wait_active()
        time.sleep(1.0)
        during()
    result, digest = m.finish_verified(timeout=180)
    tb.close_qemus(src, dst)
    recs = {role: d.stop_record(key, role) for d, role in tb.sides()}
    for role, rec in recs.items():
        ck.check(rec.get('outcome') == 'ok', f'{label}: {role} outcome {rec.get("outcome")}')
    linked = {role: d.linked(key, role, since[d]) for d, role in tb.sides()}
    for role, want in (('source', None), ('target', 'in')):
        recs_l = linked[role]
        paths = sorted({r.get('path') for r in recs_l})
        zs = sorted({r.get('compress') for r in recs_l})
        ck.check(len(recs_l) == CHANNELS + 1 and paths == [path],
                 f'{label}: {role} linked {len(recs_l)} connections with path {paths}')
        ck.check(zs == [want] if want else 'off' not in zs and None not in zs,
                 f'{label}: {role} linked with compress={zs}')
    s = recs['source']
    vt.log(f'  {label}: {result.summary()}, memory {digest[:12]}, source stop '
           f'compressed={s.get("compressed", 0)} wire={s.get("wire", 0)} '
           f'zcpu={s.get("zcpu", "0")}')
    return recs, key, since


def always_memif(ck, sockdir, image):
    label = 'memif, TLS, always'
    with bed('memif', sockdir, 'za', True, 'always') as tb:
        recs, _, _ = migrate(ck, tb, 'memif-always', image)
        plain, wire = tc.shrunk(ck, label, recs, 0.7)
        s = recs['source']
        secs = float(s['duration'].rstrip('s'))
        on_wire = int(s['tx']) - plain + wire
        # a cap is a maximum on what the node hop carries (a second of burst allowed)
        ck.check(on_wire <= CAP * (secs + 1),
                 f'{label}: the node hop carried {on_wire} bytes in {secs:.2f}s, over the cap')
        vt.log(f'  {label}: {s["tx"]} stream bytes in {secs:.2f}s, {on_wire} on the node hop')


def auto_memif(ck, sockdir, image):
    with bed('memif', sockdir, 'zb', None, 'auto') as tb:
        recs, _, _ = migrate(ck, tb, 'memif-auto', image)
        tc.shrunk(ck, 'memif, plain, auto', recs, 0.7)


def link_down(ck, sockdir, image):
    label = 'af_packet, TLS, always, link down'
    with bed('afpacket', sockdir, 'zc', True, 'always') as tb:
        s_ns = tb.net.source_ns
        recs, key, since = migrate(
            ck, tb, 'afpacket-down', image,
            during=lambda: live.ip(s_ns, 'link', 'set', 'dS', 'down'))
        fell = {d: [ln for ln in d.log_since(since[d]).splitlines()
                    if key in ln and 'falling back to the kernel path' in ln]
                for d in (tb.source, tb.target)}
        ck.check(len(fell[tb.source]) == CHANNELS + 1 and
                 len(fell[tb.target]) == CHANNELS + 1,
                 f'{label}: {len(fell[tb.source])} connections fell back on the source, '
                 f'{len(fell[tb.target])} on the target')
        kept = [int(x.group(1)) for x in
                map(re.compile(r'(\d+) bytes kept for the peer').search, fell[tb.source]) if x]
        vt.log(f'  {label}: {len(fell[tb.source])} fell back, {sum(kept)} plain bytes kept '
               'for the target')
        tc.shrunk(ck, label, recs, 0.7, same=False)
        live.ip(s_ns, 'link', 'set', 'dS', 'up')


def main():
    vt.dpdk.daemon_ready()
    image = vt.realistic_ram_file(MIB)
    vt.log(f'realistic image {image}: zstd -1 ratio {vt.zstd_ratio(image, 1):.2f}')
    ck = vt.Checks('compression over DPDK')
    try:
        with vt.work_directory('/tmp/vmig-dpdkz-') as sockdir:
            always_memif(ck, sockdir, image)
            auto_memif(ck, sockdir, image)
            link_down(ck, sockdir, image)
    finally:
        vt.dpdk.remove_eal_dirs()
    ck.finish()


if __name__ == '__main__':
    vt.run_main(main)
