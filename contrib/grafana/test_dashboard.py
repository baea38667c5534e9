#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Grafana dashboard and the Prometheus rules against what vmigd really exports: every PromQL
expression of vmigd-dashboard.json (panels and variable queries) and of
contrib/prometheus/vmigd-rules.yaml, its metric names taken out (label matchers, ranges,
strings, functions, grouping clauses and the rules' own recording names left aside), must name a
family that a started vmigd (TLS on, `--metrics 127.0.0.1:0`) lists in its first scrape, or
`up`. Each dashboard expression must also parse: promtool checks them as recording rules. The
scrape passes `promtool check metrics` and the harness's strict parser; the dashboard has a
data source variable that every panel uses, and node (instance) and job variables. Skips (77)
without promtool (Debian: prometheus) or Python's yaml (python3-yaml)."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, '..', '..')
sys.path.insert(0, os.path.join(ROOT, 'tests', 'lib'))
import vmigtest as vt  # noqa: E402

DASHBOARD = os.path.join(HERE, 'vmigd-dashboard.json')
RULES = os.path.join(ROOT, 'contrib', 'prometheus', 'vmigd-rules.yaml')
# Grafana's own variables, as Grafana would put them in
GRAFANA_VARS = {'$__rate_interval': '1m', '$__interval': '1m', '$__range': '1h'}
KEYWORDS = {'and', 'or', 'unless', 'bool', 'offset', 'by', 'without', 'on', 'ignoring',
            'group_left', 'group_right', 'atan2', 'inf', 'nan', 'Inf', 'NaN'}
ck = vt.Checks('dashboard checks')


def panels(items):
    for p in items:
        yield p
        yield from panels(p.get('panels', []))


def dashboard_exprs(dash):
    """[(where, PromQL)] of every panel target and every query variable (label_values(X, l): X)."""
    out = []
    for p in panels(dash['panels']):
        for t in p.get('targets', []):
            out.append((f'panel "{p["title"]}" {t.get("refId")}', t['expr']))
    for v in dash['templating']['list']:
        if v['type'] != 'query':
            continue
        q = v['query']['query'] if isinstance(v['query'], dict) else v['query']
        m = re.fullmatch(r'label_values\((.*),\s*\w+\)', q)
        out.append((f'variable {v["name"]}', m.group(1) if m else q))
    return out


def substitute(expr):
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    return re.sub(r'\$\{?(\w+)\}?', '.*', expr)    # $job, $instance, $key: =~".*"


def metric_names(expr):
    """The metric names a PromQL expression selects (function and aggregation names, keywords,
    labels and durations left out)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r'\{[^}]*\}', ' ', s)
    s = re.sub(r'\[[^\]]*\]', ' ', s)
    s = re.sub(r'\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)', ' ', s)
    names = set()
    for m in re.finditer(r'[a-zA-Z_:][a-zA-Z0-9_:]*', s):
        before = s[m.start() - 1] if m.start() else ' '
        if before.isdigit() or before == '.':
            continue                                # a duration's unit (offset 5m), 1e3
        if s[m.end():].lstrip().startswith('(') or m.group(0) in KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def scrape_families(work):
    """{name: type} of a fresh vmigd's first scrape (TLS on, so that the certificate family is
    there), after promtool check metrics and the strict parser."""
    vmigd, vmigctl = vt.find_binaries()
    pki = vt.make_pki(os.path.join(work, 'pki'))
    d = vt.Daemon(vmigd, vmigctl, 'vmigd', work, '127.0.0.1',
                  extra_args=['--metrics', '127.0.0.1:0'], tls=pki)
    try:
        d.start()
        status, _, body = vt.http_get(None, d.metrics_url())
    finally:
        rc = vt.stop_process(d.proc)
    ck.check(status == 200 and rc == 0, f'vmigd served /metrics ({status}) and exited {rc}')
    fams, problems = vt.parse_prometheus(body)
    ck.check(not problems, 'the scrape parses strictly' + ''.join('\n  ' + p for p in problems))
    p = subprocess.run(['promtool', 'check', 'metrics'], input=body, capture_output=True,
                       text=True, timeout=60)
    ck.check(p.returncode == 0, 'promtool check metrics on the scrape' +
           ''.join('\n  ' + line for line in (p.stdout + p.stderr).strip().splitlines()))
    print(f'{len(fams)} families in a fresh vmigd\'s scrape')
    return {n: f['type'] for n, f in fams.items()}


def check_parse(exprs, work):
    path = os.path.join(work, 'dashboard-exprs.yaml')
    with open(path, 'w') as f:
        f.write('groups:\n  - name: dashboard\n    rules:\n')
        for i, (_, e) in enumerate(exprs):
            f.write(f'      - record: dashboard:expr_{i}\n        expr: {json.dumps(e)}\n')
    p = subprocess.run(['promtool', 'check', 'rules', path], capture_output=True, text=True,
                       timeout=60)
    ck.check(p.returncode == 0, f'promtool parses the dashboard\'s {len(exprs)} expressions' +
           ''.join('\n  ' + line for line in (p.stdout + p.stderr).strip().splitlines()))


def check_layout(dash):
    names = {v['name']: v for v in dash['templating']['list']}
    ds = names.get('datasource', {})
    ck.check(ds.get('type') == 'datasource' and ds.get('query') == 'prometheus',
           'a Prometheus data source variable')
    ck.check(names.get('instance', {}).get('type') == 'query' and 'job' in names,
           'node (instance) and job variables')
    bad = [p['title'] for p in panels(dash['panels']) if p['type'] != 'row' and
           (p.get('datasource', {}).get('uid') != '${datasource}' or
            any(t.get('datasource', {}).get('uid') != '${datasource}' for t in p['targets']))]
    ck.check(not bad, f'every panel queries ${{datasource}} ({bad or "all do"})')
    bad = [p['title'] for p in panels(dash['panels']) if p['type'] != 'row' and
           any('instance=~"$instance"' not in t['expr'] for t in p['targets'])]
    ck.check(not bad, f'every query follows the node variable ({bad or "all do"})')


def main():
    if shutil.which('promtool') is None:
        raise vt.Skip('no promtool (Debian: apt-get install prometheus)')
    try:
        import yaml
    except ImportError:
        raise vt.Skip('no Python yaml module (Debian: apt-get install python3-yaml)') from None
    with open(DASHBOARD) as f:
        dash = json.load(f)
    with open(RULES) as f:
        rules = [r for g in yaml.safe_load(f)['groups'] for r in g['rules']]
    records = {r['record'] for r in rules if 'record' in r}
    exprs = [(w, substitute(e)) for w, e in dashboard_exprs(dash)]
    exprs += [(f'rule {r.get("alert") or r.get("record")}', r['expr']) for r in rules]
    check_layout(dash)
    planted = ('sum by (instance) (rate(vmigd_bogus_total{job=~"vmigd.*", a="b c"}[5m])) / '
               'on (instance) group_left vmigd:x:rate1m + up offset 5m * 1e3')
    ck.check(metric_names(planted) == {'vmigd_bogus_total', 'vmigd:x:rate1m', 'up'},
           f'the name extraction finds the names in {planted}')
    with vt.work_directory('vmigd-dashboard-') as work:
        check_parse([e for e in exprs if e[0].startswith(('panel', 'variable'))], work)
        exported = scrape_families(work)
    used = {}
    for where, e in exprs:
        for n in metric_names(e):
            used.setdefault(n, []).append(where)
    for n in sorted(used):
        if n in records:
            continue
        ck.check(n in exported or n == 'up',
               f'{n}: exported by vmigd ({len(used[n])} use(s), e.g. {used[n][0]})')
    ck.check(len(used) > 30, f'{len(used)} names used by {len(exprs)} expressions')
    ck.finish()


if __name__ == '__main__':
    vt.run_main(main)
