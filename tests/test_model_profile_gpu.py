"""GPU test of a MoE model's per-model profile (CI deselects it: -m "not gpu").

Tiny Qwen3-MoE and Qwen2-MoE (with a shared expert) decoders on the runtime: the profile measures the
routed experts' grouped GEMMs as a group kind beside attention (and the shared expert's GEMMs), and
its cost model predicts a mixed plan's step time from the all-BF16 and all-FP8 steps (additivity,
checked against the mixed plan's own timed step).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from advisor.formats import Format

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

E, K = 16, 4


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen2_moe"])
def moe(request):
    from advisor.energy.measure import Bench
    from advisor.energy.runtime import DecoderDims
    from advisor.models.groups import model_shape

    common = dict(vocab_size=2048, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                  num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, num_experts=E,
                  num_experts_per_tok=K)
    cfg = (transformers.Qwen3MoeConfig(**common, head_dim=64) if request.param == "qwen3_moe"
           else transformers.Qwen2MoeConfig(**common, shared_expert_intermediate_size=768))
    with torch.device("meta"):
        shape = model_shape(transformers.AutoModelForCausalLM.from_config(cfg))
    dims = DecoderDims.from_config(cfg)
    return shape, dims, Bench.create(dims, max_pos=512)


def test_a_moe_per_model_profile_prices_a_mixed_plan_from_its_uniform_steps(moe):
    from advisor.energy.measure import decode_step
    from advisor.energy.meter import MeterConfig, open_meter
    from advisor.energy.prediction import ModelProfileCostModel
    from advisor.energy.profiling import measure_model_profile
    from advisor.plan import Plan

    shape, dims, bench = moe
    meter = open_meter(torch.cuda.current_device(), MeterConfig(warmup_s=0.2, min_window_s=0.3, min_ticks=3,
                                                                repeats=2, idle_s=0.2, soak_s=3.0))
    prof = measure_model_profile(dims, batches=(1, 8), contexts=(64, 192), prefill_lengths=(64,), meter=meter,
                                 bench=bench, log=lambda *_: None)
    dec = prof["decode"]
    shared = {"shared_gate_up", "shared_down"} if dims.layers[0].shared_intermediate else set()
    assert set(dec["gemm_ms"]["bf16"]) == {"qkv", "o", "experts"} | shared
    assert all(ms > 0 for f in ("bf16", "fp8") for v in dec["gemm_ms"][f].values() for ms in v)
    assert dec["experts_touched"][0] == K  # one token reads exactly top_k experts
    assert K < dec["experts_touched"][1] <= E
    temps = [t for f in ("bf16", "fp8") for v in dec["temperature_c"][f].values() for t in v]
    assert len(temps) == 2 * 2 * 2 and all(5 <= t <= 110 for t in temps)  # each metered point's GPU temperature
    assert len(prof["prefill"]["temperature_c"]["bf16"]) == 1
    assert prof["soak"]["seconds"] >= 3.0 and prof["soak"]["to_c"] >= prof["soak"]["from_c"] - 2
    corner = dec["mlp_fp8"]  # the kind corner: experts (and the shared expert) in FP8, attention in BF16
    assert set(corner["j_per_step"]) == {"64", "192"} and all(j > 0 for v in corner["j_per_step"].values() for j in v)
    assert len(prof["prefill"]["mlp_fp8"]["step_ms"]) == 1
    # the mixing point: its prefill only (the cost model bends prefills only)
    assert "alt_fp8" not in dec and prof["prefill"]["alt_fp8"]["j_per_step"][0] > 0

    model = ModelProfileCostModel(prof, shape)
    mixed = {g.name: Format.FP8 if g.name.endswith(".experts") else Format.BF16 for g in shape.groups}
    rt = bench.runtime(mixed)
    for b in (1, 8):
        measured_ms = decode_step(rt, b, 128).time_ms()
        rt.free()
        predicted_ms, _ = model.decode_step(Plan(mixed), b, 128)
        assert predicted_ms == pytest.approx(measured_ms, rel=0.15)
