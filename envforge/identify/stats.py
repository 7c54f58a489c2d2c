"""The statistics of TRACE section 3 and the selection.

Per capability: ER+ = LACKING / (LACKING + PRESENT) over successes (the background rate), ER-
the same over failures, gap = ER- - ER+, coverage = failures where it is LACKING / all failures.
Keep it when gap >= delta and coverage >= rho in at least K of N runs.

Runs: the labels are computed once; each of the N runs resamples the trajectories with
replacement (a bootstrap, successes and failures separately, seed ``seed + run``) and recomputes
the statistics, so K-of-N asks whether the selection is stable under resampling. With
``runs == 1`` the single run is the full data.

When a rate is undefined (no LACKING or PRESENT label in that group) it is reported as null;
an undefined ER+ counts as 0 in the gap (no success gives evidence of a background rate).
"""
from __future__ import annotations

import random
import statistics
from typing import Sequence

from envforge.identify.config import EPS, NA, IdentifyConfig


def capability_stats(labels: Sequence[str], success: Sequence[bool]) -> dict:
    """ER+, ER-, gap, coverage and counts of one capability over labelled trajectories."""
    counts = dict.fromkeys(("lacking_success", "present_success", "na_success",
                            "lacking_failure", "present_failure", "na_failure"), 0)
    for lab, ok in zip(labels, success):
        counts[f"{lab.lower()}_{'success' if ok else 'failure'}"] += 1

    def rate(lacking: int, present: int) -> float | None:
        return lacking / (lacking + present) if lacking + present else None

    er_plus = rate(counts["lacking_success"], counts["present_success"])
    er_minus = rate(counts["lacking_failure"], counts["present_failure"])
    failures = counts["lacking_failure"] + counts["present_failure"] + counts["na_failure"]
    gap = None if er_minus is None else er_minus - (er_plus or 0.0)
    coverage = counts["lacking_failure"] / failures if failures else 0.0
    return {"er_plus": er_plus, "er_minus": er_minus, "gap": gap, "coverage": coverage,
            "counts": counts}


def is_retained(stats: dict, delta: float, rho: float) -> bool:
    """The paper's selection rule: gap >= delta and coverage >= rho."""
    return stats["gap"] is not None and stats["gap"] >= delta - EPS and stats["coverage"] >= rho - EPS


def run_statistics(labels: Sequence[str], success: Sequence[bool], config: IdentifyConfig) -> dict:
    """Gap and coverage over ``config.runs`` bootstrap runs, and in how many runs it was kept."""
    s_idx = [i for i, ok in enumerate(success) if ok]
    f_idx = [i for i, ok in enumerate(success) if not ok]
    gaps, covs, kept = [], [], 0
    for r in range(config.runs):
        if config.runs == 1:
            idx = list(range(len(success)))
        else:
            rng = random.Random(config.seed + r)
            idx = [rng.choice(s_idx) for _ in s_idx] + [rng.choice(f_idx) for _ in f_idx]
        st = capability_stats([labels[i] for i in idx], [success[i] for i in idx])
        kept += is_retained(st, config.delta, config.rho)
        if st["gap"] is not None:
            gaps.append(st["gap"])
        covs.append(st["coverage"])
    return {"n": config.runs, "k": config.k, "retained_in": kept,
            "gap_mean": _mean(gaps), "gap_std": _std(gaps),
            "coverage_mean": _mean(covs), "coverage_std": _std(covs)}


def group_warnings(success: Sequence[bool], min_group: int) -> list[str]:
    """Why a contrast of these groups means nothing: too few successes or failures."""
    n_succ = sum(success)
    n_fail = len(success) - n_succ
    out = []
    for n, what, other in ((n_succ, "successes", "ER+ (the background rate)"),
                           (n_fail, "failures", "ER- and coverage")):
        if n < min_group:
            out.append(f"only {n} {what} (fewer than {min_group}): {other} cannot be estimated, "
                       f"so no capability is retained; add runs with {what} or lower --min-group")
    return out


def _mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 4) if xs else None


def _std(xs: list[float]) -> float | None:
    return round(statistics.pstdev(xs), 4) if xs else None


def rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def capability_entry(name: str, description: str, labels: Sequence[str], success: Sequence[bool],
                     config: IdentifyConfig, *, reads_expected: bool, contrast_ok: bool) -> dict:
    """One capability's statistics as capabilities.json holds them (examples added by the stage).

    ``reads_expected``: its rule compares the agent with the task's expected actions, so on
    tau-bench (success = the expected actions' final database) ER+ is 0 by construction when no
    success is LACKING, and its gap is then just ER-. ``contrast_ok``: both groups are large
    enough (else nothing is retained).
    """
    st = capability_stats(labels, success)
    runs = run_statistics(labels, success, config)
    by_construction = reads_expected and st["counts"]["lacking_success"] == 0
    return {"name": name, "description": description,
            "er_plus": rounded(st["er_plus"]), "er_minus": rounded(st["er_minus"]),
            "gap": rounded(st["gap"]), "coverage": rounded(st["coverage"]),
            "retained": contrast_ok and runs["retained_in"] >= config.k,
            "reads_expected": reads_expected,
            "er_plus_by_construction": by_construction,
            "counts": st["counts"], "runs": runs}


def labels_of(name: str, labels: Sequence[dict[str, str]]) -> list[str]:
    return [lab.get(name, NA) for lab in labels]
