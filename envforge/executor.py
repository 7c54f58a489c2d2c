"""Where the work runs: on this machine (``local``, the default) or over a Ray cluster (``ray``).

    executor = make_executor(ExecutorSettings(executor="ray"))   # joins or starts a cluster
    reports = executor.audit_all(["envs/a", "envs/b"])           # one Ray task per env
    pool = executor.pool(source, size=8)                         # sandboxes as Ray actors
    executor.close()

Both executors give the same answers; only the place differs. ``local`` imports no Ray.

- Audits: each env's audit is a Ray task (one CPU) that starts its own sandbox on the node it
  lands on (so the Docker backend uses that node's engine). The caller reads env.py and the target
  and sends them with the task; the report comes back and report.json is written by the caller.
  A task whose node dies is retried elsewhere (``TASK_RETRIES``); the gate's probes are drawn
  from the settings' ``probe_seed``, so a retried audit gives the same report.
- Rollouts: ``RayPool`` has the lease API of ``sandbox.pool.SandboxPool``; each sandbox lives in a
  Ray actor spread over the nodes. A sandbox whose actor died (its node was lost) is replaced by
  a new actor and the episode so far is replayed into it (reset with the same seed, the same
  actions: envs are deterministic, the gate checks it) before the call is retried, so the
  episode goes on as if nothing happened.
- LLM requests are not sent from Ray: synthesis keeps them on the caller, where one client's
  ``rate_limit`` and the synthesis concurrency bound them for the whole run.

The cluster is ``ExecutorSettings.ray_address``, else ``$ENVFORGE_RAY_ADDRESS``, else a Ray
started on this machine for the run. Every node needs envforge installed (the same version).
"""
from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from envforge import errors
from envforge.contract import Limits, Report
from envforge.errors import ClusterError, EnvforgeError, SandboxUnavailable, UsageError
from envforge.gate import AuditJob, audit, check, read_env, save_report
from envforge.gate.config import GateSettings
from envforge.progress import Progress, Step
from envforge.settings import Settings, setting
from sandbox.pool import Lease, SandboxPool

EXECUTORS = ("local", "ray")
ADDRESS_ENV = "ENVFORGE_RAY_ADDRESS"
TASK_RETRIES = 3        # a Ray task whose node died runs again elsewhere, at most this often
ACTOR_REPLACEMENTS = 3  # a sandbox actor that died is replaced at most this often per call


@dataclass
class ExecutorSettings(Settings):
    """Where audits and env steps run."""
    executor: str = setting("local", "Where audits and env steps run: local (this machine) or ray "
                            "(a Ray cluster; needs the ray extra).", choices=EXECUTORS)
    ray_address: str | None = setting(None, "With --executor ray: the cluster to join (host:port "
                                      f"of its head, or auto; default ${ADDRESS_ENV}, else a Ray "
                                      "started on this machine for the run).")


def make_executor(settings: ExecutorSettings | None = None) -> "LocalExecutor | RayExecutor":
    s = settings or ExecutorSettings()
    if s.executor == "ray":
        return RayExecutor(s.ray_address)
    if s.ray_address:
        raise UsageError("--ray-address needs --executor ray")
    return LocalExecutor()


class LocalExecutor:
    """Everything on this machine: the gate in this process, sandboxes in a ``SandboxPool``."""
    name = "local"

    def audit(self, path: str | Path, **kwargs: Any) -> Report:
        return audit(path, **kwargs)

    def audit_all(self, paths: Sequence[str | Path], progress: Progress | None = None,
                  **kwargs: Any) -> list[Report]:
        return [audit(p, progress=progress, **kwargs) for p in paths]

    def pool(self, source: str, size: int = 4, backend: str = "auto", limits: Limits | None = None,
             hash_seed: int = 0, max_uses: int | None = None) -> SandboxPool:
        return SandboxPool(source, size=size, backend=backend, limits=limits, hash_seed=hash_seed,
                           max_uses=max_uses)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ============================================================================= Ray


def _ray():
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray: pip install -c constraints.txt -e '.[ray]'") from None
    return ray


def node_id() -> str:
    """The Ray node this code runs on (a hex id)."""
    return _ray().get_runtime_context().get_node_id()


def _failure(e: EnvforgeError) -> tuple:
    return type(e).__name__, str(e)


def _raise(failure: tuple) -> None:
    """Raise again, on the caller, an envforge error that a task or an actor returned."""
    name, message = failure
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, EnvforgeError)):
        cls = EnvforgeError
    try:
        err = cls(message)
    except TypeError:  # an error class with more fields (EnvCallError): the message holds them
        err = (errors.EnvCallError("env", "", message) if name == "EnvCallError"
               else EnvforgeError(message))
    raise err


def _reachable(address: str, timeout: float = 5.0) -> None:
    """Raise ``ClusterError`` when nothing answers at ADDRESS (host:port): ``ray.init`` would wait
    for it for ever."""
    import socket
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray-address {address}: want HOST:PORT of the cluster's head (its GCS "
                         "port, 6379 unless `ray start --head --port` said otherwise)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ClusterError(f"cannot join the Ray cluster at {address}: nothing answers there "
                           f"({e.strerror or e}). Check that its head is up (ray status --address "
                           f"{address}), or unset {ADDRESS_ENV} and --ray-address to run a local "
                           "Ray") from None


def audit_task(job: AuditJob, static_only: bool, backend: str,
               settings: GateSettings | None) -> tuple:
    """The body of a Ray audit task: ("ok", report, node) or ("error", failure, node)."""
    try:
        return "ok", check(job, static_only=static_only, backend=backend, settings=settings), node_id()
    except EnvforgeError as e:
        return "error", _failure(e), node_id()


class RayExecutor:
    """Audits as Ray tasks and sandboxes as Ray actors; see the module docstring."""
    name = "ray"

    def __init__(self, address: str | None = None):
        ray = _ray()
        self.address = address or os.environ.get(ADDRESS_ENV) or None
        self.owned = not ray.is_initialized()
        self.where: dict[str, str] = {}   # audited path -> the node its audit ran on
        self.pools: list[RayPool] = []    # the pools made, each with its ``nodes``
        self._lock = threading.Lock()
        if self.owned:
            if self.address and self.address != "auto":  # auto: the cluster this machine is in
                _reachable(self.address)
            try:
                ray.init(address=self.address, logging_level="ERROR", log_to_driver=False,
                         **({} if self.address else {"include_dashboard": False}))
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ClusterError(f"cannot join the Ray cluster at {self.address}: "
                                   f"{str(e).splitlines()[0] if str(e) else type(e).__name__}. "
                                   f"Check that it is up (ray status --address {self.address}), or "
                                   f"unset {ADDRESS_ENV} and --ray-address to run a local Ray"
                                   ) from None
        self._task = ray.remote(audit_task).options(num_cpus=1, max_retries=TASK_RETRIES)
        if self.owned and self.address and self.address != "auto":
            threading.Thread(target=self._watch, name="envforge-ray-head", daemon=True).start()

    def _watch(self, every: float = 2.0, misses: int = 3) -> None:
        """Ray ends a driver whose head is gone only after a minute, with its own message: stop
        sooner, saying what happened and that a re-run resumes (what was finished is on disk)."""
        missed = 0
        while self.owned:
            time.sleep(every)
            try:
                _reachable(self.address, timeout=every)
                missed = 0
            except (ClusterError, UsageError):
                missed += 1
            if missed >= misses and self.owned:
                sys.stderr.write(f"error: the Ray cluster's head at {self.address} stopped "
                                 f"answering; what was finished is kept (report.json files, "
                                 f"synth's manifests, train's checkpoint): run the command again "
                                 f"to resume once the cluster is back, or with --executor local\n")
                sys.stderr.flush()
                os._exit(1)

    def nodes(self) -> list[str]:
        """The ids of the cluster's live nodes."""
        return sorted(n["NodeID"] for n in _ray().nodes() if n.get("Alive"))

    def audit(self, path: str | Path, **kwargs: Any) -> Report:
        return self.audit_all([path], **kwargs)[0]

    def audit_all(self, paths: Sequence[str | Path], target: Any = None, static_only: bool = False,
                  backend: str = "auto", settings: GateSettings | None = None,
                  write_report: bool = True, progress: Progress | None = None) -> list[Report]:
        """Every env audited by a Ray task; reports in the order of ``paths``, report.json
        written here as ``envforge.gate.audit`` writes it. ``progress`` gets a ``done`` step per
        finished audit (a task's own stages are not reported back)."""
        ray = _ray()
        jobs = [read_env(p, target) for p in paths]  # every usage error before any work
        refs = [self._task.remote(job, static_only, backend, settings) for job in jobs]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        left = list(refs)
        while left:  # each report.json written as its audit ends: a crash keeps the finished ones
            done, left = ray.wait(left, num_returns=1)
            i = index[done[0]]
            status, value, node = results[i] = self._get(done[0], jobs[i].path)
            with self._lock:
                self.where[jobs[i].path] = node
            if status == "ok" and write_report and Path(jobs[i].path).is_dir():
                save_report(value, Path(jobs[i].path))
            if progress is not None:
                progress(Step("done", jobs[i].path, len(refs) - len(left), len(refs)))
        for status, value, _ in results:
            if status == "error":
                _raise(value)
        return [value for _, value, _ in results]

    def _get(self, ref: Any, what: str) -> Any:
        ray = _ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as e:
            raise ClusterError(f"the Ray cluster lost the audit of {what} ({type(e).__name__}, "
                               f"after {TASK_RETRIES} retries): {str(e).splitlines()[0][:300]}"
                               ) from None

    def pool(self, source: str, size: int = 4, backend: str = "auto", limits: Limits | None = None,
             hash_seed: int = 0, max_uses: int | None = None) -> "RayPool":
        if max_uses is not None:
            raise UsageError("max_uses is not supported by the Ray pool: each actor keeps its "
                             "sandbox (and replaces it when it dies)")
        pool = RayPool(source, size=size, backend=backend, limits=limits, hash_seed=hash_seed)
        self.pools.append(pool)
        return pool

    def close(self) -> None:
        if self.owned:
            _ray().shutdown()
            self.owned = False

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SandboxActor:
    """A Ray actor holding one warm sandbox (a local ``SandboxPool`` of one, whose thread starts
    it and starts a replacement when it dies) with the env loaded and an instance made."""

    def __init__(self, source: str, backend: str, limits: Limits | None, hash_seed: int):
        self.pool = SandboxPool(source, size=1, backend=backend, limits=limits, hash_seed=hash_seed)
        self.lease: Lease | None = None

    def call(self, op: str, arg: Any) -> tuple:
        """("ok", value) or ("error", failure); ``op``: reset, step, solve, or ready (the env's
        meta and this node's id)."""
        try:
            if self.lease is None or self.lease.sandbox.closed:
                if self.lease is not None:
                    self.lease.release()
                self.lease = self.pool.acquire(timeout=120)
            if op == "ready":
                return "ok", {"meta": self.lease.meta, "node": node_id()}
            return "ok", getattr(self.lease, op)(arg)
        except EnvforgeError as e:
            return "error", _failure(e)
        except TimeoutError as e:
            return "error", ("SandboxUnavailable", str(e))


class RemoteSandbox:
    """The caller's side of one ``SandboxActor``, shaped as a ``sandbox.base.Sandbox`` as far as
    ``SandboxEnv`` and ``Lease`` use one: ``reset``/``step``/``solve``, ``meta``, ``closed``,
    ``kill``. Remembers the episode's calls so that a replacement actor can be brought to the
    same state."""

    def __init__(self, pool: "RayPool"):
        self.pool = pool
        self.actor = pool._spawn()
        self.episode: list[tuple[str, Any]] = []
        self.meta: dict = {}
        self.node: str | None = None
        self.closed = False

    def ready(self) -> dict:
        info = self._call("ready", None)
        self.meta, self.node = info["meta"], info["node"]
        self.pool._placed(self.node)
        return info

    def reset(self, instance: int, seed: int) -> list:
        self.episode = []
        out = self._call("reset", seed)
        self.episode = [("reset", seed)]
        return out

    def step(self, instance: int, action: Any) -> list:
        out = self._call("step", action)
        self.episode.append(("step", action))
        return out

    def solve(self, instance: int, seed: int) -> list:
        return self._call("solve", seed)

    def _call(self, op: str, arg: Any) -> Any:
        ray = _ray()
        for attempt in range(ACTOR_REPLACEMENTS + 1):
            try:
                if attempt:
                    self._replace()
                status, value = ray.get(self.actor.call.remote(op, arg))
            except ray.exceptions.RayActorError as e:
                if attempt == ACTOR_REPLACEMENTS or self.pool.closed:
                    self.closed = True
                    raise ClusterError(f"a sandbox actor died {attempt + 1} times in a row (its "
                                       f"node lost?): {str(e).splitlines()[0][:300]}") from None
                continue
            except ray.exceptions.RayError as e:  # the cluster itself (its head) failed
                self.closed = True
                raise ClusterError(f"the Ray cluster failed during a sandbox call: "
                                   f"{str(e).splitlines()[0][:300]}") from None
            if status == "error":
                _raise(value)
            return value

    def _replace(self) -> None:
        """A new actor, brought to where this episode was: the same reset and steps again."""
        ray = _ray()
        self.kill()
        self.closed = False
        self.actor = self.pool._spawn(replacing=True)
        status, info = ray.get(self.actor.call.remote("ready", None))
        if status == "ok":
            self.node = info["node"]
            self.pool._placed(self.node)
        for op, arg in self.episode:
            ray.get(self.actor.call.remote(op, arg))  # an env error here is the one seen before

    def kill(self) -> None:
        self.closed = True
        try:
            _ray().kill(self.actor)
        except Exception:  # the actor or the cluster is gone already
            pass


class RayPool:
    """``size`` sandboxes, each in a Ray actor spread over the cluster's nodes, with the lease API
    of ``sandbox.pool.SandboxPool`` (``acquire``, ``release``, ``wait_warm``, ``close``).
    ``nodes`` counts the leases' placements per node (replacements included)."""

    def __init__(self, source: str, size: int = 4, backend: str = "auto",
                 limits: Limits | None = None, hash_seed: int = 0, filename: str = "env.py"):
        if size < 1:
            raise UsageError(f"a pool needs at least one sandbox, got size={size}")
        ray = _ray()
        self.source, self.size, self.filename, self.backend = source, size, filename, backend
        self.limits, self.hash_seed = limits or Limits(), hash_seed
        self.started = self.replaced = 0
        self.nodes: dict[str, int] = {}
        self.closed = False
        self._lock = threading.Lock()
        self._actor = ray.remote(SandboxActor).options(num_cpus=0, max_restarts=0,
                                                       scheduling_strategy="SPREAD")
        self._idle: queue.Queue[Lease] = queue.Queue()
        self._all = [Lease(self, RemoteSandbox(self), 0) for _ in range(size)]  # type: ignore[arg-type]
        try:
            for lease in self._all:
                lease.sandbox.ready()  # the actors start in parallel; this waits for each
                self._idle.put(lease)
        except BaseException:
            self.close()
            raise

    def _spawn(self, replacing: bool = False) -> Any:
        with self._lock:
            self.started += 1
            self.replaced += replacing
        return self._actor.remote(self.source, self.backend, self.limits, self.hash_seed)

    def _placed(self, node: str) -> None:
        with self._lock:
            self.nodes[node] = self.nodes.get(node, 0) + 1

    def acquire(self, timeout: float | None = None) -> Lease:
        """A warm sandbox; waits up to ``timeout`` seconds (None: for ever) for one to be free."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.closed:
            raise SandboxUnavailable("the pool is closed")
        try:
            lease = self._idle.get(timeout=None if deadline is None else
                                   max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"no sandbox came free within {timeout:g} s (pool size "
                               f"{self.size})") from None
        lease.released = False
        lease.uses += 1
        return lease

    def release(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        if self.closed:
            lease.sandbox.kill()
            return
        if lease.sandbox.closed:  # its actors kept dying: a fresh one
            lease = Lease(self, RemoteSandbox(self), 0)  # type: ignore[arg-type]
            lease.sandbox.ready()
            with self._lock:
                self.replaced += 1
                self._all.append(lease)
        self._idle.put(lease)

    def wait_warm(self, timeout: float = 60.0) -> None:
        """The actors are warm once the pool is made (the constructor waits)."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for lease in getattr(self, "_all", []):
            lease.sandbox.kill()

    def __enter__(self) -> "RayPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"RayPool(size={self.size}, backend={self.backend!r}, started={self.started}, "
                f"replaced={self.replaced}, nodes={len(self.nodes)})")
