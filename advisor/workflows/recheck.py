"""`advisor recheck`, top to bottom: read the stored recommendation, prepare the new model the
same way the search did, score the plan and BF16, check against the stored thresholds,
optionally re-search around the old plan, write recheck.json and recheck.md."""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from advisor.deploy.engines import require_engine_here
from advisor.deploy.verification import (
    Check,
    RecheckResult,
    check_new_version,
    neighbours,
    objective_checks,
    operating_batches,
    read_summary,
    recheck_checks,
    render_markdown,
    score_benchmark,
    stored_numbers,
    stored_plan,
    summary_recipe,
)
from advisor.errors import InputError
from advisor.files import write_text_atomically
from advisor.formats import Format
from advisor.plan import LayerGroup, Plan
from advisor.search.measured import MeasuredTier
from advisor.workflows.outputs import check_output_dir
from advisor.workflows.preflight import check_model


def research_around(ctx: Any, plan: Plan, groups: tuple[LayerGroup, ...], trials: int) -> dict[str, Any]:
    """A short in-memory study on the new model, seeded with the old plan, the baselines and
    the old plan's one-group neighbours (closest first); the sampler fills the rest."""
    import optuna

    from advisor.search.frontier import recommend
    from advisor.search.study import baseline_plans, candidates, enqueue_baselines, make_sampler, run_search

    recipe = ctx.recipe
    recipe = recipe.model_copy(update={"search": recipe.search.model_copy(update={"trials": trials})})
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["minimize", "minimize"],
                                sampler=make_sampler(recipe.search.sampler, recipe.search.seed))
    kv_dimension = len(recipe.kv_cache) > 1
    study.enqueue_trial(plan.params(kv_dimension))
    baselines = baseline_plans(groups, recipe.formats, recipe.kv_cache)
    enqueue_baselines(study, baselines, kv_dimension)
    room = max(0, trials - 1 - len(baselines))
    for n in neighbours(plan, list(recipe.formats))[:room]:
        study.enqueue_trial(n.params(kv_dimension), skip_if_exists=True)
    run_search(study, ctx, recipe, groups)
    cands = candidates(study)
    rec = recommend(cands, [w.name for w in recipe.workloads])
    out: dict[str, Any] = {"trials": len(cands), "seeded_with": plan.id}
    if rec is not None:
        c = rec.candidate
        out.update({
            "plan_id": c.plan.id, "label": c.plan.label(), "kl": c.kl, "feasible": c.feasible,
            "energy_j_per_token": c.energy_j_per_token, "reason": rec.reason,
            "formats": {k: v.value for k, v in c.plan.formats.items()}, "kv_cache": c.plan.kv_cache.value,
            "same_as_stored": c.plan.id == plan.id,
        })
    return out


def meter_objectives(model: MeasuredTier, plan: Plan, batches: dict[str, Any], workloads: Any, status: Any
                     ) -> tuple[list[Check], list[dict[str, Any]], list[str]]:
    """The plan metered at its operating batch from the run under each workload's objective (``batches``:
    :func:`advisor.deploy.verification.operating_batches`), checked against it as measured
    (:func:`advisor.deploy.verification.objective_checks`). Metered first: an engine that serves a plan once (vLLM)
    serves these batches and the stated workloads in one start."""
    from advisor.search.operating import at_batch

    wanted = [(w, *batches[w.name]) for w in workloads if w.has_objective and w.name in batches]
    if not wanted:
        return [], [], []
    first = [at_batch(w, batch) for w, batch, _, _ in wanted]
    status("metering the stored plan at its operating batches: " + ", ".join(
        f"{b.batch_size} ({origin}) on '{w.name}'" for (w, _, origin, _), b in zip(wanted, first, strict=True)))
    if model.searches_in_serving:
        model.open_for(plan, first)
    metered = model.measure_rounds(plan, first, lambda _points: [], max(b.batch_size for b in first))
    checks, points, untimed = [], [], []
    for (w, _, origin, stored), point in zip(wanted, metered, strict=True):
        found, missing = objective_checks(w, point, origin, stored)
        checks, untimed = checks + found, untimed + missing
        points.append({**point.to_dict(), "batch_from": origin})
    return checks, points, untimed


# What one engine start and one metering took serving an 8B through vLLM on an H200 (2026-11-29,
# reports/benchmarks/verify_time.md, round 4): 73-82 s a start with vLLM's and Triton's caches warm (144 s the first
# on a fresh machine, 105 s of it the kernel warm-up), 9-43 s a metering, 21 s on average (23 in 493 s; recheck's 5
# took 117 s). A recheck's line says what to expect from them; the model's size moves both.
START_S, METERING_S = 90.0, 21.0


def expected_minutes(starts: int, meterings: int) -> float:
    return max(1.0, (starts * START_S + meterings * METERING_S) / 60.0)


def same_shape(summary: dict[str, Any], shape: Any) -> bool:
    """The run's layer shape is ``shape`` (energy does not depend on the weights' values)."""
    from advisor.models.shape import ModelShape

    return "shape" in summary and ModelShape.from_dict(summary["shape"]) == shape


def reused_bf16(summary: dict[str, Any], label: str, shape: Any, workloads: Any) -> list[Any] | None:
    """The run's own all-BF16 energy per stated workload where it can stand for the new model's: measured by the
    same engine on a GPU of the same name (``label`` up to its date), the same layer shape (energy does not depend
    on the weights' values), every workload measured. None where any of that does not hold."""
    from advisor.estimate import EnergyEstimate

    number = (summary.get("baselines") or {}).get("all-bf16")
    record = next((t for t in summary.get("trials", []) if t.get("trial") == number), None)
    if record is None or not same_shape(summary, shape):
        return None
    engine = label.rpartition(",")[0]
    rows = {e["workload"]: e for e in record.get("energy", [])
            if e.get("measured") and e.get("source", "").startswith(engine + ",")}
    if not all(w.name in rows for w in workloads):
        return None
    out = []
    for w in workloads:
        e = rows[w.name]
        out.append(EnergyEstimate(workload=w.name, j_per_token=e["j_per_token"],
                                  decode_j_per_token=e["decode_j_per_token"],
                                  prefill_j_per_input_token=e["prefill_j_per_input_token"],
                                  decode_tokens_per_s=e["decode_tokens_per_s"],
                                  source=e["source"] + "; the run's own, reused: same shape, engine and GPU",
                                  measured=True))
    return out


def run_folder(summary_path: Path | str) -> Path:
    """The run's folder, from its summary.json or the folder itself (``--recommendation`` takes either)."""
    path = Path(summary_path)
    return path if path.is_dir() else path.parent


def matching_verify(summary: dict[str, Any], verify_path: Path, engine: str, tier: MeasuredTier, shape: Any,
                    workloads: Any) -> dict[str, Any] | None:
    """The run's ``advisor verify`` (its verify.json at ``verify_path``) where what it served can stand for what this
    recheck would serve: through ``engine``, by the version and on as many GPUs of the same name as ``tier`` (the
    recheck's measured tier: its label names them) meters on, the same layer shape, every workload of ``workloads``
    stated as the run stated it. None where any of that does not hold."""
    from advisor.recipe.schema import Workload

    try:
        verify = json.loads(Path(verify_path).read_text())
    except (OSError, ValueError):
        return None
    served_by = f"measured (vLLM {verify.get('vllm_version')}, {verify.get('gpu')},"  # verify's own label, up to it
    stated = {w["name"]: Workload(**w) for w in summary.get("workloads") or []}
    if (verify.get("engine") != engine or not tier.label.startswith(served_by)
            or verify.get("gpus", 1) != tier.gpus or not same_shape(summary, shape)
            or any(stated.get(w.name) != w for w in workloads)):
        return None
    return verify


def verified_bf16(verify: dict[str, Any] | None, workloads: Any) -> list[Any] | None:
    """All-BF16 as the run's ``advisor verify`` served it (``verify``: :func:`matching_verify`'s), every workload of
    ``workloads`` metered steady with its batch full. None where it is not. Its prefill was not metered apart
    (NaN)."""
    from advisor.estimate import EnergyEstimate

    bf16 = next((p for p in (verify or {}).get("plans") or [] if "bf16" in str(p.get("role", "")).split("+")), None)
    if verify is None or bf16 is None:
        return None
    rows = {e["workload"]: e for e in bf16.get("energy") or []
            if e.get("vllm_j_per_token") and e.get("batch_full") and not e.get("vllm_unstable")}
    if not all(w.name in rows for w in workloads):
        return None
    source = (f"measured (vLLM {verify.get('vllm_version')}, {verify.get('gpu')}, {verify.get('date')}); the run's "
              "own `advisor verify`, reused: same shape, engine and GPU")
    return [EnergyEstimate(workload=w.name, j_per_token=rows[w.name]["vllm_j_per_token"],
                           decode_j_per_token=rows[w.name]["vllm_j_per_token"],
                           prefill_j_per_input_token=float("nan"),
                           decode_tokens_per_s=rows[w.name]["vllm_tokens_per_s"], source=source, measured=True)
            for w in workloads]


def run_recheck(
    summary_path: Path,
    model: str,
    out_dir: Path,
    recipe_path: Path | None = None,
    research: bool = False,
    research_trials: int = 12,
    device: str | None = None,
    engine: str | None = None,
    status: Any = lambda _msg: None,
    gpus: int | None = None,
) -> RecheckResult:
    """Score the stored recommendation and BF16 on ``model``; write recheck.json and recheck.md. With ``engine``
    (builtin, vllm, tensorrt_llm) their energy is metered on the GPU here through it, as the search's measured
    tier does, and the predicted numbers are kept beside."""
    from advisor.workflows.context import prepare

    t0 = time.perf_counter()
    if engine is not None:
        require_engine_here(engine, "advisor recheck")  # before any model is read
    summary = read_summary(summary_path)
    plan, record = stored_plan(summary, None, summary_path)
    base = summary_recipe(summary, model=model, recipe_path=recipe_path)
    out_dir = Path(out_dir)
    check_output_dir(out_dir, "--out")
    check_model(base)
    check_new_version(summary, base.model)  # another model: refused before its weights are read
    out_dir.mkdir(parents=True, exist_ok=True)
    used = {Format.BF16, *plan.formats.values()}
    formats = list(base.formats) if research else [f for f in base.formats if f in used]
    metered = {"energy": "measured", "engine": engine, **({"gpus": gpus} if gpus else {})} if engine else {}
    recipe = base.model_copy(update={"out": out_dir, "name": "recheck", "storage": None, "formats": formats,
                                     **({"device": device} if device else {}), **metered})
    ctx = prepare(recipe, status=status, stored_fingerprint=(summary.get("model") or {}).get("fingerprint"))
    groups = ctx.loaded.shape.groups
    try:
        plan.check_against(groups)
    except InputError as exc:
        raise InputError(f"the new model's layers differ from the stored plan's ({exc}); "
                         "the plan cannot be applied: run `advisor search` on the new model") from None
    bf16 = Plan.uniform(groups, Format.BF16)
    tier = ctx.measured_model if engine is not None else None
    verify = None if engine is None or tier is None else matching_verify(
        summary, run_folder(summary_path) / "verify.json", engine, tier, ctx.loaded.shape, recipe.workloads)
    stored_bf16 = None if engine is None or tier is None else (
        reused_bf16(summary, tier.label, ctx.loaded.shape, recipe.workloads) or verified_bf16(verify, recipe.workloads))
    batches = operating_batches(summary, plan.id, verify)
    starts = 1 if stored_bf16 else 2
    # an engine's processes start one ahead: the first imports the engine while the plans are scored here
    with tier.started_ahead(ctx.loaded.architectures, jobs=starts) if tier is not None else nullcontext():
        status("scoring the stored plan and BF16 on the new model")
        ev_bf16 = ctx.evaluate(bf16)
        ev = ctx.evaluate(plan)
        predicted = {"energy": [e.to_dict() for e in ev.energy], "bf16_energy": [e.to_dict() for e in ev_bf16.energy]}
        objective, operating, untimed = [], [], []
        if engine is not None and tier is not None:
            model = tier
            model.prefill_apart = False  # the checks read J/token only
            loads = len({(w.batch_size, w.input_tokens, w.output_tokens) for w in recipe.workloads})
            meterings = loads * starts + len(batches)
            status(f"metering the stored plan{'' if stored_bf16 else ' and BF16'} ({model.label}): {starts} engine "
                   f"start(s) and {meterings} meterings, expected about {expected_minutes(starts, meterings):.0f} min; "
                   + ("BF16 is the run's own measurement (same shape, engine and GPU)" if stored_bf16 else
                      "the run holds no BF16 measurement of this engine and GPU to reuse"))
            objective, operating, untimed = meter_objectives(model, plan, batches, recipe.workloads, status)
            ev = replace(ev, energy=[model.estimate(plan, w) for w in recipe.workloads])
            ev_bf16 = replace(ev_bf16, energy=stored_bf16 or [model.estimate(bf16, w) for w in recipe.workloads])
    status("lm-eval tasks")
    bench = score_benchmark(ctx, plan, bf16, out_dir)
    checks = recheck_checks(recipe, ev, ev_bf16, bench) + objective
    research_out = None
    if research:
        status(f"re-searching around the old plan ({research_trials} trials)")
        research_out = research_around(ctx, plan, groups, research_trials)
    stored_fp = (summary.get("model") or {}).get("fingerprint")
    label = (f"measured (proxy on {ctx.tokens.heldout.numel()} held-out tokens, {ctx.tokens.source}, "
             f"on {ctx.scoring_place})")
    result = RecheckResult(
        verdict="pass" if all(c.ok for c in checks) else "regression",
        checks=checks,
        plan_id=plan.id,
        plan_label=plan.label(),
        model={"name": ctx.loaded.name, "fingerprint": ctx.fingerprint,
               "same_weights_as_stored": stored_fp == ctx.fingerprint},
        stored=stored_numbers(summary, record),
        new={"kl": ev.kl, "ppl": ev.ppl, "ppl_bf16": ev.ppl_bf16,
             "energy": [e.to_dict() for e in ev.energy], "bf16_energy": [e.to_dict() for e in ev_bf16.energy],
             **({"predicted": predicted, "engine": engine} if engine is not None else {}),
             **({"operating_points": operating} if operating else {})},
        labels={"accuracy": label, "energy": sorted({e.source for e in ev.energy}),
                **({"objectives": untimed} if untimed else {})},
        benchmark=bench,
        research=research_out,
        timings_s={**ctx.timings_s, "total_s": time.perf_counter() - t0},
        generated=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    write_text_atomically(out_dir / "recheck.json", json.dumps(result.to_dict(), indent=2, default=str))
    write_text_atomically(out_dir / "recheck.md", render_markdown(result))
    return result
