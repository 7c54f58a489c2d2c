"""Multi-turn rollouts of a policy against a sandboxed env, token by token.

``run_episodes(policy, factory, seeds, ...)`` plays one episode per seed. A wave's episodes form two
lanes that take turns: one batched generation for a lane's live episodes, then its env steps go
out together from a worker thread (``envforge.gym.step_all``: the sandboxes of the pool do the
env work in their own processes, in parallel) while the policy generates for the other lane, so
env work overlaps generation.
Episodes run in waves of at most ``factory.size`` (each live episode holds one sandbox).

An ``Episode`` keeps the exact token sequence the policy saw and sampled: ``tokens`` with
``mask`` 1 on the policy's own sampled tokens and 0 on everything else (system and user turns,
tool results, template glue, an end-of-turn token forced after a cut generation). A failure at
the env or sandbox boundary ends that episode with the reward earned so far and ``error`` set: a
bad rollout is data, not a crash.
"""
from __future__ import annotations

import hashlib
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envforge.errors import EnvforgeError
from envforge.progress import Progress, Step

SUCCESS = 1.0 - 1e-6  # an episode whose score reaches this is a success


@dataclass
class Episode:
    seed: int
    messages: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    mask: list = field(default_factory=list)
    score: float = 0.0
    turns: int = 0
    skill: str | None = None
    error: str | None = None
    done: bool = False
    tools: list = field(default_factory=list)
    env: Any = None

    @property
    def generated(self) -> int:
        return int(sum(self.mask))

    @property
    def valid(self) -> bool:
        """Has at least one sampled token (an episode that failed at reset has none)."""
        return self.generated > 0

    def summary(self) -> dict:
        return {"seed": self.seed, "score": self.score, "turns": self.turns, "skill": self.skill,
                "error": self.error, "generated_tokens": self.generated}


class EnvFactory:
    """Sandboxed instances of one env, leased from a warm pool: a ``SandboxPool`` here, or a
    ``RayPool`` of sandbox actors over a cluster when ``executor`` is Ray (``envforge.executor``);
    generation stays in this process either way."""

    def __init__(self, env: str | Path, size: int = 4, backend: str = "auto",
                 unsafe_skip_gate: bool = False, executor: Any = None, **limits: Any):
        from envforge.executor import LocalExecutor
        from envforge.gym import checked_source, limits_from, resolve
        self.path = resolve(env)
        self.size = size
        executor = executor or LocalExecutor()
        self.pool = executor.pool(checked_source(self.path, unsafe_skip_gate), size=size,
                                  backend=backend, limits=limits_from(limits))
        # one read and one gate check (in make_pool): the text hashed is the text checked and run
        self.source = self.pool.source
        self.env_hash = hashlib.sha256(self.source.encode("utf-8")).hexdigest()
        self.meta: dict = {}

    def make(self):
        from envforge.gym import SandboxEnv
        env = SandboxEnv(self.source, pool=self.pool)
        self.meta = {"capability": env.capability, "skills": env.skills, "max_turns": env.max_turns}
        return env

    def describe(self) -> dict:
        """capability, skills, max_turns (starts one env briefly when none was made yet)."""
        if not self.meta:
            self.make().close()
        return self.meta

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "EnvFactory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _reset(ep: Episode, factory: EnvFactory) -> None:
    try:
        ep.env = factory.make()
        obs, info = ep.env.reset(seed=ep.seed)
        ep.messages = list(obs["messages"])
        ep.tools = ep.env.tools
        ep.skill = info.get("skill") if isinstance(info, dict) else None
    except EnvforgeError as e:
        ep.error, ep.done = f"reset: {e}", True


def _step_lane(live: list[Episode], actions: list[dict]) -> list[tuple | None]:
    """The lane's env steps, sent together (``envforge.gym.step_all``: the sandboxes work in
    parallel, one actor call per actor on Ray); an episode whose step failed ends with the error."""
    from envforge.gym import step_all
    results = step_all([ep.env for ep in live], actions)
    for i, (ep, res) in enumerate(zip(live, results)):
        if isinstance(res, EnvforgeError):
            ep.error, ep.done = f"step {ep.turns + 1}: {res}", True
            results[i] = None
    return results


def run_episodes(policy, factory: EnvFactory, seeds: list[int], *, max_new_tokens: int = 256,
                 temperature: float = 1.0, top_p: float = 1.0, max_turns: int | None = None,
                 max_context_tokens: int = 4096, executor: ThreadPoolExecutor | None = None,
                 stats: dict | None = None, progress: Progress | None = None) -> list[Episode]:
    """One episode per seed (repeat a seed for a group); see the module docstring. ``progress``
    gets ``Step("episodes", done=..., total=len(seeds))`` as each wave of episodes ends."""
    own = executor is None
    executor = executor or ThreadPoolExecutor(max_workers=max(1, factory.size))
    episodes: list[Episode] = []
    try:
        for start in range(0, len(seeds), factory.size):
            wave = [Episode(s) for s in seeds[start:start + factory.size]]
            _play_wave(policy, factory, wave, executor, max_new_tokens, temperature, top_p,
                       max_turns, max_context_tokens, stats if stats is not None else {})
            episodes += wave
            if progress is not None:
                progress(Step("episodes", None, len(episodes), len(seeds)))
    finally:
        if own:
            executor.shutdown(wait=True)
    return episodes


def _play_wave(policy, factory, wave, executor, max_new_tokens, temperature, top_p, max_turns,
               max_context_tokens, stats) -> None:
    """Two lanes (alternate episodes) take turns: while one lane's env steps run on the pool,
    the policy generates for the other lane, so env work overlaps generation."""
    try:
        list(executor.map(lambda ep: _reset(ep, factory), wave))
        for ep in wave:
            if not ep.done:
                ep.tokens = policy.encode(policy.render(ep.messages, ep.tools, add_generation_prompt=True))
                ep.mask = [0] * len(ep.tokens)
        lanes = [wave[0::2], wave[1::2]]
        pending: list[tuple | None] = [None, None]   # per lane: (episodes, actions, future)
        while True:
            progressed = False
            for lane in (0, 1):
                if pending[lane] is not None:
                    t0 = time.perf_counter()
                    live, actions, fut = pending[lane]
                    results = fut.result()
                    stats["env_wait_s"] = stats.get("env_wait_s", 0.0) + time.perf_counter() - t0
                    pending[lane] = None
                    for ep, action, res in zip(live, actions, results):
                        _apply(policy, ep, action, res, max_turns, max_new_tokens, max_context_tokens)
                live = [ep for ep in lanes[lane] if not ep.done]
                if not live:
                    continue
                progressed = True
                actions = _generate(policy, live, max_new_tokens, temperature, top_p, stats)
                pending[lane] = (live, actions, executor.submit(_step_lane, live, actions))
            if not progressed and pending == [None, None]:
                return
    finally:
        for ep in wave:
            if ep.env is not None:
                ep.env.close()
                ep.env = None


def _generate(policy, live: list[Episode], max_new_tokens, temperature, top_p, stats) -> list[dict]:
    """One batched generation for ``live``; appends the sampled tokens; returns the actions."""
    t0 = time.perf_counter()
    gens = policy.generate([ep.tokens for ep in live], max_new_tokens=max_new_tokens,
                           temperature=temperature, top_p=top_p)
    stats["generate_s"] = stats.get("generate_s", 0.0) + time.perf_counter() - t0
    stats["generated_tokens"] = stats.get("generated_tokens", 0) + sum(len(g.tokens) for g in gens)
    actions = []
    for ep, gen in zip(live, gens):
        ep.tokens += gen.tokens
        ep.mask += [1] * len(gen.tokens)
        if not gen.finished:
            ep.tokens.append(policy.eot_id)
            ep.mask.append(0)
        actions.append(policy.parse(gen.text))
    return actions


def _apply(policy, ep: Episode, action: dict, res: tuple | None, max_turns, max_new_tokens,
           max_context_tokens) -> None:
    """Take one env step's result into the episode: score, messages, the masked continuation."""
    if res is None:
        return
    obs, reward, terminated, truncated, _info = res
    ep.turns += 1
    ep.score = min(1.0, max(0.0, ep.score + float(reward)))
    new = list(obs.get("messages") or [])
    if terminated or truncated or (max_turns is not None and ep.turns >= max_turns):
        ep.messages += [action] + new
        ep.done = True
        return
    glue = policy.continuation(ep.messages, action, new, ep.tools)
    ep.messages += [action] + new
    ids = policy.encode(glue)
    ep.tokens += ids
    ep.mask += [0] * len(ids)
    if len(ep.tokens) + max_new_tokens > max_context_tokens:
        ep.done = True  # out of context: truncated


# --------------------------------------------------------------------------- statistics

def is_constant(rewards: list[float], tol: float = 1e-6) -> bool:
    """All rewards (of one group) equal within ``tol``: no GRPO gradient."""
    return max(rewards) - min(rewards) <= tol


def mean_ci(values: list[float], z: float = 1.96, clip: bool = True) -> dict:
    """Mean with a normal-approximation 95% confidence interval (half-width z * s / sqrt(n)),
    clipped to [0, 1] (scores) unless ``clip`` is false (differences of scores)."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "ci_low": None, "ci_high": None, "std": None}
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    half = z * std / math.sqrt(n) if n > 1 else 0.0
    low, high = mean - half, mean + half
    if clip:
        low, high = max(0.0, low), min(1.0, high)
    return {"n": n, "mean": mean, "ci_low": low, "ci_high": high, "std": std}
