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


# ----------------------------------------------------------------------------- identify
# (capability identification: see envforge/identify.py)
