"""Rollouts/s and tokens/s of generation and of a GRPO training step.

    python benchmarks/bench_train.py                 # CPU: a tiny local model (trainers.tiny)
    python benchmarks/bench_train.py --gpu           # also a ~1.5B Qwen2 config, random weights, on CUDA

The rollouts run against the example env (generated_envs/helpdesk_precondition_verification) in
process sandboxes. The GPU part needs a CUDA device; without one it is recorded as skipped (never
estimated). Writes benchmarks/results/train.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from trainers.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from trainers.policy import load_policy  # noqa: E402
from trainers.rollout import EnvFactory, run_episodes  # noqa: E402
from trainers.tiny import save_tiny  # noqa: E402

ENV = REPO / "generated_envs" / "helpdesk_precondition_verification"
SIZES = {"tiny": dict(hidden=64, layers=2, heads=4),
         "1.5b": dict(hidden=1536, layers=28, heads=12, intermediate=8960)}


def bench(size: str, device: str, rollouts: int, max_new_tokens: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        save_tiny(tmp, "hermes", **SIZES[size])
        policy = load_policy(tmp, device=device, dtype="bfloat16" if device.startswith("cuda") else None)
        params = sum(p.numel() for p in policy.model.parameters())
        with EnvFactory(ENV, size=min(rollouts, 16), backend="process") as factory:
            torch.manual_seed(0)
            stats: dict = {}
            t0 = time.perf_counter()
            episodes = run_episodes(policy, factory, list(range(rollouts)), max_new_tokens=max_new_tokens,
                                    max_turns=3, stats=stats)
            wall = time.perf_counter() - t0
        cfg = GRPOConfig(num_groups=max(1, rollouts // 4), group_size=4, iterations=1,
                         max_new_tokens=max_new_tokens, max_turns=3, device=device, backend="process",
                         threads=threads, dynamic_sampling=False, lora_rank=32, lora_alpha=64)
        trainer = GRPOTrainer(policy, ENV, cfg, out=Path(tmp) / "adapter", resume=False)
        # a training step on the rollouts just made, advantages forced nonzero (random model scores 0)
        for i, e in enumerate(episodes):
            e.score = (i % 4) / 3
        groups = [episodes[i:i + 4] for i in range(0, len(episodes) - len(episodes) % 4, 4)]
        trained_tokens = sum(len(e.tokens) for g in groups for e in g)
        t0 = time.perf_counter()
        trainer.update(groups)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        step = time.perf_counter() - t0
    gen = stats.get("generated_tokens", 0)
    return {"size": size, "device": device, "parameters": params, "threads": threads,
            "rollouts": rollouts, "max_new_tokens": max_new_tokens, "max_turns": 3,
            "rollouts_per_s": rollouts / wall, "generated_tokens": gen,
            "generation_tokens_per_s": gen / stats["generate_s"] if stats.get("generate_s") else 0.0,
            "env_wait_seconds": stats.get("env_wait_s", 0.0), "rollout_seconds": wall,
            "train_step_seconds": step, "train_tokens_per_s": trained_tokens / step,
            "train_rollouts_per_s": sum(len(g) for g in groups) / step}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu", action="store_true", help="Also the 1.5B config on CUDA (skipped without one).")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "train.json"))
    a = ap.parse_args()
    results = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                           "cpus": torch.get_num_threads()},
               "cpu": bench("tiny", "cpu", a.rollouts, a.max_new_tokens, a.threads)}
    if a.gpu:
        results["gpu"] = (bench("1.5b", "cuda", 16, 128, a.threads) if torch.cuda.is_available()
                          else {"skipped": "no CUDA device on this machine"})
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))
    for k, r in results.items():
        if k != "machine":
            print(k, json.dumps(r))


if __name__ == "__main__":
    main()
