"""The CPU FP8 kernel (advisor.quantize.fp8_cpu): bit for bit ModelOpt's eager path, wired into ModelOpt."""

from __future__ import annotations

import pytest
import torch

from advisor.quantize import fp8_cpu
from advisor.quantize.modelopt_config import prepare_device


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("amax", [None, 0.5, 0.0, 1e6])
def test_fp8_kernel_is_modelopts_eager_path_bit_for_bit(dtype, amax):
    from modelopt.torch.quantization.tensor_quant import _fp8_eager

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(8, 50, 96, generator=g) * 10 ** (torch.rand(8, 50, 96, generator=g) * 6 - 3)).to(dtype)
    x[0, 0, :5] = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 1e-30])
    a = torch.tensor(amax) if amax is not None else x.float()[x.isfinite()].abs().amax()
    expected, got = _fp8_eager(x, a), fp8_cpu.fp8_fake_quant(x, a)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(_bits(got), _bits(expected))


def test_fp8_kernel_leaves_its_input_alone():
    x = torch.randn(4, 64)
    before = x.clone()
    fp8_cpu.fp8_fake_quant(x, torch.tensor(1.0))
    assert torch.equal(x, before)


def test_modelopt_fp8_on_cpu_goes_through_the_kernel(monkeypatch):
    from modelopt.torch.quantization.tensor_quant import scaled_e4m3

    prepare_device("cpu")
    calls = []
    real = fp8_cpu.fp8_fake_quant
    monkeypatch.setattr(fp8_cpu, "fp8_fake_quant", lambda x, a: calls.append(x.shape) or real(x, a))
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    y = scaled_e4m3(x, torch.tensor(2.0), None, 4, 3)
    assert calls == [x.shape] and y.dtype == x.dtype
    per_channel = scaled_e4m3(x, torch.full((3, 1), 2.0), None, 4, 3)  # not per-tensor: ModelOpt's own path
    assert calls == [x.shape] and per_channel.shape == x.shape


@torch.no_grad()
def test_a_fused_groups_input_is_quantized_once_and_only_while_unchanged(monkeypatch):
    """q/k/v (gate/up) quantizers read the same tensor with the same amax: the second call reuses the
    first result; a changed tensor, another amax or another tensor are quantized anew, and correctly."""
    calls = []
    real = fp8_cpu.fp8_fake_quant
    monkeypatch.setattr(fp8_cpu, "fp8_fake_quant", lambda x, a: calls.append(1) or real(x, a))
    x, amax = torch.randn(8, 64), torch.tensor(2.0)
    first = fp8_cpu.fp8_fake_quant_reusing(x, amax)
    assert fp8_cpu.fp8_fake_quant_reusing(x, amax.clone()) is first and len(calls) == 1
    other_amax = fp8_cpu.fp8_fake_quant_reusing(x, torch.tensor(3.0))
    assert len(calls) == 2 and torch.equal(other_amax, real(x, torch.tensor(3.0)))
    assert fp8_cpu.fp8_fake_quant_reusing(x.clone(), torch.tensor(3.0)) is not other_amax and len(calls) == 3
    again = fp8_cpu.fp8_fake_quant_reusing(x, amax)
    x.mul_(4)  # changed in place since: quantized anew
    changed = fp8_cpu.fp8_fake_quant_reusing(x, amax)
    assert changed is not again and len(calls) == 5 and torch.equal(changed, real(x, amax))


def test_with_autograd_or_in_inference_mode_every_call_gets_its_own_result():
    x, amax = torch.randn(8, 64), torch.tensor(2.0)
    assert fp8_cpu.fp8_fake_quant_reusing(x, amax) is not fp8_cpu.fp8_fake_quant_reusing(x, amax)
    with torch.inference_mode():
        y = torch.randn(8, 64)
        first = fp8_cpu.fp8_fake_quant_reusing(y, amax)
        y.mul_(4)
        assert torch.equal(fp8_cpu.fp8_fake_quant_reusing(y, amax), fp8_cpu.fp8_fake_quant(y, amax))
        assert not torch.equal(first, fp8_cpu.fp8_fake_quant(y, amax))
