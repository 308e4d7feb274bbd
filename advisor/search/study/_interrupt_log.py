"""An interrupt (Ctrl-C, SIGTERM) inside a trial: Optuna logs the failed trial with its parameters and
traceback, then its value; the user asked for it, so the one-line resume hint is all that shows."""

from __future__ import annotations

import logging


class _DropInterruptTraceback(logging.Filter):
    """Optuna logs a failed trial with its parameters and traceback, then its value; for an interrupt
    (Ctrl-C, SIGTERM) the user asked for it, so the one-line resume hint is all that should show."""

    def __init__(self) -> None:
        super().__init__()
        self.interrupted: set[str] = set()  # "Trial N" prefixes whose interrupt was dropped

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("optuna"):
            return True
        msg = str(record.msg)
        trial = " ".join(msg.split(" ", 2)[:2])
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            self.interrupted.add(trial)
            return False
        if trial in self.interrupted and msg.startswith(f"{trial} failed with value"):
            self.interrupted.discard(trial)  # one line each: a later study's trial of that number logs as usual
            return False
        return True


def silence_interrupt_tracebacks() -> None:
    """Filter on Optuna's handlers and the root logger's: a logger's own filters do not see the records its
    children (``optuna.study._optimize``, which logs failed trials) pass up to its handlers."""
    root = logging.getLogger("optuna")
    for target in (root, *root.handlers, *logging.getLogger().handlers):
        if not any(isinstance(f, _DropInterruptTraceback) for f in target.filters):
            target.addFilter(_DropInterruptTraceback())
