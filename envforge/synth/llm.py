"""The LLM synthesizer: the prompt that asks a model for env.py, the extraction of code from its
reply, and the repair request that carries the gate's findings back.

- :func:`prompt_messages`: a system message (the role, the env contract, the reward-design rules
  that make GRPO learn) and a user message (the capability with its description and failing
  example trajectories, the target's exact tool schemas, its policy, what to write).
- :func:`extract_code`: the largest fenced ```python block, else the whole reply when it parses
  as Python. A reply without code, with truncated code (an unterminated fence, or a syntax error
  at the end of the text) or a refusal is a failed attempt, described by a :class:`Finding` with
  check ``input`` or ``static.syntax`` (what :data:`envforge.contract.CHECKS` allows).
- :func:`repair_message`: the findings of a rejected attempt, and its code, as the next request.

The contract text here is envforge's own concise statement of ENV_CONTRACT.md (v1), kept beside
``envforge/contract.py``, which is its code form; the allow-lists are rendered from that module so
the two cannot drift.
"""
from __future__ import annotations

import json
import re

from envforge import contract as C
from envforge.contract import Finding, error
from envforge.gate.static import parse  # thread-safe ast.parse
from envforge.targets import Target


MAX_POLICY_CHARS = 12_000
MAX_EXAMPLE_CHARS = 6_000
MAX_FINDINGS = 12

SYSTEM = """You write training environments for tool-using LLM agents. Each environment is one \
self-contained Python file, env.py, that trains ONE capability the agent lacks on a target \
environment, with the target's own tools. Reinforcement learning (GRPO, several rollouts per \
seed compared with each other) will train a LoRA adapter on it; an automatic gate audits the file \
first and rejects anything that breaks the contract below. Reply with the complete env.py in one \
```python code block and nothing else."""

CONTRACT = """## The env.py contract (v{version})

```python
\"\"\"Capability: <the capability>.

Why it transfers: 3-5 sentences on how this environment exercises the capability with the
target's own tools, so that what the adapter learns here carries over to the target.
\"\"\"
import json
import random

CAPABILITY = "<the capability>"                  # required, a non-empty string literal
SKILLS = {{"<sub-skill>": 0.6, "<other>": 0.4}}   # optional: sub-skills and sampling weights

class Env:
    tools = [...]        # required: OpenAI function-calling schemas, copied from the target
    max_turns = 10       # optional, default {default_turns}, at most {max_turns}

    def reset(self, seed): ...   # -> (observation, info)
    def step(self, action): ...  # -> (observation, reward, terminated, truncated, info)
    def solve(self, seed): ...   # -> list of assistant messages
```

The file:
- imports only: {imports};
- never names {builtins}; uses no dunder attribute at all (no __class__, __dict__, __globals__ ...),
  and getattr/setattr/hasattr only with a string literal;
- has no wall clock or entropy: no datetime.now/today, no module-level random.random()/choice()...;
  all randomness comes from random.Random(seed) made in reset (and in solve for the same seed);
- is at most {max_bytes:,} bytes.

Messages are OpenAI chat messages, plain dicts:
- system/user: {{"role": "system"|"user", "content": str}}
- assistant: {{"role": "assistant", "content": str | None, "tool_calls": [{{"id": str, "type": "function",
  "function": {{"name": str, "arguments": str}}}}]}} (tool_calls optional; arguments is a JSON STRING)
- tool result: {{"role": "tool", "tool_call_id": str, "content": str}}

reset(seed) -> (observation, info): starts a new episode, forgetting the last one. observation =
{{"messages": [system message (the policy/instructions), then at least one user message]}}. info is a
dict; when SKILLS is declared, info["skill"] names this episode's sub-skill (a key of SKILLS).

step(action) -> (observation, reward, terminated, truncated, info): action is one assistant
message. observation = {{"messages": [...]}} holds one tool message per tool call, in the same order,
with the call's id, and/or one user message (the simulated user's reply to assistant text).
- A call of an unknown tool, arguments that are not valid JSON or that do not fit the tool's
  schema, a tool_calls that is not a list, content that is not a string, a message that is not a
  dict: NEVER an exception. Answer with a tool message saying what was wrong, as a real service
  would. The gate sends thousands of malformed and random actions.
- reward is a float in [0, 1]; the episode's score (the sum of its rewards) is in [0, 1] too.
  Return 0.0 until the final step, then the score.
- terminated: the episode reached an end (task done, user left, an irreversible wrong action).
  truncated: max_turns steps were taken without that. Set one of them by max_turns at the latest.

solve(seed) -> list of assistant messages that, sent one by one after reset(seed), earn score 1.0.
Every tool call in it must validate against its tool's schema.

The gate also checks: observations, infos and actions are plain JSON (dicts with str keys, lists,
str, numbers, bool, None) and round-trip through json; the same seed and actions give identical
results in one instance, in two instances and in two processes with different PYTHONHASHSEED (so no
set iteration order, no hash() or id() in outputs); instances share no mutable state (copy
module-level data per reset; keep episode state on self, all of it rebuilt by reset: an instance
reset to a seed holds the same state whatever it played before); no functools.lru_cache or
functools.cache (process-wide); every call returns in a few seconds.
"""

REWARD_RULES = """## Reward design (what makes GRPO learn, and what the gate measures)

- Use the target's tools EXACTLY: same names, parameters, descriptions and formats. Copy the
  schemas below into Env.tools unchanged (the gate compares canonical JSON); implement only the few
  tools the capability needs, on a synthetic database generated from the seed. No invented tools.
- One skill per environment (a few sub-skills at most, declared in SKILLS with weights).
- Procedural generation from random.Random(seed): deterministic per seed, meaningfully different
  across seeds (at least 90% of 50 seeds must give distinct scenarios), too many to memorise.
- Partial credit: several score levels, not just 0 and 1 (e.g. 0.4 for reading the record first +
  0.6 for the right decision), so that rollouts on one seed differ and the group has a gradient.
  Dropping one action of the reference solution, or changing one of its arguments, must lower the
  score.
- No free reward: an agent that only chats, or calls tools at random with schema-valid arguments,
  must average at most 0.3 (aim for 0.0-0.1). Reward the task, never the ending of the episode.
- Credit only what the capability asks for: a refusal only for the reason that holds and no other
  (one naming every reason must not pay), a wrong reason ends the episode or lowers the score (a
  guess retried turn after turn must not pay), only the write itself earns what the write does
  (not a text saying it is done, not another tool such as a transfer), each argument exactly as
  asked (no value that always passes), and no bonus per repeated question or call.
- solve(seed) must score exactly 1.0 on (almost) every seed (at least 95%).
- A simulated user (scripted, deterministic) that answers assistant text: confirms, declines,
  gives requested details, leaves after a few idle turns.
- In the docstring, 'Why it transfers:' explains in 3-5 sentences why training here helps on the
  target.
"""


def contract_text() -> str:
    return CONTRACT.format(
        version=C.CONTRACT_VERSION, imports=", ".join(sorted(C.ALLOWED_IMPORTS)),
        builtins=", ".join(sorted(b for b in C.FORBIDDEN_BUILTINS if not b.startswith("__")))
        + ", __import__", default_turns=C.DEFAULT_MAX_TURNS, max_turns=C.MAX_TURNS_LIMIT,
        max_bytes=C.MAX_SOURCE_BYTES)


def prompt_messages(capability: str, description: str, target: Target,
                    examples: list[str] | None = None) -> list[dict]:
    """The first request: system and user message."""
    parts = [f"# Capability to train: {capability}"]
    if description:
        parts.append(f"Description: {description}")
    if examples:
        parts.append("## Failing trajectories where the agent lacked it\n\n" + "\n\n".join(
            f"### Example {i + 1}\n{ex[:MAX_EXAMPLE_CHARS]}" for i, ex in enumerate(examples[:3])))
    parts.append(f"## Target: {target.name}\n\nThe agent's tools, exactly as the target defines "
                 "them (OpenAI function-calling schemas):\n\n```json\n"
                 + json.dumps(target.tools, indent=1, ensure_ascii=False) + "\n```")
    if target.meta:
        kinds = {n: m.get("tool_type") or ("write" if m.get("mutates_state") else None)
                 for n, m in target.meta.items()}
        kinds = {n: k for n, k in kinds.items() if k}
        if kinds:
            parts.append("Tool kinds: " + ", ".join(f"{n}: {k}" for n, k in kinds.items()))
    if target.policy:
        policy = target.policy[:MAX_POLICY_CHARS]
        if len(target.policy) > MAX_POLICY_CHARS:
            policy += "\n[... policy truncated ...]"
        parts.append("## The target's policy (what the agent is told there)\n\n" + policy)
    parts.append(contract_text())
    parts.append(REWARD_RULES)
    parts.append(f"Write env.py for the capability {capability!r} (CAPABILITY = "
                 f"{json.dumps(capability)}, as written) on this target now: the complete file in one "
                 "```python block.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


# ============================================================================= extraction

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)
_OPEN_FENCE = re.compile(r"```[ \t]*(python|py|python3)?[ \t]*\n", re.I)
_REFUSAL = re.compile(r"\b(i can(?:no|')t|i cannot|i am unable|i'm unable|i won't|i will not|i'm sorry|"
                      r"i am sorry|as an ai|i must decline|not able to (help|assist|comply))\b", re.I)


def extract_code(reply: str) -> tuple[str | None, Finding | None]:
    """(code, None) or (None, the finding that says why the reply holds no usable code)."""
    text = reply or ""
    fences = list(_FENCE.finditer(text))
    python = [m.group(2) for m in fences if m.group(1).lower() in ("python", "py", "python3", "")]
    if python:
        return _checked(max(python, key=len), fenced=True)
    opened = _OPEN_FENCE.search(text, fences[-1].end() if fences else 0)
    if opened:  # a fence that never closes: the reply was cut off
        code = text[opened.end():]
        return None, error("static.syntax", "the reply was truncated: its ```python block is never "
                           f"closed ({len(code.splitlines())} lines, ending "
                           f"{_tail(code)}); reply with the complete file", actual=_tail(code))
    stripped = text.strip()
    if not stripped:
        return None, error("input", "the reply was empty: it held no code; reply with the complete "
                           "env.py in one ```python block")
    if _looks_like_code(stripped):
        return _checked(stripped, fenced=False)
    if _REFUSAL.search(stripped[:400]):
        return None, error("input", "the reply was a refusal, not code: "
                           f"{stripped[:160]!r}. The task is a harmless training environment; "
                           "reply with the complete env.py in one ```python block",
                           actual=stripped[:300])
    return None, error("input", f"the reply held no code ({len(stripped)} characters of prose, no "
                       "```python block); reply with the complete env.py in one ```python block",
                       actual=stripped[:300])


def _looks_like_code(text: str) -> bool:
    return bool(re.search(r"^(import |from \w+ import |class Env\b|CAPABILITY\s*=|\"\"\"|def )", text, re.M))


def _tail(code: str) -> str:
    last = [ln for ln in code.rstrip().splitlines() if ln.strip()][-1:] or [""]
    return repr(last[0].strip()[:80])


def _checked(code: str, fenced: bool) -> tuple[str | None, Finding | None]:
    """Code that parses; code whose syntax error sits on its last line (at EOF) reads as
    truncated; other syntax errors in fenced code go to the gate, which reports them."""
    try:
        parse(code)
    except SyntaxError as e:
        lines = code.rstrip().splitlines()
        at_end = e.lineno is not None and e.lineno >= len(lines)
        if at_end or "was never closed" in (e.msg or "") or "EOF" in (e.msg or ""):
            return None, error("static.syntax", f"the code was truncated: line {e.lineno}: {e.msg} at "
                               f"the end of the file (ending {_tail(code)}); reply with the complete "
                               "file", actual=_tail(code))
        if not fenced:
            return None, error("input", "the reply held no ```python block and is not valid Python "
                               f"(line {e.lineno}: {e.msg}); reply with the complete env.py in one "
                               "```python block")
        return code.strip("\n") + "\n", None  # an ordinary syntax error: the gate reports it
    except (ValueError, RecursionError, MemoryError) as e:
        return None, error("static.syntax", f"the code cannot be parsed ({type(e).__name__})")
    return code.strip("\n") + "\n", None


# ============================================================================= repair


def _finding_text(f: dict) -> str:
    text = f"- [{f['check']}] {f['message'][:700]}"
    if f.get("check") == "schema.fidelity" and f.get("expected") is not None:
        text += "\n  the target's schema: " + json.dumps(f["expected"], ensure_ascii=False)[:1500]
    return text


def repair_message(findings: list[dict], code: str | None, stats: dict | None = None) -> str:
    """The request after a rejected attempt: what the gate found, and the code it audited."""
    errors = [f for f in findings if f.get("severity", "error") == "error"][:MAX_FINDINGS]
    lines = ["The gate rejected this env.py. Its findings (fix every one):", ""]
    lines += [_finding_text(f) for f in errors]
    if stats and stats.get("mean_score"):
        lines += ["", f"Measured: mean scores {json.dumps(stats['mean_score'])}, solved "
                      f"{stats.get('solved')}, distinct scenarios {stats.get('distinct_scenarios')}, "
                      f"score values {stats.get('score_values')}."]
    if code is not None:
        lines += ["", "The code it audited:", "", "```python", code.rstrip("\n"), "```"]
    lines += ["", "Reply with the complete corrected env.py in one ```python block."]
    return "\n".join(lines)

