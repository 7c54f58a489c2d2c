"""Evaluation: a policy (base, one adapter, routed, merged) over an env's seeds or a list of
tasks; mean score with a 95% confidence interval, overall and per sub-skill.

A task list is a JSON/JSONL file of ``{"env": slug-or-path, "seed": int}`` items. A routed policy
is routed once per episode, on the episode's first user message, and keeps that adapter to the end.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from envforge.errors import InputError
from trainers.rollout import EnvFactory, mean_ci, run_episodes


def read_tasks(path: str | Path) -> list[dict]:
    text = Path(path).read_text()
    try:
        items = json.loads(text)
    except ValueError:
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not isinstance(items, list) or not all(isinstance(t, dict) and "env" in t and
                                              isinstance(t.get("seed"), int) for t in items):
        raise InputError(f"{path}: want a list of {{\"env\": ..., \"seed\": int}} items")
    return items


def evaluate(policy, tasks: list[dict], *, max_new_tokens: int = 256, temperature: float = 0.0,
             pool_size: int = 4, backend: str = "auto", seed: int = 0,
             unsafe_skip_gate: bool = False, call_timeout_s: float = 10.0) -> dict:
    import torch
    from trainers.router import RoutedPolicy
    by_env: dict[str, list[int]] = defaultdict(list)
    for t in tasks:
        by_env[str(t["env"])].append(int(t["seed"]))
    episodes, routes = [], []
    for env, seeds in by_env.items():
        with EnvFactory(env, size=pool_size, backend=backend, unsafe_skip_gate=unsafe_skip_gate,
                        call_timeout_s=call_timeout_s) as factory:
            buckets: dict[str, list[int]] = {"": seeds}
            if isinstance(policy, RoutedPolicy):
                buckets = defaultdict(list)
                for s in seeds:
                    e = factory.make()
                    try:
                        obs, _ = e.reset(seed=s)
                    finally:
                        e.close()
                    task = next((m["content"] for m in obs["messages"] if m["role"] == "user"), "")
                    d = policy.router.route(task)
                    routes.append({"env": env, "seed": s, "choice": d["choice"],
                                   "probabilities": d["probabilities"]})
                    buckets[d["choice"]].append(s)
            for choice, bucket in buckets.items():
                if choice:
                    policy.use(choice)
                torch.manual_seed(seed)
                for ep in run_episodes(policy, factory, bucket, max_new_tokens=max_new_tokens,
                                       temperature=temperature):
                    episodes.append({"env": env, "choice": choice or None, **ep.summary()})
    result = {"policy": getattr(policy, "name", ""), "overall": mean_ci([e["score"] for e in episodes])}
    skills = defaultdict(list)
    for e in episodes:
        if e["skill"]:
            skills[e["skill"]].append(e["score"])
    result["per_skill"] = {k: mean_ci(v) for k, v in sorted(skills.items())}
    if len(by_env) > 1:
        envs = defaultdict(list)
        for e in episodes:
            envs[e["env"]].append(e["score"])
        result["per_env"] = {k: mean_ci(v) for k, v in envs.items()}
    if routes:
        result["routes"] = routes
    result["episodes"] = episodes
    return result
