from __future__ import annotations

import copy
import random

import pytest
import torch

from advisor.formats import Format
from advisor.models.loading import load_model
from advisor.plan import Plan
from advisor.quantize.bank import FormatBank, _share_weights_copy
from advisor.quantize.export_rounding import round_fp8_weights_as_exported
from advisor.quantize.modelopt_config import quantize_plan
from advisor.recipe.schema import ModelSpec


@pytest.fixture(scope="module")
def tiny(request):
    from conftest import TINY_MODEL, need

    return load_model(ModelSpec(source=str(need(TINY_MODEL))))


def counting_loop(tokens):
    calls = {"n": 0}

    @torch.no_grad()
    def loop(model):
        calls["n"] += 1
        model(input_ids=tokens)

    return loop, calls


def random_plan(groups, seed, kv_cache=(Format.BF16,)):
    rng = random.Random(seed)
    return Plan({g.name: rng.choice(list(Format)) for g in groups}, rng.choice(list(kv_cache)))


def test_llama_groups_fuse_qkv_and_gate_up(tiny):
    names = [g.name for g in tiny.shape.groups]
    assert names == [f"layers.{i}.{r}" for i in range(2) for r in ("qkv", "o", "gate_up", "down")]
    qkv = tiny.shape.groups[0]
    assert [m.rsplit(".", 1)[-1] for m in qkv.members] == ["q_proj", "k_proj", "v_proj"]
    assert all(not m.endswith("lm_head") for g in tiny.shape.groups for m in g.members)


def test_right_modelopt_quantizers_are_enabled_per_group(tiny):
    groups = tiny.shape.groups
    plan = Plan({g.name: [Format.BF16, Format.FP8, Format.NVFP4][i % 3] for i, g in enumerate(groups)})
    tokens = torch.randint(0, 2048, (2, 16))
    model = quantize_plan(_share_weights_copy(tiny.model), plan, groups, counting_loop(tokens)[0])
    for g in groups:
        fmt = plan.format_of(g.name)
        for member in g.members:
            mod = model.get_submodule(member)
            wq, iq = mod.weight_quantizer, mod.input_quantizer
            assert wq.is_enabled == (fmt != Format.BF16), member
            assert iq.is_enabled == (fmt != Format.BF16), member
            if fmt == Format.FP8:
                assert wq.num_bits == (4, 3) and not wq.block_sizes
            if fmt == Format.NVFP4:
                assert wq.num_bits == (2, 1) and wq.block_sizes[-1] == 16
    assert not model.lm_head.__class__.__name__.startswith("Quant") or not model.lm_head.weight_quantizer.is_enabled
    tied = 0
    for g in groups:  # fused members share one weight and one input scale, as engines load them
        if plan.format_of(g.name) != Format.BF16 and len(g.members) > 1:
            for attr in ("weight_quantizer", "input_quantizer"):
                amaxes = {float(getattr(model.get_submodule(m), attr).amax) for m in g.members}
                assert len(amaxes) == 1, (g.name, attr, amaxes)
            tied += 1
    assert tied >= 2  # the cycle puts qkv in FP8 and gate_up in NVFP4 (or the reverse)


def test_fused_fp8_scales_are_the_largest_member_scale(tiny):
    """The shared weight amax is the max over q/k/v (gate/up): no member's weights are clipped."""
    groups = tiny.shape.groups
    plan = Plan.uniform(groups, Format.FP8)
    tokens = torch.randint(0, 2048, (2, 16))
    model = quantize_plan(_share_weights_copy(tiny.model), plan, groups, counting_loop(tokens)[0])
    for g in groups:
        if len(g.members) > 1:
            own = max(float(tiny.model.get_submodule(m).weight.detach().abs().max()) for m in g.members)
            shared = float(model.get_submodule(g.members[0]).weight_quantizer.amax)
            assert shared == pytest.approx(own, rel=1e-6), g.name


def test_calibration_runs_once_per_format_and_never_per_trial(tiny):
    tokens = torch.randint(0, 2048, (2, 16))
    loop, calls = counting_loop(tokens)
    bank = FormatBank(tiny.model, tiny.shape.groups, list(Format), loop)
    assert calls["n"] == 2 and bank.calibrations == 2  # fp8 and nvfp4; bf16 needs none
    for seed in range(5):
        bank.assemble(random_plan(tiny.shape.groups, seed))(input_ids=tokens)
    assert calls["n"] == 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bank_gives_exactly_what_modelopt_gives_for_the_plan(tiny, seed):
    tokens = torch.randint(0, 2048, (2, 24), generator=torch.Generator().manual_seed(seed))
    loop, _ = counting_loop(tokens)
    bank = FormatBank(tiny.model, tiny.shape.groups, list(Format), loop)
    plan = random_plan(tiny.shape.groups, seed)
    with torch.no_grad():
        fast = bank.assemble(plan)(input_ids=tokens).logits
        direct_model = quantize_plan(copy.deepcopy(tiny.model), plan, tiny.shape.groups, loop)
        round_fp8_weights_as_exported(direct_model)  # as the bank does (and the export)
        direct = direct_model(input_ids=tokens).logits
        bf16 = tiny.model(input_ids=tokens).logits
    assert torch.equal(fast, direct)
    if plan.uniform_format() != Format.BF16:
        assert not torch.equal(fast, bf16)


def test_unfolded_bank_shares_weights_and_folded_bank_gives_the_same_logits(tiny):
    tokens = torch.randint(0, 2048, (2, 16))
    loop = counting_loop(tokens)[0]
    shared = FormatBank(tiny.model, tiny.shape.groups, list(Format), loop, fold_weights=False)
    folded = FormatBank(tiny.model, tiny.shape.groups, list(Format), loop, fold_weights=True)
    member = tiny.shape.groups[0].members[0]
    assert shared.module_for(member, Format.FP8).weight is tiny.model.get_submodule(member).weight
    assert not folded.module_for(member, Format.FP8).weight_quantizer.is_enabled  # weights pre-quantized
    for seed in range(3):
        plan = random_plan(tiny.shape.groups, seed)
        with torch.no_grad():
            a = shared.assemble(plan)(input_ids=tokens).logits
            b = folded.assemble(plan)(input_ids=tokens).logits
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["phi3", "gemma3", "qwen2_moe", "mixtral"])
def test_bank_is_exact_for_prefused_multimodal_and_moe_models(family, one_torch_thread):
    """Phi-3's pre-fused projections, the Gemma-3 wrapper's text tower, MoE experts swapped as one
    module, an FP8 KV cache: the bank still gives quantize_plan's logits bit for bit; routers are never
    quantized."""
    from advisor.models.groups import group_table, model_shape, use_eager_experts
    from advisor.testing import random_model, tiny_config

    model = random_model(tiny_config(family))
    use_eager_experts(model)
    groups = model_shape(model).groups
    tokens = torch.randint(3, 250, (2, 16), generator=torch.Generator().manual_seed(0))
    loop, calls = counting_loop(tokens)
    bank = FormatBank(model, groups, list(Format), loop, kv_cache=(Format.BF16, Format.FP8))
    assert calls["n"] == 3
    for seed in range(2):
        plan = random_plan(groups, seed).with_kv_cache([Format.FP8, Format.BF16][seed])
        with torch.no_grad():
            fast = bank.assemble(plan)(input_ids=tokens).logits
            direct = quantize_plan(_share_weights_copy(model), plan, groups, loop)(input_ids=tokens).logits
            bf16 = model(input_ids=tokens).logits
        assert torch.equal(fast, direct) and not torch.equal(fast, bf16)
    experts = [gi for gi in group_table(model) if gi.kind == "experts"]
    assert bool(experts) == (family in ("qwen2_moe", "mixtral"))
    for gi in experts:  # one calibrated module per layer's experts, gate/up and down together
        (module,) = gi.modules
        plan = Plan({g.name: Format.FP8 if g.name == gi.name else Format.BF16 for g in groups})
        assert bank.assemble(plan).get_submodule(module) is bank.module_for(module, Format.FP8)
        quantized = bank.module_for(module, Format.FP8)
        assert quantized.gate_up_proj_input_quantizer.is_enabled and quantized.down_proj_input_quantizer.is_enabled
    fp8 = bank.assemble(Plan.uniform(groups, Format.FP8, kv_cache=Format.FP8))
    enabled = {n.rsplit(".", 1)[0] for n, m in fp8.named_modules()
               if type(m).__name__ == "TensorQuantizer" and m.is_enabled}
    assert sum(n.endswith("self_attn") for n in enabled) == len([gi for gi in group_table(model) if gi.kind == "qkv"])
    assert not any(n.endswith(("mlp.gate", "shared_expert_gate", "lm_head")) or "vision" in n for n in enabled)


def test_fp8_kv_cache_quantizes_the_keys_and_values_of_every_attention(tiny):
    groups = tiny.shape.groups
    tokens = torch.randint(0, 2048, (2, 16))
    plan = Plan.uniform(groups, Format.BF16, kv_cache=Format.FP8)
    model = quantize_plan(_share_weights_copy(tiny.model), plan, groups, counting_loop(tokens)[0])
    enabled = sorted(n for n, m in model.named_modules() if type(m).__name__ == "TensorQuantizer" and m.is_enabled)
    assert enabled == [f"model.layers.{i}.self_attn.{q}_bmm_quantizer" for i in range(2) for q in "kv"]
    k = model.get_submodule("model.layers.0.self_attn.k_bmm_quantizer")
    assert k.num_bits == (4, 3) and k.amax.numel() == 1  # FP8 E4M3, one scale per tensor (FP8_KV_CFG)
    with torch.no_grad():
        assert not torch.equal(model(input_ids=tokens).logits, tiny.model(input_ids=tokens).logits)


@pytest.mark.parametrize("seed", [0, 3])
def test_bank_with_an_fp8_kv_cache_gives_exactly_what_modelopt_gives(tiny, seed):
    """One more calibration for the KV cache, then any plan's KV format switches without calibrating."""
    tokens = torch.randint(0, 2048, (2, 24), generator=torch.Generator().manual_seed(seed))
    loop, calls = counting_loop(tokens)
    bank = FormatBank(tiny.model, tiny.shape.groups, list(Format), loop, kv_cache=(Format.BF16, Format.FP8))
    assert calls["n"] == 3 and bank.calibrations == 3
    for plan in (random_plan(tiny.shape.groups, seed).with_kv_cache(Format.FP8),
                 random_plan(tiny.shape.groups, seed),
                 Plan.uniform(tiny.shape.groups, Format.BF16, kv_cache=Format.FP8)):
        with torch.no_grad():
            fast = bank.assemble(plan)(input_ids=tokens).logits
            direct = quantize_plan(_share_weights_copy(tiny.model), plan, tiny.shape.groups, loop)(input_ids=tokens)
        assert torch.equal(fast, direct.logits), plan.label()
    with torch.no_grad():  # back to all-BF16: the bank's model is the BF16 model again
        assert torch.equal(bank.assemble(Plan.uniform(tiny.shape.groups, Format.BF16))(input_ids=tokens).logits,
                           tiny.model(input_ids=tokens).logits)
    assert calls["n"] == 3 + 3  # the three direct quantize_plan calls; the bank calibrated nothing more


def test_modelopt_prints_nothing_unless_debug_logging_is_on(tiny, capfd):
    """ModelOpt prints "Registered ..." and "Inserted N quantizers" on every quantization; the advisor's output
    (stdout results, stderr progress) stays free of it, and --debug (root logger at DEBUG) shows it on stderr."""
    import logging

    groups = tiny.shape.groups
    plan = Plan.uniform(groups, Format.FP8)
    tokens = torch.randint(0, 2048, (2, 16))
    quantize_plan(_share_weights_copy(tiny.model), plan, groups, counting_loop(tokens)[0])
    quiet_out = capfd.readouterr()
    assert "quantizers" not in quiet_out.out + quiet_out.err
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        quantize_plan(_share_weights_copy(tiny.model), plan, groups, counting_loop(tokens)[0])
    finally:
        root.setLevel(level)
    debug_out = capfd.readouterr()
    assert "Inserted" in debug_out.err and "Inserted" not in debug_out.out
