"""The Optuna study over per-group formats.

Objectives (both minimized): proxy KL vs BF16, and J/token on the primary workload.
The accuracy budget is an Optuna constraint (feasible when every value <= 0). The
study talks to the model side only through :class:`PlanEvaluator`, so tests can
drive it with fakes and the GPU path plugs in the same way.
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import optuna

from advisor.errors import InputError
from advisor.estimate import EnergyEstimate
from advisor.formats import Format
from advisor.plan import LayerGroup, Plan
from advisor.recipe.schema import AccuracySpec, Recipe
from advisor.search.acceptance import Verdict, from_stored
from advisor.search.frontier import Candidate

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


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """Samplers read the constraints that trials record with ``Trial.set_constraint``."""
    if name in ("tpe", "guided"):
        return optuna.samplers.TPESampler(seed=seed, multivariate=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise InputError(f"search.sampler: unknown sampler {name!r}; allowed: guided, tpe, nsga2, random")


def baseline_plans(groups: Sequence[LayerGroup], formats: Sequence[Format]) -> list[Plan]:
    return [Plan.uniform(groups, f) for f in formats]


def open_study(recipe: Recipe, resume: bool, sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """Create the study, or load it when ``resume``; refuse to silently mix two runs."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = sampler or make_sampler(recipe.search.sampler, recipe.search.seed)
    storage = recipe.storage_url
    try:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    except Exception as exc:  # optuna raises several storage-specific errors
        raise InputError(f"storage: cannot open {storage!r}: {exc}") from None
    exists = recipe.name in names
    if exists and not resume:
        raise InputError(
            f"a study named {recipe.name!r} already exists in {storage}; "
            "pass --resume to continue it, or choose another --name or --out"
        )
    if resume and not exists:
        raise InputError(f"--resume: no study named {recipe.name!r} in {storage} to resume")
    study = optuna.create_study(
        study_name=recipe.name,
        storage=storage,
        directions=["minimize", "minimize"],
        sampler=sampler,
        load_if_exists=resume,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["kl", "j_per_token"])
    return study


def enqueue_baselines(study: optuna.Study, plans: Sequence[Plan]) -> None:
    """Enqueue each baseline unless a finished or waiting trial already has it."""
    seen = {
        p.id
        for t in study.get_trials(deepcopy=False)
        if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.WAITING)
        and (p := _trial_plan(t)) is not None
    }
    for plan in plans:
        if plan.id not in seen:
            study.enqueue_trial({k: v.value for k, v in plan.formats.items()}, skip_if_exists=True)


def make_objective(
    evaluator: PlanEvaluator,
    groups: Sequence[LayerGroup],
    formats: Sequence[Format],
    budget: AccuracySpec,
) -> Callable[[optuna.Trial], tuple[float, float]]:
    choices = [f.value for f in formats]
    seen: dict[str, Evaluation] = {}

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        plan = Plan({g.name: Format(trial.suggest_categorical(g.name, choices)) for g in groups})
        ev = seen.get(plan.id)
        trial.set_user_attr("repeat", ev is not None)
        if ev is None:  # samplers repeat plans; a repeat is not scored again
            ev = seen[plan.id] = evaluator.evaluate(plan)
        trial.set_user_attr("plan_id", plan.id)
        trial.set_user_attr("label", plan.label())
        trial.set_user_attr("kl", ev.kl)
        trial.set_user_attr("ppl", ev.ppl)
        trial.set_user_attr("ppl_bf16", ev.ppl_bf16)
        trial.set_user_attr("energy", [e.to_dict() for e in ev.energy])
        constraints = constraint_values(ev, budget)
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        trial.set_user_attr("constraint", list(constraints.values()))
        return ev.kl, ev.energy[0].j_per_token

    return objective


def record_benchmark(study: optuna.Study, plan_id: str, scores: dict[str, dict[str, Any]],
                     acceptance: dict[str, Any] | None = None) -> None:
    """Store a plan's lm-eval scores ({task: TaskScore dict without items}) with the study and,
    for a plan judged against BF16, its per-task paired intervals (PlanAcceptance.to_dict())."""
    bench = dict(study.user_attrs.get("benchmark", {}))
    bench[plan_id] = scores
    study.set_user_attr("benchmark", bench)
    if acceptance is not None:
        judged = dict(study.user_attrs.get("acceptance", {}))
        judged[plan_id] = {t["task"]: t for t in acceptance["tasks"]}
        study.set_user_attr("acceptance", judged)


def benchmark_budget(study: optuna.Study) -> tuple[float, float]:
    """(max_drop, confidence) of the run's recipe."""
    spec = study.user_attrs.get("recipe", {}).get("benchmark", {})
    return float(spec.get("max_drop", math.inf)), float(spec.get("confidence", 0.95))


def candidates(study: optuna.Study) -> list[Candidate]:
    """Every finished trial as a Candidate (feasible: within the proxy budget and, where
    lm-eval judged it against BF16, passing on every task: :mod:`advisor.search.acceptance`)."""
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    bench: dict[str, dict[str, dict[str, Any]]] = study.user_attrs.get("benchmark", {})
    judged: dict[str, dict[str, dict[str, Any]]] = study.user_attrs.get("acceptance", {})
    max_drop, _ = benchmark_budget(study)
    out = []
    for t in trials:
        plan = Plan({k: Format(v) for k, v in t.params.items()})
        ua = t.user_attrs
        acceptance = from_stored(judged.get(plan.id, {}), max_drop)
        proxy_ok = all(v <= 0 for v in ua.get("constraint", [math.inf]))
        out.append(
            Candidate(
                trial=t.number,
                plan=plan,
                kl=ua["kl"],
                ppl=ua["ppl"],
                energy_j_per_token={e["workload"]: e["j_per_token"] for e in ua["energy"]},
                feasible=proxy_ok and (acceptance is None or acceptance.verdict is Verdict.PASSES),
                benchmark={k: v.get("value", v.get("acc")) for k, v in bench.get(plan.id, {}).items()},
                acceptance=acceptance,
                proxy_feasible=proxy_ok,
            )
        )
    return out


def finished_trials(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


class Proposer(Protocol):
    """Proposes plans; ``scale`` = observed / predicted damage of plans evaluated so far."""

    def propose(self, scale: float) -> list[Plan]: ...

    def predicted_damage(self, plan: Plan) -> float: ...


def _trial_plan(t: optuna.trial.FrozenTrial) -> Plan | None:
    """A trial's plan: its params, or for a waiting (enqueued) trial its fixed params."""
    params = t.params or t.system_attrs.get("fixed_params")
    return Plan(params) if params else None


def _enqueue(study: optuna.Study, plans: Sequence[Plan]) -> int:
    seen = {p.id for t in study.get_trials(deepcopy=False) if (p := _trial_plan(t)) is not None}
    n = 0
    for plan in plans:
        if plan.id not in seen:
            study.enqueue_trial({k: v.value for k, v in plan.formats.items()})
            seen.add(plan.id)
            n += 1
    return n


def _damage_scale(study: optuna.Study, proposer: Proposer) -> float:
    """Median of observed KL over the additive prediction, over evaluated non-BF16 plans."""
    ratios = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        plan = Plan(t.params)
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
) -> int:
    """Run trials until the study holds ``recipe.search.trials`` finished ones. Returns how many ran.

    Order: baselines; then, with a ``proposer``, its knapsack plans, re-proposed once
    with the damage scale corrected by what the first proposals really scored; then
    the sampler. Every finished trial is committed to storage as it ends, so an
    interruption (Ctrl-C, a crash) loses only the trial in flight.
    """
    enqueue_baselines(study, baseline_plans(groups, recipe.formats))
    before = finished_trials(study)
    objective = make_objective(evaluator, groups, recipe.formats, recipe.accuracy)
    deadline = None if recipe.search.timeout_s is None else time.monotonic() + recipe.search.timeout_s

    def optimize(n: int) -> None:
        n = min(n, recipe.search.trials - finished_trials(study))
        if n <= 0:
            return
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        study.optimize(objective, n_trials=n, timeout=timeout, callbacks=list(callbacks),
                       catch=(RuntimeError,), gc_after_trial=False)

    if proposer is not None:
        first = _enqueue(study, proposer.propose(1.0))
        optimize(len(baseline_plans(groups, recipe.formats)) + first)
        optimize(_enqueue(study, proposer.propose(_damage_scale(study, proposer))))
    optimize(recipe.search.trials)
    return finished_trials(study) - before


def save_run_meta(study: optuna.Study, meta: dict[str, Any]) -> None:
    for key, value in meta.items():
        study.set_user_attr(key, json.loads(json.dumps(value, default=str)))
