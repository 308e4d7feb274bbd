"""The measured batch search (advisor.search.operating_search): where the predicted operating batch misses its
objective as measured, smaller batches are metered until the largest that meets is found or the budget is
spent; with a fake measured tier whose TPOT grows with the batch (and one whose TPOT is not monotone)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from advisor.formats import Format
from advisor.plan import LayerGroup, Plan
from advisor.recipe.schema import Workload
from advisor.search.operating_measured import from_timed
from advisor.search.operating_search import EXTRA_METERINGS, BatchSearch, curve_batch, search_batches

GROUPS = (LayerGroup("layers.0.qkv", ("m0",), ((8, 8),)),)
PLAN = Plan.uniform(GROUPS, Format.BF16)


def predicted_tpot(batch: float) -> float:
    return 4.0 + 0.08 * batch


CURVE = [(b, predicted_tpot(b), 1.0 / b) for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)]


class FakeTier:
    """Times requests: TPOT ``tpot(batch)`` ms, TTFT three times it; records every batch it meters."""

    def __init__(self, tpot: Callable[[int], float]) -> None:
        self.tpot, self.metered = tpot, []

    def measure_points(self, plan, workloads):
        out = []
        for w in workloads:
            self.metered.append(w.batch_size)
            t = self.tpot(w.batch_size)
            row = {"j_per_token": 1.0 / w.batch_size, "tokens_per_s": 100.0 * w.batch_size, "tpot_ms_p50": t,
                   "ttft_ms_p50": 3 * t}
            out.append(from_timed(plan, w, row, "measured (Fake GPU, 2026-11-27)"))
        return out


def largest_meeting(tpot: Callable[[int], float], objective: float) -> int:
    return max(b for b in range(1, 1000) if tpot(b) <= objective)


def search(tier: FakeTier, objective: float, predicted_batch: int, **kw) -> dict:
    return search_batches(tier, PLAN, [BatchSearch(Workload(name="chat", tpot_ms=objective), predicted_batch,
                                                   CURVE, **kw)])[0]


CURVES = {"steeper than predicted": lambda b: 6 + 0.1 * b, "flatter, with a larger offset": lambda b: 7.2 + 0.036 * b}


@pytest.mark.parametrize(("curve", "objective"), [("steeper than predicted", 8.0), ("steeper than predicted", 12.0),
                                                  ("flatter, with a larger offset", 8.0)])
def test_a_missed_point_is_searched_down_to_the_largest_batch_that_meets(curve, objective):
    tpot = CURVES[curve]
    predicted = round((objective - 4.0) / 0.08)  # where the predicted curve reaches the objective
    assert tpot(predicted) > objective  # the predicted batch misses as measured
    tier = FakeTier(tpot)
    got = search(tier, objective, predicted, predicted={"tpot_ms": objective, "j_per_token": 0.5 / predicted})
    true = largest_meeting(tpot, objective)
    assert got["prediction_error_pct"]["tpot_ms"] == pytest.approx(100 * (objective / tpot(predicted) - 1))
    assert got["prediction_error_pct"]["j_per_token"] == pytest.approx(-50.0)  # the fake's J/token is 1 / batch
    assert got["batch"] == true and got["meets"] is True and tpot(got["batch"]) <= objective
    assert tier.metered[0] == predicted and len(tier.metered) <= 1 + EXTRA_METERINGS
    assert got["predicted_batch"] == predicted and [t["batch"] for t in got["trail"]] == tier.metered
    assert got["trail"][0]["meets"] is False and got["trail"][0]["tpot_ms"] == pytest.approx(tpot(predicted))
    assert got["tpot_ms"] == pytest.approx(tpot(true)) and got["j_per_token"] == pytest.approx(1 / true)
    assert got["search"].startswith(f"batch {true} is the largest that meets as measured ({true + 1} misses")


def test_a_point_that_meets_is_metered_once():
    tier = FakeTier(lambda b: 3 + 0.05 * b)
    got = search(tier, 12.0, 100)
    assert tier.metered == [100] and got["batch"] == 100 and got["search"] == "meets at the predicted batch 100"


def test_a_step_time_that_is_not_monotone_gives_the_largest_metered_batch_that_meets():
    def bumpy(b: int) -> float:  # slower between 55 and 65 (say, steps outside the captured graphs)
        return 6 + 0.1 * b + (3.0 if 55 <= b <= 65 else 0.0)

    tier = FakeTier(bumpy)
    got = search(tier, 12.0, 100)
    met = [t["batch"] for t in got["trail"] if t["meets"]]
    assert len(tier.metered) == 1 + EXTRA_METERINGS and met and got["batch"] == max(met)
    assert bumpy(got["batch"]) <= 12.0 < bumpy(62)  # 62 (in the bump) missed; a smaller batch met
    assert got["batch"] < 55 and "search stopped after 3 extra meterings (the budget)" in got["search"]
    assert f"batch {got['batch']} meets" in got["search"]


def test_no_batch_meets_when_even_batch_1_misses():
    tier = FakeTier(lambda b: 6 + 0.1 * b)
    got = search(tier, 6.05, 100)
    assert tier.metered[-1] == 1 and len(tier.metered) <= 1 + EXTRA_METERINGS
    assert got["meets"] is False and got["batch"] == 1
    assert got["search"] == "no batch meets TPOT 6.05 ms (p50) as measured: batch 1 gives TPOT 6.1 ms"


def test_the_budget_spent_keeps_the_best_batch_found_and_says_the_search_stopped():
    tier = FakeTier(lambda b: 5 + 0.1 * b + 0.0004 * b * b)  # convex: each guess lands below the answer
    got = search(tier, 12.0, 100, budget=2)
    assert len(tier.metered) == 3 and got["meets"] is True
    assert got["batch"] == max(t["batch"] for t in got["trail"] if t["meets"]) < largest_meeting(tier.tpot, 12.0)
    assert got["search"].startswith("search stopped after 2 extra meterings (the budget)")
    nothing = FakeTier(lambda b: 6 + 0.1 * b)
    got = search(nothing, 12.0, 100, budget=1)
    assert got["meets"] is False and "no metered batch meets TPOT 12 ms (p50); batch 62 gives" in got["search"]


def test_ttft_and_several_objectives_are_searched_together_per_plan():
    tier = FakeTier(lambda b: 6 + 0.1 * b)
    chat = BatchSearch(Workload(name="chat", tpot_ms=12.0), 100, CURVE)
    first = BatchSearch(Workload(name="first", tpot_ms=20.0, ttft_ms=30.0), 100, CURVE)  # TTFT = 3 TPOT binds
    got = search_batches(tier, PLAN, [chat, first])
    assert [g["batch"] for g in got] == [60, 40] and [g["workload"] for g in got] == ["chat", "first"]


def test_an_engine_that_does_not_time_the_objective_is_not_searched():
    class Untimed(FakeTier):
        def measure_points(self, plan, workloads):
            return [p.__class__(**{**p.to_dict(), "tpot_ms": None, "ttft_ms": None, "meets": None})
                    for p in super().measure_points(plan, workloads)]

    tier = Untimed(lambda b: 20.0)
    got = search(tier, 12.0, 100)
    assert tier.metered == [100] and got["meets"] is None and "not searched" in got["search"]


def test_curve_batch_reads_the_predicted_curve():
    assert curve_batch(CURVE, predicted_tpot(40)) == pytest.approx(40)
    assert curve_batch(CURVE, 1.0) is None and curve_batch(CURVE, 1e9) == 256
