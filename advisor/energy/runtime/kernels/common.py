"""What every runtime kernel shares: the FP8 bound, programmatic dependent launch, exact dots when interpreted."""

from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)


@triton.jit
def wait_for_producer(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def let_consumer_start(USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def exact_dot(a, b, EXACT_F32: tl.constexpr):
    if EXACT_F32:  # Triton 3.6's CPU interpreter multiplies BF16 dot operands as raw integers
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


def launch_kernel(kernel, grid, *args, pdl: bool, **meta) -> None:
    if pdl:
        meta["launch_pdl"] = True
    kernel[grid](*args, USE_PDL=pdl, **meta)


@triton.jit
def mask_below(cols, n: tl.constexpr, PADDED: tl.constexpr):
    """``cols < n``; a constant all-true mask when the tile is not padded (the compiler drops it)."""
    if PADDED:
        return cols < n
    else:
        return tl.full(cols.shape, 1, tl.int1)


@triton.jit
def tanh_exp(x):
    # exp-based, the same compiled and in the CPU interpreter; tanh is +-1 in float32 beyond |x| = 15
    x = tl.minimum(tl.maximum(x, -15.0), 15.0)
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def soft_cap(scores, CAP: tl.constexpr):
    return CAP * tanh_exp(scores / CAP)


@triton.jit
def head_rmsnorm(x1, x2, W, half, hmask, D: tl.constexpr, eps, NORM_ROUND: tl.constexpr):
    """RMSNorm over each row's head dim, given as halves ``x1``, ``x2`` [R, HP] (padding is zero).

    NORM_ROUND rounds the normalized value to BF16 before the weight (Llama, Qwen); Gemma
    multiplies in float32 (its weights are passed as 1 + w).
    """
    var = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D
    r = tl.rsqrt(var + eps)[:, None]
    w1 = tl.load(W + half, mask=hmask, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(W + D // 2 + half, mask=hmask, other=0.0).to(tl.float32)[None, :]
    y1 = x1 * r
    y2 = x2 * r
    if NORM_ROUND:
        y1 = y1.to(tl.bfloat16).to(tl.float32)
        y2 = y2.to(tl.bfloat16).to(tl.float32)
    return (y1 * w1).to(tl.bfloat16).to(tl.float32), (y2 * w2).to(tl.bfloat16).to(tl.float32)
