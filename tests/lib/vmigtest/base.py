"""Basics every module of the harness shares: the errors, progress lines, deadlines, log tails,
stopping a process, the repository's root and work directories. Stdlib only."""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time

SKIP_EXIT = 77
DEFAULT_PORT_ID = 49152
MIB = 1 << 20
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..',
                                         '..'))


class Skip(Exception):
    """The test cannot run here (not root, no netns, binaries not built); exit status 77."""


class HarnessError(Exception):
    """A step of the test failed: a command, a wait, a check."""


def log(msg):
    """Progress line on stdout (meson test captures it)."""
    print(msg, flush=True)


def wait_until(predicate, timeout, what, interval=0.05):
    """Poll predicate() until it returns a true value; return that. HarnessError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise HarnessError(f'timed out after {timeout:g}s waiting for {what}')
        time.sleep(interval)


def tail(path, lines=40):
    """The last lines of a text file, or a note that it is missing."""
    try:
        with open(path, errors='replace') as f:
            return ''.join(f.readlines()[-lines:])
    except OSError as e:
        return f'({e})\n'


def stop_process(proc, timeout=10, sig=signal.SIGTERM):
    """Send sig, wait up to timeout, then SIGKILL. The exit status (None if never started)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def work_directory(prefix, keep_on_error=False):
    """A fresh directory under /tmp for a test without a Testbed (which makes its own). Removed on
    leaving the block, unless $VMIG_KEEP is set or keep_on_error and the block raised: then its
    path is logged."""
    path = tempfile.mkdtemp(prefix=prefix, dir='/tmp')
    ok = False
    try:
        yield path
        ok = True
    finally:
        if os.environ.get('VMIG_KEEP') or (keep_on_error and not ok):
            log(f'kept {path}')
        else:
            shutil.rmtree(path, ignore_errors=True)


def tool_binary(env, name):
    """A program of the build that a test drives: $ENV (meson sets it), else REPO/build/NAME.
    Skip when it is not built."""
    path = os.environ.get(env) or os.path.join(REPO_ROOT, 'build', name)
    if not os.access(path, os.X_OK):
        raise Skip(f'{path} not built (ninja -C build, or set {env})')
    return path
