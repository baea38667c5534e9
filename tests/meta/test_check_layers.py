#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The layer guard (tools/check-layers) passes on this tree and fails, naming file and line, on a
# copy of it with an upward include or an upper layer's library planted in a lower layer.
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from guard import ROOT, copy_layers, expect, finish  # noqa: E402
from guard import run as run_guard  # noqa: E402


def run(root):
    return run_guard("check-layers", root)


def planted(layer, name, line):
    """A copy of the four layers with line appended to layer/name; the guard's verdict."""
    with tempfile.TemporaryDirectory() as tmp:
        copy_layers(tmp)
        with open(os.path.join(tmp, layer, name), "a") as f:
            f.write(line + "\n")
        return run(tmp)


rc, err = run(ROOT)
expect(rc == 0 and not err, f"this tree is clean (rc={rc}, {err.strip()!r})")

cases = [
    ("transport", "xp_pool.c", '#include "px_node.h"', "transport/ includes proxy/px_node.h"),
    ("transport", "xp_sock.h", '#include "ctl_proto.h"', "transport/ includes ctrl/ctl_proto.h"),
    ("proxy", "px_order.c", '#include "cv_watch.h"', "proxy/ includes ctrl/cv_watch.h"),
    ("lib", "log.c", '#include "xp_loop.h"', "lib/ includes transport/xp_loop.h"),
    ("proxy", "px_preamble.c", '#include "proxy/px_node.h"', 'includes "proxy/px_node.h" by path'),
    ("proxy", "px_share.c", "#include <json-c/json.h>", "proxy/ includes <json-c/json.h>"),
    ("transport", "xp_loop.c", "#include <libvirt/libvirt.h>", "transport/ includes <libvirt/"),
]
for layer, name, line, want in cases:
    rc, err = planted(layer, name, line)
    expect(rc == 1 and want in err and f"{layer}/{name}:" in err,
           f"{line} in {layer}/{name} is refused: rc={rc}, {err.strip()!r}")

# Downward and same-layer includes stay allowed.
for layer, name, line in [("ctrl", "ctl_server.c", '#include "px_order.h"'),
                          ("proxy", "px_order.c", '#include "xp_pool.h"'),
                          ("proxy", "px_order.c", '#include "px_share.h"')]:
    rc, err = planted(layer, name, line)
    expect(rc == 0, f"{line} in {layer}/{name} is allowed: rc={rc}, {err.strip()!r}")

# The compiler agrees: each layer's library is built with only its own and lower layers'
# headers on its include path (meson's own compile parameters for it, from the build directory).
build = os.environ.get("VMIG_BUILD_ROOT")
if build:
    targets = json.loads(subprocess.run(["meson", "introspect", "--targets", build],
                                        capture_output=True, text=True, check=True).stdout)
    params = {t["name"]: t["target_sources"][0] for t in targets
              if t["name"] in ("vmlib", "transport", "proxy")}
    for lib, header in [("transport", "px_node.h"), ("transport", "ctl_proto.h"),
                        ("proxy", "cv_watch.h"), ("vmlib", "xp_pool.h"),
                        ("proxy", "xp_pool.h")]:
        src = params[lib]
        incs = [p for p in src["parameters"] if p.startswith("-I")]
        with tempfile.NamedTemporaryFile("w", suffix=".c") as f:
            f.write(f'#include "{header}"\n')
            f.flush()
            p = subprocess.run(src["compiler"] + incs + ["-fsyntax-only", f.name],
                               capture_output=True, text=True)
        upward = header != "xp_pool.h" or lib == "vmlib"
        expect((p.returncode != 0 and "No such file" in p.stderr) if upward
               else p.returncode == 0,
               f"the {lib} library {'cannot' if upward else 'can'} include {header} "
               f"(rc={p.returncode})")
else:
    print("skip the compiler half: VMIG_BUILD_ROOT is not set (meson test sets it)")

finish()
