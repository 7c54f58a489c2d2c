"""trainers.grpo: advantages, masks and the clipped loss on built examples; real GRPO runs of a
tiny local model (CPU, one thread) against a trivially learnable env in a process sandbox:
only the adapter changes, the mean reward rises, a resumed run equals an uninterrupted one."""
from __future__ import annotations

import json
import math

import pytest

from tests.trainers_fixtures import env_dir, hermes_dir, model_root  # noqa: F401

import torch  # noqa: E402

from envforge.errors import UsageError  # noqa: E402
from trainers.grpo import (GRPOConfig, GRPOTrainer, add_adapter, batch_tensors, clipped_loss,  # noqa: E402
                           group_advantages, is_constant, lr_share, token_logprobs)
from trainers.policy import load_policy  # noqa: E402
from trainers.rollout import Episode, EnvFactory, run_episodes  # noqa: E402

# LoRA on lm_head too: the tiny random model's output layer has tiny weights (init std 0.02), so
# adapters on the hidden layers alone move its logits too slowly for a test of a few dozen steps.
TEST_CONFIG = dict(lora_rank=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "lm_head"],
                   num_groups=2, group_size=4, learning_rate=2e-2, max_new_tokens=8, threads=1,
                   backend="process", pool_size=8, seed=0, env_seed_key=7)  # a named key: runs compare


def test_group_advantages_on_built_examples():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5], eps=0.0)
    std = (0.5 / 3) ** 0.5  # sample std of the group
    assert adv == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0])
    assert sum(adv) == pytest.approx(0.0)
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert is_constant([0.3, 0.3, 0.3]) and not is_constant([0.3, 0.31])


def test_masks_and_padding_on_built_episodes():
    a = Episode(seed=0, tokens=[5, 6, 7, 8, 9], mask=[0, 0, 1, 1, 0])
    b = Episode(seed=0, tokens=[5, 6, 7], mask=[0, 1, 1])
    ids, attn, loss_mask = batch_tensors([a, b], pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert loss_mask.tolist() == [[0, 0, 1, 1, 0], [0, 1, 1, 0, 0]]


def test_logprobs_at_the_scored_tokens_alone_equal_those_of_every_position(hermes_dir, monkeypatch, capfd):
    """token_logprobs with a mask computes the vocabulary's logits at the scored positions only
    (transformers' logits_to_keep): the same values and gradients as from every position's, on
    the base model and through a LoRA adapter; a model whose forward does not take the mask
    gets every position's, sliced."""
    from trainers import grpo
    from sandbox import base
    monkeypatch.setattr(grpo, "_KEEPS_MASK", {})
    monkeypatch.setattr(base, "_WARNED", set())
    policy = load_policy(hermes_dir)
    a = Episode(seed=0, tokens=[5, 6, 7, 8, 9, 10, 11], mask=[0, 0, 1, 1, 0, 1, 1])
    b = Episode(seed=0, tokens=[5, 9, 7, 6], mask=[0, 1, 1, 0])
    ids, attn, mask = batch_tensors([a, b], policy.pad_id)
    m = mask[:, 1:]
    peft = add_adapter(load_policy(hermes_dir).model, GRPOConfig(lora_rank=4))
    with torch.no_grad():  # a trained adapter, not the zero one a fresh B starts as
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)

    class Plain(torch.nn.Module):  # the forward of older or custom code: no logits_to_keep
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)
    for model in (policy.model, peft, Plain(policy.model)):
        full = token_logprobs(model, ids, attn)
        (full * m).sum().backward()
        want = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        model.zero_grad()
        kept = token_logprobs(model, ids, attn, m)
        (kept * m).sum().backward()
        got = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        model.zero_grad()
        assert torch.allclose(kept, full * m, atol=1e-5) and (kept[m == 0] == 0).all()
        assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want))
    llama = type(policy.model)
    assert grpo._KEEPS_MASK == {(llama, llama): True, (type(peft), llama): True, (Plain, Plain): False}
    assert capfd.readouterr().err.count("Plain's forward does not take logits_to_keep as a mask") == 1


def test_clipped_loss_on_built_tensors():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss = clipped_loss(logp, old, torch.tensor([1.0]), mask, 0.2, 0.28)
    # positive advantage: ratio 1.5 clipped to 1.28 (no gradient), 0.5 kept; token 3 masked
    assert float(loss) == pytest.approx(-(1.28 + 0.5))
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.5, 0.0])
    # negative advantage: min picks the larger penalty, the unclipped 1.5
    loss = clipped_loss(logp.detach(), old, torch.tensor([-1.0]), mask, 0.2, 0.28)
    assert float(loss) == pytest.approx(1.5 + 0.8)


def test_config_errors_name_the_setting():
    with pytest.raises(UsageError, match="GRPOConfig.group_size must be at least 2"):
        GRPOConfig(group_size=1)
    with pytest.raises(UsageError, match="GRPOConfig.temperature"):
        GRPOConfig(temperature=0)
    with pytest.raises(UsageError, match="GRPOConfig.backend must be one of auto, process"):
        GRPOConfig(backend="podman")
    c = GRPOConfig()
    assert (c.lora_rank, c.num_groups, c.group_size, c.learning_rate, c.iterations) == (32, 4, 4, 1e-5, 40)


def test_rollout_masks_only_the_policys_own_tokens(hermes_dir, env_dir):
    policy = load_policy(hermes_dir)
    torch.manual_seed(0)
    with EnvFactory(env_dir, size=2, backend="process") as factory:
        episodes = run_episodes(policy, factory, [3, 3], max_new_tokens=6)
    for ep in episodes:
        assert ep.error is None and ep.turns == 2 and len(ep.tokens) == len(ep.mask)
        spans, cur = [], []
        for t, m in zip(ep.tokens, ep.mask):
            if m:
                cur.append(t)
            elif cur:
                spans, cur = spans + [cur], []
        spans += [cur] if cur else []
        assert len(spans) == 2  # one per policy turn
        unmasked = policy.decode([t for t, m in zip(ep.tokens, ep.mask) if not m])
        assert "Answer briefly." in unmasked and "Again." in unmasked and "Say ok. 3" in unmasked
        for span in spans:
            assert "Again." not in policy.decode(span) and "<|im_start|>" not in policy.decode(span)
        assert ep.messages[-1]["role"] == "assistant" and ep.score == pytest.approx(ep.score)


def _train(hermes_dir, env_dir, out, iterations, **kw):
    cfg = GRPOConfig(**{**TEST_CONFIG, "iterations": iterations, **kw.pop("config", {})})
    trainer = GRPOTrainer(load_policy(hermes_dir), env_dir, cfg, out=out, **kw)
    return trainer, trainer.train()


def test_grpo_changes_only_the_adapter_weights(hermes_dir, env_dir, tmp_path):
    policy = load_policy(hermes_dir)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    trainer = GRPOTrainer(policy, env_dir, GRPOConfig(**{**TEST_CONFIG, "iterations": 2}), out=tmp_path)
    trainer.train()
    after = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
             for k, v in trainer.model.state_dict().items()}
    lora = {k: v for k, v in after.items() if "lora_" in k}
    assert lora and any(not torch.all(v == 0) for k, v in lora.items() if "lora_B" in k)
    for k, v in before.items():
        assert torch.equal(after[k], v), f"base weight {k} changed"
    assert all(("lora_" in n) == p.requires_grad for n, p in trainer.model.named_parameters())
    files = {p.name for p in tmp_path.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "manifest.json",
            "reward_curve.png"} <= files
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["capability"] == "brevity" and len(manifest["reward_curve"]) == 2
    assert len(manifest["env_hash"]) == 64 and manifest["config"]["lora_rank"] == 8
    assert (tmp_path / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_mean_reward_rises_on_a_learnable_env(hermes_dir, env_dir, tmp_path):
    _, result = _train(hermes_dir, env_dir, tmp_path, 30)
    curve = [h["reward_mean"] for h in result.history]
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    assert last > first + 0.2, curve
    assert all(h["tokens_per_s"] > 0 and 0 <= h["constant_fraction"] <= 1 for h in result.history)
    as_json = json.loads(json.dumps(result.to_dict()))  # the typed result, as JSON types
    assert as_json["history"] == result.history and as_json["out"] == str(result.out)


def test_resume_equals_an_uninterrupted_run(hermes_dir, env_dir, tmp_path):
    """A run stopped after 2 iterations and resumed is the run made in one go with its env
    seeds' key (drawn from the OS when it started, kept in the checkpoint)."""
    steps = []

    def crash(step):  # the progress protocol: a Step per iteration, its statistics as its record
        steps.append(step)
        if step.done == 2:
            raise KeyboardInterrupt
    drawn = {"env_seed_key": None}
    with pytest.raises(KeyboardInterrupt):
        _train(hermes_dir, env_dir, tmp_path / "b", 4, progress=crash, config=drawn)
    assert json.loads((tmp_path / "b" / "checkpoint" / "state.json").read_text())["iteration"] == 2
    assert [(s.done, s.total, s.record.iteration) for s in steps] == [(1, 4, 1), (2, 4, 2)]
    assert str(steps[0]).startswith(f"reward {steps[0].record.reward_mean:.3f}")
    key = json.loads((tmp_path / "b" / "checkpoint" / "state.json").read_text())["env_seed_key"]
    _, straight = _train(hermes_dir, env_dir, tmp_path / "a", 4, config={"env_seed_key": key})
    _, resumed = _train(hermes_dir, env_dir, tmp_path / "b", 4, config=drawn)
    assert resumed.manifest["env_seeds"] == straight.manifest["env_seeds"] == {
        "key": key, "drawn": straight.manifest["env_seeds"]["drawn"]}
    assert [h["reward_mean"] for h in resumed.history] == [h["reward_mean"] for h in straight.history]
    from safetensors.torch import load_file
    a, b = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # resuming a finished run keeps the checkpoint it loaded, and says where it resumed
    resumed_steps = []
    _, again = _train(hermes_dir, env_dir, tmp_path / "a", 4, progress=resumed_steps.append, config=drawn)
    assert [(s.text, s.done, s.total, s.record) for s in resumed_steps] == [
        ("resumed at iteration 4", 4, 4, None)]
    assert len(again.history) == 4 and (tmp_path / "a" / "checkpoint" / "state.json").is_file()


def test_env_seeds_are_drawn_per_run_from_the_audits_mix(hermes_dir, env_dir, tmp_path):
    """An env must not be able to tell training's seeds from the audit's: where a run's seeds
    counted up from 0, a flaw kept to [256, 4096) met nearly every seed of a long run and one
    audit seed in twelve. Each run draws a key of its own; its seeds are the audit's mix."""
    from envforge.contract import SMALL_SEEDS, training_seeds
    runs = [_train(hermes_dir, env_dir, tmp_path / str(i), 1, config={"env_seed_key": None})[1].manifest["env_seeds"]
            for i in range(2)]
    assert runs[0]["key"] != runs[1]["key"] and runs[0]["drawn"] >= 2
    assert training_seeds(runs[0]["key"], 0, 4) != training_seeds(runs[1]["key"], 0, 4)
    seeds = training_seeds(runs[0]["key"], 0, 4000)
    assert training_seeds(runs[0]["key"], 100, 5) == seeds[100:105]  # a resumed run's are the same
    small = sum(s < SMALL_SEEDS for s in seeds) / len(seeds)
    middle = sum(SMALL_SEEDS <= s < 4096 for s in seeds) / len(seeds)
    large = sum(s >= 10**6 for s in seeds) / len(seeds)
    assert 0.45 < small < 0.55 and 0.2 < large < 0.3 and 0.05 < middle < 0.12
    # the audit's 50 seeds hold [256, 4096) at about the rate a run does
    from envforge.gate.config import GateSettings
    from envforge.gate.dynamic import Draws
    audit = [s for p in range(40) for s in Draws(p, GateSettings()).seeds]
    assert abs(sum(SMALL_SEEDS <= s < 4096 for s in audit) / len(audit) - middle) < 0.04


def test_a_checkpoint_resumes_only_under_its_own_training_settings(hermes_dir, env_dir, tmp_path):
    """A run whose learning rate, KL weight or LoRA shape differ from its checkpoint's is told so
    (a resumed run would be two runs spliced), naming each; more iterations, another pool or
    micro-batch size resume, and so does a checkpoint that recorded no settings."""
    _train(hermes_dir, env_dir, tmp_path, 2)
    with pytest.raises(UsageError, match=r"other settings \(learning_rate \(--lr\) 0\.02, now 0\.01, "
                                         r"kl_coef \(--kl\) 0\.0, now 0\.1; "):
        _train(hermes_dir, env_dir, tmp_path, 2, config={"learning_rate": 1e-2, "kl_coef": 0.1})
    with pytest.raises(UsageError, match=r"lora_rank \(--rank\) 8, now 4.*--no-resume"):
        _train(hermes_dir, env_dir, tmp_path, 2, config={"lora_rank": 4})
    with pytest.raises(UsageError, match=r"env_seed_key 7, now 8; "):  # other env seeds
        _train(hermes_dir, env_dir, tmp_path, 2, config={"env_seed_key": 8})
    trainer, result = _train(hermes_dir, env_dir, tmp_path, 3, config={"pool_size": 4, "micro_batch_size": 2})
    assert trainer.resumed_at == 2 and len(result.history) == 3
    state = tmp_path / "checkpoint" / "state.json"  # a checkpoint from before settings were recorded
    state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if k != "config"}))
    trainer, result = _train(hermes_dir, env_dir, tmp_path, 4, config={"learning_rate": 1e-2})
    assert trainer.resumed_at == 3 and len(result.history) == 4
    # one made while env seeds counted up from 0: its iterations so far were on other seeds
    state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if k != "env_seed_key"}))
    with pytest.raises(UsageError, match=r"before training drew its env seeds .*--no-resume"):
        _train(hermes_dir, env_dir, tmp_path, 5)
    _, fresh = _train(hermes_dir, env_dir, tmp_path, 1, config={"lora_rank": 4}, resume=False)
    assert len(fresh.history) == 1


def test_lr_share_on_built_examples():
    assert [lr_share("constant", i, 4) for i in range(4)] == [1.0] * 4
    assert [lr_share("linear", i, 4) for i in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert [lr_share("cosine", i, 4) for i in (0, 2)] == [1.0, pytest.approx(0.5)]
    assert lr_share("cosine", 3, 4) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.75)))
    # a warm-up rises to the full rate, then the decay runs over the iterations after it
    assert [lr_share("linear", i, 6, warmup=2) for i in range(6)] == [
        pytest.approx(1 / 3), pytest.approx(2 / 3), 1.0, 0.75, 0.5, 0.25]
    assert lr_share("constant", 0, 6, warmup=2) == pytest.approx(1 / 3)
    # a rollout budget further along than the iterations moves the decay on; behind them, not
    assert lr_share("linear", 1, 10, done=0.5) == 0.5 and lr_share("linear", 5, 10, done=0.1) == 0.5
    assert lr_share("constant", 5, 10, done=0.9) == 1.0


def test_a_decaying_learning_rate_trains_at_its_schedule_and_resumes_on_it(hermes_dir, env_dir, tmp_path):
    """Each iteration trains at its share of the rate (in the history, and in the optimizer); a
    run stopped and resumed trains at the same rates to the same adapter; a checkpoint made at
    another schedule is refused; under a rollout budget the spent share moves the decay on."""
    linear = {"lr_schedule": "linear"}
    _, straight = _train(hermes_dir, env_dir, tmp_path / "a", 3, config=linear)
    assert [h["lr"] for h in straight.history] == pytest.approx([2e-2, 2e-2 * 2 / 3, 2e-2 / 3])

    def crash(step):
        if step.done == 1:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        _train(hermes_dir, env_dir, tmp_path / "b", 3, progress=crash, config=linear)
    trainer, resumed = _train(hermes_dir, env_dir, tmp_path / "b", 3, config=linear)
    assert trainer.resumed_at == 1 and [h["lr"] for h in resumed.history] == [h["lr"] for h in straight.history]
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(2e-2 / 3)
    from safetensors.torch import load_file
    a, b = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(UsageError, match=r"lr_schedule 'linear', now 'cosine'"):
        _train(hermes_dir, env_dir, tmp_path / "b", 3, config={"lr_schedule": "cosine"})
    with pytest.raises(UsageError, match=r"iterations 3, now 4"):  # a decay is over the run's length
        _train(hermes_dir, env_dir, tmp_path / "b", 4, config=linear)
    state = tmp_path / "b" / "checkpoint" / "state.json"  # one made before the schedule was a setting
    old = json.loads(state.read_text())
    old["config"] = {k: v for k, v in old["config"].items() if k not in ("lr_schedule", "warmup_iterations")}
    state.write_text(json.dumps(old))
    with pytest.raises(UsageError, match=r"lr_schedule 'constant', now 'linear'"):
        _train(hermes_dir, env_dir, tmp_path / "b", 3, config=linear)
    # a constant rate stays the configured one, in the optimizer too
    trainer, flat = _train(hermes_dir, env_dir, tmp_path / "c", 2)
    assert [h["lr"] for h in flat.history] == [2e-2, 2e-2] and trainer.optimizer.param_groups[0]["lr"] == 2e-2
    # a budget of 40 rollouts ends the decay sooner than 50 iterations would; a warm-up of 2
    # rises to the full rate, and the decay spans what is left of the budget after it
    _, budget = _train(hermes_dir, env_dir, tmp_path / "d", 50,
                       config={**linear, "max_rollouts": 40, "warmup_iterations": 2})
    spent = [sum(h["episodes"] for h in budget.history[:i]) for i in range(len(budget.history))]
    warm = spent[2]
    assert [h["lr"] for h in budget.history] == pytest.approx(
        [2e-2 / 3, 2e-2 * 2 / 3] + [2e-2 * (1 - max((i - 2) / 48, (s - warm) / (40 - warm)))
                                    for i, s in enumerate(spent) if i >= 2])
    assert budget.history[2]["lr"] == 2e-2 and 0 < budget.history[-1]["lr"] < 2e-2 * 0.7
    # a budget decided while the run goes leaves its length unknown: a decay is refused there
    with pytest.raises(UsageError, match=r"budget decided while the run goes.*max_rollouts"):
        GRPOTrainer(load_policy(hermes_dir), env_dir, GRPOConfig(**{**TEST_CONFIG, **linear}),
                    out=tmp_path / "e", budget=lambda: (20, True))


def test_a_rollout_budget_stops_the_run_at_the_iteration_that_reaches_it(hermes_dir, env_dir, tmp_path):
    # 2 groups x 4 = 8 rollouts an iteration at least (more where constant groups are re-collected)
    steps = []
    _, result = _train(hermes_dir, env_dir, tmp_path / "a", 50, config={"max_rollouts": 20},
                       progress=steps.append)
    counts = [h["episodes"] for h in result.history]
    assert sum(counts[:-1]) < 20 <= sum(counts) and len(counts) < 50
    # progress counts toward the iteration the budget will end at, not the 50 allowed
    assert steps[-1].done == steps[-1].total == len(counts) and all(s.total < 50 for s in steps)
    assert result.manifest["iterations"] == len(counts)


def test_a_budget_decided_while_the_run_goes_makes_the_run_its_final_number_makes(hermes_dir, env_dir,
                                                                                  tmp_path, monkeypatch):
    """A budget raised as another run trains (GRPOTrainer's ``budget``): an iteration starts only
    while fewer rollouts than allowed so far are spent, the run waits when it has spent them
    all, and it ends where ``max_rollouts`` = the final number ends it, every iteration and
    weight the same, its last iteration checkpointed."""
    from trainers import grpo
    alone, done = _train(hermes_dir, env_dir, tmp_path / "alone", 50, config={"max_rollouts": 30})
    levels, waits, began = [10, 20, 25], [], []

    def budget():
        """Allowed so far: a level, raised only while the run waits (below); final at 30."""
        return (levels[0], False) if levels else (30, True)

    def pause():  # the run has spent all it may and waits: the deciding side raises the budget
        waits.append(trainer.rollouts_spent())
        levels.pop(0)
    monkeypatch.setattr(grpo, "_pause", pause)

    def iterate(factory, executor, _real=GRPOTrainer.iterate):
        began.append((trainer.rollouts_spent(), trainer.budget()[0]))
        return _real(trainer, factory, executor)
    trainer = GRPOTrainer(load_policy(hermes_dir), env_dir,
                          GRPOConfig(**{**TEST_CONFIG, "iterations": 50}), out=tmp_path / "late",
                          budget=budget)
    monkeypatch.setattr(trainer, "iterate", iterate)
    result = trainer.train()
    assert len(waits) == 3 and all(w >= level for w, level in zip(waits, [10, 20, 25]))
    assert all(spent < known for spent, known in began)
    assert [h["episodes"] for h in result.history] == [h["episodes"] for h in done.history]
    assert result.manifest["reward_curve"] == done.manifest["reward_curve"]
    late = trainer.model.state_dict()
    assert all(torch.equal(v, late[k]) for k, v in alone.model.state_dict().items())
    state = json.loads((tmp_path / "late" / "checkpoint" / "state.json").read_text())
    assert state["iteration"] == len(done.history)
    assert json.loads((tmp_path / "late" / "manifest.json").read_text())["config"]["max_rollouts"] == 30


def test_the_expected_length_under_a_budget_follows_the_recent_iterations(hermes_dir, env_dir, tmp_path):
    """Iterations collect more rollouts as groups turn constant (collected again): the estimate of
    where the budget ends follows the last iterations, and moves only when 10% off."""
    trainer = GRPOTrainer(load_policy(hermes_dir), env_dir,
                          GRPOConfig(**{**TEST_CONFIG, "iterations": 50, "max_rollouts": 200}),
                          out=tmp_path)

    def after(*episodes):
        trainer.history += [{"episodes": n} for n in episodes]
        trainer.iteration = len(trainer.history)
        return trainer.expected_iterations()
    assert after(8, 8, 8) == 3 + 22           # 176 left at 8 an iteration
    assert after(8) == 25                      # on course: kept
    assert after(9) == 25                      # 12% more an iteration, under 10% off: kept
    assert after(16, 16, 16) == 8 + 8          # 111 left at 14.25 (9, 16, 16, 16): moved
    assert after(*[16] * 7) == 15              # the last iteration: the budget is spent
    assert trainer.rollouts_spent() >= 200


def test_a_frozen_adapter_is_refused_with_the_fix(hermes_dir, env_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    get_peft_model(load_policy(hermes_dir).model,
                   LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(tmp_path / "adapter")
    policy = load_policy(hermes_dir, adapter=tmp_path / "adapter")  # loaded frozen
    with pytest.raises(UsageError, match="no trainable parameters.*pass the base model"):
        GRPOTrainer(policy, env_dir, GRPOConfig(**TEST_CONFIG), out=tmp_path / "out")


def test_env_steps_overlap_generation(hermes_dir, env_dir, monkeypatch):
    """Two lanes take turns: one lane's env steps run on the pool while the policy generates for
    the other lane. Recorded intervals must overlap (a lockstep loop never overlaps them)."""
    import time as _time

    import trainers.rollout as rollout

    policy = load_policy(hermes_dir)
    spans = {"env": [], "gen": []}
    step, generate = rollout._step_lane, policy.generate

    def timed_step(live, actions):
        t = _time.perf_counter()
        _time.sleep(0.05)  # a slow env step, on the host side of the sandbox calls
        out = step(live, actions)
        spans["env"].append((t, _time.perf_counter()))
        return out

    def timed_generate(*a, **k):
        t = _time.perf_counter()
        out = generate(*a, **k)
        spans["gen"].append((t, _time.perf_counter()))
        return out

    monkeypatch.setattr(rollout, "_step_lane", timed_step)
    monkeypatch.setattr(policy, "generate", timed_generate)
    with EnvFactory(env_dir, size=4, backend="process") as factory:
        episodes = run_episodes(policy, factory, [1, 1, 2, 2], max_new_tokens=4)
    assert all(ep.error is None for ep in episodes)
    assert len(spans["gen"]) >= 2 and spans["env"]
    overlaps = [(e, g) for e in spans["env"] for g in spans["gen"] if e[0] < g[1] and g[0] < e[1]]
    assert overlaps, f"no env step ran during a generation: {spans}"


def test_a_checkpoint_stopped_between_its_two_renames_is_resumed(hermes_dir, env_dir, tmp_path):
    """save_checkpoint moves the last checkpoint aside, then the new one in: stopped in between,
    only checkpoint.old holds the run, and resuming must find it there."""
    first, _ = _train(hermes_dir, env_dir, tmp_path, 2)
    assert first.resumed_at is None
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.old")
    trainer, result = _train(hermes_dir, env_dir, tmp_path, 3)
    assert trainer.resumed_at == 2 and len(result.history) == 3
    assert not (tmp_path / "checkpoint.old").exists()
