"""The backend interface, and the host side of the runner protocol.

Protocol (one JSON object per line, UTF-8, in both directions; see ``runner.py``):

    host -> runner   {"id": 1, "op": "load", "source": "...", "filename": "env.py"}
    runner -> host   {"id": 1, "ok": true, "value": {"capability": ..., "skills": ..., "tools": [...],
                                                     "max_turns": 10}}
    host -> runner   {"id": 2, "op": "new"}                         -> value: instance number
    host -> runner   {"id": 3, "op": "reset", "instance": 0, "seed": 7}  -> value: [obs, info]
    host -> runner   {"id": 4, "op": "step", "instance": 0, "action": {...}}
                                                  -> value: [obs, reward, terminated, truncated, info]
    host -> runner   {"id": 5, "op": "solve", "instance": 0, "seed": 7}  -> value: [message, ...]
    host -> runner   {"id": 6, "op": "ping"}                         -> value: "pong"
    host -> runner   {"id": 7, "op": "stats"}   -> value: seconds the runner took to answer each
                                                   request since the last stats (diagnostics)
    on failure       {"id": n, "ok": false, "error": {"kind": "env"|"json"|"contract"|"protocol",
                                                      "type": "KeyError", "message": ..., "traceback": ...}}

A backend owns the isolation boundary and a byte ``Transport`` to one runner; ``Sandbox`` speaks
the protocol over any transport, enforces the per-call time limit and the message size limit, and
turns every failure into a typed error (``envforge.errors``): ``EnvCallError`` when the env's code
raised (the sandbox lives on), ``SandboxTimeout`` / ``SandboxCrashed`` / ``SandboxProtocolError``
when the sandbox itself is gone (it is killed; start a new one). A call interrupted by anything
else (Ctrl-C) kills the sandbox too, since its reply would come out of step.
"""
from __future__ import annotations

import json
import math
import os
import select
import signal
import sys
import threading
import time
from abc import ABC, abstractmethod
from typing import Any, NoReturn, Sequence

from envforge.contract import Limits
from envforge.errors import (EnvCallError, EnvforgeError, SandboxCrashed, SandboxError, printable,
                             SandboxProtocolError, SandboxTimeout, UsageError)


MAX_DEPTH = 64               # JSON nesting a reply may have (the runner's check; the host's after it)
SPIN_S = 200e-6
IDLE_CHECK_S = 0.5            # a call after this long without one checks the sandbox's idle CPU
IDLE_CPU_S = 0.1              # CPU seconds a sandbox may use while idle, beyond
IDLE_CPU_PER_CALL_S = 0.001   # this much per call answered (the runner spins SPIN_S per wait)
REMARK_S = 0.01               # after a call this long, the idle check marks the clock afresh
DRAIN_S = 0.05                # past a read's deadline: what is ready is read, this long at most
LATE_READ_S = 0.25            # call_all: the replies it reads late get this long, together
_encode = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
_busy: set = set()         # the sandboxes of this process with a call waiting for a reply
_SPIN_MAX = max(1, (os.cpu_count() or 1) // 2)  # calls in flight that may spin: half the cores


def spin_allowed() -> bool:
    """Whether waiting by spinning pays: only while the calls in flight fit in half the cores
    (each spins on the host and its runner works); beyond, spinning steals the CPU that the
    sandboxes need, and blocking is faster."""
    return len(_busy) <= _SPIN_MAX


def cpu_per_call(limits: Limits) -> str:
    """The runner's ``--cpu CALL,LOAD``: the CPU seconds a call and a load may use (their time
    limits; see ``Runner.arm`` in runner.py)."""
    return f"{limits.call_timeout_s:g},{limits.load_timeout_s:g}"


def signal_name(number: int) -> str:
    """A signal's name, and what it means when the sandbox's own limits sent it."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    if number == signal.SIGXCPU:
        name += (": the call used more CPU than its time limit allows (the runner's per-call "
                 "RLIMIT_CPU)")
    return name


def calls_in_flight() -> int:
    """How many calls of this process's sandboxes are waiting for a reply."""
    return len(_busy)


def poll_spinning(poller, timeout_s: float, spin_s: float | None = None) -> list:
    """``poller.poll`` that first polls without blocking for ``spin_s`` (SPIN_S when spinning
    pays, see ``spin_allowed``): a reply usually comes within microseconds, and waking a blocked
    process costs tens of them on a virtual machine (the runner spins the same way). With no
    time left it still looks, without waiting (a reply read late, by ``call_all``, may be in): a
    caller reading in a loop goes on past its deadline only while data is ready, DRAIN_S at
    most, so that a trickle cannot outlast it."""
    if spin_s is None:
        spin_s = SPIN_S if spin_allowed() else 0.0
    end = time.perf_counter() + min(spin_s, max(timeout_s, 0.0))
    while time.perf_counter() < end:
        ready = poller.poll(0)
        if ready:
            return ready
    return poller.poll(max(timeout_s, 0.0) * 1000)  # out of time: one look, without waiting


def write_all(write, fd: int, data: bytes, deadline: float) -> None:
    """Write all of ``data`` with ``write`` (``os.write`` or ``socket.send`` bound to the
    non-blocking ``fd``), waiting for ``fd`` to take more until ``deadline`` (time.monotonic()).

    Raises SandboxTimeout when the runner stops reading, SandboxCrashed when it is gone."""
    view, poller = memoryview(data), None
    while view:
        try:
            view = view[write(view):]
        except BlockingIOError:  # a request longer than the stream's free space
            if poller is None:
                poller = select.poll()
                poller.register(fd, select.POLLOUT)
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise SandboxTimeout("the runner stopped reading its requests") from None
        except OSError as e:  # BrokenPipeError, ConnectionResetError: the runner is gone
            raise SandboxCrashed(f"the runner is gone ({e.__class__.__name__})") from None


def check_hash_seed(hash_seed: int) -> None:
    """A PYTHONHASHSEED must be in [0, 4294967295]; else UsageError."""
    if not 0 <= hash_seed <= 4294967295:
        raise UsageError(f"hash_seed must be in [0, 4294967295], got {hash_seed}")


class LineBuffer:
    """Bytes received from a runner, cut into protocol lines; scans each byte for a newline once."""

    def __init__(self) -> None:
        self.data, self._scanned = bytearray(), 0

    def __iadd__(self, chunk: bytes) -> "LineBuffer":
        self.data += chunk
        return self

    def add(self, chunk: bytes, max_bytes: int) -> bytes | None:
        """Add ``chunk``; the first complete line now held (see ``pop_line``), or None."""
        if not self.data and chunk.find(b"\n") == len(chunk) - 1 >= 0:
            if len(chunk) > max_bytes + 1:  # the usual case: one whole line, handed back at once
                raise SandboxProtocolError(f"a reply line longer than {max_bytes} bytes")
            return chunk[:-1]
        self.data += chunk
        return self.pop_line(max_bytes)

    def pop_line(self, max_bytes: int) -> bytes | None:
        """The next complete line (without its newline), or None while there is none.

        Raises SandboxProtocolError when a line is, or is growing, longer than ``max_bytes``."""
        nl = self.data.find(b"\n", self._scanned)
        if nl < 0:
            self._scanned = len(self.data)
            if len(self.data) > max_bytes:
                raise SandboxProtocolError(f"a reply line longer than {max_bytes} bytes")
            return None
        line = bytes(self.data[:nl])
        del self.data[:nl + 1]
        self._scanned = 0
        if len(line) > max_bytes:
            raise SandboxProtocolError(f"a reply line longer than {max_bytes} bytes")
        return line


class Transport(ABC):
    """A bidirectional line stream to one runner, plus the means to kill it."""

    @abstractmethod
    def send(self, data: bytes, deadline: float) -> None:
        """Write bytes (a complete line), by ``deadline`` (time.monotonic()) when the runner
        does not take them at once. Raises SandboxTimeout when it stops reading, SandboxCrashed
        when it is gone."""

    @abstractmethod
    def recv_line(self, timeout: float, max_bytes: int) -> bytes:
        """Read one line (without the newline) within ``timeout`` seconds.

        Raises SandboxTimeout, SandboxCrashed (EOF), or SandboxProtocolError (line too long).
        """

    @abstractmethod
    def kill(self) -> None:
        """Stop the runner and everything it started; idempotent; never raises."""

    def stop(self) -> None:
        """Stop the runner at once, without waiting for it to be gone (``kill`` still follows);
        never raises. Transports that cannot (the default) leave it all to ``kill``."""

    @abstractmethod
    def alive(self) -> bool: ...

    def describe_exit(self) -> str:
        """Why the runner is gone (exit status, signal, stderr tail), for error messages."""
        return ""

    def cpu_seconds(self) -> float | None:
        """CPU seconds the sandbox's processes have used so far, read from outside them; None
        when this transport cannot tell."""
        return None


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests lists and dicts more than ``limit`` deep (``[]`` is
    1, ``[[]]`` 2; iterative: a deep value must not exhaust the stack that checks it; the
    trainer's deepcopy and the chat template's rendering recurse on what passes)."""
    level = [value] if isinstance(value, (dict, list)) else []  # containers at depth 1, 2, ...
    for _ in range(limit + 1):
        if not level:
            return False
        level = [v for x in level for v in (x.values() if isinstance(x, dict) else x)
                 if isinstance(v, (dict, list))]
    return True


class Sandbox:
    """One live sandbox holding (at most) one loaded env module and its instances."""

    def __init__(self, transport: Transport, limits: Limits, backend: str = ""):
        self.transport, self.limits, self.backend = transport, limits, backend
        self._next_id = 0
        self.meta: dict | None = None
        self.closed = False
        # the host's own idle-CPU check (see _check_idle): at the last check, the sandbox's CPU
        # seconds; since then, the calls answered, the wall time they took, and the last reply
        self._cpu_mark: float | None = None
        self._calls, self._busy, self._replied = 0, 0.0, -math.inf

    def _check_idle(self, check: bool = True) -> None:
        """After IDLE_CHECK_S or more without a call, from outside the sandbox (where env code
        cannot reach, unlike the runner's own check): the CPU its processes used since the last
        mark, less the wall time of the calls in between (the most they could use) and
        IDLE_CPU_PER_CALL_S per call (the runner's waiting), was used while idle; over
        IDLE_CPU_S kills the sandbox (SandboxCrashed). Then marks the clock afresh. It runs too
        after a call of REMARK_S or more, whose wall time would otherwise leave slack (a mark
        without a check would forgive what was used since the last one). Transports that cannot
        tell (cpu_seconds() is None) are not checked here."""
        reader = getattr(self.transport, "cpu_seconds", None)  # (a duck-typed transport: none)
        used = reader() if reader else None
        if used is None:
            return
        if check and self._cpu_mark is not None:
            idle = used - self._cpu_mark - self._busy - IDLE_CPU_PER_CALL_S * self._calls
            if idle > IDLE_CPU_S:
                raise SandboxCrashed(f"the sandbox used {idle:.2f} CPU seconds between calls "
                                     "(env code running while no call was in flight)")
        self._cpu_mark, self._calls, self._busy = used, 0, 0.0

    # ---------------------------------------------------------------- protocol
    def call(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        return self._receive(self._send(op, timeout, fields))

    def _send(self, op: str, timeout: float | None, fields: dict) -> tuple:
        """A call's first half: the request is sent; returns what ``_receive`` needs. Between
        the two the sandbox counts as waiting for a reply (``calls_in_flight``)."""
        if self.closed:
            raise SandboxCrashed("the sandbox was closed or killed earlier; start a new one")
        self._next_id += 1
        request = {"id": self._next_id, "op": op, **fields}
        try:
            line = _encode(request) + "\n"
        except (TypeError, ValueError, RecursionError) as e:
            raise EnvCallError("json", type(e).__name__, f"request is not JSON: {e}") from None
        timeout = self.limits.call_timeout_s if timeout is None else timeout
        started = time.monotonic()
        _busy.add(self)  # one call at a time per sandbox; set.add is atomic
        try:
            if started - self._replied >= IDLE_CHECK_S:  # reading the CPU clock costs: rarely
                self._check_idle()
            self.transport.send(line.encode(), started + timeout)
        except BaseException as e:
            _busy.discard(self)
            self._failed(op, e, timeout, "read its request")
        return op, timeout, started

    def _receive(self, sent: tuple, late_until: float = -math.inf,
                 doomed: list | None = None) -> Any:
        """A call's second half: its reply, read within the call's time from ``_send``, or by
        ``late_until`` (time.monotonic()) if that is later: ``call_all`` reads a reply late
        when an earlier sandbox was slow, and the reply may be in, or stuck behind a full pipe
        that nobody read. ``doomed``: see ``_discard``."""
        op, timeout, started = sent
        try:
            raw = self.transport.recv_line(max(started + timeout, late_until) - time.monotonic(),
                                           self.limits.max_message_bytes)
            self._replied = time.monotonic()
            self._calls, self._busy = self._calls + 1, self._busy + self._replied - started
            if self._replied - started >= REMARK_S:  # a slow call: reading the clock is cheap
                self._check_idle()
        except BaseException as e:
            self._failed(op, e, timeout, "answer", doomed)
        finally:
            _busy.discard(self)
        try:
            reply = json.loads(raw.decode())  # str: skips json's encoding sniffing
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deep
            self._discard(doomed)
            raise SandboxProtocolError(f"{op}: the sandbox answered a line that is not JSON: "
                                       f"{raw[:120]!r}") from None
        if not isinstance(reply, dict) or reply.get("id") != self._next_id:
            self._discard(doomed)
            raise SandboxProtocolError(f"{op}: reply out of step with the request (id {self._next_id})")
        if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and too_deep(reply, MAX_DEPTH):
            self._discard(doomed)  # the runner refuses such a value; a forged reply gets here
            raise SandboxProtocolError(f"{op}: the sandbox answered a value nested deeper than "
                                       f"{MAX_DEPTH} levels; it was killed")
        if reply.get("ok"):
            return reply.get("value")
        err = reply.get("error") or {}
        if not isinstance(err, dict):
            self._discard(doomed)
            raise SandboxProtocolError(f"{op}: the sandbox answered an error that is not an "
                                       f"object: {raw[:120]!r}")
        raise EnvCallError(str(err.get("kind", "env")), str(err.get("type", "")),
                           str(err.get("message", "")), str(err.get("traceback", "")))

    def _failed(self, op: str, e: BaseException, timeout: float, late: str,
                doomed: list | None = None) -> NoReturn:
        """A call broke at the boundary: the sandbox is killed (Ctrl-C too: a reply would come
        out of step) and the error says which call and why."""
        timed_out = isinstance(e, SandboxTimeout)
        why = printable(self.transport.describe_exit()) if isinstance(e, SandboxError) and not timed_out else ""
        self._discard(doomed if isinstance(e, Exception) else None)  # Ctrl-C: all of it now
        if timed_out:
            raise SandboxTimeout(f"{op} did not {late} within {timeout:g} s; the sandbox was "
                                 "killed") from None
        if isinstance(e, SandboxError):
            raise type(e)(f"{op}: {e}" + (f" ({why})" if why else "")) from None
        raise e

    # ---------------------------------------------------------------- env operations
    def load(self, source: str, filename: str = "env.py") -> dict:
        self.meta = self.call("load", timeout=self.limits.load_timeout_s, source=source,
                              filename=filename)
        return self.meta

    def new(self) -> int:
        return self.call("new")

    def reset(self, instance: int, seed: int) -> list:
        return self.call("reset", instance=instance, seed=seed)

    def step(self, instance: int, action: Any) -> list:
        return self.call("step", instance=instance, action=action)

    def solve(self, instance: int, seed: int) -> list:
        return self.call("solve", instance=instance, seed=seed)

    def ping(self, timeout: float | None = None) -> bool:
        return self.call("ping", timeout=timeout) == "pong"

    def stats(self) -> list[float]:
        """Seconds the runner took to answer each request since the last ``stats()`` (the last
        1,000), by its own clock: the env's time without the boundary's. Diagnostics only (a
        reply from untrusted code); SandboxProtocolError when it is not a list of numbers."""
        times = self.call("stats")
        if not isinstance(times, list) or not all(
                type(t) in (int, float) and 0 <= t < math.inf for t in times):
            self.kill()
            raise SandboxProtocolError("stats: the sandbox answered something other than a list "
                                       "of seconds")
        return times

    # ---------------------------------------------------------------- lifetime
    def kill(self) -> None:
        self.closed = True
        self.transport.kill()

    def _discard(self, doomed: list | None) -> None:
        """Kill a sandbox whose call failed; with ``doomed`` (call_all), only stop it now and
        leave the rest of the kill (reaping: a runner holding much memory takes a while to
        die) until every reply of the batch is read."""
        if doomed is None:
            self.kill()
            return
        self.closed = True
        self.transport.stop()
        doomed.append(self)

    close = kill

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


def call_all(calls: Sequence[tuple[Sandbox, str, dict]]) -> list:
    """Calls to several sandboxes at once, each ``(sandbox, op, fields)`` as for ``call``: every
    request is sent, then every reply read, so the sandboxes work in parallel without a thread
    each. Returns, per call, its value or the ``EnvforgeError`` it raised (a sandbox that broke
    is killed, as by ``call``). At most one call per sandbox. An interrupt (Ctrl-C) kills the
    sandboxes whose replies were not read yet: they would come out of step.

    Each call has its time limit from when it was sent. Replies are read one after another, so
    after a slow sandbox the next ones are read late, or close to their limit with a long reply
    still to come (stuck behind a pipe that nobody read): from the first read that starts with
    less than LATE_READ_S left, the replies have until LATE_READ_S from then (one window for the
    batch, so no call runs much more than LATE_READ_S past its limit however wide the batch).
    Sandboxes that fail are killed once every reply is read, so that slow kills do not eat the
    others' time."""
    if len({id(c[0]) for c in calls}) < len(calls):
        raise ValueError("call_all: at most one call per sandbox")
    sent: list = []
    out: list = []
    doomed: list = []
    try:
        for sandbox, op, fields in calls:
            try:
                sent.append(sandbox._send(op, None, fields))
            except EnvforgeError as e:
                sent.append(e)
        late_until = -math.inf
        for (sandbox, _, _), pending in zip(calls, sent):
            if isinstance(pending, EnvforgeError):
                out.append(pending)
                continue
            _, timeout, started = pending
            now = time.monotonic()
            if late_until == -math.inf and now > started + timeout - LATE_READ_S:
                late_until = now + LATE_READ_S
            try:
                out.append(sandbox._receive(pending, late_until, doomed))
            except EnvforgeError as e:
                out.append(e)
        return out
    except BaseException:
        for (sandbox, _, _), pending in list(zip(calls, sent))[len(out):]:
            if not isinstance(pending, EnvforgeError):
                _busy.discard(sandbox)
                sandbox.kill()
        raise
    finally:
        for sandbox in doomed:
            sandbox.kill()


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def warn_once(message: str) -> None:
    """``message`` on stderr, once per process (every sandbox start would repeat it; threads
    starting sandboxes at once say it once): written there, not a ``warnings.warn``, which a
    caller's or another thread's filter could swallow."""
    with _WARNED_LOCK:
        if message in _WARNED:
            return
        _WARNED.add(message)
        sys.stderr.write(f"envforge: warning: {message}\n")
        sys.stderr.flush()


class Backend(ABC):
    """A way to start sandboxes: ``ProcessBackend`` (sandbox/process.py), ``DockerBackend``
    (sandbox/docker.py), and the unisolated ``UnsafeInProcessBackend`` below."""

    name: str = ""

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """(True, how it isolates) or (False, why not and how to fix it). Never raises."""

    def warning(self) -> str | None:
        """What a user must be told before env code runs in this backend's sandboxes (a
        containment weaker than it should be), else None; never raises. The process backend's
        ``start`` says it on stderr (``warn_once``), the unisolated one's warns at every start;
        a ``RayPool`` actor hands it back to the caller, who says it there (the actor's stderr
        goes to its worker's log)."""
        return None

    @abstractmethod
    def start(self, limits: Limits, hash_seed: int = 0) -> Sandbox:
        """Start one sandbox with the runner waiting for requests (no env loaded yet).

        ``hash_seed`` becomes the runner's PYTHONHASHSEED, so determinism can be checked across
        processes with different string hashing.
        """


BACKENDS = ("auto", "process", "docker", "unsafe-inprocess")


def get_backend(name: "str | Backend" = "auto") -> Backend:
    """The backend called ``name``: "process", "docker", "unsafe-inprocess" (no isolation: for
    benchmarks of trusted code), or "auto": the process sandbox where it works, else Docker
    (else the process backend, whose ``start`` says why nothing works). A Backend passes through.
    Each backend's module is imported only when asked for; none imports an optional dependency
    before it starts a sandbox."""
    if isinstance(name, Backend):
        return name
    if name in ("auto", "process"):
        from sandbox.process import ProcessBackend
        process = ProcessBackend()
        if name == "process" or process.available()[0]:
            return process
        from sandbox.docker import DockerBackend
        docker = DockerBackend()
        return docker if docker.available()[0] else process
    if name == "docker":
        from sandbox.docker import DockerBackend
        return DockerBackend()
    if name == "unsafe-inprocess":
        return UnsafeInProcessBackend()
    raise UsageError(f"unknown sandbox backend {name!r}; choose {', '.join(BACKENDS)}")


#: An env that reports, from inside a sandbox, what holds it (see ``containment``).
CONTAINMENT_PROBE = """\
import _thread, ctypes, errno, fcntl, os, resource, time
CAPABILITY = "containment probe"


def refused(attempt):
    try:
        attempt()
    except (OSError, RuntimeError):
        return True
    return False


def syscall_refused(number, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(number, *args) == -1 and ctypes.get_errno() == errno.EPERM


class Env:
    tools = []

    def reset(self, seed):
        status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
        return {
            "uid": os.getuid(),
            "capabilities": int(status["CapEff"], 16) == 0,
            "seccomp": status.get("Seccomp", "0").strip() == "2",
            "no_new_privs": status.get("NoNewPrivs", "0").strip() == "1",
            "threads": refused(lambda: _thread.start_new_thread(time.sleep, (1,))),
            "processes": refused(lambda: os.waitpid(os.fork() or os._exit(0), 0)),
            "tiocsti": syscall_refused(16, 0, 0x5412, ctypes.c_char_p(b"x")),
            "setown": syscall_refused(72, 0, 8, os.getpid()),
            "io_uring": syscall_refused(425, 1, ctypes.create_string_buffer(120)),
            "cpu_s": resource.getrlimit(resource.RLIMIT_CPU)[0],
        }, {}

    def step(self, action):
        return {}, 0.0, True, False, {}

    def solve(self, seed):
        return []
"""


def containment(backend: "Backend") -> tuple[dict, str]:
    """What holds env code in a sandbox of ``backend`` started now, seen from inside it (the
    probe above): its facts, and them in words. Raises SandboxError when it cannot start."""
    with backend.start(Limits(call_timeout_s=10.0)) as sb:
        sb.load(CONTAINMENT_PROBE, filename="containment_probe.py")
        sb.new()
        facts, _ = sb.reset(0, 0)
    if not isinstance(facts, dict):
        raise SandboxProtocolError("the containment probe answered something other than a dict")
    words = [f"uid {facts.get('uid')}" + (" (root!)" if facts.get("uid") == 0 else ""),
             "no capabilities" if facts.get("capabilities") else "CAPABILITIES KEPT",
             "seccomp" if facts.get("seccomp") else "no seccomp",
             "no_new_privs" if facts.get("no_new_privs") else "privileges may grow"]
    for key, what in (("threads", "threads"), ("processes", "processes"),
                      ("tiocsti", "TIOCSTI"), ("setown", "F_SETOWN"), ("io_uring", "io_uring")):
        words.append(f"{what} {'refused' if facts.get(key) else 'ALLOWED'}")
    words.append(f"RLIMIT_CPU {facts.get('cpu_s')} s, no CPU between calls (signals blocked, "
                 "idle CPU ends the sandbox)")
    return facts, ", ".join(words)


def diagnose(probe: bool = True) -> list[dict]:
    """Which backends work on this machine: [{"backend", "ok", "detail"}], the process sandbox's
    isolation layers one by one, then Docker. ``detail`` says how it isolates, or why not and the
    fix. With ``probe``, each backend that works also gets "containment": what holds env code
    there, seen from inside a sandbox (``containment``), facts and words."""
    from sandbox.docker import DockerBackend
    from sandbox.process import LAYERS, ProcessBackend, seccomp_probe, shared_memory_works

    rows = []
    for layer in LAYERS:
        backend = ProcessBackend(isolation=layer)
        ok, why = backend.available()
        rows.append({"backend": f"process/{layer}", "ok": ok, "detail": why, "run": backend})
    try:
        sec_ok, sec_why = seccomp_probe()
    except Exception as e:  # the probe could not run (a timeout, no memory): no answer is a no here
        sec_ok, sec_why = False, f"could not be probed: {e}"
    rows.append({"backend": "process/seccomp", "ok": sec_ok, "detail": sec_why})
    rows.append({"backend": "process/channel", "ok": True, "detail": shared_memory_works()[1]})
    backend = DockerBackend()
    ok, why = backend.available()
    rows.append({"backend": "docker", "ok": ok, "detail": why, "run": backend})
    for row in rows:
        backend = row.pop("run", None)
        if probe and row["ok"] and backend is not None:
            try:
                facts, words = containment(backend)
                row["containment"] = {"facts": facts, "words": words}
            except Exception as e:  # never raise: say what went wrong
                row["containment"] = {"facts": None, "words": f"the probe failed: {e}"}
                row["ok"] = False  # it said it would work, and no sandbox started
    return rows


# --------------------------------------------------------------------------- no isolation

UNSAFE = ("backend 'unsafe-inprocess' runs env code INSIDE THIS PROCESS with no isolation, no "
          "time limit and no memory limit: for benchmarks and debugging of trusted code only")


class UnsafeInProcessBackend(Backend):
    """NO ISOLATION. The runner's request handling called in this process: the same protocol
    and JSON checks as the real sandboxes, so that benchmarks can measure what crossing a
    boundary costs. Env code can do anything this process can; a hang hangs the caller;
    ``hash_seed`` is ignored. Never a default; every start warns."""

    name = "unsafe-inprocess"

    def available(self) -> tuple[bool, str]:
        return True, "unsafe-inprocess: NO isolation (env code runs in this process)"

    def warning(self) -> str:  # (read where the sandboxes' host is another process: a Ray actor)
        return ("backend 'unsafe-inprocess' runs env code with NO isolation, no time limit and no memory "
                "limit, inside the process that hosts the sandboxes: for benchmarks and debugging of "
                "trusted code only")

    def start(self, limits: Limits, hash_seed: int = 0) -> Sandbox:
        import warnings
        warnings.warn(UNSAFE, RuntimeWarning, stacklevel=2)
        return Sandbox(InProcessTransport(), limits, backend=self.name)


class InProcessTransport(Transport):
    """Hands each request line to a ``runner.Runner`` in this process; replies queue up."""

    def __init__(self):
        from sandbox.runner import Runner
        self.runner = Runner({"seccomp": False, "uid": os.getuid(), "isolation": "none"})
        self.replies: list[bytes] = []
        self.killed = False

    def send(self, data: bytes, deadline: float) -> None:
        if self.killed:
            raise SandboxCrashed("the in-process runner was killed")
        reply, error = self.runner.answer(data)
        if error is not None and error["type"] == "KeyboardInterrupt":
            raise KeyboardInterrupt  # Ctrl-C reached env code: stop, as a host must
        self.replies.append(reply.encode())

    def recv_line(self, timeout: float, max_bytes: int) -> bytes:
        if not self.replies:
            raise SandboxProtocolError("no request is waiting for a reply")
        line = self.replies.pop(0)
        if len(line) > max_bytes:
            raise SandboxProtocolError(f"a reply line longer than {max_bytes} bytes")
        return line

    def kill(self) -> None:
        self.killed = True

    def alive(self) -> bool:
        return not self.killed
