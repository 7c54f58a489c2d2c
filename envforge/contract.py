"""The generated-environment contract (ENV_CONTRACT.md, v1) as code, and the data that flows
between envforge's stages.

A generated environment is one Python file, ``env.py``, written by an LLM or a template. It is
untrusted. This module says what such a file may contain (the allow-lists and limits the static
audit enforces), what its messages look like, and what the gate reports about it (``Finding``,
``Report``). It imports only the standard library and envforge's errors and settings, and
every other module of envforge may import it.
"""
from __future__ import annotations

import json
import math
import random
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from envforge.errors import printable
from envforge.settings import Settings, setting

CONTRACT_VERSION = 1

# --------------------------------------------------------------------------- env seeds

#: half the seeds of an audit and of a training run are drawn below this
SMALL_SEEDS = 256


def mix_seed(rng: random.Random, quarter: int) -> int:
    """A seed of the mix the gate audits and training plays, from its ``quarter`` (0 to 3): 0
    and 2 in [0, ``SMALL_SEEDS``); 1 in [10^6, 2^31); 3 log-uniform in [``SMALL_SEEDS``, 10^6),
    as many in [256, 1000) as in [1000, 4000)."""
    if quarter == 3:
        x = int(math.exp(rng.uniform(math.log(SMALL_SEEDS), math.log(10**6))))
        return min(10**6 - 1, max(SMALL_SEEDS, x))
    return rng.randrange(10**6, 2**31) if quarter == 1 else rng.randrange(0, SMALL_SEEDS)


def training_seeds(key: int, start: int, n: int) -> list[int]:
    """Env seeds ``start`` to ``start + n - 1`` of a training run keyed by ``key``: each of the
    audit's mix (``mix_seed``, its quarter drawn too) from a generator of its own, keyed by the
    key and the seed's number, so a resumed run draws the same ones. An env that does not know
    the key cannot tell training's seeds from the audit's: a flaw kept to some seeds meets about
    as large a share of training's episodes as of the audit's seeds (where a run's seeds counted
    up from 0, a flaw kept to [256, 4096) met nearly all of a long run's and one audit seed in
    twelve)."""
    out = []
    for i in range(start, start + n):
        rng = random.Random(f"envforge training seed {key} {i}")
        out.append(mix_seed(rng, rng.randrange(4)))
    return out


def new_seed_key() -> int:
    """A key for ``training_seeds`` from the OS, for a run given none."""
    return secrets.randbits(62)

# --------------------------------------------------------------------------- the file

#: Modules ``env.py`` may import (top-level names; ``collections.abc`` counts as ``collections``).
ALLOWED_IMPORTS = frozenset({
    "json", "random", "math", "re", "string", "itertools", "collections", "copy", "dataclasses",
    "typing", "enum", "functools", "statistics", "decimal", "fractions", "datetime", "textwrap",
    "hashlib",
})

#: Builtins that ``env.py`` may not name at all: code execution, I/O, introspection of scopes.
FORBIDDEN_BUILTINS = frozenset({
    "eval", "exec", "compile", "open", "__import__", "globals", "locals", "vars", "input",
    "breakpoint", "help", "memoryview", "exit", "quit", "copyright", "credits", "license",
    "__build_class__", "__loader__", "__spec__", "__builtins__",
})

#: Builtins allowed only with a constant, non-dunder attribute name (``getattr(x, "name")``).
ATTRIBUTE_BUILTINS = frozenset({"getattr", "setattr", "delattr", "hasattr"})

#: Builtins whose results depend on the process (memory addresses, PYTHONHASHSEED): a warning,
#: since the dynamic determinism check decides whether they leak into observations.
PROCESS_DEPENDENT_BUILTINS = frozenset({"id", "hash"})

#: Dunder names that may be used as plain names (``if __name__ == "__main__":``, ``__all__``).
ALLOWED_DUNDER_NAMES = frozenset({"__name__", "__all__", "__doc__", "__slots__"})

#: Module-level functions of ``random`` that draw from the shared, unseeded generator.
RANDOM_GLOBAL_FUNCTIONS = frozenset({
    "random", "randint", "randrange", "randbytes", "choice", "choices", "shuffle", "sample",
    "uniform", "triangular", "betavariate", "binomialvariate", "expovariate", "gammavariate",
    "gauss", "lognormvariate", "normalvariate", "vonmisesvariate", "paretovariate",
    "weibullvariate", "getrandbits", "seed", "getstate", "setstate", "SystemRandom",
})

#: Dotted names that read the wall clock or another entropy source.
CLOCK_SOURCES = frozenset({
    "datetime.datetime.now", "datetime.datetime.today", "datetime.datetime.utcnow",
    "datetime.date.today",
})

MAX_SOURCE_BYTES = 100_000
DEFAULT_MAX_TURNS = 10
MAX_TURNS_LIMIT = 50

#: The methods of ``Env`` and their positional parameters after ``self``.
ENV_METHODS = {"reset": ("seed",), "step": ("action",), "solve": ("seed",)}

# --------------------------------------------------------------------------- messages

Role = Literal["system", "user", "assistant", "tool"]
ROLES = ("system", "user", "assistant", "tool")


class FunctionCall(TypedDict):
    name: str
    arguments: str  # a JSON string, as the OpenAI API sends it


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(TypedDict, total=False):
    role: Role
    content: str | None
    tool_calls: list[ToolCall]
    tool_call_id: str


class Observation(TypedDict):
    messages: list[Message]


#: An action is one assistant message.
Action = Message


def tool_call(name: str, arguments: dict | str, call_id: str = "call_0") -> ToolCall:
    """Build one tool call; ``arguments`` may be a dict (encoded as JSON) or a raw string."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def assistant(content: str | None = None, tool_calls: list[ToolCall] | None = None) -> Message:
    msg: Message = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def message_problem(msg: Any) -> str | None:
    """Why ``msg`` is not a contract message, or None when it is one."""
    if not isinstance(msg, dict):
        return f"a message must be a dict, got {type(msg).__name__}"
    role = msg.get("role")
    if role not in ROLES:
        return f"message role must be one of {', '.join(ROLES)}, got {role!r}"
    content = msg.get("content")
    if role in ("system", "user", "tool") and not isinstance(content, str):
        return f"a {role} message needs string content, got {type(content).__name__}"
    if role == "assistant":
        if content is not None and not isinstance(content, str):
            return f"assistant content must be a string or null, got {type(content).__name__}"
        calls = msg.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            return "assistant tool_calls must be a list"
    if role == "tool" and not isinstance(msg.get("tool_call_id"), str):
        return "a tool message needs a string tool_call_id"
    return None


# --------------------------------------------------------------------------- findings

Severity = Literal["error", "warning"]
Verdict = Literal["accept", "reject"]

#: Every check the gate runs, in order. A finding's ``check`` is one of these.
CHECKS = (
    "input",            # the file could not be read as Python source at all
    "static.syntax",
    "static.size",
    "static.import",
    "static.builtin",
    "static.dunder",
    "static.entropy",
    "contract.shape",
    "schema.fidelity",
    "schema.unknown_tool",
    "sandbox",          # the env could not be loaded in the sandbox
    "json",
    "contract.runtime",  # reset/step/solve returned something the contract does not allow
    "determinism",
    "diversity",
    "solvability",
    "free_reward",
    "partial_credit",
    "robustness",
    "bounded",
    "isolation",
)


@dataclass
class Finding:
    """One thing the gate found. ``expected``/``actual`` carry the evidence when there is some."""
    check: str
    severity: Severity
    message: str
    expected: Any = None
    actual: Any = None

    def __post_init__(self) -> None:
        # a finding quotes what an env said (its errors, its texts): shown on a terminal, it must
        # not carry control characters
        self.message = printable(str(self.message))
        for name in ("expected", "actual"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, printable(getattr(self, name)))
        if self.check not in CHECKS:
            raise ValueError(f"unknown check {self.check!r}; known checks: {', '.join(CHECKS)}")
        if self.severity not in ("error", "warning"):
            raise ValueError(f"severity must be 'error' or 'warning', got {self.severity!r}")

    def to_dict(self) -> dict:
        d = {"check": self.check, "severity": self.severity, "message": self.message}
        if self.expected is not None:
            d["expected"] = self.expected
        if self.actual is not None:
            d["actual"] = self.actual
        return d


def findings_from(items: Any) -> list[Finding]:
    """Findings read back from JSON (a report.json or a manifest's attempts). An entry that is
    not a finding of a known check stays, as a warning that says so."""
    out = []
    for d in items if isinstance(items, list) else []:
        try:
            out.append(Finding(d["check"], d["severity"], str(d["message"]), d.get("expected"),
                               d.get("actual")))
        except (KeyError, TypeError, ValueError):
            out.append(warning("input", f"not a finding of this envforge: {d!r}"[:500]))
    return out


def error(check: str, message: str, expected: Any = None, actual: Any = None) -> Finding:
    return Finding(check, "error", message, expected, actual)


def warning(check: str, message: str, expected: Any = None, actual: Any = None) -> Finding:
    return Finding(check, "warning", message, expected, actual)


@dataclass
class Report:
    """The gate's verdict on one env: accepted when no finding is an error. ``target`` and
    ``target_schema_hash`` say which target's tools it was judged against."""
    path: str
    findings: list[Finding] = field(default_factory=list)
    target: str | None = None
    stages: dict[str, float] = field(default_factory=dict)  # stage name -> seconds
    stats: dict[str, Any] = field(default_factory=dict)     # measured values (scores, counts)
    target_schema_hash: str | None = None

    @property
    def verdict(self) -> Verdict:
        return "reject" if any(f.severity == "error" for f in self.findings) else "accept"

    @property
    def accepted(self) -> bool:
        return self.verdict == "accept"

    def to_dict(self) -> dict:
        return {"path": self.path, "verdict": self.verdict, "target": self.target,
                "target_schema_hash": self.target_schema_hash, "contract_version": CONTRACT_VERSION,
                "findings": [f.to_dict() for f in self.findings],
                "stages": {k: round(v, 4) for k, v in self.stages.items()}, "stats": self.stats}


@dataclass(frozen=True)
class Limits(Settings):
    """Resource limits for one sandboxed env process (or container)."""
    call_timeout_s: float = setting(5.0, "Seconds one reset/step/solve call may take (wall clock; "
                                         "also its CPU time).", above=0)
    load_timeout_s: float = setting(10.0, "Seconds to start the sandbox and load env.py.", above=0)
    memory_mb: int = setting(1024, "Address-space limit of the sandboxed env process, MiB "
                             "(below 64 no Python interpreter starts; use >= 256).", low=64)
    cpu_s: int = setting(300, "CPU seconds over the sandbox's whole life (a backstop).", low=1)
    max_message_bytes: int = setting(4 << 20, "Longest protocol line from the sandbox, bytes.",
                                     low=1024)
    max_open_files: int = setting(64, "Open files of the sandboxed process.", low=16)


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a value: sorted keys, no insignificant whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
