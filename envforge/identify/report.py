"""An identification for people: the table and the plot of gap against coverage.

Both say when a contrast means little: a capability whose rule reads the task's expected
actions and found no LACKING success has ER+ 0 *by construction* (on tau-bench, success is
reaching the expected actions' database), marked ``0*``; the warnings (too few successes or
failures) head the table and the plot; a grey point inside the keep region says why it is grey
(kept in only k of N runs, or no contrast at all).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from envforge.errors import InputError
from envforge.identify.identification import Identification

BY_CONSTRUCTION = ("0* : ER+ is 0 by construction: the rule compares the agent with the task's "
                   "expected actions, which define success, so its gap is just ER-")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(result: Identification) -> Any:
    """The result as a rich Table (warnings and the by-construction note in its caption)."""
    from rich.table import Table
    tr, s = result.counts, result.settings
    t = Table(title=f"capabilities: {tr['total']} trajectories, {tr['successes']} successes, "
                    f"{tr['failures']} failures (keep: gap >= {s['delta']}, coverage >= {s['rho']} "
                    f"in >= {s['min_runs']} of {s['runs']} runs)")
    t.add_column("capability", no_wrap=True)
    for col in ("ER+", "ER-", "gap", "coverage", "runs kept", "kept"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("examples", overflow="fold")
    starred = False
    for c in result.capabilities:
        runs = c["runs"]
        spread = f" ±{runs['gap_std']:.2f}" if runs["n"] > 1 and runs["gap_std"] is not None else ""
        cov_spread = f" ±{runs['coverage_std']:.2f}" if runs["n"] > 1 else ""
        ex = ", ".join(c["examples"][:3]) + (f" (+{len(c['examples']) - 3})" if len(c["examples"]) > 3 else "")
        er_plus = _fmt(c["er_plus"])
        if c.get("er_plus_by_construction"):
            er_plus, starred = (er_plus if c["er_plus"] is None else "0*"), True
        t.add_row(c["name"], er_plus, _fmt(c["er_minus"]), _fmt(c["gap"]) + spread,
                  _fmt(c["coverage"]) + cov_spread, f"{runs['retained_in']}/{runs['n']}",
                  "yes" if c["retained"] else "no", ex)
    notes = [f"warning: {w}" for w in result.warnings] + ([BY_CONSTRUCTION] if starred else [])
    if notes:
        t.caption = "\n".join(notes)
    return t


def grey_reason(c: dict, settings: dict, warnings: list[str]) -> str | None:
    """Why a point inside the keep region (gap >= delta, coverage >= rho) is not kept."""
    if c["retained"] or c["gap"] is None or c["gap"] < settings["delta"] or c["coverage"] < settings["rho"]:
        return None
    if warnings:
        return "not kept: too few successes or failures"
    return f"kept in {c['runs']['retained_in']} of {c['runs']['n']} runs (needs {settings['min_runs']})"


def plot(result: Identification, path: str | Path) -> Path | None:
    """A PNG of gap against coverage with the thresholds drawn; None when matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    s = result.settings
    caps = [c for c in result.capabilities if c["gap"] is not None]
    fig, ax = plt.subplots(figsize=(7.5, 5.5), dpi=120)
    for kept, colour, label in ((True, "tab:green", "kept"), (False, "tab:grey", "not kept")):
        pts = [c for c in caps if c["retained"] == kept]
        if pts:
            ax.errorbar([c["coverage"] for c in pts], [c["gap"] for c in pts],
                        xerr=[c["runs"]["coverage_std"] or 0 for c in pts],
                        yerr=[c["runs"]["gap_std"] or 0 for c in pts],
                        fmt="o", color=colour, label=label, capsize=3)
    starred = False
    at: dict[tuple, list[str]] = {}  # points at the same place share one label
    for c in caps:
        name = c["name"]
        if c.get("er_plus_by_construction"):
            name, starred = name + " (ER+ 0*)", True
        why = grey_reason(c, s, result.warnings)
        at.setdefault((c["coverage"], c["gap"]), []).append(name + (f" ({why})" if why else ""))
    for (x, y), names in at.items():
        ax.annotate("\n".join(names), (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.axhline(s["delta"], color="tab:red", ls="--", lw=1, label=f"delta = {s['delta']}")
    ax.axvline(s["rho"], color="tab:blue", ls="--", lw=1, label=f"rho = {s['rho']}")
    ax.set_xlabel("coverage (share of failures where it is LACKING)")
    ax.set_ylabel("gap (ER- - ER+)")
    ax.set_title(f"capabilities ({result.labeller} labeller, {result.counts['total']} trajectories)")
    notes = [f"warning: {w}" for w in result.warnings] + (
        ["0*: ER+ 0 by construction (the rule reads the expected actions, which define success)"]
        if starred else [])
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=6, color="tab:red", va="bottom", wrap=True)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(min(-0.1, *(c["gap"] - 0.05 for c in caps)) if caps else -0.1, 1.05)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout(rect=(0, 0.04 * len(notes), 1, 1))
    path = Path(path)
    try:
        fig.savefig(path)
    except OSError as e:
        raise InputError(f"{path}: cannot write the plot ({e.strerror})") from None
    except ValueError as e:  # a format matplotlib does not draw
        raise InputError(f"{path}: cannot draw the plot in this format ({e}); give a .png name") from None
    finally:
        plt.close(fig)
    return path
