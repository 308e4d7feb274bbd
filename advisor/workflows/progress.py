"""Progress of long work, on a terminal and off it.

On a terminal: a rich bar per stage (stage, done/total, elapsed, ETA). Without one (CI logs,
``nohup``, ``2> file``) rich hides its bars, so every stage prints a plain line when it
starts and ends, and a line with done/total, elapsed and ETA at least every
``interval_s`` (60 s by default), from a heartbeat thread when the work itself reports
nothing for that long. The clock is injectable so tests need not wait a minute.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

Clock = Callable[[], float]


def _fmt_s(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class StageProgress:
    """One stage's counter; ``advance`` is cheap and thread-safe."""

    def __init__(self, reporter: ProgressReporter, name: str, total: int | None) -> None:
        self.reporter, self.name, self.total = reporter, name, total
        self.done = 0
        self.note = ""
        self.started = reporter.clock()
        self.last_line = self.started
        self._lock = threading.Lock()
        self._bar: Progress | None = None
        self._task = None

    def advance(self, done: int | None = None, total: int | None = None, note: str | None = None) -> None:
        with self._lock:
            self.done = self.done + 1 if done is None else done
            if total is not None:
                self.total = total
            if note is not None:
                self.note = note
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.done, total=self.total, description=self.note)
        else:
            self.maybe_line()

    def line(self) -> str:
        now = self.reporter.clock()
        elapsed = now - self.started
        parts = [f"{self.name}:"]
        if self.total:
            parts.append(f"{self.done}/{self.total},")
        parts.append(f"elapsed {_fmt_s(elapsed)}")
        if self.total and self.done:
            parts[-1] += ","
            parts.append(f"ETA {_fmt_s(elapsed / self.done * (self.total - self.done))}")
        if self.note:
            parts.append(f"({self.note})")
        return " ".join(parts)

    def maybe_line(self, force: bool = False) -> None:
        now = self.reporter.clock()
        with self._lock:
            due = force or now - self.last_line >= self.reporter.interval_s
            if due:
                self.last_line = now
        if due:
            self.reporter.print(self.line())


class ProgressReporter:
    """Stages of one command; ``console`` is stderr (progress never goes to stdout)."""

    def __init__(self, console: Console, clock: Clock = time.monotonic, interval_s: float = 60.0,
                 heartbeat: bool = True, terminal: bool | None = None) -> None:
        self.console, self.clock, self.interval_s = console, clock, interval_s
        self.terminal = console.is_terminal if terminal is None else terminal
        self.heartbeat = heartbeat

    def print(self, message: str) -> None:
        self.console.print(message, highlight=False, markup=False)

    @contextmanager
    def stage(self, name: str, total: int | None = None) -> Iterator[StageProgress]:
        """Announce a stage, report its progress, and say how long it took."""
        stage = StageProgress(self, name, total)
        if self.terminal:
            columns = [TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.description}")]
            with Progress(*columns, console=self.console, transient=False) as bar:
                stage._bar, stage._task = bar, bar.add_task("", total=total)
                yield stage
            return
        self.print(f"{name}: started" + (f" ({total} steps)" if total else ""))
        stop = threading.Event()
        ticker = None
        if self.heartbeat:
            def beat() -> None:
                while not stop.wait(min(self.interval_s, 5.0)):
                    stage.maybe_line()

            ticker = threading.Thread(target=beat, daemon=True)
            ticker.start()
        try:
            yield stage
        finally:
            stop.set()
            if ticker is not None:
                ticker.join(timeout=1.0)
        self.print(f"{name}: finished in {_fmt_s(self.clock() - stage.started)}")

    def step(self, message: str) -> None:
        """A one-off announcement (a sub-step of a stage)."""
        self.print(message)
