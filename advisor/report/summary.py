"""summary.json, report.md and the plots, rebuilt from the study storage alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
from pydantic import ValidationError

from advisor.errors import InputError
from advisor.estimate import EnergyEstimate
from advisor.files import write_text_atomically
from advisor.formats import Format
from advisor.models.shape import ModelShape
from advisor.plan import LayerGroup
from advisor.recipe.schema import SiteSpec
from advisor.report.markdown import render_markdown
from advisor.report.plots import plot_format_map, plot_front, plot_operating_points
from advisor.report.schema import (
    SCHEMA_VERSION,
    OperatingPointRecord,
    RecommendationRecord,
    Summary,
    TrialRecord,
)
from advisor.search.acceptance import as_record
from advisor.search.frontier import Candidate, Recommendation, one_tier, pareto_front, recommend
from advisor.search.measured import (
    largest_drift_pct,
    measured_on_one_scale,
    near_ties,
    point_on_one_unit,
    prediction_errors,
)
from advisor.search.operating import Payback, SearchEnergy, basis_words, operating_basis, payback
from advisor.search.stats import proxy_calibration
from advisor.search.study import benchmark_budget, candidates
from advisor.search.trial_record import (
    TaskScores,
    benchmark_scores,
    measured_drifts,
    measured_points,
    measured_units,
    operating_points,
    scores_of,
    search_energy,
)


def _trial_record(
    c: Candidate, study_trial: optuna.trial.FrozenTrial, groups: Sequence[LayerGroup], bench: dict[str, TaskScores],
    measured: dict[str, list[EnergyEstimate]],
) -> TrialRecord:
    scores = scores_of(study_trial)
    predicted = list(scores.energy)
    measured_here = measured.get(c.plan.id)
    return TrialRecord.model_validate({
        "trial": c.trial,
        "plan_id": c.plan.id,
        "label": c.plan.label(),
        "formats": {k: v.value for k, v in c.plan.formats.items()},
        "kv_cache": c.plan.kv_cache.value,
        "effective_bits": round(c.plan.effective_bits(groups), 3),
        "kl": c.kl,
        "ppl": c.ppl,
        "ppl_increase_pct": scores.ppl_increase_pct,
        "energy": measured_here or predicted,
        "predicted_energy": predicted,
        "energy_measured": measured_here is not None,
        "prediction_error_pct": prediction_errors(predicted, measured_here) if measured_here else None,
        "feasible": c.feasible,
        "benchmark": bench.get(c.plan.id, {}),
        "acceptance": as_record(c.acceptance) if c.acceptance is not None else None,
    })


def _one_per_plan(cands: list[Candidate]) -> list[Candidate]:
    """The trial that scored each plan: a sampler's repeat of a plan (marked ``repeat``, its scores copied) adds no
    row, so every plan is one row of summary.json however often a sampler proposed it."""
    first: dict[str, Candidate] = {}
    for c in sorted(cands, key=lambda c: c.trial):
        first.setdefault(c.plan.id, c)
    return list(first.values())


def build_summary(study: optuna.Study) -> Summary:
    """The run's summary from the study storage alone (any host can rebuild it)."""
    meta = study.user_attrs
    missing = [key for key in ("shape", "recipe") if key not in meta]
    if missing:
        raise InputError(f"study {study.study_name!r} holds no run record ({', '.join(missing)} missing): its search "
                         "stopped before the model was prepared, so there is nothing to report; rerun `advisor search`")
    shape = ModelShape.from_dict(meta["shape"])
    workloads = [w["name"] for w in meta["recipe"]["workloads"]]
    cands = _one_per_plan(candidates(study))
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    front = pareto_front(cands, workloads[0])
    max_drop, confidence = benchmark_budget(study)
    measured, agreement, factors = measured_on_one_scale(study)
    points = _operating_points(study, factors, agreement and agreement["scaled_to"])
    operating, bases = operating_basis(points, {c.plan.id for c in one_tier(cands) if c.feasible})
    rec = recommend(cands, workloads, benchmark_rule=f"upper bound of the {confidence:.0%} paired interval "
                    f"of the drop within {max_drop:g} on every task",
                    operating=operating, basis={w: basis_words(bases, w) for w in bases})
    bench = benchmark_scores(study)
    records = [_trial_record(c, trials[c.trial], shape.groups, bench, measured) for c in cands]
    baselines = {}
    for c in cands:
        if c.plan.uniform_weights() is not None and c.plan.label() not in baselines:
            baselines[c.plan.label()] = c.trial
    energy_labels = sorted({e.source for r in records for e in [*r.energy, *r.predicted_energy]})
    drifts = measured_drifts(study)
    recommended = _recommendation_record(rec, records)
    drift = largest_drift_pct(drifts, workloads[0])
    units = list(measured_units(study).values())
    ties = [] if rec is None or drift is None or not rec.candidate.energy_measured else \
        [c.trial for c in near_ties(rec.candidate, cands, workloads[0], drift)]
    return Summary.model_validate({
        "schema_version": SCHEMA_VERSION,
        "tool": "precision-advisor",
        "storage": meta.get("storage"),
        "version": meta.get("version"),
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run": study.study_name,
        "model": meta.get("model"),
        "target": meta["recipe"]["target"],
        "workloads": meta["recipe"]["workloads"],
        "accuracy_budget": meta["recipe"]["accuracy"],
        "benchmark": meta["recipe"].get("benchmark"),
        "labels": {
            "accuracy": meta.get("accuracy_label", "measured (proxy on held-out tokens)"),
            "energy": energy_labels,
        },
        "versions": meta.get("versions", {}),
        "timings_s": meta.get("timings", {}),
        "trials": records,
        "front": [c.plan.id for c in front],
        "front_trials": [c.trial for c in front],
        "baselines": baselines,
        "recommendation": recommended,
        "measured_drift": drifts,
        "near_ties": ties,
        "measured_units": units,
        "unit_agreement": agreement,
        "proxy_calibration": _proxy_calibration(cands, confidence),
        "operating_points": points,
        "operating_basis": {w: b.to_dict() for w, b in bases.items()},
        "payback": _payback(rec, cands, points, meta["recipe"], search_energy(study)),
        "benchmark_status": meta.get("benchmark_status"),
        "sensitivity": meta.get("sensitivity"),
        "shape": meta["shape"],
        "recipe": meta["recipe"],
    })


def _proxy_calibration(cands: list[Candidate], confidence: float) -> list[dict[str, Any]]:
    """Per task: benchmark drop against proxy KL over the distinct plans judged against BF16
    (BF16 itself counts as drop 0 at KL 0)."""
    judged = list({c.plan.id: c for c in cands if c.acceptance is not None}.values())
    bf16 = next((c for c in cands if c.plan.uniform_format() == Format.BF16 and c.benchmark), None)
    tasks = sorted({t.task for c in judged for t in c.acceptance.tasks})
    out = []
    for task in tasks:
        rows = [(c.plan.label() + f" ({c.plan.id})", c.kl, t.interval) for c in judged
                if (t := c.acceptance.task(task)) is not None]
        if bf16 is not None:
            rows.append((f"all-bf16 ({bf16.plan.id})", 0.0, None))
        fit = proxy_calibration(task, [r[0] for r in rows], [r[1] for r in rows],
                                [r[2].drop if r[2] else 0.0 for r in rows],
                                [(r[2].ci_low, r[2].ci_high) if r[2] else (0.0, 0.0) for r in rows], confidence)
        record = {k: getattr(fit, k) for k in ("task", "n_plans", "spearman", "spearman_ci", "slope", "slope_ci",
                                                "intercept", "contradicted_pairs", "confidence", "undefined")}
        out.append({**record, "disagrees": fit.disagrees})
    return out


def _operating_points(study: optuna.Study, factors: Mapping[str, Mapping[str, float]],
                      onto: str | None) -> list[OperatingPointRecord]:
    """The predicted points, each with its measured twin where the measured tier searched from that batch (a
    resumed search under another objective moves the batch: the older measurement no longer belongs to it), on
    one unit's scale where the units disagree (``factors``, ``onto``: :func:`measured_on_one_scale`)."""
    measured = measured_points(study)

    def twin(p: dict[str, Any]) -> dict[str, Any] | None:
        m = measured.get((p.get("plan_id"), p.get("workload")))
        keep = m is not None and m.get("predicted_batch", m.get("batch")) == p.get("batch")
        return point_on_one_unit(m, factors, onto) if keep else None

    try:
        return [OperatingPointRecord.model_validate({**p, "measured": twin(p)}) for p in operating_points(study)]
    except ValidationError as exc:
        raise InputError(f"the study's operating points are not what `advisor search` stores ({exc.errors()[0]['msg']}"
                         "); rerun `advisor search --resume` to recompute them") from None


def _payback(rec: Recommendation | None, cands: list[Candidate], points: list[OperatingPointRecord],
             recipe: dict[str, Any], spent: dict[str, Any] | None) -> Payback | None:
    """The search's joules against the recommendation's saving on the primary workload (at the operating
    points where it states an objective) at the site's request rate."""
    if rec is None or spent is None:
        return None
    workload = recipe["workloads"][0]
    name = workload["name"]
    at = {p.plan_id: p for p in points if p.workload == name}
    bf16 = next((c for c in one_tier(cands) if c.plan.uniform_format() == Format.BF16), None)
    if bf16 is None:
        return None
    if at:
        if bf16.plan.id not in at or rec.candidate.plan.id not in at or not at[bf16.plan.id].meets:
            return None
        bf16_j, rec_j = at[bf16.plan.id].j_per_token, at[rec.candidate.plan.id].j_per_token
    else:
        bf16_j, rec_j = bf16.energy(name), rec.candidate.energy(name)
    rate = recipe.get("site", {}).get("requests_per_s", SiteSpec().requests_per_s)
    found = payback(SearchEnergy(**spent), name, rate, workload["output_tokens"], bf16_j, rec_j)
    return found


def _recommendation_record(rec: Recommendation | None, records: list[TrialRecord]) -> RecommendationRecord | None:
    if rec is None:
        return None
    record = next(r for r in records if r.trial == rec.candidate.trial)
    return RecommendationRecord(**dict(record), reason=rec.reason, accuracy_metric=rec.accuracy_metric)



def write_report(study: optuna.Study, out_dir: Path) -> Path:
    """Write summary.json, report.md, front.png and format_map.png into ``out_dir``, each through a
    temporary file renamed over the old one (never written through a symbolic link)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = build_summary(study)
    data = summary.model_dump(mode="json")
    if summary.trials:
        plot_front(data, out_dir / "front.png")
    if summary.recommendation:
        plot_format_map(data, out_dir / "format_map.png")
    if summary.operating_points:
        plot_operating_points(data, out_dir / "operating_points.png")
    write_text_atomically(out_dir / "summary.json", summary.to_json())
    write_text_atomically(out_dir / "report.md", render_markdown(data, str(out_dir)))
    return out_dir / "report.md"
