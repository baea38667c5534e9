# SPDX-License-Identifier: Apache-2.0
# What the tests of the tree's guards (tools/check-layers, tools/check-size) share: running a
# guard on a tree, copying the four layers to plant an offence, and keeping score.
import os
import shutil
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
LAYERS = ("lib", "transport", "proxy", "ctrl")
failures = []


def run(tool, root):
    """tools/TOOL on root: (exit status, stderr)."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", tool), root],
                       capture_output=True, text=True)
    return p.returncode, p.stderr


def copy_layers(dest):
    """The four layers of this tree, copied under dest."""
    for d in LAYERS:
        shutil.copytree(os.path.join(ROOT, d), os.path.join(dest, d))


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def finish():
    """Exit 1 when an expectation failed."""
    if failures:
        print(f"{len(failures)} failed", file=sys.stderr)
        sys.exit(1)
