"""The dynamic stage of the gate: the env runs, in a sandbox, under probe policies and hypothesis.

Every property of ENV_CONTRACT.md's table that needs the code to run is checked here. Env code
may have read this file, so every probe is drawn per audit from one probe seed (``Draws``:
seeds from a large range, free texts up to several KB, the other sandboxes' PYTHONHASHSEEDs,
hypothesis's own draws), recorded in the report and replayable with ``--probe-seed``:

- probes over ``settings.seeds`` drawn seeds: the reference ``solve``, a perturbed reference (one
  action dropped, one argument changed, or the plan cut short), a do-nothing policy (talks drawn
  text, calls no tool) and a random policy (schema-valid calls and chatter, drawn by hypothesis);
- hypothesis state machines whose rules are tool calls drawn from each tool's JSON schema plus
  malformed calls of every kind and drawn text (robustness);
- does the env test its capability: the reference's words without its tool calls, each
  argument of its writes changed in turn, its reads removed, extreme values in its own calls,
  episodes played to max_turns, and whether its arguments were ever shown to the agent;
- thousands of resets of one instance in one runner request: drift, slowdown, memory growth;
- determinism: the reference and random episodes replayed in the same instance, in a second
  instance, and dealt out over ``hash_processes`` fresh sandbox processes, each with another
  PYTHONHASHSEED (the first runs under the one training uses);
- isolation: an episode interleaved step by step with another instance's episode must not change.

Every call has a time limit and the sandbox a memory limit: a hang, a crash or a blow-up becomes
a ``bounded`` finding and the sandbox is replaced, never a hung audit; anything else that goes
wrong (hypothesis confused by the env included) is a finding too, never a traceback. Thresholds
live in ``GateSettings`` (``config.py``); each finding's message says what was seen and what to
change.
"""
from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from envforge.contract import (DEFAULT_MAX_TURNS, MAX_TURNS_LIMIT, Finding, assistant,
                               canonical_json, message_problem, mix_seed, tool_call)
from envforge.errors import EnvCallError, SandboxError, SandboxTimeout
from envforge.gate import probes
from envforge.gate.config import GateSettings
from envforge.gate.schema import call_problem
from envforge.gate.static import PARSE_LOCK


_WORDS = ("hello help order refund cancel please thanks account update confirm yes no done policy "
          "sorry check status ticket user email change address payment item return exchange "
          "transfer agent ok sure great the a to for your my is it this that").split()


#: stock replies an agent can say without looking at anything (a refusal, an acknowledgement, a
#: hand-off, a sign-off), composed of parts so that a reward keyed to a pattern, not a literal,
#: meets one: "I'm sorry, I can't help with that." paying on every seed is free reward
STOCK_REPLIES, STOCK_SEEDS = 10, 5  # stock replies an audit, and the seeds each is said on
_STOCK_OPEN = ("", "I'm sorry, but ", "Sorry, ", "Unfortunately, ", "I apologize, but ", "I'm afraid ")
_STOCK_REFUSE = ("I can't", "I cannot", "I can not", "I'm unable to", "I am unable to", "I am not able to",
                 "I won't be able to", "I'm not allowed to", "I must decline to", "I don't think I can")
_STOCK_WHAT = ("help with that", "do that", "assist with this request", "make that change",
               "process this request", "help you with this", "proceed")
_STOCK_OTHER = ("Done! Your request has been completed.", "I have taken care of that for you.",
                "Your request has been processed successfully.", "Is there anything else I can help you with?",
                "Let me transfer you to a human agent who can help.", "Okay, understood.",
                "Thank you for contacting us. Have a great day!", "I have checked everything and it is all in order.",
                "Please hold on while I look into this.")


def stock_replies(rng: random.Random, n: int) -> list[tuple[str, bool]]:
    """``n`` stock replies, (text, whether it refuses): every other one another stock phrase, the
    rest refusals composed of parts (so that a pattern over the ways of refusing meets one), the
    first the plainest, then one sentence and three in turn (a reward kept to short replies)."""
    others = rng.sample(_STOCK_OTHER, len(_STOCK_OTHER))
    out = []
    for i in range(n):
        if i % 2:
            out.append((others[i // 2 % len(others)], False))
            continue
        if i == 0:
            out.append(("I'm sorry, I can't help with that.", True))
            continue
        said = []
        for _ in range(1 if i % 4 == 2 else 3):
            text = rng.choice(_STOCK_OPEN) + rng.choice(_STOCK_REFUSE) + " " + rng.choice(_STOCK_WHAT) + "."
            said.append(text[:1].upper() + text[1:])
        out.append((" ".join(said), True))
    return out


class Draws:
    """Everything the probes draw, from one probe seed: so that env code cannot recognise a probe
    (fixed seeds, fixed texts, fixed hash seeds) and an audit can still be replayed exactly."""

    def __init__(self, probe_seed: int, settings: GateSettings):
        self.probe_seed = probe_seed
        rng = random.Random(probe_seed)
        n = settings.seeds
        # the mix training draws its env seeds from (``contract.training_seeds``, keyed per run),
        # so a flaw kept to some seeds meets as large a share of both: half small (a ninth red
        # team's env forgot its check on seeds 0-199, where training's seeds once counted up from
        # 0), a quarter middling, a quarter large; every other seed a small one, so that the
        # probes that look at the first few seeds of a kind look there too
        seeds: list[int] = []
        while len(seeds) < n:
            x = mix_seed(rng, len(seeds) % 4)
            if x not in seeds:
                seeds.append(x)
        self.seeds = seeds
        self.hash_seed = rng.randrange(1, 2**32)
        # the other processes' hash seeds come from a stream of their own, so that every other
        # draw (texts, hypothesis) stays what it was with one process
        more, taken = random.Random(f"hash seeds {probe_seed}"), {self.hash_seed, settings.training_hash_seed}
        self.hash_seeds = [self.hash_seed]
        while len(self.hash_seeds) < settings.hash_processes:
            x = more.randrange(1, 2**32)
            if x not in taken:
                taken.add(x)
                self.hash_seeds.append(x)
        self.texts = [self.text(rng, rng.choice((8, 30, 120, 400, 1500, settings.long_text_chars)))
                      for _ in range(16)]
        self.texts.append(self.text(rng, settings.long_text_chars))
        self.rng = rng
        # replies of any length, from 0 characters to the longest (log-uniform, one from each
        # fifteenth of the log scale; a stream of their own so that the draws above stay what
        # they were): a reward that pays a text of some length band must not find the sizes
        # above (8, 30, ... 1500, 6000) stepping over it
        sized, top = random.Random(f"sized texts {probe_seed}"), math.log(settings.long_text_chars)
        self.sized = [""] + [self.text(sized, int(math.exp(sized.uniform(i, i + 1) * top / 15))) for i in range(15)]
        # stock replies (a stream of their own), each a policy judged on STOCK_SEEDS seeds
        self.stock = stock_replies(random.Random(f"stock replies {probe_seed}"), STOCK_REPLIES)

    @staticmethod
    def text(rng: random.Random, size: int) -> str:
        """About ``size`` characters of words, numbers, punctuation and some non-ASCII."""
        out, n = [], 0
        while n < size:
            r = rng.random()
            w = (rng.choice(_WORDS) if r < 0.7 else str(rng.randrange(10**rng.randrange(1, 9)))
                 if r < 0.85 else rng.choice("?!.,:;-'\"()") if r < 0.95
                 else "".join(chr(rng.randrange(0xA1, 0x2FFF)) for _ in range(rng.randrange(1, 4))))
            out.append(w)
            n += len(w) + 1
        text = " ".join(out)[:max(size, 1)]
        return text[:1].upper() + text[1:]

    def talker(self, seed: int) -> Callable[[int, list], Any]:
        """A do-nothing policy: talks drawn text every turn, calls no tool."""
        rng = random.Random(self.probe_seed ^ (seed * 2654435761))
        return lambda t, messages: assistant(rng.choice(self.texts))


class GiveUp(Exception):
    """The sandbox failed too often, or the time budget ran out: the rest of the stage is skipped.
    The message says which."""


@dataclass
class ProbeEpisode:
    seed: int
    actions: list = field(default_factory=list)
    trace: list = field(default_factory=list)   # [reset value, step value, ...]
    score: float = 0.0
    ended: bool = False
    ok: bool = True                              # False when the episode broke off on an error

    def fingerprint(self) -> str:
        return canonical_json([self.trace[0][0]] + [s[0] for s in self.trace[1:]]) if self.trace else ""


class Host:
    """Drives one env in one sandbox (restarted when it dies) and turns failures into findings."""

    def __init__(self, backend, source: str, settings: GateSettings, hash_seed: int, findings: "Findings",
                 deadline: float, timings: list[float]):
        self.backend, self.source, self.settings = backend, source, settings
        self.hash_seed, self.findings = hash_seed, findings
        self.deadline, self.timings = deadline, timings   # shared by the hosts of one audit
        self.sandbox = None
        self.meta: dict = {}
        self.failures = 0
        self.instances: dict[str, int] = {}
        self.slow: list[str] = []  # the calls slower than settings.slow_call_s

    def start(self) -> dict:
        self.sandbox = self.backend.start(self.settings.limits, hash_seed=self.hash_seed)
        self.instances = {}
        self.meta = self.sandbox.load(self.source)
        return self.meta

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.kill()

    @property
    def max_turns(self) -> int:
        mt = self.meta.get("max_turns", DEFAULT_MAX_TURNS)
        return mt if isinstance(mt, int) and 1 <= mt <= MAX_TURNS_LIMIT else DEFAULT_MAX_TURNS

    def inst(self, name: str) -> int:
        """The instance called ``name`` in the live sandbox; a dead sandbox is replaced first."""
        if self.sandbox is None or self.sandbox.closed:
            self.failures += 1
            if self.failures > self.settings.max_sandbox_failures:
                raise GiveUp(f"the sandbox failed {self.failures} times; the remaining dynamic checks "
                             "were skipped")
            self.start()
        if name not in self.instances:
            self.instances[name] = self.sandbox.new()
        return self.instances[name]

    def op(self, where: str, op: str, name: str, *args) -> Any:
        """``sandbox.<op>(instance <name>, *args)``; on failure a finding and None."""
        if time.monotonic() > self.deadline:
            calls = len(self.timings)
            mean = sum(self.timings) / calls * 1000 if calls else 0.0
            raise GiveUp(f"the dynamic checks ran out of their {self.settings.budget_s:g} s budget after "
                         f"{calls} calls (mean {mean:.1f} ms a call); the remaining checks were skipped. "
                         "reset/step/solve must take milliseconds: training runs them thousands of times.")
        try:
            inst = self.inst(name)  # may replace a dead sandbox, so resolve before the method
            t0 = time.monotonic()
            if op == "state":  # the env's module-level state, a digest per name, and the instance's
                value = self.sandbox.call("state", instance=inst), self.sandbox
            elif op == "resets":  # the batch op: (seeds, seconds)
                seeds, max_s = args
                left = max(0.1, self.deadline - time.monotonic())
                value = self.sandbox.call("resets", timeout=min(left, max_s + self.settings.limits.call_timeout_s),
                                          instance=inst, seeds=seeds, max_s=max_s)
            else:
                value = getattr(self.sandbox, op)(inst, *args)
            took = time.monotonic() - t0
            self.timings.append(took)
            if took > self.settings.slow_call_s and op not in ("resets", "state"):
                self.slow.append(f"{where} took {took:.2f} s")
                if len(self.slow) == 3:  # one slow call can be a busy machine; three are the env
                    self.findings.add("bounded", f"{'; '.join(self.slow)} (allowed: {self.settings.slow_call_s:g} s "
                                      "a call); reset/step must take milliseconds: training makes thousands of them",
                                      key=("bounded", "slow"))
            return value
        except EnvCallError as e:
            if e.kind == "protocol" and op in ("resets", "state"):
                raise  # a runner without the op (an older image): the caller falls back
            if e.kind == "json":
                self.findings.add("json", f"{where}: {e.message}. Observations, infos and actions must "
                                  "be plain JSON (dict, list, str, number, bool, None; str keys).")
            elif e.kind == "contract":
                self.findings.add("contract.runtime", f"{where}: {e.message}")
            elif e.type == "MemoryError":
                self.findings.add("bounded", f"{where}: ran out of memory (limit {self.settings.limits.memory_mb} MiB)")
            else:
                at = _where(e.traceback)
                self.findings.add("robustness", f"{where}: raised {e.type}: {e.message[:200]}{at}. "
                                  "An env must answer every action, valid or not, with an observation; "
                                  "a bad tool call gets a tool message saying what was wrong.",
                                  key=("robustness", e.type, where.split(" ")[0], at))
        except SandboxTimeout as e:
            self.findings.add("bounded", f"{where}: {e}. Every call must return promptly "
                              "(no unbounded loops or searches).", key=("bounded", "timeout"))
        except SandboxError as e:
            self.findings.add("bounded", f"{where}: the sandbox died: {e}", key=("bounded", "crash"))
        return None

    def episode(self, name: str, seed: int, policy: Callable[[int, list], Any], label: str) -> ProbeEpisode:
        """Reset instance ``name`` to ``seed``; step with ``policy(t, messages) -> action | None``."""
        ep = ProbeEpisode(seed)
        value = self.op(f"{label} reset(seed={seed})", "reset", name, seed)
        if value is None or not check_reset(value, self.meta, self.findings, f"reset(seed={seed})"):
            ep.ok = False
            return ep
        ep.trace.append(value)
        messages = list(value[0]["messages"])
        for t in range(self.max_turns):
            action = policy(t, messages)
            if action is None:
                return ep
            ep.actions.append(action)
            value = self.op(f"{label} step {t + 1} (seed={seed})", "step", name, action)
            if value is None or not check_step(value, action, self.meta, self.findings,
                                               f"{label} step {t + 1} (seed={seed})"):
                ep.ok = False
                return ep
            ep.trace.append(value)
            ep.score += value[1]
            messages += [action] + value[0]["messages"]
            if value[2] or value[3]:
                ep.ended = True
                break
        if not ep.ended and len(ep.actions) >= self.max_turns:
            self.findings.add("bounded", f"{label}: after max_turns={self.max_turns} steps (seed {seed}) "
                              "the episode had neither terminated nor truncated; set truncated=True "
                              "once max_turns steps are taken.", key=("bounded", "max_turns"))
        if ep.score > 1 + 1e-9:
            self.findings.add("contract.runtime", f"{label}: episode score {ep.score:g} exceeds 1 "
                              f"(seed {seed}); step rewards must sum to at most 1.", key=("score", ">1"))
        return ep

    def replay(self, name: str, ep: ProbeEpisode, label: str) -> ProbeEpisode:
        return self.episode(name, ep.seed, scripted(ep.actions), label)


def _where(tb: str) -> str:
    """' (env.py line 12, in _refund: args["email"])' from the runner's trimmed traceback."""
    lines = tb.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', lines[i])
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f" ({m[1]} line {m[2]}, in {m[3]}: {code[:80]})"
    return ""


class Findings:
    """Findings de-duplicated by key, each counting how often it was seen."""

    def __init__(self) -> None:
        self.items: dict[Any, list] = {}

    def add(self, check: str, message: str, key: Any = None) -> None:
        """An error finding; seen again under the same key, it is counted, not repeated."""
        key = key or (check, message)
        if key in self.items:
            self.items[key][1] += 1
        else:
            self.items[key] = [Finding(check, "error", message), 1]

    def result(self) -> list[Finding]:
        out = []
        for f, n in self.items.values():
            if n > 1:
                f.message += f" (seen {n} times)"
            out.append(f)
        return out


# --------------------------------------------------------------------------- shape checks

def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_info(info: Any, meta: dict, findings: Findings, where: str) -> bool:
    if not isinstance(info, dict):
        findings.add("contract.runtime", f"{where}: info must be a dict, got {type(info).__name__}",
                     key=("info", where.split(" ")[0]))
        return False
    skills = meta.get("skills")
    if isinstance(skills, dict) and skills and info.get("skill") not in skills:
        findings.add("contract.runtime", f"{where}: SKILLS is declared, so info['skill'] must name one "
                     f"of {sorted(skills)}; got {info.get('skill')!r}", key=("skill",))
    return True


def _check_messages(obs: Any, findings: Findings, where: str) -> list | None:
    if not isinstance(obs, dict) or not isinstance(obs.get("messages"), list):
        findings.add("contract.runtime", f"{where}: the observation must be {{'messages': [...]}}, got "
                     f"{canonical_json(obs)[:120]}", key=("obs", where.split(" ")[0]))
        return None
    for m in obs["messages"]:
        problem = message_problem(m)
        if problem:
            findings.add("contract.runtime", f"{where}: {problem}", key=("message", problem))
            return None
    return obs["messages"]


def check_reset(value: Any, meta: dict, findings: Findings, where: str) -> bool:
    obs, info = value
    msgs = _check_messages(obs, findings, where)
    if msgs is None:
        return False
    roles = [m["role"] for m in msgs]
    if not roles or roles[0] != "system" or "user" not in roles:
        findings.add("contract.runtime", f"{where}: the first observation must hold a system message "
                     f"first, then at least one user message; got roles {roles}", key=("reset-roles",))
        return False
    return _check_info(info, meta, findings, where)


def check_step(value: Any, action: Any, meta: dict, findings: Findings, where: str) -> bool:
    obs, reward, terminated, truncated, info = value
    msgs = _check_messages(obs, findings, where)
    if msgs is None:
        return False
    if not _number(reward) or not 0 <= reward <= 1:
        findings.add("contract.runtime", f"{where}: reward must be a float in [0, 1], got {reward!r}",
                     key=("reward",))
        return False
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        findings.add("contract.runtime", f"{where}: terminated and truncated must be bools, got "
                     f"{terminated!r} and {truncated!r}", key=("flags",))
        return False
    calls = action.get("tool_calls") if isinstance(action, dict) else None
    if isinstance(calls, list) and calls and all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in calls):
        ids = [c["id"] for c in calls]
        got = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
        if got != ids[:len(got)] or (len(got) < len(ids) and not terminated):
            findings.add("contract.runtime", f"{where}: the observation must hold one tool message per "
                         f"tool call, in order, with the call's id; calls {ids}, tool messages {got}",
                         key=("tool-ids",))
    return _check_info(info, meta, findings, where)


# --------------------------------------------------------------------------- policies

def scripted(actions: list) -> Callable[[int, list], Any]:
    it = iter(actions)
    return lambda t, m: next(it, None)


def perturb(actions: list, seed: int) -> list:
    """The reference with one mistake: an action dropped, an argument changed, or the plan cut."""
    rng = random.Random(seed)
    actions = [dict(a) if isinstance(a, dict) else a for a in actions]
    calls = [i for i, a in enumerate(actions) if isinstance(a, dict) and a.get("tool_calls")]
    mode = seed % 3
    if mode == 0 and actions:
        del actions[rng.choice(calls) if calls else rng.randrange(len(actions))]
    elif mode == 1 and calls:
        i = rng.choice(calls)
        call = actions[i]["tool_calls"][0]
        try:
            args = json.loads(call["function"]["arguments"])
        except (ValueError, TypeError, KeyError):
            args = None
        if isinstance(args, dict) and args:
            key = rng.choice(sorted(args))
            args[key] = _mutate(args[key])
            changed = tool_call(call["function"]["name"], args, call.get("id", "call_0"))
            actions[i] = {**actions[i], "tool_calls": [changed] + actions[i]["tool_calls"][1:]}
        else:
            del actions[i]
    else:
        actions = actions[: len(actions) // 2]
    return actions


def _mutate(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value[:-1] + ("X" if not value.endswith("X") else "Y") if value else "X"
    if isinstance(value, list):
        return value[:-1]
    return {}


# --------------------------------------------------------------------------- the stage

def run_dynamic(source: str, backend, settings: GateSettings | None = None,
                progress: Callable[[str], None] | None = None,
                capability: str | None = None) -> tuple[list[Finding], dict]:
    """Run every dynamic check on ``source``; returns (findings, stats). Never raises (but for
    Ctrl-C): whatever the env does, the result is findings. ``capability``, where known, is what
    the env was made for: the probes judge by it in place of the CAPABILITY env.py declares."""
    settings = settings or GateSettings()
    findings = Findings()
    probe_seed = settings.probe_seed
    if probe_seed is None:
        probe_seed = random.SystemRandom().randrange(2**63)
    draws = Draws(probe_seed, settings)
    probes.extend_texts(draws, source, settings.long_text_chars)
    stats: dict[str, Any] = {"probe_seed": probe_seed,
                             "hash_seeds": [settings.training_hash_seed]}  # each process's, as it starts
    say = progress or (lambda s: None)
    deadline, timings = time.monotonic() + settings.budget_s, []
    host = Host(backend, source, settings, settings.training_hash_seed, findings, deadline, timings)
    others = [Host(backend, source, settings, seed, findings, deadline, timings) for seed in draws.hash_seeds]
    try:
        try:
            meta = host.start()
        except EnvCallError as e:
            findings.add("sandbox", f"env.py could not be loaded in the sandbox: {e.type}: {e.message}"
                         if e.type else f"env.py could not be loaded in the sandbox: {e.message}")
            return findings.result(), stats
        except SandboxError as e:
            findings.add("bounded", f"loading env.py: {e}")
            return findings.result(), stats
        if capability:
            meta["capability"] = capability
        stats["sandbox"] = meta.get("sandbox")
        stats["tools"] = meta.get("tools")
        if not isinstance(meta.get("max_turns"), int) or not 1 <= meta["max_turns"] <= MAX_TURNS_LIMIT:
            findings.add("contract.runtime", f"Env.max_turns must be an int in 1..{MAX_TURNS_LIMIT}, got "
                         f"{meta.get('max_turns')!r}")
        tools = [t for t in meta.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)
                 and isinstance(t["function"].get("name"), str)]
        _probes(host, others, tools, settings, findings, stats, say, draws)
    except GiveUp as e:
        findings.add("bounded", str(e))
    except Exception as e:  # no crash, ever: whatever broke, the audit ends with a verdict
        findings.add("robustness", f"the dynamic checks stopped on {type(e).__name__}: {str(e)[:300]} "
                     f"(replay with --probe-seed {probe_seed}); the env made the gate's probes fail, "
                     "so it is rejected")
    finally:
        host.close()
        for other in others:
            other.close()
        if timings:
            ordered = sorted(timings)
            stats["calls"] = len(ordered)
            stats["call_ms"] = {"median": round(ordered[len(ordered) // 2] * 1000, 3),
                                "p99": round(ordered[int(len(ordered) * 0.99)] * 1000, 3)}
    return findings.result(), stats


def _probes(host: Host, others: list[Host], tools: list, settings: GateSettings, findings: Findings,
            stats: dict, say: Callable[[str], None], draws: Draws) -> None:
    seeds = draws.seeds
    by_name = {t["function"]["name"]: t for t in tools}

    say("reference solutions")
    reference: list[ProbeEpisode] = []
    for seed in seeds:
        plan = host.op(f"solve(seed={seed})", "solve", "a", seed)
        plan = _check_plan(plan, by_name, findings, seed) if plan is not None else None
        if plan is not None:
            reference.append(host.episode("a", seed, scripted(plan), "reference"))
    reference = [e for e in reference if e.ok]
    solved = [e for e in reference if abs(e.score - 1.0) < 1e-6]
    stats["solved"] = f"{len(solved)}/{len(seeds)}"
    if len(solved) < settings.solvable_min * len(seeds):
        worst = [f"seed {e.seed}: {e.score:g}" for e in reference if e not in solved][:5]
        findings.add("solvability", f"solve() reaches score 1.0 on {len(solved)} of {len(seeds)} seeds "
                     f"(need {settings.solvable_min:.0%}); e.g. {', '.join(worst) or 'no episode completed'}. "
                     "The reference solution must earn the full score on almost every seed.")

    say("diversity")
    distinct = len({e.fingerprint() for e in reference})
    stats["distinct_scenarios"] = f"{distinct}/{len(reference)}"
    if reference and distinct < settings.diversity_min * len(seeds):
        findings.add("diversity", f"{len(seeds)} seeds gave only {distinct} distinct scenarios (reset and "
                     f"reference observations); need {settings.diversity_min:.0%}. Build the scenario "
                     "from random.Random(seed) in reset so that each seed differs (is the seed ignored?).")

    say("perturbed reference, do-nothing, random")
    perturbed = [host.episode("a", e.seed, scripted(perturb(e.actions, draws.rng.randrange(2**32))), "perturbed")
                 for e in reference]
    idle = [host.episode("a", s, draws.talker(s), "do-nothing") for s in seeds]
    rand = _hypothesis_run(findings, "random episodes", lambda: _random_episodes(host, tools, len(seeds), draws)) or []

    say("own words, a text of tens of KB, several calls a message")
    probes.own_words(host, draws, findings, stats)
    probes.long_talk(host, draws, settings.long_text_chars)
    probes.parallel_reference(host, solved, draws)

    say("robustness (hypothesis)")
    _hypothesis_run(findings, "robustness", lambda: _robustness(host, tools, settings, draws))

    shared = _state(host)  # what outlives an episode, after hundreds of them

    say("does the env test its capability")
    contrast, calls_only = _capability(host, by_name, solved, settings, findings, stats, draws)

    def mean(eps: list[ProbeEpisode]) -> float:
        done = [e.score for e in eps if e.ok]
        return sum(done) / len(done) if done else 0.0

    stock = _stock_replies(host, by_name, solved, seeds, draws, settings, findings)
    scores = {"reference": mean(reference), "perturbed": mean(perturbed), "do_nothing": mean(idle),
              "random": mean(rand)}
    stats["mean_score"] = {k: round(v, 4) for k, v in scores.items()}
    stats["max_score"] = {k: round(max([e.score for e in eps if e.ok] or [0.0]), 4)
                          for k, eps in (("do_nothing", idle), ("random", rand))}
    for name, eps in (("do_nothing", idle), ("random", rand)):
        full = [e.seed for e in eps if e.ok and e.score >= 1 - 1e-6]
        if scores[name] > settings.free_reward_max:
            findings.add("free_reward", f"a {name.replace('_', '-')} policy scores {scores[name]:.2f} on "
                         f"average (allowed: {settings.free_reward_max}); reward must be earned by doing "
                         "the task, not by ending the episode or calling tools at random.")
        elif len(full) > max(1, len(eps) // 10) or _band_pays(eps, full):
            findings.add("free_reward", f"a {name.replace('_', '-')} policy earns the full score on "
                         f"{len(full)} of {len(eps)} seeds (e.g. seed {full[0]}); no seed may pay for "
                         "doing nothing or calling tools at random.")
    values = sorted({round(e.score, 4) for e in reference + perturbed + idle + stock + rand if e.ok})
    for _ in range(PARTIAL_CREDIT_ROUNDS):  # too few values may be the draw's luck: perturb afresh
        if len(values) >= settings.partial_credit_values or not reference:
            break
        more = [host.episode("a", e.seed, scripted(perturb(e.actions, draws.rng.randrange(2**32))), "perturbed")
                for e in reference]
        perturbed += more
        values = sorted(set(values) | {round(e.score, 4) for e in more if e.ok})
    stats["score_values"] = values[:20]
    if len(values) < settings.partial_credit_values:
        findings.add("partial_credit", f"episode scores under the probe policies take only the values "
                     f"{values}; give partial credit (several levels between 0 and 1) so that rollouts "
                     "of one seed differ and GRPO gets a gradient.")
    if perturbed and scores["perturbed"] >= scores["reference"] - 1e-6 and scores["reference"] > 0:
        findings.add("partial_credit", "perturbing the reference solution (dropping an action, changing "
                     f"an argument) never lowers the score (mean {scores['perturbed']:.2f} vs "
                     f"{scores['reference']:.2f}); the reward does not depend on what the agent does.")

    say("many resets")
    _many_resets(host, draws, settings, findings, stats)
    # the episodes that told right from wrong must still do so after thousands of resets
    for e in reference[:8] + perturbed[:8] + contrast[:16]:
        if not _same(e, host.replay("a", e, "after many resets"), "determinism",
                     f"the same seed and actions replayed after {stats.get('resets')} resets of the instance",
                     findings, " Keep no state across episodes: an env must not change with use."):
            break

    say("determinism and isolation")
    malformed = probes.malformed_episodes(host, tools, draws)
    random_ok = [e for e in rand if e.ok][: settings.replay_random]
    replays = reference + random_ok + malformed
    # Each comparison only means something when the simpler ones held: stop at the first failure.
    comparisons = [
        ("determinism", "the same seed and actions replayed in the same instance", lambda e: host.replay("a", e, "replay"), ""),
        ("determinism", "the same seed and actions in a second instance", lambda e: host.replay("b", e, "replay"), ""),
    ]
    for check, how, run, hint in comparisons:
        if not all(_same(e, run(e), check, how, findings, hint) for e in replays):
            return
    # episodes first played after many others in one instance, each replayed in an instance of
    # its own that played nothing before: an env that keeps something of an earlier episode (a
    # confirmation counted, a record marked checked) scores the later ones otherwise. The
    # reference's calls alone come first: dealt out below, one of them is the first episode of
    # each fresh process (a perturbed reference still confirms, and would set a class flag again)
    later = [e for e in calls_only if e.ok][:8] + [e for e in perturbed if e.ok][:4] + [e for e in contrast if e.ok][:4]
    if not all(_same(e, host.replay(f"fresh{k}", e, "replay"), "determinism",
                     "the same seed and actions in a fresh instance (first played after other episodes)",
                     findings, " Keep no state across episodes: reset must forget the last one.")
               for k, e in enumerate(later)):
        return
    if not _isolation(host, reference, findings):
        return
    if not _isolation(host, reference[:4], findings, *probes.many_instances(host, draws)):
        return

    fresh = random.Random(f"state {draws.probe_seed}")  # a stream of its own: the other draws stay
    for _ in range(8 if shared else 0):  # new seeds too: a cache keyed by whom or what it saw
        _drawn_solved(host, fresh)
    _state_kept(host, shared, findings)  # the replays in other processes still say what they find

    say("determinism across processes")
    hint = " Set iteration order, hash() and id() depend on the process; sort, or use lists and dicts."
    # every process replays the malformed scripts (error texts, such as a list of tool names
    # made from a set, are where the hash seed shows) and the first reference episode; the
    # others are dealt out among them
    everywhere, dealt = reference[:1] + malformed, reference[1:] + random_ok
    for k, other in enumerate(others):
        # the later-played episodes first, before anything could leave state behind in the
        # process (a class attribute is shared by the fresh instances above)
        mine = later[k::len(others)] + everywhere + dealt[k::len(others)]
        if not mine:
            return
        if time.monotonic() > host.deadline:
            raise GiveUp(f"the dynamic checks ran out of their {settings.budget_s:g} s budget before "
                         f"sandbox process {k + 2} of {len(others) + 1}; the remaining checks were skipped")
        try:
            other.start()
        except (SandboxError, EnvCallError) as e:
            findings.add("bounded", f"sandbox process {k + 2}: {e}")
            return
        stats["hash_seeds"].append(other.hash_seed)
        how = (f"the same seed and actions in a fresh process with PYTHONHASHSEED={other.hash_seed} "
               f"(first: {host.hash_seed})")
        if not all(_same(e, other.replay("a", e, "replay"), "determinism", how, findings, hint) for e in mine):
            return
        other.close()  # one at a time: the next starts once this one is gone


def _state(host: Host) -> tuple | None:
    """(a digest per module-level name of the env and, under "self", of instance "a" reset to
    seed 0, the sandbox it came from), or None where the runner has no "state" op (an older
    image) or did not answer."""
    try:
        host.op("reset before a look at the state", "reset", "a", 0)
        value = host.op("the env's module-level state", "state", "a")
    except EnvCallError:
        return None
    if not (isinstance(value, tuple) and isinstance(value[0], dict)
            and all(isinstance(v, str) for v in value[0].values())):
        return None
    return value


def _state_kept(host: Host, before: tuple | None, findings: Findings) -> None:
    """A finding unless the env's module-level state (globals, class attributes, functions' defaults and
    closures) is what it was before the capability probes, the many resets and the replays, in
    the same sandbox process: state that changes with episodes is shared by every instance in
    the process (a counter of steps, a cache of users checked, a flag), and training runs
    millions of episodes there, past any count an audit can reach. A lazy set-up done once is
    done before the first look (after hundreds of episodes of every kind)."""
    after = _state(host) if before is not None else None
    if after is None or after[1] is not before[1]:  # no runner op, or another process since
        return
    # the instance is judged by its attributes each ("self.name"), those too large to digest (a
    # retail-sized database on self) aside
    def own(k: str) -> bool:
        return k == "self" or k.startswith("self.")

    large = sorted(k for k, v in after[0].items() if v == "too large" and not own(k))
    if large:
        findings.add("isolation", f"module-level state too large or too deep to check: {', '.join(large[:6])} "
                     "(over a million values, or nested over 400 levels). Keep module and class "
                     "attributes small constants; build an episode's data in reset.",
                     key=("isolation", "module state size"))
    changed = sorted(k for k in set(before[0]) | set(after[0])
                     if before[0].get(k) != after[0].get(k) and k not in large
                     and not (own(k) and "too large" in (before[0].get(k), after[0].get(k))))
    instance = any(own(k) for k in changed)
    if instance:
        changed = [k for k in changed if not own(k)]
        findings.add("isolation", "an instance reset to the same seed holds other state after more episodes "
                     "(after hundreds of them, then more): reset keeps something from the episodes before "
                     "it (a count of episodes played, a cache, a flag set in step). Training resets one "
                     "instance millions of times; build all of an episode's state in reset.",
                     key=("isolation", "instance state"))
    if changed:
        findings.add("isolation", f"module-level state changed between episodes in one process: "
                     f"{', '.join(changed[:6])}{' ...' if len(changed) > 6 else ''} (after hundreds of "
                     "episodes, then more of them). Every instance in a process shares it, so an episode "
                     "can depend on the ones before it, past any count an audit reaches. Keep an "
                     "episode's state on self, built in reset; module and class attributes constant.",
                     key=("isolation", "module state"))


def _tool_kinds(by_name: dict) -> dict:
    """Each tool's kind (read, write, escalation, ...) from its name and description."""
    from envforge.tools import tool_kind
    return {n: tool_kind(n, None, t["function"].get("description") or "") for n, t in by_name.items()}


def _stock_replies(host: Host, by_name: dict, solved: list[ProbeEpisode], seeds: list[int], draws: Draws,
                   settings: GateSettings, findings: Findings) -> list[ProbeEpisode]:
    """Each stock reply (``Draws.stock``) is a policy of its own (an agent learns the one phrase
    that pays, so the phrases' mean together would hide it), said every turn on up to
    ``STOCK_SEEDS`` seeds where the reference acts (where it declines, a refusal is its decision,
    and an env whose requests show what forbids them may pay it without a reason): its mean at
    most ``free_reward_max``, and the full score on one of its seeds at most. With fewer than
    ``STOCK_SEEDS`` such seeds, a refusal is said on those there are (two at least) and another
    phrase on the audit's seeds."""
    kinds = _tool_kinds(by_name)
    acting = [e.seed for e in solved if probes._acts(e.actions, kinds)]
    out = []
    for k, (text, refuses) in enumerate(draws.stock):
        where = acting if len(acting) >= STOCK_SEEDS or refuses else seeds
        if len(where) < 2:
            continue
        eps = [host.episode("a", s, lambda t, messages, text=text: assistant(text), "stock reply") for s in
               (where[(k * STOCK_SEEDS + j) % len(where)] for j in range(min(STOCK_SEEDS, len(where))))]
        out += eps
        done = [e.score for e in eps if e.ok]
        full = sum(x >= 1 - 1e-6 for x in done)
        if done and (sum(done) / len(done) > settings.free_reward_max or full >= 2):
            findings.add("free_reward", f"the stock reply {text[:80]!r} said every turn, no tool called, "
                         f"scores {sum(done) / len(done):.2f} on average (the full score on {full}) over "
                         f"{len(done)} seeds{' where the reference acts' if where is acting else ''} "
                         f"(allowed: {settings.free_reward_max}): a phrase said without looking at "
                         "anything must not pay. Pay the decision only with the facts that make it right.",
                         key=("free_reward", "stock reply"))
            break
    return out


def _band_pays(eps: list[ProbeEpisode], full: list[int]) -> bool:
    """Whether the full score is paid on a fifth or more (two at least) of the seeds below 1000:
    half of training's seeds are below 256 (``contract.training_seeds``), so free reward kept to
    small seeds is diluted by the large ones in a count over all of them."""
    small = [e.seed for e in eps if e.ok and e.seed < 1000]
    paid = [s for s in full if s < 1000]
    return len(paid) >= 2 and len(paid) * 5 >= len(small)


def _hypothesis_run(findings: Findings, what: str, run: Callable[[], Any]) -> Any:
    """``run()``; an exception out of hypothesis (FlakyStrategyDefinition when a hanging or
    nondeterministic env changes what a replay draws, Unsatisfiable, ...) is a finding."""
    try:
        return run()
    except GiveUp:
        raise
    except Exception as e:
        findings.add("robustness", f"{what}: hypothesis stopped with {type(e).__name__}: "
                     f"{str(e).splitlines()[0][:200] if str(e) else ''}. The same actions must get the "
                     "same answers, promptly: an env that hangs, dies or answers a replay differently "
                     "cannot be trained on.", key=("hypothesis", what))
        return None


def _many_resets(host: Host, draws: Draws, settings: GateSettings, findings: Findings, stats: dict) -> None:
    """Thousands of resets of one instance in one request (the runner's "resets" op), cycling over
    some of the drawn seeds: a seed's result must never change (drift with use), resets must not
    get slower, and memory must not grow (a per-reset leak dies in training, not in a short audit)."""
    if settings.resets <= 0:
        return
    cycle = draws.seeds[:20]
    # a count drawn per audit (up to five times the setting; resets_s bounds the time), every
    # other reset a fresh seed (a cache keyed by seed grows only on new seeds, as in training,
    # which seldom repeats one of its middling or large seeds)
    count = draws.rng.randrange(settings.resets, 5 * settings.resets + 1)
    seeds = [cycle[(i // 2) % len(cycle)] if i % 2 == 0 else draws.rng.randrange(2**31) for i in range(count)]
    try:
        value = host.op(f"{count} resets of one instance", "resets", "a", seeds, settings.resets_s)
    except EnvCallError:
        stats["resets"] = "not run: this sandbox's runner has no 'resets' op (rebuild its image)"
        return
    if value is None:
        return
    rows, rss = (value.get("resets"), value.get("rss_kib")) if isinstance(value, dict) else (None, None)
    if not (isinstance(rows, list) and isinstance(rss, list) and len(rows) <= len(seeds)
            and all(isinstance(r, list) and len(r) == 2 and _number(r[1]) for r in rows)
            and all(_number(x) for x in rss)):
        findings.add("sandbox", "the many-resets probe got a malformed answer from the sandbox")
        return
    stats["resets"] = len(rows)
    first: dict[int, tuple[Any, int]] = {}
    for i, (digest, _) in enumerate(rows):
        seen = first.setdefault(seeds[i], (digest, i))
        if seen[0] != digest:
            findings.add("determinism", f"reset(seed={seeds[i]}) gave a different result at reset {i + 1} "
                         f"of one instance than at reset {seen[1] + 1}: the env drifts with use. Keep no "
                         "state across episodes: build everything from random.Random(seed) in reset.")
            break
    times = [t for _, t in rows]
    if len(times) >= 100:
        q = len(times) // 10
        early, late = sorted(times[:q])[q // 2], sorted(times[-q:])[q // 2]
        stats["reset_ms"] = {"early": round(early * 1000, 3), "late": round(late * 1000, 3)}
        if late > 4 * early + 0.002:
            findings.add("bounded", f"reset gets slower with use: median {early * 1000:.2f} ms over the "
                         f"first {q} of {len(times)} resets, {late * 1000:.2f} ms over the last {q}; "
                         "something grows with every episode.")
    if len(rss) >= 8:
        growth = (rss[-1] - rss[len(rss) // 4]) / 1024
        stats["reset_growth_mb"] = round(growth, 2)
        per = growth * 1024 / (len(rows) * 3 / 4)  # KiB a reset after a warm-up
        stats["reset_growth_kib"] = round(per, 3)
        if growth > settings.leak_mb or (growth > 1 and per > settings.leak_kib_per_reset):
            findings.add("bounded", f"memory grows by {growth:.0f} MiB over {len(rows) * 3 // 4} resets of one "
                         f"instance (~{per:.0f} KiB a reset): training resets millions of times, so this "
                         "runs out of memory. Forget the last episode on reset.")


#: more rounds of perturbed references when the probes saw fewer than ``partial_credit_values``
#: scores: with few seeds (``--seeds 8``) every perturbation of a round can land on 0 or 1 by
#: chance (measured on a good env: 3 values in one of 6 audits, at the bound), and an env that
#: truly pays 0 or 1 gives no new value in any round
PARTIAL_CREDIT_ROUNDS = 3


_GATHERING = re.compile(r"gather|precondition|verif|look.?up|information|check|find", re.I)


def _capability(host: Host, by_name: dict, solved: list[ProbeEpisode], settings: GateSettings,
                findings: Findings, stats: dict, draws: Draws) -> list[ProbeEpisode]:
    """Does the env test its capability? Probes built from the reference solution: its words
    without its tool calls, each write argument changed in turn, its reads removed (for
    capabilities about gathering or checking), its tools'
    arguments varied (``probes.argument_probes``), episodes played to max_turns, and whether
    every argument it sends could be known from what the agent saw (solvability from
    observations only). Returns the changed-argument episodes that lowered the score, and the
    reference's calls without its texts (``probes.texts_that_matter``)."""
    kinds = _tool_kinds(by_name)
    sample = solved[:8]
    # words alone: the reference's text, its tool calls removed
    words = []
    for e in sample:
        plan = [assistant(a["content"]) for a in e.actions if isinstance(a.get("content"), str) and a["content"].strip()]
        if plan and any(a.get("tool_calls") for a in e.actions):
            words.append(host.episode("a", e.seed, scripted(plan), "words-only"))
    full = [w.seed for w in words if w.ok and w.score >= 1 - 1e-6]
    if words and len(full) >= max(2, len(words) / 4):
        findings.add("free_reward", f"the reference's words alone (its tool calls removed) earn the full "
                     f"score on {len(full)} of {len(words)} seeds (e.g. seed {full[0]}): the reward must "
                     "need the tool calls, not a phrase.")
    # the reference's calls before its write, then a reply instead of it (empty, or a text of any
    # length): on a seed where the reference writes, a text earning what the write does on two
    # seeds or more (a quarter of them) is a finding (one could be a seed where the write is optional)
    instead, paid = 0, []
    said, claimed = 0, []  # the same after everything the reference says before its write (a yes)
    for e in solved:
        if instead >= 8:
            break
        kinds_at = [[kinds.get(_call_name(c)) for c in a.get("tool_calls") or []] for a in e.actions]
        first = next((i for i, ks in enumerate(kinds_at) if "write" in ks), None)
        if first is None:  # no call named a write: the first that is neither a read nor a transfer
            first = next((i for i, ks in enumerate(kinds_at) if any(k not in ("read", "escalation") for k in ks)), None)
        if first is None:
            continue
        reads = [a for a in e.actions[:first] if a.get("tool_calls")]
        instead += 1
        for text in draws.sized:
            ep = host.episode("a", e.seed, scripted(reads + [assistant(text)]), "reads, then a reply")
            if probes.as_good(e, ep):
                paid.append((e.seed, len(text)))
                break
        if len(reads) < first and not probes.as_good(e, host.episode(
                "a", e.seed, scripted(e.actions[:first]), "its texts, no write")):
            said += 1  # it says something first (its question, the user's yes), and the write matters
            done = " ".join(f"{v} is now done and resolved." for v in dict.fromkeys(
                probes._call_values(e.actions[:first + 1]).values()))
            for text in [f"All set. {done}", *draws.sized[::3]]:
                ep = host.episode("a", e.seed, scripted(e.actions[:first] + [assistant(text)]),
                                  "its texts, then a reply")
                if probes.as_good(e, ep):
                    claimed.append((e.seed, text[:60]))
                    break
        # its texts said three times each (a bonus per question asked: totals above 1)
        if any(not a.get("tool_calls") for a in e.actions):
            thrice = [b for a in e.actions for b in ([a] if a.get("tool_calls") else [a] * 3)]
            host.episode("a", e.seed, scripted(thrice), "its texts three times")
    if probes.often(claimed, said):
        findings.add("free_reward", f"the reference up to its write (its texts too: the user's yes), then "
                     f"a reply instead of the write, earns the full score on {len(claimed)} of {said} seeds "
                     f"(e.g. seed {claimed[0][0]}: {claimed[0][1]!r}): saying it is done is paid as doing "
                     "it; only the write may earn what the write does.", key=("free_reward", "said done"))
    if probes.often(paid, instead):
        findings.add("free_reward", f"the reference's reads followed by a reply instead of its write "
                     f"earn the full score on {len(paid)} of {instead} seeds where the reference writes "
                     f"(e.g. seed {paid[0][0]}, a reply of {paid[0][1]} characters): the write must be "
                     "what earns it, not a text of some kind.", key=("free_reward", "reads then reply"))
    # each write argument changed in turn
    tried: dict[tuple[str, str], list] = {}  # (tool, argument): lowered, tries (3 at most), a seed
    # (tool, argument, change): lowered, tries, a seed, the value, seeds where the first change
    # lowered the score and this one did not; a change is an enum's other choice (by value), or
    # "one less" or "the minimum" of an integer (by kind: the values differ from seed to seed)
    each: dict[tuple[str, str, str], list] = {}
    contrast: list[ProbeEpisode] = []  # changed arguments that lowered the score (replayed after the resets)
    wrong: list = []  # (episode, message, call, the changed call): a choice the schema allows that lowered it

    def undecided(k) -> bool:  # a change not yet seen to lower the score, and not yet judged
        r = each.get(k)
        return r is None or (not r[0] and (r[1] < 2 or not r[4]) and r[1] < 8)

    def short(k) -> bool:  # a write's argument not yet changed on 2 seeds, the score not lowered
        r = tried.get(k)
        return r is None or (not r[0] and r[1] < 2)

    def vary(e, i, j, name, args, key, schema, cid, extra=False):
        new = _other_value(args[key], schema)
        extras = [(label, v) for label, v in _more_values(args[key], schema, new)
                  if undecided((name, key, label))]
        real = probes._shaped(args[key], e, (args[key],)) if probes._names_a_record(args[key]) and \
            isinstance(args[key], str) else []
        # another real record the episode shows, not a made-up id (not tried twice: a write on a
        # real record the tool refuses, a returned loan, may rightly cost nothing)
        if real and undecided((name, key, "another record")):
            extras.append(("another record", real[0]))
        rec = tried.get((name, key), [False, 0])
        # the first change's own tries: on every solved seed, and on drawn ones for an argument
        # of a write the reference made on fewer than 2 seeds (else "never checks it" is luck)
        counted = (not extra or short((name, key))) and not rec[0] and rec[1] < 3
        here = False  # the first change lowered the score on this seed
        def changed(value, said: bool = False) -> tuple[ProbeEpisode, bool]:  # the episode, and whether it scored lower
            plan = _with_call(e.actions, i, j, tool_call(name, {**args, key: value}, cid))
            ep = host.episode("a", e.seed, scripted(plan), f"changed {name}.{key}")
            lowered = not probes.as_good(e, ep)
            if lowered and ep.ok and _allowed(value, schema) and len(wrong) < 6 and e.seed not in {w[0].seed for w in wrong}:
                wrong.append((e, i, j, tool_call(name, {**args, key: value}, cid)))  # a choice the schema allows
            told = _told(plan, i, args[key], value) if said and lowered else None
            if told is not None:  # the same value in what it said before too: the user's yes to it
                lowered = not probes.as_good(e, host.episode("a", e.seed, scripted(told),
                                                             f"changed {name}.{key}, in its texts too"))
            return ep, lowered
        if new is not _SKIP and (counted or extras):
            ep, here = changed(new, said=counted)
            if counted:
                rec = tried.setdefault((name, key), [False, 0, e.seed])
                rec[0] |= here
                rec[1] += 1
                if ep.ok and here:
                    contrast.append(ep)
        for label, other in extras:
            lowered = changed(other)[1]
            r = each.setdefault((name, key, label), [False, 0, e.seed, other, 0])
            r[0] |= lowered
            r[1] += 1
            r[4] += here and not lowered

    def vary_calls(e, extra=False):
        for i, a in enumerate(e.actions):
            calls = a.get("tool_calls")
            for j, call in enumerate(calls if isinstance(calls, list) else []):
                name = _call_name(call)
                args = _json_args(call) if name else None
                if name is None or kinds.get(name) in ("read", "escalation") or not args:
                    continue  # reads: a template may credit a read whatever its argument (the matrix)
                props = _properties(by_name, name)
                for key in sorted(args):
                    if not extra or short((name, key)) or any(k[:2] == (name, key) and undecided(k) for k in each):
                        vary(e, i, j, name, args, key, props.get(key), call.get("id", "call_0"), extra)

    for e in solved:  # every solved seed, so that a write the reference rarely makes gets its tries
        vary_calls(e)
    # more seeds: 20 at least, for writes the reference makes on a few seeds only (one request
    # kind of several, unblocked: an eighth of them), then while a change is not yet judged (2
    # seeds, one beside a lowering change) or a write's argument was tried on one seed only
    drawn = []  # kept: the argument probes look there for tools no audit seed calls
    for n in range(60):
        if n >= 20 and not any(undecided(k) for k in each) and not any(short(k) for k in tried):
            break
        e = _drawn_solved(host, draws.rng)
        if e is not None:
            drawn.append(e)
            vary_calls(e, extra=True)
    probes.second_tries(host, wrong, random.Random(f"second tries {draws.probe_seed}"), findings)
    # reads removed, for capabilities about gathering or checking. Removing one read tool at a
    # time was tried (issue 15's red team): good template envs credit the record read but not
    # the look-up that finds it (the reference knows the id), which looks the same from outside
    # as an env that credits a read it never needed; so all reads are removed at once.
    gathering = _GATHERING.search(str(host.meta.get("capability") or ""))
    if gathering:
        kept, lowered = 0, False
        for e in sample[:6]:
            plan = _without_reads(e.actions, kinds)
            if plan is not None:
                ep = host.episode("a", e.seed, scripted(plan), "reads removed")
                kept += 1
                lowered |= not probes.as_good(e, ep)
        if kept >= 2 and not lowered:
            findings.add("free_reward", f"the reference with its reads removed still earns the full score "
                         f"({kept} seeds): a capability about {gathering.string!r} must need the "
                         "information the reads return.")
    # the checks (reads that find no id a later call sends) must matter; with a capability
    # about reading, whether to act must not be readable off the opening message
    contrast += probes.checking_reads(host, solved, kinds, bool(gathering), findings, stats)
    calls_only = probes.texts_that_matter(host, solved, kinds, findings)
    probes.every_reason(host, solved, by_name, kinds, draws, findings)
    # whether to act must not be readable off the opening, for a capability about reading only:
    # elsewhere the opening may say what is asked (a close, or a question), which decides rightly
    # (tried wherever the reference checks and both acts and declines: a template rejected)
    if gathering:
        probes.decision_in_opening(host, solved, kinds, draws, findings, stats)
    for (name, key), (lowered, n, seed) in tried.items():
        if not lowered and n >= 2:
            findings.add("partial_credit", f"changing the argument {key!r} of the write {name} in the "
                         f"reference (in the call, and where its texts named the value, there too) never "
                         f"lowers the score ({n} seeds, e.g. seed {seed}): the env never checks it against "
                         "the request, so the agent learns nothing about getting it right.",
                         key=("unchecked", name, key))
    for (name, key, label), (lowered, n, seed, value, beside) in each.items():
        if not lowered and n >= 2 and beside and tried.get((name, key), [False])[0]:
            what = f"to {value!r}" if label.startswith("=") else f"to {label} ({value!r} on seed {seed})"
            findings.add("partial_credit", f"setting the argument {key!r} of the write {name} {what} "
                         f"in the reference never lowers the score ({n} seeds, e.g. seed {seed}), though "
                         "other values do: the env lets that value through where it is wrong (a "
                         "comparison such as >= where == is meant?).", key=("let through", name, key))
    # each tool of the reference in case/whitespace variants, nested deeply, at extreme values
    probes.argument_probes(host, solved, by_name, kinds, draws, settings, findings, drawn)
    # every tool, twice, where the reference acts, on the records it sent (a bonus per call)
    probes.grounded_calls(host, solved, by_name, kinds, draws, findings)
    # episodes played to max_turns: the reference's reads again and again (else drawn talk)
    for e in sample[:3]:
        reads = [a for a in e.actions if a.get("tool_calls")
                 and all(kinds.get(c["function"]["name"]) == "read" for c in a["tool_calls"])]
        cycle = reads or [assistant(t) for t in draws.texts[:4]]
        stalled = host.episode("a", e.seed, lambda t, m, c=cycle: c[t % len(c)], "to max_turns")
        if reads and probes.as_good(e, stalled):
            findings.add("free_reward", f"repeating the reference's reads until max_turns, never acting, "
                         f"earns the reference's full score (seed {e.seed}): an episode that ends "
                         "undecided must score below one that decides.", key=("free_reward", "stall"))
    probes.other_stalls(host, solved, kinds, draws, findings)
    # solvability from observations only
    hidden = []
    schema_text = _squash(canonical_json(list(by_name.values())))
    for e in sample:
        found = _unobserved(e, by_name, schema_text)
        if found:
            hidden.append((e.seed, found))
    stats["unobservable"] = f"{len(hidden)}/{len(sample)}"
    if len(hidden) >= 2 and len(hidden) * 3 >= len(sample):
        seed, (name, key, value) = hidden[0]
        findings.add("solvability", f"the reference calls {name} with {key}={value!r}, which the agent "
                     f"never saw before that call (seed {seed}; {len(hidden)} of {len(sample)} seeds "
                     "alike): a policy that sees only the observations cannot solve the task. Show the "
                     "target in the user's messages or in a tool result.")
    # numbers and enum choices, per tool argument over every solved seed (a hidden choice may
    # concern a task the env draws on a tenth of its seeds)
    choices: dict[tuple[str, str], list] = {}

    def count(e: ProbeEpisode) -> None:
        for name, key, value, hidden in _choices(e, by_name):
            rec = choices.setdefault((name, key), [0, 0, None])  # calls, hidden, an example
            rec[0] += 1
            if hidden:
                rec[1] += 1
                rec[2] = rec[2] or (e.seed, value)

    for e in solved:
        count(e)
    # a choice hidden on the few seeds that made it: more seeds (drawn) until it is made 3 times
    for extra in range(40):
        if not any(h and n < 3 for n, h, _ in choices.values()):
            break
        e = _drawn_solved(host, draws.rng)
        if e is not None:
            count(e)
    for (name, key), (n, hidden, example) in sorted(choices.items()):
        if hidden >= 2 and hidden * 2 >= n:
            findings.add("solvability", f"the reference calls {name} with {key}={example[1]!r} (seed "
                         f"{example[0]}), a choice no message before the call shows ({hidden} of {n} "
                         "calls alike): a policy that sees only the observations can only guess it. "
                         "Show it in the user's messages or in a tool result.", key=("hidden", name, key))
    return contrast, calls_only


_SKIP = object()


def _drawn_solved(host: Host, rng: random.Random) -> ProbeEpisode | None:
    """The reference played on a seed drawn from ``rng`` (the audit's mix: ``contract.mix_seed``), when
    it earns the full score."""
    seed = mix_seed(rng, rng.randrange(4))
    plan = host.op(f"solve(seed={seed})", "solve", "a", seed)
    if not (isinstance(plan, list) and plan and all(isinstance(a, dict) for a in plan)):
        return None
    e = host.episode("a", seed, scripted(plan), "reference")
    return e if e.ok and abs(e.score - 1.0) < 1e-6 else None


def _call_name(call: Any) -> str | None:
    f = call.get("function") if isinstance(call, dict) else None
    name = f.get("name") if isinstance(f, dict) else None
    return name if isinstance(name, str) else None


def _json_args(call: dict) -> dict | None:
    try:
        args = json.loads(call["function"]["arguments"])
    except (ValueError, TypeError, KeyError):
        return None
    return args if isinstance(args, dict) else None


def _other_value(value: Any, schema: Any) -> Any:
    """Another value of the kind ``value`` is, or _SKIP for free text and empty values."""
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if isinstance(enum, list):
        others = [x for x in enum if x != value]
        return others[0] if others else _SKIP
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return _SKIP if not value or len(value.split()) > 3 else _mutate(value)
    if isinstance(value, list) and value:
        return value[:-1]
    return _SKIP


def _more_values(value: Any, schema: Any, first: Any) -> list:
    """Changes of ``value`` beyond ``first`` (``_other_value``'s): the enum's other choices; one
    less of an integer (within the schema's minimum), the minimum itself (a ratio or a
    difference written the wrong way round is far out there), and the maximum ("at least"
    taken for "exactly" past some bound)."""
    schema = schema if isinstance(schema, dict) else {}
    enum = schema.get("enum")
    if isinstance(enum, list):
        return [("=" + canonical_json(x), x) for x in enum if x != value and x != first][:12]
    if isinstance(value, int) and not isinstance(value, bool):
        low, high = schema.get("minimum"), schema.get("maximum")
        top = ([("the maximum", high)] if isinstance(high, int) and not isinstance(high, bool)
               and high > value + 1 and high != first else [])
        if not isinstance(low, int) or isinstance(low, bool):
            return [("one less", value - 1)] + top
        out = [("one less", value - 1)] if value - 1 >= low and value - 1 != first else []
        return out + ([("the minimum", low)] if low < value - 1 and low != first else []) + top
    return []


def _extreme(value: Any, schema: Any, rng: random.Random, long: int) -> Any:
    """A large but schema-valid version of ``value`` (ints and free strings), or _SKIP."""
    schema = schema if isinstance(schema, dict) else {}
    if isinstance(value, bool) or "enum" in schema or "const" in schema:
        return _SKIP
    if isinstance(value, int):
        big = schema.get("maximum", rng.choice((10**5, 10**7, 10**9, 2**31 - 1)))
        return big if isinstance(big, int) and big != value else _SKIP
    if isinstance(value, str) and value and not schema.get("pattern") and not schema.get("format"):
        size = min(long, schema.get("maxLength", long)) if isinstance(schema.get("maxLength", long), int) else long
        return (value * (size // len(value) + 1))[:size] if size > len(value) else _SKIP
    return _SKIP


def _with_call(actions: list, i: int, j: int, call: dict) -> list:
    calls = list(actions[i]["tool_calls"])
    calls[j] = call
    return actions[:i] + [{**actions[i], "tool_calls": calls}] + actions[i + 1:]


def _allowed(value: Any, schema: Any) -> bool:
    """Whether ``value`` is a choice ``schema`` allows: one of its enum, or a number (not a bool)
    within its bounds."""
    if not isinstance(schema, dict):
        return False
    if isinstance(schema.get("enum"), list):
        return value in schema["enum"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    low, high = schema.get("minimum"), schema.get("maximum")
    return (not isinstance(low, (int, float)) or value >= low) and (not isinstance(high, (int, float)) or value <= high)


def _told(plan: list, i: int, old: Any, new: Any) -> list | None:
    """``plan`` with ``old`` (a string or an integer a call sends) replaced by ``new`` as a whole
    word, in any case, in the texts before message ``i``; None where no text says it."""
    if isinstance(old, bool) or not isinstance(old, (str, int)) or not isinstance(new, (str, int)) or not str(old).strip():
        return None
    word = re.compile(rf"(?<![\w-]){re.escape(str(old))}(?![\w-])", re.I)
    out = [assistant(word.sub(lambda m: str(new), a["content"]), a.get("tool_calls"))
           if k < i and isinstance(a.get("content"), str) and word.search(a["content"]) else a
           for k, a in enumerate(plan)]
    return out if out != plan else None


def _without_reads(actions: list, kinds: dict) -> list | None:
    """The plan without its read calls (None when it makes none)."""
    reads = {c["function"]["name"] for a in actions for c in a.get("tool_calls") or []
             if kinds.get(c["function"]["name"]) == "read"}
    plan = probes.without_calls(actions, reads)
    return plan if reads and plan else None


def _properties(by_name: dict, name: str) -> dict:
    """The parameter schemas of tool ``name`` ({} for a tool the env does not offer)."""
    params = by_name.get(name, {}).get("function", {}).get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    return props if isinstance(props, dict) else {}


def _unobserved(e: ProbeEpisode, by_name: dict, schema_text: str) -> tuple | None:
    """The first (tool, argument, value) of the reference that names something the agent had not
    seen by then: a string (up to three words) absent from every message so far and the schemas."""
    seen = [schema_text] + [_squash(m.get("content")) for m in e.trace[0][0]["messages"]]
    for t, a in enumerate(e.actions):
        for call in a.get("tool_calls") or []:
            args = _json_args(call) or {}
            props = _properties(by_name, call["function"]["name"])
            for key, value in args.items():
                for v in _strings(value):
                    low = _squash(v)
                    enum = props[key].get("enum") if isinstance(props.get(key), dict) else None
                    if len(low) < 3 or len(v.split()) > 3 or isinstance(enum, list) and v in enum:
                        continue
                    escaped = _squash(json.dumps(v))  # tool results are often JSON text: "Zo\\u00eb"
                    if not any(low in text or escaped in text for text in seen):
                        return call["function"]["name"], key, v
        if t + 1 < len(e.trace):
            seen += [_squash(m.get("content")) for m in e.trace[t + 1][0]["messages"]]
    return None


def _choices(e: ProbeEpisode, by_name: dict):
    """(tool, argument, value, hidden) for each integer and enum argument of the reference's calls;
    hidden when no message before the call shows it (``_unobserved_value``)."""
    raw = [str(m.get("content") or "") if m.get("role") != "system" else "" for m in e.trace[0][0]["messages"]]
    system = [str(m.get("content") or "") for m in e.trace[0][0]["messages"] if m.get("role") == "system"]
    for t, a in enumerate(e.actions):
        for call in a.get("tool_calls") or []:
            props = _properties(by_name, call["function"]["name"])
            for key, value in (_json_args(call) or {}).items():
                if isinstance(value, (int, str)) and not isinstance(value, bool):
                    hidden = _unobserved_value(value, props.get(key), raw if isinstance(value, str) else system + raw)
                    yield call["function"]["name"], key, value, hidden is not None
        if t + 1 < len(e.trace):
            raw += [str(m.get("content") or "") for m in e.trace[t + 1][0]["messages"]]


_NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                 "fourteen fifteen sixteen seventeen eighteen nineteen twenty").split()


def _unobserved_value(value: Any, schema: Any, raw: list[str]) -> Any:
    """A number or an enum choice the reference sends that no message so far shows: an integer
    not written as a whole number (nor as a word up to twenty), or an enum value none of whose
    words appear as a word (JSON keys such as ``"email":`` do not count; the caller leaves the
    system prompt out for enums, which lists every choice). Returns the value, or None when it
    was seen (or is not of those kinds)."""
    text = re.sub(r'"[^"\n]{1,40}"\s*:', " ", "\n".join(raw)).lower().replace("_", " ")
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int) and not isinstance(enum, list):
        if abs(value) < 2 or re.search(rf"(?<![\d.]){abs(value)}(?![\d]|\.\d)", text):
            return None
        if abs(value) < len(_NUMBER_WORDS) and re.search(rf"\b{_NUMBER_WORDS[abs(value)]}\b", text):
            return None
        return value
    if isinstance(value, str) and isinstance(enum, list) and len(enum) > 1:
        parts = [w for w in re.split(r"[\W_]+", value.lower()) if len(w) >= 2]
        if not parts or any(re.search(rf"\b{re.escape(w)}\b", text) for w in parts):
            return None
        return value
    return None


def _squash(text: Any) -> str:
    """Lower-case letters and digits only: "#W12-3" and "w123" meet."""
    return re.sub(r"[\W_]+", "", str(text or "").lower())


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def _check_plan(plan: Any, by_name: dict, findings: Findings, seed: int) -> list | None:
    if not isinstance(plan, list) or not plan:
        findings.add("solvability", f"solve(seed={seed}) must return a non-empty list of assistant "
                     f"messages, got {canonical_json(plan)[:100]}", key=("plan-shape",))
        return None
    for msg in plan:
        problem = message_problem(msg)
        if problem is None and msg.get("role") != "assistant":
            problem = f"solve() must return assistant messages, got role {msg.get('role')!r}"
        if problem:
            findings.add("solvability", f"solve(seed={seed}): {problem}", key=("plan-msg", problem))
            return None
        for call in msg.get("tool_calls") or []:
            problem = call_problem(by_name, call)
            if problem:
                findings.add("schema.fidelity", f"solve(seed={seed}) makes a call that does not fit the "
                             f"tools: {problem}", key=("plan-call", problem.split(":")[0]))
    return plan


def _same(a: ProbeEpisode, b: ProbeEpisode, check: str, how: str, findings: Findings, hint: str = "") -> bool:
    """Compare two runs of one episode; on a difference add a finding and return False."""
    if not (a.ok and b.ok):
        return True
    hint = hint or (" Draw all randomness from random.Random(seed) made in reset; no module-level "
                    "random or clock.")
    for i, (x, y) in enumerate(zip(a.trace, b.trace)):
        if canonical_json(x) != canonical_json(y):
            where = "reset" if i == 0 else f"step {i}"
            findings.add(check, f"{how} gave a different result at {where} (seed {a.seed}): "
                         f"{_first_diff(x, y)}.{hint}", key=(check, how))
            return False
    if len(a.trace) != len(b.trace):
        findings.add(check, f"{how} gave an episode of another length (seed {a.seed}).{hint}", key=(check, how))
        return False
    return True


def _first_diff(x: Any, y: Any) -> str:
    sx, sy = canonical_json(x), canonical_json(y)
    i = next((k for k, (p, q) in enumerate(zip(sx, sy)) if p != q), min(len(sx), len(sy)))
    return f"...{sx[max(0, i - 40):i + 40]}... vs ...{sy[max(0, i - 40):i + 40]}..."


def _isolation(host: Host, reference: list[ProbeEpisode], findings: Findings, b: str = "b", c: str = "c") -> bool:
    """Replay each reference episode on instance b while instance c plays another seed in
    lockstep: c is reset right after b, then each step of b follows one step of c."""
    for k, e in enumerate(reference):
        other = reference[(k + 1) % len(reference)]
        mine, theirs = iter(e.actions), iter(other.actions)
        state = {"live": True}

        def interleaved(t: int, msgs: list) -> Any:
            if t == 0:
                state["live"] = host.op("isolation reset", "reset", c, other.seed) is not None
            extra = next(theirs, None) if state["live"] else None
            if extra is not None:
                value = host.op("isolation step", "step", c, extra)
                state["live"] = value is not None and not (value[2] or value[3])
            return next(mine, None)

        if not _same(e, host.episode(b, e.seed, interleaved, "isolation"), "isolation",
                     "an episode run while another instance played a different seed", findings,
                     hint=" Instances must share no mutable state: copy module-level data per reset "
                          "and keep no episode state on the class."):
            return False
    return True


def _quiet():
    """Hypothesis reports failing examples on stdout; the gate keeps stdout for --json."""
    from hypothesis.reporting import with_reporter
    return with_reporter(lambda *a, **k: None)


def _random_episodes(host: Host, tools: list, n: int, draws: Draws) -> list[ProbeEpisode]:
    """``n`` episodes of schema-valid calls and drawn chatter, drawn by hypothesis under the probe
    seed (seeds drawn too, so that hypothesis may replay any example and get the same draws)."""
    from hypothesis import HealthCheck, Phase, given, seed, settings as hsettings, strategies as st
    from envforge.gate.strategies import valid_call

    out: list[ProbeEpisode] = []
    say = st.tuples(st.just("say"), st.sampled_from(draws.texts))
    step = st.tuples(st.just("call"), valid_call(tools)) | say if tools else say

    @seed(draws.probe_seed)
    @hsettings(max_examples=n, database=None, deadline=None,
               phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        s = data.draw(st.sampled_from(draws.seeds) | st.integers(0, 2**31 - 1), label="seed")

        def policy(t: int, msgs: list) -> Any:
            kind, what = data.draw(step)
            return assistant(what) if kind == "say" else assistant(None, [tool_call(what[0], what[1], f"call_{t}")])

        out.append(host.episode("r", s, policy, "random"))

    with PARSE_LOCK, _quiet():
        run()
    return out[:n]


def _robustness(host: Host, tools: list, settings: GateSettings, draws: Draws) -> None:
    """Hypothesis state machines: rules are valid tool calls, malformed calls and chatter (drawn
    texts, long ones included); the invariant is that every step answers with a contract
    observation and no exception."""
    from hypothesis import HealthCheck, Phase, seed, settings as hsettings, strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
    from envforge.gate.strategies import malformed_action, valid_call

    if not tools:
        return
    ids = iter(range(10**9))
    seeds = st.sampled_from(draws.seeds) | st.integers(0, 2**31 - 1)

    class EnvMachine(RuleBasedStateMachine):
        @initialize(seed=seeds)
        def start(self, seed):
            self.seed, self.t = seed, 0
            self.live = host.op(f"reset(seed={seed})", "reset", "h", seed) is not None

        def _step(self, action, what):
            if not self.live:
                return
            self.t += 1
            where = f"step with {what} (seed={self.seed})"
            value = host.op(where, "step", "h", action)
            if value is None or not check_step(value, action, host.meta, host.findings, where):
                self.live = False
            elif value[2] or value[3]:
                self.seed += 1
                self.live = host.op(f"reset(seed={self.seed})", "reset", "h", self.seed) is not None

        @rule(call=valid_call(tools))
        def valid(self, call):
            self._step(assistant(None, [tool_call(call[0], call[1], f"call_{next(ids)}")]),
                       f"a valid call of {call[0]}")

        @rule(bad=malformed_action(tools))
        def malformed(self, bad):
            self._step(bad[1], f"a malformed action ({bad[0]})")

        @rule(text=st.sampled_from(draws.texts) | st.text(max_size=40))
        def say(self, text):
            self._step(assistant(text), "assistant text")

    with PARSE_LOCK, _quiet():
        run_state_machine_as_test(seed(draws.probe_seed)(EnvMachine), settings=hsettings(
            max_examples=settings.robustness_examples, stateful_step_count=max(host.max_turns, 5),
            database=None, deadline=None, phases=[Phase.generate],
            suppress_health_check=list(HealthCheck), report_multiple_bugs=False))
