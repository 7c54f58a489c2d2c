"""trainers.router: the base model picks the adapter whose answer it was made to prefer (a tiny
model fine-tuned to answer a capability's name, or "none", to routing prompts), and the routed
policy applies it."""
from __future__ import annotations

import json

import pytest

from tests.trainers_fixtures import hermes_dir, model_root  # noqa: F401

import torch  # noqa: E402

from trainers.policy import load_policy  # noqa: E402
from trainers.router import NONE, RoutedPolicy, Router, find_adapters, routing_messages  # noqa: E402

TASKS = ["Reset my password please.", "Extend my laptop loan LN-1 by 3 days."]


def make_adapters(base_dir, folder):
    from peft import LoraConfig, get_peft_model
    for i, (name, cap) in enumerate([("a_orders", "order lookup"), ("b_checks", "precondition verification")]):
        torch.manual_seed(i)
        model = get_peft_model(load_policy(base_dir).model,
                               LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
        model.save_pretrained(folder / name)
        (folder / name / "manifest.json").write_text(json.dumps(
            {"capability": cap, "description": f"checks {cap}", "examples": ["an example"]}))
    return find_adapters(folder)


def prefer(base_dir, out, adapters, label):
    """The base model fine-tuned (all weights) to answer ``label`` (then end its turn) to routing
    prompts."""
    policy = load_policy(base_dir)
    model = policy.model
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    answer = policy.encode(label) + [policy.eot_id]
    prompts = [policy.encode(policy.render(routing_messages(t, adapters), add_generation_prompt=True))
               for t in TASKS]
    model.train()
    for _ in range(30):
        for ids in prompts:
            logits = model(input_ids=torch.tensor([ids + answer])).logits[0, len(ids) - 1:-1]
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor(answer))
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    return out


@pytest.mark.parametrize("label,choice", [("precondition verification", "b_checks"), (NONE, NONE)])
def test_router_picks_the_preferred_answer(hermes_dir, tmp_path, label, choice):
    adapters = make_adapters(hermes_dir, tmp_path / "adapters")
    base = prefer(hermes_dir, tmp_path / "base", adapters, label)
    router = Router.load(base, tmp_path / "adapters")
    for task in TASKS:
        d = router.route(task)
        assert d.choice == choice and d.label == label and d.task == task
        assert set(d.probabilities) == {NONE, "a_orders", "b_checks"}
        assert sum(d.probabilities.values()) == pytest.approx(1.0)
        assert max(d.probabilities, key=d.probabilities.get) == choice
        assert json.loads(json.dumps(d.to_dict())) == {"task": task, "choice": choice,
                                                      "label": label, "probabilities": d.probabilities}

    # the answer is scored, not a position: the options in the other order route the same
    flipped = Router(load_policy(base), list(reversed(adapters)))
    assert all(flipped.route(t).choice == choice for t in TASKS)

    routed = RoutedPolicy.load(base, tmp_path / "adapters")
    assert routed.begin(TASKS[0]).choice == choice  # routing sees the base model, adapters off
    ids = routed.encode(routed.render([{"role": "user", "content": "hi"}], add_generation_prompt=True))
    torch.manual_seed(0)
    out = routed.generate([ids], max_new_tokens=4)
    assert out and routed.choice == choice
    if choice != NONE:
        assert routed.model.active_adapter == choice


def test_two_adapters_with_one_capability_are_an_error(hermes_dir, tmp_path):
    from envforge.errors import InputError
    a, b = make_adapters(hermes_dir, tmp_path / "adapters")
    b.capability = a.capability
    with pytest.raises(InputError, match="same capability"):
        Router(load_policy(hermes_dir), [a, b])


def test_find_adapters_says_what_is_missing(tmp_path):
    from envforge.errors import InputError
    with pytest.raises(InputError, match="no adapters in"):
        find_adapters(tmp_path)
    with pytest.raises(InputError, match="nope: no such folder"):
        find_adapters(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file, not a folder"):
        find_adapters(tmp_path / "file")


def test_merged_policy_applies_the_mean_of_the_adapters_changes(hermes_dir, tmp_path):
    """--merge: the merged model equals the base with the mean of the adapters' weight changes
    (built here independently: each adapter merged into the base, state dicts averaged)."""
    from peft import PeftModel
    from trainers.router import merged_policy
    make_adapters(hermes_dir, tmp_path / "adapters")
    merged = merged_policy(hermes_dir, tmp_path / "adapters")
    assert "merged(a_orders, b_checks)" in merged.name
    states = []
    for name in ("a_orders", "b_checks"):
        m = PeftModel.from_pretrained(load_policy(hermes_dir).model, str(tmp_path / "adapters" / name))
        states.append(m.merge_and_unload().state_dict())
    expected = load_policy(hermes_dir).model
    expected.load_state_dict({k: (states[0][k] + states[1][k]) / 2 for k in states[0]})
    base = load_policy(hermes_dir).model
    ids = torch.tensor([merged.encode("Extend my laptop loan by 3 days.")])
    with torch.no_grad():
        got, want, plain = (m(input_ids=ids).logits for m in (merged.model, expected, base))
    assert not torch.allclose(want, plain, atol=1e-4)  # the adapters do change the model
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
