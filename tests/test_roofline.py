from __future__ import annotations

import pytest

from advisor.energy.prediction import RooflineEnergyModel, decode_step_cost
from advisor.errors import UnsupportedError
from advisor.formats import GPU, GPU_SPECS, Format
from advisor.models.shape import llama_shape
from advisor.plan import Plan
from advisor.recipe.schema import Workload

LLAMA8B = llama_shape("model.layers", 32, 4096, 14336, 32, 8, 128256)


def test_llama8b_shape_has_the_known_parameter_count():
    assert LLAMA8B.quantizable_weights + 2 * LLAMA8B.lm_head_weights == pytest.approx(8.03e9, rel=0.01)


def test_decode_at_batch_1_is_memory_bound_and_fp8_halves_the_weight_bytes():
    bf16 = decode_step_cost(LLAMA8B, Plan.uniform(LLAMA8B.groups, Format.BF16), 1, 512)
    fp8 = decode_step_cost(LLAMA8B, Plan.uniform(LLAMA8B.groups, Format.FP8), 1, 512)
    gpu = GPU_SPECS[GPU.H100]
    assert bf16.time_s(gpu) == pytest.approx(bf16.bytes / (gpu.memory_bandwidth_tb_s * 1e12))
    lm_head = 2 * LLAMA8B.lm_head_weights
    assert (fp8.bytes - lm_head) / (bf16.bytes - lm_head) == pytest.approx(0.5, rel=0.01)


def test_energy_falls_with_batch_and_with_fewer_bits():
    model = RooflineEnergyModel(LLAMA8B, GPU.B200)
    per_fmt = {f: model.estimate(Plan.uniform(LLAMA8B.groups, f), Workload(batch_size=16)) for f in Format}
    assert per_fmt[Format.NVFP4].j_per_token < per_fmt[Format.FP8].j_per_token < per_fmt[Format.BF16].j_per_token
    small = model.estimate(Plan.uniform(LLAMA8B.groups, Format.BF16), Workload(batch_size=1))
    assert small.j_per_token > per_fmt[Format.BF16].j_per_token
    assert all(not e.measured and e.source.startswith("predicted (roofline") for e in per_fmt.values())


def test_nvfp4_energy_on_hopper_is_refused():
    with pytest.raises(UnsupportedError, match="does not run natively"):
        RooflineEnergyModel(LLAMA8B, GPU.H100).estimate(Plan.uniform(LLAMA8B.groups, Format.NVFP4), Workload())


def test_fp8_kv_cache_halves_the_kv_bytes_and_says_so():
    plan = Plan.uniform(LLAMA8B.groups, Format.FP8)
    bf16_kv = decode_step_cost(LLAMA8B, plan, 64, 8192)
    fp8_kv = decode_step_cost(LLAMA8B, plan.with_kv_cache(Format.FP8), 64, 8192)
    assert bf16_kv.bytes - fp8_kv.bytes == pytest.approx(64 * LLAMA8B.kv_bytes(8192) / 2)
    model = RooflineEnergyModel(LLAMA8B, GPU.H100)
    long = Workload(name="long", batch_size=64, input_tokens=8192, output_tokens=512)
    short = Workload(name="short", batch_size=1, input_tokens=128, output_tokens=128)
    saving = {w.name: 1 - model.estimate(plan.with_kv_cache(Format.FP8), w).j_per_token
              / model.estimate(plan, w).j_per_token for w in (long, short)}
    assert saving["long"] > 0.2 > 0.01 > saving["short"] > 0  # the KV read dominates only at long contexts
    est = model.estimate(plan.with_kv_cache(Format.FP8), long)
    assert est.source.startswith("predicted (roofline") and est.source.endswith("KV bytes per token halved)")
    assert model.estimate(plan, long).source == model.label
