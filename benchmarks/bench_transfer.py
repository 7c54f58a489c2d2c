"""What a demo run's methods learnt beyond its target: each on each synthesized env.

    python benchmarks/bench_transfer.py demo_out [demo_out_seed1 ...] [--seeds 64] [--threads 1]

The target measures one side of each skill (docs/demo.md, "Not reached"); the synthesized envs
hold the others (a hurried close of a closable ticket, a user who declines or asks for another
resolution). For each `envforge demo` output folder given, plays the base agent, each adapter,
the merged adapters and GRPO on the target on every env in its `envs/`, on fresh seeds (from
1,000,000: none a training run drew), with the demo's sampling settings, through
`trainers.evaluate` (in sandboxes, as every evaluation). Prints a table per run (mean reward
with its 95% CI, and per sub-skill where the env reports them) and writes
benchmarks/results/transfer.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIRST_SEED = 1_000_000


def methods(run: Path) -> dict:
    """{name: (adapter path or None, merged?)} of the policies a demo run made."""
    out = {"base": (None, False)}
    for a in sorted(p.parent for p in (run / "adapters").glob("*/adapter_config.json")):
        out[a.name] = (a, False)
    if len(out) > 1:
        out["merged"] = (run / "adapters", True)
    if (run / "grpo_target" / "adapter_config.json").is_file():
        out["grpo_target"] = (run / "grpo_target", False)
    return out


def measure(run: Path, seeds: int) -> dict:
    from trainers.evaluate import evaluate
    from trainers.eval_config import EvalConfig
    from trainers.policy import load_policy
    from trainers.router import merged_policy
    cfg = json.loads((run / "results.json").read_text(encoding="utf-8"))["config"]
    config = EvalConfig(max_new_tokens=cfg["max_new_tokens"], temperature=cfg["temperature"],
                        top_p=cfg["top_p"], pool_size=cfg["pool_size"], backend=cfg["backend"], seed=0)
    envs = sorted(p.parent for p in (run / "envs").glob("*/env.py"))
    result: dict = {}
    for name, (path, merged) in methods(run).items():
        if merged:
            policy = merged_policy(run / "base_model", path)
        else:
            policy = load_policy(run / "base_model", adapter=path)
        for env in envs:
            tasks = [{"env": str(env), "seed": FIRST_SEED + i} for i in range(seeds)]
            e = evaluate(policy, tasks, config)
            result.setdefault(env.name, {})[name] = {"overall": e.overall, "per_skill": e.per_skill}
            print(f"  {run.name} {env.name} {name}: {e.overall['mean']:.3f}", file=sys.stderr, flush=True)
    return result


def table(run: str, result: dict) -> str:
    rows = [f"\n{run}"]
    for env, by in result.items():
        skills = sorted({s for m in by.values() for s in m["per_skill"]})
        head = ["method", "mean [95% CI]"] + skills
        rows += [f"\n{env}", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name, m in by.items():
            o = m["overall"]
            cells = [name, f"{o['mean']:.3f} [{o['ci_low']:.2f}, {o['ci_high']:.2f}]"]
            cells += [f"{m['per_skill'][s]['mean']:.2f}" if s in m["per_skill"] else "" for s in skills]
            rows.append("| " + " | ".join(cells) + " |")
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
        if not (run / "results.json").is_file() or not (run / "base_model").is_dir():
            ap.error(f"{run} is not a finished `envforge demo` output folder (no results.json or base_model/)")
    import torch
    torch.set_num_threads(a.threads)
    results: dict = {}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for run in map(Path, a.runs):
        results[str(run)] = measure(run, a.seeds)
        out.write_text(json.dumps({"seeds": a.seeds, "first_seed": FIRST_SEED, "runs": results}, indent=1))
        print(table(str(run), results[str(run)]), flush=True)  # each run's, as it ends
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
