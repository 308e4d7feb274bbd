"""The engine compatibility table: which engines serve bf16, fp8, nvfp4 and mixed plans, and why."""

from __future__ import annotations

import pytest

from advisor.formats import Format
from advisor.plan import Plan
from advisor.serving import (
    ENGINES,
    FACTS,
    NO_FACTS,
    compatibility_table,
    compatibility_warnings,
    engine_compatibility,
    plan_traits,
)

DENSE = [f"layers.{i}.{k}" for i in range(2) for k in ("qkv", "o", "gate_up", "down")]
MOE = [f"layers.{i}.{k}" for i in range(2) for k in ("qkv", "o", "experts")]


def _verdicts(plan: Plan, target: str = "b200") -> dict[str, str]:
    return {v.engine: v.verdict for v in engine_compatibility(plan, target)}


def _sources(plan: Plan, target: str = "b200") -> set[str]:
    return {f.source for v in engine_compatibility(plan, target) for f in v.problems}


def test_bf16_plan_meets_no_fact_and_every_engine_serves_it():
    plan = Plan.uniform(DENSE, Format.BF16)
    assert _verdicts(plan) == dict.fromkeys(ENGINES, "serves")
    assert compatibility_warnings(engine_compatibility(plan)) == []
    assert "BF16: no quantization" in "\n".join(compatibility_table(engine_compatibility(plan)))


def test_the_engines_are_the_tables_checkpoint_servers_and_one_without_facts_is_not_called_serving():
    assert ENGINES == ("TensorRT-LLM", "vLLM", "SGLang")  # the table's engines that serve the export, and SGLang
    plan = Plan.uniform(DENSE, Format.BF16)
    unresearched = [f for f in FACTS if f.engine != "vLLM"]  # as for an engine just added to the table
    verdicts = {v.engine: v.verdict for v in engine_compatibility(plan, "b200", unresearched)}
    assert verdicts == {**dict.fromkeys(ENGINES, "serves"), "vLLM": NO_FACTS}


def test_fp8_plan_is_served_everywhere_and_the_fused_scales_are_the_engines_own():
    plan = Plan.uniform(DENSE, Format.FP8)
    # vLLM serves it as planned (measured), with the caveat on operating batches checked on one shape
    assert _verdicts(plan, "h100") == {**dict.fromkeys(ENGINES, "serves"), "vLLM": "serves, with caveats"}
    assert _sources(plan, "h100") == {"reports/benchmarks/verify_time.md"}
    # on Hopper the export's vllm_config.yaml picks cuBLASLt for the FP8 GEMMs (measured); not on Blackwell
    backend = {t: any("linear-backend: torch" in f.text for v in engine_compatibility(plan, t) for f in v.facts)
               for t in ("h100", "h200", "b200")}
    assert backend == {"h100": True, "h200": True, "b200": False}
    trt = next(v for v in engine_compatibility(plan, "h100") if v.engine == "TensorRT-LLM")
    assert any("rescale_fused_weights" in f.text for f in trt.facts)


@pytest.mark.parametrize(("target", "trt", "vllm"), [("b200", "serves", "serves"),
                                                     ("h200", "may fail", "serves, with caveats")])
def test_nvfp4_plan_needs_blackwell(target, trt, vllm):
    plan = Plan.uniform(DENSE, Format.NVFP4)
    verdicts = _verdicts(plan, target)
    assert verdicts["TensorRT-LLM"] == trt and verdicts["vLLM"] == vllm and verdicts["SGLang"] == "serves"
    if target != "b200":
        assert "https://github.com/vllm-project/vllm/pull/49376" in _sources(plan, target)  # Marlin W4A16


def test_mixed_plan_warns_per_known_problem_with_its_source():
    plan = Plan({g: [Format.FP8, Format.NVFP4][i % 2] for i, g in enumerate(DENSE)})  # down: NVFP4
    assert plan_traits(plan).mixed and plan_traits(plan).nvfp4_down
    assert _verdicts(plan) == {"TensorRT-LLM": "serves, with caveats", "vLLM": "may fail", "SGLang": "may fail"}
    assert {"https://github.com/vllm-project/vllm/issues/37854", "https://github.com/vllm-project/vllm/pull/56050",
            "https://github.com/sgl-project/sglang/pull/32740"} <= _sources(plan)
    fp8_down = Plan({g: Format.NVFP4 if g.endswith("gate_up") else Format.FP8 for g in DENSE})
    assert "https://github.com/vllm-project/vllm/pull/56050" not in _sources(fp8_down)  # no NVFP4 down proj
    assert len(compatibility_warnings(engine_compatibility(plan))) == sum(
        len(v.problems) for v in engine_compatibility(plan))


def test_single_format_plans_with_bf16_layers_are_not_mixed():
    plan = Plan({g: Format.BF16 if g.endswith(".o") else Format.NVFP4 for g in DENSE})
    assert not plan_traits(plan).mixed and _verdicts(plan)["SGLang"] == "serves"


def test_mixed_moe_plan_hits_the_trtllm_moe_problem():
    plan = Plan({g: Format.NVFP4 if g.endswith("experts") else Format.FP8 for g in MOE})
    assert plan_traits(plan).experts_quantized
    assert _verdicts(plan)["TensorRT-LLM"] == "may fail"
    assert "https://github.com/NVIDIA/TensorRT-LLM/pull/15485" in _sources(plan)
    dense_experts = Plan({g: Format.BF16 if g.endswith("experts") else Format.FP8 for g in MOE})
    assert _verdicts(dense_experts)["TensorRT-LLM"] == "serves"


def test_fp8_experts_are_served_by_vllm_s_triton_kernel_on_hopper_only():
    def triton(plan: Plan, target: str) -> bool:
        return any("moe-backend: triton" in f.text for v in engine_compatibility(plan, target) for f in v.facts)

    fp8_moe, bf16_moe, fp8_dense = (Plan.uniform(MOE, Format.FP8), Plan.uniform(MOE, Format.BF16),
                                    Plan.uniform(DENSE, Format.FP8))
    assert plan_traits(fp8_moe).moe and plan_traits(bf16_moe).moe and not plan_traits(fp8_dense).moe
    assert {t: triton(fp8_moe, t) for t in ("h100", "h200", "b200")} == {"h100": True, "h200": True, "b200": False}
    assert not triton(bf16_moe, "h200") and not triton(fp8_dense, "h200")
    # the attention's FP8 puts the experts, BF16 or not, on Triton too: vLLM's choice for BF16 experts on Hopper
    assert triton(Plan({g: Format.BF16 if g.endswith("experts") else Format.FP8 for g in MOE}), "h200")


def test_fp8_kv_cache_caveats():
    plan = Plan.uniform(DENSE, Format.FP8, Format.FP8)
    assert _verdicts(plan) == {"TensorRT-LLM": "serves", "vLLM": "serves, with caveats",
                               "SGLang": "serves, with caveats"}
    assert "queries are quantized to FP8" in " ".join(compatibility_warnings(engine_compatibility(plan)))


def test_every_fact_cites_a_source_and_names_a_known_engine():
    assert all(f.source.startswith(("https://", "reports/benchmarks/")) and f.engine in ENGINES
               and f.level in ("ok", "caveat", "problem") for f in FACTS)
