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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envforge.errors import EnvforgeError, InputError, UsageError
from envforge.progress import Progress, Step
from envforge.trajectories import first_user_text
from trainers.eval_config import EvalConfig
from trainers.rollout import EnvFactory, mean_ci, run_episodes


def read_items(path: str | Path) -> list:
    """The items of a task file: a JSON list, or one item a line (JSONL, or plain text where a
    line is not JSON)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the task file {path}: {e}") from None
    try:
        items = json.loads(text)
        return items if isinstance(items, list) else [items]
    except ValueError:
        pass
    out: list = []
    for line in text.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append(line.strip())
    return out


def read_tasks(path: str | Path) -> list[dict]:
    """Evaluation tasks: ``{"env": slug-or-path, "seed": int}`` items."""
    items = read_items(path)
    if not items or not all(isinstance(t, dict) and "env" in t and isinstance(t.get("seed"), int)
                            and not isinstance(t.get("seed"), bool) for t in items):
        raise InputError(f"{path}: want a JSON list or JSONL of {{\"env\": ..., \"seed\": int}} items")
    return items


def read_task_texts(path: str | Path) -> list[str]:
    """Task texts to route: one a line, or JSON/JSONL items with a ``"task"`` field."""
    texts = []
    for item in read_items(path):
        if isinstance(item, dict) and isinstance(item.get("task"), str):
            texts.append(item["task"])
        elif isinstance(item, str):
            texts.append(item)
        else:
            raise InputError(f"{path}: want task texts, one a line, or JSON items with a \"task\" "
                             f"string; got {json.dumps(item)[:80]}")
    return texts


#: the most env seeds one --seeds names
MAX_SEEDS = 100_000


def parse_seeds(text: str) -> list[int]:
    """Env seeds from 'A-B' (inclusive, A <= B) or 'a,b,c'."""
    ids: list[int] = []
    try:
        if "-" in text and "," not in text:
            a, b = (int(s) for s in text.split("-"))
            if b - a + 1 > MAX_SEEDS:
                raise UsageError(f"--seeds {text!r}: {b - a + 1:,} seeds; at most {MAX_SEEDS:,} "
                                 "(each is an episode: 200 give a CI of about +-0.07)")
            ids = list(range(a, b + 1))
        else:
            ids = [int(s) for s in text.split(",")]
    except ValueError:
        pass
    if not ids:
        raise UsageError(f"--seeds {text!r}: want a range 'A-B' with A <= B (e.g. 0-19) or a "
                         "list 'a,b,c' of integers (e.g. 0,5,9)")
    return ids


@dataclass
class Evaluation:
    """The scores of a policy: overall, per sub-skill and per env (each a mean with its 95%
    confidence interval), the routes a routed policy took, and every episode."""
    policy: str
    overall: dict
    per_skill: dict
    per_env: dict = field(default_factory=dict)
    routes: list = field(default_factory=list)
    episodes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        d = {"policy": self.policy, "overall": self.overall, "per_skill": self.per_skill}
        if self.per_env:
            d["per_env"] = self.per_env
        if self.routes:
            d["routes"] = self.routes
        d["episodes"] = self.episodes
        return d


def evaluate(policy, tasks: list[dict], config: EvalConfig | None = None, *,
             unsafe_skip_gate: bool = False, progress: Progress | None = None,
             executor: Any = None, **settings: Any) -> Evaluation:
    """The policy's scores on ``tasks``; settings as ``config`` or as keyword arguments.
    ``progress`` gets a counted ``Step`` (``envforge.progress``) of the tasks played so far as
    each wave of episodes ends; ``executor`` (``envforge.executor``): where the sandboxes run
    (the scores are the same)."""
    import torch
    from trainers.router import RoutedPolicy
    c = config or EvalConfig(**settings)
    by_env: dict[str, list[int]] = defaultdict(list)
    for t in tasks:
        by_env[str(t["env"])].append(int(t["seed"]))
    episodes, routes = [], []
    for env, seeds in by_env.items():
        with EnvFactory(env, size=c.pool_size, backend=c.backend, unsafe_skip_gate=unsafe_skip_gate,
                        call_timeout_s=c.call_timeout_s, executor=executor) as factory:
            buckets = route_seeds(policy, factory, env, seeds, routes) if isinstance(
                policy, RoutedPolicy) else {"": seeds}
            for choice, bucket in buckets.items():
                if choice:
                    policy.use(choice)
                torch.manual_seed(c.seed)

                def counted(step: Step, played: int = len(episodes)) -> None:  # across buckets
                    progress(Step(step.text, None, played + step.done, len(tasks)))
                for ep in run_episodes(policy, factory, bucket, max_new_tokens=c.max_new_tokens,
                                       temperature=c.temperature, top_p=c.top_p,
                                       progress=counted if progress else None):
                    episodes.append({"env": env, "choice": choice or None, **ep.summary()})
    skills = defaultdict(list)
    envs = defaultdict(list)
    for e in episodes:
        if e["skill"]:
            skills[e["skill"]].append(e["score"])
        envs[e["env"]].append(e["score"])
    return Evaluation(getattr(policy, "name", ""), mean_ci([e["score"] for e in episodes]),
                      {k: mean_ci(v) for k, v in sorted(skills.items())},
                      {k: mean_ci(v) for k, v in envs.items()} if len(by_env) > 1 else {},
                      routes, episodes)


def route_seeds(policy, factory: EnvFactory, env: str, seeds: list[int], routes: list) -> dict:
    """``{choice: seeds}``: each seed routed on its first user message, read from a reset of one
    env made for all the seeds; a seed whose reset fails goes to "none" with the error in its route."""
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
            routes.append({"env": env, "seed": s, "choice": d.choice, "probabilities": d.probabilities})
            buckets[d.choice].append(s)
    finally:
        if e is not None:
            e.close()
    return buckets
