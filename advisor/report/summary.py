"""summary.json, report.md and the plots, rebuilt from the study storage alone."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna

from advisor.accuracy.stats import spearman
from advisor.errors import InputError
from advisor.models.shape import ModelShape
from advisor.plan import LayerGroup
from advisor.report.markdown import render_markdown
from advisor.report.plots import plot_format_map, plot_front
from advisor.report.schema import SCHEMA_VERSION, Summary
from advisor.search.energy_tiers import measured_energy, prediction_errors
from advisor.search.frontier import Candidate, Recommendation, pareto_front, recommend
from advisor.search.study import candidates


def _trial_record(
    c: Candidate, study_trial: optuna.trial.FrozenTrial, groups: Sequence[LayerGroup], bench: dict,
    measured: dict[str, list[dict[str, Any]]],
) -> dict:
    ua = study_trial.user_attrs
    measured_here = measured.get(c.plan.id)
    return {
        "trial": c.trial,
        "plan_id": c.plan.id,
        "label": c.plan.label(),
        "formats": {k: v.value for k, v in c.plan.formats.items()},
        "kv_cache": c.plan.kv_cache.value,
        "effective_bits": round(c.plan.effective_bits(groups), 3),
        "kl": c.kl,
        "ppl": c.ppl,
        "ppl_increase_pct": 100 * (c.ppl / ua["ppl_bf16"] - 1),
        "energy": measured_here or ua["energy"],
        "predicted_energy": ua["energy"],
        "energy_measured": measured_here is not None,
        "prediction_error_pct": prediction_errors(ua["energy"], measured_here) if measured_here else None,
        "feasible": c.feasible,
        "benchmark": bench.get(c.plan.id, {}),
        "benchmark_drop": c.benchmark_drop,
    }


def build_summary(study: optuna.Study) -> Summary:
    """The run's summary from the study storage alone (any host can rebuild it)."""
    meta = study.user_attrs
    missing = [key for key in ("shape", "recipe") if key not in meta]
    if missing:
        raise InputError(f"study {study.study_name!r} holds no run record ({', '.join(missing)} missing): its search "
                         "stopped before the model was prepared, so there is nothing to report; rerun `advisor search`")
    shape = ModelShape.from_dict(meta["shape"])
    workloads = [w["name"] for w in meta["recipe"]["workloads"]]
    cands = candidates(study)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    front = pareto_front(cands, workloads[0])
    rec = recommend(cands, workloads)
    bench = study.user_attrs.get("benchmark", {})
    measured = measured_energy(study)
    records = [_trial_record(c, trials[c.trial], shape.groups, bench, measured) for c in cands]
    baselines = {}
    for c in cands:
        if c.plan.uniform_weights() is not None and c.plan.label() not in baselines:
            baselines[c.plan.label()] = c.trial
    energy_labels = sorted({e["source"] for r in records for e in r["energy"] + r["predicted_energy"]})
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
        "recommendation": _recommendation_dict(rec, records),
        "proxy_benchmark_spearman": _spearman(records),
        "benchmark_status": meta.get("benchmark_status"),
        "sensitivity": meta.get("sensitivity"),
        "shape": meta["shape"],
        "recipe": meta["recipe"],
    })


def _spearman(records: list[dict[str, Any]]) -> float | None:
    """Rank correlation of proxy KL and mean benchmark accuracy over distinct scored plans."""
    scored = {r["plan_id"]: r for r in records if r["benchmark"]}
    if len(scored) < 3:
        return None
    kl = [r["kl"] for r in scored.values()]
    acc = [sum(s["acc"] for s in r["benchmark"].values()) / len(r["benchmark"]) for r in scored.values()]
    value = spearman(kl, acc)
    return None if math.isnan(value) else value


def _recommendation_dict(rec: Recommendation | None, records: list[dict]) -> dict | None:
    if rec is None:
        return None
    record = next(r for r in records if r["trial"] == rec.candidate.trial)
    return {**record, "reason": rec.reason, "accuracy_metric": rec.accuracy_metric}



def write_report(study: optuna.Study, out_dir: Path) -> Path:
    """Write summary.json, report.md, front.png and format_map.png into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = build_summary(study)
    data = summary.model_dump(mode="json")
    if summary.trials:
        plot_front(data, out_dir / "front.png")
    if summary.recommendation:
        plot_format_map(data, out_dir / "format_map.png")
    (out_dir / "summary.json").write_text(summary.to_json())
    (out_dir / "report.md").write_text(render_markdown(data))
    return out_dir / "report.md"
