"""benchmarks/bench_transfer.py's bookkeeping on a made-up demo folder (no model is loaded: the
measuring itself is the evaluation code other tests cover)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_transfer", ROOT / "benchmarks" / "bench_transfer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demo_folder(root: Path, adapters: list[str], synth: list[tuple[str, str]], config: dict | None = None) -> Path:
    for name in adapters:
        (root / "adapters" / name).mkdir(parents=True)
        (root / "adapters" / name / "adapter_config.json").write_text("{}")
    (root / "grpo_target").mkdir(parents=True)
    (root / "grpo_target" / "adapter_config.json").write_text("{}")
    (root / "base_model").mkdir()
    for env, _ in synth:
        (root / "envs" / env).mkdir(parents=True)
        (root / "envs" / env / "env.py").write_text("")
    settings = {k: 1 for k in ("max_new_tokens", "temperature", "top_p", "pool_size", "seed")}
    config = {**settings, "backend": "process", "device": "cpu"} if config is None else config
    (root / "results.json").write_text(json.dumps({
        "config": config, "synth": [{"env": e, "verdict": v} for e, v in synth]}))
    return root


def test_methods_and_the_envs_the_gate_accepted(tmp_path, bench):
    run = demo_folder(tmp_path / "two", ["b_env", "a_env"], [("a_env", "accept"), ("bad", "reject")])
    assert list(bench.methods(run)) == ["base", "a_env", "b_env", "merged", "grpo_target"]
    assert bench.accepted_envs(run, json.loads((run / "results.json").read_text())) == [run / "envs" / "a_env"]
    assert bench.check_run(run) is None
    one = demo_folder(tmp_path / "one", ["a_env"], [("a_env", "accept")])
    assert list(bench.methods(one)) == ["base", "a_env", "grpo_target"]  # merged would be a_env again


def test_a_folder_it_cannot_measure_says_why(tmp_path, bench):
    assert "no readable results.json" in bench.check_run(tmp_path)
    none = demo_folder(tmp_path / "none", ["a_env"], [("a_env", "reject")])
    assert "no env its gate accepted" in bench.check_run(none)
    old = demo_folder(tmp_path / "old", ["a_env"], [("a_env", "accept")], config={"seed": 0})
    assert "lacks the settings" in bench.check_run(old) and "device" in bench.check_run(old)
    with pytest.raises(SystemExit) as e:
        bench.main([str(none)])
    assert e.value.code == 2


def test_the_paired_difference_is_seed_by_seed(bench):
    a = [{"seed": s, "score": x} for s, x in [(1, 1.0), (2, 1.0), (3, 0.0), (4, 1.0)]]
    b = [{"seed": s, "score": x} for s, x in [(4, 0.0), (3, 0.0), (2, 1.0), (1, 0.0)]]
    d = bench.paired(a, b)
    assert d["n"] == 4 and d["mean"] == pytest.approx(0.5)
    assert d["ci_low"] < 0.5 < d["ci_high"] and d["ci_low"] < 0  # not clipped to [0, 1]
    assert bench.paired(a, a)["mean"] == 0.0
