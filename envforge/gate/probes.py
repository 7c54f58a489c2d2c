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
- malformed actions and chatter, replayed in every other process like the reference;
- the reference and perturbed episodes replayed after the many-resets probe (drift in step
  rewards, not only in reset);
- reads that decide: the reference's checks (reads that find no id a later call sends) removed,
  or sent for another record, must lower the score; for a capability about reading, whether
  the reference acts must not be readable off the opening message.

``dynamic.py`` calls these from its stage; every finding goes through its ``Findings``.
"""
from __future__ import annotations

import ast
import itertools
import json
import math
import random
import re
import time
from collections import Counter
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


def long_text(draws, long_chars: int) -> tuple[int, str]:
    """A seed and a markdown text of six to eleven times ``long_chars``, drawn from a generator
    of their own (seeded from the probe seed), so that every other draw stays as it was."""
    rng = random.Random(f"long text {draws.probe_seed}")
    size = rng.randrange(6 * long_chars, 11 * long_chars + 1)
    return rng.choice(draws.seeds), markdown_text(rng, list(getattr(draws, "literals", [])) or ["ok"], size)


def long_talk(host, draws, long_chars: int) -> None:
    """One episode that says a text of tens of KB every turn: the drawn texts' longest is drawn
    from ``long_chars`` up, so one audit in many sends nothing above a buffer or a slow path a
    little over ``long_chars``; this one always does. ``Host.episode`` turns a crash or a hang
    into a finding."""
    seed, text = long_text(draws, long_chars)
    host.episode("a", seed, lambda t, m: assistant(text), "a text of tens of KB")


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


def argument_probes(host, solved: list, by_name: dict, kinds: dict, draws, settings, findings,
                    beside: list = ()) -> None:
    """For each tool the reference calls (episodes chosen so that each appears, from all solved
    seeds, then from ``beside``, solved seeds drawn beside the audit's, for a tool none of them
    calls): its string arguments in case/whitespace variants, each argument nested deeply, and
    each argument at an extreme value. The env must answer each promptly with an observation.
    For a tool that is not a read, an integer the user asked for (its value in the opening) that
    a value of its range replaces at the full score, and the value asked itself, are sent so on
    up to 4 more seeds that asked for another (the solved seeds, then drawn ones: few may call
    the tool): one value paid whatever was asked (3 seeds, a quarter) is a ``partial_credit``
    finding ("a full term is always fine")."""
    from envforge.gate.dynamic import _SKIP, _call_name, _drawn_solved, _extreme, _json_args, _properties, _with_call

    rng = random.Random(draws.rng.randrange(2**63))
    asking: dict = {}  # (tool, argument) -> the seeds drawn for it (seeds_asking, below)
    per_tool: dict[str, list] = {}

    def take(e, only=None) -> None:
        for i, a in enumerate(e.actions):
            for j, call in enumerate(a.get("tool_calls") or []):
                name = _call_name(call)
                if name is None or (only is not None and name not in only):
                    continue
                slot = per_tool.setdefault(name, [])
                if len(slot) < 2 and all(x[0].seed != e.seed for x in slot):
                    slot.append((e, i, j, call))

    for e in solved:
        take(e)
    # a tool the reference calls on a seed in ten (a loan among other requests) may be on none of
    # the audit's seeds (one audit of 30 seeds in thirty): then on the seeds drawn beside them
    for e in beside:
        take(e, only=set(by_name) - set(per_tool))
    for name, slots in sorted(per_tool.items()):
        props = _properties(by_name, name)
        for k, (e, i, j, call) in enumerate(slots):
            args = _json_args(call) or {}
            cid = call.get("id", "call_0")

            def run(new_args: Any, label: str, e=e, i=i, j=j, cid=cid):
                plan = _with_call(e.actions, i, j, tool_call(name, new_args, cid))
                return host.episode("a", e.seed, _scripted(plan), label)

            for key in sorted(args):
                value = args[key]
                if isinstance(value, str) and value.strip() and k == 0:  # every variant, once a tool
                    for v in _variants(value, rng):
                        run({**args, key: v}, f"variant {name}.{key}={v[:30]!r}")
                new = _extreme(value, props.get(key), rng, settings.long_text_chars)
                if new is not _SKIP:
                    run({**args, key: new}, f"extreme {name}.{key}")
                values = _in_range(value, props.get(key), rng) if k == 0 else []
                scored = [as_good(e, run({**args, key: v}, f"{name}.{key}={v}")) for v in values]
                passed = [v for v, ok in zip(values, scored) if ok]
                asked = (values and kinds.get(name) != "read" and e.trace
                         and re.search(rf"(?<!\d){value}(?!\d)", _opening_text(e.trace[0][0])))
                # the user asked for it and it matters (others score lower): one paid here, elsewhere too?
                def drawn(name=name, key=key):
                    more = random.Random(f"asking {draws.probe_seed} {name} {key}")
                    for _ in range(24):
                        e2 = _drawn_solved(host, more)
                        if e2 is not None:
                            yield e2

                def seeds_asking(name=name, key=key):
                    """The solved seeds, those drawn beside them, then drawn ones (up to 24
                    draws, made once for a tool's argument and kept): few seeds may ask for the
                    tool (a loan among others)."""
                    yield from solved
                    yield from beside
                    got, stream = asking.setdefault((name, key), ([], drawn()))
                    yield from list(got)
                    for e2 in stream:
                        got.append(e2)
                        yield e2

                # the values paid here beside the one asked, and the one asked (the seed may have
                # asked for the very value that is paid whatever was asked)
                for v in ((passed[:3] if len(passed) < len(values) else []) + [value]) if asked else []:
                    # the seed asked for v itself: no evidence there (it asked for v)
                    paid, tried = ([e.seed], 1) if v != value else ([], 0)
                    asked_for = {e.seed: value}  # the seeds tried (each once: the drawn may repeat one)
                    for e2 in seeds_asking():
                        at = next(((i2, j2, c) for i2, a in enumerate(e2.actions) for j2, c in
                                   enumerate(a.get("tool_calls") or []) if _call_name(c) == name
                                   and (_json_args(c) or {}).get(key, v) != v), None)
                        if e2.seed in asked_for or at is None:
                            continue
                        a2 = _json_args(at[2]) or {}
                        tried, asked_for[e2.seed] = tried + 1, a2.get(key)
                        if as_good(e2, run({**a2, key: v}, f"{name}.{key}={v} elsewhere", e2, at[0], at[1],
                                         at[2].get("id", "call_0"))):
                            paid.append(e2.seed)
                        if tried >= 5:
                            break
                    if len(paid) >= 3 and often(paid, tried):
                        findings.add("partial_credit", f"setting the argument {key!r} of {name} to {v!r} earns "
                                     f"the full score on {len(paid)} of {tried} seeds that asked for another "
                                     f"value (e.g. seed {paid[0]}, which asked for {asked_for[paid[0]]!r}): that value is "
                                     "paid whatever was asked, so the agent learns to send it.",
                                     key=("let through", name, key, "constant"))
                        break
            if args:
                key, depth = rng.choice(sorted(args)), rng.randrange(200, 800)
                rest = json.dumps({k: v for k, v in args.items() if k != key})
                nested = "[" * depth + json.dumps(args[key]) + "]" * depth
                text = "{" + json.dumps(key) + ": " + nested + (", " + rest[1:] if len(rest) > 2 else "}")
                run(text, f"nested {name}.{key} ({depth} levels)")


def as_good(e, ep) -> bool:
    """Whether ``ep`` earned the reference's score on its seed (``e``)."""
    return ep.ok and ep.score >= e.score - 1e-6


#: a wrong decision may keep at most this share of the reference's score (what the reads earn):
#: above it, the decision is worth too little beside them to be learnt (the paper's example keeps
#: 0.4 for the right communication with a wrong action)
WRONG_KEEPS = 0.6


def nearly(e, ep) -> bool:
    """Whether ``ep`` kept ``WRONG_KEEPS`` or more of the reference's score on its seed."""
    return ep.ok and ep.score >= WRONG_KEEPS * e.score - 1e-6


def _keeps(findings, near: list, tried: int, what: str) -> None:
    if often(near, tried):
        findings.add("partial_credit", f"{what} keeps {WRONG_KEEPS:.0%} or more of the reference's score on "
                     f"{len(near)} of {tried} seeds (e.g. seed {near[0]}): the decision is worth too little beside "
                     "the rest (the reads?) for the agent to learn it.", key=("partial_credit", "wrong decision kept"))


def _in_range(value: Any, schema: Any, rng: random.Random) -> list[int]:
    """Other values of an integer argument inside the schema's range: all of them when there are
    64 or fewer, else 16 drawn (a reward that is NaN or out of bounds at one value is seen only by
    a probe that sends it)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return []
    schema = schema if isinstance(schema, dict) else {}
    low, high = schema.get("minimum"), schema.get("maximum")
    ok = [isinstance(x, int) and not isinstance(x, bool) for x in (low, high)]
    low = low if ok[0] else (min(value, 0) if ok[1] else value - 1000)
    high = high if ok[1] else max(low, value) + 1000
    if high < low:
        return []
    if high - low < 64:
        return [v for v in range(low, high + 1) if v != value]
    return sorted({rng.randint(low, high) for _ in range(16)} - {value})


def _grounded_args(name: str, by_name: dict, sent: dict, rng: random.Random, texts: list) -> dict | None:
    """Arguments for a call of ``name``: each required one the reference sent under that name
    (a record's id, say), else an enum's drawn choice, an integer in range, a boolean, a drawn
    short text after the values the reference sent (a transfer's summary naming the record);
    None for a required array or object."""
    from envforge.gate.dynamic import _properties

    params = (by_name[name]["function"].get("parameters") or {})
    required = params.get("required") if isinstance(params.get("required"), list) else []
    props, args = _properties(by_name, name), {}
    for key in required:
        schema = props.get(key) if isinstance(props.get(key), dict) else {}
        if key in sent:
            args[key] = rng.choice(sent[key])
        elif isinstance(schema.get("enum"), list) and schema["enum"]:
            args[key] = rng.choice(schema["enum"])
        elif schema.get("type") == "integer":
            low = schema.get("minimum") if isinstance(schema.get("minimum"), int) else 1
            args[key] = rng.randint(low, schema["maximum"]) if isinstance(schema.get("maximum"), int) and schema["maximum"] >= low else low
        elif schema.get("type") == "boolean":
            args[key] = rng.random() < 0.5
        elif schema.get("type") in ("string", None):  # naming the request's records (a summary that must)
            named = " ".join(dict.fromkeys(str(v[0]) for v in sent.values() if v and isinstance(v[0], (str, int))))
            args[key] = (named + ": " if named else "") + rng.choice(texts)
        else:
            return None
    return args


def _sent_values(actions: list) -> dict[str, list]:
    """Argument name -> the values the plan's calls sent under it, in order, each once."""
    from envforge.gate.dynamic import _json_args

    sent: dict[str, list] = {}
    for a in actions:
        for c in a.get("tool_calls") or []:
            for k, v in (_json_args(c) or {}).items():
                if v not in sent.setdefault(k, []):
                    sent[k].append(v)
    return sent


def grounded_calls(host, solved: list, by_name: dict, kinds: dict, draws, findings) -> None:
    """Every tool called twice where the reference is about to act (after its reads), with the
    arguments the reference sent under the same names (the request's own record), then the rest
    of the reference; and each read sent for up to 4 other records the episode shows: a bonus
    paid per call of a tool the reference never makes there, or per record read, shows as a
    total above 1 (``Host.episode``'s bound). And on up to 6 seeds where it acts, each tool it
    does not call there instead of its act (after its reads and texts: the user's yes): a tool
    that earns the full score in its place (closing the ticket, a transfer) on 2 seeds and a
    quarter stands in for the decision, a ``free_reward`` finding (up to 10 tools that are not reads,
    drawn; a seed where what comes before the act earns the full score alone is left out)."""
    from envforge.gate.dynamic import _call_name, scripted

    rng = random.Random(draws.rng.randrange(2**63))
    texts = [t for t in draws.texts if len(t) <= 120] or ["ok"]
    longest = max(draws.texts, key=len, default="ok")
    words = [w for w in getattr(draws, "literals", []) if w.isascii() and w.isalnum()] or ["word", "ticket", "done"]
    acting = [e for e in solved if _acts(e.actions, kinds)]  # where the reference acts, first
    rest = [e for e in solved if e not in acting]
    stand_in: dict[str, list] = {}  # tool -> seeds where it earned the full score in the act's place
    pick = random.Random(f"stand-in {draws.probe_seed}")  # a stream of its own: the other draws stay
    tried = 0
    for e in acting[:6]:
        sent = _sent_values(e.actions)
        used = {_call_name(c) for a in e.actions for c in a.get("tool_calls") or []}
        at = _act_at(e, kinds)
        if as_good(e, host.episode("a", e.seed, scripted(e.actions[:at]), "up to the act")):
            continue  # the act is optional here: nothing to stand in for
        tried += 1
        others = sorted(n for n in set(by_name) - used if kinds.get(n) != "read")
        for t, name in enumerate(pick.sample(others, min(10, len(others)))):
            args = _grounded_args(name, by_name, sent, pick, texts)
            if args is not None and as_good(e, host.episode("a", e.seed, scripted(e.actions[:at] + [assistant(
                    None, [tool_call(name, args, f"call_s{t}")])]), f"{name} instead of the act")):
                stand_in.setdefault(name, []).append(e.seed)
    for name, seeds in sorted(stand_in.items()):
        if often(seeds, tried):
            findings.add("free_reward", f"{name}, called (on the request's own records) instead of what the "
                         f"reference does, earns the full score on {len(seeds)} of {tried} seeds where the "
                         f"reference acts (e.g. seed {seeds[0]}): a tool the reference never uses there "
                         "stands in for the decision; pay only the act the request needs.",
                         key=("free_reward", "stand-in", name))
            break
    for n_e, e in enumerate(acting[:3] + rest[:3]):  # seeds of both sides
        sent = _sent_values(e.actions)
        at = _act_at(e, kinds)
        for t, name in enumerate(sorted(by_name)):
            args = _grounded_args(name, by_name, sent, rng, texts)
            if args is None:
                continue
            if n_e < 3:
                twice = [assistant(None, [tool_call(name, args, f"call_g{t}_{n}")]) for n in range(2)]
                host.episode("a", e.seed, scripted(e.actions[:at] + twice + e.actions[at:]), f"{name} twice")
            free = [k for k in sorted(args) if isinstance(args[k], str) and k not in sent]
            if n_e == 0 and free:  # its free text long, naming the records (a regex that hangs on it)
                named = " ".join(str(v) for vs in sent.values() for v in vs[:1] if isinstance(v, (str, int)))
                # a sentence of plain words and single spaces, then one stray character: where a
                # pattern can split such a run many ways, failing at its end tries them all
                plain = " ".join(rng.choice(words) for _ in range(60))
                for text in (f"{longest} {named}", f"{plain}; {named}"):
                    long = {**args, **{k: text for k in free}}
                    host.episode("a", e.seed, scripted(e.actions[:at] + [assistant(None, [tool_call(name, long, f"call_l{t}")])]),
                                 f"{name} with long text")
    # and each read sent for other real records the episode shows (a bonus per record read), on
    # up to 3 seeds a read and side (acts, declines) where there are others: many seeds show only
    # the request's own records (another employee's id shows where the ticket is someone else's),
    # so every solved seed is looked at
    rng, shown = random.Random(f"other records {draws.probe_seed}"), {}
    for e in acting + rest:
        sent, side = _sent_values(e.actions), e in acting
        for t, name in enumerate(sorted(by_name)):
            if kinds.get(name) != "read" or shown.get((name, side), 0) >= 3:
                continue
            args = _grounded_args(name, by_name, sent, rng, texts)
            keys = [k for k in sorted(args or {}) if isinstance(args[k], str) and k in sent]
            if not keys:
                continue
            avoid = {v for vs in sent.values() for v in vs if isinstance(v, str)}
            others = _shaped(args[keys[0]], e, avoid)[:4]
            if others:
                shown[(name, side)] = shown.get((name, side), 0) + 1
                at = _act_at(e, kinds)
                more = [assistant(None, [tool_call(name, {**args, keys[0]: x}, f"call_o{t}_{n}")])
                        for n, x in enumerate(others)]
                host.episode("a", e.seed, scripted(e.actions[:at] + more + e.actions[at:]), f"{name} of other records")


def _act_at(e, kinds: dict) -> int:
    """Where the reference acts in ``e`` (the index of its first write), else where it answers
    (after its last call)."""
    return next((i for i, a in enumerate(e.actions) if _acts([a], kinds)),
                max((i + 1 for i, a in enumerate(e.actions) if a.get("tool_calls")), default=0))


def malformed_episodes(host, tools: list, draws) -> list:
    """A drawn script of malformed actions and chatter on a few seeds (unknown tools, arguments
    that are not JSON, missing arguments): replayed in every other process like the reference,
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


# --------------------------------------------------------------------------- reads that decide

def _sent(call: dict) -> set[str]:
    """What a call sends that could name a record: its strings (3+ letters or digits once
    squashed, at most three words) and its integers of three digits or more, squashed."""
    from envforge.gate.dynamic import _json_args, _squash, _strings

    args = _json_args(call) or {}
    out = {_squash(s) for s in _strings(args) if len(s.split()) <= 3}
    out |= {str(abs(v)) for v in args.values() if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 100}
    return {v for v in out if len(v) >= 3}


def _reads(a: dict, kinds: dict) -> list[str]:
    return [c["function"]["name"] for c in a.get("tool_calls") or [] if kinds.get(c["function"]["name"]) == "read"]


def lookup_tools(episodes: list, kinds: dict) -> set[str]:
    """The read tools that, in some reference episode, first show a value a later call of the
    reference sends (a look-up: it finds the id the next call needs). The other reads are
    checks: what they return can only decide whether and how to act."""
    from envforge.gate.dynamic import _squash

    found: set[str] = set()
    for e in episodes:
        seen = " ".join(_squash(m.get("content")) for m in e.trace[0][0]["messages"])
        for t, a in enumerate(e.actions):
            result = " ".join(_squash(m.get("content")) for m in e.trace[t + 1][0]["messages"]) if t + 1 < len(e.trace) else ""
            reads = _reads(a, kinds)
            if reads:
                later = {v for b in e.actions[t + 1:] for c in b.get("tool_calls") or [] for v in _sent(c)}
                if any(v in result and v not in seen for v in later):
                    found.update(reads)
            seen += " " + result
    return found


def _shape(value: str) -> str:
    return "".join("9" if c.isdigit() else "a" if c.isalpha() else c for c in value)


def _shaped(value: str, episode, avoid=()) -> list[str]:
    """The values of the shape of ``value`` (letters, digits, punctuation in the same places, the
    same prefix) that the episode's observations show, in order, ``value`` and ``avoid`` left out."""
    text = "\n".join(_said(step[0]["messages"]) for step in episode.trace)  # as they read: not escaped
    text = re.sub(r"\\[nrt]", " ", text)  # nor a JSON text's own escapes (a tool's result as JSON)
    prefix = re.match(r"[^\W\d]*", value).group(0)
    return list(dict.fromkeys(t for t in re.findall(r"[\w.@+-]+", text) if t != value and t not in avoid
                              and t.startswith(prefix) and _shape(t) == _shape(value)))


def _other_record(value: str, episode, avoid=()) -> str:
    """Another value of the shape of ``value`` that the episode's observations show (``_shaped``),
    not one of ``avoid`` (the values the episode's calls of the tool send: a swap among the
    records it reads anyway reads the same ones): another real record's id, else a changed one."""
    from envforge.gate.dynamic import _mutate

    found = _shaped(value, episode, avoid)
    if found:
        return found[0]
    out = _mutate(value)
    while out in avoid:
        out = _mutate(out)
    return out


def _shown_fields(e, i: int) -> list[str]:
    """The fields of what the plan's message ``i`` got back (its tools' JSON results, and the
    objects in them), as words ("ticket id", "status")."""
    fields = []
    step = e.trace[i + 1][0] if i + 1 < len(e.trace) and isinstance(e.trace[i + 1], (list, tuple)) else {}
    for m in (step.get("messages") or []) if isinstance(step, dict) else []:
        try:
            got = json.loads(m.get("content") or "") if isinstance(m, dict) and m.get("role") == "tool" else None
        except (TypeError, ValueError, RecursionError):
            got = None
        inner = [v for v in got.values() if isinstance(v, dict)] + [
            x for v in got.values() if isinstance(v, list) for x in v[:8] if isinstance(x, dict)] \
            if isinstance(got, dict) else []
        for d in [got] + inner if isinstance(got, dict) else []:
            fields += [k.replace("_", " ") for k in d if isinstance(k, str)]
    return fields


def _asked_instead(e, names) -> list:
    """The plan with each message calling the tools ``names`` replaced by a question to the user
    about what those calls returned: the fields of their results, for the values they sent."""
    from envforge.gate.dynamic import _json_args

    plan = []
    for i, a in enumerate(e.actions):
        calls = [c for c in a.get("tool_calls") or [] if c["function"]["name"] in names]
        if not calls:
            plan.append(a)
            continue
        values = []
        for c in calls:
            values += [str(v) for v in (_json_args(c) or {}).values() if isinstance(v, (str, int))]
        fields = list(dict.fromkeys(_shown_fields(e, i)))[:10] or ["details", "status", "owner"]
        plan.append(assistant(f"Before I go on, could you tell me the {', '.join(fields)} of "
                              f"{' and '.join(dict.fromkeys(values)) or 'it'}?"))
    return plan


def without_calls(actions: list, names) -> list:
    """The plan without its calls of the tools ``names`` (a message left empty is dropped)."""
    plan = []
    for a in actions:
        keep = [c for c in a.get("tool_calls") or [] if c["function"]["name"] not in names]
        if keep or (a.get("content") or "").strip():
            plan.append({**a, "tool_calls": keep} if keep else assistant(a.get("content")))
    return plan


def _acts(actions: Any, kinds: dict) -> bool:
    """Whether a plan acts: makes a call that is neither a read nor a transfer to a human. A
    plan is env output (a drawn seed's ``solve``): what is not a tool call does not act."""
    return any(kinds.get(c["function"]["name"]) not in ("read", "escalation")
               for a in (actions if isinstance(actions, list) else []) for c in _calls(a))


def checking_reads(host, solved: list, kinds: dict, about_reading: bool, findings, stats: dict) -> list:
    """The reference's checks (reads that are not look-ups) must matter: all removed, the score
    must drop on some seed (for a capability about reading, or when the reference acts on some
    seeds and declines on others: something decides, and the checks are where the agent can
    learn it; a precision env may read and score only the write); a check whose removal drops
    the score must also drop it when sent for another record (or a changed id), on some seed.
    Returns the episodes that lowered the score (replayed after the many-resets probe)."""
    from envforge.gate.dynamic import _json_args, _with_call

    lookups = lookup_tools(solved, kinds)
    with_checks = [e for e in solved if any(set(_reads(a, kinds)) - lookups for a in e.actions)]
    checks = sorted({n for e in with_checks for a in e.actions for n in _reads(a, kinds)} - lookups)
    stats["check_reads"] = checks
    if len(with_checks) < 2:
        return []
    removed, contrast = [], []
    changed: dict[str, list] = {}  # check tool -> [(seed, lowered)]
    sides = [_acts(e.actions, kinds) for e in solved]
    judged = about_reading or min(sides.count(True), sides.count(False)) >= 2
    asked = []  # seeds where a question to the user in place of the checks earned the full score
    for e in with_checks[:6] if judged else []:
        ep = host.episode("a", e.seed, _scripted(without_calls(e.actions, checks)), "checks removed")
        removed.append((e.seed, not as_good(e, ep)))
        if removed[-1][1]:  # they matter: asking the user what they would show must not do as well
            ep = host.episode("a", e.seed, _scripted(_asked_instead(e, checks)), "the user asked instead")
            if as_good(e, ep):
                asked.append(e.seed)
    if often(asked, sum(low for _, low in removed)):
        findings.add("free_reward", f"the reference with its checks ({', '.join(checks)}) replaced by a question "
                     f"to the user about what they would show earns the full score on {len(asked)} seeds (e.g. "
                     f"seed {asked[0]}): asking the user stands in for reading the records, and the agent "
                     "learns to trust what users say; only the reads may show it.", key=("free_reward", "asked"))
    # each check tool in turn: when removing it lowers the score (it is credited), its string
    # arguments naming another record must lower it too (a read credited whatever it reads)
    tries: dict[str, int] = {}
    for e in with_checks:
        for name in checks:
            runs = changed.setdefault(name, [])
            if (len(runs) >= 4 or tries.get(name, 0) >= 6 or any(low for _, low in runs)
                    or not any(name in _reads(a, kinds) for a in e.actions)):
                continue
            tries[name] = tries.get(name, 0) + 1
            ep = host.episode("a", e.seed, _scripted(without_calls(e.actions, [name])), f"{name} removed")
            if as_good(e, ep):
                continue  # not credited: the all-checks probe above judges it
            plan = e.actions
            avoid = {v for a in e.actions for c in a.get("tool_calls") or [] if c["function"]["name"] == name
                     for v in (_json_args(c) or {}).values() if isinstance(v, str)}
            for i, a in enumerate(e.actions):
                for j, call in enumerate(a.get("tool_calls") or []):
                    args = _json_args(call)
                    if call["function"]["name"] == name and args:
                        new = {k: _other_record(v, e, avoid) if isinstance(v, str) and v.strip() else v for k, v in args.items()}
                        if new != args:
                            plan = _with_call(plan, i, j, tool_call(name, new, call.get("id", "call_0")))
            if plan is not e.actions:
                ep = host.episode("a", e.seed, _scripted(plan), f"{name} of another record")
                runs.append((e.seed, not as_good(e, ep)))
                if ep.ok and ep.score < e.score - 1e-6:
                    contrast.append(ep)
    if removed and not any(low for _, low in removed):
        findings.add("free_reward", f"the reference without its checks ({', '.join(checks)}: reads that find "
                     f"no id a later call needs) still earns the full score ({len(removed)} seeds, e.g. seed "
                     f"{removed[0][0]}): what the checks return must matter to the reward, or the agent "
                     "learns to skip them.", key=("free_reward", "checks"))
    for name, runs in sorted(changed.items()):
        if len(runs) >= 2 and not any(low for _, low in runs):
            findings.add("partial_credit", f"the reference's check {name} sent for another record (or a "
                         f"changed id) never lowers the score ({len(runs)} seeds, e.g. seed {runs[0][0]}): "
                         "a read is credited whatever it reads.", key=("unchecked", "check", name))
    return contrast


def _opening_text(obs: Any) -> str:
    messages = obs.get("messages") if isinstance(obs, dict) else None
    return " ".join(str(m.get("content") or "") for m in messages or [] if isinstance(m, dict))


def _tokens(text: str) -> set[str]:
    """A text's tokens: words as written and, marked with '~', in any case; numbers, whitespace
    runs and single marks (a decision told by a mark, a letter's case or two spaces is told all
    the same)."""
    found = re.findall(r"[^\W\d_]+|\d+|\s+|[^\w\s]|_", text)
    return set(found) | {"~" + t.lower() for t in found if t.isalpha()}  # "~hi": any case


def _opening_words(obs: Any) -> set[str]:
    """The opening's tokens (the system prompt too: one that differs between seeds can tell the
    decision as well as the user's words, a red team's env wrote it there)."""
    return _tokens(_opening_text(obs))


#: what the agent says first in "the decision in the opening", one drawn an audit (the answer
#: counts too)
GREETINGS = ("Hello! How can I help you today?", "Hi, thanks for reaching out. What can I do for you?",
             "Good day. Could you tell me a bit more about your request?",
             "Thanks for your message. Let me look into this for you.")


def _cover(words: list[tuple[str, int]], group: int, everyone: int) -> tuple[int, int, list[str]]:
    """Greedy cover of ``group`` (a bit mask over the seeds) by ``words`` ((word, mask of the seeds
    it is in), sorted: ties go to the first) each in two of its seeds or
    more, at most a word per three of its seeds, each word chosen for the seeds of ``group`` it
    adds less three times the other seeds it adds (a word the other side uses now and then still
    tells), while that gains two or more: (the seeds of ``group`` left uncovered, the other seeds
    covered, the words chosen)."""
    n, other = group.bit_count(), everyone & ~group
    found = [(w, m) for w, m in words if (m & group).bit_count() >= 2]
    left, wrong, chosen = group, 0, []
    while found and len(chosen) < n // 3:
        gains = [(m & left).bit_count() - 3 * (m & other & ~wrong).bit_count() for _, m in found]
        best = max(range(len(gains)), key=gains.__getitem__)
        if gains[best] < 2:
            break
        w, m = found.pop(best)
        chosen.append(w)
        left, wrong = left & ~m, wrong | (m & other)
    return left.bit_count(), wrong.bit_count(), chosen


#: random labellings a cover is held against, none of which may do as well (p < 1/5,000 a side)
LABELLINGS = 5000


def telling_words(samples: list[tuple[set, bool]], rng: random.Random,
                  deadline: float = math.inf) -> tuple[list[str], bool] | None:
    """Words that tell the seeds where the reference acts from those where it does not: (the
    words, the side they tell) or None. A side is told when its words (above) tell it with one
    seed in ten wrong at most (seeds of the side left out, other seeds covered), and no random
    labelling of the seeds, of the same sizes, is told as well, counting the errors and the words
    (a few words and few errors are what a decision in the opening looks like; many words, each
    on a few seeds, what chance gives): names and places drawn at random recur on a large side by
    chance (a word absent from ten seeds is likely), but not whatever the labels."""
    masks: dict[str, int] = {}
    for i, (words, _) in enumerate(samples):
        for w in words:
            masks[w] = masks.get(w, 0) | 1 << i
    everyone = (1 << len(samples)) - 1
    # a word on one seed cannot be chosen, one on every seed tells nothing
    words = sorted((w, m) for w, m in masks.items() if m != everyone and m & (m - 1))
    acts = sum(1 << i for i, (_, a) in enumerate(samples) if a)
    for group, side in ((acts, True), (everyone & ~acts, False)):
        n = group.bit_count()
        if n < 6 or len(samples) - n < 6:
            continue
        left, wrong, chosen = _cover(words, group, everyone)
        if left + wrong > len(samples) // 10:
            continue
        seeds = range(len(samples))
        for k in range(LABELLINGS):
            if k % 100 == 0 and time.monotonic() > deadline:
                raise TimeoutError(f"the labelling test of the decision in the opening ran out of time "
                                   f"after {k} labellings ({len(words)} words in two seeds or more)")
            drawn = _cover(words, sum(1 << i for i in rng.sample(seeds, n)), everyone)
            if drawn[0] + drawn[1] + len(drawn[2]) <= left + wrong + len(chosen):
                break  # chance tells it as well
        else:
            return chosen, side
    return None


def _answered(ep) -> str:
    """Every message the agent reads after its first turn, but a tool's."""
    return " ".join(str(m.get("content") or "") for step in ep.trace[1:] for m in step[0]["messages"]
                    if isinstance(m, dict) and m.get("role") != "tool")


def decision_in_opening(host, solved: list, kinds: dict, draws, findings, stats: dict) -> None:
    """For a capability about reading: whether the reference acts (makes a write) must not be
    readable from what the user says before any read, or the reads decide nothing. Over 40 seeds
    or more (the reference's, then drawn ones, a solve each), the seeds where it acts and those
    where it does not must not be told apart by the tokens of the opening messages, of the
    user's answer to a greeting, and of the user's answer to a question about the fields the
    reference's reads show (an episode of one step a seed each)."""
    if not any(_reads(a, kinds) for e in solved for a in e.actions):
        return
    from envforge.gate.dynamic import scripted
    plans = [(e.seed, _acts(e.actions, kinds)) for e in solved]
    rng = random.Random(draws.rng.randrange(2**63))
    for _ in range(max(0, 40 - len(plans))):
        seed = rng.randrange(2**31)
        plan = host.op(f"opening solve(seed={seed})", "solve", "a", seed)
        if isinstance(plan, list):
            plans.append((seed, _acts(plan, kinds)))
    # and a question about what the reads show (the fields of their results): a user who says
    # what blocks the request when asked lets the agent read for the credit and decide by the answer
    shown = list(dict.fromkeys(f for e in solved for i, a in enumerate(e.actions) if _reads(a, kinds)
                               for f in _shown_fields(e, i)))[:16]
    samples, greeting = [], rng.choice(GREETINGS)
    question = f"Before I look anything up: could you tell me the {', '.join(shown)} of it?" if shown else None
    for seed, acts in plans:
        ep = host.episode("a", seed, scripted([assistant(greeting)]), "a greeting")
        if ep.trace:  # every message of the answer the agent reads, all but a tool's
            words = _opening_words(ep.trace[0][0]) | _tokens(_answered(ep))
            if question:
                words |= _tokens(_answered(host.episode("a", seed, scripted([assistant(question)]),
                                                        "a question about what the reads show")))
            samples.append((words, acts))
    try:
        told = telling_words(samples, rng, host.deadline)
    except TimeoutError as e:
        from envforge.gate.dynamic import GiveUp
        raise GiveUp(f"{e}: openings of thousands of distinct words; the remaining checks were skipped") from None
    if told:
        words, side = told
        stats["decision_words"] = words
        n = sum(a == side for _, a in samples)
        findings.add("free_reward", f"whether the reference acts can be read off the opening message "
                     "(or the user's answer to a greeting, or to a question about what the reads show): "
                     f"the words {', '.join(repr(w) for w in words[:6])} appear where it "
                     f"{'acts' if side else 'does not act'} ({n} of {len(samples)} seeds, and mostly "
                     "there: wrong on one seed in ten at most, where no random labelling of the "
                     f"seeds in {LABELLINGS} is told as well): the reads decide nothing. Keep what "
                     "decides out of the user's words; let only the reads show it.",
                     key=("free_reward", "decision in opening"))


def _texts_moved(actions: list, at_call) -> list:
    """The plan with the texts before each tool call handed to ``at_call(call, texts)``, which
    returns what stands there instead; texts after the last call stay."""
    plan, pending = [], []
    for a in actions:
        if a.get("tool_calls"):
            plan += at_call(a, pending)
            pending = []
        elif isinstance(a.get("content"), str) and a["content"].strip():
            pending.append(a["content"].strip())
        else:
            plan.append(a)
    return plan + [assistant(t) for t in pending]


def _said_with_calls(actions: list) -> list:
    """The plan with each text before a tool call sent in that call's message instead of on its
    own (a question and the write it asks about, at once); texts after the last call stay."""
    def along(a, texts):
        text = " ".join(texts + [a["content"]] if isinstance(a.get("content"), str) else texts)
        return [{**a, "content": text or a.get("content")}]
    return _texts_moved(actions, along)


def _said_after_calls(actions: list, kinds: dict) -> list:
    """The plan with the texts before each call that acts (a write: not a read or a hand-off)
    said right after that call instead (a question asked once the write it asks about is made);
    texts before other calls, and after the last call, stay."""
    def after(a, texts):
        said = [assistant(t) for t in texts]
        return [a] + said if _acts([a], kinds) else said + [a]
    return _texts_moved(actions, after)


def _without_texts_before_calls(actions: list) -> list:
    """The plan without the texts said before its last tool call."""
    last = max(i for i, a in enumerate(actions) if a.get("tool_calls"))
    return [a for i, a in enumerate(actions) if i > last or a.get("tool_calls")]


def texts_that_matter(host, solved: list, kinds: dict, findings) -> list:
    """The reference's tool calls without its texts (what it asked or told the user), on seeds
    where it says something before it acts. Where that lowers the score the texts matter, and
    then the same calls with every read made twice must score lower too: an env that takes a
    repeated read for the user's confirmation lets the agent skip asking; and so must the texts
    sent in the messages of the calls after them (a question and the write it asks about at once:
    an env that shows the user the text first pays not waiting for the answer), and said after
    them (the question asked once the write is made: an env that looks for the user's yes only at
    the end pays asking afterwards), where leaving those texts out lowers it. Returns the calls-only
    episodes (replayed later in fresh instances: an env that remembers an earlier episode's
    confirmation scores them otherwise there)."""
    from envforge.gate.dynamic import scripted
    out, lowered, paid, along, after, before = [], 0, [], [], [], 0
    for e in solved:
        if len(out) >= 8:
            break
        calls = [a for a in e.actions if a.get("tool_calls")]
        said = [i for i, a in enumerate(e.actions) if not a.get("tool_calls") and (a.get("content") or "").strip()]
        if not calls or not said or not _acts(e.actions, kinds) or said[0] > max(
                i for i, a in enumerate(e.actions) if a.get("tool_calls")):
            continue
        ep = host.episode("a", e.seed, scripted(calls), "calls only")
        out.append(ep)
        if not ep.ok or ep.score >= e.score - 1e-6:
            continue
        lowered += 1
        twice = [b for a in calls for b in ([a, a] if _reads(a, kinds) and len(_reads(a, kinds)) == len(a["tool_calls"]) else [a])]
        if twice != calls:
            again = host.episode("a", e.seed, scripted(twice), "calls only, reads twice")
            if as_good(e, again):
                paid.append(e.seed)
        if as_good(e, host.episode("a", e.seed, scripted(_without_texts_before_calls(e.actions)),
                                   "texts before the calls left out")):
            continue  # what it says before acting does not count: where it says it proves nothing
        before += 1
        if as_good(e, host.episode("a", e.seed, scripted(_said_with_calls(e.actions)), "texts sent with the calls")):
            along.append(e.seed)
        moved = _said_after_calls(e.actions, kinds)
        if moved != e.actions and as_good(e, host.episode("a", e.seed, scripted(moved), "texts said after the calls")):
            after.append(e.seed)
    if often(along, before):
        findings.add("free_reward", f"the reference's texts sent in the same message as the tool call after them "
                     f"(its question with the write it asks about) earn the full score ({len(along)} of {before} "
                     f"seeds where leaving them out scores lower, e.g. seed {along[0]}): the user cannot answer a "
                     "question before the call it asks about runs, so the agent learns not to wait for the "
                     "answer.", key=("free_reward", "texts with the calls"))
    if often(after, before):
        findings.add("free_reward", f"the reference's texts said after the tool call that follows them (its "
                     f"question asked once the write it asks about is made) earn the full score ({len(after)} "
                     f"of {before} seeds where leaving them out scores lower, e.g. seed {after[0]}): what the "
                     "user says after a write cannot have allowed it, so the agent learns to act first and "
                     "ask afterwards.", key=("free_reward", "texts after the calls"))
    if often(paid, lowered):
        findings.add("free_reward", f"without the reference's texts the score falls, but with every read "
                     f"made twice it is full again ({len(paid)} of {lowered} seeds, e.g. seed {paid[0]}): "
                     "a repeated read stands in for what the agent must say (a confirmation?).",
                     key=("free_reward", "reads for texts"))
    return out



def _last_call(actions: list, kinds: dict | None = None) -> int:
    """Where the plan's last tool call is (-1: none); given the tools' kinds, calls at its end
    after a text that neither act nor write aside (a decline, then a transfer to a human or a
    read: the decline is still its answer)."""
    def decides_nothing(a: dict) -> bool:
        calls = _calls(a)
        return kinds is not None and bool(calls) and all(kinds.get(c["function"]["name"]) in ("read", "escalation")
                                                         for c in calls)
    ends = [i for i, a in enumerate(actions) if a.get("tool_calls")]
    while ends and decides_nothing(actions[ends[-1]]) and any(
            isinstance(a.get("content"), str) and a["content"].strip() and not a.get("tool_calls")
            for a in actions[ends[-2] + 1 if len(ends) > 1 else 0:ends[-1]]):
        ends.pop()
    return ends[-1] if ends else -1


def _decision_texts(actions: list, kinds: dict | None = None) -> list[int]:
    """Where the plan's texts after its last tool call are (its answer: a refusal, say; a
    hand-off or a read after it aside, given the tools' kinds: ``_last_call``)."""
    last = _last_call(actions, kinds)
    return [i for i, a in enumerate(actions) if i > last and isinstance(a.get("content"), str)
            and a["content"].strip() and not a.get("tool_calls")]


def _call_values(actions: list) -> dict:
    """(tool, argument, n-th call of the tool) -> the value sent, for the plan's string values of
    3 characters or more and integers of 3 digits or more (what can name a record)."""
    from envforge.gate.dynamic import _call_name, _json_args

    out, seen = {}, {}
    for a in actions:
        for c in _calls(a):
            name = _call_name(c)
            n = seen[name] = seen.get(name, -1) + 1
            for k, v in sorted((_json_args(c) or {}).items()):
                if (isinstance(v, str) and len(v.strip()) >= 3) or (
                        isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 100):
                    out[(name, k, n)] = str(v)
    return out


def _as_if(text: str, theirs: dict, mine: dict, whole: bool = False) -> str:
    """``text`` said on another seed, with the values its calls sent (record ids, names) replaced
    by those this seed's calls sent in the same place; ``whole``: only where a value stands as a
    whole word (a day count of 7 is not the 7 in an id, nor 'read' the one in 'already')."""
    swap = {v: mine[k] for k, v in theirs.items() if k in mine and mine[k] != v and v}
    if whole and swap:
        words = "|".join(re.escape(v) for v in sorted(swap, key=len, reverse=True))
        return re.sub(rf"(?<![\w-])(?:{words})(?![\w-])", lambda m: swap[m.group(0)], text)
    for v in sorted(swap, key=len, reverse=True):
        text = text.replace(v, swap[v])
    return text


def _shortest(text: str, pays) -> str:
    """The shortest piece of ``text`` that still ``pays``: the shortest of its sentences and
    clauses that does, then as many words cut from either end as leave it paying (halving)."""
    pieces = {p.strip(" ,;:.!?") for p in re.split(r"(?<=[.!?])\s+", text) + re.split(r"(?<=[.!?;:,])\s+", text)}
    text = next((p for p in sorted(pieces - {"", text.strip(" ,;:.!?")}, key=lambda p: (len(p), p))[:6]
                 if pays(p)), text)
    words = text.split()
    for end in (0, 1):  # the words before it, then after it
        lo, hi = 0, len(words) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if pays(" ".join(words[mid:] if end == 0 else words[:len(words) - mid])):
                lo = mid
            else:
                hi = mid - 1
        words = words[lo:] if end == 0 else words[:len(words) - lo]
    return " ".join(words).strip(" ,;:.!?")


def _after_reads(actions: list, kinds: dict) -> int:
    """Where the plan's reads before its first act end (0 when it acts before any call)."""
    first = next(i for i, a in enumerate(actions) if _acts([a], kinds))
    return max((i + 1 for i in range(first) if actions[i].get("tool_calls")), default=0)


def often(paid: list, tried: int) -> bool:
    """Whether a probe paid on enough seeds to be the env, not a seed where the move is allowed:
    2 at least, and a quarter of those tried."""
    return len(paid) >= 2 and len(paid) * 4 >= tried


#: words of talk that neither asks, agrees, refuses nor names a check (stalling, not deciding)
_IDLE = ("hello please thanks one moment let me look here we go the a to for your my it this that and "
         "then with about").split()


def _idle(rng: random.Random) -> str:
    return " ".join(rng.choice(_IDLE) for _ in range(rng.randrange(2, 40))).capitalize() + "."


def _said(messages: list) -> str:
    """The messages' texts as they read (not JSON-escaped: a value after a newline stays whole)."""
    return "\n".join(m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
                     for m in messages if isinstance(m, dict))


def _names_a_record(v: Any) -> bool:
    """Whether a call's value names a record: an integer of 3 digits or more, or one word of 3
    characters or more with a digit or a mark in it (an id such as #W123, an email), not a plain
    word or a text."""
    if isinstance(v, int) and not isinstance(v, bool):
        return abs(v) >= 100
    return isinstance(v, str) and len(v) >= 3 and re.fullmatch(r"\S+", v) is not None and not v.isalpha()


def _shows(text: str, value: str) -> bool:
    """Whether ``text`` holds ``value`` standing alone (not inside a longer id or number)."""
    return re.search(rf"(?<![\w#.@+-]){re.escape(value)}(?![\w@+-]|\.\w)", text) is not None


def _breadth(e, kinds: dict, solved: list, rng: random.Random, retyped: bool = False) -> Any:
    """A policy that reads every record it is shown and never decides: each turn a read the
    reference makes on some seed (its tool, its arguments) with an id argument swapped for a value
    of the id's shape and prefix that this episode has shown so far and that the read has not sent
    yet (``retyped``: this seed's own reads with their ids in other case and spacing, each once: a
    bonus per distinct query); then this seed's reads in turn."""
    from envforge.gate.dynamic import _json_args

    def reads_of(episodes: list) -> list:
        return list({json.dumps([c["function"]["name"], _json_args(c) or {}], sort_keys=True): (
            c["function"]["name"], _json_args(c) or {}, c.get("id", "call_0")) for x in episodes for a in x.actions
            for c in _calls(a) if kinds.get(c["function"]["name"]) == "read"}.values())
    own, reads = reads_of([e]), reads_of([e] + solved)
    sent: set = set()
    ways = [[(name, {**args, k: w}, cid) for w in _variants(v, rng)] for name, args, cid in own
            for k, v in sorted(args.items()) if isinstance(v, str) and len(v) >= 3]
    typed = [x for row in itertools.zip_longest(*ways) for x in row if x is not None]

    def policy(t: int, messages: list) -> Any:
        words = [] if retyped else [(w, _shape(w)) for w in dict.fromkeys(re.findall(r"[#\w.@+-]+", _said(messages)))]
        for name, args, cid in reads if words else []:
            for k, v in sorted(args.items()):
                if not isinstance(v, str) or len(v) < 3:
                    continue
                prefix, shape = re.match(r"[^\W\d]*", v).group(0), _shape(v)
                for w, ws in words:
                    if ws == shape and w.startswith(prefix) and (name, k, w) not in sent:
                        sent.add((name, k, w))
                        return assistant(None, [tool_call(name, {**args, k: w}, cid)])
        if retyped and typed:  # its own reads typed otherwise, each once (each id's in turn)
            name, args, cid = typed.pop(0)
            return assistant(None, [tool_call(name, args, cid)])
        name, args, cid = own[t % len(own)]
        return assistant(None, [tool_call(name, args, cid)])
    return policy


def other_stalls(host, solved: list, kinds: dict, draws, findings) -> None:
    """Two more ways of never deciding, played to the end: every record the episode shows read in
    turn, and its own reads retyped (a bonus per record or query, capped at 1, pays the full score
    without a decision), and,
    where the reference declines, its reads, then idle talk until the user leaves (a user who gives
    up counted as a right decline). Either earning the reference's full score on 2 seeds or more
    (a quarter of those tried) is a finding: an undecided episode must score below a decided one."""
    from envforge.gate.dynamic import scripted

    tried, paid = 0, []
    rng = random.Random(f"every record {draws.probe_seed}")
    for e in solved[:4]:
        if any(kinds.get(c["function"]["name"]) == "read" for a in e.actions for c in _calls(a)):
            tried += 1
            if any(as_good(e, host.episode("a", e.seed, _breadth(e, kinds, solved, rng, retyped), label))
                   for retyped, label in ((False, "every record read, no decision"),
                                          (True, "its reads retyped, no decision"))):
                paid.append(e.seed)
    if often(paid, tried):
        findings.add("free_reward", f"reading every record the episode shows, one after another (or its own "
                     f"records under other spellings), never deciding, earns the reference's full score on "
                     f"{len(paid)} of {tried} seeds (e.g. seed {paid[0]}): looking must not pay what deciding "
                     "does (a bonus per record or query read?).",
                     key=("free_reward", "stall"))
    tried, paid = 0, []
    rng = random.Random(f"idle talk {draws.probe_seed}")  # a stream of its own: the other draws stay
    for e in [e for e in solved if not _acts(e.actions, kinds)][:4]:
        calls = [a for a in e.actions if _calls(a) and all(kinds.get(c["function"]["name"]) == "read" for c in _calls(a))]
        talk = [assistant(_idle(rng)) for _ in range(4)]
        tried += 1
        ep = host.episode("a", e.seed, scripted(calls + talk * host.max_turns), "its reads, then idle talk")
        if as_good(e, ep):
            paid.append(e.seed)
    if often(paid, tried):
        findings.add("free_reward", f"where the reference declines, its reads and then idle talk until the "
                     f"episode ends earn its full score on {len(paid)} of {tried} seeds (e.g. seed {paid[0]}): "
                     "a user who gives up is not a decline the agent made; stalling must score below "
                     "deciding.", key=("free_reward", "stall"))


def second_tries(host, wrong: list, rng: random.Random, findings) -> None:
    """A write with a value the schema allows that lowered the score (an enum's other choice, a
    number), tried again: that write, then the reference's own in the next message (a wrong
    write the env answers with an error and lets go unpunished: the agent learns to guess); and
    both in one message, either way round (every call of a message run and the best one
    counted). The full score on 2 seeds or more (a quarter of those tried) is a finding."""
    from envforge.gate.dynamic import scripted

    again, both = [], []
    for e, i, j, bad in wrong:
        bad = {**bad, "id": f"call_{rng.getrandbits(32):08x}"}  # a call of its own, not the right one's id
        first = assistant(None, [bad])
        if as_good(e, host.episode("a", e.seed, scripted(e.actions[:i] + [first] + e.actions[i:]),
                                   "a wrong write, then the right one")):
            again.append(e.seed)
        calls = list(e.actions[i]["tool_calls"])
        pays = [as_good(e, host.episode("a", e.seed, scripted(
            e.actions[:i] + [{**e.actions[i], "tool_calls": calls[:j] + pair + calls[j + 1:]}] + e.actions[i + 1:]),
            "a wrong write beside the right one")) for pair in ([bad, calls[j]], [calls[j], bad])]
        if all(pays):
            both.append(e.seed)
    if often(again, len(wrong)):
        findings.add("partial_credit", f"a write with a wrong value (one that alone lowers the score), then "
                     f"the reference's right write, earns the full score on {len(again)} of {len(wrong)} seeds "
                     f"(e.g. seed {again[0]}): a wrong write must cost something, or the agent learns to "
                     "guess until the env accepts.", key=("partial_credit", "second try"))
    if often(both, len(wrong)):
        findings.add("partial_credit", f"a write with a wrong value and the reference's right write in one "
                     f"message, either way round, earn the full score on {len(both)} of {len(wrong)} seeds "
                     f"(e.g. seed {both[0]}): every variant sent at once must not pay as the right one "
                     "alone.", key=("partial_credit", "every variant at once"))


def refusal_instead(host, acting: list, said: dict, by_name: dict, kinds: dict, rng: random.Random,
                    findings, masked=lambda seed, text: text) -> None:
    """On seeds where the reference acts, its reads, then another seed's declining text (its
    records' ids made this seed's) instead of what it does next: a refusal must not earn the full
    score where the request should be carried out, or "always refuse" is the policy learnt. And
    that text after a call of a write tool the reference does not make there, on the request's
    records (a refusal judged on the records as that call left them: "it is closed" after a
    close)."""
    from envforge.gate.dynamic import _call_name, scripted

    tried, paid, near, after, writing = 0, [], [], {}, {}
    for e in acting:
        prefix = e.actions[:_after_reads(e.actions, kinds)]
        mine = _call_values(e.actions)
        texts = [_as_if(t, vals, mine) for t, vals in said.values()]
        tried += 1
        for t in rng.sample(texts, min(2, len(texts))):
            ep = host.episode("a", e.seed, scripted(prefix + [assistant(t)]), "a refusal where it acts")
            if as_good(e, ep):
                paid.append(e.seed)
                break
            if nearly(e, ep) and e.seed not in near:
                near.append(e.seed)
        if e not in acting[:4]:
            continue
        own = random.Random("a write, then a refusal")  # its own stream (rng's draws stay), alike on every seed
        sent, used = _sent_values(e.actions), {_call_name(c) for a in e.actions for c in _calls(a)}
        writes = [n for n in sorted(by_name) if n not in used and kinds.get(n) not in ("read", "escalation")]
        shapes = list({re.sub(r"\d+", "#", masked(s, t)): _as_if(t, vals, mine)  # one text of each shape
                       for s, (t, vals) in said.items()}.values())
        own.shuffle(shapes)
        for t, name in enumerate(own.sample(writes, min(5, len(writes)))):  # same tools on every seed
            args = _grounded_args(name, by_name, sent, own, ["ok"])
            if args is None:
                continue
            writing[name] = writing.get(name, 0) + 1
            call = [assistant(None, [tool_call(name, args, f"call_r{t}")])]
            if any(as_good(e, host.episode("a", e.seed, scripted(prefix + call + [assistant(text)]),
                                           f"{name}, then a refusal where it acts")) for text in shapes[:4]):
                after.setdefault(name, []).append(e.seed)
    if often(paid, tried):
        findings.add("free_reward", f"a refusal (another seed's, after this seed's reads) earns the full score "
                     f"on {len(paid)} of {tried} seeds where the reference carries the request out (e.g. seed "
                     f"{paid[0]}): refusing must not pay where acting is right, or the agent learns to refuse "
                     "everything.", key=("free_reward", "refusal where it acts"))
    else:  # (a seed in ``near`` did not earn the full score)
        _keeps(findings, near, tried, "a refusal where the reference carries the request out")
    for name, seeds in sorted(after.items()):
        if often(seeds, writing[name]):
            findings.add("free_reward", f"{name} on the request's own records, then a refusal (another seed's), "
                         f"earns the full score on {len(seeds)} of {writing[name]} seeds where the reference carries the "
                         f"request out (e.g. seed {seeds[0]}): a refusal judged on the records as the agent's own "
                         "write left them pays the agent for making its excuse true.",
                         key=("free_reward", "refusal after a write", name))
            break


def _shown_value(value: Any, schema: Any, episode) -> Any:
    """A value like ``value`` that ``episode`` shows: an enum choice its user's messages name
    (the first named), a string of the same shape and prefix in its observations, a number its
    user's messages hold; else ``value``."""
    users = " ".join(str(m.get("content") or "") for step in episode.trace for m in step[0]["messages"]
                     if m.get("role") == "user")
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if isinstance(enum, list) and enum:
        named = [(users.lower().find(str(x).lower()), x) for x in enum if str(x).lower() in users.lower()]
        return min(named, key=lambda p: p[0])[1] if named else value
    if isinstance(value, str):
        return next(iter(_shaped(value, episode)), value)
    if isinstance(value, int) and not isinstance(value, bool):
        numbers = [int(n) for n in re.findall(r"(?<![\w-])\d{1,6}(?![\w-])", users)]
        return numbers[0] if numbers else value
    return value


def _calls(a: Any) -> list:
    """A message's well-formed tool calls (a dict with a function whose name is a string)."""
    from envforge.gate.dynamic import _call_name
    calls = a.get("tool_calls") if isinstance(a, dict) else None
    return [c for c in calls if _call_name(c) is not None] if isinstance(calls, list) else []


def transplant(e, other, tail: list, by_name: dict, before: list | None = None) -> list:
    """``tail`` (what ``other``'s reference does after its reads: the end of its plan) as if said
    on ``e``'s seed: its calls' values and its texts with the record values (``_call_values``)
    ``other``'s calls before the tail sent made those ``e``'s calls ``before`` (its plan by
    default) sent for the same argument of the same call (``_as_if``: an id, also inside a
    note's text); a value that leaves unchanged made one ``e``'s episode shows
    (``_shown_value``)."""
    from envforge.gate.dynamic import _json_args, _properties

    mine = _call_values(e.actions if before is None else before)
    theirs = _call_values(other.actions[:len(other.actions) - len(tail)])
    same = (dict(theirs), dict(mine))

    def moved(v: Any, schema: Any) -> Any:
        w = _as_if(v, *same) if isinstance(v, str) else v
        return w if w != v else _shown_value(v, schema, e)

    swap: dict = {}  # (tool, argument, n-th call of the tool in the tail) -> this seed's value
    plan, seen = [], {}
    for a in tail:
        if not _calls(a):
            plan.append(assistant(str(a.get("content") or "") if isinstance(a, dict) else ""))
            continue
        new = []
        for c in _calls(a):
            name = c["function"]["name"]
            n = seen[name] = seen.get(name, -1) + 1
            props, args = _properties(by_name, name), {}
            for k, v in (_json_args(c) or {}).items():
                args[k] = v
                if isinstance(v, (str, int)) and not isinstance(v, bool):
                    args[k] = swap[(name, k, n)] = moved(v, props.get(k))
                    theirs[(name, k, n)] = str(v)  # its texts say it too
            new.append(tool_call(name, args, c.get("id", "call_0")))
        plan.append(assistant(a.get("content"), new))
    mine.update((k, str(v)) for k, v in swap.items())
    return [m if m.get("tool_calls") else assistant(_as_if(m.get("content") or "", theirs, mine, whole=True))
            for m in plan]


def act_instead(host, declining: list, acting: list, by_name: dict, kinds: dict, findings) -> None:
    """On seeds where the reference declines, its calls before its decline (a hand-off to a human
    after the decline left out), then what the reference does on a seed where it acts (its texts
    and calls after its reads, and its calls alone: a write made without asking), its values made
    this seed's (``transplant``), then, where the episode goes on after the write (a write tool
    that refuses and says why), the reference's own ending: carrying out a request that should be
    declined must not earn the full score, nor keep ``WRONG_KEEPS`` of it, or the check before it
    teaches nothing; nor, where the reference declines without asking (no question before its
    decline), the act's question alone (the user's "no" paid as the agent's decline)."""
    from envforge.gate.dynamic import _json_args, scripted

    tails, tools = [], set()
    for e in acting:  # one tail per write tool
        tail = e.actions[_after_reads(e.actions, kinds):]
        name = next(c["function"]["name"] for a in tail if _acts([a], kinds) for c in a["tool_calls"]
                    if kinds.get(c["function"]["name"]) not in ("read", "escalation"))
        if name not in tools:
            tools.add(name)
            tails.append((e, tail))
    tried, paid, near, told = 0, [], [], []
    for e in declining:
        last = _last_call(e.actions, kinds)  # its decision is what follows (a hand-off after it too)
        calls = [a for a in e.actions[:last + 1] if a.get("tool_calls")]
        decline = e.actions[last + 1:]
        texts = [a.get("content") for a in e.actions if not a.get("tool_calls")]
        alone = bool(texts) and not any(isinstance(t, str) and "?" in t for t in texts[:-1])  # it declines without asking
        tried += 1
        shown = _said([m for step in e.trace for m in step[0]["messages"]])
        for other, tail, bare in [(o, t, b) for o, t in tails[:3] for b in (False, True)]:
            moved = transplant(e, other, tail, by_name)
            if bare:  # its calls alone (a write made without the question before it)
                if all(a.get("tool_calls") for a in moved):
                    continue
                moved = [a for a in moved if a.get("tool_calls")]
            # the decline after it only where the write names records this seed shows (its values
            # with a digit or a mark: ids, emails; a write on a record that does not exist is
            # answered with an error and changes nothing)
            grounded = all(_shows(shown, str(v)) for a in moved for c in _calls(a)
                           if kinds.get(c["function"]["name"]) not in ("read", "escalation")
                           for v in (_json_args(c) or {}).values() if _names_a_record(v))
            # (not after the calls alone: a good env's write tool may refuse an unconfirmed write
            # at no cost, and the decline after it is then rightly paid)
            ep = host.episode("a", e.seed, scripted(calls + moved + (decline if grounded and not bare else [])),
                              "acting where it declines")
            # it counts only where the write was made (a user who says no to the question ends
            # the episode before it, which is the right end)
            if as_good(e, ep) and _acts(ep.actions, kinds):
                paid.append(e.seed)
                break
            # where the reference declines without asking, the act's question answered (a "no"
            # that ends it) must not earn the decline's full score: the user decided, not the agent
            if alone and not bare and as_good(e, ep) and any(not a.get("tool_calls") for a in ep.actions) \
                    and e.seed not in told:
                told.append(e.seed)
            if grounded and nearly(e, ep) and _acts(ep.actions, kinds) and e.seed not in near:
                near.append(e.seed)
    if often(told, tried):
        findings.add("free_reward", f"where the reference declines on its own, asking the user what it would do "
                     f"where it acts (that seed's question, made this seed's) and going no further earns its full "
                     f"score on {len(told)} of {tried} seeds (e.g. seed {told[0]}): the user's answer stands in for "
                     "the agent's decline, so the check before it teaches nothing.",
                     key=("free_reward", "the user declines"))
    if often(paid, tried):
        findings.add("free_reward", f"carrying the request out (what the reference does where it acts, with "
                     f"this seed's values) earns the full score on {len(paid)} of {tried} seeds where the "
                     f"reference declines (e.g. seed {paid[0]}; where the env went on after the write, the "
                     "reference's decline said after it): a write that should be refused must not pay, nor "
                     "may trying it and then declining (a write tool that refuses and says why does the "
                     "check for the agent), or the check before it teaches nothing.",
                     key=("free_reward", "acting where it declines"))
    else:
        _keeps(findings, near, tried, "carrying the request out where the reference declines")


def _kind(plan: list, by_name: dict) -> frozenset:
    """The kind of an ending: the tools it calls, each with its arguments that choose among a few
    values (an enum of the schema, a boolean); ids, numbers and free text aside."""
    from envforge.gate.dynamic import _json_args, _properties

    def chooses(schema: Any, v: Any) -> bool:
        return isinstance(v, bool) or isinstance(schema, dict) and isinstance(schema.get("enum"), list)

    out = set()
    for a in plan:
        for c in _calls(a):
            name, props = c["function"]["name"], _properties(by_name, c["function"]["name"])
            out.add((name, tuple(sorted((k, json.dumps(v, default=str)) for k, v in (_json_args(c) or {}).items()
                                        if chooses(props.get(k), v)))))
    return frozenset(out)


def one_ending(host, acting: list, by_name: dict, kinds: dict, rng: random.Random, findings) -> None:
    """Where a decline is itself a write, every seed writes. Between seeds where the reference
    writes, of two kinds of ending (``_kind``; neither holding the other): seed A's plan up to
    its ending, then seed B's ending (``transplant``: its values made A's); and the other way
    round. B's ending earning A's full score while A's does not earn B's is one kind of ending
    that pays where another is right (a close naming any check where the request should be
    granted, or the grant where a check fails): the agent learns it in place of the decision.
    Endings that pay on each other's seeds are two right answers and count for nothing, and so
    does a seed whose plan up to its ending earns the full score alone."""
    from envforge.gate.dynamic import scripted

    tails = [(e, e.actions[_after_reads(e.actions, kinds):]) for e in acting]
    of_kind: dict = {}  # kind of ending -> its seeds: 8 seeds, each kind in turn
    for e, own in tails:
        of_kind.setdefault(_kind(own, by_name), []).append((e, own))
    chosen = [t for turn in itertools.zip_longest(*of_kind.values()) for t in turn if t][:8]
    tried, paid = 0, []
    for e, own in chosen:
        mine, before = _kind(own, by_name), e.actions[:len(e.actions) - len(own)]
        others: dict = {}  # kind -> one ending of it, this seed's values (each kind tried once)
        for other, tail in rng.sample(tails, len(tails)):
            moved = transplant(e, other, tail, by_name, before) if other is not e else []
            kind = _kind(moved, by_name)
            if kind and not (kind <= mine or mine <= kind):
                others.setdefault(kind, (other, tail, moved))
        if not others or as_good(e, host.episode("a", e.seed, scripted(before), "its plan up to its ending")):
            continue
        tried += 1
        for other, tail, moved in list(others.values())[:4]:
            ep = host.episode("a", e.seed, scripted(before + moved), "another seed's ending")
            if not (as_good(e, ep) and _acts(ep.actions, kinds)):
                continue
            theirs = other.actions[:len(other.actions) - len(tail)]
            back = theirs + transplant(other, e, own, by_name, theirs)
            if not as_good(other, host.episode("a", other.seed, scripted(back), "this seed's ending there")):
                paid.append(e.seed)
                break
    if often(paid, tried):
        findings.add("free_reward", f"another seed's kind of ending (what its reference does after its reads, "
                     f"with this seed's values: other tools or choices than this seed's) earns the full score "
                     f"on {len(paid)} of {tried} seeds where the reference ends otherwise, while this seed's "
                     f"ending does not pay there (e.g. seed {paid[0]}): one kind of ending pays where another "
                     "is right (a decline recorded as a write, say, that names any check), so the agent "
                     "learns it in place of the decision.", key=("free_reward", "one ending everywhere"))


#: a number standing as a word (an amount, a count), not an id's digits: texts that differ in
#: these alone are answers, not a vocabulary of reasons
_NUMBER = re.compile(r"(?<![\w.-])\d+(?:[.,]\d+)*(?![\w-])")


def every_reason_written(host, acting: list, by_name: dict, kinds: dict, rng: random.Random, findings) -> None:
    """Where a decline is itself a write (a close whose resolution names the failed check), its
    reason is an argument of a call after the reads, not a text (``every_reason``'s side): a
    free text (2 words or more, not an enum) or a list of strings (tags). For each such argument
    whose values on 3 seeds or more are a small vocabulary (their shapes, ids and digits aside,
    repeat; not answers that differ in a number alone): on up to 8 seeds, up to 4 other seeds'
    values (their records' values made this seed's, an id's number standing alone too) sent one
    at a time in place of this seed's; where one of them scores lower (the reason written
    matters), all of them at once, then this seed's own with such a wrong one beside it, either
    way round, then (a text) each reason cut to its shortest piece that pays on its own seed,
    in one sentence. The full score on 2 seeds or more (a quarter of those where the reason
    matters) means the env credits a decline whenever the right reason is among those written:
    the agent learns to write every reason there is."""
    from envforge.gate.dynamic import _json_args, _properties, scripted

    def reason_like(v: Any, schema: Any) -> bool:
        if isinstance(v, list):
            return bool(v) and all(isinstance(x, str) and x.strip() for x in v)
        enum = isinstance(schema, dict) and isinstance(schema.get("enum"), list)
        return isinstance(v, str) and len(v.split()) >= 2 and not enum

    slots: dict = {}  # (tool, argument) -> {seed: (episode, action, call, value)}: a seed's first
    for e in acting:
        for i in range(_after_reads(e.actions, kinds), len(e.actions)):
            for j, c in enumerate(_calls(e.actions[i])):
                name = c["function"]["name"]
                props = _properties(by_name, name)
                for k, v in (_json_args(c) or {}).items():
                    if reason_like(v, props.get(k)):
                        slots.setdefault((name, k), {}).setdefault(e.seed, (e, i, j, v))

    def values(e, i: int, name: str, k: str) -> dict:
        """The record values this seed's plan sent up to its write, the write's own arguments
        too (an id only the close sends), but the reason itself; an id's number also alone
        (TCK-48213's 48213, as a text may give it)."""
        out = {}
        for key, v in _call_values(e.actions[:i + 1]).items():
            if key[:2] != (name, k):
                out[key] = v
                m = re.fullmatch(r"[A-Za-z]+[-_ #]?0*(\d{3,})", v)
                if m:
                    out[key + ("number",)] = m.group(1)
        return out

    def mapped(v: Any, theirs: dict, mine: dict) -> Any:
        return [_as_if(x, theirs, mine, whole=True) for x in v] if isinstance(v, list) else \
            _as_if(v, theirs, mine, whole=True)

    def joined(vs: list) -> Any:
        if isinstance(vs[0], list):
            return list(dict.fromkeys(x for v in vs for x in v))
        return " ".join(vs)

    def written(e, i: int, j: int, k: str, value: Any, label: str):
        plan = list(e.actions)
        calls = _calls(plan[i])  # the well-formed calls, as the slot counted them
        args = dict(_json_args(calls[j]) or {}, **{k: value})
        calls = calls[:j] + [tool_call(calls[j]["function"]["name"], args, calls[j].get("id", "call_0"))] + calls[j + 1:]
        plan[i] = assistant(plan[i].get("content"), calls)
        return host.episode("a", e.seed, scripted(plan), label)

    usable = []
    for (name, k), by_seed in slots.items():
        vals = {s: values(e, i, name, k) for s, (e, i, _, _) in by_seed.items()}
        first = next(iter(by_seed))
        texts = {json.dumps(mapped(t, vals[s], vals[first])) for s, (_, _, _, t) in by_seed.items()}
        numbers = {_NUMBER.sub("#", t) for t in texts}
        if len(by_seed) >= 3 and len(texts) >= 2 and 2 * len({re.sub(r"\d+", "#", t) for t in texts}) <= len(by_seed) \
                and len(numbers) == len(texts):  # a vocabulary, not notes; not answers differing in a number
            usable.append((len(by_seed), name, k, by_seed, vals))
    for _, name, k, by_seed, vals in sorted(usable, key=lambda u: -u[0])[:3]:
        shortest: dict = {}  # seed -> its text's shortest piece that earns its full score

        def short(o):
            if o not in shortest:
                eo, io, jo, to = by_seed[o]
                shortest[o] = _shortest(to, lambda t: as_good(eo, written(eo, io, jo, k, t, "its reason alone")))
            return shortest[o]
        matter, paid = 0, []
        for s, (e, i, j, own) in list(by_seed.items())[:8]:
            others = {}  # another seed's value, made this seed's -> that seed
            for o, (_, _, _, t) in by_seed.items():
                if o != s:
                    m = mapped(t, vals[o], vals[s])
                    others.setdefault(json.dumps(m), (o, m))
            if len(others) < 2:
                continue
            order = list(others.values())
            rng.shuffle(order)
            wrong = next(((o, t) for o, t in order[:4] if not as_good(e, written(e, i, j, k, t, "another seed's reason written"))), None)
            if wrong is None:
                continue
            matter += 1
            tries = [(joined([t for _, t in order]), "every reason written at once"),
                     (joined([own, wrong[1]]), "its reason and a wrong one"),
                     (joined([wrong[1], own]), "a wrong reason and its own")]
            if any(as_good(e, written(e, i, j, k, t, label)) for t, label in tries):
                paid.append(s)
            elif isinstance(own, str) and matter <= 4:  # a reward that pays only short texts
                pieces = [short(s)] + [mapped(short(o), vals[o], vals[s]) for o, _ in order[:3]]
                brief = list(dict.fromkeys(p for p in pieces if p))
                rng.shuffle(brief)
                if len(brief) > 1 and as_good(e, written(e, i, j, k, ", ".join(brief) + ".", "every reason, briefly")):
                    paid.append(s)
        if often(paid, matter):
            findings.add("free_reward", f"a write whose {k!r} argument ({name}) holds other reasons beside the "
                         f"right one (every other seed's value of it at once, one wrong one beside its own, or "
                         f"each cut short in one sentence) earns the full score on {len(paid)} of {matter} seeds "
                         f"where a wrong one alone scores lower (e.g. seed {paid[0]}): every reason at once pays; "
                         "credit a decline only for the reason that holds, or the agent learns to write them all.",
                         key=("free_reward", "every reason written"))
            return


#: capabilities about deciding whether to act (where a declining text gives a reason)
_DECIDING = re.compile(r"refus|polic|precondition|verif|permission|eligib|complian|rule|safety|declin|"
                       r"constraint|authori|allowed|forbid|guard", re.I)


def every_reason(host, solved: list, by_name: dict, kinds: dict, draws, findings) -> None:
    """On seeds where the reference declines (it makes no write and ends on a text), the other
    seeds' declining texts, their records' ids made this seed's, said one at a time and then all
    at once. Where one of them alone scores lower (the reason given matters) and all at once earn
    the full score, the env credits a refusal whenever the right reason is among those named: the
    agent learns to name every reason there is (a small, fixed vocabulary, unlike an answer's
    number, which another seed's text does not hold)."""
    from envforge.gate.dynamic import _drawn_solved, scripted

    def declines(e) -> bool:
        return bool(_decision_texts(e.actions, kinds)) and not _acts(e.actions, kinds)

    acting = [e for e in solved if _acts(e.actions, kinds)]
    found = [e for e in solved if declines(e)]
    # a capability about deciding, or an env whose reference acts on some seeds and declines on
    # others (whatever it calls itself); not an env that only answers: an answer's vocabulary
    # can be as small as a count of 0 to 3, and every count at once names the right one
    deciding = bool(_DECIDING.search(str(host.meta.get("capability") or "")))
    # a decline written into a record is judged whatever the env calls itself: such an env has
    # no declining text, so the condition below would leave it out
    every_reason_written(host, acting, by_name, kinds, random.Random(f"reasons written {draws.probe_seed}"), findings)
    if not (deciding or (len(acting) >= 2 and len(found) >= 2)):
        return
    one_ending(host, acting, by_name, kinds, random.Random(f"one ending {draws.probe_seed}"), findings)
    rng = random.Random(f"every reason {draws.probe_seed}")  # a stream of its own: the other draws stay
    for _ in range(32):  # a few refusals among many seeds, each reason on few: more seeds, drawn
        if len(found) >= 16 or not found:
            break
        e = _drawn_solved(host, rng)
        if e is not None and declines(e):
            found.append(e)
    if len(found) < 3:
        return
    said = {e.seed: (" ".join(e.actions[i]["content"].strip() for i in _decision_texts(e.actions, kinds)),
                     _call_values(e.actions)) for e in found}
    # words of a seed's own opening that few other seeds' openings hold (the name the reference
    # addresses the user by) are masked when texts are compared: else every text reads as its own
    opening = {e.seed: set(re.findall(r"[^\W\d_]{2,}", _said(e.trace[0][0]["messages"]).lower()))
               for e in found if e.trace}
    held = Counter(w for words in opening.values() for w in words)

    def masked(seed, t: str) -> str:
        own = {w for w in opening.get(seed, ()) if held[w] * 4 < len(opening)}
        return re.sub(r"[^\W\d_]{2,}", lambda m: "@" if m.group(0).lower() in own else m.group(0), t)

    refusal_instead(host, acting[:8], said, by_name, kinds, rng, findings, masked)
    act_instead(host, found[:8], acting, by_name, kinds, findings)
    by_seed = {e.seed: e for e in found}

    def instead(e, text: str, label: str, then: str | None = None):
        where = _decision_texts(e.actions, kinds)
        plan = [a for i, a in enumerate(e.actions) if i not in where[1:]]
        plan[where[0]] = assistant(text)
        if then is not None:  # another turn after it
            plan.insert(where[0] + 1, assistant(then))
        return host.episode("a", e.seed, scripted(plan), label)

    def _one_message(e) -> bool:
        where = _decision_texts(e.actions, kinds)
        return len(where) == 1 or as_good(e, host.episode("a", e.seed, scripted(
            [a for i, a in enumerate(e.actions) if i not in where[:-1]]), "its last declining text alone"))

    reasons: dict = {}  # seed -> the shortest piece of its text that earns its full score alone

    def reason(seed) -> str:
        if seed not in reasons:
            e = by_seed[seed]
            reasons[seed] = _shortest(said[seed][0], lambda t: as_good(e, instead(e, t, "its reason alone")))
        return reasons[seed]

    # one seed for each text's shape (its records' ids made one seed's, its digits aside): a
    # reason to cut once. The reasons are a small vocabulary only where shapes repeat (a count or
    # a total answered is another text on every seed: every number at once is no shotgun)
    shapes: dict = {}
    first = next(iter(said))
    for s_, (t, vals) in said.items():
        shapes.setdefault(re.sub(r"\d+", "#", masked(s_, _as_if(t, vals, said[first][1]))), s_)
    few = 2 * len(shapes) <= len(said)
    # texts that differ in their numbers alone (standing as words: not an id's digits) are
    # answers (a total, a count), where an env not about deciding got here by acting on some
    # seeds: every answer at once names the right one wherever two seeds' answers agree, which
    # is no shotgun of reasons
    texts = {_as_if(t, vals, said[first][1]) for t, vals in said.values()}
    if not deciding and len(
            {_NUMBER.sub("#", t) for t in texts}) < len(texts):
        return

    # the records said back in place of the decline (the reads' results as they came): an env
    # that takes them for the decline decides for the agent, which learns to paste what it read
    recited, pasted = [], 0
    for e in found[:8]:
        before = _decision_texts(e.actions, kinds)[0]
        shown = [m["content"] for step in e.trace[1:before + 1] for m in step[0].get("messages") or []
                 if isinstance(m, dict) and m.get("role") == "tool" and isinstance(m.get("content"), str)
                 and m["content"].strip()]
        if shown:
            pasted += 1
            if as_good(e, instead(e, "\n".join(shown), "the reads' results said back")):
                recited.append(e.seed)
    if len(recited) >= 3 and 2 * len(recited) >= pasted:  # half, not a quarter: an env that judges a
        # decline by a word its records hold takes a pasted record for it on some seeds (the shipped
        # env did, an overdue loan's, until it read replies with the records taken out)
        findings.add("free_reward", f"the results of the reference's reads said back as they came, in place of "
                     f"its decline, earn the full score on {len(recited)} of {pasted} seeds where it declines "
                     f"(e.g. seed {recited[0]}): the env takes the records for the decision, so the agent "
                     "learns to paste what it read and never decide. Credit a decline only for a refusal "
                     "that names what blocks the request.", key=("free_reward", "records said back"))

    matter, paid, retried = 0, [], []
    for e in found[:8]:
        mine = said[e.seed][1]
        others = list(dict.fromkeys(_as_if(t, vals, mine) for s, (t, vals) in said.items() if s != e.seed))
        if len(others) < 2:
            continue
        rng.shuffle(others)
        wrong = [t for t in others[:8] if not as_good(e, instead(e, t, "another seed's refusal"))]
        if not wrong:
            continue
        matter += 1
        # a wrong reason, then the right one in the next turn: a wrong guess must cost something,
        # or the agent learns to guess the reasons one per turn until the user stops objecting.
        # Only where the reference decides in one message: where it takes two (a question, then
        # what it says to the answer; a refusal held after the user pushes back) the first can be
        # repaired by design (the user says which resolution was meant). A decision whose texts
        # before the last earn nothing (a preamble: "I have your records now.") is in one message
        if few and _one_message(e) and any(
                as_good(e, instead(e, t, "a wrong reason, then the right one", then=said[e.seed][0]))
                for t in wrong[:2]):
            retried.append(e.seed)
        if as_good(e, instead(e, " ".join(others), "every reason at once")):
            paid.append(e.seed)
            continue
        if not few:
            continue
        # a reward that pays only short replies: each seed's reason alone, all in one sentence
        brief = list(dict.fromkeys([reason(e.seed)] + [_as_if(reason(s), said[s][1], mine)
                                                       for s in list(shapes.values())[:8] if s != e.seed]))
        rng.shuffle(brief)
        if len(brief) > 2 and as_good(e, instead(e, ", or ".join(brief) + ".", "every reason, briefly")):
            paid.append(e.seed)
    if often(retried, matter):
        findings.add("free_reward", f"a refusal naming a wrong reason, followed in the next turn by the "
                     f"reference's own, earns the full score on {len(retried)} of {matter} seeds where the "
                     f"wrong reason alone scores lower (e.g. seed {retried[0]}): a wrong guess costs "
                     "nothing, so the agent learns to try the reasons one per turn; end the episode or "
                     "lower the score at a wrong claim.", key=("free_reward", "reasons retried"))
    if often(paid, matter):
        findings.add("free_reward", f"a refusal that names every reason at once (the other seeds' declining "
                     f"texts in one reply, or their reasons in one short sentence) earns the full score "
                     f"on {len(paid)} of {matter} seeds where one of them alone scores lower (e.g. seed {paid[0]}): "
                     "credit a refusal only for the reason that holds, or the agent learns to name them all.",
                     key=("free_reward", "every reason"))
