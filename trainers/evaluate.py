"""Evaluation: a policy (base, one adapter, routed, merged) over an env's seeds or a list of
tasks; mean score with a 95% confidence interval, overall and per sub-skill.

A task list is a JSON/JSONL file of ``{"env": slug-or-path, "seed": int}`` items. A routed policy
is routed once per episode, on the episode's first user message (in the form of identify's
example tasks), and keeps that adapter to the end; a seed whose env fails to reset goes to "none"
with the error in its route entry.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from envforge.errors import EnvforgeError, InputError
from trainers.rollout import EnvFactory, mean_ci, run_episodes


def read_tasks(path: str | Path) -> list[dict]:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the task list {path}: {e}") from None
    try:
        items = json.loads(text)
    except ValueError:
        try:
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            raise InputError(f"{path}: neither JSON nor JSONL ({e})") from None
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
            buckets = route_seeds(policy, factory, env, seeds, routes) if isinstance(
                policy, RoutedPolicy) else {"": seeds}
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


def route_seeds(policy, factory: EnvFactory, env: str, seeds: list[int], routes: list) -> dict:
    """``{choice: seeds}``: each seed routed on its first user message, read from a reset of one
    env made for all the seeds; a seed whose reset fails goes to "none" with the error in its route."""
    from envforge.trajectories import first_user_text
    from trainers.router import NONE
    buckets: dict[str, list[int]] = defaultdict(list)
    e = None
    try:
        for s in seeds:
            try:
                if e is None:
                    e = factory.make()
                obs, _ = e.reset(seed=s)
            except EnvforgeError as err:
                routes.append({"env": env, "seed": s, "choice": NONE, "probabilities": None,
                               "error": f"reset: {err}"})
                buckets[NONE].append(s)
                continue
            d = policy.router.route(first_user_text(obs["messages"]))
            routes.append({"env": env, "seed": s, "choice": d["choice"], "probabilities": d["probabilities"]})
            buckets[d["choice"]].append(s)
    finally:
        if e is not None:
            e.close()
    return buckets
