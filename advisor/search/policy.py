"""Multi-fidelity policy: which plans earn the expensive stages, and what is feasible now.

The cheap tier (proxy KL, predicted or measured energy) scores every trial; lm-eval scores
only the baselines and the feasible front, lowest energy first. Feasibility is decided
here and in :mod:`advisor.search.frontier`, from the study's stored values.
"""

from __future__ import annotations

import optuna

from advisor.plan import Plan
from advisor.search.frontier import Candidate, pareto_front
from advisor.search.study import candidates


def benchmark_targets(study: optuna.Study, primary_workload: str, max_candidates: int) -> list[Plan]:
    """Baselines first, then the feasible front by rising energy, at most ``max_candidates`` of them."""
    cands = candidates(study)
    baselines = [c.plan for c in cands if c.plan.uniform_format() is not None]
    front = [c.plan for c in pareto_front(cands, primary_workload)]
    chosen: dict[str, Plan] = {p.id: p for p in baselines}
    for plan in front:
        if len(chosen) >= len(baselines) + max_candidates:
            break
        chosen.setdefault(plan.id, plan)
    return list(chosen.values())


def best_feasible(cands: list[Candidate], primary_workload: str) -> Candidate | None:
    """The lowest-energy plan within the accuracy budget so far (progress lines show it)."""
    pool = [c for c in cands if c.feasible]
    return min(pool, key=lambda c: (c.energy(primary_workload), c.kl)) if pool else None


def best_feasible_line(study: optuna.Study, primary_workload: str) -> str:
    best = best_feasible(candidates(study), primary_workload)
    if best is None:
        return "no plan within budget yet"
    return f"best within budget: {best.plan.label()} KL {best.kl:.4f}, {best.energy(primary_workload):.4g} J/token"
