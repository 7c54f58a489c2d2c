import copy
import json

import pytest

from envforge.contract import tool_call
from envforge.gate.schema import call_problem, check_schema
from envforge.gate.static import audit_static
from envforge.targets import load_target
from tests.conftest import TARGETS, needs_shared


@pytest.fixture(scope="module")
def target():
    return load_target("example")


def test_exact_copy_has_no_findings(target):
    assert check_schema(copy.deepcopy(target.tools[:3]), target) == []


def test_renamed_parameter_is_named_with_expected_and_actual(target):
    tool = copy.deepcopy(target.tools[0])
    props = tool["function"]["parameters"]["properties"]
    old = sorted(props)[0]
    props[old + "_x"] = props.pop(old)
    [f] = check_schema([tool], target)
    assert f.check == "schema.fidelity" and f.severity == "error"
    assert f"{old!r} missing" in f.message and f"{old + '_x'!r} not in the target" in f.message
    assert f.expected == target.tools[0] and f.actual == tool


def test_changed_type_and_description_and_required(target):
    tool = copy.deepcopy(target.tools[0])
    fn = tool["function"]
    name = sorted(fn["parameters"]["properties"])[0]
    fn["parameters"]["properties"][name]["type"] = "integer"
    fn["description"] = "something else"
    fn["parameters"]["required"] = []
    [f] = check_schema([tool], target)
    assert f"parameter {name!r} is" in f.message
    assert "'description' differs" in f.message
    assert "required is []" in f.message


def test_unknown_tool_lists_the_targets_tools(target):
    tool = {"type": "function", "function": {"name": "launch_rocket", "parameters": {"type": "object"}}}
    [f] = check_schema([tool], target)
    assert f.check == "schema.unknown_tool" and "launch_rocket" in f.message
    assert target.tool_names[0] in f.message


def test_not_a_list_and_duplicates(target):
    assert check_schema("tools", target)[0].check == "schema.fidelity"
    assert check_schema([], target)[0].check == "schema.fidelity"
    dup = check_schema([target.tools[0], target.tools[0]], target)
    assert any("appears twice" in f.message for f in dup)
    bad = check_schema([{"name": "x"}], target)
    assert "not an OpenAI function schema" in bad[0].message


def test_key_order_and_whitespace_do_not_matter(target):
    tool = json.loads(json.dumps(target.tools[0], sort_keys=True))
    assert check_schema([tool], target) == []


def tools_from_source(source: str):
    """What the static stage reads of Env.tools (the schema check compares it with the target)."""
    return audit_static(source).shape["tools"]


def test_tools_from_source_literal_and_name():
    src = "TOOLS = [{'type': 'function', 'function': {'name': 'a'}}]\nclass Env:\n    tools = TOOLS\n"
    assert tools_from_source(src) == [{"type": "function", "function": {"name": "a"}}]
    assert tools_from_source("class Env:\n    tools = [1, 2]\n") == [1, 2]
    assert tools_from_source("class Env:\n    tools = make()\n") is None  # needs the sandbox
    assert tools_from_source("x = (") is None
    assert tools_from_source("x = 1") is None
    # annotated, inherited, and behind a BOM: read the same way the contract check reads them
    assert tools_from_source("class Env:\n    tools: list = [1]\n") == [1]
    assert tools_from_source("T = [2]\nclass Base:\n    tools = T\nclass Env(Base):\n    pass\n") == [2]
    assert tools_from_source("\ufeffclass Env:\n    tools = [3]\n".encode()) == [3]


def test_call_problem(target):
    by_name = target.by_name
    tool = target.tools[0]
    name = tool["function"]["name"]
    required = tool["function"]["parameters"].get("required", [])
    assert call_problem(by_name, tool_call("nope", {})) == "tool 'nope' is not in Env.tools"
    assert "not valid JSON" in call_problem(by_name, tool_call(name, "{oops"))
    if required:
        assert "do not fit its schema" in call_problem(by_name, tool_call(name, {}))
        assert required[0] in call_problem(by_name, tool_call(name, {}))
    assert "must be a JSON string" in call_problem(by_name, {"function": {"name": name, "arguments": {}}})


@needs_shared
def test_ref_schemas_of_airline_validate():
    airline = load_target(TARGETS / "tau2" / "airline")
    ref_tools = [t for t in airline.tools if "$ref" in json.dumps(t)]
    assert ref_tools
    tool = ref_tools[0]
    problem = call_problem(airline.by_name, tool_call(tool["function"]["name"], {}))
    assert problem and "do not fit its schema" in problem
