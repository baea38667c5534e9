# SPDX-License-Identifier: Apache-2.0
"""vmig-bench plot: images from vmig-bench's JSON results, never drawn by hand.

- converge results: one timeline per scenario and mode, every run overlaid: the remaining RAM at
  each pass (left axis), the dirty rate QEMU reported and the auto-converge throttle (right
  axis), and each action vmigd took as a vertical line labelled with it;
- qemu and stream results (routes): throughput per route, a bar for the median and a dot per
  run, and beside it the CPU each route cost per GB where the results have it.

matplotlib comes from Debian's python3-matplotlib (tools/setup installs it); images are SVG, or
PNG when the output name ends in .png."""

import json
import os
import statistics
import sys


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    # Reproducible SVG: no random ids, no date in the metadata.
    matplotlib.rcParams['svg.hashsalt'] = 'vmigd'
    matplotlib.rcParams['font.size'] = 9
    matplotlib.rcParams['svg.fonttype'] = 'none'  # text as text: small files
    return plt


def _save(fig, path):
    meta = {'Date': None} if path.endswith('.svg') else {}
    fig.savefig(path, bbox_inches='tight', metadata=meta)
    print(f'vmig-bench plot: wrote {path}')


def _groups(runs):
    """Runs by (scenario, mode[, variant]), in the order they first appear."""
    out = {}
    for r in runs:
        name = f'{r.get("scenario")} / {r.get("mode")}'
        if r.get('variant'):
            name += f' ({r["variant"]})'
        if r.get('size') and r.get('size') != 'small':
            name += f' [{r["size"]}]'
        out.setdefault(name, []).append(r)
    return out


def converge(plt, data, out_prefix, source):
    groups = _groups([r for r in data.get('runs', []) if r.get('timeline')])
    if not groups:
        raise SystemExit(f'vmig-bench plot: {source}: no converge runs with a timeline')
    paths = []
    for name, runs in groups.items():
        fig, ax = plt.subplots(figsize=(7.5, 3.6))
        right = ax.twinx()
        colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
        top = 0.0
        for i, r in enumerate(runs):
            c = colors[i % len(colors)]
            # [t, status, dirty-sync-count, dirty MiB/s, remaining MiB, throttle %]
            tl = r['timeline']
            t = [p[0] for p in tl]
            ax.step(t, [p[4] for p in tl], where='post', color=c, lw=1.4,
                    label=f'run {r.get("run", i + 1)}: {r.get("status")} '
                          f'{r.get("total_s", 0):.1f} s')
            right.plot(t, [p[3] for p in tl], color=c, lw=0.8, ls='--')
            if any(p[5] for p in tl):
                right.step(t, [p[5] for p in tl], where='post', color=c, lw=0.8, ls=':')
            top = max(top, max((p[4] for p in tl), default=0))
            for a in r.get('actions', []):
                ax.axvline(a['at_s'], color=c, lw=0.8, alpha=0.7)
                ax.annotate(a['action'], (a['at_s'], 0), xytext=(2, 2),
                            textcoords='offset points', rotation=90, fontsize=7, color=c,
                            va='bottom')
        cap = runs[0].get('cap_mib_s')
        dirty = runs[0].get('dirty_mib_s')
        ax.set_title(f'{name}: guest {runs[0].get("mem_mib")} MiB, dirtying {dirty} MiB/s, '
                     f'cap {cap} MiB/s', fontsize=9)
        ax.set_xlabel('s since the migration started')
        ax.set_ylabel('remaining at each pass, MiB (solid)')
        right.set_ylabel('dirty rate MiB/s (dashed), throttle % (dotted)')
        ax.set_ylim(0, top * 1.1 or 1)
        right.set_ylim(bottom=0)
        ax.legend(loc='upper right', fontsize=7)
        slug = name.replace(' / ', '-').replace(' ', '-').replace('(', '').replace(')', '') \
                   .replace('[', '').replace(']', '')
        path = f'{out_prefix}-{slug}.svg'
        _save(fig, path)
        plt.close(fig)
        paths.append(path)
    return paths


def routes(plt, data, out_prefix, source):
    runs = [r for r in data.get('runs', []) if r.get('ok', True) and r.get('gbit_s')]
    if not runs:
        raise SystemExit(f'vmig-bench plot: {source}: no runs with a throughput')
    order = []
    for r in runs:
        if r['route'] not in order:
            order.append(r['route'])
    by = {k: [r for r in runs if r['route'] == k] for k in order}
    cost_key = next((k for k in ('vmigd_cpu_s_per_gb', 'relay_cpu_s_per_gb', 'system_cpu_s_per_gb')
                     if any(k in r for r in runs)), None)
    fig, axes = plt.subplots(1, 2 if cost_key else 1, figsize=(9 if cost_key else 5.5, 3.4))
    axes = axes if cost_key else [axes]
    for ax, key, label in ((axes[0], 'gbit_s', 'Gbit/s'),
                           *(((axes[1], cost_key, cost_key.replace('_cpu_s_per_gb', '') +
                                ' CPU, core-s/GB'),) if cost_key else ())):
        med = [statistics.median(r[key] for r in by[k] if r.get(key) is not None)
               if any(r.get(key) is not None for r in by[k]) else 0 for k in order]
        ax.bar(range(len(order)), med, color='#9ecae1')
        for i, k in enumerate(order):
            ys = [r[key] for r in by[k] if r.get(key) is not None]
            ax.plot([i] * len(ys), ys, 'o', color='#08519c', ms=3)
            ax.annotate(f'{med[i]:.2f}', (i, med[i]), xytext=(0, 2), textcoords='offset points',
                        ha='center', fontsize=7)
        ax.set_xticks(range(len(order)), order, rotation=30, ha='right')
        ax.set_ylabel(f'{label} (bar: median; dots: runs)')
    p = data.get('params', {})
    what = ', '.join(f'{k} {p[k]}' for k in ('ram', 'channels', 'streams', 'gib') if k in p)
    fig.suptitle(f'{data.get("mode")} ({what}), {len(runs)} runs: {os.path.basename(source)}',
                 fontsize=8)
    path = f'{out_prefix}-routes.svg'
    _save(fig, path)
    plt.close(fig)
    return [path]


def main(files, outdir):
    try:
        plt = _pyplot()
    except ImportError:
        # vmig-bench runs under whatever python3 is first on PATH; Debian's has matplotlib.
        if sys.executable != '/usr/bin/python3' and os.path.exists('/usr/bin/python3'):
            os.execv('/usr/bin/python3', ['/usr/bin/python3', *sys.argv])
        raise SystemExit('vmig-bench plot: needs matplotlib (Debian: python3-matplotlib, which '
                         'tools/setup installs)')
    os.makedirs(outdir, exist_ok=True)
    paths = []
    for f in files:
        try:
            with open(f) as fp:
                data = json.load(fp)
        except (OSError, ValueError) as e:
            raise SystemExit(f'vmig-bench plot: {f}: {getattr(e, "strerror", None) or e}')
        prefix = os.path.join(outdir, os.path.splitext(os.path.basename(f))[0])
        if data.get('mode') == 'converge':
            paths += converge(plt, data, prefix, f)
        elif data.get('mode') in ('qemu', 'stream'):
            paths += routes(plt, data, prefix, f)
        else:
            raise SystemExit(f'vmig-bench plot: {f}: mode {data.get("mode")!r}: only converge, '
                             'qemu and stream results are drawn')
    return paths
