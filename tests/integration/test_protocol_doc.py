#!/usr/bin/env python3
"""doc/control-protocol.md against a real vmigd (plain text, loopback): every ```request block
is sent, in the page's order, to one daemon's control socket, and the ```reply block after it is
checked against the answer: each key the page shows is there, each value equal (arrays: each
element the page shows matches one of the answer's), except values written "<...>", which must
only be present. @DIR@ is this test's directory, @TARGET@ the last target-start's "target",
@PORT@ a TCP port on 127.0.0.1 that this test holds (a listener of its own). Also
checks that the page lists every op ctl_request.c has, so that a new op cannot go undocumented."""

import json
import os
import re
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DOC = os.path.join(HERE, '..', '..', 'doc', 'control-protocol.md')
PROTO = os.path.join(HERE, '..', '..', 'ctrl', 'ctl_request.c')


def examples(text):
    """[(request text, reply text)] in the page's order."""
    blocks = re.findall(r'^```(request|reply)\n(.*?)^```$', text, re.M | re.S)
    out = []
    for i, (kind, body) in enumerate(blocks):
        if kind == 'request':
            if i + 1 >= len(blocks) or blocks[i + 1][0] != 'reply':
                raise vt.HarnessError(f'a request without a reply after it: {body.strip()}')
            out.append((body.strip(), blocks[i + 1][1].strip()))
    return out


def listening(path):
    """Whether the control socket takes a connection: its file appears at bind(), before the
    daemon listens (a connect in between is refused; seen under ASan)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return False
    return True


def call(path, text):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(text.encode() + b'\n')
        data = b''
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def mismatch(want, got, where='reply'):
    """None when got has everything want shows; else what differs."""
    if isinstance(want, str) and want.startswith('<') and want.endswith('>'):
        return None if got is not None else f'{where}: missing'
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f'{where}: {got!r} is not an object'
        for k, v in want.items():
            if k not in got:
                return f'{where}.{k}: missing'
            why = mismatch(v, got[k], f'{where}.{k}')
            if why:
                return why
        return None
    if isinstance(want, list):
        if not isinstance(got, list):
            return f'{where}: {got!r} is not an array'
        for i, w in enumerate(want):
            if all(mismatch(w, g) for g in got):
                return f'{where}[{i}]: {w!r} matches none of {got!r}'
        return None
    return None if want == got else f'{where}: {got!r}, the page says {want!r}'


def main():
    vmigd, _ = vt.find_binaries()
    with open(DOC) as f:
        page = f.read()
    with open(PROTO) as f:
        ops = re.findall(r'\[CTL_\w+\] = \{ "([a-z-]+)"', f.read())
    ck = vt.Checks('protocol page checks')
    ck.check(len(ops) >= 10, f'only {len(ops)} ops read from {PROTO}: has its table moved?')
    for op in ops:
        ck.check(re.search(rf'^### .*\b{re.escape(op)}\b', page, re.M) is not None,
                 f'op {op} has no section in doc/control-protocol.md')
    pairs = examples(page)
    ck.check(len(pairs) >= 15, f'only {len(pairs)} examples on the page')
    with vt.work_directory('vmig-protodoc-') as tmp:
        os.makedirs(os.path.join(tmp, 'src'))
        ctl = os.path.join(tmp, 'ctl.sock')
        with open(os.path.join(tmp, 'vmigd.log'), 'wb') as logf:
            # Not root: a source's sockets stay the daemon's (no chown to KubeVirt's qemu).
            owner = [] if os.geteuid() == 0 else ['--socket-owner', '-1']
            d = subprocess.Popen([vmigd, '--control', ctl, '--listen', '127.0.0.1:0', '--no-tls',
                                  *owner],
                                 stdout=logf, stderr=logf, stdin=subprocess.DEVNULL)
        held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        held.bind(('127.0.0.1', 0))
        held.listen(1)
        port = str(held.getsockname()[1])
        try:
            vt.wait_until(lambda: listening(ctl), 15, 'vmigd to listen')
            target = None
            for req, rep in pairs:
                text = req.replace('@DIR@', tmp).replace('@PORT@', port)
                if '@TARGET@' in text:
                    text = text.replace('@TARGET@', json.dumps(target))
                want = json.loads(rep.replace('@DIR@', tmp).replace('@PORT@', port))
                got = call(ctl, ' '.join(text.split('\n')))
                why = mismatch(want, got)
                ck.check(why is None, f'{req}: {why}; the daemon answered {got}')
                if json.loads(text).get('op') == 'target-start' and got.get('ok'):
                    target = got['target']
                vt.log(f'  {req[:70]} -> {json.dumps(got)[:90]}')
        finally:
            held.close()
            rc = vt.stop_process(d)
        ck.check(rc == 0, f'vmigd exited {rc}:\n{vt.tail(os.path.join(tmp, "vmigd.log"))}')
    vt.log(f'{len(pairs)} examples of doc/control-protocol.md answered as written; '
           f'{len(ops)} ops documented')
    ck.finish()


if __name__ == '__main__':
    vt.run_main(main)
