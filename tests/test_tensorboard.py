"""`envforge train --report-to tensorboard`: each iteration's metrics, under TRL's GRPO names,
in TensorBoard event files that TensorBoard's own reader reads back equal to the run's history."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.trainers_fixtures import env_dir, hermes_dir, model_root  # noqa: F401

pytest.importorskip("tensorboard", reason="tensorboard is not installed (train extra)")

from envforge.cli import main  # noqa: E402
from trainers.grpo import RUNS, TRACKED  # noqa: E402


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_report_to_tensorboard_logs_every_iteration(hermes_dir, env_dir, tmp_path):
    args = ["train", str(env_dir), "--model", str(hermes_dir), "--out", str(tmp_path), "--iterations",
            "2", "--groups", "2", "--group-size", "2", "--rank", "4", "--max-new-tokens", "6",
            "--kl", "0.1", "--backend", "process", "--threads", "1", "--report-to", "tensorboard"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    out = tmp_path / env_dir.name
    history = json.loads((out / "manifest.json").read_text())["history"]
    logged = scalars(out / RUNS)
    assert set(logged) == set(TRACKED)  # KL too: --kl > 0
    for tag, name in TRACKED.items():
        assert [s for s, _ in logged[tag]] == [1, 2], tag
        assert [v for _, v in logged[tag]] == pytest.approx([h[name] for h in history], rel=1e-5), tag
    assert all(h["kl"] is not None and h["kl"] >= 0 for h in history)
    assert all(0 <= h["clip_ratio"] <= 1 for h in history)
    assert all(h["completion_length"] > 0 for h in history)


def test_report_to_none_writes_no_event_files(hermes_dir, env_dir, tmp_path):
    args = ["train", str(env_dir), "--model", str(hermes_dir), "--out", str(tmp_path), "--iterations",
            "1", "--groups", "1", "--group-size", "2", "--rank", "4", "--max-new-tokens", "4",
            "--backend", "process", "--threads", "1"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert not (tmp_path / env_dir.name / RUNS).exists()
    [h] = json.loads((tmp_path / env_dir.name / "manifest.json").read_text())["history"]
    assert h["kl"] is None  # no KL term: nothing to log (as TRL)


def test_report_to_something_else_is_a_usage_error(hermes_dir, env_dir, tmp_path):
    r = CliRunner().invoke(main, ["train", str(env_dir), "--model", str(hermes_dir), "--out",
                                  str(tmp_path), "--report-to", "wandb"])
    assert r.exit_code == 2 and "--report-to" in r.output and "wandb" in r.output, r.output
