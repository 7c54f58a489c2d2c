"""Identification's pipeline: label every trajectory, compute the statistics, select; and its
result, :class:`Identification`. See the package's docstring (``envforge.identify``)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from envforge.errors import InputError
from envforge.identify.config import LACKING, IdentifyConfig
from envforge.identify.llm import LLMLabeller
from envforge.identify.rules import STRUCTURAL_RULES, Verdict, label_structural
from envforge.identify.stats import capability_entry, group_warnings, labels_of
from envforge.llm import LLMClient, atomic_write
from envforge.progress import Progress, reporter
from envforge.trajectories import Trajectory, first_user_text, render

EXAMPLE_TASKS = 3
EXAMPLE_TRAJECTORIES = 2  # rendered failing trajectories per capability, for the LLM synthesizer


@dataclass
class Identification:
    """What ``identify`` found. ``to_dict()`` is the content of capabilities.json;
    ``verdicts`` (per trajectory, capability -> verdict) and ``trajectories`` stay out of it."""
    counts: dict
    labeller: str
    settings: dict
    capabilities: list[dict]
    warnings: list[str] = field(default_factory=list)
    llm: dict | None = None
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)
    verdicts: list[dict[str, Verdict]] = field(default_factory=list, repr=False)

    @property
    def retained(self) -> list[str]:
        return [c["name"] for c in self.capabilities if c["retained"]]

    def to_dict(self) -> dict:
        d = {"trajectories": self.counts, "labeller": self.labeller, "settings": self.settings,
             "warnings": self.warnings, "capabilities": self.capabilities}
        if self.llm is not None:
            d["llm"] = self.llm
        return d

    def write(self, path: str | Path) -> Path:
        """Write capabilities.json (atomically: a killed run leaves the old file or the new)."""
        path = Path(path)
        try:
            atomic_write(path, json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")
        except OSError as e:
            raise InputError(f"{path}: cannot write the result ({e.strerror})") from None
        return path

    def label_rows(self) -> list[dict]:
        """One row per trajectory, in input order: where it came from, its labels and evidence."""
        rows = []
        for t, v in zip(self.trajectories, self.verdicts):
            rows.append({"source": t.metadata.get("source"), "index": t.metadata.get("index"),
                         "task_id": t.task_id, "trial": t.metadata.get("trial"), "reward": t.reward,
                         "labels": {n: x.label for n, x in v.items()},
                         "evidence": {n: x.evidence() for n, x in v.items()}})
        return rows

    def write_labels(self, path: str | Path) -> Path:
        """``--labels-out``: one JSON line per trajectory (see :meth:`label_rows`)."""
        path = Path(path)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.label_rows())
        try:
            atomic_write(path, text)
        except OSError as e:
            raise InputError(f"{path}: cannot write the labels ({e.strerror})") from None
        return path


def task_text(t: Trajectory) -> str:
    """A trajectory's task as its user first put it (whitespace collapsed, cut to 300 chars):
    what a router sees of a new task, so ``example_tasks`` show it what this capability's tasks
    look like."""
    return first_user_text(t.messages)


def identify(trajectories: Sequence[Trajectory], config: IdentifyConfig | None = None, *,
             meta: dict[str, dict] | None = None, policy: str | None = None,
             client: Any = None, progress: Progress | None = None) -> Identification:
    """Label, compute the statistics, select.

    ``meta`` is the target's tool metadata (read/write), ``policy`` its policy text (what the
    rules may check: whether writes need confirmation, time windows), ``client`` an
    :class:`envforge.llm.LLMClient` for the LLM and hybrid labellers (made from ``config`` when
    None). ``progress`` gets a ``Step`` (``envforge.progress``) per phase, and one per LLM call
    finished with ``done``/``total``.
    """
    config = config or IdentifyConfig()
    trajectories = list(trajectories)
    if not trajectories:
        raise InputError("no trajectories: the files hold no runs (an empty list or file); "
                         "give files with at least one run")
    success = [t.reward >= config.success_threshold for t in trajectories]
    warnings = group_warnings(success, config.min_group)
    say = reporter(progress)
    llm_info = None
    reads_expected = {r.capability.name: r.reads_expected for r in STRUCTURAL_RULES}
    if config.labeller == "structural":
        say(f"labelling {len(trajectories)} trajectories by the rules")
        caps, verdicts = label_structural(trajectories, meta, policy)
    else:
        if client is None:
            client = LLMClient(config.model or "", cache_dir=config.cache_dir, cache=config.cache,
                               rate_limit=config.rate_limit)
        labeller = LLMLabeller(client, config, policy, progress)
        if config.labeller == "hybrid":
            caps, proposals = label_structural(trajectories, meta, policy)
            say(f"labelling {len(trajectories)} trajectories by the rules and {client.model}")
            verdicts = labeller.label(trajectories, caps, proposals)
        else:
            say(f"discovering capabilities with {client.model}")
            caps = labeller.discover([t for t, ok in zip(trajectories, success) if not ok])
            say(f"labelling {len(trajectories)} trajectories with {client.model}")
            verdicts = labeller.label(trajectories, caps)
            reads_expected = {}  # the model is shown the reference solution, not ruled by it
        s = client.stats
        llm_info = {"model": client.model, "calls": s.calls, "cache_hits": s.cache_hits,
                    "retries": s.retries, "discovery_requests": labeller.discovery_calls,
                    "invalid_replies": labeller.invalid_replies}
    labels = [{n: x.label for n, x in v.items()} for v in verdicts]
    say(f"statistics of {len(caps)} capabilities over {config.runs} bootstrap run(s)")
    entries = []
    for cap in caps:
        labs = labels_of(cap.name, labels)
        entry = capability_entry(cap.name, cap.description, labs, success, config,
                                 reads_expected=reads_expected.get(cap.name, False),
                                 contrast_ok=not warnings)
        entry.update(_examples(trajectories, labs, success))
        entries.append(entry)
    entries.sort(key=lambda c: (not c["retained"], -(c["gap"] if c["gap"] is not None else -2)))
    n_succ = sum(success)
    return Identification(
        counts={"total": len(trajectories), "successes": n_succ,
                "failures": len(trajectories) - n_succ},
        labeller=config.labeller,
        settings={"delta": config.delta, "rho": config.rho, "runs": config.runs,
                  "min_runs": config.k, "min_group": config.min_group,
                  "success_threshold": config.success_threshold, "seed": config.seed},
        capabilities=entries, warnings=warnings, llm=llm_info,
        trajectories=trajectories, verdicts=verdicts)


def _examples(trajectories: Sequence[Trajectory], labs: Sequence[str], success: Sequence[bool]) -> dict:
    """The failures that lacked a capability: their task ids, task texts and two rendered.
    Keyed by (source file, task id): task ids repeat across files (tau2 airline and retail
    both number theirs from 0)."""
    failing: dict[tuple, Trajectory] = {}
    for t, lab, ok in zip(trajectories, labs, success):
        if lab == LACKING and not ok:
            failing.setdefault((t.metadata.get("source"), t.task_id), t)
    tasks = list(dict.fromkeys(filter(None, map(task_text, failing.values()))))
    return {"examples": list(dict.fromkeys(t.task_id for t in failing.values())),
            "example_tasks": tasks[:EXAMPLE_TASKS],
            "example_trajectories": [render(t) for t in list(failing.values())[:EXAMPLE_TRAJECTORIES]]}
