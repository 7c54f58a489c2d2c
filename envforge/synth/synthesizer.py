"""Synthesis's loop: per capability, write an env (template or LLM), have the gate audit it,
repair, and keep the files and the manifest; see the package's docstring (``envforge.synth``)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from envforge import __version__
from envforge.contract import Finding, Report, findings_from
from envforge.errors import EnvforgeError, InputError, UsageError
from envforge.executor import LocalExecutor
from envforge.gate.config import GateSettings
from envforge.llm import LLMClient, atomic_write, request_key, run_concurrently
from envforge.progress import Progress, Step, reporter
from envforge.synth.classify import Unsupported
from envforge.synth.config import SynthConfig
from envforge.synth.families import Family, match_family
from envforge.synth.llm import extract_code, prompt_messages, repair_message
from envforge.synth.templates import synthesize_template
from envforge.targets import EXAMPLES, Target, load_target
from envforge.trajectories import render

@dataclass
class CapabilitySpec:
    """A capability to synthesize: its name, description, failing example trajectories
    (rendered text, for the LLM) and example tasks (first user messages, for the router), as
    ``envforge identify`` reports them."""
    name: str
    description: str = ""
    examples: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)


@dataclass
class Attempt:
    """One attempt at a capability's env: the gate's verdict and findings on it."""
    n: int
    verdict: str
    findings: list[Finding]
    code_sha256: str | None = None
    usage: dict | None = None
    cached: bool | None = None

    def to_dict(self) -> dict:
        d = {"n": self.n, "verdict": self.verdict, "findings": [f.to_dict() for f in self.findings]}
        for k in ("code_sha256", "usage", "cached"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d


@dataclass
class SynthResult:
    capability: str
    slug: str | None
    path: str | None
    verdict: str                      # accept / reject / error
    attempts: list[Attempt] = field(default_factory=list)
    synthesizer: str | None = None
    error: str | None = None
    skipped: bool = False             # an accepted env with the same inputs was already there
    manifest: dict | None = None
    seconds: float = 0.0

    @property
    def accepted(self) -> bool:
        return self.verdict == "accept"

    def to_dict(self) -> dict:
        d = {"capability": self.capability, "slug": self.slug, "path": self.path,
             "verdict": self.verdict, "attempts": [a.to_dict() for a in self.attempts]}
        if self.error:
            d["error"] = self.error
        if self.skipped:
            d["skipped"] = True
        return d


# ============================================================================= inputs


def endpoint_configured() -> bool:
    return bool(os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_KEY"))


def resolve_synthesizer(config: SynthConfig, client: Any = None) -> str:
    """``template`` or ``openai`` for ``config.synthesizer`` (auto: openai when an endpoint and a
    model are configured). Raises UsageError when openai is asked for and cannot be used."""
    kind = config.synthesizer
    if kind == "auto":
        return "openai" if client is not None or (config.model and endpoint_configured()) else "template"
    if kind == "openai" and client is None and not (config.model and endpoint_configured()):
        missing = " and ".join(x for x, ok in (("an endpoint (OPENAI_BASE_URL, or OPENAI_API_KEY for "
                                                 "api.openai.com)", endpoint_configured()),
                                                ("a model (--model)", bool(config.model))) if not ok)
        raise UsageError(f"--llm openai needs {missing}: set OPENAI_BASE_URL (and OPENAI_API_KEY) and "
                         "pass --model, or use --llm template for the offline template synthesizer")
    return kind


def slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60] or "capability"


def target_short(target: Target) -> str:
    return slugify(Path(target.name).name)


def slug_for(capability: str, target: Target, family: Family | None) -> str:
    return f"{target_short(target)}_{family.slug if family else slugify(capability)}"


def load_capabilities(path: str | Path, retained_only: bool = True,
                      trajectories: Sequence[Any] | None = None, examples_per: int = 2) -> list[CapabilitySpec]:
    """The capabilities of a ``capabilities.json`` (``envforge identify``'s output), retained
    ones only by default, with the failing example trajectories identify rendered into it
    (``example_trajectories``). For a file of an older identify without them, ``trajectories``
    (loaded ones) supply them: the first failure (under the threshold the file records) of each
    task id the capability lists, which may be another file's task of the same id, or a trial
    that failed for another reason."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise InputError(f"{p}: not valid JSON ({e})") from None
    caps = data.get("capabilities") if isinstance(data, dict) else None
    if not isinstance(caps, list):
        raise InputError(f"{p}: expected {{\"capabilities\": [{{\"name\", \"description\", \"retained\", "
                         "...}]} as written by envforge identify")
    settings = data.get("settings")
    threshold = settings.get("success_threshold") if isinstance(settings, dict) else None
    by_task: dict[str, list] = {}
    for t in trajectories or []:
        if (t.reward < threshold) if isinstance(threshold, (int, float)) else not t.success:
            by_task.setdefault(str(t.task_id), []).append(t)
    out = []
    for i, c in enumerate(caps):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"].strip():
            raise InputError(f"{p}: capability #{i} has no name")
        if retained_only and not c.get("retained", False):
            continue
        examples = [e for e in c.get("example_trajectories") or [] if isinstance(e, str)]
        if not examples and by_task:
            for task in c.get("examples") or []:
                for t in by_task.get(str(task), [])[:1]:
                    examples.append(render(t))
                if len(examples) >= examples_per:
                    break
        tasks = [x for x in c.get("example_tasks") or [] if isinstance(x, str) and x.strip()]
        out.append(CapabilitySpec(c["name"].strip(), str(c.get("description") or ""),
                                  examples[:examples_per], tasks[:3]))
    return out


# ============================================================================= files


def _write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def existing_env(folder: Path) -> tuple[str, dict | None]:
    """What ``folder`` holds: ("none"|"accepted"|"rejected"|"unknown"|"foreign", its manifest).

    A folder ``synth`` wrote is accepted only when its manifest says so and env.py is still the
    code it audited; anything else it wrote (rejected, failed, interrupted) may be overwritten.
    A folder from elsewhere (a hand-written env) counts as accepted when its report.json says
    so, and as unknown (kept) when nothing says. One without env.py whose manifest.json is not
    synth's (an adapter's, say) is foreign (kept: writing there would replace that manifest)."""
    env = folder / "env.py"
    manifest = _read_json(folder / "manifest.json")
    manifest = manifest if isinstance(manifest, dict) else None
    ours = manifest is not None and manifest.get("synthesizer") in ("template", "openai") \
        and "attempts" in manifest
    if not env.exists():
        foreign = (folder / "manifest.json").exists() and not ours
        return ("foreign" if foreign else "none"), manifest
    if ours:
        code = env.read_text(encoding="utf-8", errors="replace")
        if manifest.get("code_sha256") and manifest["code_sha256"] != sha256(code):
            return "unknown", manifest  # edited by hand since: keep it
        return ("accepted" if manifest.get("verdict") == "accept" else "rejected"), manifest
    report = _read_json(folder / "report.json")
    verdict = report.get("verdict") if isinstance(report, dict) else None
    return {"accept": "accepted", "reject": "rejected"}.get(verdict, "unknown"), manifest


# ============================================================================= one capability


class _Run:
    """The state of one capability's synthesis: its folder, manifest and attempts."""

    def __init__(self, spec: CapabilitySpec, target: Target, target_spec: str, config: SynthConfig,
                 kind: str, family: Family | None, say: Callable[[str], None], executor: Any = None):
        self.spec, self.target, self.config, self.kind, self.family = spec, target, config, kind, family
        self.executor = executor or LocalExecutor()
        self.slug = slug_for(spec.name, target, family)
        self.folder = Path(config.out_dir) / self.slug
        self.say = say
        self.attempts: list[Attempt] = []
        self.started = time.perf_counter()
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        self.usage_reported = False
        self.calls = self.cache_hits = 0
        self.manifest: dict = {
            "capability": spec.name, "slug": self.slug,
            "description": spec.description or (f"the agent {family.description}" if family else ""),
            "family": family.slug if family else None,
            "examples": list(spec.tasks),  # identify's example tasks: the router shows them
            "target": target_spec, "target_name": target.name,
            "target_path": str(Path(target.path).resolve()) if target.path else None,
            "target_schema_hash": target.schema_hash(),
            "synthesizer": kind, "model": config.model if kind == "openai" else None,
            "prompt_sha256": None, "attempts": [], "verdict": None, "code_sha256": None,
            "envforge_version": __version__, "gate": {"seeds": config.seeds},
            "created": None, "seconds": None,
        }

    def result(self, verdict: str, error_text: str | None = None, skipped: bool = False) -> SynthResult:
        return SynthResult(self.spec.name, self.slug, str(self.folder), verdict, list(self.attempts),
                           self.kind, error_text, skipped, self.manifest, time.perf_counter() - self.started)

    def add_usage(self, usage: dict | None, cached: bool) -> None:
        if cached:
            self.cache_hits += 1
        else:
            self.calls += 1
        if usage:
            self.usage_reported = True
            for k in self.usage:
                self.usage[k] += int(usage.get(k) or 0)

    def save(self, verdict: str | None) -> None:
        m = self.manifest
        m["attempts"] = [a.to_dict() for a in self.attempts]
        m["verdict"] = verdict
        m["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        m["seconds"] = round(time.perf_counter() - self.started, 2)
        if self.kind == "openai":
            m["usage"] = {**(self.usage if self.usage_reported else {k: None for k in self.usage}),
                          "calls": self.calls, "cache_hits": self.cache_hits}
            price = self.config.price_per_1k
            m["price_per_1k"] = list(price) if price else None
            m["cost_usd"] = (round(self.usage["prompt_tokens"] / 1000 * price[0]
                                   + self.usage["completion_tokens"] / 1000 * price[1], 6)
                             if price and self.usage_reported else None)
        _write_json(self.folder / "manifest.json", m)

    def audit(self, code: str) -> Report:
        atomic_write(self.folder / "env.py", code)
        self.manifest["code_sha256"] = sha256(code)
        self.save(None)  # an interruption from here on leaves a folder marked unfinished
        self.say("gate: waiting for the gate")
        # the gate's probes drawn from the code and a secret of the output folder: an attempt's
        # findings and measured scores, hence the repair request that quotes them, are the same on
        # a re-run, so the LLM cache answers it and an interrupted batch resumes; the secret keeps
        # the draws unpredictable to the code (a quine can hash its own source, not the secret)
        key = hashlib.sha256(probe_secret(Path(self.config.out_dir)) + code.encode("utf-8"))
        probe_seed = int(key.hexdigest()[:15], 16)
        return self.executor.audit(self.folder, target=self.target, backend=self.config.backend,
                                   settings=GateSettings(seeds=self.config.seeds, probe_seed=probe_seed),
                                   write_report=True,
                                   progress=lambda step: self.say(f"gate: {step.text}"))


_SECRET_LOCK = threading.Lock()


def probe_secret(out_dir: Path) -> bytes:
    """16 random bytes made once per output folder (``.envforge-probe-secret``, not for git), or
    ``$ENVFORGE_PROBE_SECRET`` (hex) where set: the same draws in every folder, for a CI that must
    give the same verdicts on every run."""
    fixed = os.environ.get("ENVFORGE_PROBE_SECRET")
    if fixed is not None:
        try:
            return bytes.fromhex(fixed.strip())
        except ValueError:
            raise UsageError(f"ENVFORGE_PROBE_SECRET must be hex digits, got {fixed!r}") from None
    path = out_dir / ".envforge-probe-secret"
    with _SECRET_LOCK:
        try:
            return bytes.fromhex(path.read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            secret = os.urandom(16)
            out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(path, secret.hex() + "\n")
            return secret


def target_label(target: str | Path | Target) -> str:
    """How the manifest names a target: as the user gave it ('example' for the example)."""
    if not isinstance(target, Target):
        return str(target)
    if target.path and Path(target.path).resolve().parent == EXAMPLES.resolve():
        return "example"
    return target.path or target.name


def synthesize(spec: CapabilitySpec | str, target: str | Path | Target, config: SynthConfig | None = None,
               *, client: Any = None, progress: Progress | None = None,
               label: str | None = None, executor: Any = None) -> SynthResult:
    """Synthesize one capability on ``target``; write ``env.py``, ``manifest.json`` and
    ``report.json`` into ``config.out_dir/<slug>``. Returns the result (verdict ``accept``,
    ``reject``, or ``error`` with a message), never raises for a capability-level failure
    except UsageError (the command was asked something impossible). ``progress`` gets a
    ``Step`` (``envforge.progress``) per phase, its item the capability. ``executor``
    (``envforge.executor``) runs the gate's audits: here (default), or as Ray tasks; the LLM
    requests stay in this process either way."""
    config = config or SynthConfig()
    spec = CapabilitySpec(spec) if isinstance(spec, str) else spec
    target_spec = label or target_label(target)
    tgt = target if isinstance(target, Target) else load_target(target)
    kind = resolve_synthesizer(config, client)
    family = match_family(spec.name, spec.description) if kind == "template" else None
    say = reporter(progress, spec.name)
    run = _Run(spec, tgt, target_spec, config, kind, family, say, executor)
    if kind == "openai" and client is not None:
        run.manifest["model"] = client.model

    state, old = existing_env(run.folder)
    if state in ("accepted", "unknown", "foreign") and not config.force:
        same = old is not None and all(old.get(k) == run.manifest[k] for k in
                                       ("capability", "target_schema_hash", "synthesizer", "model"))
        if state == "accepted" and same:
            run.attempts = [Attempt(a["n"], a["verdict"], findings_from(a.get("findings")),
                                    a.get("code_sha256"))
                            for a in old.get("attempts", []) if isinstance(a, dict)]
            run.manifest = old
            return run.result("accept", skipped=True)
        what = {"accepted": "an accepted env",
                "unknown": "an env.py whose verdict is unknown (no report, or edited since)",
                "foreign": "a manifest.json that synth did not write, and no env.py (an adapter's folder?)"}[state]
        return run.result("error", f"{run.folder} already holds {what}"
                          + (f" for {old.get('capability')!r}" if old and old.get("capability") else "")
                          + "; pass --force to overwrite it, or --out to write elsewhere")
    try:
        if kind == "template":
            return _template(run)
        return _llm(run, client)
    except EnvforgeError as e:
        if isinstance(e, UsageError):
            raise
        if run.folder.exists():
            run.save("error")
        return run.result("error", str(e))


def llm_client(config: SynthConfig) -> LLMClient:
    return LLMClient(config.model or "", cache_dir=config.cache_dir, cache=config.cache,
                     timeout_s=config.timeout_s, max_retries=config.max_retries)


def _template(run: _Run) -> SynthResult:
    try:
        code, summary = synthesize_template(run.spec.name, run.family, run.target)
    except Unsupported as e:
        return run.result("error", str(e))
    run.manifest["template"] = summary
    run.say("gate")
    report = run.audit(code)
    run.attempts.append(Attempt(1, report.verdict, report.findings, sha256(code)))
    run.save(report.verdict)
    return run.result(report.verdict)


def _llm(run: _Run, client: Any) -> SynthResult:
    client = client or llm_client(run.config)
    run.manifest["model"] = client.model
    first = prompt_messages(run.spec.name, run.spec.description, run.target, run.spec.examples)
    run.manifest["prompt_sha256"] = request_key(first)
    params: dict[str, Any] = {"temperature": run.config.temperature}
    if run.config.max_tokens:
        params["max_tokens"] = run.config.max_tokens
    messages = first
    for n in range(1, run.config.attempts + 1):
        run.say(f"attempt {n}/{run.config.attempts}: asking {client.model}")
        reply = client.complete(messages, **params)
        run.add_usage(reply.usage, reply.cached)
        code, problem = extract_code(reply.content)
        if problem is not None:
            findings, stats = [problem], None
            attempt = Attempt(n, "reject", findings, None, reply.usage, reply.cached)
            if not (run.folder / "report.json").exists():
                _write_json(run.folder / "report.json", Report(
                    str(run.folder), [problem], run.target.name,
                    target_schema_hash=run.target.schema_hash()).to_dict())
        else:
            run.say(f"attempt {n}/{run.config.attempts}: gate")
            report = run.audit(code)
            findings, stats = report.findings, report.stats
            attempt = Attempt(n, report.verdict, findings, sha256(code), reply.usage, reply.cached)
        run.attempts.append(attempt)
        done = attempt.verdict == "accept"
        run.save("accept" if done else (None if n < run.config.attempts else "reject"))
        if done:
            return run.result("accept")
        messages = first + [{"role": "assistant", "content": reply.content},
                            {"role": "user", "content": repair_message([f.to_dict() for f in findings],
                                                                        code, stats)}]
    return run.result("reject")


# ============================================================================= a batch


def synthesize_batch(specs: Sequence[CapabilitySpec], target: str | Path | Target,
                     config: SynthConfig | None = None, *, client: Any = None,
                     progress: Progress | None = None, executor: Any = None) -> list[SynthResult]:
    """Synthesize every capability of ``specs`` on ``target``, ``config.concurrency`` at once;
    ``progress`` gets each capability's steps, and one with ``done``/``total`` as each
    finishes. Results in the order of ``specs``;
    a capability that fails is an ``error`` result, not an exception (UsageError aside). Two
    capabilities that would write the same folder (the same template family) run once: the
    later one is an ``error`` result naming the first. With a Ray ``executor`` each audit is a
    Ray task; the ``config.concurrency`` threads here make the LLM requests (one client, one
    ``rate_limit``) and wait for their audits."""
    config = config or SynthConfig()
    tgt = target if isinstance(target, Target) else load_target(target)
    kind = resolve_synthesizer(config, client)
    if kind == "openai" and client is None:
        client = llm_client(config)
    label = target_label(target)
    results: list[SynthResult | None] = [None] * len(specs)
    first: dict[str, int] = {}
    for i, spec in enumerate(specs):
        try:
            fam = match_family(spec.name, spec.description, listing=False) if kind == "template" else None
        except UsageError as e:  # a capability the template families do not cover
            results[i] = SynthResult(spec.name, None, None, "error", synthesizer=kind, error=str(e))
            continue
        slug = slug_for(spec.name, tgt, fam)
        if slug in first:
            results[i] = SynthResult(spec.name, slug, str(Path(config.out_dir) / slug), "error",
                                     synthesizer=kind, error=f"{spec.name!r} maps to the same env "
                                     f"({slug}) as {specs[first[slug]].name!r}, which is synthesized instead")
        else:
            first[slug] = i
    todo = [i for i in range(len(specs)) if results[i] is None]
    finished = 0
    lock = threading.Lock()

    def one(i: int) -> SynthResult:
        nonlocal finished
        spec = specs[i]
        try:
            return synthesize(spec, tgt, config, client=client, progress=progress, label=label,
                              executor=executor)
        except UsageError as e:  # a capability the template families do not cover
            return SynthResult(spec.name, None, None, "error", synthesizer=kind, error=str(e))
        finally:
            with lock:
                finished += 1
                if progress is not None:
                    progress(Step("done", spec.name, finished, len(todo)))

    for i, r in zip(todo, run_concurrently(one, todo, config.concurrency)):
        results[i] = r
    return [r for r in results if r is not None]


