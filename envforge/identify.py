"""Capability identification (TRACE section 3): contrast an agent's successful and failed
trajectories to find the capabilities it lacks.

1. Label every (trajectory, capability) pair PRESENT, LACKING or NA, with one of two labellers:

   - ``structural`` (offline, the default): the rules below read the tool calls and, where the
     file records them, the task's expected actions. No LLM.
   - ``llm``: an OpenAI-compatible model proposes candidate capabilities from batches of
     failures (discovery), candidates from all batches and runs are merged, then one call per
     trajectory labels ALL candidates at once (TRACE makes one call per pair), as JSON checked
     against a schema. Calls run concurrently under a rate limit and are cached by content hash
     (:mod:`envforge.llm`), so a re-run costs nothing and an interrupted run resumes.

2. Per capability: ER+ = LACKING / (LACKING + PRESENT) over successes (the background rate),
   ER- the same over failures, gap = ER- - ER+, coverage = failures where it is LACKING / all
   failures. Keep it when gap >= delta and coverage >= rho in at least K of N runs.

   Runs: the labels are computed once; each of the N runs then resamples the trajectories with
   replacement (a bootstrap, successes and failures separately, seed ``seed + run``) and
   recomputes the statistics, so K-of-N asks whether the selection is stable under resampling.
   With the LLM labeller too the runs differ only by the bootstrap: discovery samples batches of
   failures with seed ``seed + run`` for each run, but all runs' proposals are pooled into one
   candidate list, labelled once. With ``runs == 1`` the single run is the full data.

When a rate is undefined (no LACKING or PRESENT label in that group) it is reported as null;
an undefined ER+ counts as 0 in the gap (no success gives evidence of a background rate).
"""
from __future__ import annotations

import json
import math
import random
import re
import statistics
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from envforge.errors import InputError, UsageError
from envforge.llm import run_concurrently
from envforge.tools import tool_kind
from envforge.trajectories import DEFAULT_SUCCESS_THRESHOLD, Trajectory, first_user_text, render

PRESENT, LACKING, NA = "PRESENT", "LACKING", "NA"
LABELS = (PRESENT, LACKING, NA)
LABELERS = ("structural", "llm")
EPS = 1e-9  # float tolerance of the threshold comparisons (0.70 - 0.16 is 0.5399999...)


@dataclass(frozen=True)
class Capability:
    name: str
    description: str


@dataclass
class IdentifyConfig:
    """Settings of ``envforge identify``. Defaults marked *paper* come from TRACE."""
    labeler: str = field(default="structural", metadata={"help": "structural (offline) or llm"})
    delta: float = field(default=0.20, metadata={"help": "paper: keep when gap >= 0.20"})
    rho: float = field(default=0.10, metadata={"help": "paper: keep when coverage >= 0.10"})
    runs: int = field(default=10, metadata={"help": "paper (official code): N = 10 runs"})
    min_runs: int | None = field(default=None, metadata={
        "help": "K; default 80% of runs rounded up (paper, official code: 8 of 10; 1 of 1)"})
    success_threshold: float = field(default=DEFAULT_SUCCESS_THRESHOLD, metadata={
        "help": "a trajectory succeeds when reward >= this (tau-bench: reward 1 is a pass)"})
    seed: int = 0
    # the LLM labeller
    model: str | None = field(default=None, metadata={"help": "the model the endpoint serves"})
    batch_size: int = field(default=50, metadata={"help": "paper: ~50 failures per discovery batch"})
    discovery_batches: int = field(default=3, metadata={"help": "discovery batches per run"})
    max_candidates: int = field(default=8, metadata={"help": "paper: 5-8 candidates; kept after merging"})
    concurrency: int = field(default=8, metadata={"help": "LLM calls in flight at once"})
    rate_limit: float | None = field(default=None, metadata={"help": "LLM requests per second"})
    max_repairs: int = field(default=2, metadata={"help": "re-asks after a reply that fails the schema"})
    cache_dir: str | None = field(default=None, metadata={"help": "None: envforge.llm.default_cache_dir()"})
    cache: bool = True
    progress: bool = False

    def __post_init__(self) -> None:
        if self.labeler not in LABELERS:
            raise UsageError(f"--labeler must be one of {', '.join(LABELERS)}, got {self.labeler!r}")
        for name in ("delta", "rho"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"--{name} must lie between 0 and 1, got {getattr(self, name)}")
        if self.runs < 1:
            raise UsageError(f"--runs must be at least 1, got {self.runs}")
        if self.min_runs is not None and not 1 <= self.min_runs <= self.runs:
            raise UsageError(f"--min-runs must lie between 1 and --runs ({self.runs}), got {self.min_runs}")
        for name in ("batch_size", "discovery_batches", "max_candidates", "concurrency"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.rate_limit is not None and self.rate_limit <= 0:
            raise UsageError(f"--rate-limit must be positive requests per second, got {self.rate_limit}")

    @property
    def k(self) -> int:
        """Runs a capability must be kept in (K of N)."""
        return self.min_runs if self.min_runs is not None else max(1, math.ceil(round(0.8 * self.runs, 9)))


# ============================================================================= tools and calls

@dataclass
class Call:
    """One tool call the agent made, with its result."""
    index: int              # position of the assistant message in the trajectory
    id: str
    name: str
    arguments: dict
    kind: str
    result: str | None = None
    error: bool = False     # the result reads as an error ("Error: ...")


@dataclass
class View:
    """What the structural rules look at: the agent's calls and the task's expected actions."""
    trajectory: Trajectory
    calls: list[Call]
    expected: list[dict] | None        # the agent's expected actions (requestor assistant)
    meta: dict[str, dict]

    @property
    def messages(self) -> list[dict]:
        return self.trajectory.messages

    @property
    def writes(self) -> list[Call]:
        return [c for c in self.calls if c.kind == "write"]

    @property
    def expected_writes(self) -> list[dict]:
        return [e for e in self.expected or [] if tool_kind(e["name"], self.meta) == "write"]


def view(t: Trajectory, meta: dict[str, dict] | None = None) -> View:
    meta = meta or {}
    calls: list[Call] = []
    by_id: dict[str, Call] = {}
    for i, m in enumerate(t.messages):
        if m.get("role") == "assistant":
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except (json.JSONDecodeError, TypeError):
                    args = None
                name = fn.get("name") or ""
                c = Call(i, tc.get("id") or "", name, args if isinstance(args, dict) else {},
                         tool_kind(name, meta))
                calls.append(c)
                if c.id:
                    by_id[c.id] = c
        elif m.get("role") == "tool":
            c = by_id.get(m.get("tool_call_id") or "") or next(
                (c for c in calls if c.result is None), None)
            if c is not None and c.result is None:
                c.result = m.get("content") or ""
                c.error = c.result.lstrip().lower().startswith("error")
    expected = None
    if t.expected_actions is not None:
        expected = [e for e in t.expected_actions if e.get("requestor", "assistant") == "assistant"]
    return View(t, calls, expected, meta)


# ============================================================================= structural rules

def _entity(args: dict) -> Any:
    """The primary entity a call acts on: its first ``*_id`` (or ``id``) argument."""
    for k, v in args.items():
        if (k == "id" or k.endswith("_id")) and isinstance(v, (str, int)) and not isinstance(v, bool):
            return v
    return None


def _has_id_args(args: dict) -> bool:
    return any(k == "id" or k.endswith("_id") or k.endswith("_ids") for k in args)


def _values(x: Any) -> list:
    if isinstance(x, dict):
        return [v for val in x.values() for v in _values(val)]
    if isinstance(x, list):
        return [v for val in x for v in _values(val)]
    return [x]


def rule_precondition_verification(v: View) -> str:
    """Precondition verification: every write is preceded by a read of the entity it changes.

    The entity of a write is its first ``*_id`` argument (``reservation_id`` of
    ``cancel_reservation``, ``order_id`` of ``modify_pending_order_items``). It counts as read
    when an earlier, error-free call showed its state: a read that took the value as an
    argument, a listing read (no id arguments, such as ``get_users()``) that returned it, or a
    write of the agent's that returned it (it created or just changed the entity). Reading a
    *different* entity that merely mentions it (a user profile listing reservation ids) does
    not count. LACKING when any write has no such read; PRESENT when all have one; NA when the
    agent made no write with an id argument.
    """
    judged = False
    for i, c in enumerate(v.calls):
        if c.kind != "write" or (entity := _entity(c.arguments)) is None:
            continue
        judged = True
        seen = any(not p.error and (
            (p.kind == "read" and entity in _values(p.arguments))
            or (p.kind == "read" and not _has_id_args(p.arguments) and str(entity) in (p.result or ""))
            or (p.kind == "write" and str(entity) in (p.result or "")))
            for p in v.calls[:i])
        if not seen:
            return LACKING
    return PRESENT if judged else NA


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return math.isclose(float(a), float(b), rel_tol=0, abs_tol=1e-9)
    return type(a) is type(b) and a == b


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _diffs(expected: Any, actual: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Leaves of ``expected`` that ``actual`` does not match: (path, expected, actual).

    Lists are compared element by element, except that the same elements in another order
    match; a list of another length is one difference at the list's path.
    """
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [(path, expected, actual)]
        return [d for k, ev in expected.items()
                for d in _diffs(ev, actual.get(k, _MISSING), f"{path}.{k}" if path else k)]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [(path, expected, actual)]
        key = lambda x: json.dumps(x, sort_keys=True)  # noqa: E731
        if sorted(map(key, expected)) == sorted(map(key, actual)):
            return []
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in _diffs(e, a, f"{path}[{i}]")]
    return [] if _same(expected, actual) else [(path, expected, actual)]


def _compared(e: dict) -> dict:
    args = e.get("arguments") or {}
    keys = e.get("compare_args")
    return args if keys is None else {k: v for k, v in args.items() if k in keys}


def write_pairs(v: View) -> list[tuple[dict, Call]]:
    """Each expected write matched with the agent's call of the same tool that differs least."""
    pairs, used = [], set()
    for e in v.expected_writes:
        options = [j for j, c in enumerate(v.calls) if c.name == e["name"] and j not in used]
        if not options:
            continue
        j = min(options, key=lambda j: (len(_diffs(_compared(e), v.calls[j].arguments)), j))
        used.add(j)
        pairs.append((e, v.calls[j]))
    return pairs


def rule_argument_precision(v: View) -> str:
    """Tool-call argument precision: the agent's write arguments equal the expected ones.

    Each expected write is matched with the agent's call of the same tool whose arguments differ
    least (only the ``compare_args`` when the task names them). LACKING when a matched call
    differs other than by one number for another (an id, a name, a list of other length, a
    missing key, a number given as a string); a wrong number belongs to structured data
    reasoning. PRESENT when every matched call agrees on them; NA when no expected write was
    matched (unknown, or never made).
    """
    pairs = write_pairs(v)
    if not pairs:
        return NA
    for e, c in pairs:
        if any(not (_is_number(exp) and _is_number(act))
               for _, exp, act in _diffs(_compared(e), c.arguments)):
            return LACKING
    return PRESENT


def rule_structured_data_reasoning(v: View) -> str:
    """Structured data reasoning: numbers the agent computes (amounts, prices, counts) are right.

    Over the same matched pairs as argument precision, looks only at numeric leaves of the
    expected arguments (``payment_methods[0].amount``, ``total_baggages``). LACKING when the
    agent gave another number for one (a missing one, or one given as a string, is argument
    precision); PRESENT when there are numeric leaves and none is another number; NA when no
    matched expected write has a numeric argument.
    """
    judged = False
    for e, c in write_pairs(v):
        args = _compared(e)
        if not any(_is_number(x) for x in _values(args)):
            continue
        judged = True
        if any(_is_number(exp) and _is_number(act) for _, exp, act in _diffs(args, c.arguments)):
            return LACKING
    return PRESENT if judged else NA


_AFFIRM = re.compile(r"\b(yes|yeah|yep|yup|sure|ok|okay|confirm|confirmed|proceed|go ahead|"
                     r"correct|please do|do it|that's right|sounds good|absolutely|definitely)\b", re.I)
_NEGATE = re.compile(r"^\W*(no|nope|don't|do not|not)\b", re.I)
_ASK = re.compile(r"\?|\bconfirm|\bproceed", re.I)


def _confirmed(messages: list[dict], index: int) -> bool:
    """The last user turn before ``index`` affirms, and answers an assistant turn that asked."""
    u = next((j for j in range(index - 1, -1, -1) if messages[j].get("role") == "user"), None)
    if u is None:
        return False
    said = messages[u].get("content") or ""
    if not _AFFIRM.search(said) or _NEGATE.search(said):
        return False
    for j in range(u - 1, -1, -1):
        m = messages[j]
        if m.get("role") == "user":
            return False
        if m.get("role") == "assistant" and (m.get("content") or "").strip():
            return bool(_ASK.search(m["content"]))
    return False


def rule_confirmation_before_write(v: View) -> str:
    """Confirmation before write: the user explicitly agreed before each state change.

    A write is confirmed when the last user message before it affirms (yes, confirm, proceed,
    go ahead, ...; not starting with "no") and answers an assistant message that asked (a
    question mark, "confirm" or "proceed"). LACKING when any write is unconfirmed; PRESENT when
    all are; NA when the agent made no write.
    """
    writes = v.writes
    if not writes:
        return NA
    return PRESENT if all(_confirmed(v.messages, c.index) for c in writes) else LACKING


def rule_policy_adherence(v: View) -> str:
    """Policy adherence / refusal: the agent changes nothing the task did not call for.

    Compares the agent's successful writes (results not errors; a failed attempt changed
    nothing) with the task's expected writes, as multisets of tool names. LACKING when the agent
    made a write the task did not expect, or more of one than expected (a cancellation the
    policy forbids, a second booking); PRESENT when every write was expected, including a task
    that expected none and an agent that refused; NA when the expected actions are unknown or
    the agent made no write although the task expected some (see action completion).
    """
    if v.expected is None:
        return NA
    made = Counter(c.name for c in v.writes if not c.error)
    expected = Counter(e["name"] for e in v.expected_writes)
    if not made:
        return NA if expected else PRESENT
    return LACKING if any(n > expected[name] for name, n in made.items()) else PRESENT


def rule_action_completion(v: View) -> str:
    """Action completion: every write the task expected is made.

    LACKING when an expected write (by tool name, counted) has no successful call of that tool
    (the agent stopped early, gave up, or transferred instead); PRESENT when all were made; NA
    when the expected actions are unknown or hold no write.
    """
    expected = Counter(e["name"] for e in v.expected_writes)
    if not expected:
        return NA
    made = Counter(c.name for c in v.writes if not c.error)
    return LACKING if any(made[name] < n for name, n in expected.items()) else PRESENT


def rule_error_recovery(v: View) -> str:
    """Error recovery: after a tool call fails, the agent gets that call to succeed.

    A call failed when its result starts with "Error" (tau-bench and tau2 both report tool
    exceptions so). It is recovered when a later call of the same tool succeeds. LACKING when a
    failure is never recovered; PRESENT when all are; NA when no call failed. (A failure whose
    right answer is to stop, such as a forbidden change, also reads as LACKING: the statistics,
    not this rule, decide whether that matters.)
    """
    failed = [i for i, c in enumerate(v.calls) if c.error]
    if not failed:
        return NA
    for i in failed:
        if not any(d.name == v.calls[i].name and not d.error for d in v.calls[i + 1:]):
            return LACKING
    return PRESENT


def rule_escalation_judgement(v: View) -> str:
    """Escalation judgement: the agent transfers to a human exactly when the task calls for it.

    LACKING when the agent transferred (``transfer_to_human_agents``) and the expected actions
    hold no transfer, or the task expected a transfer and the agent made none; PRESENT when both
    transferred; NA when neither did, or the expected actions are unknown.
    """
    if v.expected is None:
        return NA
    did = any(c.kind == "escalation" for c in v.calls)
    wanted = any(tool_kind(e["name"], v.meta) == "escalation" for e in v.expected)
    if not did and not wanted:
        return NA
    return PRESENT if did and wanted else LACKING


#: The structural labeller's capabilities, named like the synthesizer's families where they overlap.
STRUCTURAL_RULES: list[tuple[Capability, Callable[[View], str]]] = [
    (Capability("precondition verification",
                "reads the entity a write changes (its status, ownership, eligibility) before "
                "changing it"), rule_precondition_verification),
    (Capability("tool-call argument precision",
                "passes the exact ids, names and options the task requires to write tools"),
     rule_argument_precision),
    (Capability("structured data reasoning",
                "computes the numbers a write needs (amounts, prices, counts) correctly from the "
                "data the tools returned"), rule_structured_data_reasoning),
    (Capability("confirmation before write",
                "lists the action and obtains the user's explicit yes before changing state"),
     rule_confirmation_before_write),
    (Capability("policy adherence / refusal",
                "refuses changes the policy forbids and makes no change the task did not ask for"),
     rule_policy_adherence),
    (Capability("action completion",
                "carries out every state change the task requires instead of stopping early"),
     rule_action_completion),
    (Capability("error recovery",
                "after a tool error, corrects the call and gets it to succeed"), rule_error_recovery),
    (Capability("escalation judgement",
                "transfers to a human agent when, and only when, the request is out of scope"),
     rule_escalation_judgement),
]


def label_structural(trajectories: Sequence[Trajectory], meta: dict[str, dict] | None = None
                     ) -> tuple[list[Capability], list[dict[str, str]]]:
    """The capabilities of :data:`STRUCTURAL_RULES` and, per trajectory, name -> label."""
    caps = [c for c, _ in STRUCTURAL_RULES]
    labels = []
    for t in trajectories:
        v = view(t, meta)
        labels.append({c.name: rule(v) for c, rule in STRUCTURAL_RULES})
    return caps, labels


# ============================================================================= statistics

def capability_stats(labels: Sequence[str], success: Sequence[bool]) -> dict:
    """ER+, ER-, gap, coverage and counts of one capability over labelled trajectories."""
    counts = dict.fromkeys(("lacking_success", "present_success", "na_success",
                            "lacking_failure", "present_failure", "na_failure"), 0)
    for lab, ok in zip(labels, success):
        counts[f"{lab.lower()}_{'success' if ok else 'failure'}"] += 1

    def rate(lacking: int, present: int) -> float | None:
        return lacking / (lacking + present) if lacking + present else None

    er_plus = rate(counts["lacking_success"], counts["present_success"])
    er_minus = rate(counts["lacking_failure"], counts["present_failure"])
    failures = counts["lacking_failure"] + counts["present_failure"] + counts["na_failure"]
    gap = None if er_minus is None else er_minus - (er_plus or 0.0)
    coverage = counts["lacking_failure"] / failures if failures else 0.0
    return {"er_plus": er_plus, "er_minus": er_minus, "gap": gap, "coverage": coverage,
            "counts": counts}


def is_retained(stats: dict, delta: float, rho: float) -> bool:
    """The paper's selection rule: gap >= delta and coverage >= rho."""
    return stats["gap"] is not None and stats["gap"] >= delta - EPS and stats["coverage"] >= rho - EPS


def run_statistics(labels: Sequence[str], success: Sequence[bool], config: IdentifyConfig) -> dict:
    """Gap and coverage over ``config.runs`` bootstrap runs, and in how many runs it was kept."""
    s_idx = [i for i, ok in enumerate(success) if ok]
    f_idx = [i for i, ok in enumerate(success) if not ok]
    gaps, covs, kept = [], [], 0
    for r in range(config.runs):
        if config.runs == 1:
            idx = list(range(len(success)))
        else:
            rng = random.Random(config.seed + r)
            idx = [rng.choice(s_idx) for _ in s_idx] + [rng.choice(f_idx) for _ in f_idx]
        st = capability_stats([labels[i] for i in idx], [success[i] for i in idx])
        kept += is_retained(st, config.delta, config.rho)
        if st["gap"] is not None:
            gaps.append(st["gap"])
        covs.append(st["coverage"])
    return {"n": config.runs, "k": config.k, "retained_in": kept,
            "gap_mean": _mean(gaps), "gap_std": _std(gaps),
            "coverage_mean": _mean(covs), "coverage_std": _std(covs)}


def _mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 4) if xs else None


def _std(xs: list[float]) -> float | None:
    return round(statistics.pstdev(xs), 4) if xs else None


def select(capabilities: Sequence[Capability], labels: Sequence[dict[str, str]],
           trajectories: Sequence[Trajectory], success: Sequence[bool],
           config: IdentifyConfig) -> list[dict]:
    """One entry per capability (the capabilities.json format), kept ones first, by gap.
    ``success``: per trajectory, whether it succeeded (reward >= the threshold)."""
    out = []
    for cap in capabilities:
        labs = [lab.get(cap.name, NA) for lab in labels]
        st = capability_stats(labs, success)
        runs = run_statistics(labs, success, config)
        # (source file, task id) -> its first trajectory that failed and lacked the capability
        # (task ids repeat across files: tau2 airline and retail both number theirs from 0)
        failing: dict[tuple, Trajectory] = {}
        for t, lab, ok in zip(trajectories, labs, success):
            if lab == LACKING and not ok:
                failing.setdefault((t.metadata.get("source"), t.task_id), t)
        examples = list(dict.fromkeys(t.task_id for t in failing.values()))
        tasks = list(dict.fromkeys(filter(None, map(task_text, failing.values()))))
        out.append({"name": cap.name, "description": cap.description,
                    "er_plus": _r(st["er_plus"]), "er_minus": _r(st["er_minus"]),
                    "gap": _r(st["gap"]), "coverage": _r(st["coverage"]),
                    "retained": runs["retained_in"] >= config.k,
                    "counts": st["counts"], "examples": examples,
                    "example_tasks": tasks[:EXAMPLE_TASKS],
                    "example_trajectories": [render(t) for t in
                                             list(failing.values())[:EXAMPLE_TRAJECTORIES]],
                    "runs": runs})
    out.sort(key=lambda c: (not c["retained"], -(c["gap"] if c["gap"] is not None else -2)))
    return out


EXAMPLE_TASKS = 3
EXAMPLE_TRAJECTORIES = 2  # rendered failing trajectories per capability, for the LLM synthesizer


def task_text(t: Trajectory) -> str:
    """A trajectory's task as its user first put it (whitespace collapsed, cut to 300 chars):
    what a router sees of a new task, so ``example_tasks`` show it what this capability's tasks
    look like."""
    return first_user_text(t.messages)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


# ============================================================================= the LLM labeller

DISCOVERY_SYSTEM = (
    "You analyse failed runs of a tool-using agent to find the capabilities it lacks. Read the "
    "failed trajectories and propose between 5 and 8 distinct capabilities whose absence explains "
    "these failures. A capability is a specific, trainable skill of the agent (for example: "
    "verifying preconditions before a write, computing payment amounts from tool results), not a "
    "task, a domain or a tool. Reply with only a JSON object, no prose: "
    '{"capabilities": [{"name": "short lowercase name", "description": "one sentence"}]}')

LABELLING_SYSTEM = (
    "You label one agent trajectory. For each capability listed, decide whether the agent's "
    "behaviour in this conversation shows the capability (PRESENT), shows it missing (LACKING), "
    "or whether the conversation gave no occasion to use it (NA). Judge the agent only. Reply "
    'with only a JSON object, no prose: {"labels": {"<capability name>": "PRESENT" | "LACKING" | '
    '"NA", ...}} with one entry per capability, named exactly as listed.')

DISCOVERY_SCHEMA = {
    "type": "object", "required": ["capabilities"],
    "properties": {"capabilities": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["name", "description"],
        "properties": {"name": {"type": "string", "minLength": 1},
                       "description": {"type": "string"}}}}}}


def labelling_schema(names: Sequence[str]) -> dict:
    """The schema a labelling reply must satisfy: one label for every candidate."""
    return {"type": "object", "required": ["labels"], "properties": {"labels": {
        "type": "object", "required": list(names),
        "properties": {n: {"enum": list(LABELS)} for n in names}}}}


def _normalise_labels(obj: Any, names: Sequence[str]) -> Any:
    """Map label spellings (lacking, N/A) and name case onto the canonical ones."""
    if not isinstance(obj, dict):
        return obj
    raw = obj.get("labels")
    if raw is None and any(n in obj for n in names):
        raw = obj  # a flat {name: label} object
    if not isinstance(raw, dict):
        return obj
    by_lower = {n.lower(): n for n in names}
    labels = {}
    for k, val in raw.items():
        name = by_lower.get(str(k).strip().lower(), k)
        if isinstance(val, dict):
            val = val.get("label")
        if isinstance(val, str):
            val = val.strip().upper().replace("N/A", "NA").replace("NOT APPLICABLE", "NA")
        labels[name] = val
    return {"labels": labels}


def _capability_key(name: str) -> frozenset:
    """Words of a name, cut to 5 letters (verifying/verification -> verif), minus filler."""
    filler = {"a", "an", "the", "of", "to", "and", "for", "in", "on", "with", "or"}
    return frozenset(w[:5] for w in re.findall(r"[a-z0-9]+", name.lower()) if w not in filler)


def merge_candidates(proposals: Sequence[Sequence[Capability]], limit: int) -> list[Capability]:
    """Pool the candidates of all discovery batches: names whose word sets overlap by half or
    more (Jaccard) are one capability (the first wording is kept); the ``limit`` proposed by the
    most batches are returned, ties in order of first appearance."""
    groups: list[list] = []  # [key, capability, support]
    for batch in proposals:
        for cap in batch:
            key = _capability_key(cap.name)
            for g in groups:
                if key and len(key & g[0]) / len(key | g[0]) >= 0.5:
                    g[2] += 1
                    break
            else:
                groups.append([key, cap, 1])
    order = sorted(range(len(groups)), key=lambda i: (-groups[i][2], i))
    return [groups[i][1] for i in order[:limit]]


class LLMLabeler:
    """Discovery and labelling against an :class:`envforge.llm.LLMClient`."""

    def __init__(self, client: Any, config: IdentifyConfig):
        self.client, self.config = client, config
        self.invalid_replies = 0     # replies still failing the schema after the re-asks
        self.discovery_calls = 0     # discovery requests made (cached or not)
        self._lock = threading.Lock()

    def discover(self, failures: Sequence[Trajectory]) -> list[Capability]:
        cfg = self.config
        if not failures:
            raise InputError("no failed trajectories: the LLM labeller discovers capabilities from "
                             "failures (check --success-threshold)")
        jobs = []
        n_batches = min(cfg.discovery_batches, math.ceil(len(failures) / cfg.batch_size))
        for r in range(cfg.runs):
            order = list(range(len(failures)))
            random.Random(cfg.seed + r).shuffle(order)
            for b in range(n_batches):
                batch = [failures[i] for i in order[b * cfg.batch_size:(b + 1) * cfg.batch_size]]
                if batch:
                    jobs.append((cfg.seed + r, batch))
        results = run_concurrently(lambda job: self._discover_batch(*job), jobs, cfg.concurrency,
                                   "discovering" if cfg.progress else None)
        merged = merge_candidates(results, cfg.max_candidates)
        if not merged:
            raise InputError("the LLM proposed no usable capability in any discovery batch; "
                             "check --model (it must follow JSON instructions)")
        return merged

    def _discover_batch(self, seed: int, batch: Sequence[Trajectory]) -> list[Capability]:
        body = "\n\n".join(f"### Failed trajectory {i + 1} (task {t.task_id})\n"
                           f"{render(t, max_chars=2500, per_message=300)}"
                           for i, t in enumerate(batch))
        messages = [{"role": "system", "content": DISCOVERY_SYSTEM},
                    {"role": "user", "content": f"Failed trajectories:\n\n{body}"}]
        with self._lock:
            self.discovery_calls += 1
        obj, problem = self.client.chat_json(messages, DISCOVERY_SCHEMA, repairs=self.config.max_repairs,
                                             temperature=0.7, seed=seed)
        if problem is not None:
            with self._lock:
                self.invalid_replies += 1
            return []
        return [Capability(c["name"].strip(), c["description"].strip())
                for c in obj["capabilities"] if c["name"].strip()]

    def label(self, trajectories: Sequence[Trajectory], caps: Sequence[Capability]) -> list[dict[str, str]]:
        return run_concurrently(lambda t: self._label_one(t, caps), list(trajectories),
                                self.config.concurrency, "labelling" if self.config.progress else None)

    def _label_one(self, t: Trajectory, caps: Sequence[Capability]) -> dict[str, str]:
        names = [c.name for c in caps]
        listing = "\n".join(f"- {c.name}: {c.description}" for c in caps)
        messages = [{"role": "system", "content": LABELLING_SYSTEM},
                    {"role": "user", "content": f"Capabilities:\n{listing}\n\n"
                                                f"Trajectory (task {t.task_id}):\n{render(t)}"}]
        obj, problem = self.client.chat_json(messages, labelling_schema(names),
                                             repairs=self.config.max_repairs,
                                             prepare=lambda o: _normalise_labels(o, names),
                                             temperature=0.0)
        if problem is not None:
            with self._lock:
                self.invalid_replies += 1
        raw = obj.get("labels") if isinstance(obj, dict) else None
        raw = raw if isinstance(raw, dict) else {}
        return {n: raw[n] if raw.get(n) in LABELS else NA for n in names}


# ============================================================================= the stage

def identify(trajectories: Sequence[Trajectory], config: IdentifyConfig | None = None, *,
             meta: dict[str, dict] | None = None, client: Any = None) -> dict:
    """Label, compute the statistics, select: the content of ``capabilities.json``.

    ``meta`` is the target's tool metadata (read/write), ``client`` an
    :class:`envforge.llm.LLMClient` for the LLM labeller (made from ``config`` when None).
    """
    config = config or IdentifyConfig()
    trajectories = list(trajectories)
    if not trajectories:
        raise InputError("no trajectories to analyse: the files hold no runs")
    success = [t.reward >= config.success_threshold for t in trajectories]
    extra: dict[str, Any] = {}
    if config.labeler == "structural":
        caps, labels = label_structural(trajectories, meta)
    else:
        if client is None:
            from envforge.llm import LLMClient
            client = LLMClient(config.model or "", cache_dir=config.cache_dir, cache=config.cache,
                               rate_limit=config.rate_limit)
        labeler = LLMLabeler(client, config)
        caps = labeler.discover([t for t, ok in zip(trajectories, success) if not ok])
        labels = labeler.label(trajectories, caps)
        s = client.stats
        extra["llm"] = {"model": client.model, "calls": s.calls, "cache_hits": s.cache_hits,
                        "retries": s.retries, "discovery_requests": labeler.discovery_calls,
                        "invalid_replies": labeler.invalid_replies}
    n_succ = sum(success)
    report = {
        "trajectories": {"total": len(trajectories), "successes": n_succ,
                         "failures": len(trajectories) - n_succ},
        "labeler": config.labeler,
        "settings": {"delta": config.delta, "rho": config.rho, "runs": config.runs,
                     "min_runs": config.k, "success_threshold": config.success_threshold,
                     "seed": config.seed},
        "capabilities": select(caps, labels, trajectories, success, config),
        **extra,
    }
    return report


# ============================================================================= for people

def table(report: dict) -> Any:
    """The report as a rich Table."""
    from rich.table import Table
    tr = report["trajectories"]
    s = report["settings"]
    t = Table(title=f"capabilities: {tr['total']} trajectories, {tr['successes']} successes, "
                    f"{tr['failures']} failures (keep: gap >= {s['delta']}, coverage >= {s['rho']} "
                    f"in >= {s['min_runs']} of {s['runs']} runs)")
    t.add_column("capability", no_wrap=True)
    for col in ("ER+", "ER-", "gap", "coverage", "runs kept", "kept"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("examples", overflow="fold")
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    for c in report["capabilities"]:
        runs = c["runs"]
        spread = f" ±{runs['gap_std']:.2f}" if runs["n"] > 1 and runs["gap_std"] is not None else ""
        cov_spread = f" ±{runs['coverage_std']:.2f}" if runs["n"] > 1 else ""
        ex = ", ".join(c["examples"][:3]) + (f" (+{len(c['examples']) - 3})" if len(c["examples"]) > 3 else "")
        t.add_row(c["name"], fmt(c["er_plus"]), fmt(c["er_minus"]), fmt(c["gap"]) + spread,
                  fmt(c["coverage"]) + cov_spread, f"{runs['retained_in']}/{runs['n']}",
                  "yes" if c["retained"] else "no", ex)
    return t


def plot(report: dict, path: str | Path) -> Path | None:
    """A PNG of gap against coverage with the thresholds drawn; None when matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    s = report["settings"]
    caps = [c for c in report["capabilities"] if c["gap"] is not None]
    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    for kept, colour, label in ((True, "tab:green", "kept"), (False, "tab:grey", "not kept")):
        pts = [c for c in caps if c["retained"] == kept]
        if pts:
            ax.errorbar([c["coverage"] for c in pts], [c["gap"] for c in pts],
                        xerr=[c["runs"]["coverage_std"] or 0 for c in pts],
                        yerr=[c["runs"]["gap_std"] or 0 for c in pts],
                        fmt="o", color=colour, label=label, capsize=3)
    for c in caps:
        ax.annotate(c["name"], (c["coverage"], c["gap"]), fontsize=8, xytext=(4, 4),
                    textcoords="offset points")
    ax.axhline(s["delta"], color="tab:red", ls="--", lw=1, label=f"delta = {s['delta']}")
    ax.axvline(s["rho"], color="tab:blue", ls="--", lw=1, label=f"rho = {s['rho']}")
    ax.set_xlabel("coverage (share of failures where it is LACKING)")
    ax.set_ylabel("gap (ER- - ER+)")
    ax.set_title(f"capabilities ({report['labeler']} labeller, {report['trajectories']['total']} "
                 "trajectories)")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(min(-0.1, *(c["gap"] - 0.05 for c in caps)) if caps else -0.1, 1.05)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
