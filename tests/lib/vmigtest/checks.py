"""How a test reports: run_main() (exit 0, 1, or 77 for a skip), the Checks collector that runs
many small checks and fails once listing them all, and small bounds and checks shared by tests.
Stdlib only."""

import signal
import sys
import threading

from .base import SKIP_EXIT, HarnessError, Skip, log


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


def still_in_flight(m):
    """A Checks case: the DaemonMigration m is still active, so what ran before it ran while a
    migration was in flight."""
    status = m.status()
    if status != 'active':
        raise HarnessError(f'the migration is {status}: the probes did not all run while it was '
                           'in flight')
    return 'yes'


def answers(daemon):
    """A Checks case: daemon still runs, answers status, and status's pid is the one we started
    (`ip netns exec` execs vmigd)."""
    if not daemon.alive():
        raise HarnessError(f'exited with status {daemon.proc.returncode}')
    pid = daemon.status_field('pid')
    if pid != daemon.proc.pid:
        raise HarnessError(f'status reports pid {pid}, we started {daemon.proc.pid}')
    return f'pid {pid}'


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

    def check(self, cond, what):
        """One condition rather than a function: a failure named what (logged at once) unless
        cond is true. Returns cond."""
        with self.lock:
            self.count += 1
            if not cond:
                self.failures.append(what)
        if not cond:
            log(f'  PROBLEM: {what}')
        return cond

    def finish(self):
        if self.failures:
            raise HarnessError(f'{len(self.failures)} of {self.count} {self.noun} failed:\n  '
                               + '\n  '.join(self.failures))


def within(value, expected, tolerance):
    """Whether value lies within +-tolerance (a fraction) of expected."""
    return abs(value - expected) <= tolerance * expected
