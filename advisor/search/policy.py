"""Multi-fidelity policy: which plans earn the expensive stages, how many items each needs,
and what is feasible now.

The cheap tier (proxy KL, predicted or measured energy) scores every trial. lm-eval then
scores BF16 (the reference), the other baselines, and the candidates (plans within the
proxy budget that cost no more energy than BF16 on any workload) in order of rising
energy until one passes (:func:`benchmark_queue`). Each plan is judged sequentially
(:func:`judge_sequentially`): items in nested, doubling batches, more only while a task is
undecided, so plans that clearly pass or fail stop early.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna

from advisor.formats import Format
from advisor.plan import Plan
from advisor.search.acceptance import PlanAcceptance, TaskAcceptance, Verdict, plan_verdict, task_verdict
from advisor.search.frontier import Candidate, one_tier, predicted_tier
from advisor.search.stats import look_confidence, paired_drop
from advisor.search.study import candidates


@dataclass(frozen=True)
class BenchmarkQueue:
    reference: Plan  # all-BF16: every drop is measured against it
    baselines: list[Plan]  # the other uniform plans: scored for the proxy's calibration
    candidates: list[Plan]  # rising energy; scoring stops at the first that passes


def benchmark_queue(cands: Sequence[Candidate], workloads: Sequence[str], max_candidates: int) -> BenchmarkQueue | None:
    """What lm-eval scores, in order; None without a finished all-BF16 trial."""
    primary = workloads[0]
    bf16 = next((c for c in cands if c.plan.uniform_format() == Format.BF16), None)
    if bf16 is None:
        return None
    distinct = list({c.plan.id: c for c in reversed(cands)}.values())
    baselines = [c.plan for c in distinct if c.plan.uniform_format() not in (None, Format.BF16)]
    eligible = [
        c for c in distinct
        if c.proxy_feasible and c.plan.id != bf16.plan.id
        and all(c.energy(w) <= bf16.energy(w) for w in workloads)
    ]
    eligible.sort(key=lambda c: (c.energy(primary), c.kl))
    return BenchmarkQueue(bf16.plan, baselines, [c.plan for c in eligible[:max_candidates]])


def measurement_targets(study: optuna.Study, workloads: Sequence[str], max_candidates: int) -> BenchmarkQueue | None:
    """What the measured tier measures: the queue by predicted J/token only, the same in a resumed search (where
    some plans carry measurements already) as in one straight through."""
    return benchmark_queue(predicted_tier(candidates(study)), workloads, max_candidates)


def benchmark_targets(study: optuna.Study, workloads: Sequence[str], max_candidates: int) -> BenchmarkQueue | None:
    """What lm-eval judges: the queue among the plans the recommendation may compare (measured ones, where the
    measured tier ran)."""
    return benchmark_queue(one_tier(candidates(study)), workloads, max_candidates)


def item_schedule(n_available: int, first_batch: int) -> list[int]:
    """Nested subset sizes: ``first_batch``, doubling, then all ``n_available`` items."""
    if n_available < 1 or first_batch < 1:
        raise ValueError(f"need n_available >= 1 and first_batch >= 1, got {n_available}, {first_batch}")
    sizes, n = [], first_batch
    while n < n_available:
        sizes.append(n)
        n *= 2
    return [*sizes, n_available]


@dataclass(frozen=True)
class PairedItems:
    """One task's per-item values on the same items (same order) for BF16 and a plan."""

    metric: str
    reference: Sequence[float]
    plan: Sequence[float]
    higher_is_better: bool = True


# (task, first n items of its seeded order) -> the paired values on those items
ScoreItems = Callable[[str, int], PairedItems]


def judge_sequentially(
    score: ScoreItems,
    n_available: dict[str, int],
    first_batch: int,
    max_drop: float,
    confidence: float,
    on_look: Callable[[str, TaskAcceptance], None] | None = None,
) -> PlanAcceptance:
    """Judge one plan on every task, scoring more items only where a task is undecided.

    At each look every undecided task is extended to its next batch size and its paired
    interval recomputed at the per-look level of :func:`~advisor.search.stats.look_confidence`
    (so that all looks hold together at ``confidence``). A task stops when it passes or
    fails; the plan stops as soon as one task fails or all pass. A task still undecided on
    all its items stays undecided.
    """
    schedules = {t: item_schedule(n, first_batch) for t, n in n_available.items()}
    judged: dict[str, TaskAcceptance] = {}
    open_tasks = list(n_available)
    look = 0
    while open_tasks:
        for task in list(open_tasks):
            sizes = schedules[task]
            items = score(task, sizes[look])
            interval = paired_drop(items.reference, items.plan, look_confidence(confidence, len(sizes)),
                                   items.higher_is_better)
            verdict = task_verdict(interval, max_drop)
            judged[task] = TaskAcceptance(task, items.metric, n_available[task], len(sizes), interval, verdict)
            if on_look is not None:
                on_look(task, judged[task])
            if verdict is not Verdict.UNDECIDED or look + 1 == len(sizes):
                open_tasks.remove(task)
            if verdict is Verdict.FAILS:
                open_tasks = []
                break
        look += 1
    ordered = tuple(judged[t] for t in n_available if t in judged)
    return PlanAcceptance(plan_verdict(t.verdict for t in ordered), ordered)


def best_feasible(cands: list[Candidate], primary_workload: str) -> Candidate | None:
    """The lowest-energy plan within the accuracy budget so far (progress lines show it)."""
    pool = [c for c in cands if c.feasible]
    return min(pool, key=lambda c: (c.energy(primary_workload), c.kl)) if pool else None


def best_feasible_line(study: optuna.Study, primary_workload: str) -> str:
    """The trials' progress line: by predicted J/token, as each trial line prints it (in a resumed search some
    plans are measured too; the two tiers are not compared)."""
    best = best_feasible(predicted_tier(candidates(study)), primary_workload)
    if best is None:
        return "no plan within budget yet"
    return (f"best within budget: {best.plan.label()} KL {best.kl:.4f}, {best.energy(primary_workload):.4g} J/token "
            "predicted")
