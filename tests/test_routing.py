"""Measured MoE routing: per-expert load from the calibration tokens, and the energy it implies (CPU)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import transformers

from advisor.energy.prediction import (
    MEASURED_ROUTING_NOTE,
    UNIFORM_ROUTING_NOTE,
    expected_experts_touched,
    layer_experts_touched,
)
from advisor.models.shape import ModelShape


def test_expected_distinct_experts_under_a_measured_load():
    uniform = [8 / 128] * 128
    for b in (1, 16, 64, 256):
        assert expected_experts_touched(128, 8, b, uniform) == pytest.approx(expected_experts_touched(128, 8, b))
    # all tokens on the same 8 experts: a batch never reads more than those 8
    hot = [1.0] * 8 + [0.0] * 120
    assert expected_experts_touched(128, 8, 256, hot) == pytest.approx(8)
    # a skewed load touches fewer distinct experts than uniform at every batch above 1
    skew = [2 * 8 / 128] * 32 + [8 / 128 * (128 - 64) / 96] * 96
    assert sum(skew) == pytest.approx(8)
    for b in (2, 16, 64, 256):
        assert 8 < expected_experts_touched(128, 8, b, skew) < expected_experts_touched(128, 8, b)
    # a single token touches exactly top_k experts whatever the load
    assert expected_experts_touched(128, 8, 1, skew) == pytest.approx(8)


@pytest.fixture(scope="module")
def tiny_moe():
    from advisor.models.groups import model_shape

    cfg = transformers.Qwen3MoeConfig(vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                      num_experts=8, num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        model.model.layers[0].mlp.gate.weight.normal_(0.0, 1.0)
        model.model.layers[0].mlp.gate.weight[3] += 2.0 * model.model.embed_tokens.weight.mean(0)  # a favourite
    tokens = torch.randint(0, 96, (6, 16), generator=torch.Generator().manual_seed(1))
    return model, model_shape(model), tokens


def test_expert_load_counts_the_top_k_choices_of_every_router(tiny_moe):
    from advisor.energy.profiling import expert_load

    model, shape, tokens = tiny_moe
    load = expert_load(model, shape, tokens, batch_size=4)
    assert set(load) == {0, 1}
    for q in load.values():
        assert len(q) == 8 and sum(q) == pytest.approx(2) and all(0 <= x <= 1 for x in q)
    # the same counts from the routers' own outputs (transformers returns their logits)
    with torch.no_grad():
        out = model(input_ids=tokens, output_router_logits=True)
    for i, logits in enumerate(out.router_logits):
        chosen = logits.reshape(-1, 8).float().topk(2, dim=-1).indices.reshape(-1)
        expect = torch.bincount(chosen, minlength=8).double() / tokens.numel()
        assert load[i] == pytest.approx(expect.tolist())
    assert load[0] != pytest.approx(load[1])


def test_measured_routing_reaches_the_energy_models_and_the_summary(tiny_moe):
    from advisor.energy.prediction import RooflineEnergyModel, decode_step_cost
    from advisor.energy.profiling import with_measured_routing
    from advisor.formats import GPU, Format
    from advisor.plan import Plan

    model, shape, tokens = tiny_moe
    measured = with_measured_routing(model, shape, tokens)
    assert all(g.expert_load for g in measured.layers if g.is_moe) and not any(g.expert_load for g in shape.layers)
    assert ModelShape.from_dict(measured.to_dict()) == measured
    for b in (4, 16):
        assert layer_experts_touched(measured.layers[0], b) <= layer_experts_touched(shape.layers[0], b) + 1e-9
    plan = Plan.uniform(shape.groups, Format.BF16)
    assert decode_step_cost(measured, plan, 16, 64).bytes < decode_step_cost(shape, plan, 16, 64).bytes
    assert MEASURED_ROUTING_NOTE in RooflineEnergyModel(measured, GPU.H100).label
    assert UNIFORM_ROUTING_NOTE in RooflineEnergyModel(shape, GPU.H100).label
    # a layer whose tokens all pick the same experts reads only those, whatever the batch
    hot = dataclasses.replace(measured.layers[0], expert_load=(1.0, 1.0) + (0.0,) * 6)
    assert layer_experts_touched(hot, 256) == pytest.approx(2)


def test_cost_model_reads_the_measured_routing(tiny_moe):
    from advisor.energy.prediction import ProfileCostModel
    from advisor.energy.profiling import shipped_profile, with_measured_routing
    from advisor.formats import GPU, Format
    from advisor.plan import Plan

    model, shape, tokens = tiny_moe
    hot = shape.with_expert_load({g.index: (1.0, 1.0) + (0.0,) * 6 for g in shape.layers})
    plan = Plan.uniform(shape.groups, Format.BF16)
    profile = shipped_profile(GPU.H100)
    uniform_ms, _ = ProfileCostModel(profile, shape).decode_step(plan, 64, 512)
    hot_ms, _ = ProfileCostModel(profile, hot).decode_step(plan, 64, 512)
    assert hot_ms < uniform_ms
    assert "routing measured" in ProfileCostModel(profile, with_measured_routing(model, shape, tokens)).label
