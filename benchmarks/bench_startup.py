"""How fast the command line starts: ``import envforge``, ``import envforge.cli`` and
``envforge --help``, each in a fresh interpreter, against a bare ``python -c pass``.

Goal: ``import envforge.cli`` under 0.4 s (the CLI builds its options from the stages' config
modules and loads a stage only when its command runs). Wall time moves with the machine's load;
CPU time (user + system of the child) moves much less, so both are shown. Runs are interleaved
round by round, so that load hits every row alike.

    .venv/bin/python benchmarks/bench_startup.py [--runs 15] [--root CHECKOUT] [--out benchmarks/results/startup.json]

``--root`` measures another checkout of envforge (another branch, say) with the same script.

Prints a Markdown table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 0.4
ROWS = {
    "python -c pass": ["-c", "pass"],
    "import envforge": ["-c", "import envforge"],
    "import envforge.cli": ["-c", "import envforge.cli"],
    "envforge --help": ["-m", "envforge", "--help"],
}


def once(args: list[str], root: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh interpreter running ARGS in checkout ROOT."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=root, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def modules_loaded(stmt: str, root: Path) -> int:
    code = f"import sys; {stmt}; print(len(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)}, check=True).stdout
    return int(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--root", default=str(REPO), help="the checkout to measure (default: this one)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "startup.json"))
    a = ap.parse_args()
    root = Path(a.root).resolve()
    for args in ROWS.values():  # warm the bytecode caches
        once(args, root)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in ROWS}
    load_before = os.getloadavg()[0]
    for _ in range(a.runs):
        for name, args in ROWS.items():
            samples[name].append(once(args, root))
    results = {}
    for name, runs in samples.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        results[name] = {"wall_median_s": statistics.median(walls), "wall_min_s": min(walls),
                         "cpu_median_s": statistics.median(cpus), "cpu_min_s": min(cpus)}
    results["import envforge.cli"]["modules"] = modules_loaded("import envforge.cli", root)
    print(f"{root}: {a.runs} runs each, interleaved; load average {load_before:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end\n")
    print("| | wall median | wall min | CPU median | CPU min |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['wall_median_s'] * 1000:.0f} ms | {r['wall_min_s'] * 1000:.0f} ms | "
              f"{r['cpu_median_s'] * 1000:.0f} ms | {r['cpu_min_s'] * 1000:.0f} ms |")
    cli = results["import envforge.cli"]
    print(f"\nimport envforge.cli: {cli['modules']} modules; goal {GOAL_S:.1f} s: "
          f"{'met' if cli['wall_median_s'] < GOAL_S else 'missed'} (wall median)")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"root": str(root), "runs": a.runs, "load_average": [load_before, os.getloadavg()[0]],
                               "goal_s": GOAL_S, "results": results}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
