#!/usr/bin/env python3
"""Integration test: SIGTERM to both daemons while a capped multifd migration is in flight. They must
stop taking new work (control starts refused, source socket gone) yet carry the migration to its
end, with identical memory, then log its stop line and exit 0."""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

MIB, CHANNELS = 512, 4
BANDWIDTH = 64 << 20               # about 8 s: the signal lands well inside the migration


def main():
    problems = []
    with vt.Testbed() as tb:
        src, dst = tb.qemu_pair(MIB)
        key = tb.new_key('drain')
        m = tb.start_migration(src, dst, key, CHANNELS, max_bandwidth=BANDWIDTH)
        time.sleep(2)
        if m.status() != 'active':
            raise vt.HarnessError(f'migration is {m.status()} before the signal, expected active')
        for d in (tb.source, tb.target):
            d.proc.send_signal(signal.SIGTERM)
        vt.wait_until(lambda: all('draining' in line for line in
                                  [tb.source.log_text(), tb.target.log_text()]),
                      10, 'both daemons to start draining')

        # New work is refused while the old finishes.
        for d in (tb.source, tb.target):
            proc = d.ctl('target', 'start', 'late-key', '--socket',
                         f'49152={tb.path("dst", "late.sock")}')
            if proc.returncode == 0 or 'shutting down' not in proc.stderr:
                problems.append(f'{d.name}: target start during drain gave rc={proc.returncode} '
                                f'{proc.stderr.strip()!r}, expected "shutting down"')
        if os.path.exists(m.sockets[0]):
            problems.append(f'source socket {m.sockets[0]} still exists during the drain')

        info = m.wait(120)
        digest = vt.verify_memory(src, dst)
        vt.log(f'migration completed during the drain: {info["ram"]["transferred"]} bytes in '
               f'{info["_elapsed"]:.2f}s, memory sha256 {digest[:16]}')
        for d, role in tb.sides():
            try:
                d.proc.wait(30)
            except Exception:
                problems.append(f'{d.name} did not exit within 30 s of the migration ending')
                continue
            if d.proc.returncode != 0:
                problems.append(f'{d.name} exited {d.proc.returncode}, expected 0')
            outcome = d.stop_record(key, role).get('outcome')
            if outcome != 'ok':
                problems.append(f'{d.name}: stop line outcome={outcome}, expected ok')
    if problems:
        raise vt.HarnessError('\n  '.join(['drain:'] + problems))


if __name__ == '__main__':
    vt.run_main(main)
