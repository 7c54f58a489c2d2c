"""The gate: decides whether an LLM-written env is safe and fit to train on.

Checks run in order and each adds findings; an env is accepted when no finding is an error.

1. static (``static.py``): no code runs; the AST audit of imports, builtins, dunders, entropy and
   clock sources, size, and the contract's shape;
2. schema fidelity (``schema.py``): ``Env.tools`` equals the target's tools as canonical JSON;
3. dynamic (``dynamic.py``): the env runs in a sandbox (``sandbox/``) under probe policies and
   hypothesis state machines: JSON only, determinism, diversity, solvability, no free reward,
   partial credit, robustness, bounded calls and episodes, isolation of instances.

A rejected env gets every finding it earned: the dynamic stage runs even after static errors
(the sandbox, not the static audit, is the isolation boundary), unless the source could not be
parsed at all.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from envforge.contract import CHECKS, Report, error, warning
from envforge.errors import EnvforgeError, InputError, UsageError
from envforge.gate.config import GateSettings
from envforge.gate.dynamic import run_dynamic
from envforge.gate.schema import check_schema
from envforge.gate.static import audit_static
from envforge.progress import Progress, reporter
from envforge.targets import Target, load_target
from sandbox.base import get_backend

UNPARSABLE = {"input", "static.syntax", "static.size"}


def resolve_env(path: str | Path) -> Path:
    """The env.py file for PATH (an env folder or the file itself)."""
    p = Path(path)
    if p.is_dir():
        if not (p / "env.py").is_file():
            raise UsageError(f"{p} is a folder without env.py; give an env folder or an env.py file")
        return p / "env.py"
    if not p.exists():
        raise UsageError(f"{p} does not exist; give an env folder (holding env.py) or an env.py file")
    if p.suffix != ".py":
        raise UsageError(f"{p} is not an env.py (a Python file); give an env folder (holding "
                         "env.py) or an env.py file")
    return p


def target_for(env_file: Path, target: str | Path | Target | None) -> tuple[Target | None, str | None]:
    """The target to check against: the one given, else the one manifest.json names.

    Returns (target, problem): problem says why no target could be used (None when fine).
    """
    if isinstance(target, Target):
        return target, None
    if target is not None:
        return load_target(target), None
    manifest = env_file.parent / "manifest.json"
    if not manifest.is_file():
        return None, "no --target given and no manifest.json beside env.py naming one"
    try:
        named = json.loads(manifest.read_text(encoding="utf-8")).get("target")
    except (ValueError, OSError, AttributeError):
        return None, f"{manifest} is not a JSON object; pass --target"
    if not isinstance(named, str) or not named:
        return None, f"{manifest} names no target; pass --target"
    candidates = [named, env_file.parent / named]
    candidates += [Path(d) / named for d in os.environ.get("ENVFORGE_TARGETS", "").split(os.pathsep) if d]
    for c in candidates:
        if str(c) == "example" or Path(c).exists():
            return load_target(c), None
    return None, (f"manifest.json names target {named!r}, which was not found (looked in the current "
                  "folder, beside env.py and in $ENVFORGE_TARGETS); pass --target PATH")


def audit(path: str | Path, target: str | Path | Target | None = None, static_only: bool = False,
          backend: str = "auto", settings: GateSettings | None = None, write_report: bool = True,
          progress: Progress | None = None) -> Report:
    """Audit one env (folder or env.py) and return its report; writes report.json beside it.
    ``progress`` gets a ``Step`` per stage (``envforge.progress``), its item the path."""
    job = read_env(path, target)
    report = check(job, static_only=static_only, backend=backend, settings=settings,
                   progress=progress)
    if write_report and Path(path).is_dir():
        save_report(report, Path(path))
    return report


@dataclass
class AuditJob:
    """What an audit needs, read on the caller's machine: the env's bytes and its target. It
    travels whole to wherever ``check`` runs (a Ray task on another node: ``envforge.executor``)."""
    path: str
    filename: str
    raw: bytes
    target: Target | None
    why: str | None  # why no target could be used (None when one is)
    capability: str | None = None  # what the env was made for (manifest.json), if known


def read_env(path: str | Path, target: str | Path | Target | None = None) -> AuditJob:
    """The env at PATH and its target (given, or named by manifest.json), ready to ``check``."""
    env_file = resolve_env(path)
    try:
        raw = env_file.read_bytes()
    except OSError as e:
        raise InputError(f"{env_file}: cannot read ({e.strerror})") from None
    tgt, why = target_for(env_file, target)
    made_for = _manifest(env_file.parent).get("capability")
    return AuditJob(str(path), env_file.name, raw, tgt, why,
                    made_for if isinstance(made_for, str) and made_for.strip() else None)


def _name(text: str) -> str:
    """A capability's name as compared: case, underscores and spacing aside."""
    return " ".join(text.casefold().replace("_", " ").split())


def check(job: AuditJob, static_only: bool = False, backend: str = "auto",
          settings: GateSettings | None = None, progress: Progress | None = None) -> Report:
    """The gate's stages on one env's bytes; reads and writes no file."""
    tgt, why = job.target, job.why
    report = Report(path=job.path, target=tgt.name if tgt else None,
                    target_schema_hash=tgt.schema_hash() if tgt else None)
    say = reporter(progress, job.path)

    t0 = time.perf_counter()
    say("static audit")
    static = audit_static(job.raw, filename=job.filename)
    report.findings += static.findings
    report.stages["static"] = time.perf_counter() - t0
    parsable = not any(f.check in UNPARSABLE for f in static.findings)
    # the probes about reading and deciding run for capabilities named so: the name they go by is
    # the one the env was made for (manifest.json, written by synth), not the one env.py declares,
    # which the code's author chooses and could word to switch them off
    declared = static.shape["capability"]
    if job.capability and declared and _name(job.capability) != _name(declared):
        report.findings.append(error("contract.shape", f"CAPABILITY is {declared!r}, but this env "
                                     f"was made for {job.capability!r} (manifest.json): set "
                                     f"CAPABILITY = {json.dumps(job.capability)}"))

    t0 = time.perf_counter()
    tools = static.shape["tools"]
    if tgt is None:
        report.findings.append(warning("schema.fidelity", f"schema fidelity not checked: {why}"))
    elif tools is not None:
        report.findings += check_schema(tools, tgt)
    elif static_only and static.shape["has_env"]:
        report.findings.append(warning("schema.fidelity", "schema fidelity not checked: Env.tools "
                                       "is not a literal, so only the dynamic stage can read it "
                                       "(run without --static-only)"))
    report.stages["schema"] = time.perf_counter() - t0

    if parsable and not static_only:
        t0 = time.perf_counter()
        findings, stats = run_dynamic(static.text, get_backend(backend), settings, progress=say,
                                      capability=job.capability)
        dyn_tools = stats.pop("tools", None)
        if tgt is not None and tools is None and dyn_tools is not None:
            report.findings += check_schema(dyn_tools, tgt)  # Env.tools was not a literal
        report.findings += findings
        report.stats = stats
        report.stages["dynamic"] = time.perf_counter() - t0
    report.findings.sort(key=lambda f: (CHECKS.index(f.check), f.severity != "error"))
    return report


def save_report(report: Report, folder: Path) -> None:
    """Write report.json into the env folder, unless the report judged another target than the
    one the env was made for (manifest.json's ``target_schema_hash``, or the target it names):
    the report against the env's own target stands, and ``report.stats["report_json"]`` says why
    it was not replaced."""
    manifest = _manifest(folder)
    own = manifest.get("target_schema_hash")
    if not own and (folder / "manifest.json").is_file():
        try:
            named, _ = target_for(folder / "env.py", None)
            own = named.schema_hash() if named else None
        except EnvforgeError:
            own = None
    if own and report.target_schema_hash and report.target_schema_hash != own:
        report.stats["report_json"] = (
            f"not written: this audit judged target {report.target}, and the env was made for "
            f"{manifest.get('target') or 'another target'}; its report.json stands")
        return
    try:
        (folder / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    except OSError as e:
        report.stats["report_json"] = f"not written: {e.strerror}"


def _manifest(folder: Path) -> dict:
    try:
        data = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
