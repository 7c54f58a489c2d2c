"""Write docs/cli.md, the CLI reference, from the click commands of ``envforge.cli.main``.

    python tools/gen_cli_docs.py            # rewrite docs/cli.md
    python tools/gen_cli_docs.py --check    # exit 1 when docs/cli.md is out of date

Every command and sub-command, in the order ``envforge --help`` lists them: its usage line, its
help, its arguments, and every option with its value type, default and help. Run it after any
change to a command; tests/test_cli_docs.py fails while docs/cli.md differs from its output.
"""
from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "cli.md"

HEADER = """\
# CLI reference

Generated from the click commands by `python tools/gen_cli_docs.py`: do not edit by hand.
Exit codes of every command (docs/configuration.md): 0 success; 1 the work failed or its answer
is no (an env rejected); 2 a wrong option, or a missing or malformed input; 130 interrupted.
"""


def cell(text: str) -> str:
    """Text fit for one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def help_text(cmd: click.Command) -> str:
    text = cmd.help or cmd.short_help or ""
    return inspect.cleandoc(text.split("\f")[0]).strip()


#: click >= 8.2 marks a parameter without a default with this sentinel (older click: None).
UNSET = getattr(click.core, "UNSET", None)


def default(param: click.Parameter, ctx: click.Context) -> str:
    value = param.get_default(ctx, call=False)
    if callable(value):
        return "computed at run time"
    if getattr(param, "is_flag", False):
        if param.secondary_opts:  # --cache/--no-cache: the one in force by default
            return f"`{param.opts[0] if value else param.secondary_opts[0]}`"
        return "on" if value else "off"
    if value is None or value is UNSET or value == () or value == "":
        return ""
    if isinstance(value, (list, tuple)):
        return "`" + " ".join(str(v) for v in value) + "`"
    return f"`{value}`"


def value_type(param: click.Parameter, ctx: click.Context) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    kind = param.type
    if isinstance(kind, click.Choice):
        text = " | ".join(f"`{c}`" for c in kind.choices)
    else:
        text = kind.name.lower()
        describe = getattr(kind, "_describe_range", None)  # IntRange, FloatRange
        if describe is not None:
            text = f"{text.replace(' range', '')}, {describe()}"
    if param.multiple:
        text += ", repeatable"
    if param.nargs == -1:
        text += ", one or more" if param.required else ", any number"
    return text


def usage(cmd: click.Command, ctx: click.Context) -> str:
    return " ".join([ctx.command_path, *(p for p in cmd.collect_usage_pieces(ctx) if p)])


def render_command(cmd: click.Command, ctx: click.Context) -> list[str]:
    lines = [f"## `{ctx.command_path}`", "", "```", usage(cmd, ctx), "```", ""]
    text = help_text(cmd)
    if text:
        lines += [text, ""]
    params = [p for p in cmd.get_params(ctx) if not getattr(p, "hidden", False)]
    # an argument with an empty metavar is a catch-all the command keeps out of its usage
    arguments = [p for p in params if isinstance(p, click.Argument) and p.metavar != ""]
    options = [p for p in params if isinstance(p, click.Option) and "--help" not in p.opts]
    if arguments:
        lines += ["| argument | value | required |", "|---|---|---|"]
        for p in arguments:
            lines.append(f"| `{p.human_readable_name}` | {cell(value_type(p, ctx))} | "
                         f"{'yes' if p.required else 'no'} |")
        lines.append("")
    if options:
        lines += ["| option | value | default | help |", "|---|---|---|---|"]
        for p in options:
            names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
            extra = " (required)" if p.required else ""
            lines.append(f"| {names} | {cell(value_type(p, ctx))} | {cell(default(p, ctx))} | "
                         f"{cell((p.help or '') + extra)} |")
        lines.append("")
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                lines += render_command(sub, click.Context(sub, info_name=name, parent=ctx))
    return lines


def render(group: click.Group, name: str = "envforge") -> str:
    ctx = click.Context(group, info_name=name)
    top = [f"| [`{name} {c}`](#{name}-{c}) | {cell(group.get_command(ctx, c).get_short_help_str(200))} |"
           for c in group.list_commands(ctx) if not group.get_command(ctx, c).hidden]
    lines = [HEADER, "| command | what it does |", "|---|---|", *top, ""]
    lines += render_command(group, ctx)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is out of date")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from envforge.cli import main as cli

    text = render(cli)
    current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
    if args.check:
        if current != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python tools/gen_cli_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    if current != text:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
