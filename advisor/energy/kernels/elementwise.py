"""The small fused kernels between GEMMs: residual add + RMSNorm, prefill RoPE, SiLU*up, FP8 quantization."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from advisor.energy.kernels.common import FP8_MAX, _launch, _wait_for_producer


@triton.jit
def _add_rmsnorm_kernel(
    X,
    R,
    W,
    Y,
    inv_scale_ptr,
    N,
    eps,
    HAS_RES: tl.constexpr,
    OUT_FP8: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    _wait_for_producer(USE_PDL)
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x + r).to(tl.bfloat16).to(tl.float32)
        tl.store(R + row * N + cols, x.to(tl.bfloat16), mask=mask)
    var = tl.sum(x * x, axis=0) / N
    # rounded to BF16 as the BF16 model does, so FP8 quantizes the same values
    y = ((x * tl.rsqrt(var + eps)).to(tl.bfloat16).to(tl.float32) * w).to(tl.bfloat16).to(tl.float32)
    if OUT_FP8:
        s = tl.load(inv_scale_ptr)
        y = tl.minimum(tl.maximum(y * s, -FP8_MAX), FP8_MAX)
        tl.store(Y + row * N + cols, y.to(tl.float8e4nv), mask=mask)
    else:
        tl.store(Y + row * N + cols, y.to(tl.bfloat16), mask=mask)


def add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    inv_scale: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``residual += x`` (when given) then RMSNorm of the sum; FP8 output when ``inv_scale``."""
    rows, n = x.shape
    out = torch.empty(rows, n, device=x.device, dtype=torch.float8_e4m3fn if inv_scale is not None else x.dtype)
    _launch(
        _add_rmsnorm_kernel,
        (rows,),
        x,
        residual if residual is not None else x,
        weight,
        out,
        inv_scale if inv_scale is not None else weight,
        n,
        eps,
        pdl=pdl,
        HAS_RES=residual is not None,
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
    QOUT,
    KC,
    VC,
    L,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    LMAX,
    q_scale,
    USE_PDL: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)  # token index in [0, B*L)
    h = tl.program_id(1)  # 0..H-1: q heads, H..H+KV-1: kv heads
    b = t // L
    i = t % L
    p = tl.load(POS) + i
    half = tl.arange(0, D // 2)
    c = tl.load(COS + p * (D // 2) + half)
    s = tl.load(SIN + p * (D // 2) + half)
    _wait_for_producer(USE_PDL)
    row = QKV + t * (H + 2 * KV) * D
    if h < H:
        x1 = tl.load(row + h * D + half).to(tl.float32)
        x2 = tl.load(row + h * D + D // 2 + half).to(tl.float32)
        o1 = (x1 * c - x2 * s) * q_scale
        o2 = (x2 * c + x1 * s) * q_scale
        dst = QOUT + ((b * H + h) * L + i) * D
        tl.store(dst + half, o1.to(tl.bfloat16))
        tl.store(dst + D // 2 + half, o2.to(tl.bfloat16))
    else:
        kh = h - H
        x1 = tl.load(row + (H + kh) * D + half).to(tl.float32)
        x2 = tl.load(row + (H + kh) * D + D // 2 + half).to(tl.float32)
        dst = KC + ((b * KV + kh) * LMAX + p) * D
        tl.store(dst + half, (x1 * c - x2 * s).to(tl.bfloat16))
        tl.store(dst + D // 2 + half, (x2 * c + x1 * s).to(tl.bfloat16))
        v1 = tl.load(row + (H + KV + kh) * D + half)
        v2 = tl.load(row + (H + KV + kh) * D + D // 2 + half)
        vdst = VC + ((b * KV + kh) * LMAX + p) * D
        tl.store(vdst + half, v1)
        tl.store(vdst + D // 2 + half, v2)


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
) -> torch.Tensor:
    """Rotate q and k of ``batch*length`` tokens at positions ``pos[0] + i``; returns q [B, H, L, D]."""
    q = torch.empty(batch, heads, length, head_dim, device=qkv.device, dtype=torch.bfloat16)
    _launch(
        _rope_qkv_kernel,
        (batch * length, heads + kv_heads),
        qkv,
        cos,
        sin,
        pos,
        q,
        k_cache,
        v_cache,
        length,
        heads,
        kv_heads,
        head_dim,
        k_cache.shape[2],
        head_dim**-0.5,
        pdl=pdl,
        num_warps=1,
    )
    return q


@triton.jit
def _silu_mul_kernel(GU, Y, inv_scale_ptr, INTER, OUT_FP8: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    _wait_for_producer(USE_PDL)
    g = tl.load(GU + row * 2 * INTER + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * INTER + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    y = ((g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32) * u).to(tl.bfloat16).to(tl.float32)
    if OUT_FP8:
        s = tl.load(inv_scale_ptr)
        y = tl.minimum(tl.maximum(y * s, -FP8_MAX), FP8_MAX)
        tl.store(Y + row * INTER + cols, y.to(tl.float8e4nv), mask=mask)
    else:
        tl.store(Y + row * INTER + cols, y.to(tl.bfloat16), mask=mask)


def silu_mul(gu: torch.Tensor, inv_scale: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    rows, two_i = gu.shape
    inter = two_i // 2
    out = torch.empty(rows, inter, device=gu.device, dtype=torch.float8_e4m3fn if inv_scale is not None else gu.dtype)
    block = 1024
    _launch(
        _silu_mul_kernel,
        (rows, triton.cdiv(inter, block)),
        gu,
        out,
        inv_scale if inv_scale is not None else gu,
        inter,
        pdl=pdl,
        OUT_FP8=inv_scale is not None,
        BLOCK=block,
        num_warps=4,
    )
    return out


@triton.jit
def _quant_kernel(X, Y, inv_scale_ptr, n, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    _wait_for_producer(USE_PDL)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(inv_scale_ptr)
    y = tl.minimum(tl.maximum(x * s, -FP8_MAX), FP8_MAX)
    tl.store(Y + offs, y.to(tl.float8e4nv), mask=mask)


def quant_fp8(x: torch.Tensor, inv_scale: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
    n = x.numel()
    block = 2048
    _launch(_quant_kernel, (triton.cdiv(n, block),), x, out, inv_scale, n, pdl=pdl, BLOCK=block, num_warps=4)
    return out
