"""The command line: parse, call one library function, print, map errors to exit codes.

Exit codes, the same for every command (docs/configuration.md):

- 0: done, and the answer is yes (every env accepted, calibrated, ...);
- 1: the work ran and the answer is no (an env rejected, a calibration target missed), or it
  failed on the way (a sandbox, the model, an LLM endpoint);
- 2: what was asked cannot be done as given: an option or argument is wrong, or a file or folder
  it names is missing, unreadable or malformed (checked before any long work where it can be);
- 130: interrupted (Ctrl-C); what was finished is kept and a re-run resumes.

The options that set a stage's config are built from the config's fields (``option``), so a
default, a help text and a bound are written once, in the config dataclass; a bound broken on
the command line is reported under the flag the user typed.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from envforge import __version__
from envforge import identify as ident
from envforge import synth as S
from envforge.contract import Limits
from envforge.demo.config import DemoConfig
from envforge.errors import (ClusterError, ConfigError, EnvforgeError, SandboxUnavailable, UsageError,
                             printable)
from envforge.executor import ExecutorSettings, make_executor
from envforge.gate.config import GateSettings
from envforge.progress import Step
from envforge.settings import bounds_problem, default_of, field_of, flag_of
from envforge.synth.config import SynthConfig
from envforge.targets import load_target
from envforge.trajectories import load_trajectories
from sandbox.base import diagnose
from trainers.calibrate_config import CalibrationConfig
from trainers.eval_config import EvalConfig
from trainers.evaluate import parse_seeds, read_task_texts, read_tasks
from trainers.grpo_config import GRPOConfig

BACKENDS = ("auto", "process", "docker")  # the sandboxes a command line may ask for


class Command(click.Command):
    """A command whose config errors name the flag that sets the setting."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ConfigError as e:
            flag = next((p.opts[0] for p in self.params
                         if getattr(p, "setting", None) == (e.owner, e.field)), None)
            if flag is None:
                raise
            raise UsageError(f"{flag} {e.problem}") from None


class Group(click.Group):
    """Turns envforge's errors into one clear line and the right exit code, never a traceback;
    lists the commands in the pipeline's order."""

    command_class = Command
    group_class = type  # sub-groups are Groups too
    ORDER = ("demo", "identify", "synth", "audit", "sandbox", "calibrate", "train", "route", "eval")

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: (self.ORDER.index(n) if n in self.ORDER else len(self.ORDER), n))

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except EnvforgeError as e:
            click.echo(f"error: {printable(str(e))}", err=True)  # it may quote an env or a model
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


class SettingOption(click.Option):
    """An option that sets one field of a config dataclass (``setting``: class name, field)."""

    def __init__(self, *args: Any, setting: tuple[str, str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.setting = setting


def option(cls: type, name: str, *decls: str, **kwargs: Any):
    """A click option for setting NAME of config class CLS: its flag (``flag_of``: the field's
    declared one, else ``--name-with-dashes``; DECLS instead where given), default and help are the
    field's; the command gets it as NAME. The field's bounds are checked when the config is built
    (``settings``), not by click."""
    f = field_of(cls, name)
    default = kwargs.pop("default", default_of(cls, name))
    if "type" not in kwargs and not kwargs.get("is_flag") and not any("/" in d for d in decls):
        choices = f.metadata.get("choices")
        kind = str(f.type)
        kwargs["type"] = (click.Choice(choices) if choices else click.FLOAT if "float" in kind
                          else click.INT if "int" in kind else click.STRING)
    kwargs.setdefault("help", f.metadata.get("help", ""))
    kwargs.setdefault("show_default", default is not None and not kwargs.get("is_flag"))
    return click.option(*(decls or (flag_of(cls, name),)), name, cls=SettingOption,
                        setting=(cls.__name__, name), default=default, **kwargs)


def settings(cls: type, kwargs: dict, **extra: Any):
    """CLS built from the command's arguments named after its fields (taken out of KWARGS)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: kwargs.pop(k) for k in list(kwargs) if k in names}, **extra)


def backend_option(help: str = "Sandbox the env runs in (auto: process, else docker)."):
    return click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
                        help=help)


json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")


def executor_options(f):
    """--executor and --ray-address (``envforge.executor``); the command gets them as
    ``executor`` and ``ray_address``, for ``executor_from(kwargs)``."""
    return option(ExecutorSettings, "executor")(option(ExecutorSettings, "ray_address")(f))


def executor_from(kwargs: dict):
    """The executor the command's --executor and --ray-address ask for (taken out of KWARGS)."""
    return make_executor(settings(ExecutorSettings, kwargs))


@click.group(cls=Group)
@click.version_option(__version__, prog_name="envforge")
def main() -> None:
    """envforge: find what an agent lacks, write training environments for it, audit them, train."""


def console():
    """A rich console for tables on stdout; wide enough when stdout is a pipe or a file."""
    from rich.console import Console
    return Console() if sys.stdout.isatty() else Console(width=160)


def emit_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def out_folder(path: str | Path, flag: str) -> Path:
    """The output folder PATH, made now, so that a file in its place is a usage error before any
    work rather than a traceback after it."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a folder; give a folder (made when missing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot make this folder ({e.strerror})") from None
    return p


def out_file(path: str | Path, flag: str) -> Path:
    """The output file PATH, its folder made now, so that a folder in its place or a folder that
    cannot be made is a usage error before any work rather than a traceback after it."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a folder; give a file path (its folder is made when missing)")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot make its folder {p.parent} ({e.strerror})") from None
    return p


#: the plot formats identify draws (matplotlib's common ones)
PLOT_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def _identify_outputs(inputs, out, labels_out, plot) -> None:
    """identify's outputs, checked before the labelling (an LLM's can take long): each writable
    (``out_file``), no two the same file (--out caps.png and its plot's default name were one),
    none of them a trajectory file it reads, and the plot in a format matplotlib draws."""
    named = [("--out", out)] + ([("--labels-out", labels_out)] if labels_out else []) + \
        ([("--plot", plot)] if plot is not None else [])
    for flag, path in named:
        out_file(path, flag)
    if plot is not None and Path(plot).suffix.lower() not in PLOT_FORMATS:
        raise UsageError(f"--plot {plot}: matplotlib draws {', '.join(PLOT_FORMATS)}; give the plot such "
                         "a name (by default it is --out's with .png)")
    seen: dict[Path, str] = {}
    for flag, path in named:
        p = Path(path).resolve()
        if p in seen:
            why = " (the plot's default is --out with .png)" if "--plot" in (flag, seen[p]) else ""
            raise UsageError(f"{flag} {path} is the file {seen[p]} names too{why}: give each output its own name")
        seen[p] = flag
    read = set()
    for given in inputs:
        g = Path(given)
        read |= {f.resolve() for f in g.rglob("*") if f.is_file()} if g.is_dir() else {g.resolve()}
    for p, flag in seen.items():
        if p in read:
            raise UsageError(f"{flag} {p} is one of the trajectory files identify reads: it would be "
                             "written over; give the output another name")


def _target(spec: str):
    """The target a --target names (exit 2 when it is missing or malformed)."""
    if spec != "example" and not Path(spec).exists():
        raise UsageError(f"--target {spec}: no such folder or file; give a target folder (holding "
                         "agent_tools.openai.json or tools.json), a JSON file of tool schemas, or 'example'")
    return load_target(spec)


# ----------------------------------------------------------------------------- audit
# (the gate: see envforge/gate)

@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--target", "-t", help="Target folder, tool-schema JSON file, or 'example'. "
              "Default: the target named in each env's manifest.json.")
@click.option("--static-only", is_flag=True, help="Run only the static audit and schema fidelity (no code runs).")
@backend_option("Sandbox for the dynamic checks (auto: process, else docker).")
@option(GateSettings, "seeds")
@option(Limits, "call_timeout_s", "--call-timeout")
@option(Limits, "memory_mb", "--memory-mb")
@option(GateSettings, "budget_s", "--budget")
@option(GateSettings, "probe_seed")
@click.option("--no-report", is_flag=True, help="Do not write report.json beside env folders.")
@executor_options
@json_option
def audit(paths, target, static_only, backend, no_report, as_json, **kwargs):
    """Audit env folders (or env.py files): static safety, schema fidelity, dynamic properties.

    Exit 0 when every env is accepted, 1 when any is rejected, 2 on usage errors.
    """
    from envforge.gate import audit as run_audit, resolve_env
    gate = settings(GateSettings, kwargs, limits=settings(Limits, kwargs))
    for p in paths:  # fail fast on usage errors before any long work
        resolve_env(p)
    tgt = _target(target) if target else None
    run = dict(target=tgt, static_only=static_only, backend=backend, settings=gate,
               write_report=not no_report)
    reports = []
    with executor_from(kwargs) as executor:
        if executor.name == "ray":  # every env at once, each a Ray task
            with Display(f"auditing {len(paths)} env(s) on Ray", quiet=as_json) as display:
                reports = executor.audit_all(paths, progress=display, **run)
        for p in paths if executor.name == "local" else ():
            with Display(f"auditing {p}", quiet=as_json) as display:
                reports.append(run_audit(p, progress=display, **run))
            if not as_json:
                _print_report(reports[-1])
    if as_json:
        emit_json({"results": [r.to_dict() for r in reports]})  # each as its report.json
    elif executor.name == "ray":
        for r in reports:
            _print_report(r)
    sys.exit(0 if all(r.accepted for r in reports) else 1)


class Display:
    """Shows a stage's progress steps (``envforge.progress``) on stderr, the same way for every
    stage. On a terminal: a spinner with the latest line per item and a bar of finished items
    with its ETA, gone when the stage ends. A step that carries a record (a training
    iteration's statistics) stays as a line; off a terminal (a pipe, a log) so do the steps that
    count finished items, at most one every ``EVERY_S`` seconds, and the last. Lines read
    ``[done/total] item: text  ETA 12s``. Nothing when quiet. Thread-safe: batch stages report
    from several threads."""

    EVERY_S = 2.0

    def __init__(self, title: str, quiet: bool = False):
        self.quiet, self.bar, self.lock, self.lines = quiet, None, threading.Lock(), {}
        self.count: tuple | None = None  # (total, done at its start, its start, last done)
        self.printed, self.mark = float("-inf"), time.monotonic()
        if not quiet and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                       TextColumn, TimeElapsedColumn, TimeRemainingColumn)
            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                console=Console(stderr=True), transient=True)
            self.main = self.bar.add_task(title, total=None)

    def __enter__(self) -> "Display":
        if self.bar:
            self.bar.start()
        return self

    def __call__(self, step: Step) -> None:
        if self.quiet:
            return
        with self.lock:
            now = time.monotonic()
            eta = self._count(step, now)
            if step.record is not None or (self.bar is None and step.done is not None and (
                    step.done == step.total or now - self.printed >= self.EVERY_S)):
                self.printed = now
                line = (f"[{step.done}/{step.total}] " if step.done is not None else "") + str(step)
                line += f"  ETA {eta:.0f}s" if eta is not None else ""
                (self.bar.console.print if self.bar else lambda t, **_: click.echo(t, err=True))(
                    line, highlight=False, markup=False)
            if self.bar:
                self._draw(step)

    def _count(self, step: Step, now: float) -> float | None:
        """The ETA of the count STEP belongs to, from the pace since the count began: a count
        whose first step finishes its first item began when the one before it ended (or the
        display started); one whose first step is further on (a resumed run, or a first wave of
        several episodes) begins at that step, so its ETA comes from its next step on. A count
        begins afresh when its total changes or its done goes down (a stage's next phase)."""
        if step.done is None or not step.total:
            return None
        if self.count is None or self.count[0] != step.total or step.done < self.count[3]:
            first, t0 = (0, self.mark) if step.done <= 1 else (step.done, now)
            self.count = (step.total, first, t0, step.done)
        total, first, t0, _ = self.count
        self.count, self.mark = (total, first, t0, step.done), now
        return (now - t0) / (step.done - first) * (total - step.done) if step.done > first else None

    def _draw(self, step: Step) -> None:
        if step.done is not None:  # an item finished
            self.bar.update(self.main, completed=step.done, total=step.total)
            line = self.lines.pop(step.item, None)
            if line is not None:
                self.bar.remove_task(line)
        if step.item is None and step.record is None:  # a record is printed as a line
            self.bar.update(self.main, description=step.text)
        elif step.done is None:
            if step.item not in self.lines:
                self.lines[step.item] = self.bar.add_task("", total=None)
            self.bar.update(self.lines[step.item], description=f"  {step}")

    def __exit__(self, *exc) -> None:
        if self.bar:
            self.bar.stop()


def _print_report(report) -> None:
    from rich.table import Table

    out = console()
    colour = "green" if report.accepted else "red"
    title = f"{report.path}: [{colour}]{report.verdict}[/{colour}]" + (f" (target {report.target})" if report.target else "")
    out.print(title)
    table = Table(show_lines=False)
    table.add_column("check", style="bold", no_wrap=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("message", overflow="fold")
    for f in report.findings:
        table.add_row(f.check, "[red]error[/red]" if f.severity == "error" else "[yellow]warning[/yellow]", f.message)
    if not report.findings:
        table.add_row("-", "-", "no findings")
    out.print(table)
    stats = report.stats.get("mean_score")
    timing = ", ".join(f"{k} {v:.2f}s" for k, v in report.stages.items())
    if stats:
        out.print(f"  mean scores: {stats}; solved {report.stats.get('solved')}; distinct scenarios "
                  f"{report.stats.get('distinct_scenarios')}; {timing}", highlight=False)
    else:
        out.print(f"  {timing}", highlight=False)
    if report.stats.get("report_json"):
        out.print(f"  report.json {report.stats['report_json']}", highlight=False)


# ----------------------------------------------------------------------------- sandbox
# (where env code runs: see sandbox/)

@main.group("sandbox")
def sandbox_group() -> None:
    """The sandbox env code runs in: build the Docker image, check which backends work here."""


@sandbox_group.command("build")
@click.option("--base", help="Base image with python3 >= 3.11 on its PATH (default: the "
              "Dockerfile's python:3.12-slim, which needs a registry; see sandbox/Dockerfile).")
def sandbox_build(base):
    """Build the Docker sandbox image from sandbox/Dockerfile (exit 1 when the build fails)."""
    from sandbox.docker import build_image
    with Display("building the sandbox image") as display:
        tag = build_image(base=base, progress=display)
    click.echo(f"built {tag} (also tagged envforge-sandbox:latest)")


@sandbox_group.command("doctor")
@json_option
@click.option("--clean", is_flag=True, help="Also remove stray Docker sandbox containers (their "
              "owner is gone, or they stopped over a minute ago), listing each.")
def sandbox_doctor(as_json, clean):
    """Say which sandbox backends work on this machine, and why not (with the fix); for each
    that works, what holds env code in it, seen from inside a sandbox (uid, capabilities,
    seccomp, threads and processes, TIOCSTI, F_SETOWN, io_uring, CPU).

    Exit 0 when at least one backend works, 1 when none does.
    """
    from rich.table import Table

    strays = _clean_strays() if clean else None  # first: a Docker probe would reap them unseen
    rows = diagnose()
    usable = [r for r in rows if r["ok"] and r["backend"] not in ("process/seccomp",
                                                                 "process/channel")]
    if as_json:
        emit_json({"backends": rows, **({"strays": strays} if clean else {})})
    else:
        table = Table()
        table.add_column("backend", style="bold", no_wrap=True)
        table.add_column("works", no_wrap=True)
        table.add_column("how it isolates, or why not and the fix", overflow="fold")
        for r in rows:
            inside = r.get("containment")
            table.add_row(r["backend"], "[green]yes[/green]" if r["ok"] else "[red]no[/red]",
                          r["detail"] + (f"\n[bold]inside:[/bold] {inside['words']}"
                                         if inside else ""))
        console().print(table)
        if clean:
            for stray in strays:
                click.echo(f"{'removed' if stray['removed'] else 'could not remove'} stray "
                           f"container {stray['id'][:12]} ({stray['state']}, {stray['why']}; "
                           f"owner {stray['owner'] or 'unknown'})")
            if not strays:
                click.echo("no stray sandbox containers")
    sys.exit(0 if usable else 1)


def _clean_strays() -> list[dict]:
    """Remove the Docker engine's stray sandbox containers; what was found (none without an
    engine: said on stderr)."""
    from sandbox.docker import DockerBackend
    try:
        return DockerBackend().clean()
    except SandboxUnavailable as e:
        click.echo(f"no Docker engine to clean: {e}", err=True)
        return []


# ----------------------------------------------------------------------------- identify
# (capability identification: see envforge/identify)

@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["auto", "tau2", "tau-bench", "jsonl"]),
              default="auto", show_default=True, help="Trajectory file format (auto: by content).")
@option(ident.IdentifyConfig, "labeller", "--labeler")
@click.option("--target", "-t", help="Target folder: its tool metadata says which tools write, its "
              "policy what the rules may check (confirmation, time windows). Default: read/write "
              "from tool names, the policy the trajectories record.")
@option(ident.IdentifyConfig, "runs")
@option(ident.IdentifyConfig, "min_runs")
@option(ident.IdentifyConfig, "delta")
@option(ident.IdentifyConfig, "rho")
@option(ident.IdentifyConfig, "min_group")
@option(ident.IdentifyConfig, "success_threshold")
@option(ident.IdentifyConfig, "seed")
@click.option("--out", "-o", default="capabilities.json", show_default=True,
              help="Where to write the result (what 'envforge synth --from' reads).")
@click.option("--labels-out", help="Also write one JSON line per trajectory: its labels and the "
              "evidence for each (turn, why), in input order.")
@click.option("--plot", "plot_path", help="PNG of gap against coverage (default: --out with .png).")
@click.option("--no-plot", is_flag=True, help="Do not draw the plot.")
@json_option
@option(ident.IdentifyConfig, "model")
@option(ident.IdentifyConfig, "concurrency")
@option(ident.IdentifyConfig, "rate_limit")
@option(ident.IdentifyConfig, "cache_dir")
@option(ident.IdentifyConfig, "cache", "--cache/--no-cache")
def identify(paths, fmt, target, out, labels_out, plot_path, no_plot, as_json, **kwargs):
    """Find the capabilities an agent lacks by contrasting its successes and failures.

    PATHS are tau2-bench Results files or directories, tau-bench v1 result lists, envforge JSONL
    files, or folders of them. Writes capabilities.json and a plot; prints a table.
    """
    from envforge.identify import report

    config = settings(ident.IdentifyConfig, kwargs)
    if config.labeller != "structural" and not config.model:
        raise UsageError(f"--labeler {config.labeller} needs --model (the model your endpoint "
                               "serves)")
    plot_path = None if no_plot else (plot_path or Path(out).with_suffix(".png"))
    _identify_outputs(paths, out, labels_out, plot_path)
    tgt = _target(target) if target else None
    trajectories = load_trajectories(paths, format=fmt, success_threshold=config.success_threshold)
    with Display("identifying", quiet=as_json) as display:
        result = ident.identify(trajectories, config, meta=tgt.meta if tgt else None,
                                policy=tgt.policy if tgt else None, progress=display)
    result.write(out)
    if labels_out:
        result.write_labels(labels_out)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    drawn = None
    if not no_plot:
        drawn = report.plot(result, plot_path)
        if drawn is None:
            click.echo("warning: matplotlib is not installed; no plot drawn (pip install matplotlib)",
                       err=True)
    if as_json:
        emit_json(result.to_dict())
        return
    con = console()
    con.print(report.table(result))
    con.print(f"kept {len(result.retained)}: {', '.join(result.retained) or 'none'}; wrote {out}"
              + (f", {labels_out}" if labels_out else "") + (f" and {drawn}" if drawn else ""),
              highlight=False)


# ----------------------------------------------------------------------------- synth
# (synthesis: see envforge/synth)

def _price(value: str | None) -> tuple[float, float] | None:
    if not value:
        return None
    try:
        parts = [float(x) for x in value.split(",")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or any(p < 0 for p in parts):
        raise UsageError(f"--price-per-1k {value!r}: give USD per 1,000 tokens as IN,OUT (e.g. 0.15,0.6) "
                         "or one price for both")
    return (parts[0], parts[-1])


@main.command()
@click.argument("more_trajectories", nargs=-1, metavar="")
@click.option("--capability", "-c", help="The capability to train, e.g. \"precondition verification\".")
@click.option("--description", "-d", default="", help="What the capability means (helps the LLM; "
              "also used to find the nearest template family).")
@click.option("--from", "from_file", help="A capabilities.json from 'envforge identify': synthesize "
              "every retained capability, in parallel.")
@click.option("--all", "include_all", is_flag=True, help="With --from: also the capabilities not retained.")
@click.option("--trajectories", multiple=True, metavar="PATH [PATH...]", help="With --from and a "
              "capabilities.json of an older identify (without example_trajectories): trajectory "
              "files whose failures of the task ids it lists give the LLM example trajectories.")
@click.option("--target", "-t", default="example", show_default=True, help="Target folder, "
              "tool-schema JSON file, or 'example' (envforge's own small helpdesk target, offline).")
@option(SynthConfig, "synthesizer", "--llm")
@option(SynthConfig, "model")
@option(SynthConfig, "attempts")
@option(SynthConfig, "out_dir", "--out", "-o")
@option(SynthConfig, "force", is_flag=True)
@option(SynthConfig, "seeds")
@option(SynthConfig, "backend")
@option(SynthConfig, "concurrency", help="With --from: capabilities synthesized at once.")
@option(SynthConfig, "temperature")
@option(SynthConfig, "max_tokens")
@option(SynthConfig, "timeout_s", "--timeout")
@click.option("--price-per-1k", "price", help="LLM: USD per 1,000 prompt,completion tokens, for the "
              "cost in manifest.json (e.g. 0.15,0.6).")
@option(SynthConfig, "cache_dir")
@option(SynthConfig, "cache", "--cache/--no-cache")
@executor_options
@json_option
def synth(more_trajectories, capability, description, from_file, include_all, trajectories, target,
          price, as_json, **kwargs):
    """Write a training environment per capability and repair it until the gate accepts it.

    One capability (--capability) or every retained one of an identification run (--from), on
    --target (default: the example target). Exit 0 when every env is accepted, 1 when any is not,
    2 on usage errors.
    """
    if more_trajectories and not trajectories:
        raise UsageError(f"unexpected argument {more_trajectories[0]!r}: synth takes no arguments "
                         "(paths of trajectory files follow --trajectories)")
    trajectories = [*trajectories, *more_trajectories]
    if bool(capability) == bool(from_file):
        raise UsageError("give either --capability TEXT or --from capabilities.json")
    config = settings(SynthConfig, kwargs, price_per_1k=_price(price))
    tgt = _target(target)
    out_folder(config.out_dir, "--out")
    kind = S.resolve_synthesizer(config)
    if capability:
        specs = [S.CapabilitySpec(capability, description)]
        if kind == "template":
            S.match_family(capability, description)  # exit 2 with the families before any work
    else:
        loaded = load_trajectories(trajectories) if trajectories else None
        specs = S.load_capabilities(from_file, retained_only=not include_all, trajectories=loaded)
        if not specs:
            raise UsageError(f"{from_file} has no retained capability to synthesize (pass --all "
                             "to take every capability it lists)")
    label = S.target_label(target)
    if not as_json:
        click.echo(f"target: {label}" + (" (envforge's example helpdesk target; --target PATH for "
                   "yours)" if label == "example" else f" ({tgt.name})"), err=True)
        if config.synthesizer == "auto":
            click.echo(f"synthesizer: {kind}" + (f" ({config.model})" if kind == "openai" else
                       " (offline; set OPENAI_BASE_URL and --model for the LLM path)"), err=True)
    with Display("synthesizing", quiet=as_json) as display, executor_from(kwargs) as executor:
        if capability:
            results = [S.synthesize(specs[0], tgt, config, progress=display, label=label,
                                    executor=executor)]
        else:
            results = S.synthesize_batch(specs, tgt, config, progress=display, executor=executor)
    if as_json:
        emit_json(results[0].to_dict() if capability else [r.to_dict() for r in results])
    else:
        _print_synth(results)
    sys.exit(0 if all(r.accepted for r in results) else 1)


def _print_synth(results) -> None:
    from rich.table import Table

    out = console()
    table = Table(title="envforge synth")
    for col in ("capability", "slug", "verdict", "attempts", "seconds", "notes"):
        table.add_column(col, overflow="fold", no_wrap=col in ("verdict", "attempts", "seconds"))
    for r in results:
        colour = {"accept": "green", "reject": "red"}.get(r.verdict, "yellow")
        last = r.attempts[-1] if r.attempts else None
        errors = [f for f in (last.findings if last else []) if f.severity == "error"]
        note = r.error or ("already accepted; kept (--force to redo)" if r.skipped else
                           "; ".join(f"{f.check}: {f.message[:120]}" for f in errors[:3]))
        table.add_row(r.capability, r.slug or "-", f"[{colour}]{r.verdict}[/{colour}]",
                      str(len(r.attempts)), f"{r.seconds:.1f}", note or "")
    out.print(table)
    ok = sum(r.accepted for r in results)
    paths = [r.path for r in results if r.accepted and r.path]
    out.print(f"{ok} of {len(results)} accepted" + (f": {', '.join(paths)}" if paths else ""), highlight=False)


# ----------------------------------------------------------------------------- train, calibrate, route, eval
# (trainers/: torch, transformers and peft are imported inside the commands only)

def _need_train_extra():
    try:
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise UsageError(f"{e.name} is not installed: these commands need the train extra "
                         "(pip install -c constraints.txt -e '.[train]')") from None


def _adapter(path: str | None, flag: str = "--adapter") -> str | None:
    """An adapter folder as `envforge train` writes it (peft's adapter_config.json inside)."""
    if path is not None and not (Path(path) / "adapter_config.json").is_file():
        what = ("does not exist" if not Path(path).exists() else "is not a folder" if not
                Path(path).is_dir() else "holds no adapter_config.json")
        raise UsageError(f"{flag} {path}: {what}; give an adapter folder as `envforge train` "
                         "writes it (e.g. adapters/<slug>)")
    return path


def _model(path: str) -> str:
    if not Path(path).is_dir():
        what = "is a file, not a folder" if Path(path).exists() else "no such folder"
        raise UsageError(f"--model {path}: {what}; give a local model folder "
                         "(from_pretrained: config.json, weights, tokenizer)")
    return path


threads_option = option(GRPOConfig, "threads")


def _threads(value: int | None) -> int | None:
    """--threads of a command that builds no GRPOConfig, checked against its bounds."""
    problem = bounds_problem(field_of(GRPOConfig, "threads").metadata, value)
    if problem:
        raise UsageError(f"--threads {problem}")
    return value


@main.command()
@click.argument("envs", nargs=-1, required=True)
@click.option("--model", "-m", required=True, help="Base model: a local folder (from_pretrained).")
@click.option("--out", "-o", "out_dir", default="adapters", show_default=True,
              help="Adapters go to OUT/<env slug>/ (peft safetensors, manifest.json, reward_curve.png).")
@option(GRPOConfig, "iterations")
@option(GRPOConfig, "max_rollouts")
@option(GRPOConfig, "num_groups")
@option(GRPOConfig, "group_size")
@option(GRPOConfig, "learning_rate")
@option(GRPOConfig, "lr_schedule")
@option(GRPOConfig, "warmup_iterations")
@option(GRPOConfig, "lora_rank")
@option(GRPOConfig, "lora_alpha")
@option(GRPOConfig, "max_new_tokens")
@option(GRPOConfig, "kl_coef")
@option(GRPOConfig, "seed")
@option(GRPOConfig, "env_seed_key")
@option(GRPOConfig, "device")
@click.option("--no-resume", is_flag=True, help="Start afresh even when OUT/<slug>/checkpoint exists.")
@option(GRPOConfig, "backend", type=click.Choice(BACKENDS))
@threads_option
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=1, show_default=True,
              help="Adapters trained at once, each in a process of its own (the same adapters as one "
                   "after another; on a CPU give each --threads cores).")
@option(GRPOConfig, "report_to")
@executor_options
def train(envs, model, out_dir, no_resume, jobs, **kwargs):
    """GRPO: one LoRA adapter per ENV (a slug of generated_envs/ or an env folder). Resumes from
    OUT/<slug>/checkpoint after a crash or Ctrl-C unless --no-resume (under the checkpoint's own
    training settings: more --iterations (at a constant --lr-schedule) or another --device
    resume, another --lr is refused)."""
    config = settings(GRPOConfig, kwargs)
    _need_train_extra()
    from envforge.gym import resolve
    from trainers.grpo import CHECKPOINT, GRPOTrainer
    from trainers.policy import load_policy, set_threads

    slugs = [resolve(env).parent.name for env in envs]  # every ENV and OUT checked before any work
    twice = sorted({s for s in slugs if slugs.count(s) > 1})
    if twice:
        raise UsageError(f"ENVS name {', '.join(twice)} more than once: each adapter goes to "
                         "OUT/<env slug>; give each env once")
    for slug in slugs:
        _adapter_folder(Path(out_dir) / slug, out_dir)
        out_folder(Path(out_dir) / slug, "--out")
    _model(model)
    if jobs > 1 and len(envs) > 1:
        if kwargs.get("executor", "local") != "local":
            raise UsageError("--jobs trains adapters in processes on this machine; with --executor ray "
                             "give --jobs 1 (the env steps spread over the cluster) or run one train "
                             "per adapter")
        return _train_jobs(envs, slugs, model, out_dir, no_resume, config, jobs)
    set_threads(config.threads)
    executor = executor_from(kwargs)

    try:
        for env, slug in zip(envs, slugs):
            out = Path(out_dir) / slug
            click.echo(f"train {slug} -> {out} ({config.iterations} iterations)")
            policy = load_policy(_model(model), device=config.device)
            try:
                with Display(f"training {slug}") as display:
                    result = GRPOTrainer(policy, env, config, out=out, base_model=model,
                                         resume=not no_resume, progress=display,
                                         executor=executor).train()
            except KeyboardInterrupt:
                click.echo(_interrupted(out / CHECKPOINT), err=True)
                sys.exit(130)
            except ClusterError as e:  # the head died: say so, and how to go on from the checkpoint
                raise ClusterError(f"{e}\n{_interrupted(out / CHECKPOINT)}") from None
            curve = result.manifest["reward_curve"]
            click.echo(f"  saved {out} (reward {curve[0]:.3f} -> {curve[-1]:.3f}; reward_curve.png; "
                       f"env seeds keyed {result.manifest['env_seeds']['key']})")
    finally:
        executor.close()


#: what a training run writes in OUT/<slug> (peft's README.md among them)
TRAIN_WRITES = {"checkpoint", "checkpoint.tmp", "checkpoint.old", "adapter_config.json",
                "adapter_model.safetensors", "manifest.json", "reward_curve.png", "runs", "README.md",
                "crash.log"}


def _adapter_folder(folder: Path, out_dir: str) -> None:
    """Refuse OUT/<slug> where it holds what train did not write (an env's folder, a user's files,
    another tool's manifest.json): the adapter's files would replace them."""
    if not folder.is_dir():
        return
    if (folder / "env.py").exists():
        raise UsageError(f"--out {out_dir}: {folder} is an env folder (it holds env.py); the adapter's "
                         "files would overwrite its manifest.json: give another --out (default: adapters)")
    names = {p.name for p in folder.iterdir()}
    other = sorted(names - TRAIN_WRITES)
    manifest = folder / "manifest.json"
    try:
        theirs = manifest.exists() and "env_hash" not in json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        theirs = True
    if other or theirs:
        what = ", ".join(other[:4]) + (" ..." if len(other) > 4 else "") if other else \
            "a manifest.json train did not write"
        raise UsageError(f"--out {out_dir}: {folder} holds what train did not write ({what}); the "
                         "adapter's files would replace them: give another --out (default: adapters)")


def _train_jobs(envs, slugs, model, out_dir, no_resume, config, workers) -> None:
    """``train --jobs``: the adapters trained ``workers`` at a time (``trainers.parallel``)."""
    from trainers.grpo import CHECKPOINT
    from trainers.parallel import Interrupted, Job, train_many
    jobs = [Job(slug, _model(model), env, str(Path(out_dir) / slug), config, base_model=model,
                resume=not no_resume) for env, slug in zip(envs, slugs)]
    click.echo(f"train {', '.join(slugs)} -> {out_dir}/ ({config.iterations} iterations each, "
               f"{min(workers, len(jobs))} at a time)")
    try:
        with Display(f"training {len(jobs)} adapters") as display:
            results = train_many(jobs, workers, progress=display)
    except Interrupted as e:
        for job in e.jobs:
            click.echo(f"{job.name}: {_interrupted(Path(job.out) / CHECKPOINT)}", err=True)
        sys.exit(130)
    for job, r in zip(jobs, results):
        curve = r["reward_curve"]
        resumed = f"resumed at iteration {r['resumed_at']}; " if r["resumed_at"] is not None else ""
        click.echo(f"  saved {job.out} ({resumed}reward {curve[0]:.3f} -> {curve[-1]:.3f}; reward_curve.png; "
                   f"env seeds keyed {r['env_seeds']['key']})")


def _interrupted(checkpoint: Path) -> str:
    """What Ctrl-C during training left, and how to go on."""
    try:
        done = json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))["iteration"]
    except (OSError, ValueError, KeyError, TypeError):
        return "interrupted before the first checkpoint; run the same command again to start over"
    return (f"interrupted: {checkpoint} holds {done} finished iteration(s); run the same command "
            "again to resume from there (--no-resume starts afresh)")


@main.command()
@click.argument("env")
@click.option("--model", "-m", required=True, help="Base model: a local folder.")
@click.option("--adapter", help="Calibrate this adapter instead of the base policy.")
@option(CalibrationConfig, "groups")
@option(CalibrationConfig, "group_size")
@option(CalibrationConfig, "max_new_tokens")
@option(CalibrationConfig, "temperature")
@option(CalibrationConfig, "seed")
@option(CalibrationConfig, "env_seed_key")
@json_option
@option(CalibrationConfig, "backend", type=click.Choice(BACKENDS))
@threads_option
@executor_options
def calibrate(env, model, adapter, as_json, threads, **kwargs):
    """Base-policy rollouts against the paper's targets: mean reward and success in [0.2, 0.6],
    reward std >= 0.05, at most 20% constant groups. Exit 1 when a target is missed."""
    config = settings(CalibrationConfig, kwargs)
    _need_train_extra()
    from trainers.calibrate import calibrate as run
    from trainers.policy import load_policy, set_threads
    set_threads(_threads(threads))
    policy = load_policy(_model(model), adapter=_adapter(adapter))
    with executor_from(kwargs) as executor, Display(f"calibrating {env}", quiet=as_json) as display:
        result = run(policy, env, config, executor=executor, progress=display)
    if as_json:
        emit_json(result.to_dict())
    else:
        for c in result.checks:
            click.echo(f"  {'ok  ' if c['ok'] else 'MISS'} {c['check']:<16} {c['value']:.3f}  target {c['target']}")
        for a in result.advice:
            click.echo(f"  - {a}")
        click.echo(f"  env seeds keyed {result.metrics['env_seed_key']} (--env-seed-key replays them)")
        click.echo("calibrated: GRPO will get a signal" if result.ok else "not calibrated")
    sys.exit(0 if result.ok else 1)


@main.command()
@click.option("--model", "-m", required=True, help="Base model: a local folder.")
@click.option("--adapters", "-a", required=True, help="A folder of adapters (as `envforge train` writes).")
@click.option("--task", "tasks", multiple=True, help="A task text (repeatable).")
@click.option("--tasks", "tasks_file", help="A file of tasks: one per line, or JSONL with a \"task\" field.")
@option(EvalConfig, "examples", help="Examples per capability shown to the router.")
@threads_option
def route(model, adapters, tasks, tasks_file, threads, **kwargs):
    """Pick an adapter (or none) per task by the base model's likelihood of each answer; JSON out."""
    config = settings(EvalConfig, kwargs)
    texts = list(tasks) + (read_task_texts(tasks_file) if tasks_file else [])
    if not texts:
        raise UsageError("give --task TEXT or --tasks FILE")
    _need_train_extra()
    from trainers.policy import set_threads
    from trainers.router import Router
    set_threads(_threads(threads))
    router = Router.load(_model(model), adapters, examples=config.examples)
    emit_json([router.route(t).to_dict() for t in texts])


@main.command("eval")
@click.argument("env", required=False)
@click.option("--model", "-m", required=True, help="Base model: a local folder.")
@click.option("--adapter", help="Evaluate this one adapter.")
@click.option("--adapters", help="A folder of adapters: routed per episode (or merged with --merge).")
@click.option("--merge", is_flag=True, help="With --adapters: merge them into one instead of routing.")
@click.option("--seeds", default="0-19", show_default=True, help="Env seeds: 'A-B' or 'a,b,c'.")
@click.option("--tasks", "tasks_file", help="Instead of ENV: a JSON/JSONL list of {\"env\", \"seed\"}.")
@option(EvalConfig, "max_new_tokens")
@option(EvalConfig, "temperature")
@option(EvalConfig, "examples")
@json_option
@option(EvalConfig, "backend", type=click.Choice(BACKENDS))
@threads_option
@executor_options
def eval_(env, model, adapter, adapters, merge, seeds, tasks_file, as_json, threads, **kwargs):
    """Mean score with a 95% confidence interval (per sub-skill too) of a policy: base, one
    --adapter, routed --adapters, or --adapters --merge."""
    if adapter and adapters:
        raise UsageError("--adapter and --adapters conflict: give one adapter, or a folder of them")
    if merge and not adapters:
        raise UsageError("--merge needs --adapters (the folder of adapters to merge)")
    if not tasks_file and not env:
        raise UsageError("give ENV or --tasks FILE")
    if tasks_file and env:
        raise UsageError(f"give ENV or --tasks FILE, not both (--tasks names each task's env; {env} "
                         "would be ignored)")
    config = settings(EvalConfig, kwargs)
    tasks = read_tasks(tasks_file) if tasks_file else [{"env": env, "seed": s} for s in parse_seeds(seeds)]
    _adapter(adapter)
    _need_train_extra()
    from trainers.evaluate import evaluate
    from trainers.policy import load_policy, set_threads
    from trainers.router import RoutedPolicy, merged_policy
    set_threads(_threads(threads))
    if adapters and merge:
        policy = merged_policy(_model(model), adapters)
    elif adapters:
        policy = RoutedPolicy.load(_model(model), adapters, examples=config.examples)
    else:
        policy = load_policy(_model(model), adapter=adapter)
    with executor_from(kwargs) as executor, Display("evaluating", quiet=as_json) as display:
        result = evaluate(policy, tasks, config, executor=executor, progress=display)
    if as_json:
        emit_json(result.to_dict())
        return
    from rich.table import Table
    table = Table(title="envforge eval")
    for col in ("slice", "n", "mean", "95% CI"):
        table.add_column(col)
    rows = [("overall", result.overall)] + list(result.per_skill.items()) + list(result.per_env.items())
    for name, m in rows:
        table.add_row(name, str(m["n"]), f"{m['mean']:.3f}" if m["mean"] is not None else "-",
                      f"[{m['ci_low']:.3f}, {m['ci_high']:.3f}]" if m["mean"] is not None else "-")
    console().print(table)


# ----------------------------------------------------------------------------- demo
# (envforge/demo: the whole loop on a small agent made locally; see docs/demo.md)

@main.command()
@option(DemoConfig, "seed")
@click.option("--out", "out_dir", default="demo_out", show_default=True,
              help="Folder for results.json, report.html, figures, the model, envs and adapters. "
                   "A run of the same settings there is resumed (its base agent kept, its adapters' "
                   "training resumed); one of other settings is replaced, keeping its base agent where only "
                   "--quick or what comes after the base agent differs.")
@option(DemoConfig, "quick", is_flag=True)
@option(DemoConfig, "threads")
@option(DemoConfig, "device")
@option(DemoConfig, "size")
@option(DemoConfig, "backend", type=click.Choice(BACKENDS))
@click.option("--fresh", is_flag=True, help="Start over even where --out holds a run of the same settings.")
@json_option
def demo(seed, out_dir, quick, threads, device, size, backend, fresh, as_json):
    """Run TRACE end to end offline: make a small agent with planted deficits, identify them,
    synthesize and audit envs, train adapters, route, and compare with the baselines on held-out
    target tasks. Progress on stderr; a table on stdout; results.json and report.html in --out."""
    _need_train_extra()
    from envforge.demo.report import print_table
    from envforge.demo.run import check_out, clean, run_demo
    cfg = DemoConfig.for_run(seed=seed, quick=quick, threads=threads, device=device, size=size, backend=backend)
    out = out_folder(out_dir, "--out")
    if fresh:  # only once the settings are known to be good, and only a demo's folder (run_demo checks too)
        check_out(out)
        clean(out)
    results = run_demo(cfg, out, progress=lambda step: click.echo(step.text, err=True))
    if as_json:
        click.echo(json.dumps(results, indent=2))
        return
    print_table(results, sys.stdout)
    click.echo(f"wrote {out / 'results.json'} and {out / 'report.html'}")
