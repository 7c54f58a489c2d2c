"""envforge.identify: the statistics on hand-computed cases, the selection rule, K-of-N
stability, the one-sided warning, each structural rule (and its evidence) on small built
trajectories, the command line (--labels-out), the plot, and a run on the real files in
../shared/trajectories. The gold set: tests/test_identify_gold.py."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from envforge.cli import main
from envforge.contract import tool_call
from envforge.errors import UsageError
from envforge.identify import (LACKING, NA, PRESENT, STRUCTURAL_RULES, Capability, Identification,
                               IdentifyConfig, capability_stats, identify, is_retained,
                               label_structural, merge_candidates, run_statistics, view)
from envforge.identify.rules import write_pairs
from envforge.tools import tool_kind
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


def verdict(t: Trajectory, capability: str, policy: str | None = None):
    rule = next(r for r in STRUCTURAL_RULES if r.capability.name == capability)
    return rule.judge(view(t, policy=policy))


def label(t: Trajectory, capability: str, policy: str | None = None) -> str:
    return verdict(t, capability, policy).label


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
    with pytest.raises(UsageError, match=r"IdentifyConfig.min_runs must be from 1 to runs \(3\), got 4"):
        IdentifyConfig(runs=3, min_runs=4)
    with pytest.raises(UsageError, match="IdentifyConfig.rho must be from 0 to 1, got -0.1"):
        IdentifyConfig(rho=-0.1)
    with pytest.raises(UsageError, match="IdentifyConfig.min_group must be at least 0, got -1"):
        IdentifyConfig(min_group=-1)
    with pytest.raises(UsageError, match="labeller must be one of structural, llm, hybrid, got 'gpt'"):
        IdentifyConfig(labeller="gpt")
    # each setting carries its help and bounds (the command line's options are made from them)
    from dataclasses import fields
    meta = {f.name: f.metadata for f in fields(IdentifyConfig)}
    assert meta["delta"]["help"].startswith("Minimum gap") and (meta["delta"]["low"], meta["delta"]["high"]) == (0, 1)
    assert meta["labeller"]["choices"] == ("structural", "llm", "hybrid")


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
    result = identify(ts, IdentifyConfig(runs=10))
    assert isinstance(result, Identification) and result.warnings == []
    report = result.to_dict()
    assert report["trajectories"] == {"total": 40, "successes": 20, "failures": 20}
    conf = next(c for c in report["capabilities"] if c["name"] == "confirmation before write")
    assert set(conf) == {"name", "description", "er_plus", "er_minus", "gap", "coverage",
                         "retained", "counts", "examples", "example_tasks",
                         "example_trajectories", "runs", "reads_expected", "er_plus_by_construction"}
    assert not conf["reads_expected"] and not conf["er_plus_by_construction"]
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
    report = identify(ts, IdentifyConfig(runs=1, success_threshold=0.5, min_group=1)).to_dict()
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
    names = [r.capability.name for r in STRUCTURAL_RULES]
    for family in ("precondition verification", "tool-call argument precision",
                   "structured data reasoning", "confirmation before write",
                   "policy adherence / refusal", "error recovery", "escalation judgement"):
        assert family in names
    assert all(r.judge.__doc__ and len(r.judge.__doc__) > 200 for r in STRUCTURAL_RULES)
    # the rules that decide from the expected actions say so (their ER+ is 0 by construction)
    assert {r.capability.name for r in STRUCTURAL_RULES if r.reads_expected} == {
        "policy adherence / refusal", "action completion", "escalation judgement"}


def test_precondition_verification_needs_a_read_of_the_entity():
    name = "precondition verification"
    cancel = call("cancel_reservation", {"reservation_id": "R1", "reason": "change"})
    read = call("get_reservation_details", {"reservation_id": "R1"}, '{"reservation_id": "R1", "status": "ok"}')
    v = verdict(traj(*read, *cancel), name)
    assert v.label == PRESENT and v.turn == 1 and "read R1 (turn 1) before cancel_reservation" in v.why
    v = verdict(traj(user("cancel R1"), *cancel), name)
    assert (v.label, v.turn) == (LACKING, 1) and "no earlier read" in v.why
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


def test_precondition_verification_checks_what_the_read_showed():
    name = "precondition verification"
    order = lambda status, owner="u1": call(  # noqa: E731
        "get_order_details", {"order_id": "#W1"},
        json.dumps({"order_id": "#W1", "user_id": owner, "status": status}))
    me = call("get_user_details", {"user_id": "u1"}, '{"user_id": "u1"}')
    cancel = call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})
    assert label(traj(*me, *order("pending"), *cancel), name) == PRESENT
    v = verdict(traj(*me, *order("processed"), *cancel), name)         # the name says pending
    assert v.label == LACKING and "showed status 'processed'" in v.why
    v = verdict(traj(*me, *order("cancelled"), *call("update_order", {"order_id": "#W1"})), name)
    assert v.label == LACKING and "'cancelled'" in v.why              # acting on a closed one
    v = verdict(traj(*me, *order("pending", owner="u2"), *cancel), name)
    assert v.label == LACKING and "owned by 'u2'" in v.why
    # the policy's 24-hour window, from the current time it states and the record's created_at
    policy = "The current time is 2024-05-15 15:00:00 EST. Cancel if the booking was made within the last 24 hrs."
    res = lambda created, cabin="economy": call(  # noqa: E731
        "get_reservation_details", {"reservation_id": "R1"},
        json.dumps({"reservation_id": "R1", "created_at": created, "cabin": cabin, "insurance": "no"}))
    cancel_r = call("cancel_reservation", {"reservation_id": "R1"})
    v = verdict(traj(*res("2024-05-13T09:00:00"), *cancel_r), name, policy)
    assert v.label == LACKING and "outside the policy's window" in v.why
    assert label(traj(*res("2024-05-15T01:00:00"), *cancel_r), name, policy) == PRESENT
    assert label(traj(*res("2024-05-13T09:00:00", "business"), *cancel_r), name, policy) == PRESENT
    assert label(traj(*res("2024-05-13T09:00:00"), *cancel_r), name) == PRESENT  # no policy known
    # a policy rule "<value> <things> cannot be <done>" that the record shows applies
    basic = "- Basic economy flights cannot be modified.\n- Cabin cannot be changed if flown."
    be = call("get_reservation_details", {"reservation_id": "R1"},
              json.dumps({"reservation_id": "R1", "cabin": "basic_economy", "flights": []}))
    move = call("update_reservation_flights", {"reservation_id": "R1", "cabin": "basic_economy",
                                               "flights": [{"flight_number": "HAT1"}]})
    v = verdict(traj(*be, *move), name, basic)
    assert v.label == LACKING and "basic economy flights cannot be modified" in v.why and "cabin='basic_economy'" in v.why
    upgrade = call("update_reservation_flights", {"reservation_id": "R1", "cabin": "business", "flights": []})
    assert label(traj(*be, *upgrade), name, basic) == PRESENT    # changes the cabin itself
    people = call("update_reservation_passengers", {"reservation_id": "R1", "passengers": []})
    assert label(traj(*be, *people), name, basic) == PRESENT     # not about the flights
    searched = call("search_direct_flight", {"origin": "JFK"}, '[{"flight_number": "HAT1"}]')
    assert label(traj(*be, *searched, *move), name) == PRESENT   # no policy given
    # the tool refusing the write for the entity's state
    refused = call("cancel_reservation", {"reservation_id": "R1"}, "Error: reservation is already cancelled")
    assert label(traj(*res("2024-05-15T01:00:00"), *refused), name, policy) == LACKING
    # read the record, then declined the change it forbade: PRESENT without a write
    v = verdict(traj(*res("2024-05-13T09:00:00"), say("I'm sorry, this reservation is not eligible "
                                                       "for cancellation.")), name, policy)
    assert v.label == PRESENT and v.turn == 2


def test_precondition_verification_wants_a_new_booking_s_parts_searched():
    """What a write puts inside its entity (flights of a booking, items of an exchange) must
    have been shown by a read of its own: the flights of an old reservation are no search."""
    name = "precondition verification"
    me = call("get_user_details", {"user_id": "u1"}, '{"user_id": "u1"}')
    book = call("book_reservation", {"user_id": "u1", "flights": [{"flight_number": "HAT1", "date": "2024-05-20"}],
                                     "payment_methods": [{"payment_id": "gift_card_1", "amount": 10}]})
    search = call("search_direct_flight", {"origin": "JFK"}, '[{"flight_number": "HAT1", "status": "available"}]')
    old = call("get_reservation_details", {"reservation_id": "OLD"},
               '{"reservation_id": "OLD", "flights": [{"flight_number": "HAT1", "price": 100}]}')
    assert label(traj(*me, *search, *book), name) == PRESENT
    v = verdict(traj(*me, *old, *book), name)
    assert v.label == LACKING and "flights[0].flight_number=HAT1 was never shown by a read of its own" in v.why
    assert label(traj(user("book HAT1 please"), *me, *book), name) == LACKING   # the user's word only
    # an exchange: the items from the order itself, the new ones from the product listing
    order = call("get_order_details", {"order_id": "#W1"},
                 '{"order_id": "#W1", "user_id": "u1", "status": "delivered", "items": [{"item_id": "111"}]}')
    product = call("get_product_details", {"product_id": "P"}, '{"variants": {"222": {"available": true}}}')
    exchange = call("exchange_delivered_order_items", {"order_id": "#W1", "item_ids": ["111"],
                                                       "new_item_ids": ["222"], "payment_method_id": "gc"})
    assert label(traj(*me, *order, *product, *exchange), name) == PRESENT
    assert label(traj(*me, *order, *exchange), name) == LACKING                 # 222 never listed


def test_pre_filled_history_is_context_not_conduct():
    """tau2 tasks can start with earlier turns: their calls are not the agent's, but what
    their results showed was known."""
    history = [*user("create a task"), *call("create_task", {"user_id": "u1", "title": "x"},
                                             '{"task_id": "task_2", "status": "pending"}')]
    t = traj(*history, *user("mark task_2 done"), say("Shall I mark task_2 as completed?"),
             user("yes"), *call("update_task_status", {"task_id": "task_2", "status": "completed"}))
    t.metadata["history"] = 3
    assert [c.name for c in view(t).calls] == ["update_task_status"]
    assert label(t, "precondition verification") == PRESENT   # task_2 known from the history
    assert label(t, "confirmation before write") == PRESENT    # the history's write is not judged
    t.metadata["history"] = 0
    assert label(t, "confirmation before write") == LACKING    # ... it would be the agent's


def test_writes_are_paired_by_entity_not_in_order():
    """A correct cancel X must not be paired with the expected cancel Y because it came first."""
    exp = [("cancel_reservation", {"reservation_id": "Y"}), ("cancel_reservation", {"reservation_id": "X"})]
    t = traj(*call("cancel_reservation", {"reservation_id": "X"}),
             *call("cancel_reservation", {"reservation_id": "Y"}), expected=exp)
    pairs = [(e["arguments"]["reservation_id"], c.arguments["reservation_id"]) for e, c in write_pairs(view(t))]
    assert sorted(pairs) == [("X", "X"), ("Y", "Y")]
    assert label(t, "policy adherence / refusal") == PRESENT
    assert label(t, "action completion") == PRESENT
    # one made, on the wrong entity: paired all the same (the only call of that tool), not a slip
    t = traj(*user("cancel X please"), *call("get_reservation_details", {"reservation_id": "X"}),
             *call("cancel_reservation", {"reservation_id": "X"}),
             expected=[("cancel_reservation", {"reservation_id": "Y"})])
    assert label(t, "tool-call argument precision") == PRESENT


def test_argument_precision_is_transcription_slips_only():
    name = "tool-call argument precision"
    given = user("My user id is mia_li_3668 and I want to pay with credit_card_4421486.")
    book = lambda **over: call("book_reservation", {  # noqa: E731
        "user_id": "mia_li_3668", "payment_id": "credit_card_4421486", "cabin": "economy", **over})
    assert label(traj(given, *book()), name) == PRESENT
    v = verdict(traj(given, *book(user_id="mia_li_3669")), name)       # one digit off
    assert v.label == LACKING and v.turn == 1 and "a slip of mia_li_3668" in v.why
    assert label(traj(given, *book(payment_id="credit_card_4421468")), name) == LACKING
    # a value that appeared (another option the tools listed) is a decision, not a slip
    listed = call("get_user_details", {"user_id": "mia_li_3668"},
                  '{"payment_methods": ["credit_card_4421486", "gift_card_7777777"]}')
    assert label(traj(given, *listed, *book(payment_id="gift_card_7777777")), name) == PRESENT
    # with the expected write known: right tool, right entity, a value seen nowhere vs one seen
    exp = [("update_reservation_passengers", {"reservation_id": "R1",
                                              "passengers": [{"first_name": "Noah", "dob": "1990-04-05"}]})]
    said = user("Change the passenger on R1 to Noah, born 1990-04-05.")
    upd = lambda name_: call("update_reservation_passengers", {  # noqa: E731
        "reservation_id": "R1", "passengers": [{"first_name": name_, "dob": "1990-04-05"}]})
    assert label(traj(said, *upd("Noah"), expected=exp), name) == PRESENT
    assert label(traj(said, *upd("Noha"), expected=exp), name) == LACKING
    # dates as the user says them match the ISO date written
    trip = call("search_direct_flight", {"date": "2024-05-20"})
    assert label(traj(user("I fly on May 20th, id mia_li_3668"),
                      *call("book_reservation", {"user_id": "mia_li_3668", "date": "2024-05-20"})),
                 name) == PRESENT
    # an option written with "_" where the user said "-" (the schema's enum) is no slip
    assert label(traj(user("one-way, id mia_li_3668"),
                      *call("book_reservation", {"user_id": "mia_li_3668", "flight_type": "one_way"})),
                 name) == PRESENT
    # free text (a title, a reason) is the agent's own wording, never a slip
    assert label(traj(user("a task for the meetings, user_1"),
                      *call("create_task", {"user_id": "user_1", "title": "Meeting"})), name) == PRESENT
    assert label(traj(*trip), name) == NA                                # no write
    # numbers are computed, not transcribed
    assert label(traj(given, *book(amount=999)), name) == PRESENT


def test_structured_data_reasoning():
    name = "structured data reasoning"
    bad = call("book_reservation", {"user_id": "u", "payment": [{"id": "c1", "amount": 255}]},
               "Error: payment amount does not add up, total price is 305, but paid 255")
    good = call("book_reservation", {"user_id": "u", "payment": [{"id": "c1", "amount": 305}]},
                '{"reservation_id": "R9"}')
    v = verdict(traj(*bad, *good), name)
    assert v.label == LACKING and v.turn == 1 and "does not add up" in v.why
    assert label(traj(*good), name) == PRESENT
    # the same decision (tool, entity, every other argument) with another number
    exp = [("modify_items", {"order_id": "A", "item_ids": ["i1", "i2"], "payment": [{"id": "gc_1", "amount": 250}]})]
    same = lambda amount, items=("i2", "i1"): traj(*call("modify_items", {  # noqa: E731
        "order_id": "A", "item_ids": list(items), "payment": [{"id": "gc_1", "amount": amount}]}), expected=exp)
    assert label(same(250.0), name) == PRESENT                    # 250.0 == 250, items in any order
    assert label(same(255), name) == LACKING
    assert label(same(255, ("i1", "i3")), name) == PRESENT        # another decision: not arithmetic
    assert label(traj(*call("cancel_order", {"order_id": "A"})), name) == NA


def test_confirmation_before_write():
    name = "confirmation before write"
    cancel = call("cancel_reservation", {"reservation_id": "R1"})
    read = call("get_reservation_details", {"reservation_id": "R1"})
    assert label(traj(user("cancel R1"), *read, *CONFIRM, *cancel), name) == PRESENT
    assert label(traj(*CONFIRM, *read, *cancel), name) == PRESENT        # reads between are fine
    v = verdict(traj(user("Yes, cancel R1"), *cancel), name)            # nobody asked
    assert (v.label, v.turn) == (LACKING, 1)
    assert label(traj(say("Shall I proceed?"), user("No, don't."), *cancel), name) == LACKING
    assert label(traj(say("Cancelled."), user("ok"), *cancel), name) == LACKING  # not a question
    assert label(traj(user("cancel R1"), *read), name) == NA
    # a refused call made again with other details, with no new yes: the yes was for the first
    pay = lambda card, result="{}": call("cancel_reservation", {"reservation_id": "R1", "refund_to": card}, result)  # noqa: E731
    v = verdict(traj(*CONFIRM, *pay("gc_1", "Error: balance is not enough"), *pay("cc_2")), name)
    assert v.label == LACKING and "retried with other refund_to" in v.why
    assert label(traj(*CONFIRM, *pay("gc_1", "Error: balance is not enough"), *CONFIRM, *pay("cc_2")),
                 name) == PRESENT
    # one yes to a listing of two changes covers both (other entities, no retry)
    two = (call("cancel_reservation", {"reservation_id": "R1"}), call("cancel_reservation", {"reservation_id": "R2"}))
    assert label(traj(*CONFIRM, *two[0], *two[1]), name) == PRESENT
    # a policy that never asks for confirmation: not exercised
    assert label(traj(user("Yes, cancel R1"), *cancel), name, "1. Each task must have a title") == NA
    assert label(traj(user("Yes, cancel R1"), *cancel), name, "obtain explicit user confirmation") == LACKING
    own = traj(user("Yes, cancel R1"), *cancel)                         # the file's own policy
    own.metadata["policy"] = "1. Each task must have a title"
    assert label(own, name) == NA
    # a policy that asks to confirm the price (telecom): paid changes only
    telecom = "To refuel data you should: ask how much data they want; Confirm the price; apply it."
    roaming = call("enable_roaming", {"customer_id": "C1", "line_id": "L1"})
    refuel = call("refuel_data", {"customer_id": "C1", "line_id": "L1", "gb_amount": 2})
    assert label(traj(user("turn roaming on"), *roaming), name, telecom) == NA
    assert label(traj(user("2 GB please"), *roaming, *refuel), name, telecom) == LACKING
    assert label(traj(say("2 GB costs $10. Shall I add it?"), user("Yes"), *refuel), name, telecom) == PRESENT
    # the user waived it, where the policy lets them: no yes is owed (and a user who asks to be
    # asked, or who says "no need to" about something else, has not waived it)
    waivable = "Before a change, confirm it with the user, unless they said there is no need to confirm."
    assert label(traj(user("Cancel R1 right away, no need to confirm."), *cancel), name, waivable) == NA
    assert label(traj(user("Cancel R1. Don't ask me anything, I'm late."), *read, *cancel), name, waivable) == NA
    assert label(traj(user("Cancel R1; you don\u2019t need to confirm it with me."), *cancel), name, waivable) == NA
    for not_waived in ("Don't cancel anything without asking me first.", "Do not confirm the booking yet.",
                       "Cancel R1. No need to ask about bags.", "Cancel R1, no need to confirm my email."):
        assert label(traj(user(not_waived), *cancel), name, waivable) == LACKING, not_waived
    assert label(traj(user("cancel R1"), *cancel, user("no need to confirm"), *two[1]), name, waivable) == LACKING
    # a policy that asks for an explicit yes takes no waiver
    assert label(traj(user("Cancel R1 right away, no need to confirm."), *cancel), name,
                 "obtain explicit user confirmation (yes) before any action") == LACKING


def test_policy_adherence():
    name = "policy adherence / refusal"
    read = call("get_reservation_details", {"reservation_id": "R1"}, '{"reservation_id": "R1"}')
    cancel = call("cancel_reservation", {"reservation_id": "R1"})
    v = verdict(traj(*read, *cancel, expected=[]), name)              # should have refused
    assert v.label == LACKING and v.turn == 2 and "did not call for" in v.why
    assert label(traj(say("I cannot cancel that."), expected=[]), name) == PRESENT
    assert label(traj(*read, *cancel, expected=[("cancel_reservation", {"reservation_id": "R1"})]), name) == PRESENT
    me = call("get_user_details", {"user_id": "u"}, '{"user_id": "u"}')
    assert label(traj(*me, *read, *cancel, *call("book_reservation", {"user_id": "u"}),
                      expected=[("cancel_reservation", {"reservation_id": "R1"})]), name) == LACKING
    assert label(traj(*read, *cancel, *cancel, expected=[("cancel_reservation", {})]), name) == LACKING
    refused = call("cancel_reservation", {"reservation_id": "R1"}, "Error: not allowed")
    assert label(traj(*refused, expected=[]), name) == PRESENT                   # changed nothing
    assert label(traj(*cancel), name) == NA                                      # unknown
    assert label(traj(say("bye"), expected=[("cancel_reservation", {})]), name) == NA
    # one root cause: a write the entity's state forbade is precondition verification's
    assert label(traj(*cancel, expected=[]), name) == PRESENT
    # the expected change, on the expected record, with another choice the conversation offered
    flights = call("search_direct_flight", {"origin": "JFK"}, '[{"destination": "PHL"}, {"destination": "EWR"}]')
    upd = lambda dest: call("update_reservation", {"reservation_id": "R1", "destination": dest})  # noqa: E731
    exp = [("update_reservation", {"reservation_id": "R1", "destination": "PHL"})]
    v = verdict(traj(*read, *flights, *upd("EWR"), expected=exp), name)
    assert v.label == LACKING and "chose destination=EWR where the task called for PHL" in v.why
    assert label(traj(*read, *flights, *upd("PHL"), expected=exp), name) == PRESENT
    # ... but not for a slip (a value seen nowhere: argument precision) or an amount
    assert label(traj(*read, *flights, *upd("PHX"), expected=exp), name) == PRESENT
    amount = lambda x: call("update_reservation", {"reservation_id": "R1", "amount": x})  # noqa: E731
    assert label(traj(*read, *amount(5), expected=[("update_reservation", {"reservation_id": "R1",
                                                                           "amount": 7})]), name) == PRESENT
    # the user's own request, made without the yes the policy asks for, where the task called for
    # another change or none: asking would have told (a no, another value), or the policy forbids
    # it; the rules cannot tell which, so this rule abstains (confirmation before write's to judge)
    ticket = call("get_ticket_details", {"ticket_id": "T-1"}, '{"ticket_id": "T-1", "status": "active"}')
    close = call("close_ticket", {"ticket_id": "T-1", "resolution": "fixed"})
    asked_for = user("Please close ticket T-1. Details: resolution: fixed.")
    v = verdict(traj(asked_for, *ticket, *close, expected=[]), name)
    assert v.label == NA and "confirmation" in v.why
    assert label(traj(asked_for, *ticket, *close, expected=[]), "confirmation before write") == LACKING
    other = [("close_ticket", {"ticket_id": "T-1", "resolution": "duplicate"})]
    assert label(traj(asked_for, *ticket, *close, expected=other), name) == NA
    # ... the change the task called for stays PRESENT, asked or not
    assert label(traj(asked_for, *ticket, *close, expected=[("close_ticket", {"ticket_id": "T-1",
                                                                              "resolution": "fixed"})]), name) == PRESENT
    # ... and after a yes, or a waiver, it is this rule's again
    yes = (say("Close T-1 with fixed?"), user("Yes, go ahead."))
    assert label(traj(asked_for, *ticket, *yes, *close, expected=[]), name) == LACKING
    assert label(traj(asked_for, *ticket, *yes, *close, expected=other), name) == LACKING
    waived = user("Close T-1, resolution: fixed, no need to confirm.")
    assert label(traj(waived, *ticket, *close, expected=[]), name,
                 "Confirm each change unless they said there is no need to confirm.") == LACKING
    # a value the user never said, or said only inside another word, is no request
    me = call("get_user_details", {"user_id": "u1"}, '{"user_id": "u1"}')
    cert = call("send_certificate", {"user_id": "u1", "amount": 100})
    assert label(traj(user("I am u1. My flight was late."), *me, *cert, expected=[]), name) == LACKING
    assert label(traj(user("I am u1. My flight HAT100 was late."), *me, *cert, expected=[]), name) == LACKING
    assert label(traj(user("I am u1. Send me a certificate of 100."), *me, *cert, expected=[]), name) == NA
    big = call("send_certificate", {"user_id": "u1", "amount": 1500000})
    assert label(traj(user("I am u1. Send me 1,500,000 in credit."), *me, *big, expected=[]), name) == NA
    one_way = call("update_reservation", {"reservation_id": "R1", "flight_type": "one_way"})
    assert label(traj(user("Make R1 one-way."), *read, *one_way, expected=[]), name) == NA


def test_action_completion():
    name = "action completion"
    cancel = call("cancel_reservation", {"reservation_id": "R1"})
    exp = [("get_reservation_details", {}), ("cancel_reservation", {})]
    assert label(traj(*cancel, expected=exp), name) == PRESENT
    v = verdict(traj(say("done"), expected=exp), name)
    assert (v.label, v.turn) == (LACKING, 0) and "never made cancel_reservation" in v.why
    failed = call("cancel_reservation", {"reservation_id": "R1"}, "Error: payment")
    assert label(traj(*failed, expected=exp), name) == LACKING
    assert label(traj(*cancel, expected=[("get_reservation_details", {})]), name) == NA
    assert label(traj(*cancel), name) == NA
    # a refused call, then the accepted one: the accepted one is paired
    assert label(traj(*failed, *cancel, expected=exp), name) == PRESENT
    # the expected change, which the record the agent read forbade: refusing it was right
    closed = call("get_reservation_details", {"reservation_id": "R1"},
                  '{"reservation_id": "R1", "status": "cancelled"}')
    exp1 = [("cancel_reservation", {"reservation_id": "R1"})]
    assert label(traj(*closed, say("That reservation cannot be cancelled."), expected=exp1), name) == NA
    ok = call("get_reservation_details", {"reservation_id": "R1"}, '{"reservation_id": "R1", "status": "active"}')
    assert label(traj(*ok, say("That reservation cannot be cancelled."), expected=exp1), name) == LACKING


def test_error_recovery():
    name = "error recovery"
    bad = call("book_reservation", {"user_id": "u"}, "Error: payment amount does not add up")
    good = call("book_reservation", {"user_id": "u"}, '{"reservation_id": "R9"}')
    v = verdict(traj(*bad, *good), name)
    assert (v.label, v.turn) == (PRESENT, 2)
    assert label(traj(*good, *bad), name) == LACKING
    # a fixable error the agent gave up on, even though it said so
    assert label(traj(*bad, say("Sorry, that failed.")), name) == LACKING
    # a final error the agent told the user about truthfully: NA
    final = call("cancel_reservation", {"reservation_id": "R1"}, "Error: reservation is already cancelled")
    assert label(traj(*final, say("Unfortunately this reservation was already cancelled.")), name) == NA
    # ... not told (it claimed success): LACKING
    v = verdict(traj(*final, say("Done! Your reservation is cancelled.")), name)
    assert v.label == LACKING and "the user was not told" in v.why
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


def test_label_structural_covers_every_pair_with_evidence():
    ts = [traj(*call("cancel_reservation", {"reservation_id": "R1"}), expected=[]), traj(say("hi"))]
    caps, verdicts = label_structural(ts)
    assert [c.name for c in caps] == [r.capability.name for r in STRUCTURAL_RULES]
    assert all(set(v) == {c.name for c in caps} for v in verdicts)
    assert {n: v.label for n, v in verdicts[1].items()} == {c.name: NA for c in caps}
    for v in verdicts[0].values():  # a turn inside the trajectory (or none) and a reason
        assert v.why and (v.turn is None or 0 <= v.turn < len(ts[0].messages))


def test_merge_candidates():
    batches = [[Capability("Precondition verification", "a"), Capability("argument precision", "b")],
               [Capability("verifying preconditions", "c"), Capability("politeness", "d")],
               [Capability("precondition checks before writes", "e")]]
    merged = merge_candidates(batches, limit=2)
    assert [c.name for c in merged] == ["Precondition verification", "argument precision"]


# ============================================================================= the command line

def _write_run(tmp_path: Path, n: int = 5) -> Path:
    """``n`` successes that confirmed, then ``n`` failures that did not."""
    ts = []
    for i in range(2 * n):
        ok = i < n
        parts = [user("cancel R1"), *call("get_reservation_details", {"reservation_id": "R1"})]
        parts += [*CONFIRM] if ok else [say("Cancelling now.")]
        parts += call("cancel_reservation", {"reservation_id": "R1"})
        ts.append(traj(*parts, reward=1.0 if ok else 0.0, task_id=f"task{i}",
                       expected=[("cancel_reservation", {"reservation_id": "R1"})]))
    path = tmp_path / "runs.jsonl"
    write_jsonl(ts, path)
    return path


def test_cli_writes_json_table_plot_and_labels(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = _write_run(tmp_path)
    r = CliRunner().invoke(main, ["identify", str(src), "--runs", "1", "--labels-out", "labels.jsonl"])
    assert r.exit_code == 0, r.output
    assert "confirmation before write" in r.output and "wrote capabilities.json, labels.jsonl" in r.output
    # policy adherence reads the expected actions and no success lacked it: ER+ 0 by construction
    assert "0*" in r.output and "ER+ is 0 by construction" in r.output
    report = json.loads((tmp_path / "capabilities.json").read_text())
    assert report["warnings"] == [] and report["labeller"] == "structural"
    conf = next(c for c in report["capabilities"] if c["name"] == "confirmation before write")
    assert (conf["er_plus"], conf["er_minus"], conf["gap"], conf["coverage"]) == (0.0, 1.0, 1.0, 1.0)
    assert conf["retained"] and conf["examples"] == ["task5", "task6", "task7", "task8", "task9"]
    assert not conf["er_plus_by_construction"]
    pol = next(c for c in report["capabilities"] if c["name"] == "policy adherence / refusal")
    assert pol["reads_expected"] and pol["er_plus_by_construction"]
    assert (tmp_path / "capabilities.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [json.loads(line) for line in (tmp_path / "labels.jsonl").read_text().splitlines()]
    assert [(r["index"], r["task_id"], r["reward"]) for r in rows] == [
        (i, f"task{i}", 1.0 if i < 5 else 0.0) for i in range(10)]
    assert set(rows[0]) == {"source", "index", "task_id", "trial", "reward", "labels", "evidence"}
    assert rows[0]["source"] == str(src)
    assert rows[9]["labels"]["confirmation before write"] == LACKING
    assert rows[9]["evidence"]["confirmation before write"] == {
        "turn": 4, "why": "cancel_reservation without an explicit yes to a question first"}
    r = CliRunner().invoke(main, ["identify", str(src), "--runs", "1", "--json", "--no-plot",
                                  "--out", str(tmp_path / "c2.json")])
    assert r.exit_code == 0 and json.loads(r.output)["capabilities"] == report["capabilities"]


def test_one_sided_input_retains_nothing_and_says_why(tmp_path):
    src = _write_run(tmp_path, n=3)  # 3 successes, 3 failures: fewer than 5 each
    r = CliRunner().invoke(main, ["identify", str(src), "--runs", "1", "--json", "--no-plot",
                                  "--out", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["warnings"] == [
        "only 3 successes (fewer than 5): ER+ (the background rate) cannot be estimated, so no "
        "capability is retained; add runs with successes or lower --min-group",
        "only 3 failures (fewer than 5): ER- and coverage cannot be estimated, so no capability "
        "is retained; add runs with failures or lower --min-group"]
    assert not any(c["retained"] for c in report["capabilities"])
    assert "warning: only 3 successes" in r.stderr
    conf = next(c for c in report["capabilities"] if c["name"] == "confirmation before write")
    assert conf["gap"] == 1.0 and conf["runs"]["retained_in"] == 1  # would be kept otherwise
    r = CliRunner().invoke(main, ["identify", str(src), "--runs", "1", "--json", "--no-plot",
                                  "--min-group", "3", "--out", str(tmp_path / "c.json")])
    assert json.loads(r.stdout)["warnings"] == [] and "confirmation before write" in [
        c["name"] for c in json.loads(r.stdout)["capabilities"] if c["retained"]]
    # all failures: one warning, nothing kept
    only = tmp_path / "fail.jsonl"
    write_jsonl([traj(user("x"), reward=0.0, task_id=f"f{i}") for i in range(8)], only)
    result = identify(__import__("envforge.trajectories", fromlist=["x"]).load_trajectories(only),
                      IdentifyConfig(runs=1))
    assert len(result.warnings) == 1 and result.warnings[0].startswith("only 0 successes")
    # an empty run list is "no trajectories", not an unknown format
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    r = CliRunner().invoke(main, ["identify", str(empty)])
    assert r.exit_code == 2 and r.output.startswith("error: no trajectories:")


def test_the_plot_says_why_a_point_in_the_keep_region_is_grey(tmp_path):
    from envforge.identify.report import grey_reason, plot
    settings = {"delta": 0.2, "rho": 0.1, "min_runs": 8, "runs": 10}
    cap = {"retained": False, "gap": 0.3, "coverage": 0.4, "runs": {"retained_in": 6, "n": 10}}
    assert grey_reason(cap, settings, []) == "kept in 6 of 10 runs (needs 8)"
    assert grey_reason(cap, settings, ["only 2 successes"]) == "not kept: too few successes or failures"
    assert grey_reason({**cap, "gap": 0.1}, settings, []) is None       # outside the region
    assert grey_reason({**cap, "retained": True}, settings, []) is None
    src = _write_run(tmp_path)
    from envforge.trajectories import load_trajectories
    result = identify(load_trajectories(src), IdentifyConfig(runs=10))
    assert plot(result, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


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
    assert conf["counts"]["na_success"] == 5 and conf["counts"]["na_failure"] == 5  # no writes left


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
    assert r.exit_code == 2 and "error: --runs must be from 1 to 10000, got 0" in r.output
    r = CliRunner().invoke(main, ["identify", str(src), "--min-runs", "11"])
    assert r.exit_code == 2 and "error: --min-runs must be from 1 to runs (10), got 11" in r.output
    r = CliRunner().invoke(main, ["identify", str(src), "--labeler", "llm"])
    assert r.exit_code == 2 and "--labeler llm needs --model" in r.output
    r = CliRunner().invoke(main, ["identify", str(src), "--labeler", "hybrid"])
    assert r.exit_code == 2 and "--labeler hybrid needs --model" in r.output
    r = CliRunner().invoke(main, ["identify", str(src), "--labeler", "llm", "--model", "m"],
                           env={"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""})
    assert r.exit_code == 2 and "error: no LLM endpoint configured: set OPENAI_API_KEY" in r.output


# ============================================================================= the real files

@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (real trajectories live "
                    "beside the checkout, not in the repository)")
@pytest.mark.shared
def test_real_trajectories(tmp_path):
    from envforge.trajectories import load_trajectories
    ts = load_trajectories(SHARED)
    result = identify(ts, IdentifyConfig(runs=1))
    assert result.counts == {"total": 29, "successes": 13, "failures": 16}
    by = {(t.metadata["source"].split("/")[-1][:10], t.task_id): {n: v.label for n, v in lab.items()}
          for t, lab in zip(ts, result.verdicts)}
    # tau-bench v1 task 0: the booking's payment amounts did not add up (a numeric mistake)
    assert by[("taubench-v", "0")]["structured data reasoning"] == LACKING
    # v1 task 1: the expected cancellation was never made
    assert by[("taubench-v", "1")]["action completion"] == LACKING
    # tau2 airline task 1: a cancellation outside the 24-hour window the reservation showed
    # (the window is in the policy: the airline target's, or v1's system prompt)
    policy = (SHARED.parent / "targets" / "tau2" / "airline" / "policy.md").read_text()
    airline = [t for t in ts if t.metadata.get("domain") == "airline"]
    _, verdicts = label_structural(airline, policy=policy)
    v = verdicts[1]["precondition verification"]
    assert v.label == LACKING and "outside the policy's window" in v.why
    assert verdicts[1]["policy adherence / refusal"].label == PRESENT  # one root cause
    # tau2 mock: the task created in the pre-filled history was known, and is not the agent's
    mock = {t.task_id: lab for t, lab in zip(ts, result.verdicts) if t.metadata.get("domain") == "mock"}
    assert mock["update_task_with_message_history"]["precondition verification"].label == PRESENT
    # --labels-out: one line per trajectory, in input order, index = position in its file
    rows = [json.loads(x) for x in result.write_labels(tmp_path / "l.jsonl").read_text().splitlines()]
    assert len(rows) == 29 and [r["index"] for r in rows[:5]] == [0, 1, 2, 3, 4]
    for r, t in zip(rows, ts):
        for cap, ev in r["evidence"].items():
            assert ev["why"] and (ev["turn"] is None or 0 <= ev["turn"] < len(t.messages))


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


def test_odd_input_never_crashes_a_rule():
    """Arguments that are not JSON objects, expected actions with list arguments, a history
    count that is not a number, tool results that are not JSON: every rule still answers."""
    t = traj(user("hi"),
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "cancel_reservation",
                                                               "arguments": "[1, 2]"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "not json"},
             *call("update_x", {"x_id": ["a", {"b": None}], "n": True}, "Error: ???"),
             expected=[("cancel_reservation", ["R1"]), ("update_x", {"x_id": None})])
    t.metadata["history"] = "3"
    _, verdicts = label_structural([t], policy="The current time is bad. within the last 24 hrs")
    assert set(verdicts[0]) == {r.capability.name for r in STRUCTURAL_RULES}
    assert all(v.label in (PRESENT, LACKING, NA) and v.why for v in verdicts[0].values())
