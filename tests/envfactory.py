"""A factory of deliberately broken variants of a good env, one (or more) per gate check.

The good env is envforge's own example (generated_envs/helpdesk_precondition_verification). Most
variants rename its class to ``_Base`` and append a subclass ``Env`` that overrides one method
with one planted flaw, so that each variant differs from the good env in exactly one way.
"""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOOD_DIR = REPO / "generated_envs" / "helpdesk_precondition_verification"


def good_source() -> str:
    return (GOOD_DIR / "env.py").read_text()


def override(body: str) -> str:
    """The good env with ``class Env(_Base)`` overriding some of its methods."""
    src = good_source()
    assert src.count("\nclass Env:") == 1
    return (src.replace("\nclass Env:", "\nclass _Base:") + "\n\nclass Env(_Base):\n"
            + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n")


def replace(old: str, new: str) -> str:
    src = good_source()
    assert old in src, f"the good env no longer contains {old!r}; update the factory"
    return src.replace(old, new, 1)


@dataclass
class Variant:
    name: str
    source: str
    check: str        # the check that must report it
    message: str      # a substring of that finding's message


def variants() -> list[Variant]:
    v = Variant
    return [
        # static
        v("forbidden_import", replace("import json\n", "import json\nimport os\n"), "static.import", "'os'"),
        v("eval", override("""
            def reset(self, seed):
                return eval("_Base.reset")(self, seed)
        """), "static.builtin", "eval"),
        v("init_raises", override("""
            def __init__(self):
                raise ValueError("boom in init")
        """), "robustness", "ValueError: boom in init"),
        v("dunder_walk", override("""
            def reset(self, seed):
                self.k = ().__class__.__bases__
                return _Base.reset(self, seed)
        """), "static.dunder", "__class__"),
        v("global_random", override("""
            def reset(self, seed):
                obs, info = _Base.reset(self, seed)
                info["noise"] = random.random()
                return obs, info
        """), "static.entropy", "random.random"),
        v("no_capability", replace('CAPABILITY = "precondition verification"', 'CAPABILITY = ""'),
          "contract.shape", "CAPABILITY"),
        # schema
        v("schema_drift", replace('"properties": {"email": {', '"properties": {"mail": {'),
          "schema.fidelity", "'email' missing"),
        v("unknown_tool", override("""
            tools = _Base.tools + [{"type": "function", "function": {"name": "wipe_laptop",
                                    "description": "Wipe.", "parameters": {"type": "object", "properties": {}}}}]
        """), "schema.unknown_tool", "wipe_laptop"),
        v("solve_bad_arguments", override("""
            def solve(self, seed):
                plan = _Base.solve(self, seed)
                for msg in plan:
                    for call in msg.get("tool_calls") or []:
                        call["function"]["arguments"] = json.dumps({"unexpected": 1})
                return plan
        """), "schema.fidelity", "does not fit"),
        # dynamic
        v("load_error", good_source() + "\nraise ValueError('broken at import')\n", "sandbox", "ValueError"),
        v("tuple_in_info", override("""
            def reset(self, seed):
                obs, info = _Base.reset(self, seed)
                info["pos"] = (1, 2)
                return obs, info
        """), "json", "not JSON"),
        v("reward_out_of_range", override("""
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                return obs, (1.5 if terminated or truncated else reward), terminated, truncated, info
        """), "contract.runtime", "reward must be a float in [0, 1]"),
        v("score_over_one", override("""
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                return obs, 0.6, terminated, truncated, info
        """), "contract.runtime", "exceeds 1"),
        v("no_system_message", override("""
            def reset(self, seed):
                obs, info = _Base.reset(self, seed)
                return {"messages": obs["messages"][1:]}, info
        """), "contract.runtime", "system message first"),
        v("skill_missing", override("""
            def reset(self, seed):
                obs, info = _Base.reset(self, seed)
                return obs, {}
        """), "contract.runtime", "info['skill']"),
        v("crash_on_bad_action", override("""
            def step(self, action):
                if not isinstance(action, dict) or not isinstance(action.get("tool_calls", []), list):
                    raise TypeError("action is not a message")
                return _Base.step(self, action)
        """), "robustness", "TypeError"),
        v("counter_leaks", override("""
            calls = [0]

            def reset(self, seed):
                obs, info = _Base.reset(self, seed)
                self.calls[0] += 1
                info["episode"] = self.calls[0]
                return obs, info
        """), "determinism", "replayed in the same instance"),
        v("set_order", override("""
            def reset(self, seed):
                obs, info = _Base.reset(self, seed)
                info["tags"] = list({"alpha", "beta", "gamma", "delta", "epsilon", "zeta"})
                return obs, info
        """), "determinism", "PYTHONHASHSEED"),
        v("shared_state", override("""
            last = {"seed": None}

            def reset(self, seed):
                self.last["seed"] = seed
                return _Base.reset(self, seed)

            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                info["last_seed"] = self.last["seed"]
                return obs, reward, terminated, truncated, info
        """), "isolation", "another instance"),
        v("seed_ignored", override("""
            def reset(self, seed):
                return _Base.reset(self, 0)

            def solve(self, seed):
                return _Base.solve(self, 0)
        """), "diversity", "distinct scenarios"),
        v("unsolvable", override("""
            def solve(self, seed):
                return [{"role": "assistant", "content": "Hello, how can I help?"}]
        """), "solvability", "solve() reaches score 1.0"),
        v("free_reward", override("""
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                return obs, (1.0 if terminated or truncated else 0.0), terminated, truncated, info
        """), "free_reward", "do-nothing policy scores"),
        v("binary_reward", override("""
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                if terminated or truncated:
                    reward = 1.0 if reward > 0.99 else 0.0
                return obs, reward, terminated, truncated, info
        """), "partial_credit", "take only the values"),
        v("hang", override("""
            def step(self, action):
                text = str(action.get("content")) if isinstance(action, dict) else ""
                if "anything else" in text or len(text) > 300:  # long talk: the gate's drawn texts
                    while True:
                        pass
                return _Base.step(self, action)
        """), "bounded", "did not answer within"),
        v("memory_bomb", override("""
            def step(self, action):
                text = str(action.get("content")) if isinstance(action, dict) else ""
                if "anything else" in text or len(text) > 300:  # long talk: the gate's drawn texts
                    self.blob = "x" * (1 << 34)
                return _Base.step(self, action)
        """), "bounded", "out of memory"),
        v("never_ends", override("""
            def step(self, action):
                obs, reward, terminated, truncated, info = _Base.step(self, action)
                return obs, reward, False, False, info
        """), "bounded", "neither terminated nor truncated"),
    ]


def write_env(folder: Path, source: str | bytes, target: str | None = "example",
              capability: str | None = None) -> Path:
    """An env folder holding ``source`` as env.py (and a manifest naming ``target``, and the
    capability the env was made for where given)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = source.encode() if isinstance(source, str) else source
    (folder / "env.py").write_bytes(data)
    if target is not None:
        made_for = {} if capability is None else {"capability": capability}
        (folder / "manifest.json").write_text(json.dumps({**made_for, "target": target}))
    return folder
