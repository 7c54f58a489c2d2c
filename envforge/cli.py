"""The command line: parse, call one library function, print, map errors to exit codes.

Exit codes: 0 success, 1 a run failed or an input was bad (an env rejected, a file unreadable),
2 usage error, 130 interrupted. Heavy modules are imported inside the commands.
"""
from __future__ import annotations

import json
import sys

import click

from envforge import __version__
from envforge.errors import EnvforgeError


class Group(click.Group):
    """Turns envforge's errors into one clear line and the right exit code, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except EnvforgeError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=Group)
@click.version_option(__version__, prog_name="envforge")
def main() -> None:
    """envforge: find what an agent lacks, write training environments for it, audit them, train."""


def emit_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


# ----------------------------------------------------------------------------- audit
# (the gate: see envforge/gate)

@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--target", "-t", help="Target folder, tool-schema JSON file, or 'example'. "
              "Default: the target named in each env's manifest.json.")
@click.option("--static-only", is_flag=True, help="Run only the static audit and schema fidelity (no code runs).")
@click.option("--backend", type=click.Choice(["auto", "process"]), default="auto", show_default=True,
              help="Sandbox for the dynamic checks.")
@click.option("--seeds", type=click.IntRange(2, 10_000), default=50, show_default=True,
              help="Seeds per dynamic property.")
@click.option("--call-timeout", type=click.FloatRange(0.1, 600), default=5.0, show_default=True,
              help="Seconds one reset/step/solve call may take.")
@click.option("--memory-mb", type=click.IntRange(256, 1 << 20), default=1024, show_default=True,
              help="Address-space limit of the sandboxed env process, MiB.")
@click.option("--no-report", is_flag=True, help="Do not write report.json beside env folders.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout.")
def audit(paths, target, static_only, backend, seeds, call_timeout, memory_mb, no_report, as_json):
    """Audit env folders (or env.py files): static safety, schema fidelity, dynamic properties.

    Exit 0 when every env is accepted, 1 when any is rejected, 2 on usage errors.
    """
    from envforge.contract import Limits
    from envforge.gate import audit as run_audit, resolve_env
    from envforge.gate.dynamic import GateSettings
    from envforge.targets import load_target

    for p in paths:  # fail fast on usage errors before any long work
        resolve_env(p)
    tgt = load_target(target) if target else None
    settings = GateSettings(seeds=seeds, limits=Limits(call_timeout_s=call_timeout, memory_mb=memory_mb))
    reports = []
    for p in paths:
        with _status(f"auditing {p}", quiet=as_json) as status:
            reports.append(run_audit(p, target=tgt, static_only=static_only, backend=backend,
                                     settings=settings, write_report=not no_report,
                                     progress=lambda s, p=p: status(f"auditing {p}: {s}")))
        if not as_json:
            _print_report(reports[-1])
    if as_json:
        emit_json({"results": [{"path": r.path, "verdict": r.verdict, "target": r.target,
                                "findings": [f.to_dict() for f in r.findings],
                                "stages": {k: round(v, 3) for k, v in r.stages.items()},
                                "stats": r.stats} for r in reports]})
    sys.exit(0 if all(r.accepted for r in reports) else 1)


class _status:
    """A rich spinner on stderr (nothing when quiet or not a terminal); call it to update."""

    def __init__(self, text: str, quiet: bool = False):
        self.text, self.live = text, None
        if not quiet and sys.stderr.isatty():
            from rich.console import Console
            self.live = Console(stderr=True).status(text)

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __call__(self, text: str) -> None:
        if self.live:
            self.live.update(text)

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)


def _print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    colour = "green" if report.accepted else "red"
    title = f"{report.path}: [{colour}]{report.verdict}[/{colour}]" + (f" (target {report.target})" if report.target else "")
    table = Table(title=title, title_justify="left", show_lines=False, expand=False)
    table.add_column("check", style="bold", no_wrap=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("message", overflow="fold")
    for f in report.findings:
        table.add_row(f.check, "[red]error[/red]" if f.severity == "error" else "[yellow]warning[/yellow]", f.message)
    if not report.findings:
        table.add_row("-", "-", "no findings")
    console.print(table)
    stats = report.stats.get("mean_score")
    timing = ", ".join(f"{k} {v:.2f}s" for k, v in report.stages.items())
    if stats:
        console.print(f"  mean scores: {stats}; solved {report.stats.get('solved')}; distinct scenarios "
                      f"{report.stats.get('distinct_scenarios')}; {timing}", highlight=False)
    else:
        console.print(f"  {timing}", highlight=False)


# ----------------------------------------------------------------------------- identify
# (capability identification: see envforge/identify.py)
