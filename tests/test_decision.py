"""The report's first screen: the decision, its saving against BF16 with the label, the verdict's interval."""

from __future__ import annotations

import re

import pytest

from advisor.formats import Format
from advisor.plan import LayerGroup, Plan
from advisor.report.decision import decision_lines
from advisor.search.frontier import Candidate, recommend
from advisor.search.operating import BasisPoint


def _energy(j: float, source: str = "predicted (per-model profile, H100 units)") -> list[dict]:
    return [{"workload": "chat", "j_per_token": j, "source": source, "measured": False}]


def _summary(rec: dict | None, max_drop: float = 0.05) -> dict:
    bf16 = {"label": "all-bf16", "plan_id": "b", "energy": _energy(0.010), "kl": 0.0, "reason": ""}
    return {"workloads": [{"name": "chat"}], "trials": [bf16, *([rec] if rec else [])],
            "recommendation": rec, "benchmark": {"max_drop": max_drop}}


def test_a_cheaper_plan_states_its_saving_label_and_interval():
    task = {"task": "piqa", "verdict": "passes", "n_items": 200, "drop": 0.005, "ci_low": -0.021, "ci_high": 0.031,
            "confidence": 0.975}
    rec = {"label": "all-fp8", "plan_id": "f", "energy": _energy(0.0075), "kl": 0.04, "reason": "lowest energy",
           "acceptance": {"verdict": "passes", "tasks": [task]}}
    lines = decision_lines(_summary(rec), "runs/q")
    text = "\n".join(lines)
    assert lines[0].startswith("**Decision: serve plan `f` (all-fp8)**: 25.0% less energy per token than all-BF16 "
                               "on 'chat' (0.0075 against 0.01 J/token)")
    assert "fixed batch" not in text  # no objective: the stated batch is the only comparison
    assert "per-model profile, H100 units" in text
    assert "piqa drop +0.5 points [-2.1, +3.1]" in text and "200 items" in text and "budget of 5 points" in text
    assert "advisor export runs/q" in text and "advisor verify runs/q --engine vllm" in text


def test_keeping_bf16_says_why_and_no_saving():
    rec = {"label": "all-bf16", "plan_id": "b", "energy": _energy(0.010), "kl": 0.0,
           "reason": "keep BF16: 2 cheaper plan(s) failed on lm-eval"}
    first = decision_lines(_summary(rec))[0]
    assert first == "**Decision: keep BF16.** Keep BF16: 2 cheaper plan(s) failed on lm-eval."


def test_no_trial_no_decision():
    assert decision_lines(_summary(None))[0].startswith("**Decision: none.**")


def test_a_plan_no_task_judged_is_said_to_rest_on_the_proxy():
    rec = {"label": "all-fp8", "plan_id": "f", "energy": _energy(0.008), "kl": 0.04, "reason": "r", "acceptance": None}
    assert any("judged by the proxy only (KL 0.0400)" in line for line in decision_lines(_summary(rec)))


def test_under_an_objective_the_decision_names_the_batch_on_the_points_compared():
    rec = {"label": "all-fp8", "plan_id": "f", "energy": _energy(0.0075), "kl": 0.04, "reason": "lowest energy"}
    summary = _summary(rec)

    def point(plan_id, batch, j, measured):
        mb, mj, meets = measured
        return {"plan_id": plan_id, "workload": "chat", "meets": True, "batch": batch, "j_per_token": j,
                "tpot_ms": 11.9, "measured": {"batch": mb, "j_per_token": mj, "tpot_ms": 11.5, "meets": meets}}

    summary["operating_points"] = [point("f", 127, 0.063, (90, 0.071, True)), point("b", 69, 0.113, (50, 0.13, True))]
    summary["operating_basis"] = {"chat": {"measured": True, "label": "measured (vLLM 0.26.0, H100, 2026-11-27)"}}
    text = "\n".join(decision_lines(summary))
    assert ("Operating point under the objective on 'chat', measured (vLLM 0.26.0, H100, 2026-11-27): serve at "
            "batch 90 at 0.071 J/token, TPOT 11.5 ms, against all-BF16's batch 50 at 0.13 J/token") in text
    summary["operating_basis"] = {"chat": {"measured": False, "label": "predicted"}}
    assert "'chat', predicted: serve at batch 127 at 0.063 J/token, TPOT 11.9 ms, against all-BF16's batch 69" \
        in "\n".join(decision_lines(summary))
    summary["operating_basis"] = {}
    assert "Operating point" not in "\n".join(decision_lines(summary))  # no objective: no such line


HEADLINE = re.compile(r"\*\*: ([\d.]+)% less energy per token than all-BF16 under the objective on 'chat' "
                      r"\(batch (\d+) at ([\d.e-]+) against batch (\d+) at ([\d.e-]+) J/token, (.+)\)\.$")
FIXED = re.compile(r"^At the fixed batch 64 that 'chat' states: ([\d.]+)% less energy per token than all-BF16 "
                   r"\(([\d.e-]+) against ([\d.e-]+) J/token\)\.$")


def _objective_summary(measured_basis: bool, bf16_meets: bool = True) -> dict:
    """all-FP8 recommended on 'chat' (batch 64, TPOT <= 12 ms); the operating points differ from the fixed batch's
    J/token, predicted and measured apart."""
    rec = {"label": "all-fp8", "plan_id": "f", "energy": _energy(0.0081), "kl": 0.04, "reason": "lowest energy"}
    summary = _summary(rec)
    summary["workloads"] = [{"name": "chat", "batch_size": 64, "tpot_ms": 12.0}]

    def point(plan_id, batch, j, measured):
        mb, mj, meets = measured
        return {"plan_id": plan_id, "workload": "chat", "meets": True, "batch": batch, "j_per_token": j,
                "tpot_ms": 11.9, "measured": {"batch": mb, "j_per_token": mj, "tpot_ms": 11.5, "meets": meets}}

    summary["operating_points"] = [point("f", 127, 0.0632, (90, 0.0714, True)),
                                   point("b", 69, 0.1131, (50, 0.1297, bf16_meets))]
    summary["operating_basis"] = {"chat": {"measured": True, "label": "measured (vLLM 0.26.0, H100, 2026-11-27)"}
                                  if measured_basis else {"measured": False, "label": "predicted"}}
    return summary


def _numbers(match: re.Match) -> tuple[float, ...]:
    return tuple(float(g) for g in match.groups()[:5])


def test_under_an_objective_the_headline_quotes_the_operating_points_the_rule_compared():
    for measured in (False, True):
        summary = _objective_summary(measured)
        mine, bf16 = (p["measured"] if measured else p for p in summary["operating_points"])
        lines = decision_lines(summary)
        head = HEADLINE.search(lines[0])
        assert head is not None, lines[0]
        pct, batch, j, bf16_batch, bf16_j = _numbers(head)
        assert (batch, bf16_batch) == (mine["batch"], bf16["batch"])
        assert j == pytest.approx(mine["j_per_token"], rel=1e-3) and bf16_j == pytest.approx(bf16["j_per_token"],
                                                                                              rel=1e-3)
        assert pct == pytest.approx(100 * (1 - mine["j_per_token"] / bf16["j_per_token"]), abs=0.05)
        assert head.group(6) == summary["operating_basis"]["chat"]["label"]
        # the fixed-batch saving stays, on a later line that names its batch
        fixed = next(FIXED.match(line) for line in lines if line.startswith("At the fixed batch"))
        mine_fixed, bf16_fixed = summary["recommendation"]["energy"][0], summary["trials"][0]["energy"][0]
        fixed_pct, fixed_j, fixed_bf16_j = (float(g) for g in fixed.groups())
        assert (fixed_j, fixed_bf16_j) == (mine_fixed["j_per_token"], bf16_fixed["j_per_token"])
        assert fixed_pct == pytest.approx(100 * (1 - mine_fixed["j_per_token"] / bf16_fixed["j_per_token"]), abs=0.05)
        assert fixed_pct != pct


def test_where_bf16_meets_no_objective_the_headline_stays_at_the_fixed_batch():
    summary = _objective_summary(measured_basis=True, bf16_meets=False)
    lines = decision_lines(summary)
    assert "under the objective" not in lines[0] and "on 'chat' (0.0081 against 0.01 J/token)" in lines[0]
    assert not any(line.startswith("At the fixed batch") for line in lines)
    summary["operating_basis"] = {}  # no objective at all: the same
    assert decision_lines(summary)[0] == lines[0]


def test_the_headline_and_the_rules_reason_quote_one_saving():
    groups = (LayerGroup("layers.0.qkv", ("m0",), ((8, 8),)),)
    bf16_plan, fp8_plan = Plan.uniform(groups, Format.BF16), Plan.uniform(groups, Format.FP8)
    # operating J/token whose savings round differently to whole and to tenth percents (43.42...%)
    points = {(bf16_plan.id, "chat"): BasisPoint(True, 0.11293, 69),
              (fp8_plan.id, "chat"): BasisPoint(True, 0.06390, 125)}
    cands = [Candidate(0, bf16_plan, 0.0, 10.0, {"chat": 0.1164}, True),
             Candidate(1, fp8_plan, 0.02, 10.0, {"chat": 0.0779}, True)]
    rec = recommend(cands, ["chat"], operating=points, basis={"chat": ", predicted"})
    assert rec is not None and rec.candidate.plan.id == fp8_plan.id
    summary = {"workloads": [{"name": "chat", "batch_size": 64, "tpot_ms": 12.0}],
               "trials": [{"label": "all-bf16", "plan_id": bf16_plan.id, "energy": _energy(0.1164)}],
               "recommendation": {"label": "all-fp8", "plan_id": fp8_plan.id, "energy": _energy(0.0779), "kl": 0.02,
                                  "reason": rec.reason},
               "operating_points": [{"plan_id": pid, "workload": w, "meets": p.meets, "batch": p.batch,
                                     "j_per_token": p.j_per_token} for (pid, w), p in points.items()],
               "operating_basis": {"chat": {"measured": False, "label": "predicted"}}}
    why = re.search(r"([\d.]+%) less energy than all-BF16", rec.reason)
    head = HEADLINE.search(decision_lines(summary)[0])
    assert why is not None and head is not None
    assert head.group(1) + "%" == why.group(1)
