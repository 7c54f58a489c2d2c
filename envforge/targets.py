"""Targets: the environment an agent is evaluated on, as envforge sees it.

A target is a folder holding the agent's tool schemas in OpenAI function-calling form
(``agent_tools.openai.json`` or ``tools.json``), optionally per-tool metadata
(``agent_tools.meta.json`` or ``tools.meta.json``: read/write, mutates_state) and the agent policy
(``policy.md``); or a single JSON file holding the list of tool schemas. ``load_target("example")``
loads envforge's own small example target.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envforge.contract import canonical_json
from envforge.errors import TargetError

EXAMPLES = Path(__file__).parent / "examples"
TOOL_FILES = ("agent_tools.openai.json", "tools.json")
META_FILES = ("agent_tools.meta.json", "tools.meta.json")


@dataclass
class Target:
    name: str
    tools: list[dict]                            # OpenAI function-calling schemas
    meta: dict[str, dict] = field(default_factory=dict)  # tool name -> metadata
    policy: str = ""
    path: str | None = None

    def tool(self, name: str) -> dict | None:
        return self.by_name.get(name)

    @property
    def by_name(self) -> dict[str, dict]:
        return {t["function"]["name"]: t for t in self.tools}

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def schema_hash(self) -> str:
        """sha256 of the canonical JSON of the tool list, sorted by name."""
        tools = sorted(self.tools, key=lambda t: t["function"]["name"])
        return hashlib.sha256(canonical_json(tools).encode()).hexdigest()


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TargetError(f"{path}: not a UTF-8 text file; save it as UTF-8") from None
    except OSError as e:
        raise TargetError(f"{path}: cannot read ({e.strerror})") from None


def _read_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TargetError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None


def _check_tools(tools: Any, source: Path) -> list[dict]:
    if isinstance(tools, dict) and isinstance(tools.get("tools"), list):
        tools = tools["tools"]
    if not isinstance(tools, list) or not tools:
        raise TargetError(f"{source}: expected a non-empty JSON list of OpenAI tool schemas "
                          '([{"type": "function", "function": {"name": ..., "parameters": ...}}])')
    seen = set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise TargetError(f"{source}: tool #{i} is not an OpenAI function schema; expected "
                              '{"type": "function", "function": {"name": str, "parameters": {...}}}')
        if fn["name"] in seen:
            raise TargetError(f"{source}: tool name {fn['name']!r} appears twice")
        seen.add(fn["name"])
        params = fn.get("parameters", {})
        if not isinstance(params, dict):
            raise TargetError(f"{source}: tool {fn['name']!r} has parameters that are not a JSON object")
    return tools


def _meta(raw: Any) -> dict[str, dict]:
    if isinstance(raw, dict):
        return {k: v for k, v in raw.items() if isinstance(v, dict)}
    if isinstance(raw, list):
        return {m["name"]: m for m in raw if isinstance(m, dict) and isinstance(m.get("name"), str)}
    return {}


def load_target(spec: str | Path) -> Target:
    """Load a target from a folder, a JSON file of tool schemas, or the name ``example``."""
    if str(spec) == "example":
        spec = EXAMPLES / "helpdesk"
    path = Path(spec)
    if not path.exists():
        raise TargetError(f"target {str(spec)!r} does not exist: give a folder holding "
                          f"{' or '.join(TOOL_FILES)}, a JSON file of tool schemas, or 'example'")
    if path.is_file():
        return Target(name=path.stem, tools=_check_tools(_read_json(path), path), path=str(path))
    tool_file = next((path / f for f in TOOL_FILES if (path / f).is_file()), None)
    if tool_file is None:
        raise TargetError(f"target folder {path} holds neither {' nor '.join(TOOL_FILES)}")
    meta_file = next((path / f for f in META_FILES if (path / f).is_file()), None)
    policy = path / "policy.md"
    return Target(
        name=_target_name(path),
        tools=_check_tools(_read_json(tool_file), tool_file),
        meta=_meta(_read_json(meta_file)) if meta_file else {},
        policy=_read_text(policy) if policy.is_file() else "",
        path=str(path),
    )


def _target_name(path: Path) -> str:
    """``tau2/retail`` for .../tau2/retail, the folder name otherwise."""
    path = path.resolve()
    parent = path.parent.name
    return f"{parent}/{path.name}" if parent in ("tau2", "tau-bench", "taubench") else path.name
