"""Routing: the base model picks one adapter (or none) per task by how likely it finds each answer.

    router = Router.load("models/base", "adapters/")        # every adapters/<slug>/ with manifest.json
    router.route("My laptop loan ends Friday, extend it")   # Route(choice="helpdesk_...", ...)
    policy = RoutedPolicy.load("models/base", "adapters/")
    policy.begin("task text")                               # the chosen adapter for the whole episode

The prompt (one user turn through the model's chat template) lists the task, one option per
adapter (its capability, description and up to ``examples`` examples from identify when the
adapter's manifest has them) and the option "none" (the base model), and asks for the skill's name.
Each answer (an adapter's capability name, or "none", then the end of the turn) is scored by its
log-probability under the base model, as multiple-choice evaluations score options (TRACE section
4 prompts the base model to pick); the softmax over the answers is reported as the options'
probabilities. Scoring whole answers, not a label's first token, makes the choice independent of
the options' order and of a numbering the model would have to look up.
"""
from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from envforge.errors import InputError, UsageError
from trainers.policy import Policy, load_policy

NONE = "none"


@dataclass
class Route:
    """Where a task goes: the chosen adapter's name (or ``"none"``: the base model), the answer
    that chose it (its capability, or "none"), and every option's probability."""
    task: str
    choice: str
    label: str
    probabilities: dict[str, float]

    def to_dict(self) -> dict:
        return {"task": self.task, "choice": self.choice, "label": self.label,
                "probabilities": self.probabilities}


@dataclass
class AdapterInfo:
    name: str
    path: Path
    capability: str
    description: str = ""
    examples: list | None = None


def find_adapters(folder: str | Path) -> list[AdapterInfo]:
    """Adapters in ``folder`` (itself one, or its sub-folders), sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: {'is a file, not a' if folder.exists() else 'no such'} folder; give the "
                         "folder `envforge train --out` wrote (adapters/ by default)")
    dirs = [folder] if (folder / "adapter_config.json").is_file() else sorted(
        d for d in folder.iterdir() if (d / "adapter_config.json").is_file())
    if not dirs:
        raise InputError(f"no adapters in {folder}: want folders with adapter_config.json and "
                         "manifest.json, as `envforge train --out` writes")
    out = []
    for d in dirs:
        try:
            m = json.loads((d / "manifest.json").read_text())
        except (OSError, ValueError):
            m = {}
        out.append(AdapterInfo(d.name, d, m.get("capability") or d.name, m.get("description") or "",
                               m.get("examples") or []))
    return out


def routing_messages(task: str, adapters: list[AdapterInfo], examples: int = 2) -> list[dict]:
    lines = ["Which skill does this task need most? Answer with the skill's name only, or none.", "",
             f"Task: {task}", "", "Skills:", f"- {NONE}: none of these"]
    for a in adapters:
        text = f"- {a.capability}"
        if a.description:
            text += f": {a.description}"
        lines.append(text)
        for ex in (a.examples or [])[:examples]:
            lines.append(f"   example: {ex if isinstance(ex, str) else json.dumps(ex)[:300]}")
    return [{"role": "user", "content": "\n".join(lines)}]


class Router:
    def __init__(self, policy: Policy, adapters: list[AdapterInfo], examples: int = 2):
        self.policy, self.adapters, self.examples = policy, adapters, examples
        self.labels = [NONE] + [a.capability for a in adapters]
        if len(set(self.labels)) != len(self.labels):
            raise InputError(f"two adapters (or an adapter and {NONE!r}) have the same capability "
                             f"{sorted(self.labels)}; the router tells them apart by it: give each "
                             "adapter's manifest.json a capability of its own")
        # an answer is its text, then the end of the turn (what a chat model emits to stop)
        self.answers = [policy.encode(label) + [policy.eot_id] for label in self.labels]

    @classmethod
    def load(cls, model: str | Path, adapters: str | Path, device: str = "cpu", **kw: Any) -> "Router":
        return cls(load_policy(model, device=device), find_adapters(adapters), **kw)

    @torch.no_grad()
    def route(self, task: str) -> Route:
        p = self.policy
        prompt = p.encode(p.render(routing_messages(task, self.adapters, self.examples),
                                   add_generation_prompt=True))
        width = len(prompt) + max(len(a) for a in self.answers)
        ids = torch.full((len(self.answers), width), p.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, ans in enumerate(self.answers):  # right-padded: positions are the same in every row
            ids[i, :len(prompt) + len(ans)] = torch.tensor(prompt + ans)
            mask[i, :len(prompt) + len(ans)] = 1
        model = p.model
        ctx = model.disable_adapter() if hasattr(model, "disable_adapter") and getattr(
            model, "peft_config", None) else nullcontext()
        with ctx:
            logits = model(input_ids=ids.to(p.device), attention_mask=mask.to(p.device)).logits.float()
        logp = torch.log_softmax(logits[:, len(prompt) - 1:-1], dim=-1)  # predicts tokens len(prompt)..
        scores = []
        for i, ans in enumerate(self.answers):
            got = logp[i, torch.arange(len(ans)), torch.tensor(ans, device=logp.device)]
            scores.append(got.sum())
        scores = torch.stack(scores)
        probs = torch.softmax(scores, dim=-1).tolist()
        names = [NONE] + [a.name for a in self.adapters]
        best = int(torch.argmax(scores))
        return Route(task, names[best], self.labels[best], dict(zip(names, probs)))


class RoutedPolicy(Policy):
    """A policy whose model holds every adapter; ``begin(task)`` routes and applies the chosen
    one (or none) for the whole episode."""

    def __init__(self, policy: Policy, adapters: list[AdapterInfo], examples: int = 2):
        from peft import PeftModel
        model = policy.model
        for i, a in enumerate(adapters):
            if i == 0 and not hasattr(model, "peft_config"):
                model = PeftModel.from_pretrained(model, str(a.path), adapter_name=a.name)
            else:
                model.load_adapter(str(a.path), adapter_name=a.name)
        model.eval()
        super().__init__(model, policy.tokenizer, policy.family, policy.name)
        self.router = Router(self, adapters, examples)
        self.choice = NONE

    @classmethod
    def load(cls, model: str | Path, adapters: str | Path, device: str = "cpu", **kw: Any) -> "RoutedPolicy":
        return cls(load_policy(model, device=device), find_adapters(adapters), **kw)

    def use(self, choice: str) -> None:
        self.choice = choice
        if choice != NONE:
            self.model.set_adapter(choice)

    def begin(self, task: str) -> Route:
        decision = self.router.route(task)
        self.use(decision.choice)
        return decision

    def generate(self, *args: Any, **kw: Any):
        if self.choice == NONE:
            with self.model.disable_adapter():
                return super().generate(*args, **kw)
        return super().generate(*args, **kw)


def merged_policy(model: str | Path, adapters: str | Path, device: str = "cpu") -> Policy:
    """The baseline routing beat: every adapter merged into one, each weighted 1/n (peft's "cat"
    combination: the merged weight change is exactly the mean of the adapters' changes)."""
    from peft import PeftModel
    infos = find_adapters(adapters)
    base = load_policy(model, device=device)
    peft_model = PeftModel.from_pretrained(base.model, str(infos[0].path), adapter_name=infos[0].name)
    for a in infos[1:]:
        peft_model.load_adapter(str(a.path), adapter_name=a.name)
    if len(infos) > 1:
        peft_model.add_weighted_adapter([a.name for a in infos], [1.0 / len(infos)] * len(infos),
                                        adapter_name="merged", combination_type="cat")
        peft_model.set_adapter("merged")
    peft_model.eval()
    return Policy(peft_model, base.tokenizer, base.family,
                  f"{base.name} + merged({', '.join(a.name for a in infos)})")
