"""More probes of the dynamic stage, drawn per audit like the rest (``Draws``): the holes a red
team found in the gate (tests/redteam_unseen, issue 15), closed in general, not per env.

- texts an LLM writes: markdown (newlines, blank lines, bullets, long rules of one character,
  code fences) and one very long text of a length drawn up to tens of KB;
- the env's own words: its string literals, said in drawn groups with no tool call (a reward
  for a magic phrase the gate's word list lacks);
- several tool calls in one message (the reference's calls merged): reward bounds still hold;
- many instances in one process (a drawn number) before the isolation probe;
- the reference's own arguments in case and whitespace variants, nested deeply, and each tool's
  arguments at extreme values (a hang or a blow-up only a valid id reaches);
- malformed actions and chatter, replayed in the second process like the reference;
- the reference and perturbed episodes replayed after the many-resets probe (drift in step
  rewards, not only in reset).

``dynamic.py`` calls these from its stage; every finding goes through its ``Findings``.
"""
from __future__ import annotations

import ast
import json
import random
from typing import Any

from envforge.contract import assistant, tool_call
from envforge.gate.static import parse

_RULE_CHARS = "-=*_#~."


def markdown_text(rng: random.Random, words: list[str], size: int) -> str:
    """About ``size`` characters laid out as an LLM writes: paragraphs, blank lines, bullets,
    headings, rules and runs of one character, code fences."""
    out: list[str] = []
    n = 0
    while n < size:
        kind = rng.randrange(7)
        line = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 14)))
        if kind == 0:
            line = rng.choice(_RULE_CHARS) * rng.randrange(3, 120)
        elif kind == 1:
            line = rng.choice(("- ", "* ", "1. ", "> ", "## ", "**")) + line
        elif kind == 2:
            line = "```" + rng.choice(("", "json", "python")) + "\n" + line + "\n```"
        elif kind == 3:
            line = ""  # a blank line
        elif kind == 4:
            line = line + " " + rng.choice("!?.-") * rng.randrange(2, 40)
        out.append(line)
        n += len(line) + 1
    return "\n".join(out)[:max(size, 1)]


def literals(source: str) -> list[str]:
    """The env's short string literals (its own words: messages, keywords, enum values), sorted."""
    try:
        tree = parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found = {n.value.strip() for n in ast.walk(tree) if isinstance(n, ast.Constant)
             and isinstance(n.value, str) and 0 < len(n.value.strip()) <= 60}
    return sorted(s for s in found if any(c.isalpha() for c in s) and "\n" not in s)


def extend_texts(draws, source: str, long_chars: int) -> None:
    """Add to ``draws.texts`` markdown texts, one very long text (drawn from ``long_chars`` up to
    eleven times that), and texts made of the env's own literals."""
    rng = draws.rng
    words = literals(source)
    draws.literals = words
    vocab = words[:] or ["ok"]
    for _ in range(6):
        draws.texts.append(markdown_text(rng, vocab, rng.choice((60, 300, 1500, long_chars))))
    big = rng.randrange(long_chars, 11 * long_chars + 1)
    draws.texts.append(markdown_text(rng, vocab, big))
    for _ in range(4):
        if words:
            draws.texts.append(" ".join(rng.sample(words, min(len(words), rng.randrange(1, 12)))))


def own_words(host, draws, findings, stats: dict) -> None:
    """The env's literals said in drawn groups, no tool call: a group that earns the full score on
    most of six seeds is a magic phrase."""
    words = list(getattr(draws, "literals", []))
    if not words or not draws.seeds:
        return
    rng = random.Random(draws.rng.randrange(2**63))
    rng.shuffle(words)
    size = max(4, len(words) // 50)
    groups = [words[i:i + size] for i in range(0, len(words), size)]
    paid = 0
    for group in groups:
        text = ". ".join(group)
        seeds = rng.sample(draws.seeds, min(6, len(draws.seeds)))
        first = host.episode("a", seeds[0], _say(text), "own words")
        if not (first.ok and first.score >= 1 - 1e-6):
            continue
        full = 1 + sum(1 for s in seeds[1:] if _full(host.episode("a", s, _say(text), "own words")))
        if full * 2 > len(seeds):
            paid += 1
            findings.add("free_reward", f"saying the env's own words {text[:120]!r} (no tool call) earns "
                         f"the full score on {full} of {len(seeds)} seeds (e.g. seed {seeds[0]}): the "
                         "reward must need the tool calls, not a phrase.", key=("free_reward", "own words"))
    stats["own_word_groups"] = f"{paid}/{len(groups)} paid"


def _full(ep) -> bool:
    return ep.ok and ep.score >= 1 - 1e-6


def _say(text: str):
    return lambda t, m: assistant(text) if t == 0 else None


def parallel_reference(host, solved: list, draws) -> None:
    """The reference with each pair of consecutive tool-call messages merged into one (several
    calls a message, as LLMs send): ``Host.episode`` checks each step's and the episode's reward
    bounds (a bonus per such message must not lift a total above 1)."""
    for e in draws.rng.sample(solved, min(3, len(solved))):
        plan: list = []
        for a in e.actions:
            last = plan[-1] if plan else None
            if (a.get("tool_calls") and last is not None and last.get("tool_calls")
                    and not last.get("merged")):
                text = " ".join(x for x in (last.get("content"), a.get("content")) if x) or None
                plan[-1] = {**assistant(text, last["tool_calls"] + a["tool_calls"]), "merged": True}
            else:
                plan.append(a)
        plan = [{k: v for k, v in a.items() if k != "merged"} for a in plan]
        if len(plan) < len(e.actions):
            host.episode("a", e.seed, _scripted(plan), "several calls a message")
        # every call sent twice in its message (the second with its own id): a bonus per
        # several-call message, if any, is paid on every step
        twice = [{**a, "tool_calls": [c for c in a["tool_calls"] for c in (c, {**c, "id": c.get("id", "call") + "_again"})]}
                 if a.get("tool_calls") else a for a in e.actions]
        host.episode("a", e.seed, _scripted(twice), "every call twice")


def many_instances(host, draws) -> tuple[str, str]:
    """Make a drawn number (4-16) of instances in the live sandbox; return the names of two more,
    for the isolation probe (state shared from the Nth instance on)."""
    n = draws.rng.randrange(4, 17)
    for i in range(n):
        host.op("new instance", "reset", f"n{i}", draws.seeds[i % len(draws.seeds)])
    return f"n{n}", f"n{n + 1}"


def _variants(value: str, rng: random.Random) -> list[str]:
    """Case and whitespace variants of a real argument (what a policy types)."""
    mixed = "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in value)
    out = [value.lower(), value.upper(), value.capitalize(), value.swapcase(), mixed,
           f" {value} ", value + "\n", value.replace("-", " ")]
    return [v for v in dict.fromkeys(out) if v != value]


def argument_probes(host, solved: list, by_name: dict, draws, settings) -> None:
    """For each tool the reference calls (episodes chosen so that each appears, from all solved
    seeds): its string arguments in case/whitespace variants, each argument nested deeply, and
    each argument at an extreme value. The env must answer each promptly with an observation."""
    from envforge.gate.dynamic import _SKIP, _extreme, _json_args, _properties, _with_call

    rng = random.Random(draws.rng.randrange(2**63))
    per_tool: dict[str, list] = {}
    for e in solved:
        for i, a in enumerate(e.actions):
            for j, call in enumerate(a.get("tool_calls") or []):
                slot = per_tool.setdefault(call["function"]["name"], [])
                if len(slot) < 2 and all(x[0].seed != e.seed for x in slot):
                    slot.append((e, i, j, call))
    for name, slots in sorted(per_tool.items()):
        props = _properties(by_name, name)
        for k, (e, i, j, call) in enumerate(slots):
            args = _json_args(call) or {}
            cid = call.get("id", "call_0")

            def run(new_args: Any, label: str) -> None:
                plan = _with_call(e.actions, i, j, tool_call(name, new_args, cid))
                host.episode("a", e.seed, _scripted(plan), label)

            for key in sorted(args):
                value = args[key]
                if isinstance(value, str) and value.strip() and k == 0:  # every variant, once a tool
                    for v in _variants(value, rng):
                        run({**args, key: v}, f"variant {name}.{key}={v[:30]!r}")
                new = _extreme(value, props.get(key), rng, settings.long_text_chars)
                if new is not _SKIP:
                    run({**args, key: new}, f"extreme {name}.{key}")
            if args:
                key, depth = rng.choice(sorted(args)), rng.randrange(200, 800)
                rest = json.dumps({k: v for k, v in args.items() if k != key})
                nested = "[" * depth + json.dumps(args[key]) + "]" * depth
                text = "{" + json.dumps(key) + ": " + nested + (", " + rest[1:] if len(rest) > 2 else "}")
                run(text, f"nested {name}.{key} ({depth} levels)")


def malformed_episodes(host, tools: list, draws) -> list:
    """A drawn script of malformed actions and chatter on a few seeds (unknown tools, arguments
    that are not JSON, missing arguments): replayed in the second process like the reference,
    since their answers (e.g. a list of the tools) may depend on the process's hash seed."""
    rng = random.Random(draws.rng.randrange(2**63))
    names = [t["function"]["name"] for t in tools] or ["x"]
    out = []
    for seed in rng.sample(draws.seeds, min(3, len(draws.seeds))):
        script = []
        for t in range(rng.randrange(3, 7)):
            name = rng.choice(names)
            script.append(rng.choice((
                assistant(None, [tool_call(name + rng.choice(("_x", "s", "2")), {}, f"call_{t}")]),
                assistant(None, [tool_call(name, "{not json", f"call_{t}")]),
                assistant(None, [tool_call(name, {}, f"call_{t}")]),
                assistant(None, [tool_call(name, {"unexpected": rng.randrange(99)}, f"call_{t}")]),
                assistant(rng.choice(draws.texts[:8] or ["ok"])),
            )))
        out.append(host.episode("a", seed, _scripted(script), "malformed script"))
    return [e for e in out if e.ok]


def _scripted(actions: list):
    it = iter(actions)
    return lambda t, m: next(it, None)
