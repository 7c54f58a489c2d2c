import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings

from envforge.gate.strategies import MALFORMED_KINDS, arguments, from_schema, malformed_action
from envforge.targets import load_target
from tests.conftest import TARGETS, needs_shared

FAST = settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _tools():
    out = [load_target("example")]
    if TARGETS.is_dir():
        out += [load_target(TARGETS / p) for p in ("tau2/retail", "tau2/airline", "toolsandbox")]
    return [t for target in out for t in target.tools]


@pytest.mark.parametrize("tool", _tools(), ids=lambda t: t["function"]["name"])
def test_drawn_arguments_fit_the_schema(tool):
    schema = tool["function"]["parameters"]

    @FAST
    @given(arguments(tool))
    def check(args):
        jsonschema.validate(args, schema)
        json.dumps(args)

    check()


def test_ref_anyof_enum_bounds():
    schema = {"type": "object", "$defs": {"P": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["n"]}},
        "properties": {"p": {"$ref": "#/$defs/P"}, "e": {"enum": ["a", "b"]},
                       "u": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                       "l": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2}},
        "required": ["p", "e", "u", "l"]}

    @FAST
    @given(from_schema(schema))
    def check(v):
        assert 1 <= v["p"]["n"] <= 3 and v["e"] in ("a", "b")
        assert v["u"] is None or isinstance(v["u"], str)
        assert 1 <= len(v["l"]) <= 2 and all(isinstance(b, bool) for b in v["l"])

    check()


def test_malformed_actions_cover_every_kind_and_are_json():
    tools = load_target("example").tools
    seen = set()

    @settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(malformed_action(tools))
    def collect(pair):
        kind, action = pair
        seen.add(kind)
        json.dumps(action)  # everything a policy sends crosses the protocol as JSON

    collect()
    assert seen == set(MALFORMED_KINDS)


@needs_shared
def test_malformed_missing_argument_really_misses_one():
    retail = load_target(TARGETS / "tau2" / "retail")
    tools = [retail.tool("get_order_details")]

    @FAST
    @given(malformed_action(tools).filter(lambda p: p[0] == "missing_argument"))
    def check(pair):
        args = json.loads(pair[1]["tool_calls"][0]["function"]["arguments"])
        assert "order_id" not in args

    check()
