"""Predicted energy per family (CPU): sliding windows, routed experts, pre-fused projections, and the
shape's JSON round trip. Shapes come from real model configs built on the meta device (no weights)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from advisor.energy.prediction import (
    ProfileCostModel,
    RooflineEnergyModel,
    decode_step_cost,
    expected_experts_touched,
    make_energy_model,
    prefill_cost,
)
from advisor.energy.profiling import shipped_profile
from advisor.errors import InputError
from advisor.formats import FORMAT_SPECS, GPU, Format
from advisor.models.shape import ModelShape, llama_shape
from advisor.plan import Plan
from advisor.recipe.schema import Workload


def _shape(config) -> ModelShape:
    import torch
    from transformers import AutoModelForCausalLM

    from advisor.models.groups import model_shape

    with torch.device("meta"):
        return model_shape(AutoModelForCausalLM.from_config(config))


@pytest.fixture(scope="module")
def shapes() -> dict[str, ModelShape]:
    import transformers as tf

    return {
        "qwen3_moe": _shape(tf.Qwen3MoeConfig(
            vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
            num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
            num_experts_per_tok=8)),
        "gemma3": _shape(tf.Gemma3TextConfig(
            vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=6,
            num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=1024)),
        "phi3": _shape(tf.Phi3Config(
            vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=4,
            num_attention_heads=32, num_key_value_heads=32)),
    }


def _without(shape: ModelShape, **layer_changes) -> ModelShape:
    return dataclasses.replace(shape, layers=tuple(dataclasses.replace(g, **layer_changes) for g in shape.layers))


def test_expected_distinct_experts_under_uniform_routing():
    assert expected_experts_touched(128, 8, 1) == pytest.approx(8)
    assert expected_experts_touched(128, 8, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))
    assert 8 < expected_experts_touched(128, 8, 16) < expected_experts_touched(128, 8, 64) < 128
    assert expected_experts_touched(128, 8, 4096) == pytest.approx(128)
    assert expected_experts_touched(128, 8, 0) == 0


def test_roofline_moe_reads_the_touched_experts_and_multiplies_top_k(shapes):
    shape = shapes["qwen3_moe"]
    plan = Plan.uniform(shape.groups, Format.FP8)
    experts = [g for g in shape.groups if g.name.endswith(".experts")]
    assert len(experts) == 4 and shape.router_weights == 4 * 128 * 2048
    dense = sum(g.num_weights for g in shape.groups if g not in experts)
    expert_w = sum(g.num_weights for g in experts)
    fp8 = FORMAT_SPECS[Format.FP8].weight_bytes_per_element
    bf16_bytes = 2.0 * (shape.lm_head_weights + shape.router_weights)
    for batch in (1, 16, 256):
        step = decode_step_cost(shape, plan, batch, 512)
        touched = expected_experts_touched(128, 8, batch) / 128
        want = bf16_bytes + fp8 * (dense + expert_w * touched) + batch * shape.kv_bytes(512)
        assert step.bytes == pytest.approx(want)
        assert step.flops[Format.FP8] == pytest.approx(2 * batch * (dense + expert_w * 8 / 128))
    pre = prefill_cost(shape, plan, 1000)  # tokens x top_k expert rows; every expert read
    assert pre.flops[Format.FP8] == pytest.approx(2 * 1000 * (dense + expert_w * 8 / 128))
    all_active = _without(shape, top_k=128)  # the old accounting: every expert for every token
    extra = decode_step_cost(all_active, plan, 1, 512).bytes - decode_step_cost(shape, plan, 1, 512).bytes
    assert extra == pytest.approx(fp8 * expert_w * (1 - 8 / 128))  # 120 of 128 experts untouched at batch 1
    label = RooflineEnergyModel(shape, GPU.H200).label
    assert "uniform routing assumed" in label


def test_sliding_window_layers_read_only_their_window(shapes):
    shape = shapes["gemma3"]
    assert [g.sliding_window for g in shape.layers] == [1024] * 5 + [None]
    full = _without(shape, sliding_window=None)
    plan = Plan.uniform(shape.groups, Format.BF16)
    short, long = 512, 8192
    assert decode_step_cost(shape, plan, 8, short).bytes == decode_step_cost(full, plan, 8, short).bytes
    kv_per_token = 2 * 4 * 256 * 2.0
    saved = decode_step_cost(full, plan, 8, long).bytes - decode_step_cost(shape, plan, 8, long).bytes
    assert saved == pytest.approx(8 * 5 * kv_per_token * (long - 1024))
    profile = ProfileCostModel(shipped_profile(GPU.H200), shape)
    profile_full = ProfileCostModel(shipped_profile(GPU.H200), full)
    assert profile.decode_step(plan, 8, short) == pytest.approx(profile_full.decode_step(plan, 8, short))
    assert profile.decode_step(plan, 8, long)[1] < profile_full.decode_step(plan, 8, long)[1]
    assert "4 norms per layer" in profile.label and "gelu_pytorch_tanh" in profile.label


def test_phi3_prefused_groups_are_priced_by_the_profile(shapes):
    shape = shapes["phi3"]
    model = make_energy_model("predicted", shape, GPU.H200)  # the H200 GPU profile (GEMM tables)
    assert "GPU profile NVIDIA H200" in model.label and "does not cover" not in model.label
    e = {f: model.estimate(Plan.uniform(shape.groups, f), Workload(batch_size=16)).j_per_token
         for f in (Format.BF16, Format.FP8)}
    assert 0 < e[Format.FP8] < e[Format.BF16]


def test_cost_model_prices_moe_experts_per_touched_expert(shapes):
    shape = shapes["qwen3_moe"]
    model = ProfileCostModel(shipped_profile(GPU.H200), shape)
    assert "uniform routing assumed" in model.label and "MoE routing" in model.label
    assert "extrapolated" in model.label  # one expert's GEMM is ~3% of the profiled Llama-8B one
    plan = Plan.uniform(shape.groups, Format.BF16)
    dense_equivalent = ProfileCostModel(shipped_profile(GPU.H200), _without(shape, top_k=128))
    for batch in (1, 16):
        t, j = model.decode_step(plan, batch, 512)
        assert math.isfinite(j) and 0 < j < dense_equivalent.decode_step(plan, batch, 512)[1]


def test_a_shape_without_layers_is_refused_not_divided_by():
    empty = ModelShape((), 0, 0, 0, 0, 0, 0, 0)
    with pytest.raises(InputError, match="nothing the profile can price"):
        ProfileCostModel(shipped_profile(GPU.H200), empty)


def test_shape_json_round_trip_and_old_shape_dicts(shapes):
    for shape in shapes.values():
        again = ModelShape.from_dict(shape.to_dict())
        assert again == shape and again.layers == shape.layers
    llama = llama_shape("model.layers", 2, 64, 128, 4, 2, 256)
    old = {k: v for k, v in llama.to_dict().items()
           if k in ("groups", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                    "vocab_size", "lm_head_weights")}  # a summary.json shape written before per-layer geometry
    read = ModelShape.from_dict(old)
    assert read.layers == llama.layers and read.groups == llama.groups and read.model_type == ""
    w = Workload(batch_size=4)
    plan = Plan.uniform(llama.groups, Format.FP8)
    assert RooflineEnergyModel(read, GPU.H200).estimate(plan, w) == RooflineEnergyModel(llama, GPU.H200).estimate(
        plan, w)
