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


def _folded(fmt: Format, weight: torch.Tensor, amaxes: list[torch.Tensor]) -> torch.Tensor:
    from advisor.quantize.fp8_cpu import fp8_fake_quant
    from advisor.quantize.nvfp4_cpu import nvfp4_fake_quant

    views = weight if weight.dim() == 3 else weight.unsqueeze(0)
    quant = fp8_fake_quant if fmt == Format.FP8 else nvfp4_fake_quant
    return torch.stack([quant(views[v], amaxes[v]) for v in range(views.shape[0])]).reshape(weight.shape)


@pytest.mark.parametrize("fmt", [Format.FP8, Format.NVFP4])
@pytest.mark.parametrize(("dtype", "bits"), [(torch.bfloat16, torch.int16), (torch.float32, torch.int32)])
def test_values_a_gpu_kernel_rounds_otherwise_are_patched_not_kept_bf16(fmt, dtype, bits):
    from advisor.quantize.packed import PATCH_LIMIT, pack_exact

    weight = torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(5)).to(dtype)  # 4 experts
    amaxes = [weight[v].abs().amax().float() for v in range(4)]
    folded = _folded(fmt, weight, amaxes)
    assert folded.dtype == dtype
    entry, wrong = pack_exact(fmt, weight, folded, amaxes)
    assert wrong == 0 and entry.patch_index.numel() == 0
    # a GPU kernel that rounds a few elements one step otherwise than the codes' arithmetic
    odd = folded.clone()
    flat = odd.view(-1).view(bits)
    positions = torch.tensor([3, 700, 4095, 8000])
    flat[positions] += 1
    entry, wrong = pack_exact(fmt, weight, odd, amaxes)
    assert wrong == len(positions)
    assert torch.equal(entry.decode().view(bits), odd.view(bits))
    # more than one value in PATCH_LIMIT: the weight stays BF16
    flat[torch.arange(0, odd.numel(), PATCH_LIMIT // 2)] += 1
    entry, wrong = pack_exact(fmt, weight, odd, amaxes)
    assert entry is None and wrong * PATCH_LIMIT > odd.numel()


@pytest.mark.parametrize("fmt", [Format.FP8, Format.NVFP4])
def test_packing_a_few_experts_at_a_time_gives_the_same_codes(fmt, monkeypatch):
    import advisor.quantize.packed as packed_module

    weight = torch.randn(6, 48, 32, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    amaxes = [weight[v].abs().amax().float() for v in range(6)]
    folded = _folded(fmt, weight, amaxes)
    whole, _ = packed_module.pack_exact(fmt, weight, folded, amaxes)
    monkeypatch.setattr(packed_module, "PACK_CHUNK_WEIGHTS", 2 * 48 * 32 + 5)  # two experts a chunk, three chunks
    assert len(packed_module._view_slices(6, 48 * 32)) == 3
    chunked, wrong = packed_module.pack_exact(fmt, weight, folded, amaxes)
    assert wrong == 0
    for name, buffer in whole.named_buffers():
        assert torch.equal(buffer.view(torch.uint8), dict(chunked.named_buffers())[name].view(torch.uint8)), name
    assert torch.equal(chunked.decode(), folded)
    monkeypatch.setattr(packed_module, "PACK_CHUNK_WEIGHTS", 500)  # a dense linear's view counted in four chunks
    one_view, wrong = packed_module.pack_exact(fmt, weight[0], folded[0], amaxes[:1])
    assert wrong == 0 and torch.equal(one_view.decode(), folded[0])


@pytest.mark.parametrize("step", [1, -1])
def test_blocks_a_gpu_kernel_gave_the_neighbouring_scale_code_pack_exactly(step):
    """ModelOpt's Triton kernel divides a block's amax approximately: on an FP8 rounding midpoint it can take the
    neighbouring block-scale code, and every value of that block differs from the codes' arithmetic."""
    from advisor.quantize.nvfp4_cpu import block_scale_codes, e2m1_round_magnitude, global_scale, scales_from_codes
    from advisor.quantize.packed import pack_exact

    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    amax = weight.abs().amax().float()
    blocks = weight.float().reshape(64, 4, 16)
    gs = global_scale(amax)
    codes = block_scale_codes(blocks.abs().amax(dim=-1), gs).view(torch.uint8)
    moved = torch.zeros_like(codes, dtype=torch.bool)
    moved.view(-1)[::9] = True  # 29 of 256 blocks
    codes = torch.where(moved, codes + step, codes)
    scale = scales_from_codes(codes.view(torch.float8_e4m3fn), gs).unsqueeze(-1)
    folded = (e2m1_round_magnitude(blocks.abs() / scale) * scale).copysign(blocks).to(torch.bfloat16).reshape(64, 64)
    entry, wrong = pack_exact(Format.NVFP4, weight, folded, [amax])
    assert wrong == 0 and entry.patch_index.numel() == 0  # no patch: every block found its code
    assert torch.equal(entry.decode().view(torch.int16), folded.view(torch.int16))
    assert torch.equal(entry.scale_codes.view(torch.uint8).reshape(codes.shape), codes)
