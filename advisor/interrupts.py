"""Ctrl-C and SIGTERM, one behaviour at every moment: the run stops at a point where the study is whole.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be. Inside Optuna's trial loop that
may be the middle of its own bookkeeping (taking the next queued trial, storing a finished one), which
Optuna does not expect: a queued trial was left failed before its parameters were stored, and
``_run_trial`` broke with an ``UnboundLocalError``. So where Optuna's loop runs (:func:`deferred`) a signal
is only noted, and raised at the loop's next :func:`check`; where the objective evaluates a plan
(:func:`interruptible`, the long part of a trial) it is raised at once, so the user does not wait for the
trial, and Optuna stores that trial as failed before it passes the interrupt on. The first signal starts
the stop; later ones are noted, never raised, so the cleanup (workers stopped, the study released)
runs to its end. The handlers are installed by :func:`signals_handled`, around a command.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import FrameType


@dataclass
class _State:
    defer: bool = False  # inside Optuna's loop, outside an evaluation
    stopping: bool = False  # a signal was raised: the stop is under way
    noted: int | None = None  # a signal that came while deferred, not raised yet


_state = _State()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _state.defer or _state.stopping:
        _state.noted = signum
        return
    _state.stopping = True
    raise KeyboardInterrupt


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # where Python runs signal handlers


@contextmanager
def signals_handled() -> Iterator[None]:
    """SIGINT and SIGTERM both interrupt as Ctrl-C does, under the rules above; a signal the process was told
    to ignore (SIGINT in a background job) stays ignored. The previous handlers come back after. Inside another
    ``signals_handled`` (the CLI's, then a workflow's) it changes nothing: the stop under way stays under way."""
    if not _in_main_thread() or _on_signal in (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)):
        yield
        return
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _on_signal)
    saved = replace(_state)
    _set(_State())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _set(saved)


def _set(state: _State) -> None:
    _state.defer, _state.stopping, _state.noted = state.defer, state.stopping, state.noted


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
    """Raise ``KeyboardInterrupt`` for a signal noted while deferred (once: the stop is then under way)."""
    if _state.noted is not None and not _state.stopping:
        _state.noted = None
        _state.stopping = True
        raise KeyboardInterrupt
