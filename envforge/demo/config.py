"""The demo's settings (``envforge demo``): one field per budget, with its help and bounds."""
from __future__ import annotations

from dataclasses import dataclass

from sandbox.base import BACKENDS
from envforge.settings import Settings, setting
from trainers.grpo_config import device_problem


#: the base model's sizes (``--size``): what each changes from the fields' defaults (its shape and
#: the learning rates that suit it; measured on a GPU: 512 wide x 8 layers at the copy warm-up's
#: 1e-3 never learnt the id copy in 3 inits, its loss spiking back to 7)
SIZES = {"small": {},
         "large": {"hidden": 384, "layers": 6, "heads": 6, "copy_lr": 3e-4, "sft_lr": 1e-3, "grpo_lr": 1e-3}}


#: GRPO iterations per adapter under ``--quick`` (what CI runs): the base agent is the full run's
#: (a smaller base recipe is another draw: measured, 500 demonstrations x 4 epochs on seed 0 needed a
#: second init for the copy warm-up, and identify retained error recovery beside the planted two)
QUICK_ITERATIONS = 10


@dataclass
class DemoConfig(Settings):
    """Budgets and settings of one demo run; ``for_run`` makes the full or the ``--quick`` one."""
    seed: int = setting(0, "Seeds every stage (model init, sampling, task draws).", low=0, high=100_000)
    quick: bool = setting(False, "Fewer GRPO iterations (what CI runs; the same base agent).")
    threads: int = setting(1, "torch intra-op threads (1 is fastest on a small or busy CPU).", low=1, high=256)
    device: str = setting("cpu", "Where the model learns and plays: 'cpu', 'cuda', 'cuda:1', ... (on a GPU, "
                          "16 episodes at a time, 8 on a CPU).")
    size: str = setting("small", "The base model: small (0.36M parameters, minutes on a CPU) or large "
                        "(11M, for a GPU).", choices=tuple(SIZES))
    # the base agent
    demonstrations: int = setting(800, "Expert demonstrations the base agent is taught on.", low=1)
    sft_epochs: int = setting(6, "SFT epochs over the demonstrations.", low=1)
    sft_lr: float = setting(3e-3, "SFT learning rate.", above=0)
    sft_batch: int = setting(8, "SFT batch size.", low=1)
    hidden: int = setting(96, "Hidden size of the base model.", low=8)
    layers: int = setting(2, "Layers of the base model.", low=1)
    heads: int = setting(4, "Attention heads of the base model.", low=1)
    deficit_rate: float = setting(0.75, "Per-episode rate of each planted deficit in the demonstrations.",
                                  low=0, high=1)
    follow_through: float = setting(0.5, "Share of the demonstrations that skip the confirmation in which the "
                                    "expert asks anyway, its turns up to the question untrained (the base "
                                    "learns what follows a user's answer, not to ask more).", low=0, high=1)
    check_through: float = setting(0.0, "Share of the demonstrations that skip the read before a close in which "
                                   "the expert reads anyway, the read untrained (the base learns what follows "
                                   "a read, not to read more; 0.5 measured in docs/demo-log.md, not better on "
                                   "5 seeds).", low=0, high=1)
    copy_steps: int = setting(500, "Least steps of the copy warm-up before SFT (it goes on, up to 5x, until "
                                 "every kind is learnt).", low=0)
    copy_lr: float = setting(1e-3, "Learning rate of the copy warm-up.", above=0)
    policy_variants: float = setting(0.8, "Share of demonstrations shown a random policy as system prompt.",
                                     low=0, high=1)
    routing_examples: int = setting(600, "Routing prompts in SFT (a small model must learn the router's form).",
                                    low=0)
    # sampling (identify, calibrate, train, evaluate): nucleus sampling keeps the base agent's
    # planted choices and cuts the tail of stray tokens a small model leaves
    temperature: float = setting(1.0, "Sampling temperature everywhere.", above=0)
    top_p: float = setting(0.9, "Nucleus sampling everywhere.", above=0, high=1)
    identify_tasks: int = setting(120, "Held-out target tasks the base agent plays for identify.", low=5)
    # train
    iterations: int = setting(24, "GRPO iterations per adapter (GRPO on the target gets all of theirs).", low=1)
    grpo_lr: float = setting(2e-3, "GRPO learning rate.", above=0)
    lora_rank: int = setting(8, "LoRA rank of the adapters.", low=1)
    kl_coef: float = setting(0.0, "Weight of the KL to the base agent in every GRPO run, the adapters' "
                             "and the baseline's (0.05 measured in docs/demo-log.md: no better on the mean).", low=0)
    max_new_tokens: int = setting(64, "Most tokens per turn.", low=1)
    calibration_groups: int = setting(2, "Calibration groups per env.", low=1)
    # evaluate
    eval_tasks: int = setting(200, "Held-out target tasks every method is evaluated on.", low=1)
    pool_size: int = setting(8, "Warm sandboxes per env.", low=1)
    backend: str = setting("auto", "Sandbox the envs run in.", choices=BACKENDS)

    def check(self) -> None:
        problem = device_problem(self.device)
        if problem:
            self.fail("device", problem)

    @classmethod
    def for_run(cls, seed: int = 0, quick: bool = False, threads: int = 1, device: str = "cpu",
                size: str = "small", backend: str = "auto") -> "DemoConfig":
        """The settings of a run: the defaults, then ``size``'s preset, then ``quick``'s budgets
        (the one place presets are applied: ``DemoConfig(size=...)`` alone keeps the defaults)."""
        c = cls(seed=seed, quick=quick, threads=threads, device=device, size=size, backend=backend)
        for name, value in SIZES[size].items():
            setattr(c, name, value)
        if device != "cpu":  # a GPU decodes more episodes at once for about the time of one
            c.pool_size = 16
        if quick:  # the same base agent, bit for bit (its budgets untouched), trained less
            c.iterations = QUICK_ITERATIONS
        return c
