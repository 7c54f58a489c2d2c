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
- Rollouts: ``RayPool`` has the lease API of ``sandbox.pool.SandboxPool``; its sandboxes live in
  Ray actors, one per node, each hosting its node's share. The steps that several leases send
  to one actor at the same time (a rollout steps a whole lane at once) travel as one batch, over
  a direct TCP channel to the actor (its address and a token come through Ray; a Ray call costs
  about a millisecond, a local sandbox step far less), or as a Ray call where no channel can be
  opened. An actor that died (its node was lost) is replaced by a new one and each of its
  sandboxes' episodes so far is replayed into it (reset with the same seed, the same actions: envs are deterministic, the
  gate checks it) before the calls are sent again, so the episodes go on as if nothing happened.
- LLM requests are not sent from Ray: synthesis keeps them on the caller, where one client's
  ``rate_limit`` and the synthesis concurrency bound them for the whole run.

The cluster is ``ExecutorSettings.ray_address``, else ``$ENVFORGE_RAY_ADDRESS``, else a Ray
started on this machine for the run. Every node needs envforge installed (the same version).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import secrets
import socket
import struct
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
from sandbox.base import warn_once
from sandbox.pool import Lease, SandboxPool

EXECUTORS = ("local", "ray")
ADDRESS_ENV = "ENVFORGE_RAY_ADDRESS"
TASK_RETRIES = 3        # a Ray task whose node died runs again elsewhere, at most this often
ACTOR_REPLACEMENTS = 3  # a sandbox actor that died is replaced at most this often per call
GATHER_S = 0.002        # how long an actor's next call waits for its other leased sandboxes' calls
WIRE_CONNECT_S = 5.0    # a direct channel to an actor not open by then: its calls go through Ray
WIRE_TIMEOUT_S = 300.0  # a batch on a direct channel unanswered by then: its actor is taken for dead
WIRE_MAX = 256 << 20    # most bytes of one message on a direct channel


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
    """A Ray actor holding ``slots`` warm sandboxes (a local ``SandboxPool``, whose thread starts
    them and starts a replacement when one dies), each slot with the env loaded and an instance
    made. ``run`` takes the calls of several slots at once: one actor call per batch, not per
    step, and the slots' sandboxes work in parallel (their requests sent together, then the
    replies read: no thread per sandbox)."""

    def __init__(self, source: str, backend: str, limits: Limits | None, hash_seed: int,
                 slots: int = 1):
        self.pool = SandboxPool(source, size=slots, backend=backend, limits=limits,
                                hash_seed=hash_seed)
        self.leases: list[Lease | None] = [None] * slots
        self._lock = threading.Lock()  # one batch at a time, whichever way it came
        self._token = b""
        if _process_name(os.getppid()) == "raylet":  # (a worker started some other way: not watched)
            threading.Thread(target=_die_with_parent, args=(os.getppid(),), name="envforge-watch",
                             daemon=True).start()

    def serve(self) -> tuple[str, int, str]:
        """Open a direct channel to ``run`` and return ``(host, port, token)``: a TCP listener on
        this node's address whose connections must first send the token (drawn here, handed out
        only through Ray), then batches, each answered in turn (``_frame``: a length, then
        JSON). A Ray actor call costs about a millisecond, a message on a warm TCP connection a
        tenth of that: the steps of a lane go this way, Ray keeps placement, death and replay."""
        import ray
        self._token = secrets.token_hex(32).encode()
        server = socket.create_server((ray.util.get_node_ip_address(), 0))
        threading.Thread(target=self._accept, args=(server,), name="envforge-wire", daemon=True).start()
        return server.getsockname()[0], server.getsockname()[1], self._token.decode()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the caller is connected
                return
            threading.Thread(target=self._talk, args=(conn, server), name="envforge-wire-conn",
                             daemon=True).start()

    def _talk(self, conn: socket.socket, server: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(WIRE_CONNECT_S)  # the token comes at once, or the peer is not ours
                if not hmac.compare_digest(_read_exact(conn, len(self._token)), self._token):
                    return
                _shut(server)  # one caller: no one else gets to knock (a broken channel is
                # the actor's end: it is replaced, with a listener of its own)
                conn.settimeout(None)  # then the caller's pace: it closes when its pool does
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                while True:
                    conn.sendall(_frame(self.run(_unframe(conn))))
            except (OSError, ValueError):  # the caller went, or sent what is not a batch
                return

    def run(self, batch: list[tuple[int, list[tuple[str, Any]]]]) -> list[list[tuple]]:
        """For each (slot, calls) of ``batch``, its calls in order: a list of ("ok", value) or
        ("error", failure) per call. The slots' n-th calls go out together (the pool's
        ``call_all``): their sandboxes work in parallel."""
        with self._lock:
            return self._run(batch)

    def _run(self, batch: list) -> list[list[tuple]]:
        answers: list[list[tuple]] = [[] for _ in batch]
        for n in range(max((len(calls) for _, calls in batch), default=0)):
            sent = []
            for i, (slot, calls) in enumerate(batch):
                if n >= len(calls):
                    continue
                op, arg = calls[n]
                try:
                    lease = self._lease(slot)
                except EnvforgeError as e:
                    answers[i].append(("error", _failure(e)))
                    continue
                if op == "ready":
                    answers[i].append(("ok", {"meta": lease.meta, "node": node_id(),
                                              "warning": self._warning()}))
                else:
                    sent.append((i, (lease, op, arg)))
            results = self.pool.call_all([call for _, call in sent])
            for (i, _), result in zip(sent, results):
                answers[i].append(("error", _failure(result)) if isinstance(result, EnvforgeError)
                                  else ("ok", result))
        return answers

    def _warning(self) -> str | None:
        """What this node's backend warns of (``Backend.warning``); a backend of someone else's
        that raises must not break "ready": its failure is the warning."""
        try:
            return self.pool.backend.warning()
        except Exception as e:
            return f"the {self.pool.backend.name!r} backend could not say how it contains env code: {e!r}"

    def _lease(self, slot: int) -> Lease:
        """The slot's sandbox (a fresh one from the pool when it died)."""
        lease = self.leases[slot]
        if lease is None or lease.sandbox.closed:
            if lease is not None:
                lease.release()
            try:
                lease = self.leases[slot] = self.pool.acquire(timeout=120)
            except TimeoutError as e:
                raise SandboxUnavailable(str(e)) from None
        return lease


def _shut(sock: socket.socket) -> None:
    """Close a socket, waking the thread blocked in its accept or recv (close alone would not)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # not Linux, or gone
        return ""


def _die_with_parent(parent: int) -> None:
    """Exit when the process that started this one (a Ray worker's raylet) is gone: its node is
    lost, Ray's calls to this actor fail, and so must its direct channel, or the caller would
    go on with an actor the cluster has given up (and replaced, or not)."""
    while os.getppid() == parent:
        time.sleep(0.1)
    os._exit(1)


def _frame(value: Any) -> bytes:
    data = json.dumps(value, separators=(",", ":")).encode()
    return struct.pack(">I", len(data)) + data


def _read_exact(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = conn.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError("the other end closed the channel")
        out += chunk
    return bytes(out)


def _unframe(conn: socket.socket) -> Any:
    (n,) = struct.unpack(">I", _read_exact(conn, 4))
    if n > WIRE_MAX:
        raise ValueError(f"a message of {n} bytes on the channel (at most {WIRE_MAX})")
    return json.loads(_read_exact(conn, n))


class _Request:
    """One sandbox call waiting for its batch; ``whole``: sent with all the calls its caller had
    for this actor (``RayPool.call_all``), so the batch need not wait for more."""

    def __init__(self, slot: int, op: str, arg: Any, whole: bool = False):
        self.slot, self.op, self.arg, self.whole = slot, op, arg, whole
        self.result: tuple | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()


class RemoteActor:
    """The caller's side of one ``SandboxActor``: the calls that threads make to its sandboxes
    while a batch is out are queued, and sent together as the next batch (run_episodes steps a
    whole lane at once: one actor call per actor, not per episode). It keeps each slot's
    episode so far (the reset and the steps that succeeded): when the actor dies (its node was
    lost), a new one is started and every slot's episode replayed into it (the same resets, the
    same actions: envs are deterministic, the gate checks it) before the batch is sent again,
    so the episodes go on as if nothing happened. A replay that answers otherwise than the
    episode did (an env that is not deterministic after all) loses that episode: its calls fail
    with SandboxCrashed until its next reset, never go on from a different state."""

    def __init__(self, pool: "RayPool", slots: int, node: str | None = None):
        self.pool, self.slots = pool, slots
        self.actor = pool._spawn(slots, node)
        # per slot, its episode so far: (op, arg, a digest of what the call answered)
        self.episodes: list[list[tuple[str, Any, str]]] = [[] for _ in range(slots)]
        self.diverged: set[int] = set()  # slots whose replay answered otherwise
        self.nodes: list[str | None] = [None] * slots
        self.metas: list[dict] = [{}] * slots
        self.dead = False
        self.wire: socket.socket | None = None  # the direct channel to the actor (``connect``)
        self.address: tuple[str, int] | None = None  # where its actor listens for one
        self.leased = 0  # how many of its sandboxes are lent out (RayPool keeps the count)
        self._queue: list[_Request] = []
        self._cond = threading.Condition()
        self._ready = self.actor.run.remote([(i, [("ready", None)]) for i in range(slots)])
        self._thread = threading.Thread(target=self._dispatch, name="envforge-ray-actor",
                                        daemon=True)

    def ready(self) -> None:
        """Wait for the actor's sandboxes (started in parallel with the other actors')."""
        try:
            self._took(self._get(self._ready))
        except _ActorDied:
            self._send([])  # the actor died starting: replaced (and asked again) by _send
        for slot in range(self.slots):
            status, value = self._readiness[slot]
            if status == "error":
                _raise(value)
        self.connect()
        self._thread.start()

    def connect(self) -> None:
        """Open the direct channel to the actor (``SandboxActor.serve``), when the pool wants
        one; one that cannot be opened (a port the network between the nodes blocks) leaves the
        calls on Ray, slower and as right."""
        if not self.pool.direct:
            return
        try:
            host, port, token = self._get(self.actor.serve.remote())
            self.address = (host, port)
            conn = socket.create_connection((host, port), timeout=WIRE_CONNECT_S)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            conn.sendall(token.encode())
            conn.settimeout(WIRE_TIMEOUT_S)
        except (OSError, ValueError) as e:
            self.pool._no_wire(str(e))
            return
        self.wire = conn
        with self.pool._lock:
            self.pool.wires += 1

    def close_wire(self) -> None:
        wire, self.wire = self.wire, None
        if wire is not None:
            _shut(wire)  # wakes a dispatcher blocked reading it

    def _took(self, answers: list[list[tuple]]) -> None:
        """Each slot's answer to "ready" (its first call in a batch): its meta and node, and
        what its backend warns of (said here: the actor's stderr goes to a worker's log)."""
        self._readiness = [results[0] for results in answers]
        for slot, (status, value) in enumerate(self._readiness):
            if status == "ok":
                self.metas[slot], self.nodes[slot] = value["meta"], value["node"]
                self.pool._placed(value["node"], value.get("warning"))

    def call(self, slot: int, op: str, arg: Any) -> Any:
        request = _Request(slot, op, arg)
        self.submit([request])
        return self.answer(request)

    def submit(self, requests: list["_Request"]) -> None:
        """Queue calls for the next batch (a dead actor: each fails with SandboxUnavailable)."""
        with self._cond:
            if not self.dead:
                self._queue += requests
                self._cond.notify()
                return
        for r in requests:
            r.error = SandboxUnavailable("this sandbox's actor is gone")
            r.done.set()

    @staticmethod
    def answer(request: "_Request") -> Any:
        """Wait for a queued call; its value, or its error raised."""
        request.done.wait()
        if request.error is not None:
            raise request.error
        status, value = request.result
        if status == "error":
            _raise(value)
        return value

    def _dispatch(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self.dead:
                    self._cond.wait()
                # the other leased sandboxes' calls are likely on their way (a lane steps at
                # once): wait for them a moment, to send them in the same actor call
                deadline = time.monotonic() + GATHER_S
                while (0 < len(self._queue) < self.leased and not self.dead
                       and not any(r.whole for r in self._queue)
                       and self._cond.wait(max(0.0, deadline - time.monotonic()))):
                    pass
                batch, self._queue = self._queue, []
            if not batch:
                return
            try:
                if self.dead:
                    raise SandboxUnavailable("this sandbox's actor is gone")
                answers = self._send([(r.slot, [(r.op, r.arg)]) for r in batch])
                self.pool._sent(len(batch))
                for r, results in zip(batch, answers):
                    r.result = results[0]
                    if r.slot in self.diverged:
                        if r.op == "reset":
                            self.diverged.discard(r.slot)
                        elif r.op == "step":
                            r.result = ("error", ("SandboxCrashed", DIVERGED))
                    self._record(r)
            except BaseException as e:  # noqa: BLE001 (handed to the waiting callers)
                for r in batch:
                    r.error = e
            for r in batch:
                r.done.set()

    def _record(self, r: _Request) -> None:
        """Keep the slot's episode so far (only this thread touches it)."""
        ok = r.result[0] == "ok"
        if r.op == "reset":
            self.episodes[r.slot] = [("reset", r.arg, _digest(r.result))] if ok else []
        elif r.op == "step" and ok:
            self.episodes[r.slot].append(("step", r.arg, _digest(r.result)))

    def _send(self, batch: list) -> list[list[tuple]]:
        for attempt in range(ACTOR_REPLACEMENTS + 1):
            try:
                if attempt:
                    self._replace()
                wire = self.wire  # (kill may close it under us: the read below then fails)
                if wire is not None:
                    return self._over_wire(wire, batch)
                return self._get(self.actor.run.remote(batch))
            except _ActorDied as e:
                if attempt == ACTOR_REPLACEMENTS or self.pool.closed:
                    self.dead = True
                    raise ClusterError(f"a sandbox actor died {attempt + 1} times in a row (its "
                                       f"node lost?): {e}") from None
        raise AssertionError("unreachable")

    def _over_wire(self, wire: socket.socket, batch: list) -> list[list[tuple]]:
        """``run(batch)`` over the direct channel ``wire``. A channel that breaks or stays silent
        for ``WIRE_TIMEOUT_S`` is the actor's death (a node lost closes its connections): the
        actor is replaced like one whose Ray call failed."""
        try:
            wire.sendall(_frame(batch))
            answers = _unframe(wire)
        except (OSError, ValueError) as e:
            self.close_wire()
            raise _ActorDied(f"its direct channel broke: {e}") from None
        with self.pool._lock:
            self.pool.wire_calls += 1
        return answers

    def _get(self, ref: Any) -> Any:
        ray = _ray()
        try:
            return ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError) as e:
            raise _ActorDied(str(e).splitlines()[0][:300]) from None  # its node died
        except ray.exceptions.RayError as e:  # the cluster itself (its head) failed
            self.dead = True
            raise ClusterError(f"the Ray cluster failed during a sandbox call: "
                               f"{str(e).splitlines()[0][:300]}") from None

    def _replace(self) -> None:
        """A new actor, each slot brought to where its episode was."""
        self.kill(stop=False)
        self.actor = self.pool._spawn(self.slots, replacing=True)
        answers = self._get(self.actor.run.remote(
            [(i, [("ready", None)] + [(op, arg) for op, arg, _ in self.episodes[i]])
             for i in range(self.slots)]))
        self._took(answers)
        for i, results in enumerate(answers):
            if [_digest(r) for r in results[1:]] != [d for _, _, d in self.episodes[i]]:
                self.diverged.add(i)
                self.episodes[i] = []
        self.connect()

    def kill(self, stop: bool = True) -> None:
        if stop:
            with self._cond:
                self.dead = True
                self._cond.notify_all()
        self.close_wire()
        try:
            _ray().kill(self.actor)
        except Exception:  # the actor or the cluster is gone already
            pass


class _ActorDied(Exception):
    pass


DIVERGED = ("the env answered otherwise when its episode was replayed on a new actor (its node "
            "was lost): it is not deterministic, and this episode is lost; call reset()")


def _digest(result: Any) -> str:
    return hashlib.sha256(json.dumps(result, sort_keys=True, default=repr).encode()).hexdigest()


class RemoteSandbox:
    """One slot of a ``RemoteActor``, shaped as a ``sandbox.base.Sandbox`` as far as
    ``SandboxEnv`` and ``Lease`` use one: ``reset``/``step``/``solve``, ``meta``, ``closed``,
    ``kill``."""

    def __init__(self, actor: RemoteActor, slot: int):
        self.actor, self.slot = actor, slot

    @property
    def meta(self) -> dict:
        return self.actor.metas[self.slot]

    @property
    def node(self) -> str | None:
        return self.actor.nodes[self.slot]

    @property
    def closed(self) -> bool:
        return self.actor.dead

    def reset(self, instance: int, seed: int) -> list:
        return self.actor.call(self.slot, "reset", seed)

    def step(self, instance: int, action: Any) -> list:
        return self.actor.call(self.slot, "step", action)

    def solve(self, instance: int, seed: int) -> list:
        return self.actor.call(self.slot, "solve", seed)

    def lent(self, change: int) -> None:
        with self.actor._cond:
            self.actor.leased += change

    def kill(self) -> None:
        self.actor.kill()


class RayPool:
    """``size`` sandboxes in Ray actors over the cluster's nodes, one actor per live node (up to
    ``size``) hosting its share of the sandboxes, with the lease API of
    ``sandbox.pool.SandboxPool`` (``acquire``, ``release``, ``wait_warm``, ``close``). The
    steps that several leases of one actor send at once travel as one actor call
    (``RemoteActor``). ``nodes`` counts the sandboxes' placements per node (replacements
    included); ``warnings`` holds, per node, what its backend warns of (a weak containment,
    said on this process's stderr once per node and process: the actors' own stderr goes to the
    workers' logs); ``started`` and ``replaced`` count actors; ``actor_calls`` the batches sent
    and ``sandbox_calls`` the resets, steps and solves in them."""

    def __init__(self, source: str, size: int = 4, backend: str = "auto",
                 limits: Limits | None = None, hash_seed: int = 0, filename: str = "env.py",
                 direct: bool = True):
        if size < 1:
            raise UsageError(f"a pool needs at least one sandbox, got size={size}")
        ray = _ray()
        self.source, self.size, self.filename, self.backend = source, size, filename, backend
        self.direct = direct  # the steps over a direct channel to each actor (else Ray calls)
        self.unwired: list[str] = []  # why a direct channel could not be opened, per try
        self.wires = self.wire_calls = 0  # the channels opened, and the batches sent over them
        self.limits, self.hash_seed = limits or Limits(), hash_seed
        self.started = self.replaced = 0
        self.actor_calls = self.sandbox_calls = 0  # the calls sent, and the sandbox calls in them
        self.nodes: dict[str, int] = {}
        self.warnings: dict[str, str] = {}  # per node, what its sandboxes' backend warns of
        self.closed = False
        self._lock = threading.Lock()
        self._actor = ray.remote(SandboxActor)
        self._idle: queue.Queue[Lease] = queue.Queue()
        live = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
        count = max(1, min(size, len(live)))
        self.actors = [RemoteActor(self, size // count + (i < size % count),
                                   live[i] if i < len(live) else None) for i in range(count)]
        # the leases take turns over the actors: a wave smaller than the pool spans the nodes
        self._all = [Lease(self, RemoteSandbox(a, slot), 0)  # type: ignore[arg-type]
                     for slot in range(self.actors[0].slots) for a in self.actors if slot < a.slots]
        try:
            for a in self.actors:
                a.ready()
            for lease in self._all:
                self._idle.put(lease)
        except BaseException:
            self.close()
            raise

    def _spawn(self, slots: int, node: str | None = None, replacing: bool = False) -> Any:
        """A new actor of ``slots`` sandboxes: on ``node`` (one that was alive: should it die
        first, the actor is replaced like any other), else where Ray spreads it."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        with self._lock:
            self.started += 1
            self.replaced += replacing
        where = NodeAffinitySchedulingStrategy(node, soft=False) if node else "SPREAD"
        return self._actor.options(num_cpus=0, max_restarts=0, scheduling_strategy=where).remote(
            self.source, self.backend, self.limits, self.hash_seed, slots)

    def _sent(self, calls: int) -> None:
        with self._lock:
            self.actor_calls += 1
            self.sandbox_calls += calls

    def _no_wire(self, why: str) -> None:
        with self._lock:
            first = not self.unwired
            self.unwired.append(why)
        if first:
            print(f"envforge: no direct channel to a sandbox actor ({why}); its env steps go "
                  "through Ray's calls, slower", file=sys.stderr)

    @property
    def wired(self) -> int:
        """How many of the actors take their steps over a direct channel."""
        return sum(a.wire is not None for a in self.actors)

    def _placed(self, node: str, warning: str | None = None) -> None:
        with self._lock:
            self.nodes[node] = self.nodes.get(node, 0) + 1
            if warning:
                self.warnings[node] = warning
        if warning:
            warn_once(f"on Ray node {node[:12]}: {warning}")

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
        lease.sandbox.lent(+1)
        return lease

    def release(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        lease.sandbox.lent(-1)
        if self.closed:
            return
        if lease.sandbox.closed:  # its actors kept dying: a fresh actor for this sandbox
            actor = RemoteActor(self, 1)
            actor.ready()
            lease = Lease(self, RemoteSandbox(actor, 0), 0)  # type: ignore[arg-type]
            with self._lock:
                self.actors.append(actor)
                self._all.append(lease)
        self._idle.put(lease)

    def call_all(self, calls: list[tuple[Lease, str, Any]]) -> list:
        """Several leases' calls at once, each ``(lease, op, arg)`` as for
        ``SandboxPool.call_all``: one actor call per actor, the actors' calls in flight together.
        Returns, per call, its value or the ``EnvforgeError`` it raised. At most one call per
        lease."""
        if len({id(lease) for lease, _, _ in calls}) < len(calls):
            raise ValueError("call_all: at most one call per lease")
        requests = [(lease.sandbox.actor, _Request(lease.sandbox.slot, op, arg, whole=True))
                    for lease, op, arg in calls]
        by_actor: dict = {}
        for actor, request in requests:
            by_actor.setdefault(actor, []).append(request)
        for actor, batch in by_actor.items():
            actor.submit(batch)
        out: list = []
        for actor, request in requests:
            try:
                out.append(actor.answer(request))
            except EnvforgeError as e:
                out.append(e)
        return out

    def wait_warm(self, timeout: float = 60.0) -> None:
        """The actors are warm once the pool is made (the constructor waits)."""

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for actor in getattr(self, "actors", []):
            actor.kill()

    def __enter__(self) -> "RayPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"RayPool(size={self.size}, backend={self.backend!r}, actors={len(self.actors)}, "
                f"started={self.started}, replaced={self.replaced}, nodes={len(self.nodes)}, wired={self.wired}, "
                f"calls={self.sandbox_calls} in {self.actor_calls})")
