"""Gate benchmark: seconds to audit one env, static only and full, over the fixture envs.

    python benchmarks/bench_gate.py [--seeds 50] [--repeat 5] [--probe-seed N] [--out benchmarks/results/gate.json]

Goals (issue 2): static audit under 50 ms per env; full gate under 10 s per env on 2 cores with
at least 50 seeds per property (issue 15: still, with the drawn probes, the many-resets probe and
the capability probes). Prints a table and writes JSON, with the machine's load average before
and after (the machine is shared: a load above its core count makes every figure slower).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from envforge.gate import audit  # noqa: E402
from envforge.gate.dynamic import GateSettings  # noqa: E402
from envforge.gate.static import audit_static  # noqa: E402

FIXTURES = REPO.parent / "shared" / "fixtures" / "envs"
TARGETS = REPO.parent / "shared" / "targets"


def envs() -> list[tuple[str, Path, str | Path]]:
    out = [(p.name, p, "example") for p in sorted((REPO / "generated_envs").iterdir()) if (p / "env.py").is_file()]
    if FIXTURES.is_dir():
        labels = json.loads((FIXTURES / "labels.json").read_text())
        out += [(name, FIXTURES / name, TARGETS / lab["target"]) for name, lab in sorted(labels.items())]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5, help="static-audit repetitions per env (median taken)")
    ap.add_argument("--probe-seed", type=int, default=1, help="the gate's probe seed (fixed, so runs compare)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gate.json"))
    args = ap.parse_args()
    rows = []
    load_before = os.getloadavg()
    for name, path, target in envs():
        source = (path / "env.py").read_bytes()
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            audit_static(source)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        report = audit(path, target=target, settings=GateSettings(seeds=args.seeds, probe_seed=args.probe_seed),
                       write_report=False)
        full = time.perf_counter() - t0
        rows.append({"env": name, "kb": round(len(source) / 1024, 1), "static_s": statistics.median(times),
                     "full_s": full, "verdict": report.verdict,
                     "stages": {k: round(v, 3) for k, v in report.stages.items()}})
        print(f"{name:40s} {rows[-1]['kb']:6.1f} KB  static {rows[-1]['static_s'] * 1000:7.1f} ms  "
              f"full {full:6.2f} s  {report.verdict}", flush=True)
    static = [r["static_s"] for r in rows]
    full = [r["full_s"] for r in rows]
    summary = {"envs": len(rows), "seeds": args.seeds,
               "static_ms": {"median": statistics.median(static) * 1000, "max": max(static) * 1000, "goal": 50},
               "full_s": {"median": statistics.median(full), "max": max(full), "goal": 10},
               "probe_seed": args.probe_seed,
               "load_average": {"before": load_before, "after": os.getloadavg()},
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}}
    print()
    print(f"{'':14s}{'median':>10s}{'max':>10s}{'goal':>10s}")
    print(f"{'static (ms)':14s}{summary['static_ms']['median']:10.1f}{summary['static_ms']['max']:10.1f}{50:10d}")
    print(f"{'full (s)':14s}{summary['full_s']['median']:10.2f}{summary['full_s']['max']:10.2f}{10:10d}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
