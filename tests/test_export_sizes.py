"""The serving configs an export writes are sized for the batch the plan was priced at: under a latency objective
its operating batch (``max-num-seqs`` then keeps the objective), elsewhere the stated batch."""

from __future__ import annotations

import yaml

from advisor.deploy.checkpoint import llm_api_options, options_yaml, vllm_options, vllm_options_yaml
from advisor.workflows.export import served_workloads

CHAT = {"name": "chat", "batch_size": 16, "input_tokens": 512, "output_tokens": 256, "tpot_ms": None}
SERVED = {"name": "served", "batch_size": 16, "input_tokens": 512, "output_tokens": 256, "tpot_ms": 1.5}
TIGHT = {"name": "tight", "batch_size": 64, "input_tokens": 128, "output_tokens": 128, "tpot_ms": 0.5}


def _point(plan_id: str, workload: str, batch: int, meets: bool = True, measured: dict | None = None) -> dict:
    return {"plan_id": plan_id, "workload": workload, "batch": batch, "meets": meets, "measured": measured}


def test_each_objective_is_sized_at_the_plans_operating_batch_measured_first():
    summary = {"workloads": [CHAT, SERVED, TIGHT], "operating_points": [
        _point("rec", "served", 54, measured={"batch": 48, "meets": True}),
        _point("rec", "tight", 8),  # predicted only: below the stated 64, which misses the objective
        _point("bf16", "served", 40)]}
    sized = {w["name"]: w for w in served_workloads(summary, "rec")}
    assert sized["chat"] == CHAT  # no objective: the stated batch
    assert sized["served"]["batch_size"] == 48 and sized["served"]["sized_for"].endswith("measured")
    assert sized["tight"]["batch_size"] == 8 and sized["tight"]["sized_for"].endswith("predicted")
    options = vllm_options(list(sized.values()))
    assert options["max-num-seqs"] == 48
    header = vllm_options_yaml(options, list(sized.values()))
    assert "served: batch 48 (the operating batch under its objective, measured), 512 in / 256 out" in header
    assert yaml.safe_load(header)["max-num-seqs"] == 48
    trt = options_yaml(llm_api_options(list(sized.values())), list(sized.values()))
    assert yaml.safe_load(trt)["max_batch_size"] == 48 and "tight: batch 8 (the operating batch" in trt


def test_a_point_that_meets_nothing_or_a_measured_miss_keeps_what_holds():
    summary = {"workloads": [SERVED], "operating_points": [
        _point("rec", "served", 1, meets=False)]}
    assert served_workloads(summary, "rec") == [SERVED]  # not even batch 1 meets: the stated batch stands
    summary["operating_points"] = [_point("rec", "served", 54, measured={"batch": 32, "meets": False})]
    assert served_workloads(summary, "rec")[0]["batch_size"] == 54  # the measured search found none: predicted
    assert served_workloads({"workloads": [SERVED]}, "rec") == [SERVED]  # a run with no operating points


def test_the_vllm_token_budget_is_the_one_priced_and_verified():
    """vllm_config.yaml's max-num-batched-tokens: vLLM's LLM-class budget that `advisor verify` serves with and the
    vLLM step model prices (16384 on a GPU of >= 70 GiB, at most a batch of full sequences), not a smaller one."""
    from advisor.energy.prediction import VllmServing
    from advisor.formats import GPU, GPU_SPECS

    big = {**SERVED, "batch_size": 256}
    for gpu in ("h100", "h200", "b200"):
        options = vllm_options([big], gpu=gpu)
        priced = VllmServing.as_advisor_serves(256, 512, 256, GPU_SPECS[GPU(gpu)])
        assert options["max-num-batched-tokens"] == priced.max_num_batched_tokens == 16384
    assert vllm_options([SERVED], gpu="h100")["max-num-batched-tokens"] == 16 * 768  # 16 full sequences
    assert vllm_options([SERVED])["max-num-batched-tokens"] == 2048  # no GPU named: the workloads' own size
