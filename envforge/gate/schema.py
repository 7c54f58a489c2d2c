"""Schema fidelity: an env must speak the target's tools exactly.

An adapter trained on tools whose names, parameters or descriptions differ from the target's does
not transfer (METHOD.md, section 2). Every schema in ``Env.tools`` must equal, as canonical JSON,
the target's tool of the same name; a tool the target lacks is rejected; every tool call of the
reference solution must validate against its schema (checked in the dynamic stage with
``call_problem``).
"""
from __future__ import annotations

import json
from typing import Any

from envforge.contract import Finding, canonical_json, error
from envforge.targets import Target


def _name(tool: Any) -> str | None:
    fn = tool.get("function") if isinstance(tool, dict) else None
    return fn.get("name") if isinstance(fn, dict) and isinstance(fn.get("name"), str) else None


def describe_drift(expected: dict, actual: dict) -> str:
    """What differs between two schemas of one tool, in words (parameters first)."""
    notes = []
    e_fn, a_fn = expected.get("function", {}), actual.get("function", {}) if isinstance(actual, dict) else {}
    e_par = e_fn.get("parameters") or {}
    a_par = a_fn.get("parameters") or {} if isinstance(a_fn, dict) else {}
    e_props = e_par.get("properties") or {}
    a_props = a_par.get("properties") or {} if isinstance(a_par, dict) else {}
    if isinstance(a_props, dict):
        missing = [p for p in e_props if p not in a_props]
        extra = [p for p in a_props if p not in e_props]
        changed = [p for p in e_props if p in a_props and canonical_json(e_props[p]) != canonical_json(a_props[p])]
        if missing:
            notes.append("parameter(s) " + ", ".join(repr(p) for p in missing) + " missing")
        if extra:
            notes.append("parameter(s) " + ", ".join(repr(p) for p in extra) + " not in the target")
        for p in changed:
            notes.append(f"parameter {p!r} is {canonical_json(a_props[p])}, the target's is "
                         f"{canonical_json(e_props[p])}")
    if isinstance(a_par, dict) and sorted(e_par.get("required") or []) != sorted(a_par.get("required") or []):
        notes.append(f"required is {a_par.get('required')}, the target's is {e_par.get('required')}")
    for key in sorted(set(e_fn) | set(a_fn if isinstance(a_fn, dict) else {})):
        if key in ("name", "parameters"):
            continue
        if canonical_json(e_fn.get(key)) != canonical_json(a_fn.get(key) if isinstance(a_fn, dict) else None):
            notes.append(f"function field {key!r} differs")
    rest_e = {k: v for k, v in e_par.items() if k not in ("properties", "required")}
    rest_a = {k: v for k, v in a_par.items() if k not in ("properties", "required")} if isinstance(a_par, dict) else {}
    if canonical_json(rest_e) != canonical_json(rest_a):
        notes.append("parameters' " + ", ".join(sorted(set(rest_e) ^ set(rest_a) | {
            k for k in rest_e if k in rest_a and rest_e[k] != rest_a[k]})) + " differ")
    outer = {k for k in set(expected) | set(actual) if k != "function"}
    if any(canonical_json(expected.get(k)) != canonical_json(actual.get(k)) for k in outer):
        notes.append("top-level fields differ")
    return "; ".join(notes) or "formatting differs"


def check_schema(tools: Any, target: Target) -> list[Finding]:
    """Findings for every tool of ``Env.tools`` that is not exactly a tool of ``target``."""
    if not isinstance(tools, list) or not tools:
        return [error("schema.fidelity", "Env.tools must be a non-empty list of OpenAI function "
                      "schemas copied from the target", actual=tools if isinstance(tools, list) else None)]
    findings = []
    seen = set()
    for i, tool in enumerate(tools):
        name = _name(tool)
        if name is None:
            findings.append(error("schema.fidelity", f"Env.tools[{i}] is not an OpenAI function schema "
                                  '({"type": "function", "function": {"name": ..., "parameters": ...}})',
                                  actual=tool))
            continue
        if name in seen:
            findings.append(error("schema.fidelity", f"tool {name!r} appears twice in Env.tools"))
        seen.add(name)
        expected = target.tool(name)
        if expected is None:
            findings.append(error("schema.unknown_tool",
                                  f"tool {name!r} is not a tool of target {target.name}; an adapter "
                                  "trained on it would not transfer. The target's tools: "
                                  + ", ".join(target.tool_names), actual=tool))
        elif canonical_json(tool) != canonical_json(expected):
            findings.append(error("schema.fidelity",
                                  f"tool {name!r} differs from target {target.name}'s: "
                                  f"{describe_drift(expected, tool)}. Copy the target's schema "
                                  "unchanged (names, types, descriptions).",
                                  expected=expected, actual=tool))
    return findings


def call_problem(tools_by_name: dict[str, dict], call: Any) -> str | None:
    """Why one tool call does not fit the tools' schemas, or None when it does."""
    if not isinstance(call, dict):
        return f"a tool call must be an object, got {type(call).__name__}"
    fn = call.get("function")
    if not isinstance(fn, dict):
        return "a tool call needs a 'function' object"
    name = fn.get("name")
    if name not in tools_by_name:
        return f"tool {name!r} is not in Env.tools"
    raw = fn.get("arguments")
    if not isinstance(raw, str):
        return f"arguments of {name!r} must be a JSON string, got {type(raw).__name__}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError:
        return f"arguments of {name!r} are not valid JSON: {raw[:80]!r}"
    import jsonschema  # lazy: ~0.1 s to import
    schema = tools_by_name[name]["function"].get("parameters") or {"type": "object"}
    try:
        jsonschema.validate(args, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        return f"arguments of {name!r} do not fit its schema" + (f" at {where}" if where else "") + f": {e.message}"
    except jsonschema.SchemaError as e:
        return f"the schema of {name!r} is not a valid JSON schema: {e.message}"
    return None
