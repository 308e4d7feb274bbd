"""Two energy tiers: every trial is priced by the predicted tier (a profile cost model or the
roofline); the baselines and the front's candidates are then measured on the GPU (NVML, the
serving runtime) when one of the target kind is here. Measured numbers, where they exist,
replace the predicted ones in the front and the recommendation; the report shows both.

Each plan's measurements are stored in their own study attribute (``measured_energy:<plan id>``),
so no two writers ever read-modify-write one attribute.
"""

from __future__ import annotations

from typing import Any

import optuna

PREFIX = "measured_energy:"


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
