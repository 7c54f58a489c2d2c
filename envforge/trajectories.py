"""Trajectories: an agent's recorded runs on a target, in one canonical form.

A :class:`Trajectory` holds the task id, the conversation as OpenAI-format messages (the
contract's ``Message``: tool calls with JSON-string arguments, tool results with
``tool_call_id``), the reward, whether it counts as a success (``reward >= success_threshold``),
the actions the task expected when the file records them, and metadata (source file, trial, ...).

Importers, chosen by content (``format="auto"``) or by name:

``tau2``
    tau2-bench ``Results``: one JSON file ``{info, tasks[], simulations[]}``, or the directory
    form (``results.json`` holding the metadata and tasks, ``simulations/<id>.json`` one
    simulation each). tau2's own messages are converted: tool calls ``{id, name, arguments
    (dict), requestor}`` become OpenAI tool calls, tool results ``{id, content, error}`` become
    ``{role: tool, tool_call_id, content}``. Calls the simulated *user* makes on its own device
    (``requestor: user``, telecom) and their results are not the agent's and are left out; the
    user's words are kept. Expected actions come from the task's ``evaluation_criteria.actions``
    (``None`` when the task has none).
``tau-bench``
    tau-bench v1 result lists: ``[{task_id, trial, reward, info: {task: {actions[{name,
    kwargs}]}}, traj: [OpenAI messages]}]``.
``jsonl``
    envforge's own JSONL: one JSON object per line, ``{"task_id", "messages", "reward",
    "expected_actions"?, "metadata"?}`` (what :func:`write_jsonl` writes; a ``success`` field
    there is ignored: success always comes from the reward and the threshold).

A directory that is not a tau2 results directory is read as a collection: every ``*.json`` and
``*.jsonl`` file in it (not recursive), each imported by content.

An expected action is ``{"name", "arguments" (dict), "requestor" ("assistant" or "user")}``,
plus ``"compare_args"`` (the argument names the benchmark compares) where the file gives them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from envforge.contract import Message
from envforge.errors import InputError, UsageError

FORMATS = ("auto", "tau2", "tau-bench", "jsonl")
DEFAULT_SUCCESS_THRESHOLD = 1.0  # tau-bench counts a task as passed when its reward is 1


@dataclass
class Trajectory:
    """One run of the agent on one task."""
    task_id: str
    messages: list[Message]
    reward: float
    success: bool
    expected_actions: list[dict] | None = None  # None: the file does not say what was expected
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"task_id": self.task_id, "reward": self.reward, "success": self.success,
             "messages": self.messages}
        if self.expected_actions is not None:
            d["expected_actions"] = self.expected_actions
        if self.metadata:
            d["metadata"] = self.metadata
        return d


# ----------------------------------------------------------------------------- entry points

def load_trajectories(paths: str | Path | Iterable[str | Path], format: str = "auto",
                      success_threshold: float = DEFAULT_SUCCESS_THRESHOLD) -> list[Trajectory]:
    """Read every trajectory in ``paths`` (files or directories), in order.

    Raises :class:`InputError` naming the file and what was expected when a file is missing,
    not JSON, or of no known format; :class:`UsageError` for an unknown ``format``.
    """
    if format not in FORMATS:
        raise UsageError(f"unknown trajectory format {format!r}; choose one of {', '.join(FORMATS)}")
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Trajectory] = []
    for p in paths:
        out.extend(_load_path(Path(p), format, success_threshold))
    return out


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> None:
    """Write trajectories as envforge JSONL (one object per line)."""
    with open(path, "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")


def detect_format(data: Any) -> str | None:
    """The format of already-parsed JSON content, or None when it is none of ours."""
    if isinstance(data, dict):
        if isinstance(data.get("simulations"), list) or (
                isinstance(data.get("tasks"), list) and "info" in data):
            return "tau2"
        if "messages" in data and "reward" in data:
            return "jsonl"  # a one-line envforge JSONL file
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        if all("traj" in r and "reward" in r for r in data):
            return "tau-bench"
        if all("messages" in r and "reward" in r for r in data):
            return "jsonl"
    return None


# ----------------------------------------------------------------------------- reading files

_EXPECTED = ("a tau2-bench Results file ({info, tasks, simulations}), a tau-bench v1 result list "
             "([{task_id, reward, info, traj}]) or envforge JSONL (one {task_id, messages, reward} "
             "per line)")


def _load_path(path: Path, fmt: str, threshold: float) -> list[Trajectory]:
    if not path.exists():
        raise InputError(f"{path}: no such file or directory; expected {_EXPECTED}")
    if path.is_dir():
        if (path / "results.json").is_file():
            if fmt not in ("auto", "tau2"):
                raise InputError(f"{path}: a tau2 results directory, but --format {fmt} was given")
            return _tau2_dir(path, threshold)
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".json", ".jsonl"))
        if not files:
            raise InputError(f"{path}: a directory with no .json or .jsonl files; expected a tau2 "
                             "results directory (results.json + simulations/) or trajectory files")
        return [t for f in files for t in _load_file(f, fmt, threshold)]
    return _load_file(path, fmt, threshold)


def _load_file(path: Path, fmt: str, threshold: float) -> list[Trajectory]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a UTF-8 text file; expected {_EXPECTED}") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    if fmt == "jsonl" or (fmt == "auto" and path.suffix == ".jsonl"):
        return _jsonl(path, text, threshold)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if fmt == "auto" and _looks_like_jsonl(text):
            return _jsonl(path, text, threshold)
        raise InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                         f"expected {_EXPECTED}") from None
    if data == []:
        return []  # a run list with no runs: no trajectories (the caller says so), not a bad format
    found = detect_format(data)
    if fmt == "auto":
        if found is None:
            raise InputError(f"{path}: unknown trajectory format (top level is {_shape(data)}); "
                             f"expected {_EXPECTED}")
        fmt = found
    if fmt == "tau2":
        return _tau2(path, data, threshold)
    if fmt == "tau-bench":
        return _taubench(path, data, threshold)
    return _jsonl_records(path, data if isinstance(data, list) else [data], threshold)


def _looks_like_jsonl(text: str) -> bool:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    try:
        return len(lines) > 1 and all(isinstance(json.loads(ln), dict) for ln in lines[:3])
    except json.JSONDecodeError:
        return False


def _shape(data: Any) -> str:
    if isinstance(data, dict):
        keys = ", ".join(sorted(data)[:6])
        return f"an object with keys {keys}" if keys else "an empty object"
    if isinstance(data, list):
        return f"a list of {len(data)} {type(data[0]).__name__ if data else 'items'}"
    return f"a {type(data).__name__}"


def _fail(path: Path, where: str, msg: str) -> InputError:
    return InputError(f"{path}: {where}: {msg}")


# ----------------------------------------------------------------------------- envforge JSONL

def _jsonl(path: Path, text: str, threshold: float) -> list[Trajectory]:
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: line {n} is not valid JSON ({e.msg}); expected one "
                             "{task_id, messages, reward} object per line") from None
    return _jsonl_records(path, records, threshold, first_line=1)


def _jsonl_records(path: Path, records: list, threshold: float, first_line: int = 0) -> list[Trajectory]:
    out = []
    for i, r in enumerate(records):
        where = f"line {i + 1}" if first_line else f"record {i}"
        if not isinstance(r, dict):
            raise _fail(path, where, f"expected a JSON object, got {type(r).__name__}")
        missing = [k for k in ("task_id", "messages", "reward") if k not in r]
        if missing:
            raise _fail(path, where, f"missing {', '.join(missing)}; an envforge trajectory is "
                        "{task_id, messages, reward, expected_actions?, metadata?}")
        reward = _reward(path, where, r["reward"])
        messages = _openai_messages(path, where, r["messages"])
        expected = r.get("expected_actions")
        if expected is not None:
            expected = _expected(path, where, expected, args_key="arguments")
        meta = dict(r.get("metadata") or {})
        meta.update(source=str(path), format="jsonl", index=i)
        out.append(Trajectory(str(r["task_id"]), messages, reward, reward >= threshold,
                              expected, meta))
    return out


# ----------------------------------------------------------------------------- tau2-bench

def _tau2_dir(path: Path, threshold: float) -> list[Trajectory]:
    meta_path = path / "results.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{meta_path}: cannot read the tau2 results metadata ({e})") from None
    sims = []
    sims_dir = path / "simulations"
    for f in sorted(sims_dir.glob("*.json")) if sims_dir.is_dir() else []:
        try:
            sims.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"{f}: not a readable tau2 simulation JSON file ({e})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{meta_path}: expected a tau2 Results object, got {_shape(meta)}")
    index = meta.get("simulation_index")
    if isinstance(index, list):
        missing = {e.get("id") for e in index if isinstance(e, dict)} - {s.get("id") for s in sims
                                                                           if isinstance(s, dict)}
        if missing:
            raise InputError(f"{path}: simulations listed in results.json are missing from "
                             f"simulations/: {', '.join(sorted(map(str, missing)))}")
    if not sims:
        sims = meta.get("simulations") or []
    return _tau2(meta_path, {**meta, "simulations": sims}, threshold)


def _tau2(path: Path, data: Any, threshold: float) -> list[Trajectory]:
    if not isinstance(data, dict) or not isinstance(data.get("simulations"), list):
        raise InputError(f"{path}: expected a tau2 Results object with a 'simulations' list, "
                         f"got {_shape(data)}")
    tasks = {}
    for t in data.get("tasks") or []:
        if isinstance(t, dict) and "id" in t:
            tasks[str(t["id"])] = t
    env_info = (data.get("info") or {}).get("environment_info") if isinstance(data.get("info"), dict) else None
    domain = env_info.get("domain_name") if isinstance(env_info, dict) else None
    policy = env_info.get("policy") if isinstance(env_info, dict) else None
    out = []
    for i, sim in enumerate(data["simulations"]):
        where = f"simulation {i}"
        if not isinstance(sim, dict) or "task_id" not in sim or not isinstance(sim.get("messages"), list):
            raise _fail(path, where, "expected {id, task_id, messages[], reward_info} "
                        "(a tau2 SimulationRun)")
        task_id = str(sim["task_id"])
        reward_info = sim.get("reward_info") or {}
        reward = _reward(path, where, reward_info.get("reward", 0.0) if isinstance(reward_info, dict) else 0.0)
        criteria = (tasks.get(task_id) or {}).get("evaluation_criteria") or {}
        actions = criteria.get("actions") if isinstance(criteria, dict) else None
        expected = None
        if actions is not None:
            expected = _expected(path, f"task {task_id}", actions, args_key="arguments")
        meta = {"source": str(path), "format": "tau2", "trial": sim.get("trial"), "index": i,
                "simulation_id": sim.get("id"), "termination_reason": sim.get("termination_reason")}
        if domain:
            meta["domain"] = domain
        if isinstance(policy, str) and policy.strip():
            meta["policy"] = policy  # the policy the agent was given (tau2 keeps it out of the messages)
        initial = (tasks.get(task_id) or {}).get("initial_state")
        history = initial.get("message_history") if isinstance(initial, dict) else None
        if isinstance(history, list) and history:  # the task began with these turns: not the agent's
            meta["history"] = len(_tau2_messages(path, where, sim["messages"][:len(history)]))
        out.append(Trajectory(task_id, _tau2_messages(path, where, sim["messages"]), reward,
                              reward >= threshold, expected, meta))
    return out


def _tau2_messages(path: Path, where: str, messages: list) -> list[Message]:
    out: list[Message] = []
    for n, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise _fail(path, f"{where}, message {n}", "expected {role: system|user|assistant|tool, ...}")
        role = m["role"]
        if role == "tool":
            if m.get("requestor") == "user":
                continue
            out.append({"role": "tool", "tool_call_id": str(m.get("id", "")),
                        "content": _text(m.get("content"))})
            continue
        if role == "assistant":
            msg: Message = {"role": "assistant", "content": m.get("content")}
            calls = [c for c in m.get("tool_calls") or []
                     if isinstance(c, dict) and c.get("requestor", "assistant") == "assistant"]
            if calls:
                msg["tool_calls"] = [_call(path, f"{where}, message {n}", c.get("id"), c.get("name"),
                                           c.get("arguments", {})) for c in calls]
            out.append(msg)
            continue
        out.append({"role": role, "content": _text(m.get("content"))})
    return out


# ----------------------------------------------------------------------------- tau-bench v1

def _taubench(path: Path, data: Any, threshold: float) -> list[Trajectory]:
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a tau-bench v1 result list, got {_shape(data)}")
    out = []
    for i, r in enumerate(data):
        where = f"record {i}"
        if not isinstance(r, dict) or "traj" not in r or "reward" not in r:
            raise _fail(path, where, "expected {task_id, trial, reward, info, traj} (tau-bench v1)")
        task = (r.get("info") or {}).get("task") if isinstance(r.get("info"), dict) else None
        expected = None
        if isinstance(task, dict) and isinstance(task.get("actions"), list):
            expected = _expected(path, where, task["actions"], args_key="kwargs")
        reward = _reward(path, where, r["reward"])
        meta = {"source": str(path), "format": "tau-bench", "trial": r.get("trial"), "index": i}
        out.append(Trajectory(str(r.get("task_id", i)), _openai_messages(path, where, r["traj"]),
                              reward, reward >= threshold, expected, meta))
    return out


# ----------------------------------------------------------------------------- shared helpers

def _reward(path: Path, where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, where, f"reward must be a number, got {value!r}")
    return float(value)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return json.dumps(content, ensure_ascii=False)


def _call(path: Path, where: str, call_id: Any, name: Any, arguments: Any) -> dict:
    if not isinstance(name, str) or not name:
        raise _fail(path, where, "a tool call has no function name")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {"id": str(call_id or ""), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _openai_messages(path: Path, where: str, messages: Any) -> list[Message]:
    """Normalise OpenAI chat messages: keep role, content, tool_calls, tool_call_id."""
    if not isinstance(messages, list):
        raise _fail(path, where, f"messages must be a list, got {type(messages).__name__}")
    out: list[Message] = []
    for n, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise _fail(path, f"{where}, message {n}",
                        "expected an OpenAI message {role: system|user|assistant|tool, content}")
        role = m["role"]
        if role == "assistant":
            msg: Message = {"role": "assistant", "content": m.get("content")}
            if m.get("content") is not None and not isinstance(m["content"], str):
                msg["content"] = _text(m["content"])
            calls = []
            for c in m.get("tool_calls") or []:
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict):
                    raise _fail(path, f"{where}, message {n}",
                                "expected tool calls {id, type: function, function: {name, arguments}}")
                calls.append(_call(path, f"{where}, message {n}", c.get("id"), fn.get("name"),
                                   fn.get("arguments", "{}")))
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": str(m.get("tool_call_id", "")),
                        "content": _text(m.get("content"))})
        else:
            out.append({"role": role, "content": _text(m.get("content"))})
    return out


def _expected(path: Path, where: str, actions: Any, args_key: str) -> list[dict]:
    if not isinstance(actions, list):
        raise _fail(path, where, f"expected actions must be a list, got {type(actions).__name__}")
    out = []
    for a in actions:
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            raise _fail(path, where, "an expected action needs a name: {name, arguments}")
        args = a.get(args_key, a.get("arguments", {})) or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                raise _fail(path, where, f"arguments of expected action {a['name']!r} are not JSON") from None
        e = {"name": a["name"], "arguments": args, "requestor": a.get("requestor") or "assistant"}
        if a.get("compare_args") is not None:
            e["compare_args"] = list(a["compare_args"])
        out.append(e)
    return out


EXAMPLE_TASK_CHARS = 300  # how much of a task's first user message examples keep


def first_user_text(messages: list[dict]) -> str:
    """The first non-empty user message of ``messages`` in ``task_text``'s form (the router's
    view of an env episode's task too)."""
    first = next((m.get("content") for m in messages
                  if m.get("role") == "user" and isinstance(m.get("content"), str)
                  and m["content"].strip()), "")
    text = " ".join(first.split())
    return text if len(text) <= EXAMPLE_TASK_CHARS else text[:EXAMPLE_TASK_CHARS - 3] + "..."


def render(t: Trajectory, max_chars: int = 12000, per_message: int = 600,
           with_reference: bool = True, numbered: bool = False) -> str:
    """A trajectory as compact text for a prompt (the system prompt is left out). ``numbered``:
    each line starts with its message's index in ``t.messages`` ("[3] USER: ..."), so that a
    reader can point at a turn."""
    def cut(s: str, n: int = per_message) -> str:
        s = " ".join(s.split())
        return s if len(s) <= n else f"{s[:n]}...[+{len(s) - n} chars]"

    lines = []
    for i, m in enumerate(t.messages):
        role, at = m.get("role"), f"[{i}] " if numbered else ""
        if role == "user":
            lines.append(f"{at}USER: {cut(m.get('content') or '')}")
        elif role == "assistant":
            if (m.get("content") or "").strip():
                lines.append(f"{at}AGENT: {cut(m['content'])}")
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                lines.append(f"{at}AGENT CALLS {fn.get('name')}({cut(fn.get('arguments') or '', 400)})")
        elif role == "tool":
            lines.append(f"{at}TOOL RESULT: {cut(m.get('content') or '', 300)}")
    if with_reference and t.expected_actions is not None:
        acts = "; ".join(f"{a['name']}({json.dumps(a.get('arguments'), ensure_ascii=False)})"
                         for a in t.expected_actions) or "none (no change was expected)"
        lines.append(f"REFERENCE SOLUTION ACTIONS: {cut(acts, 1500)}")
    text = "\n".join(lines)
    if len(text) > max_chars:
        half = max_chars // 2
        text = f"{text[:half]}\n[... {len(text) - 2 * half} chars omitted ...]\n{text[-half:]}"
    return text
