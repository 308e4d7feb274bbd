"""What every CLI module shares: the consoles, the debug switch and the one error exit."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from advisor.errors import AdvisorError

out = Console(width=None if sys.stdout.isatty() else 160)  # results
err = Console(stderr=True, soft_wrap=True)  # progress, warnings, errors
DEBUG = {"on": False}
F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(fn: F | None = None, *, error_exit: int | None = None, catch_all: bool = False) -> Any:
    """Turn known errors into one `Error:` line and their exit code (tracebacks only with --debug).

    ``error_exit`` forces one exit code for every error (a CI gate such as `recheck`, where
    an error must never read as a pass or a regression); ``catch_all`` treats unexpected
    exceptions the same way instead of letting them raise.
    """

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return f(*args, **kwargs)
            except typer.Exit:
                raise
            except AdvisorError as exc:
                if DEBUG["on"]:
                    raise
                err.print(f"[bold red]Error:[/] {exc}", markup=True, highlight=False)
                raise typer.Exit(error_exit if error_exit is not None else exc.exit_code) from None
            except Exception as exc:
                if not catch_all or DEBUG["on"]:
                    raise
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                err.print(f"[bold red]Error:[/] unexpected {type(exc).__name__}: {first} "
                          "(rerun with --debug for the traceback)", markup=True, highlight=False)
                raise typer.Exit(error_exit if error_exit is not None else 1) from None

        return wrapper  # type: ignore[return-value]

    return deco(fn) if fn is not None else deco
