"""The settings of one GRPO run (``trainers.grpo.GRPOTrainer``). Light: no torch at import, so
the command line builds its ``train`` options from these fields."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from envforge.settings import Settings, setting
from sandbox.base import BACKENDS


REPORT_TO = ("none", "tensorboard")
LR_SCHEDULES = ("constant", "linear", "cosine")


def device_problem(device: str) -> str | None:
    """What is wrong with a torch device name for the model (None: usable here): 'cpu', or
    'cuda' / 'cuda:N' with torch seeing that GPU. torch is imported only for a cuda name."""
    m = re.fullmatch(r"cpu|cuda(?::(\d+))?", device or "")
    if m is None:
        return f"must be 'cpu', 'cuda' or 'cuda:N', got {device!r}"
    if device == "cpu":
        return None
    import torch
    if not torch.cuda.is_available():
        return f"is {device!r} but torch sees no CUDA device; use 'cpu'"
    count = torch.cuda.device_count()
    if m.group(1) is not None and int(m.group(1)) >= count:
        return f"is {device!r} but torch sees {count} GPU{'s' if count != 1 else ''} (cuda:0..cuda:{count - 1})"
    return None


@dataclass
class GRPOConfig(Settings):
    """Settings of one GRPO run. Defaults marked (paper) come from TRACE, section 3."""

    # the adapter
    lora_rank: int = setting(32, "LoRA rank (paper: 32; the official code uses 16).", low=1, flag="--rank")
    lora_alpha: int | None = setting(None, "LoRA alpha; scale = alpha / rank (unset: 2 × rank).",
                                     low=1)
    lora_dropout: float = setting(0.0, "LoRA dropout (0 keeps rollouts and the loss deterministic).",
                                  low=0, high=1)
    target_modules: Any = setting("all-linear", "Modules that get LoRA layers: 'all-linear' or a "
                                  "list of module names.")
    # rollouts
    num_groups: int = setting(4, "Groups (env seeds) per iteration (paper: G = 4).", low=1, flag="--groups")
    group_size: int = setting(4, "Rollouts per seed (paper: K = 4; official code: 16); a group of "
                              "one has no advantage: its reward equals its mean.", low=2)
    iterations: int = setting(40, "Training iterations (paper: 40, i.e. 640 rollouts).", low=1)
    max_rollouts: int | None = setting(None, "Stop after the iteration that reaches this many "
                                       "rollouts (a budget for comparing runs; unset: iterations "
                                       "alone decide).", low=1)
    max_new_tokens: int = setting(256, "Most tokens the policy samples per turn.", low=1)
    max_turns: int | None = setting(None, "Most policy turns per episode (unset: the env's own "
                                    "max_turns).", low=1)
    max_context_tokens: int = setting(4096, "An episode whose context would exceed this is "
                                      "truncated.", low=1)
    temperature: float = setting(1.0, "Sampling temperature of rollouts (> 0: greedy rollouts of "
                                 "one seed are identical).", above=0)
    top_p: float = setting(1.0, "Nucleus sampling of rollouts.", above=0, high=1)
    dynamic_sampling: bool = setting(True, "Drop groups with constant rewards and re-collect on "
                                     "the next seeds drawn (official code).")
    max_resample_rounds: int = setting(3, "Re-collection rounds per iteration before training on "
                                       "the groups there are.", low=0)
    # the loss
    learning_rate: float = setting(1e-5, "AdamW learning rate (paper: 1e-5).", above=0, flag="--lr")
    lr_schedule: str = setting("constant", "The learning rate over the run: constant (paper), or a linear "
                               "or cosine decay toward 0 by the run's end (its iterations, or its "
                               "rollout budget where that is further along).", choices=LR_SCHEDULES)
    warmup_iterations: int = setting(0, "First iterations at a rising share of the learning rate "
                                     "(1/(n+1), 2/(n+1), ...), before the schedule.", low=0)
    weight_decay: float = setting(0.0, "AdamW weight decay.", low=0)
    epsilon_low: float = setting(0.2, "Clip the ratio below at 1 - epsilon_low.", low=0, high=0.999)
    epsilon_high: float = setting(0.28, "Clip the ratio above at 1 + epsilon_high (official code: "
                                  "DAPO clip 0.28).", low=0)
    kl_coef: float = setting(0.0, "Weight of KL to the base model (official code: 0).", low=0, flag="--kl")
    updates_per_iteration: int = setting(1, "Optimizer steps on each batch of rollouts (>1 makes "
                                         "the clipping bite).", low=1)
    micro_batch_size: int = setting(4, "Episodes per forward/backward pass.", low=1)
    max_grad_norm: float = setting(1.0, "Gradient clipping (0: none).", low=0)
    advantage_eps: float = setting(1e-4, "Added to the group std before dividing.", above=0)
    # the run
    seed: int = setting(0, "Seeds LoRA init and rollout sampling (env seeds: env_seed_key).")
    env_seed_key: int | None = setting(None, "Keys the env seeds the run draws (the audit's mix of "
                                       "small, middling and large seeds); unset: drawn from the OS "
                                       "and kept in the checkpoint and manifest. Pass one only to "
                                       "replay a run: an env that knows the key can tell training's "
                                       "seeds from the audit's.", low=0)
    threads: int | None = setting(1, "torch intra-op threads (measured on a busy 2-core CPU: 2 ran "
                                  "~10x slower than 1; unset: torch's default).", low=1, high=256)
    device: str = setting("cpu", "'cpu', 'cuda', 'cuda:1', ...")
    pool_size: int | None = setting(None, "Warm sandboxes (unset: one per rollout of an iteration, "
                                    "at most 16).", low=1)
    backend: str = setting("auto", "Sandbox the env runs in.", choices=BACKENDS)
    call_timeout_s: float = setting(10.0, "Time limit of one env call, seconds.", above=0)
    save_every: int = setting(1, "Checkpoint every N iterations.", low=1)
    report_to: str = setting("none", "Where each iteration's metrics go besides the manifest: "
                             "tensorboard (event files in OUT/<slug>/runs) or none.",
                             choices=REPORT_TO)

    def check(self) -> None:
        for name in ("lora_rank", "num_groups", "group_size", "iterations", "max_new_tokens",
                     "max_context_tokens", "updates_per_iteration", "micro_batch_size", "save_every",
                     "warmup_iterations"):
            if not isinstance(getattr(self, name), int):
                self.fail(name, f"must be an integer, got {getattr(self, name)!r}")
        if self.lora_alpha is None:
            self.lora_alpha = 2 * self.lora_rank
        problem = device_problem(self.device)
        if problem:
            self.fail("device", problem)

    @property
    def rollouts_per_iteration(self) -> int:
        return self.num_groups * self.group_size
