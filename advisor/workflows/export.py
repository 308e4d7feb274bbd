"""`advisor export`, top to bottom: read the run's summary, load the model, reuse the run's tokens,
quantize the plan with ModelOpt, export, reload and compare, write the serving config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from advisor.deploy.checkpoint import ExportResult, export_plan
from advisor.errors import InputError
from advisor.workflows.memory import check_cpu_export
from advisor.workflows.outputs import check_output_dir
from advisor.workflows.preflight import check_model


def run_tokens(run_dir: Path, recipe: Any, loaded: Any, fingerprint: str) -> Any:
    """The run's stored token sets when they belong to this model; else fresh ones (not stored)."""
    from advisor.workflows.context import load_or_build_tokens

    return load_or_build_tokens(recipe, loaded, run_dir, fingerprint, store=False)


def served_workloads(summary: dict[str, Any], plan_id: str) -> list[dict[str, Any]]:
    """The run's workloads as the serving configs should size them for ``plan_id``: a workload with a latency
    objective at the plan's operating batch under it (measured where the measured tier found one that meets,
    else predicted), the batch its J/token was priced at and the most in flight that keep the objective
    (``max-num-seqs`` then enforces it); the others at their stated batch."""
    points = {p["workload"]: p for p in summary.get("operating_points") or [] if p.get("plan_id") == plan_id}
    out = []
    for w in summary["workloads"]:
        point = points.get(w["name"])
        if point is None or not point.get("meets"):
            out.append(w)
            continue
        measured = point.get("measured") or {}
        if measured.get("meets") and measured.get("batch"):
            batch, how = int(measured["batch"]), "measured"
        else:
            batch, how = int(point["batch"]), "predicted"
        out.append({**w, "batch_size": batch, "sized_for": f"the operating batch under its objective, {how}"})
    return out


def export_run(
    run_dir: Path,
    out_dir: Path,
    plan_id: str | None = None,
    model: str | None = None,
    smoke: bool = True,
    status: Any = lambda _msg: None,
) -> ExportResult:
    """Export the recommendation (or ``plan_id``) of an ``advisor search`` run directory."""
    from advisor.deploy.verification import read_summary, stored_plan, summary_recipe
    from advisor.models.arithmetic import to_scoring_arithmetic
    from advisor.models.loading import load_model
    from advisor.workflows.context import model_fingerprint

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"RUN_DIR {run_dir} is not a directory; give the folder `advisor search` wrote")
    summary = read_summary(run_dir / "summary.json")
    plan, record = stored_plan(summary, plan_id, run_dir / "summary.json")
    recipe = summary_recipe(summary, model=model)
    check_output_dir(out_dir, "--out", must_be_empty=True)
    check_model(recipe, workloads=False)
    check_cpu_export(recipe)
    status(f"loading model {recipe.model.source}")
    loaded = load_model(recipe.model, "cpu")
    stored_fp = (summary.get("model") or {}).get("fingerprint")
    fingerprint = model_fingerprint(loaded, stored_fp)
    to_scoring_arithmetic(loaded.model, "cpu")  # quantized and scored as a search on this machine does
    tokens = run_tokens(run_dir, recipe, loaded, fingerprint)
    notes = []
    if stored_fp and stored_fp != fingerprint:
        notes.append(f"the model's weights (fingerprint {fingerprint}) differ from the run's ({stored_fp}); "
                     "the plan was searched on other weights")
    status(f"quantizing plan {plan.id}, exporting, reloading")
    return export_plan(
        loaded, plan, tokens, out_dir, served_workloads(summary, plan.id), target=summary.get("target"),
        stored_kl=record.get("kl"), smoke=smoke, extra_warnings=tuple(notes),
    )
