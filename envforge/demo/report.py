"""The demo's report: figures (PNG), one self-contained HTML page (figures embedded as data
URIs, every number from results.json) and the table printed on stdout."""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

METHODS = ("base", "routed", "merged", "grpo_target", "oracle")
LABELS = {"base": "base", "routed": "routed (TRACE)", "merged": "merged adapters",
          "grpo_target": "GRPO on the target", "oracle": "oracle routing"}


def fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def plot_methods(results: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    m = results["methods"]
    names = [k for k in METHODS if k in m]
    means = [m[k]["mean"] for k in names]
    err = [[m[k]["mean"] - m[k]["ci"][0] for k in names], [m[k]["ci"][1] - m[k]["mean"] for k in names]]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar([LABELS[k] for k in names], means, yerr=err, capsize=4,
           color=["#888888", "#2b7bba", "#7fb3d5", "#e59866", "#58d68d"][:len(names)])
    for i, k in enumerate(names):  # above the interval, not across its whisker
        ax.text(i, m[k]["ci"][1] + 0.02, f"{means[i]:.3f}", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("target success rate (95% CI)")
    ax.set_title(f"envforge demo, seed {results['seed']}{' (quick)' if results['quick'] else ''}: "
                 f"{m['base']['n']} held-out target tasks")
    plt.setp(ax.get_xticklabels(), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_curves(results: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, t in results["training"].items():
        curve = t["reward_curve"]
        ax.plot(range(1, len(curve) + 1), curve, marker="o", ms=2,
                label=LABELS["grpo_target"] if name == "grpo_target" else f"adapter: {name}")
    ax.set_xlabel("GRPO iteration (4 x 4 rollouts)")
    ax.set_ylabel("mean rollout reward")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("reward curves")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def table_rows(results: dict) -> list[list[str]]:
    m = results["methods"]
    base = m["base"]["mean"]
    rows = []
    for k in METHODS:
        if k in m:
            delta = "" if k == "base" else f"{m[k]['mean'] - base:+.3f}"
            rows.append([LABELS[k], fmt(m[k]["mean"]), f"[{fmt(m[k]['ci'][0])}, {fmt(m[k]['ci'][1])}]",
                         delta, str(results["rollouts_per_method"].get(k, 0)), str(m[k]["n"])])
    return rows


HEADER = ["method", "mean", "95% CI", "vs base", "rollouts", "tasks"]


def print_table(results: dict, stream) -> None:
    rows = [HEADER] + table_rows(results)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    for n, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)), file=stream)
        if n == 0:
            print("  ".join("-" * w for w in widths), file=stream)
    ra = results.get("routing_accuracy")
    print(f"planted {results['planted']}; identified {results['identified']}; routing accuracy "
          f"{fmt(ra)}; wall {results['wall_s']:.0f}s", file=stream)


def _img(path: Path, alt: str, ident: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img id="{ident}" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def write_report(results: dict, out: Path) -> Path:
    """figures/methods.png, figures/reward_curves.png and report.html in ``out``."""
    figs = out / "figures"
    figs.mkdir(exist_ok=True)
    methods_png = plot_methods(results, figs / "methods.png")
    curves_png = plot_curves(results, figs / "reward_curves.png")
    results["figures"] = {"methods": "figures/methods.png", "reward_curves": "figures/reward_curves.png"}
    e = html.escape
    rows = "".join(
        f'<tr data-method="{k}">' + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>"
        for k, r in zip([k for k in METHODS if k in results["methods"]], table_rows(results)))
    stages = "".join(f"<tr><td>{e(k)}</td><td>{v:.1f}</td></tr>" for k, v in results["stages"].items())
    ra = results.get("routing_accuracy")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>envforge demo, seed {results['seed']}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.2em .6em;text-align:left}}
img{{max-width:100%}}</style></head><body>
<h1>envforge demo: TRACE end to end</h1>
<p>Seed {results['seed']}{' (quick)' if results['quick'] else ''}; wall time
<span id="wall">{results['wall_s']:.0f}</span> s. A small model made locally, with planted deficits in
<span id="planted">{e(', '.join(results['planted']))}</span>; identify retained
<span id="identified">{e(', '.join(results['identified']) or 'none')}</span>. Routing accuracy against
the planted labels: <span id="routing">{fmt(ra)}</span>.</p>
<h2>Held-out target tasks</h2>
<table id="methods"><tr>{''.join(f'<th>{e(h)}</th>' for h in HEADER)}</tr>{rows}</table>
<p>{_img(methods_png, 'success rate per method with 95% CI', 'fig-methods')}</p>
<h2>Training</h2>
<p>{_img(curves_png, 'reward curve per adapter', 'fig-curves')}</p>
<h2>Stages (seconds)</h2><table id="stages">{stages}</table>
<h2>results.json</h2><pre id="results-json">{e(json.dumps(results, indent=1))}</pre>
</body></html>
"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
