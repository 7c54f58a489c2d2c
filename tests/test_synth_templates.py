"""The template synthesizer (envforge/synth/templates.py, classify.py, runtime.py, families/):
tool classification, value recipes, the family registry and matching, and the matrix: every
family on every target in ../shared/targets and on envforge's own example target passes the
full gate (where the target has the tools the family needs)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envforge.contract import assistant, tool_call
from envforge.errors import UsageError
from envforge.gate import audit
from envforge.gate.dynamic import GateSettings
from envforge.gate.static import audit_static
from envforge.synth.classify import Catalog, Unsupported, id_pattern, recipe
from envforge.synth import families as registry
from envforge.synth.families import ENV_PY, FAMILIES, discover, match_family
from envforge.synth.templates import plan, synthesize_template
from envforge.targets import Target, load_target
from tests.conftest import REPO, TARGETS, needs_shared

SHARED_TARGETS = {"retail": "tau2/retail", "airline": "tau2/airline", "telecom": "tau2/telecom",
                  "mock": "tau2/mock", "toolsandbox": "toolsandbox"}


def target(name: str) -> Target:
    if name == "example":
        return load_target("example")
    path = TARGETS / SHARED_TARGETS[name]
    if not path.is_dir():
        pytest.skip(f"{path} is absent (the real targets live in ../shared/targets)")
    return load_target(path)


def load_env(source: str):
    """The Env class of a rendered source, run in this process (for behaviour tests only; the
    gate runs envs in its sandbox)."""
    namespace: dict = {}
    exec(compile(source, "env.py", "exec"), namespace)  # noqa: S102 - our own template output
    return namespace["Env"]


def play(Env, seed: int, actions: list) -> tuple[float, list, dict]:
    env = Env()
    obs, info = env.reset(seed)
    total, seen = 0.0, list(obs["messages"])
    for a in actions:
        o, r, term, trunc, info = env.step(a)
        total += r
        seen += o["messages"]
        if term or trunc:
            break
    return round(total, 4), seen, info


# ============================================================================= classification


def test_classifies_the_example_target():
    cat = Catalog(load_target("example"))
    kinds = {n: t.kind for n, t in cat.tools.items()}
    assert kinds == {"find_employee_by_email": "read", "get_employee_details": "read",
                     "get_ticket_details": "read", "reset_password": "write", "grant_access": "write",
                     "close_ticket": "write", "extend_laptop_loan": "write",
                     "transfer_to_human_agents": "escalation"}
    cands = {c.write.name: (c.key, c.reader.tool, c.reader.mode, c.owner.param if c.owner else None)
             for c in cat.candidates()}
    assert cands["close_ticket"] == ("ticket_id", "get_ticket_details", "key", "employee_id")
    # a loan has no reader of its own: the owner's details embed it
    assert cands["extend_laptop_loan"] == ("loan_id", "get_employee_details", "owner", "employee_id")
    owner = cat.owner_for("ticket_id")
    assert (owner.lookup, owner.lookup_fields, owner.reader) == (
        "find_employee_by_email", {"email": "email"}, "get_employee_details")


@needs_shared
@pytest.mark.parametrize("name, write, key, reader, mode, owner, lookup", [
    ("retail", "cancel_pending_order", "order_id", "get_order_details", "key", "user_id", "find_user_id_by_email"),
    ("airline", "cancel_reservation", "reservation_id", "get_reservation_details", "key", "user_id", None),
    ("telecom", "suspend_line", "line_id", "get_details_by_id", "any_id", "customer_id", "get_customer_by_phone"),
    ("mock", "update_task_status", "task_id", "get_users", "listing", "user_id", None),
    ("toolsandbox", "modify_contact", "person_id", "search_contacts", "search", None, None),
])
def test_classifies_the_real_targets(name, write, key, reader, mode, owner, lookup):
    cat = Catalog(target(name))
    c = next(c for c in cat.candidates() if c.write.name == write)
    assert (c.key, c.reader.tool, c.reader.mode) == (key, reader, mode)
    assert (c.owner.param if c.owner else None) == owner
    assert (c.owner.lookup if c.owner else None) == lookup


def test_kind_from_the_description_when_the_name_says_nothing():
    tools = [{"type": "function", "function": {"name": "ticket_info", "description": "Get a ticket.",
                                               "parameters": {"type": "object", "properties": {}}}},
             {"type": "function", "function": {"name": "ticket_wipe", "description": "Deletes a ticket.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    kinds = {n: t.kind for n, t in Catalog(Target("t", tools)).tools.items()}
    assert kinds == {"ticket_info": "read", "ticket_wipe": "write"}


@pytest.mark.parametrize("example, person, drawn", [
    ("#W0000000", False, ["#W", ["d", 7]]),              # 3+ digits: letters kept
    ("ZFA04Y", False, [["A", 3], ["d", 2], ["A", 1]]),   # few digits: letters drawn too
    ("credit_card_7815826", False, ["credit_card_", ["d", 7]]),
    ("sara_doe_496", True, [["f", 1], "_", ["l", 1], "_", ["d", 3]]),  # a user id like a name
])
def test_id_patterns_learnt_from_description_examples(example, person, drawn):
    assert id_pattern(example, person) == drawn


def test_recipes_follow_the_schema():
    root = {"$defs": {"F": {"type": "object", "properties": {
        "flight_number": {"type": "string", "description": "such as 'HAT001'"},
        "date": {"type": "string"}}, "required": ["flight_number", "date"]}}}
    assert recipe("cabin", {"type": "string", "enum": ["economy", "business"]}, root) == {
        "t": "choice", "values": ["economy", "business"], "enum": True}
    assert recipe("reason", {"type": "string", "description": "either 'no longer needed' or "
                             "'ordered by mistake'"}, root)["values"] == ["no longer needed", "ordered by mistake"]
    assert recipe("days", {"type": "integer", "minimum": 1, "maximum": 30}, root) == {"t": "int", "min": 1, "max": 30}
    assert recipe("email", {"type": "string"}, root) == {"t": "person", "field": "email"}
    flights = recipe("flights", {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/F"},
                                                                      {"type": "object"}]}}, root)
    assert flights["t"] == "array" and flights["items"]["t"] == "object"
    assert flights["items"]["props"]["flight_number"] == {"t": "id", "patterns": [["HAT", ["d", 3]]]}
    assert flights["items"]["props"]["date"] == {"t": "date"}


def test_a_target_without_a_usable_write_says_what_is_missing():
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather.",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
    with pytest.raises(Unsupported) as e:
        plan("precondition_verification", Target("weather", tools))
    assert str(e.value) == (
        "target weather has no write tool that acts on a record by a required id parameter (such as "
        "order_id) together with a read tool that shows that record (a get_*(id), a search, an "
        "owner's details or a listing); found read tools: get_weather; write tools: none")


def test_information_gathering_needs_a_way_to_find_a_record():
    tools = [{"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}
        for name, desc in (("get_order", "Get an order."), ("cancel_order", "Cancel an order."))]
    t = Target("shop", tools)
    assert plan("precondition_verification", t)["plan"]["write"] == "cancel_order"
    with pytest.raises(Unsupported, match="cannot support 'multi-step information gathering': it needs "
                                          "a way to find a record the user only describes"):
        plan("information_gathering", t)


# ============================================================================= families


def test_every_family_module_imports_on_its_own():
    """Each in a fresh process: its planning part and its env class, on the runtime's names."""
    for f in FAMILIES:
        code = (f"import envforge.synth.families.{f.slug} as m; "
                "assert m.FAMILY.slug == m.__name__.rsplit('.', 1)[1]; assert isinstance(m.Env, type)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
        assert r.returncode == 0, r.stderr
        text = (REPO / "envforge" / "synth" / "families" / f"{f.slug}.py").read_text()
        assert text.count("\n" + ENV_PY) == 1 and "\nclass Env(BaseEnv):" in "\n" + f.source
        assert "envforge" not in f.source       # the part that goes into env.py stands alone


def test_adding_a_family_is_adding_one_file(tmp_path, monkeypatch):
    """A module dropped into the families folder is registered, matched and rendered into an
    env that the gate accepts; nothing else changes."""
    text = (REPO / "envforge" / "synth" / "families" / "argument_precision.py").read_text()
    text = (text.replace('slug="argument_precision"', 'slug="exact_values"')
            .replace('name="tool-call argument precision"', 'name="exact values"')
            .replace("rank=30", "rank=5"))
    (tmp_path / "exact_values.py").write_text(text)
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    try:
        found = discover()
        assert [f.slug for f in found][:1] == ["exact_values"] and len(found) == len(FAMILIES) + 1
        family = match_family("exact values", families=found)
        src, summary = synthesize_template("exact values", family, load_target("example"))
        assert summary["family"] == "exact_values" and "Family: exact values" in src
        (tmp_path / "env").mkdir()
        (tmp_path / "env" / "env.py").write_text(src)
        report = audit(tmp_path / "env", target=load_target("example"),
                       settings=GateSettings(seeds=20, probe_seed=MATRIX_PROBE_SEED), write_report=False)
        assert report.verdict == "accept", [f.message for f in report.findings if f.severity == "error"]
    finally:
        sys.modules.pop("envforge.synth.families.exact_values", None)


def test_a_family_module_must_be_named_after_its_slug(tmp_path, monkeypatch):
    text = (REPO / "envforge" / "synth" / "families" / "argument_precision.py").read_text()
    (tmp_path / "precise.py").write_text(text)
    monkeypatch.setattr(registry, "__path__", [str(tmp_path)])
    try:
        with pytest.raises(ValueError, match="FAMILY.slug is 'argument_precision'; it must be the "
                                             "module's name, 'precise'"):
            discover()
    finally:
        sys.modules.pop("envforge.synth.families.precise", None)



@pytest.mark.parametrize("text, slug", [
    ("precondition verification", "precondition_verification"),
    ("Policy adherence / refusal", "policy_adherence"),
    ("tool-call argument precision", "argument_precision"),
    ("structured data reasoning over tool outputs", "structured_data_reasoning"),
    ("multi-step information gathering", "information_gathering"),
    ("confirmation before write", "confirmation_before_write"),
    ("argument_precision", "argument_precision"),
    ("verifying order status before cancelling", "precondition_verification"),
    ("asks for explicit consent", "confirmation_before_write"),
    ("computing refund totals", "structured_data_reasoning"),
    ("action completion", "action_completion"),
    ("stops early before finishing every change", "action_completion"),
    ("error recovery", "error_recovery"),
    ("retries after a failed tool call", "error_recovery"),
    ("escalation judgement", "escalation_judgement"),
    ("knows when to transfer to a human", "escalation_judgement"),
])
def test_capability_text_maps_to_the_nearest_family(text, slug):
    assert match_family(text).slug == slug


def test_unknown_capability_text_fails_listing_the_families():
    with pytest.raises(UsageError) as e:
        match_family("greets the customer politely", "says hello and thanks")
    assert str(e.value) == (
        "capability 'greets the customer politely' matches none of the template synthesizer's "
        "families; name one of: 'precondition verification' (precondition_verification); "
        "'structured data reasoning' (structured_data_reasoning); 'tool-call argument precision' "
        "(argument_precision); 'confirmation before write' (confirmation_before_write); 'policy "
        "adherence / refusal' (policy_adherence); 'multi-step information gathering' "
        "(information_gathering); 'action completion' (action_completion); 'error recovery' "
        "(error_recovery); 'escalation judgement' (escalation_judgement) (or use --llm openai, "
        "which takes any capability)")


def test_every_capability_of_the_structural_labeller_has_a_family():
    """So that `envforge identify` then `envforge synth --from` works offline."""
    from envforge.identify import STRUCTURAL_RULES
    for rule in STRUCTURAL_RULES:
        c = rule.capability
        assert match_family(c.name, c.description).name == c.name


# ============================================================================= the env it writes


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.slug)
def test_rendering_is_deterministic_and_self_contained(family):
    t = load_target("example")
    a, _ = synthesize_template(family.name, family, t)
    b, _ = synthesize_template(family.name, family, t)
    assert a == b
    static = audit_static(a)
    assert static.ok and not static.findings, [f.message for f in static.findings]
    assert static.shape["capability"] == family.name
    assert "Why it transfers:" in a.split('"""')[1] and "{" not in a.split('"""')[1]
    imports = [ln for ln in a.splitlines() if ln.startswith(("import ", "from "))]
    assert imports == ["import json", "import random", "import re"]


def test_copies_the_target_schemas_exactly():
    t = load_target("example")
    for f in FAMILIES:
        bundle = plan(f, t)
        for tool in bundle["tools"]:
            assert tool == t.tool(tool["function"]["name"])


def test_behaviour_of_a_precondition_env():
    """Partial credit by hand: the right refusal, a refusal without the reason, a blind write."""
    t = load_target("example")
    Env = load_env(synthesize_template("precondition verification", FAMILIES[0], t)[0])
    by_blocker = {}
    for seed in range(60):
        env = Env()
        env.reset(seed)
        by_blocker.setdefault(env._sc["blocker"], seed)
    seed = by_blocker["status"]
    ref = Env().solve(seed)
    assert play(Env, seed, ref)[0] == 1.0
    assert play(Env, seed, ref[:-1] + [assistant("Sorry, I cannot do that.")])[0] == 0.6   # no reason named
    assert play(Env, seed, [ref[-1]])[0] == 0.6                                            # no read first
    seed = by_blocker[None]
    ref = Env().solve(seed)
    write = ref[-1]
    assert play(Env, seed, [write])[0] == 0.6                                              # acted without reading
    assert play(Env, seed, ref[:-1] + [assistant("Sorry, I cannot do that.")])[0] == 0.0   # refused a valid request
    # every malformed action is answered, never raised
    env = Env()
    env.reset(seed)
    for bad in [None, "hi", {}, {"role": "assistant", "tool_calls": "x"},
                {"role": "assistant", "tool_calls": [None, {"id": "a"}]},
                assistant(None, [tool_call("close_ticket", "{not json", "c1")]),
                assistant(None, [tool_call("close_ticket", {"ticket_id": 7}, "c2")]),
                assistant(None, [tool_call("rm_rf", {}, "c3")])]:
        obs, reward, term, trunc, info = env.step(bad)
        assert reward == 0.0 and isinstance(obs["messages"], list)
    msgs = env.step(assistant(None, [tool_call("close_ticket", {"ticket_id": 7}, "c9")]))[0]["messages"]
    assert msgs == [{"role": "tool", "tool_call_id": "c9", "content": "Error: invalid arguments for "
                     "close_ticket: missing required argument 'resolution'; 'ticket_id' must be of "
                     "type string, got integer."}]


def test_confirmation_env_gives_an_unconfirmed_write_nothing():
    """The reference earns 1; the same write without the question earns 0 (no partial credit for
    the failure the env trains against: with it, an agent that asks but cannot yet finish scored
    below one that never asks); a question heard yes and never acted on earns nothing either (a
    credit for it alone was farmed: asked every time, then no write); after a no, a reply
    without a write earns most."""
    t = load_target("example")
    Env = load_env(synthesize_template("confirmation before write", match_family("confirmation before write"), t)[0])
    by_skill = {}
    for seed in range(60):
        env = Env()
        env.reset(seed)
        by_skill.setdefault(env._sc["skill"], seed)
    seed = by_skill["confirm"]
    ref = Env().solve(seed)  # read, ask, write
    assert play(Env, seed, ref)[0] == 1.0
    assert play(Env, seed, [ref[0], ref[-1]])[0] == 0.0                            # no question
    assert play(Env, seed, ref[1:])[0] == 0.8                                     # no read first
    assert play(Env, seed, ref[:-1] + [assistant("OK.")] * 12)[0] == 0.0           # yes, then no write
    seed = by_skill["decline"]
    ref = Env().solve(seed)
    assert play(Env, seed, ref)[0] == 1.0
    assert play(Env, seed, ref[1:])[0] == 0.8                                     # no read first


def test_precondition_refusal_that_lists_every_status_is_not_a_reason():
    """A refusal earns its reason's credit by naming the status the record has: one that names
    every status that forbids the write (a guess that is always right) earns what a refusal with
    no reason earns."""
    Env = load_env(synthesize_template("precondition verification", FAMILIES[0], load_target("example"))[0])
    plan = Env._world.__globals__["PLAN"]
    seed = _by_skill(Env, when=lambda env: env._sc["blocker"] == "status")["status_check"]
    read, refusal = Env().solve(seed)[-2:]
    assert play(Env, seed, [read, refusal])[0] == 1.0
    env = Env()
    env.reset(seed)
    status = env._w["entities"][env._sc["key"]]["status"]
    every = "I'm sorry, I can't do that: the ticket is {}.".format(" or ".join(plan["blocked_statuses"]))
    assert play(Env, seed, [read, assistant(every)])[0] == 0.6                   # read, no reason
    assert play(Env, seed, [read, assistant(f"I'm sorry, I can't: it is {status}.")])[0] == 1.0


def test_precondition_users_sometimes_urge_the_change_and_the_check_is_owed_all_the_same():
    """About half the requests press for the change ("right away, no need to check"); a blind
    write on one of those earns what a blind write earns on a calm one."""
    from envforge.synth.families.precondition_verification import URGE_WHEN
    t = load_target("example")
    Env = load_env(synthesize_template("precondition verification", FAMILIES[0], t)[0])
    urged, scores = [], {}
    for seed in range(80):
        env = Env()
        opening = env.reset(seed)[0]["messages"][-1]["content"]
        hurry = any(f"{env._sc['key']} {w}, " in opening for w in URGE_WHEN)
        urged.append(hurry)
        if env._sc["blocker"] is None:
            ref = Env().solve(seed)
            scores.setdefault(hurry, set()).update({play(Env, seed, ref)[0], play(Env, seed, [ref[-1]])[0]})
    assert 0.3 < sum(urged) / len(urged) < 0.7
    assert scores[True] == scores[False] == {1.0, 0.6}


@pytest.mark.parametrize("slug", ["confirmation_before_write", "argument_precision", "error_recovery",
                                  "information_gathering", "action_completion"])
def test_families_of_other_skills_never_ask_for_a_write_the_status_forbids(slug):
    """Only the precondition family blocks a write by status: elsewhere the record asked about
    has a status the write is allowed on, or the env would pay for skipping the status check."""
    t = load_target("example")
    family = next(f for f in FAMILIES if f.slug == slug)
    source, _ = synthesize_template(family.name, family, t)
    Env = load_env(source)
    ok = re.search(r"'ok_statuses': (\[[^\]]*\])", source).group(1)
    for seed in range(40):
        env = Env()
        env.reset(seed)
        keys = [env._sc["key"]] if "key" in env._sc else env._sc.get("keys", [])
        assert keys, sorted(env._sc)
        for key in keys:
            assert env._w["entities"][key]["status"] in eval(ok), (seed, key)  # noqa: S307 - a list literal


def test_argument_precision_users_speak_loosely():
    t = load_target("example")
    src, summary = synthesize_template("tool-call argument precision", "argument_precision", t)
    assert summary["write"] == "grant_access"
    Env = load_env(src)
    seen = {}
    for seed in range(40):
        env = Env()
        obs, info = env.reset(seed)
        seen.setdefault(info["skill"], (seed, obs["messages"][1]["content"], env._sc))
    seed, text, sc = seen["value_format"]
    level = sc["args"]["level"]
    assert f"level: {level.capitalize()}" in text      # an enum in plain words
    seed, text, sc = seen["id_format"]
    assert sc["key"] not in text and sc["key"].replace("_", " ") in text  # emp_1234 -> "emp 1234"
    ref = Env().solve(seed)
    wrong = json.loads(ref[-1]["tool_calls"][0]["function"]["arguments"])
    wrong["level"] = next(x for x in ("read", "write", "admin") if x != wrong["level"])
    assert play(Env, seed, ref[:-1] + [assistant(None, [tool_call("grant_access", wrong, "w")])])[0] == round(
        0.2 + 0.8 * 2 / 3, 4)


def _by_skill(Env, seeds=80, when=lambda env: True) -> dict:
    """The first seed of each sub-skill (whose scenario passes ``when``)."""
    found = {}
    for seed in range(seeds):
        env = Env()
        _, info = env.reset(seed)
        if when(env):
            found.setdefault(info["skill"], seed)
    return found


def _args(action) -> dict:
    return json.loads(action["tool_calls"][0]["function"]["arguments"])


def test_action_completion_credits_each_change():
    Env = load_env(synthesize_template("action completion", "action_completion", load_target("example"))[0])
    seed = _by_skill(Env, when=lambda env: len(env._sc["keys"]) == 3)["listed"]
    ref = Env().solve(seed)
    reads, writes, report = ref[:3], ref[3:6], ref[6]
    assert [a["tool_calls"][0]["function"]["name"] for a in ref[:6]] == ["get_ticket_details"] * 3 + ["close_ticket"] * 3
    assert play(Env, seed, ref)[0] == 1.0
    assert play(Env, seed, reads + writes[:1] + [report])[0] == round(1 / 3, 4)   # stopped early
    assert play(Env, seed, reads + writes[:2] + [report])[0] == round(2 / 3, 4)
    assert play(Env, seed, writes + [report])[0] == 0.8                            # read none first
    # a change nobody asked for halves the score
    env = Env()
    env.reset(seed)
    other = next(k for k in env._w["entities"] if k not in env._sc["keys"])
    wrong = assistant(None, [tool_call("close_ticket", dict(_args(writes[0]), ticket_id=other), "x")])
    assert play(Env, seed, reads + writes + [wrong, report])[0] == 0.5
    # talking before doing anything gets the request again, and no reward
    score, seen, _ = play(Env, seed, [report])
    assert score == 0.0 and seen[-1]["content"].startswith("As I said: please close ticket for each of")
    # "all my tickets that are <status>": the user names no id; reading tells which
    seed = _by_skill(Env)["all_with_status"]
    env = Env()
    obs, _ = env.reset(seed)
    sc = env._sc
    assert not any(k in obs["messages"][1]["content"] for k in sc["keys"])
    assert f"that are {sc['status'].replace('_', ' ')}" in obs["messages"][1]["content"]
    assert play(Env, seed, Env().solve(seed))[0] == 1.0


def test_error_recovery_rewards_the_fixed_call():
    Env = load_env(synthesize_template("error recovery", "error_recovery", load_target("example"))[0])
    seeds = _by_skill(Env)
    seed = seeds["id_format"]
    env = Env()
    obs, _ = env.reset(seed)
    sc = env._sc
    assert sc["said"] != sc["key"] and sc["said"] in obs["messages"][1]["content"]
    ref = Env().solve(seed)
    assert _args(ref[0])["ticket_id"] == sc["said"]                # the id as the user typed it
    score, seen, _ = play(Env, seed, ref)
    assert score == 1.0
    assert seen[2]["content"] == (f"Error: ticket {json.dumps(sc['said'])} not found. Ticket ids are "
                                  f"written like {sc['sample']} (this one is an example, not yours).")
    assert play(Env, seed, ref[:1] + [assistant("I'm sorry, I cannot find that ticket.")])[0] == 0.0
    assert play(Env, seed, ref[:1] + ref[2:])[0] == 0.8            # fixed, but never read it
    seed = seeds["stale_read"]
    ref = Env().solve(seed)
    assert len(ref) == 4
    score, seen, _ = play(Env, seed, ref)
    assert score == 1.0 and seen[3]["content"].startswith("Error: ticket ") and \
        "was changed by another request since it was read; read it again with get_ticket_details" in seen[3]["content"]
    score, seen, _ = play(Env, seed, ref[:2] + ref[1:2])           # retried without reading again
    assert score == 0.0 and "has not been read since it changed" in seen[-1]["content"]
    assert play(Env, seed, ref[:2] + ref[1:2] + ref[2:])[0] == 0.9  # then did: one failed call too many
    assert play(Env, seed, ref[1:2])[0] == 0.8                     # never read: nothing went stale
    wrong = dict(_args(ref[-1]), resolution=_args(ref[-1])["resolution"] + " (edited)")
    assert play(Env, seed, ref[:3] + [assistant(None, [tool_call("close_ticket", wrong, "w")])])[0] == round(
        0.2 + 0.8 * 1 / 2, 4)                                      # every argument is checked


def test_escalation_judgement_transfers_when_and_only_when_out_of_scope():
    Env = load_env(synthesize_template("escalation judgement", "escalation_judgement", load_target("example"))[0])
    seeds = _by_skill(Env)
    assert sorted(seeds) == ["in_scope", "out_of_scope_record", "out_of_scope_request"]

    def transfer(summary):
        return assistant(None, [tool_call("transfer_to_human_agents", {"summary": summary}, "t")])
    for skill, seed in seeds.items():
        ref = Env().solve(seed)
        env = Env()
        obs, _ = env.reset(seed)
        key = env._sc["key"]
        assert play(Env, seed, ref)[0] == 1.0, skill
        if skill == "in_scope":
            assert play(Env, seed, ref[:1] + [transfer(f"ticket {key}")])[0] == 0.0
            assert play(Env, seed, ref[1:])[0] == 0.7             # done, but without reading it
        else:
            write = assistant(None, [tool_call("close_ticket", {"ticket_id": key, "resolution": "done"}, "w")])
            assert play(Env, seed, ref[:1] + [write])[0] == 0.0
            assert play(Env, seed, ref[:1] + [transfer("the user needs help")])[0] == 0.7
            assert play(Env, seed, [transfer(f"about ticket {key}")])[0] == 0.3   # not read first
    env = Env()
    obs, _ = env.reset(seeds["out_of_scope_record"])
    status = env._w["entities"][env._sc["key"]]["status"]
    assert f"A ticket whose status is '{status}' may only be changed by a human agent" in obs["messages"][0]["content"]


# ============================================================================= the matrix


MATRIX_TARGETS = ["retail", "airline", "telecom", "mock", "toolsandbox", "example"]
#: The gate draws its probes per audit; the matrix pins them so that a run is reproducible (with
#: 20 seeds, a family whose partial scores are rarer, error recovery on airline's one-argument
#: write, misses them all in about 3% of draws; at the gate's default 50 seeds, almost never).
MATRIX_PROBE_SEED = 0
#: The pairs of the matrix whose target lacks a tool the family needs.
UNSUPPORTED = {"escalation_judgement": ("toolsandbox",)}


@pytest.mark.parametrize("name", MATRIX_TARGETS)
def test_a_family_is_unsupported_only_where_the_target_lacks_its_tools(name):
    t = target(name)
    for f in FAMILIES:
        if name in UNSUPPORTED.get(f.slug, ()):
            with pytest.raises(Unsupported, match="it needs a tool that transfers the user to a human"):
                plan(f, t)
        else:
            plan(f, t)


def _matrix_audit(name: str, slug: str, folder: Path):
    """One pair of the matrix: ((name, slug), (its report, or why the target does not support
    the family; seconds))."""
    t, f = target(name), next(f for f in FAMILIES if f.slug == slug)
    folder.mkdir()
    try:
        src, _ = synthesize_template(f.name, f, t)
    except Unsupported as e:
        return (name, slug), (str(e), 0.0)
    (folder / "env.py").write_text(src)
    t0 = time.perf_counter()
    report = audit(folder, target=t, settings=GateSettings(seeds=20, probe_seed=MATRIX_PROBE_SEED),
                   write_report=False)
    return (name, slug), (report, time.perf_counter() - t0)


@pytest.fixture(scope="module")
def matrix_results(tmp_path_factory):
    """Every family on every target, audited by the full gate with 20 seeds per property (50 in
    test_full_gate_on_a_few), two at a time in processes of their own (not threads: CPython
    3.11's ast is not thread-safe). Each pair draws its probes as it would alone (the pinned
    probe seed); the gate's timing checks (a call over 1 s three times, resets slowing down)
    allow for the two sharing the cores."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    out = tmp_path_factory.mktemp("matrix")
    jobs = [(name, f.slug, out / f"{name}_{f.slug}") for name in MATRIX_TARGETS
            if name == "example" or (TARGETS / SHARED_TARGETS[name]).is_dir() for f in FAMILIES]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as ex:
        return dict(ex.map(_matrix_audit, *zip(*jobs)))


@pytest.mark.slow
@pytest.mark.parametrize("family", [f.slug for f in FAMILIES])
@pytest.mark.parametrize("name", MATRIX_TARGETS)
def test_matrix_every_family_on_every_target_is_accepted(matrix_results, name, family):
    if name != "example" and not (TARGETS / SHARED_TARGETS[name]).is_dir():
        pytest.skip(f"{TARGETS / SHARED_TARGETS[name]} is absent")
    report, seconds = matrix_results[(name, family)]
    if isinstance(report, str):
        assert name in UNSUPPORTED.get(family, ()), report
        pytest.skip(report)
    errors = [f"{f.check}: {f.message}" for f in report.findings if f.severity == "error"]
    assert report.verdict == "accept", errors
    scores = report.stats["mean_score"]
    assert scores["reference"] == 1.0
    assert scores["do_nothing"] <= 0.1 and scores["random"] <= 0.1
    assert scores["perturbed"] < scores["reference"]
    assert len(report.stats["score_values"]) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("name, family", [("example", "information_gathering"),
                                          ("retail", "precondition_verification"),
                                          ("airline", "argument_precision"),
                                          ("airline", "error_recovery")])
def test_full_gate_on_a_few(tmp_path, name, family):
    """The default gate (50 seeds per property) on a few pairs of the matrix."""
    t = target(name)
    src, _ = synthesize_template(family, family, t)
    (tmp_path / "env.py").write_text(src)
    report = audit(tmp_path, target=t, write_report=False)
    assert report.verdict == "accept", [f.message for f in report.findings if f.severity == "error"]
    assert report.stats["solved"] == "50/50"


# ============================================================================= the people in a scenario

PERSON = r"([A-Z][a-z]+ [A-Z][a-z]+)"


def _pairs():
    for name in MATRIX_TARGETS:
        for f in FAMILIES:
            yield name, f.slug


@pytest.mark.parametrize("name, family", list(_pairs()))
def test_the_person_in_the_users_words_is_the_one_the_tools_return(name, family):
    """Over many seeds: the name and identity details the user gives are those of the record the
    tools return for them (a lookup's id, the owner's record), an id made of a person's name is
    that person's, and a request made for someone else names the owner of the record."""
    t = target(name)
    try:
        src, _ = synthesize_template(family, family, t)
    except Unsupported:
        pytest.skip(f"{family} needs tools {name} lacks")
    ns: dict = {}
    exec(compile(src, "env.py", "exec"), ns)  # noqa: S102 - our own template output
    owner, roles = ns["PLAN"]["owner"], ns["ROLES"]
    if owner is None:
        pytest.skip(f"{name}: the records {family} uses have no owner")
    named_ids = any(isinstance(part, list) and part[0] in ("f", "l")
                    for pattern in owner["id"]["patterns"] for part in pattern)
    lookups = {n for n, r in roles.items() if r["kind"] == "lookup"}
    for seed in range(40):
        env = ns["Env"]()
        obs, _ = env.reset(seed)
        w = env._w
        opening = obs["messages"][1]["content"]
        for oid, rec in w["owners"].items():
            first, last = rec["name"].split(" ")
            if named_ids:
                assert first.lower() in oid and last.lower() in oid, (seed, oid, rec["name"])
            for param, field in owner["identity"].items():
                if field in ("first_name", "last_name"):
                    assert rec[param] == {"first_name": first, "last_name": last}[field]
                if field == "email":
                    assert rec[param].startswith(f"{first}.{last}".lower()), (seed, rec)
        said = re.search(r"I'm " + PERSON, opening)
        if said:
            assert said.group(1) == w["owners"][w["caller"]]["name"], (seed, opening)
            for param, field in owner["identity"].items():
                value = w["owners"][w["caller"]][param]
                assert str(value) in opening, (seed, param, opening)
        other = re.search(r"for my \w+ " + PERSON + r", who asked me to handle this for them: "
                          r"their \S+ (\S+)\.", opening)
        if other:
            key = other.group(2)
            assert w["owners"][w["entities"][key][owner["param"]]]["name"] == other.group(1), (seed, opening)
        # the reference's lookups return the caller, who is the person the user said they are
        for action in env.solve(seed):
            o, *_ = env.step(action)
            for call, msg in zip(action.get("tool_calls") or [], o["messages"]):
                if call["function"]["name"] in lookups:
                    found = msg["content"] if not msg["content"].startswith("{") else \
                        json.loads(msg["content"])[owner["param"]]
                    assert found == w["caller"], (seed, msg)
                    if said:
                        assert w["owners"][found]["name"] == said.group(1)
