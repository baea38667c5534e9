#!/usr/bin/env python3
"""The bench's realistic guest memory image (tests/lib/vmigtest/ramimage.py): built from this
machine's files with the stated shares of random and zero pages, the same bytes when made again,
and compressible where the random image is not (the zstd ratios the bench prints). No root, no
QEMU; a 16 MiB image, about 2 s."""

import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402
from vmigtest import ramimage  # noqa: E402

MIB = 16


def shares(path):
    """Zero pages, and pages that look random (nearly every byte value, none much more often
    than the 16 times of a uniform page: what file pages almost never are, compressed ones
    aside), as fractions of the image."""
    zero, zeros, rand, n = bytes(ramimage.PAGE), 0, 0, 0
    with open(path, 'rb') as f:
        while True:
            page = f.read(ramimage.PAGE)
            if not page:
                break
            n += 1
            if page == zero:
                zeros += 1
            elif len(set(page)) >= 250 and max(collections.Counter(page).values()) < 40:
                rand += 1
    return zeros / n, rand / n


def main():
    checks = vt.Checks('the realistic memory image')
    with vt.work_directory('/tmp/vmig-ramimage-') as d:
        path = ramimage.realistic_ram_file(MIB, cache_dir=d)
        checks.check(os.path.getsize(path) == MIB << 20, f'{path}: {os.path.getsize(path)} bytes')
        zeros, rand = shares(path)
        vt.log(f'{MIB} MiB image: {zeros:.1%} zero pages (asked {ramimage.ZERO_PCT} %), '
               f'{rand:.1%} random-looking (asked {ramimage.RANDOM_PCT} %; compressed archives '
               'among the files look random too)')
        checks.check(abs(zeros - ramimage.ZERO_PCT / 100) < 0.03,
                     f'zero pages {zeros:.1%}, asked {ramimage.ZERO_PCT} %')
        checks.check(ramimage.RANDOM_PCT / 100 - 0.02 < rand < ramimage.RANDOM_PCT / 100 + 0.15,
                     f'random-looking pages {rand:.1%}, asked {ramimage.RANDOM_PCT} % (and '
                     'some archives)')
        again = ramimage.realistic_ram_file(MIB, variant=0, cache_dir=os.path.join(d, 'again'))
        with open(path, 'rb') as a, open(again, 'rb') as b:
            checks.check(a.read() == b.read(), 'made again, the image differs')
        ratio = ramimage.zstd_ratio(path, 1)
        nonzero = ramimage.zstd_ratio(path, 1, nonzero=True)
        rnd = ramimage.zstd_ratio(vt.random_ram_file(MIB, cache_dir=d), 1)
        if ratio is None:
            raise vt.Skip('no zstd tool: the ratios are not measured')
        vt.log(f'zstd -1: {ratio:.2f} of the image, {nonzero:.2f} of its non-zero pages, '
               f'{rnd:.3f} of random memory')
        checks.check(nonzero > 1.5, f'non-zero pages compress only {nonzero:.2f}x')
        checks.check(rnd < 1.01, f'random memory compresses {rnd:.3f}x')
    checks.finish()
    vt.log('ok: the realistic image has its shares, is repeatable, and compresses')


if __name__ == '__main__':
    vt.run_main(main)
