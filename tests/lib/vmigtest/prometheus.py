"""The Prometheus side of the tests: a strict parser of the text exposition format and an HTTP
request made with curl inside a namespace. Stdlib only."""

import re
import shutil
import subprocess

from .base import HarnessError, Skip
from .net import netns_prefix


PROM_NAME = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*\Z')
PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
PROM_TYPES = ('counter', 'gauge', 'histogram', 'summary', 'untyped')


def _prom_value(text):
    if text in ('NaN', '+Inf', '-Inf', 'Inf'):
        return float(text.replace('Inf', 'inf').replace('NaN', 'nan'))
    if not re.fullmatch(r'[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?', text):
        raise ValueError(f'not a number: {text!r}')
    return float(text)


def _prom_unescape(text):
    return re.sub(r'\\([\\"n])', lambda m: '\n' if m.group(1) == 'n' else m.group(1), text)


def parse_prometheus(text):
    """Parse the Prometheus text exposition format (version 0.0.4) strictly. Returns (families,
    problems): families {name: {'help', 'type', 'samples': [(labels dict, value)]}}, problems a
    list of what breaks the format: a line that does not parse, HELP or TYPE twice or after the
    name's first sample, a sample without TYPE, a family's samples not in one group, a label
    twice in a sample, the same series twice, a counter below zero, no final newline."""
    families, problems, seen_series = {}, [], set()
    current, closed = None, set()
    if text and not text.endswith('\n'):
        problems.append('the text does not end with a newline')
    for n, line in enumerate(text.split('\n')[:-1] if text.endswith('\n') else
                             text.split('\n'), 1):
        where = f'line {n}'
        if not line.strip():
            continue
        if line.startswith('#'):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ('HELP', 'TYPE'):
                name = parts[2]
                rest = parts[3] if len(parts) > 3 else ''
                fam = families.setdefault(name, {'help': None, 'type': None, 'samples': []})
                field = parts[1].lower()
                if not PROM_NAME.match(name):
                    problems.append(f'{where}: bad metric name {name!r}')
                if fam[field] is not None:
                    problems.append(f'{where}: {parts[1]} for {name} a second time')
                if fam['samples']:
                    problems.append(f'{where}: {parts[1]} for {name} after its samples')
                if field == 'type' and rest not in PROM_TYPES:
                    problems.append(f'{where}: TYPE {rest!r} for {name}')
                fam[field] = _prom_unescape(rest) if field == 'help' else rest
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([^ ]+)( -?\d+)?\Z', line)
        # A label value may hold '}': fall back to a scan of the label block.
        if not m:
            m2 = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\{', line)
            if m2:
                labels_text, pos = _prom_scan_labels(line, m2.end())
                tail_m = re.match(r' ([^ ]+)( -?\d+)?\Z', line[pos:]) if pos else None
                if labels_text is not None and tail_m:
                    name, value_text = m2.group(1), tail_m.group(1)
                    block = labels_text
                else:
                    problems.append(f'{where}: does not parse: {line!r}')
                    continue
            else:
                problems.append(f'{where}: does not parse: {line!r}')
                continue
        else:
            name, block, value_text = m.group(1), (m.group(2) or '{}')[1:-1], m.group(3)
        labels = {}
        if block:
            pos = 0
            while pos < len(block):
                lm = PROM_LABEL.match(block, pos)
                if not lm:
                    problems.append(f'{where}: bad label syntax at {block[pos:]!r}')
                    break
                lname = lm.group(1)
                if lname in labels:
                    problems.append(f'{where}: label {lname} twice')
                if lname.startswith('__'):
                    problems.append(f'{where}: reserved label name {lname}')
                labels[lname] = _prom_unescape(lm.group(2))
                pos = lm.end()
                if pos < len(block):
                    if block[pos] != ',':
                        problems.append(f'{where}: expected "," at {block[pos:]!r}')
                        break
                    pos += 1
        try:
            value = _prom_value(value_text)
        except ValueError as e:
            problems.append(f'{where}: {e}')
            continue
        fam = families.get(name)
        if fam is None or fam['type'] is None:
            problems.append(f'{where}: sample of {name} without a TYPE line before it')
            fam = families.setdefault(name, {'help': None, 'type': None, 'samples': []})
        if fam['help'] is None:
            problems.append(f'{where}: sample of {name} without a HELP line before it')
            fam['help'] = ''
        if name != current:
            if name in closed:
                problems.append(f'{where}: samples of {name} not in one group')
            if current is not None:
                closed.add(current)
            current = name
        series = (name, tuple(sorted(labels.items())))
        if series in seen_series:
            problems.append(f'{where}: series {name}{labels} twice')
        seen_series.add(series)
        if fam['type'] == 'counter' and not value >= 0:
            problems.append(f'{where}: counter {name} = {value}')
        fam['samples'].append((labels, value))
    return families, problems


def _prom_scan_labels(line, pos):
    """The text between '{' (ending at pos) and its closing '}', honouring quoted values; (text,
    index after '}') or (None, 0)."""
    start, quoted, i = pos, False, pos
    while i < len(line):
        ch = line[i]
        if quoted and ch == '\\':
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif ch == '}' and not quoted:
            return line[start:i], i + 1
        i += 1
    return None, 0


def prom_value(families, name, **labels):
    """The value of the one sample of family name whose labels include these; HarnessError when
    there is none or more than one."""
    found = [v for lab, v in families.get(name, {}).get('samples', [])
             if all(lab.get(k) == str(v2) for k, v2 in labels.items())]
    if len(found) != 1:
        raise HarnessError(f'{len(found)} samples of {name} with {labels}, expected one')
    return found[0]


def http_get(ns, url, method='GET', timeout=10):
    """An HTTP request with curl, run in network namespace ns (None: ours). (status code,
    {header name lowercased: value}, body text)."""
    if shutil.which('curl') is None:
        raise Skip('curl is not installed')
    cmd = [*netns_prefix(ns), 'curl', '-sS', '--max-time', str(timeout)]
    if method == 'HEAD':
        cmd.append('-I')                   # headers only (a body would not be read)
    else:
        cmd += ['-D', '-', '-o', '-']
        if method != 'GET':
            cmd += ['-X', method]
    proc = subprocess.run([*cmd, url], capture_output=True, timeout=timeout + 5,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise HarnessError(f'curl {method} {url} exited {proc.returncode}: '
                           f'{proc.stderr.decode(errors="replace").strip()}')
    out = proc.stdout
    head, sep, body = out.partition(b'\r\n\r\n')
    if not sep:
        raise HarnessError(f'curl {url}: no HTTP header in {out[:200]!r}')
    lines = head.decode(errors='replace').split('\r\n')
    m = re.match(r'HTTP/\d(\.\d)? (\d{3})', lines[0])
    if not m:
        raise HarnessError(f'curl {url}: status line {lines[0]!r}')
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(':')
        headers[name.strip().lower()] = value.strip()
    return int(m.group(2)), headers, body.decode(errors='replace')
