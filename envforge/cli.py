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
    """Turns envforge's errors into one clear line and the right exit code, never a traceback;
    lists the commands in the pipeline's order."""

    ORDER = ("demo", "identify", "synth", "audit", "sandbox", "calibrate", "train", "route", "eval")

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: (self.ORDER.index(n) if n in self.ORDER else len(self.ORDER), n))

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
@click.option("--backend", type=click.Choice(["auto", "process", "docker"]), default="auto",
              show_default=True, help="Sandbox for the dynamic checks (auto: process, else docker).")
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

    for p in paths:  # fail fast on usage errors before any long work
        resolve_env(p)
    tgt = _target(target) if target else None
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
        emit_json({"results": [r.to_dict() for r in reports]})  # each as its report.json
    sys.exit(0 if all(r.accepted for r in reports) else 1)


def _target(spec: str):
    """The --target of audit, identify and synth: one that does not exist is a usage error
    (exit 2); one that exists but is malformed is a TargetError (exit 1)."""
    from envforge.targets import load_target
    if spec != "example" and not Path(spec).exists():
        raise UsageError(f"--target {spec}: no such folder or file; give a target folder (holding "
                         "agent_tools.openai.json or tools.json), a JSON file of tool schemas, or 'example'")
    return load_target(spec)


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

    with _status("building the sandbox image") as status:
        tag = build_image(base=base, progress=status)
    click.echo(f"built {tag} (also tagged envforge-sandbox:latest)")


@sandbox_group.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout.")
def sandbox_doctor(as_json):
    """Say which sandbox backends work on this machine, and why not (with the fix).

    Exit 0 when at least one backend works, 1 when none does.
    """
    from rich.table import Table

    from sandbox.base import diagnose

    rows = diagnose()
    usable = [r for r in rows if r["ok"] and r["backend"] not in ("process/seccomp",
                                                                 "process/channel")]
    if as_json:
        emit_json({"backends": rows})
    else:
        table = Table()
        table.add_column("backend", style="bold", no_wrap=True)
        table.add_column("works", no_wrap=True)
        table.add_column("how it isolates, or why not and the fix", overflow="fold")
        for r in rows:
            table.add_row(r["backend"], "[green]yes[/green]" if r["ok"] else "[red]no[/red]",
                          r["detail"])
        console().print(table)
    sys.exit(0 if usable else 1)


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
        meta = _target(target).meta
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
@click.option("--capability", "-c", help="The capability to train, e.g. \"precondition verification\".")
@click.option("--description", "-d", default="", help="What the capability means (helps the LLM; "
              "also used to find the nearest template family).")
@click.option("--from", "from_file", help="A capabilities.json from 'envforge identify': synthesize "
              "every retained capability, in parallel.")
@click.option("--all", "include_all", is_flag=True, help="With --from: also the capabilities not retained.")
@click.option("--trajectories", multiple=True, help="With --from and a capabilities.json of an older "
              "identify (without example_trajectories): trajectory files whose failures of the task "
              "ids it lists give the LLM example trajectories.")
@click.option("--target", "-t", required=True, help="Target folder, tool-schema JSON file, or 'example'.")
@click.option("--llm", "synthesizer", type=click.Choice(["auto", "template", "openai"]), default="auto",
              show_default=True, help="auto: openai when OPENAI_BASE_URL/OPENAI_API_KEY and --model are "
              "set, else the offline template synthesizer.")
@click.option("--model", help="The model the endpoint serves (endpoint and key from OPENAI_BASE_URL / "
              "OPENAI_API_KEY).")
@click.option("--attempts", type=click.IntRange(1, 50), default=5, show_default=True,
              help="LLM: attempts per capability (the first and its repairs).")
@click.option("--out", "-o", "out_dir", default="generated_envs", show_default=True,
              help="Folder of env folders (<out>/<slug>/env.py, manifest.json, report.json).")
@click.option("--force", is_flag=True, help="Overwrite an env the gate accepted before.")
@click.option("--seeds", type=click.IntRange(2, 10_000), default=50, show_default=True,
              help="Gate: seeds per dynamic property.")
@click.option("--backend", type=click.Choice(["auto", "process", "docker"]), default="auto",
              show_default=True, help="Gate: sandbox for the dynamic checks (as for audit).")
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
              help="With --from: capabilities synthesized at once.")
@click.option("--temperature", type=float, default=0.2, show_default=True, help="LLM: sampling temperature.")
@click.option("--max-tokens", type=int, help="LLM: the most tokens per reply.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 3600), default=300, show_default=True,
              help="LLM: seconds one request may take (then it is retried).")
@click.option("--price-per-1k", "price", help="LLM: USD per 1,000 prompt,completion tokens, for the "
              "cost in manifest.json (e.g. 0.15,0.6).")
@click.option("--cache-dir", help="LLM: cache folder (default ~/.cache/envforge/llm).")
@click.option("--no-cache", is_flag=True, help="LLM: neither read nor write the cache.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout.")
def synth(capability, description, from_file, include_all, trajectories, target, synthesizer, model,
          attempts, out_dir, force, seeds, backend, concurrency, temperature, max_tokens, timeout_s,
          price, cache_dir, no_cache, as_json):
    """Write a training environment per capability and repair it until the gate accepts it.

    One capability (--capability) or every retained one of an identification run (--from). Exit 0
    when every env is accepted, 1 when any is not, 2 on usage errors.
    """
    from envforge import synth as S

    if bool(capability) == bool(from_file):
        raise UsageError("give either --capability TEXT or --from capabilities.json")
    tgt = _target(target)
    config = S.SynthConfig(synthesizer=synthesizer, model=model, attempts=attempts, out_dir=out_dir,
                           force=force, seeds=seeds, backend=backend, concurrency=concurrency,
                           temperature=temperature, max_tokens=max_tokens, timeout_s=timeout_s,
                           cache_dir=cache_dir, cache=not no_cache, price_per_1k=_price(price))
    kind = S.resolve_synthesizer(config)
    if capability:
        specs = [S.CapabilitySpec(capability, description)]
        if kind == "template":
            S.match_family(capability, description)  # exit 2 with the families before any work
    else:
        loaded = None
        if trajectories:
            from envforge.trajectories import load_trajectories
            loaded = load_trajectories(list(trajectories))
        specs = S.load_capabilities(from_file, retained_only=not include_all, trajectories=loaded)
        if not specs:
            raise click.ClickException(f"{from_file} has no retained capability to synthesize "
                                       "(pass --all to take every capability it lists)")
    if not as_json and synthesizer == "auto":
        click.echo(f"synthesizer: {kind}" + (f" ({model})" if kind == "openai" else
                   " (offline; set OPENAI_BASE_URL and --model for the LLM path)"), err=True)
    label = S.target_label(target)
    if capability:
        with _status(f"synthesizing {capability!r}", quiet=as_json) as status:
            results = [S.synthesize(specs[0], tgt, config, progress=lambda s: status(f"{capability}: {s}"),
                                    label=label)]
    else:
        results = S.synthesize_batch(specs, tgt, config, progress=not as_json and sys.stderr.isatty())
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
        errors = [f for f in (last.findings if last else []) if f.get("severity") == "error"]
        note = r.error or ("already accepted; kept (--force to redo)" if r.skipped else
                           "; ".join(f"{f['check']}: {f['message'][:120]}" for f in errors[:3]))
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


_backend_opt = click.option("--backend", type=click.Choice(["auto", "process", "docker"]), default="auto",
                            show_default=True, help="Sandbox the env runs in.")
_threads_opt = click.option("--threads", type=click.IntRange(1, 256), default=1, show_default=True,
                            help="torch intra-op threads (on a busy 2-core CPU, 2 ran ~10x slower than 1).")


@main.command()
@click.argument("envs", nargs=-1, required=True)
@click.option("--model", "-m", required=True, help="Base model: a local folder (from_pretrained).")
@click.option("--out", "-o", "out_dir", default="adapters", show_default=True,
              help="Adapters go to OUT/<env slug>/ (peft safetensors, manifest.json, reward_curve.png).")
@click.option("--iterations", type=click.IntRange(1), default=40, show_default=True, help="(paper: 40)")
@click.option("--groups", type=click.IntRange(1), default=4, show_default=True, help="Seeds per iteration (paper: 4).")
@click.option("--group-size", type=click.IntRange(2), default=4, show_default=True, help="Rollouts per seed (paper: 4).")
@click.option("--lr", type=float, default=1e-5, show_default=True, help="AdamW learning rate (paper: 1e-5).")
@click.option("--rank", type=click.IntRange(1), default=32, show_default=True, help="LoRA rank (paper: 32).")
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--kl", type=float, default=0.0, show_default=True, help="KL coefficient (0: none).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--no-resume", is_flag=True, help="Start afresh even when OUT/<slug>/checkpoint exists.")
@_backend_opt
@_threads_opt
def train(envs, model, out_dir, iterations, groups, group_size, lr, rank, max_new_tokens, kl, seed,
          device, no_resume, backend, threads):
    """GRPO: one LoRA adapter per ENV (a slug of generated_envs/ or an env folder). Resumes from
    OUT/<slug>/checkpoint after a crash or Ctrl-C unless --no-resume."""
    _need_train_extra()
    from trainers.grpo import GRPOConfig, GRPOTrainer
    from trainers.policy import load_policy, set_threads

    from envforge.gym import resolve
    set_threads(threads)
    config = GRPOConfig(iterations=iterations, num_groups=groups, group_size=group_size,
                        learning_rate=lr, lora_rank=rank, lora_alpha=2 * rank,
                        max_new_tokens=max_new_tokens, kl_coef=kl, seed=seed, device=device,
                        backend=backend, threads=threads)

    spent: list[float] = []

    def show(s):
        spent.append(s.seconds)
        eta = sum(spent) / len(spent) * (iterations - s.iteration)
        click.echo(f"  iter {s.iteration:3d}/{iterations}  reward {s.reward_mean:.3f} ± {s.reward_std:.3f}  "
                   f"constant groups {s.constant_fraction:.0%}  trained {s.groups_trained}/{s.groups_collected}  "
                   f"{s.tokens_per_s:,.0f} tok/s  loss {s.loss:+.4f}  {s.seconds:.1f}s (generate "
                   f"{s.generate_s:.1f}s, env wait {s.env_wait_s:.1f}s, loss {s.loss_s:.1f}s)  "
                   f"ETA {eta:.0f}s" + (f"  errors {s.errors}" if s.errors else ""))
    for env in envs:
        slug = resolve(env).parent.name
        out = Path(out_dir) / slug
        click.echo(f"train {slug} -> {out}")
        spent.clear()
        trainer = GRPOTrainer(load_policy(model, device=device), env, config, out=out, base_model=model,
                              resume=not no_resume, progress=show,
                              on_resume=lambda i: click.echo(f"  resumed at iteration {i}"))
        result = trainer.train()
        curve = result.manifest["reward_curve"]
        click.echo(f"  saved {out} (reward {curve[0]:.3f} -> {curve[-1]:.3f}; reward_curve.png)")


@main.command()
@click.argument("env")
@click.option("--model", "-m", required=True, help="Base model: a local folder.")
@click.option("--adapter", help="Calibrate this adapter instead of the base policy.")
@click.option("--groups", type=click.IntRange(1), default=8, show_default=True)
@click.option("--group-size", type=click.IntRange(2), default=16, show_default=True, help="(paper: 16)")
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_backend_opt
@_threads_opt
def calibrate(env, model, adapter, groups, group_size, max_new_tokens, temperature, seed, as_json,
              backend, threads):
    """Base-policy rollouts against the paper's targets: mean reward and success in [0.2, 0.6],
    reward std >= 0.05, at most 20% constant groups. Exit 1 when a target is missed."""
    _need_train_extra()
    from trainers.calibrate import CalibrationConfig, calibrate as run
    from trainers.policy import load_policy, set_threads
    set_threads(threads)
    report = run(load_policy(model, adapter=adapter), env, CalibrationConfig(
        groups=groups, group_size=group_size, max_new_tokens=max_new_tokens, temperature=temperature,
        seed=seed, backend=backend))
    if as_json:
        emit_json(report)
    else:
        for c in report["checks"]:
            click.echo(f"  {'ok  ' if c['ok'] else 'MISS'} {c['check']:<16} {c['value']:.3f}  target {c['target']}")
        for a in report["advice"]:
            click.echo(f"  - {a}")
        click.echo("calibrated: GRPO will get a signal" if report["ok"] else "not calibrated")
    sys.exit(0 if report["ok"] else 1)


@main.command()
@click.option("--model", "-m", required=True, help="Base model: a local folder.")
@click.option("--adapters", "-a", required=True, help="A folder of adapters (as `envforge train` writes).")
@click.option("--task", "tasks", multiple=True, help="A task text (repeatable).")
@click.option("--tasks", "tasks_file", help="A file of tasks: one per line, or JSONL with a \"task\" field.")
@click.option("--examples", type=click.IntRange(0, 10), default=2, show_default=True,
              help="Examples per capability shown to the router.")
@_threads_opt
def route(model, adapters, tasks, tasks_file, examples, threads):
    """Pick an adapter (or none) per task from the base model's label-token logits; JSON out."""
    _need_train_extra()
    from envforge.errors import InputError
    from trainers.policy import set_threads
    from trainers.router import Router
    texts = list(tasks)
    if tasks_file:
        try:
            lines = Path(tasks_file).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"cannot read the task file {tasks_file}: {e}") from None
        for line in lines:
            if line.strip():
                try:
                    item = json.loads(line)
                    texts.append(item["task"] if isinstance(item, dict) else str(item))
                except (ValueError, KeyError):
                    texts.append(line.strip())
    if not texts:
        raise UsageError("give --task TEXT or --tasks FILE")
    set_threads(threads)
    router = Router.load(model, adapters, examples=examples)
    emit_json([router.route(t) for t in texts])


@main.command("eval")
@click.argument("env", required=False)
@click.option("--model", "-m", required=True, help="Base model: a local folder.")
@click.option("--adapter", help="Evaluate this one adapter.")
@click.option("--adapters", help="A folder of adapters: routed per episode (or merged with --merge).")
@click.option("--merge", is_flag=True, help="With --adapters: merge them into one instead of routing.")
@click.option("--seeds", default="0-19", show_default=True, help="Env seeds: 'A-B' or 'a,b,c'.")
@click.option("--tasks", "tasks_file", help="Instead of ENV: a JSON/JSONL list of {\"env\", \"seed\"}.")
@click.option("--max-new-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0: greedy.")
@click.option("--examples", type=click.IntRange(0, 10), default=2, show_default=True,
              help="Routed --adapters: examples per capability shown to the router.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_backend_opt
@_threads_opt
def eval_(env, model, adapter, adapters, merge, seeds, tasks_file, max_new_tokens, temperature,
          examples, as_json, backend, threads):
    """Mean score with a 95% confidence interval (per sub-skill too) of a policy: base, one
    --adapter, routed --adapters, or --adapters --merge."""
    if adapter and adapters:
        raise UsageError("--adapter and --adapters conflict: give one adapter, or a folder of them")
    if merge and not adapters:
        raise UsageError("--merge needs --adapters (the folder of adapters to merge)")
    if not tasks_file and not env:
        raise UsageError("give ENV or --tasks FILE")
    ids = []
    if not tasks_file:
        try:
            if "-" in seeds and "," not in seeds:
                a, b = seeds.split("-")
                ids = list(range(int(a), int(b) + 1))
            else:
                ids = [int(s) for s in seeds.split(",")]
        except ValueError:
            pass
        if not ids:
            raise UsageError(f"--seeds {seeds!r}: want a range 'A-B' with A <= B (e.g. 0-19) or a "
                             "list 'a,b,c' of integers (e.g. 0,5,9)")
    _need_train_extra()
    from trainers.evaluate import evaluate, read_tasks
    from trainers.policy import load_policy, set_threads
    from trainers.router import RoutedPolicy, merged_policy
    set_threads(threads)
    tasks = read_tasks(tasks_file) if tasks_file else [{"env": env, "seed": s} for s in ids]
    if adapters and merge:
        policy = merged_policy(model, adapters)
    elif adapters:
        policy = RoutedPolicy.load(model, adapters, examples=examples)
    else:
        policy = load_policy(model, adapter=adapter)
    result = evaluate(policy, tasks, max_new_tokens=max_new_tokens, temperature=temperature,
                      backend=backend)
    if as_json:
        emit_json(result)
        return
    from rich.table import Table
    table = Table(title="envforge eval")
    for col in ("slice", "n", "mean", "95% CI"):
        table.add_column(col)
    rows = [("overall", result["overall"])] + list(result["per_skill"].items()) + \
        list(result.get("per_env", {}).items())
    for name, m in rows:
        table.add_row(name, str(m["n"]), f"{m['mean']:.3f}" if m["mean"] is not None else "-",
                      f"[{m['ci_low']:.3f}, {m['ci_high']:.3f}]" if m["mean"] is not None else "-")
    console().print(table)


# ----------------------------------------------------------------------------- demo
# (envforge/demo: the whole loop on a small agent made locally; see docs/demo.md)

@main.command()
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds every stage.")
@click.option("--out", "out_dir", default="demo_out", show_default=True,
              help="Folder for results.json, report.html, figures, the model, envs and adapters "
                   "(what an earlier demo left there is replaced).")
@click.option("--quick", is_flag=True, help="Smaller budgets (a few minutes; what CI runs).")
@click.option("--threads", type=click.IntRange(1, 256), default=1, show_default=True,
              help="torch threads (1 is fastest on a small or busy CPU).")
def demo(seed, out_dir, quick, threads):
    """Run TRACE end to end offline: make a small agent with planted deficits, identify them,
    synthesize and audit envs, train adapters, route, and compare with the baselines on held-out
    target tasks. Progress on stderr; a table on stdout; results.json and report.html in --out."""
    _need_train_extra()
    from envforge.demo.report import print_table
    from envforge.demo.run import DemoConfig, clean, run_demo
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder")
    clean(out)
    results = run_demo(DemoConfig.for_run(seed=seed, quick=quick, threads=threads), out)
    print_table(results, sys.stdout)
    click.echo(f"wrote {out / 'results.json'} and {out / 'report.html'}")
