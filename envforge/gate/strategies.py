"""Hypothesis strategies for actions: schema-valid tool calls drawn from each tool's JSON schema,
and malformed calls of every kind a policy in training will produce.

The JSON-schema subset covered is what function-calling schemas use: type (or a list of types),
enum, const, anyOf/oneOf, $ref into $defs/definitions, properties/required/additionalProperties,
items, minimum/maximum, minLength/maxLength, minItems/maxItems. Anything else draws a value of
any JSON type, which is still a fair input: an env must not crash on it.
"""
from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from envforge.contract import assistant, tool_call

_TEXT = st.text(max_size=24)
_JSON_SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) | _TEXT
ANY_JSON = st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=6)


def from_schema(schema: Any, root: dict | None = None, depth: int = 0) -> st.SearchStrategy:
    """A strategy for values valid under ``schema`` (best effort, see the module docstring)."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 6:
        return ANY_JSON
    if "$ref" in schema:
        return from_schema(_resolve(schema["$ref"], root), root, depth + 1)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema and schema["enum"]:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return st.one_of([from_schema(s, root, depth + 1) for s in schema[key]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, root, depth) for k in kind])
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=max(schema.get("maxLength", 24), schema.get("minLength", 0)))
    if kind == "integer":
        return st.integers(schema.get("minimum", -10**6), schema.get("maximum", 10**6))
    if kind == "number":
        return st.floats(schema.get("minimum", -1e6), schema.get("maximum", 1e6),
                         allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        lo = schema.get("minItems", 0)
        return st.lists(from_schema(schema.get("items", {}), root, depth + 1), min_size=lo,
                        max_size=max(schema.get("maxItems", 3), lo))
    if kind == "object" or "properties" in schema:
        return _object(schema, root, depth)
    return ANY_JSON


def _resolve(ref: str, root: dict) -> Any:
    node: Any = root
    if not ref.startswith("#/"):
        return {}
    for part in ref[2:].split("/"):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node


def _object(schema: dict, root: dict, depth: int) -> st.SearchStrategy:
    props = schema.get("properties") or {}
    required = [k for k in schema.get("required") or [] if k in props]
    optional = [k for k in props if k not in required]
    return st.fixed_dictionaries(
        {k: from_schema(props[k], root, depth + 1) for k in required},
        optional={k: from_schema(props[k], root, depth + 1) for k in optional})


def arguments(tool: dict) -> st.SearchStrategy:
    params = tool["function"].get("parameters") or {"type": "object", "properties": {}}
    return from_schema(params)


def valid_call(tools: list[dict]) -> st.SearchStrategy:
    """One schema-valid tool call: (tool name, arguments dict)."""
    return st.sampled_from(tools).flatmap(
        lambda t: st.tuples(st.just(t["function"]["name"]), arguments(t)))


@st.composite
def malformed_action(draw: st.DrawFn, tools: list[dict]) -> tuple[str, Any]:
    """(kind, action): an action a careless policy could send. The env must answer, not raise."""
    name, args = draw(valid_call(tools))
    kind = draw(st.sampled_from(MALFORMED_KINDS))
    if kind == "arguments_not_json":
        return kind, assistant(None, [tool_call(name, draw(st.sampled_from(['{"a": ', "not json", "", "{'a': 1}"])))])
    if kind == "arguments_not_object":
        return kind, assistant(None, [tool_call(name, json.dumps(draw(st.sampled_from([[1, 2], None, 42, "x", True]))))])
    if kind == "arguments_as_dict":
        call = tool_call(name, "{}")
        call["function"]["arguments"] = args
        return kind, assistant(None, [call])
    if kind == "missing_argument":
        if args:
            args = dict(args)
            args.pop(draw(st.sampled_from(sorted(args))))
        return kind, assistant(None, [tool_call(name, args)])
    if kind == "wrong_type":
        if args:
            key = draw(st.sampled_from(sorted(args)))
            args = {**args, key: draw(st.sampled_from([None, 12345, -1.5, True, [], {}, ["x"], {"k": "v"}, ""]))}
        return kind, assistant(None, [tool_call(name, args)])
    if kind == "extra_argument":
        return kind, assistant(None, [tool_call(name, {**args, draw(_TEXT.filter(lambda s: s not in args)): draw(ANY_JSON)})])
    if kind == "unknown_tool":
        return kind, assistant(None, [tool_call(draw(st.sampled_from(["", "rm_rf", name + "_v2", "__import__"])), args)])
    if kind == "several_calls":
        calls = [tool_call(n, a, f"call_{i}") for i, (n, a) in enumerate(draw(st.lists(valid_call(tools), min_size=2, max_size=3)))]
        return kind, assistant(draw(st.none() | _TEXT), calls)
    if kind == "broken_call_object":
        return kind, {"role": "assistant", "content": None,
                      "tool_calls": [draw(st.sampled_from([{}, {"id": "c"}, {"function": None}, {"function": {"name": name}},
                                                           "call", None, 7]))]}
    if kind == "tool_calls_not_list":
        return kind, {"role": "assistant", "content": None, "tool_calls": draw(st.sampled_from([{}, "x", 3, None]))}
    if kind == "content_not_string":
        return kind, {"role": "assistant", "content": draw(st.sampled_from([7, ["hi"], {"text": "hi"}, True]))}
    if kind == "empty_message":
        return kind, draw(st.sampled_from([{}, {"role": "assistant"}, {"role": "assistant", "content": None, "tool_calls": []}]))
    return kind, draw(st.sampled_from([None, "hello", 3, [], ["a"]]))  # not_a_message


MALFORMED_KINDS = ("arguments_not_json", "arguments_not_object", "arguments_as_dict", "missing_argument",
                   "wrong_type", "extra_argument", "unknown_tool", "several_calls",
                   "broken_call_object", "tool_calls_not_list", "content_not_string",
                   "empty_message", "not_a_message")
