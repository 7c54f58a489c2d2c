"""Red-team benchmark: the full gate on every env of tests/redteam_unseen (flawed and good).

    python benchmarks/bench_redteam.py [--probe-seed N] [--draws K] [--only NAME ...] [--out benchmarks/results/redteam.json]

Each env folder's manifest.json names its class (static, probe, capability, classic, robustness;
good for the unmodified renders, which must be accepted). Prints a table (name, class, verdict,
the first error finding) and the rejection rate per class, and writes JSON after every env (a
crash or Ctrl-C keeps what was audited). Goal (issue 15): >= 90% of the flawed envs rejected,
0 good envs rejected. Without --probe-seed every audit draws its own probes (as `envforge audit`
does); the seeds drawn are in the JSON, so any row can be replayed. --draws K audits every env K
times (probe seeds N, N+1, ... with --probe-seed), so that a rate is measured, not one draw: a good
env's false rejections, say `--only helpdesk_precondition_verification --draws 200`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from envforge.gate import audit  # noqa: E402
from envforge.gate.config import GateSettings  # noqa: E402

CORPUS = REPO / "tests" / "redteam_unseen"
BASE = REPO / "generated_envs" / "helpdesk_precondition_verification"


def corpus() -> list[tuple[str, Path, str]]:
    """(name, folder, class) of every env in the corpus, the unmodified base included."""
    out = []
    for p in sorted(CORPUS.iterdir()):
        if (p / "env.py").is_file():
            try:
                kind = json.loads((p / "manifest.json").read_text()).get("class")
            except (OSError, ValueError):
                kind = None
            out.append((p.name, p, kind or ("good" if p.name.startswith("good_") else "unknown")))
    if (BASE / "env.py").is_file():
        out.append((BASE.name, BASE, "good"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe-seed", type=int, default=None, help="the gate's probe seed (default: drawn per audit)")
    ap.add_argument("--draws", type=int, default=1, help="audits of each env, each with its own probe seed")
    ap.add_argument("--only", nargs="*", default=None, help="audit only these env names")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "redteam.json"))
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    load_before = os.getloadavg()
    for name, path, kind in corpus():
        if args.only and name not in args.only:
            continue
        for draw in range(args.draws):
            t0 = time.perf_counter()
            probe_seed = None if args.probe_seed is None else args.probe_seed + draw
            report = audit(path, target="example", settings=GateSettings(probe_seed=probe_seed), write_report=False)
            errors = [f for f in report.findings if f.severity == "error"]
            rows.append({"env": name, "class": kind, "verdict": report.verdict, "seconds": round(time.perf_counter() - t0, 2),
                         "checks": sorted({f.check for f in errors}),
                         "finding": f"{errors[0].check}: {errors[0].message[:150]}" if errors else "",
                         "probe_seed": report.stats.get("probe_seed")})
            r = rows[-1]
            print(f"{name:34s} {kind:11s} {r['verdict']:7s} {r['seconds']:6.1f} s  {r['finding'][:90]}", flush=True)
            out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    classes: dict[str, list] = {}
    for r in rows:
        classes.setdefault(r["class"], []).append(r)
    rates = {k: {"rejected": sum(r["verdict"] == "reject" for r in v), "of": len(v)} for k, v in sorted(classes.items())}
    flawed = [r for r in rows if r["class"] != "good"]
    summary = {"per_class": rates,
               "flawed_rejected": {"rejected": sum(r["verdict"] == "reject" for r in flawed), "of": len(flawed), "goal": 0.9},
               "good_rejected": rates.get("good", {"rejected": 0, "of": 0}),
               "median_s": sorted(r["seconds"] for r in rows)[len(rows) // 2] if rows else None,
               "load_average": {"before": load_before, "after": os.getloadavg()}}
    print()
    print(f"{'class':12s}{'rejected':>10s}{'of':>5s}{'rate':>8s}   (audits)")
    for k, v in rates.items():
        print(f"{k:12s}{v['rejected']:10d}{v['of']:5d}{v['rejected'] / max(v['of'], 1):8.0%}")
    f = summary["flawed_rejected"]
    print(f"{'all flawed':12s}{f['rejected']:10d}{f['of']:5d}{f['rejected'] / max(f['of'], 1):8.0%}   (goal >= 90%; good envs: reject none)")
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
