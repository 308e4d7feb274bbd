"""The measured tier as work for every worker: the plans to meter wait as trials of a second Optuna
study in the search's own storage (``<name>:measure``); each worker process takes them one at a time
(``study.optimize`` pops a WAITING trial) and meters them on its own GPU; the coordinator waits until
none waits or runs and merges the results into the main study (:func:`merge`), where
:func:`~advisor.search.trial_record.record_measured` has always put them. With one process the queue is
run in-process and measures what, and in the order, the stage always measured.

Dead workers are handled as the search's trials are (:func:`advisor.search.storage._budget.reap`): Optuna's
heartbeat on database storages, the worker's pid on this host for the journal file; their trial is
failed and re-enqueued with Optuna's retry callback, so its plan is measured by another worker.

A measurement names its unit (GPU UUID and name): in the queue trial, in the unit records
(``measured_unit:<uuid>``: the unit's first all-BF16 measurement and the plans it measured) and in
each estimate's source. Each unit meters all-BF16 before its first plan, and again after its last
(the drift check), so plans measured on different units of one kind are compared as measured only when the
units' all-BF16 agree within the drift a unit shows against itself
(:func:`~advisor.search.measured._tiers.unit_agreement`), else at one unit's scale
(:func:`~advisor.search.measured._tiers.on_one_unit`). The all-BF16 and drift measurements of a unit
belong to that unit, so they are not queue items any unit could take: each worker makes them in the
queue trial of its first plan, and in a queue trial of its own at the end.

A tier that can run a plan's operating-point search in the engine that serves its stated workloads (vLLM:
``searches_in_serving``, then ``open_for``) does so as it meters the plan: each stored predicted operating
point of the plan is searched as measured in that engine (:func:`~advisor.search.measured._batch_search.
search_batches`), and the outcomes travel in the queue trial to the main study (``record_measured_points``), so
the later measured operating-points stage has nothing left to start an engine for.

Two processes must never meter one GPU at once: a worker on the coordinator's GPU stays out
(:func:`joins`); spawned workers get a GPU each when there are enough (``workflows.spawn``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import TrialState

from advisor.errors import UnsupportedError
from advisor.estimate import DriftCheck, EnergyEstimate, MeasuredUnit
from advisor.plan import Plan
from advisor.recipe.schema import Workload
from advisor.search.measured._batch_search import search_batches, searches_from_points
from advisor.search.measured._contract import MeasuredTier
from advisor.search.measured._tiers import drift_record
from advisor.search.storage import WORKER_ATTR, holder_is_running, reap
from advisor.search.trial_record import (
    measured_energy,
    measured_points,
    measured_units,
    operating_points,
    record_drift,
    record_measured,
    record_measured_points,
    record_unit,
)

QUEUE_SUFFIX = ":measure"
ROUND_ATTR = "measure_round"  # in the main study: what the workers wait for (:func:`set_round`)
PLAN, DRIFT, IDLE = "plan", "drift", "idle"  # what a queue trial is
OWED_GRACE_S = 60.0  # a worker that finished a plan this long ago and made no drift check is taken for gone


@dataclass(frozen=True)
class Unit:
    """The GPU a measurement was made on (``gpu_uuid`` None: a meter that does not name its unit)."""

    gpu_uuid: str | None
    gpu: str

    @property
    def key(self) -> str:
        return self.gpu_uuid or self.gpu

    def to_dict(self) -> dict[str, Any]:
        return {"gpu_uuid": self.gpu_uuid, "gpu": self.gpu}

    def labelled(self, estimates: Sequence[EnergyEstimate]) -> list[EnergyEstimate]:
        """The estimates with this unit in their source (unchanged for a meter that names none)."""
        if self.gpu_uuid is None:
            return list(estimates)
        return [replace(e, source=f"{e.source} on {self.gpu_uuid}") for e in estimates]


def unit_of(model: MeasuredTier) -> Unit:
    """The unit of a measured tier: its ``gpu_uuid`` and ``gpu_name`` where it names them (NVML's), else its label."""
    return Unit(model.gpu_uuid or None, model.gpu_name or model.label)


def open_queue(main: optuna.Study, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """The main study's measurement queue in ``storage`` (the main study's), created on first use."""
    return optuna.create_study(study_name=main.study_name + QUEUE_SUFFIX, storage=storage, load_if_exists=True,
                               sampler=optuna.samplers.RandomSampler())


def enqueue(queue: optuna.Study, plans: Sequence[Plan], measured: set[str]) -> int:
    """Put each plan not measured and not already waiting or running into the queue, in order; returns how many."""
    pending = {t.user_attrs.get("plan_id") for t in queue.get_trials(deepcopy=False,
                                                                      states=(TrialState.WAITING, TrialState.RUNNING))}
    n = 0
    for plan in plans:
        if plan.id not in measured and plan.id not in pending:
            queue.enqueue_trial({}, user_attrs={"kind": PLAN, "plan_id": plan.id, "plan": plan.params()})
            pending.add(plan.id)
            n += 1
    return n


def set_round(main: optuna.Study, state: str, unit: Unit | None = None, reference: Plan | None = None) -> None:
    """What workers wait for: ``pending`` (the coordinator is still searching), ``open`` (with the coordinator's
    unit and the all-BF16 plan every unit meters first), ``closed``."""
    main.set_user_attr(ROUND_ATTR, {"state": state, "unit": unit.key if unit else None,
                                    "reference": reference.params() if reference else None})


def round_of(main: optuna.Study) -> dict[str, Any]:
    return main.user_attrs.get(ROUND_ATTR) or {"state": "closed", "unit": None}


def joins(main: optuna.Study, unit: Unit) -> bool:
    """A worker meters only on a GPU of its own: never on the coordinator's."""
    return round_of(main).get("unit") != unit.key


class Measurer:
    """One process's part of the queue: its model and unit, the all-BF16 ``reference``, and whether its unit
    owes a drift check (it measured a plan since its last one)."""

    def __init__(self, main: optuna.Study, queue: optuna.Study, model: MeasuredTier, workloads: Sequence[Workload],
                 reference: Plan, worker: dict[str, Any], on_trial: Callable[[], None] = lambda: None) -> None:
        self.main, self.queue, self.model, self.workloads = main, queue, model, list(workloads)
        self.reference, self.worker, self.on_trial = reference, worker, on_trial
        self.unit = unit_of(model)
        stored = measured_units(main).get(self.unit.key)
        self.first: list[EnergyEstimate] | None = stored.reference if stored else None
        self.owes_drift_check = False
        self.measured = 0

    def _measure(self, plan: Plan, operating: dict[str, list[dict[str, Any]]] | None = None
                 ) -> list[EnergyEstimate]:
        """``plan``'s estimates; with ``operating``, its operating points searched as measured in the same
        engine first, where the tier can (module docstring), put there under the plan's id."""
        if operating is not None and self.model.searches_in_serving:
            points = [p for p in operating_points(self.main) if p["plan_id"] == plan.id]
            searches = searches_from_points(points, {w.name: w for w in self.workloads})
            if searches:
                self.model.open_for(plan, [s.first() for s in searches])
                operating[plan.id] = search_batches(self.model, plan, searches)
        return self.unit.labelled([self.model.estimate(plan, w) for w in self.workloads])

    def objective(self, trial: optuna.Trial) -> float:
        trial.set_user_attr(WORKER_ATTR, self.worker)  # first: a RUNNING trial names its process
        trial.set_user_attr("unit", self.unit.to_dict())
        kind = trial.user_attrs.get("kind")
        if kind is None:  # nothing was waiting: the fresh trial is this unit's drift check, or nothing
            if not self.owes_drift_check:
                trial.set_user_attr("kind", IDLE)
                raise optuna.TrialPruned("nothing waiting")
            trial.set_user_attr("kind", kind := DRIFT)
            trial.set_user_attr("plan_id", self.reference.id)
        if kind == DRIFT:
            return self._drift_check(trial)
        plan = Plan.from_params(trial.user_attrs["plan"])
        if trial.user_attrs.get("unit_reference"):  # copied by the retry from the dead worker's trial: not ours
            trial.set_user_attr("unit_reference", None)
        operating: dict[str, list[dict[str, Any]]] = {}
        try:
            if self.first is None:  # this unit's all-BF16 comes before its first plan
                self.first = self._measure(self.reference, operating)
                trial.set_user_attr("unit_reference", [e.to_dict() for e in self.first])
            estimates = self.first if plan.id == self.reference.id else self._measure(plan, operating)
        except UnsupportedError as exc:  # e.g. NVFP4 on Hopper: it stays predicted, and says so
            trial.set_user_attr("stays_predicted", str(exc))
            raise optuna.TrialPruned(str(exc)) from None
        if operating:
            trial.set_user_attr("operating", operating)
        trial.set_user_attr("energy", [e.to_dict() for e in estimates])
        if plan.id != self.reference.id:
            self.owes_drift_check = True
        self.measured += 1
        return estimates[0].j_per_token

    def _drift_check(self, trial: optuna.Trial) -> float:
        if trial.user_attrs.get("drift_unit", self.unit.key) != self.unit.key or self.first is None:
            raise optuna.TrialPruned("the drift check of a unit that left")  # a retried check of another GPU
        trial.set_user_attr("drift_unit", self.unit.key)
        self.model.forget(self.reference)  # a tier that keeps what it served (vLLM) serves it again
        again = self._measure(self.reference)
        check = drift_record(self.reference.id, self.reference.label(), self.first, again)
        trial.set_user_attr("drift", check.to_dict())
        self.owes_drift_check = False
        return again[0].j_per_token

    def serve(self, stay_since: datetime | None = None, poll_s: float = 0.5) -> int:
        """Take plans until none waits, then make this unit's drift check. With ``stay_since`` (the coordinator):
        then wait until no queue trial runs anywhere (taking any a dead worker left, re-enqueued) and no live
        worker still owes the drift check of what it measured since then. Returns how many plans this process
        measured."""
        while True:
            reap(self.queue)
            if self.queue.get_trials(deepcopy=False, states=(TrialState.WAITING,)) or self.owes_drift_check:
                # failed as stale while alive (a starved heartbeat): its retry waits in the queue, as in budget.work
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    self.queue.optimize(self.objective, n_trials=1, gc_after_trial=False)
                self.on_trial()
                continue
            if stay_since is None or not (self.queue.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                                          or self._others_owe_drift_checks(stay_since)):
                return self.measured
            time.sleep(poll_s)

    def _others_owe_drift_checks(self, since: datetime) -> bool:
        """Another unit measured a plan since its last drift check, and its worker is alive and has only just
        finished (between its last plan and its drift check, no trial of it runs)."""
        last: dict[str, optuna.trial.FrozenTrial | None] = {}
        finished = [t for t in self.queue.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if t.datetime_complete is not None and t.datetime_complete >= since]
        for t in sorted(finished, key=lambda t: t.datetime_complete):
            key = Unit(**t.user_attrs["unit"]).key if "unit" in t.user_attrs else None
            if t.user_attrs.get("kind") == DRIFT:
                last[key] = None
            elif t.user_attrs.get("plan_id") != self.reference.id:
                last[key] = t
        return any(t is not None and key != self.unit.key
                   and (datetime.now() - t.datetime_complete).total_seconds() < OWED_GRACE_S
                   and holder_is_running(t.user_attrs.get(WORKER_ATTR) or {}) is not False
                   for key, t in last.items())


@dataclass
class Merged:
    """What :func:`merge` has taken from the queue so far in one stage (it runs more than once)."""

    since: datetime
    seen: set[int] = field(default_factory=set)
    plans: int = 0
    drift_checks: list[DriftCheck] = field(default_factory=list)


def merge(main: optuna.Study, queue: optuna.Study, merged: Merged, say: Callable[[str], None]) -> None:
    """Copy the queue's finished measurements into the main study: each plan's estimates (the first
    measurement of a plan counts, as before), each unit's first all-BF16 and the plans it measured, this
    stage's drift checks; one line for each plan that stays predicted. Only the coordinator writes them."""
    done = set(measured_energy(main))
    searched = {plan_id for plan_id, _ in measured_points(main)}
    units = measured_units(main)
    changed: set[str] = set()
    for t in queue.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        ua = t.user_attrs
        fresh = t.number not in merged.seen and t.datetime_complete is not None and t.datetime_complete >= merged.since
        unit = Unit(**ua["unit"]) if "unit" in ua else None
        if unit is not None and ua.get("unit_reference") and unit.key not in units:
            units[unit.key] = MeasuredUnit(unit.gpu_uuid, unit.gpu,
                                           [EnergyEstimate.from_dict(e) for e in ua["unit_reference"]], [])
            changed.add(unit.key)
        if t.state == TrialState.PRUNED:
            if fresh and "stays_predicted" in ua:
                say(f"  {Plan.from_params(ua['plan']).label()}: stays predicted ({ua['stays_predicted']})")
            merged.seen.add(t.number)
            continue
        for plan_id, points in (ua.get("operating") or {}).items():  # the first search of a plan counts
            if plan_id not in searched:
                record_measured_points(main, plan_id, points)
                searched.add(plan_id)
        if ua.get("kind") == PLAN and ua["plan_id"] not in done:
            record_measured(main, ua["plan_id"], [EnergyEstimate.from_dict(e) for e in ua["energy"]])
            done.add(ua["plan_id"])
            merged.plans += 1
            if unit is not None and unit.key in units:
                units[unit.key].plans.append(ua["plan_id"])
                changed.add(unit.key)
        if ua.get("kind") == DRIFT and fresh:
            check = DriftCheck.from_dict(ua["drift"])
            record_drift(main, check)
            merged.drift_checks.append(check)
        merged.seen.add(t.number)
    for key in changed:
        record_unit(main, units[key])


def failed_plans(main: optuna.Study, queue: optuna.Study, since: datetime) -> list[str]:
    """One line per plan whose measurement raised in a worker since ``since`` and was not retried (a killed
    worker's plan is; an error is not, as a trial's is not): it stays predicted."""
    trials = queue.get_trials(deepcopy=False)
    retried = {t.system_attrs.get("failed_trial") for t in trials}
    done = set(measured_energy(main))
    out = []
    for t in trials:
        ua = t.user_attrs
        if t.state == TrialState.FAIL and ua.get("kind") == PLAN and t.number not in retried \
                and ua["plan_id"] not in done and t.datetime_complete is not None and t.datetime_complete >= since:
            worker = ua.get(WORKER_ATTR) or {}
            out.append(f"  {Plan.from_params(ua['plan']).label()}: measuring it failed in process {worker.get('pid')} "
                       f"on {(ua.get('unit') or {}).get('gpu_uuid')} (see that worker's log); it stays predicted")
    return out
