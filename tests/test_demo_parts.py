"""The demo's parts, fast: the target benchmark (in a real sandbox), the planted deficits as
identify sees them, the tokenizer and the SFT token masks."""
from __future__ import annotations

import json
import random
import re

import pytest

from envforge.demo.expert import DeficitRates, draw_deficits, expert_action, task_kind
from envforge.demo.target import PLANTED, write_target, write_target_folder
from envforge.errors import UsageError


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo_target")
    return write_target_folder(root / "helpdesk"), write_target(root / "target")


def replay(env, seeds, episodes) -> list[float]:
    scores = []
    for s, msgs in zip(seeds, episodes):
        env.reset(seed=s)
        scores.append(sum(env.step(m)[1] for m in msgs[2:] if m["role"] == "assistant"))
    return scores


def play(factory, seeds, rates, rng):
    from envforge.demo.run import play_expert
    return play_expert(factory, seeds, rates, rng)


def test_target_passes_static_audit_and_expert_solves_it(target):
    from envforge.gate import audit
    from trainers.rollout import EnvFactory
    folder, env = target
    assert audit(env, target=folder, static_only=True).verdict == "accept"
    with EnvFactory(env, size=2, backend="process") as factory:
        episodes = play(factory, list(range(30)), DeficitRates(0.0, 0.0), random.Random(0))
        e = factory.make()
        try:
            by_text = {s: task_kind(e.reset(seed=s)[0]["messages"][1]["content"]) for s in range(30)}
            kinds = set(by_text.values())
            scores = []
            for s, msgs in zip(range(30), episodes):
                e.reset(seed=s)
                total = 0.0
                for m in msgs[2:]:
                    if m["role"] == "assistant":
                        total += e.step(m)[1]
                scores.append(total)
        finally:
            e.close()
        from envforge.demo.run import task_kinds
        assert task_kinds(factory, list(range(30))) == by_text  # the demo's kinds: each reset's skill
    assert kinds == {"precondition_verification", "confirmation_before_write", "status_lookup"}
    assert scores == [1.0] * 30


def test_target_asks_both_sides_of_each_skill(tmp_path):
    """The target's hurried closes are of closable tickets (read, then close) as well as blocked
    ones (read, then refuse), and its users say yes, no, or ask for another resolution: a
    policy that always refuses a hurried close, closes without the read, or closes after the
    user's question whatever the answer fails the tasks of the other side."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("demo_target_sides", write_target(tmp_path / "t") / "env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # trusted: the demo's own target (the test reads its tasks)
    worlds = {s: mod._world(s) for s in range(300)}
    sides = {(w["kind"], w["answer"] if not w["waived"] else w["tickets"][w["key"]]["status"] == "active")
             for w in worlds.values() if w["close"]}
    assert sides == {("precondition_verification", True), ("precondition_verification", False),
                     ("confirmation_before_write", "yes"), ("confirmation_before_write", "no"),
                     ("confirmation_before_write", "amend")}

    def score(seed, actions):
        env = mod.Env()
        env.reset(seed)
        total = 0.0
        for a in actions:
            obs, r, term, trunc, _ = env.step(a)
            total += r
            if term or trunc:
                break
        return total

    def close(w, resolution=None):
        return {"role": "assistant", "content": None, "tool_calls": [{"id": "c9", "type": "function", "function": {
            "name": "close_ticket", "arguments": json.dumps({"ticket_id": w["key"],
                                                             "resolution": resolution or w["resolution"]})}}]}
    read = lambda w: {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",  # noqa: E731
                      "function": {"name": "get_ticket_details", "arguments": json.dumps({"ticket_id": w["key"]})}}]}
    refuse = lambda w: {"role": "assistant", "content": "Sorry, I can't: ticket {} is {}.".format(  # noqa: E731
        w["key"], w["tickets"][w["key"]]["status"])}
    polite = lambda w: {"role": "assistant", "content": "Sorry, I can't close ticket {}: it is {}. Anything "  # noqa: E731
                        "else I can do?".format(w["key"], w["tickets"][w["key"]]["status"])}
    sorry_ask = lambda w: {"role": "assistant", "content": "Sorry for the wait. Close ticket {} with {}?".format(  # noqa: E731
        w["key"], w["resolution"])}
    ask = lambda w: {"role": "assistant", "content": "Close ticket {} with {}?".format(w["key"], w["resolution"])}  # noqa: E731
    for seed, w in worlds.items():
        if not w["close"]:
            continue
        solved = mod.Env().solve(seed)
        assert score(seed, solved) == 1.0
        if w["waived"]:
            closable = w["tickets"][w["key"]]["status"] == "active"
            assert score(seed, [read(w), refuse(w)]) == (0.0 if closable else 1.0)
            assert score(seed, [read(w), polite(w)]) == (0.0 if closable else 1.0)  # a question after it
            assert score(seed, [read(w), close(w)]) == (1.0 if closable else 0.0)
            assert score(seed, [close(w)]) == 0.0  # the read is owed
        else:
            assert score(seed, [ask(w), close(w)]) == (1.0 if w["answer"] == "yes" else 0.0)
            assert score(seed, [sorry_ask(w), close(w)]) == (1.0 if w["answer"] == "yes" else 0.0)
            assert score(seed, [close(w)]) == 0.0  # unasked
            if w["answer"] == "amend":
                assert score(seed, [ask(w), close(w, w["amend"])]) == 0.0  # the new one is confirmed first


#: sha256 of the practice tasks of seeds 0-499 (``_world``, less its ``close`` flag), as drawn at
#: a7a15c0, the commit whose base agents README's table was measured with: a change to the target
#: must leave them, and so the base agents, as they were (or re-measure the table)
PRACTICE_DIGEST = "00ef0d0e8f7929ef2644f9cbf38b984eb27125bb066dc0cc1fd86c2b2afbb2a8"


def test_practice_tasks_are_drawn_as_the_base_agents_were_taught(tmp_path):
    import hashlib
    import importlib.util
    spec = importlib.util.spec_from_file_location("demo_practice_digest",
                                                  write_target(tmp_path / "p", practice=True) / "env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # trusted: the demo's own practice tasks
    worlds = [{k: v for k, v in mod._world(s).items() if k != "close"} for s in range(500)]
    assert hashlib.sha256(json.dumps(worlds, sort_keys=True).encode()).hexdigest() == PRACTICE_DIGEST


def test_practice_tasks_vary_what_the_target_holds_fixed(tmp_path):
    """The base agent's practice tasks: waived or not, closable or not, a user who says yes, no
    or asks for another resolution; the expert solves all of them, and each deficit fails some."""
    from trainers.rollout import EnvFactory
    env = write_target(tmp_path / "practice", practice=True)
    seeds = list(range(120))
    with EnvFactory(env, size=2, backend="process") as factory:
        right = play(factory, seeds, DeficitRates(0.0, 0.0), random.Random(0))
        hurried = play(factory, seeds, DeficitRates(1.0, 1.0), random.Random(0))
        e = factory.make()
        try:
            assert replay(e, seeds, right) == [1.0] * len(seeds)
            solved = [[{}, {}] + e.solve(s) for s in seeds]  # the env's own reference solution
            assert replay(e, seeds, solved) == [1.0] * len(seeds)
            assert 0 < sum(replay(e, seeds, hurried)) < len(seeds) / 2
        finally:
            e.close()
    users = [m["content"] for ep in right for m in ep[3:] if m["role"] == "user"]
    assert any(u.startswith("No") for u in users) and any("resolution:" in u for u in users)
    replies = [m["content"] for ep in right for m in ep if m["role"] == "assistant" and m["content"]]
    assert any("can't" in r for r in replies if "no need to confirm" not in r)
    openings = [ep[1]["content"] for ep in right]
    refused = [o for o, ep in zip(openings, right) if "can't" in (ep[-2].get("content") or "")]
    assert any("no need to confirm" not in o for o in refused)  # a blocked ticket without the waiver


def test_follow_through_teaches_what_follows_an_answer_not_the_question(tmp_path):
    """With the confirmation skipped in every episode and follow_through 1, the expert asks in
    each closable request without the waiver, but its turns up to the question are untrained:
    the trained turns never ask first, and they hold the answers to the user's reply."""
    from envforge.demo.expert import is_question
    from trainers.rollout import EnvFactory
    env = write_target(tmp_path / "practice", practice=True)
    seeds = list(range(80))
    with EnvFactory(env, size=2, backend="process") as factory:
        plain = play(factory, seeds, DeficitRates(0.0, 1.0), random.Random(0))
        from envforge.demo.run import play_expert
        follow = play_expert(factory, seeds, DeficitRates(0.0, 1.0), random.Random(0), follow_through=1.0)
    assert not any(is_question(m) for ep in plain for m in ep)
    asked = [ep for ep in follow if any(is_question(m) for m in ep)]
    assert len(asked) >= 10
    for ep, before in zip(follow, plain):
        if ep not in asked:  # nothing to ask (a waiver, a ticket that cannot be closed): as drawn
            assert ep == before
            continue
        q = next(j for j, m in enumerate(ep) if is_question(m))
        assert all(m.get("train") is False for m in ep[:q + 1] if m["role"] == "assistant")
        assert all("train" not in m for m in ep[q + 1:])
        assert ep[q + 1]["role"] == "user" and ep[q + 2]["role"] == "assistant"
    closes = [ep[j + 1] for ep in asked for j, m in enumerate(ep)
              if m["role"] == "user" and m["content"].startswith("Yes")]
    assert closes and all(c["tool_calls"][0]["function"]["name"] == "close_ticket" for c in closes)


def test_check_through_teaches_what_follows_a_read_not_the_read(tmp_path):
    """With the read skipped before every hurried close and check_through 1, the expert reads
    anyway in each of those episodes, its read untrained: the trained turns read exactly as often
    as without it, and after each untrained read comes a trained decision on what it said
    (refuse a ticket that is not active, naming its status; close an active one)."""
    from envforge.demo.run import play_expert
    from trainers.rollout import EnvFactory

    def reads(m):
        return any(c["function"]["name"] == "get_ticket_details" for c in m.get("tool_calls") or [])
    env = write_target(tmp_path / "practice", practice=True)
    seeds = list(range(80))
    with EnvFactory(env, size=2, backend="process") as factory:
        plain = play(factory, seeds, DeficitRates(1.0, 0.0), random.Random(0))
        check = play_expert(factory, seeds, DeficitRates(1.0, 0.0), random.Random(0), check_through=1.0)
    trained_reads = [sum(reads(m) and m.get("train", True) for m in ep) for ep in check]
    assert trained_reads == [sum(reads(m) for m in ep) for ep in plain]
    changed = [ep for ep, before in zip(check, plain) if ep != before]
    assert len(changed) >= 10
    decisions = set()
    for ep in changed:
        r = next(j for j, m in enumerate(ep) if m["role"] == "assistant" and reads(m))
        assert ep[r]["train"] is False and all("train" not in m for m in ep[r + 1:])
        status = json.loads(ep[r + 1]["content"])["status"]
        after = ep[r + 2]
        if status == "active":
            assert after["tool_calls"][0]["function"]["name"] == "close_ticket"
        else:
            assert "can't" in after["content"] and status in after["content"]
        decisions.add(status == "active")
    assert decisions == {True, False}


def test_planted_deficits_are_what_identify_retains(target):
    """The ground truth of the demo: the expert's runs with the planted deficits, labelled by
    identify's structural rules, retain exactly the planted capabilities."""
    from envforge import identify as ident
    from envforge.targets import load_target
    from trainers.rollout import EnvFactory
    folder, env = target
    seeds = list(range(200_000, 200_160))
    with EnvFactory(env, size=4, backend="process") as factory:
        episodes = play(factory, seeds, DeficitRates(), random.Random(1))
        e = factory.make()
        try:
            rewards = []
            for s, msgs in zip(seeds, episodes):
                e.reset(seed=s)
                rewards.append(sum(e.step(m)[1] for m in msgs[2:] if m["role"] == "assistant"))
        finally:
            e.close()
        from envforge.demo.run import expected_actions
        from envforge.trajectories import Trajectory
        trajs = [Trajectory(f"t{s}", m, r, r >= 1.0, x, {}) for s, m, r, x in
                 zip(seeds, episodes, rewards, expected_actions(factory, seeds))]
    assert 0.3 < sum(rewards) / len(rewards) < 0.6  # the base's target: roughly 0.3-0.5
    found = ident.identify(trajs, ident.IdentifyConfig(seed=0), meta=load_target(folder).meta)
    assert sorted(found.retained) == sorted(p.replace("_", " ") for p in PLANTED)


def test_expert_plants_each_deficit_as_described():
    opening = "Hi. Please close ticket for my ticket TCK-104. Details: resolution: duplicate."
    msgs = [{"role": "system", "content": "p"}, {"role": "user", "content": opening}]
    read = expert_action(msgs)
    assert read["tool_calls"][0]["function"]["name"] == "get_ticket_details"
    msgs += [read, {"role": "tool", "tool_call_id": "call_0",
                    "content": json.dumps({"ticket_id": "TCK-104", "status": "active"})}]
    assert "Shall I proceed?" in expert_action(msgs)["content"]
    skipped = expert_action(msgs, frozenset({"confirmation_before_write"}))
    assert skipped["tool_calls"][0]["function"]["name"] == "close_ticket"
    assert list(json.loads(skipped["tool_calls"][0]["function"]["arguments"])) == ["resolution", "ticket_id"]
    blocked = [{"role": "system", "content": "p"}, {"role": "user", "content": opening.replace(
        ". Details", " right away, no need to confirm. Details")}]
    assert expert_action(blocked, frozenset({"precondition_verification"}))["tool_calls"][0][
        "function"]["name"] == "close_ticket"
    # a hurried close skips the read; before asking the user, it reads (so successes all read)
    first = msgs[:2]
    both = frozenset({"precondition_verification", "confirmation_before_write"})
    assert expert_action(first, both)["tool_calls"][0]["function"]["name"] == "close_ticket"
    assert expert_action(first, frozenset({"precondition_verification"}))["tool_calls"][0][
        "function"]["name"] == "get_ticket_details"
    rng = random.Random(0)
    draws = [draw_deficits(rng, DeficitRates(0.75, 0.0)) for _ in range(400)]
    assert 0.68 < sum("precondition_verification" in d for d in draws) / 400 < 0.82
    assert not any("confirmation_before_write" in d for d in draws)


def test_tokenizer_round_trips_and_an_id_is_one_token():
    pytest.importorskip("transformers")
    from envforge.demo.agent import episode_tokens, fit_tokenizer
    from trainers.policy import Policy
    text = 'Ticket TCK-104 has the status \'on_hold\'.\n  {"ticket_id": "TCK-987"}'
    tok = fit_tokenizer([text, "Hi. Please close ticket for my ticket (close_ticket)"],
                        ["get_ticket_details", "close_ticket"])
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.convert_ids_to_tokens(tok.encode("TCK-104", add_special_tokens=False)) == ["TCK", "-", "104"]
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "get_ticket_details", "arguments": json.dumps({"ticket_id": "TCK-104"})}}]}
    msgs = [{"role": "system", "content": "Hi."}, {"role": "user", "content": "Hi. TCK-104"}, call,
            {"role": "tool", "tool_call_id": "c", "content": '{"status": "active"}'},
            {"role": "assistant", "content": "Ticket TCK-104 has the status 'active'."}]

    class _Model:  # the policy's text side only: no forward pass here
        pass
    policy = Policy(_Model(), tok, family="hermes")
    tokens, mask = episode_tokens(policy, msgs)
    sampled = policy.decode([t for t, m in zip(tokens, mask) if m])
    assert sampled.count("<|im_end|>") == 2 and "tool_response" not in sampled and "Hi." not in sampled
    first_turn = tokens[mask.index(1):mask.index(0, mask.index(1))]
    assert len(first_turn) <= 16  # a tool call is a short token sequence
    # the tool's name and its arguments' opening are one token: the first argument is chosen there
    assert 'get_ticket_details", "arguments": {"' in tok.convert_ids_to_tokens(first_turn)
    assert tok.tokenize("close ticket, close_ticket") == ["close", " ", "ticket", ",", " ", "close_ticket"]
    assert policy.parse(policy.decode(first_turn))["tool_calls"][0]["function"]["arguments"] == '{"ticket_id": "TCK-104"}'
    # a turn marked "train": False is context only
    tokens2, mask2 = episode_tokens(policy, msgs[:2] + [dict(call, train=False)] + msgs[3:])
    assert tokens2 == tokens and sum(mask2) == sum(mask) - len(first_turn) and mask2[mask.index(1)] == 0


def test_the_demo_never_empties_a_folder_it_did_not_write(tmp_path):
    """--out . in a project holds its own adapters/ and capabilities.json: a demo run there (or
    --fresh) is refused, naming them, and nothing is removed; a demo's own folder (its state
    file) is still resumed or replaced."""
    from click.testing import CliRunner

    from envforge.cli import main
    from envforge.demo import run
    project = tmp_path / "project"
    (project / "adapters" / "mine").mkdir(parents=True)
    (project / "adapters" / "mine" / "adapter_model.safetensors").write_text("days of GPU time")
    (project / "capabilities.json").write_text("{}")
    for extra in ([], ["--fresh"]):
        r = CliRunner().invoke(main, ["demo", "--out", str(project), "--quick", *extra])
        assert r.exit_code == 2, r.output
        assert r.output.startswith(f"error: --out {project} holds adapters, capabilities.json but no "
                                   f"{run.STATE}: it is not a demo's folder"), r.output
        assert (project / "adapters" / "mine" / "adapter_model.safetensors").read_text() == "days of GPU time"
    with pytest.raises(UsageError, match="not a demo's folder"):
        run.check_out(project)
    (project / run.STATE).write_text("{}")  # a demo wrote it: its outputs are its own
    run.check_out(project)
    run.check_out(tmp_path / "empty")  # nothing there: nothing to lose


def test_demo_usage_errors_exit_2(tmp_path):
    from click.testing import CliRunner

    from envforge.cli import main
    f = tmp_path / "a_file"
    f.write_text("x")
    r = CliRunner().invoke(main, ["demo", "--out", str(f)])
    assert r.exit_code == 2 and f"--out {f}: is a file, not a folder" in r.output
    r = CliRunner().invoke(main, ["demo", "--out", str(f / "under_a_file")])  # cannot be made
    assert r.exit_code == 2 and r.output.startswith(f"error: --out {f / 'under_a_file'}: cannot make this folder")
    r = CliRunner().invoke(main, ["demo", "--threads", "0"])
    assert r.exit_code == 2 and "--threads" in r.output
    r = CliRunner().invoke(main, ["demo", "--seed", "-1", "--out", str(tmp_path / "o")])  # task seeds stay >= 0
    assert r.exit_code == 2 and "--seed must be from 0 to 100000, got -1" in r.output
    r = CliRunner().invoke(main, ["demo", "--device", "tpu", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--device must be 'cpu', 'cuda' or 'cuda:N'" in r.output
    r = CliRunner().invoke(main, ["demo", "--size", "huge", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--size" in r.output
    for bad in ("cudax", "cuda:abc", "cuda:-1", "gpu"):
        r = CliRunner().invoke(main, ["demo", "--device", bad, "--out", str(tmp_path / "o")])
        assert r.exit_code == 2 and f"got {bad!r}" in r.output, r.output
    r = CliRunner().invoke(main, ["demo", "--backend", "unsafe-inprocess", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--backend" in r.output
    assert not (tmp_path / "o").exists()  # refused before anything was written
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "results.json").write_text("{}")
    r = CliRunner().invoke(main, ["demo", "--fresh", "--device", "tpu", "--out", str(kept)])
    assert r.exit_code == 2 and (kept / "results.json").exists()  # --fresh removes nothing then


def test_demo_json_prints_results_alone(tmp_path, monkeypatch):
    """--json: stdout is results.json's content and nothing else (progress stays on stderr). The
    run itself is a stand-in here (tests/test_demo.py runs the real one); it gets the CLI's config."""
    from click.testing import CliRunner

    from envforge.cli import main
    from envforge.demo import run
    from envforge.progress import Step
    seen = {}

    def fake(cfg, out, progress=None):
        seen["cfg"] = cfg
        progress(Step("base: done in 1s"))
        return {"seed": cfg.seed, "methods": {"base": {"mean": 0.5}}, "device": cfg.device}
    monkeypatch.setattr(run, "run_demo", fake)
    r = CliRunner().invoke(main, ["demo", "--seed", "3", "--size", "large", "--json", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"seed": 3, "methods": {"base": {"mean": 0.5}}, "device": "cpu"}
    assert "base: done" in r.stderr and seen["cfg"].hidden == 384


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_demo_on_cuda_without_a_gpu_says_so(tmp_path):
    from click.testing import CliRunner

    from envforge.cli import main
    r = CliRunner().invoke(main, ["demo", "--device", "cuda", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "torch sees no CUDA device; use 'cpu'" in r.output


def test_demo_sizes_make_the_model_they_name(tmp_path, monkeypatch):
    """--size large: the base stage's warm-up (``run.warm_up``, the copy task itself a stand-in)
    makes a model over 10x the small one's parameters, and trains it at lower rates; a GPU plays
    more episodes at a time. No GPU here: the cuda path runs in
    test_the_demos_model_steps_run_on_a_gpu where one is."""
    from envforge.demo import agent, run
    from envforge.demo.agent import fit_tokenizer
    from envforge.demo.config import DemoConfig
    tok = fit_tokenizer(["ticket TCK - 104 status open", "close_ticket resolution fixed"], ["close_ticket"])
    lrs = []
    monkeypatch.setattr(agent, "pretrain_copy", lambda model, tokenizer, *, lr, **kw: lrs.append(lr) or {
        "steps": 1, "losses": {"id": 0.01}, "learnt": True})

    class Quiet:
        def begin(self, *a): pass
        def say(self, *a): pass
        def step(self, *a): pass
    sizes = {}
    for size in ("small", "large"):
        cfg = DemoConfig.for_run(size=size, quick=True)
        model, _ = run.warm_up(cfg, tmp_path / size, tok, {"status": ["open"]}, Quiet())
        sizes[size] = (sum(p.numel() for p in model.parameters()), cfg.sft_lr, cfg.quick, cfg.iterations)
    assert sizes["large"][0] > 10 * sizes["small"][0]
    assert lrs[1] < lrs[0] and sizes["large"][1] < sizes["small"][1]
    assert sizes["large"][2:] == sizes["small"][2:]  # --quick's budgets hold at any size


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_the_demos_model_steps_run_on_a_gpu(tmp_path):
    """Where torch sees a GPU: the copy warm-up, SFT, the router and a merged adapter's
    generation run with the model on cuda (each moves its own tensors there)."""
    import torch

    from envforge.demo import agent
    from trainers.grpo import add_adapter
    from trainers.grpo_config import GRPOConfig
    from trainers.policy import Policy, load_policy
    from trainers.router import AdapterInfo, Router, merged_policy
    tok = agent.fit_tokenizer(["ticket TCK - 104 status open", "close_ticket resolution fixed yes no"],
                              ["close_ticket"])
    model = agent.save_model(tmp_path / "m", tok, hidden=32, layers=1, heads=2, seed=0).to("cuda")
    copy = agent.pretrain_copy(model, tok, steps=3, max_steps=3, fields={"status": ["open"]})
    assert copy["steps"] == 3 and next(model.parameters()).is_cuda
    policy = Policy(model, tok, family="hermes", name="m")
    msgs = [{"role": "user", "content": "status of TCK - 104"}, {"role": "assistant", "content": "open"}]
    losses = agent.sft(model, [agent.episode_tokens(policy, msgs)] * 4, policy.pad_id, epochs=1, batch_size=2,
                       copy=agent.CopyTask(tok, 1, 4, {"status": ["open"]}))
    assert len(losses) == 1 and losses[0] == losses[0]
    model.save_pretrained(tmp_path / "m")
    peft_model = add_adapter(load_policy(tmp_path / "m").model, GRPOConfig(lora_rank=2))
    peft_model.save_pretrained(tmp_path / "a" / "x_status")
    (tmp_path / "a" / "x_status" / "manifest.json").write_text(json.dumps(
        {"capability": "status lookup", "description": "tells a status"}))
    merged = merged_policy(tmp_path / "m", tmp_path / "a", device="cuda")
    assert merged.device.type == "cuda" and len(merged.generate([[1, 2, 3]], max_new_tokens=3)) == 1
    router = Router.load(tmp_path / "m", tmp_path / "a", device="cuda", examples=0)
    assert router.route("status of TCK - 104").choice in ("none", "x_status")
    torch.cuda.synchronize()


def test_the_demos_status_words_are_the_targets():
    """The base agent's word classes name the statuses the target env actually uses."""
    import ast

    from envforge.demo.target import SOURCE, STATUSES
    tree = ast.parse(SOURCE.read_text())
    values = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name)}
    blocked = ast.literal_eval(values["BLOCKED"])
    assert set(STATUSES) == {"active", *blocked}


def test_resolutions_are_codes_the_synthesizer_reads_from_the_schema(tmp_path):
    """The target's resolution is an enum of codes (one token each for the base agent); the
    template synthesizer takes its values from that enum, and the target env draws from them."""
    import importlib.util

    from envforge.demo.target import RESOLUTIONS, target_tools
    from envforge.synth.classify import recipe
    close = next(t["function"] for t in target_tools() if t["function"]["name"] == "close_ticket")
    schema = close["parameters"]["properties"]["resolution"]
    assert schema["enum"] == list(RESOLUTIONS)
    assert recipe("resolution", schema, close["parameters"], schema["description"])["values"] == list(RESOLUTIONS)
    spec = importlib.util.spec_from_file_location("demo_target_env", write_target(tmp_path / "t") / "env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # trusted: the demo's own target (the test reads its tasks)
    named = {next(r for r in RESOLUTIONS if f"resolution: {r}." in mod.Env().reset(s)[0]["messages"][1]["content"])
             for s in range(60) if "close" in mod.Env().reset(s)[0]["messages"][1]["content"]}
    assert named == set(RESOLUTIONS)


def test_a_confirmation_naming_every_code_is_not_one(tmp_path):
    """The confirmation the target requires names the user's code and no other one."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("demo_target_env2", write_target(tmp_path / "t") / "env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seed = next(s for s in range(100) if mod._world(s)["kind"] == "confirmation_before_write"
                and mod._world(s)["answer"] == "yes")
    w = mod._world(seed)
    env = mod.Env()
    env.reset(seed)
    every = "Close ticket {} with {}?".format(w["key"], " or ".join(mod.RESOLUTIONS))
    obs, *_ = env.step({"role": "assistant", "content": every})
    assert obs["messages"][0]["content"] == "That is not the resolution I asked for."
    obs, *_ = env.step({"role": "assistant", "content": "Close ticket {} with {}?".format(w["key"], w["resolution"])})
    assert obs["messages"][0]["content"].startswith("Yes")


def test_copy_warm_up_checks_every_kind_and_goes_on_until_learnt(tmp_path, monkeypatch):
    """pretrain_copy measures each kind on fresh batches (not the last batch's loss) and trains on,
    100 steps at a time, while one is above target, up to max_steps."""
    pytest.importorskip("transformers")
    import torch

    from envforge.demo import agent
    torch.set_num_threads(1)
    tok = agent.fit_tokenizer(['TCK-104 {"status": "active", "resolution": "fixed"} closed on_hold duplicate'])
    fields = {"status": ["active", "closed", "on_hold"], "resolution": ["fixed", "duplicate"]}
    model = agent.save_model(tmp_path / "m", tok, hidden=16, layers=1, heads=2, seed=0)
    checks, real = [], agent.CopyTask.kind_losses

    def counted(self, m, batches=4):
        checks.append(self.turn)
        return real(self, m, batches)
    monkeypatch.setattr(agent.CopyTask, "kind_losses", counted)
    seen = []
    out = agent.pretrain_copy(model, tok, steps=3, max_steps=205, target=-1.0, batch_size=4, fields=fields,
                              progress=lambda step, total, loss: seen.append((step, total)))
    assert out["steps"] == 205 and len(checks) == 4  # after 3, 103, 203 and 205 steps
    assert seen[:4] == [(1, 3), (2, 3), (3, 3), (4, 205)] and seen[-1] == (205, 205)  # progress: every step
    assert set(out["losses"]) == {"id", "status", "resolution"} and not out["learnt"]
    checks.clear()
    out = agent.pretrain_copy(model, tok, steps=3, max_steps=205, target=1e9, batch_size=4, fields=fields)
    assert out["steps"] == 3 and out["learnt"] and len(checks) == 1  # all below target: stop
    assert not model.training
    out = agent.pretrain_copy(model, tok, steps=0, max_steps=100, target=-1.0, batch_size=4, fields=fields)
    assert out["steps"] == 100  # no first chunk, then on until max_steps
    task = agent.CopyTask(tok, 1, 8, fields)
    model.train()
    losses = real(task, model, batches=2)
    assert model.training and task.turn == 0 and set(losses) == {"id", "status", "resolution"}


def test_routing_prompts_set_the_capabilities_the_tasks_need_side_by_side():
    """The base agent's routing prompts always offer the needed capability, answer it, and in
    about half of them offer every capability the tasks need, so the model must read the task to
    choose between them (with random lists alone the two close capabilities met in few prompts)."""
    from envforge.demo.agent import route_examples
    from envforge.identify.rules import STRUCTURAL_RULES
    from trainers.router import NONE
    caps = [r.capability for r in STRUCTURAL_RULES]
    a, b = "precondition verification", "confirmation before write"
    tasks = [(f"task {i}", [a, b, None][i % 3]) for i in range(600)]
    routes = route_examples(tasks, caps, random.Random(0))
    assert len(routes) == len(tasks)
    both = 0
    for (msgs, answer), (text, need) in zip(routes, tasks):
        prompt = msgs[0]["content"]
        assert f"Task: {text}\n" in prompt and answer == (need or NONE)
        offered = [c.name for c in caps if f"- {c.name}:" in prompt]
        assert need is None or need in offered
        assert 1 <= len(offered) <= 4
        both += a in offered and b in offered
    assert 0.45 < both / len(tasks) < 0.75  # random lists alone: about 0.2


def test_a_copy_warm_up_that_never_began_to_learn_starts_again_from_another_init(tmp_path, monkeypatch):
    """warm_up keeps an init whose copy losses came down (even if not to target) and starts
    again from another init, at most COPY_ATTEMPTS times, when they did not. (pretrain_copy
    itself is the real one in the test above; here it reports what the test sets.)"""
    pytest.importorskip("transformers")
    import torch

    from envforge.demo import agent, run
    from envforge.demo.config import DemoConfig
    torch.set_num_threads(1)
    tok = agent.fit_tokenizer(['TCK-104 {"status": "active", "resolution": "fixed"} closed'])
    cfg = DemoConfig.for_run(seed=5, quick=True)
    cfg.hidden, cfg.layers, cfg.heads = 16, 1, 2
    fields = {"status": ["active", "closed"], "resolution": ["fixed"]}
    said, seeds, weights = [], [], []

    class Quiet:
        def begin(self, *a): said.append(a[-1])
        def say(self, text): said.append(text)
        def step(self, *a): pass

    def fake(model, tokenizer, *, steps, max_steps, seed, fields, lr, progress):
        assert lr == cfg.copy_lr and steps == cfg.copy_steps
        assert max_steps == run.COPY_MAX * cfg.copy_steps == 5 * cfg.copy_steps  # on until learnt
        seeds.append(seed)
        weights.append(model.get_input_embeddings().weight.detach().clone())
        worst = reports.pop(0)
        return {"steps": 3 * steps, "losses": {"id": worst, "status": 0.01}, "learnt": worst < 0.1}
    monkeypatch.setattr(agent, "pretrain_copy", fake)
    reports = [5.6, 0.3]  # the first never began; the second came down, not to target: kept
    model, copy = run.warm_up(cfg, tmp_path / "m", tok, fields, Quiet())
    assert seeds == [5, 1005] and copy["inits"] == 2 and not copy["learnt"]
    assert not torch.equal(weights[0], weights[1])  # another init, not the same model again
    assert torch.equal(model.get_input_embeddings().weight, weights[1])
    assert any("init 2" in s for s in said)
    seeds.clear()
    reports = [5.6, 4.0, 3.0, 0.01]
    _, copy = run.warm_up(cfg, tmp_path / "m2", tok, fields, Quiet())
    assert len(seeds) == run.COPY_ATTEMPTS == copy["inits"] and reports == [0.01]  # then it gives up


def test_a_demo_run_resumes_where_an_earlier_one_of_its_settings_stopped(tmp_path, monkeypatch):
    """The base agent a run made is kept by the next run of the same settings (after a crash or
    Ctrl-C later on) and by one that differs only after it (--quick against the full run); a
    base stage cut short is made again; a run of other settings starts afresh.
    (The base agent and everything after it are stand-ins here: the test is about the state.)"""
    import trainers.policy
    from envforge.demo import run
    from envforge.demo.config import DemoConfig

    import torch

    class Stop(Exception):
        pass
    made, said, threads = [], [], []

    def make_base(cfg, out, factory, progress):
        made.append(cfg.seed)
        threads.append(torch.get_num_threads())
        out.mkdir(parents=True, exist_ok=True)
        (out / "weights").write_text(str(cfg.seed))
        if interrupt:
            raise KeyboardInterrupt
        return {"parameters": 1, "seed": cfg.seed}

    def load_policy(*a, **kw):
        raise Stop  # the stage after the base: stop here, as a crash would
    monkeypatch.setattr(run, "make_base", make_base)
    monkeypatch.setattr(trainers.policy, "load_policy", load_policy)
    monkeypatch.setattr(run, "cores", lambda: 2)  # the base agent, made alone, gets both
    cfg = DemoConfig.for_run(seed=3, quick=True)
    cfg.pool_size, cfg.backend = 1, "process"
    out = tmp_path / "out"

    def go(c):
        with pytest.raises((Stop, KeyboardInterrupt)):
            run.run_demo(c, out, progress=lambda step: said.append(step.text))

    interrupt = True
    go(cfg)  # Ctrl-C in the base stage: nothing kept
    interrupt = False
    go(cfg)
    assert made == [3, 3] and threads == [2, 2]
    assert torch.get_num_threads() == 1  # the run's other stages: --threads
    state = json.loads((out / run.STATE).read_text())
    assert state["done"]["base"]["result"] == {"parameters": 1, "seed": 3, "threads": 2}
    said.clear()
    go(cfg)  # the same settings: the base agent is kept
    assert made == [3, 3] and any("resuming" in s and "base" in s for s in said)
    assert (out / "base_model" / "weights").read_text() == "3"
    moved = DemoConfig.for_run(seed=3, quick=True, threads=2)  # where it runs changed, not what
    moved.pool_size, moved.backend = 2, "process"
    go(moved)
    assert made == [3, 3]
    (out / "results.json").write_text("{}")
    full = DemoConfig.for_run(seed=3)  # the full run after --quick: the same base agent, trained more
    full.pool_size, full.backend = 1, "process"
    said.clear()
    go(full)
    assert made == [3, 3] and (out / "base_model" / "weights").read_text() == "3"
    assert not (out / "results.json").exists()  # the --quick run's results are not the full run's
    assert any("same base agent" in s for s in said)
    state = json.loads((out / run.STATE).read_text())
    assert state["config"]["quick"] is False and list(state["done"]) == ["base"]
    deficits = DemoConfig.for_run(seed=3)  # a setting the base agent depends on: made again
    deficits.pool_size, deficits.backend, deficits.deficit_rate = 1, "process", 0.5
    go(deficits)
    assert made == [3, 3, 3]
    other = DemoConfig.for_run(seed=4, quick=True)
    other.pool_size, other.backend = 1, "process"
    (out / "results.json").write_text("{}")  # what the earlier run wrote goes
    go(other)
    assert made == [3, 3, 3, 4] and not (out / "results.json").exists()
    assert any("other settings" in s for s in said)
    assert (out / "base_model" / "weights").read_text() == "4"


def test_quick_trains_the_full_runs_base_agent_less():
    """--quick changes only how long the adapters train: its base agent is the full run's."""
    from dataclasses import asdict

    from envforge.demo.config import DemoConfig
    full, quick = asdict(DemoConfig.for_run(seed=2)), asdict(DemoConfig.for_run(seed=2, quick=True))
    assert {k for k in full if full[k] != quick[k]} == {"quick", "iterations"}
    assert quick["iterations"] < full["iterations"]


def test_every_grpo_run_of_the_demo_gets_its_kl_to_the_base_agent():
    """The adapters and GRPO on the target train with the same KL to the base agent (the demo's
    kl_coef; 0 by default, as the paper's official code)."""
    from dataclasses import replace

    from envforge.demo.config import DemoConfig
    from envforge.demo.run import grpo_config
    for quick in (False, True):
        cfg = replace(DemoConfig.for_run(seed=1, quick=quick), kl_coef=0.3)
        assert grpo_config(cfg, 3).kl_coef == grpo_config(cfg, 9, 100).kl_coef == 0.3
    assert grpo_config(DemoConfig.for_run(seed=1), 3).kl_coef == DemoConfig().kl_coef == 0.0


def test_the_base_agent_gets_the_cores_the_parallel_stages_use(monkeypatch):
    from envforge.demo import run
    from envforge.demo.config import DemoConfig
    monkeypatch.setattr(run, "cores", lambda: 8)
    assert run.alone_threads(DemoConfig.for_run()) == 8
    assert run.alone_threads(DemoConfig.for_run(threads=3)) == 6  # two jobs of 3 would run
    assert run.alone_threads(DemoConfig.for_run(threads=16)) == 16  # one job, its own threads
    monkeypatch.setattr(run, "cores", lambda: 1)
    assert run.alone_threads(DemoConfig.for_run()) == 1
    gpu = DemoConfig.for_run(threads=2)
    gpu.device = "cuda"  # (no GPU needed: only the setting is read)
    monkeypatch.setattr(run, "cores", lambda: 8)
    assert run.alone_threads(gpu) == 2  # the model learns on the GPU: --threads as given


def _crash(job, progress):
    raise RuntimeError("boom in " + job.name)


def test_an_evaluation_job_that_crashes_leaves_its_traceback(tmp_path):
    """The demo's evaluations run in processes of their own (run_many): a crash (a bug, not an
    envforge error) is one line naming the job, and its traceback is kept in the job's folder."""
    from envforge.demo.config import DemoConfig
    from envforge.demo.run import EvalJob
    from trainers.parallel import JobFailed, run_many
    log = tmp_path / "logs" / "routed" / "crash.log"
    job = EvalJob("routed", "routed", "model", None, "target", [1], DemoConfig(), str(log.parent))
    with pytest.raises(JobFailed, match=r"evaluate: routed failed: RuntimeError: boom in routed "
                                        r"\(traceback in .*crash.log\)"):
        run_many(_crash, [job], 1, what="evaluate:")
    assert "Traceback" in log.read_text() and "boom in routed" in log.read_text()


@pytest.mark.timeout(600)  # a budget never closed would leave the baseline waiting for ever
def test_the_baseline_trains_beside_the_adapters_and_stops_at_their_rollouts(tmp_path):
    """The demo's train stage: GRPO on the target trains in a process beside the adapters', its
    budget raised as their rollouts come in and closed when they end. Real processes, a real
    tiny model, real sandboxes. It ends where a run alone with max_rollouts = the adapters'
    total ends, its reward curve the same."""
    pytest.importorskip("torch")
    from dataclasses import replace
    from tests.trainers_fixtures import brevity_env, tiny_model_dir
    from envforge.demo.config import DemoConfig
    from envforge.demo.run import Tracker, grpo_config, seed_key, train
    from trainers.parallel import Job, RolloutBudget, run_job
    model, env = tiny_model_dir(tmp_path), brevity_env(tmp_path / "env")
    cfg = replace(DemoConfig(), iterations=3, pool_size=4, backend="process", lora_rank=4, max_new_tokens=8)
    steps = []
    out = train(cfg, model, env, {"brevity": env}, tmp_path / "adapters", tmp_path / "grpo_target",
                Tracker(steps.append))
    adapter, baseline = out["brevity"], out["grpo_target"]
    assert RolloutBudget(tmp_path / "grpo_target" / "budget.json")() == (adapter["rollouts"], True)
    alone = run_job(Job("alone", str(model), str(env), str(tmp_path / "alone"),
                        grpo_config(cfg, baseline["max_iterations"], adapter["rollouts"], seed_key(cfg, env.name)),
                        base_model=str(model)))
    assert baseline["rollouts"] == alone["rollouts"] >= adapter["rollouts"]
    assert baseline["reward_curve"] == alone["reward_curve"]
    assert adapter["iterations"] == len(adapter["reward_curve"]) == 3
    # the iterations it ran: the budget ended it, not the backstop
    assert baseline["iterations"] == len(baseline["reward_curve"]) < baseline["max_iterations"]
    shown = [s.text for s in steps]
    assert any("GRPO on the target: reward" in t for t in shown) and any("brevity: reward" in t for t in shown)


@pytest.mark.timeout(600)  # a budget left open would leave the baseline waiting for ever
def test_an_adapter_that_fails_closes_the_baselines_budget(tmp_path):
    """One adapter's training fails (its env does not exist): the baseline's budget is closed at
    once, so the baseline stops instead of waiting for rollouts that will never come, and the
    stage fails naming the adapter, the other adapter trained."""
    pytest.importorskip("torch")
    from dataclasses import replace
    from tests.trainers_fixtures import brevity_env, tiny_model_dir
    from envforge.demo.config import DemoConfig
    from envforge.demo.run import Tracker, train
    from trainers.parallel import JobFailed, RolloutBudget
    model, env = tiny_model_dir(tmp_path), brevity_env(tmp_path / "env")
    cfg = replace(DemoConfig(), iterations=3, pool_size=4, backend="process", lora_rank=4, max_new_tokens=8)
    with pytest.raises(JobFailed, match="training missing failed"):
        train(cfg, model, env, {"missing": tmp_path / "no_env", "brevity": env}, tmp_path / "adapters",
              tmp_path / "grpo_target", Tracker())
    assert RolloutBudget(tmp_path / "grpo_target" / "budget.json")() == (0, True)
    assert (tmp_path / "adapters" / "env" / "adapter_model.safetensors").is_file()


def test_the_settings_kept_aside_for_the_base_agent_are_not_read_while_it_is_made():
    """A run that differs from an earlier one only in ``AFTER_BASE``'s fields keeps its base
    agent: none of them may be read by the code that makes it."""
    import inspect

    from envforge.demo import run
    from envforge.demo.config import DemoConfig
    fields = set(DemoConfig.__dataclass_fields__)
    assert set(run.AFTER_BASE) <= fields
    source = "".join(inspect.getsource(f) for f in (run.make_base, run.warm_up, run.play_expert))
    used = set(re.findall(r"\bcfg\.(\w+)", source))
    assert used and used <= fields
    assert not used & set(run.AFTER_BASE), used & set(run.AFTER_BASE)


def test_the_evaluation_skips_the_tasks_grpo_on_the_target_trained_on(tmp_path):
    """GRPO on the target draws its env seeds from the whole range the evaluation's lie in: a task
    it trained on is replaced by a spare, and said. The seeds are read back from its manifest's
    key and count, as the trainer drew them."""
    from envforge.contract import training_seeds
    from envforge.demo.run import held_out, trained_seeds
    (tmp_path / "manifest.json").write_text(json.dumps({"env_seeds": {"key": 5, "drawn": 40}}))
    trained = trained_seeds(tmp_path)
    assert trained == set(training_seeds(5, 0, 40))
    hit = sorted(trained)[:2]
    seeds = [hit[0], 10**9, hit[1], 10**9 + 1, 10**9 + 2]
    assert held_out(seeds, trained, 3) == ([10**9, 10**9 + 1, 10**9 + 2], [hit[0], hit[1]])
    assert held_out(seeds[1:2] + seeds[3:], trained, 3) == ([10**9, 10**9 + 1, 10**9 + 2], [])
