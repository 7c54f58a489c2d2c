"""docs/cli.md is generated from the click commands (tools/gen_cli_docs.py) and must match them."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent


def generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "tools" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_cli_md_is_up_to_date():
    from envforge.cli import main

    current = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert current == generator().render(main), (
        "docs/cli.md is out of date with envforge/cli.py: run python tools/gen_cli_docs.py")


def test_every_command_is_documented():
    from envforge.cli import main

    text = generator().render(main)
    ctx = click.Context(main, info_name="envforge")
    for name in main.list_commands(ctx):
        assert f"## `envforge {name}`" in text
        cmd = main.get_command(ctx, name)
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert f"`{p.opts[0]}`" in text


def test_the_check_mode_passes_on_this_checkout():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_cli_docs.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@click.group()
def toy():
    """A toy CLI.

    Its second paragraph.\f
    Not for users.
    """


@toy.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--mode", type=click.Choice(["a", "b"]), default="b", help="Which mode.")
@click.option("--seeds", type=click.IntRange(2, 99), default=50, help="Seeds | per property.")
@click.option("--fast", is_flag=True, help="Go fast.")
@click.option("--name", "-n", required=True, help="A name.")
@click.option("--tag", multiple=True, help="Tags.")
@click.option("--secret", hidden=True)
@click.option("--cache/--no-cache", default=True, help="Use the cache.")
@click.argument("rest", nargs=-1, metavar="")
def run(paths, mode, seeds, fast, name, tag, secret, cache, rest):
    """Run things."""


@toy.group()
def sub():
    """A sub-group."""


@sub.command("deep")
@click.option("--ratio", type=click.FloatRange(0, 1), default=0.5)
def deep(ratio):
    """A nested command."""


def test_the_renderer_shows_usage_types_defaults_and_help():
    text = generator().render(toy, name="toy")
    assert "[`toy run`](#toy-run) | Run things. |" in text
    assert "```\ntoy run [OPTIONS] PATHS...\n```" in text
    assert "Its second paragraph." in text and "Not for users." not in text
    assert "| `PATHS` | text, one or more | yes |" in text
    assert "| `--mode` | `a` \\| `b` | `b` | Which mode. |" in text
    assert "| `--seeds` | integer, 2<=x<=99 | `50` | Seeds \\| per property. |" in text
    assert "| `--fast` | flag | off | Go fast. |" in text
    assert "| `--name`, `-n` | text |  | A name. (required) |" in text
    assert "| `--tag` | text, repeatable |  | Tags. |" in text
    assert "| `--cache`, `--no-cache` | flag | `--cache` | Use the cache. |" in text
    assert "--secret" not in text and "--help" not in text and "REST" not in text
    assert "## `toy sub deep`" in text and "| `--ratio` | float, 0<=x<=1 | `0.5` |  |" in text
