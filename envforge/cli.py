"""The command line: parse, call one library function, print, map errors to exit codes.

Exit codes: 0 success, 1 a run failed or an input was bad (an env rejected, a file unreadable),
2 usage error, 130 interrupted. Heavy modules are imported inside the commands.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from envforge import __version__
from envforge.errors import EnvforgeError, UsageError


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


def console():
    """A rich console for tables on stdout; wide enough when stdout is a pipe or a file."""
    from rich.console import Console
    return Console() if sys.stdout.isatty() else Console(width=160)


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
@click.option("--budget", type=click.FloatRange(1, 86_400), default=120.0, show_default=True,
              help="Seconds the dynamic checks of one env may take in all.")
@click.option("--no-report", is_flag=True, help="Do not write report.json beside env folders.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout.")
def audit(paths, target, static_only, backend, seeds, call_timeout, memory_mb, budget, no_report, as_json):
    """Audit env folders (or env.py files): static safety, schema fidelity, dynamic properties.

    Exit 0 when every env is accepted, 1 when any is rejected, 2 on usage errors.
    """
    from envforge.contract import Limits
    from envforge.gate import audit as run_audit, resolve_env
    from envforge.gate.dynamic import GateSettings
    from envforge.targets import load_target

    for p in paths:  # fail fast on usage errors before any long work
        resolve_env(p)
    if target and target != "example" and not Path(target).exists():
        raise UsageError(f"--target {target}: no such folder or file; give a target folder, a JSON "
                         "file of tool schemas, or 'example'")
    tgt = load_target(target) if target else None
    settings = GateSettings(seeds=seeds, budget_s=budget,
                            limits=Limits(call_timeout_s=call_timeout, memory_mb=memory_mb))
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


# ----------------------------------------------------------------------------- identify
# (capability identification: see envforge/identify.py)

@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["auto", "tau2", "tau-bench", "jsonl"]),
              default="auto", show_default=True, help="Trajectory file format (auto: by content).")
@click.option("--labeler", type=click.Choice(["structural", "llm"]), default="structural",
              show_default=True, help="structural: offline rules; llm: an OpenAI-compatible model.")
@click.option("--target", "-t", help="Target folder (its tool metadata says which tools write). "
              "Default: read/write from tool names.")
@click.option("--runs", type=int, help="N runs (default 10, the paper's official code).")
@click.option("--min-runs", type=int, help="K: runs a capability must be kept in "
              "(default 80% of --runs rounded up: 8 of 10, 1 of 1).")
@click.option("--delta", type=float, help="Minimum gap ER- - ER+ (default 0.20, the paper).")
@click.option("--rho", type=float, help="Minimum coverage (default 0.10, the paper).")
@click.option("--success-threshold", type=float, default=1.0, show_default=True,
              help="A trajectory succeeds when its reward is at least this.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the runs' resampling.")
@click.option("--out", "-o", default="capabilities.json", show_default=True,
              help="Where to write the result (what 'envforge synth --from' reads).")
@click.option("--plot", "plot_path", help="PNG of gap against coverage (default: --out with .png).")
@click.option("--no-plot", is_flag=True, help="Do not draw the plot.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--model", help="LLM labeller: the model the endpoint serves "
              "(endpoint and key from OPENAI_BASE_URL / OPENAI_API_KEY).")
@click.option("--concurrency", type=int, help="LLM labeller: calls in flight (default 8).")
@click.option("--rate-limit", type=float, help="LLM labeller: at most this many requests per second.")
@click.option("--cache-dir", help="LLM labeller: cache folder (default ~/.cache/envforge/llm).")
@click.option("--no-cache", is_flag=True, help="LLM labeller: neither read nor write the cache.")
def identify(paths, fmt, labeler, target, runs, min_runs, delta, rho, success_threshold, seed,
             out, plot_path, no_plot, as_json, model, concurrency, rate_limit, cache_dir, no_cache):
    """Find the capabilities an agent lacks by contrasting its successes and failures.

    PATHS are tau2-bench Results files or directories, tau-bench v1 result lists, envforge JSONL
    files, or folders of them. Writes capabilities.json and a plot; prints a table.
    """
    from pathlib import Path

    from envforge import identify as ident
    from envforge.errors import InputError
    from envforge.trajectories import load_trajectories

    given = {"runs": runs, "min_runs": min_runs, "delta": delta, "rho": rho,
             "concurrency": concurrency, "rate_limit": rate_limit, "cache_dir": cache_dir}
    config = ident.IdentifyConfig(
        labeler=labeler, success_threshold=success_threshold, seed=seed, model=model,
        cache=not no_cache, progress=not as_json and sys.stderr.isatty(),
        **{k: v for k, v in given.items() if v is not None})
    if labeler == "llm" and not model:
        raise click.UsageError("--labeler llm needs --model (the model your endpoint serves)")
    meta = None
    if target:
        from envforge.targets import load_target
        meta = load_target(target).meta
    trajectories = load_trajectories(paths, format=fmt, success_threshold=success_threshold)
    report = ident.identify(trajectories, config, meta=meta)
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as e:
        raise InputError(f"{out}: cannot write the result ({e.strerror})") from None
    drawn = None
    if not no_plot:
        drawn = ident.plot(report, plot_path or Path(out).with_suffix(".png"))
        if drawn is None:
            click.echo("warning: matplotlib is not installed; no plot drawn (pip install matplotlib)",
                       err=True)
    if as_json:
        emit_json(report)
        return
    con = console()
    con.print(ident.table(report))
    kept = [c["name"] for c in report["capabilities"] if c["retained"]]
    con.print(f"kept {len(kept)}: {', '.join(kept) or 'none'}; wrote {out}"
                  + (f" and {drawn}" if drawn else ""), highlight=False)
