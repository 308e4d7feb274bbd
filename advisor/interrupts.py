"""Ctrl-C and SIGTERM, one behaviour at every moment: the run stops at a point where the study is whole.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be. Inside Optuna's trial loop that
may be the middle of its own bookkeeping (taking the next queued trial, storing a finished one), which
Optuna does not expect: a queued trial was left failed before its parameters were stored, and
``_run_trial`` broke with an ``UnboundLocalError``. So where Optuna's loop runs (:func:`deferred`) a signal
is only noted, and raised at the loop's next :func:`check`; where the objective evaluates a plan
(:func:`interruptible`, the long part of a trial) it is raised at once, so the user does not wait for the
trial, and Optuna stores that trial as failed before it passes the interrupt on. Elsewhere it is raised at once,
as Python does with Ctrl-C. A signal stays noted until the command has turned it into its stop
(:func:`stop_taken`): one whose raise Python swallowed (inside a finalizer, where it can only print it) is
raised again at the next :func:`check`, between trials or stages, so it is never lost. Cleanup that must
not be cut (workers stopped, the study released) runs deferred. The handlers are installed by
:func:`signals_handled`, around a command.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import FrameType


@dataclass
class _State:
    defer: bool = False  # inside Optuna's loop, outside an evaluation
    noted: int | None = None  # a signal not yet turned into the command's stop


_state = _State()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _state.noted = signum
    if not _state.defer:
        raise KeyboardInterrupt


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # where Python runs signal handlers


@contextmanager
def signals_handled() -> Iterator[None]:
    """SIGINT and SIGTERM both interrupt as Ctrl-C does, under the rules above; a signal the process was told
    to ignore (SIGINT in a background job) stays ignored. The previous handlers come back after. Inside another
    ``signals_handled`` (the CLI's, then a workflow's) it changes nothing: a signal noted stays noted."""
    if not _in_main_thread() or _on_signal in (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)):
        yield
        return
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _on_signal)
    saved, hook = replace(_state), sys.unraisablehook

    def drop_swallowed_interrupt(unraisable: sys.UnraisableHookArgs) -> None:
        """A KeyboardInterrupt raised inside a finalizer cannot propagate and Python would print its traceback;
        it stays noted and is raised at the next check, so the traceback is noise."""
        if unraisable.exc_type is None or not issubclass(unraisable.exc_type, KeyboardInterrupt):
            hook(unraisable)

    _set(_State())
    sys.unraisablehook = drop_swallowed_interrupt
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is _on_signal:  # unless the command set its own meanwhile
                signal.signal(sig, handler)
        sys.unraisablehook = hook
        _set(saved)


def _set(state: _State) -> None:
    _state.defer, _state.noted = state.defer, state.noted


@contextmanager
def deferred() -> Iterator[None]:
    """A signal that comes in here is noted, not raised (see :func:`check`)."""
    yield from _with_defer(True)


@contextmanager
def interruptible() -> Iterator[None]:
    """A signal raises at once in here, and one noted before raises on entry."""
    yield from _with_defer(False)


def _with_defer(defer: bool) -> Iterator[None]:
    if not _in_main_thread():  # another thread's deferral is no business of the handler's
        yield
        return
    was = _state.defer
    _state.defer = defer
    try:
        if not defer:
            check()
        yield
    finally:
        _state.defer = was


def check() -> None:
    """Raise ``KeyboardInterrupt`` for a signal not yet turned into the stop."""
    if _state.noted is not None:
        raise KeyboardInterrupt


def pending() -> bool:
    """A signal came and is not yet turned into the stop (an error raised now may be its doing)."""
    return _state.noted is not None


def stop_taken() -> None:
    """The command has turned the signal into its stop (its message): nothing is left to raise."""
    _state.noted = None
