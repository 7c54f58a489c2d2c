"""The structural labeller against the hand labels of tests/gold/identify_gold.jsonl (the gold
set: ids, labels and one-line reasons, read from the real runs in ../shared/trajectories by a
person following docs/identify-rubric.md, independently of the rules).

Reports LACKING precision and recall per capability and overall, and asserts the goal overall
(precision >= 0.85, recall >= 0.65). Run with ``-s`` to see the table."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from envforge.identify import LACKING, label_structural
from envforge.targets import load_target
from envforge.trajectories import load_trajectories
from tests.conftest import SHARED, TARGETS, needs_shared

GOLD = Path(__file__).parent / "gold" / "identify_gold.jsonl"
PRECISION_GOAL, RECALL_GOAL = 0.85, 0.65


def gold_rows() -> list[dict]:
    return [json.loads(line) for line in GOLD.read_text(encoding="utf-8").splitlines() if line.strip()]


def predicted() -> dict[tuple, str]:
    """(source file name, index, capability) -> the structural label, each file labelled with
    its domain's target (tool metadata and policy) when ../shared has one, as a user would run
    ``envforge identify FILE --target targets/tau2/<domain>``."""
    out = {}
    for source in sorted({r["source"] for r in gold_rows()}):
        ts = load_trajectories(SHARED / "trajectories" / source)
        domain = ts[0].metadata.get("domain") if ts else None
        target = load_target(TARGETS / "tau2" / domain) if domain and (TARGETS / "tau2" / domain).is_dir() else None
        _, verdicts = label_structural(ts, target.meta if target else None,
                                       policy=target.policy if target else None)
        for t, v in zip(ts, verdicts):
            for cap, verdict in v.items():
                out[(source, t.metadata["index"], cap)] = verdict.label
    return out


def scores(pairs: list[tuple[str, str]]) -> dict:
    """LACKING precision and recall of (gold, predicted) label pairs."""
    tp = sum(g == LACKING and p == LACKING for g, p in pairs)
    fp = sum(g != LACKING and p == LACKING for g, p in pairs)
    fn = sum(g == LACKING and p != LACKING for g, p in pairs)
    return {"n": len(pairs), "tp": tp, "fp": fp, "fn": fn,
            "precision": tp / (tp + fp) if tp + fp else None,
            "recall": tp / (tp + fn) if tp + fn else None,
            "agree": sum(g == p for g, p in pairs) / len(pairs) if pairs else None}


def _f(x: float | None) -> str:
    return "  -  " if x is None else f"{x:.2f}"


@needs_shared
def test_gold_set_is_large_and_names_real_trajectories():
    rows = gold_rows()
    assert len(rows) >= 150, f"the gold set holds {len(rows)} pairs; the issue asks for >= 150"
    pred = predicted()
    missing = [(r["source"], r["index"], r["capability"]) for r in rows
               if (r["source"], r["index"], r["capability"]) not in pred]
    assert not missing, f"gold pairs naming no labelled trajectory: {missing[:5]}"


@needs_shared
def test_lacking_precision_and_recall_against_the_gold_set():
    rows, pred = gold_rows(), predicted()
    by_cap: dict[str, list] = {}
    wrong = []
    for r in rows:
        p = pred[(r["source"], r["index"], r["capability"])]
        by_cap.setdefault(r["capability"], []).append((r["label"], p))
        if (r["label"] == LACKING) != (p == LACKING):
            wrong.append(f"  {r['source'][:24]}#{r['index']} {r['capability']}: gold {r['label']} "
                         f"({r['why'][:80]}), rules {p}")
    print(f"\n{'capability':30} {'n':>4} {'gold L':>6} {'tp':>3} {'fp':>3} {'fn':>3} "
          f"{'prec':>5} {'rec':>5} {'agree':>5}")
    for cap, pairs in sorted(by_cap.items()):
        s = scores(pairs)
        print(f"{cap:30} {s['n']:4} {s['tp'] + s['fn']:6} {s['tp']:3} {s['fp']:3} {s['fn']:3} "
              f"{_f(s['precision']):>5} {_f(s['recall']):>5} {_f(s['agree']):>5}")
    total = scores([p for pairs in by_cap.values() for p in pairs])
    print(f"{'overall':30} {total['n']:4} {total['tp'] + total['fn']:6} {total['tp']:3} "
          f"{total['fp']:3} {total['fn']:3} {_f(total['precision']):>5} {_f(total['recall']):>5} "
          f"{_f(total['agree']):>5}")
    print(f"labels: gold {dict(Counter(r['label'] for r in rows))}")
    if wrong:
        print("LACKING disagreements:\n" + "\n".join(wrong))
    assert total["precision"] is not None and total["precision"] >= PRECISION_GOAL, total
    assert total["recall"] is not None and total["recall"] >= RECALL_GOAL, total
