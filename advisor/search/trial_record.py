"""What the study stores per trial and per plan, written and read here only.

Per trial (the trial's user attributes): its plan's id and label, the proxy scores, the constraint
values and the predicted energy, one :class:`~advisor.estimate.EnergyEstimate` per workload
(:class:`TrialScores`). Per plan (study attributes): the measured energy, one attribute per plan
(``measured_energy:<plan id>``) so that no two writers ever read-modify-write one attribute; each
measured stage's drift check (``measured_drift:<time>``); each GPU that measured
(``measured_unit:<uuid>``); lm-eval scores and acceptance
(``benchmark`` and ``acceptance``, keyed by plan id, written by the coordinator alone); the damage scale of
the second knapsack sweep (``proposal_scale``).

Records are stored as their ``to_dict()`` form and read back with their types checked; the keys and
the stored form are those of every study written so far, so old studies load as they are. Other
per-trial attributes belong to the modules that use them: ``worker`` and ``error`` (the trial's own
evaluation failed; :mod:`advisor.search.storage._recovery`), ``over_budget`` and ``duplicate_retry_of``
(:mod:`advisor.search.storage._budget`); ``repeat`` marks a plan the study had already scored
(a sampler proposed it again), whose scores were taken from that trial.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from pydantic import ValidationError

from advisor.errors import InputError
from advisor.estimate import DriftCheck, EnergyEstimate, MeasuredUnit
from advisor.search.acceptance import PlanAcceptance, from_stored

ENERGY_ATTR = "energy"
MEASURED_PREFIX = "measured_energy:"
DRIFT_PREFIX = "measured_drift:"
UNIT_PREFIX = "measured_unit:"
BENCHMARK_ATTR = "benchmark"
ACCEPTANCE_ATTR = "acceptance"
OPERATING_ATTR = "operating_points"
SEARCH_ENERGY_ATTR = "search_energy"
PROPOSAL_SCALE_ATTR = "proposal_scale"
MEASURED_POINTS_PREFIX = "measured_operating:"

Trial = optuna.Trial | optuna.trial.FrozenTrial
TaskScores = dict[str, dict[str, Any]]  # task -> lm-eval score (TaskScore.to_dict without items)


@dataclass(frozen=True)
class TrialScores:
    """A scored trial: proxy accuracy, the constraint values (feasible when all <= 0) and the predicted energy."""

    kl: float
    ppl: float
    ppl_bf16: float
    energy: tuple[EnergyEstimate, ...]  # predicted, one per workload in recipe order
    constraint: tuple[float, ...] = ()
    plan_id: str | None = None  # None: a trial stored before plans were named in trials
    label: str | None = None
    repeat: bool = field(default=False, compare=False)

    @property
    def ppl_increase_pct(self) -> float:
        return 100 * (self.ppl / self.ppl_bf16 - 1)


def record_scores(trial: optuna.Trial, scores: TrialScores) -> None:
    trial.set_user_attr("repeat", scores.repeat)
    trial.set_user_attr("plan_id", scores.plan_id)
    trial.set_user_attr("label", scores.label)
    trial.set_user_attr("kl", scores.kl)
    trial.set_user_attr("ppl", scores.ppl)
    trial.set_user_attr("ppl_bf16", scores.ppl_bf16)
    trial.set_user_attr(ENERGY_ATTR, [e.to_dict() for e in scores.energy])
    trial.set_user_attr("constraint", list(scores.constraint))


def scores_of(trial: optuna.trial.FrozenTrial) -> TrialScores:
    """A finished trial's scores, as :func:`record_scores` stored them."""
    ua = trial.user_attrs
    where = f"trial {trial.number} of the study"
    try:
        return TrialScores(
            kl=float(ua["kl"]), ppl=float(ua["ppl"]), ppl_bf16=float(ua["ppl_bf16"]),
            energy=tuple(_estimates(ua[ENERGY_ATTR], where)),
            constraint=tuple(float(v) for v in ua.get("constraint", ())),
            plan_id=ua.get("plan_id"), label=ua.get("label"), repeat=bool(ua.get("repeat", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise _not_ours(where, exc) from None


def energy_of(trial: optuna.trial.FrozenTrial) -> list[EnergyEstimate]:
    """A trial's predicted energy, one estimate per workload."""
    return list(scores_of(trial).energy)


def label_of(trial: Trial) -> str | None:
    """The plan's label for progress lines (None before the trial scored it)."""
    return trial.user_attrs.get("label")


def record_measured(study: optuna.Study, plan_id: str, estimates: Sequence[EnergyEstimate]) -> None:
    study.set_user_attr(MEASURED_PREFIX + plan_id, [e.to_dict() for e in estimates])


def measured_energy(study: optuna.Study) -> dict[str, list[EnergyEstimate]]:
    """plan id -> its measured energy, one estimate per workload."""
    return {k.removeprefix(MEASURED_PREFIX): _estimates(v, f"the study attribute {k!r}")
            for k, v in study.user_attrs.items() if k.startswith(MEASURED_PREFIX)}


def record_drift(study: optuna.Study, check: DriftCheck) -> None:
    study.set_user_attr(f"{DRIFT_PREFIX}{time.time_ns():020d}", check.to_dict())  # one attribute per check


def measured_drifts(study: optuna.Study) -> list[DriftCheck]:
    """Every drift check of the study, oldest first (the keys hold the time in nanoseconds)."""
    out = []
    for k, v in sorted(study.user_attrs.items()):
        if k.startswith(DRIFT_PREFIX):
            try:
                out.append(DriftCheck.from_dict(v))
            except ValidationError as exc:
                raise _not_ours(f"the study attribute {k!r}", exc) from None
    return out


def record_unit(study: optuna.Study, unit: MeasuredUnit) -> None:
    study.set_user_attr(UNIT_PREFIX + unit.key, unit.to_dict())  # one attribute per unit


def measured_units(study: optuna.Study) -> dict[str, MeasuredUnit]:
    """unit key (GPU UUID) -> the unit's first all-BF16 and the plans measured on it."""
    out = {}
    for k, v in study.user_attrs.items():
        if k.startswith(UNIT_PREFIX):
            try:
                out[k.removeprefix(UNIT_PREFIX)] = MeasuredUnit.from_dict(v)
            except ValidationError as exc:
                raise _not_ours(f"the study attribute {k!r}", exc) from None
    return out


def record_benchmark(study: optuna.Study, plan_id: str, scores: TaskScores,
                     acceptance: Mapping[str, Any] | None = None) -> None:
    """Store a plan's lm-eval scores ({task: TaskScore dict without items}) and, for a plan judged against
    BF16, its per-task paired intervals (PlanAcceptance.to_dict())."""
    bench = dict(study.user_attrs.get(BENCHMARK_ATTR, {}))
    bench[plan_id] = scores
    study.set_user_attr(BENCHMARK_ATTR, bench)
    if acceptance is not None:
        judged = dict(study.user_attrs.get(ACCEPTANCE_ATTR, {}))
        judged[plan_id] = {t["task"]: t for t in acceptance["tasks"]}
        study.set_user_attr(ACCEPTANCE_ATTR, judged)


def benchmark_scores(study: optuna.Study) -> dict[str, TaskScores]:
    """plan id -> {task: score with its primary ``metric`` and ``value``}."""
    return {plan_id: {task: _score(task, s) for task, s in scores.items()}
            for plan_id, scores in study.user_attrs.get(BENCHMARK_ATTR, {}).items()}


def acceptance_by_plan(study: optuna.Study, max_drop: float) -> dict[str, PlanAcceptance]:
    """plan id -> its stored tasks judged under ``max_drop`` (the verdicts follow the study's budget)."""
    judged = {plan_id: from_stored(tasks, max_drop)
              for plan_id, tasks in study.user_attrs.get(ACCEPTANCE_ATTR, {}).items()}
    return {plan_id: acc for plan_id, acc in judged.items() if acc is not None}


def record_operating_points(study: optuna.Study, points: Sequence[Mapping[str, Any]]) -> None:
    """Each plan's operating point per workload with an objective (OperatingPoint.to_dict()), written by the
    coordinator after the search; the report reads them back with their types checked."""
    study.set_user_attr(OPERATING_ATTR, [dict(p) for p in points])


def operating_points(study: optuna.Study) -> list[dict[str, Any]]:
    return list(study.user_attrs.get(OPERATING_ATTR, []))


def record_measured_points(study: optuna.Study, plan_id: str, points: Sequence[Mapping[str, Any]]) -> None:
    """A plan's operating points as measured (MeasuredPoint.to_dict() or, where it could not be metered,
    {"workload", "batch", "not_measured"}), one attribute per plan."""
    study.set_user_attr(MEASURED_POINTS_PREFIX + plan_id, [dict(p) for p in points])


def measured_points(study: optuna.Study) -> dict[tuple[str, str], dict[str, Any]]:
    """(plan id, workload) -> its operating point as measured."""
    return {(k.removeprefix(MEASURED_POINTS_PREFIX), p["workload"]): dict(p)
            for k, v in study.user_attrs.items() if k.startswith(MEASURED_POINTS_PREFIX) for p in v}


def record_proposal_scale(study: optuna.Study, scale: float) -> None:
    """The damage scale the second knapsack sweep was made with (``search.study``)."""
    study.set_user_attr(PROPOSAL_SCALE_ATTR, float(scale))


def proposal_scale(study: optuna.Study) -> float | None:
    scale = study.user_attrs.get(PROPOSAL_SCALE_ATTR)
    return None if scale is None else float(scale)


def record_search_energy(study: optuna.Study, energy: Mapping[str, Any]) -> None:
    """The joules the search spent, all its runs together (SearchEnergy.to_dict())."""
    study.set_user_attr(SEARCH_ENERGY_ATTR, dict(energy))


def search_energy(study: optuna.Study) -> dict[str, Any] | None:
    return study.user_attrs.get(SEARCH_ENERGY_ATTR)


def _score(task: str, score: Mapping[str, Any]) -> dict[str, Any]:
    """Studies written before per-item results stored {acc, acc_stderr, n}."""
    if "value" in score:
        return dict(score)
    return {"task": task, "metric": "acc,none", "value": score["acc"], "stderr": score.get("acc_stderr"),
            "n": score["n"]}


def _estimates(stored: Any, where: str) -> list[EnergyEstimate]:
    try:
        return [EnergyEstimate.from_dict(e) for e in stored]
    except (TypeError, ValidationError) as exc:
        raise _not_ours(where, exc) from None


def _not_ours(where: str, exc: Exception) -> InputError:
    return InputError(f"{where} does not hold what `advisor search` stores ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0]}); was the study written by another tool? Give the storage of "
                      "an `advisor search` run")
