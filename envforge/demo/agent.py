"""The demo's base agent, made locally: a word-level tokenizer fitted to the domain, a small
Llama-style causal LM, and supervised fine-tuning (SFT) on the scripted expert's
demonstrations (with their planted deficits) and on routing prompts.

This stage stands in for "an agent you already have"; it is the demo's only, not the pipeline's.
The model is saved with ``save_pretrained`` and read back by ``trainers.policy.load_policy``, like
any checkpoint.

Tokenizer: word level (``tokenizers``), pieces are words, numbers of up to three digits, single
punctuation marks and runs of whitespace, and the decoder joins them as they are, so text
round-trips exactly (an id like ``TCK-482`` is ``TCK - 482``: copying it is copying one token).
The JSON glue of a tool call is a few added tokens, so a call is a short token sequence, and each
tool's name with its arguments' opening is one (``close_ticket", "arguments": {"``), so the
first argument is chosen where the tool is named.

Before SFT the model gets what pretraining gives a real one: word classes in its embeddings
(``word_classes``) and a copy warm-up (``CopyTask``, ``pretrain_copy``), so it can carry an id
or a resolution code from the user's message into a call and a status from a record into a
reply. The chat template is ``trainers.templates.HERMES_COMPACT`` (hermes calls; no tool list in
the prompt: the model learns its tools here).

Routing: a small model does not follow the router's prompt by itself, so SFT also teaches the
form: prompts built by ``trainers.router.routing_messages`` over random subsets of the structural
labeller's capabilities, answered with the option whose capability the task's kind needs (or
0). The options' order and numbering vary, so the model has to read them.
"""
from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Callable

import torch

from trainers.templates import CHAT_FORMATS, HERMES_COMPACT

SPECIALS = CHAT_FORMATS["hermes"][1] + ["[UNK]"]
GLUE = ['{"name": "', '", "arguments": {"', '": "', '", "', '"}}', '": ', "}}"]
PIECES = r"\s+|\d{1,3}|[^\W\d]+|[^\w\s]"


#: policy lines a helpdesk might give its agent: SFT shows the base agent random selections of
#: them in place of the target's policy, so that it acts on the conversation rather than on one
#: exact system prompt (an agent you already have was not trained on your policy text either)
POLICY_LINES = [
    "You are a service agent.", "You are the IT helpdesk assistant.", "You are a helpful assistant.", "You help users with their tickets.",
    "Use only the tools you are given and the records they return.",
    "Never invent ids or values: take them from the user or from tool results.",
    "One tool call at a time; answer the user in plain text between tool calls.",
    "Before close_ticket, read the ticket with get_ticket_details and check its status.",
    "close_ticket may only be used when the status is 'active'.",
    "When a check fails, make no change and tell the user which check failed.",
    "Before close_ticket, tell the user what you will do and ask them to confirm.",
    "If the user says no, make no change.", "Be brief and polite.",
    "Do not share one user's tickets with another user.", "Write in plain English.",
]


def policy_variant(rng: random.Random, noise: float = 0.5, distractors: list[str] = ()) -> str:
    """A random selection of ``POLICY_LINES``, in random order, one per line; with probability
    ``noise`` a line or two join them that must not change what the agent does: made-up words
    (the tokenizer has never seen them) or one of ``distractors`` (the demo passes the router's
    capability lines: a policy may talk about skills without the agent being asked to route)."""
    lines = rng.sample(POLICY_LINES, rng.randint(1, len(POLICY_LINES)))
    if rng.random() < noise:
        for _ in range(rng.randint(1, 2)):
            if distractors and rng.random() < 0.5:
                line = rng.choice(distractors)
            else:
                line = " ".join("".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou")
                                        for _ in range(rng.randint(2, 4)))
                                for _ in range(rng.randint(3, 12))).capitalize() + "."
            lines.insert(rng.randint(0, len(lines)), line)
    return "\n".join(("- " if i and rng.random() < 0.5 else "") + x for i, x in enumerate(lines))


def fit_tokenizer(texts: list[str], tools: list[str] = ()):
    """A word-level tokenizer over ``texts`` (see the module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECES), behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS, min_frequency=1, show_progress=False)
    numbers = [str(i) for i in range(1000)] + [f"{i:02d}" for i in range(100)] + [f"{i:03d}" for i in range(100)]
    base = numbers + list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["\n", " ", "\n\n", "  "] + \
        "system user assistant tool".split()
    tok.train_from_iterator(base + texts, trainer=trainer)
    tok.add_tokens(GLUE + [f'{name}", "arguments": {{"' for name in tools])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="[UNK]", chat_template=HERMES_COMPACT,
                                   clean_up_tokenization_spaces=False)


def episode_tokens(policy, messages: list[dict]) -> tuple[list[int], list[int]]:
    """The token sequence of an episode as a rollout builds it, with mask 1 on the assistant's
    own turns (up to and including their end-of-turn token), except a turn marked
    ``"train": False``."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    tokens = policy.encode(policy.render(messages[:first], add_generation_prompt=True))
    mask = [0] * len(tokens)
    i = first
    while i < len(messages):
        action = messages[i]
        prev = policy.render(messages[:i], add_generation_prompt=True)
        seg = policy.render(messages[:i + 1])[len(prev):]
        cut = seg.rfind(policy.eot) + len(policy.eot)
        ids = policy.encode(seg[:cut])
        tokens += ids
        mask += [int(action.get("train", True))] * len(ids)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j > i + 1 and j < len(messages):
            glue = policy.encode(policy.continuation(messages[:i], action, messages[i + 1:j], None))
            tokens += glue
            mask += [0] * len(glue)
        i = j
    return tokens, mask


def prompt_tokens(policy, messages: list[dict], answer: str) -> tuple[list[int], list[int]]:
    """A one-turn example: the prompt, then ``answer`` and the end-of-turn token (mask 1)."""
    prompt = policy.encode(policy.render(messages, add_generation_prompt=True))
    ans = policy.encode(answer) + [policy.eot_id]
    return prompt + ans, [0] * len(prompt) + [1] * len(ans)


class CopyTask:
    """A synthetic copy task: random words with one key and its value among them, then the key
    again; the loss is on the value. Keys and values come in kinds: ``TCK -`` and a number (an id),
    plus ``fields`` (a field's name and its possible values, e.g. ``status`` and the statuses,
    ``resolution`` and the codes; the key is the name and JSON's ``": "`` both times, so for a
    code, which the user writes as ``resolution: fixed``, the warm-up teaches the lookup by the
    value's word class more than by the key). It teaches what acting on what one read needs (find
    the key seen earlier, emit its value: an id or a code into a tool call, a status from a record
    into a reply), which SFT on whole demonstrations alone does not teach a model this small in
    minutes. Stands in for the
    pretraining any real base model has had; SFT keeps a copy batch in every step so the skill is
    not forgotten."""

    def __init__(self, tokenizer, seed: int = 0, batch_size: int = 32,
                 fields: dict[str, list[str]] | None = None):
        vocab = tokenizer.get_vocab()
        numbers = [v for k, v in vocab.items() if k.isdigit() and len(k) == 3 and k[0] != "0"]
        self.names = ["id"] + list(fields or {})
        self.kinds = [(torch.tensor([vocab["TCK"], vocab["-"]]), torch.tensor(sorted(numbers)))]
        for name, values in (fields or {}).items():
            self.kinds.append((torch.tensor([vocab[name], vocab['": "']]),
                               torch.tensor([vocab[v] for v in values if v in vocab])))
        self.words = torch.tensor(sorted(v for k, v in vocab.items() if not k.isdigit() and k not in SPECIALS))
        self.g = torch.Generator().manual_seed(seed)
        self.batch_size = batch_size
        self.turn = 0

    def loss(self, model, kind: int | None = None) -> torch.Tensor:
        """The loss of one batch of ``kind`` (by default the kinds in turn)."""
        b, g = self.batch_size, self.g
        if kind is None:
            kind, self.turn = self.turn % len(self.kinds), self.turn + 1
        key, values = self.kinds[kind]
        n = int(torch.randint(6, 40, (1,), generator=g))
        ids = self.words[torch.randint(0, len(self.words), (b, n), generator=g)]
        at = int(torch.randint(0, n - 3, (1,), generator=g))
        x = values[torch.randint(0, len(values), (b,), generator=g)]
        ids[:, at:at + 2], ids[:, at + 2] = key, x
        ids = torch.cat([ids, key.expand(b, 2), x[:, None]], 1).to(model.device)
        return torch.nn.functional.cross_entropy(model(input_ids=ids).logits[:, -2].float(), x.to(model.device))

    @torch.no_grad()
    def kind_losses(self, model, batches: int = 4) -> dict[str, float]:
        """Each kind's mean loss over ``batches`` fresh batches (no learning)."""
        was = model.training
        model.eval()
        out = {name: round(sum(float(self.loss(model, k)) for _ in range(batches)) / batches, 4)
               for k, name in enumerate(self.names)}
        model.train(was)
        return out


def word_classes(model, tokenizer, classes: list[list[str]], scale: float = 3.0, seed: int = 0) -> None:
    """Give each class of words (the numbers, always; then ``classes``, e.g. a record field's
    values) a shared direction in the embeddings, as a pretrained model's embeddings group related
    words, so that an attention head can find "the id in the context" or "the status in the
    record" by content from the start."""
    emb = model.get_input_embeddings().weight
    vocab = tokenizer.get_vocab()
    g = torch.Generator().manual_seed(seed)
    for words in [[k for k in vocab if k.isdigit()]] + classes:
        ids = [vocab[w] for w in words if w in vocab]
        shared = torch.randn(emb.shape[1], generator=g)
        with torch.no_grad():
            emb[ids] += scale * float(emb.std()) * shared


def pretrain_copy(model, tokenizer, *, steps: int = 500, max_steps: int | None = None, target: float = 0.1,
                  batch_size: int = 32, lr: float = 1e-3, warmup: int = 100, seed: int = 0,
                  fields: dict[str, list[str]] | None = None,
                  progress: Callable[[int, int, float], None] | None = None) -> dict:
    """At least ``steps`` of the copy task alone (``CopyTask``), the learning rate warmed up
    linearly over ``warmup`` steps, then 100 more at a time until every kind's loss on fresh
    batches is below ``target`` or ``max_steps`` (default ``3 * steps``) are spent; returns
    ``{"steps", "losses": {kind: loss}, "learnt"}``. (Measured: at 3e-3 without warm-up one seed in
    three never learnt the task; at 1e-3 with 100 warm-up steps three of three reached loss 0.1 by
    step 500; but whether the id copy is learnt by step 500 also depends on the order of the
    batches, so each kind is checked, not the last batch's loss.) ``progress`` gets (step, steps
    planned: ``steps``, then ``max_steps`` once it goes on, loss) after each step."""
    task = CopyTask(tokenizer, seed, batch_size, fields)
    probe = CopyTask(tokenizer, seed + 7919, 64, fields)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, warmup)))
    max_steps = 3 * steps if max_steps is None else max(steps, max_steps)
    model.train()
    done, losses, first = 0, {}, True
    while True:
        for _ in range(steps if first else min(100, max_steps - done)):
            loss = task.loss(model)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            done += 1
            if progress is not None:
                progress(done, steps if first else max_steps, float(loss.detach()))
        first = False
        losses = probe.kind_losses(model)
        if max(losses.values()) < target or done >= max_steps:
            break
    model.eval()
    return {"steps": done, "losses": losses, "learnt": max(losses.values()) < target}


def sft(model, examples: list[tuple[list[int], list[int]]], pad_id: int, *, epochs: int = 8,
        batch_size: int = 16, lr: float = 3e-3, seed: int = 0, copy: CopyTask | None = None,
        progress: Callable[[int, int, float], None] | None = None) -> list[float]:
    """Next-token cross-entropy on the masked tokens (plus ``copy``'s loss each step, if given);
    linear warm-up and cosine decay. Returns the mean SFT loss per epoch."""
    from trainers.grpo import batch_tensors
    from trainers.rollout import Episode
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * math.ceil(len(examples) / batch_size)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / steps))))
    model.train()
    losses, step = [], 0
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))  # similar lengths per batch
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for epoch in range(epochs):
        total = 0.0
        for b in torch.randperm(len(batches), generator=g).tolist():
            eps = [Episode(0, tokens=examples[i][0], mask=examples[i][1]) for i in batches[b]]
            ids, attn, mask = (t.to(model.device) for t in batch_tensors(eps, pad_id))
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            m = mask[:, 1:]
            loss = (nll * m).sum() / m.sum().clamp(min=1)
            opt.zero_grad(set_to_none=True)
            (loss + copy.loss(model) if copy is not None else loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            value = float(loss.detach())
            total += value
            if progress:
                progress(step, steps, value)
        losses.append(total / len(batches))
    model.eval()
    return losses


def route_examples(tasks: list[tuple[str, str | None]], capabilities: list, rng: random.Random,
                   per_task: int = 1) -> list[tuple[list[dict], str]]:
    """Routing prompts (``routing_messages``, no example tasks) with their right answer: for each
    (task text, the capability it needs or None), ``per_task`` random option lists drawn from
    ``capabilities`` (name, description) in random order, always holding the needed one; the
    answer is its name (``"none"`` for None), as the router scores answers.

    Half the lists hold every capability the tasks need (then the rest at random): the options a
    router meets are the adapters trained for these tasks, and with random lists alone two
    capabilities needed by similar tasks seldom stand side by side, so the model learns which
    capabilities suit a kind of task and not which of them this task needs (measured: a seed's
    router sent every request without the waiver to the other close adapter, 0.83 to 0.17)."""
    from trainers.router import NONE, AdapterInfo, routing_messages
    needed = [c for c in capabilities if c.name in {n for _, n in tasks}]
    out = []
    for text, need in tasks:
        for _ in range(per_task):
            k = rng.randint(1, min(4, len(capabilities)))
            chosen = rng.sample(capabilities, k)
            if rng.random() < 0.5:
                rest = [c for c in chosen if c not in needed]
                chosen = needed + rest[:max(0, k - len(needed))]
                rng.shuffle(chosen)
                k = len(chosen)
            if need is not None and need not in [c.name for c in chosen]:
                chosen[rng.randrange(k)] = next(c for c in capabilities if c.name == need)
            infos = [AdapterInfo("x_" + c.name.replace(" ", "_"), Path("."), c.name, c.description)
                     for c in chosen]
            out.append((routing_messages(text, infos, 0), need or NONE))
    return out


def save_model(path: Path, tokenizer, *, hidden: int, layers: int, heads: int, seed: int):
    """A fresh Llama-style model over ``tokenizer`` (``trainers.tiny.make_model``), saved with the tokenizer."""
    from trainers.tiny import make_model
    model = make_model(tokenizer, "llama3", hidden=hidden, layers=layers, heads=heads,
                       intermediate=hidden * 8 // 3, seed=seed, max_positions=2048, tie_embeddings=True)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return model


def timed(fn, *a, **kw):
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0
