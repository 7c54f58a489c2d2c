"""Multi-turn GRPO with one LoRA adapter per capability.

    config = GRPOConfig(iterations=40)                 # the paper's defaults
    trainer = GRPOTrainer(policy, "helpdesk_precondition_verification", config, out="adapters/x")
    result = trainer.train()                           # adapter + manifest.json + reward_curve.png

One iteration: ``num_groups`` env seeds, ``group_size`` rollouts each (``trainers.rollout``:
multi-turn, against the sandboxed env, env steps in parallel on a warm pool, overlapping generation); groups whose
rewards are all equal carry no gradient and are dropped and re-collected on the next seeds drawn (dynamic
sampling, up to ``max_resample_rounds``); each rollout's advantage is its group-normalised reward
``(r - mean) / (std + eps)``; the loss is the PPO-style clipped surrogate (asymmetric clip,
DAPO's ``epsilon_high``) on the policy's own sampled tokens only (``Episode.mask``), averaged over
all those tokens of the iteration, plus ``kl_coef`` times the k3 estimate of KL to the base
model (the adapter disabled) when ``kl_coef > 0``.

Why a loop of our own rather than TRL's ``GRPOTrainer``: see trainers/README.md. In short, TRL's
trainer owns generation, batching and the dataloader; its ``rollout_func`` hook returns one
prompt/completion pair per rollout, but a multi-turn episode here is one token sequence in which
tool results and user turns sit between the policy's turns and must be masked, groups must be
dropped and re-collected on the next seeds drawn, and resume must replay the exact rollouts. Those fit a
short loop of our own over peft + torch (this module and ``trainers.rollout``); the loss is
TRL's (same clipping, token-level averaging).

Env seeds: drawn from the audit's mix (``envforge.contract.training_seeds``) by a key drawn
from the OS per run (``env_seed_key`` to replay one), so an env cannot tell training's seeds
from the audit's and a flaw kept to some seeds meets training about as often as the gate met it.

Determinism: the torch generator is re-seeded from (``seed``, iteration) at the start of every
iteration and the env seeds' key and counter are kept in the checkpoint, so a resumed run replays
exactly what an uninterrupted one does (with one thread on CPU); two runs of one ``seed`` and
one ``env_seed_key`` are the same run.
"""
from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from envforge import __version__
from envforge.contract import new_seed_key, training_seeds
from envforge.errors import UsageError
from envforge.progress import Progress, Step, steady
from envforge.settings import named
from sandbox.base import warn_once
from trainers.grpo_config import GRPOConfig  # re-exported too: its home was here
from trainers.policy import Policy, set_threads
from trainers.rollout import Episode, EnvFactory, is_constant, run_episodes

CHECKPOINT = "checkpoint"


# --------------------------------------------------------------------------- the math

def group_advantages(rewards: list[float], eps: float = 1e-4) -> list[float]:
    """``(r_i - mean) / (std + eps)`` over one group; std is the sample std (as TRL's)."""
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    return [(r - mean) / (std + eps) for r in rewards]


def batch_tensors(episodes: list[Episode], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``loss_mask`` (1 on sampled tokens)."""
    width = max(len(e.tokens) for e in episodes)
    ids = torch.full((len(episodes), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(episodes), width), dtype=torch.long)
    loss_mask = torch.zeros((len(episodes), width), dtype=torch.float32)
    for i, e in enumerate(episodes):
        n = len(e.tokens)
        ids[i, :n] = torch.tensor(e.tokens, dtype=torch.long)
        attn[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(e.mask, dtype=torch.float32)
    return ids, attn, loss_mask


#: per (model class, base model class): does its forward take ``logits_to_keep`` as a boolean
#: mask (``kept_logits``)? Probed once per process on two tokens.
_KEEPS_MASK: dict[tuple[type, type], bool] = {}


#: seconds between two looks at a budget still being decided (``GRPOTrainer.go_on``)
BUDGET_POLL_S = 0.2


def _pause() -> None:
    """A wait for a budget still being decided to rise."""
    time.sleep(BUDGET_POLL_S)


def keeps_masks(model) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` as a boolean [B, T] mask and answers
    the kept positions' logits as [N, vocab] (transformers' recent models; not an older
    transformers, nor custom code): probed once per model class on two tokens, in eval mode and
    without gradients (no dropout, so no random draw a replay would miss). A model that does
    not is said once on stderr (``warn_once``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    key = (type(model), type(base))
    if key not in _KEEPS_MASK:
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                ids = torch.zeros((1, 2), dtype=torch.long, device=next(model.parameters()).device)
                keep = torch.tensor([[False, True]], device=ids.device)
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=keep).logits
            ok = logits.dim() == 2 and logits.shape[0] == 1
        except Exception:  # no such argument, or not as a mask: every position's logits
            ok = False
        finally:
            model.train(was)
        _KEEPS_MASK[key] = ok
        if not ok:
            warn_once(f"{type(base).__name__}'s forward does not take logits_to_keep as a mask: the loss "
                      "computes every position's logits (more memory; a newer transformers has it)")
    return _KEEPS_MASK[key]


def kept_logits(model, ids: torch.Tensor, attn: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor:
    """The logits at the positions where ``keep`` ([B, T], bool) is true, flattened to [N, vocab]
    in row-major order (``logits[keep]``). The model computes its vocabulary's logits there alone
    (transformers' ``logits_to_keep`` as a boolean mask): every position's ([B, T, vocab]) is
    the largest tensor of a step with a big vocabulary (a 128k one: 4 GiB in float32 for 8
    sequences of 1,024 tokens), and in an episode most tokens are the prompt, the env's or the
    user's, none of them scored. A model whose forward does not take the mask (``keeps_masks``)
    computes them all."""
    if keeps_masks(model):
        return model(input_ids=ids, attention_mask=attn, logits_to_keep=keep).logits
    return model(input_ids=ids, attention_mask=attn).logits[keep]


def token_logprobs(model, ids: torch.Tensor, attn: torch.Tensor,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """log p(ids[:, t] | ids[:, :t]) for t >= 1: shape [B, T-1]. With ``mask`` ([B, T-1]), only
    where it is non-zero (0 elsewhere), the logits computed at those positions alone
    (``kept_logits``)."""
    if mask is None:
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    scored = mask != 0
    keep = torch.zeros_like(ids, dtype=torch.bool)
    keep[:, :-1] = scored
    logits = kept_logits(model, ids, attn, keep).float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:][scored][:, None]).squeeze(-1)
    return torch.zeros(scored.shape, dtype=logp.dtype, device=logp.device).masked_scatter(scored, logp)


def update_metrics(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor, epsilon_low: float, epsilon_high: float,
                   ref_logp: torch.Tensor | None) -> tuple[float, float]:
    """Over the masked tokens: how many had their ratio clipped (below with a negative advantage,
    above with a positive one, as TRL counts them), and the sum of the k3 KL to ``ref_logp``."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None]
    clipped = ((ratio < 1 - epsilon_low) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
    kl = 0.0
    if ref_logp is not None:
        d = ref_logp - logp
        kl = float(((torch.exp(d) - d - 1) * mask).sum())
    return float((clipped.float() * mask).sum()), kl


def lr_share(schedule: str, i: int, iterations: int, warmup: int = 0, done: float | None = None) -> float:
    """The share of the learning rate that iteration ``i`` (0 for the first) of a run of
    ``iterations`` trains at: during ``warmup`` iterations (i + 1) / (warmup + 1), then 1
    ("constant"), or a linear or cosine decay over the iterations after the warm-up. ``done``
    (the share of a rollout budget spent after the warm-up, before the iteration) moves the decay
    on where it is further along. The decay never reaches 0 on an iteration that trains."""
    if i < warmup:
        return (i + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    p = (i - warmup) / max(1, iterations - warmup)
    p = min(max(p, done or 0.0), 1.0)
    return 1.0 - p if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))


def clipped_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, epsilon_low: float, epsilon_high: float,
                 ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0) -> torch.Tensor:
    """Sum over masked tokens of the clipped surrogate (+ k3 KL): divide by the token count."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None]
    per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * adv)
    if ref_logp is not None and kl_coef > 0:
        d = ref_logp - logp
        per_token = per_token + kl_coef * (torch.exp(d) - d - 1)
    return (per_token * mask).sum()


# --------------------------------------------------------------------------- the trainer

@dataclass
class IterationStats:
    iteration: int
    reward_mean: float
    reward_std: float
    constant_fraction: float
    groups_collected: int
    groups_trained: int
    episodes: int
    generated_tokens: int
    tokens_per_s: float
    loss: float
    seconds: float
    errors: int = 0
    generate_s: float = 0.0   # batched generation
    env_wait_s: float = 0.0   # waiting for env steps not hidden behind generation
    loss_s: float = 0.0       # forward/backward passes and the optimizer step
    completion_length: float = 0.0   # sampled tokens per episode
    clip_ratio: float = 0.0   # of the trained tokens, the share whose ratio was clipped
    kl: float | None = None   # mean k3 KL to the base model per trained token (kl_coef > 0)
    lr: float = 0.0           # the learning rate the iteration trained at (lr_schedule)

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        """The iteration for a person: reward, what was trained, speed, where the time went."""
        return (f"reward {self.reward_mean:.3f} ± {self.reward_std:.3f}  constant groups "
                f"{self.constant_fraction:.0%}  trained {self.groups_trained}/{self.groups_collected}"
                f"  {self.tokens_per_s:,.0f} tok/s  loss {self.loss:+.4f}  {self.seconds:.1f}s "
                f"(generate {self.generate_s:.1f}s, env wait {self.env_wait_s:.1f}s, loss "
                f"{self.loss_s:.1f}s)" + (f"  errors {self.errors}" if self.errors else ""))


@dataclass
class TrainResult:
    out: Path
    history: list[dict]
    manifest: dict

    def to_dict(self) -> dict:
        """The adapter folder, its manifest and the per-iteration statistics, as JSON types."""
        return {"out": str(self.out), "manifest": self.manifest, "history": self.history}


def add_adapter(model, config: GRPOConfig):
    """``model`` wrapped with a fresh trainable LoRA adapter (peft); only it requires grad."""
    torch.manual_seed(config.seed)
    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=config.target_modules, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


#: settings a run may change and still resume its checkpoint: how long it trains, where and how
#: fast it runs, how often it saves; any other (the learning rate, the KL weight, the sampling,
#: the seeds, the LoRA shape, ...) would make the resumed iterations another run's
RESUMABLE = ("iterations", "max_rollouts", "threads", "device", "pool_size", "backend", "call_timeout_s",
             "save_every", "report_to", "micro_batch_size")


class GRPOTrainer:
    """Trains one LoRA adapter on one env; see the module docstring."""

    def __init__(self, policy: Policy, env: str | Path, config: GRPOConfig | None = None,
                 out: str | Path = "adapter", *, base_model: str | None = None,
                 unsafe_skip_gate: bool = False, resume: bool = True,
                 progress: Progress | None = None, executor: Any = None,
                 budget: Callable[[], tuple[int, bool]] | None = None):
        self.config = config or GRPOConfig()
        # rollouts decided while the run goes (``go_on``); None: ``config.max_rollouts``
        self.budget = budget
        self.executor = executor  # where the sandboxes run (envforge.executor); None: here
        self.env, self.out = env, Path(out)
        self.base_model = base_model or policy.name
        self.unsafe_skip_gate, self.resume, self.progress = unsafe_skip_gate, resume, progress
        set_threads(self.config.threads)
        policy.model.to(self.config.device)
        if not hasattr(policy.model, "peft_config"):
            policy.model = add_adapter(policy.model, self.config)
        self.policy = policy
        self.model = policy.model
        if budget is not None and self.config.lr_schedule != "constant":
            raise UsageError(f"lr_schedule {self.config.lr_schedule!r} decays over the run's length, and a "
                             "rollout budget decided while the run goes (budget=...) leaves that length "
                             "unknown until its end: pass max_rollouts, or lr_schedule 'constant'")
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise UsageError("the policy's model has no trainable parameters (an adapter loaded with "
                             "load_policy(adapter=...) is frozen): pass the base model; GRPO adds "
                             "a fresh LoRA adapter")
        self.optimizer = torch.optim.AdamW(self.params, lr=self.config.learning_rate,
                                           weight_decay=self.config.weight_decay)
        self.iteration, self.env_seed_counter = 0, 0
        # the key of the env seeds (``contract.training_seeds``): the config's, a checkpoint's, or
        # drawn from the OS when the run starts
        self.env_seed_key: int | None = self.config.env_seed_key
        self.resumed_at: int | None = None  # the checkpoint's iteration, when train() resumed from one
        self.history: list[dict] = []
        self._expected = 0  # expected_iterations' estimate under max_rollouts

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, env_hash: str) -> Path:
        final = self.out / CHECKPOINT
        tmp = self.out / (CHECKPOINT + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        state = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(self.model).items()}
        save_file(state, str(tmp / "adapter.safetensors"))
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps({
            "iteration": self.iteration, "env_seed_counter": self.env_seed_counter,
            "env_seed_key": self.env_seed_key,
            "history": self.history, "env_hash": env_hash, "base_model": self.base_model,
            "config": self.config.to_dict()}, indent=1))
        old = self.out / (CHECKPOINT + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        return final

    def check_resumable(self) -> None:
        """Refuse a checkpoint made under other training settings than this run's (all but
        ``RESUMABLE``): a resumed run would splice two runs. Before anything is loaded or started."""
        ck = self._checkpoint()
        if ck is None:
            return
        state = json.loads((ck / "state.json").read_text())
        if "env_seed_key" not in state:
            raise UsageError(f"{ck} was made before training drew its env seeds (they counted up from "
                             "0; envforge 2026-12-07): a resumed run would mix the two; pass "
                             "--no-resume or another --out")
        recorded = dict(state.get("config") or {})
        if recorded:  # made before the schedule was a setting: at a constant rate
            recorded.setdefault("lr_schedule", "constant")
            recorded.setdefault("warmup_iterations", 0)
        now = json.loads(json.dumps(self.config.to_dict()))  # as the checkpoint holds it
        if now.get("env_seed_key") is None:  # unset: the checkpoint's key, drawn or named
            recorded.pop("env_seed_key", None)
        elif state.get("env_seed_key") is not None:  # the key it drew is the one to name
            recorded["env_seed_key"] = state["env_seed_key"]
        # a decaying rate is a function of the run's length: another length would splice two schedules
        resumable = RESUMABLE if now.get("lr_schedule") == "constant" else \
            tuple(k for k in RESUMABLE if k not in ("iterations", "max_rollouts"))
        changed = [k for k in now if k in recorded and k not in resumable and recorded[k] != now[k]]
        if changed:
            raise UsageError(f"{ck} was trained with other settings ("
                             + ", ".join(f"{named(GRPOConfig, k)} {recorded[k]!r}, now {now[k]!r}"
                                         for k in changed)
                             + f"; all of them in {ck / 'state.json'}): a resumed run would mix the two; "
                             "pass the checkpoint's values, --no-resume, or another --out")

    def _checkpoint(self) -> Path | None:
        """The checkpoint folder to resume from, if any (one left between save_checkpoint's two
        renames is put back first)."""
        ck, old = self.out / CHECKPOINT, self.out / (CHECKPOINT + ".old")
        if not (ck / "state.json").is_file() and (old / "state.json").is_file():
            shutil.rmtree(ck, ignore_errors=True)  # stopped between save_checkpoint's two renames
            old.rename(ck)
        return ck if (ck / "state.json").is_file() else None

    def load_checkpoint(self, env_hash: str) -> bool:
        ck = self._checkpoint()
        if ck is None:
            return False
        state = json.loads((ck / "state.json").read_text())
        if state["env_hash"] != env_hash:
            raise UsageError(f"{ck} was made on another version of the env (hash "
                             f"{state['env_hash'][:12]}, now {env_hash[:12]}): pass --no-resume or "
                             "another --out")
        if state["base_model"] != self.base_model:
            raise UsageError(f"{ck} was made with base model {state['base_model']}, not "
                             f"{self.base_model}: pass --no-resume or another --out")
        set_peft_model_state_dict(self.model, load_file(str(ck / "adapter.safetensors"),
                                                        device=str(self.config.device)))
        self.optimizer.load_state_dict(torch.load(ck / "optimizer.pt", map_location=self.config.device))
        self.iteration, self.env_seed_counter = state["iteration"], state["env_seed_counter"]
        self.env_seed_key = state["env_seed_key"]
        self.history = state["history"]
        return True

    # ------------------------------------------------------------------ one iteration
    def _next_seeds(self, n: int) -> list[int]:
        seeds = training_seeds(self.env_seed_key, self.env_seed_counter, n)
        self.env_seed_counter += n
        return seeds

    def collect(self, factory: EnvFactory, executor, stats: dict) -> tuple[list[list[Episode]], int, int]:
        """Groups with a gradient (or all groups when dynamic sampling is off); also the number
        of groups collected and of constant ones among them."""
        c = self.config
        kept: list[list[Episode]] = []
        collected = constant = 0
        for round_ in range(1 + (c.max_resample_rounds if c.dynamic_sampling else 0)):
            want = c.num_groups - len(kept)
            if want <= 0:
                break
            seeds = self._next_seeds(want)
            episodes = run_episodes(self.policy, factory, [s for s in seeds for _ in range(c.group_size)],
                                    max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                                    top_p=c.top_p, max_turns=c.max_turns,
                                    max_context_tokens=c.max_context_tokens, executor=executor, stats=stats)
            for g in range(want):
                group = episodes[g * c.group_size:(g + 1) * c.group_size]
                collected += 1
                stats.setdefault("scores", []).extend(e.score for e in group)
                stats["errors"] = stats.get("errors", 0) + sum(e.error is not None for e in group)
                if is_constant([e.score for e in group]):
                    constant += 1
                    if c.dynamic_sampling:
                        continue
                kept.append(group)
        return kept, collected, constant

    def update(self, groups: list[list[Episode]]) -> float:
        """The optimizer steps on ``groups``; returns the mean loss per token."""
        c = self.config
        episodes, advantages = [], []
        for group in groups:
            adv = group_advantages([e.score for e in group], c.advantage_eps)
            for e, a in zip(group, adv):
                if e.valid and a != 0.0:
                    episodes.append(e)
                    advantages.append(a)
        lr = c.learning_rate * self.lr_share()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.metrics = {"clip_ratio": 0.0, "kl": None, "lr": lr}
        if not episodes:
            return 0.0
        total_tokens = float(sum(sum(e.mask[1:]) for e in episodes)) or 1.0
        device = self.config.device
        batches = []
        for i in range(0, len(episodes), c.micro_batch_size):
            chunk = episodes[i:i + c.micro_batch_size]
            ids, attn, mask = batch_tensors(chunk, self.policy.pad_id)
            batch = {"ids": ids.to(device), "attn": attn.to(device), "mask": mask[:, 1:].to(device),
                     "adv": torch.tensor(advantages[i:i + c.micro_batch_size], device=device)}
            with torch.no_grad():
                if c.updates_per_iteration > 1:
                    batch["old"] = token_logprobs(self.model, batch["ids"], batch["attn"], batch["mask"])
                if c.kl_coef > 0:
                    with self.model.disable_adapter():
                        batch["ref"] = token_logprobs(self.model, batch["ids"], batch["attn"], batch["mask"])
            batches.append(batch)
        self.model.train()
        losses = []
        clipped = kl = 0.0
        for _ in range(c.updates_per_iteration):
            self.optimizer.zero_grad(set_to_none=True)
            running = 0.0
            for b in batches:
                logp = token_logprobs(self.model, b["ids"], b["attn"], b["mask"])
                old = b.get("old", logp.detach())
                loss = clipped_loss(logp, old, b["adv"], b["mask"], c.epsilon_low, c.epsilon_high,
                                    b.get("ref"), c.kl_coef) / total_tokens
                loss.backward()
                running += float(loss.detach())
                with torch.no_grad():
                    c_, k_ = update_metrics(logp, old, b["adv"], b["mask"], c.epsilon_low,
                                            c.epsilon_high, b.get("ref"))
                    clipped, kl = clipped + c_, kl + k_
            if c.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(self.params, c.max_grad_norm)
            self.optimizer.step()
            losses.append(running)
        self.model.eval()
        seen = total_tokens * c.updates_per_iteration
        self.metrics = {"clip_ratio": clipped / seen, "kl": kl / seen if c.kl_coef > 0 else None, "lr": lr}
        return statistics.fmean(losses)

    # ------------------------------------------------------------------ the run
    def train(self) -> TrainResult:
        c = self.config
        if self.resume:
            self.check_resumable()
        pool_size = c.pool_size or min(16, c.rollouts_per_iteration)
        with EnvFactory(self.env, size=pool_size, backend=c.backend,
                        unsafe_skip_gate=self.unsafe_skip_gate, call_timeout_s=c.call_timeout_s,
                        executor=self.executor) as factory:
            if self.resume and self.load_checkpoint(factory.env_hash):
                self.resumed_at = self.iteration
                self._report(Step(f"resumed at iteration {self.iteration}", None, self.iteration,
                                  self.expected_iterations()))
            elif (self.out / CHECKPOINT).exists():
                shutil.rmtree(self.out / CHECKPOINT)
            if self.env_seed_key is None:  # none named and none resumed: this run draws its own
                self.env_seed_key = new_seed_key()
            meta = factory.describe()
            writer = tracker(c.report_to, self.out)
            with ThreadPoolExecutor(max_workers=pool_size) as executor:
                saved = self.iteration
                while self.iteration < c.iterations and self.go_on():
                    stats = self.iterate(factory, executor)
                    self.history.append(stats.to_dict())
                    if self.iteration % c.save_every == 0:
                        self.save_checkpoint(factory.env_hash)
                        saved = self.iteration
                    if writer is not None:
                        track(writer, stats)
                    self._report(Step(str(stats), None, self.iteration, self.expected_iterations(), stats))
                if saved != self.iteration:  # the last iteration (the iterations or the budget ended it)
                    self.save_checkpoint(factory.env_hash)
            ran_to = self.budget()[0] if self.budget is not None else 0
            if ran_to > 0:  # the budget it ran to, in the manifest, as max_rollouts would be
                self.config = replace(self.config, max_rollouts=ran_to)
            if writer is not None:
                writer.close()
            manifest = self.save_adapter(factory, meta)
        return TrainResult(self.out, self.history, manifest)

    def expected_iterations(self) -> int:
        """The run's length in iterations: ``iterations``, or fewer where ``max_rollouts`` will
        stop it first (estimated from the rollouts of the last few iterations: they grow as
        groups turn constant and are collected again), for progress and ETA."""
        c, most = self.config, self.max_rollouts()
        if most is None or not self.history:
            return c.iterations
        spent = self.rollouts_spent()
        if spent >= most:
            return self.iteration
        recent = [h["episodes"] for h in self.history[-4:]]
        left = math.ceil((most - spent) / (sum(recent) / len(recent)))
        self._expected = steady(self._expected, min(c.iterations, self.iteration + max(1, left)),
                                self.iteration)
        return self._expected

    def lr_share(self) -> float:
        """``lr_share`` for the iteration about to train: under ``max_rollouts``, the share of
        the budget left after the warm-up that was spent before this iteration. (A decaying
        schedule with a budget decided while the run goes is refused in ``__init__``.)"""
        c, done = self.config, None
        if c.max_rollouts and self.iteration >= c.warmup_iterations:
            warm = sum(h["episodes"] for h in self.history[:c.warmup_iterations])
            if c.max_rollouts > warm:
                done = (self.rollouts_spent() - warm) / (c.max_rollouts - warm)
        return lr_share(c.lr_schedule, self.iteration, c.iterations, c.warmup_iterations, done)

    def rollouts_spent(self) -> int:
        return sum(h["episodes"] for h in self.history)

    def max_rollouts(self) -> int | None:
        """``config.max_rollouts``, or with ``budget`` the rollouts it allows so far."""
        return self.config.max_rollouts if self.budget is None else self.budget()[0]

    def budget_spent(self) -> bool:
        """Whether ``max_rollouts`` rollouts were collected (never, when it is unset); with
        ``budget``, whether its final number was."""
        if self.budget is not None:
            known, final = self.budget()
            return final and self.rollouts_spent() >= known
        c = self.config
        return c.max_rollouts is not None and self.rollouts_spent() >= c.max_rollouts

    def go_on(self) -> bool:
        """Whether another iteration runs, as far as the rollouts go: not while ``max_rollouts``
        are spent. With ``budget`` (a callable answering the rollouts allowed so far and whether
        that number is final: a budget that is still being decided, such as another run's
        rollouts while it trains), an iteration starts while fewer than those are spent, the
        run waits while as many are spent and more may come, and it stops once the final number
        is spent: the run ``max_rollouts`` = the final number makes, iteration for iteration."""
        if self.budget is None:
            return not self.budget_spent()
        while True:
            known, final = self.budget()
            if self.rollouts_spent() < known or final:
                return self.rollouts_spent() < known
            _pause()

    def _report(self, step: Step) -> None:
        if self.progress is not None:
            self.progress(step)

    def iterate(self, factory: EnvFactory, executor) -> IterationStats:
        c = self.config
        torch.manual_seed(c.seed * 1_000_003 + self.iteration)
        t0 = time.perf_counter()
        stats: dict = {}
        groups, collected, constant = self.collect(factory, executor, stats)
        t1 = time.perf_counter()
        loss = self.update(groups)
        loss_s = time.perf_counter() - t1
        self.iteration += 1
        scores = stats.get("scores", [])
        gen_s = stats.get("generate_s", 0.0)
        return IterationStats(
            iteration=self.iteration, reward_mean=statistics.fmean(scores) if scores else 0.0,
            reward_std=statistics.pstdev(scores) if scores else 0.0,
            constant_fraction=constant / collected if collected else 0.0,
            groups_collected=collected, groups_trained=len(groups), episodes=len(scores),
            generated_tokens=stats.get("generated_tokens", 0),
            tokens_per_s=stats.get("generated_tokens", 0) / gen_s if gen_s else 0.0,
            loss=loss, seconds=time.perf_counter() - t0, errors=stats.get("errors", 0),
            generate_s=gen_s, env_wait_s=stats.get("env_wait_s", 0.0), loss_s=loss_s,
            completion_length=stats.get("generated_tokens", 0) / len(scores) if scores else 0.0,
            clip_ratio=self.metrics["clip_ratio"], kl=self.metrics["kl"], lr=self.metrics["lr"])

    def save_adapter(self, factory: EnvFactory, meta: dict) -> dict:
        """The adapter (peft safetensors), manifest.json and reward_curve.png in ``out``."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(self.out))
        env_manifest = {}
        try:
            env_manifest = json.loads((factory.path.parent / "manifest.json").read_text())
        except (OSError, ValueError):
            pass
        env_manifest = env_manifest if isinstance(env_manifest, dict) else {}
        manifest = {
            "capability": meta.get("capability"),
            "description": env_manifest.get("description") or "",
            "examples": [e for e in env_manifest.get("examples") or [] if isinstance(e, str)][:3],
            "skills": meta.get("skills"),
            "env": str(factory.path.parent), "env_hash": factory.env_hash,
            "target": env_manifest.get("target"),
            "base_model": self.base_model, "config": self.config.to_dict(),
            "iterations": self.iteration,
            "env_seeds": {"key": self.env_seed_key, "drawn": self.env_seed_counter},
            "reward_curve": [h["reward_mean"] for h in self.history],
            "history": self.history, "envforge_version": __version__,
        }
        (self.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
        plot_reward_curve(self.history, self.out / "reward_curve.png", title=str(meta.get("capability")))
        return manifest


#: what ``--report-to`` logs per iteration, under TRL's GRPO names: tag -> IterationStats field
TRACKED = {"train/reward": "reward_mean", "train/reward_std": "reward_std",
           "train/frac_reward_zero_std": "constant_fraction", "train/kl": "kl",
           "train/clip_ratio": "clip_ratio", "train/completion_length": "completion_length",
           "train/tokens_per_second": "tokens_per_s", "train/loss": "loss",
           "train/learning_rate": "lr"}
RUNS = "runs"  # OUT/<slug>/runs: the TensorBoard event files


def tracker(report_to: str, out: Path):
    """A TensorBoard ``SummaryWriter`` on ``out/runs`` for report_to "tensorboard"; None for
    "none"."""
    if report_to == "none":
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError("--report-to tensorboard needs the tensorboard package (part of the "
                         "train extra: pip install -c constraints.txt -e '.[train]')") from None
    return SummaryWriter(log_dir=str(out / RUNS))


def track(writer, stats: IterationStats) -> None:
    for tag, name in TRACKED.items():
        value = getattr(stats, name)
        if value is not None:  # KL only when kl_coef > 0 (as TRL logs it)
            writer.add_scalar(tag, value, global_step=stats.iteration)
    writer.flush()


def plot_reward_curve(history: list[dict], path: Path, title: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = [h["iteration"] for h in history]
    mean = [h["reward_mean"] for h in history]
    std = [h["reward_std"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(xs, mean, marker="o", ms=3, label="mean reward")
    ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                    alpha=0.2, label="± std")
    ax.set_xlabel("iteration")
    ax.set_ylabel("episode reward")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"GRPO: {title}" if title else "GRPO")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
