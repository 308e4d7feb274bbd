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
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import optuna

from advisor.errors import InputError
from advisor.estimate import EnergyEstimate, j_per_token_by_workload
from advisor.formats import Format
from advisor.interrupts import check, deferred, interruptible, pending
from advisor.plan import KV_CACHE_KEY, LayerGroup, Plan
from advisor.recipe.schema import AccuracySpec, Recipe
from advisor.search.acceptance import Verdict
from advisor.search.budget import PLAN_ERRORS, TrialBudget, reap, work
from advisor.search.energy_tiers import measured_on_one_scale
from advisor.search.frontier import Candidate
from advisor.search.interrupt_log import silence_interrupt_tracebacks
from advisor.search.ownership import SETTLE_S, StudyOwnership, claim_study, in_use_error, owner_is_live, read_owner
from advisor.search.plan_queue import enqueue_baselines, enqueue_new, scored_trial
from advisor.search.recovery import PLAN_ERROR_ATTR, WORKER_ATTR, requeue_failed_trials, this_worker
from advisor.search.storage import open_storage, redact_url
from advisor.search.study_key import KEY_ATTR, check_same_key, study_key
from advisor.search.trial_record import (
    TrialScores,
    acceptance_by_plan,
    benchmark_scores,
    proposal_scale,
    record_proposal_scale,
    record_scores,
    scores_of,
)
from advisor.versions import package_versions

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


def baseline_plans(
    groups: Sequence[LayerGroup], formats: Sequence[Format], kv_cache: Sequence[Format] = (Format.BF16,)
) -> list[Plan]:
    """Every uniform plan: all-BF16 first, then each format, each with every KV-cache format."""
    return [Plan.uniform(groups, f, kv) for kv in kv_cache for f in formats]


def open_study(
    recipe: Recipe,
    resume: bool,
    key: dict[str, Any] | None = None,
    url: str | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
) -> optuna.Study:
    """Create the study, or load it when ``resume``; never silently mix two runs (see :func:`open_owned_study`,
    which also claims it for this run)."""
    return _open(recipe, resume, key, url, sampler)[0]


@dataclass
class OwnedStudy:
    """A study this run holds (:mod:`advisor.search.ownership`); ``created``: by this run, now."""

    study: optuna.Study
    ownership: StudyOwnership
    created: bool

    def release(self, discard_if_empty: bool = False) -> None:
        """Give the study up; ``discard_if_empty``: delete it when this run created it and it holds no
        finished or running trial (a failed start leaves nothing that blocks the corrected rerun)."""
        self.ownership.release()
        if discard_if_empty and self.created and is_leftover(self.study):
            optuna.delete_study(study_name=self.study.study_name, storage=self.ownership.storage)


def open_owned_study(recipe: Recipe, resume: bool, key: dict[str, Any], warn: Callable[[str], None]) -> OwnedStudy:
    """:func:`open_study`, then this run's owner record on it: a study whose owner still runs is refused."""
    study, storage, created = _open(recipe, resume, key)
    study_id = storage.get_study_id_from_name(recipe.name)
    ownership = claim_study(storage, study_id, recipe.name, redact_url(recipe.storage_url), created, warn)
    return OwnedStudy(study, ownership, created)


def _open(
    recipe: Recipe,
    resume: bool,
    key: dict[str, Any] | None = None,
    url: str | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
) -> tuple[optuna.Study, optuna.storages.BaseStorage, bool]:
    """(study, storage, created). Refused: a name that exists without ``resume`` (whoever made it: no run
    deletes or reuses a study it did not create), a study another run is creating or running, a ``resume``
    of a missing study, a ``resume`` whose study key differs (the fields are named)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    silence_interrupt_tracebacks()
    key = key if key is not None else study_key(recipe, package_versions())
    sampler = sampler or make_sampler(recipe.search.sampler, recipe.search.seed)
    url = url or recipe.storage_url
    storage = open_storage(url, heartbeat_s=recipe.search.heartbeat_s)
    shown = redact_url(url)
    study_id = _study_id(storage, recipe.name)
    if study_id is not None:
        owner = _settled_owner(storage, study_id)
        if owner_is_live(owner):
            raise in_use_error(recipe.name, shown, owner)
    if study_id is not None and not resume:
        raise InputError(f"a study named {recipe.name!r} already exists in {shown}; "
                         "pass --resume to continue it, or choose another --name or --out")
    if resume and study_id is None:
        raise InputError(f"--resume: no study named {recipe.name!r} in {shown} to resume")
    if study_id is not None:
        try:
            study = optuna.load_study(study_name=recipe.name, storage=storage, sampler=sampler)
        except KeyError:  # its creator discarded it (a failed start) since we looked
            raise InputError(f"--resume: no study named {recipe.name!r} in {shown} to resume") from None
        check_same_key(study.user_attrs.get(KEY_ATTR), key, recipe.name, "--resume", asked_energy=recipe.energy)
        created = False
    else:
        try:
            study = optuna.create_study(study_name=recipe.name, storage=storage,
                                        directions=["minimize", "minimize"], sampler=sampler)
        except optuna.exceptions.DuplicatedStudyError:  # another run created it since we looked
            owner = _settled_owner(storage, _study_id(storage, recipe.name))
            raise in_use_error(recipe.name, shown, owner if owner_is_live(owner) else None) from None
        study.set_user_attr(KEY_ATTR, key)
        created = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["kl", "j_per_token"])
    return study, storage, created


def _study_id(storage: optuna.storages.BaseStorage, name: str) -> int | None:
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        return None


def _settled_owner(storage: optuna.storages.BaseStorage, study_id: int | None) -> dict[str, Any] | None:
    """The study's owner record, waiting once for a creator that is between create_study and its claim."""
    if study_id is None:
        return None
    try:
        owner = read_owner(storage, study_id)
        if owner is None:
            time.sleep(SETTLE_S)
            owner = read_owner(storage, study_id)
    except KeyError:  # deleted meanwhile by its creator
        return None
    return owner


def is_leftover(study: optuna.Study) -> bool:
    """A study that holds no finished and no running trial: what a run that failed early leaves."""
    states = {t.state for t in study.get_trials(deepcopy=False)}
    return not states & {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING}


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
    (``search.recovery``). A resume rebuilds everything from the study: the coordinator first queues
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
            requeue_failed_trials(study)
            enqueue_baselines(study, baseline_plans(groups, recipe.formats, recipe.kv_cache), kv_dimension)
            if proposer is not None:
                enqueue_new(study, proposer.propose(1.0), kv_dimension)
                run(waiting_only=True)
                enqueue_new(study, proposer.propose(_second_sweep_scale(study, proposer)), kv_dimension)
                run(waiting_only=True)
        run(waiting_only=False)
    check()
    return len(finished_here)


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
