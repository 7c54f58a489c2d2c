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
    on failure       {"id": n, "ok": false, "error": {"kind": "env"|"json"|"contract"|"protocol",
                                                      "type": "KeyError", "message": ..., "traceback": ...}}

A backend owns the isolation boundary and a byte ``Transport`` to one runner; ``Sandbox`` speaks
the protocol over any transport, enforces the per-call time limit and the message size limit, and
turns every failure into a typed error (``envforge.errors``): ``EnvCallError`` when the env's code
raised (the sandbox lives on), ``SandboxTimeout`` / ``SandboxCrashed`` / ``SandboxProtocolError``
when the sandbox itself is gone (it is killed; start a new one).
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from envforge.contract import Limits
from envforge.errors import (EnvCallError, SandboxCrashed, SandboxError, SandboxProtocolError,
                             SandboxTimeout)


class Transport(ABC):
    """A bidirectional line stream to one runner, plus the means to kill it."""

    @abstractmethod
    def send(self, data: bytes) -> None:
        """Write bytes (a complete line). Raises SandboxCrashed when the runner is gone."""

    @abstractmethod
    def recv_line(self, timeout: float, max_bytes: int) -> bytes:
        """Read one line (without the newline) within ``timeout`` seconds.

        Raises SandboxTimeout, SandboxCrashed (EOF), or SandboxProtocolError (line too long).
        """

    @abstractmethod
    def kill(self) -> None:
        """Stop the runner and everything it started; idempotent; never raises."""

    @abstractmethod
    def alive(self) -> bool: ...

    def describe_exit(self) -> str:
        """Why the runner is gone (exit status, signal, stderr tail), for error messages."""
        return ""


class Sandbox:
    """One live sandbox holding (at most) one loaded env module and its instances."""

    def __init__(self, transport: Transport, limits: Limits, backend: str = ""):
        self.transport, self.limits, self.backend = transport, limits, backend
        self._next_id = 0
        self.meta: dict | None = None
        self.closed = False

    # ---------------------------------------------------------------- protocol
    def call(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        if self.closed:
            raise SandboxCrashed("the sandbox was closed or killed earlier; start a new one")
        self._next_id += 1
        request = {"id": self._next_id, "op": op, **fields}
        try:
            line = json.dumps(request, allow_nan=False) + "\n"
        except (TypeError, ValueError) as e:
            raise EnvCallError("json", type(e).__name__, f"request is not JSON: {e}") from None
        timeout = self.limits.call_timeout_s if timeout is None else timeout
        try:
            self.transport.send(line.encode())
            raw = self.transport.recv_line(timeout, self.limits.max_message_bytes)
        except SandboxTimeout:
            self.kill()
            raise SandboxTimeout(f"{op} did not answer within {timeout:g} s; the sandbox was killed") from None
        except SandboxError as e:
            why = self.transport.describe_exit()
            self.kill()
            raise type(e)(f"{op}: {e}" + (f" ({why})" if why else "")) from None
        try:
            reply = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self.kill()
            raise SandboxProtocolError(f"{op}: the sandbox answered a line that is not JSON: "
                                       f"{raw[:120]!r}") from None
        if not isinstance(reply, dict) or reply.get("id") != self._next_id:
            self.kill()
            raise SandboxProtocolError(f"{op}: reply out of step with the request (id {self._next_id})")
        if reply.get("ok"):
            return reply.get("value")
        err = reply.get("error") or {}
        raise EnvCallError(str(err.get("kind", "env")), str(err.get("type", "")),
                           str(err.get("message", "")), str(err.get("traceback", "")))

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

    def ping(self) -> bool:
        return self.call("ping") == "pong"

    # ---------------------------------------------------------------- lifetime
    def kill(self) -> None:
        self.closed = True
        self.transport.kill()

    close = kill

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


class Backend(ABC):
    """A way to start sandboxes. Subclasses: ``ProcessBackend`` (here), ``DockerBackend`` (later)."""

    name: str = ""

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """(True, how it isolates) or (False, why not and how to fix it). Never raises."""

    @abstractmethod
    def start(self, limits: Limits, hash_seed: int = 0) -> Sandbox:
        """Start one sandbox with the runner waiting for requests (no env loaded yet).

        ``hash_seed`` becomes the runner's PYTHONHASHSEED, so determinism can be checked across
        processes with different string hashing.
        """


def get_backend(name: str = "auto") -> Backend:
    """The backend called ``name`` ("process", or "auto" for the best available one)."""
    if name in ("auto", "process"):
        from sandbox.process import ProcessBackend
        return ProcessBackend()
    from envforge.errors import UsageError
    raise UsageError(f"unknown sandbox backend {name!r}; choose 'process' or 'auto'")
