"""Several adapters at once: ``train_many`` runs each env's GRPO training in a process of its own
(spawned: a fresh interpreter, no state shared with this one), ``workers`` at a time. Each run is
exactly the run ``GRPOTrainer`` makes alone (same config, seeds, checkpoints, resume), so the
adapters equal those of one run after another where ``env_seed_key`` is named (unset, each run
draws its own env seeds either way); only the wall time changes. On a CPU give each
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

import json
import multiprocessing
import os
import queue as queues
import signal
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

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
    budget: str | None = None  # a RolloutBudget's file: rollouts decided while the job trains


class RolloutBudget:
    """A rollout budget decided while a job trains (``GRPOTrainer``'s ``budget``), kept in a
    file: the deciding process ``set``s the rollouts allowed so far and whether that number is
    final; the job reads it (a call answers ``(rollouts, final)``; no file yet: ``(0, False)``).
    Written whole (a temporary file renamed over it), so a reader never sees half of one."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def set(self, rollouts: int, final: bool = False) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"rollouts": int(rollouts), "final": bool(final)}))
        os.replace(tmp, self.path)

    def __call__(self) -> tuple[int, bool]:
        try:
            d = json.loads(self.path.read_text())
        except FileNotFoundError:
            return 0, False
        return d["rollouts"], d["final"]


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
    ``resumed_at``: the checkpoint's iteration or None, ``reward_curve``, ``env_seeds``: the
    manifest's key and count, ``seconds_per_iteration``)."""
    from trainers.grpo import GRPOTrainer
    from trainers.policy import load_policy
    policy = load_policy(job.model, device=job.config.device)
    trainer = GRPOTrainer(policy, job.env, job.config, out=job.out, base_model=job.base_model,
                          resume=job.resume, progress=progress,
                          budget=RolloutBudget(job.budget) if job.budget else None)
    result = trainer.train()
    return {"out": str(job.out), "rollouts": trainer.rollouts_spent(), "resumed_at": trainer.resumed_at,
            "reward_curve": result.manifest["reward_curve"], "env_seeds": result.manifest["env_seeds"],
            "seconds_per_iteration": [h["seconds"] for h in result.history]}


def _child(i: int, fn: Callable, job: Any, channel) -> None:
    """A job's process: its steps, then ("done", result) or why it did not finish. The first
    SIGINT stops the run as Ctrl-C stops ``GRPOTrainer`` (its checkpoint stays); later ones are
    ignored, so that unwinding (closing the sandboxes) is not cut short. A parent that dies
    (killed, out of memory) gets its job stopped the same way, its last messages dropped."""
    from multiprocessing import connection, parent_process

    def first(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, first)  # it started ignored (see _Batch.processes): now it stops the job
    orphan = threading.Event()

    def watch(sentinel) -> None:
        connection.wait([sentinel])
        orphan.set()
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=watch, args=(parent_process().sentinel,), daemon=True).start()
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
        result = fn(job, lambda step: channel.put(("step", i, step)))
        message = ("done", i, {**result, "pid": os.getpid()})
    except KeyboardInterrupt:
        message = ("interrupted", i, None)
    except BaseException as e:  # noqa: BLE001 (the parent says which job)
        message = ("error", i, _failure(job, e))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if orphan.is_set():
        channel.cancel_join_thread()  # nobody reads: exit without waiting to flush
    else:
        channel.put(message)


def _failure(job: Any, e: BaseException) -> tuple[str, int]:
    """A job's failure as (one line for a person, exit code): envforge's own errors as they are;
    a crash (a bug) as its type and message, its traceback in the job's out folder if it has one."""
    if isinstance(e, EnvforgeError):
        return str(e), e.exit_code
    import traceback
    where = ""
    out = getattr(job, "out", None)
    if out:
        try:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "crash.log").write_text(traceback.format_exc())
            where = f" (traceback in {Path(out) / 'crash.log'})"
        except OSError:
            pass
    return f"{type(e).__name__}: {e}{where}", 1


def train_many(jobs: list[Job], workers: int = 1, progress: Progress | None = None) -> list[dict]:
    """Train every job, ``workers`` at a time (1: here, one after the other, no process
    started); returns their results in the order of ``jobs``."""
    names = [j.name for j in jobs]
    if len(set(names)) != len(names) or len({str(Path(j.out).resolve()) for j in jobs}) != len(jobs):
        raise ValueError("train_many: every job needs its own name and its own out folder")
    return run_many(run_job, jobs, workers, _Count(progress, jobs), "training")


def run_many(fn: Callable[[Any, Progress], dict], jobs: list, workers: int = 1,
             progress: Callable[[str, Step], None] | None = None, what: str = "running",
             ended: Callable[[str, dict | None], None] | None = None) -> list[dict]:
    """``fn(job, progress)`` for every job, ``workers`` at a time in spawned processes (1: here),
    with ``train_many``'s handling of progress, failures and Ctrl-C: the machinery under it, for
    any work of that shape (``fn`` a module-level function, each job picklable with a ``name``).
    ``progress`` gets (the job's name, its step); ``ended`` (the job's name, its result or None
    when it failed) as each job ends, while the others run; ``what`` begins a failure's message."""
    if progress is None:
        progress = lambda name, step: None  # noqa: E731
    batch = _Batch(fn, jobs, progress, what, ended)
    if workers <= 1 or len(jobs) <= 1:
        batch.here()
    else:
        batch.processes(workers)
    return batch.outcome()


class _Batch:
    """The jobs' state: results and failures by job index, the processes running."""

    def __init__(self, fn: Callable, jobs: list, count: Callable[[str, Step], None], what: str,
                 ended: Callable[[str, dict | None], None] | None = None):
        self.fn, self.jobs, self.count, self.what = fn, jobs, count, what
        self.ended = ended or (lambda name, result: None)
        self.results: dict[int, dict] = {}
        self.failed: dict[int, tuple[str, int]] = {}
        self.running: dict[int, Any] = {}
        self.channel = None

    def here(self) -> None:
        for i, job in enumerate(self.jobs):
            try:
                self.results[i] = self.fn(job, lambda step, name=job.name: self.count(name, step))
            except KeyboardInterrupt:
                raise Interrupted(self.jobs[i:]) from None
            except Exception as e:  # noqa: BLE001 (as a job's process reports it)
                self.failed[i] = _failure(job, e)
            self.ended(job.name, self.results.get(i))

    def processes(self, workers: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.channel = ctx.Queue()
        todo = list(range(len(self.jobs)))
        try:
            while todo or self.running:
                while todo and len(self.running) < workers:
                    i = todo[0]
                    process = ctx.Process(target=_child, daemon=True, name=f"envforge-{self.jobs[i].name}",
                                          args=(i, self.fn, self.jobs[i], self.channel))
                    # the job starts with SIGINT ignored (inherited across exec; a mask is not):
                    # a Ctrl-C while it imports would print its traceback; _child takes SIGINT
                    # back, and stop() sends one to a job that missed it
                    main = threading.current_thread() is threading.main_thread()
                    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
                    try:
                        process.start()
                        self.running[todo.pop(0)] = process
                    finally:
                        if main:
                            signal.signal(signal.SIGINT, signal.default_int_handler if previous is None
                                          else previous)
                try:
                    self.handle(*self.channel.get(timeout=0.5))
                except queues.Empty:
                    pass
                for i, p in list(self.running.items()):  # died without a word (killed, out of memory)
                    if not p.is_alive():
                        self.drain()
                        if i in self.running:
                            self.failed[i] = (f"its process died (exit code {p.exitcode})", 1)
                            self.running.pop(i).join()
                            self.ended(self.jobs[i].name, None)
        except KeyboardInterrupt:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C: the jobs are stopping
            try:
                self.stop()
            finally:
                signal.signal(signal.SIGINT, previous)
            raise Interrupted([j for i, j in enumerate(self.jobs)  # not those that failed before
                               if i not in self.results and self.failed.get(i, ("", 130))[1] == 130]) from None
        except BaseException:
            for p in self.running.values():
                p.kill()
                p.join()
            raise

    def handle(self, kind: str, i: int, value: Any) -> None:
        if kind == "step":
            self.count(self.jobs[i].name, value)
            return
        if kind == "done":
            self.results[i] = value
        elif kind == "error":
            self.failed[i] = value
        else:  # "interrupted": a SIGINT meant for it alone (the parent got none)
            self.failed[i] = ("interrupted (a SIGINT to its process alone)", 130)
        p = self.running.pop(i, None)
        if p is not None:
            p.join()
        self.ended(self.jobs[i].name, self.results.get(i))

    def drain(self) -> None:
        """The messages sent so far (a process that died may have sent its last)."""
        while True:
            try:
                self.handle(*self.channel.get(timeout=0.2))
            except queues.Empty:
                return

    def stop(self) -> None:
        """After Ctrl-C: let the jobs stop (they got it from the terminal); after STOP_S send it
        to those still running, again each second (a job still starting ignores it; a job
        stopping already ignores the repeats), and kill what has not ended within UNWIND_S.
        Their messages are read all the while: a job cannot end while what it sent is still
        unread (and one may finish meanwhile)."""
        now = time.monotonic()
        end, send = now + UNWIND_S, now + STOP_S
        while any(p.is_alive() for p in self.running.values()) and time.monotonic() < end:
            if time.monotonic() >= send:
                for p in self.running.values():
                    if p.is_alive():
                        try:
                            os.kill(p.pid, signal.SIGINT)
                        except ProcessLookupError:
                            pass
                send = time.monotonic() + 1.0
            try:
                self.handle(*self.channel.get(timeout=0.1))
            except queues.Empty:
                pass
        for p in self.running.values():
            if p.is_alive():
                p.kill()
            p.join()

    def outcome(self) -> list[dict]:
        if self.failed:
            i = min(self.failed)
            message, code = self.failed[i]
            done = [self.jobs[j].name for j in sorted(self.results)]
            raise JobFailed(f"{self.what} {self.jobs[i].name} failed: {message}"
                            + (f" (finished: {', '.join(done)})" if done else ""), code)
        return [self.results[i] for i in range(len(self.jobs))]


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
