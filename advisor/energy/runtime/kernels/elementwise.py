"""The small fused kernels between GEMMs: residual add + RMSNorm, prefill RoPE, act(gate)*up, FP8 quantization."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from advisor.energy.runtime.kernels.common import (
    FP8_MAX,
    head_rmsnorm,
    launch_kernel,
    mask_below,
    tanh_exp,
    wait_for_producer,
)


@triton.jit
def _add_rmsnorm_kernel(
    X,
    R,
    W,
    XW,
    Y,
    inv_scale_ptr,
    N,
    eps,
    HAS_RES: tl.constexpr,
    X_NORM: tl.constexpr,
    NORM_ROUND: tl.constexpr,
    OUT_FP8: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    wait_for_producer(USE_PDL)
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    if X_NORM:  # Gemma: the sublayer's output is normalized before it joins the residual
        xw = tl.load(XW + cols, mask=mask, other=0.0).to(tl.float32)
        x = _rms_scale(x, xw, N, eps, NORM_ROUND)
    if HAS_RES:
        r = tl.load(R + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x + r).to(tl.bfloat16).to(tl.float32)
        tl.store(R + row * N + cols, x.to(tl.bfloat16), mask=mask)
    y = _rms_scale(x, w, N, eps, NORM_ROUND)
    if OUT_FP8:
        s = tl.load(inv_scale_ptr)
        y = tl.minimum(tl.maximum(y * s, -FP8_MAX), FP8_MAX)
        tl.store(Y + row * N + cols, y.to(tl.float8e4nv), mask=mask)
    else:
        tl.store(Y + row * N + cols, y.to(tl.bfloat16), mask=mask)


@triton.jit
def _rms_scale(x, w, N, eps, NORM_ROUND: tl.constexpr):
    """RMSNorm of one row times its weight, rounded to BF16 as the BF16 model rounds it.

    NORM_ROUND: Llama rounds the normalized row before the weight; Gemma multiplies in
    float32 (its weight is passed as 1 + w). FP8 then quantizes the same values.
    """
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    if NORM_ROUND:
        y = y.to(tl.bfloat16).to(tl.float32)
    return (y * w).to(tl.bfloat16).to(tl.float32)


def add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    inv_scale: torch.Tensor | None = None,
    pdl: bool = False,
    *,
    x_weight: torch.Tensor | None = None,
    norm_round: bool = True,
) -> torch.Tensor:
    """``residual += x`` (when given) then RMSNorm of the sum; FP8 output when ``inv_scale``.

    ``x_weight``: normalize ``x`` with it first (Gemma's post-attention and post-MLP norms).
    """
    rows, n = x.shape
    out = torch.empty(rows, n, device=x.device, dtype=torch.float8_e4m3fn if inv_scale is not None else x.dtype)
    launch_kernel(
        _add_rmsnorm_kernel,
        (rows,),
        x,
        residual if residual is not None else x,
        weight,
        x_weight if x_weight is not None else weight,
        out,
        inv_scale if inv_scale is not None else weight,
        n,
        eps,
        pdl=pdl,
        HAS_RES=residual is not None,
        X_NORM=x_weight is not None,
        NORM_ROUND=norm_round,
        OUT_FP8=inv_scale is not None,
        BLOCK=triton.next_power_of_2(n),
        num_warps=8,
    )
    return out


@triton.jit
def _rope_qkv_kernel(
    QKV,
    COS,
    SIN,
    POS,
    QN_W,
    KN_W,
    QOUT,
    KC,
    VC,
    L,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    HP: tl.constexpr,
    LMAX,
    q_scale,
    norm_eps,
    QK_NORM: tl.constexpr,
    NORM_ROUND: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)  # token index in [0, B*L)
    h = tl.program_id(1)  # 0..H-1: q heads, H..H+KV-1: kv heads
    b = t // L
    i = t % L
    p = tl.load(POS) + i
    half = tl.arange(0, HP)
    hmask = mask_below(half, D // 2, HP != D // 2)
    c = tl.load(COS + p * (D // 2) + half, mask=hmask, other=0.0)[None, :]
    s = tl.load(SIN + p * (D // 2) + half, mask=hmask, other=0.0)[None, :]
    wait_for_producer(USE_PDL)
    row = QKV + t * (H + 2 * KV) * D
    cols = half[None, :]
    m2 = hmask[None, :]
    if h < H:
        x1 = tl.load(row + h * D + cols, mask=m2, other=0.0).to(tl.float32)
        x2 = tl.load(row + h * D + D // 2 + cols, mask=m2, other=0.0).to(tl.float32)
        if QK_NORM:
            x1, x2 = head_rmsnorm(x1, x2, QN_W, half, hmask, D, norm_eps, NORM_ROUND)
        o1 = (x1 * c - x2 * s) * q_scale
        o2 = (x2 * c + x1 * s) * q_scale
        dst = QOUT + ((b * H + h) * L + i) * D
        tl.store(dst + cols, o1.to(tl.bfloat16), mask=m2)
        tl.store(dst + D // 2 + cols, o2.to(tl.bfloat16), mask=m2)
    else:
        kh = h - H
        x1 = tl.load(row + (H + kh) * D + cols, mask=m2, other=0.0).to(tl.float32)
        x2 = tl.load(row + (H + kh) * D + D // 2 + cols, mask=m2, other=0.0).to(tl.float32)
        if QK_NORM:
            x1, x2 = head_rmsnorm(x1, x2, KN_W, half, hmask, D, norm_eps, NORM_ROUND)
        dst = KC + ((b * KV + kh) * LMAX + p) * D
        tl.store(dst + cols, (x1 * c - x2 * s).to(tl.bfloat16), mask=m2)
        tl.store(dst + D // 2 + cols, (x2 * c + x1 * s).to(tl.bfloat16), mask=m2)
        v1 = tl.load(row + (H + KV + kh) * D + cols, mask=m2)
        v2 = tl.load(row + (H + KV + kh) * D + D // 2 + cols, mask=m2)
        vdst = VC + ((b * KV + kh) * LMAX + p) * D
        tl.store(vdst + cols, v1, mask=m2)
        tl.store(vdst + D // 2 + cols, v2, mask=m2)


def rope_qkv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pos: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: int,
    length: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    pdl: bool = False,
    *,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_round: bool = True,
    q_scale: float | None = None,
) -> torch.Tensor:
    """Rotate q and k of ``batch*length`` tokens at positions ``pos[0] + i``; returns q [B, H, L, D].

    k and v go into the caches; ``q_norm``/``k_norm`` normalize each head first (Qwen3,
    Gemma 3); q is multiplied by ``q_scale`` (default head_dim ** -0.5).
    """
    q = torch.empty(batch, heads, length, head_dim, device=qkv.device, dtype=torch.bfloat16)
    launch_kernel(
        _rope_qkv_kernel,
        (batch * length, heads + kv_heads),
        qkv,
        cos,
        sin,
        pos,
        q_norm if q_norm is not None else cos,
        k_norm if k_norm is not None else cos,
        q,
        k_cache,
        v_cache,
        length,
        heads,
        kv_heads,
        head_dim,
        max(16, triton.next_power_of_2(head_dim // 2)),
        k_cache.shape[2],
        q_scale if q_scale is not None else head_dim**-0.5,
        norm_eps,
        pdl=pdl,
        QK_NORM=q_norm is not None,
        NORM_ROUND=norm_round,
        num_warps=1,
    )
    return q


@triton.jit
def _gated_act_kernel(
    GU, Y, inv_scale_ptr, INTER, GELU_TANH: tl.constexpr, OUT_FP8: tl.constexpr, BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    wait_for_producer(USE_PDL)
    g = tl.load(GU + row * 2 * INTER + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * INTER + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU_TANH:  # PyTorch's gelu(approximate="tanh")
        a = 0.5 * g * (1.0 + tanh_exp(0.7978845608028654 * (g + 0.044715 * g * g * g)))
    else:
        a = g / (1.0 + tl.exp(-g))
    y = (a.to(tl.bfloat16).to(tl.float32) * u).to(tl.bfloat16).to(tl.float32)
    if OUT_FP8:
        s = tl.load(inv_scale_ptr)
        y = tl.minimum(tl.maximum(y * s, -FP8_MAX), FP8_MAX)
        tl.store(Y + row * INTER + cols, y.to(tl.float8e4nv), mask=mask)
    else:
        tl.store(Y + row * INTER + cols, y.to(tl.bfloat16), mask=mask)


GATED_ACTIVATIONS = ("silu", "gelu_tanh")


def gated_act(
    gu: torch.Tensor, activation: str = "silu", inv_scale: torch.Tensor | None = None, pdl: bool = False
) -> torch.Tensor:
    """act(gate) * up of a fused [rows, 2*I] gate_up output (+ FP8 quantization)."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {GATED_ACTIVATIONS}")
    rows, two_i = gu.shape
    inter = two_i // 2
    out = torch.empty(rows, inter, device=gu.device, dtype=torch.float8_e4m3fn if inv_scale is not None else gu.dtype)
    block = 1024
    launch_kernel(
        _gated_act_kernel,
        (rows, triton.cdiv(inter, block)),
        gu,
        out,
        inv_scale if inv_scale is not None else gu,
        inter,
        pdl=pdl,
        GELU_TANH=activation == "gelu_tanh",
        OUT_FP8=inv_scale is not None,
        BLOCK=block,
        num_warps=4,
    )
    return out


def silu_mul(gu: torch.Tensor, inv_scale: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    return gated_act(gu, "silu", inv_scale, pdl)


@triton.jit
def _quant_kernel(X, Y, inv_scale_ptr, n, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    wait_for_producer(USE_PDL)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(inv_scale_ptr)
    y = tl.minimum(tl.maximum(x * s, -FP8_MAX), FP8_MAX)
    tl.store(Y + offs, y.to(tl.float8e4nv), mask=mask)


def quant_fp8(x: torch.Tensor, inv_scale: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
    n = x.numel()
    block = 2048
    launch_kernel(_quant_kernel, (triton.cdiv(n, block),), x, out, inv_scale, n, pdl=pdl, BLOCK=block, num_warps=4)
    return out
