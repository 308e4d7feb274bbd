"""The Optuna study over per-group formats.

Objectives (both minimized): proxy KL vs BF16, and J/token on the primary workload.
The accuracy budget is an Optuna constraint (feasible when every value <= 0). Parameters:
one categorical per group, and ``kv_cache`` when the recipe lists more than one KV-cache
format (so studies without that dimension keep their parameters). The
study talks to the model side only through :class:`PlanEvaluator`, so tests can
drive it with fakes and the GPU path plugs in the same way.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import optuna

from advisor.estimate import EnergyEstimate, j_per_token_by_workload
from advisor.formats import Format
from advisor.interrupts import check, deferred, interruptible, pending
from advisor.plan import KV_CACHE_KEY, LayerGroup, Plan
from advisor.recipe.schema import AccuracySpec, Recipe
from advisor.search.acceptance import Verdict
from advisor.search.frontier import Candidate
from advisor.search.measured import measured_on_one_scale
from advisor.search.storage import (
    PLAN_ERROR_ATTR,
    PLAN_ERRORS,
    WORKER_ATTR,
    TrialBudget,
    reap,
    requeue_failed_trials,
    this_worker,
    work,
)
from advisor.search.study._plan_queue import enqueue_baselines, enqueue_new, scored_trial
from advisor.search.trial_record import (
    TrialScores,
    acceptance_by_plan,
    benchmark_scores,
    proposal_scale,
    record_proposal_scale,
    record_scores,
    scores_of,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    kl: float
    ppl: float
    ppl_bf16: float
    energy: Sequence[EnergyEstimate]  # one per workload, in recipe order


class PlanEvaluator(Protocol):
    """Scores one plan: proxy accuracy and energy on every workload."""

    def evaluate(self, plan: Plan) -> Evaluation: ...


def constraint_values(ev: Evaluation, budget: AccuracySpec) -> dict[str, float]:
    """Optuna constraints: feasible when every value is <= 0."""
    values = {"kl_budget": ev.kl - budget.max_kl}
    if budget.max_ppl_increase_pct is not None:
        values["ppl_budget"] = 100.0 * (ev.ppl / ev.ppl_bf16 - 1.0) - budget.max_ppl_increase_pct
    return values


def baseline_plans(
    groups: Sequence[LayerGroup], formats: Sequence[Format], kv_cache: Sequence[Format] = (Format.BF16,)
) -> list[Plan]:
    """Every uniform plan: all-BF16 first, then each format, each with every KV-cache format."""
    return [Plan.uniform(groups, f, kv) for kv in kv_cache for f in formats]


def make_objective(
    evaluator: PlanEvaluator,
    groups: Sequence[LayerGroup],
    formats: Sequence[Format],
    budget: AccuracySpec,
    worker: dict[str, Any] | None = None,
    kv_cache: Sequence[Format] = (Format.BF16,),
) -> Callable[[optuna.Trial], tuple[float, float]]:
    choices = [f.value for f in formats]
    kv_choices = [f.value for f in kv_cache]
    worker = worker or this_worker()

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        trial.set_user_attr(WORKER_ATTR, worker)  # first: a RUNNING trial names its process
        kv = trial.suggest_categorical(KV_CACHE_KEY, kv_choices) if len(kv_choices) > 1 else Format.BF16
        plan = Plan({g.name: Format(trial.suggest_categorical(g.name, choices)) for g in groups}, Format(kv))
        ev = _scored(trial.study, plan.id)  # samplers repeat plans: a plan the study holds is not scored again
        repeat = ev is not None
        if ev is None:
            ev = _evaluate(evaluator, plan, trial)
        constraints = constraint_values(ev, budget)
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        record_scores(trial, TrialScores(ev.kl, ev.ppl, ev.ppl_bf16, tuple(ev.energy), tuple(constraints.values()),
                                         plan.id, plan.label(), repeat))
        return ev.kl, ev.energy[0].j_per_token

    return objective


def _scored(study: optuna.Study, plan_id: str) -> Evaluation | None:
    t = scored_trial(study, plan_id)
    if t is None:
        return None
    s = scores_of(t)
    return Evaluation(s.kl, s.ppl, s.ppl_bf16, s.energy)


def _evaluate(evaluator: PlanEvaluator, plan: Plan, trial: optuna.Trial) -> Evaluation:
    """The plan's scores; a signal interrupts here at once (``advisor.interrupts``). An error of the plan's own
    (the run goes on past it) is recorded, so no resume retries it."""
    try:
        with interruptible():
            ev = evaluator.evaluate(plan)
    except PLAN_ERRORS as exc:
        if pending():  # the interrupt, wrapped by a library that called back into Python: not the plan's
            raise KeyboardInterrupt from exc
        trial.set_user_attr(PLAN_ERROR_ATTR, f"{type(exc).__name__}: {str(exc).strip()[:300]}")
        raise
    if not all(math.isfinite(v) for v in (ev.kl, ev.energy[0].j_per_token)):  # Optuna fails such a trial
        trial.set_user_attr(PLAN_ERROR_ATTR, f"scores are not finite: KL {ev.kl}, J/token {ev.energy[0].j_per_token}")
    return ev


def benchmark_budget(study: optuna.Study) -> tuple[float, float]:
    """(max_drop, confidence) of the run's recipe."""
    spec = study.user_attrs.get("recipe", {}).get("benchmark", {})
    return float(spec.get("max_drop", math.inf)), float(spec.get("confidence", 0.95))


def candidates(study: optuna.Study) -> list[Candidate]:
    """Every finished trial as a Candidate (feasible: within the proxy budget and, where
    lm-eval judged it against BF16, passing on every task: :mod:`advisor.search.acceptance`)."""
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    bench = benchmark_scores(study)
    max_drop, _ = benchmark_budget(study)
    judged = acceptance_by_plan(study, max_drop)
    measured, _, _ = measured_on_one_scale(study)
    recipe = study.user_attrs.get("recipe", {})
    budget = AccuracySpec.model_validate(recipe["accuracy"]) if "accuracy" in recipe else None
    out = []
    for t in trials:
        plan = Plan.from_params(t.params)
        scores = scores_of(t)
        acceptance = judged.get(plan.id)
        proxy_ok = within_budget(scores, budget)
        out.append(
            Candidate(
                trial=t.number,
                plan=plan,
                kl=scores.kl,
                ppl=scores.ppl,
                energy_j_per_token=j_per_token_by_workload(measured.get(plan.id, scores.energy)),
                feasible=proxy_ok and (acceptance is None or acceptance.verdict is Verdict.PASSES),
                benchmark={k: v["value"] for k, v in bench.get(plan.id, {}).items()},
                acceptance=acceptance,
                proxy_feasible=proxy_ok,
                energy_measured=plan.id in measured,
                predicted_j_per_token=j_per_token_by_workload(scores.energy),
            )
        )
    return out


def within_budget(scores: TrialScores, budget: AccuracySpec | None) -> bool:
    """Feasibility recomputed from a trial's raw values and the study's budget (not from stored
    constraint values, which a changed budget would leave stale)."""
    if budget is None:
        return all(v <= 0 for v in scores.constraint or (math.inf,))
    ev = Evaluation(scores.kl, scores.ppl, scores.ppl_bf16, [])
    return all(v <= 0 for v in constraint_values(ev, budget).values())


def finished_trials(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


class Proposer(Protocol):
    """Proposes plans; ``scale`` = observed / predicted damage of plans evaluated so far."""

    def propose(self, scale: float) -> list[Plan]: ...

    def predicted_damage(self, plan: Plan) -> float: ...


def _damage_scale(study: optuna.Study, proposer: Proposer) -> float:
    """Median of observed KL over the additive prediction, over evaluated non-BF16 plans."""
    ratios = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        plan = Plan.from_params(t.params)
        pred = proposer.predicted_damage(plan)
        if pred > 0 and t.values:
            ratios.append(t.values[0] / pred)
    if not ratios:
        return 1.0
    ratios.sort()
    return ratios[len(ratios) // 2]


def run_search(
    study: optuna.Study,
    evaluator: PlanEvaluator,
    recipe: Recipe,
    groups: Sequence[LayerGroup],
    callbacks: Sequence[Callable[[optuna.Study, optuna.trial.FrozenTrial], None]] = (),
    proposer: Proposer | None = None,
    coordinator: bool = True,
    worker: dict[str, Any] | None = None,
) -> int:
    """Run trials until the study has used ``recipe.search.trials``; returns how many this call finished
    (not those other workers finished meanwhile).

    The coordinator (``advisor search``) enqueues the baselines, then, with a ``proposer``,
    its knapsack plans, re-proposed once with the damage scale corrected by what the first
    proposals really scored; then the sampler fills the budget. Other workers (``advisor
    worker``) only run waiting trials and the sampler's. Every finished trial is committed
    to storage as it ends, so an interruption loses only the trial in flight, which is queued again
    (``search.storage._recovery``). A resume rebuilds everything from the study: the coordinator first queues
    again what failed, the proposals already enqueued are not enqueued twice, and the second sweep keeps
    the scale it was made with.
    """
    finished_here = []

    def count(_study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state == optuna.trial.TrialState.COMPLETE:  # Optuna calls back only for this process's trials
            finished_here.append(trial.number)

    callbacks = [*callbacks, count]
    objective = make_objective(evaluator, groups, recipe.formats, recipe.accuracy, worker, recipe.kv_cache)
    kv_dimension = len(recipe.kv_cache) > 1
    budget = TrialBudget(recipe.search.trials)
    deadline = None if recipe.search.timeout_s is None else time.monotonic() + recipe.search.timeout_s

    def run(waiting_only: bool) -> None:
        work(study, objective, budget, callbacks, deadline, waiting_only=waiting_only)

    with deferred():  # the study's bookkeeping is never cut in the middle; trials are checked between
        reap(study)
        if coordinator:
            enqueue_opening(study, recipe, groups, proposer)
            if proposer is not None:
                run(waiting_only=True)
                enqueue_new(study, proposer.propose(_second_sweep_scale(study, proposer)), kv_dimension)
                run(waiting_only=True)
        run(waiting_only=False)
    check()
    return len(finished_here)


def enqueue_opening(study: optuna.Study, recipe: Recipe, groups: Sequence[LayerGroup],
                    proposer: Proposer | None = None) -> None:
    """What the coordinator queues before its first trial: failed trials again (a resume), the baselines, the
    first knapsack proposals. Each step leaves what the study already holds, so calling this again (a node's
    coordinator does, before its workers start their trials with it) queues nothing twice."""
    kv_dimension = len(recipe.kv_cache) > 1
    with deferred():
        requeue_failed_trials(study)
        enqueue_baselines(study, baseline_plans(groups, recipe.formats, recipe.kv_cache), kv_dimension)
        if proposer is not None:
            enqueue_new(study, proposer.propose(1.0), kv_dimension)


def _second_sweep_scale(study: optuna.Study, proposer: Proposer) -> float:
    """The damage scale of the second sweep, stored the first time, so a resume proposes what the run did."""
    scale = proposal_scale(study)
    if scale is None:
        scale = _damage_scale(study, proposer)
        record_proposal_scale(study, scale)
    return scale


def save_run_meta(study: optuna.Study, meta: dict[str, Any]) -> None:
    for key, value in meta.items():
        study.set_user_attr(key, json.loads(json.dumps(value, default=str)))
