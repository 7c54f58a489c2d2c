"""`envforge demo` over several seeds: the issue's goals table.

    python benchmarks/bench_demo.py                  # 3 seeds, full budgets
    python benchmarks/bench_demo.py --quick --seeds 0

Each seed runs the whole demo (its own folder under --out) in a fresh process, --jobs at a time
(default 1: one after the other, progress on stderr; more: each seed's progress in
<out>/seed<N>.log, and each run kept to its share of the cores, so that its jobs and its base
agent's threads fit in them instead of crowding the other runs' cores; the numbers are the same). Prints the per-seed table and the goals, and
writes benchmarks/results/demo.json. Seeds that an earlier run of the same settings measured on
the same commit (a clean tree) are kept there and counted in the table and the goals (a seed
run again replaces its row): `--seeds 0,1,2` then `--seeds 3,4` give one 5-seed table.
Timings are wall clock on this machine: on a shared CPU they are inflated (say so when quoting).
After the runs, the GRPO iteration goal is timed alone (``iteration_alone``; --no-probe skips it).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
METHODS = ("base", "routed", "merged", "grpo_target", "oracle")
KEPT = ("seed", "quick", "methods", "identified", "planted", "routing_accuracy",
        "rollouts_per_method", "stages", "wall_s", "training")
OPTIONAL = ("iteration_alone_s",)


def commit() -> str | None:
    """This checkout's commit, or None when the tree has changes (results not tied to a commit)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return None if dirty else head


def earlier(path: Path, settings: dict) -> dict[int, dict]:
    """The seeds an earlier run wrote to ``path`` with the same settings and commit."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if settings["commit"] is None or any(old.get(k) != v for k, v in settings.items()):
        return {}
    return {r["seed"]: r for r in old.get("seeds", []) if all(k in r for k in KEPT)}


#: iterations of the alone probe (the first, which starts the sandboxes, is not counted)
PROBE_ITERATIONS = 6


def iteration_alone(run_dir: Path, config: dict, accepted: list[str]) -> list[float]:
    """Seconds of each GRPO iteration (4 x 4) of the run's base agent on its first accepted env
    (``accepted``: the env folders' names), timed alone (one process, the run's threads), the
    first left out: the goal's measure. In the demo
    the train stage runs the adapters and the baseline at once (one process more than the cores
    on a CPU), so an iteration's wall time there is a shared core's."""
    import tempfile
    from dataclasses import fields

    sys.path.insert(0, str(REPO))
    from envforge.demo.config import DemoConfig
    from envforge.demo.run import grpo_config
    from trainers.parallel import Job, run_job
    cfg = DemoConfig(**{f.name: config[f.name] for f in fields(DemoConfig) if f.name in config})
    env = run_dir / "envs" / accepted[0]
    model = str(run_dir / "base_model")
    with tempfile.TemporaryDirectory() as tmp:
        r = run_job(Job("probe", model, str(env), tmp, grpo_config(cfg, PROBE_ITERATIONS), base_model=model))
    return r["seconds_per_iteration"][1:]


def goals(runs: list[dict]) -> list[tuple[str, str, bool]]:
    mean = {m: statistics.fmean(r["methods"][m]["mean"] for r in runs) for m in METHODS}
    full = [r for r in runs if not r["quick"]]
    out = [
        ("routed - base >= +0.30 on every seed",
         ", ".join(f"{r['methods']['routed']['mean'] - r['methods']['base']['mean']:+.3f}" for r in runs),
         all(r["methods"]["routed"]["mean"] - r["methods"]["base"]["mean"] >= 0.30 for r in runs)),
        ("routed >= merged and >= GRPO on the target (mean of seeds)",
         f"routed {mean['routed']:.3f}, merged {mean['merged']:.3f}, grpo_target {mean['grpo_target']:.3f}",
         mean["routed"] >= mean["merged"] and mean["routed"] >= mean["grpo_target"]),
        ("identify retains exactly the planted deficits, every seed",
         "; ".join(", ".join(r["identified"]) or "none" for r in runs),
         all(sorted(r["identified"]) == sorted(r["planted"]) for r in runs)),
        ("routing accuracy >= 0.9",
         ", ".join("-" if r["routing_accuracy"] is None else f"{r['routing_accuracy']:.3f}" for r in runs),
         all((r["routing_accuracy"] or 0) >= 0.9 for r in runs)),
        ("one seed, full < 15 min" if full else "one seed, --quick < 5 min",
         ", ".join(f"{r['wall_s'] / 60:.1f} min" for r in runs),
         all(r["wall_s"] < (900 if not r["quick"] else 300) for r in runs)),
    ]
    alone = [s for r in runs for s in r.get("iteration_alone_s", [])]
    shared = [s for r in runs for t in r["training"].values() for s in t["seconds_per_iteration"]]
    if alone:
        med = statistics.median(alone)
        out.append(("one GRPO iteration (4 x 4) <= 10 s", f"median {med:.1f} s over {len(alone)}, alone "
                    f"(in the demo's train stage, jobs sharing the cores: {statistics.median(shared):.1f} s)",
                    med <= 10))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1, help="seeds run at a time")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "demo"))
    ap.add_argument("--no-probe", action="store_true", help="skip timing one GRPO iteration alone "
                    f"({PROBE_ITERATIONS} of them on the first seed's agent, after the runs)")
    a = ap.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    seeds = [int(s) for s in a.seeds.split(",")]
    running: dict = {}  # seed -> (process, out, start, slot)
    # a stopped benchmark stops its runs (SIGTERM, as SIGINT does: the runs are in its process group
    # but a SIGTERM reaches only this process)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run_seeds(a, seeds, running, env)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut this short
        for proc, *_ in running.values():
            proc.terminate()
        for proc, *_ in running.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_seeds(a, seeds: list[int], running: dict, env: dict) -> int:
    """Run the demo on ``seeds``, ``a.jobs`` at a time (kept in ``running`` while they run), then
    print and write the table; 0, or 1 when a run failed."""
    runs = {}
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    jobs = max(1, a.jobs)
    share = max(1, len(cpus) // jobs)
    while seeds or running:
        while seeds and len(running) < jobs:
            seed = seeds.pop(0)
            slot = min(set(range(jobs)) - {r[3] for r in running.values()})
            pin = None  # a share of the cores per run (a demo runs as many jobs as it sees cores)
            if jobs > 1 and cpus:
                mine = set(cpus[slot * share:(slot + 1) * share] or cpus)
                pin = lambda mine=mine: os.sched_setaffinity(0, mine)  # noqa: E731
            out = Path(a.out) / f"seed{seed}"
            cmd = [sys.executable, "-m", "envforge", "demo", "--seed", str(seed), "--threads", str(a.threads),
                   "--out", str(out), "--fresh"] + (["--quick"] if a.quick else [])  # timed: no resuming
            out.mkdir(parents=True, exist_ok=True)
            log = None if a.jobs <= 1 else open(out.parent / f"seed{seed}.log", "w")
            running[seed] = (subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log,
                                              preexec_fn=pin), out, time.perf_counter(), slot)
            if log:
                log.close()
                print(f"seed {seed}: started, progress in {log.name}", file=sys.stderr)
        time.sleep(1)
        for seed, (proc, out, t0, _) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[seed]
            if proc.returncode != 0:
                print(f"seed {seed}: envforge demo exited {proc.returncode}", file=sys.stderr)
                for other, *_ in running.values():
                    other.terminate()
                return 1
            r = json.loads((out / "results.json").read_text())
            r["process_wall_s"] = round(time.perf_counter() - t0, 1)
            runs[seed] = r
            print(f"seed {seed}: done in {r['process_wall_s'] / 60:.1f} min", file=sys.stderr)
    if runs and not a.no_probe:
        first = min(runs)
        accepted = [s["env"] for s in runs[first].get("synth", []) if s["verdict"] == "accept"]
        if accepted:
            print(f"timing {PROBE_ITERATIONS} GRPO iterations of seed {first}'s agent alone", file=sys.stderr)
            try:  # the runs' results are written whatever happens here
                runs[first]["iteration_alone_s"] = iteration_alone(Path(a.out) / f"seed{first}",
                                                                   runs[first]["config"], accepted)
            except Exception as e:  # noqa: BLE001
                print(f"the iteration probe failed: {type(e).__name__}: {e}", file=sys.stderr)
    path = REPO / "benchmarks" / "results" / "demo.json"
    settings = {"quick": a.quick, "threads": a.threads, "commit": commit()}
    kept = {s: r for s, r in earlier(path, settings).items() if s not in runs}
    if kept:
        print(f"kept seeds {', '.join(map(str, sorted(kept)))} from {path} (same settings, same "
              f"commit)", file=sys.stderr)
    runs = [{**kept, **runs}[s] for s in sorted({**kept, **runs})]
    header = ["seed"] + list(METHODS) + ["routing acc.", "identified", "wall min"]
    rows = [[str(r["seed"])] + [f"{r['methods'][m]['mean']:.3f}" for m in METHODS]
            + [f"{r['routing_accuracy']:.3f}" if r["routing_accuracy"] is not None else "-",
               ", ".join(r["identified"]), f"{r['wall_s'] / 60:.1f}"] for r in runs]
    rows.append(["mean"] + [f"{statistics.fmean(r['methods'][m]['mean'] for r in runs):.3f}" for m in METHODS]
                + ["", "", ""])
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\n| goal | measured | met |\n|---|---|---|")
    checked = goals(runs)
    for g, measured, ok in checked:
        print(f"| {g} | {measured} | {'yes' if ok else 'no'} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_avg_at_end": os.getloadavg()},
        **settings, "jobs": a.jobs,
        "seeds": [{k: r[k] for k in KEPT + OPTIONAL if k in r} for r in runs],
        "goals": [{"goal": g, "measured": m, "met": ok} for g, m, ok in checked]}, indent=2))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
