#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The size guard (tools/check-size) passes on this tree and fails, naming the file or the function
# and its line, on a copy of it with a planted long file or long function.
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from guard import ROOT, copy_layers, expect, finish  # noqa: E402
from guard import run as run_guard  # noqa: E402


def run(root):
    return run_guard("check-size", root)


def planted(name, text):
    """A copy of the four layers with text written as proxy/name; the guard's verdict."""
    with tempfile.TemporaryDirectory() as tmp:
        copy_layers(tmp)
        with open(os.path.join(tmp, "proxy", name), "w") as f:
            f.write(text)
        return run(tmp)


def function(name, body_lines):
    """A kernel-style definition of name whose braces enclose body_lines statements."""
    return ("/* A comment before it. */\nstatic int\n" + name + "(int a,\n\tint b)\n{\n" +
            "\ta += b;\n" * body_lines + "}\n")


rc, err = run(ROOT)
expect(rc == 0 and not err, f"this tree is clean (rc={rc}, {err.strip()!r})")

# 120 lines from the signature's first line to the closing brace pass; 121 fail, named. (The
# planted cases are judged by their own names, so they hold while the tree itself is not clean.)
rc, err = planted("px_fits.c", function("fits", 120 - 5))
expect("px_fits.c" not in err, f"a 120-line function passes ({err.strip()!r})")
rc, err = planted("px_long.c", "\n" + function("too_long", 121 - 5))
expect(rc == 1 and "proxy/px_long.c:3: too_long() is 121 lines, over 120" in err,
       f"a 121-line function fails, named with its first line (rc={rc}, {err.strip()!r})")

# A file of 1,001 lines fails; short functions in it do not matter.
rc, err = planted("px_big.c", "int x;\n" * 1001)
expect(rc == 1 and "proxy/px_big.c: 1001 lines, over 1000" in err,
       f"a 1,001-line file fails (rc={rc}, {err.strip()!r})")
rc, err = planted("px_fine.c", "int x;\n" * 1000)
expect("px_fine.c" not in err, f"a 1,000-line file passes ({err.strip()!r})")

# Tables with their brace on the definition's line are data, not functions.
rc, err = planted("px_table.c", "static const int t[] = {\n" + "\t1,\n" * 300 + "};\n")
expect("px_table.c" not in err, f"a long table is not a function ({err.strip()!r})")

finish()
