"""envforge.identify: the statistics on hand-computed cases, the selection rule, K-of-N
stability, each structural rule on small built trajectories, the command line, and a run on
the real files in ../shared/trajectories."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from envforge.cli import main
from envforge.contract import tool_call
from envforge.errors import UsageError
from envforge.identify import (LACKING, NA, PRESENT, STRUCTURAL_RULES, IdentifyConfig,
                               capability_stats, identify, is_retained, label_structural,
                               merge_candidates, Capability, run_statistics, tool_kind, view)
from envforge.trajectories import Trajectory, write_jsonl

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "trajectories"

# ============================================================================= builders

_ids = itertools.count()


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def say(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def call(name: str, args: dict | None = None, result: str = "{}") -> list[dict]:
    cid = f"call_{next(_ids)}"
    return [{"role": "assistant", "content": None, "tool_calls": [tool_call(name, args or {}, cid)]},
            {"role": "tool", "tool_call_id": cid, "content": result}]


def traj(*parts: dict | list[dict], reward: float = 0.0, expected=None, task_id: str = "t") -> Trajectory:
    """A trajectory from messages and message groups; ``expected``: None (unknown) or
    [(name, args[, compare_args]), ...]."""
    exp = None if expected is None else [
        {"name": n, "arguments": a, "requestor": "assistant", **({"compare_args": c[0]} if c else {})}
        for n, a, *c in expected]
    msgs = [m for p in parts for m in ([p] if isinstance(p, dict) else p)]
    return Trajectory(task_id, msgs, reward, reward >= 1.0, exp, {})


def label(t: Trajectory, capability: str) -> str:
    rule = dict((c.name, r) for c, r in STRUCTURAL_RULES)[capability]
    return rule(view(t))


CONFIRM = (say("I will cancel reservation R1. Shall I proceed?"), user("Yes, please go ahead."))

# ============================================================================= statistics


def labelled(success: dict[str, int], failure: dict[str, int]) -> tuple[list[str], list[bool]]:
    labels, ok = [], []
    for group, counts in ((True, success), (False, failure)):
        for lab, n in counts.items():
            labels += [lab] * n
            ok += [group] * n
    return labels, ok


def test_worked_example_from_the_paper():
    # precondition verification: ER+ 0.16, ER- 0.70 -> gap 0.54 (4.4x more errors in failures)
    labels, ok = labelled({LACKING: 4, PRESENT: 21, NA: 5}, {LACKING: 7, PRESENT: 3, NA: 10})
    st = capability_stats(labels, ok)
    assert st["er_plus"] == pytest.approx(0.16)
    assert st["er_minus"] == pytest.approx(0.70)
    assert st["gap"] == pytest.approx(0.54)
    assert st["er_minus"] / st["er_plus"] == pytest.approx(4.375)
    assert st["coverage"] == pytest.approx(7 / 20)
    assert st["counts"] == {"lacking_success": 4, "present_success": 21, "na_success": 5,
                            "lacking_failure": 7, "present_failure": 3, "na_failure": 10}
    assert is_retained(st, 0.20, 0.10)


def test_hand_computed_case_and_the_polite_greeting():
    st = capability_stats([LACKING, PRESENT, NA, NA, LACKING, LACKING, PRESENT, NA, NA],
                          [True] * 4 + [False] * 5)
    assert (st["er_plus"], st["er_minus"]) == (0.5, pytest.approx(2 / 3))
    assert st["gap"] == pytest.approx(1 / 6) and st["coverage"] == pytest.approx(2 / 5)
    assert not is_retained(st, 0.20, 0.10)
    # "greets the customer politely": as often missing in successes as in failures
    greet = capability_stats(*labelled({LACKING: 10, PRESENT: 40}, {LACKING: 30, PRESENT: 120}))
    assert greet["gap"] == pytest.approx(0.0) and greet["coverage"] == pytest.approx(0.2)
    assert not is_retained(greet, 0.20, 0.10)


def test_undefined_rates():
    only_failures = capability_stats(*labelled({NA: 5}, {LACKING: 2, PRESENT: 2}))
    assert only_failures["er_plus"] is None and only_failures["gap"] == 0.5  # no background: 0
    never_judged = capability_stats(*labelled({LACKING: 1}, {NA: 4}))
    assert never_judged["er_minus"] is None and never_judged["gap"] is None
    assert never_judged["coverage"] == 0.0 and not is_retained(never_judged, 0.2, 0.1)
    no_failures = capability_stats([LACKING], [True])
    assert no_failures["coverage"] == 0.0 and no_failures["gap"] is None


@pytest.mark.parametrize("gap_counts,cov_counts,kept", [
    # ER- 0.70 - ER+ 0.50 = 0.2 (0.19999999999999996 in floats): kept at the threshold
    ({LACKING: 5, PRESENT: 5}, {LACKING: 7, PRESENT: 3}, True),
    ({LACKING: 51, PRESENT: 49}, {LACKING: 70, PRESENT: 30}, False),   # gap 0.19
    ({LACKING: 0, PRESENT: 10}, {LACKING: 1, PRESENT: 0, NA: 9}, True),   # coverage exactly 0.10
    ({LACKING: 0, PRESENT: 10}, {LACKING: 9, PRESENT: 0, NA: 91}, False),  # coverage 0.09
])
def test_selection_rule_at_the_thresholds(gap_counts, cov_counts, kept):
    assert is_retained(capability_stats(*labelled(gap_counts, cov_counts)), 0.20, 0.10) is kept


# ============================================================================= K of N

def test_k_defaults_and_checks():
    assert IdentifyConfig().k == 8 and IdentifyConfig().runs == 10   # the paper: 8 of 10
    assert IdentifyConfig(runs=1).k == 1
    assert IdentifyConfig(runs=5).k == 4 and IdentifyConfig(runs=3).k == 3
    assert IdentifyConfig(runs=10, min_runs=5).k == 5
    assert (IdentifyConfig().delta, IdentifyConfig().rho) == (0.20, 0.10)
    with pytest.raises(UsageError, match=r"--min-runs must lie between 1 and --runs \(3\), got 4"):
        IdentifyConfig(runs=3, min_runs=4)
    with pytest.raises(UsageError, match="--rho must lie between 0 and 1, got -0.1"):
        IdentifyConfig(rho=-0.1)
    with pytest.raises(UsageError, match="--labeler must be one of structural, llm, got 'gpt'"):
        IdentifyConfig(labeler="gpt")


def test_k_of_n_stability():
    strong = labelled({LACKING: 2, PRESENT: 38}, {LACKING: 30, PRESENT: 10, NA: 20})
    borderline = labelled({LACKING: 12, PRESENT: 28}, {LACKING: 21, PRESENT: 19})  # gap 0.225
    cfg = IdentifyConfig(runs=10)
    s = run_statistics(*strong, cfg)
    assert s["retained_in"] == 10 and s["n"] == 10 and s["k"] == 8
    assert s["gap_mean"] == pytest.approx(0.70, abs=0.1) and 0 < s["gap_std"] < 0.15
    b = run_statistics(*borderline, cfg)
    assert is_retained(capability_stats(*borderline), 0.2, 0.1)   # kept on the full data ...
    assert 0 < b["retained_in"] < 8                                # ... but not stable
    assert run_statistics(*borderline, cfg) == b                   # same seed, same runs
    assert run_statistics(*borderline, IdentifyConfig(runs=10, min_runs=b["retained_in"]))["k"] == b["retained_in"]
    one = run_statistics(*borderline, IdentifyConfig(runs=1))
    assert one["retained_in"] == 1 and one["gap_std"] == 0.0 and one["gap_mean"] == pytest.approx(0.225)


def test_identify_report_shape_and_k_of_n_decides():
    # 20 successes, 20 failures; "confirmation before write" is missing in 12 failures, 1 success
    def run(ok: bool, confirm: bool, i: int) -> Trajectory:
        parts = [user("cancel R1"), *call("get_reservation_details", {"reservation_id": "R1"})]
        parts += [*CONFIRM] if confirm else [say("Cancelling now.")]
        parts += call("cancel_reservation", {"reservation_id": "R1"})
        return traj(*parts, reward=1.0 if ok else 0.0, task_id=f"{'s' if ok else 'f'}{i}")
    ts = [run(True, i != 0, i) for i in range(20)] + [run(False, i >= 12, i) for i in range(20)]
    report = identify(ts, IdentifyConfig(runs=10))
    assert report["trajectories"] == {"total": 40, "successes": 20, "failures": 20}
    conf = next(c for c in report["capabilities"] if c["name"] == "confirmation before write")
    assert set(conf) == {"name", "description", "er_plus", "er_minus", "gap", "coverage",
                         "retained", "counts", "examples", "example_tasks",
                         "example_trajectories", "runs"}
    assert (conf["er_plus"], conf["er_minus"], conf["gap"], conf["coverage"]) == (0.05, 0.6, 0.55, 0.6)
    assert conf["retained"] and conf["runs"]["retained_in"] >= 8
    assert conf["examples"] == [f"f{i}" for i in range(12)]
    assert conf["example_tasks"] == ["cancel R1"]  # the tasks' first user messages, deduplicated
    assert report["capabilities"][0] is conf  # kept ones first
    # the first two failing trajectories that lacked it, rendered for the LLM synthesizer
    assert [x.splitlines()[0] for x in conf["example_trajectories"]] == ["USER: cancel R1"] * 2
    assert "Cancelling now." in conf["example_trajectories"][0]
    pre = next(c for c in report["capabilities"] if c["name"] == "precondition verification")
    assert pre["gap"] == 0.0 and not pre["retained"] and pre["examples"] == pre["example_tasks"] == []
    json.dumps(report)  # plain JSON


def test_examples_are_the_failures_that_lacked_it_keyed_by_file_and_task_id():
    """Task ids repeat across files (tau2 airline and retail both start at 0): the example
    trajectories are those that failed (under identify's threshold) and lacked the capability."""
    def run(source: str, text: str, reward: float, confirm: bool) -> Trajectory:
        parts = [user(text), *call("get_reservation_details", {"reservation_id": "R1"})]
        parts += [*CONFIRM] if confirm else [say("Cancelling now.")]
        parts += call("cancel_reservation", {"reservation_id": "R1"})
        t = traj(*parts, reward=reward, task_id="0")
        t.metadata["source"] = source
        return t
    ts = [run("d.json", "d passed at 0.5", 0.5, False),  # a success under --success-threshold 0.5
          run("a.json", "a failed otherwise", 0.0, True),
          run("b.json", "b unconfirmed", 0.0, False), run("b.json", "b again", 0.0, False),
          run("c.json", "c unconfirmed", 0.0, False), run("a.json", "a passed", 1.0, True)]
    report = identify(ts, IdentifyConfig(runs=1, success_threshold=0.5))
    conf = next(c for c in report["capabilities"] if c["name"] == "confirmation before write")
    assert conf["examples"] == ["0"] and conf["example_tasks"] == ["b unconfirmed", "c unconfirmed"]
    assert [x.splitlines()[0] for x in conf["example_trajectories"]] == [
        "USER: b unconfirmed", "USER: c unconfirmed"]


# ============================================================================= structural rules

def test_tool_kind_from_metadata_or_names():
    assert [tool_kind(n) for n in ("get_user_details", "find_user_id_by_email", "search_direct_flight",
                                   "calculate", "list_all_airports")] == ["read"] * 5
    assert [tool_kind(n) for n in ("cancel_reservation", "update_task_status", "book_reservation",
                                   "exchange_delivered_order_items", "send_certificate",
                                   "transfer_funds")] == ["write"] * 6
    assert tool_kind("transfer_to_human_agents") == "escalation"
    assert tool_kind("think") == "other"
    meta = {"calculate": {"tool_type": "generic"}, "get_and_reset": {"tool_type": "write"},
            "transfer_to_human_agents": {"tool_type": "generic"}}
    assert tool_kind("calculate", meta) == "other" and tool_kind("get_and_reset", meta) == "write"
    assert tool_kind("transfer_to_human_agents", meta) == "escalation"


def test_capability_names_match_the_synthesizer_families():
    names = [c.name for c, _ in STRUCTURAL_RULES]
    for family in ("precondition verification", "tool-call argument precision",
                   "structured data reasoning", "confirmation before write",
                   "policy adherence / refusal", "error recovery", "escalation judgement"):
        assert family in names
    assert all(rule.__doc__ and len(rule.__doc__) > 200 for _, rule in STRUCTURAL_RULES)


def test_precondition_verification():
    name = "precondition verification"
    cancel = call("cancel_reservation", {"reservation_id": "R1", "reason": "change"})
    read = call("get_reservation_details", {"reservation_id": "R1"}, '{"status": "ok"}')
    assert label(traj(*read, *cancel), name) == PRESENT
    assert label(traj(*cancel), name) == LACKING
    # reading a different entity that only mentions R1 is not reading R1
    profile = call("get_user_details", {"user_id": "u1"}, '{"reservations": ["R1"]}')
    assert label(traj(*profile, *cancel), name) == LACKING
    # a read that failed verified nothing
    failed = call("get_reservation_details", {"reservation_id": "R1"}, "Error: not found")
    assert label(traj(*failed, *cancel), name) == LACKING
    # a listing read (no id arguments) that returned the entity counts
    listing = call("get_users", {}, '[{"user_id": "user_1"}]')
    create = call("create_task", {"user_id": "user_1", "title": "x"}, '{"task_id": "task_2"}')
    assert label(traj(*listing, *create), name) == PRESENT
    # an entity the agent's own write returned counts as seen
    update = call("update_task_status", {"task_id": "task_2", "status": "done"})
    assert label(traj(*listing, *create, *update), name) == PRESENT
    assert label(traj(*read), name) == NA                                    # no write
    assert label(traj(*call("send_note", {"text": "hi"})), name) == NA      # write without an id


def test_argument_precision_and_structured_data_reasoning():
    prec, data = "tool-call argument precision", "structured data reasoning"
    exp = [("modify_items", {"order_id": "A", "item_ids": ["i1", "i2"],
                             "payment": [{"id": "gc_1", "amount": 250}]})]
    def agent(**over):
        args = {"order_id": "A", "item_ids": ["i2", "i1"], "payment": [{"id": "gc_1", "amount": 250.0}]}
        return traj(*call("modify_items", {**args, **over}), expected=exp)
    t = agent()  # same items in another order, 250.0 == 250
    assert (label(t, prec), label(t, data)) == (PRESENT, PRESENT)
    t = agent(order_id="B")
    assert (label(t, prec), label(t, data)) == (LACKING, PRESENT)
    t = agent(payment=[{"id": "gc_1", "amount": 255}])
    assert (label(t, prec), label(t, data)) == (PRESENT, LACKING)
    # a number missing, or given as a string, is imprecision, not arithmetic
    t = agent(payment=[{"id": "gc_1"}])
    assert (label(t, prec), label(t, data)) == (LACKING, PRESENT)
    t = agent(payment=[{"id": "gc_1", "amount": "250"}])
    assert (label(t, prec), label(t, data)) == (LACKING, PRESENT)
    t = traj(*call("update_baggages", {}), expected=[("update_baggages", {"total_baggages": 2})])
    assert (label(t, prec), label(t, data)) == (LACKING, PRESENT)
    t = agent(item_ids=["i1"])  # a list of another length
    assert label(t, prec) == LACKING
    # the closest of several calls is judged: a failed attempt then the right one
    t = traj(*call("modify_items", {"order_id": "A", "item_ids": [], "payment": []}, "Error: x"),
             *call("modify_items", {"order_id": "A", "item_ids": ["i1", "i2"],
                                    "payment": [{"id": "gc_1", "amount": 250}]}), expected=exp)
    assert (label(t, prec), label(t, data)) == (PRESENT, PRESENT)
    # only the arguments the task compares
    t = traj(*call("cancel_order", {"order_id": "A", "reason": "other"}),
             expected=[("cancel_order", {"order_id": "A", "reason": "no longer needed"}, ["order_id"])])
    assert label(t, prec) == PRESENT and label(t, data) == NA  # no numeric argument
    assert label(traj(*call("get_order", {"order_id": "A"}), expected=exp), prec) == NA  # never made
    assert label(traj(*call("modify_items", {"order_id": "A"})), prec) == NA           # unknown


def test_confirmation_before_write():
    name = "confirmation before write"
    cancel = call("cancel_reservation", {"reservation_id": "R1"})
    read = call("get_reservation_details", {"reservation_id": "R1"})
    assert label(traj(user("cancel R1"), *read, *CONFIRM, *cancel), name) == PRESENT
    assert label(traj(*CONFIRM, *read, *cancel), name) == PRESENT        # reads between are fine
    assert label(traj(user("Yes, cancel R1"), *cancel), name) == LACKING  # nobody asked
    assert label(traj(say("Shall I proceed?"), user("No, don't."), *cancel), name) == LACKING
    assert label(traj(say("Cancelled."), user("ok"), *cancel), name) == LACKING  # not a question
    assert label(traj(user("cancel R1"), *read), name) == NA


def test_policy_adherence():
    name = "policy adherence / refusal"
    cancel = call("cancel_reservation", {"reservation_id": "R1"})
    assert label(traj(*cancel, expected=[]), name) == LACKING                   # should have refused
    assert label(traj(say("I cannot cancel that."), expected=[]), name) == PRESENT
    assert label(traj(*cancel, expected=[("cancel_reservation", {})]), name) == PRESENT
    assert label(traj(*cancel, *call("book_reservation", {"user_id": "u"}),
                      expected=[("cancel_reservation", {})]), name) == LACKING  # an extra booking
    assert label(traj(*cancel, *cancel, expected=[("cancel_reservation", {})]), name) == LACKING
    refused = call("cancel_reservation", {"reservation_id": "R1"}, "Error: not allowed")
    assert label(traj(*refused, expected=[]), name) == PRESENT                   # changed nothing
    assert label(traj(*cancel), name) == NA                                      # unknown
    assert label(traj(say("bye"), expected=[("cancel_reservation", {})]), name) == NA


def test_action_completion():
    name = "action completion"
    cancel = call("cancel_reservation", {"reservation_id": "R1"})
    exp = [("get_reservation_details", {}), ("cancel_reservation", {})]
    assert label(traj(*cancel, expected=exp), name) == PRESENT
    assert label(traj(say("done"), expected=exp), name) == LACKING
    failed = call("cancel_reservation", {"reservation_id": "R1"}, "Error: payment")
    assert label(traj(*failed, expected=exp), name) == LACKING
    assert label(traj(*cancel, expected=[("get_reservation_details", {})]), name) == NA
    assert label(traj(*cancel), name) == NA


def test_error_recovery():
    name = "error recovery"
    bad = call("book_reservation", {"user_id": "u"}, "Error: payment amount does not add up")
    good = call("book_reservation", {"user_id": "u"}, '{"reservation_id": "R9"}')
    assert label(traj(*bad, *good), name) == PRESENT
    assert label(traj(*good, *bad), name) == LACKING
    assert label(traj(*bad, say("Sorry, that failed.")), name) == LACKING
    assert label(traj(*good), name) == NA


def test_escalation_judgement():
    name = "escalation judgement"
    transfer = call("transfer_to_human_agents", {"summary": "x"}, "Transfer successful")
    wanted = [("transfer_to_human_agents", {"summary": "y"})]
    assert label(traj(*transfer, expected=[]), name) == LACKING        # not called for
    assert label(traj(*transfer, expected=wanted), name) == PRESENT
    assert label(traj(say("done"), expected=wanted), name) == LACKING  # called for, not made
    assert label(traj(say("done"), expected=[]), name) == NA
    assert label(traj(*transfer), name) == NA                           # unknown


def test_label_structural_covers_every_pair():
    ts = [traj(*call("cancel_reservation", {"reservation_id": "R1"}), expected=[]), traj(say("hi"))]
    caps, labels = label_structural(ts)
    assert [c.name for c in caps] == [c.name for c, _ in STRUCTURAL_RULES]
    assert all(set(lab) == {c.name for c in caps} for lab in labels)
    assert labels[1] == {c.name: NA for c in caps}


def test_merge_candidates():
    batches = [[Capability("Precondition verification", "a"), Capability("argument precision", "b")],
               [Capability("verifying preconditions", "c"), Capability("politeness", "d")],
               [Capability("precondition checks before writes", "e")]]
    merged = merge_candidates(batches, limit=2)
    assert [c.name for c in merged] == ["Precondition verification", "argument precision"]


# ============================================================================= the command line

def _write_run(tmp_path: Path) -> Path:
    ts = []
    for i in range(6):
        ok = i < 3
        parts = [user("cancel R1"), *call("get_reservation_details", {"reservation_id": "R1"})]
        parts += [*CONFIRM] if ok else [say("Cancelling now.")]
        parts += call("cancel_reservation", {"reservation_id": "R1"})
        ts.append(traj(*parts, reward=1.0 if ok else 0.0, task_id=f"task{i}", expected=[]))
    path = tmp_path / "runs.jsonl"
    write_jsonl(ts, path)
    return path


def test_cli_writes_json_table_and_plot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = _write_run(tmp_path)
    r = CliRunner().invoke(main, ["identify", str(src), "--runs", "1"])
    assert r.exit_code == 0, r.output
    assert "confirmation before write" in r.output and "wrote capabilities.json" in r.output
    report = json.loads((tmp_path / "capabilities.json").read_text())
    conf = next(c for c in report["capabilities"] if c["name"] == "confirmation before write")
    assert (conf["er_plus"], conf["er_minus"], conf["gap"], conf["coverage"]) == (0.0, 1.0, 1.0, 1.0)
    assert conf["retained"] and conf["examples"] == ["task3", "task4", "task5"]
    assert (tmp_path / "capabilities.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = CliRunner().invoke(main, ["identify", str(src), "--runs", "1", "--json", "--no-plot",
                                  "--out", str(tmp_path / "c2.json")])
    assert r.exit_code == 0 and json.loads(r.output)["capabilities"] == report["capabilities"]


def test_cli_target_metadata_changes_what_is_a_write(tmp_path):
    src = _write_run(tmp_path)
    (tmp_path / "tgt").mkdir()
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("get_reservation_details", "cancel_reservation")]
    (tmp_path / "tgt" / "tools.json").write_text(json.dumps(tools))
    (tmp_path / "tgt" / "tools.meta.json").write_text(json.dumps(
        [{"name": "cancel_reservation", "tool_type": "read"}]))
    r = CliRunner().invoke(main, ["identify", str(src), "--runs", "1", "--json", "--no-plot",
                                  "--target", str(tmp_path / "tgt"), "--out", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    conf = next(c for c in json.loads(r.output)["capabilities"] if c["name"] == "confirmation before write")
    assert conf["counts"]["na_success"] == 3 and conf["counts"]["na_failure"] == 3  # no writes left


def test_cli_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    r = CliRunner().invoke(main, ["identify", str(bad)])
    assert r.exit_code == 2 and r.output.startswith(f"error: {bad}: not valid JSON")
    assert "Traceback" not in r.output
    r = CliRunner().invoke(main, ["identify", str(tmp_path / "none.json")])
    assert r.exit_code == 2 and "none.json: no such file or directory" in r.output
    src = _write_run(tmp_path)
    r = CliRunner().invoke(main, ["identify", str(src), "--runs", "0"])
    assert r.exit_code == 2 and "error: --runs must be at least 1, got 0" in r.output
    r = CliRunner().invoke(main, ["identify", str(src), "--labeler", "llm"])
    assert r.exit_code == 2 and "--labeler llm needs --model" in r.output
    r = CliRunner().invoke(main, ["identify", str(src), "--labeler", "llm", "--model", "m"],
                           env={"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""})
    assert r.exit_code == 2 and "error: no LLM endpoint configured: set OPENAI_API_KEY" in r.output


# ============================================================================= the real files

@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (real trajectories live "
                    "beside the checkout, not in the repository)")
@pytest.mark.shared
def test_real_trajectories():
    from envforge.trajectories import load_trajectories
    ts = load_trajectories(SHARED)
    report = identify(ts, IdentifyConfig(runs=1))
    assert report["trajectories"] == {"total": 29, "successes": 13, "failures": 16}
    caps, labels = label_structural(ts)
    by = {(t.metadata["source"].split("/")[-1][:10], t.task_id): lab for t, lab in zip(ts, labels)}
    # tau-bench v1 task 0: the booking's payment amounts did not add up (a numeric mistake)
    assert by[("taubench-v", "0")]["structured data reasoning"] == LACKING
    # v1 task 1: the expected cancellation was never made
    assert by[("taubench-v", "1")]["action completion"] == LACKING
    # tau2 airline task 1: a cancellation the task did not call for
    assert by[("tau2_airli", "1")]["policy adherence / refusal"] == LACKING
    # tau2 airline task 0: a transfer where the task wanted a refusal (yet it passed)
    assert by[("tau2_airli", "0")]["escalation judgement"] == LACKING
    # task 4 failed lacking escalation judgement in two files: both are examples
    esc = next(c for c in report["capabilities"] if c["name"] == "escalation judgement")
    assert esc["examples"] == ["4"] and len(esc["example_trajectories"]) == 2
    assert len(set(esc["example_trajectories"])) == 2


def test_cli_without_matplotlib_warns_and_writes_into_new_folders(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    src = _write_run(tmp_path)
    out = tmp_path / "new" / "dir" / "caps.json"
    r = CliRunner().invoke(main, ["identify", str(src), "--runs", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "warning: matplotlib is not installed; no plot drawn (pip install matplotlib)" in r.output
    assert out.is_file() and not out.with_suffix(".png").exists()


def test_task_text_is_the_first_user_message_cut_short():
    from envforge.identify import task_text
    t = traj(user("  Cancel\n reservation   R1 "), say("ok"), user("and R2"))
    assert task_text(t) == "Cancel reservation R1"
    long = task_text(traj(user("x " * 400)))
    assert len(long) == 300 and long.endswith("...")
    assert task_text(traj(say("hello"))) == ""
