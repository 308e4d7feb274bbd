"""What every CLI module shares: the consoles, the debug switch and the one error exit."""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer import _click  # typer's own copy of click: its exceptions are the ones typer raises

from advisor.errors import AdvisorError, InputError, SetupError
from advisor.files import disk_full_message, name_too_long_message
from advisor.gpu_memory_error import gpu_out_of_memory_message

# Results. On a terminal rich fits them to its width; in a pipe or a file nothing is ever
# wrapped (a script reads whole lines), so: no soft wrapping and no width to fit.
out = Console() if sys.stdout.isatty() else Console(soft_wrap=True, width=100_000)
err = Console(stderr=True, soft_wrap=True)  # progress, warnings, errors
DEBUG = {"on": False}
F = TypeVar("F", bound=Callable[..., Any])
UNEXPECTED_EXIT = 1


def print_error(message: str) -> None:
    """The one `Error:` line on stderr (``message`` is plain text, never rich markup), with the password of any
    storage URL this process was given masked, whatever code path wrote the message."""
    from advisor.search.storage import redact_seen

    message = redact_seen(message)
    err.print(f"[bold red]Error:[/] {escape(message)}", markup=True, highlight=False)


def handle_errors(fn: F | None = None, *, error_exit: int | None = None, catch_all: bool = True,
                  keep_setup_exit: bool = False) -> Any:
    """Turn errors into one `Error:` line and an exit code (tracebacks only with --debug).

    Known errors (:class:`AdvisorError`) exit with their own code; a full disk or a GPU out of memory (the
    environment's) exits 3 with what to free; a path with a name too long for the file system (every path is the
    user's) exits 2; anything else is a bug and exits 1 with the hint to rerun with
    --debug. ``error_exit`` forces one exit code for
    every error (a CI gate such as `recheck`, where an error must never read as a pass or a
    regression); ``keep_setup_exit`` exempts :class:`SetupError` (no GPU, a package missing: exit 3) from it;
    ``catch_all=False`` lets unexpected exceptions raise.
    """

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return f(*args, **kwargs)
            except (typer.Exit, typer.Abort, _click.ClickException):
                raise
            except AdvisorError as exc:
                _traceback_if_debug()
                print_error(str(exc))
                forced = error_exit is not None and not (keep_setup_exit and isinstance(exc, SetupError))
                raise typer.Exit(error_exit if forced else exc.exit_code) from None
            except Exception as exc:
                if (too_long := name_too_long_message(exc)) is not None:  # a path given: bad input
                    _traceback_if_debug()
                    print_error(too_long)
                    raise typer.Exit(error_exit if error_exit is not None else InputError.exit_code) from None
                full = disk_full_message(exc) or gpu_out_of_memory_message(exc)  # the environment's, not a bug
                if full is not None:
                    _traceback_if_debug()
                    print_error(full)
                    raise typer.Exit(error_exit if error_exit is not None else SetupError.exit_code) from None
                if not catch_all:
                    raise
                _traceback_if_debug()
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                print_error(f"unexpected {type(exc).__name__}: {first} (a bug: rerun with --debug for the "
                            "traceback and report it)")
                raise typer.Exit(error_exit if error_exit is not None else UNEXPECTED_EXIT) from None

        return wrapper  # type: ignore[return-value]

    return deco(fn) if fn is not None else deco


def _traceback_if_debug() -> None:
    """With --debug, the traceback of the exception being handled; the exit code stays the same."""
    if DEBUG["on"]:
        traceback.print_exc(file=sys.stderr)
