"""Fused Triton kernels of the serving runtime (imported only where torch and triton exist).

Each kernel replaces several eager PyTorch launches, so that a CUDA-graph decode
step is made of GEMMs, attention and one small kernel between each:

* ``add_rmsnorm``: residual add + RMSNorm (+ FP8 quantization of the output with a
  static per-tensor scale, so the next GEMM reads FP8 directly);
* ``rope_qkv``: rotary embedding of q and k from the fused qkv output, q scaled by
  1/sqrt(head_dim) and written head-major, k and v written into the KV cache;
* ``silu_mul``: SiLU(gate) * up (+ FP8 quantization);
* ``quant_fp8``: per-tensor static FP8 quantization (attention output -> o_proj).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)


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
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x + r).to(tl.bfloat16).to(tl.float32)
        tl.store(R + row * N + cols, x.to(tl.bfloat16), mask=mask)
    var = tl.sum(x * x, axis=0) / N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
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
) -> torch.Tensor:
    """``residual += x`` (when given) then RMSNorm of the sum; FP8 output when ``inv_scale``."""
    rows, n = x.shape
    out = torch.empty(rows, n, device=x.device, dtype=torch.float8_e4m3fn if inv_scale is not None else x.dtype)
    _add_rmsnorm_kernel[(rows,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        inv_scale if inv_scale is not None else weight,
        n,
        eps,
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
):
    t = tl.program_id(0).to(tl.int64)  # token index in [0, B*L)
    h = tl.program_id(1)  # 0..H-1: q heads, H..H+KV-1: kv heads
    b = t // L
    i = t % L
    p = tl.load(POS) + i
    half = tl.arange(0, D // 2)
    c = tl.load(COS + p * (D // 2) + half)
    s = tl.load(SIN + p * (D // 2) + half)
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
) -> torch.Tensor:
    """Rotate q and k of ``batch*length`` tokens at positions ``pos[0] + i``; returns q [B, H, L, D]."""
    q = torch.empty(batch, heads, length, head_dim, device=qkv.device, dtype=torch.bfloat16)
    _rope_qkv_kernel[(batch * length, heads + kv_heads)](
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
        num_warps=1,
    )
    return q


@triton.jit
def _silu_mul_kernel(GU, Y, inv_scale_ptr, INTER, OUT_FP8: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    g = tl.load(GU + row * 2 * INTER + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * INTER + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    y = ((g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32) * u).to(tl.bfloat16).to(tl.float32)
    if OUT_FP8:
        s = tl.load(inv_scale_ptr)
        y = tl.minimum(tl.maximum(y * s, -FP8_MAX), FP8_MAX)
        tl.store(Y + row * INTER + cols, y.to(tl.float8e4nv), mask=mask)
    else:
        tl.store(Y + row * INTER + cols, y.to(tl.bfloat16), mask=mask)


def silu_mul(gu: torch.Tensor, inv_scale: torch.Tensor | None = None) -> torch.Tensor:
    rows, two_i = gu.shape
    inter = two_i // 2
    out = torch.empty(rows, inter, device=gu.device, dtype=torch.float8_e4m3fn if inv_scale is not None else gu.dtype)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](
        gu,
        out,
        inv_scale if inv_scale is not None else gu,
        inter,
        OUT_FP8=inv_scale is not None,
        BLOCK=block,
        num_warps=4,
    )
    return out


@triton.jit
def _quant_kernel(X, Y, inv_scale_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(inv_scale_ptr)
    y = tl.minimum(tl.maximum(x * s, -FP8_MAX), FP8_MAX)
    tl.store(Y + offs, y.to(tl.float8e4nv), mask=mask)


def quant_fp8(x: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
    n = x.numel()
    block = 2048
    _quant_kernel[(triton.cdiv(n, block),)](x, out, inv_scale, n, BLOCK=block, num_warps=4)
    return out


@triton.jit
def _decode_attn_split_kernel(
    Q,
    KC,
    VC,
    M_out,
    L_out,
    ACC,
    ctx,
    chunk,
    LMAX,
    KV: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S: tl.constexpr,
):
    """Flash-decoding, stage 1: one (sequence, kv head, split) attends its chunk of keys."""
    bk = tl.program_id(0).to(tl.int64)  # b * KV + kv head
    sp = tl.program_id(1)
    rows = tl.arange(0, GP)
    dd = tl.arange(0, D)
    # q heads of this kv head are contiguous: [b, kvh*G .. kvh*G+G-1]
    q = tl.load(Q + (bk * G + rows[:, None]) * D + dd[None, :], mask=rows[:, None] < G, other=0.0)
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, ctx)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    base = bk * LMAX * D
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < hi
        k = tl.load(KC + base + n[:, None] * D + dd[None, :], mask=nm[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k))
        s = tl.where(nm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(VC + base + n[:, None] * D + dd[None, :], mask=nm[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m_i = m_new
    o = (bk * S + sp) * GP
    tl.store(M_out + o + rows, m_i)
    tl.store(L_out + o + rows, l_i)
    tl.store(ACC + (o + rows[:, None]) * D + dd[None, :], acc)


@triton.jit
def _decode_attn_reduce_kernel(
    M_in, L_in, ACC, OUT, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, S: tl.constexpr, SP: tl.constexpr
):
    """Flash-decoding, stage 2: combine the splits of one (sequence, kv head)."""
    bk = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    sp = tl.arange(0, SP)
    dd = tl.arange(0, D)
    idx = (bk * S + sp) * GP + g
    m = tl.load(M_in + idx, mask=sp < S, other=float("-inf"))
    lsum = tl.load(L_in + idx, mask=sp < S, other=0.0)
    mx = tl.max(m, 0)
    w = tl.where(sp < S, tl.exp(m - mx), 0.0)
    w = tl.where(lsum > 0, w, 0.0)
    acc = tl.load(ACC + idx[:, None] * D + dd[None, :], mask=(sp < S)[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(lsum * w, 0)
    tl.store(OUT + (bk * G + g) * D + dd, out.to(tl.bfloat16))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: int) -> torch.Tensor:
    """Attention of one new token per sequence over the first ``ctx`` cached tokens (GQA).

    q: [B, H, 1, D] (already scaled by 1/sqrt(D)); caches [B, KV, LMAX, D].
    Returns [B, H * D]. Reads each cached K and V once, split over enough programs
    to fill the GPU even at batch 1.
    """
    b, h, _, d = q.shape
    kv, lmax = k_cache.shape[1], k_cache.shape[2]
    g = h // kv
    gp = max(16, triton.next_power_of_2(g))
    block_n = 64
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    splits = max(1, min(triton.cdiv(2 * sms, b * kv), triton.cdiv(ctx, block_n)))
    chunk = triton.cdiv(triton.cdiv(ctx, splits), block_n) * block_n
    splits = triton.cdiv(ctx, chunk)
    m = torch.empty(b * kv, splits, gp, device=q.device, dtype=torch.float32)
    lsum = torch.empty_like(m)
    acc = torch.empty(b * kv, splits, gp, d, device=q.device, dtype=torch.float32)
    _decode_attn_split_kernel[(b * kv, splits)](
        q,
        k_cache,
        v_cache,
        m,
        lsum,
        acc,
        ctx,
        chunk,
        lmax,
        KV=kv,
        G=g,
        GP=gp,
        D=d,
        BLOCK_N=block_n,
        S=splits,
        num_warps=4,
        num_stages=3,
    )
    out = torch.empty(b, h * d, device=q.device, dtype=torch.bfloat16)
    _decode_attn_reduce_kernel[(b * kv, g)](
        m,
        lsum,
        acc,
        out,
        G=g,
        GP=gp,
        D=d,
        S=splits,
        SP=triton.next_power_of_2(splits),
        num_warps=4,
    )
    return out
