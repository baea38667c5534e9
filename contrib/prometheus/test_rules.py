#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""vmigd's Prometheus rules against Debian's promtool: `promtool check rules` and `promtool test
rules` (vmigd-rules.test.yaml); that the tests cover every alert both firing and not firing and
every recording rule; that each alert has a severity, a summary, a description and a
runbook_url whose section doc/alerts.md has; that the KubeVirt deploy's PrometheusRule is what
make-prometheusrule makes of the rules; and that a rule broken on purpose in a copy fails the
unit tests. Skips (77) without promtool (Debian: prometheus) or Python's yaml (python3-yaml)."""

import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tests',
                                'lib'))
import vmigtest as vt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, '..', '..')
RULES = os.path.join(HERE, 'vmigd-rules.yaml')
TESTS = os.path.join(HERE, 'vmigd-rules.test.yaml')
RUNBOOK = os.path.join(ROOT, 'doc', 'alerts.md')
ck = vt.Checks('rules checks')


def promtool(*args, cwd=HERE):
    p = subprocess.run(['promtool', *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    return p.returncode, (p.stdout + p.stderr).strip()


def anchors(path):
    """The anchors of a Markdown file's headings, as GitHub makes them."""
    with open(path) as f:
        heads = re.findall(r'^#+\s+(.*?)\s*$', f.read(), re.M)
    return {re.sub(r'[^a-z0-9 _-]', '', h.lower()).replace(' ', '-') for h in heads}


def check_coverage(yaml):
    with open(RULES) as f:
        groups = yaml.safe_load(f)['groups']
    with open(TESTS) as f:
        tests = yaml.safe_load(f)['tests']
    rules = [r for g in groups for r in g['rules']]
    alerts = [r for r in rules if 'alert' in r]
    records = [r['record'] for r in rules if 'record' in r]
    firing, quiet = set(), set()
    for t in tests:
        for a in t.get('alert_rule_test', []):
            (firing if a.get('exp_alerts') else quiet).add(a['alertname'])
    tested_exprs = ' '.join(e['expr'] for t in tests for e in t.get('promql_expr_test', []))
    used = ' '.join(r['expr'] for r in rules)
    for a in alerts:
        name = a['alert']
        ck.check(name in firing and name in quiet,
               f'{name}: unit tests of it firing and of it not firing')
        ann, lab = a.get('annotations', {}), a.get('labels', {})
        ck.check(lab.get('severity') in ('critical', 'warning', 'info') and
               ann.get('summary') and ann.get('description'),
               f'{name}: severity {lab.get("severity")}, a summary and a description')
        url = ann.get('runbook_url', '')
        ck.check(url == 'doc/alerts.md#' + name.lower() and name.lower() in anchors(RUNBOOK),
               f'{name}: runbook_url {url}, a section of doc/alerts.md')
    for r in records:
        ck.check(re.search(r'(?<![\w:])' + re.escape(r) + r'(?![\w:])', tested_exprs) or
               re.search(r'(?<![\w:])' + re.escape(r) + r'(?![\w:])', used),
               f'{r}: a unit test evaluates it (or a tested rule uses it)')
    ck.check(len(alerts) >= 8 and len(records) >= 4,
           f'{len(alerts)} alerts, {len(records)} recording rules')
    return alerts


def check_planted(alerts):
    """Each alert's threshold or duration broken in a copy: the unit tests must fail."""
    with open(RULES) as f:
        text = f.read()
    plants = [('> 0.95', '> 1.95'), ('< 14 * 86400', '< 1 * 86400'), ('for: 5m\n', 'for: 50m\n'),
              ('{result="corrupt"}', '{result="match"}'), ('outcome!="completed"',
                                                           'outcome="completed"')]
    with tempfile.TemporaryDirectory(prefix='vmigd-rules-') as work:
        shutil.copy(TESTS, work)
        for old, new in plants:
            if not ck.check(old in text, f'planted: {old!r} is in the rules'):
                continue
            with open(os.path.join(work, 'vmigd-rules.yaml'), 'w') as f:
                f.write(text.replace(old, new, 1))
            rc, out = promtool('test', 'rules', 'vmigd-rules.test.yaml', cwd=work)
            ck.check(rc != 0 and 'FAILED' in out,
                   f'planted: {old!r} -> {new!r} fails the unit tests (rc {rc})')


def main():
    if shutil.which('promtool') is None:
        raise vt.Skip('no promtool (Debian: apt-get install prometheus)')
    try:
        import yaml
    except ImportError:
        raise vt.Skip('no Python yaml module (Debian: apt-get install python3-yaml)')
    print(promtool('--version')[1].splitlines()[0])
    rc, out = promtool('check', 'rules', 'vmigd-rules.yaml')
    print(out)
    ck.check(rc == 0, 'promtool check rules vmigd-rules.yaml')
    rc, out = promtool('test', 'rules', 'vmigd-rules.test.yaml')
    print(out)
    ck.check(rc == 0, 'promtool test rules vmigd-rules.test.yaml')
    alerts = check_coverage(yaml)
    check_planted(alerts)
    p = subprocess.run([sys.executable, os.path.join(HERE, 'make-prometheusrule'), '--check'],
                       capture_output=True, text=True)
    print(p.stdout.strip())
    ck.check(p.returncode == 0, 'the KubeVirt deploy\'s PrometheusRule is made from the rules')
    ck.finish()


if __name__ == '__main__':
    vt.run_main(main)
