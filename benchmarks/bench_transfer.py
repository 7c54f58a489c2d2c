"""What a demo run's methods learnt beyond its target: each on each synthesized env.

    python benchmarks/bench_transfer.py demo_out [demo_out_seed1 ...] [--seeds 64] [--threads 1]

The target measures one side of each skill (docs/demo-log.md, "Not reached"); the synthesized envs
hold the others (a hurried close of a closable ticket, a user who declines or asks for another
resolution). For each `envforge demo` output folder given, plays the base agent, each adapter,
the merged adapters (with two or more) and GRPO on the target on every env the run's gate
accepted, on fresh seeds (from 1,000,000: training draws a few hundred from 0), with the run's
sampling settings and device, through `trainers.evaluate` (in sandboxes, as every evaluation).
Every method plays the same seeds, so each env's own adapter is also compared with GRPO on the
target seed by seed (the mean paired difference with its 95% CI). Prints a table per run and
writes benchmarks/results/transfer.json after each run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIRST_SEED = 1_000_000
SETTINGS = ("max_new_tokens", "temperature", "top_p", "pool_size", "backend", "seed", "device")


def methods(run: Path) -> dict:
    """{name: (adapter path or None, merged?)} of the policies a demo run made."""
    out = {"base": (None, False)}
    adapters = sorted(p.parent for p in (run / "adapters").glob("*/adapter_config.json"))
    out |= {a.name: (a, False) for a in adapters}
    if len(adapters) > 1:
        out["merged"] = (run / "adapters", True)
    if (run / "grpo_target" / "adapter_config.json").is_file():
        out["grpo_target"] = (run / "grpo_target", False)
    return out


def accepted_envs(run: Path, results: dict) -> list[Path]:
    """The envs the run's gate accepted (a rejected one is written to envs/ too, for reading)."""
    return [run / "envs" / s["env"] for s in results.get("synth", [])
            if s.get("verdict") == "accept" and (run / "envs" / s["env"] / "env.py").is_file()]


def check_run(run: Path) -> str | None:
    """Why ``run`` cannot be measured, or None."""
    try:
        results = json.loads((run / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"{run} is not a finished `envforge demo` output folder (no readable results.json)"
    missing = [k for k in SETTINGS if k not in results.get("config", {})]
    if missing:
        return f"{run}/results.json lacks the settings {missing} (an older demo's: run it again)"
    if not (run / "base_model").is_dir():
        return f"{run} has no base_model/"
    if not accepted_envs(run, results):
        return f"{run} has no env its gate accepted (results.json's synth)"
    return None


def paired(a: list[dict], b: list[dict]) -> dict:
    """Mean of a's score minus b's on the same seeds, with its 95% CI."""
    from trainers.rollout import mean_ci
    sb = {e["seed"]: e["score"] for e in b}
    return mean_ci([e["score"] - sb[e["seed"]] for e in a if e["seed"] in sb], clip=False)


def measure(run: Path, seeds: int) -> dict:
    from trainers.evaluate import evaluate
    from trainers.eval_config import EvalConfig
    from trainers.policy import load_policy
    from trainers.router import merged_policy
    results = json.loads((run / "results.json").read_text(encoding="utf-8"))
    cfg = results["config"]
    config = EvalConfig(**{k: cfg[k] for k in SETTINGS if k != "device"})
    envs = accepted_envs(run, results)
    scores: dict = {}
    episodes: dict = {}
    for name, (path, merged) in methods(run).items():
        policy = merged_policy(run / "base_model", path, device=cfg["device"]) if merged else \
            load_policy(run / "base_model", adapter=path, device=cfg["device"])
        for env in envs:
            e = evaluate(policy, [{"env": str(env), "seed": FIRST_SEED + i} for i in range(seeds)], config)
            scores.setdefault(env.name, {})[name] = {"overall": e.overall, "per_skill": e.per_skill}
            episodes[(env.name, name)] = e.episodes
            print(f"  {run.name} {env.name} {name}: {e.overall['mean']:.3f}", file=sys.stderr, flush=True)
    gaps = {env.name: paired(episodes[(env.name, env.name)], episodes[(env.name, "grpo_target")])
            for env in envs if (env.name, env.name) in episodes and (env.name, "grpo_target") in episodes}
    return {"scores": scores, "own_adapter_minus_grpo_target": gaps}


def table(run: str, result: dict) -> str:
    rows = [f"\n{run}"]
    for env, by in result["scores"].items():
        skills = sorted({s for m in by.values() for s in m["per_skill"]})
        head = ["method", "mean [95% CI]"] + skills
        rows += [f"\n{env}", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, m in by.items():
            o = m["overall"]
            cells = [name, f"{o['mean']:.3f} [{o['ci_low']:.2f}, {o['ci_high']:.2f}]"]
            cells += [f"{m['per_skill'][s]['mean']:.2f}" if s in m["per_skill"] else "" for s in skills]
            rows.append("| " + " | ".join(cells) + " |")
        gap = result["own_adapter_minus_grpo_target"].get(env)
        if gap:
            rows.append(f"its adapter - GRPO on the target, seed by seed: {gap['mean']:+.3f} "
                        f"[{gap['ci_low']:+.2f}, {gap['ci_high']:+.2f}] (n {gap['n']})")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="`envforge demo` output folders")
    ap.add_argument("--seeds", type=int, default=64, help="episodes per method and env")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "transfer.json"))
    a = ap.parse_args(argv)
    if a.seeds < 1:
        ap.error("--seeds must be at least 1")
    for run in map(Path, a.runs):
        why = check_run(run)
        if why:
            ap.error(why)
    from bench_demo import commit  # beside this script: the commit, None for a changed tree
    from trainers.policy import set_threads
    set_threads(a.threads)
    stamp = {"seeds": a.seeds, "first_seed": FIRST_SEED, "commit": commit(),
             "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for run in map(Path, a.runs):
        results[str(run)] = measure(run, a.seeds)
        out.write_text(json.dumps({**stamp, "runs": results}, indent=1))
        print(table(str(run), results[str(run)]), flush=True)  # each run's, as it ends
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
