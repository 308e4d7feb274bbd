"""Two energy tiers: every trial is priced by the predicted tier (a profile cost model or the
roofline); the baselines and the front's candidates are then measured on the GPU (NVML, the
serving runtime) when one of the target kind is here. Measured numbers, where they exist,
replace the predicted ones in the front and the recommendation; the report shows both.

The measurements and drift checks are stored by :mod:`advisor.search.trial_record`.

Plans are measured one after another, minutes apart, and in a resumed search by another process: the
same GPU can draw a few percent more or less by then (H100s, 2026-11-26, an 8B shape: on one unit the
plans one process measured drew 2.4-3.5% over their predictions and those the resumed process measured
0.2-1.0%; on another, all-BF16 measured again across the two processes drew 0.6% more;
reports/benchmarks/search_8b_gpu.md). So every stage that measured a plan ends by measuring the
reference (all-BF16) again: the change against its first measurement is the drift of that stage, and
measured plans closer to the recommendation than that are not ordered by the measurements (:func:`near_ties`).
Plans measured on several GPUs are compared as measured where the GPUs' all-BF16 agree within that drift, else
on one GPU's scale (:func:`unit_factors`: four H100s of one host differed by 3.9% on 2026-11-28,
reports/benchmarks/distributed_gpu.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import optuna

from advisor.estimate import DriftCheck, EnergyEstimate, MeasuredUnit, j_per_token_by_workload
from advisor.search.frontier import Candidate
from advisor.search.trial_record import measured_drifts, measured_energy, measured_units


def prediction_errors(predicted: Sequence[EnergyEstimate], measured: Sequence[EnergyEstimate]) -> dict[str, float]:
    """workload -> (predicted - measured) / measured, in percent."""
    by_w = j_per_token_by_workload(predicted)
    return {m.workload: 100.0 * (by_w[m.workload] - m.j_per_token) / m.j_per_token
            for m in measured if m.workload in by_w and m.j_per_token > 0}


def drift_record(plan_id: str, label: str, first: Sequence[EnergyEstimate],
                 again: Sequence[EnergyEstimate]) -> DriftCheck:
    """The reference plan measured again: its J/token then and now per workload, and the change in percent."""
    then = j_per_token_by_workload(first)
    now = {e.workload: e.j_per_token for e in again if e.workload in then and then[e.workload] > 0}
    return DriftCheck(plan_id=plan_id, plan=label, source=again[0].source if again else "",
                      measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      first_j_per_token={w: then[w] for w in now}, again_j_per_token=now,
                      drift_pct={w: 100.0 * (now[w] / then[w] - 1) for w in now})


def largest_drift_pct(drifts: Sequence[DriftCheck], workload: str) -> float | None:
    """The largest |drift| any check saw on ``workload`` (None: never checked)."""
    seen = [abs(d.drift_pct[workload]) for d in drifts if workload in d.drift_pct]
    return max(seen) if seen else None


def near_ties(best: Candidate, cands: Sequence[Candidate], workload: str, drift_pct: float) -> list[Candidate]:
    """Measured, feasible plans other than ``best`` whose measured J/token on ``workload`` lies within
    ``drift_pct`` percent of ``best``'s: the measurements do not say which of them costs less."""
    ref = best.energy(workload)
    out = {c.plan.id: c for c in cands
           if c.energy_measured and c.feasible and c.plan.id != best.plan.id
           and abs(c.energy(workload) / ref - 1) * 100 <= drift_pct}
    return sorted(out.values(), key=lambda c: c.energy(workload))


def unit_agreement(units: Sequence[MeasuredUnit], drifts: Sequence[DriftCheck], workload: str) -> dict | None:
    """Whether plans measured on different GPUs may be compared on ``workload``: the spread of the units' first
    all-BF16 (largest over smallest, in percent) against the largest drift any unit showed against itself. None
    with fewer than two units; ``agree`` None when no drift check gives the tolerance."""
    refs = {u.key: j_per_token_by_workload(u.reference)[workload] for u in units
            if workload in j_per_token_by_workload(u.reference)}
    if len(refs) < 2:
        return None
    spread = 100.0 * (max(refs.values()) / min(refs.values()) - 1)
    tolerance = largest_drift_pct(drifts, workload)
    return {"workload": workload, "reference_j_per_token": refs, "spread_pct": spread, "tolerance_pct": tolerance,
            "agree": None if tolerance is None else spread <= tolerance}


def unit_factors(measured: Mapping[str, list[EnergyEstimate]], units: Sequence[MeasuredUnit],
                 agreement: dict | None) -> tuple[dict[str, dict[str, float]], str | None]:
    """Where the units disagree (``agreement``'s ``agree`` False): for each plan measured on another unit than the
    reference unit, per workload, the reference unit's all-BF16 over its own unit's (each unit meters all-BF16
    before its first plan for this), the factor that puts its numbers on the reference unit's scale. The
    reference unit is the one whose all-BF16 is the run's measured all-BF16 (the coordinator's). Returns the
    factors by plan id and the reference unit's key (None: nothing to scale)."""
    if not units or not agreement or agreement.get("agree") is not False:
        return {}, None
    ref = next((u for u in units if any(measured.get(p) == u.reference for p in u.plans)), units[0])
    base = j_per_token_by_workload(ref.reference)
    factors = {}
    for unit in (u for u in units if u is not ref):
        own = j_per_token_by_workload(unit.reference)
        factors.update({plan_id: {w: base[w] / own[w] for w in base if own.get(w)} for plan_id in unit.plans})
    return factors, ref.key


def on_one_unit(measured: Mapping[str, list[EnergyEstimate]], factors: Mapping[str, Mapping[str, float]],
                onto: str | None) -> dict[str, list[EnergyEstimate]]:
    """``measured`` with each plan that has ``factors`` (:func:`unit_factors`) put on ``onto``'s scale, labelled."""
    return {plan_id: [_scaled(e, factors[plan_id][e.workload], onto)
                      if e.workload in factors.get(plan_id, {}) else e for e in estimates]
            for plan_id, estimates in measured.items()}


def point_on_one_unit(point: dict, factors: Mapping[str, Mapping[str, float]], onto: str | None) -> dict:
    """A measured operating point (MeasuredPoint.to_dict()) put on ``onto``'s scale as :func:`on_one_unit` puts
    its plan's estimates (the factor of the plan's stated workload, taken to hold at any batch)."""
    factor = factors.get(point.get("plan_id", ""), {}).get(point.get("workload", ""))
    if factor is None or point.get("j_per_token") is None:
        return point
    return {**point, "j_per_token": point["j_per_token"] * factor,
            "source": _onto(point.get("source", ""), factor, onto)}


def _scaled(e: EnergyEstimate, factor: float, onto: str | None) -> EnergyEstimate:
    return replace(e, j_per_token=e.j_per_token * factor, decode_j_per_token=e.decode_j_per_token * factor,
                   prefill_j_per_input_token=e.prefill_j_per_input_token * factor,
                   source=_onto(e.source, factor, onto))


def _onto(source: str, factor: float, onto: str | None) -> str:
    return f"{source}, put on {onto}'s scale by the units' all-BF16 (x{factor:.4f})"


def measured_on_one_scale(study: optuna.Study) -> tuple[dict[str, list[EnergyEstimate]], dict[str, Any] | None,
                                                         dict[str, dict[str, float]]]:
    """The measured energy of each plan, on one unit's scale where the units that measured them disagree
    (:func:`~advisor.search.measured._tiers.unit_factors`); the units' agreement on the primary workload with
    ``scaled_to``, the unit whose scale they were put on (None: as measured); and the factors by plan id."""
    measured = measured_energy(study)
    workloads = study.user_attrs.get("recipe", {}).get("workloads") or []
    units = list(measured_units(study).values())
    agreement = unit_agreement(units, measured_drifts(study), workloads[0]["name"]) if workloads else None
    factors, onto = unit_factors(measured, units, agreement)
    if agreement is not None:
        agreement["scaled_to"] = onto
    return on_one_unit(measured, factors, onto), agreement, factors
