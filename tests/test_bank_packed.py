"""The packed bank (FP8 codes, NVFP4 codes and block scales) gives the folded bank's trials bit for bit, at its
formats' width."""

from __future__ import annotations

import random

import pytest
import torch

from advisor.accuracy.proxy import ProxyEvaluator
from advisor.formats import Format
from advisor.models.groups import model_shape
from advisor.plan import Plan
from advisor.quantize.bank import FormatBank
from advisor.quantize.modelopt_config import prepare_device
from advisor.quantize.packed import PackedFP8, PackedNVFP4
from advisor.testing import random_model, tiny_config

FORMATS = (Format.BF16, Format.FP8, Format.NVFP4)


def _plans(groups, kv_cache=(Format.BF16,)):
    plans = [Plan.uniform(groups, f) for f in FORMATS]
    rng = random.Random(0)
    plans += [Plan({g.name: rng.choice(FORMATS) for g in groups}, rng.choice(kv_cache)) for _ in range(4)]
    return plans


def _banks(model, groups, tokens, kv_cache=(Format.BF16,)):
    @torch.no_grad()
    def loop(m):
        m(input_ids=tokens)

    folded = FormatBank(model, groups, FORMATS, loop, kv_cache=kv_cache, packed=False)
    packed = FormatBank(model, groups, FORMATS, loop, kv_cache=kv_cache)
    return folded, packed


def _assert_same_trials(folded, packed, groups, heldout, kv_cache=(Format.BF16,)):
    base = Plan.uniform(groups, Format.BF16)
    ref_folded = ProxyEvaluator(folded.assemble(base), heldout, batch_size=2)
    ref_packed = ProxyEvaluator(packed.assemble(base), heldout, batch_size=2)
    for plan in _plans(groups, kv_cache):
        with torch.no_grad():
            a = folded.assemble(plan)(input_ids=heldout).logits
            b = packed.assemble(plan)(input_ids=heldout).logits
        assert torch.equal(a, b), plan.label() if hasattr(plan, "label") else plan
        assert ref_folded.score(folded.assemble(plan)) == ref_packed.score(packed.assemble(plan))


def test_tiny_model_trials_are_bit_identical_and_entries_cost_their_width(tiny_model_dir, one_torch_thread):
    from advisor.models.loading import load_model
    from advisor.recipe.schema import ModelSpec

    prepare_device("cpu")
    loaded = load_model(ModelSpec(source=str(tiny_model_dir)))
    groups = loaded.shape.groups
    tokens = torch.randint(3, 2000, (6, 32), generator=torch.Generator().manual_seed(0))
    folded, packed = _banks(loaded.model, groups, tokens[:4])
    members = sum(len(g.members) for g in groups)
    assert packed.pack_stats.kept_bf16 == []
    assert packed.pack_stats.packed == 2 * members  # every member, in FP8 and in NVFP4
    member = groups[0].members[0]
    assert isinstance(packed.module_for(member, Format.FP8).packed_weights["weight"], PackedFP8)
    assert isinstance(packed.module_for(member, Format.NVFP4).packed_weights["weight"], PackedNVFP4)
    _assert_same_trials(folded, packed, groups, tokens[4:])
    weights = sum(g.num_weights for g in groups)
    # FP8: a byte a weight + 256 BF16 values per member; NVFP4: 9/16 byte a weight + a float32 per member; both
    # also keep their quantizers' amax (a few floats per member), counted as the folded bank's are
    assert packed.entry_bytes(Format.FP8) - weights - 512 * members < 64 * members
    assert packed.entry_bytes(Format.NVFP4) - weights * 9 // 16 - 4 * members < 64 * members
    assert folded.entry_bytes(Format.FP8) - 2 * weights < 64 * members
    # the weights decoded for a forward are dropped after it
    module = packed.module_for(member, Format.FP8)
    assert 0 in module.weight.stride()


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "qwen2_moe"])
def test_fused_experts_pack_per_expert_and_stay_bit_identical(family, one_torch_thread):
    prepare_device("cpu")
    model = random_model(tiny_config(family, vocab=128))
    groups = model_shape(model).groups
    tokens = torch.randint(3, 120, (6, 24), generator=torch.Generator().manual_seed(1))
    folded, packed = _banks(model, groups, tokens[:4])
    assert packed.pack_stats.kept_bf16 == []
    experts = next(g for g in groups if g.name.endswith(".experts"))
    entry = packed.module_for(experts.members[0].rsplit(".", 1)[0], Format.NVFP4).packed_weights
    assert set(entry) == {"gate_up_proj", "down_proj"}
    _assert_same_trials(folded, packed, groups, tokens[4:])


def test_fp8_kv_cache_bank_is_bit_identical(one_torch_thread):
    prepare_device("cpu")
    model = random_model(tiny_config("llama", vocab=128))
    groups = model_shape(model).groups
    tokens = torch.randint(3, 120, (6, 24), generator=torch.Generator().manual_seed(2))
    kv = (Format.BF16, Format.FP8)
    folded, packed = _banks(model, groups, tokens[:4], kv_cache=kv)
    _assert_same_trials(folded, packed, groups, tokens[4:], kv_cache=kv)


@pytest.mark.slow
def test_smollm2_trials_are_bit_identical(one_torch_thread):
    from advisor.models.loading import load_model
    from advisor.recipe.schema import DEMO_MODEL, ModelSpec

    prepare_device("cpu")
    loaded = load_model(ModelSpec(source=DEMO_MODEL))
    groups = loaded.shape.groups
    tokens = torch.randint(3, 40000, (4, 32), generator=torch.Generator().manual_seed(3))
    folded, packed = _banks(loaded.model, groups, tokens[:2])
    assert packed.pack_stats.kept_bf16 == []
    _assert_same_trials(folded, packed, groups, tokens[2:])
