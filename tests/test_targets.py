import json

import pytest

from envforge.errors import TargetError
from envforge.targets import load_target
from tests.conftest import TARGETS, needs_shared


def test_example_target_loads_with_meta_and_policy():
    t = load_target("example")
    assert t.name == "helpdesk"
    assert len(t.tools) >= 6
    assert set(t.meta) == set(t.tool_names)  # every tool has read/write metadata
    assert {m["tool_type"] for m in t.meta.values()} >= {"read", "write"}
    assert "policy" in t.policy.lower() or len(t.policy) > 200
    assert len(t.schema_hash()) == 64


def test_single_json_file_of_tools(tmp_path):
    tools = [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]
    f = tmp_path / "tools.json"
    f.write_text(json.dumps(tools))
    t = load_target(f)
    assert t.tool_names == ["ping"] and t.tool("ping") == tools[0] and t.tool("nope") is None


def test_folder_with_tools_json(tmp_path):
    (tmp_path / "tools.json").write_text(json.dumps(
        [{"type": "function", "function": {"name": "a", "parameters": {}}}]))
    (tmp_path / "policy.md").write_text("be nice")
    t = load_target(tmp_path)
    assert t.tool_names == ["a"] and t.policy == "be nice" and t.meta == {}


def test_schema_hash_ignores_tool_order(tmp_path):
    a = {"type": "function", "function": {"name": "a", "parameters": {}}}
    b = {"type": "function", "function": {"name": "b", "parameters": {}}}
    (tmp_path / "x.json").write_text(json.dumps([a, b]))
    (tmp_path / "y.json").write_text(json.dumps([b, a]))
    assert load_target(tmp_path / "x.json").schema_hash() == load_target(tmp_path / "y.json").schema_hash()


@pytest.mark.parametrize("content, message", [
    ("not json", "not valid JSON"),
    ("[]", "non-empty JSON list"),
    ('[{"name": "x"}]', "not an OpenAI function schema"),
    ('[{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]', "appears twice"),
    ('[{"type": "function", "function": {"name": "a", "parameters": 3}}]', "not a JSON object"),
])
def test_bad_tool_files_say_what_is_wrong(tmp_path, content, message):
    f = tmp_path / "tools.json"
    f.write_text(content)
    with pytest.raises(TargetError, match=message):
        load_target(f)


def test_missing_target_and_empty_folder(tmp_path):
    with pytest.raises(TargetError, match="does not exist"):
        load_target(tmp_path / "nowhere")
    with pytest.raises(TargetError, match="holds neither"):
        load_target(tmp_path)


def test_binary_tool_file(tmp_path):
    f = tmp_path / "tools.json"
    f.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(TargetError, match="not a UTF-8"):
        load_target(f)


@needs_shared
@pytest.mark.parametrize("folder, n", [("tau2/retail", 16), ("tau2/airline", 14), ("tau2/telecom", 13),
                                       ("tau2/mock", 4), ("toolsandbox", 33)])
def test_real_targets(folder, n):
    t = load_target(TARGETS / folder)
    assert len(t.tools) == n
    assert t.meta, "read/write metadata loaded"
    assert t.name == folder


def test_a_policy_that_is_not_utf8_is_a_clear_target_error(tmp_path):
    from envforge.errors import TargetError
    (tmp_path / "tools.json").write_text(json.dumps(
        [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}]))
    (tmp_path / "policy.md").write_bytes(b"\xff\xfe policy")
    with pytest.raises(TargetError, match=r"policy\.md: not a UTF-8 text file; save it as UTF-8"):
        load_target(tmp_path)
