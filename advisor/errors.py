"""One exception root for the advisor; the CLI maps each kind to an exit code."""

from __future__ import annotations

from collections.abc import Iterator


class AdvisorError(Exception):
    """Root of every error the advisor raises on purpose (exit code 1)."""

    exit_code = 1


class InputError(AdvisorError):
    """A recipe field, flag or file given by the user is not acceptable (exit code 2)."""

    exit_code = 2


class SetupError(AdvisorError):
    """The environment lacks something the request needs: a GPU, a package (exit code 3)."""

    exit_code = 3


class UnsupportedError(AdvisorError):
    """The request is valid but cannot be done on this hardware (exit code 3)."""

    exit_code = 3


class UnsupportedArchitectureError(UnsupportedError):
    """The model's family has no adapter, or the model is not a decoder-only causal LM (exit code 2).

    A bad model, like any other input the command cannot use: the machine lacks nothing, and every path
    (search, its dry run, eval, export, recheck) exits the same way. An ``UnsupportedError`` still, so the
    energy side's fallbacks (no runtime decoder for a family: price it another way) keep catching it."""

    exit_code = 2


class Interrupted(AdvisorError):
    """The user (Ctrl-C) or the system (SIGTERM) stopped a run; finished work is kept (exit 130)."""

    exit_code = 130


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then the exception it was raised from (or during), and so on; each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
