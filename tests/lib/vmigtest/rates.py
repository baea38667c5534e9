"""Rates for the tests: sampling `vmigctl metrics --json` (and QEMU's ram.transferred) while
migrations run, with scheduled actions on the way, and the rates, spans and host conditions
taken from the samples. Stdlib only."""

import dataclasses
import re
import statistics
import subprocess
import time

from .base import MIB, HarnessError
from .net import netns_prefix


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
    shaped_ms: int = 0       # daemon samples: time its connections waited for tokens, summed
    remaining: int = None    # QEMU samples: ram.remaining, what it still had to send
    notsent: int = 0         # backlog samples: bytes its node-hop sockets held unsent
    seq: int = 0             # daemon samples: the sample() call that took it (1, 2, ...)


class RateWatch:
    """Samples the `vmigctl metrics --json` of some daemons (and the source QEMUs' ram.transferred)
    every interval seconds, in the calling thread, while migrations run; runs scheduled actions
    (a cap change) at their times and notes when they ran. series[(daemon name, key)] and
    qemu_series[key]: lists of RateSample in time order; events[label]: time.time() when the
    action had returned. backlog {key: (namespace, address, port)}: also what the TCP sockets
    to address:port in that namespace held unsent (`ss`'s notsent), in backlog_series[key]: a
    sender the kernel holds back (the pacing shaper) keeps a backlog there; every migration to
    that address and port is counted."""

    def __init__(self, daemons, qemus=None, interval=0.5, backlog=None):
        self.daemons, self.qemus, self.interval = list(daemons), dict(qemus or {}), interval
        self.backlog = dict(backlog or {})
        self.series, self.qemu_series, self.backlog_series, self.events = {}, {}, {}, {}
        # events_after[label]: how many sample() calls had run when that action began, so a
        # sample's seq tells whether it was taken before the action, whatever the clocks say.
        self.nsamples, self.events_after = 0, {}
        self.cpu = []                  # (time.time(), idle jiffies, all jiffies) of the host

    def sample(self):
        self.nsamples += 1
        self.cpu.append((time.time(), *cpu_jiffies()))
        for d in self.daemons:
            metrics = d.metrics()
            t = metrics['node']['time_unix']
            for m in metrics.get('migrations') or []:
                insp = m.get('inspect') or {}
                self.series.setdefault((d.name, m['key']), []).append(RateSample(
                    t, m['bytes_tx'], m['bytes_rx'], m['cap'], m['limit'],
                    bool(m.get('cap_lifted')), bool(insp.get('switchover')),
                    m['conns']['active'], shaped_ms=m.get('shaped_ms', 0), seq=self.nsamples))
        for key, q in self.qemus.items():
            before = time.time()
            ram = q.migration_info().get('ram') or {}
            if 'transferred' in ram:
                self.qemu_series.setdefault(key, []).append(
                    RateSample((before + time.time()) / 2, ram['transferred'],
                               faults=q.major_faults(), remaining=ram.get('remaining')))
        for key, (ns, address, port) in self.backlog.items():
            before = time.time()
            out = subprocess.run([*netns_prefix(ns), 'ss', '-tinH', 'state', 'established',
                                  'dst', f'{address}:{port}'], capture_output=True, text=True,
                                 timeout=10).stdout
            self.backlog_series.setdefault(key, []).append(RateSample(
                (before + time.time()) / 2, 0,
                notsent=sum(int(n) for n in re.findall(r'\bnotsent:(\d+)', out))))

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
                self.events_after[label] = self.nsamples
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


def fmt_rates(rates):
    """'50.1 49.9 ...' in MiB/s."""
    return ' '.join(f'{r / MIB:.1f}' for r in rates)


def qemu_pending(watch, key, start, end):
    """The least ram.remaining of KEY's source QEMU sampled within [start, end]: more than 0
    means QEMU had RAM left to send all through (a paused guest's only falls). None: no
    sample there."""
    inside = [s.remaining for s in watch.qemu_series.get(key, [])
              if start <= s.t <= end and s.remaining is not None]
    return min(inside) if inside else None


def held_shares(samples, start, end):
    """[(t0, t1, share)] for each interval between two daemon samples within [start, end]: the
    time its connections waited for tokens (shaped_ms) over the interval, per open connection;
    near 1 when every connection had data the bucket held back all the time, near 0 when the
    bucket had tokens to spare (the sender had nothing more to send)."""
    inside = [s for s in samples if start <= s.t <= end]
    return [(a.t, b.t, (b.shaped_ms - a.shaped_ms) / 1000 / (b.t - a.t) / max(1, b.conns_active))
            for a, b in zip(inside, inside[1:]) if b.t > a.t]


def held_back(samples, start, end, least=0.3, steady=0.85):
    """Whether the daemon of samples was held back by its bucket all through [start, end]: in
    every interval its connections waited for tokens at least `least` of the time each (see
    held_shares()), and at least `steady` x the median interval's share, so that no interval
    shows a sender that ran dry. (True, summary) or (False, why not)."""
    shares = held_shares(samples, start, end)
    if not shares:
        return False, 'no samples to show it was held back by its bucket'
    median = statistics.median(s for _, _, s in shares)
    bar = max(least, steady * median)
    dry = [(t0, t1, s) for t0, t1, s in shares if s < bar]
    summary = (f'held back by its bucket {min(s for _, _, s in shares):.2f}-'
               f'{max(s for _, _, s in shares):.2f} of the time (median {median:.2f})')
    if dry:
        t0, t1, s = dry[0]
        return False, (f'{summary}, only {s:.2f} {t0 - start:.1f}-{t1 - start:.1f}s in (under '
                       f'{bar:.2f}; {len(dry)} of {len(shares)} intervals): the sender ran dry')
    return True, summary


def backlogged(watch, key, start, end, least=64 << 10):
    """Whether KEY's node-hop sockets held at least `least` bytes unsent in every backlog
    sample of watch within [start, end] (RateWatch(backlog=...)): a sender held back by the
    kernel (pacing), not one that ran dry. (True, summary) or (False, why not)."""
    inside = [s for s in watch.backlog_series.get(key, []) if start <= s.t <= end]
    if not inside:
        return False, 'no backlog samples to show it was held back'
    summary = (f'{min(s.notsent for s in inside) >> 10}-{max(s.notsent for s in inside) >> 10} '
               f'KiB unsent on its node-hop sockets')
    dry = [s for s in inside if s.notsent < least]
    if dry:
        return False, (f'{summary}, {dry[0].notsent >> 10} KiB {dry[0].t - start:.1f}s in '
                       f'({len(dry)} of {len(inside)} samples under {least >> 10} KiB): the '
                       'sender ran dry')
    return True, summary
