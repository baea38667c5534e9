"""Guest memory images that look like a real guest's, for the bench and the tests: what a page
cache holds (this machine's own libraries, binaries, text and already-compressed archives, each
file from a page boundary, its last page zero-padded), with a stated share of random pages
(encrypted or compressed data) and of zero pages (memory a guest touched and freed). Made once
per (size, shares, variant) and cached beside the random ones; deterministic for a machine's
files."""

import os
import random
import shutil
import subprocess
import tempfile

PAGE = 4096
# What a page cache holds, in the order a guest that ran a while might have read it: shared
# libraries and binaries (code and data), text (documentation, scripts, locale tables) and the
# compressed archives Debian keeps its manuals and changelogs in.
SOURCES = ('/usr/lib/x86_64-linux-gnu', '/usr/bin', '/usr/sbin', '/usr/lib/python3',
           '/usr/share/perl', '/usr/share/doc', '/usr/share/man', '/usr/share/locale',
           '/usr/share/i18n', '/usr/include')
RANDOM_PCT = 10
ZERO_PCT = 20


def _files(seed):
    """Regular files under SOURCES (no links), in a shuffled but repeatable order."""
    found = []
    for top in SOURCES:
        for root, dirs, names in os.walk(top):
            dirs.sort()
            for n in sorted(names):
                path = os.path.join(root, n)
                if os.path.isfile(path) and not os.path.islink(path):
                    found.append(path)
    random.Random(seed).shuffle(found)
    return found


def _pages(seed):
    """The machine's file pages, file after file (each from a page boundary), round and round."""
    files = _files(seed)
    if not files:
        raise OSError('no files under ' + ', '.join(SOURCES))
    while True:
        for path in files:
            try:
                with open(path, 'rb') as f:
                    while True:
                        page = f.read(PAGE)
                        if not page:
                            break
                        yield page.ljust(PAGE, b'\0')
            except OSError:
                continue


def realistic_ram_file(size_mib, random_pct=RANDOM_PCT, zero_pct=ZERO_PCT, variant=0,
                       cache_dir=None):
    """A size_mib MiB image of file pages with random_pct % random pages and zero_pct % zero
    pages spread through it (each page's kind drawn from a seeded generator); its path."""
    if not 0 <= random_pct and 0 <= zero_pct and random_pct + zero_pct <= 100:
        raise ValueError(f'shares {random_pct} % random and {zero_pct} % zero do not add up')
    cache_dir = cache_dir or os.environ.get('VMIG_CACHE_DIR',
                                            f'/var/tmp/vmigharness-{os.getuid()}')
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir,
                        f'realistic-{size_mib}M-r{random_pct}-z{zero_pct}-{variant}.bin')
    if os.path.exists(path) and os.path.getsize(path) == size_mib << 20:
        return path
    rng = random.Random(f'vmig-realistic-{variant}')
    pages = _pages(variant)
    zero = bytes(PAGE)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix='.realistic-')
    try:
        with os.fdopen(fd, 'wb') as f:
            for _ in range((size_mib << 20) // PAGE):
                x = rng.randrange(100)
                if x < random_pct:
                    f.write(rng.randbytes(PAGE))
                elif x < random_pct + zero_pct:
                    f.write(zero)
                else:
                    f.write(next(pages))
        try:
            os.link(tmp, path)  # the first writer wins, as with the random files
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return path


def zstd_ratio(path, level=1, nonzero=False):
    """The image's size over its size compressed with zstd at level (the CLI, one thread, as
    one stream): how compressible it is, for the record; nonzero: of its non-zero pages only,
    which is what QEMU sends as data (it sends a zero page as a flag). None without the zstd
    tool."""
    zstd = shutil.which('zstd')
    if not zstd:
        return None
    cache = f'{path}.zstd{level}{"nz" if nonzero else ""}'
    if os.path.exists(cache) and os.path.getmtime(cache) >= os.path.getmtime(path):
        with open(cache) as f:
            return float(f.read())
    zero, size = bytes(PAGE), 0
    with tempfile.TemporaryFile() as packed, open(path, 'rb') as src:
        proc = subprocess.Popen([zstd, f'-{level}', '-T1', '-c'], stdin=subprocess.PIPE,
                                stdout=packed)
        while True:
            chunk = src.read(1 << 20)
            if not chunk:
                break
            if nonzero:
                chunk = b''.join(chunk[i:i + PAGE] for i in range(0, len(chunk), PAGE)
                                 if chunk[i:i + PAGE] != zero)
            size += len(chunk)
            proc.stdin.write(chunk)
        proc.stdin.close()
        if proc.wait() != 0:
            return None
        packed.seek(0, os.SEEK_END)
        ratio = size / max(packed.tell(), 1)
    with open(cache, 'w') as f:
        f.write(f'{ratio:.4f}')
    return ratio
