"""Per-tensor FP8 (E4M3) fake quantization on the CPU, bit for bit ModelOpt's eager path.

ModelOpt 0.47 fake-quantizes FP8 on the CPU with ``tensor_quant._fp8_eager``: scale,
clamp, cast to ``float8_e4m3fn``, cast back to float32, multiply by 1/scale, cast to the
input dtype. PyTorch's CPU decode of FP8 to float32 is an unvectorized per-element
conversion that costs more than the GEMM it precedes
(`reports/quickstart/profile_2026-11-22.md`). There are only 256 FP8 codes, so this kernel decodes each once
per call (times 1/scale, cast to the input dtype: the same two roundings) and looks the
codes up in that table; a fused group's quantizers, which read one input with one amax, quantize it
once (:func:`fp8_fake_quant_reusing`). Other cases (per-channel amax, no amax, integer formats) go to
ModelOpt unchanged.
"""

from __future__ import annotations

import threading

import torch

_E4M3_MAX = 448.0
_registered = False
_lock = threading.Lock()
_ALL_CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)


def _scale(amax: torch.Tensor) -> torch.Tensor:
    amax = amax.to(torch.float32)
    safe_amax = torch.where(amax <= 1.0 / (1 << 24), torch.ones_like(amax), amax)
    return _E4M3_MAX / safe_amax


def fp8_codes(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """The E4M3 codes ModelOpt's per-tensor fake quantizer gives ``x`` (``float8_e4m3fn``, the shape of ``x``)."""
    return x.to(torch.float32, copy=True).mul_(_scale(amax)).clamp_(min=-_E4M3_MAX, max=_E4M3_MAX).to(
        torch.float8_e4m3fn)


def fp8_fake_quant(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """ModelOpt's ``_fp8_eager(x, amax)`` for a one-element ``amax``, through a 256-entry table."""
    scale_inv = 1 / _scale(amax)
    codes = fp8_codes(x, amax)
    table = (_ALL_CODES.to(torch.float32) * scale_inv.reshape(())).to(x.dtype)
    index = codes.view(torch.uint8).reshape(-1).to(torch.int32)
    return table.index_select(0, index).reshape(x.shape)


class _LastCall(threading.local):
    """The last input this thread fake-quantized and its result: engines' fused groups (q/k/v, gate/up)
    read one input with one scale, so the group's second and third quantizers get the same tensor
    (same object, unchanged since) and the same amax, and need not quantize it again."""

    inputs: torch.Tensor | None = None
    version: int = -1
    amax: torch.Tensor | None = None
    result: torch.Tensor | None = None


_last = _LastCall()


def fp8_fake_quant_reusing(inputs: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """:func:`fp8_fake_quant`, or its last result when called again on the same unchanged input and amax
    without autograd (a result that autograd records must be a new tensor); an inference-mode tensor
    has no version counter to tell a change, so it is always quantized anew."""
    if torch.is_grad_enabled() or inputs.is_inference():
        return fp8_fake_quant(inputs, amax)
    if (_last.inputs is inputs and _last.version == inputs._version and _last.amax is not None
            and _last.amax.shape == amax.shape and torch.equal(_last.amax, amax)):
        return _last.result
    result = fp8_fake_quant(inputs, amax)
    _last.inputs, _last.version, _last.amax, _last.result = inputs, inputs._version, amax.detach().clone(), result
    return result


def register_cpu_kernel() -> None:
    """Route ModelOpt's per-tensor FP8 ``tensorrt::quantize_op`` on CPU through :func:`fp8_fake_quant`."""
    global _registered
    with _lock:
        if _registered:
            return
        from modelopt.torch.quantization import tensor_quant

        from advisor.quantize.nvfp4_cpu import override_cpu_kernel

        original = tensor_quant._quantize_impl

        def cpu_impl(inputs, amax, num_bits=8, exponent_bits=0, unsigned=False, narrow_range=True):
            if (num_bits, exponent_bits) == (8, 4) and amax is not None and amax.numel() == 1:
                return fp8_fake_quant_reusing(inputs, amax)
            return original(inputs, amax, num_bits, exponent_bits, unsigned, narrow_range)

        override_cpu_kernel("quantize_op", cpu_impl)
        _registered = True
