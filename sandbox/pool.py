"""A warm pool: N sandboxes with one env loaded, handed out to parallel rollouts.

    pool = SandboxPool(source, size=4, backend="docker")
    with pool.acquire() as lease:                 # from any thread; async: acquire_async()
        obs, info = lease.reset(seed=7)
        obs, reward, terminated, truncated, info = lease.step(action)
    pool.close()

Each sandbox is started, given the env (``load``) and one instance (``new``) ahead of time by
the pool's own thread, so ``acquire`` only takes one off a queue. A sandbox goes back to the
pool on release, ready for the next episode (``reset`` starts afresh: the contract, checked by
the gate's determinism and isolation checks, says an env forgets its last episode). One that
died, hung or broke a limit (the sandbox is closed: ``SandboxTimeout``, ``SandboxCrashed``,
``SandboxProtocolError``) is thrown away and the pool starts a replacement; an ``EnvCallError``
leaves the sandbox alive and it is reused. ``max_uses`` retires a sandbox after that many
leases (None: never).

Thread-safe. Sandboxes are started from one long-lived thread per pool: process sandboxes die
with the thread that started them (PR_SET_PDEATHSIG), so that thread lives as long as the pool.
``close()`` kills every sandbox, leased ones included.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any

from envforge.contract import Limits
from envforge.errors import EnvforgeError, SandboxUnavailable, UsageError
from sandbox.base import Backend, Sandbox, call_all, get_backend

#: what each lease operation sends besides the instance
ARGUMENT = {"reset": "seed", "step": "action", "solve": "seed"}

#: Consecutive failures to start a sandbox after which the pool gives up (and says why).
MAX_START_FAILURES = 3


class Lease:
    """One warm sandbox, its env loaded and one instance made, lent to one rollout."""

    def __init__(self, pool: "SandboxPool", sandbox: Sandbox, instance: int):
        self.pool, self.sandbox, self.instance = pool, sandbox, instance
        self.uses = 0
        self.released = False

    @property
    def meta(self) -> dict:
        return self.sandbox.meta or {}

    def reset(self, seed: int) -> list:
        return self.sandbox.reset(self.instance, seed)

    def step(self, action: Any) -> list:
        return self.sandbox.step(self.instance, action)

    def solve(self, seed: int) -> list:
        return self.sandbox.solve(self.instance, seed)

    def release(self) -> None:
        self.pool.release(self)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class SandboxPool:
    """``size`` warm sandboxes running ``source``; see the module docstring."""

    def __init__(self, source: str, size: int = 4, backend: str | Backend = "auto",
                 limits: Limits | None = None, hash_seed: int = 0, filename: str = "env.py",
                 max_uses: int | None = None):
        if size < 1:
            raise UsageError(f"a pool needs at least one sandbox, got size={size}")
        self.source, self.size, self.filename = source, size, filename
        self.backend = get_backend(backend)
        self.limits, self.hash_seed, self.max_uses = limits or Limits(), hash_seed, max_uses
        self.started = self.replaced = 0
        self._idle: queue.Queue[Lease | None] = queue.Queue()
        self._wanted: queue.Queue[bool] = queue.Queue()
        self._all: set[Lease] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._error: EnvforgeError | None = None
        for _ in range(size):
            self._wanted.put(True)
        self._thread = threading.Thread(target=self._fill, name="envforge-pool", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the filler thread
    def _fill(self) -> None:
        failures = 0
        while self._wanted.get() and not self._closed:
            try:
                lease = self._start()
            except EnvforgeError as e:
                failures += 1
                if failures < MAX_START_FAILURES:
                    self._wanted.put(True)
                    continue
                self._error = SandboxUnavailable(f"the pool could not start a sandbox "
                                                 f"{failures} times in a row: {e}")
                self._idle.put(None)  # wake every waiter; each passes the None on
                while self._wanted.get():  # park until close(): leased sandboxes die with us
                    pass
                return
            failures = 0
            with self._lock:
                if self._closed:
                    lease.sandbox.kill()
                    return
                self._all.add(lease)
            self._idle.put(lease)

    def _start(self) -> Lease:
        sandbox = self.backend.start(self.limits, hash_seed=self.hash_seed)
        try:
            sandbox.load(self.source, filename=self.filename)
            instance = sandbox.new()
        except BaseException:
            sandbox.kill()
            raise
        self.started += 1
        return Lease(self, sandbox, instance)

    # ------------------------------------------------------------------ lending
    def acquire(self, timeout: float | None = None) -> Lease:
        """A warm sandbox; waits up to ``timeout`` seconds (None: for ever) for one to be free.

        Raises ``SandboxUnavailable`` when the pool cannot start sandboxes (the message says
        why) or is closed, and ``TimeoutError`` when none came free in time.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                raise SandboxUnavailable("the pool is closed")
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                lease = self._idle.get(timeout=left)
            except queue.Empty:
                raise TimeoutError(f"no sandbox came free within {timeout:g} s "
                                   f"(pool size {self.size})") from None
            if lease is None:
                self._idle.put(None)
                raise self._error or SandboxUnavailable("the pool is closed")
            if lease.sandbox.closed:  # killed while idle (close(), or from outside)
                self._retire(lease)
                continue
            lease.released = False
            lease.uses += 1
            return lease

    def call_all(self, calls: list[tuple[Lease, str, Any]]) -> list:
        """Several leases' calls at once, each ``(lease, op, arg)`` with ``op`` reset, step or
        solve (``arg`` as for that method): sent together, so their sandboxes work in parallel
        (``sandbox.base.call_all``). Returns, per call, its value or the ``EnvforgeError`` it
        raised. At most one call per lease."""
        return call_all([(lease.sandbox, op, {"instance": lease.instance, ARGUMENT[op]: arg})
                         for lease, op, arg in calls])

    async def acquire_async(self, timeout: float | None = None) -> Lease:
        """``acquire`` for asyncio code; a cancelled wait hands the sandbox it got back."""
        future = asyncio.get_running_loop().run_in_executor(None, self.acquire, timeout)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(lambda f: f.exception() is None and f.result().release())
            raise

    def release(self, lease: Lease) -> None:
        """Give a sandbox back: reused when alive, replaced when it died or is used up."""
        if lease.released:
            return
        lease.released = True
        if self._closed:
            lease.sandbox.kill()
        elif lease.sandbox.closed or (self.max_uses is not None and lease.uses >= self.max_uses):
            self._retire(lease)
        else:
            self._idle.put(lease)

    def _retire(self, lease: Lease) -> None:
        lease.sandbox.kill()
        with self._lock:
            self._all.discard(lease)
            if self._closed:
                return
            self.replaced += 1
        self._wanted.put(True)

    def wait_warm(self, timeout: float = 60.0) -> None:
        """Block until all ``size`` sandboxes are started (or raise why not)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                warm = len(self._all)  # started, idle or lent
            if warm >= self.size:
                return
            if self._error:
                raise self._error
            if self._closed:
                raise SandboxUnavailable("the pool is closed")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the pool had {warm} of {self.size} sandboxes warm after "
                                   f"{timeout:g} s")
            time.sleep(0.01)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Kill every sandbox (leased ones too) and stop the pool's thread; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            leases = list(self._all)
            self._all.clear()
        self._wanted.put(False)
        for lease in leases:
            lease.sandbox.kill()
        self._idle.put(None)
        self._thread.join(timeout=30)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"SandboxPool(size={self.size}, backend={self.backend.name!r}, "
                f"idle={self._idle.qsize()}, started={self.started}, replaced={self.replaced})")
