"""The recommendation under a latency objective, chosen on the measured operating points where every plan it
compares was measured (advisor.search.operating._basis), and on the predicted ones, saying so, where not."""

from __future__ import annotations

from advisor.formats import Format
from advisor.plan import LayerGroup, Plan
from advisor.report.operating_md import operating_section
from advisor.report.schema import OperatingPointRecord
from advisor.search.frontier import Candidate, recommend
from advisor.search.operating import basis_words, operating_basis

GROUPS = (LayerGroup("layers.0.qkv", ("m0",), ((8, 8),)), LayerGroup("layers.0.down", ("m1",), ((8, 8),)))
BF16 = Plan.uniform(GROUPS, Format.BF16)
FP8 = Plan.uniform(GROUPS, Format.FP8)
MIXED = Plan({"layers.0.qkv": Format.BF16, "layers.0.down": Format.FP8})
ENGINE = "measured (vLLM 0.26.0, NVIDIA H100 80GB HBM3, driver 580, 2026-11-27)"


def point(plan: Plan, batch: int, j: float, measured: tuple[int, float, bool] | None = None) -> OperatingPointRecord:
    twin = None
    if measured is not None:
        b, mj, meets = measured
        twin = {"batch": b, "predicted_batch": batch, "j_per_token": mj, "tpot_ms": 11.0 if meets else 13.0,
                "meets": meets, "source": ENGINE, "search": f"batch {b} is the largest that meets as measured",
                "trail": [{"batch": batch, "tpot_ms": 13.0, "meets": False}, {"batch": b, "tpot_ms": 11.0,
                                                                               "meets": meets}]}
    return OperatingPointRecord.model_validate({
        "plan_id": plan.id, "plan": plan.label(), "workload": "chat", "meets": True, "bound": "objective",
        "batch": batch, "tpot_ms": 12.0, "ttft_ms": 40.0, "j_per_token": j, "tokens_per_s": 1e3, "power_w": 500.0,
        "source": "predicted (profile)", "measured": twin})


CANDS = [Candidate(0, BF16, 0.0, 10.0, {"chat": 0.2}, True), Candidate(1, FP8, 0.02, 10.0, {"chat": 0.1}, True),
         Candidate(2, MIXED, 0.01, 10.0, {"chat": 0.15}, True)]
COMPARED = {c.plan.id for c in CANDS}


def choose(points):
    chosen, bases = operating_basis(points, COMPARED)
    return recommend(CANDS, ["chat"], operating=chosen, basis={w: basis_words(bases, w) for w in bases}), bases


def test_every_plan_measured_the_rule_compares_the_measured_points():
    # predicted: FP8 serves batch 127 at 0.063 J/token, the mixed plan 110 at 0.07; as measured FP8 meets only at
    # batch 60 (0.095 J/token) and the mixed plan at 100 (0.075): the mixed plan is the lower as measured
    points = [point(BF16, 69, 0.113, (50, 0.13, True)), point(FP8, 127, 0.063, (60, 0.095, True)),
              point(MIXED, 110, 0.07, (100, 0.075, True))]
    rec, bases = choose(points)
    assert bases["chat"].measured and bases["chat"].label == ENGINE
    assert rec.candidate.plan.id == MIXED.id
    assert "at its largest batch under the objective (measured (vLLM 0.26.0" in rec.reason
    assert "42.3% less energy than all-BF16" in rec.reason  # 0.075 against BF16's measured 0.13
    predicted_only = recommend(CANDS, ["chat"], operating={(p.plan_id, p.workload): p for p in points})
    assert predicted_only.candidate.plan.id == FP8.id  # what the predicted points alone would have chosen


def test_a_plan_that_meets_no_batch_as_measured_cannot_be_recommended():
    points = [point(BF16, 69, 0.113, (50, 0.13, True)), point(FP8, 127, 0.063, (1, 0.9, False)),
              point(MIXED, 110, 0.07, (100, 0.075, True))]
    rec, _ = choose(points)
    assert rec.candidate.plan.id == MIXED.id


def test_a_mixed_set_is_chosen_on_predicted_points_and_says_what_the_measured_found():
    points = [point(BF16, 69, 0.113, (50, 0.13, True)), point(FP8, 127, 0.063, (60, 0.095, True)),
              point(MIXED, 110, 0.07)]
    rec, bases = choose(points)
    assert not bases["chat"].measured and rec.candidate.plan.id == FP8.id  # predicted numbers against each other
    assert rec.reason.startswith(
        "lowest J/token on 'chat' at its largest batch under the objective (predicted), within the accuracy budget")
    note = bases["chat"].note
    assert note.startswith("only 2 of the 3 plans compared were measured")
    assert "all-fp8 meets at batch 60 (predicted 127)" in note and "all-bf16 meets at batch 50 (predicted 69)" in note
    summary = {"recommendation": {"plan_id": FP8.id}, "workloads": [{"name": "chat", "tpot_ms": 12.0}],
               "operating_points": [p.model_dump(mode="json") for p in points], "trials": [],
               "operating_basis": {w: b.to_dict() for w, b in bases.items()}}
    text = "\n".join(operating_section(summary))
    assert "The recommendation compared the predicted points: only 2 of the 3 plans" in text
    assert "**As measured, the recommendation meets this objective at batch 60, not the predicted 127**" in text
    assert "- all-fp8: metered batches 127 (13 ms, misses), 60 (11 ms, meets): batch 60 is the largest" in text


def test_plans_the_rule_does_not_compare_need_not_be_measured():
    points = [point(BF16, 69, 0.113, (50, 0.13, True)), point(FP8, 127, 0.063, (60, 0.095, True)),
              point(MIXED, 110, 0.07)]
    chosen, bases = operating_basis(points, {BF16.id, FP8.id})
    assert bases["chat"].measured and chosen[(FP8.id, "chat")].batch == 60
    assert chosen[(MIXED.id, "chat")] is points[2]  # left as predicted: never compared


def test_no_plan_meeting_as_measured_keeps_bf16_and_the_report_says_so():
    points = [point(BF16, 69, 0.113, (1, 0.9, False)), point(FP8, 127, 0.063, (1, 0.5, False)),
              point(MIXED, 110, 0.07, (1, 0.6, False))]
    rec, bases = choose(points)
    assert rec.candidate.plan.id == BF16.id and "no plan meets the latency objective of 'chat'" in rec.reason
    summary = {"recommendation": {"plan_id": BF16.id}, "workloads": [{"name": "chat", "tpot_ms": 12.0}],
               "operating_points": [p.model_dump(mode="json") for p in points], "trials": [],
               "operating_basis": {w: b.to_dict() for w, b in bases.items()}}
    text = "\n".join(operating_section(summary))
    assert "**As measured, no plan meets this objective at any batch metered; BF16 is kept.**" in text
    assert "**As measured, the recommendation meets this objective at no batch metered**" in text
