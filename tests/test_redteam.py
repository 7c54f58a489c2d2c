"""The gate's own red team: attack envs written against the gate (issue 15), one per class of
what got through before, each asserted rejected with the finding that should catch it.

Every attack is the good helpdesk env (tests/envfactory.py) with one planted flaw, written to
pass what the gate used to check: the static ones reach code or entropy through the allowed
modules; the probe ones behave only where the old probes never looked (seeds >= 50, hash seed 0,
texts other than four fixed ones, after 400 resets, on long messages, after turn 30, across
instances); the capability ones pay for words, ignore arguments or hide their target; the crash
ones hang. The containment attacks (out of the sandbox) are the sandbox's: tests/test_security.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from envforge.contract import Limits
from envforge.gate import audit
from envforge.gate.dynamic import Findings, GateSettings, _hypothesis_run
from envforge.gate.static import audit_static
from tests.envfactory import override, replace, write_env

#: Small but complete: every probe runs, thousands of resets included (they are one request).
SETTINGS = dict(seeds=16, robustness_examples=12, replay_random=3, budget_s=90.0,
                limits=Limits(call_timeout_s=2.0, memory_mb=512))


def _errors(report) -> list[dict]:
    return [f.to_dict() for f in report.findings if f.severity == "error"]


def _static(code: str) -> list[dict]:
    src = replace("CAPABILITY =", code.strip("\n") + "\nCAPABILITY =")
    return [f.to_dict() for f in audit_static(src).findings if f.severity == "error"]


# --------------------------------------------------------------------------- the static audit

STATIC_ATTACKS = {
    "module_as_value": ("""
import typing
T = typing
MODULES = T.sys.modules
""", "static.import", "used as a value"),
    "module_passed": ("""
import typing
def reach(m):
    return m.sys
SYS = reach(typing)
""", "static.import", "used as a value"),
    "formatter_getattr": ("""
import string
FIELD = string.Formatter().get_field
""", "static.import", "string.Formatter is not among the names"),
    "singledispatch_evaluates": ("""
import functools
@functools.singledispatch
def f(x: "open('/etc/passwd')"):
    return x
""", "static.import", "functools.singledispatch is not among"),
    "type_hints_evaluate": ("""
from typing import get_type_hints
""", "static.builtin", "evaluates strings as code"),
    "match_args_frames": ("""
from dataclasses import dataclass
@dataclass
class Box:
    gi_frame: object
def peek(g):
    match g:
        case Box(frame):
            return frame
""", "static.dunder", "positional sub-patterns"),
    "clock_through_alias": ("""
import datetime
D = datetime.date
TODAY = D.today()
""", "static.entropy", "wall clock"),
    "entropy_through_statistics": ("""
import statistics
R = statistics.random.random()
""", "static.import", "statistics.random is not among"),
    "runtime_format_string": ("""
def peek(g):
    return ("{0." + "gi_" + "frame}").format(g)
""", "static.dunder", ".format() on a string that is not one of the file's literals"),
    "format_through_a_parameter": ("""
def render(fmt, value):
    return fmt.format(value)
def peek(g, part):
    return render("{0." + part + "}", g)
""", "static.dunder", "fmt.format(value)"),
    "format_field_frame": ("""
def peek(g):
    return "{0.gi_frame.f_globals}".format(g)
""", "static.dunder", "frame/code internal"),
    "frame_name_defined_to_whitelist_it": ("""
class Cover:
    def __init__(self):
        self.gi_frame = None
        self.f_globals = None
def peek(g):
    return g.gi_frame.f_globals
""", "static.dunder", "frame/code internal '.gi_frame'"),
    "format_string_set_by_setattr": ("""
class Card:
    TEMPLATE = "{0}"
    def fill(self, part):
        setattr(self, "TEMPLATE", "{0." + part + "}")
        return self.TEMPLATE.format(self)
""", "static.dunder", ".format() on a string that is not one of the file's literals"),
    "format_string_as_dataclass_field": ("""
from dataclasses import dataclass
@dataclass
class Card:
    template: str = "{0}"
    def fill(self, g):
        return self.template.format(g)
CARD = Card("{0.gi_" + "frame}")
""", "static.dunder", ".format() on a string that is not one of the file's literals"),
    "metaclass": ("""
class Meta(type):
    pass
class Sneaky(metaclass=Meta):
    pass
""", "static.dunder", "metaclass"),
    "reseed_from_os": ("""
import random
RNG = random.Random(7)
RNG.seed()
""", "static.entropy", "re-seeds a generator from the OS"),
    "library_internals": ("""
import random
GLOBAL = random.Random(1)._randbelow
""", "static.dunder", "internal attribute '._randbelow'"),
    "submodule": ("""
import json.decoder
""", "static.import", "submodule"),
}


@pytest.mark.parametrize("name", sorted(STATIC_ATTACKS))
def test_static_attack_is_rejected(name):
    code, check, message = STATIC_ATTACKS[name]
    found = _static(code)
    assert any(f["check"] == check and message in f["message"] for f in found), json.dumps(found, indent=1)


def test_the_good_env_passes_the_static_audit():
    assert _static("") == []


# --------------------------------------------------------------------------- probes, capability

def _hash_under(seed: int, text: str) -> int:
    out = subprocess.run([sys.executable, "-c", f"print(hash({text!r}))"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": str(seed)}, check=True)
    return int(out.stdout)


FREE_TEXT = """
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                if {condition}:
                    return obs, 1.0, True, False, info
                return obs, reward, terminated, truncated, info
"""
TALKED = ('isinstance(action, dict) and not action.get("tool_calls") '
          'and isinstance(action.get("content"), str)')


def _dynamic_attacks() -> dict:
    h0 = _hash_under(0, "kestrel")
    old_probes = ("Hello! How can I help you today?", "Could you tell me a bit more about that?",
                  "I understand. Let me think about it.", "Is there anything else you need?")
    return {
        # probes the audited code could recognise
        "free_reward_on_large_seeds": (override("""
            def reset(self, seed):
                self.big = seed >= 50
                return _Base.reset(self, seed)
        """ + FREE_TEXT.format(condition=f"self.big and {TALKED}")), "free_reward", "policy"),
        "free_reward_under_training_hash_seed": (override(FREE_TEXT.format(
            condition=f'hash("kestrel") == {h0} and {TALKED}')), "free_reward", "policy"),
        "free_reward_for_any_other_text": (override(FREE_TEXT.format(
            condition=f"{TALKED} and action['content'] not in {old_probes!r}")), "free_reward", "policy"),
        "unsolvable_after_seed_50": (override("""
            def solve(self, seed):
                return _Base.solve(self, seed if seed < 50 else seed + 1)
        """), "solvability", "score 1.0"),
        "drifts_after_400_resets": (override("""
            count = [0]
            def reset(self, seed):
                Env.count[0] += 1
                return _Base.reset(self, seed + (Env.count[0] > 400))
        """), "determinism", ""),
        "leaks_memory_per_reset": (override("""
            kept = []
            def reset(self, seed):
                Env.kept.append("x" * (1 << 20))
                return _Base.reset(self, seed)
        """), "bounded", "memory"),
        "slow_on_long_messages": (override("""
            def step(self, action):
                text = action.get("content") if isinstance(action, dict) else None
                if isinstance(text, str) and len(text) > 1000:
                    n = 0
                    for i in range(3_000_000):
                        n += i
                return _Base.step(self, action)
        """), "bounded", "took"),  # ~0.2 s a step here: the test lowers slow_call_s to 0.05
        "reward_above_one_after_turn_30": (override("""
            max_turns = 40
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                return obs, (0.6 if self._turn > 30 else reward), terminated, truncated, info
        """), "contract.runtime", "exceeds 1"),
        "state_on_the_class": (override("""
            served = [0]
            def reset(self, seed):
                obs, info = _Base.reset(self, seed)
                Env.served[0] += 1
                obs["messages"][1]["content"] += " (caller %d)" % (Env.served[0] % 3)
                return obs, info
        """), ("determinism", "isolation"), ""),
        # capability not tested
        "magic_phrase": (override("""
            def step(self, action):
                calls = action.get("tool_calls") if isinstance(action, dict) else None
                info = {"skill": self._sc["skill"]}
                if calls:
                    return ({"messages": [{"role": "tool", "content": "ok",
                                           "tool_call_id": c.get("id", "") if isinstance(c, dict) else ""}
                                          for c in calls]}, 0.0, False, False, info)
                text = action.get("content") if isinstance(action, dict) else None
                done = isinstance(text, str) and "request is handled" in text
                return {"messages": [{"role": "user", "content": "ok"}]}, float(done), done, not done, info
            def solve(self, seed):
                return _Base.solve(self, seed)[:1] + [{"role": "assistant", "content": "Your request is handled."}]
        """), "free_reward", "words alone"),
        "write_arguments_never_checked": (override("""
            def _write_outcome(self, name, args):
                kind = {"password": "reset_password", "access": "grant_access",
                        "loan": "extend_laptop_loan"}[self._sc["kind"]]
                if self._sc["blocker"] is None and name == kind:
                    return "right" if self._confirmed else "right_unconfirmed"
                return "wrong"
        """), "partial_credit", "never checks it"),
        "target_never_shown": (override("""
            def reset(self, seed):
                obs, info = _Base.reset(self, seed)
                obs["messages"][1]["content"] = obs["messages"][1]["content"].split(" My ticket is")[0]
                return obs, info
        """), "solvability", "never saw"),
        # no crash: a tool that hangs
        "hanging_tool": (override("""
            def _run(self, call):
                if isinstance(call, dict) and "get_ticket_details" in str(call.get("function")):
                    while True:
                        pass
                return _Base._run(self, call)
        """), "bounded", ""),
    }


DYNAMIC = _dynamic_attacks()


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_dynamic_attack_is_rejected(tmp_path, name):
    source, checks, message = DYNAMIC[name]
    checks = {checks} if isinstance(checks, str) else set(checks)
    assert not [f for f in audit_static(source).findings if f.severity == "error"], "the attack must pass the static audit"
    t0 = time.monotonic()
    settings = GateSettings(**SETTINGS, slow_call_s=0.05 if name == "slow_on_long_messages" else 1.0)
    report = audit(write_env(tmp_path / name, source), settings=settings, write_report=False)
    assert time.monotonic() - t0 < SETTINGS["budget_s"] + 30, "the audit kept its budget"
    found = _errors(report)
    assert report.verdict == "reject"
    assert any(f["check"] in checks and message in f["message"] for f in found), json.dumps(found, indent=1)
    assert isinstance(report.stats["probe_seed"], int)


def test_probe_seed_replays_an_audit(tmp_path):
    """The same probe seed draws the same probes (so the same findings and scores); the seed is in
    report.json. Two audits without one draw different seeds."""
    source = DYNAMIC["free_reward_on_large_seeds"][0]
    folder = write_env(tmp_path / "env", source)
    settings = GateSettings(**{**SETTINGS, "probe_seed": 123456789})
    a, b = (audit(folder, settings=settings, write_report=False) for _ in range(2))
    assert a.stats["probe_seed"] == b.stats["probe_seed"] == 123456789
    assert a.stats["mean_score"] == b.stats["mean_score"]
    assert [f.message for f in a.findings] == [f.message for f in b.findings]
    c = audit(folder, settings=GateSettings(**{**SETTINGS, "resets": 0}), write_report=True)
    assert c.stats["probe_seed"] != 123456789
    assert json.loads((folder / "report.json").read_text())["stats"]["probe_seed"] == c.stats["probe_seed"]


def test_an_exception_out_of_hypothesis_is_a_finding():
    """What hypothesis raises when an env confuses it (a hanging tool made it raise
    FlakyStrategyDefinition) is a finding, not a traceback."""
    from hypothesis.errors import FlakyStrategyDefinition

    findings = Findings()

    def confused():
        raise FlakyStrategyDefinition("Inconsistent data generation!")

    assert _hypothesis_run(findings, "robustness", confused) is None
    [f] = findings.result()
    assert f.check == "robustness" and "FlakyStrategyDefinition" in f.message
