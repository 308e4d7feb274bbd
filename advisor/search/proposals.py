"""Sensitivity-guided plan proposals: a multiple-choice knapsack over layer groups.

With per-group damage ``d[g][f]`` (proxy KL when only group ``g`` runs in format ``f``)
and per-group energy ``c[g][f]`` both taken as additive, the cheapest plan whose
predicted damage stays within ``B`` is

    minimize   sum_g c[g][f_g]    subject to   sum_g d[g][f_g] <= B,

one format per group: a multiple-choice knapsack, solved exactly as a small MILP with
SciPy's HiGHS (``scipy.optimize.milp``). Sweeping ``B`` gives plans along the predicted
front; the study evaluates them for real (the additive model ignores interactions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from advisor.formats import Format
from advisor.plan import LayerGroup, Plan

Table = Mapping[str, Mapping[Format, float]]  # group -> format -> value


def solve_knapsack(
    groups: Sequence[LayerGroup], formats: Sequence[Format], damage: Table, cost: Table, budget: float
) -> Plan | None:
    """The lowest-cost plan with additive damage <= ``budget``; None if the solver finds none."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    names = [g.name for g in groups]
    nf = len(formats)
    n = len(names) * nf
    c = np.array([cost[g][f] for g in names for f in formats], dtype=float)
    d = np.array([damage[g][f] for g in names for f in formats], dtype=float)
    one_per_group = np.zeros((len(names), n))
    for i in range(len(names)):
        one_per_group[i, i * nf : (i + 1) * nf] = 1.0
    constraints = [
        LinearConstraint(one_per_group, lb=1.0, ub=1.0),
        LinearConstraint(d.reshape(1, -1), lb=-np.inf, ub=budget),
    ]
    res = milp(c, constraints=constraints, integrality=np.ones(n), bounds=Bounds(0, 1))
    if res.x is None:
        return None
    choice = np.asarray(res.x).reshape(len(names), nf).argmax(axis=1)
    return Plan({g: formats[int(k)] for g, k in zip(names, choice, strict=True)})


def predicted(plan: Plan, table: Table) -> float:
    return sum(table[g][f] for g, f in plan.formats.items())


def knapsack_proposals(
    groups: Sequence[LayerGroup],
    formats: Sequence[Format],
    damage: Table,
    cost: Table,
    budgets: Sequence[float],
) -> list[Plan]:
    """Distinct knapsack plans over a sweep of damage budgets, in budget order."""
    plans: dict[str, Plan] = {}
    for b in budgets:
        plan = solve_knapsack(groups, formats, damage, cost, b)
        if plan is not None:
            plans.setdefault(plan.id, plan)
    return list(plans.values())


def budget_sweep(max_kl: float, scale: float = 1.0) -> list[float]:
    """Damage budgets around the accuracy budget; ``scale`` corrects the additive model
    (observed KL / predicted KL of the plans already evaluated)."""
    fractions = (0.15, 0.3, 0.5, 0.7, 0.85, 1.0, 1.15, 1.4)
    return [max_kl * f / max(scale, 1e-9) for f in fractions]


class KnapsackProposer:
    """Knapsack plans from a sensitivity table (``damage`` and ``energy`` per group and format)."""

    def __init__(self, groups: Sequence[LayerGroup], formats: Sequence[Format], sens, max_kl: float) -> None:
        self.groups, self.formats, self.sens, self.max_kl = groups, formats, sens, max_kl

    def propose(self, scale: float) -> list[Plan]:
        return knapsack_proposals(self.groups, self.formats, self.sens.damage, self.sens.energy,
                                  budget_sweep(self.max_kl, scale))

    def predicted_damage(self, plan: Plan) -> float:
        return predicted(plan, self.sens.damage)
