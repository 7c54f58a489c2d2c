"""trainers.parallel and `train --jobs`: adapters trained at once in spawned processes equal the
adapters trained one after another; the batch's progress counts every job's iterations; a
failing job does not stop the others and its error names it; Ctrl-C stops every job and says
where each checkpoint is. Real processes, a real tiny model, real sandboxes."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.trainers_fixtures import env_dir, hermes_dir, model_root  # noqa: F401

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from trainers.grpo_config import GRPOConfig  # noqa: E402
from trainers.parallel import Job, JobFailed, run_many, train_many  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = dict(lora_rank=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], num_groups=2,
              group_size=4, learning_rate=2e-2, max_new_tokens=8, threads=1, backend="process",
              pool_size=4, iterations=3, env_seed_key=7)  # a named key: runs compare


def jobs(model, env, out: Path, seeds=(0, 1)) -> list[Job]:
    return [Job(f"s{s}", str(model), str(env), str(out / f"s{s}"), GRPOConfig(**CONFIG, seed=s))
            for s in seeds]


def test_two_processes_make_the_adapters_one_after_another_makes(hermes_dir, env_dir, tmp_path):
    steps = []
    alone = train_many(jobs(hermes_dir, env_dir, tmp_path / "a"), workers=1)
    both = train_many(jobs(hermes_dir, env_dir, tmp_path / "b"), workers=2, progress=steps.append)
    for x, y in zip(alone, both):
        assert x["reward_curve"] == y["reward_curve"] and x["rollouts"] == y["rollouts"]
    # each job of the second batch ran in a process of its own, at the same time
    assert "pid" not in alone[0] and len({os.getpid(), *(r["pid"] for r in both)}) == 3
    for name in ("s0", "s1"):
        a, b = (load_file(str(tmp_path / d / name / "adapter_model.safetensors")) for d in "ab")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the two seeds differ, so equal adapters are no accident of the env
    s0, s1 = (load_file(str(tmp_path / "a" / n / "adapter_model.safetensors")) for n in ("s0", "s1"))
    assert any(not torch.equal(s0[k], s1[k]) for k in s0)
    # progress: each iteration's record, tagged with its job, counted over the batch (3 + 3)
    counted = [s for s in steps if s.record is not None]
    assert {s.item for s in counted} == {"s0", "s1"} and len(counted) == 6
    assert [s.done for s in counted] == list(range(1, 7)) and {s.total for s in counted} == {6}


def test_a_failing_job_is_named_and_the_others_finish(hermes_dir, env_dir, tmp_path):
    bad = tmp_path / "missing_env"
    batch = jobs(hermes_dir, env_dir, tmp_path / "out", seeds=(0,))
    batch.insert(0, Job("broken", str(hermes_dir), str(bad), str(tmp_path / "out" / "broken"),
                        GRPOConfig(**CONFIG)))
    with pytest.raises(JobFailed) as e:
        train_many(batch, workers=2)
    assert str(e.value).startswith("training broken failed: ") and "finished: s0" in str(e.value)
    assert e.value.exit_code == 2  # the missing env's own error: an input error
    assert (tmp_path / "out" / "s0" / "adapter_model.safetensors").is_file()


@dataclass
class Item:
    name: str
    out: str


def work(item: Item, progress) -> dict:
    """A job for run_many (module-level: a spawned process imports it)."""
    if item.name == "bad":
        raise RuntimeError("boom")
    return {"name": item.name}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_crashing_job_is_one_line_and_its_traceback_a_file(tmp_path, workers):
    items = [Item("bad", str(tmp_path / "bad")), Item("good", str(tmp_path / "good"))]
    with pytest.raises(JobFailed) as e:
        run_many(work, items, workers, what="running")
    log = tmp_path / "bad" / "crash.log"
    assert str(e.value) == f"running bad failed: RuntimeError: boom (traceback in {log}) (finished: good)"
    assert e.value.exit_code == 1 and "Traceback" in log.read_text() and "boom" in log.read_text()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_caller_hears_of_each_job_as_it_ends(tmp_path, workers):
    """run_many's ``ended``: each job's name and result (None for a failure), once, as it ends."""
    items = [Item("bad", str(tmp_path / "bad")), Item("good", str(tmp_path / "good"))]
    heard = []
    with pytest.raises(JobFailed):
        run_many(work, items, workers, ended=lambda name, result: heard.append((name, result)))
    assert sorted(name for name, _ in heard) == ["bad", "good"]
    assert dict(heard)["bad"] is None and dict(heard)["good"]["name"] == "good"


def test_a_rollout_budget_file_reads_back_whole(tmp_path):
    from trainers.parallel import RolloutBudget
    budget = RolloutBudget(tmp_path / "b" / "budget.json")
    assert budget() == (0, False)  # none written yet: nothing allowed, more to come
    budget.set(40)
    assert RolloutBudget(budget.path)() == (40, False)
    budget.set(72, final=True)
    assert budget() == (72, True) and not list(budget.path.parent.glob("*.tmp"))


def test_jobs_need_their_own_out_folders(hermes_dir, env_dir, tmp_path):
    batch = jobs(hermes_dir, env_dir, tmp_path)
    batch[1].out = batch[0].out
    with pytest.raises(ValueError, match="its own out folder"):
        train_many(batch, workers=2)


def _second_env(env_dir: Path, tmp_path: Path) -> Path:
    other = tmp_path / "envs" / "brevity_two"
    other.mkdir(parents=True)
    for f in env_dir.iterdir():
        if f.is_file():
            (other / f.name).write_bytes(f.read_bytes())
    return other


@pytest.mark.parametrize("to", ["group", "parent"])
def test_train_jobs_on_the_command_line_and_ctrl_c(hermes_dir, env_dir, tmp_path, to):
    """`train A B --jobs 2`: both adapters; Ctrl-C stops both jobs, each checkpoint is named, and
    the same command resumes them. Ctrl-C as a terminal sends it (the whole process group), or
    SIGINT to the command alone (it passes it on to its jobs)."""
    other = _second_env(env_dir, tmp_path)
    args = [sys.executable, "-m", "envforge", "train", str(env_dir), str(other), "--model", str(hermes_dir),
            "--out", str(tmp_path / "adapters"), "--groups", "1", "--group-size", "2", "--rank", "4",
            "--max-new-tokens", "4", "--threads", "1", "--backend", "process", "--jobs", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(args + ["--iterations", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, cwd=tmp_path, start_new_session=True)
    seen = set()
    try:
        for line in p.stderr:  # [done/total] slug: reward ...: wait until both jobs have iterated
            m = re.match(r"\[\d+/200000\] (brevity\w*): ", line)
            if m:
                seen.add(m.group(1))
            if seen == {"brevity", "brevity_two"}:
                break
        (os.killpg if to == "group" else os.kill)(p.pid, signal.SIGINT)
        try:
            out, err = p.communicate(timeout=50)
        except subprocess.TimeoutExpired:  # a job that cannot end is killed only after UNWIND_S (60 s)
            pytest.fail("train --jobs 2 did not stop within 50 s of Ctrl-C")
    finally:
        p.kill()
    assert p.returncode == 130, err
    assert "Traceback" not in err
    done, keys = {}, {}
    for slug in ("brevity", "brevity_two"):
        checkpoint = tmp_path / "adapters" / slug / "checkpoint"
        done[slug] = json.loads((checkpoint / "state.json").read_text())["iteration"]
        keys[slug] = json.loads((checkpoint / "state.json").read_text())["env_seed_key"]
        assert f"{slug}: interrupted: {checkpoint} holds {done[slug]} finished iteration(s)" in err, err
    r = subprocess.run(args + ["--iterations", str(max(done.values()) + 1)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(f"adapters/{slug} (resumed at iteration {n}; " in r.stdout for slug, n in done.items()), r.stdout
    # each job drew its env seeds' key and went on with it
    assert keys["brevity"] != keys["brevity_two"]
    assert all(f"env seeds keyed {key})" in r.stdout for key in keys.values()), r.stdout
    assert all((tmp_path / "adapters" / s / "adapter_model.safetensors").is_file() for s in done)


def test_ctrl_c_while_the_jobs_start(hermes_dir, env_dir, tmp_path):
    """Ctrl-C while the jobs import (before they can take it): no traceback of theirs, and they
    are stopped soon after, not left training."""
    other = _second_env(env_dir, tmp_path)
    args = [sys.executable, "-m", "envforge", "train", str(env_dir), str(other), "--model", str(hermes_dir),
            "--out", str(tmp_path / "adapters"), "--groups", "1", "--group-size", "2", "--rank", "4",
            "--max-new-tokens", "4", "--threads", "1", "--backend", "process", "--jobs", "2",
            "--iterations", "100000"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    try:
        assert p.stdout.readline().startswith("train brevity, brevity_two -> ")  # the jobs start now
        time.sleep(0.05)  # the jobs import now (later, they take SIGINT themselves)
        os.killpg(p.pid, signal.SIGINT)
        try:
            out, err = p.communicate(timeout=50)
        except subprocess.TimeoutExpired:
            pytest.fail("train --jobs 2 did not stop within 50 s of a Ctrl-C while its jobs started")
    finally:
        p.kill()
    assert p.returncode == 130 and "Traceback" not in err, err
    assert "interrupted" in err, err


def test_train_jobs_usage_errors(hermes_dir, env_dir, tmp_path):
    base = [sys.executable, "-m", "envforge", "train", "--model", str(hermes_dir), "--out", str(tmp_path)]
    r = subprocess.run(base + [str(env_dir), str(env_dir), "--jobs", "2"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 2 and "more than once" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(base + [str(env_dir), "--jobs", "0"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "--jobs" in r.stderr
    other = _second_env(env_dir, tmp_path)
    r = subprocess.run(base + [str(env_dir), str(other), "--jobs", "2", "--executor", "ray"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "--jobs" in r.stderr and "Traceback" not in r.stderr


def _children(pid: int) -> list[int]:
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip() or 0) == pid:
            out.append(int(status.parent.name))
    return out


def test_jobs_stop_when_their_parent_is_killed(hermes_dir, env_dir, tmp_path):
    """The parent killed outright (no Ctrl-C handling, no atexit): each job stops as on Ctrl-C,
    its checkpoint kept, instead of training on, or hanging with its messages unread."""
    script = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from trainers.grpo_config import GRPOConfig
from trainers.parallel import Job, train_many
config = dict({CONFIG!r}, iterations=100000)
jobs = [Job(f"s{{s}}", {str(hermes_dir)!r}, {str(env_dir)!r}, {str(tmp_path)!r} + f"/s{{s}}",
            GRPOConfig(**config, seed=s)) for s in (0, 1)]
train_many(jobs, 2, progress=lambda step: step.record and print(step.item, step.done, flush=True))
"""
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    seen, jobs = set(), []

    def running(pid: int) -> bool:
        try:
            return "zombie" not in Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
    try:
        for line in p.stdout:  # wait until both jobs have made a checkpoint (every iteration here)
            seen.add(line.split()[0])
            if seen == {"s0", "s1"}:
                break
        jobs = _children(p.pid)  # the two jobs (and multiprocessing's resource tracker)
        assert len(jobs) >= 2
        p.kill()
        p.wait()
        deadline = time.monotonic() + 60
        while any(running(pid) for pid in jobs) and time.monotonic() < deadline:
            time.sleep(0.2)
        alive = [pid for pid in jobs if running(pid)]
        assert not alive, f"jobs {alive} still running 60 s after their parent was killed"
    finally:
        p.kill()
        for pid in jobs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for s in ("s0", "s1"):
        assert json.loads((tmp_path / s / "checkpoint" / "state.json").read_text())["iteration"] >= 1
