"""The structural labeller: offline rules that label a trajectory from what it shows.

Each rule reads one trajectory and returns a :class:`Verdict`: PRESENT, LACKING or NA, the turn
(index into the trajectory's messages) that decided it and one line saying why, so a person can
check a label in seconds (``--labels-out``). The definitions follow docs/identify-rubric.md.

Rules may use the task's expected actions to find *where* a trajectory went wrong (which write
to look at), but the label comes from the trajectory itself: what the user said, what the tools
returned, what the agent wrote. Rules that still decide from the expected actions say so
(``reads_expected``): on tau-bench, success *is* reaching the expected actions' database, so
their ER+ is 0 by construction and their gap is just the failure rate.

Pre-filled history (tau2 tasks can start with earlier turns, ``metadata["history"]`` messages)
is context: it is searched for values, but its calls are not the agent's actions.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Sequence

from envforge.identify.config import LACKING, NA, PRESENT, Capability
from envforge.tools import tool_kind
from envforge.trajectories import Trajectory


@dataclass(frozen=True)
class Verdict:
    """A rule's label, the message index that decided it (None: nothing to point at) and why."""
    label: str
    turn: int | None = None
    why: str = ""

    def evidence(self) -> dict:
        return {"turn": self.turn, "why": self.why}


# ============================================================================= the view

@dataclass
class Call:
    """One tool call the agent made, with its result."""
    index: int              # position of the assistant message in the trajectory
    id: str
    name: str
    arguments: dict
    kind: str
    result: str | None = None
    result_index: int | None = None
    error: bool = False     # the result reads as an error ("Error: ...")


@dataclass
class View:
    """What the rules look at: the agent's own calls (pre-filled history left out), the
    messages, and the task's expected writes."""
    trajectory: Trajectory
    calls: list[Call]
    expected: list[dict] | None        # the agent's expected actions (requestor assistant)
    context: list[Call]                # every call, pre-filled history included (what was known)
    meta: dict[str, dict]
    start: int                         # first message that is not pre-filled history
    policy: str = ""                   # the target's policy and the system prompt, lower-cased

    @property
    def messages(self) -> list[dict]:
        return self.trajectory.messages

    @property
    def writes(self) -> list[Call]:
        return [c for c in self.calls if c.kind == "write"]

    @property
    def expected_writes(self) -> list[dict]:
        return [e for e in self.expected or [] if tool_kind(e["name"], self.meta) == "write"]

    def seen_before(self, index: int) -> str:
        """What the agent had been shown before message ``index``: the user's words and the
        tool results (its own words are not evidence of a value), lower-cased."""
        parts = [m.get("content") or "" for m in self.messages[:index]
                 if m.get("role") in ("user", "tool")]
        return "\n".join(parts).lower()


def view(t: Trajectory, meta: dict[str, dict] | None = None, policy: str | None = None) -> View:
    """The rules' view of ``t``; ``meta``: the target's tool metadata, ``policy``: its policy
    text (the policy the trajectory itself records, tau2's, and its system prompt, tau-bench
    v1's, are added to it)."""
    meta = meta or {}
    start = t.metadata.get("history") or 0
    start = start if type(start) is int and 0 <= start <= len(t.messages) else 0
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
                c.result, c.result_index = m.get("content") or "", i
                c.error = c.result.lstrip().lower().startswith("error")
    expected = None
    if t.expected_actions is not None:
        expected = [{**e, "arguments": e.get("arguments") if isinstance(e.get("arguments"), dict) else {}}
                    for e in t.expected_actions if e.get("requestor", "assistant") == "assistant"]
    system = [m.get("content") or "" for m in t.messages if m.get("role") == "system"]
    own = t.metadata.get("policy") if isinstance(t.metadata.get("policy"), str) else ""
    text = "\n".join([policy or "", own] + system).lower()
    return View(t, [c for c in calls if c.index >= start], expected, calls, meta, start, text)


# ============================================================================= small helpers

def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_id_key(k: str) -> bool:
    return k == "id" or k.endswith("_id")


def entity(args: dict) -> Any:
    """The entity a call acts on: its first ``*_id`` argument other than the user's and the
    payment's (``reservation_id``, ``order_id``), else its ``user_id``."""
    ids = [(k, v) for k, v in args.items() if _is_id_key(k) and isinstance(v, (str, int))
           and not isinstance(v, bool)]
    own = [v for k, v in ids if k != "user_id" and "payment" not in k]
    return own[0] if own else next((v for k, v in ids if k == "user_id"), None)


def leaves(x: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(x, dict):
        return [leaf for k, v in x.items() for leaf in leaves(v, f"{path}.{k}" if path else str(k))]
    if isinstance(x, list):
        return [leaf for i, v in enumerate(x) for leaf in leaves(v, f"{path}[{i}]")]
    return [(path, x)]


def _parse(text: str | None) -> Any:
    try:
        return json.loads(text or "")
    except (json.JSONDecodeError, TypeError):
        return None


def _records(x: Any) -> list[dict]:
    """Every JSON object inside ``x`` (a tool result may nest the entity)."""
    if isinstance(x, dict):
        return [x] + [r for v in x.values() for r in _records(v)]
    if isinstance(x, list):
        return [r for v in x for r in _records(v)]
    return []


def _quote(x: Any, n: int = 60) -> str:
    s = x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)
    return s if len(s) <= n else s[:n - 3] + "..."


def _edit_distance(a: str, b: str, limit: int) -> int:
    """Levenshtein distance, or ``limit + 1`` once it must exceed ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
        if min(cur) > limit:
            return limit + 1
        prev = cur
    return prev[-1]


_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug",
                                       "sep", "oct", "nov", "dec"), 1)}
_DATE_WORDS = re.compile(r"\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+(\d{1,2})"
                         r"(?:st|nd|rd|th)?\b|\b(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?"
                         r"(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\b")
_ISO_DATE = re.compile(r"^\d{4}-(\d{2})-(\d{2})$")


_SEPARATORS = re.compile(r"[\s_-]+")


def _appears(value: Any, text: str) -> bool:
    """``value`` (normalised) occurs in ``text`` (lower-cased): strings as written, ignoring
    case, spacing and ``_``/``-`` (``one_way`` for "one-way"); ISO dates also as the user says
    them ("May 20th", "20 May")."""
    if _is_number(value):
        return True  # numbers are computed, not transcribed: structured data reasoning
    if not isinstance(value, str):
        return True
    v = " ".join(value.lower().split())
    if not v or v in text or _SEPARATORS.sub(" ", v) in _SEPARATORS.sub(" ", text):
        return True
    if m := _ISO_DATE.match(v):
        month, day = int(m[1]), int(m[2])
        for w in _DATE_WORDS.finditer(text):
            mon, d = (w[1], w[2]) if w[1] else (w[4], w[3])
            if _MONTHS[mon] == month and int(d) == day:
                return True
    return False


_TOKEN = re.compile(r"[a-z0-9][a-z0-9_.@'-]*[a-z0-9]")


_NAME_KEY = re.compile(r"(^|[._])(id|name|first_name|last_name|email|dob|date|phone|zip|number)$|_ids?$")


def _identifier(path: str, value: str) -> bool:
    """A value copied rather than composed: an id, a name, an email, a date (by its argument's
    name, or holding a digit, ``_`` or ``@``) of at most three words; free text (a title, a
    reason, a summary) is the agent's own wording."""
    key = re.sub(r"\[\d+\]", "", path)
    return len(value.split()) <= 3 and (bool(_NAME_KEY.search(key)) or bool(re.search(r"[\d_@]", value)))


def _near_miss(value: str, text: str) -> str | None:
    """A token of ``text`` that ``value`` is a slip of (one or two characters off), or None."""
    words = value.lower().split()
    tokens = None
    for w in words:
        if len(w) < 4 or w in text:
            continue
        tokens = tokens if tokens is not None else set(_TOKEN.findall(text))
        limit = 1 if len(w) < 8 else 2
        for tok in tokens:
            if tok[0] == w[0] and tok != w and _edit_distance(w, tok, limit) <= limit:
                return tok
    return None


# ============================================================================= pairing

def _compared(e: dict) -> dict:
    args = e.get("arguments") or {}
    keys = e.get("compare_args")
    return args if keys is None else {k: v for k, v in args.items() if k in keys}


def _same(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return math.isclose(float(a), float(b), rel_tol=0, abs_tol=1e-9)
    if isinstance(a, str) and isinstance(b, str):
        return " ".join(a.lower().split()) == " ".join(b.lower().split())
    return type(a) is type(b) and a == b


_MISSING = object()


def diffs(expected: Any, actual: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Leaves of ``expected`` that ``actual`` does not match: (path, expected, actual).
    Lists holding the same elements in another order match."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [(path, expected, actual)]
        return [d for k, ev in expected.items()
                for d in diffs(ev, actual.get(k, _MISSING), f"{path}.{k}" if path else k)]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [(path, expected, actual)]
        key = lambda x: json.dumps(x, sort_keys=True)  # noqa: E731
        if sorted(map(key, expected)) == sorted(map(key, actual)):
            return []
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in diffs(e, a, f"{path}[{i}]")]
    return [] if _same(expected, actual) else [(path, expected, actual)]


def _cost(e: dict, c: Call) -> float:
    """How badly expected write ``e`` and call ``c`` of the same tool match: another entity
    costs most, then each differing argument; a failed call is a worse match than a made one."""
    other_entity = entity(e.get("arguments") or {}) != entity(c.arguments)
    return 100 * other_entity + len(diffs(_compared(e), c.arguments)) + 0.5 * c.error


def write_pairs(v: View, accepted: bool = False) -> list[tuple[dict, Call]]:
    """Expected writes paired with the agent's calls of the same tool (``accepted``: only those
    the tool did not refuse) by a minimum-cost assignment (entity ids first, then arguments),
    not in order; unpaired ones are left out."""
    pairs = []
    for name in dict.fromkeys(e["name"] for e in v.expected_writes):
        exp = [e for e in v.expected_writes if e["name"] == name]
        acts = [c for c in v.calls if c.name == name and not (accepted and c.error)]
        pairs += [(exp[i], acts[j]) for i, j in _assign([[_cost(e, c) for c in acts] for e in exp])]
    return pairs


def _assign(cost: list[list[float]]) -> list[tuple[int, int]]:
    """A minimum-cost matching of rows to columns pairing min(rows, columns) of them (exact
    dynamic programme over subsets of the smaller side; greedy past 12, which real tasks
    never reach)."""
    rows, cols = len(cost), len(cost[0]) if cost else 0
    if not rows or not cols:
        return []
    if rows > cols:
        return [(i, j) for j, i in _assign([list(col) for col in zip(*cost)])]
    if cols > 12:
        used, out = set(), []
        for i in range(rows):
            j = min((j for j in range(cols) if j not in used), key=lambda j: cost[i][j])
            used.add(j)
            out.append((i, j))
        return out
    best: dict[int, tuple[float, list]] = {0: (0.0, [])}
    for i in range(rows):
        nxt: dict[int, tuple[float, list]] = {}
        for mask, (total, chosen) in best.items():
            for j in range(cols):
                if not mask & (1 << j):
                    key, val = mask | (1 << j), total + cost[i][j]
                    if key not in nxt or val < nxt[key][0]:
                        nxt[key] = (val, chosen + [(i, j)])
        best = nxt
    return min(best.values(), key=lambda x: x[0])[1]


# ============================================================================= the rules

_STATUS_WORDS = {"pending", "delivered", "processed", "shipped", "active", "open", "closed",
                 "completed", "cancelled", "canceled", "suspended", "available", "scheduled",
                 "confirmed", "flown", "landed", "expired"}
_DEAD = {"cancelled", "canceled", "closed", "deleted", "expired", "terminated"}
_STATE_ERROR = re.compile(r"\b(already|cannot|can ?not|can't|not allowed|not permitted|"
                          r"not eligible|ineligible|no longer|non-[a-z]+|only .* can|status)\b", re.I)
_NOW = re.compile(r"current time is (\d{4}-\d{2}-\d{2})[ t](\d{2}:\d{2}(?::\d{2})?)", re.I)
_WINDOW = re.compile(r"within (?:the (?:last|past|first) )?(\d+) (?:hours?|hrs?)\b", re.I)


def _read_of(v: View, c: Call, ent: Any) -> tuple[Call, dict] | None:
    """The latest error-free call before ``c`` (pre-filled history included) that showed entity
    ``ent``: a read that took it as an argument or returned it, or a write that returned it.
    Its result's record for the entity ({} when the result is not JSON)."""
    for p in reversed([p for p in v.context if p.index < c.index]):
        if p.error or p.kind not in ("read", "write"):
            continue
        took = p.kind == "read" and ent in [x for _, x in leaves(p.arguments)]
        shown = str(ent) in (p.result or "") and (p.kind == "write" or not any(
            _is_id_key(k) and x != ent for k, x in leaves(p.arguments)))
        if took or shown:
            records = [r for r in _records(_parse(p.result)) if ent in r.values()]
            return p, (records[0] if records else {})
    return None


def _authenticated(v: View, c: Call) -> set:
    """User ids the agent looked up before call ``c`` (whose details it read)."""
    return {p.arguments["user_id"] for p in v.context if p.index < c.index
            and p.kind == "read" and not p.error and isinstance(p.arguments.get("user_id"), str)}


def _policy_window(v: View) -> tuple[datetime, int] | None:
    """The current time and an N-hour window of the policy (its text or the system prompt),
    when both are stated ("The current time is 2024-05-15 15:00:00", "the booking was made
    within the last 24 hrs")."""
    now, window = _NOW.search(v.policy), _WINDOW.search(v.policy)
    if not now or not window:
        return None
    try:
        t = datetime.fromisoformat(f"{now[1]} {now[2]}")
    except ValueError:
        return None
    return t, int(window[1])


def _exempt(rec: dict) -> bool:
    """The record shows what such windows usually exempt: a premium cabin or insurance."""
    return str(rec.get("cabin", "")).lower() == "business" or str(rec.get("insurance", "")).lower() == "yes"


_FORBIDS = re.compile(r"(?:^|[.:;!?\n]|^\W+)\s*(?:[-*]\s*)?([a-z][a-z ]{2,40}?) (flight|ticket|order|"
                      r"reservation|booking|item|account|line|plan)s? cannot be "
                      r"(modified|changed|updated|cancel+ed|returned|exchanged|booked)\b", re.M)
_VERBS = {"modified": {"modify", "update", "change", "edit"}, "changed": {"modify", "update", "change", "edit"},
          "updated": {"modify", "update", "change", "edit"}, "cancelled": {"cancel"}, "canceled": {"cancel"},
          "returned": {"return"}, "exchanged": {"exchange"}, "booked": {"book"}}


def _forbidden_by_policy(v: View, c: Call, rec: dict) -> str | None:
    """A rule of the policy of the form "<value> <things> cannot be <done>" ("Basic economy
    flights cannot be modified") that the record shows applies to this write: a field of the
    record holds <value> (``basic_economy``), the write's name does <done>, and the write does
    not itself change that field (a cabin upgrade is not a modification of the flights), and
    the write is about those <things> (its name or an argument names them: changing the
    passengers of a basic economy reservation is allowed)."""
    words = set(c.name.lower().split("_"))
    about = words | {k.lower() for k in c.arguments}
    for m in _FORBIDS.finditer(v.policy):
        subject, noun, verb = " ".join(m[1].split()), m[2], m[3]
        if not words & _VERBS.get(verb, set()) or not {noun, noun + "s"} & about:
            continue
        for k, x in rec.items():
            if (isinstance(x, str) and _SEPARATORS.sub(" ", x.lower()).strip() == subject
                    and c.arguments.get(k, x) == x):
                return f"the policy says {subject} {noun}s cannot be {verb}; the record showed {k}={x!r}"
    return None


def _parts(args: dict) -> list[tuple[str, Any]]:
    """The things a write puts inside its entity, by id: ``*_id``/``*_number`` fields of objects
    in its lists (``flights[0].flight_number``) and the strings of ``*_ids`` lists
    (``new_item_ids``); never payment ids (the user's to choose)."""
    out = []
    for path, x in leaves(args):
        key = re.sub(r"\[\d+\]", "", path).split(".")[-1]
        if (not isinstance(x, (str, int)) or isinstance(x, bool) or "payment" in path
                or "[" not in path):
            continue
        if key.endswith(("_id", "_number")) or (key.endswith("_ids") and path.endswith("]")):
            out.append((path, x))
    return out


def _unseen_part(v: View, c: Call) -> str | None:
    """A part of write ``c`` (see :func:`_parts`) that no earlier read result showed, other than
    a read of *another* record of the kind the write changes (the flights of an old booking are
    not a search for a new one: their status, seats and price may have changed)."""
    kinds = {w for w in c.name.lower().split("_") if len(w) > 2}
    for path, x in _parts(c.arguments):
        shown = False
        for p in v.context:
            if p.index >= c.index or p.kind != "read" or p.error or str(x) not in (p.result or ""):
                continue
            other = [k for k, val in p.arguments.items() if _is_id_key(k) and k[:-3] in kinds
                     and c.arguments.get(k) != val]
            if not other:
                shown = True
                break
        if not shown:
            return f"{path}={_quote(x)} was never shown by a read of its own (a search, a listing)"
    return None


def precondition_problem(v: View, c: Call) -> tuple[Verdict | None, Call | None]:
    """Why write ``c`` was not allowed by what the agent had read (a LACKING verdict), or None;
    and the read that showed its entity (None when there was none or no entity)."""
    if (ent := entity(c.arguments)) is None:
        return None, None
    read = _read_of(v, c, ent)
    if read is None:
        return Verdict(LACKING, c.index, f"{c.name} on {_quote(ent)} with no earlier read of it"), None
    p, rec = read
    status = rec.get("status")
    words = set(c.name.lower().split("_"))
    if isinstance(status, str) and status.lower() not in words and (
            words & _STATUS_WORDS or status.lower() in _DEAD):
        return Verdict(LACKING, c.index, f"{c.name} on {_quote(ent)} although the read at turn "
                       f"{p.result_index} showed status {status!r}"), p
    owner, users = rec.get("user_id"), _authenticated(v, c)
    if isinstance(owner, str) and owner != ent and users and owner not in users:
        return Verdict(LACKING, c.index, f"{c.name} on {_quote(ent)}, owned by {owner!r} (turn "
                       f"{p.result_index}), not by the user looked up ({', '.join(sorted(users))})"), p
    window = _policy_window(v)
    if window and "cancel" in words and isinstance(rec.get("created_at"), str) and not _exempt(rec):
        try:
            created = datetime.fromisoformat(rec["created_at"].replace("T", " "))
        except ValueError:
            created = None
        if created and window[0] - created > timedelta(hours=window[1]):
            return Verdict(LACKING, c.index, f"{c.name} on {_quote(ent)} booked {rec['created_at']}, "
                           f"more than {window[1]} hours before now ({window[0]}; turn "
                           f"{p.result_index}): outside the policy's window"), p
    if forbidden := _forbidden_by_policy(v, c, rec):
        return Verdict(LACKING, c.index, f"{c.name} on {_quote(ent)} (turn {p.result_index}): {forbidden}"), p
    if unseen := _unseen_part(v, c):
        return Verdict(LACKING, c.index, f"{c.name} on {_quote(ent)}: {unseen}"), p
    if c.error and _STATE_ERROR.search(c.result or ""):
        return Verdict(LACKING, c.result_index, f"{c.name} on {_quote(ent)} refused: "
                       f"{_quote((c.result or '').strip(), 100)}"), p
    return None, p


def rule_precondition_verification(v: View) -> Verdict:
    """Precondition verification: before changing an entity, the agent read it, and what the
    read showed allowed the change.

    For each write with an entity (its ``*_id``, see :func:`entity`): LACKING when no earlier
    error-free call (pre-filled history included) showed the entity; when the read showed a
    status the tool's name excludes (``cancel_pending_order`` on a ``processed`` order) or a
    closed entity (``cancelled``); when it showed another owner (``user_id``) than every user
    the agent looked up; when it showed a ``created_at`` older than the policy's "within N
    hours" window, no premium cabin or insurance, and the write cancels; when a policy rule
    "<value> <things> cannot be <done>" applies to it (:func:`_forbidden_by_policy`); when a
    part it puts in (a booking's flights, an exchange's new items) was never shown by a read of
    its own (:func:`_unseen_part`); or when the tool refused the write for the entity's state
    ("already", "cannot", "not eligible"). PRESENT
    when every such write passed, or when the agent made no write but read a record and told
    the user the change was not possible (it declined what the record forbade); NA otherwise.
    """
    judged = None
    for c in v.writes:
        problem, read = precondition_problem(v, c)
        if problem is not None:
            return problem
        if read is not None:
            judged = judged or Verdict(PRESENT, read.result_index, f"read {_quote(entity(c.arguments))} "
                                       f"(turn {read.result_index}) before {c.name}; nothing it "
                                       "showed forbade the change")
    if judged:
        return judged
    if not v.writes:
        declined = _declined_after_read(v)
        if declined is not None:
            return declined
    return Verdict(NA, None, "no write on an identified entity")


def _declined_after_read(v: View) -> Verdict | None:
    """The agent read a record (a read keyed by an id other than the user's) and then told the
    user the change could not be made."""
    read = next((c for c in v.calls if c.kind == "read" and not c.error and any(
        _is_id_key(k) and k != "user_id" for k in c.arguments)), None)
    if read is None:
        return None
    after = read.result_index or read.index
    for j, m in enumerate(v.messages[after + 1:], after + 1):
        if m.get("role") == "assistant" and _REFUSE.search(m.get("content") or ""):
            return Verdict(PRESENT, j, f"read {read.name} (turn {read.index}) and declined the change")
    return None


_REFUSE = re.compile(r"\b(not eligible|cannot be (?:cancel|modif|chang|return|exchang|refund)|"
                     r"can't be (?:cancel|modif|chang)|unable to (?:cancel|modify|change|process)|"
                     r"not (?:allowed|permitted|possible) to|does not (?:allow|qualify|meet)|"
                     r"doesn't (?:allow|qualify|meet)|not able to (?:cancel|modify|change))", re.I)


def rule_argument_precision(v: View) -> Verdict:
    """Tool-call argument precision: the values the agent writes are the ones it was given.

    A transcription slip: a write's string argument appears nowhere in what the user said or
    the tools returned before it, while a value one or two characters away does ("mia_li_3669"
    after "mia_li_3668"), or, where the task's expected writes are known, the agent called the
    right tool on the right entity and wrote a value that does not appear in the conversation
    where the expected one does. A value that appeared (another flight of a search result, the
    wrong reservation) is a *decision*, not a slip: not this capability. Numbers are computed,
    not transcribed (structured data reasoning). LACKING on a slip; PRESENT when the agent made
    writes and none holds a slip; NA when it made no write.
    """
    writes = v.writes
    if not writes:
        return Verdict(NA, None, "no write")
    paired = {id(c): e for e, c in write_pairs(v)}
    for c in writes:
        seen = v.seen_before(c.index)
        e = paired.get(id(c))
        if e is not None and entity(e.get("arguments") or {}) == entity(c.arguments):
            for path, exp, act in diffs(_compared(e), c.arguments):
                if (isinstance(exp, str) and isinstance(act, str) and _appears(exp, seen)
                        and not _appears(act, seen)):
                    return Verdict(LACKING, c.index, f"{c.name} {path}={_quote(act)}, which appears "
                                   f"nowhere before; {_quote(exp)} does")
        for path, x in leaves(c.arguments):
            if (isinstance(x, str) and _identifier(path, x) and not _appears(x, seen)
                    and (tok := _near_miss(x, seen))):
                return Verdict(LACKING, c.index, f"{c.name} {path}={_quote(x)}, a slip of "
                               f"{_quote(tok)} seen earlier")
    return Verdict(PRESENT, writes[0].index, f"{len(writes)} write(s); every value was given earlier "
                   "or is the agent's own choice")


_AMOUNT_ERROR = re.compile(r"\b(amount|total|price|balance|add up|sum|fare|cost|refund)\b", re.I)


def rule_structured_data_reasoning(v: View) -> Verdict:
    """Structured data reasoning: numbers the agent computes (amounts, prices, counts) are right.

    LACKING when a tool refused a write over an amount ("payment amount does not add up, total
    price is 305, but paid 255"), or, where the task's expected writes are known, the agent made
    the same write (same tool, entity and every non-numeric argument: the same decision) with
    another number. PRESENT when the agent made an accepted write with a number in it and
    neither happened; NA when no write held a number.
    """
    for c in v.writes:
        if c.error and _AMOUNT_ERROR.search(c.result or "") and any(_is_number(x) for _, x in leaves(c.arguments)):
            return Verdict(LACKING, c.result_index, f"{c.name} refused over an amount: "
                           f"{_quote((c.result or '').strip(), 100)}")
    for e, c in write_pairs(v):
        d = diffs(_compared(e), c.arguments)
        if d and all(_is_number(exp) and _is_number(act) for _, exp, act in d):
            path, exp, act = d[0]
            return Verdict(LACKING, c.index, f"{c.name}: the expected change with {path}={act} "
                           f"where {exp} was right")
    numeric = [c for c in v.writes if not c.error and any(_is_number(x) for _, x in leaves(c.arguments))]
    if numeric:
        return Verdict(PRESENT, numeric[0].index, f"{numeric[0].name} carried numbers; none was refused "
                       "or found wrong")
    return Verdict(NA, None, "no write with a number")


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


_CONFIRM_ALL = re.compile(r"before taking any actions?|any actions? that (?:update|change|modif)|"
                          r"before (?:any|each|every) (?:write|change|update|state)|"
                          r"obtain (?:explicit )?(?:user )?confirmation|explicit (?:user )?confirmation")
_CONFIRM_PRICE = re.compile(r"confirm (?:the )?(?:price|cost|charge|amount|fee)")
_PAID = re.compile(r"pay|charge|purchase|buy|refuel|plan|upgrade|book|order|fee|bill")


def confirmation_scope(policy: str) -> str | None:
    """What the policy asks the user to confirm: ``"all"`` writes (airline, retail: "obtain
    explicit user confirmation (yes)"), ``"paid"`` changes only (telecom: "Confirm the price"),
    or None (it never says confirm). An unknown policy (none given) asks for all."""
    if not policy.strip() or _CONFIRM_ALL.search(policy):
        return "all"
    if _CONFIRM_PRICE.search(policy):
        return "paid"
    return "all" if "confirm" in policy else None


_NOT_THIS = r"(?! (?:about|for|my|your|the|until|yet|with (?!me\b)))"  # "no need to ask about bags"
_WAIVE = re.compile(r"\bno need (?:to (?:ask|confirm)" + _NOT_THIS + r"|for (?:a |any )?confirmation)|"
                    r"\b(?:don't|do not|dont) (?:need to|have to) (?:ask|confirm)" + _NOT_THIS + "|"
                    r"\b(?:don't|do not|dont) (?:ask|bother asking) me\b|"
                    r"\bno confirmation (?:is )?(?:needed|necessary|required)|\bskip (?:the )?confirmation", re.I)
#: a policy that lets the user waive the confirmation ("... unless they said there is no need to
#: confirm"); airline and retail ("obtain explicit user confirmation") do not
_WAIVABLE = re.compile(r"unless[^.]{0,80}(?:no need|not need|don't need|waive)", re.I)


def _waived(v: View, index: int) -> bool:
    """The policy lets the user waive the confirmation and a user message before ``index``
    waives it ("no need to confirm", "don't ask me"; not "don't do it without asking me", "no
    need to ask about bags")."""
    return bool(_WAIVABLE.search(v.policy)) and any(
        m.get("role") == "user" and _WAIVE.search((m.get("content") or "").replace("\u2019", "'"))
        for m in v.messages[:index])


def _stated(value, said: str) -> bool:
    """``value`` is in ``said`` (the user's words, lower-cased) as a word of its own: a number as
    written (``1500`` also as "1,500"), a string ignoring case, spacing and ``_``/``-``."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return False
    if _is_number(value):
        forms = {str(value)}
        if float(value).is_integer():
            forms |= {str(int(value)), f"{int(value):,}"}
    else:
        forms = {_SEPARATORS.sub(" ", " ".join(value.lower().split())).strip()}
        said = _SEPARATORS.sub(" ", said)
    return any(f and re.search(r"(?<![\w.,]){}(?![\w]|[.,]\d)".format(re.escape(f)), said) for f in forms)


def unconfirmed_request(v: View, c: Call) -> bool:
    """Write ``c`` is what the user asked for, word for word (every argument's value is in the
    user's messages before it, as a word of its own), made without the yes the policy asks for
    (its scope, no waiver). When the task then called for no such change, asking would have
    told (the user says no, or another value), or the policy forbids it: the rules cannot tell
    which, so policy adherence abstains and confirmation before write judges it."""
    scope = confirmation_scope(v.policy)
    if scope is None or scope == "paid" and not _paid(c) or _waived(v, c.index):
        return False
    said = " ".join(" ".join((m.get("content") or "").lower().split())
                    for m in v.messages[:c.index] if m.get("role") == "user")
    values = [x for _, x in leaves(c.arguments)]
    return bool(values) and all(_stated(x, said) for x in values) and not _confirmed(v.messages, c.index)


def _paid(c: Call) -> bool:
    """A write that costs the user: it carries an amount, or its name says so."""
    return bool(_PAID.search(c.name.lower())) or any(_is_number(x) for _, x in leaves(c.arguments))


def rule_confirmation_before_write(v: View) -> Verdict:
    """Confirmation before write: the user explicitly agreed before each state change.

    A write is confirmed when the last user message before it affirms (yes, confirm, proceed,
    go ahead, ...; not starting with "no") and answers an assistant message that asked (a
    question mark, "confirm" or "proceed"). Which writes need it comes from the policy (the
    target's or the system prompt; see :func:`confirmation_scope`): all of them, the paid ones,
    or none; where the policy lets the user waive it, a write after they did ("no need to
    confirm", "don't ask me", see :func:`_waived`) needs none. LACKING when any write that needs it is unconfirmed, or is a retry with other
    arguments (a refused booking made again with another payment) that no new yes preceded;
    PRESENT when all are confirmed; NA when
    the agent made no write that needed one.
    """
    writes = v.writes
    if not writes:
        return Verdict(NA, None, "no write")
    scope = confirmation_scope(v.policy)
    if scope is None:
        return Verdict(NA, None, "the policy asks for no confirmation")
    if scope == "paid":
        writes = [c for c in writes if _paid(c)]
        if not writes:
            return Verdict(NA, None, "the policy asks for confirmation of paid changes only; none was made")
    writes = [c for c in writes if not _waived(v, c.index)]
    if not writes:
        return Verdict(NA, None, "the user said no confirmation was needed")
    for c in writes:
        if not _confirmed(v.messages, c.index):
            return Verdict(LACKING, c.index, f"{c.name} without an explicit yes to a question first")
        yes = max(j for j in range(c.index) if v.messages[j].get("role") == "user")
        before = next((d for d in v.writes if yes < d.index < c.index and d.name == c.name and d.error
                       and entity(d.arguments) == entity(c.arguments) and d.arguments != c.arguments), None)
        if before is not None:
            changed = sorted(k for k in set(c.arguments) | set(before.arguments)
                             if c.arguments.get(k) != before.arguments.get(k))
            return Verdict(LACKING, c.index, f"{c.name} retried with other {', '.join(changed)} than "
                           f"the call the user's yes (turn {yes}) was for (turn {before.index})")
    return Verdict(PRESENT, writes[0].index, f"each of {len(writes)} write(s) followed the user's yes")


def rule_policy_adherence(v: View) -> Verdict:
    """Policy adherence / refusal: the agent changes nothing the task did not call for.

    Pairs the agent's accepted writes with the task's expected writes (see
    :func:`write_pairs`). LACKING when an accepted write is left over (a change the policy
    forbids, one nobody asked for, a second booking) and the entity's state does not explain it
    (that one is precondition verification's: one root cause, one label; so is the user's own
    request made without the yes the policy asks for, confirmation before write's: see
    :func:`unconfirmed_request`); LACKING too when an
    accepted write on the expected entity made another choice than the task's (another
    destination, cabin, payment method; not an amount, not a slip); PRESENT when every accepted
    write was expected as made, including a task that expected none and an agent that refused; NA when the
    expected actions are unknown, the agent changed nothing although the task expected a
    change (see action completion), or it made the user's request without the yes the policy
    asks for and nothing else was wrong. Reads the expected actions.
    """
    if v.expected is None:
        return Verdict(NA, None, "the task's expected actions are unknown")
    made = [c for c in v.writes if not c.error]
    if not made:
        return (Verdict(NA, None, "no change made; the task expected some") if v.expected_writes
                else Verdict(PRESENT, None, "no change made, and none was expected"))
    pairs = write_pairs(v, accepted=True)
    paired = {id(c) for _, c in pairs}
    requested = {id(c) for c in made if unconfirmed_request(v, c)}  # confirmation's to judge
    extra = [c for c in made if id(c) not in paired and precondition_problem(v, c)[0] is None]
    excused = next((c for c in extra if id(c) in requested), None)
    extra = [c for c in extra if id(c) not in requested]
    if extra:
        c = extra[0]
        return Verdict(LACKING, c.index, f"{c.name}({_quote(c.arguments, 80)}) is a change the task "
                       "did not call for")
    for e, c in pairs:
        if entity(e.get("arguments") or {}) != entity(c.arguments):
            continue
        seen = v.seen_before(c.index)
        for path, exp, act in diffs(_compared(e), c.arguments):
            if _is_number(exp) and _is_number(act):
                continue  # the same choice, another amount: structured data reasoning
            if act is _MISSING or (isinstance(act, str) and not _appears(act, seen)):
                continue  # left out, or a slip: argument precision
            if id(c) in requested:
                excused = excused or c
                break
            return Verdict(LACKING, c.index, f"{c.name} on {_quote(entity(c.arguments))}: chose "
                           f"{path}={_quote(act)} where the task called for {_quote(exp)}")
    if excused is not None:
        return Verdict(NA, excused.index, f"{excused.name} as the user asked, without their yes: "
                       "confirmation before write's to judge")
    return Verdict(PRESENT, made[0].index, f"all {len(made)} change(s) were called for")


def rule_action_completion(v: View) -> Verdict:
    """Action completion: every change the task called for, and the record allowed, is made.

    The expected writes say what was called for; each is paired with an accepted call (see
    :func:`write_pairs`). LACKING when one has none (the agent stopped early, gave up, only
    promised, or transferred instead), unless what the agent read of its entity forbade it
    (the same checks as precondition verification: then refusing was right, NA for it).
    PRESENT when all owed changes were made; NA when the expected actions are unknown, hold no
    write, or every missing one was rightly refused. Reads the expected actions.
    """
    if not v.expected_writes:
        return Verdict(NA, None, "the task expected no change (or is unknown)")
    paired = {id(e) for e, _ in write_pairs(v, accepted=True)}
    end = max((i for i, m in enumerate(v.messages) if m.get("role") == "assistant"), default=None)
    owed = 0
    for e in v.expected_writes:
        if id(e) in paired:
            owed += 1
            continue
        # would the agent's own reads have allowed this change at the end of the conversation?
        probe = Call(len(v.messages), "", e["name"], e.get("arguments") or {}, "write")
        problem, read = precondition_problem(v, probe)
        if problem is not None and read is not None:
            continue  # the record it read forbade the change: not owed
        return Verdict(LACKING, end, f"never made {e['name']}({_quote(e.get('arguments'), 80)})")
    if not owed:
        return Verdict(NA, None, "every expected change was one the records read forbade")
    return Verdict(PRESENT, None, f"made the {owed} owed change(s)")


_TOLD = re.compile(r"\b(unable|not able|can't|cannot|could not|couldn't|not possible|unfortunately|"
                   r"sorry|apolog|error|failed|not eligible|not allowed|already|isn't possible|"
                   r"not enough|insufficient|no longer)\b", re.I)
_FIXABLE = re.compile(r"\b(invalid|does not add up|doesn't add up|missing|required|must be|"
                      r"format|unexpected keyword|not a valid|malformed|wrong type)\b", re.I)


def rule_error_recovery(v: View) -> Verdict:
    """Error recovery: after a tool call fails, the agent fixes what it can and says what it
    cannot.

    A call failed when its result starts with "Error" (tau-bench and tau2 both report tool
    exceptions so). It is recovered when a later call of the same tool succeeds. An unrecovered
    failure is final when the tool named a state, not a mistake in the call (not "invalid",
    "does not add up", "missing", ...) and the agent's next words told the user so ("unable",
    "cannot", "sorry", ...). LACKING when a failure is neither recovered nor final and told;
    PRESENT when one was recovered and none is LACKING; NA when no call failed, or every
    failure was final and the user was told.
    """
    recovered = None
    for i, c in enumerate(v.calls):
        if not c.error:
            continue
        fix = next((d for d in v.calls[i + 1:] if d.name == c.name and not d.error), None)
        if fix is not None:
            recovered = recovered or Verdict(PRESENT, fix.index, f"{c.name} failed (turn "
                                             f"{c.result_index}) and succeeded again at turn {fix.index}")
            continue
        after = (c.result_index or c.index) + 1
        said = next(((j, m["content"]) for j, m in enumerate(v.messages[after:], after)
                     if m.get("role") == "assistant" and (m.get("content") or "").strip()), None)
        error = _quote((c.result or "").strip(), 90)
        if said and _TOLD.search(said[1]) and not _FIXABLE.search(c.result or ""):
            continue
        why = (f"{c.name} failed ({error}) and was never made to succeed"
               + (" although the error was fixable" if _FIXABLE.search(c.result or "") else
                  "; the user was not told"))
        return Verdict(LACKING, c.result_index, why)
    if recovered:
        return recovered
    failed = [c for c in v.calls if c.error]
    if failed:
        return Verdict(NA, failed[0].result_index, "every failure was final and the agent said so")
    return Verdict(NA, None, "no call failed")


def rule_escalation_judgement(v: View) -> Verdict:
    """Escalation judgement: the agent transfers to a human exactly when the task calls for it.

    LACKING when the agent transferred (``transfer_to_human_agents``) and the expected actions
    hold no transfer, or the task expected a transfer and the agent made none; PRESENT when both
    transferred; NA when neither did, or the expected actions are unknown. Reads the expected
    actions.
    """
    if v.expected is None:
        return Verdict(NA, None, "the task's expected actions are unknown")
    did = next((c for c in v.calls if c.kind == "escalation"), None)
    wanted = any(tool_kind(e["name"], v.meta) == "escalation" for e in v.expected)
    if did is None and not wanted:
        return Verdict(NA, None, "no transfer made or expected")
    if did is not None and wanted:
        return Verdict(PRESENT, did.index, "transferred, as the task called for")
    if did is not None:
        return Verdict(LACKING, did.index, f"{did.name}: a transfer the task did not call for")
    return Verdict(LACKING, None, "the task called for a transfer to a human; none was made")


@dataclass(frozen=True)
class Rule:
    capability: Capability
    judge: Callable[[View], Verdict]
    reads_expected: bool  # decides from the task's expected actions (ER+ 0 by construction)


#: The structural labeller's capabilities, named like the synthesizer's families where they overlap.
STRUCTURAL_RULES: list[Rule] = [
    Rule(Capability("precondition verification",
                    "reads the entity a write changes (its status, ownership, eligibility) and "
                    "changes it only when what it read allows the change"),
         rule_precondition_verification, False),
    Rule(Capability("tool-call argument precision",
                    "copies ids, names, dates and options exactly as the user or the tools gave "
                    "them into write calls (no transcription slips)"), rule_argument_precision, False),
    Rule(Capability("structured data reasoning",
                    "computes the numbers a write needs (amounts, prices, counts) correctly from "
                    "the data the tools returned"), rule_structured_data_reasoning, False),
    Rule(Capability("confirmation before write",
                    "lists the action and obtains the user's explicit yes before changing state"),
         rule_confirmation_before_write, False),
    Rule(Capability("policy adherence / refusal",
                    "refuses changes the policy forbids and makes no change the task did not ask "
                    "for"), rule_policy_adherence, True),
    Rule(Capability("action completion",
                    "carries out every state change the task requires instead of stopping early"),
         rule_action_completion, True),
    Rule(Capability("error recovery",
                    "after a tool error, corrects the call and gets it to succeed, or tells the "
                    "user plainly when the error is final"), rule_error_recovery, False),
    Rule(Capability("escalation judgement",
                    "transfers to a human agent when, and only when, the request is out of scope"),
         rule_escalation_judgement, True),
]


def label_structural(trajectories: Sequence[Trajectory], meta: dict[str, dict] | None = None,
                     policy: str | None = None) -> tuple[list[Capability], list[dict[str, Verdict]]]:
    """The capabilities of :data:`STRUCTURAL_RULES` and, per trajectory, name -> verdict."""
    caps = [r.capability for r in STRUCTURAL_RULES]
    verdicts = []
    for t in trajectories:
        v = view(t, meta, policy)
        verdicts.append({r.capability.name: r.judge(v) for r in STRUCTURAL_RULES})
    return caps, verdicts
