"""Settings of a calibration run (``trainers.calibrate``)."""
from __future__ import annotations

from dataclasses import dataclass

from envforge.settings import Settings, setting
from sandbox.base import BACKENDS


@dataclass
class CalibrationConfig(Settings):
    """Settings of one calibration run."""
    groups: int = setting(8, "Env seeds (groups of rollouts).", low=1, high=100_000)
    group_size: int = setting(16, "Rollouts per seed (paper and official code: 16).", low=2)
    max_new_tokens: int = setting(256, "Most tokens the policy samples per turn.", low=1)
    temperature: float = setting(1.0, "Sampling temperature (0: greedy; every group is constant).",
                                 low=0)
    top_p: float = setting(1.0, "Nucleus sampling.", above=0, high=1)
    seed: int = setting(0, "Seeds the policy's sampling.")
    env_seed_key: int | None = setting(None, "Keys the env seeds it draws (from the mix training "
                                       "draws from); unset: drawn from the OS and reported (pass "
                                       "it back to replay).", low=0)
    pool_size: int = setting(8, "Warm sandboxes.", low=1)
    backend: str = setting("auto", "Sandbox the env runs in.", choices=BACKENDS)
    call_timeout_s: float = setting(10.0, "Time limit of one env call, seconds.", above=0)
