"""Generated envs as Gymnasium environments, each running in a sandbox.

    import envforge
    env = envforge.make("helpdesk_precondition_verification", backend="docker")
    obs, info = env.reset(seed=7)            # obs = {"messages": [system, user, ...]}
    obs, reward, terminated, truncated, info = env.step(
        {"role": "assistant", "content": None, "tool_calls": [...]})
    env.close()

After ``import envforge.gym`` every env folder in ``generated_envs/`` that the gate has not
rejected is registered as ``envforge/<slug>``, so ``gymnasium.make("envforge/<slug>")`` works
(without the import: ``gymnasium.make("envforge.gym:envforge/<slug>")``). The env's code never
runs in this process: ``SandboxEnv`` speaks to it in a sandbox (``backend``: "auto", "process",
"docker") or in a warm ``SandboxPool``.

Spaces. Observations and actions are the contract's JSON chat messages (ENV_CONTRACT.md), so
the spaces are two small custom ``gymnasium.Space`` classes over plain dicts: ``Observations``
holds ``{"messages": [message, ...]}`` and ``AssistantMessages`` holds one assistant message
(``sample()`` draws text or a call of one of the env's tools). ``spaces.Text`` was not chosen: it
holds one flat string over a fixed character set, so the messages would travel as JSON text
and the tool calls' structure would be invisible to the space. ``contains`` checks shape (roles,
content types), not that tool arguments fit the schemas: a wrong call is a legal action, which
the env answers with an error message.

What ``make`` checks before any env code runs (``unsafe_skip_gate=True`` skips both):
- a ``report.json`` beside ``env.py`` must not say "reject" (``envforge audit`` writes it);
- the gate's static audit (no code runs; about 20 ms) must find no error, which also catches an
  ``env.py`` edited after its report was written.
It does not run the gate's dynamic checks (seconds per env): run ``envforge audit`` for those.
Either way the sandbox is the isolation boundary.

Errors are per episode (a bad rollout is data): the env's own exception raises
``EnvCallError`` (the sandbox lives on); a sandbox that died, hung or broke a limit raises
``SandboxTimeout`` / ``SandboxCrashed`` / ``SandboxProtocolError``, the episode is over, and the
next ``reset`` gets a fresh sandbox. Nothing outlives ``close()``.

Threads: a process sandbox dies with the thread that started it (PR_SET_PDEATHSIG), so make an
env in the thread that steps it, or lease its sandboxes from a pool (``make_pool``), whose own
thread starts them.

Many envs of one pool step together with ``step_all(envs, actions)``: the requests go out at
once and the sandboxes work in parallel (one actor call per actor for a Ray pool), with no
thread per env; each env gets its result or its error, as ``step`` would give it.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
from pathlib import Path
from typing import Any, NoReturn, Sequence

import gymnasium

from envforge.contract import (DEFAULT_MAX_TURNS, MAX_TURNS_LIMIT, Limits, assistant,
                               message_problem, mix_seed, tool_call)
from envforge.errors import (ActionError, EnvCallError, EnvforgeError, InputError, SandboxCrashed,
                             SandboxError, SandboxProtocolError, UsageError)
from envforge.gate import resolve_env
from envforge.gate.static import audit_static
from sandbox.base import Backend, get_backend
from sandbox.pool import SandboxPool

NAMESPACE = "envforge"
_SLUG = re.compile(r"^[\w.]+$")


# --------------------------------------------------------------------------- spaces

class Observations(gymnasium.Space):
    """``{"messages": [message, ...]}``: what ``reset`` and ``step`` return."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return (isinstance(x, dict) and isinstance(x.get("messages"), list)
                and all(message_problem(m) is None for m in x["messages"]))

    def sample(self, mask: Any = None, probability: Any = None) -> dict:
        return {"messages": [{"role": "user", "content": "hello"}]}

    def __repr__(self) -> str:
        return "Observations()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Observations)


class AssistantMessages(gymnasium.Space):
    """One assistant message: the action. ``sample()`` draws text, or a call of one of
    ``tools`` with arguments that are JSON but not necessarily schema-valid."""

    WORDS = ("hello", "order", "ticket", "please", "confirm", "id", "42", "yes", "no")

    def __init__(self, tools: list | None = None, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.tool_names = sorted({t["function"]["name"] for t in tools or []
                                  if isinstance(t, dict) and isinstance(t.get("function"), dict)
                                  and isinstance(t["function"].get("name"), str)})

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return message_problem(x) is None and x.get("role") == "assistant"

    def sample(self, mask: Any = None, probability: Any = None) -> dict:
        rng = self.np_random
        text = " ".join(rng.choice(self.WORDS, size=int(rng.integers(1, 6))).tolist())
        if self.tool_names and rng.random() < 0.5:
            name = self.tool_names[int(rng.integers(len(self.tool_names)))]
            return assistant(None, [tool_call(name, {"text": text}, f"call_{int(rng.integers(10**6))}")])
        return assistant(text)

    def __repr__(self) -> str:
        return f"AssistantMessages(tools={self.tool_names})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AssistantMessages) and other.tool_names == self.tool_names


# --------------------------------------------------------------------------- finding envs

def env_roots() -> list[Path]:
    """Where slugs are looked up: $ENVFORGE_ENVS (os.pathsep-separated), ./generated_envs, and
    the generated_envs/ beside this package (a source checkout)."""
    roots = [Path(p) for p in os.environ.get("ENVFORGE_ENVS", "").split(os.pathsep) if p]
    roots += [Path("generated_envs"), Path(__file__).resolve().parent.parent / "generated_envs"]
    out: list[Path] = []
    for r in roots:
        if r.is_dir() and r.resolve() not in [o.resolve() for o in out]:
            out.append(r)
    return out


def resolve(path_or_slug: str | Path) -> Path:
    """The env.py of an env folder, an env.py file, or a slug in ``env_roots()``."""
    p = Path(path_or_slug)
    if p.exists():
        return resolve_env(p)
    for root in env_roots():
        if (root / str(path_or_slug) / "env.py").is_file():
            return root / str(path_or_slug) / "env.py"
    looked = ", ".join(str(r) for r in env_roots()) or "no generated_envs/ folder found"
    raise UsageError(f"no env {str(path_or_slug)!r}: not a path, and no folder of that name "
                     f"with an env.py in {looked} (set ENVFORGE_ENVS to add folders)")


def _verdict(folder: Path) -> str | None:
    try:
        return json.loads((folder / "report.json").read_text(encoding="utf-8")).get("verdict")
    except (OSError, ValueError, AttributeError):
        return None


def gate_check(env_file: Path) -> str:
    """The source of ``env_file`` if make() may run it (see the module docstring), else
    ``InputError`` saying why and what to do."""
    raw = env_file.read_bytes()
    if _verdict(env_file.parent) == "reject":
        report = json.loads((env_file.parent / "report.json").read_text(encoding="utf-8"))
        first = [f"{f.get('check')}: {f.get('message')}" for f in report.get("findings", [])
                 if f.get("severity") == "error"][:2]
        raise InputError(f"{env_file.parent} was rejected by the gate (report.json): "
                         f"{'; '.join(first)[:400].rstrip('.')}. Fix the env (or synthesize it "
                         f"again) and re-run `envforge audit {env_file.parent}`")
    findings = audit_static(raw, filename=env_file.name).findings  # thread-safe: see PARSE_LOCK
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise InputError(f"{env_file} fails the gate's static audit ({len(errors)} errors; first: "
                         f"{errors[0].check}: {errors[0].message[:300].rstrip('.')}). Run "
                         f"`envforge audit {env_file.parent}` to see every finding")
    return raw.decode("utf-8")


# --------------------------------------------------------------------------- the env

class SandboxEnv(gymnasium.Env):
    """A generated env, running in a sandbox, as a ``gymnasium.Env``; see the module docstring.

    ``reset(seed=None, options=None) -> (observation, info)``: a new episode. With ``seed=None``
    the env's seed is drawn from ``self.np_random`` (seeded by the last explicit seed), as
    Gymnasium does, from the mix the gate audits and envforge's training draws from
    (``contract.mix_seed``): an env cannot tell such a seed from the audit's. ``options`` is
    accepted and unused.

    ``step(action) -> (observation, reward, terminated, truncated, info)``: ``action`` is one
    assistant message; ``observation`` holds only the new messages (tool results, the user's
    reply); ``reward`` is a float in [0, 1] (the episode's score is the sum). ``terminated``:
    the env reached an end state (task done, user left, an irreversible wrong action).
    ``truncated``: ``max_turns`` steps were taken without that; the host enforces it too.
    Stepping after either raises ``UsageError``: call ``reset``.
    """

    metadata = {"render_modes": []}

    def __init__(self, source: str, backend: str | Backend = "auto", limits: Limits | None = None,
                 pool: Any = None, filename: str = "env.py", hash_seed: int = 0):
        self.source, self.filename, self.hash_seed = source, filename, hash_seed
        self.limits = limits or (pool.limits if pool is not None else Limits())
        self.pool = pool
        self.backend = pool.backend if pool is not None else get_backend(backend)
        self._sandbox = self._lease = None
        self._instance = 0
        self._turns, self._live = 0, False
        meta = self._connect()
        mt = meta.get("max_turns")
        self.max_turns = mt if isinstance(mt, int) and 1 <= mt <= MAX_TURNS_LIMIT else DEFAULT_MAX_TURNS
        self.capability, self.skills = meta.get("capability"), meta.get("skills")
        self.tools = meta.get("tools") or []
        self.observation_space = Observations()
        self.action_space = AssistantMessages(self.tools)

    def _connect(self) -> dict:
        """A live sandbox with the env loaded and an instance made; returns the env's meta."""
        if self.pool is not None:
            self._lease = self.pool.acquire()
            self._sandbox, self._instance = self._lease.sandbox, self._lease.instance
            return self._lease.meta
        sandbox = self.backend.start(self.limits, hash_seed=self.hash_seed)
        try:
            meta = sandbox.load(self.source, filename=self.filename)
            self._instance = sandbox.new()
        except BaseException:
            sandbox.kill()
            raise
        self._sandbox = sandbox
        return meta

    def _drop(self) -> None:
        """Let go of the sandbox (a dead one is replaced on the next reset)."""
        if self._lease is not None:
            self._lease.release()
        elif self._sandbox is not None:
            self._sandbox.kill()
        self._sandbox = self._lease = None

    def _call(self, op: str, arg: Any) -> list:
        if self._sandbox is None or self._sandbox.closed:
            self._drop()
            self._connect()
        try:
            return getattr(self._sandbox, op)(self._instance, arg)
        except (EnvCallError, SandboxError) as e:
            self._failed(e)
            raise

    def _failed(self, e: EnvforgeError) -> None:
        """A call failed: the episode is over; a sandbox that broke (or is gone) is let go."""
        self._live = False
        if isinstance(e, SandboxError):
            self._drop()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        env_seed = seed if seed is not None else self._drawn_seed()
        self._live = False
        result = self._call("reset", env_seed)
        if not isinstance(result, list) or len(result) != 2:  # the runner checks; a forged reply
            self._forged("reset", "(observation, info)")
        self._check_reply("reset", *result)
        self._turns, self._live = 0, True
        return result[0], result[1]

    def _drawn_seed(self) -> int:
        """An env seed of the audit's mix, from ``np_random``."""
        quarter, key = (int(self.np_random.integers(n)) for n in (4, 2**63))
        return mix_seed(random.Random(key), quarter)

    def step(self, action: dict) -> tuple[dict, float, bool, bool, dict]:
        self._check_step(action)
        return self._stepped(self._call("step", action))

    def _check_step(self, action: dict) -> None:
        if not self._live:
            raise UsageError("step() before reset(), or after the episode ended (terminated, "
                             "truncated, or an error): call reset()")
        if self._sandbox is None or self._sandbox.closed:  # killed mid-episode (Ctrl-C, close)
            self._live = False
            self._drop()
            raise SandboxCrashed("the episode's sandbox was killed mid-episode: call reset()")
        problem = message_problem(action)
        if problem or action["role"] != "assistant":
            raise ActionError(f"step(action): the action must be an assistant message, e.g. "
                              f"{{'role': 'assistant', 'content': 'Hello'}} or one with tool_calls; "
                              f"{problem or 'got role ' + repr(action['role'])}")

    def _stepped(self, result: Any) -> tuple[dict, float, bool, bool, dict]:
        """The host's checks and turn count on what the env's step returned."""
        if not isinstance(result, list) or len(result) != 5:  # the runner checks; a forged reply
            self._forged("step", "(observation, reward, terminated, truncated, info)")
        obs, reward, terminated, truncated, info = result
        self._check_reply("step", obs, info)
        if (not isinstance(reward, (int, float)) or isinstance(reward, bool)
                or not isinstance(terminated, bool) or not isinstance(truncated, bool)
                or not _finite(reward)):
            self._live = False
            raise EnvCallError("contract", "", f"step returned reward {str(reward)[:40]}, terminated "
                               f"{terminated!r}, truncated {truncated!r}: want a finite float and "
                               "two bools")
        self._turns += 1
        if self._turns >= self.max_turns and not terminated:
            truncated = True
        self._live = not (terminated or truncated)
        return obs, float(reward), terminated, truncated, info

    def _forged(self, op: str, what: str) -> NoReturn:
        err = SandboxProtocolError(f"{op}: the sandbox answered something other than {what}; "
                                   "it was killed")
        self._sandbox.kill()
        self._failed(err)
        raise err

    def _check_reply(self, op: str, obs: Any, info: Any) -> None:
        """The contract's observation and info, checked here on the host: the gate's probes
        check them too, but an env may break them only where no probe went, and a trainer must
        get an error it catches (``EnvCallError``, the episode ends), not a value it crashes on."""
        if not (isinstance(obs, dict) and isinstance(obs.get("messages"), list)):
            problem = f"an observation that is not {{'messages': [...]}} but a {type(obs).__name__}"
        else:
            problem = next((f"an observation with a message that is not one ({p})" for p in
                            map(message_problem, obs["messages"]) if p), None)
        if problem is None and not isinstance(info, dict):
            problem = f"info that is not a dict but a {type(info).__name__}"
        if problem:
            self._live = False
            raise EnvCallError("contract", "", f"{op} returned {problem}")

    def solve(self, seed: int) -> list:
        """The env's reference solution for ``seed`` (for evaluation, never for a policy)."""
        return self._call("solve", seed)

    def close(self) -> None:
        self._live = False
        self._drop()
        super().close()

    def __del__(self) -> None:
        try:
            self._drop()
        except Exception:
            pass


def _finite(x: int | float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def step_all(envs: Sequence[SandboxEnv], actions: Sequence[dict]) -> list:
    """``env.step(action)`` for each pair, the steps sent together when the envs are leased from
    one pool that can (its ``call_all``): their sandboxes work in parallel, and a ``RayPool``
    sends one actor call per actor, not one per env. Returns, per env, its step's result or the
    ``EnvforgeError`` that ``step`` would have raised (wrapped envs are stepped unwrapped).
    Each step has its own time limit; after a slow one, the replies read late share a grace of
    ``sandbox.base.LATE_READ_S``. An interrupt (Ctrl-C) ends every episode that was stepped."""
    envs = [env.unwrapped for env in envs]
    out: list = [None] * len(envs)
    ready = []
    for i, (env, action) in enumerate(zip(envs, actions, strict=True)):
        try:
            env._check_step(action)
            ready.append(i)
        except EnvforgeError as e:
            out[i] = e
    pools = {id(envs[i].pool) for i in ready}
    pool = envs[ready[0]].pool if ready else None
    try:
        if len(pools) == 1 and hasattr(pool, "call_all"):
            answers = pool.call_all([(envs[i]._lease, "step", actions[i]) for i in ready])
        else:  # one after another
            answers = []
            for i in ready:
                try:
                    answers.append(envs[i]._sandbox.step(envs[i]._instance, actions[i]))
                except EnvforgeError as e:
                    answers.append(e)
    except BaseException:  # some replies read, some sandboxes killed: no episode is in step
        for i in ready:
            envs[i]._live = False
            if envs[i]._sandbox is not None and envs[i]._sandbox.closed:
                envs[i]._drop()
        raise
    for i, answer in zip(ready, answers):
        if isinstance(answer, EnvforgeError):
            if isinstance(answer, (EnvCallError, SandboxError)):  # as _call would
                envs[i]._failed(answer)
            out[i] = answer
            continue
        try:
            out[i] = envs[i]._stepped(answer)
        except EnvforgeError as e:
            out[i] = e
    return out


def make(path_or_slug: str | Path, backend: str | Backend = "auto", *, pool: Any = None,
         unsafe_skip_gate: bool = False, hash_seed: int = 0, **limits: Any) -> SandboxEnv:
    """A ``gymnasium.Env`` over the env at ``path_or_slug`` (an env folder, an env.py, or a slug
    of ``generated_envs/``), running in a sandbox of ``backend`` (or leased from ``pool``).

    ``limits``: fields of ``envforge.contract.Limits`` (call_timeout_s, memory_mb, cpu_s, ...).
    Refuses an env the gate rejected or whose static audit fails (``InputError``) unless
    ``unsafe_skip_gate=True``; see the module docstring. With ``pool``, the pool's source, backend,
    limits and hash_seed hold (its checks ran when it was made): ``path_or_slug`` must hold the
    source the pool runs, and ``limits`` are refused (``UsageError``).
    """
    env_file = resolve(path_or_slug)
    if pool is not None:
        if limits:
            raise UsageError(f"limits ({', '.join(sorted(limits))}) are the pool's: pass them to "
                             "make_pool, not to make(..., pool=)")
        if _read(env_file) != pool.source:
            raise UsageError(f"{env_file} is not the env this pool runs: make a pool of it "
                             "(make_pool), or call make without pool")
        return SandboxEnv(pool.source, pool=pool)
    source = _read(env_file) if unsafe_skip_gate else gate_check(env_file)
    return SandboxEnv(source, backend=backend, limits=limits_from(limits), hash_seed=hash_seed)


def _read(env_file: Path) -> str:
    return env_file.read_bytes().decode("utf-8")  # as gate_check reads it: newlines untouched


def limits_from(fields: dict) -> Limits:
    """``Limits`` from keyword fields (a clear error for an unknown one)."""
    try:
        return Limits(**fields)
    except TypeError as e:
        raise UsageError(f"{e}; limits are fields of envforge.contract.Limits") from None


def make_pool(path_or_slug: str | Path, size: int = 4, backend: str | Backend = "auto", *,
              unsafe_skip_gate: bool = False, hash_seed: int = 0, max_uses: int | None = None,
              **limits: Any):
    """A ``SandboxPool`` of ``size`` warm sandboxes running the env, after the same checks as
    ``make``; pass it to ``make(..., pool=pool)`` or lease from it directly."""
    return SandboxPool(checked_source(path_or_slug, unsafe_skip_gate), size=size, backend=backend,
                       limits=limits_from(limits), hash_seed=hash_seed, max_uses=max_uses)


def checked_source(path_or_slug: str | Path, unsafe_skip_gate: bool = False) -> str:
    """The source of the env at ``path_or_slug`` after ``make``'s checks (``gate_check``)."""
    env_file = resolve(path_or_slug)
    return _read(env_file) if unsafe_skip_gate else gate_check(env_file)


# --------------------------------------------------------------------------- registration

def _registered(path: str, render_mode: str | None = None, **kwargs: Any) -> SandboxEnv:
    return make(path, **kwargs)


def register_envs(roots: list[Path] | None = None) -> list[str]:
    """Register ``envforge/<slug>`` for every env folder in ``roots`` (default ``env_roots()``)
    whose report.json does not say reject; returns the ids. The first root wins a slug."""
    ids = []
    for root in env_roots() if roots is None else roots:
        for folder in sorted(Path(root).iterdir()):
            env_id = f"{NAMESPACE}/{folder.name}"
            if (not (folder / "env.py").is_file() or not _SLUG.match(folder.name)
                    or _verdict(folder) == "reject" or env_id in ids):
                continue
            gymnasium.register(id=env_id, entry_point=_registered,
                               kwargs={"path": str(folder.resolve())})
            ids.append(env_id)
    return ids


REGISTERED = register_envs()
