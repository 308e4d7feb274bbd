"""The report's first screen: the decision, its saving against BF16 with the label, the verdict's interval."""

from __future__ import annotations

from advisor.report.decision import decision_lines


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
    assert lines[0].startswith("**Decision: serve plan `f` (all-fp8)**: 25% less energy per token")
    assert "0.0075 against 0.01 J/token" in text
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
