"""NVFP4 fake quantization on the CPU, bit-compatible with ModelOpt's CUDA path.

ModelOpt 0.47 computes NVFP4 fake quantization only on CUDA (its Triton kernel
``fp4_fake_quant_block`` in ``kernels/quantization/gemm/fp4_kernel_hopper.py``; the
CPU branch of ``tensorrt::dynamic_block_quantize_op`` asserts a CUDA amax). This
module registers a CPU kernel for that same op, so every other part of ModelOpt
(quantizer configs, max calibration, export) is used unchanged. The arithmetic is
the Triton kernel's, step by step:

    global_scale = global_amax / (6 * 448)
    block_scale  = fp8_e4m3(min(block_amax / (6 * global_scale), 448)) * global_scale
    q            = e2m1_round(|x| / block_scale) * block_scale * sign(x)

``reports/nvfp4_cpu_parity/`` holds the GPU check against ModelOpt's CUDA path.
Only the NVFP4 case (E2M1 values, E4M3 scales, per-tensor amax) is handled here;
other block formats fall through to ModelOpt's own implementation.
"""

from __future__ import annotations

import threading

import torch

_E4M3_MAX = 448.0
_E2M1_MAX = 6.0
_registered = False
_lock = threading.Lock()


def e2m1_round_magnitude(a: torch.Tensor) -> torch.Tensor:
    """Round float32 |x|/scale (>= 0) to the nearest E2M1 magnitude, with ModelOpt's kernel's tie rules.

    Triton: <=0.25 -> 0, <0.75 -> 0.5, <=1.25 -> 1, <1.75 -> 1.5, <=2.5 -> 2, <3.5 -> 3,
    <=5 -> 4, else 6. That is round-half-to-even on the grid's local step (0.5 below 2,
    1 below 4, 2 above), capped at 6. The step is 2 ** (clamp(exponent(a), 1, 3) - 2),
    built from the float32 exponent bits: a few integer passes instead of a comparison
    chain (divisions by powers of two are exact, torch.round ties to even).
    """
    a = a.float()
    exponent = a.view(torch.int32) >> 23  # biased: 128 for [2, 4)
    step = exponent.clamp_(127, 129).sub_(1).bitwise_left_shift_(23).view(torch.float32)
    return torch.round(a / step).mul_(step).clamp_(max=_E2M1_MAX)


def global_scale(global_amax: torch.Tensor) -> torch.Tensor:
    """The scale of the FP8 block scales, ``global_amax / (6 * 448)``, as ModelOpt's CUDA path computes it."""
    # ModelOpt's CUDA path computes amax / 2688 as amax * fl32(1 / 2688) (PyTorch on CUDA
    # divides by a Python number through its reciprocal); do the same, or 1-ulp differences
    # in the global scale flip block scales (reports/nvfp4_cpu_parity/).
    scale = global_amax.float().reshape(()) * (torch.tensor(1.0) / (_E2M1_MAX * _E4M3_MAX))
    return torch.where(scale > 0, scale, torch.full_like(scale, 1e-12))


def block_scale_codes(block_amax: torch.Tensor, global_scale_: torch.Tensor) -> torch.Tensor:
    """The FP8 (E4M3) code of each block's scale, in units of the global scale."""
    return torch.clamp(block_amax / (_E2M1_MAX * global_scale_), max=_E4M3_MAX).to(torch.float8_e4m3fn)


def scales_from_codes(codes: torch.Tensor, global_scale_: torch.Tensor) -> torch.Tensor:
    """Block scales (float32) from their FP8 codes; a scale below 1e-5 is 1, as in ModelOpt's kernel."""
    scale = codes.float() * global_scale_
    return torch.where(scale >= 1e-5, scale, torch.ones_like(scale))


def _scales_from_block_amax(block_amax: torch.Tensor, global_amax: torch.Tensor) -> torch.Tensor:
    gs = global_scale(global_amax)
    return scales_from_codes(block_scale_codes(block_amax, gs), gs)


def nvfp4_block_scales(x: torch.Tensor, global_amax: torch.Tensor, block_size: int = 16) -> torch.Tensor:
    """Per-block scales (float32, FP8-representable multiples of the global scale)."""
    block_amax = x.float().reshape(-1, block_size).abs().amax(dim=1, keepdim=True)
    return _scales_from_block_amax(block_amax, global_amax)


def nvfp4_fake_quant(x: torch.Tensor, global_amax: torch.Tensor, block_size: int = 16) -> torch.Tensor:
    """Quantize-dequantize ``x`` (last dim a multiple of ``block_size``) to NVFP4.

    Equal to the comparison-chain kernel value for value; the one difference in bits is the
    sign of a zero from a ``-0.0`` input (``copysign`` keeps it).
    """
    shape, dtype = x.shape, x.dtype
    if shape[-1] % block_size:
        raise ValueError(f"NVFP4 needs the last dimension ({shape[-1]}) to be a multiple of {block_size}")
    blocks = x.float().reshape(-1, block_size)
    magnitude = blocks.abs()
    scale = _scales_from_block_amax(magnitude.amax(dim=1, keepdim=True), global_amax)
    q = e2m1_round_magnitude(magnitude.div_(scale)).mul_(scale)
    return q.copysign_(blocks).reshape(shape).to(dtype)


def register_cpu_kernel() -> None:
    """Give ModelOpt's ``tensorrt::dynamic_block_quantize_op`` an NVFP4 kernel on CPU. Idempotent."""
    global _registered
    with _lock:
        if _registered:
            return
        from modelopt.torch.quantization import tensor_quant

        original = tensor_quant._dynamic_block_quantize_impl

        def cpu_impl(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits):
            is_nvfp4 = (num_bits, exponent_bits, scale_num_bits, scale_exponent_bits) == (4, 2, 8, 4)
            if is_nvfp4 and amax is not None and amax.numel() == 1:
                return nvfp4_fake_quant(inputs, amax, block_size)
            return original(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits)

        override_cpu_kernel("dynamic_block_quantize_op", cpu_impl)
        _registered = True


_library: torch.library.Library | None = None


def override_cpu_kernel(op: str, fn) -> None:
    """Replace ModelOpt's Python CPU kernel of ``tensorrt::<op>`` with ``fn``.

    torch >= 2.13 allows the override by default; older releases refuse a second Python
    kernel for the same key unless told (``allow_override``) or, before that flag existed,
    unless the first registration's record is dropped.
    """
    import warnings

    global _library
    _library = _library or torch.library.Library("tensorrt", "IMPL")  # kept alive: it owns the kernel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _library.impl(op, fn, "CPU", allow_override=True)
        except TypeError:  # no allow_override in this torch
            import torch.library as tl

            for key in (f"tensorrt/{op}/CPU", f"tensorrt/{op}/cpu"):
                tl._impls.discard(key)
            _library.impl(op, fn, "CPU")
