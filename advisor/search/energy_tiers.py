"""Two energy tiers: every trial is priced by the predicted tier (a profile cost model or the
roofline); the baselines and the front's candidates are then measured on the GPU (NVML, the
serving runtime) when one of the target kind is here. Measured numbers, where they exist,
replace the predicted ones in the front and the recommendation; the report shows both.

Each plan's measurements are stored in their own study attribute (``measured_energy:<plan id>``),
so no two writers ever read-modify-write one attribute.

Plans are measured one after another, minutes apart, and in a resumed search by another process: the
same GPU can draw a few percent more or less by then (H100s, 2026-11-26, an 8B shape: on one unit the
plans one process measured drew 2.4-3.5% over their predictions and those the resumed process measured
0.2-1.0%; on another, all-BF16 measured again across the two processes drew 0.6% more;
reports/benchmarks/search_8b_gpu.md). So every stage that measured a plan ends by measuring the
reference (all-BF16) again: the change against its first measurement is the drift of that stage
(``measured_drift:<time>``), and measured plans closer to the recommendation than that are not
ordered by the measurements (:func:`near_ties`).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import optuna

PREFIX = "measured_energy:"
DRIFT_PREFIX = "measured_drift:"


def record_measured(study: optuna.Study, plan_id: str, estimates: list[dict[str, Any]]) -> None:
    study.set_user_attr(PREFIX + plan_id, estimates)


def measured_energy(study: optuna.Study) -> dict[str, list[dict[str, Any]]]:
    """plan id -> the measured EnergyEstimate dicts (one per workload)."""
    return {k.removeprefix(PREFIX): v for k, v in study.user_attrs.items() if k.startswith(PREFIX)}


def prediction_errors(predicted: list[dict[str, Any]], measured: list[dict[str, Any]]) -> dict[str, float]:
    """workload -> (predicted - measured) / measured, in percent."""
    by_w = {e["workload"]: e["j_per_token"] for e in predicted}
    return {m["workload"]: 100.0 * (by_w[m["workload"]] - m["j_per_token"]) / m["j_per_token"]
            for m in measured if m["workload"] in by_w and m["j_per_token"] > 0}


def drift_record(plan_id: str, label: str, first: list[dict[str, Any]], again: list[dict[str, Any]]) -> dict[str, Any]:
    """The reference plan measured again: its J/token then and now per workload, and the change in percent."""
    then = {e["workload"]: e["j_per_token"] for e in first}
    now = {e["workload"]: e["j_per_token"] for e in again if e["workload"] in then and then[e["workload"]] > 0}
    return {"plan_id": plan_id, "plan": label, "source": again[0]["source"] if again else "",
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "first_j_per_token": {w: then[w] for w in now}, "again_j_per_token": now,
            "drift_pct": {w: 100.0 * (now[w] / then[w] - 1) for w in now}}


def record_drift(study: optuna.Study, record: dict[str, Any]) -> None:
    study.set_user_attr(f"{DRIFT_PREFIX}{time.time_ns():020d}", record)  # one attribute per check


def measured_drifts(study: optuna.Study) -> list[dict[str, Any]]:
    """Every drift check of the study, oldest first (the keys hold the time in nanoseconds)."""
    return [v for k, v in sorted(study.user_attrs.items()) if k.startswith(DRIFT_PREFIX)]


def largest_drift_pct(drifts: list[dict[str, Any]], workload: str) -> float | None:
    """The largest |drift| any check saw on ``workload`` (None: never checked)."""
    seen = [abs(d["drift_pct"][workload]) for d in drifts if workload in d["drift_pct"]]
    return max(seen) if seen else None


def j_per_token(record: dict[str, Any], workload: str) -> float:
    """A trial record's J/token (measured where it was measured) on ``workload``."""
    return next(e["j_per_token"] for e in record["energy"] if e["workload"] == workload)


def near_ties(best: dict[str, Any], records: list[dict[str, Any]], workload: str, drift_pct: float) -> list[dict]:
    """Measured, feasible plans (trial records) other than ``best`` whose measured J/token on ``workload`` lies
    within ``drift_pct`` percent of ``best``'s: the measurements do not say which of them costs less."""
    ref = j_per_token(best, workload)
    out = {r["plan_id"]: r for r in records
           if r.get("energy_measured") and r["feasible"] and r["plan_id"] != best["plan_id"]
           and abs(j_per_token(r, workload) / ref - 1) * 100 <= drift_pct}
    return sorted(out.values(), key=lambda r: j_per_token(r, workload))
