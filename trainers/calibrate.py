"""Calibration: does GRPO get a signal from this env with this base policy?

Base-policy rollouts (``groups`` seeds x ``group_size`` rollouts, 16 by default) against the
paper's targets (TRACE, section 2): mean reward and success rate in [0.2, 0.6], reward std >= 0.05,
at most 20% of groups constant (all rewards equal: no gradient). The report says what to change.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from envforge.contract import new_seed_key, training_seeds
from envforge.progress import Progress
from trainers.calibrate_config import CalibrationConfig
from trainers.rollout import SUCCESS, EnvFactory, is_constant, run_episodes

BAND = (0.2, 0.6)
MIN_STD = 0.05
MAX_CONSTANT = 0.2


@dataclass
class Calibration:
    """What calibration found: the metrics, each target's check, and the advice for a miss."""
    ok: bool
    metrics: dict
    checks: list[dict]
    advice: list[str]
    env: str | None = None
    env_hash: str | None = None

    def to_dict(self) -> dict:
        return {"env": self.env, "env_hash": self.env_hash, "ok": self.ok, "metrics": self.metrics,
                "checks": self.checks, "advice": self.advice}


def calibrate(policy, env: str | Path, config: CalibrationConfig | None = None,
              unsafe_skip_gate: bool = False, progress: Progress | None = None,
              executor=None) -> Calibration:
    """The base policy's rollouts on ``env`` against the targets. ``progress`` gets a counted
    ``Step`` (``envforge.progress``) as each wave of episodes ends; ``executor``
    (``envforge.executor``) says where the sandboxes run (here by default, or as Ray actors):
    the answer is the same."""
    import torch
    c = config or CalibrationConfig()
    torch.manual_seed(c.seed)
    key = new_seed_key() if c.env_seed_key is None else c.env_seed_key
    seeds = [s for s in training_seeds(key, 0, c.groups) for _ in range(c.group_size)]
    with EnvFactory(env, size=c.pool_size, backend=c.backend, unsafe_skip_gate=unsafe_skip_gate,
                    call_timeout_s=c.call_timeout_s, executor=executor) as factory:
        episodes = run_episodes(policy, factory, seeds, max_new_tokens=c.max_new_tokens,
                                temperature=c.temperature, top_p=c.top_p, progress=progress)
        env_hash = factory.env_hash
    out = report(episodes, c.group_size, env=str(env), env_hash=env_hash)
    out.metrics["env_seed_key"] = key
    return out


def report(episodes, group_size: int, env: str | None = None,
           env_hash: str | None = None) -> Calibration:
    scores = [e.score for e in episodes]
    groups = [scores[i:i + group_size] for i in range(0, len(scores), group_size)]
    constant = sum(is_constant(g) for g in groups)
    metrics = {
        "episodes": len(scores), "groups": len(groups),
        "mean_reward": statistics.fmean(scores) if scores else 0.0,
        "success_rate": sum(s >= SUCCESS for s in scores) / len(scores) if scores else 0.0,
        "reward_std": statistics.pstdev(scores) if scores else 0.0,
        "within_group_std": statistics.fmean(statistics.pstdev(g) for g in groups) if groups else 0.0,
        "constant_group_fraction": constant / len(groups) if groups else 1.0,
        "errors": sum(e.error is not None for e in episodes),
    }
    checks = []
    lo, hi = BAND
    for key, label in (("mean_reward", "mean reward"), ("success_rate", "success rate")):
        v = metrics[key]
        ok = lo <= v <= hi
        advice = "" if ok else (
            f"{label} {v:.2f} < {lo}: the env is too hard for this model; make it easier (fewer "
            "steps, clearer instructions in the system prompt, more partial credit) or start from a "
            "stronger model" if v < lo else
            f"{label} {v:.2f} > {hi}: the env is too easy; make it harder (more distractors, "
            "more preconditions to check) or there is little to learn")
        checks.append({"check": key, "ok": ok, "value": v, "target": [lo, hi], "advice": advice})
    v = metrics["reward_std"]
    checks.append({"check": "reward_std", "ok": v >= MIN_STD, "value": v, "target": f">= {MIN_STD}",
                   "advice": "" if v >= MIN_STD else f"reward std {v:.3f} < {MIN_STD}: rollouts score "
                   "alike; add partial-credit levels to the reward, or raise --temperature"})
    v = metrics["constant_group_fraction"]
    checks.append({"check": "constant_groups", "ok": v <= MAX_CONSTANT, "value": v,
                   "target": f"<= {MAX_CONSTANT}", "advice": "" if v <= MAX_CONSTANT else
                   f"{v:.0%} of groups have equal rewards (no GRPO gradient); add partial credit, "
                   "raise the temperature or the group size, or adjust the difficulty"})
    return Calibration(all(c["ok"] for c in checks), metrics, checks,
                       [c["advice"] for c in checks if not c["ok"]], env, env_hash)
