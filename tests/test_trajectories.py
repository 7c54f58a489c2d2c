"""Importers of envforge.trajectories: the real files in ../shared/trajectories, small built
files in each format, and the messages for broken inputs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from envforge.contract import message_problem
from envforge.errors import InputError, UsageError
from envforge.trajectories import Trajectory, detect_format, load_trajectories, write_jsonl

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "trajectories"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (the real "
                                  "trajectory files live beside the checkout, not in the repository)")

TAU2_AIRLINE = "tau2_airline_gpt-4.1-mini_tasks0-4.results.json"
TAU2_MOCK = "tau2_mock_gpt-4.1-mini_10tasks.results.json"
TAU2_TELECOM = "tau2_telecom_gpt-4.1-mini_1task.results.json"
TAU2_RETAIL = "tau2_retail_gpt-4.1-mini_task0.results.json"
V1 = "taubench-v1_gpt-4o_airline_sample12.json"


def _check_messages(trajectories: list[Trajectory]) -> None:
    for t in trajectories:
        for m in t.messages:
            assert message_problem(m) is None, (t.task_id, m)
            for tc in m.get("tool_calls") or []:
                assert isinstance(json.loads(tc["function"]["arguments"]), dict)


# ----------------------------------------------------------------------------- the real files

@needs_shared
@pytest.mark.shared
def test_tau2_airline_real_file():
    ts = load_trajectories(SHARED / TAU2_AIRLINE)
    assert [t.task_id for t in ts] == ["0", "1", "2", "3", "4"]
    assert [t.reward for t in ts] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert [t.success for t in ts] == [True, False, False, False, False]
    assert ts[0].expected_actions == []  # the refusal task expects no action
    assert ts[1].expected_actions[0] == {"name": "get_user_details", "requestor": "assistant",
                                         "arguments": {"user_id": "raj_sanchez_7340"}}
    assert ts[0].metadata["domain"] == "airline" and ts[0].metadata["format"] == "tau2"
    _check_messages(ts)
    # tau2 tool calls (dict arguments, results with `id`) become OpenAI calls and tool messages
    call = next(tc for m in ts[0].messages for tc in m.get("tool_calls") or [])
    assert call["function"] == {"name": "get_reservation_details",
                                "arguments": json.dumps({"reservation_id": "EHGLP3"})}
    result = next(m for m in ts[0].messages if m["role"] == "tool")
    assert result["tool_call_id"] == call["id"] and "EHGLP3" in result["content"]


@needs_shared
@pytest.mark.shared
def test_tau2_mock_real_file_with_unknown_expected_actions():
    ts = load_trajectories(SHARED / TAU2_MOCK)
    assert len(ts) == 10 and sum(t.success for t in ts) == 8
    by_id = {t.task_id: t for t in ts}
    assert by_id["create_task_1_nl_eval"].expected_actions is None  # the task gives no actions
    assert by_id["impossible_task_1"].expected_actions[0]["compare_args"] == []
    # a task that starts with earlier turns: how many of the messages are that pre-filled history
    hist = by_id["update_task_with_message_history"]
    assert hist.metadata["history"] == 4 and hist.messages[3]["role"] == "assistant"
    assert "history" not in by_id["create_task_1"].metadata
    # the policy the agent was given (tau2 keeps it in info.environment_info, not in the messages)
    assert by_id["create_task_1"].metadata["policy"].startswith("# Mock Domain Policy")
    assert [t.metadata["index"] for t in ts] == list(range(10))  # the position in the file
    _check_messages(ts)


@needs_shared
@pytest.mark.shared
def test_tau2_telecom_real_file_leaves_out_the_users_own_tool_calls():
    raw = json.loads((SHARED / TAU2_TELECOM).read_text())
    user_calls = sum(len(m.get("tool_calls") or []) for m in raw["simulations"][0]["messages"]
                     if m["role"] == "user")
    assert user_calls > 0
    (t,) = load_trajectories(SHARED / TAU2_TELECOM)
    _check_messages([t])
    assert all("tool_calls" not in m for m in t.messages if m["role"] == "user")
    ids = {tc["id"] for m in t.messages for tc in m.get("tool_calls") or []}
    assert all(m["tool_call_id"] in ids for m in t.messages if m["role"] == "tool")
    assert [a["requestor"] for a in t.expected_actions] == ["user", "user"]


@needs_shared
@pytest.mark.shared
def test_tau_bench_v1_real_file():
    ts = load_trajectories(SHARED / V1)
    assert len(ts) == 12 and [t.task_id for t in ts if t.success] == ["6", "11"]
    assert ts[0].messages[0]["role"] == "system"
    assert ts[0].expected_actions[0]["name"] == "book_reservation"
    assert ts[0].expected_actions[0]["arguments"]["total_baggages"] == 3
    assert ts[0].metadata == {"source": str(SHARED / V1), "format": "tau-bench", "trial": 0, "index": 0}
    _check_messages(ts)


@needs_shared
@pytest.mark.shared
def test_tau2_directory_form(tmp_path):
    # tau2's "dir" format: results.json (metadata, tasks, simulation_index) + simulations/<id>.json
    raw = json.loads((SHARED / TAU2_AIRLINE).read_text())
    (tmp_path / "simulations").mkdir()
    sims = raw.pop("simulations")
    raw["simulation_index"] = [{"id": s["id"], "task_id": s["task_id"], "trial": s["trial"]} for s in sims]
    (tmp_path / "results.json").write_text(json.dumps(raw))
    for s in sims:
        (tmp_path / "simulations" / f"{s['id']}.json").write_text(json.dumps(s))
    from_dir = load_trajectories(tmp_path)
    from_file = load_trajectories(SHARED / TAU2_AIRLINE)
    assert sorted((t.task_id, t.reward, len(t.messages)) for t in from_dir) == \
        sorted((t.task_id, t.reward, len(t.messages)) for t in from_file)
    (tmp_path / "simulations" / f"{sims[0]['id']}.json").unlink()
    with pytest.raises(InputError, match="missing from simulations/: " + sims[0]["id"]):
        load_trajectories(tmp_path)


@needs_shared
@pytest.mark.shared
def test_a_folder_of_files_and_format_by_name():
    ts = load_trajectories(SHARED)
    assert len(ts) == 5 + 10 + 1 + 1 + 12
    assert len(load_trajectories(SHARED / V1, format="tau-bench")) == 12
    with pytest.raises(InputError, match="expected a tau-bench v1 result list"):
        load_trajectories(SHARED / TAU2_RETAIL, format="tau-bench")


# ----------------------------------------------------------------------------- built files

def _v1_record(task_id, reward, actions=()):
    return {"task_id": task_id, "trial": 0, "reward": reward,
            "info": {"task": {"actions": [{"name": n, "kwargs": k} for n, k in actions]}},
            "traj": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c1", "type": "function",
                          "function": {"name": "get_order", "arguments": '{"order_id": "A"}'}}]},
                     {"role": "tool", "tool_call_id": "c1", "name": "get_order", "content": "{}"},
                     {"role": "assistant", "content": "done"}]}


def test_success_threshold(tmp_path):
    f = tmp_path / "v1.json"
    f.write_text(json.dumps([_v1_record(0, 1.0), _v1_record(1, 0.6), _v1_record(2, 0.0)]))
    assert [t.success for t in load_trajectories(f)] == [True, False, False]
    assert [t.success for t in load_trajectories(f, success_threshold=0.5)] == [True, True, False]


def test_jsonl_round_trip(tmp_path):
    src = tmp_path / "v1.json"
    src.write_text(json.dumps([_v1_record(7, 1.0, [("cancel_order", {"order_id": "A"})])]))
    ts = load_trajectories(src)
    out = tmp_path / "t.jsonl"
    write_jsonl(ts, out)
    back = load_trajectories(out)
    assert [t.to_dict() for t in back] == [
        {**t.to_dict(), "metadata": {**t.metadata, "source": str(out), "format": "jsonl"}} for t in ts]
    assert back[0].expected_actions == [{"name": "cancel_order", "arguments": {"order_id": "A"},
                                         "requestor": "assistant"}]
    # detected by content too, whatever the suffix
    other = tmp_path / "t.txt"
    other.write_text(out.read_text() * 2)
    assert len(load_trajectories(other)) == 2


def test_tau2_built_conversion(tmp_path):
    sim = {"id": "s1", "task_id": 3, "trial": 1, "termination_reason": "user_stop",
           "reward_info": {"reward": 0.0},
           "messages": [
               {"role": "assistant", "content": "Hi", "tool_calls": None},
               {"role": "user", "content": "turning it off", "tool_calls": [
                   {"id": "u1", "name": "toggle_airplane_mode", "arguments": {}, "requestor": "user"}]},
               {"role": "tool", "id": "u1", "content": "OFF", "requestor": "user", "error": False},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "a1", "name": "get_line", "arguments": {"line_id": "L1", "n": 2},
                    "requestor": "assistant"}]},
               {"role": "tool", "id": "a1", "content": "Error: no line", "requestor": "assistant",
                "error": True}]}
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"info": {}, "tasks": [{"id": "3", "evaluation_criteria": {"actions": None}}],
                             "simulations": [sim]}))
    (t,) = load_trajectories(f)
    assert t.task_id == "3" and t.expected_actions is None and t.metadata["trial"] == 1
    assert t.messages == [
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "turning it off"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a1", "type": "function", "function": {
            "name": "get_line", "arguments": '{"line_id": "L1", "n": 2}'}}]},
        {"role": "tool", "tool_call_id": "a1", "content": "Error: no line"}]


def test_detect_format():
    assert detect_format({"info": {}, "tasks": [], "simulations": []}) == "tau2"
    assert detect_format([{"task_id": 0, "reward": 1, "traj": []}]) == "tau-bench"
    assert detect_format({"task_id": "a", "messages": [], "reward": 1}) == "jsonl"
    assert detect_format({"a": 1}) is None and detect_format([]) is None


# ----------------------------------------------------------------------------- broken inputs

def test_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"nope\.json: no such file or directory; expected a "
                                         r"tau2-bench Results file"):
        load_trajectories(tmp_path / "nope.json")


def test_not_json(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("{not json")
    with pytest.raises(InputError, match=r"bad\.json: not valid JSON \(Expecting property name "
                                         r"enclosed in double quotes at line 1, column 2\)"):
        load_trajectories(f)


def test_unknown_format(tmp_path):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"rows": [1, 2]}))
    with pytest.raises(InputError) as e:
        load_trajectories(f)
    assert str(e.value).startswith(f"{f}: unknown trajectory format (top level is an object with "
                                   "keys rows); expected a tau2-bench Results file")


def test_an_empty_run_list_holds_no_trajectories(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("[]")
    assert load_trajectories(f) == []  # not "unknown trajectory format": identify says "no trajectories"


def test_broken_records_name_the_place(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"task_id": "a", "messages": [], "reward": 1}\n{"task_id": "b", "messages": []}\n')
    with pytest.raises(InputError, match=r"t\.jsonl: line 2: missing reward"):
        load_trajectories(f)
    f.write_text('{"task_id": "a", "messages": [], "reward": "high"}\n')
    with pytest.raises(InputError, match=r"line 1: reward must be a number, got 'high'"):
        load_trajectories(f)
    f.write_text('{"task_id": "a", "messages": [{"role": "robot"}], "reward": 1}\n')
    with pytest.raises(InputError, match=r"line 1, message 0: expected an OpenAI message"):
        load_trajectories(f)
    g = tmp_path / "r.json"
    g.write_text(json.dumps({"info": {}, "tasks": [], "simulations": [{"id": 1}]}))
    with pytest.raises(InputError, match=r"r\.json: simulation 0: expected \{id, task_id, messages"):
        load_trajectories(g)


def test_empty_folder_and_binary_file(tmp_path):
    with pytest.raises(InputError, match="a directory with no .json or .jsonl files"):
        load_trajectories(tmp_path)
    f = tmp_path / "b.json"
    f.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match=r"b\.json: not a UTF-8 text file"):
        load_trajectories(f)


def test_unknown_format_name():
    with pytest.raises(UsageError, match="unknown trajectory format 'csv'; choose one of auto, "
                                         "tau2, tau-bench, jsonl"):
        load_trajectories("x", format="csv")
