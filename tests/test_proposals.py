from __future__ import annotations

import itertools

import pytest

from advisor.formats import Format
from advisor.plan import LayerGroup, Plan
from advisor.search.proposals import budget_sweep, knapsack_proposals, predicted, solve_knapsack
from advisor.search.sensitivity import Sensitivity, measure

GROUPS = tuple(LayerGroup(f"g{i}", (f"m{i}",), ((16, 16),)) for i in range(5))
FORMATS = [Format.BF16, Format.FP8, Format.NVFP4]
DAMAGE = {f"g{i}": {Format.BF16: 0.0, Format.FP8: 0.01 * (i + 1), Format.NVFP4: 0.05 * (i + 1)} for i in range(5)}
COST = {f"g{i}": {Format.BF16: 0.0, Format.FP8: -1.0, Format.NVFP4: -1.5} for i in range(5)}


def brute_force(budget):
    best = None
    for combo in itertools.product(FORMATS, repeat=len(GROUPS)):
        plan = Plan({g.name: f for g, f in zip(GROUPS, combo, strict=True)})
        if predicted(plan, DAMAGE) <= budget + 1e-12:
            key = (predicted(plan, COST), predicted(plan, DAMAGE))
            if best is None or key < best[0]:
                best = (key, plan)
    return best[1]


@pytest.mark.parametrize("budget", [0.0, 0.02, 0.05, 0.1, 0.16, 0.4, 1.0])
def test_knapsack_matches_brute_force_cost(budget):
    plan = solve_knapsack(GROUPS, FORMATS, DAMAGE, COST, budget)
    assert predicted(plan, DAMAGE) <= budget + 1e-9
    assert predicted(plan, COST) == pytest.approx(predicted(brute_force(budget), COST))


def test_proposals_are_distinct_and_cheaper_with_larger_budgets():
    plans = knapsack_proposals(GROUPS, FORMATS, DAMAGE, COST, budget_sweep(0.1))
    assert len({p.id for p in plans}) == len(plans) >= 4
    costs = [predicted(p, COST) for p in plans]
    assert costs == sorted(costs, reverse=True)


def test_scale_correction_shrinks_the_budgets():
    assert budget_sweep(0.1, scale=2.0) == pytest.approx([b / 2 for b in budget_sweep(0.1)])


def test_measure_quantizes_one_group_at_a_time():
    seen = []

    def damage_of(plan):
        lowered = [g for g, f in plan.formats.items() if f != Format.BF16]
        seen.append(lowered)
        return DAMAGE[lowered[0]][plan.formats[lowered[0]]]

    sens = measure(GROUPS, FORMATS, damage_of, lambda p: predicted(p, COST))
    assert all(len(x) == 1 for x in seen) and len(seen) == 10
    assert sens.damage == DAMAGE and sens.energy == COST
    assert sens.most_sensitive(1) == [("g4", Format.NVFP4, 0.25)]
    assert Sensitivity.from_json(sens.to_json()).damage == DAMAGE


def test_kv_cache_is_one_more_knapsack_row_with_its_own_choices():
    kv_damage = {**DAMAGE, "kv_cache": {Format.BF16: 0.0, Format.FP8: 0.015}}
    kv_cost = {**COST, "kv_cache": {Format.BF16: 0.0, Format.FP8: -1.2}}
    kv = (Format.BF16, Format.FP8)
    for budget in (0.0, 0.02, 0.05, 0.1, 0.3):
        plan = solve_knapsack(GROUPS, FORMATS, kv_damage, kv_cost, budget, kv)
        best = None
        for combo in itertools.product(FORMATS, repeat=len(GROUPS)):
            for k in kv:
                p = Plan({g.name: f for g, f in zip(GROUPS, combo, strict=True)}, k)
                if predicted(p, kv_damage) <= budget + 1e-12 and (best is None or predicted(p, kv_cost) <
                                                                  predicted(best, kv_cost) - 1e-12):
                    best = p
        assert predicted(plan, kv_cost) == pytest.approx(predicted(best, kv_cost)), budget
    assert solve_knapsack(GROUPS, FORMATS, kv_damage, kv_cost, 0.015, kv).kv_cache == Format.FP8  # cheapest move
    assert solve_knapsack(GROUPS, FORMATS, kv_damage, kv_cost, 0.0, kv).kv_cache == Format.BF16


def test_measure_adds_the_kv_cache_row_only_when_it_is_searched():
    def damage_of(plan):
        return 0.015 if plan.kv_cache == Format.FP8 else sum(DAMAGE[g][f] for g, f in plan.formats.items())

    sens = measure(GROUPS, FORMATS, damage_of, lambda p: -1.2 * (p.kv_cache == Format.FP8),
                   kv_cache=(Format.BF16, Format.FP8))
    assert sens.damage["kv_cache"] == {Format.BF16: 0.0, Format.FP8: 0.015}
    assert sens.energy["kv_cache"][Format.FP8] == pytest.approx(-1.2)
    assert "kv_cache" not in measure(GROUPS, FORMATS, damage_of, lambda p: 0.0).damage


@pytest.mark.parametrize("damage", ["{bad", "[]", '{"key": {"a": 1}, "sensitivity": {"damage": 3}}'])
def test_a_damaged_sensitivity_cache_is_measured_again(tmp_path, damage):
    from advisor.search.sensitivity import load_cached, store

    path, key = tmp_path / "sensitivity.json", {"a": 1}
    store(path, key, Sensitivity(DAMAGE, COST, 64, 1.0))
    assert load_cached(path, key).damage == DAMAGE
    assert load_cached(path, {"a": 2}) is None
    path.write_text(damage)
    assert load_cached(path, key) is None
