"""The `advisor` command group: `--debug` anywhere on the line, usage errors as one `Error:` line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from typer import _click  # typer's own copy of click: its exceptions are the ones typer raises
from typer.core import TyperGroup

from advisor.cli.common import print_error
from advisor.errors import Interrupted

DEBUG_FLAG = "--debug"
INTERRUPTED = "interrupted before the command finished; run it again"


def hoist_debug(args: list[str]) -> list[str]:
    """``args`` with ``--debug`` moved in front of the subcommand, wherever it was given
    (before a ``--`` only: what follows ``--`` is never an option)."""
    end = args.index("--") if "--" in args else len(args)
    head, tail = args[:end], args[end:]
    if DEBUG_FLAG not in head:
        return args
    return [DEBUG_FLAG, *[a for a in head if a != DEBUG_FLAG], *tail]


@contextmanager
def usage_errors_as_one_line(subcommand: str | None = None) -> Iterator[None]:
    """click's usage errors (unknown option, bad value, missing argument) printed like every
    other error: one `Error:` line naming the problem and where help is, exit 2.
    ``subcommand`` names the command for errors raised without a context."""
    try:
        yield
    except _click.exceptions.NoArgsIsHelpError:
        raise  # `advisor` alone prints the help
    except _click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        subcommands = ctx.command_path.split(" ")[1:] if ctx is not None else []
        if not subcommands and subcommand:
            subcommands = [subcommand]
        command = " ".join(["advisor", *subcommands])  # the root's name is however it was started
        print_error(f"{exc.format_message()} (see `{command} --help`)")
        raise typer.Exit(exc.exit_code) from None


class AdvisorGroup(TyperGroup):
    def parse_args(self, ctx: _click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_debug(args))

    def make_context(self, info_name: str | None, args: list[str], parent: _click.Context | None = None,
                     **extra: Any) -> _click.Context:
        with usage_errors_as_one_line():
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: _click.Context) -> Any:
        name = next(iter(getattr(ctx, "_protected_args", None) or []), None)  # where typer keeps it
        try:
            with usage_errors_as_one_line(name if name in self.commands else None):
                return super().invoke(ctx)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM that no command turned into its own line (typer: a silent 130)
            print_error(INTERRUPTED)
            raise typer.Exit(Interrupted.exit_code) from None
