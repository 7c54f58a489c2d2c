"""Several adapters at once: ``train_many`` runs each env's GRPO training in a process of its own
(spawned: a fresh interpreter, no state shared with this one), ``workers`` at a time. Each run is
exactly the run ``GRPOTrainer`` makes alone (same config, seeds, checkpoints, resume), so the
adapters equal those of one run after another; only the wall time changes. On a CPU give each
run ``config.threads`` cores (``workers * threads`` at most the cores there are); on GPUs give
each job its own ``config.device`` if one device cannot hold them all.

Progress: each run's steps come back to ``progress`` with ``item`` set to the job's name, and
``done``/``total`` counting the iterations of all jobs (a job not begun counts its
``config.iterations``), so one count and one ETA cover the whole batch.
Ctrl-C: every running job saves nothing more and stops as it would alone (its checkpoint of the
last finished iteration stays); ``train_many`` then raises :class:`Interrupted`, naming them.
A job that fails does not stop the others: once all have ended, :class:`JobFailed` names the
first failure (its exit code is the failure's own).
"""
from __future__ import annotations

import multiprocessing
import os
import queue as queues
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envforge.errors import EnvforgeError
from envforge.progress import Progress, Step
from trainers.grpo_config import GRPOConfig

#: seconds the jobs get to stop on their own after Ctrl-C (they got it too, from the terminal)
#: before each is sent SIGINT, and then to unwind (save, close their sandboxes) before SIGKILL
STOP_S, UNWIND_S = 2.0, 60.0


@dataclass
class Job:
    """One adapter to train: what ``GRPOTrainer(load_policy(model), env, config, out, ...)`` takes."""
    name: str
    model: str
    env: str
    out: str
    config: GRPOConfig
    base_model: str | None = None
    resume: bool = True


class JobFailed(EnvforgeError):
    """A job's training failed; ``exit_code`` is that failure's."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class Interrupted(KeyboardInterrupt):
    """Ctrl-C reached ``train_many``; ``jobs`` are the jobs that had not finished."""

    def __init__(self, jobs: list[Job]):
        super().__init__(", ".join(j.name for j in jobs))
        self.jobs = jobs


def run_job(job: Job, progress: Progress | None = None) -> dict:
    """Train one job here, in this process: the adapter's summary (``out``, ``rollouts``,
    ``resumed_at``: the checkpoint's iteration or None, ``reward_curve``, ``seconds_per_iteration``)."""
    from trainers.grpo import GRPOTrainer
    from trainers.policy import load_policy
    policy = load_policy(job.model, device=job.config.device)
    trainer = GRPOTrainer(policy, job.env, job.config, out=job.out, base_model=job.base_model,
                          resume=job.resume, progress=progress)
    result = trainer.train()
    return {"out": str(job.out), "rollouts": trainer.rollouts_spent(), "resumed_at": trainer.resumed_at,
            "reward_curve": result.manifest["reward_curve"],
            "seconds_per_iteration": [h["seconds"] for h in result.history]}


def _child(i: int, job: Job, channel) -> None:
    """A job's process: its steps, then ("done", result) or why it did not finish."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if the parent ignores it
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
        result = run_job(job, lambda step: channel.put(("step", i, step)))
        channel.put(("done", i, result))
    except KeyboardInterrupt:
        channel.put(("interrupted", i, None))
    except EnvforgeError as e:
        channel.put(("error", i, (str(e), e.exit_code)))
    except BaseException as e:  # noqa: BLE001 (a crash: its type and message, the parent says which job)
        import traceback
        channel.put(("error", i, (f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}", 1)))


def train_many(jobs: list[Job], workers: int = 1, progress: Progress | None = None) -> list[dict]:
    """Train every job, ``workers`` at a time (1: here, one after the other, no process
    started); returns their results in the order of ``jobs``."""
    names = [j.name for j in jobs]
    if len(set(names)) != len(names) or len({str(Path(j.out).resolve()) for j in jobs}) != len(jobs):
        raise ValueError("train_many: every job needs its own name and its own out folder")
    count = _Count(progress, jobs)
    if workers <= 1 or len(jobs) <= 1:
        return [run_job(j, lambda step, name=j.name: count(name, step)) for j in jobs]
    ctx = multiprocessing.get_context("spawn")
    channel = ctx.Queue()
    results: dict[int, dict] = {}
    failed: dict[int, tuple[str, int]] = {}
    running: dict[int, Any] = {}
    todo = list(range(len(jobs)))
    try:
        while todo or running:
            while todo and len(running) < workers:
                i = todo.pop(0)
                running[i] = ctx.Process(target=_child, args=(i, jobs[i], channel), daemon=True,
                                         name=f"envforge-train-{jobs[i].name}")
                running[i].start()
            try:
                kind, i, value = channel.get(timeout=0.5)
            except queues.Empty:
                for i, p in list(running.items()):  # died without a word (killed, out of memory)
                    if not p.is_alive() and i not in results and i not in failed:
                        _drain(channel, count, jobs, results, failed)
                        if i not in results and i not in failed:
                            failed[i] = (f"its process died (exit code {p.exitcode})", 1)
                        p.join()
                        del running[i]
                continue
            _handle(kind, i, value, count, jobs, results, failed, running)
    except KeyboardInterrupt:
        left = [jobs[i] for i in sorted(running)] + [jobs[i] for i in todo]
        _stop(running, channel)
        raise Interrupted(left) from None
    if failed:
        i = min(failed)
        message, code = failed[i]
        done = [jobs[j].name for j in sorted(results)]
        raise JobFailed(f"training {jobs[i].name} failed: {message}"
                        + (f" (finished: {', '.join(done)})" if done else ""), code)
    return [results[i] for i in range(len(jobs))]


class _Count:
    """Sends a job's step on with its name as ``item`` and the batch's iterations as its count."""

    def __init__(self, progress: Progress | None, jobs: list[Job]):
        self.progress, self.done = progress, {j.name: 0 for j in jobs}
        self.total = {j.name: j.config.iterations for j in jobs}

    def __call__(self, name: str, step: Step) -> None:
        if self.progress is None:
            return
        if step.done is not None:
            self.done[name] = step.done
            self.total[name] = step.total or self.total[name]
            step = replace(step, done=sum(self.done.values()), total=sum(self.total.values()))
        self.progress(replace(step, item=name))


def _handle(kind, i, value, count, jobs, results, failed, running) -> None:
    if kind == "step":
        count(jobs[i].name, value)
        return
    if kind == "done":
        results[i] = value
    elif kind == "error":
        failed[i] = value
    else:  # "interrupted": a SIGINT meant for it alone (the parent got none)
        failed[i] = ("interrupted (its checkpoint stays; run again to resume)", 130)
    p = running.pop(i, None)
    if p is not None:
        p.join()


def _drain(channel, count, jobs, results, failed) -> None:
    """The messages a process sent before it died."""
    while True:
        try:
            kind, i, value = channel.get(timeout=0.2)
        except queues.Empty:
            return
        _handle(kind, i, value, count, jobs, results, failed, {})


def _stop(running: dict, channel) -> None:
    """After Ctrl-C: let the jobs stop (they got it from the terminal), else send it to them, and
    kill what has not unwound within UNWIND_S. The channel is read all the while: a job cannot
    end while what it sent is still unread."""
    def wait(seconds: float) -> None:
        end = time.monotonic() + seconds
        while any(p.is_alive() for p in running.values()) and time.monotonic() < end:
            try:
                channel.get(timeout=0.1)
            except queues.Empty:
                pass
    wait(STOP_S)
    for p in running.values():
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
    wait(UNWIND_S)
    for p in running.values():
        if p.is_alive():
            p.kill()
        p.join()
