"""The CPU NVFP4 kernel (advisor.quantize.nvfp4_cpu): E2M1 rounding, FP8 block scales, ModelOpt wiring.

The GPU comparison with ModelOpt's CUDA kernel is benchmarks/studies/nvfp4_parity.py
(results in reports/nvfp4_cpu_parity/).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from advisor.quantize.nvfp4_cpu import e2m1_round_magnitude, nvfp4_block_scales, nvfp4_fake_quant

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def test_rounding_ties_follow_modelopt_kernel():
    # ModelOpt's Triton kernel: <=0.25 -> 0, <0.75 -> 0.5, <=1.25 -> 1, <1.75 -> 1.5,
    # <=2.5 -> 2, <3.5 -> 3, <=5 -> 4, else 6 (ties go to the even mantissa).
    a = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0])
    assert e2m1_round_magnitude(a).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0]
    below = torch.nextafter(a[:7], torch.zeros(7))
    above = torch.nextafter(a[:7], torch.full((7,), 10.0))
    assert e2m1_round_magnitude(below).tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    assert e2m1_round_magnitude(above).tolist() == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_rounding_is_nearest_e2m1_value():
    a = torch.rand(10_000) * 7
    q = e2m1_round_magnitude(a)
    assert torch.isin(q, E2M1).all()
    nearest = (a[:, None] - E2M1[None, :]).abs().min(dim=1).values
    assert torch.equal((a - q).abs(), nearest)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(16,), (3, 32), (2, 5, 64)])
def test_shape_dtype_kept_and_values_on_grid(shape, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 10 ** (torch.rand(shape, generator=g) * 4 - 2)).to(dtype)
    amax = x.float().abs().amax()
    y = nvfp4_fake_quant(x, amax)
    assert y.shape == x.shape and y.dtype == x.dtype
    scale = nvfp4_block_scales(x, amax)
    codes = y.float().reshape(-1, 16) / scale
    # y = code * scale, rounded once to the tensor's dtype
    off_grid = (codes.abs()[..., None] - E2M1).abs().min(-1).values
    assert (off_grid <= (1e-6 if dtype == torch.float32 else 1e-2) * 6).all()
    assert (torch.sign(y.float()) * torch.sign(x.float()) >= 0).all()


def test_block_scales_are_fp8_multiples_of_the_global_scale():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 128, generator=g) * 10 ** (torch.rand(64, 1, generator=g) * 10 - 8)
    amax = x.abs().amax()
    global_scale = amax / (6 * 448)
    scale = nvfp4_block_scales(x, amax)
    # FP8 scales that come out below 1e-5 fall back to 1.0, as in ModelOpt's kernel
    fallback = scale == 1.0
    assert fallback.any() and (~fallback).any()  # the data reaches both cases
    ratio = scale[~fallback] / global_scale  # an E4M3 value, up to the fp32 rounding of the product
    fp8 = ratio.to(torch.float8_e4m3fn).float()
    assert ((fp8 - ratio).abs() <= ratio * 2**-21).all()
    assert torch.equal(fp8 * global_scale, scale[~fallback])
    assert (fp8 <= 448).all() and (fp8 > 0).all()
    block_amax = x.reshape(-1, 16).abs().amax(1, keepdim=True)
    assert block_amax[fallback].max() < block_amax[~fallback].min()  # only the smallest blocks fall back


def test_zero_block_and_largest_value():
    x = torch.zeros(2, 16)
    x[1, 3] = -5.0
    x[1, 4] = 2.0
    y = nvfp4_fake_quant(x, x.abs().amax())
    assert torch.equal(y[0], torch.zeros(16))
    assert y[1, 3].item() == pytest.approx(-5.0, rel=0.07)  # block amax maps to ~6 * scale
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_fake_quant(torch.ones(3, 10), torch.tensor(1.0))


def test_matches_a_linear_quantized_through_modelopt_on_cpu():
    """mtq.quantize with NVFP4_DEFAULT_CFG on CPU runs our kernel through ModelOpt's own quantizers."""
    from advisor.formats import Format
    from advisor.models.groups import layer_groups
    from advisor.plan import Plan
    from advisor.quantize.modelopt_config import quantize_plan
    from advisor.testing import random_model, tiny_llama_config

    # quantize_plan takes its quantizer names from the model's adapter, so the Linear sits in a tiny Llama
    model = random_model(tiny_llama_config(num_hidden_layers=1))
    layer = model.model.layers[0].self_attn.o_proj
    ref_weight = layer.weight.detach().clone()
    calib = torch.randint(3, 250, (2, 16), generator=torch.Generator().manual_seed(0))
    groups = layer_groups(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_plan(model, Plan.uniform(groups, Format.NVFP4), groups, lambda m: m(input_ids=calib))
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        wq = layer.weight_quantizer(ref_weight)
        xq = layer.input_quantizer(x)
        y = layer(x)
    w_amax = layer.weight_quantizer.amax if layer.weight_quantizer.amax is not None else ref_weight.abs().amax()
    assert torch.equal(wq, nvfp4_fake_quant(ref_weight, w_amax.float().reshape(-1).amax()))
    assert torch.equal(xq, nvfp4_fake_quant(x, layer.input_quantizer.amax.float().reshape(-1).amax()))
    assert torch.equal(y, torch.nn.functional.linear(xq, wq))


def _threshold_chain(a: torch.Tensor) -> torch.Tensor:
    """ModelOpt's Triton comparison chain, written out: the reference for the faster rounding."""
    edges = [(0.25, ">"), (0.75, ">="), (1.25, ">"), (1.75, ">="), (2.5, ">"), (3.5, ">="), (5.0, ">")]
    values = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    q = torch.zeros_like(a)
    for (edge, op), value in zip(edges, values[1:], strict=True):
        q = torch.where(a > edge if op == ">" else a >= edge, torch.full_like(a, value), q)
    return q


def test_rounding_matches_the_comparison_chain_on_ties_and_their_neighbours():
    g = torch.Generator().manual_seed(3)
    a = torch.cat([torch.rand(200_000, generator=g) * 8,
                   torch.tensor([0.25, 0.75, 1.25, 1.75, 2.0, 2.5, 3.5, 4.0, 5.0, 6.0, 0.0, 1e-40, 1e30])])
    a = torch.cat([a, torch.nextafter(a, torch.zeros_like(a)), torch.nextafter(a, torch.full_like(a, 1e38))])
    assert torch.equal(e2m1_round_magnitude(a), _threshold_chain(a))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fake_quant_equals_the_comparison_chain_kernel(dtype):
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(32, 256, generator=g) * 10 ** (torch.rand(32, 256, generator=g) * 4 - 2)).to(dtype)
    x[0, :16], x[1, :3] = 0.0, torch.tensor([-0.0, -1e-30, 1e-30])
    amax = x.float().abs().amax()
    blocks = x.float().reshape(-1, 16)
    scale = nvfp4_block_scales(x, amax)
    q = _threshold_chain(blocks.abs() / scale) * scale
    reference = torch.where(blocks >= 0, q, -q).reshape(x.shape).to(dtype)
    got = nvfp4_fake_quant(x, amax)
    assert torch.equal(got, reference)  # values; a -0.0 input keeps its sign (only bits of a zero differ)
    nonzero = reference != 0
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(got[nonzero].view(bits), reference[nonzero].view(bits))
