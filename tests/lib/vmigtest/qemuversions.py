"""Which QEMU binary a test runs, by version: Debian 12's QEMU 7.2 on PATH, or QEMU 10.0 from
bookworm-backports that tools/setup extracts beside it (build/qemu10/qemu-system-x86_64, a
wrapper that points it at its own firmware), or $VMIG_QEMU10. A version that is not there is a
Skip that says how to get it. Each side's QEMU comes from $VMIG_QEMU_SRC and $VMIG_QEMU_DST (a
version or a path; 7.2 when unset), and a cross-version pair gets one versioned machine type.
Stdlib only."""

import functools
import os
import re
import shutil
import subprocess

from .base import REPO_ROOT, Skip

QEMU10_DIR = os.path.join(REPO_ROOT, 'build', 'qemu10')
QEMU10_WRAPPER = os.path.join(QEMU10_DIR, 'qemu-system-x86_64')
# What tools/setup wrote when it could not set QEMU 10.0 up (no network to the mirror, ...).
QEMU10_UNAVAILABLE = os.path.join(REPO_ROOT, 'build', 'qemu10-unavailable')
VERSIONS = ('7.2', '10.0')


def _setup_note():
    try:
        with open(QEMU10_UNAVAILABLE) as f:
            return f' (tools/setup said: {f.read().strip()})'
    except OSError:
        return ''


def qemu_binary(version):
    """The qemu-system-x86_64 to run for version '7.2' (the system's, on PATH) or '10.0'
    ($VMIG_QEMU10, else tools/setup's wrapper under build/qemu10). Skip when it is missing;
    ValueError for any other version."""
    if version == '7.2':
        path = shutil.which('qemu-system-x86_64')
        if not path:
            raise Skip('QEMU 7.2: qemu-system-x86_64 is not on PATH (tools/setup installs '
                       'Debian 12\'s qemu-system-x86)')
        return path
    if version == '10.0':
        env = os.environ.get('VMIG_QEMU10')
        if env:
            if not os.access(env, os.X_OK):
                raise Skip(f'QEMU 10.0: $VMIG_QEMU10={env} is not an executable')
            return env
        real = os.path.join(QEMU10_DIR, 'root', 'usr', 'bin', 'qemu-system-x86_64')
        if not (os.access(QEMU10_WRAPPER, os.X_OK) and os.access(real, os.X_OK)):
            raise Skip(f'QEMU 10.0: {QEMU10_WRAPPER} is not set up{_setup_note()}; run '
                       'tools/setup (it fetches QEMU 10.0 from bookworm-backports, about 15 MB, '
                       'without installing it) or set VMIG_QEMU10')
        return QEMU10_WRAPPER
    raise ValueError(f'QEMU version {version!r}: one of {", ".join(VERSIONS)}')


# Which QEMU each side of a testbed runs: a version of VERSIONS or a path; 7.2 when unset.
SIDE_ENV = {'source': 'VMIG_QEMU_SRC', 'destination': 'VMIG_QEMU_DST'}


def resolve_qemu(spec):
    """A QEMU binary's path from a version ('7.2', '10.0'), a path or a command name on PATH;
    Skip when it is not there."""
    if spec in VERSIONS:
        return qemu_binary(spec)
    path = spec if os.sep in spec else shutil.which(spec)
    if not path or not os.access(path, os.X_OK):
        raise Skip(f'QEMU {spec!r} is not an executable (give a version, {", ".join(VERSIONS)}, '
                   'or a path)')
    return path


def side_qemu(side):
    """The QEMU binary for side 'source' or 'destination', from $VMIG_QEMU_SRC/$VMIG_QEMU_DST
    (meson test --setup qemu10 or --setup cross set them); the system's 7.2 when unset."""
    return resolve_qemu(os.environ.get(SIDE_ENV[side]) or '7.2')


def machine_for(src_binary, dst_binary):
    """The -machine type both sides of a migration run: 'q35' (each binary's newest) when both
    are the same major.minor, else the older one's versioned q35 (pc-q35-7.2 for 7.2 -> 10.0),
    since q35 names a different machine in each version and the stream would not load."""
    vs, vd = qemu_version(src_binary), qemu_version(dst_binary)
    if vs is None or vd is None or vs[:2] == vd[:2]:
        return 'q35'
    low = min(vs, vd)
    return f'pc-q35-{low[0]}.{low[1]}'


@functools.lru_cache(maxsize=None)
def qemu_version(binary):
    """(major, minor, micro) from `binary --version`, for a test's log; None when it cannot
    tell."""
    try:
        out = subprocess.run([binary, '--version'], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version (\d+)\.(\d+)\.(\d+)', out)
    return tuple(int(x) for x in m.groups()) if m else None
