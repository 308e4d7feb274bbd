"""After the search: each plan's operating point under the workloads' latency objectives, and the search's own
energy, stored in the study for the report (:mod:`advisor.search.operating`, :mod:`advisor.search.operating._payback`).

The search's joules are a named window of :mod:`advisor.energy.meter` over the whole run: NVML's counters of every
GPU the run sees, or, without one, an estimate labelled so.
"""

from __future__ import annotations

import optuna

from advisor.energy.meter import EnergyWindow
from advisor.errors import InputError, UnsupportedError
from advisor.formats import GPU_SPECS
from advisor.plan import Plan
from advisor.recipe.schema import Recipe
from advisor.search.measured import BatchSearch, search_batches, searches_from_points, went_past_prediction
from advisor.search.operating import SearchEnergy, operating_points
from advisor.search.study import candidates
from advisor.search.trial_record import (
    measured_energy,
    measured_points,
    record_measured_points,
    record_operating_points,
    record_search_energy,
    search_energy,
)
from advisor.search.trial_record import operating_points as stored_operating_points
from advisor.workflows.context import RunContext
from advisor.workflows.progress import ProgressReporter


def operating_stage(study: optuna.Study, ctx: RunContext, recipe: Recipe, progress: ProgressReporter) -> None:
    """Every distinct plan that is feasible or a baseline, at its largest batch under each objective, from the
    predicted tier's step times (predicted, and labelled so, even where the stated batches were measured)."""
    if not any(w.has_objective for w in recipe.workloads):
        return
    model = ctx.energy_model
    plans: dict[str, Plan] = {}
    for c in candidates(study):
        if c.feasible or c.plan.uniform_weights() is not None:
            plans.setdefault(c.plan.id, c.plan)
    cap = recipe.site.power_cap_w
    capped = f"; within a {cap:g} W cap per GPU, steps stretched to energy / cap)" if cap is not None else ")"
    def source_of(plan: Plan) -> str:
        return model.step_source(plan).removesuffix(")") + "; steady state, step times" + capped

    with progress.stage("operating points"):
        try:
            points = operating_points(model, ctx.loaded.shape, GPU_SPECS[recipe.target], list(plans.values()),
                                      recipe.workloads, source_of, cap)
        except (InputError, UnsupportedError) as exc:  # the trials stand; the report says there are no points
            progress.print(f"  operating points: none ({exc})")
            return
    record_operating_points(study, [p.to_dict() for p in points])


def measured_operating_stage(study: optuna.Study, ctx: RunContext, recipe: Recipe, progress: ProgressReporter) -> None:
    """Every plan the measured tier metered, metered again at its own operating batch of each objective (the
    predicted point's batch) and, where that misses the objective as measured, at smaller batches until the
    largest that meets is found (:mod:`advisor.search.measured._batch_search`); stored beside the predicted point.
    Points already metered from the same predicted batch are kept."""
    model = ctx.measured_model
    metered = measured_energy(study)
    points = [p for p in stored_operating_points(study) if p["plan_id"] in metered]
    if model is None or not points:
        return
    done = measured_points(study)
    workloads = {w.name: w for w in recipe.workloads}
    plans = {c.plan.id: c.plan for c in candidates(study)}
    todo: dict[str, list[BatchSearch]] = {}
    for p in points:
        old = done.get((p["plan_id"], p["workload"]))
        fresh = old is None or old.get("predicted_batch", old.get("batch")) != p["batch"]
        if fresh and p["plan_id"] in plans:
            todo.setdefault(p["plan_id"], []).extend(searches_from_points([p], workloads))
    todo = {plan_id: searches for plan_id, searches in todo.items() if searches}
    if not todo:
        return
    with progress.stage(f"operating points measured ({model.label})", total=len(todo)) as stage:
        for i, (plan_id, searches) in enumerate(todo.items()):
            plan = plans[plan_id]
            stage.advance(i, note=f"{plan.label()} from batch " + ", ".join(str(s.predicted_batch) for s in searches))
            names = {s.workload.name for s in searches}
            kept = [v for (pid, w), v in done.items() if pid == plan_id and w not in names]
            try:
                got = search_batches(model, plan, searches)
            except UnsupportedError as exc:  # the predicted point stands, and says why it has no twin
                progress.print(f"  {plan.label()}: operating points not measured ({exc})")
                got = [{"plan_id": plan_id, "workload": s.workload.name, "batch": s.predicted_batch,
                        "predicted_batch": s.predicted_batch, "not_measured": str(exc)} for s in searches]
            for g in got:
                if went_past_prediction(g):
                    progress.print(f"  {plan.label()} on '{g['workload']}': {g['search']}")
            record_measured_points(study, plan_id, kept + got)
        stage.advance(len(todo))


def record_run_energy(study: optuna.Study, window: EnergyWindow) -> SearchEnergy:
    """This run's energy (``window``, begun with the run) added to what earlier runs of the study stored (a
    resumed search)."""
    earlier = search_energy(study)
    spent = window.end()
    total = SearchEnergy(spent.joules, spent.seconds, spent.source, spent.measured).plus(
        SearchEnergy(**earlier) if earlier else None)
    record_search_energy(study, total.to_dict())
    return total
