"""Sensitivity-guided plan proposals: a multiple-choice knapsack over layer groups.

With per-group damage ``d[g][f]`` (proxy KL when only group ``g`` runs in format ``f``)
and per-group energy ``c[g][f]`` both taken as additive, the cheapest plan whose
predicted damage stays within ``B`` is

    minimize   sum_g c[g][f_g]    subject to   sum_g d[g][f_g] <= B,

one format per group: a multiple-choice knapsack, solved exactly as a small MILP with
SciPy's HiGHS (``scipy.optimize.milp``). Sweeping ``B`` gives plans along the predicted
front; the study evaluates them for real (the additive model ignores interactions).

When the KV-cache format is searched, it is one more row of the knapsack (``kv_cache``, with
its own choices, BF16 or FP8), priced by the sensitivity of an FP8 KV cache alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from advisor.formats import Format
from advisor.plan import KV_CACHE_KEY, LayerGroup, Plan

Table = Mapping[str, Mapping[Format, float]]  # group -> format -> value


def solve_knapsack(
    groups: Sequence[LayerGroup], formats: Sequence[Format], damage: Table, cost: Table, budget: float,
    kv_cache: Sequence[Format] = (Format.BF16,),
) -> Plan | None:
    """The lowest-cost plan with additive damage <= ``budget``; None if the solver finds none.

    With more than one ``kv_cache`` format, ``damage`` and ``cost`` hold a ``kv_cache`` row too.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    rows: list[tuple[str, Sequence[Format]]] = [(g.name, formats) for g in groups]
    if len(kv_cache) > 1:
        rows.append((KV_CACHE_KEY, kv_cache))
    n = sum(len(fs) for _, fs in rows)
    c = np.array([cost[name][f] for name, fs in rows for f in fs], dtype=float)
    d = np.array([damage[name][f] for name, fs in rows for f in fs], dtype=float)
    one_per_row = np.zeros((len(rows), n))
    start = 0
    for i, (_, fs) in enumerate(rows):
        one_per_row[i, start : start + len(fs)] = 1.0
        start += len(fs)
    constraints = [
        LinearConstraint(one_per_row, lb=1.0, ub=1.0),
        LinearConstraint(d.reshape(1, -1), lb=-np.inf, ub=budget),
    ]
    res = milp(c, constraints=constraints, integrality=np.ones(n), bounds=Bounds(0, 1))
    if res.x is None:
        return None
    x, start, chosen = np.asarray(res.x), 0, {}
    for name, fs in rows:
        chosen[name] = fs[int(x[start : start + len(fs)].argmax())]
        start += len(fs)
    kv = chosen.pop(KV_CACHE_KEY, Format.BF16)
    return Plan(chosen, kv)


def predicted(plan: Plan, table: Table) -> float:
    kv = table[KV_CACHE_KEY][plan.kv_cache] if KV_CACHE_KEY in table else 0.0
    return kv + sum(table[g][f] for g, f in plan.formats.items())


def knapsack_proposals(
    groups: Sequence[LayerGroup],
    formats: Sequence[Format],
    damage: Table,
    cost: Table,
    budgets: Sequence[float],
    kv_cache: Sequence[Format] = (Format.BF16,),
) -> list[Plan]:
    """Distinct knapsack plans over a sweep of damage budgets, in budget order."""
    plans: dict[str, Plan] = {}
    for b in budgets:
        plan = solve_knapsack(groups, formats, damage, cost, b, kv_cache)
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

    def __init__(self, groups: Sequence[LayerGroup], formats: Sequence[Format], sens, max_kl: float,
                 kv_cache: Sequence[Format] = (Format.BF16,)) -> None:
        self.groups, self.formats, self.sens, self.max_kl = groups, formats, sens, max_kl
        self.kv_cache = tuple(kv_cache) if KV_CACHE_KEY in sens.damage else (Format.BF16,)

    def propose(self, scale: float) -> list[Plan]:
        return knapsack_proposals(self.groups, self.formats, self.sens.damage, self.sens.energy,
                                  budget_sweep(self.max_kl, scale), self.kv_cache)

    def predicted_damage(self, plan: Plan) -> float:
        return predicted(plan, self.sens.damage)
