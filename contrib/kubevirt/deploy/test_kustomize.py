#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Renders the kustomize overlays (deploy/kustomize/v1.8, v1.9, main) with the kubectl found
($KUBECTL, else kubectl in PATH: Debian 12's 1.20 with kustomize v2.0.3, or a newer one) over
stand-ins of KubeVirt's release manifests (testdata/), then applies the KubeVirt CR's patch to a
stand-in of the virt-handler DaemonSet as virt-operator does (the patch, then flags.handler's
patch, then --max-devices on the first container) with `kubectl patch --local`. Checks:
virt-handler first in every container list and its command untouched, VMIGD_CONTROL set on it
and equal to vmigd's --control, every volume vmigd mounts defined, VIRT_HANDLER_IMAGE on
virt-operator, the images and the ConfigMap's generated name substituted, each release's allowed
client names, the metrics Service on vmigd's metrics port, no NetworkPolicy and no
ServiceMonitor in the default render, and the opt-ins rendering theirs. Skips (77) without
kubectl."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
KUSTOMIZE = os.path.join(HERE, 'kustomize')
TESTDATA = os.path.join(HERE, 'testdata')
SOCK = '/var/run/kubevirt/daemons/vmigd/control.sock'
HANDLER_SHARE_DIR = '/var/run/kubevirt'  # virt-handler's mount of the host's /var/run/kubevirt
CLIENT_MIGRATION = 'kubevirt.io:system:client:migration'
CLIENT_HANDLER = 'kubevirt.io:system:client:virt-handler'
# overlay -> (the names vmigd accepts from a source, the patched virt-handler's tag)
OVERLAYS = {
    'v1.8': ({CLIENT_MIGRATION, CLIENT_HANDLER}, 'v1.8.4-vmigd'),
    'v1.9': ({CLIENT_MIGRATION, CLIENT_HANDLER}, 'v1.9.0-vmigd'),
    'main': ({CLIENT_MIGRATION}, 'main-vmigd'),
}
failures = []


def expect(cond, what):
    print(('ok   ' if cond else 'FAIL ') + what)
    if not cond:
        failures.append(what)
    return cond


def run(kubectl, *args, stdin=None):
    p = subprocess.run([kubectl, *args], input=stdin, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError('kubectl %s: %s' % (' '.join(args), p.stderr.strip()))
    return p.stdout


def objects(kubectl, yaml_text, work):
    """The objects of a YAML stream, as kubectl reads them (no YAML module needed)."""
    path = os.path.join(work, 'objects.yaml')
    with open(path, 'w') as f:
        f.write(yaml_text)
    out = run(kubectl, 'patch', '--local', '-f', path, '--type', 'merge', '-p', '{}', '-o', 'json')
    dec, docs, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(out) and out[i].isspace():
            i += 1
        if i == len(out):
            return docs
        doc, i = dec.raw_decode(out, i)
        docs.extend(doc['items'] if doc.get('kind') == 'List' else [doc])


def strategic(kubectl, obj, patch, work):
    """obj with a strategic-merge patch applied, as the API server applies it."""
    path = os.path.join(work, 'obj.json')
    with open(path, 'w') as f:
        json.dump(obj, f)
    return json.loads(run(kubectl, 'patch', '--local', '-f', path, '--type', 'strategic', '-p',
                          patch, '-o', 'json'))


def flags_patch(name, flags):
    """The patch virt-operator makes of customizeComponents.flags (apply/patches.go)."""
    arr = []
    for k in sorted(flags):
        v = flags[k].lower()
        arr += ['--' + k.lower()] if v == '' else \
            ['--%s=%s' % (k.lower(), v)] if v in ('true', 'false') else ['--' + k.lower(), v]
    return json.dumps({'spec': {'template': {'spec': {'containers': [
        {'name': name, 'command': [name] + arr}]}}}})


def arg(args, flag):
    for i in range(len(args) - 1):
        if args[i] == flag:
            return args[i + 1]
    return None


def conf_value(text, key):
    for line in text.splitlines():
        line = line.split('#', 1)[0].strip()
        m = re.match(r'([a-z0-9-]+)[ \t=]+(.*)', line)
        if m and m.group(1) == key:
            return m.group(2).strip()
    return None


def containers(pod_spec):
    return {c['name']: c for c in pod_spec.get('containers', [])}


def check_pod(label, ds, stock):
    spec = ds['spec']['template']['spec']
    names = [c['name'] for c in spec['containers']]
    expect(names[0] == 'virt-handler', '%s: virt-handler is the first container (%s)' %
           (label, names))
    expect(names.count('vmigd') == 1, '%s: one vmigd container' % label)
    volumes = {v['name'] for v in spec.get('volumes', [])}
    for c in spec['containers'] + spec.get('initContainers', []):
        for m in c.get('volumeMounts', []):
            expect(m['name'] in volumes, '%s: %s mounts %s, which the pod defines' %
                   (label, c['name'], m['name']))
    stock_handler = containers(stock['spec']['template']['spec'])['virt-handler']
    handler = containers(spec)['virt-handler']
    expect(handler.get('args') == stock_handler['args'],
           '%s: virt-handler\'s args are virt-operator\'s' % label)
    return handler, containers(spec)['vmigd']


def check_overlay(kubectl, work, overlay, stock_ds):
    allowed, tag = OVERLAYS[overlay]
    text = run(kubectl, 'kustomize', os.path.join(work, 'kustomize', overlay))
    expect('$(' not in text, '%s: every $(VAR) substituted' % overlay)
    objs = objects(kubectl, text, work)
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o['kind'], []).append(o)
    expect('NetworkPolicy' not in by_kind, '%s: no NetworkPolicy in the default render' % overlay)
    expect('ServiceMonitor' not in by_kind,
           '%s: no ServiceMonitor (needs the Prometheus operator) in the default render' % overlay)
    cms = [o for o in by_kind.get('ConfigMap', [])
           if o['metadata']['name'].startswith('vmigd-config')]
    if not expect(len(cms) == 1, '%s: one vmigd-config ConfigMap' % overlay):
        return
    cm = cms[0]
    registry = cm['data']['registry']
    expect(cm['metadata'].get('namespace') == 'kubevirt', '%s: the ConfigMap is in kubevirt' %
           overlay)
    expect(cm['data'].get('virt-handler-tag') == tag, '%s: virt-handler tag %s' % (overlay, tag))

    op = [o for o in by_kind.get('Deployment', []) if o['metadata']['name'] == 'virt-operator']
    if expect(len(op) == 1, '%s: the virt-operator Deployment' % overlay):
        c = op[0]['spec']['template']['spec']['containers'][0]
        env = {e['name']: e.get('value') for e in c['env']}
        expect(env.get('VIRT_HANDLER_IMAGE') == '%s/virt-handler:%s' % (registry, tag),
               '%s: VIRT_HANDLER_IMAGE=%s' % (overlay, env.get('VIRT_HANDLER_IMAGE')))
        expect(env.get('KUBEVIRT_VERSION') == 'v1.9.0' and 'WATCH_NAMESPACE' in env,
               '%s: virt-operator\'s own environment kept' % overlay)
        expect(c['image'] == 'quay.io/kubevirt/virt-operator:v1.9.0',
               '%s: virt-operator\'s image untouched' % overlay)

    svc = [o for o in by_kind.get('Service', []) if o['metadata']['name'] == 'vmigd-metrics']
    metrics = conf_value(cm['data']['vmigd.conf'], 'metrics')
    port = int(metrics.rsplit(':', 1)[1])
    if expect(len(svc) == 1, '%s: the vmigd-metrics Service' % overlay):
        p = svc[0]['spec']['ports'][0]
        expect(p['port'] == port and p['targetPort'] == port,
               '%s: the Service uses vmigd\'s metrics port %d' % (overlay, port))
        expect(svc[0]['spec']['selector'] == {'kubevirt.io': 'virt-handler'},
               '%s: the Service selects the virt-handler pods' % overlay)
    expect(metrics.startswith('127.0.0.1:'), '%s: metrics on localhost by default' % overlay)
    got = set(conf_value(cm['data']['release.conf'], 'tls-allow-client').split(','))
    expect(got == allowed, '%s: vmigd accepts sources named %s' % (overlay, sorted(got)))

    kvs = by_kind.get('KubeVirt', [])
    if not expect(len(kvs) == 1, '%s: the KubeVirt CR' % overlay):
        return
    kv = kvs[0]
    expect(kv['spec'].get('imagePullPolicy') == 'IfNotPresent' and
           'developerConfiguration' in kv['spec'].get('configuration', {}),
           '%s: the release CR\'s settings kept' % overlay)
    patches = kv['spec']['customizeComponents']['patches']
    expect(len(patches) == 1 and patches[0]['resourceType'] == 'DaemonSet' and
           patches[0]['resourceName'] == 'virt-handler' and patches[0]['type'] == 'strategic',
           '%s: one strategic patch of the virt-handler DaemonSet' % overlay)
    text = patches[0]['patch']
    patch = json.loads(text)
    pc = patch['spec']['template']['spec']['containers']
    expect(pc[0]['name'] == 'virt-handler', '%s: virt-handler first in the patch\'s containers' %
           overlay)
    expect('command' not in pc[0] and 'args' not in pc[0],
           '%s: the patch leaves virt-handler\'s command and args alone' % overlay)
    vmigd = containers(patch['spec']['template']['spec'])['vmigd']
    expect(vmigd['image'].startswith(registry + '/vmigd:'),
           '%s: vmigd image %s in the registry' % (overlay, vmigd['image']))
    cmv = [v for v in patch['spec']['template']['spec']['volumes'] if v['name'] == 'vmigd-config']
    expect(len(cmv) == 1 and cmv[0]['configMap']['name'] == cm['metadata']['name'],
           '%s: vmigd mounts the generated ConfigMap %s' % (overlay, cm['metadata']['name']))
    for item in cmv[0]['configMap'].get('items', []) if cmv else []:
        expect(item['key'] in cm['data'], '%s: the ConfigMap has %s' % (overlay, item['key']))

    # virt-operator: the CR's patches, then flags.handler's, then --max-devices (apps.go)
    ds = strategic(kubectl, stock_ds, text, work)
    handler, vm = check_pod(overlay + ' patched', ds, stock_ds)
    expect(handler['command'] == ['virt-handler'], '%s: virt-handler\'s command untouched (%s)' %
           (overlay, handler['command']))
    env = {e['name']: e.get('value') for e in handler.get('env', [])}
    expect(env.get('VMIGD_CONTROL') == SOCK, '%s: VMIGD_CONTROL=%s' %
           (overlay, env.get('VMIGD_CONTROL')))
    expect('NODE_NAME' in env and 'MY_POD_IP' in env, '%s: virt-handler\'s own environment kept' %
           overlay)
    expect(arg(vm['args'], '--control') == SOCK, '%s: vmigd --control is VMIGD_CONTROL' % overlay)
    vm_env = {e['name']: e.get('value') for e in vm.get('env', [])}
    expect(vm_env.get('VMIGD_CONTROL') == SOCK,
           '%s: VMIGD_CONTROL=%s in the vmigd container, for its vmigctl' %
           (overlay, vm_env.get('VMIGD_CONTROL')))
    for probe in ('readinessProbe', 'livenessProbe'):
        cmd = vm[probe]['exec']['command']
        expect(cmd[0] == 'vmigctl' and (arg(cmd, '-c') or vm_env.get('VMIGD_CONTROL')) == SOCK,
               '%s: the %s asks vmigd at %s: %s' % (overlay, probe, SOCK, cmd))
    expect(SOCK.startswith(HANDLER_SHARE_DIR + '/'),
           '%s: the socket is under virt-handler\'s %s mount' % (overlay, HANDLER_SHARE_DIR))
    mounts = {m['mountPath']: m['name'] for m in vm['volumeMounts']}
    expect(mounts.get(os.path.dirname(SOCK)) == 'vmigd-socket-dir',
           '%s: the socket\'s directory is vmigd\'s mount' % overlay)
    for flag in ('--tls-cert', '--tls-key', '--tls-client-cert', '--tls-client-key', '--tls-ca',
                 '--config'):
        paths = [vm['args'][i + 1] for i in range(len(vm['args']) - 1) if vm['args'][i] == flag]
        for p in paths:
            expect(os.path.dirname(p) in mounts, '%s: %s %s is in a mount' % (overlay, flag, p))

    ds = strategic(kubectl, ds, flags_patch('virt-handler', {'v': '4'}), work)
    handler, vm = check_pod(overlay + ' + flags.handler', ds, stock_ds)
    expect(handler['command'] == ['virt-handler', '--v', '4'] and vm['command'] == ['vmigd'],
           '%s: flags.handler rewrites virt-handler\'s command only' % overlay)
    ds['spec']['template']['spec']['containers'][0]['command'] += ['--max-devices', '200']
    expect(containers(ds['spec']['template']['spec'])['vmigd']['command'] == ['vmigd'],
           '%s: --max-devices goes to virt-handler, not vmigd' % overlay)


def check_opt_ins(kubectl, work):
    objs = objects(kubectl, run(kubectl, 'kustomize',
                                os.path.join(work, 'kustomize', 'metrics-networkpolicy')), work)
    np = [o for o in objs if o['kind'] == 'NetworkPolicy']
    if expect(len(objs) == 1 and len(np) == 1, 'metrics-networkpolicy: its NetworkPolicy only'):
        spec = np[0]['spec']
        ports = [p['port'] for r in spec['ingress'] for p in r.get('ports', [])]
        expect(spec['podSelector'] == {'matchLabels': {'kubevirt.io': 'virt-handler'}} and
               ports == [9479], 'metrics-networkpolicy: adds port 9479 to virt-handler\'s pods')
    objs = objects(kubectl, run(kubectl, 'kustomize',
                                os.path.join(work, 'kustomize', 'prometheus')), work)
    expect([o['kind'] for o in objs] == ['ServiceMonitor'], 'prometheus: its ServiceMonitor')


def main():
    kubectl = os.environ.get('KUBECTL') or shutil.which('kubectl')
    if not kubectl or not os.access(kubectl, os.X_OK):
        print('SKIP: no kubectl (Debian: apt-get install kubernetes-client; or set KUBECTL)')
        return 77
    print(run(kubectl, 'version', '--client').strip().replace('\n', '; '))
    with tempfile.TemporaryDirectory(prefix='vmigd-kustomize-') as work:
        shutil.copytree(KUSTOMIZE, os.path.join(work, 'kustomize'))
        for f in ('kubevirt-operator.yaml', 'kubevirt-cr.yaml'):
            shutil.copy(os.path.join(TESTDATA, f), os.path.join(work, 'kustomize', 'kubevirt', f))
        stock_ds = objects(kubectl, open(os.path.join(TESTDATA, 'virt-handler-daemonset.yaml'))
                           .read(), work)[0]
        for overlay in OVERLAYS:
            check_overlay(kubectl, work, overlay, stock_ds)
        check_opt_ins(kubectl, work)
    if failures:
        print('%d check(s) failed' % len(failures))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
