"""Settings of an evaluation (``trainers.evaluate``)."""
from __future__ import annotations

from dataclasses import dataclass

from envforge.settings import Settings, setting
from sandbox.base import BACKENDS


@dataclass
class EvalConfig(Settings):
    """Settings of one evaluation."""
    max_new_tokens: int = setting(256, "Most tokens the policy samples per turn.", low=1)
    temperature: float = setting(0.0, "Sampling temperature (0: greedy).", low=0)
    top_p: float = setting(1.0, "Nucleus sampling (with temperature > 0).", above=0, high=1)
    pool_size: int = setting(4, "Warm sandboxes per env.", low=1)
    backend: str = setting("auto", "Sandbox the env runs in.", choices=BACKENDS)
    seed: int = setting(0, "Seeds the policy's sampling.")
    call_timeout_s: float = setting(10.0, "Time limit of one env call, seconds.", above=0)
    examples: int = setting(2, "Routed adapters: examples per capability shown to the router.",
                            low=0, high=10)
