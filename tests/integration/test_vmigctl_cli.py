#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vmigctl's command line, as a script sees it (vmigctl(8), EXIT STATUS). Every bad invocation
we could think of (unknown command or option, a missing or extra argument, a bad number or rate,
a bare -c, options that exclude each other, a value given to a flag) exits 2 with one line on
stderr that names the offending word, and nothing on stdout, --json or not; --help and
--version exit 0. Without a daemon: exit 3, the line naming ENOENT, ECONNREFUSED or EACCES and
where the path came from (-c, $VMIGD_CONTROL). Against a real vmigd (the build's, plain text on
loopback, no root, no QEMU): every command with --json prints one JSON object; a refusal
(ENOENT, EINVAL, EEXIST) exits 1 with vmigd's error and its errno (name and number) as JSON;
VMIGD_CONTROL is honoured and -c wins over it; doc/vmigctl.8 names every option. Then the bash
completion script: the one the build installs is what `vmigctl completion bash` prints, bash -n
accepts it, and completing words (COMP_WORDS, with bash-completion's helpers where that package is
installed and without) offers the commands, each command's options as its --help lists them,
option values, and the KEYs of `vmigctl list`."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import vmigtest as vt  # noqa: E402

USAGE, REFUSED, NO_DAEMON = 2, 1, 3
BASH_COMPLETION = '/usr/share/bash-completion/bash_completion'


class Runner:
    def __init__(self, vmigctl, problems):
        self.vmigctl, self.problems, self.checks = vmigctl, problems, 0

    def run(self, args, env=None, timeout=20):
        e = dict(os.environ)
        e.pop('VMIGD_CONTROL', None)
        e.update(env or {})
        return subprocess.run([self.vmigctl, *args], capture_output=True, text=True,
                              timeout=timeout, env=e, stdin=subprocess.DEVNULL)

    def check(self, ok, what):
        self.checks += 1
        if not ok:
            self.problems.append(what)
        return ok

    def expect(self, args, rc, err=None, out=None, env=None):
        """vmigctl args exits rc; err: a regex the one stderr line must match (whole line),
        None for no stderr; out: a function of stdout that must be true (None: stdout empty).
        Returns the completed process."""
        p = self.run(args, env)
        lines = p.stderr.splitlines()
        what = f'vmigctl {" ".join(args)}: rc={p.returncode} stdout={p.stdout[:300]!r} ' \
               f'stderr={p.stderr!r}'
        good = p.returncode == rc
        if err is None:
            good = good and not p.stderr
        else:
            good = good and len(lines) == 1 and re.fullmatch(err, lines[0]) is not None
        if out is None:
            good = good and not p.stdout
        else:
            try:
                good = good and bool(out(p.stdout))
            except (ValueError, KeyError, TypeError) as e:
                good, what = False, f'{what} ({e!r})'
        want = f'expected rc {rc}' + (f', stderr matching {err!r}' if err else ', no stderr')
        self.check(good, f'{what}; {want}')
        return p


def q(s):
    return re.escape(s)


def usage_line(msg, cmd=None):
    """The regex of a usage error's line."""
    hint = f'vmigctl {cmd} --help' if cmd else 'vmigctl --help'
    return f'vmigctl: {msg}; try "{q(hint)}"'


def json_line(text, **want):
    """text is one line of one JSON object having want's fields."""
    lines = text.splitlines()
    if len(lines) != 1:
        return False
    o = json.loads(lines[0])
    return isinstance(o, dict) and all(o.get(k) == v for k, v in want.items()) and o


def usage_errors(r, tmp):
    """Bad command lines: exit 2, one line naming the word, nothing sent (no daemon needed: -c
    names a path that does not exist, so anything sent would exit 3 instead)."""
    absent = ['-c', os.path.join(tmp, 'absent.sock')]
    src = ['source', 'start', 'k', '--target', '{}', '--dir', tmp]
    cases = [
        ([], usage_line('no command given')),
        (['--json'], usage_line('no command given')),
        (['--bogus'], usage_line(q('unknown option "--bogus"'))),
        (['--bogus', 'status'], usage_line(q('unknown option "--bogus"'))),
        (['-x', 'status'], usage_line(q('unknown option "-x"'))),
        (['status', '--bogus'], usage_line(q('unknown option "--bogus" for "status"'), 'status')),
        (['status', '--bogus=1'], usage_line(q('unknown option "--bogus" for "status"'),
                                             'status')),
        (['status', '-x'], usage_line(q('unknown option "-x" for "status"'), 'status')),
        (['list', '--socket', '1=/x'], usage_line(q('unknown option "--socket" for "list"'),
                                                  'list')),
        (['frobnicate'], usage_line(q('unknown command "frobnicate"'))),
        (['Status'], usage_line(q('unknown command "Status"'))),
        (['target'], usage_line(q('"target" needs start or stop'))),
        (['source', '--json'], usage_line(q('"source" needs start or stop'))),
        (['target', 'frob', 'k'],
         usage_line(q('unknown command "target frob" (target takes start or stop)'))),
        (['target', 'start'], usage_line(q('"target start" needs KEY'), 'target start')),
        (['target', 'start', 'k'],
         usage_line(q('"target start" needs --socket PORTID=UNIXPATH'), 'target start')),
        (['target', 'start', 'k', '--socket'],
         usage_line(q('option "--socket" for "target start" needs a value (PORTID=UNIXPATH)'),
                    'target start')),
        (['target', 'start', 'k', '--socket', 'nopath'],
         usage_line(q('--socket: expected PORTID=UNIXPATH, got "nopath"'), 'target start')),
        (['target', 'start', 'k', '--socket', '1=/a', '--socket', '1=/b'],
         usage_line(q('--socket: port 1 given twice'), 'target start')),
        (['target', 'start', 'k', '--socket', '1=/a', '--kubevirt', '--listen', '1=70000'],
         usage_line(q('--listen: expected PORTID=TCPPORT (1 to 65535), got "1=70000"'),
                    'target start')),
        (['target', 'start', 'k', 'k2', '--socket', '1=/a'],
         usage_line(q('unexpected argument "k2" for "target start"'), 'target start')),
        (['target', 'stop'], usage_line(q('"target stop" needs KEY'), 'target stop')),
        (['target', 'stop', 'a', 'b'],
         usage_line(q('unexpected argument "b" for "target stop"'), 'target stop')),
        (['source', 'stop', 'k', '--json', 'extra'],
         usage_line(q('unexpected argument "extra" for "source stop"'), 'source stop')),
        (['status', '--json', 'extra'],
         usage_line(q('unexpected argument "extra" for "status"'), 'status')),
        (['status', 'extra', '--json'],
         usage_line(q('unexpected argument "extra" for "status"'), 'status')),
        (['list', 'extra'], usage_line(q('unexpected argument "extra" for "list"'), 'list')),
        (['status', '--', '--json'],
         usage_line(q('unexpected argument "--json" for "status"'), 'status')),
        (['metrics', 'x'], usage_line(q('unexpected argument "x" for "metrics"'), 'metrics')),
        (['status', '--json=yes'],
         usage_line(q('option "--json" for "status" takes no value'), 'status')),
        (['-c'], usage_line(q('option "-c" needs a value (PATH)'))),
        (['--control'], usage_line(q('option "--control" needs a value (PATH)'))),
        (['status', '-c'], usage_line(q('option "-c" for "status" needs a value (PATH)'),
                                      'status')),
        (['-c', 'status'], usage_line(q('no command ("-c" took "status" as the path)'))),
        (['-c', '', 'status'], usage_line(q('option "-c" needs a path, not ""'))),
        (['-c', '/' + 'x' * 120, 'status'],
         usage_line('control socket path too long \\(121 bytes, at most 107\\): /x+', 'status')),
        (['bandwidth', 'k'], usage_line(q('"bandwidth" needs RATE'), 'bandwidth')),
        (['bandwidth', 'k', 'fast'],
         usage_line(q('RATE: expected a rate such as 1Gbit, 500MB, 64Mi or none, got "fast"'),
                    'bandwidth')),
        (['bandwidth', 'k', '1G', '2G'],
         usage_line(q('unexpected argument "2G" for "bandwidth"'), 'bandwidth')),
        (['node-bandwidth', '5Q'],
         usage_line(q('RATE: expected a rate such as 1Gbit, 500MB, 64Mi or none, got "5Q"'),
                    'node-bandwidth')),
        (['node-bandwidth', '-5'],
         usage_line(q('unknown option "-5" for "node-bandwidth"'), 'node-bandwidth')),
        (['node-bandwidth'], usage_line(q('"node-bandwidth" needs RATE'), 'node-bandwidth')),
        (['top', '--count', '0'],
         usage_line(q('--count: expected a number of frames from 1, got "0"'), 'top')),
        (['top', '--count', '-1'],
         usage_line(q('--count: expected a number of frames from 1, got "-1"'), 'top')),
        (['top', '--count', 'many'],
         usage_line(q('--count: expected a number of frames from 1, got "many"'), 'top')),
        (['top', '--count'], usage_line(q('option "--count" for "top" needs a value (N)'),
                                        'top')),
        (['top', '--interval', '0'],
         usage_line(q('--interval: expected seconds from 0.1 to 3600, got "0"'), 'top')),
        (['top', '--interval', 'nan'],
         usage_line(q('--interval: expected seconds from 0.1 to 3600, got "nan"'), 'top')),
        (['top', '--interval', ''],
         usage_line(q('--interval: expected seconds from 0.1 to 3600, got ""'), 'top')),
        (['top', '--count', '1', '--count', '2'],
         usage_line(q('option "--count" given 2 times'), 'top')),
        (['source', 'start', 'k'],
         usage_line(q('"source start" needs --target JSON'), 'source start')),
        (['source', 'start', 'k', '--target', '{}'],
         usage_line(q('"source start" needs --dir BASEDIR'), 'source start')),
        (['source', 'start', 'k', '--allow'],
         usage_line(q('ambiguous option "--allow" for "source start"'), 'source start')),
        (src + ['--tls', '--no-tls'],
         usage_line(q('options "--tls" and "--no-tls" exclude each other'), 'source start')),
        (src + ['--dir', tmp], usage_line(q('option "--dir" given 2 times'), 'source start')),
        (['source', 'start', 'k', '--target', 'not json', '--dir', tmp],
         usage_line(q('--target: not a JSON object (pass what target start printed)'),
                    'source start')),
        (['source', 'start', 'k', '--target', '[1]', '--dir', tmp],
         usage_line(q('--target: not a JSON object (pass what target start printed)'),
                    'source start')),
        (src + ['--allow-post-copy'],
         usage_line('a convergence policy needs a backend: .*', 'source start')),
        (src + ['--qmp', '/q', '--libvirt-domain', 'd'],
         usage_line(q('options "--qmp" and "--libvirt-domain" exclude each other'),
                    'source start')),
        (src + ['--libvirt-uri', 'qemu:///system'],
         usage_line('a convergence policy needs a backend: .*', 'source start')),
        (src + ['--qmp', '/q', '--max-downtime', '1.5'],
         usage_line(q('--max-downtime: expected a whole number from 0, got "1.5"'),
                    'source start')),
        (src + ['--qmp', '/q', '--progress-timeout', '-1'],
         usage_line(q('--progress-timeout: expected a whole number from 0, got "-1"'),
                    'source start')),
        (src + ['--qmp', '/q', '--policy', '[1]'],
         usage_line('--policy: expected a JSON object .*', 'source start')),
        (src + ['--qmp', '/q', '--policy', '@/nonexistent/policy.json'],
         usage_line(q('--policy: cannot read /nonexistent/policy.json: '
                      'No such file or directory'), 'source start')),
        (src + ['--bandwidth', '1 Gbit'],
         usage_line(q('--bandwidth: expected a rate such as 1Gbit, 500MB, 64Mi or none, '
                      'got "1 Gbit"'), 'source start')),
        (src + ['--test-delay-first', 'soon'],
         usage_line(q('--test-delay-first: expected a whole number from 0, got "soon"'),
                    'source start')),
        (['completion'], usage_line(q('"completion" needs SHELL'), 'completion')),
        (['completion', 'zsh'], usage_line(q('completion: only bash is known, not "zsh"'),
                                           'completion')),
        (['help', 'nosuch'], usage_line(q('unknown command "nosuch"'))),
        (['help', 'status', 'extra'], usage_line(q('unexpected argument "extra" for "help"'))),
    ]
    for args, err in cases:
        r.expect(absent + args, USAGE, err)
        if '--json' not in args:    # --json does not turn a usage error into JSON
            r.expect(absent + ['--json'] + args, USAGE, err)
    return len(cases)


def help_and_version(r, vmigd):
    vd = subprocess.run([vmigd, '--version'], capture_output=True, text=True, timeout=10)
    version = vd.stdout.split()[-1] if vd.returncode == 0 and vd.stdout else None
    r.check(version is not None, f'vmigd --version: {vd.returncode} {vd.stdout!r}')
    for args in (['--version'], ['-V'], ['status', '--version']):
        r.expect(args, 0, None, lambda o: o == f'vmigctl {version}\n')
    main_help = r.expect(['--help'], 0, None, lambda o: o.startswith('usage: vmigctl '))
    r.expect(['-h'], 0, None, lambda o: o == main_help.stdout)
    r.expect(['help'], 0, None, lambda o: o == main_help.stdout)
    commands = re.findall(r'^  ([a-z][a-z-]*(?: (?:start|stop))?)(?= )', main_help.stdout,
                          re.M)
    r.check(set(commands) >= {'target start', 'target stop', 'source start', 'source stop',
                              'bandwidth', 'node-bandwidth', 'list', 'status', 'metrics', 'top'},
            f'--help lists every command: {commands}')
    r.check('completion' not in commands, '--help leaves out the hidden completion command')
    helps = {}
    for cmd in [c for c in commands if c != 'help']:
        words = cmd.split()
        # help works without the command's required arguments and options
        p = r.expect(words + ['--help'], 0, None,
                     lambda o, cmd=cmd: o.startswith(f'usage: vmigctl [-c PATH] [--json] {cmd}'))
        r.expect(['help'] + words, 0, None, lambda o, p=p: o == p.stdout)
        r.expect(['-c', '/nonexistent', '--json'] + words + ['-h'], 0, None,
                 lambda o, p=p: o == p.stdout)
        helps[cmd] = sorted(set(re.findall(r'^  (?:-., )?(--[a-z-]+)', p.stdout, re.M)))
        r.check(all(len(line) <= 100 for line in p.stdout.splitlines()),
                f'{cmd} --help: lines of at most 100 columns')
    return helps


def man_page(r, helps):
    """doc/vmigctl.8 and the help agree: every option a command's --help lists is in the man
    page, and every option in the man page's SYNOPSIS is one a command takes."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'doc',
                        'vmigctl.8')
    with open(path) as f:
        text = f.read().replace('\\-', '-')
    synopsis = text[text.index('.SH SYNOPSIS'):text.index('.SH DESCRIPTION')]
    known = {o for opts in helps.values() for o in opts}
    in_man = set(re.findall(r'--[a-z][a-z-]*', text))
    r.check(known <= in_man, f'vmigctl.8 lacks {sorted(known - in_man)}')
    listed = set(re.findall(r'--[a-z][a-z-]*', synopsis))
    r.check(listed <= known | {'--help', '--version'},
            f'vmigctl.8 SYNOPSIS has options no command takes: {sorted(listed - known)}')


def no_daemon(r, tmp, daemon_sock):
    absent = os.path.join(tmp, 'absent.sock')
    stale = os.path.join(tmp, 'stale.sock')
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()
    why = {'ENOENT': 'no such socket: vmigd is not running there',
           'ECONNREFUSED': 'nothing listens on it: vmigd is not running'}
    for path, code, num in ((absent, 'ENOENT', 2), (stale, 'ECONNREFUSED', 111)):
        line = f'vmigctl: cannot connect to vmigd at {q(path)} \\(-c\\): {why[code]} \\({code}\\)'
        for cmd in (['status'], ['list'], ['target', 'stop', 'k'], ['bandwidth', 'k', '1G'],
                    ['top', '--count', '1']):
            r.expect(['-c', path] + cmd, NO_DAEMON, line)
            r.expect(['-c', path, '--json'] + cmd, NO_DAEMON, line,
                     lambda o, code=code, num=num: json_line(o, ok=False, code=code, errno=num))
        # parsed alike wherever the options are, POSIXLY_CORRECT or not; "--" ends them
        for args, env in ((['target', 'start', 'k', '--socket', '1=/x'], {'POSIXLY_CORRECT': '1'}),
                          (['--json', 'target', 'stop', '--', '-x'], None),
                          (['bandwidth', '--json', 'k', '1G'], None)):
            r.expect(['-c', path] + args, NO_DAEMON, line, env=env,
                     out=(lambda o: json_line(o, ok=False)) if '--json' in args else None)
        env_line = line.replace('\\(-c\\)', '\\(\\$VMIGD_CONTROL\\)')
        r.expect(['status'], NO_DAEMON, env_line, env={'VMIGD_CONTROL': path})
    # The default path, where none is given (a vmigd may run on this machine: only the path's
    # origin is checked)
    p = r.run(['status', '--json'])
    r.check(p.returncode in (0, NO_DAEMON) and
            (p.returncode == 0 or '/run/vmigd/control.sock (default)' in p.stderr),
            f'status without -c or VMIGD_CONTROL: rc={p.returncode} {p.stderr!r}')
    # EACCES: the daemon's socket (mode 0600) as another user
    setpriv = shutil.which('setpriv')
    if os.geteuid() != 0 or not setpriv:
        vt.log('EACCES not tried: needs root and setpriv to be another user')
        return
    p = subprocess.run([setpriv, '--reuid=65534', '--regid=65534', '--clear-groups',
                        r.vmigctl, '-c', daemon_sock, '--json', 'status'],
                       capture_output=True, text=True, timeout=20)
    r.check(p.returncode == NO_DAEMON and p.stderr.count('\n') == 1 and
            'permission denied: it is for vmigd\'s user only (EACCES)' in p.stderr and
            json_line(p.stdout, code='EACCES', errno=13),
            f'status as nobody: rc={p.returncode} {p.stdout!r} {p.stderr!r}, expected 3, EACCES')


def with_daemon(r, d, tmp):
    ctl = ['-c', d.control]
    env = {'VMIGD_CONTROL': d.control}
    st = r.expect(ctl + ['status', '--json'], 0, None, lambda o: json_line(o))
    status = json.loads(st.stdout) if st.returncode == 0 else {}
    r.check(status.get('pid') == d.proc.pid and 'node' in status and 'migrations' in status,
            f'status --json is the status object: {sorted(status)}')
    r.expect(['--json', 'status'], 0, None,
             lambda o: json_line(o, pid=d.proc.pid), env=env)
    r.expect(['status'], 0, None, lambda o: o.startswith('version: '), env=env)
    r.expect(['-c', d.control, 'status'], 0, None, lambda o: 'pid: ' in o,
             env={'VMIGD_CONTROL': os.path.join(tmp, 'absent.sock')})
    r.expect(['-c', os.path.join(tmp, 'absent.sock'), 'status'], NO_DAEMON,
             'vmigctl: cannot connect to vmigd at .*absent.sock \\(-c\\): .*', env=env)
    r.expect(['status', '-c', d.control], 0, None, lambda o: 'pid: ' in o)
    r.expect(['list', '--json'], 0, None, lambda o: json_line(o, ok=True, version=2,
                                                              migrations=[]), env=env)
    r.expect(['list'], 0, None, lambda o: o == '', env=env)

    sock = f'49152={os.path.join(tmp, "dst.sock")}'
    r.expect(['target', 'start', 'cli-1', '--socket', sock], 0, None,
             lambda o: json_line(o, key='cli-1', ports=[49152]), env=env)
    t = r.expect(['target', 'start', 'cli-1', '--socket', sock, '--json'], 0, None,
                 lambda o: json_line(o, ok=True)['target']['key'] == 'cli-1', env=env)
    r.expect(['list'], 0, None, lambda o: o.startswith('cli-1 target ports=49152 '), env=env)
    r.expect(['list', '--json'], 0, None,
             lambda o: [m['key'] for m in json_line(o, ok=True)['migrations']] == ['cli-1'],
             env=env)
    r.expect(['bandwidth', 'cli-1', '1Gbit'], 0, None, env=env)
    r.expect(['bandwidth', 'cli-1', 'none', '--json'], 0, None, lambda o: json_line(o, ok=True),
             env=env)
    r.expect(['node-bandwidth', '64Mi', '--json'], 0, None, lambda o: json_line(o, ok=True),
             env=env)
    r.expect(['node-bandwidth', 'none'], 0, None, env=env)
    r.expect(['metrics', '--json'], 0, None,
             lambda o: json_line(o, ok=True, version=2)['migrations'][0]['key'] == 'cli-1',
             env=env)
    r.expect(['metrics'], 0, None, lambda o: o.startswith('node: '), env=env)
    r.expect(['top', '--count', '2', '--interval', '0.1', '--json'], 0, None,
             lambda o: len(o.splitlines()) == 2 and
             all(json.loads(line)['ok'] for line in o.splitlines()), env=env)
    r.expect(['top', '--count', '1'], 0, None, lambda o: o.startswith('vmigd: node cap'),
             env=env)
    # A source for it: its sockets under BASEDIR/migrationproxy/
    target = json.dumps(json.loads(t.stdout)['target']) if t.returncode == 0 else '{}'
    r.expect(['source', 'start', 'cli-1', '--target', target, '--dir', tmp], 0, None,
             lambda o: o == f'{tmp}/migrationproxy/cli-1-49152-source.sock\n', env=env)
    r.expect(['source', 'start', 'cli-1', '--target', target, '--dir', tmp, '--json'], 0, None,
             lambda o: json_line(o, ok=True)['sockets'] ==
             [f'{tmp}/migrationproxy/cli-1-49152-source.sock'], env=env)

    # Refusals: vmigd's line, exit 1; with --json its reply with the errno's number added
    target4 = json.dumps({**json.loads(target), 'key': 'cli-4'})
    in_way = os.path.join(tmp, 'in-the-way')
    os.makedirs(os.path.join(in_way, 'migrationproxy'))
    open(os.path.join(in_way, 'migrationproxy', 'cli-4-49152-source.sock'), 'w').close()
    refusals = [
        (['target', 'stop', 'nosuch'], 'ENOENT', 2,
         'unknown migration nosuch: no target listener with that key'),
        (['source', 'stop', 'nosuch'], 'ENOENT', 2,
         'unknown migration nosuch: no source listener with that key'),
        (['bandwidth', 'nosuch', '1G'], 'ENOENT', 2, None),
        (['target', 'start', 'bad/key', '--socket', sock], 'EINVAL', 22,
         'invalid key "bad/key": use 1 to 128 characters of A-Z a-z 0-9 . _ -'),
        (['target', 'start', 'cli-2', '--socket', '49152=relative.sock'], 'EINVAL', 22,
         'socket path must be absolute: "relative.sock"'),
        (['source', 'start', 'cli-3', '--target', target, '--dir', tmp,
          '--test-delay-first', '5'], 'EINVAL', 22, None),
        (['source', 'start', 'cli-4', '--target', target4, '--dir', in_way], 'EEXIST', 17,
         f'cannot listen on {in_way}/migrationproxy/cli-4-49152-source.sock: a file that is '
         'not a socket is in the way'),
    ]
    for args, code, num, msg in refusals:
        line = f'vmigctl: {q(msg)}' if msg else 'vmigctl: .+'
        r.expect(args, REFUSED, line, env=env)
        r.expect(args + ['--json'], REFUSED, line, env=env,
                 out=lambda o, code=code, num=num, msg=msg: (
                     json_line(o, ok=False, code=code, errno=num) and
                     (msg is None or json.loads(o)['error'] == msg)))
    r.expect(['source', 'start', 'cli-3', '--target', target, '--dir', tmp,
              '--test-delay-first', '5'], REFUSED,
             'vmigctl: .*; --test-delay-first needs the test build, vmigd-test', env=env)
    r.expect(['source', 'stop', 'cli-1', '--json'], 0, None, lambda o: json_line(o, ok=True),
             env=env)
    r.expect(['target', 'stop', 'cli-1'], 0, None, env=env)


def bash(script, words, cword=None, control=None, helpers=False):
    """COMPREPLY of _vmigctl for words (the cursor on the last, or cword), in a fresh bash."""
    cword = len(words) - 1 if cword is None else cword
    arr = ' '.join("'" + w.replace("'", "'\\''") + "'" for w in words)
    prog = (f'source {BASH_COMPLETION}\n' if helpers else '') + \
        f'source {script}\nCOMP_WORDS=({arr})\nCOMP_CWORD={cword}\n' \
        f'COMP_LINE="${{COMP_WORDS[*]}}"\nCOMP_POINT=${{#COMP_LINE}}\n' \
        '_vmigctl vmigctl\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
    p = subprocess.run(['bash', '--norc', '--noprofile', '-c', prog], capture_output=True,
                       text=True, timeout=30, cwd=os.path.dirname(script))
    if p.returncode != 0:
        raise vt.HarnessError(f'bash completion of {words}: rc={p.returncode} {p.stderr!r}')
    return sorted(w for w in p.stdout.splitlines() if w)


def completion(r, script, built, helps, d, tmp):
    p = r.run(['completion', 'bash'])
    r.check(p.returncode == 0 and p.stdout.startswith('# bash completion for vmigctl'),
            f'completion bash: rc={p.returncode} {p.stderr!r}')
    with open(script, 'w') as f:
        f.write(p.stdout)
    if built:
        with open(built) as f:
            r.check(f.read() == p.stdout, f'{built} is what `vmigctl completion bash` prints')
    n = subprocess.run(['bash', '-n', script], capture_output=True, text=True, timeout=10)
    r.check(n.returncode == 0, f'bash -n {script}: {n.stderr!r}')
    ctl = ['-c', d.control]
    modes = [False] + ([True] if os.path.exists(BASH_COMPLETION) else [])
    if len(modes) == 1:
        vt.log(f'{BASH_COMPLETION} missing (package bash-completion): completion tried '
               'without its helpers only')
    firsts = sorted({c.split()[0] for c in helps} | {'help'})
    me = r.vmigctl   # words[0]: the vmigctl that lists the KEYs
    for helpers in modes:
        how = 'with bash-completion' if helpers else 'plain bash'

        def got(words, want, how=how, helpers=helpers):
            have = bash(script, words, helpers=helpers)
            r.check(have == sorted(want), f'{how}: completing {words}: {have}, want '
                    f'{sorted(want)}')
        got([me, ''], firsts)
        got([me, 'ta'], ['target'])
        got([me, '-c', d.control, '--json', 's'], ['source', 'status'])
        got([me, 'target', ''], ['start', 'stop'])
        got([me, 'help', 'n'], ['node-bandwidth'])
        got([me, '--v'], ['--version'])
        got([me, 'source', 'start', 'k', '--allow-'],
            ['--allow-auto-converge', '--allow-post-copy', '--allow-workload-disruption'])
        got([me, 'source', 'start', 'k', '--mode', ''], ['predictive', 'stall',
                                                                  'kubevirt'])
        got([me, 'source', 'start', 'k', '--dir', tmp + '/mig'], [tmp + '/migrationproxy'])
        got([me, 'source', 'start', 'k', '--target', ''], [])
        got([me, *ctl, 'target', 'stop', ''], ['cli-k'])
        got([me, *ctl, 'source', 'stop', ''], [])
        got([me, *ctl, 'bandwidth', 'cli'], ['cli-k'])
        got([me, *ctl, 'bandwidth', 'cli-k', ''], [])
        got([me, *ctl, 'target', 'start', ''], [])
        # every command's options, as its --help lists them
        for cmd, opts in helps.items():
            got([me, *cmd.split(), '--'], opts)


def main():
    vmigd, vmigctl = vt.find_binaries()
    built = sys.argv[1] if len(sys.argv) > 1 else None
    problems = []
    r = Runner(vmigctl, problems)
    with vt.work_directory('vmig-ctlcli-') as tmp:
        n = usage_errors(r, tmp)
        vt.log(f'{n} bad command lines tried, each with and without --json')
        helps = help_and_version(r, vmigd)
        man_page(r, helps)
        d = vt.Daemon(vmigd, vmigctl, 'cli', tmp, '127.0.0.1').start()
        try:
            no_daemon(r, tmp, d.control)
            with_daemon(r, d, tmp)
            r.expect(['-c', d.control, 'target', 'start', 'cli-k', '--socket',
                      f'49152={tmp}/k.sock'], 0, None, lambda o: json_line(o, key='cli-k'))
            completion(r, os.path.join(tmp, 'vmigctl.bash'), built, helps, d, tmp)
        finally:
            d.stop()
    for p in problems:
        print(f'FAIL: {p}', flush=True)
    if problems:
        raise vt.HarnessError(f'{len(problems)} of {r.checks} checks failed')
    vt.log(f'{r.checks} checks passed')


if __name__ == '__main__':
    vt.run_main(main)
