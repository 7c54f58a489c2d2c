"""The process sandbox and its runner, with real processes (no mocks).

Protocol round trips run on the best layer this machine has. The adversarial tests feed hostile
env sources straight into the sandbox (the static audit is not involved) on every isolation layer
available here, and check the host afterwards: no file appeared, no connection arrived, the test
process is alive, and no process outlived its sandbox.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import textwrap
import time
from pathlib import Path

import pytest

from envforge.contract import ALLOWED_IMPORTS, Limits
from envforge.errors import (EnvCallError, SandboxCrashed, SandboxProtocolError, SandboxTimeout,
                             SandboxUnavailable, UsageError)
from sandbox.process import LAYERS, SHM_WORKS, ProcessBackend, _probe

CHANNELS = ("shm", "pipe")

REPO = Path(__file__).resolve().parent.parent
MARK = 3_000_000_000 + os.getpid()  # PYTHONHASHSEED of the adversarial sandboxes, to find leaks
FAST = Limits(call_timeout_s=0.5, memory_mb=512)

GOOD_ENV = '''\
"""Capability: order lookup.

Why it transfers: the agent must call the target's lookup tool with the id the user gave.
"""
import json
import random

CAPABILITY = "order lookup"
SKILLS = {"lookup": 1.0}

GET_ORDER = {"type": "function", "function": {
    "name": "get_order", "description": "Look up an order by id.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                   "required": ["order_id"]}}}


class Env:
    tools = [GET_ORDER]
    max_turns = 4

    def reset(self, seed):
        self.order = "#W%04d" % random.Random(seed).randrange(10000)
        messages = [{"role": "system", "content": "Answer questions about orders."},
                    {"role": "user", "content": "Where is my order " + self.order + "?"}]
        return {"messages": messages}, {"skill": "lookup"}

    def step(self, action):
        out, reward = [], 0.0
        for call in action.get("tool_calls") or []:
            args = json.loads(call["function"]["arguments"])
            found = call["function"]["name"] == "get_order" and args.get("order_id") == self.order
            reward = 1.0 if found else reward
            out.append({"role": "tool", "tool_call_id": call["id"],
                        "content": "shipped" if found else "no such order"})
        return {"messages": out}, reward, reward == 1.0, False, {"skill": "lookup"}

    def solve(self, seed):
        self.reset(seed)
        arguments = json.dumps({"order_id": self.order})
        call = {"id": "call_0", "type": "function",
                "function": {"name": "get_order", "arguments": arguments}}
        return [{"role": "assistant", "content": None, "tool_calls": [call]}]
'''
END = 'return {"messages": []}, 0.0, True, False, {}'


def env_with(step: str | None = None, reset: str | None = None) -> str:
    """GOOD_ENV with Env.step and/or Env.reset replaced by these bodies (a broken-env factory)."""
    src = GOOD_ENV + "\n\nclass Env(Env):\n    pass\n"
    for name, arg, body in (("step", "action", step), ("reset", "seed", reset)):
        if body is not None:
            body = textwrap.indent(textwrap.dedent(body), " " * 8)
            src += f"\n    def {name}(self, {arg}):\n{body}\n"
    return src


def returning(info: str) -> str:
    """A step body's last line: end the episode with this info (Python source of a dict)."""
    return f'return {{"messages": []}}, 0.0, True, False, {info}'


def _stat(pid: str) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def processes_marked() -> list[int]:
    """Pids of live processes started with PYTHONHASHSEED=MARK (sandboxes and their children)."""
    needle, found = f"PYTHONHASHSEED={MARK}".encode(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found += [int(pid)] if _stat(pid)[0] != "Z" else []
        except OSError:
            pass
    return found


def children() -> set[int]:
    """Pids whose parent is this test process (psutil is not installed: read /proc)."""
    kids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(_stat(pid)[1]) == os.getpid():
                kids.add(int(pid))
        except (OSError, ValueError, IndexError):
            pass
    return kids


def backend_for(layer: str) -> ProcessBackend:
    backend = ProcessBackend(isolation=layer)
    ok, why = backend.available()
    if not ok:
        pytest.skip(f"isolation layer {layer!r} is not available here: {why}")
    return backend


@pytest.fixture(scope="module")
def best() -> ProcessBackend:
    return backend_for("auto")


@pytest.fixture
def make(best):
    """make(source=None, backend=best, hash_seed=0, **limits) -> a started (and loaded) sandbox,
    killed after the test."""
    def make(source=None, backend=None, hash_seed=0, **limits):
        sb = (backend or best).start(dataclasses.replace(Limits(), **limits), hash_seed=hash_seed)
        make.started.append(sb)
        if source is not None:
            sb.load(source)
        return sb
    make.started = []
    yield make
    for sb in make.started:
        sb.kill()


@pytest.fixture(params=LAYERS)
def hostile(request, make):
    """hostile(source, **limits) -> a loaded sandbox on one layer; afterwards, no process of it
    may be left (checked by environment marker and by parent pid)."""
    backend, before = backend_for(request.param), children()

    def start(source: str, **limits):
        sb = make(source, backend, MARK, **{**dataclasses.asdict(FAST), **limits})
        assert sb.meta["sandbox"]["seccomp"] is ("seccomp" in backend.isolation_layers())
        return sb

    start.layer = request.param
    yield start
    for sb in make.started:
        sb.kill()
    assert processes_marked() == [], "a sandboxed process outlived its sandbox"
    assert children() - before == set(), "a child process of the test leaked"


def step(sb, content="go"):
    sb.new()
    sb.reset(0, 1)
    return sb.step(0, {"role": "assistant", "content": content})


def with_channel(channel: str) -> ProcessBackend:
    """The best layer here, over ``channel`` ("shm" skips where it does not work)."""
    if channel == "shm" and not SHM_WORKS:
        pytest.skip("the shared-memory channel needs Linux on x86-64")
    return ProcessBackend(channel=channel)


# --------------------------------------------------------------------------- the backend

def test_backend_says_what_isolates(best):
    ok, why = best.available()
    assert ok and why.startswith("process sandbox: ")
    assert best.isolation_layers()[-2:] == ["rlimits", "no_new_privs"]


def test_nothing_to_isolate_is_unavailable_with_the_fix():
    backend = ProcessBackend(isolation="none", seccomp=False)
    ok, why = backend.available()
    assert not ok and backend.isolation_layers() == []
    assert "apt-get install bubblewrap" in why and "pip install pyseccomp" in why
    with pytest.raises(SandboxUnavailable, match="nothing would isolate env code here"):
        backend.start(Limits())


def test_missing_tools_degrade_to_the_next_layer(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, no unshare on this PATH
    _probe.cache_clear()
    try:
        ok, why = ProcessBackend(isolation="bwrap").available()
        assert not ok and why == ("the bwrap isolation does not work here: bwrap is not "
                                  "installed (apt-get install bubblewrap)")
        auto = ProcessBackend()
        if not auto.available()[0]:
            pytest.skip(auto.available()[1])
        assert auto.isolation_layers() == ["seccomp", "rlimits", "no_new_privs"]
        assert ("no namespaces (bwrap is not installed (apt-get install bubblewrap); unshare is "
                "not installed (apt-get install util-linux))") in auto.available()[1]
        sb = auto.start(Limits())
        assert sb.backend == "process/none" and sb.ping()
        sb.kill()
    finally:
        _probe.cache_clear()


def test_unknown_isolation_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown isolation 'docker'; choose auto, bwrap, "
                                         "unshare, none"):
        ProcessBackend(isolation="docker")


def test_a_runner_that_cannot_answer_in_time_is_unavailable(best):
    with pytest.raises(SandboxUnavailable, match="the runner did not start"):
        best.start(Limits(load_timeout_s=0.001))


def test_closed_stdin_ends_the_runner_cleanly(make):
    sb = make()
    assert sb.ping()
    sb.transport.proc.stdin.close()
    assert sb.transport.proc.wait(timeout=5) == 0


def test_ping_round_trip_is_fast(make):
    sb, times = make(), []
    for _ in range(300):
        t = time.perf_counter()
        sb.ping()
        times.append(time.perf_counter() - t)
    assert sorted(times)[150] < 0.001


# --------------------------------------------------------------------------- the protocol

def test_load_returns_the_meta(make, best):
    meta = dict(make(GOOD_ENV).meta)
    sandbox = meta.pop("sandbox")
    assert sandbox["seccomp"] is ("seccomp" in best.isolation_layers())
    assert isinstance(sandbox["uid"], int)
    assert meta == {"capability": "order lookup", "skills": {"lookup": 1.0},
                    "tools": [{"type": "function", "function": {
                        "name": "get_order", "description": "Look up an order by id.",
                        "parameters": {"type": "object",
                                       "properties": {"order_id": {"type": "string"}},
                                       "required": ["order_id"]}}}],
                    "max_turns": 4}


def test_new_reset_step_solve_round_trip(make):
    sb = make(GOOD_ENV)
    assert sb.new() == 0 and sb.new() == 1
    obs, info = sb.reset(0, 7)
    assert info == {"skill": "lookup"}
    assert [m["role"] for m in obs["messages"]] == ["system", "user"]
    (action,) = sb.solve(1, 7)
    assert action["tool_calls"][0]["function"]["name"] == "get_order"
    assert sb.step(0, action) == [
        {"messages": [{"role": "tool", "tool_call_id": "call_0", "content": "shipped"}]},
        1.0, True, False, {"skill": "lookup"}]
    assert sb.step(0, {"role": "assistant", "content": "hi"})[1:4] == [0.0, False, False]
    assert sb.ping()


def test_env_exception_is_an_env_call_error_and_the_sandbox_lives(make):
    sb = make(env_with(step="return {}['missing']"))
    with pytest.raises(EnvCallError) as e:
        step(sb)
    assert (e.value.kind, e.value.type, e.value.message) == ("env", "KeyError", "'missing'")
    assert 'File "env.py", line' in e.value.traceback and "runner.py" not in e.value.traceback
    assert e.value.traceback.endswith("KeyError: 'missing'\n")
    assert sb.reset(0, 2)[1] == {"skill": "lookup"} and sb.ping()


@pytest.mark.parametrize("channel", CHANNELS)
@pytest.mark.parametrize("size", [300_000, 1_500_000])
def test_requests_and_replies_longer_than_a_pipe_buffer(make, channel, size):
    """A long action and a reply as long cross whole, then a small one: on the pipes in pieces
    (a pipe holds 64 KB); over shared memory in one piece up to its region's 1 MiB, on the pipe
    beyond (1.5 MB)."""
    sb = make(env_with(step='text = action["content"]\n'
                            'return {"messages": [{"role": "user", "content": text[::-1]}]}, '
                            'float(len(text)), False, False, {}'), backend=with_channel(channel))
    big = "".join(chr(97 + i % 26) for i in range(size))
    obs, reward, *_ = step(sb, big)
    assert reward == float(size) and obs["messages"][0]["content"] == big[::-1]
    obs, reward, *_ = sb.step(0, {"role": "assistant", "content": "ab"})
    assert (reward, obs["messages"][0]["content"]) == (2.0, "ba")


@pytest.mark.parametrize("body, kind, type_, message", [
    ("raise SystemExit(3)", "env", "SystemExit", "3"),
    ("raise KeyboardInterrupt", "env", "KeyboardInterrupt", ""),
    ("def f():\n    f()\nf()", "env", "RecursionError", "maximum recursion depth exceeded"),
    (returning('{"pos": (1, 2)}'), "json", "", "step's info is not JSON: tuple at info['pos']"),
    ('return {"messages": [], "x": float("nan")}, 0.0, True, False, {}',
     "json", "", "step's observation is not JSON: nan at observation['x']"),
    (returning('{1: "a"}'), "json", "", "step's info is not JSON: a int key at info"),
    (returning('{"s": {1, 2}}'), "json", "", "step's info is not JSON: set at info['s']"),
    # JSON types only, yet not equal to itself after a round trip: the part that changes is named
    ('class S(str):\n    __eq__ = lambda a, b: False\n    __hash__ = str.__hash__\n'
     + returning('{"s": S("x")}'), "json", "", "step's info is not JSON: it changes through "
                                              "json.dumps/json.loads"),
    ('return {"messages": []}, 0.0', "contract", "", "step must return a 5-tuple (observation, "
                                                     "reward, terminated, truncated, info); "
                                                     "it returned a 2-tuple"),
    ("return None", "contract", "", "step must return a 5-tuple (observation, reward, "
                                    "terminated, truncated, info); it returned NoneType"),
])
def test_broken_steps_are_typed(make, body, kind, type_, message):
    sb = make(env_with(step=body))
    with pytest.raises(EnvCallError) as e:
        step(sb)
    assert (e.value.kind, e.value.type, e.value.message) == (kind, type_, message)
    assert sb.ping()


@pytest.mark.parametrize("source, kind, message", [
    ("CAPABILITY = 'x'\n", "contract", "env.py defines no class Env"),
    (GOOD_ENV.replace('CAPABILITY = "order lookup"', ""), "contract",
     "env.py lacks CAPABILITY (see ENV_CONTRACT.md)"),
    (GOOD_ENV.replace("    tools = [GET_ORDER]\n", ""), "contract",
     "env.py lacks Env.tools (see ENV_CONTRACT.md)"),
    (GOOD_ENV.replace("tools = [GET_ORDER]", "tools = (GET_ORDER,)"), "json",
     "load's tools is not JSON: tuple at tools"),
    ("def broken(:\n", "env", "invalid syntax (env.py, line 1)"),
])
def test_broken_loads_are_typed(make, source, kind, message):
    sb = make()
    with pytest.raises(EnvCallError) as e:
        sb.load(source)
    assert (e.value.kind, e.value.message) == (kind, message)


def test_wrong_shapes_and_protocol_errors(make):
    sb = make(env_with(reset="return [{}]"))
    with pytest.raises(EnvCallError, match=r"^no instance 0; 0 made so far \(op new makes one\)$"):
        sb.reset(0, 1)
    sb.new()
    with pytest.raises(EnvCallError, match=r"^reset must return a 2-tuple \(observation, info\); "
                                           r"it returned a 1-list$"):
        sb.reset(0, 1)
    with pytest.raises(EnvCallError) as e:
        sb.call("jump")
    assert (e.value.kind, e.value.message) == (
        "protocol", "unknown op 'jump'; known: load, new, reset, step, solve, resets, state, ping, stats")
    with pytest.raises(EnvCallError, match="an env is already loaded here"):
        sb.load(GOOD_ENV)
    solve_dict = make(GOOD_ENV.replace('return [{"role"', 'return {"role"').replace(
        '"tool_calls": [call]}]', '"tool_calls": [call]}'))
    solve_dict.new()
    with pytest.raises(EnvCallError, match="^solve must return a list of assistant messages; "
                                           "it returned dict$"):
        solve_dict.solve(0, 1)


def test_env_output_does_not_break_the_protocol(make):
    forged = '{"id": 3, "ok": true, "value": 0}'
    sb = make(env_with(step=f"import os, sys\nprint({forged!r})\nos.write(1, b{forged!r} b'\\n')\n"
                            f"sys.stderr.write('x' * 10**6)\n{END}",
                       reset='print("resetting", seed)\nreturn {"messages": []}, {}'))
    sb.new()
    assert sb.reset(0, 1) == [{"messages": []}, {}]
    assert sb.step(0, {}) == [{"messages": []}, 0.0, True, False, {}]
    assert sb.ping()


def test_hash_seed_reaches_the_runner(make):
    source = env_with(reset='return {"messages": []}, {"h": hash("abc")}')

    def observed(seed):
        sb = make(source, hash_seed=seed)
        sb.new()
        return sb.reset(0, 0)[1]["h"]
    assert observed(1) == observed(1) != observed(2)


def test_a_runner_that_exits_is_reported_with_its_status(make):
    sb = make(env_with(step="import os\nos.write(2, b'bye now')\nos._exit(7)"))
    with pytest.raises(SandboxCrashed, match=r"^step: the runner exited "
                                             r"\(exit status 7; stderr: bye now\)$"):
        step(sb)
    assert not sb.transport.alive()


def test_a_request_the_runner_does_not_read_times_out_on_the_call_limit(make):
    """The runner is busy (a reset that spins, sent raw) while a request longer than the pipe
    goes out: the call gives up after its own time limit, not the load limit, and says so. The
    step goes out only once the reset is running (its stderr says so): on a busy machine the
    runner could otherwise still be waiting, and read the step instead (a race, not a bug)."""
    sb = make(env_with(reset="import os\nos.write(2, b'spinning')\nwhile True:\n    pass"),
              call_timeout_s=0.5)
    sb.new()
    sb.transport.send(b'{"id": 99, "op": "reset", "instance": 0, "seed": 1}\n',
                      time.monotonic() + 5)
    deadline = time.monotonic() + 30
    while "spinning" not in sb.transport.describe_exit() and time.monotonic() < deadline:
        time.sleep(0.01)
    t = time.monotonic()
    with pytest.raises(SandboxTimeout, match="^step did not read its request within 0.5 s; "
                                             "the sandbox was killed$"):
        sb.step(0, {"role": "assistant", "content": "x" * (1 << 20)})
    assert time.monotonic() - t < 0.5 + 1.0 and sb.closed


def test_a_hash_seed_out_of_range_is_a_usage_error(best):
    with pytest.raises(UsageError, match=r"^hash_seed must be in \[0, 4294967295\], got -1$"):
        best.start(Limits(), hash_seed=-1)


# --------------------------------------------------------------------------- untrusted replies

class CannedTransport:
    """A transport that answers every request with one given line (a lying runner)."""

    def __init__(self, reply: bytes):
        self.reply, self.killed = reply, False

    def send(self, data, deadline):
        pass

    def recv_line(self, timeout, max_bytes):
        return self.reply

    def kill(self):
        self.killed = True

    def describe_exit(self):
        return ""


@pytest.mark.parametrize("reply, message", [
    (b"[" * 200_000, "a line that is not JSON"),                  # nested past the recursion limit
    (b"\xff\n", "a line that is not JSON"),
    (b'{"id": 1, "ok": false, "error": [1]}', "an error that is not an object"),
    (b'{"id": 1, "ok": false, "error": "boom"}', "an error that is not an object"),
    (b'{"id": 2, "ok": true, "value": "pong"}', r"reply out of step with the request \(id 1\)"),
])
def test_a_malformed_reply_is_a_protocol_error_and_kills_the_sandbox(reply, message):
    from sandbox.base import Sandbox
    transport = CannedTransport(reply)
    sb = Sandbox(transport, Limits())
    with pytest.raises(SandboxProtocolError, match=f"^ping: .*{message}"):
        sb.ping()
    assert transport.killed and sb.closed


def test_an_error_reply_with_odd_fields_is_an_env_call_error():
    from sandbox.base import Sandbox
    sb = Sandbox(CannedTransport(b'{"id": 1, "ok": false, "error": {"kind": 3, "type": null}}'),
                 Limits())
    with pytest.raises(EnvCallError) as e:
        sb.ping()
    assert (e.value.kind, e.value.type, e.value.message) == ("3", "None", "") and not sb.closed


@pytest.mark.parametrize("backend", ["best", "unsafe-inprocess"])
def test_stats_gives_the_runners_time_for_each_answer_since_the_last(make, backend):
    """The env's own time per request, by the runner's clock: a step that sleeps 20 ms shows."""
    from sandbox import base
    SLEEPY = env_with(step="import time\ntime.sleep(0.02)\nreturn [{}], 0.0, False, False, {}")
    if backend == "best":
        sb = make(SLEEPY)
    else:
        with pytest.warns(RuntimeWarning, match="INSIDE THIS PROCESS"):
            sb = base.get_backend(backend).start(Limits())
        sb.load(SLEEPY)
    sb.stats()  # forget the start, load and new
    i = sb.new()
    sb.reset(i, 1)
    t = time.perf_counter()
    sb.step(i, {"role": "assistant", "content": "hi"})
    step_s = time.perf_counter() - t
    new, reset, step_ = sb.stats()
    assert 0 < new < 0.015 and 0 < reset < 0.015 and 0.02 <= step_ <= step_s
    assert sb.stats() == []  # counted afresh; the stats request itself is not counted
    assert base._busy == set()  # no call in flight is left counted


def test_stats_that_are_not_a_list_of_numbers_are_a_protocol_error():
    from sandbox.base import Sandbox
    for value in (b'[0.1, "x"]', b'[NaN]', b'[-1]', b'{"a": 1}'):
        sb = Sandbox(CannedTransport(b'{"id": 1, "ok": true, "value": %s}' % value), Limits())
        with pytest.raises(SandboxProtocolError, match="something other than a list of seconds"):
            sb.stats()
        assert sb.closed


@pytest.mark.parametrize("line", [
    b"not json\n", b"\xff\n", b"[1]\n", b'{"id": {"a": [1]}, "op": "ping"}\n',
    b'{"id": [1], "op": "nope"}\n', b'{"id": 3, "op": "step", "instance": 0}\n',
    b'{"id": 4, "op": "load", "source": 5}\n', b'{"id": 1.5, "op": "ping"}\n',
])
def test_the_in_process_runner_answers_as_the_sandboxed_one(make, line):
    """unsafe-inprocess and the process sandbox share one request -> reply function."""
    from sandbox.base import InProcessTransport
    sb, here = make(), InProcessTransport()
    sb.transport.send(line, time.monotonic() + 5)
    here.send(line, time.monotonic() + 5)
    assert here.recv_line(5, 1 << 20) == sb.transport.recv_line(5, 1 << 20)


# --------------------------------------------------------------------------- the channels

@pytest.mark.parametrize("channel", CHANNELS)
def test_both_channels_answer_alike_and_say_which_they_are(make, channel):
    sb = make(GOOD_ENV, backend=with_channel(channel))
    assert sb.meta["sandbox"]["channel"] == {"shm": "shared memory", "pipe": "stream"}[channel]
    assert step(sb, "where is A-7?")[1:4] == [0.0, False, False]
    for _ in range(500):  # spinning and blocking alike (the runner blocks after a pause)
        assert sb.ping()
    time.sleep(0.01)
    assert sb.ping()


def test_the_default_channel_is_shared_memory_where_it_works(make):
    expected = "shared memory" if SHM_WORKS else "stream"
    assert make(GOOD_ENV).meta["sandbox"]["channel"] == expected


def test_unknown_or_unavailable_channels_are_usage_errors(monkeypatch):
    with pytest.raises(UsageError, match="^unknown channel 'tcp'; choose auto, shm, pipe$"):
        ProcessBackend(channel="tcp")
    monkeypatch.setattr("sandbox.process.SHM_WORKS", False)
    with pytest.raises(UsageError, match="needs Linux on x86-64 .*use channel='pipe'"):
        ProcessBackend(channel="shm")
    assert not ProcessBackend().shared


def test_a_host_that_refuses_shared_memory_falls_back_to_pipes(make, monkeypatch):
    if not SHM_WORKS:
        pytest.skip("the shared-memory channel needs Linux on x86-64")

    def refuse(*_):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "memfd_create", refuse)
    assert make(GOOD_ENV).meta["sandbox"]["channel"] == "stream"
    with pytest.raises(SandboxUnavailable, match="cannot set up the shared-memory channel: .*"
                                                 "Operation not permitted; use channel='pipe'"):
        ProcessBackend(channel="shm").start(Limits())


def test_doctor_names_the_channel_and_does_not_count_it_as_a_backend(monkeypatch):
    import json
    from click.testing import CliRunner
    from envforge.cli import main
    result = CliRunner().invoke(main, ["sandbox", "doctor", "--json"])
    rows = {r["backend"]: r for r in json.loads(result.output)["backends"]}
    assert rows["process/channel"]["ok"]
    assert rows["process/channel"]["detail"].startswith("shared memory" if SHM_WORKS else "pipes")
    assert result.exit_code == (0 if any(r["ok"] for name, r in rows.items() if name not in (
        "process/seccomp", "process/channel")) else 1)
    only_aids = [{"backend": b, "ok": True, "detail": "x"} for b in ("process/seccomp",
                                                                    "process/channel")]
    monkeypatch.setattr("envforge.cli.diagnose", lambda: only_aids)
    assert CliRunner().invoke(main, ["sandbox", "doctor", "--json"]).exit_code == 1


def test_the_runner_probe_ignores_what_only_this_process_sees(tmp_path, monkeypatch):
    """A module on this process's PYTHONPATH (pip install --target, say) is not on the runner's,
    which starts bare: the seccomp probe must ask the runner's interpreter, not this one (on a
    GPU machine, pyseccomp on PYTHONPATH passed the probe and every sandbox then failed to start)."""
    import importlib
    from sandbox.process import runner_imports
    (tmp_path / "only_on_my_path.py").write_text("X = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importlib.import_module("only_on_my_path").X == 1
    assert "No module named 'only_on_my_path'" in runner_imports("only_on_my_path")
    assert runner_imports("json") is None


def test_a_seccomp_probe_that_cannot_run_is_no_answer_and_starts_nothing(monkeypatch):
    """A probe that times out (a busy machine) must not read as "no seccomp", kept for the
    process's life: nothing starts, the sandbox says it could not be probed, and the next call
    probes again."""
    import subprocess
    from sandbox import process
    calls = []

    def slow(*args, **kwargs):
        calls.append(args)
        raise subprocess.TimeoutExpired(args[0], process.IMPORT_PROBE_S)
    process.seccomp_probe.cache_clear()
    monkeypatch.setattr(process.subprocess, "run", slow)
    try:
        ok, why = ProcessBackend(isolation="none").available()
        assert not ok and "could not be probed" in why
        with pytest.raises(SandboxUnavailable, match="could not be probed"):
            ProcessBackend(isolation="none").start(Limits())
        assert len(calls) >= 2  # not kept: each call asked again
    finally:
        process.seccomp_probe.cache_clear()


def test_unshare_without_seccomp_warns_once_per_process(monkeypatch, capfd):
    """unshare leaves the host's files visible: without seccomp, env code can write the
    world-writable ones. A start in that state says so, loudly and once."""
    from sandbox import base, process
    monkeypatch.setattr(base, "_WARNED", set())
    backend = ProcessBackend(isolation="unshare")
    if _probe("unshare")[0] is not None:
        monkeypatch.setattr(process, "seccomp_probe", lambda: (False, "no seccomp (a test)"))
    else:  # as root with an interpreter uid 65534 cannot read (this machine's venv): the plan
        # of an unshare sandbox without seccomp, its runner started with no prefix (stand-in)
        monkeypatch.setattr(ProcessBackend, "_plan", lambda self: (
            "unshare", [], "unshare (a stand-in)", False, "no seccomp (a test)"))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a caller's filter does not swallow it
        backend.start(Limits()).close()
    err = capfd.readouterr().err
    assert "envforge: warning: sandboxes run behind unshare WITHOUT seccomp" in err
    assert "no seccomp (a test)" in err
    backend.start(Limits()).close()
    assert "WITHOUT seccomp" not in capfd.readouterr().err  # the second start is silent
    assert "WITHOUT seccomp" in backend.warning()  # what a Ray actor hands back to its caller
    monkeypatch.setattr(ProcessBackend, "_plan", lambda self: ("bwrap", [], "bwrap", True, "seccomp"))
    assert backend.warning() is None


def test_doctor_says_no_for_a_backend_whose_sandbox_did_not_start(monkeypatch):
    import json
    from click.testing import CliRunner
    from envforge.cli import main

    def broken(backend):
        raise RuntimeError("the runner exited (exit status 3)")
    monkeypatch.setattr("sandbox.base.containment", broken)
    result = CliRunner().invoke(main, ["sandbox", "doctor", "--json"])
    rows = json.loads(result.output)["backends"]
    probed = [r for r in rows if "containment" in r]
    if not probed:
        pytest.skip("no backend works here, so none was probed")
    for r in probed:
        assert r["ok"] is False and "the probe failed: the runner exited" in r["containment"]["words"]
    assert result.exit_code == 1


def test_the_shared_memory_cannot_change_size():
    """The runner could otherwise shrink it under this process's mapping (a SIGBUS here)."""
    import fcntl
    from sandbox.process import _shared_memory
    if not SHM_WORKS:
        pytest.skip("the shared-memory channel needs Linux on x86-64")
    mem, fds, bells = _shared_memory()
    try:
        seals = fcntl.fcntl(fds[0], fcntl.F_GET_SEALS)
        for seal in (fcntl.F_SEAL_SHRINK, fcntl.F_SEAL_GROW, fcntl.F_SEAL_SEAL):
            assert seals & seal
        with pytest.raises(PermissionError):
            os.ftruncate(fds[0], 4096)
    finally:
        mem.close()
        for fd in fds + bells:
            os.close(fd)


#: Env code that reaches into the runner's shared-memory channel and announces a reply of
#: ``SIZE`` bytes with the current request's number, then hangs: the host must judge it alone.
LIAR = """import gc, os, time
ch = next(o for o in gc.get_objects() if type(o).__name__ == "Shared")
at = len(ch.mem) // 16
ch.words[at + 1] = SIZE
ch.words[at] = ch.seq
os.write(ch.bell_out, (1).to_bytes(8, "little"))
time.sleep(30)"""


@pytest.mark.parametrize("size, error, message", [
    (1 << 40, SandboxProtocolError, "a reply line longer than 1048512 bytes in shared memory"),
    (3, SandboxProtocolError, "answered a line that is not JSON"),
    ((1 << 64) - 1, SandboxTimeout, "step did not answer within 1 s"),  # "on the pipe": it is not
])
def test_a_lying_shared_memory_reply_is_a_typed_error_in_time(make, size, error, message):
    sb = make(env_with(step=LIAR.replace("SIZE", str(size))), backend=with_channel("shm"),
              call_timeout_s=1.0)
    t = time.monotonic()
    with pytest.raises(error, match=message):
        step(sb)
    assert time.monotonic() - t < 3 and sb.closed and not sb.transport.alive()


def test_a_full_bell_rings_anyway(make):
    """A bell the runner never empties (it found the memory by spinning) fills up: the host's
    write is refused, never blocks, and the calls go on. The bell is filled while the runner is
    busy in a call: filled while it waits, it drains the bell as fast as the host writes, and
    on a busy machine that race cost it more than its CPU allowance between calls."""
    import threading
    sb = make(env_with(step="import time\ntime.sleep(0.5)\n" + returning("{}")),
              backend=with_channel("shm"))
    sb.new()
    sb.reset(0, 1)
    busy = threading.Thread(target=sb.step, args=(0, {"role": "assistant", "content": "go"}))
    busy.start()
    time.sleep(0.1)
    with pytest.raises(BlockingIOError):
        while True:
            os.write(sb.transport._bell_in, b"x" * 4096)
    busy.join()
    assert all(sb.ping() for _ in range(100))
    time.sleep(0.01)  # the runner blocks on that bell now
    assert sb.ping()


def test_the_runner_cannot_make_the_hosts_bells_block(make):
    """Env code clears O_NONBLOCK on every fd it has and fills its bell: the host's ends are
    open files of their own (pipes, not a shared eventfd) and stay non-blocking."""
    attack = ("import fcntl, gc, os\n"
              "ch = next(o for o in gc.get_objects() if type(o).__name__ == 'Shared')\n"
              "for fd in range(64):\n    try:\n        fcntl.fcntl(fd, fcntl.F_SETFL, 0)\n"
              "    except OSError:\n        pass\n"
              "try:\n    os.write(ch.bell_out, b'x' * (1 << 20))\nexcept OSError:\n    pass\n"
              + returning("{}"))
    sb = make(env_with(step=attack), backend=with_channel("shm"))
    step(sb)
    for fd in (sb.transport._bell_in, sb.transport._bell_out):
        assert not os.get_blocking(fd)
    assert all(sb.ping() for _ in range(100))


@pytest.mark.parametrize("body", [returning('{"b": "x" * 50_000_000}'),
                                  "import os\nfor fd in range(3, 12):\n    try:\n"
                                  "        os.write(fd, b'x' * (8 << 20))\n"
                                  "    except OSError:\n        pass\n" + returning("{}")])
def test_huge_output_over_the_pipe_channel_is_a_protocol_error(make, body):
    sb = make(env_with(step=body), backend=with_channel("pipe"), call_timeout_s=10.0)
    with pytest.raises(SandboxProtocolError, match="a reply line longer than 4194304 bytes"):
        step(sb)


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_kill_from_another_thread_ends_a_waiting_call(make, channel):
    """pool.close() kills leased sandboxes from its own thread: the call waiting on one ends with
    a typed error at once, and the kill itself does not fail."""
    import threading
    sb = make(env_with(step="import time\ntime.sleep(30)"), backend=with_channel(channel),
              call_timeout_s=60.0)
    sb.new()
    sb.reset(0, 1)
    errors = []

    def call():
        try:
            sb.step(0, {"role": "assistant", "content": "hi"})
        except Exception as e:
            errors.append(e)
    waiting = threading.Thread(target=call)
    waiting.start()
    time.sleep(0.3)
    t = time.monotonic()
    sb.kill()
    waiting.join(timeout=10)
    assert not waiting.is_alive() and time.monotonic() - t < 5
    assert len(errors) == 1 and isinstance(errors[0], SandboxCrashed), errors


# --------------------------------------------------------------------------- hostile envs

def test_infinite_loop_times_out_and_is_killed(hostile):
    sb = hostile(env_with(step="while True:\n    pass"))
    t = time.monotonic()
    with pytest.raises(SandboxTimeout, match="^step did not answer within 0.5 s; "
                                             "the sandbox was killed$"):
        step(sb)
    assert time.monotonic() - t < 0.5 + 1.0
    assert not sb.transport.alive() and processes_marked() == []
    with pytest.raises(SandboxCrashed, match="closed or killed earlier"):
        sb.ping()


def test_infinite_loop_at_load_times_out(hostile):
    with pytest.raises(SandboxTimeout, match="^load did not answer within 1 s"):
        hostile("while True:\n    pass\n", load_timeout_s=1.0)


def test_memory_bomb_is_a_typed_error(hostile):
    sb = hostile(env_with(step="blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))"),
                 call_timeout_s=10.0)
    try:
        step(sb)
    except EnvCallError as e:
        assert e.type == "MemoryError"
        assert sb.ping()  # the memory came back
    except SandboxCrashed:
        pass
    else:
        pytest.fail("a memory bomb returned normally")


@pytest.mark.parametrize("attack", [
    "import os\npid = os.fork()\nif pid == 0:\n    import time\n    time.sleep(30)\n"
    "    os._exit(0)",
    "import subprocess\nsubprocess.run(['/bin/sleep', '30'])",
    "import os\nwhile True:\n    os.fork()",
    "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()",
], ids=["fork", "subprocess", "fork-bomb", "thread"])
def test_new_processes_fail_or_are_contained(hostile, attack):
    sb = hostile(env_with(step=attack + "\n" + END))
    try:
        step(sb)
    except EnvCallError as e:
        assert e.type in ("PermissionError", "BlockingIOError", "RuntimeError")
    assert sb.ping()


def test_writing_host_files_leaves_nothing(hostile, tmp_path):
    pid = os.getpid()
    targets = [tmp_path / "pwned", REPO / f".pwned-{pid}", Path(f"/tmp/pwned-{pid}")]
    attack = "".join(f"try:\n    open({str(p)!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
                     for p in targets)
    attack += f"import os\ntry:\n    os.mkdir({str(tmp_path / 'dir')!r})\nexcept OSError:\n    pass"
    step(hostile(env_with(step=attack + "\n" + END)))
    appeared = [p for p in targets + [tmp_path / "dir"] if p.exists()]
    for p in appeared:
        p.unlink() if p.is_file() else p.rmdir()
    assert appeared == []


def test_network_connections_do_not_arrive(hostile):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        sb = hostile(env_with(step=f"import socket\nsocket.create_connection(('127.0.0.1', "
                                   f"{port}), timeout=1).sendall(b'hi')\n{END}"))
        with pytest.raises(EnvCallError) as e:
            step(sb)
        assert e.value.type in ("PermissionError", "ConnectionRefusedError", "OSError")
        with pytest.raises(socket.timeout):
            listener.accept()


def test_signals_do_not_reach_the_host(hostile):
    attack = (f"import os, signal\nfor pid in ({os.getpid()}, os.getppid()):\n"
              f"    for sig in (signal.SIGKILL, signal.SIGTERM):\n        try:\n"
              f"            os.kill(pid, sig)\n        except OSError:\n            pass")
    sb = hostile(env_with(step=attack + "\n" + END))
    step(sb)
    assert sb.ping()  # this test process, and the sandbox's own parent, are alive


def test_huge_output_is_a_protocol_error(hostile):
    sb = hostile(env_with(step=returning('{"b": "x" * 50_000_000}')), memory_mb=1024,
                 call_timeout_s=10.0)
    with pytest.raises(SandboxProtocolError, match="a reply line longer than 4194304 bytes"):
        step(sb)
    assert not sb.transport.alive()


def test_host_secrets(hostile):
    """bwrap hides host files; the other layers hide nothing from the runner's own uid (as
    documented in sandbox/process.py), so there the test records what is true."""
    secrets = [REPO / f".secret-{os.getpid()}", Path("/etc/shadow")]
    if os.access("/root", os.W_OK):
        secrets.append(Path(f"/root/.secret-{os.getpid()}"))
    written = [p for p in secrets if p.parent != Path("/etc")]
    for p in written:
        p.write_text("hunter2")
    try:
        reads = "".join(f"try:\n    seen.append(len(open({str(p)!r}).read()) > 0)\n"
                        f"except OSError:\n    seen.append(False)\n" for p in secrets)
        sb = hostile(env_with(step="seen = []\n" + reads + returning('{"seen": seen}')))
        seen = step(sb)[4]["seen"]
        readable = [os.access(p, os.R_OK) for p in secrets]
    finally:
        for p in written:
            p.unlink()
    if hostile.layer == "bwrap":
        assert seen == [False] * len(secrets)
    elif sb.meta["sandbox"]["uid"] == os.geteuid():
        assert seen == readable


def test_unshare_has_no_network_and_its_own_pids(make):
    sb = make(env_with(step='import os\nifs = [l.split(":")[0].strip() for l in '
                            'open("/proc/net/dev")][2:]\n' + returning('{"pid": os.getpid(), '
                                                                        '"ifs": ifs}')),
              backend=backend_for("unshare"))
    assert step(sb)[4] == {"pid": 1, "ifs": ["lo"]}


@pytest.mark.parametrize("layer", LAYERS)
def test_every_allowed_import_works_on_every_layer(make, layer):
    imports = "".join(f"import {name}\n" for name in sorted(ALLOWED_IMPORTS))
    body = "return {'messages': []}, {'digest': hashlib.sha256(b'x').hexdigest()[:8], " \
           "'mean': statistics.mean([1, 2]), 'd': str(decimal.Decimal('1.5'))}"
    sb = make(imports + env_with(reset=body), backend=backend_for(layer))
    sb.new()
    assert sb.reset(0, 0)[1] == {"digest": "2d711642", "mean": 1.5, "d": "1.5"}


@pytest.mark.parametrize("layer", LAYERS)
def test_a_killed_host_leaves_no_sandbox_behind(layer, tmp_path):
    """The host dies (os._exit) while its env spins in a call: the sandbox must die with it."""
    backend_for(layer)
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from envforge.contract import Limits
        from sandbox.process import ProcessBackend
        sb = ProcessBackend(isolation={layer!r}).start(Limits(), hash_seed={MARK})
        sb.load("CAPABILITY = 'x'\\nclass Env:\\n    tools = []\\n    def reset(self, seed):\\n"
                "        while True:\\n            pass\\n    def step(self, a):\\n        pass\\n"
                "    def solve(self, s):\\n        return []\\n")
        sb.new()
        sb.transport.send(b'{{"id": 99, "op": "reset", "instance": 0, "seed": 1}}\\n',
                          time.monotonic() + 5)
        print(sb.transport.proc.pid, flush=True)
        os._exit(0)
    """))
    import subprocess
    import sys
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 5
    while processes_marked() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_marked() == [], f"a sandbox on {layer} outlived its killed host"


def test_line_buffer_cuts_lines_however_they_arrive():
    from sandbox.base import LineBuffer
    buf = LineBuffer()
    assert buf.add(b'{"a":1}\n', 100) == b'{"a":1}'  # one whole line: handed back at once
    assert buf.pop_line(100) is None
    assert buf.add(b'{"a":1}\n{"b"', 100) == b'{"a":1}'  # a line and the start of the next
    assert buf.add(b':2}\n', 100) == b'{"b":2}' and buf.pop_line(100) is None
    with pytest.raises(SandboxProtocolError, match="longer than 5 bytes"):
        buf.add(b"0123456789\n", 5)
    buf += b'{"a":1}\n'
    assert buf.pop_line(100) == b'{"a":1}' and buf.pop_line(100) is None
    buf += b'{"b":'                          # a line in pieces
    assert buf.pop_line(100) is None
    buf += b'2}\n{"c":3}\n'                  # its end and a second line in one chunk
    assert [buf.pop_line(100), buf.pop_line(100), buf.pop_line(100)] == [b'{"b":2}', b'{"c":3}', None]
    buf += b"x\n"                            # a whole line, then more before it is taken
    buf += b"y\nz"
    assert [buf.pop_line(100), buf.pop_line(100), buf.pop_line(100)] == [b"x", b"y", None]
    buf += b"\n"
    assert buf.pop_line(100) == b"z"
    buf += b"0123456789\n"
    with pytest.raises(SandboxProtocolError, match="longer than 5 bytes"):
        buf.pop_line(5)
    buf += b"0123456789"                     # growing past the limit without a newline
    with pytest.raises(SandboxProtocolError, match="longer than 5 bytes"):
        buf.pop_line(5)


ARM = """
import json, resource, sys
sys.path.insert(0, {repo!r})
from sandbox.runner import Runner
resource.setrlimit(resource.RLIMIT_CPU, (300, 300))
r, soft = Runner({{}}, (1.5, 10.0)), {{}}
for op, req in (("step", {{}}), ("load", {{}}), ("resets", {{"max_s": 20}}),
                ("resets", {{"max_s": "a lot"}}), ("resets", {{"max_s": 1e9}})):
    r.arm(op, req)
    soft[op + str(req.get("max_s", ""))] = resource.getrlimit(resource.RLIMIT_CPU)
print(json.dumps(soft))
"""


def test_the_runner_arms_a_cpu_limit_per_call_from_the_work_asked():
    """Runner.arm (in a child process: it lowers that process's RLIMIT_CPU): the soft limit is
    the CPU used so far (well under a second here) plus the op's time limit plus one to two
    seconds; "resets" adds its max_s when it is a number; the hard limit (300) caps it and is
    never changed."""
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", ARM.format(repo=str(Path(__file__).parents[1]))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    soft = json.loads(out.stdout)
    assert soft["step"] in ([3, 300], [4, 300])           # 1.5 s + 1-2 s, from under 1 s used
    assert soft["load"] in ([12, 300], [13, 300])         # 10 s + 1-2 s
    assert soft["resets20"] in ([23, 300], [24, 300])     # 1.5 + 20 s + 1-2 s
    assert soft["resetsa lot"] == soft["step"]            # not a number: the call's limit alone
    assert soft["resets1000000000.0"] == [300, 300]       # capped by the hard limit


def test_the_state_op_digests_an_instance_as_its_reset_left_it(make):
    """The gate's "state" op with an instance: "self.<name>" is each of its attributes' digest,
    the same after a reset to the same seed unless the instance keeps something across its
    resets (a count); one too large to digest leaves the others judged."""
    kept = make(env_with(reset="self.played = getattr(self, 'played', 0) + 1\nreturn {'messages': []}, {}"))
    clean = make(env_with(reset="self.played = seed\nreturn {'messages': []}, {}"))
    for sb, same in ((kept, False), (clean, True)):
        sb.new()
        looks = []
        for _ in range(2):
            sb.reset(0, 0)
            looks.append(sb.call("state", instance=0))
        assert "self.played" in looks[0] and (looks[0]["self.played"] == looks[1]["self.played"]) is same
        assert not [k for k in sb.call("state") if k.startswith("self")]  # without one: the module's names
    padded = make(env_with(reset="self.pad = None\nfor i in range(500):\n    self.pad = (i, self.pad)\n"
                                 "self.played = getattr(self, 'played', 0) + 1\nreturn {'messages': []}, {}"))
    padded.new()
    looks = []
    for _ in range(2):
        padded.reset(0, 0)
        looks.append(padded.call("state", instance=0))
    assert looks[0]["self.pad"] == "too large" and looks[0]["self.played"] != looks[1]["self.played"]


def test_the_state_digest_sees_what_outlives_an_episode():
    """sandbox.runner.digest, the gate's "state" op: state changed anywhere an env can keep it
    (a container, a closure, a function's default or attribute, a generator, an object's
    attributes or slots, a standard-library counter) gives another digest; the same state
    (a set rebuilt in another order) the same one."""
    import itertools
    from sandbox.runner import digest

    def changed(value, change) -> bool:
        before = digest(value)
        change()
        return digest(value) != before

    box = {"n": [0]}
    assert changed(box, lambda: box["n"].append(1))

    def counter():
        n = [0]
        def f(x=[0]):
            n[0] += 1
            x[0] += 1
        return f
    f = counter()
    assert changed(f, f)  # the closure's cell and the default both change
    f.seen = 0
    assert changed(f, lambda: setattr(f, "seen", 1))

    def gen():
        i = 0
        while True:
            i += 1
            yield i
    g = gen()
    next(g)
    assert changed(g, lambda: next(g))

    def delegating():  # the count sits on the frame's stack, in no local (a red team's clock)
        yield from range(10**9)
    d = delegating()
    next(d)
    assert changed(d, lambda: next(d))

    def keeper():
        kept = []
        while True:
            kept.append((yield))
    def outer():  # a leak two generators down
        yield from keeper()
    o = outer()
    next(o)
    assert changed(o, lambda: o.send("x"))
    h = hashlib.sha256()  # no pickled state, a constant repr
    assert changed(h, lambda: h.update(b"x"))

    def looping():  # a for loop's iterator, on the stack too; its local is always True
        for _ in map(bool, itertools.count(1)):
            yield
    lp = looping()
    next(lp)
    assert changed(lp, lambda: next(lp))

    class Empty:  # a delegate that is false (len 0) is followed all the same
        def __init__(self):
            self.n = 0
        def __len__(self):
            return 0
        def __iter__(self):
            return self
        def __next__(self):
            self.n += 1
            return self.n
    def through():
        yield from Empty()
    t = through()
    next(t)
    assert changed(t, lambda: next(t))

    class Slots:
        __slots__ = ("n",)
    s = Slots()
    s.n = 1
    assert changed(s, lambda: setattr(s, "n", 2))
    c = itertools.count()
    assert changed(c, lambda: next(c))
    a, b = set(), set()
    for w in ("x", "y", "z"):
        a.add(w)
    for w in ("z", "x", "q", "y"):
        b.add(w)
    b.discard("q")
    assert digest(a) == digest(b) and digest([1, "1"]) != digest(["1", 1])
    loop = []
    loop.append(loop)
    assert digest(loop) == digest(loop)  # a cycle ends
