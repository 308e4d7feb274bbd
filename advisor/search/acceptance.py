"""Benchmark acceptance: does a plan keep accuracy within ``benchmark.max_drop`` on every task?

Per task, from the paired interval of the plan's drop against BF16 on the same items
(:func:`advisor.search.stats.paired_drop`):

* passes: the upper bound is within ``max_drop``;
* fails: the lower bound exceeds ``max_drop``;
* undecided: the interval straddles ``max_drop``.

A plan passes only when every task passes, and fails when any task fails: a loss on one
task cannot hide behind a gain on another. Requiring every task to pass at level 1 - a
keeps the chance of accepting a plan that is over budget on some task within a
(intersection-union test), so the tasks need no correction between them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from advisor.search.stats import PairedInterval


class Verdict(StrEnum):
    PASSES = "passes"
    FAILS = "fails"
    UNDECIDED = "undecided"


def task_verdict(interval: PairedInterval, max_drop: float) -> Verdict:
    if interval.ci_high <= max_drop:
        return Verdict.PASSES
    if interval.ci_low > max_drop:
        return Verdict.FAILS
    return Verdict.UNDECIDED


def plan_verdict(verdicts: Iterable[Verdict]) -> Verdict:
    """Fails if any task fails, passes if every task passes, else undecided."""
    seen = list(verdicts)
    if not seen:
        raise ValueError("a plan verdict needs at least one task")
    if Verdict.FAILS in seen:
        return Verdict.FAILS
    if all(v is Verdict.PASSES for v in seen):
        return Verdict.PASSES
    return Verdict.UNDECIDED


@dataclass(frozen=True)
class TaskAcceptance:
    """One task of one plan: its paired drop against BF16, the items it took, the verdict."""

    task: str
    metric: str
    n_available: int  # items the task could have used (full set or benchmark.limit)
    looks: int  # looks of the sequential schedule at which it was judged
    interval: PairedInterval
    verdict: Verdict

    @property
    def n_items(self) -> int:
        return self.interval.n_items

    def to_dict(self) -> dict[str, Any]:
        """The stored form: the interval and the design; the verdict is recomputed on reading."""
        return {"task": self.task, "metric": self.metric, "n_available": self.n_available, "looks": self.looks,
                **self.interval.to_dict()}


@dataclass(frozen=True)
class PlanAcceptance:
    verdict: Verdict
    tasks: tuple[TaskAcceptance, ...]

    def task(self, name: str) -> TaskAcceptance | None:
        return next((t for t in self.tasks if t.task == name), None)

    @property
    def worst_drop(self) -> float:
        return max(t.interval.drop for t in self.tasks)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "tasks": [t.to_dict() for t in self.tasks]}


def judge(tasks: Iterable[TaskAcceptance], max_drop: float) -> PlanAcceptance:
    """Apply the rule to tasks judged elsewhere (or re-judge them under another budget)."""
    judged = tuple(
        TaskAcceptance(t.task, t.metric, t.n_available, t.looks, t.interval, task_verdict(t.interval, max_drop))
        for t in tasks
    )
    return PlanAcceptance(plan_verdict(t.verdict for t in judged), judged)


def from_stored(stored: Mapping[str, Mapping[str, Any]], max_drop: float) -> PlanAcceptance | None:
    """The acceptance of a plan from its stored tasks ({task: TaskAcceptance.to_dict()})."""
    if not stored:
        return None
    fields = set(PairedInterval.__dataclass_fields__)
    tasks = [
        TaskAcceptance(str(d["task"]), str(d["metric"]), int(d["n_available"]), int(d["looks"]),
                       PairedInterval(**{k: v for k, v in d.items() if k in fields}), Verdict.UNDECIDED)
        for d in stored.values()
    ]
    return judge(tasks, max_drop)


def describe(acc: PlanAcceptance) -> str:
    """'passes' / 'fails on lambada_openai' / 'undecided on piqa' for progress lines."""
    if acc.verdict is Verdict.PASSES:
        return "passes on every task"
    which = [t.task for t in acc.tasks if t.verdict is acc.verdict]
    return f"{acc.verdict.value} on {', '.join(which)}"


def as_record(acc: PlanAcceptance) -> dict[str, Any]:
    return {"verdict": acc.verdict.value,
            "tasks": [{**asdict(t.interval), "task": t.task, "metric": t.metric, "n_available": t.n_available,
                       "looks": t.looks, "verdict": t.verdict.value} for t in acc.tasks]}
