"""The measured tier of `advisor search` (coordinator) and `advisor worker`: the baselines and the front's
candidates metered on every worker's GPU through the study's measurement queue (``search.measured._queue``)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import optuna

from advisor.plan import Plan
from advisor.recipe.schema import Recipe
from advisor.search.measured import (
    MeasuredTier,
    Measurer,
    Merged,
    enqueue,
    failed_plans,
    joins,
    measured_on_one_scale,
    merge,
    open_queue,
    round_of,
    set_round,
    unit_of,
)
from advisor.search.policy import measurement_targets
from advisor.search.storage import open_storage, owner_is_live, read_owner, this_worker
from advisor.search.trial_record import measured_energy
from advisor.workflows.progress import ProgressReporter


def energy_stage(study: optuna.Study, ctx: Any, recipe: Recipe, progress: ProgressReporter) -> None:
    """The measured tier: the plans to meter go into the queue; this process meters them beside the workers
    that joined, each on its own GPU, waits until none waits or runs, and merges the results into the study."""
    model: MeasuredTier | None = ctx.measured_model
    if model is None:
        return
    try:
        _coordinate(study, model, recipe, progress)
    finally:
        set_round(study, "closed")  # the workers waiting for the queue leave


def _coordinate(study: optuna.Study, model: MeasuredTier, recipe: Recipe, progress: ProgressReporter) -> None:
    queue = open_queue(study, open_storage(recipe.storage_url, heartbeat_s=recipe.search.heartbeat_s))
    merged = Merged(since=datetime.now())  # Optuna's trial times are local and naive too
    merge(study, queue, Merged(since=merged.since), progress.print)  # what an interrupted run measured is kept
    done = measured_energy(study)
    targets = measurement_targets(study, [w.name for w in recipe.workloads], recipe.search.measured_candidates)
    if targets is None:
        return
    plans = [p for p in (targets.reference, *targets.baselines, *targets.candidates) if p.id not in done]
    if not plans:
        return
    enqueue(queue, plans, set(done))
    unit = unit_of(model)
    set_round(study, "open", unit, targets.reference)
    with progress.stage(f"measured energy ({model.label})", total=len(plans) + 1) as stage:
        def on_trial() -> None:
            merge(study, queue, merged, progress.print)
            stage.advance(min(merged.plans, len(plans)), note=f"{merged.plans} plans measured")

        measurer = Measurer(study, queue, model, recipe.workloads, targets.reference, this_worker(unit.gpu_uuid),
                            on_trial)
        try:
            measurer.serve(stay_since=merged.since)
        finally:
            merge(study, queue, merged, progress.print)
        for line in failed_plans(study, queue, merged.since):
            progress.print(f"warning: {line.strip()}")
        for check in merged.drift_checks:
            progress.print(f"  drift check: {check.plan} measured again drew "
                           + ", ".join(f"{v:+.1f}% on '{w}'" for w, v in check.drift_pct.items())
                           + " against its first measurement" + _on_unit(check.source))
        _, agreement, _ = measured_on_one_scale(study)
        if agreement and agreement["agree"] is False:
            progress.print(f"warning: the GPUs' all-BF16 differ by {agreement['spread_pct']:.1f}% on "
                           f"'{agreement['workload']}', more than a GPU drifted against itself "
                           f"({agreement['tolerance_pct']:.1f}%): the plans measured on other GPUs are put on "
                           f"{agreement['scaled_to']}'s scale (the report says how)")
        stage.advance(len(plans) + 1)


def _on_unit(source: str) -> str:
    return f" ({source.rsplit(' on ', 1)[1]})" if " on GPU-" in source else ""


def worker_stage(study: optuna.Study, storage: optuna.storages.BaseStorage, model: MeasuredTier, recipe: Recipe,
                 progress: ProgressReporter, poll_s: float = 1.0) -> int:
    """`advisor worker` after its trials: wait for the coordinator's queue, meter plans from it on this GPU until
    none waits, then leave. Returns how many plans it measured (0: no queue, or this GPU is the coordinator's)."""
    study_id = storage.get_study_id_from_name(study.study_name)
    while round_of(study)["state"] == "pending":
        if not owner_is_live(read_owner(storage, study_id)):
            return 0
        time.sleep(poll_s)
    current = round_of(study)
    unit = unit_of(model)
    if current["state"] != "open" or not joins(study, unit):
        return 0
    queue = open_queue(study, storage)
    reference = Plan.from_params(current["reference"])
    with progress.stage(f"measured energy ({model.label})"):
        return Measurer(study, queue, model, recipe.workloads, reference, this_worker(unit.gpu_uuid)).serve()
