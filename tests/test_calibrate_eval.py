"""trainers.calibrate and trainers.evaluate, and the train -> calibrate -> route -> eval commands
end to end on the example target's env (a tiny local model, process sandboxes, CPU)."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.trainers_fixtures import env_dir, hermes_dir, model_root  # noqa: F401

from click.testing import CliRunner  # noqa: E402

from envforge.cli import main  # noqa: E402
from envforge.errors import EnvforgeError, InputError  # noqa: E402
from tests.envfactory import GOOD_DIR  # noqa: E402
from trainers.calibrate import report  # noqa: E402
from trainers.evaluate import parse_seeds, read_task_texts, read_tasks, route_seeds  # noqa: E402
from trainers.rollout import Episode, mean_ci  # noqa: E402
from trainers.router import Route, find_adapters, routing_messages  # noqa: E402


def eps(scores):
    return [Episode(seed=0, score=s) for s in scores]


def test_calibration_report_on_built_groups():
    good = report(eps([0.0, 0.5, 1.0, 0.2] * 2), group_size=4)
    assert good.ok and good.metrics["constant_group_fraction"] == 0.0
    bad = report(eps([0.0] * 8 + [0.1, 0.0, 0.0, 0.0]), group_size=4)
    assert not bad.ok and bad.to_dict()["advice"] == bad.advice
    checks = {c["check"]: c for c in bad.checks}
    assert not checks["mean_reward"]["ok"] and "too hard" in checks["mean_reward"]["advice"]
    assert not checks["constant_groups"]["ok"] and "67% of groups" in checks["constant_groups"]["advice"]


def test_mean_ci():
    m = mean_ci([0.0, 1.0, 0.5, 0.5])
    assert m["mean"] == 0.5 and m["ci_low"] < 0.5 < m["ci_high"] and m["n"] == 4
    assert mean_ci([])["mean"] is None
    assert mean_ci([0.0, 0.0, 0.0, 1.0])["ci_low"] == 0.0  # a score's interval stays in [0, 1]
    assert mean_ci([-1.0, 0.0, -1.0, 0.0], clip=False)["ci_low"] < -0.5  # a difference's does not


def test_train_calibrate_route_eval_end_to_end(hermes_dir, tmp_path):
    run = CliRunner().invoke
    args = ["--model", str(hermes_dir), "--backend", "process", "--threads", "1", "--max-new-tokens", "6"]
    env = tmp_path / "envs" / GOOD_DIR.name  # the example env, with example tasks as synth --from writes
    shutil.copytree(GOOD_DIR, env)
    env_manifest = json.loads((env / "manifest.json").read_text())
    tasks = ["Reset my password, I am ravi.okafor@kestrel.example", "Grant me access to the VPN"]
    (env / "manifest.json").write_text(json.dumps({**env_manifest, "examples": tasks}))
    r = run(main, ["train", str(env), "--out", str(tmp_path / "adapters"), "--iterations", "2",
                   "--groups", "1", "--group-size", "2", "--rank", "4"] + args)
    assert r.exit_code == 0, r.output
    # a line per iteration (stderr): its reward, speed, where the time went, and the ETA
    lines = [line for line in r.stderr.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] for line in lines] == ["[1/2", "[2/2"], r.output
    assert all("reward " in line and "tok/s" in line and "constant groups" in line and "(generate "
               in line and "env wait " in line and "ETA " in line for line in lines), lines
    assert lines[-1].rstrip().endswith("ETA 0s")
    out = tmp_path / "adapters" / GOOD_DIR.name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["capability"] == "precondition verification" and manifest["iterations"] == 2
    # its env seeds' key, drawn for this run, is said (to replay it) and kept
    assert f"env seeds keyed {manifest['env_seeds']['key']})" in r.stdout
    [info] = find_adapters(tmp_path / "adapters")  # the router shows the examples beside the capability
    assert manifest["examples"] == info.examples == tasks
    assert f"   example: {tasks[0]}" in routing_messages("x", [info])[0]["content"]
    # a second run resumes from the checkpoint: nothing left to do
    r = run(main, ["train", str(env), "--out", str(tmp_path / "adapters"), "--iterations", "2",
                   "--groups", "1", "--group-size", "2", "--rank", "4"] + args)
    assert r.exit_code == 0 and "[2/2] resumed at iteration 2" in r.stderr, r.output
    assert f"env seeds keyed {manifest['env_seeds']['key']})" in r.stdout  # the checkpoint's

    r = run(main, ["calibrate", str(GOOD_DIR), "--groups", "1", "--group-size", "2", "--json"] + args)
    assert r.exit_code == 1, r.output  # a random model scores 0: not calibrated, and says so
    rep = json.loads(r.stdout)
    assert rep["metrics"]["episodes"] == 2 and rep["advice"]

    r = run(main, ["route", "--model", str(hermes_dir), "--adapters", str(tmp_path / "adapters"),
                   "--task", "Please reset my password"])
    assert r.exit_code == 0, r.output
    [d] = json.loads(r.stdout)
    assert d["choice"] in ("none", GOOD_DIR.name) and set(d["probabilities"]) == {"none", GOOD_DIR.name}

    r = run(main, ["eval", str(GOOD_DIR), "--seeds", "0-2", "--adapters", str(tmp_path / "adapters"),
                   "--examples", "1", "--json"] + args)
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["overall"]["n"] == 3 and len(res["routes"]) == 3 and res["per_skill"]

    r = run(main, ["eval", str(GOOD_DIR), "--seeds", "0,1", "--adapters", str(tmp_path / "adapters"),
                   "--merge", "--json"] + args)
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert f"merged({GOOD_DIR.name})" in res["policy"] and res["overall"]["n"] == 2
    assert "routes" not in res  # merged: one policy for every episode, no routing


@pytest.mark.parametrize("args,message", [
    (["--adapter", "a", "--adapters", "b"], "--adapter and --adapters conflict"),
    (["--merge"], "--merge needs --adapters"),
    (["--seeds", "0-x"], "want a range 'A-B'"),
    (["--seeds", "0-19,25"], "want a range 'A-B'"),
    (["--seeds", "x"], "want a range 'A-B'"),
    (["--seeds", "5-2"], "want a range 'A-B'"),
])
def test_eval_usage_errors_come_before_any_model_loads(args, message):
    r = CliRunner().invoke(main, ["eval", str(GOOD_DIR), "--model", "no-such-model"] + args)
    assert r.exit_code == 2 and message in r.output, r.output
    assert "Traceback" not in r.output


def test_an_unreadable_tasks_file_is_an_input_error(tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    for cmd in (["eval", "--tasks", missing], ["route", "--adapters", "x", "--tasks", missing]):
        r = CliRunner().invoke(main, cmd + ["--model", "no-such-model"])
        assert r.exit_code == 2 and "cannot read the task" in r.output, r.output
        assert "missing.jsonl" in r.output and "Traceback" not in r.output
    with pytest.raises(InputError, match="cannot read"):
        read_tasks(missing)
    (tmp_path / "bad.jsonl").write_text('{"env": "x", "seed": 1}\nnot json\n')
    with pytest.raises(InputError, match=r"bad.jsonl: want a JSON list or JSONL of \{"):
        read_tasks(tmp_path / "bad.jsonl")
    (tmp_path / "texts.txt").write_text('Reset my password\n{"task": "Grant VPN"}\n\n')
    assert read_task_texts(tmp_path / "texts.txt") == ["Reset my password", "Grant VPN"]
    assert parse_seeds("2-4") == [2, 3, 4] and parse_seeds("0,5,9") == [0, 5, 9]


def test_routing_resets_one_env_and_routes_a_failed_reset_to_none():
    """route_seeds: one env for every routing reset; the router sees the first user message in
    identify's example-task form; a reset error routes that seed to none and is recorded."""
    class Env:
        def reset(self, seed):
            if seed == 1:
                raise EnvforgeError("boom")
            return {"messages": [{"role": "system", "content": "s"},
                                 {"role": "user", "content": f"  task\n {seed} "}]}, {}

        def close(self):
            closed.append(True)

    class Factory:
        def make(self):
            made.append(True)
            return Env()

    class Router:
        def route(self, task):
            seen.append(task)
            return Route(task, "a", "1", {"none": 0.1, "a": 0.9})

    class Policy:
        router = Router()

    made, closed, seen, routes = [], [], [], []
    buckets = route_seeds(Policy(), Factory(), "e", [0, 1, 2], routes)
    assert buckets == {"a": [0, 2], "none": [1]} and seen == ["task 0", "task 2"]
    assert len(made) == 1 and len(closed) == 1
    assert routes[1] == {"env": "e", "seed": 1, "choice": "none", "probabilities": None,
                         "error": "reset: boom"}
    assert routes[0]["choice"] == "a" and "error" not in routes[0]


def test_ctrl_c_during_train_says_where_the_checkpoint_is_and_a_rerun_resumes(hermes_dir, env_dir, tmp_path):
    import os
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    args = [sys.executable, "-m", "envforge", "train", str(env_dir), "--model", str(hermes_dir),
            "--out", str(tmp_path / "adapters"), "--groups", "1", "--group-size", "2", "--rank", "4",
            "--max-new-tokens", "4", "--threads", "1", "--backend", "process"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    # iterations take ~20 ms here: far more than can finish before the signal, however late this
    # process reads the progress lines (under load, a 200-iteration run once ended first)
    p = subprocess.Popen(args + ["--iterations", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, cwd=tmp_path)
    try:
        for line in p.stderr:  # progress lines: [done/total] ..., at most one every Display.EVERY_S
            done_now = re.match(r"\[(\d+)/100000\] ", line)
            if done_now and int(done_now.group(1)) >= 2:
                break
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    checkpoint = tmp_path / "adapters" / "brevity" / "checkpoint"
    assert p.returncode == 130, err
    done = json.loads((checkpoint / "state.json").read_text())["iteration"]
    assert done >= 2 and err.endswith(
        f"interrupted: {checkpoint} holds {done} finished iteration(s); run the same command again "
        "to resume from there (--no-resume starts afresh)\n"), err
    assert "Traceback" not in err
    r = subprocess.run(args + ["--iterations", str(done + 1)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and f"resumed at iteration {done}" in r.stderr, r.stdout + r.stderr


def test_calibrate_and_evaluate_count_their_episodes_as_steps(hermes_dir):
    """The progress protocol (envforge.progress): a counted Step as each wave of episodes ends;
    evaluate's count runs on across the envs and routes of its tasks."""
    from trainers.calibrate import CalibrationConfig, calibrate
    from trainers.evaluate import EvalConfig, evaluate
    from trainers.policy import load_policy
    policy = load_policy(hermes_dir)
    steps = []
    calibrate(policy, GOOD_DIR, CalibrationConfig(groups=1, group_size=2, pool_size=1,
                                                  max_new_tokens=4, backend="process"),
              progress=steps.append)
    assert [(s.text, s.done, s.total) for s in steps] == [("episodes", 1, 2), ("episodes", 2, 2)]
    steps.clear()
    tasks = [{"env": str(GOOD_DIR), "seed": s} for s in range(3)]
    result = evaluate(policy, tasks, EvalConfig(pool_size=2, max_new_tokens=4, backend="process"),
                      progress=steps.append)
    assert [(s.done, s.total) for s in steps] == [(2, 3), (3, 3)] and result.overall["n"] == 3
